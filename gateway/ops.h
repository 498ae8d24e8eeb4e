/* Operator state: what operators set by hand through the admin API —
 * drained workers, cordoned pools, routes forced onto their overflow — and
 * the log of what they did, by whom and why.
 *
 * It is kept apart from the policy and keyed by name (worker id, pool name,
 * route name), so a policy reload, a worker reconnecting or a pool emptying
 * leaves it as the operator set it. It lives in the registry and is read
 * and written under reg.mu: the router reads it on every decision, the
 * admin API changes it.
 *
 * A route's name is "model@pool" (its model and target); forcing a model's
 * overflow by the model name alone covers every primary route of it.
 *
 * Layer: pure data, below the registry; uses nothing of the gateway.
 */
#ifndef SW_GW_OPS_H
#define SW_GW_OPS_H

#include <stdbool.h>
#include <stdint.h>

typedef enum { SW_OPS_DRAIN = 0, SW_OPS_CORDON = 1, SW_OPS_FORCE = 2, SW_OPS_N_KINDS } sw_ops_kind;

/* One thing set: a drained worker, a cordoned pool or a forced route. */
typedef struct sw_ops_mark {
    char *name;
    char *by, *reason;
    int64_t since_ms;           /* wall clock (Unix ms): operators read it as a date */
    struct sw_ops_mark *next;
} sw_ops_mark;

#define SW_OPS_LOG 256          /* actions kept for `spillway ops status` */
#define SW_OPS_TEXT_MAX 256     /* longest name, identity or reason accepted */

typedef struct {
    int64_t at_ms;              /* wall clock (Unix ms) */
    char action[24];            /* "drain", "uncordon", "force-overflow on", ... */
    char target[SW_OPS_TEXT_MAX + 1];
    char by[SW_OPS_TEXT_MAX + 1];
    char reason[SW_OPS_TEXT_MAX + 1];
} sw_ops_action;

typedef struct {
    sw_ops_mark *marks[SW_OPS_N_KINDS];
    sw_ops_action log[SW_OPS_LOG];   /* a ring: log[n_log % SW_OPS_LOG] is the next */
    uint64_t n_log;
} sw_ops;

/* The mark of `name`, or NULL when it is not set. */
const sw_ops_mark *sw_ops_find(const sw_ops *o, sw_ops_kind k, const char *name);
/* Sets (on) or clears the mark of `name` and logs the action, whether or not
 * it changed anything (an operator's repeat is still an action). 0, or -1
 * out of memory. */
int sw_ops_set(sw_ops *o, sw_ops_kind k, const char *name, bool on, const char *by,
               const char *reason, int64_t now_ms);
/* Whether the route (model, pool) is forced onto its overflow: by its own
 * name "model@pool" or by the model's. */
bool sw_ops_route_forced(const sw_ops *o, const char *model, const char *pool);
/* The action i places back from the newest (0 = newest), or NULL. */
const sw_ops_action *sw_ops_recent(const sw_ops *o, unsigned i);
void sw_ops_free(sw_ops *o);

/* The verb of an action, as logged: "drain"/"undrain", "cordon"/"uncordon",
 * "force-overflow on"/"force-overflow off". */
const char *sw_ops_verb(sw_ops_kind k, bool on);

#endif
