"""spillway-run on real models: the published greedy output of stories260K,
tokenization against llama.cpp's vocab test vectors, --tokens/--logits-out,
seeded sampling, and command-line validation."""
import subprocess

import numpy as np
import pytest

from archmodels import copy_gguf
from conftest import bin_path, shared_file

STORIES_PROMPT_IDS = [1, 403, 407, 261, 378]   # BOS + "Once upon a time" (README)


def run(*args, timeout=120, env=None, check=True):
    r = subprocess.run([bin_path("spillway-run"), *map(str, args)], capture_output=True,
                       timeout=timeout, env=env)
    if check:
        assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r


def read_logits(path, n_vocab):
    a = np.fromfile(path, dtype=np.float32)
    assert a.size % n_vocab == 0
    return a.reshape(-1, n_vocab)


@pytest.fixture
def stories():
    return shared_file("models/stories260K.gguf")


def test_stories_greedy_matches_published_output(stories):
    expected = shared_file("models/stories260K.greedy.txt").read_text()
    r = run("-m", stories, "-p", "Once upon a time", "-n", 252, "--temp", 0, "-t", 2)
    assert r.stdout.decode().rstrip() == expected.rstrip()


def test_stories_greedy_single_thread_same(stories):
    """Thread count must not change greedy results."""
    a = run("-m", stories, "-p", "Once upon a time", "-n", 60, "--temp", 0, "-t", 1).stdout
    b = run("-m", stories, "-p", "Once upon a time", "-n", 60, "--temp", 0, "-t", 2).stdout
    assert a == b


def test_generation_stops_at_n(stories):
    r = run("-m", stories, "-p", "Once upon a time", "-n", 0, "--temp", 0)
    assert r.stdout.decode().rstrip() == "Once upon a time"
    assert b"generated 0 tokens" in r.stderr


def vocab_cases(name):
    inp = shared_file(f"vocab/{name}.inp").read_text(encoding="utf-8")
    out = shared_file(f"vocab/{name}.out").read_text(encoding="utf-8").split("\n")
    texts = inp.split("\n__ggml_vocab_test__\n")[:-1]
    assert len(texts) <= len(out)
    return list(zip(texts, out))


def test_tokenize_spm_vocab_only_file():
    """--tokenize works on a vocab-only GGUF (no tensors) and prints ids in the
    vocab test files' own form."""
    vocab = shared_file("vocab/ggml-vocab-llama-spm.gguf")
    cases = vocab_cases("ggml-vocab-llama-spm.gguf")
    assert len(cases) > 20
    bad = []
    for text, want in cases:
        if "\0" in text:
            continue   # cannot be passed through argv
        r = run("-m", vocab, "--tokenize", text)
        got = r.stdout.decode().rstrip("\n")
        if got != want:
            bad.append((text, want, got))
    assert not bad, f"{len(bad)} of {len(cases)} differ, first: {bad[0]!r}"


def test_vocab_only_file_cannot_generate():
    vocab = shared_file("vocab/ggml-vocab-llama-spm.gguf")
    r = run("-m", vocab, "-p", "hi", check=False)
    assert r.returncode == 1
    assert b"token_embd.weight" in r.stderr


def test_tokens_logits_out_shape_and_causality(stories, tmp_path):
    f4, f1 = tmp_path / "four.f32", tmp_path / "one.f32"
    run("-m", stories, "--tokens", "1,403,407,261", "--logits-out", f4)
    run("-m", stories, "--tokens", "1", "--logits-out", f1)
    four, one = read_logits(f4, 512), read_logits(f1, 512)
    assert four.shape == (4, 512) and one.shape == (1, 512)
    assert np.isfinite(four).all()
    # Row i depends only on tokens 0..i.
    np.testing.assert_allclose(four[0], one[0], rtol=0, atol=1e-4 * np.abs(one).max())
    # The model predicts its own greedy continuation: after "1 403 407" comes 261.
    assert int(four[2].argmax()) == 261


def test_batched_prefill_equals_incremental_decode(stories, tmp_path):
    """Logits of the prompt evaluated as one batch then decoded token by token
    (KV cache) equal the logits of all tokens evaluated in one batch."""
    a, b = tmp_path / "a.f32", tmp_path / "b.f32"
    run("-m", stories, "-p", "Once upon a time", "-n", 4, "--temp", 0, "--logits-out", a)
    inc = read_logits(a, 512)
    assert inc.shape == (5 + 3, 512)        # 5 prompt positions + 3 decoded tokens
    gen = [int(x) for x in inc[4:].argmax(1)]
    run("-m", stories, "--tokens", ",".join(map(str, STORIES_PROMPT_IDS + gen[:3])), "--logits-out", b)
    full = read_logits(b, 512)
    assert full.shape == inc.shape
    np.testing.assert_allclose(inc, full, rtol=0, atol=1e-4 * np.abs(full).max())


def test_tokens_generate_continuation(stories):
    r = run("-m", stories, "--tokens", ",".join(map(str, STORIES_PROMPT_IDS)), "-n", 8, "--temp", 0)
    assert r.stdout.decode().startswith(", there was a little girl")


def test_seeded_sampling_reproducible(stories):
    args = ["-m", stories, "-p", "Once upon a time", "-n", 48, "--temp", 1.0, "--top-k", 0,
            "--top-p", 1.0, "--min-p", 0]
    a = run(*args, "--seed", 42).stdout
    b = run(*args, "--seed", 42).stdout
    assert a == b
    others = {run(*args, "--seed", s).stdout for s in (1, 2, 3)}
    assert len(others | {a}) >= 3, "different seeds should give different samples"


def test_sampling_flags_change_output(stories):
    base = ["-m", stories, "-p", "Once upon a time", "-n", 48, "--seed", 7]
    greedy = run(*base, "--temp", 0).stdout
    topk1 = run(*base, "--temp", 1.5, "--top-k", 1).stdout
    assert greedy == topk1, "top-k 1 is greedy whatever the temperature"
    rep = run(*base, "--temp", 0, "--repeat-penalty", 1.5).stdout
    assert rep != greedy


@pytest.mark.parametrize("args,what", [
    (["-n", "abc"], "-n"),
    (["-n", "-5"], "-n"),
    (["--temp", "x1"], "--temp"),
    (["--temp", "-1"], "--temp"),
    (["--temp", "nan"], "--temp"),
    (["-t", "0"], "-t"),
    (["--top-p", "2"], "--top-p"),
    (["--seed", "-3"], "--seed"),
    (["--tokens", "1,x,3"], "--tokens"),
    (["--tokens", "1,,3"], "--tokens"),
    (["--bogus", "1"], "--bogus"),
    (["-p"], "-p"),
])
def test_bad_flags_exit_2(stories, args, what):
    r = run("-m", stories, *args, check=False)
    assert r.returncode == 2, r.stderr
    assert what.encode() in r.stderr


def test_missing_model_flag():
    r = run("-p", "hi", check=False)
    assert r.returncode == 2
    assert b"-m" in r.stderr


def test_token_id_out_of_range(stories):
    r = run("-m", stories, "--tokens", "1,5000", check=False)
    assert r.returncode == 1
    assert b"out of range" in r.stderr


def test_tied_output_weights(stories, tmp_path):
    """stories260K's output.weight is a copy of token_embd.weight (llama2.c
    ties them). Without output.weight the model must use the embedding
    matrix, and so produce the very same text."""
    tied = tmp_path / "tied.gguf"
    copy_gguf(stories, tied, drop={"output.weight"})
    a = run("-m", stories, "-p", "Once upon a time", "-n", 40, "--temp", 0).stdout
    b = run("-m", tied, "-p", "Once upon a time", "-n", 40, "--temp", 0).stdout
    assert a == b


def test_logits_out_unwritable(stories, tmp_path):
    r = run("-m", stories, "--tokens", "1,403", "--logits-out", tmp_path / "no" / "such" / "dir.f32", check=False)
    assert r.returncode == 1
    assert b"No such file" in r.stderr
    assert b"Sanitizer" not in r.stderr


def test_prompt_longer_than_context(stories):
    r = run("-m", stories, "-p", "Once upon a time " * 20, "-c", 16, check=False)
    assert r.returncode == 1
    assert b"context" in r.stderr
