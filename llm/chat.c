/* Chat templates: detection by distinctive substrings of the Jinja source,
 * and one formatter per family that writes what that family's published
 * template renders (with add_generation_prompt), minus the leading BOS. */
#include "llm/chat.h"
#include "llm/json.h"
#include "llm/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const names[] = {
    [SW_CHAT_PLAIN] = "plain", [SW_CHAT_LLAMA2] = "llama2", [SW_CHAT_LLAMA3] = "llama3",
    [SW_CHAT_CHATML] = "chatml", [SW_CHAT_MISTRAL] = "mistral", [SW_CHAT_PHI3] = "phi3",
    [SW_CHAT_GEMMA] = "gemma", [SW_CHAT_GRANITE] = "granite", [SW_CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [SW_CHAT_MISTRAL_V7] = "mistral-v7", [SW_CHAT_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken", [SW_CHAT_PHI4] = "phi4",
    [SW_CHAT_PHI4_MINI] = "phi4-mini", [SW_CHAT_DEEPSEEK3] = "deepseek3", [SW_CHAT_DEEPSEEK_R1] = "deepseek-r1",
    [SW_CHAT_HARMONY] = "harmony", [SW_CHAT_TULU] = "tulu",
};
_Static_assert(sizeof names / sizeof names[0] == SW_CHAT_COUNT, "a name for every template");
#define N_TEMPLATES ((int)(sizeof names / sizeof names[0]))

const char *sw_chat_name(sw_chat_template t)
{
    return (int)t >= 0 && (int)t < N_TEMPLATES ? names[t] : "unknown";
}

int sw_chat_from_name(const char *name)
{
    if (!name) return -1;
    for (int i = 0; i < N_TEMPLATES; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

static bool has(const char *s, size_t n, const char *needle)
{
    return memmem(s, n, needle, strlen(needle)) != NULL;
}

/* DeepSeek's markers use fullwidth bars (U+FF5C) and U+2581 for spaces. */
#define DS_USER "<｜User｜>"
#define DS_ASSISTANT "<｜Assistant｜>"
#define DS_END "<｜end▁of▁sentence｜>"

/* The order matters: the more specific markers are tested first. */
static sw_chat_template detect_mem(const char *s, size_t n)
{
    if (!s || n == 0) return SW_CHAT_PLAIN;
    if (has(s, n, "<|start_header_id|>")) return SW_CHAT_LLAMA3;
    if (has(s, n, "<|start|>") && has(s, n, "<|message|>") && has(s, n, "<|channel|>")) return SW_CHAT_HARMONY;
    if (has(s, n, "<|im_sep|>")) return SW_CHAT_PHI4;
    if (has(s, n, "<|im_start|>")) return SW_CHAT_CHATML;
    if (has(s, n, "<start_of_turn>")) return SW_CHAT_GEMMA;
    if (has(s, n, "<|start_of_role|>")) return SW_CHAT_GRANITE;
    if (has(s, n, DS_USER) && has(s, n, DS_ASSISTANT) && has(s, n, DS_END))
        return has(s, n, DS_ASSISTANT "<think>\\n") ? SW_CHAT_DEEPSEEK_R1 : SW_CHAT_DEEPSEEK3;
    /* Phi-4-mini writes its role markers as '<|' + message['role'] + '|>'. */
    if (has(s, n, "'<|' + message['role'] + '|>'") && has(s, n, "<|end|>")) return SW_CHAT_PHI4_MINI;
    if (has(s, n, "<|user|>") && has(s, n, "<|end|>")) return SW_CHAT_PHI3;
    if (has(s, n, "'<|user|>\\n' + message['content'] + '\\n'") && has(s, n, "<|assistant|>\\n")) return SW_CHAT_TULU;
    if (has(s, n, "[INST]")) {
        /* Mistral's v7 templates have a system role; the Tekken tokenizer's
         * versions (v3-tekken, v7-tekken) put no space after the markers. */
        bool spaced = has(s, n, "[INST] ");
        if (has(s, n, "[SYSTEM_PROMPT]")) return spaced ? SW_CHAT_MISTRAL_V7 : SW_CHAT_MISTRAL_V7_TEKKEN;
        if (has(s, n, "<<SYS>>")) return SW_CHAT_LLAMA2;
        return spaced ? SW_CHAT_MISTRAL : SW_CHAT_MISTRAL_V3_TEKKEN;
    }
    return SW_CHAT_PLAIN;
}

sw_chat_template sw_chat_detect(const char *jinja)
{
    return jinja ? detect_mem(jinja, strlen(jinja)) : SW_CHAT_PLAIN;
}

sw_chat_template sw_chat_detect_gguf(const gguf_file *f)
{
    if (!f) return SW_CHAT_PLAIN;
    gguf_str s;
    if (gguf_get_str(f, "tokenizer.chat_template", &s)) return detect_mem(s.ptr, (size_t)s.len);
    /* No template: a few architectures imply their family. */
    char arch[64];
    if (gguf_get_cstr(f, "general.architecture", arch, sizeof arch)) {
        if (strncmp(arch, "gemma", 5) == 0) return SW_CHAT_GEMMA;
        if (strcmp(arch, "phi3") == 0) return SW_CHAT_PHI3;
    }
    return SW_CHAT_PLAIN;
}

/* ---- output buffer ---- */

typedef sw_sbuf sbuf;

static void put_n(sbuf *b, const char *s, size_t n) { sw_sbuf_put_n(b, s, n); }
static void put(sbuf *b, const char *s) { sw_sbuf_put(b, s); }

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Jinja's trim / Python's strip: the content without surrounding whitespace. */
static void put_trimmed(sbuf *b, const char *s)
{
    size_t n = strlen(s), a = 0;
    while (a < n && is_ws(s[a])) a++;
    while (n > a && is_ws(s[n - 1])) n--;
    put_n(b, s + a, n - a);
}

typedef enum { R_SYSTEM, R_USER, R_ASSISTANT, R_OTHER } role_kind;

static role_kind role_of(const char *r)
{
    if (!r) return R_USER;
    if (strcmp(r, "system") == 0) return R_SYSTEM;
    if (strcmp(r, "user") == 0) return R_USER;
    if (strcmp(r, "assistant") == 0) return R_ASSISTANT;
    return R_OTHER;
}

static const char *content_of(const sw_chat_msg *m) { return m->content ? m->content : ""; }
static const char *role_name(const sw_chat_msg *m) { return m->role && *m->role ? m->role : "user"; }

/* ---- families with a system role ---- */

/* The families that wrap each message as open + role + mid + text + close
 * and end with the assistant's open + "assistant" + mid. */
typedef struct { const char *open, *mid, *close; bool trim; } tagged_fmt;

static const tagged_fmt CHATML = { "<|im_start|>", "\n", "<|im_end|>\n", false };
static const tagged_fmt LLAMA3 = { "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", true };
/* Granite 3.x. Its published template also writes a dated default system
 * turn when the conversation has none; like llama.cpp's built-in one, this
 * leaves that to the caller. */
static const tagged_fmt GRANITE = { "<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>\n", false };
static const tagged_fmt PHI4 = { "<|im_start|>", "<|im_sep|>", "<|im_end|>", false };
static const tagged_fmt PHI4_MINI = { "<|", "|>", "<|end|>", false };

static void fmt_tagged(sbuf *b, const sw_chat_msg *m, size_t n, const tagged_fmt *f)
{
    for (size_t i = 0; i < n; i++) {
        put(b, f->open); put(b, role_name(&m[i])); put(b, f->mid);
        if (f->trim) put_trimmed(b, content_of(&m[i]));
        else put(b, content_of(&m[i]));
        put(b, f->close);
    }
    put(b, f->open); put(b, "assistant"); put(b, f->mid);
}

static void fmt_phi3(sbuf *b, const sw_chat_msg *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        role_kind r = role_of(m[i].role);
        put(b, r == R_SYSTEM ? "<|system|>\n" : r == R_ASSISTANT ? "<|assistant|>\n" : "<|user|>\n");
        put(b, content_of(&m[i])); put(b, "<|end|>\n");
    }
    put(b, "<|assistant|>\n");
}

/* OLMo 2's Instruct models (Tulu 3's format): "<|role|>\n" and the text on
 * lines of their own, each past answer ended by EOS, which is OLMo 2's
 * <|endoftext|> (a Tulu model with another EOS would want its own). */
static void fmt_tulu(sbuf *b, const sw_chat_msg *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        role_kind r = role_of(m[i].role);
        put(b, r == R_SYSTEM ? "<|system|>\n" : r == R_ASSISTANT ? "<|assistant|>\n" : "<|user|>\n");
        put(b, content_of(&m[i]));
        put(b, r == R_ASSISTANT ? "<|endoftext|>\n" : "\n");
    }
    put(b, "<|assistant|>\n");
}

/* Our own fallback: "role: content" lines, ending with "assistant:" for the
 * model to continue. Content that starts with whitespace follows the colon
 * directly, so an answer the model generated after "assistant:" (usually
 * starting with a space) reads back in the next turn exactly as it was
 * generated, and the worker's prefix cache covers it. */
static void fmt_plain(sbuf *b, const sw_chat_msg *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *c = content_of(&m[i]);
        put(b, role_name(&m[i])); put(b, is_ws(c[0]) ? ":" : ": "); put(b, c); put(b, "\n");
    }
    put(b, "assistant:");
}

/* ---- families without one: the system text joins the next user turn ---- */

/* Collects system messages until the next user turn takes them. */
typedef struct { sbuf text; bool any; } pending_sys;

static void sys_add(pending_sys *p, const char *s)
{
    if (p->any) put(&p->text, "\n\n");
    put_trimmed(&p->text, s);
    p->any = true;
}

/* Llama 2 (Meta's reference): each exchange is BOS "[INST] user [/INST] answer " EOS;
 * a system prompt is wrapped in <<SYS>> inside the first user turn. */
static void fmt_llama2(sbuf *b, const sw_chat_msg *m, size_t n, pending_sys *sys)
{
    bool first = true, open = false;   /* open: an [INST] ... [/INST] awaits its answer */
    for (size_t i = 0; i < n; i++) {
        role_kind r = role_of(m[i].role);
        if (r == R_SYSTEM) { sys_add(sys, content_of(&m[i])); continue; }
        if (r == R_ASSISTANT) {
            if (!open) continue;       /* an answer without a question has no place here */
            put(b, " "); put_trimmed(b, content_of(&m[i])); put(b, " </s>");
            open = false;
            continue;
        }
        if (open) put(b, " </s>");     /* two user turns in a row: close the first */
        if (!first) put(b, "<s>");
        put(b, "[INST] ");
        if (sys->any) {
            put(b, "<<SYS>>\n"); put_n(b, sys->text.s, sys->text.n); put(b, "\n<</SYS>>\n\n");
            sys->any = false; sys->text.n = 0;
        }
        put_trimmed(b, content_of(&m[i]));
        put(b, " [/INST]");
        first = false;
        open = true;
    }
    if (!open) {                       /* the conversation must end with a question */
        if (!first) put(b, "<s>");
        put(b, "[INST] ");
        if (sys->any) { put(b, "<<SYS>>\n"); put_n(b, sys->text.s, sys->text.n); put(b, "\n<</SYS>>\n\n"); }
        put(b, " [/INST]");
    }
}

/* Mistral's tool format (v3 on: Mistral 7B v0.3, Nemo, Large, Small): the
 * definitions as one JSON array in [AVAILABLE_TOOLS] before the last user
 * turn; a call as [TOOL_CALLS] and a JSON array of {"name", "arguments"};
 * a result as [TOOL_RESULTS] {"content": ...}[/TOOL_RESULTS]. sp is the
 * space the SentencePiece models write after a marker; Tekken's have none. */
static bool is_tool_result(const sw_chat_msg *m) { return m->role && !strcmp(m->role, "tool"); }

/* The index of the last user turn (the one the definitions precede), n if none. */
static size_t last_user_turn(const sw_chat_msg *m, size_t n)
{
    size_t last = n;
    for (size_t i = 0; i < n; i++)
        if (role_of(m[i].role) != R_SYSTEM && role_of(m[i].role) != R_ASSISTANT && !is_tool_result(&m[i])) last = i;
    return last;
}

static void put_mistral_tools(sbuf *b, const cJSON *tools, const char *sp)
{
    if (cJSON_GetArraySize(tools) == 0) return;
    put(b, "[AVAILABLE_TOOLS]"); put(b, sp); sw_json_put(b, tools); put(b, "[/AVAILABLE_TOOLS]");
}

static void put_mistral_calls(sbuf *b, const sw_chat_msg *m, const char *sp)
{
    put(b, "[TOOL_CALLS]"); put(b, sp); put(b, "[");
    for (size_t k = 0; k < m->n_tool_calls; k++) {
        const sw_tool_call *c = &m->tool_calls[k];
        if (k) put(b, ", ");
        put(b, "{\"name\": \""); put(b, c->name ? c->name : ""); put(b, "\", \"arguments\": ");
        put(b, c->arguments && *c->arguments ? c->arguments : "{}"); put(b, "}");
    }
    put(b, "]</s>");
}

/* A result's content goes in as JSON: as written when it is JSON, else as
 * a JSON string (the templates paste it raw, which breaks on plain text). */
static void put_mistral_result(sbuf *b, const sw_chat_msg *m, const char *sp)
{
    const char *c = content_of(m);
    cJSON *v = cJSON_ParseWithOpts(c, NULL, true);   /* all of it: "12:00" is not the number 12 */
    put(b, "[TOOL_RESULTS]"); put(b, sp); put(b, "{\"content\": ");
    if (v) put(b, c);
    else {
        cJSON *str = cJSON_CreateString(c);
        if (str) sw_json_put(b, str);
        cJSON_Delete(str);
    }
    cJSON_Delete(v);
    put(b, "}[/TOOL_RESULTS]");
}

/* A turn that is a call or a result, in Mistral's tool format; false for
 * any other. */
static bool put_mistral_tool_turn(sbuf *b, const sw_chat_msg *m, const char *sp)
{
    if (is_tool_result(m)) put_mistral_result(b, m, sp);
    else if (role_of(m->role) == R_ASSISTANT && m->n_tool_calls) put_mistral_calls(b, m, sp);
    else return false;
    return true;
}

/* Mistral Instruct: "[INST] user [/INST]answer</s>[INST] ..."; system text
 * goes before the first user message's content. */
static void fmt_mistral(sbuf *b, const sw_chat_msg *m, size_t n, pending_sys *sys, const cJSON *tools)
{
    bool open = false;
    size_t last_user = last_user_turn(m, n);
    for (size_t i = 0; i < n; i++) {
        role_kind r = role_of(m[i].role);
        if (r == R_SYSTEM) { sys_add(sys, content_of(&m[i])); continue; }
        if (put_mistral_tool_turn(b, &m[i], " ")) { open = is_tool_result(&m[i]); continue; }
        if (i == last_user) put_mistral_tools(b, tools, " ");
        if (r == R_ASSISTANT) {
            if (!open) continue;
            put(b, content_of(&m[i])); put(b, "</s>");
            open = false;
            continue;
        }
        put(b, "[INST] ");
        if (sys->any) {
            put_n(b, sys->text.s, sys->text.n); put(b, "\n\n");
            sys->any = false; sys->text.n = 0;
        }
        put(b, content_of(&m[i]));
        put(b, " [/INST]");
        open = true;
    }
    if (!open) {
        put(b, "[INST] ");
        if (sys->any) put_n(b, sys->text.s, sys->text.n);
        put(b, " [/INST]");
    }
}

/* Mistral Nemo (v3-tekken): "[INST]user[/INST]answer</s>", no spaces; the
 * system text goes into the last user turn only, as its template does. */
static void fmt_mistral_v3_tekken(sbuf *b, const sw_chat_msg *m, size_t n, pending_sys *sys, const cJSON *tools)
{
    size_t last_user = last_user_turn(m, n);
    for (size_t i = 0; i < n; i++)
        if (role_of(m[i].role) == R_SYSTEM) sys_add(sys, content_of(&m[i]));
    for (size_t i = 0; i < n; i++) {
        role_kind r = role_of(m[i].role);
        if (r == R_SYSTEM || put_mistral_tool_turn(b, &m[i], "")) continue;
        if (r == R_ASSISTANT) { put(b, content_of(&m[i])); put(b, "</s>"); continue; }
        if (i == last_user) put_mistral_tools(b, tools, "");
        put(b, "[INST]");
        if (i == last_user && sys->any) { put_n(b, sys->text.s, sys->text.n); put(b, "\n\n"); }
        put(b, content_of(&m[i]));
        put(b, "[/INST]");
    }
    if (last_user == n && sys->any) {  /* only system text: it becomes the user turn */
        put(b, "[INST]"); put_n(b, sys->text.s, sys->text.n); put(b, "[/INST]");
    }
}

/* Mistral v7: a system role of its own, in place. sp is " " for the
 * SentencePiece models (Large 2411), "" for Tekken's (Small 3.x). */
static void fmt_mistral_v7(sbuf *b, const sw_chat_msg *m, size_t n, const char *sp, const cJSON *tools)
{
    size_t last_user = last_user_turn(m, n);
    for (size_t i = 0; i < n; i++) {
        role_kind r = role_of(m[i].role);
        if (put_mistral_tool_turn(b, &m[i], sp)) continue;
        if (i == last_user) put_mistral_tools(b, tools, sp);
        const char *open = r == R_SYSTEM ? "[SYSTEM_PROMPT]" : r == R_ASSISTANT ? "" : "[INST]";
        const char *close = r == R_SYSTEM ? "[/SYSTEM_PROMPT]" : r == R_ASSISTANT ? "</s>" : "[/INST]";
        put(b, open); put(b, sp); put(b, content_of(&m[i])); put(b, close);
    }
}

/* DeepSeek V3 and R1: the system text first, with no marker; a past answer
 * keeps only what follows its reasoning ("</think>"), as the templates do. */
static void fmt_deepseek(sbuf *b, const sw_chat_msg *m, size_t n, pending_sys *sys, bool think)
{
    for (size_t i = 0; i < n; i++)
        if (role_of(m[i].role) == R_SYSTEM) sys_add(sys, content_of(&m[i]));
    put_n(b, sys->text.s ? sys->text.s : "", sys->text.n);
    for (size_t i = 0; i < n; i++) {
        role_kind r = role_of(m[i].role);
        if (r == R_SYSTEM) continue;
        if (r != R_ASSISTANT) { put(b, DS_USER); put(b, content_of(&m[i])); continue; }
        const char *c = content_of(&m[i]), *t;
        while ((t = strstr(c, "</think>"))) c = t + strlen("</think>");
        put(b, DS_ASSISTANT); put(b, c); put(b, DS_END);
    }
    put(b, DS_ASSISTANT);
    if (think) put(b, "<think>\n");
}

/* Harmony (gpt-oss), as its template renders it: a system message the
 * template always writes (identity, knowledge cutoff, today's date in UTC,
 * reasoning effort, the channels), the caller's system text as the
 * developer's instructions, past answers in the final channel, and the
 * assistant's header left open: the model names the channel itself. */
static void put_ts_namespace(sbuf *b, const cJSON *tools);

/* A harmony assistant's calls, as gpt-oss's template writes them: the
 * recipient in the header, the arguments (JSON text) as the message. */
static void put_harmony_calls(sbuf *b, const sw_chat_msg *m)
{
    for (size_t k = 0; k < m->n_tool_calls; k++) {
        put(b, "<|start|>assistant to=functions.");
        put(b, m->tool_calls[k].name ? m->tool_calls[k].name : "");
        put(b, "<|channel|>commentary json<|message|>");
        put(b, m->tool_calls[k].arguments && *m->tool_calls[k].arguments ? m->tool_calls[k].arguments : "{}");
        put(b, "<|call|>");
    }
}

static void fmt_harmony(sbuf *b, const sw_chat_msg *m, size_t n, pending_sys *sys, sw_reasoning_effort effort,
                        const cJSON *tools)
{
    static const char *const effort_name[] = { "medium", "low", "medium", "high" };
    bool has_tools = cJSON_GetArraySize(tools) > 0;
    char date[16] = "1970-01-01";
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(date, sizeof date, "%Y-%m-%d", &tm);
    put(b, "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
           "Knowledge cutoff: 2024-06\nCurrent date: ");
    put(b, date);
    put(b, "\n\nReasoning: ");
    put(b, effort_name[effort <= SW_EFFORT_HIGH ? effort : SW_EFFORT_DEFAULT]);
    put(b, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.");
    if (has_tools) put(b, "\nCalls to these tools must go to the commentary channel: 'functions'.");
    put(b, "<|end|>");
    for (size_t i = 0; i < n; i++)
        if (role_of(m[i].role) == R_SYSTEM) sys_add(sys, content_of(&m[i]));
    if (sys->any || has_tools) {
        put(b, "<|start|>developer<|message|>");
        if (sys->any) { put(b, "# Instructions\n\n"); put_n(b, sys->text.s, sys->text.n); put(b, "\n\n"); }
        if (has_tools) put_ts_namespace(b, tools);
        put(b, "<|end|>");
    }
    const sw_chat_msg *caller = NULL;   /* the assistant message whose calls the tool results answer */
    size_t answered = 0;
    for (size_t i = 0; i < n; i++) {
        role_kind r = role_of(m[i].role);
        if (r == R_SYSTEM) continue;
        if (!strcmp(role_name(&m[i]), "tool")) {   /* the k-th result answers the k-th call */
            const char *fn = caller && answered < caller->n_tool_calls ? caller->tool_calls[answered++].name : NULL;
            put(b, "<|start|>functions.");
            put(b, fn ? fn : "unknown");
            put(b, " to=assistant<|channel|>commentary<|message|>");
            put(b, content_of(&m[i]));
            put(b, "<|end|>");
            continue;
        }
        if (r == R_ASSISTANT && m[i].n_tool_calls) {
            if (*content_of(&m[i])) {
                put(b, "<|start|>assistant<|channel|>commentary<|message|>");
                put(b, content_of(&m[i]));
                put(b, "<|end|>");
            }
            put_harmony_calls(b, &m[i]);
            caller = &m[i];
            answered = 0;
            continue;
        }
        put(b, r == R_ASSISTANT ? "<|start|>assistant<|channel|>final<|message|>" : "<|start|>user<|message|>");
        put(b, content_of(&m[i]));
        put(b, "<|end|>");
    }
    put(b, "<|start|>assistant");
}

/* Gemma: roles user and model; system text starts the first user turn. */
static void fmt_gemma(sbuf *b, const sw_chat_msg *m, size_t n, pending_sys *sys)
{
    for (size_t i = 0; i < n; i++) {
        role_kind r = role_of(m[i].role);
        if (r == R_SYSTEM) { sys_add(sys, content_of(&m[i])); continue; }
        put(b, r == R_ASSISTANT ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
        if (r != R_ASSISTANT && sys->any) {
            put_n(b, sys->text.s, sys->text.n); put(b, "\n\n");
            sys->any = false; sys->text.n = 0;
        }
        put_trimmed(b, content_of(&m[i]));
        put(b, "<end_of_turn>\n");
    }
    if (sys->any) {                    /* only system text: it becomes a user turn */
        put(b, "<start_of_turn>user\n"); put_n(b, sys->text.s, sys->text.n); put(b, "<end_of_turn>\n");
    }
    put(b, "<start_of_turn>model\n");
}

/* ---- tools ---- */

bool sw_tool_calls_add(sw_tool_calls *l, const char *name, const char *arguments)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 4;
        sw_tool_call *v = realloc(l->v, cap * sizeof *v);
        if (!v) return false;
        l->v = v;
        l->cap = cap;
    }
    char *nm = strdup(name ? name : ""), *a = strdup(arguments ? arguments : "{}");
    if (!nm || !a) { free(nm); free(a); return false; }
    l->v[l->n++] = (sw_tool_call){ .name = nm, .arguments = a };
    return true;
}

void sw_tool_calls_clear(sw_tool_calls *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free((char *)l->v[i].name);
        free((char *)l->v[i].arguments);
    }
    l->n = 0;
}

void sw_tool_calls_free(sw_tool_calls *l)
{
    sw_tool_calls_clear(l);
    free(l->v);
    *l = (sw_tool_calls){ 0 };
}

bool sw_chat_is_mistral(sw_chat_template t)
{
    return t == SW_CHAT_MISTRAL || t == SW_CHAT_MISTRAL_V3_TEKKEN || t == SW_CHAT_MISTRAL_V7 ||
           t == SW_CHAT_MISTRAL_V7_TEKKEN;
}

bool sw_chat_has_tools(sw_chat_template t)
{
    return t == SW_CHAT_CHATML || t == SW_CHAT_HARMONY || t == SW_CHAT_LLAMA3 || sw_chat_is_mistral(t);
}

/* A JSON Schema as the TypeScript type harmony's renderer writes for it:
 * string, number (integer too), boolean, T[] for arrays, "a" | "b" for
 * enums, nested objects in braces, unions for type lists, any otherwise
 * (and below 8 levels of nesting, which a client's schema could push as far
 * as the JSON parser allows). */
static void put_ts_type(sbuf *b, const cJSON *s, int depth);

static void put_ts_props(sbuf *b, const cJSON *schema, int depth)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(schema, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(schema, "required");
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) {
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(p, "description");
        if (cJSON_IsString(desc)) { put(b, "// "); put(b, desc->valuestring); put(b, "\n"); }
        bool required = false;
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (cJSON_IsString(r) && p->string && !strcmp(r->valuestring, p->string)) required = true;
        put(b, p->string ? p->string : "");
        put(b, required ? ": " : "?: ");
        put_ts_type(b, p, depth + 1);
        put(b, ",");
        const cJSON *def = cJSON_GetObjectItemCaseSensitive(p, "default");
        if (def) {
            put(b, " // default: ");
            if (cJSON_IsString(def)) put(b, def->valuestring); else sw_json_put(b, def);
        }
        put(b, "\n");
    }
}

static void put_ts_name(sbuf *b, const char *t, const cJSON *s, int depth)
{
    if (!strcmp(t, "string")) put(b, "string");
    else if (!strcmp(t, "number") || !strcmp(t, "integer")) put(b, "number");
    else if (!strcmp(t, "boolean")) put(b, "boolean");
    else if (!strcmp(t, "null")) put(b, "null");
    else if (!strcmp(t, "array")) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        if (items && depth < 8) put_ts_type(b, items, depth + 1); else put(b, "any");
        put(b, "[]");
    } else if (!strcmp(t, "object") && cJSON_GetObjectItemCaseSensitive(s, "properties") && depth < 8) {
        put(b, "{\n");
        put_ts_props(b, s, depth);
        put(b, "}");
    } else put(b, "any");
}

static void put_ts_type(sbuf *b, const cJSON *s, int depth)
{
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsArray(en) && cJSON_GetArraySize(en) > 0) {
        for (const cJSON *e = en->child; e; e = e->next) {
            if (e != en->child) put(b, " | ");
            sw_json_put(b, e);
        }
    } else if (cJSON_IsString(type)) {
        put_ts_name(b, type->valuestring, s, depth);
    } else if (cJSON_IsArray(type) && cJSON_GetArraySize(type) > 0) {
        for (const cJSON *t = type->child; t; t = t->next) {
            if (t != type->child) put(b, " | ");
            put_ts_name(b, cJSON_IsString(t) ? t->valuestring : "", s, depth);
        }
    } else put(b, "any");
}

/* The developer message's tools section: each function as a TypeScript
 * type in the functions namespace, its description as a comment. */
static void put_ts_namespace(sbuf *b, const cJSON *tools)
{
    put(b, "# Tools\n\n## functions\n\nnamespace functions {\n\n");
    for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(f, "description");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        if (cJSON_IsString(desc)) { put(b, "// "); put(b, desc->valuestring); put(b, "\n"); }
        put(b, "type ");
        put(b, cJSON_IsString(name) ? name->valuestring : "");
        if (cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(params, "properties")) > 0) {
            put(b, " = (_: {\n");
            put_ts_props(b, params, 0);
            put(b, "}) => any;\n\n");
        } else {
            put(b, " = () => any;\n\n");
        }
    }
    put(b, "} // namespace functions");
}

/* Whether a conversation needs the tool format: tools offered, or calls and
 * results in its history. */
static bool uses_tools(const sw_chat_msg *m, size_t n, const cJSON *tools)
{
    if (cJSON_GetArraySize(tools) > 0) return true;
    for (size_t i = 0; i < n; i++)
        if (m[i].n_tool_calls || (m[i].role && !strcmp(m[i].role, "tool"))) return true;
    return false;
}

/* A call as the model writes it: <tool_call>, the JSON object, </tool_call>.
 * The arguments are JSON text already (as the client sent them back). */
static void put_tool_call(sbuf *b, const sw_tool_call *c)
{
    put(b, "<tool_call>\n{\"name\": \"");
    put(b, c->name ? c->name : "");
    put(b, "\", \"arguments\": ");
    put(b, c->arguments && *c->arguments ? c->arguments : "{}");
    put(b, "}\n</tool_call>");
}

/* Chatml with tools, as Qwen3's template writes it (Qwen2.5's and Hermes'
 * differ only in a default system line): the definitions after the system
 * text in <tools>, one JSON object a line; an assistant's calls after its
 * text; each run of tool results as one user turn of <tool_response>s. */
static void fmt_chatml_tools(sbuf *b, const sw_chat_msg *m, size_t n, const cJSON *tools)
{
    size_t first = 0;
    bool sys = n > 0 && role_of(m[0].role) == R_SYSTEM;
    if (cJSON_GetArraySize(tools) > 0) {
        put(b, "<|im_start|>system\n");
        if (sys) { put(b, content_of(&m[0])); put(b, "\n\n"); first = 1; }
        put(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        for (const cJSON *t = tools->child; t; t = t->next) { put(b, "\n"); sw_json_put(b, t); }
        put(b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
               "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call><|im_end|>\n");
    }
    for (size_t i = first; i < n; i++) {
        const char *role = role_name(&m[i]);
        if (!strcmp(role, "tool")) {
            if (i == first || strcmp(role_name(&m[i - 1]), "tool")) put(b, "<|im_start|>user");
            put(b, "\n<tool_response>\n"); put(b, content_of(&m[i])); put(b, "\n</tool_response>");
            if (i + 1 == n || strcmp(role_name(&m[i + 1]), "tool")) put(b, "<|im_end|>\n");
            continue;
        }
        put(b, "<|im_start|>"); put(b, role); put(b, "\n"); put(b, content_of(&m[i]));
        for (size_t k = 0; k < m[i].n_tool_calls; k++) {
            if (k > 0 || *content_of(&m[i])) put(b, "\n");
            put_tool_call(b, &m[i].tool_calls[k]);
        }
        put(b, "<|im_end|>\n");
    }
    put(b, "<|im_start|>assistant\n");
}

/* Llama 3.1's template with tools: "Environment: ipython" and the dates in
 * the system message, the definitions (json.dumps(indent=4)) with their
 * instructions at the head of the first user message, a call as the
 * assistant's JSON {"name": ..., "parameters": ...} (one a message, as the
 * template allows), a result as an ipython message. */
static void fmt_llama3_tools(sbuf *b, const sw_chat_msg *m, size_t n, const cJSON *tools)
{
    size_t i = 0;
    put(b, "<|start_header_id|>system<|end_header_id|>\n\n");
    if (cJSON_GetArraySize(tools) > 0) put(b, "Environment: ipython\n");
    put(b, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
    if (n > 0 && role_of(m[0].role) == R_SYSTEM) put_trimmed(b, content_of(&m[i++]));
    put(b, "<|eot_id|>");
    if (cJSON_GetArraySize(tools) > 0) {
        put(b, "<|start_header_id|>user<|end_header_id|>\n\n"
               "Given the following functions, please respond with a JSON for a function call with its proper "
               "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
               "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n");
        for (const cJSON *t = tools->child; t; t = t->next) { sw_json_put_indented(b, t, 4); put(b, "\n\n"); }
        if (i < n && role_of(m[i].role) == R_USER) put_trimmed(b, content_of(&m[i++]));
        put(b, "<|eot_id|>");
    }
    for (; i < n; i++) {
        const char *role = role_name(&m[i]);
        if (!strcmp(role, "tool") || !strcmp(role, "ipython")) {
            put(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            put(b, content_of(&m[i]));
            put(b, "<|eot_id|>");
        } else if (m[i].n_tool_calls) {
            for (size_t k = 0; k < m[i].n_tool_calls; k++) {
                const sw_tool_call *c = &m[i].tool_calls[k];
                put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
                put(b, c->name ? c->name : "");
                put(b, "\", \"parameters\": ");
                put(b, c->arguments && *c->arguments ? c->arguments : "{}");
                put(b, "}<|eot_id|>");
            }
        } else {
            put(b, "<|start_header_id|>"); put(b, role); put(b, "<|end_header_id|>\n\n");
            put_trimmed(b, content_of(&m[i]));
            put(b, "<|eot_id|>");
        }
    }
    put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

char *sw_chat_format(sw_chat_template t, const sw_chat_msg *msgs, size_t n, const sw_chat_opts *opts)
{
    sbuf b = { 0 };
    pending_sys sys = { 0 };
    if (!msgs) n = 0;
    put(&b, "");                       /* an empty conversation still gives a string */
    switch (t) {
    case SW_CHAT_CHATML:
        if (uses_tools(msgs, n, opts ? opts->tools : NULL)) fmt_chatml_tools(&b, msgs, n, opts ? opts->tools : NULL);
        else fmt_tagged(&b, msgs, n, &CHATML);
        break;
    case SW_CHAT_LLAMA3:
        if (uses_tools(msgs, n, opts ? opts->tools : NULL)) fmt_llama3_tools(&b, msgs, n, opts ? opts->tools : NULL);
        else fmt_tagged(&b, msgs, n, &LLAMA3);
        break;
    case SW_CHAT_GRANITE: fmt_tagged(&b, msgs, n, &GRANITE); break;
    case SW_CHAT_PHI4: fmt_tagged(&b, msgs, n, &PHI4); break;
    case SW_CHAT_PHI4_MINI: fmt_tagged(&b, msgs, n, &PHI4_MINI); break;
    case SW_CHAT_PHI3: fmt_phi3(&b, msgs, n); break;
    case SW_CHAT_MISTRAL_V3_TEKKEN: fmt_mistral_v3_tekken(&b, msgs, n, &sys, opts ? opts->tools : NULL); break;
    case SW_CHAT_MISTRAL_V7: fmt_mistral_v7(&b, msgs, n, " ", opts ? opts->tools : NULL); break;
    case SW_CHAT_MISTRAL_V7_TEKKEN: fmt_mistral_v7(&b, msgs, n, "", opts ? opts->tools : NULL); break;
    case SW_CHAT_DEEPSEEK3: fmt_deepseek(&b, msgs, n, &sys, false); break;
    case SW_CHAT_DEEPSEEK_R1: fmt_deepseek(&b, msgs, n, &sys, true); break;
    case SW_CHAT_HARMONY:
        fmt_harmony(&b, msgs, n, &sys, opts ? opts->effort : SW_EFFORT_DEFAULT, opts ? opts->tools : NULL);
        break;
    case SW_CHAT_TULU: fmt_tulu(&b, msgs, n); break;
    case SW_CHAT_LLAMA2: fmt_llama2(&b, msgs, n, &sys); break;
    case SW_CHAT_MISTRAL: fmt_mistral(&b, msgs, n, &sys, opts ? opts->tools : NULL); break;
    case SW_CHAT_GEMMA: fmt_gemma(&b, msgs, n, &sys); break;
    case SW_CHAT_PLAIN: default: fmt_plain(&b, msgs, n); break;
    }
    bool oom = b.oom || sys.text.oom;
    free(sys.text.s);
    if (oom) { free(b.s); return NULL; }
    return b.s;
}
