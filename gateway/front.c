/* The front door (see front.h): one sw_req from any client's request. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gateway/front.h"
#include "gateway/router.h"
#include "gateway/util.h"

/* The prompt's size in tokens before any tokenizer saw it, for the routes'
 * prompt-size conditions: about four bytes a token, plus a few for each
 * chat message's framing. */
static uint32_t prompt_estimate(const Spillway__GenerateRequest *g)
{
    if (g->n_prompt_tokens) return (uint32_t)g->n_prompt_tokens;
    uint32_t n = g->prompt ? (uint32_t)(strlen(g->prompt) / 4 + 1) : 0;
    for (size_t i = 0; i < g->n_messages; i++) n += (uint32_t)(strlen(g->messages[i]->content) / 4 + 4);
    return n;
}

/* r's names of the model: as asked, and resolved. -1: out of memory. */
static int set_model(sw_req *r, const sw_policy *p, const char *asked)
{
    free(r->model_asked);
    free(r->model);
    r->model_asked = strdup(asked);
    r->model = strdup(sw_policy_resolve(p, asked));
    return r->model_asked && r->model ? 0 : -1;
}

/* env into r->gen, under r's id and resolved model and with the policy's
 * deadline when the client set none: *id, *model and *dl are the message's
 * own fields, put back before its owner frees them. */
static int encode_as_ours(sw_req *r, const sw_policy *p, sw_env *env, char **id, char **model, uint64_t *dl)
{
    char *cid = *id, *cmodel = *model;
    uint64_t cdl = *dl;
    *id = r->id;
    *model = r->model;
    if (!cdl) *dl = (uint64_t)time(NULL) * 1000 + p->defaults.request_timeout_ms;
    free(r->gen);
    r->gen = NULL;
    r->gen_len = sw_wire_encode(env, &r->gen);
    *id = cid;
    *model = cmodel;
    *dl = cdl;
    return r->gen_len && r->gen ? 0 : -1;
}

int sw_front_prepare(sw_req *r, const sw_policy *p, Spillway__GenerateRequest *g)
{
    if (set_model(r, p, g->model) != 0) return -1;
    r->prompt_tokens_est = prompt_estimate(g);
    r->prefix_key = sw_prefix_key(g);
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE;
    env.generate = g;
    return encode_as_ours(r, p, &env, &g->request_id, &g->model, &g->deadline_unix_ms);
}

/* The inputs' tokens in all (text: about four bytes a token), and the
 * longest token-id input in *longest. */
static uint32_t embed_estimate(const Spillway__EmbedRequest *e, uint32_t *longest)
{
    uint64_t n = 0;
    *longest = 0;
    for (size_t i = 0; i < e->n_inputs; i++) {
        const Spillway__EmbedInput *in = e->inputs[i];
        n += in->n_tokens ? in->n_tokens : strlen(in->text) / 4 + 1;
        if (in->n_tokens > *longest) *longest = (uint32_t)in->n_tokens;
    }
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

int sw_front_prepare_embed(sw_req *r, const sw_policy *p, Spillway__EmbedRequest *e)
{
    if (set_model(r, p, e->model) != 0) return -1;
    r->embed = true;
    r->embed_n = (uint32_t)e->n_inputs;
    r->prompt_tokens_est = embed_estimate(e, &r->embed_max_ids);
    r->prefix_key = 0;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_EMBED;
    env.embed = e;
    return encode_as_ours(r, p, &env, &e->request_id, &e->model, &e->deadline_unix_ms);
}

int sw_front_check_kind(sw_registry *reg, const sw_req *r, char *msg, size_t msglen, const char **param)
{
    uint32_t ctx, dim;
    int kind = sw_registry_model_kind(reg, r->model, sw_now_ms(), &ctx, &dim);
    *param = "model";
    if (kind == SW_MODEL_EMBED && !r->embed) {
        snprintf(msg, msglen, "The model '%s' is an embedding model: use /v1/embeddings", r->model_asked);
        return 400;
    }
    if (kind == SW_MODEL_GENERATE && r->embed) {
        snprintf(msg, msglen, "The model '%s' is not an embedding model: /v1/embeddings needs one", r->model_asked);
        return 400;
    }
    if (r->embed && ctx && r->embed_max_ids > ctx) {
        *param = "input";
        snprintf(msg, msglen, "an input has %u tokens, more than the context of '%s' (%u)", r->embed_max_ids,
                 r->model_asked, ctx);
        return 400;
    }
    if (r->embed && dim && (uint64_t)r->embed_n * dim > SW_MAX_EMBED_VALUES) {
        *param = "input";
        snprintf(msg, msglen, "'input' has %u entries; '%s' (%u dimensions) takes at most %u a request",
                 r->embed_n, r->model_asked, dim, SW_MAX_EMBED_VALUES / dim);
        return 400;
    }
    *param = NULL;
    return 0;
}

bool sw_front_model_exists(sw_registry *reg, const sw_policy *p, const char *model)
{
    if (sw_policy_has_model(p, model)) return true;
    /* Not in the policy: known only if some live worker registered it. */
    pthread_mutex_lock(&reg->mu);
    bool known = sw_registry_count(reg, NULL, model, NULL, sw_now_ms()) > 0;
    pthread_mutex_unlock(&reg->mu);
    return known;
}
