/* GGUF v2/v3 reader (mmap, bounds-checked) and writer.
 *
 * The reader never trusts the file: every count, length, size and offset is
 * checked for overflow and against the file size before use. A malformed file
 * gets an error message that names the offending field and its byte offset,
 * e.g. "tensor 3 'blk.0.attn_q.weight': data offset 0x... past end of file".
 * Tensor data is used in place from the mapping; nothing is copied.
 */
#ifndef SW_GGUF_H
#define SW_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "quant.h"

/* Metadata value types, numbered as in the GGUF specification. */
typedef enum {
    GGUF_VT_UINT8 = 0, GGUF_VT_INT8 = 1, GGUF_VT_UINT16 = 2, GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4, GGUF_VT_INT32 = 5, GGUF_VT_FLOAT32 = 6, GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9, GGUF_VT_UINT64 = 10, GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12, GGUF_VT_COUNT
} gguf_vtype;

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

typedef struct {
    const char *ptr;   /* points into the mapping: NOT NUL-terminated */
    uint64_t len;
} gguf_str;

/* One metadata key/value. Scalars are decoded into `v`; strings point into the
 * mapping; arrays keep a pointer to their first element in the mapping
 * (string arrays: to the first length prefix, walk with gguf_arr_str).
 * Scalar storage: UINT8/16/32/64 in v.u64, INT8/16/32/64 in v.i64 (sign-
 * extended), FLOAT32/64 in v.f64, BOOL in v.b (any nonzero byte is true). */
typedef struct {
    gguf_str key;
    gguf_vtype type;
    union {
        uint64_t u64; int64_t i64; double f64; bool b; gguf_str str;
        struct {
            gguf_vtype type;   /* element type; never GGUF_VT_ARRAY (nested arrays are rejected) */
            uint64_t n;
            const uint8_t *data;
            /* for string arrays: offsets of each element's length prefix, relative
             * to `data` (n entries), built and bounds-checked at load */
            const uint64_t *str_offsets;
        } arr;
    } v;
} gguf_kv;

typedef struct {
    char name[128];           /* NUL-terminated copy; longer names are rejected */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
    sw_type type;
    uint64_t offset;          /* relative to the start of the data section */
    const void *data;         /* into the mapping */
    uint64_t nbytes;
} gguf_tensor;

typedef struct {
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t alignment;
    const uint8_t *base;      /* the mapping */
    uint64_t size;            /* file size */
    uint64_t data_offset;     /* start of the tensor data section */
    void *priv;               /* reader internals */
} gguf_file;

/* Opens and validates. On failure returns NULL and writes a message to err. */
gguf_file *gguf_open(const char *path, char *err, size_t errlen);
/* Same, over a caller-owned buffer (used by fuzzing; the buffer must outlive the result). */
gguf_file *gguf_open_buffer(const void *buf, size_t size, char *err, size_t errlen);
void gguf_close(gguf_file *f);

const gguf_kv *gguf_find(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters: return false if the key is absent or cannot be represented
 * in the requested type (any integer type converts if it fits). */
bool gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
bool gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
bool gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
bool gguf_get_f32(const gguf_file *f, const char *key, float *out);
bool gguf_get_bool(const gguf_file *f, const char *key, bool *out);
bool gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);
/* Copies a string value into a NUL-terminated buffer; false if absent or truncated. */
bool gguf_get_cstr(const gguf_file *f, const char *key, char *buf, size_t buflen);

/* Array access: element i of an array kv. */
gguf_str gguf_arr_str(const gguf_kv *kv, uint64_t i);
float gguf_arr_f32(const gguf_kv *kv, uint64_t i);    /* from float32 array */
int64_t gguf_arr_int(const gguf_kv *kv, uint64_t i);  /* from any integer array */

const char *gguf_vtype_name(gguf_vtype t);

/* ---- writer ----
 * Usage: w = gguf_writer_new(); add kvs; add tensors (data is copied or
 * referenced until write); gguf_writer_write(w, path, err); gguf_writer_free(w).
 * Writes GGUF v3 with the default alignment (or general.alignment if set). */
typedef struct gguf_writer gguf_writer;
gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
void gguf_w_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_w_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_w_u64(gguf_writer *w, const char *key, uint64_t v);
void gguf_w_f32(gguf_writer *w, const char *key, float v);
void gguf_w_bool(gguf_writer *w, const char *key, bool v);
void gguf_w_str(gguf_writer *w, const char *key, const char *v);
void gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n);
void gguf_w_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n);
void gguf_w_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* Copies an existing kv (any type) from a reader, e.g. when re-quantizing. */
void gguf_w_copy_kv(gguf_writer *w, const gguf_kv *kv);
/* ne as in gguf_tensor. `data` must stay valid until gguf_writer_write returns;
 * its size must equal sw_row_size(type, ne[0]) * ne[1]*ne[2]*ne[3]. */
void gguf_w_tensor(gguf_writer *w, const char *name, sw_type type,
                   uint32_t n_dims, const uint64_t *ne, const void *data);
bool gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errlen);

/* ---- writer additions (additive) ----
 * Setting a key that is already set replaces its value in place (so a copied
 * general.file_type can be updated). Adding two tensors with the same name,
 * an unknown type, or a row that is not a multiple of the block size makes
 * gguf_writer_write fail with a message naming the tensor. The file is
 * written as PATH.tmpPID and renamed over PATH only on success. */

/* Any scalar type except STRING/ARRAY; `value` points to a value of the
 * matching C type (uint8_t, int16_t, double, bool, ...). */
void gguf_w_scalar(gguf_writer *w, const char *key, gguf_vtype type, const void *value);
/* Array of any fixed-size element type (not STRING/ARRAY); data holds n elements. */
void gguf_w_arr(gguf_writer *w, const char *key, gguf_vtype elem_type, const void *data, uint64_t n);

/* Streaming tensors: instead of holding every tensor in memory until write,
 * the writer calls fill(ctx, dst, nbytes, ...) when it reaches this tensor, with
 * a scratch buffer of exactly the tensor's size; fill writes the data there.
 * Only one tensor's data is in memory at a time. Returning false aborts the
 * write (fill should put a message in err). */
typedef bool (*gguf_fill_fn)(void *ctx, void *dst, uint64_t nbytes, char *err, size_t errlen);
void gguf_w_tensor_fn(gguf_writer *w, const char *name, sw_type type,
                      uint32_t n_dims, const uint64_t *ne, gguf_fill_fn fill, void *ctx);

#endif
