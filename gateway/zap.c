/* The ZAP handler: admits CURVE keys from the allowlists (see zap.h). */
#include "gateway/zap.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>
#include "gateway/metrics.h"
#include "gateway/util.h"
#include "proto/curve.h"

#define ZAP_EP "inproc://zeromq.zap.01"
#define CHECK_MS 1000              /* allowlist files are looked at once a second */
#define LOG_PER_WINDOW 5           /* refusal lines per LOG_WINDOW_MS; the rest are counted */
#define LOG_WINDOW_MS 1000
#define MAX_FRAMES 8               /* ZAP 1.0 requests carry 6 or 7 */

typedef struct {
    const char *path;              /* NULL: the domain admits no key */
    bool pools;                    /* pools= allowed (worker keys) */
    sw_curve_allowlist list;
    int64_t mtime_ns;
    off_t size;
    ino_t ino;
} keyfile;

static struct {
    pthread_mutex_t mu;            /* guards the lists */
    keyfile workers, clients;
    void *rep;
    pthread_t thread;
    bool started;
    int reload_wanted;             /* atomic: set by the main thread on SIGHUP */
    unsigned generation;           /* atomic */
    int64_t last_check_ms, log_window_ms;
    int logged, suppressed;        /* refusal log lines in this window, and those held back */
} Z = { .mu = PTHREAD_MUTEX_INITIALIZER };

void sw_zap_reload(void) { __atomic_store_n(&Z.reload_wanted, 1, __ATOMIC_RELEASE); }

unsigned sw_zap_generation(void) { return __atomic_load_n(&Z.generation, __ATOMIC_ACQUIRE); }

/* The file's identity and contents stamp: a change of any means reload. */
static bool stamp_changed(keyfile *k, bool update)
{
    struct stat st;
    if (!k->path || stat(k->path, &st) != 0) return false;
    int64_t m = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    bool changed = m != k->mtime_ns || st.st_size != k->size || st.st_ino != k->ino;
    if (update) {
        k->mtime_ns = m;
        k->size = st.st_size;
        k->ino = st.st_ino;
    }
    return changed;
}

/* (Re)reads one file; on error the old list stays. Returns 0 or -1 (err filled). */
static int load_keyfile(keyfile *k, char *err, size_t errlen)
{
    if (!k->path) return 0;
    stamp_changed(k, true);   /* before reading: a write during the read is seen next time */
    sw_curve_allowlist fresh;
    if (sw_curve_allowlist_load(k->path, k->pools, &fresh, err, errlen) != 0) return -1;
    pthread_mutex_lock(&Z.mu);
    sw_curve_allowlist old = k->list;
    k->list = fresh;
    pthread_mutex_unlock(&Z.mu);
    sw_curve_allowlist_free(&old);
    return 0;
}

static void maybe_reload(int64_t now)
{
    bool forced = __atomic_exchange_n(&Z.reload_wanted, 0, __ATOMIC_ACQ_REL);
    if (!forced && now - Z.last_check_ms < CHECK_MS) return;
    Z.last_check_ms = now;
    keyfile *files[2] = {&Z.workers, &Z.clients};
    for (int i = 0; i < 2; i++) {
        if (!files[i]->path || !(forced || stamp_changed(files[i], false))) continue;
        char err[512];
        if (load_keyfile(files[i], err, sizeof err) != 0) {
            fprintf(stderr, "gateway: key allowlist reload failed, keeping the old list: %s\n", err);
            continue;
        }
        fprintf(stderr, "gateway: reloaded %zu key(s) from %s\n", files[i]->list.n, files[i]->path);
        __atomic_add_fetch(&Z.generation, 1, __ATOMIC_ACQ_REL);
    }
}

/* One refusal line, at most LOG_PER_WINDOW a window, then a count. */
static void log_refusal(bool sdk, const char *addr, const char *key, const char *why)
{
    int64_t now = sw_now_ms();
    if (now - Z.log_window_ms >= LOG_WINDOW_MS) {
        if (Z.suppressed)
            fprintf(stderr, "gateway: (%d more refused connections not logged)\n", Z.suppressed);
        Z.log_window_ms = now;
        Z.logged = Z.suppressed = 0;
    }
    if (++Z.logged > LOG_PER_WINDOW) {
        Z.suppressed++;
        return;
    }
    fprintf(stderr, "gateway: refused %s connection from %s with key %s: %s\n", sdk ? "an SDK client" : "a worker",
            addr, key, why);
}

/* The decision on one request: 200 with the key's Z85 as the user id, or 400. */
static const char *decide(zmq_msg_t *f, int n, char user[SW_CURVE_Z85_LEN + 1])
{
    const char *domain = zmq_msg_size(&f[2]) == strlen(SW_ZAP_DOMAIN_SDK) &&
                         !memcmp(zmq_msg_data(&f[2]), SW_ZAP_DOMAIN_SDK, zmq_msg_size(&f[2])) ? "sdk" : "workers";
    bool sdk = domain[0] == 's';
    char addr[64], key[SW_CURVE_Z85_LEN + 1] = "(none)";
    snprintf(addr, sizeof addr, "%.*s", (int)(zmq_msg_size(&f[3]) < 63 ? zmq_msg_size(&f[3]) : 63),
             (const char *)zmq_msg_data(&f[3]));
    bool curve = zmq_msg_size(&f[5]) == 5 && !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) && n >= 7 &&
                 zmq_msg_size(&f[6]) == 32;
    if (!curve) {
        log_refusal(sdk, addr, key, "not a CURVE handshake");
        sw_metrics_auth_refused(sdk, "not_curve");
        return "400";
    }
    const uint8_t *pk = zmq_msg_data(&f[6]);
    zmq_z85_encode(key, pk, 32);
    pthread_mutex_lock(&Z.mu);
    bool ok = sw_curve_allowlist_find(sdk ? &Z.clients.list : &Z.workers.list, pk) != NULL;
    pthread_mutex_unlock(&Z.mu);
    if (!ok) {
        log_refusal(sdk, addr, key, sdk ? "not in --client-keys" : "not in --worker-keys");
        sw_metrics_auth_refused(sdk, "unlisted_key");
        return "400";
    }
    memcpy(user, key, sizeof key);
    return "200";
}

/* Reads one request (up to MAX_FRAMES frames) and answers it. */
static void serve_one(void)
{
    zmq_msg_t f[MAX_FRAMES];
    int n = 0;
    bool more = true;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, Z.rep, n == 0 ? ZMQ_DONTWAIT : 0) < 0) { zmq_msg_close(&m); break; }
        more = zmq_msg_more(&m);
        if (n < MAX_FRAMES) {
            zmq_msg_init(&f[n]);
            zmq_msg_move(&f[n++], &m);   /* zmq_msg_t may not be copied by assignment */
        }
        zmq_msg_close(&m);
    }
    if (n == 0) return;
    char user[SW_CURVE_Z85_LEN + 1] = "";
    const char *status = n >= 6 ? decide(f, n, user) : "400";
    const char *text = status[0] == '2' ? "OK" : "key not allowed";
    zmq_send(Z.rep, "1.0", 3, ZMQ_SNDMORE);
    if (n >= 2) zmq_send(Z.rep, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
    else zmq_send(Z.rep, "", 0, ZMQ_SNDMORE);
    zmq_send(Z.rep, status, 3, ZMQ_SNDMORE);
    zmq_send(Z.rep, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(Z.rep, user, strlen(user), ZMQ_SNDMORE);
    zmq_send(Z.rep, "", 0, 0);
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

/* Until the context is terminated: answer requests, watch the files. */
static void *zap_main(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);   /* signals are the main thread's (sigwait) */
    for (;;) {
        zmq_pollitem_t it = {Z.rep, 0, ZMQ_POLLIN, 0};
        int rc = zmq_poll(&it, 1, CHECK_MS);
        if (rc < 0 && zmq_errno() == ETERM) break;
        if (rc > 0) serve_one();
        maybe_reload(sw_now_ms());
    }
    zmq_close(Z.rep);
    pthread_mutex_lock(&Z.mu);
    sw_curve_allowlist_free(&Z.workers.list);
    sw_curve_allowlist_free(&Z.clients.list);
    pthread_mutex_unlock(&Z.mu);
    return NULL;
}

int sw_zap_start(void *zctx, const char *worker_keys_file, const char *client_keys_file, char *err,
                 size_t errlen)
{
    Z.workers = (keyfile){ .path = worker_keys_file, .pools = true };
    Z.clients = (keyfile){ .path = client_keys_file, .pools = false };
    if (load_keyfile(&Z.workers, err, errlen) != 0 || load_keyfile(&Z.clients, err, errlen) != 0) {
        sw_curve_allowlist_free(&Z.workers.list);
        return -1;
    }
    Z.last_check_ms = sw_now_ms();
    Z.rep = zmq_socket(zctx, ZMQ_REP);
    int zero = 0;
    if (Z.rep) zmq_setsockopt(Z.rep, ZMQ_LINGER, &zero, sizeof zero);
    if (!Z.rep || zmq_bind(Z.rep, ZAP_EP) != 0 || pthread_create(&Z.thread, NULL, zap_main, NULL) != 0) {
        snprintf(err, errlen, "cannot start the ZAP handler: %s", zmq_strerror(zmq_errno()));
        if (Z.rep) zmq_close(Z.rep);
        sw_curve_allowlist_free(&Z.workers.list);
        sw_curve_allowlist_free(&Z.clients.list);
        return -1;
    }
    Z.started = true;
    return 0;
}

void sw_zap_join(void)
{
    if (!Z.started) return;
    pthread_join(Z.thread, NULL);
    Z.started = false;
}

bool sw_zap_worker_may_serve(const char *key_z85, const char *pool, char *why, size_t whylen, char *name,
                             size_t namelen)
{
    uint8_t key[32];
    if (!key_z85 || strlen(key_z85) != SW_CURVE_Z85_LEN || !zmq_z85_decode(key, key_z85)) {
        snprintf(why, whylen, "the connection has no CURVE key");
        return false;
    }
    pthread_mutex_lock(&Z.mu);
    const sw_curve_allowed *a = sw_curve_allowlist_find(&Z.workers.list, key);
    bool ok = a && sw_curve_allowed_pool(a, pool);
    if (name && namelen) snprintf(name, namelen, "%s", a ? a->name : "(unlisted)");
    if (!a) snprintf(why, whylen, "key %s is no longer in --worker-keys", key_z85);
    else if (!ok) snprintf(why, whylen, "key %s (%s) may not serve pool '%.64s' (its pools= in --worker-keys)",
                           key_z85, a->name, pool ? pool : "");
    pthread_mutex_unlock(&Z.mu);
    return ok;
}

bool sw_zap_client_allowed(const char *key_z85)
{
    uint8_t key[32];
    if (!key_z85 || strlen(key_z85) != SW_CURVE_Z85_LEN || !zmq_z85_decode(key, key_z85)) return false;
    pthread_mutex_lock(&Z.mu);
    bool ok = sw_curve_allowlist_find(&Z.clients.list, key) != NULL;
    pthread_mutex_unlock(&Z.mu);
    return ok;
}
