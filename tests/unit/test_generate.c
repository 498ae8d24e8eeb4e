/* llm/generate.c with the real stories260K tokenizer: prompt building, stop
 * strings held back across tokens and never emitted, EOS, max_tokens and
 * context limits, request validation. And a harmony chat (gpt-oss) on a
 * byte-level vocabulary built here: only the final channel is output. */
#include "tests/unit/check.h"
#include "tests/unit/testutil.h"
#include "llm/generate.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

/* A byte-level BPE vocabulary of the 256 byte symbols (GPT-2's mapping of
 * bytes to printable code points) and harmony's control tokens, no merges. */
static const char *const HARMONY[] = { "<|start|>", "<|end|>", "<|channel|>", "<|message|>", "<|return|>", "<|call|>" };
enum { N_HARMONY = sizeof HARMONY / sizeof HARMONY[0] };

static void test_harmony_final_channel(void)
{
    static char sym[256][4];
    const char *toks[256 + N_HARMONY];
    int32_t types[256 + N_HARMONY];
    for (int b = 0; b < 256; b++) {
        unsigned cp = (unsigned)gpt2_byte_cp(b);
        if (cp < 0x80) sym[b][0] = (char)cp;
        else { sym[b][0] = (char)(0xC0 | (cp >> 6)); sym[b][1] = (char)(0x80 | (cp & 0x3F)); }
        toks[b] = sym[b];
        types[b] = 1;
    }
    for (int k = 0; k < N_HARMONY; k++) { toks[256 + k] = HARMONY[k]; types[256 + k] = 3; }
    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", "gpt-4o");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 256 + N_HARMONY);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, 256 + N_HARMONY);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", toks, 0);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 256 + 4);
    char path[] = "/tmp/sw_test_harmony_XXXXXX", err[256] = "";
    int fd = mkstemp(path);
    if (fd < 0) return;
    close(fd);
    gguf_file *f = write_and_open(w, path);
    sw_tokenizer *t = f ? sw_tok_load(f, err, sizeof err) : NULL;
    CHECK(t != NULL, "harmony vocab: %s", err);
    if (t) {
        int32_t id[N_HARMONY];
        for (int k = 0; k < N_HARMONY; k++) id[k] = sw_tok_lookup(t, HARMONY[k]);
        CHECK(!sw_tok_is_eog(t, id[1]) && sw_tok_is_eog(t, id[4]) && sw_tok_is_eog(t, id[5]),
              "<|end|> ends a message, <|return|> and <|call|> the turn");
        const sw_chat_msg msgs[] = { { "system", "Be brief." }, { "user", "Hi" } };
        sw_gen_params p = { .messages = msgs, .n_messages = 2 };
        sw_gen g;
        CHECK(sw_gen_init(&g, t, SW_CHAT_HARMONY, &p, 4096, err, sizeof err) == 0, "init: %s", err);
        CHECK(g.n_prompt > 10 && g.prompt[g.n_prompt - 10] == id[0], "the prompt ends with <|start|>assistant");
        /* What gpt-oss answers: reasoning in analysis, then the answer in final. */
        const struct { int special; const char *text; } out[] = {
            { 2, NULL }, { -1, "analysis" }, { 3, NULL }, { -1, "The user greets." }, { 1, NULL },
            { 0, NULL }, { -1, "assistant" }, { 2, NULL }, { -1, "final" }, { 3, NULL }, { -1, "Hello!" }, { 4, NULL },
        };
        char got[256] = "";
        int fin = 0, steps = 0;
        for (size_t i = 0; i < sizeof out / sizeof out[0] && !fin; i++) {
            int32_t ids[64];
            int n = 1;
            if (out[i].special >= 0) ids[0] = id[out[i].special];
            else n = sw_tok_encode(t, out[i].text, strlen(out[i].text), false, false, ids, 64);
            for (int k = 0; k < n && !fin; k++, steps++) {
                const char *d;
                size_t dl;
                fin = sw_gen_accept(&g, ids[k], &d, &dl);
                strncat(got, d, sizeof got - strlen(got) - 1);
            }
        }
        CHECK(!strcmp(got, "Hello!"), "harmony output '%s', want only the final channel's 'Hello!'", got);
        CHECK(fin == SW_FINISH_STOP && g.n_generated == (uint32_t)steps, "finished %d after %d tokens", fin, steps);
        sw_gen_free(&g);
        /* A plain completion with the same vocabulary is not filtered. */
        sw_gen_params q = { .prompt = "x" };
        CHECK(sw_gen_init(&g, t, SW_CHAT_HARMONY, &q, 4096, err, sizeof err) == 0, "init: %s", err);
        const char *d;
        size_t dl;
        sw_gen_accept(&g, id[2], &d, &dl);
        int32_t a = sw_tok_lookup(t, "a");
        sw_gen_accept(&g, a, &d, &dl);
        CHECK(dl == 1 && d[0] == 'a', "plain completion: '%.*s'", (int)dl, d);
        sw_gen_free(&g);
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

int main(void)
{
    char path[512], err[512];
    test_harmony_final_channel();
    shared_path(path, sizeof path, "models/stories260K.gguf");
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) SKIP_TEST("%s: %s", path, err);
    tok = sw_tok_load(f, err, sizeof err);
    CHECK(tok != NULL, "%s", err);
    if (!tok) CHECK_DONE();

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
    const char *many[SW_GEN_MAX_STOPS + 1];
    for (int i = 0; i <= SW_GEN_MAX_STOPS; i++) many[i] = "x";
    sw_gen_params ps = { .prompt = "Hi", .stop = many, .n_stop = SW_GEN_MAX_STOPS + 1 };
    CHECK(sw_gen_init(&g, tok, SW_CHAT_PLAIN, &ps, 512, err, sizeof err) == 400 && strstr(err, "stop"), "%s", err);

    /* Chat messages go through the template; special-token text is parsed. */
    sw_chat_msg msgs[2] = { { "system", "Be brief." }, { "user", "Tell me a story" } };
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
    CHECK(sw_gen_init_request(&g, tok, SW_CHAT_PLAIN, &r, 512, err, sizeof err) == 0, "%s", err);
    CHECK(g.n_prompt == 2 && g.max_tokens == 7);
    sw_gen_free(&g);

    sw_tok_free(tok);
    gguf_close(f);
    CHECK_DONE();
}
