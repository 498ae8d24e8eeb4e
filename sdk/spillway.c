/* spillway: command-line client for a Spillway gateway, over the native SDK.
 *
 *   spillway complete -m MODEL [-n N] [--temp T] [--seed S] [--stop S] PROMPT
 *   spillway chat     -m MODEL [--system TEXT] [--reasoning-effort E] [--tools FILE [--tool-choice C]]
 *                     [--json | --json-schema FILE] [-n N] [--temp T] MESSAGE
 *   spillway status
 * Common: -e ENDPOINT (default tcp://127.0.0.1:5556 or $SPILLWAY_ENDPOINT),
 *         --timeout MS. Text streams to stdout, then each function call the
 *         model made as "[tool_call] name(arguments)"; a reasoning model's
 *         reasoning streams to stderr, and the summary follows it there.
 */
#include "sdk/spillway.h"
#include "llm/cli.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
        "usage: spillway complete -m MODEL [options] PROMPT\n"
        "       spillway chat -m MODEL [--system TEXT] [--reasoning-effort low|medium|high]\n"
        "                     [--tools FILE [--tool-choice auto|required|NAME]] [options] MESSAGE\n"
        "       spillway status\n"
        "options: -e ENDPOINT  -n MAX_TOKENS  --temp T  --top-p P  --top-k K  --seed S\n"
        "         --stop TEXT (repeatable)  --timeout MS  -q (no summary)\n"
        "         --json (the answer is a JSON object)  --json-schema FILE (... fitting that schema)\n"
        "         --logprobs N (each token's, and N alternatives, on stderr)  --logit-bias ID=BIAS (repeatable)\n");
}

static int parse_num(const char *flag, const char *s, double lo, double hi, double *out) {
    if (!sw_parse_double(s, lo, hi, out)) {
        fprintf(stderr, "spillway: %s: '%s' is not a number in [%g, %g]\n", flag, s, lo, hi);
        return -1;
    }
    return 0;
}

static int print_delta(void *user, const char *delta, size_t len) {
    (void)user;
    fwrite(delta, 1, len, stdout);
    fflush(stdout);
    return 0;
}

/* A reasoning model's reasoning, as it comes, on stderr between markers
 * (*user: whether the opening one is out). */
static int print_reasoning(void *user, const char *delta, size_t len) {
    bool *open = user;
    if (!*open) fputs("[reasoning]\n", stderr);
    *open = true;
    fwrite(delta, 1, len, stderr);
    return 0;
}

/* A whole file as a string (the --tools or --json-schema JSON), or NULL
 * with a message naming the flag. */
static char *read_file(const char *flag, const char *path) {
    FILE *f = fopen(path, "rb");
    char *s = NULL;
    size_t n = 0, cap = 0;
    bool ok = f != NULL;
    while (ok) {
        if (n + 4096 + 1 > cap) {
            char *p = realloc(s, cap ? 2 * cap : 8192);
            if (!(ok = p != NULL)) break;
            s = p;
            cap = cap ? 2 * cap : 8192;
        }
        size_t k = fread(s + n, 1, 4096, f);
        n += k;
        if (k < 4096) { ok = !ferror(f); break; }
    }
    if (f) fclose(f);
    if (ok) { s[n] = 0; return s; }
    fprintf(stderr, "spillway: %s: cannot read '%s'\n", flag, path);
    free(s);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    const char *endpoint = getenv("SPILLWAY_ENDPOINT");
    if (!endpoint || !*endpoint) endpoint = SPILLWAY_DEFAULT_ENDPOINT;
    const char *system_msg = NULL;
    const char *stops[16];
    int quiet = 0;
    spillway_request req = spillway_request_default(NULL);
    const char *tools_path = NULL, *schema_path = NULL;
    uint32_t bias_ids[64];
    float bias[64];

    static const struct option opts[] = {
        {"endpoint", required_argument, 0, 'e'}, {"model", required_argument, 0, 'm'},
        {"max-tokens", required_argument, 0, 'n'}, {"temp", required_argument, 0, 't'},
        {"top-p", required_argument, 0, 'p'}, {"top-k", required_argument, 0, 'k'},
        {"seed", required_argument, 0, 's'}, {"stop", required_argument, 0, 'S'},
        {"system", required_argument, 0, 'y'}, {"timeout", required_argument, 0, 'T'},
        {"reasoning-effort", required_argument, 0, 'r'}, {"tools", required_argument, 0, 'o'},
        {"tool-choice", required_argument, 0, 'c'}, {"json-schema", required_argument, 0, 'j'},
        {"json", no_argument, 0, 'J'}, {"logprobs", required_argument, 0, 'l'},
        {"logit-bias", required_argument, 0, 'b'},
        {"quiet", no_argument, 0, 'q'}, {0, 0, 0, 0}};
    optind = 2;
    int c;
    double v;
    while ((c = getopt_long(argc, argv, "e:m:n:q", opts, NULL)) != -1) {
        switch (c) {
        case 'e': endpoint = optarg; break;
        case 'm': req.model = optarg; break;
        case 'n': if (parse_num("-n", optarg, 1, 1 << 20, &v)) return 2; req.max_tokens = (uint32_t)v; break;
        case 't': if (parse_num("--temp", optarg, 0, 100, &v)) return 2; req.temperature = (float)v; break;
        case 'p': if (parse_num("--top-p", optarg, 0, 1, &v)) return 2; req.top_p = (float)v; break;
        case 'k': if (parse_num("--top-k", optarg, 0, 1 << 20, &v)) return 2; req.top_k = (uint32_t)v; break;
        case 's': if (parse_num("--seed", optarg, 0, 1.8e19, &v)) return 2; req.seed = (uint64_t)v; req.has_seed = true; break;
        case 'S':
            if (req.n_stop >= 16) { fprintf(stderr, "spillway: at most 16 --stop strings\n"); return 2; }
            stops[req.n_stop++] = optarg; req.stop = stops; break;
        case 'y': system_msg = optarg; break;
        case 'T': if (parse_num("--timeout", optarg, 1, 86400000, &v)) return 2; req.timeout_ms = (int)v; break;
        case 'r':
            if (!strcmp(optarg, "low")) req.reasoning_effort = SPILLWAY_EFFORT_LOW;
            else if (!strcmp(optarg, "medium")) req.reasoning_effort = SPILLWAY_EFFORT_MEDIUM;
            else if (!strcmp(optarg, "high")) req.reasoning_effort = SPILLWAY_EFFORT_HIGH;
            else {
                fprintf(stderr, "spillway: --reasoning-effort: '%s' is not low, medium or high\n", optarg);
                return 2;
            }
            break;
        case 'o': tools_path = optarg; break;
        case 'c': req.tool_choice = optarg; break;
        case 'j': schema_path = optarg; break;
        case 'J': req.json_schema = "{\"type\":\"object\"}"; break;
        case 'l':
            if (parse_num("--logprobs", optarg, 0, 20, &v)) return 2;
            req.logprobs = true;
            req.top_logprobs = (uint32_t)v;
            break;
        case 'b': {   /* ID=BIAS */
            const char *eq = strchr(optarg, '=');
            double id;
            char idtext[32];
            size_t n = eq ? (size_t)(eq - optarg) : 0;
            if (!eq || n == 0 || n >= sizeof idtext || req.n_logit_bias >= 64) {
                fprintf(stderr, "spillway: --logit-bias: '%s' is not TOKEN_ID=BIAS (at most 64)\n", optarg);
                return 2;
            }
            memcpy(idtext, optarg, n);
            idtext[n] = 0;
            if (parse_num("--logit-bias token id", idtext, 0, 4294967295.0, &id) ||
                parse_num("--logit-bias bias", eq + 1, -100, 100, &v)) return 2;
            bias_ids[req.n_logit_bias] = (uint32_t)id;
            bias[req.n_logit_bias++] = (float)v;
            req.logit_bias_ids = bias_ids;
            req.logit_bias = bias;
            break;
        }
        case 'q': quiet = 1; break;
        default: usage(stderr); return 2;
        }
    }

    /* read after the flags, so that a bad flag leaves nothing to free */
    char *tools = tools_path ? read_file("--tools", tools_path) : NULL;
    if (tools_path && !tools) return 2;
    req.tools_json = tools;
    char *schema = schema_path ? read_file("--json-schema", schema_path) : NULL;
    if (schema_path && !schema) { free(tools); return 2; }
    if (schema) req.json_schema = schema;

    char err[512];
    spillway_client *cl = spillway_connect(endpoint, err, sizeof err);
    if (!cl) { fprintf(stderr, "%s\n", err); free(tools); free(schema); return 1; }
    int rc = 0;
    if (!strcmp(cmd, "status")) {
        char *json = spillway_status(cl, req.timeout_ms, err, sizeof err);
        if (json) { printf("%s\n", json); free(json); }
        else { fprintf(stderr, "%s\n", err); rc = 1; }
    } else if (!strcmp(cmd, "complete") || !strcmp(cmd, "chat")) {
        if (!req.model || optind != argc - 1) {
            fprintf(stderr, "spillway %s: needs -m MODEL and exactly one text argument\n", cmd);
            spillway_close(cl);
            free(tools);
            free(schema);
            return 2;
        }
        spillway_message msgs[2];
        if (!strcmp(cmd, "chat")) {
            size_t n = 0;
            if (system_msg) msgs[n++] = (spillway_message){"system", system_msg};
            msgs[n++] = (spillway_message){"user", argv[optind]};
            req.messages = msgs;
            req.n_messages = n;
        } else {
            req.prompt = argv[optind];
        }
        spillway_result res;
        bool reasoning_open = false;
        if (!quiet) {
            req.on_reasoning = print_reasoning;
            req.on_reasoning_user = &reasoning_open;
        }
        rc = spillway_complete_stream(cl, &req, print_delta, NULL, &res, err, sizeof err) ? 1 : 0;
        if (reasoning_open) fputs("\n[/reasoning]\n", stderr);
        printf("\n");
        if (rc) fprintf(stderr, "%s\n", err);
        for (size_t i = 0; i < res.n_tool_calls; i++)
            printf("[tool_call] %s(%s)\n", res.tool_calls[i].name, res.tool_calls[i].arguments);
        for (size_t i = 0; i < res.n_logprobs; i++) {   /* "[logprob] TOKEN LOGPROB | ALT LOGPROB ..." */
            const spillway_logprob *l = &res.logprobs[i];
            fprintf(stderr, "[logprob] %s %.6f", l->token.bytes, l->token.logprob);
            for (size_t k = 0; k < l->n_top; k++) fprintf(stderr, " | %s %.6f", l->top[k].bytes, l->top[k].logprob);
            fputc('\n', stderr);
        }
        if (!quiet)
            fprintf(stderr, "[finish=%s prompt_tokens=%u cached_tokens=%u completion_tokens=%u reasoning_tokens=%u "
                            "pool=%s worker=%s]\n",
                    spillway_finish_name(res.finish), res.prompt_tokens, res.cached_tokens, res.completion_tokens,
                    res.reasoning_tokens, res.pool, res.worker);
        spillway_result_free(&res);
    } else {
        fprintf(stderr, "spillway: unknown command '%s'\n", cmd);
        usage(stderr);
        rc = 2;
    }
    spillway_close(cl);
    free(tools);
    free(schema);
    return rc;
}
