/* The broker thread: the only thread that touches ZeroMQ.
 *
 * It polls the worker ROUTER and the inbox eventfd, registers workers, keeps
 * Paranoid Pirate heartbeats, dispatches requests (router.c decides where),
 * relays chunks into sw_req objects and wakes their HTTP connections, runs the
 * bounded wait queue, and every SW_TICK_MS checks liveness, timeouts, client
 * disconnects (POLLRDHUP on suspended connections) and SSE keep-alives.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#include "gateway/access.h"
#include "gateway/broker.h"
#include "gateway/choices.h"
#include "gateway/front.h"
#include "gateway/metrics.h"
#include "gateway/registry.h"
#include "gateway/router.h"
#include "gateway/util.h"
#include "gateway/zap.h"
#include "llm/limits.h"
#include "proto/curve.h"

#define NBUCKETS 4096
#define MAX_MSGS_PER_ROUND 512   /* then look at the inbox again: fairness */
#define RELOAD_CHECK_MS 1000
#define WORKER_STRIKES 8         /* frames for requests it never had, before a worker is dropped */

/* What a running request has received from its worker, against what it may
 * (llm/limits.h): the relay's bounds. Kept beside the request, keyed by it
 * (broker only), from dispatch to detach. */
typedef struct sw_acct {
    const struct sw_req *r;
    uint64_t tokens, bytes, max_tokens, max_bytes;
    struct sw_acct *next;
} sw_acct;

typedef struct {
    sw_gateway *g;
    void *router;
    void *sdk;                       /* ROUTER for SDK clients, or NULL */
    sw_req *buckets[NBUCKETS];
    sw_acct *accts[NBUCKETS];
    sw_req *active;                  /* all requests the broker holds */
    sw_req *qhead, *qtail;           /* wait queue (FIFO) */
    int qlen;
    bool capacity_changed;
    int64_t last_tick_ms, last_reload_check_ms;
} broker;

static broker B;

/* The inbox's entries (gateway.h): posted by HTTP threads, drained here. */
typedef struct sw_cmd { sw_cmd_kind kind; sw_req *req; struct sw_cmd *next; } sw_cmd;

/* ---- throttled logging --------------------------------------------------
 * What peers send wrong is logged at most `per_s` lines a second of each
 * kind, then one line with the count held back: a hostile peer must not
 * flood the log. */
typedef struct { const char *what; int per_s; int64_t window_ms; int logged, suppressed; } sw_ratelog;

static bool ratelog_ok(sw_ratelog *rl)
{
    int64_t now = sw_now_ms();
    if (now - rl->window_ms >= 1000) {
        if (rl->suppressed) fprintf(stderr, "gateway: (%d more %s not logged)\n", rl->suppressed, rl->what);
        rl->window_ms = now;
        rl->logged = rl->suppressed = 0;
    }
    if (++rl->logged > rl->per_s) {
        rl->suppressed++;
        return false;
    }
    return true;
}

#define LOG_LIMITED(rl, ...) do { if (ratelog_ok(&(rl))) fprintf(stderr, __VA_ARGS__); } while (0)

static sw_ratelog LOG_REFUSED = {"refused registrations", 5, 0, 0, 0};
static sw_ratelog LOG_INVALID = {"invalid frames", 1, 0, 0, 0};
static sw_ratelog LOG_FRAMING = {"messages with the wrong frame count", 1, 0, 0, 0};
static sw_ratelog LOG_UNEXPECTED = {"unexpected messages", 1, 0, 0, 0};
static sw_ratelog LOG_UNKNOWN = {"frames for requests a worker was never given", 1, 0, 0, 0};
static sw_ratelog LOG_CUT = {"responses cut off", 1, 0, 0, 0};
static sw_ratelog LOG_SLOTS = {"slot claims clamped", 1, 0, 0, 0};

/* Tells r's client side there is news (r->mu held). */
static void wake(sw_req *r)
{
    if (r->sink && r->sink->wake) r->sink->wake(r);
}

/* ---- request table -------------------------------------------------------- */
static unsigned hash_id(const char *s)
{
    unsigned h = 2166136261u;
    while (*s) h = (h ^ (unsigned char)*s++) * 16777619u;
    return h % NBUCKETS;
}

static void table_add(sw_req *r)
{
    unsigned h = hash_id(r->id);
    r->hnext = B.buckets[h];
    B.buckets[h] = r;
    r->prev = NULL;
    r->next = B.active;
    if (B.active) B.active->prev = r;
    B.active = r;
}

static sw_req *table_find(const char *id)
{
    for (sw_req *r = B.buckets[hash_id(id)]; r; r = r->hnext)
        if (strcmp(r->id, id) == 0) return r;
    return NULL;
}

static void table_del(sw_req *r)
{
    for (sw_req **pp = &B.buckets[hash_id(r->id)]; *pp; pp = &(*pp)->hnext)
        if (*pp == r) { *pp = r->hnext; break; }
    if (r->prev) r->prev->next = r->next; else B.active = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = r->hnext = NULL;
}

/* ---- relay bounds (sw_acct) ---------------------------------------------- */
static sw_acct **acct_slot(const sw_req *r)
{
    sw_acct **pp = &B.accts[((uintptr_t)r >> 4) % NBUCKETS];
    while (*pp && (*pp)->r != r) pp = &(*pp)->next;
    return pp;
}

static void acct_end(const sw_req *r)
{
    sw_acct **pp = acct_slot(r), *a = *pp;
    if (!a) return;
    *pp = a->next;
    free(a);
}

/* Starts r's count at its dispatch: max_tokens as the request asks (0, "up
 * to the context", is bounded by the most any request may ask), bytes by
 * what that many tokens and its prompt (prompt log probabilities) may take.
 * Out of memory, r goes unbounded rather than failing. */
static void acct_start(sw_req *r)
{
    acct_end(r);
    sw_acct *a = calloc(1, sizeof *a);
    if (!a) return;
    char err[64];
    sw_env *env = sw_wire_decode(r->gen, r->gen_len, err, sizeof err);
    /* An embeddings request's gen is an Envelope{embed}: the union's other
     * member. It relays one EmbedReply, no tokens. */
    uint32_t mt = env && env->body_case == SPILLWAY__ENVELOPE__BODY_GENERATE ? env->generate->max_tokens : 0;
    sw_wire_free(env);
    a->r = r;
    a->max_tokens = mt ? mt : SW_MAX_TOKENS_PER_REQUEST;
    a->max_bytes = SW_MAX_RESPONSE_BYTES_BASE +
                   (a->max_tokens + r->prompt_tokens_est) * (uint64_t)SW_MAX_RESPONSE_BYTES_PER_TOKEN;
    sw_acct **pp = acct_slot(r);
    a->next = *pp;
    *pp = a;
}

/* Counts chunk c (a frame of len bytes) against r's bounds. NULL while r is
 * within them; else the violation, as the metric names it. */
static const char *acct_take(const sw_req *r, const Spillway__TokenChunk *c, size_t len)
{
    if (len > SW_MAX_CHUNK_BYTES) return "oversize";
    sw_acct *a = *acct_slot(r);
    if (!a) return NULL;
    a->tokens += c->n_token_ids;
    a->bytes += len;
    if (a->tokens > a->max_tokens || (c->usage && c->usage->completion_tokens > a->max_tokens))
        return "over_max_tokens";
    if (a->bytes > a->max_bytes) return "oversize";
    return NULL;
}

static void queue_del(sw_req *r)
{
    sw_req *prev = NULL;
    for (sw_req *q = B.qhead; q; prev = q, q = q->qnext) {
        if (q != r) continue;
        if (prev) prev->qnext = q->qnext; else B.qhead = q->qnext;
        if (B.qtail == q) B.qtail = prev;
        B.qlen--;
        q->qnext = NULL;
        sw_metrics_queue(r->queued_pool, -1);
        return;
    }
}

/* ---- sending -------------------------------------------------------------- */
static int send_raw(sw_worker *w, const void *buf, size_t len)
{
    if (zmq_send(B.router, w->ident, w->ident_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return -1;
    if (zmq_send(B.router, buf, len, ZMQ_DONTWAIT) < 0) return -1;
    w->last_sent_ms = sw_now_ms();
    return 0;
}

static int send_env(sw_worker *w, sw_env *env)
{
    int rc = sw_wire_send(B.router, w->ident, w->ident_len, env, ZMQ_DONTWAIT);
    if (rc == 0) w->last_sent_ms = sw_now_ms();
    return rc;
}

static void send_cancel(sw_worker *w, const char *id)
{
    Spillway__Cancel c = SPILLWAY__CANCEL__INIT;
    c.request_id = (char *)id;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_CANCEL;
    env.cancel = &c;
    if (send_env(w, &env) < 0)
        fprintf(stderr, "gateway: cancel %s to worker %s failed: %s\n", id, w->id, zmq_strerror(errno));
}

/* ---- SDK replies ---------------------------------------------------------- */
static void sdk_send(sw_req *r, sw_env *env)
{
    if (!B.sdk || r->sdk_gone) return;
    if (sw_wire_send(B.sdk, r->sdk_ident, r->sdk_ident_len, env, ZMQ_DONTWAIT) < 0) {
        if (errno == EHOSTUNREACH) r->sdk_gone = true;
        else fprintf(stderr, "gateway: reply to SDK client for %s failed: %s\n", r->client_id,
                     zmq_strerror(errno));
    }
}

static void sdk_send_error(const uint8_t *ident, size_t len, const char *id, uint32_t code, const char *msg)
{
    Spillway__Error e = SPILLWAY__ERROR__INIT;
    e.request_id = (char *)id;
    e.code = code;
    e.message = (char *)msg;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_ERROR;
    env.error = &e;
    sw_wire_send(B.sdk, ident, len, &env, ZMQ_DONTWAIT);
}

/* Relays a worker's chunk to the SDK client under the client's id, saying
 * which pool and worker serve it. */
static void sdk_chunk(sw_req *r, const Spillway__TokenChunk *c, int finish, const char *text)
{
    Spillway__TokenChunk out = SPILLWAY__TOKEN_CHUNK__INIT;
    Spillway__Usage u = SPILLWAY__USAGE__INIT;
    out.request_id = r->client_id;
    out.text = (char *)(text ? text : "");
    if (c) {
        out.reasoning = c->reasoning;
        out.n_tool_calls = c->n_tool_calls;
        out.tool_calls = c->tool_calls;
        out.n_logprobs = c->n_logprobs;
        out.logprobs = c->logprobs;
        out.n_token_ids = c->n_token_ids;
        out.token_ids = c->token_ids;
        if (c->usage) out.usage = c->usage;
    }
    if (finish != SPILLWAY__FINISH_REASON__FINISH_NONE && !out.usage) {
        u.prompt_tokens = r->usage_prompt;
        u.completion_tokens = r->usage_completion;
        u.cached_tokens = r->usage_cached;
        u.reasoning_tokens = r->usage_reasoning;
        out.usage = &u;
    }
    out.finish_reason = finish;
    out.index = r->choice;
    out.pool = r->pool;
    out.worker_id = r->worker;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_CHUNK;
    env.chunk = &out;
    sdk_send(r, &env);
    r->sdk_sent = true;
}

/* The SDK sink: chunks go to the client at once, under its own id. */
static bool sdk_sink_chunk(sw_req *r, const Spillway__TokenChunk *c, int64_t rx_ns)
{
    (void)rx_ns;
    sdk_chunk(r, c, c->finish_reason, c->text);
    return !r->sdk_gone;
}

/* Before any chunk: an Error; after: a chunk finishing with an error. */
static void sdk_sink_fail(sw_req *r, int status, const char *type, const char *code, const char *msg)
{
    (void)type;
    (void)code;
    if (r->sdk_sent) sdk_chunk(r, NULL, SPILLWAY__FINISH_REASON__FINISH_ERROR, "");
    else sdk_send_error(r->sdk_ident, r->sdk_ident_len, r->client_id, (uint32_t)status, msg);
}

/* An embeddings answer goes to the client whole, under its own id. */
static void sdk_sink_embedded(sw_req *r, const Spillway__EmbedReply *e)
{
    Spillway__EmbedReply out = *e;
    out.request_id = r->client_id;
    out.pool = r->pool;
    out.worker_id = r->worker;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_EMBED_REPLY;
    env.embed_reply = &out;
    sdk_send(r, &env);
    r->sdk_sent = true;
}

static const sw_sink sdk_sink = { sdk_sink_chunk, sdk_sink_fail, NULL, sdk_sink_embedded };

/* ---- request lifecycle ---------------------------------------------------- */

/* Releases what a running request holds on its worker and route. */
static void detach(sw_req *r, bool error)
{
    if (r->w) {
        pthread_mutex_lock(&B.g->reg.mu);   /* HTTP threads read both for /admin/status */
        if (r->w->inflight) r->w->inflight--;
        if (r->stats && r->stats->inflight) r->stats->inflight--;
        pthread_mutex_unlock(&B.g->reg.mu);
        sw_worker_note_left(r->w, r->id);   /* its late chunks are no offence */
        r->w = NULL;
    }
    acct_end(r);
    if (r->stats) {
        if (!r->outcome_counted) sw_route_stats_outcome(r->stats, error, r->probe);
        r->stats = NULL;
        r->probe = r->outcome_counted = false;
    }
    if (r->phase == SW_PH_RUNNING) sw_metrics_inflight(r->pool, -1);
    B.capacity_changed = true;
}

static void on_cancel(sw_req *r);

/* The broker lets go of a request: counts it and drops its reference. A
 * request of several choices is counted in its choices, which go first. */
static void finish(sw_req *r, sw_status_label st)
{
    for (size_t i = 0; i < r->n_kids; i++) on_cancel(r->kids[i]);
    if (r->phase == SW_PH_QUEUED) queue_del(r);
    if (st == SW_ST_OK && r->stats) sw_route_stats_service(r->stats, sw_now_ms() - r->dispatch_ms);
    detach(r, st == SW_ST_ERROR);
    sw_access_end(r, st, sw_now_ns());
    const char *pool = r->pool[0] ? r->pool : r->queued_pool;
    if (!r->n_kids) sw_metrics_request(pool, st);
    if (!r->n_kids && (r->usage_prompt || r->usage_completion))
        sw_metrics_tokens(pool, r->usage_prompt, r->usage_cached, r->usage_completion);
    pthread_mutex_lock(&r->mu);
    r->phase = SW_PH_DONE;
    pthread_mutex_unlock(&r->mu);
    table_del(r);
    sw_req_unref(r);
}

/* Fails a request: the broker lets go of it (so its metrics are counted
 * before the client can see the answer and ask /metrics), then its sink
 * tells the client: a status, or in-band once answering began. */
static void fail(sw_req *r, int status, const char *type, const char *code, const char *msg,
                 sw_status_label st)
{
    sw_req_ref(r);   /* finish drops the table's reference */
    finish(r, st);
    r->sink->fail(r, status, type, code, msg);
    sw_req_unref(r);
}

static void fill_route_request(sw_req *r, sw_route_request *rq, const char *exclude)
{
    memset(rq, 0, sizeof *rq);
    rq->model = r->model;
    rq->klass = r->klass;
    rq->prompt_tokens = r->prompt_tokens_est;
    rq->api_key = r->api_key;
    rq->tenant = r->tenant;
    rq->want_target = r->want_target;
    rq->want_quant = r->want_quant;
    rq->exclude_worker = exclude;
    const sw_req *holder = r->parent ? r->parent : r;   /* a choice goes where its request's key may */
    rq->allowed_pools = holder->key_pools;
    rq->n_allowed_pools = holder->n_key_pools;
    rq->budget_ms = r->max_queue_ms;
    rq->prefix_key = r->prefix_key;
}

static void worker_dead(sw_worker *w, const char *why);

/* Sends the request to the decided worker. Returns false if the worker turned
 * out to be gone (it is then removed; the caller decides again). */
static bool dispatch(sw_req *r, sw_decision *d)
{
    sw_worker *w = d->worker;
    if (send_raw(w, r->gen, r->gen_len) < 0) {
        if (errno == EHOSTUNREACH) {
            worker_dead(w, "unreachable (ROUTER_MANDATORY)");
        } else {
            fprintf(stderr, "gateway: send to worker %s failed: %s\n", w->id, zmq_strerror(errno));
        }
        return false;
    }
    if (r->phase == SW_PH_QUEUED) queue_del(r);
    pthread_mutex_lock(&B.g->reg.mu);
    w->inflight++;
    w->dispatched++;
    if (d->stats) d->stats->inflight++;
    pthread_mutex_unlock(&B.g->reg.mu);
    r->w = w;
    acct_start(r);
    r->stats = d->stats;
    r->probe = d->probe;
    if (d->spilled) sw_metrics_overflow(d->spill_from, d->pool, d->spill_reason);
    sw_access_dispatched(r, d->pool, sw_now_ns());
    int64_t now = sw_now_ms();
    r->dispatch_ms = now;
    sw_policy *p = sw_gw_policy(B.g);
    r->deadline_ms = now + p->defaults.request_timeout_ms;
    r->first_token_deadline_ms = now + p->defaults.first_token_timeout_ms;
    sw_policy_unref(p);
    pthread_mutex_lock(&r->mu);
    r->phase = SW_PH_RUNNING;
    snprintf(r->pool, sizeof r->pool, "%s", d->pool);
    snprintf(r->worker, sizeof r->worker, "%s", w->id);
    r->decided = true;
    r->last_write_ms = now;
    wake(r);
    pthread_mutex_unlock(&r->mu);
    sw_metrics_inflight(r->pool, +1);
    return true;
}

static int queue_limit(const sw_policy *p, const char *pool)
{
    const sw_pool_def *pd = pool ? sw_policy_pool(p, pool) : NULL;
    if (pd && pd->max_queue) return (int)pd->max_queue;
    return (int)p->defaults.queue_length;
}

static int queued_for(const char *pool)
{
    int n = 0;
    for (sw_req *q = B.qhead; q; q = q->qnext)
        if (strcmp(q->queued_pool, pool) == 0) n++;
    return n;
}

/* Decides and acts: dispatch, queue, or reject. `from_queue`: the request is
 * already waiting (a QUEUE decision leaves it where it is). */
static void route(sw_req *r, const char *exclude, bool from_queue)
{
    sw_policy *p = sw_gw_policy(B.g);
    sw_route_request rq;
    fill_route_request(r, &rq, exclude);
    int attempt;
    for (attempt = 0; attempt < 4; attempt++) {
        sw_decision d;
        pthread_mutex_lock(&B.g->reg.mu);
        sw_route_decide(p, &B.g->reg, &B.g->route_stats, &rq, sw_now_ms(), &d);
        pthread_mutex_unlock(&B.g->reg.mu);
        if (d.kind == SW_DECIDE_DISPATCH) {
            if (dispatch(r, &d)) break;
            continue;   /* that worker vanished; decide again without it */
        }
        if (d.kind == SW_DECIDE_REJECT) {
            if (exclude && r->retry_error[0])   /* the retry found no one: the cause is the worker's error */
                fail(r, r->retry_status, "server_error", "worker_error", r->retry_error, SW_ST_ERROR);
            else
                fail(r, d.http_status, d.err_type, d.err_code, d.message, SW_ST_REJECTED);
            break;
        }
        /* QUEUE */
        if (from_queue) break;
        const char *pool = d.pool ? d.pool : "none";
        int limit = queue_limit(p, pool);
        if (queued_for(pool) >= limit) {
            snprintf(r->queued_pool, sizeof r->queued_pool, "%s", pool);
            fail(r, 429, "rate_limit_exceeded", "queue_full",
                 "all routes for this model are at capacity and the wait queue is full",
                 SW_ST_REJECTED);
            break;
        }
        int64_t now = sw_now_ms();
        int64_t wait = p->defaults.queue_timeout_ms;
        if (r->max_queue_ms > 0 && r->max_queue_ms < wait) wait = r->max_queue_ms;
        r->enq_ms = now;
        r->queue_deadline_ms = now + wait;
        snprintf(r->queued_pool, sizeof r->queued_pool, "%s", pool);
        pthread_mutex_lock(&r->mu);
        r->phase = SW_PH_QUEUED;
        pthread_mutex_unlock(&r->mu);
        r->qnext = NULL;
        if (B.qtail) B.qtail->qnext = r; else B.qhead = r;
        B.qtail = r;
        B.qlen++;
        sw_metrics_queue(pool, +1);
        break;
    }
    /* Every send failed (workers vanishing, or their queues full): do not
     * leave the request in limbo. A waiting one stays queued and tries again. */
    if (attempt == 4 && r->phase != SW_PH_QUEUED)
        fail(r, 503, "server_error", "dispatch_failed", "could not hand the request to a worker",
             SW_ST_ERROR);
    sw_policy_unref(p);
}

static void on_submit(sw_req *r);

/* A request of several choices, while held: its choices marked to go. */
static void submit_choices(sw_req *r)
{
    if (table_find(r->id) != r) return;   /* over already */
    for (size_t i = 0; i < r->n_kids; i++) {
        sw_req *k = r->kids[i];
        if (!k->send_wanted || k->sent) continue;
        k->sent = true;
        on_submit(sw_req_ref(k));
    }
}

static void on_submit(sw_req *r)
{
    table_add(r);   /* the posted reference becomes the table's */
    /* route() may finish the request and drop the table's reference while
     * the HTTP side drops its own: hold one until we are done reading. */
    sw_req_ref(r);
    if (r->n_kids) {   /* held here (its client's connection is watched) while its choices run */
        sw_choices_start(r);
        submit_choices(r);
    } else {
        route(r, NULL, false);
    }
    if (r->phase == SW_PH_RUNNING) sw_metrics_latency(SW_LAT_DISPATCH, sw_now_ns() - r->t_submit_ns);
    sw_req_unref(r);
}

/* The client went away (or MHD finished the connection early), or a
 * request of several choices is over (its client still gets its answer). */
static void on_cancel(sw_req *r)
{
    if (!table_find(r->id) || table_find(r->id) != r) return;   /* already finished */
    if (r->phase == SW_PH_RUNNING && r->w) send_cancel(r->w, r->id);
    pthread_mutex_lock(&r->mu);
    if (!r->kids_over) r->client_gone = true;
    /* a request of several choices ends here too, answered or failed */
    sw_status_label st = r->client_gone ? SW_ST_CANCELLED : r->err_status ? SW_ST_ERROR : SW_ST_OK;
    wake(r);
    pthread_mutex_unlock(&r->mu);
    finish(r, st);
}

static void process_queue(void)
{
    B.capacity_changed = false;
    sw_req *q = B.qhead;
    while (q) {
        sw_req *next = q->qnext;
        route(q, NULL, true);
        q = next;
    }
}

/* ---- workers -------------------------------------------------------------- */

/* A worker's death is one error on each route its requests came by, not one
 * per request: the registry drops the worker itself, and its open streams
 * counted one failure each would degrade a route whose other workers are
 * well (the error rate, router.c), spilling all of its traffic. The
 * requests' own outcomes are then not counted. */
static void death_on_routes(const sw_worker *w)
{
    sw_route_stats *seen[16];
    int n = 0;
    for (sw_req *r = B.active; r; r = r->next) {
        if (r->w != w || !r->stats) continue;
        r->outcome_counted = true;
        int i = 0;
        while (i < n && seen[i] != r->stats) i++;
        if (i == n && n < 16) seen[n++] = r->stats;
    }
    for (int i = 0; i < n; i++) sw_route_stats_outcome(seen[i], true, false);
}

/* Removes a worker. Its requests: before the first token, retried once on
 * another worker; after it, ended with an error chunk. */
static void worker_dead(sw_worker *w, const char *why)
{
    fprintf(stderr, "gateway: worker %s (pool %s) is gone: %s\n", w->id, w->pool, why);
    death_on_routes(w);
    int n_mine = 0;
    for (sw_req *r = B.active; r; r = r->next) n_mine += r->w == w;
    sw_req **retry = malloc((n_mine + 1) * sizeof *retry);
    int n_retry = 0;
    char wid[SW_MAX_ID_LEN + 1];
    snprintf(wid, sizeof wid, "%s", w->id);
    for (sw_req *r = B.active, *next; r; r = next) {
        next = r->next;
        if (r->w != w) continue;
        pthread_mutex_lock(&r->mu);
        bool got = r->got_token;
        pthread_mutex_unlock(&r->mu);
        if (!got && r->retries < 1 && retry) {
            detach(r, true);
            r->retries++;
            pthread_mutex_lock(&r->mu);
            r->phase = SW_PH_NEW;
            pthread_mutex_unlock(&r->mu);
            retry[n_retry++] = r;
        } else {
            char msg[256];
            snprintf(msg, sizeof msg, "worker %s failed while serving this request (%s)", wid, why);
            fail(r, 502, "server_error", "worker_failed", msg, SW_ST_ERROR);
        }
    }
    pthread_mutex_lock(&B.g->reg.mu);
    sw_registry_remove(&B.g->reg, w);
    B.g->reg.deaths++;
    pthread_mutex_unlock(&B.g->reg.mu);
    B.capacity_changed = true;
    for (int i = 0; i < n_retry; i++) {
        fprintf(stderr, "gateway: retrying %s on another worker\n", retry[i]->id);
        route(retry[i], wid, false);
    }
    free(retry);
}

/* ---- authentication (CURVE) and registration ---------------------------------
 * With --curve-secret the worker ROUTER (and, with --client-keys, the SDK
 * ROUTER) is a CURVE server whose ZAP handler (zap.c) admits listed keys and
 * sets each connection's User-Id to its key. drain() reads it into
 * AUTHN.key for the message being handled. */
static struct {
    bool workers_curve, sdk_curve;    /* which ROUTERs authenticate */
    char key[SW_CURVE_Z85_LEN + 1];   /* the current message's key; "" on plaintext */
    unsigned zap_gen;                 /* sw_zap_generation at the last revocation sweep */
} AUTHN;

/* Tells the peer why its Register was refused (an Error without a request
 * id, code 403, which the worker logs), logs and counts it. */
static void refuse_register(const uint8_t *id, size_t idlen, const char *wid, const char *why, const char *reason)
{
    char msg[512];
    snprintf(msg, sizeof msg, "registration refused: %s", why);
    Spillway__Error e = SPILLWAY__ERROR__INIT;
    e.request_id = "";
    e.code = 403;
    e.message = msg;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_ERROR;
    env.error = &e;
    sw_wire_send(B.router, id, idlen, &env, ZMQ_DONTWAIT);
    LOG_LIMITED(LOG_REFUSED, "gateway: refused to register worker '%.128s': %s\n", wid, why);
    sw_metrics_registration_refused(reason);
}

/* Whether w's connection is still open: ROUTER_MANDATORY fails a send to a
 * peer whose connection closed (a killed worker) with EHOSTUNREACH. The probe
 * is a heartbeat, which a live worker takes as one. */
static bool connection_open(sw_worker *w)
{
    Spillway__Heartbeat h = SPILLWAY__HEARTBEAT__INIT;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &h;
    return !(send_env(w, &env) < 0 && errno == EHOSTUNREACH);
}

/* A Register for the id of `old`, a worker on another connection. The id is
 * bound to old's connection and key, so the newcomer gets it only when that
 * worker is gone: its key is the newcomer's (the holder of the secret key
 * reconnected, e.g. after its link died), its connection closed, or it has
 * been silent for two heartbeat intervals (a live worker is never silent
 * for one; a worker that gave up on us after SW_HEARTBEAT_LIVENESS silent
 * intervals reconnects while we may still count it alive). Then old is
 * removed; else why is filled. */
static bool may_take_id(sw_worker *old, int64_t now, char *why, size_t whylen)
{
    const char *gone = NULL;
    if (AUTHN.workers_curve && old->key[0] && !strcmp(old->key, AUTHN.key)) gone = "reconnected (same key)";
    else if (!connection_open(old)) gone = "its connection closed";
    else if (now - old->last_seen_ms >= 2 * SW_HEARTBEAT_MS) gone = "silent, and its id registered again";
    if (gone) {
        worker_dead(old, gone);
        return true;
    }
    snprintf(why, whylen, "worker id '%.128s' belongs to a live worker on another connection%s", old->id,
             AUTHN.workers_curve ? " and key" : "");
    return false;
}

/* Drops live workers whose key an allowlist reload removed, or whose pool
 * it no longer allows (broker thread, at the first message after a reload). */
static void drop_revoked(void)
{
    unsigned gen = sw_zap_generation();
    if (!AUTHN.workers_curve || gen == AUTHN.zap_gen) return;
    AUTHN.zap_gen = gen;
    for (bool again = true; again;) {
        again = false;
        for (sw_worker *w = B.g->reg.head; w; w = w->next) {
            char why[300];
            if (sw_zap_worker_may_serve(w->key, w->pool, why, sizeof why, NULL, 0)) continue;
            sw_metrics_auth_refused(false, "revoked");
            worker_dead(w, why);   /* frees w: walk again */
            again = true;
            break;
        }
    }
}

/* A worker claimed more slots than any worker may have (sw_worker_set_slots
 * clamped it): logged and counted. */
static void slots_clamped(const sw_worker *w, uint32_t claimed)
{
    sw_metrics_worker_violation("too_many_slots");
    LOG_LIMITED(LOG_SLOTS, "gateway: worker %s claims %u slots; counted as %u (SW_MAX_WORKER_SLOTS)\n", w->id,
                claimed, w->slots);
}

static void on_register(const uint8_t *id, size_t idlen, const Spillway__Register *reg)
{
    int64_t now = sw_now_ms();
    const char *wid = reg->worker_id ? reg->worker_id : "";
    char why[400], name[SW_CURVE_NAME_LEN] = "";
    if (AUTHN.workers_curve && !sw_zap_worker_may_serve(AUTHN.key, reg->pool, why, sizeof why, name, sizeof name)) {
        refuse_register(id, idlen, wid, why, strstr(why, "no longer") ? "key_revoked" : "pool_not_allowed");
        return;
    }
    /* The same id from another connection is refused, never an eviction,
     * unless its holder is gone (may_take_id). */
    sw_worker *old = sw_registry_find_id(&B.g->reg, wid);
    if (old && (old->ident_len != idlen || memcmp(old->ident, id, idlen) != 0) &&
        !may_take_id(old, now, why, sizeof why)) {
        refuse_register(id, idlen, wid, why, "id_in_use");
        return;
    }
    pthread_mutex_lock(&B.g->reg.mu);
    sw_worker *w = sw_registry_upsert(&B.g->reg, id, idlen, reg, now);
    if (w) {
        snprintf(w->key, sizeof w->key, "%s", AUTHN.key);
        snprintf(w->key_name, sizeof w->key_name, "%s", name);
    }
    pthread_mutex_unlock(&B.g->reg.mu);
    if (!w) {
        fprintf(stderr, "gateway: cannot register worker (identity too long)\n");
        return;
    }
    fprintf(stderr, "gateway: worker %s registered: pool %s, %zu model(s), %u slots%s%s\n",
            w->id, w->pool, w->n_models, w->slots, w->key[0] ? ", key " : "", w->key_name);
    if (reg->slots && w->slots != reg->slots) slots_clamped(w, reg->slots);
    B.capacity_changed = true;
}

/* A final chunk's usage into r, for the metrics and the response. */
static void take_usage(sw_req *r, const Spillway__TokenChunk *c)
{
    if (!c->usage) return;
    pthread_mutex_lock(&r->mu);
    r->usage_prompt = c->usage->prompt_tokens;
    r->usage_completion = c->usage->completion_tokens;
    r->usage_cached = c->usage->cached_tokens;
    r->usage_reasoning = c->usage->reasoning_tokens;
    r->usage_worker_s = sw_access_worker_seconds(c->usage->worker_seconds);
    pthread_mutex_unlock(&r->mu);
}

/* Tells worker w it is dropped, and drops it (worker_dead): a worker that
 * breaks the protocol is no longer trusted with requests. */
static void disconnect_worker(sw_worker *w, const char *why)
{
    Spillway__Disconnect d = SPILLWAY__DISCONNECT__INIT;
    d.reason = (char *)why;
    sw_env out = SPILLWAY__ENVELOPE__INIT;
    out.body_case = SPILLWAY__ENVELOPE__BODY_DISCONNECT;
    out.disconnect = &d;
    send_env(w, &out);
    worker_dead(w, why);
}

/* A chunk or error from w for request `id`, which w does not hold. Normal
 * if the request left w lately (finished, cancelled, retried elsewhere: the
 * worker had not heard yet); else a strike, and at WORKER_STRIKES the
 * worker is dropped. Returns true if it was (w is then freed). */
static bool stray_frame(sw_worker *w, const char *id)
{
    if (sw_worker_recently_left(w, id)) return false;
    sw_metrics_worker_violation("unknown_request");
    LOG_LIMITED(LOG_UNKNOWN, "gateway: worker %s sent a frame for request '%.64s', which it was never given\n",
                w->id, id);
    if (++w->strikes < WORKER_STRIKES) return false;
    disconnect_worker(w, "sent frames for requests it was never given");
    return true;
}

/* r's worker sent more than r may receive (acct_take's `why`): the client
 * gets an error instead of the excess, the worker a Cancel. Counted. */
static void cut_off(sw_worker *w, sw_req *r, const char *why)
{
    char msg[256];
    bool tokens = !strcmp(why, "over_max_tokens");
    snprintf(msg, sizeof msg, "worker %s sent more than this request allows (%s); the response was cut off",
             w->id, tokens ? "max_tokens" : "the size bound on a response");
    sw_metrics_worker_violation(why);
    LOG_LIMITED(LOG_CUT, "gateway: %s: %s\n", r->id, msg);
    send_cancel(w, r->id);
    fail(r, 502, "server_error", "worker_exceeded_limits", msg, SW_ST_ERROR);
}

static void on_chunk(sw_worker *w, const Spillway__TokenChunk *c, size_t len)
{
    int64_t t0 = sw_now_ns();
    sw_req *r = table_find(c->request_id);
    if (!r || r->w != w) {   /* finished, cancelled, moved to another worker, or never its */
        stray_frame(w, c->request_id);
        return;
    }
    const char *over = acct_take(r, c, len);
    if (over) {
        cut_off(w, r, over);
        return;
    }
    bool final = c->finish_reason != SPILLWAY__FINISH_REASON__FINISH_NONE;
    sw_access_chunk(r, c, t0);
    if (!r->sink->chunk(r, c, t0) && !final) {
        send_cancel(w, r->id);
        finish(r, SW_ST_CANCELLED);
        return;
    }
    if (final) {   /* let go and count it before the client can see the end (as fail does) */
        take_usage(r, c);
        sw_req_ref(r);   /* finish drops the table's reference */
        finish(r, c->finish_reason == SPILLWAY__FINISH_REASON__FINISH_ERROR ? SW_ST_ERROR
                  : c->finish_reason == SPILLWAY__FINISH_REASON__FINISH_CANCELLED ? SW_ST_CANCELLED
                  : SW_ST_OK);
    }
    pthread_mutex_lock(&r->mu);
    r->got_token = true;
    if (final) {
        r->finished = true;
        r->finish = c->finish_reason;
        if (c->finish_reason == SPILLWAY__FINISH_REASON__FINISH_ERROR && !r->err_msg[0])
            snprintf(r->err_msg, sizeof r->err_msg, "the worker reported an error");
        if (!r->text_rx_ns) r->text_rx_ns = t0;
    }
    if (r->stream || final) wake(r);
    pthread_mutex_unlock(&r->mu);
    if (final) sw_req_unref(r);
}

/* An embeddings request's one answer: vectors for its inputs, or (of the
 * wrong shape, or for a generation request) a broken worker's. */
static void on_embed_reply(sw_worker *w, const Spillway__EmbedReply *e)
{
    sw_req *r = table_find(e->request_id);
    if (!r || r->w != w) {
        stray_frame(w, e->request_id);
        return;
    }
    if (!r->embed || e->n_input_tokens != r->embed_n) {
        cut_off(w, r, "oversize");
        return;
    }
    uint64_t tokens = 0;
    for (size_t i = 0; i < e->n_input_tokens; i++) tokens += e->input_tokens[i];
    r->sink->embedded(r, e);
    pthread_mutex_lock(&r->mu);
    r->usage_prompt = tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)tokens;
    pthread_mutex_unlock(&r->mu);
    sw_req_ref(r);   /* finish drops the table's reference; count it before the client sees it */
    finish(r, SW_ST_OK);
    pthread_mutex_lock(&r->mu);
    r->got_token = r->finished = true;
    r->finish = SPILLWAY__FINISH_REASON__FINISH_STOP;
    wake(r);
    pthread_mutex_unlock(&r->mu);
    sw_req_unref(r);
}

/* A worker refused r before starting it: full with other gateways' work
 * (our heartbeat view of it lagged) or draining. That is no fault of either:
 * count w full until its next heartbeat says otherwise, and decide again,
 * so r goes to another worker or waits in our queue. MAX_REFUSALS bounds a
 * request bounced between gateways' stale views. */
#define MAX_REFUSALS 8
static void refused(sw_worker *w, sw_req *r)
{
    pthread_mutex_lock(&B.g->reg.mu);
    uint32_t full = w->slots + SW_WORKER_QUEUE_MAX;
    if (w->hb_active + w->hb_queued < full) w->hb_queued = full - (w->hb_active < full ? w->hb_active : full);
    pthread_mutex_unlock(&B.g->reg.mu);
    r->refusals++;
    detach(r, false);
    pthread_mutex_lock(&r->mu);
    r->phase = SW_PH_NEW;
    pthread_mutex_unlock(&r->mu);
    route(r, NULL, false);
}

static void on_error(sw_worker *w, const Spillway__Error *e)
{
    if (!e->request_id || !*e->request_id) {
        fprintf(stderr, "gateway: worker %s reports: %u %s\n", w->id, e->code, e->message ? e->message : "");
        return;
    }
    sw_req *r = table_find(e->request_id);
    if (!r || r->w != w) {
        stray_frame(w, e->request_id);
        return;
    }
    pthread_mutex_lock(&r->mu);
    bool got = r->got_token;
    pthread_mutex_unlock(&r->mu);
    const char *msg = e->message && *e->message ? e->message : "the worker rejected the request";
    if (!got && e->code == SW_REFUSED_CODE && r->refusals < MAX_REFUSALS) {
        refused(w, r);
        return;
    }
    if (!got && e->code >= 500 && r->retries < 1) {
        /* A busy or broken worker: one more try elsewhere. */
        char wid[SW_MAX_ID_LEN + 1];
        snprintf(wid, sizeof wid, "%s", w->id);
        detach(r, true);
        r->retries++;
        r->retry_status = e->code < 600 ? (int)e->code : 500;
        snprintf(r->retry_error, sizeof r->retry_error, "%s", msg);
        pthread_mutex_lock(&r->mu);
        r->phase = SW_PH_NEW;
        pthread_mutex_unlock(&r->mu);
        route(r, wid, false);
        return;
    }
    int status = e->code >= 400 && e->code < 600 ? (int)e->code : 500;
    fail(r, status, status < 500 ? "invalid_request_error" : "server_error", "worker_error", msg,
         status < 500 ? SW_ST_REJECTED : SW_ST_ERROR);
}

/* Liveness: HTTP threads read last_seen_ms (healthz, models), hence the lock. */
static void touch(sw_worker *w, int64_t now)
{
    pthread_mutex_lock(&B.g->reg.mu);
    w->last_seen_ms = now;
    pthread_mutex_unlock(&B.g->reg.mu);
}

/* A frame's envelope, validated; NULL (and a log line naming `from`) if not. */
static sw_env *decode_or_drop(const void *buf, size_t len, const char *from)
{
    char err[256];
    sw_env *env = sw_wire_decode(buf, len, err, sizeof err);
    if (!env) LOG_LIMITED(LOG_INVALID, "gateway: dropped an invalid frame (%zu bytes) from %s: %s\n", len, from, err);
    return env;
}

/* Garbage (an invalid frame, a wrong frame count) on the worker socket: a
 * registered worker sending it is not speaking our protocol (or is broken),
 * so it gets no more requests. */
static void drop_peer(const uint8_t *id, size_t idlen, const char *why)
{
    sw_metrics_worker_violation("invalid_frame");
    sw_worker *bad = sw_registry_find(&B.g->reg, id, idlen);
    if (bad) disconnect_worker(bad, why);
}

static void on_message(const uint8_t *id, size_t idlen, const void *buf, size_t len)
{
    sw_env *env = decode_or_drop(buf, len, "a peer");
    if (!env) {
        drop_peer(id, idlen, "sent an invalid frame");
        return;
    }
    int64_t now = sw_now_ms();
    if (env->body_case == SPILLWAY__ENVELOPE__BODY_REGISTER) {
        on_register(id, idlen, env->register_);
        sw_wire_free(env);
        return;
    }
    sw_worker *w = sw_registry_find(&B.g->reg, id, idlen);
    if (!w) {
        /* Not registered (we restarted, or dropped it as dead): as in
         * Majordomo, tell it to register again, so it is back within one
         * heartbeat instead of after its liveness runs out. Only heartbeats
         * are answered: they come about once a second, chunks in floods. */
        if (env->body_case == SPILLWAY__ENVELOPE__BODY_HEARTBEAT) {
            Spillway__Disconnect d = SPILLWAY__DISCONNECT__INIT;
            d.reason = "unknown worker: register again";
            sw_env out = SPILLWAY__ENVELOPE__INIT;
            out.body_case = SPILLWAY__ENVELOPE__BODY_DISCONNECT;
            out.disconnect = &d;
            sw_wire_send(B.router, id, idlen, &out, ZMQ_DONTWAIT);
        }
        sw_wire_free(env);
        return;
    }
    switch (env->body_case) {
    case SPILLWAY__ENVELOPE__BODY_HEARTBEAT: {
        const Spillway__Heartbeat *h = env->heartbeat;
        pthread_mutex_lock(&B.g->reg.mu);
        /* Room freed by another gateway's requests, or a drain begun: our
         * queue may move, or must stop sending there. */
        if (h->active + h->queued < w->hb_active + w->hb_queued || h->draining != w->self_draining)
            B.capacity_changed = true;
        bool clamped = !sw_worker_heartbeat(w, h, now);
        pthread_mutex_unlock(&B.g->reg.mu);
        if (clamped) slots_clamped(w, h->slots);
        break;
    }
    case SPILLWAY__ENVELOPE__BODY_CHUNK:
        touch(w, now);
        on_chunk(w, env->chunk, len);
        break;
    case SPILLWAY__ENVELOPE__BODY_ERROR:
        touch(w, now);
        on_error(w, env->error);
        break;
    case SPILLWAY__ENVELOPE__BODY_EMBED_REPLY:
        touch(w, now);
        on_embed_reply(w, env->embed_reply);
        break;
    case SPILLWAY__ENVELOPE__BODY_DISCONNECT:
        worker_dead(w, env->disconnect->reason && *env->disconnect->reason ? env->disconnect->reason
                                                                            : "disconnected");
        break;
    default:   /* a Generate, Cancel or status message: no worker sends those */
        sw_metrics_worker_violation("invalid_frame");
        LOG_LIMITED(LOG_UNEXPECTED, "gateway: unexpected %s message from worker %s\n", sw_wire_kind(env), w->id);
        disconnect_worker(w, "sent a message no worker sends");
    }
    sw_wire_free(env);
}

/* ---- SDK clients ------------------------------------------------------------ */
static void on_sdk_generate(const uint8_t *ident, size_t idlen, Spillway__GenerateRequest *g)
{
    static uint64_t counter;
    sw_policy *p = sw_gw_policy(B.g);
    if (!sw_front_model_exists(&B.g->reg, p, sw_policy_resolve(p, g->model))) {
        char msg[300];
        snprintf(msg, sizeof msg, "The model '%.200s' does not exist", g->model);
        sdk_send_error(ident, idlen, g->request_id, 404, msg);
        sw_metrics_request(NULL, SW_ST_REJECTED);
        sw_policy_unref(p);
        return;
    }
    sw_req *r = sw_req_new();
    r->sdk = true;
    r->sink = &sdk_sink;
    memcpy(r->sdk_ident, ident, idlen);
    r->sdk_ident_len = idlen;
    snprintf(r->client_id, sizeof r->client_id, "%s", g->request_id);
    /* Our own id towards the worker: client ids are only unique per client. */
    snprintf(r->id, sizeof r->id, "sdk-%llx-%llx", (unsigned long long)(sw_now_ns() & 0xffffffffffull),
             (unsigned long long)++counter);
    r->chat = g->n_messages > 0;
    r->created_s = time(NULL);
    /* n samples of a batch of prompts, made as over HTTP (choices.h) */
    sw_prompt *prompts = sw_choices_wire_prompts(g);
    int rc = g->n_prompts && !prompts ? -1 : sw_choices_prepare(r, p, g, prompts, g->n_prompts, g->n);
    free(prompts);
    r->policy = p;
    r->t_submit_ns = sw_now_ns();
    if (rc != 0) {
        sdk_send_error(ident, idlen, r->client_id, 500, "could not encode the request");
        sw_req_unref(r);
        return;
    }
    char msg[300];
    const char *param;
    if ((rc = sw_front_check_kind(&B.g->reg, r, msg, sizeof msg, &param))) {   /* as over HTTP: not an embedding model */
        sdk_send_error(ident, idlen, r->client_id, (uint32_t)rc, msg);
        sw_metrics_request(NULL, SW_ST_REJECTED);
        sw_req_unref(r);
        return;
    }
    on_submit(r);
}

/* An SDK client's embeddings request: as over HTTP, but answered with the
 * worker's EmbedReply itself (or an Error). */
static void on_sdk_embed(const uint8_t *ident, size_t idlen, Spillway__EmbedRequest *e)
{
    static uint64_t counter;
    char msg[300];
    const char *param;
    sw_policy *p = sw_gw_policy(B.g);
    sw_req *r = sw_req_new();
    r->sdk = true;
    r->sink = &sdk_sink;
    memcpy(r->sdk_ident, ident, idlen);
    r->sdk_ident_len = idlen;
    snprintf(r->client_id, sizeof r->client_id, "%s", e->request_id);
    snprintf(r->id, sizeof r->id, "sdke-%llx-%llx", (unsigned long long)(sw_now_ns() & 0xffffffffffull),
             (unsigned long long)++counter);
    r->created_s = time(NULL);
    r->policy = p;
    r->t_submit_ns = sw_now_ns();
    int rc = sw_front_prepare_embed(r, p, e) ? 500 : 0;
    snprintf(msg, sizeof msg, "could not encode the request");
    if (!rc && !sw_front_model_exists(&B.g->reg, p, r->model)) {
        snprintf(msg, sizeof msg, "The model '%.200s' does not exist", e->model);
        rc = 404;
    }
    if (!rc) rc = sw_front_check_kind(&B.g->reg, r, msg, sizeof msg, &param);
    if (rc) {
        sdk_send_error(ident, idlen, r->client_id, (uint32_t)rc, msg);
        sw_metrics_request(NULL, SW_ST_REJECTED);
        sw_req_unref(r);
        return;
    }
    on_submit(r);
}

/* The status document, the admin API's: for the admin token only, refused
 * as HTTP refuses it (403 with no token configured, 401 for a wrong one). */
static void on_sdk_status(const uint8_t *ident, size_t idlen, const Spillway__StatusRequest *q)
{
    if (!B.g->admin_token) {
        sdk_send_error(ident, idlen, q->request_id, 403, "the admin API is disabled: start the gateway with "
                       "--admin-token-file FILE (see docs/security.md, \"Admin token\")");
        return;
    }
    if (!sw_gw_admin_token_ok(B.g, q->admin_token)) {
        sdk_send_error(ident, idlen, q->request_id, 401, q->admin_token[0] ? "wrong admin token"
                       : "the status needs the admin token (the CLI's --admin-token-file)");
        return;
    }
    char *json = sw_gw_status_json(B.g);
    Spillway__StatusReply sr = SPILLWAY__STATUS_REPLY__INIT;
    sr.request_id = q->request_id;
    sr.json = json ? json : (char *)"{}";
    sw_env out = SPILLWAY__ENVELOPE__INIT;
    out.body_case = SPILLWAY__ENVELOPE__BODY_STATUS_REPLY;
    out.status_reply = &sr;
    sw_wire_send(B.sdk, ident, idlen, &out, ZMQ_DONTWAIT);
    free(json);
}

/* An SDK client's frame, decoded; NULL when invalid. A request that fails
 * the wire's checks but names itself is answered with why (a 400), so the
 * client is not left waiting for its timeout. */
static sw_env *sdk_decode(const uint8_t *ident, size_t idlen, const void *buf, size_t len)
{
    char err[256], rid[SW_MAX_ID_LEN + 1];
    sw_env *env = sw_wire_decode_request(buf, len, err, sizeof err, rid, sizeof rid);
    if (env) return env;
    LOG_LIMITED(LOG_INVALID, "gateway: dropped an invalid frame (%zu bytes) from an SDK client: %s\n", len, err);
    if (rid[0]) sdk_send_error(ident, idlen, rid, 400, err);
    return NULL;
}

static void on_sdk_message(const uint8_t *ident, size_t idlen, const void *buf, size_t len)
{
    if (idlen > sizeof(((sw_req *)0)->sdk_ident)) return;
    sw_env *env = sdk_decode(ident, idlen, buf, len);
    if (!env) return;
    if (AUTHN.sdk_curve && !sw_zap_client_allowed(AUTHN.key)) {
        /* Admitted at connect, removed from --client-keys since: refuse its requests. */
        const char *rid = sw_wire_client_request_id(env);
        if (rid) sdk_send_error(ident, idlen, rid, 403, "this client's CURVE key is no longer in --client-keys");
        sw_metrics_auth_refused(true, "revoked");
        sw_wire_free(env);
        return;
    }
    switch (env->body_case) {
    case SPILLWAY__ENVELOPE__BODY_GENERATE: on_sdk_generate(ident, idlen, env->generate); break;
    case SPILLWAY__ENVELOPE__BODY_EMBED: on_sdk_embed(ident, idlen, env->embed); break;
    case SPILLWAY__ENVELOPE__BODY_CANCEL:
        for (sw_req *r = B.active; r; r = r->next)
            if (r->sdk && !r->parent && r->sdk_ident_len == idlen && !memcmp(r->sdk_ident, ident, idlen) &&
                !strcmp(r->client_id, env->cancel->request_id)) {
                r->sdk_gone = true;   /* it asked to stop: send it nothing more */
                on_cancel(r);
                break;
            }
        break;
    case SPILLWAY__ENVELOPE__BODY_STATUS_REQUEST: on_sdk_status(ident, idlen, env->status_request); break;
    default:
        LOG_LIMITED(LOG_UNEXPECTED, "gateway: unexpected %s message from an SDK client\n", sw_wire_kind(env));
    }
    sw_wire_free(env);
}

/* The CURVE key (Z85) the ZAP handler bound to the connection a message
 * came on, into AUTHN.key for its handler; "" on a plaintext socket. A
 * reload of the allowlists is acted on here, first. */
static void message_key(void *sock, zmq_msg_t *body)
{
    AUTHN.key[0] = 0;
    bool curve = sock == B.router ? AUTHN.workers_curve : AUTHN.sdk_curve;
    if (!curve) return;
    if (sock == B.router) drop_revoked();
    const char *uid = zmq_msg_gets(body, "User-Id");
    if (uid && strlen(uid) == SW_CURVE_Z85_LEN) memcpy(AUTHN.key, uid, SW_CURVE_Z85_LEN + 1);
}

/* Receives [identity][one frame] messages from a ROUTER. Any other shape
 * is logged and, when bad is given (the worker socket), handed to it with
 * the sender's identity. */
static void drain(void *sock, void (*handle)(const uint8_t *, size_t, const void *, size_t),
                  void (*bad)(const uint8_t *, size_t, const char *))
{
    for (int i = 0; i < MAX_MSGS_PER_ROUND; i++) {
        zmq_msg_t idm, body;
        zmq_msg_init(&idm);
        if (zmq_msg_recv(&idm, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&idm);
            return;
        }
        int more = zmq_msg_more(&idm);
        zmq_msg_init(&body);
        bool have_body = false;
        int extra = 0;
        while (more) {
            zmq_msg_t part;
            zmq_msg_init(&part);
            if (zmq_msg_recv(&part, sock, 0) < 0) { zmq_msg_close(&part); break; }
            more = zmq_msg_more(&part);
            if (!have_body) { zmq_msg_move(&body, &part); have_body = true; }
            else extra++;
            zmq_msg_close(&part);
        }
        if (!have_body || extra) {
            LOG_LIMITED(LOG_FRAMING, "gateway: dropped a message with %d frames (want exactly 1 after the identity)\n",
                        have_body ? 1 + extra : 0);
            if (bad) bad(zmq_msg_data(&idm), zmq_msg_size(&idm), "sent a message with the wrong frame count");
        } else {
            message_key(sock, &body);
            handle(zmq_msg_data(&idm), zmq_msg_size(&idm), zmq_msg_data(&body), zmq_msg_size(&body));
        }
        zmq_msg_close(&body);
        zmq_msg_close(&idm);
    }
}

static bool inbox_pending(void)
{
    pthread_mutex_lock(&B.g->inbox_mu);
    bool any = B.g->inbox_head != NULL;
    pthread_mutex_unlock(&B.g->inbox_mu);
    return any;
}

static void drain_inbox(void)
{
    uint64_t v;
    if (read(B.g->inbox_fd, &v, sizeof v) < 0 && errno != EAGAIN) perror("gateway: eventfd read");
    pthread_mutex_lock(&B.g->inbox_mu);
    sw_cmd *c = B.g->inbox_head;
    B.g->inbox_head = B.g->inbox_tail = NULL;
    pthread_mutex_unlock(&B.g->inbox_mu);
    while (c) {
        sw_cmd *next = c->next;
        if (c->kind == SW_CMD_SUBMIT) on_submit(c->req);
        else if (c->kind == SW_CMD_OPS) B.capacity_changed = true;   /* the queue may move now */
        else if (c->kind == SW_CMD_CHOICES) { submit_choices(c->req); sw_req_unref(c->req); }
        else { on_cancel(c->req); sw_req_unref(c->req); }
        free(c);
        c = next;
    }
}

/* ---- housekeeping --------------------------------------------------------- */
static void heartbeat_workers(int64_t now)
{
    sw_worker *dead[256];
    int n_dead = 0;
    for (sw_worker *w = B.g->reg.head; w; w = w->next) {
        if (now - w->last_seen_ms >= (int64_t)SW_HEARTBEAT_MS * SW_HEARTBEAT_LIVENESS) {
            if (n_dead < 256) dead[n_dead++] = w;
            continue;
        }
        if (now - w->last_sent_ms >= SW_HEARTBEAT_MS) {
            Spillway__Heartbeat h = SPILLWAY__HEARTBEAT__INIT;
            sw_env env = SPILLWAY__ENVELOPE__INIT;
            env.body_case = SPILLWAY__ENVELOPE__BODY_HEARTBEAT;
            env.heartbeat = &h;
            if (send_env(w, &env) < 0 && errno == EHOSTUNREACH && n_dead < 256) dead[n_dead++] = w;
        }
    }
    for (int i = 0; i < n_dead; i++) worker_dead(dead[i], "missed heartbeats");
}

/* The gateway side's one check of a request's deadlines: its wait in the
 * queue, its first token, its whole run. Fails an expired request (and
 * cancels it on its worker) and returns true. The worker checks the
 * GenerateRequest's own deadline on its side. */
static bool expire(sw_req *r, int64_t now)
{
    if (r->phase == SW_PH_QUEUED && now >= r->queue_deadline_ms) {
        fail(r, 503, "server_error", "queue_timeout", "timed out waiting for capacity", SW_ST_REJECTED);
        return true;
    }
    if (r->phase != SW_PH_RUNNING) return false;
    pthread_mutex_lock(&r->mu);
    bool got = r->got_token;
    pthread_mutex_unlock(&r->mu);
    if (now < r->deadline_ms && (got || now < r->first_token_deadline_ms)) return false;
    if (r->w) send_cancel(r->w, r->id);
    fail(r, 504, "server_error", "timeout", got ? "request timed out" : "timed out waiting for the first token",
         SW_ST_ERROR);
    return true;
}

static void check_requests(int64_t now)
{
    /* Grown as needed and kept: every suspended connection is polled. */
    static struct pollfd *pfd;
    static sw_req **who;
    static int cap;
    int n = 0;
    for (sw_req *r = B.active, *next; r; r = next) {
        next = r->next;
        if (expire(r, now)) continue;
        if (n == cap) {
            int ncap = cap ? cap * 2 : 256;
            struct pollfd *np = realloc(pfd, ncap * sizeof *pfd);
            if (np) pfd = np;
            sw_req **nw = realloc(who, ncap * sizeof *who);
            if (nw) who = nw;
            if (!np || !nw) break;
            cap = ncap;
        }
        pthread_mutex_lock(&r->mu);
        if (r->suspended && r->fd >= 0) {
            /* Suspended connections stay open until we resume them, so the
             * fd is valid for this poll. */
            pfd[n].fd = r->fd;
            pfd[n].events = POLLRDHUP;
            pfd[n].revents = 0;
            who[n++] = r;
            if (r->stream && r->headers_sent && now - r->last_write_ms >= SW_KEEPALIVE_MS) {
                r->keepalive_due = true;
                wake(r);
                n--;   /* resumed: not ours to poll any more */
            }
        }
        pthread_mutex_unlock(&r->mu);
    }
    if (n == 0 || poll(pfd, n, 0) <= 0) return;
    for (int i = 0; i < n; i++)
        if (pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
            sw_req *r = who[i];
            fprintf(stderr, "gateway: client of %s disconnected\n", r->id);
            on_cancel(r);
        }
}

static void maybe_reload(int64_t now)
{
    bool want = false;
    if (__atomic_exchange_n(&B.g->reload_requested, 0, __ATOMIC_ACQ_REL)) {
        want = true;
    } else if (now - B.last_reload_check_ms >= RELOAD_CHECK_MS) {
        B.last_reload_check_ms = now;
        struct stat st;
        if (stat(B.g->config_path, &st) == 0) {
            int64_t m = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
            /* atomic: /admin/reload sets it from an HTTP thread */
            if (m != __atomic_load_n(&B.g->policy_mtime_ns, __ATOMIC_ACQUIRE)) want = true;
        }
    }
    if (!want) return;
    char err[4096];
    if (sw_gw_reload(B.g, err, sizeof err) != 0)
        fprintf(stderr, "gateway: policy reload failed, keeping the running policy:\n%s\n", err);
    B.capacity_changed = true;
}

static void *broker_main(void *arg)
{
    (void)arg;
    zmq_pollitem_t items[3] = {
        {B.router, 0, ZMQ_POLLIN, 0},
        {NULL, B.g->inbox_fd, ZMQ_POLLIN, 0},
        {B.sdk, 0, ZMQ_POLLIN, 0},
    };
    int n_items = B.sdk ? 3 : 2;
    while (!__atomic_load_n(&B.g->stop, __ATOMIC_ACQUIRE)) {
        int64_t now = sw_now_ms();
        long timeout = SW_TICK_MS - (now - B.last_tick_ms);
        if (timeout < 0) timeout = 0;
        int rc = zmq_poll(items, n_items, timeout);
        if (rc < 0 && errno != EINTR) {
            fprintf(stderr, "gateway: zmq_poll: %s\n", zmq_strerror(errno));
            break;
        }
        if (items[1].revents & ZMQ_POLLIN) drain_inbox();
        if (items[0].revents & ZMQ_POLLIN) drain(B.router, on_message, drop_peer);
        if (n_items > 2 && (items[2].revents & ZMQ_POLLIN)) drain(B.sdk, on_sdk_message, NULL);
        now = sw_now_ms();
        if (now - B.last_tick_ms >= SW_TICK_MS) {
            B.last_tick_ms = now;
            heartbeat_workers(now);
            check_requests(now);
            maybe_reload(now);
        }
        if (B.capacity_changed && B.qhead) process_queue();
    }
    /* Shutting down: answer everything still waiting so no connection stays
     * suspended (MHD must not be stopped with suspended connections). */
    do {   /* what the failures post (choices.h) is drained too */
        drain_inbox();
        while (B.active)
            fail(B.active, 503, "server_error", "shutting_down", "the gateway is shutting down", SW_ST_ERROR);
    } while (inbox_pending());
    return NULL;
}

/* ---- public --------------------------------------------------------------- */
void sw_broker_post(sw_gateway *g, sw_cmd_kind kind, sw_req *req)
{
    sw_cmd *c = malloc(sizeof *c);
    if (!c) abort();
    c->kind = kind;
    c->req = req ? sw_req_ref(req) : NULL;
    c->next = NULL;
    pthread_mutex_lock(&g->inbox_mu);
    if (g->inbox_tail) g->inbox_tail->next = c; else g->inbox_head = c;
    g->inbox_tail = c;
    pthread_mutex_unlock(&g->inbox_mu);
    uint64_t one = 1;
    if (write(g->inbox_fd, &one, sizeof one) < 0) perror("gateway: eventfd write");
}

void sw_broker_post_here(sw_cmd_kind kind, sw_req *req)
{
    sw_broker_post(B.g, kind, req);
}

/* With --curve-secret: the gateway's keypair into kp, and the ZAP handler
 * started before any socket binds (unbound, libzmq would admit every key).
 * The worker ROUTER then authenticates, and the SDK one too with
 * --client-keys (without, the SDK link stays plaintext: spillway-gateway.c
 * allows that on loopback only). */
static int setup_curve(sw_gateway *g, sw_curve_keypair *kp, char *err, size_t errlen)
{
    memset(&AUTHN, 0, sizeof AUTHN);
    memset(kp, 0, sizeof *kp);
    if (!g->curve_secret_file) return 0;
    char e[1024];
    if (sw_curve_load_keypair(g->curve_secret_file, kp, e, sizeof e) != 0) {
        snprintf(err, errlen, "--curve-secret: %s", e);
        return -1;
    }
    if (sw_zap_start(g->zctx, g->worker_keys_file, g->client_keys_file, e, sizeof e) != 0) {
        snprintf(err, errlen, "%s", e);
        explicit_bzero(kp, sizeof *kp);
        return -1;
    }
    AUTHN.workers_curve = true;
    AUTHN.sdk_curve = g->client_keys_file != NULL;
    AUTHN.zap_gen = sw_zap_generation();
    return 0;
}

/* Makes sock a CURVE server whose handshakes the ZAP handler decides in domain. */
static int curve_server(void *sock, const sw_curve_keypair *kp, const char *domain, char *err, size_t errlen)
{
    int one = 1;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, kp->public_z85, SW_CURVE_Z85_LEN) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, kp->secret_z85, SW_CURVE_Z85_LEN) != 0 ||
        zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) != 0) {
        snprintf(err, errlen, "cannot make the %s socket a CURVE server: %s", domain, zmq_strerror(errno));
        return -1;
    }
    return 0;
}

int sw_broker_start(sw_gateway *g, char *err, size_t errlen)
{
    memset(&B, 0, sizeof B);
    B.g = g;
    g->inbox_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (g->inbox_fd < 0) { snprintf(err, errlen, "eventfd: %s", strerror(errno)); return -1; }
    g->zctx = zmq_ctx_new();
    sw_curve_keypair kp;
    if (setup_curve(g, &kp, err, errlen) != 0) {
        zmq_ctx_term(g->zctx);
        return -1;
    }
    B.router = zmq_socket(g->zctx, ZMQ_ROUTER);
    int one = 1, zero = 0, hwm = 100000;
    zmq_setsockopt(B.router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(B.router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(B.router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(B.router, ZMQ_RCVHWM, &hwm, sizeof hwm);
    int maxsz = SW_MAX_FRAME;
    int64_t maxmsg = maxsz;
    zmq_setsockopt(B.router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    bool secured = !AUTHN.workers_curve || curve_server(B.router, &kp, SW_ZAP_DOMAIN_WORKERS, err, errlen) == 0;
    if (!secured || zmq_bind(B.router, g->workers_ep) != 0) {
        if (secured)
            snprintf(err, errlen, "cannot bind the worker endpoint %s: %s", g->workers_ep, zmq_strerror(errno));
        explicit_bzero(&kp, sizeof kp);
        zmq_close(B.router);
        zmq_ctx_term(g->zctx);
        return -1;
    }
    if (g->sdk_ep) {
        B.sdk = zmq_socket(g->zctx, ZMQ_ROUTER);
        zmq_setsockopt(B.sdk, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
        zmq_setsockopt(B.sdk, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(B.sdk, ZMQ_SNDHWM, &hwm, sizeof hwm);
        zmq_setsockopt(B.sdk, ZMQ_RCVHWM, &hwm, sizeof hwm);
        zmq_setsockopt(B.sdk, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
        if (AUTHN.sdk_curve && curve_server(B.sdk, &kp, SW_ZAP_DOMAIN_SDK, err, errlen) != 0) {
            explicit_bzero(&kp, sizeof kp);
            zmq_close(B.sdk);
            zmq_close(B.router);
            zmq_ctx_term(g->zctx);
            return -1;
        }
        if (zmq_bind(B.sdk, g->sdk_ep) != 0) {
            int e = errno;
            zmq_close(B.sdk);
            B.sdk = NULL;
            if (!g->sdk_ep_optional) {
                snprintf(err, errlen, "cannot bind the SDK endpoint %s: %s", g->sdk_ep, zmq_strerror(e));
                zmq_close(B.router);
                zmq_ctx_term(g->zctx);
                return -1;
            }
            fprintf(stderr, "spillway-gateway: warning: SDK endpoint %s unavailable (%s); "
                            "serving without it\n", g->sdk_ep, zmq_strerror(e));
        }
    }
    explicit_bzero(&kp, sizeof kp);   /* the sockets hold their copies */
    B.last_tick_ms = sw_now_ms();
    B.last_reload_check_ms = B.last_tick_ms;
    if (pthread_create(&g->broker, NULL, broker_main, NULL) != 0) {
        snprintf(err, errlen, "cannot start the broker thread");
        return -1;
    }
    return 0;
}

void sw_broker_stop(sw_gateway *g)
{
    __atomic_store_n(&g->stop, 1, __ATOMIC_RELEASE);
    uint64_t one = 1;
    if (write(g->inbox_fd, &one, sizeof one) < 0) perror("gateway: eventfd write");
    pthread_join(g->broker, NULL);
    zmq_close(B.router);
    if (B.sdk) zmq_close(B.sdk);
    zmq_ctx_term(g->zctx);
    /* under reg.mu, as /admin/status reads them (HTTP still serves) */
    pthread_mutex_lock(&g->reg.mu);
    sw_route_stats_free(g->route_stats);
    g->route_stats = NULL;
    while (g->reg.head) sw_registry_remove(&g->reg, g->reg.head);
    pthread_mutex_unlock(&g->reg.mu);
    close(g->inbox_fd);
}
