"""Faults on real processes, beyond test_gateway_failures.py's kill -9 and
SIGTERM cases: a worker that hangs (SIGSTOP) and comes back (SIGCONT), a
worker killed between requests, the gateway killed under load, and a
network link cut and restored (a network namespace and a veth pair).

Each ends by checking that nothing leaked: every worker reports no active
request and the gateway's in-flight gauge is back to 0.
"""
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import ECHO_ENV, TWO_POOLS, Proc, bin_path, http_get, http_post, metric, route_status, wait_until

POLICY = TWO_POOLS + """\
routes:
  - model: "echo"
    target: gpu-pool
  - model: "echo"
    target: cpu-pool
    priority: overflow
"""
LIVENESS_S = 3.0   # SW_HEARTBEAT_LIVENESS x SW_HEARTBEAT_MS (proto/wire.h)


def complete(cluster, max_tokens=4, timeout=30):
    st, hdr, body = http_post(cluster.base + "/v1/completions",
                              {"model": "echo", "prompt": "hi", "max_tokens": max_tokens},
                              timeout=timeout)
    return st, hdr, json.loads(body)


def nothing_leaked(cluster, n_workers):
    wait_until(lambda: len(cluster.workers()) == n_workers and
               all(w["active"] == 0 for w in cluster.workers()), 15,
               what=f"{n_workers} workers, none with an active request")
    wait_until(lambda: inflight_total(cluster) == 0, 5, what="spillway_inflight back to 0")


def inflight_total(cluster):
    text = http_get(cluster.base + "/metrics")[1].decode()
    return sum(float(l.split()[-1]) for l in text.splitlines()
               if l.startswith("spillway_inflight{"))


def stream_lines(cluster, body, on_event):
    """Streams a completion; calls on_event(n) after each data event; returns the events."""
    req = urllib.request.Request(cluster.base + "/v1/completions",
                                 data=json.dumps({**body, "stream": True}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=30) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: "):
                events.append(line[6:])
                on_event(len(events))
    return events


def test_sigstop_worker_expires_then_rejoins(cluster):
    """A stopped worker is dead after its heartbeats stop: its stream ends
    with an error within the liveness, a request sent to it meanwhile is
    retried on the overflow pool, and after SIGCONT it registers again and
    serves, with nothing leaked."""
    cluster.start_gateway(POLICY)
    gpu = cluster.start_echo("gpu-pool", 20, name="gpu-echo")
    cluster.start_echo("cpu-pool", 500, name="cpu-echo")
    cluster.wait_workers(2)
    t_stop = []

    def on_event(n):
        if n == 3:
            gpu.p.send_signal(signal.SIGSTOP)
            t_stop.append(time.monotonic())
    events = stream_lines(cluster, {"model": "echo", "prompt": "hi", "max_tokens": 500}, on_event)
    took = time.monotonic() - t_stop[0]
    try:
        assert events[-1] == "[DONE]", events[-3:]
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "error", events[-2]
        assert took < LIVENESS_S + 3, f"the stream ended {took:.1f} s after SIGSTOP"
        # The stopped worker is gone from the registry; a new request goes to the overflow pool.
        wait_until(lambda: len(cluster.workers()) == 1, 5, what="the stopped worker dropped")
        st, hdr, d = complete(cluster)
        assert st == 200 and d["choices"][0]["finish_reason"] == "length", d
        assert hdr["X-Spillway-Pool"] == "cpu-pool", hdr
    finally:
        gpu.p.send_signal(signal.SIGCONT)
    wait_until(lambda: len(cluster.workers()) == 2, 15, what="the resumed worker registered again")
    st, hdr, d = complete(cluster)
    assert st == 200 and hdr["X-Spillway-Pool"] == "gpu-pool", (st, hdr, d)
    nothing_leaked(cluster, 2)
    print(f"stream ended {took:.2f} s after SIGSTOP")


def test_request_sent_to_a_hung_worker_is_retried(cluster):
    """A request dispatched to a worker that has just hung (before the
    gateway knows) gets no token; when the heartbeats expire it is retried
    on the overflow pool and completes."""
    cluster.start_gateway(POLICY)
    gpu = cluster.start_echo("gpu-pool", 500, name="gpu-echo")
    cluster.start_echo("cpu-pool", 500, name="cpu-echo")
    cluster.wait_workers(2)
    gpu.p.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        st, hdr, d = complete(cluster, max_tokens=8)
        took = time.monotonic() - t0
        assert st == 200 and d["choices"][0]["finish_reason"] == "length", d
        assert hdr["X-Spillway-Pool"] == "cpu-pool", hdr
        assert took < LIVENESS_S + 3, f"answered after {took:.1f} s"
    finally:
        gpu.p.send_signal(signal.SIGCONT)
    wait_until(lambda: len(cluster.workers()) == 2, 15, what="the resumed worker registered again")
    nothing_leaked(cluster, 2)


def test_kill9_between_requests(cluster):
    """A worker killed while idle: the next request goes to the pool that
    is left, at once or after one retry, and a restarted worker serves again."""
    cluster.start_gateway(POLICY)
    gpu = cluster.start_echo("gpu-pool", 500, ["--worker-id", "g1"], name="gpu-echo")
    cluster.start_echo("cpu-pool", 500, name="cpu-echo")
    cluster.wait_workers(2)
    assert complete(cluster)[0] == 200
    gpu.kill9()
    for _ in range(5):
        st, hdr, d = complete(cluster)
        assert st == 200 and d["choices"][0]["finish_reason"] == "length", d
    cluster.start_echo("gpu-pool", 500, ["--worker-id", "g1"], name="gpu-echo")
    wait_until(lambda: complete(cluster)[1]["X-Spillway-Pool"] == "gpu-pool", 15,
               what="the restarted worker serving")
    nothing_leaked(cluster, 2)


def test_gateway_killed_under_load_clients_get_errors_not_hangs(cluster):
    """Eight streams in flight when the gateway is killed: each client sees
    its connection end at once (no hang). The restarted gateway gets its
    workers back and serves."""
    cluster.start_gateway(POLICY)
    cluster.start_echo("gpu-pool", 20, name="gpu-echo")
    cluster.wait_workers(1)
    ends = []

    def client():
        t0 = time.monotonic()
        try:
            ev = stream_lines(cluster, {"model": "echo", "prompt": "hi", "max_tokens": 1000},
                              lambda n: None)
            # A cut connection ends the iteration quietly: no [DONE] is the sign.
            ends.append(("finished" if ev and ev[-1] == "[DONE]" else "cut without [DONE]",
                         time.monotonic() - t0))
        except Exception as e:  # noqa: BLE001 - what a client sees is the point
            ends.append((type(e).__name__, time.monotonic() - t0))
    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    wait_until(lambda: cluster.workers()[0]["active"] == 8, 10, what="8 streams active")
    t_kill = time.monotonic()
    cluster.gateway.kill9()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a client hung after the gateway died"
    assert len(ends) == 8 and all(k != "finished" for k, _ in ends), ends
    assert time.monotonic() - t_kill < 5
    cluster.start_gateway(POLICY)
    cluster.wait_workers(1, timeout=15)
    # The worker drops the streams of the gateway it lost, so the slots come back.
    nothing_leaked(cluster, 1)
    assert complete(cluster)[0] == 200


def open_streams(cluster, n):
    """n endless streamed completions, each on its own thread; returns the
    threads and the list each appends its end to: the last finish_reason,
    "cut" (no chunk before the end) or the exception's name."""
    ends = []

    def client():
        try:
            events = stream_lines(cluster, {"model": "echo", "prompt": "hi", "max_tokens": 100000}, lambda n: None)
            ends.append(json.loads(events[-2])["choices"][0]["finish_reason"] if len(events) > 1 else "cut")
        except Exception as e:  # noqa: BLE001 - what a client sees is the point
            ends.append(type(e).__name__)
    threads = [threading.Thread(target=client) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, ends


def test_gateway_restarted_under_load_hears_nothing_of_the_old_requests(cluster):
    """48 fast streams in flight when the gateway is killed and restarted:
    the worker registers with the new gateway only once it has dropped the
    old streams, so the new gateway gets no frame for a request it never
    sent (a burst of them once got the worker dropped as a protocol breaker,
    and the next request spilled), and the worker keeps serving its pool."""
    cluster.start_gateway(POLICY)
    cluster.start_echo("gpu-pool", 100, name="gpu-echo")
    cluster.start_echo("cpu-pool", 500, name="cpu-echo")
    cluster.wait_workers(2)
    threads, _ = open_streams(cluster, 48)   # the kill cuts every one: how is not the point here
    wait_until(lambda: any(w["active"] == 48 for w in cluster.workers()), 10, what="48 streams active")
    cluster.gateway.kill9()
    for t in threads:
        t.join(10)
    cluster.start_gateway(POLICY)
    cluster.wait_workers(2, timeout=15)
    time.sleep(1.5)   # the old streams' output, were it still coming, would have come by now
    assert metric(cluster, "spillway_worker_violations_total", reason="unknown_request") == 0, \
        cluster.gateway.output()[-3000:]
    assert "is gone" not in cluster.gateway.output(), cluster.gateway.output()[-3000:]
    st, hdr, d = complete(cluster)
    assert st == 200 and hdr["X-Spillway-Pool"] == "gpu-pool", (st, hdr, d)
    nothing_leaked(cluster, 2)


def test_a_dead_worker_does_not_degrade_its_pool(cluster):
    """A GPU worker killed with 48 streams open: each of those clients sees
    its stream fail, but the death counts as one error on the route, not 48.
    The pool's other GPU worker keeps taking the route's traffic; nothing
    spills to the CPU pool as if the whole GPU pool were failing."""
    cluster.start_gateway(POLICY)
    gpus = {wid: cluster.start_echo("gpu-pool", 100, ["--worker-id", wid], name=wid) for wid in ("gpu-a", "gpu-b")}
    cluster.start_echo("cpu-pool", 500, name="cpu-echo")
    cluster.wait_workers(3)
    threads, ends = open_streams(cluster, 48)
    wait_until(lambda: sum(w["active"] for w in cluster.workers() if w["pool"] == "gpu-pool") == 48, 10,
               what="48 streams on the GPU pool")
    busiest = max((w for w in cluster.workers() if w["pool"] == "gpu-pool"), key=lambda w: w["active"])
    assert busiest["active"] == 48, cluster.workers()   # one prompt: one worker (the prefix hash)
    gpus[busiest["id"]].kill9()
    for t in threads:
        t.join(10)
    assert ends == ["error"] * 48, ends
    wait_until(lambda: len(cluster.workers()) == 2, 5, what="the killed worker dropped")
    for _ in range(10):
        st, hdr, d = complete(cluster)
        assert st == 200 and hdr["X-Spillway-Pool"] == "gpu-pool", (st, hdr, d)
    route = route_status(cluster, "echo@gpu-pool")
    assert route["error_rate"] < 0.5, route


def sh(*args):
    subprocess.run(args, check=True, capture_output=True)


@pytest.fixture
def netns():
    """A network namespace joined to this one by a veth pair: 10.77.0.1 here,
    10.77.0.2 inside. Root and iproute2 needed, else skipped."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2")
    name = f"swf{os.getpid() % 100000}"
    host_if, ns_if = f"{name}h", f"{name}n"
    try:
        sh("ip", "netns", "add", name)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot make a network namespace here: {e.stderr.decode().strip()}")
    try:
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", name)
        sh("ip", "addr", "add", "10.77.0.1/30", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "-n", name, "addr", "add", "10.77.0.2/30", "dev", ns_if)
        sh("ip", "-n", name, "link", "set", ns_if, "up")
        sh("ip", "-n", name, "link", "set", "lo", "up")
        yield name, host_if
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_network_link_cut_and_restored(cluster, netns):
    """A worker in another network namespace, reached over a veth link. With
    the link down its stream ends with an error within the heartbeat
    liveness and the worker is dropped; with the link up again it registers
    again and serves. Nothing leaks."""
    name, host_if = netns
    ep = f"tcp://10.77.0.1:{cluster.zmq_port}"
    cluster.start_gateway(POLICY, ["--workers", ep, "--insecure-workers"])
    cluster.worker_ep = ep   # the workers started through cluster connect there too
    w = Proc(["ip", "netns", "exec", name, bin_path("spillway-worker-cpu"), "--gateway", ep,
              "--pool", "gpu-pool", "--model", "echo=/dev/null", "--test-echo", "20"],
             cluster.tmp / "ns-echo.log", env=ECHO_ENV)
    cluster.procs.append(w)
    cluster.start_echo("cpu-pool", 500, name="cpu-echo")
    wait_until(lambda: len(cluster.workers()) == 2, 15, what="both workers registered")
    t_cut = []

    def on_event(n):
        if n == 3:
            sh("ip", "link", "set", host_if, "down")
            t_cut.append(time.monotonic())
    try:
        events = stream_lines(cluster, {"model": "echo", "prompt": "hi", "max_tokens": 500},
                              on_event)
        took = time.monotonic() - t_cut[0]
        assert events[-1] == "[DONE]" and \
            json.loads(events[-2])["choices"][0]["finish_reason"] == "error", events[-3:]
        assert took < LIVENESS_S + 3, f"the stream ended {took:.1f} s after the cut"
        wait_until(lambda: len(cluster.workers()) == 1, 5, what="the cut-off worker dropped")
        st, hdr, _ = complete(cluster)
        assert st == 200 and hdr["X-Spillway-Pool"] == "cpu-pool"
    finally:
        sh("ip", "link", "set", host_if, "up")
    wait_until(lambda: len(cluster.workers()) == 2, 20, what="the worker back after the link returned")
    wait_until(lambda: complete(cluster)[1]["X-Spillway-Pool"] == "gpu-pool", 10,
               what="the namespaced worker serving again")
    nothing_leaked(cluster, 2)
