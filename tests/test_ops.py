"""The operators' actions (docs/operations.md), through the `spillway ops`
CLI against a real gateway and test-mode workers: a drain lets a worker
finish what it holds and take nothing new, with no request failed; a
cordoned pool and a route forced onto its overflow send traffic to the
overflow pool, counted by reason; what an operator set survives a policy
reload and a worker reconnecting; every action is logged with who and why;
bad input gets the OpenAI error shape with its param."""
import concurrent.futures as cf
import json
import os
import subprocess
import time

import pytest

from conftest import TWO_POOLS, bin_path, http_post, wait_until
from test_gateway_overflow import metric

POLICY = TWO_POOLS + """\
routes:
  - model: "echo"
    target: gpu-pool
    priority: primary
  - model: "echo"
    target: cpu-pool
    priority: overflow
"""


def ops(cluster, *args, check=True):
    """Runs `spillway ops ARGS` against the cluster's gateway: (rc, stdout, stderr)."""
    env = dict(os.environ, SPILLWAY_URL=cluster.base, USER="alice")
    p = subprocess.run([bin_path("spillway"), "ops", *args, "--admin-token-file", str(cluster.admin_token_file)],
                       capture_output=True, text=True, env=env, timeout=30)
    if check:
        assert p.returncode == 0, (args, p.stdout, p.stderr)
    return p.returncode, p.stdout, p.stderr


def status(cluster):
    return json.loads(ops(cluster, "status", "--json")[1])


def worker(st, wid):
    return next(w for w in st["workers"] if w["id"] == wid)


def complete(cluster, max_tokens=4):
    st, _, body = http_post(cluster.base + "/v1/completions",
                            {"model": "echo", "prompt": "hi", "max_tokens": max_tokens}, timeout=60)
    return st, json.loads(body)


def served_by(cluster, n=6):
    """Pools that served n fresh requests, by the overflow counter: spills
    per reason before and after."""
    before = {r: metric(cluster, "spillway_overflow_total", reason=r) for r in ("forced", "cordoned", "drained")}
    for _ in range(n):
        st, body = complete(cluster)
        assert st == 200, body
    return {r: metric(cluster, "spillway_overflow_total", reason=r) - before[r] for r in before}


@pytest.fixture
def two_pools(cluster):
    cluster.start_gateway(POLICY)
    cluster.start_echo("gpu-pool", 40, ["--worker-id", "g1", "--parallel", "8"], name="g1")
    cluster.start_echo("gpu-pool", 40, ["--worker-id", "g2", "--parallel", "8"], name="g2")
    cluster.start_echo("cpu-pool", 200, ["--worker-id", "c1"], name="c1")
    cluster.wait_workers(3)
    return cluster


def test_drain_finishes_in_flight_takes_nothing_new_and_fails_nothing(two_pools):
    c = two_pools
    with cf.ThreadPoolExecutor(12) as ex:
        # Streams of ~1 s on both GPU workers, then g1 drained while they run.
        first = [ex.submit(complete, c, 40) for _ in range(8)]
        wait_until(lambda: worker(status(c), "g1")["inflight"] > 0, 10, what="g1 holding requests")
        rc, out, _ = ops(c, "drain", "g1", "--reason", "kernel upgrade")
        assert "drain g1: now draining" in out, out
        dispatched = worker(status(c), "g1")["dispatched"]
        later = [ex.submit(complete, c, 4) for _ in range(12)]
        results = [f.result() for f in first + later]
    assert all(st == 200 for st, _ in results), [b for st, b in results if st != 200]
    st = status(c)
    g1 = worker(st, "g1")
    assert g1["dispatched"] == dispatched, "a drained worker was given new requests"
    assert g1["state"] == "drained" and g1["empty"] and g1["drained"], g1
    assert g1["drain_by"] == "alice@127.0.0.1" and g1["drain_reason"] == "kernel upgrade"
    # The other GPU worker took the traffic: nothing had to spill.
    assert served_by(c)["drained"] == 0
    out = ops(c, "status")[1]
    assert "drained by alice@127.0.0.1: kernel upgrade" in out, out
    ops(c, "undrain", "g1")
    assert worker(status(c), "g1")["state"] == "ready"


def test_draining_a_whole_pool_spills_as_drained(two_pools):
    c = two_pools
    ops(c, "drain", "g1", "--reason", "r")
    ops(c, "drain", "g2", "--reason", "r")
    assert served_by(c, 4) == {"forced": 0, "cordoned": 0, "drained": 4}


def test_cordon_sends_new_requests_to_overflow_and_uncordon_brings_them_back(two_pools):
    c = two_pools
    ops(c, "cordon", "gpu-pool", "--reason", "driver update")
    pool = next(p for p in status(c)["pools"] if p["name"] == "gpu-pool")
    assert pool["cordoned"] and pool["cordon_reason"] == "driver update", pool
    assert all(worker(status(c), w)["state"] == "cordoned" for w in ("g1", "g2"))
    assert served_by(c, 5)["cordoned"] == 5
    ops(c, "uncordon", "gpu-pool")
    assert served_by(c, 5) == {"forced": 0, "cordoned": 0, "drained": 0}


def test_force_overflow_on_and_off(two_pools):
    c = two_pools
    rc, out, _ = ops(c, "force-overflow", "echo@gpu-pool", "on", "--reason", "GPU maintenance")
    route = next(r for r in status(c)["routes"] if r["name"] == "echo@gpu-pool")
    assert route["forced_overflow"] and route["reason"] == "GPU maintenance", route
    assert served_by(c, 5)["forced"] == 5
    ops(c, "force-overflow", "echo@gpu-pool", "off")
    assert served_by(c, 5)["forced"] == 0
    # By the model's name: every primary route of it.
    ops(c, "force-overflow", "echo", "on")
    assert served_by(c, 3)["forced"] == 3
    ops(c, "force-overflow", "echo", "off")


def test_state_survives_reload_and_reconnect_and_is_logged(two_pools):
    c = two_pools
    ops(c, "drain", "g1", "--reason", "disk swap")
    ops(c, "cordon", "cpu-pool", "--reason", "rack move")
    ops(c, "force-overflow", "echo", "on", "--reason", "upgrade")
    # A new policy version (a comment changes the file) keeps all three.
    c.config_path.write_text(POLICY + "# edited\n")
    assert "policy reloaded: version 2" in ops(c, "reload")[1]
    st = status(c)
    assert st["policy_version"] == 2 and st["last_reload_error"] is None
    assert worker(st, "g1")["drained"]
    assert next(p for p in st["pools"] if p["name"] == "cpu-pool")["cordoned"]
    assert next(r for r in st["routes"] if r["name"] == "echo@gpu-pool")["forced_overflow"]
    # With its overflow pool cordoned, the forced route has nowhere to go: a 503 that says why.
    code, body = complete(c)
    assert code == 503 and "forced" in body["error"]["message"], body
    # g1 killed and started again under its id: still drained.
    g1 = next(p for p in c.procs if p.log_path.name.startswith("g1"))
    g1.kill9()
    wait_until(lambda: "g1" not in {w["id"] for w in status(c)["workers"]}, 15, what="g1 gone")
    c.start_echo("gpu-pool", 40, ["--worker-id", "g1"], name="g1-again")
    wait_until(lambda: "g1" in {w["id"] for w in status(c)["workers"]}, 15, what="g1 back")
    assert worker(status(c), "g1")["state"] == "drained"
    # Each action, with who and why, in the status and the gateway's log.
    acts = status(c)["operator_actions"]
    assert [(a["action"], a["target"], a["reason"]) for a in acts] == [
        ("drain", "g1", "disk swap"), ("cordon", "cpu-pool", "rack move"), ("force-overflow on", "echo", "upgrade")]
    assert all(a["by"] == "alice@127.0.0.1" and a["at_ms"] > 1.7e12 for a in acts)
    assert "operator alice@127.0.0.1: cordon pool cpu-pool (reason: rack move)" in c.gateway.output()
    # A reload that fails is shown, and the marks stay.
    c.config_path.write_text("routes: [\n")
    rc, _, err = ops(c, "reload", check=False)
    assert rc == 1 and "400" in err
    st = status(c)
    assert st["last_reload_error"] and "routes.yaml" in st["last_reload_error"]
    assert worker(st, "g1")["drained"]
    assert "last reload FAILED" in ops(c, "status")[1]


def admin(cluster, path, body):
    st, _, raw = cluster.admin_post(path, json.dumps(body).encode() if isinstance(body, dict) else body)
    return st, json.loads(raw)


def test_bad_input_gets_the_error_shape_with_param(two_pools):
    c = two_pools
    cases = [
        ("/admin/workers/nope/drain", {}, 404, None),
        ("/admin/pools/nope/cordon", {}, 404, None),
        ("/admin/routes/nope/force-overflow", {"on": True}, 404, None),
        ("/admin/routes/echo@cpu-pool/force-overflow", {"on": True}, 404, None),   # an overflow route
        ("/admin/workers/g1/explode", {}, 404, None),
        ("/admin/routes/echo/force-overflow", {}, 400, "on"),
        ("/admin/routes/echo/force-overflow", {"on": "yes"}, 400, "on"),
        ("/admin/workers/g1/drain", {"reason": 7}, 400, "reason"),
        ("/admin/workers/g1/drain", {"reason": "two\nlines"}, 400, "reason"),
        ("/admin/workers/g1/drain", {"reason": "x" * 300}, 400, "reason"),
        ("/admin/workers/g1/drain", {"operator": "x" * 100}, 400, "operator"),
        ("/admin/workers/g1/drain", {"reson": "typo"}, 400, "reson"),
        ("/admin/workers/g1/drain", b"{not json", 400, None),
        ("/admin/workers/g1/drain", b"[]", 400, None),
    ]
    for path, body, want, param in cases:
        st, err = admin(c, path, body)
        assert st == want and err["error"]["param"] == param, (path, body, st, err)
    # Nothing of that was applied.
    assert status(c)["operator_actions"] == [] and not worker(status(c), "g1")["drained"]
    # Without the admin token: refused, not applied.
    st, _, _ = http_post(c.base + "/admin/workers/g1/drain", {"reason": "x"})
    assert st == 401 and not worker(status(c), "g1")["drained"]
    # GET is not an action.
    import urllib.request
    try:
        urllib.request.urlopen(urllib.request.Request(c.base + "/admin/workers/g1/drain", headers=c.admin_headers))
        assert False, "GET drained"
    except urllib.error.HTTPError as e:
        assert e.code == 405
    # The CLI: usage errors exit 2, a refusal 1 with the gateway's message.
    assert ops(c, "force-overflow", "echo", "maybe", check=False)[0] == 2
    assert ops(c, "frobnicate", check=False)[0] == 2
    rc, _, err = ops(c, "drain", "nope", check=False)
    assert rc == 1 and "no worker 'nope' is registered" in err


def test_force_without_overflow_route_warns(cluster):
    cluster.start_gateway(TWO_POOLS + 'routes:\n  - model: "echo"\n    target: gpu-pool\n')
    rc, out, err = ops(cluster, "force-overflow", "echo", "on")
    assert "no overflow route" in err
    rc, out, _ = ops(cluster, "force-overflow", "echo", "off", "--json")
    assert json.loads(out)["action"] == "force-overflow off"
