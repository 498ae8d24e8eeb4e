"""lm-eval-harness (PyPI `lm-eval`, its `local-completions` model) runs a
multiple-choice task from a local JSON file against the real gateway and a
CPU worker serving stories260K, as a user would: `python -m lm_eval` with
a Hugging Face tokenizer.

The tokenizer is built here, from the model file's own vocabulary, by the
`tokenizers` package: SentencePiece BPE as a Hugging Face tokenizer
(vocabulary and scores from the GGUF, merges ranked by the merged piece's
score, byte fallback, the "▁" word prefix, BOS prepended). lm-eval
tokenizes each context and continuation with it and sends the token ids,
batched (`"prompt": [[ids], ...]`, echo, logprobs 1, max_tokens 1).

What is checked: the tokenizer gives the ids spillway-run's own tokenizer
gives for every text of the task; every choice's log-likelihood lm-eval
reports is the sum of the continuation tokens' log-softmax of
`spillway-run --logits-out`, within 1e-3; its is-greedy flag is whether
each continuation token is the argmax; and the accuracy lm-eval reports is
the fraction of documents whose gold choice scores highest."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import bin_path, cpu_pool_policy, logits_for, shared_file

# lm-eval is an outside tool: the plain suite runs it; the request it sends
# runs under the sanitizers in test_choices' lm-eval-shaped batch.
pytestmark = pytest.mark.plain_only
STORIES = "models/stories260K.gguf"
DOCS = [
    dict(ctx="Once upon a time, there was a little", choices=[" girl", " tree", " car"], gold=0),
    dict(ctx="Lily liked to play with her", choices=[" toys", " sky", " run"], gold=0),
    dict(ctx="The sun was shining and the birds were", choices=[" happy", " singing", " blue"], gold=1),
    dict(ctx="Tom went to the park with his", choices=[" mom", " ball", " sad", " friend"], gold=0),
    dict(ctx="She was very", choices=[" happy", " table", " jumped"], gold=0),
]
TASK_YAML = """task: sw_stories_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{ctx}}}}"
target_delimiter: ""
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
metric_list:
  - metric: acc
"""


def gguf_vocab(path):
    from gguf import GGUFReader
    r = GGUFReader(str(path))

    def field(name):
        f = r.fields[name]
        return [f.parts[i] for i in f.data]
    toks = [bytes(p).decode() for p in field("tokenizer.ggml.tokens")]
    scores = [float(p[0]) for p in field("tokenizer.ggml.scores")]
    return toks, scores


def spm_merges(toks, scores):
    """BPE merges of a SentencePiece BPE vocabulary: every split of a piece
    into two pieces of the vocabulary, the higher-scored piece's first."""
    index = {t: i for i, t in enumerate(toks)}
    merges = []
    for t in toks:
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in index and b in index:
                merges.append((-scores[index[t]], index[a], index[b], a, b))
    return [(a, b) for *_, a, b in sorted(merges)]


def hf_tokenizer(model, out):
    """A Hugging Face tokenizer directory for the model's vocabulary."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors
    toks, scores = gguf_vocab(model)
    bpe = models.BPE(vocab={t: i for i, t in enumerate(toks)}, merges=spm_merges(toks, scores),
                     unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    tk = Tokenizer(bpe)
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    out.mkdir()
    tk.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(dict(
        tokenizer_class="PreTrainedTokenizerFast", bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        model_max_length=512)))
    return tk


def spillway_ids(model, text):
    r = subprocess.run([bin_path("spillway-run"), "-m", str(model), "--tokenize", text],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [int(x) for x in r.stdout.replace(",", " ").split()]


def run_lm_eval(base, tok_dir, task_dir, out, env_home):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HOME=str(env_home), HF_DATASETS_CACHE=str(env_home / "datasets"), TOKENIZERS_PARALLELISM="false")
    args = f"base_url={base}/v1/completions,model=s,tokenizer_backend=huggingface,tokenizer={tok_dir}," \
           "add_bos_token=True,num_concurrent=1,max_retries=1,max_length=256"
    r = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", args,
                        "--batch_size", "4", "--tasks", "sw_stories_mc", "--include_path", str(task_dir), "--log_samples",
                        "--output_path", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    samples = sorted(out.rglob("samples_sw_stories_mc_*.jsonl"))
    results = sorted(out.rglob("results_*.json"))
    assert samples and results, list(out.rglob("*"))
    return [json.loads(line) for line in samples[-1].read_text().splitlines()], json.loads(results[-1].read_text())


def reference(model, tk, ctx, cont, tmp_path):
    """(log-likelihood, is greedy) of cont after ctx, from spillway-run's
    logits: the continuation is what tokenizing ctx + cont adds after ctx."""
    whole, head = tk.encode(ctx + cont).ids, tk.encode(ctx).ids
    assert whole[:len(head)] == head
    lg = logits_for(model, whole, tmp_path / "l.bin", extra=("-t", "1"))[0].astype(np.float64)
    lsm = lg - (lg.max(1, keepdims=True) + np.log(np.exp(lg - lg.max(1, keepdims=True)).sum(1, keepdims=True)))
    pos = range(len(head), len(whole))
    return sum(lsm[j - 1, whole[j]] for j in pos), all(lg[j - 1].argmax() == whole[j] for j in pos)


@pytest.fixture
def gw(cluster):
    cluster.start_gateway(cpu_pool_policy("s"))
    cluster.start_worker("cpu-pool", "s", shared_file(STORIES), ["--threads", "1", "--parallel", "4"], name="s")
    cluster.wait_model("s", timeout=60)
    return cluster


def test_lm_eval_multiple_choice_matches_the_models_logits(gw, tmp_path):
    pytest.importorskip("lm_eval", reason="lm-eval is in tests/requirements.txt; ops/deps.sh installs it")
    model = shared_file(STORIES)
    tk = hf_tokenizer(model, tmp_path / "tok")
    for d in DOCS:
        for text in [d["ctx"]] + [d["ctx"] + c for c in d["choices"]]:
            assert tk.encode(text, add_special_tokens=False).ids == spillway_ids(model, text), text
    task = tmp_path / "task"
    task.mkdir()
    (task / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (task / "sw_stories_mc.yaml").write_text(TASK_YAML.format(data=task / "docs.jsonl"))
    samples, results = run_lm_eval(gw.base, tmp_path / "tok", task, tmp_path / "out", tmp_path / "hf")
    assert sorted(s["doc_id"] for s in samples) == list(range(len(DOCS)))
    right = 0
    for s in samples:
        d = DOCS[s["doc_id"]]
        got = [(float(r[0][0]), r[0][1] == "True") for r in s["resps"]]   # lm-eval logs them as strings
        assert len(got) == len(d["choices"])
        want = [reference(model, tk, d["ctx"], c, tmp_path) for c in d["choices"]]
        assert [g[0] for g in got] == pytest.approx([w[0] for w in want], abs=1e-3), d
        assert [g[1] for g in got] == [w[1] for w in want], d
        right += int(np.argmax([w[0] for w in want]) == d["gold"])
    acc = results["results"]["sw_stories_mc"]["acc,none"]
    assert acc == pytest.approx(right / len(DOCS))
