/* Mutation fuzz of the routing-policy parser (YAML -> sw_policy).
 *
 * Seeds: a built-in policy that uses every section and key, plus any YAML
 * files named on the command line (the test passes routes.yaml and the
 * documented examples). Invariants:
 *   - a rejected policy says why, each line as "NAME:LINE:COLUMN: message"
 *     (or the "... and N more errors" tail), with LINE and COLUMN >= 1;
 *   - an accepted policy exports as valid JSON, resolves each alias to its
 *     model, and finds each of its pools by name.
 *   fuzz_policy [FILE.yaml ...]      (loop settings: tests/fuzz/driver.h)
 */
#include "gateway/policy.h"

#include <cjson/cJSON.h>

#include "tests/fuzz/driver.h"

#define NAME "fuzz.yaml"

#ifndef SW_LIBFUZZER   /* the libFuzzer build starts from tests/fuzz/corpus/ */

static const char BUILTIN[] =
    "pools:\n"
    "  - name: gpu-pool\n"
    "    kind: gpu\n"
    "    max_concurrency: 64\n"
    "    max_queue: 8\n"
    "  - {name: cpu-pool, kind: cpu}\n"
    "routes:\n"
    "  - model: \"llama\"\n"
    "    quantization: fp8\n"
    "    target: gpu-pool\n"
    "    max_concurrency: 100\n"
    "    priority: primary\n"
    "    match:\n"
    "      class: interactive\n"
    "      prompt_tokens: {min: 1, max: 4096}\n"
    "      api_keys: [\"sk-team-a-0123456789\"]\n"
    "      tenants: [acme, globex]\n"
    "  - model: llama\n"
    "    target: cpu-pool\n"
    "    priority: overflow\n"
    "aliases:\n"
    "  \"gpt-3.5-turbo\": llama\n"
    "  small: llama\n"
    "defaults:\n"
    "  queue_length: 256\n"
    "  queue_timeout_ms: 30000\n"
    "  request_timeout_ms: 600000\n"
    "  first_token_timeout_ms: 120000\n"
    "  error_rate_threshold: 0.5\n";
#endif

/* "NAME:L:C: text" with L, C >= 1, or the truncation tail. */
static bool error_line_ok(const char *s, size_t n)
{
    if (n >= 8 && !strncmp(s, "... and ", 8)) return true;
    if (n < sizeof NAME || strncmp(s, NAME ":", sizeof NAME)) return false;
    const char *p = s + sizeof NAME;
    for (int field = 0; field < 2; field++) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || *end != ':') return false;
        p = end + 1;
    }
    return *p == ' ';
}

static void check_rejection(const char *err)
{
    INVARIANT(err[0], "rejected without a message");
    for (const char *line = err; *line;) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        INVARIANT(error_line_ok(line, n), "error line not NAME:LINE:COL: '%.*s'", (int)n, line);
        line += n + (nl != NULL);
    }
}

static void check_policy(const sw_policy *p)
{
    char *json = sw_policy_to_json(p);
    cJSON *o = json ? cJSON_Parse(json) : NULL;
    INVARIANT(o != NULL, "the policy's JSON does not parse: %.200s", json ? json : "(null)");
    cJSON_Delete(o);
    free(json);
    for (size_t i = 0; i < p->n_aliases; i++)
        INVARIANT(!strcmp(sw_policy_resolve(p, p->aliases[i].alias), p->aliases[i].model),
                  "alias %zu does not resolve to its model", i);
    for (size_t i = 0; i < p->n_pools; i++)
        INVARIANT(sw_policy_pool(p, p->pools[i].name) == &p->pools[i], "pool %zu not found by name", i);
    for (size_t i = 0; i < p->n_routes; i++)
        INVARIANT(p->routes[i].model && p->routes[i].target, "route %zu lacks model or target", i);
}

static bool check(const uint8_t *data, size_t n)
{
    char err[8192];
    sw_policy *p = sw_policy_parse(NAME, (const char *)data, n, err, sizeof err);
    if (!p) {
        check_rejection(err);
        return false;
    }
    check_policy(p);
    sw_policy_unref(p);
    return true;
}

#ifndef SW_LIBFUZZER
int main(int argc, char **argv)
{
    fuzz_seed seeds[16] = { { (const uint8_t *)BUILTIN, sizeof BUILTIN - 1 } };
    int n_seeds = 1;
    for (int i = 1; i < argc && n_seeds < 16; i++)
        if (!fuzz_read_file(argv[i], &seeds[n_seeds++])) return 2;
    int rc = fuzz_main("fuzz_policy", seeds, n_seeds, check);
    for (int i = 1; i < n_seeds; i++) free((void *)seeds[i].bytes);
    return rc;
}
#endif
