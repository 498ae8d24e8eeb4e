/* Prometheus text metrics. Labels stay bounded: pool labels are names the
 * policy defines (anything else becomes "other"), statuses and overflow
 * reasons are fixed sets.
 *
 * spillway_gateway_added_latency_seconds{stage} is the time the gateway itself
 * spends, not the model:
 *   stage="dispatch": from the moment the whole request body has been received
 *     (last access-handler call) to the moment the broker hands the encoded
 *     GenerateRequest to zmq_send — parsing, validation, routing, queue hops.
 *     Time a request waits in the capacity queue is NOT included (it is a
 *     policy decision, reported through spillway_queue_depth instead).
 *   stage="relay": for every relayed piece of a stream, from the broker
 *     receiving a TokenChunk off the worker socket to the content reader
 *     handing the SSE bytes to libmicrohttpd (for a non-streaming request:
 *     from the final chunk to the response being queued).
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <stdio.h>
#include "gateway/metrics.h"
#include "gateway/util.h"

#define MAX_POOLS 64
#define MAX_MODELS 64
#define MAX_OVERFLOW 256
#define MAX_SERIES 256     /* (pool, model) pairs with request histograms */

typedef struct {
    char name[64];
    uint64_t req[SW_ST__N];
    int64_t inflight, queue;                                 /* gauges */
    int64_t tok_prompt, tok_cached, tok_completion;          /* counters */
    bool has_cost;                                           /* the policy gives it a price */
    double worker_s, dollars;                                /* counters */
    sw_cost_window win;
} pool_m;

/* The request histograms of one (pool, model). */
typedef struct { char pool[64], model[64]; sw_hist h[SW_H__N]; } series_m;

typedef struct { char from[64], to[64], reason[32]; uint64_t n; } overflow_m;

static const double lat_bounds[] = {25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3,
                                    5e-3, 10e-3, 25e-3, 100e-3};
#define NB (sizeof lat_bounds / sizeof lat_bounds[0])
typedef sw_hist hist_m;

/* LLM serving spans a millisecond (a dispatch, a queue skipped) to minutes
 * (a long generation on a CPU): time to first token, end to end and queue
 * wait share these bounds. Inter-token gaps are a GPU's few ms to a loaded
 * CPU's seconds. */
static const double req_bounds[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                    10, 20, 30, 60, 120, 300, 600};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                    0.25, 0.5, 1, 2.5, 5, 10};
#define N_REQ_BOUNDS (sizeof req_bounds / sizeof *req_bounds)
#define N_ITL_BOUNDS (sizeof itl_bounds / sizeof *itl_bounds)
static const struct { const char *name, *help; } HIST[SW_H__N] = {
    [SW_H_TTFT] = {"spillway_time_to_first_token_seconds",
                   "Request arrival at the gateway to its first token arriving from the worker, by serving pool and model."},
    [SW_H_ITL] = {"spillway_inter_token_latency_seconds",
                  "Time between successive tokens of a request (a gap over n tokens counts n times its 1/n)."},
    [SW_H_DURATION] = {"spillway_request_duration_seconds",
                       "Request arrival to its end (last chunk, error or cancel), for requests that reached a worker."},
    [SW_H_QUEUE_WAIT] = {"spillway_queue_wait_seconds",
                         "Request arrival to its dispatch to a worker (capacity queue included)."},
};

static struct {
    pthread_mutex_t mu;
    pool_m pools[MAX_POOLS]; int n_pools;
    char known[MAX_POOLS][64]; int n_known;
    char models[MAX_MODELS][64]; int n_models;
    series_m series[MAX_SERIES]; int n_series;
    overflow_m ov[MAX_OVERFLOW]; int n_ov;
    hist_m lat[SW_LAT__N];
    uint64_t reload_ok, reload_fail;
} M = { .mu = PTHREAD_MUTEX_INITIALIZER };

static const char *status_names[SW_ST__N] = {"ok", "error", "cancelled", "rejected"};
static const char *stage_names[SW_LAT__N] = {"dispatch", "relay"};

void sw_metrics_init(void) {}

/* Adds name to the n entries of list (at most max - 2: "other" and "none"
 * keep room). */
static void add_name(char (*list)[64], int *n, int max, const char *name)
{
    for (int i = 0; i < *n; i++)
        if (strcmp(list[i], name) == 0) return;
    /* A name that would need escaping in a label is labelled "other". */
    if (strpbrk(name, "\"\\\n") || strlen(name) >= 64) return;
    if (*n < max - 2) snprintf(list[(*n)++], 64, "%s", name);
}

static pool_m *pool_get(const char *pool);

void sw_metrics_set_pools(const sw_policy *p)
{
    pthread_mutex_lock(&M.mu);
    /* Names only accumulate: series that existed keep existing after a reload. */
    for (size_t i = 0; i < p->n_pools; i++) add_name(M.known, &M.n_known, MAX_POOLS, p->pools[i].name);
    for (size_t i = 0; i < p->n_routes; i++) add_name(M.known, &M.n_known, MAX_POOLS, p->routes[i].target);
    for (size_t i = 0; i < p->n_routes; i++) add_name(M.models, &M.n_models, MAX_MODELS, p->routes[i].model);
    for (int i = 0; i < M.n_known; i++) {   /* the price is the newest policy's */
        const sw_pool_def *d = sw_policy_pool(p, M.known[i]);
        pool_get(M.known[i])->has_cost = d && d->has_cost;
    }
    pthread_mutex_unlock(&M.mu);
}

/* A model label: one the policy routes, else "other". Called with M.mu held. */
static const char *bounded_model(const char *model)
{
    if (!model || !*model) return "none";
    for (int i = 0; i < M.n_models; i++)
        if (strcmp(M.models[i], model) == 0) return M.models[i];
    return "other";
}

static const char *bounded(const char *pool)
{
    if (!pool || !*pool) return "none";
    for (int i = 0; i < M.n_known; i++)
        if (strcmp(M.known[i], pool) == 0) return M.known[i];
    return "other";
}

static pool_m *pool_get(const char *pool)
{
    const char *name = bounded(pool);
    for (int i = 0; i < M.n_pools; i++)
        if (strcmp(M.pools[i].name, name) == 0) return &M.pools[i];
    if (M.n_pools == MAX_POOLS) return &M.pools[MAX_POOLS - 1];
    pool_m *m = &M.pools[M.n_pools++];
    snprintf(m->name, sizeof m->name, "%s", name);
    return m;
}

void sw_metrics_request(const char *pool, sw_status_label st)
{
    pthread_mutex_lock(&M.mu);
    pool_get(pool)->req[st]++;
    pthread_mutex_unlock(&M.mu);
}

void sw_metrics_tokens(const char *pool, uint32_t prompt, uint32_t cached, uint32_t completion)
{
    pthread_mutex_lock(&M.mu);
    pool_m *m = pool_get(pool);
    m->tok_prompt += prompt;
    m->tok_cached += cached;
    m->tok_completion += completion;
    pthread_mutex_unlock(&M.mu);
}

void sw_metrics_inflight(const char *pool, int delta)
{
    pthread_mutex_lock(&M.mu);
    pool_get(pool)->inflight += delta;
    pthread_mutex_unlock(&M.mu);
}

void sw_metrics_queue(const char *pool, int delta)
{
    pthread_mutex_lock(&M.mu);
    pool_get(pool)->queue += delta;
    pthread_mutex_unlock(&M.mu);
}

void sw_metrics_overflow(const char *from, const char *to, const char *reason)
{
    pthread_mutex_lock(&M.mu);
    from = bounded(from);
    to = bounded(to);
    overflow_m *o = NULL;
    for (int i = 0; i < M.n_ov; i++)
        if (!strcmp(M.ov[i].from, from) && !strcmp(M.ov[i].to, to) && !strcmp(M.ov[i].reason, reason))
            o = &M.ov[i];
    if (!o && M.n_ov < MAX_OVERFLOW) {
        o = &M.ov[M.n_ov++];
        snprintf(o->from, sizeof o->from, "%s", from);
        snprintf(o->to, sizeof o->to, "%s", to);
        snprintf(o->reason, sizeof o->reason, "%s", reason);
    }
    if (o) o->n++;
    pthread_mutex_unlock(&M.mu);
}

void sw_hist_observe(sw_hist *h, const double *bounds, size_t n, double v)
{
    if (!(v > 0)) v = 0;   /* NaN too: a clock step must not poison _sum */
    size_t i = 0;
    while (i < n && v > bounds[i]) i++;
    h->b[i]++;
    h->sum += v;
    h->count++;
}

void sw_hist_put(sw_sbuf *b, const char *name, const char *labels, const sw_hist *h,
                 const double *bounds, size_t n)
{
    char line[640];
    const char *sep = labels[0] ? "," : "";
    uint64_t cum = 0;
    for (size_t i = 0; i <= n; i++) {
        cum += h->b[i];
        char le[32];
        if (i < n) snprintf(le, sizeof le, "%g", bounds[i]);
        else snprintf(le, sizeof le, "+Inf");
        snprintf(line, sizeof line, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, labels, sep, le, (unsigned long long)cum);
        sw_sbuf_put(b, line);
    }
    const char *open = labels[0] ? "{" : "", *close = labels[0] ? "}" : "";
    snprintf(line, sizeof line, "%s_sum%s%s%s %.9g\n%s_count%s%s%s %llu\n", name, open, labels, close, h->sum,
             name, open, labels, close, (unsigned long long)h->count);
    sw_sbuf_put(b, line);
}

void sw_metrics_latency(sw_lat_stage stage, int64_t ns)
{
    pthread_mutex_lock(&M.mu);
    sw_hist_observe(&M.lat[stage], lat_bounds, NB, ns / 1e9);
    pthread_mutex_unlock(&M.mu);
}

/* The histograms of (pool, model), bounded; the last entry takes whatever
 * finds the table full. Called with M.mu held. */
static series_m *series_get(const char *pool, const char *model)
{
    pool = bounded(pool);
    model = bounded_model(model);
    for (int i = 0; i < M.n_series; i++)
        if (!strcmp(M.series[i].pool, pool) && !strcmp(M.series[i].model, model)) return &M.series[i];
    series_m *s = &M.series[M.n_series < MAX_SERIES ? M.n_series++ : MAX_SERIES - 1];
    if (!s->pool[0]) {
        snprintf(s->pool, sizeof s->pool, "%s", M.n_series < MAX_SERIES ? pool : "other");
        snprintf(s->model, sizeof s->model, "%s", M.n_series < MAX_SERIES ? model : "other");
    }
    return s;
}

void sw_metrics_observe(sw_hist_kind k, const char *pool, const char *model, double seconds)
{
    pthread_mutex_lock(&M.mu);
    series_m *s = series_get(pool, model);
    if (k == SW_H_ITL) sw_hist_observe(&s->h[k], itl_bounds, N_ITL_BOUNDS, seconds);
    else sw_hist_observe(&s->h[k], req_bounds, N_REQ_BOUNDS, seconds);
    pthread_mutex_unlock(&M.mu);
}

/* ---- cost ---- */
void sw_cost_window_add(sw_cost_window *w, int64_t now_ms, double dollars, uint64_t tokens)
{
    int64_t slot = now_ms / 1000 / SW_COST_SLOT_S;
    int i = (int)(slot % SW_COST_SLOTS);
    if (w->slot[i] != slot + 1) {   /* an older slot's entry: start it afresh */
        w->slot[i] = slot + 1;
        w->dollars[i] = 0;
        w->tokens[i] = 0;
    }
    w->dollars[i] += dollars;
    w->tokens[i] += tokens;
}

double sw_cost_window_per_mtok(const sw_cost_window *w, int64_t now_ms)
{
    int64_t slot = now_ms / 1000 / SW_COST_SLOT_S;
    double dollars = 0;
    uint64_t tokens = 0;
    for (int i = 0; i < SW_COST_SLOTS; i++) {
        int64_t s = w->slot[i] - 1;
        if (w->slot[i] == 0 || s > slot || slot - s >= SW_COST_SLOTS) continue;
        dollars += w->dollars[i];
        tokens += w->tokens[i];
    }
    return tokens ? dollars * 1e6 / (double)tokens : -1;
}

void sw_metrics_cost(const char *pool, double worker_s, double dollars, uint64_t tokens, int64_t now_ms)
{
    pthread_mutex_lock(&M.mu);
    pool_m *m = pool_get(pool);
    m->worker_s += worker_s;
    m->dollars += dollars;
    if (m->has_cost) sw_cost_window_add(&m->win, now_ms, dollars, tokens);
    pthread_mutex_unlock(&M.mu);
}

double sw_metrics_dollars_per_mtok(const char *pool, int64_t now_ms)
{
    pthread_mutex_lock(&M.mu);
    const pool_m *m = pool_get(pool);
    double v = m->has_cost ? sw_cost_window_per_mtok(&m->win, now_ms) : -1;
    pthread_mutex_unlock(&M.mu);
    return v;
}

void sw_metrics_reload(bool ok)
{
    pthread_mutex_lock(&M.mu);
    if (ok) M.reload_ok++; else M.reload_fail++;
    pthread_mutex_unlock(&M.mu);
}

/* One series per pool of the int64_t at `field` (an offset) of pool_m;
 * type "gauge" or "counter". Called with M.mu held. */
static void put_pool_series(sw_sbuf *b, const char *name, const char *type, const char *help, size_t field)
{
    char line[512];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    sw_sbuf_put(b, line);
    for (int i = 0; i < M.n_pools; i++) {
        int64_t v = *(const int64_t *)((const char *)&M.pools[i] + field);
        snprintf(line, sizeof line, "%s{pool=\"%s\"} %lld\n", name, M.pools[i].name, (long long)v);
        sw_sbuf_put(b, line);
    }
}

/* The added-latency histograms. Called with M.mu held. */
static void put_latency(sw_sbuf *bp)
{
    sw_sbuf_put(bp, "# HELP spillway_gateway_added_latency_seconds Time spent in the gateway itself "
                    "(dispatch: body received to request sent; relay: chunk received to bytes handed to HTTP).\n"
                    "# TYPE spillway_gateway_added_latency_seconds histogram\n");
    for (int s = 0; s < SW_LAT__N; s++) {
        char labels[64];
        snprintf(labels, sizeof labels, "stage=\"%s\"", stage_names[s]);
        sw_hist_put(bp, "spillway_gateway_added_latency_seconds", labels, &M.lat[s], lat_bounds, NB);
    }
}

/* The request histograms, one family each. Called with M.mu held. */
static void put_request_hists(sw_sbuf *b)
{
    char line[512];
    for (int k = 0; k < SW_H__N; k++) {
        snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s histogram\n", HIST[k].name, HIST[k].help, HIST[k].name);
        sw_sbuf_put(b, line);
        for (int i = 0; i < M.n_series; i++) {
            char labels[200];
            snprintf(labels, sizeof labels, "pool=\"%s\",model=\"%s\"", M.series[i].pool, M.series[i].model);
            if (k == SW_H_ITL) sw_hist_put(b, HIST[k].name, labels, &M.series[i].h[k], itl_bounds, N_ITL_BOUNDS);
            else sw_hist_put(b, HIST[k].name, labels, &M.series[i].h[k], req_bounds, N_REQ_BOUNDS);
        }
    }
}

/* v as Prometheus writes a float (NaN never: such series are left out). */
static void put_value(sw_sbuf *b, const char *name, const char *labels, double v)
{
    char line[512];
    snprintf(line, sizeof line, "%s{%s} %.9g\n", name, labels, v);
    sw_sbuf_put(b, line);
}

static void put_head(sw_sbuf *b, const char *name, const char *type, const char *help)
{
    char line[512];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    sw_sbuf_put(b, line);
}

/* s with \, " and newline escaped for a label value. */
static void label_escape(char *dst, size_t n, const char *s)
{
    size_t j = 0;
    for (; *s && j + 3 < n; s++) {
        if (*s == '\\' || *s == '"' || *s == '\n') dst[j++] = '\\';
        dst[j++] = *s == '\n' ? 'n' : *s;
    }
    dst[j] = 0;
}

/* Workers per pool and state, and deaths. Called with M.mu held. */
static void put_workers(sw_sbuf *bp, const sw_metrics_snapshot *snap)
{
    char line[512];
    /* Workers per pool and state: ready (has a free slot), busy (all slots in
     * use), stale (missed heartbeats, about to be declared dead). */
    uint64_t counts[MAX_POOLS][3];
    memset(counts, 0, sizeof counts);
    for (int k = 0; k < snap->n_workers; k++) {
        pool_m *pm = pool_get(snap->workers[k].pool);
        counts[pm - M.pools][snap->workers[k].state]++;
    }
    sw_sbuf_put(bp, "# HELP spillway_workers Registered workers by pool and state.\n"
                    "# TYPE spillway_workers gauge\n");
    static const char *wst[3] = {"ready", "busy", "stale"};
    for (int i = 0; i < M.n_pools; i++)
        for (int s = 0; s < 3; s++) {
            snprintf(line, sizeof line, "spillway_workers{pool=\"%s\",state=\"%s\"} %llu\n",
                     M.pools[i].name, wst[s], (unsigned long long)counts[i][s]);
            sw_sbuf_put(bp, line);
        }
    snprintf(line, sizeof line, "# HELP spillway_worker_deaths_total Workers declared dead.\n"
             "# TYPE spillway_worker_deaths_total counter\nspillway_worker_deaths_total %llu\n",
             (unsigned long long)snap->deaths);
    sw_sbuf_put(bp, line);
}

/* The per-worker gauges, in the order worker_values fills them. The last
 * three are the Gateway API Inference Extension's model-server protocol
 * (proposal 003): TotalQueuedRequests, TotalRunningRequests and
 * KVCacheUtilization, under vLLM's names for them (docs/metrics.md). */
static const struct { const char *name, *help; } WORKER_GAUGES[] = {
    {"spillway_worker_running_requests", "Sequences the worker computes, as its last heartbeat said."},
    {"spillway_worker_waiting_requests", "Requests the worker accepted and has not started, as its last heartbeat said."},
    {"spillway_worker_slots", "Sequences the worker computes at once."},
    {"spillway_worker_batch_size", "Sequences in the worker's last decode step."},
    {"spillway_worker_kv_cache_utilization", "Fraction (0-1) of the worker's KV cache in use."},
    {"spillway_worker_prefix_cache_hit_rate", "Prompt tokens found in the worker's prefix cache over those looked up, since it started."},
    {"spillway_worker_tokens_per_second", "Tokens the worker generated per second, from its last heartbeats."},
    {"spillway_worker_heartbeat_age_seconds", "Seconds since the worker's last heartbeat."},
    {"spillway_worker_healthy", "1 while the worker heartbeats, 0 once it missed them."},
    {"spillway_worker_drained", "1 while the worker takes nothing new: drained by an operator or draining itself (SIGTERM)."},
    {"spillway_worker_num_requests_waiting", "GIE TotalQueuedRequests: requests queued on the worker (vLLM's num_requests_waiting)."},
    {"spillway_worker_num_requests_running", "GIE TotalRunningRequests: requests running on the worker (vLLM's num_requests_running)."},
    {"spillway_worker_kv_cache_usage_perc", "GIE KVCacheUtilization: KV cache in use, 1 = full (vLLM's gpu_cache_usage_perc)."},
};
#define N_WORKER_GAUGES (sizeof WORKER_GAUGES / sizeof *WORKER_GAUGES)

static void worker_values(const sw_metrics_worker *w, double *v)
{
    double kv = w->kv < 0 ? 0 : w->kv > 1 ? 1 : w->kv;
    double vals[N_WORKER_GAUGES] = {w->running, w->waiting, w->slots, w->batch, kv,
                                    w->prefix_hit_rate < 0 ? NAN : w->prefix_hit_rate, w->tokens_per_s,
                                    w->heartbeat_age_s, w->healthy, w->drained, w->waiting, w->running, kv};
    memcpy(v, vals, sizeof vals);
}

/* Called with M.mu held (for the pool labels). */
static void put_worker_gauges(sw_sbuf *b, const sw_metrics_snapshot *snap)
{
    for (size_t g = 0; g < N_WORKER_GAUGES; g++) {
        put_head(b, WORKER_GAUGES[g].name, "gauge", WORKER_GAUGES[g].help);
        for (int k = 0; k < snap->n_workers; k++) {
            const sw_metrics_worker *w = &snap->workers[k];
            double v[N_WORKER_GAUGES];
            worker_values(w, v);
            if (isnan(v[g])) continue;
            char id[300], labels[420];
            label_escape(id, sizeof id, w->id);
            snprintf(labels, sizeof labels, "worker=\"%s\",pool=\"%s\"", id, bounded(w->pool));
            put_value(b, WORKER_GAUGES[g].name, labels, v[g]);
        }
    }
}

/* Per pool of the policy, and per route. A max_concurrency of 0 (none) has
 * no series. Called with M.mu held. */
static void put_pool_gauges(sw_sbuf *b, const sw_metrics_snapshot *snap)
{
    static const char *names[5] = {"spillway_pool_healthy_workers", "spillway_pool_slots", "spillway_pool_inflight",
                                   "spillway_pool_max_concurrency", "spillway_pool_cordoned"};
    static const char *helps[5] = {"Workers of the pool that heartbeat.", "Slots of the pool's healthy workers.",
                                   "Requests this gateway has on the pool's workers.",
                                   "The pool's max_concurrency in the policy (no series: unlimited).",
                                   "1 while an operator has the pool cordoned."};
    for (int g = 0; g < 5; g++) {
        put_head(b, names[g], "gauge", helps[g]);
        for (int i = 0; i < snap->n_pools; i++) {
            const sw_metrics_pool *p = &snap->pools[i];
            double v[5] = {p->healthy, p->slots, p->inflight, p->max_concurrency, p->cordoned};
            if (g == 3 && !p->max_concurrency) continue;
            char labels[128];
            snprintf(labels, sizeof labels, "pool=\"%s\"", bounded(p->name));
            put_value(b, names[g], labels, v[g]);
        }
    }
    put_head(b, "spillway_route_inflight", "gauge", "Requests this gateway has in flight on the route (model@pool).");
    put_head(b, "spillway_route_max_concurrency", "gauge", "The route's max_concurrency (no series: unlimited).");
    for (int i = 0; i < snap->n_routes; i++) {
        char name[400], labels[420];
        label_escape(name, sizeof name, snap->routes[i].name);
        snprintf(labels, sizeof labels, "route=\"%s\"", name);
        put_value(b, "spillway_route_inflight", labels, snap->routes[i].inflight);
        if (snap->routes[i].max_concurrency)
            put_value(b, "spillway_route_max_concurrency", labels, snap->routes[i].max_concurrency);
    }
}

/* Worker time and cost per pool, and the live $/M tokens of priced pools.
 * Called with M.mu held. */
static void put_cost(sw_sbuf *b, int64_t now_ms)
{
    char labels[128];
    put_head(b, "spillway_worker_seconds_total", "counter",
             "Worker time finished requests used (their share of each step), by serving pool.");
    for (int i = 0; i < M.n_pools; i++) {
        snprintf(labels, sizeof labels, "pool=\"%s\"", M.pools[i].name);
        put_value(b, "spillway_worker_seconds_total", labels, M.pools[i].worker_s);
    }
    put_head(b, "spillway_cost_dollars_total", "counter",
             "Dollars of worker time finished requests used: worker seconds x cost_per_hour / 3600, by pool.");
    for (int i = 0; i < M.n_pools; i++) {
        if (!M.pools[i].has_cost && M.pools[i].dollars == 0) continue;
        snprintf(labels, sizeof labels, "pool=\"%s\"", M.pools[i].name);
        put_value(b, "spillway_cost_dollars_total", labels, M.pools[i].dollars);
    }
    put_head(b, "spillway_pool_dollars_per_million_tokens", "gauge",
             "Cost over prompt+completion tokens of the pool's requests finished in the last 5 minutes, per million.");
    for (int i = 0; i < M.n_pools; i++) {
        double v = M.pools[i].has_cost ? sw_cost_window_per_mtok(&M.pools[i].win, now_ms) : -1;
        if (v < 0) continue;
        snprintf(labels, sizeof labels, "pool=\"%s\"", M.pools[i].name);
        put_value(b, "spillway_pool_dollars_per_million_tokens", labels, v);
    }
}

/* ---- CURVE authentication counters (helper "curve"): fixed reason sets,
 * so labels stay bounded; a reason outside them counts as "other". */
static const char *auth_reasons[] = {"unlisted_key", "not_curve", "revoked", "other"};
static const char *reg_reasons[] = {"pool_not_allowed", "id_in_use", "key_revoked", "other"};
#define N_AUTH_REASONS 4
static struct { uint64_t refused[2][N_AUTH_REASONS], reg_refused[N_AUTH_REASONS]; } AUTH;

static int reason_index(const char *const *names, const char *reason)
{
    for (int i = 0; i < N_AUTH_REASONS - 1; i++)
        if (reason && !strcmp(names[i], reason)) return i;
    return N_AUTH_REASONS - 1;
}

void sw_metrics_auth_refused(bool sdk, const char *reason)
{
    pthread_mutex_lock(&M.mu);
    AUTH.refused[sdk][reason_index(auth_reasons, reason)]++;
    pthread_mutex_unlock(&M.mu);
}

void sw_metrics_registration_refused(const char *reason)
{
    pthread_mutex_lock(&M.mu);
    AUTH.reg_refused[reason_index(reg_reasons, reason)]++;
    pthread_mutex_unlock(&M.mu);
}

/* The authentication series. Called with M.mu held. */
static void put_auth(sw_sbuf *b)
{
    char line[256];
    static const char *names[2] = {"spillway_worker_auth_refused_total", "spillway_sdk_auth_refused_total"};
    for (int s = 0; s < 2; s++) {
        snprintf(line, sizeof line, "# HELP %s Connections the CURVE authentication refused.\n# TYPE %s counter\n",
                 names[s], names[s]);
        sw_sbuf_put(b, line);
        for (int i = 0; i < N_AUTH_REASONS; i++) {
            snprintf(line, sizeof line, "%s{reason=\"%s\"} %llu\n", names[s], auth_reasons[i],
                     (unsigned long long)AUTH.refused[s][i]);
            sw_sbuf_put(b, line);
        }
    }
    sw_sbuf_put(b, "# HELP spillway_worker_registration_refused_total Worker registrations refused.\n"
                   "# TYPE spillway_worker_registration_refused_total counter\n");
    for (int i = 0; i < N_AUTH_REASONS; i++) {
        snprintf(line, sizeof line, "spillway_worker_registration_refused_total{reason=\"%s\"} %llu\n",
                 reg_reasons[i], (unsigned long long)AUTH.reg_refused[i]);
        sw_sbuf_put(b, line);
    }
}

/* ---- what workers sent that the broker refused (helper "broker"): a
 * fixed reason set, as sw_metrics_worker_violation's contract lists. */
static const char *violation_reasons[] = {"over_max_tokens", "oversize", "too_many_slots", "invalid_frame",
                                          "unknown_request", "other"};
#define N_VIOLATIONS (sizeof violation_reasons / sizeof *violation_reasons)
static uint64_t VIOLATIONS[N_VIOLATIONS];

void sw_metrics_worker_violation(const char *reason)
{
    size_t i = 0;
    while (i < N_VIOLATIONS - 1 && !(reason && !strcmp(violation_reasons[i], reason))) i++;
    pthread_mutex_lock(&M.mu);
    VIOLATIONS[i]++;
    pthread_mutex_unlock(&M.mu);
}

/* Called with M.mu held. */
static void put_violations(sw_sbuf *b)
{
    char line[256];
    sw_sbuf_put(b, "# HELP spillway_worker_violations_total Frames or claims from workers the gateway refused.\n"
                   "# TYPE spillway_worker_violations_total counter\n");
    for (size_t i = 0; i < N_VIOLATIONS; i++) {
        snprintf(line, sizeof line, "spillway_worker_violations_total{reason=\"%s\"} %llu\n", violation_reasons[i],
                 (unsigned long long)VIOLATIONS[i]);
        sw_sbuf_put(b, line);
    }
}

void sw_metrics_snapshot_free(sw_metrics_snapshot *s)
{
    free(s->workers);
    free(s->pools);
    free(s->routes);
    memset(s, 0, sizeof *s);
}

char *sw_metrics_render(const sw_metrics_snapshot *snap)
{
    sw_sbuf b = {0};
    char line[512];
    pthread_mutex_lock(&M.mu);
    /* Every known pool gets its series, even at zero, so rate() works from the start. */
    for (int i = 0; i < M.n_known; i++) pool_get(M.known[i]);

    sw_sbuf_put(&b, "# HELP spillway_requests_total Requests finished, by serving pool and outcome.\n"
                    "# TYPE spillway_requests_total counter\n");
    for (int i = 0; i < M.n_pools; i++)
        for (int s = 0; s < SW_ST__N; s++) {
            snprintf(line, sizeof line, "spillway_requests_total{pool=\"%s\",status=\"%s\"} %llu\n",
                     M.pools[i].name, status_names[s], (unsigned long long)M.pools[i].req[s]);
            sw_sbuf_put(&b, line);
        }
    put_pool_series(&b, "spillway_inflight", "gauge", "Requests dispatched to a pool and not finished.",
                    offsetof(pool_m, inflight));
    put_pool_series(&b, "spillway_queue_depth", "gauge", "Requests waiting for capacity, by the pool they wait for.",
                    offsetof(pool_m, queue));
    put_pool_series(&b, "spillway_prompt_tokens_total", "counter", "Prompt tokens of finished requests, by serving pool.",
                    offsetof(pool_m, tok_prompt));
    put_pool_series(&b, "spillway_prompt_tokens_cached_total", "counter",
                    "Prompt tokens the workers took from their prefix caches instead of computing.",
                    offsetof(pool_m, tok_cached));
    put_pool_series(&b, "spillway_completion_tokens_total", "counter", "Generated tokens of finished requests, by serving pool.",
                    offsetof(pool_m, tok_completion));
    sw_sbuf_put(&b, "# HELP spillway_overflow_total Requests that spilled from a primary pool to an overflow pool.\n"
                    "# TYPE spillway_overflow_total counter\n");
    for (int i = 0; i < M.n_ov; i++) {
        snprintf(line, sizeof line,
                 "spillway_overflow_total{from_pool=\"%s\",to_pool=\"%s\",reason=\"%s\"} %llu\n",
                 M.ov[i].from, M.ov[i].to, M.ov[i].reason, (unsigned long long)M.ov[i].n);
        sw_sbuf_put(&b, line);
    }
    put_latency(&b);
    put_request_hists(&b);
    put_cost(&b, snap->now_ms);
    snprintf(line, sizeof line,
             "# HELP spillway_policy_reloads_total Policy reload attempts.\n"
             "# TYPE spillway_policy_reloads_total counter\n"
             "spillway_policy_reloads_total{result=\"ok\"} %llu\n"
             "spillway_policy_reloads_total{result=\"error\"} %llu\n",
             (unsigned long long)M.reload_ok, (unsigned long long)M.reload_fail);
    sw_sbuf_put(&b, line);

    put_workers(&b, snap);
    put_worker_gauges(&b, snap);
    put_pool_gauges(&b, snap);
    put_auth(&b);
    put_violations(&b);
    pthread_mutex_unlock(&M.mu);
    if (b.oom) sw_sbuf_free(&b);
    return b.s;
}
