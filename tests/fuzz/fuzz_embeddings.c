/* Mutation fuzz of the gateway's /v1/embeddings parser and its response
 * writer (gateway/embeddings.c), in process.
 *
 * An input is a request body. Invariants:
 *   - a rejected body gets 400 (or 500, out of memory) with a message, and
 *     the error object built from them is valid JSON;
 *   - an accepted body yields an embed envelope that passes the wire's own
 *     check (proto/wire.c: the limits of llm/limits.h, each input text or
 *     token ids), carrying the request's id, its resolved model and as many
 *     inputs as the request counts;
 *   - for an accepted body, with a worker's reply of three floats an input:
 *     the response is JSON, one "embedding" object an input, indexed in
 *     order, whose vector (floats, or base64 of little-endian float32) gives
 *     the reply's floats back exactly, and usage is the reply's.
 *   fuzz_embeddings                  (loop settings: tests/fuzz/driver.h)
 */
#include "gateway/embeddings.h"
#include "gateway/openai.h"
#include "gateway/req.h"
#include "proto/wire.h"

#include <cjson/cJSON.h>
#include <sodium.h>

#include "tests/fuzz/api_policy.h"
#include "tests/fuzz/driver.h"

enum { DIM = 3 };
static sw_policy *policy;

/* Input i's value k, as the fake reply has it: exact in float32. */
static float value(uint32_t i, int k) { return (float)(i % 1000) + 0.25f * (float)k - 1.0f; }

static bool vector_is(const cJSON *v, bool b64, uint32_t i)
{
    float got[DIM];
    if (b64) {
        size_t n = 0;
        if (!cJSON_IsString(v) || sodium_base642bin((unsigned char *)got, sizeof got, v->valuestring,
                                                    strlen(v->valuestring), NULL, &n, NULL,
                                                    sodium_base64_VARIANT_ORIGINAL) || n != sizeof got)
            return false;
    } else {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != DIM) return false;
        for (int k = 0; k < DIM; k++) got[k] = (float)cJSON_GetArrayItem(v, k)->valuedouble;
    }
    for (int k = 0; k < DIM; k++)   /* x86: the bytes are little-endian already */
        if (got[k] != value(i, k)) return false;
    return true;
}

static void check_response(sw_req *r)
{
    Spillway__EmbedReply rep = SPILLWAY__EMBED_REPLY__INIT;
    float *vals = malloc((size_t)r->embed_n * DIM * sizeof *vals);
    uint32_t *toks = malloc((size_t)r->embed_n * sizeof *toks);
    if (!vals || !toks) abort();
    for (uint32_t i = 0; i < r->embed_n; i++) {
        toks[i] = 1;
        for (int k = 0; k < DIM; k++) vals[(size_t)i * DIM + k] = value(i, k);
    }
    rep.dim = DIM;
    rep.n_values = (size_t)r->embed_n * DIM;
    rep.values = vals;
    rep.n_input_tokens = r->embed_n;
    rep.input_tokens = toks;
    sw_embed_keep(r, &rep);
    r->usage_prompt = r->embed_n;
    char *body = sw_embed_response(r);
    cJSON *o = body ? cJSON_Parse(body) : NULL;
    INVARIANT(o, "the response body is not JSON");
    cJSON *data = cJSON_GetObjectItem(o, "data"), *d;
    INVARIANT(cJSON_GetArraySize(data) == (int)r->embed_n, "%d vectors for %u inputs", cJSON_GetArraySize(data),
              r->embed_n);
    uint32_t i = 0;
    cJSON_ArrayForEach(d, data) {
        INVARIANT(cJSON_GetObjectItem(d, "index")->valuedouble == i, "vector %u out of order", i);
        INVARIANT(vector_is(cJSON_GetObjectItem(d, "embedding"), r->embed_base64, i), "vector %u differs", i);
        i++;
    }
    cJSON *pt = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "prompt_tokens");
    INVARIANT(cJSON_IsNumber(pt) && pt->valuedouble == r->embed_n, "usage differs");
    cJSON_Delete(o);
    free(body);
    free(vals);
    free(toks);
}

static void check_accepted(sw_req *r)
{
    char err[256] = "";
    sw_env *e = sw_wire_decode(r->gen, r->gen_len, err, sizeof err);
    INVARIANT(e && e->body_case == SPILLWAY__ENVELOPE__BODY_EMBED, "the encoded request does not decode: %s", err);
    if (!e || e->body_case != SPILLWAY__ENVELOPE__BODY_EMBED) { sw_wire_free(e); return; }
    const Spillway__EmbedRequest *q = e->embed;
    INVARIANT(!strcmp(q->request_id, r->id) && !strcmp(q->model, r->model) && r->embed, "id or model lost");
    INVARIANT(q->n_inputs == r->embed_n, "%zu inputs on the wire, %u counted", q->n_inputs, r->embed_n);
    sw_wire_free(e);
    check_response(r);
}

static bool check(const uint8_t *data, size_t n)
{
    sw_req *r = sw_req_new();
    snprintf(r->id, sizeof r->id, "embd-fuzz");
    char msg[512] = "";
    const char *param = NULL;
    int rc = sw_embed_parse(r, (const char *)data, n, policy, msg, sizeof msg, &param);
    if (rc) {
        check_rejected(rc, msg, param);
    } else {
        check_accepted(r);
    }
    sw_req_unref(r);
    return rc == 0;
}

#ifndef SW_LIBFUZZER
static const char *const BODIES[] = {
    "{\"model\":\"small\",\"input\":\"hi \\u00e9\\t\\u0001\\\"x\\\"\",\"encoding_format\":\"float\",\"user\":\"u\"}",
    "{\"model\":\"llama\",\"input\":[\"a\",\"bb\",\"c d\"],\"encoding_format\":\"base64\"}",
    "{\"model\":\"llama\",\"input\":[1,2,3,4294967295]}",
    "{\"model\":\"llama\",\"input\":[[5],[6,7],[8,9,10]],\"encoding_format\":null,\"dimensions\":null}",
};
#endif

static bool load_policy(void) { return (policy = fuzz_api_policy("fuzz_embeddings")) != NULL; }

#ifdef SW_LIBFUZZER
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (!load_policy()) abort();
    return 0;
}
#else
int main(void)
{
    if (!load_policy()) return 2;
    enum { N = sizeof BODIES / sizeof BODIES[0] };
    fuzz_seed seeds[N];
    for (int i = 0; i < N; i++) seeds[i] = (fuzz_seed){ (const uint8_t *)BODIES[i], strlen(BODIES[i]) };
    int rc = fuzz_main("fuzz_embeddings", seeds, N, check);
    sw_policy_unref(policy);
    return rc;
}
#endif
