/* llm/generate.c with the real stories260K tokenizer: prompt building, stop
 * strings held back across tokens and never emitted, EOS, max_tokens and
 * context limits, request validation, structured output. And, on a
 * byte-level vocabulary built here, reasoning models' output
 * (llm/gen_reasoning.c: gpt-oss's harmony channels, <think> spans) apart
 * from the answer, and tool calls (llm/gen_tools.c). */
#include "tests/unit/check.h"
#include "tests/unit/testutil.h"
#include "llm/gen_impl.h"
#include "proto/worker_request.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

/* A byte-level BPE vocabulary of the 256 byte symbols (GPT-2's mapping of
 * bytes to printable code points), harmony's control tokens and the think
 * markers, no merges. */
static const char *const SPECIAL[] = { "<|start|>", "<|end|>", "<|channel|>", "<|message|>", "<|return|>", "<|call|>",
                                       "<think>", "</think>", "<tool_call>", "</tool_call>", "<|python_tag|>" };
enum { N_SPECIAL = sizeof SPECIAL / sizeof SPECIAL[0] };
enum { S_START, S_END, S_CHANNEL, S_MESSAGE, S_RETURN, S_CALL, S_THINK, S_UNTHINK, S_TOOL, S_UNTOOL, S_PYTHON };

/* One step of a scripted output: a special token, or text (byte tokens). */
typedef struct { int special; const char *text; } step;
#define TEXT(s) { -1, s }

typedef struct { char answer[256], reasoning[256], calls[256]; int fin, steps, n_calls; } run_out;

/* Feeds the script to g token by token, collecting both deltas. */
static run_out run_script(sw_gen *g, const sw_tokenizer *t, const int32_t *id, const step *script, size_t n_steps)
{
    run_out r = { .answer = "", .reasoning = "" };
    for (size_t i = 0; i < n_steps && !r.fin; i++) {
        int32_t ids[64];
        int n = 1;
        if (script[i].special >= 0) ids[0] = id[script[i].special];
        else n = sw_tok_encode(t, script[i].text, strlen(script[i].text), false, false, ids, 64);
        for (int k = 0; k < n && !r.fin; k++, r.steps++) {
            const char *d;
            size_t dl, rl;
            r.fin = sw_gen_accept(g, ids[k], &d, &dl);
            const char *rd = sw_gen_reasoning(g, &rl);
            CHECK(strlen(d) == dl && strlen(rd) == rl, "delta lengths");
            strncat(r.answer, d, sizeof r.answer - strlen(r.answer) - 1);
            strncat(r.reasoning, rd, sizeof r.reasoning - strlen(r.reasoning) - 1);
            size_t nc;
            const sw_tool_call *c = sw_gen_tool_calls(g, &nc);
            for (size_t j = 0; j < nc; j++, r.n_calls++) {   /* "name(arguments);" each */
                size_t at = strlen(r.calls);
                snprintf(r.calls + at, sizeof r.calls - at, "%s(%s);", c[j].name, c[j].arguments);
            }
        }
    }
    return r;
}

static bool start_chat_tools(sw_gen *g, const sw_tokenizer *t, sw_chat_template chat, const char *stop,
                             const cJSON *tools)
{
    char err[256] = "";
    const sw_chat_msg msgs[] = { { .role = "system", .content = "Be brief." }, { .role = "user", .content = "Hi" } };
    const char *stops[1] = { stop };
    sw_gen_params p = { .messages = msgs, .n_messages = 2, .stop = stops, .n_stop = stop ? 1 : 0, .tools = tools };
    int rc = sw_gen_init(g, t, chat, &p, 4096, err, sizeof err);
    CHECK(rc == 0, "init %s: %s", sw_chat_name(chat), err);
    return rc == 0;
}

static bool start_chat(sw_gen *g, const sw_tokenizer *t, sw_chat_template chat, const char *stop)
{
    return start_chat_tools(g, t, chat, stop, NULL);
}

/* Tool calls: with tools offered to a chatml model, a <tool_call> span is a
 * call (arguments in json.dumps form), not answer text; one that does not
 * parse, or is cut off, stays text; without tools the span is text. */
static void test_tool_calls(const sw_tokenizer *t, const int32_t *id)
{
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]");
    const step calls[] = { TEXT("On it."), { S_TOOL, 0 }, TEXT("\n{\"name\":\"f\",\"arguments\":{\"x\":[1,2.5]}}\n"),
                           { S_UNTOOL, 0 }, { S_TOOL, 0 }, TEXT("{\"name\": \"g\"}"), { S_UNTOOL, 0 },
                           { S_TOOL, 0 }, TEXT("{\"name\": 1}"), { S_UNTOOL, 0 }, { S_RETURN, 0 } };
    sw_gen g;
    char err[256] = "";
    if (start_chat_tools(&g, t, SW_CHAT_CHATML, NULL, tools)) {
        run_out r = run_script(&g, t, id, calls, sizeof calls / sizeof calls[0]);
        CHECK(!strcmp(r.calls, "f({\"x\": [1, 2.5]});g({});") && r.n_calls == 2 && g.n_calls_total == 2,
              "calls: %s", r.calls);
        CHECK(!strcmp(r.answer, "On it.<tool_call>{\"name\": 1}</tool_call>") && r.fin == SW_FINISH_STOP,
              "answer '%s'", r.answer);
        sw_gen_free(&g);
    }
    /* Cut off inside a call (max_tokens): what was written is the answer. */
    const sw_chat_msg msgs[] = { { .role = "user", .content = "Hi" } };
    sw_gen_params p = { .messages = msgs, .n_messages = 1, .max_tokens = 4, .tools = tools };
    CHECK(sw_gen_init(&g, t, SW_CHAT_CHATML, &p, 4096, err, sizeof err) == 0, "%s", err);
    run_out r = run_script(&g, t, id, calls + 1, 2);
    CHECK(r.fin == SW_FINISH_LENGTH && !strcmp(r.answer, "<tool_call>\n{\"") && !r.n_calls, "cut off: '%s'", r.answer);
    sw_gen_free(&g);
    /* No tools offered: the span is the answer, markers and all. */
    if (start_chat(&g, t, SW_CHAT_CHATML, NULL)) {
        r = run_script(&g, t, id, calls + 4, 3);
        CHECK(!strcmp(r.answer, "<tool_call>{\"name\": \"g\"}</tool_call>") && !r.n_calls, "no tools: '%s'", r.answer);
        sw_gen_free(&g);
    }
    /* A family without a tool format refuses tools. */
    sw_gen_params pl = { .messages = msgs, .n_messages = 1, .tools = tools };
    CHECK(sw_gen_init(&g, t, SW_CHAT_GEMMA, &pl, 4096, err, sizeof err) == 400 && strstr(err, "tool-calling"),
          "gemma with tools: %s", err);

    /* gpt-oss: a commentary message to=functions.NAME is a call, its
     * message the arguments (json.dumps form when they parse, else as
     * written); the recipient may be in the role part of the header. */
    const step harmony[] = {
        { S_CHANNEL, 0 }, TEXT("analysis"), { S_MESSAGE, 0 }, TEXT("Need it."), { S_END, 0 },
        { S_START, 0 }, TEXT("assistant"), { S_CHANNEL, 0 }, TEXT("commentary to=functions.f <|constrain|>json"),
        { S_MESSAGE, 0 }, TEXT("{\"city\":\"Paris\"}"), { S_END, 0 },
        { S_START, 0 }, TEXT("assistant to=functions.g"), { S_CHANNEL, 0 }, TEXT("commentary json"),
        { S_MESSAGE, 0 }, TEXT("not json"), { S_CALL, 0 },
    };
    if (start_chat_tools(&g, t, SW_CHAT_HARMONY, NULL, tools)) {
        run_out r = run_script(&g, t, id, harmony, sizeof harmony / sizeof harmony[0]);
        CHECK(!strcmp(r.calls, "f({\"city\": \"Paris\"});g(not json);") && !strcmp(r.reasoning, "Need it.") &&
              !r.answer[0] && r.fin == SW_FINISH_STOP, "harmony calls '%s' reasoning '%s' answer '%s'", r.calls,
              r.reasoning, r.answer);
        sw_gen_free(&g);
    }
    /* Llama 3.1: an answer that is JSON objects (";" between, "parameters"
     * or "arguments", <|python_tag|> first or not) is calls; one that only
     * looks like it, or is text, is text. */
    static const struct { bool tag; const char *out, *calls, *answer; } llama[] = {
        { false, " {\"name\": \"f\", \"parameters\": {\"x\": 1}}", "f({\"x\": 1});", " " },
        { true, "{\"name\":\"f\",\"arguments\":{}}; {\"name\":\"g\"}", "f({});g({});", "" },
        { false, "{\"name\": \"f\"} trailing", "", "{\"name\": \"f\"} trailing" },
        { false, "{\"foo\": 1}", "", "{\"foo\": 1}" },
        { false, "Hi {\"name\": \"f\"}", "", "Hi {\"name\": \"f\"}" },
    };
    for (size_t k = 0; k < sizeof llama / sizeof llama[0]; k++) {
        if (!start_chat_tools(&g, t, SW_CHAT_LLAMA3, NULL, tools)) continue;
        const step out[] = { { llama[k].tag ? S_PYTHON : -1, llama[k].tag ? NULL : "" }, TEXT(llama[k].out),
                             { S_RETURN, 0 } };
        run_out r = run_script(&g, t, id, out + !llama[k].tag, 3 - !llama[k].tag);
        CHECK(!strcmp(r.calls, llama[k].calls) && !strcmp(r.answer, llama[k].answer) && r.fin == SW_FINISH_STOP,
              "llama3 %zu: calls '%s' answer '%s'", k, r.calls, r.answer);
        sw_gen_free(&g);
    }
    /* Without tools offered such messages are nobody's text. */
    if (start_chat(&g, t, SW_CHAT_HARMONY, NULL)) {
        run_out r = run_script(&g, t, id, harmony, sizeof harmony / sizeof harmony[0]);
        CHECK(!r.n_calls && !r.answer[0] && !strcmp(r.reasoning, "Need it."), "harmony without tools: '%s'", r.calls);
        sw_gen_free(&g);
    }
    cJSON_Delete(tools);
}

/* Reasoning models' output, split into reasoning and answer. */
/* The vocabulary of test_reasoning, written to path: the 256 byte symbols
 * and SPECIAL. */
static gguf_file *reasoning_vocab(const char *path)
{
    static char sym[256][4];
    const char *toks[256 + N_SPECIAL];
    int32_t types[256 + N_SPECIAL];
    for (int b = 0; b < 256; b++) {
        unsigned cp = (unsigned)gpt2_byte_cp(b);
        if (cp < 0x80) sym[b][0] = (char)cp;
        else { sym[b][0] = (char)(0xC0 | (cp >> 6)); sym[b][1] = (char)(0x80 | (cp & 0x3F)); }
        toks[b] = sym[b];
        types[b] = 1;
    }
    for (int k = 0; k < N_SPECIAL; k++) { toks[256 + k] = SPECIAL[k]; types[256 + k] = k < S_THINK ? 3 : 4; }   /* 4: shown as text */
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", "gpt-4o");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 256 + N_SPECIAL);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, 256 + N_SPECIAL);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", toks, 0);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 256 + S_RETURN);
    return write_and_open(w, path);
}

/* Reasoning kept apart from the answer, in each family's format. */
static void reasoning_cases(sw_tokenizer *t, const int32_t *id)
{
    char err[256] = "";
    sw_gen g;
    run_out r;

    /* gpt-oss: analysis is the reasoning, final the answer, and a commentary
     * message (a tool call) neither; the headers are nobody's text. */
    if (start_chat(&g, t, SW_CHAT_HARMONY, NULL)) {
        CHECK(g.n_prompt > 10 && g.prompt[g.n_prompt - 10] == id[S_START], "the prompt ends with <|start|>assistant");
        const step harmony[] = {
            { S_CHANNEL, 0 }, TEXT("analysis"), { S_MESSAGE, 0 }, TEXT("The user greets."), { S_END, 0 },
            { S_START, 0 }, TEXT("assistant"), { S_CHANNEL, 0 }, TEXT("commentary"), { S_MESSAGE, 0 }, TEXT("{}"),
            { S_END, 0 },
            { S_START, 0 }, TEXT("assistant"), { S_CHANNEL, 0 }, TEXT("final"), { S_MESSAGE, 0 }, TEXT("Hello!"),
            { S_RETURN, 0 },
        };
        r = run_script(&g, t, id, harmony, sizeof harmony / sizeof harmony[0]);
        CHECK(!strcmp(r.answer, "Hello!"), "harmony answer '%s', want only the final channel's 'Hello!'", r.answer);
        CHECK(!strcmp(r.reasoning, "The user greets."), "harmony reasoning '%s'", r.reasoning);
        CHECK(r.fin == SW_FINISH_STOP && g.n_generated == (uint32_t)r.steps, "finished %d after %d tokens", r.fin, r.steps);
        CHECK(g.n_reasoning_tokens == 16, "%u reasoning tokens, want the analysis text's 16", g.n_reasoning_tokens);
        sw_gen_free(&g);
    }

    /* A think chat (Qwen3's chatml): <think> first opens the reasoning,
     * </think> closes it, the answer's leading blank lines are dropped, and
     * a stop string applies to the answer only. */
    const step think[] = { { S_THINK, 0 }, TEXT("\nHmm, 2+2.\n"), { S_UNTHINK, 0 }, TEXT("\n\n"), TEXT("It is 4."),
                           { S_RETURN, 0 } };
    if (start_chat(&g, t, SW_CHAT_CHATML, "Hmm")) {
        r = run_script(&g, t, id, think, sizeof think / sizeof think[0]);
        CHECK(!strcmp(r.reasoning, "\nHmm, 2+2.\n") && !strcmp(r.answer, "It is 4."),
              "think chat: reasoning '%s' answer '%s'", r.reasoning, r.answer);
        CHECK(r.fin == SW_FINISH_STOP && g.n_reasoning_tokens == 13, "finish %d, %u reasoning tokens (want 11 + 2 markers)",
              r.fin, g.n_reasoning_tokens);
        sw_gen_free(&g);
    }
    /* ... and a stop string in the answer still stops it. */
    if (start_chat(&g, t, SW_CHAT_CHATML, "is")) {
        r = run_script(&g, t, id, think, sizeof think / sizeof think[0]);
        CHECK(r.fin == SW_FINISH_STOP && !strcmp(r.answer, "It ") && !strcmp(r.reasoning, "\nHmm, 2+2.\n"),
              "stop in the answer: '%s' / '%s'", r.answer, r.reasoning);
        sw_gen_free(&g);
    }
    /* A think chat that answers at once has no reasoning; a later <think>
     * is just text. */
    if (start_chat(&g, t, SW_CHAT_CHATML, NULL)) {
        const step direct[] = { TEXT("4"), { S_THINK, 0 }, TEXT("!"), { S_RETURN, 0 } };
        r = run_script(&g, t, id, direct, sizeof direct / sizeof direct[0]);
        CHECK(!strcmp(r.answer, "4<think>!") && !r.reasoning[0] && g.n_reasoning_tokens == 0,
              "direct answer '%s' reasoning '%s'", r.answer, r.reasoning);
        sw_gen_free(&g);
    }
    /* DeepSeek R1: its template opens <think> in the prompt, so the output
     * starts inside the reasoning; max_tokens counts reasoning tokens too,
     * and a finish inside the reasoning leaves the answer empty. */
    if (start_chat(&g, t, SW_CHAT_DEEPSEEK_R1, NULL)) {
        const step r1[] = { TEXT("Hmm."), { S_UNTHINK, 0 }, TEXT("OK"), { S_RETURN, 0 } };
        r = run_script(&g, t, id, r1, sizeof r1 / sizeof r1[0]);
        CHECK(!strcmp(r.reasoning, "Hmm.") && !strcmp(r.answer, "OK") && g.n_reasoning_tokens == 5,
              "R1: reasoning '%s' answer '%s' (%u tokens)", r.reasoning, r.answer, g.n_reasoning_tokens);
        sw_gen_free(&g);
        const sw_chat_msg msgs[] = { { .role = "user", .content = "Hi" } };
        sw_gen_params p = { .messages = msgs, .n_messages = 1, .max_tokens = 3 };
        CHECK(sw_gen_init(&g, t, SW_CHAT_DEEPSEEK_R1, &p, 4096, err, sizeof err) == 0, "%s", err);
        r = run_script(&g, t, id, r1, sizeof r1 / sizeof r1[0]);
        CHECK(r.fin == SW_FINISH_LENGTH && !strcmp(r.reasoning, "Hmm") && !r.answer[0],
              "R1 cut short: reasoning '%s' answer '%s'", r.reasoning, r.answer);
        sw_gen_free(&g);
    }
}

/* A plain completion with the same vocabulary is not split. */
static void plain_not_split(sw_tokenizer *t, const int32_t *id)
{
    char err[256] = "";
    sw_gen g;
    run_out r;
    sw_gen_params q = { .prompt = "x" };
    CHECK(sw_gen_init(&g, t, SW_CHAT_DEEPSEEK_R1, &q, 4096, err, sizeof err) == 0, "init: %s", err);
    const step plain[] = { TEXT("a"), { S_UNTHINK, 0 }, TEXT("b") };
    r = run_script(&g, t, id, plain, sizeof plain / sizeof plain[0]);
    CHECK(!strcmp(r.answer, "a</think>b") && !r.reasoning[0], "plain completion: '%s' / '%s'", r.answer, r.reasoning);
    sw_gen_free(&g);
}

static void test_reasoning(void)
{
    char path[] = "/tmp/sw_test_reasoning_XXXXXX", err[256] = "";
    int fd = mkstemp(path);
    if (fd < 0) return;
    close(fd);
    gguf_file *f = reasoning_vocab(path);
    sw_tokenizer *t = f ? sw_tok_load(f, err, sizeof err) : NULL;
    CHECK(t != NULL, "reasoning vocab: %s", err);
    int32_t id[N_SPECIAL];
    for (int k = 0; t && k < N_SPECIAL; k++) id[k] = sw_tok_lookup(t, SPECIAL[k]);
    if (t) {
        CHECK(!sw_tok_is_eog(t, id[S_END]) && sw_tok_is_eog(t, id[S_RETURN]) && sw_tok_is_eog(t, id[S_CALL]),
              "<|end|> ends a message, <|return|> and <|call|> the turn");
        reasoning_cases(t, id);
        test_tool_calls(t, id);
        plain_not_split(t, id);
    }
    sw_tok_free(t);
    gguf_close(f);
    unlink(path);
}

static sw_tokenizer *tok;

/* Feeds the tokens that continue the prompt "Once upon a time" with `text`
 * (as the model would generate them) one by one; collects the deltas. */
static int feed(sw_gen *g, const char *text, char *out, size_t cap, int *n_fed, const char **seen_at_each)
{
    char full[1024];
    int32_t ids[256];
    snprintf(full, sizeof full, "Once upon a time%s", text);
    int n = sw_tok_encode(tok, full, strlen(full), true, false, ids, 256);
    CHECK(n > 5 && ids[0] == 1 && ids[1] == 403 && ids[4] == 378, "encode '%s'", full);
    int fin = 0;
    for (int i = 5; i < n && !fin; i++) {
        const char *d;
        size_t dl;
        fin = sw_gen_accept(g, ids[i], &d, &dl);
        CHECK(strlen(d) == dl);
        strncat(out, d, cap - strlen(out) - 1);
        if (seen_at_each) seen_at_each[i - 5] = strdup(out);
        (*n_fed)++;
    }
    return fin;
}

static void init(sw_gen *g, const char *prompt, uint32_t max_tokens, const char *stop, int n_ctx)
{
    char err[256];
    const char *stops[1] = { stop };
    sw_gen_params p = { .prompt = prompt, .max_tokens = max_tokens, .stop = stops, .n_stop = stop ? 1 : 0 };
    int rc = sw_gen_init(g, tok, SW_CHAT_PLAIN, &p, n_ctx, err, sizeof err);
    CHECK(rc == 0, "init: %s", err);
}

/* Feeds ids[0..n) to g (up to a finish); the deltas go to out. Returns
 * the finish reason. */
static int feed_ids(sw_gen *g, const int32_t *ids, int n, sw_sbuf *out)
{
    int fin = 0;
    for (int i = 0; i < n && !fin; i++) {
        const char *d;
        size_t dl;
        fin = sw_gen_accept(g, ids[i], &d, &dl);
        CHECK(strlen(d) == dl);
        sw_sbuf_put_n(out, d, dl);
    }
    return fin;
}

/* Stop strings as long as the gateway allows (SW_MAX_STOP_LEN): a stop of
 * ~1000 bytes, spanning hundreds of tokens, is held back whole and never
 * emitted; one that differs in its last byte releases every byte. */
static void test_long_stop(void)
{
    char text[2048] = "";
    for (int day = 1; strlen(text) < 1400; day++) {
        size_t at = strlen(text);
        snprintf(text + at, sizeof text - at, " On day %d, Lily saw %d birds in the park.", day, 3 * day + 1);
    }
    int32_t ids[2048];
    int n = sw_tok_encode(tok, text, strlen(text), false, false, ids, 2048);
    CHECK(n > 300, "%d tokens", n);
    char err[256];
    /* The text as the generator decodes it, without a stop string. */
    sw_gen g;
    sw_gen_params p = { .prompt = "Once upon a time" };
    CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &p, 4096, err, sizeof err) == 0, "%s", err);
    sw_sbuf all = { 0 };
    CHECK(feed_ids(&g, ids, n, &all) == SW_FINISH_NONE);
    const char *d;
    size_t dl;
    CHECK(sw_gen_accept(&g, sw_tok_eos(tok), &d, &dl) == SW_FINISH_STOP);
    sw_gen_free(&g);
    CHECK(all.s && all.n > 1200, "decoded %zu bytes", all.n);
    if (!all.s || all.n <= 1200) return;

    char stop[SW_MAX_STOP_LEN + 1];
    memcpy(stop, all.s + 150, 1000);
    stop[1000] = 0;
    const char *stops[1] = { stop };
    p.stop = stops;
    p.n_stop = 1;
    CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &p, 4096, err, sizeof err) == 0, "%s", err);
    sw_sbuf out = { 0 };
    CHECK(feed_ids(&g, ids, n, &out) == SW_FINISH_STOP, "the 1000-byte stop string ends generation");
    CHECK(out.n == 150 && !memcmp(out.s, all.s, 150), "%zu bytes before the stop: '%.*s'", out.n, (int)out.n, out.s);
    sw_gen_free(&g);
    sw_sbuf_free(&out);

    stop[999] = '#';   /* never in the text: everything is released by the end */
    CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &p, 4096, err, sizeof err) == 0, "%s", err);
    CHECK(feed_ids(&g, ids, n, &out) == SW_FINISH_NONE);
    CHECK(out.n + 999 >= all.n && out.n < all.n, "held back %zu bytes", all.n - out.n);
    CHECK(sw_gen_accept(&g, sw_tok_eos(tok), &d, &dl) == SW_FINISH_STOP);
    sw_sbuf_put_n(&out, d, dl);
    CHECK(out.n == all.n && !memcmp(out.s, all.s, all.n), "all %zu bytes released", all.n);
    sw_gen_free(&g);
    sw_sbuf_free(&out);

    /* One byte longer than the limit is refused. */
    char over[SW_MAX_STOP_LEN + 2];
    memset(over, 'a', SW_MAX_STOP_LEN + 1);
    over[SW_MAX_STOP_LEN + 1] = 0;
    stops[0] = over;
    CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &p, 4096, err, sizeof err) == 400 && strstr(err, "stop"), "%s", err);
    sw_sbuf_free(&all);
}

/* Structured output on the stories260K vocabulary: from random logits (one
 * row favouring a word that is not JSON), sampled and greedy, the output
 * is JSON fitting the schema, and generation ends where the JSON ends. */
static void test_structured(void)
{
    const char *schema_text = "{\"type\":\"object\",\"properties\":{\"c\":{\"enum\":[\"red\",\"blue\"]},"
                              "\"n\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"}},"
                              "\"required\":[\"c\",\"n\",\"ok\"],\"additionalProperties\":false}";
    cJSON *schema = cJSON_Parse(schema_text);
    int32_t V = sw_tok_n_vocab(tok);
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t once[4];
    CHECK(sw_tok_encode(tok, "Once", 4, false, false, once, 4) >= 1);
    for (int seed = 0; seed < 8; seed++) {
        sw_gen g;
        char err[256] = "";
        sw_gen_params p = { .prompt = "Once upon a time", .json_schema = schema, .max_tokens = 500 };
        p.sampling.temperature = seed < 2 ? 0.0f : 1.0f;
        p.sampling.seed = (uint64_t)seed;
        CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &p, 2048, err, sizeof err) == 0, "%s", err);
        char out[4096] = "";
        uint64_t rng = (uint64_t)seed * 7919 + 1;
        int fin = 0, steps = 0;
        while (!fin && steps < 500) {
            for (int32_t i = 0; i < V; i++) logits[i] = (float)(sw_splitmix64(&rng) % 1000) / 250.0f;
            if (steps == 0) logits[once[0]] = 50.0f;   /* the model wants a word: it may not have it */
            int32_t t = sw_gen_sample(&g, logits, V);
            CHECK(t >= 0, "sample: %s", sw_gen_error(&g));
            if (t < 0) break;
            const char *d;
            size_t dl;
            fin = sw_gen_accept(&g, t, &d, &dl);
            strncat(out, d, sizeof out - strlen(out) - 1);
            steps++;
        }
        CHECK(fin == SW_FINISH_STOP, "seed %d: finish %d after %d steps: %s", seed, fin, steps, out);
        cJSON *v = cJSON_Parse(out);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "c"), *n = cJSON_GetObjectItemCaseSensitive(v, "n"),
                    *ok = cJSON_GetObjectItemCaseSensitive(v, "ok");
        CHECK(cJSON_IsString(c) && (!strcmp(c->valuestring, "red") || !strcmp(c->valuestring, "blue")) &&
              cJSON_IsNumber(n) && cJSON_IsBool(ok) && cJSON_GetArraySize(v) == 3, "seed %d: %s", seed, out);
        cJSON_Delete(v);
        sw_gen_free(&g);
    }
    /* a schema it cannot enforce is the request's 400 */
    cJSON *bad = cJSON_Parse("{\"type\":\"string\",\"pattern\":\"a\"}");
    sw_gen g;
    char err[256] = "";
    sw_gen_params p = { .prompt = "x", .json_schema = bad };
    CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &p, 64, err, sizeof err) == 400 && strstr(err, "response_format: 'pattern'"),
          "%s", err);
    cJSON_Delete(bad);
    cJSON_Delete(schema);
    free(logits);
}

/* The mask (first-byte groups, big ones filtered on the second byte) lets
 * through exactly the tokens a token-by-token check does, at several
 * states of a schema, on the given vocabulary. */
static void test_mask_equivalence(const sw_tokenizer *t, const char *name)
{
    cJSON *schema = cJSON_Parse("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                                "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\"}},\"required\":[\"name\"]}");
    static const char *const prefixes[] = { "", " ", "{", "{\"", "{\"na", "{\"name\": \"Ann", "{\"name\": \"A\\",
                                             "{\"age\": 1", "{\"age\": -", "{\"tags\": [", "{\"name\": \"x\"}" };
    sw_gen g;
    char err[256] = "";
    sw_gen_params p = { .prompt = "x", .json_schema = schema };
    CHECK(sw_gen_init(&g, t, SW_CHAT_PLAIN, &p, 64, err, sizeof err) == 0, "%s: %s", name, err);
    int32_t V = sw_tok_n_vocab(t);
    float *raw = malloc((size_t)V * sizeof *raw), *masked = malloc((size_t)V * sizeof *masked);
    for (int32_t i = 0; i < V; i++) raw[i] = (float)(i % 97);
    for (size_t k = 0; k < sizeof prefixes / sizeof *prefixes; k++) {
        sw_js_start(g.js, &g.js_st);
        CHECK(sw_js_feed(g.js, &g.js_st, prefixes[k], strlen(prefixes[k])), "%s: prefix %s", name, prefixes[k]);
        int32_t n = sw_gen_json_mask(&g, raw, masked, V), naive = 0, wrong = 0;
        for (int32_t i = 0; i < V; i++) {
            size_t len;
            const char *piece = sw_tok_piece_ref(t, i, &len);
            bool ok = sw_tok_is_eog(t, i) ? sw_js_complete(g.js, &g.js_st)
                                          : len > 0 && sw_js_accepts(g.js, &g.js_st, piece, len);
            naive += ok;
            wrong += ok != (masked[i] == raw[i]);
        }
        CHECK(n == naive && wrong == 0, "%s after '%s': mask %d, token by token %d, %d differ", name, prefixes[k], n, naive,
              wrong);
    }
    free(raw);
    free(masked);
    sw_gen_free(&g);
    cJSON_Delete(schema);
}

/* Stop strings held back and never emitted; false starts released. */
static void test_stops(void)
{
    sw_gen g;
    char out[4096];
    int n = 0;

    /* Prompt: BOS + text, as llama2.c encodes it. */
    init(&g, "Once upon a time", 100, NULL, 512);
    CHECK(g.n_prompt == 5 && g.prompt[0] == 1 && g.prompt[1] == 403 && g.prompt[4] == 378);
    out[0] = 0;
    CHECK(feed(&g, ", there was a little girl", out, sizeof out, &n, NULL) == SW_FINISH_NONE);
    CHECK(strcmp(out, ", there was a little girl") == 0, "'%s'", out);
    CHECK(g.n_generated == (uint32_t)n && sw_gen_next_pos(&g) == 5 + n - 1);
    sw_gen_free(&g);

    /* A stop string spanning several tokens: its first part is held back,
     * nothing of it is ever emitted, and generation finishes with STOP. */
    init(&g, "Once upon a time", 100, "girl named", 512);
    out[0] = 0;
    n = 0;
    const char *seen[64] = {0};
    int fin = feed(&g, " there was a little girl named Lily", out, sizeof out, &n, seen);
    CHECK(fin == SW_FINISH_STOP, "fin %d", fin);
    CHECK(strcmp(out, " there was a little ") == 0, "'%s'", out);
    CHECK(!strstr(out, "girl"));
    for (int i = 0; i < 64; i++) free((void *)seen[i]);
    /* Finished: further tokens are ignored. */
    const char *d;
    size_t dl;
    CHECK(sw_gen_accept(&g, 403, &d, &dl) == SW_FINISH_STOP && dl == 0);
    sw_gen_free(&g);

    /* A false start: held text is released once it can no longer become the stop string. */
    init(&g, "Once upon a time", 100, "little boy", 512);
    out[0] = 0;
    n = 0;
    const char *seen2[64] = {0};
    fin = feed(&g, " there was a little girl", out, sizeof out, &n, seen2);
    CHECK(fin == SW_FINISH_NONE);
    /* the final "l" is still held: it could begin "little boy" */
    CHECK(strcmp(out, " there was a little gir") == 0, "'%s'", out);
    /* after " little" the word was held (it could start "little boy") */
    bool held = false;
    for (int i = 0; i < n; i++) if (seen2[i] && !strcmp(seen2[i], " there was a ")) held = true;
    CHECK(held);
    for (int i = 0; i < 64; i++) free((void *)seen2[i]);
    sw_gen_free(&g);

    /* Held text is flushed when generation ends for another reason. */
    init(&g, "Once upon a time", 4, "little boy", 512);
    out[0] = 0;
    n = 0;
    fin = feed(&g, " there was a little", out, sizeof out, &n, NULL);
    CHECK(fin == SW_FINISH_LENGTH && n == 4, "fin %d after %d", fin, n);
    CHECK(strcmp(out, " there was a little") == 0, "'%s'", out);
    sw_gen_free(&g);
}

/* EOS, the context and NaN logits end generation. */
static void test_ends(void)
{
    sw_gen g;
    char out[4096];
    int n = 0, fin;
    const char *d;
    size_t dl;
    /* EOS finishes with STOP and adds no text. */
    init(&g, "Once upon a time", 100, NULL, 512);
    CHECK(sw_gen_accept(&g, sw_tok_eos(tok), &d, &dl) == SW_FINISH_STOP && dl == 0);
    CHECK(g.n_generated == 1);
    sw_gen_free(&g);

    /* The context bounds generation: prompt 5 + 3 generated = 8 positions. */
    init(&g, "Once upon a time", 0, NULL, 8);
    out[0] = 0;
    n = 0;
    fin = feed(&g, " there was a little girl named Lily", out, sizeof out, &n, NULL);
    CHECK(fin == SW_FINISH_LENGTH && n == 3, "fin %d after %d", fin, n);
    sw_gen_free(&g);
    /* ... and so does a context lowered once the prompt is known (never
     * below the prompt, never raised). */
    init(&g, "Once upon a time", 0, NULL, 512);
    sw_gen_limit_ctx(&g, 4);
    sw_gen_limit_ctx(&g, 1024);
    sw_gen_limit_ctx(&g, 8);
    out[0] = 0;
    n = 0;
    fin = feed(&g, " there was a little girl named Lily", out, sizeof out, &n, NULL);
    CHECK(fin == SW_FINISH_LENGTH && n == 3, "limited: fin %d after %d", fin, n);
    sw_gen_free(&g);

    /* NaN logits are refused (-1), not sampled around. */
    init(&g, "Once upon a time", 100, NULL, 512);
    {
        float row[512];
        for (int i = 0; i < 512; i++) row[i] = (float)(i % 7);
        CHECK(sw_gen_sample(&g, row, 512) >= 0);
        for (int i = 0; i < 512; i++) row[i] = (float)(i % 7);
        row[300] = NAN;
        CHECK(sw_gen_sample(&g, row, 512) == -1);
    }
    sw_gen_free(&g);
}

/* Prompt forms (ids, chat, the wire's) and request validation. */
static void test_prompts(void)
{
    sw_gen g;
    char err[512];
    /* A prompt given as token ids is used as is (no BOS added). */
    int32_t ids[3] = { 403, 407, 261 };
    sw_gen_params p = { .prompt_ids = ids, .n_prompt_ids = 3, .max_tokens = 5 };
    CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &p, 512, err, sizeof err) == 0);
    CHECK(g.n_prompt == 3 && g.prompt[0] == 403);
    sw_gen_free(&g);

    /* Validation: each failure is 400 with a message, and leaves nothing to free. */
    ids[1] = 512;
    CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &p, 512, err, sizeof err) == 400 && strstr(err, "out of range"), "%s", err);
    ids[1] = -1;
    CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &p, 512, err, sizeof err) == 400);
    ids[1] = 407;
    CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &p, 2, err, sizeof err) == 400 && strstr(err, "context"), "%s", err);
    const char *many[SW_MAX_STOPS + 1];
    for (int i = 0; i <= SW_MAX_STOPS; i++) many[i] = "x";
    sw_gen_params ps = { .prompt = "Hi", .stop = many, .n_stop = SW_MAX_STOPS + 1 };
    CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &ps, 512, err, sizeof err) == 400 && strstr(err, "stop"), "%s", err);

    /* Chat messages go through the template; special-token text is parsed. */
    sw_chat_msg msgs[2] = { { .role = "system", .content = "Be brief." }, { .role = "user", .content = "Tell me a story" } };
    sw_gen_params pc = { .messages = msgs, .n_messages = 2, .max_tokens = 5 };
    CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &pc, 512, err, sizeof err) == 0, "%s", err);
    CHECK(g.n_prompt > 6 && g.prompt[0] == 1);
    sw_gen_free(&g);

    /* The same through a wire request. */
    Spillway__GenerateRequest r = SPILLWAY__GENERATE_REQUEST__INIT;
    Spillway__SamplingParams sp = SPILLWAY__SAMPLING_PARAMS__INIT;
    uint32_t wids[2] = { 1, 403 };
    r.request_id = "x";
    r.prompt_tokens = wids;
    r.n_prompt_tokens = 2;
    r.sampling = &sp;
    r.max_tokens = 7;
    sw_request rq;
    CHECK(sw_request_from_wire(&rq, &r, err, sizeof err) == 0, "%s", err);
    CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &rq.gen, 512, err, sizeof err) == 0, "%s", err);
    sw_request_free(&rq);
    CHECK(g.n_prompt == 2 && g.max_tokens == 7);
    sw_gen_free(&g);
    sw_gen *gw = sw_gen_from_wire(tok, SW_CHAT_PLAIN, &r, 512, err, sizeof err);
    CHECK(gw && sw_gen_n_prompt(gw) == 2, "%s", err);
    sw_gen_delete(gw);
    /* logit_bias ids are the generator's to check, against its vocabulary */
    Spillway__LogitBias lb = SPILLWAY__LOGIT_BIAS__INIT, *lbs[1] = { &lb };
    lb.token_id = 512;
    lb.bias = 5;
    sp.logit_bias = lbs;
    sp.n_logit_bias = 1;
    CHECK(!(gw = sw_gen_from_wire(tok, SW_CHAT_PLAIN, &r, 512, err, sizeof err)) && strstr(err, "logit_bias"), "%s", err);
    sp.n_logit_bias = 0;
}

int main(void)
{
    char path[512], err[512];
    test_reasoning();
    shared_path(path, sizeof path, "models/stories260K.gguf");
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) SKIP_TEST("%s: %s", path, err);
    tok = sw_tok_load(f, err, sizeof err);
    CHECK(tok != NULL, "%s", err);
    if (!tok) CHECK_DONE();

    test_stops();
    test_ends();
    test_prompts();
    test_long_stop();
    test_structured();
    test_mask_equivalence(tok, "stories260K");
    shared_path(path, sizeof path, "vocab/ggml-vocab-gpt-2.gguf");
    gguf_file *gf = gguf_open(path, err, sizeof err);
    sw_tokenizer *gpt2 = gf ? sw_tok_load(gf, err, sizeof err) : NULL;
    if (gpt2) test_mask_equivalence(gpt2, "gpt-2");
    else printf("gpt-2 vocabulary not found (%s): its mask check skipped\n", path);
    sw_tok_free(gpt2);
    if (gf) gguf_close(gf);
    sw_tok_free(tok);
    gguf_close(f);
    CHECK_DONE();
}
