/* spillway-gateway: the OpenAI-compatible HTTP front end of Spillway.
 *
 *   spillway-gateway --config FILE [--http HOST:PORT] [--workers ENDPOINT] [--check]
 *
 * --check validates the policy and prints OK or the errors
 * (file:line:column: message), exiting 0 or 1.
 *
 * HTTP endpoints:
 *   POST /v1/completions, /v1/chat/completions   OpenAI API, streaming (SSE) or not
 *   GET  /v1/models        models a live worker serves ("unavailable": routed, no worker)
 *   GET  /healthz          {"status":"ok","workers":N,...}
 *   GET  /metrics          Prometheus text (see gateway/metrics.c)
 *   GET  /admin/workers    the registry: pools, models, slots, load from heartbeats
 *   GET  /admin/status     pools with load, and workers (also served to SDK clients)
 *   GET  /admin/policy     the active policy, its version and source
 *   POST /admin/reload     reload the policy file (also SIGHUP, or the file changing)
 * Per-request directives: a "spillway" object in the body {target, quantization,
 * priority: interactive|batch, max_queue_ms} or the headers X-Spillway-Target,
 * X-Spillway-Quantization, X-Spillway-Priority, X-Spillway-Max-Queue-Ms; plus
 * X-Spillway-Tenant and Authorization: Bearer KEY for route match conditions.
 * Responses carry X-Spillway-Pool, X-Spillway-Worker and X-Spillway-Request-Id. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/stat.h>
#include <sodium.h>
#include "gateway/broker.h"
#include "gateway/gateway.h"
#include "gateway/http.h"
#include "gateway/keys.h"
#include "gateway/metrics.h"
#include "gateway/util.h"
#include "gateway/zap.h"
#include "proto/curve.h"
#include "llm/cli.h"

static sw_gateway G;

static void usage(FILE *f)
{
    fprintf(f, "usage: spillway-gateway --config FILE [--http HOST:PORT] [--workers ENDPOINT]\n"
               "                        [--sdk ENDPOINT] [--check] [security options]\n"
               "  --config FILE       routing policy (routes.yaml, see docs/routing.md)\n"
               "  --http HOST:PORT    HTTP listen address (default 127.0.0.1:8080; 0.0.0.0:PORT\n"
               "                      serves beyond this host)\n"
               "  --workers ENDPOINT  ZeroMQ endpoint workers connect to (default tcp://127.0.0.1:5555)\n"
               "  --sdk ENDPOINT      ZeroMQ endpoint for native SDK clients (default\n"
               "                      tcp://127.0.0.1:5556; 'none' disables it)\n"
               "  --check             validate the policy, print OK or the errors, and exit\n"
               "Security (docs/security.md):\n"
               "  --admin-token-file FILE  the token /admin/* requires (without it they answer 403)\n"
               "  --api-keys FILE          client API keys (hashed), their models, routes and limits\n"
               "  --curve-secret FILE      the gateway's CURVE keypair (spillway keygen)\n"
               "  --worker-keys FILE       CURVE public keys of the workers allowed to register\n"
               "  --client-keys FILE       CURVE public keys of the SDK clients allowed in\n"
               "  --insecure-workers       allow a non-loopback --workers endpoint without CURVE\n"
               "  --insecure-sdk           allow a non-loopback --sdk endpoint without CURVE client keys\n"
               "Signals: SIGHUP reloads the policy; SIGINT/SIGTERM stop.\n");
}

typedef struct {
    const char *config, *http, *workers, *sdk;
    const char *admin_token, *api_keys, *curve_secret, *worker_keys, *client_keys;
    bool sdk_given, check, insecure_workers, insecure_sdk;
} args;

/* Fills a from argv: -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, args *a)
{
    *a = (args){.http = "127.0.0.1:8080", .workers = "tcp://127.0.0.1:5555", .sdk = "tcp://127.0.0.1:5556"};
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--config") && i + 1 < argc) a->config = argv[++i];
        else if (!strcmp(s, "--http") && i + 1 < argc) a->http = argv[++i];
        else if (!strcmp(s, "--workers") && i + 1 < argc) a->workers = argv[++i];
        else if (!strcmp(s, "--sdk") && i + 1 < argc) { a->sdk = argv[++i]; a->sdk_given = true; }
        else if (!strcmp(s, "--admin-token-file") && i + 1 < argc) a->admin_token = argv[++i];
        else if (!strcmp(s, "--api-keys") && i + 1 < argc) a->api_keys = argv[++i];
        else if (!strcmp(s, "--curve-secret") && i + 1 < argc) a->curve_secret = argv[++i];
        else if (!strcmp(s, "--worker-keys") && i + 1 < argc) a->worker_keys = argv[++i];
        else if (!strcmp(s, "--client-keys") && i + 1 < argc) a->client_keys = argv[++i];
        else if (!strcmp(s, "--insecure-workers")) a->insecure_workers = true;
        else if (!strcmp(s, "--insecure-sdk")) a->insecure_sdk = true;
        else if (!strcmp(s, "--check")) a->check = true;
        else if (!strcmp(s, "-h") || !strcmp(s, "--help")) { usage(stdout); return 0; }
        else {
            fprintf(stderr, "spillway-gateway: unknown or incomplete argument '%s'\n", s);
            usage(stderr);
            return 2;
        }
    }
    if (!a->config) {
        fprintf(stderr, "spillway-gateway: --config FILE is required\n");
        usage(stderr);
        return 2;
    }
    return -1;
}

/* Whether a ZeroMQ endpoint can be reached from this host only: ipc:// and
 * inproc://, or tcp:// bound to a loopback address (or the "lo" interface).
 * Anything else (*, 0.0.0.0, an interface, a routable address) is not. */
static bool local_endpoint(const char *ep)
{
    if (!strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9)) return true;
    if (strncmp(ep, "tcp://", 6) != 0) return false;
    const char *h = ep + 6, *colon = strrchr(h, ':');
    char host[256];
    size_t n = colon ? (size_t)(colon - h) : strlen(h);
    if (n >= 2 && h[0] == '[' && h[n - 1] == ']') { h++; n -= 2; }
    if (n >= sizeof host) return false;
    memcpy(host, h, n);
    host[n] = 0;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
    return !strcmp(host, "localhost") || !strcmp(host, "lo");
}

/* The security options must make sense together, and a link beyond this
 * host must be authenticated unless the operator says otherwise: a
 * plaintext worker endpoint lets anyone register and read users' prompts
 * (docs/security.md). -1 to go on, else the exit code. */
static int check_security(const args *a)
{
    const char *why = NULL;
    if ((a->worker_keys || a->client_keys) && !a->curve_secret)
        why = "--worker-keys and --client-keys need --curve-secret FILE, the gateway's own keypair "
              "(spillway keygen --out gateway)";
    else if (a->curve_secret && !a->worker_keys)
        why = "--curve-secret needs --worker-keys FILE, the public keys of the workers allowed in "
              "(without it every worker would be refused)";
    else if (!a->curve_secret && !a->insecure_workers && !local_endpoint(a->workers))
        why = "the worker endpoint is reachable beyond this host but not authenticated: anyone who can "
              "reach it could register as a worker and read users' prompts. Give --curve-secret and "
              "--worker-keys (docs/security.md), bind it to 127.0.0.1, or pass --insecure-workers";
    else if (strcmp(a->sdk, "none") && !(a->curve_secret && a->client_keys) && !a->insecure_sdk &&
             !local_endpoint(a->sdk))
        why = "the SDK endpoint is reachable beyond this host but not authenticated: give --curve-secret "
              "and --client-keys (docs/security.md), bind it to 127.0.0.1, or pass --insecure-sdk";
    if (why) {
        fprintf(stderr, "spillway-gateway: refusing to start: %s\n", why);
        return 2;
    }
    if (!a->curve_secret && !local_endpoint(a->workers))
        fprintf(stderr, "spillway-gateway: WARNING: --insecure-workers: workers on %s are not authenticated\n",
                a->workers);
    return -1;
}

/* The admin token from --admin-token-file into *tok (malloc'd; NULL when
 * none was given). It is a secret: a file that group or others may read is
 * refused, as are an unreadable one and one that is empty once its trailing
 * newline is gone. -1 to go on, else the exit code. */
static int read_admin_token(const char *path, char **tok)
{
    *tok = NULL;
    if (!path) return -1;
    char buf[4098], err[1024];
    const char *why = err;
    long got = sw_secret_file_read(path, buf, sizeof buf, err, sizeof err);
    if (got >= 0) {
        size_t n = strlen(buf);
        why = n != (size_t)got ? "it holds a NUL byte" : NULL;
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = 0;
        if (!why && n == 0) why = "it is empty";
    }
    if (why) {
        fprintf(stderr, "spillway-gateway: refusing to start: --admin-token-file %s: %s "
                "(docs/security.md, \"Admin token\")\n", path, why);
        sodium_memzero(buf, sizeof buf);
        return 2;
    }
    *tok = strdup(buf);
    sodium_memzero(buf, sizeof buf);
    if (!*tok) {
        fprintf(stderr, "spillway-gateway: out of memory\n");
        return 1;
    }
    return -1;
}

/* The policy, or NULL with its errors printed (to stdout for --check). */
static sw_policy *load_policy(const args *a)
{
    static char err[16384];
    sw_policy *p = sw_policy_load(a->config, err, sizeof err);
    if (!p) {
        FILE *f = a->check ? stdout : stderr;
        fprintf(f, "%s%s", err, err[0] && err[strlen(err) - 1] == '\n' ? "" : "\n");
        if (!a->check) fprintf(stderr, "spillway-gateway: the policy in %s is invalid; not starting\n", a->config);
    }
    return p;
}

static void init_gateway(const args *a, sw_policy *p)
{
    sw_gw = &G;
    G.config_path = a->config;
    G.workers_ep = a->workers;
    G.sdk_ep = strcmp(a->sdk, "none") == 0 ? NULL : a->sdk;
    G.sdk_ep_optional = !a->sdk_given;   /* a busy default port is not worth refusing to start */
    G.admin_token_file = a->admin_token;
    G.api_keys_file = a->api_keys;
    G.curve_secret_file = a->curve_secret;
    G.worker_keys_file = a->worker_keys;
    G.client_keys_file = a->client_keys;
    G.insecure_workers = a->insecure_workers;
    sw_gw_init(&G, p);
    /* The mtime the running policy came from, for change detection. */
    struct stat st;
    if (stat(a->config, &st) == 0)
        G.policy_mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    srand((unsigned)(sw_now_ns() ^ getpid()));
}

/* Signals are taken synchronously by the main thread (sigwait): blocked
 * here, before any thread starts, so every thread inherits the mask. */
static void block_signals(sigset_t *sigs)
{
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(sigs);
    sigaddset(sigs, SIGINT);
    sigaddset(sigs, SIGTERM);
    sigaddset(sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, sigs, NULL);
}

/* Until SIGINT or SIGTERM; SIGHUP asks the broker to reload. */
static void wait_for_stop(sigset_t *sigs)
{
    for (;;) {
        int sig = 0;
        if (sigwait(sigs, &sig) != 0) continue;
        if (sig != SIGHUP) return;
        __atomic_store_n(&G.reload_requested, 1, __ATOMIC_RELEASE);   /* broker reloads at its next tick */
        sw_zap_reload();                                               /* and the key allowlists */
        sw_keys_reload_soon();                                         /* and the client API keys */
    }
}

int main(int argc, char **argv)
{
    args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    if (sodium_init() < 0) {     /* http.c hashes admin tokens with it */
        fprintf(stderr, "spillway-gateway: libsodium failed to initialize\n");
        return 1;
    }
    sw_policy *p = load_policy(&a);
    if (a.check) {
        if (!p) return 1;
        printf("OK\n");
        sw_policy_unref(p);
        return 0;
    }
    if (!p) return 1;
    char *admin_token = NULL;
    if ((rc = check_security(&a)) >= 0 || (rc = read_admin_token(a.admin_token, &admin_token)) >= 0) {
        sw_policy_unref(p);
        return rc;
    }
    char host[256];
    int port;
    if (!sw_parse_hostport(a.http, host, sizeof host, &port)) {
        fprintf(stderr, "spillway-gateway: --http wants HOST:PORT, got '%s'\n", a.http);
        sw_policy_unref(p);
        free(admin_token);
        return 2;
    }
    init_gateway(&a, p);
    G.admin_token = admin_token;
    sigset_t sigs;
    block_signals(&sigs);
    /* From here on a reload may free p: keep what the banner needs. */
    unsigned long long version = (unsigned long long)p->version;
    char err[4096];
    if (sw_broker_start(&G, err, sizeof err) != 0) {
        fprintf(stderr, "spillway-gateway: %s\n", err);
        return 1;
    }
    if (sw_http_start(&G, host, port, err, sizeof err) != 0) {
        fprintf(stderr, "spillway-gateway: %s\n", err);
        sw_broker_stop(&G);
        return 1;
    }
    fprintf(stderr, "spillway-gateway: serving http://%s:%d (policy %s, version %llu), workers on %s, "
            "SDK on %s\n", host, port, a.config, version, a.workers, G.sdk_ep ? G.sdk_ep : "(none)");
    if (!G.admin_token)
        fprintf(stderr, "spillway-gateway: no --admin-token-file: /admin/* answer 403 (docs/security.md)\n");
    wait_for_stop(&sigs);
    fprintf(stderr, "spillway-gateway: stopping\n");
    sw_broker_stop(&G);          /* answers every waiting request first */
    sw_zap_join();               /* it ended with the ZeroMQ context */
    usleep(100 * 1000);          /* let resumed connections send their answers */
    sw_http_stop(&G);
    sw_policy_unref(G.policy);
    if (G.admin_token) sodium_memzero(G.admin_token, strlen(G.admin_token));
    free(G.admin_token);
    return 0;
}
