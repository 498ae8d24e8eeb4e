/* Operator state: marks by name and a ring of the actions that set them.
 *
 * Few marks are ever set at once (a handful of workers drained for
 * maintenance, a pool or two cordoned), so each kind is a plain list.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gateway/ops.h"

const char *sw_ops_verb(sw_ops_kind k, bool on)
{
    static const char *verbs[SW_OPS_N_KINDS][2] = {
        {"undrain", "drain"}, {"uncordon", "cordon"}, {"force-overflow off", "force-overflow on"}};
    return verbs[k][on];
}

const sw_ops_mark *sw_ops_find(const sw_ops *o, sw_ops_kind k, const char *name)
{
    for (const sw_ops_mark *m = o->marks[k]; m; m = m->next)
        if (strcmp(m->name, name) == 0) return m;
    return NULL;
}

static void mark_free(sw_ops_mark *m)
{
    free(m->name);
    free(m->by);
    free(m->reason);
    free(m);
}

/* Clears the mark of name, if set. */
static void unmark(sw_ops *o, sw_ops_kind k, const char *name)
{
    for (sw_ops_mark **p = &o->marks[k]; *p; p = &(*p)->next)
        if (strcmp((*p)->name, name) == 0) {
            sw_ops_mark *m = *p;
            *p = m->next;
            mark_free(m);
            return;
        }
}

/* Sets the mark of name, replacing who set it and why. */
static int mark(sw_ops *o, sw_ops_kind k, const char *name, const char *by, const char *reason,
                int64_t now)
{
    sw_ops_mark *m = calloc(1, sizeof *m);
    if (!m || !(m->name = strdup(name)) || !(m->by = strdup(by)) || !(m->reason = strdup(reason))) {
        if (m) mark_free(m);
        return -1;
    }
    m->since_ms = now;
    unmark(o, k, name);
    m->next = o->marks[k];
    o->marks[k] = m;
    return 0;
}

static void log_action(sw_ops *o, sw_ops_kind k, const char *name, bool on, const char *by,
                       const char *reason, int64_t now)
{
    sw_ops_action *a = &o->log[o->n_log++ % SW_OPS_LOG];
    a->at_ms = now;
    snprintf(a->action, sizeof a->action, "%s", sw_ops_verb(k, on));
    snprintf(a->target, sizeof a->target, "%s", name);
    snprintf(a->by, sizeof a->by, "%s", by);
    snprintf(a->reason, sizeof a->reason, "%s", reason);
}

int sw_ops_set(sw_ops *o, sw_ops_kind k, const char *name, bool on, const char *by,
               const char *reason, int64_t now_ms)
{
    if (on && mark(o, k, name, by, reason, now_ms) != 0) return -1;
    if (!on) unmark(o, k, name);
    log_action(o, k, name, on, by, reason, now_ms);
    return 0;
}

bool sw_ops_route_forced(const sw_ops *o, const char *model, const char *pool)
{
    if (sw_ops_find(o, SW_OPS_FORCE, model)) return true;
    char name[2 * SW_OPS_TEXT_MAX + 2];
    snprintf(name, sizeof name, "%s@%s", model, pool);
    return sw_ops_find(o, SW_OPS_FORCE, name) != NULL;
}

const sw_ops_action *sw_ops_recent(const sw_ops *o, unsigned i)
{
    if (i >= o->n_log || i >= SW_OPS_LOG) return NULL;
    return &o->log[(o->n_log - 1 - i) % SW_OPS_LOG];
}

void sw_ops_free(sw_ops *o)
{
    for (int k = 0; k < SW_OPS_N_KINDS; k++)
        while (o->marks[k]) {
            sw_ops_mark *m = o->marks[k];
            o->marks[k] = m->next;
            mark_free(m);
        }
}
