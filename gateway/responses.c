/* POST /v1/responses as a translation onto chat (responses.h).
 *
 * Parsing: each top-level field of the Responses body has one handler (the
 * table in translate()); it copies the field onto a chat completions body,
 * renames it, translates its shape (input items to messages, flat function
 * tools to chat's, text.format to response_format), or refuses it. The chat
 * body then goes through sw_openai_parse, so the Responses endpoint takes
 * exactly the limits and checks chat takes; its error params are named back
 * in Responses terms (messages -> input, ...).
 *
 * Rendering: the request gathers what chat requests gather (text, reasoning,
 * calls, usage); the response object and the stream's events are built
 * from those here.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "gateway/openai.h"
#include "gateway/responses.h"
#include "llm/limits.h"
#include "llm/text.h"

enum { IT_NONE = -3, IT_MESSAGE = -2, IT_REASONING = -1 };   /* an output item; >= 0: a call's index */

typedef struct sw_resp {
    cJSON *echo;                  /* the request's fields the response object repeats */
    /* streaming: the output so far (r->text and r->reasoning are emptied as
     * they are relayed), and which items are out, in output order */
    bool started;
    int seq;                      /* the next event's sequence_number */
    sw_sbuf text, reasoning;
    bool msg_open, rs_open;       /* the message / reasoning item is added and not done */
    bool msg_out, rs_out;         /* ... was added (it is then in items) */
    int *items;
    size_t n_items, cap_items;
} sw_resp;

void sw_responses_free(sw_resp *s)
{
    if (!s) return;
    cJSON_Delete(s->echo);
    sw_sbuf_free(&s->text);
    sw_sbuf_free(&s->reasoning);
    free(s->items);
    free(s);
}

/* ---- errors ---------------------------------------------------------------- */
typedef struct { char *msg; size_t msglen; const char **param; } rerr;

/* A param outlives the call (the caller writes the error after): kept per
 * HTTP thread until its next parse, as openai.c keeps a NUL's path. */
static _Thread_local char s_param[96];

__attribute__((format(printf, 3, 4))) static int fail(rerr *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, e->msglen, fmt, ap);
    va_end(ap);
    snprintf(s_param, sizeof s_param, "%s", param);
    *e->param = s_param;
    return 400;
}

/* ---- the translation --------------------------------------------------------- */
typedef struct {
    cJSON *chat;                  /* the chat completions body being built */
    cJSON *echo;
    cJSON *input, *instructions;  /* kept for the messages, built last */
    rerr *e;
} tx;

static cJSON *item(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static bool absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

static void put(cJSON *o, const char *k, const cJSON *v) { cJSON_AddItemToObject(o, k, cJSON_Duplicate(v, true)); }

/* Keys of an object other than those listed (NULL-terminated): the first, or NULL. */
static const char *stray_key(const cJSON *o, const char *const *known)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, o) {
        size_t i = 0;
        while (known[i] && strcmp(known[i], c->string)) i++;
        if (!known[i]) return c->string;
    }
    return NULL;
}

/* Text parts ({type: input_text or output_text, text}) or a string, as one
 * string in *out (malloc'd). where: the field's path, for errors. */
static int parts_text(const cJSON *c, const char *where, tx *t, char **out)
{
    char p[96];
    if (cJSON_IsString(c)) return (*out = strdup(c->valuestring)) ? 0 : fail(t->e, where, "out of memory");
    if (!cJSON_IsArray(c)) return fail(t->e, where, "'%s' must be a string or an array of text parts", where);
    sw_sbuf b = {0};
    sw_sbuf_put(&b, "");
    int i = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *ty = item(part, "type"), *tx_ = item(part, "text");
        snprintf(p, sizeof p, "%s[%d].type", where, i++);
        bool text_part = cJSON_IsString(ty) && (!strcmp(ty->valuestring, "input_text") ||
                                                !strcmp(ty->valuestring, "output_text"));
        if (!cJSON_IsObject(part) || !text_part || !cJSON_IsString(tx_)) {
            sw_sbuf_free(&b);
            return fail(t->e, p, "only text parts ({\"type\": \"input_text\", \"text\": ...}) are supported in '%s'",
                        where);
        }
        sw_sbuf_put(&b, tx_->valuestring);
    }
    if (b.oom) return fail(t->e, where, "out of memory");
    *out = b.s;
    return 0;
}

static cJSON *add_message(cJSON *msgs, const char *role, char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    free(content);
    cJSON_AddItemToArray(msgs, m);
    return m;
}

/* A message item: role user, system, developer (a system message to the
 * templates) or assistant; content a string or text parts. */
static int input_message(const cJSON *it, int i, cJSON *msgs, tx *t)
{
    static const char *const known[] = {"type", "role", "content", "id", "status", NULL};
    char p[64];
    const char *stray = stray_key(it, known);
    snprintf(p, sizeof p, "input[%d].%s", i, stray ? stray : "role");
    if (stray) return fail(t->e, p, "unknown field '%s' in a message item", p);
    const cJSON *role = item(it, "role");
    const char *r = cJSON_IsString(role) ? role->valuestring : "";
    if (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "assistant"))
        return fail(t->e, p, "'%s' must be \"user\", \"system\", \"developer\" or \"assistant\"", p);
    snprintf(p, sizeof p, "input[%d].content", i);
    char *text = NULL;
    int rc = parts_text(item(it, "content"), p, t, &text);
    if (rc) return rc;
    add_message(msgs, strcmp(r, "developer") ? r : "system", text);
    return 0;
}

/* One of an item's required string fields, or a 400 naming it. */
static int need_string(const cJSON *it, int i, const char *k, tx *t, const char **out)
{
    const cJSON *v = item(it, k);
    char p[64];
    snprintf(p, sizeof p, "input[%d].%s", i, k);
    if (!cJSON_IsString(v)) return fail(t->e, p, "'%s' is required and must be a string", p);
    *out = v->valuestring;
    return 0;
}

/* A function_call item: a call the model made in an earlier turn, onto the
 * assistant message before it (calls of one turn share their message), or
 * onto a new one. */
static int input_call(const cJSON *it, int i, cJSON *msgs, tx *t)
{
    static const char *const known[] = {"type", "call_id", "name", "arguments", "id", "status", NULL};
    const char *stray = stray_key(it, known), *id, *name, *args;
    char p[64];
    snprintf(p, sizeof p, "input[%d].%s", i, stray ? stray : "");
    if (stray) return fail(t->e, p, "unknown field '%s' in a function_call item", p);
    int rc;
    if ((rc = need_string(it, i, "call_id", t, &id)) || (rc = need_string(it, i, "name", t, &name)) ||
        (rc = need_string(it, i, "arguments", t, &args)))
        return rc;
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const cJSON *lr = item(last, "role");
    if (!cJSON_IsString(lr) || strcmp(lr->valuestring, "assistant")) last = add_message(msgs, "assistant", strdup(""));
    cJSON *calls = item(last, "tool_calls");
    if (!calls) calls = cJSON_AddArrayToObject(last, "tool_calls");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", args);
    cJSON_AddItemToArray(calls, c);
    return 0;
}

/* A function_call_output item: a call's result, as chat's tool message. */
static int input_output(const cJSON *it, int i, cJSON *msgs, tx *t)
{
    static const char *const known[] = {"type", "call_id", "output", "id", "status", NULL};
    const char *stray = stray_key(it, known), *id;
    char p[64];
    snprintf(p, sizeof p, "input[%d].%s", i, stray ? stray : "output");
    if (stray) return fail(t->e, p, "unknown field '%s' in a function_call_output item", p);
    char *text = NULL;
    int rc;
    if ((rc = need_string(it, i, "call_id", t, &id)) || (rc = parts_text(item(it, "output"), p, t, &text))) return rc;
    cJSON *m = add_message(msgs, "tool", text);
    cJSON_AddStringToObject(m, "tool_call_id", id);
    return 0;
}

static int input_item(const cJSON *it, int i, cJSON *msgs, tx *t)
{
    char p[64];
    snprintf(p, sizeof p, "input[%d]", i);
    if (!cJSON_IsObject(it)) return fail(t->e, p, "'%s' must be an object (an input item)", p);
    const cJSON *type = item(it, "type");
    snprintf(p, sizeof p, "input[%d].type", i);
    if (!absent(type) && !cJSON_IsString(type)) return fail(t->e, p, "'%s' must be a string", p);
    const char *ty = absent(type) ? "message" : type->valuestring;
    if (!strcmp(ty, "message")) return input_message(it, i, msgs, t);
    if (!strcmp(ty, "function_call")) return input_call(it, i, msgs, t);
    if (!strcmp(ty, "function_call_output")) return input_output(it, i, msgs, t);
    if (!strcmp(ty, "reasoning")) return 0;   /* an earlier turn's reasoning: the templates leave it out too */
    return fail(t->e, p, "input items of type '%.40s' are not supported (message, function_call, "
                "function_call_output and reasoning are; item_reference needs stored state)", ty);
}

/* instructions (a system message first), then input: a string (one user
 * message) or a non-empty array of items. */
static int build_messages(tx *t)
{
    cJSON *msgs = cJSON_AddArrayToObject(t->chat, "messages");
    if (!absent(t->instructions)) {
        if (!cJSON_IsString(t->instructions)) return fail(t->e, "instructions", "'instructions' must be a string");
        add_message(msgs, "system", strdup(t->instructions->valuestring));
        put(t->echo, "instructions", t->instructions);
    }
    if (absent(t->input)) return fail(t->e, "input", "'input' is required");
    if (cJSON_IsString(t->input)) {
        add_message(msgs, "user", strdup(t->input->valuestring));
        return 0;
    }
    if (!cJSON_IsArray(t->input) || cJSON_GetArraySize(t->input) == 0)
        return fail(t->e, "input", "'input' must be a string or a non-empty array of input items");
    if (cJSON_GetArraySize(t->input) > SW_MAX_MESSAGES)
        return fail(t->e, "input", "'input' has more than %d items", SW_MAX_MESSAGES);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, t->input) {
        int rc = input_item(it, i++, msgs, t);
        if (rc) return rc;
    }
    return 0;
}

/* tools: Responses' flat function tools, {"type": "function", "name",
 * "description", "parameters", "strict"}, onto chat's {"type": "function",
 * "function": {...}}; chat checks the names and parameters. Built-in tools
 * (web_search, file_search, ...) need services Spillway does not run. */
static int f_tools(const cJSON *v, tx *t)
{
    static const char *const known[] = {"type", "name", "description", "parameters", "strict", NULL};
    if (!cJSON_IsArray(v)) return fail(t->e, "tools", "'tools' must be an array of function tools");
    cJSON *out = cJSON_AddArrayToObject(t->chat, "tools");
    const cJSON *tool;
    cJSON_ArrayForEach(tool, v) {
        const cJSON *ty = item(tool, "type");
        if (!cJSON_IsObject(tool) || !cJSON_IsString(ty))
            return fail(t->e, "tools", "each entry of 'tools' must be an object with a 'type'");
        if (strcmp(ty->valuestring, "function"))
            return fail(t->e, "tools", "built-in tools ('%.40s') are not supported: only {\"type\": \"function\", "
                        "\"name\": ..., \"parameters\": ...} tools are", ty->valuestring);
        const char *stray = stray_key(tool, known);
        if (stray)
            return fail(t->e, "tools", "unknown field '%.40s' in a function tool (Responses tools are flat: "
                        "{\"type\": \"function\", \"name\", \"description\", \"parameters\", \"strict\"})", stray);
        cJSON *c = cJSON_CreateObject(), *f = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "type", "function");
        const cJSON *k;
        cJSON_ArrayForEach(k, tool) if (strcmp(k->string, "type")) put(f, k->string, k);
        cJSON_AddItemToObject(c, "function", f);
        cJSON_AddItemToArray(out, c);
    }
    put(t->echo, "tools", v);
    return 0;
}

/* tool_choice: "auto", "none", "required", or {"type": "function", "name"}. */
static int f_tool_choice(const cJSON *v, tx *t)
{
    put(t->echo, "tool_choice", v);
    if (cJSON_IsString(v)) {
        put(t->chat, "tool_choice", v);   /* chat checks the word */
        return 0;
    }
    const cJSON *ty = item(v, "type"), *name = item(v, "name");
    if (!cJSON_IsObject(v) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(name))
        return fail(t->e, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                    "{\"type\": \"function\", \"name\": ...} (built-in tools are not supported)");
    cJSON *c = cJSON_AddObjectToObject(t->chat, "tool_choice");
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name->valuestring);
    return 0;
}

/* text.format onto response_format: {"type": "text"}, {"type":
 * "json_object"}, or {"type": "json_schema", "name", "schema", "strict",
 * "description"}. */
static int text_format(const cJSON *f, tx *t)
{
    static const char *const known[] = {"type", "name", "schema", "strict", "description", NULL};
    const cJSON *ty = item(f, "type");
    if (!cJSON_IsObject(f) || !cJSON_IsString(ty))
        return fail(t->e, "text.format", "'text.format' must be an object with a 'type'");
    if (strcmp(ty->valuestring, "json_schema")) {
        put(t->chat, "response_format", f);   /* chat checks "text" and "json_object" */
        return 0;
    }
    const char *stray = stray_key(f, known);
    if (stray) return fail(t->e, "text.format", "unknown field '%.40s' in 'text.format'", stray);
    cJSON *rf = cJSON_AddObjectToObject(t->chat, "response_format");
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    const char *keys[] = {"name", "schema", "strict"};
    for (size_t i = 0; i < 3; i++)
        if (item(f, keys[i])) put(js, keys[i], item(f, keys[i]));
    return 0;
}

/* text: format, and verbosity (only "medium": nothing here varies it). */
static int f_text(const cJSON *v, tx *t)
{
    static const char *const known[] = {"format", "verbosity", NULL};
    if (!cJSON_IsObject(v)) return fail(t->e, "text", "'text' must be an object");
    const char *stray = stray_key(v, known);
    if (stray) return fail(t->e, "text", "unknown field '%.40s' in 'text'", stray);
    const cJSON *verb = item(v, "verbosity"), *f = item(v, "format");
    if (!absent(verb) && !(cJSON_IsString(verb) && !strcmp(verb->valuestring, "medium")))
        return fail(t->e, "text.verbosity", "'text.verbosity' can only be \"medium\" here");
    cJSON *echo = cJSON_AddObjectToObject(t->echo, "text");
    if (absent(f)) cJSON_AddItemToObject(echo, "format", cJSON_Parse("{\"type\":\"text\"}"));
    else put(echo, "format", f);
    cJSON_AddStringToObject(echo, "verbosity", "medium");
    return absent(f) ? 0 : text_format(f, t);
}

/* reasoning: effort (chat's reasoning_effort); summary is accepted and
 * repeated, but no summaries are written: the reasoning itself is the
 * reasoning item's content. */
static int f_reasoning(const cJSON *v, tx *t)
{
    static const char *const known[] = {"effort", "summary", NULL};
    if (!cJSON_IsObject(v)) return fail(t->e, "reasoning", "'reasoning' must be an object");
    const char *stray = stray_key(v, known);
    if (stray) return fail(t->e, "reasoning", "unknown field '%.40s' in 'reasoning'", stray);
    const cJSON *eff = item(v, "effort"), *sum = item(v, "summary");
    if (!absent(sum) && !cJSON_IsString(sum))
        return fail(t->e, "reasoning.summary", "'reasoning.summary' must be a string");
    cJSON *echo = cJSON_AddObjectToObject(t->echo, "reasoning");
    if (absent(eff)) cJSON_AddNullToObject(echo, "effort"); else put(echo, "effort", eff);
    if (absent(sum)) cJSON_AddNullToObject(echo, "summary"); else put(echo, "summary", sum);
    if (!absent(eff)) put(t->chat, "reasoning_effort", eff);
    return 0;
}

/* metadata: up to 16 string pairs (keys to 64 characters, values to 512),
 * repeated in the response. */
static int f_metadata(const cJSON *v, tx *t)
{
    if (!cJSON_IsObject(v) || cJSON_GetArraySize(v) > 16)
        return fail(t->e, "metadata", "'metadata' must be an object of up to 16 string values");
    const cJSON *k;
    cJSON_ArrayForEach(k, v)
        if (!cJSON_IsString(k) || strlen(k->string) > 64 || strlen(k->valuestring) > 512)
            return fail(t->e, "metadata", "'metadata' keys are at most 64 characters, its values strings of "
                        "at most 512");
    put(t->echo, "metadata", v);
    return 0;
}

/* ---- the other fields -------------------------------------------------------- */
static int f_copy(const cJSON *v, tx *t) { (void)v; (void)t; return 0; }   /* the table copies (see translate) */

static int f_input(const cJSON *v, tx *t) { t->input = (cJSON *)v; return 0; }

static int f_instructions(const cJSON *v, tx *t) { t->instructions = (cJSON *)v; return 0; }

static int f_max_output(const cJSON *v, tx *t)
{
    put(t->chat, "max_tokens", v);   /* chat checks the range; its param is named back */
    put(t->echo, "max_output_tokens", v);
    return 0;
}

static int f_user(const cJSON *v, tx *t)
{
    if (!cJSON_IsString(v)) return fail(t->e, "user", "'user' must be a string");
    put(t->echo, "user", v);
    return 0;
}

/* Strings OpenAI uses for its own caching and abuse checks: accepted, unused. */
static int f_ignored_string(const cJSON *v, tx *t)
{
    return cJSON_IsString(v) ? 0 : fail(t->e, v->string, "'%s' must be a string", v->string);
}

/* store and background: false is what happens here; true needs stored state. */
static int f_false_only(const cJSON *v, tx *t)
{
    if (!cJSON_IsBool(v)) return fail(t->e, v->string, "'%s' must be a boolean", v->string);
    if (cJSON_IsTrue(v))
        return fail(t->e, v->string, "'%s': true is not supported: Spillway keeps no responses (send %s: false)",
                    v->string, v->string);
    return 0;
}

/* Fields that need stored state or features not served here: only null. */
static int f_refused(const cJSON *v, tx *t)
{
    return fail(t->e, v->string, "'%s' is not supported: Spillway's /v1/responses is stateless and keeps no "
                "responses, conversations or prompts", v->string);
}

static int f_top_logprobs(const cJSON *v, tx *t)
{
    if (cJSON_IsNumber(v) && v->valuedouble == 0) return 0;
    return fail(t->e, "top_logprobs", "'top_logprobs' is not supported on /v1/responses (use /v1/chat/completions)");
}

static int f_include(const cJSON *v, tx *t)
{
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0) return 0;
    return fail(t->e, "include", "'include' is not supported: there is no extra output to include");
}

static int f_truncation(const cJSON *v, tx *t)
{
    if (cJSON_IsString(v) && !strcmp(v->valuestring, "disabled")) return 0;
    return fail(t->e, "truncation", "'truncation' can only be \"disabled\": an input too long for the model is "
                "refused, not cut");
}

/* stream_options: include_obfuscation only (nothing is obfuscated here). */
static int f_stream_options(const cJSON *v, tx *t)
{
    static const char *const known[] = {"include_obfuscation", NULL};
    const char *stray = cJSON_IsObject(v) ? stray_key(v, known) : "";
    if (stray) return fail(t->e, "stream_options", "'stream_options' may only hold include_obfuscation");
    return 0;
}

typedef struct {
    const char *name;
    int (*fn)(const cJSON *v, tx *t);
    bool copy, echo;              /* copied to chat as is / repeated in the response */
} field;

static const field FIELDS[] = {
    {"model", f_copy, true, false},          {"input", f_input, false, false},
    {"instructions", f_instructions, false, false},
    {"max_output_tokens", f_max_output, false, false},
    {"temperature", f_copy, true, true},     {"top_p", f_copy, true, true},
    {"seed", f_copy, true, false},           {"top_k", f_copy, true, false},
    {"min_p", f_copy, true, false},          {"repetition_penalty", f_copy, true, false},
    {"presence_penalty", f_copy, true, false}, {"frequency_penalty", f_copy, true, false},
    {"stream", f_copy, true, false},         {"spillway", f_copy, true, false},
    {"parallel_tool_calls", f_copy, true, true},
    {"tools", f_tools, false, false},        {"tool_choice", f_tool_choice, false, false},
    {"text", f_text, false, false},          {"reasoning", f_reasoning, false, false},
    {"metadata", f_metadata, false, false},  {"user", f_user, false, false},
    {"safety_identifier", f_ignored_string, false, false}, {"prompt_cache_key", f_ignored_string, false, false},
    {"store", f_false_only, false, false},   {"background", f_false_only, false, false},
    {"previous_response_id", f_refused, false, false}, {"conversation", f_refused, false, false},
    {"prompt", f_refused, false, false},     {"max_tool_calls", f_refused, false, false},
    {"top_logprobs", f_top_logprobs, false, false}, {"include", f_include, false, false},
    {"truncation", f_truncation, false, false}, {"stream_options", f_stream_options, false, false},
};

/* Every field of the body through its handler (null is absent), then the
 * messages. */
static int translate(const cJSON *o, tx *t)
{
    const cJSON *v;
    cJSON_ArrayForEach(v, o) {
        size_t i = 0, n = sizeof FIELDS / sizeof FIELDS[0];
        while (i < n && strcmp(FIELDS[i].name, v->string)) i++;
        if (i == n) return fail(t->e, v->string, "unknown field '%.60s'", v->string);
        if (cJSON_IsNull(v)) continue;
        if (FIELDS[i].copy) put(t->chat, v->string, v);
        if (FIELDS[i].echo) put(t->echo, v->string, v);
        int rc = FIELDS[i].fn(v, t);
        if (rc) return rc;
    }
    return build_messages(t);
}

/* chat's params named back as the Responses fields they came from */
static const char *responses_param(const char *p)
{
    static const char *const map[][2] = {
        {"messages", "input"}, {"max_tokens", "max_output_tokens"}, {"response_format", "text.format"},
        {"reasoning_effort", "reasoning.effort"},
    };
    for (size_t i = 0; p && i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(p, map[i][0])) return map[i][1];
    return p;
}

/* The chat body through chat's own parser (which fills r). */
static int parse_chat(sw_req *r, const cJSON *chat, const sw_policy *p, rerr *e)
{
    char *s = cJSON_PrintUnformatted(chat);
    if (!s) return fail(e, "input", "out of memory");
    int rc = sw_openai_parse(r, s, strlen(s), true, p, e->msg, e->msglen, e->param);
    free(s);
    if (rc) *e->param = responses_param(*e->param);
    return rc;
}

int sw_responses_parse(sw_req *r, const char *body, size_t len, const sw_policy *p, char *msg, size_t msglen,
                       const char **param)
{
    rerr e = {msg, msglen, param};
    r->chat = true;
    cJSON *o = sw_json_body(body, len, msg, msglen, param);
    if (!o) return 400;
    sw_resp *s = calloc(1, sizeof *s);
    tx t = {cJSON_CreateObject(), cJSON_CreateObject(), NULL, NULL, &e};
    int rc = !s || !t.chat || !t.echo ? fail(&e, "input", "out of memory") : translate(o, &t);
    if (!rc) rc = parse_chat(r, t.chat, p, &e);
    cJSON_Delete(o);
    cJSON_Delete(t.chat);
    if (s) s->echo = t.echo; else cJSON_Delete(t.echo);
    if (rc) {
        sw_responses_free(s);
        return rc;
    }
    r->resp = s;
    r->resp_free = sw_responses_free;
    return 0;
}

/* ---- the response object ------------------------------------------------------ */
/* Ids from the request's: resp_X gives msg_X, rs_X, fc_X_i and call_X_i. */
static void item_id(const sw_req *r, int it, char *out, size_t n)
{
    const char *x = r->id + (strncmp(r->id, "resp_", 5) ? 0 : 5);
    if (it == IT_MESSAGE) snprintf(out, n, "msg_%s", x);
    else if (it == IT_REASONING) snprintf(out, n, "rs_%s", x);
    else snprintf(out, n, "fc_%s_%d", x, it);
}

static cJSON *text_part(const char *type, const char *text)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", type);
    cJSON_AddStringToObject(p, "text", text);
    if (!strcmp(type, "output_text")) {
        cJSON_AddArrayToObject(p, "annotations");
        cJSON_AddArrayToObject(p, "logprobs");
    }
    return p;
}

/* An output item; text NULL: as added (no content yet, arguments empty). */
static cJSON *item_json(const sw_req *r, int it, const char *text, const char *status)
{
    char id[96];
    item_id(r, it, id, sizeof id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    if (it == IT_REASONING) {
        cJSON_AddStringToObject(o, "type", "reasoning");
        cJSON_AddArrayToObject(o, "summary");
        cJSON *c = cJSON_AddArrayToObject(o, "content");
        if (text) cJSON_AddItemToArray(c, text_part("reasoning_text", text));
    } else if (it == IT_MESSAGE) {
        cJSON_AddStringToObject(o, "type", "message");
        cJSON_AddStringToObject(o, "role", "assistant");
        cJSON *c = cJSON_AddArrayToObject(o, "content");
        if (text) cJSON_AddItemToArray(c, text_part("output_text", text));
    } else {
        char call[104];
        snprintf(call, sizeof call, "call_%s", id + 3);
        cJSON_AddStringToObject(o, "type", "function_call");
        cJSON_AddStringToObject(o, "call_id", call);
        cJSON_AddStringToObject(o, "name", r->calls.v[it].name);
        cJSON_AddStringToObject(o, "arguments", text ? r->calls.v[it].arguments : "");
    }
    cJSON_AddStringToObject(o, "status", status);
    return o;
}

static const char *status_of(const sw_req *r)
{
    switch (r->finish) {
    case SPILLWAY__FINISH_REASON__FINISH_LENGTH: return "incomplete";
    case SPILLWAY__FINISH_REASON__FINISH_ERROR: return "failed";
    case SPILLWAY__FINISH_REASON__FINISH_CANCELLED: return "cancelled";
    default: return "completed";
    }
}

static void add_usage(cJSON *o, const sw_req *r)
{
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", r->usage_prompt);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", r->usage_cached);
    cJSON_AddNumberToObject(u, "output_tokens", r->usage_completion);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens",
                            r->usage_reasoning);
    cJSON_AddNumberToObject(u, "total_tokens", r->usage_prompt + r->usage_completion);
}

/* The request's fields as the response repeats them, with OpenAI's defaults. */
static void add_echo(cJSON *o, const sw_resp *s)
{
    static const char *const defaults[][2] = {
        {"instructions", "null"}, {"max_output_tokens", "null"}, {"parallel_tool_calls", "true"},
        {"reasoning", "{\"effort\":null,\"summary\":null}"}, {"temperature", "1"},
        {"text", "{\"format\":{\"type\":\"text\"},\"verbosity\":\"medium\"}"}, {"tool_choice", "\"auto\""},
        {"tools", "[]"}, {"top_p", "1"}, {"metadata", "{}"},
    };
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) {
        const cJSON *v = item(s->echo, defaults[i][0]);
        cJSON_AddItemToObject(o, defaults[i][0], v ? cJSON_Duplicate(v, true) : cJSON_Parse(defaults[i][1]));
    }
    if (item(s->echo, "user")) put(o, "user", item(s->echo, "user"));
    cJSON_AddBoolToObject(o, "store", false);
    cJSON_AddBoolToObject(o, "background", false);
    cJSON_AddNullToObject(o, "previous_response_id");
    cJSON_AddStringToObject(o, "truncation", "disabled");
}

/* status, error and incomplete_details; final false: as it starts. */
static void add_status(cJSON *o, const sw_req *r, bool final)
{
    const char *st = final ? status_of(r) : "in_progress";
    cJSON_AddStringToObject(o, "status", st);
    if (!strcmp(st, "failed")) {
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "code", "server_error");
        cJSON_AddStringToObject(e, "message", r->err_msg[0] ? r->err_msg : "the worker failed");
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    if (!strcmp(st, "incomplete"))
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "incomplete_details"), "reason", "max_output_tokens");
    else
        cJSON_AddNullToObject(o, "incomplete_details");
}

/* The response object: its items (s->items, in output order) from text and
 * reasoning; final false: as it starts (in progress, no output or usage). */
static cJSON *response_obj(const sw_req *r, bool final, const char *text, const char *reasoning)
{
    const sw_resp *s = r->resp;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)r->created_s);
    add_status(o, r, final);
    cJSON_AddStringToObject(o, "model", r->model_asked);
    cJSON *out = cJSON_AddArrayToObject(o, "output");
    const char *item_status = final && r->finish == SPILLWAY__FINISH_REASON__FINISH_LENGTH ? "incomplete" : "completed";
    for (size_t i = 0; final && i < s->n_items; i++) {
        int it = s->items[i];
        cJSON_AddItemToArray(out, item_json(r, it, it == IT_MESSAGE ? text : it == IT_REASONING ? reasoning : "",
                                            item_status));
    }
    add_echo(o, s);
    if (final) add_usage(o, r); else cJSON_AddNullToObject(o, "usage");
    return o;
}

static void push_item(sw_resp *s, int it)
{
    if (s->n_items == s->cap_items) {
        size_t cap = s->cap_items ? 2 * s->cap_items : 8;
        int *p = realloc(s->items, cap * sizeof *p);
        if (!p) abort();   /* out of memory in a few bytes: nothing smaller to answer */
        s->items = p;
        s->cap_items = cap;
    }
    s->items[s->n_items++] = it;
}

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!sw_is_space(s[i])) return false;
    return true;
}

/* Non-streamed: reasoning, then the message (left out when the model only
 * called functions), then the calls, as chat's message holds them. */
char *sw_responses_body(sw_req *r)
{
    sw_resp *s = r->resp;
    const char *text = r->text.s ? r->text.s : "", *reasoning = r->reasoning.s ? r->reasoning.s : "";
    s->n_items = 0;
    if (r->reasoning.n) push_item(s, IT_REASONING);
    if (!r->calls.n || !blank(text, r->text.n)) push_item(s, IT_MESSAGE);
    for (size_t i = 0; i < r->calls.n; i++) push_item(s, (int)i);
    cJSON *o = response_obj(r, true, text, reasoning);
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return body;
}

/* ---- the stream --------------------------------------------------------------- */
static cJSON *ev(const char *type)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "type", type);
    return e;
}

/* One event: "event: TYPE" and its data, numbered. */
static void emit(sw_req *r, sw_sbuf *out, cJSON *e)
{
    cJSON_AddNumberToObject(e, "sequence_number", r->resp->seq++);
    char *s = cJSON_PrintUnformatted(e);
    sw_sbuf_put(out, "event: ");
    sw_sbuf_put(out, item(e, "type")->valuestring);
    sw_sbuf_put(out, "\ndata: ");
    if (s) sw_sbuf_put(out, s); else out->oom = true;
    sw_sbuf_put(out, "\n\n");
    free(s);
    cJSON_Delete(e);
}

static int index_of(const sw_resp *s, int it)
{
    for (size_t i = 0; i < s->n_items; i++)
        if (s->items[i] == it) return (int)i;
    return -1;
}

/* An event about one item: its output_index and item_id (or whole item). */
static cJSON *ev_at(const sw_req *r, const char *type, int it, cJSON *whole)
{
    cJSON *e = ev(type);
    cJSON_AddNumberToObject(e, "output_index", index_of(r->resp, it));
    if (whole) {
        cJSON_AddItemToObject(e, "item", whole);
        return e;
    }
    char id[96];
    item_id(r, it, id, sizeof id);
    cJSON_AddStringToObject(e, "item_id", id);
    return e;
}

/* A message or reasoning item added, with its one content part. */
static void open_item(sw_req *r, sw_sbuf *out, int it)
{
    push_item(r->resp, it);
    emit(r, out, ev_at(r, "response.output_item.added", it, item_json(r, it, NULL, "in_progress")));
    cJSON *e = ev_at(r, "response.content_part.added", it, NULL);
    cJSON_AddNumberToObject(e, "content_index", 0);
    cJSON_AddItemToObject(e, "part", text_part(it == IT_MESSAGE ? "output_text" : "reasoning_text", ""));
    emit(r, out, e);
}

/* Its text done, its part done, the item done. */
static void close_item(sw_req *r, sw_sbuf *out, int it, const char *status)
{
    const char *text = (it == IT_MESSAGE ? r->resp->text.s : r->resp->reasoning.s);
    text = text ? text : "";
    cJSON *e = ev_at(r, it == IT_MESSAGE ? "response.output_text.done" : "response.reasoning_text.done", it, NULL);
    cJSON_AddNumberToObject(e, "content_index", 0);
    cJSON_AddStringToObject(e, "text", text);
    if (it == IT_MESSAGE) cJSON_AddArrayToObject(e, "logprobs");
    emit(r, out, e);
    e = ev_at(r, "response.content_part.done", it, NULL);
    cJSON_AddNumberToObject(e, "content_index", 0);
    cJSON_AddItemToObject(e, "part", text_part(it == IT_MESSAGE ? "output_text" : "reasoning_text", text));
    emit(r, out, e);
    emit(r, out, ev_at(r, "response.output_item.done", it, item_json(r, it, text, status)));
}

static void delta(sw_req *r, sw_sbuf *out, int it, const char *s, size_t n)
{
    char *d = strndup(s, n);
    if (!d) abort();
    cJSON *e = ev_at(r, it == IT_MESSAGE ? "response.output_text.delta" : "response.reasoning_text.delta", it, NULL);
    cJSON_AddNumberToObject(e, "content_index", 0);
    cJSON_AddStringToObject(e, "delta", d);
    if (it == IT_MESSAGE) cJSON_AddArrayToObject(e, "logprobs");
    free(d);
    emit(r, out, e);
}

/* Reasoning runs in one item, done when the message starts. Reasoning that
 * comes after the message started (no template writes that) is not relayed:
 * an item once done does not change. */
static void take_reasoning(sw_req *r, sw_sbuf *out, const char *text, size_t n)
{
    sw_resp *s = r->resp;
    if (s->msg_out) return;
    if (!s->rs_out) {
        open_item(r, out, IT_REASONING);
        s->rs_out = s->rs_open = true;
    }
    sw_sbuf_put_n(&s->reasoning, text, n);
    delta(r, out, IT_REASONING, text, n);
}

/* The message opens at its first text that is not blank (a model that
 * only calls functions may write a newline first: that is no message). */
static void take_text(sw_req *r, sw_sbuf *out, const char *text, size_t n)
{
    sw_resp *s = r->resp;
    size_t from = s->msg_out ? s->text.n : 0;
    sw_sbuf_put_n(&s->text, text, n);
    if (!s->msg_out && blank(s->text.s, s->text.n)) return;
    if (!s->msg_out) {
        if (s->rs_open) close_item(r, out, IT_REASONING, "completed");
        s->rs_open = false;
        open_item(r, out, IT_MESSAGE);
        s->msg_out = s->msg_open = true;
    }
    delta(r, out, IT_MESSAGE, s->text.s + from, s->text.n - from);
}

/* A call comes whole from the worker: added, its arguments, done. */
static void take_call(sw_req *r, sw_sbuf *out, int i)
{
    push_item(r->resp, i);
    emit(r, out, ev_at(r, "response.output_item.added", i, item_json(r, i, NULL, "in_progress")));
    cJSON *e = ev_at(r, "response.function_call_arguments.delta", i, NULL);
    cJSON_AddStringToObject(e, "delta", r->calls.v[i].arguments);
    emit(r, out, e);
    e = ev_at(r, "response.function_call_arguments.done", i, NULL);
    cJSON_AddStringToObject(e, "name", r->calls.v[i].name);
    cJSON_AddStringToObject(e, "arguments", r->calls.v[i].arguments);
    emit(r, out, e);
    emit(r, out, ev_at(r, "response.output_item.done", i, item_json(r, i, "", "completed")));
}

static void start(sw_req *r, sw_sbuf *out)
{
    r->resp->started = true;
    const char *types[] = {"response.created", "response.in_progress"};
    for (int i = 0; i < 2; i++) {
        cJSON *e = ev(types[i]);
        cJSON_AddItemToObject(e, "response", response_obj(r, false, NULL, NULL));
        emit(r, out, e);
    }
}

void sw_responses_sse_take(sw_req *r, sw_sbuf *out)
{
    if (!r->resp->started) start(r, out);
    if (r->reasoning.n) take_reasoning(r, out, r->reasoning.s, r->reasoning.n);
    if (r->text.n) take_text(r, out, r->text.s, r->text.n);
    r->reasoning.n = r->text.n = 0;
    while (r->n_calls_sent < r->calls.n) take_call(r, out, (int)r->n_calls_sent++);
}

/* The open items done (a response with no calls has its message, even an
 * empty one), then the response as it ended. */
void sw_responses_sse_final(sw_req *r, sw_sbuf *out)
{
    sw_resp *s = r->resp;
    if (!s->started) start(r, out);
    bool failed = r->finish == SPILLWAY__FINISH_REASON__FINISH_ERROR;
    const char *st = r->finish == SPILLWAY__FINISH_REASON__FINISH_LENGTH || failed ? "incomplete" : "completed";
    if (s->rs_open) close_item(r, out, IT_REASONING, st);
    if (!s->msg_out && !r->calls.n && !failed) {
        open_item(r, out, IT_MESSAGE);
        if (s->text.n) delta(r, out, IT_MESSAGE, s->text.s, s->text.n);
        s->msg_out = s->msg_open = true;
    }
    if (s->msg_open) close_item(r, out, IT_MESSAGE, st);
    s->rs_open = s->msg_open = false;
    const char *status = status_of(r);
    cJSON *e = ev(!strcmp(status, "completed") ? "response.completed"
                  : !strcmp(status, "incomplete") ? "response.incomplete" : "response.failed");
    cJSON_AddItemToObject(e, "response", response_obj(r, true, s->text.s ? s->text.s : "",
                                                      s->reasoning.s ? s->reasoning.s : ""));
    emit(r, out, e);
}
