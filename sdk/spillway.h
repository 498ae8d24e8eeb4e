/* libspillway: the native C client for a Spillway gateway.
 *
 * It speaks the same ZeroMQ/protobuf protocol as the workers (one Envelope per
 * frame, proto/spillway.proto) to the gateway's SDK endpoint (spillway-gateway
 * --sdk, default tcp://127.0.0.1:5556), so requests skip HTTP and JSON
 * entirely and go through the same routing, overflow and metrics.
 *
 * A client owns one ZeroMQ socket, so use one client per thread.
 *
 *   spillway_client *c = spillway_connect("tcp://127.0.0.1:5556", err, sizeof err);
 *   spillway_request r = spillway_request_default("demo");
 *   r.prompt = "Once upon a time"; r.max_tokens = 32;
 *   spillway_result res;
 *   if (spillway_complete(c, &r, &res, err, sizeof err) == 0) puts(res.text);
 *   spillway_result_free(&res); spillway_close(c);
 */
#ifndef SPILLWAY_SDK_H
#define SPILLWAY_SDK_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SPILLWAY_DEFAULT_ENDPOINT "tcp://127.0.0.1:5556"

typedef struct spillway_client spillway_client;

typedef struct {
    const char *role;      /* "system", "user", "assistant" */
    const char *content;
} spillway_message;

/* A prompt of a batch (spillway_complete_batch), or an input to embed
 * (spillway_embed): text, or token ids (n_ids > 0), exactly one of them. */
typedef struct {
    const char *text;
    const uint32_t *ids;
    size_t n_ids;
} spillway_input;

/* How long a reasoning model thinks (gpt-oss: "Reasoning: low|medium|high"). */
typedef enum {
    SPILLWAY_EFFORT_DEFAULT = 0, SPILLWAY_EFFORT_LOW = 1, SPILLWAY_EFFORT_MEDIUM = 2, SPILLWAY_EFFORT_HIGH = 3
} spillway_effort;

typedef struct {
    const char *model;
    const char *prompt;                 /* a completion, or ... */
    const spillway_message *messages;   /* ... a chat (n_messages > 0) */
    size_t n_messages;
    uint32_t max_tokens;
    float temperature;                  /* 0 = greedy */
    float top_p;
    uint32_t top_k;
    float presence_penalty;             /* OpenAI's, -2..2, over the generated tokens; 0 = off */
    float frequency_penalty;            /* the same, per occurrence */
    bool has_seed;
    uint64_t seed;
    const char *const *stop;
    size_t n_stop;
    int timeout_ms;                     /* whole request; 0 = 10 minutes */
    spillway_effort reasoning_effort;   /* chats with reasoning models */
    const char *tools_json;             /* chats: functions the model may call, OpenAI's tools array as JSON */
    const char *tool_choice;            /* with tools_json: NULL or "auto"; "required" (it must call one);
                                         * or the name of the function it must call */
    bool logprobs;                      /* each generated token's log probability ... */
    uint32_t top_logprobs;              /* ... and this many likeliest alternatives (0-20) */
    const uint32_t *logit_bias_ids;     /* OpenAI's logit_bias: added to these tokens' logits */
    const float *logit_bias;            /* (-100..100 each; at most 1024 entries) */
    size_t n_logit_bias;
    const char *json_schema;            /* structured output: the answer is JSON fitting this JSON Schema
                                         * (text); "{\"type\":\"object\"}" for any object; NULL: free text */
    /* Streaming: called with each delta of a reasoning model's reasoning, as
     * it comes (NULL: the reasoning only arrives in the result); return
     * non-zero to cancel. */
    int (*on_reasoning)(void *user, const char *delta, size_t len);
    void *on_reasoning_user;
    uint32_t n;                         /* samples of the prompt (0 or 1: one; up to 64 through
                                         * spillway_complete_n), each with seed + i */
    const spillway_input *prompts;      /* a batch of completion prompts, in place of prompt
                                         * (OpenAI's prompt as an array): spillway_complete_batch */
    size_t n_prompts;
} spillway_request;

/* A token's log probability under the model's raw logits, with its bytes
 * (malloc'd; a token may end inside a UTF-8 character, so not text). */
typedef struct {
    uint32_t id;
    char *bytes;
    size_t n_bytes;
    float logprob;
} spillway_token_logprob;

/* A generated token's, and the likeliest tokens' at its position. */
typedef struct {
    spillway_token_logprob token;
    spillway_token_logprob *top;   /* malloc'd, likeliest first */
    size_t n_top;
} spillway_logprob;

/* A function call the model made: its name and arguments (JSON text). */
typedef struct {
    char *name, *arguments;
} spillway_tool_call;

typedef enum {
    SPILLWAY_FINISH_NONE = 0, SPILLWAY_FINISH_STOP = 1, SPILLWAY_FINISH_LENGTH = 2,
    SPILLWAY_FINISH_CANCELLED = 3, SPILLWAY_FINISH_ERROR = 4
} spillway_finish;

typedef struct {
    char *text;                 /* malloc'd, NUL-terminated: the whole continuation */
    size_t len;
    char *reasoning;            /* malloc'd or NULL: a reasoning model's reasoning (chats), apart from text */
    size_t reasoning_len;
    uint32_t reasoning_tokens;  /* completion tokens that were reasoning */
    spillway_tool_call *tool_calls;   /* malloc'd: the calls the model made (chats with tools_json) */
    size_t n_tool_calls;
    spillway_logprob *logprobs; /* malloc'd: one a generated token, when the request asked */
    size_t n_logprobs;
    spillway_finish finish;
    uint32_t prompt_tokens, completion_tokens;
    uint32_t cached_tokens;     /* prompt tokens the worker took from its prefix cache */
    char pool[64];              /* which pool and worker served it */
    char worker[128];
    int error_code;             /* HTTP-like status when the gateway refused it, else 0 */
} spillway_result;

/* Called for each text delta (the answer's, not the reasoning's); return
 * non-zero to cancel the request. */
typedef int (*spillway_stream_fn)(void *user, const char *delta, size_t len);

/* A plaintext client: for a gateway whose SDK endpoint has no --client-keys
 * (loopback only, unless the gateway was told --insecure-sdk). */
spillway_client *spillway_connect(const char *endpoint, char *err, size_t errlen);
/* A client that authenticates with CURVE (docs/security.md), for a gateway
 * started with --curve-secret and --client-keys: key_file is this client's
 * keypair (`spillway keygen` writes PREFIX.key, mode 0600; a file others may
 * read is refused), gateway_key the gateway's public key, as its .pub file
 * or the 40 Z85 characters. NULL with err filled on a bad key. A key the
 * gateway does not list makes each call fail with a message saying so. */
spillway_client *spillway_connect_curve(const char *endpoint, const char *key_file, const char *gateway_key,
                                        char *err, size_t errlen);
void spillway_close(spillway_client *c);

spillway_request spillway_request_default(const char *model);

/* Blocking call: returns 0 when the request finished (any finish reason but
 * ERROR), -1 with err filled otherwise (result still describes what came). */
int spillway_complete(spillway_client *c, const spillway_request *req,
                      spillway_result *out, char *err, size_t errlen);
/* Streaming call: `fn` sees each delta as it arrives; out gets the total. */
int spillway_complete_stream(spillway_client *c, const spillway_request *req,
                             spillway_stream_fn fn, void *user,
                             spillway_result *out, char *err, size_t errlen);
/* Called for each text delta of sample `index` of a request of n; return
 * non-zero to cancel the whole request. */
typedef int (*spillway_choice_fn)(void *user, uint32_t index, const char *delta, size_t len);
/* n samples of one prompt (req->n, 2..64): out is an array of req->n
 * results, out[i] sample i's, what the same request with seed + i would give
 * (the gateway makes each its own request; a prompt's samples after the
 * first take its KV from the worker's prefix cache, which their
 * cached_tokens show). fn (NULL: none) sees each delta with its index.
 * Returns 0 when every sample finished, -1 with err filled otherwise; free
 * each result. */
int spillway_complete_n(spillway_client *c, const spillway_request *req, spillway_choice_fn fn, void *user,
                        spillway_result *out, char *err, size_t errlen);
void spillway_result_free(spillway_result *r);

/* A request's usage as the HTTP API counts it: each prompt's tokens once,
 * however many samples were drawn from it; every choice's completion. */
typedef struct {
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
} spillway_usage;

/* A batch of prompts (req->prompts, req->n_prompts of them, in place of
 * req->prompt and messages), each with req->n samples (0 or 1: one), as
 * the HTTP API's completions take `prompt` as an array: out is an array of
 * n_prompts * n results, out[prompt * n + sample] (the index HTTP gives
 * that choice), each what that prompt's own request with seed + sample
 * would give: the gateway makes each choice its own request, with the code
 * HTTP's batches go through (gateway/choices.h). fn (NULL: none) sees each
 * delta with its index; usage (NULL: not wanted) gets the totals. At most
 * SW_MAX_CHOICES (64, llm/limits.h) choices: more are refused before out
 * is touched, as is a prompt that is empty, both text and ids, or not
 * UTF-8. Returns 0 when every choice finished, -1 with err filled
 * otherwise; free each result. */
int spillway_complete_batch(spillway_client *c, const spillway_request *req, spillway_choice_fn fn, void *user,
                            spillway_result *out, spillway_usage *usage, char *err, size_t errlen);

/* The embeddings of a request's inputs, in input order. */
typedef struct {
    uint32_t dim;               /* floats in a vector */
    size_t count;               /* vectors: one an input */
    float *values;              /* malloc'd: count * dim floats, input i's at values + i * dim, each
                                 * L2-normalized (the worker's EmbedReply, as /v1/embeddings gives them) */
    uint32_t *input_tokens;     /* malloc'd: each input's tokens (a text's BOS included) */
    uint32_t prompt_tokens;     /* all the inputs' tokens (OpenAI's usage.prompt_tokens) */
    char pool[64];              /* which pool and worker served it */
    char worker[128];
    int error_code;             /* HTTP-like status when the gateway refused it, else 0 */
} spillway_embeddings;

/* Embeds n_inputs inputs (1..SW_MAX_EMBED_INPUTS, each text or at most
 * SW_MAX_EMBED_INPUT_TOKENS token ids: llm/limits.h) with an embedding
 * model, in one request (POST /v1/embeddings over the SDK link: the same
 * routing, limits and vectors). timeout_ms 0: 10 minutes. Returns 0 with
 * out filled, or -1 with err filled: a bad argument (nothing sent), or the
 * gateway's refusal with its status in out->error_code and its message in
 * err (a model that is not an embedding model, an input past its context,
 * more floats than SW_MAX_EMBED_VALUES). Free out either way. */
int spillway_embed(spillway_client *c, const char *model, const spillway_input *inputs, size_t n_inputs,
                   spillway_embeddings *out, int timeout_ms, char *err, size_t errlen);
/* The same for texts (NUL-terminated UTF-8, none empty). */
int spillway_embed_texts(spillway_client *c, const char *model, const char *const *texts, size_t n_texts,
                         spillway_embeddings *out, int timeout_ms, char *err, size_t errlen);
void spillway_embeddings_free(spillway_embeddings *e);

/* The gateway's status document (pools, workers, load) as JSON; caller
 * frees. It is the admin API's: admin_token is the gateway's
 * (--admin-token-file); NULL, or the gateway refusing it, is NULL with the
 * reason in err. */
char *spillway_status(spillway_client *c, const char *admin_token, int timeout_ms, char *err, size_t errlen);

const char *spillway_finish_name(spillway_finish f);

#ifdef __cplusplus
}
#endif
#endif
