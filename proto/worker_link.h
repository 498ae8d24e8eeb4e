/* The worker side of the gateway<->worker protocol, shared by the CPU and GPU
 * workers (and the --test-echo test mode).
 *
 * Two threads, because ZeroMQ sockets belong to one thread and a long compute
 * step must not stop heartbeats:
 *   - the link thread owns the DEALER socket to the gateway. It registers,
 *     sends heartbeats after SW_HEARTBEAT_MS of silence (carrying the engine's
 *     load), declares the gateway dead after SW_HEARTBEAT_LIVENESS silent
 *     intervals, then reconnects with exponential backoff and registers again
 *     (Paranoid Pirate). It forwards requests/cancels to the compute thread and
 *     chunks back, over an inproc PAIR.
 *   - the compute thread (the caller of sw_worker_run) drives the engine:
 *     between steps it drains new requests and cancels (iteration-level
 *     scheduling), then calls step().
 *
 * What the gateway sees (details at the top of worker_link.c):
 *   Register on every (re)connect; Heartbeat with load every SW_HEARTBEAT_MS
 *   and within ~20 ms of a change in requests in flight; per accepted request
 *   TokenChunks ending in exactly one terminal message: a chunk with a finish
 *   reason and usage (a Cancel is confirmed by FINISH_CANCELLED), or an Error
 *   with the request id (400 invalid request, 404 model not served here,
 *   429 refused before it started: full or draining, 503 busy/shutting
 *   down, 504 deadline, or the engine's code); Heartbeat.draining at once
 *   on SIGINT/SIGTERM, and Disconnect once drained. With several gateways
 *   (SW_MAX_GATEWAYS) all of this happens on each link, each request's
 *   answer on the link it came from. The gateway must send something (a Heartbeat at least)
 *   after each SW_HEARTBEAT_MS of silence, or the worker reconnects.
 *   A refused Register (an Error without a request id, code 403: a key not
 *   allowed into this pool, or a worker id another live worker holds) is
 *   logged and tried again every SW_REGISTER_RETRY_MS. A failed handshake
 *   (key refused, CURVE on one side only) is logged as it happens.
 */
#ifndef SW_WORKER_LINK_H
#define SW_WORKER_LINK_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include "wire.h"
#include "llm/chat.h"
#include "proto/worker_request.h"

#define SW_REGISTER_RETRY_MS 10000   /* after a refused registration */

typedef struct {
    uint32_t active, queued, slots, batch_size;
    float kv_utilization;
    uint64_t tokens_generated;
    /* The prefix cache since start, in prompt tokens: looked up, found. */
    uint64_t prefix_cache_queries, prefix_cache_hits;
} sw_load;

/* A request's token counts, as the final chunk reports them. */
typedef struct {
    uint32_t prompt_tokens, completion_tokens;
    uint32_t cached_tokens;   /* prompt tokens not computed: their KV was reused */
    uint32_t reasoning_tokens;   /* completion tokens whose text was reasoning */
    double worker_seconds;       /* the request's share of the steps it was in (Usage.worker_seconds) */
} sw_usage;

/* What one step gives a request; any part may be empty. */
typedef struct {
    const char *text;             /* the answer's delta */
    const char *reasoning;        /* the reasoning's delta (NULL: none) */
    const sw_tool_call *calls;    /* function calls completed in this step */
    size_t n_calls;
    const sw_logprob *logprob;    /* the step's token's log probabilities, or NULL */
    const sw_logprob *prompt_logprobs;   /* the prompt's (prompt_logprobs), with the first token */
    size_t n_prompt_logprobs;
} sw_out;

/* Called by the engine (on the compute thread) for every output chunk.
 * finish: a Spillway__FinishReason; FINISH_NONE while more follow. Usage is
 * read only on the final chunk. */
typedef void (*sw_emit_fn)(void *emit_ctx, const char *request_id, const sw_out *out, const uint32_t *ids,
                           size_t n_ids, int finish, const sw_usage *usage);
/* Called by the engine to fail a request it had accepted (e.g. prompt too long). */
typedef void (*sw_fail_fn)(void *emit_ctx, const char *request_id, uint32_t code, const char *msg);

/* An EmbedRequest's answer: n vectors of dim floats end to end, and each
 * input's token count; malloc'd, the caller frees both. */
typedef struct {
    float *values;
    uint32_t *tokens;
    uint32_t n, dim;
} sw_embeddings;

typedef struct {
    /* Accepts a request (copy what you need: req is freed after the call;
     * sw_gen_from_wire, proto/worker_request.h, makes its generator).
     * Returns 0, or an HTTP-like error code (400, 404, 503) with err filled. */
    int (*submit)(void *eng, const Spillway__GenerateRequest *req, char *err, size_t errlen);
    /* Stops a request and frees its slot; emits nothing. Unknown ids are ignored. */
    void (*cancel)(void *eng, const char *request_id);
    /* One scheduler iteration (a prefill chunk and/or one decode step).
     * Returns the number of requests still running or queued; 0 = idle. */
    int (*step)(void *eng, sw_emit_fn emit, sw_fail_fn fail, void *emit_ctx);
    /* THREAD SAFETY: load() is called from the LINK thread, once per
     * heartbeat (every SW_HEARTBEAT_MS, and within ~20 ms after the number of
     * requests in flight changes, so at most ~50 times a second), concurrently
     * with submit/cancel/step on the compute thread. It must be thread-safe
     * and cheap: read atomics, or copy a snapshot under a mutex that the
     * compute thread updates. Every other op is called from the compute
     * thread only. */
    void (*load)(void *eng, sw_load *out);
    /* Optional (NULL = never idle while work is pending). Milliseconds until
     * step() has anything to do, e.g. the echo engine between paced tokens.
     * The compute thread waits that long for new requests/cancels instead of
     * spinning on step(). Compute thread only. */
    int (*idle_ms)(void *eng);
    /* Optional (NULL: every EmbedRequest is answered 400, embeddings not
     * supported by this worker). Computes all of req's embeddings at once,
     * between steps, as one batch, into out. Returns 0, or an HTTP-like
     * code (400 bad input or not an embedding model, 503) with err filled.
     * Compute thread only. */
    int (*embed)(void *eng, const Spillway__EmbedRequest *req, sw_embeddings *out, char *err, size_t errlen);
} sw_engine_ops;

/* A worker may serve several gateways at once (N gateways behind a load
 * balancer sharing one fleet): it registers and heartbeats with each, and
 * each heartbeat carries its whole load, whichever gateway sent it. */
#define SW_MAX_GATEWAYS 8
/* SW_WORKER_QUEUE_MAX and SW_REFUSED_CODE (wire.h) bound what it holds. */
#define SW_DRAIN_TIMEOUT_MS_DEFAULT 120000

typedef struct {
    const char *gateways[SW_MAX_GATEWAYS];   /* e.g. tcp://127.0.0.1:5555 */
    size_t n_gateways;
    const char *pool;
    const char *worker_id;    /* NULL = generated: host-pid-random */
    Spillway__WorkerKind kind;
    Spillway__ModelInfo **models;
    size_t n_models;
    uint32_t slots;
    /* CURVE (docs/security.md): the worker's own keypair file (spillway
     * keygen's PREFIX.key, mode 0600) and the gateway's public key (its .pub
     * file or the Z85 text). Both NULL: a plaintext link. sw_worker_run
     * loads them and refuses to run on a bad one. */
    const char *curve_secret_file;
    const char *gateway_key;
    /* The longest a SIGTERM drain waits for the requests in hand (0: the
     * default); what is left then gets a 503. */
    uint32_t drain_timeout_ms;
} sw_worker_config;

/* Adds a repeated --gateway endpoint to list (n so far): 0, or -1 with err
 * filled (more than SW_MAX_GATEWAYS, or given twice). */
int sw_gateway_list_add(const char **list, size_t *n, const char *ep, char *err, size_t errlen);

/* Runs until SIGINT/SIGTERM (or sw_worker_stop), which drains: every
 * gateway is told at once (Heartbeat.draining) and sends nothing new; what
 * still arrives is refused with SW_REFUSED_CODE, so the gateway retries it
 * elsewhere; what the worker holds it finishes, then it disconnects. A
 * second signal, or drain_timeout_ms, ends the rest with a 503 (retried by
 * the gateway when no token was sent yet). Returns 0 on a clean stop. */
int sw_worker_run(const sw_worker_config *cfg, const sw_engine_ops *ops, void *eng);
void sw_worker_stop(void);   /* as a signal: the first drains, a second stops */
/* One log line to stderr: "[worker] <UTC timestamp> <message>". Thread-safe. */
void sw_worker_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
