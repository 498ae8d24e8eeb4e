"""The gateway's OpenAI API against real processes: the real gateway binary and
real workers in their test mode (--test-echo: the real worker daemon and
protocol, placeholder tokens instead of a model). Bad inputs must get clear
errors while the gateway keeps serving.
"""
import json
import socket
import time

import openai
import pytest
import zmq

from conftest import TWO_POOLS, http_get, http_post, wait_until

POLICY = TWO_POOLS + """\
aliases:
  echo-alias: echo
routes:
  - model: "echo"
    target: gpu-pool
    max_concurrency: 64
  - model: "echo"
    target: cpu-pool
    priority: overflow
  - model: "routed-but-absent"
    target: cpu-pool
"""


def start_echo(cluster, pool="gpu-pool", model="echo", rate=2000, extra=()):
    return cluster.start_echo(pool, rate, extra, model_name=model, name=f"echo-{pool}")


@pytest.fixture
def gw(cluster):
    cluster.start_gateway(POLICY)
    start_echo(cluster)
    cluster.wait_model("echo")
    return cluster


def client(cluster):
    return openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=30)


def test_healthz_counts_workers(gw):
    st, body = http_get(gw.base + "/healthz")
    h = json.loads(body)
    assert st == 200 and h["status"] == "ok"
    wait_until(lambda: json.loads(http_get(gw.base + "/healthz")[1])["workers"] == 1, 5,
               what="healthz to count the worker")


def test_models_lists_available_and_unavailable(gw):
    m = gw.models()
    ids = {x["id"] for x in m["data"]}
    assert m["object"] == "list"
    assert "echo" in ids and "echo-alias" in ids
    assert "routed-but-absent" not in ids
    assert [x["id"] for x in m["unavailable"]] == ["routed-but-absent"]
    listed = client(gw).models.list()
    assert "echo" in [x.id for x in listed.data]


def test_completion_non_streaming(gw):
    r = client(gw).completions.with_raw_response.create(model="echo", prompt="hello", max_tokens=7)
    c = r.parse()
    assert r.headers["X-Spillway-Pool"] == "gpu-pool"
    assert r.headers["X-Spillway-Worker"]
    assert c.id.startswith("cmpl-") and c.object == "text_completion"
    assert c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 7
    assert c.usage.total_tokens == c.usage.prompt_tokens + 7
    assert c.choices[0].text.split() == [f"tok{i}" for i in range(1, 8)]


def test_completion_default_max_tokens_is_16(gw):
    c = client(gw).completions.create(model="echo", prompt="hello")
    assert c.usage.completion_tokens == 16


def test_completion_streaming_with_usage(gw):
    chunks = list(client(gw).completions.create(model="echo", prompt="hello", max_tokens=5,
                                                stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text.split() == [f"tok{i}" for i in range(1, 6)]
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert len({ch.id for ch in chunks}) == 1


def test_chat_non_streaming_and_alias(gw):
    c = client(gw).chat.completions.create(model="echo-alias", max_tokens=4,
                                           messages=[{"role": "user", "content": "hi"}])
    assert c.id.startswith("chatcmpl-") and c.object == "chat.completion"
    assert c.model == "echo-alias"
    assert c.choices[0].message.role == "assistant"
    assert c.choices[0].message.content.split() == ["tok1", "tok2", "tok3", "tok4"]
    assert c.usage.completion_tokens == 4


def test_chat_streaming(gw):
    stream = client(gw).chat.completions.create(model="echo", max_tokens=3, stream=True,
                                                messages=[{"role": "user", "content": "hi"}])
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert text.split() == ["tok1", "tok2", "tok3"]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)


def test_sse_headers_and_framing(gw):
    st, hdr, body = http_post(gw.base + "/v1/completions",
                              {"model": "echo", "prompt": "x", "max_tokens": 2, "stream": True})
    assert st == 200
    assert hdr["Content-Type"] == "text/event-stream"
    assert hdr["Cache-Control"] == "no-cache"
    assert hdr["X-Accel-Buffering"] == "no"
    events = body.decode().split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for e in events[:-2]:
        assert e.startswith("data: {") or e.startswith(":")


def error_of(status, body):
    e = json.loads(body)["error"]
    assert set(e) >= {"message", "type", "param", "code"}
    return e


def test_bad_json_is_400(gw):
    st, _, body = http_post(gw.base + "/v1/completions", b"{not json")
    assert st == 400
    assert "JSON" in error_of(st, body)["message"]


def test_non_object_body_is_400(gw):
    st, _, body = http_post(gw.base + "/v1/completions", b"[1, 2, 3]")
    assert st == 400
    assert "object" in error_of(st, body)["message"]


@pytest.mark.parametrize("field,value", [
    ("max_tokens", "ten"), ("max_tokens", 1.5), ("max_tokens", 0), ("temperature", "hot"),
    ("temperature", 5), ("stream", "yes"), ("stop", 3), ("stop", ["a", 1]), ("prompt", 7),
    ("prompt", {"a": 1}), ("prompt", [1, "x"]), ("model", 12), ("seed", "s"), ("n", 0), ("top_p", 2),
    ("stream_options", "x"), ("spillway", {"priority": "urgent"}), ("prompt", ""),
    ("model", "has space"), ("model", "m" * 200), ("stop", "s" * 2000),
])
def test_wrong_types_are_400(gw, field, value):
    body = {"model": "echo", "prompt": "hi", "max_tokens": 3, field: value}
    st, _, out = http_post(gw.base + "/v1/completions", body)
    assert st == 400, out
    e = error_of(st, out)
    assert e["type"] == "invalid_request_error"
    assert e["param"] == field or (field == "spillway" and e["param"].startswith("spillway"))


def test_chat_bad_messages_are_400(gw):
    for msgs in ([], "hi", [{"content": "no role"}], [{"role": "user", "content": 5}],
                 [{"role": "a role with spaces", "content": "x"}]):
        st, _, out = http_post(gw.base + "/v1/chat/completions", {"model": "echo", "messages": msgs})
        assert st == 400, (msgs, out)
        assert error_of(st, out)["param"] == "messages"


def test_unknown_model_is_404(gw):
    with pytest.raises(openai.NotFoundError) as ei:
        client(gw).completions.create(model="no-such-model", prompt="x")
    assert ei.value.status_code == 404
    st, _, out = http_post(gw.base + "/v1/chat/completions",
                           {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
    assert st == 404 and error_of(st, out)["code"] == "model_not_found"


def test_routed_model_without_worker_is_503_with_retry_after(gw):
    st, hdr, out = http_post(gw.base + "/v1/completions", {"model": "routed-but-absent", "prompt": "x"})
    assert st == 503
    assert int(hdr["Retry-After"]) >= 1
    assert error_of(st, out)["type"] == "server_error"


def test_oversized_body_is_413(gw):
    big = json.dumps({"model": "echo", "prompt": "a" * (2 << 20)}).encode()
    st, _, out = http_post(gw.base + "/v1/completions", big)
    assert st == 413
    error_of(st, out)
    # and the gateway still serves
    assert client(gw).completions.create(model="echo", prompt="x", max_tokens=1).choices


def test_wrong_method_and_path(gw):
    import urllib.request
    import urllib.error
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(gw.base + "/v1/completions")
    assert ei.value.code == 405 and ei.value.headers["Allow"] == "POST"
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(gw.base + "/v2/nothing")
    assert ei.value.code == 404


def test_garbage_zmq_frames_do_not_hurt(gw):
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(gw.worker_ep)
    s.send(b"\xff\xfe garbage that is no protobuf \x00\x01")
    s.send(b"")
    s.send_multipart([b"two", b"frames"])
    s.send(bytes(range(256)) * 64)
    time.sleep(0.5)
    s.close()
    ctx.term()
    assert gw.gateway.alive()
    assert "invalid frame" in gw.gateway.output()
    c = client(gw).completions.create(model="echo", prompt="x", max_tokens=2)
    assert c.choices[0].finish_reason == "length"


def test_metrics_exposition(gw):
    client(gw).completions.create(model="echo", prompt="x", max_tokens=2)
    st, body = http_get(gw.base + "/metrics")
    text = body.decode()
    assert st == 200
    from prometheus_client.parser import text_string_to_metric_families
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("spillway_requests", "spillway_inflight", "spillway_queue_depth",
                 "spillway_overflow", "spillway_workers", "spillway_gateway_added_latency_seconds"):
        assert name in fams, name
    ok = [s for s in fams["spillway_requests"].samples
          if s.labels.get("pool") == "gpu-pool" and s.labels.get("status") == "ok"]
    assert ok and ok[0].value >= 1
    hist = [s for s in fams["spillway_gateway_added_latency_seconds"].samples
            if s.name.endswith("_count") and s.labels["stage"] == "dispatch"]
    assert hist[0].value >= 1
    pools = {s.labels["pool"] for s in fams["spillway_inflight"].samples}
    assert pools <= {"gpu-pool", "cpu-pool", "none", "other"}
    # token counters: the echo worker reports usage, without a prefix cache
    tok = {n: sum(s.value for s in fams[n].samples if s.labels.get("pool") == "gpu-pool")
           for n in ("spillway_completion_tokens", "spillway_prompt_tokens", "spillway_prompt_tokens_cached")}
    assert tok["spillway_completion_tokens"] >= 2 and tok["spillway_prompt_tokens"] >= 1, tok
    assert tok["spillway_prompt_tokens_cached"] == 0, tok


def test_headers_never_buffered_stream_keepalive(gw):
    """A stream waiting for its first token gets `: keep-alive` comments."""
    slow = start_echo(gw, pool="cpu-pool", model="slow", rate=1)
    gw.wait_model("slow")
    sk = socket.create_connection(("127.0.0.1", gw.http_port))
    body = json.dumps({"model": "slow", "prompt": "x", "max_tokens": 2, "stream": True}).encode()
    sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body) + body)
    sk.settimeout(5)
    got = b""
    t0 = time.monotonic()
    while b": keep-alive" not in got and time.monotonic() - t0 < 3:
        got += sk.recv(4096)
    sk.close()
    assert b": keep-alive" in got
    assert slow.alive()


def test_invalid_utf8_is_400_not_a_hang(gw):
    for raw in (b'{"model":"echo","prompt":"a\xff\xfeb","max_tokens":2}',
                b'{"model":"echo","prompt":"ok","stop":["\xc0\xaf"]}',
                b'{"model":"echo","prompt":"\xed\xa0\x80"}'):           # an encoded surrogate
        st, _, out = http_post(gw.base + "/v1/completions", raw, timeout=5)
        assert st == 400, out
        assert "UTF-8" in error_of(st, out)["message"]
    st, _, out = http_post(gw.base + "/v1/completions",
                           {"model": "echo", "prompt": "caf\u00e9 \U0001F600", "max_tokens": 2}, timeout=5)
    assert st == 200, out


def test_admin_status_and_workers(gw):
    st, body = gw.admin_get("/admin/status")
    doc = json.loads(body)
    assert st == 200
    pools = {p["name"]: p for p in doc["pools"]}
    assert pools["gpu-pool"]["workers"] == 1 and pools["gpu-pool"]["kind"] == "gpu"
    assert pools["cpu-pool"]["workers"] == 0
    assert doc["workers"][0]["pool"] == "gpu-pool"
    ws = gw.workers()
    assert ws[0]["models"][0]["name"] == "echo" and ws[0]["alive"] is True
    assert ws[0]["slots"] >= 1
