/* Worker registry: who is connected, what they serve, how loaded they are.
 * Mutated only by the broker thread (under mu, so HTTP threads can read). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <cjson/cJSON.h>
#include "gateway/registry.h"
#include "gateway/util.h"
#include "llm/limits.h"
#include "llm/util.h"

void sw_registry_init(sw_registry *r)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
}

sw_worker *sw_registry_find(sw_registry *r, const void *ident, size_t len)
{
    for (sw_worker *w = r->head; w; w = w->next)
        if (w->ident_len == len && memcmp(w->ident, ident, len) == 0) return w;
    return NULL;
}

sw_worker *sw_registry_find_id(sw_registry *r, const char *id)
{
    for (sw_worker *w = r->head; w; w = w->next)
        if (strcmp(w->id, id) == 0) return w;
    return NULL;
}

static void free_models(sw_worker *w)
{
    for (size_t i = 0; i < w->n_models; i++) {
        free(w->models[i].name);
        free(w->models[i].quant);
    }
    free(w->models);
    w->models = NULL;
    w->n_models = 0;
}

sw_worker *sw_registry_upsert(sw_registry *r, const void *ident, size_t len,
                              const Spillway__Register *reg, int64_t now)
{
    if (len > sizeof(((sw_worker *)0)->ident)) return NULL;
    sw_worker *w = sw_registry_find(r, ident, len);
    if (!w) {
        w = calloc(1, sizeof *w);
        if (!w) return NULL;
        memcpy(w->ident, ident, len);
        w->ident_len = len;
        w->next = r->head;
        r->head = w;
        r->n++;
        w->registered_ms = now;
    }
    snprintf(w->id, sizeof w->id, "%s", reg->worker_id ? reg->worker_id : "");
    free(w->pool);
    w->pool = strdup(reg->pool ? reg->pool : "");
    w->kind = reg->kind;
    w->slots = 0;
    sw_worker_set_slots(w, reg->slots);
    free_models(w);
    w->models = calloc(reg->n_models ? reg->n_models : 1, sizeof *w->models);
    for (size_t i = 0; w->models && i < reg->n_models; i++) {
        const Spillway__ModelInfo *m = reg->models[i];
        w->models[i].name = strdup(m->name ? m->name : "");
        w->models[i].quant = strdup(m->quantization ? m->quantization : "");
        w->models[i].ctx = m->context_length;
        w->models[i].embedding = m->embedding;
        w->models[i].dim = m->embedding ? m->embedding_dim : 0;
        w->n_models++;
    }
    w->last_seen_ms = now;
    return w;
}

void sw_registry_remove(sw_registry *r, sw_worker *w)
{
    for (sw_worker **pp = &r->head; *pp; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            r->n--;
            break;
        }
    }
    free_models(w);
    free(w->pool);
    free(w);
}

bool sw_worker_serves(const sw_worker *w, const char *model, const char *quant)
{
    for (size_t i = 0; i < w->n_models; i++) {
        if (strcmp(w->models[i].name, model) != 0) continue;
        if (quant && *quant && strcasecmp(w->models[i].quant, quant) != 0) continue;
        return true;
    }
    return false;
}

bool sw_worker_alive(const sw_worker *w, int64_t now)
{
    return now - w->last_seen_ms < (int64_t)SW_HEARTBEAT_MS * SW_HEARTBEAT_LIVENESS;
}

bool sw_worker_takes_new(const sw_registry *r, const sw_worker *w, int64_t now)
{
    return sw_worker_alive(w, now) && !w->self_draining && !sw_ops_find(&r->ops, SW_OPS_DRAIN, w->id) &&
           !sw_ops_find(&r->ops, SW_OPS_CORDON, w->pool);
}

const char *sw_worker_state_name(const sw_registry *r, const sw_worker *w, int64_t now)
{
    if (!sw_worker_alive(w, now)) return "stale";
    if (w->self_draining || sw_ops_find(&r->ops, SW_OPS_DRAIN, w->id)) return w->inflight ? "draining" : "drained";
    if (sw_ops_find(&r->ops, SW_OPS_CORDON, w->pool)) return "cordoned";
    return w->slots && w->inflight >= w->slots ? "busy" : "ready";
}

static bool eligible(const sw_registry *r, const sw_worker *w, const char *pool, const char *model,
                     const char *quant, int64_t now)
{
    if (pool && strcmp(w->pool, pool) != 0) return false;
    return sw_worker_takes_new(r, w, now) && sw_worker_serves(w, model, quant);
}

/* Our own in-flight count is exact and immediate; the heartbeat's covers
 * work we did not send (other gateways) but lags (a heartbeat follows a
 * change within ~20 ms, plus the trip), so take the larger. */
uint32_t sw_worker_load(const sw_worker *w)
{
    uint32_t hb = w->hb_active + w->hb_queued;
    return hb > w->inflight ? hb : w->inflight;
}

/* Load as a fraction of slots, scaled. */
static uint64_t load_of(const sw_worker *w)
{
    return (uint64_t)sw_worker_load(w) * 1000 / (w->slots ? w->slots : 1);
}

/* Workers of pool that could be given a request for model/quant now. */
static int count_eligible(const sw_registry *r, const char *pool, const char *model,
                          const char *quant, int64_t now)
{
    int n = 0;
    for (const sw_worker *w = r->head; w; w = w->next)
        if (eligible(r, w, pool, model, quant, now)) n++;
    return n;
}

int sw_registry_count(sw_registry *r, const char *pool, const char *model,
                      const char *quant, int64_t now)
{
    int n = 0;
    for (sw_worker *w = r->head; w; w = w->next)
        if ((!pool || !strcmp(w->pool, pool)) && sw_worker_alive(w, now) && sw_worker_serves(w, model, quant))
            n++;
    return n;
}

int sw_registry_model_kind(sw_registry *r, const char *model, int64_t now, uint32_t *ctx, uint32_t *dim)
{
    int kind = SW_MODEL_UNKNOWN;
    *ctx = *dim = 0;
    pthread_mutex_lock(&r->mu);
    for (sw_worker *w = r->head; w; w = w->next) {
        if (!sw_worker_alive(w, now)) continue;
        for (size_t i = 0; i < w->n_models; i++) {
            const sw_wmodel *m = &w->models[i];
            if (strcmp(m->name, model) != 0) continue;
            if (kind != SW_MODEL_EMBED) kind = m->embedding ? SW_MODEL_EMBED : SW_MODEL_GENERATE;
            if (m->ctx && (!*ctx || m->ctx < *ctx)) *ctx = m->ctx;
            if (m->dim > *dim) *dim = m->dim;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return kind;
}

/* FNV-1a, continued from h. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

#define PREFIX_KEY_CHAT_BYTES 1024
#define PREFIX_KEY_PROMPT_BYTES 256
#define PREFIX_KEY_IDS 64

uint64_t sw_prefix_key(const Spillway__GenerateRequest *g)
{
    uint64_t h = 0xcbf29ce484222325ull;
    if (g->n_messages) {
        size_t left = PREFIX_KEY_CHAT_BYTES;
        for (size_t i = 0; i < g->n_messages && left; i++) {
            const char *parts[2] = { g->messages[i]->role, g->messages[i]->content };
            for (int k = 0; k < 2 && left; k++) {
                size_t n = parts[k] ? strlen(parts[k]) + 1 : 1;   /* with the NUL: "ab","c" != "a","bc" */
                if (n > left) n = left;
                h = fnv1a(h, parts[k] ? parts[k] : "", n);
                left -= n;
            }
            if (parts[0] && !strcmp(parts[0], "user")) break;   /* the conversation's first question */
        }
    } else if (g->n_prompt_tokens) {
        size_t n = g->n_prompt_tokens < PREFIX_KEY_IDS ? g->n_prompt_tokens : PREFIX_KEY_IDS;
        h = fnv1a(h ^ 1, g->prompt_tokens, n * sizeof *g->prompt_tokens);
    } else if (g->prompt) {
        size_t n = strlen(g->prompt);
        h = fnv1a(h ^ 2, g->prompt, n < PREFIX_KEY_PROMPT_BYTES ? n : PREFIX_KEY_PROMPT_BYTES);
    }
    return h | 1;
}

/* Rendezvous hashing: the worker whose id scores highest with the key. A
 * worker joining or leaving moves only the keys it wins or held. */
static sw_worker *affinity_worker(sw_registry *r, const char *pool, const char *model, const char *quant,
                                  int64_t now, uint64_t key)
{
    sw_worker *best = NULL;
    uint64_t best_score = 0;
    for (sw_worker *w = r->head; w; w = w->next) {
        if (!eligible(r, w, pool, model, quant, now)) continue;
        uint64_t s = fnv1a(key, w->id, strlen(w->id));
        s = sw_splitmix64(&s);   /* FNV's last bytes mix weakly; splitmix spreads them */
        if (!best || s > best_score) { best = w; best_score = s; }
    }
    return best;
}

sw_worker *sw_registry_pick(sw_registry *r, const char *pool, const char *model,
                            const char *quant, int64_t now, uint64_t prefix_key)
{
    if (prefix_key) {
        sw_worker *w = affinity_worker(r, pool, model, quant, now, prefix_key);
        if (w && load_of(w) < 1000) return w;   /* a free slot: its cache may hold the prefix */
    }
    int n = count_eligible(r, pool, model, quant, now);
    if (n == 0) return NULL;
    /* Power of two choices: two distinct random candidates, take the less
     * loaded. Nearly as good as least-loaded, without herding onto one. */
    int a = rand() % n, b = n > 1 ? rand() % (n - 1) : a;
    if (n > 1 && b >= a) b++;
    sw_worker *wa = NULL, *wb = NULL;
    int i = 0;
    for (sw_worker *w = r->head; w; w = w->next) {
        if (!eligible(r, w, pool, model, quant, now)) continue;
        if (i == a) wa = w;
        if (i == b) wb = w;
        i++;
    }
    return load_of(wb) < load_of(wa) ? wb : wa;
}

/* Who set a mark, when and why, as prefix_by, prefix_reason, prefix_since_ms. */
static void add_mark(cJSON *o, const char *prefix, const sw_ops_mark *m)
{
    char k[64];
    snprintf(k, sizeof k, "%s_by", prefix);
    cJSON_AddStringToObject(o, k, m->by);
    snprintf(k, sizeof k, "%s_reason", prefix);
    cJSON_AddStringToObject(o, k, m->reason);
    snprintf(k, sizeof k, "%s_since_ms", prefix);
    cJSON_AddNumberToObject(o, k, (double)m->since_ms);
}

char *sw_registry_json(sw_registry *r)
{
    int64_t now = sw_now_ms();
    cJSON *arr = cJSON_CreateArray();
    pthread_mutex_lock(&r->mu);
    for (sw_worker *w = r->head; w; w = w->next) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", w->id);
        cJSON_AddStringToObject(o, "pool", w->pool);
        cJSON_AddStringToObject(o, "kind", w->kind == SPILLWAY__WORKER_KIND__WORKER_KIND_GPU ? "gpu"
                                : w->kind == SPILLWAY__WORKER_KIND__WORKER_KIND_CPU ? "cpu" : "unspecified");
        cJSON_AddBoolToObject(o, "alive", sw_worker_alive(w, now));
        cJSON_AddStringToObject(o, "state", sw_worker_state_name(r, w, now));
        const sw_ops_mark *dm = sw_ops_find(&r->ops, SW_OPS_DRAIN, w->id);
        cJSON_AddBoolToObject(o, "drained", dm != NULL);
        cJSON_AddBoolToObject(o, "self_draining", w->self_draining);
        cJSON_AddBoolToObject(o, "empty", w->inflight == 0);
        if (dm) add_mark(o, "drain", dm);
        cJSON_AddNumberToObject(o, "slots", w->slots);
        cJSON_AddNumberToObject(o, "inflight", w->inflight);
        cJSON_AddNumberToObject(o, "dispatched", (double)w->dispatched);
        cJSON_AddNumberToObject(o, "active", w->hb_active);
        cJSON_AddNumberToObject(o, "queued", w->hb_queued);
        cJSON_AddNumberToObject(o, "kv_utilization", w->hb_kv);
        cJSON_AddNumberToObject(o, "batch_size", w->hb_batch);
        cJSON_AddNumberToObject(o, "tokens_generated", (double)w->hb_tokens);
        cJSON_AddNumberToObject(o, "tokens_per_second", sw_worker_alive(w, now) ? w->tps : 0);
        if (w->hb_pc_queries)
            cJSON_AddNumberToObject(o, "prefix_cache_hit_rate", (double)w->hb_pc_hits / (double)w->hb_pc_queries);
        cJSON_AddNumberToObject(o, "last_seen_ms_ago", (double)(now - w->last_seen_ms));
        if (w->key[0]) {   /* a public key: no secret, and it tells an operator which key is in use */
            cJSON_AddStringToObject(o, "curve_key", w->key);
            cJSON_AddStringToObject(o, "key_name", w->key_name);
        }
        cJSON *ms = cJSON_AddArrayToObject(o, "models");
        for (size_t i = 0; i < w->n_models; i++) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "name", w->models[i].name);
            cJSON_AddStringToObject(m, "quantization", w->models[i].quant);
            cJSON_AddNumberToObject(m, "context_length", w->models[i].ctx);
            if (w->models[i].embedding) cJSON_AddBoolToObject(m, "embedding", true);
            cJSON_AddItemToArray(ms, m);
        }
        cJSON_AddItemToArray(arr, o);
    }
    pthread_mutex_unlock(&r->mu);
    char *s = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    return s;
}

/* One worker as /metrics shows it. Caller holds r->mu. */
static void snap_worker(const sw_registry *r, const sw_worker *w, int64_t now, sw_metrics_worker *m)
{
    snprintf(m->id, sizeof m->id, "%s", w->id);
    snprintf(m->pool, sizeof m->pool, "%s", w->pool);
    m->healthy = sw_worker_alive(w, now);
    m->state = !m->healthy ? SW_WS_STALE : (w->slots && w->inflight >= w->slots) ? SW_WS_BUSY : SW_WS_READY;
    m->drained = w->self_draining || sw_ops_find(&r->ops, SW_OPS_DRAIN, w->id);
    m->running = w->hb_active;
    m->waiting = w->hb_queued;
    m->slots = w->slots;
    m->batch = w->hb_batch;
    m->kv = w->hb_kv;
    m->prefix_hit_rate = w->hb_pc_queries ? (double)w->hb_pc_hits / (double)w->hb_pc_queries : -1;
    if (m->prefix_hit_rate > 1) m->prefix_hit_rate = 1;   /* a worker's claim, bounded */
    m->tokens_per_s = m->healthy ? w->tps : 0;
    m->heartbeat_age_s = (double)(now - (w->hb_ms ? w->hb_ms : w->registered_ms)) / 1000.0;
}

/* Pool `name`'s live workers, added up. Caller holds r->mu. */
static void snap_pool(const sw_registry *r, const sw_policy *p, const char *name, int64_t now, sw_metrics_pool *m)
{
    snprintf(m->name, sizeof m->name, "%s", name);
    for (const sw_worker *w = r->head; w; w = w->next) {
        if (strcmp(w->pool, name) != 0) continue;
        m->inflight += w->inflight;
        if (!sw_worker_alive(w, now)) continue;
        m->healthy++;
        m->slots += w->slots;
    }
    const sw_pool_def *pd = sw_policy_pool(p, name);
    m->max_concurrency = pd ? pd->max_concurrency : 0;
    m->cordoned = sw_ops_find(&r->ops, SW_OPS_CORDON, name) != NULL;
}

void sw_registry_snapshot(sw_registry *r, const sw_policy *p, sw_metrics_snapshot *out)
{
    int64_t now = sw_now_ms();
    memset(out, 0, sizeof *out);
    out->now_ms = now;
    pthread_mutex_lock(&r->mu);
    out->workers = calloc((size_t)r->n + 1, sizeof *out->workers);
    for (sw_worker *w = r->head; w && out->workers && out->n_workers < r->n; w = w->next)
        snap_worker(r, w, now, &out->workers[out->n_workers++]);
    out->pools = calloc(p->n_pools + p->n_routes + 1, sizeof *out->pools);
    for (size_t i = 0; out->pools && i < p->n_pools + p->n_routes; i++) {
        const char *name = i < p->n_pools ? p->pools[i].name : p->routes[i - p->n_pools].target;
        bool dup = false;
        for (int j = 0; j < out->n_pools; j++) dup |= !strcmp(out->pools[j].name, name);
        if (!dup) snap_pool(r, p, name, now, &out->pools[out->n_pools++]);
    }
    out->deaths = r->deaths;
    pthread_mutex_unlock(&r->mu);
}

/* The operators' recent actions, oldest first, as "operator_actions". */
static void add_actions(cJSON *o, const sw_ops *ops)
{
    cJSON *arr = cJSON_AddArrayToObject(o, "operator_actions");
    for (unsigned i = SW_OPS_LOG; i-- > 0;) {
        const sw_ops_action *a = sw_ops_recent(ops, i);
        if (!a) continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "at_ms", (double)a->at_ms);
        cJSON_AddStringToObject(e, "action", a->action);
        cJSON_AddStringToObject(e, "target", a->target);
        cJSON_AddStringToObject(e, "by", a->by);
        cJSON_AddStringToObject(e, "reason", a->reason);
        cJSON_AddItemToArray(arr, e);
    }
}

/* One pool of the status document: its kind, live workers' figures, cordon
 * and price. Caller holds reg->mu. */
static cJSON *pool_json(sw_registry *reg, const sw_policy *p, const char *name, bool in_policy, int64_t now)
{
    cJSON *po = cJSON_CreateObject();
    cJSON_AddStringToObject(po, "name", name);
    const sw_pool_def *pd = sw_policy_pool(p, name);
    cJSON_AddStringToObject(po, "kind", !pd ? "unknown" : pd->kind == SW_POOL_GPU ? "gpu"
                            : pd->kind == SW_POOL_CPU ? "cpu" : "any");
    cJSON_AddBoolToObject(po, "in_policy", in_policy);
    uint32_t workers = 0, slots = 0, inflight = 0, active = 0, queued = 0;
    for (sw_worker *w = reg->head; w; w = w->next) {
        if (strcmp(w->pool, name) != 0 || !sw_worker_alive(w, now)) continue;
        workers++;
        slots += w->slots;
        inflight += w->inflight;
        active += w->hb_active;
        queued += w->hb_queued;
    }
    cJSON_AddNumberToObject(po, "workers", workers);
    cJSON_AddNumberToObject(po, "slots", slots);
    cJSON_AddNumberToObject(po, "inflight", inflight);
    cJSON_AddNumberToObject(po, "active", active);
    cJSON_AddNumberToObject(po, "queued", queued);
    const sw_ops_mark *cm = sw_ops_find(&reg->ops, SW_OPS_CORDON, name);
    cJSON_AddBoolToObject(po, "cordoned", cm != NULL);
    if (cm) add_mark(po, "cordon", cm);
    if (pd && pd->has_cost) {   /* lock order: reg->mu, then the metrics' own (it takes no other) */
        cJSON_AddNumberToObject(po, "cost_per_hour", pd->cost_per_hour);
        double dpm = sw_metrics_dollars_per_mtok(name, now);
        if (dpm >= 0) cJSON_AddNumberToObject(po, "dollars_per_million_tokens", dpm);
        else cJSON_AddNullToObject(po, "dollars_per_million_tokens");
    }
    return po;
}

struct cJSON *sw_status_build(sw_registry *reg, const sw_policy *p, int64_t started_ms)
{
    int64_t now = sw_now_ms();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "policy_version", (double)p->version);
    cJSON_AddNumberToObject(o, "uptime_s", (double)(now - started_ms) / 1000.0);
    cJSON *pools = cJSON_AddArrayToObject(o, "pools");
    /* Pools: the policy's, plus any a worker registered that the policy lacks. */
    pthread_mutex_lock(&reg->mu);
    for (int pass = 0; pass < 2; pass++) {
        size_t n = pass == 0 ? p->n_pools : 0;
        const char *names[256];
        size_t n_names = 0;
        if (pass == 0) {
            for (size_t i = 0; i < n && n_names < 256; i++) names[n_names++] = p->pools[i].name;
            for (size_t i = 0; i < p->n_routes && n_names < 256; i++) {
                bool dup = false;
                for (size_t j = 0; j < n_names; j++) dup |= !strcmp(names[j], p->routes[i].target);
                if (!dup) names[n_names++] = p->routes[i].target;
            }
        } else {
            for (sw_worker *w = reg->head; w && n_names < 256; w = w->next) {
                bool dup = false;
                cJSON *it;
                cJSON_ArrayForEach(it, pools)
                    dup |= !strcmp(cJSON_GetObjectItemCaseSensitive(it, "name")->valuestring, w->pool);
                for (size_t j = 0; j < n_names; j++) dup |= !strcmp(names[j], w->pool);
                if (!dup) names[n_names++] = w->pool;
            }
        }
        for (size_t i = 0; i < n_names; i++) cJSON_AddItemToArray(pools, pool_json(reg, p, names[i], pass == 0, now));
    }
    add_actions(o, &reg->ops);
    pthread_mutex_unlock(&reg->mu);
    char *wj = sw_registry_json(reg);
    cJSON *wa = wj ? cJSON_Parse(wj) : NULL;
    free(wj);
    cJSON_AddItemToObject(o, "workers", wa ? wa : cJSON_CreateArray());
    return o;
}

/* tokens/s is measured over at least TPS_MIN_SPAN_MS between marks: the
 * heartbeats that follow each change in load come ~20 ms apart. */
#define TPS_MIN_SPAN_MS 1000
static void update_tps(sw_worker *w, uint64_t tokens, int64_t now)
{
    if (!w->tps_mark_ms || tokens < w->tps_mark_tokens) {   /* first, or the worker restarted */
        w->tps_mark_ms = now;
        w->tps_mark_tokens = tokens;
        w->tps = 0;
        return;
    }
    int64_t span = now - w->tps_mark_ms;
    if (span < TPS_MIN_SPAN_MS) return;
    w->tps = (double)(tokens - w->tps_mark_tokens) * 1000.0 / (double)span;
    w->tps_mark_ms = now;
    w->tps_mark_tokens = tokens;
}

bool sw_worker_heartbeat(sw_worker *w, const Spillway__Heartbeat *h, int64_t now)
{
    w->self_draining = h->draining;
    w->last_seen_ms = w->hb_ms = now;
    w->hb_active = h->active;
    w->hb_queued = h->queued;
    w->hb_kv = h->kv_utilization;
    w->hb_batch = h->batch_size;
    w->hb_tokens = h->tokens_generated;
    w->hb_pc_queries = h->prefix_cache_queries;
    w->hb_pc_hits = h->prefix_cache_hits;
    update_tps(w, h->tokens_generated, now);
    return sw_worker_set_slots(w, h->slots);
}

bool sw_worker_set_slots(sw_worker *w, uint32_t claimed)
{
    if (!claimed) return true;
    w->slots = claimed > SW_MAX_WORKER_SLOTS ? SW_MAX_WORKER_SLOTS : claimed;
    return claimed <= SW_MAX_WORKER_SLOTS;
}

void sw_worker_note_left(sw_worker *w, const char *id)
{
    snprintf(w->recent[w->n_recent++ % SW_WORKER_RECENT], sizeof w->recent[0], "%s", id);
}

bool sw_worker_recently_left(const sw_worker *w, const char *id)
{
    unsigned n = w->n_recent < SW_WORKER_RECENT ? w->n_recent : SW_WORKER_RECENT;
    for (unsigned i = 0; i < n; i++)
        if (!strcmp(w->recent[i], id)) return true;
    return false;
}
