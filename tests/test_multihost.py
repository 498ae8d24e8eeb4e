"""Spillway across hosts: network namespaces stand for the machines.

The test makes its own topology with iproute2 (root needed, else skipped):

    this namespace --veth-- G (both gateways) --veth-- A (gpu-pool worker)
                                              --veth-- B (cpu-pool worker)

Each namespace has its own address; the gateways' worker endpoints are
bound beyond loopback, so they run with CURVE keys from `spillway keygen`
(docs/security.md), and each worker connects to both gateways (--gateway
twice). What it checks, as issue 22's many-host bullet asks:
  - requests flow to the primary pool;
  - with host A's link cut, its pool is seen degraded within the heartbeat
    window and traffic spills to B (spillway_overflow_total, reason
    "degraded"); with the link back, A registers again and serves;
  - two gateways loading the same workers never put more on a worker than
    its slots running, and slots + SW_WORKER_QUEUE_MAX held (the worker's own
    count, in its log), and every request completes.
The namespaces are removed whatever happens (a finally, names unique to this
process, and leftovers of dead runs removed first).

Without namespaces, a rolling restart (SIGTERM drain) of the workers behind
two gateways under load: no request fails.
"""
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from test_curve import keygen
from test_faults import POLICY as SPILL_POLICY   # echo: gpu-pool, overflow to cpu-pool
from conftest import ECHO_ENV, Proc, bin_path, free_port, http_get, http_post, require_tool, \
    wait_until, write_admin_token

POLICY = SPILL_POLICY + """\
defaults:
  queue_length: 512
  queue_timeout_ms: 20000
"""
LIVENESS_S = 3.0   # SW_HEARTBEAT_LIVENESS x SW_HEARTBEAT_MS (proto/wire.h)
PREFIX = "swmh"    # every namespace this test makes is named PREFIX<pid><role>
SLOTS = 2
QUEUE_MAX = 2      # SW_WORKER_QUEUE_MAX (proto/wire.h)


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def remove_leftovers():
    """Namespaces of earlier runs whose process is gone (a run killed before
    its finally): removed, so they cannot pile up."""
    for line in ip("netns", "list", check=False).stdout.splitlines():
        m = re.match(rf"({PREFIX}(\d+)[a-z])\b", line)
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            ip("netns", "del", m.group(1), check=False)


class Hosts:
    """The namespaces and links; addresses per host as in the module doc."""

    def __init__(self):
        pid = os.getpid()
        self.names = {role: f"{PREFIX}{pid}{role}" for role in "gab"}
        self.root_if = f"{PREFIX}{pid}r"
        sub = pid % 250   # the one subnet seen in this namespace: unique per run
        self.root_ip, self.gw_ip = f"10.78.{sub}.1", f"10.78.{sub}.2"
        self.gw_ip_for = {"a": "10.79.1.1", "b": "10.79.2.1"}
        self.made = []

    def build(self):
        g = self.names["g"]
        for n in self.names.values():
            ip("netns", "add", n)
            self.made.append(n)
            ip("-n", n, "link", "set", "lo", "up")
        ip("link", "add", self.root_if, "type", "veth", "peer", "name", "r0", "netns", g)
        ip("addr", "add", f"{self.root_ip}/30", "dev", self.root_if)
        ip("link", "set", self.root_if, "up")
        ip("-n", g, "addr", "add", f"{self.gw_ip}/30", "dev", "r0")
        ip("-n", g, "link", "set", "r0", "up")
        for role, net in (("a", 1), ("b", 2)):
            host = self.names[role]
            ip("-n", g, "link", "add", f"{role}0", "type", "veth", "peer", "name", "eth0", "netns", host)
            ip("-n", g, "addr", "add", f"10.79.{net}.1/30", "dev", f"{role}0")
            ip("-n", g, "link", "set", f"{role}0", "up")
            ip("-n", host, "addr", "add", f"10.79.{net}.2/30", "dev", "eth0")
            ip("-n", host, "link", "set", "eth0", "up")

    def link(self, role, up):
        ip("-n", self.names[role], "link", "set", "eth0", "up" if up else "down")

    def remove(self):
        ip("link", "del", self.root_if, check=False)
        for n in self.made:
            ip("netns", "del", n, check=False)


@pytest.fixture
def hosts():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    require_tool("ip")
    remove_leftovers()
    h = Hosts()
    try:
        try:
            h.build()
        except subprocess.CalledProcessError as e:
            pytest.skip(f"ip netns unusable here: {' '.join(e.cmd)}: {e.stderr.strip()}")
        yield h
    finally:
        h.remove()
    assert not [l for l in ip("netns", "list").stdout.splitlines() if l.startswith(f"{PREFIX}{os.getpid()}")]


class Gateway:
    """One gateway: its HTTP base, admin headers and log."""

    def __init__(self, tmp, name, cmd_prefix, http, workers, extra):
        self.base = f"http://{http}"
        self.admin = write_admin_token(tmp / f"{name}.token")
        (tmp / "routes.yaml").write_text(POLICY)
        self.proc = Proc([*cmd_prefix, bin_path("spillway-gateway"), "--config", tmp / "routes.yaml",
                          "--http", http, "--workers", workers, "--sdk", "none",
                          "--admin-token-file", tmp / f"{name}.token", *extra], tmp / f"{name}.log")
        wait_until(lambda: http_get(self.base + "/healthz")[0] == 200, 15, what=f"{name} /healthz")

    def status(self):
        req = urllib.request.Request(self.base + "/admin/status", headers=self.admin)
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def pool(self, name):
        return next(p for p in self.status()["pools"] if p["name"] == name)

    def complete(self, max_tokens=4):
        st, hdr, body = http_post(self.base + "/v1/completions",
                                  {"model": "echo", "prompt": "hi", "max_tokens": max_tokens}, timeout=30)
        return st, hdr.get("X-Spillway-Pool"), body

    def overflow(self, reason):
        text = http_get(self.base + "/metrics")[1].decode()
        return sum(float(l.split()[-1]) for l in text.splitlines()
                   if l.startswith("spillway_overflow_total{") and f'reason="{reason}"' in l)


def held_at_most(proc):
    """The worker's own peak of requests held, from its exit log line."""
    m = re.search(r"held at most (\d+) requests at once \((\d+) slots \+ (\d+) queued\); refused (\d+) when full",
                  proc.output())
    assert m, proc.output()[-2000:]
    return [int(x) for x in m.groups()]


def load(gateways, n_each, max_tokens, peak, stop):
    """n_each concurrent requests per gateway; meanwhile the largest
    'active' any gateway's /admin/status reports per pool goes into peak.
    Returns the (status, pool) of every request."""
    def sample():
        while not stop.is_set():
            for g in gateways:
                for p in g.status()["pools"]:
                    peak[p["name"]] = max(peak.get(p["name"], 0), p["active"])
            time.sleep(0.02)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    with ThreadPoolExecutor(len(gateways) * n_each) as ex:
        futs = [ex.submit(g.complete, max_tokens) for g in gateways for _ in range(n_each)]
        out = [f.result()[:2] for f in futs]
    stop.set()
    t.join(5)
    return out


@pytest.mark.plain_only
def test_many_hosts_link_cut_spills_and_two_gateways_never_oversubscribe(tmp_path, hosts):
    t_start = time.monotonic()
    g = hosts.names["g"]
    gw_pub, gw_key, gw_pubfile = keygen(tmp_path / "gateway")   # the gateways share one keypair
    pub_a, key_a, _ = keygen(tmp_path / "host-a")
    pub_b, key_b, _ = keygen(tmp_path / "host-b")
    (tmp_path / "workers.keys").write_text(f"{pub_a} pools=gpu-pool name=host-a\n{pub_b} pools=cpu-pool name=host-b\n")
    curve = ["--curve-secret", gw_key, "--worker-keys", tmp_path / "workers.keys"]
    in_g = ["ip", "netns", "exec", g]
    gws = [Gateway(tmp_path, f"gw{i}", in_g, f"{hosts.gw_ip}:{8080 + i}", f"tcp://0.0.0.0:{5555 + i}", curve)
           for i in range(2)]
    workers = {}
    for role, pool, key in (("a", "gpu-pool", key_a), ("b", "cpu-pool", key_b)):
        eps = [a for i in range(2) for a in ("--gateway", f"tcp://{hosts.gw_ip_for[role]}:{5555 + i}")]
        workers[role] = Proc(["ip", "netns", "exec", hosts.names[role], bin_path("spillway-worker-cpu"), *eps,
                              "--pool", pool, "--model", "echo=/dev/null", "--test-echo", "100",
                              "--parallel", str(SLOTS), "--worker-id", f"host-{role}",
                              "--curve-secret", key, "--gateway-key", gw_pubfile],
                             tmp_path / f"worker-{role}.log", env=ECHO_ENV)
    procs = [gw.proc for gw in gws] + list(workers.values())
    try:
        for gw in gws:
            wait_until(lambda: gw.pool("gpu-pool")["workers"] == 1 and gw.pool("cpu-pool")["workers"] == 1, 15,
                       what="both hosts' workers registered with each gateway")
        # Requests flow, to the primary pool, through either gateway.
        for gw in gws:
            st, pool, _ = gw.complete()
            assert (st, pool) == (200, "gpu-pool")

        # Two gateways, 12 concurrent requests each, against 2 x (2 slots + 2).
        peak, stop = {}, threading.Event()
        results = load(gws, 12, 10, peak, stop)
        assert all(st == 200 for st, _ in results), results
        assert peak.get("gpu-pool", 0) <= SLOTS and peak.get("cpu-pool", 0) <= SLOTS, peak
        print(f"two gateways, 24 requests: peak running per worker {peak}")

        # Host A's link cut: its pool is degraded within the heartbeat window and traffic spills.
        spilled_before = gws[0].overflow("degraded")
        hosts.link("a", up=False)
        t_cut = time.monotonic()
        wait_until(lambda: gws[0].pool("gpu-pool")["workers"] == 0, LIVENESS_S + 2, interval=0.05,
                   what="gpu-pool degraded at gw0")
        took = time.monotonic() - t_cut
        assert took <= LIVENESS_S + 1.5, took
        st, pool, _ = gws[0].complete()
        assert (st, pool) == (200, "cpu-pool")
        assert gws[0].overflow("degraded") > spilled_before
        print(f"link cut: gpu-pool degraded after {took:.2f} s; the request spilled to cpu-pool")

        hosts.link("a", up=True)
        t_up = time.monotonic()
        for gw in gws:
            wait_until(lambda: gw.pool("gpu-pool")["workers"] == 1, 15, what="host A back")
            wait_until(lambda: gw.complete()[1] == "gpu-pool", 10, what="host A serving again")
        print(f"link restored: host A serving both gateways after {time.monotonic() - t_up:.2f} s")
    finally:
        codes = {p.log_path.name: p.stop() for p in reversed(procs)}
    assert codes["worker-a.log"] == 0 and codes["worker-b.log"] == 0, codes
    for role, w in workers.items():
        held, slots, queue_max, refused = held_at_most(w)
        assert slots == SLOTS and queue_max == QUEUE_MAX and held <= SLOTS + QUEUE_MAX, (role, held)
        print(f"host {role}: held at most {held} (slots {slots} + {queue_max}), refused {refused} when full")
    assert time.monotonic() - t_start < 60


def test_rolling_restart_behind_two_gateways_loses_no_request(tmp_path):
    """Two gateways, two echo workers serving both; a client load runs while
    each worker in turn gets SIGTERM (it drains and exits 0) and a new one
    takes its place. Every request completes with a 200."""
    ports = [(free_port(), free_port()) for _ in range(2)]
    gws = [Gateway(tmp_path, f"gw{i}", [], f"127.0.0.1:{h}", f"tcp://127.0.0.1:{z}", [])
           for i, (h, z) in enumerate(ports)]
    eps = [a for _, z in ports for a in ("--gateway", f"tcp://127.0.0.1:{z}")]
    procs = [gw.proc for gw in gws]

    def worker(n):
        w = Proc([bin_path("spillway-worker-cpu"), *eps, "--pool", "gpu-pool", "--model", "echo=/dev/null",
                  "--test-echo", "50", "--parallel", "4", "--worker-id", f"w{n}"],
                 tmp_path / f"worker-{n}.log", env=ECHO_ENV)
        procs.append(w)
        return w

    def serving(n):
        return all(gw.pool("gpu-pool")["workers"] == n for gw in gws)

    live = [worker(0), worker(1)]
    stop, results = threading.Event(), []

    def client(gw):
        while not stop.is_set():
            results.append(gw.complete(max_tokens=20)[:2])   # 0.4 s each
    try:
        wait_until(lambda: serving(2), 15, what="2 workers at both gateways")
        threads = [threading.Thread(target=client, args=(gws[i % 2],)) for i in range(10)]
        for t in threads:
            t.start()
        time.sleep(1)
        for i in range(2):
            old = live[i]
            old.p.send_signal(signal.SIGTERM)
            assert old.p.wait(15) == 0, old.output()[-2000:]
            assert "drained in" in old.output()
            live[i] = worker(2 + i)
            wait_until(lambda: serving(2), 15, what="the replacement registered")
            time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        stop.set()
        for p in reversed(procs):
            p.stop()
    failed = [r for r in results if r[0] != 200]
    assert len(results) > 40 and not failed, (len(results), failed[:5])
    print(f"rolling restart: {len(results)} requests, all 200")
