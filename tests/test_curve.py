"""CURVE authentication of the worker and SDK links (issue 21, part 2), and a
worker id bound to the connection and key that registered it (part 5).

Real processes: `spillway keygen` makes the keys, the gateway runs with
--curve-secret/--worker-keys/--client-keys, workers are the CPU worker's
test mode (--test-echo). The hostile peers are pyzmq sockets.
"""
import json
import os
import signal
import stat
import subprocess
import threading
import time
import urllib.request

import pytest
import zmq

from conftest import Proc, bin_path, free_port, http_get, http_post, wait_until
from test_worker_protocol import REGISTER, decode, envelope, f_bytes, f_varint, heartbeat

POLICY = """\
pools:
  - name: gpu-pool
    kind: gpu
  - name: cpu-pool
    kind: cpu
routes:
  - model: echo
    target: cpu-pool
  - model: echo-gpu
    target: gpu-pool
"""


def keygen(prefix):
    """A keypair from `spillway keygen`; returns (public Z85, .key path, .pub path)."""
    r = subprocess.run([bin_path("spillway"), "keygen", "--out", str(prefix)], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip(), f"{prefix}.key", f"{prefix}.pub"


def secret_of(key_file):
    """The secret-key value of a .key file (for the pyzmq peers)."""
    for line in open(key_file):
        if line.startswith("secret-key"):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError("no secret-key line")


def metric(cluster, name, **labels):
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in http_get(cluster.base + "/metrics")[1].decode().splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


class Keys:
    """The gateway's keypair, workers' and clients', and the allowlist files."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.gw_pub, self.gw_key, self.gw_pubfile = keygen(tmp / "gateway")
        self.cpu_pub, self.cpu_key, _ = keygen(tmp / "cpu-worker")
        self.any_pub, self.any_key, _ = keygen(tmp / "any-worker")
        self.stranger_pub, self.stranger_key, _ = keygen(tmp / "stranger")
        self.client_pub, self.client_key, _ = keygen(tmp / "client")
        self.worker_keys = tmp / "workers.keys"
        self.client_keys = tmp / "clients.keys"
        self.write_workers()
        self.client_keys.write_text(f"# SDK clients\n{self.client_pub} name=the-client\n")

    def write_workers(self, extra=""):
        self.worker_keys.write_text(f"# workers allowed in\n{self.cpu_pub} pools=cpu-pool name=cpu1  # cpu only\n"
                                    f"{self.any_pub} name=any1\n{extra}")


@pytest.fixture
def keys(tmp_path):
    return Keys(tmp_path)


def start_curve_gateway(cluster, keys, sdk_port=None):
    args = ["--curve-secret", keys.gw_key, "--worker-keys", keys.worker_keys]
    args += ["--client-keys", keys.client_keys, "--sdk", f"tcp://127.0.0.1:{sdk_port}"] if sdk_port else \
        ["--sdk", "none"]
    return cluster.start_gateway(POLICY, extra_args=args)


def curve_echo(cluster, pool, key_file, gw_key, name, extra=(), model="echo"):
    return cluster.start_echo(pool, 200, ["--curve-secret", key_file, "--gateway-key", gw_key, *extra],
                              model_name=model, name=name)


def test_keygen_writes_private_key_file_and_refuses_to_overwrite(tmp_path):
    pub, key, pubfile = keygen(tmp_path / "k")
    assert len(pub) == 40
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(pubfile).st_mode) & 0o077 == 0o044   # public: readable by all
    assert pub in open(pubfile).read() and pub in open(key).read()
    assert "secret-key" not in open(pubfile).read()
    r = subprocess.run([bin_path("spillway"), "keygen", "--out", str(tmp_path / "k")], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 1 and "already exists" in r.stderr


def run_gateway_expect_exit(cluster, args, timeout=10):
    cfg = cluster.tmp / "routes.yaml"
    cfg.write_text(POLICY)
    return subprocess.run([bin_path("spillway-gateway"), "--config", str(cfg), "--http",
                           f"127.0.0.1:{cluster.http_port}", *args], capture_output=True, text=True, timeout=timeout)


def test_gateway_refuses_unsafe_or_broken_security_settings(cluster, keys):
    port = free_port()
    r = run_gateway_expect_exit(cluster, ["--workers", f"tcp://0.0.0.0:{port}", "--sdk", "none"])
    assert r.returncode == 2 and "--insecure-workers" in r.stderr and "--curve-secret" in r.stderr, r.stderr
    r = run_gateway_expect_exit(cluster, ["--workers", f"tcp://127.0.0.1:{port}", "--sdk", f"tcp://*:{port + 1}"])
    assert r.returncode == 2 and "SDK endpoint" in r.stderr and "--insecure-sdk" in r.stderr, r.stderr
    r = run_gateway_expect_exit(cluster, ["--curve-secret", keys.gw_key, "--sdk", "none"])
    assert r.returncode == 2 and "--worker-keys" in r.stderr, r.stderr
    r = run_gateway_expect_exit(cluster, ["--worker-keys", str(keys.worker_keys), "--sdk", "none"])
    assert r.returncode == 2 and "--curve-secret" in r.stderr, r.stderr
    os.chmod(keys.gw_key, 0o640)   # a secret key others may read is refused
    r = run_gateway_expect_exit(cluster, ["--curve-secret", keys.gw_key, "--worker-keys", str(keys.worker_keys),
                                          "--workers", f"tcp://127.0.0.1:{port}", "--sdk", "none"])
    assert r.returncode == 1 and "chmod 600" in r.stderr, r.stderr
    os.chmod(keys.gw_key, 0o600)
    keys.worker_keys.write_text("not-a-key pools=cpu-pool\n")
    r = run_gateway_expect_exit(cluster, ["--curve-secret", keys.gw_key, "--worker-keys", str(keys.worker_keys),
                                          "--workers", f"tcp://127.0.0.1:{port}", "--sdk", "none"])
    assert r.returncode == 1 and "workers.keys:1:" in r.stderr, r.stderr


def test_insecure_workers_flag_allows_a_wide_endpoint(cluster):
    cfg = cluster.tmp / "routes.yaml"
    cfg.write_text(POLICY)
    p = Proc([bin_path("spillway-gateway"), "--config", cfg, "--http", f"127.0.0.1:{cluster.http_port}",
              "--workers", f"tcp://0.0.0.0:{cluster.zmq_port}", "--sdk", "none", "--insecure-workers"],
             cluster.tmp / "wide.log")
    cluster.procs.append(p)
    wait_until(lambda: http_get(cluster.base + "/healthz")[0] == 200, 15, what="gateway")
    assert "WARNING: --insecure-workers" in p.output()


def complete(cluster, model="echo", max_tokens=4, timeout=30):
    st, _, body = http_post(cluster.base + "/v1/completions", {"model": model, "prompt": "hi",
                                                             "max_tokens": max_tokens}, timeout=timeout)
    return st, json.loads(body)


def test_listed_worker_serves_and_unlisted_or_plaintext_cannot_register(cluster, keys):
    start_curve_gateway(cluster, keys)
    good = curve_echo(cluster, "cpu-pool", keys.cpu_key, keys.gw_pubfile, "good", ["--worker-id", "good"])
    bad = curve_echo(cluster, "cpu-pool", keys.stranger_key, keys.gw_pub, "stranger", ["--worker-id", "stranger"])
    plain = cluster.start_echo("cpu-pool", 200, ["--worker-id", "plain"], name="plain")
    cluster.wait_workers(1)
    st, body = complete(cluster)
    assert st == 200, body
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4
    w = cluster.workers()
    assert [x["id"] for x in w] == ["good"] and w[0]["curve_key"] == keys.cpu_pub and w[0]["key_name"] == "cpu1"
    wait_until(lambda: metric(cluster, "spillway_worker_auth_refused_total", reason="unlisted_key") >= 1, 10,
               what="the refusal counted")
    gw = cluster.gateway.output()
    assert f"refused a worker connection from 127.0.0.1 with key {keys.stranger_pub}" in gw
    wait_until(lambda: "refused our CURVE key" in bad.output(), 10, what="the stranger told why")
    wait_until(lambda: "mechanism mismatch" in plain.output() or "CURVE set on one side" in plain.output(), 10,
               what="the plaintext worker told why")
    time.sleep(1.0)
    assert [x["id"] for x in cluster.workers()] == ["good"]
    assert good.alive() and bad.alive() and plain.alive()


def test_cpu_key_cannot_join_the_gpu_pool(cluster, keys):
    start_curve_gateway(cluster, keys)
    w = curve_echo(cluster, "gpu-pool", keys.cpu_key, keys.gw_pubfile, "cpu-in-gpu", ["--worker-id", "sneaky"],
                   model="echo-gpu")
    wait_until(lambda: "refused to register us" in w.output(), 10, what="the worker logs the refusal")
    assert "may not serve pool 'gpu-pool'" in w.output()
    assert metric(cluster, "spillway_worker_registration_refused_total", reason="pool_not_allowed") >= 1
    assert cluster.workers() == []
    st, _ = complete(cluster, model="echo-gpu", timeout=10)
    assert st in (503, 404, 429)
    # a key without pools= may serve any pool
    curve_echo(cluster, "gpu-pool", keys.any_key, keys.gw_pubfile, "any", ["--worker-id", "any"], model="echo-gpu")
    cluster.wait_workers(1)
    st, body = complete(cluster, model="echo-gpu")
    assert st == 200 and body["usage"]["completion_tokens"] == 4


def register_body(worker_id, pool="cpu-pool", model="echo"):
    return envelope(REGISTER, f_bytes(1, worker_id) + f_bytes(2, pool) + f_varint(3, 1)
                    + f_bytes(4, f_bytes(1, model) + f_bytes(2, "test") + f_varint(3, 4096)) + f_varint(5, 4))


def hostile_register(endpoint, worker_id, curve=None):
    """A pyzmq DEALER that registers as worker_id; the replies it got in 2 s."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    if curve:
        s.curve_publickey, s.curve_secretkey, s.curve_serverkey = (k.encode() for k in curve)
    s.connect(endpoint)
    s.send(register_body(worker_id))
    s.send(heartbeat())
    got, deadline = [], time.monotonic() + 2
    while time.monotonic() < deadline:
        if s.poll(100):
            got.append(decode(s.recv()))
    s.close()
    ctx.term()
    return got


def stream_in_background(cluster, max_tokens):
    """Starts a streamed completion; returns (thread, result dict)."""
    out = {}

    def run():
        req = urllib.request.Request(cluster.base + "/v1/completions", method="POST",
                                     data=json.dumps({"model": "echo", "prompt": "hi", "max_tokens": max_tokens,
                                                      "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            out["status"] = r.status
            out["worker"] = r.headers.get("X-Spillway-Worker")
            out["body"] = r.read().decode()
    t = threading.Thread(target=run)
    t.start()
    return t, out


def check_stream_intact(out, max_tokens):
    events = [json.loads(line[6:]) for line in out["body"].splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert out["status"] == 200 and "error" not in out["body"], out["body"][-500:]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(e["choices"][0]["text"] for e in events).count("tok") == max_tokens


@pytest.mark.parametrize("curve", [False, True], ids=["plaintext", "curve"])
def test_a_live_worker_id_cannot_be_taken_over(cluster, keys, curve):
    if curve:
        start_curve_gateway(cluster, keys)
        curve_echo(cluster, "cpu-pool", keys.cpu_key, keys.gw_pubfile, "victim", ["--worker-id", "victim"])
        # the attacker holds a listed key (any pool), but not the victim's
        creds = (keys.any_pub, secret_of(keys.any_key), keys.gw_pub)
    else:
        cluster.start_gateway(POLICY, extra_args=["--sdk", "none"])
        cluster.start_echo("cpu-pool", 200, ["--worker-id", "victim"], name="victim")
        creds = None
    cluster.wait_workers(1)
    t, out = stream_in_background(cluster, 300)   # 1.5 s at 200 tokens/s
    wait_until(lambda: cluster.workers()[0]["inflight"] == 1, 10, what="the stream running")
    replies = hostile_register(cluster.worker_ep, "victim", creds)
    errors = [d for k, d in replies if k == "error"]
    assert errors and errors[0]["code"] == 403 and "belongs to a live worker" in errors[0]["message"], replies
    t.join(60)
    assert out.get("worker") == "victim"
    check_stream_intact(out, 300)
    assert metric(cluster, "spillway_worker_registration_refused_total", reason="id_in_use") >= 1
    w = cluster.workers()
    assert len(w) == 1 and w[0]["id"] == "victim" and w[0]["alive"]
    assert "re-registered" not in cluster.gateway.output()
    st, body = complete(cluster)
    assert st == 200


@pytest.mark.parametrize("curve", [False, True], ids=["plaintext", "curve"])
def test_restarted_worker_takes_back_its_id(cluster, keys, curve):
    """The legitimate case: the same worker, restarted (its old connection
    closed, and with CURVE the same key)."""
    if curve:
        start_curve_gateway(cluster, keys)
        start = lambda name: curve_echo(cluster, "cpu-pool", keys.cpu_key, keys.gw_pubfile, name,  # noqa: E731
                                        ["--worker-id", "w1"])
    else:
        cluster.start_gateway(POLICY, extra_args=["--sdk", "none"])
        start = lambda name: cluster.start_echo("cpu-pool", 200, ["--worker-id", "w1"], name=name)  # noqa: E731
    first = start("w1")
    cluster.wait_workers(1)
    first.kill9()
    start("w1-again")
    wait_until(lambda: cluster.gateway.output().count("worker w1 registered") == 2, 10,
               what="the restarted worker registered")
    st, body = complete(cluster)
    assert st == 200
    assert metric(cluster, "spillway_worker_registration_refused_total", reason="id_in_use") == 0


def test_allowlist_reload_admits_and_revokes(cluster, keys):
    start_curve_gateway(cluster, keys)
    w = curve_echo(cluster, "cpu-pool", keys.stranger_key, keys.gw_pubfile, "late", ["--worker-id", "late"])
    wait_until(lambda: "refused our CURVE key" in w.output(), 10, what="refused at first")
    keys.write_workers(f"{keys.stranger_pub} pools=cpu-pool name=late\n")
    cluster.wait_workers(1, timeout=20)   # the file is looked at every second; the worker retries
    st, body = complete(cluster)
    assert st == 200
    # SIGHUP reloads even when the file's stamp looks unchanged (same inode,
    # size and mtime): swap the key in place. The live worker whose key left
    # is dropped; the new key's worker gets in.
    new_pub, new_key, _ = keygen(keys.tmp / "newcomer")
    st0 = os.stat(keys.worker_keys)
    with open(keys.worker_keys, "r+") as f:
        text = f.read().replace(keys.stranger_pub, new_pub)
        f.seek(0)
        f.write(text)
    os.utime(keys.worker_keys, ns=(st0.st_atime_ns, st0.st_mtime_ns))
    assert os.stat(keys.worker_keys).st_size == st0.st_size
    n_reloads = cluster.gateway.output().count("reloaded 3 key(s)")
    cluster.gateway.p.send_signal(signal.SIGHUP)
    wait_until(lambda: cluster.gateway.output().count("reloaded 3 key(s)") > n_reloads, 10, what="the SIGHUP reload")
    wait_until(lambda: cluster.workers() == [], 10, what="the revoked worker dropped")
    assert metric(cluster, "spillway_worker_auth_refused_total", reason="revoked") >= 1
    curve_echo(cluster, "cpu-pool", new_key, keys.gw_pub, "newcomer", ["--worker-id", "newcomer"])
    cluster.wait_workers(1)
    assert cluster.workers()[0]["id"] == "newcomer"


def run_cli(*args, timeout=30):
    return subprocess.run([bin_path("spillway"), *args], capture_output=True, text=True, timeout=timeout)


def test_sdk_client_needs_a_listed_key(cluster, keys):
    sdk_port = free_port()
    start_curve_gateway(cluster, keys, sdk_port=sdk_port)
    curve_echo(cluster, "cpu-pool", keys.cpu_key, keys.gw_pubfile, "w")
    cluster.wait_workers(1)
    ep = f"tcp://127.0.0.1:{sdk_port}"
    r = run_cli("complete", "-e", ep, "-m", "echo", "-n", "3", "--key", keys.client_key, "--gateway-key",
                keys.gw_pubfile, "hello")
    assert r.returncode == 0, r.stderr
    assert "completion_tokens=3" in r.stderr
    r = run_cli("complete", "-e", ep, "-m", "echo", "-n", "3", "--timeout", "10000", "--key", keys.stranger_key,
                "--gateway-key", keys.gw_pub, "hello")
    assert r.returncode == 1 and "refused our CURVE key" in r.stderr, r.stderr
    r = run_cli("complete", "-e", ep, "-m", "echo", "-n", "3", "--timeout", "10000", "hello")
    assert r.returncode == 1 and ("mechanism mismatch" in r.stderr or "one side" in r.stderr), r.stderr
    assert metric(cluster, "spillway_sdk_auth_refused_total", reason="unlisted_key") >= 1
    os.chmod(keys.client_key, 0o644)
    r = run_cli("status", "-e", ep, "--key", keys.client_key, "--gateway-key", keys.gw_pub)
    assert r.returncode == 1 and "chmod 600" in r.stderr, r.stderr
