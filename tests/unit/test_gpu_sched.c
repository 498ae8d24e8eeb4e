/* The GPU worker's scheduler on the emulation backend with stories260K:
 * concurrent requests, preemption under a tiny KV pool (recomputed requests
 * must produce the same text), cancel, unknown model, expired deadline. */
#include <stdlib.h>
#include <string.h>
#include "tests/unit/check.h"
#include "worker-gpu/scheduler.h"
#include "llm/gen_impl.h"   /* generators kept by value */

#define NREQ 4
#define NSINK 10   /* ids are "r0".."r9" */
typedef struct {
    char text[NSINK][4096]; int finish[NSINK]; int fails; uint32_t last_fail; uint32_t cached[NSINK];
    uint32_t prompt[NSINK]; double worker_s[NSINK];
} sink;

static int idx(const char *id) { return id[1] - '0'; }

static void emit(void *ctx, const char *id, const sw_out *o, const uint32_t *ids, size_t n_ids, int finish,
                 const sw_usage *usage)
{
    const char *text = o->text;
    sink *s = ctx;
    int i = idx(id);
    strncat(s->text[i], text, sizeof s->text[i] - strlen(s->text[i]) - 1);
    if (finish) {
        s->finish[i] = finish;
        s->cached[i] = usage->cached_tokens;
        s->prompt[i] = usage->prompt_tokens;
        s->worker_s[i] = usage->worker_seconds;
    }
}

static void fail(void *ctx, const char *id, uint32_t code, const char *msg)
{
    sink *s = ctx;
    s->fails++;
    s->last_fail = code;
}

static sw_gpu_engine *engine(sw_model *m, sw_backend **be, uint32_t blocks)
{
    char err[256];
    sw_fp8_weights *w = sw_fp8_weights_from_model(m, err, sizeof err);
    if (!w) { fprintf(stderr, "%s\n", err); exit(1); }
    *be = sw_emu_backend_new(w, blocks, SW_KV_BF16, 16, err, sizeof err);
    if (!*be) { fprintf(stderr, "%s\n", err); exit(1); }
    sw_sched_config cfg = { .max_batch = 8, .max_tokens_per_step = 16, .model_name = "stories" };
    sw_gpu_engine *e = sw_gpu_engine_new(m, *be, &cfg, err, sizeof err);
    if (!e) { fprintf(stderr, "%s\n", err); exit(1); }
    return e;
}

static int submit(sw_gpu_engine *e, const char *id, const char *prompt, uint32_t max_tokens, const char *model,
                  uint64_t deadline)
{
    Spillway__GenerateRequest req = SPILLWAY__GENERATE_REQUEST__INIT;
    Spillway__SamplingParams sp = SPILLWAY__SAMPLING_PARAMS__INIT;
    sp.has_seed = 1;
    req.request_id = (char *)id;
    req.model = (char *)model;
    req.prompt = (char *)prompt;
    req.sampling = &sp;
    req.max_tokens = max_tokens;
    req.deadline_unix_ms = deadline;
    char err[256];
    return sw_gpu_engine_ops.submit(e, &req, err, sizeof err);
}

static const char *prompts[NREQ] = { "Once upon a time", "The cat", "Lily was", "One day, a big" };

static void check_blocks(const sw_gpu_engine *e, const char *when)
{
    char err[256];
    CHECK(sw_gpu_engine_check(e, err, sizeof err) == 0, "%s: %s", when, err);
}

/* Prompt tokens of a prompt, as the engine tokenizes it. */
static int n_tokens(const sw_model *m, const char *prompt, int32_t *out, int cap)
{
    char err[256];
    sw_gen g;
    sw_gen_params p = { .prompt = prompt };
    if (sw_gen_init(&g, m->tok, m->chat, &p, 2048, err, sizeof err)) return -1;
    int n = g.n_prompt < cap ? g.n_prompt : cap;
    memcpy(out, g.prompt, (size_t)n * sizeof *out);
    n = g.n_prompt;
    sw_gen_free(&g);
    return n;
}

/* Runs prompt i alone to the end; returns the cached prompt tokens. */
static uint32_t run_one(sw_gpu_engine *e, sink *s, int i, const char *prompt, uint32_t max_tokens)
{
    char id[16];
    snprintf(id, sizeof id, "r%d", i);
    s->text[i][0] = 0;
    s->finish[i] = 0;
    CHECK(submit(e, id, prompt, max_tokens, "stories", 0) == 0, "submit %s", id);
    while (sw_gpu_engine_ops.step(e, emit, fail, s) > 0) check_blocks(e, "step");
    return s->cached[i];
}

/* The prefix cache: a prompt that starts like an earlier one shares its
 * full blocks instead of computing them, with the same text as computing. */
static void test_prefix_cache(sw_model *m)
{
    static char base[2048], a[2048 + 64], b[2048 + 64];
    for (int i = 0; i < 6; i++) strcat(base, "Lily and Tom went to the park. ");
    snprintf(a, sizeof a, "%sThey played.", base);
    snprintf(b, sizeof b, "%sThey saw a big dog.", base);
    int32_t ta[1024], tb[1024];
    int na = n_tokens(m, a, ta, 1024), nb = n_tokens(m, b, tb, 1024), lcp = 0;
    while (lcp < na && lcp < nb && ta[lcp] == tb[lcp]) lcp++;
    CHECK(lcp >= 32, "a and b share %d tokens", lcp);

    static sink off, on;
    sw_backend *be;
    sw_gpu_engine *e = engine(m, &be, 0);
    sw_gpu_engine_set_prefix_cache(e, false);
    run_one(e, &off, 0, a, 30);
    CHECK(run_one(e, &off, 1, b, 30) == 0, "cache off, yet tokens reused");
    sw_gpu_engine_free(e);
    sw_backend_free(be);

    e = engine(m, &be, 0);
    CHECK(run_one(e, &on, 0, a, 30) == 0, "nothing cached yet");
    uint32_t got = run_one(e, &on, 1, b, 30);
    CHECK((int)got == lcp / SW_KV_BLOCK * SW_KV_BLOCK, "b reused %u tokens of %d shared", got, lcp);
    /* a again: every full block of its prompt but the one holding its last token */
    got = run_one(e, &on, 2, a, 30);
    CHECK((int)got == (na - 1) / SW_KV_BLOCK * SW_KV_BLOCK, "a again reused %u of %d", got, na);
    CHECK(!strcmp(on.text[0], off.text[0]) && !strcmp(on.text[1], off.text[1]) && !strcmp(on.text[2], off.text[0]),
          "the cache changed a text:\n%s\n%s\n%s", on.text[0], on.text[1], on.text[2]);
    sw_load ld;
    sw_gpu_engine_ops.load(e, &ld);
    CHECK(ld.kv_utilization == 0.0f, "cached blocks count as free (%.3f)", ld.kv_utilization);
    /* The heartbeat's prefix-cache counts add up the requests' own; each
     * request reports the worker time of its steps. */
    uint64_t queries = on.prompt[0] + on.prompt[1] + on.prompt[2], hits = on.cached[0] + on.cached[1] + on.cached[2];
    CHECK(ld.prefix_cache_queries == queries && ld.prefix_cache_hits == hits && hits > 0, "load %llu/%llu, requests %llu/%llu",
          (unsigned long long)ld.prefix_cache_hits, (unsigned long long)ld.prefix_cache_queries,
          (unsigned long long)hits, (unsigned long long)queries);
    for (int i = 0; i < 3; i++) CHECK(on.worker_s[i] > 0 && on.worker_s[i] < 60, "r%d worker_seconds %g", i, on.worker_s[i]);
    sw_gpu_engine_free(e);
    sw_backend_free(be);

    /* Four requests sharing a long prefix in a pool too small for them all:
     * shared blocks, preemption and eviction together, still the texts each
     * gets alone, and the accounting checked after every step. */
    static char shared_p[NREQ][2048];
    static sink alone, crowd;
    const char *ends[NREQ] = { "They ran.", "They sat down.", "A bird sang.", "It was late." };
    e = engine(m, &be, 0);
    sw_gpu_engine_set_prefix_cache(e, false);
    for (int i = 0; i < NREQ; i++) {
        snprintf(shared_p[i], sizeof shared_p[i], "%s%s", base, ends[i]);
        run_one(e, &alone, i, shared_p[i], 40);
    }
    sw_gpu_engine_free(e);
    sw_backend_free(be);
    int blocks_alone = (na + 40) / SW_KV_BLOCK + 1;
    e = engine(m, &be, (uint32_t)(2 * blocks_alone + 2));   /* room for about two at a time */
    /* r0 first, until its prompt is computed (blocks are cached once full);
     * then the others join while it runs */
    CHECK(submit(e, "r0", shared_p[0], 40, "stories", 0) == 0, "submit r0");
    int guard = 0;
    while (!crowd.text[0][0] && guard++ < 1000) sw_gpu_engine_ops.step(e, emit, fail, &crowd);
    for (int i = 1; i < NREQ; i++) {
        char id[16];
        snprintf(id, sizeof id, "r%d", i);
        CHECK(submit(e, id, shared_p[i], 40, "stories", 0) == 0, "submit %s", id);
    }
    /* a fifth request with the same prefix, cancelled while it holds shared blocks */
    static char fifth[2048 + 64];
    snprintf(fifth, sizeof fifth, "%sThe end.", base);
    CHECK(submit(e, "r9", fifth, 40, "stories", 0) == 0, "submit r9");
    for (int k = 0; k < 3; k++) sw_gpu_engine_ops.step(e, emit, fail, &crowd);
    sw_gpu_engine_ops.cancel(e, "r9");
    check_blocks(e, "after a cancel");
    while (sw_gpu_engine_ops.step(e, emit, fail, &crowd) > 0 && guard++ < 100000) check_blocks(e, "crowded step");
    for (int i = 0; i < NREQ; i++)
        CHECK(!strcmp(crowd.text[i], alone.text[i]), "crowded text %d differs:\n%s\n---\n%s", i, crowd.text[i],
              alone.text[i]);
    uint32_t reused = 0;
    for (int i = 0; i < NREQ; i++) reused += crowd.cached[i];
    CHECK(reused >= 3 * (uint32_t)(lcp / SW_KV_BLOCK * SW_KV_BLOCK) / 2, "the shared prefix was reused (%u tokens)", reused);
    printf("crowded pool of %d blocks: %llu preemptions, %u prompt tokens reused\n", 2 * blocks_alone + 2,
           (unsigned long long)sw_gpu_engine_preemptions(e), reused);
    sw_gpu_engine_free(e);
    sw_backend_free(be);
}

static void run_all(sw_gpu_engine *e, sink *s, uint32_t max_tokens)
{
    char id[16];
    for (int i = 0; i < NREQ; i++) {
        snprintf(id, sizeof id, "r%d", i);
        CHECK(submit(e, id, prompts[i], max_tokens, "stories", 0) == 0, "submit %d", i);
    }
    int guard = 0;
    while (sw_gpu_engine_ops.step(e, emit, fail, s) > 0 && guard++ < 100000) {}
}

int main(void)
{
    char path[512], err[256];
    shared_path(path, sizeof path, "models/stories260K.gguf");
    FILE *f = fopen(path, "rb");
    if (!f) SKIP_TEST("%s missing", path);
    fclose(f);
    sw_model *m = sw_model_load(path, err, sizeof err);
    CHECK(m != NULL, "%s", err);
    if (!m) CHECK_DONE();

    /* reference: each request alone */
    static sink solo, both, tight;
    sw_backend *be;
    sw_gpu_engine *e = engine(m, &be, 0);
    for (int i = 0; i < NREQ; i++) {
        char id[16];
        snprintf(id, sizeof id, "r%d", i);
        CHECK(submit(e, id, prompts[i], 60, "stories", 0) == 0, "solo submit");
        while (sw_gpu_engine_ops.step(e, emit, fail, &solo) > 0) {}
        CHECK(solo.finish[i] == SW_FINISH_LENGTH || solo.finish[i] == SW_FINISH_STOP, "solo %d finished", i);
        CHECK(strlen(solo.text[i]) > 20, "solo %d generated text", i);
    }
    /* all four at once: continuous batching, same texts */
    run_all(e, &both, 60);
    sw_load ld;
    sw_gpu_engine_ops.load(e, &ld);
    CHECK(ld.batch_size >= 2, "batched (peak batch %u)", ld.batch_size);
    for (int i = 0; i < NREQ; i++) CHECK(!strcmp(solo.text[i], both.text[i]), "batched text %d differs", i);
    CHECK(sw_gpu_engine_preemptions(e) == 0, "no preemption with a big pool");

    /* errors: unknown model, deadline in the past, cancel */
    CHECK(submit(e, "r0", "x", 5, "other-model", 0) == 404, "unknown model -> 404");
    sink s2;
    memset(&s2, 0, sizeof s2);
    CHECK(submit(e, "r1", "Once", 50, "stories", 1) == 0, "accepts a request with a deadline");
    sw_gpu_engine_ops.step(e, emit, fail, &s2);
    CHECK(s2.fails == 1 && s2.last_fail == 504, "expired deadline fails with 504");
    CHECK(submit(e, "r2", "Once", 50, "stories", 0) == 0, "submit");
    sw_gpu_engine_ops.step(e, emit, fail, &s2);
    sw_gpu_engine_ops.cancel(e, "r2");
    sw_gpu_engine_ops.cancel(e, "nope");
    CHECK(sw_gpu_engine_ops.step(e, emit, fail, &s2) == 0, "idle after cancel");
    CHECK(s2.finish[2] == 0, "a cancelled request emits no finish");
    sw_gpu_engine_free(e);
    sw_backend_free(be);

    /* a pool of 9 blocks (144 positions) for 4 requests of ~5 + 60 tokens */
    e = engine(m, &be, 9);
    run_all(e, &tight, 60);
    CHECK(sw_gpu_engine_preemptions(e) > 0, "the tiny pool forced preemption");
    for (int i = 0; i < NREQ; i++) {
        CHECK(tight.finish[i] == solo.finish[i], "request %d finish %d vs %d", i, tight.finish[i], solo.finish[i]);
        CHECK(!strcmp(solo.text[i], tight.text[i]), "text %d after preemption differs:\n%s\n---\n%s", i,
              tight.text[i], solo.text[i]);
    }
    sw_gpu_engine_ops.load(e, &ld);
    CHECK(ld.kv_utilization == 0.0f && ld.active == 0 && ld.queued == 0, "everything released");
    check_blocks(e, "after the tight pool");
    sw_gpu_engine_free(e);
    sw_backend_free(be);
    test_prefix_cache(m);
    sw_model_free(m);
    CHECK_DONE();
}
