/* Mutation fuzz of model loading and what a loaded model is used for.
 *
 * Each seed is a real model file (test_fuzz.py passes a Q4_K_M model from
 * spillway-synth, Qwen2 and Phi-3 files with fused tensors and, when
 * $SPILLWAY_SHARED has it, the trained f32 stories260K). Mutated copies are written to a temporary file and loaded
 * with sw_model_load. Most mutations hit the metadata and tensor table (the
 * mutation engine of mutate.h, applied to the bytes before the tensor data);
 * the rest write NaN, infinities and extreme values into the tensor data.
 * A model that loads is then used the way the worker uses it: tokenize and
 * detokenize, format a chat, and run a prefill of two sequences plus a
 * decode step. The sanitizer build (.ci/run) turns any memory error or
 * undefined behaviour into a failure; the invariants below catch the rest.
 *   fuzz_model SEED.gguf...     (SPILLWAY_FUZZ_SECONDS bounds the run;
 *                                SPILLWAY_FUZZ_ITERS, default 100000)
 * Exits 0 if nothing crashed and no invariant broke, 77 without a seed.
 */
#include "worker-cpu/forward.h"
#include "llm/model.h"
#include "llm/chat.h"
#include "llm/tokenizer.h"
#include "tests/fuzz/driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { const char *path; uint8_t *bytes; size_t size, data_offset; } seed_file;

static bool read_seed(const char *path, seed_file *s)
{
    s->path = path;
    fuzz_seed f;
    if (!fuzz_read_file(path, &f)) return false;
    s->bytes = (uint8_t *)f.bytes;
    s->size = f.size;
    char err[256];
    gguf_file *g = gguf_open_buffer(s->bytes, s->size, err, sizeof err);
    if (!g) { fprintf(stderr, "fuzz_model: %s is not a usable seed\n", path); free(s->bytes); return false; }
    s->data_offset = (size_t)g->data_offset;
    gguf_close(g);
    return true;
}

/* Values that break arithmetic rather than parsing, as f32 and f16 bits. */
static const uint32_t bad_f32[] = { 0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0x00000001u, 0x80000000u };
static const uint16_t bad_f16[] = { 0x7e00, 0x7c00, 0xfc00, 0x7bff, 0x0001, 0x8000 };

/* Room a mutant may need past its seed. */
#define MUTANT_SLACK MUTATE_MAX_GROWTH

/* One mutant of s into buf (s->size + MUTANT_SLACK bytes); returns its length. */
static size_t make_mutant(const seed_file *s, uint8_t *buf)
{
    size_t head = s->data_offset, n;
    if (rnd_below(8) || head >= s->size) {
        /* the header: its length may change, the data follows it */
        memcpy(buf, s->bytes, head);
        n = mutate(buf, head, head + MUTANT_SLACK);
        memcpy(buf + n, s->bytes + head, s->size - head);
        return n + s->size - head;
    }
    memcpy(buf, s->bytes, s->size);
    n = s->size;
    for (int k = 1 + (int)rnd_below(8); k > 0; k--) {
        size_t at = head + rnd_below(s->size - head - 3);
        if (rnd_below(2)) memcpy(buf + at, &bad_f32[rnd_below(6)], 4);
        else memcpy(buf + at, &bad_f16[rnd_below(6)], 2);
    }
    return n;
}

/* Uses a loaded model as the worker would. */
static void exercise(sw_model *m)
{
    static const char text[] = "Once upon a time <s> \xC3\xA9 \xF0\x9F\x98\x80 <|im_start|>";
    if (m->tok) {
        int32_t ids[128];
        int k = sw_tok_encode(m->tok, text, sizeof text - 1, sw_tok_add_bos(m->tok), true, ids, 128);
        INVARIANT(k >= 0, "encode gave %d", k);
        sw_detok d;
        sw_detok_init(&d, m->tok, true);
        char out[1024];
        for (int i = 0; i < k; i++) {
            INVARIANT(ids[i] >= 0 && ids[i] < sw_tok_n_vocab(m->tok), "token id %d", ids[i]);
            sw_detok_push(&d, ids[i], out, sizeof out);
        }
        sw_detok_flush(&d, out, sizeof out);
    }
    sw_chat_msg msgs[3] = { { .role = "system", .content = "Be brief." }, { .role = "user", .content = "Hi" }, { .role = "assistant", .content = "Hello" } };
    free(sw_chat_format(m->chat, msgs, 3, NULL));

    /* Compute only on models of the seeds' size: a mutant may claim a huge one. */
    if ((uint64_t)m->hp.n_embd * m->hp.n_layer > (1u << 20) || m->hp.n_vocab > (1u << 17)) return;
    char err[256];
    sw_ctx *c = sw_ctx_new(m, 2, 8, 4, err, sizeof err);
    if (!c) return;
    int32_t V = (int32_t)m->hp.n_vocab;
    sw_tok_in t[4] = { { 1 % V, 0, 0, false }, { 5 % V, 1, 0, true }, { 7 % V, 0, 1, true }, { 2 % V, 2, 0, true } };
    float *logits = malloc(sizeof(float) * 3 * (size_t)V);
    INVARIANT(sw_forward(c, t, 3, logits, err, sizeof err) == 0, "prefill: %s", err);
    INVARIANT(sw_forward(c, t + 3, 1, logits, err, sizeof err) == 0, "decode: %s", err);
    free(logits);
    sw_ctx_free(c);
}

int main(int argc, char **argv)
{
    seed_file seeds[8];
    int n_seeds = 0;
    for (int i = 1; i < argc && n_seeds < 8; i++)
        if (read_seed(argv[i], &seeds[n_seeds])) n_seeds++;
    if (!n_seeds) { fprintf(stderr, "fuzz_model: no seed model given\n"); return 77; }
    const char *e = getenv("SPILLWAY_FUZZ_SECONDS");
    double max_secs = e ? atof(e) : 0;
    e = getenv("SPILLWAY_FUZZ_ITERS");
    long iters = e ? atol(e) : 100000;
    rng_state = 1;
    char path[] = "/tmp/fuzz_model_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { perror("fuzz_model"); return 2; }
    close(fd);

    time_t t0 = time(NULL);
    long done = 0, loaded = 0;
    for (long it = 0; it < iters && !broken; it++, done++) {
        const seed_file *s = &seeds[it % n_seeds];
        uint8_t *buf = malloc(s->size + MUTANT_SLACK);
        size_t n = make_mutant(s, buf);
        FILE *f = fopen(path, "wb");
        bool wrote = f && fwrite(buf, 1, n, f) == n;
        if (f) fclose(f);
        free(buf);
        if (!wrote) { perror("fuzz_model: writing the mutant"); unlink(path); return 2; }
        char err[256] = "";
        sw_model *m = sw_model_load(path, err, sizeof err);
        if (m) { loaded++; exercise(m); sw_model_free(m); }
        else INVARIANT(err[0], "load failed without a message (iteration %ld)", it);
        if (broken) fprintf(stderr, "fuzz_model: invariant broken at iteration %ld (seed %s)\n", it, s->path);
        if (max_secs > 0 && difftime(time(NULL), t0) > max_secs) break;
    }
    unlink(path);
    printf("fuzz_model: %ld mutants, %ld loaded, %d invariant failures\n", done, loaded, broken);
    for (int i = 0; i < n_seeds; i++) free(seeds[i].bytes);
    return broken ? 1 : 0;
}
