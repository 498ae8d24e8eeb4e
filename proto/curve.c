/* CURVE keys: keypairs, key files and allowlists (see curve.h). */
#include "proto/curve.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#define MAX_KEY_FILE 16384          /* a key file is a few lines; more is not one */
#define MAX_ALLOWLIST (1 << 22)     /* 4 MiB: ~50k keys */

static void errf(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void errf(char *err, size_t n, const char *fmt, ...)
{
    if (!err || !n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

bool sw_curve_valid_z85(const char *s)
{
    uint8_t bin[32];
    return s && strlen(s) == SW_CURVE_Z85_LEN && zmq_z85_decode(bin, s) != NULL;
}

int sw_curve_generate(sw_curve_keypair *kp, char *err, size_t errlen)
{
    memset(kp, 0, sizeof *kp);
    if (!zmq_has("curve") || zmq_curve_keypair(kp->public_z85, kp->secret_z85) != 0) {
        errf(err, errlen, "this libzmq has no CURVE support (it needs libsodium)");
        return -1;
    }
    return 0;
}

/* Creates path exclusively with mode and writes text. */
static int write_new(const char *path, mode_t mode, const char *text, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        errf(err, errlen, "cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    size_t n = strlen(text);
    bool ok = fchmod(fd, mode) == 0 && write(fd, text, n) == (ssize_t)n;   /* fchmod: the umask must not widen or narrow it */
    if (close(fd) != 0) ok = false;
    if (!ok) {
        errf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        unlink(path);
        return -1;
    }
    return 0;
}

int sw_curve_write_keypair(const char *prefix, const sw_curve_keypair *kp, char *err, size_t errlen)
{
    char keyp[4096], pubp[4096], text[512];
    if ((size_t)snprintf(keyp, sizeof keyp, "%s.key", prefix) >= sizeof keyp ||
        (size_t)snprintf(pubp, sizeof pubp, "%s.pub", prefix) >= sizeof pubp) {
        errf(err, errlen, "key file prefix too long");
        return -1;
    }
    /* Neither may exist: overwriting a key in use would lock its holder out. */
    struct stat st;
    if (stat(keyp, &st) == 0 || stat(pubp, &st) == 0) {
        errf(err, errlen, "%s or %s already exists; not overwriting a key", keyp, pubp);
        return -1;
    }
    snprintf(text, sizeof text,
             "# Spillway CURVE keypair (spillway keygen). SECRET: keep it mode 0600, never share it.\n"
             "public-key = \"%s\"\nsecret-key = \"%s\"\n", kp->public_z85, kp->secret_z85);
    if (write_new(keyp, 0600, text, err, errlen) != 0) return -1;
    snprintf(text, sizeof text, "# Spillway CURVE public key (spillway keygen): safe to share.\n"
                                "public-key = \"%s\"\n", kp->public_z85);
    if (write_new(pubp, 0644, text, err, errlen) != 0) {
        unlink(keyp);
        return -1;
    }
    return 0;
}

/* The whole file (fewer than cap - 1 bytes) into buf, NUL-terminated:
 * the bytes read, or -1 with err filled. *mode gets its mode. */
static long read_small(const char *path, char *buf, size_t cap, mode_t *mode, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        errf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    ssize_t n = S_ISREG(st.st_mode) ? read(fd, buf, cap - 1) : -1;
    close(fd);
    if (n < 0 || (size_t)n >= cap - 1) {
        errf(err, errlen, "%s is not a regular file of at most %zu bytes", path, cap - 2);
        return -1;
    }
    buf[n] = 0;
    *mode = st.st_mode;
    return (long)n;
}

long sw_secret_file_read(const char *path, char *buf, size_t cap, char *err, size_t errlen)
{
    mode_t mode;
    long n = read_small(path, buf, cap, &mode, err, errlen);
    if (n < 0) return -1;
    if (mode & 077) {
        explicit_bzero(buf, cap);
        errf(err, errlen, "%s holds a secret but group or others may read it (mode %03o); "
                          "chmod 600 %s", path, (unsigned)(mode & 0777), path);
        return -1;
    }
    return n;
}

/* The value of `name = value` in a key file's text (quotes stripped), into
 * out (41 bytes); false if absent. */
static bool key_value(const char *text, const char *name, char out[SW_CURVE_Z85_LEN + 1])
{
    size_t nl = strlen(name);
    for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        while (*line == ' ' || *line == '\t') line++;
        if (strncmp(line, name, nl) != 0) continue;
        const char *p = line + nl;
        while (*p == ' ' || *p == '\t') p++;
        if (*p++ != '=') continue;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '"') p++;
        size_t n = 0;
        while (p[n] && p[n] != '"' && !isspace((unsigned char)p[n])) n++;
        if (n != SW_CURVE_Z85_LEN) return false;
        memcpy(out, p, n);
        out[n] = 0;
        return true;
    }
    return false;
}

int sw_curve_load_keypair(const char *path, sw_curve_keypair *kp, char *err, size_t errlen)
{
    char text[MAX_KEY_FILE];
    memset(kp, 0, sizeof *kp);
    if (sw_secret_file_read(path, text, sizeof text, err, errlen) < 0) return -1;
    char derived[SW_CURVE_Z85_LEN + 1];
    if (!key_value(text, "secret-key", kp->secret_z85) || !sw_curve_valid_z85(kp->secret_z85) ||
        !key_value(text, "public-key", kp->public_z85) || !sw_curve_valid_z85(kp->public_z85)) {
        errf(err, errlen, "%s: want public-key = Z85 and secret-key = Z85 lines (spillway keygen writes them)",
             path);
        return -1;
    }
    if (zmq_curve_public(derived, kp->secret_z85) != 0 || strcmp(derived, kp->public_z85) != 0) {
        errf(err, errlen, "%s: its public-key is not the public key of its secret-key", path);
        return -1;
    }
    return 0;
}

int sw_curve_load_public(const char *arg, char out[SW_CURVE_Z85_LEN + 1], char *err, size_t errlen)
{
    struct stat st;
    if (stat(arg, &st) != 0) {   /* not a file: the key itself */
        if (sw_curve_valid_z85(arg)) {
            snprintf(out, SW_CURVE_Z85_LEN + 1, "%s", arg);
            return 0;
        }
        errf(err, errlen, "'%s' is neither a key file nor a 40-character Z85 public key", arg);
        return -1;
    }
    char text[MAX_KEY_FILE];
    mode_t mode;
    if (read_small(arg, text, sizeof text, &mode, err, errlen) < 0) return -1;
    if (!key_value(text, "public-key", out) || !sw_curve_valid_z85(out)) {
        errf(err, errlen, "%s: no public-key = Z85 line", arg);
        return -1;
    }
    char secret[SW_CURVE_Z85_LEN + 1];
    if (key_value(text, "secret-key", secret) && (mode & 077)) {
        errf(err, errlen, "%s holds a secret key but group or others may read it; chmod 600 %s "
                          "(or pass the .pub file)", arg, arg);
        return -1;
    }
    return 0;
}

/* ---- allowlists ------------------------------------------------------------ */

/* One token after the key: pools=A,B or name=LABEL. */
static int allow_option(sw_curve_allowed *a, const char *tok, bool allow_pools, char *why, size_t n)
{
    if (!strncmp(tok, "name=", 5) && tok[5]) {
        snprintf(a->name, sizeof a->name, "%s", tok + 5);
        return 0;
    }
    if (strncmp(tok, "pools=", 6) != 0 || !tok[6]) {
        snprintf(why, n, "unknown option '%.100s' (want pools=A,B or name=LABEL)", tok);
        return -1;
    }
    if (!allow_pools) {
        snprintf(why, n, "pools= applies to worker keys only");
        return -1;
    }
    for (const char *p = tok + 6; *p;) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof a->pools[0] || a->n_pools == SW_CURVE_MAX_POOLS) {
            snprintf(why, n, "pools=: empty or over-long pool name, or more than %d pools", SW_CURVE_MAX_POOLS);
            return -1;
        }
        memcpy(a->pools[a->n_pools], p, len);
        a->pools[a->n_pools++][len] = 0;
        p += len;
        if (*p == ',') p++;
    }
    return 0;
}

/* One line (NUL-terminated) into a. 1: an entry; 0: blank or a comment;
 * -1: why filled. '#' is a Z85 character, so a comment is a token that
 * starts with '#' (after the key, or in place of one that is not a key). */
static int allow_line(char *line, bool allow_pools, sw_curve_allowed *a, char *why, size_t n)
{
    char *save = NULL, *tok = strtok_r(line, " \t\r", &save);
    if (!tok) return 0;
    memset(a, 0, sizeof *a);
    bool is_key = strlen(tok) == SW_CURVE_Z85_LEN && zmq_z85_decode(a->key, tok);
    if (!is_key && tok[0] == '#') return 0;
    if (!is_key) {
        snprintf(why, n, "'%.60s' is not a 40-character Z85 public key", tok);
        return -1;
    }
    memcpy(a->z85, tok, SW_CURVE_Z85_LEN + 1);
    snprintf(a->name, sizeof a->name, "%.8s", tok);
    while ((tok = strtok_r(NULL, " \t\r", &save)) && tok[0] != '#')
        if (allow_option(a, tok, allow_pools, why, n) != 0) return -1;
    return 1;
}

/* Appends a to l, refusing a key listed twice (which pools= would win?). */
static int allow_add(sw_curve_allowlist *l, const sw_curve_allowed *a, char *why, size_t n)
{
    if (sw_curve_allowlist_find(l, a->key)) {
        snprintf(why, n, "key %.8s... is listed twice", a->z85);
        return -1;
    }
    sw_curve_allowed *k = realloc(l->keys, (l->n + 1) * sizeof *k);
    if (!k) {
        snprintf(why, n, "out of memory");
        return -1;
    }
    l->keys = k;
    l->keys[l->n++] = *a;
    return 0;
}

int sw_curve_allowlist_load(const char *path, bool allow_pools, sw_curve_allowlist *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "re");
    if (!f) {
        errf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    char line[4096], why[256];
    int lineno = 0, rc = 0;
    long total = 0;
    sw_curve_allowed a;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        total += (long)strlen(line);
        line[strcspn(line, "\n")] = 0;
        int got = total > MAX_ALLOWLIST ? (snprintf(why, sizeof why, "file over %d bytes", MAX_ALLOWLIST), -1)
                                        : allow_line(line, allow_pools, &a, why, sizeof why);
        if (got > 0) got = allow_add(out, &a, why, sizeof why);
        if (got < 0) {
            errf(err, errlen, "%s:%d: %s", path, lineno, why);
            rc = -1;
        }
    }
    if (rc == 0 && ferror(f)) {
        errf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        rc = -1;
    }
    fclose(f);
    if (rc != 0) sw_curve_allowlist_free(out);
    return rc;
}

void sw_curve_allowlist_free(sw_curve_allowlist *l)
{
    free(l->keys);
    l->keys = NULL;
    l->n = 0;
}

const sw_curve_allowed *sw_curve_allowlist_find(const sw_curve_allowlist *l, const uint8_t key[32])
{
    for (size_t i = 0; i < l->n; i++)
        if (memcmp(l->keys[i].key, key, 32) == 0) return &l->keys[i];
    return NULL;
}

bool sw_curve_allowed_pool(const sw_curve_allowed *a, const char *pool)
{
    if (a->n_pools == 0) return true;
    for (int i = 0; i < a->n_pools; i++)
        if (pool && strcmp(a->pools[i], pool) == 0) return true;
    return false;
}

/* ---- sockets ---------------------------------------------------------------- */

int sw_curve_client_setup(void *sock, const sw_curve_keypair *kp, const char *server_public_z85, char *err,
                          size_t errlen)
{
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server_public_z85, SW_CURVE_Z85_LEN) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, kp->public_z85, SW_CURVE_Z85_LEN) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, kp->secret_z85, SW_CURVE_Z85_LEN) != 0) {
        errf(err, errlen, "cannot set CURVE keys: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    return 0;
}

void *sw_curve_monitor_open(void *zctx, void *sock, const char *name)
{
    int events = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_SUCCEEDED;
    if (zmq_socket_monitor(sock, name, events) != 0) return NULL;
    void *mon = zmq_socket(zctx, ZMQ_PAIR);
    int zero = 0;
    if (mon) zmq_setsockopt(mon, ZMQ_LINGER, &zero, sizeof zero);
    if (mon && zmq_connect(mon, name) != 0) {
        zmq_close(mon);
        mon = NULL;
    }
    return mon;
}

/* A failed handshake's cause, in words a person setting up keys can act on. */
static void describe_failure(uint16_t ev, uint32_t value, char *what, size_t n)
{
    if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        snprintf(what, n, "the gateway refused our CURVE key (ZAP status %u): is its public key in the "
                          "gateway's allowlist?", value);
    else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        snprintf(what, n, "security mechanism mismatch: one side uses CURVE and the other plaintext "
                          "(check --curve-secret and --gateway-key on both ends)");
    else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
        snprintf(what, n, "handshake protocol error 0x%x (a wrong gateway public key?)", value);
    else
        snprintf(what, n, "handshake failed (%s): is CURVE set on one side only?", strerror((int)value));
}

int sw_curve_monitor_read(void *mon, char *what, size_t n)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return -1;
    }
    uint16_t ev = 0;
    uint32_t value = 0;
    if (zmq_msg_size(&m) >= 6) {
        memcpy(&ev, zmq_msg_data(&m), 2);
        memcpy(&value, (char *)zmq_msg_data(&m) + 2, 4);
    }
    bool more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    while (more) {   /* the endpoint frame */
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, mon, 0) < 0) more = false;
        else more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED || ev == 0) return 0;
    describe_failure(ev, value, what, n);
    return 1;
}
