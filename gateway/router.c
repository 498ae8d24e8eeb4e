/* Route selection: the one place that decides where a request goes.
 *
 * Given the policy, the live workers and the request, it returns a decision:
 * dispatch to (pool, worker), wait in the queue, or reject with a reason.
 * Order: the first primary route with capacity; when every primary route is
 * saturated (in-flight >= the route's or its pool's max_concurrency, or
 * every worker holds its reported slots plus WORKER_QUEUE_SLACK) or
 * degraded (no healthy worker, or its recent error rate is above the policy
 * threshold), the first overflow route with capacity, and the spill is
 * reported. A route degraded by its error rate is tried by one request every
 * ERR_PROBE_MS, and one success restores it.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <stdio.h>
#include <cjson/cJSON.h>
#include "gateway/router.h"

#define ERR_MIN_SAMPLES 10      /* don't call a route degraded on a handful of requests */
#define ERR_EWMA_ALPHA 0.1f
/* How long a route degraded by its error rate gets no request before one
 * tries it again (half-open, as a circuit breaker). Its errors may have had
 * a cause that is gone: a worker that died mid-stream and registered again,
 * a model reloaded. Without a probe nothing would update the rate again,
 * and the route would stay degraded for as long as the gateway runs. A
 * failed probe costs its client a retry elsewhere (before the first token). */
#define ERR_PROBE_MS 5000

static void route_key(char *key, size_t n, const sw_route *r)
{
    snprintf(key, n, "%s\x1f%s\x1f%s", r->model, r->quantization ? r->quantization : "", r->target);
}

static sw_route_stats *stats_find(sw_route_stats *head, const char *key)
{
    for (sw_route_stats *s = head; s; s = s->next)
        if (strcmp(s->key, key) == 0) return s;
    return NULL;
}

sw_route_stats *sw_route_stats_get(sw_route_stats **head, const sw_route *r)
{
    char key[512];
    route_key(key, sizeof key, r);
    sw_route_stats *s = stats_find(*head, key);
    if (s) return s;
    s = calloc(1, sizeof *s);
    if (s) s->key = strdup(key);
    if (!s || !s->key) {
        free(s);
        return NULL;
    }
    s->next = *head;
    *head = s;
    return s;
}

void sw_route_stats_free(sw_route_stats *head)
{
    while (head) {
        sw_route_stats *next = head->next;
        free(head->key);
        free(head);
        head = next;
    }
}

void sw_route_stats_outcome(sw_route_stats *s, bool error, bool probe)
{
    if (!s) return;
    if (probe && !error) {   /* the route works again: judge it afresh */
        s->err_ewma = 0;
        s->samples = 0;
        s->probe_at = 0;
        return;
    }
    /* (service time is fed separately, by sw_route_stats_service) */
    s->err_ewma += ERR_EWMA_ALPHA * ((error ? 1.0f : 0.0f) - s->err_ewma);
    if (s->samples < 1000000) s->samples++;
}

void sw_route_stats_service(sw_route_stats *s, int64_t ms)
{
    if (!s) return;
    s->service_ms = s->service_ms <= 0 ? (float)ms : s->service_ms + 0.2f * ((float)ms - s->service_ms);
}

bool sw_policy_has_model(const sw_policy *p, const char *model)
{
    for (size_t i = 0; i < p->n_routes; i++)
        if (strcmp(p->routes[i].model, model) == 0) return true;
    return false;
}

static bool in_list(char **list, size_t n, const char *v)
{
    if (n == 0) return true;
    if (!v) return false;
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i], v) == 0) return true;
    return false;
}

static bool route_matches(const sw_route *r, const sw_route_request *rq)
{
    if (strcmp(r->model, rq->model) != 0) return false;
    /* A request that names no class is interactive, as an OpenAI client expects. */
    int klass = rq->klass != SW_CLASS_ANY ? rq->klass : SW_CLASS_INTERACTIVE;
    if (r->match_class != SW_CLASS_ANY && (int)r->match_class != klass) return false;
    if (rq->prompt_tokens < r->match_min_prompt_tokens) return false;
    if (r->match_max_prompt_tokens && rq->prompt_tokens > r->match_max_prompt_tokens) return false;
    if (!in_list(r->match_api_keys, r->n_match_api_keys, rq->api_key)) return false;
    if (!in_list(r->match_tenants, r->n_match_tenants, rq->tenant)) return false;
    if (rq->want_target && strcmp(rq->want_target, r->target) != 0) return false;
    if (rq->want_quant && r->quantization && strcasecmp(rq->want_quant, r->quantization) != 0)
        return false;
    return true;
}

/* True when the client's key may use pool (router.h: allowed_pools). */
static bool key_allows(const sw_route_request *rq, const char *pool)
{
    return in_list(rq->allowed_pools, rq->n_allowed_pools, pool);
}

static const char *route_quant(const sw_route *r, const sw_route_request *rq)
{
    return r->quantization ? r->quantization : rq->want_quant;
}

/* Picks a worker, avoiding rq->exclude_worker when another one exists. */
static sw_worker *pick(sw_registry *reg, const char *pool, const sw_route_request *rq,
                       const char *quant, int64_t now)
{
    sw_worker *w = sw_registry_pick(reg, pool, rq->model, quant, now, rq->prefix_key);
    if (w && rq->exclude_worker && strcmp(w->id, rq->exclude_worker) == 0) {
        for (int i = 0; i < 8; i++) {   /* without the prefix key: it named the excluded one */
            sw_worker *o = sw_registry_pick(reg, pool, rq->model, quant, now, 0);
            if (o && strcmp(o->id, rq->exclude_worker) != 0) return o;
        }
        for (sw_worker *o = reg->head; o; o = o->next)
            if ((!pool || !strcmp(o->pool, pool)) && sw_worker_takes_new(reg, o, now) &&
                sw_worker_serves(o, rq->model, quant) && strcmp(o->id, rq->exclude_worker) != 0)
                return o;
        return NULL;   /* the excluded worker is the only one: treat as degraded */
    }
    return w;
}

/* Requests a worker may hold beyond its slots: enough that a freed slot is
 * refilled without a round trip to the gateway, small enough that the
 * waiting happens in the gateway's queue, where queue_length and
 * queue_timeout_ms apply and another worker may take it. The worker itself
 * refuses past the same bound (worker_link.h), which is what holds with
 * several gateways, whose views of each other lag by a heartbeat. */
#define WORKER_QUEUE_SLACK SW_WORKER_QUEUE_MAX

/* True when w can take another request: its load (ours, or every gateway's
 * as its heartbeat says) is below the slots it reports (bounded by the
 * registry) plus the slack. */
static bool has_room(const sw_worker *w)
{
    return sw_worker_load(w) < w->slots + WORKER_QUEUE_SLACK;
}

/* w when it has room, else the least-loaded worker of the pool that serves
 * the request and has room, else NULL: the pool is at capacity. */
static sw_worker *with_room(sw_registry *reg, sw_worker *w, const char *pool,
                            const sw_route_request *rq, const char *quant, int64_t now)
{
    if (!w || has_room(w)) return w;
    sw_worker *best = NULL;
    for (sw_worker *o = reg->head; o; o = o->next)
        if ((!pool || !strcmp(o->pool, pool)) && sw_worker_takes_new(reg, o, now) && has_room(o) &&
            sw_worker_serves(o, rq->model, quant) &&
            !(rq->exclude_worker && !strcmp(o->id, rq->exclude_worker)) &&
            (!best || (uint64_t)sw_worker_load(o) * best->slots < (uint64_t)sw_worker_load(best) * o->slots))
            best = o;
    return best;
}

/* True when the pool's own max_concurrency (routes.yaml, pools:) is reached
 * by what is in flight on its workers, whatever route sent it. */
static bool pool_at_limit(const sw_policy *p, sw_registry *reg, const char *pool, int64_t now)
{
    const sw_pool_def *pd = sw_policy_pool(p, pool);
    if (!pd || !pd->max_concurrency) return false;
    uint64_t n = 0;
    for (sw_worker *w = reg->head; w; w = w->next)
        if (!strcmp(w->pool, pool) && sw_worker_alive(w, now)) n += w->inflight;
    return n >= pd->max_concurrency;
}

/* Why a route cannot take a request; the name is the spill's reason label.
 * The last three are operators' doing (ops.h): a primary route forced onto
 * its overflow, its pool cordoned, or every live worker of it drained. */
typedef enum { RS_OK, RS_SATURATED, RS_DEGRADED, RS_QUEUE_WAIT, RS_FORCED, RS_CORDONED, RS_DRAINED } route_state;
static const char *state_reason[] = {"ok", "saturated", "degraded", "queue_wait", "forced", "cordoned", "drained"};

/* Predicted wait before a request sent to w starts: the requests ahead of
 * it beyond the worker's slots, each taking the route's typical service
 * time, spread over the slots. 0 when a slot is free or nothing is known. */
static int64_t predicted_wait_ms(const sw_worker *w, const sw_route_stats *st)
{
    if (!st || st->service_ms <= 0 || !w->slots) return 0;
    uint32_t busy = w->inflight > w->hb_active + w->hb_queued ? w->inflight : w->hb_active + w->hb_queued;
    if (busy < w->slots) return 0;
    return (int64_t)((busy - w->slots + 1) * st->service_ms / w->slots);
}

/* True when the pool has live workers for the model but none takes new
 * requests: they are drained, not dead. */
static bool all_drained(sw_registry *reg, const char *pool, const char *model, const char *quant, int64_t now)
{
    return sw_registry_count(reg, pool, model, quant, now) > 0 &&
           !sw_registry_pick(reg, pool, model, quant, now, 0);
}

/* The implicit route's choice: a worker of the model (*w) and one with a
 * free slot (*roomy), among the pools the client's key may use. */
static void implicit_pick(sw_registry *reg, const sw_route_request *rq, int64_t now, sw_worker **w,
                          sw_worker **roomy)
{
    size_t n = rq->n_allowed_pools ? rq->n_allowed_pools : 1;
    for (size_t i = 0; i < n && !*roomy; i++) {
        const char *pool = rq->n_allowed_pools ? rq->allowed_pools[i] : rq->want_target;
        if (rq->want_target && strcmp(pool, rq->want_target) != 0) continue;
        sw_worker *c = pick(reg, pool, rq, rq->want_quant, now);
        if (!*w) *w = c;
        *roomy = with_room(reg, c, pool, rq, rq->want_quant, now);
    }
}

/* RS_DEGRADED while st's recent error rate is above the threshold, except
 * once every ERR_PROBE_MS: then RS_OK with *probe set. */
static route_state error_gate(const sw_policy *p, sw_route_stats *st, int64_t now, bool *probe)
{
    if (!st) return RS_OK;
    if (st->samples < ERR_MIN_SAMPLES || p->defaults.error_rate_threshold <= 0 ||
        st->err_ewma <= p->defaults.error_rate_threshold) {
        st->probe_at = 0;   /* not degraded (again): a later trip waits its full interval */
        return RS_OK;
    }
    if (!st->probe_at) st->probe_at = now + ERR_PROBE_MS;   /* found degraded: the first probe's time */
    if (now < st->probe_at) return RS_DEGRADED;
    *probe = true;
    return RS_OK;
}

static route_state check_route(const sw_policy *p, sw_registry *reg, sw_route_stats **stats,
                               const sw_route *r, const sw_route_request *rq, int64_t now,
                               sw_worker **w_out, sw_route_stats **st_out, bool *probe)
{
    sw_route_stats *st = sw_route_stats_get(stats, r);
    *st_out = st;
    if (r->priority == SW_PRIO_PRIMARY && sw_ops_route_forced(&reg->ops, r->model, r->target)) return RS_FORCED;
    if (sw_ops_find(&reg->ops, SW_OPS_CORDON, r->target)) return RS_CORDONED;
    sw_worker *w = pick(reg, r->target, rq, route_quant(r, rq), now);
    if (!w) return all_drained(reg, r->target, rq->model, route_quant(r, rq), now) ? RS_DRAINED : RS_DEGRADED;
    if (error_gate(p, st, now, probe) != RS_OK) return RS_DEGRADED;
    if (r->max_concurrency && st && st->inflight >= r->max_concurrency) return RS_SATURATED;
    if (pool_at_limit(p, reg, r->target, now)) return RS_SATURATED;
    if (!(w = with_room(reg, w, r->target, rq, route_quant(r, rq), now))) return RS_SATURATED;
    if (rq->budget_ms > 0 && predicted_wait_ms(w, st) > rq->budget_ms) return RS_QUEUE_WAIT;
    if (*probe) st->probe_at = now + ERR_PROBE_MS;   /* this request is the probe: the next one's time */
    *w_out = w;
    return RS_OK;
}

static void reject(sw_decision *d, int status, const char *type, const char *code, const char *fmt,
                   const char *arg)
{
    d->kind = SW_DECIDE_REJECT;
    d->http_status = status;
    d->err_type = type;
    d->err_code = code;
    snprintf(d->message, sizeof d->message, fmt, arg);
}

/* The 503 when no route can take the request; when an operator's action is
 * why (a forced, cordoned or drained primary), the message says so. */
static void reject_unavailable(sw_decision *d, const char *model, const char *pool, const char *reason)
{
    reject(d, 503, "server_error", "no_worker_available", "no healthy worker serves model '%s' right now", model);
    if (reason && strcmp(reason, "degraded") != 0)
        snprintf(d->message, sizeof d->message, "no worker can take model '%s' right now (%s: %s, and no "
                 "overflow route has a worker)", model, pool, reason);
}

/* No route names the model: serve it from any worker that registered it
 * (an implicit route), so a policy need not list every model. */
static void decide_implicit(sw_registry *reg, const sw_route_request *rq, int64_t now, sw_decision *d)
{
    sw_worker *w = NULL, *roomy = NULL;
    implicit_pick(reg, rq, now, &w, &roomy);
    if (roomy) {
        d->kind = SW_DECIDE_DISPATCH;
        d->worker = roomy;
        d->pool = roomy->pool;
        return;
    }
    if (w) {   /* its workers are full: wait in the queue for a slot */
        d->kind = SW_DECIDE_QUEUE;
        d->pool = w->pool;
        snprintf(d->message, sizeof d->message, "every worker for model '%s' is at capacity", rq->model);
        return;
    }
    bool registered = sw_registry_count(reg, NULL, rq->model, NULL, now) > 0;
    if (registered && rq->n_allowed_pools)
        reject(d, 403, "permission_error", "route_not_allowed",
               "this API key may not use any pool that serves model '%s'", rq->model);
    else if (registered)
        reject(d, 503, "server_error", "no_capacity",
               "no worker for model '%s' matches the requested target/quantization", rq->model);
    else
        reject(d, 404, "invalid_request_error", "model_not_found", "The model '%s' does not exist", rq->model);
}

void sw_route_decide(const sw_policy *p, sw_registry *reg, sw_route_stats **stats,
                     const sw_route_request *rq, int64_t now, sw_decision *d)
{
    memset(d, 0, sizeof *d);
    bool any_route = false, any_match = false, any_saturated = false, key_refused = false;
    const char *blocked_pool = NULL, *blocked_reason = NULL, *first_pool = NULL;

    for (int pass = 0; pass < 2; pass++) {
        sw_route_priority want = pass == 0 ? SW_PRIO_PRIMARY : SW_PRIO_OVERFLOW;
        for (size_t i = 0; i < p->n_routes; i++) {
            const sw_route *r = &p->routes[i];
            if (strcmp(r->model, rq->model) == 0) any_route = true;
            if (r->priority != want || !route_matches(r, rq)) continue;
            if (!key_allows(rq, r->target)) {
                key_refused = true;
                continue;
            }
            any_match = true;
            if (!first_pool) first_pool = r->target;
            sw_worker *w = NULL;
            sw_route_stats *st = NULL;
            bool probe = false;
            route_state rs = check_route(p, reg, stats, r, rq, now, &w, &st, &probe);
            if (rs == RS_OK) {
                d->kind = SW_DECIDE_DISPATCH;
                d->worker = w;
                d->pool = r->target;
                d->stats = st;
                d->probe = probe;
                if (pass == 1 && blocked_pool) {
                    d->spilled = true;
                    d->spill_from = blocked_pool;
                    d->spill_reason = blocked_reason;
                }
                return;
            }
            if (rs == RS_SATURATED || rs == RS_QUEUE_WAIT) any_saturated = true;
            if (pass == 0 && !blocked_pool) {
                blocked_pool = r->target;
                blocked_reason = state_reason[rs];
            }
        }
    }

    if (!any_route) {
        decide_implicit(reg, rq, now, d);
        return;
    }
    if (!any_match && key_refused) {
        reject(d, 403, "permission_error", "route_not_allowed",
               "this API key may not use any pool that routes model '%s'", rq->model);
        return;
    }
    if (!any_match) {
        reject(d, 400, "invalid_request_error", "no_matching_route",
               "no route for model '%s' matches this request (target, quantization, priority, "
               "prompt size, API key or tenant)", rq->model);
        return;
    }
    if (any_saturated) {
        /* Some route has healthy workers but no free capacity: wait for it. */
        d->kind = SW_DECIDE_QUEUE;
        d->pool = first_pool;
        snprintf(d->message, sizeof d->message, "all routes for model '%s' are at capacity", rq->model);
        return;
    }
    reject_unavailable(d, rq->model, blocked_pool, blocked_reason);
}

int sw_route_metrics(const sw_policy *p, sw_route_stats *head, sw_metrics_route *out, int max)
{
    int n = 0;
    for (size_t i = 0; i < p->n_routes && n < max; i++) {
        const sw_route *r = &p->routes[i];
        char key[512];
        route_key(key, sizeof key, r);
        const sw_route_stats *st = stats_find(head, key);
        snprintf(out[n].name, sizeof out[n].name, "%s@%s", r->model, r->target);
        out[n].inflight = st ? st->inflight : 0;
        out[n].max_concurrency = r->max_concurrency;
        n++;
    }
    return n;
}

void sw_route_status(const sw_policy *p, const sw_registry *reg, sw_route_stats *head, struct cJSON *arr)
{
    for (size_t i = 0; i < p->n_routes; i++) {
        const sw_route *r = &p->routes[i];
        char key[512], name[512];
        route_key(key, sizeof key, r);
        snprintf(name, sizeof name, "%s@%s", r->model, r->target);
        const sw_route_stats *st = stats_find(head, key);
        const sw_ops_mark *f = sw_ops_find(&reg->ops, SW_OPS_FORCE, name);
        if (!f) f = sw_ops_find(&reg->ops, SW_OPS_FORCE, r->model);
        bool forced = f && r->priority == SW_PRIO_PRIMARY;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", name);
        cJSON_AddStringToObject(o, "model", r->model);
        cJSON_AddStringToObject(o, "target", r->target);
        if (r->quantization) cJSON_AddStringToObject(o, "quantization", r->quantization);
        cJSON_AddBoolToObject(o, "overflow", r->priority == SW_PRIO_OVERFLOW);
        cJSON_AddNumberToObject(o, "max_concurrency", r->max_concurrency);
        cJSON_AddNumberToObject(o, "inflight", st ? st->inflight : 0);
        cJSON_AddNumberToObject(o, "error_rate", st ? st->err_ewma : 0);
        cJSON_AddBoolToObject(o, "forced_overflow", forced);
        if (forced) {
            cJSON_AddStringToObject(o, "forced_by", f->by);
            cJSON_AddStringToObject(o, "reason", f->reason);
        }
        cJSON_AddItemToArray(arr, o);
    }
}
