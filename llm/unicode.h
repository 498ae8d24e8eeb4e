/* The Unicode facts BERT's text normalizer needs (llm/wordpiece.c): a code
 * point's class, its canonical decomposition (NFD) and its lower case. The
 * tables are generated from Python's unicodedata by
 * tools/gen-unicode-tables.py (llm/unicode_tables.h); SW_UC_TABLE_VERSION
 * names their Unicode version.
 */
#ifndef SW_UNICODE_H
#define SW_UNICODE_H

#include <stdint.h>

/* BERT's basic tokenizer's classes of a code point:
 *   CONTROL  general category C* (control, format, unassigned, private use,
 *            surrogate), but tab, LF and CR: removed from the text
 *   SPACE    White_Space (tab, LF and CR among them): separates words
 *   PUNCT    category P*, or ASCII punctuation ($ + < = > ^ ` | ~ too):
 *            a word of its own
 *   MARK     a nonspacing mark (Mn): stripped with the accents
 *   OTHER    the rest */
enum { SW_UC_OTHER = 0, SW_UC_SPACE, SW_UC_CONTROL, SW_UC_PUNCT, SW_UC_MARK };
int sw_uc_class(uint32_t cp);

/* Whether cp is a CJK ideograph that BERT treats as a word of its own
 * (the CJK Unified Ideographs blocks and their extensions A-E, and the
 * compatibility ideographs), as BERT's tokenizer lists them. */
int sw_uc_is_cjk(uint32_t cp);

/* The longest sequence the two below write. */
#define SW_UC_SEQ_MAX 4

/* cp's full canonical decomposition into out (Hangul syllables by the
 * Unicode algorithm): its length, or 0 when cp has none. */
int sw_uc_nfd(uint32_t cp, uint32_t out[SW_UC_SEQ_MAX]);
/* cp's lower case (one code point at a time, no context rules): its
 * length, or 0 when it is its own. */
int sw_uc_lower(uint32_t cp, uint32_t out[SW_UC_SEQ_MAX]);

#endif
