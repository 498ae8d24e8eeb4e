/* JSON Schema constraint (llm/json_schema.c): which texts a schema lets
 * through byte by byte, which schemas it refuses, and random walks over
 * the bytes it allows, each of which must end as JSON that fits. */
#include <cjson/cJSON.h>
#include <stdint.h>

#include "llm/json_schema.h"
#include "llm/util.h"
#include "tests/unit/check.h"

static sw_js *compile_text(const char *schema, char *err, size_t errlen)
{
    cJSON *s = cJSON_Parse(schema);
    if (!s) { snprintf(err, errlen, "test schema does not parse"); return NULL; }
    sw_js *js = sw_js_compile(s, err, errlen);
    cJSON_Delete(s);
    return js;
}

/* 1: the whole text is taken and complete; 0: some byte is refused;
 * 2: taken but not complete. */
static int verdict(const sw_js *js, const char *text)
{
    sw_js_state st;
    sw_js_start(js, &st);
    if (!sw_js_feed(js, &st, text, strlen(text))) return 0;
    return sw_js_complete(js, &st) ? 1 : 2;
}

typedef struct { const char *text; int want; } case_t;

static void check_cases(const char *schema, const case_t *cases, size_t n)
{
    char err[256] = "";
    sw_js *js = compile_text(schema, err, sizeof err);
    CHECK(js, "%s: %s", schema, err);
    if (!js) return;
    for (size_t i = 0; i < n; i++) {
        int got = verdict(js, cases[i].text);
        CHECK(got == cases[i].want, "schema %s text %s: got %d want %d", schema, cases[i].text, got, cases[i].want);
    }
    sw_js_free(js);
}

#define CASES(schema, ...) do { static const case_t c_[] = { __VA_ARGS__ }; \
    check_cases(schema, c_, sizeof c_ / sizeof *c_); } while (0)

static void test_values(void)
{
    CASES("{\"type\":\"object\"}",
          { "{}", 1 }, { " {\"a\": [1, 2.5e3, \"x\", null, true, {\"b\": false}]}", 1 },
          { "{\"a\":", 2 }, { "[]", 0 }, { "{\"a\" 1}", 0 }, { "{} ", 0 }, { "{,}", 0 },
          { "{\"a\":01}", 0 }, { "{\"a\":-}", 0 }, { "{\"a\":1.}", 0 }, { "{\"a\":\"\\q\"}", 0 },
          { "{\"a\":\"\\u00e9\\n\"}", 1 }, { "{\"a\":\"\\u00g9\"}", 0 }, { "{\"a\":\"x\ny\"}", 0 },
          { "{\"\xc3\xa9\":\"\xe2\x82\xac\"}", 1 }, { "{\"a\":\"\xc3\"}", 0 }, { "{\"a\":\"\x80\"}", 0 });
    CASES("{\"type\":\"integer\"}",
          { "0", 1 }, { "-12", 1 }, { "-", 2 }, { "1.5", 0 }, { "01", 0 }, { "1e3", 0 },
          { "12345678901234567", 0 }, { "1234567890123456", 1 });
    CASES("{\"type\":\"number\"}",
          { "1.5", 1 }, { "-0.5E-3", 1 }, { "1e", 2 }, { "1e+", 2 }, { ".5", 0 }, { "1.5.", 0 });
    CASES("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
          { "\"ab\"", 1 }, { "\"abc\"", 1 }, { "\"a\"", 0 }, { "\"abcd\"", 0 }, { "\"\\u00e9\\t\"", 1 },
          { "\"\xc3\xa9\xc3\xa9\"", 1 });
    CASES("{\"type\":\"boolean\"}", { "true", 1 }, { "false", 1 }, { "tru", 2 }, { "null", 0 });
    CASES("{\"type\":[\"integer\",\"null\"]}", { "null", 1 }, { "7", 1 }, { "\"7\"", 0 });
    CASES("{\"enum\":[\"red\",\"rose\",3,null]}",
          { "\"red\"", 1 }, { "\"rose\"", 1 }, { "\"ro\"", 0 }, { "3", 1 }, { "null", 1 }, { "4", 0 });
    CASES("{\"const\":{\"a\":1}}", { "{\"a\":1}", 1 }, { "{\"a\": 1}", 0 });
    /* numeric bounds: a digit that could only lead out of them is refused
     * at once, and a number ends only inside them */
    CASES("{\"type\":\"integer\",\"minimum\":1,\"maximum\":5}",
          { "3", 1 }, { "0", 0 }, { "6", 0 }, { "10", 0 }, { "-1", 0 }, { "5", 1 });
    CASES("{\"type\":\"integer\",\"minimum\":10}", { "1", 2 }, { "15", 1 }, { "9", 2 }, { "99999", 1 }, { "-3", 0 });
    CASES("{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1}",
          { "0", 2 }, { "0.5", 1 }, { "0.0", 2 }, { "1", 1 }, { "1.0", 1 }, { "1.5", 0 }, { "2", 0 }, { "0.5e1", 0 });
    CASES("{\"type\":\"integer\",\"minimum\":-5,\"maximum\":-1}",
          { "-3", 1 }, { "-0", 0 }, { "-10", 0 }, { "-1", 1 }, { "3", 0 });
    CASES("{\"type\":\"object\",\"properties\":{\"r\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":10}}}",
          { "{\"r\": 10}", 1 }, { "{\"r\": 1}", 1 }, { "{\"r\": 11}", 0 }, { "{\"r\": 0}", 0 });
    /* tuples: prefixItems, closed by items false or open to more */
    CASES("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}",
          { "[\"a\", 1]", 1 }, { "[\"a\"]", 1 }, { "[1, \"a\"]", 0 }, { "[\"a\", 1, 2]", 0 }, { "[]", 1 });
    CASES("{\"prefixItems\":[{\"const\":\"x\"}],\"items\":{\"type\":\"boolean\"},\"minItems\":2}",
          { "[\"x\", true, false]", 1 }, { "[\"x\"]", 0 }, { "[true, true]", 0 });
    CASES("{\"type\":\"array\",\"items\":false}", { "[]", 1 }, { "[1]", 0 });
    CASES("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":2}",
          { "[1]", 1 }, { "[1, 2]", 1 }, { "[]", 0 }, { "[1,2,3]", 0 }, { "[1,]", 0 }, { "[\"a\"]", 0 });
}

static void test_objects(void)
{
    const char *person = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                         "\"names\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
                         "\"age\":{\"type\":\"integer\"}},\"required\":[\"name\",\"age\"]}";
    CASES(person,
          { "{\"name\": \"Ann\", \"age\": 30}", 1 },
          { "{\"age\":30,\"name\":\"Ann\",\"names\":[\"A\"]}", 1 },
          { "{\"name\": \"Ann\"}", 0 },                    /* age is required */
          { "{\"name\": \"Ann\", \"name\": \"Bo\", \"age\": 1}", 0 },   /* no duplicates */
          { "{\"nam\": 1}", 0 }, { "{\"nick\": 1}", 0 },     /* undeclared keys */
          { "{\"age\": \"30\", \"name\": \"A\"}", 0 },
          { "{\n  \"name\": \"A\",\n  \"age\": 1\n}", 1 });
    /* whitespace: one space, or a line break and an indent of 4 a level */
    CASES("{\"type\":\"object\"}", { "{ }", 1 }, { "{  }", 0 }, { "{\n\n}", 0 }, { "{\r\n  }", 1 },
          { "{\n          }", 1 }, { "{\n           }", 0 }, { "{\"a\": [\n              1]}", 1 }, { "{\"a\": [\n               1]}", 0 }, { "{\r\r}", 0 }, { " \n{}", 0 });
    /* a string at its length limit cannot start an escape it could not finish */
    CASES("{\"type\":\"string\",\"maxLength\":1}", { "\"a\\", 0 }, { "\"\\u00e9\"", 1 }, { "\"\\n\"", 1 });
    /* undeclared keys when asked for, with their schema; declared ones stay unique */
    CASES("{\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"string\"}}",
          { "{\"a\":1,\"b\":\"x\"}", 1 }, { "{\"b\":1}", 0 }, { "{\"ab\":\"x\"}", 1 },
          { "{\"a\":1,\"a\":2}", 0 });
    CASES("{\"type\":\"object\",\"additionalProperties\":false}", { "{}", 1 }, { "{\"a\":1}", 0 });
    /* a key with characters JSON escapes */
    CASES("{\"properties\":{\"say \\\"hi\\\"\":{\"type\":\"null\"}}}",
          { "{\"say \\\"hi\\\"\":null}", 1 }, { "{\"say \\\"ho\\\"\":null}", 0 });
    /* anyOf over objects that share their first bytes: both readings live until one dies */
    CASES("{\"anyOf\":[{\"properties\":{\"name\":{\"const\":\"get\"},\"arguments\":{\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}},\"required\":[\"name\",\"arguments\"]},"
          "{\"properties\":{\"name\":{\"const\":\"put\"},\"arguments\":{\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"]}},\"required\":[\"name\",\"arguments\"]}]}",
          { "{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}", 1 },
          { "{\"name\": \"put\", \"arguments\": {\"n\": 3}}", 1 },
          { "{\"name\": \"get\", \"arguments\": {\"n\": 3}}", 0 },
          { "{\"name\": \"del\"", 0 });
    /* recursion through $defs */
    CASES("{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
          "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/t\"}",
          { "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3}]}", 1 }, { "{\"v\":1,\"kids\":[{}]}", 0 });
}

static void test_refusals(void)
{
    static const char *const bad[][2] = {
        { "{\"type\":\"string\",\"pattern\":\"^a\"}", "'pattern' is not supported" },
        { "{\"properties\":{\"n\":{\"type\":\"integer\",\"multipleOf\":2}}}", "#/properties/n" },
        { "{\"minimum\":3}", "needs \"type\"" },
        { "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "admit no number" },
        { "{\"type\":\"integer\",\"exclusiveMinimum\":1,\"exclusiveMaximum\":2}", "admit no integer" },
        { "{\"type\":\"number\",\"minimum\":1,\"exclusiveMinimum\":0}", "exclusive form" },
        { "{\"type\":\"number\",\"maximum\":1e300}", "from -1e15 to 1e15" },
        { "{\"type\":\"strin\"}", "unknown type 'strin'" },
        { "{\"$ref\":\"http://x/y\"}", "$ref" },
        { "{\"required\":[\"a\"],\"properties\":{}}", "required property 'a'" },
        { "{\"allOf\":[{},{}]}", "allOf" },
        { "false", "admits no value" },
        { "{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "maxItems" },
        { "{\"enum\":[]}", "enum" },
        { "[1]", "must be an object" },
        { "{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", "leads only to itself" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[256] = "";
        sw_js *js = compile_text(bad[i][0], err, sizeof err);
        CHECK(!js && strstr(err, bad[i][1]), "%s: err '%s', want '%s'", bad[i][0], err, bad[i][1]);
        sw_js_free(js);
    }
    /* annotations are ignored, not refused */
    char err[256] = "";
    sw_js *js = compile_text("{\"title\":\"T\",\"description\":\"d\",\"type\":\"string\",\"format\":\"date\",\"default\":\"x\"}", err, sizeof err);
    CHECK(js, "%s", err);
    sw_js_free(js);
}

/* Random walks: from the start, pick any byte the state takes (leaning
 * toward closing bytes as the text grows) until the value is final or
 * complete; every text must parse and fit. */
static const char *pick_from = "{}[]\":,0123456789-+.eE abcdefghijklmnopqrstuvwxyz\\\xc3\xa9\n";

static void random_walks(const char *schema, int walks, bool (*fits)(const cJSON *))
{
    char err[256] = "";
    sw_js *js = compile_text(schema, err, sizeof err);
    CHECK(js, "%s", err);
    if (!js) return;
    uint64_t rng = 42;
    int done = 0;
    for (int w = 0; w < walks; w++) {
        sw_js_state st;
        sw_js_start(js, &st);
        char text[2048];
        size_t n = 0;
        bool stuck = false;
        while (!sw_js_final(js, &st) && !(n > 200 && sw_js_complete(js, &st)) && n < sizeof text - 1) {
            char ok[64];
            int n_ok = 0;
            for (const char *p = pick_from; *p; p++)
                if (sw_js_accepts(js, &st, p, 1)) ok[n_ok++] = *p;
            if (!n_ok) {   /* none of ours: some byte must still do, or the state is a dead end */
                bool any = false;
                for (int b = 1; b < 256 && !any; b++) { char x = (char)b; any = sw_js_accepts(js, &st, &x, 1); }
                text[n] = 0;
                CHECK(any || sw_js_complete(js, &st), "schema %s: dead end after %s", schema, text);
                stuck = true;
                break;
            }
            char c = ok[sw_splitmix64(&rng) % (uint64_t)n_ok];
            /* past 60 bytes, prefer bytes that close something */
            if (n > 60) for (int k = 0; k < n_ok; k++)
                if (strchr("}]\"", ok[k]) && sw_splitmix64(&rng) % 2) { c = ok[k]; break; }
            CHECK(sw_js_feed(js, &st, &c, 1), "accepted byte refused");
            text[n++] = c;
        }
        text[n] = 0;
        if (stuck || n >= sizeof text - 1) continue;   /* a walk that wandered off: not a verdict */
        cJSON *v = cJSON_Parse(text);
        CHECK(v && fits(v), "schema %s: walk produced %s", schema, text);
        cJSON_Delete(v);
        done++;
    }
    CHECK(done >= walks / 2, "only %d of %d walks ended", done, walks);
    sw_js_free(js);
}

static bool fits_any(const cJSON *v) { return v != NULL; }
static bool fits_rating(const cJSON *v)
{
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(v, "r"), *x = cJSON_GetObjectItemCaseSensitive(v, "x");
    return cJSON_IsNumber(r) && r->valuedouble >= 1 && r->valuedouble <= 5 && r->valuedouble == (double)(int)r->valuedouble &&
           cJSON_IsNumber(x) && x->valuedouble > -0.5 && x->valuedouble < 2.25;
}
static bool fits_person(const cJSON *v)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(v, "name");
    const cJSON *age = cJSON_GetObjectItemCaseSensitive(v, "age");
    const cJSON *tags = cJSON_GetObjectItemCaseSensitive(v, "tags");
    if (!cJSON_IsObject(v) || !cJSON_IsString(name) || !cJSON_IsNumber(age) || age->valuedouble != (double)(long long)age->valuedouble)
        return false;
    if (tags) {
        if (!cJSON_IsArray(tags) || cJSON_GetArraySize(tags) > 3) return false;
        const cJSON *t;
        cJSON_ArrayForEach(t, tags) if (!cJSON_IsString(t) || (strcmp(t->valuestring, "a") && strcmp(t->valuestring, "b"))) return false;
    }
    int n = 0;
    const cJSON *k;
    cJSON_ArrayForEach(k, v) n++;
    return n == 2 + (tags != NULL);
}

int main(void)
{
    test_values();
    test_objects();
    test_refusals();
    random_walks("{\"type\":\"object\"}", 200, fits_any);
    random_walks("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":2}}", 200, fits_any);
    random_walks("{\"type\":\"object\",\"properties\":{\"r\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":5},"
                 "\"x\":{\"type\":\"number\",\"exclusiveMinimum\":-0.5,\"exclusiveMaximum\":2.25}},"
                 "\"required\":[\"r\",\"x\"],\"additionalProperties\":false}", 300, fits_rating);
    random_walks("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
                 "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"maxItems\":3,\"items\":{\"enum\":[\"a\",\"b\"]}}},"
                 "\"required\":[\"name\",\"age\"]}", 300, fits_person);
    CHECK_DONE();
}
