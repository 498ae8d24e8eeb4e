"""The native SDK (libspillway) and the `spillway` CLI against a real gateway.

Workers run in the clearly named test mode (--test-echo), so these tests are
about the SDK path through the gateway: routing, streaming, status, errors.
"""
import json
import subprocess

import pytest

from conftest import bin_path, build_sdk_example, free_port, wait_until

POLICY = """
routes:
  - model: "echo"
    target: "gpu-pool"
    max_concurrency: 8
"""


@pytest.fixture
def sdk_cluster(cluster, tmp_path):
    sdk_port = free_port()
    cluster.sdk_ep = f"tcp://127.0.0.1:{sdk_port}"
    cluster.start_gateway(POLICY, extra_args=["--sdk", f"tcp://127.0.0.1:{sdk_port}"])
    model = tmp_path / "echo.gguf"
    model.write_bytes(b"")
    cluster.start_echo("gpu-pool", 2000, ["--quantization", "fp8"], model_path=model, name="worker")
    cluster.wait_model("echo")
    return cluster


def run_cli(*args, timeout=30):
    return subprocess.run([bin_path("spillway"), *args], capture_output=True, text=True, timeout=timeout)


def test_cli_complete_streams_and_reports_who_served(sdk_cluster):
    r = run_cli("complete", "-e", sdk_cluster.sdk_ep, "-m", "echo", "-n", "5", "hello there")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() != ""
    assert "finish=length" in r.stderr
    assert "completion_tokens=5" in r.stderr
    assert "pool=gpu-pool" in r.stderr


def test_cli_chat(sdk_cluster):
    r = run_cli("chat", "-e", sdk_cluster.sdk_ep, "-m", "echo", "--system", "be brief", "-n", "3", "hi")
    assert r.returncode == 0, r.stderr
    assert "completion_tokens=3" in r.stderr


def test_cli_status_lists_the_worker(sdk_cluster):
    r = run_cli("status", "-e", sdk_cluster.sdk_ep, "--admin-token-file", str(sdk_cluster.admin_token_file))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    text = json.dumps(doc)
    assert "gpu-pool" in text and "echo" in text


def test_status_over_the_sdk_link_needs_the_admin_token(sdk_cluster, tmp_path):
    """The status is the admin API's, over the SDK link as over HTTP: a
    wrong token is refused (401), and so is an empty one."""
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-the-token\n")
    r = run_cli("status", "-e", sdk_cluster.sdk_ep, "--admin-token-file", str(wrong))
    assert r.returncode == 1 and "refused (401)" in r.stderr and "wrong admin token" in r.stderr, r.stderr
    assert "gpu-pool" not in r.stdout
    r = run_cli("status", "-e", sdk_cluster.sdk_ep, "--admin-token-file", str(tmp_path / "absent"))
    assert r.returncode == 1 and "cannot read the admin token file" in r.stderr, r.stderr


def test_status_is_refused_by_a_gateway_without_an_admin_token(cluster, tmp_path):
    sdk_ep = f"tcp://127.0.0.1:{free_port()}"
    cluster.start_gateway(POLICY, extra_args=["--sdk", sdk_ep], admin_token=False)
    r = run_cli("status", "-e", sdk_ep, "--admin-token-file", str(cluster.admin_token_file))
    assert r.returncode == 1 and "refused (403)" in r.stderr and "--admin-token-file" in r.stderr, r.stderr


def test_cli_unknown_model_is_an_error(sdk_cluster):
    r = run_cli("complete", "-e", sdk_cluster.sdk_ep, "-m", "no-such-model", "hi")
    assert r.returncode == 1
    assert "404" in r.stderr


def test_cli_rejects_bad_flags():
    r = run_cli("complete", "-m", "x", "-n", "many", "hi")
    assert r.returncode == 2 and "-n" in r.stderr
    r = run_cli("frobnicate")
    assert r.returncode == 2


def test_example_program_compiles_and_runs(sdk_cluster, tmp_path):
    exe = build_sdk_example("hello", tmp_path)
    r = subprocess.run([str(exe), sdk_cluster.sdk_ep, "echo"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "blocking: [" in r.stdout and "finish=length tokens=16 pool=gpu-pool" in r.stdout
    assert "chunks=16" in r.stdout
