/* Prometheus metrics: counters and histograms any thread may bump, and the
 * /metrics text.
 *
 * Layer: the bottom, beside util.h. It knows no registry: the worker gauges
 * come in as a snapshot (sw_registry_snapshot) the caller took.
 */
#ifndef SW_GW_METRICS_H
#define SW_GW_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "gateway/policy.h"
#include "gateway/util.h"

typedef enum { SW_ST_OK, SW_ST_ERROR, SW_ST_CANCELLED, SW_ST_REJECTED, SW_ST__N } sw_status_label;
typedef enum { SW_LAT_DISPATCH, SW_LAT_RELAY, SW_LAT__N } sw_lat_stage;

/* One worker as the registry saw it (sw_registry_snapshot): state is what
 * the spillway_workers gauge counts, the rest its spillway_worker_* gauges. */
typedef enum { SW_WS_READY, SW_WS_BUSY, SW_WS_STALE } sw_worker_state;
typedef struct {
    char id[132], pool[64];
    sw_worker_state state;
    bool healthy;                 /* heartbeating (not stale) */
    bool drained;                 /* takes nothing new: an operator's drain or its own SIGTERM */
    uint32_t running, waiting, slots, batch;   /* its last heartbeat */
    float kv;                     /* 0..1 */
    double prefix_hit_rate;       /* hits / queries since it started; < 0 before any lookup */
    double tokens_per_s;          /* generated, from its heartbeats' token counts */
    double heartbeat_age_s;
} sw_metrics_worker;

/* A pool of the policy: its live workers' figures and its settings. */
typedef struct {
    char name[64];
    uint32_t healthy, slots, inflight, max_concurrency;   /* max 0: unlimited */
    bool cordoned;
} sw_metrics_pool;

/* A route of the policy ("model@pool") and the gateway's in-flight on it. */
typedef struct {
    char name[160];
    uint32_t inflight, max_concurrency;   /* max 0: unlimited */
} sw_metrics_route;

/* What /metrics shows of the registry and the routes, copied under their
 * locks by the caller (gateway.h's sw_gw_metrics_text), so that rendering
 * never holds both the registry's lock and the metrics' one. */
typedef struct {
    sw_metrics_worker *workers; int n_workers;
    sw_metrics_pool *pools; int n_pools;
    sw_metrics_route *routes; int n_routes;
    uint64_t deaths;
    int64_t now_ms;               /* sw_now_ms(): the cost window's clock */
} sw_metrics_snapshot;
void sw_metrics_snapshot_free(sw_metrics_snapshot *s);

/* ---- histograms (public for the unit test) ----
 * Prometheus' cumulative buckets are kept as plain counts per bucket: b[i]
 * counts observations in (bounds[i-1], bounds[i]], b[n] those above the
 * last bound; rendering adds them up. */
#define SW_HIST_MAX_BOUNDS 24
typedef struct { uint64_t b[SW_HIST_MAX_BOUNDS + 1]; double sum; uint64_t count; } sw_hist;
/* Counts v (NaN or negative counts as 0) against n ascending bounds. */
void sw_hist_observe(sw_hist *h, const double *bounds, size_t n, double v);
/* Appends NAME_bucket{LABELS,le=...} for every bound and +Inf, NAME_sum and
 * NAME_count. labels: 'k="v",...' or "" for none. */
void sw_hist_put(sw_sbuf *b, const char *name, const char *labels, const sw_hist *h,
                 const double *bounds, size_t n);

/* ---- the price of a pool's tokens over a recent window ---- */
#define SW_COST_WINDOW_S 300
#define SW_COST_SLOT_S 10
#define SW_COST_SLOTS (SW_COST_WINDOW_S / SW_COST_SLOT_S)
typedef struct {
    int64_t slot[SW_COST_SLOTS];  /* 1 + the slot number (now / SW_COST_SLOT_S) each entry holds; 0 = none */
    double dollars[SW_COST_SLOTS];
    uint64_t tokens[SW_COST_SLOTS];
} sw_cost_window;
void sw_cost_window_add(sw_cost_window *w, int64_t now_ms, double dollars, uint64_t tokens);
/* Dollars per million tokens over the last SW_COST_WINDOW_S seconds (the
 * slots within it); < 0 when no token was costed in that time. */
double sw_cost_window_per_mtok(const sw_cost_window *w, int64_t now_ms);

void sw_metrics_init(void);
/* Pool label: pool names the policy knows, otherwise "other"; model label:
 * models its routes name (or aliases), otherwise "other" (bounded). The
 * pools' prices (cost_per_hour) are the policy's too. */
void sw_metrics_set_pools(const sw_policy *p);
void sw_metrics_request(const char *pool, sw_status_label st);
void sw_metrics_inflight(const char *pool, int delta);
/* A finished request's usage, as its worker reported it. */
void sw_metrics_tokens(const char *pool, uint32_t prompt, uint32_t cached, uint32_t completion);
void sw_metrics_queue(const char *pool, int delta);
void sw_metrics_overflow(const char *from, const char *to, const char *reason);
void sw_metrics_latency(sw_lat_stage stage, int64_t ns);
void sw_metrics_reload(bool ok);

/* ---- per request, per pool and model (gateway/access.c, from the broker) ---- */
typedef enum { SW_H_TTFT, SW_H_ITL, SW_H_DURATION, SW_H_QUEUE_WAIT, SW_H__N } sw_hist_kind;
void sw_metrics_observe(sw_hist_kind k, const char *pool, const char *model, double seconds);
/* A finished request's worker time and what it cost (0 for a pool without
 * a price); tokens: its prompt + completion tokens, for $/M tokens. */
void sw_metrics_cost(const char *pool, double worker_s, double dollars, uint64_t tokens, int64_t now_ms);
/* The pool's live $/M tokens (sw_cost_window_per_mtok); < 0 without a
 * price or without costed tokens lately. */
double sw_metrics_dollars_per_mtok(const char *pool, int64_t now_ms);
/* ---- CURVE authentication (gateway/zap.c, broker.c's registration) ----
 * A connection the ZAP handler refused (sdk: the SDK endpoint, else the
 * worker endpoint); reason: "unlisted_key", "not_curve" or "revoked". */
void sw_metrics_auth_refused(bool sdk, const char *reason);
/* A Register the broker refused; reason: "pool_not_allowed", "id_in_use"
 * or "key_revoked". */
void sw_metrics_registration_refused(const char *reason);

/* ---- workers the broker distrusts (broker.c) ----
 * Something a worker sent that the broker refused; reason: "over_max_tokens"
 * or "oversize" (a response cut off), "too_many_slots" (a claim clamped),
 * "invalid_frame" or "unknown_request" (frames that disconnect it). */
void sw_metrics_worker_violation(const char *reason);

/* The exposition text, with the snapshot's gauges; NULL out of memory.
 * Caller frees. */
char *sw_metrics_render(const sw_metrics_snapshot *s);

#endif
