/* The CPU engine: a loaded model plus N sequence slots, driven one scheduler
 * iteration at a time through sw_engine_ops (proto/worker_link.h). Used by the
 * worker daemon; spillway-run drives the same model code directly. */
#ifndef SW_CPU_ENGINE_H
#define SW_CPU_ENGINE_H

#include "proto/worker_link.h"
#include "llm/model.h"
#include "worker-cpu/attention.h"

typedef struct sw_cpu_engine sw_cpu_engine;

/* n_parallel: sequences computed at once (--parallel); n_cache: KV caches
 * kept for the prefix cache (--cache-slots; at least n_parallel, 0 = as many);
 * n_ctx: per-slot context (0 = model's, capped). */
sw_cpu_engine *sw_cpu_engine_new(sw_model *m, int n_parallel, int n_cache, int n_ctx, char *err, size_t errlen);
void sw_cpu_engine_free(sw_cpu_engine *e);
/* The per-slot context length it was sized with (what a request may use). */
int sw_cpu_engine_n_ctx(const sw_cpu_engine *e);
/* The prefix cache (engine.c) is on by default; off, every prompt is
 * prefilled in full. */
void sw_cpu_engine_set_prefix_cache(sw_cpu_engine *e, bool on);
/* The KV caches' element type (--kv-cache; attention.h): f16 by default,
 * set before the first request. -1 with err filled where the model does
 * not allow it or memory cannot be had (the caches stay as they were). */
int sw_cpu_engine_set_kv_type(sw_cpu_engine *e, sw_kv_type t, char *err, size_t errlen);
extern const sw_engine_ops sw_cpu_engine_ops;

/* Test mode (--test-echo): no compute; emits max_tokens tokens per request at
 * `tokens_per_s` per sequence, so the gateway can be tested at scale. */
typedef struct sw_echo_engine sw_echo_engine;
sw_echo_engine *sw_echo_engine_new(double tokens_per_s, int n_slots);
void sw_echo_engine_free(sw_echo_engine *e);
extern const sw_engine_ops sw_echo_engine_ops;
/* Test mode only (--test-fail-rate): refuses this fraction of requests with a
 * 500 error, spread evenly, so gateway error handling can be tested. */
void sw_echo_engine_set_fail_rate(sw_echo_engine *e, double rate);

#endif
