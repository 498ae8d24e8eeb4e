/* Routing policy (gateway/policy.c): the seed example loads with exact values,
 * every class of mistake is reported at its exact file:line:column, all errors
 * come together, and random damage to a good file never crashes the parser. */
#include "gateway/policy.h"
#include "tests/unit/check.h"

#include <cjson/cJSON.h>

/* CHECK(cond) without a message expands to an empty format string. */
#pragma GCC diagnostic ignored "-Wformat-zero-length"
#include <ctype.h>
#include <errno.h>
#include <unistd.h>

/* The seed example of issue 2, verbatim. */
static const char SEED[] =
    "routes:\n"
    "  - model: \"llama-3-70b\"\n"
    "    quantization: \"fp8\"\n"
    "    target: \"gpu-pool\"\n"
    "    max_concurrency: 100\n"
    "  - model: \"llama-3-70b\"\n"
    "    quantization: \"q4_k_m\"\n"
    "    target: \"cpu-pool\"\n"
    "    max_concurrency: 500\n"
    "    priority: \"overflow\"\n"
    "  - model: \"llama-3-405b\"\n"
    "    quantization: \"int4\"\n"
    "    target: \"cpu-pool-large\"\n"
    "    max_concurrency: 20\n";

static char err[16384];

static sw_policy *parse(const char *text)
{
    return sw_policy_parse("t.yaml", text, strlen(text), err, sizeof err);
}

/* Does err hold a line "t.yaml:LINE:COL: ...needle..."? */
static bool has_error(int line, int col, const char *needle)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "t.yaml:%d:%d: ", line, col);
    for (const char *l = err; l && *l; ) {
        const char *nl = strchr(l, '\n');
        size_t n = nl ? (size_t)(nl - l) : strlen(l);
        char buf[1024];
        snprintf(buf, sizeof buf, "%.*s", (int)n, l);
        if (!strncmp(buf, prefix, strlen(prefix)) && strstr(buf, needle)) return true;
        l = nl ? nl + 1 : NULL;
    }
    return false;
}

static int count_lines(const char *s)
{
    if (!*s) return 0;
    int n = 1;
    for (; *s; s++) n += *s == '\n' && s[1] != '\0';
    return n;
}

/* The seed with line `lineno` (1-based) replaced. */
static char *seed_with_line(int lineno, const char *replacement)
{
    static char buf[4096];
    const char *s = SEED;
    size_t o = 0;
    for (int ln = 1; *s; ln++) {
        const char *nl = strchr(s, '\n');
        size_t n = (size_t)(nl - s) + 1;
        if (ln == lineno) o += (size_t)snprintf(buf + o, sizeof buf - o, "%s\n", replacement);
        else { memcpy(buf + o, s, n); o += n; }
        s += n;
    }
    buf[o] = '\0';
    return buf;
}

static void test_seed(void)
{
    sw_policy *p = parse(SEED);
    CHECK(p != NULL, "seed must load: %s", err);
    if (!p) return;
    CHECK(p->n_routes == 3);
    CHECK(!strcmp(p->routes[0].model, "llama-3-70b"));
    CHECK(!strcmp(p->routes[0].quantization, "fp8"));
    CHECK(!strcmp(p->routes[0].target, "gpu-pool"));
    CHECK(p->routes[0].max_concurrency == 100);
    CHECK(p->routes[0].priority == SW_PRIO_PRIMARY);
    CHECK(p->routes[0].line == 2 && p->routes[0].column == 5, "%d:%d", p->routes[0].line, p->routes[0].column);
    CHECK(!strcmp(p->routes[1].model, "llama-3-70b"));
    CHECK(!strcmp(p->routes[1].quantization, "q4_k_m"));
    CHECK(!strcmp(p->routes[1].target, "cpu-pool"));
    CHECK(p->routes[1].max_concurrency == 500);
    CHECK(p->routes[1].priority == SW_PRIO_OVERFLOW);
    CHECK(p->routes[1].line == 6);
    CHECK(!strcmp(p->routes[2].model, "llama-3-405b"));
    CHECK(!strcmp(p->routes[2].quantization, "int4"));
    CHECK(!strcmp(p->routes[2].target, "cpu-pool-large"));
    CHECK(p->routes[2].max_concurrency == 20);
    CHECK(p->routes[2].priority == SW_PRIO_PRIMARY);
    for (size_t i = 0; i < 3; i++) {
        CHECK(p->routes[i].match_class == SW_CLASS_ANY);
        CHECK(p->routes[i].match_min_prompt_tokens == 0 && p->routes[i].match_max_prompt_tokens == 0);
        CHECK(p->routes[i].n_match_api_keys == 0 && p->routes[i].n_match_tenants == 0);
    }
    /* No pools section: each target is an implicit pool of kind any, in order. */
    CHECK(p->n_pools == 3);
    const char *want[] = { "gpu-pool", "cpu-pool", "cpu-pool-large" };
    for (size_t i = 0; i < 3 && i < p->n_pools; i++) {
        CHECK(!strcmp(p->pools[i].name, want[i]), "pool %zu = %s", i, p->pools[i].name);
        CHECK(p->pools[i].kind == SW_POOL_ANY && p->pools[i].max_concurrency == 0 && p->pools[i].max_queue == 0);
    }
    CHECK(sw_policy_pool(p, "cpu-pool") == &p->pools[1]);
    CHECK(sw_policy_pool(p, "nope") == NULL);
    CHECK(p->n_aliases == 0);
    CHECK(p->defaults.queue_length == 256 && p->defaults.queue_timeout_ms == 30000);
    CHECK(p->defaults.request_timeout_ms == 600000 && p->defaults.first_token_timeout_ms == 120000);
    CHECK(p->defaults.error_rate_threshold == 0.5f);
    CHECK(!strcmp(p->path, "t.yaml"));
    CHECK(!strcmp(p->source, SEED));
    CHECK(p->refcount == 1);
    sw_policy_unref(p);
}

/* The copy in docs/examples must stay the seed, byte for byte. */
static void test_seed_file(void)
{
    const char *path = "docs/examples/seed-routes.yaml";
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "%s: %s (run from the project root)", path, strerror(errno));
    if (!f) return;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    CHECK(!strcmp(buf, SEED), "%s differs from the seed example", path);
    sw_policy *p = sw_policy_load(path, err, sizeof err);
    CHECK(p && p->n_routes == 3 && !strcmp(p->path, path), "%s", err);
    sw_policy_unref(p);
    /* And the repository's default policy (make run) must load too. */
    p = sw_policy_load("routes.yaml", err, sizeof err);
    CHECK(p != NULL, "routes.yaml: %s", err);
    if (p) {
        CHECK(!strcmp(sw_policy_resolve(p, "demo"), "demo"));
        const sw_pool_def *g = sw_policy_pool(p, "gpu-pool"), *c = sw_policy_pool(p, "cpu-pool");
        CHECK(g && g->kind == SW_POOL_GPU && c && c->kind == SW_POOL_CPU);
        bool primary_gpu = false, overflow_cpu = false;
        for (size_t i = 0; i < p->n_routes; i++) {
            const sw_route *r = &p->routes[i];
            if (strcmp(r->model, "demo")) continue;
            primary_gpu |= !strcmp(r->target, "gpu-pool") && r->priority == SW_PRIO_PRIMARY;
            overflow_cpu |= !strcmp(r->target, "cpu-pool") && r->priority == SW_PRIO_OVERFLOW;
        }
        CHECK(primary_gpu && overflow_cpu, "routes.yaml: demo must go gpu-pool first, then spill to cpu-pool");
    }
    sw_policy_unref(p);
}

static void test_positions(void)
{
    /* "    max_concurrency: " is 21 characters, so the value is at column 22. */
    CHECK(!parse(seed_with_line(5, "    max_concurrency: -3")));
    CHECK(has_error(5, 22, "max_concurrency must not be negative"), "%s", err);
    CHECK(count_lines(err) == 1, "exactly one error expected:\n%s", err);

    CHECK(!parse(seed_with_line(9, "    max_concurrency: 2.5")));
    CHECK(has_error(9, 22, "whole number"), "%s", err);
    CHECK(!parse(seed_with_line(9, "    max_concurrency: \"500\"")));
    CHECK(has_error(9, 22, "quoted string"), "%s", err);
    CHECK(!parse(seed_with_line(14, "    max_concurrency: 5000000000")));
    CHECK(has_error(14, 22, "too large"), "%s", err);
    CHECK(!parse(seed_with_line(14, "    max_concurrency: 1e3")));
    CHECK(has_error(14, 22, "plain decimal digits"), "%s", err);
    CHECK(!parse(seed_with_line(14, "    max_concurrency: lots")));
    CHECK(has_error(14, 22, "must be an integer"), "%s", err);

    CHECK(!parse(seed_with_line(10, "    priority: \"overflo\"")));
    CHECK(has_error(10, 15, "did you mean 'overflow'?"), "%s", err);

    CHECK(!parse(seed_with_line(1, "rutes:")));
    CHECK(has_error(1, 1, "unknown key 'rutes'") && has_error(1, 1, "(did you mean 'routes'?)"), "%s", err);
    CHECK(has_error(1, 1, "missing required key 'routes'"), "%s", err);

    CHECK(!parse(seed_with_line(3, "    quantisation: \"fp8\"")));
    CHECK(has_error(3, 5, "unknown key 'quantisation' in route (did you mean 'quantization'?)"), "%s", err);

    /* A route without a target: reported at the start of the route (line 11, column 5). */
    CHECK(!parse(seed_with_line(13, "    # target removed")));
    CHECK(has_error(11, 5, "missing required key 'target'"), "%s", err);

    CHECK(!parse(seed_with_line(2, "  - model: \"\"")));
    CHECK(has_error(2, 12, "model must be a non-empty string"), "%s", err);
    CHECK(!parse(seed_with_line(2, "  - model: ~")));
    CHECK(has_error(2, 12, "model must be a non-empty string"), "%s", err);
    CHECK(!parse(seed_with_line(2, "  - model: [a, b]")));
    CHECK(has_error(2, 12, "model must be a string, got a sequence"), "%s", err);
    CHECK(!parse(seed_with_line(7, "    quantization: \"q4 k m\"")));
    CHECK(has_error(7, 19, "invalid character"), "%s", err);
}

static void test_duplicates(void)
{
    CHECK(!parse(seed_with_line(4, "    target: \"gpu-pool\"\n    target: \"cpu-pool\"")));
    CHECK(has_error(5, 5, "duplicate key 'target' in route (first given at line 4)"), "%s", err);

    const char *dup_routes =
        "routes:\n"
        "  - {model: m, target: gpu, max_concurrency: 4}\n"
        "  - {model: m, target: gpu, max_concurrency: 8}\n"
        "  - {model: m, target: gpu, quantization: fp8}\n";
    CHECK(!parse(dup_routes));
    CHECK(has_error(3, 5, "duplicate route") && strstr(err, "line 2"), "%s", err);
    CHECK(count_lines(err) == 1, "the fp8 route differs and is fine:\n%s", err);

    const char *dup_top =
        "routes:\n"
        "  - {model: m, target: gpu}\n"
        "routes:\n"
        "  - {model: n, target: gpu}\n";
    CHECK(!parse(dup_top));
    CHECK(has_error(3, 1, "duplicate key 'routes' in the policy (first given at line 1)"), "%s", err);

    const char *dup_pools =
        "pools:\n"
        "  - {name: gpu, kind: gpu}\n"
        "  - {name: gpu, kind: cpu}\n"
        "routes:\n"
        "  - {model: m, target: gpu}\n";
    CHECK(!parse(dup_pools));
    CHECK(has_error(3, 12, "duplicate pool 'gpu' (first defined at line 2)"), "%s", err);
}

static void test_many_errors(void)
{
    const char *text =
        "pools:\n"                                    /* 1 */
        "  gpu-pool: {kind: gpu, max_queue: -1}\n"    /* 2 */
        "  cpu-pool: {kind: cpux}\n"                  /* 3 */
        "routes:\n"                                   /* 4 */
        "  - model: a\n"                              /* 5 */
        "    target: gpu-pol\n"                       /* 6 */
        "  - model: b\n"                              /* 7 */
        "    target: cpu-pool\n"                      /* 8 */
        "    priority: overflow\n"                    /* 9 */
        "    match:\n"                                /* 10 */
        "      class: batchy\n"                       /* 11 */
        "      prompt_tokens: {min: 10, max: 5}\n"    /* 12 */
        "      api_keys: []\n"                        /* 13 */
        "  - model: c\n"                              /* 14 */
        "    target: cpu-pool\n"                      /* 15 */
        "    priority: overflow\n"                    /* 16 */
        "aliases:\n"                                  /* 17 */
        "  gpt-4o: aa\n"                              /* 18 */
        "  a: c\n"                                    /* 19 */
        "defaults:\n"                                 /* 20 */
        "  error_rate_threshold: 1.5\n"               /* 21 */
        "  queue_timeout_ms: 0\n"                     /* 22 */
        "  queue_lenght: 3\n";                        /* 23 */
    CHECK(!parse(text));
    CHECK(has_error(2, 36, "max_queue must not be negative"), "%s", err);
    CHECK(has_error(3, 20, "kind must be one of any|cpu|gpu") && strstr(err, "did you mean 'cpu'"), "%s", err);
    CHECK(has_error(6, 13, "target pool 'gpu-pol' is not declared in pools (did you mean 'gpu-pool'?)"), "%s", err);
    CHECK(has_error(11, 14, "class must be one of interactive|batch"), "%s", err);
    CHECK(has_error(12, 28, "prompt_tokens.min (10) is above prompt_tokens.max (5)"), "%s", err);
    CHECK(has_error(13, 17, "api_keys must not be empty"), "%s", err);
    CHECK(has_error(16, 15, "model 'c' has only overflow routes"), "%s", err);
    CHECK(has_error(18, 11, "alias 'gpt-4o' points to 'aa', which has no route (did you mean 'a'?)"), "%s", err);
    CHECK(has_error(19, 3, "alias 'a' has the same name as a routed model"), "%s", err);
    CHECK(has_error(21, 25, "error_rate_threshold must be between 0 and 1"), "%s", err);
    CHECK(has_error(22, 21, "queue_timeout_ms must be at least 1"), "%s", err);
    CHECK(has_error(23, 3, "unknown key 'queue_lenght' in defaults (did you mean 'queue_length'?)"), "%s", err);
    CHECK(count_lines(err) == 12, "expected 12 errors, got:\n%s", err);
    /* Sorted by position. */
    int last = 0, ok = 1;
    for (const char *l = err; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        int ln = atoi(l + strlen("t.yaml:"));
        ok &= ln >= last;
        last = ln;
    }
    CHECK(ok, "errors not in line order:\n%s", err);
}

static void test_syntax_and_empty(void)
{
    CHECK(!parse("routes:\n  - model: \"x\n    target: y\n"));
    CHECK(strstr(err, "t.yaml:") && strstr(err, "YAML syntax error"), "%s", err);
    CHECK(!parse("routes:\n  - model: x\n    target: [a\n"));
    CHECK(has_error(4, 1, "YAML syntax error: did not find expected ',' or ']'"), "%s", err);
    CHECK(strstr(err, "line 3, column 13"), "the context mark is reported: %s", err);
    CHECK(!parse("routes:\n  - model: x\n   target: y\n"));
    CHECK(has_error(3, 4, "YAML syntax error"), "%s", err);
    CHECK(!parse("routes:\n\t- model: x\n"));
    CHECK(has_error(2, 1, "YAML syntax error"), "tab indentation: %s", err);
    CHECK(!parse("routes: *nothing\n"));
    CHECK(has_error(1, 9, "YAML syntax error"), "undefined alias: %s", err);
    CHECK(!parse("routes:\n  - {model: x, target: \xff\xfe}\n"));
    CHECK(has_error(2, 24, "YAML syntax error: invalid") , "bad UTF-8: %s", err);

    CHECK(!parse(""));
    CHECK(has_error(1, 1, "the policy is empty"), "%s", err);
    CHECK(!parse("# only a comment\n\n"));
    CHECK(has_error(1, 1, "the policy is empty"), "%s", err);
    CHECK(!sw_policy_parse("t.yaml", NULL, 0, err, sizeof err));
    CHECK(has_error(1, 1, "the policy is empty"), "%s", err);
    CHECK(!parse("- a\n- b\n"));
    CHECK(has_error(1, 1, "the policy must be a mapping, got a sequence"), "%s", err);
    CHECK(!parse("routes: []\n"));
    CHECK(has_error(1, 9, "routes must not be empty"), "%s", err);
    CHECK(!parse("routes:\n"));
    CHECK(has_error(1, 8, "routes must be a sequence"), "%s", err);
    CHECK(!parse("pools: []\n"));
    CHECK(has_error(1, 1, "missing required key 'routes'"), "%s", err);
    CHECK(!parse("routes: [{model: m, target: p}]\n---\nroutes: [{model: n, target: q}]\n"));
    CHECK(has_error(3, 1, "only one YAML document"), "%s", err);
}

static void test_full_schema_and_aliases(void)
{
    const char *text =
        "pools:\n"
        "  - name: gpu-pool\n"
        "    kind: gpu\n"
        "    max_concurrency: 64\n"
        "    max_queue: 16\n"
        "  - {name: cpu-pool, kind: cpu}\n"
        "  - name: spare\n"
        "routes:\n"
        "  - model: llama\n"
        "    quantization: FP8\n"
        "    target: gpu-pool\n"
        "    max_concurrency: 8\n"
        "    match:\n"
        "      class: interactive\n"
        "      prompt_tokens: {min: 1, max: 4096}\n"
        "      api_keys: [sk-0123456789abcdef, k2]\n"
        "      tenants: [acme, \"globex\"]\n"
        "  - model: llama\n"
        "    target: cpu-pool\n"
        "    priority: overflow\n"
        "aliases:\n"
        "  gpt-4o: llama\n"
        "  \"gpt-3.5-turbo\": llama\n"
        "defaults:\n"
        "  queue_length: 0\n"
        "  queue_timeout_ms: 1500\n"
        "  request_timeout_ms: 60000\n"
        "  first_token_timeout_ms: 5000\n"
        "  error_rate_threshold: 0.25\n";
    sw_policy *p = parse(text);
    CHECK(p != NULL, "%s", err);
    if (!p) return;
    CHECK(p->n_pools == 3 && p->pools[0].kind == SW_POOL_GPU && p->pools[0].max_concurrency == 64
          && p->pools[0].max_queue == 16 && p->pools[1].kind == SW_POOL_CPU && p->pools[2].kind == SW_POOL_ANY);
    const sw_route *r = &p->routes[0];
    CHECK(!strcmp(r->quantization, "fp8"), "quantization is lower-cased: %s", r->quantization);
    CHECK(r->max_concurrency == 8 && r->match_class == SW_CLASS_INTERACTIVE);
    CHECK(r->match_min_prompt_tokens == 1 && r->match_max_prompt_tokens == 4096);
    CHECK(r->n_match_api_keys == 2 && !strcmp(r->match_api_keys[0], "sk-0123456789abcdef")
          && !strcmp(r->match_api_keys[1], "k2"));
    CHECK(r->n_match_tenants == 2 && !strcmp(r->match_tenants[1], "globex"));
    CHECK(p->routes[1].quantization == NULL && p->routes[1].priority == SW_PRIO_OVERFLOW);
    CHECK(p->routes[1].max_concurrency == 0);
    CHECK(p->n_aliases == 2);
    CHECK(!strcmp(sw_policy_resolve(p, "gpt-4o"), "llama"));
    CHECK(!strcmp(sw_policy_resolve(p, "gpt-3.5-turbo"), "llama"));
    CHECK(!strcmp(sw_policy_resolve(p, "llama"), "llama"));
    CHECK(!strcmp(sw_policy_resolve(p, "unknown"), "unknown"));
    CHECK(!strcmp(sw_policy_resolve(NULL, "x"), "x"));
    CHECK(p->defaults.queue_length == 0 && p->defaults.queue_timeout_ms == 1500);
    CHECK(p->defaults.request_timeout_ms == 60000 && p->defaults.first_token_timeout_ms == 5000);
    CHECK(p->defaults.error_rate_threshold == 0.25f);

    /* JSON parses back with every part. */
    char *js = sw_policy_to_json(p);
    CHECK(js != NULL);
    cJSON *j = cJSON_Parse(js);
    CHECK(j != NULL, "not JSON: %s", js);
    if (j) {
        CHECK(cJSON_GetObjectItem(j, "version")->valuedouble == (double)p->version);
        CHECK(!strcmp(cJSON_GetObjectItem(j, "path")->valuestring, "t.yaml"));
        cJSON *pools = cJSON_GetObjectItem(j, "pools");
        CHECK(cJSON_GetArraySize(pools) == 3);
        cJSON *p0 = cJSON_GetArrayItem(pools, 0);
        CHECK(!strcmp(cJSON_GetObjectItem(p0, "kind")->valuestring, "gpu")
              && cJSON_GetObjectItem(p0, "max_concurrency")->valueint == 64);
        cJSON *routes = cJSON_GetObjectItem(j, "routes");
        CHECK(cJSON_GetArraySize(routes) == 2);
        cJSON *r0 = cJSON_GetArrayItem(routes, 0), *r1 = cJSON_GetArrayItem(routes, 1);
        CHECK(!strcmp(cJSON_GetObjectItem(r0, "quantization")->valuestring, "fp8"));
        CHECK(!strcmp(cJSON_GetObjectItem(r0, "priority")->valuestring, "primary"));
        CHECK(!strcmp(cJSON_GetObjectItem(r1, "priority")->valuestring, "overflow"));
        CHECK(cJSON_IsNull(cJSON_GetObjectItem(r1, "quantization")));
        CHECK(cJSON_GetObjectItem(r0, "line")->valueint == 9 && cJSON_GetObjectItem(r0, "column")->valueint == 5);
        cJSON *m = cJSON_GetObjectItem(r0, "match");
        CHECK(!strcmp(cJSON_GetObjectItem(m, "class")->valuestring, "interactive"));
        CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(m, "prompt_tokens"), "max")->valueint == 4096);
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(m, "tenants")) == 2);
        cJSON *keys = cJSON_GetObjectItem(m, "api_keys");
        CHECK(cJSON_GetArraySize(keys) == 2);
        CHECK(!strstr(js, "0123456789abcdef"), "API keys must be redacted: %s", js);
        CHECK(!strcmp(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "aliases"), "gpt-4o")->valuestring, "llama"));
        cJSON *d = cJSON_GetObjectItem(j, "defaults");
        CHECK(cJSON_GetObjectItem(d, "queue_timeout_ms")->valueint == 1500);
        CHECK(cJSON_GetObjectItem(d, "error_rate_threshold")->valuedouble == 0.25);
        cJSON_Delete(j);
    }
    free(js);
    sw_policy_unref(p);

    /* An empty pools section declares nothing: targets stay implicit. */
    p = parse("pools: []\nroutes: [{model: a, target: p}]\n");
    CHECK(p && p->n_pools == 1 && !strcmp(p->pools[0].name, "p"), "%s", err);
    sw_policy_unref(p);
    p = parse("pools:\nroutes: [{model: a, target: p}]\n");
    CHECK(p && p->n_pools == 1, "%s", err);
    sw_policy_unref(p);

    /* Alias checks. */
    CHECK(!parse("routes: [{model: a, target: p}]\naliases: {b: a, c: b, a: a}\n"));
    CHECK(has_error(2, 20, "which is itself an alias"), "%s", err);
    CHECK(has_error(2, 23, "alias 'a' has the same name as a routed model"), "%s", err);
    CHECK(!parse("routes: [{model: a, target: p}]\naliases: [a, b]\n"));
    CHECK(has_error(2, 10, "aliases must be a mapping, got a sequence"), "%s", err);
    CHECK(!parse("routes: [{model: a, target: p}]\naliases: {b: a, b: a}\n"));
    CHECK(has_error(2, 17, "duplicate key 'b' in aliases"), "%s", err);
}

static void test_refcount_version_load(void)
{
    sw_policy *a = parse(SEED);
    sw_policy *b = parse(SEED);
    CHECK(a && b);
    if (!a || !b) return;
    CHECK(b->version > a->version, "version must grow: %llu then %llu",
          (unsigned long long)a->version, (unsigned long long)b->version);
    uint64_t v = b->version;
    CHECK(!parse("routes: []\n"));   /* a failed load does not use up a version */
    sw_policy *c = parse(SEED);
    CHECK(c && c->version == v + 1);
    sw_policy_unref(c);

    CHECK(sw_policy_ref(a) == a && a->refcount == 2);
    sw_policy_unref(a);
    CHECK(a->refcount == 1);
    sw_policy_unref(a);   /* freed here: ASan would flag any later use */
    sw_policy_unref(b);
    sw_policy_unref(NULL);
    CHECK(sw_policy_ref(NULL) == NULL);

    /* From a real file, and a clear message for one that cannot be read. */
    char path[] = "/tmp/sw_policy_testXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK(write(fd, SEED, strlen(SEED)) == (ssize_t)strlen(SEED));
    close(fd);
    sw_policy *f = sw_policy_load(path, err, sizeof err);
    CHECK(f && !strcmp(f->path, path) && !strcmp(f->source, SEED), "%s", err);
    sw_policy_unref(f);
    unlink(path);
    CHECK(!sw_policy_load(path, err, sizeof err));
    char want[256];
    snprintf(want, sizeof want, "%s: cannot read: No such file or directory", path);
    CHECK(!strcmp(err, want), "got: %s", err);
    CHECK(!sw_policy_load("/", err, sizeof err));
    CHECK(!strcmp(err, "/: cannot read: Is a directory"), "got: %s", err);

    /* Error messages carry the path given to load. */
    strcpy(path, "/tmp/sw_policy_testXXXXXX");
    fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    const char *bad = "routes:\n  - {model: m, target: p, max_concurrency: -3}\n";
    CHECK(write(fd, bad, strlen(bad)) == (ssize_t)strlen(bad));
    close(fd);
    CHECK(!sw_policy_load(path, err, sizeof err));
    snprintf(want, sizeof want, "%s:2:44: max_concurrency must not be negative", path);
    CHECK(!strncmp(err, want, strlen(want)), "got: %s", err);
    unlink(path);
}

/* A small err buffer gets whole lines and a count of what did not fit. */
static void test_truncation(void)
{
    char text[8192] = "routes:\n";
    for (int i = 0; i < 40; i++) {
        char line[128];
        snprintf(line, sizeof line, "  - {model: m%d, target: p, max_concurrency: -%d}\n", i, i + 1);
        strcat(text, line);
    }
    char small[300];
    CHECK(!sw_policy_parse("t.yaml", text, strlen(text), small, sizeof small));
    CHECK(strlen(small) < sizeof small);
    CHECK(strstr(small, "t.yaml:2:") == small, "%s", small);
    CHECK(strstr(small, "more errors") != NULL, "%s", small);
    const char *last = strrchr(small, '\n');
    CHECK(last && !strncmp(last + 1, "... and ", 8), "the last line is the count: %s", small);
    /* No line is cut in half: every line but the last is a complete error. */
    int whole = 1;
    for (const char *l = small; l < last; l = strchr(l, '\n') + 1)
        whole &= !strncmp(l, "t.yaml:", 7) && strstr(l, "must not be negative") < strchr(l, '\n');
    CHECK(whole, "%s", small);
    /* A tiny buffer still gets a terminated string, and no buffer at all is fine. */
    char tiny[8];
    CHECK(!sw_policy_parse("t.yaml", text, strlen(text), tiny, sizeof tiny) && strlen(tiny) < sizeof tiny);
    CHECK(!sw_policy_parse("t.yaml", text, strlen(text), NULL, 0));
}

/* Every line of an error text must be "t.yaml:L:C: ..." with L within the file. */
static bool errors_well_formed(const char *e, int max_line)
{
    if (!*e) return false;
    for (const char *l = e; l && *l; ) {
        if (!strncmp(l, "... and ", 8)) goto next;
        if (strncmp(l, "t.yaml:", 7)) return false;
        char *end;
        long ln = strtol(l + 7, &end, 10);
        if (*end != ':' || ln < 1 || ln > max_line) return false;
        long col = strtol(end + 1, &end, 10);
        if (*end != ':' || col < 1 || end[1] != ' ') return false;
    next:
        l = strchr(l, '\n');
        if (l) l++;
    }
    return true;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Random damage to the seed: characters YAML cares about, bytes, line moves. */
static size_t mutate(char *buf, size_t len, size_t cap)
{
    static const char special[] = ":-[]{}\"'#&*!|>%@,? \n\t0123456789abcxyz~.";
    int edits = 1 + (int)(rnd() % 4);
    for (int e = 0; e < edits && len > 0; e++) {
        size_t at = rnd() % len;
        switch (rnd() % 6) {
        case 0: buf[at] = special[rnd() % (sizeof special - 1)]; break;
        case 1: buf[at] = (char)(rnd() & 0xff); break;
        case 2:   /* insert */
            if (len + 1 < cap) { memmove(buf + at + 1, buf + at, len - at); buf[at] = special[rnd() % (sizeof special - 1)]; len++; }
            break;
        case 3: memmove(buf + at, buf + at + 1, len - at - 1); len--; break;   /* delete */
        case 4: {   /* duplicate a slice (repeats keys and routes) */
            size_t n = 1 + rnd() % 40;
            if (at + n > len) n = len - at;
            if (len + n < cap) { memmove(buf + at + n, buf + at, len - at); len += n; }
            break;
        }
        case 5: if (at + 1 < len) { char t = buf[at]; buf[at] = buf[at + 1]; buf[at + 1] = t; } break;
        }
    }
    buf[len] = '\0';
    return len;
}

#ifndef FUZZ_ITERS
#define FUZZ_ITERS 4000   /* -DFUZZ_ITERS=N for a longer run by hand */
#endif

static void test_fuzz(void)
{
    char buf[2048];
    int loaded = 0, rejected = 0, bad = 0;
    for (int it = 0; it < FUZZ_ITERS; it++) {
        size_t len = strlen(SEED);
        memcpy(buf, SEED, len + 1);
        len = mutate(buf, len, sizeof buf);
        int lines = 1;
        for (size_t i = 0; i < len; i++) lines += buf[i] == '\n';
        sw_policy *p = sw_policy_parse("t.yaml", buf, len, err, sizeof err);
        if (p) {
            loaded++;
            char *js = sw_policy_to_json(p);
            cJSON *j = js ? cJSON_Parse(js) : NULL;
            if (!j) bad++;
            cJSON_Delete(j);
            free(js);
            sw_policy_unref(p);
        } else {
            rejected++;
            if (!errors_well_formed(err, lines + 1)) {
                if (bad++ < 3) fprintf(stderr, "malformed error text for input:\n%s\n---\n%s\n", buf, err);
            }
        }
    }
    CHECK(bad == 0, "%d malformed results", bad);
    CHECK(loaded > 50 && rejected > 50, "mutations should both load and fail: %d loaded, %d rejected",
          loaded, rejected);
    printf("fuzz: %d loaded, %d rejected\n", loaded, rejected);
}

/* cost_per_hour: a price per worker of a pool, a plain number >= 0. */
static void test_cost_per_hour(void)
{
    static const char GOOD[] =
        "pools:\n"
        "  gpu-pool: {kind: gpu, cost_per_hour: 2.5}\n"
        "  cpu-pool: {kind: cpu, cost_per_hour: 0}\n"
        "  free-pool: {kind: cpu}\n"
        "routes:\n"
        "  - {model: m, target: gpu-pool}\n";
    sw_policy *p = parse(GOOD);
    CHECK(p, "%s", err);
    if (p) {
        const sw_pool_def *g = sw_policy_pool(p, "gpu-pool"), *c = sw_policy_pool(p, "cpu-pool"),
                          *f = sw_policy_pool(p, "free-pool");
        CHECK(g && g->has_cost && g->cost_per_hour == 2.5);
        CHECK(c && c->has_cost && c->cost_per_hour == 0);
        CHECK(f && !f->has_cost);
        char *json = sw_policy_to_json(p);
        CHECK(json && strstr(json, "\"cost_per_hour\":2.5"), "%s", json ? json : "(null)");
        free(json);
        sw_policy_unref(p);
    }
    static const struct { const char *value, *msg; } bad[] = {
        {"-1", "must be between 0 and"}, {"\"2.5\"", "quoted string"}, {"cheap", "must be a number of dollars"},
        {"[1]", "got a sequence"}, {"~", "got nothing"}, {"1e9", "must be between 0 and"}, {".nan", "must be a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char text[512];
        /* "    cost_per_hour: " is 19 characters: the value is at column 20 of line 4. */
        snprintf(text, sizeof text, "pools:\n  - name: gpu-pool\n    kind: gpu\n    cost_per_hour: %s\n"
                 "routes:\n  - {model: m, target: gpu-pool}\n", bad[i].value);
        CHECK(!parse(text), "%s accepted", bad[i].value);
        CHECK(has_error(4, 20, bad[i].msg) && has_error(4, 20, "cost_per_hour"), "%s: %s", bad[i].value, err);
    }
}

int main(void)
{
    test_seed();
    test_seed_file();
    test_positions();
    test_duplicates();
    test_many_errors();
    test_syntax_and_empty();
    test_full_schema_and_aliases();
    test_refcount_version_load();
    test_truncation();
    test_fuzz();
    test_cost_per_hour();
    CHECK_DONE();
}
