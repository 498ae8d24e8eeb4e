/* spillway-quantize: re-encodes a GGUF model's weights.
 *
 *   spillway-quantize IN.gguf OUT.gguf TYPE      TYPE: q4_k_m | q8_0 | f16 | f32
 *
 * All metadata is copied (general.file_type is updated). 2-D weights get the
 * type llm/quant_mix.c picks (the same mix spillway-synth uses); 1-D tensors
 * (norms) become F32. A tensor whose type does not change is copied byte for
 * byte, so nothing is quantized twice; the others are dequantized row by row
 * and quantized again while the writer streams them out, so memory is one
 * output tensor plus one float row per thread.
 */
#include "llm/gguf.h"
#include "llm/quant.h"
#include "llm/quant_mix.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    const gguf_tensor *src;
    sw_type type;
} job;

static bool dequantize_row(void *ctx, uint64_t r, float *x)
{
    const gguf_tensor *s = ((const job *)ctx)->src;
    size_t in_row = sw_row_size(s->type, s->ne[0]);
    return sw_dequantize_row(s->type, (const uint8_t *)s->data + r * in_row, x, (int64_t)s->ne[0]);
}

static bool convert(void *ctx, void *dst, uint64_t nbytes, char *err, size_t errlen)
{
    const job *j = ctx;
    const gguf_tensor *s = j->src;
    if (s->type == j->type) {   /* unchanged: copy, no second rounding */
        memcpy(dst, s->data, nbytes);
        return true;
    }
    uint64_t ne0 = s->ne[0], rows = s->ne[1] * s->ne[2] * s->ne[3];
    if (sw_row_size(j->type, ne0) * rows != nbytes) {
        snprintf(err, errlen, "spillway-quantize: %s: size mismatch", s->name);
        return false;
    }
    if (!sw_quantize_rows(j->type, ne0, rows, dst, dequantize_row, ctx)) {
        snprintf(err, errlen, "spillway-quantize: tensor '%s': cannot convert %s to %s", s->name,
                 sw_type_info(s->type)->name, sw_type_info(j->type)->name);
        return false;
    }
    return true;
}

/* Layer count from "<arch>.block_count", else from the highest blk.N. */
/* Layers (block_count, else the highest "blk.N." + 1), experts, and
 * whether the output is tied to the embedding: what the type mix depends on. */
static sw_mix_model mix_model(const gguf_file *f)
{
    char arch[64], key[128];
    sw_mix_model mm = { 0, 0, !gguf_find_tensor(f, "output.weight") };
    if (gguf_get_cstr(f, "general.architecture", arch, sizeof arch)) {
        snprintf(key, sizeof key, "%s.expert_count", arch);
        if (!gguf_get_u32(f, key, &mm.n_expert)) mm.n_expert = 0;
        snprintf(key, sizeof key, "%s.block_count", arch);
        if (gguf_get_u32(f, key, &mm.n_layers) && mm.n_layers > 0) return mm;
        mm.n_layers = 0;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        unsigned l;
        if (sscanf(f->tensors[i].name, "blk.%u.", &l) == 1 && l + 1 > mm.n_layers) mm.n_layers = l + 1;
    }
    return mm;
}

static void usage(FILE *fp)
{
    fprintf(fp, "usage: spillway-quantize IN.gguf OUT.gguf TYPE    (TYPE: q4_k_m, q8_0, f16, f32)\n");
}

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) { usage(stdout); return 0; }
    if (argc != 4) { usage(stderr); return 2; }
    const char *in = argv[1], *out = argv[2];
    sw_ftype ft;
    if (!sw_ftype_parse(argv[3], &ft)) {
        fprintf(stderr, "spillway-quantize: unknown type '%s' (q4_k_m, q8_0, f16, f32)\n", argv[3]);
        return 2;
    }
    char err[512];
    gguf_file *f = gguf_open(in, err, sizeof err);
    if (!f) { fprintf(stderr, "spillway-quantize: %s\n", err); return 1; }
    const sw_mix_model mm = mix_model(f);

    gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        /* The writer takes general.alignment as u32 only; the reader accepts any unsigned type. */
        if (kv->key.len == 17 && !memcmp(kv->key.ptr, "general.alignment", 17))
            gguf_w_u32(w, "general.alignment", (uint32_t)f->alignment);
        else
            gguf_w_copy_kv(w, kv);
    }
    gguf_w_u32(w, "general.file_type", ft);
    gguf_w_u32(w, "general.quantization_version", 2);

    job *jobs = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *jobs);
    uint64_t in_bytes = 0, out_bytes = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        jobs[i].src = t;
        jobs[i].type = sw_mix_type(ft, t->name, t->n_dims, t->ne, &mm);
        in_bytes += t->nbytes;
        out_bytes += sw_row_size(jobs[i].type, t->ne[0]) * t->ne[1] * t->ne[2] * t->ne[3];
        gguf_w_tensor_fn(w, t->name, jobs[i].type, t->n_dims, t->ne, convert, &jobs[i]);
    }
    bool ok = gguf_writer_write(w, out, err, sizeof err);
    gguf_writer_free(w);
    free(jobs);
    uint64_t n_tensors = f->n_tensors;
    gguf_close(f);
    if (!ok) { fprintf(stderr, "spillway-quantize: %s\n", err); return 1; }
    fprintf(stderr, "spillway-quantize: %s -> %s (%s): %llu tensors, %.1f MiB -> %.1f MiB\n", in, out,
            sw_ftype_name(ft), (unsigned long long)n_tensors, in_bytes / 1048576.0, out_bytes / 1048576.0);
    return 0;
}
