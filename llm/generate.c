/* Per-sequence generation: prompt building, sampling, streaming text with
 * stop strings, finish conditions. See generate.h. */
#include "llm/gen_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include "llm/json.h"
#include "llm/text.h"
#include "llm/util.h"

/* Encodes text into a malloc'd token list. */
static int encode_alloc(const sw_tokenizer *tok, const char *text, bool add_bos, bool special,
                        int32_t **out, char *err, size_t errlen)
{
    size_t len = strlen(text);
    int cap = (int)(len < (1u << 26) ? len + 8 : (1u << 26));
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) { sw_errf(err, errlen, "out of memory"); return -1; }
    int n = sw_tok_encode(tok, text, len, add_bos, special, ids, cap);
    if (n < 0) {   /* the tokenizer says how many it needs */
        cap = -n;
        int32_t *p = realloc(ids, (size_t)cap * sizeof *ids);
        if (!p) { free(ids); sw_errf(err, errlen, "out of memory"); return -1; }
        ids = p;
        n = sw_tok_encode(tok, text, len, add_bos, special, ids, cap);
        if (n < 0) { free(ids); sw_errf(err, errlen, "tokenizer failed"); return -1; }
    }
    *out = ids;
    return n;
}

static int build_prompt(sw_gen *g, sw_chat_template chat, const sw_gen_params *p, char *err, size_t errlen)
{
    const sw_tokenizer *tok = g->tok;
    if (p->n_messages > 0) {
        for (size_t i = 0; i < p->n_messages; i++) {
            if (!p->messages[i].role || !p->messages[i].content) {
                sw_errf(err, errlen, "message %zu has no role or content", i);
                return 400;
            }
        }
        if (cJSON_GetArraySize(p->tools) > 0 && !sw_chat_has_tools(chat)) {
            sw_errf(err, errlen, "this model's chat template (%s) has no tool-calling format", sw_chat_name(chat));
            return 400;
        }
        char *text = sw_chat_format(chat, p->messages, p->n_messages,
                                    &(sw_chat_opts){ .effort = p->effort, .tools = p->tools });
        if (!text) { sw_errf(err, errlen, "cannot format chat messages"); return 400; }
        /* The template's own markers (<|im_start|> ...) are special tokens. */
        g->n_prompt = encode_alloc(tok, text, sw_tok_add_bos(tok), true, &g->prompt, err, errlen);
        free(text);
        if (g->n_prompt < 0) return 400;
    } else if (p->n_prompt_ids > 0) {
        if (p->n_prompt_ids > (size_t)g->n_ctx) {
            sw_errf(err, errlen, "prompt of %zu tokens exceeds the context length %d", p->n_prompt_ids, g->n_ctx);
            return 400;
        }
        g->prompt = malloc(p->n_prompt_ids * sizeof *g->prompt);
        if (!g->prompt) { sw_errf(err, errlen, "out of memory"); return 400; }
        for (size_t i = 0; i < p->n_prompt_ids; i++) {
            if (p->prompt_ids[i] < 0 || p->prompt_ids[i] >= g->n_vocab) {
                sw_errf(err, errlen, "prompt token %zu: id %d out of range (vocabulary %d)", i, p->prompt_ids[i], g->n_vocab);
                return 400;
            }
            g->prompt[i] = p->prompt_ids[i];
        }
        g->n_prompt = (int)p->n_prompt_ids;
    } else {
        /* Plain completion text: user text, so no special-token parsing. */
        g->n_prompt = encode_alloc(tok, p->prompt ? p->prompt : "", sw_tok_add_bos(tok), false,
                                   &g->prompt, err, errlen);
        if (g->n_prompt < 0) return 400;
    }
    if (g->n_prompt == 0) { sw_errf(err, errlen, "empty prompt"); return 400; }
    if (g->n_prompt > g->n_ctx) {
        sw_errf(err, errlen, "prompt of %d tokens exceeds the context length %d", g->n_prompt, g->n_ctx);
        return 400;
    }
    return 0;
}

/* ---- reasoning ---------------------------------------------------------------
 * Reasoning models write their thinking before the answer, and a client wants
 * the two apart (OpenAI-style APIs: message.reasoning_content). Each token's
 * text goes to the answer, to the reasoning, or nowhere (the markers):
 *   - think chats (DeepSeek R1, Qwen3, any vocabulary with <think> and
 *     </think> tokens): text between the markers is reasoning. R1's template
 *     opens <think> in the prompt, so its output starts inside; elsewhere a
 *     first token <think> opens it. The answer's leading whitespace (the
 *     "\n\n" after </think>) is dropped.
 *   - harmony chats (gpt-oss): a message names its channel,
 *     <|channel|>analysis<|message|>...<|end|>; analysis is reasoning, final
 *     the answer, a commentary message to=functions.NAME a function call
 *     (when tools were offered), anything else neither. */
enum { R_OFF, R_THINK, R_HARMONY };
enum { T_START, T_IN, T_LEAD, T_ANSWER };                /* think chats */
enum { H_HEADER, H_CHANNEL, H_ANSWER, H_REASON, H_CALL, H_NONE }; /* harmony chats */
typedef enum { TO_ANSWER, TO_REASONING, TO_CALL, TO_NONE } text_dest;

static void reasoning_init(sw_gen *g, sw_chat_template chat, const sw_gen_params *p)
{
    g->r_mode = R_OFF;
    if (p->n_messages == 0) return;   /* plain completions: the caller's own text format */
    if (chat == SW_CHAT_HARMONY) {
        g->h_start = sw_tok_lookup(g->tok, "<|start|>");
        g->h_end = sw_tok_lookup(g->tok, "<|end|>");
        g->h_channel = sw_tok_lookup(g->tok, "<|channel|>");
        g->h_message = sw_tok_lookup(g->tok, "<|message|>");
        if (g->h_start >= 0 && g->h_end >= 0 && g->h_channel >= 0 && g->h_message >= 0) {
            g->r_mode = R_HARMONY;
            g->r_state = H_HEADER;
        }
        return;
    }
    g->think_open = sw_tok_lookup(g->tok, "<think>");
    g->think_close = sw_tok_lookup(g->tok, "</think>");
    if (g->think_open >= 0 && g->think_close >= 0) {
        g->r_mode = R_THINK;
        g->r_state = chat == SW_CHAT_DEEPSEEK_R1 ? T_IN : T_START;
    }
}

/* Where the text of a think chat's token goes. */
static text_dest think_route(sw_gen *g, int32_t token, const char **piece, size_t *n)
{
    bool marker = false;
    if (g->r_state == T_START) {
        marker = token == g->think_open;
        g->r_state = marker ? T_IN : T_ANSWER;
    } else if (g->r_state == T_IN && token == g->think_close) {
        marker = true;
        g->r_state = T_LEAD;
    }
    if (marker) {   /* counted with the reasoning, its text shown nowhere */
        *n = 0;
        return TO_REASONING;
    }
    if (g->r_state == T_IN) return TO_REASONING;
    if (g->r_state == T_LEAD) {
        while (*n && sw_is_space(**piece)) ++*piece, --*n;
        if (*n) g->r_state = T_ANSWER;
    }
    return TO_ANSWER;
}

/* Appends to a fixed header buffer; what does not fit is dropped. */
static void head_put(char *buf, size_t cap, size_t *len, const char *s, size_t n)
{
    size_t take = n < cap - 1 - *len ? n : cap - 1 - *len;
    memcpy(buf + *len, s, take);
    *len += take;
    buf[*len] = 0;
}

/* The function a header addresses ("to=functions.NAME", in the role part
 * or the channel part) into h_to; false if none. */
static bool harmony_recipient(sw_gen *g)
{
    const char *parts[2] = { g->h_role, g->h_chan };
    for (int k = 0; k < 2; k++) {
        const char *t = strstr(parts[k], "to=functions.");
        if (!t) continue;
        t += strlen("to=functions.");
        size_t n = strcspn(t, " <");
        if (n == 0 || n > SW_MAX_TOOL_NAME) return false;
        memcpy(g->h_to, t, n);
        g->h_to[n] = 0;
        return sw_tool_name_valid(g->h_to);
    }
    return false;
}

static void harmony_call_done(sw_gen *g);

/* What a message whose header is complete (<|message|>) is. */
static int harmony_open(sw_gen *g)
{
    const char *c = g->h_chan;
    while (*c == ' ') c++;
    if (g->r_state != H_CHANNEL || !strncmp(c, "final", 5)) return H_ANSWER;
    if (!strncmp(c, "analysis", 8)) return H_REASON;
    if (g->calls_on && !strncmp(c, "commentary", 10) && harmony_recipient(g)) {
        g->call_text.n = 0;
        return H_CALL;
    }
    return H_NONE;
}

/* Where the text of a harmony chat's token goes: after "<|start|>assistant"
 * the model may name a recipient, names a channel, then writes after
 * <|message|> up to <|end|> (<|call|> after a call, <|return|> at the end). */
static text_dest harmony_route(sw_gen *g, int32_t token, const char *piece, size_t *n)
{
    if (token == g->h_channel) {
        g->r_state = H_CHANNEL;
        g->h_n_chan = 0;
        g->h_chan[0] = 0;
    } else if (token == g->h_message) {
        g->r_state = harmony_open(g);
    } else if (token == g->h_start || token == g->h_end) {
        if (g->r_state == H_CALL) harmony_call_done(g);
        g->r_state = H_HEADER;
        g->h_n_role = g->h_n_chan = 0;
        g->h_role[0] = g->h_chan[0] = 0;
    } else if (g->r_state == H_HEADER) {
        head_put(g->h_role, sizeof g->h_role, &g->h_n_role, piece, *n);
    } else if (g->r_state == H_CHANNEL) {
        head_put(g->h_chan, sizeof g->h_chan, &g->h_n_chan, piece, *n);
    } else if (g->r_state == H_ANSWER || g->r_state == H_REASON || g->r_state == H_CALL) {
        return g->r_state == H_ANSWER ? TO_ANSWER : g->r_state == H_REASON ? TO_REASONING : TO_CALL;
    }
    *n = 0;
    return TO_NONE;
}

/* Where this token's text (*piece, *n bytes; both may be trimmed) goes. */
static text_dest route(sw_gen *g, int32_t token, const char **piece, size_t *n)
{
    if (g->r_mode == R_THINK) return think_route(g, token, piece, n);
    if (g->r_mode == R_HARMONY) return harmony_route(g, token, *piece, n);
    return TO_ANSWER;
}

/* Where text goes now, without a token: the detokenizer's last bytes. */
static text_dest current_dest(const sw_gen *g)
{
    if (g->r_mode == R_THINK) return g->r_state == T_IN ? TO_REASONING : TO_ANSWER;
    if (g->r_mode == R_HARMONY)
        return g->r_state == H_ANSWER ? TO_ANSWER : g->r_state == H_REASON ? TO_REASONING
             : g->r_state == H_CALL ? TO_CALL : TO_NONE;
    return TO_ANSWER;
}

/* ---- tool calls ----------------------------------------------------------------
 * With tools offered to a chatml model (Qwen2.5, Qwen3, Hermes), the model
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
static void calls_init(sw_gen *g, sw_chat_template chat, const sw_gen_params *p)
{
    g->call_open = g->call_close = g->python_tag = g->call_args = -1;
    if (p->n_messages == 0 || cJSON_GetArraySize(p->tools) == 0 || !sw_chat_has_tools(chat)) return;
    g->calls_on = true;
    g->one_call = p->one_call;
    g->call_json = chat == SW_CHAT_LLAMA3;
    g->python_tag = sw_tok_lookup(g->tok, "<|python_tag|>");
    if (sw_chat_is_mistral(chat)) {
        g->call_open = sw_tok_lookup(g->tok, "[TOOL_CALLS]");
        g->call_args = sw_tok_lookup(g->tok, "[ARGS]");
        g->call_held = true;
        return;
    }
    if (chat != SW_CHAT_CHATML) return;
    int32_t open = sw_tok_lookup(g->tok, "<tool_call>"), close = sw_tok_lookup(g->tok, "</tool_call>");
    if (open >= 0 && close >= 0) g->call_open = open, g->call_close = close;
}

/* ---- forced calls ------------------------------------------------------------------
 * tool_choice "required" or a named function: the answer must be a call.
 * The call's JSON is a structured output whose schema is built from the
 * tools ({"name": const, "arguments": parameters}, one branch a function);
 * chatml's markers around it are forced tokens. Llama 3.1's call is the
 * JSON alone; Mistral's is [TOOL_CALLS], forced, then an array of calls;
 * gpt-oss's is a commentary message whose header goes into the prompt
 * (forced_harmony). */
enum { FC_NONE, FC_OPEN, FC_BODY, FC_CLOSE };

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
    int n = encode_alloc(g->tok, head, false, true, &ids, err, errlen);
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

static int forced_init(sw_gen *g, sw_chat_template chat, const sw_gen_params *p, char *err, size_t errlen)
{
    if (!p->tool_choice || !*p->tool_choice || !strcmp(p->tool_choice, "auto")) return 0;
    const char *only = strcmp(p->tool_choice, "required") ? p->tool_choice : NULL;
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

static void harmony_call_done(sw_gen *g)
{
    const char *t = g->call_text.s ? g->call_text.s : "";
    cJSON *o = cJSON_ParseWithLength(t, g->call_text.n);
    push_call(g, strdup(g->h_to), cJSON_IsObject(o) ? sw_json_dumps(o) : strndup(t, g->call_text.n));
    cJSON_Delete(o);
    g->call_text.n = 0;
    g->r_state = H_NONE;
}

static bool add_text(sw_gen *g, text_dest to, const char *s, size_t n);

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
            return !g->call_text.oom && add_text(g, TO_ANSWER, s, k);
        }
        g->answer_begun = k < n;
    }
    return add_text(g, TO_ANSWER, s, n);
}

/* The answer's side of a token (after routing): markers and a call's JSON
 * are kept from the answer. Returns false when out of memory. */
static bool answer_text(sw_gen *g, int32_t token, const char *s, size_t n)
{
    if (g->call_json) return answer_json(g, token, s, n);
    if (g->call_open < 0) return add_text(g, TO_ANSWER, s, n);
    if (!g->in_call && token == g->call_open) {
        g->in_call = true;
        g->call_text.n = 0;
        return true;
    }
    if (!g->in_call) return add_text(g, TO_ANSWER, s, n);
    if (g->call_held && (token == g->call_open || token == g->call_args)) {   /* v11's markers, as text */
        sw_sbuf_put(&g->call_text, token == g->call_open ? "[TOOL_CALLS]" : "[ARGS]");
        return !g->call_text.oom;
    }
    if (token == g->call_close) {
        g->in_call = false;
        const char *j = g->call_text.s ? g->call_text.s : "";
        if (take_call(g, j, g->call_text.n)) return true;
        return add_text(g, TO_ANSWER, "<tool_call>", 11) && add_text(g, TO_ANSWER, j, g->call_text.n) &&
               add_text(g, TO_ANSWER, "</tool_call>", 12);
    }
    sw_sbuf_put_n(&g->call_text, s, n);
    return !g->call_text.oom;
}

/* When generation ends: Llama 3.1's held answer becomes calls if it
 * parses as such; a call left open is text, as written. */
static void unfinished_call(sw_gen *g)
{
    if (!g->in_call) return;
    g->in_call = false;
    const char *t = g->call_text.s ? g->call_text.s : "";
    if (g->call_json && take_json_calls(g, t, g->call_text.n)) return;
    if (g->call_held && take_mistral_calls(g, t, g->call_text.n)) return;
    if (g->call_held) add_text(g, TO_ANSWER, "[TOOL_CALLS]", 12);
    else if (!g->call_json) add_text(g, TO_ANSWER, "<tool_call>", 11);
    add_text(g, TO_ANSWER, t, g->call_text.n);
}

static void token_bytes(const sw_gen *g, int32_t id, sw_token_logprob *t);

/* ---- the prompt's log probabilities ------------------------------------------------
 * A prompt token's entry carries the bytes the prompt's text gets from it,
 * decoded in order from the start, so that the entries' bytes add up to
 * the text (a character split across tokens lands whole in its last one). */
static void plp_put_bytes(sw_gen *g, sw_token_logprob *t, int32_t id, bool last)
{
    char buf[512];
    size_t n = sw_detok_push(&g->plp_detok, id, buf, sizeof buf);
    if (last) n += sw_detok_flush(&g->plp_detok, buf + n, sizeof buf - n);
    t->id = id;
    t->n_bytes = (uint8_t)(n < sizeof t->bytes ? n : sizeof t->bytes);
    memcpy(t->bytes, buf, t->n_bytes);
}

/* echo: the prompt decoded from its start, as the prompt's log
 * probabilities' bytes add up (BOS and other control tokens give none). */
static bool echo_init(sw_gen *g)
{
    sw_detok d;
    sw_detok_init(&d, g->tok, true);
    char buf[512];
    for (int i = 0; i < g->n_prompt; i++) {
        size_t n = sw_detok_push(&d, g->prompt[i], buf, sizeof buf);
        sw_sbuf_put_n(&g->echo, buf, n);
    }
    size_t n = sw_detok_flush(&d, buf, sizeof buf);
    sw_sbuf_put_n(&g->echo, buf, n);
    sw_sbuf_put_n(&g->echo, "", 0);   /* an empty prompt still gives a buffer */
    return !g->echo.oom && g->echo.s;
}

void sw_gen_prompt_logprob(sw_gen *g, int p, const float *row, int32_t n_logits)
{
    if (!sw_gen_wants_prompt_row(g, p) || p + 1 != g->n_plp) return;
    int32_t n = n_logits < g->n_vocab ? n_logits : g->n_vocab;
    sw_logprob *e = &g->plp[p + 1];
    int32_t ids[SW_MAX_TOP_LOGPROBS];
    float lps[SW_MAX_TOP_LOGPROBS];
    float lp = sw_logprobs(row, n, g->prompt[p + 1], g->lp_k, ids, lps);
    e->chosen.logprob = lp <= 0.0f ? lp : -9999.0f;   /* NaN, from a broken model, as vLLM writes -inf */
    plp_put_bytes(g, &e->chosen, g->prompt[p + 1], p + 2 == g->n_prompt);
    e->n_top = g->lp_k < n ? g->lp_k : n;
    for (int j = 0; j < e->n_top; j++) {
        e->top[j].logprob = lps[j] <= 0.0f ? lps[j] : -9999.0f;
        token_bytes(g, ids[j], &e->top[j]);
    }
    g->n_plp = p + 2;
}

static int gen_init(sw_gen *g, const sw_tokenizer *tok, sw_chat_template chat,
                    const sw_gen_params *p, int n_ctx, char *err, size_t errlen)
{
    memset(g, 0, sizeof *g);
    g->tok = tok;
    g->n_ctx = n_ctx;
    g->n_vocab = sw_tok_n_vocab(tok);
    g->max_tokens = p->max_tokens;
    sw_sampler_init(&g->sampler, &p->sampling);
    if (n_ctx < 1) { sw_errf(err, errlen, "context length %d", n_ctx); return 400; }
    for (int32_t i = 0; i < p->sampling.n_bias; i++) {
        if (p->sampling.bias_ids[i] < 0 || p->sampling.bias_ids[i] >= g->n_vocab) {
            sw_errf(err, errlen, "logit_bias: token %u is not in the vocabulary (%d tokens)",
                    (unsigned)p->sampling.bias_ids[i], g->n_vocab);
            return 400;
        }
    }
    if (p->n_stop > SW_MAX_STOPS) {
        sw_errf(err, errlen, "%zu stop strings (at most %d)", p->n_stop, SW_MAX_STOPS);
        return 400;
    }
    for (size_t i = 0; i < p->n_stop; i++) {
        const char *s = p->stop[i];
        if (!s || !*s) continue;   /* an empty stop string would match everywhere: ignore it */
        if (strlen(s) > SW_MAX_STOP_LEN) {
            sw_errf(err, errlen, "stop string %zu longer than %d bytes", i, SW_MAX_STOP_LEN);
            return 400;
        }
        if (!(g->stop[g->n_stop++] = strdup(s))) { sw_errf(err, errlen, "out of memory"); return 400; }
    }
    int rc = build_prompt(g, chat, p, err, errlen);
    if (rc) return rc;
    reasoning_init(g, chat, p);
    calls_init(g, chat, p);
    if (g->calls_on && g->call_held && g->call_open < 0) {
        sw_errf(err, errlen, "this model's vocabulary has no [TOOL_CALLS] token: Mistral's tool format is v3's and later");
        return 400;
    }
    if (p->top_logprobs < 0 || p->top_logprobs > SW_MAX_TOP_LOGPROBS) {
        sw_errf(err, errlen, "top_logprobs %d (0 to %d)", p->top_logprobs, SW_MAX_TOP_LOGPROBS);
        return 400;
    }
    g->lp_on = p->logprobs || p->top_logprobs > 0;
    g->lp_k = p->top_logprobs;
    if (p->echo && !echo_init(g)) { sw_errf(err, errlen, "out of memory"); return 400; }
    if (p->prompt_logprobs) {
        if (!(g->plp = calloc((size_t)g->n_prompt, sizeof *g->plp))) { sw_errf(err, errlen, "out of memory"); return 400; }
        sw_detok_init(&g->plp_detok, tok, true);   /* the prompt's text from its start */
        plp_put_bytes(g, &g->plp[0].chosen, g->prompt[0], g->n_prompt == 1);
        g->n_plp = 1;
    }
    if (p->json_schema) {
        char why[256];
        if (!(g->js = sw_js_compile(p->json_schema, why, sizeof why))) {
            sw_errf(err, errlen, "response_format: %s", why);
            return 400;
        }
        sw_js_start(g->js, &g->js_st);
    }
    if ((rc = forced_init(g, chat, p, err, errlen))) return rc;
    for (int i = 0; i < g->n_prompt; i++) sw_sampler_accept(&g->sampler, g->prompt[i]);

    /* Text that starts a document (prompt is just BOS) should not begin
     * with SentencePiece's dummy-prefix space; a continuation keeps it. */
    bool only_bos = g->n_prompt == 1 && g->prompt[0] == sw_tok_bos(tok);
    sw_detok_init(&g->detok, tok, only_bos);
    /* the deltas are never NULL, even empty */
    if (!sw_sbuf_reserve(&g->out, 0) || !sw_sbuf_reserve(&g->held, 0) || !sw_sbuf_reserve(&g->reasoning, 0)) {
        sw_errf(err, errlen, "out of memory");
        return 400;
    }
    g->out.s[0] = 0;
    g->reasoning.s[0] = 0;
    return 0;
}

int sw_gen_init(sw_gen *g, const sw_tokenizer *tok, sw_chat_template chat,
                const sw_gen_params *p, int n_ctx, char *err, size_t errlen)
{
    int rc = gen_init(g, tok, chat, p, n_ctx, err, errlen);
    if (rc) sw_gen_free(g);   /* a failed init leaves nothing to free */
    return rc;
}

sw_gen *sw_gen_new(const sw_tokenizer *tok, sw_chat_template chat, const sw_gen_params *p, int n_ctx,
                   char *err, size_t errlen)
{
    sw_gen *g = malloc(sizeof *g);
    if (!g) { sw_errf(err, errlen, "out of memory"); return NULL; }
    if (sw_gen_init(g, tok, chat, p, n_ctx, err, errlen)) { free(g); return NULL; }
    return g;
}

void sw_gen_delete(sw_gen *g)
{
    if (!g) return;
    sw_gen_free(g);
    free(g);
}

const int32_t *sw_gen_prompt(const sw_gen *g, int *n)
{
    *n = g->n_prompt;
    return g->prompt;
}

int sw_gen_n_prompt(const sw_gen *g) { return g->n_prompt; }
uint32_t sw_gen_n_generated(const sw_gen *g) { return g->n_generated; }
uint32_t sw_gen_n_reasoning_tokens(const sw_gen *g) { return g->n_reasoning_tokens; }
int sw_gen_next_pos(const sw_gen *g) { return g->n_prompt + (int)g->n_generated - 1; }
const sw_sampling_params *sw_gen_sampling(const sw_gen *g) { return &g->sampler.p; }
const char *sw_gen_error(const sw_gen *g) { return g->error ? g->error : SW_GEN_NAN_ERROR; }
const sw_logprob *sw_gen_logprob(const sw_gen *g) { return g->lp_valid ? &g->lp : NULL; }

/* A forced call and a schema mask the row; log probabilities read it raw. */
bool sw_gen_sampling_is_plain(const sw_gen *g, int32_t device_vocab)
{
    return sw_sampler_is_plain(&g->sampler.p) && g->n_vocab == device_vocab && !g->lp_on && !g->js && !g->forced;
}

bool sw_gen_scores_prompt(const sw_gen *g) { return g->plp != NULL; }
bool sw_gen_wants_prompt_row(const sw_gen *g, int p) { return g->plp && p < g->n_prompt - 1; }

const sw_logprob *sw_gen_prompt_logprobs(const sw_gen *g, size_t *n)
{
    *n = g->plp ? (size_t)g->n_plp : 0;
    return g->plp;
}

const char *sw_gen_reasoning(const sw_gen *g, size_t *len)
{
    if (len) *len = g->reasoning.n;
    return g->reasoning.s ? g->reasoning.s : "";
}

const sw_tool_call *sw_gen_tool_calls(const sw_gen *g, size_t *n)
{
    *n = g->calls.n;
    return g->calls.v;
}

void sw_gen_free(sw_gen *g)
{
    sw_sampler_free(&g->sampler);
    free(g->prompt);
    for (size_t i = 0; i < g->n_stop; i++) free(g->stop[i]);
    sw_sbuf_free(&g->held);
    sw_sbuf_free(&g->out);
    sw_sbuf_free(&g->reasoning);
    sw_tool_calls_free(&g->calls);
    free(g->call_text.s);
    free(g->lp_row);
    free(g->plp);
    free(g->echo.s);
    sw_js_free(g->js);
    memset(g, 0, sizeof *g);
}

/* A token's id and bytes into a logprob entry. */
static void token_bytes(const sw_gen *g, int32_t id, sw_token_logprob *t)
{
    t->id = id;
    t->n_bytes = (uint8_t)sw_tok_piece(g->tok, id, t->bytes, sizeof t->bytes);
}

/* ---- structured output ---------------------------------------------------------
 * With a schema, the answer's bytes must keep to it (llm/json_schema.h).
 * Reasoning is free: a think chat's thinking, a harmony chat's analysis,
 * and harmony headers are not the answer. A token is allowed when its
 * piece continues the JSON, an end-of-generation token when the JSON is
 * complete; and the answer ends as soon as nothing may follow it. A think
 * chat may open its thinking first (unless a call is forced). The
 * sampler draws first as usual, and only when its token is not allowed are
 * all the tokens checked: with a model that keeps to the format, the mask
 * is rarely built. */
static bool js_active(const sw_gen *g)
{
    if (!g->js || g->forced == FC_OPEN || g->forced == FC_CLOSE) return false;
    if (g->r_mode == R_THINK) return g->r_state != T_IN;
    if (g->r_mode == R_HARMONY) return g->r_state == H_ANSWER || (g->forced && g->r_state == H_CALL);
    return true;
}

static bool js_allows(const sw_gen *g, int32_t id)
{
    if (sw_tok_is_eog(g->tok, id)) return sw_js_complete(g->js, &g->js_st);
    if (g->r_mode == R_THINK && g->r_state == T_START && id == g->think_open) return !g->forced;
    size_t n;
    const char *piece = sw_tok_piece_ref(g->tok, id, &n);
    return n > 0 && sw_js_accepts(g->js, &g->js_st, piece, n);
}

static void mask_all(float *logits, int32_t n)
{
    for (int32_t i = 0; i < n; i++) logits[i] = -INFINITY;
}

int32_t sw_gen_json_mask(const sw_gen *g, const float *raw, float *logits, int32_t n)
{
    int32_t allowed = 0;
    mask_all(logits, n);
    for (int32_t i = 0; i < n; i++)   /* the few tokens with no piece: ends, <think> */
        if ((sw_tok_is_eog(g->tok, i) || (g->r_mode == R_THINK && i == g->think_open)) && js_allows(g, i))
            logits[i] = raw[i], allowed++;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        sw_js_state after;
        sw_js_copy(&after, &g->js_st);
        if (!sw_js_feed(g->js, &after, &c, 1)) continue;
        size_t m;
        const int32_t *ids = sw_tok_ids_by_first_byte(g->tok, (uint8_t)b, &m);
        /* A big group (GPT-2 has 30 000 tokens starting with a space) is
         * filtered on its second byte first: one check per byte value
         * instead of one per token, where a structural position allows
         * few. */
        bool second[256], by_second = m > 256;
        for (int b2 = 0; by_second && b2 < 256; b2++) {
            char c2 = (char)b2;
            second[b2] = sw_js_accepts(g->js, &after, &c2, 1);
        }
        for (size_t k = 0; k < m; k++) {
            size_t len;
            const char *piece = sw_tok_piece_ref(g->tok, ids[k], &len);
            if (ids[k] >= n || sw_tok_is_eog(g->tok, ids[k])) continue;
            if (len > 1 && by_second && !second[(uint8_t)piece[1]]) continue;
            if (len == 1 || (len == 2 && by_second) || sw_js_accepts(g->js, &after, piece + 1, len - 1))
                logits[ids[k]] = raw[ids[k]], allowed++;
        }
    }
    return allowed;
}

/* Samples again from the raw row with every token the schema refuses at
 * -inf. -1 when none is left. */
static int32_t sample_masked(sw_gen *g, const float *raw, float *logits, int32_t n)
{
    return sw_gen_json_mask(g, raw, logits, n) ? sw_sampler_sample(&g->sampler, logits, n) : -1;
}

/* The only token a forced call allows now: its opening marker (at once:
 * a think chat does not think first, so that the call cannot be lost in
 * thinking that never ends), then its closing one; 0: no such limit. */
static int forced_tokens(const sw_gen *g, int32_t only[2])
{
    if ((g->forced != FC_OPEN && g->forced != FC_CLOSE) || (g->r_mode == R_THINK && g->r_state == T_IN)) return 0;
    only[0] = g->forced == FC_CLOSE ? g->call_close : g->call_open;
    return 1;
}

static int32_t sample_only(sw_gen *g, const float *raw, float *logits, int32_t n, const int32_t *ids, int k)
{
    mask_all(logits, n);
    for (int j = 0; j < k; j++)
        if (ids[j] >= 0 && ids[j] < n) logits[ids[j]] = raw[ids[j]];
    return sw_sampler_sample(&g->sampler, logits, n);
}

int32_t sw_gen_sample(sw_gen *g, float *logits, int32_t n_logits)
{
    int32_t n = n_logits < g->n_vocab ? n_logits : g->n_vocab;
    /* A NaN here means the model computed garbage (NaN or overflowing
     * weights in the file): sampling around it would stream nonsense. One
     * vectorized pass without an early exit: 4 us for 32000 logits, where
     * a scalar early-exit loop took 23. */
    int nan = 0;
#pragma omp simd reduction(|:nan)
    for (int32_t i = 0; i < n; i++) nan |= isnan(logits[i]) != 0;
    if (nan) return -1;
    g->lp_valid = false;
    bool js = js_active(g);
    int32_t only[2];
    int n_only = forced_tokens(g, only);
    if (!g->lp_on && !js && !n_only) return sw_sampler_sample(&g->sampler, logits, n);
    /* sampling rewrites the row (penalty, temperature): keep it */
    if (!g->lp_row && !(g->lp_row = malloc((size_t)g->n_vocab * sizeof *g->lp_row))) {
        g->error = "out of memory";
        return -1;
    }
    memcpy(g->lp_row, logits, (size_t)n * sizeof *logits);
    int32_t tok = n_only ? sample_only(g, g->lp_row, logits, n, only, n_only) : sw_sampler_sample(&g->sampler, logits, n);
    if (js && !js_allows(g, tok) && (tok = sample_masked(g, g->lp_row, logits, n)) < 0) {
        g->error = "no token of the vocabulary continues the JSON the response_format asks for";
        return -1;
    }
    if (!g->lp_on) return tok;
    int32_t ids[SW_MAX_TOP_LOGPROBS];
    float lps[SW_MAX_TOP_LOGPROBS];
    g->lp.chosen.logprob = sw_logprobs(g->lp_row, n, tok, g->lp_k, ids, lps);
    token_bytes(g, tok, &g->lp.chosen);
    g->lp.n_top = g->lp_k < n ? g->lp_k : n;
    for (int j = 0; j < g->lp.n_top; j++) {
        g->lp.top[j].logprob = lps[j];
        token_bytes(g, ids[j], &g->lp.top[j]);
    }
    g->lp_valid = true;
    return tok;
}

/* Moves the first n held bytes to the output (out of memory: the output's
 * oom flag, which fails the request). */
static void release(sw_gen *g, size_t n)
{
    sw_sbuf_put_n(&g->out, g->held.s, n);
    memmove(g->held.s, g->held.s + n, g->held.n - n);
    g->held.n -= n;
    g->held.s[g->held.n] = 0;
}

/* Length of the longest suffix of held text that is a proper prefix of some
 * stop string: that much must wait for more text before it can be emitted.
 * (At most SW_MAX_STOP_LEN - 1 bytes a stop string, so the held text stays
 * that short between tokens.) */
static size_t stop_prefix_len(const sw_gen *g)
{
    size_t best = 0;
    const char *held = g->held.s;
    size_t n_held = g->held.n;
    for (size_t s = 0; s < g->n_stop; s++) {
        size_t sl = strlen(g->stop[s]);
        size_t maxk = sl - 1 < n_held ? sl - 1 : n_held;
        for (size_t k = maxk; k > best; k--) {
            /* the first byte rules out most k before a whole compare */
            if (held[n_held - k] == g->stop[s][0] && memcmp(held + n_held - k, g->stop[s], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

/* Finds the earliest complete stop string in the held text. */
static bool find_stop(const sw_gen *g, size_t *at)
{
    bool found = false;
    for (size_t s = 0; s < g->n_stop; s++) {
        const char *p = memmem(g->held.s, g->held.n, g->stop[s], strlen(g->stop[s]));
        if (p && (!found || (size_t)(p - g->held.s) < *at)) { *at = (size_t)(p - g->held.s); found = true; }
    }
    return found;
}

/* Appends n bytes of text where they go: the answer's text is held (it may
 * start a stop string), the reasoning's is this step's reasoning delta. */
static bool add_text(sw_gen *g, text_dest to, const char *s, size_t n)
{
    if ((to != TO_ANSWER && to != TO_REASONING) || n == 0) return true;
    sw_sbuf *b = to == TO_ANSWER ? &g->held : &g->reasoning;
    sw_sbuf_put_n(b, s, n);
    return !b->oom;
}

/* A structured answer's token: its bytes, which sw_gen_sample checked, go
 * through the schema (a caller that sampled without it, a device sampler,
 * is refused rather than trusted). Returns false when they do not fit;
 * *done when the answer is whole. */
static bool js_accept(sw_gen *g, int32_t token, bool *done)
{
    size_t n;
    const char *piece = sw_tok_piece_ref(g->tok, token, &n);
    if (!sw_js_feed(g->js, &g->js_st, piece, n)) return false;
    *done = sw_js_final(g->js, &g->js_st);
    if (*done && g->forced == FC_BODY && g->call_close >= 0) g->forced = FC_CLOSE, *done = false;
    return true;
}

/* The structure this token advances: the answer's JSON, or a forced call's
 * markers. false when the token breaks it; *done when the answer is whole. */
static bool track_structure(sw_gen *g, int32_t token, bool eog, bool *done)
{
    *done = false;
    if (js_active(g) && !eog && !(g->r_mode == R_THINK && g->r_state == T_START && token == g->think_open))
        return js_accept(g, token, done);
    if (g->forced == FC_OPEN && token == g->call_open) {
        g->forced = FC_BODY;
    } else if (g->forced == FC_CLOSE && token == g->call_close) {
        g->forced = FC_NONE;
        *done = true;
        if (g->r_mode == R_HARMONY && g->r_state == H_CALL) harmony_call_done(g);   /* <|call|> */
    }
    return true;
}

/* Decodes this token's text onto the held answer, the reasoning or a call
 * (EOG tokens have none). false when out of memory. */
static bool take_text(sw_gen *g, int32_t token)
{
    char piece[512];
    const char *p = piece;
    size_t n = sw_detok_push(&g->detok, token, piece, sizeof piece);
    text_dest to = route(g, token, &p, &n);
    g->n_reasoning_tokens += to == TO_REASONING;
    if (to == TO_CALL) sw_sbuf_put_n(&g->call_text, p, n);
    return to == TO_ANSWER ? answer_text(g, token, p, n) : to == TO_CALL ? !g->call_text.oom : add_text(g, to, p, n);
}

/* Nothing more will come: held text is output, and so are bytes of an
 * unfinished code point (as U+FFFD). */
static void finish_text(sw_gen *g, bool eog)
{
    char tail[32];
    size_t n = sw_detok_flush(&g->detok, tail, sizeof tail);
    text_dest to = current_dest(g);
    if ((g->in_call && to == TO_ANSWER) || to == TO_CALL) sw_sbuf_put_n(&g->call_text, tail, n);
    else add_text(g, to, tail, n);
    unfinished_call(g);
    /* a harmony call ends with <|call|>, which ends the turn; one cut off
     * (max_tokens) is not a call */
    if (g->r_mode == R_HARMONY && g->r_state == H_CALL && eog) harmony_call_done(g);
    release(g, g->held.n);
}

/* After this token's text: a stop string, or another end, or the text that
 * can no longer start a stop string goes out. */
static void settle(sw_gen *g, bool eog, bool js_done)
{
    size_t at = 0;
    if (g->n_stop && find_stop(g, &at)) {
        /* Emit what precedes the stop string; drop it and everything after. */
        release(g, at);
        g->held.n = 0;
        g->finish = SW_FINISH_STOP;
        return;
    }
    if (eog || js_done || (g->one_call && g->n_calls_total > 0)) g->finish = SW_FINISH_STOP;
    else if (g->max_tokens && g->n_generated >= g->max_tokens) g->finish = SW_FINISH_LENGTH;
    /* The next token would be evaluated at position n_prompt + n_generated - 1 + 1. */
    else if (g->n_prompt + (int64_t)g->n_generated >= g->n_ctx) g->finish = SW_FINISH_LENGTH;
    if (g->finish) {
        finish_text(g, eog);
        return;
    }
    size_t keep = g->n_stop ? stop_prefix_len(g) : 0;
    /* Never split a UTF-8 sequence: back up to a code point start. */
    size_t cut = g->held.n - keep;
    while (cut > 0 && cut < g->held.n && ((unsigned char)g->held.s[cut] & 0xC0) == 0x80) cut--;
    release(g, cut);
}

/* echo: the first delta carries the prompt ahead of the output. */
static void put_echo(sw_gen *g)
{
    if (sw_sbuf_reserve(&g->out, g->echo.n)) {
        memmove(g->out.s + g->echo.n, g->out.s, g->out.n + 1);
        memcpy(g->out.s, g->echo.s, g->echo.n);
        g->out.n += g->echo.n;
    }
    sw_sbuf_free(&g->echo);
}

static int accept_token(sw_gen *g, int32_t token)
{
    g->n_generated++;
    sw_sampler_accept(&g->sampler, token);
    if (!sw_sampler_generated(&g->sampler, token, g->n_vocab)) return SW_FINISH_ERROR;
    bool eog = sw_tok_is_eog(g->tok, token), js_done;
    if (!track_structure(g, token, eog, &js_done)) return SW_FINISH_ERROR;
    if (!eog && !take_text(g, token)) return SW_FINISH_ERROR;
    settle(g, eog, js_done);
    if (g->echo.s) put_echo(g);
    /* a buffer that could not grow lost text: fail rather than stream less */
    return g->out.oom || g->held.oom || g->reasoning.oom ? SW_FINISH_ERROR : g->finish;
}

int sw_gen_accept(sw_gen *g, int32_t token, const char **delta, size_t *delta_len)
{
    g->out.n = 0;
    g->out.s[0] = 0;
    g->reasoning.n = 0;
    g->reasoning.s[0] = 0;
    sw_tool_calls_clear(&g->calls);
    if (!g->finish) g->finish = accept_token(g, token);
    *delta = g->out.s;
    *delta_len = g->out.n;
    return g->finish;
}
