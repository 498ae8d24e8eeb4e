/* spillway-loadgen: the load generator behind `make bench-gateway`.
 *
 *   spillway-loadgen --http HOST:PORT --model M --concurrency C
 *                    (--requests N | --duration S) [--stream] [--max-tokens K]
 *                    [--prompt TEXT] [--timeout S] [--ramp S] [--samples FILE]
 *   spillway-loadgen --direct ENDPOINT --model M --concurrency C
 *                    (--requests N | --duration S) [--max-tokens K]
 *                    [--workers W] [--wait S] [--prompt TEXT] [--timeout S] [--ramp S]
 *                    [--samples FILE]
 *
 * --http: C keep-alive HTTP/1.1 connections, each issuing POST /v1/completions
 *   one after another, all driven by one epoll thread with non-blocking
 *   sockets. Responses are parsed by hand (status line, headers,
 *   Content-Length or chunked body, SSE events) and validated, so a broken
 *   gateway shows up as errors, not as fast numbers.
 * --direct: the baseline of "calling the worker directly". The load generator
 *   binds a ROUTER at ENDPOINT and plays the gateway's part of the worker
 *   protocol: it waits for W workers to Register, keeps them alive with
 *   heartbeats, and keeps C GenerateRequests in flight (round-robin). Latency
 *   runs to the final TokenChunk. Comparing the two modes gives the latency
 *   the gateway itself adds.
 *
 * Latency is measured from the first byte of a request being sent (connection
 * setup excluded) to the complete response; time to first token (TTFT) to the
 * first SSE event (first TokenChunk in --direct). Output: a short table, then
 * exactly one JSON line with the figures. Exit status: 0 when every request
 * completed, 1 when any failed (or nothing completed), 2 for bad flags.
 *
 * Loopback only: this tool generates floods, so it refuses other addresses.
 */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "llm/cli.h"
#include "llm/clock.h"
#include "llm/text.h"
#include "proto/wire.h"

#define MAX_CONCURRENCY 10000
#define MAX_REQUESTS 10000000LL
#define MAX_DURATION_S 3600.0
#define MAX_TIMEOUT_S 600.0
#define MAX_MAX_TOKENS 65536
#define MAX_WORKERS 64
#define MAX_PROMPT 4096
#define MAX_HEADER_BYTES (64 * 1024)       /* a status line plus headers */
#define MAX_BODY_BYTES (8 * 1024 * 1024)   /* one decoded response body */
#define MAX_CHUNK_LINE 1024
#define CONNECT_RETRY_MS 100               /* after a refused connect: do not spin */
#define TIMER_SCAN_MS 10                   /* how often timeouts are checked */
#define DIRECT_HEARTBEAT_MS (SW_HEARTBEAT_MS / 2) /* well inside the worker's liveness */

/* ------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------ */

typedef enum { MODE_HTTP, MODE_DIRECT } run_mode;

typedef struct {
    run_mode mode;
    const char *target;        /* HOST:PORT or a ZeroMQ endpoint */
    const char *model;
    const char *prompt;
    int concurrency;
    long long requests;        /* 0 = run for duration_s */
    double duration_s;
    double timeout_s;          /* one request, send to last byte */
    double ramp_s;             /* spread the first requests over this long */
    const char *samples_path;  /* write every latency here (JSON) */
    bool stream;
    int max_tokens;
    int workers;               /* --direct: how many to wait for */
    double wait_s;             /* --direct: how long to wait for them */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char host_header[300];
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: spillway-loadgen --http HOST:PORT --model M --concurrency C\n"
            "                        (--requests N | --duration S) [--stream] [--max-tokens K]\n"
            "                        [--prompt TEXT] [--timeout S] [--ramp S] [--samples FILE]\n"
            "       spillway-loadgen --direct ENDPOINT --model M --concurrency C\n"
            "                        (--requests N | --duration S) [--max-tokens K]\n"
            "                        [--workers W] [--wait S] [--prompt TEXT] [--timeout S]\n"
            "                        [--ramp S] [--samples FILE]\n"
            "  --http HOST:PORT     gateway to load (loopback only): POST /v1/completions\n"
            "  --direct ENDPOINT    bind a ROUTER here (tcp://127.0.0.1:PORT or ipc://...) and\n"
            "                       send GenerateRequests straight to --test-echo workers\n"
            "  --model M            model name to request\n"
            "  --concurrency C      requests in flight at once, 1..%d\n"
            "  --requests N         total requests, 1..%lld\n"
            "  --duration S         or: issue requests for S seconds (0.1..%g)\n"
            "  --stream             ask for SSE streaming (--http; --direct always streams)\n"
            "  --max-tokens K       max_tokens per request, 1..%d (default 16)\n"
            "  --prompt TEXT        prompt text (default \"hello\")\n"
            "  --timeout S          per-request timeout in seconds (default 30)\n"
            "  --ramp S             start the C request loops evenly over S seconds (default 0:\n"
            "                       all at once), so long streams do not run in lockstep\n"
            "  --samples FILE       also write every request's latency and TTFT (ms) to FILE as\n"
            "                       JSON, to pool several runs before taking percentiles\n"
            "  --workers W          --direct: workers to wait for, 1..%d (default 1)\n"
            "  --wait S             --direct: how long to wait for them (default 15)\n"
            "Prints a table, then one JSON line. Exit 0: all requests completed; 1: some\n"
            "failed; 2: bad flags.\n",
            MAX_CONCURRENCY, MAX_REQUESTS, MAX_DURATION_S, MAX_MAX_TOKENS, MAX_WORKERS);
}

static int flag_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "spillway-loadgen: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(run with --help for usage)\n");
    va_end(ap);
    return 2;
}

/* HOST:PORT -> a loopback socket address. IPv4 127/8, localhost, ::1. */
static bool parse_http_target(options *o)
{
    char host[256];
    int port;
    if (!sw_parse_hostport(o->target, host, sizeof host, &port) || !host[0]) return false;
    memset(&o->addr, 0, sizeof o->addr);
    struct sockaddr_in *a4 = (struct sockaddr_in *)&o->addr;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&o->addr;
    if (!strcmp(host, "localhost")) {
        a4->sin_family = AF_INET;
        a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        if ((ntohl(a4->sin_addr.s_addr) >> 24) != 127) return false;
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        if (!IN6_IS_ADDR_LOOPBACK(&a6->sin6_addr)) return false;
    } else {
        return false;
    }
    if (a4->sin_family == AF_INET) {
        a4->sin_port = htons((uint16_t)port);
        o->addrlen = sizeof *a4;
    } else {
        a6->sin6_port = htons((uint16_t)port);
        o->addrlen = sizeof *a6;
    }
    snprintf(o->host_header, sizeof o->host_header, "%s", o->target);
    return true;
}

static bool loopback_endpoint(const char *ep)
{
    return !strncmp(ep, "tcp://127.", 10) || !strncmp(ep, "tcp://[::1]:", 12) ||
           !strncmp(ep, "tcp://localhost:", 16) || (!strncmp(ep, "ipc://", 6) && ep[6]);
}

/* A JSON string or a model/worker name goes into a request: keep it plain. */
static bool printable_name(const char *s)
{
    return sw_id_valid(s, SW_MAX_ID_LEN) && !strpbrk(s, "\"\\");
}

/* Which of the flags whose rules span others were given. */
typedef struct {
    bool mode, req, dur, workers, wait;
} seen_flags;

/* Flag a's value v as a whole number in lo..hi into *out: 0, or flag_error's code. */
static int whole_flag(const char *a, const char *v, long lo, long hi, long *out)
{
    if (sw_parse_long(v, lo, hi, out)) return 0;
    return flag_error("%s: '%s' is not a whole number in %ld..%ld", a, v, lo, hi);
}

/* Flag a's value v as seconds in lo..hi into *out: 0, or flag_error's code. */
static int seconds_flag(const char *a, const char *v, double lo, double hi, double *out)
{
    if (sw_parse_double(v, lo, hi, out)) return 0;
    return flag_error("%s: '%s' is not a number of seconds in %g..%g", a, v, lo, hi);
}

/* Flag a (known, with its value v) into o: 0, or flag_error's code. */
static int set_option(options *o, const char *a, const char *v, seen_flags *seen)
{
    long ll;
    int rc;
    if (!strcmp(a, "--http") || !strcmp(a, "--direct")) {
        if (seen->mode) return flag_error("give exactly one of --http and --direct");
        seen->mode = true;
        o->mode = !strcmp(a, "--http") ? MODE_HTTP : MODE_DIRECT;
        o->target = v;
    } else if (!strcmp(a, "--model")) {
        o->model = v;
    } else if (!strcmp(a, "--concurrency")) {
        if ((rc = whole_flag(a, v, 1, MAX_CONCURRENCY, &ll))) return rc;
        o->concurrency = (int)ll;
    } else if (!strcmp(a, "--requests")) {
        if ((rc = whole_flag(a, v, 1, MAX_REQUESTS, &ll))) return rc;
        o->requests = ll;
        seen->req = true;
    } else if (!strcmp(a, "--duration")) {
        if ((rc = seconds_flag(a, v, 0.1, MAX_DURATION_S, &o->duration_s))) return rc;
        seen->dur = true;
    } else if (!strcmp(a, "--max-tokens")) {
        if ((rc = whole_flag(a, v, 1, MAX_MAX_TOKENS, &ll))) return rc;
        o->max_tokens = (int)ll;
    } else if (!strcmp(a, "--prompt")) {
        o->prompt = v;
    } else if (!strcmp(a, "--timeout")) {
        if ((rc = seconds_flag(a, v, 0.01, MAX_TIMEOUT_S, &o->timeout_s))) return rc;
    } else if (!strcmp(a, "--samples")) {
        if (!*v) return flag_error("--samples needs a file name");
        o->samples_path = v;
    } else if (!strcmp(a, "--ramp")) {
        if ((rc = seconds_flag(a, v, 0, MAX_DURATION_S, &o->ramp_s))) return rc;
    } else if (!strcmp(a, "--workers")) {
        if ((rc = whole_flag(a, v, 1, MAX_WORKERS, &ll))) return rc;
        o->workers = (int)ll;
        seen->workers = true;
    } else if (!strcmp(a, "--wait")) {
        if ((rc = seconds_flag(a, v, 0.1, MAX_TIMEOUT_S, &o->wait_s))) return rc;
        seen->wait = true;
    }
    return 0;
}

/* The rules across flags, once all are read: 0, or flag_error's code. */
static int check_options(options *o, const seen_flags *seen)
{
    if (!seen->mode) return flag_error("give one of --http HOST:PORT and --direct ENDPOINT");
    if (!o->model) return flag_error("--model is required");
    if (!printable_name(o->model))
        return flag_error("--model: '%s' must be 1..%d printable characters without spaces or "
                          "quotes", o->model, SW_MAX_ID_LEN);
    if (!o->concurrency) return flag_error("--concurrency is required");
    if (seen->req == seen->dur) return flag_error("give exactly one of --requests and --duration");
    if (!o->prompt[0] || strlen(o->prompt) > MAX_PROMPT)
        return flag_error("--prompt must be 1..%d bytes", MAX_PROMPT);
    if (o->mode == MODE_HTTP) {
        if (seen->workers || seen->wait) return flag_error("--workers and --wait go with --direct");
        if (!parse_http_target(o))
            return flag_error("--http: '%s' is not a loopback HOST:PORT (127.x.x.x, localhost, "
                              "[::1])", o->target);
    } else {
        if (!loopback_endpoint(o->target))
            return flag_error("--direct: '%s' is not a loopback endpoint (tcp://127.x.x.x:PORT, "
                              "tcp://[::1]:PORT, ipc://PATH)", o->target);
        o->stream = true; /* workers always stream chunks */
    }
    return 0;
}

static int parse_args(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->prompt = "hello";
    o->max_tokens = 16;
    o->timeout_s = 30;
    o->workers = 1;
    o->wait_s = 15;
    seen_flags seen = { 0 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--stream")) {
            o->stream = true;
            continue;
        }
        static const char *valued[] = {"--http", "--direct", "--model", "--concurrency",
                                       "--requests", "--duration", "--max-tokens", "--prompt",
                                       "--timeout", "--workers", "--wait", "--ramp",
                                       "--samples"};
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof *valued; k++) known |= !strcmp(a, valued[k]);
        if (!known) return flag_error("unknown argument '%s'", a);
        if (i + 1 >= argc) return flag_error("%s needs a value", a);
        const char *v = argv[++i];
        int rc = set_option(o, a, v, &seen);
        if (rc) return rc;
    }
    return check_options(o, &seen);
}

/* ------------------------------------------------------------------------
 * Time, statistics, report
 * ------------------------------------------------------------------------ */

static volatile sig_atomic_t g_interrupted;
static void on_sigint(int sig)
{
    (void)sig;
    g_interrupted = 1;
}

typedef struct {
    double *v;
    size_t n, cap;
} samples;

static void samples_add(samples *s, double ms)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4096;
        double *v = realloc(s->v, cap * sizeof *v);
        if (!v) return; /* out of memory: this sample is lost, the run goes on */
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = ms;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array; NAN when empty. */
static double pct(const samples *s, double p)
{
    if (!s->n) return NAN;
    size_t rank = (size_t)ceil(p / 100.0 * (double)s->n);
    if (rank < 1) rank = 1;
    if (rank > s->n) rank = s->n;
    return s->v[rank - 1];
}

static double mean(const samples *s)
{
    if (!s->n) return NAN;
    double t = 0;
    for (size_t i = 0; i < s->n; i++) t += s->v[i];
    return t / (double)s->n;
}

typedef struct {
    long long issued, completed;
    long long err_connect, err_io, err_status, err_malformed, err_stream, err_timeout;
    long long chunks;            /* SSE data events (--http --stream) or TokenChunks (--direct) */
    long long tokens;            /* completion tokens per usage (--http without --stream) */
    int64_t t_begin, t_end;      /* first send, end of the run */
    samples lat, ttft;
} stats;

static long long total_errors(const stats *s)
{
    return s->err_connect + s->err_io + s->err_status + s->err_malformed + s->err_stream +
           s->err_timeout;
}

/* JSON has no NaN: an absent figure is null. */
static void json_num(FILE *f, const char *key, double v)
{
    if (isfinite(v)) fprintf(f, ",\"%s\":%.3f", key, v);
    else fprintf(f, ",\"%s\":null", key);
}

static void write_array(FILE *f, const char *key, const samples *s)
{
    fprintf(f, "\"%s\":[", key);
    for (size_t i = 0; i < s->n; i++) fprintf(f, "%s%.4f", i ? "," : "", s->v[i]);
    fprintf(f, "]");
}

/* {"latency_ms":[...],"ttft_ms":[...]}: raw figures, in completion order. */
static int write_samples(const char *path, const stats *s)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "spillway-loadgen: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "{");
    write_array(f, "latency_ms", &s->lat);
    fprintf(f, ",");
    write_array(f, "ttft_ms", &s->ttft);
    fprintf(f, "}\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "spillway-loadgen: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

static void report(const options *o, stats *s)
{
    if (s->lat.n) qsort(s->lat.v, s->lat.n, sizeof(double), cmp_double);
    if (s->ttft.n) qsort(s->ttft.v, s->ttft.n, sizeof(double), cmp_double);
    double elapsed = s->t_begin && s->t_end > s->t_begin ? (double)(s->t_end - s->t_begin) / 1e9 : 0;
    double rps = elapsed > 0 ? (double)s->completed / elapsed : 0;
    const char *mode = o->mode == MODE_HTTP ? "http" : "direct";
    long long errors = total_errors(s);

    printf("spillway-loadgen  mode %s  target %s  model %s  concurrency %d  stream %s  "
           "max_tokens %d\n", mode, o->target, o->model, o->concurrency, o->stream ? "yes" : "no",
           o->max_tokens);
    printf("  %-12s %lld issued, %lld completed, %lld errors\n", "requests", s->issued,
           s->completed, errors);
    if (errors)
        printf("  %-12s connect %lld, io %lld, http status %lld, malformed %lld, stream error "
               "%lld, timeout %lld\n", "errors", s->err_connect, s->err_io, s->err_status,
               s->err_malformed, s->err_stream, s->err_timeout);
    printf("  %-12s %.3f s, %.1f requests/s, %lld chunks, %lld tokens\n", "throughput", elapsed,
           rps, s->chunks, s->tokens);
    printf("  %-12s %9s %9s %9s %9s %9s\n", "(ms)", "p50", "p90", "p99", "max", "mean");
    printf("  %-12s %9.3f %9.3f %9.3f %9.3f %9.3f\n", "latency", pct(&s->lat, 50),
           pct(&s->lat, 90), pct(&s->lat, 99), pct(&s->lat, 100), mean(&s->lat));
    if (o->stream)
        printf("  %-12s %9.3f %9.3f %9.3f %9.3f %9.3f\n", "ttft", pct(&s->ttft, 50),
               pct(&s->ttft, 90), pct(&s->ttft, 99), pct(&s->ttft, 100), mean(&s->ttft));

    printf("{\"mode\":\"%s\",\"model\":\"%s\",\"stream\":%s,\"concurrency\":%d,\"max_tokens\":%d",
           mode, o->model, o->stream ? "true" : "false", o->concurrency, o->max_tokens);
    printf(",\"requests\":%lld,\"completed\":%lld,\"errors\":%lld", s->issued, s->completed,
           errors);
    printf(",\"errors_by_kind\":{\"connect\":%lld,\"io\":%lld,\"status\":%lld,\"malformed\":%lld,"
           "\"stream\":%lld,\"timeout\":%lld}", s->err_connect, s->err_io, s->err_status,
           s->err_malformed, s->err_stream, s->err_timeout);
    printf(",\"chunks\":%lld,\"tokens\":%lld", s->chunks, s->tokens);
    json_num(stdout, "elapsed_s", elapsed);
    json_num(stdout, "rps", rps);
    json_num(stdout, "p50_ms", pct(&s->lat, 50));
    json_num(stdout, "p90_ms", pct(&s->lat, 90));
    json_num(stdout, "p99_ms", pct(&s->lat, 99));
    json_num(stdout, "max_ms", pct(&s->lat, 100));
    json_num(stdout, "mean_ms", mean(&s->lat));
    json_num(stdout, "ttft_p50_ms", o->stream ? pct(&s->ttft, 50) : NAN);
    json_num(stdout, "ttft_p90_ms", o->stream ? pct(&s->ttft, 90) : NAN);
    json_num(stdout, "ttft_p99_ms", o->stream ? pct(&s->ttft, 99) : NAN);
    printf("}\n");
    fflush(stdout);
}

/* ------------------------------------------------------------------------
 * Shared request pacing: --requests N or --duration S
 * ------------------------------------------------------------------------ */

typedef struct {
    const options *o;
    stats st;
    int64_t end_issue_ns;      /* --duration: stop issuing at this time */
    int64_t hard_stop_ns;      /* nothing runs past this */
} run;

/* Nothing runs past this: --duration plus one request timeout, or for
 * --requests N the longest --duration allowed. */
static int64_t run_budget_ns(const options *o)
{
    double s = (o->requests ? MAX_DURATION_S : o->duration_s) + o->timeout_s + 1;
    return (int64_t)(s * 1e9);
}

/* Claims the next request, or returns false when the run is issuing no more. */
static bool claim_request(run *r, int64_t now)
{
    if (g_interrupted || now >= r->hard_stop_ns) return false;
    if (r->o->requests ? r->st.issued >= r->o->requests : now >= r->end_issue_ns) return false;
    r->st.issued++;
    if (!r->st.t_begin) r->st.t_begin = now;
    return true;
}

static void record_ok(run *r, int64_t t_start, int64_t t_first, int64_t now)
{
    r->st.completed++;
    samples_add(&r->st.lat, (double)(now - t_start) / 1e6);
    if (t_first) samples_add(&r->st.ttft, (double)(t_first - t_start) / 1e6);
}

/* ========================================================================
 * HTTP mode
 * ======================================================================== */

typedef enum { C_IDLE, C_BACKOFF, C_CONNECTING, C_ACTIVE, C_DONE } conn_state;
typedef enum { P_HEAD, P_BODY_LEN, P_BODY_EOF, P_CHUNK_SIZE, P_CHUNK_DATA, P_CHUNK_CRLF,
               P_TRAILERS, P_COMPLETE } parse_state;

typedef struct {
    int fd;
    uint32_t index, gen;       /* gen tells a new socket's events from a closed one's */
    conn_state st;
    int64_t retry_at, deadline;
    /* The request in progress. */
    bool in_request;
    size_t wr_off;
    int64_t t_start, t_first;
    /* Raw bytes received and not yet parsed. */
    char *rd;
    size_t rd_len, rd_cap;
    /* Response parsing. */
    parse_state ps;
    int status;
    long long content_length, chunk_left;
    bool chunked, conn_close;
    /* Decoded body (non-stream), or SSE bytes not yet split into events. */
    char *body;
    size_t body_len, body_cap;
    int events;
    bool got_done, stream_error, after_done;
} conn;

typedef struct {
    run r;
    int ep;
    conn *conns;
    char *req;
    size_t req_len;
    int open;                   /* connections not yet C_DONE */
} http_run;

static bool buf_append(char **buf, size_t *len, size_t *cap, const char *data, size_t n,
                       size_t limit)
{
    if (*len + n > limit) return false;
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < *len + n + 1) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return false;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = 0;
    return true;
}

static void build_http_request(http_run *h)
{
    const options *o = h->r.o;
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", o->model);
    cJSON_AddStringToObject(b, "prompt", o->prompt);
    cJSON_AddNumberToObject(b, "max_tokens", o->max_tokens);
    cJSON_AddBoolToObject(b, "stream", o->stream);
    char *body = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    if (!body) {
        fprintf(stderr, "spillway-loadgen: out of memory\n");
        exit(1);
    }
    size_t cap = strlen(body) + 512;
    h->req = malloc(cap);
    if (!h->req) exit(1);
    h->req_len = (size_t)snprintf(h->req, cap,
                                  "POST /v1/completions HTTP/1.1\r\n"
                                  "Host: %s\r\n"
                                  "Content-Type: application/json\r\n"
                                  "Accept: %s\r\n"
                                  "Content-Length: %zu\r\n"
                                  "\r\n%s",
                                  o->host_header, o->stream ? "text/event-stream" : "application/json",
                                  strlen(body), body);
    free(body);
}

static void reset_response(conn *c)
{
    c->rd_len = 0;
    c->body_len = 0;
    c->ps = P_HEAD;
    c->status = 0;
    c->content_length = -1;
    c->chunk_left = 0;
    c->chunked = c->conn_close = false;
    c->events = 0;
    c->got_done = c->stream_error = c->after_done = false;
    c->t_first = 0;
}

static void conn_close(http_run *h, conn *c)
{
    if (c->fd >= 0) {
        close(c->fd); /* also removes it from the epoll set */
        c->fd = -1;
    }
    c->in_request = false;
}

static void conn_finish(http_run *h, conn *c)
{
    conn_close(h, c);
    if (c->st != C_DONE) {
        c->st = C_DONE;
        h->open--;
    }
}

static void start_connect(http_run *h, conn *c, int64_t now);

/* A request failed: count it, drop the connection (its state is unknown), and
 * come back on a fresh one. */
static void conn_fail(http_run *h, conn *c, long long *counter, int64_t now)
{
    (*counter)++;
    conn_close(h, c);
    c->st = C_IDLE;
    start_connect(h, c, now);
}

/* Sends as much of the request as the socket takes. */
static int conn_write(http_run *h, conn *c)
{
    while (c->wr_off < h->req_len) {
        ssize_t n = send(c->fd, h->req + c->wr_off, h->req_len - c->wr_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->wr_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else {
            return -1;
        }
    }
    return 0;
}

/* Begins the next request on an open connection, or retires the connection. */
static void next_request(http_run *h, conn *c, int64_t now)
{
    if (!claim_request(&h->r, now)) {
        conn_finish(h, c);
        return;
    }
    reset_response(c);
    c->in_request = true;
    c->wr_off = 0;
    c->t_start = now;
    c->deadline = now + (int64_t)(h->r.o->timeout_s * 1e9);
    if (conn_write(h, c) < 0) conn_fail(h, c, &h->r.st.err_io, now);
}

static void start_connect(http_run *h, conn *c, int64_t now)
{
    const options *o = h->r.o;
    /* Do not open a connection for a request that will never be issued. */
    if (g_interrupted || (o->requests ? h->r.st.issued >= o->requests : now >= h->r.end_issue_ns)) {
        conn_finish(h, c);
        return;
    }
    int fd = socket(o->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fprintf(stderr, "spillway-loadgen: socket: %s\n", strerror(errno));
        goto retry_later;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (const struct sockaddr *)&o->addr, o->addrlen) < 0 && errno != EINPROGRESS) {
        close(fd);
        goto retry_later;
    }
    c->gen++;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                             .data.u64 = (uint64_t)c->gen << 32 | c->index};
    if (epoll_ctl(h->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
        close(fd);
        goto retry_later;
    }
    c->fd = fd;
    c->st = C_CONNECTING;
    c->deadline = now + (int64_t)(o->timeout_s * 1e9);
    return;
retry_later:
    /* A refused connect costs a request (so --requests N stays bounded) and
     * the retry waits, so a dead gateway does not turn into a busy loop. */
    if (claim_request(&h->r, now)) h->r.st.err_connect++;
    c->st = C_BACKOFF;
    c->retry_at = now + (int64_t)CONNECT_RETRY_MS * 1000000;
}

/* ---- response parsing ---------------------------------------------------- */

static const char *find_crlf(const char *p, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++)
        if (p[i] == '\r' && p[i + 1] == '\n') return p + i;
    return NULL;
}

static const char *find_head_end(const char *p, size_t n)
{
    for (size_t i = 0; i + 3 < n; i++)
        if (p[i] == '\r' && p[i + 1] == '\n' && p[i + 2] == '\r' && p[i + 3] == '\n')
            return p + i;
    return NULL;
}

static bool header_is(const char *name, size_t nlen, const char *want)
{
    return nlen == strlen(want) && !strncasecmp(name, want, nlen);
}

static bool value_has_token(const char *v, size_t vlen, const char *tok)
{
    size_t t = strlen(tok);
    for (size_t i = 0; i + t <= vlen; i++)
        if (!strncasecmp(v + i, tok, t)) return true;
    return false;
}

/* Parses the status line and headers in [p, p+n). Returns false if malformed. */
static bool parse_head(conn *c, const char *p, size_t n)
{
    const char *eol = find_crlf(p, n + 2);
    if (!eol || eol - p < 12 || strncmp(p, "HTTP/1.", 7) || p[8] != ' ') return false;
    if (!isdigit((unsigned char)p[9]) || !isdigit((unsigned char)p[10]) ||
        !isdigit((unsigned char)p[11]) || (eol - p > 12 && p[12] != ' '))
        return false;
    c->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    if (p[7] == '0') c->conn_close = true; /* HTTP/1.0: close unless told otherwise */
    const char *end = p + n;
    for (const char *line = eol + 2; line < end;) {
        const char *le = find_crlf(line, (size_t)(end - line) + 2);
        if (!le) le = end;
        const char *colon = memchr(line, ':', (size_t)(le - line));
        if (!colon || colon == line) return false;
        size_t nlen = (size_t)(colon - line);
        const char *v = colon + 1;
        while (v < le && (*v == ' ' || *v == '\t')) v++;
        size_t vlen = (size_t)(le - v);
        while (vlen && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t')) vlen--;
        if (header_is(line, nlen, "content-length")) {
            long long cl = 0;
            if (!vlen || vlen > 12) return false;
            for (size_t i = 0; i < vlen; i++) {
                if (!isdigit((unsigned char)v[i])) return false;
                cl = cl * 10 + (v[i] - '0');
            }
            if (c->content_length >= 0 && c->content_length != cl) return false;
            c->content_length = cl;
        } else if (header_is(line, nlen, "transfer-encoding")) {
            if (value_has_token(v, vlen, "chunked")) c->chunked = true;
        } else if (header_is(line, nlen, "connection")) {
            if (value_has_token(v, vlen, "close")) c->conn_close = true;
            else if (value_has_token(v, vlen, "keep-alive")) c->conn_close = false;
        }
        line = le + 2;
    }
    if (c->content_length > MAX_BODY_BYTES) return false;
    return true;
}

/* One SSE event (the text between blank lines). */
static void on_sse_event(http_run *h, conn *c, char *ev, size_t n, int64_t now)
{
    ev[n] = 0;
    for (char *line = ev; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        size_t ll = strlen(line);
        if (ll && line[ll - 1] == '\r') line[--ll] = 0;
        if (!strncmp(line, "data:", 5)) {
            char *d = line + 5;
            if (*d == ' ') d++;
            size_t dl = strlen(d);
            if (c->got_done) {
                c->after_done = true;            /* nothing may follow [DONE] */
            } else if (!strcmp(d, "[DONE]")) {
                c->got_done = true;
            } else if (dl < 2 || d[0] != '{' || d[dl - 1] != '}') {
                c->stream_error = true;          /* not a JSON object: malformed */
                c->after_done = true;
            } else {
                if (!strncmp(d, "{\"error\"", 8) || strstr(d, "\"finish_reason\":\"error\""))
                    c->stream_error = true;
                if (!c->t_first) c->t_first = now;
                c->events++;
                h->r.st.chunks++;
            }
        }
        line = nl ? nl + 1 : NULL;
    }
}

/* Splits complete SSE events off the front of the body buffer. */
static void drain_sse(http_run *h, conn *c, int64_t now)
{
    size_t start = 0;
    for (size_t i = 0; i + 1 < c->body_len; i++) {
        size_t sep = 0;
        if (c->body[i] == '\n' && c->body[i + 1] == '\n') sep = 2;
        else if (i + 3 < c->body_len && !memcmp(c->body + i, "\r\n\r\n", 4)) sep = 4;
        if (!sep) continue;
        on_sse_event(h, c, c->body + start, i - start, now);
        start = i + sep;
        i = start - 1;
    }
    if (start) {
        memmove(c->body, c->body + start, c->body_len - start);
        c->body_len -= start;
    }
}

static bool body_bytes(http_run *h, conn *c, const char *p, size_t n, int64_t now)
{
    if (!buf_append(&c->body, &c->body_len, &c->body_cap, p, n, MAX_BODY_BYTES)) return false;
    if (h->r.o->stream && c->status == 200) drain_sse(h, c, now);
    return true;
}

/* Is the complete response what a client should accept? Counts the outcome. */
static void finish_response(http_run *h, conn *c, int64_t now)
{
    stats *st = &h->r.st;
    bool keep = !c->conn_close && c->rd_len == 0;
    if (c->status != 200) {
        st->err_status++;
    } else if (h->r.o->stream) {
        for (size_t i = 0; i < c->body_len; i++)  /* only blank lines may be left over */
            if (c->body[i] != '\n' && c->body[i] != '\r') {
                c->after_done = true;
                break;
            }
        if (c->after_done || !c->got_done || c->events == 0) st->err_malformed++;
        else if (c->stream_error) st->err_stream++;
        else record_ok(&h->r, c->t_start, c->t_first, now);
    } else {
        cJSON *j = cJSON_ParseWithLength(c->body, c->body_len);
        cJSON *choices = j ? cJSON_GetObjectItemCaseSensitive(j, "choices") : NULL;
        cJSON *first = cJSON_IsArray(choices) ? cJSON_GetArrayItem(choices, 0) : NULL;
        cJSON *text = first ? cJSON_GetObjectItemCaseSensitive(first, "text") : NULL;
        if (!cJSON_IsString(text)) {
            st->err_malformed++;
        } else {
            cJSON *usage = cJSON_GetObjectItemCaseSensitive(j, "usage");
            cJSON *ct = usage ? cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens") : NULL;
            if (cJSON_IsNumber(ct) && ct->valuedouble >= 0) st->tokens += (long long)ct->valuedouble;
            record_ok(&h->r, c->t_start, 0, now);
        }
        cJSON_Delete(j);
    }
    c->in_request = false;
    c->ps = P_COMPLETE;
    if (!keep) {
        /* Bytes after the response, or the server closing: start afresh. */
        conn_close(h, c);
        c->st = C_IDLE;
        start_connect(h, c, now);
        return;
    }
    next_request(h, c, now);
}

/* What one parser step did: go on with the next state, wait for more
 * bytes, or give up on a malformed response. */
enum { STEP_ON = 0, STEP_WAIT = 2, STEP_FAIL = -1 };

/* P_HEAD: the status line and headers, if all of them are in p. */
static int step_head(conn *c, const char *p, size_t avail, size_t *off)
{
    const char *he = find_head_end(p, avail);
    if (!he) return avail > MAX_HEADER_BYTES ? STEP_FAIL : STEP_WAIT;
    if (!parse_head(c, p, (size_t)(he - p))) return STEP_FAIL;
    *off += (size_t)(he - p) + 4;
    if (c->status >= 100 && c->status < 200) { /* 100 Continue: the real one follows */
        c->status = 0;
        c->content_length = -1;
        c->chunked = false;
        return STEP_ON;
    }
    if (c->status == 204 || c->status == 304) c->ps = P_COMPLETE;
    else if (c->chunked) c->ps = P_CHUNK_SIZE;
    else if (c->content_length >= 0) c->ps = c->content_length ? P_BODY_LEN : P_COMPLETE;
    else {
        c->ps = P_BODY_EOF;
        c->conn_close = true;
    }
    return STEP_ON;
}

/* P_CHUNK_SIZE: a chunk's hex size line, if all of it is in p. */
static int step_chunk_size(conn *c, const char *p, size_t avail, size_t *off)
{
    const char *le = find_crlf(p, avail);
    if (!le) return avail > MAX_CHUNK_LINE ? STEP_FAIL : STEP_WAIT;
    long long size = 0;
    const char *q = p;
    if (q == le || !isxdigit((unsigned char)*q)) return STEP_FAIL;
    for (; q < le && isxdigit((unsigned char)*q); q++) {
        size = size * 16 + (isdigit((unsigned char)*q) ? *q - '0' : (tolower(*q) - 'a' + 10));
        if (size > MAX_BODY_BYTES) return STEP_FAIL;
    }
    while (q < le && (*q == ' ' || *q == '\t')) q++;
    if (q < le && *q != ';') return STEP_FAIL; /* only chunk extensions may follow the size */
    *off += (size_t)(le - p) + 2;
    c->chunk_left = size;
    c->ps = size ? P_CHUNK_DATA : P_TRAILERS;
    return STEP_ON;
}

/* P_BODY_LEN and P_CHUNK_DATA: up to *left body bytes of p, then state
 * `next` once none are left. A body that body_bytes refuses still counts
 * as consumed. */
static int step_body(http_run *h, conn *c, const char *p, size_t avail, size_t *off, long long *left, parse_state next,
                     int64_t now)
{
    size_t take = avail < (size_t)*left ? avail : (size_t)*left;
    if (!take) return STEP_WAIT;
    int r = body_bytes(h, c, p, take, now) ? STEP_ON : STEP_FAIL;
    *off += take;
    *left -= (long long)take;
    if (!*left) c->ps = next;
    return r;
}

/* Consumes c->rd as far as it goes. Returns -1 if malformed, 1 when a
 * response completed (the caller moves on), 0 when more bytes are needed. */
static int parse_some(http_run *h, conn *c, bool eof, int64_t now)
{
    size_t off = 0;
    int rc = 0;
    while (rc == 0) {
        const char *p = c->rd + off;
        size_t avail = c->rd_len - off;
        int r = STEP_ON;
        switch (c->ps) {
        case P_HEAD:
            r = step_head(c, p, avail, &off);
            break;
        case P_BODY_LEN:
            r = step_body(h, c, p, avail, &off, &c->content_length, P_COMPLETE, now);
            break;
        case P_BODY_EOF:
            if (avail && !body_bytes(h, c, p, avail, now)) r = STEP_FAIL;
            off += avail;
            if (eof) c->ps = P_COMPLETE;
            else if (r == STEP_ON) r = STEP_WAIT;
            break;
        case P_CHUNK_SIZE:
            r = step_chunk_size(c, p, avail, &off);
            break;
        case P_CHUNK_DATA:
            r = step_body(h, c, p, avail, &off, &c->chunk_left, P_CHUNK_CRLF, now);
            break;
        case P_CHUNK_CRLF:
            if (avail < 2) r = STEP_WAIT;
            else if (p[0] != '\r' || p[1] != '\n') r = STEP_FAIL;
            else {
                off += 2;
                c->ps = P_CHUNK_SIZE;
            }
            break;
        case P_TRAILERS: {
            const char *le = find_crlf(p, avail);
            if (!le) {
                r = avail > MAX_HEADER_BYTES ? STEP_FAIL : STEP_WAIT;
                break;
            }
            off += (size_t)(le - p) + 2;
            if (le == p) c->ps = P_COMPLETE; /* the empty line ends the message */
            break;
        }
        case P_COMPLETE:
            r = 1;
            break;
        }
        if (r == STEP_WAIT) break;
        rc = r;
    }
    if (off) {
        memmove(c->rd, c->rd + off, c->rd_len - off);
        c->rd_len -= off;
    }
    return rc;
}

static void conn_readable(http_run *h, conn *c, int64_t now)
{
    bool eof = false;
    for (;;) {
        char buf[65536];
        ssize_t n = recv(c->fd, buf, sizeof buf, 0);
        if (n > 0) {
            if (!c->in_request) { /* bytes nobody asked for */
                conn_fail(h, c, &h->r.st.err_malformed, now);
                return;
            }
            if (!buf_append(&c->rd, &c->rd_len, &c->rd_cap, buf, (size_t)n,
                            MAX_BODY_BYTES + MAX_HEADER_BYTES)) {
                conn_fail(h, c, &h->r.st.err_malformed, now);
                return;
            }
            /* Parse as we go so TTFT is stamped when the bytes arrive. */
            int rc = parse_some(h, c, false, now);
            if (rc < 0) {
                conn_fail(h, c, &h->r.st.err_malformed, now);
                return;
            }
            if (rc == 1) {
                finish_response(h, c, now);
                if (c->st != C_ACTIVE) return;
            }
        } else if (n == 0) {
            eof = true;
            break;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return;
        } else {
            if (c->in_request) conn_fail(h, c, &h->r.st.err_io, now);
            else {
                conn_close(h, c);
                c->st = C_IDLE;
                start_connect(h, c, now);
            }
            return;
        }
    }
    /* The server closed the connection. */
    if (eof) {
        if (c->in_request && c->ps == P_BODY_EOF && parse_some(h, c, true, now) == 1) {
            c->conn_close = true;
            finish_response(h, c, now);
            return;
        }
        if (c->in_request) conn_fail(h, c, &h->r.st.err_io, now);
        else {
            /* An idle keep-alive connection closed by the server: reconnect. */
            conn_close(h, c);
            c->st = C_IDLE;
            start_connect(h, c, now);
        }
    }
}

static void on_conn_event(http_run *h, conn *c, uint32_t events, int64_t now)
{
    if (c->st == C_CONNECTING) {
        if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
            conn_close(h, c);
            c->st = C_IDLE;
            if (claim_request(&h->r, now)) h->r.st.err_connect++;
            c->st = C_BACKOFF;
            c->retry_at = now + (int64_t)CONNECT_RETRY_MS * 1000000;
            return;
        }
        c->st = C_ACTIVE;
        next_request(h, c, now);
        if (c->st != C_ACTIVE) return;
    }
    if (c->st != C_ACTIVE) return;
    if (events & EPOLLOUT && c->in_request && c->wr_off < h->req_len) {
        if (conn_write(h, c) < 0) {
            conn_fail(h, c, &h->r.st.err_io, now);
            return;
        }
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) conn_readable(h, c, now);
}

static void check_timers(http_run *h, int64_t now)
{
    for (int i = 0; i < h->r.o->concurrency; i++) {
        conn *c = &h->conns[i];
        if (c->st == C_BACKOFF && now >= c->retry_at) {
            c->st = C_IDLE;
            start_connect(h, c, now);
        } else if (c->st == C_CONNECTING && now >= c->deadline) {
            conn_close(h, c);
            c->st = C_IDLE;
            if (claim_request(&h->r, now)) h->r.st.err_timeout++;
            start_connect(h, c, now);
        } else if (c->st == C_ACTIVE && c->in_request && now >= c->deadline) {
            conn_fail(h, c, &h->r.st.err_timeout, now);
        } else if (now >= h->r.hard_stop_ns && c->st != C_DONE) {
            if (c->in_request) h->r.st.err_timeout++;
            conn_finish(h, c);
        }
    }
}

static int run_http(const options *o)
{
    http_run h;
    memset(&h, 0, sizeof h);
    h.r.o = o;
    int64_t t0 = sw_clock_ns();
    h.r.end_issue_ns = t0 + (int64_t)(o->duration_s * 1e9);
    h.r.hard_stop_ns = t0 + run_budget_ns(o);
    build_http_request(&h);
    h.ep = epoll_create1(EPOLL_CLOEXEC);
    if (h.ep < 0) {
        fprintf(stderr, "spillway-loadgen: epoll_create1: %s\n", strerror(errno));
        return 1;
    }
    h.conns = calloc((size_t)o->concurrency, sizeof *h.conns);
    if (!h.conns) return 1;
    h.open = o->concurrency;
    for (int i = 0; i < o->concurrency; i++) {
        conn *c = &h.conns[i];
        c->fd = -1;
        c->index = (uint32_t)i;
        c->st = C_IDLE;
        if (o->ramp_s > 0 && i > 0) { /* the timer scan starts it when its turn comes */
            c->st = C_BACKOFF;
            c->retry_at = t0 + (int64_t)(o->ramp_s * 1e9 * i / o->concurrency);
        } else {
            start_connect(&h, c, sw_clock_ns());
        }
    }
    struct epoll_event evs[512];
    int64_t last_scan = sw_clock_ns();
    while (h.open > 0) {
        int n = epoll_wait(h.ep, evs, 512, TIMER_SCAN_MS);
        if (n < 0 && errno != EINTR) {
            fprintf(stderr, "spillway-loadgen: epoll_wait: %s\n", strerror(errno));
            break;
        }
        int64_t now = sw_clock_ns();
        for (int i = 0; i < n; i++) {
            /* An event queued for a socket closed earlier in this batch must
             * not be taken for one of its successor's. */
            conn *c = &h.conns[(uint32_t)evs[i].data.u64];
            if (c->fd >= 0 && c->gen == (uint32_t)(evs[i].data.u64 >> 32))
                on_conn_event(&h, c, evs[i].events, now);
        }
        if (now - last_scan >= (int64_t)TIMER_SCAN_MS * 1000000 || g_interrupted) {
            last_scan = now;
            check_timers(&h, now);
        }
        if (g_interrupted) /* stop at once: in-flight requests are not counted */
            for (int i = 0; i < o->concurrency; i++) conn_finish(&h, &h.conns[i]);
    }
    h.r.st.t_end = sw_clock_ns();
    int wrote = o->samples_path ? write_samples(o->samples_path, &h.r.st) : 0;
    report(o, &h.r.st);
    for (int i = 0; i < o->concurrency; i++) {
        conn_close(&h, &h.conns[i]);
        free(h.conns[i].rd);
        free(h.conns[i].body);
    }
    long long errors = total_errors(&h.r.st);
    int rc = errors || !h.r.st.completed || wrote ? 1 : 0;
    free(h.conns);
    free(h.req);
    free(h.r.st.lat.v);
    free(h.r.st.ttft.v);
    close(h.ep);
    return rc;
}

/* ========================================================================
 * Direct mode: the load generator is the gateway
 * ======================================================================== */

typedef struct {
    uint8_t ident[256];
    size_t ident_len;
    char id[SW_MAX_ID_LEN + 1];
    bool alive;
    int64_t last_sent;
} dworker;

typedef struct {
    bool busy;
    int64_t not_before;        /* --ramp: when this slot issues its first request */
    unsigned long long seq;
    int worker;
    int64_t t_start, t_first, deadline;
} dslot;

typedef struct {
    run r;
    void *zctx, *router;
    dworker workers[MAX_WORKERS];
    int n_workers, n_alive, rr;
    dslot *slots;
    int in_flight;
    long long stale;           /* chunks for requests already finished or timed out */
} direct_run;

static int find_worker(direct_run *d, const void *ident, size_t len)
{
    for (int i = 0; i < d->n_workers; i++)
        if (d->workers[i].ident_len == len && !memcmp(d->workers[i].ident, ident, len)) return i;
    return -1;
}

static void send_env(direct_run *d, int w, sw_env *env)
{
    dworker *k = &d->workers[w];
    if (sw_wire_send(d->router, k->ident, k->ident_len, env, ZMQ_DONTWAIT) == 0)
        k->last_sent = sw_clock_ns();
    else if (errno == EHOSTUNREACH && k->alive) { /* ROUTER_MANDATORY: it is gone */
        k->alive = false;
        d->n_alive--;
        fprintf(stderr, "spillway-loadgen: worker %s is unreachable\n", k->id);
    }
}

static void send_heartbeats(direct_run *d, int64_t now)
{
    for (int i = 0; i < d->n_workers; i++) {
        if (!d->workers[i].alive) continue;
        if (now - d->workers[i].last_sent < (int64_t)DIRECT_HEARTBEAT_MS * 1000000) continue;
        Spillway__Heartbeat hb = SPILLWAY__HEARTBEAT__INIT;
        sw_env env = SPILLWAY__ENVELOPE__INIT;
        env.body_case = SPILLWAY__ENVELOPE__BODY_HEARTBEAT;
        env.heartbeat = &hb;
        send_env(d, i, &env);
    }
}

static void on_register(direct_run *d, const void *ident, size_t len,
                        const Spillway__Register *reg)
{
    bool serves = false;
    for (size_t i = 0; i < reg->n_models; i++) serves |= !strcmp(reg->models[i]->name, d->r.o->model);
    if (!serves) {
        fprintf(stderr, "spillway-loadgen: worker %s does not serve model %s: ignored\n",
                reg->worker_id, d->r.o->model);
        return;
    }
    int w = find_worker(d, ident, len);
    if (w < 0) {
        if (d->n_workers == MAX_WORKERS || len > sizeof d->workers[0].ident) return;
        w = d->n_workers++;
        memcpy(d->workers[w].ident, ident, len);
        d->workers[w].ident_len = len;
    }
    dworker *k = &d->workers[w];
    snprintf(k->id, sizeof k->id, "%s", reg->worker_id);
    if (!k->alive) {
        k->alive = true;
        d->n_alive++;
    }
    k->last_sent = 0; /* answer at once: that is how a worker knows we are alive */
}

static bool parse_request_id(const char *id, int *slot, unsigned long long *seq)
{
    char *end;
    if (strncmp(id, "lg-", 3)) return false;
    long s = strtol(id + 3, &end, 10);
    if (*end != '-') return false;
    unsigned long long q = strtoull(end + 1, &end, 10);
    if (*end) return false;
    *slot = (int)s;
    *seq = q;
    return true;
}

static dslot *slot_for(direct_run *d, const char *request_id)
{
    int s;
    unsigned long long q;
    if (!parse_request_id(request_id, &s, &q) || s < 0 || s >= d->r.o->concurrency) return NULL;
    dslot *sl = &d->slots[s];
    return sl->busy && sl->seq == q ? sl : NULL;
}

static void slot_done(direct_run *d, dslot *sl)
{
    sl->busy = false;
    d->in_flight--;
}

static void on_chunk(direct_run *d, const Spillway__TokenChunk *ch, int64_t now)
{
    dslot *sl = slot_for(d, ch->request_id);
    if (!sl) {
        d->stale++;
        return;
    }
    d->r.st.chunks++;
    if (!sl->t_first) sl->t_first = now;
    switch (ch->finish_reason) {
    case SPILLWAY__FINISH_REASON__FINISH_NONE:
        return;
    case SPILLWAY__FINISH_REASON__FINISH_STOP:
    case SPILLWAY__FINISH_REASON__FINISH_LENGTH:
        record_ok(&d->r, sl->t_start, sl->t_first, now);
        break;
    default:
        d->r.st.err_stream++;
        break;
    }
    slot_done(d, sl);
}

static void on_router_message(direct_run *d, int64_t now)
{
    zmq_msg_t ident, body;
    zmq_msg_init(&ident);
    zmq_msg_init(&body);
    if (zmq_msg_recv(&ident, d->router, ZMQ_DONTWAIT) < 0) goto done;
    if (!zmq_msg_more(&ident)) goto done;
    /* The envelope is the last frame (a delimiter may come between). */
    int more = 1;
    while (more) {
        zmq_msg_close(&body);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&body, d->router, ZMQ_DONTWAIT) < 0) goto done;
        more = zmq_msg_more(&body);
    }
    char err[200];
    sw_env *env = sw_wire_decode(zmq_msg_data(&body), zmq_msg_size(&body), err, sizeof err);
    if (!env) {
        fprintf(stderr, "spillway-loadgen: invalid frame from a worker: %s\n", err);
        d->r.st.err_malformed++;
        goto done;
    }
    const void *id = zmq_msg_data(&ident);
    size_t idlen = zmq_msg_size(&ident);
    switch (env->body_case) {
    case SPILLWAY__ENVELOPE__BODY_REGISTER:
        on_register(d, id, idlen, env->register_);
        break;
    case SPILLWAY__ENVELOPE__BODY_CHUNK:
        on_chunk(d, env->chunk, now);
        break;
    case SPILLWAY__ENVELOPE__BODY_ERROR: {
        dslot *sl = env->error->request_id[0] ? slot_for(d, env->error->request_id) : NULL;
        if (sl) {
            d->r.st.err_status++;
            slot_done(d, sl);
        } else {
            fprintf(stderr, "spillway-loadgen: worker error %u: %s\n", env->error->code,
                    env->error->message);
        }
        break;
    }
    case SPILLWAY__ENVELOPE__BODY_DISCONNECT: {
        int w = find_worker(d, id, idlen);
        if (w >= 0 && d->workers[w].alive) {
            d->workers[w].alive = false;
            d->n_alive--;
        }
        break;
    }
    default:
        break; /* heartbeats: we do not schedule by load, round-robin is the baseline */
    }
    sw_wire_free(env);
done:
    zmq_msg_close(&ident);
    zmq_msg_close(&body);
}

static int pick_worker(direct_run *d)
{
    for (int tries = 0; tries < d->n_workers; tries++) {
        int w = d->rr++ % d->n_workers;
        if (d->workers[w].alive) return w;
    }
    return -1;
}

static void issue(direct_run *d, int s, int64_t now)
{
    int w = pick_worker(d);
    if (w < 0) return;
    dslot *sl = &d->slots[s];
    if (!claim_request(&d->r, now)) return;
    sl->busy = true;
    sl->seq++;
    sl->worker = w;
    sl->t_start = now;
    sl->t_first = 0;
    sl->deadline = now + (int64_t)(d->r.o->timeout_s * 1e9);
    d->in_flight++;
    char rid[64];
    snprintf(rid, sizeof rid, "lg-%d-%llu", s, sl->seq);
    Spillway__GenerateRequest g = SPILLWAY__GENERATE_REQUEST__INIT;
    g.request_id = rid;
    g.model = (char *)d->r.o->model;
    g.prompt = (char *)d->r.o->prompt;
    g.max_tokens = (uint32_t)d->r.o->max_tokens;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE;
    env.generate = &g;
    send_env(d, w, &env);
}

static void cancel_slot(direct_run *d, dslot *sl, int s)
{
    char rid[64];
    snprintf(rid, sizeof rid, "lg-%d-%llu", s, sl->seq);
    Spillway__Cancel c = SPILLWAY__CANCEL__INIT;
    c.request_id = rid;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_CANCEL;
    env.cancel = &c;
    if (d->workers[sl->worker].alive) send_env(d, sl->worker, &env);
}

static bool more_to_issue(direct_run *d, int64_t now)
{
    const options *o = d->r.o;
    if (g_interrupted || d->n_alive == 0 || now >= d->r.hard_stop_ns) return false;
    return o->requests ? d->r.st.issued < o->requests : now < d->r.end_issue_ns;
}

static int wait_for_workers(direct_run *d)
{
    int64_t deadline = sw_clock_ns() + (int64_t)(d->r.o->wait_s * 1e9);
    while (d->n_alive < d->r.o->workers && !g_interrupted) {
        int64_t now = sw_clock_ns();
        if (now >= deadline) {
            fprintf(stderr, "spillway-loadgen: only %d of %d workers registered at %s within "
                            "%.1f s\n", d->n_alive, d->r.o->workers, d->r.o->target, d->r.o->wait_s);
            return -1;
        }
        zmq_pollitem_t it = {d->router, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 50) > 0)
            while (zmq_poll(&it, 1, 0) > 0) on_router_message(d, sw_clock_ns());
        send_heartbeats(d, sw_clock_ns());
    }
    return g_interrupted ? -1 : 0;
}

/* Times out the requests past their deadline (or the run's hard stop). */
static void expire_slots(direct_run *d, int64_t now)
{
    for (int s = 0; s < d->r.o->concurrency; s++) {
        dslot *sl = &d->slots[s];
        if (!sl->busy || (now < sl->deadline && now < d->r.hard_stop_ns)) continue;
        d->r.st.err_timeout++;
        cancel_slot(d, sl, s);
        slot_done(d, sl);
    }
}

/* Keeps C requests in flight until all are issued and answered, every
 * worker is gone, or the run is interrupted. */
static void direct_loop(direct_run *d)
{
    const options *o = d->r.o;
    int64_t t0 = sw_clock_ns();
    d->r.end_issue_ns = t0 + (int64_t)(o->duration_s * 1e9);
    d->r.hard_stop_ns = t0 + run_budget_ns(o);
    int64_t last_scan = t0;
    for (int s = 0; s < o->concurrency; s++)
        d->slots[s].not_before = t0 + (int64_t)(o->ramp_s * 1e9 * s / o->concurrency);
    for (;;) {
        int64_t now = sw_clock_ns();
        for (int s = 0; s < o->concurrency && more_to_issue(d, now); s++)
            if (!d->slots[s].busy && now >= d->slots[s].not_before) issue(d, s, now);
        if (d->in_flight == 0 && !more_to_issue(d, now) ) break;
        if (d->n_alive == 0) {
            fprintf(stderr, "spillway-loadgen: every worker is gone\n");
            for (int s = 0; s < o->concurrency; s++)
                if (d->slots[s].busy) {
                    d->r.st.err_io++;
                    slot_done(d, &d->slots[s]);
                }
            break;
        }
        zmq_pollitem_t it = {d->router, 0, ZMQ_POLLIN, 0};
        int n = zmq_poll(&it, 1, TIMER_SCAN_MS);
        if (n > 0) {
            /* Drain everything that is there before issuing again. */
            while (zmq_poll(&it, 1, 0) > 0) on_router_message(d, sw_clock_ns());
        }
        now = sw_clock_ns();
        send_heartbeats(d, now);
        if (now - last_scan >= (int64_t)TIMER_SCAN_MS * 1000000) {
            last_scan = now;
            expire_slots(d, now);
        }
        if (g_interrupted) break;
    }
}

static int run_direct(const options *o)
{
    direct_run d;
    memset(&d, 0, sizeof d);
    d.r.o = o;
    d.slots = calloc((size_t)o->concurrency, sizeof *d.slots);
    d.zctx = zmq_ctx_new();
    d.router = d.zctx ? zmq_socket(d.zctx, ZMQ_ROUTER) : NULL;
    if (!d.slots || !d.router) {
        fprintf(stderr, "spillway-loadgen: cannot create the ZeroMQ socket\n");
        return 1;
    }
    int zero = 0, one = 1;
    zmq_setsockopt(d.router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d.router, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(d.router, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(d.router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    if (zmq_bind(d.router, o->target) != 0) {
        fprintf(stderr, "spillway-loadgen: cannot bind %s: %s\n", o->target, zmq_strerror(errno));
        zmq_close(d.router);
        zmq_ctx_term(d.zctx);
        free(d.slots);
        return 1;
    }
    int rc = 1;
    if (wait_for_workers(&d) != 0) goto out;
    fprintf(stderr, "spillway-loadgen: %d worker(s) registered, starting\n", d.n_alive);

    direct_loop(&d);
    d.r.st.t_end = sw_clock_ns();
    int wrote = o->samples_path ? write_samples(o->samples_path, &d.r.st) : 0;
    report(o, &d.r.st);
    if (d.stale) fprintf(stderr, "spillway-loadgen: %lld late chunks ignored\n", d.stale);
    rc = total_errors(&d.r.st) || !d.r.st.completed || wrote ? 1 : 0;
out:
    zmq_close(d.router);
    zmq_ctx_term(d.zctx);
    free(d.slots);
    free(d.r.st.lat.v);
    free(d.r.st.ttft.v);
    return rc;
}

/* ------------------------------------------------------------------------ */

/* Each connection is a file descriptor: make room for C of them. */
static void raise_fd_limit(int need)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    rlim_t want = (rlim_t)need + 64;
    if (rl.rlim_cur >= want) return;
    rl.rlim_cur = want < rl.rlim_max ? want : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    raise_fd_limit(o.concurrency);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    return o.mode == MODE_HTTP ? run_http(&o) : run_direct(&o);
}
