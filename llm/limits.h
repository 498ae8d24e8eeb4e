/* Every limit on a request, defined once.
 *
 * The gateway refuses what exceeds them with the OpenAI error shape and the
 * field's name as `param` (gateway/openai.c); the wire check applies them to
 * every GenerateRequest that crosses a socket (proto/wire.c); the generator
 * relies on them (llm/generate.c). So nothing the gateway lets through comes
 * back from a worker as a 400 it could have given itself.
 *
 * Where the OpenAI API is stricter than the engines need (temperature up to
 * 2), the OpenAI bound is the HTTP API's and the wider one the wire's: the
 * SDK speaks the wire directly.
 */
#ifndef SW_LIMITS_H
#define SW_LIMITS_H

/* Prompt tokens, and max_tokens. */
#define SW_MAX_TOKENS_PER_REQUEST (1u << 20)
/* Chat messages in one request, and a role's length. */
#define SW_MAX_MESSAGES 4096
#define SW_MAX_ROLE_LEN 32
/* Stop strings: how many, and each one's length in bytes. */
#define SW_MAX_STOPS 16
#define SW_MAX_STOP_LEN 1024
/* top_logprobs at most (OpenAI's limit). */
#define SW_MAX_TOP_LOGPROBS 20
/* logit_bias: entries, and each bias's magnitude (OpenAI's limits). */
#define SW_MAX_LOGIT_BIAS 1024
#define SW_MAX_LOGIT_BIAS_VALUE 100
/* tools offered, and tool calls carried in one message or chunk. */
#define SW_MAX_TOOLS 128
#define SW_MAX_TOOL_CALLS 128
/* A function's name (OpenAI's limit). */
#define SW_MAX_TOOL_NAME 64
/* A JSON schema (response_format, or the one built from the tools), bytes. */
#define SW_MAX_SCHEMA_LEN 65536

/* ---- request bodies as a whole (gateway/openai.c) ----
 * Choices per request: `n` times the prompts of a batched completions
 * request. Each choice is a request of its own at the workers (a slot, a
 * KV cache: gateway/choices.h), so this bounds what one HTTP request may
 * take of a pool at once. */
#define SW_MAX_CHOICES 64
/* Nesting of objects and arrays in a request body, counted on the raw text
 * before it is parsed: enough for deep JSON schemas, far under cJSON's own
 * limit of 1000 (which would report a deep body as merely "not JSON"). */
#define SW_MAX_JSON_DEPTH 64

/* ---- embeddings (gateway/embeddings.c) ----
 * Inputs in one request, and tokens in one input (OpenAI's limits). The
 * model's context bounds an input further: the gateway knows it from the
 * worker's Register and refuses a longer token-id input; text it cannot
 * count is the worker's to refuse. */
#define SW_MAX_EMBED_INPUTS 2048
#define SW_MAX_EMBED_INPUT_TOKENS 8192
/* A vector's width on the wire (a worker's reply past it is refused). */
#define SW_MAX_EMBED_DIM 65536
/* Floats in one request's answer (inputs x width): 8 MiB of them, so the
 * worker's reply stays well inside a wire frame (proto/wire.h's 16 MiB,
 * past which ZeroMQ drops the connection). 2048 inputs of up to 1024
 * dimensions; a wider model takes fewer inputs a request. */
#define SW_MAX_EMBED_VALUES (1u << 21)

/* Sampling ranges on the wire; the HTTP API narrows temperature to OpenAI's
 * 0..2 and repetition_penalty to 0..10. */
#define SW_MAX_TEMPERATURE 100.0f
#define SW_MAX_REPETITION_PENALTY 100.0f
#define SW_MAX_PENALTY 2.0f               /* presence_penalty, frequency_penalty: -2..2 */

/* ---- what the gateway takes from a worker (gateway/broker.c) ----
 * A worker is a peer, not a part of the gateway: what it sends is checked
 * against these, and a worker past one is cut off (the request ends with an
 * error and is cancelled at the worker) and counted. */
/* Bytes of one TokenChunk frame; legitimate chunks are a token or a few. */
#define SW_MAX_CHUNK_BYTES (1u << 20)
/* Bytes a request may receive in all: this base plus so much per token the
 * request may carry (its prompt, for prompt log probabilities, and max_tokens). */
#define SW_MAX_RESPONSE_BYTES_BASE (1u << 20)
#define SW_MAX_RESPONSE_BYTES_PER_TOKEN 4096u
/* Slots a worker may claim (Register, Heartbeat); more are clamped to it. */
#define SW_MAX_WORKER_SLOTS 4096u

/* ---- HTTP connections (gateway/http.c) ----
 * So one client cannot starve the others: connections in all, connections
 * from one IP address (a client past it is refused at accept, the others
 * and /healthz still served), and seconds a connection may sit with
 * nothing read or written before it is closed (slowloris, a reader that
 * never drains; a suspended connection, waiting on a worker, is not idle). */
#define SW_HTTP_MAX_CONNECTIONS 4096u
#define SW_HTTP_MAX_CONNECTIONS_PER_IP 512u
#define SW_HTTP_IDLE_TIMEOUT_S 60u
/* Output of one stream waiting for a reader that does not keep up, bytes:
 * past it the request ends with an error and is cancelled at the worker. A
 * megabyte is many minutes of tokens for a reader that reads at all. */
#define SW_MAX_STREAM_BACKLOG_BYTES (1u << 20)

#endif
