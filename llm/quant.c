/* Tensor element types and the scalar reference for every block format.
 *
 * Layouts follow the GGUF/GGML block formats bit for bit, because the files
 * llama.cpp writes are read in place. Everything here is plain C and is the
 * ground truth the SIMD kernels in worker-cpu/ are tested against: keep it
 * simple and obviously correct rather than fast.
 */
#include "llm/quant.h"

#include <math.h>
#include <string.h>

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");
_Static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 size");
_Static_assert(sizeof(block_q4_k) == 144, "block_q4_k size");
_Static_assert(sizeof(block_q5_k) == 176, "block_q5_k size");
_Static_assert(sizeof(block_q6_k) == 210, "block_q6_k size");
_Static_assert(sizeof(block_q8_k) == 292, "block_q8_k size");

/* ---- type traits ------------------------------------------------------- */

static const sw_type_traits TRAITS[SW_TYPE_COUNT] = {
    [SW_TYPE_F32]  = {"f32",  1, 4, false, SW_TYPE_F32},
    [SW_TYPE_F16]  = {"f16",  1, 2, false, SW_TYPE_F32},
    [SW_TYPE_BF16] = {"bf16", 1, 2, false, SW_TYPE_F32},
    [SW_TYPE_Q4_0] = {"q4_0", QK4_0, sizeof(block_q4_0), true, SW_TYPE_Q8_0},
    [SW_TYPE_Q4_1] = {"q4_1", QK4_1, sizeof(block_q4_1), true, SW_TYPE_Q8_0},
    [SW_TYPE_Q5_0] = {"q5_0", QK5_0, sizeof(block_q5_0), true, SW_TYPE_Q8_0},
    [SW_TYPE_Q5_1] = {"q5_1", QK5_1, sizeof(block_q5_1), true, SW_TYPE_Q8_0},
    [SW_TYPE_Q8_0] = {"q8_0", QK8_0, sizeof(block_q8_0), true, SW_TYPE_Q8_0},
    [SW_TYPE_MXFP4] = {"mxfp4", QK_MXFP4, sizeof(block_mxfp4), true, SW_TYPE_Q8_0},
    [SW_TYPE_Q4_K] = {"q4_K", QK_K, sizeof(block_q4_k), true, SW_TYPE_Q8_K},
    [SW_TYPE_Q5_K] = {"q5_K", QK_K, sizeof(block_q5_k), true, SW_TYPE_Q8_K},
    [SW_TYPE_Q6_K] = {"q6_K", QK_K, sizeof(block_q6_k), true, SW_TYPE_Q8_K},
    [SW_TYPE_Q8_K] = {"q8_K", QK_K, sizeof(block_q8_k), true, SW_TYPE_Q8_K},
};

const sw_type_traits *sw_type_info(uint32_t type)
{
    if (type >= SW_TYPE_COUNT || !TRAITS[type].name) return NULL;
    return &TRAITS[type];
}

size_t sw_row_size(sw_type type, uint64_t n)
{
    const sw_type_traits *t = sw_type_info(type);
    if (!t || n % t->block_size) return 0;
    uint64_t blocks = n / t->block_size;
    if (blocks > SIZE_MAX / t->type_size) return 0;
    return (size_t)(blocks * t->type_size);
}

/* ---- fp16 / bf16 ------------------------------------------------------- */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float sw_f16_to_f32(sw_f16 h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24 is exact in float */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf / nan, payload kept */
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Rounds q + rem/2^shift to nearest, ties to even. */
static inline uint32_t round_shift_rne(uint32_t m, unsigned shift)
{
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return q;
}

sw_f16 sw_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (u >> 16) & 0x8000;
    uint32_t exp = (u >> 23) & 0xff, mant = u & 0x7fffff;
    if (exp == 0xff) {
        if (!mant) return sign | 0x7c00;
        uint32_t p = mant >> 13;
        return sign | 0x7c00 | (p ? p : 0x200); /* keep payload; never turn a NaN into inf */
    }
    int e = (int)exp - 127 + 15;
    if (e >= 31) return sign | 0x7c00;
    if (e <= 0) {
        /* half subnormal (or zero): units of 2^-24 */
        unsigned shift = (unsigned)(14 - e);
        if (shift > 24) return sign;            /* below half the smallest subnormal */
        return sign | (uint16_t)round_shift_rne(mant | 0x800000, shift);
    }
    /* a carry out of the mantissa correctly bumps the exponent (up to inf) */
    return sign | (uint16_t)round_shift_rne(((uint32_t)e << 23) | mant, 13);
}

float sw_bf16_to_f32(sw_bf16 h) { return bits_f32((uint32_t)h << 16); }

sw_bf16 sw_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (sw_bf16)((u >> 16) | 0x40); /* quiet NaN */
    return (sw_bf16)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* ---- helpers ----------------------------------------------------------- */

#define F16(x) sw_f16_to_f32(x)

/* Round to nearest, ties to even: the same rounding SIMD conversions use, so
 * vectorized quantizers can reproduce these bytes exactly. */
static inline float round_even(float x)
{
    /* adding and removing 1.5*2^23 leaves x rounded to an integer, ties to
     * even, for |x| < 2^22; callers keep x within that */
    return (x + 12582912.0f) - 12582912.0f;
}
static inline int rne(float x)
{
    if (!(x > -4e6f)) return x != x ? 0 : -4000000; /* NaN -> 0; no UB casts */
    if (x > 4e6f) return 4000000;
    return (int)round_even(x);
}
static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
/* fminf/fmaxf are library calls without -ffast-math; these compile to minss/maxss */
static inline float minf(float a, float b) { return a < b ? a : b; }
static inline float maxf(float a, float b) { return a > b ? a : b; }


static void k_pack_scales(uint8_t *s, const uint8_t *sc, const uint8_t *m)
{
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        s[j + 8] = (uint8_t)((sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4));
    }
}

/* ---- MXFP4 ------------------------------------------------------------- */

/* E2M1's values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, doubled. */
const int8_t sw_fp4_values[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };

/* An E8M0 byte is the exponent 2^(e-127); halved for the doubled table.
 * e = 0 and 1 give the denormals 2^-128 and 2^-127; 255 (NaN in the OCP
 * format) reads as 2^127, as llama.cpp reads it. */
float sw_e8m0_half(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ---- dequantize -------------------------------------------------------- */

static void deq_mxfp4(const block_mxfp4 *b, float *y)
{
    float d = sw_e8m0_half(b->e);
    for (int j = 0; j < 16; j++) {
        y[j] = d * sw_fp4_values[b->qs[j] & 0xf];
        y[j + 16] = d * sw_fp4_values[b->qs[j] >> 4];
    }
}

static void deq_q4_0(const block_q4_0 *b, float *y)
{
    float d = F16(b->d);
    for (int j = 0; j < 16; j++) {
        y[j] = d * ((b->qs[j] & 0xf) - 8);
        y[j + 16] = d * ((b->qs[j] >> 4) - 8);
    }
}

static void deq_q4_1(const block_q4_1 *b, float *y)
{
    float d = F16(b->d), m = F16(b->m);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (b->qs[j] & 0xf) + m;
        y[j + 16] = d * (b->qs[j] >> 4) + m;
    }
}

static inline uint32_t load_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* 5-bit value j (0..31) of a Q5_0/Q5_1 block: low nibble from qs, bit j of qh on top. */
static inline int q5_value(const uint8_t *qs, uint32_t qh, int j)
{
    int lo = j < 16 ? (qs[j] & 0xf) : (qs[j - 16] >> 4);
    return lo | (int)(((qh >> j) & 1) << 4);
}

static void deq_q5_0(const block_q5_0 *b, float *y)
{
    float d = F16(b->d);
    uint32_t qh = load_u32(b->qh);
    for (int j = 0; j < 32; j++) y[j] = d * (q5_value(b->qs, qh, j) - 16);
}

static void deq_q5_1(const block_q5_1 *b, float *y)
{
    float d = F16(b->d), m = F16(b->m);
    uint32_t qh = load_u32(b->qh);
    for (int j = 0; j < 32; j++) y[j] = d * q5_value(b->qs, qh, j) + m;
}

static void deq_q8_0(const block_q8_0 *b, float *y)
{
    float d = F16(b->d);
    for (int j = 0; j < 32; j++) y[j] = d * b->qs[j];
}

/* Q4_K: chunk c (64 weights) uses qs[32c..32c+31]; low nibbles are sub-block
 * 2c, high nibbles sub-block 2c+1. */
static inline int kq_value(const uint8_t *qs, const uint8_t *qh, int i)
{
    int c = i / 64, l = i % 32, hi = (i / 32) & 1;
    uint8_t byte = qs[32 * c + l];
    int v = hi ? byte >> 4 : byte & 0xf;
    /* Q5_K: plus qh[l] bit 2c (low half) / 2c+1 (high half) of chunk c */
    return qh ? v | (((qh[l] >> (2 * c + hi)) & 1) << 4) : v;
}

/* Q4_K (qh NULL) and Q5_K share everything but the fifth bit. */
static void deq_kq(sw_f16 d16, sw_f16 dmin16, const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, float *y)
{
    float d = F16(d16), dmin = F16(dmin16);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        sw_k_scale_min(scales, j, &sc, &m);
        float ds = d * sc, dm = dmin * m;
        for (int l = 0; l < 32; l++) y[32 * j + l] = ds * kq_value(qs, qh, 32 * j + l) - dm;
    }
}

static void deq_q4_k(const block_q4_k *b, float *y) { deq_kq(b->d, b->dmin, b->scales, b->qs, NULL, y); }
static void deq_q5_k(const block_q5_k *b, float *y) { deq_kq(b->d, b->dmin, b->scales, b->qs, b->qh, y); }

/* Q6_K: each 128-weight half h uses ql[64h..64h+63] and qh[32h..32h+31].
 * Weight 128h + 32k + l (k 0..3, l 0..31): low 4 bits from ql[64h + l + 32*(k&1)]
 * (low nibble for k<2, high for k>=2), high 2 bits from qh[32h + l] >> 2k. */
static inline int q6k_value(const block_q6_k *b, int i)
{
    int h = i / 128, k = (i / 32) % 4, l = i % 32;
    uint8_t lb = b->ql[64 * h + l + 32 * (k & 1)];
    int lo = k < 2 ? lb & 0xf : lb >> 4;
    int hi = (b->qh[32 * h + l] >> (2 * k)) & 3;
    return (lo | (hi << 4)) - 32;
}

static void deq_q6_k(const block_q6_k *b, float *y)
{
    float d = F16(b->d);
    for (int i = 0; i < QK_K; i++) y[i] = d * b->scales[i / 16] * q6k_value(b, i);
}

static void deq_q8_k(const block_q8_k *b, float *y)
{
    for (int i = 0; i < QK_K; i++) y[i] = b->d * b->qs[i];
}

int sw_kblock_unpack(sw_type type, const void *block, uint8_t q[QK_K], float scale[16], float offs[16])
{
    switch (type) {
    case SW_TYPE_Q4_K: case SW_TYPE_Q5_K: {
        const block_q4_k *b4 = block;
        const block_q5_k *b5 = block;
        /* d, dmin and scales sit at the same offsets in both */
        float d = F16(b4->d), dmin = F16(b4->dmin);
        const uint8_t *qs = type == SW_TYPE_Q4_K ? b4->qs : b5->qs;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int h0 = 0, h1 = 0;
                if (type == SW_TYPE_Q5_K) {
                    h0 = ((b5->qh[l] >> (2 * c)) & 1) << 4;
                    h1 = ((b5->qh[l] >> (2 * c + 1)) & 1) << 4;
                }
                q[64 * c + l] = (uint8_t)((qs[32 * c + l] & 0xf) | h0);
                q[64 * c + 32 + l] = (uint8_t)((qs[32 * c + l] >> 4) | h1);
            }
        for (int j = 0; j < 8; j++) {
            int sc, m;
            sw_k_scale_min(b4->scales, j, &sc, &m);
            scale[j] = d * sc;
            offs[2 * j] = offs[2 * j + 1] = dmin * m;
        }
        for (int j = 8; j < 16; j++) scale[j] = 0;
        return 8;
    }
    case SW_TYPE_Q6_K: {
        const block_q6_k *b = block;
        float d = F16(b->d);
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                uint8_t l0 = b->ql[64 * h + l], l1 = b->ql[64 * h + l + 32], qh = b->qh[32 * h + l];
                uint8_t *o = q + 128 * h + l;
                o[0] = (uint8_t)((l0 & 0xf) | ((qh & 3) << 4));
                o[32] = (uint8_t)((l1 & 0xf) | (((qh >> 2) & 3) << 4));
                o[64] = (uint8_t)((l0 >> 4) | (((qh >> 4) & 3) << 4));
                o[96] = (uint8_t)((l1 >> 4) | (((qh >> 6) & 3) << 4));
            }
        for (int j = 0; j < 16; j++) {
            scale[j] = d * b->scales[j];
            offs[j] = 32 * scale[j];
        }
        return 16;
    }
    default:
        return 0;
    }
}


/* ---- quantize: scale searches --------------------------------------------
 * Each search tries a handful of candidate step sizes around the naive one
 * (range / levels), rounds, then refits the scale (and offset) by least
 * squares for that rounding, keeping the fit with the smallest squared error.
 * This is what makes 4-bit formats usable: the naive scale wastes levels on
 * one outlier. */

/* Symmetric: x ~ s*q, q in [qmin, qmax] (qmin = -qmax-1). Returns s; q out.
 * For a fixed rounding q the best s is sum(xq)/sum(qq) and the error is
 * sum(xx) - sum(xq)^2/sum(qq), so each candidate costs one pass. */
static float fit_symmetric(const float *x, int n, int qmin, int qmax, int8_t *q)
{
    float amax = 0, vmax = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); vmax = x[i]; }
    if (amax == 0) { memset(q, 0, (size_t)n); return 0; }
    float best_is = -(float)qmin / -vmax;
    double best_gain = -1;
    for (int step = -4; step <= 4; step++) {
        /* map the extreme value onto the (longer) negative side, as the format allows */
        float iscale = -((float)-qmin + 0.25f * step) / vmax;
        /* four independent sums (n is a multiple of 16) so the adds pipeline */
        float a[4] = {0}, b[4] = {0};
        for (int i = 0; i < n; i += 4)
            for (int k = 0; k < 4; k++) {
                float v = minf(maxf(round_even(iscale * x[i + k]), (float)qmin), (float)qmax);
                a[k] += x[i + k] * v;
                b[k] += v * v;
            }
        float sxq = (a[0] + a[1]) + (a[2] + a[3]), sqq = (b[0] + b[1]) + (b[2] + b[3]);
        if (sqq > 0 && (double)sxq * sxq / sqq > best_gain) { best_gain = (double)sxq * sxq / sqq; best_is = iscale; }
    }
    float sxq = 0, sqq = 0;
    for (int i = 0; i < n; i++) {
        q[i] = (int8_t)clampi(rne(best_is * x[i]), qmin, qmax);
        sxq += x[i] * q[i];
        sqq += (float)q[i] * q[i];
    }
    return sqq > 0 ? sxq / sqq : 0;
}

/* Asymmetric: x ~ s*q + off, q in [0, qmax], s >= 0. With nonpos_off the
 * offset is forced <= 0 (K-quants store it as a non-negative min). For each
 * candidate rounding, (s, off) is the least-squares fit and its error has a
 * closed form, so each candidate costs one pass. */
static void fit_asymmetric(const float *x, int n, int qmax, bool nonpos_off, float *s_out, float *off_out)
{
    float lo = x[0], hi = x[0], sx = 0, sxx = 0;
    for (int i = 0; i < n; i++) {
        lo = minf(lo, x[i]);
        hi = maxf(hi, x[i]);
        sx += x[i];
        sxx += x[i] * x[i];
    }
    if (nonpos_off && lo > 0) lo = 0;
    if (hi <= lo) { *s_out = 0; *off_out = lo; return; }
    float best_s = (hi - lo) / qmax, best_off = lo;
    double best_err = INFINITY;
    for (int step = -4; step <= 4; step++) {
        float iscale = ((float)qmax + 0.25f * step) / (hi - lo);
        float a[4] = {0}, b[4] = {0}, c[4] = {0};
        for (int i = 0; i < n; i += 4)
            for (int k = 0; k < 4; k++) {
                float v = minf(maxf(round_even((x[i + k] - lo) * iscale), 0.0f), (float)qmax);
                a[k] += v;
                b[k] += v * v;
                c[k] += x[i + k] * v;
            }
        float sq = (a[0] + a[1]) + (a[2] + a[3]), sqq = (b[0] + b[1]) + (b[2] + b[3]);
        float sxq = (c[0] + c[1]) + (c[2] + c[3]);
        double det = (double)n * sqq - (double)sq * sq;
        if (det <= 0) continue;
        double s = ((double)n * sxq - (double)sq * sx) / det, off = ((double)sqq * sx - (double)sq * sxq) / det;
        if (nonpos_off && off > 0) { off = 0; s = sxq / (double)sqq; }
        if (s <= 0) continue;
        double err = s * s * sqq + 2 * s * off * sq + n * off * off - 2 * s * sxq - 2 * off * sx + sxx;
        if (err < best_err) { best_err = err; best_s = (float)s; best_off = (float)off; }
    }
    *s_out = best_s;
    *off_out = best_off;
}

/* Rounded-through-fp16 value: quantizers pick q for the scale actually stored. */
static inline float via_f16(float f) { return sw_f16_to_f32(sw_f32_to_f16(f)); }

static void quant_q4_0(const float *x, block_q4_0 *b)
{
    int8_t q[32];
    float d = via_f16(fit_symmetric(x, 32, -8, 7, q));
    float id = d ? 1.0f / d : 0;
    b->d = sw_f32_to_f16(d);
    for (int j = 0; j < 16; j++) {
        int q0 = clampi(rne(x[j] * id), -8, 7) + 8, q1 = clampi(rne(x[j + 16] * id), -8, 7) + 8;
        b->qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

/* The shared exponent puts the block's largest magnitude in [4, 8) times
 * the scale, E2M1's top binade (OCP MX: floor(log2(amax)) - 2); each value
 * then takes the nearest of the sixteen (the first of equals). */
static void quant_mxfp4(const float *x, block_mxfp4 *b)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    int e = amax > 0.0f ? (int)floorf(log2f(amax)) - 2 + 127 : 0;
    b->e = (uint8_t)clampi(e, 0, 254);
    float d = sw_e8m0_half(b->e);
    for (int j = 0; j < 32; j++) {
        int best = 0;
        for (int i = 1; i < 16; i++)
            if (fabsf(sw_fp4_values[i] * d - x[j]) < fabsf(sw_fp4_values[best] * d - x[j])) best = i;
        if (j < 16) b->qs[j] = (uint8_t)best;
        else b->qs[j - 16] |= (uint8_t)(best << 4);
    }
}

static void quant_q5_0(const float *x, block_q5_0 *b)
{
    int8_t q[32];
    float d = via_f16(fit_symmetric(x, 32, -16, 15, q));
    float id = d ? 1.0f / d : 0;
    b->d = sw_f32_to_f16(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int q0 = clampi(rne(x[j] * id), -16, 15) + 16, q1 = clampi(rne(x[j + 16] * id), -16, 15) + 16;
        b->qs[j] = (uint8_t)((q0 & 0xf) | ((q1 & 0xf) << 4));
        qh |= (uint32_t)(q0 >> 4) << j;
        qh |= (uint32_t)(q1 >> 4) << (j + 16);
    }
    memcpy(b->qh, &qh, 4);
}

static void quant_q4_1(const float *x, block_q4_1 *b)
{
    float s, off;
    fit_asymmetric(x, 32, 15, false, &s, &off);
    float d = via_f16(s), m = via_f16(off);
    float id = d ? 1.0f / d : 0;
    b->d = sw_f32_to_f16(d);
    b->m = sw_f32_to_f16(m);
    for (int j = 0; j < 16; j++) {
        int q0 = clampi(rne((x[j] - m) * id), 0, 15), q1 = clampi(rne((x[j + 16] - m) * id), 0, 15);
        b->qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

static void quant_q5_1(const float *x, block_q5_1 *b)
{
    float s, off;
    fit_asymmetric(x, 32, 31, false, &s, &off);
    float d = via_f16(s), m = via_f16(off);
    float id = d ? 1.0f / d : 0;
    b->d = sw_f32_to_f16(d);
    b->m = sw_f32_to_f16(m);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        int q0 = clampi(rne((x[j] - m) * id), 0, 31), q1 = clampi(rne((x[j + 16] - m) * id), 0, 31);
        b->qs[j] = (uint8_t)((q0 & 0xf) | ((q1 & 0xf) << 4));
        qh |= (uint32_t)(q0 >> 4) << j;
        qh |= (uint32_t)(q1 >> 4) << (j + 16);
    }
    memcpy(b->qh, &qh, 4);
}

/* Q8_0 (also the activation format of the 32-blocks): d = amax/127. */
static void quant_q8_0(const float *x, block_q8_0 *b)
{
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = d ? 1.0f / d : 0;
    b->d = sw_f32_to_f16(d);
    for (int j = 0; j < 32; j++) b->qs[j] = (int8_t)clampi(rne(x[j] * id), -127, 127);
}

/* Q8_K (activations): the value of largest magnitude maps to -128, using the
 * full int8 range; d = 1/iscale may be negative. bsums feed the min terms. */
static void quant_q8_k(const float *x, block_q8_k *b)
{
    float amax = 0, vmax = 0;
    for (int i = 0; i < QK_K; i++)
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); vmax = x[i]; }
    if (amax == 0) { memset(b, 0, sizeof *b); return; }
    float iscale = -128.0f / vmax;
    for (int i = 0; i < QK_K; i++) b->qs[i] = (int8_t)clampi(rne(iscale * x[i]), -128, 127);
    for (int j = 0; j < QK_K / 16; j++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += b->qs[16 * j + i];
        b->bsums[j] = (int16_t)s;
    }
    b->d = 1.0f / iscale;
}

/* Q4_K / Q5_K share the scale/min fit: per sub-block (s_j, min_j), then the
 * 6-bit codes relative to the block's d and dmin, then q for the stored values. */
static void kquant_scales(const float *x, int qmax, sw_f16 *d_out, sw_f16 *dmin_out,
                          uint8_t *scales, uint8_t *L)
{
    float s[8], mn[8], smax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        float off;
        fit_asymmetric(x + 32 * j, 32, qmax, true, &s[j], &off);
        mn[j] = -off;
        smax = fmaxf(smax, s[j]);
        mmax = fmaxf(mmax, mn[j]);
    }
    float d = via_f16(smax / 63), dmin = via_f16(mmax / 63);
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)(d ? clampi(rne(s[j] / d), 0, 63) : 0);
        lm[j] = (uint8_t)(dmin ? clampi(rne(mn[j] / dmin), 0, 63) : 0);
    }
    k_pack_scales(scales, ls, lm);
    *d_out = sw_f32_to_f16(d);
    *dmin_out = sw_f32_to_f16(dmin);
    for (int j = 0; j < 8; j++) {
        float ds = d * ls[j], dm = dmin * lm[j];
        for (int l = 0; l < 32; l++) {
            int i = 32 * j + l;
            L[i] = (uint8_t)(ds > 0 ? clampi(rne((x[i] + dm) / ds), 0, qmax) : 0);
        }
    }
}

static void quant_q4_k(const float *x, block_q4_k *b)
{
    uint8_t L[QK_K];
    kquant_scales(x, 15, &b->d, &b->dmin, b->scales, L);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            b->qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
}

static void quant_q5_k(const float *x, block_q5_k *b)
{
    uint8_t L[QK_K];
    kquant_scales(x, 31, &b->d, &b->dmin, b->scales, L);
    memset(b->qh, 0, sizeof b->qh);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
            b->qs[32 * c + l] = (uint8_t)((lo & 0xf) | ((hi & 0xf) << 4));
            b->qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
        }
}

static void quant_q6_k(const float *x, block_q6_k *b)
{
    float s[16], smax = 0, svmax = 0;
    int8_t qtmp[16];
    for (int j = 0; j < 16; j++) {
        s[j] = fit_symmetric(x + 16 * j, 16, -32, 31, qtmp);
        if (fabsf(s[j]) > smax) { smax = fabsf(s[j]); svmax = s[j]; }
    }
    memset(b, 0, sizeof *b);
    if (smax == 0) return;
    /* int8 sub-scales; the largest maps to -128 like the Q8_K activations */
    float iscale = -128.0f / svmax;
    float d = via_f16(1.0f / iscale);
    b->d = sw_f32_to_f16(d);
    uint8_t L[QK_K];
    for (int j = 0; j < 16; j++) {
        int ls = d ? clampi(rne(s[j] / d), -128, 127) : 0;
        b->scales[j] = (int8_t)ls;
        float ds = d * ls;
        for (int l = 0; l < 16; l++) {
            int i = 16 * j + l;
            L[i] = (uint8_t)((ds != 0 ? clampi(rne(x[i] / ds), -32, 31) : 0) + 32);
        }
    }
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *q = L + 128 * h + l;
            b->ql[64 * h + l] = (uint8_t)((q[0] & 0xf) | ((q[64] & 0xf) << 4));
            b->ql[64 * h + l + 32] = (uint8_t)((q[32] & 0xf) | ((q[96] & 0xf) << 4));
            b->qh[32 * h + l] = (uint8_t)((q[0] >> 4) | ((q[32] >> 4) << 2) |
                                          ((q[64] >> 4) << 4) | ((q[96] >> 4) << 6));
        }
}


/* ---- reference dot products ----------------------------------------------
 * Integer sums inside a block, one float multiply-add per block (or per
 * sub-block term): the SIMD kernels compute the same integers, so they can
 * only differ from these in float summation order. */

static float dot_q4_0(const block_q4_0 *w, const block_q8_0 *a)
{
    int s = 0;
    for (int j = 0; j < 16; j++)
        s += ((w->qs[j] & 0xf) - 8) * a->qs[j] + ((w->qs[j] >> 4) - 8) * a->qs[j + 16];
    return F16(w->d) * F16(a->d) * (float)s;
}

static float dot_mxfp4(const block_mxfp4 *w, const block_q8_0 *a)
{
    int s = 0;
    for (int j = 0; j < 16; j++)
        s += sw_fp4_values[w->qs[j] & 0xf] * a->qs[j] + sw_fp4_values[w->qs[j] >> 4] * a->qs[j + 16];
    return sw_e8m0_half(w->e) * F16(a->d) * (float)s;
}

static int sum_q8(const int8_t *q, int n) { int s = 0; for (int i = 0; i < n; i++) s += q[i]; return s; }

static float dot_q4_1(const block_q4_1 *w, const block_q8_0 *a)
{
    int s = 0;
    for (int j = 0; j < 16; j++) s += (w->qs[j] & 0xf) * a->qs[j] + (w->qs[j] >> 4) * a->qs[j + 16];
    float da = F16(a->d);
    return F16(w->d) * da * (float)s + F16(w->m) * da * (float)sum_q8(a->qs, 32);
}

static float dot_q5_0(const block_q5_0 *w, const block_q8_0 *a)
{
    uint32_t qh = load_u32(w->qh);
    int s = 0;
    for (int j = 0; j < 32; j++) s += (q5_value(w->qs, qh, j) - 16) * a->qs[j];
    return F16(w->d) * F16(a->d) * (float)s;
}

static float dot_q5_1(const block_q5_1 *w, const block_q8_0 *a)
{
    uint32_t qh = load_u32(w->qh);
    int s = 0;
    for (int j = 0; j < 32; j++) s += q5_value(w->qs, qh, j) * a->qs[j];
    float da = F16(a->d);
    return F16(w->d) * da * (float)s + F16(w->m) * da * (float)sum_q8(a->qs, 32);
}

static float dot_q8_0(const block_q8_0 *w, const block_q8_0 *a)
{
    int s = 0;
    for (int j = 0; j < 32; j++) s += w->qs[j] * a->qs[j];
    return F16(w->d) * F16(a->d) * (float)s;
}

/* Q4_K / Q5_K: chunk c (64 weights) holds sub-block 2c in the low nibbles of
 * qs[32c..32c+31] and sub-block 2c+1 in the high nibbles (Q5_K: plus bits 2c
 * and 2c+1 of qh[l]). */
/* Q4_K (qh NULL) and Q5_K x Q8_K. */
static float dot_kq(sw_f16 d, sw_f16 dmin, const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
                    const block_q8_k *a)
{
    int isum = 0, msum = 0;
    for (int c = 0; c < 4; c++) {
        int sc0, m0, sc1, m1, s0 = 0, s1 = 0;
        sw_k_scale_min(scales, 2 * c, &sc0, &m0);
        sw_k_scale_min(scales, 2 * c + 1, &sc1, &m1);
        const int8_t *y = a->qs + 64 * c;
        for (int l = 0; l < 32; l++) {
            s0 += kq_value(qs, qh, 64 * c + l) * y[l];
            s1 += kq_value(qs, qh, 64 * c + 32 + l) * y[l + 32];
        }
        isum += sc0 * s0 + sc1 * s1;
        msum += m0 * (a->bsums[4 * c] + a->bsums[4 * c + 1]) + m1 * (a->bsums[4 * c + 2] + a->bsums[4 * c + 3]);
    }
    return a->d * (F16(d) * (float)isum - F16(dmin) * (float)msum);
}

static float dot_q4_k(const block_q4_k *w, const block_q8_k *a) { return dot_kq(w->d, w->dmin, w->scales, w->qs, NULL, a); }
static float dot_q5_k(const block_q5_k *w, const block_q8_k *a) { return dot_kq(w->d, w->dmin, w->scales, w->qs, w->qh, a); }

/* Q6_K: see q6k_value. For half h and l in one 16-run (sub-block 8h + l/16),
 * the same ql/qh bytes give weights 128h + l + 32k of sub-blocks +2k. */
static float dot_q6_k(const block_q6_k *w, const block_q8_k *a)
{
    int isum = 0;
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < 2; r++) {
            int s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (int l = 16 * r; l < 16 * r + 16; l++) {
                uint8_t l0 = w->ql[64 * h + l], l1 = w->ql[64 * h + l + 32], qh = w->qh[32 * h + l];
                const int8_t *y = a->qs + 128 * h + l;
                s0 += (((l0 & 0xf) | ((qh & 3) << 4)) - 32) * y[0];
                s1 += (((l1 & 0xf) | (((qh >> 2) & 3) << 4)) - 32) * y[32];
                s2 += (((l0 >> 4) | (((qh >> 4) & 3) << 4)) - 32) * y[64];
                s3 += (((l1 >> 4) | (((qh >> 6) & 3) << 4)) - 32) * y[96];
            }
            const int8_t *sc = w->scales + 8 * h + r;
            isum += sc[0] * s0 + sc[2] * s1 + sc[4] * s2 + sc[6] * s3;
        }
    return a->d * F16(w->d) * (float)isum;
}

static float dot_q8_k(const block_q8_k *w, const block_q8_k *a)
{
    int s = 0;
    for (int i = 0; i < QK_K; i++) s += w->qs[i] * a->qs[i];
    return w->d * a->d * (float)s;
}

/* ---- the scalar reference of each block type, and the row functions ----
 * One table, so that dequantize, quantize and dot find a type's block
 * functions the same way. The adapters take void pointers (calling a
 * function through a pointer of another type is undefined). */

typedef struct {
    void (*deq)(const void *blk, float *y);
    void (*quant)(const float *x, void *blk);
    float (*dot)(const void *w, const void *act);
} block_ref;

#define BLOCK_REF(T)                                                                      \
    static void deq_##T##_v(const void *b, float *y) { deq_##T(b, y); }                  \
    static void quant_##T##_v(const float *x, void *b) { quant_##T(x, b); }              \
    static float dot_##T##_v(const void *w, const void *a) { return dot_##T(w, a); }
BLOCK_REF(q4_0) BLOCK_REF(q4_1) BLOCK_REF(q5_0) BLOCK_REF(q5_1) BLOCK_REF(q8_0) BLOCK_REF(mxfp4)
BLOCK_REF(q4_k) BLOCK_REF(q5_k) BLOCK_REF(q6_k) BLOCK_REF(q8_k)
#undef BLOCK_REF

#define REF(T) { deq_##T##_v, quant_##T##_v, dot_##T##_v }
static const block_ref BLOCK_REFS[SW_TYPE_COUNT] = {
    [SW_TYPE_Q4_0] = REF(q4_0), [SW_TYPE_Q4_1] = REF(q4_1), [SW_TYPE_Q5_0] = REF(q5_0),
    [SW_TYPE_Q5_1] = REF(q5_1), [SW_TYPE_Q8_0] = REF(q8_0), [SW_TYPE_Q4_K] = REF(q4_k),
    [SW_TYPE_Q5_K] = REF(q5_k), [SW_TYPE_Q6_K] = REF(q6_k), [SW_TYPE_Q8_K] = REF(q8_k),
    [SW_TYPE_MXFP4] = REF(mxfp4),
};
#undef REF

bool sw_dequantize_row(sw_type type, const void *src, float *dst, int64_t n)
{
    const sw_type_traits *t = sw_type_info(type);
    if (!t || n < 0 || n % t->block_size) return false;
    int64_t nb = n / t->block_size;
    const uint8_t *p = src;
    switch (type) {
    case SW_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); return true;
    case SW_TYPE_F16:
        for (int64_t i = 0; i < n; i++) { sw_f16 h; memcpy(&h, p + 2 * i, 2); dst[i] = sw_f16_to_f32(h); }
        return true;
    case SW_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) { sw_bf16 h; memcpy(&h, p + 2 * i, 2); dst[i] = sw_bf16_to_f32(h); }
        return true;
    default: break;
    }
    const block_ref *r = &BLOCK_REFS[type];
    if (!r->deq) return false;
    for (int64_t i = 0; i < nb; i++) r->deq(p + i * t->type_size, dst + i * t->block_size);
    return true;
}

bool sw_quantize_row(sw_type type, const float *src, void *dst, int64_t n)
{
    const sw_type_traits *t = sw_type_info(type);
    if (!t || n < 0 || n % t->block_size) return false;
    uint8_t *p = dst;
    switch (type) {
    case SW_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); return true;
    case SW_TYPE_F16:
        for (int64_t i = 0; i < n; i++) { sw_f16 h = sw_f32_to_f16(src[i]); memcpy(p + 2 * i, &h, 2); }
        return true;
    case SW_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) { sw_bf16 h = sw_f32_to_bf16(src[i]); memcpy(p + 2 * i, &h, 2); }
        return true;
    default: break;
    }
    const block_ref *r = &BLOCK_REFS[type];
    if (!r->quant) return false;
    int64_t nb = n / t->block_size;
    for (int64_t i = 0; i < nb; i++) r->quant(src + i * t->block_size, p + i * t->type_size);
    return true;
}

float sw_vec_dot_ref(sw_type type, int64_t n, const void *w, const void *act)
{
    const sw_type_traits *t = sw_type_info(type);
    if (!t || n < 0 || n % t->block_size) return NAN;
    const uint8_t *pw = w, *pa = act;
    const float *x = act;
    float sum = 0;
    switch (type) {
    case SW_TYPE_F32:
        for (int64_t i = 0; i < n; i++) sum += ((const float *)w)[i] * x[i];
        return sum;
    case SW_TYPE_F16:
        for (int64_t i = 0; i < n; i++) { sw_f16 h; memcpy(&h, pw + 2 * i, 2); sum += sw_f16_to_f32(h) * x[i]; }
        return sum;
    case SW_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) { sw_bf16 h; memcpy(&h, pw + 2 * i, 2); sum += sw_bf16_to_f32(h) * x[i]; }
        return sum;
    default: break;
    }
    const block_ref *r = &BLOCK_REFS[type];
    if (!r->dot) return NAN;
    const sw_type_traits *at = sw_type_info(t->vec_dot_type);
    int64_t nb = n / t->block_size;
    for (int64_t i = 0; i < nb; i++) sum += r->dot(pw + i * t->type_size, pa + i * at->type_size);
    return sum;
}
