"""End to end: the openai client -> the real gateway -> ZeroMQ -> a real CPU
worker running the real stories260K model. Greedy decoding through the whole
stack must reproduce the model's published greedy output.
"""
import openai
import pytest

from conftest import http_get, shared_file

PROMPT = "Once upon a time"

POLICY = """\
pools:
  - name: cpu-pool
    kind: cpu
routes:
  - model: "stories260K"
    target: cpu-pool
    max_concurrency: 8
"""


@pytest.fixture
def e2e(cluster):
    model = shared_file("models/stories260K.gguf")
    greedy = shared_file("models/stories260K.greedy.txt").read_text()
    assert greedy.startswith(PROMPT)
    cluster.start_gateway(POLICY)
    cluster.start_worker("cpu-pool", "stories260K", model, ["--threads", "1"], name="cpu")
    cluster.wait_model("stories260K", timeout=60)
    c = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    return cluster, c, greedy[len(PROMPT):].rstrip()


def test_completion_greedy_matches_reference(e2e):
    cluster, c, want = e2e
    r = c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=252, temperature=0)
    assert r.choices[0].text.rstrip() == want
    assert r.usage.completion_tokens > 0
    assert r.choices[0].finish_reason in ("length", "stop")


def test_completion_greedy_streaming_matches_reference(e2e):
    cluster, c, want = e2e
    stream = c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=252,
                                  temperature=0, stream=True)
    parts = [ch.choices[0].text for ch in stream if ch.choices]
    assert len(parts) > 10          # really streamed, not one blob
    assert "".join(parts).rstrip() == want


def test_prefix_cache_reuses_the_prompt_and_keeps_the_text(e2e):
    """The worker's prefix cache, seen through the API: a repeated prompt and
    the next turn of a chat report cached prompt tokens
    (usage.prompt_tokens_details.cached_tokens), and greedy output is still
    the model's published text."""
    cluster, c, want = e2e
    first = c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=252, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=252, temperature=0)
    assert again.choices[0].text.rstrip() == want
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    # and the gateway counts them for dashboards
    from prometheus_client.parser import text_string_to_metric_families
    fams = text_string_to_metric_families(http_get(cluster.base + "/metrics")[1].decode())
    cached = sum(s.value for f in fams for s in f.samples if s.name == "spillway_prompt_tokens_cached_total")
    assert cached == again.usage.prompt_tokens_details.cached_tokens

    turn1 = [{"role": "user", "content": "Tell me a story about a cat and a dog who play in the park."}]
    r1 = c.chat.completions.create(model="stories260K", max_tokens=40, temperature=0, messages=turn1)
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "What happened next?"}]
    stream = c.chat.completions.create(model="stories260K", max_tokens=8, temperature=0, messages=turn2,
                                       stream=True, stream_options={"include_usage": True})
    usage = [ch.usage for ch in stream if ch.usage][-1]
    # everything up to the first answer was computed in turn 1
    assert usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens + 30, \
        (usage, r1.usage)


def test_seed_makes_sampling_reproducible(e2e):
    """OpenAI's `seed`: the same seed samples the same text, other seeds other
    texts. Seeds are 64-bit, signed or not: -1 is 2^64-1."""
    cluster, c, _ = e2e

    def sample(seed):
        r = c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=40,
                                 temperature=1.0, top_p=1.0, seed=seed)
        return r.choices[0].text

    a = sample(1234)
    assert sample(1234) == a
    others = {sample(s) for s in (1, 2, 3)}
    assert len(others | {a}) >= 3, "different seeds should sample different texts"
    assert sample(-1) == sample(2**64 - 1)
    assert sample(2**63 + 4096) == sample(-(2**63) + 4096)
    with pytest.raises(openai.BadRequestError, match="out of range"):
        sample(2**64 + 4096)


def test_chat_answers(e2e):
    cluster, c, _ = e2e
    r = c.chat.completions.create(model="stories260K", max_tokens=48,
                                  messages=[{"role": "user", "content": "Tell me a story."}])
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content.strip()
    assert r.usage.completion_tokens > 0
    stream = c.chat.completions.create(model="stories260K", max_tokens=16, stream=True,
                                       messages=[{"role": "user", "content": "Hi"}])
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text.strip()


def test_nan_weights_give_an_error_not_junk(cluster, tmp_path):
    """A model whose weights hold NaN computes NaN logits: the worker fails the
    request with a message that says so, and the client gets that error, not
    a stream of junk tokens."""
    import gguf
    import numpy as np
    bad = tmp_path / "nan.gguf"
    bad.write_bytes(shared_file("models/stories260K.gguf").read_bytes())
    reader = gguf.GGUFReader(str(bad), "r+")
    t = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate.weight")
    t.data[0][:] = np.nan
    t.data.flush()
    del reader, t
    cluster.start_gateway(POLICY)
    cluster.start_worker("cpu-pool", "stories260K", bad, ["--threads", "1"], name="cpu")
    cluster.wait_model("stories260K", timeout=60)
    c = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    with pytest.raises(openai.APIStatusError) as e:
        c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=8, temperature=0)
    assert e.value.status_code >= 500
    assert "NaN logits" in str(e.value)
    # Streamed, the error comes in the stream, or as the response's status
    # when it reaches the gateway before the stream's headers went out.
    with pytest.raises(openai.APIError) as e:
        for _ in c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=8, temperature=0, stream=True):
            pass
    assert "NaN logits" in str(e.value)


def test_echo_and_the_prompts_log_probabilities(e2e, tmp_path):
    """echo: the text starts with the prompt, whole and streamed. With
    logprobs, each prompt token's log probability is the model's own: the
    log-softmax of spillway-run's logits at the position before it (what
    lm-eval-harness's loglikelihood tasks read)."""
    import numpy as np
    from conftest import logits_for
    cluster, c, want = e2e
    r = c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=8, temperature=0, echo=True)
    assert r.choices[0].text.startswith(PROMPT) and r.choices[0].text[len(PROMPT):] == want[:len(r.choices[0].text) - len(PROMPT)]
    parts = [ch.choices[0].text for ch in c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=8,
                                                               temperature=0, echo=True, stream=True) if ch.choices]
    assert parts[0].startswith(PROMPT) and "".join(parts) == r.choices[0].text
    r = c.completions.create(model="stories260K", prompt=PROMPT, max_tokens=4, temperature=0, echo=True, logprobs=3)
    lp = r.choices[0].logprobs
    n_prompt = r.usage.prompt_tokens
    assert len(lp.tokens) == n_prompt + 4 and "".join(lp.tokens) == r.choices[0].text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    ids = [1, 403, 407, 261, 378][:n_prompt]   # BOS and "Once upon a time", as llama2.c encodes it
    logits, _ = logits_for(shared_file("models/stories260K.gguf"), ids, tmp_path / "l.f32")
    ls = logits - (logits.max(1, keepdims=True) + np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)))
    for p in range(1, n_prompt):
        assert lp.token_logprobs[p] == pytest.approx(ls[p - 1, ids[p]], abs=1e-3), p
        assert sorted(lp.top_logprobs[p].values(), reverse=True) == pytest.approx(np.sort(ls[p - 1])[::-1][:3], abs=1e-3)
