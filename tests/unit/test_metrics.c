/* The metrics' arithmetic and text (gateway/metrics.c): histogram buckets
 * (le bounds inclusive, cumulative in the text, _sum and _count), the cost
 * window's $/M tokens over its last five minutes, and the exposition of
 * per-request histograms, worker, pool and route gauges and cost, parsed
 * back line by line as Prometheus would read them. */
#include <math.h>
#include "gateway/metrics.h"
#include "tests/unit/check.h"

/* The value of the sample line that starts with `series` ("name{labels}"), or NAN. */
static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *l = text; l && *l;) {
        if (!strncmp(l, series, n) && l[n] == ' ') return strtod(l + n + 1, NULL);
        l = strchr(l, '\n');
        if (l) l++;
    }
    return NAN;
}

static void test_hist(void)
{
    static const double b[] = {0.1, 1, 10};
    sw_hist h = {0};
    const double obs[] = {0.05, 0.1, 0.5, 1, 5, 100, -3, NAN};
    for (size_t i = 0; i < sizeof obs / sizeof *obs; i++) sw_hist_observe(&h, b, 3, obs[i]);
    /* 0.05, 0.1, -3->0, NaN->0 go in le=0.1 (bounds are inclusive); 0.5, 1 in le=1; 5; 100 above. */
    CHECK(h.b[0] == 4 && h.b[1] == 2 && h.b[2] == 1 && h.b[3] == 1, "%llu %llu %llu %llu",
          (unsigned long long)h.b[0], (unsigned long long)h.b[1], (unsigned long long)h.b[2],
          (unsigned long long)h.b[3]);
    CHECK(h.count == 8 && fabs(h.sum - 106.65) < 1e-9, "%g", h.sum);
    sw_sbuf s = {0};
    sw_hist_put(&s, "x_seconds", "pool=\"p\"", &h, b, 3);
    CHECK(sample(s.s, "x_seconds_bucket{pool=\"p\",le=\"0.1\"}") == 4, "%s", s.s);
    CHECK(sample(s.s, "x_seconds_bucket{pool=\"p\",le=\"1\"}") == 6, "%s", s.s);
    CHECK(sample(s.s, "x_seconds_bucket{pool=\"p\",le=\"10\"}") == 7, "%s", s.s);
    CHECK(sample(s.s, "x_seconds_bucket{pool=\"p\",le=\"+Inf\"}") == 8, "%s", s.s);
    CHECK(sample(s.s, "x_seconds_count{pool=\"p\"}") == 8, "%s", s.s);
    CHECK(fabs(sample(s.s, "x_seconds_sum{pool=\"p\"}") - 106.65) < 1e-6, "%s", s.s);
    sw_sbuf_free(&s);
    sw_sbuf u = {0};
    sw_hist_put(&u, "y", "", &h, b, 3);   /* no labels: no empty braces before _sum */
    CHECK(sample(u.s, "y_bucket{le=\"+Inf\"}") == 8 && sample(u.s, "y_count") == 8, "%s", u.s);
    sw_sbuf_free(&u);
}

static void test_cost_window(void)
{
    sw_cost_window w = {0};
    const int64_t t0 = 1000000000;   /* ms */
    CHECK(sw_cost_window_per_mtok(&w, t0) < 0);   /* nothing costed yet */
    sw_cost_window_add(&w, t0, 1.0, 1000000);
    sw_cost_window_add(&w, t0 + 60000, 3.0, 1000000);
    CHECK(fabs(sw_cost_window_per_mtok(&w, t0 + 60000) - 2.0) < 1e-12, "%g", sw_cost_window_per_mtok(&w, t0 + 60000));
    /* Past five minutes the first slot drops out; past ten, both. */
    CHECK(fabs(sw_cost_window_per_mtok(&w, t0 + SW_COST_WINDOW_S * 1000 + 5000) - 3.0) < 1e-12);
    CHECK(sw_cost_window_per_mtok(&w, t0 + 2 * SW_COST_WINDOW_S * 1000) < 0);
    /* The first slot's entry, reused a window later, starts afresh: the
     * minute-one slot is still in the window beside it. */
    sw_cost_window_add(&w, t0 + SW_COST_WINDOW_S * 1000, 0.5, 500000);
    CHECK(fabs(sw_cost_window_per_mtok(&w, t0 + SW_COST_WINDOW_S * 1000) - 3.5 / 1.5) < 1e-12,
          "%g", sw_cost_window_per_mtok(&w, t0 + SW_COST_WINDOW_S * 1000));
}

static const char POLICY[] =
    "pools:\n"
    "  gpu-pool: {kind: gpu, cost_per_hour: 3.6, max_concurrency: 8}\n"
    "  cpu-pool: {kind: cpu}\n"
    "routes:\n"
    "  - {model: m, target: gpu-pool, max_concurrency: 2}\n"
    "  - {model: m, target: cpu-pool, priority: overflow}\n";

static char *render_with_snapshot(int64_t now)
{
    sw_metrics_worker w[2] = {
        {.id = "g\"1", .pool = "gpu-pool", .healthy = true, .running = 2, .waiting = 1, .slots = 4, .batch = 2,
         .kv = 1.5f, .prefix_hit_rate = 0.25, .tokens_per_s = 40, .heartbeat_age_s = 0.5},
        {.id = "c1", .pool = "elsewhere", .state = SW_WS_STALE, .drained = true, .prefix_hit_rate = -1},
    };
    sw_metrics_pool p[2] = {{.name = "gpu-pool", .healthy = 1, .slots = 4, .inflight = 2, .max_concurrency = 8},
                            {.name = "cpu-pool", .cordoned = true}};
    sw_metrics_route r[1] = {{.name = "m@gpu-pool", .inflight = 2, .max_concurrency = 2}};
    sw_metrics_snapshot s = {.workers = w, .n_workers = 2, .pools = p, .n_pools = 2, .routes = r, .n_routes = 1,
                             .deaths = 3, .now_ms = now};
    return sw_metrics_render(&s);
}

static void test_render(void)
{
    char err[256];
    sw_policy *pol = sw_policy_parse("t.yaml", POLICY, strlen(POLICY), err, sizeof err);
    CHECK(pol, "%s", err);
    if (!pol) return;
    sw_metrics_init();
    sw_metrics_set_pools(pol);
    sw_metrics_observe(SW_H_TTFT, "gpu-pool", "m", 0.2);
    sw_metrics_observe(SW_H_TTFT, "gpu-pool", "m", 0.3);
    sw_metrics_observe(SW_H_TTFT, "mystery", "unknown-model", 1);   /* bounded labels */
    sw_metrics_observe(SW_H_ITL, "cpu-pool", "m", 0.03);
    const int64_t now = 5000000;
    /* 1000 worker seconds at 3.6 $/h = 1 $, over 2M tokens: 0.5 $/M. */
    sw_metrics_cost("gpu-pool", 1000, 1.0, 2000000, now);
    sw_metrics_cost("cpu-pool", 10, 0, 100, now);   /* no price: worker time only */
    char *t = render_with_snapshot(now);
    CHECK(t);
    if (!t) return;
    CHECK(sample(t, "spillway_time_to_first_token_seconds_count{pool=\"gpu-pool\",model=\"m\"}") == 2, "%s", t);
    CHECK(sample(t, "spillway_time_to_first_token_seconds_bucket{pool=\"gpu-pool\",model=\"m\",le=\"0.25\"}") == 1);
    CHECK(sample(t, "spillway_time_to_first_token_seconds_count{pool=\"other\",model=\"other\"}") == 1);
    CHECK(sample(t, "spillway_inter_token_latency_seconds_bucket{pool=\"cpu-pool\",model=\"m\",le=\"0.04\"}") == 1);
    CHECK(strstr(t, "# TYPE spillway_request_duration_seconds histogram\n"));
    CHECK(strstr(t, "# TYPE spillway_queue_wait_seconds histogram\n"));
    CHECK(sample(t, "spillway_cost_dollars_total{pool=\"gpu-pool\"}") == 1, "%s", t);
    CHECK(isnan(sample(t, "spillway_cost_dollars_total{pool=\"cpu-pool\"}")));   /* no price, no series */
    CHECK(sample(t, "spillway_worker_seconds_total{pool=\"cpu-pool\"}") == 10);
    CHECK(fabs(sample(t, "spillway_pool_dollars_per_million_tokens{pool=\"gpu-pool\"}") - 0.5) < 1e-9);
    CHECK(isnan(sample(t, "spillway_pool_dollars_per_million_tokens{pool=\"cpu-pool\"}")));
    /* Worker gauges: the id escaped, an unknown pool bounded, KV clamped to 1. */
    CHECK(sample(t, "spillway_worker_kv_cache_utilization{worker=\"g\\\"1\",pool=\"gpu-pool\"}") == 1, "%s", t);
    CHECK(sample(t, "spillway_worker_kv_cache_usage_perc{worker=\"g\\\"1\",pool=\"gpu-pool\"}") == 1);
    CHECK(sample(t, "spillway_worker_num_requests_waiting{worker=\"g\\\"1\",pool=\"gpu-pool\"}") == 1);
    CHECK(sample(t, "spillway_worker_num_requests_running{worker=\"g\\\"1\",pool=\"gpu-pool\"}") == 2);
    CHECK(sample(t, "spillway_worker_prefix_cache_hit_rate{worker=\"g\\\"1\",pool=\"gpu-pool\"}") == 0.25);
    CHECK(isnan(sample(t, "spillway_worker_prefix_cache_hit_rate{worker=\"c1\",pool=\"other\"}")));
    CHECK(sample(t, "spillway_worker_healthy{worker=\"c1\",pool=\"other\"}") == 0);
    CHECK(sample(t, "spillway_worker_drained{worker=\"c1\",pool=\"other\"}") == 1);
    CHECK(sample(t, "spillway_workers{pool=\"other\",state=\"stale\"}") == 1);
    CHECK(sample(t, "spillway_worker_deaths_total") == 3);
    /* Pools and routes; an unlimited max_concurrency has no series. */
    CHECK(sample(t, "spillway_pool_max_concurrency{pool=\"gpu-pool\"}") == 8);
    CHECK(isnan(sample(t, "spillway_pool_max_concurrency{pool=\"cpu-pool\"}")));
    CHECK(sample(t, "spillway_pool_cordoned{pool=\"cpu-pool\"}") == 1);
    CHECK(sample(t, "spillway_pool_healthy_workers{pool=\"gpu-pool\"}") == 1);
    CHECK(sample(t, "spillway_route_inflight{route=\"m@gpu-pool\"}") == 2);
    CHECK(sample(t, "spillway_route_max_concurrency{route=\"m@gpu-pool\"}") == 2);
    CHECK(fabs(sw_metrics_dollars_per_mtok("gpu-pool", now) - 0.5) < 1e-9);
    CHECK(sw_metrics_dollars_per_mtok("cpu-pool", now) < 0);
    /* Every # TYPE names a family once. */
    int types = 0;
    for (const char *p = t; (p = strstr(p, "# TYPE spillway_worker_slots ")); p++) types++;
    CHECK(types == 1, "%d", types);
    free(t);
    sw_policy_unref(pol);
}

int main(void)
{
    test_hist();
    test_cost_window();
    test_render();
    CHECK_DONE();
}
