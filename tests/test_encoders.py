"""BERT-family encoders (GGUF archs "bert" and "nomic-bert") served for
POST /v1/embeddings by the real gateway and CPU worker, checked against
tests/encodermodels.py's numpy forward pass (cosine > 0.9999).

The models are tiny random files with a small WordPiece vocabulary
(tokenizer.ggml.model "bert", in llama.cpp's U+2581 spelling), one per
pooling type the file may declare (mean, cls, last). What is checked:
`input` as a string, a list of strings, a list of token ids and a list of
token-id lists, with a text's ids ([CLS] ... [SEP]) from the `tokenizers`
package; the WordPiece tokenizer against that package's on strings with
punctuation, accents, CJK, unknown and long words, cased and uncased, in
both spellings; a quantized file against its own dequantized weights;
bad input (past the context, out of the vocabulary) a 400 naming `input`,
generation asked of an encoder a 400 naming `model`; a context past the
encoder's positions refused at start; files the graph does not match
refused at load, by name; the GPU worker refusing an encoder."""
import json
import subprocess

import numpy as np
import openai
import pytest
from gguf import GGMLQuantizationType as QT

import encodermodels as em
from conftest import bin_path, cpu_pool_policy, free_port, http_post
from test_embeddings import close, refused

POOLINGS = {"mean": em.MEAN, "cls": em.CLS, "last": em.LAST}
TEXT, TEXT2 = "The cat sat on the mat.", "Once upon a time, unbelievable things happened!"


def start(cluster, tmp_path, arch, seed=1, quantize=None, poolings=POOLINGS):
    """A gateway with one worker per pooling type, each serving <arch>-<pooling>."""
    hp, w = em.make_weights(arch, seed=seed)
    names = [f"{arch}-{p}" for p in poolings]
    cluster.start_gateway(cpu_pool_policy(*names))
    weights = {}
    for name, pooling in zip(names, poolings.values()):
        path = tmp_path / f"{name}.gguf"
        em.write_model(path, hp, w, pooling=pooling, quantize=quantize)
        weights[name] = (em.read_weights(path), pooling)
        cluster.start_worker("cpu-pool", name, path, ["--threads", "1", "--parallel", "2"], name=name)
    for name in names:
        cluster.wait_model(name, timeout=60)
    cluster.client = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    return hp, weights


@pytest.mark.parametrize("arch", ["bert", "nomic-bert"])
def test_every_pooling_and_input_form_matches_the_reference(cluster, tmp_path, arch):
    hp, weights = start(cluster, tmp_path, arch)
    c = cluster.client
    ids, ids2 = em.text_ids(TEXT), em.text_ids(TEXT2)
    assert em.UNK not in ids + ids2 and len(ids2) > 12   # the words are in the vocabulary, in pieces
    a, b = [5, 60, 17, 42, 8], [em.CLS_ID, 70, 71, 3, 99, 100, 101, 7, em.SEP_ID]
    for name, (w, pooling) in weights.items():
        ref = lambda toks: em.embedding(hp, w, toks, pooling)
        r = c.embeddings.create(model=name, input=TEXT)
        assert r.model == name and len(r.data) == 1 and len(r.data[0].embedding) == hp["E"]
        close(r.data[0].embedding, ref(ids))
        assert r.usage.prompt_tokens == len(ids)
        r = c.embeddings.create(model=name, input=[TEXT, TEXT2])
        assert [d.index for d in r.data] == [0, 1] and r.usage.prompt_tokens == len(ids) + len(ids2)
        close(r.data[0].embedding, ref(ids))
        close(r.data[1].embedding, ref(ids2))
        r = c.embeddings.create(model=name, input=a)   # token ids are taken as they are: no [CLS]/[SEP] added
        assert r.usage.prompt_tokens == len(a)
        close(r.data[0].embedding, ref(a))
        r = c.embeddings.create(model=name, input=[a, b, a[:1]])
        for d, toks in zip(r.data, [a, b, a[:1]]):
            close(d.embedding, ref(toks))
    # the three poolings give three different vectors of one input
    got = [np.asarray(c.embeddings.create(model=n, input=TEXT2).data[0].embedding) for n in weights]
    assert max(abs(float(x @ y)) for i, x in enumerate(got) for y in got[i + 1:]) < 0.999


def test_the_special_tokens_are_the_files(cluster, tmp_path):
    """[CLS] and [SEP] go around a text by default, and with the keys
    gguf-py writes for a BERT tokenizer (BOS [CLS], EOS [SEP],
    add_eos_token true, add_sep_token false); add_eos_token false leaves
    [SEP] out, add_bos_token false [CLS]."""
    hp, w = em.make_weights("bert", seed=7)
    files = {"gguf-py": {"tokenizer.ggml.bos_token_id": em.CLS_ID, "tokenizer.ggml.eos_token_id": em.SEP_ID,
                         "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True,
                         "tokenizer.ggml.add_sep_token": False},
             "no-sep": {"tokenizer.ggml.add_eos_token": False}, "no-cls": {"tokenizer.ggml.add_bos_token": False}}
    cluster.start_gateway(cpu_pool_policy(*files))
    for name, kv in files.items():
        em.write_model(tmp_path / f"{name}.gguf", hp, w, pooling=em.MEAN, extra_kv=kv)
        cluster.start_worker("cpu-pool", name, tmp_path / f"{name}.gguf", ["--threads", "1"], name=name)
    c = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    ids = em.text_ids(TEXT)
    want = {"gguf-py": ids, "no-sep": ids[:-1], "no-cls": ids[1:]}
    for name, toks in want.items():
        cluster.wait_model(name, timeout=60)
        r = c.embeddings.create(model=name, input=TEXT)
        assert r.usage.prompt_tokens == len(toks), name
        close(r.data[0].embedding, em.embedding(hp, em.read_weights(tmp_path / f"{name}.gguf"), toks, em.MEAN))


def test_many_inputs_in_batches_are_each_their_own(cluster, tmp_path):
    """More tokens than one batch holds (the context, 64), in inputs of
    varied lengths up to the context: each vector is its input's alone (no
    attention across inputs, positions from 0 in each)."""
    hp, weights = start(cluster, tmp_path, "bert", poolings={"mean": em.MEAN})
    w, pooling = weights["bert-mean"]
    rng = np.random.default_rng(2)
    inputs = [[int(t) for t in rng.integers(5, hp["V"], int(n))] for n in [*rng.integers(1, 30, 9), 64, 63, 1]]
    r = cluster.client.embeddings.create(model="bert-mean", input=inputs)
    assert [d.index for d in r.data] == list(range(len(inputs)))
    for d, toks in zip(r.data, inputs):
        close(d.embedding, em.embedding(hp, w, toks, pooling))


def cosine(got, want):
    got = np.asarray(got, dtype=np.float64)
    return float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))


def test_a_quantized_file_matches_its_own_weights(cluster, tmp_path):
    """Matrices in F16 and Q8_0 (the kernels' float and quantized paths),
    checked against the weights as the file holds them. A Q8_0 product also
    rounds its activations to 8 bits a block (the kernels' Q8_0 form, as
    for every quantized decoder: test_arch's bound is 0.999 too), which
    the float64 reference does not."""
    hp, w = em.make_weights("nomic-bert", seed=5)
    cluster.start_gateway(cpu_pool_policy("q8", "f16"))
    refs = {}
    for name, q in (("q8", (QT.Q8_0, "blk.")), ("f16", (QT.F16, "weight"))):
        path = tmp_path / f"{name}.gguf"
        em.write_model(path, hp, w, pooling=em.CLS, quantize=q)
        refs[name] = em.read_weights(path)
        cluster.start_worker("cpu-pool", name, path, ["--threads", "1"], name=name)
    c = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    for name, w2 in refs.items():
        cluster.wait_model(name, timeout=60)
        assert not np.array_equal(w2["blk.0.attn_qkv.weight"], w["blk.0.attn_qkv.weight"])   # it is quantized
        r = c.embeddings.create(model=name, input=[TEXT, TEXT2])
        for d, text in zip(r.data, [TEXT, TEXT2]):
            want = em.embedding(hp, w2, em.text_ids(text), em.CLS)
            if name == "f16":
                close(d.embedding, want)
            else:
                assert cosine(d.embedding, want) > 0.999, cosine(d.embedding, want)
        # ... and a file's own weights are what it is checked against: the
        # float weights give another vector
        assert cosine(r.data[1].embedding, em.embedding(hp, w, em.text_ids(TEXT2), em.CLS)) < cosine(
            r.data[1].embedding, em.embedding(hp, w2, em.text_ids(TEXT2), em.CLS))


TOKENIZE = ["the cat sat on the mat", "Hello, World!", "unbelievable playing played", "Café naïve Über",
            "中国日本 are CJK", "tab\there\nnew\rline", "zero\u200bwidth\ufeffbom", "x\x0by\x0cz\x85w",
            "a" * 100, "a" * 101, "qqqqzzzz unknownword", "x$y+z<w>v^u`t|s~r", "ΣΑΣ σας", "Дa", "İstanbul",
            "ﬁ ligature", "  leading and trailing  ", "\u3000ideographic\u3000space", "emoji 😀 here",
            "¿qué? «sí» — …", "ÉCOLE école ÖL", "\u0301alone mark", "e\u0301 combining", "Ω Å Ǆ", "ﾊﾝｶｸ",
            "한국어", "a\u2028b\u2029c", "nbsp\u00a0here", "nul\ufffdrep", "x" * 300, "12345 0.5", "[CLS] [SEP]"]


def spillway_ids(path, text):
    r = subprocess.run([bin_path("spillway-run"), "-m", str(path), "--tokenize", text], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [int(t) for t in r.stdout.split()]


@pytest.mark.parametrize("cased", [False, True])
@pytest.mark.parametrize("spelling", ["phantom", "hashes"])
def test_wordpiece_matches_the_tokenizers_package(tmp_path, cased, spelling):
    """An uncased vocabulary (no upper case in it) is lower-cased and its
    accents stripped, a cased one neither; llama.cpp's spelling of the
    pieces and tokenizer.json's read the same."""
    v = em.vocab(cased)
    path = tmp_path / "vocab.gguf"
    em.write_vocab(path, v, spelling)
    tk = em.reference_tokenizer(v, cased)
    unk = 0
    for text in TOKENIZE:
        want = tk.encode(text, add_special_tokens=False).ids
        assert spillway_ids(path, text) == want, text
        unk += want.count(em.UNK)
    assert 0 < unk < 40   # some words are unknown, most are not


def test_bad_input_and_generation_are_refused(cluster, tmp_path):
    hp, weights = start(cluster, tmp_path, "nomic-bert", poolings={"last": em.LAST})
    m = "nomic-bert-last"
    refused(cluster, "input", model=m, input=[5] * (hp["n_ctx"] + 1))   # past the context: the gateway knows it
    e = refused(cluster, "input", model=m, input=" ".join(["cat"] * hp["n_ctx"]))   # a text past it: the worker counts
    assert "context" in e["message"], e
    e = refused(cluster, "input", model=m, input=[[5, 6], [hp["V"]]])
    assert "vocabulary" in e["message"], e
    for path, body in (("/v1/chat/completions", dict(messages=[{"role": "user", "content": "hi"}])),
                       ("/v1/completions", dict(prompt="hi"))):
        st, _, raw = http_post(cluster.base + path, dict(body, model=m, max_tokens=4))
        err = json.loads(raw)["error"]
        assert st == 400 and err["param"] == "model" and "embedding model" in err["message"], raw
    # at the context: served, and the worker is as it was
    w, pooling = weights[m]
    toks = [int(t) for t in np.random.default_rng(3).integers(5, hp["V"], hp["n_ctx"])]
    r = cluster.client.embeddings.create(model=m, input=toks)
    close(r.data[0].embedding, em.embedding(hp, w, toks, pooling))


def worker_exit(path, *extra):
    """Starts a CPU worker on path (no gateway listens) and returns how it
    exited, for files and options it must refuse before it connects."""
    r = subprocess.run([bin_path("spillway-worker-cpu"), "--gateway", f"tcp://127.0.0.1:{free_port()}",
                        "--pool", "p", "--model", f"m={path}", *extra], capture_output=True, text=True, timeout=60)
    assert "AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
    return r


def test_a_context_past_the_positions_is_refused_at_start(tmp_path):
    hp, w = em.make_weights("bert")
    path = tmp_path / "bert.gguf"
    em.write_model(path, hp, w)
    r = worker_exit(path, "--ctx", str(hp["n_ctx"] + 1))
    assert r.returncode == 1 and f"the encoder has {hp['n_ctx']} positions" in r.stderr, r.stderr


@pytest.mark.parametrize("case,words", [
    ("causal", "attention.causal' = true"),
    ("no_pooling", "pooling_type' missing or none"),
    ("no_eps", "layer_norm_epsilon' missing"),
    ("classifier", "cls.output.weight' is not part of the 'bert' graph"),
    ("short_positions", "fewer than the context_length"),
    ("no_norm_bias", "missing tensor 'blk.1.layer_output_norm.bias'"),
    ("bad_qkv", "tensor 'blk.0.attn_qkv.weight': shape"),
])
def test_files_the_graph_does_not_match_are_refused(tmp_path, case, words):
    arch = "nomic-bert" if case == "bad_qkv" else "bert"
    hp, w = em.make_weights(arch)
    kw = {}
    if case == "causal":
        kw["extra_kv"] = {"bert.attention.causal": True}
    elif case == "no_pooling":
        kw["pooling"] = 0
    elif case == "no_eps":
        kw["drop_kv"] = ("attention.layer_norm_epsilon",)
    elif case == "classifier":
        w["cls.output.weight"] = np.zeros((2, hp["E"]), np.float32)
    elif case == "short_positions":
        w["position_embd.weight"] = w["position_embd.weight"][:hp["n_ctx"] - 1]
    elif case == "no_norm_bias":
        del w["blk.1.layer_output_norm.bias"]
    else:
        w["blk.0.attn_qkv.weight"] = w["blk.0.attn_qkv.weight"][:2 * hp["E"]]
    path = tmp_path / "bad.gguf"
    em.write_model(path, hp, w, **kw)
    r = worker_exit(path)
    assert r.returncode == 1 and words in r.stderr, r.stderr


def test_generation_tools_refuse_an_encoder(tmp_path):
    """spillway-run computes a decoder's logits: an encoder has none."""
    hp, w = em.make_weights("nomic-bert")
    path = tmp_path / "nomic.gguf"
    em.write_model(path, hp, w)
    r = subprocess.run([bin_path("spillway-run"), "-m", str(path), "-p", "hello", "-n", "2"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "model is an encoder: it computes embeddings only" in r.stderr, r.stderr
    assert r.stdout == "" and "runtime error" not in r.stderr


def test_the_gpu_worker_refuses_an_encoder(tmp_path):
    hp, w = em.make_weights("bert")
    path = tmp_path / "bert.gguf"
    em.write_model(path, hp, w, pooling=em.CLS)
    r = subprocess.run([bin_path("spillway-worker-gpu"), "--backend", "emulate", "--gateway",
                        f"tcp://127.0.0.1:{free_port()}", "--pool", "gpu-pool", "--model", f"e={path}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "is an embedding model (pooling cls, a bert encoder)" in r.stderr, r.stderr
