/* The operators' actions on the admin API: drain, cordon, force overflow
 * (admin.c; the state they set is ops.h's).
 *
 * Runs on HTTP threads, after http.c has checked the admin token.
 * Layer: below http.c; uses the registry (under reg.mu) and posts to the
 * broker.
 */
#ifndef SW_GW_ADMIN_H
#define SW_GW_ADMIN_H

#include <stdbool.h>
#include <stddef.h>
#include "gateway/gateway.h"

/* Whether url has the shape of an action (/admin/workers/..., /admin/pools/...,
 * /admin/routes/...), all POST. */
bool sw_admin_is_action(const char *url);
/* Performs the POSTed action at url with its body; peer is the client's
 * address, for the log. Returns the HTTP status and in *json the answer or
 * an OpenAI-shaped error (caller frees). */
int sw_admin_action(sw_gateway *g, const char *url, const char *body, size_t len, const char *peer, char **json);

#endif
