/* Host entry points of the CUDA code (the .cu files here, compiled by nvcc with
 * C linkage). Only available when the build found nvcc (SW_HAVE_CUDA). */
#ifndef SW_CUDA_API_H
#define SW_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 with err describing why there are none
 * (e.g. "cudaGetDeviceCount: no CUDA-capable device is detected"). */
int sw_cuda_device_count(char *err, size_t errlen);
/* One line describing device 0: name, compute capability, SMs, memory. */
void sw_cuda_device_info(char *buf, size_t len);
/* Device-to-device cudaMemcpy bandwidth over a buffer of `bytes`, counting
 * read + write bytes (2 x bytes per copy), in GB/s; < 0 on error. */
double sw_cuda_copy_bandwidth(size_t bytes, int iters, char *err, size_t errlen);
/* Cross-checks the FP8 GEMV kernel against the cuBLASLt FP8 path and a host
 * reference on random matrices of the given shapes (rows, cols, n_tok).
 * Prints one line per case to stderr; returns 0 if all agree. */
int sw_cuda_selftest(char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
