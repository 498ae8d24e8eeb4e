"""Batched prompts through the C SDK (spillway_complete_batch,
sdk/examples/batch.c) and the CLI (`spillway complete --prompt ... |
--prompts-file`), against the HTTP API's batched /v1/completions on the
same cluster (stories260K on the CPU worker, tests/test_choices.py's).

The gateway makes the SDK's batch with the code HTTP's goes through
(gateway/choices.c), so what is checked is that they agree: the same
seeds give the same texts, indexed prompt * n + sample; usage counts each
prompt once; token-id prompts too; and a bad batch (past SW_MAX_CHOICES
prompts or choices, an empty prompt, a batch with a PROMPT argument or on
chat) is refused with a message saying so, before anything is sent."""
import json
import re
import subprocess

from conftest import bin_path, build_sdk_example, http_post
from test_choices import gw  # noqa: F401 (the fixture)
from test_limits import L

MAXC = L["SW_MAX_CHOICES"]
PROMPTS = ["Once upon a time", "The little dog", "Lily saw"]


def cli(*args, stdin=None, timeout=60):
    return subprocess.run([bin_path("spillway"), *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)


def http_batch(gw, prompts, n, max_tokens, seed=5):
    body = dict(model="s", prompt=prompts, n=n, max_tokens=max_tokens, temperature=1, seed=seed)
    st, _, raw = http_post(gw.base + "/v1/completions", body)
    assert st == 200, raw
    return json.loads(raw)


def choices(stdout):
    return [(int(i), t) for i, t in re.findall(r"^\[choice (\d+)\] (.*)$", stdout, re.M)]


def test_cli_batch_is_the_http_batch(gw, tmp_path):
    want = http_batch(gw, PROMPTS, 2, 8)
    assert [c["index"] for c in want["choices"]] == list(range(6))
    args = ["complete", "-e", gw.sdk_ep, "-m", "s", "-n", "8", "--temp", "1", "--seed", "5", "--choices", "2"]
    r = cli(*args, *sum((["--prompt", p] for p in PROMPTS), []))
    assert r.returncode == 0, r.stderr
    assert choices(r.stdout) == [(c["index"], c["text"]) for c in want["choices"]], r.stdout
    assert len({t for _, t in choices(r.stdout)}) > 1, "the samples were all the same"
    u = want["usage"]
    assert (f"[usage prompt_tokens={u['prompt_tokens']} cached_tokens=" in r.stderr and
            f"completion_tokens={u['completion_tokens']} total_tokens={u['total_tokens']}]" in r.stderr), r.stderr
    # each prompt counted once: the HTTP answer's prompt tokens are the three prompts' alone
    alone = [http_batch(gw, p, 1, 1)["usage"]["prompt_tokens"] for p in PROMPTS]
    assert u["prompt_tokens"] == sum(alone)
    assert r.stderr.count("finish=length") == 6
    # the same prompts from a file, and from stdin
    f = tmp_path / "prompts.txt"
    f.write_text("\n".join(PROMPTS) + "\n")
    r2 = cli(*args, "--prompts-file", str(f))
    assert r2.returncode == 0 and choices(r2.stdout) == choices(r.stdout), r2.stderr
    r3 = cli(*args, "--prompts-file", "-", stdin="\r\n".join(PROMPTS))
    assert r3.returncode == 0 and choices(r3.stdout) == choices(r.stdout), r3.stderr


def test_one_sample_a_prompt_is_indexed_by_prompt(gw):
    want = http_batch(gw, PROMPTS, 1, 6, seed=11)
    r = cli("complete", "-e", gw.sdk_ep, "-m", "s", "-n", "6", "--temp", "1", "--seed", "11",
            *sum((["--prompt", p] for p in PROMPTS), []))
    assert r.returncode == 0, r.stderr
    assert choices(r.stdout) == [(c["index"], c["text"]) for c in want["choices"]], r.stdout


def test_sdk_batch_of_token_ids_streams_each_choice(gw, tmp_path):
    """sdk/examples/batch.c: token-id prompts, each choice's deltas (told
    apart by index) adding up to its result, and the usage."""
    ids = [[1, 403, 261, 350, 299, 263], [1, 378, 292, 265]]
    exe = build_sdk_example("batch", tmp_path)
    r = subprocess.run([str(exe), gw.sdk_ep, "s", "2", *("[" + ",".join(map(str, p)) + "]" for p in ids)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    want = http_batch(gw, ids, 2, 8)
    got = re.findall(r"^choice (\d+): \[(.*)\] finish=(\w+) prompt_tokens=(\d+) completion_tokens=(\d+) "
                     r"streamed=1$", r.stdout, re.M)
    assert [(int(i), t) for i, t, *_ in got] == [(c["index"], c["text"]) for c in want["choices"]], r.stdout
    assert [int(p) for _, _, _, p, _ in got] == [len(ids[0])] * 2 + [len(ids[1])] * 2
    u = want["usage"]
    assert f"usage prompt_tokens={u['prompt_tokens']} completion_tokens={u['completion_tokens']}\n" in r.stdout
    assert u["prompt_tokens"] == len(ids[0]) + len(ids[1])


def test_bad_batches_are_refused_saying_why(gw, tmp_path):
    base = ["complete", "-e", gw.sdk_ep, "-m", "s", "-n", "2"]
    r = cli(*base, "--prompts-file", "-", stdin="a\n" * (MAXC + 1))
    assert r.returncode == 1 and f"a batch of {MAXC + 1} prompts, more than SW_MAX_CHOICES ({MAXC})" in r.stderr, r.stderr
    assert "[choice" not in r.stdout
    k = MAXC // 2 + 1
    r = cli(*base, "--choices", str(k), "--prompt", "a", "--prompt", "b")
    assert r.returncode == 1 and f"{2 * k} choices (prompts times n), more than SW_MAX_CHOICES" in r.stderr, r.stderr
    r = cli(*base, "--prompt", "a", "--prompt", "")
    assert r.returncode == 1 and "prompts[1] is empty" in r.stderr, r.stderr
    r = cli(*base, "--prompts-file", "-", stdin="a\n\nb\n")
    assert r.returncode == 2 and "line 2 is empty" in r.stderr, r.stderr
    r = cli(*base, "--prompts-file", str(tmp_path / "absent"))
    assert r.returncode == 2 and "cannot read" in r.stderr, r.stderr
    r = cli(*base, "--prompt", "a", "also a PROMPT")
    assert r.returncode == 2 and "no PROMPT argument" in r.stderr, r.stderr
    r = cli("chat", "-e", gw.sdk_ep, "-m", "s", "--prompt", "a", "hi")
    assert r.returncode == 2 and "are for complete" in r.stderr, r.stderr
    # at the limit: served, every choice
    r = cli(*base, "--temp", "1", "--seed", "0", "--prompts-file", "-", stdin="Once\n" * MAXC, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [i for i, _ in choices(r.stdout)] == list(range(MAXC))
