/* spillway-synth: writes a RANDOM-WEIGHT Llama GGUF for demos and benchmarks.
 *
 *   spillway-synth --shape tiny|125m|1b|8b|tiny-moe|moe [--type f32|f16|q8_0|q4_k_m] [--seed N] OUT.gguf
 *
 * "moe" is a mixture of experts in Mixtral's llama layout, with Qwen3-30B-A3B's
 * layer widths (dim 2048, 32/4 heads, 64 experts of width 768, 8 used per
 * token) in 16 layers: 5.1 B weights of which 0.82 B are used per token.
 * "tiny-moe" is the same layout at the tiny shape's size, for tests.
 *
 * The weights are seeded normal noise, so the model produces gibberish; the
 * file says so in general.description and spillway.synthetic = true. What is
 * real: the architecture, the shapes, the tensor names and metadata keys as
 * llama.cpp's converter writes them, and an SPM vocabulary (byte fallback,
 * word pieces with scores) that tokenizes any text.
 *
 * Scaling keeps activations well conditioned at any depth: matrices are
 * N(0, 1/fan_in) so a normalized input gives unit-variance outputs; the two
 * projections that write into the residual stream (attn_output, ffn_down) are
 * further scaled by 1/sqrt(2 * n_layers) so the stream's variance stays O(1)
 * after all layers; norm weights are 1; token embeddings are N(0, 1).
 *
 * Generation streams: each tensor is generated row by row straight into its
 * quantized form when the writer reaches it (gguf_w_tensor_fn), so memory is
 * one quantized tensor plus one float row per thread. Each row's noise comes
 * from its own seed (seed, tensor, row), so the output does not depend on the
 * thread count.
 */
#include "llm/gguf.h"
#include "llm/quant.h"
#include "llm/quant_mix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "llm/util.h"

typedef struct {
    const char *name;
    uint32_t dim, layers, heads, kv_heads, ffn, vocab, ctx;
    float rope_theta;
    uint32_t experts, experts_used;   /* 0: a dense FFN; else ffn is each expert's width */
} shape;

static const shape SHAPES[] = {
    { "tiny", 128, 2, 4, 2, 256, 1024, 512, 10000.0f, 0, 0 },
    { "125m", 768, 12, 12, 4, 2048, 32000, 2048, 10000.0f, 0, 0 },
    { "1b", 2048, 16, 32, 8, 8192, 32000, 4096, 10000.0f, 0, 0 },
    { "8b", 4096, 32, 32, 8, 14336, 128256, 8192, 500000.0f, 0, 0 },
    { "tiny-moe", 128, 2, 4, 2, 256, 1024, 512, 10000.0f, 4, 2 },
    { "moe", 2048, 16, 32, 4, 768, 32000, 4096, 1000000.0f, 64, 8 },
};

/* ------------------------------------------------------------------ */
/* Random numbers */

/* Fills x[0..n) with N(0, std^2) noise from the stream seeded by `seed`. */
static void normal_row(uint64_t seed, float *x, uint64_t n, float std)
{
    uint64_t s = seed;
    for (uint64_t i = 0; i < n; i += 2) {
        /* Box-Muller; u1 in (0, 1] so the log is finite. */
        double u1 = ((sw_splitmix64(&s) >> 11) + 1) * (1.0 / 9007199254740992.0);
        double u2 = (sw_splitmix64(&s) >> 11) * (1.0 / 9007199254740992.0);
        double r = sqrt(-2.0 * log(u1)) * std;
        x[i] = (float)(r * cos(2.0 * M_PI * u2));
        if (i + 1 < n) x[i + 1] = (float)(r * sin(2.0 * M_PI * u2));
    }
}

/* ------------------------------------------------------------------ */
/* SPM vocabulary */

typedef struct {
    char **tok;
    uint32_t n, cap;
    uint32_t *set;   /* open-addressing set of token indexes + 1 */
    uint32_t set_mask;
} vocab;

static uint64_t str_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (uint8_t)*s++) * 1099511628211ull;
    return h;
}

/* Adds s unless present or full. */
static void v_add(vocab *v, const char *s)
{
    if (v->n >= v->cap || !*s) return;
    uint32_t h = (uint32_t)str_hash(s) & v->set_mask;
    for (; v->set[h]; h = (h + 1) & v->set_mask)
        if (!strcmp(v->tok[v->set[h] - 1], s)) return;
    v->tok[v->n] = strdup(s);
    v->set[h] = ++v->n;
}

#define SPACE "\xe2\x96\x81"   /* U+2581, SentencePiece's word-boundary mark */

/* Common English words (lowercase). Each one and its "▁"-prefixes become
 * pieces, so the tokenizer's pairwise merges can build them. */
static const char *WORDS[] = {
    "the", "and", "to", "of", "a", "in", "was", "he", "she", "it", "that", "is", "for", "on",
    "you", "with", "they", "his", "her", "had", "at", "be", "one", "day", "time", "once",
    "upon", "there", "little", "girl", "boy", "big", "happy", "said", "mom", "dad", "friend",
    "friends", "play", "played", "park", "tree", "sun", "sky", "dog", "cat", "bird", "ball",
    "toy", "very", "so", "not", "but", "all", "what", "when", "were", "we", "can", "do", "did",
    "go", "went", "see", "saw", "look", "looked", "like", "liked", "want", "wanted", "help",
    "helped", "this", "from", "have", "has", "are", "an", "as", "by", "or", "up", "out", "down",
    "about", "into", "over", "after", "before", "then", "than", "them", "their", "our", "your",
    "my", "me", "him", "us", "who", "how", "why", "where", "which", "will", "would", "could",
    "should", "make", "made", "new", "good", "great", "first", "last", "long", "old", "young",
    "house", "home", "water", "food", "eat", "ate", "run", "ran", "walk", "walked", "away",
    "back", "again", "always", "never", "every", "some", "many", "more", "most", "other",
    "people", "world", "name", "named", "small", "kind", "nice", "sad", "scared", "loved",
    "love", "felt", "feel", "thought", "think", "know", "knew", "found", "find", "came", "come",
    "get", "got", "give", "gave", "take", "took", "tell", "told", "story", "stories", "river",
    "sea", "star", "stars", "mountain", "mountains", "village", "evening", "morning", "night",
    "far", "near", "quick", "brown", "fox", "jumps", "lazy", "red", "blue", "green", "yellow",
    "because", "just", "now", "here", "well", "also", "only", "even", "way", "because", "each",
    "two", "three", "year", "years", "thing", "things", "man", "woman", "children", "school",
    "computer", "model", "data", "random", "weights", "language", "hello", "yes", "no",
};

static void add_word_pieces(vocab *v, const char *w, bool capital)
{
    char buf[64];
    size_t n = strlen(w);
    if (n + 4 > sizeof buf) return;
    memcpy(buf, SPACE, 3);
    memcpy(buf + 3, w, n + 1);
    if (capital) buf[3] = (char)(buf[3] - 'a' + 'A');
    for (size_t k = 1; k <= n; k++) {   /* "▁t", "▁th", "▁the" */
        char c = buf[3 + k];
        buf[3 + k] = 0;
        v_add(v, buf);
        buf[3 + k] = c;
    }
    v_add(v, buf + 3);                  /* "the" inside a word */
}

/* Letter combinations of length len (a..z), with and without "▁". */
static void add_combos(vocab *v, int len)
{
    char buf[16];
    uint64_t total = 1;
    for (int i = 0; i < len; i++) total *= 26;
    for (uint64_t c = 0; c < total && v->n < v->cap; c++) {
        uint64_t x = c;
        memcpy(buf, SPACE, 3);
        for (int i = len - 1; i >= 0; i--) { buf[3 + i] = (char)('a' + x % 26); x /= 26; }
        buf[3 + len] = 0;
        v_add(v, buf);
        v_add(v, buf + 3);
    }
}

/* Builds exactly n tokens: <unk> <s> </s>, 256 byte tokens, then pieces in
 * rough frequency order (scores descend with the index). */
static bool build_vocab(vocab *v, uint32_t n)
{
    memset(v, 0, sizeof *v);
    v->cap = n;
    v->tok = calloc(n, sizeof *v->tok);
    uint32_t cap = 1024;
    while (cap < 2 * n) cap <<= 1;
    v->set = calloc(cap, sizeof *v->set);
    v->set_mask = cap - 1;
    if (!v->tok || !v->set) return false;
    v_add(v, "<unk>");
    v_add(v, "<s>");
    v_add(v, "</s>");
    char buf[16];
    for (int b = 0; b < 256; b++) { snprintf(buf, sizeof buf, "<0x%02X>", b); v_add(v, buf); }
    v_add(v, SPACE);
    for (char c = 'a'; c <= 'z'; c++) {
        snprintf(buf, sizeof buf, SPACE "%c", c); v_add(v, buf);
        snprintf(buf, sizeof buf, "%c", c); v_add(v, buf);
    }
    const char *punct = ".,!?'\"-:;()0123456789";
    for (const char *p = punct; *p; p++) {
        snprintf(buf, sizeof buf, "%c", *p); v_add(v, buf);
        snprintf(buf, sizeof buf, SPACE "%c", *p); v_add(v, buf);
    }
    for (char c = 'A'; c <= 'Z'; c++) {
        snprintf(buf, sizeof buf, SPACE "%c", c); v_add(v, buf);
        snprintf(buf, sizeof buf, "%c", c); v_add(v, buf);
    }
    for (size_t i = 0; i < sizeof WORDS / sizeof WORDS[0]; i++) add_word_pieces(v, WORDS[i], false);
    for (size_t i = 0; i < sizeof WORDS / sizeof WORDS[0]; i++) add_word_pieces(v, WORDS[i], true);
    for (int len = 2; len <= 4 && v->n < n; len++) add_combos(v, len);
    return v->n == n;
}

static void free_vocab(vocab *v)
{
    for (uint32_t i = 0; i < v->n; i++) free(v->tok[i]);
    free(v->tok);
    free(v->set);
}

static void write_vocab(gguf_writer *w, const vocab *v)
{
    float *scores = malloc(v->n * sizeof *scores);
    int32_t *types = malloc(v->n * sizeof *types);
    for (uint32_t i = 0; i < v->n; i++) {
        if (i == 0) { types[i] = 2; scores[i] = 0; }                 /* unknown */
        else if (i < 3) { types[i] = 3; scores[i] = 0; }             /* control */
        else if (i < 259) { types[i] = 6; scores[i] = 0; }           /* byte */
        else { types[i] = 1; scores[i] = -(float)(i - 259); }        /* normal */
    }
    gguf_w_str(w, "tokenizer.ggml.model", "llama");
    gguf_w_str(w, "tokenizer.ggml.pre", "default");
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tok, v->n);
    gguf_w_arr_f32(w, "tokenizer.ggml.scores", scores, v->n);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, v->n);
    gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", true);
    gguf_w_bool(w, "tokenizer.ggml.add_eos_token", false);
    free(scores);
    free(types);
}

/* ------------------------------------------------------------------ */
/* Tensors */

typedef struct {
    char name[96];
    uint32_t n_dims;
    uint64_t ne[3];   /* ne[2]: experts, for the stacked expert matrices */
    sw_type type;
    float std;        /* 0: all ones (norm weights) */
    uint64_t seed;
    uint32_t index, total;
    bool verbose;
} synth_tensor;

static bool synth_row(void *ctx, uint64_t r, float *x)
{
    const synth_tensor *t = ctx;
    uint64_t ne0 = t->ne[0];
    if (t->std == 0.0f) {
        for (uint64_t i = 0; i < ne0; i++) x[i] = 1.0f;
    } else {
        uint64_t s = t->seed ^ ((uint64_t)t->index << 40) ^ r;
        normal_row(sw_splitmix64(&s), x, ne0, t->std);
    }
    return true;
}

static bool fill_tensor(void *ctx, void *dst, uint64_t nbytes, char *err, size_t errlen)
{
    synth_tensor *t = ctx;
    uint64_t ne0 = t->ne[0], rows = (t->n_dims > 1 ? t->ne[1] : 1) * (t->n_dims > 2 ? t->ne[2] : 1);
    if (sw_row_size(t->type, ne0) * rows != nbytes) {
        snprintf(err, errlen, "spillway-synth: %s: size mismatch", t->name);
        return false;
    }
    if (!sw_quantize_rows(t->type, ne0, rows, dst, synth_row, t)) {
        snprintf(err, errlen, "spillway-synth: %s: cannot produce type %s", t->name,
                 sw_type_info(t->type)->name);
        return false;
    }
    if (t->verbose)
        fprintf(stderr, "  [%3u/%u] %-28s %-5s %llu x %llu\n", t->index + 1, t->total, t->name,
                sw_type_info(t->type)->name, (unsigned long long)ne0, (unsigned long long)rows);
    return true;
}

static void add_tensor(gguf_writer *w, synth_tensor *t, sw_ftype ft, const shape *sh)
{
    const sw_mix_model mm = { sh->layers, sh->experts, false };   /* synth always writes output.weight */
    t->type = sw_mix_type(ft, t->name, t->n_dims, t->ne, &mm);
    gguf_w_tensor_fn(w, t->name, t->type, t->n_dims, t->ne, fill_tensor, t);
}

static void usage(FILE *fp)
{
    fprintf(fp,
            "usage: spillway-synth --shape tiny|125m|1b|8b|tiny-moe|moe [--type f32|f16|q8_0|q4_k_m] [--seed N] "
            "OUT.gguf\n"
            "Writes a RANDOM-WEIGHT Llama GGUF (gibberish output) for demos and benchmarks.\n"
            "Defaults: --type f32, --seed 42.\n");
}

typedef struct {
    const shape *sh;
    sw_ftype ft;
    uint64_t seed;
    const char *out;
} options;

/* Reads the command line into o: -1 to go on, else the exit code. */
static int parse_args(int argc, char **argv, options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "--shape") && has_val) {
            const char *s = argv[++i];
            for (size_t k = 0; k < sizeof SHAPES / sizeof SHAPES[0]; k++)
                if (!strcmp(s, SHAPES[k].name)) o->sh = &SHAPES[k];
            if (!o->sh) { fprintf(stderr, "spillway-synth: unknown shape '%s' (tiny, 125m, 1b, 8b, tiny-moe, moe)\n", s); return 2; }
        } else if (!strcmp(a, "--type") && has_val) {
            const char *s = argv[++i];
            if (!sw_ftype_parse(s, &o->ft)) {
                fprintf(stderr, "spillway-synth: unknown type '%s' (f32, f16, q8_0, q4_k_m)\n", s);
                return 2;
            }
        } else if (!strcmp(a, "--seed") && has_val) {
            char *end;
            o->seed = strtoull(argv[++i], &end, 0);
            if (*end || !*argv[i]) { fprintf(stderr, "spillway-synth: bad seed '%s'\n", argv[i]); return 2; }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "spillway-synth: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!o->out) {
            o->out = a;
        } else {
            fprintf(stderr, "spillway-synth: more than one output path ('%s', '%s')\n", o->out, a);
            return 2;
        }
    }
    if (!o->sh || !o->out) {
        fprintf(stderr, "spillway-synth: %s is required\n", !o->sh ? "--shape" : "OUT.gguf");
        usage(stderr);
        return 2;
    }
    return -1;
}

/* The general.*, spillway.* and llama.* keys of the shape (the vocabulary
 * goes after them). */
static void write_metadata(gguf_writer *w, const options *o)
{
    const shape *sh = o->sh;
    char text[512];
    gguf_w_str(w, "general.architecture", "llama");
    snprintf(text, sizeof text, "spillway-synth-%s", sh->name);
    gguf_w_str(w, "general.name", text);
    snprintf(text, sizeof text,
             "RANDOM WEIGHTS: synthetic Llama-architecture model written by spillway-synth "
             "(shape %s, seed %llu). It was never trained and produces gibberish; use it only "
             "for demos, tests and benchmarks.", sh->name, (unsigned long long)o->seed);
    gguf_w_str(w, "general.description", text);
    gguf_w_bool(w, "spillway.synthetic", true);
    gguf_w_str(w, "spillway.synth.shape", sh->name);
    gguf_w_u64(w, "spillway.synth.seed", o->seed);
    gguf_w_u32(w, "general.file_type", o->ft);
    gguf_w_u32(w, "general.quantization_version", 2);
    gguf_w_u32(w, "general.alignment", GGUF_DEFAULT_ALIGNMENT);
    gguf_w_u32(w, "llama.context_length", sh->ctx);
    gguf_w_u32(w, "llama.embedding_length", sh->dim);
    gguf_w_u32(w, "llama.block_count", sh->layers);
    gguf_w_u32(w, "llama.feed_forward_length", sh->ffn);
    gguf_w_u32(w, "llama.attention.head_count", sh->heads);
    gguf_w_u32(w, "llama.attention.head_count_kv", sh->kv_heads);
    gguf_w_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_w_f32(w, "llama.rope.freq_base", sh->rope_theta);
    gguf_w_u32(w, "llama.rope.dimension_count", sh->dim / sh->heads);
    gguf_w_u32(w, "llama.vocab_size", sh->vocab);
    if (sh->experts) {
        gguf_w_u32(w, "llama.expert_count", sh->experts);
        gguf_w_u32(w, "llama.expert_used_count", sh->experts_used);
    }
}

/* Adds the shape's n_t tensors, described in ts (which must outlive the
 * write: fill_tensor reads it). */
static void add_tensors(gguf_writer *w, synth_tensor *ts, uint32_t n_t, const options *o, bool verbose)
{
    const shape *sh = o->sh;
    const sw_ftype ft = o->ft;
    const uint64_t seed = o->seed;
    uint32_t k = 0;
    uint32_t kv_dim = sh->dim / sh->heads * sh->kv_heads;
    float in_std = 1.0f / sqrtf((float)sh->dim), ffn_std = 1.0f / sqrtf((float)sh->ffn);
    float resid = 1.0f / sqrtf(2.0f * (float)sh->layers);
#define T(NAME, ND, NE0, NE1, STD) do { synth_tensor *t = &ts[k]; \
        snprintf(t->name, sizeof t->name, "%s", NAME); t->n_dims = ND; t->ne[0] = NE0; t->ne[1] = NE1; \
        t->ne[2] = (ND) > 2 ? sh->experts : 1; \
        t->std = STD; t->seed = seed; t->index = k; t->total = n_t; t->verbose = verbose; \
        add_tensor(w, t, ft, sh); k++; } while (0)
    T("token_embd.weight", 2, sh->dim, sh->vocab, 1.0f);
    T("output_norm.weight", 1, sh->dim, 1, 0.0f);
    T("output.weight", 2, sh->dim, sh->vocab, in_std);
    for (uint32_t l = 0; l < sh->layers; l++) {
        char n[96];
#define L(SUFFIX, ND, NE0, NE1, STD) do { snprintf(n, sizeof n, "blk.%u." SUFFIX ".weight", l); \
        T(n, ND, NE0, NE1, STD); } while (0)
        L("attn_norm", 1, sh->dim, 1, 0.0f);
        L("attn_q", 2, sh->dim, sh->dim, in_std);
        L("attn_k", 2, sh->dim, kv_dim, in_std);
        L("attn_v", 2, sh->dim, kv_dim, in_std);
        L("attn_output", 2, sh->dim, sh->dim, in_std * resid);
        L("ffn_norm", 1, sh->dim, 1, 0.0f);
        if (sh->experts) {   /* the router, then each kind of expert matrix stacked */
            L("ffn_gate_inp", 2, sh->dim, sh->experts, in_std);
            L("ffn_gate_exps", 3, sh->dim, sh->ffn, in_std);
            L("ffn_up_exps", 3, sh->dim, sh->ffn, in_std);
            L("ffn_down_exps", 3, sh->ffn, sh->dim, ffn_std * resid);
            continue;
        }
        L("ffn_gate", 2, sh->dim, sh->ffn, in_std);
        L("ffn_up", 2, sh->dim, sh->ffn, in_std);
        L("ffn_down", 2, sh->ffn, sh->dim, ffn_std * resid);
#undef L
    }
#undef T
}

int main(int argc, char **argv)
{
    options o = { .ft = SW_FTYPE_ALL_F32, .seed = 42 };
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    const shape *sh = o.sh;

    vocab v;
    if (!build_vocab(&v, sh->vocab)) {
        fprintf(stderr, "spillway-synth: could not build a %u-token vocabulary (got %u)\n", sh->vocab, v.n);
        free_vocab(&v);
        return 1;
    }

    gguf_writer *w = gguf_writer_new();
    write_metadata(w, &o);
    write_vocab(w, &v);

    uint32_t n_t = 3 + (sh->experts ? 10 : 9) * sh->layers;
    synth_tensor *ts = calloc(n_t, sizeof *ts);
    if (!ts) {
        fprintf(stderr, "spillway-synth: out of memory\n");
        gguf_writer_free(w);
        free_vocab(&v);
        return 1;
    }
    bool verbose = strncmp(sh->name, "tiny", 4) != 0;
    add_tensors(w, ts, n_t, &o, verbose);
    if (verbose)
        fprintf(stderr, "spillway-synth: writing %s (%s, %s, %u tensors, RANDOM WEIGHTS)\n",
                o.out, sh->name, sw_ftype_name(o.ft), n_t);
    char err[512];
    bool ok = gguf_writer_write(w, o.out, err, sizeof err);
    gguf_writer_free(w);
    free(ts);
    free_vocab(&v);
    if (!ok) {
        fprintf(stderr, "spillway-synth: %s\n", err);
        return 1;
    }
    struct stat st;
    double mib = stat(o.out, &st) == 0 ? st.st_size / 1048576.0 : 0;
    fprintf(stderr, "spillway-synth: wrote %s: %s shape, %s, seed %llu, %.1f MiB (random weights)\n",
            o.out, sh->name, sw_ftype_name(o.ft), (unsigned long long)o.seed, mib);
    return 0;
}
