"""Capacity-aware overflow, degraded pools and the bounded wait queue, with real
processes: a test-mode worker stands in for the GPU pool, and the CPU pool is a
real CPU worker running stories260K where the issue asks for one.
"""
import concurrent.futures as cf
import json
import time

import pytest

from conftest import TWO_POOLS, http_post, metric, route_status, shared_file, wait_until

OVERFLOW_POLICY = TWO_POOLS + """\
routes:
  - model: "stories260K"
    target: gpu-pool
    max_concurrency: 2
    priority: primary
  - model: "stories260K"
    target: cpu-pool
    max_concurrency: 100
    priority: overflow
"""


def complete(cluster, model, max_tokens, **extra):
    st, hdr, body = http_post(cluster.base + "/v1/completions",
                              {"model": model, "prompt": "Once upon a time", "max_tokens": max_tokens,
                               "temperature": 0, **extra}, timeout=60)
    return st, hdr, json.loads(body)


@pytest.fixture
def overflow(cluster):
    model = shared_file("models/stories260K.gguf")
    cluster.start_gateway(OVERFLOW_POLICY)
    # The "GPU" worker: 10 tokens/s, so its 2 requests stay in flight ~2 s.
    gpu = cluster.start_echo("gpu-pool", 10, model_name="stories260K", model_path=model, name="gpu-echo")
    cpu = cluster.start_worker("cpu-pool", "stories260K", model, ["--threads", "1"], name="cpu")
    def both():
        pools = {w["pool"] for w in cluster.workers()}
        return pools == {"gpu-pool", "cpu-pool"}
    wait_until(both, 30, what="both workers registered")
    return cluster, gpu, cpu


def test_overflow_by_capacity(overflow):
    cluster, gpu, cpu = overflow
    with cf.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda _: complete(cluster, "stories260K", 20), range(8)))
    assert all(st == 200 for st, _, _ in results), results
    pools = sorted(h["X-Spillway-Pool"] for _, h, _ in results)
    assert pools == ["cpu-pool"] * 6 + ["gpu-pool"] * 2
    for st, h, b in results:
        assert b["choices"][0]["finish_reason"] in ("length", "stop")
        if h["X-Spillway-Pool"] == "gpu-pool":
            assert b["choices"][0]["text"].split()[0] == "tok1"     # the test-mode worker
        else:
            assert b["choices"][0]["text"].startswith(",")           # the real model
    assert metric(cluster, "spillway_overflow_total", from_pool="gpu-pool", to_pool="cpu-pool",
                  reason="saturated") == 6
    assert metric(cluster, "spillway_requests_total", pool="gpu-pool", status="ok") == 2
    assert metric(cluster, "spillway_requests_total", pool="cpu-pool", status="ok") == 6
    assert metric(cluster, "spillway_inflight", pool="gpu-pool") == 0
    assert metric(cluster, "spillway_inflight", pool="cpu-pool") == 0


def test_degraded_after_kill9(overflow):
    cluster, gpu, cpu = overflow
    st, h, _ = complete(cluster, "stories260K", 2)
    assert st == 200 and h["X-Spillway-Pool"] == "gpu-pool"
    gpu.kill9()
    t0 = time.monotonic()
    served = None
    while time.monotonic() - t0 < 3.0:
        st, h, b = complete(cluster, "stories260K", 2)
        assert st == 200, b
        if h["X-Spillway-Pool"] == "cpu-pool":
            served = time.monotonic() - t0
            break
    assert served is not None and served < 3.0
    # From then on every request goes to the CPU pool, counted as a degraded spill.
    for _ in range(3):
        st, h, _ = complete(cluster, "stories260K", 2)
        assert st == 200 and h["X-Spillway-Pool"] == "cpu-pool"
    wait_until(lambda: metric(cluster, "spillway_overflow_total", from_pool="gpu-pool",
                              to_pool="cpu-pool", reason="degraded") >= 3, 5)


QUEUE_POLICY = """\
pools:
  - name: gpu-pool
    kind: gpu
routes:
  - model: "echo"
    target: gpu-pool
    max_concurrency: 1
defaults:
  queue_length: 1
  queue_timeout_ms: 600
"""


def test_bounded_queue_then_429_and_503(cluster):
    cluster.start_gateway(QUEUE_POLICY)
    cluster.start_echo("gpu-pool", 5)
    cluster.wait_model("echo")
    with cf.ThreadPoolExecutor(3) as ex:
        # 1 runs (~1 s), 1 waits in the queue, the third finds the queue full.
        first = ex.submit(complete, cluster, "echo", 5)
        time.sleep(0.3)
        waiting = ex.submit(complete, cluster, "echo", 1)
        time.sleep(0.2)
        assert metric(cluster, "spillway_queue_depth", pool="gpu-pool") == 1
        st, hdr, body = complete(cluster, "echo", 1)
        assert st == 429 and int(hdr["Retry-After"]) >= 1
        assert body["error"]["code"] == "queue_full"
        st, hdr, body = waiting.result()
        # It waited 600 ms while the first still ran: timed out with 503.
        assert st == 503 and int(hdr["Retry-After"]) >= 1, body
        assert body["error"]["code"] == "queue_timeout"
        assert first.result()[0] == 200
    assert metric(cluster, "spillway_queue_depth", pool="gpu-pool") == 0


def test_queued_request_runs_when_capacity_frees(cluster):
    cluster.start_gateway(QUEUE_POLICY.replace("queue_timeout_ms: 600", "queue_timeout_ms: 5000"))
    cluster.start_echo("gpu-pool", 20)
    cluster.wait_model("echo")
    with cf.ThreadPoolExecutor(2) as ex:
        a = ex.submit(complete, cluster, "echo", 10)      # ~0.5 s
        time.sleep(0.15)
        b = ex.submit(complete, cluster, "echo", 2)       # waits, then runs
        assert a.result()[0] == 200
        st, _, body = b.result()
        assert st == 200 and body["usage"]["completion_tokens"] == 2


def test_directives_pick_the_pool(cluster):
    cluster.start_gateway(OVERFLOW_POLICY.replace("stories260K", "echo"))
    cluster.start_echo("gpu-pool", 1000, name="g")
    cluster.start_echo("cpu-pool", 1000, name="c")
    cluster.wait_workers(2)
    st, h, _ = complete(cluster, "echo", 1)
    assert h["X-Spillway-Pool"] == "gpu-pool"
    st, h, _ = complete(cluster, "echo", 1, spillway={"target": "cpu-pool"})
    assert st == 200 and h["X-Spillway-Pool"] == "cpu-pool"
    st, h, _ = http_post(cluster.base + "/v1/completions", {"model": "echo", "prompt": "x", "max_tokens": 1},
                         headers={"X-Spillway-Target": "cpu-pool"})[:3]
    assert st == 200 and h["X-Spillway-Pool"] == "cpu-pool"
    st, h, body = complete(cluster, "echo", 1, spillway={"quantization": "fp8"})
    assert st == 503, body     # routes exist, but no worker registered fp8


def test_spill_when_predicted_queue_wait_exceeds_budget(cluster):
    cluster.start_gateway(OVERFLOW_POLICY.replace("stories260K", "echo").replace("    max_concurrency: 2\n", ""))
    # One slot at 10 tokens/s on the primary pool; a fast overflow pool.
    cluster.start_echo("gpu-pool", 10, ["--parallel", "1"], name="g")
    cluster.start_echo("cpu-pool", 1000, name="c")
    cluster.wait_workers(2)
    st, h, _ = complete(cluster, "echo", 5)          # teaches the gateway: ~0.5 s per request
    assert h["X-Spillway-Pool"] == "gpu-pool"
    with cf.ThreadPoolExecutor(1) as ex:
        busy = ex.submit(complete, cluster, "echo", 20)   # holds the only slot for ~2 s
        time.sleep(0.3)
        # Waiting ~0.5 s for the slot is beyond a 100 ms budget: spill.
        st, h, _ = complete(cluster, "echo", 1, spillway={"max_queue_ms": 100})
        assert st == 200 and h["X-Spillway-Pool"] == "cpu-pool"
        # Without a budget the request stays on the primary pool and waits there.
        st, h, _ = complete(cluster, "echo", 1)
        assert st == 200 and h["X-Spillway-Pool"] == "gpu-pool"
        assert busy.result()[0] == 200
    assert metric(cluster, "spillway_overflow_total", from_pool="gpu-pool", to_pool="cpu-pool",
                  reason="queue_wait") == 1


MATCH_POLICY = TWO_POOLS + """\
routes:
  - model: "echo"
    target: gpu-pool
    match:
      class: interactive
      prompt_tokens: {max: 100}
  - model: "echo"
    target: cpu-pool
  - model: "vip"
    target: gpu-pool
    match:
      api_keys: ["key-gold"]
      tenants: [acme]
  - model: "vip"
    target: cpu-pool
    match:
      tenants: [acme, globex]
"""


def test_match_conditions(cluster):
    cluster.start_gateway(MATCH_POLICY)
    for pool in ("gpu-pool", "cpu-pool"):
        cluster.start_echo(pool, 1000, name=pool)
        cluster.start_echo(pool, 1000, model_name="vip", name=pool + "v")
    cluster.wait_workers(4)

    def pool_of(model, prompt="x", headers=None, **extra):
        st, h, body = http_post(cluster.base + "/v1/completions",
                                {"model": model, "prompt": prompt, "max_tokens": 1, **extra}, headers)
        return st, h.get("X-Spillway-Pool"), json.loads(body)

    assert pool_of("echo")[1] == "gpu-pool"                              # interactive by default
    assert pool_of("echo", spillway={"priority": "batch"})[1] == "cpu-pool"
    assert pool_of("echo", headers={"X-Spillway-Priority": "batch"})[1] == "cpu-pool"
    assert pool_of("echo", prompt="word " * 1000)[1] == "cpu-pool"       # long prompt
    gold = {"Authorization": "Bearer key-gold", "X-Spillway-Tenant": "acme"}
    assert pool_of("vip", headers=gold)[1] == "gpu-pool"
    assert pool_of("vip", headers={"X-Spillway-Tenant": "globex"})[1] == "cpu-pool"
    st, _, body = pool_of("vip", headers={"X-Spillway-Tenant": "initech"})
    assert st == 400 and body["error"]["code"] == "no_matching_route"
    st, _, body = pool_of("echo", headers={"X-Spillway-Priority": "urgent"})
    assert st == 400


ERROR_RATE_POLICY = TWO_POOLS + """\
routes:
  - model: "echo"
    target: "gpu-pool"
    priority: primary
  - model: "echo"
    target: "cpu-pool"
    priority: overflow
defaults:
  error_rate_threshold: 0.5
"""


def test_error_rate_degrades_the_route(cluster):
    """A gpu-pool worker that fails every request: each failure is retried on
    the overflow pool (nothing is lost), and once the route's recent error
    rate is above the threshold the gateway stops sending it work at all."""
    cluster.start_gateway(ERROR_RATE_POLICY)
    cluster.start_echo("gpu-pool", 1000, ["--test-fail-rate", "1"], name="bad-gpu")
    cluster.start_echo("cpu-pool", 1000, name="cpu")
    cluster.wait_workers(2)

    def dispatched(pool):
        return sum(w["dispatched"] for w in cluster.workers() if w["pool"] == pool)

    results = [complete(cluster, "echo", 2) for _ in range(30)]
    assert all(st == 200 for st, _, _ in results), results
    assert all(h["X-Spillway-Pool"] == "cpu-pool" for _, h, _ in results)
    sent_to_gpu = dispatched("gpu-pool")
    print("requests sent to the failing gpu worker:", sent_to_gpu)
    # The error rate needs a few samples before it counts, then it stops traffic.
    assert 1 <= sent_to_gpu < 30, sent_to_gpu
    assert dispatched("cpu-pool") == 30
    for _ in range(10):
        st, h, _ = complete(cluster, "echo", 2)
        assert st == 200 and h["X-Spillway-Pool"] == "cpu-pool"
    # Degraded: no new attempts, but for at most one probe, had 5 s passed
    # (test_degraded_route_comes_back).
    assert dispatched("gpu-pool") - sent_to_gpu <= 1, (dispatched("gpu-pool"), sent_to_gpu)
    assert metric(cluster, "spillway_overflow_total", from_pool="gpu-pool", to_pool="cpu-pool",
                  reason="degraded") == 40


def test_degraded_route_comes_back(cluster):
    """A route degraded by its error rate is not written off: every 5 s one
    request tries it (half-open), and once its pool serves again, one
    success restores it. Here the failing GPU worker is replaced by a good
    one; within a probe interval the GPU route takes its traffic back."""
    cluster.start_gateway(ERROR_RATE_POLICY)
    bad = cluster.start_echo("gpu-pool", 1000, ["--test-fail-rate", "1"], name="bad-gpu")
    cluster.start_echo("cpu-pool", 1000, name="cpu")
    cluster.wait_workers(2)
    for _ in range(20):
        st, h, _ = complete(cluster, "echo", 2)
        assert st == 200 and h["X-Spillway-Pool"] == "cpu-pool"
    route = lambda: route_status(cluster, "echo@gpu-pool")  # noqa: E731
    assert route()["error_rate"] > 0.5, route()
    bad.stop()
    cluster.start_echo("gpu-pool", 1000, name="good-gpu")
    cluster.wait_workers(2)
    t0 = time.monotonic()

    def on_gpu():
        st, h, _ = complete(cluster, "echo", 2)
        assert st == 200, st
        return h["X-Spillway-Pool"] == "gpu-pool"
    wait_until(on_gpu, 10, interval=0.2, what="the GPU route tried again and restored")
    print(f"GPU route back {time.monotonic() - t0:.1f} s after the good worker registered")
    for _ in range(5):
        assert on_gpu(), "restored: the primary route takes every request"
    assert route()["error_rate"] == 0, route()


def test_fail_rate_needs_test_mode(tmp_path):
    import subprocess
    from conftest import bin_path
    r = subprocess.run([bin_path("spillway-worker-cpu"), "--gateway", "tcp://127.0.0.1:1", "--pool", "p",
                        "--model", "m=/dev/null", "--test-fail-rate", "0.5"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "--test-fail-rate only works with --test-echo" in r.stderr
