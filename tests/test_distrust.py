"""The gateway distrusts its workers (issue 21, item 5): a hostile worker,
written here in pyzmq as an attacker, cannot push more than max_tokens to a
client, cannot claim unbounded slots, and is dropped for garbage frames or
frames for requests it was never given, while a real test-mode worker
carries on serving."""
import json
import threading
import time
import urllib.error
import urllib.request

import zmq

from conftest import http_get, wait_until
from test_worker_protocol import (CHUNK, FINISH_LENGTH, FINISH_NONE, HEARTBEAT, REGISTER, decode, envelope,
                                  f_bytes, f_varint, varint)

POLICY = """\
pools:
  - name: cpu-pool
    kind: cpu
routes:
  - model: echo
    target: cpu-pool
"""


def metric(cluster, name, **labels):
    want = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    for line in http_get(cluster.base + "/metrics")[1].decode().splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


def register(worker_id, slots=4):
    return envelope(REGISTER, f_bytes(1, worker_id) + f_bytes(2, "cpu-pool") + f_varint(3, 1)
                    + f_bytes(4, f_bytes(1, "echo") + f_bytes(2, "test") + f_varint(3, 4096)) + f_varint(5, slots))


def chunk(request_id, text, token_id, finish=FINISH_NONE):
    body = f_bytes(1, request_id) + f_bytes(2, text) + f_bytes(3, varint(token_id))
    if finish:
        body += f_varint(4, finish)
    return envelope(CHUNK, body)


class Hostile:
    """A DEALER that registers as a worker and does what a test tells it."""

    def __init__(self, cluster, worker_id, slots=4):
        self.ctx = zmq.Context()
        self.s = self.ctx.socket(zmq.DEALER)
        self.s.linger = 0
        self.s.connect(cluster.worker_ep)
        self.s.send(register(worker_id, slots))
        self.got = []

    def pump(self, seconds, on_generate=None, until=None):
        """Receives for `seconds` (or until until() is true), heartbeating;
        on_generate(request_id) for each Generate."""
        end, last_hb = time.monotonic() + seconds, 0
        while time.monotonic() < end and not (until and until()):
            if time.monotonic() - last_hb > 0.3:
                self.s.send(envelope(HEARTBEAT, b""))
                last_hb = time.monotonic()
            if self.s.poll(50):
                kind, d = decode(self.s.recv())
                self.got.append((kind, d))
                if kind == "generate" and on_generate:
                    on_generate(d["fields"][1][-1].decode())

    def close(self):
        self.s.close()
        self.ctx.term()


def post(cluster, body, timeout=30):
    req = urllib.request.Request(cluster.base + "/v1/completions", method="POST", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def flood_run(cluster, stream, text=lambda i: f" tok{i}"):
    """A request for max_tokens 2 served by a worker that sends 200 tokens
    (each token's text from text(i))."""
    w = Hostile(cluster, "flooder")
    cluster.wait_workers(1)
    out = {}
    t = threading.Thread(target=lambda: out.update(r=post(cluster, {"model": "echo", "prompt": "hi",
                                                                    "max_tokens": 2, "stream": stream})))
    t.start()

    def flood(rid):
        for i in range(1, 201):
            if i == 3 and stream:
                time.sleep(0.5)   # the first tokens reach the client: the rest is cut off in-band
            w.s.send(chunk(rid, text(i), i, FINISH_LENGTH if i == 200 else FINISH_NONE))
    w.pump(10, flood, until=lambda: not t.is_alive())
    w.pump(0.2)   # the Cancel
    t.join(20)
    w.close()
    return out["r"], w.got


def test_a_worker_cannot_send_more_than_max_tokens(cluster):
    cluster.start_gateway(POLICY, extra_args=["--sdk", "none"])
    (st, body), got = flood_run(cluster, stream=False)
    assert st == 502 and "worker_exceeded_limits" in body and " tok1" not in body, body
    assert any(k == "cancel" for k, _ in got), got
    assert metric(cluster, "spillway_worker_violations_total", reason="over_max_tokens") == 1


def test_a_stream_stops_at_max_tokens_with_an_error(cluster):
    cluster.start_gateway(POLICY, extra_args=["--sdk", "none"])
    (st, body), _ = flood_run(cluster, stream=True)
    assert st == 200, body   # the stream began: the error is in-band, after max_tokens tokens
    assert body.count(" tok") == 2 and " tok3" not in body, body
    assert "worker_exceeded_limits" in body and "[DONE]" not in body.split("worker_exceeded_limits")[0], body
    assert metric(cluster, "spillway_worker_violations_total", reason="over_max_tokens") == 1


def test_an_oversized_chunk_cuts_the_response_off(cluster):
    cluster.start_gateway(POLICY, extra_args=["--sdk", "none"])
    (st, body), _ = flood_run(cluster, stream=False, text=lambda i: "x" * (1 << 20) + f" tok{i}")
    assert st == 502 and "worker_exceeded_limits" in body and "xxxx" not in body, body[:300]
    assert metric(cluster, "spillway_worker_violations_total", reason="oversize") == 1


def test_claimed_slots_are_clamped(cluster):
    cluster.start_gateway(POLICY, extra_args=["--sdk", "none"])
    # the wire refuses a Register past 65536 slots outright; below that the
    # broker clamps what it counts, at registration and in every heartbeat
    refused = Hostile(cluster, "absurd", slots=2**32 - 1)
    refused.pump(0.5)
    assert cluster.workers() == []
    refused.close()
    w = Hostile(cluster, "greedy", slots=60000)
    cluster.wait_workers(1)
    assert cluster.workers()[0]["slots"] == 4096
    w.s.send(envelope(HEARTBEAT, f_varint(4, 2**32 - 1)))
    w.pump(0.5)
    assert cluster.workers()[0]["slots"] == 4096
    assert metric(cluster, "spillway_worker_violations_total", reason="too_many_slots") == 2
    w.close()


def test_garbage_and_stray_frames_disconnect_the_sender_only(cluster):
    cluster.start_gateway(POLICY, extra_args=["--sdk", "none"])
    cluster.start_echo("cpu-pool", 200, ["--worker-id", "honest"], name="honest")
    cluster.wait_workers(1)
    garbage = Hostile(cluster, "garbage")
    stray = Hostile(cluster, "stray")
    cluster.wait_workers(3)
    for _ in range(50):
        garbage.s.send(b"\xff\xfe not a protobuf \x00\x01")
    for i in range(20):
        stray.s.send(chunk(f"never-given-{i}", "x", 1))
    wait_until(lambda: [w["id"] for w in cluster.workers()] == ["honest"], 10, what="only the honest worker left")
    assert metric(cluster, "spillway_worker_violations_total", reason="invalid_frame") >= 1
    assert metric(cluster, "spillway_worker_violations_total", reason="unknown_request") >= 8
    st, body = post(cluster, {"model": "echo", "prompt": "hi", "max_tokens": 4})
    assert st == 200 and json.loads(body)["usage"]["completion_tokens"] == 4, body
    log = cluster.gateway.output()
    assert log.count("dropped an invalid frame") <= 3, log   # rate-limited, not 50 lines
    garbage.close()
    stray.close()


def test_wrong_frame_count_disconnects_the_sender_only(cluster):
    """A registered worker that sends [a][b] (two frames where the protocol
    has one) is dropped as for garbage; the honest worker keeps serving."""
    cluster.start_gateway(POLICY, extra_args=["--sdk", "none"])
    cluster.start_echo("cpu-pool", 200, ["--worker-id", "honest"], name="honest")
    cluster.wait_workers(1)
    multi = Hostile(cluster, "multi")
    cluster.wait_workers(2)
    for _ in range(20):
        multi.s.send_multipart([envelope(HEARTBEAT, b""), b"extra"])
    wait_until(lambda: [w["id"] for w in cluster.workers()] == ["honest"], 10, what="only the honest worker left")
    assert metric(cluster, "spillway_worker_violations_total", reason="invalid_frame") >= 1
    st, body = post(cluster, {"model": "echo", "prompt": "hi", "max_tokens": 4})
    assert st == 200 and json.loads(body)["usage"]["completion_tokens"] == 4, body
    log = cluster.gateway.output()
    assert "wrong frame count" in log and log.count("dropped a message with 2 frames") <= 3, log
    multi.close()
