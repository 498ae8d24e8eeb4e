"""Runs every C unit-test program (tests/unit/test_*.c) as a pytest case.

Each program exits 0 when all its checks pass, 77 to report that its data is
missing (skipped), anything else on failure; its output is shown on failure.
"""
import os
import subprocess

import pytest

from conftest import BUILD, SHARED, ROOT

UNIT_DIR = ROOT / "tests" / "unit"
PROGRAMS = sorted(p.stem for p in UNIT_DIR.glob("test_*.c"))


@pytest.mark.parametrize("name", PROGRAMS)
def test_unit_program(name):
    exe = BUILD / "tests" / "unit" / name
    assert exe.exists(), f"{exe} not built"
    env = dict(os.environ, SPILLWAY_SHARED=str(SHARED))
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    if r.returncode == 77:
        pytest.skip(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "data missing")
    assert r.returncode == 0, f"{name} failed (rc={r.returncode})\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
