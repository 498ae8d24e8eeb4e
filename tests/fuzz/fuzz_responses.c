/* Mutation fuzz of the gateway's /v1/responses parser and its response
 * writers (gateway/responses.c), in process.
 *
 * An input is a request body. Invariants:
 *   - a rejected body gets a status and a message, and the error object
 *     built from them is valid JSON;
 *   - an accepted body yields a generate envelope that decodes, carrying the
 *     request's id and resolved model;
 *   - for an accepted body, with the last message's text as the answer, some
 *     reasoning and a call as a worker would send them: the stream is events
 *     "event: T" / "data: {...}" whose type is T, numbered 0, 1, ..., ending
 *     in response.completed; its text deltas give the text back exactly (or
 *     nothing, for blank text beside a call); the non-streaming body is JSON
 *     whose message holds the same text.
 *   fuzz_responses                   (loop settings: tests/fuzz/driver.h)
 */
#include "gateway/openai.h"
#include "gateway/req.h"
#include "gateway/responses.h"
#include "llm/text.h"
#include "proto/wire.h"

#include <cjson/cJSON.h>

#include "tests/fuzz/api_policy.h"
#include "tests/fuzz/driver.h"

static sw_policy *policy;

static bool blank(const char *s)
{
    while (sw_is_space(*s)) s++;
    return !*s;
}

/* Every event of a stream: its type line matches its data, numbered in
 * order. Returns the output_text deltas joined; *last the last type. */
static char *check_stream(const sw_sbuf *b, char *last, size_t lastlen)
{
    sw_sbuf text = {0};
    sw_sbuf_put(&text, "");
    const char *p = b->s ? b->s : "";
    for (int seq = 0; *p; seq++) {
        const char *nl = strchr(p, '\n'), *end = strstr(p, "\n\n");
        INVARIANT(!strncmp(p, "event: ", 7) && nl && end && !strncmp(nl + 1, "data: ", 6), "not an event: %.80s", p);
        if (strncmp(p, "event: ", 7) || !nl || !end || strncmp(nl + 1, "data: ", 6)) break;
        cJSON *o = cJSON_ParseWithLength(nl + 7, (size_t)(end - nl - 7));
        cJSON *ty = cJSON_GetObjectItem(o, "type"), *sn = cJSON_GetObjectItem(o, "sequence_number");
        size_t tn = (size_t)(nl - p - 7);
        INVARIANT(cJSON_IsString(ty) && strlen(ty->valuestring) == tn && !strncmp(ty->valuestring, p + 7, tn),
                  "event line and type differ: %.80s", p);
        INVARIANT(cJSON_IsNumber(sn) && sn->valueint == seq, "sequence_number is not %d", seq);
        if (cJSON_IsString(ty)) snprintf(last, lastlen, "%s", ty->valuestring);
        cJSON *d = cJSON_GetObjectItem(o, "delta");
        if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "response.output_text.delta") && cJSON_IsString(d))
            sw_sbuf_put(&text, d->valuestring);
        cJSON_Delete(o);
        p = end + 2;
    }
    return text.s;
}

/* The output item of a type in a response object's JSON. */
static cJSON *output_item(cJSON *resp, const char *type)
{
    cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(resp, "output")) {
        cJSON *t = cJSON_GetObjectItem(it, "type");
        if (cJSON_IsString(t) && !strcmp(t->valuestring, type)) return it;
    }
    return NULL;
}

static void check_body(sw_req *r, const char *text)
{
    sw_sbuf_put_n(&r->text, text, strlen(text));
    sw_sbuf_put(&r->reasoning, "R");
    char *body = sw_responses_body(r);
    cJSON *o = body ? cJSON_Parse(body) : NULL;
    INVARIANT(o, "the response body is not JSON");
    cJSON *m = output_item(o, "message");
    cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "content"), 0), "text");
    INVARIANT(blank(text) ? !m : cJSON_IsString(t) && !strcmp(t->valuestring, text), "the body's text differs");
    INVARIANT(output_item(o, "reasoning") && output_item(o, "function_call"), "an output item is missing");
    cJSON_Delete(o);
    free(body);
}

static void check_accepted(sw_req *r)
{
    char err[256] = "";
    sw_env *e = sw_wire_decode(r->gen, r->gen_len, err, sizeof err);
    INVARIANT(e && e->body_case == SPILLWAY__ENVELOPE__BODY_GENERATE, "the encoded request does not decode: %s", err);
    if (!e || e->body_case != SPILLWAY__ENVELOPE__BODY_GENERATE) { sw_wire_free(e); return; }
    const Spillway__GenerateRequest *g = e->generate;
    INVARIANT(!strcmp(g->request_id, r->id) && !strcmp(g->model, r->model) && r->chat && r->resp, "id or model lost");
    const char *text = g->n_messages ? g->messages[g->n_messages - 1]->content : "";
    sw_sbuf b = {0};
    sw_sbuf_put(&r->reasoning, "R");
    sw_sbuf_put_n(&r->text, text, strlen(text));
    if (!sw_tool_calls_add(&r->calls, "f", "{\"a\":1}")) abort();
    sw_responses_sse_take(r, &b);
    r->finished = true;
    r->usage_prompt = 3;
    r->usage_completion = 2;
    sw_responses_sse_final(r, &b);
    char last[64] = "";
    char *back = check_stream(&b, last, sizeof last);
    INVARIANT(back && !strcmp(back, blank(text) ? "" : text), "the deltas did not give the text back exactly");
    INVARIANT(!strcmp(last, "response.completed"), "the stream ends with %s", last);
    free(back);
    sw_sbuf_free(&b);
    check_body(r, text);
    sw_wire_free(e);
}

static bool check(const uint8_t *data, size_t n)
{
    sw_req *r = sw_req_new();
    snprintf(r->id, sizeof r->id, "resp_fuzz");
    char msg[512] = "";
    const char *param = NULL;
    int rc = sw_responses_parse(r, (const char *)data, n, policy, msg, sizeof msg, &param);
    if (rc) {
        check_rejected(rc, msg, param);
    } else {
        check_accepted(r);
    }
    sw_req_unref(r);
    return rc == 0;
}

#ifndef SW_LIBFUZZER
static const char *const BODIES[] = {
    "{\"model\":\"small\",\"input\":\"hi \\u00e9\\t\\u0001\\\"x\\\"\",\"instructions\":\"Be nice\\n\","
    "\"max_output_tokens\":5,\"temperature\":0.5,\"top_p\":0.9,\"seed\":-1,\"stream\":true,\"metadata\":{\"k\":\"v\"},"
    "\"user\":\"u\",\"store\":false,\"truncation\":\"disabled\",\"include\":[],"
    "\"spillway\":{\"target\":\"cpu-pool\",\"priority\":\"batch\"}}",
    /* items: messages of each role and part kind, a call and its output, reasoning */
    "{\"model\":\"llama\",\"input\":[{\"role\":\"developer\",\"content\":\"d\"},{\"type\":\"message\",\"role\":\"user\","
    "\"content\":[{\"type\":\"input_text\",\"text\":\"w?\"}]},{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]},"
    "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"get_w\",\"arguments\":\"{\\\"city\\\":\\\"P\\\"}\"},"
    "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"21\"},{\"role\":\"assistant\",\"content\":"
    "[{\"type\":\"output_text\",\"text\":\"It is 21.\",\"annotations\":[]}]},{\"role\":\"user\",\"content\":\"ok \"}],"
    "\"tools\":[{\"type\":\"function\",\"name\":\"get_w\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"}}},\"strict\":true}],\"tool_choice\":\"auto\",\"parallel_tool_calls\":false,"
    "\"reasoning\":{\"effort\":\"high\",\"summary\":\"auto\"}}",
    /* structured output, and a forced call */
    "{\"model\":\"llama\",\"input\":\"j\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"p\",\"strict\":true,"
    "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[\"x\",1]}},\"required\":[\"a\"]}},"
    "\"verbosity\":\"medium\"}}",
    "{\"model\":\"llama\",\"input\":\"t\",\"text\":{\"format\":{\"type\":\"json_object\"}},\"tools\":[{\"type\":"
    "\"function\",\"name\":\"f\"}],\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"}}",
    "{\"model\":\"llama\",\"input\":\" \\n\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":\"required\"}",
};

#endif

static bool load_policy(void)
{
    return (policy = fuzz_api_policy("fuzz_responses")) != NULL;
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
    for (int i = 0; i < N; i++) seeds[i] = (fuzz_seed){ (const uint8_t *)BODIES[i], strlen(BODIES[i]) };
    int rc = fuzz_main("fuzz_responses", seeds, N, check);
    sw_policy_unref(policy);
    return rc;
}
#endif
