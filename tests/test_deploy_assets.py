"""The deployment assets in ops/: the Prometheus config and alert rules pass
promtool, the Kubernetes manifests pass kubernetes-validate, and every PromQL
expression of the Grafana dashboard and the alert rules runs without error
against a real Prometheus scraping a real gateway (empty results are fine:
a metric not rendered yet is not an error; a bad expression is).
"""
import concurrent.futures as cf
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import TWO_POOLS, http_post, require_tool, wait_until
from prom import Prometheus

pytestmark = pytest.mark.plain_only

ROOT = Path(__file__).resolve().parent.parent
OPS = ROOT / "ops"
K8S_VERSION = "1.37.0"   # the newest kubernetes-validate 1.37.0 knows

POLICY = TWO_POOLS + """\
routes:
  - model: "echo"
    target: gpu-pool
    max_concurrency: 1
    priority: primary
  - model: "echo"
    target: cpu-pool
    priority: overflow
"""

# What Grafana puts in for its variables; "All" for a multi-value variable
# is its allValue, ".*".
GRAFANA_VARS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m",
                "__range_s": "300", "__interval_ms": "15000", "pool": ".*"}


def promtool(*args):
    exe = require_tool("promtool")
    r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_promtool_rules_and_config():
    out = promtool("check", "rules", str(OPS / "prometheus/alerts.yml"))
    assert "SUCCESS" in out
    promtool("check", "config", str(OPS / "prometheus/prometheus.yml"))


def test_k8s_manifests_validate():
    kv = pytest.importorskip("kubernetes_validate")
    files = sorted((OPS / "k8s").glob("*.yaml"))
    kinds = set()
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            if doc is None:
                continue
            try:
                kv.validate(doc, K8S_VERSION, strict=True)
            except kv.ValidationError as e:
                pytest.fail(f"{f.name}: {doc.get('kind')} {doc['metadata'].get('name')}: {e}")
            kinds.add(doc["kind"])
    assert {"Deployment", "StatefulSet", "Service", "ConfigMap", "HorizontalPodAutoscaler",
            "PodDisruptionBudget"} <= kinds, kinds
    gpu = yaml.safe_load_all((OPS / "k8s/worker-gpu.yaml").read_text())
    limits = next(d for d in gpu if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits.get("nvidia.com/gpu") == 1


def test_k8s_workers_link_to_every_gateway():
    """N gateways (docs/deploy.md): each worker names every gateway pod by its
    own DNS name under the headless Service, one --gateway per replica."""
    docs = [d for f in sorted((OPS / "k8s").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    gw = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "spillway-gateway")
    peers = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == gw["spec"]["serviceName"])
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    want = [f"--gateway=tcp://spillway-gateway-{i}.{gw['spec']['serviceName']}:5555"
            for i in range(gw["spec"]["replicas"])]
    assert len(want) >= 2
    for d in docs:
        if d["kind"] == "Deployment" and d["metadata"]["name"].startswith("spillway-worker"):
            args = d["spec"]["template"]["spec"]["containers"][0]["args"]
            assert [a for a in args if a.startswith("--gateway=")] == want, d["metadata"]["name"]


def grafana_exprs(path):
    """Every PromQL expression of the dashboard: panel targets, and the
    variables' queries (label_values(m, l) is Grafana's; its m is PromQL)."""
    exprs = []

    def walk(o):
        if isinstance(o, dict):
            if isinstance(o.get("expr"), str):
                exprs.append(o["expr"])
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
    d = json.loads(path.read_text())
    walk(d["panels"])
    for var in d["templating"]["list"]:
        q = var.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if var["type"] == "query" and q:
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q)
            exprs.append(m.group(1) if m else q)
    return exprs


def alert_exprs(path):
    groups = yaml.safe_load(path.read_text())["groups"]
    return [r["expr"] for g in groups for r in g["rules"]]


def substitute(expr):
    """Grafana's $var / ${var} / [[var]] replaced by what Grafana would send."""
    out = re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]",
                 lambda m: GRAFANA_VARS[m.group(1) or m.group(2) or m.group(3)], expr)
    assert "$" not in out, f"unsubstituted variable in {expr!r}"
    return out


def test_every_promql_expression_runs(cluster, tmp_path):
    cluster.start_gateway(POLICY)
    cluster.start_echo("gpu-pool", 20, name="gpu-echo")
    cluster.start_echo("cpu-pool", 200, name="cpu-echo")
    cluster.wait_workers(2)
    cluster.wait_model("echo")
    port = cluster.base.rsplit(":", 1)[1]
    rules = OPS / "prometheus/alerts.yml"
    with Prometheus(tmp_path, targets=[f"127.0.0.1:{port}"], rules=[rules],
                    scrape_interval="1s") as prom:
        # A few requests at once: the primary takes one, the rest overflow.
        def one(_):
            return http_post(cluster.base + "/v1/completions",
                             {"model": "echo", "prompt": "hi", "max_tokens": 8}, timeout=30)[0]
        with cf.ThreadPoolExecutor(4) as ex:
            assert list(ex.map(one, range(6))) == [200] * 6
        prom.wait_scraped(15)
        wait_until(lambda: prom.query("sum(spillway_requests_total)") and
                   float(prom.query("sum(spillway_requests_total)")[0]["value"][1]) >= 6,
                   10, what="the requests scraped")
        exprs = grafana_exprs(OPS / "grafana/spillway.json") + alert_exprs(rules)
        assert len(exprs) >= 20, exprs
        errors = []
        for e in exprs:
            try:
                prom.query(substitute(e))
            except Exception as err:   # noqa: BLE001 - collect them all
                errors.append(f"{e!r}: {err}")
        assert not errors, "\n".join(errors)
        # The counters the dashboard and the alerts build on have data.
        assert prom.query("sum(spillway_completion_tokens_total) > 0")
        assert prom.query("spillway_overflow_total"), "the burst overflowed"


def test_systemd_units_verify(tmp_path):
    """systemd-analyze verify on each unit, its ExecStart pointed at the
    built binary (the installed path does not exist here)."""
    exe = require_tool("systemd-analyze")
    from conftest import bin_path
    for unit in sorted((OPS / "systemd").glob("*.service")):
        text = unit.read_text()
        assert "Restart=on-failure" in text and "ProtectSystem=strict" in text, unit.name
        assert "NoNewPrivileges=yes" in text and "PrivateTmp=yes" in text, unit.name
        for name in ("spillway-gateway", "spillway-worker-cpu", "spillway-worker-gpu"):
            text = text.replace(f"/usr/local/bin/{name} ", bin_path(name) + " ")
        dest = tmp_path / unit.name.replace("@.", "@test-pool.")
        dest.write_text(text)
        r = subprocess.run([exe, "verify", "--man=no", str(dest)], capture_output=True, text=True,
                           timeout=20, env={"SYSTEMD_LOG_LEVEL": "warning", "PATH": "/usr/bin:/bin"})
        problems = [l for l in (r.stdout + r.stderr).splitlines() if dest.name in l or "error" in l.lower()]
        assert r.returncode == 0 and not problems, f"{unit.name}:\n{r.stdout}{r.stderr}"
