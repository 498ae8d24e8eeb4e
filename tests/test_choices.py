"""Requests of several choices (gateway/choices.h): `n` > 1 on chat and
completions, and batched prompts on completions (OpenAI's `prompt` as an
array of strings or of token-id arrays, as lm-eval-harness sends), through
the real gateway and workers (stories260K on the CPU worker; the GPU
worker's emulation backend on the synthetic fp8 model).

What is checked: each choice is what its own request with seed + i would
give, streamed and not; choices are indexed prompt * n + sample; usage
counts a prompt once; a prompt's other samples take its KV from the
worker's prefix cache; batched token-id prompts scored with echo and
logprobs match the log-softmax of spillway-run's logits; a client gone
mid-stream frees every choice's slot; bad input is a 400 naming `param`."""
import json
import re
import subprocess

import numpy as np
import openai
import pytest

from conftest import bin_path, build_sdk_example, cpu_pool_policy, free_port, http_get, http_post, logits_for, shared_file, wait_until
from test_limits import L

MAXC = L["SW_MAX_CHOICES"]
STORIES = "models/stories260K.gguf"


@pytest.fixture
def gw(cluster):
    cluster.sdk_ep = f"tcp://127.0.0.1:{free_port()}"
    cluster.start_gateway(cpu_pool_policy("s"), extra_args=["--sdk", cluster.sdk_ep])
    cluster.start_worker("cpu-pool", "s", shared_file(STORIES), ["--threads", "1", "--parallel", "4"], name="s")
    cluster.wait_model("s", timeout=60)
    cluster.client = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    return cluster


def counters(gw):
    """(prompt tokens, of them from the prefix cache) the gateway counted."""
    text = http_get(gw.base + "/metrics")[1].decode()

    def value(name):
        m = re.search(rf'^{name}{{pool="cpu-pool"}} (\S+)$', text, re.M)
        return float(m.group(1)) if m else 0.0
    return value("spillway_prompt_tokens_total"), value("spillway_prompt_tokens_cached_total")


def test_n_choices_are_the_seeded_requests_they_stand_for(gw):
    c = gw.client
    one = [c.completions.create(model="s", prompt="Once upon a time", max_tokens=10, temperature=1, seed=5 + i)
           for i in range(3)]
    many = c.completions.create(model="s", prompt="Once upon a time", max_tokens=10, temperature=1, seed=5, n=3)
    assert [ch.index for ch in many.choices] == [0, 1, 2]
    assert [ch.text for ch in many.choices] == [r.choices[0].text for r in one]
    assert len({ch.text for ch in many.choices}) > 1, "three samples at temperature 1 were all the same"
    assert many.usage.prompt_tokens == one[0].usage.prompt_tokens
    assert many.usage.completion_tokens == sum(r.usage.completion_tokens for r in one)
    assert many.id.startswith("cmpl-")
    msgs = [{"role": "user", "content": "Tell me a story"}]
    one = [c.chat.completions.create(model="s", messages=msgs, max_tokens=8, temperature=1, seed=3 + i)
           for i in range(2)]
    many = c.chat.completions.create(model="s", messages=msgs, max_tokens=8, temperature=1, seed=3, n=2)
    assert [ch.message.content for ch in many.choices] == [r.choices[0].message.content for r in one]
    assert [ch.index for ch in many.choices] == [0, 1]
    assert all(ch.message.role == "assistant" for ch in many.choices)
    assert many.usage.prompt_tokens == one[0].usage.prompt_tokens


def streamed(gw, path, body):
    """The raw SSE events of a streamed request: (chunks, [DONE] count)."""
    st, _, raw = http_post(gw.base + path, dict(body, stream=True, stream_options={"include_usage": True}))
    assert st == 200, raw
    events = [e[len("data: "):] for e in raw.decode().split("\n\n") if e.startswith("data: ")]
    done = events.count("[DONE]")
    return [json.loads(e) for e in events if e != "[DONE]"], done


def test_n_streamed_matches_the_whole_answer(gw):
    body = dict(model="s", messages=[{"role": "user", "content": "hi"}], max_tokens=12, temperature=1, seed=5, n=3)
    whole = json.loads(http_post(gw.base + "/v1/chat/completions", body)[2])
    chunks, done = streamed(gw, "/v1/chat/completions", body)
    assert done == 1 and len({ch["id"] for ch in chunks}) == 1
    text, roles, finishes = {}, {}, {}
    for ch in chunks[:-1]:
        (c,) = ch["choices"]
        d = c["delta"]
        text[c["index"]] = text.get(c["index"], "") + (d.get("content") or "")
        roles[c["index"]] = roles.get(c["index"], 0) + (d.get("role") == "assistant")
        if c["finish_reason"]:
            finishes[c["index"]] = finishes.get(c["index"], 0) + 1
    assert text == {ch["index"]: ch["message"]["content"] for ch in whole["choices"]}
    assert roles == {0: 1, 1: 1, 2: 1} and finishes == {0: 1, 1: 1, 2: 1}
    last = chunks[-1]
    assert last["choices"] == []
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert last["usage"][k] == whole["usage"][k]


def test_batched_prompts_times_n_are_indexed_prompt_major(gw):
    c = gw.client
    prompts = ["Once upon a time", "The little dog", "Lily saw"]
    alone = [c.completions.create(model="s", prompt=p, max_tokens=6, temperature=0) for p in prompts]
    r = c.completions.create(model="s", prompt=prompts, max_tokens=6, temperature=0, n=2)
    assert [ch.index for ch in r.choices] == list(range(6))
    assert [ch.text for ch in r.choices] == [a.choices[0].text for a in alone for _ in range(2)]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    # streamed: every choice's text under its own index
    chunks, done = streamed(gw, "/v1/completions", dict(model="s", prompt=prompts, max_tokens=6, temperature=0, n=2))
    got = {}
    for ch in chunks[:-1]:
        for x in ch["choices"]:
            got[x["index"]] = got.get(x["index"], "") + x["text"]
    assert done == 1 and got == {ch.index: ch.text for ch in r.choices}


def log_softmax(rows):
    rows = rows.astype(np.float64)
    m = rows.max(1, keepdims=True)
    return rows - (m + np.log(np.exp(rows - m).sum(1, keepdims=True)))


def test_lm_eval_shaped_batch_scores_each_prompt(gw, tmp_path):
    """What lm-eval-harness's local-completions sends for log-likelihoods:
    token-id prompts batched, echo, logprobs, one token, greedy. Each
    prompt's token log probabilities are the log-softmax of the model's own
    logits at the position before it."""
    prompts = [[1, 403, 261, 350, 299, 263], [1, 378, 292, 265], [1, 403, 261, 350, 299, 263, 289, 404]]
    st, _, raw = http_post(gw.base + "/v1/completions", dict(model="s", prompt=prompts, echo=True, logprobs=1,
                                                            max_tokens=1, temperature=0))
    r = json.loads(raw)
    assert st == 200, r
    assert [ch["index"] for ch in r["choices"]] == [0, 1, 2]
    model = shared_file(STORIES)
    for i, (ids, ch) in enumerate(zip(prompts, r["choices"])):
        lp = ch["logprobs"]["token_logprobs"]
        assert len(lp) == len(ids) + 1 and lp[0] is None, ch
        ref = log_softmax(logits_for(model, ids, tmp_path / f"l{i}.bin", extra=("-t", "1"))[0])
        want = [ref[j - 1, ids[j]] for j in range(1, len(ids))]
        assert lp[1:len(ids)] == pytest.approx(want, abs=1e-3)
        # and the same as that prompt sent alone
        st, _, raw = http_post(gw.base + "/v1/completions", dict(model="s", prompt=ids, echo=True, logprobs=1,
                                                                max_tokens=1, temperature=0))
        assert json.loads(raw)["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(lp, abs=1e-6)


def test_a_prompts_samples_share_its_kv(gw):
    """A prompt's first sample computes it; the others find it in the
    worker's prefix cache (sent after the first's first token, to the same
    worker)."""
    prompt = "Once upon a time there was a little girl named Lily who loved to play in the park. " * 3
    c = gw.client
    p0, c0 = counters(gw)
    r = c.completions.create(model="s", prompt=prompt, max_tokens=4, temperature=1, seed=1, n=4)
    p1, c1 = counters(gw)
    n = r.usage.prompt_tokens
    assert n > 48 and p1 - p0 == 4 * n
    assert (p1 - p0) - (c1 - c0) <= n + 3 * 16, "the samples computed the prompt again"


def test_more_choices_than_slots_wait_their_turn(gw):
    """n = SW_MAX_CHOICES on a worker of 4 slots: the choices queue at the
    gateway and all are served."""
    r = gw.client.completions.create(model="s", prompt="Once", max_tokens=2, temperature=1, seed=0, n=MAXC)
    assert [ch.index for ch in r.choices] == list(range(MAXC))
    assert all(ch.finish_reason in ("length", "stop") for ch in r.choices)


def test_a_client_gone_mid_stream_frees_every_choice(gw):
    body = dict(model="s", prompt="Once upon a time", max_tokens=2000, temperature=1, seed=0, n=3, stream=True)
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", gw.http_port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    resp.read1(200)
    conn.close()

    def idle():
        w = gw.workers()
        return w and all(x.get("inflight", 0) == 0 for x in w)
    wait_until(idle, 15, what="every choice's slot freed")
    r = gw.client.completions.create(model="s", prompt="Once", max_tokens=2, n=4)
    assert len(r.choices) == 4


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", dict(prompt="hi", n=0), "n"),
    ("/v1/completions", dict(prompt="hi", n=MAXC + 1), "n"),
    ("/v1/chat/completions", dict(messages=[{"role": "user", "content": "hi"}], n=MAXC + 1), "n"),
    ("/v1/completions", dict(prompt=["a", "b"], n=MAXC // 2 + 1), "n"),
    ("/v1/completions", dict(prompt=["a"] * (MAXC + 1)), "prompt"),
    ("/v1/completions", dict(prompt=["a", [1, 2]]), "prompt"),
    ("/v1/completions", dict(prompt=[[1, 2], "a"]), "prompt"),
    ("/v1/completions", dict(prompt=[[1, 2], []]), "prompt"),
    ("/v1/completions", dict(prompt=["a", ""]), "prompt"),
    ("/v1/completions", dict(prompt=[[1, -1]]), "prompt"),
    ("/v1/completions", dict(prompt=[[1, 2.5]]), "prompt"),
    ("/v1/completions", dict(prompt=[]), "prompt"),
])
def test_bad_choices_are_400_naming_param(gw, path, body, param):
    st, _, raw = http_post(gw.base + path, dict(model="s", max_tokens=2, **body))
    e = json.loads(raw)["error"]
    assert st == 400 and e["param"] == param and e["type"] == "invalid_request_error", e


def test_n_through_the_sdk(gw):
    """The SDK's spillway_complete_n (the CLI's --choices): the same samples
    as the HTTP API's n, each with its own result."""
    body = dict(model="s", prompt="Once upon a time", max_tokens=10, temperature=1, seed=5, n=3)
    want = [ch["text"] for ch in json.loads(http_post(gw.base + "/v1/completions", body)[2])["choices"]]
    r = subprocess.run([bin_path("spillway"), "complete", "-e", gw.sdk_ep, "-m", "s", "-n", "10", "--temp", "1",
                        "--seed", "5", "--choices", "3", "Once upon a time"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    got = re.findall(r"^\[choice (\d+)\] (.*)$", r.stdout, re.M)
    assert got == [(str(i), t) for i, t in enumerate(want)], r.stdout
    assert r.stderr.count("finish=length") == 3 and r.stderr.count("completion_tokens=10") == 3, r.stderr
    r = subprocess.run([bin_path("spillway"), "complete", "-e", gw.sdk_ep, "-m", "s", "--choices", "65", "x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--choices" in r.stderr, r.stderr


def test_sdk_samples_stream_with_their_index_and_cancel_together(gw, tmp_path):
    """sdk/examples/samples.c: each sample's deltas, told apart by index, add
    up to its result; a callback's cancel ends every sample, and their
    slots come free."""
    exe = build_sdk_example("samples", tmp_path)
    r = subprocess.run([str(exe), gw.sdk_ep, "s"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    body = dict(model="s", prompt="Once upon a time", max_tokens=10, temperature=1, seed=5, n=3)
    want = [ch["text"] for ch in json.loads(http_post(gw.base + "/v1/completions", body)[2])["choices"]]
    got = re.findall(r"^sample (\d): \[(.*)\] finish=length prompt_tokens=(\d+) cached_tokens=\d+ "
                     r"completion_tokens=10 streamed=1$", r.stdout, re.M)
    assert [(int(i), t) for i, t, _ in got] == list(enumerate(want)), r.stdout
    assert len({p for _, _, p in got}) == 1, "every sample reports the prompt's tokens"
    assert "cancelled: rc=0 cancelled cancelled cancelled" in r.stdout, r.stdout
    wait_until(lambda: all(w.get("inflight", 0) == 0 for w in gw.workers()), 15, what="the samples' slots freed")


GPU_POLICY = """pools:
  - name: gpu-pool
    kind: gpu
routes:
  - model: "synth"
    target: gpu-pool
"""


def test_n_on_the_gpu_worker(cluster):
    model = shared_file("golden/synth-spm-d256-q4km.gguf")
    cluster.start_gateway(GPU_POLICY)
    cluster.start_worker("gpu-pool", "synth", model, ["--backend", "emulate", "-t", "1"], name="gpu",
                         binary="spillway-worker-gpu")
    cluster.wait_model("synth", timeout=60)
    c = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    one = [c.completions.create(model="synth", prompt="Lily and Tom", max_tokens=6, temperature=1, seed=9 + i)
           for i in range(3)]
    many = c.completions.create(model="synth", prompt="Lily and Tom", max_tokens=6, temperature=1, seed=9, n=3)
    assert [ch.text for ch in many.choices] == [r.choices[0].text for r in one]
    assert many.usage.prompt_tokens == one[0].usage.prompt_tokens
