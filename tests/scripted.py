"""Scripted models: real GGUF files whose greedy output is a given script.

A file is a llama-architecture f32 model with a byte-level BPE vocabulary
that holds the chat templates' markers (chatml, DeepSeek R1, harmony, think
and tool-call tokens) and a few words. Its one layer adds nothing to the
residual stream (zero attention output and FFN down-projection), so the
next token depends only on the current one: the output matrix maps each
token of the script to its successor, and greedy decoding replays the
script from the prompt's last token on. The worker computes such a file
like any other model, so tests of what happens to a model's output (the
reasoning split, tool calls) run through the real engine and gateway."""

import numpy as np

from archmodels import gpt2_byte_symbols, make_weights, write_model

BYTES = gpt2_byte_symbols()
NL = BYTES[ord("\n")]


def word(text):
    """A vocabulary entry for text, in the byte-level alphabet."""
    return "".join(BYTES[b] for b in text.encode())


SPECIAL = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
           "<|start|>", "<|end|>", "<|channel|>", "<|message|>", "<|return|>", "<|call|>",
           "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>",
           "<\uff5cend\u2581of\u2581sentence\uff5c>",
           "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>",
           "[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
           "[/TOOL_RESULTS]", "</s>"]
USER_DEFINED = ("<think>", "</think>", "<tool_call>", "</tool_call>")   # shown as text, as in Qwen's files
CALL = word('\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n')
NOT_A_CALL = word('\n{"name": 7}\n')
HARMONY_TO = word(" to=functions.get_weather")     # gpt-oss's call: a commentary message to a function
HARMONY_ARGS = word('{"city":"Paris","days":2}')
LLAMA_CALL = word('{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}')   # Llama 3.1's call
JSON_ANSWER = word('{"city": "Paris", "days": 2}')   # an answer in JSON
LLAMA_CALL2 = word('{"name": "get_time", "parameters": {"zone": "utc"}}')   # a second call
MISTRAL_CALLS = word('[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]')   # after [TOOL_CALLS]
GET_WEATHER = word("get_weather")   # Mistral v11: [TOOL_CALLS]get_weather[ARGS]{...}
WORDS = ["Let", "\u0120me", "\u0120think", "The", "\u0120answer", "\u0120is", "\u0120four", NL + NL,
         "analysis", "\u0120\u0120", CALL, NOT_A_CALL, "commentary", HARMONY_TO, HARMONY_ARGS, LLAMA_CALL,
         JSON_ANSWER, LLAMA_CALL2, MISTRAL_CALLS, GET_WEATHER]
TOKENS = BYTES + SPECIAL + WORDS
ID = {t: i for i, t in enumerate(TOKENS)}

TEMPLATES = {   # enough of each family's Jinja text for the worker to recognise it
    "chatml": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "<|im_start|>assistant\n",
    "r1": "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}<\uff5cUser\uff5c>{{ m.content }}"
          "{% else %}<\uff5cAssistant\uff5c>{{ m.content }}<\uff5cend\u2581of\u2581sentence\uff5c>{% endif %}"
          "{% endfor %}<\uff5cAssistant\uff5c><think>\\n",
    "llama3": "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
              "{% endfor %}<|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral": "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
               "{% else %}{{ m.content }}</s>{% endif %}{% endfor %}",
    "harmony": "<|start|>system<|message|>...<|end|>{% for m in messages %}<|start|>{{ m.role }}"
               "<|channel|>final<|message|>{{ m.content }}<|end|>{% endfor %}<|start|>assistant",
}


def scripted_model(path, template, script, scale=4.0, eos=None):
    """Writes the file: template names TEMPLATES' chat template, script is
    the prompt's last token and then the output, every token once (its
    successor is fixed), ending with the end-of-generation token; or, with
    eos given, ending with an earlier token, so that the output loops. scale
    sets how sure the model is: the successor's logit is about 11 x scale,
    the others' about scale (random) or 0 (tokens outside the script)."""
    hp, w = make_weights("llama", E=128, n_head=2, n_kv=2, hd=64, F=128, V=len(TOKENS), n_layer=1, seed=7)
    w["blk.0.attn_output.weight"][:] = 0   # the layer adds nothing: the stream is the token's embedding
    w["blk.0.ffn_down.weight"][:] = 0
    w["output_norm.weight"][:] = 1
    emb = w["token_embd.weight"]            # random, so near orthogonal in 128 dimensions
    out = np.zeros_like(w["output.weight"])
    ids = [ID[t] for t in script]
    body = ids if eos is None else ids[:-1]
    assert len(set(body)) == len(body), "a token may appear once in a script: its successor is fixed"
    for cur, nxt in zip(ids, ids[1:]):
        out[nxt] += scale * emb[cur] / np.linalg.norm(emb[cur])   # a loop: one row, two predecessors
    w["output.weight"] = out
    types = [1] * 256 + [4 if t in USER_DEFINED else 3 for t in SPECIAL] + [1] * len(WORDS)
    vocab = dict(tokens=TOKENS, types=types, merges=["\u0120 \u0120"], eos=ids[-1] if eos is None else ID[eos],
                 chat_template=TEMPLATES[template])
    write_model(path, "llama", hp, w, vocab=vocab)
    return path
