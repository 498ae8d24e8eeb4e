"""Structured outputs (OpenAI's response_format json_object and
json_schema) through the real gateway and CPU worker.

A scripted model (tests/scripted.py) that answers with JSON and then keeps
talking shows the constraint ends the answer where the JSON ends, whole and
streamed; asked for keys its JSON lacks, its output is steered into the
schema. The real stories260K model, sampled at temperature 1 with several
seeds under a schema whose values are bounded (an enum, an integer, a
boolean, a short string), must give JSON that fits every time: a model that
never saw JSON writes it only because the mask leaves it nothing else.
Schemas the constraint cannot enforce are refused with their path."""

import json
import subprocess

import openai
import pytest

from conftest import bin_path, build_sdk_example, cpu_pool_policy, free_port, http_post, shared_file
from scripted import JSON_ANSWER, NL, scripted_model

SCRIPT = [NL, JSON_ANSWER, "\u0120answer", "<|im_end|>"]   # '{"city": "Paris", "days": 2} answer'
POLICY = cpu_pool_policy("m", "stories")
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"], "additionalProperties": False}
BOUNDED = {"type": "object",
           "properties": {"colour": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer", "minimum": -3,
                                                                               "maximum": 250},
                          "ok": {"type": "boolean"}, "name": {"type": "string", "maxLength": 6},
                          "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
           "required": ["colour", "n", "ok"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
def served(tmp_path, cluster):
    stories = shared_file("models/stories260K.gguf")
    cluster.sdk_ep = f"tcp://127.0.0.1:{free_port()}"
    cluster.start_gateway(POLICY, extra_args=["--sdk", cluster.sdk_ep])
    cluster.start_worker("cpu-pool", "m", scripted_model(tmp_path / "m.gguf", "chatml", SCRIPT),
                         ["--threads", "1", "--parallel", "2"], name="m")
    cluster.start_worker("cpu-pool", "stories", stories, ["--threads", "1", "--parallel", "4"], name="stories")
    cluster.wait_model("m", timeout=60)
    cluster.wait_model("stories", timeout=60)
    return cluster


def client(c):
    return openai.OpenAI(base_url=c.base + "/v1", api_key="x", max_retries=0, timeout=60)


def schema_format(schema, name="answer"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def fits_bounded(v):
    assert set(v) <= set(BOUNDED["properties"]) and {"colour", "n", "ok"} <= set(v), v
    assert v["colour"] in ("red", "green", "blue") and isinstance(v["ok"], bool), v
    assert isinstance(v["n"], int) and not isinstance(v["n"], bool) and -3 <= v["n"] <= 250, v
    assert len(v.get("name", "")) <= 6 and isinstance(v.get("name", ""), str), v
    assert all(t in ("a", "b") for t in v.get("tags", [])) and len(v.get("tags", [])) <= 2, v


def test_free_text_keeps_talking_json_mode_stops_at_the_json(served):
    c = client(served)
    free = c.chat.completions.create(model="m", messages=ASK, max_tokens=8, temperature=0)
    assert free.choices[0].message.content == '{"city": "Paris", "days": 2} answer'
    for fmt in ({"type": "json_object"}, schema_format(CITY)):
        r = c.chat.completions.create(model="m", messages=ASK, max_tokens=8, temperature=0, response_format=fmt)
        assert r.choices[0].message.content == '{"city": "Paris", "days": 2}', fmt
        assert r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens == 1   # ended by the JSON itself, not by a further token


def test_streamed_json_is_the_same(served):
    chunks = list(client(served).chat.completions.create(
        model="m", messages=ASK, max_tokens=8, temperature=0, response_format=schema_format(CITY), stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == '{"city": "Paris", "days": 2}'
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["stop"]


def test_a_schema_the_model_does_not_follow_steers_it(served):
    """The script's JSON has no "colour": its token is masked and the model
    is made to write what the schema allows instead."""
    for temp in (0, 1):
        r = client(served).chat.completions.create(model="m", messages=ASK, max_tokens=400, temperature=temp,
                                                    seed=3, response_format=schema_format(BOUNDED))
        assert r.choices[0].finish_reason == "stop", repr(r.choices[0].message.content if hasattr(r.choices[0], "message") else r.choices[0].text)
        fits_bounded(json.loads(r.choices[0].message.content))


@pytest.mark.parametrize("seed", range(6))
def test_sampled_stories_fit_the_schema(served, seed):
    """A real model that knows only children's stories, sampled: JSON that
    fits, every seed (completions and chat both take response_format)."""
    c = client(served)
    r = c.completions.create(model="stories", prompt="Once upon a time", max_tokens=400, temperature=1.0, seed=seed,
                             extra_body={"response_format": schema_format(BOUNDED)})
    assert r.choices[0].finish_reason == "stop", r
    fits_bounded(json.loads(r.choices[0].text))
    r = c.chat.completions.create(model="stories", messages=[{"role": "user", "content": "Hi"}], max_tokens=400,
                                  temperature=1.0, seed=seed, response_format=schema_format(BOUNDED))
    assert r.choices[0].finish_reason == "stop", r
    fits_bounded(json.loads(r.choices[0].message.content))


@pytest.mark.parametrize("fmt, words", [
    (schema_format({"type": "object", "properties": {"id": {"type": "string", "pattern": "^a"}}}),
     ["'pattern' is not supported", "#/properties/id"]),
    (schema_format({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}), ["'multipleOf'"]),
    (schema_format({"type": "integer", "minimum": 9, "maximum": 1}), ["admit no number"]),
    (schema_format({"type": "thing"}), ["unknown type 'thing'"]),
    (schema_format({"$ref": "#/$defs/missing"}), ["$ref"]),
    (schema_format({"required": ["x"], "properties": {}}), ["required property 'x'"]),
    ({"type": "json_schema"}, ["json_schema"]),
    ({"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}}, ["name"]),
    ({"type": "yaml"}, ["json_object"]),
    ("json", ["must be an object"]),
])
def test_schemas_it_cannot_enforce_are_refused(served, fmt, words):
    st, _, raw = http_post(served.base + "/v1/chat/completions",
                           dict(model="m", messages=ASK, max_tokens=8, response_format=fmt))
    r = json.loads(raw)
    assert st == 400 and r["error"]["param"] == "response_format", r
    for w in words:
        assert w in r["error"]["message"], r


def test_recursive_schema_with_defs(served):
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}},
        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
    done = 0
    for seed in range(3):
        r = client(served).completions.create(model="stories", prompt="A", max_tokens=200, temperature=1.0,
                                              seed=seed, extra_body={"response_format": schema_format(tree)})
        if r.choices[0].finish_reason != "stop":
            continue
        def check(n):
            assert set(n) <= {"v", "kids"} and isinstance(n["v"], int), n
            for k in n.get("kids", []):
                check(k)
        check(json.loads(r.choices[0].text))
        done += 1
    assert done >= 1


def test_sdk_cli_json(served, tmp_path):
    """spillway chat --json / --json-schema FILE: the SDK carries the schema;
    one the worker cannot enforce comes back as its 400."""
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(CITY))
    for flags in (["--json"], ["--json-schema", str(f)]):
        r = subprocess.run([bin_path("spillway"), "chat", "-e", served.sdk_ep, "-m", "m", "--temp", "0", "-n", "8",
                            *flags, "Weather in Paris?"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == '{"city": "Paris", "days": 2}', (r.stdout, r.stderr)
    f.write_text(json.dumps({"type": "string", "pattern": "x"}))
    r = subprocess.run([bin_path("spillway"), "chat", "-e", served.sdk_ep, "-m", "m", "--json-schema", str(f), "Hi"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "400" in r.stderr and "'pattern' is not supported" in r.stderr, r.stderr


def test_sdk_example_extracts_json(served, tmp_path):
    """sdk/examples/extract.c builds against the library and, on the real
    stories260K model (which knows nothing of JSON), prints JSON that fits
    its schema, with the answer's log probabilities summed."""
    exe = build_sdk_example("extract", tmp_path)
    r = subprocess.run([str(exe), served.sdk_ep, "stories", "Tom is five. He has a dog."], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    v = json.loads(r.stdout)
    assert set(v) <= {"name", "age", "pets"} and isinstance(v["name"], str) and len(v["name"]) <= 20, v
    assert isinstance(v["age"], int) and 0 <= v["age"] <= 130, v
    assert all(p in ("cat", "dog") for p in v.get("pets", [])) and len(v.get("pets", [])) <= 3, v
    assert "finish=stop" in r.stderr and "logprob=-" in r.stderr, r.stderr
