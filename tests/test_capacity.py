"""Capacity is never over-committed: a route without max_concurrency takes
its capacity from the slots its workers report (plus a slack of 2 per
worker, gateway/router.c's WORKER_QUEUE_SLACK); beyond that requests wait in
the gateway's queue, bounded by queue_length and queue_timeout_ms, and get
429 (queue full) or 503 (timed out), each with Retry-After.

The acceptance case: 300 concurrent long streams against a 4-slot worker
behind an overflow route with no max_concurrency.
"""
import json
import threading
import time
import urllib.error
import urllib.request

from conftest import TWO_POOLS, wait_until

SLOTS, SLACK = 4, 2
QUEUE_LENGTH, QUEUE_TIMEOUT_MS = 20, 1500
POLICY = TWO_POOLS + f"""\
routes:
  - model: "echo"
    target: gpu-pool
  - model: "echo"
    target: cpu-pool
    priority: overflow
defaults:
  queue_length: {QUEUE_LENGTH}
  queue_timeout_ms: {QUEUE_TIMEOUT_MS}
"""


def stream(base, max_tokens):
    """One streamed completion: ('ok', seconds) when it ends with [DONE]
    after a length finish, (status, seconds, retry_after) for an HTTP error,
    or ('lost: ...', seconds) for anything else."""
    body = {"model": "echo", "prompt": "hi", "max_tokens": max_tokens, "stream": True}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            events = [l[6:].strip() for l in (x.decode() for x in r) if l.startswith("data: ")]
        finish = json.loads(events[-2])["choices"][0]["finish_reason"] if len(events) > 1 else None
        ok = events and events[-1] == "[DONE]" and finish == "length"
        return ("ok" if ok else f"lost: finish {finish}", time.monotonic() - t0)
    except urllib.error.HTTPError as e:
        err = json.loads(e.read()).get("error", {})
        return (e.code, time.monotonic() - t0, e.headers.get("Retry-After"), err.get("code"))
    except Exception as e:  # noqa: BLE001 - any other end is a lost request
        return (f"lost: {type(e).__name__}", time.monotonic() - t0)


def test_300_streams_against_a_4_slot_worker_none_waits_unbounded(cluster):
    cluster.start_gateway(POLICY)
    cluster.start_echo("cpu-pool", 100, ["--parallel", str(SLOTS)], name="cpu-echo")
    cluster.wait_workers(1)
    peak = {"inflight": 0, "active": 0}
    done = threading.Event()

    def watch():   # what the gateway has put on the worker, sampled
        while not done.is_set():
            for w in cluster.workers():
                peak["inflight"] = max(peak["inflight"], w["inflight"])
                peak["active"] = max(peak["active"], w["active"])
            time.sleep(0.02)
    results = []
    lock = threading.Lock()

    def client():
        r = stream(cluster.base, 50)   # 0.5 s of tokens at 100 tokens/s
        with lock:
            results.append(r)
    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=client) for _ in range(300)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    took = time.monotonic() - t0
    done.set()
    watcher.join()
    assert not any(t.is_alive() for t in threads), "a request waited unbounded"
    by = {}
    for r in results:
        by.setdefault(r[0], []).append(r)
    summary = {k: len(v) for k, v in by.items()}
    print(f"\n300 streams in {took:.1f} s: {summary}, peak on the worker {peak}")
    lost = [r for r in results if isinstance(r[0], str) and r[0].startswith("lost")]
    assert not lost, lost[:5]
    assert set(by) <= {"ok", 429, 503}, summary
    assert len(by.get("ok", [])) >= SLOTS, summary
    assert 429 in by, f"the queue of {QUEUE_LENGTH} never filled: {summary}"
    for r in by.get(429, []) + by.get(503, []):
        assert r[2] and int(r[2]) >= 1, f"no Retry-After on a {r[0]}: {r}"
    for r in by.get(503, []):
        assert r[3] == "queue_timeout", r
        # A 503 comes when queue_timeout_ms runs out, not later.
        assert r[1] < QUEUE_TIMEOUT_MS / 1000 + 3, r
    # Nothing beyond the worker's slots plus the slack was ever sent to it.
    assert 0 < peak["inflight"] <= SLOTS + SLACK, peak
    assert peak["active"] <= SLOTS, peak
    wait_until(lambda: cluster.workers()[0]["inflight"] == 0, 10, what="the worker idle again")
