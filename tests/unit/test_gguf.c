/* GGUF reader/writer tests: round trips through the writer, hand-built
 * malformed files (every error path names its field), truncation at every
 * byte, and the real files in $SPILLWAY_SHARED. */
#include "llm/gguf.h"
#include "tests/unit/check.h"
#include "tests/unit/testutil.h"

/* check.h's CHECK(cond) without a message expands to fprintf(stderr, ""). */
#pragma GCC diagnostic ignored "-Wformat-zero-length"

#include <math.h>
#include <stdint.h>
#include <unistd.h>

static char tmpdir[256];

static const char *tmp_path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", tmpdir, name);
    return buf;
}

/* Opens a private copy of exactly `n` bytes, so any over-read is caught by ASan. */
static gguf_file *open_copy(const uint8_t *src, size_t n, char *err, size_t errlen, uint8_t **keep)
{
    uint8_t *b = malloc(n ? n : 1);
    memcpy(b, src, n);
    gguf_file *f = gguf_open_buffer(b, n, err, errlen);
    *keep = b;
    return f;
}

static bool str_eq(gguf_str s, const char *c) { return s.len == strlen(c) && !memcmp(s.ptr, c, s.len); }

/* ---- 1. writer -> reader round trip with every value type ---- */

static float f32_data[4 * 3];
static uint16_t f16_data[64 * 2];
static uint8_t q8_data[2 * 34 * 2];   /* Q8_0: 64 per row = 2 blocks of 34 bytes, 2 rows */

static void build_roundtrip(gguf_writer *w, bool custom_align)
{
    uint8_t u8 = 200; int8_t i8 = -100; uint16_t u16 = 60000; int16_t i16 = -30000;
    int64_t i64 = -5000000000LL; double f64 = 2.718281828459045;
    gguf_w_scalar(w, "t.u8", GGUF_VT_UINT8, &u8);
    gguf_w_scalar(w, "t.i8", GGUF_VT_INT8, &i8);
    gguf_w_scalar(w, "t.u16", GGUF_VT_UINT16, &u16);
    gguf_w_scalar(w, "t.i16", GGUF_VT_INT16, &i16);
    gguf_w_u32(w, "t.u32", 4000000000u);
    gguf_w_i32(w, "t.i32", -2000000000);
    gguf_w_f32(w, "t.f32", 1.5f);
    gguf_w_bool(w, "t.bool", true);
    gguf_w_str(w, "t.str", "héllo wörld");
    gguf_w_u64(w, "t.u64", 1ull << 40);
    gguf_w_scalar(w, "t.i64", GGUF_VT_INT64, &i64);
    gguf_w_scalar(w, "t.f64", GGUF_VT_FLOAT64, &f64);
    gguf_w_str(w, "t.empty", "");
    const char *strs[] = { "<unk>", "", "▁the", "longer string value" };
    gguf_w_arr_str(w, "t.arr_str", strs, 4);
    float fa[] = { 0.5f, -1.25f, 3e10f };
    gguf_w_arr_f32(w, "t.arr_f32", fa, 3);
    int32_t ia[] = { 1, -2, 3, 2147483647 };
    gguf_w_arr_i32(w, "t.arr_i32", ia, 4);
    uint8_t ua[] = { 0, 255, 7 };
    gguf_w_arr(w, "t.arr_u8", GGUF_VT_UINT8, ua, 3);
    int16_t sa[] = { -32768, 32767 };
    gguf_w_arr(w, "t.arr_i16", GGUF_VT_INT16, sa, 2);
    bool ba[] = { true, false, true };
    gguf_w_arr(w, "t.arr_bool", GGUF_VT_BOOL, ba, 3);
    uint64_t la[] = { 1ull << 63, 5 };
    gguf_w_arr(w, "t.arr_u64", GGUF_VT_UINT64, la, 2);
    double da[] = { -0.125 };
    gguf_w_arr(w, "t.arr_f64", GGUF_VT_FLOAT64, da, 1);
    gguf_w_arr_str(w, "t.arr_empty", NULL, 0);
    /* Replacing a key keeps one entry with the new value. */
    gguf_w_u32(w, "t.replaced", 1);
    gguf_w_u32(w, "t.replaced", 2);
    if (custom_align) gguf_w_u32(w, "general.alignment", 64);

    for (int i = 0; i < 12; i++) f32_data[i] = (float)i * 0.25f - 1.0f;
    for (int i = 0; i < 128; i++) f16_data[i] = (uint16_t)(0x3c00 + i);
    for (size_t i = 0; i < sizeof q8_data; i++) q8_data[i] = (uint8_t)(i * 7 + 3);
    uint64_t ne_a[] = { 4, 3 }, ne_b[] = { 64, 2 }, ne_c[] = { 64, 2 }, ne_d[] = { 4 };
    gguf_w_tensor(w, "a.f32", SW_TYPE_F32, 2, ne_a, f32_data);
    gguf_w_tensor(w, "b.f16", SW_TYPE_F16, 2, ne_b, f16_data);
    gguf_w_tensor(w, "c.q8_0", SW_TYPE_Q8_0, 2, ne_c, q8_data);
    gguf_w_tensor(w, "d.norm", SW_TYPE_F32, 1, ne_d, f32_data);
}

static bool fill_pattern(void *ctx, void *dst, uint64_t n, char *err, size_t errlen)
{
    uint8_t *p = dst;
    for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)(i ^ (uintptr_t)ctx);
    return true;
}
static bool fill_fails(void *ctx, void *dst, uint64_t n, char *err, size_t errlen)
{
    snprintf(err, errlen, "synthetic failure");
    return false;
}

static void check_roundtrip(const gguf_file *f, uint64_t align)
{
    CHECK(f->version == 3);
    CHECK(f->n_kv == 23 + (align != 32), "n_kv %llu", (unsigned long long)f->n_kv);
    CHECK(f->n_tensors == 4);
    CHECK(f->alignment == align, "alignment %llu", (unsigned long long)f->alignment);
    CHECK(f->data_offset % align == 0);

    uint32_t u32; uint64_t u64; int64_t i64; float f32; bool b; char s[64]; gguf_str gs;
    CHECK(gguf_get_u32(f, "t.u8", &u32) && u32 == 200);
    CHECK(gguf_get_i64(f, "t.i8", &i64) && i64 == -100);
    CHECK(!gguf_get_u64(f, "t.i8", &u64), "negative must not convert to unsigned");
    CHECK(gguf_get_u32(f, "t.u16", &u32) && u32 == 60000);
    CHECK(gguf_get_i64(f, "t.i16", &i64) && i64 == -30000);
    CHECK(gguf_get_u32(f, "t.u32", &u32) && u32 == 4000000000u);
    CHECK(gguf_get_i64(f, "t.i32", &i64) && i64 == -2000000000);
    CHECK(gguf_get_f32(f, "t.f32", &f32) && f32 == 1.5f);
    CHECK(gguf_get_bool(f, "t.bool", &b) && b);
    CHECK(gguf_get_cstr(f, "t.str", s, sizeof s) && !strcmp(s, "héllo wörld"));
    CHECK(!gguf_get_cstr(f, "t.str", s, 5), "truncating copy must fail");
    CHECK(gguf_get_u64(f, "t.u64", &u64) && u64 == (1ull << 40));
    CHECK(!gguf_get_u32(f, "t.u64", &u32), "2^40 does not fit u32");
    CHECK(gguf_get_i64(f, "t.i64", &i64) && i64 == -5000000000LL);
    const gguf_kv *kv = gguf_find(f, "t.f64");
    CHECK(kv && kv->type == GGUF_VT_FLOAT64 && kv->v.f64 == 2.718281828459045);
    CHECK(gguf_get_str(f, "t.empty", &gs) && gs.len == 0);
    CHECK(!gguf_get_u32(f, "t.str", &u32), "string is not an integer");
    CHECK(!gguf_get_bool(f, "t.u8", &b));
    CHECK(!gguf_find(f, "t.missing"));
    CHECK(gguf_get_u32(f, "t.replaced", &u32) && u32 == 2);

    kv = gguf_find(f, "t.arr_str");
    CHECK(kv && kv->type == GGUF_VT_ARRAY && kv->v.arr.type == GGUF_VT_STRING && kv->v.arr.n == 4);
    if (kv) {
        CHECK(str_eq(gguf_arr_str(kv, 0), "<unk>"));
        CHECK(str_eq(gguf_arr_str(kv, 1), ""));
        CHECK(str_eq(gguf_arr_str(kv, 2), "▁the"));
        CHECK(str_eq(gguf_arr_str(kv, 3), "longer string value"));
        CHECK(gguf_arr_str(kv, 4).ptr == NULL, "out of range index");
    }
    kv = gguf_find(f, "t.arr_f32");
    CHECK(kv && kv->v.arr.n == 3 && gguf_arr_f32(kv, 1) == -1.25f && gguf_arr_f32(kv, 2) == 3e10f);
    kv = gguf_find(f, "t.arr_i32");
    CHECK(kv && kv->v.arr.n == 4 && gguf_arr_int(kv, 1) == -2 && gguf_arr_int(kv, 3) == 2147483647);
    kv = gguf_find(f, "t.arr_u8");
    CHECK(kv && kv->v.arr.type == GGUF_VT_UINT8 && gguf_arr_int(kv, 1) == 255);
    kv = gguf_find(f, "t.arr_i16");
    CHECK(kv && gguf_arr_int(kv, 0) == -32768 && gguf_arr_int(kv, 1) == 32767);
    kv = gguf_find(f, "t.arr_bool");
    CHECK(kv && kv->v.arr.type == GGUF_VT_BOOL && gguf_arr_int(kv, 0) == 1 && gguf_arr_int(kv, 1) == 0);
    kv = gguf_find(f, "t.arr_u64");
    CHECK(kv && (uint64_t)gguf_arr_int(kv, 0) == (1ull << 63));
    kv = gguf_find(f, "t.arr_f64");
    CHECK(kv && gguf_arr_f32(kv, 0) == -0.125f);
    kv = gguf_find(f, "t.arr_empty");
    CHECK(kv && kv->v.arr.type == GGUF_VT_STRING && kv->v.arr.n == 0);

    const gguf_tensor *t = gguf_find_tensor(f, "a.f32");
    CHECK(t && t->type == SW_TYPE_F32 && t->n_dims == 2 && t->ne[0] == 4 && t->ne[1] == 3 && t->ne[2] == 1);
    CHECK(t && t->nbytes == sizeof f32_data && !memcmp(t->data, f32_data, sizeof f32_data));
    t = gguf_find_tensor(f, "b.f16");
    CHECK(t && t->type == SW_TYPE_F16 && t->nbytes == sizeof f16_data && !memcmp(t->data, f16_data, sizeof f16_data));
    t = gguf_find_tensor(f, "c.q8_0");
    CHECK(t && t->type == SW_TYPE_Q8_0 && t->nbytes == sizeof q8_data && !memcmp(t->data, q8_data, sizeof q8_data));
    t = gguf_find_tensor(f, "d.norm");
    CHECK(t && t->n_dims == 1 && t->ne[1] == 1 && t->nbytes == 16);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        CHECK(f->tensors[i].offset % align == 0, "tensor %llu offset unaligned", (unsigned long long)i);
        CHECK((uint64_t)((const uint8_t *)f->tensors[i].data - f->base) % align == 0);
    }
    CHECK(!gguf_find_tensor(f, "nope"));
    CHECK(!strcmp(gguf_vtype_name(GGUF_VT_FLOAT64), "float64"));
}

static void test_roundtrip(void)
{
    char path[300], err[512];
    for (int custom = 0; custom <= 1; custom++) {
        gguf_writer *w = gguf_writer_new();
        build_roundtrip(w, custom);
        tmp_path(path, sizeof path, custom ? "rt64.gguf" : "rt.gguf");
        CHECK(gguf_writer_write(w, path, err, sizeof err), "write: %s", err);
        gguf_writer_free(w);
        gguf_file *f = gguf_open(path, err, sizeof err);
        CHECK(f, "open: %s", err);
        if (f) {
            check_roundtrip(f, custom ? 64 : 32);
            /* Copying every kv into a new writer gives the same metadata. */
            gguf_writer *w2 = gguf_writer_new();
            for (uint64_t i = 0; i < f->n_kv; i++) gguf_w_copy_kv(w2, &f->kv[i]);
            for (uint64_t i = 0; i < f->n_tensors; i++)
                gguf_w_tensor(w2, f->tensors[i].name, f->tensors[i].type, f->tensors[i].n_dims,
                              f->tensors[i].ne, f->tensors[i].data);
            char p2[300];
            tmp_path(p2, sizeof p2, "copy.gguf");
            CHECK(gguf_writer_write(w2, p2, err, sizeof err), "copy write: %s", err);
            gguf_writer_free(w2);
            gguf_file *g = gguf_open(p2, err, sizeof err);
            CHECK(g, "copy open: %s", err);
            if (g) { check_roundtrip(g, custom ? 64 : 32); gguf_close(g); }
            /* And byte-identical, since the writer is deterministic. */
            size_t n1, n2;
            uint8_t *b1 = (uint8_t *)read_file(path, &n1), *b2 = (uint8_t *)read_file(p2, &n2);
            CHECK(b1 && b2 && n1 == n2 && !memcmp(b1, b2, n1), "copy is not byte-identical");
            CHECK(n1 % (custom ? 64 : 32) == 0, "file size %zu not padded to alignment", n1);
            free(b1); free(b2);
            gguf_close(f);
        }
    }
}

static void test_writer_errors(void)
{
    char path[300], err[512];
    tmp_path(path, sizeof path, "bad.gguf");
    uint64_t ne[] = { 33, 1 };
    gguf_writer *w = gguf_writer_new();
    gguf_w_tensor(w, "x", SW_TYPE_Q8_0, 2, ne, q8_data);
    CHECK(!gguf_writer_write(w, path, err, sizeof err));
    CHECK(strstr(err, "'x'") && strstr(err, "block size"), "%s", err);
    CHECK(access(path, F_OK) != 0, "failed write must not leave a file");
    gguf_writer_free(w);

    uint64_t ne2[] = { 4 };
    w = gguf_writer_new();
    gguf_w_tensor(w, "dup", SW_TYPE_F32, 1, ne2, f32_data);
    gguf_w_tensor(w, "dup", SW_TYPE_F32, 1, ne2, f32_data);
    CHECK(!gguf_writer_write(w, path, err, sizeof err) && strstr(err, "duplicate tensor 'dup'"), "%s", err);
    gguf_writer_free(w);

    w = gguf_writer_new();
    gguf_w_u32(w, "general.alignment", 48);
    CHECK(!gguf_writer_write(w, path, err, sizeof err) && strstr(err, "alignment"), "%s", err);
    gguf_writer_free(w);

    w = gguf_writer_new();
    gguf_w_tensor_fn(w, "f", SW_TYPE_F32, 1, ne2, fill_fails, NULL);
    CHECK(!gguf_writer_write(w, path, err, sizeof err) && strstr(err, "synthetic failure"), "%s", err);
    CHECK(access(path, F_OK) != 0);
    gguf_writer_free(w);

    /* Streaming tensors: the callback's bytes land in the file. */
    uint64_t ne3[] = { 256, 3 };
    w = gguf_writer_new();
    gguf_w_tensor_fn(w, "s1", SW_TYPE_Q4_K, 2, ne3, fill_pattern, (void *)(uintptr_t)0x5a);
    gguf_w_tensor_fn(w, "s2", SW_TYPE_F16, 1, ne3, fill_pattern, (void *)(uintptr_t)0x11);
    CHECK(gguf_writer_write(w, path, err, sizeof err), "%s", err);
    gguf_writer_free(w);
    gguf_file *f = gguf_open(path, err, sizeof err);
    CHECK(f, "%s", err);
    if (f) {
        const gguf_tensor *t = gguf_find_tensor(f, "s1");
        CHECK(t && t->nbytes == 3 * 144);
        bool same = t != NULL;
        for (uint64_t i = 0; t && i < t->nbytes; i++) same &= ((const uint8_t *)t->data)[i] == (uint8_t)(i ^ 0x5a);
        CHECK(same, "streamed bytes differ");
        t = gguf_find_tensor(f, "s2");
        CHECK(t && t->nbytes == 512 && ((const uint8_t *)t->data)[3] == (3 ^ 0x11));
        gguf_close(f);
    }
}

/* ---- 2. truncation at every byte ---- */

static void test_truncation(void)
{
    char path[300], err[512];
    tmp_path(path, sizeof path, "rt.gguf");
    size_t size;
    uint8_t *full = (uint8_t *)read_file(path, &size);
    CHECK(full, "need rt.gguf");
    if (!full) return;
    gguf_file *f = gguf_open_buffer(full, size, err, sizeof err);
    CHECK(f, "%s", err);
    if (!f) { free(full); return; }
    uint64_t need = 0;   /* end of the last tensor's bytes */
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        uint64_t e = f->data_offset + f->tensors[i].offset + f->tensors[i].nbytes;
        if (e > need) need = e;
    }
    gguf_close(f);
    CHECK(need < size, "the test wants trailing padding to exist");
    int wrong = 0, no_msg = 0;
    for (size_t n = 0; n < size; n++) {
        uint8_t *keep;
        err[0] = 0;
        gguf_file *g = open_copy(full, n, err, sizeof err, &keep);
        bool expect_ok = n >= need;
        if ((g != NULL) != expect_ok) {
            if (wrong++ < 5) fprintf(stderr, "truncated to %zu: got %s (%s)\n", n, g ? "success" : "error", err);
        }
        if (!g && !strstr(err, "gguf: ")) no_msg++;
        gguf_close(g);
        free(keep);
    }
    CHECK(wrong == 0, "%d truncation lengths gave the wrong outcome", wrong);
    CHECK(no_msg == 0, "%d failures without a message", no_msg);

    /* A truncated file on disk, through gguf_open, names the file and the problem. */
    char tpath[300];
    tmp_path(tpath, sizeof tpath, "trunc.gguf");
    FILE *fp = fopen(tpath, "wb");
    fwrite(full, 1, need - 10, fp);
    fclose(fp);
    f = gguf_open(tpath, err, sizeof err);
    CHECK(!f && strstr(err, "trunc.gguf") && strstr(err, "extends past end of file"), "%s", err);
    gguf_close(f);
    CHECK(!gguf_open("/nonexistent/x.gguf", err, sizeof err) && strstr(err, "No such file"), "%s", err);
    fp = fopen(tpath, "wb");
    fclose(fp);
    CHECK(!gguf_open(tpath, err, sizeof err) && strstr(err, "empty"), "%s", err);
    CHECK(!gguf_open(tmpdir, err, sizeof err), "a directory is not a gguf");
    CHECK(!gguf_open_buffer(NULL, 0, err, sizeof err));
    free(full);
}

/* ---- 3. hand-built malformed files ---- */

typedef struct { uint8_t b[4096]; size_t n; } raw;
static void r_put(raw *r, const void *p, size_t n) { memcpy(r->b + r->n, p, n); r->n += n; }
static void r_u32(raw *r, uint32_t v) { r_put(r, &v, 4); }
static void r_u64(raw *r, uint64_t v) { r_put(r, &v, 8); }
static void r_str(raw *r, const char *s) { r_u64(r, strlen(s)); r_put(r, s, strlen(s)); }
static void r_hdr(raw *r, uint32_t version, uint64_t nt, uint64_t nkv)
{
    r->n = 0;
    r_put(r, "GGUF", 4); r_u32(r, version); r_u64(r, nt); r_u64(r, nkv);
}
static void r_kv_u32(raw *r, const char *k, uint32_t v) { r_str(r, k); r_u32(r, GGUF_VT_UINT32); r_u32(r, v); }
static void r_tinfo(raw *r, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type, uint64_t off)
{
    r_str(r, name); r_u32(r, nd);
    for (uint32_t i = 0; i < nd; i++) r_u64(r, ne[i]);
    r_u32(r, type); r_u64(r, off);
}
static void r_pad_data(raw *r, size_t align, size_t data_bytes)
{
    while (r->n % align) r->b[r->n++] = 0;
    memset(r->b + r->n, 0, data_bytes);
    r->n += data_bytes;
}

/* Expects failure with every `want` substring present in the message. */
static void expect_fail(const char *what, const raw *r, const char *want1, const char *want2)
{
    char err[512] = "";
    uint8_t *keep;
    gguf_file *f = open_copy(r->b, r->n, err, sizeof err, &keep);
    CHECK(!f, "%s: unexpectedly opened", what);
    CHECK(strstr(err, want1) && (!want2 || strstr(err, want2)),
          "%s: message '%s' lacks '%s'/'%s'", what, err, want1, want2 ? want2 : "");
    gguf_close(f);
    free(keep);
}

static void test_malformed(void)
{
    raw r;
    uint64_t ne[] = { 8, 2 };
    char err[512];
    uint8_t *keep;

    /* Control: a valid hand-built file opens. */
    r_hdr(&r, 2, 1, 1);
    r_kv_u32(&r, "general.alignment", 32);
    r_tinfo(&r, "w", 2, ne, SW_TYPE_F32, 0);
    r_pad_data(&r, 32, 64);
    gguf_file *f = open_copy(r.b, r.n, err, sizeof err, &keep);
    CHECK(f && f->version == 2 && f->n_tensors == 1 && f->tensors[0].nbytes == 64, "v2 control: %s", err);
    gguf_close(f); free(keep);

    r.n = 0; r_put(&r, "GGUX", 4); r_u32(&r, 3); r_u64(&r, 0); r_u64(&r, 0);
    expect_fail("bad magic", &r, "bad magic", "offset 0");
    r_hdr(&r, 1, 0, 0);
    expect_fail("v1", &r, "version 1", "offset 4");
    r_hdr(&r, 4, 0, 0);
    expect_fail("v4", &r, "unsupported version 4", NULL);
    r_hdr(&r, 0x03000000, 0, 0);
    expect_fail("big endian", &r, "big-endian", NULL);
    r_hdr(&r, 3, 1000000000000ull, 0);
    r_pad_data(&r, 1, 2000);
    expect_fail("absurd tensor count", &r, "tensor count 1000000000000 at offset 8 is absurd", NULL);
    r_hdr(&r, 3, 0, UINT64_MAX);
    expect_fail("absurd kv count", &r, "kv count", "absurd");
    r_hdr(&r, 3, 0, 1);
    r_u64(&r, UINT64_MAX - 3);
    r_pad_data(&r, 1, 40);
    expect_fail("huge key length", &r, "kv 0 key at offset 0x18", "extends past end of file");
    r_hdr(&r, 3, 0, 1);
    r_str(&r, "k"); r_u32(&r, 13); r_u32(&r, 0);
    expect_fail("unknown value type", &r, "kv 0 'k': unknown value type 13", NULL);
    r_hdr(&r, 3, 0, 1);
    r_str(&r, "nest"); r_u32(&r, GGUF_VT_ARRAY); r_u32(&r, GGUF_VT_ARRAY); r_u64(&r, 1);
    r_u32(&r, GGUF_VT_UINT8); r_u64(&r, 0);
    expect_fail("nested array", &r, "'nest'", "nested arrays are not supported");
    r_hdr(&r, 3, 0, 1);
    r_str(&r, "arr"); r_u32(&r, GGUF_VT_ARRAY); r_u32(&r, GGUF_VT_UINT32); r_u64(&r, 1ull << 62);
    r_pad_data(&r, 1, 16);
    expect_fail("huge array", &r, "'arr'", "extends past end of file");
    r_hdr(&r, 3, 0, 1);
    r_str(&r, "sarr"); r_u32(&r, GGUF_VT_ARRAY); r_u32(&r, GGUF_VT_STRING); r_u64(&r, 1ull << 40);
    r_pad_data(&r, 1, 16);
    expect_fail("huge string array", &r, "'sarr'", "absurd");
    r_hdr(&r, 3, 0, 1);
    r_str(&r, "sarr"); r_u32(&r, GGUF_VT_ARRAY); r_u32(&r, GGUF_VT_STRING); r_u64(&r, 2);
    r_str(&r, "ok"); r_u64(&r, 1000); r_pad_data(&r, 1, 8);
    expect_fail("string array element too long", &r, "element 1 length 1000", NULL);
    r_hdr(&r, 3, 0, 2);
    r_kv_u32(&r, "dup", 1); r_kv_u32(&r, "dup", 2);
    expect_fail("duplicate key", &r, "'dup': duplicate key", NULL);
    r_hdr(&r, 3, 0, 1);
    r_kv_u32(&r, "general.alignment", 48);
    expect_fail("alignment 48", &r, "general.alignment = 48", NULL);
    r_hdr(&r, 3, 0, 1);
    r_kv_u32(&r, "general.alignment", 0);
    expect_fail("alignment 0", &r, "general.alignment = 0", NULL);
    r_hdr(&r, 3, 0, 1);
    r_str(&r, "general.alignment"); r_u32(&r, GGUF_VT_STRING); r_str(&r, "32");
    expect_fail("alignment string", &r, "general.alignment has type string", NULL);

    /* Tensor infos. */
    uint64_t ne5[] = { 8, 1, 1, 1, 1 };
    r_hdr(&r, 3, 1, 0); r_tinfo(&r, "t5", 5, ne5, SW_TYPE_F32, 0); r_pad_data(&r, 32, 32);
    expect_fail("n_dims 5", &r, "tensor 0 't5': n_dims 5", NULL);
    uint64_t ne0[] = { 8, 0 };
    r_hdr(&r, 3, 1, 0); r_tinfo(&r, "z", 2, ne0, SW_TYPE_F32, 0); r_pad_data(&r, 32, 32);
    expect_fail("zero dim", &r, "'z': ne[1] is 0", NULL);
    uint64_t neo[] = { 1ull << 32, 1ull << 32 };
    r_hdr(&r, 3, 1, 0); r_tinfo(&r, "big", 2, neo, SW_TYPE_F32, 0); r_pad_data(&r, 32, 32);
    expect_fail("element overflow", &r, "'big': ne[1]", "overflows");
    uint64_t nerow[] = { (1ull << 62) + 1, 1 };   /* 4 bytes each: the row size would wrap to 4 */
    r_hdr(&r, 3, 1, 0); r_tinfo(&r, "wrapf", 2, nerow, SW_TYPE_F32, 0); r_pad_data(&r, 32, 32);
    expect_fail("row size wraps", &r, "'wrapf': row of", "overflows");
    uint64_t neb[] = { 1ull << 61, 1 };
    r_hdr(&r, 3, 1, 0); r_tinfo(&r, "bytes", 2, neb, SW_TYPE_F32, 0); r_pad_data(&r, 32, 32);
    expect_fail("byte size too large", &r, "'bytes' data", "extends past end of file");
    r_hdr(&r, 3, 1, 0); r_tinfo(&r, "ty", 2, ne, 99, 0); r_pad_data(&r, 32, 64);
    expect_fail("unknown type", &r, "'ty': unknown or unsupported tensor type 99", NULL);
    uint64_t ne33[] = { 33, 1 };
    r_hdr(&r, 3, 1, 0); r_tinfo(&r, "q", 2, ne33, SW_TYPE_Q8_0, 0); r_pad_data(&r, 32, 64);
    expect_fail("bad block multiple", &r, "'q': ne[0] = 33 is not a multiple", NULL);
    r_hdr(&r, 3, 1, 0); r_tinfo(&r, "mis", 2, ne, SW_TYPE_F32, 8); r_pad_data(&r, 32, 128);
    expect_fail("misaligned offset", &r, "'mis': data offset 0x8", "not a multiple of the alignment 32");
    r_hdr(&r, 3, 1, 0); r_tinfo(&r, "far", 2, ne, SW_TYPE_F32, 1ull << 40); r_pad_data(&r, 32, 64);
    expect_fail("offset past end", &r, "tensor 0 'far' data [off 0x", "extends past end of file");
    r_hdr(&r, 3, 1, 0); r_tinfo(&r, "wrap", 2, ne, SW_TYPE_F32, UINT64_MAX - 31); r_pad_data(&r, 32, 64);
    expect_fail("offset wraps", &r, "'wrap' data", "extends past end of file");
    r_hdr(&r, 3, 2, 0);
    r_tinfo(&r, "same", 2, ne, SW_TYPE_F32, 0); r_tinfo(&r, "same", 2, ne, SW_TYPE_F32, 64);
    r_pad_data(&r, 32, 128);
    expect_fail("duplicate tensor", &r, "tensor 1 'same': duplicate name", NULL);
    char longname[200];
    memset(longname, 'n', 150); longname[150] = 0;
    r_hdr(&r, 3, 1, 0); r_tinfo(&r, longname, 2, ne, SW_TYPE_F32, 0); r_pad_data(&r, 32, 64);
    expect_fail("long name", &r, "name length 150", "exceeds 127");
    r_hdr(&r, 3, 1, 0); r_tinfo(&r, "short", 2, ne, SW_TYPE_F32, 0); r_pad_data(&r, 32, 32);
    expect_fail("data cut short", &r, "'short' data", "extends past end of file");
}

/* ---- 4. real files ---- */

static void test_real_files(void)
{
    char p[512], err[512], s[64];
    uint32_t u;
    shared_path(p, sizeof p, "models/stories260K.gguf");
    if (access(p, R_OK) != 0) {
        if (sw_checks_failed) { fprintf(stderr, "shared data missing: %s\n", p); return; }
        SKIP_TEST("missing %s", p);
    }
    gguf_file *f = gguf_open(p, err, sizeof err);
    CHECK(f, "%s", err);
    if (f) {
        CHECK(f->version == 3 && f->n_tensors == 48 && f->n_kv == 19);
        CHECK(gguf_get_u32(f, "llama.embedding_length", &u) && u == 64);
        CHECK(gguf_get_u32(f, "llama.block_count", &u) && u == 5);
        CHECK(gguf_get_u32(f, "llama.attention.head_count_kv", &u) && u == 4);
        CHECK(gguf_get_cstr(f, "general.architecture", s, sizeof s) && !strcmp(s, "llama"));
        float eps;
        CHECK(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps) && fabsf(eps - 1e-5f) < 1e-9f);
        const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
        CHECK(t && t->type == SW_TYPE_F32 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 512);
        CHECK(t && t->nbytes == 64 * 512 * 4 && (const uint8_t *)t->data == f->base + 14176);
        CHECK(gguf_find_tensor(f, "blk.4.ffn_down.weight") && !gguf_find_tensor(f, "blk.5.ffn_down.weight"));
        const gguf_kv *kv = gguf_find(f, "tokenizer.ggml.tokens");
        CHECK(kv && kv->v.arr.n == 512 && str_eq(gguf_arr_str(kv, 1), "<s>"));
        gguf_close(f);
    }
    shared_path(p, sizeof p, "vocab/ggml-vocab-llama-spm.gguf");
    f = gguf_open(p, err, sizeof err);
    CHECK(f, "%s", err);
    if (f) {
        const gguf_kv *kv = gguf_find(f, "tokenizer.ggml.tokens");
        CHECK(f->n_tensors == 0 && kv && kv->v.arr.n == 32000);
        CHECK(kv && str_eq(gguf_arr_str(kv, 0), "<unk>") && str_eq(gguf_arr_str(kv, 2), "</s>"));
        CHECK(kv && str_eq(gguf_arr_str(kv, 3), "<0x00>"));
        kv = gguf_find(f, "tokenizer.ggml.token_type");
        CHECK(kv && gguf_arr_int(kv, 1) == 3 && gguf_arr_int(kv, 3) == 6);
        bool b;
        CHECK(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b) && b);
        gguf_close(f);
    }
    shared_path(p, sizeof p, "vocab/ggml-vocab-gpt-2.gguf");
    f = gguf_open(p, err, sizeof err);
    CHECK(f, "%s", err);
    if (f) {
        const gguf_kv *kv = gguf_find(f, "tokenizer.ggml.merges");
        CHECK(kv && kv->v.arr.n == 50000);
        CHECK(gguf_get_cstr(f, "tokenizer.ggml.model", s, sizeof s) && !strcmp(s, "gpt2"));
        gguf_close(f);
    }
    shared_path(p, sizeof p, "golden/synth-spm-d256-q4km.gguf");
    f = gguf_open(p, err, sizeof err);
    CHECK(f, "%s", err);
    if (f) {
        CHECK(f->n_tensors == 39 && gguf_get_u32(f, "general.file_type", &u) && u == 15);
        const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
        CHECK(t && t->type == SW_TYPE_Q4_K && t->ne[0] == 256 && t->ne[1] == 32000 && t->nbytes == 32000 * 144);
        t = gguf_find_tensor(f, "output.weight");
        CHECK(t && t->type == SW_TYPE_Q6_K, "output.weight type %d", t ? (int)t->type : -1);
        gguf_close(f);
    }
    shared_path(p, sizeof p, "golden/synth-gpt2-d512-q4km.gguf");
    f = gguf_open(p, err, sizeof err);
    CHECK(f, "%s", err);
    if (f) {
        const gguf_tensor *t = gguf_find_tensor(f, "blk.0.attn_v.weight");
        CHECK(t && t->type == SW_TYPE_Q5_K && t->ne[0] == 512 && t->ne[1] == 128);
        gguf_close(f);
    }
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_gguf.XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    test_roundtrip();
    test_writer_errors();
    test_truncation();
    test_malformed();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    /* Real files last: a missing data set skips (77) after the self-contained checks ran. */
    int rc_unused = system(cmd);
    (void)rc_unused;
    test_real_files();
    CHECK_DONE();
}
