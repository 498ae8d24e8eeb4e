/* spillway-bench: prefill and (batched) decode throughput of the CPU forward
 * pass, set against this machine's streaming-read bandwidth measured in the
 * same run (absolute figures move between runs on shared machines; the
 * ratios are what to compare).
 *
 *   spillway-bench -m MODEL [-t THREADS] [-p 512] [-n 128] [-b 1,4,16] [-d 0] [--mem-mib 1024]
 *   spillway-bench --kernels [--quick]   the packed matmul alone, no model
 *   spillway-bench --cpu                 what this CPU has, as one JSON line
 *
 * Prints a table, then one JSON line.
 */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llm/sampler.h"
#include "llm/cli.h"
#include "llm/clock.h"
#include "llm/quant.h"
#include "llm/util.h"
#include "worker-cpu/forward.h"
#include "worker-cpu/kernels.h"
#include "llm/model.h"

#define MAX_BATCHES 16

typedef struct {
    const char *model;
    int threads, n_prompt, n_gen, depth, mem_mib, precise, kernels, quick, cpu;
    int batches[MAX_BATCHES], n_batches;
    sw_kv_type kv_type;
} options;

/* step_bytes: weights and KV cache read per step; kv_bytes: the cache's share */
typedef struct { int batch; double tok_s, gb_s, step_ms, mem_gb_s, gmac_s, step_bytes, kv_bytes; } decode_result;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: spillway-bench -m MODEL [-t THREADS] [-p N] [-n N] [-b B1,B2,...] [-d N] [--mem-mib MIB]\n"
        "                      [--precise] [--kv-cache f16|q8_0]\n"
        "       spillway-bench --kernels [--quick] [-t THREADS] [--mem-mib MIB]\n"
        "       spillway-bench --cpu\n"
        "  -p N        prompt tokens for the prefill measurement (default 512)\n"
        "  -n N        decode steps per batch size (default 128)\n"
        "  -b LIST     decode batch sizes (default 1,4,16)\n"
        "  -d N        depth: prefill and decode after N positions of context, in every\n"
        "              sequence (default 0), as llama-bench's -d\n"
        "  --mem-mib   size of the streaming-read buffer (default 1024)\n"
        "  --precise   use residual-corrected activations (default: the serving path)\n"
        "  --kv-cache  the KV cache's element type (default f16)\n"
        "  --kernels   no model: the packed matmul (Q4_K Q5_K Q6_K Q8_0 Q5_0 Q4_0 MXFP4) on random\n"
        "              weights, in cache and streamed from memory (MIB/4 of weights),\n"
        "              at 1 and 8 tokens, and in cache at 128 (the int8 form where it applies)\n"
        "  --quick     with --kernels: every point once on small matrices (a check that each\n"
        "              kernel runs, as under an emulator; the figures mean nothing)\n"
        "  --cpu       no model: the ISA in use, the best this CPU has, the CPU features they\n"
        "              were chosen from and the int8 form's threshold, as one JSON line\n");
}

static void parse_batches(options *o, const char *s)
{
    int n = 0;
    int32_t *ids = sw_cli_ids("spillway-bench", "-b", s, 1024, &n);
    o->n_batches = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 1 || o->n_batches == MAX_BATCHES)
            sw_cli_die("spillway-bench", "-b: invalid list '%s' (up to %d sizes in 1..1024, comma-separated)",
                       s, MAX_BATCHES);
        o->batches[o->n_batches++] = (int)ids[i];
    }
    free(ids);
}

static options parse_args(int argc, char **argv)
{
    options o = { .n_prompt = 512, .n_gen = 128, .mem_mib = 1024 };
    parse_batches(&o, "1,4,16");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
        if (!strcmp(a, "--precise")) { o.precise = 1; continue; }
        if (!strcmp(a, "--kernels")) { o.kernels = 1; continue; }
        if (!strcmp(a, "--quick")) { o.quick = 1; continue; }
        if (!strcmp(a, "--cpu")) { o.cpu = 1; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "spillway-bench: %s: missing value (or unknown option)\n", a); exit(2); }
        const char *v = argv[++i];
        if (!strcmp(a, "-m")) o.model = v;
        else if (!strcmp(a, "-t")) o.threads = (int)sw_cli_long("spillway-bench", a, v, 1, 1024);
        else if (!strcmp(a, "-p")) o.n_prompt = (int)sw_cli_long("spillway-bench", a, v, 1, 65536);
        else if (!strcmp(a, "-n")) o.n_gen = (int)sw_cli_long("spillway-bench", a, v, 1, 65536);
        else if (!strcmp(a, "-d")) o.depth = (int)sw_cli_long("spillway-bench", a, v, 0, 1 << 20);
        else if (!strcmp(a, "-b")) parse_batches(&o, v);
        else if (!strcmp(a, "--mem-mib")) o.mem_mib = (int)sw_cli_long("spillway-bench", a, v, 16, 1 << 20);
        else if (!strcmp(a, "--kv-cache")) {
            if (!sw_kv_type_parse(v, &o.kv_type)) sw_cli_die("spillway-bench", "--kv-cache: '%s' is not f16 or q8_0", v);
        }
        else { fprintf(stderr, "spillway-bench: unknown option '%s'\n", a); usage(stderr); exit(2); }
    }
    if (o.quick && !o.kernels) { fprintf(stderr, "spillway-bench: --quick goes with --kernels\n"); exit(2); }
    if (!o.model && !o.kernels && !o.cpu) { fprintf(stderr, "spillway-bench: -m MODEL is required\n"); usage(stderr); exit(2); }
    return o;
}

/* ---- streaming-read bandwidth ----
 * Every thread sums its own contiguous share of a buffer far larger than the
 * caches, with the thread count the model runs with. On a shared host this
 * figure moves by up to 2x within seconds, so the decode ratios are taken
 * against passes interleaved with the decode steps themselves ("beside"),
 * and the best pass of the whole run is reported as well. */

typedef float v16 __attribute__((vector_size(64)));

/* Sums n floats (n a multiple of 64, p 64-byte aligned) with four independent
 * accumulators, so the add latency never limits the load rate. */
SW_CLONES
static float sum_floats(const float *p, size_t n)
{
    v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (size_t i = 0; i + 64 <= n; i += 64) {
        const v16 *v = (const v16 *)(p + i);
        a0 += v[0]; a1 += v[1]; a2 += v[2]; a3 += v[3];
    }
    v16 a = (a0 + a1) + (a2 + a3);
    float s = 0.0f;
    for (int k = 0; k < 16; k++) s += a[k];
    return s;
}

typedef struct {
    float *buf;
    size_t n;          /* floats */
    double best;       /* best pass of the run, GB/s */
    double sink;       /* keeps the sums alive */
} read_meter;

static int meter_init(read_meter *rm, size_t bytes)
{
    rm->n = bytes / sizeof(float);
    rm->buf = aligned_alloc(64, rm->n * sizeof(float));
    rm->best = rm->sink = 0.0;
    if (!rm->buf) return -1;
    /* Write every page so reads hit real memory, not the shared zero page. */
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rm->n; i++) rm->buf[i] = (float)(i & 1023) * 1e-3f;
    return 0;
}

/* One pass over the whole buffer; returns its GB/s. */
static double meter_pass(read_meter *rm)
{
    double total = 0.0, t0 = sw_clock_s();
#pragma omp parallel reduction(+:total)
    {
        int nth = omp_get_num_threads(), ith = omp_get_thread_num();
        size_t chunk = (rm->n / nth + 63) & ~(size_t)63;   /* whole 256-byte groups */
        size_t lo = chunk * ith, hi = lo + chunk < rm->n ? lo + chunk : rm->n;
        if (lo < hi) total += sum_floats(rm->buf + lo, hi - lo);
    }
    double gbs = rm->n * sizeof(float) / (sw_clock_s() - t0) / 1e9;
    rm->sink += total;
    if (gbs > rm->best) rm->best = gbs;
    return gbs;
}

/* ---- model runs ---- */

static int run_batch(sw_ctx *ctx, sw_tok_in *b, int n, float *logits)
{
    char err[256];
    if (sw_forward(ctx, b, n, logits, err, sizeof err)) {
        fprintf(stderr, "spillway-bench: %s\n", err);
        return -1;
    }
    return 0;
}

/* A context as the options ask (activations, cache type); NULL, said, when
 * one cannot be had. */
static sw_ctx *bench_ctx(const sw_model *m, const options *o, int n_seq, int n_ctx, int batch)
{
    char err[256];
    sw_ctx *ctx = sw_ctx_new(m, n_seq, n_ctx, batch, err, sizeof err);
    if (ctx && sw_ctx_set_kv_type(ctx, o->kv_type, err, sizeof err)) {
        sw_ctx_free(ctx);
        ctx = NULL;
    }
    if (!ctx) { fprintf(stderr, "spillway-bench: %s\n", err); return NULL; }
    if (o->precise) sw_ctx_set_precise(ctx, true);
    return ctx;
}

static int32_t random_token(const sw_model *m, uint32_t *rng)
{
    *rng = *rng * 1664525u + 1013904223u;
    return (int32_t)(*rng % m->hp.n_vocab);
}

/* -d: positions 0..depth-1 of every sequence filled, sequence 0's by a
 * prefill in batches as large as the context takes, then copied to the
 * others (a memory copy: the same cache contents, in each one's own
 * memory, so each still streams its own). */
static int fill_depth(sw_ctx *ctx, const sw_model *m, int depth, int n_seq, uint32_t *rng)
{
    const int mb = sw_ctx_max_batch(ctx);
    sw_tok_in *b = calloc((size_t)mb, sizeof *b);
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    int rc = b && logits ? 0 : -1;
    double t0 = sw_clock_s();
    for (int p0 = 0; p0 < depth && !rc; p0 += mb) {
        int n = depth - p0 < mb ? depth - p0 : mb;
        for (int i = 0; i < n; i++)
            b[i] = (sw_tok_in){ .token = random_token(m, rng), .pos = p0 + i, .seq = 0, .logits = i == n - 1 };
        rc = run_batch(ctx, b, n, logits);
    }
    for (int s = 1; s < n_seq && !rc; s++) sw_ctx_copy_kv(ctx, 0, s, 0, depth);
    if (!rc && depth)
        fprintf(stderr, "spillway-bench: %d positions of context filled in %.1f s\n", depth, sw_clock_s() - t0);
    free(b);
    free(logits);
    return rc;
}

/* Prefill: one prompt of n_prompt tokens after the depth, in one batch on
 * sequence `seq`, logits for the last. main runs it twice and times the
 * second, as llama-bench warms up before it measures: the first run of a
 * process pays for cold pages and caches (docs/perf/cpu.md, session 10's
 * log). */
static double bench_prefill(sw_ctx *ctx, const sw_model *m, const options *o, int seq, uint32_t *rng)
{
    const int n_prompt = o->n_prompt;
    sw_tok_in *b = calloc((size_t)n_prompt, sizeof *b);
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    for (int i = 0; i < n_prompt; i++)
        b[i] = (sw_tok_in){ .token = random_token(m, rng), .pos = o->depth + i, .seq = seq,
                            .logits = i == n_prompt - 1 };
    double t0 = sw_clock_s();
    int rc = run_batch(ctx, b, n_prompt, logits);
    double dt = sw_clock_s() - t0;
    free(b);
    free(logits);
    return rc ? -1 : n_prompt / dt;
}

/* Decode: sequences 0..batch-1, each one token per step from the depth, all
 * in one forward call per step (weights read once per step). The first step
 * is a warm-up and is not timed; then n_gen steps run in segments of
 * SEGMENT_STEPS with a streaming-read pass before each and after the last;
 * only the steps are timed for the decode rate, and the mean of the passes
 * is the bandwidth beside it. */
#define SEGMENT_STEPS 16
static int bench_decode(sw_ctx *ctx, const sw_model *m, const options *o, int batch, int n_gen, uint32_t *rng,
                        read_meter *rm, decode_result *out)
{
    sw_tok_in *b = calloc((size_t)batch, sizeof *b);
    float *logits = malloc((size_t)batch * m->hp.n_vocab * sizeof(float));
    int rc = 0, passes = 0;
    double dt = 0.0, bw = 0.0, bytes = 0.0, kv = 0.0;
    for (int step = 0; step <= n_gen && !rc; step++) {
        if (rm && step > 0 && (step - 1) % SEGMENT_STEPS == 0) { bw += meter_pass(rm); passes++; }
        for (int s = 0; s < batch; s++) {
            /* the next token is the argmax, as in greedy decoding (cheap next to the step) */
            int32_t tok = step ? sw_argmax(logits + (size_t)s * m->hp.n_vocab, (int32_t)m->hp.n_vocab)
                               : random_token(m, rng);
            b[s] = (sw_tok_in){ .token = tok, .pos = o->depth + step, .seq = s, .logits = true };
        }
        double t0 = sw_clock_s();
        rc = run_batch(ctx, b, batch, logits);
        if (step == 0) continue;   /* the warm-up */
        dt += sw_clock_s() - t0;
        const double kv_step = (double)sw_ctx_kv_bytes_read(ctx);
        bytes += (double)sw_ctx_weight_bytes_read(ctx) + kv_step;   /* a mixture's experts vary by step */
        kv += kv_step;
    }
    if (rm) { bw += meter_pass(rm); passes++; }
    out->batch = batch;
    out->tok_s = (double)batch * n_gen / dt;
    out->step_ms = dt / n_gen * 1e3;
    out->gb_s = bytes / dt / 1e9;
    out->step_bytes = bytes / n_gen;
    out->kv_bytes = kv / n_gen;
    out->mem_gb_s = passes ? bw / passes : 0.0;
    out->gmac_s = sw_forward_weight_macs(m, batch, batch) * n_gen / dt / 1e9;
    free(b);
    free(logits);
    return rc;
}

/* ---- --kernels: the packed matmul alone ----
 * In cache (512 rows a thread, inside the L2s) the figure is the kernel's
 * instruction throughput plus the per-call costs (activation quantization,
 * waking the threads), which weigh more on such a small call; streamed
 * (4096-row matrices totalling MIB/4, far past L3) it is what decode and
 * prefill can reach. GMAC/s is to be set against the core's int8
 * multiply-add peak (one zmm vpdpbusd a cycle: 64 MACs). */

typedef struct { const char *type, *where, *form; int tokens; double gb_s, gmac_s; } kernel_result;

/* The matrices timed: columns; cache rows a thread (as Q4_K; other types
 * as many bytes); rows of a streamed matrix; multiply-adds per point in
 * cache (0: one pass); seconds of the int8 peak (the least: one window of
 * its calls). --quick runs each kernel
 * once on small ones: under an emulator the full run takes many minutes. */
typedef struct { int64_t cols, cache_rows, stream_rows; double macs, peak_s; } kernel_shape;
static const kernel_shape FULL_SHAPE = { 4096, 512, 4096, 2e8, 0.25 };
static const kernel_shape QUICK_SHAPE = { 512, 32, 64, 0, 1e-9 };

/* n_mat packed copies of one rows x cols matrix of random quantized rows. */
static sw_packed **make_packs(sw_type type, int64_t rows, int64_t cols, int n_mat, gguf_tensor *t, uint8_t **data)
{
    size_t rs = sw_row_size(type, (uint64_t)cols);
    float *src = malloc(sizeof(float) * (size_t)cols);
    uint8_t *w = malloc(rs * (size_t)rows);
    sw_packed **pk = calloc((size_t)n_mat, sizeof *pk);
    if (!src || !w || !pk) { free(src); free(w); free(pk); return NULL; }
    uint64_t r = 1;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t c = 0; c < cols; c++) src[c] = (float)((int64_t)(sw_splitmix64(&r) >> 33) % 2001 - 1000) * 1e-3f;
        sw_quantize_row(type, src, w + (size_t)i * rs, cols);
    }
    free(src);
    memset(t, 0, sizeof *t);
    t->n_dims = 2;
    t->ne[0] = (uint64_t)cols; t->ne[1] = (uint64_t)rows; t->ne[2] = t->ne[3] = 1;
    t->type = type;
    t->data = w;
    t->nbytes = rs * (size_t)rows;
    for (int m = 0; m < n_mat; m++)
        if (!(pk[m] = sw_pack_tensor(t))) {
            for (int k = 0; k < m; k++) sw_packed_free(pk[k]);
            free(pk); free(w);
            return NULL;
        }
    *data = w;
    return pk;
}

static const sw_type KERNEL_TYPES[] = {SW_TYPE_Q4_K, SW_TYPE_Q5_K, SW_TYPE_Q6_K, SW_TYPE_Q8_0, SW_TYPE_Q5_0,
                                     SW_TYPE_Q4_0, SW_TYPE_MXFP4};
enum { N_TYPES = sizeof KERNEL_TYPES / sizeof KERNEL_TYPES[0] };
/* 128 tokens (in cache only): a prefill's products, on the int8 form
 * where it applies (sw_i8_min_tokens) */
static const int KERNEL_TOKENS[] = {1, 8, 128};
enum { N_TOK = sizeof KERNEL_TOKENS / sizeof KERNEL_TOKENS[0], MAX_TOK = 128 };

/* Times the n_mat packed rows x cols matrices pk (in cache when !where,
 * else streamed) at ntok tokens, adding a result to res. */
static void time_pack(sw_packed **pk, int n_mat, sw_type type, int where, int64_t rows, const kernel_shape *ks,
                      int ntok, const char *form, const float *x, float *y, kernel_result *res, int *nres)
{
    const int64_t cols = ks->cols;
    int reps = !ks->macs ? 1 : where ? 2 : (int)(ks->macs / ((double)rows * cols * ntok) + 1);
    for (int m = 0; m < n_mat; m++) sw_matmul_packed(pk[m], x, ntok, y);   /* warm-up */
    double t0 = sw_clock_s();
    for (int it = 0; it < reps; it++)
        for (int m = 0; m < n_mat; m++) sw_matmul_packed(pk[m], x, ntok, y);
    double dt = sw_clock_s() - t0;
    double bytes = (double)sw_packed_bytes(pk[0]) * n_mat * reps;
    res[(*nres)++] = (kernel_result){ sw_type_info(type)->name, where ? "stream" : "cache", form, ntok,
                                      bytes / dt / 1e9, (double)rows * cols * ntok * n_mat * reps / dt / 1e9 };
}

/* time_pack at each token count. Q4_K at one token twice: without ("no-pf")
 * and with ("pf") its software prefetch, whichever this CPU defaults to
 * (sw_prefetch_one_token), so one run shows which a host should use. */
static void time_packs(sw_packed **pk, int n_mat, sw_type type, int where, int64_t rows, const kernel_shape *ks,
                       const float *x, float *y, kernel_result *res, int *nres)
{
    for (int k = 0; k < N_TOK; k++) {
        int ntok = KERNEL_TOKENS[k];
        if (where && ntok > 8) continue;   /* many tokens are compute-bound wherever the weights are */
        const bool i8 = sw_i8_min_tokens() && ntok >= sw_i8_min_tokens() &&
                        (type == SW_TYPE_Q4_K || type == SW_TYPE_Q5_K || type == SW_TYPE_Q6_K);
        if (type != SW_TYPE_Q4_K || ntok != 1) {
            time_pack(pk, n_mat, type, where, rows, ks, ntok, i8 ? "int8" : "packed", x, y, res, nres);
            continue;
        }
        const bool was = sw_set_prefetch_one_token(false);
        time_pack(pk, n_mat, type, where, rows, ks, ntok, "no-pf", x, y, res, nres);
        sw_set_prefetch_one_token(true);
        time_pack(pk, n_mat, type, where, rows, ks, ntok, "pf", x, y, res, nres);
        sw_set_prefetch_one_token(was);
    }
}

/* The int8 form's own peak, where it runs on another instruction than the
 * packed kernels (AVX-VNNI's ymm vpdpbusd, AMX's tdpbsud); else 0. */
static double own_form_peak(double seconds)
{
    const char *mix = sw_int8_form_peak_mix();
    return mix && mix != sw_int8_peak_mix() ? sw_int8_form_peak_gmac_s(seconds) : 0;
}

/* The --kernels table, then its JSON line; form_peak: the int8 form's
 * own peak, which its rows are taken against (0: the same instruction). */
static void print_kernels(int threads, double bw, double peak, double form_peak, const kernel_result *res, int nres,
                          const char *const *unpacked, int nunpacked, int quick)
{
    printf("packed matmul kernels, %d threads, isa %s; streaming read %.1f GB/s; ", threads,
           sw_isa_name(sw_isa_active()), bw);
    if (peak > 0) printf("int8 multiply-add peak (%s) %.1f GMAC/s\n", sw_int8_peak_mix(), peak);
    else printf("int8 multiply-add peak not measured (%s)\n", quick ? "--quick" : "no int8 path on this isa");
    if (form_peak > 0) printf("the int8 form's peak (%s) %.1f GMAC/s: its rows' \"of peak\"\n", sw_int8_form_peak_mix(), form_peak);
    printf("cpu %s; q4_K at 1 token is timed without (no-pf) and with (pf) software prefetch, "
           "this CPU's default: %s\n", sw_cpu_model(), sw_prefetch_one_token() ? "pf" : "no-pf");
    printf("%-6s %-7s %7s %-7s %9s %9s %8s\n", "type", "weights", "tokens", "form", "GB/s", "GMAC/s", "of peak");
    for (int i = 0; i < nres; i++) {
        printf("%-6s %-7s %7d %-7s %9.1f %9.1f", res[i].type, res[i].where, res[i].tokens, res[i].form, res[i].gb_s,
               res[i].gmac_s);
        const double pk = form_peak > 0 && !strcmp(res[i].form, "int8") ? form_peak : peak;
        if (peak > 0) printf(" %7.0f%%\n", 100.0 * res[i].gmac_s / pk);
        else printf(" %8s\n", "-");   /* scalar: no int8 peak measured */
    }
    /* what this host has, so a test checks exactly that: unpacked types
     * and the token count from which the K-quants run on the int8 form */
    printf("{\"threads\":%d,\"isa\":\"%s\",\"best\":\"%s\",\"cpu\":\"%s\",\"cpu_model\":\"%s\",\"quick\":%s,"
           "\"mem_read_gb_per_s\":%.4g,\"int8_peak_gmac_per_s\":%.4g,\"i8_min_tokens\":%d,\"prefetch_1tok\":%s,"
           "\"unpacked\":[", threads, sw_isa_name(sw_isa_active()), sw_isa_name(sw_isa_best()), sw_cpu_features(),
           sw_cpu_model(), quick ? "true" : "false", bw, peak, sw_i8_min_tokens(),
           sw_prefetch_one_token() ? "true" : "false");
    for (int i = 0; i < nunpacked; i++) printf("%s\"%s\"", i ? "," : "", unpacked[i]);
    printf("]");
    if (form_peak > 0) printf(",\"int8_form_peak_gmac_per_s\":%.4g", form_peak);
    printf(",\"kernels\":[");
    for (int i = 0; i < nres; i++)
        printf("%s{\"type\":\"%s\",\"weights\":\"%s\",\"tokens\":%d,\"form\":\"%s\",\"gb_per_s\":%.4g,"
               "\"gmac_per_s\":%.4g}", i ? "," : "", res[i].type, res[i].where, res[i].tokens, res[i].form, res[i].gb_s,
               res[i].gmac_s);
    printf("]}\n");
}

static int bench_kernels(const options *o, int threads)
{
    const kernel_shape *ks = o->quick ? &QUICK_SHAPE : &FULL_SHAPE;
    const int64_t cols = ks->cols;
    kernel_result res[N_TYPES * 2 * N_TOK + 2];   /* + Q4_K at one token, twice */
    int nres = 0;
    const char *unpacked[N_TYPES];   /* types this isa has no packed kernel for */
    int nunpacked = 0;
    float *x = malloc(sizeof(float) * (size_t)cols * MAX_TOK);
    /* the cache matrices have at most 2 x 512 rows a thread (the 32-weight types' rows are smaller) */
    size_t y_rows = (size_t)1024 * threads > 4096 ? (size_t)1024 * threads : 4096;
    float *y = malloc(sizeof(float) * MAX_TOK * y_rows);
    if (!x || !y) { fprintf(stderr, "spillway-bench: out of memory\n"); return 1; }
    for (int i = 0; i < cols * MAX_TOK; i++) x[i] = (float)(i % 17) * 0.1f - 0.8f;
    read_meter rm;
    if (meter_init(&rm, (size_t)o->mem_mib << 20)) { fprintf(stderr, "spillway-bench: out of memory\n"); return 1; }
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int where = 0; where < 2; where++) {
            /* cache: one matrix of about 1.2 MB a thread (512 rows of Q4_K),
             * inside its L2; stream: 4096 x 4096 ones adding up to MIB/4 */
            const sw_type type = KERNEL_TYPES[ti];
            size_t row_bytes = sw_row_size(type, (uint64_t)cols);
            int64_t rows = where ? ks->stream_rows
                                 : (int64_t)((ks->cache_rows * sw_row_size(SW_TYPE_Q4_K, (uint64_t)cols)) / row_bytes / 16 * 16) * threads;
            size_t one = row_bytes * (size_t)rows;
            int n_mat = where && !o->quick ? (int)(((size_t)o->mem_mib << 18) / one) : 1;
            if (n_mat < 1) n_mat = 1;
            gguf_tensor t;
            uint8_t *data = NULL;
            sw_packed **pk = make_packs(type, rows, cols, n_mat, &t, &data);
            if (!pk) {
                if (!where) {
                    fprintf(stderr, "spillway-bench: no packed %s here (no packed kernel on isa %s, or memory): skipped\n",
                            sw_type_info(type)->name, sw_isa_name(sw_isa_active()));
                    unpacked[nunpacked++] = sw_type_info(type)->name;
                }
                continue;
            }
            time_packs(pk, n_mat, type, where, rows, ks, x, y, res, &nres);
            for (int m = 0; m < n_mat; m++) sw_packed_free(pk[m]);
            free(pk);
            free(data);
        }
    if (!nres) { fprintf(stderr, "spillway-bench: no packed kernels to time\n"); return 1; }
    double bw = 0;
    for (int i = 0; i < 3; i++) bw += meter_pass(&rm) / 3;
    double peak = ks->peak_s ? sw_int8_peak_gmac_s(ks->peak_s) : 0;
    double form_peak = peak > 0 ? own_form_peak(ks->peak_s) : 0;
    print_kernels(threads, bw, peak, form_peak, res, nres, unpacked, nunpacked, o->quick);
    if (rm.sink == 12345.678) fprintf(stderr, " ");
    free(rm.buf); free(x); free(y);
    return 0;
}

/* What a model run measured, for its table and JSON line. */
typedef struct {
    double peak;                        /* int8 multiply-add peak, GMAC/s (0: not measured) */
    double form_peak;                   /* the int8 form's, where it runs and its instruction differs (0: no) */
    double prefill, prefill_gmac, prefill_ceiling;   /* tokens/s, GMAC/s, tokens/s at the peak */
    decode_result res[MAX_BATCHES];
    const decode_result *b1;            /* the batch-1 result, if one ran */
} model_run;

static int imax(int a, int b) { return a > b ? a : b; }

/* Whether products of ntok tokens run on the int8 form. */
static bool form_runs(const options *o, int ntok)
{
    return !o->precise && sw_i8_min_tokens() > 0 && ntok >= sw_i8_min_tokens();
}

/* The peak that bounds a product of ntok tokens: the form's where it runs on
 * an instruction of its own (AVX-VNNI's vpdpbusd on ymm), else the packed
 * kernels'. */
static double peak_for(const options *o, const model_run *r, int ntok)
{
    return r->form_peak > 0 && form_runs(o, ntok) ? r->form_peak : r->peak;
}

/* Every model measurement, on one context: sequences 0..B-1 (B the largest
 * batch) decode and sequence B prefills, so the prompt never overwrites a
 * decoding sequence's sliding-window ring; all start at the depth. */
static int run_model(const sw_model *m, const options *o, read_meter *rm, model_run *r)
{
    int nb = 1;
    for (int i = 0; i < o->n_batches; i++) nb = imax(nb, o->batches[i]);
    /* positions: the depth, then the prompt, or the decode steps and the warm-up's 5 */
    const int n_ctx = o->depth + imax(o->n_prompt, imax(o->n_gen + 1, 5));
    sw_ctx *ctx = bench_ctx(m, o, nb + 1, n_ctx, imax(o->n_prompt, nb));
    if (!ctx) return -1;
    uint32_t rng = 12345;
    decode_result warm;
    /* Warm-up: fault the mapped weights in and settle the thread pool. */
    int rc = fill_depth(ctx, m, o->depth, nb + 1, &rng) || bench_decode(ctx, m, o, 1, 4, &rng, NULL, &warm);
    /* The int8 multiply-add peak, right before the prefill it bounds. */
    r->peak = rc ? 0 : sw_int8_peak_gmac_s(0.25);
    if (!rc && form_runs(o, o->n_prompt)) r->form_peak = own_form_peak(0.25);
    r->prefill = rc ? -1 : bench_prefill(ctx, m, o, nb, &rng);   /* warm-up */
    if (r->prefill >= 0) r->prefill = bench_prefill(ctx, m, o, nb, &rng);
    rc = r->prefill < 0;
    /* weight multiply-adds per prompt token, and what the peak alone would allow */
    double prefill_macs = sw_forward_weight_macs(m, o->n_prompt, 1) / o->n_prompt;
    r->prefill_gmac = r->prefill * prefill_macs / 1e9;
    r->prefill_ceiling = peak_for(o, r, o->n_prompt) * 1e9 / prefill_macs;
    for (int i = 0; i < o->n_batches && !rc; i++)
        rc = bench_decode(ctx, m, o, o->batches[i], o->n_gen, &rng, rm, &r->res[i]);
    for (int i = 0; i < o->n_batches; i++) if (r->res[i].batch == 1) r->b1 = &r->res[i];
    sw_ctx_free(ctx);
    return rc;
}

static void print_table(const options *o, const sw_model *m, int threads, const read_meter *rm, const model_run *r)
{
    const char *name = strrchr(o->model, '/') ? strrchr(o->model, '/') + 1 : o->model;
    const double peak = r->peak, prefill = r->prefill;
    const decode_result *res = r->res, *b1 = r->b1;
    char i8[64] = "";
    if (sw_i8_min_tokens() && !o->precise)
        snprintf(i8, sizeof i8, ", int8 form from %d tokens", sw_i8_min_tokens());
    printf("model %s (%s), %d threads, isa %s%s%s%s, %s KV cache, depth %d\ncpu %s\n", name, m->quant_name,
           threads, sw_isa_name(sw_isa_active()), o->precise ? ", precise activations" : "", i8,
           sw_prefetch_one_token() ? ", one-token prefetch" : "", sw_kv_type_name(o->kv_type), o->depth,
           sw_cpu_model());
    printf("weights read per decode step: %.1f MiB (per token at batch 1: %llu bytes)%s\n",
           m->weight_bytes / 1048576.0, (unsigned long long)m->weight_bytes,
           m->hp.n_expert ? "; a mixture's larger batches read every expert some token uses, counted per step" : "");
    printf("streaming read (%d MiB, %d threads): best pass of the run %.1f GB/s; \"beside\" = mean of the passes\n"
           "interleaved with that batch's steps (one per %d steps)\n", o->mem_mib, threads, rm->best, SEGMENT_STEPS);
    if (peak > 0)
        printf("int8 multiply-add peak (%s, %d threads, measured before the prefill): %.1f GMAC/s;\n"
               "GMAC/s below = weight multiply-adds (attention not counted)\n", sw_int8_peak_mix(), threads, peak);
    else
        printf("int8 multiply-add peak: not measured (no int8 path on isa %s)\n", sw_isa_name(sw_isa_active()));
    if (r->form_peak > 0)
        printf("the int8 form's peak (%s), which products of %d tokens or more run on: %.1f GMAC/s;\n"
               "\"of peak\" is taken against it for those\n", sw_int8_form_peak_mix(), sw_i8_min_tokens(), r->form_peak);
    printf("GB/s = weights and KV cache read a second; KV MiB = the cache's share of a step\n");
    printf("%-18s %10s %9s %8s %8s %12s %11s %11s %9s %9s\n", "test", "tokens/s", "ms/step", "KV MiB", "GB/s",
           "beside GB/s", "of beside", "of best", "GMAC/s", "of peak");
    char pk[16] = "-";
    if (peak > 0) snprintf(pk, sizeof pk, "%.0f%%", 100.0 * r->prefill_gmac / peak_for(o, r, o->n_prompt));
    printf("%-18s %10.1f %9s %8s %8s %12s %11s %11s %9.1f %9s\n", "prefill", prefill, "-", "-", "-", "-", "-", "-",
           r->prefill_gmac, pk);
    for (int i = 0; i < o->n_batches; i++) {
        char label[32];
        snprintf(label, sizeof label, "decode batch %d", res[i].batch);
        if (peak > 0) snprintf(pk, sizeof pk, "%.0f%%", 100.0 * res[i].gmac_s / peak_for(o, r, res[i].batch));
        printf("%-18s %10.1f %9.2f %8.1f %8.1f %12.1f %10.0f%% %10.0f%% %9.1f %9s\n", label, res[i].tok_s,
               res[i].step_ms, res[i].kv_bytes / 1048576.0, res[i].gb_s, res[i].mem_gb_s,
               100.0 * res[i].gb_s / res[i].mem_gb_s, 100.0 * res[i].gb_s / rm->best,
               res[i].gmac_s, pk);
    }
    if (b1) {
        printf("prefill / decode(batch 1): %.2fx", prefill / b1->tok_s);
        if (peak > 0)
            printf(" (at the int8 peak itself prefill would run %.0f tokens/s = %.2fx)", r->prefill_ceiling,
                   r->prefill_ceiling / b1->tok_s);
        printf("\n");
        for (int i = 0; i < o->n_batches; i++)
            if (res[i].batch != 1)
                printf("decode batch %d / batch 1 throughput: %.2fx\n", res[i].batch, res[i].tok_s / b1->tok_s);
    }
}

static void print_json(const options *o, const sw_model *m, int threads, const read_meter *rm, const model_run *r)
{
    const char *name = strrchr(o->model, '/') ? strrchr(o->model, '/') + 1 : o->model;
    const double peak = r->peak, prefill = r->prefill;
    const decode_result *res = r->res, *b1 = r->b1;
    printf("{\"model\":\"%s\",\"quantization\":\"%s\",\"threads\":%d,\"isa\":\"%s\",\"cpu_model\":\"%s\","
           "\"precise\":%s,\"i8_min_tokens\":%d,\"prefetch_1tok\":%s,\"kv_cache\":\"%s\",\"depth\":%d,"
           "\"weight_bytes_per_token\":%llu,"
           "\"int8_peak_gmac_per_s\":%.1f,\"prefill_tokens\":%d,\"prefill_tokens_per_s\":%.2f,"
           "\"prefill_gmac_per_s\":%.6g,\"decode\":[",
           name, m->quant_name, threads, sw_isa_name(sw_isa_active()), sw_cpu_model(), o->precise ? "true" : "false",
           o->precise ? 0 : sw_i8_min_tokens(), sw_prefetch_one_token() ? "true" : "false", sw_kv_type_name(o->kv_type),
           o->depth, (unsigned long long)m->weight_bytes, peak, o->n_prompt, prefill, r->prefill_gmac);
    for (int i = 0; i < o->n_batches; i++)
        printf("%s{\"batch\":%d,\"tokens_per_s\":%.2f,\"gb_per_s\":%.6g,\"weight_bytes_per_token\":%llu,"
               "\"kv_bytes_per_step\":%.0f,\"mem_read_beside_gb_per_s\":%.2f,\"gmac_per_s\":%.6g}", i ? "," : "",
               res[i].batch, res[i].tok_s, res[i].gb_s,
               (unsigned long long)((res[i].step_bytes - res[i].kv_bytes) / res[i].batch), res[i].kv_bytes,
               res[i].mem_gb_s, res[i].gmac_s);
    /* mem_read_gb_per_s: the figure the batch-1 ratio is taken against */
    printf("],\"mem_read_gb_per_s\":%.2f,\"mem_read_best_gb_per_s\":%.2f", b1 ? b1->mem_gb_s : rm->best, rm->best);
    if (b1) {
        printf(",\"decode_b1_bw_fraction\":%.3f,\"decode_b1_bw_fraction_of_best\":%.3f,\"prefill_over_decode_b1\":%.2f",
               b1->gb_s / b1->mem_gb_s, b1->gb_s / rm->best, prefill / b1->tok_s);
        for (int i = 0; i < o->n_batches; i++)
            if (res[i].batch != 1) printf(",\"decode_b%d_over_b1\":%.2f", res[i].batch, res[i].tok_s / b1->tok_s);
        /* what the int8 peak would allow prefill at best, against batch 1 */
        if (peak > 0) printf(",\"prefill_at_int8_peak_over_decode_b1\":%.2f", r->prefill_ceiling / b1->tok_s);
    }
    if (peak > 0) printf(",\"prefill_fraction_of_int8_peak\":%.3f", r->prefill_gmac / peak);
    if (r->form_peak > 0)
        printf(",\"int8_form_peak_gmac_per_s\":%.1f,\"prefill_fraction_of_int8_form_peak\":%.3f", r->form_peak,
               r->prefill_gmac / r->form_peak);
    printf("}\n");
}

int main(int argc, char **argv)
{
    options o = parse_args(argc, argv);
    if (o.threads) omp_set_num_threads(o.threads);
    int threads = omp_get_max_threads();
    if (o.cpu) {
        printf("{\"isa\":\"%s\",\"best\":\"%s\",\"cpu\":\"%s\",\"cpu_model\":\"%s\",\"i8_min_tokens\":%d,"
               "\"prefetch_1tok\":%s}\n", sw_isa_name(sw_isa_active()), sw_isa_name(sw_isa_best()), sw_cpu_features(),
               sw_cpu_model(), sw_i8_min_tokens(), sw_prefetch_one_token() ? "true" : "false");
        return 0;
    }
    if (o.kernels) return bench_kernels(&o, threads);
    char err[1024];
    sw_model *m = sw_model_load(o.model, err, sizeof err);
    if (!m) { fprintf(stderr, "spillway-bench: %s\n", err); return 1; }
    char desc[256];
    sw_model_describe(m, desc, sizeof desc);
    fprintf(stderr, "spillway-bench: %s: %s, %.1f MiB of weights per token, isa %s, %d threads%s\n", o.model, desc,
            m->weight_bytes / 1048576.0, sw_isa_name(sw_isa_active()), threads, o.precise ? ", precise" : "");

    read_meter rm;
    if (meter_init(&rm, (size_t)o.mem_mib << 20)) {
        fprintf(stderr, "spillway-bench: out of memory for the %d MiB read buffer\n", o.mem_mib);
        return 1;
    }
    for (int i = 0; i < 3; i++) meter_pass(&rm);
    model_run r = { 0 };
    if (run_model(m, &o, &rm, &r)) return 1;
    for (int i = 0; i < 3; i++) meter_pass(&rm);

    print_table(&o, m, threads, &rm, &r);
    print_json(&o, m, threads, &rm, &r);
    fflush(stdout);
    if (rm.sink == 12345.678) fprintf(stderr, " ");   /* keeps the bandwidth sums alive */
    free(rm.buf);
    sw_model_free(m);
    return 0;
}
