/* Mutation fuzz of the gateway's OpenAI request parser and its response
 * writers (gateway/openai.c), in process.
 *
 * An input is one byte (bit 0: chat or completions) and a request body.
 * Invariants:
 *   - a rejected body gets a status and a message, and the error object
 *     built from them is valid JSON;
 *   - an accepted body yields a generate envelope that decodes, carrying the
 *     request's id and resolved model;
 *   - for an accepted body, a streamed delta carrying the prompt text (or a
 *     message's content) is one SSE event whose JSON gives that text back
 *     exactly, and the final events and the non-streaming body are valid JSON;
 *   - for a chat, a delta of that text as reasoning carries it as
 *     reasoning_content and has no content key; with an answer as well, it
 *     carries both.
 *   fuzz_openai                      (loop settings: tests/fuzz/driver.h)
 */
#include "gateway/openai.h"
#include "gateway/req.h"
#include "proto/wire.h"

#include <cjson/cJSON.h>

#include "tests/fuzz/api_policy.h"
#include "tests/fuzz/driver.h"

static sw_policy *policy;

/* Each "data: {...}\n\n" event of an SSE buffer must parse; returns the text
 * of the first event's delta (content or text), or NULL. */
static char *check_events(const sw_sbuf *b, bool chat)
{
    char *first = NULL;
    const char *p = b->s ? b->s : "";
    while (*p) {
        INVARIANT(!strncmp(p, "data: ", 6), "SSE event does not start with 'data: ': %.80s", p);
        if (strncmp(p, "data: ", 6)) break;
        const char *end = strstr(p, "\n\n");
        INVARIANT(end, "SSE event without its blank line");
        if (!end) break;
        size_t n = (size_t)(end - p - 6);
        if (!(n == 6 && !strncmp(p + 6, "[DONE]", 6))) {
            cJSON *o = cJSON_ParseWithLength(p + 6, n);
            INVARIANT(o, "SSE event is not JSON: %.*s", (int)(n < 200 ? n : 200), p + 6);
            cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
            cJSON *t = chat ? cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "delta"), "content")
                            : cJSON_GetObjectItem(c0, "text");
            if (!first && cJSON_IsString(t)) first = strdup(t->valuestring);
            cJSON_Delete(o);
        }
        p = end + 2;
    }
    return first;
}

/* A chat delta of reasoning (and an answer, when `answer`): one event whose
 * delta gives both back exactly, and no content key without an answer. */
static void check_reasoning_delta(sw_req *r, const char *text, bool answer)
{
    sw_sbuf b = { 0 };
    sw_openai_sse_delta(r, &b, answer ? "A" : NULL, answer ? 1 : 0, text, strlen(text), false);
    const char *end = b.s ? strstr(b.s, "\n\n") : NULL;
    INVARIANT(end && !strncmp(b.s, "data: ", 6) && end[2] == 0, "a reasoning delta is one event");
    cJSON *o = end ? cJSON_ParseWithLength(b.s + 6, (size_t)(end - b.s - 6)) : NULL;
    cJSON *d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "delta");
    cJSON *rc = cJSON_GetObjectItem(d, "reasoning_content"), *c = cJSON_GetObjectItem(d, "content");
    INVARIANT(cJSON_IsString(rc) && !strcmp(rc->valuestring, text), "reasoning_content did not come back exactly");
    INVARIANT(answer ? cJSON_IsString(c) && !strcmp(c->valuestring, "A") : c == NULL,
              "content %s", answer ? "lost" : "present in a reasoning-only delta");
    cJSON_Delete(o);
    sw_sbuf_free(&b);
}

static void check_accepted(sw_req *r, bool chat)
{
    char err[256] = "";
    sw_env *e = sw_wire_decode(r->gen, r->gen_len, err, sizeof err);
    INVARIANT(e && e->body_case == SPILLWAY__ENVELOPE__BODY_GENERATE, "the encoded request does not decode: %s", err);
    if (!e || e->body_case != SPILLWAY__ENVELOPE__BODY_GENERATE) { sw_wire_free(e); return; }
    const Spillway__GenerateRequest *g = e->generate;
    INVARIANT(!strcmp(g->request_id, r->id) && !strcmp(g->model, r->model), "id or model lost");
    /* Text the way a worker would send it back: valid UTF-8 (the parser
     * checked the body), with every character JSON must escape. */
    const char *text = chat ? (g->n_messages ? g->messages[g->n_messages - 1]->content : "") : g->prompt;
    sw_sbuf b = { 0 };
    sw_openai_sse_delta(r, &b, text, strlen(text), NULL, 0, true);
    char *back = check_events(&b, chat);
    INVARIANT(back && !strcmp(back, text), "the delta's text did not come back exactly");
    free(back);
    if (chat && *text) {
        check_reasoning_delta(r, text, false);
        check_reasoning_delta(r, text, true);
    }
    sw_sbuf_free(&b);
    memset(&b, 0, sizeof b);
    r->finished = true;
    r->usage_prompt = 3;
    r->usage_completion = 2;
    sw_openai_sse_final(r, &b);
    free(check_events(&b, chat));
    sw_sbuf_free(&b);
    sw_sbuf_put_n(&r->text, text, strlen(text));
    char *body = sw_openai_response(r);
    cJSON *o = body ? cJSON_Parse(body) : NULL;
    INVARIANT(o, "the response body is not JSON");
    cJSON_Delete(o);
    free(body);
    sw_wire_free(e);
}

static bool check(const uint8_t *data, size_t n)
{
    if (n == 0) return false;
    bool chat = data[0] & 1;
    sw_req *r = sw_req_new();
    snprintf(r->id, sizeof r->id, "%s-fuzz", chat ? "chatcmpl" : "cmpl");
    r->chat = chat;
    char msg[512] = "";
    const char *param = NULL;
    int rc = sw_openai_parse(r, (const char *)data + 1, n - 1, chat, policy, msg, sizeof msg, &param);
    if (rc) {
        check_rejected(rc, msg, param);
    } else {
        check_accepted(r, chat);
    }
    sw_req_unref(r);
    return rc == 0;
}

#ifndef SW_LIBFUZZER
static const char *const BODIES[] = {
    "\x01{\"model\":\"small\",\"messages\":[{\"role\":\"system\",\"content\":\"Be \\\"nice\\\"\\n\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi \\u00e9\\t\\u0001\"}]}],\"max_tokens\":5,"
    "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"stop\":[\"x\",\"y\"],\"seed\":-1,"
    "\"spillway\":{\"target\":\"cpu-pool\",\"priority\":\"batch\",\"max_queue_ms\":5,\"quantization\":\"q4_k_m\"}}",
    "\x00{\"model\":\"llama\",\"prompt\":[1,2,3],\"max_tokens\":3,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":4,"
    "\"min_p\":0.1,\"repetition_penalty\":1.1,\"n\":1,\"echo\":true,\"stop\":\"z\"}",
    "\x00{\"model\":\"llama\",\"prompt\":[\"hello \\\\ \\u2603 \\ud83d\\ude00\"],\"seed\":18446744073709551615}",
    "\x01{\"model\":\"llama\",\"messages\":[{\"role\":\"user\",\"content\":null}],\"max_completion_tokens\":7}",
    /* tools, calls and results, reasoning effort, logprobs and the sampling fields */
    "\x01{\"model\":\"llama\",\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},{\"role\":\"assistant\","
    "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_w\","
    "\"arguments\":\"{\\\"city\\\": \\\"P\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"21\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_w\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"}}}}}],\"tool_choice\":\"auto\",\"reasoning_effort\":\"high\","
    "\"logprobs\":true,\"top_logprobs\":3,\"presence_penalty\":0.5,\"frequency_penalty\":-1,"
    "\"logit_bias\":{\"5\":-100,\"17\":2.5},\"response_format\":{\"type\":\"text\"}}",
    "\x00{\"model\":\"llama\",\"prompt\":\"x\",\"logprobs\":2,\"logit_bias\":{\"0\":1}}",
    /* structured output, and a forced call */
    "\x01{\"model\":\"llama\",\"messages\":[{\"role\":\"user\",\"content\":\"j\"}],\"response_format\":"
    "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"strict\":true,\"schema\":{\"type\":\"object\","
    "\"properties\":{\"a\":{\"enum\":[\"x\",1]},\"b\":{\"$ref\":\"#/$defs/b\"}},\"required\":[\"a\"],"
    "\"$defs\":{\"b\":{\"type\":\"array\",\"items\":{\"type\":[\"integer\",\"null\"]},\"maxItems\":3}}}}}}",
    "\x00{\"model\":\"llama\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}",
    "\x00{\"model\":\"llama\",\"prompt\":\"score me\",\"echo\":true,\"logprobs\":1,\"max_tokens\":1}",
    "\x01{\"model\":\"llama\",\"messages\":[{\"role\":\"user\",\"content\":\"t\"}],\"tools\":[{\"type\":"
    "\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}",
};

#endif

static bool load_policy(void)
{
    return (policy = fuzz_api_policy("fuzz_openai")) != NULL;
}

#ifdef SW_LIBFUZZER
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    if (!load_policy()) abort();
    return 0;
}
#else
int main(void)
{
    if (!load_policy()) return 2;
    enum { N = sizeof BODIES / sizeof BODIES[0] };
    fuzz_seed seeds[N];
    for (int i = 0; i < N; i++)   /* the flag byte may be NUL: the body follows it */
        seeds[i] = (fuzz_seed){ (const uint8_t *)BODIES[i], 1 + strlen(BODIES[i] + 1) };
    int rc = fuzz_main("fuzz_openai", seeds, N, check);
    sw_policy_unref(policy);
    return rc;
}
#endif
