/* The emulation backend's paged KV cache and batching: results must not
 * depend on how tokens are grouped into steps, which blocks hold them, or
 * which other sequences share the step (as long as every step stays on the
 * same activation path). Random weights: needs no shared data. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "tests/unit/check.h"
#include "worker-gpu/backend.h"

static sw_hparams tiny(void)
{
    sw_hparams hp = { .n_vocab = 96, .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 96,
                      .n_ctx_train = 256, .head_dim = 16, .n_rot = 16, .rope_theta = 10000.0f, .rms_eps = 1e-5f };
    return hp;
}

static sw_backend *make(sw_kv_dtype kv, int max_tok)
{
    char err[256];
    sw_hparams hp = tiny();
    sw_fp8_weights *w = sw_fp8_weights_random(&hp, 7, err, sizeof err);
    if (!w) { fprintf(stderr, "%s\n", err); exit(1); }
    sw_backend *be = sw_emu_backend_new(w, 32, kv, max_tok, err, sizeof err);
    if (!be) { fprintf(stderr, "%s\n", err); exit(1); }
    return be;
}

/* Runs n tokens of one sequence in steps of `step` tokens with block table
 * `table`; writes every position's logits. */
static int run_seq(sw_backend *be, const int32_t *toks, int n, int step, const int32_t *table, int max_blocks,
                   float *out)
{
    int32_t pos[64], seq[64] = {0}, lidx[64];
    char err[256];
    int V = (int)be->hp.n_vocab;
    for (int s = 0; s < n; s += step) {
        int nb = n - s < step ? n - s : step;
        for (int i = 0; i < nb; i++) { pos[i] = s + i; lidx[i] = i; }
        sw_batch b = { .n_tokens = nb, .tokens = toks + s, .pos = pos, .seq = seq, .n_seqs = 1,
                       .max_blocks = max_blocks, .block_table = table, .n_logits = nb, .logits_idx = lidx };
        if (be->ops->forward(be->impl, &b, out + (size_t)s * V, err, sizeof err)) {
            fprintf(stderr, "forward: %s\n", err);
            return -1;
        }
    }
    return 0;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static double cosine(const float *a, const float *b, size_t n)
{
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) { ab += (double)a[i] * b[i]; aa += (double)a[i] * a[i]; bb += (double)b[i] * b[i]; }
    return ab / sqrt(aa * bb);
}

int main(void)
{
    const int N = 20, V = 96;
    int32_t toks[20];
    for (int i = 0; i < N; i++) toks[i] = (i * 37 + 5) % V;
    float *a = calloc((size_t)N * V, 4), *b = calloc((size_t)N * V, 4), *c = calloc((size_t)N * V, 4);

    sw_backend *be = make(SW_KV_BF16, 64);
    /* 1. one 16-token step in blocks 0,1 vs token-by-token in scattered blocks 9,3 */
    int32_t t01[2] = {0, 1}, t93[2] = {9, 3};
    CHECK(run_seq(be, toks, 16, 16, t01, 2, a) == 0, "chunked run");
    CHECK(run_seq(be, toks, 16, 1, t93, 2, b) == 0, "token-by-token run");
    CHECK(max_diff(a, b, (size_t)16 * V) == 0.0, "step grouping/paging changed logits by %g", max_diff(a, b, (size_t)16 * V));
    CHECK(run_seq(be, toks, 16, 5, t93, 2, c) == 0, "chunks of 5");
    CHECK(max_diff(a, c, (size_t)16 * V) == 0.0, "chunks of 5 differ");

    /* 2. two sequences sharing steps == each alone */
    {
        int32_t bt[2 * 2] = {4, 5, 7, 8};   /* seq 0: blocks 4,5; seq 1: blocks 7,8 */
        int32_t tk[8], pos[8], seq[8], lidx[8];
        float out[8 * 96], solo0[8 * 96], solo1[8 * 96];
        char err[256];
        int32_t bt0[2] = {4, 5}, bt1[2] = {7, 8};
        int32_t toks1[4] = {11, 22, 33, 44};
        CHECK(run_seq(be, toks, 4, 1, bt0, 2, solo0) == 0, "solo 0");
        CHECK(run_seq(be, toks1, 4, 1, bt1, 2, solo1) == 0, "solo 1");
        /* the same positions, interleaved: each step holds one token of each */
        for (int p = 0; p < 4; p++) {
            tk[0] = toks[p]; pos[0] = p; seq[0] = 0; lidx[0] = 0;
            tk[1] = toks1[p]; pos[1] = p; seq[1] = 1; lidx[1] = 1;
            sw_batch bb = { .n_tokens = 2, .tokens = tk, .pos = pos, .seq = seq, .n_seqs = 2, .max_blocks = 2,
                            .block_table = bt, .n_logits = 2, .logits_idx = lidx };
            CHECK(be->ops->forward(be->impl, &bb, out, err, sizeof err) == 0, "%s", err);
            CHECK(max_diff(out, solo0 + (size_t)p * V, V) == 0.0, "seq 0 pos %d differs in a shared step", p);
            CHECK(max_diff(out + V, solo1 + (size_t)p * V, V) == 0.0, "seq 1 pos %d differs in a shared step", p);
        }
    }

    /* 3. a 20-token step takes the per-token FP8 path: close to, not equal to, bf16 */
    CHECK(run_seq(be, toks, N, 1, t01, 2, a) == 0, "bf16 path");
    CHECK(run_seq(be, toks, N, N, t01, 2, b) == 0, "fp8 path");
    double cs = cosine(a, b, (size_t)N * V);
    CHECK(cs > 0.99, "fp8 activations vs bf16: cosine %.5f", cs);
    CHECK(max_diff(a, b, (size_t)N * V) > 0.0, "the fp8 activation path should round differently");

    /* 4. invalid batches are rejected with a message, never a crash */
    {
        int32_t tk = 500, pos = 0, seq = 0, li = 0, bt[2] = {0, 1};
        char err[256] = "";
        float out[96];
        sw_batch bad = { .n_tokens = 1, .tokens = &tk, .pos = &pos, .seq = &seq, .n_seqs = 1, .max_blocks = 2,
                         .block_table = bt, .n_logits = 1, .logits_idx = &li };
        CHECK(be->ops->forward(be->impl, &bad, out, err, sizeof err) == -1 && strstr(err, "id 500"), "bad token: %s", err);
        tk = 1; pos = 40;
        CHECK(be->ops->forward(be->impl, &bad, out, err, sizeof err) == -1 && strstr(err, "position"), "bad pos: %s", err);
        pos = 0; bt[0] = 32;
        CHECK(be->ops->forward(be->impl, &bad, out, err, sizeof err) == -1 && strstr(err, "block"), "bad block: %s", err);
        bt[0] = 0; seq = 3;
        CHECK(be->ops->forward(be->impl, &bad, out, err, sizeof err) == -1 && strstr(err, "sequence"), "bad seq: %s", err);
    }
    sw_backend_free(be);

    /* 5. FP8 KV cache: still close to the bf16 cache */
    be = make(SW_KV_FP8, 64);
    CHECK(run_seq(be, toks, 16, 1, t01, 2, c) == 0, "fp8 kv");
    sw_backend *be2 = make(SW_KV_BF16, 64);
    CHECK(run_seq(be2, toks, 16, 1, t01, 2, a) == 0, "bf16 kv");
    cs = cosine(a, c, (size_t)16 * V);
    CHECK(cs > 0.98, "fp8 KV vs bf16 KV: cosine %.5f", cs);
    sw_backend_free(be);
    sw_backend_free(be2);
    free(a); free(b); free(c);
    CHECK_DONE();
}
