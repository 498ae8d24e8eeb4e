"""spillway-loadgen, the load generator behind `make bench-gateway`: a functional
test, not a performance one. It must drive the real gateway and real test-mode
workers without errors, report what it did in one JSON line, count broken
responses as errors (a tiny raw-socket server serves them), and refuse bad flags.
"""
import json
import socket
import subprocess
import threading

import pytest

from conftest import ECHO_ENV, Proc, bin_path, free_port

POLICY = """\
pools:
  - name: echo-pool
    kind: cpu
routes:
  - model: "echo"
    target: echo-pool
"""


def loadgen(*args, timeout=60):
    p = subprocess.run([bin_path("spillway-loadgen"), *map(str, args)], capture_output=True,
                       text=True, timeout=timeout)
    return p


def result(p):
    """The JSON line: the last line of stdout, and the only JSON one."""
    lines = p.stdout.strip().splitlines()
    assert lines, f"no output; stderr: {p.stderr}"
    assert sum(1 for ln in lines if ln.startswith("{")) == 1, p.stdout
    return json.loads(lines[-1])


@pytest.fixture
def gw(cluster):
    cluster.start_gateway(POLICY, extra_args=["--sdk", "none"])
    cluster.start_echo("echo-pool", 5000, ["--parallel", "64"])
    cluster.wait_model("echo")
    return cluster


def test_http_streaming_through_gateway(gw):
    p = loadgen("--http", f"127.0.0.1:{gw.http_port}", "--model", "echo", "--concurrency", 8,
                "--requests", 50, "--stream", "--max-tokens", 4)
    assert p.returncode == 0, p.stdout + p.stderr
    r = result(p)
    assert r["mode"] == "http" and r["stream"] is True and r["concurrency"] == 8
    assert r["requests"] == 50 and r["completed"] == 50 and r["errors"] == 0
    # Every stream had at least one data event before [DONE].
    assert r["chunks"] >= 50
    assert 0 < r["ttft_p50_ms"] <= r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
    assert r["rps"] > 0
    assert "latency" in p.stdout and "ttft" in p.stdout   # the human table


def test_http_plain_through_gateway(gw):
    p = loadgen("--http", f"127.0.0.1:{gw.http_port}", "--model", "echo", "--concurrency", 8,
                "--requests", 50, "--max-tokens", 4)
    assert p.returncode == 0, p.stdout + p.stderr
    r = result(p)
    assert r["stream"] is False and r["completed"] == 50 and r["errors"] == 0
    # The echo worker emits exactly max_tokens tokens; the loadgen adds up usage.
    assert r["tokens"] == 50 * 4
    assert r["ttft_p50_ms"] is None


def test_http_counts_gateway_errors(gw):
    # A model nobody serves: every request is an HTTP error, and the exit status says so.
    p = loadgen("--http", f"127.0.0.1:{gw.http_port}", "--model", "no-such-model",
                "--concurrency", 4, "--requests", 12)
    assert p.returncode == 1
    r = result(p)
    assert r["completed"] == 0 and r["errors"] == 12 and r["errors_by_kind"]["status"] == 12


def test_direct_baseline(tmp_path):
    ep = f"tcp://127.0.0.1:{free_port()}"
    w = Proc([bin_path("spillway-worker-cpu"), "--gateway", ep, "--pool", "p", "--model",
              "echo=/dev/null", "--test-echo", "5000", "--parallel", "64"],
             tmp_path / "worker.log", env=ECHO_ENV)
    try:
        p = loadgen("--direct", ep, "--model", "echo", "--workers", 1, "--wait", 20,
                    "--concurrency", 8, "--requests", 50, "--max-tokens", 4,
                    "--samples", tmp_path / "samples.json")
    finally:
        w.stop()
    assert p.returncode == 0, p.stdout + p.stderr + w.output()
    r = result(p)
    assert r["mode"] == "direct" and r["completed"] == 50 and r["errors"] == 0
    assert r["chunks"] == 50 * 4          # one TokenChunk per echo token
    assert 0 < r["ttft_p50_ms"] <= r["p50_ms"]
    # --samples: every request's figures, which the JSON line summarises.
    s = json.loads((tmp_path / "samples.json").read_text())
    assert len(s["latency_ms"]) == 50 and len(s["ttft_ms"]) == 50
    assert sorted(s["latency_ms"])[24] == pytest.approx(r["p50_ms"], abs=1e-3)


def test_direct_without_workers_fails_cleanly():
    ep = f"tcp://127.0.0.1:{free_port()}"
    p = loadgen("--direct", ep, "--model", "echo", "--concurrency", 2, "--requests", 5,
                "--wait", 0.3)
    assert p.returncode == 1
    assert "registered" in p.stderr


@pytest.mark.parametrize("args, why", [
    ([], "--http"),
    (["--http", "127.0.0.1:8080", "--concurrency", "4", "--requests", "5"], "--model"),
    (["--http", "127.0.0.1:8080", "--model", "m", "--requests", "5"], "--concurrency"),
    (["--http", "127.0.0.1:8080", "--model", "m", "--concurrency", "4"], "--requests"),
    (["--http", "127.0.0.1:8080", "--model", "m", "--concurrency", "4", "--requests", "5",
      "--duration", "2"], "exactly one"),
    (["--http", "127.0.0.1:8080", "--model", "m", "--concurrency", "0", "--requests", "5"],
     "--concurrency"),
    (["--http", "127.0.0.1:8080", "--model", "m", "--concurrency", "4x", "--requests", "5"],
     "--concurrency"),
    (["--http", "127.0.0.1:8080", "--model", "m", "--concurrency", "4", "--requests", "-1"],
     "--requests"),
    (["--http", "127.0.0.1:8080", "--model", "m", "--concurrency", "4", "--duration", "nan"],
     "--duration"),
    (["--http", "127.0.0.1:8080", "--model", "m", "--concurrency", "4", "--requests", "5",
      "--max-tokens", "0"], "--max-tokens"),
    (["--http", "10.1.2.3:8080", "--model", "m", "--concurrency", "4", "--requests", "5"],
     "loopback"),
    (["--http", "127.0.0.1:0", "--model", "m", "--concurrency", "4", "--requests", "5"],
     "loopback"),
    (["--http", "127.0.0.1:8080", "--model", "has space", "--concurrency", "4",
      "--requests", "5"], "--model"),
    (["--http", "127.0.0.1:8080", "--model", "m", "--concurrency", "4", "--requests", "5",
      "--workers", "2"], "--direct"),
    (["--direct", "tcp://0.0.0.0:5555", "--model", "m", "--concurrency", "4", "--requests", "5"],
     "loopback"),
    (["--http", "127.0.0.1:8080", "--direct", "tcp://127.0.0.1:5555", "--model", "m"],
     "exactly one"),
    (["--http", "127.0.0.1:8080", "--model", "m", "--concurrency", "4", "--requests", "5",
      "--bogus"], "unknown"),
    (["--http", "127.0.0.1:8080", "--model", "m", "--concurrency"], "needs a value"),
])
def test_bad_flags_exit_2(args, why):
    p = loadgen(*args)
    assert p.returncode == 2, (args, p.stdout, p.stderr)
    assert why in p.stderr, p.stderr
    assert "{" not in p.stdout


# ---- broken servers: a raw-socket HTTP/1.1 server with canned responses ----------

def chunked(body, size=7, ext=False, trailer=False):
    """body in Transfer-Encoding: chunked with awkward chunk boundaries."""
    out = b""
    for i in range(0, len(body), size):
        part = body[i:i + size]
        out += b"%x%s\r\n%s\r\n" % (len(part), b";x=y" if ext else b"", part)
    return out + b"0\r\n" + (b"X-Trailer: 1\r\n" if trailer else b"") + b"\r\n"


SSE_OK = (b'data: {"choices":[{"text":" a","finish_reason":null}]}\n\n'
          b'data: {"choices":[{"text":"","finish_reason":"length"}]}\n\n'
          b"data: [DONE]\n\n")
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
JSON_OK = b'{"choices":[{"text":" a b","finish_reason":"length"}],"usage":{"completion_tokens":2}}'

RESPONSES = {
    "sse_ok": SSE_HEAD + chunked(SSE_OK, ext=True, trailer=True),
    "sse_crlf_ok": SSE_HEAD + chunked(SSE_OK.replace(b"\n", b"\r\n"), size=5),
    "json_ok": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(JSON_OK), JSON_OK),
    "json_chunked_ok": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(JSON_OK, 3),
    "status_500": b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\n{}",
    "bad_chunk_size": SSE_HEAD + b"zz\r\nhello\r\n0\r\n\r\n",
    "bad_chunk_crlf": SSE_HEAD + b"5\r\nhelloXX0\r\n\r\n",
    "sse_no_done": SSE_HEAD + chunked(SSE_OK.replace(b"data: [DONE]\n\n", b"")),
    "sse_not_json": SSE_HEAD + chunked(b"data: hello\n\ndata: [DONE]\n\n"),
    "sse_error_chunk": SSE_HEAD + chunked(
        b'data: {"choices":[{"text":"","finish_reason":"error"}]}\n\ndata: [DONE]\n\n'),
    "json_garbage": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    "bad_status_line": b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
    "truncated": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"cho",
    "silent": b"",
}
CLOSE_AFTER = {"truncated"}


class CannedServer:
    """Answers every request on every keep-alive connection with one canned response."""

    def __init__(self, response, close=False):
        self.response, self.close = response, close
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.requests = 0
        self.lock = threading.Lock()
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n")
                length = int([h.split(b":")[1] for h in head.split(b"\r\n")
                              if h.lower().startswith(b"content-length:")][0])
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                json.loads(body)          # the loadgen sends a valid JSON body
                with self.lock:
                    self.requests += 1
                if not self.response:     # "silent": never answer
                    continue
                conn.sendall(self.response)
                if self.close:
                    return

    def stop(self):
        self.sock.close()


def run_canned(name, stream, n=10, extra=()):
    srv = CannedServer(RESPONSES[name], close=name in CLOSE_AFTER)
    try:
        args = ["--http", f"127.0.0.1:{srv.port}", "--model", "m", "--concurrency", 2,
                "--requests", n, *extra]
        p = loadgen(*(args + (["--stream"] if stream else [])))
        return p, result(p), srv.requests
    finally:
        srv.stop()


@pytest.mark.parametrize("name, stream", [
    ("sse_ok", True), ("sse_crlf_ok", True), ("json_ok", False), ("json_chunked_ok", False)])
def test_parses_valid_responses(name, stream):
    p, r, served = run_canned(name, stream)
    assert p.returncode == 0, p.stdout + p.stderr
    assert r["completed"] == 10 and r["errors"] == 0
    assert served == 10        # keep-alive: one request per response, nothing extra
    if stream:
        assert r["chunks"] == 20
    else:
        assert r["tokens"] == 20


@pytest.mark.parametrize("name, stream, kind", [
    ("status_500", False, "status"),
    ("bad_chunk_size", True, "malformed"),
    ("bad_chunk_crlf", True, "malformed"),
    ("sse_no_done", True, "malformed"),
    ("sse_not_json", True, "malformed"),
    ("sse_error_chunk", True, "stream"),
    ("json_garbage", False, "malformed"),
    ("bad_status_line", False, "malformed"),
    ("truncated", False, "io"),
])
def test_counts_broken_responses(name, stream, kind):
    p, r, _ = run_canned(name, stream)
    assert p.returncode == 1, p.stdout + p.stderr
    assert r["completed"] == 0 and r["errors"] == 10, r
    assert r["errors_by_kind"][kind] == 10, r


def test_times_out_a_silent_server():
    p, r, _ = run_canned("silent", False, n=4, extra=["--timeout", "0.2"])
    assert p.returncode == 1
    assert r["errors_by_kind"]["timeout"] == 4 and r["completed"] == 0


def test_refused_connections_are_bounded():
    port = free_port()           # nothing listens here
    p = loadgen("--http", f"127.0.0.1:{port}", "--model", "m", "--concurrency", 3,
                "--requests", 6, timeout=20)
    assert p.returncode == 1
    r = result(p)
    assert r["errors_by_kind"]["connect"] == 6 and r["completed"] == 0
