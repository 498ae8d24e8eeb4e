"""The lower ISA paths on CPUs that really lack AVX-512, or AVX2: the
single-process programs run under QEMU user-mode (`qemu-x86_64 -cpu MODEL`),
whose cpuid reports only that model's features. SPILLWAY_ISA (make
test-isa) forces a path after detection on an AVX-512 host; here the
detection itself runs (kernels.c's choice, the target_clones resolvers, the
AVX-VNNI check, glibc's own ifuncs), without SPILLWAY_ISA.

- EPYC-Milan (AMD Zen 3): AVX2, FMA, F16C; no AVX-512, no AVX-VNNI. The
  AVX2 path must be chosen, without the int8 form.
- Nehalem: SSE4.2, no AVX: the scalar path.

Each runs `spillway-bench --cpu` (what was detected), test_kernels --quick
and test_attention (every kernel of the chosen path against the scalar
reference), a short greedy stories260K run (a prefix of the published
text), the first tokens of a llama.cpp-quantized Q4_K_M model's logits
(llama.cpp's, and the host's own with that path forced) and
`spillway-bench --kernels --quick`. Emulated AVX2 float code runs about
100x slower than the host, so each is a subset (the full test_kernels
takes over 10 minutes there).

Needs qemu-x86_64 7.2 or later (AVX2 under TCG): ops/deps.sh installs
Debian's qemu-user.
"""
import shutil
import subprocess

import numpy as np
import pytest

from conftest import BUILD, SANITIZED, TSAN, bin_path, cosines, logits_for, shared_file
from kernelreport import DEFAULT_OVERRIDES, check_kernels_report, cpu_report, env_defaults, expected_best, features

QEMU = shutil.which("qemu-x86_64")
# model -> (the ISA detection must pick, features it must report, features it
# must not, whether it is an Intel CPU: the packed Q4_K kernel's one-token
# prefetch follows the vendor, kernels.h's sw_prefetch_one_token)
CPUS = {
    "EPYC-Milan": ("avx2", {"avx", "avx2", "fma", "f16c"}, {"avxvnni", "avx512f", "avx512bw", "avx512vnni"}, False),
    "Nehalem": ("scalar", {"sse4.2"}, {"avx", "avx2", "fma", "f16c", "avx512f"}, True),
}
GREEDY_TOKENS = 60   # of the published 252: about 4 s emulated on AVX2
GOLDEN_TOKENS = 12   # of synth-spm-d256-q4km's 38: 3 s
GOLDEN = "synth-spm-d256-q4km"

pytestmark = [
    pytest.mark.skipif(not QEMU, reason="qemu-x86_64 not installed (Debian's qemu-user; ops/deps.sh installs it)"),
    pytest.mark.skipif(SANITIZED or TSAN, reason="the plain build is the one run emulated (a sanitizer's "
                                                 "instrumentation there would take minutes more)"),
]


def env_detect():
    """Our environment without what would force or move the choice."""
    return env_defaults(("SPILLWAY_ISA", *DEFAULT_OVERRIDES))


def emulated(cpu, args, timeout=120):
    """args run under qemu-x86_64 -cpu cpu; QEMU's warnings about model
    features TCG lacks (pcid, x2apic, ...) are left out of stderr."""
    r = subprocess.run([QEMU, "-cpu", cpu, *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env=env_detect())
    r.stderr = "".join(line for line in r.stderr.splitlines(True) if "TCG doesn't support" not in line)
    return r


@pytest.fixture(params=sorted(CPUS))
def cpu(request):
    """A CPU model this QEMU has, and emulates as such."""
    name = request.param
    models = subprocess.run([QEMU, "-cpu", "help"], capture_output=True, text=True, timeout=30).stdout
    if f" {name} " not in models:
        pytest.skip(f"this qemu-x86_64 has no CPU model {name}")
    rep = cpu_report(bin_path("spillway-bench"), prefix=[QEMU, "-cpu", name], env=env_detect())
    if CPUS[name][0] == "avx2" and "avx2" not in features(rep):
        pytest.skip(f"this qemu-x86_64 does not emulate AVX2 ({name} reports {rep['cpu']!r}; QEMU 7.2+ does)")
    return name


def test_detection(cpu):
    """The program picks the model's best path from cpuid alone."""
    best, present, absent, intel = CPUS[cpu]
    rep = cpu_report(bin_path("spillway-bench"), prefix=[QEMU, "-cpu", cpu], env=env_detect())
    print(cpu, rep)
    assert present <= features(rep) and not absent & features(rep), rep
    assert rep["best"] == rep["isa"] == best == expected_best(rep), rep
    assert rep["i8_min_tokens"] == 0, rep   # neither model has a dot-product instruction
    assert rep["prefetch_1tok"] is intel, rep


def test_kernels_quick(cpu):
    """test_kernels --quick: every kernel of the detected path against the
    scalar reference, the int8 form's tests skipped for want of VNNI."""
    best = CPUS[cpu][0]
    r = emulated(cpu, [BUILD / "tests" / "unit" / "test_kernels", "--quick"], timeout=300)
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert f"best ISA on this CPU: {best} (" in r.stdout, r.stdout[:500]
    assert "int8 form on avx2: skipped (no AVX-VNNI on this CPU)" in r.stdout
    assert r.stdout.rstrip().endswith(" 0 failed")


def test_attention(cpu):
    """The attention tiles of every path up to the detected one."""
    best = CPUS[cpu][0]
    r = emulated(cpu, [BUILD / "tests" / "unit" / "test_attention"])
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert f"ISA in use: {best} (best on this CPU: {best})" in r.stdout, r.stdout[:300]


def test_stories_greedy_prefix(cpu):
    """stories260K's greedy continuation on the detected path: the
    published text's beginning."""
    model = shared_file("models/stories260K.gguf")
    want = shared_file("models/stories260K.greedy.txt").read_text().rstrip()
    r = emulated(cpu, [bin_path("spillway-run"), "-m", model, "-p", "Once upon a time", "-n", GREEDY_TOKENS,
                       "--temp", 0, "-t", 1])
    assert r.returncode == 0, r.stderr
    assert f"isa {CPUS[cpu][0]}," in r.stderr, r.stderr
    assert f"generated {GREEDY_TOKENS} tokens" in r.stderr, r.stderr
    got = r.stdout.rstrip()
    assert len(got) > len("Once upon a time") + GREEDY_TOKENS and want.startswith(got), (got, want[:len(got) + 40])


def test_golden_logits_prefix(cpu, tmp_path):
    """The first tokens of a Q4_K_M model (the packed K-quant kernels on
    AVX2): llama.cpp's logits within the full test's bar, and the host's
    own with that path forced within float rounding."""
    model, ids_file, ref_file = (shared_file(f"golden/{GOLDEN}{ext}") for ext in (".gguf", ".tokens", ".logits.f32"))
    ids = [int(t) for t in ids_file.read_text().split()][:GOLDEN_TOKENS]
    ref = np.fromfile(ref_file, dtype=np.float32).reshape(-1, 32000)[:GOLDEN_TOKENS]
    out = tmp_path / "emulated.f32"
    r = emulated(cpu, [bin_path("spillway-run"), "-m", model, "--tokens", ",".join(map(str, ids)),
                       "--logits-out", out, "-t", 1])
    assert r.returncode == 0, r.stderr
    assert f"isa {CPUS[cpu][0]}," in r.stderr, r.stderr
    got = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)
    cos = cosines(got, ref)
    host, _ = logits_for(model, ids, tmp_path / "host.f32", isa=CPUS[cpu][0])
    diff, scale = float(np.abs(got - host).max()), float(np.abs(host).max())
    print(f"{cpu} golden/{GOLDEN}: min cosine {cos.min():.6f} against llama.cpp; max |diff| {diff:.3g} "
          f"against the host's forced path (logit scale {scale:.3g})")
    assert cos.min() >= 0.999 and (got.argmax(1) == ref.argmax(1)).mean() >= 0.9
    assert diff <= 1e-3 * scale


def test_bench_kernels_quick(cpu):
    """`spillway-bench --kernels --quick` reports what such a host has (the
    check of the plain --kernels test, kernelreport.check_kernels_report):
    every packed type on AVX2, none of them on the int8 form; on the
    scalar path no packed kernels at all."""
    r = emulated(cpu, [bin_path("spillway-bench"), "--kernels", "--quick", "-t", 2, "--mem-mib", 16])
    if CPUS[cpu][0] == "scalar":
        assert r.returncode == 1 and "no packed kernels to time" in r.stderr, (r.returncode, r.stderr)
        return
    assert r.returncode == 0, r.stderr
    j = check_kernels_report(r.stdout, r.stderr, threads=2)
    assert j["isa"] == "avx2" and j["quick"] and j["i8_min_tokens"] == 0, j
    assert "int8" not in {k["form"] for k in j["kernels"]}, j
