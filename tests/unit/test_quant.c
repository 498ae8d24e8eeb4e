/* Reference quant formats (llm/quant.c): fp16/bf16 conversion, quantize ->
 * dequantize error, reference dot products against float dots of the
 * dequantized rows, and real tensors from the golden llama.cpp files. */
#include "llm/quant.h"
#include "llm/gguf.h"
#include "tests/unit/check.h"
#include "tests/unit/testutil.h"

#include <math.h>
#include <stdint.h>

static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* Exact fp16 value of a finite code, computed independently with ldexp. */
static double f16_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (h & 0x8000) ? -v : v;
}

static void test_f16(void)
{
    int bad_rt = 0, bad_val = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = sw_f16_to_f32((sw_f16)h);
        int e = (h >> 10) & 31;
        if (e == 31) {
            bool nan = (h & 1023) != 0;
            if (nan != (bool)isnan(f) || (!nan && !isinf(f))) bad_val++;
        } else if ((double)f != f16_value((uint16_t)h)) {
            bad_val++;
        }
        if (sw_f32_to_f16(f) != h) bad_rt++;
    }
    CHECK(bad_val == 0, "%d fp16 codes decode wrong", bad_val);
    CHECK(bad_rt == 0, "%d fp16 codes do not round-trip", bad_rt);

    /* known values */
    CHECK(sw_f32_to_f16(1.0f) == 0x3c00, "known value");
    CHECK(sw_f32_to_f16(-2.0f) == 0xc000, "known value");
    CHECK(sw_f32_to_f16(65504.0f) == 0x7bff, "known value");
    CHECK(sw_f32_to_f16(65520.0f) == 0x7c00, "65520 rounds to inf");
    CHECK(sw_f32_to_f16(65519.996f) == 0x7bff, "known value");
    CHECK(sw_f32_to_f16(1e9f) == 0x7c00, "known value");
    CHECK(sw_f32_to_f16(-INFINITY) == 0xfc00, "known value");
    CHECK((sw_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (sw_f32_to_f16(NAN) & 0x3ff) != 0, "known value");
    CHECK(sw_f32_to_f16(bits_f(0x7f800001)) != 0x7c00, "NaN with low payload stays NaN");
    CHECK(sw_f32_to_f16(0x1p-24f) == 0x0001, "smallest subnormal");
    CHECK(sw_f32_to_f16(0x1p-25f) == 0x0000, "half of smallest subnormal ties to even 0");
    CHECK(sw_f32_to_f16(0x1.000002p-25f) == 0x0001, "just above half rounds up");
    CHECK(sw_f32_to_f16(0x3p-25f) == 0x0002, "1.5 ulp ties to even 2");
    CHECK(sw_f32_to_f16(0x1p-14f) == 0x0400, "smallest normal");
    CHECK(sw_f32_to_f16(0x1.ff8p-15f) == 0x03ff, "largest subnormal");
    CHECK(sw_f32_to_f16(0x1.ffcp-15f) == 0x0400, "tie above the largest subnormal goes to even 0x400");
    CHECK(sw_f32_to_f16(0x1.ffep-15f) == 0x0400, "rounds up into the normals");
    CHECK(sw_f32_to_f16(-0.0f) == 0x8000, "known value");
    CHECK(sw_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "tie to even (down)");
    CHECK(sw_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02, "tie to even (up)");
    CHECK(sw_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01, "above tie rounds up");
    CHECK(sw_f16_to_f32(0x3555) == 0x1.554p-2f, "known value");

    /* Random floats: the result must be the nearest fp16 (ties to even). */
    int bad_near = 0;
    for (int i = 0; i < 200000; i++) {
        float f = bits_f((uint32_t)rng_u64());
        if (isnan(f) || fabsf(f) >= 65520.0f || fabsf(f) < 0x1p-26f) continue;
        uint16_t h = sw_f32_to_f16(f);
        double v = f16_value(h), err = fabs(v - f);
        uint16_t up = (uint16_t)(h + 1), dn = (uint16_t)(h - 1);
        double eu = ((up & 0x7c00) != 0x7c00 && (up & 0x7fff)) ? fabs(f16_value(up) - f) : INFINITY;
        double ed = (h & 0x7fff) ? fabs(f16_value(dn) - f) : INFINITY;
        if (err > eu || err > ed || ((err == eu || err == ed) && (h & 1))) bad_near++;
    }
    CHECK(bad_near == 0, "%d random floats not rounded to nearest-even fp16", bad_near);

    /* bf16 */
    CHECK(sw_f32_to_bf16(1.0f) == 0x3f80, "known value");
    CHECK(sw_bf16_to_f32(0x3f80) == 1.0f, "known value");
    CHECK(sw_f32_to_bf16(bits_f(0x3f808000)) == 0x3f80, "tie to even down");
    CHECK(sw_f32_to_bf16(bits_f(0x3f818000)) == 0x3f82, "tie to even up");
    CHECK(sw_f32_to_bf16(bits_f(0x3f808001)) == 0x3f81, "known value");
    CHECK(sw_f32_to_bf16(bits_f(0x7f7fffff)) == 0x7f80, "max float rounds to inf");
    CHECK(isnan(sw_bf16_to_f32(sw_f32_to_bf16(bits_f(0x7f800001)))), "NaN stays NaN");
    int bad_bf = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = sw_bf16_to_f32((sw_bf16)h);
        if (f_bits(f) != h << 16) bad_bf++;
        if (!isnan(f) && sw_f32_to_bf16(f) != h) bad_bf++;
    }
    CHECK(bad_bf == 0, "%d bf16 codes do not round-trip", bad_bf);
}

static void test_traits(void)
{
    static const struct { sw_type t; const char *name; uint32_t bs, ts; sw_type vd; } want[] = {
        {SW_TYPE_F32, "f32", 1, 4, SW_TYPE_F32}, {SW_TYPE_F16, "f16", 1, 2, SW_TYPE_F32},
        {SW_TYPE_BF16, "bf16", 1, 2, SW_TYPE_F32}, {SW_TYPE_Q4_0, "q4_0", 32, 18, SW_TYPE_Q8_0},
        {SW_TYPE_Q4_1, "q4_1", 32, 20, SW_TYPE_Q8_0}, {SW_TYPE_Q5_0, "q5_0", 32, 22, SW_TYPE_Q8_0},
        {SW_TYPE_Q5_1, "q5_1", 32, 24, SW_TYPE_Q8_0}, {SW_TYPE_Q8_0, "q8_0", 32, 34, SW_TYPE_Q8_0},
        {SW_TYPE_MXFP4, "mxfp4", 32, 17, SW_TYPE_Q8_0},
        {SW_TYPE_Q4_K, "q4_K", 256, 144, SW_TYPE_Q8_K}, {SW_TYPE_Q5_K, "q5_K", 256, 176, SW_TYPE_Q8_K},
        {SW_TYPE_Q6_K, "q6_K", 256, 210, SW_TYPE_Q8_K}, {SW_TYPE_Q8_K, "q8_K", 256, 292, SW_TYPE_Q8_K},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const sw_type_traits *t = sw_type_info(want[i].t);
        CHECK(t && !strcmp(t->name, want[i].name) && t->block_size == want[i].bs &&
              t->type_size == want[i].ts && t->vec_dot_type == want[i].vd, "traits of %s", want[i].name);
    }
    CHECK(sw_type_info(4) == NULL && sw_type_info(5) == NULL, "removed GGML ids 4/5");
    CHECK(sw_type_info(1000) == NULL && sw_type_info(SW_TYPE_COUNT) == NULL, "known value");
    CHECK(sw_row_size(SW_TYPE_Q4_K, 4096) == 16 * 144, "known value");
    CHECK(sw_row_size(SW_TYPE_Q4_K, 100) == 0, "not a multiple of the block");
    CHECK(sw_row_size(SW_TYPE_F16, 7) == 14, "known value");
    CHECK(sw_row_size(SW_TYPE_Q8_0, UINT64_MAX / 32 * 32) == 0, "overflow is rejected");
    float f[32] = {0};
    uint8_t buf[64];
    CHECK(!sw_quantize_row(SW_TYPE_Q8_0, f, buf, 31), "bad n rejected");
    CHECK(!sw_dequantize_row((sw_type)11, buf, f, 256), "unsupported type rejected");
    CHECK(isnan(sw_vec_dot_ref(SW_TYPE_Q4_K, 100, buf, buf)), "known value");
}

typedef struct { sw_type t; double tol_gauss; } qcase;
static const qcase QTYPES[] = {
    {SW_TYPE_Q4_0, 0.09}, {SW_TYPE_Q4_1, 0.08}, {SW_TYPE_Q5_0, 0.045}, {SW_TYPE_Q5_1, 0.04},
    {SW_TYPE_Q8_0, 0.007}, {SW_TYPE_Q4_K, 0.08}, {SW_TYPE_Q5_K, 0.04}, {SW_TYPE_Q6_K, 0.02},
    {SW_TYPE_Q8_K, 0.008}, {SW_TYPE_F16, 0.0004}, {SW_TYPE_BF16, 0.003},
    /* E2M1's top binade has the steps 4, 6 (doubled 8, 12): a value there
     * can be a fifth off, as a constant -1.25 (-1 or -1.5) is. */
    {SW_TYPE_MXFP4, 0.21},
};

#define NMAX 2048

static double rel_rms(const float *x, const float *y, int n)
{
    double e = 0, s = 0;
    for (int i = 0; i < n; i++) { e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]); s += (double)x[i] * x[i]; }
    return s > 0 ? sqrt(e / s) : sqrt(e);
}

static bool all_finite(const float *y, int n)
{
    for (int i = 0; i < n; i++) if (!isfinite(y[i])) return false;
    return true;
}

/* kind: 0 gaussian, 1 zeros, 2 huge, 3 tiny, 4 one outlier, 5 all positive, 6 constant */
static void make_row(float *x, int n, int kind)
{
    for (int i = 0; i < n; i++) x[i] = rng_normal();
    switch (kind) {
    case 1: memset(x, 0, (size_t)n * sizeof *x); break;
    case 2: for (int i = 0; i < n; i++) x[i] *= 1000.0f; break;
    case 3: for (int i = 0; i < n; i++) x[i] *= 1e-3f; break;
    case 4: x[n / 3] = 60.0f; break;
    case 5: for (int i = 0; i < n; i++) x[i] = fabsf(x[i]) + 0.5f; break;
    case 6: for (int i = 0; i < n; i++) x[i] = -1.25f; break;
    }
}

static void test_roundtrip(void)
{
    static float x[NMAX], y[NMAX];
    static uint8_t q[NMAX * 4];
    const int n = NMAX;
    for (size_t k = 0; k < sizeof QTYPES / sizeof QTYPES[0]; k++) {
        sw_type t = QTYPES[k].t;
        const char *name = sw_type_info(t)->name;
        for (int kind = 0; kind <= 6; kind++) {
            make_row(x, n, kind);
            memset(q, 0xAA, sizeof q);
            CHECK(sw_quantize_row(t, x, q, n), "%s quantize", name);
            CHECK(sw_dequantize_row(t, q, y, n), "%s dequantize", name);
            CHECK(all_finite(y, n), "%s kind %d: non-finite output", name, kind);
            double e = rel_rms(x, y, n);
            double tol = QTYPES[k].tol_gauss;
            if (kind == 1) tol = 0;                     /* zeros must stay exactly zero */
            if (kind == 3) tol = tol * 1.5 + 0.02;      /* fp16 scales lose bits when tiny */
            if (kind == 4) tol = tol * 2 + 0.03;         /* the outlier's block is coarser */
            CHECK(e <= tol, "%s kind %d: relative rms error %.4f > %.4f", name, kind, e, tol);
            if (kind == 0 && getenv("SW_VERBOSE")) printf("%-5s gaussian rel rms %.4f\n", name, e);
        }
        /* The outlier itself must survive (it defines the block scale). */
        make_row(x, n, 4);
        sw_quantize_row(t, x, q, n);
        sw_dequantize_row(t, q, y, n);
        float keep = t == SW_TYPE_MXFP4 ? 0.21f : 0.05f;   /* 60 on MXFP4's grid: 48 or 64 */
        CHECK(fabsf(y[n / 3] - 60.0f) < 60.0f * keep, "%s outlier 60 -> %g", name, y[n / 3]);
    }
}

/* vec_dot_ref(w, a) == dot(dequant(w), dequant(a)) up to float rounding. */
static void test_vec_dot_ref(void)
{
    static float x[NMAX], xa[NMAX], wf[NMAX], af[NMAX];
    static uint8_t wq[NMAX * 4], aq[NMAX * 4];
    for (size_t k = 0; k < sizeof QTYPES / sizeof QTYPES[0]; k++) {
        sw_type t = QTYPES[k].t;
        const sw_type_traits *tr = sw_type_info(t);
        sw_type at = tr->vec_dot_type;
        for (int trial = 0; trial < 20; trial++) {
            int n = (int)tr->block_size * (trial % 4 == 0 ? 1 : 1 + (int)(rng_u64() % (NMAX / 256))) ;
            if (tr->block_size == 1 || tr->block_size == 32) n = 32 * (1 + (int)(rng_u64() % 64));
            make_row(x, n, trial % 7 == 1 ? 0 : trial % 7);
            make_row(xa, n, trial % 5 == 2 ? 4 : 0);
            sw_quantize_row(t, x, wq, n);
            sw_quantize_row(at, xa, aq, n);
            sw_dequantize_row(t, wq, wf, n);
            sw_dequantize_row(at, aq, af, n);
            double ref = 0, mag = 0;
            for (int i = 0; i < n; i++) { ref += (double)wf[i] * af[i]; mag += fabs((double)wf[i] * af[i]); }
            float got = sw_vec_dot_ref(t, n, wq, aq);
            CHECK(fabs(got - ref) <= 1e-5 * mag + 1e-30, "%s n=%d: vec_dot_ref %.9g vs %.9g (mag %.3g)",
                  tr->name, n, got, ref, mag);
        }
    }
    /* Q8_K bsums are the sums of 16 quants. */
    float v[256];
    block_q8_k b;
    make_row(v, 256, 0);
    sw_quantize_row(SW_TYPE_Q8_K, v, &b, 256);
    int bad = 0;
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += b.qs[16 * j + i];
        bad += s != b.bsums[j];
    }
    CHECK(bad == 0, "Q8_K bsums");
}

/* Real tensors: golden llama.cpp Q4_K_M files hold Q4_K, Q5_K, Q6_K and F32.
 * Random-normal weights, scaled: every row must dequantize to finite values
 * of a plausible spread, and requantizing with our quantizer must reproduce
 * them within that format's error. */
static void test_golden(void)
{
    static const char *files[] = {"golden/synth-spm-d256-q4km.gguf", "golden/synth-gpt2-d512-q4km.gguf"};
    int opened = 0, checked[SW_TYPE_COUNT] = {0};
    for (int f = 0; f < 2; f++) {
        char path[1024], err[256];
        shared_path(path, sizeof path, files[f]);
        FILE *probe = fopen(path, "rb");
        if (!probe) continue;
        fclose(probe);
        gguf_file *g = gguf_open(path, err, sizeof err);
        CHECK(g, "open %s: %s", path, err);
        if (!g) continue;
        opened++;
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const gguf_tensor *t = &g->tensors[i];
            if (t->n_dims != 2 || t->type == SW_TYPE_F32) continue;
            int64_t cols = (int64_t)t->ne[0];
            size_t rs = sw_row_size(t->type, (uint64_t)cols);
            CHECK(rs && rs * t->ne[1] == t->nbytes, "%s: size", t->name);
            if (!rs || cols > 8192) continue;
            float *row = malloc((size_t)cols * sizeof *row), *back = malloc((size_t)cols * sizeof *back);
            uint8_t *q = malloc(rs);
            for (int r = 0; r < 4 && (uint64_t)r < t->ne[1]; r++) {
                int64_t rr = (int64_t)(t->ne[1] - 1) * r / 3;
                CHECK(sw_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)rr * rs, row, cols), "known value");
                double s = 0, s2 = 0;
                for (int64_t c = 0; c < cols; c++) { s += row[c]; s2 += (double)row[c] * row[c]; }
                double mean = s / cols, sd = sqrt(s2 / cols - mean * mean);
                CHECK(all_finite(row, (int)cols), "%s row %lld finite", t->name, (long long)rr);
                /* normal weights scaled to keep activations sane: spread between 1e-3 and 10,
                 * mean small next to it */
                CHECK(sd > 1e-3 && sd < 10 && fabs(mean) < 0.5 * sd, "%s row %lld: mean %g sd %g",
                      t->name, (long long)rr, mean, sd);
                sw_quantize_row(t->type, row, q, cols);
                sw_dequantize_row(t->type, q, back, cols);
                double e = rel_rms(row, back, (int)cols);
                CHECK(e < 0.08, "%s row %lld: requantize error %.4f", t->name, (long long)rr, e);
                checked[t->type]++;
            }
            free(row); free(back); free(q);
        }
        gguf_close(g);
    }
    if (!opened) { printf("golden files missing: golden checks skipped\n"); return; }
    CHECK(checked[SW_TYPE_Q4_K] > 0 && checked[SW_TYPE_Q6_K] > 0, "golden files hold Q4_K and Q6_K");
}

int main(void)
{
    test_traits();
    test_f16();
    test_roundtrip();
    test_vec_dot_ref();
    test_golden();
    CHECK_DONE();
}
