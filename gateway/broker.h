/* The broker thread (broker.c): the only thread that touches ZeroMQ. It
 * routes submitted requests (router.c), relays chunks to each request's
 * sink, runs the wait queue and the timeouts, and serves SDK clients.
 *
 * Layer: below the HTTP front door, which posts to it; above the router,
 * the registry and metrics. It calls back up only through a request's sink.
 */
#ifndef SW_GW_BROKER_H
#define SW_GW_BROKER_H

#include <stddef.h>
#include "gateway/gateway.h"
#include "gateway/req.h"

#define SW_KEEPALIVE_MS 200          /* SSE comment while a stream waits */
#define SW_TICK_MS 50                /* broker housekeeping period */

/* SW_CMD_OPS (req NULL): an operator changed what may take requests
 * (ops.h): the wait queue is tried again. SW_CMD_CHOICES: the choices of a
 * request of several (choices.h) marked send_wanted are submitted, while
 * the request is held. */
typedef enum { SW_CMD_SUBMIT, SW_CMD_CANCEL, SW_CMD_OPS, SW_CMD_CHOICES } sw_cmd_kind;

int sw_broker_start(sw_gateway *g, char *err, size_t errlen);
/* Stops the thread after failing every request it still holds. */
void sw_broker_stop(sw_gateway *g);
/* From any thread: submit a request, or cancel one (its client is gone),
 * taking a reference; or tell the broker of an operator's change. */
void sw_broker_post(sw_gateway *g, sw_cmd_kind kind, sw_req *req);
/* The same from the broker thread itself (a sink): handled after the
 * event in hand, so that a sink never changes the broker's tables while
 * the broker walks them. */
void sw_broker_post_here(sw_cmd_kind kind, sw_req *req);

#endif
