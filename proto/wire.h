/* Framing helpers for the Spillway protocol (proto/spillway.proto).
 *
 * One ZeroMQ frame = one Envelope. sw_wire_decode validates everything a peer
 * could get wrong (version, missing body, missing ids, absurd sizes) so the
 * code that consumes a message can trust it. It never crashes on garbage: it
 * returns NULL and describes the problem in err.
 */
#ifndef SW_WIRE_H
#define SW_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include "spillway.pb-c.h"
#include "llm/limits.h"   /* every limit on a request: the wire check applies them */

#define SW_PROTOCOL_VERSION 1
#define SW_MAX_FRAME (16u << 20)     /* no legitimate message comes near this */
#define SW_MAX_ID_LEN 128
#define SW_MAX_PROMPT_LOGPROBS_CHUNK 256   /* prompt log probabilities in one chunk */

/* Heartbeats (Paranoid Pirate): send after HEARTBEAT_MS of silence; the peer
 * is dead after HEARTBEAT_LIVENESS intervals without hearing anything. */
#define SW_HEARTBEAT_MS 1000
#define SW_HEARTBEAT_LIVENESS 3
#define SW_RECONNECT_MIN_MS 250
#define SW_RECONNECT_MAX_MS 8000

/* The most requests a worker holds beyond its slots (accepted, waiting for
 * one). A GenerateRequest past slots + this is refused with SW_REFUSED_CODE,
 * whichever gateway sent it: the hard bound on a worker's work, which the
 * gateways' own counts (their view of each other lags by a heartbeat) cannot
 * guarantee alone. The gateway sends no more than this either. */
#define SW_WORKER_QUEUE_MAX 2
/* The code of a worker's Error refusing a request before it started (full,
 * or draining): the gateway sends it elsewhere or queues it; the client
 * never sees it. */
#define SW_REFUSED_CODE 429

typedef Spillway__Envelope sw_env;

/* Encodes env (setting its version) into a malloc'd buffer; returns its size. */
size_t sw_wire_encode(sw_env *env, uint8_t **out);
/* Decodes and validates one frame. Free with sw_wire_free. */
sw_env *sw_wire_decode(const void *buf, size_t len, char *err, size_t errlen);
/* As sw_wire_decode, and where the frame is a client's request (generate,
 * embed, status) that fails the checks but carries a valid request id, rid
 * gets that id ("" otherwise), so that the client can be told why. */
sw_env *sw_wire_decode_request(const void *buf, size_t len, char *err, size_t errlen, char *rid, size_t ridlen);
/* The request id of a client's request (generate, embed, status), or NULL
 * for another body or an id that is not valid. */
const char *sw_wire_client_request_id(const sw_env *env);
void sw_wire_free(sw_env *env);
/* Short name of the body kind, for logs ("register", "chunk", ...). */
const char *sw_wire_kind(const sw_env *env);

/* Sends env as one frame on a ZeroMQ socket. If `identity` is non-NULL
 * (ROUTER side) the identity frame goes first. Returns 0 or -1 (errno set). */
int sw_wire_send(void *zsock, const void *identity, size_t idlen, sw_env *env, int flags);

#endif
