"""Both workers run Qwen2, Qwen3, Phi-3 and Gemma files as well as Llama's,
including fused attn_qkv / gate+up tensors, the CPU worker Gemma 2 and 3,
Granite, SmolLM3, gpt-oss, OLMo 2 and mixtures of experts (Qwen3-MoE,
Mixtral-style llama) too, and each refuses, by name, what it cannot run.

Each architecture gets a tiny random-weight file written the way llama.cpp's
converters write one (tests/archmodels.py), in f32 and after
`spillway-quantize ... q4_k_m` (which puts it on the packed Q4_K/Q6_K
kernels). Its logits from `spillway-run` are compared with an independent
numpy forward pass over the file's own (dequantized) weights; a reference
with any one of the architecture's differences switched off must not match,
so the comparison can tell the variants apart. test_forward then checks
token-by-token decode against the whole-prompt pass on each file, and the
GPU worker's emulation backend runs each one too."""
import subprocess

import numpy as np
import pytest
from gguf import GGUFReader, GGMLQuantizationType as QT

import archmodels as am
from conftest import BUILD, bin_path, cosines, logits_for

IDS = [1, 260, 261, 262, 263, 264, 265, 300, 301, 310, 5, 6, 7, 8, 9, 270, 271, 280, 290, 266]


def spillway_logits(model, tmp_path, ids=IDS, isa=None):
    return logits_for(model, ids, tmp_path / "logits.f32", isa=isa)[0]


def make(tmp_path, arch, fused_qkv=False, quant=None, seed=11, **kw):
    hp, w = am.make_weights(arch, seed=seed, **kw)
    path = tmp_path / f"{arch}.gguf"
    am.write_model(path, arch, hp, w, fused_qkv=fused_qkv)
    if quant:
        q = tmp_path / f"{arch}-{quant}.gguf"
        r = subprocess.run([bin_path("spillway-quantize"), str(path), str(q), quant], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        path = q
    return path


def gpu_refusal(model):
    """The GPU worker's (emulation backend's) error for a file it refuses."""
    r = subprocess.run([bin_path("spillway-worker-gpu"), "--backend", "emulate", "-m", str(model), "--tokens", "1,2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, "the GPU worker ran it"
    return r.stderr


@pytest.mark.parametrize("quant", [None, "q4_k_m"])
@pytest.mark.parametrize("fused_qkv", [False, True], ids=["qkv", "fused-qkv"])
@pytest.mark.parametrize("arch", list(am.ARCHS))
def test_logits_match_reference(arch, fused_qkv, quant, tmp_path):
    model = make(tmp_path, arch, fused_qkv, quant)
    got = spillway_logits(model, tmp_path)
    arch2, hp, w = am.read_weights(model)
    assert arch2 == arch
    ref = am.forward(arch, hp, w, IDS)
    cos = cosines(got, ref)
    err = np.abs(got - ref).max() / ref.std()
    print(f"{arch} fused_qkv={fused_qkv} {quant or 'f32'}: min cosine {cos.min():.7f}, max |diff| {err:.5f} of the std")
    # The worker keeps K and V as halves and (for q4_k_m) quantizes
    # activations to int8 twice: measured max |diff| ~0.001 of the std.
    assert cos.min() >= 0.9999
    assert err <= 0.02


def wrong_references(arch, hp, w):
    """The reference with each one of the architecture's differences undone
    (Qwen2's biases included; for Llama, NEOX RoPE done instead)."""
    flags = am.ARCHS[arch]
    for i in [i for i, f in enumerate(flags) if f and i != am.FUSED] or [0]:
        wrong = list(flags)
        wrong[i] = not wrong[i]
        yield f"flag {i}", am.forward(arch, hp, w, IDS, flags=tuple(wrong))
    if arch == "qwen2":
        yield "no biases", am.forward(arch, hp, {k: v for k, v in w.items() if not k.endswith(".bias")}, IDS)
    if hp.get("n_expert"):
        renorm = hp.get("expert_renorm", True)
        yield f"experts' weights {'not ' if renorm else ''}renormalized", am.forward(arch, hp, w, IDS, moe_renorm=not renorm)
        yield "one expert fewer", am.forward(arch, dict(hp, n_expert_used=hp["n_expert_used"] - 1), w, IDS)
    if hp.get("n_ff_shexp"):
        yield "no shared expert", am.forward(arch, hp, {k: v for k, v in w.items() if "_shexp." not in k}, IDS)
    for what, part in (("sinks", "attn_sinks."), ("attention output bias", "attn_output.bias"),
                       ("router bias", "ffn_gate_inp.bias"), ("expert biases", "_exps.bias")):
        if any(part in k for k in w):
            yield f"no {what}", am.forward(arch, hp, {k: v for k, v in w.items() if part not in k}, IDS)


@pytest.mark.parametrize("arch", list(am.ARCHS))
def test_isa_equivalence(arch, tmp_path):
    """The scalar, AVX2 and default paths agree within float rounding on each
    architecture (precise mode, as in test_golden), q4_k_m and fused."""
    model = make(tmp_path, arch, fused_qkv=True, quant="q4_k_m")
    base = spillway_logits(model, tmp_path, isa="scalar")
    for isa in ("avx2", None):
        diff = float(np.abs(spillway_logits(model, tmp_path, isa=isa) - base).max())
        assert diff <= 1e-3 * float(np.abs(base).max()), f"{isa or 'default'}: max |diff| {diff}"


@pytest.mark.parametrize("quant,E", [("q8_0", 256), ("q4_k_m", 96)], ids=["q8_0", "q4_k_m-fallbacks"])
def test_q32_packed(quant, E, tmp_path):
    """The 32-weight types on their packed kernels, in fast mode (as served):
    a q8_0 file, and a q4_k_m one 96 wide, whose rows that are not a
    multiple of 256 fall back to Q5_0 and Q8_0 (as llama.cpp's mix does for
    Qwen2-0.5B's 896). Both agree with the scalar path, whose 32-weight dots
    are the reference's, and with the float64 forward pass."""
    model = make(tmp_path, "qwen2", quant=quant, E=E)
    types = {t.tensor_type.name for t in GGUFReader(model).tensors}
    assert ({"Q5_0", "Q8_0", "Q4_K"} if quant == "q4_k_m" else {"Q8_0"}) <= types, types
    ids = IDS * 2   # 40 tokens: slices of 8 and a leftover
    base = logits_for(model, ids, tmp_path / "s.f32", isa="scalar", extra=["--fast"])[0]
    got, err = logits_for(model, ids, tmp_path / "x.f32", extra=["--fast"])
    cos = cosines(got, base)
    print(f"{quant} E={E}: min cosine to the scalar path {cos.min():.8f}; {err.splitlines()[0]}")
    assert cos.min() >= 0.9995 and (got.argmax(1) == base.argmax(1)).mean() >= 0.95
    arch, hp, w = am.read_weights(model)
    cos = cosines(got, am.forward(arch, hp, w, ids))
    assert cos.min() >= 0.999, cos.min()


def test_gpt_oss_mxfp4_experts(tmp_path):
    """gpt-oss as its files come: the experts' matrices in MXFP4 (quantized
    by the gguf package), the rest in float. The worker's logits match the
    reference over the same MXFP4 weights on every ISA (each has its own
    MXFP4 dot and packed kernel), and the experts really are MXFP4 in the file."""
    hp, w = am.make_weights("gpt-oss", seed=11)
    path = tmp_path / "gpt-oss-mxfp4.gguf"
    am.write_model(path, "gpt-oss", hp, w, quantize=(QT.MXFP4, "_exps.weight"))
    types = {t.name: t.tensor_type for t in GGUFReader(path).tensors}
    assert types["blk.0.ffn_down_exps.weight"] == QT.MXFP4 and types["blk.0.ffn_down_exps.bias"] == QT.F32
    _, hp2, w2 = am.read_weights(path)
    ref = am.forward("gpt-oss", hp2, w2, IDS)
    for isa in ("scalar", "avx2", None):
        cos = cosines(spillway_logits(path, tmp_path, isa=isa), ref)
        print(f"gpt-oss MXFP4 experts, {isa or 'default'}: min cosine {cos.min():.7f}")
        assert cos.min() >= 0.9999
    # as served: the experts on the packed MXFP4 kernels (fast mode), 40 tokens
    ids = IDS * 2
    ref = am.forward("gpt-oss", hp2, w2, ids)
    for isa in ("avx2", None):
        got, err = logits_for(path, ids, tmp_path / "fast.f32", isa=isa, extra=["--fast"])
        cos = cosines(got, ref)
        print(f"gpt-oss MXFP4 experts, {isa or 'default'}, packed: min cosine {cos.min():.7f}")
        assert cos.min() >= 0.9999


def test_reference_tells_the_variants_apart(tmp_path):
    """Switching off any one of an architecture's differences moves the
    reference from the worker's logits by at least 10x what the comparison
    above allows (1 - cosine 1e-4): each difference is exercised."""
    for arch in am.ARCHS:
        model = make(tmp_path, arch)
        got = spillway_logits(model, tmp_path)
        _, hp, w = am.read_weights(model)
        for what, ref in wrong_references(arch, hp, w):
            assert cosines(got, ref).min() < 0.999, f"{arch}: {what} makes no difference"


def test_decode_matches_prefill(tmp_path):
    """Token-by-token decode, chunked prefill and mixed batches give the
    whole-prompt logits on every architecture (test_forward's checks), in
    fast and precise mode, over an f16 and a q8_0 KV cache."""
    models = []
    for a in am.ARCHS:
        (tmp_path / a).mkdir()
        models.append(make(tmp_path / a, a, fused_qkv=a in ("qwen2", "phi3"), quant="q4_k_m"))
    r = subprocess.run([str(BUILD / "tests" / "unit" / "test_forward"), *map(str, models)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    for kv in ("f16", "q8_0"):
        assert r.stdout.count(f", {kv} cache: done") == 2 * len(models), r.stdout[-4000:]


def test_generates_text(tmp_path):
    """A prompt through the tokenizer, prefill and sampling on a non-Llama graph."""
    model = make(tmp_path, "qwen3", quant="q4_k_m")
    r = subprocess.run([bin_path("spillway-run"), "-m", str(model), "-p", "Once upon a time", "-n", "12",
                        "--temp", "0", "-t", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Once upon a time") and len(r.stdout) > len("Once upon a time")


def run_fail(model):
    r = subprocess.run([bin_path("spillway-run"), "-m", str(model), "--tokens", "1,2"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    return r.stderr


def test_unknown_tensor_is_refused(tmp_path):
    """A tensor the graph does not read (here a q-norm on a Llama file) would
    change the result if skipped: the file is refused, naming it."""
    hp, w = am.make_weights("llama")
    path = tmp_path / "extra.gguf"
    am.write_model(path, "llama", hp, w, extra_tensors={"blk.1.attn_q_norm.weight": np.ones(64, np.float32)})
    err = run_fail(path)
    assert "blk.1.attn_q_norm.weight" in err and "refusing" in err, err


def test_unknown_architecture_is_refused(tmp_path):
    hp, w = am.make_weights("llama")
    path = tmp_path / "falcon.gguf"
    am.write_model(path, "falcon", hp, w)
    err = run_fail(path)
    assert "architecture 'falcon' is not supported" in err and "gemma3" in err and "smollm3" in err, err


def test_granite_scales(tmp_path):
    """Granite's multipliers: each one 0 (llama.cpp's "unset") keeps its
    default, which the reference then uses too; one out of range is refused
    by its key."""
    hp, w = am.make_weights("granite", seed=5)
    unset = dict(hp, embd_scale=0.0, attn_scale=0.0)
    path = tmp_path / "unset.gguf"
    am.write_model(path, "granite", unset, w)
    _, hp2, w2 = am.read_weights(path)
    assert hp2["embd_scale"] == 1.0 and hp2["attn_scale"] == 1 / np.sqrt(hp["hd"]) and hp2["residual_scale"] == 0.5
    assert cosines(spillway_logits(path, tmp_path), am.forward("granite", hp2, w2, IDS)).min() >= 0.9999
    for key, value in (("residual_scale", -1.0), ("logit_scale", float("nan")), ("attn_scale", 1e9)):
        path = tmp_path / f"bad-{key}.gguf"
        am.write_model(path, "granite", dict(hp, **{key: value}), w)
        err = run_fail(path)
        name = {"attn_scale": "attention.scale"}.get(key, key)
        assert f"metadata 'granite.{name}'" in err and "out of range" in err, err


def test_mixture_of_experts_is_refused(tmp_path):
    """Experts where the table has none (here a Qwen2 file) are refused by
    name, and a Mixtral-style llama file without its expert tensors names
    the missing router."""
    hp, w = am.make_weights("qwen2")
    path = tmp_path / "moe.gguf"
    am.write_model(path, "qwen2", hp, w, extra_kv={"qwen2.expert_count": 8, "qwen2.expert_used_count": 2})
    assert "mixture-of-experts qwen2 models are not supported" in run_fail(path)
    hp, w = am.make_weights("llama")
    am.write_model(path, "llama", hp, w, extra_kv={"llama.expert_count": 8, "llama.expert_used_count": 2})
    assert "missing tensor 'blk.0.ffn_gate_inp.weight'" in run_fail(path)


@pytest.mark.parametrize("quant", [None, "q4_k_m"])
def test_mixtral_style_llama(quant, tmp_path):
    """A llama file whose FFN is a mixture (Mixtral's layout: 4 experts of
    the full FFN width, 2 used) matches the reference, which without the
    experts' renormalization, or with one expert fewer, does not."""
    path = make(tmp_path, "llama", quant=quant, seed=5, experts=(4, 2, 512))
    if quant:
        # llama.cpp's mix: the router stays float, the experts' down
        # matrices take Q6_K where ffn_down would (layer 1 of 2, not 0)
        types = {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}
        assert types["blk.0.ffn_gate_inp.weight"] == "F32" and types["blk.0.ffn_up_exps.weight"] == "Q4_K"
        assert (types["blk.0.ffn_down_exps.weight"], types["blk.1.ffn_down_exps.weight"]) == ("Q4_K", "Q6_K")
    got = spillway_logits(path, tmp_path)
    _, hp2, w2 = am.read_weights(path)
    assert hp2["n_expert"] == 4 and hp2["n_expert_used"] == 2
    assert cosines(got, am.forward("llama", hp2, w2, IDS)).min() >= 0.9999
    for what, ref in wrong_references("llama", hp2, w2):
        assert cosines(got, ref).min() < 0.999, what


def test_gpu_worker_refuses_experts(tmp_path):
    err = gpu_refusal(make(tmp_path, "qwen3moe"))
    assert "architecture 'qwen3moe' uses a mixture of experts" in err and "spillway-worker-cpu" in err, err


def test_missing_required_tensor(tmp_path):
    """Qwen3 without its k-norm, Phi-3 with an ffn_up of the wrong height."""
    hp, w = am.make_weights("qwen3")
    del w["blk.0.attn_k_norm.weight"]
    path = tmp_path / "q3.gguf"
    am.write_model(path, "qwen3", hp, w)
    assert "missing tensor 'blk.0.attn_k_norm.weight'" in run_fail(path)

    hp, w = am.make_weights("phi3")
    w["blk.1.ffn_gate.weight"] = w["blk.1.ffn_gate.weight"][:256]
    path = tmp_path / "phi3.gguf"
    am.write_model(path, "phi3", hp, w)
    err = run_fail(path)
    assert "blk.1.ffn_up.weight" in err and "expected [256, 1024]" in err, err


def gpu_emulated_logits(model, tmp_path, ids=IDS):
    out = tmp_path / "gpu.f32"
    r = subprocess.run([bin_path("spillway-worker-gpu"), "--backend", "emulate", "-m", str(model),
                        "--tokens", ",".join(map(str, ids)), "--logits-out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


# what the GPU worker refuses, and the words of its refusal
GPU_REFUSES = {"gemma2": "post-attention and post-FFN norms", "gemma3": "post-attention and post-FFN norms",
               "granite": "residual, attention or logit scales (Granite)", "smollm3": "layers without RoPE (SmolLM3)",
               "granitemoe": "a mixture of experts", "gpt-oss": "a mixture of experts",
               "olmo2": "post-attention and post-FFN norms"}
GPU_ARCHS = [a for a in am.ARCHS if a not in GPU_REFUSES and not a.endswith("moe")]


@pytest.mark.parametrize("arch", GPU_ARCHS)
def test_gpu_worker_emulation(arch, tmp_path):
    """The GPU worker's CPU emulation (FP8 weights, bf16 activations, the
    CUDA kernels' numerics) runs each architecture's differences too: its
    logits are nearer the reference than any reference with one difference
    undone, and near the CPU worker's (min cosine 0.996-0.998 on these files,
    as for Llama; 0.975 for Qwen3, whose q/k norm gains of ~2 make attention
    four times sharper and bf16 rounding count for more)."""
    model = make(tmp_path, arch, fused_qkv=arch in ("qwen2", "phi3"))
    emu = gpu_emulated_logits(model, tmp_path)
    cos = cosines(emu, spillway_logits(model, tmp_path))
    _, hp, w = am.read_weights(model)
    right = cosines(emu, am.forward(arch, hp, w, IDS)).min()
    print(f"{arch}: GPU emulation against the CPU worker, min cosine {cos.min():.5f}; against the reference {right:.5f}")
    assert cos.min() >= 0.97
    for what, ref in wrong_references(arch, hp, w):
        wrong = cosines(emu, ref).min()
        assert right > wrong, f"{arch}: the emulation is nearer the reference with {what} ({wrong:.5f} vs {right:.5f})"


def test_rope_scaling(tmp_path):
    """Linear RoPE scaling divides positions by its factor, on both workers.
    YaRN runs on the CPU worker (against the reference, which without it, or
    with linear scaling instead, must not match) and is refused by the GPU
    worker; LongRoPE is refused, naming the key."""
    hp, w = am.make_weights("qwen2")
    path = tmp_path / "linear.gguf"
    am.write_model(path, "qwen2", hp, w, rope_scaling=("linear", 4.0))
    got = spillway_logits(path, tmp_path)
    _, hp2, w2 = am.read_weights(path)
    assert hp2["rope_scale"] == 4.0
    unscaled = am.forward("qwen2", dict(hp2, rope_scale=0.0), w2, IDS)
    assert cosines(got, am.forward("qwen2", hp2, w2, IDS)).min() >= 0.9999
    assert cosines(got, unscaled).min() < 0.999
    emu = gpu_emulated_logits(path, tmp_path)
    assert cosines(emu, got).min() >= 0.99 and cosines(emu, got).min() > cosines(emu, unscaled).min()

    path = tmp_path / "yarn.gguf"
    am.write_model(path, "qwen2", hp, w, rope_scaling=("yarn", 4.0, 64))
    got = spillway_logits(path, tmp_path)
    _, hp3, w3 = am.read_weights(path)
    assert hp3["rope_type"] == "yarn" and hp3["rope_orig_ctx"] == 64
    assert cosines(got, am.forward("qwen2", hp3, w3, IDS)).min() >= 0.9999
    assert cosines(got, am.forward("qwen2", dict(hp3, rope_type="linear"), w3, IDS)).min() < 0.999
    assert cosines(got, am.forward("qwen2", dict(hp3, rope_scale=0.0), w3, IDS)).min() < 0.999
    err = gpu_refusal(path)
    assert "uses YaRN RoPE scaling" in err, err

    path = tmp_path / "longrope.gguf"
    am.write_model(path, "qwen2", hp, w, rope_scaling=("longrope", 4.0))
    err = run_fail(path)
    assert "qwen2.rope.scaling.type' = 'longrope'" in err and "YaRN" in err, err


def test_longrope(tmp_path):
    """Phi-3's LongRoPE (its 128k files, Phi-3.5, Phi-4-mini): frequency
    divisors for a context past the original one and for one within it,
    chosen by the context the worker runs with, and the rotated dims scaled
    by the file's attention factor. The reference with the other factors,
    or without the attention factor, must not match; the GPU worker refuses
    it by name; a file with only one of the two tables is refused."""
    hp, w = am.make_weights("phi3", seed=4)
    rng = np.random.default_rng(4)
    half = hp["hd"] // 2
    long_f, short_f = 1 + 8 * rng.random(half), 1 + 0.3 * rng.random(half)
    attn = float(np.sqrt(1 + np.log(16) / np.log(64)))   # 16x past an original 64, as the converter computes it
    path = tmp_path / "longrope.gguf"
    am.write_model(path, "phi3", hp, w, longrope=(long_f, short_f, 64, attn))
    _, hp2, w2 = am.read_weights(path)
    assert hp2["rope_orig_ctx"] == 64 and abs(hp2["attn_factor"] - attn) < 1e-6
    long_ref, short_ref = am.forward("phi3", hp2, w2, IDS, n_ctx=1024), am.forward("phi3", hp2, w2, IDS, n_ctx=32)
    got_long = spillway_logits(path, tmp_path)   # the file's context, 1024 > 64
    got_short = logits_for(path, IDS, tmp_path / "short.f32", extra=["-c", "32"])[0]
    assert cosines(got_long, long_ref).min() >= 0.9999 and cosines(got_short, short_ref).min() >= 0.9999
    assert cosines(got_long, short_ref).min() < 0.999 and cosines(got_short, long_ref).min() < 0.999
    no_attn = am.forward("phi3", dict(hp2, attn_factor=1.0), w2, IDS, n_ctx=1024)
    assert cosines(got_long, no_attn).min() < 0.999
    assert "uses LongRoPE scaling" in gpu_refusal(path)
    path = tmp_path / "half.gguf"
    am.write_model(path, "phi3", hp, w, extra_tensors={"rope_factors_long.weight": np.float32(long_f)})
    err = run_fail(path)
    assert "'rope_factors_long.weight' without 'rope_factors_short.weight'" in err, err


def test_gpu_worker_refuses_partial_neox_rotary(tmp_path):
    """The CUDA RoPE kernel pairs NEOX dims across the whole head: a file that
    rotates only part of each head in NEOX order is refused by name (the
    CPU worker runs it)."""
    hp, w = am.make_weights("qwen2")
    path = tmp_path / "partial.gguf"
    am.write_model(path, "qwen2", hp, w, rope_dims=32)
    spillway_logits(path, tmp_path)
    err = gpu_refusal(path)
    assert "rotates 32 of 64 head dims" in err and "spillway-worker-cpu" in err, err


def test_output_bias_and_sinks_in_any_file(tmp_path):
    """An attention output bias and attention sinks are read wherever a file
    has them (gpt-oss's, here in a Llama file): the logits match the
    reference with them and not without; the GPU worker refuses each by name."""
    hp, w = am.make_weights("llama", seed=5)
    rng = np.random.default_rng(5)
    extra = {}
    for l in range(hp["n_layer"]):
        extra[f"blk.{l}.attn_output.bias"] = (0.5 * rng.standard_normal(hp["E"])).astype(np.float32)
        extra[f"blk.{l}.attn_sinks.weight"] = rng.standard_normal(hp["n_head"]).astype(np.float32)
    for drop, words in (("attn_sinks", "an attention output bias"), ("attn_output.bias", "attention sinks")):
        path = tmp_path / f"no-{drop}.gguf"
        am.write_model(path, "llama", hp, w, extra_tensors={k: v for k, v in extra.items() if drop not in k})
        got = spillway_logits(path, tmp_path)
        _, hp2, w2 = am.read_weights(path)
        assert cosines(got, am.forward("llama", hp2, w2, IDS)).min() >= 0.9999
        assert cosines(got, am.forward("llama", hp2, {k: v for k, v in w2.items() if k not in extra}, IDS)).min() < 0.999
        assert f"uses {words}" in gpu_refusal(path)
    # in some layers only: refused, naming the layer that lacks it
    path = tmp_path / "partial.gguf"
    am.write_model(path, "llama", hp, w, extra_tensors={"blk.0.attn_sinks.weight": extra["blk.0.attn_sinks.weight"]})
    r = subprocess.run([bin_path("spillway-run"), "-m", str(path), "--tokens", "1,2"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "'blk.1.attn_sinks.weight' missing, but 'blk.0.attn_sinks.weight' is present" in r.stderr, \
        r.stderr


def test_olmo3_sliding_layers(tmp_path):
    """OLMo 3's files say olmo2 and add a window on three layers in four
    (a flag per layer in the file; the table's period 4 without one), whose
    RoPE keeps the global base but not its scaling. The logits match the
    reference with them; without the window, or with the sliding layers
    scaled like the global ones, they do not."""
    hp, w = am.make_weights("olmo2", n_layer=4, seed=7)
    flags = list(am.ARCHS["olmo2"])
    flags[7], flags[8] = 4, True   # swa period 4, sliding layers with their own (unscaled) RoPE
    for pattern in (None, [True, False, True, False]):
        path = tmp_path / f"olmo3-{pattern is None}.gguf"
        am.write_model(path, "olmo2", dict(hp, n_swa=6), w, swa_pattern=pattern, rope_scaling=("linear", 4.0))
        got = spillway_logits(path, tmp_path, ids=IDS)
        _, hp2, w2 = am.read_weights(path)
        assert hp2["n_swa"] == 6 and hp2["theta_swa"] == hp2["theta"]
        ref = am.forward("olmo2", hp2, w2, IDS, flags=tuple(flags))
        assert cosines(got, ref).min() >= 0.9999, pattern
        assert cosines(got, am.forward("olmo2", hp2, w2, IDS)).min() < 0.999, "the window makes no difference"
        same_rope = list(flags)
        same_rope[8] = False
        assert cosines(got, am.forward("olmo2", hp2, w2, IDS, flags=tuple(same_rope))).min() < 0.999, "own RoPE"


@pytest.mark.parametrize("arch", list(GPU_REFUSES))
def test_gpu_worker_refuses_what_it_lacks(arch, tmp_path):
    """Gemma 2/3's post-norms, soft-caps and sliding windows, Granite's
    multipliers and SmolLM3's layers without RoPE have no CUDA kernels: the
    GPU worker refuses such files by name, pointing at the CPU worker."""
    err = gpu_refusal(make(tmp_path, arch))
    assert f"architecture '{arch}' uses {GPU_REFUSES[arch]}" in err, err
    assert "spillway-worker-cpu" in err, err


@pytest.mark.parametrize("pattern", [3, [True, False, False, True, True, False]], ids=["period", "per-layer"])
def test_sliding_window_pattern_key(pattern, tmp_path):
    """A file's sliding_window_pattern overrides Gemma 3's one-in-six, as a
    period or as one flag per layer; the reference with the default pattern
    must then differ."""
    hp, w = am.make_weights("gemma3", seed=11)
    path = tmp_path / "g3.gguf"
    am.write_model(path, "gemma3", hp, w, swa_pattern=pattern)
    got = spillway_logits(path, tmp_path)
    _, hp2, w2 = am.read_weights(path)
    assert hp2["swa_pattern"] == pattern
    assert cosines(got, am.forward("gemma3", hp2, w2, IDS)).min() >= 0.9999
    default = {k: v for k, v in hp2.items() if k != "swa_pattern"}
    assert cosines(got, am.forward("gemma3", default, w2, IDS)).min() < 0.999


def test_bad_sliding_window_pattern(tmp_path):
    hp, w = am.make_weights("gemma3")
    path = tmp_path / "g3.gguf"
    am.write_model(path, "gemma3", hp, w, swa_pattern=[True, False])
    err = run_fail(path)
    assert "gemma3.attention.sliding_window_pattern" in err and "expected 6" in err, err


SERVE_POLICY = """\
pools:
  - name: cpu-pool
    kind: cpu
routes:
  - model: "{name}"
    target: cpu-pool
    max_concurrency: 8
"""


@pytest.mark.parametrize("arch", ["qwen3moe", "gemma2"])
def test_served_through_the_gateway_batched_as_alone(arch, tmp_path, cluster):
    """A mixture of experts (q4_k_m: packed experts) and a Gemma 2 file
    (sliding windows, soft-caps) served by the real gateway and CPU worker:
    four greedy completions at once, continuously batched, give exactly the
    text each gives alone."""
    import concurrent.futures
    import openai
    model = make(tmp_path, arch, quant="q4_k_m")
    cluster.start_gateway(SERVE_POLICY.format(name=arch))
    cluster.start_worker("cpu-pool", arch, model, ["--threads", "2", "--parallel", "4"], name="cpu")
    cluster.wait_model(arch, timeout=60)
    c = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    prompts = ["the cat sat on the mat", "Once upon a time there was", "a dog ran", "the mat and the cat and"]

    def complete(p):
        return c.completions.create(model=arch, prompt=p, max_tokens=24, temperature=0).choices[0].text

    alone = [complete(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        together = list(ex.map(complete, prompts))
    assert all(alone), alone
    assert together == alone


def test_sliding_window_rings_and_the_prefix_cache(tmp_path, cluster):
    """Gemma 2's sliding layers keep rings of window + batch positions (288
    here). After a 400-token answer the ring no longer holds the window
    before the prompt's end, so the same prompt again is computed afresh
    (no cached tokens) and gives the same text; after a short answer it is
    resumed from the cache, as for any model."""
    import openai
    model = make(tmp_path, "gemma2", quant="q4_k_m")
    cluster.start_gateway(SERVE_POLICY.format(name="gemma2"))
    cluster.start_worker("cpu-pool", "gemma2", model, ["--threads", "2", "--parallel", "1", "--cache-slots", "1"],
                         name="cpu")
    cluster.wait_model("gemma2", timeout=60)
    c = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    prompt = "the cat sat on the mat"

    def complete(n):
        r = c.completions.create(model="gemma2", prompt=prompt, max_tokens=n, temperature=0)
        return r.choices[0].text, r.usage

    long1, u1 = complete(400)
    assert u1.completion_tokens == 400, u1
    long2, u2 = complete(400)
    assert u2.prompt_tokens_details.cached_tokens == 0, u2
    assert long2 == long1
    short1, _ = complete(10)
    short2, u4 = complete(10)
    assert u4.prompt_tokens_details.cached_tokens == u4.prompt_tokens - 1, u4
    assert short2 == short1 and long1.startswith(short1)
