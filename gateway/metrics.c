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
#include <pthread.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <stdio.h>
#include "gateway/metrics.h"
#include "gateway/util.h"

#define MAX_POOLS 64
#define MAX_OVERFLOW 256

typedef struct {
    char name[64];
    uint64_t req[SW_ST__N];
    int64_t inflight, queue;                                 /* gauges */
    int64_t tok_prompt, tok_cached, tok_completion;          /* counters */
} pool_m;

typedef struct { char from[64], to[64], reason[32]; uint64_t n; } overflow_m;

static const double lat_bounds[] = {25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3,
                                    5e-3, 10e-3, 25e-3, 100e-3};
#define NB (sizeof lat_bounds / sizeof lat_bounds[0])
typedef struct { uint64_t b[NB + 1]; double sum; uint64_t count; } hist_m;

static struct {
    pthread_mutex_t mu;
    pool_m pools[MAX_POOLS]; int n_pools;
    char known[MAX_POOLS][64]; int n_known;
    overflow_m ov[MAX_OVERFLOW]; int n_ov;
    hist_m lat[SW_LAT__N];
    uint64_t reload_ok, reload_fail;
} M = { .mu = PTHREAD_MUTEX_INITIALIZER };

static const char *status_names[SW_ST__N] = {"ok", "error", "cancelled", "rejected"};
static const char *stage_names[SW_LAT__N] = {"dispatch", "relay"};

void sw_metrics_init(void) {}

static void add_known(const char *name)
{
    for (int i = 0; i < M.n_known; i++)
        if (strcmp(M.known[i], name) == 0) return;
    if (M.n_known < MAX_POOLS - 2) snprintf(M.known[M.n_known++], 64, "%s", name);
}

void sw_metrics_set_pools(const sw_policy *p)
{
    pthread_mutex_lock(&M.mu);
    /* Names only accumulate: series that existed keep existing after a reload. */
    for (size_t i = 0; i < p->n_pools; i++) add_known(p->pools[i].name);
    for (size_t i = 0; i < p->n_routes; i++) add_known(p->routes[i].target);
    pthread_mutex_unlock(&M.mu);
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

void sw_metrics_latency(sw_lat_stage stage, int64_t ns)
{
    double s = ns / 1e9;
    pthread_mutex_lock(&M.mu);
    hist_m *h = &M.lat[stage];
    size_t i = 0;
    while (i < NB && s > lat_bounds[i]) i++;
    h->b[i]++;
    h->sum += s;
    h->count++;
    pthread_mutex_unlock(&M.mu);
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
    char line[512];
    sw_sbuf_put(bp, "# HELP spillway_gateway_added_latency_seconds Time spent in the gateway itself "
                    "(dispatch: body received to request sent; relay: chunk received to bytes handed to HTTP).\n"
                    "# TYPE spillway_gateway_added_latency_seconds histogram\n");
    for (int s = 0; s < SW_LAT__N; s++) {
        uint64_t cum = 0;
        for (size_t i = 0; i <= NB; i++) {
            cum += M.lat[s].b[i];
            if (i < NB)
                snprintf(line, sizeof line,
                         "spillway_gateway_added_latency_seconds_bucket{stage=\"%s\",le=\"%g\"} %llu\n",
                         stage_names[s], lat_bounds[i], (unsigned long long)cum);
            else
                snprintf(line, sizeof line,
                         "spillway_gateway_added_latency_seconds_bucket{stage=\"%s\",le=\"+Inf\"} %llu\n",
                         stage_names[s], (unsigned long long)cum);
            sw_sbuf_put(bp, line);
        }
        snprintf(line, sizeof line,
                 "spillway_gateway_added_latency_seconds_sum{stage=\"%s\"} %.9f\n"
                 "spillway_gateway_added_latency_seconds_count{stage=\"%s\"} %llu\n",
                 stage_names[s], M.lat[s].sum, stage_names[s], (unsigned long long)M.lat[s].count);
        sw_sbuf_put(bp, line);
    }
}

/* Workers per pool and state, and deaths. Called with M.mu held. */
static void put_workers(sw_sbuf *bp, const sw_metrics_worker *snap, int n_snap, uint64_t deaths)
{
    char line[512];
    /* Workers per pool and state: ready (has a free slot), busy (all slots in
     * use), stale (missed heartbeats, about to be declared dead). The
     * caller snapshotted the registry (lock order: never both locks). */
    uint64_t counts[MAX_POOLS][3];
    memset(counts, 0, sizeof counts);
    for (int k = 0; k < n_snap; k++) {
        pool_m *pm = pool_get(snap[k].pool);
        counts[pm - M.pools][snap[k].state]++;
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
             (unsigned long long)deaths);
    sw_sbuf_put(bp, line);
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

char *sw_metrics_render(const sw_metrics_worker *snap, int n_snap, uint64_t deaths)
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
    snprintf(line, sizeof line,
             "# HELP spillway_policy_reloads_total Policy reload attempts.\n"
             "# TYPE spillway_policy_reloads_total counter\n"
             "spillway_policy_reloads_total{result=\"ok\"} %llu\n"
             "spillway_policy_reloads_total{result=\"error\"} %llu\n",
             (unsigned long long)M.reload_ok, (unsigned long long)M.reload_fail);
    sw_sbuf_put(&b, line);

    put_workers(&b, snap, n_snap, deaths);
    put_auth(&b);
    put_violations(&b);
    pthread_mutex_unlock(&M.mu);
    if (b.oom) sw_sbuf_free(&b);
    return b.s;
}
