/* The int8 form (sw_i8x16) on AMX: Intel's tile unit (Sapphire Rapids and
 * later Xeons), for products of many tokens.
 *
 * One tdpbsud multiplies a tile of 16 rows x 64 signed bytes by one of 16
 * rows x 64 unsigned bytes laid out as dword columns, into 16 x 16 int32:
 *   C[m][n] += sum_k A[m][k] * B[k/4][4n + k%4].
 * With A = 16 tokens' quants of one 64-weight chunk (row m at the token's
 * stride, from the activations' 64-byte aligned copy, sw_i8x16_tiles_fn's
 * qa: rows that straddle lines, as Q8_K's do, halved the tile loads' speed)
 * and B = the int8 form's q[16c .. 16c+15] (q[k][4r+e] = v(r, 4k+e) + 128,
 * the layout the AVX-512 kernel broadcasts against),
 * C[m][n] is token m's dot with row n, offset included, in one instruction
 * per 16 x 16 x 64 = 16384 multiply-adds: a block of 16 rows and 16 tokens
 * is 4 of them. The +128 offset and the scales are then applied as in
 * i8x16_vnni, in the same order, so the two give the same floats.
 *
 * On the Xeon this was built on, tdpbsud ran 3.4 T multiply-adds a second a
 * core against vpdpbusd's 0.45 (docs/perf/cpu.md, "The int8 form: two
 * chains, its own peak, and AMX"). What is left per
 * block is the tile store and 16 tokens' int32 -> float work on zmm.
 *
 * Linux hands out the tile state only on request (arch_prctl
 * ARCH_REQ_XCOMP_PERM, once a process); a thread must load a tile
 * configuration before its first tile instruction, so each does on first
 * use. The tiles stay configured for the thread's life: only this file
 * uses them.
 */
#include "worker-cpu/kernels_impl.h"

#include <cpuid.h>
#include <immintrin.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* LDTILECFG's 64-byte operand, palette 1. */
typedef struct {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg;
_Static_assert(sizeof(amx_tilecfg) == 64, "amx_tilecfg: LDTILECFG's 64 bytes");

/* Tiles (numbers, as the intrinsics paste them into the instruction):
 * 0-1 and 2-3 the sums of even and odd blocks, two each (the even and the
 * odd 64-weight chunks), so that the four products of a block are two
 * chains of two and a block's products need not wait for the previous
 * block's store; 4 the tokens' quants, 5 the weights. */
#define T_ACT 4
#define T_W 5

static __thread bool tiles_configured;

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,amx-tile,amx-int8")

/* Every tile 16 rows of 64 bytes. A static object: GCC 12's
 * _tile_loadconfig tells the compiler it reads 8 bytes, and a config built
 * on the stack lost its stores (ldtilecfg then faulted on the zeros). */
static const amx_tilecfg TILES = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

static void configure_tiles(void)
{
    _tile_loadconfig(&TILES);
    tiles_configured = true;
}

/* Block B's products: chunks 0 and 2 into sum tile S0, 1 and 3 into S1,
 * both stored to SUMS (a macro: a tile number must be a constant). */
#define BLOCK_PRODUCTS(B, S0, S1, SUMS)                                                   \
    do {                                                                                  \
        _tile_zero(S0);                                                                   \
        _tile_zero(S1);                                                                   \
        for (int c = 0; c < 4; c += 2) {                                                  \
            _tile_loadd(T_W, p[B].q[16 * c], 64);                                         \
            _tile_loadd(T_ACT, qa + 256 * (B) + 64 * c, (long)qa_stride);                 \
            _tile_dpbsud(S0, T_ACT, T_W);                                                 \
            _tile_loadd(T_W, p[B].q[16 * c + 16], 64);                                    \
            _tile_loadd(T_ACT, qa + 256 * (B) + 64 * c + 64, (long)qa_stride);            \
            _tile_dpbsud(S1, T_ACT, T_W);                                                 \
        }                                                                                 \
        _tile_stored(S0, SUMS[0], 64);                                                    \
        _tile_stored(S1, SUMS[1], 64);                                                    \
    } while (0)

/* Y for 16 rows (nb blocks of the int8 form at p) x 16 tokens: block i+1's
 * products go out before block i's sums are read, so the tile unit and the
 * vector work overlap. */
static void i8x16_amx(const sw_i8x16 *p, int64_t nb, const void *act, size_t stride, const int8_t *qa,
                      size_t qa_stride, const int32_t *nsum, size_t nsum_stride, float *out, size_t ostride)
{
    if (!tiles_configured) configure_tiles();
    int32_t sums[2][2][16][16] __attribute__((aligned(64)));   /* [block parity][chain][token][row] */
    __m512 total[16];
    _Pragma("GCC unroll 16")
    for (int t = 0; t < 16; t++) total[t] = _mm512_setzero_ps();
    BLOCK_PRODUCTS(0, 0, 1, sums[0]);
    for (int64_t i = 0; i < nb; i++) {
        if (i + 1 < nb) {
            if ((i + 1) & 1) BLOCK_PRODUCTS(i + 1, 2, 3, sums[1]);
            else BLOCK_PRODUCTS(i + 1, 0, 1, sums[0]);
        }
        const __m512 d = _mm512_load_ps(p[i].d);
        int32_t (*s)[16][16] = sums[i & 1];
        _Pragma("GCC unroll 16")
        for (int t = 0; t < 16; t++) {
            const __m512i sum = _mm512_add_epi32(_mm512_load_si512(s[0][t]), _mm512_load_si512(s[1][t]));
            const __m512i acc = _mm512_add_epi32(_mm512_set1_epi32(nsum[(size_t)t * nsum_stride + i]), sum);
            total[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc),
                                       _mm512_mul_ps(d, _mm512_set1_ps(sw_act_block(act, stride, t, i)->d)), total[t]);
        }
    }
    _Pragma("GCC unroll 16")
    for (int t = 0; t < 16; t++) _mm512_storeu_ps(out + t * ostride, total[t]);
}
#undef BLOCK_PRODUCTS

/* tdpbsud's peak: 4 independent sum tiles over 2 x 2 operand tiles held
 * in place, 4 x 16384 = SW_AMX_PEAK_MACS multiply-adds an iteration. */
#define SW_AMX_PEAK_MACS (4 * 16384)
static int64_t int8_peak_amx(int64_t iters)
{
    static const int8_t a[16][64] __attribute__((aligned(64)));
    static const uint8_t b[16][64] __attribute__((aligned(64)));
    if (!tiles_configured) configure_tiles();
    int32_t s[16][16] __attribute__((aligned(64)));
    _tile_zero(0); _tile_zero(3); _tile_zero(4); _tile_zero(5);   /* sums here; operands 1, 2, 6, 7 */
    _tile_loadd(1, a, 64); _tile_loadd(2, b, 64); _tile_loadd(6, a, 64); _tile_loadd(7, b, 64);
    for (int64_t i = 0; i < iters; i++) {
        _tile_dpbsud(0, 1, 2); _tile_dpbsud(3, 1, 7); _tile_dpbsud(4, 6, 2); _tile_dpbsud(5, 6, 7);
    }
    _tile_stored(0, s, 64);
    return s[0][0] + iters;
}

#pragma GCC pop_options

/* Whether this CPU and kernel give this process the tiles: cpuid's
 * AMX-TILE and AMX-INT8, the OS's XCR0 bits for the tile state (17, 18),
 * and Linux's permission. SPILLWAY_AMX=0 keeps them off. */
static bool amx_usable(void)
{
    const char *env = getenv("SPILLWAY_AMX");
    if (env && !strcmp(env, "0")) return false;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;   /* OSXSAVE: xgetbv works */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

bool sw_kernels_fill_amx(sw_kernel_table *t)
{
    if (!t->i8x16 || !amx_usable()) return false;
    t->i8x16_tiles = i8x16_amx;
    t->i8x16_min_tokens = 64;
    t->i8x16_peak = int8_peak_amx;
    t->i8x16_peak_mix = "tdpbsud (AMX), 16384 MACs each";
    t->i8x16_peak_macs = SW_AMX_PEAK_MACS;
    return true;
}
