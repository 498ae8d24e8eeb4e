"""Shared pytest fixtures: where things are, and real processes to test against.

Integration tests start the real binaries (gateway, workers) on loopback ports
and talk to them over real sockets. Nothing here mocks our own components.
"""
import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / os.environ.get("SPILLWAY_BUILD", "build")
BIN = BUILD / "bin"
SHARED = Path(os.environ.get("SPILLWAY_SHARED", ROOT.parent / "shared")).resolve()
SANITIZED = BUILD.name.endswith("-san")      # ASan+UBSan (make SANITIZE=1)
TSAN = BUILD.name.endswith("-tsan")          # ThreadSanitizer (make TSAN=1)
# The worker's --test-echo mode (placeholder tokens, no model) is refused without this.
ECHO_ENV = {"SPILLWAY_ALLOW_TEST_MODE": "1"}
# The pools most gateway tests route between; a test's policy adds its routes.
TWO_POOLS = """\
pools:
  - name: gpu-pool
    kind: gpu
  - name: cpu-pool
    kind: cpu
"""


def shared_file(rel):
    """Path of a file in $SPILLWAY_SHARED, or skip the test if it is missing."""
    p = SHARED / rel
    if not p.exists():
        pytest.skip(f"test data missing: {p}")
    return p


# The golden models (llama.cpp's logits for a token sequence): NAME.gguf,
# NAME.tokens (ids), NAME.logits.f32 (float32 rows, one per token).
GOLDEN = sorted(p.name[:-len(".gguf")] for p in (SHARED / "golden").glob("*.gguf")) \
    if (SHARED / "golden").is_dir() else []


def load_golden(name):
    """(model path, token ids, reference logits [n_tokens, n_vocab]); skips if missing."""
    import numpy as np
    d = SHARED / "golden"
    paths = {k: d / f"{name}{k}" for k in (".gguf", ".tokens", ".logits.f32")}
    for p in paths.values():
        if not p.exists():
            pytest.skip(f"test data missing: {p}")
    ids = [int(t) for t in paths[".tokens"].read_text().split()]
    ref = np.fromfile(paths[".logits.f32"], dtype=np.float32)
    assert ref.size % len(ids) == 0
    return paths[".gguf"], ids, ref.reshape(len(ids), -1)


def cosines(a, b):
    """Row-by-row cosine similarity of two logits matrices, in float64."""
    import numpy as np
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def logits_for(model, ids, out, isa=None, extra=(), env_extra=None):
    """spillway-run's float32 logits for token ids (one batch, positions
    0..n-1), every position, on the ISA given (default: the best, or the one
    SPILLWAY_ISA forces for the whole suite), with env_extra added to its
    environment; returns (logits [n, vocab], stderr)."""
    import numpy as np
    env = dict(os.environ)
    env.pop("SPILLWAY_I8_MIN_TOKENS", None)
    env.update(env_extra or {})
    if isa:
        env["SPILLWAY_ISA"] = isa
    r = subprocess.run([bin_path("spillway-run"), "-m", str(model), "--tokens", ",".join(map(str, ids)),
                        "--logits-out", str(out), "-t", "2", *extra],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    got = np.fromfile(out, dtype=np.float32)
    return got.reshape(len(ids), -1), r.stderr


def cpu_pool_policy(*models):
    """routes.yaml text with one CPU pool, "cpu-pool", serving each model."""
    routes = "".join(f"  - model: {m}\n    target: cpu-pool\n" for m in models)
    return "pools:\n  - name: cpu-pool\n    kind: cpu\nroutes:\n" + routes


def build_sdk_example(name, tmp_path):
    """Compiles sdk/examples/NAME.c against the built library, as its header
    comment says a user would (sanitized when the suite is); returns the path."""
    exe = tmp_path / name
    lib = BUILD / "lib"
    cc = subprocess.run(["cc", "-std=gnu11", "-Wall", "-Werror", str(ROOT / f"sdk/examples/{name}.c"),
                         f"-I{ROOT}", f"-I{BUILD / 'gen'}", f"-L{lib}", "-lsw_sdk", "-lsw_proto",
                         "-lzmq", "-lprotobuf-c", "-o", str(exe)]
                        + (["-fsanitize=address,undefined"] if SANITIZED else [])
                        + (["-fsanitize=thread"] if TSAN else []),
                        capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    return exe


def bin_path(name):
    p = BIN / name
    if not p.exists():
        pytest.fail(f"binary not built: {p}")
    return str(p)


# Test ports come from below the kernel's ephemeral range, handed out in turn
# through a counter every pytest process on the host shares (a file under a
# lock). bind(0) would give a port from the ephemeral range, which the
# kernel can hand again to any outgoing connection (a client, a ZeroMQ
# connect) before the process under test binds it; and two suites running
# at once (pytest-xdist workers, the two soaks) would draw the same ones.
PORT_COUNTER = Path(os.environ.get("TMPDIR", "/tmp")) / "spillway-test-ports"


def _port_range():
    try:
        lo = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    return (10000, lo) if lo >= 12000 else None


def _next_port(first, end):
    import fcntl
    with open(PORT_COUNTER, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        try:
            n = int(f.read() or 0)
        except ValueError:
            n = 0
        port = first + n % (end - first)
        f.seek(0)
        f.truncate()
        f.write(str(n + 1))
        return port


def free_port():
    """A loopback TCP port nothing listens on now, not from the ephemeral range."""
    span = _port_range()
    for _ in range(span[1] - span[0] if span else 0):
        port = _next_port(*span)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What ASan, LSan, UBSan and TSan print. A report in a child's log fails the test
# that started it, even when the child went on serving: a leak is only
# reported as the process exits, after the test has got its answers.
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                     "WARNING: ThreadSanitizer")
_PROCS = []   # every Proc started, checked once it has exited


class Proc:
    """A child process whose output goes to a log file we can show on failure."""

    def __init__(self, args, log_path, env=None):
        self.args = [str(a) for a in args]
        self.log_path = Path(log_path)
        self.log = open(self.log_path, "wb")
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, env=e)
        self.checked = False
        _PROCS.append(self)

    def sanitizer_report(self):
        """The first sanitizer report in the log (with context), or None."""
        text = self.output()
        for m in SANITIZER_MARKERS:
            i = text.find(m)
            if i >= 0:
                return f"{self.log_path.name} ({' '.join(self.args[:1])}):\n{text[max(0, i - 300):i + 4000]}"
        return None

    def alive(self):
        return self.p.poll() is None

    def output(self):
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def kill9(self):
        if self.alive():
            self.p.kill()
        self.p.wait(10)

    def stop(self, timeout=10):
        if self.alive():
            self.p.terminate()
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self.log.close()
        return self.p.returncode


def http_get(url, timeout=5, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def write_admin_token(path):
    """A fresh admin token in path, mode 0600 (the gateway refuses a token
    file others may read); returns the headers that carry it."""
    import secrets
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return {"Authorization": f"Bearer {token}"}


def http_post(url, body, headers=None, timeout=60):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def wait_until(cond, timeout=10.0, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Exception:
            pass
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def metric(cluster, name, **labels):
    """The sum of the gateway's /metrics samples called name whose labels
    include these."""
    from prometheus_client.parser import text_string_to_metric_families
    text = http_get(cluster.base + "/metrics")[1].decode()
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def route_status(cluster, name):
    """The route called name ("model@pool") in /admin/status."""
    return next(r for r in json.loads(cluster.admin_get("/admin/status")[1])["routes"] if r["name"] == name)


class Cluster:
    """A gateway plus workers on free loopback ports, torn down at the end."""

    def __init__(self, tmp_path):
        self.tmp = Path(tmp_path)
        self.procs = []
        self.http_port = free_port()
        self.zmq_port = free_port()
        self.base = f"http://127.0.0.1:{self.http_port}"
        self.worker_ep = f"tcp://127.0.0.1:{self.zmq_port}"
        self.gateway = None
        # The admin API's token (--admin-token-file); admin_get/admin_post send it.
        self.admin_token_file = self.tmp / "admin.token"
        self.admin_headers = write_admin_token(self.admin_token_file)

    def start_gateway(self, config_text, extra_args=(), wait=True, admin_token=True, env=None):
        cfg = self.tmp / "routes.yaml"
        cfg.write_text(config_text)
        self.config_path = cfg
        admin = ["--admin-token-file", self.admin_token_file] if admin_token else []
        if "--sdk" not in map(str, extra_args):
            # Not the default SDK port: test files run side by side, and
            # make run's test needs 5556 free.
            self.sdk_ep = f"tcp://127.0.0.1:{free_port()}"
            extra_args = [*extra_args, "--sdk", self.sdk_ep]
        for attempt in range(3):
            self.gateway = Proc([bin_path("spillway-gateway"), "--config", cfg,
                                 "--http", f"127.0.0.1:{self.http_port}",
                                 "--workers", f"tcp://127.0.0.1:{self.zmq_port}", *admin, *extra_args],
                                self.tmp / "gateway.log", env=env)
            self.procs.append(self.gateway)
            if not wait or not self._http_port_taken():
                break
            # Another process took the port between free_port() and the
            # gateway's bind: take another one.
            self.http_port = free_port()
            self.base = f"http://127.0.0.1:{self.http_port}"
        if wait:
            wait_until(lambda: http_get(self.base + "/healthz")[0] == 200, 15,
                       what="gateway /healthz")
        return self.gateway

    def _http_port_taken(self, timeout=15):
        """Waits for the gateway to answer or exit; True when it exited
        because its HTTP port was in use."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.gateway.alive():
            try:
                if http_get(self.base + "/healthz")[0] == 200:
                    return False
            except OSError:
                time.sleep(0.05)
        return not self.gateway.alive() and "cannot start the HTTP server" in self.gateway.output()

    def start_worker(self, pool, model_name, model_path, extra_args=(), name="worker", env=None,
                     binary="spillway-worker-cpu"):
        w = Proc([bin_path(binary), "--gateway", self.worker_ep, "--pool", pool,
                  "--model", f"{model_name}={model_path}", *extra_args],
                 self.tmp / f"{name}-{len(self.procs)}.log", env=env)
        self.procs.append(w)
        return w

    def start_echo(self, pool, rate, extra_args=(), model_name="echo", model_path="/dev/null",
                   name="echo"):
        """A worker in its test mode: rate placeholder tokens/s, no model loaded."""
        return self.start_worker(pool, model_name, model_path, ["--test-echo", str(rate), *extra_args],
                                 name=name, env=ECHO_ENV)

    def admin_get(self, path, timeout=5):
        """GET an /admin/ endpoint with the admin token: (status, body)."""
        return http_get(self.base + path, timeout=timeout, headers=self.admin_headers)

    def admin_post(self, path, body=b"", timeout=60):
        """POST to an /admin/ endpoint with the admin token: (status, headers, body)."""
        return http_post(self.base + path, body, headers=self.admin_headers, timeout=timeout)

    def workers(self):
        return json.loads(self.admin_get("/admin/workers")[1])["data"]

    def wait_workers(self, n, timeout=15):
        wait_until(lambda: len(self.workers()) == n, timeout, what=f"{n} workers registered")

    def models(self):
        return json.loads(http_get(self.base + "/v1/models")[1])

    def wait_model(self, model_name, timeout=30):
        wait_until(lambda: any(m["id"] == model_name for m in self.models()["data"]),
                   timeout, what=f"model {model_name} registered")

    def logs(self):
        return "\n".join(f"==== {p.log_path.name}\n{p.output()[-4000:]}" for p in self.procs)

    def close(self):
        for p in reversed(self.procs):
            p.stop()


@pytest.fixture
def cluster(tmp_path, request):
    c = Cluster(tmp_path)
    yield c
    failed = getattr(request.node, "rep_call", None)
    c.close()
    if failed is not None and failed.failed:
        print(c.logs())


@pytest.fixture(autouse=True)
def no_sanitizer_reports():
    """After each test (its other fixtures torn down first, so its processes
    have exited): no process that ended may have printed a sanitizer report."""
    yield
    reports = []
    for p in _PROCS:
        if p.checked or p.alive():
            continue
        p.checked = True
        r = p.sanitizer_report()
        if r:
            reports.append(r)
    if reports:
        pytest.fail("sanitizer report in a child process:\n" + "\n\n".join(reports), pytrace=False)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


# Tests of what runs around the gateway (a real Prometheus, a real browser,
# deployment manifests, network namespaces) run in the plain suite only: under
# SANITIZE=1 and TSAN=1 the same C paths are run by the other tests, and these
# would spend the sanitizer runs' CI minutes on the outside tools.
def pytest_configure(config):
    config.addinivalue_line("markers", "plain_only: runs in the plain build's suite, "
                            "skipped (and reported so) under SANITIZE=1 and TSAN=1")


def pytest_collection_modifyitems(config, items):
    if not (SANITIZED or TSAN):
        return
    skip = pytest.mark.skip(reason="plain_only: an outside-tool test, run by the plain suite")
    for item in items:
        if "plain_only" in item.keywords:
            item.add_marker(skip)


def require_tool(name):
    """Path of an outside program the test drives (ops/deps.sh installs it),
    or skip the test, saying so, where it is missing."""
    import shutil
    p = shutil.which(name)
    if not p:
        pytest.skip(f"{name} not installed (ops/deps.sh installs it)")
    return p
