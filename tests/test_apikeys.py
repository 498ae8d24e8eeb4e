"""Client API keys (--api-keys, docs/security.md "Client API keys"): 401 for
a missing or bad key, 403 for a model the key may not use, 429 with
Retry-After over the rps and concurrency limits, tokens per minute
reconciled when a request ends, the keys file reloaded when it changes,
metrics by label never by secret; through raw HTTP and the openai client."""
import json
import re
import os
import socket
import subprocess
import time

import pytest

from conftest import TWO_POOLS, bin_path, http_get, http_post, wait_until

POLICY = TWO_POOLS + 'routes:\n  - model: "echo"\n    target: cpu-pool\n  - model: "other"\n    target: cpu-pool\n'


def new_key(label, *args):
    """(key, YAML entry) from spillway-apikey new."""
    out = subprocess.run([bin_path("spillway-apikey"), "new", "--label", label, *args],
                         check=True, capture_output=True, text=True).stdout
    key, entry = out.split("\n", 1)
    assert key.startswith("sk-sw-") and key not in entry
    return key, entry


def write_keys(path, entries):
    tmp = path.with_suffix(".tmp")
    tmp.write_text("keys:\n" + "".join(entries))
    os.replace(tmp, path)   # a new inode: the gateway sees the change at once


def chat(base, key, model="echo", max_tokens=2, headers=None, timeout=30):
    h = {"Authorization": f"Bearer {key}"} if key else {}
    h.update(headers or {})
    body = {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}
    st, hdrs, raw = http_post(base + "/v1/chat/completions", body, headers=h, timeout=timeout)
    return st, hdrs, json.loads(raw)


@pytest.fixture
def keyed(cluster):
    """A gateway with a keys file and one echo worker; yields (cluster, keys path, keys)."""
    keys = {
        "a": new_key("team-a", "--models", "echo"),
        "rps": new_key("slow-team", "--rps", "1"),
        "conc": new_key("one-at-a-time", "--concurrency", "1"),
        "tpm": new_key("tpm-team", "--tpm", "600"),
    }
    path = cluster.tmp / "keys.yaml"
    write_keys(path, [e for _, e in keys.values()])
    cluster.start_gateway(POLICY, extra_args=["--api-keys", path])
    cluster.start_echo("cpu-pool", 200)
    cluster.start_echo("cpu-pool", 200, model_name="other")
    cluster.wait_model("echo")
    cluster.wait_model("other")
    return cluster, path, keys


def test_missing_and_bad_keys_are_401(keyed):
    c, _, keys = keyed
    key = keys["a"][0]
    for bad, code in [(None, "missing_api_key"), ("nope", "invalid_api_key"), (key + "x", "invalid_api_key"),
                      (key[:-1] + ("A" if key[-1] != "A" else "B"), "invalid_api_key"),
                      ("sk-sw-ffffffffffff-" + "A" * 43, "invalid_api_key")]:
        st, _, body = chat(c.base, bad)
        assert st == 401, (bad, body)
        assert body["error"]["code"] == code and body["error"]["type"] == "invalid_request_error"
    st, _, body = chat(c.base, None, headers={"Authorization": f"Basic {key}"})
    assert st == 401 and body["error"]["code"] == "missing_api_key"
    st, _, body = chat(c.base, key)
    assert st == 200, body
    # A client key is no admin token.
    st, _, _ = http_post(c.base + "/admin/reload", b"", headers={"Authorization": f"Bearer {key}"})
    assert st == 401


def test_model_not_allowed_is_403(keyed):
    c, _, keys = keyed
    st, _, body = chat(c.base, keys["a"][0], model="other")
    assert st == 403, body
    assert body["error"] == {**body["error"], "type": "permission_error", "code": "model_not_allowed",
                             "param": "model"}
    assert chat(c.base, keys["rps"][0], model="other")[0] == 200   # no models list: every model


def test_rps_limit_is_429_with_retry_after(keyed):
    c, _, keys = keyed
    key = keys["rps"][0]
    assert chat(c.base, key)[0] == 200
    st, hdrs, body = chat(c.base, key)
    assert st == 429, body
    assert body["error"]["code"] == "requests_per_second_exceeded"
    assert body["error"]["type"] == "rate_limit_exceeded"
    assert int(hdrs["Retry-After"]) >= 1
    time.sleep(1.1)
    assert chat(c.base, key)[0] == 200


def test_concurrency_limit_is_429(keyed):
    c, _, keys = keyed
    key = keys["conc"][0]
    # A long stream holds the one slot; a second request meanwhile is refused.
    s = socket.create_connection(("127.0.0.1", c.http_port))
    body = json.dumps({"model": "echo", "max_tokens": 400, "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert s.recv(100).startswith(b"HTTP/1.1 200")
    st, hdrs, body = chat(c.base, key)
    assert st == 429 and body["error"]["code"] == "concurrency_exceeded", body
    assert int(hdrs["Retry-After"]) >= 1
    s.close()   # client gone: its slot comes back when the gateway sees it
    wait_until(lambda: chat(c.base, key)[0] == 200, 10, what="the slot back")


def metric(text, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.split()[-1])
    return None


def test_tpm_reconciled_at_settle(keyed):
    c, _, keys = keyed
    key = keys["tpm"][0]
    st, _, body = chat(c.base, key, max_tokens=1000)   # more than the whole minute
    assert st == 400 and body["error"]["code"] == "tokens_per_minute_exceeded", body
    assert body["error"]["param"] == "max_tokens"
    # Charged ~500 at admission, but it used only ~10: the rest comes back
    # at settle, so the next big one fits. Without the refund it would not.
    for _ in range(3):
        st, _, body = chat(c.base, key, max_tokens=5)
        assert st == 200, body
    st, _, body = chat(c.base, key, max_tokens=500)
    assert st == 200, body
    st, hdrs, body = chat(c.base, key, max_tokens=500)
    assert st == 429 and body["error"]["code"] == "tokens_per_minute_exceeded", body
    assert int(hdrs["Retry-After"]) >= 1
    m = http_get(c.base + "/metrics")[1].decode()
    assert metric(m, "spillway_client_tokens_total", key="tpm-team", kind="completion") == 515
    assert metric(m, "spillway_client_requests_total", key="tpm-team", status="rate_limited") == 1
    assert metric(m, "spillway_client_requests_total", key="tpm-team", status="too_large") == 1


def test_reload_on_change(keyed):
    c, path, keys = keyed
    old = keys["a"][0]
    new, entry = new_key("team-new")
    assert chat(c.base, new)[0] == 401
    write_keys(path, [entry])
    wait_until(lambda: chat(c.base, new)[0] == 200, 5, what="the new key admitted")
    assert chat(c.base, old)[0] == 401
    # A broken file keeps the keys in force, and says where it is wrong.
    path.write_text("keys:\n  - id: 12\n    label: x\n    hash: nope\n")
    st, _, body = c.admin_post("/admin/reload")
    assert st == 400 and b"keys.yaml:4:11" in body, body
    assert chat(c.base, new)[0] == 200
    m = http_get(c.base + "/metrics")[1].decode()
    assert metric(m, "spillway_client_keys_reloads_total", result="error") >= 1


def test_metrics_name_labels_never_secrets(keyed):
    c, path, keys = keyed
    chat(c.base, keys["a"][0])
    chat(c.base, "sk-sw-aaaa-" + "B" * 40)
    chat(c.base, None)
    m = http_get(c.base + "/metrics")[1].decode()
    assert metric(m, "spillway_client_requests_total", key="team-a", status="admitted") == 1
    assert metric(m, "spillway_client_unauthorized_total", reason="missing") == 1
    assert metric(m, "spillway_client_unauthorized_total", reason="invalid") == 1
    assert metric(m, "spillway_client_inflight", key="team-a") == 0
    text = path.read_text()
    for key, _ in keys.values():
        # "sk-sw-<id>-<secret>": the id has no '-', the secret may.
        secret = key[len("sk-sw-"):].split("-", 1)[1]
        assert len(secret) >= 16, key
        assert secret not in m and secret not in c.gateway.output() and secret not in text
    for line in text.splitlines():
        if "hash:" in line:
            assert line.split('"')[1] not in m


def test_openai_client_errors(keyed):
    openai = pytest.importorskip("openai")
    c, _, keys = keyed

    def client(key):
        return openai.OpenAI(base_url=c.base + "/v1", api_key=key, max_retries=0, timeout=30)

    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError):
        client("sk-sw-bad-" + "x" * 40).chat.completions.create(model="echo", messages=msgs, max_tokens=2)
    with pytest.raises(openai.PermissionDeniedError) as e:
        client(keys["a"][0]).chat.completions.create(model="other", messages=msgs, max_tokens=2)
    assert e.value.body["param"] == "model"
    r = client(keys["a"][0]).chat.completions.create(model="echo", messages=msgs, max_tokens=2)
    assert r.usage.completion_tokens == 2
    rps = client(keys["rps"][0])
    rps.chat.completions.create(model="echo", messages=msgs, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as e:
        rps.chat.completions.create(model="echo", messages=msgs, max_tokens=2)
    assert int(e.value.response.headers["Retry-After"]) >= 1


def test_bad_keys_file_refuses_to_start(cluster):
    bad = cluster.tmp / "keys.yaml"
    bad.write_text("keys:\n  - id: abc\n    label: x\n    hash: \"blake2b$x$y\"\n    rps: -1\n")
    g = cluster.start_gateway(POLICY, extra_args=["--api-keys", bad], wait=False)
    wait_until(lambda: not g.alive(), 10, what="the gateway to exit")
    out = g.output()
    assert "keys.yaml:4:11:" in out and "keys.yaml:5:10:" in out, out


SPILL_POLICY = TWO_POOLS + """routes:
  - {model: "echo", target: gpu-pool}
  - {model: "echo", target: cpu-pool, priority: overflow}
  - {model: "other", target: cpu-pool}
"""


def test_key_routes_bound_where_its_requests_go(cluster):
    """A key's `routes` are the only pools its requests reach: a cpu-pool key
    is served by cpu-pool although gpu-pool, the primary, has room (and that is
    no spill); a key whose pools serve no route of the model gets 403."""
    keys = {"cpu": new_key("cpu-team", "--routes", "cpu-pool"),
            "gpu": new_key("gpu-team", "--routes", "gpu-pool"),
            "any": new_key("any-team")}
    path = cluster.tmp / "keys.yaml"
    write_keys(path, [e for _, e in keys.values()])
    cluster.start_gateway(SPILL_POLICY, extra_args=["--api-keys", path])
    cluster.start_echo("gpu-pool", 200)
    cluster.start_echo("cpu-pool", 200)
    cluster.start_echo("cpu-pool", 200, model_name="other")
    cluster.wait_model("echo")
    cluster.wait_model("other")
    cluster.wait_workers(3)
    for who, pool in [("cpu", "cpu-pool"), ("any", "gpu-pool"), ("gpu", "gpu-pool"), ("cpu", "cpu-pool")]:
        st, hdrs, body = chat(cluster.base, keys[who][0])
        assert st == 200 and hdrs["X-Spillway-Pool"] == pool, (who, hdrs, body)
    st, _, body = chat(cluster.base, keys["gpu"][0], model="other")
    assert st == 403 and body["error"]["code"] == "route_not_allowed", body
    spills = [ln for ln in http_get(cluster.base + "/metrics")[1].decode().splitlines()
              if ln.startswith("spillway_overflow_total{") and not ln.endswith(" 0")]
    assert not spills, f"a key's own pool is no spill: {spills}"
    # each of a request's several choices is bound the same way
    before = served_by(cluster)
    body = {"model": "echo", "max_tokens": 2, "n": 3, "messages": [{"role": "user", "content": "hi"}]}
    st, _, raw = http_post(cluster.base + "/v1/chat/completions", body,
                           headers={"Authorization": f"Bearer {keys['cpu'][0]}"})
    assert st == 200 and len(json.loads(raw)["choices"]) == 3, raw
    after = served_by(cluster)
    assert after.get("cpu-pool", 0) - before.get("cpu-pool", 0) == 3
    assert after.get("gpu-pool", 0) == before.get("gpu-pool", 0), (before, after)


def served_by(cluster):
    """{pool: requests it finished ok}, from the gateway's /metrics."""
    out = {}
    for m in re.finditer(r'^spillway_requests_total\{pool="([^"]+)",status="ok"\} (\S+)$',
                         http_get(cluster.base + "/metrics")[1].decode(), re.M):
        out[m.group(1)] = float(m.group(2))
    return out
