/* Client API keys (see keys.h): the keys file, admission against each key's
 * token buckets, and settlement when a request ends.
 *
 * Two kinds of data, kept apart so a reload cannot disturb requests in
 * flight: a keyset (what one load of the file said; immutable, refcounted,
 * held by each ticket) and a key's state (its buckets, in-flight count and
 * counters; kept by id across reloads, freed only at close).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <yaml.h>
#include "gateway/keys.h"
#include "gateway/policy.h"
#include "gateway/req.h"   /* sw_priority_parse */
#include "proto/apikey.h"

#define KEYS_MAX_BYTES (4u << 20)
#define LABEL_MAX 64
#define CHECK_EVERY_MS 1000
#define MAX_ERRS 20

enum { ST_ADMITTED, ST_FORBIDDEN, ST_RATE_LIMITED, ST_TOO_LARGE, ST_N };
static const char *const ST_NAMES[ST_N] = { "admitted", "forbidden", "rate_limited", "too_large" };

/* One key's limits and state, kept by id across reloads. */
typedef struct key_state {
    char id[SW_APIKEY_ID_MAX + 1];
    char label[LABEL_MAX + 1];
    double rps_level, tpm_level;      /* tokens in the buckets (tpm may be < 0: debt) */
    int64_t rps_t_ms, tpm_t_ms;       /* when each was last refilled */
    uint32_t inflight;
    uint64_t counts[ST_N], prompt_tokens, completion_tokens;
    struct key_state *next;
} key_state;

typedef struct {
    char id[SW_APIKEY_ID_MAX + 1];
    char label[LABEL_MAX + 1];
    char hash[SW_APIKEY_HASH_MAX];
    char **models; size_t n_models;   /* none: every model */
    char **routes; size_t n_routes;   /* none: every pool */
    int klass;                        /* SW_CLASS_ANY: any */
    uint32_t rps, concurrency, tpm;   /* 0: unlimited */
} key_entry;

typedef struct {
    int refs;                         /* under sw_keys.mu */
    key_entry *e; size_t n;
} keyset;

struct sw_keys {
    pthread_mutex_t mu;
    char *path;                       /* NULL: keys are off */
    keyset *set;
    key_state *states;
    struct { dev_t dev; ino_t ino; off_t size; int64_t mtime_ns; } sig;
    int64_t last_check_ms;
    uint64_t missing, invalid, reloads_ok, reloads_err;
};

struct sw_key_ticket {
    sw_keys *k;
    keyset *set;
    const key_entry *e;
    key_state *s;
    uint32_t charged;                 /* tpm tokens taken at admission */
};

/* SIGHUP (sw_keys_reload_soon): every handle reloads at its next admit. */
static int reload_asked;

static void putf(sw_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(sw_sbuf *b, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sw_sbuf_put_n(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* ---- the keyset ------------------------------------------------------------ */

static void free_list(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

static void keyset_free(keyset *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) {
        free_list(s->e[i].models, s->e[i].n_models);
        free_list(s->e[i].routes, s->e[i].n_routes);
    }
    free(s->e);
    free(s);
}

/* Caller holds k->mu. */
static void keyset_unref(keyset *s)
{
    if (s && --s->refs == 0) keyset_free(s);
}

static const key_entry *find_entry(const keyset *s, const char *id)
{
    for (size_t i = 0; s && i < s->n; i++)
        if (!strcmp(s->e[i].id, id)) return &s->e[i];
    return NULL;
}

/* ---- parsing the file ------------------------------------------------------ */

typedef struct {
    const char *name;
    yaml_document_t *doc;
    sw_sbuf errs;
    int n_errs;
    bool oom;
} kctx;

static void add_error(kctx *c, yaml_mark_t m, const char *fmt, ...)
{
    if (c->n_errs++ >= MAX_ERRS) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    putf(&c->errs, "%s%s:%d:%d: %s", c->errs.n ? "\n" : "", c->name, (int)m.line + 1,
                   (int)m.column + 1, msg);
}

static yaml_node_t *node(kctx *c, int i) { return yaml_document_get_node(c->doc, i); }

static bool scalar_of(kctx *c, yaml_node_t *v, const char *field, const char **out)
{
    if (v->type != YAML_SCALAR_NODE) {
        add_error(c, v->start_mark, "'%s' must be a string", field);
        return false;
    }
    *out = (const char *)v->data.scalar.value;
    return true;
}

static bool get_limit(kctx *c, yaml_node_t *v, const char *field, uint32_t *out)
{
    const char *s;
    if (!scalar_of(c, v, field, &s)) return false;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (!*s || *s == '-' || *end || errno || x > 1000000000ull) {
        add_error(c, v->start_mark, "'%s' must be a whole number from 0 (no limit) to 1000000000", field);
        return false;
    }
    *out = (uint32_t)x;
    return true;
}

static bool get_list(kctx *c, yaml_node_t *v, const char *field, char ***out, size_t *n)
{
    if (v->type != YAML_SEQUENCE_NODE) {
        add_error(c, v->start_mark, "'%s' must be a list of names", field);
        return false;
    }
    size_t cap = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    *out = calloc(cap ? cap : 1, sizeof **out);
    if (!*out) { c->oom = true; return false; }
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
        const char *s = NULL;
        if (!scalar_of(c, node(c, *it), field, &s) || !*s) {
            if (s && !*s) add_error(c, node(c, *it)->start_mark, "an empty name in '%s'", field);
            return false;
        }
        if (!((*out)[(*n)++] = strdup(s))) { c->oom = true; return false; }
    }
    return true;
}

/* Labels appear in metrics: a bounded, quote-free alphabet. */
static bool label_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > LABEL_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              strchr("-_.:@", s[i])))
            return false;
    return true;
}

static bool set_string(kctx *c, yaml_node_t *v, key_entry *e, const char *k)
{
    const char *s;
    if (!scalar_of(c, v, k, &s)) return false;
    if (!strcmp(k, "id")) {
        if (!sw_apikey_id_ok(s)) { add_error(c, v->start_mark, "'id' must be 1 to 32 of 0-9 and a-z"); return false; }
        snprintf(e->id, sizeof e->id, "%s", s);
    } else if (!strcmp(k, "label")) {
        if (!label_ok(s)) {
            add_error(c, v->start_mark, "'label' must be 1 to %d of A-Z a-z 0-9 - _ . : @", LABEL_MAX);
            return false;
        }
        snprintf(e->label, sizeof e->label, "%s", s);
    } else if (!strcmp(k, "hash")) {
        if (!sw_apikey_hash_ok(s)) {
            add_error(c, v->start_mark, "'hash' is not a stored key (\"blake2b$<salt>$<digest>\", from spillway-apikey new)");
            return false;
        }
        snprintf(e->hash, sizeof e->hash, "%s", s);
    } else {   /* priority */
        e->klass = sw_priority_parse(s);
        if (e->klass < 0) { add_error(c, v->start_mark, "'priority' must be interactive or batch"); return false; }
    }
    return true;
}

static bool set_field(kctx *c, const char *k, yaml_node_t *v, key_entry *e)
{
    if (!strcmp(k, "id") || !strcmp(k, "label") || !strcmp(k, "hash") || !strcmp(k, "priority"))
        return set_string(c, v, e, k);
    if (!strcmp(k, "models")) return get_list(c, v, k, &e->models, &e->n_models);
    if (!strcmp(k, "routes") || !strcmp(k, "pools")) {
        if (e->routes) { add_error(c, v->start_mark, "give 'routes' or 'pools', not both"); return false; }
        return get_list(c, v, k, &e->routes, &e->n_routes);
    }
    if (!strcmp(k, "rps")) return get_limit(c, v, k, &e->rps);
    if (!strcmp(k, "concurrency")) return get_limit(c, v, k, &e->concurrency);
    if (!strcmp(k, "tpm")) return get_limit(c, v, k, &e->tpm);
    add_error(c, v->start_mark, "unknown field '%s' (known: id, label, hash, models, routes, priority, rps, "
              "concurrency, tpm)", k);
    return false;
}

static void parse_entry(kctx *c, yaml_node_t *n, keyset *set)
{
    if (n->type != YAML_MAPPING_NODE) { add_error(c, n->start_mark, "each key must be a mapping"); return; }
    key_entry *e = &set->e[set->n++];
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = node(c, p->key);
        const char *k;
        if (!scalar_of(c, kn, "a field name", &k)) continue;
        set_field(c, k, node(c, p->value), e);
    }
    if (!e->id[0]) add_error(c, n->start_mark, "a key needs an 'id'");
    if (!e->label[0]) add_error(c, n->start_mark, "a key needs a 'label'");
    if (!e->hash[0]) add_error(c, n->start_mark, "a key needs a 'hash'");
    for (size_t i = 0; e->id[0] && i + 1 < set->n; i++)
        if (!strcmp(set->e[i].id, e->id)) add_error(c, n->start_mark, "id '%s' is given twice", e->id);
}

static void parse_root(kctx *c, yaml_node_t *root, keyset *set)
{
    yaml_mark_t top = { 0, 0, 0 };
    if (!root) return;   /* an empty file: no keys, every request refused */
    if (root->type != YAML_MAPPING_NODE) { add_error(c, root->start_mark, "the keys file must be a mapping with 'keys'"); return; }
    yaml_node_t *list = NULL;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = node(c, p->key);
        if (kn->type == YAML_SCALAR_NODE && !strcmp((const char *)kn->data.scalar.value, "keys"))
            list = node(c, p->value);
        else add_error(c, kn->start_mark, "unknown top-level field (only 'keys')");
    }
    if (!list) { add_error(c, top, "missing 'keys'"); return; }
    if (list->type == YAML_SCALAR_NODE && !list->data.scalar.length) return;   /* "keys:" alone */
    if (list->type != YAML_SEQUENCE_NODE) { add_error(c, list->start_mark, "'keys' must be a list"); return; }
    size_t cap = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
    if (!(set->e = calloc(cap ? cap : 1, sizeof *set->e))) { c->oom = true; return; }
    for (yaml_node_item_t *it = list->data.sequence.items.start; it < list->data.sequence.items.top; it++)
        parse_entry(c, node(c, *it), set);
}

static void parse_text(kctx *c, const char *text, size_t len, keyset *set)
{
    yaml_parser_t ps;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&ps)) { c->oom = true; return; }
    yaml_parser_set_input_string(&ps, (const unsigned char *)text, len);
    if (!yaml_parser_load(&ps, &doc)) {
        yaml_mark_t m = ps.problem_mark;
        add_error(c, m, "YAML syntax error: %s", ps.problem ? ps.problem : "cannot parse");
    } else {
        c->doc = &doc;
        parse_root(c, yaml_document_get_root_node(&doc), set);
        yaml_document_delete(&doc);
    }
    yaml_parser_delete(&ps);
}

/* Reads and parses path: a new keyset, or NULL with the errors in err. */
static keyset *load_file(const char *path, char *err, size_t errlen)
{
    kctx c = { .name = path };
    yaml_mark_t top = { 0, 0, 0 };
    keyset *set = calloc(1, sizeof *set);
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    size_t len = 0;
    if (!set) c.oom = true;
    else if (!f) add_error(&c, top, "cannot open the keys file: %s", strerror(errno));
    else if (!(text = malloc(KEYS_MAX_BYTES + 1))) c.oom = true;
    else if ((len = fread(text, 1, KEYS_MAX_BYTES + 1, f)) > KEYS_MAX_BYTES)
        add_error(&c, top, "the keys file is larger than %u bytes", KEYS_MAX_BYTES);
    else parse_text(&c, text, len, set);
    if (f) fclose(f);
    free(text);
    if (c.oom) { sw_sbuf_free(&c.errs); c.n_errs = 1; putf(&c.errs, "%s: out of memory", path); }
    if (c.n_errs == 0 && !c.errs.oom) { sw_sbuf_free(&c.errs); set->refs = 1; return set; }
    if (err && errlen) snprintf(err, errlen, "%s", c.errs.s ? c.errs.s : "keys file: out of memory");
    sw_sbuf_free(&c.errs);
    keyset_free(set);
    return NULL;
}

/* ---- the handle and reloading ---------------------------------------------- */

/* Caller holds k->mu. The state for id, made when first seen. */
static key_state *state_for(sw_keys *k, const key_entry *e, int64_t now)
{
    key_state *s;
    for (s = k->states; s; s = s->next)
        if (!strcmp(s->id, e->id)) break;
    if (!s) {
        if (!(s = calloc(1, sizeof *s))) return NULL;
        snprintf(s->id, sizeof s->id, "%s", e->id);
        s->rps_level = e->rps;
        s->tpm_level = e->tpm;
        s->rps_t_ms = s->tpm_t_ms = now;
        s->next = k->states;
        k->states = s;
    }
    snprintf(s->label, sizeof s->label, "%s", e->label);
    return s;
}

static bool file_sig(sw_keys *k, bool *changed)
{
    struct stat st;
    if (stat(k->path, &st) != 0) { *changed = false; return false; }
    int64_t mt = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    *changed = st.st_dev != k->sig.dev || st.st_ino != k->sig.ino || st.st_size != k->sig.size ||
               mt != k->sig.mtime_ns;
    k->sig.dev = st.st_dev; k->sig.ino = st.st_ino; k->sig.size = st.st_size; k->sig.mtime_ns = mt;
    return true;
}

/* Caller holds k->mu. Swaps in a fresh load, or keeps the old keys. */
static int reload_locked(sw_keys *k, char *err, size_t errlen)
{
    bool changed;
    file_sig(k, &changed);
    keyset *set = load_file(k->path, err, errlen);
    if (!set) { k->reloads_err++; return -1; }
    int64_t now = sw_now_ms();
    for (size_t i = 0; i < set->n; i++) state_for(k, &set->e[i], now);
    keyset_unref(k->set);
    k->set = set;
    k->reloads_ok++;
    return 0;
}

sw_keys *sw_keys_open(const char *path, char *err, size_t errlen)
{
    sw_keys *k = calloc(1, sizeof *k);
    if (!k) { if (err) snprintf(err, errlen, "out of memory"); return NULL; }
    pthread_mutex_init(&k->mu, NULL);
    if (!path) return k;
    if (!(k->path = strdup(path)) || reload_locked(k, err, errlen) != 0) {
        if (!k->path && err) snprintf(err, errlen, "out of memory");
        sw_keys_close(k);
        return NULL;
    }
    k->reloads_ok = 0;   /* the first load is not a reload */
    k->last_check_ms = sw_now_ms();
    return k;
}

void sw_keys_close(sw_keys *k)
{
    if (!k) return;
    keyset_unref(k->set);
    for (key_state *s = k->states, *n; s; s = n) { n = s->next; free(s); }
    pthread_mutex_destroy(&k->mu);
    free(k->path);
    free(k);
}

int sw_keys_reload(sw_keys *k, char *err, size_t errlen)
{
    if (err && errlen) err[0] = '\0';
    if (!k || !k->path) return 0;
    pthread_mutex_lock(&k->mu);
    int rc = reload_locked(k, err, errlen);
    pthread_mutex_unlock(&k->mu);
    if (rc) fprintf(stderr, "gateway: keys file not reloaded, the old keys stay:\n%s\n", err);
    return rc;
}

void sw_keys_reload_soon(void) { __atomic_store_n(&reload_asked, 1, __ATOMIC_RELEASE); }

bool sw_keys_enabled(const sw_keys *k) { return k && k->path; }

/* Caller holds k->mu: at most once a second, reload when the file changed
 * (or SIGHUP asked); a failed load is logged once per change. */
static void maybe_reload(sw_keys *k, int64_t now)
{
    bool asked = __atomic_exchange_n(&reload_asked, 0, __ATOMIC_ACQ_REL);
    if (!asked && now - k->last_check_ms < CHECK_EVERY_MS) return;
    k->last_check_ms = now;
    bool changed = false;
    if (!file_sig(k, &changed) && !asked) return;
    if (!changed && !asked) return;
    char err[4096];
    if (reload_locked(k, err, sizeof err) != 0)
        fprintf(stderr, "gateway: keys file not reloaded, the old keys stay:\n%s\n", err);
    else fprintf(stderr, "gateway: keys file %s reloaded (%zu keys)\n", k->path, k->set->n);
}

/* ---- admission ------------------------------------------------------------- */

static void refuse(sw_key_refusal *why, int status, const char *type, const char *code, const char *param,
                   int retry, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void refuse(sw_key_refusal *why, int status, const char *type, const char *code, const char *param,
                   int retry, const char *fmt, ...)
{
    why->status = status;
    why->type = type;
    why->code = code;
    why->param = param;
    why->retry_after_s = retry;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why->message, sizeof why->message, fmt, ap);
    va_end(ap);
}

static bool in_list(char **v, size_t n, const char *s)
{
    if (n == 0) return true;
    for (size_t i = 0; s && i < n; i++)
        if (!strcmp(v[i], s)) return true;
    return false;
}

/* Caller holds k->mu. The entry the Authorization header names, or NULL
 * with a 401 in why. */
static const key_entry *authenticate(sw_keys *k, const char *auth, sw_key_refusal *why)
{
    if (!auth || strncasecmp(auth, "Bearer ", 7) != 0) {
        k->missing++;
        refuse(why, 401, "invalid_request_error", "missing_api_key", NULL, 0,
               "You didn't provide an API key: send it as \"Authorization: Bearer sk-sw-...\"");
        return NULL;
    }
    const char *key = auth + 7;
    while (*key == ' ') key++;
    char id[SW_APIKEY_ID_MAX + 1];
    const key_entry *e = NULL;
    if (strlen(key) <= SW_APIKEY_MAX && sw_apikey_split(key, id)) e = find_entry(k->set, id);
    if (!e || !sw_apikey_verify(e->hash, key)) {
        k->invalid++;
        refuse(why, 401, "invalid_request_error", "invalid_api_key", NULL, 0, "Incorrect API key provided");
        return NULL;
    }
    return e;
}

/* 403s: what the key may not use. */
static bool permitted(const key_entry *e, const sw_key_request *rq, sw_key_refusal *why)
{
    if (!in_list(e->models, e->n_models, rq->model)) {
        refuse(why, 403, "permission_error", "model_not_allowed", "model", 0,
               "This API key may not use the model '%.64s'", rq->model ? rq->model : "");
        return false;
    }
    if (rq->target && !in_list(e->routes, e->n_routes, rq->target)) {
        refuse(why, 403, "permission_error", "route_not_allowed", "X-Spillway-Target", 0,
               "This API key may not use the pool '%.64s'", rq->target);
        return false;
    }
    /* interactive outranks batch: a batch key may not ask for interactive */
    if (e->klass == SW_CLASS_BATCH && rq->klass == SW_CLASS_INTERACTIVE) {
        refuse(why, 403, "permission_error", "priority_not_allowed", "X-Spillway-Priority", 0,
               "This API key may only send batch requests");
        return false;
    }
    return true;
}

static void refill(double *level, int64_t *t_ms, uint32_t cap, double per_s, int64_t now)
{
    if (now > *t_ms) *level += per_s * (double)(now - *t_ms) / 1000.0;
    if (*level > cap) *level = cap;
    *t_ms = now;
}

static int wait_s(double missing, double per_s)
{
    double s = ceil(missing / per_s);
    return s < 1 ? 1 : s > 3600 ? 3600 : (int)s;
}

/* Caller holds k->mu. 0 when every bucket has room, else the refusal. */
static int check_limits(const key_entry *e, key_state *s, uint32_t cost, int64_t now, sw_key_refusal *why)
{
    if (e->tpm && cost > e->tpm) {
        refuse(why, 400, "invalid_request_error", "tokens_per_minute_exceeded", "max_tokens", 0,
               "This request may need %u tokens, more than this API key's %u tokens per minute: "
               "lower max_tokens or shorten the prompt", cost, e->tpm);
        return ST_TOO_LARGE;
    }
    if (e->concurrency && s->inflight >= e->concurrency) {
        refuse(why, 429, "rate_limit_exceeded", "concurrency_exceeded", NULL, 1,
               "This API key has %u requests in flight, its limit", s->inflight);
        return ST_RATE_LIMITED;
    }
    if (e->rps) {
        refill(&s->rps_level, &s->rps_t_ms, e->rps, e->rps, now);
        if (s->rps_level < 1.0) {
            refuse(why, 429, "rate_limit_exceeded", "requests_per_second_exceeded", NULL,
                   wait_s(1.0 - s->rps_level, e->rps), "This API key is over its %u requests per second", e->rps);
            return ST_RATE_LIMITED;
        }
    }
    if (e->tpm) {
        refill(&s->tpm_level, &s->tpm_t_ms, e->tpm, e->tpm / 60.0, now);
        if (s->tpm_level < cost) {
            refuse(why, 429, "rate_limit_exceeded", "tokens_per_minute_exceeded", NULL,
                   wait_s(cost - s->tpm_level, e->tpm / 60.0), "This API key is over its %u tokens per minute", e->tpm);
            return ST_RATE_LIMITED;
        }
    }
    return ST_ADMITTED;
}

/* Caller holds k->mu: charges the buckets and makes the ticket. */
static sw_key_ticket *charge(sw_keys *k, const key_entry *e, key_state *s, uint32_t cost)
{
    sw_key_ticket *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    *t = (sw_key_ticket){ .k = k, .set = k->set, .e = e, .s = s, .charged = e->tpm ? cost : 0 };
    k->set->refs++;
    if (e->rps) s->rps_level -= 1.0;
    if (e->tpm) s->tpm_level -= cost;
    s->inflight++;
    return t;
}

int sw_keys_admit(sw_keys *k, const sw_key_request *rq, sw_key_ticket **out, sw_key_refusal *why)
{
    *out = NULL;
    memset(why, 0, sizeof *why);
    if (!k || !k->path) return 0;
    int64_t now = sw_now_ms();
    pthread_mutex_lock(&k->mu);
    maybe_reload(k, now);
    const key_entry *e = authenticate(k, rq->authorization, why);
    key_state *s = e ? state_for(k, e, now) : NULL;
    int st = ST_ADMITTED;
    uint64_t cost64 = (uint64_t)rq->prompt_tokens + rq->max_tokens;
    uint32_t cost = cost64 > UINT32_MAX ? UINT32_MAX : (uint32_t)cost64;
    if (!e) st = -1;
    else if (!s) { st = -1; refuse(why, 429, "rate_limit_exceeded", "out_of_memory", NULL, 1, "out of memory"); }
    else if (!permitted(e, rq, why)) st = ST_FORBIDDEN;
    else st = check_limits(e, s, cost, now, why);
    if (st == ST_ADMITTED && !(*out = charge(k, e, s, cost))) {
        st = ST_RATE_LIMITED;
        refuse(why, 429, "rate_limit_exceeded", "out_of_memory", NULL, 1, "The gateway is out of memory");
    }
    if (s && st >= 0) s->counts[st]++;
    pthread_mutex_unlock(&k->mu);
    return st == ST_ADMITTED ? 0 : why->status;
}

void sw_keys_settle(sw_key_ticket *t, uint32_t prompt_tokens, uint32_t completion_tokens)
{
    if (!t) return;
    sw_keys *k = t->k;
    pthread_mutex_lock(&k->mu);
    key_state *s = t->s;
    if (s->inflight) s->inflight--;
    s->prompt_tokens += prompt_tokens;
    s->completion_tokens += completion_tokens;
    if (t->e->tpm) {   /* give back what was charged, take what was used: debt allowed */
        refill(&s->tpm_level, &s->tpm_t_ms, t->e->tpm, t->e->tpm / 60.0, sw_now_ms());
        s->tpm_level += (double)t->charged - (double)prompt_tokens - (double)completion_tokens;
        if (s->tpm_level > t->e->tpm) s->tpm_level = t->e->tpm;
    }
    keyset_unref(t->set);
    pthread_mutex_unlock(&k->mu);
    free(t);
}

const char *sw_key_label(const sw_key_ticket *t) { return t ? t->e->label : ""; }

int sw_key_class(const sw_key_ticket *t, int asked)
{
    if (!t || asked != SW_CLASS_ANY) return asked;
    return t->e->klass;
}

char *const *sw_key_pools(const sw_key_ticket *t, size_t *n)
{
    *n = t ? t->e->n_routes : 0;
    return t ? t->e->routes : NULL;
}

/* ---- metrics --------------------------------------------------------------- */

void sw_keys_metrics(sw_keys *k, sw_sbuf *out)
{
    if (!k || !k->path) return;
    pthread_mutex_lock(&k->mu);
    putf(out, "# TYPE spillway_client_requests_total counter\n");
    for (key_state *s = k->states; s; s = s->next)
        for (int i = 0; i < ST_N; i++)
            putf(out, "spillway_client_requests_total{key=\"%s\",status=\"%s\"} %llu\n", s->label, ST_NAMES[i],
                 (unsigned long long)s->counts[i]);
    putf(out, "# TYPE spillway_client_unauthorized_total counter\n"
              "spillway_client_unauthorized_total{reason=\"missing\"} %llu\n"
              "spillway_client_unauthorized_total{reason=\"invalid\"} %llu\n",
         (unsigned long long)k->missing, (unsigned long long)k->invalid);
    putf(out, "# TYPE spillway_client_tokens_total counter\n");
    for (key_state *s = k->states; s; s = s->next)
        putf(out, "spillway_client_tokens_total{key=\"%s\",kind=\"prompt\"} %llu\n"
                  "spillway_client_tokens_total{key=\"%s\",kind=\"completion\"} %llu\n",
             s->label, (unsigned long long)s->prompt_tokens, s->label, (unsigned long long)s->completion_tokens);
    putf(out, "# TYPE spillway_client_inflight gauge\n");
    for (key_state *s = k->states; s; s = s->next)
        putf(out, "spillway_client_inflight{key=\"%s\"} %u\n", s->label, s->inflight);
    putf(out, "# TYPE spillway_client_keys_reloads_total counter\n"
              "spillway_client_keys_reloads_total{result=\"ok\"} %llu\n"
              "spillway_client_keys_reloads_total{result=\"error\"} %llu\n",
         (unsigned long long)k->reloads_ok, (unsigned long long)k->reloads_err);
    pthread_mutex_unlock(&k->mu);
}
