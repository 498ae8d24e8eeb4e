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
 */
#ifndef SW_WORKER_LINK_H
#define SW_WORKER_LINK_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include "wire.h"

typedef struct {
    uint32_t active, queued, slots, batch_size;
    float kv_utilization;
    uint64_t tokens_generated;
} sw_load;

/* Called by the engine (on the compute thread) for every output chunk.
 * finish: a Spillway__FinishReason; FINISH_NONE while more follow. Usage
 * counts are read only on the final chunk. */
typedef void (*sw_emit_fn)(void *emit_ctx, const char *request_id, const char *text,
                           const uint32_t *ids, size_t n_ids, int finish,
                           uint32_t prompt_tokens, uint32_t completion_tokens);
/* Called by the engine to fail a request it had accepted (e.g. prompt too long). */
typedef void (*sw_fail_fn)(void *emit_ctx, const char *request_id, uint32_t code, const char *msg);

typedef struct {
    /* Accepts a request (copy what you need: req is freed after the call).
     * Returns 0, or an HTTP-like error code (400, 404, 503) with err filled. */
    int (*submit)(void *eng, const Spillway__GenerateRequest *req, char *err, size_t errlen);
    /* Stops a request and frees its slot; emits nothing. Unknown ids are ignored. */
    void (*cancel)(void *eng, const char *request_id);
    /* One scheduler iteration (a prefill chunk and/or one decode step).
     * Returns the number of requests still running or queued; 0 = idle. */
    int (*step)(void *eng, sw_emit_fn emit, sw_fail_fn fail, void *emit_ctx);
    void (*load)(void *eng, sw_load *out);
} sw_engine_ops;

typedef struct {
    const char *gateway;      /* e.g. tcp://127.0.0.1:5555 */
    const char *pool;
    const char *worker_id;    /* NULL = generated: host-pid-random */
    Spillway__WorkerKind kind;
    Spillway__ModelInfo **models;
    size_t n_models;
    uint32_t slots;
} sw_worker_config;

/* Runs until SIGINT/SIGTERM (or sw_worker_stop). Returns 0 on a clean stop. */
int sw_worker_run(const sw_worker_config *cfg, const sw_engine_ops *ops, void *eng);
void sw_worker_stop(void);

#endif
