/* WordPiece (see wordpiece.h): the text's code points are normalized into
 * one array, then cut into words, and each word into pieces. */
#include "llm/wordpiece.h"

#include <stdlib.h>
#include <string.h>
#include "llm/text.h"
#include "llm/unicode.h"

typedef struct { uint32_t *v; size_t n, cap; bool oom; } cpvec;

static void cp_push(cpvec *a, uint32_t c)
{
    if (a->oom) return;
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 256;
        uint32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) { a->oom = true; return; }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = c;
}

/* cp without its accents, in lower case: its canonical decomposition with
 * the nonspacing marks dropped, each part lowered. */
static void put_uncased(cpvec *out, uint32_t cp)
{
    uint32_t d[SW_UC_SEQ_MAX], l[SW_UC_SEQ_MAX];
    int n = sw_uc_nfd(cp, d);
    if (n == 0) { d[0] = cp; n = 1; }
    for (int i = 0; i < n; i++) {
        if (sw_uc_class(d[i]) == SW_UC_MARK) continue;
        int m = sw_uc_lower(d[i], l);
        if (m == 0) cp_push(out, d[i]);
        for (int j = 0; j < m; j++) cp_push(out, l[j]);
    }
}

/* Step 1: the normalized code points of the text. Ill-formed UTF-8 reads
 * as U+FFFD, which is removed. */
static void normalize(const sw_wpm *w, const uint8_t *s, size_t len, cpvec *out)
{
    for (size_t i = 0; i < len && !out->oom;) {
        uint32_t cp;
        int k = sw_utf8_decode(s + i, len - i, &cp);
        if (k == 0) { cp = 0xFFFD; k = 1; }
        i += (size_t)k;
        int c = sw_uc_class(cp);
        if (cp == 0 || cp == 0xFFFD || c == SW_UC_CONTROL) continue;
        if (c == SW_UC_SPACE) { cp_push(out, ' '); continue; }
        bool cjk = sw_uc_is_cjk(cp);
        if (cjk) cp_push(out, ' ');
        if (w->uncased) put_uncased(out, cp);
        else cp_push(out, cp);
        if (cjk) cp_push(out, ' ');
    }
}

/* Step 3 for one word of n (1..SW_WPM_MAX_WORD_CHARS) code points: its
 * pieces into ids; their count, or -1 when some part has none. */
static int word_pieces(const sw_wpm *w, const uint32_t *cp, size_t n, int32_t *ids)
{
    /* the word's UTF-8 after room for the longest prefix; off[i]: where char i starts */
    enum { PRE = 3 };
    char buf[PRE + 4 * SW_WPM_MAX_WORD_CHARS];
    size_t off[SW_WPM_MAX_WORD_CHARS + 1];
    off[0] = PRE;
    for (size_t i = 0; i < n; i++) off[i + 1] = off[i] + (size_t)sw_utf8_encode(cp[i], buf + off[i]);
    int nt = 0;
    for (size_t s = 0; s < n;) {
        /* the first piece: "▁" + text (llama.cpp's) or text; the others: text or "##" + text */
        const char *pre = s == 0 ? (w->phantom ? "\xE2\x96\x81" : "") : (w->phantom ? "" : "##");
        size_t pl = strlen(pre), e = n;
        /* over the bytes of chars before s, which no later piece reads (or the room before the word) */
        memcpy(buf + off[s] - pl, pre, pl);
        int32_t id = -1;
        while (e > s && (id = w->lookup(w->vocab, buf + off[s] - pl, off[e] - off[s] + pl)) < 0) e--;
        if (id < 0) return -1;
        ids[nt++] = id;
        s = e;
    }
    return nt;
}

/* Step 3 for a word: its pieces, or [UNK]. */
static void push_word(const sw_wpm *w, const uint32_t *cp, size_t n, void (*push)(void *, int32_t), void *ctx)
{
    int32_t ids[SW_WPM_MAX_WORD_CHARS];
    int nt = n <= SW_WPM_MAX_WORD_CHARS ? word_pieces(w, cp, n, ids) : -1;
    if (nt < 0) {
        if (w->unk >= 0) push(ctx, w->unk);
        return;
    }
    for (int i = 0; i < nt; i++) push(ctx, ids[i]);
}

bool sw_wpm_encode(const sw_wpm *w, const char *text, size_t len, void (*push)(void *ctx, int32_t id), void *ctx)
{
    cpvec v = { 0 };
    normalize(w, (const uint8_t *)text, len, &v);
    if (v.oom) { free(v.v); return false; }
    /* Step 2: words end at a space and around a punctuation character. */
    size_t start = 0;
    for (size_t i = 0; i <= v.n; i++) {
        int c = i < v.n ? sw_uc_class(v.v[i]) : SW_UC_SPACE;
        if (c != SW_UC_SPACE && c != SW_UC_PUNCT) continue;
        if (i > start) push_word(w, v.v + start, i - start, push, ctx);
        if (c == SW_UC_PUNCT) push_word(w, v.v + i, 1, push, ctx);
        start = i + 1;
    }
    free(v.v);
    return true;
}
