"""`make run`'s defaults bind nothing beyond loopback: ops/run.sh is started
as a newcomer would (only MODEL set, to the small real model, so no demo
model is made), and every listening socket of the processes it started is
read from /proc and must be on 127.0.0.1 or ::1.
"""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, ROOT, http_get, shared_file, wait_until

DEFAULT_PORTS = (8080, 5555, 5556)   # ops/run.sh's HTTP and worker ports, the SDK's


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def descendants(pid):
    """pid and every process below it, from /proc."""
    children = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def socket_inodes(pid):
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        pass
    return inodes


def listening():
    """{inode: (address hex, port)} of every TCP socket listening on the host."""
    out = {}
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":   # TCP_LISTEN
                addr, port = f[1].split(":")
                out[f[9]] = (addr, int(port, 16))
    return out


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}   # 127.0.0.1, ::1 as /proc prints them


def test_make_run_defaults_listen_on_loopback_only(tmp_path):
    model = shared_file("models/stories260K.gguf")
    busy = [p for p in DEFAULT_PORTS if not port_free(p)]
    if busy:
        pytest.skip(f"make run's default ports are in use here: {busy}")
    env = dict(os.environ, MODEL=str(model), STATE=str(tmp_path / "run"), SPILLWAY_BIN=str(BIN),
               THREADS="1")
    for k in ("HTTP", "WORKERS"):
        env.pop(k, None)
    run = subprocess.Popen(["bash", "ops/run.sh"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: http_get("http://127.0.0.1:8080/healthz")[0] == 200, 30,
                   what="make run's gateway")
        time.sleep(0.5)   # the worker's sockets too
        mine = set().union(*(socket_inodes(p) for p in descendants(run.pid)))
        bound = [a for i, a in listening().items() if i in mine]
        ports = sorted(p for _, p in bound)
        assert {8080, 5555} <= set(ports), f"did not find make run's listeners: {bound}"
        beyond = [(a, p) for a, p in bound if a not in LOOPBACK]
        assert not beyond, f"listening beyond loopback: {beyond}"
        print(f"\nmake run listens on {ports}, all loopback")
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        try:
            run.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(5)
