/* CURVE keys for the gateway<->worker and gateway<->SDK links (ZeroMQ's
 * CurveZMQ, libsodium underneath): generating keypairs, the key files
 * `spillway keygen` writes, and the allowlists the gateway admits keys from.
 * Shared by the gateway, both workers and the SDK; uses only libzmq.
 *
 * Key files (docs/security.md), one `name = value` a line, '#' comments;
 * values may be quoted, and other lines are ignored, so CZMQ's zcert
 * files read too:
 *   PREFIX.key   public-key = <40 Z85 characters>     mode 0600: it holds
 *                secret-key = <40 Z85 characters>     the secret
 *   PREFIX.pub   public-key = <40 Z85 characters>     safe to hand out
 * A secret key file that group or others may read is refused.
 *
 * Allowlists (--worker-keys, --client-keys), one key a line:
 *   <40 Z85 characters of a public key> [pools=POOL,POOL...] [name=LABEL]  # comment
 * A token starting with '#' begins a comment ('#' is also a Z85 character:
 * a first token that is a valid key is a key). pools= (worker keys only)
 * are the pools that key may register into; no
 * pools= means any pool. name= labels the key in logs (default: the key's
 * first 8 characters).
 */
#ifndef SW_PROTO_CURVE_H
#define SW_PROTO_CURVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SW_CURVE_Z85_LEN 40        /* a 32-byte key in Z85 */
#define SW_CURVE_MAX_POOLS 16      /* pools= entries per allowlisted key */
#define SW_CURVE_NAME_LEN 64

typedef struct {
    char public_z85[SW_CURVE_Z85_LEN + 1];
    char secret_z85[SW_CURVE_Z85_LEN + 1];
} sw_curve_keypair;

/* True when s is exactly 40 Z85 characters that decode to a key. */
bool sw_curve_valid_z85(const char *s);

/* A fresh keypair. 0, or -1 with err filled (libzmq built without CURVE). */
int sw_curve_generate(sw_curve_keypair *kp, char *err, size_t errlen);

/* Writes PREFIX.key (both keys, created with mode 0600) and PREFIX.pub
 * (the public key, 0644). Refuses to overwrite either file. 0, or -1 with
 * err filled. */
int sw_curve_write_keypair(const char *prefix, const sw_curve_keypair *kp, char *err, size_t errlen);

/* Reads a file that holds a secret (a key file, the gateway's admin token)
 * whole into buf (cap bytes, NUL-terminated). Refuses, with err filled and
 * -1, a file that is not regular, holds cap - 1 bytes or more, or that
 * group or others may read (the message says "chmod 600"). Returns the
 * bytes read (a NUL among them is the caller's to judge); the caller wipes
 * buf when done. */
long sw_secret_file_read(const char *path, char *buf, size_t cap, char *err, size_t errlen);

/* Reads a secret key file. Refuses one that group or others may read, one
 * lacking either key, and one whose public key is not its secret key's. */
int sw_curve_load_keypair(const char *path, sw_curve_keypair *kp, char *err, size_t errlen);

/* A public key given as a file (a .pub, or a .key: its public-key line is
 * read, and then the file's mode is checked as for a secret) or as its 40
 * Z85 characters. out gets the Z85 text. 0, or -1 with err filled. */
int sw_curve_load_public(const char *file_or_z85, char out[SW_CURVE_Z85_LEN + 1], char *err, size_t errlen);

/* One allowlisted key. */
typedef struct {
    uint8_t key[32];
    char z85[SW_CURVE_Z85_LEN + 1];
    char name[SW_CURVE_NAME_LEN];
    char pools[SW_CURVE_MAX_POOLS][64];
    int n_pools;                       /* 0: any pool */
} sw_curve_allowed;

typedef struct {
    sw_curve_allowed *keys;
    size_t n;
} sw_curve_allowlist;

/* Parses an allowlist file into out (freed with sw_curve_allowlist_free).
 * allow_pools: whether pools= may appear (worker keys). On any error
 * (file:line: message in err) out is left empty and -1 returned. */
int sw_curve_allowlist_load(const char *path, bool allow_pools, sw_curve_allowlist *out, char *err,
                            size_t errlen);
void sw_curve_allowlist_free(sw_curve_allowlist *l);
/* The entry for a 32-byte key, or NULL. */
const sw_curve_allowed *sw_curve_allowlist_find(const sw_curve_allowlist *l, const uint8_t key[32]);
/* Whether an entry may serve pool (no pools= listed: any). */
bool sw_curve_allowed_pool(const sw_curve_allowed *a, const char *pool);

/* Sets CURVE client options on a socket (DEALER to the gateway): our
 * keypair and the server's public key. 0, or -1 with err filled. */
int sw_curve_client_setup(void *sock, const sw_curve_keypair *kp, const char *server_public_z85, char *err,
                          size_t errlen);

/* Handshake failures of a socket, so a refused peer says why instead of
 * retrying in silence: sw_curve_monitor_open starts ZeroMQ's monitor on
 * sock (name: a unique inproc endpoint) and returns the PAIR to poll, or
 * NULL. sw_curve_monitor_read takes one event off it and, for a failed
 * handshake, describes it in what and returns 1; 0 for other events, -1
 * when none could be read. */
void *sw_curve_monitor_open(void *zctx, void *sock, const char *name);
int sw_curve_monitor_read(void *mon, char *what, size_t n);

#endif
