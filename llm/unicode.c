/* Lookups in the generated tables (see unicode.h). */
#include "llm/unicode.h"

#include <stddef.h>
#include "llm/unicode_tables.h"

_Static_assert(SW_UC_MAX_SEQ <= SW_UC_SEQ_MAX, "llm/unicode_tables.h has longer sequences than unicode.h allows");

int sw_uc_class(uint32_t cp)
{
    size_t lo = 0, hi = sizeof UC_RANGES / sizeof UC_RANGES[0];
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < UC_RANGES[mid].lo) hi = mid;
        else if (cp > UC_RANGES[mid].hi) lo = mid + 1;
        else return UC_RANGES[mid].cls;
    }
    return cp > 0x10FFFF ? SW_UC_CONTROL : SW_UC_OTHER;
}

int sw_uc_is_cjk(uint32_t cp)
{
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* Looks cp up in a sorted key table; copies its sequence. */
static int lookup(const uint32_t *keys, size_t n, const uint16_t *off, const uint32_t *data, uint32_t cp,
                  uint32_t *out)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < cp) lo = mid + 1;
        else hi = mid;
    }
    if (lo == n || keys[lo] != cp) return 0;
    int k = 0;
    for (uint32_t i = off[lo]; i < off[lo + 1]; i++) out[k++] = data[i];
    return k;
}

int sw_uc_nfd(uint32_t cp, uint32_t out[SW_UC_SEQ_MAX])
{
    /* Hangul syllables: leading consonant, vowel and optional trailing
     * consonant (Unicode's arithmetic, chapter 3.12). */
    enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7, V_N = 21, T_N = 28, S_N = 11172 };
    if (cp >= S_BASE && cp < S_BASE + S_N) {
        uint32_t s = cp - S_BASE;
        out[0] = L_BASE + s / (V_N * T_N);
        out[1] = V_BASE + (s % (V_N * T_N)) / T_N;
        if (s % T_N == 0) return 2;
        out[2] = T_BASE + s % T_N;
        return 3;
    }
    return lookup(NFD_KEYS, sizeof NFD_KEYS / sizeof NFD_KEYS[0], NFD_OFF, NFD_DATA, cp, out);
}

int sw_uc_lower(uint32_t cp, uint32_t out[SW_UC_SEQ_MAX])
{
    return lookup(LOWER_KEYS, sizeof LOWER_KEYS / sizeof LOWER_KEYS[0], LOWER_OFF, LOWER_DATA, cp, out);
}
