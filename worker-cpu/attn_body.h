/* Attention tile kernels, included once per ISA by attention.c with
 * ATTN_SFX(name) naming the instantiation, VEC a vector of VEC_W floats (the
 * ISA's register width, or 16 for plain C), LOADV(p) turning VEC_W halves
 * at p into a VEC, PV_VECS the P.V tile's vectors per row, and
 * TO_F16_16(x, y) storing 16 floats at x as halves at y (clamped and rounded
 * as sw_attn_to_f16). Not a standalone header.
 *
 * Scores: a register tile of 4 queries x 2 VEC_W positions (within one K
 * block: 2 VEC_W divides SW_ATTN_KBLOCK), so each loaded K element feeds 4
 * queries (the GQA group) with no horizontal sums. P.V: a
 * tile of 4 rows x PV_VECS VEC_W dims. Both fit the ISA's registers: 8
 * accumulators for scores, 4 PV_VECS for P.V (16 zmm of 32, 8 ymm of 16). */

static void ATTN_SFX(scores)(const float *Q, int M, int hd, const sw_f16 *KT, int N, float *S, size_t ss,
                             const float *zero)
{
    for (int r0 = 0; r0 < M; r0 += 4) {
        const float *q[4];
        tile_rows(Q, (size_t)hd, M, r0, zero, q);
        const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
        for (int j = 0; j < N; j += 2 * VEC_W) {
            VEC a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
            const sw_f16 *kb = KT + sw_attn_k_at(hd, 0, j);
            const bool pf = j + ATTN_PF_BLOCKS * SW_ATTN_KBLOCK < N && j % SW_ATTN_KBLOCK == 0;
            for (int d = 0; d < hd; d++) {
                const sw_f16 *kr = kb + (size_t)d * SW_ATTN_KBLOCK;
                if (pf) __builtin_prefetch(kr + (size_t)ATTN_PF_BLOCKS * SW_ATTN_KBLOCK * hd, 0, ATTN_PF_LOC);
                VEC k0 = LOADV(kr), k1 = LOADV(kr + VEC_W);
                a00 += q0[d] * k0; a01 += q0[d] * k1;
                a10 += q1[d] * k0; a11 += q1[d] * k1;
                a20 += q2[d] * k0; a21 += q2[d] * k1;
                a30 += q3[d] * k0; a31 += q3[d] * k1;
            }
            float *s0 = S + (size_t)r0 * ss + j;
            memcpy(s0, &a00, sizeof a00); memcpy(s0 + VEC_W, &a01, sizeof a01);
            if (r0 + 1 < M) { memcpy(s0 + ss, &a10, sizeof a10); memcpy(s0 + ss + VEC_W, &a11, sizeof a11); }
            if (r0 + 2 < M) { memcpy(s0 + 2 * ss, &a20, sizeof a20); memcpy(s0 + 2 * ss + VEC_W, &a21, sizeof a21); }
            if (r0 + 3 < M) { memcpy(s0 + 3 * ss, &a30, sizeof a30); memcpy(s0 + 3 * ss + VEC_W, &a31, sizeof a31); }
        }
    }
}

static void ATTN_SFX(pv)(const float *P, size_t ps, int M, const sw_f16 *V, int hd, int N, float *O,
                         const float *zero)
{
    enum { TD = PV_VECS * VEC_W };   /* dims per tile */
    if (hd % TD) {   /* small head sizes (tiny models): one row at a time */
        for (int r = 0; r < M; r++) {
            float *o = O + (size_t)r * hd;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int j = 0; j < N; j++) {
                float p = P[(size_t)r * ps + j];
                for (int d = 0; d < hd; d++) o[d] += p * sw_f16_to_f32(V[(size_t)j * hd + d]);
            }
        }
        return;
    }
    for (int r0 = 0; r0 < M; r0 += 4) {
        const float *p[4];
        tile_rows(P, ps, M, r0, zero, p);
        const float *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
        for (int d0 = 0; d0 < hd; d0 += TD) {
            VEC a[4][PV_VECS] = {{{0}}};
            for (int j = 0; j < N; j++) {
                const sw_f16 *vr = V + (size_t)j * hd + d0;
                if (d0 == 0 && j + ATTN_PF_ROWS < N)   /* the first tile brings in all of a row's lines */
                    for (int l = 0; l < hd; l += ATTN_LINE_HALVES)
                        __builtin_prefetch(vr + (size_t)ATTN_PF_ROWS * hd + l, 0, ATTN_PF_LOC);
                VEC v[PV_VECS];
                /* unrolled, so that a[][] stays in registers */
                _Pragma("GCC unroll 4")
                for (int k = 0; k < PV_VECS; k++) v[k] = LOADV(vr + k * VEC_W);
                float x0 = p0[j], x1 = p1[j], x2 = p2[j], x3 = p3[j];
                _Pragma("GCC unroll 4")
                for (int k = 0; k < PV_VECS; k++) {
                    a[0][k] += x0 * v[k]; a[1][k] += x1 * v[k]; a[2][k] += x2 * v[k]; a[3][k] += x3 * v[k];
                }
            }
            for (int r = 0; r < 4 && r0 + r < M; r++)
                memcpy(O + (size_t)(r0 + r) * hd + d0, a[r], sizeof a[r]);
        }
    }
}

/* y = sw_attn_to_f16(x) for n floats, 16 at a time with TO_F16_16. */
static void ATTN_SFX(to_f16)(const float *x, sw_f16 *y, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16) TO_F16_16(x + i, y + i);
    for (; i < n; i++) y[i] = sw_attn_to_f16(x[i]);
}

static const sw_attn_kernels ATTN_SFX(kernels) = { ATTN_SFX(scores), ATTN_SFX(pv), ATTN_SFX(to_f16) };
