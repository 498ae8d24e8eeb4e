/* BPE pre-tokenizers as regex sequences on PCRE2 (see pretok.h).
 *
 * The regexes are those of each model family's tokenizer.json (as
 * llama.cpp's converter names the families in tokenizer.ggml.pre). Where a
 * tokenizer.json writes the English contractions case-insensitively,
 * (?i:'s|'t|...), they are spelled out as '[sS]|'[tT]|... here: under
 * Unicode case folding (?i:'s) would also take "'ſ" (U+017F) and (?i:'k)
 * the Kelvin sign, which llama.cpp's tokenizer does not, and files are
 * checked against llama.cpp.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "llm/pretok.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* Llama 3's with n the digit group: "{1,3}" (Llama 3) or "" (Qwen2, one digit). */
#define LLAMA3(n) CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" n \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* GPT-4o's: a word is an optional non-letter, then upper-case letters then
 * lower-case ones (or the reverse), so "HelloWorld" is two words. */
#define UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define CASED_WORDS(suffix) "[^\\r\\n\\p{L}\\p{N}]?" UPPER "*" LOWER "+" suffix \
    "|[^\\r\\n\\p{L}\\p{N}]?" UPPER "+" LOWER "*" suffix
#define SPACES "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

enum { MAX_RE = 6 };

typedef struct {
    const char *names;            /* the tokenizer.ggml.pre values, space-separated */
    const char *re[MAX_RE];       /* applied in order; NULL ends the list */
    bool whole_words, bos;
} pretok_spec;

static const pretok_spec SPECS[] = {
    { .names = "gpt2 gpt-2 default phi-2 mpt olmo jais trillion granite-docling mellum exaone4 gigachat a.x-4.0 "
      "jina-es jina-de jina-v2-es jina-v2-de modern-bert",
      .re = { GPT2 } },
    { .names = "llama-bpe llama3 llama-v3 falcon3 falcon-h1 pixtral midm-2.0 lfm2",
      .re = { LLAMA3("{1,3}") }, .whole_words = true, .bos = true },
    /* Llama 3's split without the whole-word lookup. */
    { .names = "dbrx smaug-bpe", .re = { LLAMA3("{1,3}") } },
    { .names = "qwen2 deepseek-r1-qwen kormo f2llmv2 stablelm2 hunyuan megrez solar-open grok-2", .re = { LLAMA3("") } },
    { .names = "qwen35",
      .re = { CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*" SPACES } },
    /* StarCoder's: every digit a word, then GPT-2's split between them. */
    { .names = "starcoder refact command-r smollm codeshell exaone minerva-7b mellum2", .re = { "\\p{N}", GPT2 } },
    { .names = "falcon", .re = { "[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]" } },
    { .names = "deepseek-llm",
      .re = { "[\r\n]",
        "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
        "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", "[一-龥ࠀ-一가-퟿]+", "\\p{N}+" } },
    { .names = "deepseek-coder", .re = { "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}" } },
    { .names = "deepseek-v3 hunyuan-dense joyai-llm hy_v4",
      .re = { "\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+" } },
    /* Mistral's Tekken (Nemo, Small 3, Pixtral 12B's text side). */
    { .names = "tekken", .re = { CASED_WORDS("") "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*" SPACES },
      .whole_words = true, .bos = true },
    { .names = "gpt-4o llama4 minimax-m2 kanana2 talkie",
      .re = { CASED_WORDS(CONTRACTIONS "?") "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*" SPACES } },
    { .names = "seed-coder",
      .re = { CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+" SPACES } },
    { .names = "poro-chat bloom gpt3-finnish", .re = { " ?[^(\\s|.,!?…。，、।۔،)]+" } },
    { .names = "viking", .re = { " ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}" } },
};
enum { N_SPECS = sizeof SPECS / sizeof SPECS[0] };

struct sw_pretok {
    const pretok_spec *spec;
    pcre2_code *re[MAX_RE];
    int n_re;
};

static bool name_in(const char *names, const char *name, size_t len)
{
    for (const char *p = names; *p; ) {
        size_t n = strcspn(p, " ");
        if (n == len && !memcmp(p, name, len)) return true;
        p += n + (p[n] == ' ');
    }
    return false;
}

sw_pretok *sw_pretok_new(const char *name, size_t len, char *err, size_t errlen)
{
    const pretok_spec *spec = name ? NULL : &SPECS[0];
    for (int i = 0; !spec && i < N_SPECS; i++)
        if (name_in(SPECS[i].names, name, len)) spec = &SPECS[i];
    if (!spec) {
        snprintf(err, errlen, "pre-tokenizer '%.*s' is not supported", (int)(len < 60 ? len : 60), name);
        return NULL;
    }
    sw_pretok *p = calloc(1, sizeof *p);
    if (!p) { snprintf(err, errlen, "out of memory"); return NULL; }
    p->spec = spec;
    for (; p->n_re < MAX_RE && spec->re[p->n_re]; p->n_re++) {
        int code;
        PCRE2_SIZE at;
        /* MATCH_INVALID_UTF: ill-formed bytes match nothing and fall into
         * the text between matches, so no input is refused. DOLLAR_ENDONLY:
         * $ is the end of the piece, not also before a final newline. */
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)spec->re[p->n_re], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY,
                                       &code, &at, NULL);
        if (!re) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(code, msg, sizeof msg);
            snprintf(err, errlen, "pre-tokenizer '%.*s': regex %d at %zu: %s", name ? (int)(len < 60 ? len : 60) : 4,
                     name ? name : "gpt2", p->n_re, (size_t)at, (const char *)msg);
            sw_pretok_free(p);
            return NULL;
        }
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);   /* without JIT, pcre2_match interprets */
        p->re[p->n_re] = re;
    }
    return p;
}

void sw_pretok_free(sw_pretok *p)
{
    if (!p) return;
    for (int i = 0; i < p->n_re; i++) pcre2_code_free(p->re[i]);
    free(p);
}

const char *sw_pretok_family(int i) { return i >= 0 && i < N_SPECS ? SPECS[i].names : NULL; }

bool sw_pretok_whole_words(const sw_pretok *p) { return p->spec->whole_words; }
bool sw_pretok_default_bos(const sw_pretok *p) { return p->spec->bos; }

typedef struct { sw_span *v; size_t n, cap; bool oom; } spanvec;

static void push(spanvec *s, size_t off, size_t len)
{
    if (s->oom || len == 0) return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        sw_span *v = realloc(s->v, cap * sizeof *v);
        if (!v) { s->oom = true; return; }
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (sw_span){ (uint32_t)off, (uint32_t)len };
}

/* The next match in piece[0..n) from 'at', or false. A JIT that runs out of
 * its stack gets one retry in the interpreter, whose memory is the heap. */
static bool next_match(const pcre2_code *re, const char *piece, size_t n, size_t at, pcre2_match_data *md,
                       size_t *s, size_t *e)
{
    int rc = pcre2_match(re, (PCRE2_SPTR)piece, n, at, 0, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)piece, n, at, PCRE2_NO_JIT, md, NULL);
    if (rc < 0) return false;    /* no match, or a limit: the rest stays one piece */
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *s = ov[0];
    *e = ov[1];
    return true;
}

/* Cuts piece [off, off+n) of text with one regex: matches and the text
 * between them both become pieces. An empty match (a lookahead) only marks
 * a cut. */
static void split_one(const pcre2_code *re, const char *text, size_t off, size_t n, pcre2_match_data *md,
                      spanvec *out)
{
    const char *piece = text + off;
    size_t gap = 0, at = 0, s, e;
    while (at <= n && next_match(re, piece, n, at, md, &s, &e)) {
        if (s > gap) push(out, off + gap, s - gap);
        if (e == s) {
            gap = s;
            if (s >= n) break;
            at = s + 1;
            while (at < n && ((uint8_t)piece[at] & 0xC0) == 0x80) at++;
            continue;
        }
        push(out, off + s, e - s);
        gap = at = e;
    }
    if (gap < n) push(out, off + gap, n - gap);
}

size_t sw_pretok_split(const sw_pretok *p, const char *text, size_t len, sw_span **out)
{
    *out = NULL;
    spanvec cur = { 0 }, next = { 0 };
    push(&cur, 0, len);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) cur.oom = true;
    for (int r = 0; r < p->n_re && !cur.oom; r++) {
        next.n = 0;
        for (size_t i = 0; i < cur.n && !next.oom; i++)
            split_one(p->re[r], text, cur.v[i].off, cur.v[i].len, md, &next);
        spanvec t = cur; cur = next; next = t;
    }
    pcre2_match_data_free(md);
    free(next.v);
    if (cur.oom) { free(cur.v); return SIZE_MAX; }
    *out = cur.v;
    return cur.n;
}
