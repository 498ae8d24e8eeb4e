"""What the programs say this CPU has, and what follows from it.

`spillway-bench --cpu` prints the ISA in use, the best this CPU has and the
CPU features the choice was made from (as cpuid reports them to the
program); `spillway-bench --kernels` prints the same beside its timings.
Tests ask the program rather than read /proc/cpuinfo: that file is the
host's own under an emulator (qemu-x86_64 -cpu ...), and it can list what
the OS has turned off.
"""
import json
import os
import subprocess

KERNEL_TYPES = ("q4_K", "q5_K", "q6_K", "q8_0", "q5_0", "q4_0", "mxfp4")


def features(rep):
    return set(rep["cpu"].split())


def expected_best(rep):
    """The ISA the dispatch must pick from these features (kernels.c)."""
    cpu = features(rep)
    if not {"avx2", "fma", "f16c"} <= cpu:
        return "scalar"
    return "avx512" if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= cpu else "avx2"


def int8_form_expected(rep):
    """Whether the ISA in use has the int8 form on this CPU: AVX-512 VNNI,
    or AVX-VNNI (vpdpbusd on ymm) on the AVX2 path."""
    cpu = features(rep)
    return (rep["isa"] == "avx512" and "avx512vnni" in cpu) or (rep["isa"] == "avx2" and "avxvnni" in cpu)


# What moves the int8 form's threshold and the one-token prefetch off the
# CPU's defaults (kernels.c), which the checks here expect.
DEFAULT_OVERRIDES = ("SPILLWAY_I8_MIN_TOKENS", "SPILLWAY_PREFETCH_1TOK")


def env_defaults(drop=DEFAULT_OVERRIDES):
    """Our environment without the variables in drop."""
    return {k: v for k, v in os.environ.items() if k not in drop}


def cpu_report(bench, prefix=(), env=None):
    """`spillway-bench --cpu`'s JSON, run under prefix (an emulator's
    command line, or nothing) with env (default: env_defaults(), so the
    threshold and the prefetch choice are the CPU's)."""
    if env is None:
        env = env_defaults()
    r = subprocess.run([*prefix, bench, "--cpu"], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    rep["stderr"] = r.stderr
    return rep


def check_kernels_report(stdout, stderr, threads):
    """Checks `spillway-bench --kernels` output (run with env_defaults())
    against what the same run says this CPU has: exactly the kernels that
    ISA has there, each timed, on the int8 form exactly where the CPU has
    its instruction. Returns the JSON line."""
    j = json.loads(stdout.strip().splitlines()[-1])
    got = {(k["type"], k["weights"], k["tokens"]) for k in j["kernels"]}
    unpacked = set(j["unpacked"])
    assert unpacked <= set(KERNEL_TYPES), unpacked
    for t in unpacked:
        assert f"no packed {t} here" in stderr
    assert j["best"] == expected_best(j), j
    vnni = int8_form_expected(j)
    assert (j["i8_min_tokens"] > 0) == vnni, (j["isa"], j["cpu"], j["i8_min_tokens"])
    if vnni and j["isa"] == "avx512":
        assert not unpacked
    have = [t for t in KERNEL_TYPES if t not in unpacked]
    assert got == {(t, w, n) for t in have for w in ("cache", "stream") for n in (1, 8)} | \
        {(t, "cache", 128) for t in have}, got
    i8 = j["i8_min_tokens"]
    forms = {}
    for k in j["kernels"]:
        assert k["gb_per_s"] > 0 and k["gmac_per_s"] > 0, k
        forms.setdefault((k["type"], k["weights"], k["tokens"]), []).append(k["form"])
    for (t, w, n), f in forms.items():
        on_i8 = i8 > 0 and n >= i8 and t.endswith("_K")
        # Q4_K at one token: without and with its software prefetch (sw_prefetch_one_token)
        want = ["no-pf", "pf"] if (t, n) == ("q4_K", 1) else ["int8" if on_i8 else "packed"]
        assert f == want, (t, w, n, f)
    assert j["mem_read_gb_per_s"] > 0 and j["threads"] == threads
    return j
