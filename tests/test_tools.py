"""Tool calling (OpenAI's tools and tool_calls) through the real gateway and
CPU worker, on scripted models (tests/scripted.py) with Qwen3's chatml
format, gpt-oss's harmony and Llama 3.1's: the definitions reach the
prompt, a call in the output (a <tool_call> span; a commentary message to a
function; an answer that is the call's JSON) comes
back as a call (streamed or not) with finish_reason "tool_calls", a span
that is not a call stays text, and the next turn carries the call and its
result back."""

import json
import subprocess

import openai
import pytest

from conftest import bin_path, cpu_pool_policy, free_port, http_post
from scripted import (CALL, GET_WEATHER, HARMONY_ARGS, HARMONY_TO, LLAMA_CALL, LLAMA_CALL2, MISTRAL_CALLS, NL,
                      NOT_A_CALL, scripted_model)

SCRIPTS = {
    # Qwen3-style: it thinks, then calls
    "tools": [NL, "<think>", "Let", "\u0120me", "\u0120think", "</think>", NL + NL, "<tool_call>", CALL,
              "</tool_call>", "<|im_end|>"],
    "tools-bad": [NL, "<tool_call>", NOT_A_CALL, "</tool_call>", "<|im_end|>"],
    "r1": [NL, "The", "<\uff5cend\u2581of\u2581sentence\uff5c>"],
    # gpt-oss: "<|start|>assistant" (the prompt) " to=functions.get_weather<|channel|>commentary<|message|>{...}<|call|>"
    "gpt-oss": ["t", HARMONY_TO, "<|channel|>", "commentary", "<|message|>", HARMONY_ARGS, "<|call|>"],
    # Llama 3.1: the answer is the call's JSON
    "llama": [NL, LLAMA_CALL, "<|eot_id|>"],
    # models that answer in words: tool_choice must make them call
    "chat": [NL, "The", "\u0120answer", "<|im_end|>"],
    "llama-text": [NL, "The", "<|eot_id|>"],
    # two calls (Llama 3.1's ";" between them); a call, then words
    "llama-two": [NL, LLAMA_CALL, ";", LLAMA_CALL2, "<|eot_id|>"],
    "call-talk": [NL, "<tool_call>", CALL, "</tool_call>", "The", "<|im_end|>"],
    # Mistral: [TOOL_CALLS] and a JSON array (v3-v7), or name[ARGS]{...} (v11); one that answers in words
    "mistral": ["[/INST]", "[TOOL_CALLS]", MISTRAL_CALLS, "</s>"],
    "mistral-v11": ["[/INST]", "[TOOL_CALLS]", GET_WEATHER, "[ARGS]", HARMONY_ARGS, "</s>"],
    "mistral-text": ["[/INST]", "The", "</s>"],
}
TEMPLATE = {"tools": "chatml", "tools-bad": "chatml", "r1": "r1", "gpt-oss": "harmony", "llama": "llama3",
            "chat": "chatml", "llama-text": "llama3", "llama-two": "llama3", "call-talk": "chatml",
            "mistral": "mistral", "mistral-v11": "mistral", "mistral-text": "mistral"}

POLICY = cpu_pool_policy(*SCRIPTS)

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, for some days.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
def served(tmp_path, cluster):
    cluster.sdk_ep = f"tcp://127.0.0.1:{free_port()}"
    cluster.start_gateway(POLICY, extra_args=["--sdk", cluster.sdk_ep])
    for name, script in SCRIPTS.items():
        cluster.start_worker("cpu-pool", name, scripted_model(tmp_path / f"{name}.gguf", TEMPLATE[name], script),
                             ["--threads", "1", "--parallel", "2", "--ctx", "4096"], name=name)
    for name in SCRIPTS:
        cluster.wait_model(name, timeout=60)
    return cluster


def client(c):
    return openai.OpenAI(base_url=c.base + "/v1", api_key="x", max_retries=0, timeout=60)


def post(c, **body):
    body = dict(dict(model="tools", messages=ASK, max_tokens=32, temperature=0), **body)
    st, _, raw = http_post(c.base + "/v1/chat/completions", body)
    return st, json.loads(raw)


def test_call_comes_back_as_tool_calls(served):
    r = client(served).chat.completions.create(model="tools", messages=ASK, tools=WEATHER, max_tokens=32,
                                               temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content is None
    assert ch.message.model_extra["reasoning_content"] == "Let me think"
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    # the arguments as Python's json.dumps writes them, as vLLM and SGLang give them
    assert call.function.arguments == '{"city": "Paris", "days": 2}'


def test_streamed_call(served):
    calls, finish = {}, None
    for ch in client(served).chat.completions.create(model="tools", messages=ASK, tools=WEATHER, max_tokens=32,
                                                     temperature=0, stream=True):
        d = ch.choices[0].delta
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            c["id"] = tc.id or c["id"]
            c["name"] += tc.function.name or ""
            c["arguments"] += tc.function.arguments or ""
        assert not (d.content or "").strip(), "the call's text is not content"
        finish = ch.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 2}


def test_without_tools_the_span_is_text(served):
    """No tools offered (or tool_choice "none"): what the model writes stays
    its answer, and the prompt is the one without the definitions."""
    st, plain = post(served)
    assert st == 200
    m = plain["choices"][0]["message"]
    assert "tool_calls" not in m and plain["choices"][0]["finish_reason"] == "stop"
    assert m["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    st, none = post(served, tools=WEATHER, tool_choice="none")
    assert st == 200 and none["choices"][0]["message"]["content"] == m["content"]
    assert none["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    st, auto = post(served, tools=WEATHER, tool_choice="auto")
    assert st == 200 and auto["choices"][0]["message"]["tool_calls"]
    # the definitions, one JSON line each, in Qwen's <tools> block (byte tokens: one per byte)
    assert auto["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + len(json.dumps(WEATHER[0]))


def test_a_span_that_is_not_a_call_stays_text(served):
    st, r = post(served, model="tools-bad", tools=WEATHER)
    assert st == 200
    ch = r["choices"][0]
    assert "tool_calls" not in ch["message"] and ch["finish_reason"] == "stop"
    assert ch["message"]["content"] == '<tool_call>\n{"name": 7}\n</tool_call>'


def test_next_turn_carries_the_call_and_its_result(served):
    st, first = post(served, tools=WEATHER)
    assert st == 200
    call = first["choices"][0]["message"]["tool_calls"][0]
    turn = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": call["id"], "content": '{"temp_c": 21}'}]
    st, second = post(served, tools=WEATHER, messages=turn)
    assert st == 200, second
    grown = second["usage"]["prompt_tokens"] - first["usage"]["prompt_tokens"]
    # at least the call and the result, as bytes, came back into the prompt
    assert grown > len(call["function"]["arguments"]) + len('{"temp_c": 21}'), grown


@pytest.mark.parametrize("body, param", [
    (dict(tools=WEATHER, tool_choice={"type": "function", "function": {"name": "get_time"}}), "tool_choice"),
    (dict(tools=WEATHER, tool_choice="always"), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"description": "no name"}}]), "tools"),
    (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]), "tools"),
    (dict(tools=[{"type": "retrieval"}]), "tools"),
    (dict(tools={"type": "function"}), "tools"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]), "tools"),
    (dict(messages=ASK + [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]), "messages"),
    # a forced call whose parameters the worker's decoder cannot enforce, or
    # two functions defining the same $defs entry: the gateway's 400, not the
    # worker's (which had no param)
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"id": {"type": "string", "pattern": "^a"}}}}}],
          tool_choice="required"), "tools"),
    (dict(tools=[{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "$defs": {"z": {"type": "string"}}}}} for n in ("f", "g")],
          tool_choice="required"), "tools"),
])
def test_bad_tools_are_refused(served, body, param):
    st, r = post(served, **body)
    assert st == 400 and r["error"]["param"] == param, r


def test_a_template_without_tool_calls_refuses_tools(served):
    st, r = post(served, model="r1", tools=WEATHER)
    assert st == 400 and "tool-calling" in r["error"]["message"], r
    st, r = post(served, model="r1")   # R1 thinks from its prompt's <think> on
    assert st == 200 and r["choices"][0]["message"]["reasoning_content"] == "The"


def test_sdk_cli_prints_the_call(served, tmp_path):
    """spillway chat --tools FILE: the SDK carries the definitions and gives
    back the call; a file that is not a tools array is refused by the worker."""
    f = tmp_path / "tools.json"
    f.write_text(json.dumps(WEATHER))
    r = subprocess.run([bin_path("spillway"), "chat", "-e", served.sdk_ep, "-m", "tools", "--temp", "0",
                        "--tools", str(f), "Weather in Paris?"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert '[tool_call] get_weather({"city": "Paris", "days": 2})' in r.stdout
    assert "reasoning_tokens=5" in r.stderr
    f.write_text('{"not": "an array"}')
    r = subprocess.run([bin_path("spillway"), "chat", "-e", served.sdk_ep, "-m", "tools", "--tools", str(f), "Hi"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "400" in r.stderr and "tools_json" in r.stderr, r.stderr
    r = subprocess.run([bin_path("spillway"), "chat", "-m", "tools", "--tools", str(tmp_path / "missing"), "Hi"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_gpt_oss_call(served):
    """gpt-oss (harmony): the functions reach the developer message, a
    commentary message to=functions.NAME comes back as the call, and the
    next turn carries the call and the function's answer back."""
    st, plain = post(served, model="gpt-oss")
    assert st == 200 and "tool_calls" not in plain["choices"][0]["message"]   # no tools: nobody's text
    st, r = post(served, model="gpt-oss", tools=WEATHER)
    assert st == 200, r
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and ch["message"]["content"] is None
    (call,) = ch["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}
    # "type get_weather = (_: {" ... in the developer message: far more than the bare prompt
    assert r["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 100
    turn = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    st, second = post(served, model="gpt-oss", tools=WEATHER, messages=turn)
    assert st == 200 and second["usage"]["prompt_tokens"] > r["usage"]["prompt_tokens"] + len("sunny"), second


def test_llama_call(served):
    """Llama 3.1: with tools offered, an answer that is the call's JSON comes
    back as the call (streamed too); without tools it is the answer."""
    st, plain = post(served, model="llama")
    assert st == 200 and plain["choices"][0]["message"]["content"] == (
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}')
    st, r = post(served, model="llama", tools=WEATHER)
    assert st == 200, r
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and ch["message"]["content"] is None
    assert [c["function"] for c in ch["message"]["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}]
    assert r["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + len(json.dumps(WEATHER[0]))
    deltas = []
    for c in client(served).chat.completions.create(model="llama", messages=ASK, tools=WEATHER, max_tokens=32,
                                                    temperature=0, stream=True):
        deltas.append(c.choices[0])
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["tool_calls"]
    assert not "".join(d.delta.content or "" for d in deltas).strip()
    (tc,) = [t for d in deltas for t in d.delta.tool_calls or []]
    assert tc.function.name == "get_weather"


def test_response_format_text_is_accepted(served):
    st, r = post(served, model="r1", response_format={"type": "text"})
    assert st == 200, r


# Bounded parameters, so that a forced call on a model that never calls
# must end within a few tokens.
BOUNDED_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}},
        "required": ["unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"$ref": "#/$defs/zone"}}, "required": ["zone"],
        "$defs": {"zone": {"enum": ["utc", "cet"]}}}}},
]


def check_call(call):
    args = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "get_weather":
        assert args["unit"] in ("c", "f") and set(args) <= {"unit", "days"}, args
        assert isinstance(args.get("days", 0), int), args
    else:
        assert call["function"]["name"] == "get_time" and args == {"zone": args["zone"]} and \
            args["zone"] in ("utc", "cet"), call
    return call["function"]["name"]


@pytest.mark.parametrize("model", ["chat", "llama-text", "tools", "mistral-text"])
def test_tool_choice_forces_a_call(served, model):
    """A model that would answer in words calls the named function, and
    with "required" one of them; a Qwen3-style model calls at once,
    without thinking first."""
    st, free = post(served, model=model, tools=BOUNDED_TOOLS, max_tokens=400)
    assert st == 200, free
    # Mistral's calls are an array, which a model with flat logits could
    # extend forever: one call, with parallel_tool_calls false
    one = dict(parallel_tool_calls=False) if model.startswith("mistral") else {}
    for temp in (0, 1):
        st, r = post(served, model=model, tools=BOUNDED_TOOLS, max_tokens=400, temperature=temp, seed=5,
                     tool_choice={"type": "function", "function": {"name": "get_time"}}, **one)
        assert st == 200 and r["choices"][0]["finish_reason"] == "tool_calls", r["choices"]
        calls = r["choices"][0]["message"]["tool_calls"]
        assert len(calls) == 1 and check_call(calls[0]) == "get_time", calls
        assert not r["choices"][0]["message"].get("content"), r
    names = set()
    for seed in range(4):
        st, r = post(served, model=model, tools=BOUNDED_TOOLS, max_tokens=400, temperature=1, seed=seed,
                     tool_choice="required", **one)
        assert st == 200 and r["choices"][0]["finish_reason"] == "tool_calls", r["choices"]
        names.add(check_call(r["choices"][0]["message"]["tool_calls"][0]))
    assert names <= {"get_weather", "get_time"}


def test_forced_call_streams(served):
    chunks = list(client(served).chat.completions.create(
        model="chat", messages=ASK, tools=BOUNDED_TOOLS, max_tokens=400, temperature=0, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "get_weather"
    args = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(args)["unit"] in ("c", "f")
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["tool_calls"]


def test_harmony_forced_call(served):
    """gpt-oss: the call's header goes into the prompt, the arguments are
    held to the function's parameters, <|call|> ends it. "required" works
    with one function; with several the header would have to choose."""
    for temp in (0, 1):
        st, r = post(served, model="gpt-oss", tools=BOUNDED_TOOLS, max_tokens=400, temperature=temp, seed=2,
                     tool_choice={"type": "function", "function": {"name": "get_time"}})
        assert st == 200 and r["choices"][0]["finish_reason"] == "tool_calls", r["choices"]
        (call,) = r["choices"][0]["message"]["tool_calls"]
        assert check_call(call) == "get_time", call
    # the model's own arguments, when they fit, are kept as written
    st, r = post(served, model="gpt-oss", tools=WEATHER, tool_choice="required")
    assert st == 200 and r["choices"][0]["message"]["tool_calls"][0]["function"] == \
        {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}, r
    st, r = post(served, model="gpt-oss", tools=BOUNDED_TOOLS, tool_choice="required")
    assert st == 400 and "name one" in r["error"]["message"], r


def test_sdk_cli_forces_a_call(served, tmp_path):
    f = tmp_path / "tools.json"
    f.write_text(json.dumps(BOUNDED_TOOLS))
    r = subprocess.run([bin_path("spillway"), "chat", "-e", served.sdk_ep, "-m", "chat", "--temp", "0", "-n", "400",
                        "--tools", str(f), "--tool-choice", "get_time", "What time is it?"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("[tool_call] ")]
    assert len(line) == 1 and line[0].startswith("[tool_call] get_time("), r.stdout
    assert json.loads(line[0][len("[tool_call] get_time("):-1])["zone"] in ("utc", "cet")
    r = subprocess.run([bin_path("spillway"), "chat", "-e", served.sdk_ep, "-m", "chat", "--tools", str(f),
                        "--tool-choice", "get_date", "Hi"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "not among the tools" in r.stderr, r.stderr


def test_parallel_tool_calls_false_keeps_one_call(served):
    """parallel_tool_calls: false ends the turn at the first call: Llama's
    second call is dropped, and chatml's words after the call never come."""
    both = WEATHER + [{"type": "function", "function": {"name": "get_time"}}]
    st, r = post(served, model="llama-two", tools=both)
    assert st == 200 and [c["function"]["name"] for c in r["choices"][0]["message"]["tool_calls"]] == \
        ["get_weather", "get_time"], r
    st, r = post(served, model="llama-two", tools=both, parallel_tool_calls=False)
    calls = r["choices"][0]["message"]["tool_calls"]
    assert st == 200 and [c["function"]["name"] for c in calls] == ["get_weather"], r
    assert r["choices"][0]["finish_reason"] == "tool_calls"
    st, r = post(served, model="call-talk", tools=WEATHER)
    assert st == 200 and r["choices"][0]["message"]["content"] == "The", r
    st, r = post(served, model="call-talk", tools=WEATHER, parallel_tool_calls=False)
    assert st == 200 and not r["choices"][0]["message"]["content"] and r["usage"]["completion_tokens"] == 3, r
    assert r["choices"][0]["finish_reason"] == "tool_calls"
    st, r = post(served, model="call-talk", tools=WEATHER, parallel_tool_calls="no")
    assert st == 400 and r["error"]["param"] == "parallel_tool_calls", r


@pytest.mark.parametrize("model", ["mistral", "mistral-v11"])
def test_mistral_calls(served, model):
    """Mistral: [TOOL_CALLS] and a JSON array, or v11's name[ARGS]{...},
    come back as the call; the definitions went into the prompt, and the
    next turn carries the call and its result back."""
    st, plain = post(served, model=model)
    st, r = post(served, model=model, tools=WEATHER)
    assert st == 200 and r["choices"][0]["finish_reason"] == "tool_calls", r
    (call,) = r["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}
    assert r["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + len(json.dumps(WEATHER)) - 10
    turn = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "tool_call_id": call["id"], "content": "21 degrees"}]
    st, second = post(served, model=model, tools=WEATHER, messages=turn)
    assert st == 200, second
    grown = second["usage"]["prompt_tokens"] - r["usage"]["prompt_tokens"]
    assert grown > len(call["function"]["arguments"]) + len('{"content": "21 degrees"}'), grown
    st, r = post(served, model=model)   # without tools the marker is nobody's text
    assert st == 200 and "tool_calls" not in r["choices"][0]["message"], r
