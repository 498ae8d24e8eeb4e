/* The worker registry: who is connected, what they serve, how loaded they
 * are, and the choice of a worker within a pool.
 *
 * The broker thread is its only writer (under mu); HTTP threads read it
 * under mu for /healthz, /v1/models, /metrics and the /admin endpoints.
 *
 * Layer: below the router and the broker; uses metrics.h (its snapshot type),
 * ops.h (the operators' marks it holds) and proto/.
 */
#ifndef SW_GW_REGISTRY_H
#define SW_GW_REGISTRY_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "proto/wire.h"
#include "gateway/metrics.h"
#include "gateway/ops.h"
#include "gateway/policy.h"

typedef struct {
    char *name, *quant;
    uint32_t ctx;
    bool embedding;   /* serves embeddings only (ModelInfo.embedding) */
    uint32_t dim;     /* its vectors' width (ModelInfo.embedding_dim) */
} sw_wmodel;

#define SW_WORKER_RECENT 256

typedef struct sw_worker {
    uint8_t ident[256]; size_t ident_len;   /* ZeroMQ routing id */
    char id[SW_MAX_ID_LEN + 1];
    char *pool;
    int kind;                               /* Spillway__WorkerKind */
    sw_wmodel *models; size_t n_models;
    uint32_t slots;
    /* from heartbeats */
    uint32_t hb_active, hb_queued, hb_batch;
    float hb_kv;
    uint64_t hb_tokens;
    uint64_t hb_pc_queries, hb_pc_hits;     /* prefix cache since the worker started, in tokens */
    int64_t hb_ms;                          /* when its last heartbeat came */
    /* tokens/s from the heartbeats' token counts: the count and time of a
     * mark at least a second old, and the rate up to it */
    uint64_t tps_mark_tokens; int64_t tps_mark_ms; double tps;
    uint32_t inflight;                      /* requests we dispatched, not finished */
    uint64_t dispatched;                    /* requests we ever sent it (retries included) */
    int64_t last_seen_ms, last_sent_ms, registered_ms;
    /* The CURVE public key (Z85) its connection authenticated with, and the
     * allowlist's label for it; empty on a plaintext link. Its id stays
     * bound to this connection and key (broker.c's on_register). */
    char key[41];
    char key_name[64];
    /* The ids of the last SW_WORKER_RECENT requests that left this worker
     * (finished, cancelled, retried elsewhere): a late chunk for one of them
     * is normal. A frame for any other id it does not hold is a strike
     * (broker.c's on_chunk); a few strikes and it is disconnected. */
    char recent[SW_WORKER_RECENT][48];
    unsigned n_recent;                      /* entries ever written; the ring is recent[n % SW_WORKER_RECENT] */
    unsigned strikes;
    /* The worker said it is shutting down (SIGTERM): it finishes what it
     * has and takes nothing new, as if an operator had drained it. */
    bool self_draining;
    struct sw_worker *next;
} sw_worker;

typedef struct {
    pthread_mutex_t mu;      /* broker writes under it; HTTP threads read under it */
    sw_worker *head;
    int n;
    uint64_t deaths;
    sw_ops ops;              /* drained workers, cordoned pools, forced routes */
} sw_registry;

void sw_registry_init(sw_registry *r);
sw_worker *sw_registry_find(sw_registry *r, const void *ident, size_t len);
sw_worker *sw_registry_find_id(sw_registry *r, const char *id);
/* Adds or updates from a Register message. Caller holds r->mu. */
sw_worker *sw_registry_upsert(sw_registry *r, const void *ident, size_t len,
                              const Spillway__Register *reg, int64_t now);
void sw_registry_remove(sw_registry *r, sw_worker *w);   /* caller holds mu; frees w */
/* Sets w's slots to what it claims, bounded by SW_MAX_WORKER_SLOTS
 * (llm/limits.h); 0 keeps the old value. Returns false when the claim was
 * over the bound and clamped. Caller holds mu. */
bool sw_worker_set_slots(sw_worker *w, uint32_t claimed);
/* Takes a heartbeat's figures into w (caller holds mu). Returns false when
 * its slots claim was over the bound and clamped (sw_worker_set_slots). */
bool sw_worker_heartbeat(sw_worker *w, const Spillway__Heartbeat *h, int64_t now);
/* Remembers that request `id` left w; whether `id` left w lately. */
void sw_worker_note_left(sw_worker *w, const char *id);
bool sw_worker_recently_left(const sw_worker *w, const char *id);
bool sw_worker_serves(const sw_worker *w, const char *model, const char *quant);
bool sw_worker_alive(const sw_worker *w, int64_t now);
/* Requests on w as far as this gateway can tell: its own in flight, or what
 * w's last heartbeat counted (every gateway's), whichever is more. The one
 * measure of a worker's load that routing and saturation use. */
uint32_t sw_worker_load(const sw_worker *w);
/* Whether w may be given a new request: alive, not drained (by an operator
 * or by itself) and its pool not cordoned. What it already holds it
 * finishes either way. Caller holds r->mu. */
bool sw_worker_takes_new(const sw_registry *r, const sw_worker *w, int64_t now);
/* "ready", "busy", "stale", or for a worker taking nothing new "cordoned",
 * "draining" (it still holds requests) or "drained" (it is empty, safe to
 * stop). Caller holds r->mu. */
const char *sw_worker_state_name(const sw_registry *r, const sw_worker *w, int64_t now);
/* A worker among the live ones of `pool` (NULL = any) serving model/quant,
 * or NULL if none. prefix_key (sw_prefix_key; 0 = none) names the request's
 * prompt prefix: the worker that key hashes to is taken while it has a free
 * slot, so requests that share a prefix meet the worker's prefix cache.
 * Otherwise, and when that worker is full, power-of-two choices. */
sw_worker *sw_registry_pick(sw_registry *r, const char *pool, const char *model,
                            const char *quant, int64_t now, uint64_t prefix_key);
/* The routing key of a request's prompt prefix. Chat: the messages up to
 * and including the first user message (at most 1 KiB of them), which every
 * later turn of the conversation repeats. A prompt: its first 256 bytes (or
 * 64 token ids), typically its fixed preamble. Never 0. */
uint64_t sw_prefix_key(const Spillway__GenerateRequest *g);
/* Live workers of pool (NULL = any) serving model/quant, whether or not
 * they take new requests: the model is known while any is connected. */
int sw_registry_count(sw_registry *r, const char *pool, const char *model,
                      const char *quant, int64_t now);
/* What the live workers serving model say it is: SW_MODEL_UNKNOWN (none
 * is connected), SW_MODEL_GENERATE or SW_MODEL_EMBED (any one says so),
 * with the smallest context any of them registered in *ctx and the widest
 * embedding any registered in *dim (0 when unknown). Takes r->mu. */
enum { SW_MODEL_UNKNOWN, SW_MODEL_GENERATE, SW_MODEL_EMBED };
int sw_registry_model_kind(sw_registry *r, const char *model, int64_t now, uint32_t *ctx, uint32_t *dim);
/* JSON array of workers (caller frees); takes r->mu. */
char *sw_registry_json(sw_registry *r);
/* The registry's part of the status document served by GET /admin/status
 * and to SDK clients: policy version, pools with load and cordons, workers
 * with their drains, the operators' recent actions. Takes r->mu. The
 * caller adds the rest (gateway.h's sw_gw_status_json) and frees it with
 * cJSON_Delete; NULL out of memory. */
struct cJSON;
struct cJSON *sw_status_build(sw_registry *r, const sw_policy *p, int64_t started_ms);
/* The workers, the pools of p (their live workers' figures, cordons and
 * max_concurrency) and the deaths so far, for /metrics; takes r->mu. The
 * routes are the caller's to add. Free with sw_metrics_snapshot_free; out
 * of memory, the arrays are NULL and their counts 0. */
void sw_registry_snapshot(sw_registry *r, const sw_policy *p, sw_metrics_snapshot *out);

#endif
