/* spillway: command-line client for a Spillway gateway, over the native SDK.
 *
 *   spillway complete -m MODEL [-n N] [--temp T] [--seed S] [--stop S] [--choices N] PROMPT
 *   spillway complete -m MODEL [options] --prompt P1 --prompt P2 ... | --prompts-file FILE
 *                     a batch: each prompt's --choices samples, [choice PROMPT*N+SAMPLE] each
 *   spillway embed    -m MODEL [TEXT ...]   (no TEXT: one input a line of stdin) the vectors as
 *                     /v1/embeddings gives them (JSON)
 *   spillway chat     -m MODEL [--system TEXT] [--reasoning-effort E] [--tools FILE [--tool-choice C]]
 *                     [--json | --json-schema FILE] [-n N] [--temp T] MESSAGE
 *   spillway status [--admin-token-file FILE]   the admin API's status document (needs the admin token)
 *   spillway keygen [--out PREFIX]   a CURVE keypair: PREFIX.key (mode 0600) and PREFIX.pub
 *   spillway ops status|drain|undrain|cordon|uncordon|force-overflow|reload ...
 *                                    the operators' commands, over the admin API (sdk/ops.c)
 * Common: -e ENDPOINT (default tcp://127.0.0.1:5556 or $SPILLWAY_ENDPOINT),
 *         --timeout MS, --key FILE --gateway-key FILE|Z85 (CURVE, docs/security.md). Text streams to stdout, then each function call the
 *         model made as "[tool_call] name(arguments)"; a reasoning model's
 *         reasoning streams to stderr, and the summary follows it there.
 */
#include "sdk/spillway.h"
#include "llm/cli.h"
#include "llm/limits.h"
#include "llm/util.h"
#include "proto/curve.h"
#include "sdk/ops.h"

#include <getopt.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Everything the command line says; req points into the arrays. */
typedef struct {
    const char *cmd, *endpoint, *system_msg, *tools_path, *schema_path;
    const char *key_file, *gateway_key;   /* CURVE: this client's keypair, the gateway's public key */
    const char *admin_token_file;         /* status: the admin token's file */
    const char *stops[16];
    uint32_t bias_ids[64];
    float bias[64];
    int quiet;
    char **prompts;                       /* a batch: --prompt and --prompts-file lines, malloc'd */
    size_t n_prompts;
    spillway_request req;
} cli_args;

/* The batch's prompts; -1 out of memory. */
static int add_prompt(cli_args *a, const char *text)
{
    char **v = realloc(a->prompts, (a->n_prompts + 1) * sizeof *v);
    if (!v) return -1;
    a->prompts = v;
    if (!(v[a->n_prompts] = strdup(text))) return -1;
    a->n_prompts++;
    return 0;
}

static void free_prompts(cli_args *a)
{
    for (size_t i = 0; i < a->n_prompts; i++) free(a->prompts[i]);
    free(a->prompts);
    a->prompts = NULL;
    a->n_prompts = 0;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: spillway complete -m MODEL [options] PROMPT\n"
        "       spillway complete -m MODEL [options] --prompt TEXT [--prompt TEXT ...] | --prompts-file FILE\n"
        "                     (a batch, as /v1/completions takes prompt as an array: each prompt's\n"
        "                     --choices samples, printed whole as [choice I], I = prompt * N + sample;\n"
        "                     FILE has one prompt a line, '-' for stdin; at most %d choices in all)\n"
        "       spillway embed -m MODEL [TEXT ...]   (the embeddings of each TEXT, or of each line of\n"
        "                     stdin; prints /v1/embeddings' JSON: {\"object\":\"list\",\"data\":[{\"index\":I,\n"
        "                     \"embedding\":[...]}...],\"model\":...,\"usage\":...}; at most %d inputs)\n"
        "       spillway chat -m MODEL [--system TEXT] [--reasoning-effort low|medium|high]\n"
        "                     [--tools FILE [--tool-choice auto|required|NAME]] [options] MESSAGE\n"
        "       spillway status [--admin-token-file FILE]   (the gateway's status; the admin token's file\n"
        "                     defaults to $SPILLWAY_ADMIN_TOKEN_FILE or build/run/admin.token)\n"
        "       spillway ops status|drain|undrain|cordon|uncordon|force-overflow|reload ...\n"
        "                     (spillway ops --help)\n"
        "       spillway keygen [--out PREFIX]   (writes PREFIX.key, mode 0600, and PREFIX.pub;\n"
        "                                         default prefix 'spillway')\n"
        "options: -e ENDPOINT  -n MAX_TOKENS  --temp T  --top-p P  --top-k K  --seed S\n"
        "         --choices N (OpenAI's n: N samples, seed + i each, printed whole as [choice I])\n"
        "         --stop TEXT (repeatable)  --timeout MS  -q (no summary)\n"
        "         --json (the answer is a JSON object)  --json-schema FILE (... fitting that schema)\n"
        "         --logprobs N (each token's, and N alternatives, on stderr)  --logit-bias ID=BIAS (repeatable)\n"
        "         --key FILE --gateway-key FILE|Z85  authenticate with CURVE (a gateway with --client-keys)\n",
        SW_MAX_CHOICES, SW_MAX_EMBED_INPUTS);
}

static int parse_num(const char *flag, const char *s, double lo, double hi, double *out)
{
    if (!sw_parse_double(s, lo, hi, out)) {
        fprintf(stderr, "spillway: %s: '%s' is not a number in [%g, %g]\n", flag, s, lo, hi);
        return -1;
    }
    return 0;
}

static int print_delta(void *user, const char *delta, size_t len)
{
    (void)user;
    fwrite(delta, 1, len, stdout);
    fflush(stdout);
    return 0;
}

/* A reasoning model's reasoning, as it comes, on stderr between markers
 * (*user: whether the opening one is out). */
static int print_reasoning(void *user, const char *delta, size_t len)
{
    bool *open = user;
    if (!*open) fputs("[reasoning]\n", stderr);
    *open = true;
    fwrite(delta, 1, len, stderr);
    return 0;
}

/* A whole file as a string (the --tools or --json-schema JSON), or NULL
 * with a message naming the flag. */
static char *read_file(const char *flag, const char *path)
{
    FILE *f = fopen(path, "rb");
    sw_sbuf b = {0};
    bool ok = f != NULL;
    while (ok && sw_sbuf_reserve(&b, 4096)) {
        size_t k = fread(b.s + b.n, 1, 4096, f);
        b.n += k;
        if (k < 4096) { ok = !ferror(f); break; }
    }
    if (f) fclose(f);
    if (ok && !b.oom) { b.s[b.n] = 0; return b.s; }
    fprintf(stderr, "spillway: %s: cannot read '%s'\n", flag, path);
    sw_sbuf_free(&b);
    return NULL;
}

static int parse_effort(const char *s, spillway_request *req)
{
    if (!strcmp(s, "low")) req->reasoning_effort = SPILLWAY_EFFORT_LOW;
    else if (!strcmp(s, "medium")) req->reasoning_effort = SPILLWAY_EFFORT_MEDIUM;
    else if (!strcmp(s, "high")) req->reasoning_effort = SPILLWAY_EFFORT_HIGH;
    else {
        fprintf(stderr, "spillway: --reasoning-effort: '%s' is not low, medium or high\n", s);
        return -1;
    }
    return 0;
}

/* --logit-bias ID=BIAS, at most 64 of them. */
static int parse_bias(const char *s, cli_args *a)
{
    const char *eq = strchr(s, '=');
    double id, v;
    char idtext[32];
    size_t n = eq ? (size_t)(eq - s) : 0;
    if (!eq || n == 0 || n >= sizeof idtext || a->req.n_logit_bias >= 64) {
        fprintf(stderr, "spillway: --logit-bias: '%s' is not TOKEN_ID=BIAS (at most 64)\n", s);
        return -1;
    }
    memcpy(idtext, s, n);
    idtext[n] = 0;
    if (parse_num("--logit-bias token id", idtext, 0, 4294967295.0, &id) ||
        parse_num("--logit-bias bias", eq + 1, -100, 100, &v)) return -1;
    a->bias_ids[a->req.n_logit_bias] = (uint32_t)id;
    a->bias[a->req.n_logit_bias++] = (float)v;
    a->req.logit_bias_ids = a->bias_ids;
    a->req.logit_bias = a->bias;
    return 0;
}

/* The numeric flags: -n, --temp, --top-p, --top-k, --seed, --timeout, --logprobs, --choices. */
static int parse_number_option(int c, const char *s, spillway_request *req)
{
    double v;
    switch (c) {
    case 'n': if (parse_num("-n", s, 1, 1 << 20, &v)) return -1; req->max_tokens = (uint32_t)v; break;
    case 't': if (parse_num("--temp", s, 0, 100, &v)) return -1; req->temperature = (float)v; break;
    case 'p': if (parse_num("--top-p", s, 0, 1, &v)) return -1; req->top_p = (float)v; break;
    case 'k': if (parse_num("--top-k", s, 0, 1 << 20, &v)) return -1; req->top_k = (uint32_t)v; break;
    case 's': if (parse_num("--seed", s, 0, 1.8e19, &v)) return -1; req->seed = (uint64_t)v; req->has_seed = true; break;
    case 'T': if (parse_num("--timeout", s, 1, 86400000, &v)) return -1; req->timeout_ms = (int)v; break;
    case 'C': if (parse_num("--choices", s, 1, SW_MAX_CHOICES, &v)) return -1; req->n = (uint32_t)v; break;
    case 'l':
        if (parse_num("--logprobs", s, 0, 20, &v)) return -1;
        req->logprobs = true;
        req->top_logprobs = (uint32_t)v;
        break;
    }
    return 0;
}

/* Each line of path ('-': stdin) as a prompt of the batch, its newline
 * (and a CR before it) left out; an empty line is refused, naming it (a
 * prompt must have text, and skipping it would shift the indexes). */
static int read_lines(const char *flag, const char *path, cli_args *a)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
    if (!f) { fprintf(stderr, "spillway: %s: cannot read '%s'\n", flag, path); return -1; }
    char *line = NULL;
    size_t cap = 0, no = 0;
    ssize_t n;
    int rc = 0;
    while (rc == 0 && (n = getline(&line, &cap, f)) >= 0) {
        no++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n == 0) { fprintf(stderr, "spillway: %s: line %zu is empty (one input a line)\n", flag, no); rc = -1; }
        else if (add_prompt(a, line) != 0) { fprintf(stderr, "spillway: out of memory\n"); rc = -1; }
    }
    if (rc == 0 && ferror(f)) { fprintf(stderr, "spillway: %s: cannot read '%s'\n", flag, path); rc = -1; }
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

/* One option from getopt_long; -1 on a bad one (its message printed). */
static int parse_option(int c, const char *arg, cli_args *a)
{
    spillway_request *req = &a->req;
    switch (c) {
    case 'n': case 't': case 'p': case 'k': case 's': case 'T': case 'l': case 'C':
        return parse_number_option(c, arg, req);
    case 'e': a->endpoint = arg; break;
    case 'm': req->model = arg; break;
    case 'S':
        if (req->n_stop >= 16) { fprintf(stderr, "spillway: at most 16 --stop strings\n"); return -1; }
        a->stops[req->n_stop++] = arg;
        req->stop = a->stops;
        break;
    case 'y': a->system_msg = arg; break;
    case 'r': return parse_effort(arg, req);
    case 'o': a->tools_path = arg; break;
    case 'c': req->tool_choice = arg; break;
    case 'j': a->schema_path = arg; break;
    case 'J': req->json_schema = "{\"type\":\"object\"}"; break;
    case 'b': return parse_bias(arg, a);
    case 'q': a->quiet = 1; break;
    case 'K': a->key_file = arg; break;
    case 'G': a->gateway_key = arg; break;
    case 'A': a->admin_token_file = arg; break;
    case 'P':
        if (add_prompt(a, arg) != 0) { fprintf(stderr, "spillway: out of memory\n"); return -1; }
        break;
    case 'F': return read_lines("--prompts-file", arg, a);
    default: usage(stderr); return -1;
    }
    return 0;
}

/* The flags after the command (argv[1]); 0, or -1 on a bad one. */
static int parse_args(int argc, char **argv, cli_args *a)
{
    static const struct option opts[] = {
        {"endpoint", required_argument, 0, 'e'}, {"model", required_argument, 0, 'm'},
        {"max-tokens", required_argument, 0, 'n'}, {"temp", required_argument, 0, 't'},
        {"top-p", required_argument, 0, 'p'}, {"top-k", required_argument, 0, 'k'},
        {"seed", required_argument, 0, 's'}, {"stop", required_argument, 0, 'S'},
        {"system", required_argument, 0, 'y'}, {"timeout", required_argument, 0, 'T'},
        {"reasoning-effort", required_argument, 0, 'r'}, {"tools", required_argument, 0, 'o'},
        {"tool-choice", required_argument, 0, 'c'}, {"json-schema", required_argument, 0, 'j'},
        {"json", no_argument, 0, 'J'}, {"logprobs", required_argument, 0, 'l'},
        {"logit-bias", required_argument, 0, 'b'}, {"key", required_argument, 0, 'K'},
        {"gateway-key", required_argument, 0, 'G'}, {"admin-token-file", required_argument, 0, 'A'},
        {"choices", required_argument, 0, 'C'}, {"prompt", required_argument, 0, 'P'},
        {"prompts-file", required_argument, 0, 'F'},
        {"quiet", no_argument, 0, 'q'}, {0, 0, 0, 0}};
    memset(a, 0, sizeof *a);
    a->cmd = argv[1];
    a->endpoint = getenv("SPILLWAY_ENDPOINT");
    if (!a->endpoint || !*a->endpoint) a->endpoint = SPILLWAY_DEFAULT_ENDPOINT;
    a->req = spillway_request_default(NULL);
    optind = 2;
    int c;
    while ((c = getopt_long(argc, argv, "e:m:n:q", opts, NULL)) != -1)
        if (parse_option(c, optarg, a) != 0) return -1;
    return 0;
}

static int run_status(spillway_client *cl, const cli_args *a)
{
    char err[512];
    char *token = sw_cli_read_admin_token(a->admin_token_file ? a->admin_token_file : sw_cli_admin_token_file());
    if (!token) return 1;
    char *json = spillway_status(cl, token, a->req.timeout_ms, err, sizeof err);
    sodium_memzero(token, strlen(token));
    free(token);
    if (!json) { fprintf(stderr, "%s\n", err); return 1; }
    printf("%s\n", json);
    free(json);
    return 0;
}

/* What follows the streamed text: the calls on stdout; the log
 * probabilities ("[logprob] TOKEN LOGPROB | ALT LOGPROB ...") and, unless
 * quiet, the summary on stderr. */
static void print_result(const spillway_result *res, int quiet)
{
    for (size_t i = 0; i < res->n_tool_calls; i++)
        printf("[tool_call] %s(%s)\n", res->tool_calls[i].name, res->tool_calls[i].arguments);
    for (size_t i = 0; i < res->n_logprobs; i++) {
        const spillway_logprob *l = &res->logprobs[i];
        fprintf(stderr, "[logprob] %s %.6f", l->token.bytes, l->token.logprob);
        for (size_t k = 0; k < l->n_top; k++) fprintf(stderr, " | %s %.6f", l->top[k].bytes, l->top[k].logprob);
        fputc('\n', stderr);
    }
    if (!quiet)
        fprintf(stderr, "[finish=%s prompt_tokens=%u cached_tokens=%u completion_tokens=%u reasoning_tokens=%u "
                        "pool=%s worker=%s]\n",
                spillway_finish_name(res->finish), res->prompt_tokens, res->cached_tokens, res->completion_tokens,
                res->reasoning_tokens, res->pool, res->worker);
}

/* --choices N (OpenAI's n): the samples, whole, each under "[choice I]"
 * with its summary, once all have finished. */
static int run_choices(spillway_client *cl, spillway_request *req, int quiet)
{
    spillway_result res[SW_MAX_CHOICES];
    char err[512];
    req->on_reasoning = NULL;
    int rc = spillway_complete_n(cl, req, NULL, NULL, res, err, sizeof err) ? 1 : 0;
    if (rc) fprintf(stderr, "%s\n", err);
    for (uint32_t i = 0; i < req->n; i++) {
        printf("[choice %u] %s\n", i, res[i].text ? res[i].text : "");
        fflush(stdout);
        print_result(&res[i], quiet);
        spillway_result_free(&res[i]);
    }
    return rc;
}

/* --prompt / --prompts-file: the batch's choices, whole, each under
 * "[choice I]" (I = prompt * N + sample, as /v1/completions indexes them)
 * with its summary, then the request's usage (each prompt counted once). */
static int run_batch(spillway_client *cl, cli_args *a)
{
    spillway_request *req = &a->req;
    size_t n = req->n > 1 ? req->n : 1;
    spillway_input *in = calloc(a->n_prompts, sizeof *in);
    spillway_result *res = calloc(a->n_prompts * n, sizeof *res);
    if (!in || !res) { free(in); free(res); fprintf(stderr, "spillway: out of memory\n"); return 1; }
    for (size_t i = 0; i < a->n_prompts; i++) in[i].text = a->prompts[i];
    req->prompts = in;
    req->n_prompts = a->n_prompts;
    req->on_reasoning = NULL;
    spillway_usage u;
    char err[512];
    int rc = spillway_complete_batch(cl, req, NULL, NULL, res, &u, err, sizeof err) ? 1 : 0;
    if (rc) fprintf(stderr, "%s\n", err);
    bool sent = a->n_prompts * n <= SW_MAX_CHOICES;   /* more: refused, the results untouched (zeroed here) */
    for (size_t i = 0; sent && i < a->n_prompts * n; i++) {
        printf("[choice %zu] %s\n", i, res[i].text ? res[i].text : "");
        fflush(stdout);
        print_result(&res[i], a->quiet);
        spillway_result_free(&res[i]);
    }
    if (!a->quiet && !rc)
        fprintf(stderr, "[usage prompt_tokens=%u cached_tokens=%u completion_tokens=%u total_tokens=%u]\n",
                u.prompt_tokens, u.cached_tokens, u.completion_tokens, u.prompt_tokens + u.completion_tokens);
    free(in);
    free(res);
    return rc;
}

/* s as a JSON string (the model's name: printable, but it may hold a quote). */
static void put_json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", (unsigned char)*s);
        else putchar(*s);
    }
    putchar('"');
}

/* The vectors as /v1/embeddings' response body: each float with the 9
 * digits that give it back exactly. */
static void print_embeddings(const spillway_embeddings *e, const char *model)
{
    fputs("{\"object\":\"list\",\"data\":[", stdout);
    for (size_t i = 0; i < e->count; i++) {
        printf("%s{\"object\":\"embedding\",\"index\":%zu,\"embedding\":[", i ? "," : "", i);
        const float *v = e->values + i * e->dim;
        for (uint32_t k = 0; k < e->dim; k++) printf("%s%.9g", k ? "," : "", (double)v[k]);
        fputs("]}", stdout);
    }
    fputs("],\"model\":", stdout);
    put_json_string(model);
    printf(",\"usage\":{\"prompt_tokens\":%u,\"total_tokens\":%u}}\n", e->prompt_tokens, e->prompt_tokens);
}

/* embed: the texts are the arguments, or else stdin's lines. */
static int run_embed(spillway_client *cl, cli_args *a, int argc, char **argv)
{
    for (int i = optind; i < argc; i++)
        if (add_prompt(a, argv[i]) != 0) { fprintf(stderr, "spillway: out of memory\n"); return 1; }
    if (optind == argc && read_lines("embed (stdin)", "-", a) != 0) return 2;
    spillway_embeddings e;
    char err[512];
    int rc = spillway_embed_texts(cl, a->req.model, (const char *const *)a->prompts, a->n_prompts, &e,
                                  a->req.timeout_ms, err, sizeof err);
    if (rc == 0) {
        print_embeddings(&e, a->req.model);
        if (!a->quiet)
            fprintf(stderr, "[embeddings=%zu dim=%u prompt_tokens=%u pool=%s worker=%s]\n", e.count, e.dim,
                    e.prompt_tokens, e.pool, e.worker);
    } else {
        fprintf(stderr, "%s\n", err);
    }
    spillway_embeddings_free(&e);
    return rc ? 1 : 0;
}

/* complete or chat: `text` is the prompt, or the user's message. */
static int run_generate(spillway_client *cl, cli_args *a, const char *text)
{
    spillway_request *req = &a->req;
    spillway_message msgs[2];
    if (!strcmp(a->cmd, "chat")) {
        size_t n = 0;
        if (a->system_msg) msgs[n++] = (spillway_message){"system", a->system_msg};
        msgs[n++] = (spillway_message){"user", text};
        req->messages = msgs;
        req->n_messages = n;
    } else {
        req->prompt = text;
    }
    spillway_result res;
    bool reasoning_open = false;
    if (!a->quiet) {
        req->on_reasoning = print_reasoning;
        req->on_reasoning_user = &reasoning_open;
    }
    if (req->n > 1) return run_choices(cl, req, a->quiet);
    char err[512];
    int rc = spillway_complete_stream(cl, req, print_delta, NULL, &res, err, sizeof err) ? 1 : 0;
    if (reasoning_open) fputs("\n[/reasoning]\n", stderr);
    printf("\n");
    if (rc) fprintf(stderr, "%s\n", err);
    print_result(&res, a->quiet);
    spillway_result_free(&res);
    return rc;
}

/* Connects and runs the command; the exit status. */
static int run(cli_args *a, int argc, char **argv)
{
    char err[512];
    if (!a->key_file != !a->gateway_key) {
        fprintf(stderr, "spillway: --key and --gateway-key go together (CURVE needs both)\n");
        return 2;
    }
    spillway_client *cl = a->key_file ? spillway_connect_curve(a->endpoint, a->key_file, a->gateway_key, err, sizeof err)
                                      : spillway_connect(a->endpoint, err, sizeof err);
    if (!cl) { fprintf(stderr, "%s\n", err); return 1; }
    int rc;
    if (!strcmp(a->cmd, "status")) {
        rc = run_status(cl, a);
    } else if (!strcmp(a->cmd, "embed")) {
        if (!a->req.model) {
            fprintf(stderr, "spillway embed: needs -m MODEL\n");
            rc = 2;
        } else {
            rc = run_embed(cl, a, argc, argv);
        }
    } else if (!strcmp(a->cmd, "complete") && a->n_prompts) {
        if (!a->req.model || optind != argc) {
            fprintf(stderr, "spillway complete: a batch (--prompt, --prompts-file) needs -m MODEL and no PROMPT "
                            "argument\n");
            rc = 2;
        } else {
            rc = run_batch(cl, a);
        }
    } else if (!strcmp(a->cmd, "complete") || !strcmp(a->cmd, "chat")) {
        if (a->n_prompts) {
            fprintf(stderr, "spillway chat: --prompt and --prompts-file are for complete\n");
            rc = 2;
        } else if (!a->req.model || optind != argc - 1) {
            fprintf(stderr, "spillway %s: needs -m MODEL and exactly one text argument\n", a->cmd);
            rc = 2;
        } else {
            rc = run_generate(cl, a, argv[optind]);
        }
    } else {
        fprintf(stderr, "spillway: unknown command '%s'\n", a->cmd);
        usage(stderr);
        rc = 2;
    }
    spillway_close(cl);
    return rc;
}

/* spillway keygen [--out PREFIX]: a fresh CURVE keypair into PREFIX.key
 * (both keys, mode 0600) and PREFIX.pub; the public key on stdout, to paste
 * into the gateway's allowlist. */
static int run_keygen(int argc, char **argv)
{
    const char *prefix = "spillway";
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc && argv[i + 1][0]) prefix = argv[++i];
        else {
            fprintf(stderr, "spillway keygen: unknown or incomplete argument '%s'\nusage: spillway keygen "
                            "[--out PREFIX]\n", argv[i]);
            return 2;
        }
    }
    sw_curve_keypair kp;
    char err[1024];
    int rc = sw_curve_generate(&kp, err, sizeof err) == 0 && sw_curve_write_keypair(prefix, &kp, err, sizeof err) == 0;
    if (rc) {
        printf("%s\n", kp.public_z85);
        fprintf(stderr, "spillway keygen: wrote %s.key (secret, mode 0600) and %s.pub\n", prefix, prefix);
    } else {
        fprintf(stderr, "spillway keygen: %s\n", err);
    }
    explicit_bzero(&kp, sizeof kp);
    return rc ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "keygen")) return run_keygen(argc, argv);
    if (!strcmp(argv[1], "ops")) return sw_cli_ops(argc, argv);
    cli_args a;
    if (parse_args(argc, argv, &a) != 0) { free_prompts(&a); return 2; }
    /* read after the flags, so that a bad flag leaves nothing to free */
    char *tools = a.tools_path ? read_file("--tools", a.tools_path) : NULL;
    char *schema = a.schema_path ? read_file("--json-schema", a.schema_path) : NULL;
    a.req.tools_json = tools;
    if (schema) a.req.json_schema = schema;
    int rc = (a.tools_path && !tools) || (a.schema_path && !schema) ? 2 : run(&a, argc, argv);
    free(tools);
    free(schema);
    free_prompts(&a);
    return rc;
}
