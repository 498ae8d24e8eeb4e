/* FP8 E4M3 conversion against the format's definition and CUDA's
 * __nv_cvt_float_to_fp8(..., __NV_SATFINITE, __NV_E4M3) semantics. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "tests/unit/check.h"
#include "worker-gpu/fp8.h"

/* Independent decode from the bit layout S.EEEE.MMM, bias 7. */
static double ref_decode(int c)
{
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? m * pow(2.0, -9) : (8 + m) * pow(2.0, e - 10);
    return s ? -v : v;
}
static int is_nan_code(int c) { return (c & 0x7F) == 0x7F; }

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

int main(void)
{
    const float *lut = sw_fp8_table();
    /* 1. every code decodes to the value the bit formula gives */
    for (int c = 0; c < 256; c++) {
        float v = sw_fp8_to_f32((sw_fp8)c);
        if (is_nan_code(c)) {
            CHECK(isnan(v), "code 0x%02x should be NaN, got %g", c, v);
            CHECK(isnan(lut[c]), "lut 0x%02x", c);
        } else {
            CHECK((double)v == ref_decode(c), "code 0x%02x: %.9g != %.9g", c, v, ref_decode(c));
            CHECK(fbits(lut[c]) == fbits(v), "lut 0x%02x", c);
            CHECK(!!signbit(v) == !!(c & 0x80), "sign of code 0x%02x", c);
        }
    }
    CHECK(sw_fp8_to_f32(0x7E) == 448.0f && sw_fp8_to_f32(0xFE) == -448.0f, "max");
    CHECK(sw_fp8_to_f32(0x01) == 0x1p-9f, "smallest subnormal");
    CHECK(sw_fp8_to_f32(0x08) == 0x1p-6f, "smallest normal");
    CHECK(sw_fp8_to_f32(0x07) == 7 * 0x1p-9f, "largest subnormal");

    /* 2. encode(decode(c)) == c for every non-NaN code (-0 included) */
    for (int c = 0; c < 256; c++) {
        if (is_nan_code(c)) continue;
        sw_fp8 r = sw_fp8_from_f32(sw_fp8_to_f32((sw_fp8)c));
        CHECK(r == c, "round trip 0x%02x -> 0x%02x", c, r);
    }

    /* 3. ties between adjacent codes go to the even code; just off the tie
     *    goes to the nearer one. Both signs. Midpoints are exact in float. */
    for (int sgn = 0; sgn < 2; sgn++) {
        for (int c = 0; c < 0x7E; c++) {
            int lo = c | (sgn << 7), hi = (c + 1) | (sgn << 7);
            double a = ref_decode(lo), b = ref_decode(hi);
            float mid = (float)((a + b) / 2);
            CHECK((double)mid == (a + b) / 2, "midpoint exact");
            int even = (c & 1) ? hi : lo;
            sw_fp8 r = sw_fp8_from_f32(mid);
            CHECK(r == even, "tie between 0x%02x and 0x%02x (%.9g) -> 0x%02x, want 0x%02x",
                  lo, hi, mid, r, even);
            float below = nextafterf(mid, (float)a), above = nextafterf(mid, (float)b);
            CHECK(sw_fp8_from_f32(below) == lo, "just toward 0x%02x from tie", lo);
            CHECK(sw_fp8_from_f32(above) == hi, "just toward 0x%02x from tie", hi);
        }
    }

    /* 4. saturation (SATFINITE): everything beyond 448 clamps, infinities too */
    const float big[] = { 448.0f, 448.5f, 456.0f, 464.0f, 464.001f, 480.0f, 1e6f, 3e38f, INFINITY };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        CHECK(sw_fp8_from_f32(big[i]) == 0x7E, "%g -> 0x%02x", big[i], sw_fp8_from_f32(big[i]));
        CHECK(sw_fp8_from_f32(-big[i]) == 0xFE, "-%g", big[i]);
    }
    CHECK(sw_fp8_from_f32(432.0f) == 0x7E, "432 is the tie 416/448 -> even mantissa 6 (448)");
    CHECK(sw_fp8_from_f32(431.0f) == 0x7D, "431 -> 416");
    /* NaN -> 0x7F with the sign ORed in, as cuda_fp8.hpp does */
    CHECK(sw_fp8_from_f32(NAN) == 0x7F, "NaN -> 0x%02x", sw_fp8_from_f32(NAN));
    CHECK(sw_fp8_from_f32(-NAN) == 0xFF, "-NaN -> 0x%02x", sw_fp8_from_f32(-NAN));

    /* 5. subnormal boundaries */
    CHECK(sw_fp8_from_f32(0x1p-10f) == 0x00, "2^-10 is the tie 0|2^-9 -> 0");
    CHECK(sw_fp8_from_f32(nextafterf(0x1p-10f, 1)) == 0x01, "just above 2^-10 -> 2^-9");
    CHECK(sw_fp8_from_f32(3 * 0x1p-10f) == 0x02, "tie 1|2 -> 2");
    CHECK(sw_fp8_from_f32(15 * 0x1p-10f) == 0x08, "tie 7|8 (largest subnormal|min normal) -> 8");
    CHECK(sw_fp8_from_f32(nextafterf(15 * 0x1p-10f, 0)) == 0x07, "just below -> 7");
    CHECK(sw_fp8_from_f32(0x1p-6f) == 0x08, "min normal");
    CHECK(sw_fp8_from_f32(1e-30f) == 0x00, "tiny -> +0");
    CHECK(sw_fp8_from_f32(0x1p-149f) == 0x00, "f32 denormal -> +0");
    CHECK(sw_fp8_from_f32(-1e-30f) == 0x80, "tiny negative -> -0");

    /* 6. negative zero */
    CHECK(sw_fp8_from_f32(-0.0f) == 0x80, "-0 -> 0x80");
    CHECK(sw_fp8_from_f32(0.0f) == 0x00, "+0 -> 0x00");
    CHECK(signbit(sw_fp8_to_f32(0x80)) && sw_fp8_to_f32(0x80) == 0.0f, "0x80 is -0");

    /* 7. exhaustive monotonicity over a sweep: encode is non-decreasing */
    {
        int prev = 0, ok = 1;
        for (float x = 0x1p-12f; x < 500.0f; x *= 1.0009f) {
            int r = sw_fp8_from_f32(x);
            if (r < prev) ok = 0;
            prev = r;
            /* and the chosen code is a nearest one */
            double d = fabs(ref_decode(r) - x);
            if (r > 0 && fabs(ref_decode(r - 1) - x) < d) ok = 0;
            if (r < 0x7E && fabs(ref_decode(r + 1) - x) < d) ok = 0;
        }
        CHECK(ok, "monotone and nearest over the sweep");
    }

    /* 8. per-row quantization: amax maps to 448, reconstruction error bounded */
    {
        float x[64];
        sw_fp8 q[64];
        for (int i = 0; i < 64; i++) x[i] = sinf((float)i * 0.7f) * 3.0f;
        float s = sw_fp8_quantize_row(x, 64, q);
        float amax = 0;
        for (int i = 0; i < 64; i++) amax = fmaxf(amax, fabsf(x[i]));
        CHECK(fabsf(s - amax / 448.0f) < 1e-9f, "scale %g", s);
        int ok = 1;
        for (int i = 0; i < 64; i++) {
            float r = s * sw_fp8_to_f32(q[i]);
            if (fabsf(r - x[i]) > fabsf(x[i]) * 0.0625f + s * 0x1p-9f) ok = 0;
            if (fabsf(x[i]) == amax && fabsf(sw_fp8_to_f32(q[i])) != 448.0f) ok = 0;
        }
        CHECK(ok, "row reconstruction");
        float z[4] = { 0 };
        CHECK(sw_fp8_quantize_row(z, 4, q) == 1.0f && q[0] == 0, "zero row");
    }

    /* 9. bf16 rounding: ties to even */
    CHECK(sw_round_bf16(1.0f) == 1.0f, "bf16 exact");
    CHECK(sw_round_bf16(1.0f + 0x1p-8f) == 1.0f, "bf16 tie -> even (down)");
    CHECK(sw_round_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f, "bf16 tie -> even (up)");
    CHECK(sw_round_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f, "bf16 above tie");
    CHECK_DONE();
}
