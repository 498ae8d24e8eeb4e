/* A request of several choices: `n` > 1, or several prompts in one
 * completions request (OpenAI's batched form, as lm-eval-harness sends).
 *
 * The request its client holds (the parent) does not go to a worker. Each
 * choice is a request of its own (a child sw_req), routed, queued, counted
 * and timed out as any, so k choices take k slots for capacity and
 * overflow. The parent merges their output: SSE events carry each choice's
 * index, the response lists the choices in index order, and usage counts a
 * prompt once however many samples were drawn from it.
 *
 * A prompt's first choice goes out at once; its others after that choice's
 * first chunk, when its prompt is in its worker's KV cache: the routing key
 * (sw_prefix_key) sends them to the same worker, whose prefix cache then
 * copies the prompt's KV instead of computing it again.
 *
 * One choice failing fails the request (streamed: an error event, then
 * [DONE]) and cancels the others at their workers.
 *
 * An SDK client's request with n > 1, or with a batch of prompts (the
 * wire's GenerateRequest.prompts), is made the same way, by the same
 * sw_choices_prepare; its choices' chunks go to the client as they come,
 * each with its index (prompt * n + sample), and each choice finishes on
 * its own chunk with its own usage (the client merges them).
 *
 * Layer: beside the broker, on its thread (the sink's calls, start; and
 * sw_choices_make for SDK requests), and on the HTTP thread that parses
 * (sw_choices_make); uses front.h and openai.h.
 */
#ifndef SW_GW_CHOICES_H
#define SW_GW_CHOICES_H

#include <stddef.h>
#include <stdint.h>
#include "gateway/policy.h"
#include "gateway/req.h"
#include "proto/wire.h"

/* One prompt of a completions request: text, or token ids. */
typedef struct {
    const char *text;
    const uint32_t *ids;
    size_t n_ids;
} sw_prompt;

/* The one way a generate request is made, from either kind of client
 * (openai.c's parse, the broker's SDK side): parent prepared from g aimed
 * at the first of n_prompts prompts (0: g's own prompt or messages) by
 * sw_front_prepare, and, when n_prompts * n (n 0 is 1) is more than one
 * choice, its choices by sw_choices_make. What is encoded for a worker is
 * one prompt and one sample: g's n and batch (the wire's prompts) are left
 * out. g is left as it came. Returns 0, or -1 out of memory. */
int sw_choices_prepare(sw_req *parent, const sw_policy *p, Spillway__GenerateRequest *g, const sw_prompt *prompts,
                       size_t n_prompts, unsigned n);

/* An SDK client's batch (g->prompts) as prompts pointing into g: a
 * malloc'd array of g->n_prompts; NULL when there is none or out of memory
 * (g->n_prompts says which). */
sw_prompt *sw_choices_wire_prompts(const Spillway__GenerateRequest *g);

/* HTTP thread, after parent was prepared from g (sw_front_prepare): makes
 * parent's n_prompts * n choices, choice i from prompt i / n (chat: g's
 * messages, n_prompts 1), with g's seed + i % n when g has one, so that a
 * prompt's choices are what its own request with n samples would give.
 * g is left as it came. Returns 0, or -1 out of memory. */
int sw_choices_make(sw_req *parent, const sw_policy *p, Spillway__GenerateRequest *g, const sw_prompt *prompts,
                    size_t n_prompts, unsigned n);

/* Broker thread, when the parent is submitted: copies what admission
 * decided (class, directives) onto the choices and marks each prompt's
 * first choice to be sent (send_wanted), which the broker then does; the
 * others are marked when their prompt's first choice has its first chunk,
 * and posted to the broker as SW_CMD_CHOICES. */
void sw_choices_start(sw_req *parent);

/* The sink of every choice: merges into the parent, through the parent's
 * own sink, which must take a chunk into the sw_req it is given (the HTTP
 * sink keeps it there; the SDK sink sends it under that choice's client id
 * and index). */
extern const sw_sink sw_choice_sink;

#endif
