"""OpenAI's Responses API (POST /v1/responses, stateless) through the real
gateway and CPU worker, driven by the official openai client: text and
reasoning items, streamed events (their order, numbering and that the
deltas make the final text), instructions, forced and model-made function
calls and their outputs sent back, JSON-schema output and the SDK's
responses.parse with a Pydantic model, max_output_tokens cutting a response
short, and the fields that need stored state or built-in tools refused.

The models are scripted (tests/scripted.py): real GGUF files whose greedy
output is fixed, with chatml templates that know tools and <think>."""

import json

import jsonschema
import openai
import pydantic
import pytest

from conftest import Cluster, cpu_pool_policy, http_post
from scripted import CALL, JSON_ANSWER, NL, scripted_model

THOUGHT = ["Let", "\u0120me", "\u0120think", "."]
ANSWER = ["The", "\u0120answer", "\u0120is", "\u0120four", "!"]
SCRIPTS = {
    "think": [NL, "<think>", *THOUGHT, "</think>", NL + NL, *ANSWER, "<|im_end|>"],
    "chat": [NL, "The", "\u0120answer", "<|im_end|>"],
    "json": [NL, JSON_ANSWER, "\u0120answer", "<|im_end|>"],
    "call": [NL, "<tool_call>", CALL, "</tool_call>", "<|im_end|>"],
}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city, for some days.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                          "required": ["city"], "additionalProperties": False}, "strict": False}
# Bounded parameters: a forced call on a model that never calls must end within a few tokens
UNIT = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}},
    "required": ["unit"], "additionalProperties": False}}
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"], "additionalProperties": False}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("responses")
    c = Cluster(tmp)
    try:
        c.start_gateway(cpu_pool_policy(*SCRIPTS))
        for name, script in SCRIPTS.items():
            c.start_worker("cpu-pool", name, scripted_model(tmp / f"{name}.gguf", "chatml", script),
                           ["--threads", "1", "--parallel", "2", "--ctx", "4096"], name=name)
        for name in SCRIPTS:
            c.wait_model(name, timeout=60)
        yield c
    finally:
        c.close()


def client(c):
    return openai.OpenAI(base_url=c.base + "/v1", api_key="x", max_retries=0, timeout=60)


def post(c, path="/v1/responses", **body):
    st, headers, raw = http_post(c.base + path, body)
    return st, headers, raw


def test_text_and_reasoning(gw):
    r = client(gw).responses.create(model="think", input="Hi", max_output_tokens=32, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].type == "reasoning_text" and r.output[0].content[0].text == "Let me think."
    msg = r.output[1]
    assert msg.role == "assistant" and msg.status == "completed" and msg.id.startswith("msg_")
    assert msg.content[0].type == "output_text" and msg.content[0].annotations == []
    assert r.output_text == "The answer is four!"
    u = r.usage
    assert u.output_tokens == 13 and u.output_tokens_details.reasoning_tokens == 6
    assert u.total_tokens == u.input_tokens + u.output_tokens and u.input_tokens_details.cached_tokens >= 0
    assert r.store is False and r.temperature == 0 and r.max_output_tokens == 32 and r.error is None
    assert r.tools == [] and r.tool_choice == "auto" and r.text.format.type == "text"
    again = client(gw).responses.create(model="think", input="Hi", max_output_tokens=32, temperature=0,
                                        reasoning={"effort": "low"}, metadata={"run": "7"}, user="u1")
    assert again.reasoning.effort == "low" and again.metadata == {"run": "7"} and again.user == "u1"
    assert again.output_text == r.output_text


def chat_prompt_tokens(c, messages, **extra):
    st, _, raw = post(c, "/v1/chat/completions", model="chat", messages=messages, max_tokens=4, **extra)
    assert st == 200, raw
    return json.loads(raw)["usage"]["prompt_tokens"]


def test_instructions_and_roles_reach_the_prompt(gw):
    """instructions are a system message ahead of the input, a developer
    message is one too: the prompt is chat's for the same messages."""
    c = client(gw)
    plain = c.responses.create(model="chat", input="Hi", max_output_tokens=4)
    told = c.responses.create(model="chat", input="Hi", instructions="Answer in French.", max_output_tokens=4)
    dev = c.responses.create(model="chat", max_output_tokens=4, input=[
        {"role": "developer", "content": "Answer in French."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}])
    chat = chat_prompt_tokens(gw, [{"role": "system", "content": "Answer in French."},
                                   {"role": "user", "content": "Hi"}])
    assert plain.usage.input_tokens == chat_prompt_tokens(gw, [{"role": "user", "content": "Hi"}])
    assert told.usage.input_tokens == dev.usage.input_tokens == chat > plain.usage.input_tokens
    assert told.instructions == "Answer in French." and plain.instructions is None


def test_stream_events(gw):
    events = list(client(gw).responses.create(model="think", input="Hi", max_output_tokens=32, temperature=0,
                                               stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert text == final.output_text == "The answer is four!" and thought == "Let me think."
    done = [e.text for e in events if e.type == "response.output_text.done"]
    assert done == [text]
    first_text = types.index("response.output_text.delta")
    assert "response.reasoning_text.delta" not in types[first_text:]
    assert types.count("response.output_item.added") == types.count("response.output_item.done") == 2
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert added == [o.id for o in final.output]
    assert final.usage.output_tokens_details.reasoning_tokens == 6


def test_stream_helper_and_raw_wire(gw):
    """The SDK's accumulating stream helper (which checks the items' ids and
    indexes) ends with the same response; on the wire each data line has its
    event line, and there is no [DONE]."""
    with client(gw).responses.stream(model="think", input="Hi", max_output_tokens=32, temperature=0) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    assert final.output_text == "The answer is four!"
    st, headers, raw = post(gw, model="chat", input="Hi", max_output_tokens=8, stream=True)
    assert st == 200 and headers["Content-Type"] == "text/event-stream"
    blocks = [b for b in raw.decode().split("\n\n") if b.strip() and not b.startswith(":")]
    for b in blocks:
        ev, data = b.split("\n")
        assert ev.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[6:])["type"] == ev[7:]
    assert "[DONE]" not in raw.decode()


def test_forced_function_call(gw):
    """A model that answers in words, made to call the named function: a
    function_call item whose arguments are JSON for the parameters."""
    c = client(gw)
    ask = dict(model="chat", input="Weather in Paris?", tools=[UNIT], max_output_tokens=400, temperature=0)
    r = c.responses.create(**ask, tool_choice={"type": "function", "name": "get_weather"})
    assert r.status == "completed", r
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    assert [o.type for o in r.output] == ["function_call"]
    jsonschema.validate(json.loads(calls[0].arguments), UNIT["parameters"])
    assert r.tools[0].name == "get_weather" and r.tool_choice.name == "get_weather"
    events = list(c.responses.create(**ask, tool_choice="required", stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == deltas and done[0].name == "get_weather"
    jsonschema.validate(json.loads(deltas), UNIT["parameters"])
    final = events[-1].response
    assert events[-1].type == "response.completed"
    assert [o.type for o in final.output] == ["function_call"] and final.output[0].arguments == deltas


def test_call_and_its_output_round_trip(gw):
    """The model's own call (its <tool_call> span), then the next turn with
    the call and its result as input items: the prompt is chat's for the
    same assistant call and tool message."""
    c = client(gw)
    first = c.responses.create(model="call", input="Weather in Paris?", tools=[WEATHER], max_output_tokens=64)
    call = next(o for o in first.output if o.type == "function_call")
    assert json.loads(call.arguments) == {"city": "Paris", "days": 2}
    turn = [{"role": "user", "content": "Weather in Paris?"}, call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    second = c.responses.create(model="chat", input=turn, tools=[WEATHER], max_output_tokens=4)
    assert second.status == "completed" and second.output_text == "The answer"
    chat_tools = [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
    chat = chat_prompt_tokens(gw, [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}], tools=chat_tools)
    assert second.usage.input_tokens == chat > first.usage.input_tokens


def test_json_schema_output(gw):
    c = client(gw)
    free = c.responses.create(model="json", input="Weather?", max_output_tokens=8)
    assert free.output_text == '{"city": "Paris", "days": 2} answer'
    fmt = {"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}}
    r = c.responses.create(model="json", input="Weather?", max_output_tokens=8, text=fmt)
    jsonschema.validate(json.loads(r.output_text), CITY)
    assert r.output_text == '{"city": "Paris", "days": 2}' and r.text.format.name == "city"
    r = c.responses.create(model="json", input="Weather?", max_output_tokens=8, text={"format": {"type": "json_object"}})
    assert json.loads(r.output_text) == {"city": "Paris", "days": 2}


class City(pydantic.BaseModel):
    city: str
    days: int


def test_sdk_parse_with_pydantic(gw):
    r = client(gw).responses.parse(model="json", input="Weather?", max_output_tokens=8, text_format=City)
    assert r.output_parsed == City(city="Paris", days=2)


def test_max_output_tokens_is_incomplete(gw):
    c = client(gw)
    r = c.responses.create(model="think", input="Hi", max_output_tokens=9)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 9 and r.output_text == "The answer"
    events = list(c.responses.create(model="think", input="Hi", max_output_tokens=9, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "The answer"


@pytest.mark.parametrize("extra, param", [
    (dict(previous_response_id="resp_123"), "previous_response_id"),
    (dict(store=True), "store"),
    (dict(background=True), "background"),
    (dict(conversation="conv_1"), "conversation"),
    (dict(frobnicate=1), "frobnicate"),
    (dict(input=[{"type": "item_reference", "id": "msg_1"}]), "input[0].type"),
    (dict(input=[{"role": "robot", "content": "Hi"}]), "input[0].role"),
    (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
     "input[0].content[0].type"),
    (dict(input=[{"type": "function_call_output", "output": "x"}]), "input[0].call_id"),
    (dict(input=[{"role": "user", "content": "Hi", "name": "x"}]), "input[0].name"),
    (dict(input=[]), "input"),
    (dict(input=None), "input"),
    (dict(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
    (dict(tools=[{"type": "web_search"}]), "tools"),
    (dict(tools=[{"type": "file_search", "vector_store_ids": ["v"]}]), "tools"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "name": "nope"}), "tool_choice"),
    (dict(tool_choice={"type": "web_search_preview"}), "tool_choice"),
    (dict(max_output_tokens=0), "max_output_tokens"),
    (dict(temperature=3), "temperature"),
    (dict(text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "thing"}}}), "text.format"),
    (dict(text={"format": {"type": "yaml"}}), "text.format"),
    (dict(reasoning={"effort": "extreme"}), "reasoning.effort"),
    (dict(truncation="auto"), "truncation"),
    (dict(include=["reasoning.encrypted_content"]), "include"),
    (dict(top_logprobs=2), "top_logprobs"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(metadata={"k": 1}), "metadata"),
    (dict(max_tool_calls=2), "max_tool_calls"),
])
def test_bad_input_is_refused(gw, extra, param):
    body = dict(dict(model="chat", input="Hi", max_output_tokens=4), **extra)
    if body["input"] is None:
        del body["input"]
    st, _, raw = post(gw, **body)
    e = json.loads(raw)["error"]
    assert st == 400 and e["param"] == param, e
    assert set(e) == {"message", "type", "param", "code"} and e["type"] == "invalid_request_error" and e["message"]


def test_sdk_sees_the_refusal(gw):
    with pytest.raises(openai.BadRequestError) as ei:
        client(gw).responses.create(model="chat", input="Hi", previous_response_id="resp_1")
    assert ei.value.body["param"] == "previous_response_id"
    st, _, raw = post(gw, model="nope", input="Hi")
    assert st == 404 and json.loads(raw)["error"]["param"] == "model"
