/* JSON in Python's json.dumps form. See json.h. */
#include "llm/json.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef sw_sbuf jbuf;

static void put_n(jbuf *b, const char *s, size_t n) { sw_sbuf_put_n(b, s, n); }
static void put(jbuf *b, const char *s) { sw_sbuf_put(b, s); }

/* json.dumps(ensure_ascii=False): the two-character escapes it has, \uXXXX
 * for the other control characters, everything else as is. */
static void put_string(jbuf *b, const char *s)
{
    put(b, "\"");
    size_t run = 0, i = 0;
    for (; s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        put_n(b, s + run, i - run);
        run = i + 1;
        char e[8];
        switch (c) {
        case '"': put(b, "\\\""); break;
        case '\\': put(b, "\\\\"); break;
        case '\n': put(b, "\\n"); break;
        case '\r': put(b, "\\r"); break;
        case '\t': put(b, "\\t"); break;
        case '\b': put(b, "\\b"); break;
        case '\f': put(b, "\\f"); break;
        default: snprintf(e, sizeof e, "\\u%04x", c); put(b, e); break;
        }
    }
    put_n(b, s + run, i - run);
    put(b, "\"");
}

/* Integers as integers; other numbers in the shortest form that reads back
 * exactly, as Python's repr does. */
static void put_number(jbuf *b, double v)
{
    char t[40];
    if (!isfinite(v)) { put(b, v != v ? "NaN" : v > 0 ? "Infinity" : "-Infinity"); return; }
    if (v == floor(v) && fabs(v) < 0x1p53) {
        snprintf(t, sizeof t, "%.0f", v);
    } else {
        for (int p = 1; p <= 17; p++) {
            snprintf(t, sizeof t, "%.*g", p, v);
            if (strtod(t, NULL) == v) break;
        }
    }
    put(b, t);
}

/* A newline and the indentation of the given depth (indent > 0). */
static void put_newline(jbuf *b, int indent, int depth)
{
    put(b, "\n");
    for (int i = 0; i < indent * depth; i++) put(b, " ");
}

/* indent 0: one line, items after ", "; else one item a line, indented,
 * after "," (json.dumps(indent=N)). */
static void put_value(jbuf *b, const cJSON *v, int indent, int depth)
{
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        bool obj = cJSON_IsObject(v);
        put(b, obj ? "{" : "[");
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child) put(b, indent ? "," : ", ");
            if (indent) put_newline(b, indent, depth + 1);
            if (obj) { put_string(b, c->string ? c->string : ""); put(b, ": "); }
            put_value(b, c, indent, depth + 1);
        }
        if (indent && v->child) put_newline(b, indent, depth);
        put(b, obj ? "}" : "]");
    } else if (cJSON_IsString(v)) {
        put_string(b, v->valuestring ? v->valuestring : "");
    } else if (cJSON_IsNumber(v)) {
        put_number(b, v->valuedouble);
    } else if (cJSON_IsBool(v)) {
        put(b, cJSON_IsTrue(v) ? "true" : "false");
    } else {
        put(b, "null");
    }
}

void sw_json_put(sw_sbuf *b, const cJSON *v) { put_value(b, v, 0, 0); }

void sw_json_put_indented(sw_sbuf *b, const cJSON *v, int indent) { put_value(b, v, indent > 0 ? indent : 0, 0); }

char *sw_json_dumps(const cJSON *v)
{
    jbuf b = { 0 };
    put_value(&b, v, 0, 0);
    if (b.oom) { free(b.s); return NULL; }
    return b.s ? b.s : strdup("null");
}
