/* The CPU engine on the real stories260K model: continuous batching must give
 * every request exactly the text it gets alone (greedy), with chunked prefill,
 * queueing, cancel, stop strings, limits and request validation. */
#include "tests/unit/check.h"
#include "worker-cpu/engine.h"
#include "worker-cpu/forward.h"
#include "llm/gen_impl.h"   /* generators kept by value */
#include "llm/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_REQ 7

typedef struct {
    char text[16384];
    uint32_t ids[4096];
    int n_ids, finish, chunks, after_finish;
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
    double worker_seconds;
    int failed_code;
} result;

static result res[64];

static int req_index(const char *id) { return atoi(id + 1); }   /* ids are "r<N>" */

static void emit(void *ctx, const char *id, const sw_out *o, const uint32_t *ids, size_t n, int finish,
                 const sw_usage *usage)
{
    const char *text = o->text;
    (void)ctx;
    result *r = &res[req_index(id)];
    if (r->finish) r->after_finish++;
    strncat(r->text, text, sizeof r->text - strlen(r->text) - 1);
    for (size_t i = 0; i < n && r->n_ids < 4096; i++) r->ids[r->n_ids++] = ids[i];
    r->chunks++;
    if (finish) {
        r->finish = finish;
        r->prompt_tokens = usage->prompt_tokens;
        r->completion_tokens = usage->completion_tokens;
        r->cached_tokens = usage->cached_tokens;
        r->worker_seconds = usage->worker_seconds;
    }
}

static void fail(void *ctx, const char *id, uint32_t code, const char *msg)
{
    (void)ctx; (void)msg;
    res[req_index(id)].failed_code = (int)code;
}

/* What one request produces alone: plain single-sequence greedy decoding. */
static void reference(sw_model *m, const char *prompt, uint32_t max_tokens, const char *stop, result *out)
{
    char err[256];
    memset(out, 0, sizeof *out);
    sw_gen g;
    const char *stops[1] = { stop };
    sw_gen_params p = { .prompt = prompt, .max_tokens = max_tokens, .stop = stops, .n_stop = stop ? 1 : 0 };
    if (sw_gen_init(&g, m->tok, m->chat, &p, 512, err, sizeof err)) { CHECK(0, "gen init: %s", err); return; }
    sw_ctx *c = sw_ctx_new(m, 1, 512, g.n_prompt, err, sizeof err);
    float *logits = malloc(m->hp.n_vocab * sizeof(float));
    sw_tok_in *b = calloc((size_t)g.n_prompt, sizeof *b);
    for (int i = 0; i < g.n_prompt; i++) b[i] = (sw_tok_in){ g.prompt[i], i, 0, i == g.n_prompt - 1 };
    CHECK(sw_forward(c, b, g.n_prompt, logits, err, sizeof err) == 0, "%s", err);
    for (;;) {
        int32_t t = sw_gen_sample(&g, logits, (int32_t)m->hp.n_vocab);
        const char *d;
        size_t dl;
        int fin = sw_gen_accept(&g, t, &d, &dl);
        strcat(out->text, d);
        out->ids[out->n_ids++] = (uint32_t)t;
        if (fin) { out->finish = fin; out->prompt_tokens = (uint32_t)g.n_prompt; out->completion_tokens = g.n_generated; break; }
        sw_tok_in one = { t, sw_gen_next_pos(&g), 0, true };
        CHECK(sw_forward(c, &one, 1, logits, err, sizeof err) == 0, "%s", err);
    }
    free(b);
    free(logits);
    sw_ctx_free(c);
    sw_gen_free(&g);
}

static int submit(sw_cpu_engine *e, int i, const char *prompt, uint32_t max_tokens, const char *stop, char *err)
{
    char id[16];
    snprintf(id, sizeof id, "r%d", i);
    Spillway__GenerateRequest r = SPILLWAY__GENERATE_REQUEST__INIT;
    Spillway__SamplingParams sp = SPILLWAY__SAMPLING_PARAMS__INIT;   /* temperature 0: greedy */
    char *stops[1] = { (char *)stop };
    r.request_id = id;
    r.prompt = (char *)prompt;
    r.max_tokens = max_tokens;
    r.sampling = &sp;
    sp.has_seed = 1;
    if (stop) { r.stop = stops; r.n_stop = 1; }
    return sw_cpu_engine_ops.submit(e, &r, err, 256);
}

/* Prompt tokens two prompts share at the start (as the engine tokenizes them). */
static int shared_prefix(sw_model *m, const char *a, const char *b, int *n_b)
{
    char err[256];
    sw_gen ga, gb;
    sw_gen_params pa = { .prompt = a }, pb = { .prompt = b };
    if (sw_gen_init(&ga, m->tok, m->chat, &pa, 512, err, sizeof err)) return -1;
    if (sw_gen_init(&gb, m->tok, m->chat, &pb, 512, err, sizeof err)) { sw_gen_free(&ga); return -1; }
    int n = 0;
    while (n < ga.n_prompt && n < gb.n_prompt && ga.prompt[n] == gb.prompt[n]) n++;
    *n_b = gb.n_prompt;
    sw_gen_free(&ga);
    sw_gen_free(&gb);
    return n;
}

/* Runs request i alone on e and checks it against the reference; returns
 * the prompt tokens the engine took from its prefix cache. */
static uint32_t run_one(sw_cpu_engine *e, sw_model *m, int i, const char *prompt, uint32_t max_tokens)
{
    char err[256];
    result ref;
    reference(m, prompt, max_tokens, NULL, &ref);
    memset(&res[i], 0, sizeof res[i]);
    CHECK(submit(e, i, prompt, max_tokens, NULL, err) == 0, "submit r%d: %s", i, err);
    while (sw_cpu_engine_ops.step(e, emit, fail, NULL) > 0) {}
    CHECK(res[i].finish != 0 && !strcmp(res[i].text, ref.text), "r%d with the prefix cache:\n %s\n alone: %s",
          i, res[i].text, ref.text);
    CHECK(res[i].prompt_tokens == ref.prompt_tokens);
    return res[i].cached_tokens;
}

/* The prefix cache: a prompt that starts like an earlier one prefills only
 * the rest, and still gives exactly the text it gets alone. */
static void test_prefix_cache(sw_model *m)
{
    char err[256];
    sw_cpu_engine *e = sw_cpu_engine_new(m, 2, 0, 512, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    if (!e) return;
    static char base[4096], a[4096 + 64], b[4096 + 64], x[4096 + 64], y[4096 + 64], turn2[32768];
    for (int i = 0; i < 12; i++) strcat(base, "Lily and Tom went to the park. ");
    snprintf(a, sizeof a, "%sThey played with a red ball.", base);
    snprintf(b, sizeof b, "%sThey saw a big dog.", base);
    snprintf(x, sizeof x, "%sThey ran home.", base);
    snprintf(y, sizeof y, "%sThey sat down.", base);
    int n_b = 0, shared = shared_prefix(m, a, b, &n_b);
    CHECK(shared > 100, "the prompts share %d tokens", shared);

    CHECK(run_one(e, m, 0, a, 20) == 0, "nothing cached yet, yet %u reused", res[0].cached_tokens);
    uint32_t got = run_one(e, m, 1, b, 20);
    CHECK((int)got == shared, "b reused %u tokens, shares %d with a", got, shared);
    /* The same prompt again: all but its last token (whose logits are needed). */
    got = run_one(e, m, 2, b, 20);
    CHECK((int)got == n_b - 1, "b again reused %u of %d tokens", got, n_b);
    /* The next turn of a conversation: the earlier prompt, the answer, more
     * text. The answer's tokens were computed while generating. */
    snprintf(turn2, sizeof turn2, "%s%s Then they went home.", b, res[2].text);
    got = run_one(e, m, 3, turn2, 10);
    CHECK((int)got > n_b, "the second turn reused only %u tokens (its first turn had %d)", got, n_b);
    /* An unrelated prompt takes the other slot, so the cache above survives. */
    got = run_one(e, m, 4, "Once upon a time", 10);
    CHECK(got <= 1, "unrelated prompt reused %u tokens", got);
    got = run_one(e, m, 5, b, 10);
    CHECK((int)got == n_b - 1, "b after an unrelated prompt reused %u of %d tokens", got, n_b);
    /* Two at once, both sharing a prefix with b's cache: one continues in
     * b's slot, the other gets the prefix copied into the free slot (from
     * the slot the first is running in). */
    result rx, ry;
    reference(m, x, 12, NULL, &rx);
    reference(m, y, 12, NULL, &ry);
    int n_x, n_y, sx = shared_prefix(m, b, x, &n_x), sy = shared_prefix(m, b, y, &n_y);
    memset(&res[7], 0, 2 * sizeof res[7]);
    CHECK(submit(e, 7, x, 12, NULL, err) == 0 && submit(e, 8, y, 12, NULL, err) == 0, "%s", err);
    while (sw_cpu_engine_ops.step(e, emit, fail, NULL) > 0) {}
    CHECK(!strcmp(res[7].text, rx.text) && !strcmp(res[8].text, ry.text), "x or y differs from alone");
    CHECK((int)res[7].cached_tokens == sx && (int)res[8].cached_tokens == sy && sy > 100,
          "x reused %u (shares %d), y reused %u (shares %d)", res[7].cached_tokens, sx, res[8].cached_tokens, sy);
    /* Off: nothing is reused. */
    sw_cpu_engine_set_prefix_cache(e, false);
    got = run_one(e, m, 6, b, 10);
    CHECK(got == 0, "prefix cache off, yet %u reused", got);
    /* The heartbeat's prefix-cache counts are the requests' own, added up;
     * each request reports the worker time its steps took. */
    uint64_t queries = 0, hits = 0;
    for (int i = 0; i <= 8; i++) {
        queries += res[i].prompt_tokens;
        hits += res[i].cached_tokens;
        CHECK(res[i].worker_seconds > 0 && res[i].worker_seconds < 60, "r%d worker_seconds %g", i,
              res[i].worker_seconds);
    }
    sw_load ld;
    sw_cpu_engine_ops.load(e, &ld);
    CHECK(ld.prefix_cache_queries == queries && ld.prefix_cache_hits == hits, "load says %llu/%llu, requests %llu/%llu",
          (unsigned long long)ld.prefix_cache_hits, (unsigned long long)ld.prefix_cache_queries,
          (unsigned long long)hits, (unsigned long long)queries);
    sw_cpu_engine_free(e);
}

/* Random traffic with many shared prefixes: 40 requests built from a few
 * sentences, 3 slots, cancels mixed in. Every request that finishes must
 * have the text it gets alone, however its prefix reached its slot. */
static void test_prefix_cache_random(sw_model *m)
{
    static const char *parts[] = { "Lily and Tom went to the park. ", "They saw a big dog. ",
                                   "The sun was hot. ", "Mom made a cake. ", "Once upon a time " };
    enum { N = 40 };
    static char prompts[N][512];
    static result refs[N];
    uint64_t rng = 12345;
    char err[256];
    sw_cpu_engine *e = sw_cpu_engine_new(m, 3, 0, 512, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    if (!e) return;
    int submitted = 0, finished = 0, cancelled = 0;
    uint32_t reused = 0;
    memset(res, 0, sizeof res);
    for (int guard = 0; guard < 100000; guard++) {
        if (submitted < N && sw_splitmix64(&rng) % 3 == 0) {
            int i = submitted++;
            int k = 2 + (int)(sw_splitmix64(&rng) % 5);
            for (int j = 0; j < k; j++) strcat(prompts[i], parts[j == 0 ? 0 : sw_splitmix64(&rng) % 5]);
            uint32_t max_tokens = 4 + (uint32_t)(sw_splitmix64(&rng) % 20);
            reference(m, prompts[i], max_tokens, NULL, &refs[i]);
            CHECK(submit(e, i, prompts[i], max_tokens, NULL, err) == 0, "submit %d: %s", i, err);
        }
        if (submitted && sw_splitmix64(&rng) % 17 == 0) {   /* cancel a random earlier request */
            char id[16];
            int i = (int)(sw_splitmix64(&rng) % (uint64_t)submitted);
            snprintf(id, sizeof id, "r%d", i);
            if (!res[i].finish) { sw_cpu_engine_ops.cancel(e, id); res[i].failed_code = -1; }
        }
        if (sw_cpu_engine_ops.step(e, emit, fail, NULL) == 0 && submitted == N) break;
    }
    for (int i = 0; i < N; i++) {
        if (res[i].failed_code == -1 && !res[i].finish) { cancelled++; continue; }
        finished++;
        reused += res[i].cached_tokens;
        CHECK(res[i].finish && !strcmp(res[i].text, refs[i].text), "random r%d:\n %s\n alone: %s", i, res[i].text,
              refs[i].text);
    }
    CHECK(finished > N / 2 && reused > 100, "%d finished, %d cancelled, %u prompt tokens reused", finished, cancelled,
          reused);
    printf("random traffic: %d finished, %d cancelled, %u prompt tokens reused\n", finished, cancelled, reused);
    sw_cpu_engine_free(e);
}

/* More KV caches than running sequences (--cache-slots): one sequence at a
 * time, three caches, so three conversations stay warm; with one cache only
 * the latest does. */
static void test_cache_slots(sw_model *m)
{
    static char p[3][2048];
    const char *topics[3] = { "Lily had a red ball. ", "Tom saw a big fish. ", "The cat sat on a mat. " };
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 8; j++) strcat(p[k], topics[k]);
    for (int caches = 1; caches <= 3; caches += 2) {
        char err[256];
        sw_cpu_engine *e = sw_cpu_engine_new(m, 1, caches, 512, err, sizeof err);
        CHECK(e != NULL, "engine: %s", err);
        if (!e) return;
        for (int k = 0; k < 3; k++) run_one(e, m, 10 + k, p[k], 8);
        uint32_t again = run_one(e, m, 13, p[0], 8);
        if (caches == 3)
            CHECK(again == res[10].prompt_tokens - 1, "3 caches: the first prompt again reused %u of %u", again,
                  res[10].prompt_tokens);
        else
            CHECK(again <= 1, "1 cache: the first prompt again reused %u", again);
        /* all three at once still run one at a time */
        memset(&res[20], 0, 3 * sizeof res[20]);
        for (int k = 0; k < 3; k++) CHECK(submit(e, 20 + k, p[k], 8, NULL, err) == 0, "%s", err);
        sw_load ld;
        int max_active = 0;
        while (sw_cpu_engine_ops.step(e, emit, fail, NULL) > 0) {
            sw_cpu_engine_ops.load(e, &ld);
            if ((int)ld.active > max_active) max_active = (int)ld.active;
        }
        CHECK(max_active == 1 && ld.slots == 1, "parallel 1: %d ran at once, %u slots reported", max_active, ld.slots);
        for (int k = 0; k < 3; k++)
            CHECK(res[20 + k].finish && !strcmp(res[20 + k].text, res[10 + k].text), "text %d at once differs", k);
        sw_cpu_engine_free(e);
    }
}

/* Each batched result is what the request gave alone. */
static void check_same(const result *ref, int n)
{
    for (int i = 0; i < n; i++) {
        CHECK(strcmp(res[i].text, ref[i].text) == 0, "r%d text differs:\n batched: %s\n alone:   %s", i, res[i].text, ref[i].text);
        CHECK(res[i].n_ids == ref[i].n_ids && !memcmp(res[i].ids, ref[i].ids, ref[i].n_ids * sizeof(uint32_t)),
              "r%d token ids differ", i);
        CHECK(res[i].finish == ref[i].finish, "r%d finish %d vs %d", i, res[i].finish, ref[i].finish);
        CHECK(res[i].prompt_tokens == ref[i].prompt_tokens && res[i].completion_tokens == ref[i].completion_tokens,
              "r%d usage %u/%u vs %u/%u", i, res[i].prompt_tokens, res[i].completion_tokens,
              ref[i].prompt_tokens, ref[i].completion_tokens);
        CHECK(res[i].after_finish == 0, "r%d got chunks after its final one", i);
        CHECK(res[i].failed_code == 0);
    }
}

/* Validation at submit; then max_tokens 0 and a passed deadline. */
static void test_validation(sw_cpu_engine *e)
{
    char err[512];
    /* Validation at submit. */
    static char huge[20000];
    for (int i = 0; i < 600; i++) strcat(huge, "Once upon ");
    CHECK(submit(e, 9, huge, 10, NULL, err) == 400 && strstr(err, "context"), "too long: %s", err);
    Spillway__GenerateRequest r = SPILLWAY__GENERATE_REQUEST__INIT;
    uint32_t toks[3] = { 1, 403, 100000 };
    r.request_id = "r9";
    r.prompt_tokens = toks;
    r.n_prompt_tokens = 3;
    CHECK(sw_cpu_engine_ops.submit(e, &r, err, sizeof err) == 400 && strstr(err, "out of range"), "bad id: %s", err);
    r.request_id = "";
    CHECK(sw_cpu_engine_ops.submit(e, &r, err, sizeof err) == 400);
    toks[2] = 407;
    r.request_id = "r9";
    CHECK(sw_cpu_engine_ops.submit(e, &r, err, sizeof err) == 0);
    CHECK(sw_cpu_engine_ops.submit(e, &r, err, sizeof err) == 400 && strstr(err, "in use"), "duplicate: %s", err);
    /* max_tokens 0: runs until the context is full. */
    while (sw_cpu_engine_ops.step(e, emit, fail, NULL) > 0) {}
    CHECK(res[9].finish == SW_FINISH_LENGTH && res[9].prompt_tokens + res[9].completion_tokens == 512,
          "r9: finish %d, %u + %u", res[9].finish, res[9].prompt_tokens, res[9].completion_tokens);

    /* A request whose deadline has passed fails instead of running. */
    Spillway__GenerateRequest d = SPILLWAY__GENERATE_REQUEST__INIT;
    d.request_id = "r10";
    d.prompt = "Once";
    d.deadline_unix_ms = 1;
    CHECK(sw_cpu_engine_ops.submit(e, &d, err, sizeof err) == 0);
    while (sw_cpu_engine_ops.step(e, emit, fail, NULL) > 0) {}
    CHECK(res[10].failed_code == 504 && res[10].chunks == 0);
}

int main(void)
{
    char path[512], err[512];
    shared_path(path, sizeof path, "models/stories260K.gguf");
    FILE *f = fopen(path, "rb");
    if (!f) SKIP_TEST("%s missing", path);
    fclose(f);
    sw_model *m = sw_model_load(path, err, sizeof err);
    CHECK(m != NULL, "load: %s", err);
    if (!m) CHECK_DONE();

    /* A prompt longer than one prefill chunk (256 tokens), so its prefill
     * spans several steps while other sequences decode. */
    static char longp[8192];
    for (int i = 0; i < 40; i++) strcat(longp, "Lily and Tom went to the park. ");
    const char *prompts[N_REQ] = { "Once upon a time", "Lily and Tom", longp, "The cat sat",
                                   "One day, a big dog", "Once upon a time", "Sam" };
    const uint32_t max_tokens[N_REQ] = { 40, 50, 30, 60, 70, 200, 45 };
    const char *stops[N_REQ] = { NULL, NULL, NULL, NULL, NULL, "Lily", NULL };
    result ref[N_REQ];
    for (int i = 0; i < N_REQ; i++) reference(m, prompts[i], max_tokens[i], stops[i], &ref[i]);

    sw_cpu_engine *e = sw_cpu_engine_new(m, 3, 0, 512, err, sizeof err);
    CHECK(e != NULL, "engine: %s", err);
    if (!e) CHECK_DONE();
    CHECK(sw_cpu_engine_n_ctx(e) == 512);

    for (int i = 0; i < N_REQ; i++) CHECK(submit(e, i, prompts[i], max_tokens[i], stops[i], err) == 0, "submit %d: %s", i, err);
    /* r7 is cancelled while queued, r8 while running. */
    CHECK(submit(e, 7, "Once upon a time", 100, NULL, err) == 0);
    CHECK(submit(e, 8, "Once upon a time", 100, NULL, err) == 0);

    sw_load ld;
    sw_cpu_engine_ops.load(e, &ld);
    CHECK(ld.slots == 3 && ld.active == 0 && ld.queued == N_REQ + 2, "load before: active %u queued %u", ld.active, ld.queued);
    sw_cpu_engine_ops.cancel(e, "r7");
    sw_cpu_engine_ops.cancel(e, "nonexistent");   /* ignored */

    int steps = 0, max_batch_seen = 0, r8_chunks_at_cancel = -1;
    while (sw_cpu_engine_ops.step(e, emit, fail, NULL) > 0 && steps < 10000) {
        steps++;
        sw_cpu_engine_ops.load(e, &ld);
        CHECK(ld.active <= 3);
        if ((int)ld.batch_size > max_batch_seen) max_batch_seen = (int)ld.batch_size;
        CHECK(ld.kv_utilization >= 0.0f && ld.kv_utilization <= 1.0f);
        if (res[8].chunks >= 3 && r8_chunks_at_cancel < 0) {
            sw_cpu_engine_ops.cancel(e, "r8");
            r8_chunks_at_cancel = res[8].chunks;
        }
    }
    CHECK(steps < 10000, "engine did not drain");
    CHECK(max_batch_seen == 3, "decode batches should fill all 3 slots (saw %d)", max_batch_seen);

    check_same(ref, N_REQ);
    CHECK(res[0].finish == SW_FINISH_LENGTH && res[0].completion_tokens == 40);
    CHECK(strncmp(res[0].text, ", there was a little girl named Lily.", 37) == 0, "r0: %s", res[0].text);
    CHECK(res[2].prompt_tokens > 256, "long prompt has %u tokens", res[2].prompt_tokens);
    /* The stop string ends r5 early and never appears in its text. */
    CHECK(res[5].finish == SW_FINISH_STOP && res[5].completion_tokens < 200 && !strstr(res[5].text, "Lily"),
          "r5: finish %d, %u tokens: %s", res[5].finish, res[5].completion_tokens, res[5].text);
    CHECK(res[7].chunks == 0, "cancelled while queued, yet emitted");
    CHECK(r8_chunks_at_cancel >= 3 && res[8].chunks == r8_chunks_at_cancel && res[8].finish == 0,
          "r8 emitted after cancel (%d -> %d)", r8_chunks_at_cancel, res[8].chunks);
    sw_cpu_engine_ops.load(e, &ld);
    CHECK(ld.active == 0 && ld.queued == 0 && ld.kv_utilization == 0.0f);
    CHECK(ld.tokens_generated > 0);

    test_validation(e);

    sw_cpu_engine_free(e);
    test_prefix_cache(m);
    test_prefix_cache_random(m);
    test_cache_slots(m);
    sw_model_free(m);
    CHECK_DONE();
}
