/* /v1/embeddings: parsing and the response (see embeddings.h). */
#include "gateway/embeddings.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gateway/front.h"
#include "gateway/openai.h"
#include "llm/text.h"

typedef struct { char *msg; size_t msglen; const char **param; } perr;

__attribute__((format(printf, 3, 4))) static int bad(perr *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, e->msglen, fmt, ap);
    va_end(ap);
    *e->param = param;
    return 400;
}

static void free_inputs(Spillway__EmbedRequest *q)
{
    for (size_t i = 0; i < q->n_inputs; i++) {
        free(q->inputs[i]->tokens);
        free(q->inputs[i]);
    }
    free(q->inputs);
}

static Spillway__EmbedInput *add_input(Spillway__EmbedRequest *q)
{
    Spillway__EmbedInput *in = malloc(sizeof *in);
    if (!in) return NULL;
    spillway__embed_input__init(in);
    q->inputs[q->n_inputs++] = in;
    return in;
}

/* One token-id array onto in (ids: the JSON array, known non-empty). */
static int token_input(cJSON *ids, Spillway__EmbedInput *in, perr *e)
{
    int n = cJSON_GetArraySize(ids);
    if (n > SW_MAX_EMBED_INPUT_TOKENS)
        return bad(e, "input", "an input has %d tokens; at most %d are allowed", n, SW_MAX_EMBED_INPUT_TOKENS);
    if (!(in->tokens = malloc((size_t)n * sizeof *in->tokens))) return bad(e, "input", "out of memory");
    cJSON *it;
    cJSON_ArrayForEach(it, ids) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > 4294967295.0 ||
            it->valuedouble != floor(it->valuedouble))
            return bad(e, "input", "token ids in 'input' must be non-negative integers");
        in->tokens[in->n_tokens++] = (uint32_t)it->valuedouble;
    }
    return 0;
}

/* One element of an `input` array: a string, or (in an array of arrays)
 * an array of token ids. */
static int array_input(cJSON *it, bool strings, Spillway__EmbedRequest *q, perr *e)
{
    Spillway__EmbedInput *in = add_input(q);
    if (!in) return bad(e, "input", "out of memory");
    if (strings) {
        if (!cJSON_IsString(it)) return bad(e, "input", "'input' must not mix strings with other kinds");
        if (!*it->valuestring) return bad(e, "input", "'input' must not hold an empty string");
        in->text = it->valuestring;   /* the JSON tree's */
        return 0;
    }
    if (!cJSON_IsArray(it)) return bad(e, "input", "'input' must not mix token-id arrays with other kinds");
    if (cJSON_GetArraySize(it) == 0) return bad(e, "input", "'input' must not hold an empty token-id array");
    return token_input(it, in, e);
}

static int request_input(cJSON *o, Spillway__EmbedRequest *q, perr *e)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "input");
    if (!v || cJSON_IsNull(v)) return bad(e, "input", "'input' is required");
    const char *kinds = "'input' must be a string, an array of strings, an array of token ids "
                        "or an array of token-id arrays";
    if (!cJSON_IsString(v) && !cJSON_IsArray(v)) return bad(e, "input", "%s", kinds);
    int n = cJSON_IsString(v) ? 1 : cJSON_GetArraySize(v);
    if (n == 0) return bad(e, "input", "'input' must not be empty");
    cJSON *first = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, 0) : NULL;
    bool ids = first && cJSON_IsNumber(first);   /* one input, as token ids */
    if (!ids && n > SW_MAX_EMBED_INPUTS)
        return bad(e, "input", "'input' has %d entries; at most %d are allowed", n, SW_MAX_EMBED_INPUTS);
    if (!(q->inputs = calloc(ids ? 1 : (size_t)n, sizeof *q->inputs))) return bad(e, "input", "out of memory");
    if (cJSON_IsString(v) || ids) {
        Spillway__EmbedInput *in = add_input(q);
        if (!in) return bad(e, "input", "out of memory");
        if (ids) return token_input(v, in, e);
        if (!*v->valuestring) return bad(e, "input", "'input' must not be an empty string");
        in->text = v->valuestring;
        return 0;
    }
    if (!cJSON_IsString(first) && !cJSON_IsArray(first)) return bad(e, "input", "%s", kinds);
    cJSON *it;
    int rc;
    cJSON_ArrayForEach(it, v)
        if ((rc = array_input(it, cJSON_IsString(first), q, e))) return rc;
    return 0;
}

static int request_options(cJSON *o, sw_req *r, perr *e)
{
    cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "encoding_format");
    if (f && !cJSON_IsNull(f)) {
        if (!cJSON_IsString(f) || (strcmp(f->valuestring, "float") && strcmp(f->valuestring, "base64")))
            return bad(e, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
        r->embed_base64 = !strcmp(f->valuestring, "base64");
    }
    cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "dimensions");
    if (d && !cJSON_IsNull(d))
        return bad(e, "dimensions", "'dimensions' is not supported: the model cannot truncate its embeddings "
                                    "(it was not trained to); leave it out to get them whole");
    cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "user");
    if (u && !cJSON_IsNull(u) && !cJSON_IsString(u)) return bad(e, "user", "'user' must be a string");
    return 0;
}

static int request_model(cJSON *o, Spillway__EmbedRequest *q, perr *e)
{
    cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (!m || cJSON_IsNull(m) || (cJSON_IsString(m) && !*m->valuestring)) return bad(e, "model", "'model' is required");
    if (!cJSON_IsString(m)) return bad(e, "model", "'model' must be a string");
    if (!sw_id_valid(m->valuestring, SW_MAX_ID_LEN))
        return bad(e, "model", "'model' must be at most %d printable ASCII characters without spaces", SW_MAX_ID_LEN);
    q->model = m->valuestring;
    return 0;
}

int sw_embed_parse(sw_req *r, const char *body, size_t len, const sw_policy *p, char *msg, size_t msglen,
                   const char **param)
{
    perr e = { msg, msglen, param };
    cJSON *o = sw_json_body(body, len, msg, msglen, param);
    if (!o) return 400;
    Spillway__EmbedRequest q = SPILLWAY__EMBED_REQUEST__INIT;
    int rc = request_model(o, &q, &e);
    if (!rc) rc = request_input(o, &q, &e);
    if (!rc) rc = request_options(o, r, &e);
    if (!rc && sw_front_prepare_embed(r, p, &q) != 0) {
        snprintf(msg, msglen, "could not encode the request");
        rc = 500;
    }
    free_inputs(&q);
    cJSON_Delete(o);
    return rc;
}

void sw_embed_keep(sw_req *r, const Spillway__EmbedReply *e)
{
    float *v = malloc(e->n_values * sizeof *v);
    pthread_mutex_lock(&r->mu);
    if (v) {
        memcpy(v, e->values, e->n_values * sizeof *v);
        free(r->embed_values);
        r->embed_values = v;
        r->embed_dim = e->dim;
    }
    pthread_mutex_unlock(&r->mu);
}

/* A vector as base64 of its little-endian float32 bytes (OpenAI's form). */
static cJSON *vector_base64(const float *v, uint32_t dim)
{
    size_t nb = (size_t)dim * 4;
    unsigned char *bytes = malloc(nb);
    size_t n64 = sodium_base64_encoded_len(nb, sodium_base64_VARIANT_ORIGINAL);
    char *b64 = malloc(n64);
    cJSON *s = NULL;
    if (bytes && b64) {
        for (uint32_t i = 0; i < dim; i++) {
            uint32_t u;
            memcpy(&u, &v[i], 4);
            for (int k = 0; k < 4; k++) bytes[4 * i + k] = (unsigned char)(u >> (8 * k));
        }
        s = cJSON_CreateString(sodium_bin2base64(b64, n64, bytes, nb, sodium_base64_VARIANT_ORIGINAL));
    }
    free(bytes);
    free(b64);
    return s;
}

static cJSON *vector_floats(const float *v, uint32_t dim)
{
    cJSON *a = cJSON_CreateArray();
    for (uint32_t i = 0; a && i < dim; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

char *sw_embed_response(sw_req *r)
{
    if (!r->embed_values) return NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    for (uint32_t i = 0; i < r->embed_n; i++) {
        const float *v = r->embed_values + (size_t)i * r->embed_dim;
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "object", "embedding");
        cJSON_AddNumberToObject(d, "index", i);
        cJSON_AddItemToObject(d, "embedding", r->embed_base64 ? vector_base64(v, r->embed_dim)
                                                              : vector_floats(v, r->embed_dim));
        cJSON_AddItemToArray(data, d);
    }
    cJSON_AddStringToObject(o, "model", r->model_asked);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", r->usage_prompt);
    cJSON_AddNumberToObject(u, "total_tokens", r->usage_prompt);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}
