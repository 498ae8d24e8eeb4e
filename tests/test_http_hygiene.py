"""HTTP hygiene against the real gateway, over raw sockets (RFC 9112): bodies
framed two ways or in a coding we do not speak are refused with 400 and the
connection closed, so nothing smuggled after them runs; pipelined requests
are answered in order; one client's connection flood does not lock others out
of /healthz; a client that sends nothing is closed after the idle timeout.
"""
import json
import os
import resource
import socket
import time

import pytest

from conftest import SANITIZED, TWO_POOLS, http_get

POLICY = TWO_POOLS + """\
routes:
  - model: "echo"
    target: gpu-pool
"""
IDLE_S = 2   # the gateway's idle timeout in these tests (SPILLWAY_HTTP_IDLE_TIMEOUT_S)


@pytest.fixture
def gw(cluster, monkeypatch):
    monkeypatch.setenv("SPILLWAY_HTTP_IDLE_TIMEOUT_S", str(IDLE_S))   # inherited by the gateway
    cluster.start_gateway(POLICY)
    return cluster


def connect(cluster, source="127.0.0.1", timeout=5):
    s = socket.socket()
    s.settimeout(timeout)
    s.bind((source, 0))
    s.connect(("127.0.0.1", cluster.http_port))
    return s


def read_all(s, deadline_s=5):
    """Everything the server sends until it closes (or the deadline passes:
    then the second value is False)."""
    data, end = b"", time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def responses(data):
    """The status lines in a byte stream of responses."""
    return [l for l in data.split(b"\r\n") if l.startswith(b"HTTP/1.")]


def assert_framing_400(data, closed, param):
    assert closed, f"connection left open after a bad framing: {data!r}"
    assert len(responses(data)) == 1, data
    assert responses(data)[0].startswith(b"HTTP/1.1 400"), data
    body = json.loads(data.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["param"] == param and body["error"]["type"] == "invalid_request_error"
    assert b"connection: close" in data.lower()


SMUGGLED = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def test_cl_and_te_is_400_and_smuggled_request_never_runs(gw):
    body = b"0\r\n\r\n" + SMUGGLED
    s = connect(gw)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(body) + body)
    data, closed = read_all(s)
    assert_framing_400(data, closed, "Transfer-Encoding")
    assert b'"status":"ok"' not in data


def test_conflicting_content_lengths_are_400(gw):
    s = connect(gw)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n{}"
              + SMUGGLED)
    data, closed = read_all(s)
    assert_framing_400(data, closed, "Content-Length")


def test_repeated_equal_content_length_is_fine(gw):
    s = connect(gw)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
              b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}")
    data, _ = read_all(s)
    assert responses(data)[0].startswith(b"HTTP/1.1 400"), data   # the body's error, not the framing's
    assert b"bad_framing" not in data


@pytest.mark.parametrize("te", [b"gzip", b"gzip, chunked", b"identity", b"chunked, chunked"])
def test_unknown_transfer_coding_is_400_at_once(gw, te):
    s = connect(gw)
    t0 = time.monotonic()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + te + b"\r\n\r\n")
    data, closed = read_all(s, 3)
    assert time.monotonic() - t0 < IDLE_S, "answered by the timeout, not the framing check"
    assert_framing_400(data, closed, "Transfer-Encoding")


def test_pipelined_requests_answered_in_order_or_closed_cleanly(gw):
    """libmicrohttpd answers the first and may then close (Connection: close)
    rather than read on: whatever is answered comes in order, and the
    connection ends with a close, not a hang."""
    s = connect(gw)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
              b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
              b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data, closed = read_all(s)
    assert closed
    got = [l.split()[1] for l in responses(data)]
    assert got and got == [b"200", b"404", b"200"][:len(got)], data
    marks = [b'"status":"ok"', b"no such endpoint", b'"object":"list"'][:len(got)]
    assert [data.index(m) for m in marks] == sorted(data.index(m) for m in marks)
    if len(got) < 3:
        assert b"connection: close" in data.lower()


def test_idle_connection_is_closed_after_the_timeout(gw):
    s = connect(gw, timeout=0.2)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")   # slowloris
    t0 = time.monotonic()
    data, closed = read_all(s, IDLE_S + 5)
    assert closed, "a client that stopped sending kept its connection"
    assert IDLE_S - 0.5 <= time.monotonic() - t0 <= IDLE_S + 4
    s2 = connect(gw, timeout=0.2)
    s2.sendall(b"GET /healthz HTTP/1.1\r\nHost: x")   # headers never finished
    data, closed = read_all(s2, IDLE_S + 5)
    assert closed


def test_connection_flood_from_one_address_leaves_healthz_answerable(gw):
    n = 4100
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 200:
        if hard < n + 200:
            pytest.skip(f"ulimit -n hard limit {hard} is below {n + 200}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (n + 200, hard))
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.setblocking(False)
            s.bind(("127.0.0.2", 0))
            s.connect_ex(("127.0.0.1", gw.http_port))
            socks.append(s)
        time.sleep(0.5)   # let the gateway accept (and refuse) them
        t0 = time.monotonic()
        st, body = http_get(gw.base + "/healthz", timeout=2)
        assert st == 200 and json.loads(body)["status"] == "ok"
        assert time.monotonic() - t0 < 2
    finally:
        for s in socks:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert gw.gateway.alive()


def test_slow_answers_outlive_the_idle_timeout(gw):
    """The timeout counts inactivity on the socket: a stream waiting longer
    than it between tokens (keep-alives flow) and a non-streaming request
    waiting on its worker (the connection is suspended) both complete."""
    import threading
    from conftest import http_post
    gw.start_echo("gpu-pool", 0.4)   # a token every 2.5 s, past IDLE_S
    gw.wait_model("echo")
    out = {}

    def go(stream):
        out[stream] = http_post(gw.base + "/v1/completions",
                                {"model": "echo", "prompt": "hi", "max_tokens": 2, "stream": stream},
                                timeout=30)
    ts = [threading.Thread(target=go, args=(s,)) for s in (False, True)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert time.monotonic() - t0 > IDLE_S
    st, _, body = out[False]
    assert st == 200 and json.loads(body)["usage"]["completion_tokens"] == 2, body
    st, _, body = out[True]
    assert st == 200 and body.rstrip().endswith(b"data: [DONE]"), body


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def dechunk(data):
    """The body of one chunked HTTP/1.1 response."""
    rest = data.split(b"\r\n\r\n", 1)[1]
    out = b""
    while rest:
        size_line, rest = rest.split(b"\r\n", 1)
        n = int(size_line.split(b";")[0], 16)
        if n == 0:
            break
        out, rest = out + rest[:n], rest[n + 2:]
    return out


def test_slow_reader_is_cut_off_with_bounded_memory(cluster):
    """A client that asks for a long fast stream and does not read it: the
    gateway holds at most SW_MAX_STREAM_BACKLOG_BYTES (1 MiB) for it, then
    cancels the request at the worker (its slot comes back) and, when the
    client reads at last, the stream ends with finish_reason "error"."""
    # ASan keeps freed memory in a 256 MB quarantine, which the RSS bound
    # would count as held by the stream; a small one keeps the check real.
    env = ({"ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=2"}
           if SANITIZED else None)
    cluster.start_gateway(POLICY, env=env)
    cluster.start_echo("gpu-pool", 200000, name="fast-echo")
    cluster.wait_workers(1)
    gw = cluster.gateway.p.pid
    rss0 = rss_kb(gw)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(5)
    s.connect(("127.0.0.1", cluster.http_port))
    body = json.dumps({"model": "echo", "prompt": "hi", "max_tokens": 1000000, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    peak = 0
    t0 = time.monotonic()
    # Not reading: the worker is told to stop once 1 MiB waits for us.
    while time.monotonic() - t0 < 20:
        peak = max(peak, rss_kb(gw))
        w = cluster.workers()
        if w and w[0]["active"] == 0 and time.monotonic() - t0 > 0.5:
            break
        time.sleep(0.05)
    cut_after = time.monotonic() - t0
    assert cluster.workers()[0]["active"] == 0, "the unread stream was not cancelled at the worker"
    data, closed = read_all(s, 10)
    s.close()
    print(f"\ncut off after {cut_after:.1f} s; gateway RSS {rss0} -> peak {peak} kB; "
          f"{len(data)} bytes read afterwards")
    assert closed and b"data: [DONE]" in data, data[-300:]
    body = dechunk(data)
    assert b'"finish_reason":"error"' in body and b'"code":"stream_backlog"' in body, body[-500:]
    # Plain build: +1.5 to +3.2 MB seen on an idle host, and now and then +21
    # to +28 MB on a 2-core host loaded 5x over (the allocator's arenas of the
    # HTTP threads that served the polling, first touched during the test).
    # Under ASan every allocation carries a redzone and its shadow, and the
    # allocator keeps its size-class regions: +8 to +33 MB seen for the same
    # 1 MiB backlog. Buffering all of this 1M-token stream (~150 MB of SSE)
    # exceeds both bounds.
    bound_mb = 96 if SANITIZED else 48
    assert peak - rss0 < bound_mb * 1024, f"gateway RSS grew {peak - rss0} kB for one unread stream"
