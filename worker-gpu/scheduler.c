/* Continuous batching with chunked prefill and a preempting KV block
 * allocator with a prefix cache; see scheduler.h for the policy. */
#include "worker-gpu/scheduler.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "llm/generate.h"
#include "llm/util.h"
#include "llm/clock.h"

typedef struct {
    char id[SW_MAX_ID_LEN + 1];
    sw_gen *gen;
    int32_t *toks;            /* prompt, then generated tokens */
    int n_toks, cap_toks;
    int n_computed;           /* tokens whose K/V are in the cache */
    int32_t *blocks;          /* KV blocks, one per 16 positions */
    int n_blocks;
    int n_hashed;             /* full blocks hashed (and offered to the cache) so far */
    uint64_t chain;           /* the chain hash of the last of them (prefix cache) */
    int n_cached;             /* prompt tokens taken from the cache at first admission */
    bool admitted_once;
    uint64_t arrival;         /* admission order: larger = newer */
    uint64_t deadline_ms;     /* 0 = none */
    uint64_t rng;             /* for device-side sampling draws */
    bool dev_sample_ok;       /* parameters the device sampler implements */
    int chunk;                /* tokens scheduled in the current step */
    double worker_s;          /* its share of the steps it was in (sw_usage.worker_seconds) */
} seq;

struct sw_gpu_engine {
    const sw_model *m;
    sw_backend *be;
    sw_sched_config cfg;
    int n_ctx, max_blocks;    /* per sequence */
    seq **running; int n_running;
    seq **waiting; int n_waiting, cap_waiting;   /* sorted by arrival */
    /* KV blocks. ref: how many sequences hold each. A block nobody holds is
     * on the free list (oldest freed first); if it is a full block in the
     * prefix cache, it keeps its contents there until it is handed out again. */
    int32_t *ref;
    uint64_t *hash;           /* the cached content's chain hash, 0 = none */
    int32_t *fprev, *fnext, fhead, ftail;
    int n_free;
    /* prefix cache: chain hash -> block (open addressing, linear probing) */
    uint64_t *tkey; int32_t *tval; uint32_t tmask;
    bool no_prefix_cache;
    uint64_t next_arrival, preemptions;
    /* step buffers */
    int32_t *b_tok, *b_pos, *b_seq, *b_logits_idx, *b_table, *b_sampled;
    seq **b_seqs;
    float *logits;
    sw_dev_sample *b_sample;
    /* load, read by the link thread */
    pthread_mutex_t mu;
    sw_load load;
    uint32_t batch_max_since_read;
    uint64_t pc_queries, pc_hits;   /* prefix cache, in prompt tokens: looked up, reused (compute thread) */
    double last_log;
    int log_peak, log_steps_n;      /* since the last log line */
};

static int blocks_for(int n_tokens) { return (n_tokens + SW_KV_BLOCK - 1) / SW_KV_BLOCK; }

/* ---- the free list ---- */

static void free_push(sw_gpu_engine *e, int32_t b)
{
    e->fprev[b] = e->ftail;
    e->fnext[b] = -1;
    if (e->ftail >= 0) e->fnext[e->ftail] = b; else e->fhead = b;
    e->ftail = b;
    e->n_free++;
}

static void free_unlink(sw_gpu_engine *e, int32_t b)
{
    if (e->fprev[b] >= 0) e->fnext[e->fprev[b]] = e->fnext[b]; else e->fhead = e->fnext[b];
    if (e->fnext[b] >= 0) e->fprev[e->fnext[b]] = e->fprev[b]; else e->ftail = e->fprev[b];
    e->n_free--;
}

/* ---- the prefix cache ----
 * A full block is named by the hash of its 16 tokens chained with the hash
 * of the block before it, so equal names mean equal token prefixes, hence
 * equal K/V (vLLM's automatic prefix caching works the same way). */

static uint64_t chain_hash(uint64_t prev, const int32_t *toks)
{
    uint64_t h = prev ^ 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < SW_KV_BLOCK; i++) {
        h ^= (uint32_t)toks[i];
        h = sw_splitmix64(&h);
    }
    return h | 1;   /* 0 means "none" */
}

static int32_t table_get(const sw_gpu_engine *e, uint64_t key)
{
    for (uint32_t i = (uint32_t)key & e->tmask;; i = (i + 1) & e->tmask) {
        if (e->tkey[i] == key) return e->tval[i];
        if (!e->tkey[i]) return -1;
    }
}

static void table_put(sw_gpu_engine *e, uint64_t key, int32_t b)
{
    uint32_t i = (uint32_t)key & e->tmask;
    while (e->tkey[i]) i = (i + 1) & e->tmask;
    e->tkey[i] = key;
    e->tval[i] = b;
}

/* Deletes key, shifting later entries of its probe run back (no tombstones). */
static void table_del(sw_gpu_engine *e, uint64_t key)
{
    uint32_t i = (uint32_t)key & e->tmask;
    while (e->tkey[i] != key) {
        if (!e->tkey[i]) return;
        i = (i + 1) & e->tmask;
    }
    for (uint32_t j = i;;) {
        e->tkey[i] = 0;
        for (;;) {
            j = (j + 1) & e->tmask;
            if (!e->tkey[j]) return;
            uint32_t home = (uint32_t)e->tkey[j] & e->tmask;
            /* move j back to i unless its home lies cyclically in (i, j] */
            if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) break;
        }
        e->tkey[i] = e->tkey[j];
        e->tval[i] = e->tval[j];
        i = j;
    }
}

/* Offers s's newly completed blocks to the cache. A block whose content is
 * cached already (another sequence computed it too) stays private. */
static void cache_full_blocks(sw_gpu_engine *e, seq *s)
{
    while ((s->n_hashed + 1) * SW_KV_BLOCK <= s->n_computed && s->n_hashed < s->n_blocks) {
        int j = s->n_hashed;
        uint64_t h = s->chain = chain_hash(j ? s->chain : 0, s->toks + (size_t)j * SW_KV_BLOCK);
        int32_t b = s->blocks[j];
        if (!e->no_prefix_cache && !e->hash[b] && table_get(e, h) < 0) {
            table_put(e, h, b);
            e->hash[b] = h;
        }
        s->n_hashed++;
    }
}

/* A sequence about to compute from position 0 takes the cached blocks of
 * its longest cached prefix, short of its last token (whose logits it needs,
 * and whose block it will write). */
static void take_cached_prefix(sw_gpu_engine *e, seq *s)
{
    if (e->no_prefix_cache || s->n_blocks) return;
    int limit = (s->n_toks - 1) / SW_KV_BLOCK, j = 0;
    for (; j < limit; j++) {
        uint64_t h = chain_hash(j ? s->chain : 0, s->toks + (size_t)j * SW_KV_BLOCK);
        int32_t b = table_get(e, h);
        if (b < 0) break;
        if (e->ref[b]++ == 0) free_unlink(e, b);
        s->blocks[s->n_blocks++] = b;
        s->chain = h;
    }
    s->n_hashed = j;
    s->n_computed = j * SW_KV_BLOCK;
}

/* ---- sequences and blocks ---- */

static void release_blocks(sw_gpu_engine *e, seq *s)
{
    for (int i = 0; i < s->n_blocks; i++)
        if (--e->ref[s->blocks[i]] == 0) free_push(e, s->blocks[i]);
    s->n_blocks = 0;
    s->n_computed = 0;
    s->n_hashed = 0;
}

static void seq_free(sw_gpu_engine *e, seq *s)
{
    release_blocks(e, s);
    sw_gen_delete(s->gen);
    free(s->toks);
    free(s->blocks);
    free(s);
}

/* Gives s blocks to hold positions 0..n_pos-1. Returns false if the pool ran out. */
static bool grow_blocks(sw_gpu_engine *e, seq *s, int n_pos)
{
    int need = blocks_for(n_pos);
    while (s->n_blocks < need) {
        if (e->n_free == 0) return false;
        int32_t b = e->fhead;   /* the longest free: its cached content is the least recently used */
        free_unlink(e, b);
        if (e->hash[b]) { table_del(e, e->hash[b]); e->hash[b] = 0; }
        e->ref[b] = 1;
        s->blocks[s->n_blocks++] = b;
    }
    return true;
}

static void waiting_insert(sw_gpu_engine *e, seq *s)
{
    int i = e->n_waiting;
    while (i > 0 && e->waiting[i - 1]->arrival > s->arrival) {
        e->waiting[i] = e->waiting[i - 1];
        i--;
    }
    e->waiting[i] = s;
    e->n_waiting++;
}

static void running_remove_at(sw_gpu_engine *e, int i)
{
    memmove(&e->running[i], &e->running[i + 1], (size_t)(e->n_running - i - 1) * sizeof(seq *));
    e->n_running--;
}

/* Preempts the newest running sequence: its blocks go back to the pool and
 * it waits to be recomputed from its tokens. Returns it. */
static seq *preempt_newest(sw_gpu_engine *e)
{
    seq *s = e->running[e->n_running - 1];   /* running is sorted by arrival */
    e->n_running--;
    release_blocks(e, s);
    waiting_insert(e, s);
    e->preemptions++;
    if (e->cfg.log_steps)
        fprintf(stderr, "sched: preempted %s (%d tokens to recompute), %d blocks free\n",
                s->id, s->n_toks, e->n_free);
    return s;
}

/* ---- ops ---- */

static void publish_load(sw_gpu_engine *e, int batch_seqs, int sampled);

/* A sequence for the request, with its generator; NULL with err filled. */
static seq *seq_new(sw_gpu_engine *e, const Spillway__GenerateRequest *req, char *err, size_t errlen)
{
    seq *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, errlen, "out of memory"); return NULL; }
    if (!(s->gen = sw_gen_from_wire(e->m->tok, e->m->chat, req, e->n_ctx, err, errlen))) { free(s); return NULL; }
    int n_prompt;
    const int32_t *prompt = sw_gen_prompt(s->gen, &n_prompt);
    s->cap_toks = e->n_ctx + 1;
    s->toks = malloc((size_t)s->cap_toks * sizeof(int32_t));
    s->blocks = malloc((size_t)e->max_blocks * sizeof(int32_t));
    if (!s->toks || !s->blocks || n_prompt > e->n_ctx - 1) {
        if (s->toks && s->blocks)
            snprintf(err, errlen, "prompt of %d tokens leaves no room to generate in the context of %d",
                     n_prompt, e->n_ctx);
        else
            snprintf(err, errlen, "out of memory");
        sw_gen_delete(s->gen);
        free(s->toks); free(s->blocks); free(s);
        return NULL;
    }
    snprintf(s->id, sizeof s->id, "%s", req->request_id);
    memcpy(s->toks, prompt, (size_t)n_prompt * sizeof(int32_t));
    s->n_toks = n_prompt;
    s->deadline_ms = req->deadline_unix_ms;
    s->rng = sw_gen_sampling(s->gen)->seed ^ 0x5DEECE66Dull;
    s->dev_sample_ok = sw_gen_sampling_is_plain(s->gen, (int32_t)e->be->hp.n_vocab);
    return s;
}

static int engine_submit(void *eng, const Spillway__GenerateRequest *req, char *err, size_t errlen)
{
    sw_gpu_engine *e = eng;
    if (!req->request_id || !req->request_id[0] || strlen(req->request_id) > SW_MAX_ID_LEN) {
        snprintf(err, errlen, "missing or oversized request id");
        return 400;
    }
    if (e->cfg.model_name && req->model && req->model[0] && strcmp(req->model, e->cfg.model_name)) {
        snprintf(err, errlen, "model '%s' is not served by this worker", req->model);
        return 404;
    }
    if (e->n_waiting >= e->cfg.max_queue) {
        snprintf(err, errlen, "queue full (%d waiting)", e->n_waiting);
        return 503;
    }
    if (req->prompt_logprobs) {   /* the CPU worker's engine scores every prompt position; this one does not */
        snprintf(err, errlen, "the GPU worker does not compute the prompt's log probabilities (echo with logprobs)");
        return 400;
    }
    seq *s = seq_new(e, req, err, errlen);
    if (!s) return 400;
    s->arrival = e->next_arrival++;
    waiting_insert(e, s);
    publish_load(e, -1, 0);
    return 0;
}

static void engine_cancel(void *eng, const char *request_id)
{
    sw_gpu_engine *e = eng;
    seq *s = NULL;
    for (int i = 0; !s && i < e->n_running; i++)
        if (!strcmp(e->running[i]->id, request_id)) {
            s = e->running[i];
            running_remove_at(e, i);
        }
    for (int i = 0; !s && i < e->n_waiting; i++)
        if (!strcmp(e->waiting[i]->id, request_id)) {
            s = e->waiting[i];
            memmove(&e->waiting[i], &e->waiting[i + 1], (size_t)(e->n_waiting - i - 1) * sizeof(seq *));
            e->n_waiting--;
        }
    if (!s) return;
    seq_free(e, s);
    publish_load(e, -1, 0);
}

/* The figures load() reports, at the end of every submit, cancel and step
 * (compute thread). batch_seqs: the step's batch, -1 for no step. */
static void publish_load(sw_gpu_engine *e, int batch_seqs, int sampled)
{
    pthread_mutex_lock(&e->mu);
    e->load.active = (uint32_t)e->n_running;
    e->load.queued = (uint32_t)e->n_waiting;
    e->load.kv_utilization = 1.0f - (float)e->n_free / (float)e->be->n_kv_blocks;
    if (batch_seqs >= 0) e->load.batch_size = (uint32_t)batch_seqs;
    if (batch_seqs > 0 && (uint32_t)batch_seqs > e->batch_max_since_read) e->batch_max_since_read = (uint32_t)batch_seqs;
    e->load.tokens_generated += (uint64_t)sampled;
    e->load.prefix_cache_queries = e->pc_queries;
    e->load.prefix_cache_hits = e->pc_hits;
    pthread_mutex_unlock(&e->mu);
}

/* Link thread: the snapshot only (see sw_engine_ops). */
static void engine_load(void *eng, sw_load *out)
{
    sw_gpu_engine *e = eng;
    pthread_mutex_lock(&e->mu);
    *out = e->load;
    /* The largest batch since the last report: a heartbeat that lands between
     * two steps still shows how many sequences the steps carried. */
    if (e->batch_max_since_read > out->batch_size) out->batch_size = e->batch_max_since_read;
    e->batch_max_since_read = 0;
    pthread_mutex_unlock(&e->mu);
}

/* Drops requests whose deadline has passed. */
static void expire(sw_gpu_engine *e, sw_fail_fn fail, void *ctx)
{
    uint64_t now = 0;
    for (int pass = 0; pass < 2; pass++) {
        seq **list = pass ? e->waiting : e->running;
        int *n = pass ? &e->n_waiting : &e->n_running;
        for (int i = 0; i < *n; i++) {
            seq *s = list[i];
            if (!s->deadline_ms) continue;
            if (!now) now = sw_wall_ms();
            if (now < s->deadline_ms) continue;
            fail(ctx, s->id, 504, "deadline exceeded");
            memmove(&list[i], &list[i + 1], (size_t)(*n - i - 1) * sizeof(seq *));
            (*n)--;
            i--;
            seq_free(e, s);
        }
    }
}

static void admit(sw_gpu_engine *e)
{
    while (e->n_waiting > 0 && e->n_running < e->cfg.max_batch) {
        seq *s = e->waiting[0];
        /* Room for all its tokens plus one block of headroom; with nothing
         * running, admit anyway so the oldest request always makes progress. */
        int need = blocks_for(s->n_toks) + 1;
        if (e->n_running > 0 && e->n_free < need) break;
        memmove(&e->waiting[0], &e->waiting[1], (size_t)(e->n_waiting - 1) * sizeof(seq *));
        e->n_waiting--;
        take_cached_prefix(e, s);
        if (!s->admitted_once) {   /* usage counts the first admission, not a recompute */
            int n_prompt = sw_gen_n_prompt(s->gen);
            s->n_cached = s->n_computed < n_prompt ? s->n_computed : n_prompt;
            s->admitted_once = true;
            e->pc_queries += (uint64_t)n_prompt;   /* read by publish_load, on this thread */
            e->pc_hits += (uint64_t)s->n_cached;
        }
        /* keep running sorted by arrival (a recomputed request is older than newcomers) */
        int i = e->n_running;
        while (i > 0 && e->running[i - 1]->arrival > s->arrival) {
            e->running[i] = e->running[i - 1];
            i--;
        }
        e->running[i] = s;
        e->n_running++;
    }
}

/* Picks each running sequence's chunk for this step. Returns tokens scheduled. */
static int plan(sw_gpu_engine *e)
{
    int budget = e->cfg.max_tokens_per_step, total = 0;
    for (int i = 0; i < e->n_running; i++) e->running[i]->chunk = 0;
    /* decode first: one token each, preempting the newest when blocks run out */
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        seq *s = e->running[i];
        if (s->n_toks - s->n_computed != 1) continue;
        while (!grow_blocks(e, s, s->n_computed + 1)) {
            seq *victim = preempt_newest(e);
            if (victim == s) break;
        }
        if (i >= e->n_running || e->running[i] != s) break;   /* s itself was preempted: it was the newest */
        s->chunk = 1;
        budget--;
        total++;
    }
    /* then prefill chunks from the remaining budget, with the blocks that are free */
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        seq *s = e->running[i];
        int pending = s->n_toks - s->n_computed;
        if (pending <= 1 && s->chunk) continue;
        if (pending <= 0 || s->chunk) continue;
        int chunk = pending < budget ? pending : budget;
        if (!grow_blocks(e, s, s->n_computed + chunk)) {
            int room = s->n_blocks * SW_KV_BLOCK - s->n_computed;
            chunk = room < chunk ? room : chunk;
        }
        if (chunk <= 0) continue;
        s->chunk = chunk;
        budget -= chunk;
        total += chunk;
    }
    return total;
}

static void remove_running(sw_gpu_engine *e, seq *s)
{
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i] == s) { running_remove_at(e, i); break; }
    seq_free(e, s);
}

/* One stderr line: the last step, the peak batch since the previous line. */
static void log_line(sw_gpu_engine *e, int n_seqs, int n_tok)
{
    e->last_log = sw_clock_s();
    fprintf(stderr, "sched: batch %d seqs / %d tokens (peak %d over %d steps), running %d, waiting %d, "
            "kv %.0f%%, preempted %llu\n", n_seqs, n_tok, e->log_peak, e->log_steps_n, e->n_running,
            e->n_waiting, 100.0 * (1.0 - (double)e->n_free / e->be->n_kv_blocks),
            (unsigned long long)e->preemptions);
    e->log_peak = 0;
    e->log_steps_n = 0;
}

/* Puts every scheduled chunk into the batch; returns its token count, with
 * *n_seqs and *n_logits. *dev_sample stays true only if every sampled
 * sequence may be sampled on the device. */
static int assemble(sw_gpu_engine *e, int *n_seqs, int *n_logits, bool *dev_sample)
{
    int n = 0;
    *n_seqs = *n_logits = 0;
    for (int i = 0; i < e->n_running; i++) {
        seq *s = e->running[i];
        if (!s->chunk) continue;
        int si = (*n_seqs)++;
        e->b_seqs[si] = s;
        int32_t *row = e->b_table + (size_t)si * e->max_blocks;
        memcpy(row, s->blocks, (size_t)s->n_blocks * sizeof(int32_t));
        for (int j = s->n_blocks; j < e->max_blocks; j++) row[j] = 0;
        for (int k = 0; k < s->chunk; k++) {
            int p = s->n_computed + k;
            e->b_tok[n] = s->toks[p];
            e->b_pos[n] = p;
            e->b_seq[n] = si;
            n++;
        }
        if (s->n_computed + s->chunk != s->n_toks) continue;
        const sw_sampling_params *sp = sw_gen_sampling(s->gen);
        e->b_sample[*n_logits] = (sw_dev_sample){
            .temperature = sp->temperature, .top_p = sp->top_p, .top_k = sp->top_k,
            .uniform = (float)((sw_splitmix64(&s->rng) >> 40) * 0x1p-24),
        };
        e->b_logits_idx[(*n_logits)++] = n - 1;
        if (!s->dev_sample_ok) *dev_sample = false;
    }
    return n;
}

/* Streams the token of sequence s (sampled on the device, or here from
 * row); false when s is done (finished or failed) and removed. */
static bool stream_token(sw_gpu_engine *e, seq *s, int32_t tok, const float *row, sw_emit_fn emit, sw_fail_fn fail,
                         void *ctx)
{
    if (tok < 0) {
        fail(ctx, s->id, 500, sw_gen_error(s->gen));
        remove_running(e, s);
        return false;
    }
    sw_out o = { 0 };
    size_t len = 0;
    int fin = sw_gen_accept(s->gen, tok, &o.text, &len);
    o.reasoning = sw_gen_reasoning(s->gen, NULL);
    o.calls = sw_gen_tool_calls(s->gen, &o.n_calls);
    o.logprob = row ? sw_gen_logprob(s->gen) : NULL;
    if (s->n_toks < s->cap_toks) s->toks[s->n_toks++] = tok;
    uint32_t id = (uint32_t)tok;
    emit(ctx, s->id, &o, &id, 1, fin,
         &(sw_usage){ .prompt_tokens = (uint32_t)sw_gen_n_prompt(s->gen),
                      .completion_tokens = sw_gen_n_generated(s->gen), .cached_tokens = (uint32_t)s->n_cached,
                      .reasoning_tokens = sw_gen_n_reasoning_tokens(s->gen), .worker_seconds = s->worker_s });
    if (fin == SW_FINISH_NONE) return true;
    remove_running(e, s);
    return false;
}

/* After the forward pass: sample, stream, retire. Returns tokens sampled. */
static int retire(sw_gpu_engine *e, int n_seqs, bool dev_sample, sw_emit_fn emit, sw_fail_fn fail, void *ctx)
{
    int li = 0;
    const int32_t V = (int32_t)e->be->hp.n_vocab;
    for (int i = 0; i < n_seqs; i++) {
        seq *s = e->b_seqs[i];
        s->n_computed += s->chunk;
        cache_full_blocks(e, s);
        if (s->n_computed != s->n_toks) continue;
        float *row = dev_sample ? NULL : e->logits + (size_t)li * V;
        int32_t tok = dev_sample ? e->b_sampled[li] : sw_gen_sample(s->gen, row, V);
        li++;
        stream_token(e, s, tok, row, emit, fail, ctx);
    }
    return li;
}

/* A step's wall time, shared by the tokens each sequence put in it (n in
 * all): the cost the gateway charges (sw_usage.worker_seconds). */
static void share_step(sw_gpu_engine *e, int n_seqs, int n, double secs)
{
    for (int i = 0; i < n_seqs && n > 0; i++) e->b_seqs[i]->worker_s += secs * e->b_seqs[i]->chunk / n;
}

/* Schedules this step's chunks; 0 when nothing can run. */
static int schedule(sw_gpu_engine *e)
{
    int n_tok = plan(e);
    /* Every running sequence holding blocks but none free, and nothing could
     * be scheduled: free the newest until the oldest can move. */
    while (n_tok == 0 && e->n_running > 1) {
        preempt_newest(e);
        n_tok = plan(e);
    }
    return n_tok;
}

static int engine_step(void *eng, sw_emit_fn emit, sw_fail_fn fail, void *ctx)
{
    sw_gpu_engine *e = eng;
    expire(e, fail, ctx);
    admit(e);
    if (schedule(e) == 0) {
        publish_load(e, 0, 0);
        return e->n_running + e->n_waiting;
    }
    int n_seqs, n_logits;
    bool dev_sample = e->be->ops->forward_sample != NULL;
    int n = assemble(e, &n_seqs, &n_logits, &dev_sample);
    sw_batch b = {
        .n_tokens = n, .tokens = e->b_tok, .pos = e->b_pos, .seq = e->b_seq,
        .n_seqs = n_seqs, .max_blocks = e->max_blocks, .block_table = e->b_table,
        .n_logits = n_logits, .logits_idx = e->b_logits_idx,
    };
    char err[256] = "";
    dev_sample = dev_sample && n_logits;
    double t0 = sw_clock_s();
    int rc = dev_sample ? e->be->ops->forward_sample(e->be->impl, &b, e->b_sample, e->b_sampled, err, sizeof err)
                        : e->be->ops->forward(e->be->impl, &b, e->logits, err, sizeof err);
    if (rc) {
        fprintf(stderr, "sched: forward failed: %s\n", err);
        for (int i = 0; i < n_seqs; i++) {
            fail(ctx, e->b_seqs[i]->id, 500, err);
            remove_running(e, e->b_seqs[i]);
        }
        publish_load(e, 0, 0);
        return e->n_running + e->n_waiting;
    }
    share_step(e, n_seqs, n, sw_clock_s() - t0);
    int sampled = retire(e, n_seqs, dev_sample, emit, fail, ctx);
    publish_load(e, n_seqs, sampled);
    if (n_seqs > e->log_peak) e->log_peak = n_seqs;
    e->log_steps_n++;
    if (e->cfg.log_steps && (sw_clock_s() - e->last_log >= 1.0 || e->n_running + e->n_waiting == 0))
        log_line(e, n_seqs, n);
    return e->n_running + e->n_waiting;
}

const sw_engine_ops sw_gpu_engine_ops = {
    .submit = engine_submit,
    .cancel = engine_cancel,
    .step = engine_step,
    .load = engine_load,
};

sw_gpu_engine *sw_gpu_engine_new(const sw_model *m, sw_backend *be, const sw_sched_config *cfg,
                                 char *err, size_t errlen)
{
    sw_gpu_engine *e = calloc(1, sizeof *e);
    if (!e) { snprintf(err, errlen, "out of memory"); return NULL; }
    pthread_mutex_init(&e->mu, NULL);
    e->m = m;
    e->be = be;
    e->cfg = *cfg;
    if (e->cfg.max_batch <= 0) e->cfg.max_batch = 64;
    if (e->cfg.max_tokens_per_step <= 0 || e->cfg.max_tokens_per_step > be->max_tokens_per_step)
        e->cfg.max_tokens_per_step = be->max_tokens_per_step;
    if (e->cfg.max_queue <= 0) e->cfg.max_queue = 1024;
    if (e->cfg.max_tokens_per_step < e->cfg.max_batch) e->cfg.max_batch = e->cfg.max_tokens_per_step;
    int64_t ctx = e->cfg.n_ctx > 0 ? e->cfg.n_ctx : (int64_t)be->hp.n_ctx_train;
    if (ctx > (int64_t)be->hp.n_ctx_train) ctx = be->hp.n_ctx_train;
    if (ctx > (int64_t)be->n_kv_blocks * SW_KV_BLOCK) ctx = (int64_t)be->n_kv_blocks * SW_KV_BLOCK;
    if (ctx < 2) {
        snprintf(err, errlen, "KV pool of %u blocks is too small", be->n_kv_blocks);
        pthread_mutex_destroy(&e->mu);
        free(e);
        return NULL;
    }
    e->n_ctx = (int)ctx;
    e->max_blocks = blocks_for(e->n_ctx);
    int B = e->cfg.max_batch, T = e->cfg.max_tokens_per_step;
    e->running = calloc((size_t)B + 1, sizeof(seq *));
    e->cap_waiting = e->cfg.max_queue + B + 1;
    e->waiting = calloc((size_t)e->cap_waiting, sizeof(seq *));
    uint32_t nb = be->n_kv_blocks, tcap = 16;
    while (tcap < 2 * nb) tcap *= 2;   /* load factor <= 1/2 */
    e->ref = calloc(nb, sizeof *e->ref);
    e->hash = calloc(nb, sizeof *e->hash);
    e->fprev = malloc(nb * sizeof *e->fprev);
    e->fnext = malloc(nb * sizeof *e->fnext);
    e->tkey = calloc(tcap, sizeof *e->tkey);
    e->tval = malloc(tcap * sizeof *e->tval);
    e->tmask = tcap - 1;
    e->b_tok = malloc((size_t)T * sizeof(int32_t));
    e->b_pos = malloc((size_t)T * sizeof(int32_t));
    e->b_seq = malloc((size_t)T * sizeof(int32_t));
    e->b_logits_idx = malloc((size_t)T * sizeof(int32_t));
    e->b_sampled = malloc((size_t)T * sizeof(int32_t));
    e->b_sample = malloc((size_t)T * sizeof(sw_dev_sample));
    e->b_seqs = malloc((size_t)B * sizeof(seq *));
    e->b_table = malloc((size_t)B * e->max_blocks * sizeof(int32_t));
    e->logits = malloc((size_t)B * be->hp.n_vocab * sizeof(float));
    if (!e->running || !e->waiting || !e->ref || !e->hash || !e->fprev || !e->fnext || !e->tkey || !e->tval || !e->b_tok || !e->b_pos || !e->b_seq ||
        !e->b_logits_idx || !e->b_sampled || !e->b_sample || !e->b_seqs || !e->b_table || !e->logits) {
        snprintf(err, errlen, "out of memory");
        sw_gpu_engine_free(e);
        return NULL;
    }
    /* lowest block ids handed out first */
    e->fhead = e->ftail = -1;
    for (uint32_t i = 0; i < nb; i++) free_push(e, (int32_t)i);
    e->load.slots = (uint32_t)e->cfg.max_batch;   /* fixed; publish_load keeps the rest current */
    return e;
}

void sw_gpu_engine_free(sw_gpu_engine *e)
{
    if (!e) return;
    for (int i = 0; e->running && i < e->n_running; i++) seq_free(e, e->running[i]);
    for (int i = 0; e->waiting && i < e->n_waiting; i++) seq_free(e, e->waiting[i]);
    free(e->running); free(e->waiting);
    free(e->ref); free(e->hash); free(e->fprev); free(e->fnext); free(e->tkey); free(e->tval);
    free(e->b_tok); free(e->b_pos); free(e->b_seq); free(e->b_logits_idx); free(e->b_sampled);
    free(e->b_sample); free(e->b_seqs); free(e->b_table); free(e->logits);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

int sw_gpu_engine_n_ctx(const sw_gpu_engine *e) { return e->n_ctx; }
void sw_gpu_engine_set_prefix_cache(sw_gpu_engine *e, bool on) { e->no_prefix_cache = !on; }

int sw_gpu_engine_check(const sw_gpu_engine *e, char *err, size_t errlen)
{
#define BAD(...) do { snprintf(err, errlen, __VA_ARGS__); free(held); return -1; } while (0)
    uint32_t nb = e->be->n_kv_blocks;
    int32_t *held = calloc(nb, sizeof *held);
    if (!held) { snprintf(err, errlen, "out of memory"); return -1; }
    for (int i = 0; i < e->n_running; i++)
        for (int j = 0; j < e->running[i]->n_blocks; j++) held[e->running[i]->blocks[j]]++;
    for (int i = 0; i < e->n_waiting; i++)
        if (e->waiting[i]->n_blocks) BAD("waiting %s holds %d blocks", e->waiting[i]->id, e->waiting[i]->n_blocks);
    int listed = 0, prev = -1;
    for (int32_t b = e->fhead; b >= 0; prev = b, b = e->fnext[b]) {
        if (++listed > (int)nb || e->fprev[b] != prev) BAD("free list broken at block %d", b);
        if (e->ref[b] != 0) BAD("free block %d has %d holders", b, e->ref[b]);
    }
    if (listed != e->n_free || e->ftail != prev) BAD("free list has %d blocks, n_free %d", listed, e->n_free);
    uint32_t cached = 0;
    for (uint32_t b = 0; b < nb; b++) {
        if (e->ref[b] != held[b]) BAD("block %u: ref %d, held by %d", b, e->ref[b], held[b]);
        if (e->hash[b] && table_get(e, e->hash[b]) != (int32_t)b) BAD("cached block %u not found by its hash", b);
        cached += e->hash[b] != 0;
    }
    uint32_t entries = 0;
    for (uint32_t i = 0; i <= e->tmask; i++)
        if (e->tkey[i]) {
            entries++;
            int32_t b = e->tval[i];
            if (b < 0 || (uint32_t)b >= nb || e->hash[b] != e->tkey[i]) BAD("table entry %u names block %d wrongly", i, b);
        }
    if (entries != cached) BAD("%u table entries for %u cached blocks", entries, cached);
    free(held);
    return 0;
#undef BAD
}
uint64_t sw_gpu_engine_preemptions(const sw_gpu_engine *e) { return e->preemptions; }
