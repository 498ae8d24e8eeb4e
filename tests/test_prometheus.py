"""The gateway's metrics as a real Prometheus sees them (docs/metrics.md):
Debian's prometheus scrapes a real gateway with two real CPU workers
(stories260K), one in a priced "GPU" pool with a max_concurrency of 2 and
one in the overflow pool, under a scripted load: requests one at a time, an
overflow burst past the primary's capacity, and requests while an operator
forces the route onto its overflow. Through Prometheus' HTTP API: requests
counted, spills counted by reason (as the responses' X-Spillway-Pool say),
one time-to-first-token observation per request, per-worker KV-cache use in
[0, 1], a cost for the priced pools and the gauges the Grafana dashboard and
the alert rules read.
"""
import concurrent.futures as cf
import json
import re

import pytest

from conftest import http_post, shared_file, wait_until
from prom import Prometheus

pytestmark = pytest.mark.plain_only

POLICY = """\
pools:
  - name: gpu-pool
    kind: gpu
    cost_per_hour: 2.5
  - name: cpu-pool
    kind: cpu
    cost_per_hour: 0.25
routes:
  - model: "stories260K"
    target: gpu-pool
    max_concurrency: 2
    priority: primary
  - model: "stories260K"
    target: cpu-pool
    priority: overflow
"""
ROUTE = "stories260K@gpu-pool"


def complete(cluster, max_tokens):
    st, hdr, body = http_post(cluster.base + "/v1/completions",
                              {"model": "stories260K", "prompt": "Once upon a time", "max_tokens": max_tokens,
                               "temperature": 0}, timeout=60)
    assert st == 200, body
    return hdr["X-Spillway-Pool"]


def value(prom, expr):
    """The single value of an instant query (0 when it has no result)."""
    rows = prom.query(expr)
    assert len(rows) <= 1, (expr, rows)
    return float(rows[0]["value"][1]) if rows else 0.0


def by_label(prom, expr, label):
    return {r["metric"].get(label): float(r["value"][1]) for r in prom.query(expr)}


def force(cluster, on):
    st, _, body = cluster.admin_post(f"/admin/routes/{ROUTE}/force-overflow",
                                     json.dumps({"on": on, "reason": "metrics test"}).encode())
    assert st == 200, body


def scripted_load(cluster):
    """The load; returns the pools that served each request, in order, and
    how many were sent while forced."""
    served = [complete(cluster, 8) for _ in range(3)]               # the primary has room
    with cf.ThreadPoolExecutor(8) as ex:                              # a burst past its 2 slots
        served += list(ex.map(lambda _: complete(cluster, 128), range(8)))
    force(cluster, True)
    forced = [complete(cluster, 4) for _ in range(3)]
    force(cluster, False)
    return served + forced, len(forced)


def test_prometheus_scrapes_the_gateway_under_load(cluster, tmp_path):
    model = shared_file("models/stories260K.gguf")
    cluster.start_gateway(POLICY)
    cluster.start_worker("gpu-pool", "stories260K", model, ["--threads", "1", "--worker-id", "g1"], name="g1")
    cluster.start_worker("cpu-pool", "stories260K", model, ["--threads", "1", "--worker-id", "c1"], name="c1")
    cluster.wait_workers(2)
    port = cluster.base.rsplit(":", 1)[1]
    with Prometheus(tmp_path, targets=[f"127.0.0.1:{port}"], scrape_interval="1s") as prom:
        prom.wait_scraped(15)
        served, n_forced = scripted_load(cluster)
        n = len(served)
        spilled = served.count("cpu-pool")
        assert served[:3] == ["gpu-pool"] * 3 and spilled > n_forced, served
        wait_until(lambda: value(prom, "sum(spillway_requests_total)") == n, 10, what="every request scraped")

        assert value(prom, 'sum(spillway_requests_total{status="ok"})') == n
        reasons = by_label(prom, 'sum by (reason) (spillway_overflow_total{from_pool="gpu-pool",to_pool="cpu-pool"})',
                           "reason")
        assert reasons.get("forced") == n_forced, reasons
        assert reasons.get("saturated", 0) == spilled - n_forced, (reasons, served)
        assert value(prom, "sum(spillway_time_to_first_token_seconds_count)") == n
        assert value(prom, 'sum(spillway_time_to_first_token_seconds_count{pool="cpu-pool",model="stories260K"})') \
            == spilled
        assert value(prom, "sum(spillway_request_duration_seconds_count)") == n
        assert value(prom, "sum(spillway_queue_wait_seconds_count)") == n
        assert value(prom, "sum(spillway_inter_token_latency_seconds_count)") > 0

        kv = by_label(prom, "spillway_worker_kv_cache_utilization", "worker")
        assert set(kv) == {"g1", "c1"} and all(0 <= v <= 1 for v in kv.values()), kv
        gie = by_label(prom, "max_over_time(spillway_worker_kv_cache_usage_perc[1m])", "worker")
        assert set(gie) == {"g1", "c1"} and all(0 <= v <= 1 for v in gie.values()), gie
        assert by_label(prom, "spillway_worker_slots", "worker") == {"g1": 4, "c1": 4}
        assert set(by_label(prom, "spillway_worker_num_requests_waiting", "worker")) == {"g1", "c1"}

        cost = by_label(prom, "spillway_cost_dollars_total", "pool")
        assert cost.get("gpu-pool", 0) > 0 and cost.get("cpu-pool", 0) > 0, cost
        secs = by_label(prom, "spillway_worker_seconds_total", "pool")
        assert cost["gpu-pool"] == pytest.approx(secs["gpu-pool"] * 2.5 / 3600, rel=1e-6), (cost, secs)
        # The gauges the Grafana dashboard and the alert rules read.
        assert by_label(prom, "spillway_pool_healthy_workers", "pool") == {"gpu-pool": 1, "cpu-pool": 1}
        assert value(prom, 'spillway_pool_max_concurrency{pool="gpu-pool"}') == 0   # unlimited: no series
        assert value(prom, f'spillway_route_max_concurrency{{route="{ROUTE}"}}') == 2
        dpm = by_label(prom, "spillway_pool_dollars_per_million_tokens", "pool")
        assert dpm.get("gpu-pool", 0) > 0, dpm
        ages = by_label(prom, "spillway_worker_heartbeat_age_seconds", "worker")
        assert set(ages) == {"g1", "c1"} and all(0 <= a < 3 for a in ages.values()), ages
        hit = by_label(prom, "spillway_worker_prefix_cache_hit_rate", "worker")
        assert all(0 <= v <= 1 for v in hit.values()) and hit.get("g1", 0) > 0, hit   # the same prompt again

    # One access-log line per request, with its cost and no secret.
    log = cluster.gateway.output()
    lines = [l for l in log.splitlines() if l.startswith("access: ")]
    assert len(lines) == n, lines
    costs = [float(re.search(r"cost_usd=([0-9.]+)", l).group(1)) for l in lines]
    assert all(c > 0 for c in costs), lines
    assert all("status=ok" in l and "model=stories260K" in l and "key=-" in l for l in lines), lines
