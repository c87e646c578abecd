"""A matrix-vector kernel for the few-row ``MatMul`` of decoding: ``y[m, :] = x[m, :] @ W``.

Why: one decode step multiplies one row of activations by every weight matrix, so it is
bound by how fast the weights stream from memory. On this machine torch's CPU ``mm`` (MKL's
``sgemv``) streams a 32000x512 fp32 matrix at ~15 GB/s with 2 threads while a plain read of
the same bytes runs at 53-61 GB/s (``benchmarks/torch_e2e.py`` prints both). This kernel
walks ``W`` once in its stored ``[N, K]`` order (nn.Linear's layout: ``MatMul``'s constant
right operand is a transposed view of it), eight output columns at a time (eight weight rows
streamed at once, each with its own accumulator; four rows reached ~40 GB/s, eight ~50, where a
plain read of the same bytes runs at ~65), every activation row reused from cache, split across
threads by column blocks.

ABI, as every generated kernel's: ``gaf_gemv_f32(sizes, ptrs, strides, threads)`` with
``sizes = [M, N, K]``, ``ptrs = [x, w, y]`` and ``strides = [x row, w row, y row]`` (elements).

This module only generates: :func:`graph_autofusion.runtime.gemv.load_gemv` compiles
:data:`SOURCE` and loads it with the call shim.
"""

from __future__ import annotations

#: The most activation rows the kernel is used for (more rows: a GEMM, torch's kernel).
MAX_ROWS = 8

SOURCE = r"""
#include <stdint.h>
#include <omp.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define GAF_ROWS 8

/* out[j] = dot(w0 + j * ws, xr) for j < rows (rows <= GAF_ROWS): GAF_ROWS weight rows streamed
   at once, each with its own accumulator, the activation row reused from cache. */
static inline void gaf_rows(const float *xr, const float *w0, int64_t ws, int64_t K, int rows,
                            float *out) {
    int64_t k = 0;
    for (int j = 0; j < rows; j++) out[j] = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
    if (rows == GAF_ROWS) {
        __m256 a[GAF_ROWS];
        for (int j = 0; j < GAF_ROWS; j++) a[j] = _mm256_setzero_ps();
        for (; k + 8 <= K; k += 8) {
            __m256 xv = _mm256_loadu_ps(xr + k);
            for (int j = 0; j < GAF_ROWS; j++)
                a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + j * ws + k), xv, a[j]);
        }
        for (int j = 0; j < GAF_ROWS; j++) {
            float s[8];
            _mm256_storeu_ps(s, a[j]);
            float r = 0.f;
            for (int l = 0; l < 8; l++) r += s[l];
            out[j] = r;
        }
    }
#endif
    for (int j = 0; j < rows; j++) {
        const float *wr = w0 + j * ws;
        float r = 0.f;
        for (int64_t kk = k; kk < K; kk++) r += wr[kk] * xr[kk];
        out[j] += r;
    }
}

void gaf_gemv_f32(const int64_t *sizes, void *const *ptrs, const int64_t *strides,
                  int64_t threads) {
    const int64_t M = sizes[0], N = sizes[1], K = sizes[2];
    const float *x = (const float *)ptrs[0];
    const float *w = (const float *)ptrs[1];
    float *y = (float *)ptrs[2];
    const int64_t xs = strides[0], ws = strides[1], ys = strides[2];
    const int64_t blocks = (N + GAF_ROWS - 1) / GAF_ROWS;
    #pragma omp parallel for num_threads(threads) schedule(static) if (N * K >= 65536)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t n0 = b * GAF_ROWS;
        const int rows = (int)(N - n0 < GAF_ROWS ? N - n0 : GAF_ROWS);
        float out[GAF_ROWS];
        for (int64_t m = 0; m < M; m++) {
            gaf_rows(x + m * xs, w + n0 * ws, ws, K, rows, out);
            for (int j = 0; j < rows; j++) y[m * ys + n0 + j] = out[j];
        }
    }
}
"""
