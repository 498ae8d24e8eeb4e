/* Route selection: given the policy, the live workers and one request,
 * where it goes (dispatch, wait, or reject with a reason). Pure apart from
 * the route counters it keeps; the broker thread calls it under reg.mu.
 *
 * Layer: below the broker and the front door; uses the registry and the
 * policy.
 */
#ifndef SW_GW_ROUTER_H
#define SW_GW_ROUTER_H

#include <stdbool.h>
#include <stdint.h>
#include "gateway/policy.h"
#include "gateway/registry.h"

/* In-flight count and recent error rate of one route, keyed by its identity
 * (model, quantization, target) so the numbers survive a policy reload.
 * Owned by the broker thread; the list and the in-flight counts change
 * under reg.mu, so the status document may read them. */
typedef struct sw_route_stats {
    char *key;
    uint32_t inflight;
    float err_ewma;          /* exponentially weighted error rate */
    uint32_t samples;
    int64_t probe_at;        /* degraded by its error rate: when one request may next try it
                              * (0: not found degraded since its rate was last cleared) */
    float service_ms;        /* EWMA of dispatch-to-finish time, for predicted waits */
    struct sw_route_stats *next;
} sw_route_stats;

typedef struct {
    const char *model;           /* after alias resolution */
    int klass;                   /* sw_request_class */
    uint32_t prompt_tokens;      /* estimate */
    const char *api_key, *tenant;
    const char *want_target, *want_quant;   /* per-request directives, NULL = any */
    const char *exclude_worker;  /* retry: avoid this worker id */
    char **allowed_pools;        /* the client key's pools: routes elsewhere are not its; */
    size_t n_allowed_pools;      /* none = every pool */
    uint64_t prefix_key;         /* sw_prefix_key of the prompt; 0 = none */
    int64_t budget_ms;           /* max_queue_ms directive: 0 = none */
} sw_route_request;

typedef enum { SW_DECIDE_DISPATCH, SW_DECIDE_QUEUE, SW_DECIDE_REJECT } sw_decide_kind;

typedef struct {
    sw_decide_kind kind;
    int http_status;             /* REJECT: 404, 503, ... */
    char message[256];
    const char *err_type, *err_code;
    sw_worker *worker;           /* DISPATCH */
    const char *pool;            /* DISPATCH: target pool; QUEUE: pool it waits for */
    sw_route_stats *stats;       /* DISPATCH: route counter (NULL: implicit route) */
    bool probe;                  /* DISPATCH: the request that tries a route degraded by its error
                                  * rate; hand it back with its outcome */
    bool spilled;
    const char *spill_from, *spill_reason;
} sw_decision;

/* The counter of route r in the list at *head, added (zeroed) if new;
 * NULL out of memory. */
sw_route_stats *sw_route_stats_get(sw_route_stats **head, const sw_route *r);
/* Frees the whole list sw_route_stats_get built. */
void sw_route_stats_free(sw_route_stats *head);
/* A request's end on its route, an error or not; probe as its decision
 * said. A probe that succeeds clears the route's error rate. */
void sw_route_stats_outcome(sw_route_stats *s, bool error, bool probe);
void sw_route_stats_service(sw_route_stats *s, int64_t ms);
void sw_route_decide(const sw_policy *p, sw_registry *reg, sw_route_stats **stats,
                     const sw_route_request *rq, int64_t now, sw_decision *out);
/* One object per route of p appended to the JSON array arr, for the status
 * document: its name ("model@pool"), target, priority, max_concurrency,
 * in-flight count, recent error rate and whether an operator forced it onto
 * its overflow (by whom, why). Caller holds reg->mu. */
struct cJSON;
void sw_route_status(const sw_policy *p, const sw_registry *reg, sw_route_stats *head, struct cJSON *arr);
/* Each route of p, named "model@pool", with its in-flight count and
 * max_concurrency, into out (at most max); returns how many. Caller holds
 * reg->mu (where the counts change). */
int sw_route_metrics(const sw_policy *p, sw_route_stats *head, sw_metrics_route *out, int max);
/* True if the policy routes the model (after alias resolution). */
bool sw_policy_has_model(const sw_policy *p, const char *model);

#endif
