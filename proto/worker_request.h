/* A GenerateRequest as the generator takes it: the wire's struct turned
 * into plain sw_gen_params (llm/generate.h). The engines schedule by the
 * request's ids and deadline and hand this to sw_gen_new. This is where
 * the wire's conventions are applied (no seed: a random one; effort and
 * finish reasons share values), so that llm/ never sees a protobuf type.
 *
 * The request's fields were checked by sw_wire_decode (sizes, ranges,
 * UTF-8); what only a model can check (token ids against its vocabulary,
 * the prompt against its context) the generator checks in sw_gen_new. */
#ifndef SW_WORKER_REQUEST_H
#define SW_WORKER_REQUEST_H

#include <stddef.h>
#include <stdint.h>
#include "spillway.pb-c.h"
#include "llm/generate.h"

/* The generator's parameters for one request, with the storage they
 * point into (the rest points into the wire request). */
typedef struct {
    sw_gen_params gen;
    int32_t *ids;
    sw_chat_msg *msgs;
    sw_tool_call *calls;
    cJSON *tools, *schema;
    int32_t *bias_ids;
    float *bias;
} sw_request;

/* Fills r from req (which must outlive r). Returns 0, or 400 with err
 * filled (tools_json or json_schema that is not JSON of the right kind,
 * out of memory); r needs sw_request_free either way. */
int sw_request_from_wire(sw_request *r, const Spillway__GenerateRequest *req, char *err, size_t errlen);
void sw_request_free(sw_request *r);

/* Both, then sw_gen_new: the generator for req, which owns everything it
 * needs; NULL with err filled when the request is invalid (the engines
 * answer 400). */
sw_gen *sw_gen_from_wire(const sw_tokenizer *tok, sw_chat_template chat, const Spillway__GenerateRequest *req,
                         int n_ctx, char *err, size_t errlen);

#endif
