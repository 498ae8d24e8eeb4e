/* Attention tile kernels, included once per ISA by attention.c with
 * ATTN_SFX(name) naming the instantiation, LOAD16(p) turning 16 halves at
 * p into a v16 of floats and TO_F16_16(x, y) storing 16 floats at x as
 * halves at y (clamped and rounded as sw_attn_to_f16). Not a standalone header.
 *
 * Scores: a register tile of 4 queries x 32 positions, so each loaded K
 * element feeds 4 queries (the GQA group) with no horizontal sums. P.V: a
 * tile of 4 rows x 64 dims. */

static void ATTN_SFX(scores)(const float *Q, int M, int hd, const sw_f16 *KT, size_t kts, int N, float *S,
                             size_t ss, const float *zero)
{
    for (int r0 = 0; r0 < M; r0 += 4) {
        const float *q[4];
        tile_rows(Q, (size_t)hd, M, r0, zero, q);
        const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
        for (int j = 0; j < N; j += 32) {
            v16 a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
            for (int d = 0; d < hd; d++) {
                const sw_f16 *kr = KT + (size_t)d * kts + j;
                v16 k0 = LOAD16(kr), k1 = LOAD16(kr + 16);
                a00 += q0[d] * k0; a01 += q0[d] * k1;
                a10 += q1[d] * k0; a11 += q1[d] * k1;
                a20 += q2[d] * k0; a21 += q2[d] * k1;
                a30 += q3[d] * k0; a31 += q3[d] * k1;
            }
            float *s0 = S + (size_t)r0 * ss + j;
            *(v16u *)s0 = a00; *(v16u *)(s0 + 16) = a01;
            if (r0 + 1 < M) { *(v16u *)(s0 + ss) = a10; *(v16u *)(s0 + ss + 16) = a11; }
            if (r0 + 2 < M) { *(v16u *)(s0 + 2 * ss) = a20; *(v16u *)(s0 + 2 * ss + 16) = a21; }
            if (r0 + 3 < M) { *(v16u *)(s0 + 3 * ss) = a30; *(v16u *)(s0 + 3 * ss + 16) = a31; }
        }
    }
}

static void ATTN_SFX(pv)(const float *P, size_t ps, int M, const sw_f16 *V, int hd, int N, float *O,
                         const float *zero)
{
    if (hd % 64) {   /* small head sizes (tiny models): one row at a time */
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
        for (int d0 = 0; d0 < hd; d0 += 64) {
            v16 a[4][4] = {{{0}}};
            for (int j = 0; j < N; j++) {
                const sw_f16 *vr = V + (size_t)j * hd + d0;
                v16 v0 = LOAD16(vr), v1 = LOAD16(vr + 16), v2 = LOAD16(vr + 32), v3 = LOAD16(vr + 48);
                float x0 = p0[j], x1 = p1[j], x2 = p2[j], x3 = p3[j];
                a[0][0] += x0 * v0; a[0][1] += x0 * v1; a[0][2] += x0 * v2; a[0][3] += x0 * v3;
                a[1][0] += x1 * v0; a[1][1] += x1 * v1; a[1][2] += x1 * v2; a[1][3] += x1 * v3;
                a[2][0] += x2 * v0; a[2][1] += x2 * v1; a[2][2] += x2 * v2; a[2][3] += x2 * v3;
                a[3][0] += x3 * v0; a[3][1] += x3 * v1; a[3][2] += x3 * v2; a[3][3] += x3 * v3;
            }
            for (int r = 0; r < 4 && r0 + r < M; r++)
                for (int k = 0; k < 4; k++) *(v16u *)(O + (size_t)(r0 + r) * hd + d0 + 16 * k) = a[r][k];
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
