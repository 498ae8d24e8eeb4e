/* Requests of several choices (see choices.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gateway/broker.h"
#include "gateway/choices.h"
#include "gateway/front.h"
#include "gateway/openai.h"
#include "gateway/util.h"

/* Choice i of parent, with its own id (the workers' key for it). */
static sw_req *new_choice(sw_req *parent, unsigned i)
{
    sw_req *k = sw_req_new();
    snprintf(k->id, sizeof k->id, "%.40s-%u", parent->id, i);
    k->parent = parent;
    k->choice = i;
    k->chat = parent->chat;
    k->stream = parent->stream;
    k->include_usage = parent->include_usage;
    k->logprobs = parent->logprobs;
    k->created_s = parent->created_s;
    k->sink = &sw_choice_sink;
    k->sdk = parent->sdk;   /* an SDK client's: its chunks go to that client, under its id, with their index */
    memcpy(k->sdk_ident, parent->sdk_ident, parent->sdk_ident_len);
    k->sdk_ident_len = parent->sdk_ident_len;
    memcpy(k->client_id, parent->client_id, sizeof k->client_id);
    return k;
}

/* g as prompt `pr` asks, sample j: its prompt and seed. */
static void aim(Spillway__GenerateRequest *g, const sw_prompt *pr, uint64_t seed, unsigned j)
{
    if (pr) {
        g->prompt = pr->text ? (char *)pr->text : (char *)protobuf_c_empty_string;
        g->prompt_tokens = (uint32_t *)pr->ids;
        g->n_prompt_tokens = pr->ids ? pr->n_ids : 0;
    }
    if (g->sampling && g->sampling->has_seed) g->sampling->seed = seed + j;
}

int sw_choices_make(sw_req *parent, const sw_policy *p, Spillway__GenerateRequest *g, const sw_prompt *prompts,
                    size_t n_prompts, unsigned n)
{
    size_t k = n_prompts * n;
    parent->kids = calloc(k, sizeof *parent->kids);
    if (!parent->kids) return -1;
    parent->n_per_prompt = n;
    parent->sse_stage = 1;   /* its choices say their role themselves */
    char *prompt = g->prompt;
    uint32_t *ids = g->prompt_tokens;
    size_t n_ids = g->n_prompt_tokens;
    uint64_t seed = g->sampling ? g->sampling->seed : 0;
    int rc = 0;
    for (unsigned i = 0; i < k && rc == 0; i++) {
        sw_req *c = new_choice(parent, i);
        parent->kids[parent->n_kids++] = c;
        aim(g, prompts ? &prompts[i / n] : NULL, seed, i % n);
        rc = sw_front_prepare(c, p, g);
    }
    g->prompt = prompt;
    g->prompt_tokens = ids;
    g->n_prompt_tokens = n_ids;
    if (g->sampling) g->sampling->seed = seed;
    return rc;
}

int sw_choices_prepare(sw_req *parent, const sw_policy *p, Spillway__GenerateRequest *g, const sw_prompt *prompts,
                       size_t n_prompts, unsigned n)
{
    Spillway__Prompt **batch = g->prompts;
    size_t n_batch = g->n_prompts;
    uint32_t wire_n = g->n;
    char *prompt = g->prompt;
    uint32_t *ids = g->prompt_tokens;
    size_t n_ids = g->n_prompt_tokens;
    g->prompts = NULL;   /* a worker takes one prompt and one sample */
    g->n_prompts = 0;
    g->n = 0;
    if (n == 0) n = 1;
    aim(g, prompts && n_prompts ? &prompts[0] : NULL, g->sampling ? g->sampling->seed : 0, 0);
    int rc = sw_front_prepare(parent, p, g);
    g->prompt = prompt;
    g->prompt_tokens = ids;
    g->n_prompt_tokens = n_ids;
    size_t k = (n_prompts ? n_prompts : 1) * n;
    if (rc == 0 && k > 1) rc = sw_choices_make(parent, p, g, prompts, n_prompts ? n_prompts : 1, n);
    g->prompts = batch;
    g->n_prompts = n_batch;
    g->n = wire_n;
    return rc;
}

sw_prompt *sw_choices_wire_prompts(const Spillway__GenerateRequest *g)
{
    sw_prompt *pr = g->n_prompts ? calloc(g->n_prompts, sizeof *pr) : NULL;
    for (size_t i = 0; pr && i < g->n_prompts; i++) {
        const Spillway__Prompt *w = g->prompts[i];
        if (w->n_tokens) pr[i] = (sw_prompt){ .ids = w->tokens, .n_ids = w->n_tokens };
        else pr[i].text = w->text;
    }
    return pr;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

/* Choice k is to go to the broker. */
static void want(sw_req *k)
{
    k->send_wanted = true;
    k->t_submit_ns = sw_now_ns();
}

void sw_choices_start(sw_req *parent)
{
    for (size_t i = 0; i < parent->n_kids; i++) {
        sw_req *k = parent->kids[i];
        k->klass = parent->klass;
        k->max_queue_ms = parent->max_queue_ms;
        k->api_key = dup_or_null(parent->api_key);
        k->tenant = dup_or_null(parent->tenant);
        k->want_target = dup_or_null(parent->want_target);
        k->want_quant = dup_or_null(parent->want_quant);
        memcpy(k->key_label, parent->key_label, sizeof k->key_label);
    }
    for (size_t i = 0; i < parent->n_kids; i += parent->n_per_prompt) want(parent->kids[i]);
}

/* Choice k's prompt is computed: its siblings may go, to share its KV. */
static void send_siblings(sw_req *k)
{
    sw_req *p = k->parent;
    if (k->siblings_sent || k->choice % p->n_per_prompt) return;
    k->siblings_sent = true;
    for (unsigned j = 1; j < p->n_per_prompt; j++) want(p->kids[k->choice + j]);
    /* after the event being handled, so that no sink changes the broker's
     * tables while it walks them */
    if (p->n_per_prompt > 1) sw_broker_post_here(SW_CMD_CHOICES, p);
}

/* Ends the parent (at the broker, after this event): its choices still
 * running are cancelled there, then it is let go. */
static void end_parent(sw_req *p)
{
    sw_broker_post_here(SW_CMD_CANCEL, p);
}

/* One choice failed: so does the request, once. */
static void choice_fail(sw_req *k, int status, const char *type, const char *code, const char *msg)
{
    sw_req *p = k->parent;
    pthread_mutex_lock(&p->mu);
    bool first = !p->kids_over;
    p->kids_over = true;
    pthread_mutex_unlock(&p->mu);
    if (!first) return;
    char m[300];
    snprintf(m, sizeof m, "choice %u: %s", k->choice, msg);
    p->sink->fail(p, status, type, code, m);
    end_parent(p);
}

static bool choice_chunk(sw_req *k, const Spillway__TokenChunk *c, int64_t rx_ns)
{
    sw_req *p = k->parent;
    pthread_mutex_lock(&p->mu);
    bool over = p->kids_over;
    pthread_mutex_unlock(&p->mu);
    if (over) return false;   /* the request failed: the broker cancels this choice */
    if (!p->sink->chunk(k, c, rx_ns)) {
        choice_fail(k, 503, "server_error", "stream_backlog", "its output was not read");
        return false;
    }
    send_siblings(k);
    return true;
}

/* The parent's usage: each prompt's once (its first choice's), the
 * completions of all. Every choice has finished (broker thread). */
static void merge_usage(sw_req *p)
{
    p->usage_prompt = p->usage_completion = p->usage_cached = p->usage_reasoning = 0;
    for (size_t i = 0; i < p->n_kids; i++) {
        const sw_req *k = p->kids[i];
        if (i % p->n_per_prompt == 0) {
            p->usage_prompt += k->usage_prompt;
            p->usage_cached += k->usage_cached;
        }
        p->usage_completion += k->usage_completion;
        p->usage_reasoning += k->usage_reasoning;
    }
}

/* News of choice k (k->mu held): its SSE events onto the parent's output,
 * the parent's answer when it was the last to finish. */
static void choice_wake(sw_req *k)
{
    sw_req *p = k->parent;
    if (k->client_gone) return;   /* cancelled with its parent */
    if (k->finished && k->finish == SPILLWAY__FINISH_REASON__FINISH_ERROR) {
        choice_fail(k, 502, "server_error", "worker_error", k->err_msg[0] ? k->err_msg : "the worker failed");
        return;
    }
    sw_sbuf ev = {0};
    if (p->stream) sw_openai_sse_pending(k, &ev);
    if (p->stream && k->finished && !k->counted) sw_openai_sse_finish(k, &ev);
    pthread_mutex_lock(&p->mu);
    if (k->decided && !p->decided) {   /* the stream may begin; its headers name the first choice's route */
        p->decided = true;
        snprintf(p->pool, sizeof p->pool, "%s", k->pool);
        snprintf(p->worker, sizeof p->worker, "%s", k->worker);
    }
    if (ev.n) sw_sbuf_put_n(&p->out, ev.s, ev.n);
    if (k->finished && !k->counted) {
        k->counted = true;
        p->kids_done++;
    }
    bool over = p->kids_done == p->n_kids && !p->kids_over;
    if (over) {
        merge_usage(p);
        p->kids_over = p->finished = true;
        p->finish = SPILLWAY__FINISH_REASON__FINISH_STOP;
    }
    if (p->sink->wake) p->sink->wake(p);
    pthread_mutex_unlock(&p->mu);
    sw_sbuf_free(&ev);
    if (over) end_parent(p);
}

/* No embedded: an embeddings request has no choices (it takes no `n`). */
const sw_sink sw_choice_sink = { choice_chunk, choice_fail, choice_wake, NULL };
