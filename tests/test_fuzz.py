"""Runs every fuzz program (tests/fuzz/fuzz_*.c, built to $BUILD/tests/fuzz/).

Each is a deterministic mutation fuzzer with a main(): it exits 0 when no
input crashed it and no invariant broke. SPILLWAY_FUZZ_SECONDS bounds the run
time, so a sanitizer build (much slower) still finishes in time.
"""
import os
import subprocess

import pytest

from conftest import BUILD, ROOT

FUZZ_DIR = ROOT / "tests" / "fuzz"
PROGRAMS = sorted(p.stem for p in FUZZ_DIR.glob("fuzz_*.c"))
SECONDS = 20


@pytest.mark.parametrize("name", PROGRAMS)
def test_fuzz_program(name):
    exe = BUILD / "tests" / "fuzz" / name
    assert exe.exists(), f"{exe} not built"
    env = dict(os.environ, SPILLWAY_FUZZ_SECONDS=str(SECONDS))
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=SECONDS + 40,
                       env=env, cwd=ROOT)
    assert r.returncode == 0, f"{name} failed (rc={r.returncode})\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}"
