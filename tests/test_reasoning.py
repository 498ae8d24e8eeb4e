"""Reasoning models through the real gateway and CPU worker: the reasoning
comes back apart from the answer (OpenAI-style APIs' reasoning_content, in
messages and in stream deltas), counted in usage as reasoning tokens, and
through the SDK's command-line tool; and reasoning_effort reaches a gpt-oss
prompt.

The models are scripted: real GGUF files (llama architecture, f32, a
byte-level BPE vocabulary with the chat templates' markers) whose layers add
nothing to the residual stream, so each next token depends only on the
current one: the output matrix maps every token of a script to its
successor, and greedy decoding replays the script. The worker computes them
like any other model."""

import json
import subprocess

import numpy as np
import pytest

from archmodels import gpt2_byte_symbols, make_weights, write_model
from conftest import bin_path, free_port, http_post

BYTES = gpt2_byte_symbols()
NL = BYTES[ord("\n")]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<think>", "</think>",
           "<|start|>", "<|end|>", "<|channel|>", "<|message|>", "<|return|>", "<|call|>",
           "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]
WORDS = ["Let", "\u0120me", "\u0120think", "The", "\u0120answer", "\u0120is", "\u0120four", NL + NL,
         "analysis", "\u0120\u0120"]
TOKENS = BYTES + SPECIAL + WORDS
ID = {t: i for i, t in enumerate(TOKENS)}

TEMPLATES = {   # enough of each family's Jinja text for the worker to recognise it
    "chatml": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "<|im_start|>assistant\n",
    "r1": "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
          "{% else %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
          "<｜Assistant｜><think>\\n",
    "harmony": "<|start|>system<|message|>...<|end|>{% for m in messages %}<|start|>{{ m.role }}"
               "<|channel|>final<|message|>{{ m.content }}<|end|>{% endfor %}<|start|>assistant",
}
THOUGHT = ["Let", "\u0120me", "\u0120think", "."]
ANSWER = ["The", "\u0120answer", "\u0120is", "\u0120four", "!"]
SCRIPTS = {   # (the prompt's last token, then what the model writes)
    "chatml": [NL, "<think>", *THOUGHT, "</think>", NL + NL, *ANSWER, "<|im_end|>"],
    "r1": [NL, *THOUGHT, "</think>", NL + NL, *ANSWER, "<｜end▁of▁sentence｜>"],
    "harmony": ["t", "<|channel|>", "analysis", "<|message|>", *THOUGHT, "<|return|>"],
}
EOS = {"chatml": "<|im_end|>", "r1": "<｜end▁of▁sentence｜>", "harmony": "<|return|>"}


def scripted_model(path, family):
    """A GGUF file whose greedy output after a chat prompt is the script."""
    E = 128
    hp, w = make_weights("llama", E=E, n_head=2, n_kv=2, hd=64, F=128, V=len(TOKENS), n_layer=1, seed=7)
    w["blk.0.attn_output.weight"][:] = 0   # the layer adds nothing: the stream is the token's embedding
    w["blk.0.ffn_down.weight"][:] = 0
    w["output_norm.weight"][:] = 1
    emb = w["token_embd.weight"]            # random: near orthogonal in 128 dimensions
    out = np.zeros_like(w["output.weight"])
    script = [ID[t] for t in SCRIPTS[family]]
    assert len(set(script)) == len(script), "a token may appear once: its successor is fixed"
    for cur, nxt in zip(script, script[1:]):
        out[nxt] = 4 * emb[cur] / np.linalg.norm(emb[cur])
    w["output.weight"] = out
    types = [1] * 256 + [3 if t not in ("<think>", "</think>") else 4 for t in SPECIAL] + [1] * len(WORDS)
    vocab = dict(tokens=TOKENS, types=types, merges=["\u0120 \u0120"], eos=ID[EOS[family]],
                 chat_template=TEMPLATES[family])
    write_model(path, "llama", hp, w, vocab=vocab)
    return path


POLICY = """
pools:
  - name: cpu-pool
    kind: cpu
routes:
  - model: chatml
    target: cpu-pool
  - model: r1
    target: cpu-pool
  - model: harmony
    target: cpu-pool
"""


@pytest.fixture
def served(tmp_path, cluster):
    cluster.sdk_ep = f"tcp://127.0.0.1:{free_port()}"
    cluster.start_gateway(POLICY, extra_args=["--sdk", cluster.sdk_ep])
    for fam in SCRIPTS:
        cluster.start_worker("cpu-pool", fam, scripted_model(tmp_path / f"{fam}.gguf", fam),
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
