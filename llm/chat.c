/* Chat templates: detection by distinctive substrings of the Jinja source,
 * and one formatter per family that writes what that family's published
 * template renders (with add_generation_prompt), minus the leading BOS. */
#include "llm/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[] = {
    [SW_CHAT_PLAIN] = "plain", [SW_CHAT_LLAMA2] = "llama2", [SW_CHAT_LLAMA3] = "llama3",
    [SW_CHAT_CHATML] = "chatml", [SW_CHAT_MISTRAL] = "mistral", [SW_CHAT_PHI3] = "phi3",
    [SW_CHAT_GEMMA] = "gemma", [SW_CHAT_GRANITE] = "granite",
};
#define N_TEMPLATES ((int)(sizeof names / sizeof names[0]))

const char *sw_chat_name(sw_chat_template t) {
    return (int)t >= 0 && (int)t < N_TEMPLATES ? names[t] : "unknown";
}

int sw_chat_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < N_TEMPLATES; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

static bool has(const char *s, size_t n, const char *needle) {
    return memmem(s, n, needle, strlen(needle)) != NULL;
}

/* The order matters: the more specific markers are tested first. */
static sw_chat_template detect_mem(const char *s, size_t n) {
    if (!s || n == 0) return SW_CHAT_PLAIN;
    if (has(s, n, "<|start_header_id|>")) return SW_CHAT_LLAMA3;
    if (has(s, n, "<|im_start|>")) return SW_CHAT_CHATML;
    if (has(s, n, "<start_of_turn>")) return SW_CHAT_GEMMA;
    if (has(s, n, "<|start_of_role|>")) return SW_CHAT_GRANITE;
    if (has(s, n, "<|user|>") && has(s, n, "<|end|>")) return SW_CHAT_PHI3;
    if (has(s, n, "[INST]")) return has(s, n, "<<SYS>>") ? SW_CHAT_LLAMA2 : SW_CHAT_MISTRAL;
    return SW_CHAT_PLAIN;
}

sw_chat_template sw_chat_detect(const char *jinja) {
    return jinja ? detect_mem(jinja, strlen(jinja)) : SW_CHAT_PLAIN;
}

sw_chat_template sw_chat_detect_gguf(const gguf_file *f) {
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

typedef struct { char *s; size_t n, cap; bool oom; } sbuf;

static void put_n(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) { b->oom = true; return; }
        b->s = p; b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void put(sbuf *b, const char *s) { put_n(b, s, strlen(s)); }

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Jinja's trim / Python's strip: the content without surrounding whitespace. */
static void put_trimmed(sbuf *b, const char *s) {
    size_t n = strlen(s), a = 0;
    while (a < n && is_ws(s[a])) a++;
    while (n > a && is_ws(s[n - 1])) n--;
    put_n(b, s + a, n - a);
}

typedef enum { R_SYSTEM, R_USER, R_ASSISTANT, R_OTHER } role_kind;

static role_kind role_of(const char *r) {
    if (!r) return R_USER;
    if (strcmp(r, "system") == 0) return R_SYSTEM;
    if (strcmp(r, "user") == 0) return R_USER;
    if (strcmp(r, "assistant") == 0) return R_ASSISTANT;
    return R_OTHER;
}

static const char *content_of(const sw_chat_msg *m) { return m->content ? m->content : ""; }
static const char *role_name(const sw_chat_msg *m) { return m->role && *m->role ? m->role : "user"; }

/* ---- families with a system role ---- */

static void fmt_chatml(sbuf *b, const sw_chat_msg *m, size_t n) {
    for (size_t i = 0; i < n; i++) {
        put(b, "<|im_start|>"); put(b, role_name(&m[i])); put(b, "\n");
        put(b, content_of(&m[i])); put(b, "<|im_end|>\n");
    }
    put(b, "<|im_start|>assistant\n");
}

static void fmt_llama3(sbuf *b, const sw_chat_msg *m, size_t n) {
    for (size_t i = 0; i < n; i++) {
        put(b, "<|start_header_id|>"); put(b, role_name(&m[i])); put(b, "<|end_header_id|>\n\n");
        put_trimmed(b, content_of(&m[i])); put(b, "<|eot_id|>");
    }
    put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Granite 3.x. Its published template also writes a dated default system
 * turn when the conversation has none; like llama.cpp's built-in one, this
 * leaves that to the caller. */
static void fmt_granite(sbuf *b, const sw_chat_msg *m, size_t n) {
    for (size_t i = 0; i < n; i++) {
        put(b, "<|start_of_role|>"); put(b, role_name(&m[i])); put(b, "<|end_of_role|>");
        put(b, content_of(&m[i])); put(b, "<|end_of_text|>\n");
    }
    put(b, "<|start_of_role|>assistant<|end_of_role|>");
}

static void fmt_phi3(sbuf *b, const sw_chat_msg *m, size_t n) {
    for (size_t i = 0; i < n; i++) {
        role_kind r = role_of(m[i].role);
        put(b, r == R_SYSTEM ? "<|system|>\n" : r == R_ASSISTANT ? "<|assistant|>\n" : "<|user|>\n");
        put(b, content_of(&m[i])); put(b, "<|end|>\n");
    }
    put(b, "<|assistant|>\n");
}

/* Our own fallback: "role: content" lines, ending with "assistant:" for the
 * model to continue. Content that starts with whitespace follows the colon
 * directly, so an answer the model generated after "assistant:" (usually
 * starting with a space) reads back in the next turn exactly as it was
 * generated, and the worker's prefix cache covers it. */
static void fmt_plain(sbuf *b, const sw_chat_msg *m, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const char *c = content_of(&m[i]);
        put(b, role_name(&m[i])); put(b, is_ws(c[0]) ? ":" : ": "); put(b, c); put(b, "\n");
    }
    put(b, "assistant:");
}

/* ---- families without one: the system text joins the next user turn ---- */

/* Collects system messages until the next user turn takes them. */
typedef struct { sbuf text; bool any; } pending_sys;

static void sys_add(pending_sys *p, const char *s) {
    if (p->any) put(&p->text, "\n\n");
    put_trimmed(&p->text, s);
    p->any = true;
}

/* Llama 2 (Meta's reference): each exchange is BOS "[INST] user [/INST] answer " EOS;
 * a system prompt is wrapped in <<SYS>> inside the first user turn. */
static void fmt_llama2(sbuf *b, const sw_chat_msg *m, size_t n, pending_sys *sys) {
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

/* Mistral Instruct: "[INST] user [/INST]answer</s>[INST] ..."; system text
 * goes before the first user message's content. */
static void fmt_mistral(sbuf *b, const sw_chat_msg *m, size_t n, pending_sys *sys) {
    bool open = false;
    for (size_t i = 0; i < n; i++) {
        role_kind r = role_of(m[i].role);
        if (r == R_SYSTEM) { sys_add(sys, content_of(&m[i])); continue; }
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

/* Gemma: roles user and model; system text starts the first user turn. */
static void fmt_gemma(sbuf *b, const sw_chat_msg *m, size_t n, pending_sys *sys) {
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

char *sw_chat_format(sw_chat_template t, const sw_chat_msg *msgs, size_t n) {
    sbuf b = { 0 };
    pending_sys sys = { 0 };
    if (!msgs) n = 0;
    put(&b, "");                       /* an empty conversation still gives a string */
    switch (t) {
    case SW_CHAT_CHATML: fmt_chatml(&b, msgs, n); break;
    case SW_CHAT_LLAMA3: fmt_llama3(&b, msgs, n); break;
    case SW_CHAT_PHI3: fmt_phi3(&b, msgs, n); break;
    case SW_CHAT_GRANITE: fmt_granite(&b, msgs, n); break;
    case SW_CHAT_LLAMA2: fmt_llama2(&b, msgs, n, &sys); break;
    case SW_CHAT_MISTRAL: fmt_mistral(&b, msgs, n, &sys); break;
    case SW_CHAT_GEMMA: fmt_gemma(&b, msgs, n, &sys); break;
    case SW_CHAT_PLAIN: default: fmt_plain(&b, msgs, n); break;
    }
    bool oom = b.oom || sys.text.oom;
    free(sys.text.s);
    if (oom) { free(b.s); return NULL; }
    return b.s;
}
