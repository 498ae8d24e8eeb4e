/* spillway-bench: prefill and (batched) decode throughput of the CPU forward
 * pass, set against this machine's streaming-read bandwidth measured in the
 * same run (absolute figures move between runs on shared machines; the
 * ratios are what to compare).
 *
 *   spillway-bench -m MODEL [-t THREADS] [-p 512] [-n 128] [-b 1,4,16] [--mem-mib 1024]
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
#include "worker-cpu/forward.h"
#include "worker-cpu/kernels.h"
#include "worker-cpu/model.h"

#define MAX_BATCHES 16

typedef struct {
    const char *model;
    int threads, n_prompt, n_gen, mem_mib, precise;
    int batches[MAX_BATCHES], n_batches;
} options;

typedef struct { int batch; double tok_s, gb_s, step_ms, mem_gb_s; } decode_result;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: spillway-bench -m MODEL [-t THREADS] [-p N] [-n N] [-b B1,B2,...] [--mem-mib MIB] [--precise]\n"
        "  -p N        prompt tokens for the prefill measurement (default 512)\n"
        "  -n N        decode steps per batch size (default 128)\n"
        "  -b LIST     decode batch sizes (default 1,4,16)\n"
        "  --mem-mib   size of the streaming-read buffer (default 1024)\n"
        "  --precise   use residual-corrected activations (default: the serving path)\n");
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
        if (i + 1 >= argc) { fprintf(stderr, "spillway-bench: %s: missing value (or unknown option)\n", a); exit(2); }
        const char *v = argv[++i];
        if (!strcmp(a, "-m")) o.model = v;
        else if (!strcmp(a, "-t")) o.threads = (int)sw_cli_long("spillway-bench", a, v, 1, 1024);
        else if (!strcmp(a, "-p")) o.n_prompt = (int)sw_cli_long("spillway-bench", a, v, 1, 65536);
        else if (!strcmp(a, "-n")) o.n_gen = (int)sw_cli_long("spillway-bench", a, v, 1, 65536);
        else if (!strcmp(a, "-b")) parse_batches(&o, v);
        else if (!strcmp(a, "--mem-mib")) o.mem_mib = (int)sw_cli_long("spillway-bench", a, v, 16, 1 << 20);
        else { fprintf(stderr, "spillway-bench: unknown option '%s'\n", a); usage(stderr); exit(2); }
    }
    if (!o.model) { fprintf(stderr, "spillway-bench: -m MODEL is required\n"); usage(stderr); exit(2); }
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
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
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

/* Prefill: one prompt of n_prompt tokens, in one batch, logits for the last. */
static double bench_prefill(const sw_model *m, int n_prompt, int precise, uint32_t *rng)
{
    char err[256];
    sw_ctx *ctx = sw_ctx_new(m, 1, n_prompt, n_prompt, err, sizeof err);
    if (!ctx) { fprintf(stderr, "spillway-bench: %s\n", err); return -1; }
    if (precise) sw_ctx_set_precise(ctx, true);
    sw_tok_in *b = calloc((size_t)n_prompt, sizeof *b);
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof(float));
    for (int i = 0; i < n_prompt; i++) {
        *rng = *rng * 1664525u + 1013904223u;
        b[i] = (sw_tok_in){ .token = (int32_t)(*rng % m->hp.n_vocab), .pos = i, .seq = 0, .logits = i == n_prompt - 1 };
    }
    double t0 = sw_clock_s();
    int rc = run_batch(ctx, b, n_prompt, logits);
    double dt = sw_clock_s() - t0;
    free(b);
    free(logits);
    sw_ctx_free(ctx);
    return rc ? -1 : n_prompt / dt;
}

/* Decode: `batch` sequences, each one token per step from position 0, all in
 * one forward call per step (weights read once per step). The steps run in
 * segments of SEGMENT_STEPS with a streaming-read pass before each and after
 * the last; only the steps are timed for the decode rate, and the mean of
 * the passes is the bandwidth beside it. */
#define SEGMENT_STEPS 16
static int bench_decode(const sw_model *m, int batch, int n_gen, int precise, uint32_t *rng, read_meter *rm,
                        decode_result *out)
{
    char err[256];
    sw_ctx *ctx = sw_ctx_new(m, batch, n_gen, batch, err, sizeof err);
    if (!ctx) { fprintf(stderr, "spillway-bench: %s\n", err); return -1; }
    if (precise) sw_ctx_set_precise(ctx, true);
    sw_tok_in *b = calloc((size_t)batch, sizeof *b);
    float *logits = malloc((size_t)batch * m->hp.n_vocab * sizeof(float));
    int rc = 0, passes = 0;
    double dt = 0.0, bw = 0.0;
    for (int step = 0; step < n_gen && !rc; step++) {
        if (rm && step % SEGMENT_STEPS == 0) { bw += meter_pass(rm); passes++; }
        for (int s = 0; s < batch; s++) {
            /* the next token is the argmax, as in greedy decoding (cheap next to the step) */
            int32_t tok;
            if (step == 0) { *rng = *rng * 1664525u + 1013904223u; tok = (int32_t)(*rng % m->hp.n_vocab); }
            else tok = sw_argmax(logits + (size_t)s * m->hp.n_vocab, (int32_t)m->hp.n_vocab);
            b[s] = (sw_tok_in){ .token = tok, .pos = step, .seq = s, .logits = true };
        }
        double t0 = sw_clock_s();
        rc = run_batch(ctx, b, batch, logits);
        dt += sw_clock_s() - t0;
    }
    if (rm) { bw += meter_pass(rm); passes++; }
    out->batch = batch;
    out->tok_s = (double)batch * n_gen / dt;
    out->step_ms = dt / n_gen * 1e3;
    out->gb_s = (double)m->weight_bytes * n_gen / dt / 1e9;
    out->mem_gb_s = passes ? bw / passes : 0.0;
    free(b);
    free(logits);
    sw_ctx_free(ctx);
    return rc;
}

int main(int argc, char **argv)
{
    options o = parse_args(argc, argv);
    if (o.threads) omp_set_num_threads(o.threads);
    int threads = omp_get_max_threads();
    char err[1024];
    sw_model *m = sw_model_load(o.model, err, sizeof err);
    if (!m) { fprintf(stderr, "spillway-bench: %s\n", err); return 1; }
    const sw_hparams *hp = &m->hp;
    fprintf(stderr, "spillway-bench: %s: %u layers, dim %u, %u/%u heads, ffn %u, vocab %u, %s, %.1f MiB of weights per token, isa %s, %d threads%s\n",
            o.model, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->n_ff, hp->n_vocab, m->quant_name,
            m->weight_bytes / 1048576.0, sw_isa_name(sw_isa_active()), threads, o.precise ? ", precise" : "");

    read_meter rm;
    if (meter_init(&rm, (size_t)o.mem_mib << 20)) {
        fprintf(stderr, "spillway-bench: out of memory for the %d MiB read buffer\n", o.mem_mib);
        return 1;
    }
    for (int i = 0; i < 3; i++) meter_pass(&rm);

    uint32_t rng = 12345;
    /* Warm-up: fault the mapped weights in and settle the thread pool. */
    decode_result warm;
    if (bench_decode(m, 1, 4, o.precise, &rng, NULL, &warm)) return 1;

    double prefill = bench_prefill(m, o.n_prompt, o.precise, &rng);
    if (prefill < 0) return 1;
    decode_result res[MAX_BATCHES];
    for (int i = 0; i < o.n_batches; i++)
        if (bench_decode(m, o.batches[i], o.n_gen, o.precise, &rng, &rm, &res[i])) return 1;
    for (int i = 0; i < 3; i++) meter_pass(&rm);
    const decode_result *b1 = NULL;
    for (int i = 0; i < o.n_batches; i++) if (res[i].batch == 1) b1 = &res[i];

    /* ---- table ---- */
    const char *name = strrchr(o.model, '/') ? strrchr(o.model, '/') + 1 : o.model;
    printf("model %s (%s), %d threads, isa %s%s\n", name, m->quant_name, threads,
           sw_isa_name(sw_isa_active()), o.precise ? ", precise activations" : "");
    printf("weights read per decode step: %.1f MiB (per token at batch 1: %llu bytes)\n",
           m->weight_bytes / 1048576.0, (unsigned long long)m->weight_bytes);
    printf("streaming read (%d MiB, %d threads): best pass of the run %.1f GB/s; \"beside\" = mean of the passes\n"
           "interleaved with that batch's steps (one per %d steps)\n", o.mem_mib, threads, rm.best, SEGMENT_STEPS);
    printf("%-18s %10s %9s %8s %12s %11s %11s\n", "test", "tokens/s", "ms/step", "GB/s", "beside GB/s", "of beside",
           "of best");
    printf("%-18s %10.1f %9s %8s %12s %11s %11s\n", "prefill", prefill, "-", "-", "-", "-", "-");
    for (int i = 0; i < o.n_batches; i++) {
        char label[32];
        snprintf(label, sizeof label, "decode batch %d", res[i].batch);
        printf("%-18s %10.1f %9.2f %8.1f %12.1f %10.0f%% %10.0f%%\n", label, res[i].tok_s, res[i].step_ms,
               res[i].gb_s, res[i].mem_gb_s, 100.0 * res[i].gb_s / res[i].mem_gb_s, 100.0 * res[i].gb_s / rm.best);
    }
    if (b1) {
        printf("prefill / decode(batch 1): %.2fx\n", prefill / b1->tok_s);
        for (int i = 0; i < o.n_batches; i++)
            if (res[i].batch != 1)
                printf("decode batch %d / batch 1 throughput: %.2fx\n", res[i].batch, res[i].tok_s / b1->tok_s);
    }

    /* ---- JSON ---- */
    printf("{\"model\":\"%s\",\"quantization\":\"%s\",\"threads\":%d,\"isa\":\"%s\",\"precise\":%s,"
           "\"weight_bytes_per_token\":%llu,\"prefill_tokens\":%d,\"prefill_tokens_per_s\":%.2f,\"decode\":[",
           name, m->quant_name, threads, sw_isa_name(sw_isa_active()), o.precise ? "true" : "false",
           (unsigned long long)m->weight_bytes, o.n_prompt, prefill);
    for (int i = 0; i < o.n_batches; i++)
        printf("%s{\"batch\":%d,\"tokens_per_s\":%.2f,\"gb_per_s\":%.2f,\"weight_bytes_per_token\":%llu,"
               "\"mem_read_beside_gb_per_s\":%.2f}", i ? "," : "", res[i].batch, res[i].tok_s, res[i].gb_s,
               (unsigned long long)(m->weight_bytes / (uint64_t)res[i].batch), res[i].mem_gb_s);
    /* mem_read_gb_per_s: the figure the batch-1 ratio is taken against */
    printf("],\"mem_read_gb_per_s\":%.2f,\"mem_read_best_gb_per_s\":%.2f", b1 ? b1->mem_gb_s : rm.best, rm.best);
    if (b1) {
        printf(",\"decode_b1_bw_fraction\":%.3f,\"decode_b1_bw_fraction_of_best\":%.3f,\"prefill_over_decode_b1\":%.2f",
               b1->gb_s / b1->mem_gb_s, b1->gb_s / rm.best, prefill / b1->tok_s);
        for (int i = 0; i < o.n_batches; i++)
            if (res[i].batch != 1) printf(",\"decode_b%d_over_b1\":%.2f", res[i].batch, res[i].tok_s / b1->tok_s);
    }
    printf("}\n");
    fflush(stdout);
    if (rm.sink == 12345.678) fprintf(stderr, " ");   /* keeps the bandwidth sums alive */
    free(rm.buf);
    sw_model_free(m);
    return 0;
}
