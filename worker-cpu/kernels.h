/* CPU compute kernels: activation quantization, quantized dot products and the
 * matrix x many-tokens product the forward pass is built on.
 *
 * Each kernel has scalar, AVX2 and AVX-512 (VNNI where present) variants,
 * chosen once at run time with cpuid; SPILLWAY_ISA=scalar|avx2|avx512 forces
 * one. Every variant is tested against the scalar reference in llm/quant.c.
 */
#ifndef SW_KERNELS_H
#define SW_KERNELS_H

/* Cloned per ISA by the compiler (arch=x86-64-v4, avx2, default): loops that
 * only vectorize with the wider targets enabled. Not under ThreadSanitizer:
 * the clones' ifunc resolvers run during relocation, before TSan's runtime
 * is up, and its instrumentation of them crashes the program at load. */
#if defined(__SANITIZE_THREAD__)
#define SW_CLONES
#else
#define SW_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "llm/quant.h"
#include "llm/gguf.h"

typedef enum { SW_ISA_SCALAR = 0, SW_ISA_AVX2 = 1, SW_ISA_AVX512 = 2 } sw_isa;

/* The ISA in use (detected, or forced via SPILLWAY_ISA / sw_isa_set). */
sw_isa sw_isa_active(void);
/* Forces an ISA (clamped to what the CPU supports); returns what is now active. */
sw_isa sw_isa_set(sw_isa isa);
const char *sw_isa_name(sw_isa isa);
/* The best ISA this CPU has, whatever is forced. */
sw_isa sw_isa_best(void);
/* The CPU features the choice was made from, as cpuid (and the OS's saved
 * register state) report them to __builtin_cpu_supports: space-separated
 * GCC names ("avx2 fma f16c avx512f ... avxvnni"), only those present.
 * Tests ask the program for this rather than read /proc/cpuinfo, which
 * is the host's under emulation and can list what the OS has turned off. */
const char *sw_cpu_features(void);
/* The CPU's brand string from cpuid ("AMD EPYC 7763 64-Core Processor"),
 * trimmed and JSON-safe, for benchmark figures to name their host;
 * "unknown" where cpuid has none. */
const char *sw_cpu_model(void);

/* Bytes one activation row of n floats takes in the format that weights of
 * type wtype are multiplied with (Q8_K for K-quants, Q8_0 for Q4_0..Q8_0,
 * F32 for float types). */
size_t sw_act_row_size(sw_type wtype, int64_t n);
/* Converts one activation row into that format. */
void sw_quantize_act(sw_type wtype, const float *x, void *dst, int64_t n);
/* Dot of one weight row with one activation row already in act format. */
float sw_vec_dot(sw_type wtype, int64_t n, const void *w, const void *act);

/* Y = W * X for n_tok tokens:
 *   W: rows x cols in `type` (row-major, row r at w + r*row_size),
 *   X: n_tok x cols floats, Y: n_tok x rows floats (y[t*rows + r]).
 * Parallel over output rows with OpenMP (call from outside a parallel region);
 * activations are quantized once per call. */
void sw_matmul(sw_type type, const void *w, int64_t rows, int64_t cols,
               const float *x, int n_tok, float *y);
/* Convenience for a 2-D GGUF tensor (ne[0] = cols, ne[1] = rows). */
void sw_matmul_tensor(const gguf_tensor *w, const float *x, int n_tok, float *y);

/* Weights prepacked once at model load for the fastest kernel this CPU has
 * (today: Q4_K, Q5_K, Q6_K and the 32-weight types Q4_0..Q8_0 and MXFP4
 * with AVX-512 VNNI, all but Q6_K with AVX2; 16 rows interleaved, within 3% of the
 * original's size). sw_pack_tensor returns NULL when there is nothing to gain (other
 * types, other ISAs, out of memory): callers then use sw_matmul_tensor. The
 * tensor must outlive the pack (rows that do not fill a group of 16 and
 * other ISAs selected later are computed from it); otherwise the original
 * bytes are not touched, so their mmap'd pages can be evicted. */
typedef struct sw_packed sw_packed;
sw_packed *sw_pack_tensor(const gguf_tensor *w);
void sw_packed_free(sw_packed *p);
size_t sw_packed_bytes(const sw_packed *p);
/* sw_matmul_tensor(original, x, n_tok, y), from the packed copy. */
void sw_matmul_packed(const sw_packed *p, const float *x, int n_tok, float *y);
/* y[k] = p[k] * x for np packs of the same width (q/k/v, gate/up): the
 * activations are quantized once and one parallel region covers all. */
#define SW_PACKED_FUSE_MAX 3   /* more than this many: one product each */
void sw_matmul_packed_n(const sw_packed *const *p, int np, const float *x, int n_tok, float *const *y);
/* Any number of products y = p * x, each with its own activations (jobs
 * that share x, n_tok and width quantize it once), in one parallel region:
 * a mixture's experts, which are many and small. A job with p NULL or no
 * tokens is skipped. */
typedef struct {
    const sw_packed *p;
    const float *x;   /* n_tok x p's columns */
    int n_tok;
    float *y;         /* n_tok x p's rows */
} sw_packed_job;
void sw_matmul_packed_jobs(const sw_packed_job *jobs, int n);

/* Products of at least a threshold of tokens (per matrix; twice as many
 * for rows wider than 4096) run on the int8 form where this CPU has it
 * (AVX-512 VNNI, or AVX2 with AVX-VNNI's vpdpbusd on ymm; Q4_K, Q5_K and
 * Q6_K): each 16-row group is expanded to
 * int8 rows with one scale per 256 weights, tile by tile, and every token
 * slice then costs 64 vpdpbusd and two float operations per block instead
 * of 79-82 (its gain on prefill: docs/perf/cpu.md, "The
 * int8 form"). The price is one more rounding of each weight, to 255
 * levels over its row-block: products move by 0.4% (rms, random rows),
 * where the Q8_K activations' own rounding moved them by 1.5%.
 * The threshold is the form's kernel's own: where it began to beat the
 * packed kernels in prefill on an Intel Xeon (Sapphire Rapids class),
 * since the expansion costs each product the same whatever its tokens,
 * and each kernel repays it at its own speed: 48 tokens on ymm (AVX-VNNI),
 * 128 on zmm (AVX-512 VNNI), 64 with AMX (docs/perf/cpu.md, "Where the
 * int8 form starts"). SPILLWAY_I8_MIN_TOKENS=N sets one for every kernel
 * at start-up; this call, process-wide, later (0 turns the form off, so
 * every product equals the reference within float rounding; a negative n
 * gives each kernel its own back). Returns the previous setting (-1: the
 * kernels' own). */
int sw_set_i8_min_tokens(int n);
/* The threshold in effect: 0 when it is off or the active ISA has no int8 form. */
int sw_i8_min_tokens(void);

/* Whether the packed Q4_K kernel issues software prefetches (into L2) at
 * one token; every other product always does. Where the hardware
 * prefetcher alone keeps ahead of a one-token Q4_K stream they only take
 * its miss buffers: on AMD Zen 4, batch 1 was 12% faster without them. On
 * the Intel Xeon hosts it fell far behind: batch 1 read at 73% of the
 * bandwidth without them, 97% with (docs/perf/cpu.md, "Software prefetch
 * at one token"). So on by default on Intel CPUs, off on others;
 * SPILLWAY_PREFETCH_1TOK=0|1 decides at start-up instead, and
 * sw_set_prefetch_one_token later (process-wide, between products; it
 * returns the previous choice). */
bool sw_prefetch_one_token(void);
bool sw_set_prefetch_one_token(bool on);

/* The CPU's int8 multiply-add peak, measured: every OpenMP thread runs
 * independent chains of the instructions the packed kernels are built on
 * (AVX-512 VNNI: vpdpbusd, 64 MACs each; AVX2: vpmaddubsw + vpmaddwd +
 * vpaddd, 32 MACs a triple) for `seconds`; the sum of each thread's best
 * few-millisecond window, in GMAC/s. 0 on the scalar path. The yardstick
 * for prefill and batched decode, which are bound by it. */
double sw_int8_peak_gmac_s(double seconds);

/* The instructions sw_int8_peak_gmac_s times on the active path, for a
 * table's heading ("vpdpbusd", ...); NULL on the scalar path. */
const char *sw_int8_peak_mix(void);

/* The same for the int8 form (sw_i8_min_tokens), which prefill runs on:
 * its instruction's peak, timed as above, and its name. Where the active
 * path has no form, 0 and NULL. It differs from sw_int8_peak_gmac_s on
 * AVX2 with AVX-VNNI, where the packed kernels pair vpmaddubsw and
 * vpmaddwd but the form runs vpdpbusd on ymm (a pair's work in one), and
 * with AMX, where the form runs tdpbsud. */
double sw_int8_form_peak_gmac_s(double seconds);
const char *sw_int8_form_peak_mix(void);

/* Row r of a tensor as floats (embedding lookup). */
void sw_get_row(const gguf_tensor *w, int64_t r, float *out);

#endif
