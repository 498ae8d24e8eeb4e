"""Every request limit of llm/limits.h, at the HTTP front door.

The numbers are read from the header itself, so this test follows the one
place they are defined. For each limit the HTTP API exposes: a request just
over it gets a 400 in OpenAI's error shape naming the field in `param`, and
a request exactly at it is served (200), end to end through a worker. The
real engine (stories260K, or a scripted chatml model that renders tools and
calls) serves every case it can; the echo worker serves the two the engine
would turn away for reasons of its own: 4096 messages overflow a small
model's context, and 1024 distinct bias ids exceed either model's vocabulary
(which the worker checks).
"""
import json
import re

import pytest

from conftest import ROOT, Cluster, free_port, http_post, shared_file
from scripted import scripted_model


def read_limits(path=ROOT / "llm" / "limits.h"):
    """{name: value} of the header's #defines (integers, and floats with f)."""
    out = {}
    for m in re.finditer(r"^#define\s+(SW_\w+)\s+(.+?)\s*(?:/\*.*)?$", path.read_text(), re.M):
        expr = re.sub(r"(\d)[uU]\b", r"\1", m.group(2))
        expr = re.sub(r"(\d\.\d*)[fF]\b", r"\1", expr)
        if re.fullmatch(r"[\d\s()<>.+*-]+", expr):
            out[m.group(1)] = eval(expr, {"__builtins__": {}})
    return out


L = read_limits()
POLICY = "routes:\n" + "".join(f"  - model: {m}\n    target: cpu-pool\n" for m in ("echo", "stories", "tools"))
ASK = [{"role": "user", "content": "Once upon a time"}]


def test_the_header_is_read():
    for name in ("SW_MAX_TOKENS_PER_REQUEST", "SW_MAX_MESSAGES", "SW_MAX_ROLE_LEN", "SW_MAX_STOPS",
                 "SW_MAX_STOP_LEN", "SW_MAX_TOP_LOGPROBS", "SW_MAX_LOGIT_BIAS", "SW_MAX_LOGIT_BIAS_VALUE",
                 "SW_MAX_TOOLS", "SW_MAX_TOOL_CALLS", "SW_MAX_TOOL_NAME", "SW_MAX_SCHEMA_LEN", "SW_MAX_PENALTY"):
        assert isinstance(L.get(name), (int, float)), (name, L)


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    """One gateway for the module: an echo worker, stories260K and a scripted
    chatml model that knows tool calls, all in one CPU pool."""
    stories = shared_file("models/stories260K.gguf")
    tmp = tmp_path_factory.mktemp("limits")
    c = Cluster(tmp)
    try:
        c.start_gateway(POLICY)
        c.start_echo("cpu-pool", 5000, ["--parallel", "4"], model_name="echo")
        c.start_worker("cpu-pool", "stories", stories, ["--threads", "1", "--parallel", "2", "--ctx", "128"],
                       name="stories")   # a short context: max_tokens at its bound ends there
        tools = scripted_model(tmp / "tools.gguf", "chatml", ["\u010a", "The", "\u0120answer", "<|im_end|>"])
        c.start_worker("cpu-pool", "tools", tools, ["--threads", "1", "--parallel", "2", "--ctx", "16384"],
                       name="tools")
        for m in ("echo", "stories", "tools"):
            c.wait_model(m, timeout=60)
        yield c
    finally:
        c.close()


def post(c, path="/v1/chat/completions", **body):
    st, _, raw = http_post(c.base + path, body, timeout=120)
    try:
        return st, json.loads(raw)
    except ValueError:
        return st, {"raw": raw[:500]}


def refused(c, param, path="/v1/chat/completions", **body):
    """Asserts a 400 in the OpenAI error shape with this param."""
    st, r = post(c, path, **body)
    assert st == 400, (st, str(r)[:500])
    e = r.get("error")
    assert isinstance(e, dict) and set(e) >= {"message", "type", "param", "code"}, r
    assert e["type"] == "invalid_request_error" and isinstance(e["message"], str) and e["message"], r
    assert e["param"] == param, r
    return e


def served(c, path="/v1/chat/completions", **body):
    st, r = post(c, path, **body)
    assert st == 200, (st, str(r)[:800])
    assert r["choices"], r
    return r


def chat(model="stories", **kw):
    return dict(dict(model=model, messages=ASK, max_tokens=4, temperature=0), **kw)


def stops(n, length=None):
    """n distinct ASCII stop strings the model will not write, each of
    `length` bytes when given."""
    return [f"<stop{i}>" + "q" * (length - len(f"<stop{i}>")) if length else f"<stop{i}>" for i in range(n)]


# ---- stop ----------------------------------------------------------------

def test_stop_count_over(gw):
    refused(gw, "stop", **chat(stop=stops(L["SW_MAX_STOPS"] + 1)))


def test_stop_count_at(gw):
    served(gw, **chat(stop=stops(L["SW_MAX_STOPS"])))


def test_stop_length_over(gw):
    refused(gw, "stop", **chat(stop="s" * (L["SW_MAX_STOP_LEN"] + 1)))
    refused(gw, "stop", **chat(stop=["end", "s" * (L["SW_MAX_STOP_LEN"] + 1)]))


def test_stop_length_at(gw):
    long_stop = stops(1, L["SW_MAX_STOP_LEN"])[0]
    assert len(long_stop.encode()) == L["SW_MAX_STOP_LEN"]
    served(gw, **chat(stop=long_stop))
    served(gw, **chat(stop=stops(L["SW_MAX_STOPS"], L["SW_MAX_STOP_LEN"])))


def test_stop_length_at_completions(gw):
    served(gw, "/v1/completions", model="stories", prompt="Once", max_tokens=4,
           stop=stops(L["SW_MAX_STOPS"], L["SW_MAX_STOP_LEN"]))


# ---- max_tokens ------------------------------------------------------------

def test_max_tokens_over(gw):
    refused(gw, "max_tokens", **chat(max_tokens=L["SW_MAX_TOKENS_PER_REQUEST"] + 1))
    refused(gw, "max_tokens", "/v1/completions", model="stories", prompt="Once",
            max_tokens=L["SW_MAX_TOKENS_PER_REQUEST"] + 1)
    refused(gw, "max_completion_tokens", **chat(max_completion_tokens=L["SW_MAX_TOKENS_PER_REQUEST"] + 1))


def test_max_tokens_at(gw):
    """The real engine takes the bound and ends at its context instead."""
    r = served(gw, **chat(max_tokens=L["SW_MAX_TOKENS_PER_REQUEST"]))
    assert r["choices"][0]["finish_reason"] in ("length", "stop"), r
    served(gw, **chat(max_completion_tokens=L["SW_MAX_TOKENS_PER_REQUEST"]))


# ---- messages and roles ------------------------------------------------------

def test_messages_over(gw):
    refused(gw, "messages", **chat("echo", messages=[{"role": "user", "content": "x"}] * (L["SW_MAX_MESSAGES"] + 1)))


def test_messages_at(gw):
    served(gw, **chat("echo", messages=[{"role": "user", "content": "x"}] * L["SW_MAX_MESSAGES"]))


def test_role_over(gw):
    refused(gw, "messages", **chat(messages=[{"role": "r" * (L["SW_MAX_ROLE_LEN"] + 1), "content": "hi"}]))


def test_role_at(gw):
    served(gw, **chat(messages=[{"role": "r" * L["SW_MAX_ROLE_LEN"], "content": "hi"}] + ASK))


# ---- logprobs ----------------------------------------------------------------

def test_top_logprobs_over(gw):
    refused(gw, "top_logprobs", **chat(logprobs=True, top_logprobs=L["SW_MAX_TOP_LOGPROBS"] + 1))
    refused(gw, "logprobs", "/v1/completions", model="stories", prompt="Once", max_tokens=2,
            logprobs=L["SW_MAX_TOP_LOGPROBS"] + 1)


def test_top_logprobs_at(gw):
    n = L["SW_MAX_TOP_LOGPROBS"]
    r = served(gw, **chat(logprobs=True, top_logprobs=n))
    content = r["choices"][0]["logprobs"]["content"]
    assert content and all(len(t["top_logprobs"]) == n for t in content), content[:1]
    r = served(gw, "/v1/completions", model="stories", prompt="Once", max_tokens=2, logprobs=n)
    assert all(len(t) == n for t in r["choices"][0]["logprobs"]["top_logprobs"]), r


# ---- logit_bias --------------------------------------------------------------

def test_logit_bias_count_over(gw):
    refused(gw, "logit_bias", **chat("echo", logit_bias={str(i): 1 for i in range(L["SW_MAX_LOGIT_BIAS"] + 1)}))


def test_logit_bias_count_at(gw):
    served(gw, **chat("echo", logit_bias={str(i): 1 for i in range(L["SW_MAX_LOGIT_BIAS"])}))


def test_logit_bias_value_over(gw):
    v = L["SW_MAX_LOGIT_BIAS_VALUE"]
    refused(gw, "logit_bias", **chat(logit_bias={"5": v + 0.5}))
    refused(gw, "logit_bias", **chat(logit_bias={"5": -v - 1}))


def test_logit_bias_value_at(gw):
    v = L["SW_MAX_LOGIT_BIAS_VALUE"]
    served(gw, **chat(logit_bias={"5": v, "6": -v}))


# ---- penalties (the HTTP range is the header's) -----------------------------------

@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
def test_penalty_over(gw, field):
    p = L["SW_MAX_PENALTY"]
    refused(gw, field, **chat(**{field: p + 0.01}))
    refused(gw, field, **chat(**{field: -p - 0.01}))


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
def test_penalty_at(gw, field):
    p = L["SW_MAX_PENALTY"]
    served(gw, **chat(**{field: p}))
    served(gw, **chat(**{field: -p}))


# ---- tools -------------------------------------------------------------------

def tool(name):
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def test_tools_count_over(gw):
    refused(gw, "tools", **chat("tools", tools=[tool(f"f{i}") for i in range(L["SW_MAX_TOOLS"] + 1)]))


def test_tools_count_at(gw):
    served(gw, **chat("tools", tools=[tool(f"f{i}") for i in range(L["SW_MAX_TOOLS"])]))


def test_tool_name_over(gw):
    refused(gw, "tools", **chat("tools", tools=[tool("f" * (L["SW_MAX_TOOL_NAME"] + 1))]))


def test_tool_name_at(gw):
    served(gw, **chat("tools", tools=[tool("f" * L["SW_MAX_TOOL_NAME"])]))


def calls(n):
    return [{"id": f"call_{i}", "type": "function", "function": {"name": f"f{i}", "arguments": "{}"}}
            for i in range(n)]


def test_tool_calls_over(gw):
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": calls(L["SW_MAX_TOOL_CALLS"] + 1)}]
    refused(gw, "messages", **chat("echo", messages=msgs))


def test_tool_calls_at(gw):
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": calls(L["SW_MAX_TOOL_CALLS"])},
                  {"role": "user", "content": "and?"}]
    served(gw, **chat("tools", messages=msgs))


# ---- response_format ---------------------------------------------------------

def schema_of_len(n):
    """A schema whose compact JSON (as the gateway measures it) is n bytes."""
    head = {"type": "string", "description": ""}
    pad = n - len(json.dumps(head, separators=(",", ":")))
    s = {"type": "string", "description": "d" * pad}
    assert len(json.dumps(s, separators=(",", ":"))) == n
    return s


def fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def test_schema_over(gw):
    refused(gw, "response_format", **chat(response_format=fmt(schema_of_len(L["SW_MAX_SCHEMA_LEN"] + 1))))


def test_schema_at(gw):
    served(gw, **chat(response_format=fmt(schema_of_len(L["SW_MAX_SCHEMA_LEN"]))))


# ---- the gateway keeps serving after all that ------------------------------------

def test_still_serving(gw):
    served(gw, **chat())
    assert gw.gateway.alive()


# ---- no silent truncation: a NUL anywhere in a body is refused -----------
# (cJSON would decode "\u0000" into a C string that ends there, and the text
# after it would be dropped; the gateway reads the raw text first)

@pytest.mark.parametrize("body,param", [
    (dict(model="stories", prompt="Once upon\u0000 a time", max_tokens=2), "prompt"),
    (chat(messages=[{"role": "user", "content": "Once\u0000 upon"}]), "messages[0].content"),
    (chat(messages=[{"role": "system", "content": "Be brief"},
                    {"role": "user", "content": [{"type": "text", "text": "a\u0000b"}]}]),
     "messages[1].content[0].text"),
    (chat(stop=["<a>", "<b\u0000>"]), "stop[1]"),
])
def test_nul_is_refused_with_its_path(gw, body, param):
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    e = refused(gw, param, path=path, **body)
    assert "NUL" in e["message"], e


def test_nul_in_a_raw_body_byte_is_refused(gw):
    raw = json.dumps(chat()).encode().replace(b"Once upon", b"Once\x00upon")
    st, _, body = http_post(gw.base + "/v1/chat/completions", raw, timeout=60)
    e = json.loads(body)["error"]
    assert st == 400 and e["param"] == "messages[0].content", e


def test_escaped_backslash_before_u0000_text_is_served(gw):
    """"\\u0000" is a backslash and the text u0000: no NUL, so it is served."""
    served(gw, **chat(messages=[{"role": "user", "content": "path C:\\u0000 here"}]))


def nested(depth):
    """A body whose metadata nests `depth` levels below the top object."""
    inner = "1"
    for _ in range(depth - 1):
        inner = "[" + inner + "]"
    return json.dumps(chat())[:-1].encode() + b', "metadata": {"x": ' + inner.encode() + b"}}"


def test_nesting_depth_at_and_over(gw):
    lim = L["SW_MAX_JSON_DEPTH"]
    # The top object is level 1 and metadata level 2: lim - 1 more levels fit.
    st, _, body = http_post(gw.base + "/v1/chat/completions", nested(lim - 2), timeout=60)
    assert st != 400 or "deeper" not in body.decode(), body[:300]
    st, _, body = http_post(gw.base + "/v1/chat/completions", nested(lim), timeout=60)
    e = json.loads(body)["error"]
    assert st == 400 and "deeper than" in e["message"] and e["param"] is None, e


def test_n_over(gw):
    refused(gw, "n", **chat(n=L["SW_MAX_CHOICES"] + 1))
