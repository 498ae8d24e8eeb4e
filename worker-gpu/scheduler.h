/* The GPU worker's engine: continuous batching over a paged KV cache, the
 * same code whichever backend (cuda or emulate) computes the steps.
 *
 * Every step() is one iteration of the scheduler:
 *   1. admit waiting requests (oldest first) while there is room in the
 *      running set and the free KV blocks cover the request's tokens;
 *   2. give every running sequence that is decoding its one token, then fill
 *      what is left of the per-step token budget with prefill chunks (oldest
 *      first): long prompts are prefilled in chunks, interleaved with decode;
 *   3. when a decoding sequence needs a KV block and none is free, preempt the
 *      newest running request: free its blocks and put it back in the queue;
 *      it is recomputed later (prompt + tokens generated so far re-prefilled),
 *      so its output is the same as if it had never been preempted;
 *   4. run one forward pass over the whole batch, sample, stream text.
 * Requests join and leave at every step boundary.
 *
 * Prefix cache: every full KV block is named by a hash of the tokens up to
 * its end. A sequence that starts (or restarts after preemption) shares the
 * blocks of its longest cached prefix instead of computing them; freed
 * blocks keep their contents until the allocator hands them out again, the
 * longest-freed first. */
#ifndef SW_GPU_SCHEDULER_H
#define SW_GPU_SCHEDULER_H

#include <stdbool.h>
#include "proto/worker_link.h"
#include "llm/model.h"
#include "worker-gpu/backend.h"

typedef struct {
    int max_batch;            /* running sequences at most (default 64) */
    int max_tokens_per_step;  /* token budget of one step (default: the backend's limit) */
    int n_ctx;                /* per-sequence context (0 = model's, capped by the KV pool) */
    int max_queue;            /* waiting requests before submit answers 503 (default 1024) */
    const char *model_name;   /* requests for another model get 404; NULL = accept any */
    bool log_steps;           /* one stderr line per second while busy */
} sw_sched_config;

typedef struct sw_gpu_engine sw_gpu_engine;

/* The engine uses (does not own) the model (tokenizer, chat template) and
 * the backend. */
sw_gpu_engine *sw_gpu_engine_new(const sw_model *m, sw_backend *be, const sw_sched_config *cfg,
                                 char *err, size_t errlen);
void sw_gpu_engine_free(sw_gpu_engine *e);
int sw_gpu_engine_n_ctx(const sw_gpu_engine *e);
/* The prefix cache is on by default. */
void sw_gpu_engine_set_prefix_cache(sw_gpu_engine *e, bool on);
/* Checks the block accounting (reference counts against what sequences
 * hold, the free list, the cache table). Returns 0, or -1 with err. For tests. */
int sw_gpu_engine_check(const sw_gpu_engine *e, char *err, size_t errlen);
/* Requests preempted so far (for tests and logs). */
uint64_t sw_gpu_engine_preemptions(const sw_gpu_engine *e);

extern const sw_engine_ops sw_gpu_engine_ops;

#endif
