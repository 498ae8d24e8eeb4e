/* The generator's reasoning part: a reasoning model's text routed to the
 * answer, the reasoning or nowhere, token by token (see gen_impl.h). */
#include "llm/gen_impl.h"

#include <string.h>

/* Reasoning models write their thinking before the answer, and a client wants
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

void gen_reasoning_init(sw_gen *g, sw_chat_template chat, const sw_gen_params *p)
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
        if (g->r_state == H_CALL) gen_harmony_call_done(g);
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
text_dest gen_route(sw_gen *g, int32_t token, const char **piece, size_t *n)
{
    if (g->r_mode == R_THINK) return think_route(g, token, piece, n);
    if (g->r_mode == R_HARMONY) return harmony_route(g, token, *piece, n);
    return TO_ANSWER;
}

/* Where text goes now, without a token: the detokenizer's last bytes. */
text_dest gen_current_dest(const sw_gen *g)
{
    if (g->r_mode == R_THINK) return g->r_state == T_IN ? TO_REASONING : TO_ANSWER;
    if (g->r_mode == R_HARMONY)
        return g->r_state == H_ANSWER ? TO_ANSWER : g->r_state == H_REASON ? TO_REASONING
             : g->r_state == H_CALL ? TO_CALL : TO_NONE;
    return TO_ANSWER;
}
