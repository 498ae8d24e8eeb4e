"""The admin API's own token (--admin-token-file, docs/security.md "Admin
token"): off (403) without one, 401 without or with a wrong bearer, 200 with
it; /metrics and /healthz stay open; /admin/policy shows no secret, raw
source included; a token file others may read is refused at startup."""
import json
import os
import subprocess
import urllib.request

from conftest import TWO_POOLS, bin_path, http_get, http_post, write_admin_token

ADMIN = [("GET", "/admin/workers"), ("GET", "/admin/status"), ("GET", "/admin/policy"),
         ("POST", "/admin/reload")]
# API keys in each way YAML can hold them: a flow list, a block list, a
# quoted key and an anchor used again through an alias.
KEYS = ["sk-flow-0123456789abcdef", "sk-block-a-0123456789", "sk-block-b-0123456789",
        "sk-anchor-0123456789abc"]
SECRET_POLICY = TWO_POOLS + f"""\
routes:
  - model: "echo"
    target: gpu-pool
    match:
      api_keys: ["{KEYS[0]}"]
  - model: "echo"
    target: cpu-pool
    match:
      "api_keys":
      - {KEYS[1]}
      - "{KEYS[2]}"
  - model: "echo"
    target: gpu-pool
    match: {{class: batch, api_keys: [&k {KEYS[3]}]}}
  - model: "echo"
    target: cpu-pool
    match: {{class: interactive, api_keys: [*k]}}
"""
PLAIN_POLICY = TWO_POOLS + 'routes:\n  - model: "echo"\n    target: gpu-pool\n'


def call(base, method, path, headers=None):
    """(status, headers, body) of one request, errors included."""
    if method == "POST":
        return http_post(base + path, b"", headers=headers, timeout=10)
    req = urllib.request.Request(base + path, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_no_token_configured_is_403_saying_how(cluster):
    cluster.start_gateway(PLAIN_POLICY, admin_token=False)
    for method, path in ADMIN:
        st, _, body = call(cluster.base, method, path, cluster.admin_headers)
        assert st == 403, (path, body)
        err = json.loads(body)["error"]
        assert err["code"] == "admin_disabled" and err["type"] == "permission_error"
        assert "--admin-token-file" in err["message"] and "docs/security.md" in err["message"]
    assert http_get(cluster.base + "/healthz")[0] == 200
    assert http_get(cluster.base + "/metrics")[0] == 200


def test_missing_or_wrong_token_is_401_right_one_200(cluster):
    cluster.start_gateway(PLAIN_POLICY)
    token = cluster.admin_headers["Authorization"][len("Bearer "):]
    wrong = [None, {"Authorization": "Bearer nope"}, {"Authorization": f"Bearer {token}x"},
             {"Authorization": f"Bearer {token[:-1]}"}, {"Authorization": f"Basic {token}"},
             {"Authorization": token}]
    for method, path in ADMIN:
        for h in wrong:
            st, hdrs, body = call(cluster.base, method, path, h)
            assert st == 401, (path, h, body)
            assert hdrs.get("WWW-Authenticate", "").startswith("Bearer"), hdrs
            err = json.loads(body)["error"]
            assert err["code"] == ("missing_admin_token" if h is None else "invalid_admin_token")
        st, _, body = call(cluster.base, method, path, cluster.admin_headers)
        assert st == 200, (path, body)
    # The open endpoints need nothing, and a client's API key is no admin token.
    assert http_get(cluster.base + "/healthz")[0] == 200
    assert http_get(cluster.base + "/metrics")[0] == 200
    assert http_get(cluster.base + "/v1/models")[0] == 200
    st, _, _ = call(cluster.base, "GET", "/admin/status", {"Authorization": "Bearer sk-client-key"})
    assert st == 401


def test_policy_shows_no_secret_anywhere(cluster):
    cluster.start_gateway(SECRET_POLICY)
    st, body = cluster.admin_get("/admin/policy")
    assert st == 200
    text = body.decode()
    for k in KEYS:
        assert k not in text, k
        assert k[8:] not in text, k           # not even most of it
    src = json.loads(body)["source"]
    assert "<redacted>" in src and "gpu-pool" in src and "cpu-pool" in src


def test_token_file_refused_at_startup(cluster, tmp_path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text(PLAIN_POLICY)

    def start(token_file):
        return subprocess.run([bin_path("spillway-gateway"), "--config", str(cfg), "--http", "127.0.0.1:0",
                               "--sdk", "none", "--admin-token-file", str(token_file)],
                              capture_output=True, text=True, timeout=20)

    loose = tmp_path / "loose.token"
    write_admin_token(loose)
    os.chmod(loose, 0o640)
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    os.chmod(empty, 0o600)
    for path, why in [(loose, "group or others may read it"), (empty, "empty"),
                      (tmp_path / "absent.token", "No such file")]:
        r = start(path)
        assert r.returncode == 2, r.stderr
        assert "refusing to start" in r.stderr and "--admin-token-file" in r.stderr, r.stderr
        assert why in r.stderr, r.stderr
