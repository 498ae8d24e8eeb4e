/* GGUF v2/v3 reader and v3 writer.
 *
 * File layout (little-endian):
 *   "GGUF" u32 version u64 n_tensors u64 n_kv
 *   n_kv x { string key, u32 value_type, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset }
 *   padding to `alignment`, then the data section; tensor offsets are
 *   relative to its start and multiples of `alignment`.
 *   string = u64 length + bytes (no NUL); array = u32 elem_type, u64 n, elements.
 *
 * The reader walks the file with a cursor that never reads past the end and
 * turns every failure into a message naming the field and its byte offset.
 * Counts are checked against the bytes that remain BEFORE anything is
 * allocated, so a 2 KB file cannot make us allocate terabytes.
 */
#include "llm/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_NAME_MAX 127          /* gguf_tensor.name is char[128] */
/* Smallest possible encodings, used to reject absurd counts up front:
 * a kv is at least key length (8) + type (4) + a 1-byte value = 13 bytes;
 * a tensor info at least name length (8) + n_dims (4) + type (4) + offset (8). */
#define MIN_KV_BYTES 12
#define MIN_TENSOR_INFO_BYTES 24

typedef unsigned long long ull;

/* Fixed element sizes; 0 for STRING and ARRAY (variable). */
static const uint8_t vt_size[GGUF_VT_COUNT] = {
    [GGUF_VT_UINT8] = 1, [GGUF_VT_INT8] = 1, [GGUF_VT_UINT16] = 2, [GGUF_VT_INT16] = 2,
    [GGUF_VT_UINT32] = 4, [GGUF_VT_INT32] = 4, [GGUF_VT_FLOAT32] = 4, [GGUF_VT_BOOL] = 1,
    [GGUF_VT_STRING] = 0, [GGUF_VT_ARRAY] = 0, [GGUF_VT_UINT64] = 8, [GGUF_VT_INT64] = 8,
    [GGUF_VT_FLOAT64] = 8,
};

const char *gguf_vtype_name(gguf_vtype t)
{
    static const char *names[GGUF_VT_COUNT] = {
        "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
        "string", "array", "uint64", "int64", "float64",
    };
    return (unsigned)t < GGUF_VT_COUNT ? names[t] : "unknown";
}

static bool vt_is_unsigned(gguf_vtype t)
{
    return t == GGUF_VT_UINT8 || t == GGUF_VT_UINT16 || t == GGUF_VT_UINT32 || t == GGUF_VT_UINT64;
}
static bool vt_is_signed(gguf_vtype t)
{
    return t == GGUF_VT_INT8 || t == GGUF_VT_INT16 || t == GGUF_VT_INT32 || t == GGUF_VT_INT64;
}

/* ------------------------------------------------------------------ */
/* Name -> index hash (open addressing), for duplicate detection and lookup. */

typedef struct {
    uint64_t *slots;   /* index + 1; 0 = empty */
    uint64_t mask;
} name_index;

static uint64_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static bool index_init(name_index *ix, uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    ix->slots = calloc(cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    return ix->slots != NULL;
}

/* ------------------------------------------------------------------ */
/* Reader */

typedef struct {
    void *map;           /* our mapping, if gguf_open made it */
    size_t maplen;
    name_index kv_ix, t_ix;
} gguf_priv;

typedef struct {
    const uint8_t *b;
    uint64_t size, pos;
    char *err;
    size_t errlen;
    const char *label;   /* file name, for messages */
} cursor;

static bool fail(cursor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(cursor *c, const char *fmt, ...)
{
    if (!c->err || !c->errlen) return false;
    int n = c->label ? snprintf(c->err, c->errlen, "gguf: %s: ", c->label)
                     : snprintf(c->err, c->errlen, "gguf: ");
    if (n < 0 || (size_t)n >= c->errlen) return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return false;
}

static uint64_t remaining(const cursor *c) { return c->size - c->pos; }

static const uint8_t *take(cursor *c, uint64_t n)
{
    if (remaining(c) < n) return NULL;
    const uint8_t *p = c->b + c->pos;
    c->pos += n;
    return p;
}

static uint64_t load_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Reads an n-byte little-endian integer; `what` names the field for the error. */
static bool rd_int(cursor *c, int n, uint64_t *out, const char *what)
{
    uint64_t at = c->pos;
    const uint8_t *p = take(c, (uint64_t)n);
    *out = 0;
    if (!p)
        return fail(c, "%s at offset 0x%llx: file ends at 0x%llx (truncated)", what, (ull)at, (ull)c->size);
    *out = load_le(p, n);
    return true;
}

/* Reads a string; maxlen bounds it further than the file does (names). */
static bool rd_str(cursor *c, gguf_str *s, const char *what)
{
    uint64_t at = c->pos, len;
    if (!rd_int(c, 8, &len, what)) return false;
    if (len > remaining(c))
        return fail(c, "%s at offset 0x%llx: length %llu extends past end of file (size 0x%llx)",
                    what, (ull)at, (ull)len, (ull)c->size);
    s->len = len;
    s->ptr = (const char *)take(c, len);
    return true;
}

/* "kv 3 'general.name'" into buf, for messages. Key may be unprintable garbage. */
static const char *kv_desc(char *buf, size_t n, uint64_t i, const gguf_str *key)
{
    int klen = key && key->len < 80 ? (int)key->len : 80;
    if (key && key->ptr)
        snprintf(buf, n, "kv %llu '%.*s'", (ull)i, klen, key->ptr);
    else
        snprintf(buf, n, "kv %llu", (ull)i);
    return buf;
}

static bool decode_scalar(gguf_kv *kv, gguf_vtype t, const uint8_t *p)
{
    uint64_t raw = load_le(p, vt_size[t]);
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_UINT16: case GGUF_VT_UINT32: case GGUF_VT_UINT64:
        kv->v.u64 = raw; break;
    case GGUF_VT_INT8:  kv->v.i64 = (int8_t)raw; break;
    case GGUF_VT_INT16: kv->v.i64 = (int16_t)raw; break;
    case GGUF_VT_INT32: kv->v.i64 = (int32_t)raw; break;
    case GGUF_VT_INT64: kv->v.i64 = (int64_t)raw; break;
    case GGUF_VT_FLOAT32: { float f; uint32_t u = (uint32_t)raw; memcpy(&f, &u, 4); kv->v.f64 = f; break; }
    case GGUF_VT_FLOAT64: { double d; memcpy(&d, &raw, 8); kv->v.f64 = d; break; }
    case GGUF_VT_BOOL: kv->v.b = raw != 0; break;
    default: return false;
    }
    return true;
}

static bool parse_array(cursor *c, uint64_t i, gguf_kv *kv)
{
    char d[160];
    uint64_t at = c->pos, et, n;
    kv_desc(d, sizeof d, i, &kv->key);
    if (!rd_int(c, 4, &et, "array element type")) return false;
    if (et == GGUF_VT_ARRAY)
        return fail(c, "%s: nested arrays are not supported (element type at offset 0x%llx)", d, (ull)at);
    if (et >= GGUF_VT_COUNT)
        return fail(c, "%s: unknown array element type %llu at offset 0x%llx", d, (ull)et, (ull)at);
    at = c->pos;
    if (!rd_int(c, 8, &n, "array length")) return false;
    kv->v.arr.type = (gguf_vtype)et;
    kv->v.arr.n = n;
    kv->v.arr.data = c->b + c->pos;
    kv->v.arr.str_offsets = NULL;
    if (et != GGUF_VT_STRING) {
        uint64_t es = vt_size[et];
        if (n > remaining(c) / es)
            return fail(c, "%s: array of %llu %s at offset 0x%llx extends past end of file (size 0x%llx)",
                        d, (ull)n, gguf_vtype_name((gguf_vtype)et), (ull)at, (ull)c->size);
        take(c, n * es);
        return true;
    }
    /* Each string needs at least its 8-byte length prefix. */
    if (n > remaining(c) / 8)
        return fail(c, "%s: string array count %llu at offset 0x%llx is absurd for a %llu-byte file",
                    d, (ull)n, (ull)at, (ull)c->size);
    if (n == 0) return true;
    uint64_t *offs = malloc(n * sizeof *offs);
    if (!offs) return fail(c, "%s: out of memory for %llu string offsets", d, (ull)n);
    kv->v.arr.str_offsets = offs;   /* owned by the kv; freed in gguf_close */
    uint64_t base = c->pos;
    for (uint64_t j = 0; j < n; j++) {
        uint64_t sat = c->pos, len;
        offs[j] = sat - base;
        if (!rd_int(c, 8, &len, "string length")) return false;
        if (len > remaining(c))
            return fail(c, "%s: element %llu length %llu at offset 0x%llx extends past end of file (size 0x%llx)",
                        d, (ull)j, (ull)len, (ull)sat, (ull)c->size);
        take(c, len);
    }
    return true;
}

static bool parse_kv(cursor *c, uint64_t i, gguf_kv *kv)
{
    char d[160];
    uint64_t at = c->pos, t;
    snprintf(d, sizeof d, "kv %llu key", (ull)i);
    if (!rd_str(c, &kv->key, d)) return false;
    if (kv->key.len == 0) return fail(c, "kv %llu: empty key at offset 0x%llx", (ull)i, (ull)at);
    kv_desc(d, sizeof d, i, &kv->key);
    at = c->pos;
    if (!rd_int(c, 4, &t, "value type")) return false;
    if (t >= GGUF_VT_COUNT)
        return fail(c, "%s: unknown value type %llu at offset 0x%llx", d, (ull)t, (ull)at);
    kv->type = (gguf_vtype)t;
    at = c->pos;
    if (t == GGUF_VT_STRING) {
        strncat(d, " value", sizeof d - strlen(d) - 1);
        return rd_str(c, &kv->v.str, d);
    }
    if (t == GGUF_VT_ARRAY) return parse_array(c, i, kv);
    const uint8_t *p = take(c, vt_size[t]);
    if (!p)
        return fail(c, "%s: %s value at offset 0x%llx: file ends at 0x%llx (truncated)",
                    d, gguf_vtype_name(kv->type), (ull)at, (ull)c->size);
    return decode_scalar(kv, kv->type, p);
}

static bool parse_tensor_info(cursor *c, uint64_t i, gguf_tensor *t, uint64_t alignment)
{
    char d[200];
    gguf_str name;
    uint64_t at = c->pos, v;
    snprintf(d, sizeof d, "tensor %llu name", (ull)i);
    if (!rd_str(c, &name, d)) return false;
    if (name.len == 0) return fail(c, "tensor %llu: empty name at offset 0x%llx", (ull)i, (ull)at);
    if (name.len > GGUF_NAME_MAX)
        return fail(c, "tensor %llu: name length %llu at offset 0x%llx exceeds %d",
                    (ull)i, (ull)name.len, (ull)at, GGUF_NAME_MAX);
    if (memchr(name.ptr, 0, name.len))
        return fail(c, "tensor %llu: name at offset 0x%llx contains a NUL byte", (ull)i, (ull)at);
    memcpy(t->name, name.ptr, name.len);
    t->name[name.len] = 0;
    snprintf(d, sizeof d, "tensor %llu '%s'", (ull)i, t->name);

    at = c->pos;
    if (!rd_int(c, 4, &v, "tensor n_dims")) return false;
    if (v > GGUF_MAX_DIMS)
        return fail(c, "%s: n_dims %llu at offset 0x%llx exceeds %d", d, (ull)v, (ull)at, GGUF_MAX_DIMS);
    t->n_dims = (uint32_t)v;
    uint64_t nel = 1;
    for (int j = 0; j < GGUF_MAX_DIMS; j++) t->ne[j] = 1;
    for (uint32_t j = 0; j < t->n_dims; j++) {
        at = c->pos;
        if (!rd_int(c, 8, &v, "tensor dimension")) return false;
        if (v == 0)
            return fail(c, "%s: ne[%u] is 0 at offset 0x%llx", d, j, (ull)at);
        if (v > (uint64_t)INT64_MAX || nel > (uint64_t)INT64_MAX / v)
            return fail(c, "%s: ne[%u] = %llu at offset 0x%llx overflows the element count",
                        d, j, (ull)v, (ull)at);
        t->ne[j] = v;
        nel *= v;
    }
    at = c->pos;
    if (!rd_int(c, 4, &v, "tensor type")) return false;
    const sw_type_traits *tr = sw_type_info((uint32_t)v);
    if (!tr)
        return fail(c, "%s: unknown or unsupported tensor type %llu at offset 0x%llx", d, (ull)v, (ull)at);
    t->type = (sw_type)v;
    /* Guard sw_row_size's multiplication ourselves: blocks * type_size must not wrap. */
    if (t->ne[0] / tr->block_size > SIZE_MAX / tr->type_size)
        return fail(c, "%s: row of %llu elements overflows the byte size", d, (ull)t->ne[0]);
    size_t row = sw_row_size(t->type, t->ne[0]);
    if (row == 0)
        return fail(c, "%s: ne[0] = %llu is not a multiple of the %s block size %u (type at offset 0x%llx)",
                    d, (ull)t->ne[0], tr->name, tr->block_size, (ull)at);
    uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3];   /* cannot overflow: <= nel */
    if (rows > UINT64_MAX / row)
        return fail(c, "%s: data size overflows (%llu rows of %zu bytes)", d, (ull)rows, row);
    t->nbytes = rows * row;
    at = c->pos;
    if (!rd_int(c, 8, &t->offset, "tensor data offset")) return false;
    if (t->offset % alignment)
        return fail(c, "%s: data offset 0x%llx (field at 0x%llx) is not a multiple of the alignment %llu",
                    d, (ull)t->offset, (ull)at, (ull)alignment);
    return true;
}

/* general.alignment: any integer type that fits, nonzero power of two. */
static bool read_alignment(cursor *c, gguf_file *f)
{
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find(f, "general.alignment");
    if (!kv) return true;
    uint64_t a;
    if (vt_is_unsigned(kv->type)) a = kv->v.u64;
    else if (vt_is_signed(kv->type) && kv->v.i64 > 0) a = (uint64_t)kv->v.i64;
    else return fail(c, "general.alignment has type %s, expected an unsigned integer",
                     gguf_vtype_name(kv->type));
    if (a == 0 || (a & (a - 1)) || a > (1u << 30))
        return fail(c, "general.alignment = %llu is not a power of two in 1..2^30", (ull)a);
    f->alignment = a;
    return true;
}

static bool index_kvs(cursor *c, gguf_file *f)
{
    gguf_priv *pv = f->priv;
    if (!index_init(&pv->kv_ix, f->n_kv)) return fail(c, "out of memory");
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_str *k = &f->kv[i].key;
        uint64_t h = hash_bytes(k->ptr, k->len) & pv->kv_ix.mask;
        for (;; h = (h + 1) & pv->kv_ix.mask) {
            uint64_t s = pv->kv_ix.slots[h];
            if (!s) { pv->kv_ix.slots[h] = i + 1; break; }
            const gguf_str *o = &f->kv[s - 1].key;
            if (o->len == k->len && !memcmp(o->ptr, k->ptr, k->len)) {
                char d[160];
                return fail(c, "%s: duplicate key (first defined by kv %llu)",
                            kv_desc(d, sizeof d, i, k), (ull)(s - 1));
            }
        }
    }
    return true;
}

static bool index_tensors(cursor *c, gguf_file *f)
{
    gguf_priv *pv = f->priv;
    if (!index_init(&pv->t_ix, f->n_tensors)) return fail(c, "out of memory");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const char *n = f->tensors[i].name;
        uint64_t h = hash_bytes(n, strlen(n)) & pv->t_ix.mask;
        for (;; h = (h + 1) & pv->t_ix.mask) {
            uint64_t s = pv->t_ix.slots[h];
            if (!s) { pv->t_ix.slots[h] = i + 1; break; }
            if (!strcmp(f->tensors[s - 1].name, n))
                return fail(c, "tensor %llu '%s': duplicate name (first defined by tensor %llu)",
                            (ull)i, n, (ull)(s - 1));
        }
    }
    return true;
}

static bool parse_header(cursor *c, gguf_file *f)
{
    const uint8_t *m = take(c, 4);
    if (!m) return fail(c, "header: file is %llu bytes, too short for the magic", (ull)c->size);
    if (memcmp(m, GGUF_MAGIC, 4))
        return fail(c, "header: bad magic %02x %02x %02x %02x at offset 0 (expected \"GGUF\")",
                    m[0], m[1], m[2], m[3]);
    uint64_t v;
    if (!rd_int(c, 4, &v, "header: version")) return false;
    if (v != 2 && v != 3) {
        if (v == 1) return fail(c, "header: version 1 at offset 4 is not supported (only 2 and 3)");
        if ((v & 0xffff) == 0 && v != 0)
            return fail(c, "header: version 0x%llx at offset 4 looks big-endian; only little-endian files are supported",
                        (ull)v);
        return fail(c, "header: unsupported version %llu at offset 4 (expected 2 or 3)", (ull)v);
    }
    f->version = (uint32_t)v;
    if (!rd_int(c, 8, &f->n_tensors, "header: tensor count")) return false;
    if (!rd_int(c, 8, &f->n_kv, "header: kv count")) return false;
    if (f->n_tensors > remaining(c) / MIN_TENSOR_INFO_BYTES)
        return fail(c, "header: tensor count %llu at offset 8 is absurd for a %llu-byte file",
                    (ull)f->n_tensors, (ull)c->size);
    if (f->n_kv > remaining(c) / MIN_KV_BYTES)
        return fail(c, "header: kv count %llu at offset 16 is absurd for a %llu-byte file",
                    (ull)f->n_kv, (ull)c->size);
    if (f->n_kv * MIN_KV_BYTES + f->n_tensors * MIN_TENSOR_INFO_BYTES > remaining(c))
        return fail(c, "header: %llu kvs and %llu tensors cannot fit in a %llu-byte file",
                    (ull)f->n_kv, (ull)f->n_tensors, (ull)c->size);
    return true;
}

/* Places the data section and checks each tensor's bytes lie inside the file. */
static bool place_data(cursor *c, gguf_file *f)
{
    uint64_t end_meta = c->pos, a = f->alignment;
    uint64_t start = (end_meta + a - 1) / a * a;   /* end_meta < 2^63, a <= 2^30: no overflow */
    if (f->n_tensors == 0) {
        /* Vocab-only files may end without the padding. */
        f->data_offset = start < f->size ? start : f->size;
        return true;
    }
    if (start > f->size)
        return fail(c, "data section would start at 0x%llx (metadata ends at 0x%llx, alignment %llu), "
                    "past end of file (size 0x%llx)", (ull)start, (ull)end_meta, (ull)a, (ull)f->size);
    f->data_offset = start;
    uint64_t avail = f->size - start;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return fail(c, "tensor %llu '%s' data [off 0x%llx, %llu bytes] extends past end of file (size 0x%llx)",
                        (ull)i, t->name, (ull)(start + t->offset), (ull)t->nbytes, (ull)f->size);
        t->data = f->base + start + t->offset;
    }
    return true;
}

static gguf_file *parse(const uint8_t *buf, uint64_t size, const char *label, char *err, size_t errlen)
{
    cursor c = { .b = buf, .size = size, .pos = 0, .err = err, .errlen = errlen, .label = label };
    if (err && errlen) err[0] = 0;
    gguf_file *f = calloc(1, sizeof *f);
    gguf_priv *pv = calloc(1, sizeof *pv);
    if (!f || !pv) { free(f); free(pv); fail(&c, "out of memory"); return NULL; }
    f->priv = pv;
    f->base = buf;
    f->size = size;
    if (!parse_header(&c, f)) goto bad;
    /* Counts are bounded by the file size now, so these allocations are sane. */
    f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors) { fail(&c, "out of memory"); goto bad; }
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (!parse_kv(&c, i, &f->kv[i])) { f->n_kv = i + 1; goto bad; }
    if (!index_kvs(&c, f) || !read_alignment(&c, f)) goto bad;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (!parse_tensor_info(&c, i, &f->tensors[i], f->alignment)) goto bad;
    if (!index_tensors(&c, f) || !place_data(&c, f)) goto bad;
    return f;
bad:
    gguf_close(f);
    return NULL;
}

gguf_file *gguf_open_buffer(const void *buf, size_t size, char *err, size_t errlen)
{
    static const uint8_t empty[1];
    return parse(buf ? buf : empty, buf ? size : 0, NULL, err, errlen);
}

gguf_file *gguf_open(const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (err && errlen) snprintf(err, errlen, "gguf: %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (err && errlen) snprintf(err, errlen, "gguf: %s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size == 0) {
        if (err && errlen) snprintf(err, errlen, "gguf: %s: file is empty", path);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);   /* the mapping keeps the file alive */
    if (map == MAP_FAILED) {
        if (err && errlen) snprintf(err, errlen, "gguf: %s: mmap: %s", path, strerror(e));
        return NULL;
    }
    gguf_file *f = parse(map, len, path, err, errlen);
    if (!f) { munmap(map, len); return NULL; }
    gguf_priv *pv = f->priv;
    pv->map = map;
    pv->maplen = len;
    return f;
}

void gguf_close(gguf_file *f)
{
    if (!f) return;
    gguf_priv *pv = f->priv;
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++)
            if (f->kv[i].type == GGUF_VT_ARRAY) free((void *)f->kv[i].v.arr.str_offsets);
    free(f->kv);
    free(f->tensors);
    if (pv) {
        free(pv->kv_ix.slots);
        free(pv->t_ix.slots);
        if (pv->map) munmap(pv->map, pv->maplen);
        free(pv);
    }
    free(f);
}

const gguf_kv *gguf_find(const gguf_file *f, const char *key)
{
    if (!f || !key) return NULL;
    const gguf_priv *pv = f->priv;
    size_t n = strlen(key);
    if (!pv->kv_ix.slots) return NULL;
    for (uint64_t h = hash_bytes(key, n) & pv->kv_ix.mask;; h = (h + 1) & pv->kv_ix.mask) {
        uint64_t s = pv->kv_ix.slots[h];
        if (!s) return NULL;
        const gguf_kv *kv = &f->kv[s - 1];
        if (kv->key.len == n && !memcmp(kv->key.ptr, key, n)) return kv;
    }
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    if (!f || !name) return NULL;
    const gguf_priv *pv = f->priv;
    if (!pv->t_ix.slots) return NULL;
    for (uint64_t h = hash_bytes(name, strlen(name)) & pv->t_ix.mask;; h = (h + 1) & pv->t_ix.mask) {
        uint64_t s = pv->t_ix.slots[h];
        if (!s) return NULL;
        if (!strcmp(f->tensors[s - 1].name, name)) return &f->tensors[s - 1];
    }
}

/* ---- typed getters ---- */

bool gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return false;
    if (vt_is_unsigned(kv->type)) { *out = kv->v.u64; return true; }
    if (vt_is_signed(kv->type) && kv->v.i64 >= 0) { *out = (uint64_t)kv->v.i64; return true; }
    return false;
}

bool gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out)
{
    uint64_t v;
    if (!gguf_get_u64(f, key, &v) || v > UINT32_MAX) return false;
    *out = (uint32_t)v;
    return true;
}

bool gguf_get_i64(const gguf_file *f, const char *key, int64_t *out)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return false;
    if (vt_is_signed(kv->type)) { *out = kv->v.i64; return true; }
    if (vt_is_unsigned(kv->type) && kv->v.u64 <= (uint64_t)INT64_MAX) { *out = (int64_t)kv->v.u64; return true; }
    return false;
}

bool gguf_get_f32(const gguf_file *f, const char *key, float *out)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return false;
    if (kv->type == GGUF_VT_FLOAT32 || kv->type == GGUF_VT_FLOAT64) { *out = (float)kv->v.f64; return true; }
    if (vt_is_signed(kv->type)) { *out = (float)kv->v.i64; return true; }
    if (vt_is_unsigned(kv->type)) { *out = (float)kv->v.u64; return true; }
    return false;
}

bool gguf_get_bool(const gguf_file *f, const char *key, bool *out)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->type != GGUF_VT_BOOL) return false;
    *out = kv->v.b;
    return true;
}

bool gguf_get_str(const gguf_file *f, const char *key, gguf_str *out)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->type != GGUF_VT_STRING) return false;
    *out = kv->v.str;
    return true;
}

bool gguf_get_cstr(const gguf_file *f, const char *key, char *buf, size_t buflen)
{
    gguf_str s;
    if (!buf || !buflen || !gguf_get_str(f, key, &s) || s.len >= buflen) return false;
    memcpy(buf, s.ptr, s.len);
    buf[s.len] = 0;
    return true;
}

/* ---- arrays ---- */

gguf_str gguf_arr_str(const gguf_kv *kv, uint64_t i)
{
    gguf_str s = { NULL, 0 };
    if (!kv || kv->type != GGUF_VT_ARRAY || kv->v.arr.type != GGUF_VT_STRING || i >= kv->v.arr.n)
        return s;
    const uint8_t *p = kv->v.arr.data + kv->v.arr.str_offsets[i];
    s.len = load_le(p, 8);
    s.ptr = (const char *)p + 8;
    return s;
}

float gguf_arr_f32(const gguf_kv *kv, uint64_t i)
{
    if (!kv || kv->type != GGUF_VT_ARRAY || i >= kv->v.arr.n) return 0.0f;
    const uint8_t *p = kv->v.arr.data;
    if (kv->v.arr.type == GGUF_VT_FLOAT32) {
        uint32_t u = (uint32_t)load_le(p + 4 * i, 4);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    if (kv->v.arr.type == GGUF_VT_FLOAT64) {
        uint64_t u = load_le(p + 8 * i, 8);
        double d;
        memcpy(&d, &u, 8);
        return (float)d;
    }
    return 0.0f;
}

int64_t gguf_arr_int(const gguf_kv *kv, uint64_t i)
{
    if (!kv || kv->type != GGUF_VT_ARRAY || i >= kv->v.arr.n) return 0;
    gguf_vtype t = kv->v.arr.type;
    if (!vt_is_signed(t) && !vt_is_unsigned(t) && t != GGUF_VT_BOOL) return 0;
    int n = vt_size[t];
    uint64_t raw = load_le(kv->v.arr.data + (uint64_t)n * i, n);
    switch (t) {
    case GGUF_VT_INT8: return (int8_t)raw;
    case GGUF_VT_INT16: return (int16_t)raw;
    case GGUF_VT_INT32: return (int32_t)raw;
    default: return (int64_t)raw;
    }
}

/* ------------------------------------------------------------------ */
/* Writer */

typedef struct { uint8_t *p; size_t len, cap; bool oom; } bytes;

static void b_put(bytes *b, const void *src, size_t n)
{
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void b_le(bytes *b, uint64_t v, int n)
{
    uint8_t t[8];
    for (int i = 0; i < n; i++) t[i] = (uint8_t)(v >> (8 * i));
    b_put(b, t, (size_t)n);
}
static void b_str(bytes *b, const char *s, size_t n) { b_le(b, n, 8); b_put(b, s, n); }

typedef struct {
    char *key;
    bytes val;   /* u32 type + encoded value */
} wkv;

typedef struct {
    char name[GGUF_NAME_MAX + 1];
    sw_type type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes, offset;
    const void *data;
    gguf_fill_fn fill;
    void *ctx;
} wtensor;

struct gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
    char err[256];   /* first error while building; reported by write */
};

static void w_fail(gguf_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void w_fail(gguf_writer *w, const char *fmt, ...)
{
    if (w->err[0]) return;   /* keep the first */
    int n = snprintf(w->err, sizeof w->err, "gguf writer: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err + n, sizeof w->err - (size_t)n, fmt, ap);
    va_end(ap);
}

gguf_writer *gguf_writer_new(void) { return calloc(1, sizeof(gguf_writer)); }

void gguf_writer_free(gguf_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) { free(w->kv[i].key); free(w->kv[i].val.p); }
    free(w->kv);
    free(w->t);
    free(w);
}

/* Returns the value buffer for key, emptied; a repeated key replaces the old value. */
static bytes *w_slot(gguf_writer *w, const char *key, gguf_vtype type)
{
    if (!key || !*key) { w_fail(w, "empty key"); return NULL; }
    for (size_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) {
            w->kv[i].val.len = 0;
            b_le(&w->kv[i].val, type, 4);
            return &w->kv[i].val;
        }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
        wkv *p = realloc(w->kv, cap * sizeof *p);
        if (!p) { w_fail(w, "out of memory"); return NULL; }
        w->kv = p;
        w->cap_kv = cap;
    }
    wkv *kv = &w->kv[w->n_kv];
    memset(kv, 0, sizeof *kv);
    kv->key = strdup(key);
    if (!kv->key) { w_fail(w, "out of memory"); return NULL; }
    w->n_kv++;
    b_le(&kv->val, type, 4);
    return &kv->val;
}

void gguf_w_scalar(gguf_writer *w, const char *key, gguf_vtype type, const void *value)
{
    if ((unsigned)type >= GGUF_VT_COUNT || type == GGUF_VT_STRING || type == GGUF_VT_ARRAY) {
        w_fail(w, "key '%s': gguf_w_scalar cannot write type %s", key ? key : "", gguf_vtype_name(type));
        return;
    }
    bytes *b = w_slot(w, key, type);
    if (!b) return;
    if (type == GGUF_VT_BOOL) { uint8_t v = *(const bool *)value ? 1 : 0; b_put(b, &v, 1); }
    else b_put(b, value, vt_size[type]);   /* host is little-endian (x86-64 / aarch64) */
}

void gguf_w_u32(gguf_writer *w, const char *key, uint32_t v) { gguf_w_scalar(w, key, GGUF_VT_UINT32, &v); }
void gguf_w_i32(gguf_writer *w, const char *key, int32_t v) { gguf_w_scalar(w, key, GGUF_VT_INT32, &v); }
void gguf_w_u64(gguf_writer *w, const char *key, uint64_t v) { gguf_w_scalar(w, key, GGUF_VT_UINT64, &v); }
void gguf_w_f32(gguf_writer *w, const char *key, float v) { gguf_w_scalar(w, key, GGUF_VT_FLOAT32, &v); }
void gguf_w_bool(gguf_writer *w, const char *key, bool v) { gguf_w_scalar(w, key, GGUF_VT_BOOL, &v); }

void gguf_w_str(gguf_writer *w, const char *key, const char *v)
{
    bytes *b = w_slot(w, key, GGUF_VT_STRING);
    if (b) b_str(b, v ? v : "", v ? strlen(v) : 0);
}

void gguf_w_arr(gguf_writer *w, const char *key, gguf_vtype et, const void *data, uint64_t n)
{
    if ((unsigned)et >= GGUF_VT_COUNT || et == GGUF_VT_STRING || et == GGUF_VT_ARRAY) {
        w_fail(w, "key '%s': gguf_w_arr cannot write element type %s", key ? key : "", gguf_vtype_name(et));
        return;
    }
    bytes *b = w_slot(w, key, GGUF_VT_ARRAY);
    if (!b) return;
    b_le(b, et, 4);
    b_le(b, n, 8);
    if (et == GGUF_VT_BOOL) {
        const bool *v = data;
        for (uint64_t i = 0; i < n; i++) { uint8_t x = v[i] ? 1 : 0; b_put(b, &x, 1); }
    } else {
        b_put(b, data, (size_t)(n * vt_size[et]));
    }
}

void gguf_w_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    bytes *b = w_slot(w, key, GGUF_VT_ARRAY);
    if (!b) return;
    b_le(b, GGUF_VT_STRING, 4);
    b_le(b, n, 8);
    for (uint64_t i = 0; i < n; i++) b_str(b, v[i] ? v[i] : "", v[i] ? strlen(v[i]) : 0);
}

void gguf_w_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    gguf_w_arr(w, key, GGUF_VT_FLOAT32, v, n);
}
void gguf_w_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    gguf_w_arr(w, key, GGUF_VT_INT32, v, n);
}

void gguf_w_copy_kv(gguf_writer *w, const gguf_kv *kv)
{
    char key[512];
    if (!kv || kv->key.len >= sizeof key) { w_fail(w, "copy_kv: missing kv or key too long"); return; }
    memcpy(key, kv->key.ptr, kv->key.len);
    key[kv->key.len] = 0;
    bytes *b;
    switch (kv->type) {
    case GGUF_VT_STRING:
        b = w_slot(w, key, GGUF_VT_STRING);
        if (b) b_str(b, kv->v.str.ptr, kv->v.str.len);
        return;
    case GGUF_VT_ARRAY:
        b = w_slot(w, key, GGUF_VT_ARRAY);
        if (!b) return;
        b_le(b, kv->v.arr.type, 4);
        b_le(b, kv->v.arr.n, 8);
        if (kv->v.arr.type == GGUF_VT_STRING) {
            for (uint64_t i = 0; i < kv->v.arr.n; i++) {
                gguf_str s = gguf_arr_str(kv, i);
                b_str(b, s.ptr, s.len);
            }
        } else {
            b_put(b, kv->v.arr.data, (size_t)(kv->v.arr.n * vt_size[kv->v.arr.type]));
        }
        return;
    case GGUF_VT_BOOL:
        gguf_w_bool(w, key, kv->v.b);
        return;
    case GGUF_VT_FLOAT32: { float f = (float)kv->v.f64; gguf_w_scalar(w, key, kv->type, &f); return; }
    case GGUF_VT_FLOAT64: gguf_w_scalar(w, key, kv->type, &kv->v.f64); return;
    default:
        if (vt_is_unsigned(kv->type)) gguf_w_scalar(w, key, kv->type, &kv->v.u64);      /* low bytes: LE */
        else if (vt_is_signed(kv->type)) gguf_w_scalar(w, key, kv->type, &kv->v.i64);
        else w_fail(w, "copy_kv '%s': bad type %d", key, (int)kv->type);
    }
}

static wtensor *w_add_tensor(gguf_writer *w, const char *name, sw_type type,
                             uint32_t n_dims, const uint64_t *ne)
{
    if (!name || !*name || strlen(name) > GGUF_NAME_MAX) {
        w_fail(w, "tensor name '%s' is empty or longer than %d", name ? name : "", GGUF_NAME_MAX);
        return NULL;
    }
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) { w_fail(w, "duplicate tensor '%s'", name); return NULL; }
    if (n_dims > GGUF_MAX_DIMS) { w_fail(w, "tensor '%s': n_dims %u > %d", name, n_dims, GGUF_MAX_DIMS); return NULL; }
    const sw_type_traits *tr = sw_type_info(type);
    if (!tr) { w_fail(w, "tensor '%s': unknown type %d", name, (int)type); return NULL; }
    uint64_t d[GGUF_MAX_DIMS] = { 1, 1, 1, 1 };
    for (uint32_t j = 0; j < n_dims; j++) {
        if (ne[j] == 0) { w_fail(w, "tensor '%s': ne[%u] is 0", name, j); return NULL; }
        d[j] = ne[j];
    }
    size_t row = d[0] / tr->block_size > SIZE_MAX / tr->type_size ? 0 : sw_row_size(type, d[0]);
    if (!row) {
        w_fail(w, "tensor '%s': ne[0] = %llu is not a multiple of the %s block size %u",
               name, (ull)d[0], tr->name, tr->block_size);
        return NULL;
    }
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor *p = realloc(w->t, cap * sizeof *p);
        if (!p) { w_fail(w, "out of memory"); return NULL; }
        w->t = p;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t++];
    memset(t, 0, sizeof *t);
    strcpy(t->name, name);
    t->type = type;
    t->n_dims = n_dims;
    memcpy(t->ne, d, sizeof d);
    t->nbytes = row * d[1] * d[2] * d[3];
    return t;
}

void gguf_w_tensor(gguf_writer *w, const char *name, sw_type type,
                   uint32_t n_dims, const uint64_t *ne, const void *data)
{
    wtensor *t = w_add_tensor(w, name, type, n_dims, ne);
    if (t) t->data = data;
}

void gguf_w_tensor_fn(gguf_writer *w, const char *name, sw_type type,
                      uint32_t n_dims, const uint64_t *ne, gguf_fill_fn fill, void *ctx)
{
    wtensor *t = w_add_tensor(w, name, type, n_dims, ne);
    if (t) { t->fill = fill; t->ctx = ctx; }
}

static uint64_t w_alignment(gguf_writer *w)
{
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kv[i].key, "general.alignment")) continue;
        const bytes *b = &w->kv[i].val;
        uint64_t type = load_le(b->p, 4), a = 0;
        if (type == GGUF_VT_UINT32 && b->len == 8) a = load_le(b->p + 4, 4);
        else if (type == GGUF_VT_UINT64 && b->len == 12) a = load_le(b->p + 4, 8);
        if (a == 0 || (a & (a - 1)) || a > (1u << 30)) {
            w_fail(w, "general.alignment must be a uint32 power of two in 1..2^30");
            return 0;
        }
        return a;
    }
    return GGUF_DEFAULT_ALIGNMENT;
}

static bool write_all(FILE *fp, const void *p, size_t n) { return fwrite(p, 1, n, fp) == n; }

static bool write_pad(FILE *fp, uint64_t pos, uint64_t a)
{
    static const uint8_t zeros[4096];
    uint64_t pad = (a - pos % a) % a;
    while (pad) {
        size_t k = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        if (!write_all(fp, zeros, k)) return false;
        pad -= k;
    }
    return true;
}

/* The header, keys and tensor infos into h, setting each tensor's offset
 * (aligned to a); h->oom says whether it all fit. */
static void w_header(gguf_writer *w, uint64_t a, bytes *h)
{
    b_put(h, GGUF_MAGIC, 4);
    b_le(h, 3, 4);
    b_le(h, w->n_t, 8);
    b_le(h, w->n_kv, 8);
    for (size_t i = 0; i < w->n_kv; i++) {
        b_str(h, w->kv[i].key, strlen(w->kv[i].key));
        b_put(h, w->kv[i].val.p, w->kv[i].val.len);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        t->offset = off;
        b_str(h, t->name, strlen(t->name));
        b_le(h, t->n_dims, 4);
        for (uint32_t j = 0; j < t->n_dims; j++) b_le(h, t->ne[j], 8);
        b_le(h, t->type, 4);
        b_le(h, t->offset, 8);
        off += (t->nbytes + a - 1) / a * a;
    }
}

/* Tensor t's data (filled now if it has a fill function) and its padding
 * to a; false with the reason in msg. */
static bool w_tensor_data(FILE *fp, const wtensor *t, uint64_t a, const char *path, char *msg, size_t msglen)
{
    const void *data = t->data;
    void *scratch = NULL;
    if (t->fill) {
        scratch = malloc(t->nbytes ? t->nbytes : 1);
        if (!scratch) {
            snprintf(msg, msglen, "gguf writer: tensor '%s': out of memory for %llu bytes",
                     t->name, (ull)t->nbytes);
            return false;
        }
        if (!t->fill(t->ctx, scratch, t->nbytes, msg, msglen)) {
            if (!msg[0]) snprintf(msg, msglen, "gguf writer: tensor '%s': fill failed", t->name);
            free(scratch);
            return false;
        }
        data = scratch;
    }
    bool ok = true;
    if (!data) {
        snprintf(msg, msglen, "gguf writer: tensor '%s' has no data", t->name);
        ok = false;
    } else if (!write_all(fp, data, (size_t)t->nbytes) || !write_pad(fp, t->nbytes, a)) {
        snprintf(msg, msglen, "gguf writer: %s: write failed: %s", path, strerror(errno));
        ok = false;
    }
    free(scratch);
    return ok;
}

bool gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errlen)
{
    uint64_t a = w_alignment(w);
    for (size_t i = 0; i < w->n_kv && !w->err[0]; i++)
        if (w->kv[i].val.oom) w_fail(w, "out of memory building key '%s'", w->kv[i].key);
    if (w->err[0]) { if (err && errlen) snprintf(err, errlen, "%s", w->err); return false; }

    /* Metadata first, in memory: it is small next to the tensor data. */
    bytes h = { 0 };
    w_header(w, a, &h);
    if (h.oom) {
        free(h.p);
        if (err && errlen) snprintf(err, errlen, "gguf writer: out of memory");
        return false;
    }

    /* Write to a temporary name and rename, so a failed write never leaves a
     * truncated file under the final name. */
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) { free(h.p); return false; }
    snprintf(tmp, plen + 16, "%s.tmp%d", path, (int)getpid());
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        if (err && errlen) snprintf(err, errlen, "gguf writer: %s: %s", tmp, strerror(errno));
        free(h.p); free(tmp);
        return false;
    }
    char msg[256] = "";
    bool ok = write_all(fp, h.p, h.len) && write_pad(fp, h.len, a);
    if (!ok) snprintf(msg, sizeof msg, "gguf writer: %s: write failed: %s", path, strerror(errno));
    for (size_t i = 0; ok && i < w->n_t; i++) ok = w_tensor_data(fp, &w->t[i], a, path, msg, sizeof msg);
    if (fclose(fp) != 0 && ok) {
        snprintf(msg, sizeof msg, "gguf writer: %s: close failed: %s", path, strerror(errno));
        ok = false;
    }
    if (ok && rename(tmp, path) != 0) {
        snprintf(msg, sizeof msg, "gguf writer: rename %s -> %s: %s", tmp, path, strerror(errno));
        ok = false;
    }
    if (!ok) {
        unlink(tmp);
        if (err && errlen) snprintf(err, errlen, "%s", msg);
    }
    free(h.p);
    free(tmp);
    return ok;
}
