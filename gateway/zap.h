/* The gateway's ZAP handler (ZeroMQ's authentication protocol, RFC 27):
 * which CURVE keys may connect to the worker and SDK endpoints.
 *
 * It runs on a thread of its own with a REP socket on
 * inproc://zeromq.zap.01 in the gateway's ZeroMQ context, so libzmq asks it
 * about every CURVE handshake on the sockets that carry a ZAP domain
 * (SW_ZAP_DOMAIN_WORKERS, SW_ZAP_DOMAIN_SDK). It admits a key found in that
 * domain's allowlist (the --worker-keys or --client-keys file, format in
 * proto/curve.h) and sets the connection's User-Id to the key's Z85 text, so
 * the broker reads which key sent a message (zmq_msg_gets "User-Id").
 * Refusals are logged with the peer's address and key (at most a few lines
 * a second, with a count of the rest) and counted in
 * spillway_{worker,sdk}_auth_refused_total{reason}.
 *
 * The allowlists are reloaded when their file changes (checked at most once
 * a second) or on sw_zap_reload (SIGHUP). A file that fails to parse keeps
 * the previous list. Each successful reload bumps sw_zap_generation, so the
 * broker can drop live workers whose key was removed.
 *
 * Threads: the lookups below may be called from any thread (the broker's).
 */
#ifndef SW_GW_ZAP_H
#define SW_GW_ZAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SW_ZAP_DOMAIN_WORKERS "spillway-workers"
#define SW_ZAP_DOMAIN_SDK "spillway-sdk"

/* Loads the allowlists (NULL: that domain admits no key) and starts the
 * handler in zctx. Call before binding any CURVE socket: with no handler
 * bound, libzmq would admit every key. 0, or -1 with err filled. */
int sw_zap_start(void *zctx, const char *worker_keys_file, const char *client_keys_file, char *err,
                 size_t errlen);
/* Waits for the handler to end; it ends when its context is terminated
 * (zmq_ctx_term), so call this after that. Safe if never started. */
void sw_zap_join(void);
/* Asks for a reload of both files at the handler's next wakeup (at most a
 * second later): the main thread calls it on SIGHUP. Lock-free. */
void sw_zap_reload(void);
/* Counts successful reloads: changes when the allowlists may have changed. */
unsigned sw_zap_generation(void);

/* Whether the worker key (Z85 text, as in User-Id) is listed and may serve
 * pool; when it may not, why says so. name gets the key's label (may be NULL). */
bool sw_zap_worker_may_serve(const char *key_z85, const char *pool, char *why, size_t whylen, char *name,
                             size_t namelen);
/* Whether the SDK client key (Z85 text) is still listed. */
bool sw_zap_client_allowed(const char *key_z85);

#endif
