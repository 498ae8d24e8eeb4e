/* Framing and validation for the Spillway protocol (see wire.h).
 *
 * Decoding is the trust boundary: everything a peer could get wrong is checked
 * here once, so the gateway and the workers can use a decoded envelope without
 * re-checking ids, sizes or ranges. Errors are short messages for a log line.
 */
#include "proto/wire.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
#include "llm/text.h"

/* Bounds on what a worker registers and sends back, that no legitimate
 * peer comes near; they keep a hostile frame from making the receiver do
 * absurd amounts of work. A request's limits are llm/limits.h's, the same
 * the gateway enforces. */
#define MAX_MODELS 64
#define MAX_SLOTS 65536
#define MAX_QUANT_LEN 32
#define MAX_TOKEN_BYTES 1024

static bool fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return false;
}

/* Ids (request, worker, pool, model names) end up in logs, metrics labels and
 * HTTP headers, so they must be short printable ASCII without spaces. */
static bool check_id(const char *what, const char *s, size_t maxlen, char *err, size_t errlen)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0) return fail(err, errlen, "%s is empty", what);
    if (n > maxlen) return fail(err, errlen, "%s is too long (%zu bytes, max %zu)", what, n, maxlen);
    size_t i = sw_id_span(s);
    if (i < n)
        return fail(err, errlen, "%s has a space or non-printable byte 0x%02x at %zu", what,
                    (unsigned char)s[i], i);
    return true;
}

static bool check_text(const char *what, const char *s, char *err, size_t errlen)
{
    if (s && !sw_utf8_valid(s)) return fail(err, errlen, "%s is not valid UTF-8", what);
    return true;
}

/* A function call: a valid name, arguments as UTF-8 text (JSON the model
 * wrote; whether it parses is the client's business, as with OpenAI). */
static bool check_tool_calls(const char *what, Spillway__ToolCall *const *c, size_t n, char *err, size_t errlen)
{
    if (n > SW_MAX_TOOL_CALLS) return fail(err, errlen, "%s: %zu tool calls (max %d)", what, n, SW_MAX_TOOL_CALLS);
    for (size_t i = 0; i < n; i++) {
        if (!c[i]->name || !sw_tool_name_valid(c[i]->name))
            return fail(err, errlen, "%s: tool call %zu has no valid function name", what, i);
        if (!check_text(what, c[i]->arguments, err, errlen)) return false;
    }
    return true;
}

/* A log probability: at most 0 (NaN is not one); a token's bytes bounded. */
static bool check_token_logprob(float logprob, size_t n_bytes, char *err, size_t errlen)
{
    if (!(logprob <= 0.0f)) return fail(err, errlen, "chunk: logprob %g is not <= 0", (double)logprob);
    if (n_bytes > MAX_TOKEN_BYTES) return fail(err, errlen, "chunk: a token of %zu bytes", n_bytes);
    return true;
}

static bool check_logprob(const Spillway__Logprob *l, char *err, size_t errlen)
{
    if (!check_token_logprob(l->logprob, l->token.len, err, errlen)) return false;
    if (l->n_top > SW_MAX_TOP_LOGPROBS)
        return fail(err, errlen, "chunk: %zu top logprobs (max %d)", l->n_top, SW_MAX_TOP_LOGPROBS);
    for (size_t i = 0; i < l->n_top; i++)
        if (!check_token_logprob(l->top[i]->logprob, l->top[i]->token.len, err, errlen)) return false;
    return true;
}

static bool check_range(const char *what, float v, float lo, float hi, char *err, size_t errlen)
{
    if (!isfinite(v) || v < lo || v > hi)
        return fail(err, errlen, "%s %g is out of range [%g, %g]", what, (double)v, (double)lo,
                    (double)hi);
    return true;
}

static bool check_register(const Spillway__Register *r, char *err, size_t errlen)
{
    char what[64];
    if (!check_id("register: worker_id", r->worker_id, SW_MAX_ID_LEN, err, errlen)) return false;
    if (!check_id("register: pool", r->pool, SW_MAX_ID_LEN, err, errlen)) return false;
    if (r->kind != SPILLWAY__WORKER_KIND__WORKER_KIND_CPU &&
        r->kind != SPILLWAY__WORKER_KIND__WORKER_KIND_GPU)
        return fail(err, errlen, "register: unknown worker kind %d", (int)r->kind);
    if (r->n_models == 0) return fail(err, errlen, "register: no models");
    if (r->n_models > MAX_MODELS)
        return fail(err, errlen, "register: %zu models (max %d)", r->n_models, MAX_MODELS);
    for (size_t i = 0; i < r->n_models; i++) {
        const Spillway__ModelInfo *m = r->models[i];
        snprintf(what, sizeof what, "register: models[%zu].name", i);
        if (!check_id(what, m->name, SW_MAX_ID_LEN, err, errlen)) return false;
        /* Quantization may be empty (unknown), but when present it is a label. */
        if (m->quantization && m->quantization[0]) {
            snprintf(what, sizeof what, "register: models[%zu].quantization", i);
            if (!check_id(what, m->quantization, MAX_QUANT_LEN, err, errlen)) return false;
        }
        if (m->embedding && (m->embedding_dim == 0 || m->embedding_dim > SW_MAX_EMBED_DIM))
            return fail(err, errlen, "register: models[%zu].embedding_dim %u (1..%d)", i, m->embedding_dim,
                        SW_MAX_EMBED_DIM);
    }
    if (r->slots == 0 || r->slots > MAX_SLOTS)
        return fail(err, errlen, "register: slots %u is out of range [1, %d]", r->slots, MAX_SLOTS);
    return true;
}

static bool check_heartbeat(const Spillway__Heartbeat *h, char *err, size_t errlen)
{
    return check_range("heartbeat: kv_utilization", h->kv_utilization, 0.0f, 1.0f, err, errlen);
}

/* At most SW_MAX_LOGIT_BIAS entries of +-SW_MAX_LOGIT_BIAS_VALUE; the
 * ids are the worker's to check against its vocabulary. */
static bool check_logit_bias(const Spillway__SamplingParams *s, char *err, size_t errlen)
{
    if (s->n_logit_bias > SW_MAX_LOGIT_BIAS)
        return fail(err, errlen, "generate: %zu logit_bias entries (max %d)", s->n_logit_bias, SW_MAX_LOGIT_BIAS);
    for (size_t i = 0; i < s->n_logit_bias; i++)
        if (!check_range("generate: logit_bias", s->logit_bias[i]->bias, -SW_MAX_LOGIT_BIAS_VALUE,
                         SW_MAX_LOGIT_BIAS_VALUE, err, errlen)) return false;
    return true;
}

static bool check_sampling(const Spillway__SamplingParams *s, char *err, size_t errlen)
{
    if (!s) return true; /* absent = defaults (greedy) */
    return check_range("generate: temperature", s->temperature, 0.0f, SW_MAX_TEMPERATURE, err, errlen) &&
           check_range("generate: top_p", s->top_p, 0.0f, 1.0f, err, errlen) &&
           check_range("generate: min_p", s->min_p, 0.0f, 1.0f, err, errlen) &&
           check_range("generate: repetition_penalty", s->repetition_penalty, 0.0f, SW_MAX_REPETITION_PENALTY,
                       err, errlen) &&
           check_range("generate: presence_penalty", s->presence_penalty, -SW_MAX_PENALTY, SW_MAX_PENALTY, err, errlen) &&
           check_range("generate: frequency_penalty", s->frequency_penalty, -SW_MAX_PENALTY, SW_MAX_PENALTY, err,
                       errlen) &&
           check_logit_bias(s, err, errlen);
}

/* A batch of prompts (an SDK client's): at most SW_MAX_CHOICES choices in
 * all, each prompt exactly one of text and token ids. */
static bool check_prompts(const Spillway__GenerateRequest *g, char *err, size_t errlen)
{
    size_t choices = g->n_prompts * (g->n > 1 ? g->n : 1);
    if (g->n_prompts > SW_MAX_CHOICES || choices > SW_MAX_CHOICES)
        return fail(err, errlen, "generate: %zu prompts of %u samples (max %d choices)", g->n_prompts, g->n,
                    SW_MAX_CHOICES);
    for (size_t i = 0; i < g->n_prompts; i++) {
        const Spillway__Prompt *pr = g->prompts[i];
        if ((pr->text && pr->text[0]) == (pr->n_tokens > 0))
            return fail(err, errlen, "generate: prompts[%zu] must have exactly one of text and tokens", i);
        if (pr->n_tokens > SW_MAX_TOKENS_PER_REQUEST)
            return fail(err, errlen, "generate: prompts[%zu] has %zu tokens (max %u)", i, pr->n_tokens,
                        SW_MAX_TOKENS_PER_REQUEST);
        if (!check_text("generate: prompts text", pr->text, err, errlen)) return false;
    }
    return true;
}

static bool check_generate(const Spillway__GenerateRequest *g, char *err, size_t errlen)
{
    char what[64];
    if (!check_id("generate: request_id", g->request_id, SW_MAX_ID_LEN, err, errlen)) return false;
    if (!check_id("generate: model", g->model, SW_MAX_ID_LEN, err, errlen)) return false;
    int inputs = (g->prompt && g->prompt[0]) + (g->n_prompt_tokens > 0) + (g->n_messages > 0) + (g->n_prompts > 0);
    if (inputs == 0) return fail(err, errlen, "generate: no prompt, prompt_tokens, messages or prompts");
    if (inputs > 1)
        return fail(err, errlen, "generate: more than one of prompt, prompt_tokens, messages, prompts");
    if (!check_prompts(g, err, errlen)) return false;
    if (!check_text("generate: prompt", g->prompt, err, errlen)) return false;
    if (g->n_prompt_tokens > SW_MAX_TOKENS_PER_REQUEST)
        return fail(err, errlen, "generate: %zu prompt tokens (max %u)", g->n_prompt_tokens,
                    SW_MAX_TOKENS_PER_REQUEST);
    if (g->n_messages > SW_MAX_MESSAGES)
        return fail(err, errlen, "generate: %zu messages (max %d)", g->n_messages, SW_MAX_MESSAGES);
    for (size_t i = 0; i < g->n_messages; i++) {
        const Spillway__ChatMessage *m = g->messages[i];
        snprintf(what, sizeof what, "generate: messages[%zu].role", i);
        if (!check_id(what, m->role, SW_MAX_ROLE_LEN, err, errlen)) return false;
        snprintf(what, sizeof what, "generate: messages[%zu].content", i);
        if (!check_text(what, m->content, err, errlen)) return false;
        snprintf(what, sizeof what, "generate: messages[%zu]", i);
        if (!check_tool_calls(what, m->tool_calls, m->n_tool_calls, err, errlen)) return false;
    }
    if (g->max_tokens > SW_MAX_TOKENS_PER_REQUEST)
        return fail(err, errlen, "generate: max_tokens %u exceeds %u", g->max_tokens,
                    SW_MAX_TOKENS_PER_REQUEST);
    if (g->n > SW_MAX_CHOICES) return fail(err, errlen, "generate: n %u exceeds %d", g->n, SW_MAX_CHOICES);
    if (g->n_stop > SW_MAX_STOPS)
        return fail(err, errlen, "generate: %zu stop strings (max %d)", g->n_stop, SW_MAX_STOPS);
    for (size_t i = 0; i < g->n_stop; i++) {
        size_t n = strlen(g->stop[i]);
        if (n == 0) return fail(err, errlen, "generate: stop[%zu] is empty", i);
        if (n > SW_MAX_STOP_LEN)
            return fail(err, errlen, "generate: stop[%zu] is too long (%zu bytes, max %d)", i, n,
                        SW_MAX_STOP_LEN);
        snprintf(what, sizeof what, "generate: stop[%zu]", i);
        if (!check_text(what, g->stop[i], err, errlen)) return false;
    }
    if (!check_text("generate: tools_json", g->tools_json, err, errlen)) return false;
    if (!check_text("generate: json_schema", g->json_schema, err, errlen)) return false;
    if (g->json_schema && strlen(g->json_schema) > SW_MAX_SCHEMA_LEN)
        return fail(err, errlen, "generate: json_schema of %zu bytes (max %d)", strlen(g->json_schema),
                    SW_MAX_SCHEMA_LEN);
    if (!check_text("generate: tool_choice", g->tool_choice, err, errlen)) return false;
    if (g->top_logprobs > SW_MAX_TOP_LOGPROBS)
        return fail(err, errlen, "generate: top_logprobs %u (max %d)", g->top_logprobs, SW_MAX_TOP_LOGPROBS);
    if (g->reasoning_effort < SPILLWAY__REASONING_EFFORT__REASONING_EFFORT_DEFAULT ||
        g->reasoning_effort > SPILLWAY__REASONING_EFFORT__REASONING_EFFORT_HIGH)
        return fail(err, errlen, "generate: unknown reasoning_effort %d", (int)g->reasoning_effort);
    return check_sampling(g->sampling, err, errlen);
}

static bool check_chunk(const Spillway__TokenChunk *c, char *err, size_t errlen)
{
    if (!check_id("chunk: request_id", c->request_id, SW_MAX_ID_LEN, err, errlen)) return false;
    if (!check_text("chunk: text", c->text, err, errlen)) return false;
    if (!check_text("chunk: reasoning", c->reasoning, err, errlen)) return false;
    if (!check_tool_calls("chunk", c->tool_calls, c->n_tool_calls, err, errlen)) return false;
    if (c->n_logprobs > c->n_token_ids) return fail(err, errlen, "chunk: %zu logprobs for %zu tokens", c->n_logprobs, c->n_token_ids);
    for (size_t i = 0; i < c->n_logprobs; i++)
        if (!check_logprob(c->logprobs[i], err, errlen)) return false;
    if (c->n_prompt_logprobs > SW_MAX_PROMPT_LOGPROBS_CHUNK)
        return fail(err, errlen, "chunk: %zu prompt logprobs (max %d a chunk)", c->n_prompt_logprobs,
                    SW_MAX_PROMPT_LOGPROBS_CHUNK);
    for (size_t i = 0; i < c->n_prompt_logprobs; i++)
        if (!check_logprob(c->prompt_logprobs[i], err, errlen)) return false;
    if (c->finish_reason < SPILLWAY__FINISH_REASON__FINISH_NONE ||
        c->finish_reason > SPILLWAY__FINISH_REASON__FINISH_ERROR)
        return fail(err, errlen, "chunk: unknown finish_reason %d", (int)c->finish_reason);
    if (c->usage && c->usage->cached_tokens > c->usage->prompt_tokens)
        return fail(err, errlen, "chunk: %u cached of %u prompt tokens", c->usage->cached_tokens,
                    c->usage->prompt_tokens);
    if (c->usage && c->usage->reasoning_tokens > c->usage->completion_tokens)
        return fail(err, errlen, "chunk: %u reasoning of %u completion tokens", c->usage->reasoning_tokens,
                    c->usage->completion_tokens);
    return true;
}

static bool check_embed(const Spillway__EmbedRequest *e, char *err, size_t errlen)
{
    if (!check_id("embed: request_id", e->request_id, SW_MAX_ID_LEN, err, errlen)) return false;
    if (!check_id("embed: model", e->model, SW_MAX_ID_LEN, err, errlen)) return false;
    if (e->n_inputs == 0 || e->n_inputs > SW_MAX_EMBED_INPUTS)
        return fail(err, errlen, "embed: %zu inputs (1..%d)", e->n_inputs, SW_MAX_EMBED_INPUTS);
    for (size_t i = 0; i < e->n_inputs; i++) {
        const Spillway__EmbedInput *in = e->inputs[i];
        bool text = in->text && in->text[0];
        if (text == (in->n_tokens > 0))
            return fail(err, errlen, "embed: input %zu must have exactly one of text and tokens", i);
        if (in->n_tokens > SW_MAX_EMBED_INPUT_TOKENS)
            return fail(err, errlen, "embed: input %zu has %zu tokens (max %d)", i, in->n_tokens,
                        SW_MAX_EMBED_INPUT_TOKENS);
        if (!check_text("embed: input text", in->text, err, errlen)) return false;
    }
    return true;
}

static bool check_embed_reply(const Spillway__EmbedReply *e, char *err, size_t errlen)
{
    if (!check_id("embed_reply: request_id", e->request_id, SW_MAX_ID_LEN, err, errlen)) return false;
    if (e->dim == 0 || e->dim > SW_MAX_EMBED_DIM)
        return fail(err, errlen, "embed_reply: dim %u (1..%d)", e->dim, SW_MAX_EMBED_DIM);
    if (e->n_input_tokens == 0 || e->n_input_tokens > SW_MAX_EMBED_INPUTS ||
        e->n_values != e->n_input_tokens * (size_t)e->dim || e->n_values > SW_MAX_EMBED_VALUES)
        return fail(err, errlen, "embed_reply: %zu values for %zu inputs of %u", e->n_values, e->n_input_tokens,
                    e->dim);
    for (size_t i = 0; i < e->n_values; i++)
        if (!isfinite(e->values[i])) return fail(err, errlen, "embed_reply: value %zu is not finite", i);
    return check_text("embed_reply: pool", e->pool, err, errlen) &&
           check_text("embed_reply: worker_id", e->worker_id, err, errlen);
}

static bool check_error(const Spillway__Error *e, char *err, size_t errlen)
{
    /* An empty request id means the error is about the connection itself. */
    if (e->request_id && e->request_id[0] &&
        !check_id("error: request_id", e->request_id, SW_MAX_ID_LEN, err, errlen))
        return false;
    if (e->code < 100 || e->code > 599)
        return fail(err, errlen, "error: code %u is not an HTTP-like status", e->code);
    return check_text("error: message", e->message, err, errlen);
}

/* Unknown fields are kept for forward compatibility, and re-sent when a
 * decoded message is encoded again. protobuf-c accepts one numbered 0 (an
 * over-long tag varint), which no encoder may write and no decoder reads back:
 * refuse it here, in every nested message, so that whatever we decode we can
 * also forward. */
static bool unknown_fields_ok(const ProtobufCMessage *m)
{
    if (!m) return true;
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0) return false;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned f = 0; f < d->n_fields; f++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[f];
        if (fd->type != PROTOBUF_C_TYPE_MESSAGE) continue;
        if ((fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)((const char *)m + fd->quantifier_offset) != fd->id)
            continue;       /* a oneof member not chosen: its union slot holds another */
        const char *base = (const char *)m + fd->offset;
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)((const char *)m + fd->quantifier_offset);
            ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)base;
            for (size_t k = 0; k < n; k++)
                if (!unknown_fields_ok(v[k])) return false;
        } else if (!unknown_fields_ok(*(const ProtobufCMessage *const *)base)) {
            return false;
        }
    }
    return true;
}

static bool check_envelope(const sw_env *env, char *err, size_t errlen)
{
    if (!unknown_fields_ok(&env->base)) return fail(err, errlen, "malformed frame: a field numbered 0");
    if (env->version != SW_PROTOCOL_VERSION)
        return fail(err, errlen, "protocol version %u, expected %u", env->version,
                    SW_PROTOCOL_VERSION);
    switch (env->body_case) {
    case SPILLWAY__ENVELOPE__BODY_REGISTER: return check_register(env->register_, err, errlen);
    case SPILLWAY__ENVELOPE__BODY_HEARTBEAT: return check_heartbeat(env->heartbeat, err, errlen);
    case SPILLWAY__ENVELOPE__BODY_GENERATE: return check_generate(env->generate, err, errlen);
    case SPILLWAY__ENVELOPE__BODY_CHUNK: return check_chunk(env->chunk, err, errlen);
    case SPILLWAY__ENVELOPE__BODY_CANCEL:
        return check_id("cancel: request_id", env->cancel->request_id, SW_MAX_ID_LEN, err, errlen);
    case SPILLWAY__ENVELOPE__BODY_ERROR: return check_error(env->error, err, errlen);
    case SPILLWAY__ENVELOPE__BODY_DISCONNECT:
        return check_text("disconnect: reason", env->disconnect->reason, err, errlen);
    case SPILLWAY__ENVELOPE__BODY_EMBED: return check_embed(env->embed, err, errlen);
    case SPILLWAY__ENVELOPE__BODY_EMBED_REPLY: return check_embed_reply(env->embed_reply, err, errlen);
    case SPILLWAY__ENVELOPE__BODY_STATUS_REQUEST:
        return check_id("status_request: request_id", env->status_request->request_id,
                        SW_MAX_ID_LEN, err, errlen);
    case SPILLWAY__ENVELOPE__BODY_STATUS_REPLY:
        return check_id("status_reply: request_id", env->status_reply->request_id,
                        SW_MAX_ID_LEN, err, errlen) &&
               check_text("status_reply: json", env->status_reply->json, err, errlen);
    default:
        /* Also what a newer peer's unknown message kind looks like. */
        return fail(err, errlen, "envelope has no (known) body");
    }
}

size_t sw_wire_encode(sw_env *env, uint8_t **out)
{
    *out = NULL;
    env->version = SW_PROTOCOL_VERSION;
    size_t n = spillway__envelope__get_packed_size(env);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return 0;
    size_t written = spillway__envelope__pack(env, buf);
    *out = buf;
    return written;
}

const char *sw_wire_client_request_id(const sw_env *env)
{
    const char *rid = env->body_case == SPILLWAY__ENVELOPE__BODY_GENERATE ? env->generate->request_id
                      : env->body_case == SPILLWAY__ENVELOPE__BODY_EMBED ? env->embed->request_id
                      : env->body_case == SPILLWAY__ENVELOPE__BODY_STATUS_REQUEST ? env->status_request->request_id
                      : NULL;
    return rid && check_id("", rid, SW_MAX_ID_LEN, NULL, 0) ? rid : NULL;
}

sw_env *sw_wire_decode_request(const void *buf, size_t len, char *err, size_t errlen, char *rid, size_t ridlen)
{
    if (rid && ridlen) rid[0] = 0;
    if (err && errlen) err[0] = 0;
    if (!buf || len == 0) {
        fail(err, errlen, "empty frame");
        return NULL;
    }
    if (len > SW_MAX_FRAME) {
        fail(err, errlen, "frame too large (%zu bytes, max %u)", len, SW_MAX_FRAME);
        return NULL;
    }
    sw_env *env = spillway__envelope__unpack(NULL, len, buf);
    if (!env) {
        fail(err, errlen, "malformed frame (%zu bytes): not a valid Envelope", len);
        return NULL;
    }
    if (!check_envelope(env, err, errlen)) {
        const char *id = rid && ridlen ? sw_wire_client_request_id(env) : NULL;
        if (id) snprintf(rid, ridlen, "%s", id);
        spillway__envelope__free_unpacked(env, NULL);
        return NULL;
    }
    return env;
}

sw_env *sw_wire_decode(const void *buf, size_t len, char *err, size_t errlen)
{
    return sw_wire_decode_request(buf, len, err, errlen, NULL, 0);
}

void sw_wire_free(sw_env *env)
{
    if (env) spillway__envelope__free_unpacked(env, NULL);
}

const char *sw_wire_kind(const sw_env *env)
{
    if (!env) return "none";
    switch (env->body_case) {
    case SPILLWAY__ENVELOPE__BODY_REGISTER: return "register";
    case SPILLWAY__ENVELOPE__BODY_HEARTBEAT: return "heartbeat";
    case SPILLWAY__ENVELOPE__BODY_GENERATE: return "generate";
    case SPILLWAY__ENVELOPE__BODY_CHUNK: return "chunk";
    case SPILLWAY__ENVELOPE__BODY_CANCEL: return "cancel";
    case SPILLWAY__ENVELOPE__BODY_ERROR: return "error";
    case SPILLWAY__ENVELOPE__BODY_DISCONNECT: return "disconnect";
    case SPILLWAY__ENVELOPE__BODY_STATUS_REQUEST: return "status_request";
    case SPILLWAY__ENVELOPE__BODY_STATUS_REPLY: return "status_reply";
    case SPILLWAY__ENVELOPE__BODY_EMBED: return "embed";
    case SPILLWAY__ENVELOPE__BODY_EMBED_REPLY: return "embed_reply";
    default: return "none";
    }
}

static void free_buf(void *data, void *hint)
{
    (void)hint;
    free(data);
}

int sw_wire_send(void *zsock, const void *identity, size_t idlen, sw_env *env, int flags)
{
    uint8_t *buf;
    size_t n = sw_wire_encode(env, &buf);
    if (!buf) {
        errno = ENOMEM;
        return -1;
    }
    if (identity && zmq_send(zsock, identity, idlen, flags | ZMQ_SNDMORE) < 0) {
        free(buf);
        return -1;
    }
    /* Zero-copy: ZeroMQ frees the buffer once it has been written out. */
    zmq_msg_t msg;
    if (zmq_msg_init_data(&msg, buf, n, free_buf, NULL) != 0) {
        free(buf);
        return -1;
    }
    if (zmq_msg_send(&msg, zsock, flags & ~ZMQ_SNDMORE) < 0) {
        int e = errno;
        zmq_msg_close(&msg);
        errno = e;
        return -1;
    }
    return 0;
}
