/* FP8 E4M3 conversions; see fp8.h for the exact semantics. */
#include "worker-gpu/fp8.h"

#include <math.h>
#include <string.h>

sw_fp8 sw_fp8_from_f32(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, 4);
    uint8_t sign = (uint8_t)((bits >> 31) << 7);
    uint32_t abs = bits & 0x7FFFFFFFu;
    float a;
    memcpy(&a, &abs, 4);

    if (abs > 0x7F800000u) return (sw_fp8)(0x7F | sign);   /* NaN */
    if (a > SW_FP8_MAX) return (sw_fp8)(0x7E | sign);       /* saturate (inf too) */
    if (a <= 0x1p-10f) return sign;                         /* below half the smallest subnormal */

    uint8_t res;
    if (a >= 0x1p-6f) {
        /* Normal: keep 3 of float's 23 mantissa bits, round to nearest even.
         * A carry out of the mantissa correctly bumps the exponent. */
        uint32_t e = ((abs >> 23) & 0xFF) - 127 + 7;        /* 1..15 */
        uint32_t mant = (abs >> 20) & 7;
        uint32_t rest = abs & 0xFFFFF, half = 0x80000;
        res = (uint8_t)((e << 3) | mant);
        if (rest > half || (rest == half && (mant & 1))) res++;
        /* 448 < a never reaches here; a in (448, 464] can't since a > 448 saturated. */
    } else {
        /* Subnormal: value = q * 2^-9, q in 0..8 (8 is the smallest normal,
         * whose code 0x08 follows on naturally). Scaling by 512 is exact. */
        float v = a * 512.0f;
        float q = floorf(v), frac = v - q;
        uint32_t qi = (uint32_t)q;
        if (frac > 0.5f || (frac == 0.5f && (qi & 1))) qi++;
        res = (uint8_t)qi;
    }
    return (sw_fp8)(res | sign);
}

static float decode_bits(sw_fp8 c)
{
    int e = (c >> 3) & 0xF, m = c & 7;
    float v;
    if (e == 15 && m == 7) return (c & 0x80) ? -NAN : NAN;
    if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf(1.0f + m / 8.0f, e - 7);
    return (c & 0x80) ? -v : v;
}

static float fp8_lut[256];
static int fp8_lut_ready;

const float *sw_fp8_table(void)
{
    /* Idempotent fill: concurrent first calls write identical values. */
    if (!__atomic_load_n(&fp8_lut_ready, __ATOMIC_ACQUIRE)) {
        for (int c = 0; c < 256; c++) fp8_lut[c] = decode_bits((sw_fp8)c);
        __atomic_store_n(&fp8_lut_ready, 1, __ATOMIC_RELEASE);
    }
    return fp8_lut;
}

float sw_fp8_to_f32(sw_fp8 c) { return decode_bits(c); }

float sw_fp8_quantize_row(const float *x, size_t n, sw_fp8 *q)
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a;      /* NaN compares false: ignored */
    }
    float scale = amax > 0.0f && isfinite(amax) ? amax / SW_FP8_MAX : 1.0f;
    float inv = 1.0f / scale;
    for (size_t i = 0; i < n; i++) q[i] = sw_fp8_from_f32(x[i] * inv);
    return scale;
}

float sw_round_bf16(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return x;          /* NaN stays NaN */
    b += 0x7FFFu + ((b >> 16) & 1);
    b &= 0xFFFF0000u;
    memcpy(&x, &b, 4);
    return x;
}
