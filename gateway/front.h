/* The front door: what every generate request passes on its way in, from
 * either kind of client.
 *
 * HTTP (http.c, after sw_openai_parse built the GenerateRequest) and SDK
 * clients (broker.c's SDK side, with a decoded one) both hand it here; the
 * broker then sees one kind of sw_req. The decisions made here are made
 * nowhere else: alias resolution, whether the model exists, the
 * prompt-size estimate routes match on, the prefix key, and the default
 * deadline the worker enforces.
 *
 * Layer: above the router, the registry and the policy; below http.c,
 * openai.c and the SDK side of broker.c.
 */
#ifndef SW_FRONT_H
#define SW_FRONT_H

#include <stdbool.h>
#include "proto/wire.h"
#include "gateway/policy.h"
#include "gateway/registry.h"
#include "gateway/req.h"

/* Fills r from g and encodes it for the workers: r->model_asked (g->model)
 * and r->model (its alias resolved by p), r->prompt_tokens_est, r->prefix_key,
 * and r->gen: g under r->id and the resolved model, with the policy's
 * request timeout as its deadline when g names none. g is left as it came.
 * Pure (no registry): the fuzzers run it. Returns 0, or -1 out of memory. */
int sw_front_prepare(sw_req *r, const sw_policy *p, Spillway__GenerateRequest *g);

/* The same for an embeddings request (gateway/embeddings.c): r->gen is
 * Envelope{embed}; the estimate is the inputs' tokens (text: about four
 * bytes a token); no prefix key (each input is computed whole). */
int sw_front_prepare_embed(sw_req *r, const sw_policy *p, Spillway__EmbedRequest *e);

/* Whether the model is of the request's kind: an embeddings request to a
 * model the live workers serve for generation, or a generation request to
 * an embedding model, is refused (400, param "model"), as is a token-id
 * embeddings input longer than the model's context (param "input"). A
 * model no live worker serves passes: its worker decides. Returns 0, or
 * 400 with msg and *param set. Takes reg->mu. */
int sw_front_check_kind(sw_registry *reg, const sw_req *r, char *msg, size_t msglen, const char **param);

/* Whether the model (alias resolved) exists: a route of the policy names it,
 * or a live worker registered it. Takes reg->mu. */
bool sw_front_model_exists(sw_registry *reg, const sw_policy *p, const char *model);

#endif
