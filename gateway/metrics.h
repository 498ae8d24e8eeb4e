/* Prometheus metrics: counters and histograms any thread may bump, and the
 * /metrics text.
 *
 * Layer: the bottom, beside util.h. It knows no registry: the worker gauges
 * come in as a snapshot (sw_registry_snapshot) the caller took.
 */
#ifndef SW_GW_METRICS_H
#define SW_GW_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#include "gateway/policy.h"

typedef enum { SW_ST_OK, SW_ST_ERROR, SW_ST_CANCELLED, SW_ST_REJECTED, SW_ST__N } sw_status_label;
typedef enum { SW_LAT_DISPATCH, SW_LAT_RELAY, SW_LAT__N } sw_lat_stage;

/* One worker as the spillway_workers gauge counts it. */
typedef enum { SW_WS_READY, SW_WS_BUSY, SW_WS_STALE } sw_worker_state;
typedef struct { char pool[64]; sw_worker_state state; } sw_metrics_worker;

void sw_metrics_init(void);
/* Pool label: pool names the policy knows, otherwise "other" (bounded). */
void sw_metrics_set_pools(const sw_policy *p);
void sw_metrics_request(const char *pool, sw_status_label st);
void sw_metrics_inflight(const char *pool, int delta);
/* A finished request's usage, as its worker reported it. */
void sw_metrics_tokens(const char *pool, uint32_t prompt, uint32_t cached, uint32_t completion);
void sw_metrics_queue(const char *pool, int delta);
void sw_metrics_overflow(const char *from, const char *to, const char *reason);
void sw_metrics_latency(sw_lat_stage stage, int64_t ns);
void sw_metrics_reload(bool ok);
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

/* The exposition text, with n workers and the death count from a registry
 * snapshot; NULL out of memory. Caller frees. */
char *sw_metrics_render(const sw_metrics_worker *w, int n, uint64_t deaths);

#endif
