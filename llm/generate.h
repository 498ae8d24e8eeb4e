/* Per-sequence generation bookkeeping, shared by spillway-run, the CPU engine
 * and the GPU worker (it knows nothing about how logits are computed):
 *
 *   - builds the prompt token list (text with BOS per the tokenizer, given
 *     ids, or chat messages through the model's chat template);
 *   - owns the sampler;
 *   - turns accepted tokens into text deltas with the streaming detokenizer,
 *     holding back text that could be the start of a stop string, so a stop
 *     string is never emitted;
 *   - decides when to finish: EOS/EOG or a stop string (STOP), max_tokens or
 *     the context length (LENGTH);
 *   - keeps a reasoning model's reasoning apart from its answer;
 *   - counts usage.
 *
 * Usage:
 *   sw_gen g; if (sw_gen_init(&g, tok, chat, &params, n_ctx, err, sizeof err)) fail(400, err);
 *   evaluate g.prompt[0..n_prompt-1]; then loop:
 *     tok = sw_gen_sample(&g, logits, n_vocab);
 *     finish = sw_gen_accept(&g, tok, &delta, &len);   emit delta
 *     if (finish) break; else evaluate tok at position g.n_prompt + g.n_generated - 1
 *   sw_gen_free(&g);
 */
#ifndef SW_GENERATE_H
#define SW_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "llm/tokenizer.h"
#include "llm/sampler.h"
#include "llm/chat.h"
#include "llm/text.h"
#include "llm/json_schema.h"
#include "llm/util.h"
#include "spillway.pb-c.h"

/* Same values as Spillway__FinishReason. */
enum { SW_FINISH_NONE = 0, SW_FINISH_STOP = 1, SW_FINISH_LENGTH = 2,
       SW_FINISH_CANCELLED = 3, SW_FINISH_ERROR = 4 };

#define SW_GEN_MAX_STOPS 16
#define SW_GEN_NAN_ERROR "the model computed NaN logits (are its weights damaged?)"
#define SW_GEN_MAX_STOP_LEN 256
#define SW_GEN_MAX_TOP 20         /* top_logprobs at most (OpenAI's limit) */

/* A token with its log probability and its bytes (truncated to 128). */
typedef struct { int32_t id; float logprob; uint8_t n_bytes; char bytes[128]; } sw_token_logprob;
/* The sampled token's, and the likeliest tokens' at its position. */
typedef struct { sw_token_logprob chosen; sw_token_logprob top[SW_GEN_MAX_TOP]; int n_top; } sw_logprob;

typedef struct {
    /* Exactly one prompt form: messages (n_messages > 0), else ids
     * (n_prompt_ids > 0, used as given, no BOS added), else text. */
    const char *prompt;
    const int32_t *prompt_ids;
    size_t n_prompt_ids;
    const sw_chat_msg *messages;
    size_t n_messages;
    sw_reasoning_effort effort;   /* chat messages to a reasoning model */
    const cJSON *tools;           /* functions the model may call (OpenAI's tools array), or NULL */
    bool logprobs;                /* log probabilities of the generated tokens */
    int top_logprobs;             /* and of the likeliest alternatives, 0..SW_GEN_MAX_TOP */
    const cJSON *json_schema;     /* structured output: the answer is JSON fitting this schema, or NULL */
    bool one_call;                /* parallel_tool_calls false: the first call ends the answer */
    bool prompt_logprobs;         /* the prompt's own log probabilities (echo with logprobs) */
    bool echo;                    /* the first delta starts with the prompt's text (completions' echo) */
    const char *tool_choice;      /* NULL or "": the model may call; "required": it must call one of
                                   * the tools now; else the name of the one it must call */
    sw_sampling_params sampling;
    uint32_t max_tokens;          /* 0 = until the context is full */
    const char *const *stop;
    size_t n_stop;
} sw_gen_params;

typedef struct {
    const sw_tokenizer *tok;
    sw_sampler sampler;
    sw_detok detok;
    int32_t *prompt;              /* prompt tokens, to be evaluated at positions 0.. */
    int n_prompt;
    int n_ctx;
    int32_t n_vocab;              /* sampling is limited to the tokenizer's ids */
    uint32_t max_tokens;
    char *stop[SW_GEN_MAX_STOPS];
    size_t n_stop;
    char *held;                   /* decoded text not emitted yet (could start a stop string) */
    size_t n_held, cap_held;
    char *out;                    /* the delta returned by sw_gen_accept */
    size_t cap_out;
    uint32_t n_generated;         /* tokens accepted (completion_tokens) */
    int finish;                   /* SW_FINISH_*, sticky */
    /* Reasoning models (generate.c, "reasoning"): think chats (DeepSeek R1,
     * Qwen3) and harmony chats (gpt-oss). r_mode 0: the output is all answer. */
    int r_mode, r_state;
    int32_t think_open, think_close;                   /* <think> </think> */
    int32_t h_start, h_end, h_channel, h_message;     /* <|start|> <|end|> <|channel|> <|message|> */
    char h_role[64], h_chan[96];  /* a harmony header: after <|start|>, after <|channel|> */
    size_t h_n_role, h_n_chan;
    char h_to[SW_MAX_TOOL_NAME + 1];  /* the function a commentary message calls */
    char *reasoning;              /* the reasoning delta of the last sw_gen_accept */
    size_t n_reasoning, cap_reasoning;
    uint32_t n_reasoning_tokens;  /* accepted tokens that were reasoning or its markers */
    /* Tool calls (generate.c, "tool calls"): <tool_call> JSON </tool_call>
     * spans of the answer, parsed into calls instead of shown. */
    bool calls_on;                /* tools offered to a family with a call format */
    int32_t call_open, call_close;    /* chatml's markers' ids (Mistral: [TOOL_CALLS], no close); -1: none */
    bool call_held;               /* Mistral: [TOOL_CALLS] opens calls that run to the end */
    int32_t call_args;            /* Mistral's [ARGS] (v11: [TOOL_CALLS]name[ARGS]{...}), or -1 */
    bool call_json;               /* Llama 3.1: an answer that starts as JSON is held as calls */
    int32_t python_tag;           /* its <|python_tag|>, or -1 */
    bool answer_begun;            /* Llama 3.1: the answer has shown text (not a call) */
    bool in_call;
    sw_sbuf call_text;            /* the JSON of the call being written */
    sw_tool_calls calls;          /* the calls completed by the last sw_gen_accept */
    uint32_t n_calls_total;
    bool one_call;                /* stop at the first call */
    /* Log probabilities (sw_gen_sample), when asked: of the raw logits, kept
     * from before sampling changes them. */
    bool lp_on;
    int lp_k;
    float *lp_row;                /* the raw logits of the last sample (log probabilities and the structured-output mask read them) */
    sw_logprob lp;
    bool lp_valid;                /* lp is the last sampled token's */
    /* Structured output (generate.c, "structured output"): tokens that
     * cannot continue the answer's JSON are masked before sampling. */
    /* The prompt's log probabilities (prompt_logprobs): one entry a prompt
     * token, filled in order by sw_gen_prompt_logprob; the first has bytes
     * only. The bytes are the prompt's text as decoded from its start. */
    sw_logprob *plp;
    int n_plp;
    sw_detok plp_detok;
    sw_sbuf echo;                 /* the prompt's text, for the first delta (echo); freed once sent */
    sw_js *js;
    sw_js_state js_st;
    int forced;                   /* a forced call's progress (FC_*), 0: none */
    const char *error;            /* why sw_gen_sample returned -1 */
} sw_gen;

/* Returns 0, or 400 with err filled (empty or too long prompt, bad token id,
 * bad stop string); on failure there is nothing to free. n_ctx is the
 * context the sequence will run in. */
int sw_gen_init(sw_gen *g, const sw_tokenizer *tok, sw_chat_template chat,
                const sw_gen_params *p, int n_ctx, char *err, size_t errlen);
/* The same from a wire request (prompt / prompt_tokens / messages; sampling
 * without has_seed gets a random seed). */
int sw_gen_init_request(sw_gen *g, const sw_tokenizer *tok, sw_chat_template chat,
                        const Spillway__GenerateRequest *req, int n_ctx, char *err, size_t errlen);
void sw_gen_free(sw_gen *g);

/* With prompt_logprobs: the logits at prompt position p (0 <= p <
 * n_prompt - 1) score prompt token p + 1. Positions must come in order;
 * others are ignored. */
void sw_gen_prompt_logprob(sw_gen *g, int p, const float *row, int32_t n_logits);
/* Whether position p's logits are wanted for the prompt's log probabilities. */
static inline bool sw_gen_wants_prompt_row(const sw_gen *g, int p) { return g->plp && p < g->n_prompt - 1; }

/* Structured output: logits[i] = raw[i] for each token the answer's JSON
 * may take next, -inf for the others; returns how many may (sw_gen_sample
 * builds this mask when its first draw does not fit; tests and benchmarks
 * call it directly). */
int32_t sw_gen_json_mask(const sw_gen *g, const float *raw, float *logits, int32_t n);

/* Picks the next token from a row of logits (modified in place). Returns -1
 * when it cannot (a NaN in the row, no token continues a structured
 * answer, out of memory): the caller fails the request with sw_gen_error. */
int32_t sw_gen_sample(sw_gen *g, float *logits, int32_t n_logits);
static inline const char *sw_gen_error(const sw_gen *g) { return g->error ? g->error : SW_GEN_NAN_ERROR; }
/* Accepts a generated token. *delta (NUL-terminated, valid until the next
 * call) receives the text to emit now, possibly empty. Returns SW_FINISH_NONE
 * while generation continues, else the finish reason; when finishing, the
 * delta includes every held-back byte that belongs to the output. */
int sw_gen_accept(sw_gen *g, int32_t token, const char **delta, size_t *delta_len);
/* The reasoning text of the last sw_gen_accept (NUL-terminated, valid until
 * the next call, possibly empty): what a reasoning model thought, kept out
 * of the answer's delta. Stop strings apply to the answer only. */
static inline const char *sw_gen_reasoning(const sw_gen *g, size_t *len)
{
    if (len) *len = g->n_reasoning;
    return g->reasoning ? g->reasoning : "";
}
/* The function calls the last sw_gen_accept completed (valid until the next
 * call): name and arguments (JSON text in json.dumps form). A span that is
 * not a call ({"name": ..., "arguments": {...}}) stays in the answer. */
static inline const sw_tool_call *sw_gen_tool_calls(const sw_gen *g, size_t *n)
{
    *n = g->calls.n;
    return g->calls.v;
}
/* The last sampled token's log probabilities (valid until the next
 * sw_gen_sample), or NULL when they were not asked for. */
static inline const sw_logprob *sw_gen_logprob(const sw_gen *g) { return g->lp_valid ? &g->lp : NULL; }
/* Position at which the last accepted token must be evaluated. */
static inline int sw_gen_next_pos(const sw_gen *g) { return g->n_prompt + (int)g->n_generated - 1; }

#endif
