"""GPU worker acceptance without a GPU: the emulation backend runs the same
scheduler and the same FP8 numerics (E4M3 weights with per-row scales, bf16
activations, paged KV cache) on the CPU.

  - golden models: logits vs llama.cpp's (min cosine >= 0.985, top-1 >= 65%),
    on both activation paths (GEMV/bf16 for steps of <= 16 tokens, per-token
    FP8 as on the cuBLASLt path above that);
  - stories260K: the first 16 greedy tokens equal the CPU worker's;
  - through the real gateway: 8 concurrent streams all complete, heartbeats
    report a batch size above 1, and every greedy text equals the
    single-request text (continuous batching does not change results);
  - a tiny KV pool forces preemption, and every request still completes with
    the text of an unconstrained run.
"""
import json
import math
import shutil
import subprocess
import threading
import time

import numpy as np
import openai
import pytest

from conftest import GOLDEN, SHARED, bin_path, cosines, http_get, http_post, load_golden, shared_file, wait_until

PROMPT = "Once upon a time"
WORKER = "spillway-worker-gpu"


def run_worker(args, timeout=300):
    return subprocess.run([bin_path(WORKER), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(params=GOLDEN or ["(none)"])
def golden(request):
    if request.param == "(none)":
        pytest.skip(f"test data missing: {SHARED / 'golden'}/*.gguf")
    return load_golden(request.param)


# 512 tokens per step: the whole sequence in one step, per-token FP8 activations
# (the GPU's cuBLASLt path); 8 per step: the GEMV path with bf16 activations.
@pytest.mark.parametrize("step", [512, 8])
def test_golden_logits_emulate(golden, step, tmp_path):
    model, ids, ref = golden
    out = tmp_path / "logits.f32"
    r = run_worker(["--backend", "emulate", "-m", model, "--tokens", ",".join(map(str, ids)),
                    "--logits-out", out, "--max-tokens-per-step", step, "-t", "2"])
    assert r.returncode == 0, r.stderr
    got = np.fromfile(out, dtype=np.float32)
    assert got.size == ref.size, (got.size, ref.size)
    got = got.reshape(ref.shape)
    cos = cosines(got, ref)
    top1 = float((got.argmax(1) == ref.argmax(1)).mean())
    print(f"{model.name} step {step}: min cosine {cos.min():.4f}, top-1 {top1:.3f}")
    assert cos.min() >= 0.985, f"min cosine {cos.min():.4f}"
    assert top1 >= 0.65, f"top-1 agreement {top1:.3f}"


def test_kv_fp8_option_still_agrees(tmp_path):
    if not GOLDEN:
        pytest.skip("no golden models")
    model, ids, ref = load_golden(GOLDEN[-1])
    out = tmp_path / "l.f32"
    r = run_worker(["--backend", "emulate", "-m", model, "--tokens", ",".join(map(str, ids)),
                    "--logits-out", out, "--kv-dtype", "fp8", "--max-tokens-per-step", "8"])
    assert r.returncode == 0, r.stderr
    got = np.fromfile(out, dtype=np.float32).reshape(ref.shape)
    assert float((got.argmax(1) == ref.argmax(1)).mean()) >= 0.65


def test_stories_first_16_greedy_tokens_match_cpu_worker():
    model = shared_file("models/stories260K.gguf")
    cpu = subprocess.run([bin_path("spillway-run"), "-m", model, "-p", PROMPT, "-n", "16", "--temp", "0",
                          "-t", "1"], capture_output=True, text=True, timeout=120)
    assert cpu.returncode == 0, cpu.stderr
    gpu = run_worker(["--backend", "emulate", "-m", model, "-p", PROMPT, "-n", "16", "--temp", "0"])
    assert gpu.returncode == 0, gpu.stderr
    assert gpu.stdout.rstrip() == cpu.stdout.rstrip()
    assert len(gpu.stdout) > len(PROMPT) + 20      # really generated something


def test_cuda_backend_fails_fast_without_gpu():
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        pytest.skip("a GPU is present")
    model = shared_file("models/stories260K.gguf")
    t0 = time.monotonic()
    r = run_worker(["-m", model, "-p", "x", "-n", "1"], timeout=30)
    assert r.returncode != 0
    assert "no CUDA device found" in r.stderr and "--backend emulate" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("args,msg", [
    (["--backend", "tpu", "-m", "x", "--tokens", "1"], "--backend"),
    (["--backend", "emulate", "-m", "x", "--tokens", "1,a"], "--tokens"),
    (["--backend", "emulate", "--kv-dtype", "int4", "-m", "x", "--tokens", "1"], "--kv-dtype"),
    (["--backend", "emulate", "--max-batch", "0", "-m", "x", "--tokens", "1"], "--max-batch"),
    (["--gateway", "tcp://127.0.0.1:1", "--pool", "p", "--model", "nopath"], "NAME=PATH"),
    (["--backend", "emulate", "--bogus"], "unknown option"),
    (["--backend", "emulate", "--prefix-cache", "maybe", "-m", "x", "--tokens", "1"], "--prefix-cache"),
    (["--backend", "emulate"], "choose one mode"),
])
def test_bad_flags_rejected(args, msg):
    r = run_worker(args, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert msg in r.stderr, r.stderr


def test_bad_model_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    r = run_worker(["--backend", "emulate", "-m", bad, "--tokens", "1"], timeout=30)
    assert r.returncode == 1
    assert "bad.gguf" in r.stderr and "Traceback" not in r.stderr


def test_out_of_range_token_rejected():
    model = shared_file("models/stories260K.gguf")
    r = run_worker(["--backend", "emulate", "-m", model, "--tokens", "1,999999"], timeout=30)
    assert r.returncode == 2 and "out of range" in r.stderr, r.stderr


# ---------------------------------------------------------------- through the gateway

# A random-weight golden model: slow enough per step (vocabulary 32000) on
# the emulation backend that concurrent requests really overlap.
SERVED = "golden/synth-spm-d256-q4km.gguf"
POLICY = """\
pools:
  - name: gpu-pool
    kind: gpu
routes:
  - model: "synth"
    quantization: "fp8"
    target: gpu-pool
    max_concurrency: 64
"""


def start(cluster, extra):
    model = shared_file(SERVED)
    cluster.start_gateway(POLICY)
    w = cluster.start_worker("gpu-pool", "synth", model, ["--backend", "emulate", "-t", "1", *extra],
                             name="gpu", binary=WORKER)
    cluster.wait_model("synth", timeout=60)
    return w


def concurrent_completions(cluster, n, max_tokens, stream=True):
    c = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    results, errors = [None] * n, []
    barrier = threading.Barrier(n)

    def one(i):
        try:
            barrier.wait()
            if stream:
                parts, finish = [], None
                for ch in c.completions.create(model="synth", prompt=PROMPT, max_tokens=max_tokens,
                                               temperature=0, stream=True):
                    if ch.choices:
                        parts.append(ch.choices[0].text)
                        finish = ch.choices[0].finish_reason or finish
                results[i] = ("".join(parts), finish)
            else:
                r = c.completions.create(model="synth", prompt=PROMPT, max_tokens=max_tokens, temperature=0)
                results[i] = (r.choices[0].text, r.choices[0].finish_reason)
        except Exception as e:      # reported below, with the logs
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    return results


def single_text(max_tokens, extra=()):
    """The same request alone, through the standalone mode (same engine code)."""
    model = shared_file(SERVED)
    r = run_worker(["--backend", "emulate", "-m", model, "-p", PROMPT, "-n", max_tokens, "--temp", "0", "-t", "1",
                    "--max-tokens-per-step", "16", *extra])
    assert r.returncode == 0, r.stderr
    return r.stdout[len(PROMPT):].rstrip("\n")


def test_eight_concurrent_streams_batch(cluster):
    # <= 16 tokens per step keeps every step on the bf16 GEMV path, whose
    # numerics do not depend on the batch, so each text must equal the
    # single-request text exactly.
    w = start(cluster, ["--max-batch", "8", "--max-tokens-per-step", "16"])
    want = single_text(48)
    seen, stop = [0], threading.Event()

    def poll():   # the gateway's view of the worker, from its heartbeats
        while not stop.is_set():
            try:
                ws = json.loads(cluster.admin_get("/admin/workers")[1])
                ws = ws.get("data", []) if isinstance(ws, dict) else ws
                seen[0] = max([seen[0]] + [x.get("batch_size", 0) for x in ws if x.get("kind") == "gpu"])
            except Exception:
                pass
            time.sleep(0.02)
    poller = threading.Thread(target=poll)
    poller.start()
    try:
        results = concurrent_completions(cluster, 8, 48)
        for text, finish in results:
            assert finish in ("length", "stop")
            assert text.rstrip() == want.rstrip()
        try:
            wait_until(lambda: seen[0] > 1, 5, what="a heartbeat with batch_size > 1")
        except AssertionError:
            pass
    finally:
        stop.set()
        poller.join()
    peaks = [int(l.split("(peak ")[1].split()[0]) for l in w.output().splitlines() if "(peak " in l]
    print(f"heartbeat batch_size max {seen[0]}, scheduler log peaks {peaks}")
    assert peaks and max(peaks) > 1, "the scheduler never batched\n" + cluster.logs()
    assert seen[0] > 1, "no heartbeat reported a batch size above 1\n" + cluster.logs()


def test_prefix_cache_through_the_gateway(cluster):
    """A repeated long prompt shares the KV blocks the first one computed:
    usage reports them as cached, and the text does not change."""
    start(cluster, ["--max-tokens-per-step", "16"])
    c = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    prompt = "Lily and Tom went to the park to play with a red ball. " * 4
    first = c.completions.create(model="synth", prompt=prompt, max_tokens=12, temperature=0)
    again = c.completions.create(model="synth", prompt=prompt, max_tokens=12, temperature=0)
    n = first.usage.prompt_tokens
    assert n > 32 and first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16
    assert again.choices[0].text == first.choices[0].text


def test_repeat_takes_the_prompt_from_the_prefix_cache():
    """Text mode --repeat (what tests/gpu/device-check.sh runs on the GPU):
    runs 2 and 3 share the first run's KV blocks and give the same text;
    with the cache off nothing is shared."""
    model = shared_file(SERVED)
    prompt = "Lily and Tom went to the park to play with a red ball. " * 2
    args = ["--backend", "emulate", "-m", model, "-p", prompt, "-n", "12", "--temp", "0", "-t", "1",
            "--max-tokens-per-step", "16", "--repeat", "3", "-q"]
    r = run_worker(args)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stderr.splitlines() if ": repeat " in l]
    assert len(lines) == 2 and all("text the same" in l for l in lines), r.stderr
    assert all(int(l.split("repeat ")[1].split(": ")[1].split(" of ")[0]) >= 16 for l in lines), lines
    r = run_worker(args + ["--prefix-cache", "off"])
    assert r.returncode == 0 and "repeat 3: 0 of" in r.stderr, r.stderr


def test_preemption_under_tiny_kv_pool(cluster):
    # 10 blocks = 160 positions for 4 requests of ~6 + 60 tokens (5 blocks each):
    # the pool runs out and the newest requests are preempted and recomputed.
    w = start(cluster, ["--max-batch", "4", "--kv-blocks", "10", "--max-tokens-per-step", "16"])
    want = single_text(60)
    results = concurrent_completions(cluster, 4, 60, stream=False)
    for text, finish in results:
        assert finish in ("length", "stop")
        assert text.rstrip() == want.rstrip()
    log = w.output()
    print("\n".join(l for l in log.splitlines() if "sched:" in l))
    assert "preempted" in log, "no preemption happened\n" + log[-3000:]


def test_logprobs_through_the_gpu_worker(cluster):
    """Log probabilities need the logits on the host, so such a request
    leaves the device sampler: the greedy text stays the same, and every
    token has its entry, likeliest first."""
    start(cluster, [])
    c = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    plain = c.completions.create(model="synth", prompt=PROMPT, max_tokens=8, temperature=0)
    r = c.completions.create(model="synth", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == plain.choices[0].text
    assert len(lp.tokens) == r.usage.completion_tokens == 8
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert val <= 0 and len(top) == 3
        best = max(top.values())
        assert val == pytest.approx(best, abs=1e-5), (tok, val, top)   # greedy: the likeliest token
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-4


def test_structured_output_through_the_gpu_worker(cluster):
    """A schema needs the host's sampler too (it masks the logits): the
    random-weight model writes JSON that fits, sampled or greedy, in a
    batch with a free-text request."""
    start(cluster, [])
    c = openai.OpenAI(base_url=cluster.base + "/v1", api_key="x", max_retries=0, timeout=120)
    schema = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "age": {"type": "integer"},
                                               "tame": {"type": "boolean"}},
              "required": ["kind", "age", "tame"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": schema}}
    for temp, seed in ((0, 0), (1, 1), (1, 2)):
        r = c.completions.create(model="synth", prompt=PROMPT, max_tokens=300, temperature=temp, seed=seed,
                                 extra_body={"response_format": fmt})
        assert r.choices[0].finish_reason == "stop", r.choices[0].text
        v = json.loads(r.choices[0].text)
        assert set(v) == {"kind", "age", "tame"} and v["kind"] in ("cat", "dog"), v
        assert isinstance(v["age"], int) and isinstance(v["tame"], bool), v


def test_prompt_logprobs_are_refused_by_the_gpu_worker(cluster):
    """Scoring every prompt position is the CPU engine's: the GPU worker
    says so, rather than answering without them."""
    start(cluster, [])
    st, _, raw = http_post(cluster.base + "/v1/completions",
                           dict(model="synth", prompt=PROMPT, max_tokens=2, echo=True, logprobs=1))
    assert st == 400 and "prompt's log probabilities" in json.loads(raw)["error"]["message"], raw
