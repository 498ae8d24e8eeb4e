/* OpenAI request parsing/validation and response shapes.
 *
 * Parsing happens on the HTTP thread: the body becomes an encoded
 * Envelope{GenerateRequest} right away, so the broker only forwards bytes.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <math.h>
#include <time.h>
#include <cjson/cJSON.h>
#include "gateway/choices.h"
#include "gateway/front.h"
#include "gateway/openai.h"
#include "llm/generate.h"
#include "llm/json_schema.h"
#include "llm/limits.h"   /* every request limit: the gateway refuses what the wire and workers would */
#include "llm/text.h"

#define DEFAULT_MAX_TOKENS_COMPLETION 16
#define DEFAULT_MAX_TOKENS_CHAT 256

char *sw_openai_error_json(const char *message, const char *type, const char *param, const char *code)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type ? type : "invalid_request_error");
    if (param) cJSON_AddStringToObject(e, "param", param); else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code); else cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

const char *sw_finish_name(int f)
{
    switch (f) {
    case SPILLWAY__FINISH_REASON__FINISH_STOP: return "stop";
    case SPILLWAY__FINISH_REASON__FINISH_LENGTH: return "length";
    case SPILLWAY__FINISH_REASON__FINISH_CANCELLED: return "cancelled";
    case SPILLWAY__FINISH_REASON__FINISH_ERROR: return "error";
    default: return NULL;
    }
}

/* True if every string anywhere in the JSON value is strict UTF-8. Protobuf
 * strings must be UTF-8 and the workers reject frames that are not, so such
 * text is refused here with a 400 instead. */
static bool json_utf8_ok(const cJSON *v)
{
    for (; v; v = v->next) {
        if (v->string && !sw_utf8_valid(v->string)) return false;
        if (cJSON_IsString(v) && v->valuestring && !sw_utf8_valid(v->valuestring)) return false;
        if (v->child && !json_utf8_ok(v->child)) return false;
    }
    return true;
}

/* ---- parsing helpers: each returns 0 or fills msg/param and returns 400 --- */
typedef struct { char *msg; size_t msglen; const char **param; } perr;

static int bad(perr *e, const char *param, const char *fmt)
{
    snprintf(e->msg, e->msglen, fmt, param);
    *e->param = param;
    return 400;
}

/* As bad(), with the message formatted from its arguments (the limits). */
__attribute__((format(printf, 3, 4))) static int badf(perr *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, e->msglen, fmt, ap);
    va_end(ap);
    *e->param = param;
    return 400;
}

static int get_number(cJSON *o, const char *k, double lo, double hi, double *out, perr *e)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return bad(e, k, "'%s' must be a number");
    if (!isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return bad(e, k, "'%s' is out of range");
    *out = v->valuedouble;
    return 0;
}

static int get_int(cJSON *o, const char *k, double lo, double hi, double *out, perr *e)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return bad(e, k, "'%s' must be an integer");
    if (v->valuedouble < lo || v->valuedouble > hi) return bad(e, k, "'%s' is out of range");
    *out = v->valuedouble;
    return 0;
}

static int get_bool(cJSON *o, const char *k, bool *out, perr *e)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return bad(e, k, "'%s' must be a boolean");
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_string(cJSON *o, const char *k, const char **out, perr *e)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return bad(e, k, "'%s' must be a string");
    *out = v->valuestring;
    return 0;
}

/* Chat message content: a string, or an array of {type:"text", text}. */
static char *content_text(cJSON *c)
{
    if (cJSON_IsString(c)) return strdup(c->valuestring);
    if (!cJSON_IsArray(c)) return NULL;
    sw_sbuf b = {0};
    sw_sbuf_put(&b, "");
    cJSON *part;
    cJSON_ArrayForEach(part, c) {
        cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
        cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
        if (!cJSON_IsObject(part) || !cJSON_IsString(t) || (ty && !cJSON_IsString(ty))) {
            sw_sbuf_free(&b);
            return NULL;
        }
        sw_sbuf_put(&b, t->valuestring);
    }
    if (b.oom) sw_sbuf_free(&b);   /* NULL: refused with a 400 rather than cut */
    return b.s;
}

static void free_gen(Spillway__GenerateRequest *g)
{
    for (size_t i = 0; i < g->n_messages; i++) {
        Spillway__ChatMessage *m = g->messages[i];
        free(m->role);
        free(m->content);
        for (size_t k = 0; k < m->n_tool_calls; k++) {
            free(m->tool_calls[k]->name);
            free(m->tool_calls[k]->arguments);
            free(m->tool_calls[k]);
        }
        free(m->tool_calls);
        free(m);
    }
    free(g->messages);
    if (g->tools_json != protobuf_c_empty_string) free(g->tools_json);
    if (g->json_schema != protobuf_c_empty_string) free(g->json_schema);
    if (g->tool_choice != protobuf_c_empty_string) free(g->tool_choice);
    free(g->stop);
    for (size_t i = 0; g->sampling && i < g->sampling->n_logit_bias; i++) free(g->sampling->logit_bias[i]);
    if (g->sampling) free(g->sampling->logit_bias);
}

/* OpenAI's logit_bias: {"token id": bias, ...}, biases within
 * +-SW_MAX_LOGIT_BIAS_VALUE, added to
 * the logits before sampling (the worker checks the ids). */
static int request_logit_bias(cJSON *o, Spillway__SamplingParams *sp, perr *e)
{
    cJSON *lb = cJSON_GetObjectItemCaseSensitive(o, "logit_bias");
    if (!lb || cJSON_IsNull(lb)) return 0;
    if (!cJSON_IsObject(lb) || cJSON_GetArraySize(lb) > SW_MAX_LOGIT_BIAS)
        return badf(e, "logit_bias", "'logit_bias' must be an object of up to %d token ids and biases",
                    SW_MAX_LOGIT_BIAS);
    int n = cJSON_GetArraySize(lb);
    if (n == 0) return 0;
    sp->logit_bias = calloc((size_t)n, sizeof *sp->logit_bias);
    if (!sp->logit_bias) return bad(e, "logit_bias", "'%s': out of memory");
    cJSON *it;
    cJSON_ArrayForEach(it, lb) {
        char *end = NULL;
        unsigned long id = strtoul(it->string ? it->string : "", &end, 10);
        if (!it->string || !*it->string || *end || it->string[0] == '-' || id > UINT32_MAX)
            return bad(e, "logit_bias", "the keys of '%s' must be token ids");
        if (!cJSON_IsNumber(it) || !(fabs(it->valuedouble) <= SW_MAX_LOGIT_BIAS_VALUE))
            return badf(e, "logit_bias", "the values of 'logit_bias' must be numbers from -%d to %d",
                        SW_MAX_LOGIT_BIAS_VALUE, SW_MAX_LOGIT_BIAS_VALUE);
        Spillway__LogitBias *b = malloc(sizeof *b);
        if (!b) return bad(e, "logit_bias", "'%s': out of memory");
        spillway__logit_bias__init(b);
        b->token_id = (uint32_t)id;
        b->bias = (float)it->valuedouble;
        sp->logit_bias[sp->n_logit_bias++] = b;
    }
    return 0;
}

/* ---- tools ---- */

/* An assistant message's tool_calls (OpenAI's form: {id, type, function:
 * {name, arguments}}, arguments a JSON string) onto the wire message. A
 * tool message's tool_call_id is not needed: results answer the calls
 * before them in order, as the models' own templates take them. */
static int message_tools(cJSON *it, Spillway__ChatMessage *cm, perr *e)
{
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(it, "tool_calls");
    if (!tc || cJSON_IsNull(tc)) return 0;
    if (!cJSON_IsArray(tc) || cJSON_GetArraySize(tc) > SW_MAX_TOOL_CALLS)
        return badf(e, "messages", "a message's 'tool_calls' in 'messages' must be an array of up to %d calls",
                    SW_MAX_TOOL_CALLS);
    cm->tool_calls = calloc((size_t)cJSON_GetArraySize(tc) + 1, sizeof *cm->tool_calls);
    cJSON *c;
    cJSON_ArrayForEach(c, tc) {
        cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (!cJSON_IsString(name) || !sw_tool_name_valid(name->valuestring))
            return badf(e, "messages", "each tool call in 'messages' needs a function 'name' of 1-%d letters, "
                        "digits, _, - or .", SW_MAX_TOOL_NAME);
        if (args && !cJSON_IsNull(args) && !cJSON_IsString(args) && !cJSON_IsObject(args))
            return bad(e, "messages", "a tool call's 'arguments' in '%s' must be a JSON string");
        Spillway__ToolCall *w = malloc(sizeof *w);
        spillway__tool_call__init(w);
        w->name = strdup(name->valuestring);
        w->arguments = cJSON_IsString(args) ? strdup(args->valuestring)
                       : cJSON_IsObject(args) ? cJSON_PrintUnformatted(args) : strdup("{}");
        cm->tool_calls[cm->n_tool_calls++] = w;
    }
    return 0;
}

/* tools (function definitions) and tool_choice. The worker renders the
 * definitions in the model's own format; "none" leaves them out;
 * "required" or a named function makes the worker's constrained decoding
 * write a call (llm/gen_tools.c, "forced calls"). */
static int request_tools(cJSON *o, Spillway__GenerateRequest *g, perr *e)
{
    cJSON *tools = cJSON_GetObjectItemCaseSensitive(o, "tools");
    cJSON *choice = cJSON_GetObjectItemCaseSensitive(o, "tool_choice");
    bool says_call = cJSON_IsObject(choice) || (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required"));
    if (!tools || cJSON_IsNull(tools) || cJSON_GetArraySize(tools) == 0)
        if (says_call) return bad(e, "tool_choice", "'%s' forces a call, but no tools were given");
    if (!tools || cJSON_IsNull(tools)) return 0;
    if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) > SW_MAX_TOOLS)
        return badf(e, "tools", "'tools' must be an array of up to %d tools", SW_MAX_TOOLS);
    cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsObject(f))
            return bad(e, "tools", "each entry of '%s' must be {\"type\": \"function\", \"function\": {...}}");
        if (!cJSON_IsString(name) || !sw_tool_name_valid(name->valuestring))
            return badf(e, "tools", "each function in 'tools' needs a 'name' of 1-%d letters, digits, _, - or .",
                        SW_MAX_TOOL_NAME);
        if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
            return bad(e, "tools", "a function's 'parameters' in '%s' must be a JSON Schema object");
    }
    /* tool_choice: "auto", "none", "required", or {"type": "function",
     * "function": {"name": N}} naming one of the tools */
    const char *forced = NULL;
    if (choice && !cJSON_IsNull(choice)) {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(choice, "function"), "name");
        cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
        if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) return 0;
        if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required")) forced = "required";
        else if (cJSON_IsObject(choice) && cJSON_IsString(type) && !strcmp(type->valuestring, "function") &&
                 cJSON_IsString(fn)) {
            forced = fn->valuestring;
            bool found = false;
            cJSON_ArrayForEach(t, tools) {
                cJSON *nm = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
                found |= !strcmp(nm->valuestring, forced);
            }
            if (!found) return bad(e, "tool_choice", "'%s' names a function that is not among the tools");
        } else if (!cJSON_IsString(choice) || strcmp(choice->valuestring, "auto"))
            return bad(e, "tool_choice", "'%s' must be \"auto\", \"none\", \"required\" or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    if (cJSON_GetArraySize(tools) == 0) return 0;
    if (forced && !sw_gen_check_forced(tools, forced, e->msg, e->msglen)) {
        *e->param = "tools";
        return 400;
    }
    if (forced && !(g->tool_choice = strdup(forced))) return bad(e, "tool_choice", "'%s' could not be encoded");
    bool parallel = true;
    int rc = get_bool(o, "parallel_tool_calls", &parallel, e);
    if (rc) return rc;
    g->one_call = !parallel;
    g->tools_json = cJSON_PrintUnformatted(tools);
    if (!g->tools_json) return bad(e, "tools", "'%s' could not be encoded");
    return 0;
}

/* response_format: "text"; "json_object" (any JSON object); "json_schema"
 * with {"name", "schema", "strict"}. The schema is compiled here as the
 * worker will compile it, so that one it cannot enforce is a 400 now, not a
 * failed stream later. strict is accepted either way: the output always
 * keeps to the schema. */
static int request_format(cJSON *o, Spillway__GenerateRequest *g, perr *e)
{
    cJSON *rf = cJSON_GetObjectItemCaseSensitive(o, "response_format");
    if (!rf || cJSON_IsNull(rf)) return 0;
    cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
        return bad(e, "response_format", "'%s' must be an object with a 'type'");
    if (!strcmp(type->valuestring, "text")) return 0;
    if (!strcmp(type->valuestring, "json_object")) {
        g->json_schema = strdup("{\"type\":\"object\"}");
        return g->json_schema ? 0 : bad(e, "response_format", "'%s' could not be encoded");
    }
    if (strcmp(type->valuestring, "json_schema"))
        return bad(e, "response_format", "'%s' type must be \"text\", \"json_object\" or \"json_schema\"");
    cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js)) return bad(e, "response_format", "'%s' of type json_schema needs a 'json_schema' object");
    cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (name && (!cJSON_IsString(name) || !sw_tool_name_valid(name->valuestring)))
        return badf(e, "response_format", "'response_format'.json_schema.name must be 1-%d letters, digits, "
                    "_, - or .", SW_MAX_TOOL_NAME);
    if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
        return bad(e, "response_format", "'%s'.json_schema.strict must be a boolean");
    if (schema && !cJSON_IsObject(schema) && !cJSON_IsTrue(schema))
        return bad(e, "response_format", "'%s'.json_schema.schema must be a JSON Schema object");
    char why[256];
    cJSON *any = schema ? NULL : cJSON_CreateTrue();   /* no schema: any JSON value */
    const cJSON *use = schema ? schema : any;
    if (!sw_js_check(use, why, sizeof why)) {
        cJSON_Delete(any);
        snprintf(e->msg, e->msglen, "'response_format'.json_schema.schema: %s", why);
        *e->param = "response_format";
        return 400;
    }
    g->json_schema = cJSON_PrintUnformatted(use);
    cJSON_Delete(any);
    if (!g->json_schema) return bad(e, "response_format", "'%s' could not be encoded");
    if (strlen(g->json_schema) > SW_MAX_SCHEMA_LEN)
        return badf(e, "response_format", "'response_format'.json_schema.schema is longer than %d bytes",
                    SW_MAX_SCHEMA_LEN);
    return 0;
}

/* Log probabilities of the generated tokens: chat's logprobs (bool) and
 * top_logprobs (0-20, with logprobs), completions' logprobs (the number of
 * alternatives, 0-20; OpenAI allows 5). With echo, the prompt's own too
 * (the CPU worker scores every prompt position); streamed, they come
 * ahead of the first token's. */
static int request_logprobs(cJSON *o, bool chat, bool echo, bool stream, Spillway__GenerateRequest *g, sw_req *r,
                            perr *e)
{
    int rc;
    double top = 0;
    if (chat) {
        bool lp = false;
        if ((rc = get_bool(o, "logprobs", &lp, e))) return rc;
        if ((rc = get_int(o, "top_logprobs", 0, SW_MAX_TOP_LOGPROBS, &top, e))) return rc;
        if (top > 0 && !lp) return bad(e, "top_logprobs", "'%s' needs \"logprobs\": true");
        r->logprobs = lp;
    } else {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
        if ((rc = get_int(o, "logprobs", 0, SW_MAX_TOP_LOGPROBS, &top, e))) return rc;
        r->logprobs = v && !cJSON_IsNull(v);
        g->prompt_logprobs = r->logprobs && echo;
    }
    g->logprobs = r->logprobs;
    g->top_logprobs = (uint32_t)top;
    return 0;
}

/* The model asked for, as a valid id; alias resolution is the front door's. */
static int request_model(cJSON *o, Spillway__GenerateRequest *g, perr *e)
{
    const char *model = NULL;
    int rc = get_string(o, "model", &model, e);
    if (rc) return rc;
    if (!model || !*model) return bad(e, "model", "'%s' is required");
    if (!sw_id_valid(model, SW_MAX_ID_LEN))
        return badf(e, "model", "'model' must be at most %d printable ASCII characters without spaces",
                    SW_MAX_ID_LEN);
    g->model = (char *)model;   /* the JSON tree's: not freed with g */
    return 0;
}

/* One chat message onto the wire: role, content (text or text parts) and
 * an assistant's tool calls. */
static int request_message(cJSON *it, Spillway__GenerateRequest *g, perr *e)
{
    cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
    cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
    if (!cJSON_IsObject(it) || !cJSON_IsString(role))
        return bad(e, "messages", "each entry of '%s' needs a string 'role'");
    if (!sw_id_valid(role->valuestring, SW_MAX_ROLE_LEN))
        return badf(e, "messages", "a 'role' in 'messages' must be a word of up to %d characters like \"user\"",
                    SW_MAX_ROLE_LEN);
    char *text = content && !cJSON_IsNull(content) ? content_text(content) : strdup("");
    if (!text) return bad(e, "messages", "message 'content' in '%s' must be a string or text parts");
    Spillway__ChatMessage *cm = malloc(sizeof *cm);
    char *rname = strdup(role->valuestring);
    if (!cm || !rname) {
        free(cm);
        free(rname);
        free(text);
        return bad(e, "messages", "'%s': out of memory");
    }
    spillway__chat_message__init(cm);
    cm->role = rname;
    cm->content = text;
    g->messages[g->n_messages++] = cm;   /* now g's to free, whatever follows */
    return message_tools(it, cm, e);
}

/* Chat: messages, a non-empty array of at most SW_MAX_MESSAGES. */
static int request_messages(cJSON *o, Spillway__GenerateRequest *g, perr *e)
{
    cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!m) return bad(e, "messages", "'%s' is required");
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0) return bad(e, "messages", "'%s' must be a non-empty array");
    int n = cJSON_GetArraySize(m);
    if (n > SW_MAX_MESSAGES) return badf(e, "messages", "'messages' has more than %d entries", SW_MAX_MESSAGES);
    if (!(g->messages = calloc((size_t)n, sizeof *g->messages))) return bad(e, "messages", "'%s': out of memory");
    cJSON *it;
    cJSON_ArrayForEach(it, m) {
        int rc = request_message(it, g, e);
        if (rc) return rc;
    }
    return 0;
}

/* What a request asks for beyond one GenerateRequest: its prompts (a
 * completions request may batch them) and samples per prompt (`n`). */
typedef struct {
    sw_prompt *prompts;   /* completions; NULL for chat */
    size_t n_prompts;
    unsigned n;
} asked;

static void asked_free(asked *a)
{
    for (size_t i = 0; i < a->n_prompts; i++) free((uint32_t *)a->prompts[i].ids);
    free(a->prompts);
}

/* One prompt of token ids: a non-empty array of them. */
static int prompt_ids(cJSON *arr, sw_prompt *pr, perr *e)
{
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return bad(e, "prompt", "'%s' must not contain an empty array of token ids");
    if ((unsigned)n > SW_MAX_TOKENS_PER_REQUEST) return bad(e, "prompt", "'%s' is too long");
    uint32_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids) return bad(e, "prompt", "'%s': out of memory");
    pr->ids = ids;
    cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 4294967295.0 ||
            it->valuedouble != floor(it->valuedouble))
            return bad(e, "prompt", "'%s' token ids must be integers from 0 to 2^32-1");
        ids[pr->n_ids++] = (uint32_t)it->valuedouble;
    }
    return 0;
}

/* One entry of a batch of prompts: a non-empty string, or token ids. */
static int prompt_entry(cJSON *it, bool ids, sw_prompt *pr, perr *e)
{
    if (ids != cJSON_IsArray(it) || (!ids && !cJSON_IsString(it)))
        return bad(e, "prompt", "'%s' must not mix strings and arrays of token ids");
    if (ids) return prompt_ids(it, pr, e);
    if (!*it->valuestring) return bad(e, "prompt", "'%s' must not contain an empty string");
    pr->text = it->valuestring;   /* the JSON tree's */
    return 0;
}

/* Completions: prompt, a string or token ids, or a batch of prompts (an
 * array of strings, or of token-id arrays), at most SW_MAX_CHOICES. g gets
 * the first. */
static int request_prompt(cJSON *o, Spillway__GenerateRequest *g, asked *a, perr *e)
{
    cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (!pr) return bad(e, "prompt", "'%s' is required");
    if (!cJSON_IsString(pr) && !cJSON_IsArray(pr))
        return bad(e, "prompt", "'%s' must be a string, an array of token ids, or an array of either prompts");
    if (cJSON_IsString(pr) ? !*pr->valuestring : cJSON_GetArraySize(pr) == 0)
        return bad(e, "prompt", "'%s' must not be empty");
    cJSON *first = cJSON_IsArray(pr) ? pr->child : NULL;
    bool batch = first && (cJSON_IsString(first) || cJSON_IsArray(first));
    int n = batch ? cJSON_GetArraySize(pr) : 1;
    if (n > SW_MAX_CHOICES)
        return badf(e, "prompt", "'prompt' holds more than %d prompts", SW_MAX_CHOICES);
    if (!(a->prompts = calloc((size_t)n, sizeof *a->prompts))) return bad(e, "prompt", "'%s': out of memory");
    int rc = 0;
    if (!batch && cJSON_IsString(pr)) a->prompts[a->n_prompts++].text = pr->valuestring;
    else if (!batch) rc = prompt_ids(pr, &a->prompts[a->n_prompts++], e);
    for (cJSON *it = batch ? first : NULL; it && !rc; it = it->next)
        rc = prompt_entry(it, cJSON_IsArray(first), &a->prompts[a->n_prompts++], e);
    if (rc) return rc;
    if (a->prompts[0].text) g->prompt = (char *)a->prompts[0].text;
    g->prompt_tokens = (uint32_t *)a->prompts[0].ids;   /* a's: not freed with g */
    g->n_prompt_tokens = a->prompts[0].n_ids;
    return 0;
}

/* Any 64-bit seed, signed or not (JSON numbers are doubles: exact up to
 * 2^53; 2^64-1 arrives as 2^64 and is taken as 2^64-1). Negative seeds
 * wrap as int64 (-1 is 2^64-1); seeds past 2^63 convert directly: through
 * int64 they would overflow (undefined). */
static int request_seed(cJSON *o, Spillway__SamplingParams *sp, perr *e)
{
    double seed = -1;
    int rc = get_int(o, "seed", -0x1p63, 0x1p64, &seed, e);
    if (rc) return rc;
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "seed"))) {
        sp->has_seed = true;
        sp->seed = seed < 0 ? (uint64_t)(int64_t)seed : seed >= 0x1p64 ? UINT64_MAX : (uint64_t)seed;
    }
    return 0;
}

/* max_tokens and the sampling parameters. The HTTP ranges are OpenAI's
 * (temperature 0..2), within the wire's of llm/limits.h. */
static int request_sampling(cJSON *o, bool chat, Spillway__GenerateRequest *g, asked *a, perr *e)
{
    Spillway__SamplingParams *sp = g->sampling;
    double max_tokens = chat ? DEFAULT_MAX_TOKENS_CHAT : DEFAULT_MAX_TOKENS_COMPLETION;
    double temp = 1.0, top_p = 1.0, top_k = 0, min_p = 0, rep = 1.0, n = 1, presence = 0, frequency = 0;
    int rc;
    if ((rc = get_int(o, "max_tokens", 1, SW_MAX_TOKENS_PER_REQUEST, &max_tokens, e))) return rc;
    if (chat && (rc = get_int(o, "max_completion_tokens", 1, SW_MAX_TOKENS_PER_REQUEST, &max_tokens, e))) return rc;
    if ((rc = get_number(o, "temperature", 0, 2, &temp, e))) return rc;
    if ((rc = get_number(o, "top_p", 0, 1, &top_p, e))) return rc;
    if ((rc = get_int(o, "top_k", 0, 1 << 20, &top_k, e))) return rc;
    if ((rc = get_number(o, "min_p", 0, 1, &min_p, e))) return rc;
    if ((rc = get_number(o, "repetition_penalty", 0, 10, &rep, e))) return rc;
    if ((rc = get_number(o, "presence_penalty", -SW_MAX_PENALTY, SW_MAX_PENALTY, &presence, e))) return rc;
    if ((rc = get_number(o, "frequency_penalty", -SW_MAX_PENALTY, SW_MAX_PENALTY, &frequency, e))) return rc;
    if ((rc = request_logit_bias(o, sp, e))) return rc;
    if ((rc = get_int(o, "n", 1, SW_MAX_CHOICES, &n, e))) return rc;
    if (n * (double)(a->n_prompts ? a->n_prompts : 1) > SW_MAX_CHOICES)
        return badf(e, "n", "'n' times the prompts is more than %d choices", SW_MAX_CHOICES);
    if ((rc = request_seed(o, sp, e))) return rc;
    a->n = (unsigned)n;
    g->max_tokens = (uint32_t)max_tokens;
    sp->temperature = (float)temp;
    sp->top_p = (float)top_p;
    sp->top_k = (uint32_t)top_k;
    sp->min_p = (float)min_p;
    sp->repetition_penalty = (float)rep;
    sp->presence_penalty = (float)presence;
    sp->frequency_penalty = (float)frequency;
    return 0;
}

/* One stop string: at most SW_MAX_STOP_LEN bytes; an empty one stops nothing
 * and is left out. */
static int add_stop(const char *s, Spillway__GenerateRequest *g, perr *e)
{
    if (strlen(s) > SW_MAX_STOP_LEN)
        return badf(e, "stop", "'stop' strings must be at most %d bytes", SW_MAX_STOP_LEN);
    if (*s) g->stop[g->n_stop++] = (char *)s;   /* the JSON tree's */
    return 0;
}

/* stop: a string, or an array of up to SW_MAX_STOPS strings. */
static int request_stop(cJSON *o, Spillway__GenerateRequest *g, perr *e)
{
    cJSON *stop = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (!stop || cJSON_IsNull(stop)) return 0;
    if (!cJSON_IsString(stop) && !(cJSON_IsArray(stop) && cJSON_GetArraySize(stop) <= SW_MAX_STOPS))
        return badf(e, "stop", "'stop' must be a string or an array of up to %d strings", SW_MAX_STOPS);
    if (!(g->stop = calloc(SW_MAX_STOPS, sizeof *g->stop))) return bad(e, "stop", "'%s': out of memory");
    if (cJSON_IsString(stop)) return add_stop(stop->valuestring, g, e);
    cJSON *it;
    cJSON_ArrayForEach(it, stop) {
        if (!cJSON_IsString(it)) return bad(e, "stop", "'%s' entries must be strings");
        int rc = add_stop(it->valuestring, g, e);
        if (rc) return rc;
    }
    return 0;
}

/* OpenAI's reasoning_effort: how long a reasoning model thinks (gpt-oss
 * takes it into its system message; other models ignore it). */
static int request_effort(cJSON *o, Spillway__GenerateRequest *g, perr *e)
{
    const char *effort = NULL;
    int rc = get_string(o, "reasoning_effort", &effort, e);
    if (rc || !effort) return rc;
    if (!strcmp(effort, "low")) g->reasoning_effort = SPILLWAY__REASONING_EFFORT__REASONING_EFFORT_LOW;
    else if (!strcmp(effort, "medium")) g->reasoning_effort = SPILLWAY__REASONING_EFFORT__REASONING_EFFORT_MEDIUM;
    else if (!strcmp(effort, "high")) g->reasoning_effort = SPILLWAY__REASONING_EFFORT__REASONING_EFFORT_HIGH;
    else return bad(e, "reasoning_effort", "'%s' must be \"low\", \"medium\" or \"high\"");
    return 0;
}

/* How the answer comes back: stream, stream_options, echo, logprobs. */
static int request_output(cJSON *o, bool chat, Spillway__GenerateRequest *g, sw_req *r, perr *e)
{
    bool stream = false, echo = false, usage = false;
    int rc;
    if ((rc = get_bool(o, "stream", &stream, e))) return rc;
    if (!chat && (rc = get_bool(o, "echo", &echo, e))) return rc;
    if ((rc = request_logprobs(o, chat, echo, stream, g, r, e))) return rc;
    cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return bad(e, "stream_options", "'%s' must be an object");
        if ((rc = get_bool(so, "include_usage", &usage, e))) return rc;
    }
    r->stream = stream;
    r->include_usage = stream && usage;
    g->echo_prompt = echo;
    return 0;
}

/* Per-request directives: the `spillway` object (headers were applied by
 * the caller already; the body wins when both are given). */
static int request_directives(cJSON *o, sw_req *r, perr *e)
{
    cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "spillway");
    if (!d || cJSON_IsNull(d)) return 0;
    if (!cJSON_IsObject(d)) return bad(e, "spillway", "'%s' must be an object");
    const char *t = NULL, *q = NULL, *pc = NULL;
    double mq = -1;
    int rc;
    if ((rc = get_string(d, "target", &t, e))) return rc;
    if ((rc = get_string(d, "quantization", &q, e))) return rc;
    if ((rc = get_string(d, "priority", &pc, e))) return rc;
    if ((rc = get_int(d, "max_queue_ms", 0, SW_MAX_QUEUE_MS, &mq, e))) return rc;
    if (pc && (r->klass = sw_priority_parse(pc)) < 0)
        return bad(e, "spillway.priority", "'%s' must be \"interactive\" or \"batch\"");
    if (t) { free(r->want_target); r->want_target = strdup(t); }
    if (q) { free(r->want_quant); r->want_quant = strdup(q); }
    if (mq >= 0) r->max_queue_ms = (int64_t)mq;
    return 0;
}

/* ---- the raw body: nesting depth and NUL characters ----------------------
 * Both are read off the text itself: depth before cJSON recurses into it,
 * and NULs because cJSON decodes "\u0000" (or keeps a raw 0 byte) into a
 * C string that then ends there, so the text after it would be silently
 * dropped. Every string in a body is carried as a C string (onto the wire,
 * into a template, a schema or a stop), so a NUL anywhere is refused, with
 * the path of the string that holds it as `param`. */
typedef struct {
    bool obj;              /* an object (keys) or an array (indices) */
    bool want_key;         /* object: the next string is a key */
    size_t index;          /* array: the element being read */
    const char *key;       /* object: the current key, raw text */
    size_t key_len;
} jlevel;

typedef struct {
    jlevel lv[SW_MAX_JSON_DEPTH];
    int depth;
    bool too_deep, nul;
    char path[256];        /* where the first NUL is, e.g. messages[0].content */
} jscan;

/* The string whose opening quote is at s[i]: returns the index just past
 * its closing quote (len if unterminated), *nul set if it holds a NUL.
 * Every escape is skipped whole, so "\\u0000" (an escaped backslash, then
 * text) is not taken for one. */
static size_t scan_string(const char *s, size_t i, size_t len, bool *nul)
{
    for (i++; i < len && s[i] != '"'; i++) {
        if (s[i] == '\0') *nul = true;
        if (s[i] != '\\' || i + 1 >= len) continue;
        i++;
        if (s[i] == 'u' && i + 4 < len && !memcmp(s + i + 1, "0000", 4)) *nul = true;
    }
    return i < len ? i + 1 : len;
}

/* js->path: the keys and indices down to the string just read (and the
 * string itself, when it is a key). */
static void scan_path(jscan *js)
{
    size_t n = 0, cap = sizeof js->path;
    js->path[0] = '\0';
    for (int d = 0; d < js->depth && n < cap; d++) {
        const jlevel *l = &js->lv[d];
        int w = l->obj ? snprintf(js->path + n, cap - n, "%s%.*s", n ? "." : "", (int)l->key_len,
                                  l->key ? l->key : "")
                       : snprintf(js->path + n, cap - n, "[%zu]", l->index);
        n += w > 0 ? (size_t)w : 0;
    }
}

/* One string token at s[i]: a key or a value. Returns the index past it. */
static size_t scan_token(const char *s, size_t i, size_t len, jscan *js)
{
    bool nul = false;
    size_t end = scan_string(s, i, len, &nul);
    jlevel *top = js->depth ? &js->lv[js->depth - 1] : NULL;
    if (top && top->obj && top->want_key) {
        top->key = s + i + 1;
        top->key_len = end >= i + 2 ? end - i - 2 : 0;
        top->want_key = false;
    }
    if (nul && !js->nul) {
        js->nul = true;
        scan_path(js);
    }
    return end;
}

/* Scans the whole body; stops at the first level past SW_MAX_JSON_DEPTH.
 * Invalid JSON is scanned too (without harm): cJSON refuses it after. */
static void scan_body(const char *s, size_t len, jscan *js)
{
    for (size_t i = 0; i < len;) {
        char ch = s[i];
        jlevel *top = js->depth ? &js->lv[js->depth - 1] : NULL;
        if (ch == '"') {
            i = scan_token(s, i, len, js);
            continue;
        }
        if (ch == '{' || ch == '[') {
            if (js->depth == SW_MAX_JSON_DEPTH) {
                js->too_deep = true;
                return;
            }
            js->lv[js->depth++] = (jlevel){.obj = ch == '{', .want_key = ch == '{'};
        } else if ((ch == '}' || ch == ']') && js->depth) {
            js->depth--;
        } else if (ch == ',' && top) {
            if (top->obj) top->want_key = true;
            else top->index++;
        }
        i++;
    }
}

/* A NUL's param outlives the call (the caller writes the error after):
 * kept per HTTP thread until its next parse. */
static _Thread_local char nul_param[sizeof ((jscan *)0)->path];

/* The body as a JSON object whose text is all UTF-8, no deeper than
 * SW_MAX_JSON_DEPTH and without NULs, or NULL with msg (and param) set. */
static cJSON *parse_body(const char *body, size_t len, perr *e)
{
    jscan *js = calloc(1, sizeof *js);
    if (!js) {
        snprintf(e->msg, e->msglen, "out of memory");
        return NULL;
    }
    scan_body(body, len, js);
    cJSON *o = js->too_deep ? NULL : cJSON_ParseWithLength(body, len);
    const char *why = js->too_deep ? NULL
                      : !o ? "request body is not valid JSON"
                      : !cJSON_IsObject(o) ? "request body must be a JSON object"
                      : !json_utf8_ok(o->child) ? "request body contains text that is not valid UTF-8" : NULL;
    if (js->too_deep)
        snprintf(e->msg, e->msglen, "request body nests objects and arrays deeper than %d levels",
                 SW_MAX_JSON_DEPTH);
    else if (why)
        snprintf(e->msg, e->msglen, "%s", why);
    else if (js->nul) {
        snprintf(nul_param, sizeof nul_param, "%s", js->path);
        badf(e, nul_param, "'%s' contains a NUL character (U+0000); NUL characters are not accepted",
             nul_param);
    }
    bool ok = !js->too_deep && !why && !js->nul;
    free(js);
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

cJSON *sw_json_body(const char *body, size_t len, char *msg, size_t msglen, const char **param)
{
    perr e = {msg, msglen, param};
    *param = NULL;
    return parse_body(body, len, &e);
}

/* Every part of the body onto g, in the order the errors are reported. */
static int request_fields(cJSON *o, bool chat, Spillway__GenerateRequest *g, sw_req *r, asked *a, perr *e)
{
    int rc;
    if ((rc = request_model(o, g, e))) return rc;
    if ((rc = chat ? request_messages(o, g, e) : request_prompt(o, g, a, e))) return rc;
    if ((rc = request_sampling(o, chat, g, a, e))) return rc;
    if ((rc = request_stop(o, g, e))) return rc;
    if (chat && (rc = request_tools(o, g, e))) return rc;
    if ((rc = request_format(o, g, e))) return rc;
    if (chat && (rc = request_effort(o, g, e))) return rc;
    if ((rc = request_output(o, chat, g, r, e))) return rc;
    return request_directives(o, r, e);
}

int sw_openai_parse(sw_req *r, const char *body, size_t len, bool chat, const sw_policy *p,
                    char *msg, size_t msglen, const char **param)
{
    perr e = {msg, msglen, param};
    *param = NULL;
    cJSON *o = parse_body(body, len, &e);
    if (!o) return 400;
    Spillway__GenerateRequest g = SPILLWAY__GENERATE_REQUEST__INIT;
    Spillway__SamplingParams sp = SPILLWAY__SAMPLING_PARAMS__INIT;
    g.sampling = &sp;
    asked a = {0};
    int rc = request_fields(o, chat, &g, r, &a, &e);
    /* several choices: each its own request, beside r (choices.h) */
    if (rc == 0 && sw_choices_prepare(r, p, &g, a.prompts, a.n_prompts, a.n) != 0) {
        snprintf(msg, msglen, "could not encode the request");
        rc = 500;
    }
    asked_free(&a);
    free_gen(&g);
    cJSON_Delete(o);
    return rc;
}

/* ---- responses ------------------------------------------------------------ */

/* The id a response shows: a choice's is its request's. */
static const char *resp_id(const sw_req *r)
{
    return r->parent ? r->parent->id : r->id;
}

static cJSON *base_obj(sw_req *r, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", resp_id(r));
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)r->created_s);
    cJSON_AddStringToObject(o, "model", r->model_asked);
    return o;
}

static void add_usage(cJSON *o, sw_req *r)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", r->usage_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", r->usage_completion);
    cJSON_AddNumberToObject(u, "total_tokens", r->usage_prompt + r->usage_completion);
    /* OpenAI's place for prompt tokens served from a cache (our workers' prefix cache) */
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", r->usage_cached);
    /* and for completion tokens that were reasoning */
    cJSON *cd = cJSON_AddObjectToObject(u, "completion_tokens_details");
    cJSON_AddNumberToObject(cd, "reasoning_tokens", r->usage_reasoning);
}

/* OpenAI's finish reason: a model that stopped after calling functions
 * stopped for them. */
static void add_finish(cJSON *c, const sw_req *r)
{
    const char *f = r->calls.n && r->finish == SPILLWAY__FINISH_REASON__FINISH_STOP ? "tool_calls"
                                                                                    : sw_finish_name(r->finish);
    if (f) cJSON_AddStringToObject(c, "finish_reason", f); else cJSON_AddNullToObject(c, "finish_reason");
}

/* Calls [from, to) as OpenAI's tool_calls entries; in a stream delta each
 * carries its index. Ids are the request's id with the call's index. */
static cJSON *tool_calls_json(const sw_req *r, size_t from, size_t to, bool indexed)
{
    cJSON *a = cJSON_CreateArray();
    const char *rid = strchr(r->id, '-');
    for (size_t i = from; i < to; i++) {
        char id[96];
        snprintf(id, sizeof id, "call_%s_%zu", rid ? rid + 1 : r->id, i);
        cJSON *c = cJSON_CreateObject();
        if (indexed) cJSON_AddNumberToObject(c, "index", (double)i);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", r->calls.v[i].name);
        cJSON_AddStringToObject(f, "arguments", r->calls.v[i].arguments);
        cJSON_AddItemToArray(a, c);
    }
    return a;
}

/* A token as OpenAI shows it: its text when its bytes are whole UTF-8, else
 * "bytes:\\xNN..." (a token may hold part of a character). */
static void add_token_text(cJSON *o, const struct sw_lp_token *t)
{
    if (memchr(t->bytes, 0, t->n) == NULL && sw_utf8_valid(t->bytes)) {
        cJSON_AddStringToObject(o, "token", t->bytes);
        return;
    }
    char *s = malloc(6 + 4 * t->n + 1), *p = s;
    if (!s) abort();
    p += sprintf(p, "bytes:");
    for (size_t i = 0; i < t->n; i++) p += sprintf(p, "\\x%02x", (unsigned char)t->bytes[i]);
    cJSON_AddStringToObject(o, "token", s);
    free(s);
}

static cJSON *chat_lp_token(const struct sw_lp_token *t)
{
    cJSON *o = cJSON_CreateObject();
    add_token_text(o, t);
    cJSON_AddNumberToObject(o, "logprob", t->logprob);
    cJSON *b = cJSON_AddArrayToObject(o, "bytes");
    for (size_t i = 0; i < t->n; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)t->bytes[i]));
    return o;
}

/* Entries [from, to) as a choice's logprobs: chat's {"content": [...]},
 * completions' {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
 * offset: the text's byte offset at entry `from`. */
static cJSON *logprobs_json(const sw_req *r, size_t from, size_t to, size_t offset)
{
    cJSON *l = cJSON_CreateObject();
    if (r->chat) {
        cJSON *content = cJSON_AddArrayToObject(l, "content");
        for (size_t i = from; i < to; i++) {
            cJSON *t = chat_lp_token(&r->lps[i].tok);
            cJSON *top = cJSON_AddArrayToObject(t, "top_logprobs");
            for (size_t k = 0; k < r->lps[i].n_top; k++) cJSON_AddItemToArray(top, chat_lp_token(&r->lps[i].top[k]));
            cJSON_AddItemToArray(content, t);
        }
        return l;
    }
    cJSON *toks = cJSON_AddArrayToObject(l, "tokens"), *lps = cJSON_AddArrayToObject(l, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(l, "top_logprobs"), *offs = cJSON_AddArrayToObject(l, "text_offset");
    for (size_t i = from; i < to; i++) {
        cJSON *t = cJSON_CreateObject();
        add_token_text(t, &r->lps[i].tok);
        cJSON_AddItemToArray(toks, cJSON_DetachItemFromObject(t, "token"));
        cJSON_Delete(t);
        if (i == 0 && r->n_prompt_lps) {   /* the prompt's first token: nothing before it to score it */
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
            offset += r->lps[i].tok.n;
            continue;
        }
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(r->lps[i].tok.logprob));
        cJSON *m = cJSON_CreateObject();
        for (size_t k = 0; k < r->lps[i].n_top; k++) {
            cJSON *x = cJSON_CreateObject();
            add_token_text(x, &r->lps[i].top[k]);
            cJSON_AddNumberToObject(m, cJSON_GetObjectItem(x, "token")->valuestring, r->lps[i].top[k].logprob);
            cJSON_Delete(x);
        }
        cJSON_AddItemToArray(tops, m);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        offset += r->lps[i].tok.n;
    }
    return l;
}

static bool blank(const char *s)
{
    while (sw_is_space(*s)) s++;
    return !*s;
}

/* A response or event object with r's choice (its index), in *choice. */
static cJSON *one_choice(sw_req *r, const char *object, cJSON **choice)
{
    cJSON *o = base_obj(r, object);
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", r->choice);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), c);
    *choice = c;
    return o;
}

/* r's choice of a whole response: its message or text, log probabilities
 * and finish. */
static void response_choice(sw_req *r, cJSON *c)
{
    const char *text = r->text.s ? r->text.s : "";
    if (r->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        if (r->calls.n && blank(text)) cJSON_AddNullToObject(m, "content");   /* only calls, as OpenAI answers */
        else cJSON_AddStringToObject(m, "content", text);
        if (r->reasoning.n) cJSON_AddStringToObject(m, "reasoning_content", r->reasoning.s);
        if (r->calls.n) cJSON_AddItemToObject(m, "tool_calls", tool_calls_json(r, 0, r->calls.n, false));
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
    if (r->logprobs) cJSON_AddItemToObject(c, "logprobs", logprobs_json(r, 0, r->n_lps, 0));
    else cJSON_AddNullToObject(c, "logprobs");
    add_finish(c, r);
}

/* A request of several choices lists them in index order (every one has
 * finished: nothing writes them any more). */
char *sw_openai_response(sw_req *r)
{
    cJSON *c;
    cJSON *o = one_choice(r, r->chat ? "chat.completion" : "text_completion", &c);
    if (r->n_kids) {
        cJSON *a = cJSON_GetObjectItem(o, "choices");
        cJSON_DeleteItemFromArray(a, 0);
        for (size_t i = 0; i < r->n_kids; i++) {
            c = cJSON_CreateObject();
            cJSON_AddNumberToObject(c, "index", (double)i);
            response_choice(r->kids[i], c);
            cJSON_AddItemToArray(a, c);
        }
    } else {
        response_choice(r, c);
    }
    add_usage(o, r);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void sse_emit(sw_sbuf *out, cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    sw_sbuf_put(out, "data: ");
    sw_sbuf_put(out, s);
    sw_sbuf_put(out, "\n\n");
    free(s);
    cJSON_Delete(o);
}

/* Appends s[0..n) as JSON string content (no quotes). Text from workers is
 * valid UTF-8 (the wire layer checks), so only the JSON escapes are needed. */
static void json_escape(sw_sbuf *out, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        sw_sbuf_put_n(out, s + run, i - run);
        run = i + 1;
        char e[7] = {'\\', 0};
        switch (c) {
        case '"': e[1] = '"'; break;
        case '\\': e[1] = '\\'; break;
        case '\n': e[1] = 'n'; break;
        case '\r': e[1] = 'r'; break;
        case '\t': e[1] = 't'; break;
        default: e[1] = 'u'; e[2] = '0'; e[3] = '0'; e[4] = hex[c >> 4]; e[5] = hex[c & 15]; break;
        }
        sw_sbuf_put_n(out, e, strlen(e));
    }
    sw_sbuf_put_n(out, s + run, n - run);
}

/* One delta event, written by hand rather than through cJSON: this runs for
 * every relayed chunk of every stream, so it is the gateway's hot path. A
 * chat delta carries reasoning_content when the model reasoned since the
 * last event, and content unless it only reasoned. */
void sw_openai_sse_delta(sw_req *r, sw_sbuf *out, const char *text, size_t n, const char *reasoning, size_t rn,
                         bool role)
{
    char head[128], index[48];
    snprintf(head, sizeof head, "\",\"object\":\"%s\",\"created\":%lld,\"model\":\"",
             r->chat ? "chat.completion.chunk" : "text_completion", (long long)r->created_s);
    snprintf(index, sizeof index, "\",\"choices\":[{\"index\":%u,", r->choice);
    sw_sbuf_put(out, "data: {\"id\":\"");
    sw_sbuf_put(out, resp_id(r));
    sw_sbuf_put(out, head);
    json_escape(out, r->model_asked, strlen(r->model_asked));
    sw_sbuf_put(out, index);
    if (r->chat) {
        sw_sbuf_put(out, role ? "\"delta\":{\"role\":\"assistant\"," : "\"delta\":{");
        if (rn) {
            sw_sbuf_put(out, "\"reasoning_content\":\"");
            json_escape(out, reasoning, rn);
            sw_sbuf_put(out, n || role ? "\",\"content\":\"" : "");
        } else {
            sw_sbuf_put(out, "\"content\":\"");
        }
    } else {
        sw_sbuf_put(out, "\"text\":\"");
    }
    json_escape(out, text ? text : "", text ? n : 0);
    sw_sbuf_put(out, r->chat ? "\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
                             : "\",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
}

void sw_openai_sse_delta_logprobs(sw_req *r, sw_sbuf *out, bool role)
{
    cJSON *c;
    cJSON *o = one_choice(r, r->chat ? "chat.completion.chunk" : "text_completion", &c);
    /* the buffers hold text[0..len) (a relayed buffer keeps stale bytes past len) */
    char *text = strndup(r->text.s ? r->text.s : "", r->text.n);
    char *reasoning = strndup(r->reasoning.s ? r->reasoning.s : "", r->reasoning.n);
    if (!text || !reasoning) abort();   /* out of memory in a few bytes: nothing smaller to answer */
    if (r->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (*reasoning) cJSON_AddStringToObject(d, "reasoning_content", reasoning);
        if (*text || role || !*reasoning) cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
    free(text);
    free(reasoning);
    size_t offset = 0;
    for (size_t i = 0; i < r->n_lps_sent; i++) offset += r->lps[i].tok.n;
    cJSON_AddItemToObject(c, "logprobs", logprobs_json(r, r->n_lps_sent, r->n_lps, offset));
    cJSON_AddNullToObject(c, "finish_reason");
    r->n_lps_sent = r->n_lps;
    sse_emit(out, o);
}

void sw_openai_sse_calls(sw_req *r, sw_sbuf *out)
{
    cJSON *c;
    cJSON *o = one_choice(r, "chat.completion.chunk", &c);
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    cJSON_AddItemToObject(d, "tool_calls", tool_calls_json(r, r->n_calls_sent, r->calls.n, true));
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    r->n_calls_sent = r->calls.n;
    sse_emit(out, o);
}

void sw_openai_sse_pending(sw_req *r, sw_sbuf *out)
{
    bool role = r->chat && r->sse_stage == 0;
    r->sse_stage = 1;
    if (r->logprobs && (r->text.n || r->reasoning.n || role || r->n_lps > r->n_lps_sent)) {
        sw_openai_sse_delta_logprobs(r, out, role);
        r->text.n = r->reasoning.n = 0;
    } else if (r->text.n || r->reasoning.n || role) {
        sw_openai_sse_delta(r, out, r->text.s, r->text.n, r->reasoning.s, r->reasoning.n, role);
        r->text.n = r->reasoning.n = 0;
    }
    if (r->calls.n > r->n_calls_sent) sw_openai_sse_calls(r, out);
}

/* A failure mid-stream is reported in-band: finish_reason "error" plus an
 * OpenAI error object, since the HTTP status was sent long ago. */
void sw_openai_sse_finish(sw_req *r, sw_sbuf *out)
{
    cJSON *c;
    cJSON *o = one_choice(r, r->chat ? "chat.completion.chunk" : "text_completion", &c);
    if (r->chat) cJSON_AddObjectToObject(c, "delta");
    else cJSON_AddStringToObject(c, "text", "");
    cJSON_AddNullToObject(c, "logprobs");
    add_finish(c, r);
    if (r->finish == SPILLWAY__FINISH_REASON__FINISH_ERROR) {
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "message", r->err_msg[0] ? r->err_msg : "the worker failed");
        cJSON_AddStringToObject(e, "type", "server_error");
        cJSON_AddNullToObject(e, "param");
        cJSON_AddStringToObject(e, "code", r->err_code ? r->err_code : "worker_failed");
    }
    sse_emit(out, o);
}

/* A request of several choices: theirs were sent as each finished; its own
 * is only its error. */
void sw_openai_sse_final(sw_req *r, sw_sbuf *out)
{
    if (!r->n_kids || r->finish == SPILLWAY__FINISH_REASON__FINISH_ERROR) sw_openai_sse_finish(r, out);
    if (r->include_usage) {
        cJSON *u = base_obj(r, r->chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(u, "choices");
        add_usage(u, r);
        sse_emit(out, u);
    }
    sw_sbuf_put(out, "data: [DONE]\n\n");
}
