/* The front door (see front.h): one sw_req from any client's request. */
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

int sw_front_prepare(sw_req *r, const sw_policy *p, Spillway__GenerateRequest *g)
{
    free(r->model_asked);
    free(r->model);
    r->model_asked = strdup(g->model);
    r->model = strdup(sw_policy_resolve(p, g->model));
    if (!r->model_asked || !r->model) return -1;
    r->prompt_tokens_est = prompt_estimate(g);
    r->prefix_key = sw_prefix_key(g);
    /* Encoded under our id and the resolved model; g's own strings go back
     * before its owner frees them. */
    char *cid = g->request_id, *cmodel = g->model;
    uint64_t dl = g->deadline_unix_ms;
    g->request_id = r->id;
    g->model = r->model;
    if (!dl) g->deadline_unix_ms = (uint64_t)time(NULL) * 1000 + p->defaults.request_timeout_ms;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE;
    env.generate = g;
    free(r->gen);
    r->gen = NULL;
    r->gen_len = sw_wire_encode(&env, &r->gen);
    g->request_id = cid;
    g->model = cmodel;
    g->deadline_unix_ms = dl;
    return r->gen_len && r->gen ? 0 : -1;
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
