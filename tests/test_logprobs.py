"""Log probabilities (OpenAI's logprobs) through the real gateway and CPU
worker, checked against the model itself: a scripted model
(tests/scripted.py) whose logits at each step are its output matrix times
the normed embedding of the current token, so numpy computes the exact
log-softmax the worker must report. Chat (logprobs, top_logprobs) and
completions (logprobs=N, text_offset), whole and streamed. And OpenAI's
presence and frequency penalties, on a model whose output loops, and
logit_bias."""

import json

import numpy as np
import openai
import pytest
from gguf import GGUFReader

import subprocess

from conftest import bin_path, cpu_pool_policy, free_port, http_post
from scripted import ID, NL, TOKENS, scripted_model

SCRIPT = [NL, "The", "\u0120answer", "\u0120is", "\u0120four", "!", "<|im_end|>"]
TEXTS = ["The", " answer", " is", " four", "!"]
LOOP = [NL, "The", "\u0120answer", "The"]   # "The answer The answer ..." 
POLICY = cpu_pool_policy("m", "loop")


@pytest.fixture
def served(tmp_path, cluster):
    path = scripted_model(tmp_path / "m.gguf", "chatml", SCRIPT, scale=0.15)   # unsure: logprobs near -4
    loop = scripted_model(tmp_path / "loop.gguf", "chatml", LOOP, scale=0.15, eos="<|im_end|>")
    cluster.sdk_ep = f"tcp://127.0.0.1:{free_port()}"
    cluster.start_gateway(POLICY, extra_args=["--sdk", cluster.sdk_ep])
    cluster.start_worker("cpu-pool", "m", path, ["--threads", "1", "--parallel", "2"], name="m")
    cluster.start_worker("cpu-pool", "loop", loop, ["--threads", "1", "--parallel", "2"], name="loop")
    cluster.wait_model("m", timeout=60)
    cluster.wait_model("loop", timeout=60)
    cluster.model_path = path
    return cluster


def reference(path):
    """Each script token's log-softmax row (what follows it), from the file."""
    t = {x.name: np.array(x.data, dtype=np.float64) for x in GGUFReader(str(path)).tensors}
    emb, out = t["token_embd.weight"], t["output.weight"]
    rows = {}
    for tok in SCRIPT[:-1]:
        h = emb[ID[tok]]
        logits = out @ (h / np.sqrt(np.mean(h * h) + 1e-6))
        rows[tok] = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
    return rows


def expected(path):
    """(token text, its log probability, the best alternative's) per step."""
    rows = reference(path)
    steps = []
    for cur, nxt in zip(SCRIPT, SCRIPT[1:-1]):
        r = rows[cur]
        order = np.argsort(-r, kind="stable")
        steps.append((nxt, r[ID[nxt]], order))
    return steps


def test_chat_logprobs_match_the_model(served):
    c = openai.OpenAI(base_url=served.base + "/v1", api_key="x", max_retries=0, timeout=60)
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Q"}], max_tokens=16,
                                  temperature=0, logprobs=True, top_logprobs=3)
    ch = r.choices[0]
    assert ch.message.content == "The answer is four!"
    content = ch.logprobs.content
    assert [t.token for t in content] == TEXTS + [""]   # <|im_end|> ends it: a control token, no text
    rows = reference(served.model_path)
    for t, cur, (nxt, lp, order) in zip(content, SCRIPT, expected(served.model_path)):
        assert lp < -1 and t.logprob == pytest.approx(lp, abs=2e-3), t
        assert bytes(t.bytes) == t.token.encode()
        top = t.top_logprobs
        assert len(top) == 3 and top[0].token == t.token and top[0].logprob == pytest.approx(t.logprob, abs=1e-6)
        # the runners-up, as the model ranks them
        for k in (1, 2):
            assert top[k].logprob == pytest.approx(rows[cur][order[k]], abs=2e-3), (top[k], TOKENS[order[k]])
    # without logprobs the field is null, as before
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Q"}], max_tokens=16, temperature=0)
    assert r.choices[0].logprobs is None


def test_streamed_logprobs_cover_every_token(served):
    c = openai.OpenAI(base_url=served.base + "/v1", api_key="x", max_retries=0, timeout=60)
    got = []
    for ch in c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Q"}], max_tokens=16,
                                        temperature=0, logprobs=True, stream=True):
        if ch.choices and ch.choices[0].logprobs:
            got += [(t.token, t.logprob) for t in ch.choices[0].logprobs.content]
    assert [t for t, _ in got] == TEXTS + [""]
    for (tok, lp), (nxt, ref, _) in zip(got, expected(served.model_path)):
        assert lp == pytest.approx(ref, abs=2e-3)


def test_completion_logprobs(served):
    st, _, body = http_post(served.base + "/v1/completions",
                            dict(model="m", prompt="Q\n", max_tokens=16, temperature=0, logprobs=2))
    r = json.loads(body)
    assert st == 200, r
    lp = r["choices"][0]["logprobs"]
    assert r["choices"][0]["text"] == "The answer is four!"
    assert lp["tokens"][:5] == TEXTS
    assert lp["text_offset"][:5] == [0, 3, 10, 13, 18]
    for k, (nxt, ref, _) in enumerate(expected(served.model_path)):
        assert lp["token_logprobs"][k] == pytest.approx(ref, abs=2e-3)
        assert len(lp["top_logprobs"][k]) == 2 and lp["top_logprobs"][k][TEXTS[k]] == pytest.approx(ref, abs=2e-3)


def log_softmax_after(path, token_id):
    """The model's log-softmax over what follows token_id (its output
    depends on the current token only)."""
    t = {x.name: np.array(x.data, dtype=np.float64) for x in GGUFReader(str(path)).tensors}
    h = t["token_embd.weight"][token_id]
    logits = t["output.weight"] @ (h / np.sqrt(np.mean(h * h) + 1e-6))
    return logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))


def test_echo_scores_the_prompt(served):
    """echo with logprobs: the prompt's tokens come first, the first with
    null, each other with its log probability after the ones before it (as
    lm-eval-harness's loglikelihood asks), then the generated ones, with
    offsets running across both."""
    body = dict(model="m", prompt="Q\n", max_tokens=16, temperature=0, logprobs=2)
    st, _, raw = http_post(served.base + "/v1/completions", dict(body, echo=True))
    r = json.loads(raw)
    assert st == 200, r
    lp = r["choices"][0]["logprobs"]
    assert r["choices"][0]["text"] == "Q\nThe answer is four!"
    assert lp["tokens"][:7] == ["Q", "\n"] + TEXTS
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"][:7] == [0, 1, 2, 5, 12, 15, 20]
    row = log_softmax_after(served.model_path, ID["Q"])
    assert lp["token_logprobs"][1] == pytest.approx(row[ID[NL]], abs=2e-3)
    best = np.argsort(-row, kind="stable")[:2]
    assert sorted(lp["top_logprobs"][1].values()) == pytest.approx(sorted(row[best]), abs=2e-3)
    # streamed: the same tokens, log probabilities and offsets across the events
    c = openai.OpenAI(base_url=served.base + "/v1", api_key="x", max_retries=0, timeout=60)
    toks, lps, offs, text = [], [], [], ""
    for ev in c.completions.create(model="m", prompt="Q\n", max_tokens=16, temperature=0, logprobs=2, echo=True,
                                   stream=True):
        if ev.choices and ev.choices[0].logprobs:
            toks += ev.choices[0].logprobs.tokens
            lps += ev.choices[0].logprobs.token_logprobs
            offs += ev.choices[0].logprobs.text_offset
        if ev.choices:
            text += ev.choices[0].text
    assert text == r["choices"][0]["text"] and toks == lp["tokens"] and offs == lp["text_offset"]
    assert lps[0] is None and lps[1:] == pytest.approx(lp["token_logprobs"][1:], abs=1e-6)
    # the generated part is what it is without echo
    st, _, raw = http_post(served.base + "/v1/completions", body)
    plain = json.loads(raw)["choices"][0]["logprobs"]
    assert lp["token_logprobs"][2:] == pytest.approx(plain["token_logprobs"], abs=1e-6)
    assert lp["tokens"][2:] == plain["tokens"]


@pytest.mark.parametrize("url, body, param", [
    ("/v1/chat/completions", dict(top_logprobs=2), "top_logprobs"),
    ("/v1/chat/completions", dict(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("/v1/chat/completions", dict(logprobs="yes"), "logprobs"),
    ("/v1/completions", dict(logprobs=-1), "logprobs"),
])
def test_bad_logprobs_are_refused(served, url, body, param):
    base = dict(model="m", max_tokens=4)
    base.update(dict(messages=[{"role": "user", "content": "Q"}]) if "chat" in url else dict(prompt="Q\n"))
    st, _, raw = http_post(served.base + url, dict(base, **body))
    r = json.loads(raw)
    assert st == 400 and r["error"]["param"] == param, r


@pytest.mark.parametrize("penalty", ["presence_penalty", "frequency_penalty"])
def test_presence_and_frequency_penalties(served, penalty):
    """The looping model repeats "The answer" as long as it may; a penalty
    of 2 on generated tokens (about 1.7 logits of preference, here) breaks
    the loop once each has come once, and one of -2 makes "The" (+2 once
    written) beat its successor: it repeats itself."""
    def text(**extra):
        st, _, body = http_post(served.base + "/v1/chat/completions",
                                dict(model="loop", messages=[{"role": "user", "content": "Q"}], max_tokens=6,
                                     temperature=0, **extra))
        assert st == 200, body
        return json.loads(body)["choices"][0]["message"]["content"]

    assert text() == "The answer" * 3
    broken = text(**{penalty: 2.0})
    assert broken.startswith("The answer") and not broken.startswith("The answerThe"), broken
    assert text(**{penalty: -2.0}) == "The" * 6
    st, _, body = http_post(served.base + "/v1/chat/completions",
                            dict(model="loop", messages=[{"role": "user", "content": "Q"}], **{penalty: 2.5}))
    assert st == 400 and json.loads(body)["error"]["param"] == penalty


def test_logit_bias(served):
    """+100 on "!" wins every step (even over the end); -100 on "The" takes
    the first token elsewhere; bad keys, values and ids are refused."""
    def chat(**extra):
        return http_post(served.base + "/v1/chat/completions",
                         dict(model="m", messages=[{"role": "user", "content": "Q"}], max_tokens=4, temperature=0,
                              **extra))

    st, _, body = chat(logit_bias={str(ID["!"]): 100})
    assert st == 200 and json.loads(body)["choices"][0]["message"]["content"] == "!!!!", body
    st, _, body = chat(logit_bias={str(ID["The"]): -100})
    assert st == 200 and not json.loads(body)["choices"][0]["message"]["content"].startswith("The"), body
    for bad in ({"x": 1}, {"-1": 1}, {"5": 101}, {"5": "high"}, [5]):
        st, _, body = chat(logit_bias=bad)
        assert st == 400 and json.loads(body)["error"]["param"] == "logit_bias", (bad, body)
    st, _, body = chat(logit_bias={"99999": 5})   # the worker knows its vocabulary
    assert st == 400 and "vocabulary" in json.loads(body)["error"]["message"], body


def test_sdk_logprobs_and_logit_bias(served):
    """The SDK returns each token's log probability with its alternatives
    (the CLI prints them on stderr), and carries logit_bias."""
    r = subprocess.run([bin_path("spillway"), "complete", "-e", served.sdk_ep, "-m", "m", "--temp", "0", "-n", "16",
                        "--logprobs", "2", "Q\n"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "The answer is four!", r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("[logprob] ")]
    assert len(lines) == len(TEXTS) + 1, r.stderr
    for line, tok, (nxt, ref, _) in zip(lines, TEXTS, expected(served.model_path)):
        parts = line[len("[logprob] "):].split(" | ")
        assert parts[0].rsplit(" ", 1)[0] == tok and float(parts[0].rsplit(" ", 1)[1]) == pytest.approx(ref, abs=2e-3)
        assert len(parts) == 3 and parts[1].rsplit(" ", 1)[0] == tok
    r = subprocess.run([bin_path("spillway"), "complete", "-e", served.sdk_ep, "-m", "m", "--temp", "0", "-n", "4",
                        "--logit-bias", f"{ID['The']}=-100", "Q\n"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.startswith("The"), (r.stdout, r.stderr)
    r = subprocess.run([bin_path("spillway"), "complete", "-e", served.sdk_ep, "-m", "m", "--logit-bias", "7", "Q"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "TOKEN_ID=BIAS" in r.stderr
