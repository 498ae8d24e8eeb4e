"""Embeddings take the routes and overflow that generation takes: a route
names an embedding model, and its requests spill to the overflow pool by
capacity, when an operator forces the route over, and when the primary
pool is cordoned, each counted by reason. Two CPU pools, each with a real
CPU worker serving the same embedding file (tests/archmodels.py's tiny
llama with a mean pooling type), so both give the same vectors."""
import concurrent.futures as cf
import json

import numpy as np
import pytest

import archmodels as am
from conftest import http_post
from test_gateway_overflow import metric
from test_ops import ops

POLICY = """\
pools:
  - name: cpu-a
    kind: cpu
  - name: cpu-b
    kind: cpu
routes:
  - model: emb
    target: cpu-a
    max_concurrency: 1
  - model: emb
    target: cpu-b
    priority: overflow
"""
INPUTS = [f"the cat number {i} sat on the mat and looked at the door" for i in range(48)]


@pytest.fixture
def gw(cluster, tmp_path):
    hp, w = am.make_weights("llama", seed=3)
    path = tmp_path / "emb.gguf"
    am.write_model(path, "llama", hp, w, extra_kv={"llama.pooling_type": 1})
    cluster.start_gateway(POLICY)
    for pool in ("cpu-a", "cpu-b"):
        cluster.start_worker(pool, "emb", path, ["--threads", "1", "--parallel", "2"], name=pool)
    cluster.wait_workers(2)
    return cluster


def embed(gw, inputs=INPUTS[:2]):
    st, h, body = http_post(gw.base + "/v1/embeddings", {"model": "emb", "input": inputs}, timeout=120)[:3]
    r = json.loads(body)
    assert st == 200, r
    return h["X-Spillway-Pool"], np.array([d["embedding"] for d in r["data"]])


def spills(gw, reason):
    return metric(gw, "spillway_overflow_total", from_pool="cpu-a", to_pool="cpu-b", reason=reason)


def test_the_primary_pool_serves_and_both_give_the_same_vectors(gw):
    pool, va = embed(gw)
    assert pool == "cpu-a"
    ops(gw, "force-overflow", "emb@cpu-a", "on", "--reason", "test")
    pool, vb = embed(gw)
    assert pool == "cpu-b"
    assert np.abs(va - vb).max() < 1e-6


def test_embeddings_spill_by_capacity(gw):
    """max_concurrency 1 on the primary route: of 8 batches sent at once,
    one holds cpu-a and the others spill to cpu-b, none refused."""
    with cf.ThreadPoolExecutor(8) as ex:
        pools = [p for p, _ in ex.map(lambda _: embed(gw, INPUTS), range(8))]
    assert "cpu-a" in pools and "cpu-b" in pools, pools
    assert spills(gw, "saturated") == pools.count("cpu-b")


def test_forced_overflow_and_cordon_move_embeddings(gw):
    ops(gw, "force-overflow", "emb@cpu-a", "on", "--reason", "maintenance")
    assert [embed(gw)[0] for _ in range(3)] == ["cpu-b"] * 3
    assert spills(gw, "forced") == 3
    ops(gw, "force-overflow", "emb@cpu-a", "off")
    assert embed(gw)[0] == "cpu-a"
    ops(gw, "cordon", "cpu-a", "--reason", "rack move")
    assert [embed(gw)[0] for _ in range(2)] == ["cpu-b"] * 2
    assert spills(gw, "cordoned") == 2
    ops(gw, "uncordon", "cpu-a")
    assert embed(gw)[0] == "cpu-a"
