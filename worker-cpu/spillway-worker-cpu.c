/* spillway-worker-cpu: the CPU worker daemon.
 *
 *   spillway-worker-cpu --gateway ENDPOINT [--gateway ENDPOINT...] --pool NAME --model NAME=PATH
 *       [--drain-timeout S] [--threads N] [--parallel N] [--ctx N] [--worker-id ID]
 *       [--quantization Q] [--prefix-cache on|off] [--cache-slots N] [--test-echo TOKENS_PER_S]
 *       [--curve-secret FILE --gateway-key FILE|Z85]
 *
 * Loads the GGUF model, connects to the gateway, registers and serves
 * generate requests until SIGINT/SIGTERM, which drains it: every gateway
 * is told at once, what it holds is finished, then it exits 0 (see
 * proto/worker_link.h).
 *
 * --test-echo is a test mode for gateway tests and benchmarks: no model is
 * loaded (PATH is registered but not opened, so it need not exist) and every
 * request gets max_tokens placeholder tokens at the given rate. Because a
 * worker that answers with placeholder text must never end up serving users
 * by accident, the mode is refused unless SPILLWAY_ALLOW_TEST_MODE=1 is set.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "proto/worker_link.h"
#include "worker-cpu/engine.h"
#include "worker-cpu/kernels.h"
#include "llm/model.h"
#include "llm/cli.h"
#include "llm/text.h"

#define MAX_THREADS 1024
#define MAX_PARALLEL 4096
#define MAX_CTX (1 << 20)
#define DEFAULT_PARALLEL_CPU 4
#define DEFAULT_PARALLEL_ECHO 256

static const char *usage_text =
    "usage: spillway-worker-cpu --gateway ENDPOINT [--gateway ENDPOINT...] --pool NAME --model NAME=PATH\n"
    "           [--drain-timeout S] [--threads N] [--parallel N] [--ctx N] [--worker-id ID]\n"
    "           [--quantization Q] [--prefix-cache on|off] [--cache-slots N] [--kv-cache f16|q8_0]\n"
    "           [--test-echo TOKENS_PER_S [--test-fail-rate F]]\n"
    "           [--curve-secret FILE --gateway-key FILE|Z85]\n"
    "\n"
    "  --gateway ENDPOINT   gateway worker endpoint, e.g. tcp://127.0.0.1:5555; repeat it to serve\n"
    "                       several gateways (up to 8), each told the whole load\n"
    "  --drain-timeout S    on SIGTERM, finish the requests in hand for at most S seconds\n"
    "                       (default 120; a second SIGTERM stops at once)\n"
    "  --pool NAME          pool this worker joins (as in routes.yaml)\n"
    "  --model NAME=PATH    model name to serve and its GGUF file\n"
    "  --threads N          OpenMP compute threads (default: all cores)\n"
    "  --parallel N         concurrent sequences (default 4; 256 with --test-echo)\n"
    "  --ctx N              context per sequence (default: the model's, capped by the engine)\n"
    "  --worker-id ID       id to register with (default: host-pid-random)\n"
    "  --curve-secret FILE  this worker's CURVE keypair (spillway keygen; mode 0600): authenticate\n"
    "                       to the gateway with it (docs/security.md)\n"
    "  --gateway-key K      the gateway's CURVE public key: its .pub file or the 40 Z85 characters\n"
    "  --quantization Q     quantization to register (default: the GGUF's; \"test\" with --test-echo)\n"
    "  --prefix-cache on|off reuse the KV cache of a prompt prefix computed before (default on)\n"
    "  --cache-slots N      KV caches kept for it, at least --parallel (default: --parallel); each\n"
    "                       commits memory as it fills, up to --ctx positions\n"
    "  --kv-cache f16|q8_0  the caches' element type (default f16): q8_0 takes 1.06 bytes an element\n"
    "                       instead of 2 (llama.cpp's q8_0 cache), for long contexts and wide batches;\n"
    "                       it needs a head size that is a multiple of 32\n"
    "  --test-echo R        TEST MODE: no model, emit max_tokens placeholder tokens at R tokens/s\n"
    "                       per sequence; refused unless SPILLWAY_ALLOW_TEST_MODE=1\n"
    "  --test-fail-rate F   TEST MODE (with --test-echo): refuse a fraction F of requests with error 500\n";

typedef struct {
    const char *gateways[SW_MAX_GATEWAYS];
    size_t n_gateways;
    uint32_t drain_timeout_ms;
    const char *pool, *worker_id, *quantization;
    const char *curve_secret, *gateway_key;   /* CURVE: both or neither */
    char model_name[SW_MAX_ID_LEN + 1];
    const char *model_path;
    int threads, parallel, ctx, cache_slots;
    bool no_prefix_cache;
    sw_kv_type kv_type;
    double echo_rate; /* 0 = normal mode */
    double fail_rate; /* --test-fail-rate, test mode only */
} options;

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "spillway-worker-cpu: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", usage_text);
    return 2;
}

/* Whole string, decimal, within [lo, hi]. */
static int parse_int(const char *s, long lo, long hi, int *out)
{
    long v;
    if (!sw_parse_long(s, lo, hi, &v)) return -1;
    *out = (int)v;
    return 0;
}

/* Asks ZeroMQ itself whether it can connect to the endpoint. */
static int valid_endpoint(const char *ep)
{
    if (strncmp(ep, "tcp://", 6) != 0 && strncmp(ep, "ipc://", 6) != 0) return 0;
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    int ok = zmq_connect(s, ep) == 0;
    zmq_close(s);
    zmq_ctx_term(ctx);
    return ok;
}

/* Option a (known, with its value v) into o: 0, or usage_error's code. */
static int set_option(options *o, const char *a, const char *v, int *have_model)
{
    if (!strcmp(a, "--gateway")) {
        if (!valid_endpoint(v))
            return usage_error("--gateway: '%s' is not a valid tcp:// or ipc:// endpoint", v);
        char err[96];
        if (sw_gateway_list_add(o->gateways, &o->n_gateways, v, err, sizeof err) != 0)
            return usage_error("--gateway: %s", err);
    } else if (!strcmp(a, "--drain-timeout")) {
        int sec;
        if (parse_int(v, 0, 86400, &sec))
            return usage_error("--drain-timeout: '%s' is not a whole number of seconds in 0..86400", v);
        o->drain_timeout_ms = sec ? (uint32_t)sec * 1000 : 1;   /* 0 s: stop at once (1 ms) */
    } else if (!strcmp(a, "--pool")) {
        if (!sw_id_valid(v, SW_MAX_ID_LEN))
            return usage_error("--pool: '%s' must be 1-128 printable characters, no spaces", v);
        o->pool = v;
    } else if (!strcmp(a, "--model")) {
        const char *eq = strchr(v, '=');
        if (*have_model) return usage_error("--model given twice ('%s'); a worker serves one", v);
        if (!eq || eq == v || !eq[1]) return usage_error("--model: '%s' is not NAME=PATH", v);
        size_t n = (size_t)(eq - v);
        if (n > SW_MAX_ID_LEN) return usage_error("--model: name in '%s' is too long", v);
        memcpy(o->model_name, v, n);
        o->model_name[n] = 0;
        if (!sw_id_valid(o->model_name, SW_MAX_ID_LEN))
            return usage_error("--model: name in '%s' must be printable, without spaces", v);
        o->model_path = eq + 1;
        *have_model = 1;
    } else if (!strcmp(a, "--threads")) {
        if (parse_int(v, 1, MAX_THREADS, &o->threads))
            return usage_error("--threads: '%s' is not a whole number in 1..1024", v);
    } else if (!strcmp(a, "--parallel")) {
        if (parse_int(v, 1, MAX_PARALLEL, &o->parallel))
            return usage_error("--parallel: '%s' is not a whole number in 1..4096", v);
    } else if (!strcmp(a, "--ctx")) {
        if (parse_int(v, 0, MAX_CTX, &o->ctx))
            return usage_error("--ctx: '%s' is not a whole number in 0..1048576", v);
    } else if (!strcmp(a, "--worker-id")) {
        if (!sw_id_valid(v, SW_MAX_ID_LEN))
            return usage_error("--worker-id: '%s' must be 1-128 printable characters, no spaces",
                               v);
        o->worker_id = v;
    } else if (!strcmp(a, "--quantization")) {
        if (!sw_id_valid(v, 32))
            return usage_error("--quantization: '%s' must be 1-32 printable characters", v);
        o->quantization = v;
    } else if (!strcmp(a, "--test-echo")) {
        double r;
        if (!sw_parse_double(v, 0, 1e6, &r) || r == 0)
            return usage_error("--test-echo: '%s' is not a rate in (0, 1000000] tokens/s", v);
        o->echo_rate = r;
    } else if (!strcmp(a, "--cache-slots")) {
        if (parse_int(v, 1, 4096, &o->cache_slots))
            return usage_error("--cache-slots: '%s' is not a whole number in 1..4096", v);
    } else if (!strcmp(a, "--prefix-cache")) {
        bool on;
        if (!sw_parse_on_off(v, &on)) return usage_error("--prefix-cache: '%s' is not on or off", v);
        o->no_prefix_cache = !on;
    } else if (!strcmp(a, "--kv-cache")) {
        if (!sw_kv_type_parse(v, &o->kv_type)) return usage_error("--kv-cache: '%s' is not f16 or q8_0", v);
    } else if (!strcmp(a, "--test-fail-rate")) {
        if (!sw_parse_double(v, 0, 1, &o->fail_rate))
            return usage_error("--test-fail-rate: '%s' is not a fraction in [0, 1]", v);
    } else if (!strcmp(a, "--curve-secret")) {
        o->curve_secret = v;   /* read (and its mode checked) by sw_worker_run */
    } else if (!strcmp(a, "--gateway-key")) {
        o->gateway_key = v;
    }
    return 0;
}

/* The rules across options, once all are read, and the defaults that
 * depend on them: 0, or the exit code. */
static int check_options(options *o, int have_model)
{
    if (!o->n_gateways) return usage_error("%s is required", "--gateway");
    if (!o->pool) return usage_error("%s is required", "--pool");
    if (!have_model) return usage_error("%s is required", "--model NAME=PATH");
    if (o->fail_rate > 0 && o->echo_rate == 0)
        return usage_error("%s", "--test-fail-rate only works with --test-echo");
    if (!o->curve_secret != !o->gateway_key)
        return usage_error("%s", "--curve-secret and --gateway-key go together (CURVE needs both keys)");
    if (o->echo_rate > 0) {
        const char *allow = getenv("SPILLWAY_ALLOW_TEST_MODE");
        if (!allow || strcmp(allow, "1") != 0) {
            fprintf(stderr,
                    "spillway-worker-cpu: --test-echo is a test mode (placeholder output, no "
                    "model) and is refused unless SPILLWAY_ALLOW_TEST_MODE=1 is set in the "
                    "environment\n");
            return 2;
        }
    }
    if (o->parallel < 0) o->parallel = o->echo_rate > 0 ? DEFAULT_PARALLEL_ECHO : DEFAULT_PARALLEL_CPU;
    return 0;
}

/* Returns 0 to run, 1 after --help, or 2 (a usage error, already reported). */
static int parse_args(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->parallel = -1;
    int have_model = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0) return usage_error("unexpected argument '%s'", a);
        static const char *known[] = {"--gateway", "--pool", "--model", "--threads", "--parallel",
                                      "--ctx", "--worker-id", "--test-echo", "--quantization",
                                      "--test-fail-rate", "--prefix-cache", "--cache-slots",
                                      "--curve-secret", "--gateway-key", "--drain-timeout", "--kv-cache"};
        int is_known = 0;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) is_known |= !strcmp(a, known[k]);
        if (!is_known) return usage_error("unknown option '%s'", a);
        if (i + 1 >= argc) return usage_error("%s needs a value", a);
        const char *v = argv[++i];
        int rc = set_option(o, a, v, &have_model);
        if (rc) return rc;
    }
    return check_options(o, have_model);
}

static int run_echo(const options *o)
{
    sw_worker_log("TEST MODE (--test-echo %g tokens/s): no model is loaded, output is placeholder "
                  "text; registering '%s' (%s is not opened)",
                  o->echo_rate, o->model_name, o->model_path);
    sw_echo_engine *e = sw_echo_engine_new(o->echo_rate, o->parallel);
    if (!e) {
        fprintf(stderr, "spillway-worker-cpu: cannot create the echo engine\n");
        return 1;
    }
    sw_echo_engine_set_fail_rate(e, o->fail_rate);
    Spillway__ModelInfo mi = SPILLWAY__MODEL_INFO__INIT;
    mi.name = (char *)o->model_name;
    mi.quantization = (char *)(o->quantization ? o->quantization : "test");
    mi.context_length = o->ctx ? (uint32_t)o->ctx : 4096;
    Spillway__ModelInfo *models[1] = {&mi};
    sw_worker_config cfg = {
        .n_gateways = o->n_gateways, .drain_timeout_ms = o->drain_timeout_ms, .pool = o->pool, .worker_id = o->worker_id,
        .kind = SPILLWAY__WORKER_KIND__WORKER_KIND_CPU, .models = models, .n_models = 1,
        .slots = (uint32_t)o->parallel, .curve_secret_file = o->curve_secret, .gateway_key = o->gateway_key,
    };
    memcpy(cfg.gateways, o->gateways, sizeof cfg.gateways);
    int rc = sw_worker_run(&cfg, &sw_echo_engine_ops, e);
    sw_echo_engine_free(e);
    return rc;
}

static int run_model(const options *o)
{
    char err[512] = "";
    if (o->threads > 0) omp_set_num_threads(o->threads);
    sw_model *m = sw_model_load(o->model_path, err, sizeof err);
    if (!m) {
        fprintf(stderr, "spillway-worker-cpu: cannot load %s: %s\n", o->model_path, err);
        return 1;
    }
    if (o->cache_slots && o->cache_slots < o->parallel)
        fprintf(stderr, "spillway-worker-cpu: --cache-slots %d is below --parallel %d: using %d\n", o->cache_slots,
                o->parallel, o->parallel);
    sw_cpu_engine *e = sw_cpu_engine_new(m, o->parallel, o->cache_slots, o->ctx, err, sizeof err);
    if (!e) {
        fprintf(stderr, "spillway-worker-cpu: cannot start the engine: %s\n", err);
        sw_model_free(m);
        return 1;
    }
    if (sw_cpu_engine_set_kv_type(e, o->kv_type, err, sizeof err)) {
        fprintf(stderr, "spillway-worker-cpu: --kv-cache %s: %s\n", sw_kv_type_name(o->kv_type), err);
        sw_cpu_engine_free(e);
        sw_model_free(m);
        return 1;
    }
    sw_cpu_engine_set_prefix_cache(e, !o->no_prefix_cache);
    Spillway__ModelInfo mi = SPILLWAY__MODEL_INFO__INIT;
    mi.name = (char *)o->model_name;
    mi.quantization = (char *)(o->quantization ? o->quantization : m->quant_name);
    uint32_t ctx = (uint32_t)sw_cpu_engine_n_ctx(e);
    mi.context_length = ctx;
    mi.embedding = sw_model_is_embedding(m);   /* the gateway sends it embeddings requests only */
    mi.embedding_dim = mi.embedding ? m->hp.n_embd : 0;
    Spillway__ModelInfo *models[1] = {&mi};
    sw_worker_config cfg = {
        .n_gateways = o->n_gateways, .drain_timeout_ms = o->drain_timeout_ms, .pool = o->pool, .worker_id = o->worker_id,
        .kind = SPILLWAY__WORKER_KIND__WORKER_KIND_CPU, .models = models, .n_models = 1,
        .slots = (uint32_t)o->parallel, .curve_secret_file = o->curve_secret, .gateway_key = o->gateway_key,
    };
    memcpy(cfg.gateways, o->gateways, sizeof cfg.gateways);
    char i8[48] = "";
    if (sw_i8_min_tokens()) snprintf(i8, sizeof i8, ", int8 form from %d tokens", sw_i8_min_tokens());
    sw_worker_log("serving %s (%s, %s, ctx %u, %s KV cache%s%s) with %d slots, %d threads, isa %s%s",
                  o->model_name, o->model_path, mi.quantization, ctx, sw_kv_type_name(o->kv_type),
                  mi.embedding ? ", embeddings pooled by " : "", mi.embedding ? sw_pooling_name(m->hp.pooling) : "",
                  o->parallel,
                  omp_get_max_threads(), sw_isa_name(sw_isa_active()), i8);
    int rc = sw_worker_run(&cfg, &sw_cpu_engine_ops, e);
    sw_cpu_engine_free(e);
    sw_model_free(m);
    return rc;
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc == 1) return 0;
    if (rc) return rc;
    return o.echo_rate > 0 ? run_echo(&o) : run_model(&o);
}
