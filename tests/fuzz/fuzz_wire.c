/* Mutation fuzz of the wire decoder (one ZeroMQ frame -> sw_env).
 *
 * Seeds: one envelope of each kind (and a GenerateRequest of each prompt
 * form, a batch of prompts among them), encoded here. Invariants:
 *   - a rejected frame says why;
 *   - an accepted frame encodes again, and that encoding decodes and encodes
 *     to the same bytes: the gateway forwards what it decoded (chunks to SDK
 *     clients), so whatever it accepts it must be able to send on.
 *   fuzz_wire                        (loop settings: tests/fuzz/driver.h)
 */
#include "proto/wire.h"

#include "tests/fuzz/driver.h"

static bool check(const uint8_t *data, size_t n)
{
    char err[256] = "";
    sw_env *e = sw_wire_decode(data, n, err, sizeof err);
    if (!e) {
        INVARIANT(err[0], "frame of %zu bytes rejected without a message", n);
        return false;
    }
    INVARIANT(strcmp(sw_wire_kind(e), "none"), "accepted an envelope without a body");
    uint8_t *a = NULL, *b = NULL;
    size_t na = sw_wire_encode(e, &a), nb = 0;
    INVARIANT(na && a, "a decoded envelope does not encode");
    sw_env *e2 = a ? sw_wire_decode(a, na, err, sizeof err) : NULL;
    INVARIANT(e2, "its encoding does not decode: %s", err);
    if (e2) {
        nb = sw_wire_encode(e2, &b);
        INVARIANT(nb == na && b && !memcmp(a, b, na), "encode(decode(encode(x))) differs");
    }
    free(a);
    free(b);
    sw_wire_free(e2);
    sw_wire_free(e);
    return true;
}

#ifndef SW_LIBFUZZER
static fuzz_seed seeds[16];
static int n_seeds;

static void add_seed(Spillway__Envelope *e)
{
    uint8_t *out = NULL;
    size_t n = sw_wire_encode(e, &out);
    if (n && out && n_seeds < 16) seeds[n_seeds++] = (fuzz_seed){ out, n };
    else free(out);
}

int main(void)
{
    Spillway__Envelope e = SPILLWAY__ENVELOPE__INIT;
    Spillway__ModelInfo mi = SPILLWAY__MODEL_INFO__INIT;
    mi.name = "m"; mi.quantization = "q4_k_m"; mi.context_length = 4096;
    Spillway__ModelInfo *mis[] = { &mi, &mi };
    Spillway__Register rg = SPILLWAY__REGISTER__INIT;
    rg.worker_id = "w1"; rg.pool = "cpu-pool"; rg.kind = SPILLWAY__WORKER_KIND__WORKER_KIND_CPU;
    rg.n_models = 2; rg.models = mis; rg.slots = 4;
    e.body_case = SPILLWAY__ENVELOPE__BODY_REGISTER; e.register_ = &rg; add_seed(&e);

    Spillway__Heartbeat hb = SPILLWAY__HEARTBEAT__INIT;
    hb.active = 2; hb.queued = 1; hb.kv_utilization = 0.5f; hb.slots = 4; hb.batch_size = 2; hb.tokens_generated = 99;
    e.body_case = SPILLWAY__ENVELOPE__BODY_HEARTBEAT; e.heartbeat = &hb; add_seed(&e);

    Spillway__SamplingParams sp = SPILLWAY__SAMPLING_PARAMS__INIT;
    sp.temperature = 0.7f; sp.top_p = 0.9f; sp.top_k = 40; sp.min_p = 0.05f; sp.seed = 5; sp.has_seed = 1;
    Spillway__ChatMessage cm = SPILLWAY__CHAT_MESSAGE__INIT;
    cm.role = "user"; cm.content = "hi";
    Spillway__ChatMessage *cms[] = { &cm };
    uint32_t toks[] = { 1, 2, 3 };
    char *stops[] = { "x", "yy" };
    Spillway__GenerateRequest g = SPILLWAY__GENERATE_REQUEST__INIT;
    g.request_id = "r1"; g.model = "m"; g.prompt = "hello"; g.sampling = &sp; g.max_tokens = 16;
    g.n_stop = 2; g.stop = stops; g.deadline_unix_ms = 123456; g.echo_prompt = 1;
    e.body_case = SPILLWAY__ENVELOPE__BODY_GENERATE; e.generate = &g; add_seed(&e);
    g.prompt = ""; g.n_messages = 1; g.messages = cms; add_seed(&e);
    g.n_messages = 0; g.messages = NULL; g.n_prompt_tokens = 3; g.prompt_tokens = toks; add_seed(&e);
    /* an SDK client's batch of prompts, a text and token ids, of 2 samples each */
    Spillway__Prompt pa = SPILLWAY__PROMPT__INIT, pb = SPILLWAY__PROMPT__INIT;
    pa.text = "hello"; pb.n_tokens = 3; pb.tokens = toks;
    Spillway__Prompt *prs[] = { &pa, &pb };
    g.n_prompt_tokens = 0; g.prompt_tokens = NULL; g.n_prompts = 2; g.prompts = prs; g.n = 2; add_seed(&e);
    g.n_prompts = 0; g.prompts = NULL; g.n = 0;

    Spillway__Usage u = SPILLWAY__USAGE__INIT;
    u.prompt_tokens = 3; u.completion_tokens = 4;
    Spillway__TokenChunk ch = SPILLWAY__TOKEN_CHUNK__INIT;
    ch.request_id = "r1"; ch.text = "abc"; ch.n_token_ids = 3; ch.token_ids = toks; ch.pool = "p"; ch.worker_id = "w";
    ch.usage = &u; ch.finish_reason = SPILLWAY__FINISH_REASON__FINISH_LENGTH;
    e.body_case = SPILLWAY__ENVELOPE__BODY_CHUNK; e.chunk = &ch; add_seed(&e);

    Spillway__Cancel cc = SPILLWAY__CANCEL__INIT;
    cc.request_id = "r1";
    e.body_case = SPILLWAY__ENVELOPE__BODY_CANCEL; e.cancel = &cc; add_seed(&e);
    Spillway__Error er = SPILLWAY__ERROR__INIT;
    er.request_id = "r1"; er.code = 503; er.message = "busy";
    e.body_case = SPILLWAY__ENVELOPE__BODY_ERROR; e.error = &er; add_seed(&e);
    Spillway__Disconnect dc = SPILLWAY__DISCONNECT__INIT;
    dc.reason = "bye";
    e.body_case = SPILLWAY__ENVELOPE__BODY_DISCONNECT; e.disconnect = &dc; add_seed(&e);
    Spillway__StatusRequest sr = SPILLWAY__STATUS_REQUEST__INIT;
    sr.request_id = "r2";
    e.body_case = SPILLWAY__ENVELOPE__BODY_STATUS_REQUEST; e.status_request = &sr; add_seed(&e);
    Spillway__StatusReply sy = SPILLWAY__STATUS_REPLY__INIT;
    sy.request_id = "r2"; sy.json = "{\"ok\":true}";
    e.body_case = SPILLWAY__ENVELOPE__BODY_STATUS_REPLY; e.status_reply = &sy; add_seed(&e);

    int rc = fuzz_main("fuzz_wire", seeds, n_seeds, check);
    for (int i = 0; i < n_seeds; i++) free((void *)seeds[i].bytes);
    return rc;
}
#endif
