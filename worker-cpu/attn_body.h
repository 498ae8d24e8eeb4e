/* Attention tile kernels, included once per ISA by attention.c with
 * ATTN_SFX(name) naming the instantiation, VEC a vector of VEC_W floats (the
 * ISA's register width, or 16 for plain C), LOADV(p) turning VEC_W halves
 * at p into a VEC, LOADQ(p) the same for VEC_W int8, HALF1(p) the one
 * half at p as a float, PV_VECS the P.V tile's vectors per row, and
 * TO_F16_16(x, y) storing 16 floats at x as halves at y (clamped and rounded
 * as sw_attn_to_f16). Not a standalone header.
 *
 * Scores: a register tile of 4 queries x 2 VEC_W positions (within one K
 * block: 2 VEC_W divides SW_ATTN_KBLOCK), so each loaded K element feeds 4
 * queries (the GQA group) with no horizontal sums. P.V: a
 * tile of 4 rows x PV_VECS VEC_W dims. Both fit the ISA's registers: 8
 * accumulators for scores, 4 PV_VECS for P.V (16 zmm of 32, 8 ymm of 16). */

/* Row i of the scores tile at positions j.. (x0, x1: its two vectors) into S:
 * stored by the first group, added by the later ones (scores_any's g). */
#define SCORES_FOLD(i, x0, x1)                                                                          \
    do {                                                                                                \
        float *s_ = S + (size_t)(r0 + (i)) * ss + j;                                                    \
        VEC y0 = x0, y1 = x1;                                                                           \
        if (g) {                                                                                        \
            VEC o0, o1;                                                                                 \
            memcpy(&o0, s_, sizeof o0); memcpy(&o1, s_ + VEC_W, sizeof o1);                             \
            y0 += o0; y1 += o1;                                                                         \
        }                                                                                               \
        memcpy(s_, &y0, sizeof y0); memcpy(s_ + VEC_W, &y1, sizeof y1);                                 \
    } while (0)

/* The scores of either cache type (q8 a constant, so each instance has one
 * inner loop). q8_0's scale is one per position and group of SW_KV_GROUP
 * dimensions, so a tile sums each group's products of the int8 alone and
 * folds them into S times the positions' scales, one multiply per
 * accumulator and group instead of one per loaded vector. */
static inline __attribute__((always_inline)) void
ATTN_SFX(scores_any)(const float *Q, int M, int hd, const void *KT, const sw_f16 *KS, int N, float *S, size_t ss,
                     const float *zero, const bool q8)
{
    const size_t es = q8 ? 1 : sizeof(sw_f16);   /* bytes an element */
    const int G = q8 ? SW_KV_GROUP : hd;          /* dimensions a scale covers */
    const size_t ahead = (size_t)ATTN_PF_BLOCKS * SW_ATTN_KBLOCK * hd;   /* elements: blocks ahead */
    for (int r0 = 0; r0 < M; r0 += 4) {
        const float *q[4];
        tile_rows(Q, (size_t)hd, M, r0, zero, q);
        const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
        for (int j = 0; j < N; j += 2 * VEC_W) {
            const uint8_t *kb = (const uint8_t *)KT + sw_attn_k_at(hd, 0, j) * es;
            const bool pf = j + ATTN_PF_BLOCKS * SW_ATTN_KBLOCK < N && j % SW_ATTN_KBLOCK == 0;
            for (int g = 0; g < hd; g += G) {
                VEC a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
                for (int d = g; d < g + G; d++) {
                    const uint8_t *kr = kb + (size_t)d * SW_ATTN_KBLOCK * es;
                    if (pf && d * SW_ATTN_KBLOCK * es % 64 == 0)   /* a line at a time */
                        __builtin_prefetch(kr + ahead * es, 0, ATTN_PF_LOC);
                    VEC k0, k1;
                    if (q8) {
                        k0 = LOADQ((const int8_t *)kr);
                        k1 = LOADQ((const int8_t *)kr + VEC_W);
                    } else {
                        k0 = LOADV((const sw_f16 *)kr);
                        k1 = LOADV((const sw_f16 *)kr + VEC_W);
                    }
                    a00 += q0[d] * k0; a01 += q0[d] * k1;
                    a10 += q1[d] * k0; a11 += q1[d] * k1;
                    a20 += q2[d] * k0; a21 += q2[d] * k1;
                    a30 += q3[d] * k0; a31 += q3[d] * k1;
                }
                if (q8) {   /* the group's scales for these positions */
                    const sw_f16 *ks = KS + sw_attn_k_at(hd / G, g / G, j);
                    if (pf) __builtin_prefetch(ks + ahead / G, 0, ATTN_PF_LOC);
                    const VEC s0 = LOADV(ks), s1 = LOADV(ks + VEC_W);
                    a00 *= s0; a01 *= s1; a10 *= s0; a11 *= s1; a20 *= s0; a21 *= s1; a30 *= s0; a31 *= s1;
                }
                SCORES_FOLD(0, a00, a01);
                if (r0 + 1 < M) SCORES_FOLD(1, a10, a11);
                if (r0 + 2 < M) SCORES_FOLD(2, a20, a21);
                if (r0 + 3 < M) SCORES_FOLD(3, a30, a31);
            }
        }
    }
}

/* P.V one row at a time, for head sizes a tile does not divide (tiny models). */
static void ATTN_SFX(pv_rows)(const float *P, size_t ps, int M, const void *V, const sw_f16 *VS, int hd, int N,
                              float *O, const bool q8)
{
    const int ng = hd / SW_KV_GROUP;
    for (int r = 0; r < M; r++) {
        float *o = O + (size_t)r * hd;
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int j = 0; j < N; j++) {
            float p = P[(size_t)r * ps + j];
            for (int d = 0; d < hd; d++)
                o[d] += p * (q8 ? ((const int8_t *)V)[(size_t)j * hd + d] * HALF1(VS + sw_attn_k_at(ng, d / SW_KV_GROUP, j))
                                : sw_f16_to_f32(((const sw_f16 *)V)[(size_t)j * hd + d]));
        }
    }
}

/* x[t][i][] = P's row i over the run at j0 times the scales of group t of
 * the tile, for tg groups from sc on (one group's run of scales follows the
 * last's: sw_attn_k_at). P's rows reach the run's end (tile_rows). */
static inline __attribute__((always_inline)) void
ATTN_SFX(pv_scale_run)(float (*x)[4][SW_ATTN_KBLOCK], int tg, const float *const p[4], const sw_f16 *sc, int j0)
{
    for (int t = 0; t < tg; t++, sc += SW_ATTN_KBLOCK)
        for (int i = 0; i < 4; i++)
            for (int jj = 0; jj < SW_ATTN_KBLOCK; jj += VEC_W) {
                VEC pv;
                memcpy(&pv, p[i] + j0 + jj, sizeof pv);
                pv *= LOADV(sc + jj);
                memcpy(&x[t][i][jj], &pv, sizeof pv);
            }
}

/* P.V of either cache type. q8_0's scale multiplies P's side: for each run
 * of SW_ATTN_KBLOCK positions a tile takes P's 4 rows times the scales of
 * its groups (x, VEC_W at a time), so the inner loop is the f16 one's. */
static inline __attribute__((always_inline)) void
ATTN_SFX(pv_any)(const float *P, size_t ps, int M, const void *V, const sw_f16 *VS, int hd, int N, float *O,
                 const float *zero, const bool q8)
{
    enum {
        TD = PV_VECS * VEC_W,                                 /* dims per tile */
        TG = TD > SW_KV_GROUP ? TD / SW_KV_GROUP : 1,         /* q8_0 groups a tile spans */
        KG = PV_VECS / TG,                                    /* vectors a group */
        RUN = SW_ATTN_KBLOCK,                                 /* positions a run */
    };
    const int ng = hd / SW_KV_GROUP;
    const size_t es = q8 ? 1 : sizeof(sw_f16), row = (size_t)hd * es;   /* bytes an element, a row */
    if (hd % TD) {   /* small head sizes (tiny models) */
        ATTN_SFX(pv_rows)(P, ps, M, V, VS, hd, N, O, q8);
        return;
    }
    float acc[4][SW_MAX_HEAD_DIM] __attribute__((aligned(64)));   /* the 4 rows' sums, tile by tile */
    for (int r0 = 0; r0 < M; r0 += 4) {
        const float *p[4];
        tile_rows(P, ps, M, r0, zero, p);
        for (int j0 = 0; j0 < N; j0 += RUN) {
            const int n = N - j0 < RUN ? N - j0 : RUN;
            float x[TG][4][RUN] __attribute__((aligned(64)));   /* q8: P times the scales of a tile's groups */
            if (q8 && j0 + RUN < N)   /* the next run's scales, every group's */
                for (int l = 0; l < ng * RUN; l += ATTN_LINE_HALVES)
                    __builtin_prefetch(VS + sw_attn_k_at(ng, 0, j0 + RUN) + l, 0, ATTN_PF_LOC);
            for (int d0 = 0; d0 < hd; d0 += TD) {
                if (q8 && d0 % SW_KV_GROUP == 0)   /* a tile that starts a group (with TD < 32, the next shares it) */
                    ATTN_SFX(pv_scale_run)(x, TG, p, VS + sw_attn_k_at(ng, d0 / SW_KV_GROUP, j0), j0);
                VEC a[4][PV_VECS];
                _Pragma("GCC unroll 4")
                for (int i = 0; i < 4; i++)
                    _Pragma("GCC unroll 4")
                    for (int k = 0; k < PV_VECS; k++) {
                        if (j0) memcpy(&a[i][k], &acc[i][d0 + k * VEC_W], sizeof a[i][k]);
                        else a[i][k] = (VEC){0};
                    }
                for (int jj = 0; jj < n; jj++) {
                    const int j = j0 + jj;
                    if (d0 == 0 && j + ATTN_PF_ROWS < N) {   /* the first tile brings in all of a row's lines */
                        const uint8_t *ahead = (const uint8_t *)V + (size_t)(j + ATTN_PF_ROWS) * row;
                        for (size_t l = 0; l < row; l += 64) __builtin_prefetch(ahead + l, 0, ATTN_PF_LOC);
                    }
                    const uint8_t *vr = (const uint8_t *)V + ((size_t)j * hd + d0) * es;
                    VEC v[PV_VECS];
                    /* unrolled, so that a[][] stays in registers */
                    _Pragma("GCC unroll 4")
                    for (int k = 0; k < PV_VECS; k++)
                        v[k] = q8 ? LOADQ((const int8_t *)vr + k * VEC_W) : LOADV((const sw_f16 *)vr + k * VEC_W);
                    _Pragma("GCC unroll 4")
                    for (int t = 0; t < TG; t++) {
                        const float x0 = q8 ? x[t][0][jj] : p[0][j], x1 = q8 ? x[t][1][jj] : p[1][j];
                        const float x2 = q8 ? x[t][2][jj] : p[2][j], x3 = q8 ? x[t][3][jj] : p[3][j];
                        _Pragma("GCC unroll 4")
                        for (int k = t * KG; k < (t + 1) * KG; k++) {
                            a[0][k] += x0 * v[k]; a[1][k] += x1 * v[k]; a[2][k] += x2 * v[k]; a[3][k] += x3 * v[k];
                        }
                    }
                }
                _Pragma("GCC unroll 4")
                for (int i = 0; i < 4; i++)
                    _Pragma("GCC unroll 4")
                    for (int k = 0; k < PV_VECS; k++) memcpy(&acc[i][d0 + k * VEC_W], &a[i][k], sizeof a[i][k]);
            }
        }
        for (int r = 0; r < 4 && r0 + r < M; r++) memcpy(O + (size_t)(r0 + r) * hd, acc[r], (size_t)hd * sizeof(float));
    }
}

#undef SCORES_FOLD

static void ATTN_SFX(scores)(const float *Q, int M, int hd, const sw_f16 *KT, int N, float *S, size_t ss,
                             const float *zero)
{
    ATTN_SFX(scores_any)(Q, M, hd, KT, NULL, N, S, ss, zero, false);
}

static void ATTN_SFX(scores_q8)(const float *Q, int M, int hd, const int8_t *KT, const sw_f16 *KS, int N, float *S,
                                size_t ss, const float *zero)
{
    ATTN_SFX(scores_any)(Q, M, hd, KT, KS, N, S, ss, zero, true);
}

static void ATTN_SFX(pv)(const float *P, size_t ps, int M, const sw_f16 *V, int hd, int N, float *O,
                         const float *zero)
{
    ATTN_SFX(pv_any)(P, ps, M, V, NULL, hd, N, O, zero, false);
}

static void ATTN_SFX(pv_q8)(const float *P, size_t ps, int M, const int8_t *V, const sw_f16 *VS, int hd, int N,
                            float *O, const float *zero)
{
    ATTN_SFX(pv_any)(P, ps, M, V, VS, hd, N, O, zero, true);
}

/* y = sw_attn_to_f16(x) for n floats, 16 at a time with TO_F16_16. */
static void ATTN_SFX(to_f16)(const float *x, sw_f16 *y, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16) TO_F16_16(x + i, y + i);
    for (; i < n; i++) y[i] = sw_attn_to_f16(x[i]);
}

static const sw_attn_kernels ATTN_SFX(kernels) = {
    ATTN_SFX(scores), ATTN_SFX(pv), ATTN_SFX(scores_q8), ATTN_SFX(pv_q8), ATTN_SFX(to_f16),
};
