/* Client API keys: who may call the gateway, for which models and routes,
 * at which priority, and how fast (token buckets per key).
 *
 * HOW http.c CALLS IT (the whole hookup):
 *
 *   at start (spillway-gateway.c or http.c's setup), once:
 *     char err[4096];
 *     sw_keys *keys = sw_keys_open(g->api_keys_file, err, sizeof err);
 *     if (!keys) { fprintf(stderr, "%s\n", err); exit(1); }
 *     (a NULL path gives a handle that admits everyone: no key needed)
 *
 *   per generate request, after sw_openai_parse (the model is known) and
 *   before sw_broker_post:
 *     sw_key_request kr = { .authorization = header(c, "Authorization"),
 *                           .model = r->model, .target = r->want_target,
 *                           .klass = r->klass,
 *                           .prompt_tokens = r->prompt_tokens_est,
 *                           .max_tokens = <the request's max_tokens> };
 *     sw_key_refusal why;
 *     int st = sw_keys_admit(keys, &kr, &ticket, &why);
 *     if (st) -> answer st with sw_openai_error_json(why.message, why.type,
 *                why.param, why.code), and "Retry-After: why.retry_after_s"
 *                when why.retry_after_s > 0 (always so for a 429);
 *     else    -> keep `ticket` with the request (NULL when keys are off);
 *                r->klass = sw_key_class(ticket, r->klass);
 *                label for logs: sw_key_label(ticket).
 *
 *   when the request ends, whatever the outcome (finished, failed, client
 *   gone; once, on any thread):
 *     sw_keys_settle(ticket, r->usage_prompt, r->usage_completion);
 *     (NULL is fine; 0, 0 for a request that never reached a worker)
 *
 *   GET /metrics appends:  sw_keys_metrics(keys, &sbuf);
 *   at shutdown, after every ticket is settled:  sw_keys_close(keys);
 *
 *   and copies the pools the key may use into the request for the router
 *   (sw_key_pools; router.h: a route to another pool is not the key's):
 *     r->key_pools = sw_strv_dup(sw_key_pools(ticket, &r->n_key_pools), ...);
 * A key's `routes` also bounds an explicit X-Spillway-Target at admission
 * (403 route_not_allowed, before any routing).
 *
 * Statuses sw_keys_admit returns (OpenAI error shape; param NULL unless said):
 *   401 invalid_request_error / missing_api_key   no "Authorization: Bearer"
 *   401 invalid_request_error / invalid_api_key   unknown or wrong key
 *   403 permission_error / model_not_allowed      param "model"
 *   403 permission_error / route_not_allowed      param "X-Spillway-Target"
 *   403 permission_error / priority_not_allowed   param "X-Spillway-Priority"
 *   400 invalid_request_error / tokens_per_minute_exceeded  param "max_tokens":
 *       the request alone needs more than the key's whole minute (a 429
 *       would only be retried forever)
 *   429 rate_limit_exceeded / requests_per_second_exceeded | concurrency_exceeded
 *       | tokens_per_minute_exceeded, Retry-After = whole seconds until the
 *       bucket would admit it (at least 1)
 *
 * The keys file (YAML; docs/security.md "Client API keys"; entries made by
 * `spillway-apikey new`) holds only salted hashes (proto/apikey.h says
 * which hash and why). It is reloaded when its mtime, size or inode
 * changes, looked at no more than once a second by sw_keys_admit; a file
 * that fails to load keeps the old keys, and its errors are logged once as
 * file:line:column. A key's buckets and in-flight count survive a reload
 * (kept by the key's id); a key removed stops being admitted at once, and
 * its requests in flight settle normally.
 *
 * Metrics and logs name a key by its label, never its secret nor its hash.
 *
 * Thread-safe: every function may be called from any thread (one mutex;
 * each call does a few bucket sums and at most one BLAKE2b under it).
 *
 * Layer: beside metrics.c at the bottom of the gateway; uses proto/apikey.h,
 * policy.h's sw_request_class and util.h.
 */
#ifndef SW_GW_KEYS_H
#define SW_GW_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "gateway/util.h"

typedef struct sw_keys sw_keys;
typedef struct sw_key_ticket sw_key_ticket;

/* What admission looks at; strings may be NULL where said. */
typedef struct {
    const char *authorization;  /* the Authorization header's value; NULL if absent */
    const char *model;          /* after alias resolution */
    const char *target;         /* the pool asked for (X-Spillway-Target); NULL = any */
    int klass;                  /* sw_request_class asked; SW_CLASS_ANY = none */
    uint32_t prompt_tokens;     /* the gateway's estimate */
    uint32_t max_tokens;        /* the most the request may generate; 0 = unknown */
} sw_key_request;

/* Why a request was refused: enough for the OpenAI error body and headers.
 * type, code and param point to static strings. */
typedef struct {
    int status;                 /* 400, 401, 403 or 429 */
    char message[256];
    const char *type, *code, *param;
    int retry_after_s;          /* > 0 for a 429 */
} sw_key_refusal;

/* Loads the keys file at path. NULL path: keys are off, and the handle
 * admits every request with a NULL ticket. Returns NULL with every error,
 * one per line as "file:line:column: message", in err. Caller closes. */
sw_keys *sw_keys_open(const char *path, char *err, size_t errlen);
/* Frees the handle; every ticket must have been settled. NULL is fine. */
void sw_keys_close(sw_keys *k);
/* Loads the file again now (SIGHUP, POST /admin/reload): 0, or -1 with the
 * errors in err and the old keys kept. 0 at once when keys are off. */
int sw_keys_reload(sw_keys *k, char *err, size_t errlen);
/* Asks every handle to load its file again at its next admission, changed
 * or not (SIGHUP, from a signal-handling thread). Lock-free. */
void sw_keys_reload_soon(void);
/* True when the handle checks keys (it was opened with a path). */
bool sw_keys_enabled(const sw_keys *k);

/* Admits a request or says why not. 0: admitted, *out is the ticket (NULL
 * when keys are off), and the key's limits have been charged: one request,
 * one concurrent slot, prompt_tokens + max_tokens tokens. Otherwise the
 * HTTP status, *out is NULL, nothing is charged and *why is filled. */
int sw_keys_admit(sw_keys *k, const sw_key_request *rq, sw_key_ticket **out, sw_key_refusal *why);

/* Ends an admitted request (once; NULL is fine): frees its concurrent slot
 * and replaces the tokens charged at admission by the tokens it used (a
 * refund when it used fewer; when it used more, the bucket goes into debt,
 * so later requests wait). Frees the ticket. */
void sw_keys_settle(sw_key_ticket *t, uint32_t prompt_tokens, uint32_t completion_tokens);

/* The key's label, for logs; "" for a NULL ticket. Valid until settle. */
const char *sw_key_label(const sw_key_ticket *t);
/* The class the request runs at: the asked class, or the key's class when
 * none was asked (admission already refused a class above the key's). A
 * NULL ticket returns `asked` unchanged. */
int sw_key_class(const sw_key_ticket *t, int asked);
/* The pools the key may use (its `routes`), *n of them; n = 0 (and NULL
 * for a NULL ticket) means every pool. Valid until settle. */
char *const *sw_key_pools(const sw_key_ticket *t, size_t *n);

/* Appends the per-key series (Prometheus text) to out:
 *   spillway_client_requests_total{key="LABEL",status="admitted|forbidden|rate_limited|too_large"}
 *   spillway_client_unauthorized_total{reason="missing|invalid"}
 *   spillway_client_tokens_total{key="LABEL",kind="prompt|completion"}
 *   spillway_client_inflight{key="LABEL"}
 *   spillway_client_keys_reloads_total{result="ok|error"}
 * Labels come from the keys file, so the series are bounded by it. Nothing
 * is appended when keys are off. */
void sw_keys_metrics(sw_keys *k, sw_sbuf *out);

#endif
