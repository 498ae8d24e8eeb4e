/* libspillway client: a DEALER socket to the gateway's SDK ROUTER. */
#include "sdk/spillway.h"
#include "proto/curve.h"
#include "proto/wire.h"

#include <zmq.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "llm/clock.h"
#include "llm/util.h"

#define HANDSHAKE_EP "inproc://spillway-handshake"   /* one context per client: the name is ours */

struct spillway_client {
    void *ctx;
    void *sock;
    void *mon;          /* the socket's handshake events (proto/curve.h), or NULL */
    uint64_t next_id;
    unsigned pid;
};

static void set_err(char *err, size_t n, const char *fmt, const char *detail)
{
    if (err && n) snprintf(err, n, fmt, detail);
}

/* A client, with CURVE when kp is given. The handshake monitor lets a
 * refused client fail at once, saying why, instead of timing out. */
static spillway_client *connect_with(const char *endpoint, const sw_curve_keypair *kp, const char *gateway_key,
                                     char *err, size_t errlen)
{
    spillway_client *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->ctx = zmq_ctx_new();
    c->sock = c->ctx ? zmq_socket(c->ctx, ZMQ_DEALER) : NULL;
    int zero = 0;
    char cerr[256];
    if (kp && c->sock && sw_curve_client_setup(c->sock, kp, gateway_key, cerr, sizeof cerr) != 0) {
        set_err(err, errlen, "spillway: %s", cerr);
        spillway_close(c);
        return NULL;
    }
    if (c->sock) c->mon = sw_curve_monitor_open(c->ctx, c->sock, HANDSHAKE_EP);
    if (!c->sock || zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_connect(c->sock, endpoint ? endpoint : SPILLWAY_DEFAULT_ENDPOINT) != 0) {
        set_err(err, errlen, "spillway: cannot connect: %s", zmq_strerror(zmq_errno()));
        spillway_close(c);
        return NULL;
    }
    c->pid = (unsigned)getpid();
    return c;
}

spillway_client *spillway_connect(const char *endpoint, char *err, size_t errlen)
{
    return connect_with(endpoint, NULL, NULL, err, errlen);
}

spillway_client *spillway_connect_curve(const char *endpoint, const char *key_file, const char *gateway_key,
                                        char *err, size_t errlen)
{
    sw_curve_keypair kp;
    char server[SW_CURVE_Z85_LEN + 1], kerr[512];
    if (!key_file || !gateway_key || sw_curve_load_keypair(key_file, &kp, kerr, sizeof kerr) != 0 ||
        sw_curve_load_public(gateway_key, server, kerr, sizeof kerr) != 0) {
        set_err(err, errlen, "spillway: %s", key_file && gateway_key ? kerr : "CURVE needs a key file and the "
                                                                           "gateway's public key");
        explicit_bzero(&kp, sizeof kp);
        return NULL;
    }
    spillway_client *c = connect_with(endpoint, &kp, server, err, errlen);
    explicit_bzero(&kp, sizeof kp);   /* the socket keeps its own copy */
    return c;
}

void spillway_close(spillway_client *c)
{
    if (!c) return;
    if (c->mon) {
        zmq_socket_monitor(c->sock, NULL, 0);
        zmq_close(c->mon);
    }
    if (c->sock) zmq_close(c->sock);
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c);
}

spillway_request spillway_request_default(const char *model)
{
    spillway_request r;
    memset(&r, 0, sizeof r);
    r.model = model;
    r.max_tokens = 256;
    r.temperature = 1.0f;
    return r;
}

const char *spillway_finish_name(spillway_finish f)
{
    switch (f) {
    case SPILLWAY_FINISH_STOP: return "stop";
    case SPILLWAY_FINISH_LENGTH: return "length";
    case SPILLWAY_FINISH_CANCELLED: return "cancelled";
    case SPILLWAY_FINISH_ERROR: return "error";
    default: return "none";
    }
}

void spillway_result_free(spillway_result *r)
{
    if (!r) return;
    free(r->text);
    free(r->reasoning);
    r->text = r->reasoning = NULL;
    r->len = r->reasoning_len = 0;
    for (size_t i = 0; i < r->n_tool_calls; i++) {
        free(r->tool_calls[i].name);
        free(r->tool_calls[i].arguments);
    }
    free(r->tool_calls);
    r->tool_calls = NULL;
    r->n_tool_calls = 0;
    for (size_t i = 0; i < r->n_logprobs; i++) {
        free(r->logprobs[i].token.bytes);
        for (size_t k = 0; k < r->logprobs[i].n_top; k++) free(r->logprobs[i].top[k].bytes);
        free(r->logprobs[i].top);
    }
    free(r->logprobs);
    r->logprobs = NULL;
    r->n_logprobs = 0;
}

static int copy_token_logprob(spillway_token_logprob *t, uint32_t id, ProtobufCBinaryData b, float logprob)
{
    t->id = id;
    t->logprob = logprob;
    t->n_bytes = b.len;
    t->bytes = malloc(b.len + 1);
    if (!t->bytes) return -1;
    if (b.len) memcpy(t->bytes, b.data, b.len);
    t->bytes[b.len] = 0;
    return 0;
}

static int add_logprob(spillway_result *r, const Spillway__Logprob *l)
{
    spillway_logprob *p = realloc(r->logprobs, (r->n_logprobs + 1) * sizeof *p);
    if (!p) return -1;
    r->logprobs = p;
    spillway_logprob *e = &p[r->n_logprobs];
    memset(e, 0, sizeof *e);
    r->n_logprobs++;   /* counted now, so that result_free frees what was copied */
    if (copy_token_logprob(&e->token, l->token_id, l->token, l->logprob) != 0) return -1;
    if (l->n_top && !(e->top = calloc(l->n_top, sizeof *e->top))) return -1;
    for (size_t k = 0; k < l->n_top; k++, e->n_top++)
        if (copy_token_logprob(&e->top[k], l->top[k]->token_id, l->top[k]->token, l->top[k]->logprob) != 0) return -1;
    return 0;
}

static int add_tool_call(spillway_result *r, const Spillway__ToolCall *c)
{
    spillway_tool_call *p = realloc(r->tool_calls, (r->n_tool_calls + 1) * sizeof *p);
    if (!p) return -1;
    r->tool_calls = p;
    p[r->n_tool_calls].name = strdup(c->name);
    p[r->n_tool_calls].arguments = strdup(c->arguments);
    if (!p[r->n_tool_calls].name || !p[r->n_tool_calls].arguments) {
        free(p[r->n_tool_calls].name);
        free(p[r->n_tool_calls].arguments);
        return -1;
    }
    r->n_tool_calls++;
    return 0;
}

/* Sends a GenerateRequest built from the public request struct. */
static int send_request(spillway_client *c, const spillway_request *req, char *id, size_t idlen)
{
    Spillway__GenerateRequest g = SPILLWAY__GENERATE_REQUEST__INIT;
    Spillway__SamplingParams sp = SPILLWAY__SAMPLING_PARAMS__INIT;
    snprintf(id, idlen, "sdk-%u-%llu", c->pid, (unsigned long long)++c->next_id);
    g.request_id = id;
    g.model = (char *)req->model;
    g.max_tokens = req->max_tokens;
    g.n = req->n > 1 ? req->n : 0;
    sp.temperature = req->temperature;
    sp.top_p = req->top_p;
    sp.top_k = req->top_k;
    sp.presence_penalty = req->presence_penalty;
    sp.frequency_penalty = req->frequency_penalty;
    sp.has_seed = req->has_seed;
    sp.seed = req->seed;
    g.sampling = &sp;
    g.n_stop = req->n_stop;
    g.stop = (char **)req->stop;
    g.reasoning_effort = (Spillway__ReasoningEffort)req->reasoning_effort;
    if (req->tools_json) g.tools_json = (char *)req->tools_json;
    if (req->tool_choice && strcmp(req->tool_choice, "auto")) g.tool_choice = (char *)req->tool_choice;
    if (req->json_schema) g.json_schema = (char *)req->json_schema;
    g.logprobs = req->logprobs;
    g.top_logprobs = req->top_logprobs;
    Spillway__LogitBias *bias = NULL, **bias_ptrs = NULL;
    if (req->n_logit_bias) {
        bias = calloc(req->n_logit_bias, sizeof *bias);
        bias_ptrs = calloc(req->n_logit_bias, sizeof *bias_ptrs);
        if (!bias || !bias_ptrs) { free(bias); free(bias_ptrs); return -1; }
        for (size_t i = 0; i < req->n_logit_bias; i++) {
            spillway__logit_bias__init(&bias[i]);
            bias[i].token_id = req->logit_bias_ids[i];
            bias[i].bias = req->logit_bias[i];
            bias_ptrs[i] = &bias[i];
        }
        sp.n_logit_bias = req->n_logit_bias;
        sp.logit_bias = bias_ptrs;
    }

    Spillway__ChatMessage *msgs = NULL, **mptrs = NULL;
    if (req->n_messages) {
        msgs = calloc(req->n_messages, sizeof *msgs);
        mptrs = calloc(req->n_messages, sizeof *mptrs);
        if (!msgs || !mptrs) { free(msgs); free(mptrs); free(bias); free(bias_ptrs); return -1; }
        for (size_t i = 0; i < req->n_messages; i++) {
            spillway__chat_message__init(&msgs[i]);
            msgs[i].role = (char *)req->messages[i].role;
            msgs[i].content = (char *)req->messages[i].content;
            mptrs[i] = &msgs[i];
        }
        g.n_messages = req->n_messages;
        g.messages = mptrs;
    } else {
        g.prompt = (char *)(req->prompt ? req->prompt : "");
    }
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE;
    env.generate = &g;
    int rc = sw_wire_send(c->sock, NULL, 0, &env, 0);
    free(msgs);
    free(mptrs);
    free(bias);
    free(bias_ptrs);
    return rc;
}

static void send_cancel(spillway_client *c, const char *id)
{
    Spillway__Cancel cn = SPILLWAY__CANCEL__INIT;
    cn.request_id = (char *)id;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_CANCEL;
    env.cancel = &cn;
    sw_wire_send(c->sock, NULL, 0, &env, ZMQ_DONTWAIT);
}

/* Whether the monitor reports a failed handshake (err says why). */
static bool handshake_failed(spillway_client *c, char *err, size_t errlen)
{
    char what[256];
    int rc;
    while ((rc = sw_curve_monitor_read(c->mon, what, sizeof what)) >= 0)
        if (rc == 1) {
            set_err(err, errlen, "spillway: cannot talk to the gateway: %s", what);
            return true;
        }
    return false;
}

/* Receives the next envelope within the deadline; NULL on timeout or garbage
 * (err says which). Replies to other (abandoned) requests are skipped by the caller. */
static sw_env *recv_env(spillway_client *c, int64_t deadline, char *err, size_t errlen)
{
    for (;;) {
        int64_t left = deadline - sw_clock_ms();
        if (left <= 0) { set_err(err, errlen, "spillway: %s", "timed out waiting for the gateway"); return NULL; }
        zmq_pollitem_t it[2] = {{ c->sock, 0, ZMQ_POLLIN, 0 }, { c->mon, 0, ZMQ_POLLIN, 0 }};
        int n = zmq_poll(it, c->mon ? 2 : 1, (long)left);
        if (n < 0) {
            if (zmq_errno() == EINTR) continue;
            set_err(err, errlen, "spillway: poll: %s", zmq_strerror(zmq_errno()));
            return NULL;
        }
        if (c->mon && (it[1].revents & ZMQ_POLLIN) && handshake_failed(c, err, errlen)) return NULL;
        if (!(it[0].revents & ZMQ_POLLIN)) continue;
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, c->sock, 0) < 0) { zmq_msg_close(&m); continue; }
        char derr[160];
        sw_env *e = sw_wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), derr, sizeof derr);
        zmq_msg_close(&m);
        if (e) return e;
        fprintf(stderr, "spillway: ignoring invalid frame from gateway: %s\n", derr);
    }
}

/* One request in flight, and where its answer goes: one result, or n
 * (a request of n samples, whose chunks say which they are of). */
typedef struct {
    spillway_client *c;
    const spillway_request *req;
    spillway_stream_fn fn;          /* one sample's deltas, or ... */
    spillway_choice_fn choice_fn;   /* ... each sample's, with its index */
    void *user;
    spillway_result *out;           /* n results */
    uint32_t n, n_over;             /* samples; those finished */
    char id[64];
    char *err;
    size_t errlen;
    sw_sbuf *text, *reasoning;      /* out[i].text and out[i].reasoning, growing */
} run_ctx;

/* Appends to one of the result's strings through its buffer; the result
 * owns the bytes (spillway_result_free frees them). -1: out of memory. */
static int append_text(sw_sbuf *b, char **s, size_t *len, const char *t, size_t n)
{
    sw_sbuf_put_n(b, t, n);
    *s = b->s;
    *len = b->n;
    return b->oom ? -1 : 0;
}

/* Copies a chunk's text, reasoning, calls and log probabilities into
 * result i. -1: out of memory. */
static int keep_chunk(run_ctx *x, uint32_t i, const Spillway__TokenChunk *ch)
{
    spillway_result *out = &x->out[i];
    if (ch->pool && *ch->pool) snprintf(out->pool, sizeof out->pool, "%s", ch->pool);
    if (ch->worker_id && *ch->worker_id) snprintf(out->worker, sizeof out->worker, "%s", ch->worker_id);
    size_t n = strlen(ch->text), rn = strlen(ch->reasoning);
    if (n && append_text(&x->text[i], &out->text, &out->len, ch->text, n) != 0) return -1;
    if (rn && append_text(&x->reasoning[i], &out->reasoning, &out->reasoning_len, ch->reasoning, rn) != 0)
        return -1;
    for (size_t k = 0; k < ch->n_tool_calls; k++)
        if (add_tool_call(out, ch->tool_calls[k]) != 0) return -1;
    for (size_t k = 0; k < ch->n_logprobs; k++)
        if (add_logprob(out, ch->logprobs[k]) != 0) return -1;
    return 0;
}

/* Hands the chunk's reasoning, then its text, to the streaming callbacks;
 * true when one of them asks to stop. */
static bool callbacks_stop(const run_ctx *x, uint32_t i, const Spillway__TokenChunk *ch)
{
    const spillway_request *req = x->req;
    size_t n = strlen(ch->text), rn = strlen(ch->reasoning);
    if (rn && req->on_reasoning && req->on_reasoning(req->on_reasoning_user, ch->reasoning, rn) != 0) return true;
    if (!n) return false;
    if (x->choice_fn) return x->choice_fn(x->user, i, ch->text, n) != 0;
    return x->fn && x->fn(x->user, ch->text, n) != 0;
}

/* Result i finished as the chunk says. */
static void finish_result(spillway_result *out, const Spillway__TokenChunk *ch)
{
    out->finish = (spillway_finish)ch->finish_reason;
    if (ch->usage) {
        out->prompt_tokens = ch->usage->prompt_tokens;
        out->completion_tokens = ch->usage->completion_tokens;
        out->cached_tokens = ch->usage->cached_tokens;
        out->reasoning_tokens = ch->usage->reasoning_tokens;
    }
}

/* A chunk of this request. Returns 1 when the request is over (*rc: 0, or
 * -1 with err set), 0 while it goes on. */
static int on_chunk(run_ctx *x, const Spillway__TokenChunk *ch, int *rc)
{
    uint32_t i = ch->index;
    if (i >= x->n || x->out[i].finish != SPILLWAY_FINISH_NONE) return 0;   /* not a sample we are waiting for */
    if (keep_chunk(x, i, ch) != 0) {
        set_err(x->err, x->errlen, "spillway: %s", "out of memory");
        send_cancel(x->c, x->id);
        *rc = -1;
        return 1;
    }
    if (callbacks_stop(x, i, ch)) {
        send_cancel(x->c, x->id);
        for (uint32_t k = 0; k < x->n; k++)
            if (x->out[k].finish == SPILLWAY_FINISH_NONE) x->out[k].finish = SPILLWAY_FINISH_CANCELLED;
        return 1;
    }
    if (ch->finish_reason == SPILLWAY__FINISH_REASON__FINISH_NONE) return 0;
    finish_result(&x->out[i], ch);
    if (x->out[i].finish == SPILLWAY_FINISH_ERROR) {   /* the gateway ends the others */
        set_err(x->err, x->errlen, "spillway: %s", "the worker failed mid-stream");
        *rc = -1;
        return 1;
    }
    return ++x->n_over == x->n;
}

/* The gateway refused the request (or lost it): always the end. */
static void on_error(run_ctx *x, const Spillway__Error *e)
{
    for (uint32_t i = 0; i < x->n; i++) {
        if (x->out[i].finish != SPILLWAY_FINISH_NONE) continue;
        x->out[i].error_code = (int)e->code;
        x->out[i].finish = SPILLWAY_FINISH_ERROR;
    }
    if (x->err && x->errlen) snprintf(x->err, x->errlen, "spillway: gateway error %u: %s", e->code, e->message);
}

/* Sends x's request and takes its answer until it is over. */
static int await_request(run_ctx *x)
{
    spillway_client *c = x->c;
    if (send_request(c, x->req, x->id, sizeof x->id) != 0) {
        set_err(x->err, x->errlen, "spillway: send: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    int64_t deadline = sw_clock_ms() + (x->req->timeout_ms > 0 ? x->req->timeout_ms : 600000);
    for (;;) {
        sw_env *e = recv_env(c, deadline, x->err, x->errlen);
        if (!e) { send_cancel(c, x->id); return -1; }
        int done = 0, rc = 0;
        if (e->body_case == SPILLWAY__ENVELOPE__BODY_CHUNK && strcmp(e->chunk->request_id, x->id) == 0) {
            done = on_chunk(x, e->chunk, &rc);
        } else if (e->body_case == SPILLWAY__ENVELOPE__BODY_ERROR && strcmp(e->error->request_id, x->id) == 0) {
            on_error(x, e->error);
            rc = -1;
            done = 1;
        }
        sw_wire_free(e);
        if (done) return rc;
    }
}

/* n results in out (n: the request's samples), answered through fn or
 * choice_fn. */
static int run_request(run_ctx *x, uint32_t n)
{
    memset(x->out, 0, n * sizeof *x->out);
    const spillway_request *req = x->req;
    if (!req || !req->model || !*req->model) {
        set_err(x->err, x->errlen, "spillway: %s", "request needs a model");
        return -1;
    }
    if ((req->n > 1) != (n > 1) || n > SW_MAX_CHOICES) {
        set_err(x->err, x->errlen, "spillway: %s", n > SW_MAX_CHOICES ? "n is more than SW_MAX_CHOICES"
                : "a request with n > 1 goes through spillway_complete_n");
        return -1;
    }
    x->n = n;
    x->text = calloc(n, sizeof *x->text);
    x->reasoning = calloc(n, sizeof *x->reasoning);
    int rc = x->text && x->reasoning ? await_request(x) : -1;
    if (!x->text || !x->reasoning) set_err(x->err, x->errlen, "spillway: %s", "out of memory");
    free(x->text);   /* the bytes are the results' */
    free(x->reasoning);
    return rc;
}

int spillway_complete(spillway_client *c, const spillway_request *req,
                      spillway_result *out, char *err, size_t errlen)
{
    run_ctx x = { .c = c, .req = req, .out = out, .err = err, .errlen = errlen };
    return run_request(&x, 1);
}

int spillway_complete_stream(spillway_client *c, const spillway_request *req,
                             spillway_stream_fn fn, void *user,
                             spillway_result *out, char *err, size_t errlen)
{
    run_ctx x = { .c = c, .req = req, .fn = fn, .user = user, .out = out, .err = err, .errlen = errlen };
    return run_request(&x, 1);
}

int spillway_complete_n(spillway_client *c, const spillway_request *req, spillway_choice_fn fn, void *user,
                        spillway_result *out, char *err, size_t errlen)
{
    run_ctx x = { .c = c, .req = req, .choice_fn = fn, .user = user, .out = out, .err = err, .errlen = errlen };
    if (!req || req->n < 2) {
        set_err(err, errlen, "spillway: %s", "spillway_complete_n needs a request with n > 1");
        return -1;
    }
    return run_request(&x, req->n);
}

char *spillway_status(spillway_client *c, const char *admin_token, int timeout_ms, char *err, size_t errlen)
{
    char id[64];
    snprintf(id, sizeof id, "sdk-%u-%llu", c->pid, (unsigned long long)++c->next_id);
    Spillway__StatusRequest sr = SPILLWAY__STATUS_REQUEST__INIT;
    sr.request_id = id;
    sr.admin_token = (char *)(admin_token ? admin_token : "");
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = &sr;
    if (sw_wire_send(c->sock, NULL, 0, &env, 0) != 0) {
        set_err(err, errlen, "spillway: send: %s", zmq_strerror(zmq_errno()));
        return NULL;
    }
    int64_t deadline = sw_clock_ms() + (timeout_ms > 0 ? timeout_ms : 5000);
    for (;;) {
        sw_env *e = recv_env(c, deadline, err, errlen);
        if (!e) return NULL;
        char *json = NULL;
        bool refused = e->body_case == SPILLWAY__ENVELOPE__BODY_ERROR && strcmp(e->error->request_id, id) == 0;
        if (refused && err && errlen)
            snprintf(err, errlen, "spillway: status refused (%u): %s", e->error->code, e->error->message);
        if (e->body_case == SPILLWAY__ENVELOPE__BODY_STATUS_REPLY && strcmp(e->status_reply->request_id, id) == 0)
            json = strdup(e->status_reply->json);
        sw_wire_free(e);
        if (json || refused) return json;
    }
}
