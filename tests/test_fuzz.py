"""Runs every fuzz program (tests/fuzz/fuzz_*.c, built to $BUILD/tests/fuzz/).

Each is a deterministic mutation fuzzer with a main(): it exits 0 when no
input crashed it and no invariant broke. SPILLWAY_FUZZ_SECONDS bounds the run
time, so a sanitizer build (much slower) still finishes in time; there, a
leak or undefined behaviour fails the program too. fuzz_model mutates real
model files: a Q4_K_M model that spillway-synth makes here, and the trained
f32 stories260K when $SPILLWAY_SHARED has it, and small Qwen2 (fused q/k/v
with its bias), Phi-3 (fused gate and up, LongRoPE), Gemma 2 and 3 (post-norms,
soft-caps, sliding windows), Qwen3-MoE (stacked experts), Qwen2-MoE (a
shared expert), Granite (its four multipliers), SmolLM3, gpt-oss (sinks and
biases) and OLMo 2 files from tests/archmodels.py.
fuzz_policy starts from the repository's routes.yaml and the documented
examples as well as its own. fuzz_pretok runs every BPE pre-tokenizer
family's regexes (PCRE2) over mutated text, ill-formed UTF-8 included;
fuzz_tokenizer encodes and decodes it with small SentencePiece and BPE
vocabularies of its own (tests/fuzz/vocab.h).

The same programs built with -DSW_LIBFUZZER are make fuzz's coverage-guided
targets (all but fuzz_model); each starts from tests/fuzz/corpus/NAME/,
where every crash it found is kept. test_fuzz_corpus replays each of those
files through the program here, so a fixed crash stays fixed.
"""
import os
import subprocess

import pytest

import archmodels
from conftest import BUILD, ROOT, SHARED, bin_path

FUZZ_DIR = ROOT / "tests" / "fuzz"
PROGRAMS = sorted(p.stem for p in FUZZ_DIR.glob("fuzz_*.c"))
CORPORA = sorted(p.name for p in (FUZZ_DIR / "corpus").iterdir() if p.is_dir())
# Seconds each mutation run takes in make test (plain and ASan): a quick
# regression pass; the coverage-guided search is make fuzz's (libFuzzer,
# 30 s a target in .ci/run).
SECONDS = 8


def program_args(name, tmp_path):
    if name == "fuzz_policy":
        return [str(ROOT / "routes.yaml")] + sorted(str(p) for p in (ROOT / "docs" / "examples").glob("*.yaml"))
    if name != "fuzz_model":
        return []
    seed = tmp_path / "tiny-q4km.gguf"
    r = subprocess.run([bin_path("spillway-synth"), "--shape", "tiny", "--type", "q4_k_m", str(seed)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    seeds = [str(seed)]
    for arch in ("qwen2", "phi3", "gemma2", "gemma3", "qwen3moe", "qwen2moe", "granite", "smollm3", "gpt-oss", "olmo2"):
        hp, w = archmodels.make_weights(arch, E=64, n_head=4, n_kv=2, hd=16, F=128, V=300)
        # the Phi-3 seed with LongRoPE's tables and keys (hd 16: 8 pairs)
        longrope = ([1.0 + i for i in range(8)], [1.0] * 8, 32, 1.2) if arch == "phi3" else None
        archmodels.write_model(tmp_path / f"{arch}.gguf", arch, hp, w, fused_qkv=True, longrope=longrope)
        seeds.append(str(tmp_path / f"{arch}.gguf"))
    stories = SHARED / "models" / "stories260K.gguf"
    return seeds + ([str(stories)] if stories.exists() else [])


@pytest.mark.parametrize("name", PROGRAMS)
def test_fuzz_program(name, tmp_path):
    exe = BUILD / "tests" / "fuzz" / name
    assert exe.exists(), f"{exe} not built"
    env = dict(os.environ, SPILLWAY_FUZZ_SECONDS=str(SECONDS))
    r = subprocess.run([str(exe), *program_args(name, tmp_path)], capture_output=True, text=True,
                       timeout=SECONDS + 40, env=env, cwd=ROOT)
    if r.returncode == 77:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, f"{name} failed (rc={r.returncode})\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}"
    assert " 0 invariant failures" in r.stdout, r.stdout


def test_every_libfuzzer_target_has_a_corpus():
    assert CORPORA == [p for p in PROGRAMS if p != "fuzz_model"]
    for name in CORPORA:
        assert any((FUZZ_DIR / "corpus" / name).iterdir()), f"{name}: empty seed corpus"


@pytest.mark.parametrize("name", CORPORA)
def test_fuzz_corpus(name):
    exe = BUILD / "tests" / "fuzz" / name
    assert exe.exists(), f"{exe} not built"
    corpus = FUZZ_DIR / "corpus" / name
    env = dict(os.environ, SPILLWAY_FUZZ_REPLAY=str(corpus))
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, f"{name} failed on its corpus (rc={r.returncode})\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}"
    n = sum(1 for p in corpus.iterdir() if not p.name.startswith("."))
    assert f": {n} inputs replayed" in r.stdout and " 0 invariant failures" in r.stdout, r.stdout
