"""spillway-synth and spillway-quantize, checked with an independent reader.

The outputs are read back with the `gguf` Python package (llama.cpp's own
reader) and dequantized with gguf.quants, so a format mistake on our side
cannot hide behind a matching mistake in our own reader.
"""
import os
import subprocess

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as QT
from gguf.quants import dequantize

from conftest import bin_path, shared_file
from kernelreport import check_kernels_report, cpu_report, env_defaults, expected_best, int8_form_expected

TINY = dict(dim=128, layers=2, heads=4, kv_heads=2, ffn=256, vocab=1024)
# Relative RMS error allowed per tensor, by output file type.
TOL = {"q8_0": 0.01, "q4_k_m": 0.12, "f16": 1e-3, "f32": 0.0}
FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "q4_k_m": 15}


def run(args, ok=True, env=None):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, env=env)
    if ok:
        assert r.returncode == 0, f"{args} failed rc={r.returncode}\n{r.stderr}"
    return r


def synth(out, shape="tiny", type_="f32", seed=None):
    args = [bin_path("spillway-synth"), "--shape", shape, "--type", type_]
    if seed is not None:
        args += ["--seed", seed]
    run(args + [out])
    return out


def field(r, key):
    f = r.fields.get(key)
    assert f is not None, f"missing key {key}"
    return f.contents()


def tensors(r):
    """name -> (type, float32 values, ne list)"""
    out = {}
    for t in r.tensors:
        vals = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        out[t.name] = (t.tensor_type, vals, [int(x) for x in t.shape])
    return out


def rel_rms(a, ref):
    return float(np.sqrt(np.mean((a - ref) ** 2)) / np.sqrt(np.mean(ref ** 2)))


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory):
    return synth(tmp_path_factory.mktemp("synth") / "tiny-f32.gguf")


def test_synth_metadata_and_vocab(tiny_f32):
    r = GGUFReader(tiny_f32)
    assert field(r, "general.architecture") == "llama"
    assert field(r, "spillway.synthetic") is True
    assert "RANDOM WEIGHTS" in field(r, "general.description")
    assert field(r, "general.file_type") == 0
    assert field(r, "llama.embedding_length") == TINY["dim"]
    assert field(r, "llama.block_count") == TINY["layers"]
    assert field(r, "llama.feed_forward_length") == TINY["ffn"]
    assert field(r, "llama.attention.head_count") == TINY["heads"]
    assert field(r, "llama.attention.head_count_kv") == TINY["kv_heads"]
    assert field(r, "llama.rope.dimension_count") == TINY["dim"] // TINY["heads"]
    assert field(r, "llama.vocab_size") == TINY["vocab"]
    assert abs(field(r, "llama.attention.layer_norm_rms_epsilon") - 1e-5) < 1e-9
    assert field(r, "llama.rope.freq_base") == 10000.0
    assert field(r, "llama.context_length") > 0

    assert field(r, "tokenizer.ggml.model") == "llama"
    toks = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    scores = field(r, "tokenizer.ggml.scores")
    assert len(toks) == len(types) == len(scores) == TINY["vocab"]
    assert len(set(toks)) == len(toks), "duplicate tokens"
    assert toks[:3] == ["<unk>", "<s>", "</s>"] and types[:3] == [2, 3, 3]
    assert toks[3:259] == [f"<0x{b:02X}>" for b in range(256)]
    assert set(types[3:259]) == {6} and set(types[259:]) == {1}
    assert all(a > b for a, b in zip(scores[259:], scores[260:])), "scores must descend"
    assert "\u2581" in toks and "\u2581the" in toks and "e" in toks
    assert field(r, "tokenizer.ggml.bos_token_id") == 1
    assert field(r, "tokenizer.ggml.eos_token_id") == 2
    assert field(r, "tokenizer.ggml.add_bos_token") is True


def test_synth_tensors_are_llama_shaped_and_scaled(tiny_f32):
    ts = tensors(GGUFReader(tiny_f32))
    d, f, kv = TINY["dim"], TINY["ffn"], TINY["dim"] // TINY["heads"] * TINY["kv_heads"]
    want = {"token_embd.weight": [d, TINY["vocab"]], "output_norm.weight": [d],
            "output.weight": [d, TINY["vocab"]]}
    for l in range(TINY["layers"]):
        want.update({f"blk.{l}.attn_norm.weight": [d], f"blk.{l}.attn_q.weight": [d, d],
                     f"blk.{l}.attn_k.weight": [d, kv], f"blk.{l}.attn_v.weight": [d, kv],
                     f"blk.{l}.attn_output.weight": [d, d], f"blk.{l}.ffn_norm.weight": [d],
                     f"blk.{l}.ffn_gate.weight": [d, f], f"blk.{l}.ffn_up.weight": [d, f],
                     f"blk.{l}.ffn_down.weight": [f, d]})
    assert {n: ne for n, (_, _, ne) in ts.items()} == want
    for name, (qt, vals, ne) in ts.items():
        assert qt == QT.F32
        assert np.all(np.isfinite(vals))
        if len(ne) == 1:
            assert np.all(vals == 1.0), name
        elif name in ("blk.0.attn_q.weight", "output.weight", "blk.1.ffn_gate.weight"):
            # N(0, 1/fan_in): std within 10% of 1/sqrt(ne[0]), mean near 0
            assert abs(vals.std() * np.sqrt(ne[0]) - 1) < 0.1, (name, vals.std())
            assert abs(vals.mean()) < 0.1 * vals.std()


def test_synth_mixture_of_experts(tmp_path):
    """--shape tiny-moe: Mixtral's layout (a float router, stacked experts)
    that the gguf package reads, spillway-quantize keeps the router of, and
    the CPU worker runs."""
    path = synth(tmp_path / "moe.gguf", shape="tiny-moe")
    r = GGUFReader(path)
    assert field(r, "llama.expert_count") == 4 and field(r, "llama.expert_used_count") == 2
    ts = tensors(r)
    d, f = TINY["dim"], TINY["ffn"]
    assert ts["blk.1.ffn_gate_inp.weight"][2] == [d, 4]
    assert ts["blk.1.ffn_up_exps.weight"][2] == [d, f, 4] and ts["blk.1.ffn_down_exps.weight"][2] == [f, d, 4]
    assert "blk.0.ffn_up.weight" not in ts
    experts = ts["blk.0.ffn_gate_exps.weight"][1].reshape(4, -1)
    assert not np.array_equal(experts[0], experts[1]), "each expert its own noise"
    q = tmp_path / "moe-q4.gguf"
    run([bin_path("spillway-quantize"), path, q, "q4_k_m"])
    qt = tensors(GGUFReader(q))
    # the router stays float; the experts' 128-wide rows take Q4_K's fallback
    assert qt["blk.0.ffn_gate_inp.weight"][0] == QT.F32 and qt["blk.0.ffn_gate_exps.weight"][0] == QT.Q5_0
    out = run([bin_path("spillway-run"), "-m", q, "-p", "Once upon a time", "-n", "8", "--temp", "0"])
    assert out.stdout.startswith("Once upon a time")


def test_synth_is_seeded(tmp_path, tiny_f32):
    again = synth(tmp_path / "again.gguf")
    other = synth(tmp_path / "other.gguf", seed=7)
    assert again.read_bytes() == tiny_f32.read_bytes()
    a = tensors(GGUFReader(tiny_f32))["blk.0.attn_q.weight"][1]
    b = tensors(GGUFReader(other))["blk.0.attn_q.weight"][1]
    assert not np.array_equal(a, b)
    assert field(GGUFReader(other), "spillway.synth.seed") == 7


@pytest.mark.parametrize("qtype", ["q8_0", "q4_k_m", "f16"])
def test_quantize_round_trip(tmp_path, tiny_f32, qtype):
    out = tmp_path / f"tiny-{qtype}.gguf"
    run([bin_path("spillway-quantize"), tiny_f32, out, qtype])
    src, dst = GGUFReader(tiny_f32), GGUFReader(out)
    # every metadata key survives with its value; file_type is updated
    for key, f in src.fields.items():
        if key.startswith("GGUF.") or key == "general.file_type":
            continue
        assert key in dst.fields, f"{key} lost"
        assert dst.fields[key].contents() == f.contents(), key
    assert field(dst, "general.file_type") == FILE_TYPE[qtype]

    a, b = tensors(src), tensors(dst)
    assert a.keys() == b.keys()
    for name, (_, ref, ne) in a.items():
        qt, vals, ne2 = b[name]
        assert ne2 == ne
        if len(ne) == 1:
            assert qt == QT.F32 and np.array_equal(vals, ref), name
            continue
        err = rel_rms(vals, ref)
        assert err < TOL[qtype], f"{name} ({qt.name}): relative RMS error {err:.4f}"
        assert err > 0, f"{name}: {qtype} cannot be lossless on random floats"

    types = {n: t for n, (t, _, _) in b.items()}
    if qtype == "q4_k_m":
        # tiny rows are 128 wide (not a multiple of 256): documented fallbacks
        assert types["blk.0.attn_q.weight"] == QT.Q5_0       # Q4_K -> Q5_0
        assert types["output.weight"] == QT.Q8_0             # Q6_K -> Q8_0
        assert types["blk.0.ffn_down.weight"] == QT.Q4_K     # 256-wide rows
        assert types["blk.1.ffn_down.weight"] == QT.Q6_K     # a "more bits" layer
        assert types["blk.1.attn_v.weight"] == QT.Q8_0       # more bits, 128-wide
        assert types["blk.0.attn_v.weight"] == QT.Q5_0
    else:
        want = QT.Q8_0 if qtype == "q8_0" else QT.F16
        assert all(t == want for n, t in types.items() if len(b[n][2]) == 2)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_k_m"])
def test_synth_type_equals_quantize_of_f32(tmp_path, tiny_f32, qtype):
    """Both tools share the mix rule and the quantizer: identical files."""
    direct = synth(tmp_path / "direct.gguf", type_=qtype)
    via = tmp_path / "via.gguf"
    run([bin_path("spillway-quantize"), tiny_f32, via, qtype])
    assert direct.read_bytes() == via.read_bytes()


def test_quantize_real_model_with_odd_rows(tmp_path):
    """stories260K (F32, dim 64, FFN 172): exercises every fallback on a real model."""
    src_path = shared_file("models/stories260K.gguf")
    out = tmp_path / "stories-q4km.gguf"
    run([bin_path("spillway-quantize"), src_path, out, "q4_k_m"])
    a, b = tensors(GGUFReader(src_path)), tensors(GGUFReader(out))
    assert b["blk.0.attn_q.weight"][0] == QT.Q5_0
    assert b["blk.0.ffn_down.weight"][0] == QT.F16       # 172 is not a multiple of 32
    assert b["output.weight"][0] == QT.Q8_0
    for name, (_, ref, _) in a.items():
        assert rel_rms(b[name][1], ref) < TOL["q4_k_m"], name
    r = GGUFReader(out)
    assert len(field(r, "tokenizer.ggml.tokens")) == 512
    assert field(r, "general.file_type") == 15


def test_quantize_llama_cpp_q4km_to_q8_0(tmp_path):
    """A llama.cpp-made Q4_K_M file: Q4_K/Q6_K rows dequantize and requantize."""
    src_path = shared_file("golden/synth-spm-d256-q4km.gguf")
    out = tmp_path / "golden-q8.gguf"
    run([bin_path("spillway-quantize"), src_path, out, "q8_0"])
    a, b = tensors(GGUFReader(src_path)), tensors(GGUFReader(out))
    for name, (qt, ref, ne) in a.items():
        if len(ne) == 2:
            assert b[name][0] == QT.Q8_0
            assert rel_rms(b[name][1], ref) < TOL["q8_0"], name
    # and back to q4_k_m: unchanged types are copied byte for byte
    back = tmp_path / "back.gguf"
    run([bin_path("spillway-quantize"), src_path, back, "q4_k_m"])
    r0, r1 = GGUFReader(src_path), GGUFReader(back)
    t0 = {t.name: t for t in r0.tensors}
    for t in r1.tensors:
        if t.tensor_type == t0[t.name].tensor_type:
            assert np.array_equal(np.asarray(t.data), np.asarray(t0[t.name].data)), t.name


def test_mxfp4_reads_as_gguf_reads_it(tmp_path):
    """MXFP4 (gpt-oss's expert format): random blocks, every nibble and a
    range of E8M0 exponents, dequantized by spillway-quantize (to f16, where
    all these values are exact) and by the gguf package: equal."""
    rng = np.random.default_rng(5)
    rows, cols = 16, 96
    blk = rng.integers(0, 256, size=(rows, cols // 32, 17), dtype=np.uint8)
    blk[:, :, 0] = rng.integers(110, 141, size=(rows, cols // 32))   # 2^-18 .. 2^12 x 12: exact in f16
    src, out = tmp_path / "mx.gguf", tmp_path / "mx16.gguf"
    w = GGUFWriter(str(src), "llama")
    w.add_tensor("blk.0.ffn_down_exps.weight", blk.reshape(rows, -1), raw_dtype=QT.MXFP4)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    run([bin_path("spillway-quantize"), src, out, "f16"])
    a, b = GGUFReader(src).tensors[0], GGUFReader(out).tensors[0]
    assert a.tensor_type == QT.MXFP4 and b.tensor_type == QT.F16
    ref = dequantize(a.data, QT.MXFP4).reshape(rows, cols)
    got = np.asarray(b.data, dtype=np.float32).reshape(rows, cols)
    assert np.abs(ref).max() > 1000 and np.abs(ref[ref != 0]).min() < 1e-4
    assert np.array_equal(got, ref)


def test_cli_errors(tmp_path, tiny_f32):
    q = bin_path("spillway-quantize")
    r = run([q, tiny_f32, tmp_path / "x.gguf", "q3_k_xl"], ok=False)
    assert r.returncode != 0 and "unknown type 'q3_k_xl'" in r.stderr
    r = run([q, tmp_path / "missing.gguf", tmp_path / "x.gguf", "q8_0"], ok=False)
    assert r.returncode != 0 and "missing.gguf" in r.stderr and "No such file" in r.stderr
    r = run([q, tiny_f32], ok=False)
    assert r.returncode != 0 and "usage" in r.stderr
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(tiny_f32.read_bytes()[:100000])
    r = run([q, bad, tmp_path / "x.gguf", "q8_0"], ok=False)
    assert r.returncode != 0 and "extends past end of file" in r.stderr, r.stderr
    r = run([q, tiny_f32, tmp_path / "no-such-dir" / "x.gguf", "q8_0"], ok=False)
    assert r.returncode != 0 and "no-such-dir" in r.stderr
    assert not (tmp_path / "x.gguf").exists()

    s = bin_path("spillway-synth")
    r = run([s, "--shape", "huge", tmp_path / "x.gguf"], ok=False)
    assert r.returncode != 0 and "unknown shape 'huge'" in r.stderr
    r = run([s, "--shape", "tiny", "--type", "q2", tmp_path / "x.gguf"], ok=False)
    assert r.returncode != 0 and "unknown type 'q2'" in r.stderr
    r = run([s, "--shape", "tiny"], ok=False)
    assert r.returncode != 0 and "OUT.gguf is required" in r.stderr
    r = run([s, "--shape", "tiny", "--seed", "abc", tmp_path / "x.gguf"], ok=False)
    assert r.returncode != 0 and "bad seed" in r.stderr
    assert not (tmp_path / "x.gguf").exists()


def test_bench_reports_table_and_json(tmp_path):
    """spillway-bench on a tiny q4_k_m model: the table rows and the JSON
    line carry every figure the benchmark promises (no timing assertions:
    only that the figures exist, are positive and agree with each other)."""
    import json
    model = synth(tmp_path / "tiny-q4km.gguf", type_="q4_k_m")
    r = run([bin_path("spillway-bench"), "-m", model, "-t", "2", "-p", "32", "-n", "20",
             "-b", "1,3", "--mem-mib", "32"])
    lines = r.stdout.strip().splitlines()
    assert any(l.startswith("prefill ") for l in lines), r.stdout
    assert any(l.startswith("decode batch 3 ") for l in lines), r.stdout
    j = json.loads(lines[-1])
    assert j["threads"] == 2 and j["prefill_tokens"] == 32
    assert [d["batch"] for d in j["decode"]] == [1, 3]
    for d in j["decode"]:
        assert d["tokens_per_s"] > 0 and d["gb_per_s"] > 0 and d["mem_read_beside_gb_per_s"] > 0
        assert d["weight_bytes_per_token"] == j["weight_bytes_per_token"] // d["batch"]
    b1 = j["decode"][0]
    assert j["mem_read_gb_per_s"] == b1["mem_read_beside_gb_per_s"]
    assert j["mem_read_best_gb_per_s"] >= j["mem_read_gb_per_s"] * 0.999
    assert abs(j["decode_b1_bw_fraction"] - b1["gb_per_s"] / b1["mem_read_beside_gb_per_s"]) < 0.01
    assert abs(j["prefill_over_decode_b1"] - j["prefill_tokens_per_s"] / b1["tokens_per_s"]) < 0.05
    assert abs(j["decode_b3_over_b1"] - j["decode"][1]["tokens_per_s"] / b1["tokens_per_s"]) < 0.05
    # Weight multiply-adds per token of the tiny shape (dim 128, 2 layers,
    # 4/2 heads of 32, ffn 256, vocab 1024): wk+wv, the rest of a layer, and
    # the output. The 32-token prompt runs its last layer past K/V and the
    # output for its last token only; a decode token runs everything.
    kv, rest, out = 128 * 2 * 64, 2 * 128 * 128 + 3 * 128 * 256, 128 * 1024
    prompt = (1 * 32 * (kv + rest) + 32 * kv + rest + out) / 32
    assert abs(j["prefill_gmac_per_s"] * 1e9 / j["prefill_tokens_per_s"] / prompt - 1) < 0.01
    for d in j["decode"]:
        assert abs(d["gmac_per_s"] * 1e9 / d["tokens_per_s"] / (2 * (kv + rest) + out) - 1) < 0.01
    assert j["int8_peak_gmac_per_s"] >= 0
    if j["int8_peak_gmac_per_s"] > 0:   # a CPU with the VNNI path
        peak = j["int8_peak_gmac_per_s"]
        assert abs(j["prefill_fraction_of_int8_peak"] - j["prefill_gmac_per_s"] / peak) < 0.002
        ceiling = peak * 1e9 / prompt
        assert abs(j["prefill_at_int8_peak_over_decode_b1"] / (ceiling / b1["tokens_per_s"]) - 1) < 0.01
        assert any(l.startswith("int8 multiply-add peak") for l in lines), r.stdout


def test_bench_takes_prefill_against_the_int8_forms_own_peak(tmp_path):
    """Where the int8 form runs on an instruction of its own (AVX2 with
    AVX-VNNI: vpdpbusd on ymm, where the packed kernels pair vpmaddubsw and
    vpmaddwd; AVX-512 with AMX: tdpbsud), the bench times that
    instruction's peak too and takes the prefill's "of peak" against it;
    elsewhere it reports one peak. The form from 16 tokens, so a 32-token
    prompt runs on it."""
    import json
    cpu = json.loads(run([bin_path("spillway-bench"), "--cpu"]).stdout)
    if "avx2" not in cpu["cpu"].split():
        pytest.skip(f"no AVX2 on this CPU ({cpu['cpu']})")
    model = synth(tmp_path / "tiny-q4km.gguf", type_="q4_k_m")

    def bench(isa):
        env = {**os.environ, "SPILLWAY_ISA": isa, "SPILLWAY_I8_MIN_TOKENS": "16"}
        r = run([bin_path("spillway-bench"), "-m", model, "-t", "2", "-p", "32", "-n", "4", "-b", "1",
                 "--mem-mib", "32"], env=env)
        lines = r.stdout.strip().splitlines()
        return lines, json.loads(lines[-1])
    if cpu["best"] == "avx512" and "avx512vnni" in cpu["cpu"].split():
        lines, j = bench("avx512")
        assert j["isa"] == "avx512", j
        if "amx-int8" in cpu["cpu"].split():
            # The form on AMX's tdpbsud (about 8x vpdpbusd's peak here, so
            # 2x holds on a loaded host and in the sanitizer build).
            assert j["int8_form_peak_gmac_per_s"] > 2 * j["int8_peak_gmac_per_s"] > 0, j
            assert any(l.startswith("the int8 form's peak (tdpbsud (AMX)") for l in lines), lines
        else:
            # The form and the packed kernels both run vpdpbusd on zmm: one peak.
            assert "int8_form_peak_gmac_per_s" not in j, j
    lines, j = bench("avx2")
    if "avxvnni" not in cpu["cpu"].split():
        # Zen 3 and the like: no form on AVX2, so one peak (the pairs').
        assert j["i8_min_tokens"] == 0 and "int8_form_peak_gmac_per_s" not in j, j
        return
    assert j["isa"] == "avx2" and j["i8_min_tokens"] == 16, j
    form, pairs = j["int8_form_peak_gmac_per_s"], j["int8_peak_gmac_per_s"]
    # Two timings (about 2.2x apart when quiet): only their presence is
    # asserted, as a loaded CI host moves each on its own.
    assert form > 0 and pairs > 0, (form, pairs)
    assert abs(j["prefill_fraction_of_int8_form_peak"] - j["prefill_gmac_per_s"] / form) < 0.002
    assert abs(j["prefill_fraction_of_int8_peak"] - j["prefill_gmac_per_s"] / pairs) < 0.002
    prefill = next(l for l in lines if l.startswith("prefill "))
    assert prefill.split()[-1] == f"{100 * j['prefill_gmac_per_s'] / form:.0f}%", prefill
    assert any(l.startswith("the int8 form's peak (vpdpbusd ymm") for l in lines), lines
    # Batch 1 is below the form's threshold: its "of peak" stays against the pairs.
    b1 = next(l for l in lines if l.startswith("decode batch 1 "))
    assert b1.split()[-1] == f"{100 * j['decode'][0]['gmac_per_s'] / pairs:.0f}%", b1


@pytest.mark.parametrize("cache,slot_bytes", [("f16", 2 * 32 * 2), ("q8_0", 2 * (32 + 2))])
def test_bench_depth_counts_the_cache_it_reads(tmp_path, cache, slot_bytes):
    """spillway-bench -d: decode starts after `depth` positions of context in
    every sequence, and each step's cache read is counted beside the
    weights: per token, per layer and KV head, its attended slots in whole
    tiles of 32, each with K and V (and q8_0's scales). GB/s covers both."""
    import json
    model = synth(tmp_path / "tiny-q4km.gguf", type_="q4_k_m")
    depth, n = 40, 20
    r = run([bin_path("spillway-bench"), "-m", model, "-t", "2", "-p", "32", "-n", str(n), "-b", "1,3",
             "-d", str(depth), "--kv-cache", cache, "--mem-mib", "32"])
    assert f"{cache} KV cache, depth {depth}" in r.stdout, r.stdout
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert j["depth"] == depth and j["kv_cache"] == cache
    # the tiny shape: 2 layers, 2 KV heads of 32; timed steps at depth+1..depth+n
    per_token = sum(2 * 2 * -(-(p + 1) // 32) * 32 * slot_bytes for p in range(depth + 1, depth + n + 1)) / n
    for d in j["decode"]:
        assert d["kv_bytes_per_step"] == round(d["batch"] * per_token), (d, per_token)
        step = d["weight_bytes_per_token"] * d["batch"] + d["kv_bytes_per_step"]
        measured = d["gb_per_s"] * 1e9 * d["batch"] / d["tokens_per_s"]
        assert abs(measured / step - 1) < 0.02, (d, step)


def test_bench_cli_errors(tmp_path):
    b = bin_path("spillway-bench")
    r = run([b, "-m", tmp_path / "missing.gguf"], ok=False)
    assert r.returncode != 0 and "missing.gguf" in r.stderr
    r = run([b, "-m", "x.gguf", "-b", "1,0"], ok=False)
    assert r.returncode != 0 and "-b" in r.stderr
    r = run([b, "-p", "5"], ok=False)
    assert r.returncode != 0 and "-m MODEL is required" in r.stderr
    r = run([b, "-m", "x.gguf", "-d", "-1"], ok=False)
    assert r.returncode != 0 and "-d" in r.stderr


def test_bench_kernels_mode(tmp_path):
    """spillway-bench --kernels needs no model: the packed matmul in cache and
    streamed at 1 and 8 tokens, and in cache at 128 (the K-quants there on
    the int8 form where the ISA has it), as a table and a JSON line. The
    program says which kernels this host has, and from which CPU features
    it chose them; the test checks exactly those kernels, and that an
    AVX-512 VNNI host has them all (kernelreport.check_kernels_report)."""
    r = run([bin_path("spillway-bench"), "--kernels", "-t", "2", "--mem-mib", "64"], ok=False, env=env_defaults())
    if r.returncode != 0 and "no packed kernels to time" in r.stderr:
        pytest.skip("this ISA has no packed kernels: " + r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stderr
    j = check_kernels_report(r.stdout, r.stderr, threads=2)
    assert not j["quick"]


def test_bench_kernels_quick():
    """--quick runs every point once on small matrices (for an emulator):
    the same kernels as the full run, each timed."""
    r = run([bin_path("spillway-bench"), "--kernels", "--quick", "-t", "2", "--mem-mib", "16"], ok=False,
            env=env_defaults())
    if r.returncode != 0 and "no packed kernels to time" in r.stderr:
        pytest.skip("this ISA has no packed kernels: " + r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stderr
    assert check_kernels_report(r.stdout, r.stderr, threads=2)["quick"]
    assert run([bin_path("spillway-bench"), "--quick"], ok=False).returncode == 2   # --kernels only


def test_bench_cpu_mode():
    """--cpu: the ISA in use, the best one and the features it follows from;
    SPILLWAY_ISA moves the first only, and never above the best."""
    rep = cpu_report(bin_path("spillway-bench"))
    assert rep["best"] == expected_best(rep), rep
    if not os.environ.get("SPILLWAY_ISA"):
        assert rep["isa"] == rep["best"]
    assert (rep["i8_min_tokens"] > 0) == int8_form_expected(rep), rep
    order = ["scalar", "avx2", "avx512"]
    for isa in order:
        forced = cpu_report(bin_path("spillway-bench"), env=dict(os.environ, SPILLWAY_ISA=isa))
        assert forced["best"] == rep["best"] and forced["cpu"] == rep["cpu"]
        assert forced["isa"] == order[min(order.index(isa), order.index(rep["best"]))], forced


def cpuinfo_first(key):
    """The first processor's `key` line of /proc/cpuinfo (this test runs
    natively, where that file is this CPU's)."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k.strip() == key:
                return v.strip()
    pytest.skip(f"/proc/cpuinfo has no {key!r}")


def test_bench_cpu_model_and_prefetch_choice():
    """--cpu names the CPU as cpuid's brand string (what the kernel shows
    as /proc/cpuinfo's model name) and says whether the packed Q4_K kernel
    prefetches at one token: on Intel CPUs by default, not on others;
    SPILLWAY_PREFETCH_1TOK=0|1 decides instead, and another value is
    refused with a warning that keeps the default."""
    rep = cpu_report(bin_path("spillway-bench"))
    assert rep["cpu_model"] == " ".join(cpuinfo_first("model name").split()), rep
    assert rep["prefetch_1tok"] == (cpuinfo_first("vendor_id") == "GenuineIntel"), rep
    env = env_defaults()
    for value, want in (("0", False), ("1", True)):
        forced = cpu_report(bin_path("spillway-bench"), env=dict(env, SPILLWAY_PREFETCH_1TOK=value))
        assert forced["prefetch_1tok"] is want and not forced["stderr"], forced
    bad = cpu_report(bin_path("spillway-bench"), env=dict(env, SPILLWAY_PREFETCH_1TOK="yes"))
    assert bad["prefetch_1tok"] == rep["prefetch_1tok"], bad
    assert "SPILLWAY_PREFETCH_1TOK=yes not understood (0|1)" in bad["stderr"], bad
