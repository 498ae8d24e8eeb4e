/* The routing decision (gateway/router.c), table-driven.
 *
 * Each row builds a policy with the real parser (gateway/policy.c), a
 * registry through its real functions (sw_registry_upsert with a Register
 * message, then the heartbeat fields a worker would have reported), and the
 * route counters through sw_route_stats_get/_outcome/_service, the way the
 * broker feeds them. Then one sw_route_decide, and the decision is compared
 * with the row's: kind, pool, worker, HTTP status and code, spill.
 *
 * The wait queue's length (defaults.queue_length, a pool's max_queue) is the
 * broker's to enforce, after a QUEUE decision: not covered here.
 */
#include "gateway/router.h"
#include "tests/unit/check.h"

#define NOW 1000000   /* ms; workers' last_seen is NOW - age_ms */

/* Two pools for one model: fp8 on GPUs first, q4_k_m on CPUs as the
 * overflow. `solo` has no overflow; `dual` has two primary routes that name
 * no quantization; `gpt-4o` is an alias. */
#define SPILL_ROUTES                                                   \
    "pools:\n"                                                         \
    "  gpu-pool: {kind: gpu}\n"                                        \
    "  cpu-pool: {kind: cpu}\n"                                        \
    "routes:\n"                                                        \
    "  - {model: llama, quantization: fp8, target: gpu-pool, max_concurrency: 2}\n" \
    "  - {model: llama, quantization: q4_k_m, target: cpu-pool, max_concurrency: 4, priority: overflow}\n" \
    "  - {model: solo, target: gpu-pool, max_concurrency: 1}\n"       \
    "  - {model: dual, target: gpu-pool}\n"                            \
    "  - {model: dual, target: cpu-pool}\n"                            \
    "aliases:\n"                                                       \
    "  gpt-4o: llama\n"
static const char P_SPILL[] = SPILL_ROUTES;
/* The same with error rates ignored (threshold 0). */
static const char P_NOERR[] = SPILL_ROUTES "defaults: {error_rate_threshold: 0}\n";
/* A pool with its own max_concurrency, over whatever routes send to it. */
static const char P_POOLCAP[] =
    "pools:\n"
    "  gpu-pool: {kind: gpu, max_concurrency: 3}\n"
    "  cpu-pool: {kind: cpu}\n"
    "routes:\n"
    "  - {model: dual, target: gpu-pool}\n"
    "  - {model: dual, target: cpu-pool, priority: overflow}\n";
/* Match conditions, tried in file order. */
static const char P_MATCH[] =
    "routes:\n"
    "  - {model: m, target: fast, match: {class: interactive, prompt_tokens: {max: 100}}}\n"
    "  - {model: m, target: bulk, match: {class: batch}}\n"
    "  - {model: m, target: long, match: {prompt_tokens: {min: 101}}}\n"
    "  - {model: t, target: team-a, match: {tenants: [acme, globex]}}\n"
    "  - {model: t, target: keyed, match: {api_keys: [\"sk-team-a-0123456789\"]}}\n";

typedef struct {
    const char *id, *pool;
    const char *models;          /* "name:quant name:quant ..." */
    uint32_t slots, active, queued, inflight;
    int64_t age_ms;              /* since its last message */
} wspec;

typedef struct {
    int route;                   /* the policy's route number, from 1; 0 = none */
    uint32_t inflight, oks, errors;
    int64_t service_ms;          /* 0 = no service time known */
} sspec;

typedef struct {
    sw_decide_kind kind;
    const char *pool;            /* DISPATCH: the target; QUEUE: the pool it waits for */
    const char *worker;          /* DISPATCH: its id (NULL: not checked) */
    int status;                  /* REJECT */
    const char *code;            /* REJECT */
    const char *spill_from, *spill_reason;   /* NULL: not spilled */
} expect;

typedef struct {
    const char *name;
    const char *policy;
    wspec w[4];
    sspec s[2];
    sw_route_request rq;         /* rq.model is resolved through the aliases first */
    expect want;
} row;

/* A row with operators' marks set first: "drain:ID", "cordon:POOL", "force:ROUTE". */
typedef struct {
    row r;
    const char *ops[3];
} ops_row;

/* Workers. */
#define G1 {"g1", "gpu-pool", "llama:fp8 solo:fp8 dual:fp8", 4, 0, 0, 0, 0}
#define G2 {"g2", "gpu-pool", "llama:fp8 solo:fp8 dual:fp8", 4, 0, 0, 0, 0}
#define C1 {"c1", "cpu-pool", "llama:q4_k_m dual:q4_k_m", 4, 0, 0, 0, 0}
#define F1 {"f1", "misc", "free:f32", 2, 0, 0, 0, 0}
#define F2 {"f2", "spare", "free:f32", 2, 0, 0, 0, 0}
/* One slot, one running and one queued: two requests ahead of a new one. */
#define G1_FULL {"g1", "gpu-pool", "llama:fp8", 1, 1, 1, 0, 0}
#define C1_FULL {"c1", "cpu-pool", "llama:q4_k_m", 1, 1, 1, 0, 0}
#define MW(id, pool) {id, pool, "m:f32 t:f32", 2, 0, 0, 0, 0}
/* The same workers with n requests of ours in flight. */
#define G1_AT(n) {"g1", "gpu-pool", "llama:fp8 solo:fp8 dual:fp8", 4, 0, 0, n, 0}
#define G2_AT(n) {"g2", "gpu-pool", "llama:fp8 solo:fp8 dual:fp8", 4, 0, 0, n, 0}
#define C1_AT(n) {"c1", "cpu-pool", "llama:q4_k_m dual:q4_k_m", 4, 0, 0, n, 0}
#define F1_AT(n) {"f1", "misc", "free:f32", 2, 0, 0, n, 0}
/* Client keys' pools. */
static char *K_CPU[] = {"cpu-pool"};
static char *K_CPU_SPARE[] = {"cpu-pool", "spare"};
/* Decisions. */
#define TO(pool, w) {SW_DECIDE_DISPATCH, pool, w, 0, NULL, NULL, NULL}
#define SPILL(pool, w, from, why) {SW_DECIDE_DISPATCH, pool, w, 0, NULL, from, why}
#define WAIT(pool) {SW_DECIDE_QUEUE, pool, NULL, 0, NULL, NULL, NULL}
#define REFUSE(status, code) {SW_DECIDE_REJECT, NULL, NULL, status, code, NULL, NULL}

static const row ROWS[] = {
    /* saturation */
    {"primary with room", P_SPILL, {G1, C1}, {{0}}, {.model = "llama"}, TO("gpu-pool", "g1")},
    {"primary one below its limit", P_SPILL, {G1, C1}, {{1, .inflight = 1}}, {.model = "llama"},
     TO("gpu-pool", "g1")},
    {"primary at max_concurrency spills", P_SPILL, {G1, C1}, {{1, .inflight = 2}}, {.model = "llama"},
     SPILL("cpu-pool", "c1", "gpu-pool", "saturated")},
    {"primary and overflow saturated: queue", P_SPILL, {G1, C1}, {{1, .inflight = 2}, {2, .inflight = 4}},
     {.model = "llama"}, WAIT("gpu-pool")},
    {"no overflow route, saturated: queue", P_SPILL, {G1}, {{3, .inflight = 1}}, {.model = "solo"},
     WAIT("gpu-pool")},
    {"overflow saturated, primary free", P_SPILL, {G1, C1}, {{2, .inflight = 4}}, {.model = "llama"},
     TO("gpu-pool", "g1")},
    /* capacity from the workers' slots, for routes without max_concurrency:
     * a worker takes its slots plus 2 (WORKER_QUEUE_SLACK) */
    {"unlimited route, worker one below slots+2", P_SPILL, {G1_AT(5), C1}, {{0}}, {.model = "dual"},
     TO("gpu-pool", "g1")},
    {"unlimited route, worker at slots+2: next route", P_SPILL, {G1_AT(6), C1}, {{0}}, {.model = "dual"},
     TO("cpu-pool", "c1")},
    {"a full worker yields to one with room", P_SPILL, {G1_AT(6), G2, C1}, {{0}}, {.model = "dual"},
     TO("gpu-pool", "g2")},
    {"unlimited routes, every worker full: queue", P_SPILL, {G1_AT(6), C1_AT(6)}, {{0}},
     {.model = "dual"}, WAIT("gpu-pool")},
    {"unrouted model, its worker full: queue", P_SPILL, {F1_AT(4)}, {{0}}, {.model = "free"},
     WAIT("misc")},
    {"pool below its max_concurrency", P_POOLCAP, {G1_AT(2), C1}, {{0}}, {.model = "dual"},
     TO("gpu-pool", "g1")},
    {"pool at its max_concurrency spills", P_POOLCAP, {G1_AT(2), G2_AT(1), C1}, {{0}},
     {.model = "dual"}, SPILL("cpu-pool", "c1", "gpu-pool", "saturated")},
    /* degraded pools */
    {"no primary worker spills degraded", P_SPILL, {C1}, {{0}}, {.model = "llama"},
     SPILL("cpu-pool", "c1", "gpu-pool", "degraded")},
    {"silent primary worker is dead", P_SPILL, {{"g1", "gpu-pool", "llama:fp8", 4, 0, 0, 0, 3000}, C1}, {{0}},
     {.model = "llama"}, SPILL("cpu-pool", "c1", "gpu-pool", "degraded")},
    {"worker heard 2999 ms ago is alive", P_SPILL, {{"g1", "gpu-pool", "llama:fp8", 4, 0, 0, 0, 2999}, C1},
     {{0}}, {.model = "llama"}, TO("gpu-pool", "g1")},
    {"primary worker of another quantization", P_SPILL, {{"g1", "gpu-pool", "llama:f16", 4, 0, 0, 0, 0}, C1}, {{0}},
     {.model = "llama"}, SPILL("cpu-pool", "c1", "gpu-pool", "degraded")},
    {"error rate over threshold spills degraded", P_SPILL, {G1, C1}, {{1, .errors = 10}}, {.model = "llama"},
     SPILL("cpu-pool", "c1", "gpu-pool", "degraded")},
    {"nine errors are too few to judge", P_SPILL, {G1, C1}, {{1, .errors = 9}}, {.model = "llama"},
     TO("gpu-pool", "g1")},
    {"error rate under threshold", P_SPILL, {G1, C1}, {{1, .oks = 20, .errors = 3}}, {.model = "llama"},
     TO("gpu-pool", "g1")},
    {"threshold 0 ignores errors", P_NOERR, {G1, C1}, {{1, .errors = 20}}, {.model = "llama"},
     TO("gpu-pool", "g1")},
    {"every pool degraded: 503", P_SPILL, {F1}, {{0}}, {.model = "llama"}, REFUSE(503, "no_worker_available")},
    {"degraded primary, saturated overflow: queue", P_SPILL, {C1}, {{2, .inflight = 4}}, {.model = "llama"},
     WAIT("gpu-pool")},
    {"no overflow route, no worker: 503", P_SPILL, {C1}, {{0}}, {.model = "solo"},
     REFUSE(503, "no_worker_available")},
    /* the queue budget (max_queue_ms directive) against the predicted wait */
    {"predicted wait over budget spills", P_SPILL, {G1_FULL, C1}, {{1, .service_ms = 100}},
     {.model = "llama", .budget_ms = 150}, SPILL("cpu-pool", "c1", "gpu-pool", "queue_wait")},
    {"predicted wait within budget", P_SPILL, {G1_FULL, C1}, {{1, .service_ms = 100}},
     {.model = "llama", .budget_ms = 250}, TO("gpu-pool", "g1")},
    {"no budget: the wait is accepted", P_SPILL, {G1_FULL, C1}, {{1, .service_ms = 100}}, {.model = "llama"},
     TO("gpu-pool", "g1")},
    {"no service time known: no wait predicted", P_SPILL, {G1_FULL, C1}, {{0}},
     {.model = "llama", .budget_ms = 1}, TO("gpu-pool", "g1")},
    {"a free slot means no wait", P_SPILL, {{"g1", "gpu-pool", "llama:fp8", 4, 3, 0, 0, 0}, C1},
     {{1, .service_ms = 100}}, {.model = "llama", .budget_ms = 1}, TO("gpu-pool", "g1")},
    {"own in-flight count beats a stale heartbeat", P_SPILL, {{"g1", "gpu-pool", "llama:fp8", 1, 0, 0, 2, 0}, C1},
     {{1, .service_ms = 100}}, {.model = "llama", .budget_ms = 150},
     SPILL("cpu-pool", "c1", "gpu-pool", "queue_wait")},
    {"over budget everywhere: queue", P_SPILL, {G1_FULL, C1_FULL}, {{1, .service_ms = 100}, {2, .service_ms = 100}},
     {.model = "llama", .budget_ms = 150}, WAIT("gpu-pool")},
    /* directives */
    {"want_target takes the overflow route unspilled", P_SPILL, {G1, C1}, {{0}},
     {.model = "llama", .want_target = "cpu-pool"}, TO("cpu-pool", "c1")},
    {"want_target of no route: 400", P_SPILL, {G1, C1}, {{0}}, {.model = "llama", .want_target = "tpu-pool"},
     REFUSE(400, "no_matching_route")},
    {"want_target's pool saturated: queue", P_SPILL, {G1, C1}, {{2, .inflight = 4}},
     {.model = "llama", .want_target = "cpu-pool"}, WAIT("cpu-pool")},
    {"want_quant picks the route", P_SPILL, {G1, C1}, {{0}}, {.model = "llama", .want_quant = "q4_k_m"},
     TO("cpu-pool", "c1")},
    {"want_quant is case-insensitive", P_SPILL, {G1, C1}, {{0}}, {.model = "llama", .want_quant = "FP8"},
     TO("gpu-pool", "g1")},
    {"want_quant no route has: 400", P_SPILL, {G1, C1}, {{0}}, {.model = "llama", .want_quant = "int4"},
     REFUSE(400, "no_matching_route")},
    {"want_quant filters an open route's workers", P_SPILL, {G1, C1}, {{0}},
     {.model = "dual", .want_quant = "q4_k_m"}, TO("cpu-pool", "c1")},
    {"exclude_worker takes the other one", P_SPILL, {G1, G2, C1}, {{0}}, {.model = "llama", .exclude_worker = "g1"},
     TO("gpu-pool", "g2")},
    {"exclude_worker beats prefix affinity", P_SPILL, {G1, G2, C1}, {{0}},
     {.model = "llama", .exclude_worker = "g2", .prefix_key = 0x9e3779b97f4a7c15ull}, TO("gpu-pool", "g1")},
    {"exclude_worker the only one: spill", P_SPILL, {G1, C1}, {{0}}, {.model = "llama", .exclude_worker = "g1"},
     SPILL("cpu-pool", "c1", "gpu-pool", "degraded")},
    {"exclude_worker of another pool is moot", P_SPILL, {G1, C1}, {{0}}, {.model = "llama", .exclude_worker = "c1"},
     TO("gpu-pool", "g1")},
    /* aliases, and models no route names */
    {"alias served as its model", P_SPILL, {G1, C1}, {{0}}, {.model = "gpt-4o"}, TO("gpu-pool", "g1")},
    {"alias spills as its model", P_SPILL, {G1, C1}, {{1, .inflight = 2}}, {.model = "gpt-4o"},
     SPILL("cpu-pool", "c1", "gpu-pool", "saturated")},
    {"unrouted model: any worker serving it", P_SPILL, {G1, F1}, {{0}}, {.model = "free"}, TO("misc", "f1")},
    {"unrouted model, want_target its pool", P_SPILL, {G1, F1}, {{0}}, {.model = "free", .want_target = "misc"},
     TO("misc", "f1")},
    /* Served in two pools, the busier one asked for: the pick is made in
     * that pool (it once picked in any pool, then refused a worker that was
     * not there). */
    {"unrouted model in two pools, want_target the busier", P_SPILL,
     {F1, {"f2", "spare", "free:f32", 2, 1, 0, 1, 0}}, {{0}}, {.model = "free", .want_target = "spare"},
     TO("spare", "f2")},
    {"unrouted model, want_target elsewhere: 503", P_SPILL, {G1, F1}, {{0}},
     {.model = "free", .want_target = "gpu-pool"}, REFUSE(503, "no_capacity")},
    {"unrouted model, want_quant it lacks: 503", P_SPILL, {F1}, {{0}}, {.model = "free", .want_quant = "q8_0"},
     REFUSE(503, "no_capacity")},
    {"unrouted model, exclude the only worker: 503", P_SPILL, {F1}, {{0}}, {.model = "free", .exclude_worker = "f1"},
     REFUSE(503, "no_capacity")},
    {"unrouted model, exclude one of two", P_SPILL, {F1, F2}, {{0}}, {.model = "free", .exclude_worker = "f1"},
     TO("spare", "f2")},
    {"model nobody serves: 404", P_SPILL, {G1, C1}, {{0}}, {.model = "nope"}, REFUSE(404, "model_not_found")},
    {"model names are case-sensitive: 404", P_SPILL, {G1, C1}, {{0}}, {.model = "Llama"},
     REFUSE(404, "model_not_found")},
    /* match conditions */
    {"no class is interactive", P_MATCH, {MW("w1", "fast"), MW("w2", "bulk"), MW("w3", "long")}, {{0}},
     {.model = "m", .prompt_tokens = 50}, TO("fast", "w1")},
    {"interactive short prompt", P_MATCH, {MW("w1", "fast"), MW("w2", "bulk"), MW("w3", "long")}, {{0}},
     {.model = "m", .klass = SW_CLASS_INTERACTIVE, .prompt_tokens = 50}, TO("fast", "w1")},
    {"batch class", P_MATCH, {MW("w1", "fast"), MW("w2", "bulk"), MW("w3", "long")}, {{0}},
     {.model = "m", .klass = SW_CLASS_BATCH, .prompt_tokens = 50}, TO("bulk", "w2")},
    {"batch long prompt: first match wins", P_MATCH, {MW("w1", "fast"), MW("w2", "bulk"), MW("w3", "long")}, {{0}},
     {.model = "m", .klass = SW_CLASS_BATCH, .prompt_tokens = 500}, TO("bulk", "w2")},
    {"prompt_tokens max is inclusive", P_MATCH, {MW("w1", "fast"), MW("w2", "bulk"), MW("w3", "long")}, {{0}},
     {.model = "m", .prompt_tokens = 100}, TO("fast", "w1")},
    {"prompt_tokens min is inclusive", P_MATCH, {MW("w1", "fast"), MW("w2", "bulk"), MW("w3", "long")}, {{0}},
     {.model = "m", .prompt_tokens = 101}, TO("long", "w3")},
    {"matching route's pool empty: 503", P_MATCH, {MW("w2", "bulk"), MW("w3", "long")}, {{0}},
     {.model = "m", .prompt_tokens = 50}, REFUSE(503, "no_worker_available")},
    {"tenant listed", P_MATCH, {MW("w1", "team-a"), MW("w2", "keyed")}, {{0}},
     {.model = "t", .tenant = "globex", .api_key = "sk-team-a-0123456789"}, TO("team-a", "w1")},
    {"api key listed, tenant not", P_MATCH, {MW("w1", "team-a"), MW("w2", "keyed")}, {{0}},
     {.model = "t", .tenant = "initech", .api_key = "sk-team-a-0123456789"}, TO("keyed", "w2")},
    {"api key unlisted: 400", P_MATCH, {MW("w1", "team-a"), MW("w2", "keyed")}, {{0}},
     {.model = "t", .api_key = "sk-team-b-0123456789"}, REFUSE(400, "no_matching_route")},
    {"no tenant, no key: 400", P_MATCH, {MW("w1", "team-a"), MW("w2", "keyed")}, {{0}}, {.model = "t"},
     REFUSE(400, "no_matching_route")},
    {"tenant names are case-sensitive: 400", P_MATCH, {MW("w1", "team-a"), MW("w2", "keyed")}, {{0}},
     {.model = "t", .tenant = "ACME"}, REFUSE(400, "no_matching_route")},
    /* a client key's pools (router.h allowed_pools): routes elsewhere are not its */
    {"key of the overflow pool goes there, not as a spill", P_SPILL, {G1, C1}, {{0}},
     {.model = "llama", .allowed_pools = K_CPU, .n_allowed_pools = 1}, TO("cpu-pool", "c1")},
    {"key of a saturated pool waits for it", P_SPILL, {G1, C1}, {{2, .inflight = 4}},
     {.model = "llama", .allowed_pools = K_CPU, .n_allowed_pools = 1}, WAIT("cpu-pool")},
    {"key with no pool of the model: 403", P_SPILL, {G1, C1}, {{0}},
     {.model = "solo", .allowed_pools = K_CPU, .n_allowed_pools = 1}, REFUSE(403, "route_not_allowed")},
    {"unrouted model outside the key's pools: 403", P_SPILL, {F1}, {{0}},
     {.model = "free", .allowed_pools = K_CPU, .n_allowed_pools = 1}, REFUSE(403, "route_not_allowed")},
    {"unrouted model in the key's second pool", P_SPILL, {F1, F2}, {{0}},
     {.model = "free", .allowed_pools = K_CPU_SPARE, .n_allowed_pools = 2}, TO("spare", "f2")},
};

/* Operators' marks (gateway/ops.h). */
static const ops_row OPS_ROWS[] = {
    {{"drained worker: its pool's other one", P_SPILL, {G1, G2, C1}, {{0}}, {.model = "llama"},
     TO("gpu-pool", "g2")}, {"drain:g1"}},
    {{"every worker of the primary drained: spill as drained", P_SPILL, {G1, C1}, {{0}}, {.model = "llama"},
     SPILL("cpu-pool", "c1", "gpu-pool", "drained")}, {"drain:g1"}},
    {{"cordoned primary pool spills", P_SPILL, {G1, G2, C1}, {{0}}, {.model = "llama"},
     SPILL("cpu-pool", "c1", "gpu-pool", "cordoned")}, {"cordon:gpu-pool"}},
    {{"cordoned overflow pool: primary unaffected", P_SPILL, {G1, C1}, {{0}}, {.model = "llama"},
     TO("gpu-pool", "g1")}, {"cordon:cpu-pool"}},
    {{"model forced onto overflow", P_SPILL, {G1, C1}, {{0}}, {.model = "llama"},
     SPILL("cpu-pool", "c1", "gpu-pool", "forced")}, {"force:llama"}},
    {{"route forced by its name", P_SPILL, {G1, C1}, {{0}}, {.model = "gpt-4o"},
     SPILL("cpu-pool", "c1", "gpu-pool", "forced")}, {"force:llama@gpu-pool"}},
    {{"forcing an overflow route's name changes nothing", P_SPILL, {G1, C1}, {{0}}, {.model = "llama"},
     TO("gpu-pool", "g1")}, {"force:llama@cpu-pool"}},
    {{"forced with no overflow route: 503", P_SPILL, {G1}, {{0}}, {.model = "solo"},
     REFUSE(503, "no_worker_available")}, {"force:solo"}},
    {{"forced, overflow cordoned: 503", P_SPILL, {G1, C1}, {{0}}, {.model = "llama"},
     REFUSE(503, "no_worker_available")}, {"force:llama", "cordon:cpu-pool"}},
    {{"forced and overflow saturated: wait", P_SPILL, {G1, C1}, {{2, .inflight = 4}}, {.model = "llama"},
     WAIT("gpu-pool")}, {"force:llama"}},
    {{"unrouted model, only worker drained: 503, still known", P_SPILL, {F1}, {{0}}, {.model = "free"},
     REFUSE(503, "no_capacity")}, {"drain:f1"}},
};

/* Registers w as its worker would, then sets what its heartbeats said. */
static void add_worker(sw_registry *reg, const wspec *s)
{
    Spillway__ModelInfo info[8], *infos[8];
    char names[8][32], quants[8][32];
    size_t n = 0;
    for (const char *p = s->models; *p && n < 8;) {
        int used = 0;
        if (sscanf(p, " %31[^:]:%31s%n", names[n], quants[n], &used) != 2) break;
        spillway__model_info__init(&info[n]);
        info[n].name = names[n];
        info[n].quantization = quants[n];
        info[n].context_length = 4096;
        infos[n] = &info[n];
        n++;
        p += used;
    }
    Spillway__Register m = SPILLWAY__REGISTER__INIT;
    m.worker_id = (char *)s->id;
    m.pool = (char *)s->pool;
    m.kind = strstr(s->pool, "gpu") ? SPILLWAY__WORKER_KIND__WORKER_KIND_GPU : SPILLWAY__WORKER_KIND__WORKER_KIND_CPU;
    m.n_models = n;
    m.models = infos;
    m.slots = s->slots;
    sw_worker *w = sw_registry_upsert(reg, s->id, strlen(s->id), &m, NOW - s->age_ms);
    CHECK(w != NULL, "registering %s", s->id);
    if (!w) return;
    w->hb_active = s->active;
    w->hb_queued = s->queued;
    w->inflight = s->inflight;
}

/* Feeds a route's counters as the broker does. */
static void set_stats(sw_route_stats **stats, const sw_policy *p, const sspec *s)
{
    if (s->route <= 0 || (size_t)s->route > p->n_routes) return;
    sw_route_stats *st = sw_route_stats_get(stats, &p->routes[s->route - 1]);
    CHECK(st != NULL);
    if (!st) return;
    st->inflight = s->inflight;
    for (uint32_t i = 0; i < s->oks; i++) sw_route_stats_outcome(st, false, false);
    for (uint32_t i = 0; i < s->errors; i++) sw_route_stats_outcome(st, true, false);
    if (s->service_ms) sw_route_stats_service(st, s->service_ms);
}

static bool same(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

static const char *str(const char *s)
{
    return s ? s : "(null)";
}

static const char *kind_name(sw_decide_kind k)
{
    return k == SW_DECIDE_DISPATCH ? "DISPATCH" : k == SW_DECIDE_QUEUE ? "QUEUE" : "REJECT";
}

static void check_decision(const row *t, const sw_policy *p, const sw_route_request *rq, const sw_decision *d)
{
    const expect *e = &t->want;
    CHECK(d->kind == e->kind, "[%s] kind %s, want %s (%s)", t->name, kind_name(d->kind), kind_name(e->kind),
          d->message);
    if (d->kind != e->kind) return;
    if (e->kind == SW_DECIDE_REJECT) {
        CHECK(d->http_status == e->status, "[%s] status %d, want %d", t->name, d->http_status, e->status);
        CHECK(same(d->err_code, e->code), "[%s] code %s, want %s", t->name, str(d->err_code), e->code);
        CHECK(d->message[0] && d->err_type, "[%s] a rejection says why", t->name);
        return;
    }
    CHECK(same(d->pool, e->pool), "[%s] pool %s, want %s", t->name, str(d->pool), str(e->pool));
    if (e->kind == SW_DECIDE_QUEUE) return;
    CHECK(d->worker != NULL, "[%s] no worker", t->name);
    if (d->worker && e->worker)
        CHECK(!strcmp(d->worker->id, e->worker), "[%s] worker %s, want %s", t->name, d->worker->id, e->worker);
    if (d->worker) CHECK(same(d->worker->pool, d->pool), "[%s] worker of pool %s", t->name, d->worker->pool);
    /* A routed model is counted on its route; an implicit route has no counter. */
    bool routed = sw_policy_has_model(p, rq->model);
    CHECK((d->stats != NULL) == routed, "[%s] stats %p for a %s model", t->name, (void *)d->stats,
          routed ? "routed" : "unrouted");
    CHECK(d->spilled == (e->spill_from != NULL), "[%s] spilled %d", t->name, d->spilled);
    CHECK(same(d->spill_from, e->spill_from), "[%s] spill_from %s, want %s", t->name, str(d->spill_from),
          str(e->spill_from));
    CHECK(same(d->spill_reason, e->spill_reason), "[%s] spill_reason %s, want %s", t->name,
          str(d->spill_reason), str(e->spill_reason));
}

/* Sets the row's operator marks as the admin API would. */
static void set_ops(sw_registry *reg, const char *const *ops, size_t n)
{
    static const char *kinds[SW_OPS_N_KINDS] = {"drain:", "cordon:", "force:"};
    for (size_t i = 0; i < n && ops[i]; i++)
        for (int k = 0; k < SW_OPS_N_KINDS; k++)
            if (!strncmp(ops[i], kinds[k], strlen(kinds[k])))
                CHECK(sw_ops_set(&reg->ops, k, ops[i] + strlen(kinds[k]), true, "test", "", NOW) == 0);
}

/* Frees what a test built: the registry's workers and marks, the route
 * counters, the policy. */
static void teardown(sw_registry *reg, sw_route_stats *stats, sw_policy *p)
{
    while (reg->head) sw_registry_remove(reg, reg->head);
    sw_ops_free(&reg->ops);
    pthread_mutex_destroy(&reg->mu);
    sw_route_stats_free(stats);
    sw_policy_unref(p);
}

static void run_row(const row *t, const char *const *ops, size_t n_ops)
{
    char err[4096] = "";
    sw_policy *p = sw_policy_parse("t.yaml", t->policy, strlen(t->policy), err, sizeof err);
    CHECK(p != NULL, "[%s] policy: %s", t->name, err);
    if (!p) return;
    sw_registry reg;
    sw_registry_init(&reg);
    for (size_t i = 0; i < sizeof t->w / sizeof t->w[0] && t->w[i].id; i++) add_worker(&reg, &t->w[i]);
    set_ops(&reg, ops, n_ops);
    sw_route_stats *stats = NULL;
    for (size_t i = 0; i < sizeof t->s / sizeof t->s[0]; i++) set_stats(&stats, p, &t->s[i]);
    sw_route_request rq = t->rq;
    rq.model = sw_policy_resolve(p, rq.model);   /* as the front door does */
    sw_decision d;
    sw_route_decide(p, &reg, &stats, &rq, NOW, &d);
    check_decision(t, p, &rq, &d);
    teardown(&reg, stats, p);
}

/* A route's counters are keyed by its identity, so they survive a reload:
 * saturation counted under one policy object holds in its reparsed twin. */
static void test_stats_survive_reload(void)
{
    char err[4096] = "";
    sw_policy *a = sw_policy_parse("a.yaml", P_SPILL, strlen(P_SPILL), err, sizeof err);
    sw_policy *b = sw_policy_parse("b.yaml", P_NOERR, strlen(P_NOERR), err, sizeof err);
    CHECK(a && b, "%s", err);
    if (!a || !b) { sw_policy_unref(a); sw_policy_unref(b); return; }
    sw_route_stats *stats = NULL;
    sw_route_stats *sa = sw_route_stats_get(&stats, &a->routes[0]);
    CHECK(sa && sa == sw_route_stats_get(&stats, &b->routes[0]));
    CHECK(sa != sw_route_stats_get(&stats, &b->routes[1]));
    sw_route_stats_free(stats);
    sw_policy_unref(a);
    sw_policy_unref(b);
}

/* One decision for "llama" at `now`, the workers heard from just before. */
static sw_decision decide_at(const sw_policy *p, sw_registry *reg, sw_route_stats **stats, int64_t now)
{
    for (sw_worker *w = reg->head; w; w = w->next) w->last_seen_ms = now - 1;
    sw_route_request rq = {.model = "llama"};
    sw_decision d;
    sw_route_decide(p, reg, stats, &rq, now, &d);
    return d;
}

/* A route degraded by its error rate gets no request, except one every
 * probe interval (5 s); a failed probe keeps it degraded until the next, a
 * successful one restores it with its rate cleared. */
static void test_degraded_route_is_probed(void)
{
    char err[4096] = "";
    sw_policy *p = sw_policy_parse("t.yaml", P_SPILL, strlen(P_SPILL), err, sizeof err);
    CHECK(p != NULL, "%s", err);
    if (!p) return;
    sw_registry reg;
    sw_registry_init(&reg);
    const wspec g1 = G1, c1 = C1;
    add_worker(&reg, &g1);
    add_worker(&reg, &c1);
    sw_route_stats *stats = NULL;
    set_stats(&stats, p, &(sspec){1, .errors = 10});
    const struct { int64_t at; const char *pool; bool probe; int outcome; } steps[] = {
        {0, "cpu-pool", false, -1},        /* degraded: the first probe is 5 s away */
        {4999, "cpu-pool", false, -1},
        {5000, "gpu-pool", true, -1},      /* the probe; its outcome not in yet */
        {5001, "cpu-pool", false, 1},      /* one probe at a time; then it fails */
        {9999, "cpu-pool", false, -1},
        {10000, "gpu-pool", true, 0},      /* the next probe, which succeeds */
        {10001, "gpu-pool", false, -1},    /* restored */
    };
    sw_route_stats *gpu = sw_route_stats_get(&stats, &p->routes[0]);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        sw_decision d = decide_at(p, &reg, &stats, NOW + steps[i].at);
        CHECK(d.kind == SW_DECIDE_DISPATCH && same(d.pool, steps[i].pool) && d.probe == steps[i].probe,
              "at +%lld ms: %s to %s, probe %d; want %s, probe %d", (long long)steps[i].at, kind_name(d.kind),
              str(d.pool), d.probe, steps[i].pool, steps[i].probe);
        /* the probe's outcome (-1: none yet; 1: an error), as the broker hands it back */
        if (steps[i].outcome >= 0) sw_route_stats_outcome(gpu, steps[i].outcome == 1, true);
    }
    CHECK(gpu && gpu->err_ewma == 0 && gpu->samples == 0, "a successful probe clears the rate");
    teardown(&reg, stats, p);
}

/* The operators' marks: set, replaced, cleared; the log keeps the newest
 * SW_OPS_LOG actions, repeats included. */
static void test_ops_marks_and_log(void)
{
    sw_ops o = {0};
    CHECK(sw_ops_set(&o, SW_OPS_DRAIN, "w1", true, "a", "first", 1) == 0);
    CHECK(sw_ops_set(&o, SW_OPS_DRAIN, "w1", true, "b", "second", 2) == 0);
    const sw_ops_mark *m = sw_ops_find(&o, SW_OPS_DRAIN, "w1");
    CHECK(m && !strcmp(m->by, "b") && !strcmp(m->reason, "second") && m->since_ms == 2);
    CHECK(!sw_ops_find(&o, SW_OPS_CORDON, "w1"), "kinds are apart");
    CHECK(sw_ops_set(&o, SW_OPS_DRAIN, "w1", false, "c", "", 3) == 0 && !sw_ops_find(&o, SW_OPS_DRAIN, "w1"));
    for (int i = 0; i < 300; i++) sw_ops_set(&o, SW_OPS_FORCE, "m@p", i % 2 == 0, "x", "", 10 + i);
    CHECK(sw_ops_recent(&o, 0)->at_ms == 309 && !strcmp(sw_ops_recent(&o, 0)->action, "force-overflow off"));
    CHECK(sw_ops_recent(&o, SW_OPS_LOG - 1) && sw_ops_recent(&o, SW_OPS_LOG - 1)->at_ms == 309 - (SW_OPS_LOG - 1));
    CHECK(sw_ops_recent(&o, SW_OPS_LOG) == NULL);
    sw_ops_set(&o, SW_OPS_FORCE, "m@p", true, "x", "", 400);
    CHECK(sw_ops_route_forced(&o, "m", "p") && !sw_ops_route_forced(&o, "m", "q") && !sw_ops_route_forced(&o, "n", "p"));
    sw_ops_free(&o);
}

int main(void)
{
    srand(1);   /* power-of-two choices draws from rand() */
    size_t n = sizeof ROWS / sizeof ROWS[0];
    for (size_t i = 0; i < n; i++) run_row(&ROWS[i], NULL, 0);
    for (size_t i = 0; i < sizeof OPS_ROWS / sizeof OPS_ROWS[0]; i++, n++)
        run_row(&OPS_ROWS[i].r, OPS_ROWS[i].ops, sizeof OPS_ROWS[i].ops / sizeof OPS_ROWS[i].ops[0]);
    test_stats_survive_reload();
    test_degraded_route_is_probed();
    test_ops_marks_and_log();
    printf("%zu routing rows\n", n);
    CHECK_DONE();
}
