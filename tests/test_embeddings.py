"""POST /v1/embeddings through the real gateway and CPU worker, checked
against tests/archmodels.py's numpy forward pass.

The models are tiny random llama files that declare `llama.pooling_type`
(GGUF's convention: 0 none, 1 mean, 2 cls, 3 last); the worker serves such
a file for embeddings only: its final hidden states after the output norm,
pooled as the file says and L2-normalized (as OpenAI's and llama.cpp
server's vectors are). The reference pools archmodels.forward(hidden=True)
the same way, in float64.

What is checked: `input` as a string, a list of strings, a list of token
ids and a list of token-id lists; base64 output (little-endian float32) is
the float output; usage counts the tokens (a text's BOS included); bad
input is a 400 in OpenAI's error shape naming `param`, limits from
llm/limits.h read from the header; embeddings from a generation model and
chat on an embedding model are refused; chat on the generation model of
the same cluster still works; a model wider than 1024 takes fewer inputs
(SW_MAX_EMBED_VALUES); an SDK client gets the worker's EmbedReply; the
GPU worker refuses an embedding model."""
import base64
import json
import subprocess

import numpy as np
import openai
import pytest
import zmq

import archmodels as am
from conftest import bin_path, cpu_pool_policy, free_port, http_post
from test_limits import L
from test_worker_protocol import envelope, f_bytes, one, packed_u32, parse, varint

MEAN, CLS, LAST = 1, 2, 3
MODELS = {"emb-mean": MEAN, "emb-cls": CLS, "emb-last": LAST, "gen": None}
TEXT, TEXT2 = "the cat sat on the mat", "Once upon a time"
BOS = 1   # archmodels' SentencePiece vocabulary's; the worker adds it to a text


@pytest.fixture(scope="module")
def weights():
    return am.make_weights("llama", seed=3)


@pytest.fixture
def gw(cluster, weights, tmp_path):
    hp, w = weights
    cluster.sdk_ep = f"tcp://127.0.0.1:{free_port()}"
    cluster.start_gateway(cpu_pool_policy(*MODELS), extra_args=["--sdk", cluster.sdk_ep])
    for name, pooling in MODELS.items():
        path = tmp_path / f"{name}.gguf"
        am.write_model(path, "llama", hp, w, extra_kv={"llama.pooling_type": pooling} if pooling else None)
        cluster.start_worker("cpu-pool", name, path, ["--threads", "1", "--parallel", "2"], name=name)
    for name in MODELS:
        cluster.wait_model(name, timeout=60)
    cluster.client = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    cluster.hp, cluster.w = hp, w
    cluster.ids = {t: text_ids(tmp_path / "gen.gguf", t) for t in (TEXT, TEXT2)}
    return cluster


def text_ids(path, text):
    """A text's tokens as the worker's prompts have them: the BOS, then
    what spillway-run --tokenize says (the vocabulary has few merges, so
    most of it is byte tokens)."""
    r = subprocess.run([bin_path("spillway-run"), "-m", str(path), "--tokenize", text],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [BOS] + [int(t) for t in r.stdout.split()]


def reference(gw, tokens, pooling):
    """The pooled, L2-normalized vector numpy computes for token ids."""
    h = am.forward("llama", gw.hp, gw.w, tokens, hidden=True)
    v = h.mean(0) if pooling == MEAN else h[0] if pooling == CLS else h[-1]
    return v / np.linalg.norm(v)


def close(got, want):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    cos = got @ want / (np.linalg.norm(got) * np.linalg.norm(want))
    assert cos > 0.9999 and np.abs(got - want).max() < 2e-3, (cos, np.abs(got - want).max())
    assert np.linalg.norm(got) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("model", ["emb-mean", "emb-cls", "emb-last"])
def test_every_input_form_matches_the_reference(gw, model):
    c, pooling = gw.client, MODELS[model]
    a, b = [5, 300, 17, 42, 8], [260, 261, 3, 99, 100, 101, 7, 1, 2]
    r = c.embeddings.create(model=model, input=TEXT)
    assert r.object == "list" and r.model == model and len(r.data) == 1
    assert r.data[0].object == "embedding" and r.data[0].index == 0
    ids, ids2 = gw.ids[TEXT], gw.ids[TEXT2]
    close(r.data[0].embedding, reference(gw, ids, pooling))
    assert r.usage.prompt_tokens == len(ids) and r.usage.total_tokens == len(ids)

    r = c.embeddings.create(model=model, input=[TEXT, TEXT2])
    assert [d.index for d in r.data] == [0, 1]
    close(r.data[0].embedding, reference(gw, ids, pooling))
    close(r.data[1].embedding, reference(gw, ids2, pooling))
    assert r.usage.prompt_tokens == len(ids) + len(ids2)

    r = c.embeddings.create(model=model, input=a)   # one input, as token ids (no BOS added)
    assert len(r.data) == 1 and r.usage.prompt_tokens == len(a)
    close(r.data[0].embedding, reference(gw, a, pooling))

    r = c.embeddings.create(model=model, input=[a, b, a[:1]])
    assert len(r.data) == 3 and r.usage.prompt_tokens == len(a) + len(b) + 1
    for d, toks in zip(r.data, [a, b, a[:1]]):
        close(d.embedding, reference(gw, toks, pooling))


def test_many_inputs_in_one_batch_are_each_their_own(gw):
    """More inputs than the worker has sequences, of varied lengths, one of
    them longer than the worker's batch (258 tokens at --parallel 2): each
    one's vector is what it would be alone."""
    rng = np.random.default_rng(1)
    inputs = [[int(t) for t in rng.integers(3, 320, int(n))] for n in [*rng.integers(1, 40, 8), 600, 3]]
    r = gw.client.embeddings.create(model="emb-mean", input=inputs)
    assert [d.index for d in r.data] == list(range(len(inputs)))
    for d, toks in zip(r.data, inputs):
        close(d.embedding, reference(gw, toks, MEAN))


def test_base64_is_the_floats(gw):
    body = dict(model="emb-last", input=[TEXT, TEXT2])
    st, _, raw = http_post(gw.base + "/v1/embeddings", body)
    assert st == 200, raw
    floats = json.loads(raw)
    st, _, raw = http_post(gw.base + "/v1/embeddings", dict(body, encoding_format="base64"))
    assert st == 200, raw
    b64 = json.loads(raw)
    assert b64["usage"] == floats["usage"]
    for f, b in zip(floats["data"], b64["data"]):
        got = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert got.tolist() == pytest.approx(f["embedding"], abs=1e-7)
        assert len(got) == gw.hp["E"]
    # the openai client asks for base64 unless told otherwise, and decodes it
    # then; asked for it, it hands the string on
    r = gw.client.embeddings.create(model="emb-last", input=TEXT, encoding_format="base64")
    close(np.frombuffer(base64.b64decode(r.data[0].embedding), dtype="<f4"), reference(gw, gw.ids[TEXT], LAST))
    r = gw.client.embeddings.create(model="emb-last", input=TEXT, encoding_format="float")
    close(r.data[0].embedding, reference(gw, gw.ids[TEXT], LAST))


def refused(gw, param, status=400, **body):
    """Asserts an error in OpenAI's shape naming param; returns it."""
    st, _, raw = http_post(gw.base + "/v1/embeddings", body)
    r = json.loads(raw)
    assert st == status, (st, r)
    e = r.get("error")
    assert isinstance(e, dict) and set(e) >= {"message", "type", "param", "code"}, r
    assert e["type"] == "invalid_request_error" and e["message"], r
    assert e["param"] == param, r
    return e


def test_bad_input_is_a_400_naming_param(gw):
    m = "emb-mean"
    refused(gw, "input", model=m)
    refused(gw, "input", model=m, input=[])
    refused(gw, "input", model=m, input="")
    refused(gw, "input", model=m, input=["a", ""])
    refused(gw, "input", model=m, input=[[]])
    refused(gw, "input", model=m, input=["a", 1])
    refused(gw, "input", model=m, input=[1, "a"])
    refused(gw, "input", model=m, input=[[1, 2], "a"])
    refused(gw, "input", model=m, input=[1.5])
    refused(gw, "input", model=m, input=[-1])
    refused(gw, "input", model=m, input=7)
    refused(gw, "input", model=m, input={"text": "a"})
    refused(gw, "input", model=m, input=["a"] * (L["SW_MAX_EMBED_INPUTS"] + 1))
    refused(gw, "input", model=m, input=[5] * (L["SW_MAX_EMBED_INPUT_TOKENS"] + 1))
    refused(gw, "input", model=m, input=[5] * 1025)   # past the model's context (1024)
    e = refused(gw, "input", model=m, input=[[5, 6], [400]])   # not in the vocabulary (320)
    assert "vocabulary" in e["message"]
    e = refused(gw, "input", model=m, input=["a", "x" * 2000])   # a text past the context: the worker counts it
    assert "context" in e["message"]
    refused(gw, "dimensions", model=m, input="a", dimensions=8)
    refused(gw, "encoding_format", model=m, input="a", encoding_format="int8")
    refused(gw, "model", input="a")
    refused(gw, "model", status=404, model="nope", input="a")
    # at the limits: served (a token-id input of SW_MAX_EMBED_INPUT_TOKENS
    # would need a model of that context; the test model's is 1024)
    n = L["SW_MAX_EMBED_INPUTS"]
    r = gw.client.embeddings.create(model=m, input=["a"] * n)
    assert len(r.data) == n and r.data[-1].index == n - 1
    r = gw.client.embeddings.create(model=m, input=[5] * 1024)
    close(r.data[0].embedding, reference(gw, [5] * 1024, MEAN))


def test_kinds_of_model_are_kept_apart(gw):
    e = refused(gw, "model", model="gen", input="hello")
    assert "not an embedding model" in e["message"]
    st, _, raw = http_post(gw.base + "/v1/chat/completions",
                           dict(model="emb-mean", messages=[{"role": "user", "content": "hi"}], max_tokens=4))
    assert st == 400 and "embedding model" in json.loads(raw)["error"]["message"], raw
    # the generation model beside them is as it was
    r = gw.client.chat.completions.create(model="gen", messages=[{"role": "user", "content": "the cat"}],
                                          max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1
    r = gw.client.completions.create(model="gen", prompt="the cat", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens >= 1


def test_a_wide_model_takes_fewer_inputs(cluster, tmp_path):
    """A request's answer is bounded in floats (SW_MAX_EMBED_VALUES, so the
    worker's reply fits a wire frame): a model of 2048 dimensions takes
    half of SW_MAX_EMBED_INPUTS a request, and says so."""
    hp, w = am.make_weights("llama", E=2048, V=300, n_layer=1, seed=4)
    path = tmp_path / "wide.gguf"
    am.write_model(path, "llama", hp, w, extra_kv={"llama.pooling_type": MEAN})
    cluster.start_gateway(cpu_pool_policy("wide"))
    cluster.start_worker("cpu-pool", "wide", path, ["--threads", "1", "--parallel", "2"], name="wide")
    cluster.wait_model("wide", timeout=60)
    most = L["SW_MAX_EMBED_VALUES"] // 2048
    assert most < L["SW_MAX_EMBED_INPUTS"]
    e = refused(cluster, "input", model="wide", input=[[7]] * (most + 1))
    assert str(most) in e["message"], e
    c = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    r = c.embeddings.create(model="wide", input=[[7]] * most)   # base64 on the wire: the client's default
    assert len(r.data) == most and len(r.data[-1].embedding) == 2048
    cluster.hp, cluster.w = hp, w
    close(r.data[-1].embedding, reference(cluster, [7], MEAN))


EMBED, EMBED_REPLY, ERROR = 50, 51, 7   # Envelope's fields (proto/spillway.proto)


def sdk_exchange(gw, frames, timeout_ms=30000):
    """Each frame sent over the SDK socket as a client sends it, and its
    answer's Envelope fields."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, timeout_ms)
    try:
        s.connect(gw.sdk_ep)
        out = []
        for frame in frames:
            s.send(frame)
            out.append(parse(s.recv()))
        return out
    finally:
        s.close()
        ctx.term()


def sdk_embed(gw, model, inputs):
    """An EmbedRequest over the SDK socket: the answer's Envelope fields."""
    ins = b"".join(f_bytes(3, f_bytes(1, x) if isinstance(x, str) else
                           f_bytes(2, b"".join(varint(t) for t in x))) for x in inputs)
    return sdk_exchange(gw, [envelope(EMBED, f_bytes(1, "sdk-1") + f_bytes(2, model) + ins)])[0]


def test_sdk_clients_get_the_vectors(gw):
    env = sdk_embed(gw, "emb-mean", [TEXT, [5, 6, 7]])
    assert EMBED_REPLY in env, env
    b = parse(env[EMBED_REPLY][0])
    assert one(b, 1).decode() == "sdk-1" and one(b, 2) == gw.hp["E"]
    assert one(b, 5).decode() == "cpu-pool" and one(b, 6)
    values = np.frombuffer(b"".join(b[3]), dtype="<f4").reshape(2, -1)
    close(values[0], reference(gw, gw.ids[TEXT], MEAN))
    close(values[1], reference(gw, [5, 6, 7], MEAN))
    assert packed_u32(b, 4) == [len(gw.ids[TEXT]), 3]
    env = sdk_embed(gw, "gen", ["hello"])   # refused as over HTTP
    e = parse(env[ERROR][0])
    assert one(e, 1).decode() == "sdk-1" and one(e, 2) == 400 and b"not an embedding model" in one(e, 3)


def test_the_gpu_worker_refuses_an_embedding_model(weights, tmp_path):
    """It computes no embeddings, and would serve the file for generation."""
    hp, w = weights
    path = tmp_path / "emb.gguf"
    am.write_model(path, "llama", hp, w, extra_kv={"llama.pooling_type": LAST})
    r = subprocess.run([bin_path("spillway-worker-gpu"), "--backend", "emulate", "--gateway",
                        f"tcp://127.0.0.1:{free_port()}", "--pool", "gpu-pool", "--model", f"e={path}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "is an embedding model (pooling last)" in r.stderr, r.stderr


def test_a_file_that_adds_eos_gets_it_after_a_text(cluster, weights, tmp_path):
    """tokenizer.ggml.add_eos_token (Qwen3-Embedding's files set it): a
    text's tokens end in EOS (2 here), whose row last pooling reads; token
    ids are taken as they are."""
    hp, w = weights
    path = tmp_path / "eos.gguf"
    am.write_model(path, "llama", hp, w, extra_kv={"llama.pooling_type": LAST, "tokenizer.ggml.add_eos_token": True})
    cluster.start_gateway(cpu_pool_policy("eos"))
    cluster.start_worker("cpu-pool", "eos", path, ["--threads", "1"], name="eos")
    cluster.wait_model("eos", timeout=60)
    cluster.hp, cluster.w = hp, w
    ids = text_ids(path, TEXT) + [2]
    c = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    r = c.embeddings.create(model="eos", input=TEXT)
    assert r.usage.prompt_tokens == len(ids)
    close(r.data[0].embedding, reference(cluster, ids, LAST))
    r = c.embeddings.create(model="eos", input=[5, 6])
    assert r.usage.prompt_tokens == 2
    close(r.data[0].embedding, reference(cluster, [5, 6], LAST))
