/* libspillway's insides, shared by its files (client.c: the connection and
 * generation; embed.c: embeddings). Not installed: sdk/spillway.h is the
 * contract with users.
 *
 * A client is one DEALER socket; every call sends one Envelope under a
 * request id of its own and reads envelopes until its answer comes,
 * skipping those of requests it abandoned.
 */
#ifndef SW_SDK_CLIENT_IMPL_H
#define SW_SDK_CLIENT_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "proto/wire.h"
#include "sdk/spillway.h"

struct spillway_client {
    void *ctx;
    void *sock;
    void *mon;          /* the socket's handshake events (proto/curve.h), or NULL */
    uint64_t next_id;
    unsigned pid;
};

/* err gets fmt with detail (its one %s), when err is given. */
void sw_sdk_err(char *err, size_t n, const char *fmt, const char *detail);

/* A fresh request id for c into id. */
void sw_sdk_new_id(spillway_client *c, char *id, size_t idlen);

/* Whether model is a name the wire carries (non-empty, at most
 * SW_MAX_ID_LEN printable bytes, no spaces): a frame with another is
 * dropped by the gateway unanswered. false with err filled. */
bool sw_sdk_model_ok(const char *model, char *err, size_t errlen);

/* Whether in is text or token ids, exactly one, non-empty, the text UTF-8
 * and the ids at most max_ids; false with err naming what[i]. */
bool sw_sdk_input_ok(const char *what, size_t i, const spillway_input *in, size_t max_ids, char *err,
                     size_t errlen);

/* Sends env, refusing one larger than a frame (SW_MAX_FRAME, which the
 * gateway would drop); 0, or -1 with err filled. */
int sw_sdk_send(spillway_client *c, sw_env *env, char *err, size_t errlen);

/* The next envelope by deadline (sw_clock_ms); NULL on timeout, a failed
 * handshake or a broken socket, with err filled. */
sw_env *sw_sdk_recv(spillway_client *c, int64_t deadline, char *err, size_t errlen);

/* Asks the gateway to stop request id (best effort). */
void sw_sdk_cancel(spillway_client *c, const char *id);

#endif
