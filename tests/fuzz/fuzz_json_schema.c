/* Mutation fuzz of the structured-output constraint (llm/json_schema.c).
 *
 * An input is a schema (JSON text), a NUL, then bytes to feed. A schema
 * that does not parse or compile is refused; one that compiles takes the
 * bytes one at a time. Invariants: sw_js_accepts agrees with sw_js_feed on
 * every byte; a final state is complete; and every prefix the state calls
 * complete is JSON that cJSON parses (lone \u surrogates aside, which JSON's
 * grammar allows and cJSON refuses).
 *   fuzz_json_schema                 (loop settings: tests/fuzz/driver.h)
 */
#include <cjson/cJSON.h>

#include "llm/json_schema.h"

#include "tests/fuzz/driver.h"

static bool has_surrogate_escape(const char *s, size_t n)
{
    for (size_t i = 0; i + 2 < n; i++)
        if (s[i] == '\\' && s[i + 1] == 'u' && (s[i + 2] == 'd' || s[i + 2] == 'D')) return true;
    return false;
}

static bool check(const uint8_t *data, size_t n)
{
    const uint8_t *nul = memchr(data, 0, n);
    if (!nul) return false;
    cJSON *schema = cJSON_ParseWithLength((const char *)data, (size_t)(nul - data));
    if (!schema) return false;
    char err[256];
    sw_js *js = sw_js_compile(schema, err, sizeof err);
    cJSON_Delete(schema);
    if (!js) return false;
    const char *text = (const char *)nul + 1;
    size_t len = n - (size_t)(nul - data) - 1;
    sw_js_state st;
    sw_js_start(js, &st);
    for (size_t i = 0; i < len; i++) {
        bool would = sw_js_accepts(js, &st, text + i, 1);
        bool did = sw_js_feed(js, &st, text + i, 1);
        INVARIANT(would == did, "accepts says %d, feed says %d at byte %zu", would, did, i);
        if (!did) break;
        INVARIANT(st.n >= 1 && st.n <= SW_JS_ALTS, "%d readings", st.n);
        INVARIANT(!sw_js_final(js, &st) || sw_js_complete(js, &st), "final but not complete at byte %zu", i);
        if (sw_js_complete(js, &st) && !has_surrogate_escape(text, i + 1)) {
            cJSON *v = cJSON_ParseWithLength(text, i + 1);
            INVARIANT(v != NULL, "complete but not JSON: %.*s", (int)(i + 1), text);
            cJSON_Delete(v);
        }
    }
    sw_js_free(js);
    return true;
}

#ifndef SW_LIBFUZZER
int main(void)
{
    static const char *const pairs[][2] = {
        { "{\"type\":\"object\"}", "{\"a\": [1, -2.5e3, \"x\\n\\u00e9\", null, true, {\"b\": false}]}" },
        { "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":4},"
          "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":2}},"
          "\"required\":[\"name\"],\"additionalProperties\":false}",
          "{\n  \"name\": \"Ann\",\n  \"age\": 30,\n  \"tags\": [\"a\"]\n}" },
        { "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"minLength\":1},{\"const\":[1,2]}]}", "\"xy\"" },
        { "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\"},"
          "\"k\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/t\"}",
          "{\"v\": 1.5, \"k\": [{\"v\": 2, \"k\": []}]}" },
        { "{\"type\":\"number\"}", "-0.25E+12" },
        { "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":-2.5,\"exclusiveMaximum\":10}}", "[-2.5, 0, 9.99]" },
        { "{\"prefixItems\":[{\"type\":\"string\"},{\"enum\":[1,2]}],\"items\":false}", "[\"a\", 2]" },
        { "{\"properties\":{\"a\":{\"type\":\"boolean\"}},\"additionalProperties\":{\"type\":[\"string\",\"null\"]}}",
          "{\"a\": true, \"zz\": null, \"q\": \"\\\"\"}" },
    };
    enum { N = sizeof pairs / sizeof pairs[0] };
    static uint8_t buf[N][1024];
    fuzz_seed seeds[N];
    for (int i = 0; i < N; i++) {
        size_t a = strlen(pairs[i][0]), b = strlen(pairs[i][1]);
        memcpy(buf[i], pairs[i][0], a);
        buf[i][a] = 0;
        memcpy(buf[i] + a + 1, pairs[i][1], b);
        seeds[i] = (fuzz_seed){ buf[i], a + 1 + b };
    }
    return fuzz_main("fuzz_json_schema", seeds, N, check);
}
#endif
