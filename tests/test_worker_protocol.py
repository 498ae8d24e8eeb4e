"""The worker side of the gateway<->worker protocol, across a real process boundary.

The test plays the gateway: it binds a pyzmq ROUTER, starts the real
spillway-worker-cpu in --test-echo mode and speaks proto/spillway.proto to it.
There is no Python protobuf package in the venv, so a tiny protobuf wire
codec for our messages lives here (field numbers from proto/spillway.proto).
"""
import os
import random
import signal
import struct
import subprocess
import time

import pytest
import zmq

from conftest import Proc, bin_path, free_port, shared_file, wait_until

VERSION = 1
# Envelope body field numbers.
REGISTER, HEARTBEAT, GENERATE, CHUNK, CANCEL, ERROR, DISCONNECT = 2, 3, 4, 5, 6, 7, 8
KIND_NAMES = {REGISTER: "register", HEARTBEAT: "heartbeat", GENERATE: "generate", CHUNK: "chunk",
              CANCEL: "cancel", ERROR: "error", DISCONNECT: "disconnect"}
FINISH_NONE, FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED, FINISH_ERROR = range(5)
WORKER_KIND_CPU = 1


# ---- protobuf wire format (just what our schema uses) ----------------------

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(field, n):
    return varint(field << 3) + varint(n)


def f_bytes(field, data):
    if isinstance(data, str):
        data = data.encode()
    return varint((field << 3) | 2) + varint(len(data)) + data


def f_float(field, x):
    return varint((field << 3) | 5) + struct.pack("<f", x)


def read_varint(buf, i):
    """The varint at buf[i:] and the index just past it."""
    shift = n = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def parse(buf):
    """Generic protobuf parse: {field: [values]}; varints as int, length-delimited
    as bytes, fixed32 as raw bytes."""
    fields, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(buf, i)
        elif wt == 2:
            ln, i = read_varint(buf, i)
            v = bytes(buf[i:i + ln])
            i += ln
        elif wt == 5:
            v = bytes(buf[i:i + 4])
            i += 4
        elif wt == 1:
            v = bytes(buf[i:i + 8])
            i += 8
        else:
            raise ValueError(f"wire type {wt}")
        fields.setdefault(field, []).append(v)
    return fields


def one(fields, n, default=None):
    return fields.get(n, [default])[-1]


def packed_u32(fields, n):
    """A repeated uint32: packed (one bytes value) or not (several ints)."""
    out = []
    for v in fields.get(n, []):
        if isinstance(v, int):
            out.append(v)
            continue
        j = 0
        while j < len(v):
            x, j = read_varint(v, j)
            out.append(x)
    return out


def envelope(body_field, body, version=VERSION):
    return f_varint(1, version) + f_bytes(body_field, body)


def generate(request_id, model="echo-model", prompt="Once upon a time", max_tokens=8, **kw):
    body = f_bytes(1, request_id) + f_bytes(2, model)
    if prompt:
        body += f_bytes(3, prompt)
    body += f_varint(7, max_tokens)
    if "temperature" in kw:  # SamplingParams.temperature (float, field 1)
        body += f_bytes(6, f_float(1, kw["temperature"]))
    if kw.get("deadline_unix_ms"):
        body += f_varint(9, kw["deadline_unix_ms"])
    return envelope(GENERATE, body)


def cancel(request_id):
    return envelope(CANCEL, f_bytes(1, request_id))


def heartbeat():
    return envelope(HEARTBEAT, b"")


def decode(frame):
    """Envelope -> (kind name, dict of the body's fields)."""
    env = parse(frame)
    assert one(env, 1) == VERSION, f"version {one(env, 1)}"
    kinds = [k for k in KIND_NAMES if k in env]
    assert len(kinds) == 1, f"bodies {kinds}"
    k = kinds[0]
    b = parse(env[k][-1])
    s = lambda n: one(b, n, b"").decode()  # noqa: E731
    u = lambda n: one(b, n, 0)  # noqa: E731
    if k == REGISTER:
        models = [parse(m) for m in b.get(4, [])]
        d = dict(worker_id=s(1), pool=s(2), kind=u(3), slots=u(5),
                 models=[dict(name=one(m, 1, b"").decode(), quantization=one(m, 2, b"").decode(),
                              context_length=one(m, 3, 0)) for m in models])
    elif k == HEARTBEAT:
        kv = one(b, 3)
        d = dict(active=u(1), queued=u(2), kv_utilization=struct.unpack("<f", kv)[0] if kv else 0.0,
                 slots=u(4), batch_size=u(5), tokens_generated=u(6), draining=bool(u(20)))
    elif k == CHUNK:
        usage = parse(one(b, 5)) if 5 in b else None
        d = dict(request_id=s(1), text=s(2), token_ids=packed_u32(b, 3), finish=u(4),
                 usage=None if usage is None else dict(prompt_tokens=one(usage, 1, 0),
                                                       completion_tokens=one(usage, 2, 0),
                                                       cached_tokens=one(usage, 3, 0)))
    elif k == ERROR:
        d = dict(request_id=s(1), code=u(2), message=s(3))
    elif k == DISCONNECT:
        d = dict(reason=s(1))
    else:
        d = dict(fields=b)
    return KIND_NAMES[k], d


# ---- the fake gateway --------------------------------------------------------

class FakeGateway:
    """A ROUTER socket speaking the gateway's side. Heartbeats to the worker
    are sent from recv() (one thread owns the socket), unless silent."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = free_port()
        self.sock.bind(f"tcp://127.0.0.1:{self.port}")
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.peer = None
        self.silent = False
        self.last_hb = 0.0

    def send(self, frame, peer=None):
        self.sock.send_multipart([peer or self.peer, frame])

    def recv(self, timeout=5.0, want=None):
        """Next message (kind, body, t) from the worker, optionally of kind `want`
        (others are skipped); raises on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            if self.peer and not self.silent and now - self.last_hb >= 0.5:
                self.send(heartbeat())
                self.last_hb = now
            left = deadline - now
            if left <= 0:
                raise AssertionError(f"no {want or 'message'} from the worker within {timeout}s")
            if self.sock.poll(int(min(left, 0.1) * 1000) + 1):
                ident, frame = self.sock.recv_multipart()
                t = time.monotonic()
                kind, body = decode(frame)
                if kind == "register":
                    self.peer = ident
                self.last_ident = ident
                if want is None or kind == want:
                    return kind, body, t

    def close(self):
        self.sock.close()
        self.ctx.term()


@pytest.fixture
def gw():
    g = FakeGateway()
    yield g
    g.close()


def start_worker(tmp_path, gw, rate=100, parallel=4, extra=(), env=None):
    e = {"SPILLWAY_ALLOW_TEST_MODE": "1"}
    e.update(env or {})
    return Proc([bin_path("spillway-worker-cpu"), "--gateway", gw.endpoint, "--pool", "echo-pool",
                 "--model", "echo-model=/nonexistent/echo.gguf", "--test-echo", str(rate),
                 "--parallel", str(parallel), "--worker-id", "echo-w1", *extra],
                tmp_path / "worker.log", env=e)


@pytest.fixture
def worker_factory(tmp_path, gw):
    procs = []

    def make(**kw):
        p = start_worker(tmp_path, gw, **kw)
        procs.append(p)
        return p
    yield make
    # Every worker leaves cleanly on SIGTERM (under SANITIZE=1 this also
    # means no leak or sanitizer report, which would change the exit code).
    codes = [p.stop() for p in procs]
    assert codes == [0] * len(codes), "\n".join(p.output()[-3000:] for p in procs)


def collect_stream(gw, request_id, timeout=10.0):
    """Chunks of one request up to and including its final chunk."""
    chunks = []
    deadline = time.monotonic() + timeout
    while True:
        kind, body, t = gw.recv(deadline - time.monotonic())
        if kind == "error" and body["request_id"] == request_id:
            raise AssertionError(f"error for {request_id}: {body}")
        if kind == "chunk" and body["request_id"] == request_id:
            chunks.append((body, t))
            if body["finish"] != FINISH_NONE:
                return chunks


# ---- tests -------------------------------------------------------------------

def test_register_fields_and_heartbeats(gw, worker_factory):
    w = worker_factory(parallel=3, extra=["--quantization", "q4_k_m", "--ctx", "2048"])
    kind, reg, t0 = gw.recv(10, want="register")
    assert reg["worker_id"] == "echo-w1"
    assert reg["pool"] == "echo-pool"
    assert reg["kind"] == WORKER_KIND_CPU
    assert reg["slots"] == 3
    assert reg["models"] == [dict(name="echo-model", quantization="q4_k_m", context_length=2048)]
    times = []
    while len(times) < 3:
        kind, hb, t = gw.recv(3, want="heartbeat")
        assert hb["slots"] == 3 and hb["active"] == 0 and hb["queued"] == 0
        assert hb["kv_utilization"] == 0.0
        times.append(t)
    gaps = [b - a for a, b in zip([t0] + times, times)]
    # Every SW_HEARTBEAT_MS (1 s) while idle.
    assert all(0.7 < g < 1.5 for g in gaps), gaps
    assert w.alive()


def test_default_quantization_is_test(gw, worker_factory):
    worker_factory()
    _, reg, _ = gw.recv(10, want="register")
    assert reg["models"][0]["quantization"] == "test"


def test_generate_streams_max_tokens_chunks(gw, worker_factory):
    worker_factory(rate=100)
    gw.recv(10, want="register")
    t_send = time.monotonic()
    gw.send(generate("req-1", max_tokens=20, prompt="Once upon a time"))
    chunks = collect_stream(gw, "req-1")
    assert len(chunks) == 20
    for i, (c, _) in enumerate(chunks, 1):
        assert c["text"] == f" tok{i}"
        assert c["token_ids"] == [i]
    assert all(c["finish"] == FINISH_NONE and c["usage"] is None for c, _ in chunks[:-1])
    last = chunks[-1][0]
    assert last["finish"] == FINISH_LENGTH
    assert last["usage"] == dict(prompt_tokens=4, completion_tokens=20, cached_tokens=0)
    # Paced at 100 tokens/s: 20 tokens take about 0.2 s, not an instant burst.
    elapsed = chunks[-1][1] - t_send
    assert 0.15 < elapsed < 3.0, elapsed


def test_unknown_model_and_concurrency(gw, worker_factory):
    worker_factory(rate=20, parallel=2)
    gw.recv(10, want="register")
    gw.send(generate("bad-model", model="no-such-model"))
    kind, err, _ = gw.recv(5, want="error")
    assert err["request_id"] == "bad-model" and err["code"] == 404
    assert "no-such-model" in err["message"]
    # Three long requests on two slots: 2 active, 1 queued, reported promptly.
    for i in range(3):
        gw.send(generate(f"c{i}", max_tokens=1000))
    deadline = time.monotonic() + 3
    while True:
        _, hb, _ = gw.recv(deadline - time.monotonic(), want="heartbeat")
        if hb["active"] == 2 and hb["queued"] == 1:
            break
    assert hb["kv_utilization"] == pytest.approx(1.0)


def test_cancel_stops_stream_and_frees_slot_fast(gw, worker_factory):
    worker_factory(rate=20)
    gw.recv(10, want="register")
    gw.send(generate("long-1", max_tokens=100000))
    seen = 0
    while seen < 2:
        kind, c, _ = gw.recv(5, want="chunk")
        seen += c["request_id"] == "long-1"
    deadline = time.monotonic() + 2
    while True:  # the load shows the running request
        _, hb, _ = gw.recv(deadline - time.monotonic(), want="heartbeat")
        if hb["active"] == 1:
            break
    t_cancel = time.monotonic()
    gw.send(cancel("long-1"))
    got_final = got_idle = None
    while got_final is None or got_idle is None:
        kind, body, t = gw.recv(2)
        if kind == "chunk":
            assert body["request_id"] == "long-1"
            if body["finish"] != FINISH_NONE:
                assert body["finish"] == FINISH_CANCELLED
                assert body["usage"]["completion_tokens"] >= 2
                got_final = t
        elif kind == "heartbeat" and body["active"] == 0 and body["queued"] == 0:
            got_idle = t
    # The slot is free, and the gateway hears so, within 200 ms.
    assert got_idle - t_cancel < 0.2, got_idle - t_cancel
    # Nothing more for the cancelled request; a second cancel is a no-op.
    gw.send(cancel("long-1"))
    end = time.monotonic() + 0.4
    while time.monotonic() < end:
        try:
            kind, body, _ = gw.recv(end - time.monotonic())
        except AssertionError:
            break
        assert kind != "chunk" and kind != "error", (kind, body)


def test_garbage_frames_do_not_kill_the_worker(gw, worker_factory):
    w = worker_factory(rate=200)
    gw.recv(10, want="register")
    rng = random.Random(1234)
    bad = [b"", b"\x00", b"\xff" * 64, envelope(CANCEL, f_bytes(1, "x"), version=2),
           f_varint(1, VERSION),                                     # no body
           envelope(GENERATE, f_bytes(1, "g1") + f_bytes(2, "echo-model")),  # no prompt
           envelope(GENERATE, f_bytes(1, "g2") + f_bytes(2, "echo-model") + f_bytes(3, "x")
                    + f_varint(7, 1 << 21)),                          # max_tokens too large
           envelope(GENERATE, f_bytes(1, "bad id") + f_bytes(2, "echo-model")),  # unusable id
           envelope(CHUNK, f_bytes(1, "x") + f_bytes(2, "hi")),        # wrong direction
           generate("trunc", max_tokens=3)[:-3]]
    bad += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) for _ in range(200)]
    for frame in bad:
        gw.send(frame)
    gw.sock.send_multipart([gw.peer, b"", b"junk", b"more junk"])  # multi-frame junk
    # Invalid requests that still name a usable request id get a 400 at once.
    errors = {}
    while len(errors) < 2:
        _, e, _ = gw.recv(5, want="error")
        errors[e["request_id"]] = e
    assert set(errors) == {"g1", "g2"}
    assert errors["g1"]["code"] == 400 and "no prompt" in errors["g1"]["message"]
    assert errors["g2"]["code"] == 400 and "max_tokens" in errors["g2"]["message"]
    gw.send(generate("after-garbage", max_tokens=5))
    chunks = collect_stream(gw, "after-garbage")
    assert [c["text"] for c, _ in chunks] == [f" tok{i}" for i in range(1, 6)]
    assert w.alive()
    log = w.output()
    assert "dropped invalid frame from gateway: protocol version 2, expected 1" in log
    assert "ignored unexpected chunk message from gateway" in log
    # A flood is rate-limited in the log (10 lines a second), and counted.
    assert log.count("dropped invalid frame") <= 10
    wait_until(lambda: "more invalid frames not logged" in w.output(), 3, what="suppressed count")


def test_silent_gateway_makes_worker_reregister(gw, worker_factory):
    w = worker_factory(rate=5)
    gw.silent = True
    _, reg1, t1 = gw.recv(10, want="register")
    first_peer = gw.last_ident
    gw.send(generate("orphan", max_tokens=1000))  # in flight when the link is lost
    _, reg2, t2 = gw.recv(8, want="register")
    # 3 silent heartbeat intervals, then the first backoff step (250 ms).
    assert 2.7 < t2 - t1 < 5.0, t2 - t1
    assert reg2 == reg1
    assert gw.last_ident != first_peer  # a fresh socket
    assert "reconnecting" in w.output()
    # The new session works, and the old session's request was dropped.
    gw.silent = False
    gw.send(generate("fresh", max_tokens=3))
    for c, _ in collect_stream(gw, "fresh"):
        assert c["request_id"] == "fresh"
    _, hb, _ = gw.recv(3, want="heartbeat")
    assert hb["active"] == 0 and hb["queued"] == 0


def test_disconnect_from_gateway_makes_worker_register_again(gw, worker_factory):
    """A restarted gateway answers an unknown worker's heartbeat with
    Disconnect: the worker registers again on the same connection at once
    and drops the requests of the gateway's previous life. Nothing of them
    follows the new Register: not a chunk of the four fast streams that were
    running (a burst of those got workers dropped by a real gateway as
    protocol breakers), and not their load in the next heartbeat."""
    w = worker_factory(rate=2000)
    _, reg1, _ = gw.recv(10, want="register")
    first_peer = gw.last_ident
    old = [f"old-life-{i}" for i in range(4)]
    for rid in old:
        gw.send(generate(rid, max_tokens=100000))
    wait_until(lambda: gw.recv(2, want="heartbeat")[1]["active"] == 4, 5, what="4 old streams running")
    gw.send(envelope(DISCONNECT, f_bytes(1, "unknown worker: register again")))
    _, reg2, _ = gw.recv(2, want="register")
    assert reg2 == reg1
    assert gw.last_ident == first_peer   # same socket, no reconnect
    assert "registering again" in w.output()
    heartbeats, deadline = [], time.monotonic() + 1.5
    while time.monotonic() < deadline:
        kind, body, _ = gw.recv(2)
        assert body.get("request_id") not in old, (kind, body)
        if kind == "heartbeat":
            heartbeats.append(body)
    assert heartbeats and heartbeats[0]["active"] == 0, heartbeats[:3]
    gw.send(generate("new-life", max_tokens=3))
    for c, _ in collect_stream(gw, "new-life"):
        assert c["request_id"] == "new-life"


def test_sigterm_drains_finishes_refuses_new_then_exits_0(gw, worker_factory):
    """SIGTERM: a heartbeat saying draining comes at once (not at the next
    interval); a request sent after it is refused with the retryable 429;
    the one in hand finishes normally; then Disconnect, and exit 0."""
    w = worker_factory(rate=50)
    gw.recv(10, want="register")
    gw.send(generate("inflight", max_tokens=40))   # 0.8 s at 50 tokens/s
    gw.recv(5, want="chunk")
    t0 = time.monotonic()
    w.p.send_signal(signal.SIGTERM)
    wait_until(lambda: gw.recv(2, want="heartbeat")[1]["draining"], 3, interval=0,
               what="a draining heartbeat")
    assert time.monotonic() - t0 < 0.5, "the drain was not announced at once"
    gw.send(generate("late", max_tokens=3))
    seen = {}
    while "disconnect" not in seen:
        kind, body, _ = gw.recv(5)
        if kind == "error":
            assert body["request_id"] == "late" and body["code"] == 429, body
            seen["refused"] = True
        if kind == "chunk" and body["request_id"] == "inflight" and body["finish"] != FINISH_NONE:
            assert body["finish"] == FINISH_LENGTH and body["usage"]["completion_tokens"] == 40, body
            seen["finished"] = True
        if kind == "disconnect":
            assert body["reason"].startswith("drained"), body
            seen["disconnect"] = True
    assert seen == {"refused": True, "finished": True, "disconnect": True}, seen
    assert w.p.wait(5) == 0
    assert "held at most 1 requests" in w.output()


def test_second_sigterm_or_drain_timeout_stops_sooner(gw, worker_factory):
    """A request that would run for minutes: a second SIGTERM ends it with a
    503 (the gateway retries that) and the worker exits 0 at once; so does
    --drain-timeout."""
    w = worker_factory(rate=20)
    gw.recv(10, want="register")
    gw.send(generate("long", max_tokens=100000))
    gw.recv(5, want="chunk")
    w.p.send_signal(signal.SIGTERM)
    wait_until(lambda: gw.recv(2, want="heartbeat")[1]["draining"], 3, interval=0, what="draining")
    time.sleep(0.3)
    assert w.alive(), "the first SIGTERM must drain, not stop"
    w.p.send_signal(signal.SIGTERM)
    kind, err, _ = gw.recv(5, want="error")
    assert err["request_id"] == "long" and err["code"] == 503
    assert gw.recv(5, want="disconnect")[1]["reason"].startswith("drained")
    assert w.p.wait(5) == 0
    w2 = worker_factory(rate=20, extra=("--drain-timeout", "1", "--worker-id", "echo-w2"))
    gw.recv(10, want="register")
    gw.send(generate("long2", max_tokens=100000))
    gw.recv(5, want="chunk")
    t0 = time.monotonic()
    w2.p.send_signal(signal.SIGTERM)
    kind, err, _ = gw.recv(5, want="error")
    assert err["request_id"] == "long2" and err["code"] == 503
    assert w2.p.wait(5) == 0 and 0.8 < time.monotonic() - t0 < 3


def test_worker_refuses_past_slots_plus_its_queue(gw, worker_factory):
    """slots + SW_WORKER_QUEUE_MAX (2) requests are held; the next is refused
    with 429 whoever sent it, and taken again once one ends."""
    w = worker_factory(rate=20, parallel=2)
    gw.recv(10, want="register")
    for i in range(5):
        gw.send(generate(f"r{i}", max_tokens=100000))
    kind, err, _ = gw.recv(5, want="error")
    assert err["request_id"] == "r4" and err["code"] == 429 and "full" in err["message"], err
    wait_until(lambda: (lambda hb: hb["active"] + hb["queued"] == 4)(gw.recv(2, want="heartbeat")[1]), 5,
               interval=0, what="4 held")
    for i in range(3):   # room again: r3 and r5 run
        gw.send(cancel(f"r{i}"))
    gw.send(generate("r5", max_tokens=2))
    got = [c for c, _ in collect_stream(gw, "r5")]
    assert got[-1]["finish"] == FINISH_LENGTH
    w.stop()
    assert "held at most 4 requests at once (2 slots + 2 queued); refused 1 when full" in w.output()


def test_worker_serves_two_gateways_and_tells_each_the_whole_load(tmp_path):
    """--gateway twice: it registers with both, each request's answer goes to
    the gateway that sent it, each heartbeat counts both gateways' requests,
    and one gateway's requests past the worker's capacity are refused."""
    a, b = FakeGateway(), FakeGateway()
    try:
        w = Proc([bin_path("spillway-worker-cpu"), "--gateway", a.endpoint, "--gateway", b.endpoint,
                  "--pool", "echo-pool", "--model", "echo-model=/x", "--test-echo", "20", "--parallel", "2",
                  "--worker-id", "shared"], tmp_path / "w.log", env={"SPILLWAY_ALLOW_TEST_MODE": "1"})
        assert a.recv(10, want="register")[1]["worker_id"] == "shared"
        assert b.recv(10, want="register")[1]["worker_id"] == "shared"
        a.send(generate("same-id", max_tokens=100000))
        a.send(generate("a2", max_tokens=100000))
        a.recv(5, want="chunk")
        b.send(generate("b1", max_tokens=100000))
        b.send(generate("same-id", max_tokens=3))   # another gateway's request with a live id
        kind, err, _ = b.recv(5, want="error")
        assert err["request_id"] == "same-id" and err["code"] == 503, err
        wait_until(lambda: (lambda hb: hb["active"] + hb["queued"] == 3)(a.recv(2, want="heartbeat")[1]), 5,
                   interval=0, what="gateway a told of b's request too")
        b.send(generate("b2", max_tokens=100000))   # 4 held: full
        b.send(generate("b3", max_tokens=3))
        kind, err, _ = b.recv(5, want="error")
        assert err["request_id"] == "b3" and err["code"] == 429, err
        kind, c, _ = b.recv(5, want="chunk")
        assert c["request_id"] in ("b1", "b2"), c   # b gets only its own chunks
        for _ in range(20):
            kind, c, _ = a.recv(5, want="chunk")
            assert c["request_id"] in ("same-id", "a2"), c
        assert w.stop() == 0
    finally:
        a.close()
        b.close()


def test_sigint_with_dead_gateway_still_exits_promptly(tmp_path):
    # No gateway at all: the Disconnect cannot be delivered; linger is bounded.
    port = free_port()
    p = Proc([bin_path("spillway-worker-cpu"), "--gateway", f"tcp://127.0.0.1:{port}", "--pool", "p",
              "--model", "m=/x", "--test-echo", "10"], tmp_path / "w.log",
             env={"SPILLWAY_ALLOW_TEST_MODE": "1"})
    time.sleep(0.5)
    t = time.monotonic()
    p.p.send_signal(signal.SIGINT)
    assert p.p.wait(5) == 0
    assert time.monotonic() - t < 2.0
    p.stop()


def test_test_echo_is_refused_without_the_env_switch(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SPILLWAY_ALLOW_TEST_MODE"}
    for value in (None, "0", "yes"):
        if value is not None:
            env["SPILLWAY_ALLOW_TEST_MODE"] = value
        r = subprocess.run([bin_path("spillway-worker-cpu"), "--gateway", "tcp://127.0.0.1:5555",
                            "--pool", "p", "--model", "m=/x", "--test-echo", "100"],
                           capture_output=True, text=True, timeout=10, env=env)
        assert r.returncode != 0
        assert "SPILLWAY_ALLOW_TEST_MODE=1" in r.stderr, r.stderr


BASE = ["--gateway", "tcp://127.0.0.1:5555", "--pool", "p", "--model", "m=/x"]


@pytest.mark.parametrize("args,needle", [
    ([], "--gateway is required"),
    (["--pool", "p", "--model", "m=/x"], "--gateway is required"),
    (["--gateway", "tcp://127.0.0.1:5555", "--model", "m=/x"], "--pool is required"),
    (["--gateway", "tcp://127.0.0.1:5555", "--pool", "p"], "--model NAME=PATH is required"),
    (["--gateway", "http://127.0.0.1:5555", "--pool", "p", "--model", "m=/x"], "--gateway"),
    (["--gateway", "tcp://127.0.0.1", "--pool", "p", "--model", "m=/x"], "--gateway"),
    (BASE + ["--bogus", "1"], "unknown option '--bogus'"),
    (BASE + ["--threads"], "--threads needs a value"),
    (BASE + ["--threads", "0"], "--threads"),
    (BASE + ["--threads", "4x"], "--threads"),
    (BASE + ["--parallel", "-1"], "--parallel"),
    (BASE + ["--ctx", "99999999"], "--ctx"),
    (BASE + ["--test-echo", "-5"], "--test-echo"),
    (BASE + ["--test-echo", "nan"], "--test-echo"),
    (BASE + ["--worker-id", "has space"], "--worker-id"),
    (BASE + ["--quantization", ""], "--quantization"),
    (BASE + ["--prefix-cache", "maybe"], "--prefix-cache"),
    (BASE + ["--cache-slots", "0"], "--cache-slots"),
    (BASE + ["--kv-cache", "q4_0"], "--kv-cache: 'q4_0' is not f16 or q8_0"),
    (BASE + ["--model", "m2=/y"], "--model given twice"),
    (["--gateway", "tcp://127.0.0.1:5555", "--pool", "p", "--model", "noequals"], "NAME=PATH"),
    (["--gateway", "tcp://127.0.0.1:5555", "--pool", "p", "--model", "=/x"], "NAME=PATH"),
    (["--gateway", "tcp://127.0.0.1:5555", "--pool", "bad pool", "--model", "m=/x"], "--pool"),
    (BASE + ["stray"], "unexpected argument 'stray'"),
])
def test_bad_flags_exit_2(args, needle):
    r = subprocess.run([bin_path("spillway-worker-cpu"), *args], capture_output=True, text=True,
                       timeout=10, env=dict(os.environ, SPILLWAY_ALLOW_TEST_MODE="1"))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in r.stderr, r.stderr


def test_missing_model_file_fails_clearly(tmp_path):
    r = subprocess.run([bin_path("spillway-worker-cpu"), "--gateway", "tcp://127.0.0.1:5555",
                        "--pool", "p", "--model", f"m={tmp_path}/missing.gguf"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    assert "cannot load" in r.stderr and "missing.gguf" in r.stderr


def test_q8_0_kv_cache_serves_and_reuses_prefixes(gw, tmp_path):
    """--kv-cache q8_0 on a model whose head size allows it (64): the worker
    says so when it starts, serves, and a repeated prompt takes its KV from
    the prefix cache (int8 elements and their scales) and gives the same
    greedy text. A model whose head size does not allow it (stories260K's
    8) is refused at start, with the reason."""
    model = shared_file("golden/synth-gpt2-d512-q4km.gguf")
    # One thread, as the other model-serving tests: under TSan (halt_on_error)
    # libgomp's fork/join, which it cannot see, reads as a race in the packing.
    w = Proc([bin_path("spillway-worker-cpu"), "--gateway", gw.endpoint, "--pool", "cpu-pool",
              "--model", f"g={model}", "--threads", "1", "--parallel", "1", "--kv-cache", "q8_0",
              "--worker-id", "cpu-q8"], tmp_path / "worker.log")
    try:
        gw.recv(30, want="register")
        texts = []
        for rid in ("first", "again"):
            gw.send(generate(rid, model="g", prompt="The quick brown fox jumps over the lazy dog",
                             max_tokens=16, temperature=0.0))
            chunks = collect_stream(gw, rid, timeout=60)
            texts.append("".join(c["text"] for c, _ in chunks))
            usage = chunks[-1][0]["usage"]
        print(f"q8_0 cache: {texts[0]!r}, again {usage}")
        assert usage["cached_tokens"] == usage["prompt_tokens"] - 1, usage
        assert texts[0] and texts[1] == texts[0], texts
    finally:
        assert w.stop() == 0, w.output()[-3000:]
    assert "q8_0 KV cache" in w.output(), w.output()[-2000:]
    r = subprocess.run([bin_path("spillway-worker-cpu"), *BASE[:4], "--model",
                        f"s={shared_file('models/stories260K.gguf')}", "--kv-cache", "q8_0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    assert "--kv-cache q8_0" in r.stderr and "multiple of 32 (this model's is 8)" in r.stderr, r.stderr


def test_real_model_greedy_stream_and_cancel(gw, tmp_path):
    """The normal mode: the real CPU engine on stories260K, driven by the same
    fake gateway. Greedy output must be the model's published text."""
    model = shared_file("models/stories260K.gguf")
    expected = shared_file("models/stories260K.greedy.txt").read_text().rstrip()
    w = Proc([bin_path("spillway-worker-cpu"), "--gateway", gw.endpoint, "--pool", "cpu-pool",
              "--model", f"stories260K={model}", "--threads", "1", "--parallel", "2",
              "--worker-id", "cpu-w1"], tmp_path / "worker.log")
    try:
        _, reg, _ = gw.recv(30, want="register")
        # context_length: the GGUF's llama.context_length (2048 in this file).
        assert reg["models"] == [dict(name="stories260K", quantization="f32", context_length=2048)]
        assert reg["slots"] == 2 and reg["kind"] == WORKER_KIND_CPU
        gw.send(generate("greedy", model="stories260K", prompt="Once upon a time",
                         max_tokens=252, temperature=0.0))
        chunks = collect_stream(gw, "greedy", timeout=120)
        text = "".join(c["text"] for c, _ in chunks)
        assert ("Once upon a time" + text).rstrip() == expected
        last = chunks[-1][0]
        assert last["finish"] == FINISH_LENGTH
        assert last["usage"] == dict(prompt_tokens=5, completion_tokens=252, cached_tokens=0)
        # The same prompt again: its KV comes from the prefix cache, all but
        # the last token, and the text is the same.
        gw.send(generate("again", model="stories260K", prompt="Once upon a time",
                         max_tokens=252, temperature=0.0))
        chunks = collect_stream(gw, "again", timeout=120)
        assert ("Once upon a time" + "".join(c["text"] for c, _ in chunks)).rstrip() == expected
        assert chunks[-1][0]["usage"] == dict(prompt_tokens=5, completion_tokens=252, cached_tokens=4)
        # Cancel a long generation: the CPU engine frees the slot too.
        gw.send(generate("long", model="stories260K", prompt="Once upon a time",
                         max_tokens=100000, temperature=1.0))
        gw.recv(10, want="chunk")
        gw.send(cancel("long"))
        while True:
            kind, body, _ = gw.recv(5)
            if kind == "chunk" and body["finish"] != FINISH_NONE:
                assert body["finish"] in (FINISH_CANCELLED, FINISH_LENGTH)
                break
        deadline = time.monotonic() + 2
        while True:
            _, hb, _ = gw.recv(deadline - time.monotonic(), want="heartbeat")
            if hb["active"] == 0 and hb["queued"] == 0:
                break
    finally:
        assert w.stop() == 0, w.output()[-3000:]
