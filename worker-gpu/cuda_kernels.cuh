// Device kernels of the CUDA backend (included by cuda_backend.cu only).
// Numerics follow backend.h so that the emulation backend predicts them:
// bf16 activations rounded at kernel boundaries, float32 residual stream,
// FP8 E4M3 weights with per-row scales, float32 accumulation.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

enum { OUT_BF16 = 0, OUT_RESID = 1, OUT_F32 = 2 };

__device__ __forceinline__ float2 fp8x2_to_f2(unsigned short v)
{
    __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v, __NV_E4M3);
    return __half22float2(__half2(r));
}

__device__ __forceinline__ float fp8_to_f(uint8_t v)
{
    __half_raw r = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3);
    return __half2float(__half(r));
}

__device__ __forceinline__ uint8_t f_to_fp8(float x)
{
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float bfr(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Writes one matmul result in the requested form.
__device__ __forceinline__ void store_out(int mode, float v, size_t i, bf16 *ob, float *of)
{
    if (mode == OUT_BF16) ob[i] = __float2bfloat16_rn(v);
    else if (mode == OUT_RESID) of[i] += bfr(v);
    else of[i] = v;
}

struct SumOp { __device__ float operator()(float a, float b) const { return a + b; } };
struct MaxOp { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };

template <class Op> __device__ __forceinline__ float warp_reduce(float v, Op op)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, SumOp()); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce(v, MaxOp()); }

// Block-wide reduction (any blockDim multiple of 32, <= 1024); every thread
// gets the result. `identity` fills the slots of missing warps.
template <class Op> __device__ float block_reduce(float v, float identity, Op op)
{
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) part[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float s = lane < nw ? part[lane] : identity;
        s = warp_reduce(s, op);
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

__device__ float block_sum(float v) { return block_reduce(v, 0.0f, SumOp()); }
__device__ float block_max(float v) { return block_reduce(v, -INFINITY, MaxOp()); }

// ---------------------------------------------------------------- small ops

// x[t] = embd[tok[t]] * scale (1, or Gemma's sqrt(E))
__global__ void k_embed(const int32_t *tok, const bf16 *embd, float *x, int E, float scale)
{
    int t = blockIdx.x;
    const bf16 *row = embd + (size_t)tok[t] * E;
    for (int i = threadIdx.x; i < E; i += blockDim.x) x[(size_t)t * E + i] = __bfloat162float(row[i]) * scale;
}

// y[t][i] += b[i] for a block per row t (the output bias on the logits)
__global__ void k_add_bias(float *y, const float *b, int n)
{
    float *row = y + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] += b[i];
}

// out[t] = bf16(x[src] * 1/sqrt(mean(x^2)+eps) * w); src = gather ? gather[t] : t
__global__ void k_rmsnorm(const float *x, const float *w, bf16 *out, int E, float eps, const int32_t *gather)
{
    int t = blockIdx.x;
    const float *xr = x + (size_t)(gather ? gather[t] : t) * E;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < E; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)E + eps);
    for (int i = threadIdx.x; i < E; i += blockDim.x)
        out[(size_t)t * E + i] = __float2bfloat16_rn(xr[i] * inv * w[i]);
}

__global__ void k_swiglu(const bf16 *gu, bf16 *act, int F, int T, bool gelu)
{
    size_t n = (size_t)T * F;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / F, j = i % F;
        float g = __bfloat162float(gu[t * 2 * F + j]), u = __bfloat162float(gu[t * 2 * F + F + j]);
        act[i] = __float2bfloat16_rn(sw_gate_act(g, gelu) * u);
    }
}

// The q/k/v biases and per-head q/k RMSNorm of the architectures that have
// them (either may be NULL), in place on token t's bf16 q|k|v row, before
// RoPE; q heads then k heads are contiguous. A warp per head.
__global__ void k_qkv_prep(bf16 *qkv, const float *bias, const float *qkn, int n_head, int n_head_kv, int hd,
                           float eps)
{
    int QKV = (n_head + 2 * n_head_kv) * hd;
    bf16 *row = qkv + (size_t)blockIdx.x * QKV;
    if (bias) {
        for (int i = threadIdx.x; i < QKV; i += blockDim.x)
            row[i] = __float2bfloat16_rn(__bfloat162float(row[i]) + bias[i]);
        __syncthreads();
    }
    if (!qkn) return;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int h = warp; h < n_head + n_head_kv; h += nw) {
        bf16 *x = row + (size_t)h * hd;
        const float *w = qkn + (h < n_head ? 0 : hd);
        float ss = 0.0f;
        for (int i = lane; i < hd; i += 32) { float v = __bfloat162float(x[i]); ss += v * v; }
        ss = warp_sum(ss);
        float inv = 1.0f / sqrtf(ss / (float)hd + eps);
        for (int i = lane; i < hd; i += 32) x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * inv * w[i]);
    }
}

// Rotates Q and K of token t in place (adjacent pairs of the first n_rot
// dims of each head; with neox, pairs (i, i + hd/2), which the weights
// loader allows only with n_rot == hd) and writes K and V into the token's
// KV-cache slot.
template <bool KV8>
__global__ void k_rope_kv(bf16 *qkv, const int32_t *pos, const int32_t *seq, const int32_t *table,
                          const int32_t *stride_p, const float *inv_freq, void *kc, void *vc,
                          int n_head, int n_head_kv, int hd, int n_rot, bool neox)
{
    int t = blockIdx.x;
    int QD = n_head * hd, KVD = n_head_kv * hd, QKV = QD + 2 * KVD;
    bf16 *q = qkv + (size_t)t * QKV, *k = q + QD, *v = k + KVD;
    int p = pos[t];
    int blk = table[(size_t)seq[t] * stride_p[0] + p / 16];
    size_t slot = ((size_t)blk * 16 + p % 16) * KVD;
    int half = hd / 2, nq = n_head * half, nk = n_head_kv * half;
    for (int i = threadIdx.x; i < nq + nk; i += blockDim.x) {
        bool is_k = i >= nq;
        int j = is_k ? i - nq : i;
        int hh = j / half, pi = j % half;
        int i0 = neox ? pi : 2 * pi, i1 = neox ? pi + half : 2 * pi + 1;   // the pair's dims in the head
        bf16 *x = (is_k ? k : q) + (size_t)hh * hd;
        float a = __bfloat162float(x[i0]), b = __bfloat162float(x[i1]);
        if (2 * pi < n_rot) {
            float th = (float)p * inv_freq[pi];
            float c = cosf(th), s = sinf(th);
            float a2 = bfr(a * c - b * s), b2 = bfr(a * s + b * c);
            a = a2; b = b2;
            x[i0] = __float2bfloat16_rn(a);
            x[i1] = __float2bfloat16_rn(b);
        }
        if (is_k) {
            size_t o = slot + (size_t)hh * hd;
            float va = __bfloat162float(v[(size_t)hh * hd + i0]), vb = __bfloat162float(v[(size_t)hh * hd + i1]);
            if (KV8) {
                uint8_t *K = (uint8_t *)kc, *V = (uint8_t *)vc;
                K[o + i0] = f_to_fp8(a); K[o + i1] = f_to_fp8(b);
                V[o + i0] = f_to_fp8(va); V[o + i1] = f_to_fp8(vb);
            } else {
                bf16 *K = (bf16 *)kc, *V = (bf16 *)vc;
                K[o + i0] = __float2bfloat16_rn(a); K[o + i1] = __float2bfloat16_rn(b);
                V[o + i0] = __float2bfloat16_rn(va); V[o + i1] = __float2bfloat16_rn(vb);
            }
        }
    }
}

template <bool KV8>
__device__ __forceinline__ void load_kv(const void *c, size_t off, float *dst, int n)
{
    if (KV8) {
        const uint8_t *p = (const uint8_t *)c + off;
        for (int e = 0; e < n; e++) dst[e] = fp8_to_f(p[e]);
    } else {
        const bf16 *p = (const bf16 *)c + off;
        for (int e = 0; e < n; e++) dst[e] = __bfloat162float(p[e]);
    }
}

// Paged decode/prefill attention. One block (4 warps) per (token, KV head,
// split) serves the G query heads that share that KV head, so each K/V row is
// read once. A token's positions 0..pos are cut into gridDim.z contiguous
// splits (flash-decoding: small batches still fill the GPU); each warp walks
// every 4th position of its split with an online softmax; lanes hold EPL
// consecutive dims of the head (hd = 32*EPL). With one split the block writes
// the output; otherwise it writes its partial (max, sum, unnormalized output)
// for k_attn_combine.
template <int EPL, int G, bool KV8>
__global__ void __launch_bounds__(128) k_attention(const bf16 *qkv, const int32_t *pos, const int32_t *seq,
                                                   const int32_t *table, const int32_t *stride_p,
                                                   const void *kc, const void *vc, bf16 *att,
                                                   int n_head, int n_head_kv, float *part_ml, float *part_acc)
{
    constexpr int HD = EPL * 32, NW = 4;
    int t = blockIdx.x, kvh = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int S = gridDim.z, split = blockIdx.z;
    int QD = n_head * HD, KVD = n_head_kv * HD, QKV = QD + 2 * KVD;
    const float scale = 1.0f / sqrtf((float)HD);
    float q[G][EPL], acc[G][EPL], m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const bf16 *qp = qkv + (size_t)t * QKV + (size_t)(kvh * G + g) * HD + lane * EPL;
#pragma unroll
        for (int e = 0; e < EPL; e++) { q[g][e] = __bfloat162float(qp[e]); acc[g][e] = 0.0f; }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    int n = pos[t] + 1, chunk = (n + S - 1) / S;
    int p0 = split * chunk, p1 = min(n, p0 + chunk);
    const int32_t *row = table + (size_t)seq[t] * stride_p[0];
    for (int p = p0 + warp; p < p1; p += NW) {
        size_t off = ((size_t)row[p >> 4] * 16 + (p & 15)) * KVD + (size_t)kvh * HD + lane * EPL;
        float kf[EPL], vf[EPL];
        load_kv<KV8>(kc, off, kf, EPL);
        load_kv<KV8>(vc, off, vf, EPL);
#pragma unroll
        for (int g = 0; g < G; g++) {
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; e++) s += q[g][e] * kf[e];
            s = warp_sum(s) * scale;
            float mn = fmaxf(m[g], s);
            float corr = expf(m[g] - mn), w = expf(s - mn);
            l[g] = l[g] * corr + w;
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[g][e] = acc[g][e] * corr + w * vf[e];
            m[g] = mn;
        }
    }
    __shared__ float sm_m[NW][G], sm_l[NW][G], sm_acc[NW][G][HD];
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) { sm_m[warp][g] = m[g]; sm_l[warp][g] = l[g]; }
#pragma unroll
        for (int e = 0; e < EPL; e++) sm_acc[warp][g][lane * EPL + e] = acc[g][e];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
        int g = i / HD, d = i % HD, h = kvh * G + g;
        float M = -INFINITY;
        for (int w = 0; w < NW; w++) if (sm_l[w][g] > 0.0f) M = fmaxf(M, sm_m[w][g]);
        float L = 0.0f, o = 0.0f;
        for (int w = 0; w < NW; w++) {
            float f = sm_l[w][g] > 0.0f ? expf(sm_m[w][g] - M) : 0.0f;
            L += sm_l[w][g] * f;
            o += sm_acc[w][g][d] * f;
        }
        if (S == 1) {
            att[(size_t)t * QD + (size_t)h * HD + d] = __float2bfloat16_rn(o / L);
        } else {
            size_t pi = ((size_t)t * n_head + h) * S + split;
            part_acc[pi * HD + d] = o;
            if (d == 0) { part_ml[2 * pi] = M; part_ml[2 * pi + 1] = L; }
        }
    }
}

// Merges the splits of k_attention: one block per (token, query head).
__global__ void k_attn_combine(const float *part_ml, const float *part_acc, bf16 *att, int n_head, int hd, int S)
{
    int t = blockIdx.x, h = blockIdx.y;
    size_t base = ((size_t)t * n_head + h) * S;
    float M = -INFINITY;
    for (int s = 0; s < S; s++) if (part_ml[2 * (base + s) + 1] > 0.0f) M = fmaxf(M, part_ml[2 * (base + s)]);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float L = 0.0f, o = 0.0f;
        for (int s = 0; s < S; s++) {
            float l = part_ml[2 * (base + s) + 1];
            if (!(l > 0.0f)) continue;
            float f = expf(part_ml[2 * (base + s)] - M);
            L += l * f;
            o += part_acc[(base + s) * hd + d] * f;
        }
        att[(size_t)t * n_head * hd + (size_t)h * hd + d] = __float2bfloat16_rn(o / L);
    }
}

// Any head size / grouping: one block per (token, query head); scores in
// dynamic shared memory (n_pos floats).
template <bool KV8>
__global__ void k_attention_generic(const bf16 *qkv, const int32_t *pos, const int32_t *seq,
                                    const int32_t *table, const int32_t *stride_p, const void *kc,
                                    const void *vc, bf16 *att, int n_head, int n_head_kv, int hd)
{
    extern __shared__ float sc[];
    int t = blockIdx.x, h = blockIdx.y, kvh = h / (n_head / n_head_kv);
    int QD = n_head * hd, KVD = n_head_kv * hd, QKV = QD + 2 * KVD;
    const bf16 *q = qkv + (size_t)t * QKV + (size_t)h * hd;
    int n = pos[t] + 1;
    const int32_t *row = table + (size_t)seq[t] * stride_p[0];
    const float scale = 1.0f / sqrtf((float)hd);
    float mx = -INFINITY;
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
        size_t off = ((size_t)row[p >> 4] * 16 + (p & 15)) * KVD + (size_t)kvh * hd;
        float s = 0.0f;
        for (int i = 0; i < hd; i++) {
            float kv;
            load_kv<KV8>(kc, off + i, &kv, 1);
            s += __bfloat162float(q[i]) * kv;
        }
        sc[p] = s * scale;
        mx = fmaxf(mx, sc[p]);
    }
    mx = block_max(mx);
    float sum = 0.0f;
    for (int p = threadIdx.x; p < n; p += blockDim.x) { sc[p] = expf(sc[p] - mx); sum += sc[p]; }
    sum = block_sum(sum);   // includes a barrier: all sc[] written
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int p = 0; p < n; p++) {
            size_t off = ((size_t)row[p >> 4] * 16 + (p & 15)) * KVD + (size_t)kvh * hd + d;
            float vv;
            load_kv<KV8>(vc, off, &vv, 1);
            o += sc[p] / sum * vv;
        }
        att[(size_t)t * QD + (size_t)h * hd + d] = __float2bfloat16_rn(o);
    }
}

// ---------------------------------------------------------------- GEMV

// acc[t] += dot(16 weights in wv, x[t][c0..c0+15])
template <int NT>
__device__ __forceinline__ void dot16(uint4 wv, const bf16 *__restrict__ X, int ldx, int c0, float *acc)
{
    float w[16];
    const unsigned short *ws = reinterpret_cast<const unsigned short *>(&wv);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float2 f = fp8x2_to_f2(ws[j]);
        w[2 * j] = f.x;
        w[2 * j + 1] = f.y;
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const uint4 *xp = reinterpret_cast<const uint4 *>(X + (size_t)t * ldx + c0);
        uint4 xa = __ldg(xp), xb = __ldg(xp + 1);
        const __nv_bfloat162 *xa2 = reinterpret_cast<const __nv_bfloat162 *>(&xa);
        const __nv_bfloat162 *xb2 = reinterpret_cast<const __nv_bfloat162 *>(&xb);
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 a = __bfloat1622float2(xa2[j]), b = __bfloat1622float2(xb2[j]);
            s += w[2 * j] * a.x + w[2 * j + 1] * a.y + w[8 + 2 * j] * b.x + w[8 + 2 * j + 1] * b.y;
        }
        acc[t] += s;
    }
}

// y[t][r] = scale[r] * sum_c W[r][c] x[t][c] for NT <= 16 tokens. Memory-bound:
// one warp per row, each lane streams 16-byte weight vectors with four loads
// in flight (evict-first, the weights are read once per step); the few
// activation rows stay in L1/L2. Needs cols % 16 == 0.
template <int NT>
__global__ void __launch_bounds__(256) k_gemv_fp8(const uint8_t *__restrict__ W, const float *__restrict__ wscale,
                                                  int R, int C, const bf16 *__restrict__ X, int mode,
                                                  bf16 *ob, float *of)
{
    int r = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (r >= R) return;
    const uint4 *w = reinterpret_cast<const uint4 *>(W + (size_t)r * C);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    int nvec = C / 16, v = lane;
    for (; v + 96 < nvec; v += 128) {
        uint4 wv[4];
#pragma unroll
        for (int u = 0; u < 4; u++) wv[u] = __ldcs(w + v + 32 * u);
#pragma unroll
        for (int u = 0; u < 4; u++) dot16<NT>(wv[u], X, C, (v + 32 * u) * 16, acc);
    }
    for (; v < nvec; v += 32) dot16<NT>(__ldcs(w + v), X, C, v * 16, acc);
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = warp_sum(acc[t]);
    if (lane < NT) {
        float a = 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++) if (t == lane) a = acc[t];
        store_out(mode, a * wscale[r], (size_t)lane * R + r, ob, of);
    }
}

// The gate/up GEMV fused with SwiGLU (<= 16 tokens, cols % 16 == 0): warp j
// computes row j (gate) and row j+F (up) of the stacked matrix, rounds both
// to bf16 as the unfused path stores them, and writes act = silu(g) * u
// (gelu(g) * u with gelu).
template <int NT>
__global__ void __launch_bounds__(256) k_gemv_fp8_swiglu(const uint8_t *__restrict__ W, const float *__restrict__ wscale,
                                                         int F, int C, const bf16 *__restrict__ X, bf16 *act, bool gelu)
{
    int j = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (j >= F) return;
    const uint4 *wg = reinterpret_cast<const uint4 *>(W + (size_t)j * C);
    const uint4 *wu = reinterpret_cast<const uint4 *>(W + (size_t)(j + F) * C);
    float ag[NT], au[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) { ag[t] = 0.0f; au[t] = 0.0f; }
    int nvec = C / 16, v = lane;
    for (; v + 32 < nvec; v += 64) {
        uint4 g0 = __ldcs(wg + v), g1 = __ldcs(wg + v + 32), u0 = __ldcs(wu + v), u1 = __ldcs(wu + v + 32);
        dot16<NT>(g0, X, C, v * 16, ag);
        dot16<NT>(u0, X, C, v * 16, au);
        dot16<NT>(g1, X, C, (v + 32) * 16, ag);
        dot16<NT>(u1, X, C, (v + 32) * 16, au);
    }
    for (; v < nvec; v += 32) {
        uint4 g0 = __ldcs(wg + v), u0 = __ldcs(wu + v);
        dot16<NT>(g0, X, C, v * 16, ag);
        dot16<NT>(u0, X, C, v * 16, au);
    }
#pragma unroll
    for (int t = 0; t < NT; t++) { ag[t] = warp_sum(ag[t]); au[t] = warp_sum(au[t]); }
    if (lane < NT) {
        float g = 0.0f, u = 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++) if (t == lane) { g = ag[t]; u = au[t]; }
        g = bfr(g * wscale[j]);
        u = bfr(u * wscale[j + F]);
        act[(size_t)lane * F + j] = __float2bfloat16_rn(sw_gate_act(g, gelu) * u);
    }
}

// Scalar GEMV for shapes the vector kernel cannot take (cols % 16 != 0).
__global__ void k_gemv_fp8_any(const uint8_t *W, const float *wscale, int R, int C, const bf16 *X, int nt,
                               int mode, bf16 *ob, float *of)
{
    int r = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (r >= R) return;
    float acc[16];
#pragma unroll
    for (int t = 0; t < 16; t++) acc[t] = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float w = fp8_to_f(W[(size_t)r * C + c]);
#pragma unroll
        for (int t = 0; t < 16; t++)
            if (t < nt) acc[t] += w * __bfloat162float(X[(size_t)t * C + c]);
    }
#pragma unroll
    for (int t = 0; t < 16; t++) {
        float a = warp_sum(acc[t]);
        if (lane == 0 && t < nt) store_out(mode, a * wscale[r], (size_t)t * R + r, ob, of);
    }
}

// ---------------------------------------------------------------- cuBLASLt path helpers

// Per-token FP8 activations: s_t = amax_t/448 (1 for a zero row), q = fp8(x / s_t).
__global__ void k_quant_act(const bf16 *X, int C, uint8_t *Q, float *ascale)
{
    int t = blockIdx.x;
    const bf16 *x = X + (size_t)t * C;
    float amax = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) amax = fmaxf(amax, fabsf(__bfloat162float(x[c])));
    amax = block_max(amax);
    float s = (amax > 0.0f && isfinite(amax)) ? amax / 448.0f : 1.0f;
    float inv = 1.0f / s;
    for (int c = threadIdx.x; c < C; c += blockDim.x) Q[(size_t)t * C + c] = f_to_fp8(__bfloat162float(x[c]) * inv);
    if (threadIdx.x == 0) ascale[t] = s;
}

// D (T x R from cuBLASLt with unit scales; float, or bf16 where the library
// offers no float output) -> D * wscale[r] * ascale[t].
template <typename DT>
__global__ void k_scale_epilogue(const DT *D, const float *wscale, const float *ascale, int R, int T,
                                 int mode, bf16 *ob, float *of)
{
    size_t n = (size_t)T * R;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / R, r = i % R;
        store_out(mode, (float)D[i] * wscale[r] * ascale[t], i, ob, of);
    }
}

// ---------------------------------------------------------------- sampling

struct dev_sample { float temperature, top_p, uniform; int32_t top_k; };

__device__ __forceinline__ uint32_t order_key(float f)
{
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ int block_sum_i(int v)
{
    return (int)block_sum((float)v);   // counts <= 2^24: exact in float
}

// Block-wide argmax of a row, lowest id on ties, for every thread (the
// row's max is also the softmax's). False, for every thread, when the row
// holds a NaN.
__device__ bool block_argmax(const float *l, int V, float *mx, int *amax)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = blockDim.x >> 5;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    int nan = 0;
    for (int i = tid; i < V; i += blockDim.x) {
        float v = l[i];
        nan |= v != v;
        if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
    }
    if (__syncthreads_or(nan)) return false;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { sv[wid] = bv; si[wid] = bi; }
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < nw; w++)
            if (sv[w] > sv[0] || (sv[w] == sv[0] && si[w] < si[0])) { sv[0] = sv[w]; si[0] = si[w]; }
    }
    __syncthreads();
    *mx = sv[0];
    *amax = si[0];
    __syncthreads();
    return true;
}

// top-k: the k-th largest order key, by bisection (0 < k < V).
__device__ uint32_t top_k_key(const float *l, int V, int k)
{
    uint32_t lo = 0, hi = 0xffffffffu;
    while (lo < hi) {
        uint32_t mid = lo + (uint32_t)(((uint64_t)hi - lo + 1) / 2);
        int c = 0;
        for (int i = threadIdx.x; i < V; i += blockDim.x) c += order_key(l[i]) >= mid;
        if (block_sum_i(c) >= k) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// The softmax mass (at temperature 1/invT) of the tokens whose key is at
// least thr.
__device__ float kept_mass(const float *l, int V, float mx, float invT, uint32_t thr)
{
    float z = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        if (order_key(l[i]) >= thr) z += expf((l[i] - mx) * invT);
    return block_sum(z);
}

// top-p: the largest key threshold (from lo up) whose kept mass still
// reaches target (top_p times the mass kept at lo).
__device__ uint32_t top_p_key(const float *l, int V, float mx, float invT, uint32_t lo, float target)
{
    uint32_t hi = 0xffffffffu;
    while (lo < hi) {
        uint32_t mid = lo + (uint32_t)(((uint64_t)hi - lo + 1) / 2);
        if (kept_mass(l, V, mx, invT, mid) >= target) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Inverse-CDF draw of the kept tokens, scanning ids in order: each thread
// owns a contiguous chunk; target is the uniform number times the kept
// mass. amax if rounding leaves no token chosen.
__device__ int draw_token(const float *l, int V, float mx, float invT, uint32_t thr, float target, int amax)
{
    __shared__ float part[1024];
    __shared__ int chosen;
    int tid = threadIdx.x;
    int chunk = (V + blockDim.x - 1) / blockDim.x, c0 = tid * chunk, c1 = min(V, c0 + chunk);
    float s = 0.0f;
    for (int i = c0; i < c1; i++) if (order_key(l[i]) >= thr) s += expf((l[i] - mx) * invT);
    part[tid] = s;
    if (tid == 0) chosen = amax;
    __syncthreads();
    if (tid == 0) {
        float run = 0.0f;
        for (int i = 0; i < (int)blockDim.x; i++) { float v = part[i]; part[i] = run; run += v; }
    }
    __syncthreads();
    float run = part[tid];
    if (c0 < c1 && run <= target && target < run + s) {
        int last = -1;
        for (int i = c0; i < c1; i++) {
            if (order_key(l[i]) < thr) continue;
            last = i;
            run += expf((l[i] - mx) * invT);
            if (target < run) break;
        }
        if (last >= 0) chosen = last;
    }
    __syncthreads();
    return chosen;
}

// One block per logits row. A row with any NaN gives -1 (the scheduler fails
// that request, as the host sampler does: NaN logits mean broken weights or
// an overflow, and no token drawn from them means anything). Greedy: argmax,
// lowest id on ties. Otherwise
// temperature, then top-k and top-p by exact bisection over the ordered
// bit patterns of the logits, then an inverse-CDF draw with the caller's
// uniform number, scanning tokens in id order.
__global__ void __launch_bounds__(1024) k_sample(const float *logits, int V, const dev_sample *sp, int32_t *out)
{
    const float *l = logits + (size_t)blockIdx.x * V;
    dev_sample p = sp[blockIdx.x];
    float mx;
    int amax;
    if (!block_argmax(l, V, &mx, &amax)) {
        if (threadIdx.x == 0) out[blockIdx.x] = -1;
        return;
    }
    if (!(p.temperature > 0.0f)) {
        if (threadIdx.x == 0) out[blockIdx.x] = amax;
        return;
    }
    float invT = 1.0f / p.temperature;
    uint32_t thr = p.top_k > 0 && p.top_k < V ? top_k_key(l, V, p.top_k) : 0;
    float z = kept_mass(l, V, mx, invT, thr);
    if (p.top_p > 0.0f && p.top_p < 1.0f) {
        thr = top_p_key(l, V, mx, invT, thr, p.top_p * z);
        z = kept_mass(l, V, mx, invT, thr);
    }
    int chosen = draw_token(l, V, mx, invT, thr, p.uniform * z, amax);
    if (threadIdx.x == 0) out[blockIdx.x] = chosen;
}
