/* The CPU engine: N sequence slots over one model, with iteration-level
 * continuous batching.
 *
 * Each step() builds ONE batch for the forward pass:
 *   - one token for every sequence that is decoding, and
 *   - a chunk of prompt tokens (at most PREFILL_BUDGET in all) for sequences
 *     still in prefill, oldest first,
 * so the weights are read once per step however many sequences run, and a
 * long prompt never stalls the others for more than one chunk. Requests join
 * (from the queue, when a slot is free) and leave (finish, cancel) between
 * steps. Each slot owns one KV cache in the forward context.
 *
 * Prefix cache: a slot's KV cache outlives its request, together with the
 * list of tokens it holds. A new request goes to the free slot whose cached
 * tokens share the longest prefix with its prompt, and prefills only the
 * rest. A chat resends the whole conversation every turn, so on a CPU, where
 * prefill is the slow part, this is what keeps the second turn from costing
 * as much as the first. (KV entry p depends only on tokens 0..p, so a shared
 * prefix has the same entries.) There may be more slots than sequences
 * computed at once (n_cache > n_parallel): the extra KV caches keep more
 * conversations warm between their turns.
 */
#include "worker-cpu/engine.h"
#include "worker-cpu/forward.h"
#include "llm/generate.h"
#include "worker-cpu/embed.h"
#include "worker-cpu/encoder.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "llm/util.h"
#include "llm/clock.h"
#include "llm/limits.h"

#define PREFILL_BUDGET 256     /* prompt tokens per step: bounds a step's latency */
/* Prompt tokens a step when a request scores its prompt (a logits row
 * each): 128 keeps the products at or past every kernel's threshold for
 * the int8 form (sw_i8_min_tokens: 48-128 tokens), where 32 fell below it
 * (measured: docs/perf/cpu.md, "Scoring a prompt"). The rows
 * cost 128 x n_vocab floats, allocated when the first such request comes. */
#define PROMPT_LP_CHUNK 128
#define MAX_QUEUED 4096

typedef struct {
    bool used;
    bool decoding;            /* prompt done; next_tok is the token to evaluate */
    int n_cached;             /* prompt tokens taken from the prefix cache */
    char id[SW_MAX_ID_LEN + 1];
    sw_gen *gen;
    int n_prefilled;          /* prompt tokens already in the KV cache */
    int32_t next_tok;
    uint64_t deadline_ms;
    uint64_t admitted;        /* admission order: older prompts prefill first */
    double worker_s;          /* its share of the steps it was in (sw_usage.worker_seconds) */
} slot;

/* What a slot's KV cache holds: the tokens at positions 0..n-1. It survives
 * the slot's request, for the prefix cache. */
typedef struct {
    int32_t *toks;            /* n_ctx entries */
    int n;
    uint64_t last_used;       /* 1 + admission counter (0: never used): the least recently used goes first */
} kv_history;

typedef struct queued {
    char id[SW_MAX_ID_LEN + 1];
    sw_gen *gen;
    uint64_t deadline_ms;
    struct queued *next;
} queued;

struct sw_cpu_engine {
    sw_model *m;
    sw_ctx *ctx;              /* a decoder's; NULL for an encoder, which has enc */
    sw_enc *enc;
    int n_slots, n_parallel, n_ctx, max_batch;   /* n_slots KV caches, at most n_parallel in use */
    slot *slots;
    kv_history *hist;         /* [n_slots] */
    int *lcp;                 /* [n_slots] scratch: each cache's prefix shared with a prompt */
    bool prefix_cache;
    queued *qhead, *qtail;
    int n_queued;
    uint64_t n_admitted;
    sw_tok_in *batch;
    int *row_slot;            /* logits row -> slot index */
    int *row_pos;             /* logits row -> prompt position it scores, or -1: a row to sample */
    float *logits;            /* [n_parallel][n_vocab]: one row per running slot per step, and
                               * PROMPT_LP_CHUNK more once a request asks for the prompt's log probabilities */
    bool logits_grown;
    uint32_t last_batch;
    uint64_t tokens_generated;
    uint64_t pc_queries, pc_hits;   /* prefix cache, in prompt tokens: looked up, reused */
    /* load() runs on the link thread: it reads only this snapshot, which
     * the compute thread publishes at the end of every submit, cancel and
     * step (publish_load). */
    pthread_mutex_t load_mu;
    sw_load snapshot;
};

static int publish_load(sw_cpu_engine *e);

sw_cpu_engine *sw_cpu_engine_new(sw_model *m, int n_parallel, int n_cache, int n_ctx, char *err, size_t errlen)
{
    if (n_parallel < 1 || n_parallel > 1024) {
        sw_errf(err, errlen, "slots %d out of range (1..1024)", n_parallel);
        return NULL;
    }
    if (n_cache < n_parallel) n_cache = n_parallel;
    if (n_cache > 4096) { sw_errf(err, errlen, "cache slots %d out of range (at most 4096)", n_cache); return NULL; }
    int n_slots = n_cache;
    if (n_ctx <= 0) n_ctx = (int)(m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096);
    sw_cpu_engine *e = calloc(1, sizeof *e);
    if (!e) { sw_errf(err, errlen, "out of memory"); return NULL; }
    pthread_mutex_init(&e->load_mu, NULL);
    e->m = m;
    e->n_slots = n_slots;
    e->n_parallel = n_parallel;
    e->n_ctx = n_ctx;
    e->max_batch = n_parallel + PREFILL_BUDGET;
    /* An encoder computes an input whole, in one batch: the batch holds the longest. */
    if (sw_model_is_encoder(m)) e->enc = sw_enc_new(m, n_ctx, n_ctx > e->max_batch ? n_ctx : e->max_batch, err, errlen);
    else e->ctx = sw_ctx_new(m, n_slots, n_ctx, e->max_batch, err, errlen);
    e->slots = calloc((size_t)n_slots, sizeof *e->slots);
    e->hist = calloc((size_t)n_slots, sizeof *e->hist);
    e->lcp = calloc((size_t)n_slots, sizeof *e->lcp);
    e->prefix_cache = true;
    for (int i = 0; e->hist && i < n_slots; i++)
        if (!(e->hist[i].toks = malloc((size_t)n_ctx * sizeof(int32_t)))) { free(e->hist); e->hist = NULL; }
    e->batch = calloc((size_t)e->max_batch, sizeof *e->batch);
    e->row_slot = calloc((size_t)e->max_batch, sizeof *e->row_slot);
    e->row_pos = calloc((size_t)e->max_batch, sizeof *e->row_pos);
    e->logits = malloc((size_t)n_parallel * m->hp.n_vocab * sizeof(float));
    if (!(e->ctx || e->enc) || !e->slots || !e->hist || !e->lcp || !e->batch || !e->row_slot || !e->row_pos ||
        !e->logits) {
        if (e->ctx || e->enc) sw_errf(err, errlen, "out of memory");
        sw_cpu_engine_free(e);
        return NULL;
    }
    publish_load(e);   /* load() before the first submit sees the slots too */
    return e;
}

int sw_cpu_engine_n_ctx(const sw_cpu_engine *e) { return e->n_ctx; }

void sw_cpu_engine_set_prefix_cache(sw_cpu_engine *e, bool on) { e->prefix_cache = on; }

int sw_cpu_engine_set_kv_type(sw_cpu_engine *e, sw_kv_type t, char *err, size_t errlen)
{
    if (e->ctx) return sw_ctx_set_kv_type(e->ctx, t, err, errlen);
    if (t == SW_KV_F16) return 0;
    sw_errf(err, errlen, "an encoder keeps no KV cache: a %s one does not apply", sw_kv_type_name(t));
    return -1;
}

static void slot_release(slot *s)
{
    if (!s->used) return;
    sw_gen_delete(s->gen);
    memset(s, 0, sizeof *s);
}

void sw_cpu_engine_free(sw_cpu_engine *e)
{
    if (!e) return;
    if (e->slots) for (int i = 0; i < e->n_slots; i++) slot_release(&e->slots[i]);
    for (queued *q = e->qhead, *n; q; q = n) {
        n = q->next;
        sw_gen_delete(q->gen);
        free(q);
    }
    pthread_mutex_destroy(&e->load_mu);
    sw_ctx_free(e->ctx);
    sw_enc_free(e->enc);
    if (e->hist) for (int i = 0; i < e->n_slots; i++) free(e->hist[i].toks);
    free(e->hist);
    free(e->lcp);
    free(e->slots);
    free(e->batch);
    free(e->row_slot);
    free(e->row_pos);
    free(e->logits);
    free(e);
}

static bool id_in_use(const sw_cpu_engine *e, const char *id)
{
    for (int i = 0; i < e->n_slots; i++)
        if (e->slots[i].used && !strcmp(e->slots[i].id, id)) return true;
    for (const queued *q = e->qhead; q; q = q->next)
        if (!strcmp(q->id, id)) return true;
    return false;
}

/* Publishes the figures load() reports, from the compute thread's state.
 * Returns the requests in hand (running + queued), the count step() reports. */
static int publish_load(sw_cpu_engine *e)
{
    uint64_t used_pos = 0;
    uint32_t active = 0;
    for (int i = 0; i < e->n_slots; i++) {
        const slot *s = &e->slots[i];
        if (!s->used) continue;
        active++;
        used_pos += s->decoding ? (uint64_t)sw_gen_next_pos(s->gen) + 1 : (uint64_t)s->n_prefilled;
    }
    sw_load l = {
        .active = active,
        .queued = (uint32_t)e->n_queued,
        .slots = (uint32_t)e->n_parallel,
        .batch_size = e->last_batch,
        .kv_utilization = (float)((double)used_pos / ((double)e->n_parallel * e->n_ctx)),
        .tokens_generated = e->tokens_generated,
        .prefix_cache_queries = e->pc_queries,
        .prefix_cache_hits = e->pc_hits,
    };
    pthread_mutex_lock(&e->load_mu);
    e->snapshot = l;
    pthread_mutex_unlock(&e->load_mu);
    return (int)active + e->n_queued;
}

static int engine_submit(void *eng, const Spillway__GenerateRequest *req, char *err, size_t errlen)
{
    sw_cpu_engine *e = eng;
    if (!req->request_id || !req->request_id[0] || strlen(req->request_id) > SW_MAX_ID_LEN) {
        sw_errf(err, errlen, "missing or too long request id");
        return 400;
    }
    if (id_in_use(e, req->request_id)) {
        sw_errf(err, errlen, "request id '%s' is already in use", req->request_id);
        return 400;
    }
    if (sw_model_is_embedding(e->m)) {
        sw_errf(err, errlen, "model '%s' is an embedding model: it serves /v1/embeddings only", req->model);
        return 400;
    }
    if (e->n_queued >= MAX_QUEUED) {
        sw_errf(err, errlen, "queue full (%d requests waiting)", e->n_queued);
        return 503;
    }
    queued *q = calloc(1, sizeof *q);
    if (!q) { sw_errf(err, errlen, "out of memory"); return 503; }
    /* Tokenize and validate now, so a bad request fails at once, not when a
     * slot frees up. */
    if (!(q->gen = sw_gen_from_wire(e->m->tok, e->m->chat, req, e->n_ctx, err, errlen))) { free(q); return 400; }
    if (sw_gen_scores_prompt(q->gen) && !e->logits_grown) {   /* rows for the prompt's positions */
        float *l = realloc(e->logits, (size_t)(e->n_parallel + PROMPT_LP_CHUNK) * e->m->hp.n_vocab * sizeof *l);
        if (!l) { sw_gen_delete(q->gen); free(q); sw_errf(err, errlen, "out of memory"); return 503; }
        e->logits = l;
        e->logits_grown = true;
    }
    snprintf(q->id, sizeof q->id, "%s", req->request_id);
    q->deadline_ms = req->deadline_unix_ms;
    if (e->qtail) e->qtail->next = q; else e->qhead = q;
    e->qtail = q;
    e->n_queued++;
    publish_load(e);
    return 0;
}

static void engine_cancel(void *eng, const char *request_id)
{
    sw_cpu_engine *e = eng;
    for (int i = 0; i < e->n_slots; i++) {
        if (e->slots[i].used && !strcmp(e->slots[i].id, request_id)) {
            slot_release(&e->slots[i]);
            publish_load(e);
            return;
        }
    }
    for (queued **pp = &e->qhead; *pp; pp = &(*pp)->next) {
        queued *q = *pp;
        if (strcmp(q->id, request_id)) continue;
        *pp = q->next;
        if (e->qtail == q) {
            e->qtail = NULL;
            for (queued *t = e->qhead; t; t = t->next) e->qtail = t;
        }
        e->n_queued--;
        sw_gen_delete(q->gen);
        free(q);
        break;
    }
    publish_load(e);
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
    int n = 0;
    while (n < na && n < nb && a[n] == b[n]) n++;
    return n;
}

/* The free slot for a prompt, given e->lcp. One whose cache is mostly a
 * prefix of the prompt (the same conversation a turn later, or the same
 * prompt) is reused in place. Otherwise the least recently used free slot:
 * reusing a slot for a short shared prefix would throw away the rest of its
 * cache, and a copy of that prefix (below) is cheap. -1 if no slot is free. */
static int pick_slot(const sw_cpu_engine *e)
{
    int in_place = -1, in_place_len = 0, lru = -1;
    for (int i = 0; i < e->n_slots; i++) {
        if (e->slots[i].used) continue;
        int len = e->lcp[i];
        if (len > in_place_len && 2 * len >= e->hist[i].n) { in_place = i; in_place_len = len; }
        if (lru < 0 || e->hist[i].last_used < e->hist[lru].last_used) lru = i;
    }
    return in_place >= 0 ? in_place : lru;
}

/* Moves queued requests into free slots (FIFO) while fewer than n_parallel
 * run. The KV cache of a slot needs no clearing: a sequence only ever reads
 * positions it has written, or, from the prefix cache, entries computed
 * from the same tokens. */
static void admit(sw_cpu_engine *e)
{
    int active = 0;
    for (int i = 0; i < e->n_slots; i++) active += e->slots[i].used;
    for (; e->qhead && active < e->n_parallel; active++) {
        int n_prompt;
        const int32_t *prompt = sw_gen_prompt(e->qhead->gen, &n_prompt);
        for (int j = 0; j < e->n_slots; j++)
            e->lcp[j] = e->prefix_cache ? common_prefix(e->hist[j].toks, e->hist[j].n, prompt, n_prompt) : 0;
        int i = pick_slot(e);
        if (i < 0) break;
        /* The longest cached prefix anywhere, running sequences included
         * (what they hold was computed in earlier steps); at least the last
         * prompt token is evaluated, since its logits give the first token. */
        int own = e->lcp[i], src = i, reuse = own;
        for (int j = 0; j < e->n_slots; j++)
            if (e->lcp[j] > reuse) { src = j; reuse = e->lcp[j]; }
        if (reuse > n_prompt - 1) reuse = n_prompt - 1;
        if (sw_gen_scores_prompt(e->qhead->gen)) reuse = 0;   /* every prompt position is scored, so computed */
        if (own > reuse) own = reuse;
        /* A sliding-window layer keeps only recent positions: a cache that
         * has moved past the window before `reuse` cannot resume there. */
        if (!sw_ctx_can_resume(e->ctx, e->hist[src].n, reuse)) {
            src = i;
            reuse = own;
            if (!sw_ctx_can_resume(e->ctx, e->hist[i].n, reuse)) reuse = own = 0;
        }
        if (reuse > own) {   /* from another slot: copy the entries this one lacks */
            sw_ctx_copy_kv(e->ctx, src, i, own, reuse);
            memcpy(e->hist[i].toks + own, e->hist[src].toks + own, (size_t)(reuse - own) * sizeof(int32_t));
        }
        slot *s = &e->slots[i];
        queued *q = e->qhead;
        e->qhead = q->next;
        if (!e->qhead) e->qtail = NULL;
        e->n_queued--;
        memset(s, 0, sizeof *s);
        s->used = true;
        memcpy(s->id, q->id, sizeof s->id);
        s->gen = q->gen;          /* the slot takes the generator over */
        s->deadline_ms = q->deadline_ms;
        s->admitted = e->n_admitted++;
        s->n_cached = s->n_prefilled = reuse;
        e->pc_queries += (uint64_t)n_prompt;
        e->pc_hits += (uint64_t)reuse;
        e->hist[i].n = reuse;
        e->hist[i].last_used = s->admitted + 1;   /* 0: never used, the first to go */
        free(q);
    }
}

static void expire(sw_cpu_engine *e, sw_fail_fn fail, void *ctx)
{
    uint64_t now = 0;
    for (int i = 0; i < e->n_slots; i++) {
        slot *s = &e->slots[i];
        if (!s->used || !s->deadline_ms) continue;
        if (!now) now = sw_wall_ms();
        if (now >= s->deadline_ms) {
            fail(ctx, s->id, 504, "deadline exceeded");
            slot_release(s);
        }
    }
    for (queued **pp = &e->qhead; *pp;) {
        queued *q = *pp;
        if (q->deadline_ms) {
            if (!now) now = sw_wall_ms();
            if (now >= q->deadline_ms) {
                fail(ctx, q->id, 504, "deadline exceeded while queued");
                *pp = q->next;
                e->n_queued--;
                sw_gen_delete(q->gen);
                free(q);
                continue;
            }
        }
        pp = &q->next;
    }
    e->qtail = NULL;
    for (queued *t = e->qhead; t; t = t->next) e->qtail = t;
}

/* The oldest sequence still in prefill, or -1. */
static int oldest_prefill(const sw_cpu_engine *e)
{
    int best = -1;
    for (int i = 0; i < e->n_slots; i++) {
        const slot *s = &e->slots[i];
        if (s->used && !s->decoding && s->n_prefilled < sw_gen_n_prompt(s->gen) &&
            (best < 0 || s->admitted < e->slots[best].admitted))
            best = i;
    }
    return best;
}

/* Adds up to *budget prompt tokens of slot i to the batch (at most *lp_rows
 * of them when its prompt positions are scored, each giving a row). false
 * when the slot's prompt is not done: the step has no room for more. */
static bool add_prefill(sw_cpu_engine *e, int i, int *n, int *rows, int *budget, int *lp_rows)
{
    slot *s = &e->slots[i];
    int n_prompt;
    const int32_t *prompt = sw_gen_prompt(s->gen, &n_prompt);
    int chunk = n_prompt - s->n_prefilled;
    if (chunk > *budget) chunk = *budget;
    if (sw_gen_scores_prompt(s->gen)) {
        if (chunk > *lp_rows) chunk = *lp_rows;
        if (chunk == 0) return false;
        *lp_rows -= chunk;
    }
    for (int k = 0; k < chunk; k++) {
        int p = s->n_prefilled + k;
        bool last = p == n_prompt - 1, scored = sw_gen_wants_prompt_row(s->gen, p);
        e->batch[(*n)++] = (sw_tok_in){ .token = prompt[p], .pos = p, .seq = i, .logits = last || scored };
        if (last || scored) {
            e->row_pos[*rows] = last ? -1 : p;
            e->row_slot[(*rows)++] = i;
        }
        e->hist[i].toks[p] = prompt[p];
    }
    s->n_prefilled += chunk;
    e->hist[i].n = s->n_prefilled;
    *budget -= chunk;
    return s->n_prefilled == n_prompt;
}

/* Fills the batch: decode tokens first, then prompt chunks. Returns its size;
 * *n_rows = logits rows it will produce (row_slot maps them to slots). */
static int build_batch(sw_cpu_engine *e, int *n_rows, uint32_t *n_decode)
{
    int n = 0, rows = 0;
    *n_decode = 0;
    for (int i = 0; i < e->n_slots; i++) {
        slot *s = &e->slots[i];
        if (!s->used || !s->decoding) continue;
        int pos = sw_gen_next_pos(s->gen);
        e->batch[n++] = (sw_tok_in){ .token = s->next_tok, .pos = pos, .seq = i, .logits = true };
        e->row_pos[rows] = -1;
        e->row_slot[rows++] = i;
        e->hist[i].toks[pos] = s->next_tok;
        e->hist[i].n = pos + 1;
        (*n_decode)++;
    }
    int budget = PREFILL_BUDGET, lp_rows = PROMPT_LP_CHUNK;   /* the extra logits rows, shared */
    /* A slot whose prompt is not complete stays in prefill; it is no longer
     * "oldest unfinished" only when done, so the loop moves on. */
    for (int best; budget > 0 && (best = oldest_prefill(e)) >= 0;)
        if (!add_prefill(e, best, &n, &rows, &budget, &lp_rows)) break;
    *n_rows = rows;
    return n;
}

/* Samples slot s's next token from its row and emits it. */
static void sample_row(sw_cpu_engine *e, int si, float *row, sw_emit_fn emit, sw_fail_fn fail, void *ectx)
{
    slot *s = &e->slots[si];
    int32_t tok = sw_gen_sample(s->gen, row, (int32_t)e->m->hp.n_vocab);
    if (tok < 0) {
        fail(ectx, s->id, 500, sw_gen_error(s->gen));
        e->hist[si].n = 0;   /* never reuse a cache that made NaN */
        slot_release(s);
        return;
    }
    sw_out o = { 0 };
    size_t dlen;
    int fin = sw_gen_accept(s->gen, tok, &o.text, &dlen);
    o.reasoning = sw_gen_reasoning(s->gen, NULL);
    o.calls = sw_gen_tool_calls(s->gen, &o.n_calls);
    o.logprob = sw_gen_logprob(s->gen);
    if (sw_gen_n_generated(s->gen) == 1)   /* the prompt's, ahead of the first token */
        o.prompt_logprobs = sw_gen_prompt_logprobs(s->gen, &o.n_prompt_logprobs);
    e->tokens_generated++;
    uint32_t id = (uint32_t)tok;
    emit(ectx, s->id, &o, &id, 1, fin,
         &(sw_usage){ .prompt_tokens = (uint32_t)sw_gen_n_prompt(s->gen),
                      .completion_tokens = sw_gen_n_generated(s->gen), .cached_tokens = (uint32_t)s->n_cached,
                      .reasoning_tokens = sw_gen_n_reasoning_tokens(s->gen), .worker_seconds = s->worker_s });
    if (fin) {
        slot_release(s);
    } else {
        s->next_tok = tok;
        s->decoding = true;
    }
}

/* Runs the batch; then each row scores a prompt position or gives a token. */
static void run_batch(sw_cpu_engine *e, int n, int n_rows, uint32_t n_decode, sw_emit_fn emit, sw_fail_fn fail,
                      void *ectx)
{
    char err[256];
    double t0 = sw_clock_s();
    if (sw_forward(e->ctx, e->batch, n, e->logits, err, sizeof err)) {
        /* Cannot happen for validated requests; fail what was in the batch. */
        for (int i = 0; i < e->n_slots; i++) {
            e->hist[i].n = 0;    /* what the caches hold is unknown now */
            if (!e->slots[i].used) continue;
            fail(ectx, e->slots[i].id, 500, err);
            slot_release(&e->slots[i]);
        }
        return;
    }
    e->last_batch = n_decode;
    /* The step's time, shared by the tokens each sequence put in it: a
     * decode token's share, or a prefill chunk's. */
    double share = (sw_clock_s() - t0) / n;
    for (int k = 0; k < n; k++) e->slots[e->batch[k].seq].worker_s += share;
    const uint32_t V = e->m->hp.n_vocab;
    for (int r = 0; r < n_rows; r++) {
        slot *s = &e->slots[e->row_slot[r]];
        if (!s->used) continue;   /* failed at an earlier row of this step */
        if (e->row_pos[r] >= 0)
            sw_gen_prompt_logprob(s->gen, e->row_pos[r], e->logits + (size_t)r * V, (int32_t)V);
        else
            sample_row(e, e->row_slot[r], e->logits + (size_t)r * V, emit, fail, ectx);
    }
}

static int engine_step(void *eng, sw_emit_fn emit, sw_fail_fn fail, void *ectx)
{
    sw_cpu_engine *e = eng;
    expire(e, fail, ectx);
    admit(e);

    int n_rows;
    uint32_t n_decode;
    int n = build_batch(e, &n_rows, &n_decode);
    if (n == 0) e->last_batch = 0;
    if (n > 0) run_batch(e, n, n_rows, n_decode, emit, fail, ectx);
    /* Admit now too, so load() right after a finishing step is accurate and
     * the next step starts with full slots. */
    admit(e);
    return publish_load(e);
}

/* Link thread: the snapshot only (see sw_engine_ops). */
static void engine_load(void *eng, sw_load *out)
{
    sw_cpu_engine *e = eng;
    pthread_mutex_lock(&e->load_mu);
    *out = e->snapshot;
    pthread_mutex_unlock(&e->load_mu);
}

/* ---- embeddings ----------------------------------------------------------- */
/* The wire's inputs as token lists (text tokenized here); *toks owns the
 * tokenized ones. Returns 0, or 400 with err filled. */
static int embed_inputs(const sw_cpu_engine *e, const Spillway__EmbedRequest *req, sw_embed_input *in,
                        int32_t **toks, char *err, size_t errlen)
{
    const int32_t V = (int32_t)e->m->hp.n_vocab;
    for (size_t i = 0; i < req->n_inputs; i++) {
        const Spillway__EmbedInput *x = req->inputs[i];
        if (x->n_tokens) {
            if (!(toks[i] = malloc(x->n_tokens * sizeof **toks))) return sw_errf(err, errlen, "out of memory"), 503;
            for (size_t k = 0; k < x->n_tokens; k++) {
                if (x->tokens[k] >= (uint32_t)V)
                    return sw_errf(err, errlen, "input %zu: token id %u is not in the vocabulary (%d)", i,
                                   x->tokens[k], V), 400;
                toks[i][k] = (int32_t)x->tokens[k];
            }
            in[i] = (sw_embed_input){ toks[i], (int)x->n_tokens };
        } else {
            int n = sw_embed_tokenize(e->m, x->text, &toks[i], err, errlen);
            if (n < 0) return 503;
            if (n == 0) return sw_errf(err, errlen, "input %zu has no tokens", i), 400;
            in[i] = (sw_embed_input){ toks[i], n };
        }
        if (in[i].n > e->n_ctx)
            return sw_errf(err, errlen, "input %zu has %d tokens, more than the model's context of %d", i, in[i].n,
                           e->n_ctx), 400;
        /* The gateway counts token-id inputs against the limit; a text's
         * tokens are known only here. */
        if (in[i].n > SW_MAX_EMBED_INPUT_TOKENS)
            return sw_errf(err, errlen, "input %zu has %d tokens; at most %d are allowed", i, in[i].n,
                           SW_MAX_EMBED_INPUT_TOKENS), 400;
    }
    return 0;
}

/* The KV sequences no request holds; their caches are given up (their
 * prefix-cache history forgotten). An embedding model runs no generation,
 * so normally every slot is free. */
static int free_seqs(sw_cpu_engine *e, int *seqs)
{
    int n = 0;
    for (int i = 0; i < e->n_slots; i++) {
        if (e->slots[i].used) continue;
        e->hist[i].n = 0;
        seqs[n++] = i;
    }
    return n;
}

static int engine_embed(void *eng, const Spillway__EmbedRequest *req, sw_embeddings *out, char *err, size_t errlen)
{
    sw_cpu_engine *e = eng;
    if (!sw_model_is_embedding(e->m))
        return sw_errf(err, errlen, "model '%s' is not an embedding model (no pooling type in its file)", req->model),
               400;
    size_t n = req->n_inputs, dim = e->m->hp.n_embd;
    if (n * dim > SW_MAX_EMBED_VALUES)   /* the reply would not fit a frame; the gateway knows it too */
        return sw_errf(err, errlen, "%zu inputs of %zu dimensions: at most %zu a request", n, dim,
                       SW_MAX_EMBED_VALUES / dim), 400;
    sw_embed_input *in = calloc(n, sizeof *in);
    int32_t **toks = calloc(n, sizeof *toks);
    int *seqs = malloc((size_t)e->n_slots * sizeof *seqs);
    memset(out, 0, sizeof *out);
    out->values = malloc(n * dim * sizeof *out->values);
    out->tokens = malloc(n * sizeof *out->tokens);
    int code = in && toks && seqs && out->values && out->tokens ? 0 : (sw_errf(err, errlen, "out of memory"), 503);
    if (!code) code = embed_inputs(e, req, in, toks, err, errlen);
    int n_seq = code ? 0 : free_seqs(e, seqs);
    if (!code && !n_seq) code = (sw_errf(err, errlen, "no free sequence: the worker is busy"), 503);
    if (!code && (e->enc ? sw_enc_embed(e->enc, in, (int)n, out->values, err, errlen)
                         : sw_embed_batch(e->ctx, seqs, n_seq, in, (int)n, out->values, err, errlen)))
        code = 400;
    for (size_t i = 0; !code && i < n; i++) out->tokens[i] = (uint32_t)in[i].n;
    out->n = (uint32_t)n;
    out->dim = (uint32_t)dim;
    for (size_t i = 0; toks && i < n; i++) free(toks[i]);
    free(toks);
    free(in);
    free(seqs);
    if (code) {
        free(out->values);
        free(out->tokens);
        memset(out, 0, sizeof *out);
    }
    return code;
}

const sw_engine_ops sw_cpu_engine_ops = {
    .embed = engine_embed,
    .submit = engine_submit,
    .cancel = engine_cancel,
    .step = engine_step,
    .load = engine_load,
};
