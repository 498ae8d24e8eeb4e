/* The policy the API parsers' fuzzers (fuzz_openai, fuzz_responses,
 * fuzz_embeddings) parse against: one CPU pool serving "llama", and
 * "small" an alias of it, so that model resolution is exercised too. */
#ifndef SW_FUZZ_API_POLICY_H
#define SW_FUZZ_API_POLICY_H

#include <stdio.h>
#include <stdlib.h>
#include <cjson/cJSON.h>
#include "gateway/openai.h"
#include "gateway/policy.h"
#include "tests/fuzz/driver.h"

/* The policy, or NULL with the reason on stderr under the fuzzer's name. */
static sw_policy *fuzz_api_policy(const char *who)
{
    static const char y[] = "pools:\n  - {name: cpu-pool, kind: cpu}\nroutes:\n  - {model: llama, target: cpu-pool}\n"
                            "aliases:\n  small: llama\n";
    char err[512];
    sw_policy *p = sw_policy_parse("fuzz", y, sizeof y - 1, err, sizeof err);
    if (!p) fprintf(stderr, "%s: %s\n", who, err);
    return p;
}

/* A rejected body: a 400 (or 500) with a message, and the error object
 * built from them valid JSON. */
static void check_rejected(int rc, const char *msg, const char *param)
{
    INVARIANT(rc == 400 || rc == 500, "status %d", rc);
    INVARIANT(msg[0], "status %d without a message", rc);
    char *ej = sw_openai_error_json(msg, "invalid_request_error", param, NULL);
    cJSON *o = ej ? cJSON_Parse(ej) : NULL;
    INVARIANT(o, "the error object is not JSON: %s", ej ? ej : "(null)");
    cJSON_Delete(o);
    free(ej);
}

#endif
