/* Per-request accounting: histograms, cost, the access log line. */
#include <math.h>
#include <stdio.h>
#include "gateway/access.h"
#include "gateway/policy.h"

#define MAX_WORKER_SECONDS 86400.0   /* no request runs a day (request_timeout_ms is far less) */

static const char *status_word(sw_status_label st)
{
    static const char *w[SW_ST__N] = {"ok", "error", "cancelled", "rejected"};
    return st < SW_ST__N ? w[st] : "other";
}

/* The pool r is counted under: where it ran, else where it waited. */
static const char *pool_of(const sw_req *r)
{
    return r->pool[0] ? r->pool : r->queued_pool;
}

double sw_access_worker_seconds(double claimed)
{
    if (!isfinite(claimed) || claimed < 0) return 0;
    return claimed > MAX_WORKER_SECONDS ? MAX_WORKER_SECONDS : claimed;
}

void sw_access_dispatched(sw_req *r, const char *pool, int64_t now_ns)
{
    if (r->dispatched_ns) return;   /* a retry or a re-route: the wait was counted */
    r->dispatched_ns = now_ns;
    sw_metrics_observe(SW_H_QUEUE_WAIT, pool, r->model, (double)(now_ns - r->t_submit_ns) / 1e9);
}

void sw_access_chunk(sw_req *r, const Spillway__TokenChunk *c, int64_t now_ns)
{
    size_t n = c->n_token_ids;
    if (n == 0) return;
    if (!r->first_token_ns) {
        r->first_token_ns = r->last_token_ns = now_ns;
        sw_metrics_observe(SW_H_TTFT, pool_of(r), r->model, (double)(now_ns - r->t_submit_ns) / 1e9);
        return;
    }
    double gap = (double)(now_ns - r->last_token_ns) / 1e9 / (double)n;
    for (size_t i = 0; i < n; i++) sw_metrics_observe(SW_H_ITL, pool_of(r), r->model, gap);
    r->last_token_ns = now_ns;
}

/* Dollars for r's worker time at its pool's price; 0 without a price. */
static double cost_of(const sw_req *r, double worker_s)
{
    const sw_pool_def *d = r->policy ? sw_policy_pool(r->policy, pool_of(r)) : NULL;
    return d && d->has_cost ? worker_s * d->cost_per_hour / 3600.0 : 0;
}

static void log_line(const sw_req *r, sw_status_label st, double ttft, double dur, double worker_s, double cost)
{
    char ttft_s[32] = "-";
    if (ttft >= 0) snprintf(ttft_s, sizeof ttft_s, "%.3f", ttft);
    fprintf(stderr,
            "access: id=%s route=%s@%s pool=%s model=%.128s status=%s prompt_tokens=%u completion_tokens=%u "
            "ttft_s=%s duration_s=%.3f worker_s=%.4f cost_usd=%.8f key=%s\n",
            r->id, r->model ? r->model : "-", pool_of(r)[0] ? pool_of(r) : "-", pool_of(r)[0] ? pool_of(r) : "-",
            r->model ? r->model : "-", status_word(st), r->usage_prompt, r->usage_completion, ttft_s, dur,
            worker_s, cost, r->key_label[0] ? r->key_label : "-");
}

void sw_access_end(sw_req *r, sw_status_label st, int64_t now_ns)
{
    double dur = (double)(now_ns - r->t_submit_ns) / 1e9;
    double ttft = r->first_token_ns ? (double)(r->first_token_ns - r->t_submit_ns) / 1e9 : -1;
    if (r->n_kids) {   /* several choices: their own requests were measured and priced */
        log_line(r, st, ttft, dur, 0, 0);
        return;
    }
    if (r->dispatched_ns) sw_metrics_observe(SW_H_DURATION, pool_of(r), r->model, dur);
    double worker_s = sw_access_worker_seconds(r->usage_worker_s);
    double cost = cost_of(r, worker_s);
    if (r->pool[0] && (worker_s > 0 || r->usage_prompt || r->usage_completion))
        sw_metrics_cost(r->pool, worker_s, cost, (uint64_t)r->usage_prompt + r->usage_completion,
                        now_ns / 1000000);
    log_line(r, st, ttft, dur, worker_s, cost);
}
