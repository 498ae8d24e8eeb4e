/* proto/wire.c: every message kind survives encode -> decode unchanged, and
 * everything a peer could get wrong is rejected with an error message (never
 * a crash; run this under SANITIZE=1 too). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <zmq.h>
#include "proto/wire.h"
#include "proto/worker_request.h"
#include "tests/unit/check.h"

/* CHECK(cond) without a message expands to an empty format string. */
#pragma GCC diagnostic ignored "-Wformat-zero-length"

static char err[256];

/* Encodes env, decodes it back; NULL (and a failed check) if that fails. */
static sw_env *roundtrip(sw_env *env, uint8_t **frame, size_t *len)
{
    *len = sw_wire_encode(env, frame);
    CHECK(*frame && *len > 0, "encode failed");
    sw_env *d = sw_wire_decode(*frame, *len, err, sizeof err);
    CHECK(d != NULL, "decode of a valid %s failed: %s", sw_wire_kind(env), err);
    return d;
}

/* Decoding must fail with a non-empty error message. */
static void expect_reject(const void *buf, size_t len, const char *why, const char *needle)
{
    err[0] = 0;
    sw_env *d = sw_wire_decode(buf, len, err, sizeof err);
    CHECK(d == NULL, "%s: accepted", why);
    CHECK(err[0] != 0, "%s: no error message", why);
    if (needle) CHECK(strstr(err, needle) != NULL, "%s: error '%s' lacks '%s'", why, err, needle);
    sw_wire_free(d);
}

static void expect_env_reject(sw_env *env, const char *why, const char *needle)
{
    uint8_t *buf;
    size_t n = sw_wire_encode(env, &buf);
    CHECK(buf != NULL, "%s: encode failed", why);
    expect_reject(buf, n, why, needle);
    free(buf);
}

/* ---- valid messages of every kind ---------------------------------------- */

static Spillway__ModelInfo model_a = SPILLWAY__MODEL_INFO__INIT;
static Spillway__ModelInfo model_b = SPILLWAY__MODEL_INFO__INIT;
static Spillway__ModelInfo *models[2] = {&model_a, &model_b};
static Spillway__Register reg = SPILLWAY__REGISTER__INIT;
static Spillway__Heartbeat hb = SPILLWAY__HEARTBEAT__INIT;
static Spillway__SamplingParams sp = SPILLWAY__SAMPLING_PARAMS__INIT;
static Spillway__GenerateRequest gen = SPILLWAY__GENERATE_REQUEST__INIT;
static Spillway__ChatMessage msg_sys = SPILLWAY__CHAT_MESSAGE__INIT, msg_user = SPILLWAY__CHAT_MESSAGE__INIT;
static Spillway__ChatMessage *msgs[2] = {&msg_sys, &msg_user};
static Spillway__Usage usage = SPILLWAY__USAGE__INIT;
static Spillway__TokenChunk chunk = SPILLWAY__TOKEN_CHUNK__INIT;
static Spillway__Cancel cancel_ = SPILLWAY__CANCEL__INIT;
static Spillway__Error error_ = SPILLWAY__ERROR__INIT;
static Spillway__Disconnect disc = SPILLWAY__DISCONNECT__INIT;
static uint32_t prompt_ids[3] = {1, 15043, 32000};
static uint32_t out_ids[2] = {278, 29889};
static char *stops[2] = {"\n\n", "THE END"};

static void init_messages(void)
{
    model_a.name = "llama-3-70b"; model_a.quantization = "q4_k_m"; model_a.context_length = 8192;
    model_b.name = "stories260K"; model_b.quantization = "f32"; model_b.context_length = 512;
    reg.worker_id = "host-123-abcd"; reg.pool = "cpu-pool";
    reg.kind = SPILLWAY__WORKER_KIND__WORKER_KIND_CPU;
    reg.n_models = 2; reg.models = models; reg.slots = 4;

    hb.active = 3; hb.queued = 7; hb.kv_utilization = 0.75f; hb.slots = 4; hb.batch_size = 3;
    hb.tokens_generated = 123456789012ull;

    sp.temperature = 0.7f; sp.top_p = 0.9f; sp.top_k = 40; sp.min_p = 0.05f;
    sp.repetition_penalty = 1.1f; sp.seed = 42; sp.has_seed = 1;
    gen.request_id = "cmpl-0001"; gen.model = "stories260K"; gen.prompt = "Once upon a time";
    gen.sampling = &sp; gen.max_tokens = 252; gen.n_stop = 2; gen.stop = stops;
    gen.deadline_unix_ms = 1800000000000ull; gen.echo_prompt = 1;

    msg_sys.role = "system"; msg_sys.content = "You are terse.";
    msg_user.role = "user"; msg_user.content = "Grüße, 世界 🌍";

    usage.prompt_tokens = 5; usage.completion_tokens = 2;
    chunk.request_id = "cmpl-0001"; chunk.text = " héllo"; chunk.n_token_ids = 2;
    chunk.token_ids = out_ids; chunk.finish_reason = SPILLWAY__FINISH_REASON__FINISH_LENGTH;
    chunk.usage = &usage;

    cancel_.request_id = "cmpl-0001";
    error_.request_id = "cmpl-0001"; error_.code = 404; error_.message = "unknown model 'x'";
    disc.reason = "shutdown";
}

static void test_roundtrips(void)
{
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    uint8_t *frame;
    size_t len;
    sw_env *d;

    env.body_case = SPILLWAY__ENVELOPE__BODY_REGISTER; env.register_ = &reg;
    if ((d = roundtrip(&env, &frame, &len))) {
        CHECK(d->version == SW_PROTOCOL_VERSION);
        CHECK(strcmp(sw_wire_kind(d), "register") == 0);
        CHECK(strcmp(d->register_->worker_id, "host-123-abcd") == 0);
        CHECK(strcmp(d->register_->pool, "cpu-pool") == 0);
        CHECK(d->register_->kind == SPILLWAY__WORKER_KIND__WORKER_KIND_CPU);
        CHECK(d->register_->n_models == 2 && d->register_->slots == 4);
        CHECK(strcmp(d->register_->models[1]->name, "stories260K") == 0);
        CHECK(strcmp(d->register_->models[0]->quantization, "q4_k_m") == 0);
        CHECK(d->register_->models[0]->context_length == 8192);
    }
    sw_wire_free(d); free(frame);

    env.body_case = SPILLWAY__ENVELOPE__BODY_HEARTBEAT; env.heartbeat = &hb;
    if ((d = roundtrip(&env, &frame, &len))) {
        CHECK(strcmp(sw_wire_kind(d), "heartbeat") == 0);
        CHECK(d->heartbeat->active == 3 && d->heartbeat->queued == 7);
        CHECK(d->heartbeat->kv_utilization == 0.75f && d->heartbeat->slots == 4);
        CHECK(d->heartbeat->batch_size == 3 && d->heartbeat->tokens_generated == 123456789012ull);
    }
    sw_wire_free(d); free(frame);

    /* A gateway heartbeat is all zeros: still a valid message. */
    Spillway__Heartbeat zero_hb = SPILLWAY__HEARTBEAT__INIT;
    env.heartbeat = &zero_hb;
    if ((d = roundtrip(&env, &frame, &len))) CHECK(d->heartbeat->active == 0);
    sw_wire_free(d); free(frame);

    env.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE; env.generate = &gen;
    if ((d = roundtrip(&env, &frame, &len))) {
        const Spillway__GenerateRequest *g = d->generate;
        CHECK(strcmp(sw_wire_kind(d), "generate") == 0);
        CHECK(strcmp(g->request_id, "cmpl-0001") == 0 && strcmp(g->model, "stories260K") == 0);
        CHECK(strcmp(g->prompt, "Once upon a time") == 0);
        CHECK(g->n_prompt_tokens == 0 && g->n_messages == 0);
        CHECK(g->max_tokens == 252 && g->n_stop == 2 && strcmp(g->stop[1], "THE END") == 0);
        CHECK(g->deadline_unix_ms == 1800000000000ull && g->echo_prompt);
        CHECK(g->sampling && g->sampling->temperature == 0.7f && g->sampling->top_k == 40);
        CHECK(g->sampling->top_p == 0.9f && g->sampling->min_p == 0.05f);
        CHECK(g->sampling->repetition_penalty == 1.1f);
        CHECK(g->sampling->seed == 42 && g->sampling->has_seed);
    }
    sw_wire_free(d); free(frame);
}

static void test_roundtrips_generate(void)
{
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    uint8_t *frame;
    size_t len;
    sw_env *d;

    env.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE; env.generate = &gen;
    /* Token-id prompt, and chat messages, each on their own. */
    gen.prompt = ""; gen.n_prompt_tokens = 3; gen.prompt_tokens = prompt_ids;
    if ((d = roundtrip(&env, &frame, &len))) {
        CHECK(d->generate->n_prompt_tokens == 3 && d->generate->prompt_tokens[1] == 15043);
        CHECK(d->generate->prompt[0] == 0);
    }
    sw_wire_free(d); free(frame);
    gen.n_prompt_tokens = 0; gen.prompt_tokens = NULL; gen.n_messages = 2; gen.messages = msgs;
    gen.sampling = NULL; /* absent sampling = defaults */
    if ((d = roundtrip(&env, &frame, &len))) {
        CHECK(d->generate->n_messages == 2);
        CHECK(strcmp(d->generate->messages[1]->content, "Grüße, 世界 🌍") == 0);
        CHECK(strcmp(d->generate->messages[0]->role, "system") == 0);
        CHECK(d->generate->sampling == NULL);
    }
    sw_wire_free(d); free(frame);
    gen.n_messages = 0; gen.messages = NULL; gen.prompt = "Once upon a time"; gen.sampling = &sp;

    env.body_case = SPILLWAY__ENVELOPE__BODY_CHUNK; env.chunk = &chunk;
    if ((d = roundtrip(&env, &frame, &len))) {
        CHECK(strcmp(sw_wire_kind(d), "chunk") == 0);
        CHECK(strcmp(d->chunk->text, " héllo") == 0 && d->chunk->n_token_ids == 2);
        CHECK(d->chunk->token_ids[1] == 29889);
        CHECK(d->chunk->finish_reason == SPILLWAY__FINISH_REASON__FINISH_LENGTH);
        CHECK(d->chunk->usage && d->chunk->usage->prompt_tokens == 5 &&
              d->chunk->usage->completion_tokens == 2);
    }
    sw_wire_free(d); free(frame);

    env.body_case = SPILLWAY__ENVELOPE__BODY_CANCEL; env.cancel = &cancel_;
    if ((d = roundtrip(&env, &frame, &len))) {
        CHECK(strcmp(sw_wire_kind(d), "cancel") == 0);
        CHECK(strcmp(d->cancel->request_id, "cmpl-0001") == 0);
    }
    sw_wire_free(d); free(frame);

    env.body_case = SPILLWAY__ENVELOPE__BODY_ERROR; env.error = &error_;
    if ((d = roundtrip(&env, &frame, &len))) {
        CHECK(strcmp(sw_wire_kind(d), "error") == 0);
        CHECK(d->error->code == 404 && strcmp(d->error->message, "unknown model 'x'") == 0);
    }
    sw_wire_free(d); free(frame);
    /* Connection-level error: empty request id is allowed. */
    error_.request_id = "";
    if ((d = roundtrip(&env, &frame, &len))) CHECK(d->error->request_id[0] == 0);
    sw_wire_free(d); free(frame);
    error_.request_id = "cmpl-0001";

    env.body_case = SPILLWAY__ENVELOPE__BODY_DISCONNECT; env.disconnect = &disc;
    if ((d = roundtrip(&env, &frame, &len))) {
        CHECK(strcmp(sw_wire_kind(d), "disconnect") == 0);
        CHECK(strcmp(d->disconnect->reason, "shutdown") == 0);
    }
    sw_wire_free(d); free(frame);

    CHECK(strcmp(sw_wire_kind(NULL), "none") == 0);
}

/* ---- malformed input ----------------------------------------------------- */

static uint64_t rng_state;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)rng_state;
}

static void test_garbage(void)
{
    uint8_t buf[512];
    int accepted = 0;
    for (int seed = 1; seed <= 20000; seed++) {
        rng_state = 0x9E3779B97F4A7C15ull * (uint64_t)seed;
        size_t len = rnd() % sizeof buf + 1;
        for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)rnd();
        sw_env *d = sw_wire_decode(buf, len, err, sizeof err);
        /* Random bytes essentially never form a valid envelope; if one does,
         * it must at least have passed validation (version + body). */
        if (d) {
            accepted++;
            CHECK(d->version == SW_PROTOCOL_VERSION && d->body_case != 0);
        } else {
            CHECK(err[0] != 0, "seed %d rejected without a message", seed);
        }
        sw_wire_free(d);
    }
    CHECK(accepted < 5, "%d random frames accepted", accepted);

    /* Mutations of a valid frame: flip random bytes. Must never crash; when
     * accepted, the result is still a validated envelope. */
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE; env.generate = &gen;
    uint8_t *frame;
    size_t len = sw_wire_encode(&env, &frame);
    for (int seed = 1; seed <= 20000; seed++) {
        rng_state = 0xD1B54A32D192ED03ull * (uint64_t)seed;
        uint8_t *m = malloc(len);
        memcpy(m, frame, len);
        int flips = 1 + rnd() % 4;
        for (int k = 0; k < flips; k++) m[rnd() % len] ^= (uint8_t)(1u << (rnd() % 8));
        sw_env *d = sw_wire_decode(m, len, err, sizeof err);
        if (d) CHECK(d->version == SW_PROTOCOL_VERSION && d->body_case != 0);
        else CHECK(err[0] != 0);
        sw_wire_free(d);
        free(m);
    }
    free(frame);
}

static void test_truncations(void)
{
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    void *bodies[] = {&reg, &hb, &gen, &chunk, &cancel_, &error_, &disc};
    int cases[] = {SPILLWAY__ENVELOPE__BODY_REGISTER, SPILLWAY__ENVELOPE__BODY_HEARTBEAT,
                   SPILLWAY__ENVELOPE__BODY_GENERATE, SPILLWAY__ENVELOPE__BODY_CHUNK,
                   SPILLWAY__ENVELOPE__BODY_CANCEL, SPILLWAY__ENVELOPE__BODY_ERROR,
                   SPILLWAY__ENVELOPE__BODY_DISCONNECT};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        env.body_case = cases[k];
        env.register_ = bodies[k]; /* union: same slot for every body pointer */
        uint8_t *frame;
        size_t len = sw_wire_encode(&env, &frame);
        int accepted = 0;
        for (size_t cut = 0; cut < len; cut++) {
            /* Copy to an exact-size buffer so ASan sees any read past the cut. */
            uint8_t *t = malloc(cut ? cut : 1);
            memcpy(t, frame, cut);
            sw_env *d = sw_wire_decode(t, cut, err, sizeof err);
            if (d) {
                accepted++;
                CHECK(d->version == SW_PROTOCOL_VERSION && (int)d->body_case == cases[k]);
            } else {
                CHECK(err[0] != 0, "cut %zu of %s: no message", cut, sw_wire_kind(&env));
            }
            sw_wire_free(d);
            free(t);
        }
        /* The body is the last field, so every strict prefix loses or breaks it. */
        CHECK(accepted == 0, "%d truncations of %s accepted", accepted, sw_wire_kind(&env));
        free(frame);
    }
    expect_reject("", 0, "empty frame", "empty");
    expect_reject(NULL, 0, "NULL frame", "empty");
}

static void test_envelope_errors(void)
{
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_CANCEL; env.cancel = &cancel_;
    uint8_t *frame;
    size_t len = sw_wire_encode(&env, &frame);

    /* Wrong version: the encoder always writes ours, so patch the varint
     * (first field: tag 0x08, then the version). */
    CHECK(frame[0] == 0x08 && frame[1] == SW_PROTOCOL_VERSION);
    frame[1] = 7;
    expect_reject(frame, len, "version 7", "version 7, expected 1");
    frame[1] = 0;
    expect_reject(frame, len, "version 0", "version 0, expected 1");
    free(frame);

    /* Missing body: only a version field. */
    uint8_t nobody[] = {0x08, SW_PROTOCOL_VERSION};
    expect_reject(nobody, sizeof nobody, "no body", "no (known) body");
    /* An unknown field number (a newer peer's message kind) is not a body. */
    uint8_t unknown[] = {0x08, SW_PROTOCOL_VERSION, 0x7a, 0x02, 0x0a, 0x00}; /* field 15 */
    expect_reject(unknown, sizeof unknown, "unknown kind", "no (known) body");
    /* A length that runs past the end of the frame. */
    uint8_t overrun[] = {0x08, SW_PROTOCOL_VERSION, 0x32, 0x7f, 0x0a, 0x01, 'x'};
    expect_reject(overrun, sizeof overrun, "overrun", "malformed");
    /* A field numbered 0 inside a body, written as an over-long tag varint
     * (80 00): protobuf-c keeps it as an unknown field, which encodes into a
     * frame nothing decodes (found by libFuzzer). */
    uint8_t field0[] = {0x08, SW_PROTOCOL_VERSION, 0x42, 0x05, 0x80, 0x00, 0xcd, 0x87, 0x08};
    expect_reject(field0, sizeof field0, "field 0", "numbered 0");
    /* A newer peer's extra field inside a known body is kept, and survives a
     * re-encoding (so the gateway can forward it). */
    uint8_t extra[] = {0x08, SW_PROTOCOL_VERSION, 0x42, 0x02, 0x48, 0x01};   /* Disconnect, field 9 = 1 */
    char err[256];
    sw_env *e = sw_wire_decode(extra, sizeof extra, err, sizeof err);
    CHECK(e != NULL, "extra field: %s", err);
    if (e) {
        uint8_t *again;
        size_t n = sw_wire_encode(e, &again);
        CHECK(n == sizeof extra && !memcmp(again, extra, n), "extra field re-encodes as it came (%zu bytes)", n);
        free(again);
        sw_wire_free(e);
    }
    /* Too large: checked before parsing, so the buffer content is irrelevant. */
    uint8_t small[4] = {0};
    expect_reject(small, (size_t)SW_MAX_FRAME + 1, "oversized", "too large");
}

/* Encodes a generate request built by `tweak` and expects it to be rejected. */
static void reject_generate(const char *why, const char *needle)
{
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE; env.generate = &gen;
    expect_env_reject(&env, why, needle);
}

/* An id one byte longer than SW_MAX_ID_LEN. */
static const char *long_id(void)
{
    static char id[SW_MAX_ID_LEN + 2];
    memset(id, 'a', sizeof id - 1);
    return id;
}

static void test_register_errors(void)
{
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    char *longid = (char *)long_id();

    /* Register */
    env.body_case = SPILLWAY__ENVELOPE__BODY_REGISTER; env.register_ = &reg;
    reg.worker_id = ""; expect_env_reject(&env, "empty worker_id", "worker_id is empty");
    reg.worker_id = longid; expect_env_reject(&env, "long worker_id", "too long");
    reg.worker_id = "bad\nid"; expect_env_reject(&env, "newline in id", "non-printable");
    reg.worker_id = "host-123-abcd";
    reg.pool = ""; expect_env_reject(&env, "empty pool", "pool is empty");
    reg.pool = "cpu-pool";
    reg.n_models = 0; expect_env_reject(&env, "no models", "no models");
    reg.n_models = 2;
    model_b.name = ""; expect_env_reject(&env, "nameless model", "models[1].name is empty");
    model_b.name = "stories260K";
    model_a.quantization = "q4 k"; expect_env_reject(&env, "bad quant", "quantization");
    model_a.quantization = "q4_k_m";
    reg.kind = 0; expect_env_reject(&env, "kind unspecified", "worker kind");
    reg.kind = 9; expect_env_reject(&env, "kind 9", "worker kind");
    reg.kind = SPILLWAY__WORKER_KIND__WORKER_KIND_GPU;
    reg.slots = 0; expect_env_reject(&env, "zero slots", "slots");
    reg.slots = 4;

    /* Heartbeat */
    env.body_case = SPILLWAY__ENVELOPE__BODY_HEARTBEAT; env.heartbeat = &hb;
    hb.kv_utilization = NAN; expect_env_reject(&env, "NaN kv", "kv_utilization");
    hb.kv_utilization = 1.5f; expect_env_reject(&env, "kv > 1", "kv_utilization");
    hb.kv_utilization = 0.5f;
}

static void test_generate_errors(void)
{
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    char *longid = (char *)long_id();

    /* Generate */
    gen.request_id = ""; reject_generate("empty request_id", "request_id is empty");
    gen.request_id = longid; reject_generate("long request_id", "too long");
    gen.request_id = "cmpl\x01"; reject_generate("control char id", "non-printable");
    gen.request_id = "cmpl-0001";
    gen.model = ""; reject_generate("no model", "model is empty");
    gen.model = "stories260K";
    gen.prompt = ""; reject_generate("no prompt", "no prompt");
    gen.n_prompt_tokens = 3; gen.prompt_tokens = prompt_ids; gen.prompt = "x";
    reject_generate("prompt and tokens", "more than one");
    gen.prompt = ""; gen.n_messages = 2; gen.messages = msgs;
    reject_generate("tokens and messages", "more than one");
    gen.n_prompt_tokens = 0; gen.prompt_tokens = NULL;
    msg_user.role = ""; reject_generate("empty role", "messages[1].role");
    msg_user.role = "user";
    msg_user.content = "\xff\xfe"; reject_generate("bad UTF-8 content", "messages[1].content");
    msg_user.content = "hi";
    Spillway__ToolCall call = SPILLWAY__TOOL_CALL__INIT, *callp = &call;
    call.name = "get weather"; call.arguments = "{}";
    msg_user.n_tool_calls = 1; msg_user.tool_calls = &callp;
    reject_generate("tool call name with a space", "messages[1]: tool call 0");
    call.name = "get_weather"; call.arguments = "\xc3";
    reject_generate("tool call arguments bad UTF-8", "messages[1]");
    call.arguments = "{}";
    msg_user.n_tool_calls = 0; msg_user.tool_calls = NULL;
    gen.tools_json = "[\xff]"; reject_generate("tools_json bad UTF-8", "tools_json");
    gen.tools_json = "";
    gen.reasoning_effort = 9; reject_generate("reasoning_effort 9", "reasoning_effort");
    gen.reasoning_effort = SPILLWAY__REASONING_EFFORT__REASONING_EFFORT_HIGH;
    gen.n_messages = 0; gen.messages = NULL; gen.prompt = "Once upon a time";
    gen.prompt = "caf\xc3"; reject_generate("truncated UTF-8 prompt", "UTF-8");
    gen.prompt = "\xc0\xaf"; reject_generate("overlong UTF-8", "UTF-8");
    gen.prompt = "\xed\xa0\x80"; reject_generate("surrogate", "UTF-8");
    gen.prompt = "\xf4\x90\x80\x80"; reject_generate("above U+10FFFF", "UTF-8");
    gen.prompt = "Once upon a time";
    gen.max_tokens = SW_MAX_TOKENS_PER_REQUEST + 1; reject_generate("max_tokens", "max_tokens");
    gen.max_tokens = 252;
    char *empty_stop[1] = {""};
    gen.stop = empty_stop; gen.n_stop = 1; reject_generate("empty stop", "stop[0] is empty");
    gen.stop = stops; gen.n_stop = 2;
    sp.temperature = NAN; reject_generate("NaN temperature", "temperature");
    sp.temperature = INFINITY; reject_generate("inf temperature", "temperature");
    sp.temperature = -1; reject_generate("negative temperature", "temperature");
    sp.temperature = 0.7f;
    sp.top_p = 1.5f; reject_generate("top_p > 1", "top_p");
    sp.top_p = 0.9f;
    sp.min_p = -0.1f; reject_generate("min_p < 0", "min_p");
    sp.min_p = 0.05f;
    sp.repetition_penalty = NAN; reject_generate("NaN penalty", "repetition_penalty");
    sp.repetition_penalty = 1.1f;
    sp.presence_penalty = 2.5f; reject_generate("presence_penalty 2.5", "presence_penalty");
    sp.presence_penalty = 0.5f;
    sp.frequency_penalty = -3.0f; reject_generate("frequency_penalty -3", "frequency_penalty");
    sp.frequency_penalty = -0.5f;
    Spillway__LogitBias lb = SPILLWAY__LOGIT_BIAS__INIT, *lbs[SW_MAX_LOGIT_BIAS + 1];
    for (int i = 0; i <= SW_MAX_LOGIT_BIAS; i++) lbs[i] = &lb;
    lb.token_id = 7; lb.bias = 101.0f;
    sp.n_logit_bias = 1; sp.logit_bias = lbs; reject_generate("logit_bias 101", "logit_bias");
    lb.bias = -3.0f;
    sp.n_logit_bias = SW_MAX_LOGIT_BIAS + 1; reject_generate("1025 logit_bias entries", "logit_bias entries");
    sp.n_logit_bias = 0; sp.logit_bias = NULL;
    /* And with everything restored it is accepted again (the checks above
     * failed for the reason they name, not for a leftover). */
    {
        uint8_t *f;
        size_t n;
        env.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE; env.generate = &gen;
        sw_env *d = roundtrip(&env, &f, &n);
        sw_wire_free(d);
        free(f);
    }
}

/* llm/limits.h's bounds, the gateway's too: a stop string of
 * SW_MAX_STOP_LEN bytes passes, one byte more does not; and so for the
 * count and the schema's length. */
static void test_limit_errors(void)
{
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    static char long_stop[SW_MAX_STOP_LEN + 2];
    memset(long_stop, 'x', SW_MAX_STOP_LEN);
    char *long_stops[SW_MAX_STOPS + 1];
    for (int i = 0; i <= SW_MAX_STOPS; i++) long_stops[i] = long_stop;
    gen.stop = long_stops; gen.n_stop = 1;
    {
        uint8_t *f;
        size_t n;
        env.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE; env.generate = &gen;
        sw_env *d = roundtrip(&env, &f, &n);
        CHECK(d != NULL, "a stop string of SW_MAX_STOP_LEN bytes is accepted");
        sw_wire_free(d);
        free(f);
    }
    long_stop[SW_MAX_STOP_LEN] = 'x'; reject_generate("stop one byte too long", "too long");
    long_stop[SW_MAX_STOP_LEN] = 0;
    gen.n_stop = SW_MAX_STOPS + 1; reject_generate("too many stops", "stop strings");
    gen.stop = stops; gen.n_stop = 2;
    static char big_schema[SW_MAX_SCHEMA_LEN + 2];
    memset(big_schema, ' ', SW_MAX_SCHEMA_LEN + 1);
    gen.json_schema = big_schema; reject_generate("json_schema too long", "json_schema");
    gen.json_schema = "";
}

static void test_chunk_errors(void)
{
    sw_env env = SPILLWAY__ENVELOPE__INIT;

    /* Chunk */
    env.body_case = SPILLWAY__ENVELOPE__BODY_CHUNK; env.chunk = &chunk;
    chunk.text = "\xe4\xb8"; expect_env_reject(&env, "split code point", "chunk: text");
    chunk.text = " ok";
    chunk.reasoning = "\xe4"; expect_env_reject(&env, "reasoning split code point", "chunk: reasoning");
    chunk.reasoning = "hmm";
    {
        Spillway__ToolCall call = SPILLWAY__TOOL_CALL__INIT, *callp = &call;
        call.name = ""; call.arguments = "{}";
        chunk.n_tool_calls = 1; chunk.tool_calls = &callp;
        expect_env_reject(&env, "tool call without a name", "tool call 0");
        call.name = "f";
        uint8_t *f;
        size_t n;
        sw_env *d = roundtrip(&env, &f, &n);
        CHECK(d && d->chunk->n_tool_calls == 1 && !strcmp(d->chunk->tool_calls[0]->name, "f") &&
              !strcmp(d->chunk->reasoning, "hmm"), "a chunk with reasoning and a call round-trips");
        sw_wire_free(d);
        free(f);
        chunk.n_tool_calls = 0; chunk.tool_calls = NULL;
    }
    {   /* log probabilities: at most 0, at most one a token */
        Spillway__Logprob lp = SPILLWAY__LOGPROB__INIT, *lpp[3] = { &lp, &lp, &lp };
        Spillway__TopLogprob t = SPILLWAY__TOP_LOGPROB__INIT, *tp = &t;
        lp.logprob = 0.5f;
        chunk.n_logprobs = 1; chunk.logprobs = lpp;
        expect_env_reject(&env, "a positive logprob", "logprob 0.5");
        lp.logprob = NAN; expect_env_reject(&env, "a NaN logprob", "logprob");
        lp.logprob = -1.0f; lp.n_top = 1; lp.top = &tp; t.logprob = 1.0f;
        expect_env_reject(&env, "a positive top logprob", "logprob 1");
        t.logprob = -0.5f;
        chunk.n_logprobs = 3; expect_env_reject(&env, "more logprobs than tokens", "3 logprobs for 2 tokens");
        chunk.n_logprobs = 1;
        uint8_t *f;
        size_t n;
        sw_env *d = roundtrip(&env, &f, &n);
        CHECK(d && d->chunk->n_logprobs == 1 && d->chunk->logprobs[0]->n_top == 1 &&
              d->chunk->logprobs[0]->top[0]->logprob == -0.5f, "a chunk with logprobs round-trips");
        sw_wire_free(d);
        free(f);
        chunk.n_logprobs = 0; chunk.logprobs = NULL;
    }
    gen.top_logprobs = 21;
    env.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE; env.generate = &gen;
    expect_env_reject(&env, "top_logprobs 21", "top_logprobs 21");
    gen.top_logprobs = 0;
    env.body_case = SPILLWAY__ENVELOPE__BODY_CHUNK; env.chunk = &chunk;
    Spillway__Usage ru = SPILLWAY__USAGE__INIT;
    ru.prompt_tokens = 3; ru.completion_tokens = 2; ru.reasoning_tokens = 3;
    chunk.usage = &ru; expect_env_reject(&env, "more reasoning than completion tokens", "reasoning of 2");
    chunk.usage = &usage;
    chunk.finish_reason = 17; expect_env_reject(&env, "finish 17", "finish_reason");
    chunk.finish_reason = SPILLWAY__FINISH_REASON__FINISH_STOP;
    chunk.request_id = ""; expect_env_reject(&env, "chunk without id", "request_id is empty");
    chunk.request_id = "cmpl-0001";
}

static void test_other_errors(void)
{
    sw_env env = SPILLWAY__ENVELOPE__INIT;

    /* Cancel / Error / Disconnect */
    env.body_case = SPILLWAY__ENVELOPE__BODY_CANCEL; env.cancel = &cancel_;
    cancel_.request_id = ""; expect_env_reject(&env, "cancel without id", "request_id is empty");
    cancel_.request_id = "cmpl-0001";
    env.body_case = SPILLWAY__ENVELOPE__BODY_ERROR; env.error = &error_;
    error_.code = 0; expect_env_reject(&env, "error code 0", "code 0");
    error_.code = 404;
    error_.message = "\x80"; expect_env_reject(&env, "error bad UTF-8", "message");
    error_.message = "x";
    env.body_case = SPILLWAY__ENVELOPE__BODY_DISCONNECT; env.disconnect = &disc;
    disc.reason = "\xff"; expect_env_reject(&env, "disconnect bad UTF-8", "reason");
    disc.reason = "shutdown";
}

/* sw_wire_send over real (inproc) sockets: DEALER -> ROUTER gets
 * [identity, envelope]; ROUTER -> DEALER with that identity gets [envelope]. */
static void test_send(void)
{
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER), *dealer = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero);
    CHECK(zmq_bind(router, "inproc://test-wire") == 0);
    CHECK(zmq_connect(dealer, "inproc://test-wire") == 0);

    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_CHUNK; env.chunk = &chunk;
    CHECK(sw_wire_send(dealer, NULL, 0, &env, 0) == 0, "dealer send: %s", zmq_strerror(errno));
    uint8_t ident[256], body[4096];
    int idlen = zmq_recv(router, ident, sizeof ident, 0);
    int more = 0;
    size_t ml = sizeof more;
    zmq_getsockopt(router, ZMQ_RCVMORE, &more, &ml);
    CHECK(idlen > 0 && more, "identity frame first");
    int n = zmq_recv(router, body, sizeof body, 0);
    zmq_getsockopt(router, ZMQ_RCVMORE, &more, &ml);
    CHECK(n > 0 && !more, "exactly one envelope frame");
    sw_env *d = n > 0 ? sw_wire_decode(body, (size_t)n, err, sizeof err) : NULL;
    CHECK(d && d->body_case == SPILLWAY__ENVELOPE__BODY_CHUNK && strcmp(d->chunk->text, chunk.text) == 0,
          "chunk through dealer->router: %s", err);
    sw_wire_free(d);

    env.body_case = SPILLWAY__ENVELOPE__BODY_CANCEL; env.cancel = &cancel_;
    CHECK(idlen > 0 && sw_wire_send(router, ident, (size_t)idlen, &env, 0) == 0, "router send");
    n = zmq_recv(dealer, body, sizeof body, 0);
    zmq_getsockopt(dealer, ZMQ_RCVMORE, &more, &ml);
    CHECK(n > 0 && !more, "dealer gets one frame");
    d = n > 0 ? sw_wire_decode(body, (size_t)n, err, sizeof err) : NULL;
    CHECK(d && d->body_case == SPILLWAY__ENVELOPE__BODY_CANCEL &&
          strcmp(d->cancel->request_id, "cmpl-0001") == 0, "cancel through router->dealer: %s", err);
    sw_wire_free(d);

    /* ROUTER_MANDATORY makes a send to an unknown identity fail visibly. */
    int one = 1;
    zmq_setsockopt(router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    CHECK(sw_wire_send(router, "nobody", 6, &env, ZMQ_DONTWAIT) == -1 && errno == EHOSTUNREACH,
          "send to a vanished peer fails");

    zmq_close(dealer);
    zmq_close(router);
    zmq_ctx_term(ctx);
}

/* A batch of prompts (an SDK client's GenerateRequest.prompts): it comes
 * through whole, in place of prompt, and every way it can be wrong is
 * refused: beside a prompt, an entry empty or both text and ids or not
 * UTF-8, more than SW_MAX_CHOICES prompts, or prompts times n past it. */
static void test_prompts_batch(void)
{
    static Spillway__Prompt pr[SW_MAX_CHOICES + 1];
    static Spillway__Prompt *pp[SW_MAX_CHOICES + 1];
    for (int i = 0; i <= SW_MAX_CHOICES; i++) {
        spillway__prompt__init(&pr[i]);
        pr[i].text = "Once";
        pp[i] = &pr[i];
    }
    pr[1].text = ""; pr[1].n_tokens = 3; pr[1].tokens = prompt_ids;
    sw_env env = SPILLWAY__ENVELOPE__INIT;
    env.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE; env.generate = &gen;
    gen.prompt = ""; gen.n_prompts = 2; gen.prompts = pp; gen.n = 3;
    uint8_t *f;
    size_t n = sw_wire_encode(&env, &f);
    char err[256];
    sw_env *d = sw_wire_decode(f, n, err, sizeof err);
    CHECK(d != NULL, "a batch of a text and a token-id prompt: %s", err);
    if (d) {
        const Spillway__GenerateRequest *g = d->generate;
        CHECK(g->n_prompts == 2 && !strcmp(g->prompts[0]->text, "Once") && g->prompts[0]->n_tokens == 0);
        CHECK(g->prompts[1]->n_tokens == 3 && g->prompts[1]->tokens[2] == 32000 && !g->prompts[1]->text[0]);
        CHECK(g->n == 3);
    }
    sw_wire_free(d);
    free(f);
    gen.prompt = "x"; reject_generate("a batch beside a prompt", "more than one");
    gen.prompt = "";
    pr[0].text = ""; reject_generate("an empty prompt", "prompts[0] must have exactly one");
    pr[0].text = "a"; pr[0].n_tokens = 1; pr[0].tokens = prompt_ids;
    reject_generate("text and ids", "prompts[0] must have exactly one");
    pr[0].n_tokens = 0; pr[0].tokens = NULL;
    pr[0].text = "caf\xc3"; reject_generate("a prompt not UTF-8", "UTF-8");
    pr[0].text = "Once";
    gen.n = SW_MAX_CHOICES / 2 + 1; reject_generate("prompts times n past SW_MAX_CHOICES", "prompts of");
    gen.n = 0; gen.n_prompts = SW_MAX_CHOICES + 1; reject_generate("too many prompts", "choices");
    gen.n_prompts = SW_MAX_CHOICES;
    pr[1] = pr[0];
    n = sw_wire_encode(&env, &f);
    d = sw_wire_decode(f, n, err, sizeof err);
    CHECK(d != NULL, "SW_MAX_CHOICES prompts: %s", err);
    sw_wire_free(d);
    free(f);
    /* a worker never takes a batch: the gateway splits it */
    gen.n_prompts = 2; gen.n = 0;
    sw_request r;
    CHECK(sw_request_from_wire(&r, &gen, err, sizeof err) == 400 && strstr(err, "split by the gateway"), "%s", err);
    sw_request_free(&r);
    gen.n_prompts = 0; gen.prompts = NULL; gen.prompt = "Once upon a time";
}

int main(void)
{
    init_messages();
    test_roundtrips();
    test_roundtrips_generate();
    test_garbage();
    test_truncations();
    test_envelope_errors();
    test_register_errors();
    test_generate_errors();
    test_limit_errors();
    test_chunk_errors();
    test_other_errors();
    test_send();
    test_prompts_batch();
    CHECK_DONE();
}
