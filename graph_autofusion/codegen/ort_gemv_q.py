"""The ``ai.graph_autofusion`` ``GemvQ`` custom operator: ``MatMul`` by a blockwise 8- or 4-bit
weight, the dequantization inside the contraction.

    y = GemvQ(x, Wq, S, Z)   # x f32 [..., K]; y f32 [..., N]
    # Wq u8 [N/16, K/4, 64] (8-bit) or [N/16, K/4, 32] (4-bit, two weights a byte)
    # S  f16 or f32 [N/16, nb, 16]: one scale per output and block of B = K / nb along K
    # Z  u8  [N/16, nb, 16] (a zero point per output and block) or [1] (one for all)
    # W[k, n] = (q[n, k] - z[n, k / B]) * s[n, k / B]

Why: a decode step streams every weight once per token. onnxruntime's ``MatMulNBits`` reads
the same bytes; this operator is the one safe mode can time against it per layer
(:func:`graph_autofusion.pipeline.weights_checks.choose_kernel`), and its products are closer
to the fp32 model's.

Layout: panels of 16 outputs; in a panel, groups of 4 k, each 64 weights output-major (element
``4 i + k % 4`` of group ``k / 4`` is output i's weight at k). At 4 bits byte j of a group holds
element j in its low nibble and element j + 32 in its high one, so the two nibble planes are
outputs 0-7 and 8-15 (:func:`to_panels` re-lays ``MatMulNBits``' blocks; the same quantized
values).

Paths (the library is compiled with ``-march=native``):

* **AVX-512 VNNI**: each activation row is split once a call into two int8 digits per block,
  ``x = sx (x0 + x1 / 254)`` with ``sx = max|x| / 127`` over the block: each activation to
  1 / 64516 of its block's largest (``MatMulNBits``' fast path, ``accuracy_level`` 4, keeps one
  int8 digit: 1 / 254), far below the weights' own rounding (8 bits: 1 / 254 of a block's
  largest weight). ``vpdpbusd`` multiplies a group's 64 weight bytes by a digit's four bytes
  broadcast (16 outputs x 4 k a step, int32 sums, exact); per block the two digit sums are
  combined in fp32, the zero point subtracted once as ``z (254 sum(x0) + sum(x1))`` and the
  result scaled by ``s sx / 254``. Up to 8 activation rows a tile share each weight load; one
  or two rows keep four groups in flight (independent accumulator chains); a line 1 KB ahead
  of the weight stream is prefetched.
* **AVX2, and AVX-512 without VNNI** (:mod:`~graph_autofusion.codegen.ort_gemv_q_paths`): int8 digits
  of the activations too, multiplied by AVX2's ``vpmaddubsw``, which saturates a pair's sum:
  digits within 63, ``x = sx (x0 + x1 / 126)`` (each activation to 1 / 7938 of its block's
  largest); two rows a tile.
* **plain C** (and AVX2 / AVX-512 built with ``GAF_GQ_NO_I2``): the weights widened
  to fp32 and multiplied by the
  fp32 activations (four k a lane, reduced per block), the zero point subtracted as
  ``z s sum(x)`` over the block.

Measured (``benchmarks/gemv_stream.py``, one token, weights streamed from memory): see
``benchmarks/results/epyc/gemv_stream.md``; each path's arithmetic on warm weights, one thread
(``benchmarks/gemv_q_paths.py``): ``benchmarks/results/epyc/gemv_q_paths.md``.

Rows: any ``M`` works; a prefill is a GEMM at a register tile's rate (safe mode decides per
layer on the real activation, where ``MatMulNBits`` may be faster). Chunks of panels run on
onnxruntime's intra-op pool, planned as ``GemvF16``'s (weight-product counts).
``gaf_gemv_q`` (one thread) and ``gaf_gemv_q_vnni`` (which path was built) are exported for
tests.
"""

from __future__ import annotations

import numpy as np

from graph_autofusion.codegen.ort_gemv_q_paths import AVX2_INT, FP32

#: The operator's name in the ``ai.graph_autofusion`` domain.
OP = "GemvQ"
#: The largest block along K (the C's ``GAF_GQ_MAX_BLOCK``: exact int32 sums).
MAX_BLOCK = 16384

_HEAD = r"""
/* ---- GemvQ: y[..., N] = x[..., K] @ dequant(Wq)^T, 8- or 4-bit weights in panels of 16
   outputs by groups of 4 k, block scales and zero points (graph-autofusion) ---- */
#ifndef GAF_GQ_CHUNK
#define GAF_GQ_CHUNK 2097152 /* weight-products per pool chunk (as GemvF16) */
#endif
/* the largest block: its int32 sums of u8 x int8 products stay exact (16384 x 255 x 127 < 2^31) */
#define GAF_GQ_MAX_BLOCK 16384
#ifndef GAF_GQ_PREFETCH
#define GAF_GQ_PREFETCH 1024 /* bytes ahead of the weight stream to prefetch (0: none) */
#endif
#ifndef GAF_GQ_CHUNK_MID
#define GAF_GQ_CHUNK_MID 262144
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && !defined(GAF_GQ_NO_VNNI)
#define GAF_GQ_VNNI 1
#else
#define GAF_GQ_VNNI 0
#endif
/* AVX2 (or AVX-512) without VNNI: int8 digits too, by vpmaddubsw (ort_gemv_q_paths.AVX2_INT) */
#if !GAF_GQ_VNNI && defined(__AVX2__) && defined(__FMA__) && !defined(GAF_GQ_NO_I2)
#define GAF_GQ_I2 1
#else
#define GAF_GQ_I2 0
#endif

typedef struct {
    const float *x; const uint8_t *w; const void *s; const uint8_t *z; float *y;
    const float *xs;   /* fp32 paths: each row's sums over the blocks [M, nb] */
    const int8_t *x0, *x1; const float *xq, *xz; /* int8 paths: the rows' two digits [M, K],
                          their scale / R and R sum(x0) + sum(x1) per row and block (R: 254
                          VNNI, 126 AVX2) */
    int64_t M, N, K, B, nb, rows; /* rows: panels per chunk */
    int bits, zfull;              /* zfull: z per output and block (else z[0] for all) */
    int s16;                      /* S is fp16 (else fp32) */
} GafGemvQ;

#define GAF_GQ_INL static inline __attribute__((always_inline))

/* scale i of S as fp32 (S fp16 or fp32) */
GAF_GQ_INL float gaf_gq_s1(const GafGemvQ *j, int64_t i) {
    return j->s16 ? gaf_h2f(((const uint16_t *)j->s)[i]) : ((const float *)j->s)[i];
}
#if defined(__AVX512F__)
/* scales i to i + 15 */
GAF_GQ_INL __m512 gaf_gq_s16v(const GafGemvQ *j, int64_t i) {
    if (j->s16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)j->s + i)));
    return _mm512_loadu_ps((const float *)j->s + i);
}
#endif
#if defined(__AVX2__) && defined(__FMA__)
/* scales i to i + 7 */
GAF_GQ_INL __m256 gaf_gq_s8v(const GafGemvQ *j, int64_t i) {
#if defined(__F16C__)
    if (j->s16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)j->s + i)));
#else
    if (j->s16) {
        float t[8];
        for (int q = 0; q < 8; q++) t[q] = gaf_gq_s1(j, i + q);
        return _mm256_loadu_ps(t);
    }
#endif
    return _mm256_loadu_ps((const float *)j->s + i);
}
#endif

/* weight (k, i) of panel w (K / 4 groups of 64 elements: element 4i + k % 4 of group k / 4;
   4-bit: byte j's low nibble is element j, its high nibble element j + 32) */
GAF_GQ_INL unsigned gaf_gq_q(const uint8_t *w, int64_t k, int i, int bits) {
    int64_t e = 4 * i + (k & 3);
    if (bits == 8) return w[(k >> 2) * 64 + e];
    uint8_t b = w[(k >> 2) * 32 + (e & 31)];
    return e < 32 ? (b & 15u) : (b >> 4);
}

#if defined(__AVX512F__)
/* the 64 weights of group g as bytes (16 outputs x 4 k, output-major) */
GAF_GQ_INL __m512i gaf_gq_group(const uint8_t *w, int64_t g, const int bits) {
    if (bits == 8) return _mm512_loadu_si512((const void *)(w + g * 64));
    __m256i b = _mm256_loadu_si256((const __m256i *)(w + g * 32)), m = _mm256_set1_epi8(15);
    __m256i lo = _mm256_and_si256(b, m), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
#endif

#if GAF_GQ_VNNI
#define GAF_GQ_ROWS 8
/* a tile: R activation rows from row m by panel p: per block, u8 weights x int8 digits of the
   activations summed in int32 (vpdpbusd, four k a lane), then scaled into fp32 */
GAF_GQ_INL void gaf_gq_tile(const GafGemvQ *j, int64_t p, int64_t m, const int R, const int bits) {
    const int64_t K = j->K, B = j->B, nb = j->nb, N = j->N;
    const uint8_t *w = j->w + p * K * (bits == 8 ? 16 : 8);
    const int8_t *x0 = j->x0 + m * K, *x1 = j->x1 + m * K;
    const float *xq = j->xq + m * nb, *xz = j->xz + m * nb;
    const int64_t s = p * nb * 16; /* the panel's first scale */
    const uint8_t *z = j->zfull ? j->z + p * nb * 16 : 0;
    const __m512 z0 = _mm512_set1_ps((float)j->z[0]), f254 = _mm512_set1_ps(254.f);
    /* U groups in flight a row (independent vpdpbusd chains: one row alone would wait on
       each one's latency), 16 accumulators in all */
    const int U = R <= 2 ? 4 : R <= 4 ? 2 : 1;
    __m512 c[8];
    __m512i a[8][4], e[8][4];
    for (int r = 0; r < R; r++) c[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < R; r++)
            for (int u = 0; u < U; u++) a[r][u] = e[r][u] = _mm512_setzero_si512();
        int64_t g = b * B / 4, end = (b + 1) * B / 4;
        for (; g + U <= end; g += U)
            for (int u = 0; u < U; u++) {
                if (GAF_GQ_PREFETCH && (bits == 8 || !((g + u) & 1)))  /* a line a step ahead */
                    _mm_prefetch((const char *)(w + (g + u) * (bits == 8 ? 64 : 32) + GAF_GQ_PREFETCH), _MM_HINT_T0);
                __m512i wv = gaf_gq_group(w, g + u, bits);
                for (int r = 0; r < R; r++) {
                    int32_t d0, d1;
                    memcpy(&d0, x0 + r * K + 4 * (g + u), 4);
                    memcpy(&d1, x1 + r * K + 4 * (g + u), 4);
                    a[r][u] = _mm512_dpbusd_epi32(a[r][u], wv, _mm512_set1_epi32(d0));
                    e[r][u] = _mm512_dpbusd_epi32(e[r][u], wv, _mm512_set1_epi32(d1));
                }
            }
        for (; g < end; g++) {
            __m512i wv = gaf_gq_group(w, g, bits);
            for (int r = 0; r < R; r++) {
                int32_t d0, d1;
                memcpy(&d0, x0 + r * K + 4 * g, 4);
                memcpy(&d1, x1 + r * K + 4 * g, 4);
                a[r][0] = _mm512_dpbusd_epi32(a[r][0], wv, _mm512_set1_epi32(d0));
                e[r][0] = _mm512_dpbusd_epi32(e[r][0], wv, _mm512_set1_epi32(d1));
            }
        }
        __m512 sv = gaf_gq_s16v(j, s + b * 16);
        __m512 zv = z ? _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(z + b * 16)))) : z0;
        for (int r = 0; r < R; r++) {
            for (int u = 1; u < U; u++) {
                a[r][0] = _mm512_add_epi32(a[r][0], a[r][u]);
                e[r][0] = _mm512_add_epi32(e[r][0], e[r][u]);
            }
            __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r][0]), f254, _mm512_cvtepi32_ps(e[r][0]));
            t = _mm512_fnmadd_ps(zv, _mm512_set1_ps(xz[r * nb + b]), t);
            c[r] = _mm512_fmadd_ps(t, _mm512_mul_ps(sv, _mm512_set1_ps(xq[r * nb + b])), c[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(j->y + (m + r) * N + p * 16, c[r]);
}

/* row m's two int8 digits per block of B: x = sx (x0 + x1 / 254), sx = max|x| / 127, so
   x0 = round(x / sx) and x1 = round(254 (x / sx - x0)) (|x1| <= 127): each activation to
   1 / (2 * 127 * 254) of its block's largest, far below the weights' rounding */
static void gaf_gq_digits(const float *x, int8_t *x0, int8_t *x1, float *xq, float *xz,
                          int64_t K, int64_t B, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * B;
        int64_t k = 0;
        __m512 mx = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (; k + 16 <= B; k += 16) {
            __m512 v = _mm512_loadu_ps(xb + k);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
        }
        float amax = _mm512_reduce_max_ps(mx);
        int bad = nan != 0;
        for (; k < B; k++) {
            bad |= xb[k] != xb[k];
            amax = fabsf(xb[k]) > amax ? fabsf(xb[k]) : amax;
        }
        bad |= amax > 3.4e38f; /* an infinite activation */
        /* a block whose largest is below 1e-30 counts as zeros (its digits' scale would be
           denormal, its inverse infinite) */
        float sx = amax > 1e-30f && !bad ? amax / 127.f : 1.f, inv = 1.f / sx;
        __m512 vi = _mm512_set1_ps(inv), v254 = _mm512_set1_ps(254.f);
        __m512i s0 = _mm512_setzero_si512(), s1 = s0;
        for (k = 0; k + 16 <= B; k += 16) {
            __m512 t = _mm512_mul_ps(_mm512_loadu_ps(xb + k), vi);
            __m512i q0 = _mm512_cvtps_epi32(t);
            __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(t, _mm512_cvtepi32_ps(q0)), v254));
            q0 = _mm512_max_epi32(_mm512_min_epi32(q0, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
            q1 = _mm512_max_epi32(_mm512_min_epi32(q1, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
            _mm_storeu_si128((__m128i *)(x0 + b * B + k), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(x1 + b * B + k), _mm512_cvtepi32_epi8(q1));
            s0 = _mm512_add_epi32(s0, q0); s1 = _mm512_add_epi32(s1, q1);
        }
        int64_t t0 = _mm512_reduce_add_epi32(s0), t1 = _mm512_reduce_add_epi32(s1);
        for (; k < B; k++) {
            float t = xb[k] * inv, r0 = nearbyintf(t), r1 = nearbyintf((t - r0) * 254.f);
            r0 = r0 > 127.f ? 127.f : r0 < -127.f ? -127.f : r0;
            r1 = r1 > 127.f ? 127.f : r1 < -127.f ? -127.f : r1;
            x0[b * B + k] = (int8_t)r0; x1[b * B + k] = (int8_t)r1;
            t0 += (int64_t)r0; t1 += (int64_t)r1;
        }
        xq[b] = bad ? NAN : sx / 254.f; /* a NaN or infinite activation: the block's products NaN */
        xz[b] = 254.f * (float)t0 + (float)t1;
    }
    (void)K;
}
"""

_TAIL = r"""#endif /* GAF_GQ_VNNI */

/* panels [p0, p1) against every activation row, in tiles of GAF_GQ_ROWS rows; bits a constant
   in each instance */
GAF_GQ_INL void gaf_gq_panels_b(const GafGemvQ *j, int64_t p0, int64_t p1, const int bits) {
    for (int64_t p = p0; p < p1; p++) {
        int64_t m = 0;
        for (; m + GAF_GQ_ROWS <= j->M; m += GAF_GQ_ROWS) gaf_gq_tile(j, p, m, GAF_GQ_ROWS, bits);
        switch (j->M - m) {
#if GAF_GQ_ROWS > 4
        case 7: gaf_gq_tile(j, p, m, 7, bits); break;
        case 6: gaf_gq_tile(j, p, m, 6, bits); break;
        case 5: gaf_gq_tile(j, p, m, 5, bits); break;
        case 4: gaf_gq_tile(j, p, m, 4, bits); break;
#endif
#if GAF_GQ_ROWS > 2
        case 3: gaf_gq_tile(j, p, m, 3, bits); break;
        case 2: gaf_gq_tile(j, p, m, 2, bits); break;
#endif
#if GAF_GQ_ROWS > 1
        case 1: gaf_gq_tile(j, p, m, 1, bits); break;
#endif
        default: break;
        }
    }
}

static void gaf_gq_panels(const GafGemvQ *j, int64_t p0, int64_t p1) {
    if (j->bits == 8) gaf_gq_panels_b(j, p0, p1, 8);
    else gaf_gq_panels_b(j, p0, p1, 4);
}

static void gaf_gq_chunk(void *data, size_t i) {
    const GafGemvQ *j = (const GafGemvQ *)data;
    int64_t a = (int64_t)i * j->rows, b = a + j->rows;
    if (b > j->N / 16) b = j->N / 16;
    if (b > a) gaf_gq_panels(j, a, b);
}

/* what a call computes once before the panels: each row's block sums (fp32 paths) or its
   int8 digits (VNNI, AVX2), in one buffer the caller frees (NULL: out of memory) */
static void *gaf_gq_prepare(GafGemvQ *j) {
    const int64_t M = j->M, K = j->K, B = j->B, nb = j->nb;
#if GAF_GQ_VNNI || GAF_GQ_I2
    char *buf = (char *)malloc((size_t)(2 * M * nb) * sizeof(float) + (size_t)(2 * M * K) + 64);
    if (!buf) return 0;
    float *xq = (float *)buf, *xz = xq + M * nb;
    int8_t *x0 = (int8_t *)(xz + M * nb), *x1 = x0 + M * K;
    for (int64_t m = 0; m < M; m++)
        gaf_gq_digits(j->x + m * K, x0 + m * K, x1 + m * K, xq + m * nb, xz + m * nb, K, B, nb);
    j->x0 = x0; j->x1 = x1; j->xq = xq; j->xz = xz;
    return buf;
#else
    float *xs = (float *)malloc(sizeof(float) * (size_t)(M * nb + 1));
    if (!xs) return 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            float t = 0.f;
            const float *p = j->x + m * K + b * B;
            for (int64_t k = 0; k < B; k++) t += p[k];
            xs[m * nb + b] = t;
        }
    j->xs = xs;
    return xs;
#endif
}

/* the exported entry point, for tests outside onnxruntime (one thread); zfull 0: z[0] for
   all; -1: a shape the operator refuses */
__attribute__((visibility("default")))
int gaf_gemv_q(const float *x, const uint8_t *w, const void *s, const uint8_t *z, int zfull,
               float *y, int64_t M, int64_t N, int64_t K, int64_t nb, int bits, int s16) {
    if (N % 16 || K % 4 || nb < 1 || K % nb || (K / nb) % 4 || K / nb > GAF_GQ_MAX_BLOCK || (bits != 8 && bits != 4)) return -1;
    GafGemvQ j = {x, w, s, z, y, 0, 0, 0, 0, 0, M, N, K, K / nb, nb, 0, bits, zfull, s16 != 0};
    void *buf = gaf_gq_prepare(&j);
    if (!buf) return -2;
    gaf_gq_panels(&j, 0, N / 16);
    free(buf);
    return 0;
}

/* the path the library runs GemvQ on: 2 int8 digits of the activations by VNNI, 1 by AVX2's
   vpmaddubsw, 0 fp32 products */
__attribute__((visibility("default")))
int gaf_gemv_q_vnni(void) { return GAF_GQ_VNNI ? 2 : GAF_GQ_I2; }

/* the dims of input i (rank at most 3) and, where type is given, its element type */
static OrtStatus *gaf_gq_dims(OrtKernelContext *ctx, size_t i, const OrtValue **v, int64_t *d, size_t *rank,
                              ONNXTensorElementDataType *type) {
    const OrtApi *api = gaf_api; OrtStatus *err; OrtTensorTypeAndShapeInfo *info;
    if ((err = api->KernelContext_GetInput(ctx, i, v))) return err;
    if ((err = api->GetTensorTypeAndShape(*v, &info))) return err;
    err = type ? api->GetTensorElementType(info, type) : 0;
    if (!err) err = api->GetDimensionsCount(info, rank);
    if (!err && *rank > 3) err = gaf_gv_err("GemvQ", "Wq, S and Z have rank 1 to 3");
    if (!err) err = api->GetDimensions(info, d, *rank);
    api->ReleaseTensorTypeAndShapeInfo(info);
    return err;
}

static OrtStatus *gaf_gq_compute(OrtKernelContext *ctx) {
    const OrtApi *api = gaf_api; OrtStatus *err;
    const OrtValue *xv, *wv, *sv, *zv; OrtValue *yv;
    int64_t xd[GAF_MAXD], wd[3], sd[3], zd[3]; size_t xr, wr, sr, zr;
    ONNXTensorElementDataType st; /* S's: fp16 or fp32 (Wq and Z: uint8 by the schema) */
    OrtTensorTypeAndShapeInfo *info;
    if ((err = api->KernelContext_GetInput(ctx, 0, &xv))) return err;
    if ((err = api->GetTensorTypeAndShape(xv, &info))) return err;
    err = api->GetDimensionsCount(info, &xr);
    if (!err && (xr < 1 || xr > GAF_MAXD)) err = gaf_gv_err("GemvQ", "x must have rank 1 to 12");
    if (!err) err = api->GetDimensions(info, xd, xr);
    api->ReleaseTensorTypeAndShapeInfo(info);
    if (err) return err;
    if ((err = gaf_gq_dims(ctx, 1, &wv, wd, &wr, 0)) || (err = gaf_gq_dims(ctx, 2, &sv, sd, &sr, &st)) ||
        (err = gaf_gq_dims(ctx, 3, &zv, zd, &zr, 0))) return err;
    if (st != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && st != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) return gaf_gv_err("GemvQ", "S must be float16 or float32");
    if (wr != 3 || (wd[2] != 64 && wd[2] != 32)) return gaf_gv_err("GemvQ", "Wq must be [N / 16, K / 4, 64] (8-bit) or [N / 16, K / 4, 32] (4-bit)");
    int64_t P = wd[0], K = 4 * wd[1], N = 16 * P, nb = sr == 3 ? sd[1] : 0;
    int bits = wd[2] == 64 ? 8 : 4;
    if (sr != 3 || sd[0] != P || sd[2] != 16 || nb < 1 || K % nb || (K / nb) % 4 || K / nb > GAF_GQ_MAX_BLOCK) return gaf_gv_err("GemvQ", "S must be [N / 16, nb, 16] with nb dividing K into blocks of a multiple of 4, at most 16384");
    int zfull = zr == 3;
    if (zfull ? (zd[0] != P || zd[1] != nb || zd[2] != 16) : !(zr == 1 && zd[0] == 1)) return gaf_gv_err("GemvQ", "Z must be [N / 16, nb, 16] or [1]");
    if (xd[xr - 1] != K) return gaf_gv_err("GemvQ", "x's last dim differs from Wq's K");
    int64_t yd[GAF_MAXD], M = 1;
    for (size_t i = 0; i + 1 < xr; i++) { yd[i] = xd[i]; M *= xd[i]; }
    yd[xr - 1] = N;
    if ((err = api->KernelContext_GetOutput(ctx, 0, yd, xr, &yv))) return err;
    void *x, *w, *s, *z, *y;
    if ((err = api->GetTensorMutableData((OrtValue *)xv, &x)) || (err = api->GetTensorMutableData((OrtValue *)wv, &w)) ||
        (err = api->GetTensorMutableData((OrtValue *)sv, &s)) || (err = api->GetTensorMutableData((OrtValue *)zv, &z)) ||
        (err = api->GetTensorMutableData(yv, &y))) return err;
    if (M == 0 || N == 0) return 0;
    if (K == 0) { memset(y, 0, sizeof(float) * (size_t)(M * N)); return 0; }
    GafGemvQ job = {(const float *)x, (const uint8_t *)w, s, (const uint8_t *)z, (float *)y,
                    0, 0, 0, 0, 0, M, N, K, K / nb, nb, 0, bits, zfull, st == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16};
    void *buf = gaf_gq_prepare(&job);
    if (!buf) return api->CreateStatus(ORT_FAIL, "graph-autofusion custom operator GemvQ: out of memory");
    int64_t work = N * K * (M < 8 ? M : 8);
    int64_t chunks = gaf_gv_chunks(work, GAF_GQ_CHUNK, GAF_GQ_CHUNK_MID, P);
    if (chunks < 2) gaf_gq_panels(&job, 0, P);
    else {
        job.rows = (P + chunks - 1) / chunks;
        chunks = (P + job.rows - 1) / job.rows;
        err = api->KernelContext_ParallelFor(ctx, gaf_gq_chunk, (size_t)chunks, 0, &job);
    }
    free(buf);
    return err;
}

static const char *ORT_API_CALL gaf_gq_name(const OrtCustomOp *op) { (void)op; return "GemvQ"; }
static ONNXTensorElementDataType ORT_API_CALL gaf_gq_in_type(const OrtCustomOp *op, size_t i) {
    (void)op; /* S: float16 or float32, checked in the kernel */
    return i == 1 || i == 3 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : i == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static size_t ORT_API_CALL gaf_gq_nin(const OrtCustomOp *op) { (void)op; return 4; }
static void ORT_API_CALL gaf_gq_compute1(void *k, OrtKernelContext *ctx) { (void)k; OrtStatus *s = gaf_gq_compute(ctx); if (s) gaf_api->ReleaseStatus(s); }
static OrtStatusPtr ORT_API_CALL gaf_gq_compute2(void *k, OrtKernelContext *ctx) { (void)k; return gaf_gq_compute(ctx); }

static OrtCustomOp gaf_gemv_q_op;

static void gaf_gemv_q_fill(OrtCustomOp *g) {
    gaf_gemv_fill(g);  /* Gemv's wiring, then four inputs */
    g->GetName = gaf_gq_name;
    g->GetInputType = gaf_gq_in_type;
    g->GetInputTypeCount = gaf_gq_nin;
    g->KernelCompute = gaf_gq_compute1;
    g->KernelComputeV2 = gaf_gq_compute2;
}
"""

#: The C of the operator (all paths; the compiler picks one by the ISA macros).
SOURCE = _HEAD + "#elif GAF_GQ_I2\n" + AVX2_INT + "#else\n" + FP32 + _TAIL


def eligible(k: int, n: int, block_size: int) -> bool:
    """Whether a ``[K, N]`` weight quantized in blocks of ``block_size`` can be ``GemvQ``'s:
    whole panels of 16 outputs, whole blocks along K, blocks of whole groups of 4."""
    return (
        n % 16 == 0
        and k > 0
        and k % block_size == 0
        and block_size % 4 == 0
        and block_size <= MAX_BLOCK
    )


def half_exact(scales: np.ndarray) -> bool:
    """Whether ``scales`` hold fp16 values exactly (:func:`~graph_autofusion.codegen.weights.
    quantize` rounds them so where fp16's normal range holds them): ``GemvQ`` then reads them
    as fp16, half the bytes."""
    s = np.asarray(scales, np.float32)
    with np.errstate(over="ignore"):
        return bool(np.array_equal(s.astype(np.float16).astype(np.float32), s))


def to_panels(
    b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, bits: int, k: int, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``MatMulNBits``' ``(B [N, nb, blob], scales [N, nb], zero_points)`` as ``GemvQ``'s
    ``(Wq, S, Z)`` (see the module docstring); the same quantized values. ``S`` is fp16 where
    that holds the scales exactly (:func:`half_exact`), else fp32. Symmetric weights (no zero
    points) get ``Z = [2 ** (bits - 1)]``, ``MatMulNBits``' default."""
    nb = scales.shape[1]
    p = n // 16
    if bits == 8:
        q = b.reshape(n, -1)[:, :k]  # [N, K]
    else:
        packed = b.reshape(n, -1)  # [N, nb * B / 2]: weight 2i low nibble, 2i + 1 high
        q = np.empty((n, packed.shape[1] * 2), np.uint8)
        q[:, 0::2], q[:, 1::2] = packed & 15, packed >> 4
        q = q[:, :k]
    groups = q.reshape(p, 16, k // 4, 4).transpose(0, 2, 1, 3).reshape(p, k // 4, 64)
    wq = groups if bits == 8 else groups[..., :32] | (groups[..., 32:] << 4)
    s = scales.reshape(p, 16, nb).transpose(0, 2, 1)
    if zero_points is None:
        z = np.array([1 << (bits - 1)], np.uint8)
    else:
        zp = zero_points.reshape(n, -1)
        if bits == 4:
            full = np.empty((n, zp.shape[1] * 2), np.uint8)
            full[:, 0::2], full[:, 1::2] = zp & 15, zp >> 4
            zp = full
        z = np.ascontiguousarray(zp[:, :nb].reshape(p, 16, nb).transpose(0, 2, 1))
    return (
        np.ascontiguousarray(wq, np.uint8),
        np.ascontiguousarray(s, np.float16 if half_exact(scales) else np.float32),
        np.ascontiguousarray(z, np.uint8),
    )
