"""Tiny random-weight BERT-family encoders in GGUF ("bert" and
"nomic-bert", laid out as llama.cpp's converter lays them out), a small
WordPiece vocabulary for them, and an independent numpy forward pass to
check the CPU worker's embeddings against.

The reference follows the published definitions (BERT; nomic-bert's
rotary, SwiGLU variant): the summed token, token type 0 and (BERT)
position embeddings are LayerNormed; each block adds its attention output
(bidirectional, over the whole input, 1/sqrt(head_dim) scaling; nomic-bert
rotates q and k, NEOX halves) and LayerNorms, then adds its FFN output
(BERT: exact erf GELU with biases; nomic-bert: silu(gate) * up) and
LayerNorms; the final rows are pooled (mean, first, last) and
L2-normalized. It computes in float64 from the weights as the file stores
them (dequantized by the gguf package), so a quantized file is checked
against its own weights. Token ids for a text come from the `tokenizers`
package's WordPiece (with BertNormalizer and BertPreTokenizer), never from
the worker."""
import math

import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as QT
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from archmodels import write_tensors

MEAN, CLS, LAST = 1, 2, 3
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
UNK, CLS_ID, SEP_ID = 1, 2, 3
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~¡¿«»—–…“”‘’・")
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
WORDS = ["the", "cat", "sat", "on", "mat", "hello", "world", "un", "##believ", "##able", "play", "##ing", "##ed",
         "cafe", "naive", "uber", "中", "国", "日", "本", "ß", "σ", "ς", "##σ", "д", "##а", "once", "upon", "time"]
CASED = ["Hello", "The", "##A", "É", "##É", "Ö"]


def vocab(cased=False):
    """A WordPiece vocabulary in tokenizer.json's spelling ("##" continuations)."""
    v = SPECIAL + PUNCT + LETTERS + ["##" + c for c in LETTERS] + [str(d) for d in range(10)]
    v += ["##%d" % d for d in range(10)] + WORDS
    return v + CASED if cased else v


def phantom(tok):
    """llama.cpp's spelling of a token in a GGUF file: continuations lose
    their "##", the rest but the specials gain a U+2581."""
    if tok in SPECIAL:
        return tok
    return tok[2:] if tok.startswith("##") else "\u2581" + tok


def reference_tokenizer(v, cased=False):
    """The `tokenizers` package's BERT tokenizer over v (no [CLS]/[SEP])."""
    tk = Tokenizer(models.WordPiece({t: i for i, t in enumerate(v)}, unk_token="[UNK]", max_input_chars_per_word=100))
    tk.normalizer = normalizers.BertNormalizer(lowercase=not cased)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tk


def text_ids(text, v=None):
    """A text's ids as the model sees them: [CLS], its WordPiece ids, [SEP]."""
    return [CLS_ID] + reference_tokenizer(v or vocab()).encode(text, add_special_tokens=False).ids + [SEP_ID]


def add_vocab(wr, v, spelling="phantom"):
    wr.add_tokenizer_model("bert")
    wr.add_token_list([phantom(t) for t in v] if spelling == "phantom" else v)
    wr.add_token_types([3 if t in SPECIAL else 1 for t in v])
    wr.add_uint32("tokenizer.ggml.token_type_count", 2)
    wr.add_uint32("tokenizer.ggml.unknown_token_id", UNK)
    wr.add_uint32("tokenizer.ggml.cls_token_id", CLS_ID)
    wr.add_uint32("tokenizer.ggml.seperator_token_id", SEP_ID)   # llama.cpp's spelling of the key
    wr.add_uint32("tokenizer.ggml.padding_token_id", 0)


def write_vocab(path, v, spelling="phantom"):
    """A vocabulary-only file (what spillway-run --tokenize needs)."""
    wr = GGUFWriter(str(path), "bert")
    add_vocab(wr, v, spelling)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def make_weights(arch, E=64, n_head=4, F=128, n_layer=2, n_ctx=64, seed=0):
    """(hp, tensors by GGUF name, numpy's row-major shapes) of a random encoder."""
    rng = np.random.default_rng(seed)
    V = len(vocab())
    hp = dict(arch=arch, E=E, n_head=n_head, F=F, n_layer=n_layer, n_ctx=n_ctx, V=V, eps=1e-12 if arch == "bert" else 1e-5,
              theta=1000.0)

    def mat(rows, cols, gain=1.0):
        return (rng.standard_normal((rows, cols)) * gain / math.sqrt(cols)).astype(np.float32)

    def vec(n, around=0.0, spread=0.1):
        return (around + spread * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": vec((V, E), 0, 1.0), "token_types.weight": vec((2, E), 0, 0.5),
         "token_embd_norm.weight": vec(E, 1.0), "token_embd_norm.bias": vec(E)}
    if arch == "bert":
        w["position_embd.weight"] = vec((n_ctx, E), 0, 0.5)
    for l in range(n_layer):
        p = "blk.%d." % l
        if arch == "bert":
            for x in "qkv":
                w[p + "attn_%s.weight" % x] = mat(E, E, 2.0)
                w[p + "attn_%s.bias" % x] = vec(E)
            w[p + "attn_output.bias"] = vec(E)
            w[p + "ffn_up.bias"] = vec(F)
            w[p + "ffn_down.bias"] = vec(E)
        else:
            w[p + "attn_qkv.weight"] = mat(3 * E, E, 2.0)
            w[p + "ffn_gate.weight"] = mat(F, E)
        w[p + "attn_output.weight"] = mat(E, E)
        w[p + "attn_output_norm.weight"], w[p + "attn_output_norm.bias"] = vec(E, 1.0), vec(E)
        w[p + "ffn_up.weight"] = mat(F, E)
        w[p + "ffn_down.weight"] = mat(E, F)
        w[p + "layer_output_norm.weight"], w[p + "layer_output_norm.bias"] = vec(E, 1.0), vec(E)
    return hp, w


def write_model(path, hp, w, pooling=MEAN, quantize=None, extra_kv=None, drop_kv=(), spelling="phantom"):
    """quantize = (type, name part): matrices whose names hold the part are
    stored in that type (quantized by the gguf package). extra_kv: more
    keys (bools, ints as uint32, floats), "<arch>." or "tokenizer." ones;
    drop_kv: the "<arch>." keys left out."""
    arch = hp["arch"]
    wr = GGUFWriter(str(path), arch)
    kv = {"context_length": hp["n_ctx"], "embedding_length": hp["E"], "block_count": hp["n_layer"],
          "feed_forward_length": hp["F"], "attention.head_count": hp["n_head"],
          "attention.layer_norm_epsilon": hp["eps"], "attention.causal": False, "pooling_type": pooling}
    if arch == "nomic-bert":
        kv["rope.freq_base"] = hp["theta"]
    kv = {arch + "." + k: val for k, val in kv.items() if k not in drop_kv}
    kv.update(extra_kv or {})
    for key, val in kv.items():
        if isinstance(val, bool):
            wr.add_bool(key, val)
        elif isinstance(val, float):
            wr.add_float32(key, val)
        else:
            wr.add_uint32(key, val)
    add_vocab(wr, vocab(), spelling)
    write_tensors(wr, w, quantize)


def read_weights(path):
    """Every tensor of a file, dequantized by the gguf package, as float64."""
    r = GGUFReader(str(path))
    w = {}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape.tolist())]
        w[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float64)
    return w


def _layernorm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _rope_neox(x, theta):
    """x: [n, heads, d]; rotates (i, i + d/2) by pos * theta^(-2i/d)."""
    n, _, d = x.shape
    inv = theta ** (-np.arange(0, d // 2) * 2.0 / d)
    ang = np.arange(n)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :d // 2], x[..., d // 2:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)


def _erf(x):
    return np.vectorize(math.erf)(x)


def hidden(hp, w, tokens):
    """The final hidden rows [n, E] of one input."""
    arch, E, H, eps = hp["arch"], hp["E"], hp["n_head"], hp["eps"]
    D, n = E // H, len(tokens)
    x = w["token_embd.weight"][tokens] + w["token_types.weight"][0]
    if arch == "bert":
        x = x + w["position_embd.weight"][:n]
    x = _layernorm(x, w["token_embd_norm.weight"], w["token_embd_norm.bias"], eps)
    for l in range(hp["n_layer"]):
        p = "blk.%d." % l
        if p + "attn_qkv.weight" in w:
            qkv = x @ w[p + "attn_qkv.weight"].T
            q, k, v = qkv[:, :E], qkv[:, E:2 * E], qkv[:, 2 * E:]
        else:
            q, k, v = (x @ w[p + "attn_%s.weight" % c].T + w.get(p + "attn_%s.bias" % c, 0.0) for c in "qkv")
        q, k, v = (a.reshape(n, H, D) for a in (q, k, v))
        if arch == "nomic-bert":
            q, k = _rope_neox(q, hp["theta"]), _rope_neox(k, hp["theta"])
        s = np.einsum("ihd,jhd->hij", q, k) / math.sqrt(D)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        att = np.einsum("hij,jhd->ihd", s, v).reshape(n, E)
        o = att @ w[p + "attn_output.weight"].T + w.get(p + "attn_output.bias", 0.0)
        x = _layernorm(x + o, w[p + "attn_output_norm.weight"], w[p + "attn_output_norm.bias"], eps)
        u = x @ w[p + "ffn_up.weight"].T + w.get(p + "ffn_up.bias", 0.0)
        if arch == "nomic-bert":
            g = x @ w[p + "ffn_gate.weight"].T
            h = g / (1.0 + np.exp(-g)) * u
        else:
            h = 0.5 * u * (1.0 + _erf(u / math.sqrt(2.0)))
        f = h @ w[p + "ffn_down.weight"].T + w.get(p + "ffn_down.bias", 0.0)
        x = _layernorm(x + f, w[p + "layer_output_norm.weight"], w[p + "layer_output_norm.bias"], eps)
    return x


def embedding(hp, w, tokens, pooling):
    """The pooled, L2-normalized vector of one input."""
    h = hidden(hp, w, tokens)
    v = h.mean(0) if pooling == MEAN else h[0] if pooling == CLS else h[-1]
    return v / np.linalg.norm(v)
