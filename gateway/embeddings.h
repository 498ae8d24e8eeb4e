/* POST /v1/embeddings, OpenAI's: the body validated (against llm/limits.h)
 * into an EmbedRequest that goes through the front door like a generation
 * request (aliases, routes, overflow), and the response rendered from the
 * worker's EmbedReply.
 *
 * Runs on HTTP threads, on a request the caller holds (r->mu where said).
 * Layer: beside openai.c, below http.c; uses the front door and req.h.
 */
#ifndef SW_GW_EMBEDDINGS_H
#define SW_GW_EMBEDDINGS_H

#include <stddef.h>
#include "gateway/policy.h"
#include "gateway/req.h"

/* Parses body into r (r->embed set, r->gen an Envelope{embed}). `input` is
 * a string, an array of strings, an array of token ids or an array of
 * arrays of them; `encoding_format` "float" (the default) or "base64";
 * `dimensions` is refused (our models cannot truncate their vectors);
 * `user` is accepted. Whether the model exists and is an embedding model
 * is the caller's to ask. Returns 0, or an HTTP status with msg and
 * *param set. */
int sw_embed_parse(sw_req *r, const char *body, size_t len, const sw_policy *p, char *msg, size_t msglen,
                   const char **param);

/* The HTTP sink's `embedded`: keeps the vectors and the token count in r
 * (takes r->mu). */
void sw_embed_keep(sw_req *r, const Spillway__EmbedReply *e);

/* The response body, {"object":"list","data":[...],"model":...,"usage":...}
 * (r->mu held); NULL out of memory. */
char *sw_embed_response(sw_req *r);

#endif
