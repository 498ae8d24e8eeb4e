// The CUDA backend: FP8 weights on the device, a paged BF16/FP8 KV cache,
// a memory-bound GEMV for small batches and cuBLASLt FP8 matmuls for large
// ones, device-side sampling and CUDA graphs for steady-state decode.
// See backend.h for the numerics contract shared with the emulation backend.
#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

extern "C" {
#include "worker-gpu/backend.h"
#include "worker-gpu/cuda_api.h"
}
#include "worker-gpu/cuda_kernels.cuh"

#define LT_WORKSPACE (32u << 20)
#define MAX_GRAPH_T 256
#define MAX_PLANS 128

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    snprintf(err, errlen, "%s: %s", #call, cudaGetErrorString(e_)); return -1; } } while (0)

struct dmat { uint8_t *q; float *scale; int rows, cols; };
struct dlayer {
    float *attn_norm, *ffn_norm;
    dmat wqkv, wo, wgu, wdown;
    float *bqkv, *qk_norm;      // NULL unless the architecture has them (weights.h)
};

// One cached cuBLASLt configuration: shape (rows, cols, tokens) -> algorithm.
struct lt_plan {
    int R, C, T, ok, d_bf16;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
};

struct graph_entry { cudaGraphExec_t exec; int runs; };

struct cuda_be {
    sw_backend *be;
    sw_hparams hp;
    int E, QD, KVD, QKV, F, V, T, maxC, maxR, max_pos, n_sms;
    dlayer *L;
    dmat out;
    float *out_norm, *inv_freq;
    float *out_bias;            // NULL unless the model has one
    float embd_scale;
    bool gelu;
    bf16 *embd;
    void *kc, *vc;              // [layer][n_blocks+1][16][KVD]; the extra block takes padding tokens
    size_t kv_layer_elems, kv_elt;
    // activations
    float *x, *logits, *dacc, *ascale, *one;
    float *part_ml, *part_acc;  // attention split partials
    size_t part_rows;           // (token x head x split) rows they hold
    bf16 *h, *qkv, *att, *gu, *act;
    uint8_t *qact;
    // step inputs: one device buffer, one pinned staging buffer (same layout)
    int32_t *d_in, *h_in;
    int32_t *d_out, *h_out;
    size_t in_cap;              // int32 elements
    int table_rows_cap;
    cudaStream_t st;
    cublasLtHandle_t lt;
    void *ws;
    lt_plan plans[MAX_PLANS];
    int n_plans, lt_warned;
    graph_entry graphs[MAX_GRAPH_T + 1];
    int use_graphs;
};

// Offsets of the step inputs for a step of Tb tokens (int32 units).
struct in_layout { int32_t *stride, *tok, *pos, *seq, *lidx, *table; dev_sample *sp; };
static in_layout layout(int32_t *base, int Tb)
{
    in_layout l;
    l.stride = base;
    l.tok = base + 4;
    l.pos = l.tok + Tb;
    l.seq = l.pos + Tb;
    l.lidx = l.seq + Tb;
    l.sp = (dev_sample *)(l.lidx + Tb);
    l.table = l.lidx + Tb + 4 * Tb;
    return l;
}

// ---------------------------------------------------------------- matmul

// cuBLASLt plans are made for bucketed token counts: multiples of 16 up to
// 128, of 64 above. A daemon's steps take every count from 17 to the step
// budget; one plan per exact count would fill the cache within minutes and
// send every later shape to the slow GEMV. The rows past T are computed and
// ignored (qact's spare rows hold zeros or an earlier step's finite values).
static int lt_tokens(int T)
{
    return T <= 128 ? (T + 15) / 16 * 16 : (T + 63) / 64 * 64;
}

static lt_plan *get_plan(cuda_be *c, int R, int C, int T)
{
    for (int i = 0; i < c->n_plans; i++)
        if (c->plans[i].R == R && c->plans[i].C == C && c->plans[i].T == T) return &c->plans[i];
    if (c->n_plans == MAX_PLANS) return NULL;
    lt_plan *p = &c->plans[c->n_plans++];
    memset(p, 0, sizeof *p);
    p->R = R; p->C = C; p->T = T;
    // D[R x T] (column-major, ld R) = W^T-layout A (C x R, ld C, transposed) x B (C x T, ld C):
    // the "TN" layout FP8 matmuls require. Scales are device pointers to 1.0:
    // cuBLASLt's A/B scales are one scalar per matrix, which cannot express
    // our per-row weight scales, so the epilogue kernel applies per-row weight
    // x per-token activation scales exactly.
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if (cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return p;
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c->one, sizeof c->one);
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c->one, sizeof c->one);
    cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, C, R, C);
    cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, C, T, C);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    size_t wsz = LT_WORKSPACE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz);
    // float output keeps the accumulator exact for the epilogue; bf16 output
    // is the fallback where the library has no float-output FP8 kernel.
    for (int attempt = 0; attempt < 2 && !p->ok; attempt++) {
        if (p->d) cublasLtMatrixLayoutDestroy(p->d);
        p->d = NULL;
        p->d_bf16 = attempt;
        cublasLtMatrixLayoutCreate(&p->d, attempt ? CUDA_R_16BF : CUDA_R_32F, R, T, R);
        cublasLtMatmulHeuristicResult_t res;
        int n = 0;
        if (cublasLtMatmulAlgoGetHeuristic(c->lt, p->desc, p->a, p->b, p->d, p->d, pref, 1, &res, &n) ==
                CUBLAS_STATUS_SUCCESS && n > 0) {
            p->algo = res.algo;
            p->ok = 1;
        }
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return p;
}

static void gemv(cuda_be *c, const dmat &M, const bf16 *X, int T, int mode, bf16 *ob, float *of)
{
    for (int t0 = 0; t0 < T; t0 += 16) {
        int nt = T - t0 < 16 ? T - t0 : 16;
        const bf16 *x = X + (size_t)t0 * M.cols;
        bf16 *o1 = ob ? ob + (size_t)t0 * M.rows : NULL;
        float *o2 = of ? of + (size_t)t0 * M.rows : NULL;
        dim3 grid((unsigned)((M.rows + 7) / 8)), block(256);
        if (M.cols % 16) {
            k_gemv_fp8_any<<<grid, block, 0, c->st>>>(M.q, M.scale, M.rows, M.cols, x, nt, mode, o1, o2);
            continue;
        }
        switch (nt) {
#define CASE(N) case N: k_gemv_fp8<N><<<grid, block, 0, c->st>>>(M.q, M.scale, M.rows, M.cols, x, mode, o1, o2); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
        CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)
#undef CASE
        }
    }
}

// act = silu(W_gate x) * (W_up x), gelu() with gelu, for T <= 16 tokens in one pass (W = [gate; up]).
static void gemv_swiglu(cuda_be *c, const dmat &M, const bf16 *X, int T, bf16 *act, bool gelu)
{
    int F = M.rows / 2;
    dim3 grid((unsigned)((F + 7) / 8)), block(256);
    switch (T) {
#define CASE(N) case N: k_gemv_fp8_swiglu<N><<<grid, block, 0, c->st>>>(M.q, M.scale, F, M.cols, X, act, gelu); break;
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
    CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)
#undef CASE
    }
}

// y = W x for T tokens; mode OUT_BF16 (ob), OUT_RESID (of += ), OUT_F32 (of).
// force: 0 = choose by T, 1 = GEMV, 2 = cuBLASLt. With OUT_F32, `of` must
// hold lt_tokens(T) rows (cuBLASLt writes the bucket's rows there).
static void matmul(cuda_be *c, const dmat &M, const bf16 *X, int T, int mode, bf16 *ob, float *of, int force = 0)
{
    bool use_lt = force ? force == 2 : T > SW_GEMV_MAX_TOKENS;
    lt_plan *p = NULL;
    if (use_lt && (M.cols % 16 || M.rows % 16 || !(p = get_plan(c, M.rows, M.cols, lt_tokens(T))) || !p->ok)) {
        if (!c->lt_warned++)
            fprintf(stderr, "cuda: no cuBLASLt FP8 algorithm for %d x %d x %d tokens: using the GEMV kernel\n",
                    M.rows, M.cols, T);
        use_lt = false;
    }
    if (!use_lt) { gemv(c, M, X, T, mode, ob, of); return; }
    if (p->d_bf16 && !c->lt_warned++)
        fprintf(stderr, "cuda: cuBLASLt offers no float-output FP8 algorithm for %d x %d x %d: using bf16 output\n",
                M.rows, M.cols, T);
    k_quant_act<<<T, 256, 0, c->st>>>(X, M.cols, c->qact, c->ascale);
    float alpha = 1.0f, beta = 0.0f;
    // float logits go straight to their buffer; the epilogue scales in place
    void *D = mode == OUT_F32 && !p->d_bf16 ? (void *)of : (void *)c->dacc;
    cublasStatus_t st = cublasLtMatmul(c->lt, p->desc, &alpha, M.q, p->a, c->qact, p->b, &beta, D, p->d, D, p->d,
                                       &p->algo, c->ws, LT_WORKSPACE, c->st);
    if (st != CUBLAS_STATUS_SUCCESS) {
        // never leave garbage behind: this shape goes to the GEMV from now on
        fprintf(stderr, "cuda: cublasLtMatmul %d x %d x %d failed (status %d): using the GEMV kernel\n",
                M.rows, M.cols, T, (int)st);
        p->ok = 0;
        gemv(c, M, X, T, mode, ob, of);
        return;
    }
    size_t n = (size_t)T * M.rows;
    unsigned blocks = (unsigned)((n + 255) / 256 < 65535 * 8 ? (n + 255) / 256 : 65535 * 8);
    if (p->d_bf16)
        k_scale_epilogue<bf16><<<blocks, 256, 0, c->st>>>((const bf16 *)D, M.scale, c->ascale, M.rows, T, mode, ob, of);
    else
        k_scale_epilogue<float><<<blocks, 256, 0, c->st>>>((const float *)D, M.scale, c->ascale, M.rows, T, mode, ob, of);
}

// ---------------------------------------------------------------- the step

static void attention(cuda_be *c, const in_layout &in, int Tb, int layer)
{
    const sw_hparams &hp = c->hp;
    int hd = (int)hp.head_dim, G = (int)(hp.n_head / hp.n_head_kv);
    size_t off = (size_t)layer * c->kv_layer_elems * c->kv_elt;
    const void *kc = (const char *)c->kc + off, *vc = (const char *)c->vc + off;
    bool kv8 = c->be->kv_dtype == SW_KV_FP8;
    // Splits over positions so that small batches still give ~2 blocks per
    // SM; a function of Tb only, so a captured graph stays valid.
    int S = (2 * c->n_sms) / (Tb * (int)hp.n_head_kv);
    if (S > 32) S = 32;
    if (S < 1) S = 1;
    while (S > 1 && (size_t)Tb * hp.n_head * S > c->part_rows) S--;
    dim3 grid(Tb, hp.n_head_kv, S);
#define ATT(EPL, GG) \
    if (hd == 32 * EPL && G == GG) { \
        if (kv8) k_attention<EPL, GG, true><<<grid, 128, 0, c->st>>>(c->qkv, in.pos, in.seq, in.table, in.stride, kc, vc, c->att, hp.n_head, hp.n_head_kv, c->part_ml, c->part_acc); \
        else k_attention<EPL, GG, false><<<grid, 128, 0, c->st>>>(c->qkv, in.pos, in.seq, in.table, in.stride, kc, vc, c->att, hp.n_head, hp.n_head_kv, c->part_ml, c->part_acc); \
        if (S > 1) k_attn_combine<<<dim3(Tb, hp.n_head), 128, 0, c->st>>>(c->part_ml, c->part_acc, c->att, hp.n_head, hd, S); \
        return; }
    ATT(1, 1) ATT(1, 2) ATT(1, 4) ATT(1, 8)
    ATT(2, 1) ATT(2, 2) ATT(2, 4) ATT(2, 8)
    ATT(4, 1) ATT(4, 2) ATT(4, 4) ATT(4, 8)
    ATT(8, 1) ATT(8, 2) ATT(8, 4)
#undef ATT
    dim3 g2(Tb, hp.n_head);
    size_t shm = (size_t)c->max_pos * sizeof(float);
    if (kv8) k_attention_generic<true><<<g2, 128, shm, c->st>>>(c->qkv, in.pos, in.seq, in.table, in.stride, kc, vc, c->att, hp.n_head, hp.n_head_kv, hd);
    else k_attention_generic<false><<<g2, 128, shm, c->st>>>(c->qkv, in.pos, in.seq, in.table, in.stride, kc, vc, c->att, hp.n_head, hp.n_head_kv, hd);
}

// Enqueues a whole forward pass for Tb tokens (inputs already on the device)
// and, if want_sample, sampling of the NL logits rows into d_out.
static void enqueue_step(cuda_be *c, int Tb, int NL, bool want_sample)
{
    const sw_hparams &hp = c->hp;
    in_layout in = layout(c->d_in, Tb);
    k_embed<<<Tb, 256, 0, c->st>>>(in.tok, c->embd, c->x, c->E, c->embd_scale);
    for (uint32_t l = 0; l < hp.n_layer; l++) {
        const dlayer &L = c->L[l];
        k_rmsnorm<<<Tb, 256, 0, c->st>>>(c->x, L.attn_norm, c->h, c->E, hp.rms_eps, NULL);
        matmul(c, L.wqkv, c->h, Tb, OUT_BF16, c->qkv, NULL);
        if (L.bqkv || L.qk_norm)
            k_qkv_prep<<<Tb, 256, 0, c->st>>>(c->qkv, L.bqkv, L.qk_norm, hp.n_head, hp.n_head_kv, hp.head_dim, hp.rms_eps);
        size_t off = (size_t)l * c->kv_layer_elems * c->kv_elt;
        void *kc = (char *)c->kc + off, *vc = (char *)c->vc + off;
        if (c->be->kv_dtype == SW_KV_FP8)
            k_rope_kv<true><<<Tb, 128, 0, c->st>>>(c->qkv, in.pos, in.seq, in.table, in.stride, c->inv_freq, kc, vc,
                                                    hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_rot, hp.rope_neox);
        else
            k_rope_kv<false><<<Tb, 128, 0, c->st>>>(c->qkv, in.pos, in.seq, in.table, in.stride, c->inv_freq, kc, vc,
                                                     hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_rot, hp.rope_neox);
        attention(c, in, Tb, (int)l);
        matmul(c, L.wo, c->att, Tb, OUT_RESID, NULL, c->x);
        k_rmsnorm<<<Tb, 256, 0, c->st>>>(c->x, L.ffn_norm, c->h, c->E, hp.rms_eps, NULL);
        if (Tb <= SW_GEMV_MAX_TOKENS && c->E % 16 == 0) {
            gemv_swiglu(c, L.wgu, c->h, Tb, c->act, c->gelu);
        } else {
            matmul(c, L.wgu, c->h, Tb, OUT_BF16, c->gu, NULL);
            size_t n = (size_t)Tb * c->F;
            unsigned blocks = (unsigned)((n + 255) / 256 < 65535 * 8 ? (n + 255) / 256 : 65535 * 8);
            k_swiglu<<<blocks, 256, 0, c->st>>>(c->gu, c->act, c->F, Tb, c->gelu);
        }
        matmul(c, L.wdown, c->act, Tb, OUT_RESID, NULL, c->x);
    }
    if (NL == 0) return;
    k_rmsnorm<<<NL, 256, 0, c->st>>>(c->x, c->out_norm, c->h, c->E, hp.rms_eps, in.lidx);
    matmul(c, c->out, c->h, NL, OUT_F32, NULL, c->logits);
    if (c->out_bias) k_add_bias<<<NL, 256, 0, c->st>>>(c->logits, c->out_bias, c->V);
    if (want_sample) k_sample<<<NL, 1024, 0, c->st>>>(c->logits, c->V, in.sp, c->d_out);
}

// Writes the batch into the pinned staging buffer for a step of Tb >= n tokens
// (padding tokens use an extra table row whose blocks are the spare block).
static int stage(cuda_be *c, const sw_batch *b, const sw_dev_sample *sp, int Tb, size_t *n_elems,
                 char *err, size_t errlen)
{
    int rows = b->n_seqs + (Tb > b->n_tokens);
    size_t need = 4 + 8 * (size_t)Tb + (size_t)rows * b->max_blocks;
    if (need > c->in_cap || rows > c->table_rows_cap) {
        snprintf(err, errlen, "batch too large for the device input buffer (%zu > %zu)", need, c->in_cap);
        return -1;
    }
    in_layout in = layout(c->h_in, Tb);
    in.stride[0] = b->max_blocks;
    for (int i = 0; i < Tb; i++) {
        bool real = i < b->n_tokens;
        in.tok[i] = real ? b->tokens[i] : 0;
        in.pos[i] = real ? b->pos[i] : 0;
        in.seq[i] = real ? b->seq[i] : b->n_seqs;
    }
    int NL = Tb > b->n_tokens ? Tb : b->n_logits;
    for (int i = 0; i < NL; i++) {
        in.lidx[i] = i < b->n_logits ? b->logits_idx[i] : i;
        dev_sample d = {0.0f, 0.0f, 0.0f, 0};
        if (sp && i < b->n_logits) d = dev_sample{sp[i].temperature, sp[i].top_p, sp[i].uniform, sp[i].top_k};
        in.sp[i] = d;
    }
    memcpy(in.table, b->block_table, (size_t)b->n_seqs * b->max_blocks * sizeof(int32_t));
    if (rows > b->n_seqs)
        for (int j = 0; j < b->max_blocks; j++) in.table[(size_t)b->n_seqs * b->max_blocks + j] = (int32_t)c->be->n_kv_blocks;
    *n_elems = need;
    return 0;
}

static int bucket(int n)
{
    int b = 1;
    while (b < n) b <<= 1;
    return b;
}

static int run_step(cuda_be *c, const sw_batch *b, const sw_dev_sample *sp, char *err, size_t errlen)
{
    if (sw_batch_validate(c->be, b, err, errlen)) return -1;
    for (int i = 0; i < b->n_tokens; i++)
        if (b->pos[i] >= c->max_pos) {
            snprintf(err, errlen, "token %d: position %d beyond the model's context (%d)", i, b->pos[i], c->max_pos);
            return -1;
        }
    // Steady-state decode (one token per sequence, every row sampled) replays
    // a CUDA graph captured for the batch-size bucket; everything else runs eagerly.
    bool graphable = c->use_graphs && sp && b->n_logits == b->n_tokens && b->n_tokens <= MAX_GRAPH_T &&
                     bucket(b->n_tokens) <= c->T;
    for (int i = 0; graphable && i < b->n_tokens; i++) if (b->seq[i] != i) graphable = false;
    int Tb = graphable ? bucket(b->n_tokens) : b->n_tokens;
    int NL = graphable ? Tb : b->n_logits;
    size_t n_elems;
    if (stage(c, b, sp, Tb, &n_elems, err, errlen)) return -1;
    CK(cudaMemcpyAsync(c->d_in, c->h_in, n_elems * sizeof(int32_t), cudaMemcpyHostToDevice, c->st));
    if (graphable) {
        graph_entry &g = c->graphs[Tb];
        if (!g.exec && g.runs >= 1) {
            // capture after one eager run (kernels loaded, cuBLASLt plans made)
            cudaGraph_t graph;
            if (cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
                enqueue_step(c, Tb, NL, true);
                if (cudaStreamEndCapture(c->st, &graph) == cudaSuccess) {
                    if (cudaGraphInstantiate(&g.exec, graph, 0) != cudaSuccess) g.exec = NULL;
                    cudaGraphDestroy(graph);
                }
            }
            if (!g.exec) {
                cudaGetLastError();
                fprintf(stderr, "cuda: graph capture failed for batch %d; running without graphs\n", Tb);
                c->use_graphs = 0;
            }
        }
        g.runs++;
        if (g.exec) CK(cudaGraphLaunch(g.exec, c->st));
        else enqueue_step(c, Tb, NL, true);
    } else {
        enqueue_step(c, Tb, NL, sp != NULL);
    }
    CK(cudaGetLastError());
    return 0;
}

static int cuda_forward(void *impl, const sw_batch *b, float *logits, char *err, size_t errlen)
{
    cuda_be *c = (cuda_be *)impl;
    if (run_step(c, b, NULL, err, errlen)) return -1;
    if (b->n_logits)
        CK(cudaMemcpyAsync(logits, c->logits, (size_t)b->n_logits * c->V * sizeof(float), cudaMemcpyDeviceToHost, c->st));
    CK(cudaStreamSynchronize(c->st));
    return 0;
}

static int cuda_forward_sample(void *impl, const sw_batch *b, const sw_dev_sample *sp, int32_t *out,
                               char *err, size_t errlen)
{
    cuda_be *c = (cuda_be *)impl;
    if (run_step(c, b, sp, err, errlen)) return -1;
    if (b->n_logits)
        CK(cudaMemcpyAsync(c->h_out, c->d_out, (size_t)b->n_logits * sizeof(int32_t), cudaMemcpyDeviceToHost, c->st));
    CK(cudaStreamSynchronize(c->st));
    memcpy(out, c->h_out, (size_t)b->n_logits * sizeof(int32_t));
    return 0;
}

// ---------------------------------------------------------------- setup

static void cuda_destroy(void *impl)
{
    cuda_be *c = (cuda_be *)impl;
    if (!c) return;
    if (c->st) cudaStreamSynchronize(c->st);
    for (int i = 0; i <= MAX_GRAPH_T; i++) if (c->graphs[i].exec) cudaGraphExecDestroy(c->graphs[i].exec);
    for (int i = 0; i < c->n_plans; i++) {
        lt_plan *p = &c->plans[i];
        if (p->desc) cublasLtMatmulDescDestroy(p->desc);
        if (p->a) cublasLtMatrixLayoutDestroy(p->a);
        if (p->b) cublasLtMatrixLayoutDestroy(p->b);
        if (p->d) cublasLtMatrixLayoutDestroy(p->d);
    }
    if (c->lt) cublasLtDestroy(c->lt);
    if (c->L) {
        for (uint32_t l = 0; l < c->hp.n_layer; l++) {
            dlayer &L = c->L[l];
            cudaFree(L.attn_norm); cudaFree(L.ffn_norm); cudaFree(L.bqkv); cudaFree(L.qk_norm);
            cudaFree(L.wqkv.q); cudaFree(L.wqkv.scale); cudaFree(L.wo.q); cudaFree(L.wo.scale);
            cudaFree(L.wgu.q); cudaFree(L.wgu.scale); cudaFree(L.wdown.q); cudaFree(L.wdown.scale);
        }
        free(c->L);
    }
    cudaFree(c->out.q); cudaFree(c->out.scale); cudaFree(c->out_norm); cudaFree(c->inv_freq); cudaFree(c->embd);
    cudaFree(c->out_bias);
    cudaFree(c->kc); cudaFree(c->vc);
    cudaFree(c->part_ml); cudaFree(c->part_acc);
    cudaFree(c->x); cudaFree(c->logits); cudaFree(c->dacc); cudaFree(c->ascale); cudaFree(c->one);
    cudaFree(c->h); cudaFree(c->qkv); cudaFree(c->att); cudaFree(c->gu); cudaFree(c->act); cudaFree(c->qact);
    cudaFree(c->d_in); cudaFree(c->d_out); cudaFree(c->ws);
    if (c->h_in) cudaFreeHost(c->h_in);
    if (c->h_out) cudaFreeHost(c->h_out);
    if (c->st) cudaStreamDestroy(c->st);
    free(c);
}

static const sw_backend_ops cuda_ops = { "cuda", cuda_forward, cuda_forward_sample, cuda_destroy };

static int upload(void **dst, const void *src, size_t bytes, char *err, size_t errlen)
{
    CK(cudaMalloc(dst, bytes ? bytes : 1));
    if (src) CK(cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice));
    return 0;
}

static int upload_mat(dmat *d, const sw_fp8_matrix *m, char *err, size_t errlen)
{
    d->rows = (int)m->rows;
    d->cols = (int)m->cols;
    if (upload((void **)&d->q, m->q, (size_t)m->rows * m->cols, err, errlen)) return -1;
    return upload((void **)&d->scale, m->scale, (size_t)m->rows * sizeof(float), err, errlen);
}

static double gib(double b) { return b / (1024.0 * 1024.0 * 1024.0); }

// The model's dimensions and the buffers' widest rows and columns.
static void setup_dims(cuda_be *c, const sw_fp8_weights *w, sw_kv_dtype kv)
{
    const sw_hparams &hp = w->hp;
    c->hp = hp;
    c->E = (int)hp.n_embd; c->QD = (int)w->q_dim; c->KVD = (int)w->kv_dim;
    c->QKV = c->QD + 2 * c->KVD; c->F = (int)hp.n_ff; c->V = (int)hp.n_vocab;
    c->maxC = c->E > c->QD ? c->E : c->QD;
    if (c->F > c->maxC) c->maxC = c->F;
    c->maxR = c->QKV > 2 * c->F ? c->QKV : 2 * c->F;
    if (c->E > c->maxR) c->maxR = c->E;
    // dacc also takes the output projection's D when cuBLASLt only offers bf16 output (V x 2 bytes a token)
    if ((c->V + 1) / 2 > c->maxR) c->maxR = (c->V + 1) / 2;
    c->kv_elt = kv == SW_KV_FP8 ? 1 : 2;
    c->max_pos = (int)((hp.n_ctx_train + SW_KV_BLOCK - 1) / SW_KV_BLOCK * SW_KV_BLOCK);
}

// The memory plan, before allocating anything big: the KV blocks that fit
// (*n_kv_blocks, when it is 0) and their bytes (*kv_bytes); -1 with err
// when the model does not fit.
static int plan_memory(cuda_be *c, const sw_fp8_weights *w, uint32_t *n_kv_blocks, size_t *kv_bytes, sw_kv_dtype kv,
                       char *err, size_t errlen)
{
    const sw_hparams &hp = w->hp;
    size_t T = (size_t)c->T, TL = (size_t)lt_tokens(c->T);   // TL: rows of the cuBLASLt buffers
    size_t weights = w->fp8_bytes + (size_t)hp.n_layer * (c->QKV + c->E + 2 * c->F + c->E + 2 * c->E) * sizeof(float) +
                     (size_t)c->V * sizeof(float);
    size_t acts = T * c->E * 4 + T * c->E * 2 + T * c->QKV * 2 + T * c->QD * 2 + T * 2 * c->F * 2 + T * c->F * 2 +
                  TL * c->V * 4 + TL * c->maxC + TL * c->maxR * 4 + LT_WORKSPACE + (64u << 20);
    size_t per_block = 2 * (size_t)hp.n_layer * SW_KV_BLOCK * c->KVD * c->kv_elt;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    size_t reserve = 512u << 20;
    if (*n_kv_blocks == 0) {
        double avail = (double)free_b - weights - acts - reserve;
        double nb = avail > 0 ? avail * 0.9 / per_block : 0;
        uint32_t cap = 1u << 22;
        *n_kv_blocks = nb > cap ? cap : (uint32_t)nb;
        if (*n_kv_blocks < 16) {
            snprintf(err, errlen, "model does not fit: weights %.2f GiB + activations %.2f GiB + a minimal KV cache "
                     "need more than the %.2f GiB free on the device", gib(weights), gib(acts), gib(free_b));
            return -1;
        }
    }
    *kv_bytes = (size_t)(*n_kv_blocks + 1) * per_block;
    if (weights + acts + *kv_bytes + reserve > free_b) {
        snprintf(err, errlen, "out of device memory: needs %.2f GiB (weights %.2f, KV cache %u blocks %.2f, "
                 "activations %.2f, reserve %.2f) but %.2f GiB of %.2f are free; lower --kv-blocks or "
                 "--max-tokens-per-step", gib(weights + acts + *kv_bytes + reserve), gib(weights), *n_kv_blocks,
                 gib(*kv_bytes), gib(acts), gib(reserve), gib(free_b), gib(total_b));
        return -1;
    }
    c->be->n_kv_blocks = *n_kv_blocks;
    fprintf(stderr, "cuda: memory plan: weights %.2f GiB, KV %u blocks x %d (%s) %.2f GiB, activations %.2f GiB, "
            "free %.2f GiB\n", gib(weights), *n_kv_blocks, SW_KV_BLOCK, kv == SW_KV_FP8 ? "fp8" : "bf16",
            gib(*kv_bytes), gib(acts), gib(free_b));
    return 0;
}

// Every layer's weights, the output head, RoPE frequencies and embeddings.
static int upload_weights(cuda_be *c, const sw_fp8_weights *w, char *err, size_t errlen)
{
    const sw_hparams &hp = w->hp;
    c->L = (dlayer *)calloc(hp.n_layer, sizeof(dlayer));
    if (!c->L) { snprintf(err, errlen, "out of memory"); return -1; }
    for (uint32_t l = 0; l < hp.n_layer; l++) {
        const sw_fp8_layer &S = w->layers[l];
        dlayer &L = c->L[l];
        if (upload((void **)&L.attn_norm, S.attn_norm, c->E * sizeof(float), err, errlen) ||
            upload((void **)&L.ffn_norm, S.ffn_norm, c->E * sizeof(float), err, errlen) ||
            upload_mat(&L.wqkv, &S.wqkv, err, errlen) || upload_mat(&L.wo, &S.wo, err, errlen) ||
            upload_mat(&L.wgu, &S.wgu, err, errlen) || upload_mat(&L.wdown, &S.wdown, err, errlen) ||
            (S.bqkv && upload((void **)&L.bqkv, S.bqkv, (size_t)c->QKV * sizeof(float), err, errlen)) ||
            (S.qk_norm && upload((void **)&L.qk_norm, S.qk_norm, 2 * hp.head_dim * sizeof(float), err, errlen)))
            return -1;
    }
    if (upload_mat(&c->out, &w->output, err, errlen) ||
        upload((void **)&c->out_norm, w->output_norm, c->E * sizeof(float), err, errlen) ||
        upload((void **)&c->inv_freq, w->rope_inv_freq, (hp.n_rot / 2 + 1) * sizeof(float), err, errlen) ||
        upload((void **)&c->embd, w->tok_embd, (size_t)c->V * c->E * 2, err, errlen) ||
        (w->output_bias && upload((void **)&c->out_bias, w->output_bias, (size_t)c->V * sizeof(float), err, errlen)))
        return -1;
    c->embd_scale = w->embd_scale;
    c->gelu = w->gelu;
    return 0;
}

// The activations and step buffers for c->T tokens, the pinned step
// input and output, the stream and the cuBLASLt handle.
static int alloc_steps(cuda_be *c, uint32_t n_kv_blocks, char *err, size_t errlen)
{
    const sw_hparams &hp = c->hp;
    size_t T = (size_t)c->T, TL = (size_t)lt_tokens(c->T);
    float one = 1.0f;
    if (upload((void **)&c->x, NULL, T * c->E * 4, err, errlen) ||
        upload((void **)&c->h, NULL, T * c->E * 2, err, errlen) ||
        upload((void **)&c->qkv, NULL, T * c->QKV * 2, err, errlen) ||
        upload((void **)&c->att, NULL, T * c->QD * 2, err, errlen) ||
        upload((void **)&c->gu, NULL, T * 2 * c->F * 2, err, errlen) ||
        upload((void **)&c->act, NULL, T * c->F * 2, err, errlen) ||
        upload((void **)&c->logits, NULL, TL * c->V * 4, err, errlen) ||
        upload((void **)&c->qact, NULL, TL * c->maxC, err, errlen) ||
        upload((void **)&c->dacc, NULL, TL * c->maxR * 4, err, errlen) ||
        upload((void **)&c->ascale, NULL, TL * 4, err, errlen) ||
        upload((void **)&c->one, &one, 4, err, errlen) ||
        upload(&c->ws, NULL, LT_WORKSPACE, err, errlen) ||
        upload((void **)&c->d_out, NULL, T * 4, err, errlen))
        return -1;
    CK(cudaMemset(c->qact, 0, TL * c->maxC));   // spare bucket rows: FP8 zeros
    int dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&c->n_sms, cudaDevAttrMultiProcessorCount, dev));
    c->part_rows = (size_t)(T > 256 ? T : 256) * hp.n_head;
    if (upload((void **)&c->part_ml, NULL, c->part_rows * 2 * sizeof(float), err, errlen) ||
        upload((void **)&c->part_acc, NULL, c->part_rows * hp.head_dim * sizeof(float), err, errlen))
        return -1;
    int max_blocks = (int)((hp.n_ctx_train + SW_KV_BLOCK - 1) / SW_KV_BLOCK);
    if ((uint32_t)max_blocks > n_kv_blocks) max_blocks = (int)n_kv_blocks;
    c->table_rows_cap = c->T + 1;
    c->in_cap = 4 + 8 * T + (size_t)c->table_rows_cap * (max_blocks + SW_KV_BLOCK);
    if (upload((void **)&c->d_in, NULL, c->in_cap * 4, err, errlen)) return -1;
    CK(cudaMallocHost((void **)&c->h_in, c->in_cap * 4));
    CK(cudaMallocHost((void **)&c->h_out, T * 4));
    CK(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));
    if (cublasLtCreate(&c->lt) != CUBLAS_STATUS_SUCCESS) { snprintf(err, errlen, "cublasLtCreate failed"); return -1; }
    return 0;
}

// Head sizes / GQA groups without a specialized kernel take the generic
// attention kernel, which keeps one score per position in shared memory:
// raise its limit, or -1 with err when the context cannot fit.
static int setup_attention(cuda_be *c, char *err, size_t errlen)
{
    const sw_hparams &hp = c->hp;
    int hd = (int)hp.head_dim, G = (int)(hp.n_head / hp.n_head_kv);
    bool fast_att = (hd == 32 || hd == 64 || hd == 128 || (hd == 256 && G <= 4)) && (G == 1 || G == 2 || G == 4 || G == 8);
    if (fast_att) return 0;
    size_t shm = (size_t)c->max_pos * sizeof(float);
    if (shm > 200 * 1024) {
        snprintf(err, errlen, "head size %d with %d query heads per KV head has no specialized attention kernel, "
                 "and the generic one cannot hold a context of %d positions", hd, G, c->max_pos);
        return -1;
    }
    if (shm > 48 * 1024) {
        CK(cudaFuncSetAttribute(k_attention_generic<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
        CK(cudaFuncSetAttribute(k_attention_generic<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
    }
    return 0;
}

static int setup(cuda_be *c, sw_fp8_weights *w, uint32_t n_kv_blocks, sw_kv_dtype kv, char *err, size_t errlen)
{
    setup_dims(c, w, kv);
    size_t kv_bytes = 0;
    if (plan_memory(c, w, &n_kv_blocks, &kv_bytes, kv, err, errlen) || upload_weights(c, w, err, errlen)) return -1;

    // ---- KV cache (+1 spare block that padding tokens write into)
    c->kv_layer_elems = (size_t)(n_kv_blocks + 1) * SW_KV_BLOCK * c->KVD;
    if (upload(&c->kc, NULL, kv_bytes / 2, err, errlen) || upload(&c->vc, NULL, kv_bytes / 2, err, errlen)) return -1;
    CK(cudaMemset(c->kc, 0, kv_bytes / 2));
    CK(cudaMemset(c->vc, 0, kv_bytes / 2));

    if (alloc_steps(c, n_kv_blocks, err, errlen) || setup_attention(c, err, errlen)) return -1;
    const char *ng = getenv("SPILLWAY_NO_GRAPHS");
    c->use_graphs = !(ng && *ng && strcmp(ng, "0"));
    // the KV memsets (and pageable uploads) ran on the legacy stream, which the
    // non-blocking c->st does not wait for: finish them before the first step
    CK(cudaDeviceSynchronize());
    return 0;
}

extern "C" sw_backend *sw_cuda_backend_new(sw_fp8_weights *w, uint32_t n_kv_blocks, sw_kv_dtype kv,
                                           int max_tokens_per_step, char *err, size_t errlen)
{
    sw_backend *be = (sw_backend *)calloc(1, sizeof *be);
    cuda_be *c = (cuda_be *)calloc(1, sizeof *c);
    if (!be || !c) { free(be); free(c); sw_fp8_weights_free(w); snprintf(err, errlen, "out of memory"); return NULL; }
    if (max_tokens_per_step <= 0) max_tokens_per_step = 512;
    be->ops = &cuda_ops;
    be->impl = c;
    be->hp = w->hp;
    be->kv_dtype = kv;
    be->max_tokens_per_step = max_tokens_per_step;
    c->be = be;
    c->T = max_tokens_per_step;
    int rc = setup(c, w, n_kv_blocks, kv, err, errlen);
    sw_fp8_weights_free(w);   // uploaded (or failed): the host copy is no longer needed
    if (rc) { sw_backend_free(be); return NULL; }
    return be;
}

// ---------------------------------------------------------------- utilities

extern "C" int sw_cuda_device_count(char *err, size_t errlen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
        return 0;
    }
    if (n == 0) snprintf(err, errlen, "cudaGetDeviceCount: 0 devices");
    return n;
}

extern "C" void sw_cuda_device_info(char *buf, size_t len)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) { snprintf(buf, len, "device 0: unknown"); return; }
    snprintf(buf, len, "device 0: %s, sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB", p.name, p.major, p.minor,
             p.multiProcessorCount, gib((double)p.totalGlobalMem), p.l2CacheSize >> 20);
}

extern "C" double sw_cuda_copy_bandwidth(size_t bytes, int iters, char *err, size_t errlen)
{
    void *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaFree(a);
        snprintf(err, errlen, "cudaMalloc of 2 x %zu bytes failed", bytes);
        return -1;
    }
    cudaMemset(a, 1, bytes);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);   // warm-up
    cudaEventRecord(e0);
    for (int i = 0; i < iters; i++) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || ms <= 0) { snprintf(err, errlen, "copy benchmark: %s", cudaGetErrorString(e)); return -1; }
    return 2.0 * bytes * iters / (ms * 1e-3) / 1e9;   // read + write
}

// ---- self-test: GEMV vs cuBLASLt vs a host reference

static uint64_t st_rng = 88172645463325252ull;
static float frand(void)
{
    st_rng ^= st_rng << 13; st_rng ^= st_rng >> 7; st_rng ^= st_rng << 17;
    return (float)((st_rng >> 11) * 0x1p-53) * 2.0f - 1.0f;
}

static float host_bf16(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    b += 0x7FFFu + ((b >> 16) & 1);
    b &= 0xFFFF0000u;
    memcpy(&x, &b, 4);
    return x;
}

// host reference of the same matmul: per-token fp8 activations if fp8_act
static void host_ref(const sw_fp8_matrix *m, const float *x, int T, bool fp8_act, float *y)
{
    const float *lut = sw_fp8_table();
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * m->cols;
        float s = 1.0f;
        float *xq = (float *)malloc(m->cols * sizeof(float));
        if (fp8_act) {
            sw_fp8 *q = (sw_fp8 *)malloc(m->cols);
            s = sw_fp8_quantize_row(xt, m->cols, q);
            for (uint32_t c = 0; c < m->cols; c++) xq[c] = lut[q[c]];
            free(q);
        } else {
            memcpy(xq, xt, m->cols * sizeof(float));
        }
        for (uint32_t r = 0; r < m->rows; r++) {
            double acc = 0;
            for (uint32_t c = 0; c < m->cols; c++) acc += (double)lut[m->q[(size_t)r * m->cols + c]] * xq[c];
            y[(size_t)t * m->rows + r] = (float)acc * m->scale[r] * s;
        }
        free(xq);
    }
}

static double rel_err(const float *a, const float *b, size_t n, double *cosine)
{
    double num = 0, den = 0, ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d; den += (double)b[i] * b[i];
        ab += (double)a[i] * b[i]; aa += (double)a[i] * a[i]; bb += (double)b[i] * b[i];
    }
    if (cosine) *cosine = ab / sqrt(aa * bb + 1e-30);
    return sqrt(num / (den + 1e-30));
}

// The device sampler against the host: greedy rows give the host's argmax
// (lowest id on ties), top_k 1 gives it at any temperature, and a row with a
// NaN anywhere gives -1 whether greedy or not. Returns the failed cases.
static int selftest_sample(cuda_be *c, char *err, size_t errlen)
{
    enum { V = 32000, ROWS = 6 };
    float *l = (float *)malloc((size_t)ROWS * V * 4);
    for (size_t i = 0; i < (size_t)ROWS * V; i++) l[i] = frand() * 8.0f;
    l[1 * V + 7] = l[1 * V + 9] = 100.0f;            // a tie: the lower id wins
    l[2 * V + V - 1] = NAN;                          // NaN in the last slot, greedy
    l[3 * V + 0] = NAN;                              // NaN in the first slot, sampled
    const dev_sample sp[ROWS] = { {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0.8f, 0.9f, 0.5f, 40},
                                  {1.5f, 0, 0.99f, 1}, {0.7f, 0.95f, 0.3f, 0} };
    int32_t want[ROWS], got[ROWS];
    for (int r = 0; r < ROWS; r++) {
        int best = 0;
        for (int i = 1; i < V; i++) if (l[(size_t)r * V + i] > l[(size_t)r * V + best]) best = i;
        want[r] = best;
    }
    want[2] = want[3] = -1;
    want[5] = -2;                                    // any valid id
    float *dl; dev_sample *dsp; int32_t *dout;
    if (upload((void **)&dl, l, (size_t)ROWS * V * 4, err, errlen) || upload((void **)&dsp, sp, sizeof sp, err, errlen) ||
        upload((void **)&dout, NULL, sizeof got, err, errlen)) {
        free(l);
        return 1;
    }
    k_sample<<<ROWS, 1024, 0, c->st>>>(dl, V, dsp, dout);
    int fails = 0;
    if (cudaMemcpyAsync(got, dout, sizeof got, cudaMemcpyDeviceToHost, c->st) != cudaSuccess ||
        cudaStreamSynchronize(c->st) != cudaSuccess) {
        fprintf(stderr, "selftest sampler: %s  <-- FAIL\n", cudaGetErrorString(cudaGetLastError()));
        fails = 1;
    } else {
        for (int r = 0; r < ROWS; r++) {
            bool ok = want[r] == -2 ? got[r] >= 0 && got[r] < V : got[r] == want[r];
            char w[32];
            if (want[r] == -2) snprintf(w, sizeof w, "an id below %d", V); else snprintf(w, sizeof w, "%d", want[r]);
            fprintf(stderr, "selftest sampler row %d: got %d, want %s%s\n", r, got[r], w, ok ? "" : "  <-- FAIL");
            fails += !ok;
        }
    }
    cudaFree(dl); cudaFree(dsp); cudaFree(dout);
    free(l);
    return fails;
}

// One matmul case of the selftest: m (uploaded as d) times T random bf16
// tokens, by the GEMV and (when it applies) cuBLASLt, against the host.
// 1 when it disagrees, 0 when it agrees, -1 with err on a CUDA failure.
static int selftest_matmul_tokens(cuda_be *c, const sw_fp8_matrix *m, dmat d, int T, char *err, size_t errlen)
{
    int R = (int)m->rows, C = (int)m->cols;
    float *x = (float *)malloc((size_t)T * C * 4), *ref = (float *)malloc((size_t)T * R * 4),
          *ref8 = (float *)malloc((size_t)T * R * 4), *g = (float *)malloc((size_t)T * R * 4),
          *l = (float *)malloc((size_t)T * R * 4);
    uint16_t *xb = (uint16_t *)malloc((size_t)T * C * 2);
    for (size_t i = 0; i < (size_t)T * C; i++) {
        x[i] = host_bf16(frand());
        uint32_t u; memcpy(&u, &x[i], 4); xb[i] = (uint16_t)(u >> 16);
    }
    host_ref(m, x, T, false, ref);
    host_ref(m, x, T, true, ref8);
    bf16 *dx; float *dy;
    if (upload((void **)&dx, xb, (size_t)T * C * 2, err, errlen) || upload((void **)&dy, NULL, (size_t)T * R * 4, err, errlen)) return -1;
    matmul(c, d, dx, T, OUT_F32, NULL, dy, 1);
    CK(cudaMemcpyAsync(g, dy, (size_t)T * R * 4, cudaMemcpyDeviceToHost, c->st));
    CK(cudaStreamSynchronize(c->st));
    double cg, cl = 0, cx = 0;
    double eg = rel_err(g, ref, (size_t)T * R, &cg), el = -1, ex = -1;
    bool ok = eg < 1e-4;
    if (T > SW_GEMV_MAX_TOKENS && C % 16 == 0 && R % 16 == 0) {
        c->lt_warned = 0;
        matmul(c, d, dx, T, OUT_F32, NULL, dy, 2);
        CK(cudaMemcpyAsync(l, dy, (size_t)T * R * 4, cudaMemcpyDeviceToHost, c->st));
        CK(cudaStreamSynchronize(c->st));
        el = rel_err(l, ref8, (size_t)T * R, &cl);   // same numerics as the host fp8-act reference
        ex = rel_err(l, g, (size_t)T * R, &cx);       // cuBLASLt vs GEMV: differ by activation fp8 rounding
        lt_plan *pl = get_plan(c, R, C, lt_tokens(T));
        // bf16 output rounds at 2^-9; Hopper's FP8 tensor cores accumulate in ~13-bit
        // truncating mantissas, so even float output is not within 1e-4 of a double sum
        double tol = pl && pl->d_bf16 ? 5e-3 : 2e-3;
        ok = ok && pl && pl->ok && el < tol && cx > 0.995;
    }
    CK(cudaGetLastError());
    fprintf(stderr, "selftest %5d x %5d, %2d tokens: GEMV vs host rel %.2e%s", R, C, T, eg,
            ok ? "" : "  <-- FAIL");
    if (el >= 0) fprintf(stderr, " | cuBLASLt vs host-fp8 rel %.2e | cuBLASLt vs GEMV cos %.5f rel %.2e", el, cx, ex);
    fprintf(stderr, "\n");
    cudaFree(dx); cudaFree(dy);
    free(x); free(ref); free(ref8); free(g); free(l); free(xb);
    return !ok;
}

// A random R x C matrix at each selftest token count: the cases that
// disagree, or -1 with err on a CUDA failure.
static int selftest_matmul(cuda_be *c, int R, int C, char *err, size_t errlen)
{
    int toks[] = { 1, 5, 16, 64 };
    int fails = 0;
    sw_fp8_matrix m = { (uint32_t)R, (uint32_t)C, (sw_fp8 *)malloc((size_t)R * C), (float *)malloc(R * 4) };
    float *row = (float *)malloc(C * 4);
    for (int r = 0; r < R; r++) {
        for (int k = 0; k < C; k++) row[k] = frand() * (1.0f + (k % 97 == 0) * 8.0f);
        m.scale[r] = sw_fp8_quantize_row(row, C, m.q + (size_t)r * C);
    }
    dmat d;
    if (upload_mat(&d, &m, err, errlen)) return -1;
    for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
        int r = selftest_matmul_tokens(c, &m, d, toks[ti], err, errlen);
        if (r < 0) return -1;
        fails += r;
    }
    cudaFree(d.q); cudaFree(d.scale);
    free(m.q); free(m.scale); free(row);
    return fails;
}

// The fused gate/up + SwiGLU GEMV against the host, T tokens:
// act = silu(bf(g)) * bf(u). 1 when it disagrees, -1 with err on a CUDA failure.
static int selftest_swiglu(cuda_be *c, int T, char *err, size_t errlen)
{
    int F = 1024, C = 4096;
    sw_fp8_matrix m = { (uint32_t)(2 * F), (uint32_t)C, (sw_fp8 *)malloc((size_t)2 * F * C), (float *)malloc(2 * F * 4) };
    float *row = (float *)malloc(C * 4), *x = (float *)malloc((size_t)T * C * 4), *ref = (float *)malloc((size_t)T * 2 * F * 4);
    float *want = (float *)malloc((size_t)T * F * 4), *got = (float *)malloc((size_t)T * F * 4);
    uint16_t *xb = (uint16_t *)malloc((size_t)T * C * 2), *gb = (uint16_t *)malloc((size_t)T * F * 2);
    for (int r = 0; r < 2 * F; r++) {
        for (int k = 0; k < C; k++) row[k] = frand();
        m.scale[r] = sw_fp8_quantize_row(row, C, m.q + (size_t)r * C);
    }
    for (size_t i = 0; i < (size_t)T * C; i++) {
        x[i] = host_bf16(frand());
        uint32_t u; memcpy(&u, &x[i], 4); xb[i] = (uint16_t)(u >> 16);
    }
    host_ref(&m, x, T, false, ref);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < F; j++) {
            float g = host_bf16(ref[(size_t)t * 2 * F + j]), u = host_bf16(ref[(size_t)t * 2 * F + F + j]);
            want[(size_t)t * F + j] = g / (1.0f + expf(-g)) * u;
        }
    dmat d;
    bf16 *dx, *da;
    if (upload_mat(&d, &m, err, errlen) || upload((void **)&dx, xb, (size_t)T * C * 2, err, errlen) ||
        upload((void **)&da, NULL, (size_t)T * F * 2, err, errlen))
        return -1;
    gemv_swiglu(c, d, dx, T, da, false);
    CK(cudaMemcpyAsync(gb, da, (size_t)T * F * 2, cudaMemcpyDeviceToHost, c->st));
    CK(cudaStreamSynchronize(c->st));
    for (size_t i = 0; i < (size_t)T * F; i++) { uint32_t u = (uint32_t)gb[i] << 16; memcpy(&got[i], &u, 4); }
    double cs, e = rel_err(got, want, (size_t)T * F, &cs);
    bool ok = e < 1e-2;
    fprintf(stderr, "selftest fused gate/up+SwiGLU %d x %d, %2d tokens: rel %.2e%s\n", F, C, T, e, ok ? "" : "  <-- FAIL");
    cudaFree(d.q); cudaFree(d.scale); cudaFree(dx); cudaFree(da);
    free(m.q); free(m.scale); free(row); free(x); free(ref); free(want); free(got); free(xb); free(gb);
    return !ok;
}

extern "C" int sw_cuda_selftest(char *err, size_t errlen)
{
    struct { int R, C; } shapes[] = { {4096, 4096}, {1024, 14336}, {6144, 4096}, {512, 176} };
    int fails = 0;
    cuda_be c;
    memset(&c, 0, sizeof c);
    sw_backend be;
    memset(&be, 0, sizeof be);
    c.be = &be;
    c.T = 64;
    if (cublasLtCreate(&c.lt) != CUBLAS_STATUS_SUCCESS) { snprintf(err, errlen, "cublasLtCreate failed"); return -1; }
    CK(cudaStreamCreate(&c.st));
    float one = 1.0f;
    if (upload((void **)&c.one, &one, 4, err, errlen) || upload(&c.ws, NULL, LT_WORKSPACE, err, errlen) ||
        upload((void **)&c.qact, NULL, 64 * 16384, err, errlen) ||
        upload((void **)&c.dacc, NULL, 64 * 8192 * 4, err, errlen) ||
        upload((void **)&c.ascale, NULL, 64 * 4, err, errlen))
        return -1;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int r = selftest_matmul(&c, shapes[si].R, shapes[si].C, err, errlen);
        if (r < 0) return -1;
        fails += r;
    }
    for (int T = 1; T <= 16; T += 15) {
        int r = selftest_swiglu(&c, T, err, errlen);
        if (r < 0) return -1;
        fails += r;
    }
    fails += selftest_sample(&c, err, errlen);
    for (int i = 0; i < c.n_plans; i++) {
        cublasLtMatmulDescDestroy(c.plans[i].desc);
        cublasLtMatrixLayoutDestroy(c.plans[i].a);
        cublasLtMatrixLayoutDestroy(c.plans[i].b);
        cublasLtMatrixLayoutDestroy(c.plans[i].d);
    }
    cublasLtDestroy(c.lt);
    cudaFree(c.one); cudaFree(c.ws); cudaFree(c.qact); cudaFree(c.dacc); cudaFree(c.ascale);
    cudaStreamDestroy(c.st);
    if (fails) { snprintf(err, errlen, "%d case(s) disagree", fails); return -1; }
    return 0;
}
