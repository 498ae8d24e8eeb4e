"""Hot reload of the routing policy under continuous load, through every
trigger: POST /admin/reload, SIGHUP and a change of the file. Every request
completes, the new policy takes effect, and a bad file keeps the old policy.
"""
import json
import signal
import threading
import time

from conftest import TWO_POOLS, http_get, http_post, wait_until

TO_GPU = TWO_POOLS + """\
routes:
  - model: "echo"
    target: gpu-pool
"""
TO_CPU = TO_GPU.replace("target: gpu-pool", "target: cpu-pool")
BROKEN = TO_CPU + "  - model: \"echo\"\n    target: gpu-pool\n    max_concurrency: lots\n"


def policy(cluster):
    return json.loads(cluster.admin_get("/admin/policy")[1])


def served_by(cluster):
    st, hdr, _ = http_post(cluster.base + "/v1/completions", {"model": "echo", "prompt": "x", "max_tokens": 1})
    assert st == 200
    return hdr["X-Spillway-Pool"]


class Load(threading.Thread):
    """Requests back to back (streaming and not) until stopped."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster, self.stop, self.results = cluster, threading.Event(), []

    def run(self):
        i = 0
        while not self.stop.is_set():
            stream = i % 2 == 0
            st, _, body = http_post(self.cluster.base + "/v1/completions",
                                    {"model": "echo", "prompt": "x", "max_tokens": 10, "stream": stream},
                                    timeout=30)
            ok = st == 200 and (b"[DONE]" in body if stream else json.loads(body)["usage"]["completion_tokens"] == 10)
            self.results.append((st, ok))
            i += 1


def test_reload_under_load(cluster):
    cluster.start_gateway(TO_GPU)
    cluster.start_echo("gpu-pool", 200, name="g")
    cluster.start_echo("cpu-pool", 200, name="c")
    cluster.wait_workers(2)
    v1 = policy(cluster)["version"]
    assert served_by(cluster) == "gpu-pool"

    loads = [Load(cluster) for _ in range(3)]
    for l in loads:
        l.start()
    time.sleep(0.3)

    # 1. POST /admin/reload
    cluster.config_path.write_text(TO_CPU)
    st, _, body = cluster.admin_post("/admin/reload")
    assert st == 200, body
    assert json.loads(body)["version"] > v1
    assert served_by(cluster) == "cpu-pool"
    p = policy(cluster)
    assert "cpu-pool" in p["source"] and p["version"] > v1
    v2 = p["version"]

    # 2. A bad file: rejected with file:line:column, the old policy stays.
    cluster.config_path.write_text(BROKEN)
    st, _, body = cluster.admin_post("/admin/reload")
    assert st == 400
    msg = json.loads(body)["error"]["message"]
    assert "routes.yaml:11:" in msg, msg
    assert policy(cluster)["version"] == v2
    assert served_by(cluster) == "cpu-pool"

    # 3. SIGHUP
    cluster.config_path.write_text(TO_GPU)
    cluster.gateway.p.send_signal(signal.SIGHUP)
    wait_until(lambda: policy(cluster)["version"] > v2, 5, what="SIGHUP reload")
    assert served_by(cluster) == "gpu-pool"
    v3 = policy(cluster)["version"]

    # 4. The file changing on disk is noticed by itself.
    time.sleep(0.05)
    cluster.config_path.write_text(TO_CPU)
    wait_until(lambda: policy(cluster)["version"] > v3, 5, what="reload on file change")
    assert served_by(cluster) == "cpu-pool"

    time.sleep(0.3)
    for l in loads:
        l.stop.set()
    for l in loads:
        l.join(30)
    results = [r for l in loads for r in l.results]
    assert len(results) > 20
    assert all(ok for _, ok in results), [r for r in results if not r[1]][:5]
    assert cluster.gateway.alive()
