"""Reasoning models through the real gateway and CPU worker: the reasoning
comes back apart from the answer (OpenAI-style APIs' reasoning_content, in
messages and in stream deltas), counted in usage as reasoning tokens, and
through the SDK's command-line tool; and reasoning_effort reaches a gpt-oss
prompt. The models are scripted (tests/scripted.py)."""

import json
import subprocess

import pytest

from conftest import bin_path, cpu_pool_policy, free_port, http_post
from scripted import NL, scripted_model

THOUGHT = ["Let", "\u0120me", "\u0120think", "."]
ANSWER = ["The", "\u0120answer", "\u0120is", "\u0120four", "!"]
SCRIPTS = {   # family: the prompt's last token, then what the model writes
    "chatml": [NL, "<think>", *THOUGHT, "</think>", NL + NL, *ANSWER, "<|im_end|>"],
    "r1": [NL, *THOUGHT, "</think>", NL + NL, *ANSWER, "<\uff5cend\u2581of\u2581sentence\uff5c>"],
    "harmony": ["t", "<|channel|>", "analysis", "<|message|>", *THOUGHT, "<|return|>"],
}


POLICY = cpu_pool_policy(*SCRIPTS)


@pytest.fixture
def served(tmp_path, cluster):
    cluster.sdk_ep = f"tcp://127.0.0.1:{free_port()}"
    cluster.start_gateway(POLICY, extra_args=["--sdk", cluster.sdk_ep])
    for fam in SCRIPTS:
        cluster.start_worker("cpu-pool", fam, scripted_model(tmp_path / f"{fam}.gguf", fam, SCRIPTS[fam]),
                             ["--threads", "1", "--parallel", "2"], name=fam)
    for fam in SCRIPTS:
        cluster.wait_model(fam, timeout=60)
    return cluster


def chat(base, model, stream=False, **extra):
    body = dict(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=32, temperature=0,
                stream=stream, **extra)
    if stream:
        body["stream_options"] = {"include_usage": True}
    return http_post(base + "/v1/chat/completions", body)


@pytest.mark.parametrize("family", ["chatml", "r1"])
def test_think_span_is_reasoning_content(served, family):
    """Qwen3-style (the model opens <think>) and DeepSeek R1 (its template
    opens it): the span is the reasoning, the rest the answer, without the
    markers or the blank lines after </think>."""
    import openai
    c = openai.OpenAI(base_url=served.base + "/v1", api_key="x", max_retries=0, timeout=60)
    r = c.chat.completions.create(model=family, messages=[{"role": "user", "content": "Hi"}], max_tokens=32,
                                  temperature=0)
    m = r.choices[0].message
    assert m.content == "The answer is four!"
    assert m.model_extra.get("reasoning_content") == "Let me think."
    assert r.choices[0].finish_reason == "stop"
    marks = 2 if family == "chatml" else 1   # R1's <think> is in the prompt
    assert r.usage.completion_tokens == 4 + marks + 1 + 5 + 1
    assert r.usage.completion_tokens_details.reasoning_tokens == 4 + marks


def test_streamed_deltas_carry_reasoning_then_content(served):
    """Stream: the reasoning arrives as delta.reasoning_content, before any
    content; the two joined give the same as the whole response; usage
    counts the reasoning tokens."""
    import openai
    c = openai.OpenAI(base_url=served.base + "/v1", api_key="x", max_retries=0, timeout=60)
    reasoning, content, order, usage = "", "", [], None
    for ch in c.chat.completions.create(model="chatml", messages=[{"role": "user", "content": "Hi"}],
                                        max_tokens=32, temperature=0, stream=True,
                                        stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        rc = (d.model_extra or {}).get("reasoning_content")
        if rc:
            reasoning += rc
            order.append("r")
        if d.content:
            content += d.content
            order.append("c")
    assert reasoning == "Let me think." and content == "The answer is four!"
    assert order == sorted(order, reverse=True), order   # every r before every c
    assert usage.completion_tokens_details.reasoning_tokens == 6


def test_raw_events(served):
    """The events as sent, however the relay groups the deltas: the role
    first, no empty reasoning_content, the pieces joined give the whole; the
    usage event counts the reasoning. A completion (no chat template) is not
    split. (One delta's exact shape is fuzz_openai's invariant.)"""
    st, _, body = chat(served.base, "chatml", stream=True)
    assert st == 200
    events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""} or deltas[0].get("role") == "assistant", deltas
    assert all(d.get("reasoning_content", "x") for d in deltas), deltas
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Let me think."
    assert "".join(d.get("content", "") for d in deltas) == "The answer is four!"
    assert events[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 6}
    st, _, body = http_post(served.base + "/v1/completions", dict(model="chatml", prompt="x", max_tokens=3))
    assert st == 200 and "reasoning" not in json.loads(body)["choices"][0]


def test_gpt_oss_analysis_and_reasoning_effort(served):
    """gpt-oss (harmony): the analysis channel is the reasoning, and with no
    final message the answer is empty. reasoning_effort names itself in the
    system message ("low" is one token shorter than "high" in a byte-level
    vocabulary); anything else is refused."""
    st, _, body = chat(served.base, "harmony")
    r = json.loads(body)
    assert st == 200, r
    m = r["choices"][0]["message"]
    assert m["reasoning_content"] == "Let me think." and m["content"] == ""
    assert r["usage"]["completion_tokens_details"]["reasoning_tokens"] == 4
    n = {}
    for effort in ("low", "medium", "high"):
        st, _, body = chat(served.base, "harmony", reasoning_effort=effort)
        assert st == 200
        n[effort] = json.loads(body)["usage"]["prompt_tokens"]
    assert n["high"] == n["low"] + 1 and n["medium"] == n["low"] + 3, n
    st, _, body = chat(served.base, "harmony", reasoning_effort="extreme")
    err = json.loads(body)["error"]
    assert st == 400 and err["param"] == "reasoning_effort" and "low" in err["message"]


def test_sdk_cli_prints_reasoning_apart(served):
    """spillway chat: the answer on stdout, the reasoning and its token count
    on stderr; --reasoning-effort is checked."""
    r = subprocess.run([bin_path("spillway"), "chat", "-e", served.sdk_ep, "-m", "r1", "--temp", "0", "Hi"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "The answer is four!"
    assert "[reasoning]\nLet me think.\n[/reasoning]" in r.stderr and "reasoning_tokens=5" in r.stderr
    bad = subprocess.run([bin_path("spillway"), "chat", "-m", "r1", "--reasoning-effort", "max", "Hi"],
                         capture_output=True, text=True, timeout=10)
    assert bad.returncode == 2 and "--reasoning-effort" in bad.stderr
