"""Prefix-affinity routing, with a real gateway and three test-mode workers in
one pool: requests whose prompts open the same way (the turns of one chat, a
shared long system prompt) go to the same worker while it has a free slot, so
that they meet its prefix cache; other prompts spread over the pool; a full
worker is not waited for.
"""
import concurrent.futures as cf
import json

import pytest

from conftest import http_post

POLICY = """\
pools:
  - name: cpu-pool
    kind: cpu
routes:
  - model: "echo"
    target: cpu-pool
"""


@pytest.fixture
def pool3(cluster):
    cluster.start_gateway(POLICY)
    for i in range(3):
        cluster.start_echo("cpu-pool", 20, ["--parallel", "2", "--worker-id", f"w{i}"], name=f"echo{i}")
    cluster.wait_workers(3)
    return cluster


def chat(cluster, messages, max_tokens=2):
    st, hdr, body = http_post(cluster.base + "/v1/chat/completions",
                              {"model": "echo", "messages": messages, "max_tokens": max_tokens})
    assert st == 200, body
    return hdr["X-Spillway-Worker"]


def test_a_conversation_stays_on_one_worker(pool3):
    messages = [{"role": "system", "content": "You answer in one line."},
                {"role": "user", "content": "Name a river."}]
    served = []
    for turn in range(8):
        served.append(chat(pool3, messages))
        messages = messages + [{"role": "assistant", "content": f" tok1 tok2 {turn}"},
                               {"role": "user", "content": f"And another one ({turn})?"}]
    assert len(set(served)) == 1, served


def test_different_prompts_spread_over_the_pool(pool3):
    served = [chat(pool3, [{"role": "user", "content": f"Question number {i}: why?"}]) for i in range(30)]
    counts = {w: served.count(w) for w in set(served)}
    assert len(counts) == 3, counts      # each worker wins some keys
    assert max(counts.values()) <= 20, counts


def test_a_full_worker_is_not_waited_for(pool3):
    """Four long requests of one conversation at once: the worker it hashes
    to takes two (its slots), and the other two go to workers with a free
    slot, never to the full one."""
    messages = [{"role": "system", "content": "Long answers. " * 50}, {"role": "user", "content": "Go."}]
    with cf.ThreadPoolExecutor(4) as ex:
        served = list(ex.map(lambda _: chat(pool3, messages, max_tokens=30), range(4)))
    counts = sorted((served.count(w) for w in set(served)), reverse=True)
    assert counts[0] == 2 and len(counts) >= 2, served
