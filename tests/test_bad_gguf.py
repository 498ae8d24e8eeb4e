"""Malformed GGUF files: spillway-run must refuse them with a clear message
that names the offending field, and never crash (no signal, no sanitizer
report). Each case copies the real stories260K model into tmp_path and breaks
one thing in it."""
import struct
import subprocess

import pytest

from conftest import bin_path, shared_file

CRASH_MARKERS = ("AddressSanitizer", "runtime error", "LeakSanitizer", "Segmentation", "core dumped")


def run_model(path, *extra):
    args = [bin_path("spillway-run"), "-m", str(path), "-p", "Once", "-n", "4", "--temp", "0", *extra]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    return r


def assert_clean_failure(r, *words):
    assert r.returncode > 0, f"expected an error exit, got {r.returncode}\n{r.stderr}"
    for m in CRASH_MARKERS:
        assert m not in r.stderr, r.stderr
    low = r.stderr.lower()
    assert any(w.lower() in low for w in words), f"no {words} in: {r.stderr}"
    assert r.stdout == "", "nothing may be generated from a bad file"


# ---- a minimal GGUF header walker, to find the byte offsets to patch ----

SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def walk(buf):
    """Returns (kv offsets {key: value_offset}, tensor infos [(name, info_offset, offset_field_at)])."""
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)

    def string(p):
        n = struct.unpack_from("<Q", buf, p)[0]
        return buf[p + 8:p + 8 + n].decode(), p + 8 + n

    def skip_value(t, p):
        if t in SCALAR_SIZES:
            return p + SCALAR_SIZES[t]
        if t == 8:
            return string(p)[1]
        assert t == 9
        et, n = struct.unpack_from("<IQ", buf, p)
        p += 12
        for _ in range(n):
            p = skip_value(et, p)
        return p

    kvs = {}
    for _ in range(n_kv):
        key, pos = string(pos)
        t = struct.unpack_from("<I", buf, pos)[0]
        pos += 4
        kvs[key] = (t, pos)
        pos = skip_value(t, pos)
    tensors = []
    for _ in range(n_tensors):
        start = pos
        name, pos = string(pos)
        nd = struct.unpack_from("<I", buf, pos)[0]
        pos += 4 + 8 * nd + 4
        tensors.append((name, start, pos))
        pos += 8
    return kvs, tensors


@pytest.fixture
def model_bytes():
    return bytearray(shared_file("models/stories260K.gguf").read_bytes())


def write(tmp_path, data, name="bad.gguf"):
    p = tmp_path / name
    p.write_bytes(bytes(data))
    return p


def test_intact_copy_works(tmp_path, model_bytes):
    """The copy itself is fine, so every failure below is due to the damage."""
    r = run_model(write(tmp_path, model_bytes, "good.gguf"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Once")


@pytest.mark.parametrize("keep", [0, 3, 20, 200, 2000, "half", "minus1"])
def test_truncated(tmp_path, model_bytes, keep):
    n = {"half": len(model_bytes) // 2, "minus1": len(model_bytes) - 1}.get(keep, keep)
    r = run_model(write(tmp_path, model_bytes[:n]))
    assert_clean_failure(r, "truncated", "past end", "too short", "empty", "absurd", "file ends")


def test_absurd_tensor_count(tmp_path, model_bytes):
    struct.pack_into("<Q", model_bytes, 8, 1 << 61)
    r = run_model(write(tmp_path, model_bytes))
    assert_clean_failure(r, "tensor count")


def test_absurd_kv_count(tmp_path, model_bytes):
    struct.pack_into("<Q", model_bytes, 16, (1 << 64) - 1)
    r = run_model(write(tmp_path, model_bytes))
    assert_clean_failure(r, "kv count")


@pytest.mark.parametrize("value", [1 << 60, (1 << 64) - 32])
def test_absurd_tensor_offset(tmp_path, model_bytes, value):
    _, tensors = walk(model_bytes)
    name, _, off_at = tensors[3]
    struct.pack_into("<Q", model_bytes, off_at, value)
    r = run_model(write(tmp_path, model_bytes))
    assert_clean_failure(r, name)
    assert "offset" in r.stderr


def test_misaligned_tensor_offset(tmp_path, model_bytes):
    _, tensors = walk(model_bytes)
    name, _, off_at = tensors[1]
    old = struct.unpack_from("<Q", model_bytes, off_at)[0]
    struct.pack_into("<Q", model_bytes, off_at, old + 2)
    r = run_model(write(tmp_path, model_bytes))
    assert_clean_failure(r, name)


def test_absurd_string_length(tmp_path, model_bytes):
    kvs, _ = walk(model_bytes)
    t, at = kvs["general.architecture"]
    assert t == 8
    struct.pack_into("<Q", model_bytes, at, 1 << 50)
    r = run_model(write(tmp_path, model_bytes))
    assert_clean_failure(r, "general.architecture", "past end")


def test_missing_tensor(tmp_path, model_bytes):
    """A well-formed file that lacks a tensor the model needs: the loader names it."""
    i = model_bytes.find(b"blk.2.attn_k.weight")
    assert i > 0
    model_bytes[i:i + 19] = b"blk.2.attn_z.weight"
    r = run_model(write(tmp_path, model_bytes))
    assert_clean_failure(r, "blk.2.attn_k.weight")
    assert "missing" in r.stderr


def test_nan_weights_fail_clearly(tmp_path, model_bytes):
    """A well-formed file whose weights hold NaN loads, but its logits come out
    NaN: the first sample is refused with an error instead of streaming junk
    tokens."""
    import gguf
    import numpy as np
    p = write(tmp_path, model_bytes)
    reader = gguf.GGUFReader(str(p), "r+")
    t = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate.weight")
    t.data[0][:] = np.nan
    t.data.flush()
    del reader, t
    r = run_model(p)
    assert r.returncode == 1, r.stderr
    for m in CRASH_MARKERS:
        assert m not in r.stderr, r.stderr
    assert "NaN logits" in r.stderr, r.stderr
    assert r.stdout.strip() == "Once", "nothing may be generated: " + r.stdout


def test_wrong_hparam_gives_shape_error(tmp_path, model_bytes):
    """embedding_length no longer matches the tensors: a shape error naming a tensor."""
    kvs, _ = walk(model_bytes)
    t, at = kvs["llama.embedding_length"]
    assert t == 4
    struct.pack_into("<I", model_bytes, at, 128)
    r = run_model(write(tmp_path, model_bytes))
    assert_clean_failure(r, "token_embd.weight", "shape")


def test_absurd_hparam(tmp_path, model_bytes):
    kvs, _ = walk(model_bytes)
    t, at = kvs["llama.block_count"]
    struct.pack_into("<I", model_bytes, at, 0xFFFFFFF0)
    r = run_model(write(tmp_path, model_bytes))
    assert_clean_failure(r, "llama.block_count")


def test_wrong_architecture(tmp_path, model_bytes):
    kvs, _ = walk(model_bytes)
    t, at = kvs["general.architecture"]
    # replace the value "llama" (5 bytes) with "gpt2x"
    assert model_bytes[at + 8:at + 13] == b"llama"
    model_bytes[at + 8:at + 13] = b"gpt2x"
    r = run_model(write(tmp_path, model_bytes))
    assert_clean_failure(r, "architecture")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"this is not a model file at all, just text\n" * 10)
    r = run_model(p)
    assert_clean_failure(r, "magic")


def test_missing_file(tmp_path):
    r = run_model(tmp_path / "nope.gguf")
    assert_clean_failure(r, "no such file")


def test_tokenize_on_truncated_vocab(tmp_path):
    """--tokenize reads only the vocabulary, and must fail cleanly too."""
    data = shared_file("vocab/ggml-vocab-llama-spm.gguf").read_bytes()
    p = tmp_path / "v.gguf"
    p.write_bytes(data[:len(data) // 3])
    r = subprocess.run([bin_path("spillway-run"), "-m", str(p), "--tokenize", "hello"],
                       capture_output=True, text=True, timeout=60)
    assert_clean_failure(r, "truncated", "past end", "file ends")
