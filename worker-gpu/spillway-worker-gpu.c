/* spillway-worker-gpu: the GPU worker.
 *
 * Daemon:     spillway-worker-gpu --gateway EP [--gateway EP...] --pool NAME --model NAME=PATH
 *                 [--drain-timeout S] [--backend cuda|emulate] [--max-batch N] [--kv-blocks N]
 *                 [--kv-dtype bf16|fp8] [--max-tokens-per-step N] [--ctx N]
 *                 [--prefix-cache on|off]
 * Evaluation: spillway-worker-gpu --backend B -m MODEL --tokens 1,2,3 [--logits-out FILE]
 *             spillway-worker-gpu --backend B -m MODEL -p TEXT -n N [--temp T] [--seed S] [--repeat R]
 * Benchmark:  spillway-worker-gpu --backend B (--bench-shape 8b [--bench-layers L] | -m MODEL)
 *                 --bench-decode 1,8,64,256 [--bench-ctx N] [--bench-steps N]
 * Self-test:  spillway-worker-gpu --selftest   (cuda: GEMV vs cuBLASLt vs host)
 *
 * Text goes to stdout (the prompt, then the continuation); logs to stderr.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "llm/cli.h"
#include "llm/clock.h"
#include "llm/generate.h"
#include "proto/worker_link.h"
#include "llm/model.h"
#include "worker-gpu/backend.h"
#include "worker-gpu/scheduler.h"
#ifdef SW_HAVE_CUDA
#include "worker-gpu/cuda_api.h"
#endif

#define PROG "spillway-worker-gpu"

typedef struct {
    const char *gateways[SW_MAX_GATEWAYS];   /* --gateway, repeated: daemon mode */
    size_t n_gateways;
    uint32_t drain_timeout_ms;
    const char *backend, *pool, *model_spec, *model_path, *worker_id;
    const char *curve_secret, *gateway_key;   /* CURVE (docs/security.md): both or neither */
    const char *tokens, *logits_out, *ref_logits, *prompt, *bench_decode, *bench_shape;
    int n_predict, max_batch, max_tokens_per_step, n_ctx, threads, bench_layers, bench_ctx, bench_steps;
    long kv_blocks;
    sw_kv_dtype kv;
    float temp, top_p;
    int top_k;
    unsigned long long seed;
    int seed_set, selftest, quiet, no_prefix_cache, repeat;
} opts;

static void usage(FILE *f)
{
    fprintf(f,
        "usage:\n"
        "  " PROG " --gateway EP --pool NAME --model NAME=PATH [options]   (daemon)\n"
        "  " PROG " -m MODEL --tokens 1,2,3 [--logits-out FILE] [options]  (evaluate ids)\n"
        "  " PROG " -m MODEL -p TEXT [-n N] [--temp T] [--seed S] [options] (generate text)\n"
        "  " PROG " (--bench-shape 8b [--bench-layers L] | -m MODEL) --bench-decode 1,8,64,256\n"
        "  " PROG " --bench-shape 8b [--bench-layers L] --tokens 1,2,3 ...      (random weights)\n"
        "  " PROG " --selftest                                             (CUDA kernel cross-check)\n"
        "options:\n"
        "  --backend cuda|emulate     compute on the GPU (default) or emulate its FP8 numerics on the CPU\n"
        "  --max-batch N              running sequences at most (default 64)\n"
        "  --kv-blocks N              KV cache blocks of %d positions (default: cuda most free memory,\n"
        "                             emulate 8 x the context)\n"
        "  --kv-dtype bf16|fp8        KV cache element type (default bf16)\n"
        "  --max-tokens-per-step N    token budget of one scheduler step (default 512)\n"
        "  --ctx N                    per-sequence context (default: the model's)\n"
        "  --prefix-cache on|off      share the KV blocks of prompt prefixes computed before (default on)\n"
        "  --worker-id ID             (default host-pid-random)\n"
        "  --curve-secret FILE        this worker's CURVE keypair (spillway keygen; mode 0600)\n"
        "  --gateway-key FILE|Z85     the gateway's CURVE public key: its .pub file or the Z85 text\n"
        "  --gateway EP               repeat it to serve several gateways (up to 8), each told the whole load\n"
        "  --drain-timeout S          on SIGTERM, finish the requests in hand for at most S seconds\n"
        "                             (default 120; a second SIGTERM stops at once)\n"
        "  -t, --threads N            CPU threads for the emulation backend\n"
        "  -n N, --temp T, --top-k K, --top-p P, --seed S   generation (text mode)\n"
        "  --repeat R                 text mode: run the request R times in one engine; runs 2..R take\n"
        "                             the prompt from the prefix cache and must give the same text\n"
        "  --ref-logits FILE          with --tokens: compare with float32 reference logits (rows x vocab)\n"
        "                             and print 'compare: ... min_cosine C top1 T'\n"
        "  --bench-ctx N (default 512), --bench-steps N (default 32)\n"
        "  -q                         fewer log lines\n", SW_KV_BLOCK);
}

static long parse_int(const char *flag, const char *s, long lo, long hi)
{
    return sw_cli_long(PROG, flag, s, lo, hi);
}

static double parse_num(const char *flag, const char *s, double lo, double hi)
{
    return sw_cli_double(PROG, flag, s, lo, hi);
}

static void check_opts(const opts *o);

static opts parse_args(int argc, char **argv)
{
    opts o = { .backend = "cuda", .n_predict = 128, .max_batch = 64, .max_tokens_per_step = 512,
               .kv = SW_KV_BF16, .temp = 0.8f, .top_p = 0.0f, .bench_ctx = 512, .bench_steps = 32 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKES(name) (!strcmp(a, name) && (v ? (i++, 1) : (sw_cli_die(PROG, "%s: missing value", a), 0)))
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
        else if (!strcmp(a, "--selftest")) o.selftest = 1;
        else if (!strcmp(a, "-q")) o.quiet = 1;
        else if (TAKES("--backend")) {
            if (strcmp(v, "cuda") && strcmp(v, "emulate")) sw_cli_die(PROG, "--backend: '%s' is not cuda or emulate", v);
            o.backend = v;
        }
        else if (TAKES("--gateway")) {
            char err[96];
            if (sw_gateway_list_add(o.gateways, &o.n_gateways, v, err, sizeof err) != 0)
                sw_cli_die(PROG, "--gateway: %s", err);
        }
        else if (TAKES("--drain-timeout")) {
            long sec = parse_int(a, v, 0, 86400);
            o.drain_timeout_ms = sec ? (uint32_t)sec * 1000 : 1;   /* 0 s: stop at once (1 ms) */
        }
        else if (TAKES("--pool")) o.pool = v;
        else if (TAKES("--model")) o.model_spec = v;
        else if (TAKES("-m")) o.model_path = v;
        else if (TAKES("--worker-id")) o.worker_id = v;
        else if (TAKES("--curve-secret")) o.curve_secret = v;
        else if (TAKES("--gateway-key")) o.gateway_key = v;
        else if (TAKES("--tokens")) o.tokens = v;
        else if (TAKES("--logits-out")) o.logits_out = v;
        else if (TAKES("--ref-logits")) o.ref_logits = v;
        else if (TAKES("-p") || TAKES("--prompt")) o.prompt = v;
        else if (TAKES("-n")) o.n_predict = (int)parse_int(a, v, 0, 1 << 20);
        else if (TAKES("--repeat")) o.repeat = (int)parse_int(a, v, 1, 100);
        else if (TAKES("--temp")) o.temp = (float)parse_num(a, v, 0, 100);
        else if (TAKES("--top-k")) o.top_k = (int)parse_int(a, v, 0, INT32_MAX);
        else if (TAKES("--top-p")) o.top_p = (float)parse_num(a, v, 0, 1);
        else if (TAKES("--seed")) { o.seed = sw_cli_u64(PROG, a, v); o.seed_set = 1; }
        else if (TAKES("--max-batch")) o.max_batch = (int)parse_int(a, v, 1, 4096);
        else if (TAKES("--kv-blocks")) o.kv_blocks = parse_int(a, v, 1, 1 << 24);
        else if (TAKES("--kv-dtype")) {
            if (!strcmp(v, "bf16")) o.kv = SW_KV_BF16;
            else if (!strcmp(v, "fp8")) o.kv = SW_KV_FP8;
            else sw_cli_die(PROG, "--kv-dtype: '%s' is not bf16 or fp8", v);
        }
        else if (TAKES("--max-tokens-per-step")) o.max_tokens_per_step = (int)parse_int(a, v, 1, 65536);
        else if (TAKES("--ctx")) o.n_ctx = (int)parse_int(a, v, 2, 1 << 24);
        else if (TAKES("--prefix-cache")) {
            bool on;
            if (!sw_parse_on_off(v, &on)) sw_cli_die(PROG, "--prefix-cache: '%s' is not on or off", v);
            o.no_prefix_cache = !on;
        }
        else if (TAKES("-t") || TAKES("--threads")) o.threads = (int)parse_int(a, v, 1, 1024);
        else if (TAKES("--bench-decode")) o.bench_decode = v;
        else if (TAKES("--bench-shape")) {
            if (strcmp(v, "8b")) sw_cli_die(PROG, "--bench-shape: '%s' is not a known shape (8b)", v);
            o.bench_shape = v;
        }
        else if (TAKES("--bench-layers")) o.bench_layers = (int)parse_int(a, v, 1, 1024);
        else if (TAKES("--bench-ctx")) o.bench_ctx = (int)parse_int(a, v, 1, 1 << 20);
        else if (TAKES("--bench-steps")) o.bench_steps = (int)parse_int(a, v, 1, 100000);
        else if (a[0] == '-') sw_cli_die(PROG, "unknown option '%s'", a);
        else sw_cli_die(PROG, "unexpected argument '%s'", a);
#undef TAKES
    }
    check_opts(&o);
    if (!o.seed_set) o.seed = (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 16);
    return o;
}

/* The rules across options, once all are read; exits on a broken one. */
static void check_opts(const opts *op)
{
    opts o = *op;
    int modes = !!o.n_gateways + !!o.tokens + !!o.prompt + !!o.bench_decode + o.selftest;
    if (modes != 1) {
        fprintf(stderr, PROG ": choose one mode: --gateway (daemon), --tokens, -p, --bench-decode or --selftest\n");
        usage(stderr);
        exit(2);
    }
    if (o.n_gateways) {
        if (!o.pool || !o.model_spec) sw_cli_die(PROG, "daemon mode needs --pool and --model NAME=PATH");
        const char *eq = strchr(o.model_spec, '=');
        if (!eq || eq == o.model_spec || !eq[1]) sw_cli_die(PROG, "--model: '%s' is not NAME=PATH", o.model_spec);
        if (o.model_path) sw_cli_die(PROG, "-m is for the evaluation modes; the daemon takes --model NAME=PATH");
    } else if (o.model_spec) {
        sw_cli_die(PROG, "--model NAME=PATH is for daemon mode (with --gateway); use -m MODEL");
    }
    if (o.prompt && !o.model_path) sw_cli_die(PROG, "-m MODEL is required");
    if (o.tokens && !o.model_path == !o.bench_shape) sw_cli_die(PROG, "--tokens needs -m MODEL (or --bench-shape 8b for random weights)");
    if ((o.logits_out || o.ref_logits) && !o.tokens) sw_cli_die(PROG, "--logits-out and --ref-logits need --tokens");
    if (o.bench_decode && !o.model_path == !o.bench_shape) sw_cli_die(PROG, "--bench-decode needs either -m MODEL or --bench-shape 8b");
    if (o.bench_shape && !o.tokens && !o.bench_decode) sw_cli_die(PROG, "--bench-shape goes with --bench-decode or --tokens");
    if (o.bench_layers && !o.bench_shape) sw_cli_die(PROG, "--bench-layers needs --bench-shape");
    if (!o.curve_secret != !o.gateway_key) sw_cli_die(PROG, "--curve-secret and --gateway-key go together");
    if (o.curve_secret && !o.n_gateways) sw_cli_die(PROG, "--curve-secret and --gateway-key are for daemon mode");
}

/* Fails fast when the cuda backend cannot run here. */
static void check_backend(const opts *o)
{
    if (strcmp(o->backend, "cuda")) return;
#ifdef SW_HAVE_CUDA
    char err[256];
    if (sw_cuda_device_count(err, sizeof err) <= 0) {
        fprintf(stderr, PROG ": no CUDA device found (%s); use --backend emulate to run on the CPU\n", err);
        exit(1);
    }
    char info[256];
    sw_cuda_device_info(info, sizeof info);
    if (!o->quiet) fprintf(stderr, PROG ": %s\n", info);
#else
    fprintf(stderr, PROG ": no CUDA device found (this build has no CUDA support: nvcc was not found "
                    "when it was built); use --backend emulate to run on the CPU\n");
    exit(1);
#endif
}

static sw_backend *make_backend(const opts *o, sw_fp8_weights *w, uint32_t kv_blocks, int max_tok)
{
    char err[512];
    sw_backend *be;
#ifdef SW_HAVE_CUDA
    if (!strcmp(o->backend, "cuda"))
        be = sw_cuda_backend_new(w, kv_blocks, o->kv, max_tok, err, sizeof err);
    else
#endif
        be = sw_emu_backend_new(w, kv_blocks, o->kv, max_tok, err, sizeof err);
    if (!be) fprintf(stderr, PROG ": %s\n", err);
    return be;
}

static sw_model *load_model(const char *path, sw_fp8_weights **w, int quiet)
{
    char err[512];
    sw_model *m = sw_model_load(path, err, sizeof err);
    if (!m) { fprintf(stderr, PROG ": %s\n", err); return NULL; }
    if (sw_model_is_encoder(m)) {   /* no decoder weights to convert; run_daemon says the same of any embedding model */
        fprintf(stderr, PROG ": %s is an embedding model (pooling %s, a %s encoder): serve it with "
                "spillway-worker-cpu, which computes embeddings; this worker does not\n", path,
                sw_pooling_name(m->hp.pooling), m->arch);
        sw_model_free(m);
        return NULL;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    *w = sw_fp8_weights_from_model(m, err, sizeof err);
    if (!*w) { fprintf(stderr, PROG ": %s: %s\n", path, err); sw_model_free(m); return NULL; }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const sw_hparams *hp = &m->hp;
    if (!quiet)
        fprintf(stderr, PROG ": %s: %s, %u layers, dim %u, %u/%u heads, ffn %u, vocab %u -> FP8 E4M3 "
                "per-row scales, %.1f MiB, converted in %.2f s\n", path, m->quant_name, hp->n_layer,
                hp->n_embd, hp->n_head, hp->n_head_kv, hp->n_ff, hp->n_vocab,
                (*w)->fp8_bytes / 1048576.0, (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
    return m;
}

/* The weights --tokens runs: random ones of the 8b shape (--bench-shape:
 * for comparing backends, no file needed) or the model's (*m, to free
 * after). NULL after printing why. */
static sw_fp8_weights *tokens_weights(const opts *o, sw_model **m)
{
    sw_fp8_weights *w;
    if (o->bench_shape) {
        char err[256];
        sw_hparams shp;
        sw_hparams_8b(&shp, (uint32_t)o->bench_layers);
        if (!(w = sw_fp8_weights_random(&shp, 1234, err, sizeof err))) {
            fprintf(stderr, PROG ": %s\n", err);
            return NULL;
        }
    } else if (!(*m = load_model(o->model_path, &w, o->quiet))) {
        return NULL;
    }
    return w;
}

/* Whether every one of the n ids is below n_vocab; prints the first that is not. */
static bool ids_in_vocab(const int32_t *ids, int n, uint32_t n_vocab)
{
    for (int i = 0; i < n; i++)
        if ((uint32_t)ids[i] >= n_vocab) {
            fprintf(stderr, PROG ": --tokens: id %d out of range (vocabulary %u)\n", ids[i], n_vocab);
            return false;
        }
    return true;
}

/* --ref-logits: the reference file and what the rows so far agree on. */
typedef struct {
    FILE *rf;
    float *ref;              /* one reference row */
    double min_cos, sum_cos;
    int top1;                /* rows whose argmax matches */
} ref_compare;

/* Compares nb rows of logits (V wide) with the next rows of the reference
 * (n rows in all); 1 when the reference ran short, else 0. */
static int compare_rows(const opts *o, ref_compare *cmp, const float *logits, int nb, uint32_t V, int n)
{
    const float *ref = cmp->ref;
    for (int i = 0; i < nb; i++) {
        if (fread(cmp->ref, sizeof(float), V, cmp->rf) != V) {
            fprintf(stderr, PROG ": %s: shorter than %d rows of %u floats\n", o->ref_logits, n, V);
            return 1;
        }
        const float *g = logits + (size_t)i * V;
        double ab = 0, aa = 0, bb = 0;
        int ga = 0, ra = 0;
        for (uint32_t v = 0; v < V; v++) {
            ab += (double)g[v] * ref[v]; aa += (double)g[v] * g[v]; bb += (double)ref[v] * ref[v];
            if (g[v] > g[ga]) ga = (int)v;
            if (ref[v] > ref[ra]) ra = (int)v;
        }
        double c = ab / (sqrt(aa * bb) + 1e-30);
        if (c < cmp->min_cos) cmp->min_cos = c;
        cmp->sum_cos += c;
        cmp->top1 += ga == ra;
    }
    return 0;
}

/* No output file: the argmax of the last position's row. */
static void print_argmax(const float *row, uint32_t V)
{
    int best = 0;
    for (uint32_t v = 1; v < V; v++) if (row[v] > row[best]) best = (int)v;
    printf("%d\n", best);
}

/* ---- --tokens: every position's logits ---- */
static int run_tokens(const opts *o)
{
    int n;
    int32_t *ids = sw_cli_ids(PROG, "--tokens", o->tokens, INT32_MAX, &n);
    sw_model *m = NULL;
    sw_fp8_weights *w = tokens_weights(o, &m);
    if (!w) {
        free(ids);
        return 1;
    }
    if (!ids_in_vocab(ids, n, w->hp.n_vocab)) {
        free(ids); sw_fp8_weights_free(w); sw_model_free(m);
        return 2;
    }
    int max_tok = o->max_tokens_per_step;
    uint32_t blocks = o->kv_blocks ? (uint32_t)o->kv_blocks : (uint32_t)((n + SW_KV_BLOCK - 1) / SW_KV_BLOCK);
    if ((long)blocks * SW_KV_BLOCK < n) {
        fprintf(stderr, PROG ": --kv-blocks %u hold %u positions, fewer than the %d tokens\n", blocks, blocks * SW_KV_BLOCK, n);
        free(ids); sw_fp8_weights_free(w); sw_model_free(m);
        return 2;
    }
    sw_backend *be = make_backend(o, w, blocks, max_tok);
    if (!be) { free(ids); sw_model_free(m); return 1; }
    FILE *lf = NULL;
    if (o->logits_out && !(lf = fopen(o->logits_out, "wb"))) {
        fprintf(stderr, PROG ": %s: %s\n", o->logits_out, strerror(errno));
        free(ids); sw_backend_free(be); sw_model_free(m);
        return 1;
    }
    uint32_t V = be->hp.n_vocab;
    int32_t *table = malloc(blocks * sizeof(int32_t)), *pos = malloc((size_t)max_tok * sizeof(int32_t)),
            *seqs = calloc((size_t)max_tok, sizeof(int32_t)), *lidx = malloc((size_t)max_tok * sizeof(int32_t));
    float *logits = malloc((size_t)max_tok * V * sizeof(float));
    int rc = 0;
    ref_compare cmp = { .min_cos = 2.0 };
    if (o->ref_logits) {
        cmp.rf = fopen(o->ref_logits, "rb");
        cmp.ref = malloc((size_t)V * sizeof(float));
        if (!cmp.rf || !cmp.ref) { fprintf(stderr, PROG ": %s: %s\n", o->ref_logits, cmp.rf ? "out of memory" : strerror(errno)); rc = 1; }
    }
    if (!table || !pos || !seqs || !lidx || !logits) { fprintf(stderr, PROG ": out of memory\n"); rc = 1; }
    for (uint32_t i = 0; table && i < blocks; i++) table[i] = (int32_t)i;
    for (int start = 0; !rc && start < n; start += max_tok) {
        int nb = n - start < max_tok ? n - start : max_tok;
        for (int i = 0; i < nb; i++) { pos[i] = start + i; lidx[i] = i; }
        sw_batch b = { .n_tokens = nb, .tokens = ids + start, .pos = pos, .seq = seqs, .n_seqs = 1,
                       .max_blocks = (int)blocks, .block_table = table, .n_logits = nb, .logits_idx = lidx };
        char err[256];
        if (be->ops->forward(be->impl, &b, logits, err, sizeof err)) {
            fprintf(stderr, PROG ": %s\n", err);
            rc = 1;
            break;
        }
        if (lf && fwrite(logits, sizeof(float) * V, (size_t)nb, lf) != (size_t)nb) {
            fprintf(stderr, PROG ": %s: write failed\n", o->logits_out);
            rc = 1;
        }
        if (cmp.rf && !rc) rc = compare_rows(o, &cmp, logits, nb, V, n);
        if (!lf && !cmp.rf && start + nb == n) print_argmax(logits + (size_t)(nb - 1) * V, V);
    }
    if (lf && fclose(lf)) { fprintf(stderr, PROG ": %s: %s\n", o->logits_out, strerror(errno)); rc = 1; }
    if (cmp.rf) {
        if (!rc) printf("compare: rows %d min_cosine %.5f mean_cosine %.5f top1 %.4f\n", n, cmp.min_cos,
                        cmp.sum_cos / n, (double)cmp.top1 / n);
        fclose(cmp.rf);
    }
    free(cmp.ref);
    free(table); free(pos); free(seqs); free(lidx); free(logits); free(ids);
    sw_backend_free(be);
    sw_model_free(m);
    return rc;
}

/* ---- -p TEXT: generation through the scheduler, as the daemon does ---- */
typedef struct {
    int state;                /* finish reason, or -1 on failure */
    bool print;               /* the first run streams to stdout */
    char text[65536];         /* what this run generated (truncated) */
    size_t len;
    sw_usage usage;
} prompt_run;

static void print_emit(void *ctx, const char *id, const sw_out *o, const uint32_t *ids, size_t n_ids, int finish,
                       const sw_usage *usage)
{
    prompt_run *r = ctx;
    const char *text = o->text;
    size_t n = text ? strlen(text) : 0;
    if (n && r->print) { fputs(text, stdout); fflush(stdout); }
    if (n > sizeof r->text - 1 - r->len) n = sizeof r->text - 1 - r->len;
    memcpy(r->text + r->len, text ? text : "", n);
    r->len += n;
    r->text[r->len] = 0;
    if (finish) { r->state = finish; r->usage = *usage; }
}

static void print_fail(void *ctx, const char *id, uint32_t code, const char *msg)
{
    fprintf(stderr, PROG ": request failed (%u): %s\n", code, msg);
    ((prompt_run *)ctx)->state = -1;
}

static int run_prompt(const opts *o)
{
    sw_fp8_weights *w;
    sw_model *m = load_model(o->model_path, &w, o->quiet);
    if (!m) return 1;
    uint32_t blocks = (uint32_t)o->kv_blocks;
    if (!blocks) {
        int ctx = o->n_ctx ? o->n_ctx : (int)m->hp.n_ctx_train;
        blocks = (uint32_t)((ctx + SW_KV_BLOCK - 1) / SW_KV_BLOCK);
    }
    sw_backend *be = make_backend(o, w, blocks, o->max_tokens_per_step);
    if (!be) { sw_model_free(m); return 1; }
    char err[512];
    sw_sched_config cfg = { .max_batch = 1, .max_tokens_per_step = o->max_tokens_per_step, .n_ctx = o->n_ctx };
    sw_gpu_engine *e = sw_gpu_engine_new(m, be, &cfg, err, sizeof err);
    if (!e) { fprintf(stderr, PROG ": %s\n", err); sw_backend_free(be); sw_model_free(m); return 1; }

    Spillway__GenerateRequest req = SPILLWAY__GENERATE_REQUEST__INIT;
    Spillway__SamplingParams sp = SPILLWAY__SAMPLING_PARAMS__INIT;
    sp.temperature = o->temp;
    sp.top_k = (uint32_t)o->top_k;
    sp.top_p = o->top_p;
    sp.seed = o->seed;
    sp.has_seed = 1;
    req.prompt = (char *)o->prompt;
    req.sampling = &sp;
    req.max_tokens = (uint32_t)o->n_predict;
    sw_gpu_engine_set_prefix_cache(e, !o->no_prefix_cache);
    static prompt_run first, again;
    int rc = 0;
    if (o->n_predict == 0) {
        fputs(o->prompt, stdout);
    } else {
        fputs(o->prompt, stdout);
        fflush(stdout);
        /* Run 1 streams to stdout. Runs 2..R (--repeat) find the prompt in
         * the prefix cache; with the same seed their text must not change. */
        for (int k = 0; k < (o->repeat > 1 ? o->repeat : 1) && !rc; k++) {
            prompt_run *r = k ? &again : &first;
            memset(r, 0, sizeof *r);
            r->print = k == 0;
            char id[16];
            snprintf(id, sizeof id, "cli%d", k);
            req.request_id = id;
            if (sw_gpu_engine_ops.submit(e, &req, err, sizeof err)) {
                fprintf(stderr, PROG ": %s\n", err);
                rc = 1;
                break;
            }
            while (sw_gpu_engine_ops.step(e, print_emit, print_fail, r) > 0) {}
            rc = r->state < 0;
            if (k && !rc) {
                bool same = r->len == first.len && !memcmp(r->text, first.text, r->len);
                fprintf(stderr, PROG ": repeat %d: %u of %u prompt tokens from the prefix cache, text %s\n", k + 1,
                        r->usage.cached_tokens, r->usage.prompt_tokens, same ? "the same" : "DIFFERS");
                rc = !same;
            }
        }
    }
    printf("\n");
    sw_gpu_engine_free(e);
    sw_backend_free(be);
    sw_model_free(m);
    return rc;
}

/* The weights --bench-decode runs: random ones of the 8b shape
 * (--bench-shape) or the model's (*m, to free after). NULL after printing why. */
static sw_fp8_weights *bench_weights(const opts *o, sw_model **m)
{
    sw_fp8_weights *w;
    char err[512];
    if (o->bench_shape) {
        sw_hparams hp;
        sw_hparams_8b(&hp, (uint32_t)o->bench_layers);
        double t0 = sw_clock_s();
        w = sw_fp8_weights_random(&hp, 1234, err, sizeof err);
        if (!w) { fprintf(stderr, PROG ": %s\n", err); return NULL; }
        fprintf(stderr, PROG ": random FP8 weights, 8b shape with %u layers: %.2f GB, made in %.1f s\n",
                hp.n_layer, w->fp8_bytes / 1e9, sw_clock_s() - t0);
    } else if (!(*m = load_model(o->model_path, &w, o->quiet))) {
        return NULL;
    }
    return w;
}

/* The step buffers of --bench-decode, for the largest batch. */
typedef struct {
    int32_t *tok, *pos, *seq, *lidx, *out, *table;
    sw_dev_sample *sp;
    float *logits;       /* NULL when the backend samples on the device */
    int per_seq;         /* KV blocks a sequence may use */
} bench_bufs;

/* Seconds per decode step of B sequences at position ctx onwards: 3
 * warm-up steps, then `steps` timed. -1 after printing a failure. */
static double time_decode(sw_backend *be, const bench_bufs *bb, int B, int ctx, int steps, uint32_t n_vocab)
{
    char err[512];
    int warm = 3;
    double t0 = 0;
    for (int s = 0; s < warm + steps; s++) {
        if (s == warm) t0 = sw_clock_s();
        for (int i = 0; i < B; i++) {
            bb->tok[i] = (i * 7919 + s * 31) % (int)n_vocab;
            bb->pos[i] = ctx + s;
            bb->seq[i] = i;
            bb->lidx[i] = i;
            bb->sp[i] = (sw_dev_sample){ .temperature = 0 };
        }
        sw_batch b = { .n_tokens = B, .tokens = bb->tok, .pos = bb->pos, .seq = bb->seq, .n_seqs = B,
                       .max_blocks = bb->per_seq, .block_table = bb->table, .n_logits = B, .logits_idx = bb->lidx };
        int r = be->ops->forward_sample ? be->ops->forward_sample(be->impl, &b, bb->sp, bb->out, err, sizeof err)
                                        : be->ops->forward(be->impl, &b, bb->logits, err, sizeof err);
        if (r) { fprintf(stderr, PROG ": batch %d: %s\n", B, err); return -1; }
    }
    return (sw_clock_s() - t0) / steps;
}

/* ---- --bench-decode ---- */
static int run_bench(const opts *o)
{
    int n_b;
    int32_t *batches = sw_cli_ids(PROG, "--bench-decode", o->bench_decode, 65536, &n_b);
    int maxb = 0;
    for (int i = 0; i < n_b; i++) {
        if (batches[i] < 1) sw_cli_die(PROG, "--bench-decode: batch sizes must be >= 1");
        if (batches[i] > maxb) maxb = batches[i];
    }
    sw_model *m = NULL;
    sw_fp8_weights *w = bench_weights(o, &m);
    if (!w) return 1;
    const sw_hparams hp = w->hp;
    uint64_t weight_bytes = w->fp8_bytes - (uint64_t)hp.n_vocab * hp.n_embd * 2;  /* embedding rows are gathered, not streamed */
    uint32_t kv_dim = w->kv_dim;
    int ctx = o->bench_ctx;
    int per_seq = (ctx + o->bench_steps + SW_KV_BLOCK) / SW_KV_BLOCK + 1;
    uint32_t blocks = (uint32_t)(per_seq * maxb);
    sw_backend *be = make_backend(o, w, blocks, maxb);
    if (!be) { sw_model_free(m); free(batches); return 1; }

    double copy_gbs = -1;
#ifdef SW_HAVE_CUDA
    char err[512];
    if (!strcmp(o->backend, "cuda")) copy_gbs = sw_cuda_copy_bandwidth((size_t)2 << 30, 10, err, sizeof err);
    if (copy_gbs < 0 && !strcmp(o->backend, "cuda")) fprintf(stderr, PROG ": copy bandwidth: %s\n", err);
#endif
    int32_t *tok = malloc((size_t)maxb * sizeof(int32_t)), *pos = malloc((size_t)maxb * sizeof(int32_t)),
            *seq = malloc((size_t)maxb * sizeof(int32_t)), *lidx = malloc((size_t)maxb * sizeof(int32_t)),
            *out = malloc((size_t)maxb * sizeof(int32_t)),
            *table = malloc((size_t)maxb * per_seq * sizeof(int32_t));
    sw_dev_sample *sp = calloc((size_t)maxb, sizeof *sp);
    float *logits = be->ops->forward_sample ? NULL : malloc((size_t)maxb * hp.n_vocab * sizeof(float));
    if (!tok || !pos || !seq || !lidx || !out || !table || !sp || (!be->ops->forward_sample && !logits)) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    for (int i = 0; i < maxb * per_seq; i++) table[i] = i;
    printf("%-7s %10s %10s %10s %8s\n", "batch", "step_ms", "tok/s", "GB/s", "%copy");
    char json[4096];
    int jl = snprintf(json, sizeof json, "{\"bench\":\"decode\",\"backend\":\"%s\",\"layers\":%u,\"n_embd\":%u,"
                      "\"weight_bytes\":%llu,\"ctx\":%d,\"copy_gb_s\":%.1f,\"results\":[",
                      be->ops->name, hp.n_layer, hp.n_embd, (unsigned long long)weight_bytes, ctx, copy_gbs);
    int rc = 0;
    const bench_bufs bb = { tok, pos, seq, lidx, out, table, sp, logits, per_seq };
    for (int bi = 0; bi < n_b && !rc; bi++) {
        int B = batches[bi];
        int steps = o->bench_steps;
        double dt = time_decode(be, &bb, B, ctx, steps, hp.n_vocab);
        if (dt < 0) { rc = 1; break; }
        /* bytes a step must move: every weight once, plus each sequence's K and V */
        double kv_bytes = (double)B * (ctx + steps / 2.0) * kv_dim * 2 * hp.n_layer * (o->kv == SW_KV_FP8 ? 1 : 2);
        double gbs = (weight_bytes + kv_bytes) / dt / 1e9;
        double pct = copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 0;
        printf("%-7d %10.3f %10.1f %10.1f %8.1f\n", B, dt * 1e3, B / dt, gbs, pct);
        fflush(stdout);
        jl += snprintf(json + jl, sizeof json - (size_t)jl, "%s{\"batch\":%d,\"step_ms\":%.4f,\"tok_s\":%.1f,\"gb_s\":%.1f,\"pct_copy\":%.1f}",
                       bi ? "," : "", B, dt * 1e3, B / dt, gbs, pct);
    }
    snprintf(json + jl, sizeof json - (size_t)jl, "]}");
    printf("%s\n", json);
    free(tok); free(pos); free(seq); free(lidx); free(out); free(table); free(sp); free(logits); free(batches);
    sw_backend_free(be);
    sw_model_free(m);
    return rc;
}

/* ---- daemon ---- */
static int run_daemon(const opts *o)
{
    char name[256], err[512];
    const char *eq = strchr(o->model_spec, '=');
    snprintf(name, sizeof name, "%.*s", (int)(eq - o->model_spec), o->model_spec);
    sw_fp8_weights *w;
    sw_model *m = load_model(eq + 1, &w, o->quiet);
    if (!m) return 1;
    if (sw_model_is_embedding(m)) {   /* it would be served for generation, which it is not for */
        fprintf(stderr, PROG ": %s is an embedding model (pooling %s): serve it with spillway-worker-cpu, "
                "which computes embeddings; this worker does not\n", eq + 1, sw_pooling_name(m->hp.pooling));
        sw_fp8_weights_free(w);
        sw_model_free(m);
        return 1;
    }
    sw_backend *be = make_backend(o, w, (uint32_t)o->kv_blocks, o->max_tokens_per_step);
    if (!be) { sw_model_free(m); return 1; }
    sw_sched_config cfg = { .max_batch = o->max_batch, .max_tokens_per_step = o->max_tokens_per_step,
                            .n_ctx = o->n_ctx, .model_name = name, .log_steps = !o->quiet };
    sw_gpu_engine *e = sw_gpu_engine_new(m, be, &cfg, err, sizeof err);
    if (!e) { fprintf(stderr, PROG ": %s\n", err); sw_backend_free(be); sw_model_free(m); return 1; }
    sw_gpu_engine_set_prefix_cache(e, !o->no_prefix_cache);
    fprintf(stderr, PROG ": backend %s, %u KV blocks (%s), context %d, max batch %d, %d tokens/step\n",
            be->ops->name, be->n_kv_blocks, o->kv == SW_KV_FP8 ? "fp8" : "bf16", sw_gpu_engine_n_ctx(e),
            o->max_batch, o->max_tokens_per_step);

    Spillway__ModelInfo mi = SPILLWAY__MODEL_INFO__INIT;
    mi.name = name;
    mi.quantization = "fp8";
    mi.context_length = (uint32_t)sw_gpu_engine_n_ctx(e);
    Spillway__ModelInfo *models[1] = { &mi };
    sw_worker_config wc = { .n_gateways = o->n_gateways, .drain_timeout_ms = o->drain_timeout_ms,
                            .pool = o->pool, .worker_id = o->worker_id,
                            .kind = SPILLWAY__WORKER_KIND__WORKER_KIND_GPU, .models = models, .n_models = 1,
                            .slots = (uint32_t)o->max_batch, .curve_secret_file = o->curve_secret,
                            .gateway_key = o->gateway_key };
    memcpy(wc.gateways, o->gateways, sizeof wc.gateways);
    int rc = sw_worker_run(&wc, &sw_gpu_engine_ops, e);
    sw_gpu_engine_free(e);
    sw_backend_free(be);
    sw_model_free(m);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    opts o = parse_args(argc, argv);
    if (o.threads) omp_set_num_threads(o.threads);
    if (o.selftest) {
#ifdef SW_HAVE_CUDA
        check_backend(&(opts){ .backend = "cuda" });
        char err[512];
        if (sw_cuda_selftest(err, sizeof err)) { fprintf(stderr, PROG ": selftest: %s\n", err); return 1; }
        fprintf(stderr, PROG ": selftest passed\n");
        return 0;
#else
        fprintf(stderr, PROG ": --selftest needs a CUDA build\n");
        return 1;
#endif
    }
    check_backend(&o);
    if (o.tokens) return run_tokens(&o);
    if (o.prompt) return run_prompt(&o);
    if (o.bench_decode) return run_bench(&o);
    return run_daemon(&o);
}
