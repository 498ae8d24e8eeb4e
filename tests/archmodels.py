"""Tiny random-weight GGUF models of each architecture the CPU worker runs
(llama, qwen2, qwen3, phi3, gemma), laid out as llama.cpp's converters lay
them out, and an independent numpy forward pass to check the worker's logits
against.

The reference follows the architectures' published definitions: RMSNorm,
RoPE (interleaved pairs for llama, NEOX halves for the rest), grouped-query
causal attention, SwiGLU (GELU-tanh gate for Gemma), optional q/k/v biases
(Qwen2), per-head q/k RMSNorm (Qwen3), a fused gate+up matrix (Phi-3) and
sqrt(n_embd)-scaled embeddings (Gemma). It computes in float64 from the
weights as the file stores them (dequantized by the gguf package), so a
quantized file is checked against its own weights."""

import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as QT

ARCHS = {
    #         neox   qk_norm fused_gate_up gelu  scale_embd
    "llama": (False, False, False, False, False),
    "qwen2": (True, False, False, False, False),
    "qwen3": (True, True, False, False, False),
    "phi3": (True, False, True, False, False),
    "gemma": (True, False, False, True, True),
}

# A small SentencePiece vocabulary: unk, BOS, EOS, the 256 byte tokens and
# some words, enough for the loader and for text prompts.
WORDS = ["\u2581the", "\u2581a", "\u2581cat", "\u2581sat", "\u2581on", "\u2581mat", "\u2581Once", "\u2581upon",
         "\u2581time", "\u2581there", "\u2581was", "\u2581dog", "\u2581and", "\u2581ran", "e", "t", "a", "o"]


def spm_vocab(n_vocab):
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + WORDS
    types = [2, 3, 3] + [6] * 256 + [1] * len(WORDS)
    i = 0
    while len(toks) < n_vocab:
        toks.append("\u2581w%d" % i)
        types.append(1)
        i += 1
    scores = [0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(len(toks) - 259)]
    return toks[:n_vocab], scores[:n_vocab], types[:n_vocab]


def make_weights(arch, E=256, n_head=4, n_kv=2, hd=64, F=512, V=320, n_layer=2, seed=0, bias=None):
    """Random weights, scaled so that activations stay near unit size."""
    rng = np.random.default_rng(seed)
    QD, KVD = n_head * hd, n_kv * hd
    neox, qk_norm, fused, gelu, scale_embd = ARCHS[arch]
    bias = arch == "qwen2" if bias is None else bias

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": (rng.standard_normal((V, E)) * (0.1 if scale_embd else 1.0)).astype(np.float32),
         "output_norm.weight": norm(E)}
    if arch != "gemma":   # Gemma ties its output to the embedding
        w["output.weight"] = mat(V, E)
    for l in range(n_layer):
        p = "blk.%d." % l
        w[p + "attn_norm.weight"] = norm(E)
        w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"] = mat(QD, E), mat(KVD, E), mat(KVD, E)
        if bias:
            for k, n in (("q", QD), ("k", KVD), ("v", KVD)):
                w[p + "attn_%s.bias" % k] = (0.5 * rng.standard_normal(n)).astype(np.float32)
        if qk_norm:   # gains near 2, so that leaving the norms out shows
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = 2 * norm(hd), 2 * norm(hd)
        w[p + "attn_output.weight"] = mat(E, QD)
        w[p + "ffn_norm.weight"] = norm(E)
        w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(F, E), mat(F, E)
        w[p + "ffn_down.weight"] = mat(E, F)
    hp = dict(E=E, n_head=n_head, n_kv=n_kv, hd=hd, F=F, V=V, n_layer=n_layer, theta=10000.0, eps=1e-6)
    return hp, w


def fuse(arch, w, n_layer, fused_qkv=False):
    """The tensors as the file stores them: Phi-3's gate and up in one
    ffn_up (gate rows first), and with fused_qkv one attn_qkv (+ bias)."""
    out = dict(w)
    for l in range(n_layer):
        p = "blk.%d." % l
        if ARCHS.get(arch, ARCHS["llama"])[2]:
            out[p + "ffn_up.weight"] = np.concatenate([out.pop(p + "ffn_gate.weight"), out[p + "ffn_up.weight"]])
        if fused_qkv:
            out[p + "attn_qkv.weight"] = np.concatenate([out.pop(p + "attn_%s.weight" % k) for k in "qkv"])
            if p + "attn_q.bias" in out:
                out[p + "attn_qkv.bias"] = np.concatenate([out.pop(p + "attn_%s.bias" % k) for k in "qkv"])
    return out


def write_model(path, arch, hp, w, fused_qkv=False, extra_tensors=None, rope_dims=None, rope_scaling=None,
                extra_kv=None):
    wr = GGUFWriter(str(path), arch)
    wr.add_context_length(1024)
    wr.add_embedding_length(hp["E"])
    wr.add_block_count(hp["n_layer"])
    wr.add_feed_forward_length(hp["F"])
    wr.add_head_count(hp["n_head"])
    wr.add_head_count_kv(hp["n_kv"])
    if hp["hd"] * hp["n_head"] != hp["E"]:
        wr.add_key_length(hp["hd"])
        wr.add_value_length(hp["hd"])
    wr.add_rope_freq_base(hp["theta"])
    if rope_dims:   # rotate only the first rope_dims dims of each head (the reference rotates all)
        wr.add_rope_dimension_count(rope_dims)
    if rope_scaling:   # (type, factor)
        wr.add_rope_scaling_type(gguf.RopeScalingType(rope_scaling[0]))
        wr.add_rope_scaling_factor(rope_scaling[1])
    wr.add_layer_norm_rms_eps(hp["eps"])
    wr.add_file_type(0)
    for key, value in (extra_kv or {}).items():   # unsigned integers
        wr.add_uint32(key, value)
    toks, scores, types = spm_vocab(hp["V"])
    wr.add_tokenizer_model("llama")
    wr.add_token_list(toks)
    wr.add_token_scores(scores)
    wr.add_token_types(types)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    tensors = fuse(arch, w, hp["n_layer"], fused_qkv)
    tensors.update(extra_tensors or {})
    for name, a in tensors.items():
        wr.add_tensor(name, a)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def read_weights(path):
    """(arch, hp, w) from a file, fused tensors split back, every tensor
    dequantized by the gguf package."""
    r = GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()

    def kv(key, default=None):
        f = r.fields.get(arch + "." + key)
        return default if f is None else f.contents()

    E, n_head = kv("embedding_length"), kv("attention.head_count")
    hp = dict(E=E, n_head=n_head, n_kv=kv("attention.head_count_kv", n_head), hd=kv("attention.key_length", E // n_head),
              F=kv("feed_forward_length"), n_layer=kv("block_count"), theta=kv("rope.freq_base", 10000.0),
              eps=kv("attention.layer_norm_rms_epsilon", 1e-5),
              rope_scale=kv("rope.scaling.factor", 0.0) if kv("rope.scaling.type", "linear") == "linear" else 0.0)
    w = {}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape.tolist())]   # numpy order: rows, then the contiguous dim
        a = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float64)
        w[t.name] = a
    hp["V"] = w["token_embd.weight"].shape[0]
    QD, KVD, F = hp["n_head"] * hp["hd"], hp["n_kv"] * hp["hd"], hp["F"]
    for l in range(hp["n_layer"]):
        p = "blk.%d." % l
        if p + "attn_qkv.weight" in w:
            qkv = w.pop(p + "attn_qkv.weight")
            w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"] = qkv[:QD], qkv[QD:QD + KVD], qkv[QD + KVD:]
        if p + "attn_qkv.bias" in w:
            b = w.pop(p + "attn_qkv.bias")
            w[p + "attn_q.bias"], w[p + "attn_k.bias"], w[p + "attn_v.bias"] = b[:QD], b[QD:QD + KVD], b[QD + KVD:]
        if ARCHS[arch][2]:
            gu = w[p + "ffn_up.weight"]
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = gu[:F], gu[F:]
    return arch, hp, w


def _rmsnorm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def _rope(x, pos, theta, neox):
    """x: [T, heads, hd]; rotates all hd dims."""
    hd = x.shape[-1]
    half = hd // 2
    inv = theta ** (-2.0 * np.arange(half) / hd)
    ang = np.asarray(pos)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x = x.copy()
    if neox:
        a, b = x[..., :half].copy(), x[..., half:].copy()
        x[..., :half], x[..., half:] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0::2].copy(), x[..., 1::2].copy()
        x[..., 0::2], x[..., 1::2] = a * c - b * s, a * s + b * c
    return x


def forward(arch, hp, w, tokens, flags=None):
    """Logits [T, V] for a prompt of token ids at positions 0..T-1; flags
    (as in ARCHS) override the architecture's."""
    neox, qk_norm, _, gelu, scale_embd = flags or ARCHS[arch]
    E, H, KV, hd, eps = hp["E"], hp["n_head"], hp["n_kv"], hp["hd"], hp["eps"]
    T = len(tokens)
    pos = np.arange(T) / (hp.get("rope_scale") or 1.0)   # linear RoPE scaling
    x = w["token_embd.weight"][tokens].astype(np.float64)
    if scale_embd:
        x = x * np.sqrt(E)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(hp["n_layer"]):
        p = "blk.%d." % l
        h = _rmsnorm(x, w[p + "attn_norm.weight"], eps)
        q, k, v = (h @ w[p + "attn_%s.weight" % n].T + w.get(p + "attn_%s.bias" % n, 0.0) for n in "qkv")
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
        if qk_norm:
            q = _rmsnorm(q, w[p + "attn_q_norm.weight"], eps)
            k = _rmsnorm(k, w[p + "attn_k_norm.weight"], eps)
        q, k = _rope(q, pos, hp["theta"], neox), _rope(k, pos, hp["theta"], neox)
        out = np.zeros((T, H, hd))
        for hh in range(H):
            g = hh // (H // KV)
            s = q[:, hh, :] @ k[:, g, :].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, g, :]
        x = x + out.reshape(T, H * hd) @ w[p + "attn_output.weight"].T
        h = _rmsnorm(x, w[p + "ffn_norm.weight"], eps)
        gt, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        if gelu:
            act = 0.5 * gt * (1 + np.tanh(np.sqrt(2 / np.pi) * (gt + 0.044715 * gt ** 3)))
        else:
            act = gt / (1 + np.exp(-gt))
        x = x + (act * up) @ w[p + "ffn_down.weight"].T
    x = _rmsnorm(x, w["output_norm.weight"], eps)
    out_w = w.get("output.weight", w["token_embd.weight"])
    return x @ out_w.T + w.get("output.bias", 0.0)


def copy_gguf(src, dst, drop=()):
    """dst: src's metadata and tensors, less the tensors named in drop."""
    r = GGUFReader(str(src))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    wr = GGUFWriter(str(dst), arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        wr.add_key_value(f.name, f.contents(), vt, sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        if t.name in drop:
            continue
        if t.tensor_type in (QT.F32, QT.F16):
            wr.add_tensor(t.name, t.data)
        else:
            wr.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
