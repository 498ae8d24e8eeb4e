/* The HTTP front door (http.c): libmicrohttpd's handlers for the OpenAI
 * API, health, metrics and admin endpoints.
 *
 * Layer: the top, below only spillway-gateway.c; uses the broker, the front
 * door, openai.c and the registry.
 */
#ifndef SW_GW_HTTP_H
#define SW_GW_HTTP_H

#include <stddef.h>
#include "gateway/gateway.h"

int sw_http_start(sw_gateway *g, const char *host, int port, char *err, size_t errlen);
void sw_http_stop(sw_gateway *g);
/* Test mode (tests/fuzz/fuzz_http.c): the same server with no listening
 * socket; sw_http_add_connection hands it a connected socket (one end of
 * a socketpair), which it then owns and closes. 0, or -1. */
int sw_http_start_unbound(sw_gateway *g, char *err, size_t errlen);
int sw_http_add_connection(sw_gateway *g, int fd);

#endif
