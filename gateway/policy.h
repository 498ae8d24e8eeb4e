/* The routing policy (routes.yaml), parsed with libyaml.
 *
 * A policy is immutable once loaded: hot reload builds a new one and swaps the
 * pointer (refcounted), so requests in flight keep the policy they started
 * with. Every validation error carries file:line:column. Schema: docs/routing.md.
 */
#ifndef SW_POLICY_H
#define SW_POLICY_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

typedef enum { SW_POOL_ANY = 0, SW_POOL_CPU = 1, SW_POOL_GPU = 2 } sw_pool_kind;
typedef enum { SW_PRIO_PRIMARY = 0, SW_PRIO_OVERFLOW = 1 } sw_route_priority;
typedef enum { SW_CLASS_ANY = 0, SW_CLASS_INTERACTIVE = 1, SW_CLASS_BATCH = 2 } sw_request_class;

typedef struct {
    char *name;
    sw_pool_kind kind;
    uint32_t max_concurrency;   /* 0 = unlimited */
    uint32_t max_queue;         /* 0 = policy default */
    /* What one worker of the pool costs an hour, in dollars (cost_per_hour);
     * has_cost false: no price given, so its requests are not costed. */
    double cost_per_hour;
    bool has_cost;
} sw_pool_def;

typedef struct {
    char *model;                /* the model name clients ask for */
    char *quantization;         /* NULL = any */
    char *target;               /* pool name */
    uint32_t max_concurrency;   /* 0 = unlimited */
    sw_route_priority priority;
    /* optional match conditions (all must hold) */
    sw_request_class match_class;
    uint32_t match_min_prompt_tokens, match_max_prompt_tokens; /* max 0 = unbounded */
    char **match_api_keys; size_t n_match_api_keys;
    char **match_tenants;  size_t n_match_tenants;
    int line, column;           /* where it was defined, for messages */
} sw_route;

typedef struct { char *alias; char *model; } sw_alias;

typedef struct {
    uint32_t queue_length;      /* default 256: requests waiting when nothing has capacity */
    uint32_t queue_timeout_ms;  /* default 30000 */
    uint32_t request_timeout_ms;/* default 600000 */
    uint32_t first_token_timeout_ms; /* default 120000 */
    float error_rate_threshold; /* default 0.5 over the recent window */
} sw_policy_defaults;

typedef struct sw_policy {
    int refcount;               /* atomic */
    uint64_t version;           /* increases with every successful load */
    char *path;
    char *source;               /* the file text, for GET /admin/policy */
    sw_pool_def *pools; size_t n_pools;
    sw_route *routes; size_t n_routes;
    sw_alias *aliases; size_t n_aliases;
    sw_policy_defaults defaults;
} sw_policy;

/* Loads and validates a file. On error returns NULL and writes every problem
 * found, one per line, as "file:line:column: message" into err. */
sw_policy *sw_policy_load(const char *path, char *err, size_t errlen);
/* Same from a buffer; `name` is used as the file name in messages. */
sw_policy *sw_policy_parse(const char *name, const char *text, size_t len, char *err, size_t errlen);
sw_policy *sw_policy_ref(sw_policy *p);
void sw_policy_unref(sw_policy *p);

/* Resolves an alias (or returns name unchanged). */
const char *sw_policy_resolve(const sw_policy *p, const char *name);
const sw_pool_def *sw_policy_pool(const sw_policy *p, const char *name);
/* JSON text describing the active policy (caller frees). */
char *sw_policy_to_json(const sw_policy *p);

#endif
