/* Per-sequence generation bookkeeping, shared by spillway-run, the CPU engine
 * and the GPU worker (it knows nothing about how logits are computed, nor
 * about the wire: proto/worker_request.h turns a GenerateRequest into
 * sw_gen_params):
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
 *   sw_gen *g = sw_gen_new(tok, chat, &params, n_ctx, err, sizeof err);  if (!g) fail(400, err);
 *   evaluate sw_gen_prompt(g, &n)[0..n-1]; then loop:
 *     tok = sw_gen_sample(g, logits, n_vocab);
 *     finish = sw_gen_accept(g, tok, &delta, &len);   emit delta
 *     if (finish) break; else evaluate tok at position sw_gen_next_pos(g)
 *   sw_gen_delete(g);
 *
 * sw_gen is opaque: its state lives in llm/gen_impl.h, which only the
 * generator's own files (and its unit tests) read.
 */
#ifndef SW_GENERATE_H
#define SW_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "llm/tokenizer.h"
#include "llm/sampler.h"
#include "llm/chat.h"
#include "llm/limits.h"
#include "llm/json.h"

/* Finish reasons. proto/worker_request.c holds them equal to
 * Spillway__FinishReason (a static assertion), so they go on the wire as
 * they are. */
enum { SW_FINISH_NONE = 0, SW_FINISH_STOP = 1, SW_FINISH_LENGTH = 2,
       SW_FINISH_CANCELLED = 3, SW_FINISH_ERROR = 4 };

/* A token with its log probability and its bytes (truncated to 128). */
typedef struct { int32_t id; float logprob; uint8_t n_bytes; char bytes[128]; } sw_token_logprob;
/* The sampled token's, and the likeliest tokens' at its position. */
typedef struct { sw_token_logprob chosen; sw_token_logprob top[SW_MAX_TOP_LOGPROBS]; int n_top; } sw_logprob;

/* What a request asks of the generator. sw_gen_new copies or consumes all
 * of it: the caller may free what these point to once it returns. */
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
    int top_logprobs;             /* and of the likeliest alternatives, 0..SW_MAX_TOP_LOGPROBS */
    const cJSON *json_schema;     /* structured output: the answer is JSON fitting this schema, or NULL */
    bool one_call;                /* parallel_tool_calls false: the first call ends the answer */
    bool prompt_logprobs;         /* the prompt's own log probabilities (echo with logprobs) */
    bool echo;                    /* the first delta starts with the prompt's text (completions' echo) */
    const char *tool_choice;      /* NULL or "": the model may call; "required": it must call one of
                                   * the tools now; else the name of the one it must call */
    sw_sampling_params sampling;  /* logit_bias ids must be in the tokenizer's vocabulary */
    uint32_t max_tokens;          /* 0 = until the context is full */
    const char *const *stop;      /* at most SW_MAX_STOPS, each at most SW_MAX_STOP_LEN bytes */
    size_t n_stop;
} sw_gen_params;

typedef struct sw_gen sw_gen;

/* A generator for one sequence, or NULL with err filled (the request is
 * invalid: empty or too long prompt, bad token id, bad stop string, bad
 * schema...; or out of memory). n_ctx is the context it will run in. */
sw_gen *sw_gen_new(const sw_tokenizer *tok, sw_chat_template chat, const sw_gen_params *p, int n_ctx,
                   char *err, size_t errlen);
void sw_gen_delete(sw_gen *g);
/* The same in caller-owned storage (the unit tests keep a generator by
 * value, with llm/gen_impl.h). Returns 0, or 400 with err
 * filled; on failure there is nothing to free. */
int sw_gen_init(sw_gen *g, const sw_tokenizer *tok, sw_chat_template chat,
                const sw_gen_params *p, int n_ctx, char *err, size_t errlen);
void sw_gen_free(sw_gen *g);

/* The prompt's tokens, to evaluate at positions 0..*n-1. */
const int32_t *sw_gen_prompt(const sw_gen *g, int *n);
int sw_gen_n_prompt(const sw_gen *g);
/* Tokens accepted so far (usage's completion_tokens), and how many of them
 * were reasoning or its markers (reasoning_tokens). */
uint32_t sw_gen_n_generated(const sw_gen *g);
uint32_t sw_gen_n_reasoning_tokens(const sw_gen *g);
/* Position at which the last accepted token must be evaluated. */
int sw_gen_next_pos(const sw_gen *g);
/* Lowers the context the sequence runs in, once its prompt is known (a
 * caller that sizes its KV cache to the prompt and max_tokens): generation
 * ends with LENGTH there. Ignored unless n_prompt <= n_ctx < the current one. */
void sw_gen_limit_ctx(sw_gen *g, int n_ctx);
/* The sampling parameters in force (a device sampler reads temperature,
 * top_k, top_p and the seed from here). */
const sw_sampling_params *sw_gen_sampling(const sw_gen *g);
/* Whether a device that samples with temperature, top-k and top-p over
 * device_vocab logits picks this sequence's tokens as sw_gen_sample would:
 * the sampling is plain (sw_sampler_is_plain), the vocabularies agree, and
 * nothing of the generator's own needs the raw row (log probabilities,
 * structured output, a forced call). Tokens so picked still go through
 * sw_gen_accept. */
bool sw_gen_sampling_is_plain(const sw_gen *g, int32_t device_vocab);

/* With prompt_logprobs: the logits at prompt position p (0 <= p <
 * n_prompt - 1) score prompt token p + 1. Positions must come in order;
 * others are ignored. */
void sw_gen_prompt_logprob(sw_gen *g, int p, const float *row, int32_t n_logits);
/* Whether the request asked for the prompt's log probabilities, and
 * whether position p's logits are wanted for them. */
bool sw_gen_scores_prompt(const sw_gen *g);
bool sw_gen_wants_prompt_row(const sw_gen *g, int p);
/* The prompt's log probabilities filled so far (*n of them): the first
 * token's (bytes only), then one a scored position. */
const sw_logprob *sw_gen_prompt_logprobs(const sw_gen *g, size_t *n);

/* Structured output: logits[i] = raw[i] for each token the answer's JSON
 * may take next, -inf for the others; returns how many may (sw_gen_sample
 * builds this mask when its first draw does not fit; tests and benchmarks
 * call it directly). */
int32_t sw_gen_json_mask(const sw_gen *g, const float *raw, float *logits, int32_t n);

/* Whether a forced call (tool_choice "required" or a function's name) over
 * these tools can be decoded: the functions' parameters compile as one call
 * schema (err filled when not). The gateway's check of what sw_gen_new
 * would refuse; the chat format's own limits (gpt-oss's one function for
 * "required") are the worker's to tell. */
bool sw_gen_check_forced(const cJSON *tools, const char *tool_choice, char *err, size_t errlen);

/* Picks the next token from a row of logits (modified in place). Returns -1
 * when it cannot (a NaN in the row, no token continues a structured
 * answer, out of memory): the caller fails the request with sw_gen_error. */
int32_t sw_gen_sample(sw_gen *g, float *logits, int32_t n_logits);
/* Why sampling failed: the reason sw_gen_sample gave, else NaN logits (a
 * device sampler's -1 too). */
const char *sw_gen_error(const sw_gen *g);
/* Accepts a generated token. *delta (NUL-terminated, valid until the next
 * call) receives the text to emit now, possibly empty. Returns SW_FINISH_NONE
 * while generation continues, else the finish reason; when finishing, the
 * delta includes every held-back byte that belongs to the output. Out of
 * memory finishes with SW_FINISH_ERROR. */
int sw_gen_accept(sw_gen *g, int32_t token, const char **delta, size_t *delta_len);
/* The reasoning text of the last sw_gen_accept (NUL-terminated, valid until
 * the next call, possibly empty): what a reasoning model thought, kept out
 * of the answer's delta. Stop strings apply to the answer only. */
const char *sw_gen_reasoning(const sw_gen *g, size_t *len);
/* The function calls the last sw_gen_accept completed (valid until the next
 * call): name and arguments (JSON text in json.dumps form). A span that is
 * not a call ({"name": ..., "arguments": {...}}) stays in the answer. */
const sw_tool_call *sw_gen_tool_calls(const sw_gen *g, size_t *n);
/* The last sampled token's log probabilities (valid until the next
 * sw_gen_sample), or NULL when they were not asked for. */
const sw_logprob *sw_gen_logprob(const sw_gen *g);

#endif
