/* The gateway as a whole: its configuration, the running policy (hot
 * reload, control.c), the registry, and the handles its threads share.
 *
 * Threads:
 *   - libmicrohttpd's pool threads run http.c: they parse and validate a
 *     request, pass it through the front door (front.c) and hand the sw_req
 *     to the broker through the inbox (mutex + eventfd), then suspend the
 *     connection.
 *   - the broker thread (broker.c) owns every ZeroMQ socket, the worker
 *     registry's mutations, the route counters and the wait queue. It hands
 *     each request's chunks to the request's sink (HTTP or SDK client).
 * HTTP threads only read the registry (under reg.mu) for /healthz,
 * /v1/models, /metrics and /admin/workers.
 *
 * The files form layers; each calls only those below it (the broker reaches
 * a client only through its request's sw_sink, req.h):
 *   spillway-gateway.c
 *   http.c (the HTTP front door)          -> broker.c, responses.c, openai.c, front.c
 *   broker.c (and its SDK side)           -> front.c, router.c, control.c
 *   responses.c (/v1/responses onto chat) -> openai.c
 *   openai.c                              -> front.c
 *   front.c                               -> router.c, registry.c
 *   admin.c (operators' actions)          -> broker.c, registry.c
 *   control.c (policy, reload, status)    -> router.c, registry.c, metrics.c
 *   router.c -> registry.c -> metrics.c -> util.c; req.h, policy.c below all
 * Headers, one per module: gateway.h (control.c), broker.h, http.h,
 * front.h, openai.h, responses.h, req.h (util.c), router.h, registry.h, metrics.h,
 * policy.h, util.h.
 */
#ifndef SW_GW_GATEWAY_H
#define SW_GW_GATEWAY_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include "gateway/policy.h"
#include "gateway/registry.h"

#define SW_RETRY_AFTER_S 1           /* Retry-After of a 429 or 503 */

struct sw_cmd;
struct MHD_Daemon;

typedef struct sw_gateway {
    const char *config_path;
    const char *workers_ep;
    const char *sdk_ep;          /* NULL = no SDK endpoint */
    bool sdk_ep_optional;        /* the default: failing to bind it is only a warning */

    /* Security settings, from the command line (spillway-gateway.c). Each
     * file is read by the module that enforces it. */
    const char *admin_token_file;  /* NULL: the admin endpoints answer 403 */
    /* The token itself, read once at startup (trailing newline stripped,
     * never empty); NULL when no file was given. http.c compares a
     * request's "Authorization: Bearer" against it in constant time. */
    char *admin_token;
    const char *api_keys_file;     /* NULL: clients need no key */
    const char *curve_secret_file; /* the gateway's CURVE keypair; NULL: plaintext links */
    const char *worker_keys_file;  /* CURVE public keys of the workers allowed in */
    const char *client_keys_file;  /* CURVE public keys of the SDK clients allowed in */
    bool insecure_workers;         /* allow a non-loopback worker endpoint without CURVE */
    pthread_mutex_t policy_mu;
    sw_policy *policy;           /* current; swap under policy_mu */
    pthread_mutex_t reload_mu;   /* serializes reloads */
    int64_t policy_mtime_ns;        /* atomic: a reload (any thread) sets it, the broker compares */
    char last_reload_error[4096];

    sw_registry reg;
    /* The route counters (router.h): the broker's; the list and their
     * in-flight counts change under reg.mu, where the status reads them. */
    struct sw_route_stats *route_stats;
    int64_t started_ms;

    /* inbox: HTTP threads -> broker (broker.c) */
    pthread_mutex_t inbox_mu;
    struct sw_cmd *inbox_head, *inbox_tail;
    int inbox_fd;                /* eventfd */
    int stop;                    /* atomic */
    int reload_requested;        /* atomic; set on SIGHUP */
    pthread_t broker;
    void *zctx;
    struct MHD_Daemon *mhd;
} sw_gateway;

extern sw_gateway *sw_gw;

/* The shared state of g (locks, registry, metrics) with p as its policy,
 * once, before any thread starts; the caller has set the configuration. */
void sw_gw_init(sw_gateway *g, sw_policy *p);
sw_policy *sw_gw_policy(sw_gateway *g);      /* returns a reference */
/* Reloads the config file; on error keeps the old policy and fills err. */
int sw_gw_reload(sw_gateway *g, char *err, size_t errlen);
/* The status document (GET /admin/status, SDK StatusRequest): the
 * registry's (registry.h's sw_status_build), the routes with their counters
 * and forced overflows, and the last reload error. Caller frees. */
char *sw_gw_status_json(sw_gateway *g);
/* Whether token is the admin token (false when none is configured). Both
 * are hashed first and the digests compared with sodium_memcmp, so neither
 * the token's length nor its bytes show in the timing. */
bool sw_gw_admin_token_ok(const sw_gateway *g, const char *token);
/* The /metrics text (metrics.c's, from snapshots of the registry and the
 * route counters); NULL out of memory. Caller frees. */
char *sw_gw_metrics_text(sw_gateway *g);

#endif
