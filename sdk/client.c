/* libspillway client: a DEALER socket to the gateway's SDK ROUTER. */
#include "sdk/spillway.h"
#include "sdk/client_impl.h"
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
#include "llm/text.h"
#include "llm/util.h"

#define HANDSHAKE_EP "inproc://spillway-handshake"   /* one context per client: the name is ours */

void sw_sdk_err(char *err, size_t n, const char *fmt, const char *detail)
{
    if (err && n) snprintf(err, n, fmt, detail);
}

void sw_sdk_new_id(spillway_client *c, char *id, size_t idlen)
{
    snprintf(id, idlen, "sdk-%u-%llu", c->pid, (unsigned long long)++c->next_id);
}

bool sw_sdk_model_ok(const char *model, char *err, size_t errlen)
{
    size_t n = model ? strlen(model) : 0;
    if (n == 0) sw_sdk_err(err, errlen, "spillway: %s", "request needs a model");
    else if (n > SW_MAX_ID_LEN || sw_id_span(model) < n)
        sw_sdk_err(err, errlen, "spillway: the model name '%.200s' is not one the gateway takes "
                "(printable, no spaces, at most SW_MAX_ID_LEN bytes)", model);
    else return true;
    return false;
}

bool sw_sdk_input_ok(const char *what, size_t i, const spillway_input *in, size_t max_ids, char *err,
                     size_t errlen)
{
    bool text = in->text && in->text[0];
    const char *why = text && in->n_ids ? "has both text and token ids (one of them)"
                      : !text && !in->n_ids ? "is empty"
                      : in->n_ids && !in->ids ? "has n_ids but no ids"
                      : in->n_ids > max_ids ? "has too many token ids"
                      : text && !sw_utf8_valid(in->text) ? "is not valid UTF-8" : NULL;
    if (why && err && errlen) {
        snprintf(err, errlen, "spillway: %s[%zu] %s", what, i, why);
        if (in->n_ids > max_ids && !(text && in->n_ids))
            snprintf(err, errlen, "spillway: %s[%zu] has %zu token ids, more than %zu", what, i, in->n_ids, max_ids);
    }
    return !why;
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
        sw_sdk_err(err, errlen, "spillway: %s", cerr);
        spillway_close(c);
        return NULL;
    }
    if (c->sock) c->mon = sw_curve_monitor_open(c->ctx, c->sock, HANDSHAKE_EP);
    if (!c->sock || zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_connect(c->sock, endpoint ? endpoint : SPILLWAY_DEFAULT_ENDPOINT) != 0) {
        sw_sdk_err(err, errlen, "spillway: cannot connect: %s", zmq_strerror(zmq_errno()));
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
        sw_sdk_err(err, errlen, "spillway: %s", key_file && gateway_key ? kerr : "CURVE needs a key file and the "
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

/* A request in the wire's form, and the arrays it points into. */
typedef struct {
    Spillway__GenerateRequest g;
    Spillway__SamplingParams sp;
    Spillway__LogitBias *bias, **bias_ptrs;
    Spillway__ChatMessage *msgs, **msg_ptrs;
    Spillway__Prompt *prompts, **prompt_ptrs;
} wire_req;

static void wire_free(wire_req *w)
{
    free(w->bias);
    free(w->bias_ptrs);
    free(w->msgs);
    free(w->msg_ptrs);
    free(w->prompts);
    free(w->prompt_ptrs);
}

/* The request's scalar fields and strings (pointing into req). */
static void wire_fields(wire_req *w, const spillway_request *req, char *id)
{
    Spillway__GenerateRequest *g = &w->g;
    g->request_id = id;
    g->model = (char *)req->model;
    g->max_tokens = req->max_tokens;
    g->n = req->n > 1 ? req->n : 0;
    w->sp.temperature = req->temperature;
    w->sp.top_p = req->top_p;
    w->sp.top_k = req->top_k;
    w->sp.presence_penalty = req->presence_penalty;
    w->sp.frequency_penalty = req->frequency_penalty;
    w->sp.has_seed = req->has_seed;
    w->sp.seed = req->seed;
    g->sampling = &w->sp;
    g->n_stop = req->n_stop;
    g->stop = (char **)req->stop;
    g->reasoning_effort = (Spillway__ReasoningEffort)req->reasoning_effort;
    if (req->tools_json) g->tools_json = (char *)req->tools_json;
    if (req->tool_choice && strcmp(req->tool_choice, "auto")) g->tool_choice = (char *)req->tool_choice;
    if (req->json_schema) g->json_schema = (char *)req->json_schema;
    g->logprobs = req->logprobs;
    g->top_logprobs = req->top_logprobs;
}

/* req's logit_bias entries. -1: out of memory. */
static int wire_bias(wire_req *w, const spillway_request *req)
{
    size_t n = req->n_logit_bias;
    if (!n) return 0;
    w->bias = calloc(n, sizeof *w->bias);
    w->bias_ptrs = calloc(n, sizeof *w->bias_ptrs);
    if (!w->bias || !w->bias_ptrs) return -1;
    for (size_t i = 0; i < n; i++) {
        spillway__logit_bias__init(&w->bias[i]);
        w->bias[i].token_id = req->logit_bias_ids[i];
        w->bias[i].bias = req->logit_bias[i];
        w->bias_ptrs[i] = &w->bias[i];
    }
    w->sp.n_logit_bias = n;
    w->sp.logit_bias = w->bias_ptrs;
    return 0;
}

/* What is to be continued: req's messages (a chat), its batch of prompts,
 * or its prompt. -1: out of memory. */
static int wire_input(wire_req *w, const spillway_request *req)
{
    size_t nm = req->n_messages, np = req->n_prompts;
    if (!nm && !np) {
        w->g.prompt = (char *)(req->prompt ? req->prompt : "");
        return 0;
    }
    if (nm && (!(w->msgs = calloc(nm, sizeof *w->msgs)) || !(w->msg_ptrs = calloc(nm, sizeof *w->msg_ptrs))))
        return -1;
    for (size_t i = 0; i < nm; i++) {
        spillway__chat_message__init(&w->msgs[i]);
        w->msgs[i].role = (char *)req->messages[i].role;
        w->msgs[i].content = (char *)req->messages[i].content;
        w->msg_ptrs[i] = &w->msgs[i];
    }
    w->g.n_messages = nm;
    w->g.messages = w->msg_ptrs;
    if (np && (!(w->prompts = calloc(np, sizeof *w->prompts)) ||
               !(w->prompt_ptrs = calloc(np, sizeof *w->prompt_ptrs))))
        return -1;
    for (size_t i = 0; i < np; i++) {
        spillway__prompt__init(&w->prompts[i]);
        if (req->prompts[i].n_ids) {
            w->prompts[i].tokens = (uint32_t *)req->prompts[i].ids;
            w->prompts[i].n_tokens = req->prompts[i].n_ids;
        } else {
            w->prompts[i].text = (char *)req->prompts[i].text;
        }
        w->prompt_ptrs[i] = &w->prompts[i];
    }
    w->g.n_prompts = np;
    w->g.prompts = w->prompt_ptrs;
    return 0;
}

/* Sends a GenerateRequest built from the public request struct; 0, or -1
 * with err filled. */
static int send_request(spillway_client *c, const spillway_request *req, char *id, size_t idlen, char *err,
                        size_t errlen)
{
    wire_req w = { .g = SPILLWAY__GENERATE_REQUEST__INIT, .sp = SPILLWAY__SAMPLING_PARAMS__INIT };
    sw_sdk_new_id(c, id, idlen);
    wire_fields(&w, req, id);
    int rc = -1;
    if (wire_bias(&w, req) != 0 || wire_input(&w, req) != 0) {
        sw_sdk_err(err, errlen, "spillway: %s", "out of memory");
    } else {
        sw_env env = SPILLWAY__ENVELOPE__INIT;
        env.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE;
        env.generate = &w.g;
        rc = sw_sdk_send(c, &env, err, errlen);
    }
    wire_free(&w);
    return rc;
}

void sw_sdk_cancel(spillway_client *c, const char *id)
{
    Spillway__Cancel cn = SPILLWAY__CANCEL__INIT;
    cn.request_id = (char *)id;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_CANCEL;
    env.cancel = &cn;
    sw_wire_send(c->sock, NULL, 0, &env, ZMQ_DONTWAIT);
}

int sw_sdk_send(spillway_client *c, sw_env *env, char *err, size_t errlen)
{
    env->version = SW_PROTOCOL_VERSION;
    size_t n = spillway__envelope__get_packed_size(env);
    if (n > SW_MAX_FRAME) {
        if (err && errlen)
            snprintf(err, errlen, "spillway: the request is %zu bytes, more than a frame takes (SW_MAX_FRAME, "
                     "%u)", n, SW_MAX_FRAME);
        return -1;
    }
    if (sw_wire_send(c->sock, NULL, 0, env, 0) == 0) return 0;
    sw_sdk_err(err, errlen, "spillway: send: %s", zmq_strerror(zmq_errno()));
    return -1;
}

/* Whether the monitor reports a failed handshake (err says why). */
static bool handshake_failed(spillway_client *c, char *err, size_t errlen)
{
    char what[256];
    int rc;
    while ((rc = sw_curve_monitor_read(c->mon, what, sizeof what)) >= 0)
        if (rc == 1) {
            sw_sdk_err(err, errlen, "spillway: cannot talk to the gateway: %s", what);
            return true;
        }
    return false;
}

/* Invalid frames are skipped (said on stderr); replies to other (abandoned)
 * requests are skipped by the caller. */
sw_env *sw_sdk_recv(spillway_client *c, int64_t deadline, char *err, size_t errlen)
{
    for (;;) {
        int64_t left = deadline - sw_clock_ms();
        if (left <= 0) { sw_sdk_err(err, errlen, "spillway: %s", "timed out waiting for the gateway"); return NULL; }
        zmq_pollitem_t it[2] = {{ c->sock, 0, ZMQ_POLLIN, 0 }, { c->mon, 0, ZMQ_POLLIN, 0 }};
        int n = zmq_poll(it, c->mon ? 2 : 1, (long)left);
        if (n < 0) {
            if (zmq_errno() == EINTR) continue;
            sw_sdk_err(err, errlen, "spillway: poll: %s", zmq_strerror(zmq_errno()));
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
        sw_sdk_err(x->err, x->errlen, "spillway: %s", "out of memory");
        sw_sdk_cancel(x->c, x->id);
        *rc = -1;
        return 1;
    }
    if (callbacks_stop(x, i, ch)) {
        sw_sdk_cancel(x->c, x->id);
        for (uint32_t k = 0; k < x->n; k++)
            if (x->out[k].finish == SPILLWAY_FINISH_NONE) x->out[k].finish = SPILLWAY_FINISH_CANCELLED;
        return 1;
    }
    if (ch->finish_reason == SPILLWAY__FINISH_REASON__FINISH_NONE) return 0;
    finish_result(&x->out[i], ch);
    if (x->out[i].finish == SPILLWAY_FINISH_ERROR) {   /* the gateway ends the others */
        sw_sdk_err(x->err, x->errlen, "spillway: %s", "the worker failed mid-stream");
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
    if (send_request(c, x->req, x->id, sizeof x->id, x->err, x->errlen) != 0) return -1;
    int64_t deadline = sw_clock_ms() + (x->req->timeout_ms > 0 ? x->req->timeout_ms : 600000);
    for (;;) {
        sw_env *e = sw_sdk_recv(c, deadline, x->err, x->errlen);
        if (!e) { sw_sdk_cancel(c, x->id); return -1; }
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

/* The choices req asks for: its prompts (a batch, or its one prompt or
 * chat) times its samples. */
static size_t choices_of(const spillway_request *req)
{
    return (req->n_prompts ? req->n_prompts : 1) * (size_t)(req->n > 1 ? req->n : 1);
}

/* Whether req's batch of prompts is one the gateway takes: in place of
 * prompt and messages, each prompt text or token ids. */
static bool prompts_ok(const spillway_request *req, char *err, size_t errlen)
{
    if (!req->n_prompts) return true;
    const char *why = !req->prompts ? "n_prompts is set but prompts is NULL"
                      : req->n_messages ? "a batch of prompts is for completions: it takes no messages"
                      : req->prompt ? "a batch of prompts goes in place of prompt: set one of them" : NULL;
    if (why) {
        sw_sdk_err(err, errlen, "spillway: %s", why);
        return false;
    }
    for (size_t i = 0; i < req->n_prompts; i++)
        if (!sw_sdk_input_ok("prompts", i, &req->prompts[i], SW_MAX_TOKENS_PER_REQUEST, err, errlen)) return false;
    return true;
}

/* Whether the call (of n results) fits req; false with err filled. */
static bool request_ok(const run_ctx *x, size_t n)
{
    const spillway_request *req = x->req;
    if (!x->c) { sw_sdk_err(x->err, x->errlen, "spillway: %s", "no client (spillway_connect failed?)"); return false; }
    if (!sw_sdk_model_ok(req->model, x->err, x->errlen) || !prompts_ok(req, x->err, x->errlen)) return false;
    if (choices_of(req) == n) return true;
    sw_sdk_err(x->err, x->errlen, "spillway: %s", req->n_prompts > 1 ? "a batch of several prompts goes through "
               "spillway_complete_batch" : "a request with n > 1 goes through spillway_complete_n");
    return false;
}

/* n results in out (n: the request's choices), answered through fn or
 * choice_fn. More than SW_MAX_CHOICES: refused, out untouched. */
static int run_request(run_ctx *x, size_t n)
{
    if (!x->req) {
        sw_sdk_err(x->err, x->errlen, "spillway: %s", "no request");
        return -1;
    }
    if (n > SW_MAX_CHOICES) {
        if (x->err && x->errlen)
            snprintf(x->err, x->errlen, "spillway: %zu choices (prompts times n), more than SW_MAX_CHOICES (%d)", n,
                     SW_MAX_CHOICES);
        return -1;
    }
    memset(x->out, 0, n * sizeof *x->out);
    if (!request_ok(x, n)) return -1;
    x->n = (uint32_t)n;
    x->text = calloc(n, sizeof *x->text);
    x->reasoning = calloc(n, sizeof *x->reasoning);
    int rc = x->text && x->reasoning ? await_request(x) : -1;
    if (!x->text || !x->reasoning) sw_sdk_err(x->err, x->errlen, "spillway: %s", "out of memory");
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
        sw_sdk_err(err, errlen, "spillway: %s", "spillway_complete_n needs a request with n > 1");
        return -1;
    }
    return run_request(&x, req->n);
}

/* The totals of a batch's results (n samples a prompt), as the gateway
 * counts them for HTTP (gateway/choices.c's merge_usage): each prompt's
 * tokens once, from its first sample; every sample's completion. */
static void batch_usage(const spillway_result *out, size_t n_prompts, size_t n, spillway_usage *u)
{
    memset(u, 0, sizeof *u);
    for (size_t i = 0; i < n_prompts * n; i++) {
        if (i % n == 0) {
            u->prompt_tokens += out[i].prompt_tokens;
            u->cached_tokens += out[i].cached_tokens;
        }
        u->completion_tokens += out[i].completion_tokens;
    }
}

int spillway_complete_batch(spillway_client *c, const spillway_request *req, spillway_choice_fn fn, void *user,
                            spillway_result *out, spillway_usage *usage, char *err, size_t errlen)
{
    run_ctx x = { .c = c, .req = req, .choice_fn = fn, .user = user, .out = out, .err = err, .errlen = errlen };
    if (usage) memset(usage, 0, sizeof *usage);
    if (!req || !req->n_prompts) {
        sw_sdk_err(err, errlen, "spillway: %s", "spillway_complete_batch needs a request with prompts (n_prompts > 0)");
        return -1;
    }
    if (req->n_prompts > SW_MAX_CHOICES) {
        if (err && errlen)
            snprintf(err, errlen, "spillway: a batch of %zu prompts, more than SW_MAX_CHOICES (%d)", req->n_prompts,
                     SW_MAX_CHOICES);
        return -1;
    }
    size_t n = req->n > 1 ? req->n : 1;
    int rc = run_request(&x, choices_of(req));
    if (usage && choices_of(req) <= SW_MAX_CHOICES) batch_usage(out, req->n_prompts, n, usage);
    return rc;
}

char *spillway_status(spillway_client *c, const char *admin_token, int timeout_ms, char *err, size_t errlen)
{
    char id[64];
    sw_sdk_new_id(c, id, sizeof id);
    Spillway__StatusRequest sr = SPILLWAY__STATUS_REQUEST__INIT;
    sr.request_id = id;
    sr.admin_token = (char *)(admin_token ? admin_token : "");
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = &sr;
    if (sw_wire_send(c->sock, NULL, 0, &env, 0) != 0) {
        sw_sdk_err(err, errlen, "spillway: send: %s", zmq_strerror(zmq_errno()));
        return NULL;
    }
    int64_t deadline = sw_clock_ms() + (timeout_ms > 0 ? timeout_ms : 5000);
    for (;;) {
        sw_env *e = sw_sdk_recv(c, deadline, err, errlen);
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
