"""Embeddings through the C SDK (spillway_embed, sdk/examples/embed.c) and
the CLI's `spillway embed`, against the HTTP API's /v1/embeddings on the
same cluster (tests/test_embeddings.py's synthetic embedding models).

What is checked: the vectors of texts and of token ids are the HTTP API's,
float for float, and numpy's reference; the CLI prints /v1/embeddings'
JSON, from arguments or from stdin's lines; usage counts the tokens as
HTTP's does; the gateway's refusals (a generation model, an unknown model,
an input past the context) come back with their status and message; bad
arguments (no model, an empty line, more than SW_MAX_EMBED_INPUTS inputs)
are refused by the SDK or CLI before anything is sent. The SDK's argument
checks one by one are tests/unit/test_sdk_args.c's."""
import json
import subprocess

import numpy as np

from conftest import bin_path, build_sdk_example, http_post
from test_embeddings import CLS, MEAN, TEXT, TEXT2, close, gw, reference, weights  # noqa: F401 (fixtures)
from test_limits import L


def cli(*args, stdin=None, timeout=60):
    return subprocess.run([bin_path("spillway"), *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def http_embed(gw, model, inputs):
    st, _, raw = http_post(gw.base + "/v1/embeddings", dict(model=model, input=inputs))
    assert st == 200, raw
    return json.loads(raw)


def vectors(doc):
    return [np.asarray(d["embedding"], dtype=np.float32) for d in sorted(doc["data"], key=lambda d: d["index"])]


def test_cli_embed_prints_the_http_apis_vectors(gw):
    want = http_embed(gw, "emb-mean", [TEXT, TEXT2])
    r = cli("embed", "-e", gw.sdk_ep, "-m", "emb-mean", TEXT, TEXT2)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["object"] == "list" and got["model"] == "emb-mean"
    assert [d["index"] for d in got["data"]] == [0, 1] and all(d["object"] == "embedding" for d in got["data"])
    for g, w in zip(vectors(got), vectors(want)):
        assert g.shape == (gw.hp["E"],) and np.array_equal(g, w)
    close(vectors(got)[0], reference(gw, gw.ids[TEXT], MEAN))
    close(vectors(got)[1], reference(gw, gw.ids[TEXT2], MEAN))
    assert got["usage"] == {"prompt_tokens": want["usage"]["prompt_tokens"],
                            "total_tokens": want["usage"]["total_tokens"]}
    assert got["usage"]["prompt_tokens"] == len(gw.ids[TEXT]) + len(gw.ids[TEXT2])
    assert f"embeddings=2 dim={gw.hp['E']}" in r.stderr and "pool=cpu-pool" in r.stderr, r.stderr
    # one input a line of stdin: the same answer
    r2 = cli("embed", "-e", gw.sdk_ep, "-m", "emb-mean", stdin=f"{TEXT}\r\n{TEXT2}\n")
    assert r2.returncode == 0, r2.stderr
    assert json.loads(r2.stdout) == got


def test_sdk_embeds_texts_and_token_ids(gw, tmp_path):
    exe = build_sdk_example("embed", tmp_path)
    ids = [5, 300, 17, 42, 8]
    r = subprocess.run([str(exe), gw.sdk_ep, "emb-cls", TEXT, "[5,300,17,42,8]"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    want = http_embed(gw, "emb-cls", [TEXT])["data"][0]["embedding"], http_embed(gw, "emb-cls", [ids])
    lines = r.stdout.splitlines()
    assert lines[0] == f"dim={gw.hp['E']} count=2 prompt_tokens={len(gw.ids[TEXT]) + len(ids)} pool=cpu-pool"
    assert lines[1].startswith(f"vector 0 tokens={len(gw.ids[TEXT])}:") and lines[2].startswith("vector 1 tokens=5:")
    got = [np.array(line.split(":")[1].split(), dtype=np.float32) for line in lines[1:3]]
    # each input is computed on its own (pooled per input): one alone over HTTP is the same vector
    assert np.array_equal(got[0], np.asarray(want[0], dtype=np.float32))
    assert np.array_equal(got[1], vectors(want[1])[0])
    close(got[1], reference(gw, ids, CLS))
    cos = float(lines[3].split("=")[1])
    assert lines[3].startswith("cosine(0, 1)=") and abs(cos - float(got[0] @ got[1])) < 1e-5


def test_refusals_come_back_with_the_gateways_message(gw):
    r = cli("embed", "-e", gw.sdk_ep, "-m", "gen", "hello")
    assert r.returncode == 1 and "gateway error 400" in r.stderr and "not an embedding model" in r.stderr, r.stderr
    assert r.stdout == ""
    r = cli("embed", "-e", gw.sdk_ep, "-m", "nope", "hello")
    assert r.returncode == 1 and "gateway error 404" in r.stderr and "'nope' does not exist" in r.stderr, r.stderr
    r = cli("embed", "-e", gw.sdk_ep, "-m", "emb-mean", "a", "x" * 2000)   # past the context: the worker counts it
    assert r.returncode == 1 and "gateway error 400" in r.stderr and "context" in r.stderr, r.stderr
    # generation from an embedding model: the gateway refuses it (its words, not the worker's), as over HTTP
    for args in (("complete", "hello"), ("complete", "--prompt", "a", "--prompt", "b"), ("chat", "hello")):
        r = cli(args[0], "-e", gw.sdk_ep, "-m", "emb-mean", "-n", "2", *args[1:])
        assert r.returncode == 1 and "gateway error 400" in r.stderr and "is an embedding model: use /v1/embeddings" in r.stderr, (args, r.stderr)


def test_bad_arguments_are_refused_before_sending(gw):
    ep = ["-e", gw.sdk_ep]
    r = cli("embed", *ep, "hello")
    assert r.returncode == 2 and "needs -m MODEL" in r.stderr, r.stderr
    r = cli("embed", *ep, "-m", "emb-mean", stdin="a\n\nb\n")
    assert r.returncode == 2 and "line 2 is empty" in r.stderr, r.stderr
    r = cli("embed", *ep, "-m", "emb-mean", "a", "")
    assert r.returncode == 1 and "inputs[1] is empty" in r.stderr, r.stderr
    n = L["SW_MAX_EMBED_INPUTS"]
    r = cli("embed", *ep, "-m", "emb-mean", stdin="a\n" * (n + 1))
    assert r.returncode == 1 and f"1 to SW_MAX_EMBED_INPUTS ({n}) inputs, not {n + 1}" in r.stderr, r.stderr
    r = cli("embed", *ep, "-m", "emb-mean", stdin="a\n" * n)   # at the limit: served
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["data"]) == n


def test_a_request_the_wire_refuses_is_answered_with_why(gw):
    """A frame that decodes but fails the wire's checks, from a client that
    named its request, gets a 400 saying what is wrong (not silence until
    the client's timeout)."""
    from test_embeddings import EMBED, ERROR, sdk_exchange
    from test_worker_protocol import envelope, f_bytes, generate, one, parse
    bad = [envelope(EMBED, f_bytes(1, "sdk-7") + f_bytes(2, "emb-mean") + f_bytes(3, f_bytes(1, b"caf\xe9"))),
           generate("sdk-7", model="emb mean")]
    for env, words in zip(sdk_exchange(gw, bad, timeout_ms=10000), (b"not valid UTF-8", b"has a space")):
        e = parse(env[ERROR][0])
        assert one(e, 1) == b"sdk-7" and one(e, 2) == 400 and words in one(e, 3), e
