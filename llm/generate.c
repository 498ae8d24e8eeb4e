/* Per-sequence generation, the core: prompt building, sampling (with
 * structured output's mask), streaming text with stop strings, finish
 * conditions, log probabilities. Reasoning is in gen_reasoning.c, tool
 * calls in gen_tools.c. See generate.h. */
#include "llm/gen_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include "llm/json.h"
#include "llm/text.h"
#include "llm/util.h"

/* Encodes text into a malloc'd token list. */
int gen_encode(const sw_tokenizer *tok, const char *text, bool add_bos, bool special, int32_t **out, char *err,
               size_t errlen)
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
        g->n_prompt = gen_encode(tok, text, sw_tok_add_bos(tok), true, &g->prompt, err, errlen);
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
        g->n_prompt = gen_encode(tok, p->prompt ? p->prompt : "", sw_tok_add_bos(tok), false,
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

/* A token's id and bytes into a logprob entry. */
static void token_bytes(const sw_gen *g, int32_t id, sw_token_logprob *t)
{
    t->id = id;
    t->n_bytes = (uint8_t)sw_tok_piece(g->tok, id, t->bytes, sizeof t->bytes);
}

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
    gen_reasoning_init(g, chat, p);
    gen_calls_init(g, chat, p);
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
    if ((rc = gen_forced_init(g, chat, p, err, errlen))) return rc;
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

void sw_gen_limit_ctx(sw_gen *g, int n_ctx)
{
    if (n_ctx >= g->n_prompt && n_ctx < g->n_ctx) g->n_ctx = n_ctx;
}
const sw_sampling_params *sw_gen_sampling(const sw_gen *g) { return &g->sampler.p; }
const char *sw_gen_error(const sw_gen *g)
{
    return g->error ? g->error : "the model computed NaN logits (are its weights damaged?)";
}
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
     * vectorized pass without an early exit: the early exit would keep
     * the loop scalar, several times slower on a vocabulary's row. */
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
bool gen_add_text(sw_gen *g, text_dest to, const char *s, size_t n)
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
        if (g->r_mode == R_HARMONY && g->r_state == H_CALL) gen_harmony_call_done(g);   /* <|call|> */
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
    text_dest to = gen_route(g, token, &p, &n);
    g->n_reasoning_tokens += to == TO_REASONING;
    if (to == TO_CALL) sw_sbuf_put_n(&g->call_text, p, n);
    return to == TO_ANSWER ? gen_answer_text(g, token, p, n) : to == TO_CALL ? !g->call_text.oom : gen_add_text(g, to, p, n);
}

/* Nothing more will come: held text is output, and so are bytes of an
 * unfinished code point (as U+FFFD). */
static void finish_text(sw_gen *g, bool eog)
{
    char tail[32];
    size_t n = sw_detok_flush(&g->detok, tail, sizeof tail);
    text_dest to = gen_current_dest(g);
    if ((g->in_call && to == TO_ANSWER) || to == TO_CALL) sw_sbuf_put_n(&g->call_text, tail, n);
    else gen_add_text(g, to, tail, n);
    gen_unfinished_call(g);
    /* a harmony call ends with <|call|>, which ends the turn; one cut off
     * (max_tokens) is not a call */
    if (g->r_mode == R_HARMONY && g->r_state == H_CALL && eog) gen_harmony_call_done(g);
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
