"""The routing policy as the gateway binary sees it.

`spillway-gateway --config FILE --check` validates a policy and exits (0: OK,
1: errors as file:line:column); started for real on a bad policy, the gateway
must refuse to run and say why, in the same words. Real files, real processes.
"""
import subprocess

import pytest

from conftest import ROOT, bin_path, free_port

# The seed example of issue 2, verbatim: it must load unchanged.
SEED = """\
routes:
  - model: "llama-3-70b"
    quantization: "fp8"
    target: "gpu-pool"
    max_concurrency: 100
  - model: "llama-3-70b"
    quantization: "q4_k_m"
    target: "cpu-pool"
    max_concurrency: 500
    priority: "overflow"
  - model: "llama-3-405b"
    quantization: "int4"
    target: "cpu-pool-large"
    max_concurrency: 20
"""

# The seed with line 5 broken: "    max_concurrency: " is 21 characters.
BAD_LINE5 = SEED.replace("max_concurrency: 100", "max_concurrency: -3")

# Three mistakes at once: all of them must be reported together.
MANY_ERRORS = """\
routes:
  - model: a
    target: gpu-pool
    max_concurrency: 1.5
  - model: a
    target: cpu-pool
    priority: overflw
defaults:
  queue_lenght: 5
"""


def check(path):
    return subprocess.run([bin_path("spillway-gateway"), "--config", str(path), "--check"],
                          capture_output=True, text=True, timeout=30)


def test_seed_checks_ok(tmp_path):
    cfg = tmp_path / "seed.yaml"
    cfg.write_text(SEED)
    r = check(cfg)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "OK"


@pytest.mark.parametrize("rel", ["routes.yaml", "docs/examples/seed-routes.yaml"])
def test_repository_policies_check_ok(rel):
    r = check(ROOT / rel)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "OK"


def test_error_has_file_line_column(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(BAD_LINE5)
    r = check(cfg)
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert f"{cfg}:5:22: max_concurrency must not be negative" in out, out
    assert "OK" not in r.stdout


def test_all_errors_reported_together(tmp_path):
    cfg = tmp_path / "many.yaml"
    cfg.write_text(MANY_ERRORS)
    r = check(cfg)
    assert r.returncode == 1
    out = r.stdout + r.stderr
    assert f"{cfg}:4:22: max_concurrency must be a whole number" in out, out
    assert f"{cfg}:7:15: priority must be one of primary|overflow" in out, out
    assert "did you mean 'overflow'?" in out, out
    assert f"{cfg}:9:3: unknown key 'queue_lenght' in defaults (did you mean 'queue_length'?)" in out, out


def test_syntax_error_and_unreadable(tmp_path):
    cfg = tmp_path / "syntax.yaml"
    cfg.write_text("routes:\n  - model: x\n    target: [a\n")
    r = check(cfg)
    assert r.returncode == 1
    assert f"{cfg}:4:1: YAML syntax error" in r.stdout + r.stderr, r.stdout + r.stderr

    missing = tmp_path / "missing.yaml"
    r = check(missing)
    assert r.returncode == 1
    assert f"{missing}: cannot read: No such file or directory" in r.stdout + r.stderr


def test_gateway_refuses_to_start_on_bad_policy(tmp_path):
    cfg = tmp_path / "routes.yaml"
    cfg.write_text(BAD_LINE5)
    args = [bin_path("spillway-gateway"), "--config", str(cfg),
            "--http", f"127.0.0.1:{free_port()}", "--workers", f"tcp://127.0.0.1:{free_port()}"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"gateway kept running on an invalid policy:\n{out}\n{err}")
    assert p.returncode != 0, out + err
    assert f"{cfg}:5:22: max_concurrency must not be negative" in out + err, out + err
