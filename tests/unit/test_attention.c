/* The attention tile kernels of every ISA this CPU has, against plain double
 * arithmetic over the same half-precision cache: the conversion into the
 * cache (rounding, saturation, NaN), scores for query tiles with missing
 * rows, and P.V for head sizes with and without the 64-wide tile; the same
 * over a q8_0 cache, against double arithmetic over its dequantized
 * values. */
#include "tests/unit/check.h"
#include "worker-cpu/attention.h"

#include <math.h>
#include <stdint.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {   /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((int64_t)(rng >> 40) - (1 << 23)) / (float)(1 << 23);
}

static bool is_nan_half(sw_f16 h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff); }

static void test_to_f16(sw_isa isa, const sw_attn_kernels *k)
{
    enum { N = 67 };   /* not a multiple of 8 or 16: the tails too */
    float x[N];
    sw_f16 y[N];
    static const float special[] = {0.0f, -0.0f, 65504.0f, -65504.0f, 65519.0f, 65520.0f, 1e9f, -1e9f,
                                    INFINITY, -INFINITY, 6e-8f, 3e-8f, -6.1e-5f, 1.0009765625f, 1.00048828125f};
    int ns = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < N; i++) x[i] = i < ns ? special[i] : frand() * 300.0f;
    x[N - 1] = NAN;
    k->to_f16(x, y, N);
    int bad = 0;
    for (int i = 0; i < N - 1; i++) {
        sw_f16 want = sw_attn_to_f16(x[i]);
        if (y[i] != want && bad++ < 3)
            CHECK(0, "isa %s: to_f16(%.9g) = 0x%04x, want 0x%04x", sw_isa_name(isa), x[i], y[i], want);
    }
    CHECK(bad == 0, "isa %s: %d conversions differ from sw_attn_to_f16", sw_isa_name(isa), bad);
    CHECK(is_nan_half(y[N - 1]), "isa %s: NaN stays NaN (got 0x%04x)", sw_isa_name(isa), y[N - 1]);
    CHECK(y[2] == 0x7bff && y[4] == 0x7bff && y[5] == 0x7bff && y[6] == 0x7bff && y[3] == 0xfbff && y[9] == 0xfbff,
          "isa %s: saturation to +-65504", sw_isa_name(isa));
    CHECK(y[13] == 0x3c01 && y[14] == 0x3c00, "isa %s: ties round to even (0x%04x 0x%04x)", sw_isa_name(isa), y[13],
          y[14]);
}

/* sum_k a[k] * h[k * hs] in double, and sum_k |a[k] * h[k * hs]| in *mag. */
static double ref_dot(const float *a, const sw_f16 *h, size_t hs, int n, double *mag)
{
    double sum = 0;
    *mag = 0;
    for (int k = 0; k < n; k++) {
        double t = (double)a[k] * sw_f16_to_f32(h[(size_t)k * hs]);
        sum += t;
        *mag += fabs(t);
    }
    return sum;
}

/* Scores and P.V of M query rows over N cached positions, head size hd. */
static void test_tiles(sw_isa isa, const sw_attn_kernels *k, int M, int hd, int N)
{
    const int pad = (N + 31) & ~31, ss = pad;
    float *Q = malloc(sizeof(float) * (size_t)M * hd), *S = malloc(sizeof(float) * (size_t)M * ss);
    float *P = malloc(sizeof(float) * (size_t)M * ss), *O = malloc(sizeof(float) * (size_t)M * hd);
    float *zero = calloc((size_t)(hd > pad ? hd : pad), sizeof(float));
    sw_f16 *KT = malloc(sizeof(sw_f16) * (size_t)hd * pad), *V = malloc(sizeof(sw_f16) * (size_t)pad * hd);
    for (int i = 0; i < M * hd; i++) Q[i] = frand();
    for (int i = 0; i < hd * pad; i++) KT[i] = sw_attn_to_f16(frand() * 4.0f);
    for (int i = 0; i < pad * hd; i++) V[i] = sw_attn_to_f16(frand() * 4.0f);
    for (int i = 0; i < M * ss; i++) P[i] = frand() * 0.5f + 0.5f;
    k->scores(Q, M, hd, KT, N, S, (size_t)ss, zero);
    k->pv(P, (size_t)ss, M, V, hd, N, O, zero);
    int bad = 0;
    for (int r = 0; r < M; r++) {
        for (int j = 0; j < N; j++) {   /* S[r][j] = Q[r] . K^T column j */
            double mag, ref = ref_dot(Q + r * hd, KT + sw_attn_k_at(hd, 0, j), SW_ATTN_KBLOCK, hd, &mag);
            if (fabs(S[r * ss + j] - ref) > 1e-5 * mag + 1e-6 && bad++ < 3)
                CHECK(0, "isa %s M %d hd %d N %d: S[%d][%d] = %.9g, ref %.9g", sw_isa_name(isa), M, hd, N, r, j,
                      S[r * ss + j], ref);
        }
        for (int d = 0; d < hd; d++) {  /* O[r][d] = P[r] . V column d */
            double mag, ref = ref_dot(P + r * ss, V + d, (size_t)hd, N, &mag);
            if (fabs(O[r * hd + d] - ref) > 1e-5 * mag + 1e-6 && bad++ < 3)
                CHECK(0, "isa %s M %d hd %d N %d: O[%d][%d] = %.9g, ref %.9g", sw_isa_name(isa), M, hd, N, r, d,
                      O[r * hd + d], ref);
        }
    }
    CHECK(bad == 0, "isa %s M %d hd %d N %d: %d values off", sw_isa_name(isa), M, hd, N, bad);
    free(Q); free(S); free(P); free(O); free(zero); free(KT); free(V);
}

/* Whether got is ref to within 1e-5 of the sum of the terms' magnitudes;
 * the first 3 misses of a case are reported. */
static void near_q8(int *bad, sw_isa isa, int M, int hd, int N, const char *what, int r, int c, double got, double ref,
                    double mag)
{
    if (fabs(got - ref) > 1e-5 * mag + 1e-6 && (*bad)++ < 3)
        CHECK(0, "isa %s q8_0 M %d hd %d N %d: %s[%d][%d] = %.9g, ref %.9g", sw_isa_name(isa), M, hd, N, what, r, c, got,
              ref);
}

/* test_tiles over a q8_0 cache: int8 elements, a half scale per 32 dimensions
 * of a position (KS and VS both at sw_attn_k_at(hd / 32, g, j)); the
 * reference multiplies the dequantized values. */
static void test_tiles_q8(sw_isa isa, const sw_attn_kernels *k, int M, int hd, int N)
{
    const int pad = (N + 31) & ~31, ss = pad, ng = hd / SW_KV_GROUP;
    float *Q = malloc(sizeof(float) * (size_t)M * hd), *S = malloc(sizeof(float) * (size_t)M * ss);
    float *P = malloc(sizeof(float) * (size_t)M * ss), *O = malloc(sizeof(float) * (size_t)M * hd);
    float *zero = calloc((size_t)(hd > pad ? hd : pad), sizeof(float));
    int8_t *KT = malloc((size_t)hd * pad), *V = malloc((size_t)pad * hd);
    sw_f16 *KS = malloc(sizeof(sw_f16) * (size_t)ng * pad), *VS = malloc(sizeof(sw_f16) * (size_t)pad * ng);
    for (int i = 0; i < M * hd; i++) Q[i] = frand();
    for (int i = 0; i < hd * pad; i++) KT[i] = (int8_t)(frand() * 127.5f);
    for (int i = 0; i < pad * hd; i++) V[i] = (int8_t)(frand() * 127.5f);
    for (int i = 0; i < ng * pad; i++) KS[i] = sw_attn_to_f16(frand() * 0.05f);   /* signs too: a scale is d */
    for (int i = 0; i < pad * ng; i++) VS[i] = sw_attn_to_f16(frand() * 0.05f);
    for (int i = 0; i < M * ss; i++) P[i] = frand() * 0.5f + 0.5f;
    k->scores_q8(Q, M, hd, KT, KS, N, S, (size_t)ss, zero);
    k->pv_q8(P, (size_t)ss, M, V, VS, hd, N, O, zero);
    int bad = 0;
    for (int r = 0; r < M; r++) {
        for (int j = 0; j < N; j++) {
            double ref = 0, mag = 0;
            for (int d = 0; d < hd; d++) {
                double t = (double)Q[r * hd + d] * KT[sw_attn_k_at(hd, d, j)] *
                           sw_f16_to_f32(KS[sw_attn_k_at(ng, d / SW_KV_GROUP, j)]);
                ref += t;
                mag += fabs(t);
            }
            near_q8(&bad, isa, M, hd, N, "S", r, j, S[r * ss + j], ref, mag);
        }
        for (int d = 0; d < hd; d++) {
            double ref = 0, mag = 0;
            for (int j = 0; j < N; j++) {
                double t = (double)P[r * ss + j] * V[(size_t)j * hd + d] *
                           sw_f16_to_f32(VS[sw_attn_k_at(ng, d / SW_KV_GROUP, j)]);
                ref += t;
                mag += fabs(t);
            }
            near_q8(&bad, isa, M, hd, N, "O", r, d, O[r * hd + d], ref, mag);
        }
    }
    CHECK(bad == 0, "isa %s q8_0 M %d hd %d N %d: %d values off", sw_isa_name(isa), M, hd, N, bad);
    free(Q); free(S); free(P); free(O); free(zero); free(KT); free(V); free(KS); free(VS);
}

int main(void)
{
    sw_isa best = sw_isa_active();
    printf("ISA in use: %s (best on this CPU: %s)\n", sw_isa_name(best), sw_isa_name(sw_isa_best()));
    for (int i = 0; i <= (int)best; i++) {
        sw_isa isa = (sw_isa)i;
        const sw_attn_kernels *k = sw_attn_kernels_for(isa);
        test_to_f16(isa, k);
        static const int M[] = {1, 4, 5}, HD[] = {8, 64, 128}, N[] = {1, 31, 33, 100};
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++)
                for (int c = 0; c < 4; c++) test_tiles(isa, k, M[a], HD[b], N[c]);
        static const int HD8[] = {32, 64, 128};   /* q8_0: multiples of its 32; 32 takes P.V's narrow path */
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++)
                for (int c = 0; c < 4; c++) test_tiles_q8(isa, k, M[a], HD8[b], N[c]);
    }
    CHECK_DONE();
}
