/* GenerateRequest -> sw_request (see worker_request.h). */
#include "proto/worker_request.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>
#include "llm/util.h"

/* The generator's finish reasons go on the wire as they are. */
_Static_assert((int)SW_FINISH_NONE == (int)SPILLWAY__FINISH_REASON__FINISH_NONE &&
               (int)SW_FINISH_STOP == (int)SPILLWAY__FINISH_REASON__FINISH_STOP &&
               (int)SW_FINISH_LENGTH == (int)SPILLWAY__FINISH_REASON__FINISH_LENGTH &&
               (int)SW_FINISH_CANCELLED == (int)SPILLWAY__FINISH_REASON__FINISH_CANCELLED &&
               (int)SW_FINISH_ERROR == (int)SPILLWAY__FINISH_REASON__FINISH_ERROR,
               "SW_FINISH_* must equal Spillway__FinishReason");
/* ... and reasoning efforts come off it as they are. */
_Static_assert((int)SW_EFFORT_DEFAULT == SPILLWAY__REASONING_EFFORT__REASONING_EFFORT_DEFAULT &&
               (int)SW_EFFORT_LOW == SPILLWAY__REASONING_EFFORT__REASONING_EFFORT_LOW &&
               (int)SW_EFFORT_MEDIUM == SPILLWAY__REASONING_EFFORT__REASONING_EFFORT_MEDIUM &&
               (int)SW_EFFORT_HIGH == SPILLWAY__REASONING_EFFORT__REASONING_EFFORT_HIGH,
               "sw_reasoning_effort must equal Spillway__ReasoningEffort");

static uint64_t random_seed(void)
{
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
    }
    return s;
}

/* tools_json and json_schema, parsed (the generator compiles them). */
static int request_json(sw_request *r, const Spillway__GenerateRequest *req, char *err, size_t errlen)
{
    if (req->tools_json && *req->tools_json) {
        r->tools = cJSON_Parse(req->tools_json);
        if (!cJSON_IsArray(r->tools)) { sw_errf(err, errlen, "tools_json is not a JSON array"); return 400; }
        r->gen.tools = r->tools;
    }
    if (req->json_schema && *req->json_schema) {
        if (!(r->schema = cJSON_Parse(req->json_schema))) { sw_errf(err, errlen, "json_schema is not JSON"); return 400; }
        r->gen.json_schema = r->schema;
    }
    return 0;
}

/* Chat messages, with their tool calls in one array. */
static int request_messages(sw_request *r, const Spillway__GenerateRequest *req, char *err, size_t errlen)
{
    size_t n_calls = 0;
    for (size_t i = 0; i < req->n_messages; i++) n_calls += req->messages[i]->n_tool_calls;
    r->msgs = calloc(req->n_messages, sizeof *r->msgs);
    r->calls = calloc(n_calls + 1, sizeof *r->calls);
    if (!r->msgs || !r->calls) { sw_errf(err, errlen, "out of memory"); return 400; }
    for (size_t i = 0, k = 0; i < req->n_messages; i++) {
        const Spillway__ChatMessage *cm = req->messages[i];
        r->msgs[i].role = cm->role ? cm->role : "";
        r->msgs[i].content = cm->content ? cm->content : "";
        r->msgs[i].tool_calls = r->calls + k;
        r->msgs[i].n_tool_calls = cm->n_tool_calls;
        for (size_t c = 0; c < cm->n_tool_calls; c++, k++)
            r->calls[k] = (sw_tool_call){ cm->tool_calls[c]->name, cm->tool_calls[c]->arguments };
    }
    r->gen.messages = r->msgs;
    r->gen.n_messages = req->n_messages;
    return 0;
}

/* One prompt form: messages, else token ids, else text. */
static int request_prompt(sw_request *r, const Spillway__GenerateRequest *req, char *err, size_t errlen)
{
    if (req->n_prompts > 0) {   /* the gateway makes each prompt its own request */
        sw_errf(err, errlen, "a batch of prompts is split by the gateway: a worker takes one prompt");
        return 400;
    }
    if (req->n_messages > 0) return request_messages(r, req, err, errlen);
    if (req->n_prompt_tokens == 0) {
        r->gen.prompt = req->prompt ? req->prompt : "";
        return 0;
    }
    r->ids = malloc(req->n_prompt_tokens * sizeof *r->ids);
    if (!r->ids) { sw_errf(err, errlen, "out of memory"); return 400; }
    for (size_t i = 0; i < req->n_prompt_tokens; i++)   /* the generator refuses ids out of its vocabulary */
        r->ids[i] = req->prompt_tokens[i] > INT32_MAX ? -1 : (int32_t)req->prompt_tokens[i];
    r->gen.prompt_ids = r->ids;
    r->gen.n_prompt_ids = req->n_prompt_tokens;
    return 0;
}

/* Sampling parameters; without has_seed a random seed. */
static int request_sampling(sw_request *r, const Spillway__SamplingParams *s, char *err, size_t errlen)
{
    sw_sampling_params *p = &r->gen.sampling;
    p->seed = s && s->has_seed ? s->seed : random_seed();
    if (!s) return 0;   /* defaults: greedy */
    p->temperature = s->temperature;
    p->top_p = s->top_p;
    p->top_k = s->top_k > INT32_MAX ? 0 : (int32_t)s->top_k;
    p->min_p = s->min_p;
    p->repetition_penalty = s->repetition_penalty;
    p->presence_penalty = s->presence_penalty;
    p->frequency_penalty = s->frequency_penalty;
    if (!s->n_logit_bias) return 0;
    /* the wire check bounded the count and the values; the generator checks the ids */
    r->bias_ids = malloc(s->n_logit_bias * sizeof *r->bias_ids);
    r->bias = malloc(s->n_logit_bias * sizeof *r->bias);
    if (!r->bias_ids || !r->bias) { sw_errf(err, errlen, "out of memory"); return 400; }
    for (size_t i = 0; i < s->n_logit_bias; i++) {
        uint32_t id = s->logit_bias[i]->token_id;
        r->bias_ids[i] = id > INT32_MAX ? INT32_MAX : (int32_t)id;
        r->bias[i] = s->logit_bias[i]->bias;
    }
    p->bias_ids = r->bias_ids;
    p->bias = r->bias;
    p->n_bias = (int32_t)s->n_logit_bias;
    return 0;
}

int sw_request_from_wire(sw_request *r, const Spillway__GenerateRequest *req, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    int rc = request_json(r, req, err, errlen);
    if (!rc) rc = request_prompt(r, req, err, errlen);
    if (!rc) rc = request_sampling(r, req->sampling, err, errlen);
    if (rc) return rc;
    sw_gen_params *p = &r->gen;
    p->max_tokens = req->max_tokens;
    p->effort = (sw_reasoning_effort)req->reasoning_effort;   /* the wire check bounded it */
    p->logprobs = req->logprobs;
    p->top_logprobs = req->top_logprobs > SW_MAX_TOP_LOGPROBS ? SW_MAX_TOP_LOGPROBS + 1 : (int)req->top_logprobs;
    p->tool_choice = req->tool_choice;
    p->prompt_logprobs = req->prompt_logprobs;
    p->echo = req->echo_prompt;
    p->one_call = req->one_call;
    p->stop = (const char *const *)req->stop;
    p->n_stop = req->n_stop;
    return 0;
}

void sw_request_free(sw_request *r)
{
    free(r->ids);
    free(r->msgs);
    free(r->calls);
    free(r->bias_ids);
    free(r->bias);
    cJSON_Delete(r->tools);
    cJSON_Delete(r->schema);
    memset(r, 0, sizeof *r);
}

sw_gen *sw_gen_from_wire(const sw_tokenizer *tok, sw_chat_template chat, const Spillway__GenerateRequest *req,
                         int n_ctx, char *err, size_t errlen)
{
    sw_request r;
    sw_gen *g = NULL;
    if (sw_request_from_wire(&r, req, err, errlen) == 0) g = sw_gen_new(tok, chat, &r.gen, n_ctx, err, errlen);
    sw_request_free(&r);
    return g;
}
