/* CPU kernels (worker-cpu/kernels.c) against the scalar reference in
 * llm/quant.c, for every ISA this CPU supports: activation quantization,
 * single dots and matmul over odd row counts and token counts. Weight blocks
 * are random bytes (every bit pattern of quants and packed scales) with
 * block scales from tiny (fp16 subnormal) to huge.
 *
 *   test_kernels [--quick]
 *
 * --quick: only the best ISA this CPU has, and every kernel of it on fewer
 * shapes and token counts (no wide-matrix work split): about 1/30 of the
 * work, for a CPU emulated by qemu-x86_64 -cpu MODEL
 * (tests/test_isa_emulated.py), where the full run takes over 10 minutes. */
#include "worker-cpu/kernels.h"
#include "worker-cpu/kernels_impl.h"
#include "tests/unit/check.h"
#define TEST_RNG_SEED 0x243f6a8885a308d3ull
#include "tests/unit/testutil.h"

#include <math.h>
#include <stdint.h>

static const sw_type WTYPES[] = {SW_TYPE_F32, SW_TYPE_F16, SW_TYPE_BF16, SW_TYPE_Q4_0, SW_TYPE_Q4_1,
                                 SW_TYPE_Q5_0, SW_TYPE_Q5_1, SW_TYPE_Q8_0, SW_TYPE_MXFP4, SW_TYPE_Q4_K,
                                 SW_TYPE_Q5_K, SW_TYPE_Q6_K};
#define NW (int)(sizeof WTYPES / sizeof WTYPES[0])

static bool quick;   /* --quick */

/* Offsets of the fp16 scale fields in a block; -1 ends. The second entry of
 * Q4_1/Q5_1/Q4_K/Q5_K is the min / offset field. */
static void scale_fields(sw_type t, int off[3])
{
    off[0] = off[1] = off[2] = -1;
    switch (t) {
    case SW_TYPE_Q4_0: case SW_TYPE_Q5_0: case SW_TYPE_Q8_0: off[0] = 0; break;
    case SW_TYPE_Q4_1: case SW_TYPE_Q5_1: case SW_TYPE_Q4_K: case SW_TYPE_Q5_K: off[0] = 0; off[1] = 2; break;
    case SW_TYPE_Q6_K: off[0] = 208; break;
    default: break;
    }
}

/* A random fp16 scale of magnitude around 2^e (e from -24: subnormal). */
static sw_f16 rand_scale(int mode)
{
    float mag;
    switch (mode) {
    case 0: mag = 1e-3f; break;
    case 1: mag = 0x1p-24f * (1 + (float)(rng_u64() % 8)); break; /* fp16 subnormals */
    case 2: mag = 3000.0f; break;
    default: mag = 1.0f; break;
    }
    float v = mag * (float)(0.25 + rng_unit());
    if (mode == 1) v = mag;
    if (rng_u64() & 1) v = -v;
    return sw_f32_to_f16(v);
}

/* Fills a row of n weights of type t with random content at scale `mode`. */
static void random_weights(sw_type t, uint8_t *w, int64_t n, int mode)
{
    const sw_type_traits *tr = sw_type_info(t);
    size_t rs = sw_row_size(t, (uint64_t)n);
    if (t == SW_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) { float f = rng_normal() * (mode == 2 ? 1e4f : mode == 1 ? 1e-6f : 1.0f); memcpy(w + 4 * i, &f, 4); }
        return;
    }
    if (t == SW_TYPE_F16 || t == SW_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float f = rng_normal() * (mode == 2 ? 1e3f : mode == 1 ? 1e-6f : 1.0f);
            uint16_t h = t == SW_TYPE_F16 ? sw_f32_to_f16(f) : sw_f32_to_bf16(f);
            memcpy(w + 2 * i, &h, 2);
        }
        return;
    }
    for (size_t i = 0; i < rs; i++) w[i] = (uint8_t)rng_u64();
    if (t == SW_TYPE_MXFP4) {   /* E8M0 exponents: denormal, around 1, huge */
        for (int64_t b = 0; b < n / tr->block_size; b++)
            w[b * tr->type_size] = (uint8_t)(mode == 1 ? rng_u64() % 4 : mode == 2 ? 150 + rng_u64() % 20
                                                                               : 110 + rng_u64() % 24);
        return;
    }
    int off[3];
    scale_fields(t, off);
    for (int64_t b = 0; b < n / tr->block_size; b++)
        for (int k = 0; off[k] >= 0; k++) {
            sw_f16 h = rand_scale(mode);
            memcpy(w + b * tr->type_size + off[k], &h, 2);
        }
}

/* A rows x cols tensor of `type` in t, row r random at scale mode
 * (r + mode0) % 4; returns its data (the caller frees it). */
static uint8_t *random_tensor(gguf_tensor *t, sw_type type, int64_t rows, int64_t cols, int mode0)
{
    memset(t, 0, sizeof *t);
    t->n_dims = 2;
    t->type = type;
    t->ne[0] = (uint64_t)cols; t->ne[1] = (uint64_t)rows; t->ne[2] = t->ne[3] = 1;
    size_t rs = sw_row_size(type, (uint64_t)cols);
    t->nbytes = rs * (size_t)rows;
    uint8_t *w = malloc(t->nbytes);
    for (int64_t r = 0; r < rows; r++) random_weights(type, w + r * rs, cols, (int)((r + mode0) % 4));
    t->data = w;
    return w;
}

/* Activation rows: floats (half of them with an outlier), quantized by the reference. */
static void random_x(float *x, int64_t n, int mode)
{
    float s = mode == 2 ? 1e3f : mode == 1 ? 1e-4f : 1.0f;
    for (int64_t i = 0; i < n; i++) x[i] = rng_normal() * s;
    if (rng_u64() & 1) x[rng_u64() % n] = 50 * s;
}

/* Sum of |terms| of the dot, the scale float rounding is relative to. The
 * min/offset term of Q4_1/Q5_1/Q4_K/Q5_K is counted separately because it
 * can cancel against the scaled quants. */
static double dot_magnitude(sw_type t, const uint8_t *w, const uint8_t *act, int64_t n)
{
    const sw_type_traits *tr = sw_type_info(t);
    size_t rs = sw_row_size(t, (uint64_t)n);
    float *wf = malloc((size_t)n * 4), *w0 = malloc((size_t)n * 4), *af = malloc((size_t)n * 4);
    uint8_t *wz = malloc(rs);
    memcpy(wz, w, rs);
    int off[3];
    scale_fields(t, off);
    if (off[1] >= 0)
        for (int64_t b = 0; b < n / tr->block_size; b++) memset(wz + b * tr->type_size + off[1], 0, 2);
    sw_dequantize_row(t, w, wf, n);
    sw_dequantize_row(t, wz, w0, n);
    sw_dequantize_row(tr->vec_dot_type, act, af, n);
    double mag = 0;
    for (int64_t i = 0; i < n; i++) mag += (fabs((double)w0[i]) + fabs((double)wf[i] - w0[i])) * fabs((double)af[i]);
    free(wf); free(w0); free(af); free(wz);
    return mag;
}

static bool close_enough(double got, double ref, double mag, double rel)
{
    return fabs(got - ref) <= rel * mag + 1e-35;
}

static void test_quantize_act(sw_isa isa)
{
    float x[4096];
    uint8_t a[8192], r[8192];
    sw_type kinds[] = {SW_TYPE_Q4_K, SW_TYPE_Q4_0, SW_TYPE_F16};
    for (int k = 0; k < 3; k++) {
        sw_type at = sw_type_info(kinds[k])->vec_dot_type;
        for (int trial = 0; trial < 12; trial++) {
            int64_t n = trial < 4 ? 256 : 1024 + 256 * (trial % 4);
            random_x(x, n, trial % 3);
            if (trial == 3) memset(x, 0, sizeof x);                  /* all zero */
            if (trial == 5) for (int64_t i = 0; i < n; i++) x[i] = 7.0f; /* all equal, positive max */
            if (trial == 6)   /* +-5: a magnitude tie, and +5 quantizes to +128, which saturates to 127 */
                for (int64_t i = 0; i < n; i++) x[i] = i % 2 ? 5.0f : -5.0f;
            size_t rs = sw_act_row_size(kinds[k], n);
            CHECK(rs == sw_row_size(at, (uint64_t)n), "act row size");
            sw_quantize_act(kinds[k], x, a, n);
            sw_quantize_row(at, x, r, n);
            CHECK(memcmp(a, r, rs) == 0, "isa %s: activation quantization for %s differs from the reference (trial %d)",
                  sw_isa_name(isa), sw_type_info(kinds[k])->name, trial);
        }
    }
}

static void test_dots(sw_isa isa)
{
    enum { NMAX = 4096 };
    static uint8_t w[NMAX * 4], act[NMAX * 4];
    static float x[NMAX];
    for (int k = 0; k < NW; k++) {
        sw_type t = WTYPES[k];
        const sw_type_traits *tr = sw_type_info(t);
        int bad = 0, trials = quick ? 8 : 40;
        for (int trial = 0; trial < trials; trial++) {
            int64_t bs = tr->block_size == 1 ? 32 : tr->block_size;
            int64_t n = bs * (1 + (int64_t)(rng_u64() % (NMAX / bs)));
            if (trial < 4) n = bs;
            if (tr->block_size == 1 && trial % 3 == 0) n = 1 + (int64_t)(rng_u64() % 100); /* float rows of any width */
            int wmode = trial % 4, amode = (trial / 4) % 3;
            random_weights(t, w, n, wmode);
            random_x(x, n, amode);
            sw_quantize_row(tr->vec_dot_type, x, act, n);
            float ref = sw_vec_dot_ref(t, n, w, act);
            float got = sw_vec_dot(t, n, w, act);
            double mag = dot_magnitude(t, w, act, n);
            bool ok = isa == SW_ISA_SCALAR ? got == ref || (isnan(got) && isnan(ref))
                                           : close_enough(got, ref, mag, tr->quantized ? 2e-6 : 1e-5);
            if (!ok && bad++ < 3)
                CHECK(ok, "isa %s %s n=%lld wmode %d amode %d: %.9g vs ref %.9g (mag %.3g)", sw_isa_name(isa),
                      tr->name, (long long)n, wmode, amode, got, ref, mag);
        }
        CHECK(bad == 0, "isa %s %s: %d of %d dots off", sw_isa_name(isa), tr->name, bad, trials);
    }
}

static void test_matmul(sw_isa isa)
{
    static const int64_t ROWS[] = {1, 7, 33};
    static const int TOKS[] = {1, 2, 3, 5, 7, 11, 12, 14, 16, 37}; /* every dotn width 1..8; 37: packed path */
    static const int QUICK_TOKS[] = {1, 2, 5, 11};   /* --quick: dotn widths 1, 2, 3, 5 */
    for (int k = 0; k < NW; k++) {
        sw_type t = WTYPES[k];
        const sw_type_traits *tr = sw_type_info(t);
        sw_type at = tr->vec_dot_type;
        for (int ri = 0; ri < (quick ? 2 : 3); ri++)
            for (int ti = 0; ti < (quick ? 4 : 10); ti++) {
                int64_t rows = ROWS[ri], cols = tr->block_size == 1 ? 96 : tr->block_size * (ri == 2 ? 3 : 2);
                int ntok = quick ? QUICK_TOKS[ti] : TOKS[ti];
                size_t rs = sw_row_size(t, (uint64_t)cols), ars = sw_row_size(at, (uint64_t)cols);
                uint8_t *w = malloc(rs * rows), *a = malloc(ars * ntok);
                float *x = malloc(sizeof(float) * cols * ntok), *y = malloc(sizeof(float) * rows * ntok);
                for (int64_t r = 0; r < rows; r++) random_weights(t, w + r * rs, cols, (int)(r % 4));
                for (int i = 0; i < ntok; i++) {
                    random_x(x + i * cols, cols, i % 3);
                    sw_quantize_row(at, x + i * cols, a + i * ars, cols);
                }
                for (int64_t i = 0; i < rows * ntok; i++) y[i] = -12345.0f;
                sw_matmul(t, w, rows, cols, x, ntok, y);
                int bad = 0;
                for (int i = 0; i < ntok; i++)
                    for (int64_t r = 0; r < rows; r++) {
                        float ref = sw_vec_dot_ref(t, cols, w + r * rs, a + i * ars);
                        float got = y[i * rows + r];
                        double mag = dot_magnitude(t, w + r * rs, a + i * ars, cols);
                        bool ok = isa == SW_ISA_SCALAR ? got == ref
                                                       : close_enough(got, ref, mag, tr->quantized ? 2e-6 : 1e-5);
                        if (!ok && bad++ < 2)
                            CHECK(ok, "isa %s %s matmul rows %lld tok %d: y[%d,%lld] = %.9g vs %.9g", sw_isa_name(isa),
                                  tr->name, (long long)rows, ntok, i, (long long)r, got, ref);
                    }
                CHECK(bad == 0, "isa %s %s matmul rows %lld ntok %d: %d wrong", sw_isa_name(isa), tr->name,
                      (long long)rows, ntok, bad);
                free(w); free(a); free(x); free(y);
            }
    }
}

/* Larger shapes through the GGUF-tensor entry points (and several threads;
 * --quick: 3 tokens, not 9). */
static void test_tensor_paths(sw_isa isa)
{
    gguf_tensor t;
    memset(&t, 0, sizeof t);
    strcpy(t.name, "test.weight");
    t.n_dims = 2;
    t.type = SW_TYPE_Q4_K;
    t.ne[0] = 1024; t.ne[1] = 300; t.ne[2] = t.ne[3] = 1;
    size_t rs = sw_row_size(t.type, t.ne[0]);
    t.nbytes = rs * t.ne[1];
    uint8_t *w = malloc(t.nbytes);
    for (uint64_t r = 0; r < t.ne[1]; r++) random_weights(t.type, w + r * rs, 1024, 3);
    t.data = w;
    int ntok = quick ? 3 : 9;
    float *x = malloc(sizeof(float) * 1024 * ntok), *y = malloc(sizeof(float) * 300 * ntok);
    uint8_t *a = malloc(sw_act_row_size(t.type, 1024) * ntok);
    size_t ars = sw_act_row_size(t.type, 1024);
    for (int i = 0; i < ntok; i++) {
        random_x(x + i * 1024, 1024, 0);
        sw_quantize_row(SW_TYPE_Q8_K, x + i * 1024, a + i * ars, 1024);
    }
    sw_matmul_tensor(&t, x, ntok, y);
    int bad = 0;
    for (int i = 0; i < ntok; i++)
        for (int r = 0; r < 300; r++) {
            float ref = sw_vec_dot_ref(t.type, 1024, w + r * rs, a + i * ars);
            double mag = dot_magnitude(t.type, w + r * rs, a + i * ars, 1024);
            if (!(isa == SW_ISA_SCALAR ? y[i * 300 + r] == ref : close_enough(y[i * 300 + r], ref, mag, 2e-6))) bad++;
        }
    CHECK(bad == 0, "isa %s: matmul_tensor %d wrong", sw_isa_name(isa), bad);

    float row[1024], want[1024];
    sw_get_row(&t, 299, row);
    sw_dequantize_row(t.type, w + 299 * rs, want, 1024);
    CHECK(memcmp(row, want, sizeof row) == 0, "get_row equals dequantize_row");
    sw_get_row(&t, 300, row);
    CHECK(isnan(row[0]), "get_row past the end: NaN, no crash");
    free(w); free(x); free(y); free(a);
}

/* The AVX-512 table without VNNI (vpmaddubsw path) is not what this CPU
 * selects when it has VNNI, so test its entries directly. */
static void test_avx512_bw_table(void)
{
    if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl") ||
        !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx2")) return;
    sw_kernel_table t;
    memset(&t, 0, sizeof t);
    sw_kernels_fill_avx512(&t, false);
    static uint8_t w[4096 * 2], act[4096 * 2];
    static float x[4096 * 4], out[4];
    int checked = 0;
    for (int k = 0; k < NW; k++) {
        sw_type ty = WTYPES[k];
        const sw_type_traits *tr = sw_type_info(ty);
        if (!t.dot[ty]) continue;
        for (int trial = 0; trial < 12; trial++) {
            int64_t n = tr->block_size == 1 ? 100 : tr->block_size * (1 + trial % 5);
            size_t ars = sw_row_size(tr->vec_dot_type, (uint64_t)n);
            random_weights(ty, w, n, trial % 4);
            for (int i = 0; i < 3; i++) {
                random_x(x + i * n, n, (trial + i) % 3);
                sw_quantize_row(tr->vec_dot_type, x + i * n, act + i * ars, n);
            }
            float ref = sw_vec_dot_ref(ty, n, w, act);
            double mag = dot_magnitude(ty, w, act, n);
            CHECK(close_enough(t.dot[ty](n, w, act), ref, mag, 1e-5), "avx512bw %s dot", tr->name);
            if (t.dotn[ty]) {
                /* with and without the d*bsums side array */
                float aux[3 * 16 * 8];
                for (int i = 0; i < 3; i++) sw_q8k_aux((const block_q8_k *)(act + i * ars), n, aux + i * 16 * 8);
                for (int with_aux = 0; with_aux < 2; with_aux++) {
                    t.dotn[ty](n, w, act, ars, with_aux ? aux : NULL, 16 * 8, 3, out, 1);
                    for (int i = 0; i < 3; i++) {
                        float r = sw_vec_dot_ref(ty, n, w, act + i * ars);
                        CHECK(close_enough(out[i], r, dot_magnitude(ty, w, act + i * ars, n), 2e-6),
                              "avx512bw %s dotn aux %d", tr->name, with_aux);
                    }
                }
            }
            checked++;
        }
    }
    CHECK(checked > 0, "avx512bw table has kernels");

    /* packed 16-row kernel */
    CHECK(t.gemm16 != NULL, "avx512bw table has gemm16");
    sw_type ktypes[] = {SW_TYPE_Q4_K, SW_TYPE_Q5_K, SW_TYPE_Q6_K};
    for (int k = 0; t.gemm16 && k < 3; k++) {
        int64_t n = 512, nb = 2;
        size_t rs = sw_row_size(ktypes[k], n), ars = sw_row_size(SW_TYPE_Q8_K, n);
        uint8_t *wr = malloc(rs * 16), *a = malloc(ars * 5);
        float aux[5 * 32], y[5 * 16];
        for (int r = 0; r < 16; r++) random_weights(ktypes[k], wr + r * rs, n, r % 4);
        for (int i = 0; i < 5; i++) {
            random_x(x, n, i % 3);
            sw_quantize_row(SW_TYPE_Q8_K, x, a + i * ars, n);
            sw_q8k_aux((const block_q8_k *)(a + i * ars), n, aux + i * 32);
        }
        sw_kpack16 *pk = aligned_alloc(64, sizeof(sw_kpack16) * nb), *pk2 = aligned_alloc(64, sizeof(sw_kpack16) * nb);
        int nsub = sw_kpack16_rows(ktypes[k], wr, rs, nb, pk);
        if (t.pack16) {
            /* the SIMD packer must give the same quants, scales and offsets */
            CHECK(t.pack16(ktypes[k], wr, rs, nb, pk2) == nsub, "pack16 nsub");
            bool same = true;
            for (int64_t b = 0; b < nb; b++) {
                same &= memcmp(pk[b].q, pk2[b].q, sizeof pk[b].q) == 0;
                same &= memcmp(pk[b].scale, pk2[b].scale, sizeof(float) * 16 * (size_t)nsub) == 0;
                same &= memcmp(pk[b].offs, pk2[b].offs, sizeof pk[b].offs) == 0;
            }
            CHECK(same, "avx512bw pack16 %s equals the scalar packer", sw_type_info(ktypes[k])->name);
        }
        free(pk2);
        t.gemm16(pk, nb, nsub, a, ars, aux, 32, 5, y, 16);
        int bad = 0;
        for (int i = 0; i < 5; i++)
            for (int r = 0; r < 16; r++) {
                float ref = sw_vec_dot_ref(ktypes[k], n, wr + r * rs, a + i * ars);
                if (!close_enough(y[i * 16 + r], ref, dot_magnitude(ktypes[k], wr + r * rs, a + i * ars, n), 2e-6)) bad++;
            }
        CHECK(bad == 0, "avx512bw gemm16 %s: %d wrong", sw_type_info(ktypes[k])->name, bad);
        free(pk); free(wr); free(a);
    }
}

/* The reference products of rows weight rows (rs bytes apart) with ntok
 * activation rows (ars bytes apart; 0: one row for all), ref[i * rows + r],
 * and each one's magnitude: computed once for all the token counts a test
 * runs (they are most of its time, and under an emulator most of that). */
static void ref_products(sw_type t, const uint8_t *w, size_t rs, int64_t rows, int64_t cols, const uint8_t *a,
                         size_t ars, int ntok, float *ref, double *mag)
{
    for (int i = 0; i < ntok; i++)
        for (int64_t r = 0; r < rows; r++) {
            ref[i * rows + r] = sw_vec_dot_ref(t, cols, w + r * rs, a + i * ars);
            mag[i * rows + r] = dot_magnitude(t, w + r * rs, a + i * ars, cols);
        }
}

/* One activation row x for weight type t, quantized by the reference. */
static void ref_act(sw_type t, const float *x, int64_t cols, uint8_t *a)
{
    sw_quantize_row(sw_type_info(t)->vec_dot_type, x, a, cols);
}

/* Prepacked K-quants and 32-weight types (sw_pack_tensor) against the
 * reference: row counts that leave 0..15 rows outside the 16-row groups,
 * every token count 1..40, all weight scale modes, and for the 32-weight
 * types odd block counts (the scale blocks' padding). On ISAs without a
 * packed kernel there is no pack, and sw_matmul_tensor must be used; that
 * is checked too. --quick: 17 rows only, token counts 1..5, 9 and 17
 * (each tile width, a tile and one token, two tiles and one). */
static void test_packed(sw_isa isa)
{
    static const int64_t ROWS[] = {16, 17, 33, 48, 15};
    static const sw_type TYPES[] = {SW_TYPE_Q4_K, SW_TYPE_Q5_K, SW_TYPE_Q6_K, SW_TYPE_Q4_0,
                                    SW_TYPE_Q4_1, SW_TYPE_Q5_0, SW_TYPE_Q5_1, SW_TYPE_Q8_0, SW_TYPE_MXFP4};
    static const int64_t Q32_COLS[] = {96, 256, 2080};
    for (int ri = 0; ri < 5 * (int)(sizeof TYPES / sizeof TYPES[0]); ri++) {
        if (quick && ri % 5 != 1) continue;
        gguf_tensor t;
        memset(&t, 0, sizeof t);
        strcpy(t.name, "packed.weight");
        t.n_dims = 2;
        t.type = TYPES[ri / 5];
        const bool q32 = sw_is_q32(t.type);
        int64_t rows = ROWS[ri % 5], cols = q32 ? Q32_COLS[ri % 3] : 256 * (1 + ri % 3);
        t.ne[0] = (uint64_t)cols; t.ne[1] = (uint64_t)rows; t.ne[2] = t.ne[3] = 1;
        size_t rs = sw_row_size(t.type, (uint64_t)cols), ars = sw_act_row_size(t.type, cols);
        t.nbytes = rs * (size_t)rows;
        uint8_t *w = malloc(t.nbytes), *a = malloc(ars * 40);
        float *x = malloc(sizeof(float) * (size_t)cols * 40), *y = malloc(sizeof(float) * (size_t)rows * 40);
        for (int64_t r = 0; r < rows; r++) random_weights(t.type, w + r * rs, cols, (int)((r + ri) % 4));
        t.data = w;
        for (int i = 0; i < 40; i++) {
            random_x(x + i * cols, cols, i % 3);
            ref_act(t.type, x + i * cols, cols, a + i * ars);
        }
        sw_packed *pk = sw_pack_tensor(&t);
        /* every packed type has a kernel from AVX2 up (vpmaddubsw without VNNI) */
        bool expect = isa >= SW_ISA_AVX2 && rows >= 16;
        CHECK((pk != NULL) == expect, "isa %s rows %lld: pack %s", sw_isa_name(isa), (long long)rows,
              pk ? "made" : "not made");
        if (!pk) { free(w); free(a); free(x); free(y); continue; }
        /* K-quants: their block structs; 32-weight types: the originals' bytes, each group padded to 64 */
        size_t group = q32 ? (16 * rs + 63) / 64 * 64
                           : (size_t)(cols / 256) * (t.type == SW_TYPE_Q4_K ? sizeof(sw_q4k16) : t.type == SW_TYPE_Q5_K
                                                                          ? sizeof(sw_q5k16) : sizeof(sw_q6k16));
        CHECK(sw_packed_bytes(pk) == (size_t)(rows / 16) * group, "packed %s size %zu", sw_type_info(t.type)->name,
              sw_packed_bytes(pk));
        const int max_tok = quick ? 17 : 40;
        float *ref = malloc(sizeof(float) * (size_t)(rows * max_tok));
        double *mag = malloc(sizeof(double) * (size_t)(rows * max_tok));
        ref_products(t.type, w, rs, rows, cols, a, ars, max_tok, ref, mag);
        int bad = 0;
        for (int ntok = 1; ntok <= max_tok; ntok = quick && ntok >= 5 ? 2 * ntok - 1 : ntok + 1) {
            for (int64_t i = 0; i < rows * ntok; i++) y[i] = -12345.0f;
            sw_matmul_packed(pk, x, ntok, y);
            for (int64_t i = 0; i < rows * ntok; i++)
                if (!close_enough(y[i], ref[i], mag[i], 2e-6) && bad++ < 3)
                    CHECK(0, "isa %s packed %s rows %lld cols %lld tok %lld/%d row %lld: %.9g vs ref %.9g",
                          sw_isa_name(isa), sw_type_info(t.type)->name, (long long)rows, (long long)cols,
                          (long long)(i / rows), ntok, (long long)(i % rows), y[i], ref[i]);
        }
        free(mag);
        CHECK(bad == 0, "isa %s packed %s rows %lld: %d wrong", sw_isa_name(isa), sw_type_info(t.type)->name,
              (long long)rows, bad);
        /* another ISA chosen after packing: same results from the original rows */
        sw_isa_set(SW_ISA_SCALAR);
        sw_matmul_packed(pk, x, 3, y);
        sw_isa_set(isa);
        for (int i = 0; i < 3; i++)
            for (int64_t r = 0; r < rows; r++)
                if (y[i * rows + r] != ref[i * rows + r]) bad++;
        CHECK(bad == 0, "packed tensor under the scalar ISA equals the reference");
        sw_packed_free(pk);
        free(w); free(a); free(x); free(y); free(ref);
    }
    gguf_tensor t8;
    memset(&t8, 0, sizeof t8);
    t8.type = SW_TYPE_F16;
    t8.ne[0] = 256; t8.ne[1] = 32; t8.ne[2] = t8.ne[3] = 1;
    t8.nbytes = sw_row_size(t8.type, 256) * 32;
    static uint8_t dummy[512 * 32];
    t8.data = dummy;
    CHECK(sw_pack_tensor(&t8) == NULL && sw_pack_tensor(NULL) == NULL, "no pack for other types / NULL");
}

/* The packed kernels at the int16 and int8 bounds: every quant at its
 * largest or its smallest value, every activation at the same extreme
 * (all-equal inputs quantize to -128 in Q8_K, 127 in Q8_0). A kernel that
 * sums too many word products before widening them, or that mishandles
 * Q8_0's -128, fails here where random blocks rarely reach the bounds. */
static void test_packed_extremes(sw_isa isa)
{
    static const sw_type TYPES[] = {SW_TYPE_Q4_K, SW_TYPE_Q5_K, SW_TYPE_Q6_K, SW_TYPE_Q4_0,
                                    SW_TYPE_Q4_1, SW_TYPE_Q5_0, SW_TYPE_Q5_1, SW_TYPE_Q8_0, SW_TYPE_MXFP4};
    static const int NTOK[] = {8, 1, 2, 3};   /* --quick: the first */
    const int64_t rows = 32, cols = 512;
    for (size_t ti = 0; ti < sizeof TYPES / sizeof TYPES[0]; ti++)
        for (int pat = 0; pat < 2; pat++) {
            const sw_type type = TYPES[ti];
            const sw_type_traits *tr = sw_type_info(type);
            gguf_tensor t;
            memset(&t, 0, sizeof t);
            t.n_dims = 2;
            t.type = type;
            t.ne[0] = (uint64_t)cols; t.ne[1] = (uint64_t)rows; t.ne[2] = t.ne[3] = 1;
            size_t rs = sw_row_size(type, (uint64_t)cols), ars = sw_act_row_size(type, cols);
            t.nbytes = rs * (size_t)rows;
            uint8_t *w = malloc(t.nbytes), *a = malloc(ars);
            /* largest / smallest quants (Q8_0: 127 / -128), then valid scales */
            memset(w, type == SW_TYPE_Q8_0 ? (pat ? 0x80 : 0x7f) : (pat ? 0x00 : 0xff), t.nbytes);
            if (type == SW_TYPE_MXFP4)   /* +12 or -12 (nibble 7 or 15) everywhere, exponents near 1 */
                for (int64_t b = 0; b < rows * cols / 32; b++) {
                    memset(w + b * tr->type_size + 1, pat ? 0x77 : 0xff, 16);
                    w[b * tr->type_size] = 127;
                }
            int off[3];
            scale_fields(type, off);
            for (int64_t b = 0; b < rows * cols / (int64_t)tr->block_size; b++)
                for (int k = 0; off[k] >= 0; k++) {
                    sw_f16 h = sw_f32_to_f16(k ? 0.5f : 1.0f);
                    memcpy(w + b * tr->type_size + off[k], &h, 2);
                }
            t.data = w;
            float *x = malloc(sizeof(float) * (size_t)cols * 8), *y = malloc(sizeof(float) * (size_t)rows * 8);
            for (int64_t i = 0; i < cols * 8; i++) x[i] = pat ? -1.0f : 1.0f;
            ref_act(type, x, cols, a);
            sw_packed *pk = sw_pack_tensor(&t);
            float ref[32];
            double mag[32];
            if (pk) ref_products(type, w, rs, rows, cols, a, 0, 1, ref, mag);   /* every token's input is x */
            int bad = 0;
            for (size_t n = 0; pk && n < (quick ? 1 : sizeof NTOK / sizeof NTOK[0]); n++) {
                sw_matmul_packed(pk, x, NTOK[n], y);
                for (int i = 0; i < NTOK[n]; i++)
                    for (int64_t r = 0; r < rows; r++)
                        if (!close_enough(y[i * rows + r], ref[r], mag[r], 2e-6) && bad++ < 2)
                            CHECK(0, "isa %s extreme %s pattern %d tok %d/%d row %lld: %.9g vs ref %.9g", sw_isa_name(isa),
                                  tr->name, pat, i, NTOK[n], (long long)r, y[i * rows + r], ref[r]);
            }
            CHECK(bad == 0, "isa %s: packed %s at the bounds (pattern %d): %d wrong", sw_isa_name(isa), tr->name, pat, bad);
            sw_packed_free(pk);
            free(w); free(a); free(x); free(y);
        }
}

/* np packs sharing one input (q/k/v style) through one sw_matmul_packed_n,
 * for each token count in ntoks, against the reference. */
static void check_fused(sw_isa isa, const char *what, int np, const sw_type *types, const int64_t *rows, int cols,
                        const int *ntoks, int n_ntoks)
{
    enum { MAXNP = 3 };
    int maxtok = 0;
    for (int n = 0; n < n_ntoks; n++) maxtok = ntoks[n] > maxtok ? ntoks[n] : maxtok;
    gguf_tensor t[MAXNP];
    sw_packed *pk[MAXNP];
    float *y[MAXNP];
    uint8_t *w[MAXNP];
    float *x = malloc(sizeof(float) * (size_t)cols * maxtok);
    uint8_t *a = malloc(sw_act_row_size(SW_TYPE_Q4_K, cols) + sw_act_row_size(SW_TYPE_Q8_0, cols));
    for (int i = 0; i < maxtok; i++) random_x(x + (size_t)i * cols, cols, i % 3);
    for (int k = 0; k < np; k++) {
        w[k] = random_tensor(&t[k], types[k], rows[k], cols, 0);
        pk[k] = sw_pack_tensor(&t[k]);
        y[k] = malloc(sizeof(float) * (size_t)rows[k] * maxtok);
    }
    int bad = 0;
    bool all_packed = true;   /* as the forward pass fuses: only when every matrix has its pack */
    for (int k = 0; k < np; k++) all_packed &= pk[k] != NULL;
    for (int n = 0; all_packed && n < n_ntoks; n++) {
        int ntok = ntoks[n];
        for (int k = 0; k < np; k++)
            for (int64_t i = 0; i < rows[k] * ntok; i++) y[k][i] = -12345.0f;
        sw_matmul_packed_n((const sw_packed *const *)pk, np, x, ntok, y);
        for (int k = 0; k < np; k++) {
            size_t rs = sw_row_size(types[k], (uint64_t)cols);
            for (int i = 0; i < ntok; i++) {
                ref_act(types[k], x + (size_t)i * cols, cols, a);   /* each type's own activation form */
                for (int64_t r = 0; r < rows[k]; r++) {
                    float ref = sw_vec_dot_ref(types[k], cols, w[k] + r * rs, a);
                    double mag = dot_magnitude(types[k], w[k] + r * rs, a, cols);
                    float got = y[k][(size_t)i * rows[k] + r];
                    if (!close_enough(got, ref, mag, 2e-6) && bad++ < 3)
                        CHECK(0, "isa %s %s: %s tok %d/%d row %lld: %.9g vs ref %.9g", sw_isa_name(isa), what,
                              sw_type_info(types[k])->name, i, ntok, (long long)r, got, ref);
                }
            }
        }
    }
    CHECK(bad == 0, "isa %s: %s: %d wrong", sw_isa_name(isa), what, bad);
    for (int k = 0; k < np; k++) { sw_packed_free(pk[k]); free(w[k]); free(y[k]); }
    free(x); free(a);
}

/* A Q4_K with leftover rows, a Q6_K and a Q5_K in one fused product.
 * --quick: the mixes at 2 tokens only. */
static void test_packed_n(sw_isa isa)
{
    static const int64_t ROWS[] = {33, 32, 64};
    static const sw_type TYPES[] = {SW_TYPE_Q4_K, SW_TYPE_Q6_K, SW_TYPE_Q5_K};
    static const int NTOK[] = {11};
    check_fused(isa, "fused packed product", 3, TYPES, ROWS, 512, NTOK, 1);
    /* Q4_K alone: fused on every ISA with a packed Q4_K kernel (AVX2 up) */
    static const int64_t ROWS4[] = {33, 64};
    static const sw_type Q4[] = {SW_TYPE_Q4_K, SW_TYPE_Q4_K};
    static const int NTOK4[] = {1, 5, 11};
    check_fused(isa, "fused packed Q4_K product", 2, Q4, ROWS4, 512, NTOK4, quick ? 1 : 3);
    /* a Q4_K_M mix for eight experts (Q4_K q, Q8_0 k and v), and a Qwen2-0.5B-style
     * fallback mix (Q5_0 q and k, Q8_0 v): both activation forms of one input */
    static const int64_t ROWSM[] = {48, 17, 32};
    static const sw_type MIX[] = {SW_TYPE_Q4_K, SW_TYPE_Q8_0, SW_TYPE_Q8_0};
    static const sw_type FALLBACK[] = {SW_TYPE_Q5_0, SW_TYPE_Q5_0, SW_TYPE_Q8_0};
    static const int NTOKM[] = {2, 1, 9, 33};
    check_fused(isa, "fused Q4_K + Q8_0 product", 3, MIX, ROWSM, 512, NTOKM, quick ? 1 : 4);
    check_fused(isa, "fused Q5_0 + Q8_0 product", 3, FALLBACK, ROWSM, 896, NTOKM, quick ? 1 : 4);
}

/* Wide matrices (8192 columns: a Q6_K group is 106 KB, so an L2 tile holds
 * only 4 groups): runs longer than a tile, tiles that cross from one matrix
 * to the next, leftover rows, a few tokens and many. Checks the matmul's
 * work split, not the kernels. */
static void test_packed_wide(sw_isa isa)
{
    static const int64_t ROWS[] = {264, 512};
    static const sw_type TYPES[] = {SW_TYPE_Q4_K, SW_TYPE_Q6_K};
    static const int NTOKS[] = {3, 20};
    check_fused(isa, "wide fused packed product", 2, TYPES, ROWS, 8192, NTOKS, 2);
}

/* Many products with their own activations in one sw_matmul_packed_jobs (a
 * mixture's experts): widths 512 and 1024, token counts 0 to 9, two jobs
 * sharing an input (a Q4_K and a Q8_0: both activation forms of it), a job
 * without a pack, leftover rows, K-quants beside 32-weight types; each
 * against the reference with its own activations. */
static void test_packed_jobs(sw_isa isa)
{
    enum { NJ = 7 };
    static const sw_type TYPES[NJ] = {SW_TYPE_Q4_K, SW_TYPE_Q8_0, SW_TYPE_Q6_K, SW_TYPE_Q5_K, SW_TYPE_Q4_1,
                                      SW_TYPE_Q4_K, SW_TYPE_Q5_K};
    static const int64_t ROWS[NJ] = {48, 33, 32, 64, 16, 32, 16};
    static const int COLS[NJ] = {512, 512, 1024, 1024, 512, 512, 512};
    static const int NTOK[NJ] = {1, 1, 3, 9, 2, 0, 5};
    static const int XOF[NJ] = {0, 0, 1, 2, 3, 4, 5};   /* jobs 0 and 1 share their input */
    gguf_tensor t[NJ];
    uint8_t *w[NJ];
    float *x[6], *y[NJ];
    sw_packed_job jobs[NJ];
    for (int i = 0; i < 6; i++) {
        int cols = 1024, nt = 9;
        x[i] = malloc(sizeof(float) * (size_t)cols * nt);
        for (int k = 0; k < nt; k++) random_x(x[i] + (size_t)k * cols, cols, (i + k) % 3);
    }
    bool all = true;
    for (int j = 0; j < NJ; j++) {
        w[j] = random_tensor(&t[j], TYPES[j], ROWS[j], COLS[j], j);
        y[j] = malloc(sizeof(float) * (size_t)ROWS[j] * 9);
        for (int64_t i = 0; i < ROWS[j] * 9; i++) y[j][i] = -12345.0f;
        jobs[j] = (sw_packed_job){ j == 6 ? NULL : sw_pack_tensor(&t[j]), x[XOF[j]], NTOK[j], y[j] };
        all &= j == 6 || jobs[j].p != NULL;
    }
    int bad = 0;
    if (all) {
        sw_matmul_packed_jobs(jobs, NJ);
        for (int j = 0; j < NJ; j++) {
            size_t rs = sw_row_size(TYPES[j], (uint64_t)COLS[j]), ars = sw_act_row_size(TYPES[j], COLS[j]);
            uint8_t *a = malloc(ars);
            for (int i = 0; i < 9; i++) {
                ref_act(TYPES[j], x[XOF[j]] + (size_t)i * COLS[j], COLS[j], a);
                for (int64_t r = 0; r < ROWS[j]; r++) {
                    float got = y[j][(size_t)i * ROWS[j] + r];
                    if (!jobs[j].p || i >= NTOK[j]) {   /* untouched */
                        if (got != -12345.0f && bad++ < 3) CHECK(0, "job %d tok %d row %lld written", j, i, (long long)r);
                        continue;
                    }
                    float ref = sw_vec_dot_ref(TYPES[j], COLS[j], w[j] + r * rs, a);
                    double mag = dot_magnitude(TYPES[j], w[j] + r * rs, a, COLS[j]);
                    if (!close_enough(got, ref, mag, 2e-6) && bad++ < 3)
                        CHECK(0, "isa %s jobs: job %d tok %d row %lld: %.9g vs ref %.9g", sw_isa_name(isa), j, i,
                              (long long)r, got, ref);
                }
            }
            free(a);
        }
    }
    CHECK(bad == 0, "isa %s: packed jobs: %d wrong", sw_isa_name(isa), bad);
    for (int j = 0; j < NJ; j++) { sw_packed_free((sw_packed *)jobs[j].p); free(w[j]); free(y[j]); }
    for (int i = 0; i < 6; i++) free(x[i]);
}

/* ---- the int8 form (sw_i8x16) ---- */

/* Group g of a w (16 rows, row size rs, nb blocks) in the int8 form, by the reference. */
static sw_i8x16 *i8_ref_group(sw_type type, const uint8_t *w, size_t rs, int64_t g, int64_t nb)
{
    sw_i8x16 *b = aligned_alloc(64, sizeof(sw_i8x16) * (size_t)nb);
    for (int64_t i = 0; i < nb; i++) CHECK(sw_i8x16_ref_block(type, w + (size_t)g * 16 * rs, rs, i, &b[i]));
    return b;
}

/* Row r of an int8-form group times one Q8_K row, in double: the form's
 * exact value, and in *mag the sum of the terms' sizes. */
/* The int8 form's nsum for ntok Q8_K rows ars bytes apart: per token and
 * block, -128 times the sum of its quants. */
static void i8_ref_nsums(const uint8_t *a, size_t ars, int ntok, int64_t nb, int32_t *ns)
{
    for (int t = 0; t < ntok; t++)
        for (int64_t i = 0; i < nb; i++) {
            const block_q8_k *b = (const block_q8_k *)(a + (size_t)t * ars) + i;
            int32_t sum = 0;
            for (int k = 0; k < QK_K; k++) sum += b->qs[k];
            ns[t * nb + i] = -128 * sum;
        }
}

static double i8_ref_dot(const sw_i8x16 *b, int64_t nb, int r, const block_q8_k *a, double *mag)
{
    double y = 0;
    *mag = 0;
    for (int64_t i = 0; i < nb; i++) {
        int64_t sum = 0, abs_sum = 0;
        for (int k = 0; k < QK_K; k++) {
            int64_t p = (int64_t)((int)b[i].q[k / 4][4 * r + k % 4] - 128) * a[i].qs[k];
            sum += p;
            abs_sum += p < 0 ? -p : p;
        }
        y += (double)b[i].d[r] * a[i].d * (double)sum;
        *mag += fabs((double)b[i].d[r] * a[i].d) * (double)abs_sum;
    }
    return y;
}

/* How far the int8 form may move one row's product from the exact one:
 * per weight, half a step (d) for v's rounding and (q_max + 1) / 256 for
 * the factors' (sw_i8x16_ref_block), times the activations' sizes. */
static double i8_bound(sw_type type, const sw_i8x16 *b, int64_t nb, int r, const block_q8_k *a)
{
    const double steps = 0.5 + (type == SW_TYPE_Q4_K ? 16 : type == SW_TYPE_Q5_K ? 32 : 64) / 256.0;
    double bound = 0;
    for (int64_t i = 0; i < nb; i++) {
        double s = 0;
        for (int k = 0; k < QK_K; k++) s += abs(a[i].qs[k]);
        bound += steps * (double)b[i].d[r] * fabs(a[i].d) * s;
    }
    return bound;
}

/* The int8 form, on each ISA that has it and this CPU runs (AVX-512 VNNI,
 * AVX2 with AVX-VNNI):
 *   - each SIMD expander gives the reference's bytes and scales, exactly,
 *     for random blocks at every scale size and sign and for zero blocks;
 *   - the kernel gives the form's exact product within float rounding at
 *     every token count;
 *   - that form stays within its rounding bound of the exact product
 *     (i8_bound), and does move it (the form is really in use);
 *   - sw_matmul_packed_jobs with the threshold at 5 tokens puts jobs at
 *     and past it on the form (tiles of a 8192-wide Q6_K, leftover rows
 *     from the original, a Q5_K) and leaves those below it exact. */
#define I8_NTOK_MOST 16   /* the most tokens any table's i8x16 takes a call */
static void test_int8_form(sw_isa isa)
{
    const bool vnni = isa == SW_ISA_AVX512;   /* else AVX2 with AVX-VNNI (vpdpbusd on ymm) */
    if (sw_isa_set(isa) != isa || !(vnni ? __builtin_cpu_supports("avx512vnni") : __builtin_cpu_supports("avxvnni"))) {
        printf("int8 form on %s: skipped (no %s on this CPU)\n", sw_isa_name(isa), vnni ? "AVX-512 VNNI" : "AVX-VNNI");
        return;
    }
    sw_kernel_table kt;
    memset(&kt, 0, sizeof kt);
    if (vnni) sw_kernels_fill_avx512(&kt, true);
    else sw_kernels_fill_avx2(&kt);
    CHECK(kt.i8x16 != NULL && kt.i8x16_ntok >= 1 && kt.i8x16_ntok <= I8_NTOK_MOST,
          "the %s table has the int8 kernel, taking 1..%d tokens a call", sw_isa_name(isa), kt.i8x16_ntok);
    static const sw_type TYPES[] = {SW_TYPE_Q4_K, SW_TYPE_Q5_K, SW_TYPE_Q6_K};
    const int64_t rows = 32, cols = 1024, nb = cols / QK_K;
    for (int ti = 0; ti < 3 && kt.i8x16; ti++) {
        const sw_type type = TYPES[ti];
        const char *name = sw_type_info(type)->name;
        CHECK(kt.i8x16_expand[type] != NULL, "%s has an expander", name);
        gguf_tensor t;
        size_t rs = sw_row_size(type, (uint64_t)cols), ars = sw_act_row_size(type, cols);
        uint8_t *w = random_tensor(&t, type, rows, cols, 0), *a = malloc(ars * I8_NTOK_MOST);
        memset(w + 5 * rs, 0, rs);   /* an all-zero row: scale 0, every byte 128 */
        sw_packed *pk = sw_pack_tensor(&t);
        CHECK(pk != NULL, "%s packs", name);
        if (!pk || !kt.i8x16_expand[type]) { free(w); free(a); continue; }
        float x[I8_NTOK_MOST * 1024];
        for (int i = 0; i < I8_NTOK_MOST; i++) {
            random_x(x + i * cols, cols, i % 3);
            ref_act(type, x + i * cols, cols, a + i * ars);
        }
        sw_i8x16 *got = aligned_alloc(64, sizeof(sw_i8x16) * (size_t)nb);
        int bad_expand = 0, bad_dot = 0, outside = 0, moved = 0;
        for (int64_t g = 0; g < rows / 16; g++) {
            sw_i8x16 *ref = i8_ref_group(type, w, rs, g, nb);
            kt.i8x16_expand[type](sw_packed_group(pk, g), nb, got);
            for (int64_t i = 0; i < nb; i++)
                if (memcmp(got[i].q, ref[i].q, sizeof ref[i].q) || memcmp(got[i].d, ref[i].d, sizeof ref[i].d)) bad_expand++;
            CHECK(g || (ref[0].d[5] == 0 && ref[0].q[7][4 * 5 + 1] == 128), "%s: a zero row stays zero", name);
            int32_t ns[I8_NTOK_MOST * 4];
            i8_ref_nsums(a, ars, I8_NTOK_MOST, nb, ns);
            for (int ntok = 1; ntok <= kt.i8x16_ntok; ntok++) {
                float y[I8_NTOK_MOST * 16];
                kt.i8x16(ref, nb, a, ars, ns, (size_t)nb, ntok, y, 16);
                for (int tk = 0; tk < ntok; tk++)
                    for (int r = 0; r < 16; r++) {
                        const block_q8_k *ab = (const block_q8_k *)(a + tk * ars);
                        double mag, want = i8_ref_dot(ref, nb, r, ab, &mag);
                        if (!close_enough(y[tk * 16 + r], want, mag, 2e-6) && bad_dot++ < 3)
                            CHECK(0, "%s int8 kernel tok %d/%d row %d: %.9g vs %.9g", name, tk, ntok, r, y[tk * 16 + r], want);
                        if (ntok > 1) continue;
                        const uint8_t *wr = w + (size_t)(g * 16 + r) * rs;
                        double exact = sw_vec_dot_ref(type, cols, wr, (const uint8_t *)ab);
                        double slack = 2e-6 * (mag + dot_magnitude(type, wr, (const uint8_t *)ab, cols));
                        if (fabs(want - exact) > i8_bound(type, ref, nb, r, ab) * (1 + 1e-4) + slack && outside++ < 3)
                            CHECK(0, "%s row %lld: int8 form %.9g, exact %.9g: outside the bound %.3g", name,
                                  (long long)(g * 16 + r), want, exact, i8_bound(type, ref, nb, r, ab));
                        moved += want != exact;
                    }
            }
            free(ref);
        }
        CHECK(bad_expand == 0, "%s: the SIMD expander equals the reference (%d blocks differ)", name, bad_expand);
        CHECK(bad_dot == 0 && outside == 0, "%s: int8 kernel %d wrong, %d outside the bound", name, bad_dot, outside);
        CHECK(moved > 16, "%s: the int8 form moves the products (%d of %lld)", name, moved, (long long)rows);
        printf("int8 form %s on %s: %lld blocks expanded as the reference, kernel at 1..%d tokens, %d of %lld products moved within the bound\n",
               name, sw_isa_name(isa), (long long)(rows / 16 * nb), kt.i8x16_ntok, moved, (long long)rows);
        sw_packed_free(pk);
        free(got); free(w); free(a);
    }
    /* Through the jobs, threshold 5 (10 for rows wider than 4096): job 0
     * (Q4_K, 33 rows, 9 tokens), 1 (Q6_K 8192 wide, 160 rows: runs across
     * 3-group tiles, 12 tokens), 2 (Q5_K, 5 tokens: at the threshold) on
     * the form; 3 (Q4_K, 4 tokens) and 4 (Q4_K 8192 wide, 7 tokens) exact;
     * 5 (Q4_K, 33 rows, 40 tokens) and 6 (Q6_K 8192 wide, 21 tokens) on
     * the form in slices of 16 where a kernel takes them (AMX). */
    enum { NJ = 7 };
    static const sw_type JT[NJ] = {SW_TYPE_Q4_K, SW_TYPE_Q6_K, SW_TYPE_Q5_K, SW_TYPE_Q4_K, SW_TYPE_Q4_K,
                                   SW_TYPE_Q4_K, SW_TYPE_Q6_K};
    static const int64_t JR[NJ] = {33, 160, 48, 32, 32, 33, 48}, JC[NJ] = {1024, 8192, 512, 512, 8192, 1024, 8192};
    static const int JN[NJ] = {9, 12, 5, 4, 7, 40, 21};
    gguf_tensor t[NJ];
    uint8_t *w[NJ];
    float *x[NJ], *y[NJ];
    sw_packed_job jobs[NJ];
    for (int j = 0; j < NJ; j++) {
        w[j] = random_tensor(&t[j], JT[j], JR[j], JC[j], j);
        x[j] = malloc(sizeof(float) * (size_t)JC[j] * JN[j]);
        for (int k = 0; k < JN[j]; k++) random_x(x[j] + (size_t)k * JC[j], JC[j], (j + k) % 3);
        y[j] = malloc(sizeof(float) * (size_t)JR[j] * JN[j]);
        jobs[j] = (sw_packed_job){ sw_pack_tensor(&t[j]), x[j], JN[j], y[j] };
    }
    int old = sw_set_i8_min_tokens(5);
    sw_matmul_packed_jobs(jobs, NJ);
    CHECK(sw_i8_min_tokens() == 5, "the threshold set is the one in effect");
    sw_set_i8_min_tokens(-1);
    /* Unset, each kernel's own: the table's here, where AMX (which has its
     * own) is not what runs it. */
    const bool amx_runs = vnni && strstr(sw_cpu_features(), "amx-int8");
    CHECK(amx_runs || sw_i8_min_tokens() == kt.i8x16_min_tokens, "%s: the form from its kernel's own %d tokens (%d)",
          sw_isa_name(isa), kt.i8x16_min_tokens, sw_i8_min_tokens());
    CHECK(sw_i8_min_tokens() > 0 && sw_set_i8_min_tokens(old) == -1, "the threshold reads back");
    int bad = 0;
    for (int j = 0; j < NJ; j++) {
        const int64_t nb = JC[j] / QK_K;
        size_t rs = sw_row_size(JT[j], (uint64_t)JC[j]), ars = sw_act_row_size(JT[j], JC[j]);
        uint8_t *a = malloc(ars);
        for (int64_t g = 0; g * 16 < JR[j]; g++) {
            const bool on_form = JN[j] >= (JC[j] > 4096 ? 10 : 5) && (g + 1) * 16 <= JR[j];   /* leftover rows: the original */
            sw_i8x16 *ref = on_form ? i8_ref_group(JT[j], w[j], rs, g, nb) : NULL;
            for (int k = 0; k < JN[j]; k++) {
                ref_act(JT[j], x[j] + (size_t)k * JC[j], JC[j], a);
                for (int r = 0; r < 16 && g * 16 + r < JR[j]; r++) {
                    const int64_t row = g * 16 + r;
                    double mag, want;
                    if (on_form) want = i8_ref_dot(ref, nb, r, (const block_q8_k *)a, &mag);
                    else {
                        want = sw_vec_dot_ref(JT[j], JC[j], w[j] + row * rs, a);
                        mag = dot_magnitude(JT[j], w[j] + row * rs, a, JC[j]);
                    }
                    float got = y[j][(size_t)k * JR[j] + row];
                    if (!close_enough(got, want, mag, 2e-6) && bad++ < 3)
                        CHECK(0, "int8 jobs: job %d tok %d row %lld (%s): %.9g vs %.9g", j, k, (long long)row,
                              on_form ? "int8 form" : "exact", got, want);
                }
            }
            free(ref);
        }
        free(a);
    }
    CHECK(bad == 0, "int8 form through the jobs: %d wrong", bad);
    for (int j = 0; j < NJ; j++) { sw_packed_free((sw_packed *)jobs[j].p); free(w[j]); free(x[j]); free(y[j]); }
}

/* The AMX int8 form (kernels_amx.c) against the AVX-512 VNNI one it
 * extends: 16 tokens at once, the same floats bit for bit, on Q4_K and
 * Q6_K groups (the +128 offset and the scales are applied in the same
 * order, and the int32 sums are exact in both). */
static void test_int8_form_amx(void)
{
    sw_kernel_table vnni, amx;
    memset(&vnni, 0, sizeof vnni);
    if (sw_isa_set(SW_ISA_AVX512) != SW_ISA_AVX512 || !__builtin_cpu_supports("avx512vnni")) {
        printf("int8 form on AMX: skipped (no AVX-512 VNNI on this CPU)\n");
        return;
    }
    sw_kernels_fill_avx512(&vnni, true);
    amx = vnni;
    if (!sw_kernels_fill_amx(&amx)) {
        printf("int8 form on AMX: skipped (no AMX-INT8 here, or the OS or SPILLWAY_AMX=0 keeps it off)\n");
        return;
    }
    CHECK(amx.i8x16_tiles && amx.i8x16_peak && !vnni.i8x16_tiles, "AMX adds the 16-token kernel and its peak");
    static const sw_type TYPES[] = {SW_TYPE_Q4_K, SW_TYPE_Q6_K};
    enum { NT = 32 };
    const int64_t rows = 32, cols = 1024, nb = cols / QK_K;
    for (int ti = 0; ti < 2; ti++) {
        const sw_type type = TYPES[ti];
        gguf_tensor t;
        size_t rs = sw_row_size(type, (uint64_t)cols), ars = sw_act_row_size(type, cols);
        uint8_t *w = random_tensor(&t, type, rows, cols, 7 + ti), *a = malloc(ars * NT);
        float *x = malloc(sizeof(float) * (size_t)cols);
        for (int k = 0; k < NT; k++) {
            random_x(x, cols, k % 3);
            ref_act(type, x, cols, a + (size_t)k * ars);
        }
        /* the quants again, 64-byte aligned and a line apart (the tile kernel's qa) */
        const size_t qs = (size_t)nb * QK_K + 64;
        int8_t *qa = aligned_alloc(64, qs * NT);
        for (int k = 0; k < NT; k++)
            for (int64_t i = 0; i < nb; i++)
                memcpy(qa + (size_t)k * qs + (size_t)i * QK_K, ((const block_q8_k *)(a + (size_t)k * ars))[i].qs, QK_K);
        int32_t ns[NT * 4];
        i8_ref_nsums(a, ars, NT, nb, ns);
        int differ = 0;
        for (int64_t g = 0; g < rows / 16; g++) {
            sw_i8x16 *ref = i8_ref_group(type, w, rs, g, nb);
            float want[NT * 16], got[NT * 16];
            for (int k = 0; k < NT; k += 8) vnni.i8x16(ref, nb, a + (size_t)k * ars, ars, ns + k * nb, (size_t)nb, 8, want + k * 16, 16);
            for (int k = 0; k < NT; k += 16)
                amx.i8x16_tiles(ref, nb, a + (size_t)k * ars, ars, qa + (size_t)k * qs, qs, ns + k * nb, (size_t)nb,
                                got + k * 16, 16);
            differ += memcmp(want, got, sizeof want) != 0;
            free(ref);
        }
        CHECK(differ == 0, "%s: AMX equals AVX-512 VNNI bit for bit (%d groups differ)", sw_type_info(type)->name, differ);
        printf("int8 form %s on AMX: %d tokens x %lld rows, the VNNI kernel's floats bit for bit\n",
               sw_type_info(type)->name, NT, (long long)rows);
        free(w); free(a); free(x); free(qa);
    }
}

/* The packed Q4_K kernel with and without software prefetch at one token
 * (sw_prefetch_one_token picks one per CPU, so test_packed checks only
 * that one against the reference): distinct entry points, and the same
 * products bit for bit at 1..5 tokens, on every table this CPU can run. */
static void test_prefetch_variants(void)
{
    if (sw_isa_set(SW_ISA_AVX512) < SW_ISA_AVX2) { printf("one-token prefetch variants: skipped (no AVX2)\n"); return; }
    const int64_t rows = 16, cols = 1024, nb = cols / QK_K;
    gguf_tensor t;
    uint8_t *w = random_tensor(&t, SW_TYPE_Q4_K, rows, cols, 1);
    sw_packed *pk = sw_pack_tensor(&t);
    size_t ars = sw_act_row_size(SW_TYPE_Q4_K, cols);
    uint8_t *a = malloc(ars * 5);
    int32_t bsp[5 * 4 * 4];
    float x[1024];
    for (int tk = 0; tk < 5; tk++) {
        random_x(x, cols, tk % 3);
        ref_act(SW_TYPE_Q4_K, x, cols, a + tk * ars);
        const block_q8_k *b = (const block_q8_k *)(a + tk * ars);
        for (int64_t i = 0; i < nb; i++)   /* the int16 pairs of 32-sums, as kernels.c's packed_bsums */
            for (int q = 0; q < 4; q++) {
                const int16_t *s = b[i].bsums;
                uint16_t lo = (uint16_t)(s[4 * q] + s[4 * q + 1]), hi = (uint16_t)(s[4 * q + 2] + s[4 * q + 3]);
                bsp[tk * nb * 4 + 4 * i + q] = (int32_t)((uint32_t)lo | (uint32_t)hi << 16);
            }
    }
    const bool vnni = __builtin_cpu_supports("avx512vnni") && sw_isa_best() == SW_ISA_AVX512;
    int differ = 0;
    for (int k = 0; k < 1 + vnni && pk; k++) {
        sw_kernel_table kt;
        memset(&kt, 0, sizeof kt);
        if (k) sw_kernels_fill_avx512(&kt, true);
        else sw_kernels_fill_avx2(&kt);
        CHECK(kt.q4k16 && kt.q4k16_pf1 && kt.q4k16 != kt.q4k16_pf1, "%s: two Q4_K entry points", k ? "avx512" : "avx2");
        for (int ntok = 1; ntok <= 5 && kt.q4k16 && kt.q4k16_pf1; ntok++) {
            float y0[5 * 16], y1[5 * 16];
            kt.q4k16((const sw_q4k16 *)sw_packed_group(pk, 0), nb, a, ars, bsp, (size_t)nb * 4, ntok, y0, 16);
            kt.q4k16_pf1((const sw_q4k16 *)sw_packed_group(pk, 0), nb, a, ars, bsp, (size_t)nb * 4, ntok, y1, 16);
            differ += memcmp(y0, y1, sizeof(float) * 16 * (size_t)ntok) != 0;
        }
        CHECK(differ == 0, "%s: Q4_K with and without one-token prefetch equal (%d token counts differ)",
              k ? "avx512" : "avx2", differ);
    }
    CHECK(pk != NULL, "Q4_K packs");
    if (pk && !differ) printf("one-token prefetch variants: equal on %s\n", vnni ? "avx2 and avx512" : "avx2");
    sw_packed_free(pk);
    free(w); free(a);
}

/* The VmFlags of the mapping of this process that holds addr ("" if none). */
static void vm_flags_of(const void *addr, char *flags, size_t n)
{
    flags[0] = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return;
    char line[512];
    bool inside = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
        } else if (inside && !strncmp(line, "VmFlags:", 8)) {
            size_t k = strcspn(line + 8, "\n");
            k = k < n - 1 ? k : n - 1;
            memcpy(flags, line + 8, k);
            flags[k] = 0;
            break;
        }
    }
    fclose(f);
}

/* A pack of 2 MB or more starts on a 2 MB boundary in a mapping advised for
 * huge pages (VmFlags "hg"), where this kernel has transparent huge pages. */
static void test_pack_huge_pages(void)
{
    gguf_tensor t;
    uint8_t *w = random_tensor(&t, SW_TYPE_Q4_K, 4096, 1024, 0);
    sw_packed *pk = sw_pack_tensor(&t);
    CHECK(pk != NULL, "a 4096 x 1024 Q4_K packs");
    if (pk) {
        const uint8_t *b = sw_packed_group(pk, 0);
        CHECK(sw_packed_bytes(pk) >= ((size_t)2 << 20), "the pack is 2 MB or more");
        CHECK((uintptr_t)b % ((size_t)2 << 20) == 0, "the pack starts on a 2 MB boundary (%p)", (const void *)b);
        char flags[256];
        vm_flags_of(b, flags, sizeof flags);
        FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
        if (thp) {
            fclose(thp);
            CHECK(strstr(flags, " hg") != NULL, "the pack's mapping is advised for huge pages (VmFlags:%s)", flags);
        } else {
            printf("no transparent huge pages in this kernel: the pack's advice not checked\n");
        }
    }
    sw_packed_free(pk);
    free(w);
}

static void test_bad_input(void)
{
    float x[100] = {0}, y[10];
    uint8_t w[1000] = {0};
    sw_matmul(SW_TYPE_Q4_K, w, 2, 100, x, 1, y);   /* 100 is not a multiple of 256 */
    CHECK(isnan(y[0]) && isnan(y[1]), "bad width gives NaN output");
    sw_matmul((sw_type)11, w, 2, 256, x, 1, y);     /* unsupported type */
    CHECK(isnan(y[0]), "unsupported type gives NaN output");
    CHECK(isnan(sw_vec_dot((sw_type)99, 32, w, w)), "unknown type dot is NaN");
    CHECK(sw_act_row_size((sw_type)99, 32) == 0, "unknown type has no act size");
}

int main(int argc, char **argv)
{
    quick = argc > 1 && !strcmp(argv[1], "--quick");
    if (argc > 1 && !quick) { fprintf(stderr, "usage: test_kernels [--quick]\n"); return 2; }
    sw_isa best = sw_isa_set(SW_ISA_AVX512);
    printf("best ISA on this CPU: %s (%s)%s\n", sw_isa_name(best), sw_cpu_features(), quick ? ", --quick" : "");
    for (int i = quick ? (int)best : 0; i <= (int)best; i++) {
        sw_isa isa = (sw_isa)i;
        CHECK(sw_isa_set(isa) == isa && sw_isa_active() == isa, "select %s", sw_isa_name(isa));
        test_quantize_act(isa);
        test_dots(isa);
        test_matmul(isa);
        test_tensor_paths(isa);
        test_packed(isa);
        test_packed_extremes(isa);
        test_packed_n(isa);
        if (!quick) test_packed_wide(isa);
        test_packed_jobs(isa);
    }
    if (best == SW_ISA_AVX512) test_avx512_bw_table();
    test_int8_form(SW_ISA_AVX512);
    test_int8_form(SW_ISA_AVX2);
    test_int8_form_amx();
    test_prefetch_variants();
    if (!quick) test_pack_huge_pages();   /* under qemu-user the mappings are the emulator's */
    test_bad_input();
    CHECK_DONE();
}
