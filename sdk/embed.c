/* libspillway embeddings: one EmbedRequest, answered by the worker's
 * EmbedReply (which the gateway relays under our id) or an Error. */
#include "sdk/spillway.h"
#include "sdk/client_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llm/clock.h"
#include "llm/limits.h"

void spillway_embeddings_free(spillway_embeddings *e)
{
    if (!e) return;
    free(e->values);
    free(e->input_tokens);
    e->values = NULL;
    e->input_tokens = NULL;
    e->count = 0;
    e->dim = 0;
}

/* Whether the arguments make a request the gateway takes; false with err
 * filled. (What depends on the model, its context and width, is the
 * gateway's to say.) */
static bool embed_args_ok(spillway_client *c, const char *model, const spillway_input *inputs, size_t n,
                          char *err, size_t errlen)
{
    if (!c) {
        sw_sdk_err(err, errlen, "spillway: %s", "no client (spillway_connect failed?)");
        return false;
    }
    if (!sw_sdk_model_ok(model, err, errlen)) return false;
    if (n == 0 || n > SW_MAX_EMBED_INPUTS || !inputs) {
        if (err && errlen)
            snprintf(err, errlen, "spillway: embeddings need 1 to SW_MAX_EMBED_INPUTS (%d) inputs, not %zu%s",
                     SW_MAX_EMBED_INPUTS, n, n && !inputs ? " (inputs is NULL)" : "");
        return false;
    }
    for (size_t i = 0; i < n; i++)
        if (!sw_sdk_input_ok("inputs", i, &inputs[i], SW_MAX_EMBED_INPUT_TOKENS, err, errlen)) return false;
    return true;
}

/* Sends the EmbedRequest under a fresh id; 0, or -1 with err filled. */
static int send_embed(spillway_client *c, const char *model, const spillway_input *inputs, size_t n, char *id,
                      size_t idlen, char *err, size_t errlen)
{
    Spillway__EmbedInput *in = calloc(n, sizeof *in);
    Spillway__EmbedInput **ptrs = calloc(n, sizeof *ptrs);
    int rc = -1;
    if (!in || !ptrs) {
        sw_sdk_err(err, errlen, "spillway: %s", "out of memory");
    } else {
        for (size_t i = 0; i < n; i++) {
            spillway__embed_input__init(&in[i]);
            if (inputs[i].n_ids) {
                in[i].tokens = (uint32_t *)inputs[i].ids;
                in[i].n_tokens = inputs[i].n_ids;
            } else {
                in[i].text = (char *)inputs[i].text;
            }
            ptrs[i] = &in[i];
        }
        sw_sdk_new_id(c, id, idlen);
        Spillway__EmbedRequest e = SPILLWAY__EMBED_REQUEST__INIT;
        e.request_id = id;
        e.model = (char *)model;
        e.n_inputs = n;
        e.inputs = ptrs;
        sw_env env = SPILLWAY__ENVELOPE__INIT;
        env.body_case = SPILLWAY__ENVELOPE__BODY_EMBED;
        env.embed = &e;
        rc = sw_sdk_send(c, &env, err, errlen);
    }
    free(in);
    free(ptrs);
    return rc;
}

/* The reply into out: one vector an input (n). 0, or -1 with err filled. */
static int keep_reply(const Spillway__EmbedReply *r, size_t n, spillway_embeddings *out, char *err, size_t errlen)
{
    if (r->n_input_tokens != n) {
        if (err && errlen)
            snprintf(err, errlen, "spillway: the gateway answered %zu vectors for %zu inputs", r->n_input_tokens, n);
        return -1;
    }
    out->values = malloc(r->n_values * sizeof *out->values);   /* the wire check: n * dim of them, n > 0 */
    out->input_tokens = malloc(n * sizeof *out->input_tokens);
    if (!out->values || !out->input_tokens) {
        sw_sdk_err(err, errlen, "spillway: %s", "out of memory");
        return -1;
    }
    memcpy(out->values, r->values, r->n_values * sizeof *out->values);
    memcpy(out->input_tokens, r->input_tokens, n * sizeof *out->input_tokens);
    out->dim = r->dim;
    out->count = n;
    for (size_t i = 0; i < n; i++) out->prompt_tokens += r->input_tokens[i];
    snprintf(out->pool, sizeof out->pool, "%s", r->pool ? r->pool : "");
    snprintf(out->worker, sizeof out->worker, "%s", r->worker_id ? r->worker_id : "");
    return 0;
}

/* Envelopes until the answer to id: 0, or -1 with err filled. */
static int await_embed(spillway_client *c, const char *id, size_t n, int timeout_ms, spillway_embeddings *out,
                       char *err, size_t errlen)
{
    int64_t deadline = sw_clock_ms() + (timeout_ms > 0 ? timeout_ms : 600000);
    for (;;) {
        sw_env *e = sw_sdk_recv(c, deadline, err, errlen);
        if (!e) {
            sw_sdk_cancel(c, id);
            return -1;
        }
        int rc = 1;   /* not ours: go on */
        if (e->body_case == SPILLWAY__ENVELOPE__BODY_EMBED_REPLY && !strcmp(e->embed_reply->request_id, id)) {
            rc = keep_reply(e->embed_reply, n, out, err, errlen);
        } else if (e->body_case == SPILLWAY__ENVELOPE__BODY_ERROR && !strcmp(e->error->request_id, id)) {
            out->error_code = (int)e->error->code;
            if (err && errlen)
                snprintf(err, errlen, "spillway: gateway error %u: %s", e->error->code, e->error->message);
            rc = -1;
        }
        sw_wire_free(e);
        if (rc != 1) return rc;
    }
}

int spillway_embed(spillway_client *c, const char *model, const spillway_input *inputs, size_t n_inputs,
                   spillway_embeddings *out, int timeout_ms, char *err, size_t errlen)
{
    if (!out) {
        sw_sdk_err(err, errlen, "spillway: %s", "spillway_embed needs somewhere to put the vectors (out)");
        return -1;
    }
    memset(out, 0, sizeof *out);
    char id[64];
    if (!embed_args_ok(c, model, inputs, n_inputs, err, errlen) ||
        send_embed(c, model, inputs, n_inputs, id, sizeof id, err, errlen) != 0)
        return -1;
    int rc = await_embed(c, id, n_inputs, timeout_ms, out, err, errlen);
    if (rc != 0) {   /* nothing half-filled */
        int code = out->error_code;
        spillway_embeddings_free(out);
        memset(out, 0, sizeof *out);
        out->error_code = code;
    }
    return rc;
}

int spillway_embed_texts(spillway_client *c, const char *model, const char *const *texts, size_t n_texts,
                         spillway_embeddings *out, int timeout_ms, char *err, size_t errlen)
{
    if (out) memset(out, 0, sizeof *out);
    if (n_texts == 0 || n_texts > SW_MAX_EMBED_INPUTS || !texts)   /* refused as spillway_embed refuses it */
        return spillway_embed(c, model, NULL, n_texts, out, timeout_ms, err, errlen);
    spillway_input *in = calloc(n_texts, sizeof *in);
    if (!in) {
        sw_sdk_err(err, errlen, "spillway: %s", "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n_texts; i++) in[i].text = texts[i] ? texts[i] : "";
    int rc = spillway_embed(c, model, in, n_texts, out, timeout_ms, err, errlen);
    free(in);
    return rc;
}
