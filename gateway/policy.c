/* The routing policy: routes.yaml -> sw_policy, validated with positions.
 *
 * We use libyaml's document API (yaml_parser_load): every node keeps its start
 * mark, so any problem can be reported as file:line:column. libyaml accepts
 * things a policy must not (duplicate keys, floats where we want counts,
 * unknown keys), so all of that is checked here. Validation never stops at the
 * first problem: every error is collected, sorted by position, and written out
 * one per line, so a user fixes a file in one pass. Schema: docs/routing.md.
 */
#include "gateway/policy.h"

#include <yaml.h>
#include <cjson/cJSON.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bounds that keep a hostile or mistaken file from costing unbounded time:
 * a real policy is a few KiB with tens of routes. */
#define POLICY_MAX_BYTES   (4u << 20)
#define POLICY_MAX_ROUTES  4096
#define POLICY_MAX_ALIASES 4096
#define POLICY_MAX_POOLS   1024
#define POLICY_MAX_ERRORS  200

static uint64_t g_policy_version;   /* process-wide, bumped by each successful load */

/* ---- error collection --------------------------------------------------- */

typedef struct {
    int line, column;   /* 1-based */
    int seq;            /* order of discovery, to keep the sort stable */
    char *text;
} perror_t;

typedef struct {
    const char *name;           /* file name used in messages */
    yaml_document_t *doc;
    sw_policy *p;
    perror_t *errs; int n_errs, cap_errs, n_dropped;
    bool oom;
    bool have_pools_section;
    int *pool_line;             /* where each pool was defined (parallel to p->pools) */
    /* Where the parts of each route and alias were, for the cross-checks that
     * run after parsing (parallel to p->routes and p->aliases). */
    struct { yaml_mark_t target, priority; bool broken; } *route_marks;
    struct { yaml_mark_t name, model; } *alias_marks;
} pctx;

static void add_error(pctx *c, int line, int column, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void add_error(pctx *c, int line, int column, const char *fmt, ...)
{
    if (c->n_errs >= POLICY_MAX_ERRORS) { c->n_dropped++; return; }
    if (c->n_errs == c->cap_errs) {
        int nc = c->cap_errs ? c->cap_errs * 2 : 16;
        perror_t *ne = realloc(c->errs, (size_t)nc * sizeof *ne);
        if (!ne) { c->oom = true; c->n_dropped++; return; }
        c->errs = ne; c->cap_errs = nc;
    }
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    /* Names quoted from the file may hold newlines: keep one error per line. */
    for (char *q = buf; *q; q++)
        if ((unsigned char)*q < 0x20) *q = '?';
    char *t = strdup(buf);
    if (!t) { c->oom = true; c->n_dropped++; return; }
    c->errs[c->n_errs] = (perror_t){ line, column, c->n_errs, t };
    c->n_errs++;
}

/* libyaml marks are 0-based; users count from 1. */
#define ERR_AT(c, mark, ...) add_error((c), (int)(mark).line + 1, (int)(mark).column + 1, __VA_ARGS__)

static int cmp_errors(const void *a, const void *b)
{
    const perror_t *x = a, *y = b;
    if (x->line != y->line) return x->line < y->line ? -1 : 1;
    if (x->column != y->column) return x->column < y->column ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Writes the errors into err, whole lines only: when they do not all fit, the
 * last line says how many were left out instead of cutting one in half. */
static void write_error_lines(pctx *c, char *err, size_t errlen);

static void write_errors(pctx *c, char *err, size_t errlen)
{
    if (!err || errlen == 0) return;
    err[0] = '\0';
    write_error_lines(c, err, errlen);
    /* No trailing newline: callers print the text with their own. */
    size_t L = strlen(err);
    if (L > 0 && err[L - 1] == '\n') err[L - 1] = '\0';
}

static void write_error_lines(pctx *c, char *err, size_t errlen)
{
    if (c->n_errs > 1) qsort(c->errs, (size_t)c->n_errs, sizeof *c->errs, cmp_errors);
    size_t used = 0;
    int total = c->n_errs + c->n_dropped;
    for (int i = 0; i < c->n_errs; i++) {
        char line[4800];   /* a PATH_MAX file name and a 512-byte message */
        int n = snprintf(line, sizeof line, "%s:%d:%d: %s\n", c->name, c->errs[i].line,
                         c->errs[i].column, c->errs[i].text);
        if (n < 0) continue;
        if ((size_t)n >= sizeof line) { n = (int)sizeof line - 1; line[n - 1] = '\n'; }
        char tail[80];
        int left_after = total - i - 1;
        int tn = left_after > 0 ? snprintf(tail, sizeof tail, "... and %d more errors\n", left_after) : 0;
        if (used + (size_t)n + (size_t)tn >= errlen) {
            snprintf(tail, sizeof tail, "... and %d more errors\n", total - i);
            if (used + strlen(tail) < errlen) memcpy(err + used, tail, strlen(tail) + 1);
            else if (i == 0 && errlen > 1) { /* not even one line fits: keep its start */
                size_t k = errlen - 1;
                memcpy(err, line, k); err[k] = '\0';
            }
            return;
        }
        memcpy(err + used, line, (size_t)n);
        used += (size_t)n;
        err[used] = '\0';
    }
    if (c->n_dropped > 0) {
        char tail[80];
        int tn = snprintf(tail, sizeof tail, "... and %d more errors\n", c->n_dropped);
        if (used + (size_t)tn < errlen) memcpy(err + used, tail, (size_t)tn + 1);
    }
}

static void free_errors(pctx *c)
{
    for (int i = 0; i < c->n_errs; i++) free(c->errs[i].text);
    free(c->errs);
}

static char *xstrdup(pctx *c, const char *s)
{
    char *d = strdup(s);
    if (!d) c->oom = true;
    return d;
}

/* ---- did you mean? ------------------------------------------------------ */

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    size_t row[64], prev[64];
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            size_t del = prev[j] + 1, ins = row[j - 1] + 1;
            row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, row, (lb + 1) * sizeof *row);
    }
    return prev[lb];
}

/* The closest candidate if it is close enough to be a plausible typo. */
static const char *closest(const char *word, const char *const *cands, size_t n)
{
    const char *best = NULL;
    size_t bestd = 99;
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(word, cands[i]);
        size_t len = strlen(cands[i]);
        size_t limit = len <= 4 ? 1 : len <= 8 ? 2 : 3;
        if (d <= limit && d < bestd) { best = cands[i]; bestd = d; }
    }
    return best;
}

/* " (did you mean 'x'?)" or "" */
static const char *suggest(char *buf, size_t n, const char *word, const char *const *cands, size_t nc)
{
    const char *s = closest(word, cands, nc);
    if (s) snprintf(buf, n, " (did you mean '%s'?)", s);
    else buf[0] = '\0';
    return buf;
}

/* ---- node helpers ------------------------------------------------------- */

static yaml_node_t *node_at(pctx *c, int index)
{
    return yaml_document_get_node(c->doc, index);
}

static const char *node_kind(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_SCALAR_NODE:   return "a scalar";
    case YAML_SEQUENCE_NODE: return "a sequence";
    case YAML_MAPPING_NODE:  return "a mapping";
    default:                 return "nothing";
    }
}

static const char *scalar(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

/* An unquoted empty/~/null value: YAML's null. libyaml leaves scalars untyped,
 * so this is where we decide it. */
static bool is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *s = scalar(n);
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static bool is_plain(const yaml_node_t *n)
{
    return n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

/* Sorting keys to find duplicates in O(k log k) even in a huge mapping. */
typedef struct { const char *key; int pos; yaml_mark_t mark; } keyref;

static int cmp_keyref(const void *a, const void *b)
{
    const keyref *x = a, *y = b;
    int r = strcmp(x->key, y->key);
    return r ? r : (x->pos > y->pos) - (x->pos < y->pos);
}

/* Checks a mapping's keys: scalars, no duplicates, all in `allowed` (when given).
 * Returns false when the node is not a mapping at all. */
static bool check_mapping(pctx *c, yaml_node_t *n, const char *what,
                          const char *const *allowed, size_t n_allowed)
{
    if (n->type != YAML_MAPPING_NODE) {
        ERR_AT(c, n->start_mark, "%s must be a mapping, got %s", what, node_kind(n));
        return false;
    }
    size_t k = (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
    keyref *refs = k ? calloc(k, sizeof *refs) : NULL;
    if (k && !refs) { c->oom = true; return true; }
    size_t nr = 0;
    for (size_t i = 0; i < k; i++) {
        yaml_node_pair_t *pr = n->data.mapping.pairs.start + i;
        yaml_node_t *key = node_at(c, pr->key);
        if (!key) continue;
        if (key->type != YAML_SCALAR_NODE) {
            ERR_AT(c, key->start_mark, "%s: keys must be plain names, got %s", what, node_kind(key));
            continue;
        }
        refs[nr++] = (keyref){ scalar(key), (int)i, key->start_mark };
        if (!allowed) continue;
        bool ok = false;
        for (size_t j = 0; j < n_allowed && !ok; j++) ok = !strcmp(scalar(key), allowed[j]);
        if (!ok) {
            char hint[96];
            ERR_AT(c, key->start_mark, "unknown key '%s' in %s%s", scalar(key), what,
                   suggest(hint, sizeof hint, scalar(key), allowed, n_allowed));
        }
    }
    if (nr > 1) qsort(refs, nr, sizeof *refs, cmp_keyref);   /* refs is NULL for an empty mapping */
    for (size_t i = 1, first = 0; i < nr; i++) {
        if (strcmp(refs[i].key, refs[first].key)) { first = i; continue; }
        ERR_AT(c, refs[i].mark, "duplicate key '%s' in %s (first given at line %d)",
               refs[i].key, what, (int)refs[first].mark.line + 1);
    }
    free(refs);
    return true;
}

/* The value of `key` in mapping n (the first, if duplicated), or NULL. */
static yaml_node_t *get(pctx *c, yaml_node_t *n, const char *key)
{
    if (!n || n->type != YAML_MAPPING_NODE) return NULL;
    for (yaml_node_pair_t *pr = n->data.mapping.pairs.start; pr < n->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = node_at(c, pr->key);
        if (k && k->type == YAML_SCALAR_NODE && !strcmp(scalar(k), key)) return node_at(c, pr->value);
    }
    return NULL;
}

/* A non-empty string. Plain scalars are taken as written (a model may well be
 * called 7b); only YAML null is refused. */
static bool get_string(pctx *c, yaml_node_t *v, const char *field, const char **out)
{
    if (v->type != YAML_SCALAR_NODE) {
        ERR_AT(c, v->start_mark, "%s must be a string, got %s", field, node_kind(v));
        return false;
    }
    if (is_null(v) || !*scalar(v)) {
        ERR_AT(c, v->start_mark, "%s must be a non-empty string", field);
        return false;
    }
    for (const unsigned char *s = (const unsigned char *)scalar(v); *s; s++)
        if (*s < 0x20 || *s == 0x7f) {
            ERR_AT(c, v->start_mark, "%s must not contain control characters", field);
            return false;
        }
    *out = scalar(v);
    return true;
}

/* A count: plain decimal digits only, so "1.5", "1e3", "0x10", "-3" and quoted
 * numbers are all refused with a message saying which rule they broke. */
static bool get_u32(pctx *c, yaml_node_t *v, const char *field, uint32_t min, uint32_t *out)
{
    if (v->type != YAML_SCALAR_NODE || is_null(v)) {
        ERR_AT(c, v->start_mark, "%s must be an integer, got %s", field,
               v->type == YAML_SCALAR_NODE ? "nothing" : node_kind(v));
        return false;
    }
    const char *s = scalar(v);
    if (!is_plain(v)) {
        ERR_AT(c, v->start_mark, "%s must be an integer, got the quoted string \"%.40s\" (drop the quotes)", field, s);
        return false;
    }
    const char *d = s + (*s == '+' || *s == '-');
    bool digits = *d != '\0';
    for (const char *q = d; *q; q++) digits &= isdigit((unsigned char)*q) != 0;
    if (!digits) {
        char *end;
        errno = 0;
        double f = strtod(s, &end);
        if (end != s && *end == '\0' && isfinite(f) && f != floor(f))
            ERR_AT(c, v->start_mark, "%s must be a whole number, got %.40s", field, s);
        else if (end != s && *end == '\0' && isfinite(f))
            ERR_AT(c, v->start_mark, "%s must be written in plain decimal digits, got %.40s", field, s);
        else
            ERR_AT(c, v->start_mark, "%s must be an integer, got '%.40s'", field, s);
        return false;
    }
    if (*s == '-' && strspn(d, "0") != strlen(d)) {
        ERR_AT(c, v->start_mark, "%s must not be negative, got %.40s", field, s);
        return false;
    }
    errno = 0;
    unsigned long long x = strtoull(d, NULL, 10);
    if (errno == ERANGE || x > UINT32_MAX) {
        ERR_AT(c, v->start_mark, "%s is too large: %.40s (max %u)", field, s, UINT32_MAX);
        return false;
    }
    if (x < min) {
        ERR_AT(c, v->start_mark, "%s must be at least %u, got %.40s", field, min, s);
        return false;
    }
    *out = (uint32_t)x;
    return true;
}

static bool get_fraction(pctx *c, yaml_node_t *v, const char *field, float *out)
{
    if (!is_plain(v) || is_null(v)) {
        ERR_AT(c, v->start_mark, "%s must be a number between 0 and 1", field);
        return false;
    }
    const char *s = scalar(v);
    char *end;
    double f = strtod(s, &end);
    if (end == s || *end != '\0' || !isfinite(f)) {
        ERR_AT(c, v->start_mark, "%s must be a number between 0 and 1, got '%.40s'", field, s);
        return false;
    }
    if (f < 0.0 || f > 1.0) {
        ERR_AT(c, v->start_mark, "%s must be between 0 and 1, got %.40s", field, s);
        return false;
    }
    *out = (float)f;
    return true;
}

/* A price in dollars: a plain number, 0 up to POLICY_MAX_DOLLARS. */
#define POLICY_MAX_DOLLARS 1e6
static bool get_dollars(pctx *c, yaml_node_t *v, const char *field, double *out)
{
    if (v->type != YAML_SCALAR_NODE || is_null(v) || !is_plain(v)) {
        ERR_AT(c, v->start_mark, "%s must be a number of dollars (0 or more, unquoted), got %s", field,
               v->type != YAML_SCALAR_NODE ? node_kind(v) : is_null(v) ? "nothing" : "a quoted string");
        return false;
    }
    const char *s = scalar(v);
    char *end;
    double f = strtod(s, &end);
    if (end == s || *end != '\0' || !isfinite(f)) {
        ERR_AT(c, v->start_mark, "%s must be a number of dollars, got '%.40s'", field, s);
        return false;
    }
    if (f < 0.0 || f > POLICY_MAX_DOLLARS) {
        ERR_AT(c, v->start_mark, "%s must be between 0 and %g, got %.40s", field, POLICY_MAX_DOLLARS, s);
        return false;
    }
    *out = f;
    return true;
}

/* One of a fixed set of words; returns its index or -1. */
static int get_enum(pctx *c, yaml_node_t *v, const char *field, const char *const *words, size_t n)
{
    const char *s;
    if (!get_string(c, v, field, &s)) return -1;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s, words[i])) return (int)i;
    char hint[96], list[128] = "";
    for (size_t i = 0; i < n; i++) {
        strncat(list, words[i], sizeof list - strlen(list) - 1);
        if (i + 1 < n) strncat(list, "|", sizeof list - strlen(list) - 1);
    }
    ERR_AT(c, v->start_mark, "%s must be one of %s, got '%.40s'%s", field, list, s,
           suggest(hint, sizeof hint, s, words, n));
    return -1;
}

/* A list of non-empty strings (api_keys, tenants). */
static bool get_string_list(pctx *c, yaml_node_t *v, const char *field, char ***out, size_t *n_out)
{
    if (v->type != YAML_SEQUENCE_NODE) {
        ERR_AT(c, v->start_mark, "%s must be a sequence of strings, got %s", field, node_kind(v));
        return false;
    }
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n == 0) {
        ERR_AT(c, v->start_mark, "%s must not be empty (leave it out to match everything)", field);
        return false;
    }
    char **list = calloc(n, sizeof *list);
    if (!list) { c->oom = true; return false; }
    size_t k = 0;
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *it = node_at(c, v->data.sequence.items.start[i]);
        const char *s;
        if (!it || !get_string(c, it, field, &s)) { ok = false; continue; }
        list[k] = xstrdup(c, s);
        if (list[k]) k++;
    }
    if (!ok || k == 0) {
        for (size_t i = 0; i < k; i++) free(list[i]);
        free(list);
        return false;
    }
    *out = list; *n_out = k;
    return true;
}

/* ---- pools -------------------------------------------------------------- */

static const char *const POOL_KEYS[] = { "name", "kind", "max_concurrency", "max_queue", "cost_per_hour" };
#define N_POOL_KEYS (sizeof POOL_KEYS / sizeof *POOL_KEYS)
static const char *const POOL_KINDS[] = { "any", "cpu", "gpu" };  /* index = sw_pool_kind */

static long find_pool(const sw_policy *p, const char *name)
{
    for (size_t i = 0; i < p->n_pools; i++)
        if (!strcmp(p->pools[i].name, name)) return (long)i;
    return -1;
}

static sw_pool_def *add_pool(pctx *c, const char *name, yaml_mark_t where)
{
    sw_policy *p = c->p;
    sw_pool_def *np = realloc(p->pools, (p->n_pools + 1) * sizeof *np);
    int *nl = realloc(c->pool_line, (p->n_pools + 1) * sizeof *nl);
    if (nl) c->pool_line = nl;
    if (np) p->pools = np;
    if (!np || !nl) { c->oom = true; return NULL; }
    sw_pool_def *d = &p->pools[p->n_pools];
    memset(d, 0, sizeof *d);
    d->name = xstrdup(c, name);
    if (!d->name) return NULL;
    c->pool_line[p->n_pools] = (int)where.line + 1;
    p->n_pools++;
    return d;
}

/* One pool's fields. `name_node` is the key of the mapping form, or NULL for
 * the list form where the name is a field. */
static void parse_pool(pctx *c, yaml_node_t *body, yaml_node_t *name_node)
{
    const char *name = NULL;
    yaml_mark_t where = body->start_mark;
    if (name_node) {
        if (!get_string(c, name_node, "pool name", &name)) return;
        where = name_node->start_mark;
        if (is_null(body)) body = NULL;  /* "gpu-pool:" alone = all defaults */
        else if (!check_mapping(c, body, "pool", POOL_KEYS, N_POOL_KEYS)) return;
        if (body && get(c, body, "name"))
            ERR_AT(c, get(c, body, "name")->start_mark,
                   "pool '%s': 'name' is given by the key in this form of 'pools'", name);
    } else {
        if (!check_mapping(c, body, "pool", POOL_KEYS, N_POOL_KEYS)) return;
        yaml_node_t *nv = get(c, body, "name");
        if (!nv) { ERR_AT(c, body->start_mark, "pool: missing required key 'name'"); return; }
        if (!get_string(c, nv, "pool name", &name)) return;
        where = nv->start_mark;
    }
    long dup = find_pool(c->p, name);
    if (dup >= 0 && name_node) return;   /* check_mapping already reported the duplicate key */
    if (dup >= 0) {
        ERR_AT(c, where, "duplicate pool '%s' (first defined at line %d)", name, c->pool_line[dup]);
        return;
    }
    if (c->p->n_pools >= POLICY_MAX_POOLS) {
        ERR_AT(c, where, "too many pools (at most %d)", POLICY_MAX_POOLS);
        return;
    }
    sw_pool_def *d = add_pool(c, name, where);
    if (!d || !body) return;
    yaml_node_t *v;
    if ((v = get(c, body, "kind"))) {
        int k = get_enum(c, v, "kind", POOL_KINDS, 3);
        if (k >= 0) d->kind = (sw_pool_kind)k;
    }
    if ((v = get(c, body, "max_concurrency"))) get_u32(c, v, "max_concurrency", 0, &d->max_concurrency);
    if ((v = get(c, body, "max_queue"))) get_u32(c, v, "max_queue", 0, &d->max_queue);
    if ((v = get(c, body, "cost_per_hour"))) d->has_cost = get_dollars(c, v, "cost_per_hour", &d->cost_per_hour);
}

static void parse_pools(pctx *c, yaml_node_t *v)
{
    if (is_null(v)) return;
    if (v->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
            yaml_node_t *body = node_at(c, *it);
            if (body) parse_pool(c, body, NULL);
        }
    } else if (v->type == YAML_MAPPING_NODE) {
        check_mapping(c, v, "pools", NULL, 0);   /* duplicates only: keys are pool names */
        for (yaml_node_pair_t *pr = v->data.mapping.pairs.start; pr < v->data.mapping.pairs.top; pr++) {
            yaml_node_t *k = node_at(c, pr->key), *body = node_at(c, pr->value);
            if (k && body && k->type == YAML_SCALAR_NODE) parse_pool(c, body, k);
        }
    } else {
        ERR_AT(c, v->start_mark, "pools must be a sequence or a mapping, got %s", node_kind(v));
    }
    /* An empty section declares nothing, so it does not close the list. */
    c->have_pools_section = c->p->n_pools > 0;
}

/* ---- routes ------------------------------------------------------------- */

static const char *const ROUTE_KEYS[] = { "model", "quantization", "target", "max_concurrency",
                                          "priority", "match" };
static const char *const MATCH_KEYS[] = { "class", "prompt_tokens", "api_keys", "tenants" };
static const char *const RANGE_KEYS[] = { "min", "max" };
static const char *const PRIORITIES[] = { "primary", "overflow" };     /* index = sw_route_priority */
static const char *const CLASSES[] = { "interactive", "batch" };       /* index + 1 = sw_request_class */

static void free_route(sw_route *r)
{
    free(r->model); free(r->quantization); free(r->target);
    for (size_t i = 0; i < r->n_match_api_keys; i++) free(r->match_api_keys[i]);
    for (size_t i = 0; i < r->n_match_tenants; i++) free(r->match_tenants[i]);
    free(r->match_api_keys); free(r->match_tenants);
}

/* Quantization names are case-insensitive (Q4_K_M = q4_k_m): stored lower case. */
static bool get_quantization(pctx *c, yaml_node_t *v, char **out)
{
    const char *s;
    if (!get_string(c, v, "quantization", &s)) return false;
    for (const char *q = s; *q; q++)
        if (!isalnum((unsigned char)*q) && *q != '_' && *q != '-' && *q != '.') {
            ERR_AT(c, v->start_mark, "quantization '%.40s' has an invalid character "
                   "(use letters, digits, '_', '-' or '.', e.g. fp8, q4_k_m)", s);
            return false;
        }
    char *d = xstrdup(c, s);
    if (!d) return false;
    for (char *q = d; *q; q++) *q = (char)tolower((unsigned char)*q);
    *out = d;
    return true;
}

static void parse_match(pctx *c, yaml_node_t *m, sw_route *r)
{
    if (!check_mapping(c, m, "match", MATCH_KEYS, 4)) return;
    yaml_node_t *v;
    if ((v = get(c, m, "class"))) {
        int k = get_enum(c, v, "class", CLASSES, 2);
        if (k >= 0) r->match_class = (sw_request_class)(k + 1);
    }
    if ((v = get(c, m, "prompt_tokens")) && check_mapping(c, v, "prompt_tokens", RANGE_KEYS, 2)) {
        yaml_node_t *lo = get(c, v, "min"), *hi = get(c, v, "max");
        bool ok_lo = !lo || get_u32(c, lo, "prompt_tokens.min", 0, &r->match_min_prompt_tokens);
        /* max 0 would mean "unbounded" in the struct; written out it is surely a mistake. */
        bool ok_hi = !hi || get_u32(c, hi, "prompt_tokens.max", 1, &r->match_max_prompt_tokens);
        if (!lo && !hi)
            ERR_AT(c, v->start_mark, "prompt_tokens needs 'min', 'max' or both");
        if (lo && hi && ok_lo && ok_hi && r->match_min_prompt_tokens > r->match_max_prompt_tokens)
            ERR_AT(c, lo->start_mark, "prompt_tokens.min (%u) is above prompt_tokens.max (%u)",
                   r->match_min_prompt_tokens, r->match_max_prompt_tokens);
    }
    if ((v = get(c, m, "api_keys")))
        get_string_list(c, v, "api_keys", &r->match_api_keys, &r->n_match_api_keys);
    if ((v = get(c, m, "tenants")))
        get_string_list(c, v, "tenants", &r->match_tenants, &r->n_match_tenants);
}

/* Parses one route entry. Returns false when a field is wrong; the route is
 * still kept when it has a model and a target, so the cross-checks (aliases,
 * pools) do not report knock-on errors about it. */
static bool parse_route(pctx *c, yaml_node_t *n, sw_route *r)
{
    memset(r, 0, sizeof *r);
    r->line = (int)n->start_mark.line + 1;
    r->column = (int)n->start_mark.column + 1;
    if (!check_mapping(c, n, "route", ROUTE_KEYS, 6)) return false;
    bool ok = true;
    yaml_node_t *v;
    const char *s;
    if (!(v = get(c, n, "model"))) {
        ERR_AT(c, n->start_mark, "route: missing required key 'model'");
        ok = false;
    } else if (get_string(c, v, "model", &s)) {
        r->model = xstrdup(c, s);
    } else ok = false;
    if (!(v = get(c, n, "target"))) {
        ERR_AT(c, n->start_mark, "route: missing required key 'target' (the pool that serves it)");
        ok = false;
    } else if (get_string(c, v, "target", &s)) {
        r->target = xstrdup(c, s);
    } else ok = false;
    if ((v = get(c, n, "quantization")) && !get_quantization(c, v, &r->quantization)) ok = false;
    if ((v = get(c, n, "max_concurrency")) && !get_u32(c, v, "max_concurrency", 0, &r->max_concurrency))
        ok = false;
    if ((v = get(c, n, "priority"))) {
        int k = get_enum(c, v, "priority", PRIORITIES, 2);
        if (k >= 0) r->priority = (sw_route_priority)k; else ok = false;
    }
    if ((v = get(c, n, "match"))) {
        int before = c->n_errs + c->n_dropped;
        parse_match(c, v, r);
        if (c->n_errs + c->n_dropped != before) ok = false;
    }
    return ok;
}

static bool same_list(char **a, size_t na, char **b, size_t nb)
{
    if (na != nb) return false;
    for (size_t i = 0; i < na; i++)
        if (strcmp(a[i], b[i])) return false;
    return true;
}

/* Same model, quantization, target, priority and match: the second can never
 * be chosen differently from the first, so it is a copy-paste slip. */
static bool same_route(const sw_route *a, const sw_route *b)
{
    return !strcmp(a->model, b->model) && !strcmp(a->target, b->target)
        && !strcmp(a->quantization ? a->quantization : "", b->quantization ? b->quantization : "")
        && a->priority == b->priority && a->match_class == b->match_class
        && a->match_min_prompt_tokens == b->match_min_prompt_tokens
        && a->match_max_prompt_tokens == b->match_max_prompt_tokens
        && same_list(a->match_api_keys, a->n_match_api_keys, b->match_api_keys, b->n_match_api_keys)
        && same_list(a->match_tenants, a->n_match_tenants, b->match_tenants, b->n_match_tenants);
}

static void parse_routes(pctx *c, yaml_node_t *v)
{
    if (v->type != YAML_SEQUENCE_NODE) {
        ERR_AT(c, v->start_mark, "routes must be a sequence of routes, got %s",
               is_null(v) ? "nothing" : node_kind(v));
        return;
    }
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    if (n == 0) { ERR_AT(c, v->start_mark, "routes must not be empty"); return; }
    if (n > POLICY_MAX_ROUTES) {
        ERR_AT(c, v->start_mark, "too many routes: %zu (at most %d)", n, POLICY_MAX_ROUTES);
        return;
    }
    sw_policy *p = c->p;
    p->routes = calloc(n, sizeof *p->routes);
    c->route_marks = calloc(n, sizeof *c->route_marks);
    if (!p->routes || !c->route_marks) { c->oom = true; return; }
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *rn = node_at(c, v->data.sequence.items.start[i]);
        if (!rn) continue;
        sw_route *r = &p->routes[p->n_routes];
        bool ok = parse_route(c, rn, r);
        if (r->model && r->target) {
            yaml_node_t *t = get(c, rn, "target"), *pr = get(c, rn, "priority");
            c->route_marks[p->n_routes].target = t->start_mark;
            c->route_marks[p->n_routes].priority = pr ? pr->start_mark : rn->start_mark;
            c->route_marks[p->n_routes].broken = !ok;
            p->n_routes++;
        } else {
            free_route(r);
        }
    }
}

/* ---- aliases and defaults ----------------------------------------------- */

static const char *const DEFAULT_KEYS[] = { "queue_length", "queue_timeout_ms", "request_timeout_ms",
                                            "first_token_timeout_ms", "error_rate_threshold" };

static void parse_defaults(pctx *c, yaml_node_t *v)
{
    if (is_null(v)) return;
    if (!check_mapping(c, v, "defaults", DEFAULT_KEYS, 5)) return;
    sw_policy_defaults *d = &c->p->defaults;
    yaml_node_t *x;
    if ((x = get(c, v, "queue_length"))) get_u32(c, x, "queue_length", 0, &d->queue_length);
    if ((x = get(c, v, "queue_timeout_ms"))) get_u32(c, x, "queue_timeout_ms", 1, &d->queue_timeout_ms);
    if ((x = get(c, v, "request_timeout_ms"))) get_u32(c, x, "request_timeout_ms", 1, &d->request_timeout_ms);
    if ((x = get(c, v, "first_token_timeout_ms")))
        get_u32(c, x, "first_token_timeout_ms", 1, &d->first_token_timeout_ms);
    if ((x = get(c, v, "error_rate_threshold"))) get_fraction(c, x, "error_rate_threshold", &d->error_rate_threshold);
}

/* Aliases are read here and checked against the routes afterwards. */
static void parse_aliases(pctx *c, yaml_node_t *v)
{
    if (is_null(v)) return;
    if (!check_mapping(c, v, "aliases", NULL, 0)) return;
    size_t n = (size_t)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
    if (n > POLICY_MAX_ALIASES) {
        ERR_AT(c, v->start_mark, "too many aliases: %zu (at most %d)", n, POLICY_MAX_ALIASES);
        return;
    }
    sw_policy *p = c->p;
    p->aliases = calloc(n ? n : 1, sizeof *p->aliases);
    c->alias_marks = calloc(n ? n : 1, sizeof *c->alias_marks);
    if (!p->aliases || !c->alias_marks) { c->oom = true; return; }
    for (size_t i = 0; i < n; i++) {
        yaml_node_pair_t *pr = v->data.mapping.pairs.start + i;
        yaml_node_t *k = node_at(c, pr->key), *val = node_at(c, pr->value);
        const char *name, *model;
        if (!k || !val || k->type != YAML_SCALAR_NODE) continue;
        if (!get_string(c, k, "alias name", &name)) continue;
        if (!get_string(c, val, "alias target", &model)) continue;
        bool dup = false;   /* already reported by check_mapping; keep the first */
        for (size_t j = 0; j < p->n_aliases && !dup; j++) dup = !strcmp(p->aliases[j].alias, name);
        if (dup) continue;
        sw_alias *a = &p->aliases[p->n_aliases];
        a->alias = xstrdup(c, name);
        a->model = xstrdup(c, model);
        if (!a->alias || !a->model) { free(a->alias); free(a->model); continue; }
        c->alias_marks[p->n_aliases].name = k->start_mark;
        c->alias_marks[p->n_aliases].model = val->start_mark;
        p->n_aliases++;
    }
}

/* ---- cross-checks ------------------------------------------------------- */

static bool model_routed(const sw_policy *p, const char *model)
{
    for (size_t i = 0; i < p->n_routes; i++)
        if (!strcmp(p->routes[i].model, model)) return true;
    return false;
}

static void check_aliases(pctx *c)
{
    sw_policy *p = c->p;
    for (size_t i = 0; i < p->n_aliases; i++) {
        sw_alias *a = &p->aliases[i];
        if (model_routed(p, a->alias)) {
            ERR_AT(c, c->alias_marks[i].name, "alias '%s' has the same name as a routed model; "
                   "an alias must not shadow a model", a->alias);
            continue;
        }
        if (model_routed(p, a->model)) continue;
        bool to_alias = false;
        for (size_t j = 0; j < p->n_aliases && !to_alias; j++) to_alias = !strcmp(p->aliases[j].alias, a->model);
        if (to_alias) {
            ERR_AT(c, c->alias_marks[i].model, "alias '%s' points to '%s', which is itself "
                   "an alias; point it at a routed model", a->alias, a->model);
            continue;
        }
        /* Suggest a routed model name for a likely typo. */
        const char **names = calloc(p->n_routes ? p->n_routes : 1, sizeof *names);
        char hint[96] = "";
        if (names) {
            for (size_t j = 0; j < p->n_routes; j++) names[j] = p->routes[j].model;
            suggest(hint, sizeof hint, a->model, names, p->n_routes);
            free(names);
        }
        ERR_AT(c, c->alias_marks[i].model, "alias '%s' points to '%s', which has no route%s",
               a->alias, a->model, hint);
    }
}

/* Targets must name declared pools when the pools section declares any
 * (catches typos); without one, every target becomes an implicit pool of kind
 * any. */
static void resolve_targets(pctx *c)
{
    sw_policy *p = c->p;
    size_t declared = p->n_pools;
    for (size_t i = 0; i < p->n_routes; i++) {
        sw_route *r = &p->routes[i];
        if (find_pool(p, r->target) >= 0) continue;
        if (c->have_pools_section) {
            const char **names = calloc(declared ? declared : 1, sizeof *names);
            char hint[96] = "";
            if (names) {
                for (size_t j = 0; j < declared; j++) names[j] = p->pools[j].name;
                suggest(hint, sizeof hint, r->target, names, declared);
                free(names);
            }
            ERR_AT(c, c->route_marks[i].target, "target pool '%s' is not declared in pools%s",
                   r->target, hint);
            continue;
        }
        if (p->n_pools >= POLICY_MAX_POOLS) {
            add_error(c, r->line, r->column, "too many pools (at most %d)", POLICY_MAX_POOLS);
            continue;
        }
        add_pool(c, r->target, c->route_marks[i].target);   /* kind any, no limits */
    }
}

static void check_routes(pctx *c)
{
    sw_policy *p = c->p;
    for (size_t i = 0; i < p->n_routes; i++) {
        sw_route *r = &p->routes[i];
        if (c->route_marks[i].broken) continue;   /* its own error says enough */
        for (size_t j = 0; j < i; j++)
            if (!c->route_marks[j].broken && same_route(r, &p->routes[j])) {
                add_error(c, r->line, r->column, "duplicate route: same model, quantization, target, "
                          "priority and match as the route at line %d", p->routes[j].line);
                break;
            }
        if (r->priority != SW_PRIO_OVERFLOW) continue;
        /* An overflow route is where a model's primary routes spill to; with no
         * primary route the model would be served only on spill, which is never
         * what anyone means. Reported once, at the model's first overflow route. */
        bool has_primary = false, first_overflow = true;
        for (size_t j = 0; j < p->n_routes; j++) {
            if (strcmp(p->routes[j].model, r->model)) continue;
            if (p->routes[j].priority == SW_PRIO_PRIMARY) has_primary = true;
            else if (j < i) first_overflow = false;
        }
        if (!has_primary && first_overflow)
            ERR_AT(c, c->route_marks[i].priority, "model '%s' has only overflow routes: add a primary "
                   "route for it (overflow routes take the spill from primary ones)", r->model);
    }
}

/* ---- the policy --------------------------------------------------------- */

static const char *const TOP_KEYS[] = { "pools", "routes", "aliases", "defaults" };

static void free_policy(sw_policy *p)
{
    if (!p) return;
    free(p->path); free(p->source);
    for (size_t i = 0; i < p->n_pools; i++) free(p->pools[i].name);
    free(p->pools);
    for (size_t i = 0; i < p->n_routes; i++) free_route(&p->routes[i]);
    free(p->routes);
    for (size_t i = 0; i < p->n_aliases; i++) { free(p->aliases[i].alias); free(p->aliases[i].model); }
    free(p->aliases);
    free(p);
}

/* Line and column of a byte offset (libyaml reports reader errors, such as
 * invalid UTF-8, by offset only). */
static void offset_to_mark(const char *text, size_t len, size_t off, int *line, int *col)
{
    *line = 1; *col = 1;
    for (size_t i = 0; i < off && i < len; i++) {
        if (text[i] == '\n') { (*line)++; *col = 1; }
        else if (((unsigned char)text[i] & 0xC0) != 0x80) (*col)++;
    }
}

static void syntax_error(pctx *c, yaml_parser_t *ps, const char *text, size_t len)
{
    const char *problem = ps->problem ? ps->problem : "cannot parse";
    int line, col;
    if (ps->error == YAML_READER_ERROR) {
        offset_to_mark(text, len, ps->problem_offset, &line, &col);
    } else {
        line = (int)ps->problem_mark.line + 1;
        col = (int)ps->problem_mark.column + 1;
    }
    if (ps->error == YAML_MEMORY_ERROR) { c->oom = true; return; }
    if (ps->context)
        add_error(c, line, col, "YAML syntax error: %s (%s at line %d, column %d)", problem, ps->context,
                  (int)ps->context_mark.line + 1, (int)ps->context_mark.column + 1);
    else
        add_error(c, line, col, "YAML syntax error: %s", problem);
}

static void parse_document(pctx *c, yaml_node_t *root)
{
    if (!root) {
        add_error(c, 1, 1, "the policy is empty: it needs at least a 'routes' list");
        return;
    }
    if (!check_mapping(c, root, "the policy", TOP_KEYS, 4)) return;
    yaml_node_t *v;
    if ((v = get(c, root, "pools"))) parse_pools(c, v);
    if ((v = get(c, root, "routes"))) parse_routes(c, v);
    else add_error(c, (int)root->start_mark.line + 1, (int)root->start_mark.column + 1,
                   "missing required key 'routes'");
    if ((v = get(c, root, "aliases"))) parse_aliases(c, v);
    if ((v = get(c, root, "defaults"))) parse_defaults(c, v);
    resolve_targets(c);
    check_routes(c);
    check_aliases(c);
}

static void free_ctx(pctx *c)
{
    free(c->pool_line); free(c->route_marks); free(c->alias_marks);
}

sw_policy *sw_policy_parse(const char *name, const char *text, size_t len, char *err, size_t errlen)
{
    if (err && errlen) err[0] = '\0';
    pctx c = { .name = name ? name : "<policy>" };
    if (!text) { text = ""; len = 0; }
    sw_policy *p = calloc(1, sizeof *p);
    if (!p) { if (err) snprintf(err, errlen, "%s: out of memory", c.name); return NULL; }
    c.p = p;
    p->defaults = (sw_policy_defaults){ .queue_length = 256, .queue_timeout_ms = 30000,
        .request_timeout_ms = 600000, .first_token_timeout_ms = 120000, .error_rate_threshold = 0.5f };

    if (len > POLICY_MAX_BYTES) {
        add_error(&c, 1, 1, "the policy is too large: %zu bytes (at most %u)", len, POLICY_MAX_BYTES);
    } else {
        yaml_parser_t ps;
        yaml_document_t doc;
        if (!yaml_parser_initialize(&ps)) {
            c.oom = true;
        } else {
            yaml_parser_set_input_string(&ps, (const unsigned char *)text, len);
            if (!yaml_parser_load(&ps, &doc)) {
                syntax_error(&c, &ps, text, len);
            } else {
                c.doc = &doc;
                parse_document(&c, yaml_document_get_root_node(&doc));
                /* A second document would be silently ignored otherwise. */
                yaml_document_t more;
                if (!yaml_parser_load(&ps, &more)) {
                    syntax_error(&c, &ps, text, len);
                } else {
                    yaml_node_t *r2 = yaml_document_get_root_node(&more);
                    if (r2) ERR_AT(&c, r2->start_mark, "only one YAML document is allowed in a policy");
                    yaml_document_delete(&more);
                }
                yaml_document_delete(&doc);
            }
            yaml_parser_delete(&ps);
        }
    }
    if (!c.oom && c.n_errs == 0 && c.n_dropped == 0) {
        p->path = xstrdup(&c, c.name);
        p->source = malloc(len + 1);
        if (p->source) { memcpy(p->source, text, len); p->source[len] = '\0'; }
        else c.oom = true;
    }
    if (c.oom) add_error(&c, 1, 1, "out of memory while loading the policy");
    if (c.n_errs || c.n_dropped || c.oom) {
        write_errors(&c, err, errlen);
        free_errors(&c);
        free_ctx(&c);
        free_policy(p);
        return NULL;
    }
    free_errors(&c);
    free_ctx(&c);
    p->refcount = 1;
    p->version = __atomic_add_fetch(&g_policy_version, 1, __ATOMIC_SEQ_CST);
    return p;
}

sw_policy *sw_policy_load(const char *path, char *err, size_t errlen)
{
    if (err && errlen) err[0] = '\0';
    if (!path || !*path) {
        if (err) snprintf(err, errlen, "policy: no file given");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (err) snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        if (err) snprintf(err, errlen, "%s: cannot read: %s", path, strerror(EISDIR));
        close(fd);
        return NULL;
    }
    /* Read to EOF rather than trusting st_size, so pipes and /proc files work. */
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len == cap) {
            if (cap > POLICY_MAX_BYTES) break;
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb; cap *= 2;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            if (err) snprintf(err, errlen, "%s: cannot read: %s", path, strerror(e));
            free(buf); close(fd);
            return NULL;
        }
        if (n == 0) break;
        len += (size_t)n;
    }
    close(fd);
    if (!buf) {
        if (err) snprintf(err, errlen, "%s: cannot read: %s", path, strerror(ENOMEM));
        return NULL;
    }
    sw_policy *p = sw_policy_parse(path, buf, len, err, errlen);  /* reports "too large" itself */
    free(buf);
    return p;
}

sw_policy *sw_policy_ref(sw_policy *p)
{
    if (p) __atomic_add_fetch(&p->refcount, 1, __ATOMIC_RELAXED);
    return p;
}

void sw_policy_unref(sw_policy *p)
{
    if (p && __atomic_sub_fetch(&p->refcount, 1, __ATOMIC_ACQ_REL) == 0) free_policy(p);
}

const char *sw_policy_resolve(const sw_policy *p, const char *name)
{
    if (!p || !name) return name;
    for (size_t i = 0; i < p->n_aliases; i++)
        if (!strcmp(p->aliases[i].alias, name)) return p->aliases[i].model;
    return name;
}

const sw_pool_def *sw_policy_pool(const sw_policy *p, const char *name)
{
    if (!p || !name) return NULL;
    long i = find_pool(p, name);
    return i >= 0 ? &p->pools[i] : NULL;
}

/* ---- JSON for GET /admin/policy ----------------------------------------- */

/* API keys are secrets: /admin/policy shows only enough to tell them apart. */
static void add_redacted_keys(cJSON *obj, char **keys, size_t n)
{
    cJSON *arr = cJSON_AddArrayToObject(obj, "api_keys");
    for (size_t i = 0; arr && i < n; i++) {
        char buf[32];
        if (strlen(keys[i]) > 8) snprintf(buf, sizeof buf, "%.4s...", keys[i]);
        else snprintf(buf, sizeof buf, "****");
        cJSON_AddItemToArray(arr, cJSON_CreateString(buf));
    }
}

static cJSON *route_json(const sw_route *r)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "model", r->model);
    if (r->quantization) cJSON_AddStringToObject(o, "quantization", r->quantization);
    else cJSON_AddNullToObject(o, "quantization");
    cJSON_AddStringToObject(o, "target", r->target);
    cJSON_AddNumberToObject(o, "max_concurrency", r->max_concurrency);
    cJSON_AddStringToObject(o, "priority", PRIORITIES[r->priority == SW_PRIO_OVERFLOW]);
    cJSON *m = cJSON_AddObjectToObject(o, "match");
    if (m) {
        if (r->match_class == SW_CLASS_ANY) cJSON_AddNullToObject(m, "class");
        else cJSON_AddStringToObject(m, "class", CLASSES[r->match_class == SW_CLASS_BATCH]);
        cJSON *pt = cJSON_AddObjectToObject(m, "prompt_tokens");
        if (pt) {
            cJSON_AddNumberToObject(pt, "min", r->match_min_prompt_tokens);
            if (r->match_max_prompt_tokens) cJSON_AddNumberToObject(pt, "max", r->match_max_prompt_tokens);
            else cJSON_AddNullToObject(pt, "max");
        }
        add_redacted_keys(m, r->match_api_keys, r->n_match_api_keys);
        cJSON *t = cJSON_AddArrayToObject(m, "tenants");
        for (size_t i = 0; t && i < r->n_match_tenants; i++)
            cJSON_AddItemToArray(t, cJSON_CreateString(r->match_tenants[i]));
    }
    cJSON_AddNumberToObject(o, "line", r->line);
    cJSON_AddNumberToObject(o, "column", r->column);
    return o;
}

char *sw_policy_to_json(const sw_policy *p)
{
    if (!p) return NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "version", (double)p->version);
    if (p->path) cJSON_AddStringToObject(o, "path", p->path);
    else cJSON_AddNullToObject(o, "path");
    cJSON *pools = cJSON_AddArrayToObject(o, "pools");
    for (size_t i = 0; pools && i < p->n_pools; i++) {
        const sw_pool_def *d = &p->pools[i];
        cJSON *x = cJSON_CreateObject();
        if (!x) break;
        cJSON_AddStringToObject(x, "name", d->name);
        cJSON_AddStringToObject(x, "kind", POOL_KINDS[d->kind <= SW_POOL_GPU ? d->kind : 0]);
        cJSON_AddNumberToObject(x, "max_concurrency", d->max_concurrency);
        cJSON_AddNumberToObject(x, "max_queue", d->max_queue);
        if (d->has_cost) cJSON_AddNumberToObject(x, "cost_per_hour", d->cost_per_hour);
        cJSON_AddItemToArray(pools, x);
    }
    cJSON *routes = cJSON_AddArrayToObject(o, "routes");
    for (size_t i = 0; routes && i < p->n_routes; i++) {
        cJSON *x = route_json(&p->routes[i]);
        if (x) cJSON_AddItemToArray(routes, x);
    }
    cJSON *aliases = cJSON_AddObjectToObject(o, "aliases");
    for (size_t i = 0; aliases && i < p->n_aliases; i++)
        cJSON_AddStringToObject(aliases, p->aliases[i].alias, p->aliases[i].model);
    cJSON *d = cJSON_AddObjectToObject(o, "defaults");
    if (d) {
        cJSON_AddNumberToObject(d, "queue_length", p->defaults.queue_length);
        cJSON_AddNumberToObject(d, "queue_timeout_ms", p->defaults.queue_timeout_ms);
        cJSON_AddNumberToObject(d, "request_timeout_ms", p->defaults.request_timeout_ms);
        cJSON_AddNumberToObject(d, "first_token_timeout_ms", p->defaults.first_token_timeout_ms);
        /* Through a short decimal so 0.1 prints as 0.1, not 0.100000001. */
        char buf[32];
        snprintf(buf, sizeof buf, "%g", (double)p->defaults.error_rate_threshold);
        cJSON_AddNumberToObject(d, "error_rate_threshold", strtod(buf, NULL));
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
