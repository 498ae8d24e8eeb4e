/* Kernel dispatch, activation quantization and the matrix x tokens product.
 *
 * Three tables (scalar, AVX2, AVX-512) are built once; the active one is
 * chosen from cpuid, or from SPILLWAY_ISA, or by sw_isa_set (tests). The
 * scalar table is exactly the llm/quant.c reference, so ISA=scalar gives the
 * reference results bit for bit.
 *
 * sw_matmul picks by token count: one token -> one pass per weight row;
 * 2..31 -> each weight block decoded once for up to SW_DOTN_MAX tokens (dotn);
 * 32+ K-quant tokens with AVX-512 -> 16 rows repacked row-interleaved
 * (sw_kpack16) so vpdpbusd works on 16 rows at once (gemm16), which is what
 * makes prefill compute-efficient.
 *
 * The forward pass does not use those raw-row paths for Q4_K..Q6_K and
 * Q4_0..Q8_0 on AVX-512 VNNI (all but Q6_K on AVX2): sw_pack_tensor repacks
 * each matrix once at load into 16-row interleaved blocks that keep the
 * quants (sw_q4k16 / sw_q6k16 / the sw_q32x16 form, about the original's
 * size), and sw_matmul_packed
 * runs every batch size, 1 included, on them: one vpdpbusd per 4 weights x
 * 16 rows x token (on AVX2, one vpmaddubsw per 4 weights x 8 rows), no
 * per-call repacking, and at batch 1 a few instructions per block instead
 * of the dot kernels' unpacking, so decode runs at memory speed.
 */
#include "worker-cpu/kernels.h"
#include "worker-cpu/kernels_impl.h"
#include "llm/clock.h"

#include <cpuid.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- scalar table --------------------------------------------------------- */

#define REF_DOT(T)                                                               \
    static float ref_dot_##T(int64_t n, const void *w, const void *act) {       \
        return sw_vec_dot_ref(SW_TYPE_##T, n, w, act);                           \
    }
REF_DOT(F32) REF_DOT(F16) REF_DOT(BF16) REF_DOT(Q4_0) REF_DOT(Q4_1) REF_DOT(Q5_0)
REF_DOT(Q5_1) REF_DOT(Q8_0) REF_DOT(MXFP4) REF_DOT(Q4_K) REF_DOT(Q5_K) REF_DOT(Q6_K) REF_DOT(Q8_K)

static void ref_quant_q8_k(const float *x, void *dst, int64_t n) { sw_quantize_row(SW_TYPE_Q8_K, x, dst, n); }
static void ref_quant_q8_0(const float *x, void *dst, int64_t n) { sw_quantize_row(SW_TYPE_Q8_0, x, dst, n); }

static void fill_scalar(sw_kernel_table *t)
{
    memset(t, 0, sizeof *t);
    t->dot[SW_TYPE_F32] = ref_dot_F32;
    t->dot[SW_TYPE_F16] = ref_dot_F16;
    t->dot[SW_TYPE_BF16] = ref_dot_BF16;
    t->dot[SW_TYPE_Q4_0] = ref_dot_Q4_0;
    t->dot[SW_TYPE_Q4_1] = ref_dot_Q4_1;
    t->dot[SW_TYPE_Q5_0] = ref_dot_Q5_0;
    t->dot[SW_TYPE_Q5_1] = ref_dot_Q5_1;
    t->dot[SW_TYPE_Q8_0] = ref_dot_Q8_0;
    t->dot[SW_TYPE_MXFP4] = ref_dot_MXFP4;
    t->dot[SW_TYPE_Q4_K] = ref_dot_Q4_K;
    t->dot[SW_TYPE_Q5_K] = ref_dot_Q5_K;
    t->dot[SW_TYPE_Q6_K] = ref_dot_Q6_K;
    t->dot[SW_TYPE_Q8_K] = ref_dot_Q8_K;
    t->quant_q8_k = ref_quant_q8_k;
    t->quant_q8_0 = ref_quant_q8_0;
}

/* ---- ISA selection -------------------------------------------------------- */

static sw_kernel_table tables[3];
static sw_isa isa_best = SW_ISA_SCALAR;
static sw_isa isa_cur = SW_ISA_SCALAR;
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

static bool cpu_has_avx512(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

/* Every feature a kernel table is chosen by or installs a kernel for, as
 * sw_cpu_features reports them. */
static char cpu_features[128];

static void add_feature(const char *name, int has)
{
    size_t len = strlen(cpu_features);
    if (has) snprintf(cpu_features + len, sizeof cpu_features - len, "%s%s", len ? " " : "", name);
}

static void cpu_features_init(void)
{
/* (__builtin_cpu_supports takes only a string literal) */
#define CPU_FEATURE(name) add_feature(name, __builtin_cpu_supports(name))
    CPU_FEATURE("sse4.2"); CPU_FEATURE("avx"); CPU_FEATURE("avx2"); CPU_FEATURE("fma"); CPU_FEATURE("f16c");
    CPU_FEATURE("avxvnni"); CPU_FEATURE("avx512f"); CPU_FEATURE("avx512bw"); CPU_FEATURE("avx512vl");
    CPU_FEATURE("avx512dq"); CPU_FEATURE("avx512vnni");
#undef CPU_FEATURE
}

static int i8_min_set = -1;   /* sw_set_i8_min_tokens: -1 the kernels' own thresholds */

/* SPILLWAY_I8_MIN_TOKENS=N overrides the int8 form's threshold (0: off). */
static void i8_env(void)
{
    const char *env = getenv("SPILLWAY_I8_MIN_TOKENS");
    if (!env || !*env) return;
    char *end;
    long n = strtol(env, &end, 10);
    if (*end || n < 0 || n > 1 << 20)
        fprintf(stderr, "kernels: SPILLWAY_I8_MIN_TOKENS=%s not understood (0..%d); using each kernel's own\n", env,
                1 << 20);
    else i8_min_set = (int)n;
}

static bool prefetch_1tok;

/* sw_prefetch_one_token's choice: Intel's, unless SPILLWAY_PREFETCH_1TOK says. */
static void prefetch_init(void)
{
    prefetch_1tok = __builtin_cpu_is("intel");
    const char *env = getenv("SPILLWAY_PREFETCH_1TOK");
    if (!env || !*env) return;
    if (!strcmp(env, "0") || !strcmp(env, "1")) prefetch_1tok = *env == '1';
    else fprintf(stderr, "kernels: SPILLWAY_PREFETCH_1TOK=%s not understood (0|1); using %d\n", env, prefetch_1tok);
}

static void isa_init(void)
{
    __builtin_cpu_init();
    cpu_features_init();
    prefetch_init();
    fill_scalar(&tables[SW_ISA_SCALAR]);
    tables[SW_ISA_AVX2] = tables[SW_ISA_SCALAR];
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        sw_kernels_fill_avx2(&tables[SW_ISA_AVX2]);
        isa_best = SW_ISA_AVX2;
        tables[SW_ISA_AVX512] = tables[SW_ISA_AVX2];
        if (cpu_has_avx512()) {
            sw_kernels_fill_avx512(&tables[SW_ISA_AVX512], __builtin_cpu_supports("avx512vnni"));
            add_feature("amx-int8", sw_kernels_fill_amx(&tables[SW_ISA_AVX512]));
            isa_best = SW_ISA_AVX512;
        }
    }
    isa_cur = isa_best;
    const char *env = getenv("SPILLWAY_ISA");
    if (env && *env) {
        sw_isa want = isa_best;
        if (!strcmp(env, "scalar")) want = SW_ISA_SCALAR;
        else if (!strcmp(env, "avx2")) want = SW_ISA_AVX2;
        else if (!strcmp(env, "avx512")) want = SW_ISA_AVX512;
        else fprintf(stderr, "kernels: SPILLWAY_ISA=%s not understood (scalar|avx2|avx512); using %s\n",
                     env, sw_isa_name(isa_best));
        if (want > isa_best)
            fprintf(stderr, "kernels: SPILLWAY_ISA=%s not supported by this CPU; using %s\n",
                    env, sw_isa_name(isa_best));
        isa_cur = want > isa_best ? isa_best : want;
    }
    i8_env();
}

static inline const sw_kernel_table *ktab(void)
{
    pthread_once(&isa_once, isa_init);
    return &tables[isa_cur];
}

sw_isa sw_isa_active(void)
{
    pthread_once(&isa_once, isa_init);
    return isa_cur;
}

sw_isa sw_isa_set(sw_isa isa)
{
    pthread_once(&isa_once, isa_init);
    if ((int)isa < 0) isa = SW_ISA_SCALAR;
    isa_cur = isa > isa_best ? isa_best : isa;
    return isa_cur;
}

bool sw_prefetch_one_token(void)
{
    pthread_once(&isa_once, isa_init);
    return prefetch_1tok;
}

bool sw_set_prefetch_one_token(bool on)
{
    pthread_once(&isa_once, isa_init);
    bool was = prefetch_1tok;
    prefetch_1tok = on;
    return was;
}

sw_isa sw_isa_best(void)
{
    pthread_once(&isa_once, isa_init);
    return isa_best;
}

const char *sw_cpu_features(void)
{
    pthread_once(&isa_once, isa_init);
    return cpu_features;
}

/* cpuid leaves 0x80000002-4: 48 bytes of brand string, often space-padded. */
static char cpu_model[49];

static void cpu_model_init(void)
{
    unsigned r[12] = {0}, max = __get_cpuid_max(0x80000000, NULL);
    for (unsigned i = 0; max >= 0x80000004 && i < 3; i++)
        __get_cpuid(0x80000002 + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
    const char *b = (const char *)r;
    size_t n = 0;
    for (size_t i = 0; i < 48 && b[i]; i++) {
        char c = b[i] >= 0x20 && b[i] < 0x7f && b[i] != '"' && b[i] != '\\' ? b[i] : ' ';
        if (c != ' ' || (n && cpu_model[n - 1] != ' ')) cpu_model[n++] = c;
    }
    while (n && cpu_model[n - 1] == ' ') n--;
    cpu_model[n] = 0;
    if (!n) strcpy(cpu_model, "unknown");
}

const char *sw_cpu_model(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, cpu_model_init);
    return cpu_model;
}

const char *sw_isa_name(sw_isa isa)
{
    switch (isa) {
    case SW_ISA_SCALAR: return "scalar";
    case SW_ISA_AVX2: return "avx2";
    case SW_ISA_AVX512: return "avx512";
    }
    return "?";
}

/* ---- the int8 multiply-add peak --------------------------------------------- */

const char *sw_int8_peak_mix(void)
{
    const sw_kernel_table *kt = ktab();
    return kt->int8_peak ? kt->int8_peak_mix : NULL;
}

const char *sw_int8_form_peak_mix(void)
{
    const sw_kernel_table *kt = ktab();
    return kt->i8x16 ? kt->i8x16_peak_mix : NULL;
}

static volatile int64_t int8_peak_sink;   /* keeps the chains' results, so their work */

static double peak_gmac_s(int64_t (*loop)(int64_t iters), int64_t macs_per_iter, double seconds)
{
    if (!loop) return 0.0;
    const int64_t iters = (50 << 20) / macs_per_iter;   /* ~50M MACs: well under a millisecond a call */
    double total = 0.0;
    int64_t sum = 0;
    /* Each thread's best window of 16 calls (a few ms): on a shared host a
     * thread is sometimes descheduled for part of a run, and the average
     * over the whole run then read as low as half the peak. */
    #pragma omp parallel reduction(+:total, sum)
    {
        double best = 0.0, start = sw_clock_s();
        do {
            double t0 = sw_clock_s();
            for (int k = 0; k < 16; k++) sum += loop(iters);
            double rate = 16.0 * (double)iters * (double)macs_per_iter / (sw_clock_s() - t0);
            best = rate > best ? rate : best;
        } while (sw_clock_s() - start < seconds);
        total += best;
    }
    int8_peak_sink = sum;
    return total / 1e9;
}

double sw_int8_peak_gmac_s(double seconds) { return peak_gmac_s(ktab()->int8_peak, SW_INT8_PEAK_MACS, seconds); }

double sw_int8_form_peak_gmac_s(double seconds)
{
    const sw_kernel_table *kt = ktab();
    return kt->i8x16 ? peak_gmac_s(kt->i8x16_peak, kt->i8x16_peak_macs, seconds) : 0.0;
}

/* ---- activations ---------------------------------------------------------- */

static sw_type act_type(sw_type wtype)
{
    const sw_type_traits *t = sw_type_info(wtype);
    return t ? t->vec_dot_type : SW_TYPE_COUNT;
}

size_t sw_act_row_size(sw_type wtype, int64_t n)
{
    sw_type at = act_type(wtype);
    if (at == SW_TYPE_COUNT || n < 0) return 0;
    return sw_row_size(at, (uint64_t)n);
}

void sw_quantize_act(sw_type wtype, const float *x, void *dst, int64_t n)
{
    const sw_kernel_table *kt = ktab();
    switch (act_type(wtype)) {
    case SW_TYPE_F32: memcpy(dst, x, (size_t)n * sizeof(float)); break;
    case SW_TYPE_Q8_K: if (n % QK_K == 0) kt->quant_q8_k(x, dst, n); break;
    case SW_TYPE_Q8_0: if (n % QK8_0 == 0) kt->quant_q8_0(x, dst, n); break;
    default: break;
    }
}

float sw_vec_dot(sw_type wtype, int64_t n, const void *w, const void *act)
{
    const sw_type_traits *t = sw_type_info(wtype);
    if (!t || n < 0 || n % t->block_size || !ktab()->dot[wtype]) return NAN;
    return ktab()->dot[wtype](n, w, act);
}

/* ---- matmul ----------------------------------------------------------------
 * Activations are quantized once per call into a per-thread scratch buffer
 * that only grows (prefill would otherwise malloc megabytes per matrix). */

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
typedef struct { void *p[2]; size_t cap[2]; } scratch;
enum { SCRATCH_ACT = 0, SCRATCH_PACK = 1 };

static void scratch_free(void *v) { scratch *s = v; free(s->p[0]); free(s->p[1]); free(s); }
static void scratch_init(void) { pthread_key_create(&scratch_key, scratch_free); }

/* Per-thread buffer `slot` of at least n bytes, 64-byte aligned. */
static void *scratch_get(int slot, size_t n)
{
    pthread_once(&scratch_once, scratch_init);
    scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s) return NULL;
        pthread_setspecific(scratch_key, s);
    }
    if (s->cap[slot] < n) {
        free(s->p[slot]);
        s->cap[slot] = 0;
        s->p[slot] = aligned_alloc(64, (n + 63) & ~(size_t)63);
        if (!s->p[slot]) return NULL;
        s->cap[slot] = n;
    }
    return s->p[slot];
}

int sw_kpack16_rows(sw_type type, const uint8_t *w, size_t row_size, int64_t nb, sw_kpack16 *pk)
{
    const sw_type_traits *t = sw_type_info(type);
    int nsub = 0;
    uint8_t q[QK_K];
    float scale[16], offs[16];
    for (int64_t i = 0; i < nb; i++)
        for (int r = 0; r < 16; r++) {
            nsub = sw_kblock_unpack(type, w + (size_t)r * row_size + (size_t)i * t->type_size, q, scale, offs);
            int steps = QK_K / nsub / 4;
            uint8_t *dst = pk[i].q + 4 * r;
            for (int j = 0; j < nsub; j++)
                for (int st = 0; st < steps; st++)
                    memcpy(dst + (size_t)(j * steps + st) * 64, q + j * (QK_K / nsub) + 4 * st, 4);
            for (int k = 0; k < 16; k++) {
                pk[i].scale[k][r] = scale[k];
                pk[i].offs[k][r] = offs[k];
            }
        }
    return nsub;
}

/* From this many tokens on, K-quant rows are repacked 16 at a time (cost
 * about one pass of dotn) and multiplied with the packed kernel. */
#define GEMM_MIN_TOK 32

/* Row tile: enough weight rows to stay in L2 while every token tile passes
 * over them; token tile: activation rows reused across that row tile. */
#define ROW_TILE_BYTES (96 * 1024)
#define TOK_TILE 64

static void matmul_rows(const sw_kernel_table *kt, sw_type type, const uint8_t *w, size_t row_size,
                        int64_t r0, int64_t r1, int64_t rows, int64_t cols,
                        const uint8_t *act, size_t act_rs, const float *aux, size_t aux_rs,
                        int n_tok, float *y)
{
    sw_dot_fn dot = kt->dot[type];
    sw_dotn_fn dotn = kt->dotn[type];
    if (n_tok == 1) {
        if (dotn) {
            for (int64_t r = r0; r < r1; r++) dotn(cols, w + (size_t)r * row_size, act, act_rs, aux, aux_rs, 1, y + r, 0);
        } else {
            for (int64_t r = r0; r < r1; r++) y[r] = dot(cols, w + (size_t)r * row_size, act);
        }
        return;
    }
    if (kt->gemm16 && aux && n_tok >= GEMM_MIN_TOK &&
        (type == SW_TYPE_Q4_K || type == SW_TYPE_Q5_K || type == SW_TYPE_Q6_K)) {
        int64_t nb = cols / QK_K;
        sw_kpack16 *pk = scratch_get(SCRATCH_PACK, (size_t)nb * sizeof(sw_kpack16));
        for (; pk && r0 + 16 <= r1; r0 += 16) {
            int nsub = (kt->pack16 ? kt->pack16 : sw_kpack16_rows)(type, w + (size_t)r0 * row_size, row_size, nb, pk);
            for (int t = 0; t < n_tok; t += SW_DOTN_MAX) {
                int cnt = n_tok - t < SW_DOTN_MAX ? n_tok - t : SW_DOTN_MAX;
                kt->gemm16(pk, nb, nsub, act + (size_t)t * act_rs, act_rs, aux + (size_t)t * aux_rs, aux_rs, cnt,
                           y + (size_t)t * rows + r0, (size_t)rows);
            }
        }
        if (r0 >= r1) return;
        /* fewer than 16 rows left: the row-at-a-time path below */
    }
    int64_t rtile = (int64_t)(ROW_TILE_BYTES / row_size);
    if (rtile < 1) rtile = 1;
    for (int64_t rt = r0; rt < r1; rt += rtile) {
        int64_t rend = rt + rtile < r1 ? rt + rtile : r1;
        for (int tt = 0; tt < n_tok; tt += TOK_TILE) {
            int tend = tt + TOK_TILE < n_tok ? tt + TOK_TILE : n_tok;
            for (int64_t r = rt; r < rend; r++) {
                const uint8_t *wr = w + (size_t)r * row_size;
                for (int t = tt; t < tend; t += SW_DOTN_MAX) {
                    int cnt = tend - t < SW_DOTN_MAX ? tend - t : SW_DOTN_MAX;
                    const uint8_t *a = act + (size_t)t * act_rs;
                    float *out = y + (size_t)t * rows + r;
                    if (dotn) {
                        dotn(cols, wr, a, act_rs, aux ? aux + (size_t)t * aux_rs : NULL, aux_rs, cnt, out, (size_t)rows);
                    } else {
                        for (int k = 0; k < cnt; k++) out[(size_t)k * rows] = dot(cols, wr, a + k * act_rs);
                    }
                }
            }
        }
    }
}

static void fill_nan(float *y, size_t n) { for (size_t i = 0; i < n; i++) y[i] = NAN; }

void sw_matmul(sw_type type, const void *w, int64_t rows, int64_t cols,
               const float *x, int n_tok, float *y)
{
    const sw_kernel_table *kt = ktab();
    const sw_type_traits *t = sw_type_info(type);
    if (rows <= 0 || n_tok <= 0) return;
    if (!t || type == SW_TYPE_Q8_K || cols <= 0 || cols % t->block_size || !kt->dot[type]) {
        fprintf(stderr, "sw_matmul: unsupported weight type %d or width %lld\n", (int)type, (long long)cols);
        fill_nan(y, (size_t)rows * (size_t)n_tok);
        return;
    }
    size_t row_size = sw_row_size(type, (uint64_t)cols);
    size_t act_rs = sw_act_row_size(type, cols);
    const uint8_t *act = (const uint8_t *)x;
    const float *aux = NULL;
    size_t aux_rs = 0;
    if (act_type(type) != SW_TYPE_F32) {
        /* Q8_K rows also get the per-block d*bsums (aux) the K-quant kernels use */
        bool want_aux = act_type(type) == SW_TYPE_Q8_K && kt->dotn[type];
        size_t act_bytes = (act_rs * (size_t)n_tok + 63) & ~(size_t)63;
        aux_rs = want_aux ? (size_t)(cols / QK_K) * 16 : 0;
        uint8_t *buf = scratch_get(SCRATCH_ACT, act_bytes + aux_rs * sizeof(float) * (size_t)n_tok);
        if (!buf) {
            fprintf(stderr, "sw_matmul: out of memory for %d activation rows\n", n_tok);
            fill_nan(y, (size_t)rows * (size_t)n_tok);
            return;
        }
        float *auxw = want_aux ? (float *)(buf + act_bytes) : NULL;
        #pragma omp parallel for if (n_tok >= 4) schedule(static)
        for (int i = 0; i < n_tok; i++) {
            uint8_t *a = buf + (size_t)i * act_rs;
            sw_quantize_act(type, x + (size_t)i * cols, a, cols);
            if (auxw) sw_q8k_aux((const block_q8_k *)a, cols, auxw + (size_t)i * aux_rs);
        }
        act = buf;
        aux = auxw;
    }
    /* Output rows are split in units of 16 (64 bytes of y per token), so no
     * two threads write the same cache line of a 64-byte-aligned y. */
    double work = (double)rows * (double)cols * n_tok;
    #pragma omp parallel if (work > 65536)
    {
        int nth = omp_get_num_threads(), ith = omp_get_thread_num();
        int64_t units = (rows + 15) / 16;
        int64_t r0 = units * ith / nth * 16, r1 = units * (ith + 1) / nth * 16;
        if (r1 > rows) r1 = rows;
        if (r0 < r1) matmul_rows(kt, type, w, row_size, r0, r1, rows, cols, act, act_rs, aux, aux_rs, n_tok, y);
    }
}

static bool tensor_dims(const gguf_tensor *w, int64_t *rows, int64_t *cols)
{
    if (!w) return false;
    uint64_t r = w->ne[1];
    for (int i = 2; i < GGUF_MAX_DIMS; i++) r *= w->ne[i] ? w->ne[i] : 1;
    size_t rs = sw_row_size(w->type, w->ne[0]);
    if (!rs || !w->data || r == 0 || w->nbytes / rs < r) return false;
    *rows = (int64_t)r;
    *cols = (int64_t)w->ne[0];
    return true;
}

void sw_matmul_tensor(const gguf_tensor *w, const float *x, int n_tok, float *y)
{
    int64_t rows, cols;
    if (!tensor_dims(w, &rows, &cols)) {
        fprintf(stderr, "sw_matmul_tensor: bad tensor '%s'\n", w ? w->name : "(null)");
        return;
    }
    sw_matmul(w->type, w->data, rows, cols, x, n_tok, y);
}

void sw_get_row(const gguf_tensor *w, int64_t r, float *out)
{
    int64_t rows, cols;
    if (!tensor_dims(w, &rows, &cols) || r < 0 || r >= rows) {
        fprintf(stderr, "sw_get_row: row %lld out of range for tensor '%s'\n", (long long)r,
                w ? w->name : "(null)");
        if (w && w->ne[0] < ((uint64_t)1 << 40)) fill_nan(out, (size_t)w->ne[0]);
        return;
    }
    size_t rs = sw_row_size(w->type, (uint64_t)cols);
    if (!sw_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)r * rs, out, cols))
        fill_nan(out, (size_t)cols);
}

/* ---- prepacked weights -------------------------------------------------------
 * Q4_K, Q5_K, Q6_K and the 32-weight types, when the ISA has kernels for
 * their packed forms (AVX-512 VNNI; all but Q6_K on AVX2). The pack keeps
 * the source tensor for leftover rows and other ISAs. */

struct sw_packed {
    const gguf_tensor *src;
    sw_type type;
    int64_t rows, cols, groups;   /* groups of 16 rows; rows past 16*groups use src */
    size_t group_bytes;           /* one group: its blocks (K-quants), or quant then scale blocks (q32) */
    uint8_t *blocks;              /* [group] */
};

/* Low nibbles of row r's 256 quants q into the shared 16-row interleave. */
static void pack_nibbles(const uint8_t q[QK_K], int r, uint8_t dst[8][4][64])
{
    for (int j = 0; j < 8; j++)
        for (int c = 0; c < 4; c++)
            for (int k = 0; k < 4; k++)
                dst[j][c][4 * r + k] = (uint8_t)((q[32 * j + 8 * c + k] & 0x0f) | (q[32 * j + 8 * c + 4 + k] & 0x0f) << 4);
}

/* Row r of a Q4_K-form block (Q4_K's fields, or Q5_K's low bits) into dst. */
static void pack_q4k16_row(sw_f16 d, sw_f16 dmin, const uint8_t *scales, const uint8_t *qs, int r, sw_q4k16 *dst)
{
    /* bytes 32m..32m+31 hold weights 64m+l (low nibble) and 64m+32+l
     * (high): sub-block j is the nibbles j%2 of bytes 32(j/2).. Read
     * straight from them: going through sw_kblock_unpack and
     * pack_nibbles made every model load measurably slower. */
    for (int j = 0; j < 8; j++) {
        const uint8_t *src = qs + 32 * (j / 2);
        const int sh = 4 * (j % 2);
        for (int c = 0; c < 4; c++)
            for (int k = 0; k < 4; k++)
                dst->qs[j][c][4 * r + k] = (uint8_t)(((src[8 * c + k] >> sh) & 0x0f) |
                                                     ((src[8 * c + 4 + k] >> sh) & 0x0f) << 4);
    }
    for (int j = 0; j < 8; j++) {
        int sc, m;
        sw_k_scale_min(scales, j, &sc, &m);
        dst->sc[j][r] = (uint8_t)sc;
        dst->mn[j / 2][r][j % 2] = (uint8_t)m;
    }
    dst->d[r] = d;
    dst->dmin[r] = dmin;
}

/* Packs block i of the 16 rows starting at w (row_size bytes apart). */
static void pack_q4k16_block(const uint8_t *w, size_t row_size, int64_t i, sw_q4k16 *dst)
{
    for (int r = 0; r < 16; r++) {
        const block_q4_k *b = (const block_q4_k *)(w + (size_t)r * row_size) + i;
        pack_q4k16_row(b->d, b->dmin, b->scales, b->qs, r, dst);
    }
}

/* Q5_K: its low nibbles, scales and mins as Q4_K's, then the fifth bits
 * (sw_q5k16.qh). */
static void pack_q5k16_block(const uint8_t *w, size_t row_size, int64_t i, sw_q5k16 *dst)
{
    for (int r = 0; r < 16; r++) {
        const block_q5_k *b = (const block_q5_k *)(w + (size_t)r * row_size) + i;
        pack_q4k16_row(b->d, b->dmin, b->scales, b->qs, r, &dst->q4);
        /* weight 32j + l has its fifth bit at bit j of qh[l] */
        for (int j = 0; j < 8; j++)
            for (int k = 0; k < 4; k++) {
                uint8_t v = 0;
                for (int c = 0; c < 4; c++)
                    v |= (uint8_t)(((b->qh[8 * c + k] >> j) & 1) << (2 * c) | ((b->qh[8 * c + 4 + k] >> j) & 1) << (2 * c + 1));
                dst->qh[j][4 * r + k] = v;
            }
    }
}

static void pack_q6k16_block(const uint8_t *w, size_t row_size, int64_t i, sw_q6k16 *dst)
{
    memset(dst->pad, 0, sizeof dst->pad);
    for (int r = 0; r < 16; r++) {
        const block_q6_k *b = (const block_q6_k *)(w + (size_t)r * row_size) + i;
        uint8_t q[QK_K];
        float scale[16], offs[16];
        sw_kblock_unpack(SW_TYPE_Q6_K, b, q, scale, offs);   /* q: stored 0..63 */
        pack_nibbles(q, r, dst->ql);
        for (int j = 0; j < 8; j++)
            for (int h = 0; h < 2; h++)
                for (int k = 0; k < 4; k++) {
                    uint8_t v = 0;
                    for (int m = 0; m < 4; m++) v |= (uint8_t)((q[32 * j + 16 * h + 4 * m + k] >> 4) << (2 * m));
                    dst->qh[j][h][4 * r + k] = v;
                }
        for (int j = 0; j < 8; j++) {
            dst->sc[j][r][0] = b->scales[2 * j];
            dst->sc[j][r][1] = b->scales[2 * j + 1];
        }
        dst->d[r] = b->d;
    }
}

bool sw_i8x16_ref_block(sw_type type, const uint8_t *w, size_t row_size, int64_t i, sw_i8x16 *dst)
{
    if (type != SW_TYPE_Q4_K && type != SW_TYPE_Q5_K && type != SW_TYPE_Q6_K) return false;
    const float qmax = type == SW_TYPE_Q4_K ? 15.0f : type == SW_TYPE_Q5_K ? 31.0f : 63.0f;
    const size_t bs = sw_type_info(type)->type_size;
    for (int r = 0; r < 16; r++) {
        uint8_t q[QK_K];
        float scale[16], offs[16], a[16], b[16];
        const int nsub = sw_kblock_unpack(type, w + (size_t)r * row_size + (size_t)i * bs, q, scale, offs);
        float amax = 0;
        for (int s = 0; s < nsub; s++) {
            a[s] = scale[s];
            b[s] = nsub == 8 ? offs[2 * s] : offs[s];   /* Q4_K / Q5_K repeat each sub-block's offset */
            amax = fmaxf(amax, fmaxf(fabsf(b[s]), fabsf(fmaf(qmax, a[s], -b[s]))));
        }
        const float id = amax > 0 ? 127.0f / amax : 0.0f;
        dst->d[r] = amax / 127.0f;
        int32_t a7[16], b7[16];   /* the factors in 1/128ths */
        for (int s = 0; s < nsub; s++) {
            a7[s] = (int32_t)lrintf(a[s] * id * 128.0f);
            b7[s] = (int32_t)lrintf(b[s] * id * 128.0f);
        }
        for (int k = 0; k < QK_K; k++) {
            const int s = k / (QK_K / nsub);
            int32_t v = (q[k] * a7[s] - b7[s] + 64) >> 7;   /* floor: an arithmetic shift */
            v = v < -127 ? -127 : v > 127 ? 127 : v;
            dst->q[k / 4][4 * r + k % 4] = (uint8_t)(v + 128);
        }
    }
    return true;
}

/* Block i of 16 rows of a 32-weight type into the sw_q32x16 form
 * (kernels_impl.h): quants at q, d (and m) at sc. */
static void pack_q32x16_block(sw_type type, const uint8_t *w, size_t row_size, int64_t i, uint8_t *q, uint16_t *sc)
{
    const size_t bs = sw_type_info(type)->type_size;
    for (int r = 0; r < 16; r++) {
        const uint8_t *b = w + (size_t)r * row_size + (size_t)i * bs;
        if (type == SW_TYPE_Q8_0) {
            const block_q8_0 *x = (const block_q8_0 *)b;
            for (int k = 0; k < 8; k++)
                for (int e = 0; e < 4; e++) q[64 * k + 4 * r + e] = (uint8_t)x->qs[4 * k + e] ^ 0x80;
            sc[r] = x->d;
            continue;
        }
        /* the unsigned quants v (0..15, or 0..31 with the fifth bits) */
        const uint8_t *qs, *qh = NULL;
        sw_f16 d, m = 0;
        if (type == SW_TYPE_MXFP4) {   /* the nibbles as Q4_0's; the exponent byte as it is */
            const block_mxfp4 *x = (const block_mxfp4 *)b;
            for (int c = 0; c < 4; c++)   /* Q4_0's nibble layout, so its bytes as they are */
                for (int e = 0; e < 4; e++) q[64 * c + 4 * r + e] = x->qs[4 * c + e];
            ((uint8_t *)sc)[r] = x->e;
            continue;
        }
        switch (type) {
        case SW_TYPE_Q4_0: { const block_q4_0 *x = (const block_q4_0 *)b; qs = x->qs; d = x->d; break; }
        case SW_TYPE_Q4_1: { const block_q4_1 *x = (const block_q4_1 *)b; qs = x->qs; d = x->d; m = x->m; break; }
        case SW_TYPE_Q5_0: { const block_q5_0 *x = (const block_q5_0 *)b; qs = x->qs; qh = x->qh; d = x->d; break; }
        default: { const block_q5_1 *x = (const block_q5_1 *)b; qs = x->qs; qh = x->qh; d = x->d; m = x->m; break; }
        }
        uint32_t h = 0;
        if (qh) memcpy(&h, qh, 4);
        uint8_t v[32];
        for (int j = 0; j < 32; j++) v[j] = (uint8_t)((j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4) | ((h >> j) & 1) << 4);
        for (int c = 0; c < 4; c++)
            for (int e = 0; e < 4; e++) q[64 * c + 4 * r + e] = (uint8_t)((v[4 * c + e] & 0x0f) | (v[16 + 4 * c + e] & 0x0f) << 4);
        if (qh)
            for (int e = 0; e < 4; e++) {
                uint8_t bits = 0;
                for (int g = 0; g < 8; g++) bits |= (uint8_t)((v[4 * g + e] >> 4) << g);
                q[256 + 4 * r + e] = bits;
            }
        sc[r] = d;
        if (type == SW_TYPE_Q4_1 || type == SW_TYPE_Q5_1) sc[16 + r] = m;
    }
}

/* Group g of p from the source rows. */
static void pack_group(sw_packed *p, const uint8_t *src, size_t row_size, int64_t g)
{
    const uint8_t *rows16 = src + (size_t)g * 16 * row_size;
    uint8_t *dst = p->blocks + (size_t)g * p->group_bytes;
    if (sw_is_q32(p->type)) {
        const int64_t nb = p->cols / 32;
        const size_t qb = sw_q32x16_qbytes(p->type), sb = sw_q32x16_sbytes(p->type);
        for (int64_t i = 0; i < nb; i++)
            pack_q32x16_block(p->type, rows16, row_size, i, dst + (size_t)i * qb,
                              (uint16_t *)(dst + (size_t)nb * qb + (size_t)i * sb));
        return;
    }
    for (int64_t i = 0; i < p->cols / QK_K; i++) {
        if (p->type == SW_TYPE_Q4_K) pack_q4k16_block(rows16, row_size, i, (sw_q4k16 *)dst + i);
        else if (p->type == SW_TYPE_Q5_K) pack_q5k16_block(rows16, row_size, i, (sw_q5k16 *)dst + i);
        else pack_q6k16_block(rows16, row_size, i, (sw_q6k16 *)dst + i);
    }
}

/* Bytes of one packed 16-row group of `type` over `cols`, 0 when this
 * ISA has no packed kernel for it. */
static size_t packed_group_bytes(const sw_kernel_table *kt, sw_type type, int64_t cols)
{
    if (sw_is_q32(type)) {
        if (!kt->q32x16[type]) return 0;
        size_t b = (size_t)(cols / 32) * (sw_q32x16_qbytes(type) + sw_q32x16_sbytes(type));
        return (b + 63) & ~(size_t)63;   /* the next group's quants start aligned */
    }
    size_t bb = type == SW_TYPE_Q4_K && kt->q4k16 ? sizeof(sw_q4k16)
              : type == SW_TYPE_Q5_K && kt->q5k16 ? sizeof(sw_q5k16)
              : type == SW_TYPE_Q6_K && kt->q6k16 ? sizeof(sw_q6k16) : 0;
    return bb * (size_t)(cols / QK_K);
}

/* The packs are streamed from memory at every decode step, on 4 KB pages
 * a TLB miss every few blocks (in a VM a two-level walk). A pack of at
 * least one 2 MB page is allocated on a 2 MB boundary and advised
 * MADV_HUGEPAGE before it is first written, so that the kernel can back it
 * with huge pages where transparent huge pages are "madvise" (the Debian
 * default) as well as "always": 1-3% in native decode on the Intel host
 * (docs/perf/cpu.md, "Huge pages for the packs"). The tail past the last
 * full 2 MB stays on small pages, so nothing is rounded up. Without THP
 * the advice fails and is ignored. */
#define PACK_HUGE_BYTES ((size_t)2 << 20)

static void *pack_alloc(size_t n)
{
    const bool huge = n >= PACK_HUGE_BYTES;
    void *p = NULL;
    if (posix_memalign(&p, huge ? PACK_HUGE_BYTES : 64, n)) return NULL;
    if (huge) (void)madvise(p, n & ~(size_t)4095, MADV_HUGEPAGE);
    return p;
}

sw_packed *sw_pack_tensor(const gguf_tensor *w)
{
    int64_t rows, cols;
    const sw_kernel_table *kt = ktab();
    if (!w || !tensor_dims(w, &rows, &cols) || rows < 16) return NULL;
    size_t gb = packed_group_bytes(kt, w->type, cols);
    if (!gb) return NULL;
    sw_packed *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->src = w;
    p->type = w->type;
    p->rows = rows;
    p->cols = cols;
    p->groups = rows / 16;
    p->group_bytes = gb;
    p->blocks = pack_alloc((size_t)p->groups * gb);
    if (!p->blocks) { free(p); return NULL; }
    size_t row_size = sw_row_size(w->type, (uint64_t)cols);
    #pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < p->groups; g++) pack_group(p, w->data, row_size, g);
    return p;
}

void sw_packed_free(sw_packed *p)
{
    if (!p) return;
    free(p->blocks);
    free(p);
}

const uint8_t *sw_packed_group(const sw_packed *p, int64_t g)
{
    return p->blocks + (size_t)g * p->group_bytes;
}

size_t sw_packed_bytes(const sw_packed *p)
{
    return p ? (size_t)p->groups * p->group_bytes : 0;
}

/* Per token and block: Q4_K and Q5_K 4 dwords, the int16 pairs of 32-sums
 * (bsums[4q] + bsums[4q+1], bsums[4q+2] + bsums[4q+3]); Q6_K 16 dwords
 * -32 * bsums[k]. See sw_q4k16_fn / sw_q6k16_fn. */
static void packed_bsums(sw_type type, const block_q8_k *a, int64_t nb, int32_t *out)
{
    for (int64_t i = 0; i < nb; i++) {
        const int16_t *s = a[i].bsums;
        if (type != SW_TYPE_Q6_K) {
            for (int q = 0; q < 4; q++) {
                uint16_t lo = (uint16_t)(s[4 * q] + s[4 * q + 1]), hi = (uint16_t)(s[4 * q + 2] + s[4 * q + 3]);
                out[4 * i + q] = (int32_t)((uint32_t)lo | (uint32_t)hi << 16);
            }
        } else {
            for (int k = 0; k < 16; k++) out[16 * i + k] = -32 * (int32_t)s[k];
        }
    }
}

/* Per token and 32-weight block of Q8_0 activations: see sw_q32_aux. */
static void q32_aux(const block_q8_0 *a, int64_t nb, sw_q32_aux *out)
{
    for (int64_t i = 0; i < nb; i++) {
        int32_t sum = 0;
        for (int k = 0; k < QK8_0; k++) sum += a[i].qs[k];
        float d = sw_f16_to_f32(a[i].d);
        out[i] = (sw_q32_aux){ d, -sum, d * (float)sum };
    }
}

/* Per token and block of Q8_K activations: -128 times the sum of the
 * block's quants (the int8 form's sw_i8x16_fn nsum). */
static void i8_nsums(const block_q8_k *a, int64_t nb, int32_t *out)
{
    for (int64_t i = 0; i < nb; i++) {
        int32_t sum = 0;
        for (int k = 0; k < QK_K / 16; k++) sum += a[i].bsums[k];
        out[i] = -128 * sum;
    }
}

/* A Q8_K row's quants, block by block, into out (64-byte aligned): the
 * tile kernels' qa (sw_i8x16_tiles_fn). */
static void aligned_quants(const block_q8_k *a, int64_t nb, uint8_t *out)
{
    for (int64_t i = 0; i < nb; i++) memcpy(out + (size_t)i * QK_K, a[i].qs, QK_K);
}

int sw_set_i8_min_tokens(int n)
{
    pthread_once(&isa_once, isa_init);
    int old = i8_min_set;
    i8_min_set = n < 0 ? -1 : n;
    return old;
}

/* The threshold in effect on table kt: 0 where it has no form. */
static int i8_min(const sw_kernel_table *kt)
{
    return !kt->i8x16 ? 0 : i8_min_set >= 0 ? i8_min_set : kt->i8x16_min_tokens;
}

int sw_i8_min_tokens(void)
{
    return i8_min(ktab());
}

/* Whether job j runs on the int8 form (its pack usable, checked before).
 * Rows wider than 4096 need twice the tokens: at 8192 columns and 64
 * tokens the form lost to the packed kernels, from about 96 it gained
 * (docs/perf/cpu.md, "The int8 form"). */
static bool job_i8(const sw_kernel_table *kt, const sw_packed_job *j)
{
    const int min = j->p->cols > 4096 ? 2 * i8_min(kt) : i8_min(kt);
    return min > 0 && j->n_tok >= min && kt->i8x16_expand[j->p->type];
}

/* Leftover rows (past the 16-row groups) from the original tensor. Runs
 * before the packed part takes the scratch (sw_matmul uses the same buffer). */
static bool packed_tail(const sw_packed *p, const float *x, int n_tok, float *y)
{
    const int64_t rows = p->rows, r_tail = p->groups * 16, nt = rows - r_tail;
    if (nt <= 0) return true;
    size_t rs = sw_row_size(p->type, (uint64_t)p->cols);
    float *yt = malloc(sizeof(float) * (size_t)nt * (size_t)n_tok);
    if (!yt) return false;
    sw_matmul(p->type, (const uint8_t *)p->src->data + (size_t)r_tail * rs, nt, p->cols, x, n_tok, yt);
    for (int t = 0; t < n_tok; t++) memcpy(y + (size_t)t * rows + r_tail, yt + (size_t)t * nt, sizeof(float) * (size_t)nt);
    free(yt);
    return true;
}

/* Weights of one tile of row groups, revisited by every token slice: half
 * the 1 MB per-core L2 of the Zen 4 host, leaving room for the slices'
 * activations and the prefetch stream. (128 KB to 768 KB measured the same
 * on a 512-token product: the tile only has to stay clear of L3.) */
#ifndef SW_L2_TILE_BYTES
#define SW_L2_TILE_BYTES (512u << 10)
#endif

static bool packed_usable(const sw_kernel_table *kt, const sw_packed *p)
{
    return packed_group_bytes(kt, p->type, p->cols) == p->group_bytes;
}

/* One activation matrix that some of the jobs multiply, quantized once in
 * each form its products want: Q8_K rows with the Q4_K / Q6_K bsum forms
 * (K-quants), Q8_0 rows with their sw_q32_aux (32-weight types). The
 * fields are byte offsets in the scratch. */
typedef struct {
    const float *x;
    int n_tok;
    int64_t cols;
    bool k8, bs4, bs6, ns, qa, q32;   /* forms wanted: Q8_K rows, their bsum forms (Q4_K, Q6_K, int8 form),
                                       * their quants aligned (i8x16_tiles), Q8_0 rows */
    size_t off, off_bs4, off_bs6, off_ns, off_qa, off_q32, off_aux;
    size_t rs_k8, rs_qa, rs_q32;     /* bytes of one Q8_K / aligned-quants / Q8_0 row */
} act_set;

/* One 16-row group g of p times tokens t..t+cnt-1 (cnt <= SW_DOTN_MAX) of
 * the activation set `as`, whose forms are in buf. */
static void packed_group(const sw_kernel_table *kt, const sw_packed *p, int64_t g, const act_set *as,
                         const uint8_t *buf, int t, int cnt, float *y)
{
    const uint8_t *grp = p->blocks + (size_t)g * p->group_bytes;
    float *out = y + (size_t)t * p->rows + g * 16;
    if (sw_is_q32(p->type)) {
        const int64_t nb = p->cols / 32;
        const size_t ars = as->rs_q32;
        kt->q32x16[p->type](grp, (const uint16_t *)(grp + (size_t)nb * sw_q32x16_qbytes(p->type)), nb,
                            buf + as->off_q32 + (size_t)t * ars, ars,
                            (const sw_q32_aux *)(buf + as->off_aux) + (size_t)t * (size_t)nb, (size_t)nb, cnt, out,
                            (size_t)p->rows);
        return;
    }
    const int64_t nb = p->cols / QK_K;
    const size_t ars = as->rs_k8;
    const uint8_t *a = buf + as->off + (size_t)t * ars;
    if (p->type == SW_TYPE_Q6_K) {
        const int32_t *b = (const int32_t *)(buf + as->off_bs6) + (size_t)t * (size_t)nb * 16;
        kt->q6k16((const sw_q6k16 *)grp, nb, a, ars, b, (size_t)nb * 16, cnt, out, (size_t)p->rows);
        return;
    }
    const int32_t *b = (const int32_t *)(buf + as->off_bs4) + (size_t)t * (size_t)nb * 4;
    if (p->type == SW_TYPE_Q4_K)
        (prefetch_1tok && kt->q4k16_pf1 ? kt->q4k16_pf1 : kt->q4k16)((const sw_q4k16 *)grp, nb, a, ars, b, (size_t)nb * 4, cnt, out,
                                                    (size_t)p->rows);
    else kt->q5k16((const sw_q5k16 *)grp, nb, a, ars, b, (size_t)nb * 4, cnt, out, (size_t)p->rows);
}

/* Groups g0..g1-1 of job jb on the int8 form: tiles of groups expanded
 * into this thread's buffer (sized to half the L2, like the packed tiles),
 * then every token slice over the tile. False (nothing done) when the
 * buffer cannot be had: the caller then runs the packed kernels. */
static bool i8_part(const sw_kernel_table *kt, const sw_packed_job *jb, const act_set *as, const uint8_t *buf,
                    int64_t g0, int64_t g1)
{
    const sw_packed *p = jb->p;
    const int64_t nb = p->cols / QK_K;
    const size_t gw = (size_t)nb * sizeof(sw_i8x16);
    const int64_t tile = (int64_t)(SW_L2_TILE_BYTES / gw) > 1 ? (int64_t)(SW_L2_TILE_BYTES / gw) : 1;
    const int64_t most = g1 - g0 < tile ? g1 - g0 : tile;
    sw_i8x16 *w8 = scratch_get(SCRATCH_PACK, (size_t)most * gw);
    if (!w8) return false;
    const size_t ars = as->rs_k8;
    for (int64_t s0 = g0; s0 < g1; s0 += tile) {
        const int64_t s1 = s0 + tile < g1 ? s0 + tile : g1;
        for (int64_t g = s0; g < s1; g++)
            kt->i8x16_expand[p->type](p->blocks + (size_t)g * p->group_bytes, nb, w8 + (size_t)(g - s0) * (size_t)nb);
        for (int t = 0, cnt; t < jb->n_tok; t += cnt) {
            /* 16 tokens a slice where a kernel takes them at once (AMX), else as many as i8x16 takes */
            const bool wide = as->qa && jb->n_tok - t >= 16;
            cnt = wide ? 16 : jb->n_tok - t < kt->i8x16_ntok ? jb->n_tok - t : kt->i8x16_ntok;
            const uint8_t *a = buf + as->off + (size_t)t * ars;
            const int8_t *qa = (const int8_t *)(buf + as->off_qa + (size_t)t * as->rs_qa);
            const int32_t *ns = (const int32_t *)(buf + as->off_ns) + (size_t)t * (size_t)nb;
            for (int64_t g = s0; g < s1; g++) {
                const sw_i8x16 *w = w8 + (size_t)(g - s0) * (size_t)nb;
                float *y = jb->y + (size_t)t * p->rows + g * 16;
                if (wide) kt->i8x16_tiles(w, nb, a, ars, qa, as->rs_qa, ns, (size_t)nb, y, (size_t)p->rows);
                else kt->i8x16(w, nb, a, ars, ns, (size_t)nb, cnt, y, (size_t)p->rows);
            }
        }
    }
    return true;
}

static int64_t job_groups(const sw_packed_job *j) { return j->n_tok > 0 ? j->p->groups : 0; }

/* Finds or adds the activation set of job j (same x, tokens and width). */
static int act_set_of(act_set *sets, int *n_sets, const sw_packed_job *j)
{
    for (int s = 0; s < *n_sets; s++)
        if (sets[s].x == j->x && sets[s].n_tok == j->n_tok && sets[s].cols == j->p->cols) return s;
    sets[*n_sets] = (act_set){ .x = j->x, .n_tok = j->n_tok, .cols = j->p->cols };
    return (*n_sets)++;
}

/* What the products of one call share once their activation sets are known. */
typedef struct {
    int n_sets, max_tok, total_tok;
    int64_t groups;      /* 16-row groups across all products */
    double work;         /* rows x cols x tokens: decides threading */
    size_t group_bytes;  /* the largest product's group */
} packed_plan;

/* Whether every live job's packing suits the selected ISA; *live counts them. */
static bool jobs_usable(const sw_kernel_table *kt, const sw_packed_job *jobs, int n, int *live)
{
    bool usable = true;
    *live = 0;
    for (int j = 0; j < n; j++)
        if (jobs[j].p && jobs[j].n_tok > 0) {
            (*live)++;
            usable &= packed_usable(kt, jobs[j].p);
        }
    return usable;
}

/* Another ISA was selected after packing: each job from its original. */
static void matmul_each(const sw_kernel_table *kt, const sw_packed_job *jobs, int n)
{
    for (int j = 0; j < n; j++)
        if (jobs[j].p && jobs[j].n_tok > 0) {
            if (packed_usable(kt, jobs[j].p)) sw_matmul_packed_jobs(&jobs[j], 1);
            else sw_matmul_tensor(jobs[j].p->src, jobs[j].x, jobs[j].n_tok, jobs[j].y);
        }
}

/* The activation sets of the jobs, the forms each needs, and where each
 * job's groups start in the shared count (first[0..n]). */
static void plan_sets(const sw_kernel_table *kt, const sw_packed_job *jobs, int n, act_set *sets, int *set_of,
                      int64_t *first, packed_plan *pl)
{
    for (int j = 0; j < n; j++) {
        first[j] = pl->groups;
        if (!jobs[j].p || jobs[j].n_tok <= 0) continue;
        const sw_packed *p = jobs[j].p;
        set_of[j] = act_set_of(sets, &pl->n_sets, &jobs[j]);
        pl->groups += job_groups(&jobs[j]);
        pl->work += (double)p->rows * (double)p->cols * jobs[j].n_tok;
        pl->max_tok = jobs[j].n_tok > pl->max_tok ? jobs[j].n_tok : pl->max_tok;
        pl->group_bytes = p->group_bytes > pl->group_bytes ? p->group_bytes : pl->group_bytes;
        act_set *a = &sets[set_of[j]];
        if (sw_is_q32(p->type)) {
            a->q32 = true;
            continue;
        }
        a->k8 = true;
        if (p->type == SW_TYPE_Q6_K) a->bs6 = true;
        else a->bs4 = true;   /* Q4_K and Q5_K */
        /* the int8 form's sums too; the packed kernels' stay for the case
         * where its buffer cannot be had (i8_part) */
        if (job_i8(kt, &jobs[j])) {
            a->ns = true;
            a->qa |= kt->i8x16_tiles && jobs[j].n_tok >= 16;
        }
    }
    first[n] = pl->groups;
}

/* Places each set's forms in the scratch (64-byte aligned); returns its size. */
static size_t layout_sets(act_set *sets, packed_plan *pl)
{
    size_t bytes = 0;
    for (int s = 0; s < pl->n_sets; s++) {
        act_set *a = &sets[s];
        const size_t nb = (size_t)(a->cols / QK_K), nt = (size_t)a->n_tok;
        a->rs_k8 = sw_act_row_size(SW_TYPE_Q4_K, a->cols);
        a->rs_q32 = sw_act_row_size(SW_TYPE_Q8_0, a->cols);
        if (a->k8) { a->off = bytes; bytes += (a->rs_k8 * nt + 63) & ~(size_t)63; }
        if (a->bs4) { a->off_bs4 = bytes; bytes += (nb * 4 * sizeof(int32_t) * nt + 63) & ~(size_t)63; }
        if (a->bs6) { a->off_bs6 = bytes; bytes += (nb * 16 * sizeof(int32_t) * nt + 63) & ~(size_t)63; }
        if (a->ns) { a->off_ns = bytes; bytes += (nb * sizeof(int32_t) * nt + 63) & ~(size_t)63; }
        if (a->qa) {
            /* a line past the quants, so that 16 tokens' rows do not share a few L1 sets */
            a->rs_qa = nb * QK_K + 64;
            a->off_qa = bytes;
            bytes += a->rs_qa * nt;
        }
        if (a->q32) {
            a->off_q32 = bytes;
            bytes += (a->rs_q32 * nt + 63) & ~(size_t)63;
            a->off_aux = bytes;
            bytes += (size_t)(a->cols / QK8_0) * sizeof(sw_q32_aux) * nt;
        }
        bytes = (bytes + 63) & ~(size_t)63;
        pl->total_tok += a->n_tok;
    }
    return bytes;
}

/* Each activation row once, with the bsum forms its products need. */
static void quantize_sets(const sw_kernel_table *kt, const act_set *sets, int total_tok, uint8_t *buf)
{
    #pragma omp parallel for if (total_tok >= 4) schedule(static)
    for (int i = 0; i < total_tok; i++) {
        int s = 0, t = i;
        while (t >= sets[s].n_tok) t -= sets[s++].n_tok;
        const act_set *a = &sets[s];
        const float *x = a->x + (size_t)t * a->cols;
        if (a->k8) {
            const int64_t nb = a->cols / QK_K;
            uint8_t *q = buf + a->off + (size_t)t * a->rs_k8;
            kt->quant_q8_k(x, q, a->cols);
            if (a->bs4) packed_bsums(SW_TYPE_Q4_K, (const block_q8_k *)q, nb, (int32_t *)(buf + a->off_bs4) + (size_t)t * nb * 4);
            if (a->bs6) packed_bsums(SW_TYPE_Q6_K, (const block_q8_k *)q, nb, (int32_t *)(buf + a->off_bs6) + (size_t)t * nb * 16);
            if (a->ns) i8_nsums((const block_q8_k *)q, nb, (int32_t *)(buf + a->off_ns) + (size_t)t * nb);
            if (a->qa) aligned_quants((const block_q8_k *)q, nb, buf + a->off_qa + (size_t)t * a->rs_qa);
        }
        if (a->q32) {
            const int64_t nb = a->cols / QK8_0;
            uint8_t *q = buf + a->off_q32 + (size_t)t * a->rs_q32;
            kt->quant_q8_0(x, q, a->cols);
            q32_aux((const block_q8_0 *)q, nb, (sw_q32_aux *)(buf + a->off_aux) + (size_t)t * (size_t)nb);
        }
    }
}

/* Groups a0..a1 of job jb, all within that one product (local = a0 - its
 * first). Tiles of `tile` groups (their weights fit in L2), token slices
 * outside and groups inside each: a slice's activations stay in L1/L2
 * across the tile, and the tile's weights are read from memory once for
 * all the slices. */
static inline void run_part(const sw_kernel_table *kt, const sw_packed_job *jb, const act_set *as, const uint8_t *buf,
                            int64_t a0, int64_t a1, int64_t base, int64_t tile)
{
    if (as->ns && job_i8(kt, jb) && i8_part(kt, jb, as, buf, a0 - base, a1 - base)) return;
    for (int64_t s0 = a0; s0 < a1; s0 += tile) {
        int64_t s1 = s0 + tile < a1 ? s0 + tile : a1;
        for (int t = 0; t < jb->n_tok; t += SW_DOTN_MAX) {
            int cnt = jb->n_tok - t < SW_DOTN_MAX ? jb->n_tok - t : SW_DOTN_MAX;
            for (int64_t gg = s0; gg < s1; gg++) packed_group(kt, jb->p, gg - base, as, buf, t, cnt, jb->y);
        }
    }
}

/* Threads take runs of the products' 16-row groups, counted across all
 * of them (one parallel region for the lot; 64 bytes of y per token
 * and group, so no shared cache lines). Runs are handed out guided:
 * each takes a share of what is left (at least min_run groups), so runs
 * are long while much remains and short at the end. On a shared host
 * one core is often slowed for a while; a static split left the other
 * spinning at the barrier for a good part of a batch-1 step. Few tokens keep
 * runs >= 4 groups so the kernels' prefetch rarely runs past a run.
 * One token starts with an equal split of everything instead of a
 * third of each thread's share: its Q4_K kernel leans on the hardware prefetcher, which
 * ramps up again at each new run (measured: docs/perf/cpu.md, session 6's
 * log). */
static void run_groups(const sw_kernel_table *kt, const sw_packed_job *jobs, const act_set *sets, const int *set_of,
                       const int64_t *first, const uint8_t *buf, const packed_plan *pl)
{
    const int64_t groups = pl->groups, max_tok = pl->max_tok;
    const int64_t min_run = max_tok < 16 ? 4 : 1;
    const int64_t tile = (int64_t)(SW_L2_TILE_BYTES / pl->group_bytes) > 1 ? (int64_t)(SW_L2_TILE_BYTES / pl->group_bytes) : 1;
    int64_t next = 0;
    #pragma omp parallel if (pl->work > 65536)
    {
        const int64_t share = (max_tok == 1 ? 1 : 3) * (int64_t)omp_get_num_threads();
        int j = 0;
        for (;;) {
            int64_t left = groups - __atomic_load_n(&next, __ATOMIC_RELAXED);
            int64_t run = left / share > min_run ? left / share : min_run;
            int64_t r0 = __atomic_fetch_add(&next, run, __ATOMIC_RELAXED);
            if (r0 >= groups) break;
            int64_t r1 = r0 + run < groups ? r0 + run : groups;
            /* the run, one product's part at a time */
            for (int64_t a0 = r0; a0 < r1;) {
                while (j > 0 && a0 < first[j]) j--;
                while (a0 >= first[j + 1]) j++;
                const int64_t a1 = first[j + 1] < r1 ? first[j + 1] : r1;
                run_part(kt, &jobs[j], &sets[set_of[j]], buf, a0, a1, first[j], tile);
                a0 = a1;
            }
        }
    }
}

void sw_matmul_packed_jobs(const sw_packed_job *jobs, int n)
{
    const sw_kernel_table *kt = ktab();
    int live;
    const bool usable = jobs_usable(kt, jobs, n, &live);
    if (!live) return;
    if (!usable) {
        matmul_each(kt, jobs, n);
        return;
    }
    /* a dense layer's fused products fit on the stack; a mixture's many experts take the heap */
    enum { ON_STACK = 8 };
    act_set sets_s[ON_STACK];
    int set_of_s[ON_STACK];
    int64_t first_s[ON_STACK + 1];
    const bool heap = n > ON_STACK;
    act_set *sets = heap ? malloc((size_t)n * sizeof *sets) : sets_s;
    int *set_of = heap ? malloc((size_t)n * sizeof *set_of) : set_of_s;
    int64_t *first = heap ? malloc(((size_t)n + 1) * sizeof *first) : first_s;
    bool ok = sets && set_of && first;
    for (int j = 0; ok && j < n; j++)
        if (jobs[j].p && jobs[j].n_tok > 0) ok = packed_tail(jobs[j].p, jobs[j].x, jobs[j].n_tok, jobs[j].y);
    packed_plan pl = { 0 };
    size_t bytes = 0;
    if (ok) {
        plan_sets(kt, jobs, n, sets, set_of, first, &pl);
        bytes = layout_sets(sets, &pl);
    }
    uint8_t *buf = ok ? scratch_get(SCRATCH_ACT, bytes) : NULL;
    if (!buf) {
        fprintf(stderr, "sw_matmul_packed: out of memory for %d products\n", n);
        for (int j = 0; j < n; j++)
            if (jobs[j].p && jobs[j].n_tok > 0) fill_nan(jobs[j].y, (size_t)jobs[j].p->rows * (size_t)jobs[j].n_tok);
    } else {
        quantize_sets(kt, sets, pl.total_tok, buf);
        run_groups(kt, jobs, sets, set_of, first, buf, &pl);
    }
    if (heap) {
        free(sets);
        free(set_of);
        free(first);
    }
}

void sw_matmul_packed_n(const sw_packed *const *p, int np, const float *x, int n_tok, float *const *y)
{
    sw_packed_job jobs[SW_PACKED_FUSE_MAX];
    if (np > SW_PACKED_FUSE_MAX) {
        for (int m = 0; m < np; m++) sw_matmul_packed_n(&p[m], 1, x, n_tok, &y[m]);
        return;
    }
    for (int k = 0; k < np; k++) jobs[k] = (sw_packed_job){ p[k], x, n_tok, y[k] };
    sw_matmul_packed_jobs(jobs, np);
}

void sw_matmul_packed(const sw_packed *p, const float *x, int n_tok, float *y)
{
    sw_matmul_packed_n(&p, 1, x, n_tok, &y);
}
