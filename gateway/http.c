/* HTTP side: libmicrohttpd handlers for the OpenAI API, health, metrics and
 * admin endpoints.
 *
 * A generate request is parsed here, handed to the broker, and its connection
 * suspended. The broker resumes it when it has an answer (dispatched or
 * failed), for every chunk of a stream, for SSE keep-alives, and when the
 * client is gone. Streams use a callback response whose reader suspends the
 * connection (returning 0) whenever it has nothing to send.
 */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <sodium.h>
#include "gateway/admin.h"
#include "gateway/broker.h"
#include "gateway/dashboard/assets.h"
#include "gateway/front.h"
#include "gateway/http.h"
#include "gateway/keys.h"
#include "gateway/metrics.h"
#include "gateway/openai.h"
#include "gateway/embeddings.h"
#include "gateway/registry.h"
#include "gateway/responses.h"
#include "gateway/req.h"
#include "gateway/util.h"
#include "llm/limits.h"

#define HTTP_THREADS 4
#define SW_MAX_BODY (1u << 20)       /* larger request bodies get 413 */
#define SW_MAX_DISCARD (64ull << 20) /* up to this, an oversized body is read before the 413 */

enum { EP_NONE, EP_COMPLETIONS, EP_CHAT, EP_RESPONSES, EP_EMBEDDINGS, EP_MODELS, EP_HEALTH, EP_METRICS, EP_WORKERS,
       EP_POLICY, EP_RELOAD, EP_STATUS, EP_OPS };

typedef struct {
    int ep;
    sw_sbuf body;
    bool too_large;
    bool submitted;
    sw_req *req;
    sw_key_ticket *key;           /* the client key's admission; settled in on_completed */
    uint32_t key_max_tokens;      /* what the key was charged for completion */
} conn_ctx;

/* The client API keys (keys.h): opened by sw_http_start, closed by
 * sw_http_stop once every connection (and so every ticket) is done. One
 * gateway per process, and gateway.h has no slot for it. */
static sw_keys *s_keys;

/* ---- plain responses ------------------------------------------------------ */
static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, const char *ctype,
                               char *body /* freed */, int retry_after)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body,
                                                                MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", ctype);
    if (retry_after > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(resp, "Retry-After", ra);
    }
    enum MHD_Result rc = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result respond_json(struct MHD_Connection *c, unsigned status, char *json)
{
    return respond(c, status, "application/json", json, 0);
}

static enum MHD_Result respond_error(struct MHD_Connection *c, unsigned status, const char *msg,
                                     const char *type, const char *param, const char *code)
{
    if (!type) type = status >= 500 ? "server_error" : "invalid_request_error";
    int ra = (status == 503 || status == 429) ? SW_RETRY_AFTER_S : 0;
    return respond(c, status, "application/json", sw_openai_error_json(msg, type, param, code), ra);
}

/* ---- request ids ---------------------------------------------------------- */
static void make_id(char *out, size_t n, const char *prefix)
{
    static uint64_t counter;
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != sizeof rnd) rnd = (uint64_t)sw_now_ns();
    uint64_t k = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    snprintf(out, n, "%s%012llx%08llx", prefix, (unsigned long long)(rnd & 0xffffffffffffull),
             (unsigned long long)(k & 0xffffffffu));
}

/* ---- read-only endpoints ---------------------------------------------------- */
static enum MHD_Result do_health(sw_gateway *g, struct MHD_Connection *c)
{
    int64_t now = sw_now_ms();
    int alive = 0;
    pthread_mutex_lock(&g->reg.mu);
    for (sw_worker *w = g->reg.head; w; w = w->next) alive += sw_worker_alive(w, now);
    pthread_mutex_unlock(&g->reg.mu);
    sw_policy *p = sw_gw_policy(g);
    char *s;
    if (asprintf(&s, "{\"status\":\"ok\",\"workers\":%d,\"policy_version\":%llu,\"uptime_s\":%lld}",
                 alive, (unsigned long long)p->version, (long long)((now - g->started_ms) / 1000)) < 0)
        s = strdup("{\"status\":\"ok\"}");
    sw_policy_unref(p);
    return respond_json(c, 200, s);
}

static cJSON *find_model(cJSON *arr, const char *id)
{
    cJSON *m;
    cJSON_ArrayForEach(m, arr) {
        cJSON *i = cJSON_GetObjectItemCaseSensitive(m, "id");
        if (cJSON_IsString(i) && strcmp(i->valuestring, id) == 0) return m;
    }
    return NULL;
}

static void add_unique(cJSON *arr, const char *s)
{
    cJSON *x;
    cJSON_ArrayForEach(x, arr)
        if (cJSON_IsString(x) && strcmp(x->valuestring, s) == 0) return;
    cJSON_AddItemToArray(arr, cJSON_CreateString(s));
}

static void add_model(cJSON *arr, const char *id, const char *pool, const char *quant)
{
    cJSON *m = find_model(arr, id);
    if (!m) {
        m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "id", id);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", 0);
        cJSON_AddStringToObject(m, "owned_by", "spillway");
        cJSON *sp = cJSON_AddObjectToObject(m, "spillway");
        cJSON_AddBoolToObject(sp, "available", pool != NULL);
        cJSON_AddArrayToObject(sp, "pools");
        cJSON_AddArrayToObject(sp, "quantizations");
        cJSON_AddItemToArray(arr, m);
    }
    if (!pool) return;
    cJSON *sp = cJSON_GetObjectItemCaseSensitive(m, "spillway");
    cJSON_ReplaceItemInObject(sp, "available", cJSON_CreateTrue());
    add_unique(cJSON_GetObjectItemCaseSensitive(sp, "pools"), pool);
    if (quant && *quant) add_unique(cJSON_GetObjectItemCaseSensitive(sp, "quantizations"), quant);
}

/* data: models some live worker serves (what a client can use now), aliases
 * of those included. "unavailable": models the policy routes but no live
 * worker serves yet. */
static enum MHD_Result do_models(sw_gateway *g, struct MHD_Connection *c)
{
    sw_policy *p = sw_gw_policy(g);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    int64_t now = sw_now_ms();
    pthread_mutex_lock(&g->reg.mu);
    for (sw_worker *w = g->reg.head; w; w = w->next) {
        if (!sw_worker_alive(w, now)) continue;
        for (size_t i = 0; i < w->n_models; i++)
            add_model(data, w->models[i].name, w->pool, w->models[i].quant);
    }
    pthread_mutex_unlock(&g->reg.mu);
    for (size_t i = 0; i < p->n_aliases; i++) {
        cJSON *t = find_model(data, p->aliases[i].model);
        if (t && !find_model(data, p->aliases[i].alias)) {
            cJSON *a = cJSON_Duplicate(t, 1);
            cJSON_ReplaceItemInObject(a, "id", cJSON_CreateString(p->aliases[i].alias));
            cJSON_AddStringToObject(cJSON_GetObjectItemCaseSensitive(a, "spillway"), "alias_of",
                                    p->aliases[i].model);
            cJSON_AddItemToArray(data, a);
        }
    }
    cJSON *un = cJSON_AddArrayToObject(o, "unavailable");
    for (size_t i = 0; i < p->n_routes; i++)
        if (!find_model(data, p->routes[i].model) && !find_model(un, p->routes[i].model))
            add_model(un, p->routes[i].model, NULL, NULL);
    sw_policy_unref(p);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return respond_json(c, 200, s);
}

static enum MHD_Result do_metrics(sw_gateway *g, struct MHD_Connection *c)
{
    char *text = sw_gw_metrics_text(g);
    if (text && sw_keys_enabled(s_keys)) {   /* the per-key series after the rest */
        sw_sbuf b = {0};
        sw_sbuf_put(&b, text);
        free(text);
        sw_keys_metrics(s_keys, &b);
        text = b.oom ? NULL : b.s;
        if (!text) sw_sbuf_free(&b);
    }
    if (!text) return respond_error(c, 500, "out of memory", NULL, NULL, "out_of_memory");
    return respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, 0);
}

/* ---- /admin/policy shows no secret ---------------------------------------- */
/* Whether a YAML key names a secret: one of its _- separated words is key,
 * token, secret, password... (api_keys, api_key, token; not prompt_tokens). */
static bool secret_name(const char *k, size_t n)
{
    static const char *const W[] = {"key", "keys", "apikey", "apikeys", "token", "secret", "secrets",
                                    "password", "passwd", "credential", "credentials", "bearer"};
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && k[j] != '_' && k[j] != '-') j++;
        for (size_t w = 0; w < sizeof W / sizeof W[0]; w++)
            if (strlen(W[w]) == j - i && strncasecmp(k + i, W[w], j - i) == 0) return true;
        i = j + 1;
    }
    return false;
}

/* One source line, redacted. *secret_indent is the indentation of the last
 * secret-named key whose block (deeper lines, or "- " items at its level)
 * we are in, -1 if none. */
static void redact_line(sw_sbuf *out, const char *l, size_t n, int *secret_indent)
{
    size_t ind = 0;
    while (ind < n && l[ind] == ' ') ind++;
    bool blank = ind == n || l[ind] == '#';
    if (*secret_indent >= 0 && !blank &&
        ((int)ind > *secret_indent || ((int)ind == *secret_indent && l[ind] == '-'))) {
        sw_sbuf_put_n(out, l, ind);
        sw_sbuf_put(out, l[ind] == '-' ? "- <redacted>" : "<redacted>");
        return;
    }
    if (!blank) *secret_indent = -1;
    size_t k = ind;
    while (k + 1 < n && l[k] == '-' && l[k + 1] == ' ') k += 2;     /* "- key: v" */
    size_t e = k;
    while (e < n && l[e] != ':' && l[e] != ' ' && l[e] != '#') e++;
    size_t ks = k, ke = e;
    if (ke > ks && (l[ks] == '"' || l[ks] == '\'')) { ks++; if (ke > ks && l[ke - 1] == l[k]) ke--; }
    if (e >= n || l[e] != ':' || !secret_name(l + ks, ke - ks)) {
        sw_sbuf_put_n(out, l, n);
        return;
    }
    *secret_indent = (int)ind;
    sw_sbuf_put_n(out, l, e + 1);
    size_t v = e + 1;
    while (v < n && l[v] == ' ') v++;
    if (v < n && l[v] != '#') sw_sbuf_put(out, " <redacted>");
}

/* Every occurrence of secret in b replaced by <redacted>. */
static void replace_all(sw_sbuf *b, const char *secret)
{
    size_t sl = strlen(secret);
    if (!sl || !b->s) return;
    sw_sbuf out = {0};
    const char *p = b->s, *hit;
    while ((hit = strstr(p, secret))) {
        sw_sbuf_put_n(&out, p, (size_t)(hit - p));
        sw_sbuf_put(&out, "<redacted>");
        p = hit + sl;
    }
    sw_sbuf_put(&out, p);
    sw_sbuf_free(b);
    *b = out;
}

/* The policy's source with every secret replaced: the values of
 * secret-named keys line by line, then, should YAML have hidden one where
 * no such key stands (an alias, a multi-line flow sequence), every API key
 * the policy parsed, wherever it appears. NULL when out of memory. */
static char *redacted_source(const sw_policy *p)
{
    sw_sbuf out = {0};
    int secret_indent = -1;
    const char *src = p->source ? p->source : "";
    for (const char *l = src; *l;) {
        const char *nl = strchr(l, '\n');
        size_t n = nl ? (size_t)(nl - l) : strlen(l);
        redact_line(&out, l, n, &secret_indent);
        if (nl) sw_sbuf_put(&out, "\n");
        l += n + (nl ? 1 : 0);
    }
    sw_sbuf_put(&out, "");
    for (size_t i = 0; i < p->n_routes; i++)
        for (size_t j = 0; j < p->routes[i].n_match_api_keys; j++) replace_all(&out, p->routes[i].match_api_keys[j]);
    if (out.oom) { sw_sbuf_free(&out); return NULL; }
    return out.s;
}

static enum MHD_Result do_policy(sw_gateway *g, struct MHD_Connection *c)
{
    sw_policy *p = sw_gw_policy(g);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "version", (double)p->version);
    cJSON_AddStringToObject(o, "path", p->path ? p->path : "");
    char *pj = sw_policy_to_json(p);
    cJSON *pol = pj ? cJSON_Parse(pj) : NULL;
    free(pj);
    if (pol) cJSON_AddItemToObject(o, "policy", pol); else cJSON_AddNullToObject(o, "policy");
    char *src = redacted_source(p);
    if (src) cJSON_AddStringToObject(o, "source", src); else cJSON_AddNullToObject(o, "source");
    free(src);
    pthread_mutex_lock(&g->reload_mu);
    if (g->last_reload_error[0]) cJSON_AddStringToObject(o, "last_reload_error", g->last_reload_error);
    pthread_mutex_unlock(&g->reload_mu);
    sw_policy_unref(p);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return respond_json(c, 200, s);
}

static enum MHD_Result do_reload(sw_gateway *g, struct MHD_Connection *c)
{
    char err[4096];
    if (sw_gw_reload(g, err, sizeof err) != 0)
        return respond_error(c, 400, err, "invalid_request_error", NULL, "policy_invalid");
    if (sw_keys_reload(s_keys, err, sizeof err) != 0)
        return respond_error(c, 400, err, "invalid_request_error", NULL, "api_keys_invalid");
    sw_policy *p = sw_gw_policy(g);
    char *s;
    if (asprintf(&s, "{\"ok\":true,\"version\":%llu}", (unsigned long long)p->version) < 0) s = NULL;
    sw_policy_unref(p);
    return respond_json(c, 200, s ? s : strdup("{\"ok\":true}"));
}

/* ---- generate requests ---------------------------------------------------- */
/* r->wake of an HTTP request (r->mu held). */
static void wake_locked(sw_req *r)
{
    if (r->suspended) {
        r->suspended = false;
        MHD_resume_connection(r->conn);
    }
}

/* A token's log probability entry, kept for the response. */
static void lp_token(struct sw_lp_token *t, ProtobufCBinaryData token, float logprob)
{
    t->bytes = malloc(token.len + 1);
    if (!t->bytes) abort();   /* out of memory in a few bytes: nothing smaller to answer */
    if (token.len) memcpy(t->bytes, token.data, token.len);   /* a control token has none (data NULL) */
    t->bytes[token.len] = 0;
    t->n = token.len;
    t->logprob = logprob;
}

static void add_logprob(sw_req *r, const Spillway__Logprob *l)
{
    if (r->n_lps == r->cap_lps) {
        size_t cap = r->cap_lps ? 2 * r->cap_lps : 64;
        struct sw_lp_entry *p = realloc(r->lps, cap * sizeof *p);
        if (!p) abort();
        r->lps = p;
        r->cap_lps = cap;
    }
    struct sw_lp_entry *e = &r->lps[r->n_lps++];
    lp_token(&e->tok, l->token, l->logprob);
    e->n_top = l->n_top;
    e->top = l->n_top ? calloc(l->n_top, sizeof *e->top) : NULL;
    if (l->n_top && !e->top) abort();
    for (size_t k = 0; k < l->n_top; k++) lp_token(&e->top[k], l->top[k]->token, l->top[k]->logprob);
}

/* The HTTP sink: a chunk's text, reasoning, log probabilities and calls
 * wait in r for the connection's reader (sse_reader or answer_generate). */
static void fail_locked(sw_req *r, int status, const char *type, const char *code, const char *msg);

/* A stream's output waiting for its reader: text not yet framed, and
 * framed bytes not yet written. */
static size_t backlog(const sw_req *r)
{
    return r->text.n + r->reasoning.n + (r->out.n - r->out_off);
}

/* A stream whose reader does not keep up: past SW_MAX_STREAM_BACKLOG_BYTES
 * it ends in-band with an error (what the reader gets when it reads again)
 * and the broker cancels it at the worker, rather than letting one slow
 * client grow the gateway's memory. True when r was cut off. */
static bool reader_too_slow(sw_req *r, const Spillway__TokenChunk *c)
{
    size_t add = (c->text ? strlen(c->text) : 0) + (c->reasoning ? strlen(c->reasoning) : 0);
    if (!r->stream || r->finished || backlog(r) + add <= SW_MAX_STREAM_BACKLOG_BYTES) return false;
    char msg[160];
    snprintf(msg, sizeof msg, "the stream was not read: more than %u bytes of output waited for "
             "the client, so the request was cancelled", SW_MAX_STREAM_BACKLOG_BYTES);
    fail_locked(r, 503, "server_error", "stream_backlog", msg);
    fprintf(stderr, "gateway: %s: %s\n", r->id, msg);
    return true;
}

static bool http_chunk(sw_req *r, const Spillway__TokenChunk *c, int64_t rx_ns)
{
    pthread_mutex_lock(&r->mu);
    if (reader_too_slow(r, c)) {
        pthread_mutex_unlock(&r->mu);
        return false;   /* the broker cancels it at the worker */
    }
    if (c->text && *c->text) {
        if ((r->text.n == 0 && r->reasoning.n == 0) || !r->stream) r->text_rx_ns = rx_ns;
        sw_sbuf_put_n(&r->text, c->text, strlen(c->text));
    }
    if (c->reasoning && *c->reasoning && r->chat) {
        if ((r->text.n == 0 && r->reasoning.n == 0) || !r->stream) r->text_rx_ns = rx_ns;
        sw_sbuf_put_n(&r->reasoning, c->reasoning, strlen(c->reasoning));
    }
    for (size_t i = 0; i < c->n_prompt_logprobs && r->logprobs && r->n_lps == r->n_prompt_lps; i++) {
        add_logprob(r, c->prompt_logprobs[i]);   /* ahead of the generated tokens' */
        r->n_prompt_lps++;
    }
    for (size_t i = 0; i < c->n_logprobs && r->logprobs; i++) add_logprob(r, c->logprobs[i]);
    for (size_t i = 0; i < c->n_tool_calls && r->chat; i++)   /* kept for the response */
        if (!sw_tool_calls_add(&r->calls, c->tool_calls[i]->name, c->tool_calls[i]->arguments)) abort();
    pthread_mutex_unlock(&r->mu);
    return true;   /* a vanished client is seen by the broker's poll, or the connection's end */
}

/* Before the HTTP status went out: a real error status. After (a stream
 * already running): finish_reason "error", in-band. */
static void fail_locked(sw_req *r, int status, const char *type, const char *code, const char *msg)
{
    snprintf(r->err_msg, sizeof r->err_msg, "%s", msg);
    r->err_type = type;
    r->err_code = code;
    if (r->headers_sent) {
        r->finished = true;
        r->finish = SPILLWAY__FINISH_REASON__FINISH_ERROR;
    } else {
        r->err_status = status;
    }
    r->decided = true;
    wake_locked(r);
}

static void http_fail(sw_req *r, int status, const char *type, const char *code, const char *msg)
{
    pthread_mutex_lock(&r->mu);
    fail_locked(r, status, type, code, msg);
    pthread_mutex_unlock(&r->mu);
}

static const sw_sink http_sink = { http_chunk, http_fail, wake_locked, sw_embed_keep };

static void suspend_locked(sw_req *r)
{
    r->suspended = true;
    MHD_suspend_connection(r->conn);
}

/* The events for what arrived since the last: /v1/responses' own, or
 * chat/completions chunks. */
static void take_text(sw_req *r, sw_sbuf *out)
{
    if (r->resp) {
        sw_responses_sse_take(r, out);
        r->sse_stage = 1;
        return;
    }
    sw_openai_sse_pending(r, out);
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    sw_req *r = cls;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        /* Out of memory somewhere in the stream: cut it (the client sees no
         * [DONE]) and let the connection's end cancel the request. */
        if (r->out.oom || r->text.oom || r->reasoning.oom) break;
        if (r->out_off < r->out.n) {
            size_t n = r->out.n - r->out_off;
            if (n > max) n = max;
            memcpy(buf, r->out.s + r->out_off, n);
            r->out_off += n;
            if (r->out_off == r->out.n) r->out_off = r->out.n = 0;
            r->last_write_ms = sw_now_ms();
            pthread_mutex_unlock(&r->mu);
            return (ssize_t)n;
        }
        if (r->client_gone) break;
        if (r->sse_stage == 3) {
            pthread_mutex_unlock(&r->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        int64_t rx = r->text_rx_ns;
        if (r->text.n || r->reasoning.n || r->calls.n > r->n_calls_sent || r->n_lps > r->n_lps_sent ||
            (r->chat && r->sse_stage == 0)) {
            take_text(r, &r->out);
            if (rx) sw_metrics_latency(SW_LAT_RELAY, sw_now_ns() - rx);
            r->text_rx_ns = 0;
            continue;
        }
        if (r->finished || r->err_status) {
            if (r->err_status) {   /* failed after headers but before the broker knew */
                r->finish = SPILLWAY__FINISH_REASON__FINISH_ERROR;
                r->finished = true;
            }
            if (r->resp) sw_responses_sse_final(r, &r->out);
            else sw_openai_sse_final(r, &r->out);
            r->sse_stage = 3;
            continue;
        }
        if (r->keepalive_due) {
            r->keepalive_due = false;
            /* An SSE comment: ignored by clients, but the write makes a
             * vanished client visible and keeps proxies from timing out. */
            sw_sbuf_put(&r->out, ": keep-alive\n\n");
            continue;
        }
        r->sse_stage = r->sse_stage ? r->sse_stage : 1;
        suspend_locked(r);
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    pthread_mutex_unlock(&r->mu);
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void sse_free(void *cls) { sw_req_unref(cls); }

static void add_route_headers(struct MHD_Response *resp, sw_req *r)
{
    MHD_add_response_header(resp, "X-Spillway-Pool", r->pool);
    MHD_add_response_header(resp, "X-Spillway-Worker", r->worker);
    MHD_add_response_header(resp, "X-Spillway-Request-Id", r->id);
}

/* Called when the connection is resumed (or right after submit). */
static enum MHD_Result answer_generate(struct MHD_Connection *c, sw_req *r)
{
    pthread_mutex_lock(&r->mu);
    if (r->client_gone) {
        pthread_mutex_unlock(&r->mu);
        return MHD_NO;
    }
    if (r->err_status) {
        int st = r->err_status;
        char msg[256];
        snprintf(msg, sizeof msg, "%s", r->err_msg);
        const char *type = r->err_type, *code = r->err_code;
        /* A worker's 400 to embeddings is about an input (a token not in
         * the vocabulary, a text past the context or the token limit). */
        const char *param = r->embed && st == 400 ? "input" : NULL;
        r->headers_sent = true;
        pthread_mutex_unlock(&r->mu);
        return respond_error(c, st, msg, type, param, code);
    }
    if (r->stream && r->decided) {
        r->headers_sent = true;
        r->last_write_ms = sw_now_ms();
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                                      sse_reader, sw_req_ref(r), sse_free);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        add_route_headers(resp, r);
        pthread_mutex_unlock(&r->mu);
        enum MHD_Result rc = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return rc;
    }
    if (!r->stream && r->finished) {
        r->headers_sent = true;
        if (r->finish == SPILLWAY__FINISH_REASON__FINISH_ERROR) {
            char msg[256];
            snprintf(msg, sizeof msg, "%s", r->err_msg[0] ? r->err_msg : "the worker failed");
            pthread_mutex_unlock(&r->mu);
            return respond_error(c, 502, msg, "server_error", NULL, "worker_error");
        }
        if (r->text.oom || r->reasoning.oom) {
            pthread_mutex_unlock(&r->mu);
            return respond_error(c, 500, "the gateway ran out of memory holding the response", "server_error",
                                 NULL, "out_of_memory");
        }
        char *body = r->embed ? sw_embed_response(r) : r->resp ? sw_responses_body(r) : sw_openai_response(r);
        if (!body) {
            pthread_mutex_unlock(&r->mu);
            return respond_error(c, 500, "the gateway ran out of memory holding the response", "server_error",
                                 NULL, "out_of_memory");
        }
        int64_t rx = r->text_rx_ns;
        struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body,
                                                                    MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(resp, "Content-Type", "application/json");
        add_route_headers(resp, r);
        pthread_mutex_unlock(&r->mu);
        enum MHD_Result rc = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        if (rx) sw_metrics_latency(SW_LAT_RELAY, sw_now_ns() - rx);
        return rc;
    }
    suspend_locked(r);
    pthread_mutex_unlock(&r->mu);
    return MHD_YES;
}

static const char *header(struct MHD_Connection *c, const char *name)
{
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
    return v && *v ? v : NULL;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

/* The request's max_tokens, from its encoded generate request (0 if none). */
static uint32_t gen_max_tokens(const sw_req *r)
{
    Spillway__Envelope *e = spillway__envelope__unpack(NULL, r->gen_len, r->gen);
    uint32_t m = 0;
    if (e && e->body_case == SPILLWAY__ENVELOPE__BODY_GENERATE && e->generate) m = e->generate->max_tokens;
    if (e) spillway__envelope__free_unpacked(e, NULL);
    return m;
}

/* The pools the admitted key may use, copied into the request for the
 * router (the request may outlive the ticket). False out of memory. */
static bool copy_key_pools(const sw_key_ticket *t, sw_req *r)
{
    size_t n;
    char *const *pools = sw_key_pools(t, &n);
    if (!n) return true;
    if (!(r->key_pools = calloc(n, sizeof *r->key_pools))) return false;
    for (; r->n_key_pools < n; r->n_key_pools++)
        if (!(r->key_pools[r->n_key_pools] = strdup(pools[r->n_key_pools]))) return false;
    return true;
}

/* Admission by the client's API key (keys.h), after parsing. True when
 * admitted (ctx->key holds the ticket); false with the refusal queued in *rc. */
static bool admit_key(struct MHD_Connection *c, conn_ctx *ctx, sw_req *r, enum MHD_Result *rc)
{
    if (!sw_keys_enabled(s_keys)) return true;
    ctx->key_max_tokens = gen_max_tokens(r);
    sw_key_request kr = { .authorization = header(c, "Authorization"), .model = r->model,
                          .target = r->want_target, .klass = r->klass,
                          .prompt_tokens = r->prompt_tokens_est, .max_tokens = ctx->key_max_tokens };
    sw_key_refusal why;
    int st = sw_keys_admit(s_keys, &kr, &ctx->key, &why);
    if (st == 0 && !copy_key_pools(ctx->key, r)) {
        *rc = respond_error(c, 500, "the gateway ran out of memory", NULL, NULL, "out_of_memory");
        return false;
    }
    if (st == 0) {
        r->klass = sw_key_class(ctx->key, r->klass);
        snprintf(r->key_label, sizeof r->key_label, "%s", sw_key_label(ctx->key));
        return true;
    }
    sw_metrics_request(NULL, SW_ST_REJECTED);
    *rc = respond(c, (unsigned)st, "application/json",
                  sw_openai_error_json(why.message, why.type, why.param, why.code), why.retry_after_s);
    return false;
}

/* The body parsed by its endpoint's parser into r: 0, or an HTTP status
 * with msg and *param set. */
static int parse_body(const conn_ctx *ctx, sw_req *r, const sw_policy *p, char *msg, size_t msglen,
                      const char **param)
{
    const char *body = ctx->body.s ? ctx->body.s : "";
    if (ctx->ep == EP_RESPONSES) return sw_responses_parse(r, body, ctx->body.n, p, msg, msglen, param);
    if (ctx->ep == EP_EMBEDDINGS) return sw_embed_parse(r, body, ctx->body.n, p, msg, msglen, param);
    return sw_openai_parse(r, body, ctx->body.n, r->chat, p, msg, msglen, param);
}

static const char *id_prefix(int ep)
{
    return ep == EP_RESPONSES ? "resp_" : ep == EP_CHAT ? "chatcmpl-" : ep == EP_EMBEDDINGS ? "embd-" : "cmpl-";
}

static enum MHD_Result start_generate(sw_gateway *g, struct MHD_Connection *c, conn_ctx *ctx)
{
    if (ctx->too_large)
        return respond_error(c, 413, "request body is larger than 1 MiB", NULL, NULL, "body_too_large");
    if (ctx->body.oom)
        return respond_error(c, 500, "the gateway ran out of memory reading the body", NULL, NULL, "out_of_memory");
    if (__atomic_load_n(&g->stop, __ATOMIC_ACQUIRE))   /* the broker is gone: nobody would ever resume this connection */
        return respond_error(c, 503, "the gateway is shutting down", NULL, NULL, "shutting_down");
    sw_req *r = sw_req_new();
    r->chat = ctx->ep == EP_CHAT || ctx->ep == EP_RESPONSES;   /* a Responses request is chat underneath */
    make_id(r->id, sizeof r->id, id_prefix(ctx->ep));
    r->created_s = time(NULL);
    r->conn = c;
    r->sink = &http_sink;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    r->fd = ci ? ci->connect_fd : -1;

    /* Directives from headers first; the body's `spillway` object overrides. */
    r->want_target = dup_or_null(header(c, "X-Spillway-Target"));
    r->want_quant = dup_or_null(header(c, "X-Spillway-Quantization"));
    r->tenant = dup_or_null(header(c, "X-Spillway-Tenant"));
    const char *auth = header(c, "Authorization");
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0) r->api_key = strdup(auth + 7);
    const char *pc = header(c, "X-Spillway-Priority");
    if (pc) {
        r->klass = sw_priority_parse(pc);
        if (r->klass < 0) {
            sw_req_unref(r);
            return respond_error(c, 400, "X-Spillway-Priority must be interactive or batch", NULL,
                                 "X-Spillway-Priority", "invalid_header");
        }
    }
    const char *mq = header(c, "X-Spillway-Max-Queue-Ms");
    if (mq) {
        char *end;
        long v = strtol(mq, &end, 10);
        if (end == mq || *end || v < 0 || v > SW_MAX_QUEUE_MS) {
            sw_req_unref(r);
            return respond_error(c, 400, "X-Spillway-Max-Queue-Ms must be an integer of milliseconds",
                                 NULL, "X-Spillway-Max-Queue-Ms", "invalid_header");
        }
        r->max_queue_ms = v;
    }

    sw_policy *p = sw_gw_policy(g);
    char msg[256];
    const char *param = NULL;
    int st = parse_body(ctx, r, p, msg, sizeof msg, &param);
    if (st == 0 && !sw_front_model_exists(&g->reg, p, r->model)) {
        snprintf(msg, sizeof msg, "The model '%s' does not exist", r->model_asked);
        sw_policy_unref(p);
        sw_req_unref(r);
        sw_metrics_request(NULL, SW_ST_REJECTED);
        return respond_error(c, 404, msg, "invalid_request_error", "model", "model_not_found");
    }
    if (st == 0) st = sw_front_check_kind(&g->reg, r, msg, sizeof msg, &param);   /* embedding or not */
    r->policy = p;   /* the request keeps the policy it was parsed with */
    if (st != 0) {
        sw_req_unref(r);
        sw_metrics_request(NULL, SW_ST_REJECTED);
        return respond_error(c, st, msg, NULL, param, NULL);
    }
    enum MHD_Result krc;
    if (!admit_key(c, ctx, r, &krc)) {
        sw_req_unref(r);
        return krc;
    }
    r->t_submit_ns = sw_now_ns();
    ctx->req = r;
    ctx->submitted = true;
    pthread_mutex_lock(&r->mu);
    sw_broker_post(g, SW_CMD_SUBMIT, r);
    suspend_locked(r);
    pthread_mutex_unlock(&r->mu);
    return MHD_YES;
}

/* ---- the admin API: its own token ---------------------------------------- */
static bool is_admin(int ep)
{
    return ep == EP_WORKERS || ep == EP_POLICY || ep == EP_RELOAD || ep == EP_STATUS || ep == EP_OPS;
}

/* Whether "Authorization: Bearer T" carries the admin token. */
static bool admin_token_ok(const sw_gateway *g, const char *auth)
{
    if (!auth || strncasecmp(auth, "Bearer ", 7) != 0) return false;
    const char *t = auth + 7;
    while (*t == ' ') t++;
    return sw_gw_admin_token_ok(g, t);
}

/* For a request to the admin API: 0 to go on, or 1 with the refusal
 * queued (its MHD result in *rc): 403 when no token is configured (the
 * admin API is off, and says how to turn it on), 401 with WWW-Authenticate
 * when the token is missing or wrong. Other endpoints: 0. */
static int admin_refusal(const sw_gateway *g, struct MHD_Connection *c, int ep, enum MHD_Result *rc)
{
    if (!is_admin(ep)) return 0;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (g->admin_token && admin_token_ok(g, auth)) return 0;
    if (!g->admin_token) {
        *rc = respond_error(c, 403, "the admin API is disabled: start the gateway with --admin-token-file FILE "
                            "(a file of mode 0600 holding the token; see docs/security.md, \"Admin token\") "
                            "and send Authorization: Bearer TOKEN", "permission_error", NULL, "admin_disabled");
        return 1;
    }
    const char *msg = auth ? "wrong admin token (Authorization: Bearer TOKEN, the token in --admin-token-file)"
                           : "the admin API needs Authorization: Bearer TOKEN (the token in --admin-token-file)";
    char *body = sw_openai_error_json(msg, "invalid_request_error", NULL,
                                      auth ? "invalid_admin_token" : "missing_admin_token");
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "WWW-Authenticate", "Bearer realm=\"spillway-admin\"");
    *rc = MHD_queue_response(c, 401, resp);
    MHD_destroy_response(resp);
    return 1;
}

/* An operator's action (admin.c), with the client's address for its log. */
static enum MHD_Result do_ops(sw_gateway *g, struct MHD_Connection *c, const char *url, const sw_sbuf *body)
{
    char peer[64] = "";
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr)
        getnameinfo(ci->client_addr, ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                    : sizeof(struct sockaddr_in), peer, sizeof peer, NULL, 0, NI_NUMERICHOST);
    if (body->oom) return respond_error(c, 503, "out of memory", NULL, NULL, "out_of_memory");
    char *json = NULL;
    int status = sw_admin_action(g, url, body->s ? body->s : "", body->n, peer, &json);
    return respond_json(c, (unsigned)status, json);
}

static enum MHD_Result do_workers(sw_gateway *g, struct MHD_Connection *c)
{
    char *arr = sw_registry_json(&g->reg);
    char *s;
    if (asprintf(&s, "{\"object\":\"list\",\"data\":%s}", arr) < 0) s = strdup("{}");
    free(arr);
    return respond_json(c, 200, s);
}

/* ---- message framing (RFC 9112 section 6) -------------------------------- */
typedef struct { int n_cl, n_te; bool cl_conflict, cl_bad; unsigned long long cl; const char *te; } framing;

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    framing *f = cls;
    if (!key || !value) return MHD_YES;
    if (strcasecmp(key, "Content-Length") == 0) {
        char *end;
        unsigned long long v = strtoull(value, &end, 10);
        if (end == value || *end || *value == '-' || *value == '+') f->cl_bad = true;
        else if (f->n_cl && v != f->cl) f->cl_conflict = true;
        f->cl = v;
        f->n_cl++;
    } else if (strcasecmp(key, "Transfer-Encoding") == 0) {
        f->te = value;
        f->n_te++;
    }
    return MHD_YES;
}

/* Whether the headers frame the body in more than one way, or in a way we
 * do not speak. A front proxy may read such a request differently from us
 * (request smuggling: what it takes for one body we would take for a
 * second request), so it is refused with 400 and the connection closed,
 * nothing after it read. NULL when the framing is sound, else the message,
 * with the header's name in *param. */
static const char *bad_framing(struct MHD_Connection *c, const char **param)
{
    framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &f);
    *param = f.n_te ? "Transfer-Encoding" : "Content-Length";
    if (f.n_te && f.n_cl) return "a request may not carry both Content-Length and Transfer-Encoding";
    if (f.n_te > 1) return "Transfer-Encoding may be given once";
    if (f.n_te && strcasecmp(f.te, "chunked") != 0)
        return "the only transfer coding accepted is \"chunked\"";
    if (f.cl_bad) return "Content-Length must be a decimal number of bytes";
    if (f.cl_conflict) return "Content-Length is given more than once with different values";
    return NULL;
}

/* The 400 for bad framing, with Connection: close so libmicrohttpd closes
 * the connection after it instead of reading on. */
static enum MHD_Result refuse_framing(struct MHD_Connection *c, const char *msg, const char *param)
{
    char *body = sw_openai_error_json(msg, "invalid_request_error", param, "bad_framing");
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Connection", "close");
    enum MHD_Result rc = MHD_queue_response(c, 400, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* ---- the dashboard: files embedded in the binary (gateway/dashboard/) ---- */
static bool is_dashboard(const char *url)
{
    return strcmp(url, "/dashboard") == 0 || strncmp(url, "/dashboard/", 11) == 0;
}

static const char *dash_type(const char *name)
{
    const char *dot = strrchr(name, '.');
    if (dot && strcmp(dot, ".html") == 0) return "text/html; charset=utf-8";
    if (dot && strcmp(dot, ".js") == 0) return "text/javascript; charset=utf-8";
    if (dot && strcmp(dot, ".css") == 0) return "text/css; charset=utf-8";
    return "application/octet-stream";
}

/* GET /dashboard (index.html) and /dashboard/<file>; other names get 404.
 * The files hold no secret, so they need no token: the page asks the
 * operator for the admin token and sends it itself (docs/dashboard.md).
 * The CSP lets the page load and fetch from this origin only. */
static enum MHD_Result do_dashboard(struct MHD_Connection *c, const char *url, const char *method)
{
    if (strcmp(method, "GET") != 0)
        return respond_error(c, 405, "the dashboard answers GET only", NULL, NULL, "method_not_allowed");
    const char *name = url[10] && url[11] ? url + 11 : "index.html";
    const sw_dash_file *f = NULL;
    for (unsigned i = 0; i < sw_dash_n_files && !f; i++)
        if (strcmp(name, sw_dash_files[i].name) == 0) f = &sw_dash_files[i];
    if (!f) {
        char msg[300];
        snprintf(msg, sizeof msg, "no such dashboard file: %.200s", url);
        return respond_error(c, 404, msg, "invalid_request_error", NULL, "not_found");
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(f->len, (void *)f->data, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(resp, "Content-Type", dash_type(f->name));
    MHD_add_response_header(resp, "Content-Security-Policy",
                            "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result rc = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* ---- dispatch by URL ------------------------------------------------------ */
static int endpoint(const char *url, const char **allow)
{
    static const struct { const char *path; int ep; const char *method; } T[] = {
        {"/v1/completions", EP_COMPLETIONS, "POST"}, {"/v1/chat/completions", EP_CHAT, "POST"},
        {"/v1/responses", EP_RESPONSES, "POST"},     {"/v1/embeddings", EP_EMBEDDINGS, "POST"},
        {"/v1/models", EP_MODELS, "GET"},            {"/healthz", EP_HEALTH, "GET"},
        {"/metrics", EP_METRICS, "GET"},             {"/admin/workers", EP_WORKERS, "GET"},
        {"/admin/policy", EP_POLICY, "GET"},         {"/admin/reload", EP_RELOAD, "POST"},
        {"/admin/status", EP_STATUS, "GET"},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (strcmp(url, T[i].path) == 0) {
            *allow = T[i].method;
            return T[i].ep;
        }
    if (sw_admin_is_action(url)) {   /* /admin/workers/ID/drain, ...: admin.c reads the rest */
        *allow = "POST";
        return EP_OPS;
    }
    return EP_NONE;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    (void)version;
    sw_gateway *g = cls;
    conn_ctx *ctx = *con_cls;
    if (!ctx) {
        const char *fparam, *fmsg = bad_framing(c, &fparam);
        if (fmsg) return refuse_framing(c, fmsg, fparam);
        if (is_dashboard(url)) return do_dashboard(c, url, method);
        const char *allow = NULL;
        int ep = endpoint(url, &allow);
        if (ep == EP_NONE) {
            char msg[300];
            snprintf(msg, sizeof msg, "no such endpoint: %.200s", url);
            return respond_error(c, 404, msg, "invalid_request_error", NULL, "not_found");
        }
        if (strcmp(method, allow) != 0) {
            char msg[200];
            snprintf(msg, sizeof msg, "method %.20s not allowed here; use %s", method, allow);
            struct MHD_Response *resp;
            char *body = sw_openai_error_json(msg, "invalid_request_error", NULL, "method_not_allowed");
            resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
            MHD_add_response_header(resp, "Content-Type", "application/json");
            MHD_add_response_header(resp, "Allow", allow);
            enum MHD_Result rc = MHD_queue_response(c, 405, resp);
            MHD_destroy_response(resp);
            return rc;
        }
        enum MHD_Result arc;
        if (admin_refusal(g, c, ep, &arc)) return arc;
        /* A declared body far beyond the limit is refused at once (the
         * connection then closes). A moderately oversized one is read and
         * discarded first, so clients that send without waiting for
         * "100 Continue" still see the 413 instead of a broken pipe. */
        const char *cl = header(c, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > SW_MAX_DISCARD)
            return respond_error(c, 413, "request body is larger than 1 MiB", NULL, NULL, "body_too_large");
        ctx = calloc(1, sizeof *ctx);
        if (!ctx) return MHD_NO;
        ctx->ep = ep;
        *con_cls = ctx;
        if (strcmp(method, "POST") == 0) return MHD_YES;   /* body follows */
    }
    if (ctx->submitted) return answer_generate(c, ctx->req);
    if (*upload_size) {
        if (ctx->body.n + *upload_size > SW_MAX_BODY) ctx->too_large = true;
        else sw_sbuf_put_n(&ctx->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    switch (ctx->ep) {
    case EP_COMPLETIONS:
    case EP_CHAT:
    case EP_RESPONSES:
    case EP_EMBEDDINGS: return start_generate(g, c, ctx);
    case EP_MODELS: return do_models(g, c);
    case EP_HEALTH: return do_health(g, c);
    case EP_METRICS: return do_metrics(g, c);
    case EP_WORKERS: return do_workers(g, c);
    case EP_POLICY: return do_policy(g, c);
    case EP_STATUS: return respond_json(c, 200, sw_gw_status_json(g));
    case EP_RELOAD: return do_reload(g, c);
    case EP_OPS:
        if (ctx->too_large)
            return respond_error(c, 413, "request body is larger than 1 MiB", NULL, NULL, "body_too_large");
        return do_ops(g, c, url, &ctx->body);
    }
    return MHD_NO;
}

/* The request is over for its client: give back the key's concurrent slot
 * and trade its token charge for what was used. The usage is final when the
 * worker reported it; a request cut off before that is charged in full if
 * it ever produced a token (the worker spent them), else nothing. */
static void settle_key(conn_ctx *ctx)
{
    if (!ctx->key) return;
    uint32_t prompt = 0, completion = 0;
    sw_req *r = ctx->req;
    if (r) {
        pthread_mutex_lock(&r->mu);
        prompt = r->usage_prompt;
        completion = r->usage_completion;
        if (!prompt && !completion && r->got_token) {
            prompt = r->prompt_tokens_est;
            completion = ctx->key_max_tokens;
        }
        pthread_mutex_unlock(&r->mu);
    }
    sw_keys_settle(ctx->key, prompt, completion);
    ctx->key = NULL;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why)
{
    (void)c;
    sw_gateway *g = cls;
    conn_ctx *ctx = *con_cls;
    if (!ctx) return;
    *con_cls = NULL;
    settle_key(ctx);
    if (ctx->req) {
        sw_req *r = ctx->req;
        pthread_mutex_lock(&r->mu);
        r->conn_done = true;
        /* Ended before the request finished (client abort, write error,
         * shutdown): the worker must stop and free its slot. */
        bool cancel = r->phase != SW_PH_DONE && !r->client_gone;
        pthread_mutex_unlock(&r->mu);
        if (cancel) {
            if (why != MHD_REQUEST_TERMINATED_COMPLETED_OK)
                fprintf(stderr, "gateway: %s ended early (termination code %d): cancelling\n", r->id, why);
            sw_broker_post(g, SW_CMD_CANCEL, r);
        }
        sw_req_unref(r);
    }
    sw_sbuf_free(&ctx->body);
    free(ctx);
}

/* Seconds a connection may be idle: SW_HTTP_IDLE_TIMEOUT_S, or
 * SPILLWAY_HTTP_IDLE_TIMEOUT_S (1..86400) where set (tests use a short one). */
static unsigned idle_timeout_s(void)
{
    const char *e = getenv("SPILLWAY_HTTP_IDLE_TIMEOUT_S");
    if (!e || !*e) return SW_HTTP_IDLE_TIMEOUT_S;
    char *end;
    long v = strtol(e, &end, 10);
    if (*end || v < 1 || v > 86400) {
        fprintf(stderr, "gateway: ignoring SPILLWAY_HTTP_IDLE_TIMEOUT_S=%s (want 1..86400 seconds)\n", e);
        return SW_HTTP_IDLE_TIMEOUT_S;
    }
    return (unsigned)v;
}

/* The soft descriptor limit raised (within the hard one) to hold every
 * connection allowed plus the gateway's own sockets and files, so the
 * connection limit, not EMFILE at accept, is what a flood meets. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    rlim_t want = SW_HTTP_MAX_CONNECTIONS + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want) return;
    rl.rlim_cur = rl.rlim_max < want ? rl.rlim_max : want;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < want)
        fprintf(stderr, "gateway: only %llu file descriptors (ulimit -n): fewer than the %u connections allowed\n",
                (unsigned long long)rl.rlim_cur, SW_HTTP_MAX_CONNECTIONS);
}

/* The daemon, on addr (NULL: no listening socket, connections are added by
 * sw_http_add_connection). 0, or -1 with err. */
static int start_daemon(sw_gateway *g, const struct sockaddr *addr, bool ipv6, uint16_t port, char *err,
                        size_t errlen)
{
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    if (ipv6) flags |= MHD_USE_IPv6;
    if (!addr) flags |= MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    raise_fd_limit();
    if (!s_keys && !(s_keys = sw_keys_open(g->api_keys_file, err, errlen))) return -1;
    /* The idle timeout counts inactivity: a stream that sends tokens or
     * keep-alives is never idle, nor is a connection suspended waiting on
     * a worker; a client that sends nothing (slowloris) or never reads is. */
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, g},
        {MHD_OPTION_THREAD_POOL_SIZE, HTTP_THREADS, NULL},
        {MHD_OPTION_CONNECTION_TIMEOUT, idle_timeout_s(), NULL},
        {MHD_OPTION_CONNECTION_LIMIT, SW_HTTP_MAX_CONNECTIONS, NULL},
        {MHD_OPTION_PER_IP_CONNECTION_LIMIT, SW_HTTP_MAX_CONNECTIONS_PER_IP, NULL},
        {MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024, NULL},
        {addr ? MHD_OPTION_SOCK_ADDR : MHD_OPTION_END, 0, (void *)addr},
        {MHD_OPTION_END, 0, NULL},
    };
    g->mhd = MHD_start_daemon(flags, port, NULL, NULL, on_request, g, MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
    return g->mhd ? 0 : -1;
}

int sw_http_start(sw_gateway *g, const char *host, int port, char *err, size_t errlen)
{
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int gr = getaddrinfo(host && *host ? host : NULL, ps, &hints, &ai);
    if (gr != 0) {
        snprintf(err, errlen, "cannot resolve HTTP address %s: %s", host, gai_strerror(gr));
        return -1;
    }
    err[0] = 0;
    int rc = start_daemon(g, ai->ai_addr, ai->ai_family == AF_INET6, (uint16_t)port, err, errlen);
    freeaddrinfo(ai);
    if (rc != 0 && !err[0]) snprintf(err, errlen, "cannot start the HTTP server on %s:%d (port in use?)", host, port);
    return rc;
}

int sw_http_start_unbound(sw_gateway *g, char *err, size_t errlen)
{
    err[0] = 0;
    int rc = start_daemon(g, NULL, false, 0, err, errlen);
    if (rc != 0 && !err[0]) snprintf(err, errlen, "cannot start the HTTP server");
    return rc;
}

int sw_http_add_connection(sw_gateway *g, int fd)
{
    /* a loopback client, as far as the per-client limits can tell */
    struct sockaddr_in peer = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    return MHD_add_connection(g->mhd, fd, (const struct sockaddr *)&peer, sizeof peer) == MHD_YES ? 0 : -1;
}

void sw_http_stop(sw_gateway *g)
{
    if (g->mhd) MHD_stop_daemon(g->mhd);
    g->mhd = NULL;
    sw_keys_close(s_keys);   /* after the daemon: every connection has settled */
    s_keys = NULL;
}
