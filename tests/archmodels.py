"""Tiny random-weight GGUF models of each architecture the CPU worker runs
(llama, qwen2, qwen3, qwen3moe, qwen2moe, phi3, gemma, gemma2, gemma3,
granite, granitemoe, smollm3, gpt-oss, olmo2, and Mixtral's mixture of
experts in a llama file), laid out as llama.cpp's converters lay them out, and an independent
numpy forward pass to check the worker's logits against.

The reference follows the architectures' published definitions: RMSNorm,
RoPE (interleaved pairs for llama, NEOX halves for the rest), grouped-query
causal attention, SwiGLU (GELU-tanh gate for Gemma), optional q/k/v biases
(Qwen2), per-head q/k RMSNorm (Qwen3, Gemma 3), a fused gate+up matrix
(Phi-3), sqrt(n_embd)-scaled embeddings (Gemma), and Gemma 2/3's norms of
the attention and FFN outputs, soft-capped scores and logits (Gemma 2) and
sliding-window layers (all but every 2nd in Gemma 2, every 6th in Gemma 3,
whose sliding layers also have their own RoPE base, unscaled), Granite's
embedding, residual, query and logit multipliers, SmolLM3's layers without
RoPE (every 4th), Phi-3's LongRoPE tables, and mixtures of experts
(Qwen3-MoE, Mixtral, Granite's): a router's softmax picks each token's top
experts, whose outputs are summed with the chosen weights renormalized (not
in Qwen2-MoE, which adds a sigmoid-gated shared expert), and gpt-oss's
attention sinks (a logit per head in each softmax's denominator), output and
expert biases, router bias, clamped SwiGLU and softmax over the chosen
experts' logits, with sliding windows every other layer, and OLMo 2's
blocks without input norms (their outputs normed instead) and q/k norms
over all heads at once. It computes
in float64 from the weights as the file stores them (dequantized by the
gguf package), so a quantized file is checked against its own weights.

The test files make the Gemma 2/3 differences large enough to see in 20
tokens: a window of 8 and soft-caps of 2 and 2.5 (the real models' 4096 or
512-1024, 50 and 30 would hardly touch such a short prompt)."""

import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as QT

ARCHS = {
    #          neox   qk_norm fused_gate_up gelu  scale_embd post_norms softcap swa own_rope granite nope oai olmo2
    "llama": (False, False, False, False, False, False, False, 0, False, False, False, False, False),
    "qwen2": (True, False, False, False, False, False, False, 0, False, False, False, False, False),
    "qwen3": (True, True, False, False, False, False, False, 0, False, False, False, False, False),
    "qwen3moe": (True, True, False, False, False, False, False, 0, False, False, False, False, False),
    "qwen2moe": (True, False, False, False, False, False, False, 0, False, False, False, False, False),
    "phi3": (True, False, True, False, False, False, False, 0, False, False, False, False, False),
    "gemma": (True, False, False, True, True, False, False, 0, False, False, False, False, False),
    "gemma2": (True, False, False, True, True, True, True, 2, False, False, False, False, False),
    "gemma3": (True, True, False, True, True, True, False, 6, True, False, False, False, False),
    "granite": (False, False, False, False, False, False, False, 0, False, True, False, False, False),
    "granitemoe": (False, False, False, False, False, False, False, 0, False, True, False, False, False),
    "smollm3": (False, False, False, False, False, False, False, 0, False, False, True, False, False),
    "gpt-oss": (True, False, False, False, False, False, False, 2, False, False, False, True, False),
    "olmo2": (True, False, False, False, False, True, False, 0, False, False, False, False, True),
}
OLMO2 = 12   # OLMo 2's flag: no input norms, q/k norms over all heads at once
OAI = 11   # gpt-oss's flag: clamped SwiGLU, softmax over the chosen experts, its FFN norm's name
SHEXP = 384   # Qwen2-MoE's shared expert width in the test files
NOPE_PERIOD = 4   # SmolLM3: no RoPE in layers 4, 8, ... (1-based); llama.cpp's fixed step
# Granite's multipliers in the test files: far enough from 1 (and the query
# scale from 1/sqrt(64)) that leaving any out shows; the real 3.x models have
# 12, 0.22, 1/64 and 8 or so.
GRANITE = dict(embd_scale=3.0, residual_scale=0.5, attn_scale=0.3, logit_scale=4.0)
FUSED = 2   # the flag that is a file layout, not a computation

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


def make_weights(arch, E=256, n_head=4, n_kv=2, hd=64, F=512, V=320, n_layer=None, seed=0, bias=None, experts=None):
    """Random weights, scaled so that activations stay near unit size, and
    the hyperparameters (Gemma 3 gets 6 layers: five sliding, one global).
    experts = (count, used, width) makes the FFN a mixture (Qwen3-MoE's
    default: 8 experts, 2 used, 256 wide)."""
    rng = np.random.default_rng(seed)
    QD, KVD = n_head * hd, n_kv * hd
    neox, qk_norm, fused, gelu, scale_embd, post_norms, softcap, swa, own_rope, granite, nope, oai, olmo2 = ARCHS[arch]
    bias = arch in ("qwen2", "qwen2moe", "gpt-oss") if bias is None else bias
    n_layer = n_layer or {"gemma3": 6, "smollm3": NOPE_PERIOD}.get(arch, 2)
    experts = experts or ((8, 2, 256) if arch in ("qwen3moe", "granitemoe", "qwen2moe", "gpt-oss") else None)
    if arch in ("granitemoe", "gpt-oss"):   # its files' feed_forward_length is the experts' width
        F = experts[2]

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": (rng.standard_normal((V, E)) * (0.1 if scale_embd else 1.0)).astype(np.float32),
         "output_norm.weight": norm(E)}
    if not arch.startswith("gemma"):   # Gemma ties its output to the embedding
        w["output.weight"] = mat(V, E)
    for l in range(n_layer):
        p = "blk.%d." % l
        if not olmo2:
            w[p + "attn_norm.weight"] = norm(E)
        w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"] = mat(QD, E), mat(KVD, E), mat(KVD, E)
        if bias:
            for k, n in (("q", QD), ("k", KVD), ("v", KVD)):
                w[p + "attn_%s.bias" % k] = (0.5 * rng.standard_normal(n)).astype(np.float32)
        if qk_norm:   # gains near 2, so that leaving the norms out shows
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = 2 * norm(hd), 2 * norm(hd)
        if olmo2:     # over all heads at once
            w[p + "attn_q_norm.weight"], w[p + "attn_k_norm.weight"] = 2 * norm(QD), 2 * norm(KVD)
        w[p + "attn_output.weight"] = mat(E, QD)
        if not olmo2:
            w[p + ("post_attention_norm.weight" if oai else "ffn_norm.weight")] = norm(E)
        if oai:   # sinks of about the scores' own size; biases of a fraction of the products'
            w[p + "attn_output.bias"] = (0.5 * rng.standard_normal(E)).astype(np.float32)
            w[p + "attn_sinks.weight"] = rng.standard_normal(n_head).astype(np.float32)
        if experts:
            ne, _, fe = experts
            w[p + "ffn_gate_inp.weight"] = mat(ne, E)
            w[p + "ffn_gate_exps.weight"] = np.stack([mat(fe, E) for _ in range(ne)])
            w[p + "ffn_up_exps.weight"] = np.stack([mat(fe, E) for _ in range(ne)])
            w[p + "ffn_down_exps.weight"] = np.stack([mat(E, fe) for _ in range(ne)])
            if oai:
                w[p + "ffn_gate_inp.bias"] = rng.standard_normal(ne).astype(np.float32)
                for k, n in (("gate", fe), ("up", fe), ("down", E)):
                    w[p + "ffn_%s_exps.bias" % k] = (0.5 * rng.standard_normal((ne, n))).astype(np.float32)
            if arch == "qwen2moe":   # the shared expert, SHEXP wide, and its gate
                w[p + "ffn_gate_inp_shexp.weight"] = (rng.standard_normal(E) / np.sqrt(E)).astype(np.float32)
                w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"] = mat(SHEXP, E), mat(SHEXP, E)
                w[p + "ffn_down_shexp.weight"] = mat(E, SHEXP)
        else:
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = mat(F, E), mat(F, E)
            w[p + "ffn_down.weight"] = mat(E, F)
        if post_norms:
            w[p + "post_attention_norm.weight"], w[p + "post_ffw_norm.weight"] = norm(E), norm(E)
    hp = dict(E=E, n_head=n_head, n_kv=n_kv, hd=hd, F=F, V=V, n_layer=n_layer, theta=10000.0, eps=1e-6)
    if softcap:
        hp.update(attn_softcap=2.0, final_softcap=2.5)
    if swa:
        hp["n_swa"] = 8
    if own_rope:   # global layers: a far lower base and linear scaling, so that the two kinds differ
        hp.update(theta=1e6, rope_scale=4.0)
    if experts:
        hp.update(n_expert=experts[0], n_expert_used=experts[1], n_ff_exp=experts[2])
    if arch == "qwen2moe":
        hp.update(n_ff_shexp=SHEXP, expert_renorm=False)
    if granite:
        hp.update(GRANITE)
    return hp, w


def fuse(arch, w, n_layer, fused_qkv=False):
    """The tensors as the file stores them: Phi-3's gate and up in one
    ffn_up (gate rows first), and with fused_qkv one attn_qkv (+ bias)."""
    out = dict(w)
    for l in range(n_layer):
        p = "blk.%d." % l
        if ARCHS.get(arch, ARCHS["llama"])[FUSED]:
            out[p + "ffn_up.weight"] = np.concatenate([out.pop(p + "ffn_gate.weight"), out[p + "ffn_up.weight"]])
        if fused_qkv:
            out[p + "attn_qkv.weight"] = np.concatenate([out.pop(p + "attn_%s.weight" % k) for k in "qkv"])
            if p + "attn_q.bias" in out:
                out[p + "attn_qkv.bias"] = np.concatenate([out.pop(p + "attn_%s.bias" % k) for k in "qkv"])
    return out


def gpt2_byte_symbols():
    """GPT-2's byte-level alphabet: each byte as the printable code point
    that stands for it in a BPE vocabulary (printable Latin-1 as itself,
    the rest from U+0100 up)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    sym, extra = {}, 0
    for b in range(256):
        if b in keep:
            sym[b] = chr(b)
        else:
            sym[b] = chr(256 + extra)
            extra += 1
    return [sym[b] for b in range(256)]


def write_model(path, arch, hp, w, fused_qkv=False, extra_tensors=None, rope_dims=None, rope_scaling=None,
                extra_kv=None, swa_pattern=None, longrope=None, quantize=None, vocab=None):
    """longrope = (long factors, short factors, original context, attention
    factor): Phi-3's LongRoPE, as its converter writes it (no scaling type).
    quantize = (type, name part): the tensors whose names contain the part
    stored in that type, quantized by the gguf package (gpt-oss's experts
    are MXFP4 in its files). vocab: a byte-level BPE vocabulary instead of
    the SentencePiece one, a dict of tokens, types, merges, eos and
    chat_template."""
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
    if hp.get("rope_scale") and not rope_scaling:
        rope_scaling = ("linear", hp["rope_scale"])
    if rope_scaling:   # (type, factor[, YaRN's original context])
        wr.add_rope_scaling_type(gguf.RopeScalingType(rope_scaling[0]))
        wr.add_rope_scaling_factor(rope_scaling[1])
        if len(rope_scaling) > 2:
            wr.add_rope_scaling_orig_ctx_len(rope_scaling[2])
    if longrope:
        wr.add_rope_scaling_orig_ctx_len(longrope[2])
        wr.add_rope_scaling_attn_factors(longrope[3])
        extra_tensors = dict(extra_tensors or {}, **{"rope_factors_long.weight": np.float32(longrope[0]),
                                                     "rope_factors_short.weight": np.float32(longrope[1])})
    wr.add_layer_norm_rms_eps(hp["eps"])
    wr.add_file_type(0)
    if "attn_softcap" in hp:
        wr.add_attn_logit_softcapping(hp["attn_softcap"])
        wr.add_final_logit_softcapping(hp["final_softcap"])
    if "n_swa" in hp:
        wr.add_sliding_window(hp["n_swa"])
    if swa_pattern is not None:   # a period, or one flag per layer
        wr.add_sliding_window_pattern(swa_pattern)
    if hp.get("n_expert"):
        wr.add_expert_count(hp["n_expert"])
        wr.add_expert_used_count(hp["n_expert_used"])
        wr.add_expert_feed_forward_length(hp["n_ff_exp"])
    if hp.get("n_ff_shexp"):
        wr.add_expert_shared_feed_forward_length(hp["n_ff_shexp"])
    if "residual_scale" in hp:   # Granite's multipliers
        wr.add_embedding_scale(hp["embd_scale"])
        wr.add_residual_scale(hp["residual_scale"])
        wr.add_attention_scale(hp["attn_scale"])
        wr.add_logit_scale(hp["logit_scale"])
    for key, value in (extra_kv or {}).items():   # unsigned integers, or booleans
        wr.add_bool(key, value) if isinstance(value, bool) else wr.add_uint32(key, value)
    if vocab:
        wr.add_tokenizer_model("gpt2")
        wr.add_tokenizer_pre("gpt-4o")
        wr.add_token_list(vocab["tokens"])
        wr.add_token_types(vocab["types"])
        wr.add_token_merges(vocab["merges"])
        wr.add_eos_token_id(vocab["eos"])
        wr.add_add_bos_token(False)
        wr.add_chat_template(vocab["chat_template"])
    else:
        toks, scores, types = spm_vocab(hp["V"])
        wr.add_tokenizer_model("llama")
        wr.add_token_list(toks)
        wr.add_token_scores(scores)
        wr.add_token_types(types)
        wr.add_bos_token_id(1)
        wr.add_eos_token_id(2)
    tensors = fuse(arch, w, hp["n_layer"], fused_qkv)
    tensors.update(extra_tensors or {})
    write_tensors(wr, tensors, quantize)


def write_tensors(wr, tensors, quantize=None):
    """Adds the tensors to a GGUFWriter and writes its file: the matrices
    whose names hold quantize[1] stored as type quantize[0] (quantized by
    the gguf package), the rest as they are."""
    for name, a in tensors.items():
        if quantize and quantize[1] in name and a.ndim >= 2:
            wr.add_tensor(name, gguf.quants.quantize(a, quantize[0]), raw_dtype=quantize[0])
        else:
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
              rope_type=kv("rope.scaling.type", "linear"), rope_orig_ctx=kv("rope.scaling.original_context_length",
                                                                             kv("context_length", 2048)))
    hp["rope_scale"] = kv("rope.scaling.factor", 0.0) if hp["rope_type"] in ("linear", "yarn") else 0.0
    hp["attn_factor"] = kv("rope.scaling.attn_factor", 1.0)
    gemma2 = arch == "gemma2"   # the keys' defaults, as the worker's loader has them
    hp.update(attn_softcap=kv("attn_logit_softcapping", 50.0 if gemma2 else 0.0),
              final_softcap=kv("final_logit_softcapping", 30.0 if gemma2 else 0.0),
              n_swa=kv("attention.sliding_window", 4096 if gemma2 else 0),
              theta_swa=kv("rope.freq_base_swa", hp["theta"] if arch == "olmo2" else 10000.0))   # OLMo 3: the global base
    if kv("attention.sliding_window_pattern") is not None:
        hp["swa_pattern"] = kv("attention.sliding_window_pattern")
    if kv("expert_count"):
        hp.update(n_expert=kv("expert_count"), n_expert_used=kv("expert_used_count"), n_ff_exp=kv("expert_feed_forward_length"))
    if arch == "qwen2moe":   # its chosen experts keep their softmax weights
        hp.update(n_ff_shexp=kv("expert_shared_feed_forward_length", hp["F"]), expert_renorm=False)
    if arch.startswith("granite"):   # each multiplier 0 or absent: unset, the default stays
        hp.update(embd_scale=kv("embedding_scale") or 1.0, residual_scale=kv("residual_scale") or 1.0,
                  attn_scale=kv("attention.scale") or 1.0 / np.sqrt(hp["hd"]), logit_scale=kv("logit_scale") or 1.0)
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
        if ARCHS[arch][FUSED]:
            gu = w[p + "ffn_up.weight"]
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = gu[:F], gu[F:]
    return arch, hp, w


def _rmsnorm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def _rope_freqs(hd, theta, hp, scaled, factors=None):
    """Pair i's frequency theta^(-2i/hd), divided by the file's factors
    (LongRoPE's), scaled (linear: divided by the factor; YaRN: blended
    between that and unscaled over the pairs whose wavelengths the original
    context holds 1 to 32 times), and the rotated dims' magnitude (the
    file's attention factor, times YaRN's 1 + 0.1 ln factor)."""
    inv = theta ** (-2.0 * np.arange(hd // 2) / hd)
    if factors is not None:
        inv = inv / factors
    f = hp.get("rope_scale") or 0.0
    a = hp.get("attn_factor", 1.0)
    if not scaled or not f:
        return inv, a
    if hp.get("rope_type") != "yarn":
        return inv / f, a
    corr = lambda turns: hd * np.log(hp["rope_orig_ctx"] / (turns * 2 * np.pi)) / (2 * np.log(theta))
    low, high = max(0.0, np.floor(corr(32.0))), min(hd - 1.0, np.ceil(corr(1.0)))
    keep = 1 - np.clip((np.arange(hd // 2) - low) / max(0.001, high - low), 0, 1)
    return inv * ((1 - keep) / f + keep), a * (1 + 0.1 * np.log(f))


def _rope(x, pos, inv, neox, mscale=1.0):
    """x: [T, heads, hd]; rotates all hd dims by pos * inv[i], times mscale."""
    hd = x.shape[-1]
    half = hd // 2
    ang = np.asarray(pos)[:, None] * inv[None, :]
    c, s = mscale * np.cos(ang)[:, None, :], mscale * np.sin(ang)[:, None, :]
    x = x.copy()
    if neox:
        a, b = x[..., :half].copy(), x[..., half:].copy()
        x[..., :half], x[..., half:] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0::2].copy(), x[..., 1::2].copy()
        x[..., 0::2], x[..., 1::2] = a * c - b * s, a * s + b * c
    return x


def _sliding(hp, swa, l):
    """Whether layer l uses the window: the file's pattern (a period, or a
    flag per layer) overrides the architecture's period swa."""
    if not swa or not hp.get("n_swa"):
        return False
    pat = hp.get("swa_pattern", swa)
    if isinstance(pat, list):
        return bool(pat[l])
    return pat == 0 or l % pat < pat - 1


def _ffn(h, gate, up, down, gelu, oai=False, biases=(0.0, 0.0, 0.0)):
    gt, u = h @ gate.T + biases[0], h @ up.T + biases[1]
    if gelu:
        act = 0.5 * gt * (1 + np.tanh(np.sqrt(2 / np.pi) * (gt + 0.044715 * gt ** 3)))
    elif oai:   # gpt-oss: the gate clamped above at 7, up to +-7, a sharper sigmoid, up + 1
        gt, u = np.minimum(gt, 7.0), np.clip(u, -7.0, 7.0) + 1
        act = gt / (1 + np.exp(-1.702 * gt))
    else:
        act = gt / (1 + np.exp(-gt))
    return (act * u) @ down.T + biases[2]


def _moe(h, w, p, hp, gelu, renorm=True, oai=False):
    """Each row through its n_expert_used best experts, weighted by their
    softmax probabilities (renormalized over the chosen; gpt-oss: the
    softmax of the chosen logits, the same up to the clamp the others
    apply), plus Qwen2-MoE's shared expert (when w has it) times the sigmoid
    of its gate. The router's and the experts' biases count when w has them."""
    r = h @ w[p + "ffn_gate_inp.weight"].T + w.get(p + "ffn_gate_inp.bias", 0.0)
    prob = np.exp(r - r.max(axis=1, keepdims=True))
    prob /= prob.sum(axis=1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = np.argsort(-prob[t], kind="stable")[:hp["n_expert_used"]]
        wt = prob[t, top] / (prob[t, top].sum() if renorm else 1.0)
        for e, we in zip(top, wt):
            b = tuple(w[p + "ffn_%s_exps.bias" % k][e] if p + "ffn_%s_exps.bias" % k in w else 0.0
                      for k in ("gate", "up", "down"))
            out[t] += we * _ffn(h[t:t + 1], w[p + "ffn_gate_exps.weight"][e], w[p + "ffn_up_exps.weight"][e],
                                w[p + "ffn_down_exps.weight"][e], gelu, oai, b)[0]
    if p + "ffn_gate_inp_shexp.weight" in w:
        gate = 1 / (1 + np.exp(-(h @ w[p + "ffn_gate_inp_shexp.weight"])))
        out += gate[:, None] * _ffn(h, w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"],
                                    w[p + "ffn_down_shexp.weight"], gelu)
    return out


def _softcap(s, cap):
    return cap * np.tanh(s / cap) if cap else s


def forward(arch, hp, w, tokens, flags=None, moe_renorm=None, n_ctx=4096, hidden=False):
    """Logits [T, V] for a prompt of token ids at positions 0..T-1; flags
    (as in ARCHS) and moe_renorm override the architecture's. A LongRoPE
    file rotates with its long factors when the context n_ctx exceeds the
    original one, else with its short ones (llama.cpp's choice). hidden:
    the final-normed hidden states [T, E] instead (what an embedding model
    pools)."""
    neox, qk_norm, _, gelu, scale_embd, post_norms, softcap, swa, own_rope, granite, nope, oai, olmo2 = flags or ARCHS[arch]
    E, H, KV, hd, eps = hp["E"], hp["n_head"], hp["n_kv"], hp["hd"], hp["eps"]
    g = hp if granite else dict(embd_scale=1.0, residual_scale=1.0, attn_scale=1 / np.sqrt(hd), logit_scale=1.0)
    T = len(tokens)
    pos = np.arange(T)
    x = w["token_embd.weight"][tokens].astype(np.float64) * g["embd_scale"]
    if scale_embd:
        x = x * np.sqrt(E)
    causal = np.triu(np.full((T, T), -np.inf), 1)
    # a query at p sees p - n_swa + 1 .. p in the sliding layers
    window = causal + np.tril(np.full((T, T), -np.inf), -hp.get("n_swa", 0)) if hp.get("n_swa") else causal
    for l in range(hp["n_layer"]):
        p = "blk.%d." % l
        sliding = _sliding(hp, swa, l)
        mask = window if sliding else causal
        own = sliding and own_rope   # Gemma 3's sliding layers: their own base, unscaled
        factors = None
        if "rope_factors_long.weight" in w:
            factors = w["rope_factors_%s.weight" % ("long" if n_ctx > hp["rope_orig_ctx"] else "short")]
        inv, ms = _rope_freqs(hd, hp.get("theta_swa", 10000.0) if own else hp["theta"], hp, not own, factors)
        h = _rmsnorm(x, w[p + "attn_norm.weight"], eps) if p + "attn_norm.weight" in w else x   # OLMo 2: none
        q, k, v = (h @ w[p + "attn_%s.weight" % n].T + w.get(p + "attn_%s.bias" % n, 0.0) for n in "qkv")
        if olmo2:
            q, k = _rmsnorm(q, w[p + "attn_q_norm.weight"], eps), _rmsnorm(k, w[p + "attn_k_norm.weight"], eps)
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
        if qk_norm:
            q = _rmsnorm(q, w[p + "attn_q_norm.weight"], eps)
            k = _rmsnorm(k, w[p + "attn_k_norm.weight"], eps)
        if not (nope and (l + 1) % NOPE_PERIOD == 0):
            q, k = _rope(q, pos, inv, neox, ms), _rope(k, pos, inv, neox, ms)
        out = np.zeros((T, H, hd))
        for hh in range(H):
            kv = hh // (H // KV)
            s = _softcap(q[:, hh, :] @ k[:, kv, :].T * g["attn_scale"], softcap and hp["attn_softcap"]) + mask
            # a sink (gpt-oss) is one more logit in the denominator, with no value
            sink = w[p + "attn_sinks.weight"][hh] if p + "attn_sinks.weight" in w else -np.inf
            m = np.maximum(s.max(axis=1, keepdims=True), sink)
            s = np.exp(s - m)
            out[:, hh, :] = (s / (s.sum(axis=1, keepdims=True) + np.exp(sink - m))) @ v[:, kv, :]
        a = out.reshape(T, H * hd) @ w[p + "attn_output.weight"].T + w.get(p + "attn_output.bias", 0.0)
        x = x + g["residual_scale"] * (_rmsnorm(a, w[p + "post_attention_norm.weight"], eps) if post_norms else a)
        # gpt-oss names its FFN norm post_attention_norm (Gemma 2's is its attention's output norm); OLMo 2 has none
        fn = w.get(p + "ffn_norm.weight", None if post_norms else w.get(p + "post_attention_norm.weight"))
        h = x if fn is None else _rmsnorm(x, fn, eps)
        if hp.get("n_expert"):
            f = _moe(h, w, p, hp, gelu, hp.get("expert_renorm", True) if moe_renorm is None else moe_renorm, oai)
        else:
            f = _ffn(h, w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"], w[p + "ffn_down.weight"], gelu)
        x = x + g["residual_scale"] * (_rmsnorm(f, w[p + "post_ffw_norm.weight"], eps) if post_norms else f)
    x = _rmsnorm(x, w["output_norm.weight"], eps)
    if hidden:
        return x
    out_w = w.get("output.weight", w["token_embd.weight"])
    logits = (x @ out_w.T + w.get("output.bias", 0.0)) / g["logit_scale"]
    return _softcap(logits, softcap and hp["final_softcap"])


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
