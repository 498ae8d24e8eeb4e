/* Mutation fuzz of the GGUF reader.
 *
 * It makes a valid GGUF with the writer (every value type, string arrays,
 * several tensor types), then opens thousands of mutated copies (byte flips,
 * random bytes, interesting u64s, truncations, insertions, deletions) with
 * gguf_open_buffer. Every file that opens is walked completely and its
 * invariants checked (all pointers inside the buffer); one that does not
 * must say why.
 *   fuzz_gguf                        (loop settings: tests/fuzz/driver.h)
 */
#include "llm/gguf.h"

#include <unistd.h>

#include "tests/fuzz/driver.h"

static bool inside(const gguf_file *f, const void *p, uint64_t n)
{
    const uint8_t *b = p;
    return b >= f->base && b <= f->base + f->size && n <= (uint64_t)(f->base + f->size - b);
}

/* Touches everything a consumer could touch; returns a checksum so the
 * compiler cannot drop the reads. */
static uint64_t walk(const gguf_file *f)
{
    uint64_t sum = 0;
    char buf[64];
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        INVARIANT(inside(f, kv->key.ptr, kv->key.len), "kv %llu key", (unsigned long long)i);
        char key[256];
        if (kv->key.len < sizeof key) {
            memcpy(key, kv->key.ptr, kv->key.len);
            key[kv->key.len] = 0;
            INVARIANT(gguf_find(f, key) == kv || memchr(kv->key.ptr, 0, kv->key.len), "find kv %llu",
                      (unsigned long long)i);
            uint64_t u; int64_t s; float x; bool b; gguf_str str;
            sum += gguf_get_u64(f, key, &u) ? u : 0;
            sum += gguf_get_i64(f, key, &s) ? (uint64_t)s : 0;
            sum += gguf_get_f32(f, key, &x) ? (uint64_t)(x == x) : 0;
            sum += gguf_get_bool(f, key, &b) ? b : 0;
            sum += gguf_get_cstr(f, key, buf, sizeof buf) ? (uint8_t)buf[0] : 0;
            if (gguf_get_str(f, key, &str)) INVARIANT(inside(f, str.ptr, str.len), "string value");
        }
        sum += strlen(gguf_vtype_name(kv->type));
        if (kv->type != GGUF_VT_ARRAY) continue;
        INVARIANT(kv->v.arr.type != GGUF_VT_ARRAY, "nested array accepted");
        for (uint64_t j = 0; j < kv->v.arr.n; j++) {
            if (kv->v.arr.type == GGUF_VT_STRING) {
                gguf_str s = gguf_arr_str(kv, j);
                INVARIANT(s.ptr && inside(f, s.ptr, s.len), "string element %llu", (unsigned long long)j);
                for (uint64_t k = 0; k < s.len; k++) sum += (uint8_t)s.ptr[k];
            } else {
                sum += (uint64_t)gguf_arr_int(kv, j);
                sum += (uint64_t)(gguf_arr_f32(kv, j) != 0.0f);
            }
        }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        INVARIANT(t->n_dims <= GGUF_MAX_DIMS, "n_dims");
        INVARIANT(sw_type_info(t->type) != NULL, "type");
        INVARIANT(t->offset % f->alignment == 0, "alignment");
        INVARIANT(t->nbytes > 0 && inside(f, t->data, t->nbytes), "tensor %llu data", (unsigned long long)i);
        INVARIANT(gguf_find_tensor(f, t->name) == t, "find tensor");
        const uint8_t *d = t->data;
        if (t->nbytes) sum += d[0] + d[t->nbytes - 1];
    }
    INVARIANT(f->alignment && !(f->alignment & (f->alignment - 1)), "alignment power of two");
    return sum;
}

static volatile uint64_t walk_sum;   /* keeps walk()'s reads */

static bool check(const uint8_t *data, size_t n)
{
    char err[256];
    gguf_file *f = gguf_open_buffer(data, n, err, sizeof err);
    if (!f) {
        INVARIANT(!strncmp(err, "gguf: ", 6), "error without message: '%s'", err);
        return false;
    }
    walk_sum += walk(f);
    gguf_close(f);
    return true;
}

#ifndef SW_LIBFUZZER

static uint8_t *make_seed(size_t *size)
{
    static float f32[8 * 4];
    static uint16_t f16[64 * 2];
    static uint8_t q8[34 * 2 * 2], q4k[144 * 2];
    for (int i = 0; i < 32; i++) f32[i] = (float)i;
    for (int i = 0; i < 128; i++) f16[i] = (uint16_t)(0x3c00 + i);
    memset(q8, 0x11, sizeof q8);
    memset(q4k, 0x22, sizeof q4k);

    gguf_writer *w = gguf_writer_new();
    gguf_w_str(w, "general.architecture", "llama");
    gguf_w_u32(w, "llama.block_count", 2);
    gguf_w_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token", true);
    gguf_w_u64(w, "x.u64", 123456789);
    gguf_w_i32(w, "x.i32", -5);
    int8_t i8 = -3; double f64 = 0.5; uint16_t u16 = 7;
    gguf_w_scalar(w, "x.i8", GGUF_VT_INT8, &i8);
    gguf_w_scalar(w, "x.f64", GGUF_VT_FLOAT64, &f64);
    gguf_w_scalar(w, "x.u16", GGUF_VT_UINT16, &u16);
    const char *toks[] = { "<unk>", "<s>", "</s>", "<0x00>", "\xe2\x96\x81the", "a", "" };
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 7);
    float scores[] = { 0, 0, 0, -1, -2, -3, -4 };
    gguf_w_arr_f32(w, "tokenizer.ggml.scores", scores, 7);
    int32_t types[] = { 2, 3, 3, 6, 1, 1, 1 };
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, 7);
    uint8_t u8s[] = { 1, 2, 3 };
    gguf_w_arr(w, "x.arr_u8", GGUF_VT_UINT8, u8s, 3);
    gguf_w_u32(w, "general.alignment", 32);
    uint64_t ne_a[] = { 8, 4 }, ne_b[] = { 64, 2 }, ne_c[] = { 64, 2 }, ne_d[] = { 256, 2 }, ne_e[] = { 8 };
    gguf_w_tensor(w, "token_embd.weight", SW_TYPE_F32, 2, ne_a, f32);
    gguf_w_tensor(w, "blk.0.attn_q.weight", SW_TYPE_F16, 2, ne_b, f16);
    gguf_w_tensor(w, "blk.0.attn_k.weight", SW_TYPE_Q8_0, 2, ne_c, q8);
    gguf_w_tensor(w, "blk.0.ffn_up.weight", SW_TYPE_Q4_K, 2, ne_d, q4k);
    gguf_w_tensor(w, "output_norm.weight", SW_TYPE_F32, 1, ne_e, f32);
    char path[64], err[256];
    snprintf(path, sizeof path, "/tmp/fuzz_gguf_seed.%d.gguf", (int)getpid());
    bool ok = gguf_writer_write(w, path, err, sizeof err);
    gguf_writer_free(w);
    if (!ok) { fprintf(stderr, "seed: %s\n", err); return NULL; }
    FILE *fp = fopen(path, "rb");
    fseek(fp, 0, SEEK_END);
    *size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = malloc(*size);
    size_t got = fread(b, 1, *size, fp);
    fclose(fp);
    unlink(path);
    if (got != *size) { free(b); return NULL; }
    return b;
}

int main(void)
{
    size_t seed_len;
    uint8_t *seed = make_seed(&seed_len);
    if (!seed) return 2;
    fuzz_seed seeds[] = { { seed, seed_len } };
    int rc = fuzz_main("fuzz_gguf", seeds, 1, check);
    free(seed);
    return rc;
}
#endif
