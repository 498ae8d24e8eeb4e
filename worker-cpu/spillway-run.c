/* spillway-run: a single-process runner, like llama-cli.
 *
 *   spillway-run -m MODEL -p TEXT [-n N] [--temp T] [--seed S] [-t THREADS]
 *                [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [-c CTX]
 *   spillway-run -m MODEL --tokens 1,2,3 [--logits-out FILE] [-n N]
 *   spillway-run -m MODEL --tokenize TEXT
 *
 * Generated text goes to stdout (the prompt, then the continuation, streamed);
 * logs go to stderr. --logits-out writes the float32 logits of every evaluated
 * position, row after row. --tokenize needs only the vocabulary, so it works
 * on vocab-only GGUF files.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llm/cli.h"
#include "llm/clock.h"
#include "llm/generate.h"
#include "llm/gguf.h"
#include "llm/tokenizer.h"
#include "worker-cpu/forward.h"
#include "worker-cpu/kernels.h"
#include "llm/model.h"

#define PREFILL_CHUNK 512

typedef struct {
    const char *model, *prompt, *tokens, *logits_out, *tokenize;
    long n_predict;       /* -1: default */
    int threads, n_ctx;
    sw_sampling_params sp;
    bool seed_set;
    int precise;          /* -1: default (on with --logits-out), 0 off, 1 on */
    sw_kv_type kv_type;
} options;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: spillway-run -m MODEL [-p TEXT | --tokens ID,ID,... | --tokenize TEXT] [options]\n"
        "  -m, --model FILE        GGUF model\n"
        "  -p, --prompt TEXT       prompt; the prompt and its continuation go to stdout\n"
        "  -n, --n-predict N       tokens to generate (default 128; 0 with --tokens)\n"
        "  -t, --threads N         compute threads (default: all cores)\n"
        "  -c, --ctx-size N        context length (default: the model's, at most 4096)\n"
        "      --temp T            temperature, 0 = greedy (default 0.8)\n"
        "      --seed S            random seed (default: random)\n"
        "      --top-k K           (default 40, 0 = off)\n"
        "      --top-p P           (default 0.95, 1 = off)\n"
        "      --min-p P           (default 0.05, 0 = off)\n"
        "      --repeat-penalty R  (default 1.0 = off)\n"
        "      --tokens LIST       evaluate exactly these token ids (no BOS), as one batch\n"
        "      --logits-out FILE   write float32 logits of every evaluated position\n"
        "      --tokenize TEXT     print the token ids of TEXT (no BOS/EOS) and exit\n"
        "      --kv-cache f16|q8_0 the KV cache's element type (default f16)\n"
        "      --precise, --fast   activations: quantized with residual correction (float\n"
        "                          accuracy, up to 2x compute) or once, as served; default:\n"
        "                          precise with --logits-out, else fast\n");
}

#define PROG "spillway-run"

static long parse_long(const char *flag, const char *s, long lo, long hi)
{
    return sw_cli_long(PROG, flag, s, lo, hi);
}

static float parse_float(const char *flag, const char *s, float lo, float hi)
{
    return (float)sw_cli_double(PROG, flag, s, lo, hi);
}

static options parse_args(int argc, char **argv)
{
    options o = {0};
    o.n_predict = -1;
    o.precise = -1;
    o.sp.temperature = 0.8f;
    o.sp.top_k = 40;
    o.sp.top_p = 0.95f;
    o.sp.min_p = 0.05f;
    o.sp.repetition_penalty = 1.0f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
        if (!strcmp(a, "--precise")) { o.precise = 1; continue; }
        if (!strcmp(a, "--fast")) { o.precise = 0; continue; }
        if (i + 1 >= argc) {
            fprintf(stderr, "spillway-run: %s: %s\n", a, a[0] == '-' ? "missing value (or unknown option)" : "unexpected argument");
            usage(stderr);
            exit(2);
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o.model = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o.prompt = v;
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) o.n_predict = parse_long(a, v, 0, 1 << 24);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) o.threads = (int)parse_long(a, v, 1, 1024);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) o.n_ctx = (int)parse_long(a, v, 1, 1 << 24);
        else if (!strcmp(a, "--temp")) o.sp.temperature = parse_float(a, v, 0.0f, 100.0f);
        else if (!strcmp(a, "--seed")) { o.sp.seed = sw_cli_u64(PROG, a, v); o.seed_set = true; }
        else if (!strcmp(a, "--top-k")) o.sp.top_k = (int32_t)parse_long(a, v, 0, INT32_MAX);
        else if (!strcmp(a, "--top-p")) o.sp.top_p = parse_float(a, v, 0.0f, 1.0f);
        else if (!strcmp(a, "--min-p")) o.sp.min_p = parse_float(a, v, 0.0f, 1.0f);
        else if (!strcmp(a, "--repeat-penalty")) o.sp.repetition_penalty = parse_float(a, v, 0.0f, 100.0f);
        else if (!strcmp(a, "--tokens")) o.tokens = v;
        else if (!strcmp(a, "--logits-out")) o.logits_out = v;
        else if (!strcmp(a, "--tokenize")) o.tokenize = v;
        else if (!strcmp(a, "--kv-cache")) {
            if (!sw_kv_type_parse(v, &o.kv_type)) {
                fprintf(stderr, "spillway-run: --kv-cache: '%s' is not f16 or q8_0\n", v);
                exit(2);
            }
        }
        else {
            fprintf(stderr, "spillway-run: unknown option '%s'\n", a);
            usage(stderr);
            exit(2);
        }
    }
    if (!o.model) { fprintf(stderr, "spillway-run: -m MODEL is required\n"); usage(stderr); exit(2); }
    int modes = !!o.prompt + !!o.tokens + !!o.tokenize;
    if (modes > 1) { fprintf(stderr, "spillway-run: use only one of -p, --tokens, --tokenize\n"); exit(2); }
    if (o.tokenize && o.logits_out) { fprintf(stderr, "spillway-run: --logits-out does not apply to --tokenize\n"); exit(2); }
    if (!o.seed_set) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        o.sp.seed = (uint64_t)ts.tv_nsec * 2654435761u ^ (uint64_t)ts.tv_sec;
    }
    return o;
}

static int do_tokenize(const options *o)
{
    char err[512];
    gguf_file *f = gguf_open(o->model, err, sizeof err);
    if (!f) { fprintf(stderr, "spillway-run: %s: %s\n", o->model, err); return 1; }
    sw_tokenizer *tok = sw_tok_load(f, err, sizeof err);
    if (!tok) { fprintf(stderr, "spillway-run: %s: tokenizer: %s\n", o->model, err); gguf_close(f); return 1; }
    size_t len = strlen(o->tokenize);
    int cap = (int)len + 8;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int n = ids ? sw_tok_encode(tok, o->tokenize, len, false, false, ids, cap) : 0;
    if (n < 0) {
        cap = -n;
        int32_t *p = realloc(ids, (size_t)cap * sizeof *ids);
        if (p) { ids = p; n = sw_tok_encode(tok, o->tokenize, len, false, false, ids, cap); }
    }
    int rc = 0;
    if (!ids || n < 0) { fprintf(stderr, "spillway-run: tokenization failed\n"); rc = 1; }
    else {
        /* The vocab test files' form: each id preceded by a space. */
        for (int i = 0; i < n; i++) printf(" %d", ids[i]);
        printf("\n");
    }
    free(ids);
    sw_tok_free(tok);
    gguf_close(f);
    return rc;
}

static bool write_rows(FILE *f, const float *rows, size_t n_rows, uint32_t n_vocab)
{
    if (!f || !n_rows) return true;
    return fwrite(rows, sizeof(float) * n_vocab, n_rows, f) == n_rows;
}

/* Evaluates the prompt in chunks; with logits_out every position's logits are
 * written, otherwise only the last position's are computed. The last row ends
 * up in `last`. */
static int prefill(sw_ctx *ctx, const sw_model *m, const int32_t *ids, int n, FILE *lf,
                   float *logits, int max_batch, float *last)
{
    char err[256];
    sw_tok_in *batch = malloc((size_t)max_batch * sizeof *batch);
    if (!batch) return -1;
    for (int start = 0; start < n; start += max_batch) {
        int nb = n - start < max_batch ? n - start : max_batch;
        int nl = 0;
        for (int i = 0; i < nb; i++) {
            int p = start + i;
            batch[i] = (sw_tok_in){ .token = ids[p], .pos = p, .seq = 0, .logits = lf || p == n - 1 };
            nl += batch[i].logits;
        }
        if (sw_forward(ctx, batch, nb, logits, err, sizeof err)) {
            fprintf(stderr, "spillway-run: %s\n", err);
            free(batch);
            return -1;
        }
        if (lf && !write_rows(lf, logits, (size_t)nl, m->hp.n_vocab)) {
            fprintf(stderr, "spillway-run: writing logits failed\n");
            free(batch);
            return -1;
        }
        if (start + nb == n) memcpy(last, logits + (size_t)(nl - 1) * m->hp.n_vocab, m->hp.n_vocab * sizeof(float));
    }
    free(batch);
    return 0;
}

/* Samples up to n_predict tokens from `last` (the prompt's last logits),
 * printing each one's text and writing its logits to lf; *generated counts
 * them. Returns the exit code: 0, or 1 after an error it printed. */
static int generate(sw_ctx *ctx, sw_gen *g, uint32_t n_vocab, long n_predict, FILE *lf, float *last,
                    long *generated)
{
    char err[1024];
    while (*generated < n_predict) {
        int32_t tok = sw_gen_sample(g, last, (int32_t)n_vocab);
        if (tok < 0) {
            fprintf(stderr, "\nspillway-run: %s\n", sw_gen_error(g));
            return 1;
        }
        const char *delta;
        size_t dlen;
        int fin = sw_gen_accept(g, tok, &delta, &dlen);
        (*generated)++;
        if (dlen) { fwrite(delta, 1, dlen, stdout); fflush(stdout); }
        if (fin) break;
        sw_tok_in in = { .token = tok, .pos = sw_gen_next_pos(g), .seq = 0, .logits = true };
        if (sw_forward(ctx, &in, 1, last, err, sizeof err)) {
            fprintf(stderr, "spillway-run: %s\n", err);
            return 1;
        }
        if (lf && !write_rows(lf, last, 1, n_vocab)) {
            fprintf(stderr, "spillway-run: writing logits failed\n");
            return 1;
        }
    }
    return 0;
}

/* Evaluates the prompt, then generates; everything it allocates is freed on
 * every path (the sanitizer build checks for leaks). Returns the exit code. */
static int run_model(const options *o, sw_model *m)
{
    char err[1024];
    const sw_hparams *hp = &m->hp;
    int rc = 1;
    int32_t *ids = NULL;
    sw_ctx *ctx = NULL;
    float *logits = NULL, *last = NULL;
    FILE *lf = NULL;
    sw_gen *g = NULL;

    int n_ctx = o->n_ctx ? o->n_ctx : (int)(hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    const int run_ctx = n_ctx;   /* the context it runs at, whatever the cache is sized to */
    long n_predict = o->n_predict >= 0 ? o->n_predict : (o->tokens ? 0 : 128);

    /* The prompt as tokens. */
    sw_gen_params gp = { .sampling = o->sp, .max_tokens = (uint32_t)n_predict };
    if (o->tokens) {
        int n_ids = 0;
        ids = sw_cli_ids(PROG, "--tokens", o->tokens, INT32_MAX, &n_ids);
        gp.prompt_ids = ids;
        gp.n_prompt_ids = (size_t)n_ids;
        if (o->n_ctx == 0 && n_ids > n_ctx) n_ctx = n_ids;   /* evaluate what was asked */
    } else {
        gp.prompt = o->prompt ? o->prompt : "";
    }
    if (!(g = sw_gen_new(m->tok, m->chat, &gp, n_ctx, err, sizeof err))) {
        fprintf(stderr, "spillway-run: %s\n", err);
        goto out;
    }
    int n_prompt;
    const int32_t *prompt = sw_gen_prompt(g, &n_prompt);
    /* Context: room for the prompt and what we generate (no more, so the KV
     * cache stays small), within the chosen limit. */
    long need = (long)n_prompt + n_predict;
    if (need < n_ctx) n_ctx = (int)need;
    sw_gen_limit_ctx(g, n_ctx);
    /* --tokens evaluates everything as one batch, as the golden files were made. */
    int max_batch = o->tokens ? n_prompt : (n_prompt < PREFILL_CHUNK ? n_prompt : PREFILL_CHUNK);
    ctx = sw_ctx_new(m, 1, n_ctx, max_batch, err, sizeof err);
    if (!ctx) { fprintf(stderr, "spillway-run: %s\n", err); goto out; }
    if (sw_ctx_set_kv_type(ctx, o->kv_type, err, sizeof err)) {
        fprintf(stderr, "spillway-run: --kv-cache %s: %s\n", sw_kv_type_name(o->kv_type), err);
        goto out;
    }
    sw_ctx_set_rope_context(ctx, run_ctx);
    logits = malloc((size_t)max_batch * hp->n_vocab * sizeof(float));
    last = malloc((size_t)hp->n_vocab * sizeof(float));
    if (!logits || !last) { fprintf(stderr, "spillway-run: out of memory\n"); goto out; }
    bool precise = o->precise >= 0 ? o->precise == 1 : o->logits_out != NULL;
    if (precise && sw_ctx_set_precise(ctx, true)) {
        fprintf(stderr, "spillway-run: out of memory for --precise\n");
        goto out;
    }
    if (o->logits_out && !(lf = fopen(o->logits_out, "wb"))) {
        fprintf(stderr, "spillway-run: %s: %s\n", o->logits_out, strerror(errno));
        goto out;
    }

    if (o->prompt) { fputs(o->prompt, stdout); fflush(stdout); }
    double t0 = sw_clock_s();
    if (prefill(ctx, m, prompt, n_prompt, lf, logits, max_batch, last)) goto out;
    double t1 = sw_clock_s();

    long generated = 0;
    rc = generate(ctx, g, hp->n_vocab, n_predict, lf, last, &generated);
    double t2 = sw_clock_s();
    if (o->prompt || generated) { fputs("\n", stdout); fflush(stdout); }
    fprintf(stderr, "spillway-run: prompt %d tokens in %.3f s (%.1f tok/s), generated %ld tokens in %.3f s (%.1f tok/s)\n",
            n_prompt, t1 - t0, n_prompt / (t1 - t0 > 0 ? t1 - t0 : 1e-9),
            generated, t2 - t1, generated / (t2 - t1 > 0 ? t2 - t1 : 1e-9));
out:
    if (lf && fclose(lf) != 0) { fprintf(stderr, "spillway-run: %s: write failed\n", o->logits_out); rc = 1; }
    free(logits);
    free(last);
    free(ids);
    sw_gen_delete(g);
    sw_ctx_free(ctx);
    return rc;
}

int main(int argc, char **argv)
{
    options o = parse_args(argc, argv);
    if (o.threads) omp_set_num_threads(o.threads);
    if (o.tokenize) return do_tokenize(&o);

    char err[1024];
    sw_model *m = sw_model_load(o.model, err, sizeof err);
    if (!m) { fprintf(stderr, "spillway-run: %s\n", err); return 1; }
    char desc[256];
    sw_model_describe(m, desc, sizeof desc);
    /* the int8 form's threshold, so a test knows whether this run used it */
    fprintf(stderr, "spillway-run: %s: %s, isa %s, %d threads, int8 form from %d tokens\n", o.model, desc,
            sw_isa_name(sw_isa_active()), omp_get_max_threads(), sw_i8_min_tokens());
    int rc = run_model(&o, m);
    sw_model_free(m);
    return rc;
}
