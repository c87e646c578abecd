"""A matrix-vector kernel for the few-row ``MatMul`` of decoding: ``y[m, :] = x[m, :] @ W``.

Why: one decode step multiplies one row of activations by every weight matrix, so it is
bound by how fast the weights stream from memory. On this machine torch's CPU ``mm`` (MKL's
``sgemv``) streams a 32000x512 fp32 matrix at ~15 GB/s with 2 threads while a plain read of
the same bytes runs at 53-61 GB/s (``benchmarks/torch_e2e.py`` prints both). This kernel
walks ``W`` once in its stored ``[N, K]`` order (nn.Linear's layout: ``MatMul``'s constant
right operand is a transposed view of it), four output columns at a time with every
activation row reused from cache, split across threads by column blocks.

ABI, as every generated kernel's: ``gaf_gemv_f32(sizes, ptrs, strides, threads)`` with
``sizes = [M, N, K]``, ``ptrs = [x, w, y]`` and ``strides = [x row, w row, y row]`` (elements).
"""

from __future__ import annotations

import functools
from typing import Any

#: The most activation rows the kernel is used for (more rows: a GEMM, torch's kernel).
MAX_ROWS = 8

SOURCE = r"""
#include <stdint.h>
#include <omp.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

static inline void gaf_rows4(const float *xr, const float *w0, int64_t ws, int64_t K,
                             float *out) {
    const float *w1 = w0 + ws, *w2 = w1 + ws, *w3 = w2 + ws;
    float r0 = 0.f, r1 = 0.f, r2 = 0.f, r3 = 0.f;
    int64_t k = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; k + 8 <= K; k += 8) {
        __m256 xv = _mm256_loadu_ps(xr + k);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), xv, a3);
    }
    float s[4][8];
    _mm256_storeu_ps(s[0], a0);
    _mm256_storeu_ps(s[1], a1);
    _mm256_storeu_ps(s[2], a2);
    _mm256_storeu_ps(s[3], a3);
    for (int l = 0; l < 8; l++) {
        r0 += s[0][l];
        r1 += s[1][l];
        r2 += s[2][l];
        r3 += s[3][l];
    }
#endif
    for (; k < K; k++) {
        float xv = xr[k];
        r0 += w0[k] * xv;
        r1 += w1[k] * xv;
        r2 += w2[k] * xv;
        r3 += w3[k] * xv;
    }
    out[0] = r0;
    out[1] = r1;
    out[2] = r2;
    out[3] = r3;
}

void gaf_gemv_f32(const int64_t *sizes, void *const *ptrs, const int64_t *strides,
                  int64_t threads) {
    const int64_t M = sizes[0], N = sizes[1], K = sizes[2];
    const float *x = (const float *)ptrs[0];
    const float *w = (const float *)ptrs[1];
    float *y = (float *)ptrs[2];
    const int64_t xs = strides[0], ws = strides[1], ys = strides[2];
    const int64_t blocks = (N + 3) / 4;
    #pragma omp parallel for num_threads(threads) schedule(static) if (N * K >= 65536)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t n0 = b * 4;
        if (n0 + 4 <= N) {
            float out[4];
            for (int64_t m = 0; m < M; m++) {
                gaf_rows4(x + m * xs, w + n0 * ws, ws, K, out);
                for (int j = 0; j < 4; j++) y[m * ys + n0 + j] = out[j];
            }
        } else {
            for (int64_t n = n0; n < N; n++) {
                const float *wr = w + n * ws;
                for (int64_t m = 0; m < M; m++) {
                    const float *xr = x + m * xs;
                    float acc = 0.f;
                    for (int64_t k = 0; k < K; k++) acc += wr[k] * xr[k];
                    y[m * ys + n] = acc;
                }
            }
        }
    }
}
"""


@functools.lru_cache(maxsize=4)
def load_gemv(options: Any = None) -> Any:
    """The compiled kernel's address and the call shim (``None`` when either cannot be built:
    the matrix products then stay on torch's kernels)."""
    import ctypes

    from graph_autofusion.codegen.compiler import compile_source
    from graph_autofusion.runtime.shim import load_shim

    shim = load_shim()
    if shim is None:
        return None
    built = compile_source(SOURCE, options, what="the gemv kernel")
    lib = ctypes.CDLL(built.path)
    fn = lib.gaf_gemv_f32
    return lib, ctypes.cast(fn, ctypes.c_void_p).value, shim
