/* OpenAI's Responses API (POST /v1/responses), stateless: a translation
 * layer onto chat. A Responses body becomes a chat completions body that
 * sw_openai_parse validates and encodes (so every limit and check of chat
 * holds here too); the chat machinery runs it; the results the request
 * gathers (text, reasoning, calls, usage) are rendered as a response object
 * or as the Responses stream's events.
 *
 * Nothing is stored: previous_response_id, store: true, background: true
 * and conversation are refused, as are built-in tools (web_search, ...).
 *
 * Runs on HTTP threads, on a request the caller holds (r->mu where said).
 * Layer: beside openai.c (which it calls), below http.c.
 */
#ifndef SW_GW_RESPONSES_H
#define SW_GW_RESPONSES_H

#include <stddef.h>
#include "gateway/policy.h"
#include "gateway/req.h"
#include "gateway/util.h"

/* Parses and validates a Responses body into r, as sw_openai_parse does for
 * chat (r->chat is set, r->resp holds what the answer repeats of the
 * request). Returns 0, or an HTTP status with msg and *param (the
 * Responses field, e.g. "input[2].type") set. */
int sw_responses_parse(sw_req *r, const char *body, size_t len, const sw_policy *p, char *msg, size_t msglen,
                       const char **param);
/* The response object of a finished request (r->mu held). */
char *sw_responses_body(sw_req *r);
/* Streaming (r->mu held): the opening events first (response.created,
 * response.in_progress), then the events for the reasoning, text and calls
 * r gathered since the last call, which it takes (r->text and r->reasoning
 * are emptied, n_calls_sent advanced). */
void sw_responses_sse_take(sw_req *r, sw_sbuf *out);
/* The closing events: every open item done, then response.completed,
 * response.incomplete (cut at max_output_tokens) or response.failed. */
void sw_responses_sse_final(sw_req *r, sw_sbuf *out);
void sw_responses_free(struct sw_resp *s);

#endif
