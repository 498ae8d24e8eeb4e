/* The operators' actions on the admin API (docs/operations.md):
 *
 *   POST /admin/workers/ID/drain | undrain      finish what it has, take nothing new
 *   POST /admin/pools/POOL/cordon | uncordon    the pool takes nothing new
 *   POST /admin/routes/ROUTE/force-overflow     {"on": true|false}: a primary
 *        route's requests go to its model's overflow routes (ROUTE is
 *        "model@pool", or a model for all its primary routes)
 *
 * Each takes an optional JSON body {"reason": "...", "operator": "..."}.
 * The action is set in the registry's operator state (ops.h), logged on
 * stderr and in the status document with who did it (the operator's name,
 * as the admin-token holder gave it, and the client's address) and why, and
 * the broker is told so its wait queue moves at once. http.c has already
 * checked the admin token.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cjson/cJSON.h>
#include "gateway/admin.h"
#include "gateway/broker.h"
#include "gateway/openai.h"
#include "gateway/util.h"

#define OPERATOR_MAX 64

typedef struct {
    sw_ops_kind kind;
    bool on;
    char name[SW_OPS_TEXT_MAX + 1];
    char reason[SW_OPS_TEXT_MAX + 1];
    char op[OPERATOR_MAX + 1];
    int has_on;               /* force-overflow: -1 absent, else the value */
} action;

static const struct { const char *prefix, *verb_on, *verb_off; sw_ops_kind kind; } SHAPES[] = {
    {"/admin/workers/", "drain", "undrain", SW_OPS_DRAIN},
    {"/admin/pools/", "cordon", "uncordon", SW_OPS_CORDON},
    {"/admin/routes/", "force-overflow", NULL, SW_OPS_FORCE},
};

bool sw_admin_is_action(const char *url)
{
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++)
        if (strncmp(url, SHAPES[i].prefix, strlen(SHAPES[i].prefix)) == 0) return true;
    return false;
}

static int fail(char **json, int status, const char *msg, const char *param, const char *code)
{
    *json = sw_openai_error_json(msg, status == 404 ? "not_found_error" : "invalid_request_error", param, code);
    return status;
}

/* The URL's kind, name and verb into a. 0, or an HTTP status with *json. */
static int parse_url(const char *url, action *a, char **json)
{
    char msg[400];
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++) {
        size_t pl = strlen(SHAPES[i].prefix);
        if (strncmp(url, SHAPES[i].prefix, pl) != 0) continue;
        const char *name = url + pl, *slash = strrchr(name, '/');
        const char *verb = slash ? slash + 1 : "";
        size_t n = slash ? (size_t)(slash - name) : 0;
        a->kind = SHAPES[i].kind;
        a->on = strcmp(verb, SHAPES[i].verb_on) == 0;
        if (!a->on && !(SHAPES[i].verb_off && strcmp(verb, SHAPES[i].verb_off) == 0)) {
            snprintf(msg, sizeof msg, "no such admin action: %.200s (use %sNAME/%s%s%s)", url, SHAPES[i].prefix,
                     SHAPES[i].verb_on, SHAPES[i].verb_off ? " or /" : "", SHAPES[i].verb_off ? SHAPES[i].verb_off : "");
            return fail(json, 404, msg, NULL, "not_found");
        }
        if (n == 0 || n > SW_OPS_TEXT_MAX)
            return fail(json, 400, "the name in the URL must be 1 to 256 bytes", NULL, "invalid_name");
        memcpy(a->name, name, n);
        a->name[n] = 0;
        return 0;
    }
    return fail(json, 404, "no such admin action", NULL, "not_found");
}

/* A text field of the body: a string of at most max bytes with no control
 * characters (it goes into log lines, which a newline could forge). */
static int text_field(cJSON *o, const char *key, char *out, size_t max, char **json)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return 0;
    char msg[200];
    if (!cJSON_IsString(v)) {
        snprintf(msg, sizeof msg, "'%s' must be a string", key);
        return fail(json, 400, msg, key, "invalid_type");
    }
    size_t n = strlen(v->valuestring);
    bool ctl = false;
    for (size_t i = 0; i < n; i++) ctl |= (unsigned char)v->valuestring[i] < 0x20 || v->valuestring[i] == 0x7f;
    if (n > max || ctl) {
        snprintf(msg, sizeof msg, "'%s' must be at most %zu bytes with no control characters", key, max);
        return fail(json, 400, msg, key, "invalid_value");
    }
    memcpy(out, v->valuestring, n + 1);
    return 0;
}

/* The body's reason, operator and "on" into a. 0, or a status with *json. */
static int parse_body(const char *body, size_t len, action *a, char **json)
{
    a->has_on = -1;
    if (len == 0) return 0;
    char msg[300];
    const char *param;
    cJSON *o = sw_json_body(body, len, msg, sizeof msg, &param);
    if (!o) return fail(json, 400, msg, param, "invalid_body");
    int rc = 0;
    for (cJSON *f = o->child; f && !rc; f = f->next)
        if (strcmp(f->string, "reason") && strcmp(f->string, "operator") && strcmp(f->string, "on")) {
            snprintf(msg, sizeof msg, "unknown field '%.100s' (the fields are reason, operator and, for "
                     "force-overflow, on)", f->string);
            rc = fail(json, 400, msg, f->string, "unknown_field");
        }
    if (!rc) rc = text_field(o, "reason", a->reason, SW_OPS_TEXT_MAX, json);
    if (!rc) rc = text_field(o, "operator", a->op, OPERATOR_MAX, json);
    cJSON *on = cJSON_GetObjectItemCaseSensitive(o, "on");
    if (!rc && on && !cJSON_IsBool(on)) rc = fail(json, 400, "'on' must be true or false", "on", "invalid_type");
    if (!rc && on) a->has_on = cJSON_IsTrue(on);
    cJSON_Delete(o);
    return rc;
}

/* Whether the pool is known: in the policy, a route's target, or a
 * connected worker's. Caller holds reg.mu. */
static bool pool_known(const sw_policy *p, const sw_registry *reg, const char *pool)
{
    if (sw_policy_pool(p, pool)) return true;
    for (size_t i = 0; i < p->n_routes; i++)
        if (!strcmp(p->routes[i].target, pool)) return true;
    for (const sw_worker *w = reg->head; w; w = w->next)
        if (!strcmp(w->pool, pool)) return true;
    return false;
}

/* True when the policy has an overflow route for model. */
static bool has_overflow_route(const sw_policy *p, const char *model)
{
    for (size_t i = 0; i < p->n_routes; i++)
        if (p->routes[i].priority == SW_PRIO_OVERFLOW && !strcmp(p->routes[i].model, model)) return true;
    return false;
}

/* Whether name ("model@pool", or a model) names a primary route, with
 * *has_overflow whether every model it names has an overflow route to take
 * the forced traffic. */
static bool route_known(const sw_policy *p, const char *name, bool *has_overflow)
{
    bool known = false;
    *has_overflow = true;
    for (size_t i = 0; i < p->n_routes; i++) {
        const sw_route *r = &p->routes[i];
        char rn[2 * SW_OPS_TEXT_MAX + 2];
        snprintf(rn, sizeof rn, "%s@%s", r->model, r->target);
        if (r->priority != SW_PRIO_PRIMARY || (strcmp(name, r->model) && strcmp(name, rn))) continue;
        known = true;
        *has_overflow &= has_overflow_route(p, r->model);
    }
    return known;
}

/* Whether the action's target exists; 0, or 404 with *json. Caller holds
 * reg.mu. A drain must name a connected worker (a typo must not pass as
 * done); the mark then outlives the worker's reconnections. */
static int check_target(sw_gateway *g, const sw_policy *p, const action *a, bool *no_overflow, char **json)
{
    char msg[400];
    *no_overflow = false;
    if (a->kind == SW_OPS_DRAIN && !sw_registry_find_id(&g->reg, a->name) && a->on) {
        snprintf(msg, sizeof msg, "no worker '%.256s' is registered (GET /admin/workers lists them)", a->name);
        return fail(json, 404, msg, NULL, "worker_not_found");
    }
    if (a->kind == SW_OPS_CORDON && !pool_known(p, &g->reg, a->name)) {
        snprintf(msg, sizeof msg, "no pool '%.256s' in the policy or among the workers", a->name);
        return fail(json, 404, msg, NULL, "pool_not_found");
    }
    bool has_overflow;
    if (a->kind == SW_OPS_FORCE && !route_known(p, a->name, &has_overflow)) {
        snprintf(msg, sizeof msg, "no primary route '%.256s' (a model, or model@pool: GET /admin/status lists "
                 "the routes)", a->name);
        return fail(json, 404, msg, NULL, "route_not_found");
    }
    if (a->kind == SW_OPS_FORCE) *no_overflow = !has_overflow;
    return 0;
}

static const char *kind_noun(sw_ops_kind k)
{
    return k == SW_OPS_DRAIN ? "worker" : k == SW_OPS_CORDON ? "pool" : "route";
}

/* The answer: what was done, by whom, and the target's state now. */
static char *answer(sw_gateway *g, const action *a, const char *by, bool no_overflow)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "ok", true);
    cJSON_AddStringToObject(o, "action", sw_ops_verb(a->kind, a->on));
    cJSON_AddStringToObject(o, kind_noun(a->kind), a->name);
    cJSON_AddStringToObject(o, "by", by);
    cJSON_AddStringToObject(o, "reason", a->reason);
    if (a->kind == SW_OPS_DRAIN) {
        pthread_mutex_lock(&g->reg.mu);
        sw_worker *w = sw_registry_find_id(&g->reg, a->name);
        if (w) {
            cJSON_AddStringToObject(o, "state", sw_worker_state_name(&g->reg, w, sw_now_ms()));
            cJSON_AddNumberToObject(o, "inflight", w->inflight);
        }
        pthread_mutex_unlock(&g->reg.mu);
    }
    if (no_overflow && a->on)
        cJSON_AddStringToObject(o, "warning", "the model has no overflow route: its requests get 503 until this "
                                "is turned off");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* Operators read the log's times as dates: the wall clock, not the
 * monotonic one the router uses. */
static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int sw_admin_action(sw_gateway *g, const char *url, const char *body, size_t len, const char *peer, char **json)
{
    action a = {0};
    int rc = parse_url(url, &a, json);
    if (!rc) rc = parse_body(body, len, &a, json);
    if (!rc && a.kind == SW_OPS_FORCE) {
        if (a.has_on < 0) return fail(json, 400, "force-overflow needs {\"on\": true} or {\"on\": false}", "on",
                                      "missing_field");
        a.on = a.has_on;
    }
    if (rc) return rc;
    char by[OPERATOR_MAX + 64];
    snprintf(by, sizeof by, "%s@%s", a.op[0] ? a.op : "admin", peer && *peer ? peer : "?");
    sw_policy *p = sw_gw_policy(g);
    bool no_overflow;
    pthread_mutex_lock(&g->reg.mu);
    rc = check_target(g, p, &a, &no_overflow, json);
    if (!rc && sw_ops_set(&g->reg.ops, a.kind, a.name, a.on, by, a.reason, wall_ms()) != 0)
        rc = fail(json, 500, "out of memory", NULL, "internal_error");
    pthread_mutex_unlock(&g->reg.mu);
    sw_policy_unref(p);
    if (rc) return rc;
    fprintf(stderr, "gateway: operator %s: %s %s %s (reason: %s)\n", by, sw_ops_verb(a.kind, a.on),
            kind_noun(a.kind), a.name, a.reason[0] ? a.reason : "none given");
    sw_broker_post(g, SW_CMD_OPS, NULL);
    *json = answer(g, &a, by, no_overflow);
    return 200;
}
