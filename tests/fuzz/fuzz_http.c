/* Mutation fuzz of the gateway's HTTP front end (gateway/http.c on
 * libmicrohttpd), in process: the real server with its broker, policy and
 * admin token, and no worker, fed each input as the bytes a client sends
 * on a connection: a loopback TCP pair made by the harness, whose server end
 * is handed to the server (it has no listening socket of its own,
 * sw_http_start_unbound).
 *
 * An input is raw HTTP: one or more requests, cut anywhere; the client
 * shuts its side for writing after it and reads until the server closes,
 * or until the server has been quiet for QUIET_MS. (libmicrohttpd holds a
 * connection whose next request line has not begun or not ended until the
 * idle timeout, even after the client's half-close: bounded by that
 * timeout, which test_http_hygiene tests, but seconds per input here.)
 * Invariants:
 *   - what it sends is a sequence of whole HTTP/1.x responses, each with a
 *     three-digit status and a body framed by Content-Length or chunked;
 *   - a request framed two ways (Content-Length with Transfer-Encoding) or
 *     with an unknown coding gets 400 and nothing after it is answered.
 * The sanitizers catch the rest (the libFuzzer build and make test's ASan
 * run).
 *   fuzz_http                        (loop settings: tests/fuzz/driver.h)
 */
#include "gateway/broker.h"
#include "gateway/gateway.h"
#include "gateway/http.h"
#include "gateway/metrics.h"
#include "gateway/util.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include <sodium.h>

#include "tests/fuzz/driver.h"

#define TOKEN "fuzz-admin-token-0123456789"
#define REPLY_MAX (1 << 20)
#define QUIET_MS 150

static const char POLICY[] =
    "pools:\n  - {name: gpu-pool, kind: gpu}\n  - {name: cpu-pool, kind: cpu}\n"
    "routes:\n  - {model: echo, target: gpu-pool}\n  - {model: echo, target: cpu-pool, priority: overflow}\n";

static sw_gateway G;
static int listener = -1;   /* the harness's own loopback listener */

/* The gateway, once: policy, registry, broker on an inproc endpoint, HTTP
 * with no listening socket. Returns 0. */
static int start_gateway(void)
{
    if (G.mhd) return 0;
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    listener = socket(AF_INET, SOCK_STREAM, 0);
    if (listener < 0 || bind(listener, (struct sockaddr *)&a, sizeof a) != 0 || listen(listener, 16) != 0) return -1;
    if (sodium_init() < 0) return -1;
    char err[4096];
    sw_gw = &G;
    G.config_path = "fuzz-routes.yaml";   /* never read: no reload happens */
    G.workers_ep = "inproc://fuzz-http-workers";
    G.admin_token = strdup(TOKEN);
    sw_policy *p = sw_policy_parse("fuzz-routes.yaml", POLICY, sizeof POLICY - 1, err, sizeof err);
    if (!p) return fprintf(stderr, "policy: %s\n", err), -1;
    sw_gw_init(&G, p);
    if (sw_broker_start(&G, err, sizeof err) != 0 || sw_http_start_unbound(&G, err, sizeof err) != 0)
        return fprintf(stderr, "gateway: %s\n", err), -1;
    return 0;
}

/* A loopback TCP connection: sv[0] the server's end, sv[1] the client's. */
static int connect_pair(int sv[2])
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(listener, (struct sockaddr *)&a, &len) != 0) return -1;
    sv[1] = socket(AF_INET, SOCK_STREAM, 0);
    if (sv[1] < 0) return -1;
    if (connect(sv[1], (struct sockaddr *)&a, len) != 0 || (sv[0] = accept(listener, NULL, NULL)) < 0) {
        close(sv[1]);
        return -1;
    }
    return 0;
}

static void send_all(int fd, const uint8_t *p, size_t n)
{
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, p + off, n - off);
        if (w <= 0) return;
        off += (size_t)w;
    }
}

/* Everything the server sends until it closes or stays quiet QUIET_MS. */
static size_t read_reply(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, QUIET_MS) <= 0) break;
        ssize_t got = read(fd, buf + n, cap - n - 1);
        if (got <= 0) break;
        n += (size_t)got;
        if (n >= cap - 1) break;
    }
    buf[n] = 0;
    return n;
}

/* The length of one chunked body at p (through its last chunk and the
 * blank line), or 0 if it is malformed or cut. */
static size_t chunked_len(const char *p, const char *end)
{
    const char *s = p;
    for (;;) {
        char *e;
        unsigned long sz = strtoul(s, &e, 16);
        const char *crlf = strstr(s, "\r\n");
        if (e == s || !crlf || crlf >= end) return 0;
        s = crlf + 2;
        if (sz == 0) return (size_t)(end - s) >= 2 && !strncmp(s, "\r\n", 2) ? (size_t)(s + 2 - p) : 0;
        if ((size_t)(end - s) < sz + 2) return 0;
        s += sz + 2;
    }
}

/* One response at p: its status into *status, its length, or 0 when it is
 * not a whole HTTP/1.x response. */
static size_t one_response(const char *p, const char *end, int *status)
{
    if (end - p < 12 || strncmp(p, "HTTP/1.", 7) || sscanf(p + 9, "%3d", status) != 1) return 0;
    const char *hend = strstr(p, "\r\n\r\n");
    if (!hend || hend >= end) return 0;
    const char *body = hend + 4;
    long cl = -1;
    bool chunked = false;
    for (const char *h = strstr(p, "\r\n") + 2; h < hend; h = strstr(h, "\r\n") + 2) {
        if (!strncasecmp(h, "Content-Length:", 15)) cl = strtol(h + 15, NULL, 10);
        if (!strncasecmp(h, "Transfer-Encoding:", 18) && strstr(h, "chunked") && strstr(h, "chunked") < hend)
            chunked = true;
    }
    /* libmicrohttpd 0.9.75 sends its own 400 for a bad Content-Length with
     * the header block twice (the first without its body): not ours, and
     * harmless, as the connection then closes. */
    if (*status == 400 && end - body >= 7 && !strncmp(body, "HTTP/1.", 7)) return (size_t)(body - p);
    if (chunked) {
        size_t n = chunked_len(body, end);
        return n ? (size_t)(body - p) + n : 0;
    }
    if (cl < 0) cl = end - body;   /* close-delimited: the rest */
    return end - body >= cl ? (size_t)(body - p) + (size_t)cl : 0;
}

/* Where the header block of the request at in ends: at its first empty
 * line, where a line may end in LF alone (libmicrohttpd takes "\n" as a
 * line's end too, so "...\r\n\n" ends the headers). NULL: it does not. */
static const char *headers_end(const char *in, size_t n)
{
    const char *end = in + n;
    for (const char *p = memchr(in, '\n', n); p; p = memchr(p + 1, '\n', (size_t)(end - p - 1))) {
        if (p + 1 < end && p[1] == '\n') return p + 1;
        if (p + 2 < end && p[1] == '\r' && p[2] == '\n') return p + 1;
        if (p + 1 >= end) break;
    }
    return NULL;
}

/* Whether the input's first request is a well-formed HTTP/1.1 request
 * whose headers carry both Content-Length and Transfer-Encoding: chunked. */
static bool framed_two_ways(const char *in, size_t n)
{
    if (n < 16 || n > 4096 || memchr(in, 0, n) || (memcmp(in, "GET /", 5) && memcmp(in, "POST /", 6))) return false;
    const char *eol = memmem(in, n, "\r\n", 2), *hend = headers_end(in, n);
    if (!eol || !hend || eol - in < 9 || strncmp(eol - 9, " HTTP/1.1", 9)) return false;
    size_t hn = (size_t)(hend - in);
    return memmem(in, hn, "\r\nContent-Length:", 17) && memmem(in, hn, "\r\nTransfer-Encoding: chunked\r\n", 30);
}

static bool check(const uint8_t *data, size_t n)
{
    if (start_gateway() != 0) { broken++; return false; }
    int sv[2];
    if (connect_pair(sv) != 0) return false;
    if (sw_http_add_connection(&G, sv[0]) != 0) { close(sv[1]); return false; }   /* the server closes sv[0] */
    send_all(sv[1], data, n);   /* the server reads while we write: no deadlock on a long input */
    shutdown(sv[1], SHUT_WR);
    static char reply[REPLY_MAX];
    size_t got = read_reply(sv[1], reply, sizeof reply);
    close(sv[1]);
    int answered = 0, status = 0, first = 0;
    for (size_t at = 0; at < got;) {
        size_t len = one_response(reply + at, reply + got, &status);
        INVARIANT(len, "not a whole HTTP response at byte %zu: %.200s [reply: %.600s]", at, reply + at, reply);
        if (!len) break;
        if (!answered++) first = status;
        INVARIANT(status >= 100 && status <= 599, "status %d", status);
        at += len;
    }
    if (framed_two_ways((const char *)data, n) && answered)
        INVARIANT(first == 400 && answered == 1, "CL+TE answered %d (%d responses)", first, answered);
    return answered > 0;
}

#ifdef SW_LIBFUZZER
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return start_gateway() == 0 ? 0 : 1;
}
#else
static const char S_CHAT[] =
    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 71\r\n\r\n"
    "{\"model\":\"echo\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":1}";
static const char S_RESPONSES[] =
    "POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 180\r\n\r\n"
    "{\"model\":\"echo\",\"instructions\":\"x\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
    "\"input_text\",\"text\":\"hi\"}]},{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"y\"}],"
    "\"stream\":true}";
static const char S_PIPELINE[] =
    "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
static const char S_CHUNKED[] =
    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    "10\r\n{\"model\":\"echo\",\r\n13\r\n\"prompt\":\"a\",\"n\":1}\r\n0\r\n\r\n";
static const char S_SMUGGLE[] =
    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
    "0\r\n\r\nGET /admin/policy HTTP/1.1\r\nHost: x\r\n\r\n";
static const char S_ADMIN[] =
    "POST /admin/workers/w1/drain HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " TOKEN "\r\n"
    "Content-Length: 20\r\n\r\n{\"reason\":\"fuzzing\"}"
    "POST /admin/routes/echo/force-overflow HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " TOKEN "\r\n"
    "Content-Length: 11\r\n\r\n{\"on\":true}"
    "GET /admin/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " TOKEN "\r\n\r\n";
static const char S_DASH[] = "GET /dashboard/app.js HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.0\r\n\r\n";

int main(void)
{
    const fuzz_seed seeds[] = {
        {(const uint8_t *)S_CHAT, sizeof S_CHAT - 1},       {(const uint8_t *)S_PIPELINE, sizeof S_PIPELINE - 1},
        {(const uint8_t *)S_CHUNKED, sizeof S_CHUNKED - 1}, {(const uint8_t *)S_SMUGGLE, sizeof S_SMUGGLE - 1},
        {(const uint8_t *)S_ADMIN, sizeof S_ADMIN - 1},     {(const uint8_t *)S_DASH, sizeof S_DASH - 1},
        {(const uint8_t *)S_RESPONSES, sizeof S_RESPONSES - 1},
    };
    int rc = fuzz_main("fuzz_http", seeds, (int)(sizeof seeds / sizeof seeds[0]), check);
    /* The broker and server threads still run; exit without tearing them
     * down (as the gateway does at SIGTERM, less the waiting). */
    fflush(stdout);
    _exit(rc);
}
#endif
