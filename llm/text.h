/* Text checks shared by the gateway (JSON input), the wire protocol (frames
 * from peers) and the tokenizer. Header-only on purpose: libsw_proto uses
 * them and programs that link only libsw_sdk + libsw_proto (sdk/examples)
 * must not need libsw_llm. */
#ifndef SW_TEXT_H
#define SW_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "llm/limits.h"

/* Length of the UTF-8 sequence lead byte b starts: 1 (ASCII), 2..4, or 0 if
 * b cannot start one (a continuation byte, C0/C1, F5..FF). */
static inline int sw_utf8_seq_len(uint8_t b)
{
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

/* Whether x may be byte `pos` (1..3) of a sequence led by `lead`. The second
 * byte's range is what excludes overlong forms (after E0, F0), surrogates
 * (after ED) and code points past U+10FFFF (after F4). */
static inline bool sw_utf8_cont_ok(uint8_t lead, int pos, uint8_t x)
{
    uint8_t lo = 0x80, hi = 0xBF;
    if (pos == 1) {
        if (lead == 0xE0) lo = 0xA0;
        else if (lead == 0xED) hi = 0x9F;
        else if (lead == 0xF0) lo = 0x90;
        else if (lead == 0xF4) hi = 0x8F;
    }
    return x >= lo && x <= hi;
}

/* Length (1..4) of the well-formed UTF-8 sequence at s[0..n), with its code
 * point in *cp; 0 if it is ill-formed or truncated. */
static inline int sw_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
    if (n == 0) return 0;
    int len = sw_utf8_seq_len(s[0]);
    if (len == 0 || (size_t)len > n) return 0;
    uint32_t c = len == 1 ? s[0] : s[0] & (0x7Fu >> len);
    for (int k = 1; k < len; k++) {
        if (!sw_utf8_cont_ok(s[0], k, s[k])) return 0;
        c = (c << 6) | (s[k] & 0x3F);
    }
    *cp = c;
    return len;
}

/* Writes code point cp (at most 0x10FFFF) as UTF-8 to out (room for 4
 * bytes); returns its length. */
static inline int sw_utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F)); return 4;
}

/* Whether the NUL-terminated s is strict UTF-8 throughout. */
static inline bool sw_utf8_valid(const char *s)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t n = strlen(s);
    while (n) {
        uint32_t cp;
        int k = sw_utf8_decode(p, n, &cp);
        if (k == 0) return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

/* Blank, as JSON and the chat formats take it: space, tab, CR, LF. */
static inline bool sw_is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Length of the leading run of printable ASCII without spaces (0x21..0x7E):
 * the bytes ids may hold on the wire (request, worker, pool, model names),
 * since they end up in logs, metric labels and HTTP headers. */
static inline size_t sw_id_span(const char *s)
{
    size_t i = 0;
    while ((unsigned char)s[i] > 0x20 && (unsigned char)s[i] <= 0x7E) i++;
    return i;
}

/* Whether s is an id: 1..maxlen bytes, all in that set. */
static inline bool sw_id_valid(const char *s, size_t maxlen)
{
    size_t n = strlen(s);
    return n > 0 && n <= maxlen && sw_id_span(s) == n;
}

/* Whether s is a function name a model may call: OpenAI's rule, 1 to 64 of
 * a-z, A-Z, 0-9, underscore and dash (and dots, which namespaced tools use);
 * SW_MAX_TOOL_NAME is in llm/limits.h. */
static inline bool sw_tool_name_valid(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.'))
            return false;
    }
    return n > 0 && n <= SW_MAX_TOOL_NAME;
}

#endif
