/* JSON Schema as a byte-level constraint (json_schema.h).
 *
 * Compiling turns each (sub)schema into a node. Value nodes are concrete
 * (object, array, string, number, integer, literal) or a union of others
 * (anyOf, enum, a list of types, "any value"); the root node holds the
 * top-level value. Feeding a byte steps every live stack: the top frame
 * takes the byte, a finished value pops (a number only learns it has ended
 * from the byte after it, which then goes to its parent), and where a
 * value starts at a union, the stack forks into one copy per alternative,
 * the copies that cannot take the byte dying at once. */
#include "llm/json_schema.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/util.h"

enum { K_ROOT, K_OBJECT, K_ARRAY, K_STRING, K_NUMBER, K_INTEGER, K_LITERAL, K_UNION };

typedef struct {
    uint8_t kind;
    uint16_t child;            /* root: the value; array: the items after the prefix */
    uint16_t n_prefix;         /* array: prefixItems, the first items' own schemas */
    uint16_t *prefix;
    int32_t min, max;          /* string length or item count; max -1: none */
    /* object */
    uint16_t n_props;
    uint16_t *prop_node;
    char **prop_key;           /* as it appears between the quotes */
    uint32_t *prop_len;
    uint64_t required;
    int32_t extra;             /* the node of undeclared keys' values; -1: none allowed */
    /* literal: the JSON text (const, enum, true, false, null) */
    char *text;
    uint32_t len;
    /* union */
    uint16_t n_alts;
    uint16_t *alts;
    /* number, integer: minimum / maximum (exclusive: the bound itself is out) */
    bool has_lo, has_hi, lo_excl, hi_excl;
    double lo, hi;
} node;

struct sw_js {
    node *nodes;
    uint32_t n, cap;
};

#define MAX_NODES 8192
#define MAX_ENUM 256
#define MAX_UNION_NEST 8

/* ---- compiling -------------------------------------------------------------- */

typedef struct {
    sw_js *js;
    const cJSON *root;
    char *err;
    size_t errlen;
    char path[512];
    size_t path_len;
    /* $ref targets compiled so far: pointer -> node */
    const cJSON **ref_src;
    uint16_t *ref_node;
    size_t n_refs, cap_refs;
    int any;                   /* the "any value" node, made on first use; -1 */
    int recursion;
} compiler;

static int fail(compiler *c, const char *fmt, const char *what)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, what);
    sw_errf(c->err, c->errlen, "%s at %s", msg, c->path_len ? c->path : "#");
    return -1;
}

static size_t path_push(compiler *c, const char *seg)
{
    size_t old = c->path_len;
    int w = snprintf(c->path + old, sizeof c->path - old, "%s%s", old ? "/" : "#/", seg);
    if (w > 0) c->path_len = old + (size_t)w < sizeof c->path ? old + (size_t)w : sizeof c->path - 1;
    return old;
}

static void path_pop(compiler *c, size_t old)
{
    c->path_len = old;
    c->path[old] = 0;
}

static int new_node(compiler *c, int kind)
{
    sw_js *js = c->js;
    if (js->n >= MAX_NODES) return fail(c, "%s", "schema too large (more than 8192 nodes)");
    if (js->n == js->cap) {
        uint32_t cap = js->cap ? js->cap * 2 : 64;
        node *v = realloc(js->nodes, cap * sizeof *v);
        if (!v) return fail(c, "%s", "out of memory");
        js->nodes = v;
        js->cap = cap;
    }
    node *n = &js->nodes[js->n];
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)kind;
    n->max = -1;
    n->extra = -1;
    return (int)js->n++;
}

static int literal(compiler *c, const char *text)
{
    size_t len = strlen(text);
    if (len > 4096) return fail(c, "%s", "a const or enum value longer than 4096 bytes");
    int id = new_node(c, K_LITERAL);
    if (id < 0) return -1;
    char *t = strdup(text);
    if (!t) return fail(c, "%s", "out of memory");
    c->js->nodes[id].text = t;
    c->js->nodes[id].len = (uint32_t)len;
    return id;
}

/* A literal for a JSON value: its compact text, as cJSON prints it. */
static int literal_of(compiler *c, const cJSON *v)
{
    char *t = cJSON_PrintUnformatted(v);
    if (!t) return fail(c, "%s", "out of memory");
    int id = literal(c, t);
    cJSON_free(t);
    return id;
}

static int union_of(compiler *c, const uint16_t *alts, size_t n)
{
    if (n == 1) return alts[0];
    int id = new_node(c, K_UNION);
    if (id < 0) return -1;
    uint16_t *a = malloc(n * sizeof *a);
    if (!a) return fail(c, "%s", "out of memory");
    memcpy(a, alts, n * sizeof *a);
    c->js->nodes[id].alts = a;
    c->js->nodes[id].n_alts = (uint16_t)n;
    return id;
}

/* Any JSON value: objects with any keys, arrays of anything, strings,
 * numbers, true, false, null. */
static int any_node(compiler *c)
{
    if (c->any >= 0) return c->any;
    int u = new_node(c, K_UNION);
    if (u < 0) return -1;
    c->any = u;
    int obj = new_node(c, K_OBJECT), arr = new_node(c, K_ARRAY), str = new_node(c, K_STRING),
        num = new_node(c, K_NUMBER), t = literal(c, "true"), f = literal(c, "false"), nul = literal(c, "null");
    if (obj < 0 || arr < 0 || str < 0 || num < 0 || t < 0 || f < 0 || nul < 0) return -1;
    c->js->nodes[obj].extra = u;
    c->js->nodes[arr].child = (uint16_t)u;
    uint16_t alts[7] = { (uint16_t)obj, (uint16_t)arr, (uint16_t)str, (uint16_t)num, (uint16_t)t, (uint16_t)f, (uint16_t)nul };
    uint16_t *a = malloc(sizeof alts);
    if (!a) return fail(c, "%s", "out of memory");
    memcpy(a, alts, sizeof alts);
    c->js->nodes[u].alts = a;
    c->js->nodes[u].n_alts = 7;
    return u;
}

static int compile(compiler *c, const cJSON *s);

/* Assertions that a byte-level matcher cannot enforce: refused, not ignored. */
static const char *const unsupported[] = {
    "pattern", "patternProperties", "multipleOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
    "dependencies", "uniqueItems", "contains", "minContains", "maxContains",
    "propertyNames", "minProperties", "maxProperties", "unevaluatedProperties",
    "unevaluatedItems", "additionalItems", "$dynamicRef", "$recursiveRef",
};

static bool get_count(compiler *c, const cJSON *s, const char *key, int32_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return true;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e6 || v->valuedouble != (double)(int32_t)v->valuedouble) {
        fail(c, "'%s' must be a whole number from 0 to 1000000", key);
        return false;
    }
    *out = (int32_t)v->valuedouble;
    return true;
}

static int compile_object(compiler *c, const cJSON *s)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, "%s", "'properties' must be an object");
    if (req && !cJSON_IsArray(req)) return fail(c, "%s", "'required' must be an array of names");
    int n = cJSON_GetArraySize(props);
    if (n > SW_JS_MAX_PROPS) return fail(c, "%s", "more than 64 properties in one object");
    int id = new_node(c, K_OBJECT);
    if (id < 0) return -1;
    uint16_t *pn = calloc((size_t)n + 1, sizeof *pn);
    char **pk = calloc((size_t)n + 1, sizeof *pk);
    uint32_t *pl = calloc((size_t)n + 1, sizeof *pl);
    c->js->nodes[id].prop_node = pn;
    c->js->nodes[id].prop_key = pk;
    c->js->nodes[id].prop_len = pl;
    if (!pn || !pk || !pl) return fail(c, "%s", "out of memory");
    int i = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        /* the key as JSON writes it between its quotes */
        cJSON *name = cJSON_CreateString(p->string);
        char *q = name ? cJSON_PrintUnformatted(name) : NULL;
        cJSON_Delete(name);
        if (!q) return fail(c, "%s", "out of memory");
        size_t ql = strlen(q);
        memmove(q, q + 1, ql - 2);
        q[ql - 2] = 0;
        c->js->nodes[id].prop_key[i] = q;
        c->js->nodes[id].prop_len[i] = (uint32_t)(ql - 2);
        c->js->nodes[id].n_props = (uint16_t)(i + 1);
        size_t old = path_push(c, "properties");
        size_t old2 = path_push(c, p->string);
        int v = compile(c, p);
        path_pop(c, old2);
        path_pop(c, old);
        if (v < 0) return -1;
        c->js->nodes[id].prop_node[i++] = (uint16_t)v;
    }
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        if (!cJSON_IsString(r)) return fail(c, "%s", "'required' must be an array of names");
        int k = 0;
        while (k < n && strcmp(cJSON_GetArrayItem(props, k)->string, r->valuestring)) k++;
        if (k == n) return fail(c, "required property '%s' is not among the properties", r->valuestring);
        c->js->nodes[id].required |= 1ull << k;
    }
    /* Undeclared keys: JSON Schema allows them unless told otherwise, but
     * a model let loose on them invents keys; structured-output APIs
     * (OpenAI's strict mode) close declared objects. So: an object with
     * properties takes only those unless additionalProperties says more,
     * and one without takes any keys unless it says false. */
    int ex = -1;
    if (cJSON_IsTrue(extra) || (!extra && n == 0)) ex = any_node(c);
    else if (cJSON_IsObject(extra)) {
        size_t old = path_push(c, "additionalProperties");
        ex = compile(c, extra);
        path_pop(c, old);
    } else if (extra && !cJSON_IsFalse(extra)) return fail(c, "%s", "'additionalProperties' must be a boolean or a schema");
    if (extra && !cJSON_IsFalse(extra) && ex < 0) return -1;
    if (!extra && n == 0 && ex < 0) return -1;
    c->js->nodes[id].extra = ex;
    return id;
}

static int compile_array(compiler *c, const cJSON *s)
{
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    int32_t mn = 0, mx = -1;
    if (!get_count(c, s, "minItems", &mn) || !get_count(c, s, "maxItems", &mx)) return -1;
    if (prefix && (!cJSON_IsArray(prefix) || cJSON_GetArraySize(prefix) > MAX_ENUM))
        return fail(c, "%s", "'prefixItems' must be an array of up to 256 schemas");
    int n_prefix = cJSON_GetArraySize(prefix);
    /* items false: nothing after the prefix (JSON Schema's closed tuple) */
    if (cJSON_IsFalse(items) && (mx < 0 || mx > n_prefix)) mx = n_prefix;
    if (mx >= 0 && mx < mn) return fail(c, "%s", "maxItems is below minItems (or items is false)");
    int child;
    if (!items || cJSON_IsTrue(items) || cJSON_IsFalse(items)) child = any_node(c);
    else {
        size_t old = path_push(c, "items");
        child = compile(c, items);
        path_pop(c, old);
    }
    if (child < 0) return -1;
    uint16_t first[MAX_ENUM];
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, prefix) {
        char seg[32];
        snprintf(seg, sizeof seg, "prefixItems/%d", i);
        size_t old = path_push(c, seg);
        int v = compile(c, it);
        path_pop(c, old);
        if (v < 0) return -1;
        first[i++] = (uint16_t)v;
    }
    int id = new_node(c, K_ARRAY);
    if (id < 0) return -1;
    if (i && !(c->js->nodes[id].prefix = malloc((size_t)i * sizeof *first))) return fail(c, "%s", "out of memory");
    if (i) memcpy(c->js->nodes[id].prefix, first, (size_t)i * sizeof *first);
    node *a = &c->js->nodes[id];
    a->n_prefix = (uint16_t)i;
    a->child = (uint16_t)child;
    a->min = mn;
    a->max = mx;
    return id;
}

/* A bound: minimum or exclusiveMinimum (2020-12: a number), at most one of
 * the two. Bounds beyond 1e15 are refused: the matcher reads at most 16
 * digits, and doubles hold integers exactly only up to 2^53. */
static bool get_bound(compiler *c, const cJSON *s, const char *key, const char *excl_key, bool *has, double *v,
                      bool *excl)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(s, key), *b = cJSON_GetObjectItemCaseSensitive(s, excl_key);
    if (a && b) { fail(c, "'%s' together with its exclusive form", key); return false; }
    const cJSON *x = a ? a : b;
    if (!x) return true;
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= -1e15 && x->valuedouble <= 1e15)) {
        fail(c, "'%s' must be a number from -1e15 to 1e15", a ? key : excl_key);
        return false;
    }
    *has = true;
    *v = x->valuedouble;
    *excl = b != NULL;
    return true;
}

static int compile_number(compiler *c, const cJSON *s, bool integer)
{
    int id = new_node(c, integer ? K_INTEGER : K_NUMBER);
    if (id < 0) return -1;
    node *n = &c->js->nodes[id];
    if (!get_bound(c, s, "minimum", "exclusiveMinimum", &n->has_lo, &n->lo, &n->lo_excl) ||
        !get_bound(c, s, "maximum", "exclusiveMaximum", &n->has_hi, &n->hi, &n->hi_excl))
        return -1;
    if (n->has_lo && n->has_hi && (n->lo > n->hi || (n->lo == n->hi && (n->lo_excl || n->hi_excl))))
        return fail(c, "%s", "the bounds admit no number");
    if (integer && n->has_lo && n->has_hi) {   /* some integer must lie between */
        double first = n->lo_excl ? floor(n->lo) + 1 : ceil(n->lo);
        if (first > n->hi || (n->hi_excl && first >= n->hi)) return fail(c, "%s", "the bounds admit no integer");
    }
    return id;
}

/* One type name with the keywords that go with it. */
static int compile_type(compiler *c, const cJSON *s, const char *type)
{
    if (!strcmp(type, "object")) return compile_object(c, s);
    if (!strcmp(type, "array")) return compile_array(c, s);
    if (!strcmp(type, "boolean")) {
        uint16_t alts[2];
        int t = literal(c, "true"), f = literal(c, "false");
        if (t < 0 || f < 0) return -1;
        alts[0] = (uint16_t)t, alts[1] = (uint16_t)f;
        return union_of(c, alts, 2);
    }
    if (!strcmp(type, "null")) return literal(c, "null");
    if (!strcmp(type, "number") || !strcmp(type, "integer")) return compile_number(c, s, !strcmp(type, "integer"));
    if (!strcmp(type, "string")) {
        int32_t mn = 0, mx = -1;
        if (!get_count(c, s, "minLength", &mn) || !get_count(c, s, "maxLength", &mx)) return -1;
        if (mx >= 0 && mx < mn) return fail(c, "%s", "maxLength is below minLength");
        int id = new_node(c, K_STRING);
        if (id < 0) return -1;
        c->js->nodes[id].min = mn;
        c->js->nodes[id].max = mx;
        return id;
    }
    return fail(c, "unknown type '%s'", type);
}

/* The target of a local $ref, compiled once (so recursion closes on it). */
static int compile_ref(compiler *c, const char *ref)
{
    const cJSON *t = NULL;
    if (!strcmp(ref, "#")) t = c->root;
    else if (!strncmp(ref, "#/$defs/", 8))
        t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->root, "$defs"), ref + 8);
    else if (!strncmp(ref, "#/definitions/", 14))
        t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c->root, "definitions"), ref + 14);
    if (!t) return fail(c, "$ref '%s' does not name #, #/$defs/NAME or #/definitions/NAME", ref);
    for (size_t i = 0; i < c->n_refs; i++)
        if (c->ref_src[i] == t) return c->ref_node[i];
    /* A union of one, filled in after: a reference to itself finds it. */
    int id = new_node(c, K_UNION);
    if (id < 0) return -1;
    if (c->n_refs == c->cap_refs) {
        size_t cap = c->cap_refs ? c->cap_refs * 2 : 16;
        const cJSON **s = realloc(c->ref_src, cap * sizeof *s);
        if (s) c->ref_src = s;
        uint16_t *nn = realloc(c->ref_node, cap * sizeof *nn);
        if (nn) c->ref_node = nn;
        if (!s || !nn) return fail(c, "%s", "out of memory");
        c->cap_refs = cap;
    }
    c->ref_src[c->n_refs] = t;
    c->ref_node[c->n_refs++] = (uint16_t)id;
    size_t old = path_push(c, strlen(ref) > 2 ? ref + 2 : "$ref");
    int body = compile(c, t);
    path_pop(c, old);
    if (body < 0) return -1;
    uint16_t *a = malloc(sizeof *a);
    if (!a) return fail(c, "%s", "out of memory");
    a[0] = (uint16_t)body;
    c->js->nodes[id].alts = a;
    c->js->nodes[id].n_alts = 1;
    return id;
}

static int compile_alts(compiler *c, const cJSON *list, const char *key)
{
    int n = cJSON_GetArraySize(list);
    if (!cJSON_IsArray(list) || n == 0) return fail(c, "'%s' must be a non-empty array of schemas", key);
    if (n > MAX_ENUM) return fail(c, "'%s' has more than 256 entries", key);
    uint16_t alts[MAX_ENUM];
    int i = 0;
    const cJSON *a;
    size_t old = path_push(c, key);
    cJSON_ArrayForEach(a, list) {
        char idx[16];
        snprintf(idx, sizeof idx, "%d", i);
        size_t old2 = path_push(c, idx);
        int v = compile(c, a);
        path_pop(c, old2);
        if (v < 0) { path_pop(c, old); return -1; }
        alts[i++] = (uint16_t)v;
    }
    path_pop(c, old);
    return union_of(c, alts, (size_t)i);
}

static int compile_body(compiler *c, const cJSON *s)
{
    if (cJSON_IsTrue(s)) return any_node(c);
    if (cJSON_IsFalse(s)) return fail(c, "%s", "the schema false admits no value");
    if (!cJSON_IsObject(s)) return fail(c, "%s", "a schema must be an object or true");
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
        if (cJSON_GetObjectItemCaseSensitive(s, unsupported[i]))
            return fail(c, "'%s' is not supported in structured outputs", unsupported[i]);
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) return fail(c, "%s", "'$ref' must be a string");
        return compile_ref(c, ref->valuestring);
    }
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    if (all) {
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1)
            return fail(c, "%s", "'allOf' is supported with one schema only");
        size_t old = path_push(c, "allOf/0");
        int v = compile(c, cJSON_GetArrayItem(all, 0));
        path_pop(c, old);
        return v;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const char *any_key = "anyOf";
    if (!any) any = cJSON_GetObjectItemCaseSensitive(s, any_key = "oneOf");
    if (any) return compile_alts(c, any, any_key);
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (cst) return literal_of(c, cst);
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (en) {
        int n = cJSON_GetArraySize(en);
        if (!cJSON_IsArray(en) || n == 0) return fail(c, "%s", "'enum' must be a non-empty array");
        if (n > MAX_ENUM) return fail(c, "%s", "'enum' has more than 256 values");
        uint16_t alts[MAX_ENUM];
        int i = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, en) {
            int id = literal_of(c, v);
            if (id < 0) return -1;
            alts[i++] = (uint16_t)id;
        }
        return union_of(c, alts, (size_t)i);
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(type)) return compile_type(c, s, type->valuestring);
    if (cJSON_IsArray(type)) {
        int n = cJSON_GetArraySize(type);
        if (n == 0 || n > 7) return fail(c, "%s", "'type' must list one to seven type names");
        uint16_t alts[7];
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, type) {
            if (!cJSON_IsString(t)) return fail(c, "%s", "'type' must list type names");
            int id = compile_type(c, s, t->valuestring);
            if (id < 0) return -1;
            alts[i++] = (uint16_t)id;
        }
        return union_of(c, alts, (size_t)i);
    }
    if (type) return fail(c, "%s", "'type' must be a name or a list of names");
    if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
        cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
        return compile_object(c, s);
    if (cJSON_GetObjectItemCaseSensitive(s, "items")) return compile_array(c, s);
    static const char *const bounds[] = { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum" };
    for (int k = 0; k < 4; k++)   /* a bound on a value of any type: only numbers would keep it */
        if (cJSON_GetObjectItemCaseSensitive(s, bounds[k]))
            return fail(c, "'%s' needs \"type\": \"number\" or \"integer\" beside it", bounds[k]);
    return any_node(c);
}

static int compile(compiler *c, const cJSON *s)
{
    /* cJSON parses nesting deeper than its own limit as an error, but a
     * caller may build one by hand: bound the recursion here too. */
    if (++c->recursion > 64) { c->recursion--; return fail(c, "%s", "schema nested more than 64 deep"); }
    int v = compile_body(c, s);
    c->recursion--;
    return v;
}

static void expand(const sw_js *js, uint16_t id, uint16_t *out, int *n, int cap, int nest);

sw_js *sw_js_compile(const cJSON *schema, char *err, size_t errlen)
{
    sw_js *js = calloc(1, sizeof *js);
    if (!js) { sw_errf(err, errlen, "out of memory"); return NULL; }
    compiler c = { .js = js, .root = schema, .err = err, .errlen = errlen, .any = -1 };
    int root = new_node(&c, K_ROOT);
    int v = root < 0 ? -1 : compile(&c, schema);
    free(c.ref_src);
    free(c.ref_node);
    if (v < 0) { sw_js_free(js); return NULL; }
    js->nodes[root].child = (uint16_t)v;
    /* A union with no concrete value under it ("$defs": {"a": {"$ref":
     * "#/$defs/a"}}) could never start: refused, not a dead end later. */
    for (uint32_t i = 0; i < js->n; i++) {
        uint16_t alts[1];
        int n = 0;
        if (js->nodes[i].kind == K_UNION) expand(js, (uint16_t)i, alts, &n, 1, 0);
        if (js->nodes[i].kind == K_UNION && n == 0) {
            sw_errf(err, errlen, "a $ref leads only to itself, never to a value");
            sw_js_free(js);
            return NULL;
        }
    }
    return js;
}

void sw_js_free(sw_js *js)
{
    if (!js) return;
    for (uint32_t i = 0; i < js->n; i++) {
        node *n = &js->nodes[i];
        for (uint16_t k = 0; k < n->n_props; k++) free(n->prop_key[k]);
        free(n->prop_key);
        free(n->prop_node);
        free(n->prop_len);
        free(n->text);
        free(n->alts);
        free(n->prefix);
    }
    free(js->nodes);
    free(js);
}

bool sw_js_check(const cJSON *schema, char *err, size_t errlen)
{
    sw_js *js = sw_js_compile(schema, err, errlen);
    sw_js_free(js);
    return js != NULL;
}

/* ---- matching ---------------------------------------------------------------- */

/* Phases of each kind's frame. */
enum { R_VALUE, R_DONE };
enum { O_OPEN, O_FIRST, O_KEY, O_COLON, O_VALUE, O_AFTER, O_NEXT };
enum { A_OPEN, A_FIRST, A_AFTER, A_NEXT };
enum { S_OPEN, S_IN };
enum { N_START, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static bool is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static void stack_copy(sw_js_stack *d, const sw_js_stack *s)
{
    d->depth = s->depth;
    memcpy(d->f, s->f, s->depth * sizeof *s->f);
}

void sw_js_copy(sw_js_state *dst, const sw_js_state *src)
{
    dst->n = src->n;
    for (int i = 0; i < src->n; i++) stack_copy(&dst->s[i], &src->s[i]);
}

static bool push(sw_js_stack *t, uint16_t node)
{
    if (t->depth >= SW_JS_DEPTH) return false;
    sw_js_frame *f = &t->f[t->depth++];
    memset(f, 0, sizeof *f);   /* whole frames, so equal stacks compare equal */
    f->node = node;
    return true;
}

/* Whitespace at a structural position. A model whose logits are flat
 * there would otherwise fill every gap up to any fixed limit (whitespace
 * tokens outnumber the structural ones), so a run is what compact and
 * pretty-printed JSON write: one space, or a line break and an indent of
 * up to four columns a nesting level. ws counts the run; its top bit says
 * the run broke the line. */
static bool take_ws(sw_js_frame *f, int depth, unsigned char c)
{
    bool broke = f->ws & 0x80, after_cr = f->ws & 0x40;
    int n = f->ws & 0x3F;
    if (c == '\r' || c == '\n') {   /* "\n" or "\r\n", at the start of the run */
        if (n > 0 && !(c == '\n' && after_cr)) return false;
        f->ws = (uint8_t)(0x80 | (c == '\r' ? 0x40 : 0) | (n + 1));
        return true;
    }
    if (after_cr || (broke ? n > 2 + 4 * depth || n >= SW_JS_MAX_WS : n > 0)) return false;
    f->ws = (uint8_t)((broke ? 0x80 : 0) | (n + 1));
    return true;
}

/* A string's byte after its opening quote (keys use it too). Returns 1 if
 * taken, 2 at the closing quote, 0 if it cannot come. Counts code points
 * where they start (a lead byte, a backslash), so that a length limit
 * refuses the first byte of one too many, never leaving a half-written
 * escape that nothing may finish. */
static int string_byte(sw_js_frame *f, unsigned char c)
{
    if (f->esc == 1) {
        if (c == 'u') { f->esc = 2; return 1; }
        if (!c || !strchr("\"\\/bfnrt", c)) return 0;
        f->esc = 0;
        return 1;
    }
    if (f->esc >= 2) {
        bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        if (!hex) return 0;
        if (++f->esc == 6) f->esc = 0;
        return 1;
    }
    if (f->utf8) {
        if ((c & 0xC0) != 0x80) return 0;
        f->utf8--;
        return 1;
    }
    if (c == '"') return 2;
    if (c < 0x20) return 0;
    if (c == '\\') f->esc = 1;
    else if (c >= 0x80) {
        if (c >= 0xC2 && c <= 0xDF) f->utf8 = 1;
        else if (c >= 0xE0 && c <= 0xEF) f->utf8 = 2;
        else if (c >= 0xF0 && c <= 0xF4) f->utf8 = 3;
        else return 0;
    }
    f->count++;
    return 1;
}

/* A number frame keeps what its digits say, for the bounds: esc the sign,
 * seen the integer part, cand the fraction's digits as an integer, utf8
 * their count. */
static double pow10i(int k)
{
    double p = 1;
    while (k-- > 0) p *= 10;
    return p;
}

/* Whether some value in the reachable magnitudes [a, b] (b_open: b itself
 * is not reachable), with the frame's sign, meets the node's bounds. */
static bool meets(const node *n, bool neg, double a, double b, bool b_open)
{
    /* as values: [a, b] or, negative, [-b, -a]; open at the end b came from */
    double lo = neg ? -b : a, hi = neg ? -a : b;
    bool lo_open = neg && b_open, hi_open = !neg && b_open;
    if (n->has_lo && (hi < n->lo || (hi == n->lo && (hi_open || n->lo_excl)))) return false;
    if (n->has_hi && (lo > n->hi || (lo == n->hi && (lo_open || n->hi_excl)))) return false;
    return true;
}

/* Whether the digits so far can still become a number within the bounds
 * (ended: the number ends here, so it must be within them itself). */
static bool number_feasible(const node *n, const sw_js_frame *f, bool ended)
{
    if (!n->has_lo && !n->has_hi) return true;
    bool neg = f->esc, integer = n->kind == K_INTEGER;
    double I = (double)f->seen, F = (double)f->cand / pow10i(f->utf8);
    switch (f->phase) {
    case N_START:
    case N_MINUS:   /* any magnitude yet */
        return meets(n, neg, 0, INFINITY, false);
    case N_ZERO:
    case N_INT: {
        if (meets(n, neg, I, I, false)) return true;   /* it may end here */
        if (ended) return false;
        if (!integer && meets(n, neg, I, I + 1, true)) return true;   /* a fraction to come */
        if (f->phase == N_ZERO) return false;
        for (int j = 1; (int)f->count + j <= SW_JS_MAX_DIGITS; j++) {   /* more digits to come */
            double p = pow10i(j);
            if (meets(n, neg, I * p, (I + 1) * p - (integer ? 1 : 0), !integer)) return true;
        }
        return false;
    }
    case N_DOT:
        return !ended && meets(n, neg, I, I + 1, true);
    case N_FRAC: {
        double v = I + F;
        if (meets(n, neg, v, v, false)) return true;
        return !ended && f->utf8 < SW_JS_MAX_DIGITS && meets(n, neg, v, v + 1 / pow10i(f->utf8), true);
    }
    }
    return false;   /* exponents: a bounded number has none */
}

/* A number's byte: 1 taken, 0 cannot come, -1 the number ended before it. */
static int number_byte(const node *n, sw_js_frame *f, unsigned char c)
{
    bool integer = n->kind == K_INTEGER, bounded = n->has_lo || n->has_hi;
    bool digit = c >= '0' && c <= '9';
    bool accepting = f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC || f->phase == N_EXP;
    int r = 0;
    switch (f->phase) {
    case N_START:
        if (c == '-') { f->phase = N_MINUS; f->esc = 1; r = 1; break; }
        /* fall through */
    case N_MINUS:
        if (c == '0') { f->phase = N_ZERO; r = 1; break; }
        if (digit) { f->phase = N_INT; f->count = 1; f->seen = (uint64_t)(c - '0'); r = 1; }
        break;
    case N_INT:
        if (digit) {
            r = ++f->count <= SW_JS_MAX_DIGITS;
            f->seen = f->seen * 10 + (uint64_t)(c - '0');
            break;
        }
        /* fall through */
    case N_ZERO:
        if (!integer && c == '.') { f->phase = N_DOT; f->count = 0; r = 1; }
        else if (!integer && !bounded && (c == 'e' || c == 'E')) { f->phase = N_E; f->count = 0; r = 1; }
        else r = digit ? 0 : accepting ? -1 : 0;   /* "01", or a digit past the limit */
        break;
    case N_DOT:
        if (digit) { f->phase = N_FRAC; f->count = 1; f->cand = (uint64_t)(c - '0'); f->utf8 = 1; r = 1; }
        break;
    case N_FRAC:
        if (digit) {
            r = ++f->count <= SW_JS_MAX_DIGITS;
            f->cand = f->cand * 10 + (uint64_t)(c - '0');
            f->utf8++;
        } else if (!bounded && (c == 'e' || c == 'E')) { f->phase = N_E; f->count = 0; r = 1; }
        else r = -1;
        break;
    case N_E:
        if (c == '+' || c == '-') { f->phase = N_ESIGN; r = 1; break; }
        /* fall through */
    case N_ESIGN:
        if (digit) { f->phase = N_EXP; f->count = 1; r = 1; }
        break;
    case N_EXP:
        r = digit ? ++f->count <= 4 : -1;
        break;
    }
    if (r != 0 && !number_feasible(n, f, r < 0)) return 0;
    return r;
}

static bool start_value(const sw_js *js, sw_js_state *st, int i, uint16_t node, unsigned char c);

/* The declared keys still open to a key: those not written yet. */
static uint64_t open_keys(const node *n, const sw_js_frame *f)
{
    uint64_t all = n->n_props == 64 ? ~0ull : (1ull << n->n_props) - 1;
    return all & ~f->seen;
}

/* A byte inside an object key: checked as string text, and against the
 * declared keys it may still spell. cand holds every declared key while
 * undeclared keys are allowed too (so that one spelling a key already
 * written is caught as a duplicate), else only those not written yet. */
static bool key_byte(const node *n, sw_js_frame *f, unsigned char c)
{
    bool was_escape = f->esc != 0;
    uint32_t at = f->count;   /* the key's bytes so far */
    sw_js_frame probe = *f;
    int r = string_byte(&probe, c);
    if (r == 0) return false;
    f->esc = probe.esc;
    f->utf8 = probe.utf8;
    if (r == 2 && !was_escape) {   /* the key ends */
        for (uint16_t k = 0; k < n->n_props; k++)
            if ((f->cand >> k & 1) && n->prop_len[k] == at) {
                if (f->seen >> k & 1) return false;   /* a duplicate */
                f->seen |= 1ull << k;
                f->value = n->prop_node[k];
                f->phase = O_COLON;
                return true;
            }
        if (n->extra < 0) return false;
        f->value = (uint16_t)n->extra;
        f->phase = O_COLON;
        return true;
    }
    uint64_t keep = 0;
    for (uint16_t k = 0; k < n->n_props; k++)
        if ((f->cand >> k & 1) && at < n->prop_len[k] && (unsigned char)n->prop_key[k][at] == c) keep |= 1ull << k;
    f->cand = keep;
    f->count = at + 1;
    return (keep & ~f->seen) != 0 || n->extra >= 0;
}

/* A string's byte c, its frame f on top of stack t. */
static bool step_string(const node *n, sw_js_stack *t, sw_js_frame *f, unsigned char c)
{
    if (f->phase == S_OPEN) {
        f->phase = S_IN;
        return c == '"';
    }
    int r = string_byte(f, c);
    if (r == 0) return false;
    if (n->max >= 0 && f->count > (uint32_t)n->max) return false;
    if (r == 2) {
        if (f->count < (uint32_t)n->min) return false;
        t->depth--;
    }
    return true;
}

/* An array's byte c (ws: c is white space), its frame f on top of stack
 * i of st; an item's first byte starts its value. */
static bool step_array(const sw_js *js, sw_js_state *st, int i, const node *n, sw_js_frame *f, bool ws,
                       unsigned char c)
{
    sw_js_stack *t = &st->s[i];
    switch (f->phase) {
    case A_OPEN:
        f->phase = A_FIRST;
        return c == '[';
    case A_FIRST:
        if (ws) return take_ws(f, t->depth, c);
        if (c == ']') {
            if (n->min > 0) return false;
            t->depth--;
            return true;
        }
        /* fall through */
    case A_NEXT:
        if (ws) return take_ws(f, t->depth, c);
        if (n->max >= 0 && f->count >= (uint32_t)n->max) return false;
        f->phase = A_AFTER;
        uint32_t k = f->count++;
        return start_value(js, st, i, k < n->n_prefix ? n->prefix[k] : n->child, c);
    case A_AFTER:
        if (ws) return take_ws(f, t->depth, c);
        if (c == ',') {
            f->phase = A_NEXT;
            return n->max < 0 || f->count < (uint32_t)n->max;
        }
        if (c != ']' || f->count < (uint32_t)n->min) return false;
        t->depth--;
        return true;
    }
    return false;
}

/* An object's byte c (ws: c is white space), its frame f on top of stack
 * i of st; a member's first byte after the colon starts its value. */
static bool step_object(const sw_js *js, sw_js_state *st, int i, const node *n, sw_js_frame *f, bool ws,
                        unsigned char c)
{
    sw_js_stack *t = &st->s[i];
    switch (f->phase) {
    case O_OPEN:
        f->phase = O_FIRST;
        return c == '{';
    case O_FIRST:
    case O_AFTER:
        if (ws) return take_ws(f, t->depth, c);
        if (c == '}') {
            if ((f->seen & n->required) != n->required) return false;
            t->depth--;
            return true;
        }
        if (f->phase == O_AFTER) {
            if (c != ',') return false;
            f->phase = O_NEXT;
            return open_keys(n, f) != 0 || n->extra >= 0;
        }
        /* fall through */
    case O_NEXT:
        if (ws) return take_ws(f, t->depth, c);
        if (c != '"') return false;
        f->cand = n->extra >= 0 ? open_keys(n, f) | f->seen : open_keys(n, f);
        if (f->cand == 0 && n->extra < 0) return false;
        f->phase = O_KEY;
        f->count = 0;
        f->esc = f->utf8 = 0;
        return true;
    case O_KEY:
        return key_byte(n, f, c);
    case O_COLON:
        if (ws) return take_ws(f, t->depth, c);
        f->phase = O_VALUE;
        return c == ':';
    case O_VALUE:
        if (ws) return take_ws(f, t->depth, c);
        f->phase = O_AFTER;
        return start_value(js, st, i, f->value, c);
    }
    return false;
}

/* Steps stack i of st with byte c. False: the stack dies. A value that
 * starts at a union forks copies onto the end of st. */
static bool step(const sw_js *js, sw_js_state *st, int i, unsigned char c)
{
    sw_js_stack *t = &st->s[i];
    for (;;) {
        if (t->depth == 0) return false;
        sw_js_frame *f = &t->f[t->depth - 1];
        const node *n = &js->nodes[f->node];
        bool ws = is_ws(c);
        if (!ws) f->ws = 0;
        switch (n->kind) {
        case K_ROOT:
            if (f->phase == R_DONE) return false;
            if (ws) return take_ws(f, t->depth, c);
            f->phase = R_DONE;
            return start_value(js, st, i, n->child, c);
        case K_LITERAL:
            if (f->count >= n->len || (unsigned char)n->text[f->count] != c) return false;
            if (++f->count == n->len) t->depth--;
            return true;
        case K_NUMBER:
        case K_INTEGER: {
            int r = number_byte(n, f, c);
            if (r >= 0) return r == 1;
            t->depth--;   /* the number ended; its parent takes the byte */
            continue;
        }
        case K_STRING:
            return step_string(n, t, f, c);
        case K_ARRAY:
            return step_array(js, st, i, n, f, ws, c);
        case K_OBJECT:
            return step_object(js, st, i, n, f, ws, c);
        case K_UNION:
            return false;   /* never on a stack: start_value expands it */
        }
        return false;
    }
}

/* The concrete nodes a value of `node` may be. */
static void expand(const sw_js *js, uint16_t id, uint16_t *out, int *n, int cap, int nest)
{
    const node *v = &js->nodes[id];
    if (v->kind != K_UNION) {
        for (int k = 0; k < *n; k++)
            if (out[k] == id) return;
        if (*n < cap) out[(*n)++] = id;
        return;
    }
    if (nest >= MAX_UNION_NEST) return;
    for (uint16_t k = 0; k < v->n_alts; k++) expand(js, v->alts[k], out, n, cap, nest + 1);
}

/* A value of `node` starts with byte c on stack i (whose top frame has
 * already moved past it): one copy of the stack per alternative. */
static bool start_value(const sw_js *js, sw_js_state *st, int i, uint16_t node, unsigned char c)
{
    uint16_t alts[MAX_ENUM];
    int n = 0;
    expand(js, node, alts, &n, MAX_ENUM, 0);
    sw_js_stack orig;
    stack_copy(&orig, &st->s[i]);
    bool taken = false;
    for (int k = 0; k < n; k++) {
        int slot = taken ? st->n : i;
        if (slot >= SW_JS_ALTS) break;   /* more readings than kept: the rest are dropped */
        sw_js_stack *t = &st->s[slot];
        if (slot != i || k > 0) stack_copy(t, &orig);
        if (!push(t, alts[k]) || !step(js, st, slot, c)) continue;
        if (taken) st->n++;
        taken = true;
    }
    return taken;
}

static bool stack_equal(const sw_js_stack *a, const sw_js_stack *b)
{
    return a->depth == b->depth && !memcmp(a->f, b->f, a->depth * sizeof *a->f);
}

static bool feed_byte(const sw_js *js, sw_js_state *st, unsigned char c)
{
    int n0 = st->n;
    bool alive[SW_JS_ALTS] = {0};
    for (int i = 0; i < n0; i++) alive[i] = step(js, st, i, c);
    for (int i = n0; i < st->n; i++) alive[i] = true;   /* forks took c already */
    int w = 0;
    for (int i = 0; i < st->n; i++) {
        if (!alive[i]) continue;
        bool dup = false;
        for (int k = 0; k < w && !dup; k++) dup = stack_equal(&st->s[k], &st->s[i]);
        if (dup) continue;
        if (w != i) stack_copy(&st->s[w], &st->s[i]);
        w++;
    }
    st->n = (uint8_t)w;
    return w > 0;
}

void sw_js_start(const sw_js *js, sw_js_state *st)
{
    (void)js;
    st->n = 1;
    st->s[0].depth = 0;
    push(&st->s[0], 0);
}

bool sw_js_feed(const sw_js *js, sw_js_state *st, const char *s, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (!feed_byte(js, st, (unsigned char)s[k])) return false;
    return true;
}

bool sw_js_accepts(const sw_js *js, const sw_js_state *st, const char *s, size_t n)
{
    sw_js_state tmp;
    sw_js_copy(&tmp, st);
    return sw_js_feed(js, &tmp, s, n);
}

/* A stack whose root value is written, or whose only open value is a
 * top-level number that may end here. */
static bool stack_complete(const sw_js *js, const sw_js_stack *t)
{
    if (t->depth == 0 || t->f[0].phase != R_DONE) return false;
    if (t->depth == 1) return true;
    if (t->depth != 2) return false;
    const sw_js_frame *f = &t->f[1];
    const node *n = &js->nodes[f->node];
    return (n->kind == K_NUMBER || n->kind == K_INTEGER) &&
           (f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC || f->phase == N_EXP) &&
           number_feasible(n, f, true);
}

bool sw_js_complete(const sw_js *js, const sw_js_state *st)
{
    for (int i = 0; i < st->n; i++)
        if (stack_complete(js, &st->s[i])) return true;
    return false;
}

bool sw_js_final(const sw_js *js, const sw_js_state *st)
{
    if (st->n == 0) return false;
    for (int i = 0; i < st->n; i++)
        if (st->s[i].depth != 1 || st->s[i].f[0].phase != R_DONE) return false;
    return true;
}
