/* The worker side of the gateway<->worker protocol (see worker_link.h).
 *
 * Message flow, worker view:
 *   connect -> Register (again after every reconnect)
 *   gateway -> GenerateRequest / Cancel / Heartbeat
 *   worker  -> TokenChunk* (the last one has a finish reason and usage), or an
 *              Error with the request id; Heartbeat with load every
 *              SW_HEARTBEAT_MS and within ~20 ms when the number of requests
 *              in flight changes; Disconnect on SIGINT/SIGTERM.
 *   A gateway silent for SW_HEARTBEAT_LIVENESS intervals is dead: close,
 *   wait (backoff SW_RECONNECT_MIN_MS doubling to _MAX_MS, reset once the
 *   gateway answers), reconnect with a fresh socket, Register again.
 * Every request the worker accepted ends in exactly one terminal message: a
 * chunk with finish_reason != FINISH_NONE (a cancel is confirmed with
 * FINISH_CANCELLED) or an Error. After the gateway was declared dead the
 * worker drops its requests silently: the gateway has failed them already.
 *
 * Several gateways (cfg->gateways): one DEALER and one link_state each,
 * all owned by the link thread; every request remembers the gateway it came
 * from, and its chunks go back there. A gateway that dies only drops its own
 * requests. The load in each heartbeat is the engine's whole load.
 *
 * Drain (the first SIGINT/SIGTERM): the compute thread tells the link thread
 * ('D'), which sends every gateway a Heartbeat with draining set at once; a
 * GenerateRequest still arriving (sent before that heartbeat landed) is
 * refused with SW_REFUSED_CODE, which the gateway retries elsewhere. Once the
 * worker holds nothing (or a second signal, or the drain timeout), it quits.
 *
 * Threads: the link thread owns the DEALERs; the compute thread (the caller)
 * owns the engine. They talk over one inproc PAIR:
 *   link -> compute: [gateway index byte][a validated GenerateRequest/Cancel
 *                    frame as that gateway sent it, or the 1-byte control
 *                    'R' = that link was reset (drop its requests)], or the
 *                    single frame 'X' = the link thread failed for good.
 *   compute -> link: [gateway index byte][an encoded envelope for it, or
 *                    'R' = that reset is done], or a single-frame control:
 *                    'D' = draining (tell every gateway), 'Q' = shutting
 *                    down (send Disconnect, exit).
 * A reset's 'R' comes back because output crosses the pipe in order: what
 * the compute thread sent before it is for the lost connection's requests.
 * Until it is back the link drops that output and neither registers nor
 * heartbeats, so the gateway it registers with next never sees a frame for
 * a request it did not send (a burst of them would get the worker dropped,
 * as after a gateway restart under load, or a worker resuming from a stop).
 * Real envelopes are never 1 byte long, so the controls cannot be confused
 * with them. Both PAIR ends have no high-water mark: neither side can block
 * the other (which could deadlock), and the queue is bounded by real traffic.
 */
#include "proto/worker_link.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#include "llm/clock.h"
#include "proto/curve.h"

#define PIPE_EP "inproc://sw-worker-link"
#define LOAD_POLL_MS 20           /* how often the link thread samples load */
#define IDLE_WAIT_MS 100          /* compute thread's longest sleep (checks for stop) */
#define DEADLINE_SCAN_MS 10
#define DISCONNECT_LINGER_MS 500  /* lets the Disconnect reach a live gateway */
#define CTRL_RESET 'R'
#define CTRL_FATAL 'X'
#define CTRL_QUIT 'Q'
#define CTRL_DRAIN 'D'

/* SIGINT/SIGTERM seen so far: the first drains, the second stops. */
static volatile sig_atomic_t g_signals;

static void on_signal(int sig)
{
    (void)sig;
    if (g_signals < 2) g_signals++;
}

void sw_worker_stop(void) { on_signal(0); }

/* One line to stderr: "[worker] 2026-11-29T19:08:31.123Z message", written
 * with a single fprintf so lines from the two threads never interleave. */
void sw_worker_log(const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "[worker] %04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, msg);
}

/* A flood of garbage must not turn into a flood of log lines: at most 10 per
 * second, then a count of what was suppressed. Link thread only. */
static int64_t bad_window_start;
static int bad_in_window, bad_suppressed;

static void flush_bad_frame_count(int64_t now)
{
    if (now - bad_window_start < 1000) return;
    if (bad_suppressed) sw_worker_log("(%d more invalid frames not logged)", bad_suppressed);
    bad_window_start = now;
    bad_in_window = bad_suppressed = 0;
}

static void log_bad_frame(const char *fmt, const char *what)
{
    flush_bad_frame_count(sw_clock_ms());
    if (++bad_in_window > 10) {
        bad_suppressed++;
        return;
    }
    sw_worker_log(fmt, what);
}

static void free_buf(void *data, void *hint)
{
    (void)hint;
    free(data);
}

/* Queues m on the (non-blocking) pipe, after the gateway index gw when gw
 * >= 0. m is sent or closed. */
static void pipe_send_msg(void *pipe, int gw, zmq_msg_t *m)
{
    uint8_t idx = (uint8_t)gw;
    if ((gw >= 0 && zmq_send(pipe, &idx, 1, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0) ||
        zmq_msg_send(m, pipe, ZMQ_DONTWAIT) < 0) {
        sw_worker_log("internal pipe send failed: %s", zmq_strerror(errno));
        zmq_msg_close(m);
    }
}

/* Encodes env for gateway gw and queues it on the pipe without copying. */
static void pipe_send_env(void *pipe, int gw, sw_env *env)
{
    uint8_t *buf;
    size_t n = sw_wire_encode(env, &buf);
    if (!buf) {
        sw_worker_log("out of memory encoding a %s", sw_wire_kind(env));
        return;
    }
    zmq_msg_t m;
    zmq_msg_init_data(&m, buf, n, free_buf, NULL);
    pipe_send_msg(pipe, gw, &m);
}

/* A control byte: about gateway gw, or (gw < 0) a single-frame one. */
static void pipe_send_ctrl(void *pipe, int gw, char c)
{
    zmq_msg_t m;
    zmq_msg_init_size(&m, 1);
    *(char *)zmq_msg_data(&m) = c;
    pipe_send_msg(pipe, gw, &m);
}

static void *new_pair(void *zctx)
{
    void *s = zmq_socket(zctx, ZMQ_PAIR);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
    return s;
}

/* ========================================================================
 * Link thread
 * ======================================================================== */

typedef struct {
    const sw_worker_config *cfg;
    const sw_engine_ops *ops;
    void *eng;
    void *zctx;
    void *pipe;           /* connected by sw_worker_run, then owned by the link thread */
    const char *worker_id;
    bool curve;                          /* keys loaded by sw_worker_run */
    sw_curve_keypair kp;
    char gateway_key[SW_CURVE_Z85_LEN + 1];
    bool draining;        /* link thread only: heartbeats say so from then on */
    /* Requests in flight, published by the compute thread after every
     * iteration. The link thread watches it to send a heartbeat as soon as
     * the load changes, without calling load() more often than it reports. */
    _Atomic size_t inflight;
} link_args;

/* One gateway's link. */
typedef struct {
    link_args *a;
    int idx;              /* its index in cfg->gateways, on the pipe */
    const char *ep;       /* its endpoint */
    void *pipe, *dealer;
    void *mon;            /* the dealer's handshake events (curve.h), or NULL */
    int64_t refused_until; /* a refused Register is sent again then; 0: not refused */
    char last_failure[256];
    int64_t last_failure_ms;
    int64_t last_recv, last_send, last_hb, last_load_check;
    int64_t backoff_ms, reconnect_at;
    int heard;            /* heard from the gateway since this connection began */
    int resetting;        /* resets the compute thread has not confirmed yet (see the top) */
    size_t reported_inflight; /* requests in flight at the last heartbeat */
} link_state;

static int link_send(link_state *L, sw_env *env)
{
    if (sw_wire_send(L->dealer, NULL, 0, env, ZMQ_DONTWAIT) < 0) {
        /* EAGAIN: no connection to queue on (a handshake failing, say), which
         * repeats every heartbeat: through the rate limit. */
        if (errno == EAGAIN) log_bad_frame("send %s to gateway failed: no connection yet", sw_wire_kind(env));
        else sw_worker_log("send %s to gateway failed: %s", sw_wire_kind(env), zmq_strerror(errno));
        return -1;
    }
    L->last_send = sw_clock_ms();
    return 0;
}

static void send_register(link_state *L)
{
    const sw_worker_config *c = L->a->cfg;
    Spillway__Register r = SPILLWAY__REGISTER__INIT;
    r.worker_id = (char *)L->a->worker_id;
    r.pool = (char *)c->pool;
    r.kind = c->kind;
    r.models = c->models;
    r.n_models = c->n_models;
    r.slots = c->slots;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_REGISTER;
    env.register_ = &r;
    link_send(L, &env);
}

static void send_heartbeat(link_state *L, const sw_load *l)
{
    if (L->resetting) return;   /* the gateway does not know us: it would answer "register again" */
    Spillway__Heartbeat h = SPILLWAY__HEARTBEAT__INIT;
    h.active = l->active;
    h.queued = l->queued;
    h.kv_utilization = l->kv_utilization < 0 ? 0 : l->kv_utilization > 1 ? 1 : l->kv_utilization;
    if (h.kv_utilization != h.kv_utilization) h.kv_utilization = 0; /* NaN from an engine */
    h.slots = l->slots;
    h.batch_size = l->batch_size;
    h.tokens_generated = l->tokens_generated;
    h.prefix_cache_queries = l->prefix_cache_queries;
    h.prefix_cache_hits = l->prefix_cache_hits;
    h.draining = L->a->draining;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &h;
    link_send(L, &env);
    L->last_hb = sw_clock_ms();   /* sent or not: a failed one waits for the next interval, not a spin */
}

/* Registers on L's connection, unless there is none, a reset is not yet
 * confirmed (reset_done registers then) or the gateway refused us (the
 * retry timer clears that, then registers). */
static void try_register(link_state *L)
{
    if (L->dealer && !L->resetting && !L->refused_until) send_register(L);
}

static int open_dealer(link_state *L)
{
    void *s = zmq_socket(L->a->zctx, ZMQ_DEALER);
    if (!s) {
        sw_worker_log("cannot create socket: %s", zmq_strerror(errno));
        return -1;
    }
    int zero = 0, ivl = SW_RECONNECT_MIN_MS, ivl_max = SW_RECONNECT_MAX_MS;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max);
    /* Chunks must not be dropped under a burst; a gateway that stops reading
     * also stops heartbeating, so liveness bounds this queue to a few seconds. */
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
    char err[256];
    if (L->a->curve && sw_curve_client_setup(s, &L->a->kp, L->a->gateway_key, err, sizeof err) != 0) {
        sw_worker_log("%s", err);
        zmq_close(s);
        return -1;
    }
    static int n_monitors;   /* link thread only: a fresh inproc name per socket */
    char mon_ep[64];
    snprintf(mon_ep, sizeof mon_ep, "inproc://sw-worker-handshake-%d", n_monitors++);
    L->mon = sw_curve_monitor_open(L->a->zctx, s, mon_ep);
    if (zmq_connect(s, L->ep) != 0) {
        sw_worker_log("cannot connect to %s: %s", L->ep, zmq_strerror(errno));
        if (L->mon) zmq_close(L->mon);
        L->mon = NULL;
        zmq_close(s);
        return -1;
    }
    L->dealer = s;
    int64_t now = sw_clock_ms();
    L->last_recv = L->last_hb = L->last_load_check = now;
    L->heard = 0;
    L->reported_inflight = 0;
    L->refused_until = 0;
    sw_worker_log("connecting to %s as %s (pool %s%s), registering%s", L->ep, L->a->worker_id,
                  L->a->cfg->pool, L->a->curve ? ", CURVE" : ", plaintext",
                  L->resetting ? " once the lost connection's requests are dropped" : "");
    try_register(L);
    return 0;
}

static void close_dealer(link_state *L, int linger_ms)
{
    if (!L->dealer) return;
    if (L->mon) {
        zmq_socket_monitor(L->dealer, NULL, 0);
        zmq_close(L->mon);
        L->mon = NULL;
    }
    zmq_setsockopt(L->dealer, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
    zmq_close(L->dealer);
    L->dealer = NULL;
}

/* The connection's requests are lost (the gateway restarted, or is
 * silent): the compute thread drops them and says when it has. */
static void reset_link(link_state *L)
{
    pipe_send_ctrl(L->pipe, L->idx, CTRL_RESET);
    L->resetting++;
}

/* The compute thread confirmed a reset: what it sends from now on is for
 * requests of the connection to come, so register there. */
static void reset_done(link_state *L)
{
    if (L->resetting > 0) L->resetting--;
    try_register(L);
}

/* A generate request that parses but fails validation (say, an empty prompt)
 * still names its request: answer it with a 400, so the gateway fails that
 * request at once instead of waiting for its timeout. */
static void reject_invalid_generate(link_state *L, const void *buf, size_t len, const char *why)
{
    if (len == 0 || len > SW_MAX_FRAME) return;
    sw_env *env = spillway__envelope__unpack(NULL, len, buf);
    if (!env) return;
    if (env->version == SW_PROTOCOL_VERSION &&
        env->body_case == SPILLWAY__ENVELOPE__BODY_GENERATE) {
        const char *id = env->generate->request_id;
        size_t n = id ? strlen(id) : 0;
        int printable = n > 0 && n <= SW_MAX_ID_LEN;
        for (size_t i = 0; printable && i < n; i++)
            printable = (unsigned char)id[i] > 0x20 && (unsigned char)id[i] < 0x7F;
        if (printable) {
            Spillway__Error e = SPILLWAY__ERROR__INIT;
            e.request_id = (char *)id;
            e.code = 400;
            e.message = (char *)why;
            sw_env out = SPILLWAY__ENVELOPE__INIT;
            out.body_case = SPILLWAY__ENVELOPE__BODY_ERROR;
            out.error = &e;
            link_send(L, &out);
        }
    }
    spillway__envelope__free_unpacked(env, NULL);
}

/* One message from the gateway. Only its last frame is the envelope: a
 * gateway that adds an empty delimiter (REQ-style) still works. */
/* The gateway refused our Register (our key may not serve this pool, or
 * another live worker holds our id): say so, and try again later rather
 * than at its every "register again". */
static void on_register_refused(link_state *L, const char *msg)
{
    sw_worker_log("the gateway refused to register us: %s (trying again in %d s)", msg && *msg ? msg : "no reason",
                  SW_REGISTER_RETRY_MS / 1000);
    L->refused_until = sw_clock_ms() + SW_REGISTER_RETRY_MS;
}

/* Logs a failed handshake (our key refused, CURVE on one side only): else
 * libzmq retries in silence. The same failure is logged at most every 10 s. */
static void on_monitor_events(link_state *L)
{
    char what[256];
    int rc;
    while ((rc = sw_curve_monitor_read(L->mon, what, sizeof what)) >= 0) {
        if (rc == 0) continue;
        int64_t now = sw_clock_ms();
        if (!strcmp(what, L->last_failure) && now - L->last_failure_ms < 10000) continue;
        snprintf(L->last_failure, sizeof L->last_failure, "%s", what);
        L->last_failure_ms = now;
        sw_worker_log("cannot connect to %s: %s", L->ep, what);
    }
}

static void on_gateway_message(link_state *L)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    int frames = 0, more = 1;
    while (more) {
        zmq_msg_close(&m);
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, L->dealer, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        frames++;
        more = zmq_msg_more(&m);
    }
    L->last_recv = sw_clock_ms();
    if (!L->heard) {
        L->heard = 1;
        L->backoff_ms = SW_RECONNECT_MIN_MS;
        sw_worker_log("gateway is answering");
    }
    char err[200];
    sw_env *env = sw_wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), err, sizeof err);
    if (!env) {
        log_bad_frame("dropped invalid frame from gateway: %s", err);
        reject_invalid_generate(L, zmq_msg_data(&m), zmq_msg_size(&m), err);
        zmq_msg_close(&m);
        return;
    }
    switch (env->body_case) {
    case SPILLWAY__ENVELOPE__BODY_HEARTBEAT:
        break; /* liveness only */
    case SPILLWAY__ENVELOPE__BODY_GENERATE:
    case SPILLWAY__ENVELOPE__BODY_EMBED:
    case SPILLWAY__ENVELOPE__BODY_CANCEL:
        /* Forward the validated frame itself; the compute thread decodes it. */
        pipe_send_msg(L->pipe, L->idx, &m);
        sw_wire_free(env);
        return;
    case SPILLWAY__ENVELOPE__BODY_DISCONNECT:
        /* The gateway does not know us (it restarted): whatever we were
         * doing was for its previous life, so drop it and register again on
         * this connection. */
        reset_link(L);
        if (L->refused_until) break;   /* refused: the retry timer registers again */
        sw_worker_log("gateway says: %s; registering again once its old requests are dropped",
                      env->disconnect->reason);
        break;
    case SPILLWAY__ENVELOPE__BODY_ERROR:
        if (!env->error->request_id[0] && env->error->code == 403) {
            on_register_refused(L, env->error->message);
            break;
        }
        sw_worker_log("gateway reports error %u%s%s: %s", env->error->code,
                      env->error->request_id[0] ? " for " : "", env->error->request_id,
                      env->error->message);
        break;
    default:
        log_bad_frame("ignored unexpected %s message from gateway", sw_wire_kind(env));
        break;
    }
    sw_wire_free(env);
    zmq_msg_close(&m);
}

/* Drain begins: every gateway hears it now, not at its next heartbeat, so
 * the window in which one may still send us a request is one trip long. */
static void start_drain(link_state *gw, size_t n)
{
    gw[0].a->draining = true;
    sw_load l;
    memset(&l, 0, sizeof l);
    gw[0].a->ops->load(gw[0].a->eng, &l);
    for (size_t i = 0; i < n; i++)
        if (gw[i].dealer) send_heartbeat(&gw[i], &l);
    sw_worker_log("draining: told %zu gateway(s); finishing %u running and %u queued requests", n, l.active,
                  l.queued);
}

/* Forwards everything the compute thread queued to the gateway it names.
 * Returns 1 on CTRL_QUIT. */
static int on_pipe_messages(link_state *gw, size_t n)
{
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, gw[0].pipe, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return 0;
        }
        int more = zmq_msg_more(&m);
        int c = zmq_msg_size(&m) == 1 ? *(unsigned char *)zmq_msg_data(&m) : -1;
        zmq_msg_close(&m);
        if (!more) {   /* a control */
            if (c == CTRL_QUIT) return 1;
            if (c == CTRL_DRAIN) start_drain(gw, n);
            continue;
        }
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, gw[0].pipe, ZMQ_DONTWAIT) < 0) {   /* a message's parts arrive together */
            zmq_msg_close(&m);
            return 0;
        }
        link_state *L = c >= 0 && (size_t)c < n ? &gw[c] : NULL;
        if (L && zmq_msg_size(&m) == 1 && *(char *)zmq_msg_data(&m) == CTRL_RESET) {
            reset_done(L);
            zmq_msg_close(&m);
            continue;
        }
        /* While disconnected or resetting, output is dropped: the gateway
         * that asked for it is gone, and the compute thread is dropping its
         * requests. */
        if (L && L->dealer && !L->resetting) {
            if (zmq_msg_send(&m, L->dealer, ZMQ_DONTWAIT) >= 0) {
                L->last_send = sw_clock_ms();
                continue;
            }
            sw_worker_log("send to gateway %s failed, message dropped: %s", L->ep, zmq_strerror(errno));
        }
        zmq_msg_close(&m);
    }
}

static void declare_gateway_dead(link_state *L, int64_t now)
{
    sw_worker_log("gateway %s silent for %d ms: reconnecting in %lld ms", L->ep,
                  SW_HEARTBEAT_MS * SW_HEARTBEAT_LIVENESS, (long long)L->backoff_ms);
    close_dealer(L, 0);
    reset_link(L);
    L->reconnect_at = now + L->backoff_ms;
    L->backoff_ms *= 2;
    if (L->backoff_ms > SW_RECONNECT_MAX_MS) L->backoff_ms = SW_RECONNECT_MAX_MS;
}

/* Heartbeat every SW_HEARTBEAT_MS, and within LOAD_POLL_MS of a change in
 * the number of requests in flight, so the gateway's view of free slots is
 * fresh (e.g. right after a cancel). load() is called only to send one. */
static void maybe_heartbeat(link_state *L, int64_t now)
{
    if (now - L->last_load_check < LOAD_POLL_MS && now - L->last_hb < SW_HEARTBEAT_MS) return;
    L->last_load_check = now;
    size_t inflight = atomic_load_explicit(&L->a->inflight, memory_order_relaxed);
    if (now - L->last_hb < SW_HEARTBEAT_MS && inflight == L->reported_inflight) return;
    sw_load l;
    memset(&l, 0, sizeof l);
    L->a->ops->load(L->a->eng, &l);
    send_heartbeat(L, &l);
    L->reported_inflight = inflight;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* How long the link thread may sleep: until the gateway's liveness runs
 * out, the next load check or heartbeat, a registration retry, or (while
 * disconnected) the reconnect. */
static long poll_timeout(const link_state *L, int64_t now)
{
    int64_t wake = L->reconnect_at;
    if (L->dealer) {
        wake = min64(L->last_recv + SW_HEARTBEAT_MS * SW_HEARTBEAT_LIVENESS,
                     min64(L->last_load_check + LOAD_POLL_MS, L->last_hb + SW_HEARTBEAT_MS));
        if (L->refused_until) wake = min64(wake, L->refused_until);
    }
    return wake > now ? (long)(wake - now) : 0;
}

/* Clean shutdown: the compute thread has already sent its last errors
 * through the pipe, so they precede the Disconnect. */
static void send_disconnect(link_state *L)
{
    if (!L->dealer) return;
    Spillway__Disconnect d = SPILLWAY__DISCONNECT__INIT;
    d.reason = L->a->draining ? "drained: shut down" : "shutdown";
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_DISCONNECT;
    env.disconnect = &d;
    link_send(L, &env);
    sw_worker_log("sent disconnect to gateway %s", L->ep);
}

/* Liveness, a refused registration's retry, and heartbeats, after a poll. */
static void link_timers(link_state *L)
{
    int64_t now = sw_clock_ms();
    if (L->dealer && now - L->last_recv >= SW_HEARTBEAT_MS * SW_HEARTBEAT_LIVENESS) {
        declare_gateway_dead(L, now);
        return;
    }
    if (L->refused_until && now >= L->refused_until) {
        L->refused_until = 0;
        try_register(L);
    }
    if (L->dealer) maybe_heartbeat(L, now);
    if (bad_suppressed) flush_bad_frame_count(now);
}

/* Each gateway's socket and handshake monitor, after the pipe, in items;
 * owner[k] is the link of items[k] (NULL: the pipe). Returns the count. */
static int link_poll_items(link_state *gw, size_t n, zmq_pollitem_t *items, link_state **owner)
{
    int k = 0;
    items[k] = (zmq_pollitem_t){gw[0].pipe, 0, ZMQ_POLLIN, 0};
    owner[k++] = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!gw[i].dealer) continue;
        items[k] = (zmq_pollitem_t){gw[i].dealer, 0, ZMQ_POLLIN, 0};
        owner[k++] = &gw[i];
        if (!gw[i].mon) continue;
        items[k] = (zmq_pollitem_t){gw[i].mon, 0, ZMQ_POLLIN, 0};
        owner[k++] = &gw[i];
    }
    return k;
}

/* What a poll found on one gateway's socket or monitor. */
static void on_link_ready(link_state *L, void *sock)
{
    if (sock == L->mon) {
        on_monitor_events(L);
        return;
    }
    /* Bounded batch, so a flood cannot starve heartbeats and output. */
    for (int i = 0; i < 1000 && L->dealer; i++) {
        int ev = 0;
        size_t evlen = sizeof ev;
        zmq_getsockopt(L->dealer, ZMQ_EVENTS, &ev, &evlen);
        if (!(ev & ZMQ_POLLIN)) break;
        on_gateway_message(L);
    }
}

/* The link thread: one loop over every gateway's link. */
static void link_loop(link_state *gw, size_t n)
{
    for (;;) {
        int64_t now = sw_clock_ms();
        long timeout = -1;
        for (size_t i = 0; i < n; i++) {
            if (!gw[i].dealer && now >= gw[i].reconnect_at && open_dealer(&gw[i]) != 0) {
                pipe_send_ctrl(gw[0].pipe, -1, CTRL_FATAL);
                return;
            }
            long t = poll_timeout(&gw[i], now);
            if (timeout < 0 || t < timeout) timeout = t;
        }
        zmq_pollitem_t items[1 + 2 * SW_MAX_GATEWAYS];
        link_state *owner[1 + 2 * SW_MAX_GATEWAYS];
        int n_items = link_poll_items(gw, n, items, owner);
        int rc = zmq_poll(items, n_items, timeout);
        if (rc < 0 && errno != EINTR) {
            sw_worker_log("poll failed: %s", zmq_strerror(errno));
            pipe_send_ctrl(gw[0].pipe, -1, CTRL_FATAL);
            return;
        }
        if (rc > 0 && (items[0].revents & ZMQ_POLLIN) && on_pipe_messages(gw, n)) {
            for (size_t i = 0; i < n; i++) send_disconnect(&gw[i]);
            return;
        }
        for (int k = 1; rc > 0 && k < n_items; k++)
            if ((items[k].revents & ZMQ_POLLIN) && owner[k]->dealer) on_link_ready(owner[k], items[k].socket);
        for (size_t i = 0; i < n; i++) link_timers(&gw[i]);
    }
}

static void *link_main(void *arg)
{
    link_args *a = arg;
    size_t n = a->cfg->n_gateways;
    link_state gw[SW_MAX_GATEWAYS];
    memset(gw, 0, sizeof gw);
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        gw[i].a = a;
        gw[i].idx = (int)i;
        gw[i].ep = a->cfg->gateways[i];
        gw[i].pipe = a->pipe;
        gw[i].backoff_ms = SW_RECONNECT_MIN_MS;
        if (ok && open_dealer(&gw[i]) != 0) ok = 0;
    }
    if (!ok) pipe_send_ctrl(a->pipe, -1, CTRL_FATAL);
    else link_loop(gw, n);
    for (size_t i = 0; i < n; i++) close_dealer(&gw[i], DISCONNECT_LINGER_MS);
    zmq_close(a->pipe);
    return NULL;
}

/* ========================================================================
 * Compute thread
 * ======================================================================== */

/* Requests the gateway is waiting on, by id: a chained hash table, because at
 * thousands of requests per second every chunk looks its request up. */
typedef struct inflight {
    struct inflight *next;
    uint64_t deadline_ms;   /* unix ms, 0 = none */
    uint32_t n_tokens;      /* emitted so far, for the usage of a cancel */
    uint8_t gw;             /* the gateway it came from, whose link answers it */
    char id[];
} inflight;

typedef struct {
    inflight **b;
    size_t nb, n, n_deadlines;
} id_table;

static uint64_t hash_id(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static inflight **table_slot(id_table *t, const char *id)
{
    inflight **pp = &t->b[hash_id(id) & (t->nb - 1)];
    while (*pp && strcmp((*pp)->id, id) != 0) pp = &(*pp)->next;
    return pp;
}

static inflight *table_find(id_table *t, const char *id) { return *table_slot(t, id); }

static void table_grow(id_table *t)
{
    size_t nb = t->nb * 2;
    inflight **b = calloc(nb, sizeof *b);
    if (!b) return; /* chains just get longer */
    for (size_t i = 0; i < t->nb; i++) {
        for (inflight *e = t->b[i], *n; e; e = n) {
            n = e->next;
            inflight **pp = &b[hash_id(e->id) & (nb - 1)];
            e->next = *pp;
            *pp = e;
        }
    }
    free(t->b);
    t->b = b;
    t->nb = nb;
}

static inflight *table_add(id_table *t, const char *id, uint64_t deadline_ms, int gw)
{
    size_t len = strlen(id);
    inflight *e = calloc(1, sizeof *e + len + 1);
    if (!e) return NULL;
    memcpy(e->id, id, len + 1);
    e->deadline_ms = deadline_ms;
    e->gw = (uint8_t)gw;
    inflight **pp = &t->b[hash_id(id) & (t->nb - 1)];
    e->next = *pp;
    *pp = e;
    t->n++;
    if (deadline_ms) t->n_deadlines++;
    if (t->n > t->nb) table_grow(t);
    return e;
}

static void table_remove(id_table *t, const char *id)
{
    inflight **pp = table_slot(t, id);
    inflight *e = *pp;
    if (!e) return;
    *pp = e->next;
    t->n--;
    if (e->deadline_ms) t->n_deadlines--;
    free(e);
}

typedef struct {
    const sw_worker_config *cfg;
    const sw_engine_ops *ops;
    void *eng;
    void *pipe;
    id_table reqs;
    /* Drain: since when and until when (the timeout); 0 while serving. */
    int64_t drain_since, drain_deadline;
    size_t peak;                 /* the most requests held at once */
    uint64_t refused_full, refused_draining;
} compute;

static void send_error(compute *C, int gw, const char *id, uint32_t code, const char *msg)
{
    Spillway__Error e = SPILLWAY__ERROR__INIT;
    e.request_id = (char *)id;
    e.code = code >= 100 && code <= 599 ? code : 500;
    e.message = (char *)msg;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_ERROR;
    env.error = &e;
    pipe_send_env(C->pipe, gw, &env);
}

/* A wire entry from l; top and top_ptrs have room for its alternatives. */
static void wire_logprob(Spillway__Logprob *w, Spillway__TopLogprob *top, Spillway__TopLogprob **top_ptrs,
                         const sw_logprob *l)
{
    w->token_id = (uint32_t)l->chosen.id;
    w->token = (ProtobufCBinaryData){ l->chosen.n_bytes, (uint8_t *)l->chosen.bytes };
    w->logprob = l->chosen.logprob;
    for (int i = 0; i < l->n_top; i++) {
        spillway__top_logprob__init(&top[i]);
        top[i].token_id = (uint32_t)l->top[i].id;
        top[i].token = (ProtobufCBinaryData){ l->top[i].n_bytes, (uint8_t *)l->top[i].bytes };
        top[i].logprob = l->top[i].logprob;
        top_ptrs[w->n_top++] = &top[i];
    }
    w->top = top_ptrs;
}

/* The prompt's log probabilities, in chunks of their own ahead of the first
 * token's (the wire takes 256 a chunk). Out of memory sends none: the
 * response then lacks them rather than the worker failing. */
static void send_prompt_logprobs(compute *C, int gw, const char *id, const sw_logprob *l, size_t n)
{
    enum { K = SW_MAX_PROMPT_LOGPROBS_CHUNK };
    Spillway__Logprob *w = calloc(K, sizeof *w);
    Spillway__Logprob **wp = calloc(K, sizeof *wp);
    Spillway__TopLogprob *top = calloc((size_t)K * SW_MAX_TOP_LOGPROBS, sizeof *top);
    Spillway__TopLogprob **tp = calloc((size_t)K * SW_MAX_TOP_LOGPROBS, sizeof *tp);
    for (size_t at = 0; w && wp && top && tp && at < n; at += K) {
        size_t k = n - at < K ? n - at : K;
        for (size_t i = 0; i < k; i++) {
            spillway__logprob__init(&w[i]);
            wire_logprob(&w[i], top + i * SW_MAX_TOP_LOGPROBS, tp + i * SW_MAX_TOP_LOGPROBS, &l[at + i]);
            wp[i] = &w[i];
        }
        Spillway__TokenChunk c = SPILLWAY__TOKEN_CHUNK__INIT;
        c.request_id = (char *)id;
        c.text = c.reasoning = "";
        c.n_prompt_logprobs = k;
        c.prompt_logprobs = wp;
        sw_env env = SPILLWAY__ENVELOPE__INIT;
        env.body_case = SPILLWAY__ENVELOPE__BODY_CHUNK;
        env.chunk = &c;
        pipe_send_env(C->pipe, gw, &env);
    }
    free(w);
    free(wp);
    free(top);
    free(tp);
}

static void send_chunk(compute *C, int gw, const char *id, const sw_out *o, const uint32_t *ids, size_t n_ids, int finish,
                       const sw_usage *usage)
{
    Spillway__TokenChunk c = SPILLWAY__TOKEN_CHUNK__INIT;
    Spillway__Usage u = SPILLWAY__USAGE__INIT;
    /* a step completes one call (chatml, harmony) or an answer's worth
     * (Llama's JSON at the end); the wire's limit per chunk is 128 */
    enum { MAX_CALLS = 128 };
    Spillway__ToolCall calls[MAX_CALLS], *call_ptrs[MAX_CALLS];
    c.request_id = (char *)id;
    c.text = (char *)(o && o->text ? o->text : "");
    c.reasoning = (char *)(o && o->reasoning ? o->reasoning : "");
    for (size_t i = 0; o && i < o->n_calls && i < MAX_CALLS; i++) {
        spillway__tool_call__init(&calls[i]);
        calls[i].name = (char *)o->calls[i].name;
        calls[i].arguments = (char *)o->calls[i].arguments;
        call_ptrs[c.n_tool_calls++] = &calls[i];
    }
    c.tool_calls = call_ptrs;
    Spillway__Logprob lp = SPILLWAY__LOGPROB__INIT, *lp_ptr = &lp;
    Spillway__TopLogprob top[SW_MAX_TOP_LOGPROBS], *top_ptrs[SW_MAX_TOP_LOGPROBS];
    if (o && o->n_prompt_logprobs) send_prompt_logprobs(C, gw, id, o->prompt_logprobs, o->n_prompt_logprobs);
    if (o && o->logprob) {   /* one token a step: one entry */
        wire_logprob(&lp, top, top_ptrs, o->logprob);
        c.n_logprobs = 1;
        c.logprobs = &lp_ptr;
    }
    c.token_ids = (uint32_t *)ids;
    c.n_token_ids = n_ids;
    c.finish_reason = finish;
    if (finish != SPILLWAY__FINISH_REASON__FINISH_NONE) {
        u.prompt_tokens = usage->prompt_tokens;
        u.completion_tokens = usage->completion_tokens;
        u.cached_tokens = usage->cached_tokens;
        u.reasoning_tokens = usage->reasoning_tokens;
        u.worker_seconds = usage->worker_seconds;
        c.usage = &u;
    }
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_CHUNK;
    env.chunk = &c;
    pipe_send_env(C->pipe, gw, &env);
}

/* The engine's callbacks. Output for a request the gateway no longer waits
 * on (cancelled, expired, or lost with the link) is dropped here. */
static void on_emit(void *ctx, const char *request_id, const sw_out *out, const uint32_t *ids, size_t n_ids,
                    int finish, const sw_usage *usage)
{
    compute *C = ctx;
    inflight *r = table_find(&C->reqs, request_id);
    if (!r) return;
    r->n_tokens += (uint32_t)n_ids;
    send_chunk(C, r->gw, request_id, out, ids, n_ids, finish, usage);
    if (finish != SPILLWAY__FINISH_REASON__FINISH_NONE) table_remove(&C->reqs, request_id);
}

static void on_fail(void *ctx, const char *request_id, uint32_t code, const char *msg)
{
    compute *C = ctx;
    inflight *r = table_find(&C->reqs, request_id);
    if (!r) return;
    send_error(C, r->gw, request_id, code, msg);
    table_remove(&C->reqs, request_id);
}

static int serves_model(const sw_worker_config *cfg, const char *model)
{
    for (size_t i = 0; i < cfg->n_models; i++)
        if (strcmp(cfg->models[i]->name, model) == 0) return 1;
    return 0;
}

/* Refuses a request before it starts, when the worker is draining or holds
 * slots + SW_WORKER_QUEUE_MAX already (from whichever gateways): the hard
 * bound, since no gateway sees the others' requests but through heartbeats
 * that lag. SW_REFUSED_CODE tells the gateway to look elsewhere or queue it.
 * Returns whether it refused. */
static bool refuse_beyond_capacity(compute *C, int gw, const char *id)
{
    char msg[160];
    size_t cap = (size_t)C->cfg->slots + SW_WORKER_QUEUE_MAX;
    if (C->drain_since) {
        C->refused_draining++;
        send_error(C, gw, id, SW_REFUSED_CODE, "worker draining: send it elsewhere");
        return true;
    }
    if (C->reqs.n < cap) return false;
    C->refused_full++;
    snprintf(msg, sizeof msg, "worker full: %zu requests in hand (%u slots + %d queued)", C->reqs.n,
             C->cfg->slots, SW_WORKER_QUEUE_MAX);
    send_error(C, gw, id, SW_REFUSED_CODE, msg);
    return true;
}

static void on_generate(compute *C, int gw, const Spillway__GenerateRequest *req)
{
    char err[256] = "";
    inflight *dup = table_find(&C->reqs, req->request_id);
    if (dup && dup->gw == gw) {
        /* An Error would carry the same id and kill the running stream. */
        sw_worker_log("duplicate request id %s ignored", req->request_id);
        return;
    }
    if (dup) {   /* another gateway's request has the id: this one goes elsewhere */
        send_error(C, gw, req->request_id, 503, "request id in use by another gateway's request");
        return;
    }
    if (!serves_model(C->cfg, req->model)) {
        snprintf(err, sizeof err, "model '%s' is not served by this worker", req->model);
        send_error(C, gw, req->request_id, 404, err);
        return;
    }
    if (req->deadline_unix_ms && sw_wall_ms() >= req->deadline_unix_ms) {
        send_error(C, gw, req->request_id, 504, "deadline passed before the request started");
        return;
    }
    if (refuse_beyond_capacity(C, gw, req->request_id)) return;
    int code = C->ops->submit(C->eng, req, err, sizeof err);
    if (code != 0) {
        send_error(C, gw, req->request_id, (uint32_t)code, err[0] ? err : "request rejected");
        return;
    }
    if (!table_add(&C->reqs, req->request_id, req->deadline_unix_ms, gw)) {
        C->ops->cancel(C->eng, req->request_id);
        send_error(C, gw, req->request_id, 503, "worker out of memory");
        return;
    }
    if (C->reqs.n > C->peak) C->peak = C->reqs.n;
}

/* An EmbedRequest is answered at once, between steps (the engine computes
 * it as one batch): an EmbedReply, or an Error. It never enters the table
 * of requests in flight, so a Cancel for it finds nothing, as for one
 * already finished. */
static void on_embed(compute *C, int gw, const Spillway__EmbedRequest *req)
{
    char err[256] = "";
    if (!serves_model(C->cfg, req->model)) {
        snprintf(err, sizeof err, "model '%s' is not served by this worker", req->model);
        send_error(C, gw, req->request_id, 404, err);
        return;
    }
    if (!C->ops->embed) {
        send_error(C, gw, req->request_id, 400, "embeddings are not supported by this worker");
        return;
    }
    if (req->deadline_unix_ms && sw_wall_ms() >= req->deadline_unix_ms) {
        send_error(C, gw, req->request_id, 504, "deadline passed before the request started");
        return;
    }
    if (refuse_beyond_capacity(C, gw, req->request_id)) return;
    sw_embeddings e;
    int code = C->ops->embed(C->eng, req, &e, err, sizeof err);
    if (code) {
        send_error(C, gw, req->request_id, (uint32_t)code, err[0] ? err : "embeddings failed");
        return;
    }
    Spillway__EmbedReply rep = SPILLWAY__EMBED_REPLY__INIT;
    rep.request_id = req->request_id;
    rep.dim = e.dim;
    rep.n_values = (size_t)e.n * e.dim;
    rep.values = e.values;
    rep.n_input_tokens = e.n;
    rep.input_tokens = e.tokens;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_EMBED_REPLY;
    env.embed_reply = &rep;
    pipe_send_env(C->pipe, gw, &env);
    free(e.values);
    free(e.tokens);
}

static void on_cancel(compute *C, int gw, const char *id)
{
    inflight *r = table_find(&C->reqs, id);
    if (!r || r->gw != gw) return; /* already finished (the race is normal), or not that gateway's */
    C->ops->cancel(C->eng, id);
    send_chunk(C, gw, id, NULL, NULL, 0, SPILLWAY__FINISH_REASON__FINISH_CANCELLED,
               &(sw_usage){ .completion_tokens = r->n_tokens });
    table_remove(&C->reqs, id);
}

/* Ends every request of gateway gw (< 0: of all): with an Error each
 * (code != 0), or silently. */
static void drop_all(compute *C, int gw, uint32_t code, const char *msg)
{
    for (size_t i = 0; i < C->reqs.nb; i++) {
        for (inflight *e = C->reqs.b[i], *n; e; e = n) {
            n = e->next;
            if (gw >= 0 && e->gw != gw) continue;
            C->ops->cancel(C->eng, e->id);
            if (code) send_error(C, e->gw, e->id, code, msg);
            table_remove(&C->reqs, e->id);
        }
    }
}

static void expire_deadlines(compute *C)
{
    uint64_t now = sw_wall_ms();
    for (size_t i = 0; i < C->reqs.nb; i++) {
        for (inflight *e = C->reqs.b[i], *n; e; e = n) {
            n = e->next;
            if (e->deadline_ms && now >= e->deadline_ms) {
                C->ops->cancel(C->eng, e->id);
                send_error(C, e->gw, e->id, 504, "deadline exceeded");
                table_remove(&C->reqs, e->id);
            }
        }
    }
}

/* One message of the link thread: [gateway index][frame], or the single
 * frame CTRL_FATAL. Returns -1 on CTRL_FATAL, 0 when the pipe is empty, 1
 * after handling one. */
static int pipe_one(compute *C)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, C->pipe, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return 0;
    }
    int more = zmq_msg_more(&m);
    int gw = zmq_msg_size(&m) == 1 ? *(unsigned char *)zmq_msg_data(&m) : -1;
    zmq_msg_close(&m);
    if (!more) return gw == CTRL_FATAL ? -1 : 1;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, C->pipe, ZMQ_DONTWAIT) < 0) {   /* a message's parts arrive together */
        zmq_msg_close(&m);
        return 0;
    }
    if (zmq_msg_size(&m) == 1) {
        char c = *(char *)zmq_msg_data(&m);
        zmq_msg_close(&m);
        if (c != CTRL_RESET) return 1;
        size_t before = C->reqs.n;
        drop_all(C, gw, 0, NULL);
        if (before != C->reqs.n)
            sw_worker_log("dropped %zu requests of the lost gateway %s", before - C->reqs.n, C->cfg->gateways[gw]);
        pipe_send_ctrl(C->pipe, gw, CTRL_RESET);   /* done: what follows is the next connection's */
        return 1;
    }
    char err[200];
    sw_env *env = sw_wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), err, sizeof err);
    zmq_msg_close(&m);
    if (!env) {
        sw_worker_log("internal: undecodable forwarded frame: %s", err);
        return 1;
    }
    if (env->body_case == SPILLWAY__ENVELOPE__BODY_GENERATE) on_generate(C, gw, env->generate);
    else if (env->body_case == SPILLWAY__ENVELOPE__BODY_EMBED) on_embed(C, gw, env->embed);
    else if (env->body_case == SPILLWAY__ENVELOPE__BODY_CANCEL)
        on_cancel(C, gw, env->cancel->request_id);
    sw_wire_free(env);
    return 1;
}

/* Drains the pipe. Returns -1 if the link failed for good, else the number
 * of messages handled. */
static int drain_pipe(compute *C)
{
    int handled = 0, rc;
    while ((rc = pipe_one(C)) > 0) handled++;
    return rc < 0 ? -1 : handled;
}

static void make_worker_id(char *out, size_t n)
{
    char host[64] = "worker";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    for (char *p = host; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '.'))
            *p = '_';
    unsigned rnd = (unsigned)(sw_wall_ms() ^ ((uint64_t)getpid() << 16));
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&rnd, sizeof rnd, 1, f) != 1) rnd ^= (unsigned)sw_clock_ms();
        fclose(f);
    }
    snprintf(out, n, "%s-%d-%04x", host, (int)getpid(), rnd & 0xffff);
}

/* Whether the compute loop should end: after a first signal it drains
 * (once: tells the link thread, which tells the gateways) and ends when it
 * holds nothing, at the drain timeout, or at a second signal. */
static bool stop_now(compute *C)
{
    if (!g_signals) return false;
    int64_t now = sw_clock_ms();
    if (!C->drain_since) {
        uint32_t t = C->cfg->drain_timeout_ms ? C->cfg->drain_timeout_ms : SW_DRAIN_TIMEOUT_MS_DEFAULT;
        C->drain_since = now ? now : 1;
        C->drain_deadline = now + t;
        pipe_send_ctrl(C->pipe, -1, CTRL_DRAIN);
        sw_worker_log("signal: draining %zu requests (at most %u ms; a second signal stops at once)", C->reqs.n,
                      t);
    }
    if (C->reqs.n == 0) {
        sw_worker_log("drained in %lld ms", (long long)(now - C->drain_since));
        return true;
    }
    if (g_signals >= 2) return true;
    if (now >= C->drain_deadline) {
        sw_worker_log("drain timeout with %zu requests in hand", C->reqs.n);
        return true;
    }
    return false;
}

/* The compute thread's loop until a signal's drain ends (0) or a broken
 * pipe (1): between steps it drains requests and cancels, and scans
 * deadlines; it waits on the pipe while idle, or as long as idle_ms() says. */
static int compute_loop(compute *C, _Atomic size_t *inflight)
{
    const sw_engine_ops *ops = C->ops;
    int busy = 0;
    int64_t last_scan = 0;
    while (!stop_now(C)) {
        long timeout = IDLE_WAIT_MS;
        if (busy) {
            int idle = ops->idle_ms ? ops->idle_ms(C->eng) : 0;
            timeout = idle < IDLE_WAIT_MS ? idle : IDLE_WAIT_MS;
        }
        zmq_pollitem_t item = {C->pipe, 0, ZMQ_POLLIN, 0};
        if (timeout > 0 || !busy) zmq_poll(&item, 1, timeout);
        int handled = drain_pipe(C);
        if (handled < 0) return 1;
        if (C->reqs.n_deadlines && sw_clock_ms() - last_scan >= DEADLINE_SCAN_MS) {
            last_scan = sw_clock_ms();
            expire_deadlines(C);
        }
        if (busy || handled > 0) busy = ops->step(C->eng, on_emit, on_fail, C) > 0;
        atomic_store_explicit(inflight, C->reqs.n, memory_order_relaxed);
    }
    return 0;
}

/* The CURVE keys the config names, into la: 0 (none named, or loaded), or
 * 1 with the reason logged. A worker told to use CURVE never falls back to
 * plaintext. */
static int load_curve(const sw_worker_config *cfg, link_args *la)
{
    if (!cfg->curve_secret_file && !cfg->gateway_key) return 0;
    char err[512];
    if (!cfg->curve_secret_file || !cfg->gateway_key) {
        sw_worker_log("CURVE needs both the worker's keypair (--curve-secret) and the gateway's public key "
                      "(--gateway-key)");
        return 1;
    }
    if (sw_curve_load_keypair(cfg->curve_secret_file, &la->kp, err, sizeof err) != 0 ||
        sw_curve_load_public(cfg->gateway_key, la->gateway_key, err, sizeof err) != 0) {
        sw_worker_log("%s", err);
        return 1;
    }
    la->curve = true;
    return 0;
}

int sw_gateway_list_add(const char **list, size_t *n, const char *ep, char *err, size_t errlen)
{
    for (size_t i = 0; i < *n; i++)
        if (!strcmp(list[i], ep)) {
            snprintf(err, errlen, "gateway '%s' given twice", ep);
            return -1;
        }
    if (*n >= SW_MAX_GATEWAYS) {
        snprintf(err, errlen, "at most %d gateways", SW_MAX_GATEWAYS);
        return -1;
    }
    list[(*n)++] = ep;
    return 0;
}

int sw_worker_run(const sw_worker_config *cfg, const sw_engine_ops *ops, void *eng)
{
    if (!cfg || !cfg->n_gateways || cfg->n_gateways > SW_MAX_GATEWAYS || !cfg->pool || !cfg->n_models || !ops ||
        !ops->submit || !ops->cancel || !ops->step || !ops->load) {
        sw_worker_log("sw_worker_run: incomplete configuration");
        return 1;
    }
    link_args la = {.cfg = cfg, .ops = ops, .eng = eng};
    if (load_curve(cfg, &la) != 0) return 1;
    for (size_t i = 0; i < cfg->n_gateways; i++)
        if (!cfg->gateways[i]) {
            sw_worker_log("sw_worker_run: gateway %zu has no endpoint", i);
            return 1;
        }
    g_signals = 0;
    char worker_id[SW_MAX_ID_LEN + 1];
    if (cfg->worker_id) snprintf(worker_id, sizeof worker_id, "%s", cfg->worker_id);
    else make_worker_id(worker_id, sizeof worker_id);

    compute C;
    memset(&C, 0, sizeof C);
    C.cfg = cfg;
    C.ops = ops;
    C.eng = eng;
    C.reqs.nb = 256;
    C.reqs.b = calloc(C.reqs.nb, sizeof *C.reqs.b);
    /* Both pipe ends are connected here, before the link thread exists, so
     * neither thread can ever send into an unconnected PAIR (which would
     * block or drop); pthread_create is the barrier that hands the link end
     * over to its thread. */
    void *zctx = zmq_ctx_new();
    C.pipe = new_pair(zctx);
    void *link_pipe = new_pair(zctx);
    pthread_t link;
    la.zctx = zctx;
    la.pipe = link_pipe;
    la.worker_id = worker_id;
    if (!C.reqs.b || zmq_bind(C.pipe, PIPE_EP) != 0 || zmq_connect(link_pipe, PIPE_EP) != 0 ||
        pthread_create(&link, NULL, link_main, &la) != 0) {
        sw_worker_log("worker setup failed: %s", C.reqs.b ? zmq_strerror(errno) : "out of memory");
        zmq_close(link_pipe);
        zmq_close(C.pipe);
        zmq_ctx_term(zctx);
        free(C.reqs.b);
        return 1;
    }

    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: polls return EINTR at once */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    int fatal = compute_loop(&C, &la.inflight);
    if (fatal) {
        sw_worker_log("link to the gateway failed; stopping");
        drop_all(&C, -1, 0, NULL);
    } else {
        if (C.reqs.n) sw_worker_log("stopping: %zu requests in flight get an error", C.reqs.n);
        drop_all(&C, -1, 503, "worker shutting down");
        pipe_send_ctrl(C.pipe, -1, CTRL_QUIT);
    }
    sw_worker_log("held at most %zu requests at once (%u slots + %d queued); refused %llu when full, %llu while "
                  "draining", C.peak, cfg->slots, SW_WORKER_QUEUE_MAX, (unsigned long long)C.refused_full,
                  (unsigned long long)C.refused_draining);
    pthread_join(link, NULL);
    zmq_close(C.pipe);
    zmq_ctx_term(zctx);
    free(C.reqs.b);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    explicit_bzero(&la.kp, sizeof la.kp);
    sw_worker_log("stopped");
    return fatal ? 1 : 0;
}
