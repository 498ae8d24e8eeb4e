/* The OpenAI API's JSON: request bodies in (validated against llm/limits.h,
 * built into a GenerateRequest and passed through the front door), and
 * response bodies and SSE events out.
 *
 * Runs on HTTP threads, on a request the caller holds (r->mu where said).
 * Layer: below http.c; uses the front door and req.h.
 */
#ifndef SW_GW_OPENAI_H
#define SW_GW_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include "gateway/policy.h"
#include "gateway/req.h"
#include "gateway/util.h"

/* Parses and validates a completions/chat body into r: the GenerateRequest
 * it builds goes through the front door (sw_front_prepare), which fills r's
 * model, estimate, prefix key and encoded request. Whether the model exists
 * is the caller's to ask (sw_front_model_exists). Returns 0, or an HTTP
 * status with msg (and param, for a field) set. */
int sw_openai_parse(sw_req *r, const char *body, size_t len, bool chat,
                    const sw_policy *p, char *msg, size_t msglen, const char **param);
/* Any request body (the admin API's too) as a JSON object held to the same
 * rules as the OpenAI bodies: UTF-8, at most SW_MAX_JSON_DEPTH deep, no
 * NUL. NULL with msg (and *param, for a field) set; free with cJSON_Delete. */
struct cJSON;
struct cJSON *sw_json_body(const char *body, size_t len, char *msg, size_t msglen, const char **param);
char *sw_openai_error_json(const char *message, const char *type, const char *param,
                           const char *code);
const char *sw_finish_name(int finish);
/* Non-streaming response body (r->mu held): a request of several choices
 * lists them all, in index order. */
char *sw_openai_response(sw_req *r);
/* Streaming: one SSE event for a text delta / the final chunk / usage. */
void sw_openai_sse_delta(sw_req *r, sw_sbuf *out, const char *text, size_t n, const char *reasoning, size_t rn,
                         bool role);
/* One delta event with the calls not relayed yet (n_calls_sent on). */
void sw_openai_sse_calls(sw_req *r, sw_sbuf *out);
/* A delta event for a request that asked for log probabilities: its text
 * and the entries not relayed yet (n_lps_sent on). */
void sw_openai_sse_delta_logprobs(sw_req *r, sw_sbuf *out, bool role);
/* What r has that was not relayed yet (its role first, for chat), as
 * delta events; the buffers are left empty (r->mu held). */
void sw_openai_sse_pending(sw_req *r, sw_sbuf *out);
/* r's choice's last chunk: its finish_reason (and the error, failed). */
void sw_openai_sse_finish(sw_req *r, sw_sbuf *out);
/* The end of a stream: the last chunk, usage if asked for, [DONE]. A
 * request of several choices (whose choices' last chunks went out as each
 * finished) adds only its error, if it failed. */
void sw_openai_sse_final(sw_req *r, sw_sbuf *out);

#endif
