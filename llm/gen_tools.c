/* The generator's tool calls: gen_calls_init picks the family's format from
 * one table; the answer's call spans become calls (or go back into the
 * answer as text); forced calls (tool_choice) are structured outputs built
 * from the tools. See gen_impl.h. */
#include "llm/gen_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llm/json.h"

/* With tools offered to a chatml model (Qwen2.5, Qwen3, Hermes), the model
 * calls a function by writing <tool_call>{"name": ..., "arguments": {...}}
 * </tool_call> (both markers are tokens of its vocabulary). Such a span of
 * the answer becomes a call: its name and its arguments as JSON text, in the
 * form OpenAI-style servers give them. A span that does not parse as a call
 * goes back into the answer as written, so nothing the model wrote is lost.
 * Llama 3.1 has no markers: an answer that starts with a JSON object (or
 * <|python_tag|>) is held until the end, then taken as calls if it parses
 * as {"name": ..., "parameters": {...}} objects (";" between several), and
 * as text otherwise. Mistral's [TOOL_CALLS] (a token) opens calls that run
 * to the end: a JSON array of {"name": ..., "arguments": {...}} (v3 to v7),
 * or name[ARGS]{...} after each marker (v11). Harmony's calls are its
 * commentary messages (harmony_route). */
/* How each template family with a tool format writes a call: its marker
 * tokens (NULL: none) and how a call is delimited. Harmony's entry is
 * empty: its calls are commentary messages (harmony_route). */
typedef struct {
    const char *open, *close;     /* the markers around a call (chatml: both must exist) */
    const char *args;             /* Mistral v11's [ARGS], between name and arguments */
    bool held;                    /* the open marker starts calls that run to the end (Mistral) */
    bool json;                    /* an answer that starts as JSON is held as calls (Llama 3.1) */
} call_format;

static const call_format FORMATS[SW_CHAT_COUNT] = {
    [SW_CHAT_CHATML] = { .open = "<tool_call>", .close = "</tool_call>" },
    [SW_CHAT_LLAMA3] = { .json = true },
    [SW_CHAT_MISTRAL] = { .open = "[TOOL_CALLS]", .args = "[ARGS]", .held = true },
    [SW_CHAT_MISTRAL_V3_TEKKEN] = { .open = "[TOOL_CALLS]", .args = "[ARGS]", .held = true },
    [SW_CHAT_MISTRAL_V7] = { .open = "[TOOL_CALLS]", .args = "[ARGS]", .held = true },
    [SW_CHAT_MISTRAL_V7_TEKKEN] = { .open = "[TOOL_CALLS]", .args = "[ARGS]", .held = true },
    [SW_CHAT_HARMONY] = { 0 },
};

static int32_t lookup(const sw_tokenizer *tok, const char *text) { return text ? sw_tok_lookup(tok, text) : -1; }

void gen_calls_init(sw_gen *g, sw_chat_template chat, const sw_gen_params *p)
{
    g->call_open = g->call_close = g->python_tag = g->call_args = -1;
    if (p->n_messages == 0 || cJSON_GetArraySize(p->tools) == 0 || !sw_chat_has_tools(chat)) return;
    const call_format *f = &FORMATS[chat];
    g->calls_on = true;
    g->one_call = p->one_call;
    g->call_json = f->json;
    g->call_held = f->held;
    g->python_tag = sw_tok_lookup(g->tok, "<|python_tag|>");
    g->call_args = lookup(g->tok, f->args);
    int32_t open = lookup(g->tok, f->open), close = lookup(g->tok, f->close);
    /* a held format needs its open marker only (gen_init refuses a
     * vocabulary without it); a delimited one, both */
    if (f->held) g->call_open = open;
    else if (open >= 0 && close >= 0) g->call_open = open, g->call_close = close;
}

/* ---- forced calls ------------------------------------------------------------------
 * tool_choice "required" or a named function: the answer must be a call.
 * The call's JSON is a structured output whose schema is built from the
 * tools ({"name": const, "arguments": parameters}, one branch a function);
 * chatml's markers around it are forced tokens. Llama 3.1's call is the
 * JSON alone; Mistral's is [TOOL_CALLS], forced, then an array of calls;
 * gpt-oss's is a commentary message whose header goes into the prompt
 * (forced_harmony). */

/* Moves a function's $defs (or definitions) to the root of the call
 * schema, where its "#/$defs/..." references will look for them. */
static bool hoist_defs(cJSON *root, cJSON *params, char *err, size_t errlen)
{
    static const char *const keys[] = { "$defs", "definitions" };
    for (int k = 0; k < 2; k++) {
        cJSON *defs = cJSON_DetachItemFromObjectCaseSensitive(params, keys[k]);
        if (!defs) continue;
        cJSON *into = cJSON_GetObjectItemCaseSensitive(root, keys[k]);
        if (!into) into = cJSON_AddObjectToObject(root, keys[k]);
        cJSON *d = defs->child;
        while (d) {
            cJSON *next = d->next;
            if (cJSON_GetObjectItemCaseSensitive(into, d->string)) {
                sw_errf(err, errlen, "tool_choice: two functions define %s/%s", keys[k], d->string);
                cJSON_Delete(defs);
                return false;
            }
            cJSON_AddItemToObject(into, d->string, cJSON_DetachItemViaPointer(defs, d));
            d = next;
        }
        cJSON_Delete(defs);
    }
    return true;
}

/* {"anyOf": [{"type": "object", "properties": {"name": {"const": N},
 * ARGS: PARAMETERS}, "required": [...], "additionalProperties": false}]}
 * over the functions tool_choice allows; with array, an array of those
 * (of one, with one). */
static cJSON *call_schema(const cJSON *tools, const char *only, const char *args_key, bool array, bool one,
                          char *err, size_t errlen)
{
    cJSON *root = cJSON_CreateObject(), *one_of = root;
    if (array) {   /* Mistral's: [call, ...] */
        cJSON_AddStringToObject(root, "type", "array");
        cJSON_AddNumberToObject(root, "minItems", 1);
        if (one) cJSON_AddNumberToObject(root, "maxItems", 1);
        one_of = cJSON_AddObjectToObject(root, "items");
    }
    cJSON *alts = cJSON_AddArrayToObject(one_of, "anyOf");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        if (!cJSON_IsString(name) || (only && strcmp(only, name->valuestring))) continue;
        cJSON *one = cJSON_CreateObject(), *props = cJSON_CreateObject(), *nm = cJSON_CreateObject();
        cJSON *a = cJSON_IsObject(params) ? cJSON_Duplicate(params, true) : cJSON_CreateObject();
        if (a && !cJSON_IsObject(params)) cJSON_AddStringToObject(a, "type", "object");
        cJSON_AddItemToArray(alts, one);
        cJSON_AddStringToObject(one, "type", "object");
        cJSON_AddItemToObject(one, "properties", props);
        cJSON_AddItemToObject(props, "name", nm);
        cJSON_AddStringToObject(nm, "const", name->valuestring);
        cJSON_AddItemToObject(props, args_key, a);
        cJSON *req = cJSON_AddArrayToObject(one, "required");
        cJSON_AddItemToArray(req, cJSON_CreateString("name"));
        cJSON_AddItemToArray(req, cJSON_CreateString(args_key));
        cJSON_AddFalseToObject(one, "additionalProperties");
        if (!a || !hoist_defs(root, a, err, errlen)) { cJSON_Delete(root); return NULL; }
    }
    if (cJSON_GetArraySize(alts) == 0) {
        sw_errf(err, errlen, "tool_choice names '%s', which is not among the tools", only ? only : "");
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* gpt-oss: the call's header goes into the prompt ("<|channel|>commentary
 * to=functions.NAME <|constrain|>json<|message|>", as its renderer writes a
 * call), so the output starts inside the call's body: its arguments, held
 * to the function's parameters, then <|call|>, forced. The model chooses
 * the function in the header, which a schema of the body cannot force, so
 * "required" works with one function only. */
static int forced_harmony(sw_gen *g, const sw_gen_params *p, const char *only, char *err, size_t errlen)
{
    const cJSON *t, *fn = NULL;
    int n_tools = 0;
    cJSON_ArrayForEach(t, p->tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name");
        n_tools++;
        if (cJSON_IsString(nm) && (!only || !strcmp(nm->valuestring, only))) fn = f;
    }
    if (!only && n_tools != 1) {
        sw_errf(err, errlen, "tool_choice: \"required\" with %d functions cannot be forced in gpt-oss's format "
                "(it names the function in a header): name one", n_tools);
        return 400;
    }
    if (!fn) { sw_errf(err, errlen, "tool_choice names '%s', which is not among the tools", only); return 400; }
    const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    cJSON *any = cJSON_IsObject(params) ? NULL : cJSON_Parse("{\"type\":\"object\"}");
    char why[256];
    sw_js_free(g->js);
    g->js = sw_js_compile(cJSON_IsObject(params) ? params : any, why, sizeof why);
    cJSON_Delete(any);
    if (!g->js) { sw_errf(err, errlen, "tool_choice: the function's parameters: %s", why); return 400; }
    sw_js_start(g->js, &g->js_st);
    char head[SW_MAX_TOOL_NAME + 96];
    snprintf(head, sizeof head, "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>", name);
    int32_t *ids;
    int n = gen_encode(g->tok, head, false, true, &ids, err, errlen);
    if (n < 0) return 400;
    int32_t *grown = realloc(g->prompt, (size_t)(g->n_prompt + n) * sizeof *grown);
    if (!grown) { free(ids); sw_errf(err, errlen, "out of memory"); return 400; }
    memcpy(grown + g->n_prompt, ids, (size_t)n * sizeof *ids);
    free(ids);
    g->prompt = grown;
    g->n_prompt += n;
    if (g->n_prompt >= g->n_ctx) {
        sw_errf(err, errlen, "prompt of %d tokens fills the context length %d", g->n_prompt, g->n_ctx);
        return 400;
    }
    snprintf(g->h_to, sizeof g->h_to, "%s", name);
    g->call_text.n = 0;
    g->r_state = H_CALL;
    g->call_close = sw_tok_lookup(g->tok, "<|call|>");
    g->forced = FC_BODY;
    return 0;
}

/* Whether tool_choice forces a call: "required" any tool (*only NULL), a
 * name that function (*only); NULL, "" and "auto" force none. */
static bool forces_call(const char *tool_choice, const char **only)
{
    if (!tool_choice || !*tool_choice || !strcmp(tool_choice, "auto")) return false;
    *only = strcmp(tool_choice, "required") ? tool_choice : NULL;
    return true;
}

bool sw_gen_check_forced(const cJSON *tools, const char *tool_choice, char *err, size_t errlen)
{
    const char *only;
    if (!forces_call(tool_choice, &only)) return true;
    cJSON *schema = call_schema(tools, only, "arguments", false, false, err, errlen);
    if (!schema) return false;
    char why[256];
    bool ok = sw_js_check(schema, why, sizeof why);
    cJSON_Delete(schema);
    if (!ok) sw_errf(err, errlen, "tool_choice: a function's parameters: %s", why);
    return ok;
}

int gen_forced_init(sw_gen *g, sw_chat_template chat, const sw_gen_params *p, char *err, size_t errlen)
{
    const char *only;
    if (!forces_call(p->tool_choice, &only)) return 0;
    if (g->calls_on && g->r_mode == R_HARMONY) return forced_harmony(g, p, only, err, errlen);
    if (!g->calls_on || (!g->call_json && g->call_open < 0)) {
        sw_errf(err, errlen, "tool_choice: forcing a call is not supported for this model's chat format "
                "(chatml with <tool_call> tokens, Llama 3.1, Mistral and gpt-oss are)");
        return 400;
    }
    cJSON *schema = call_schema(p->tools, only, g->call_json ? "parameters" : "arguments", g->call_held,
                                p->one_call, err, errlen);
    if (!schema) return 400;
    char why[256];
    sw_js_free(g->js);   /* the call is the answer: a response_format gives way */
    g->js = sw_js_compile(schema, why, sizeof why);
    cJSON_Delete(schema);
    if (!g->js) { sw_errf(err, errlen, "tool_choice: a function's parameters: %s", why); return 400; }
    sw_js_start(g->js, &g->js_st);
    g->forced = g->call_json ? FC_BODY : FC_OPEN;
    return 0;
}

/* Adds a call to this step's calls, taking nm and a (either may be NULL:
 * out of memory); false if it could not. */
static bool push_call(sw_gen *g, char *nm, char *a)
{
    bool ok = nm && a && sw_tool_calls_add(&g->calls, nm, a);
    g->n_calls_total += ok;
    free(nm);
    free(a);
    return ok;
}

/* A chatml span's JSON as a call, added to this step's calls; false if it
 * is not one ({"name": NAME, "arguments": {...}}). */
static bool take_call(sw_gen *g, const char *json, size_t n)
{
    cJSON *o = cJSON_ParseWithLength(json, n);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    bool ok = cJSON_IsObject(o) && cJSON_IsString(name) && sw_tool_name_valid(name->valuestring) &&
              (!args || cJSON_IsObject(args)) &&
              push_call(g, strdup(name->valuestring), args ? sw_json_dumps(args) : strdup("{}"));
    cJSON_Delete(o);
    return ok;
}

/* A Llama 3.1 answer held as calls: every JSON object in it a call, else
 * none (it is text). The objects are checked before any is taken. */
static bool take_json_calls(sw_gen *g, const char *s, size_t n)
{
    for (int pass = 0; pass < 2; pass++) {
        const char *p = s, *end = s + n;
        int found = 0;
        for (;;) {
            /* ";" between Llama's calls; "[", "," and "]" around Mistral's */
            while (p < end && (sw_is_space(*p) || *p == ';' || *p == ',' || *p == '[' || *p == ']')) p++;
            if (p == end) break;
            const char *stop = NULL;
            cJSON *o = cJSON_ParseWithLengthOpts(p, (size_t)(end - p), &stop, false);
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
            if (!args) args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
            bool ok = cJSON_IsObject(o) && cJSON_IsString(name) && sw_tool_name_valid(name->valuestring) &&
                      (!args || cJSON_IsObject(args));
            if (ok && pass == 1 && !(g->one_call && found > 0))   /* one call: the others are dropped */
                push_call(g, strdup(name->valuestring), args ? sw_json_dumps(args) : strdup("{}"));
            cJSON_Delete(o);
            if (!ok || !stop) return false;
            p = stop;
            found++;
        }
        if (!found) return false;
    }
    return true;
}

/* A harmony call's message is its arguments: in json.dumps form when they
 * parse as an object, else as the model wrote them (OpenAI's arguments are
 * the model's text, valid JSON or not). */
/* Mistral's held calls: a JSON array (take_json_calls), or v11's
 * "name[ARGS]{...}" parts between [TOOL_CALLS] markers (answer_text wrote
 * the markers' text in). All become calls, or none. */
static bool take_mistral_calls(sw_gen *g, const char *s, size_t n)
{
    if (!memmem(s, n, "[ARGS]", 6)) return take_json_calls(g, s, n);
    for (int pass = 0; pass < 2; pass++) {
        const char *p = s, *end = s + n;
        int found = 0;
        while (p < end) {
            const char *next = memmem(p, (size_t)(end - p), "[TOOL_CALLS]", 12);
            const char *part_end = next ? next : end;
            const char *args = memmem(p, (size_t)(part_end - p), "[ARGS]", 6);
            if (!args) return false;
            const char *a = p, *b = args;
            while (a < b && sw_is_space(*a)) a++;
            while (b > a && sw_is_space(b[-1])) b--;
            char name[SW_MAX_TOOL_NAME + 1];
            if (b == a || (size_t)(b - a) > SW_MAX_TOOL_NAME) return false;
            memcpy(name, a, (size_t)(b - a));
            name[b - a] = 0;
            cJSON *o = cJSON_ParseWithLength(args + 6, (size_t)(part_end - args - 6));
            bool ok = cJSON_IsObject(o) && sw_tool_name_valid(name);
            if (ok && pass == 1 && !(g->one_call && found > 0)) push_call(g, strdup(name), sw_json_dumps(o));
            cJSON_Delete(o);
            if (!ok) return false;
            found++;
            p = next ? next + 12 : end;
        }
    }
    return true;
}

void gen_harmony_call_done(sw_gen *g)
{
    const char *t = g->call_text.s ? g->call_text.s : "";
    cJSON *o = cJSON_ParseWithLength(t, g->call_text.n);
    push_call(g, strdup(g->h_to), cJSON_IsObject(o) ? sw_json_dumps(o) : strndup(t, g->call_text.n));
    cJSON_Delete(o);
    g->call_text.n = 0;
    g->r_state = H_NONE;
}

/* Llama 3.1's side of answer_text: until the answer has begun, <|python_tag|>
 * or a "{" starts a held call; text is text from then on. */
static bool answer_json(sw_gen *g, int32_t token, const char *s, size_t n)
{
    if (g->in_call) {
        sw_sbuf_put_n(&g->call_text, s, n);
        return !g->call_text.oom;
    }
    if (!g->answer_begun) {
        size_t k = 0;
        while (k < n && sw_is_space(s[k])) k++;
        if (token == g->python_tag || (k < n && s[k] == '{')) {
            g->in_call = true;
            g->call_text.n = 0;
            if (token == g->python_tag) return true;
            sw_sbuf_put_n(&g->call_text, s + k, n - k);
            return !g->call_text.oom && gen_add_text(g, TO_ANSWER, s, k);
        }
        g->answer_begun = k < n;
    }
    return gen_add_text(g, TO_ANSWER, s, n);
}

/* The answer's side of a token (after routing): markers and a call's JSON
 * are kept from the answer. Returns false when out of memory. */
bool gen_answer_text(sw_gen *g, int32_t token, const char *s, size_t n)
{
    if (g->call_json) return answer_json(g, token, s, n);
    if (g->call_open < 0) return gen_add_text(g, TO_ANSWER, s, n);
    if (!g->in_call && token == g->call_open) {
        g->in_call = true;
        g->call_text.n = 0;
        return true;
    }
    if (!g->in_call) return gen_add_text(g, TO_ANSWER, s, n);
    if (g->call_held && (token == g->call_open || token == g->call_args)) {   /* v11's markers, as text */
        sw_sbuf_put(&g->call_text, token == g->call_open ? "[TOOL_CALLS]" : "[ARGS]");
        return !g->call_text.oom;
    }
    if (token == g->call_close) {
        g->in_call = false;
        const char *j = g->call_text.s ? g->call_text.s : "";
        if (take_call(g, j, g->call_text.n)) return true;
        return gen_add_text(g, TO_ANSWER, "<tool_call>", 11) && gen_add_text(g, TO_ANSWER, j, g->call_text.n) &&
               gen_add_text(g, TO_ANSWER, "</tool_call>", 12);
    }
    sw_sbuf_put_n(&g->call_text, s, n);
    return !g->call_text.oom;
}

/* When generation ends: Llama 3.1's held answer becomes calls if it
 * parses as such; a call left open is text, as written. */
void gen_unfinished_call(sw_gen *g)
{
    if (!g->in_call) return;
    g->in_call = false;
    const char *t = g->call_text.s ? g->call_text.s : "";
    if (g->call_json && take_json_calls(g, t, g->call_text.n)) return;
    if (g->call_held && take_mistral_calls(g, t, g->call_text.n)) return;
    if (g->call_held) gen_add_text(g, TO_ANSWER, "[TOOL_CALLS]", 12);
    else if (!g->call_json) gen_add_text(g, TO_ANSWER, "<tool_call>", 11);
    gen_add_text(g, TO_ANSWER, t, g->call_text.n);
}
