"""The ``ai.graph_autofusion`` ``GemvF16`` custom operator: ``MatMul`` by an fp16 weight.

    y = GemvF16(x, Wp)      # x f32 [..., K], Wp = W.T in fp16 as [N/16, K, 16] panels
    y = GemvF16(x, Wt16)    # ... or as nn.Linear's [N, K]: y f32 [..., N]

Why: onnxruntime's CPU provider has no fused form of an fp32 activation times an fp16
weight (a ``Cast`` of an fp16 initializer is constant-folded back to fp32 when the session
loads; an fp16 ``MatMul`` with its activation cast runs slower than fp32 on x86; ``MatMulNBits``
takes 2-8 bits). A decode step streams every weight once per token, so half the bytes is
close to half the time. This operator is the fp16 form of ``FuseOptions.weights``
(:mod:`graph_autofusion.pipeline.weights`): the weight stays fp16 in memory and in the saved
file and is widened to fp32 in registers (F16C's ``vcvtph2ps``, 8 or 16 at a time), the
products accumulated in fp32, so the only error is the weight's rounding to fp16 (relative
2^-11 per weight).

Layouts (shape checks by ``Gemv``'s ``gaf_gv_bind``, :mod:`graph_autofusion.codegen.ort_gemv`,
whose source comes first in the library):

* **panels** ``Wp [N / 16, K, 16]`` (what the compressed-weights stage writes when 16 divides
  N: :func:`graph_autofusion.codegen.weights.to_half`): sixteen weight rows interleaved along
  K, so one 32-byte load gives the 16 outputs' weights at one k. A tile of up to 8 activation
  rows keeps one accumulator per row (16 outputs each, AVX-512; on AVX2 4 rows, two halves of
  8 each): each widened weight vector feeds a product per row against broadcast activations,
  no horizontal sums, the weights streamed once, front to back. One row (a decode step)
  keeps four k in flight instead, on AVX-512 and AVX2 alike (one accumulator chain per half
  waits on each FMA); on AVX2 two rows (a batch of two, a tile's rest) keep two k in flight
  (1024x512 in cache, one thread, Zen 3: 35.7 us against 53.4, which four rows also took).
  Measured alone (one thread, this AVX-512 EPYC): 112 GFLOP/s at 16 rows
  against 62 for the row-dot form below, 115 at 128 rows; one row 42 GB/s on a 32 MB weight.
  AVX2 one row (one thread, weights in cache, a Zen 3 EPYC, 2026-12-07): 34.5 GB/s on
  512x1376 and 41.8 on 2048x512, against 19.6 and 21.2 with one chain per half; weights
  streamed from memory (the zoo Llama's 512x32000 head, two threads) run at about the memory's
  rate either way (17.7-18.4 GB/s, as fp32 ``MatMul`` did in the same rounds), and a
  prefetch of the lines 1 KB ahead took one thread's stream from 15.2 to 17.2 GB/s.
* **rows** ``Wt16 [N, K]`` (nn.Linear's layout, N not a multiple of 16): each output is one
  dot product over a contiguous weight row, widened in the same pass.

Chunks of panels (or rows) run on onnxruntime's intra-op pool (``KernelContext_ParallelFor``):
chunks of ``GAF_GH_CHUNK`` (2M) weight-products for 4M or more, else of ``GAF_GH_CHUNK_MID``
(256K), one thread below 512K. ``benchmarks/gemv_chain.py`` on a 2-core Xeon whose 480 MB L3
holds a small decoder: chains of the zoo Llama's MLP weights in fp16 (704K weights each) ran
13-14% faster on two threads than on the one the 2M chunks gave them (1.45 ms against 1.69);
in a probe, 128K chunks put the 512x512 layers on two threads too, which doubled their time.

Build: the library is compiled with ``-march=native`` (:mod:`graph_autofusion.codegen.
compiler`): AVX-512 on a machine that has it, AVX2 with F16C otherwise, plain C (a portable
half-to-float) elsewhere. ``gaf_gemv_f16_nk`` (rows) and ``gaf_gemv_f16_panels`` are exported
for tests.
"""

from __future__ import annotations

#: The operator's name in the ``ai.graph_autofusion`` domain.
OP = "GemvF16"

SOURCE = r"""
/* ---- GemvF16: y[..., N] = x[..., K] @ f32(W)^T, W fp16 as [N/16, K, 16] panels or [N, K]
   rows (graph-autofusion) ---- */
#if (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#ifndef GAF_GH_CHUNK
#define GAF_GH_CHUNK 2097152 /* weight-products (weights x rows, up to 8) per pool chunk */
#endif
#ifndef GAF_GH_CHUNK_MID
#define GAF_GH_CHUNK_MID 262144 /* under two of those: chunks of this (under two: one thread) */
#endif

typedef struct {
    const float *x; const uint16_t *w; float *y;
    int64_t M, N, K, rows; /* rows: panels (or weight rows) per chunk */
    int panels;            /* W is [N / 16, K, 16] (else [N, K]) */
} GafGemvH;

/* IEEE half to float, for the tail and for machines without F16C */
static inline float gaf_h2f(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, u;
    if (e == 0x1f) u = s | 0x7f800000u | (m << 13);
    else if (e) u = s | ((e + 112u) << 23) | (m << 13);
    else if (!m) u = s;
    else { /* subnormal */
        e = 113;
        while (!(m & 0x400u)) { m <<= 1; e--; }
        u = s | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f; memcpy(&f, &u, 4); return f;
}

/* dot(x, f32(w)) over K, the halves widened in registers */
static inline float gaf_gh_dot(const float *restrict x, const uint16_t *restrict w, int64_t K) {
    int64_t k = 0; float r = 0.f;
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    for (; k + 32 <= K; k += 32) {
        a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + k))), _mm512_loadu_ps(x + k), a0);
        a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + k + 16))), _mm512_loadu_ps(x + k + 16), a1);
    }
    for (; k + 16 <= K; k += 16)
        a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + k))), _mm512_loadu_ps(x + k), a0);
    r = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; k + 32 <= K; k += 32) {
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k))), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k + 8))), _mm256_loadu_ps(x + k + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k + 16))), _mm256_loadu_ps(x + k + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k + 24))), _mm256_loadu_ps(x + k + 24), a3);
    }
    for (; k + 8 <= K; k += 8)
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k))), _mm256_loadu_ps(x + k), a0);
    a0 = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    r = _mm_cvtss_f32(h);
#endif
    for (; k < K; k++) r += gaf_h2f(w[k]) * x[k];
    return r;
}

#define GAF_GH_INL static inline __attribute__((always_inline))
/* activation rows per tile: 8 accumulators of 16 (AVX-512's 32 registers hold them and the
   weights); AVX2 needs two registers per row, so 4 (8 + 2 + 1 of its 16) */
#if defined(__AVX512F__)
#define GAF_GH_ROWS 8
#else
#define GAF_GH_ROWS 4
#endif

/* a tile: R (1-8) activation rows (x, stride K) by one panel (w: [K][16] halves) into
   y (stride N); R is a constant where it is inlined, so the accumulators stay in registers */
GAF_GH_INL void gaf_gh_tile(const float *x, const uint16_t *w, float *y, int64_t K, int64_t N, const int R) {
#if defined(__AVX512F__)
    __m512 c[8];
    for (int r = 0; r < R; r++) c[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + k * 16)));
        for (int r = 0; r < R; r++) c[r] = _mm512_fmadd_ps(v, _mm512_set1_ps(x[r * K + k]), c[r]);
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(y + r * N, c[r]);
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    __m256 lo[8], hi[8];
    for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k * 16)));
        __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k * 16 + 8)));
        for (int r = 0; r < R; r++) {
            __m256 xv = _mm256_set1_ps(x[r * K + k]);
            lo[r] = _mm256_fmadd_ps(a, xv, lo[r]);
            hi[r] = _mm256_fmadd_ps(b, xv, hi[r]);
        }
    }
    for (int r = 0; r < R; r++) { _mm256_storeu_ps(y + r * N, lo[r]); _mm256_storeu_ps(y + r * N + 8, hi[r]); }
#else
    float c[8][16];
    memset(c, 0, sizeof c);
    for (int64_t k = 0; k < K; k++)
        for (int i = 0; i < 16; i++) {
            float v = gaf_h2f(w[k * 16 + i]);
            for (int r = 0; r < R; r++) c[r][i] += v * x[r * K + k];
        }
    for (int r = 0; r < R; r++) memcpy(y + r * N, c[r], sizeof c[r]);
#endif
}

/* one activation row by one panel: four k in flight (one accumulator would chain every FMA) */
GAF_GH_INL void gaf_gh_tile1(const float *x, const uint16_t *w, float *y, int64_t K) {
#if defined(__AVX512F__)
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    int64_t k = 0;
#define GAF_GH_V(i) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + (k + i) * 16)))
    for (; k + 4 <= K; k += 4) {
        c0 = _mm512_fmadd_ps(GAF_GH_V(0), _mm512_set1_ps(x[k]), c0);
        c1 = _mm512_fmadd_ps(GAF_GH_V(1), _mm512_set1_ps(x[k + 1]), c1);
        c2 = _mm512_fmadd_ps(GAF_GH_V(2), _mm512_set1_ps(x[k + 2]), c2);
        c3 = _mm512_fmadd_ps(GAF_GH_V(3), _mm512_set1_ps(x[k + 3]), c3);
    }
    for (; k < K; k++) c0 = _mm512_fmadd_ps(GAF_GH_V(0), _mm512_set1_ps(x[k]), c0);
#undef GAF_GH_V
    _mm512_storeu_ps(y, _mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)));
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    /* two halves of 8 outputs, four k in flight each: eight chains (the tile's one chain
       per half waits on every FMA's latency; one thread, weights in cache, a Zen 3 with
       AVX2: 34.5 GB/s against 19.6 on 512x1376, 41.8 against 21.2 on 2048x512) */
    __m256 l0 = _mm256_setzero_ps(), l1 = l0, l2 = l0, l3 = l0, h0 = l0, h1 = l0, h2 = l0, h3 = l0;
    int64_t k = 0;
#define GAF_GH_L(i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + (k + i) * 16)))
#define GAF_GH_H(i) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + (k + i) * 16 + 8)))
    for (; k + 4 <= K; k += 4) {
        /* the two lines 1 KB ahead: one thread streaming a 32 MB head from memory, 17.2
           GB/s against 15.2 without (a hint only: it reads nothing) */
        _mm_prefetch((const char *)(w + k * 16) + 1024, _MM_HINT_T0);
        _mm_prefetch((const char *)(w + k * 16) + 1088, _MM_HINT_T0);
        __m256 x0 = _mm256_set1_ps(x[k]), x1 = _mm256_set1_ps(x[k + 1]);
        __m256 x2 = _mm256_set1_ps(x[k + 2]), x3 = _mm256_set1_ps(x[k + 3]);
        l0 = _mm256_fmadd_ps(GAF_GH_L(0), x0, l0); h0 = _mm256_fmadd_ps(GAF_GH_H(0), x0, h0);
        l1 = _mm256_fmadd_ps(GAF_GH_L(1), x1, l1); h1 = _mm256_fmadd_ps(GAF_GH_H(1), x1, h1);
        l2 = _mm256_fmadd_ps(GAF_GH_L(2), x2, l2); h2 = _mm256_fmadd_ps(GAF_GH_H(2), x2, h2);
        l3 = _mm256_fmadd_ps(GAF_GH_L(3), x3, l3); h3 = _mm256_fmadd_ps(GAF_GH_H(3), x3, h3);
    }
    for (; k < K; k++) {
        __m256 xv = _mm256_set1_ps(x[k]);
        l0 = _mm256_fmadd_ps(GAF_GH_L(0), xv, l0); h0 = _mm256_fmadd_ps(GAF_GH_H(0), xv, h0);
    }
#undef GAF_GH_L
#undef GAF_GH_H
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_add_ps(l0, l1), _mm256_add_ps(l2, l3)));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(_mm256_add_ps(h0, h1), _mm256_add_ps(h2, h3)));
#else
    gaf_gh_tile(x, w, y, K, 0, 1);
#endif
}

/* two activation rows by one panel: on AVX2 two k in flight per row and half (eight chains,
   where the tile's four wait on each FMA: one thread, a 1024x512 weight in cache, Zen 3, two
   rows took as long as four) */
GAF_GH_INL void gaf_gh_tile2(const float *x, const uint16_t *w, float *y, int64_t K, int64_t N) {
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    __m256 l0 = _mm256_setzero_ps(), h0 = l0, l1 = l0, h1 = l0, m0 = l0, g0 = l0, m1 = l0, g1 = l0;
    int64_t k = 0;
#define GAF_GH_W(i, o) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + (k + i) * 16 + o)))
    for (; k + 2 <= K; k += 2) {
        _mm_prefetch((const char *)(w + k * 16) + 1024, _MM_HINT_T0);
        __m256 a0 = GAF_GH_W(0, 0), b0 = GAF_GH_W(0, 8), a1 = GAF_GH_W(1, 0), b1 = GAF_GH_W(1, 8);
        __m256 x0 = _mm256_set1_ps(x[k]), x1 = _mm256_set1_ps(x[k + 1]);
        l0 = _mm256_fmadd_ps(a0, x0, l0); h0 = _mm256_fmadd_ps(b0, x0, h0);
        l1 = _mm256_fmadd_ps(a1, x1, l1); h1 = _mm256_fmadd_ps(b1, x1, h1);
        x0 = _mm256_set1_ps(x[K + k]); x1 = _mm256_set1_ps(x[K + k + 1]);
        m0 = _mm256_fmadd_ps(a0, x0, m0); g0 = _mm256_fmadd_ps(b0, x0, g0);
        m1 = _mm256_fmadd_ps(a1, x1, m1); g1 = _mm256_fmadd_ps(b1, x1, g1);
    }
    if (k < K) {
        __m256 a0 = GAF_GH_W(0, 0), b0 = GAF_GH_W(0, 8);
        __m256 x0 = _mm256_set1_ps(x[k]), x1 = _mm256_set1_ps(x[K + k]);
        l0 = _mm256_fmadd_ps(a0, x0, l0); h0 = _mm256_fmadd_ps(b0, x0, h0);
        m0 = _mm256_fmadd_ps(a0, x1, m0); g0 = _mm256_fmadd_ps(b0, x1, g0);
    }
#undef GAF_GH_W
    _mm256_storeu_ps(y, _mm256_add_ps(l0, l1));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(h0, h1));
    _mm256_storeu_ps(y + N, _mm256_add_ps(m0, m1));
    _mm256_storeu_ps(y + N + 8, _mm256_add_ps(g0, g1));
#else
    gaf_gh_tile(x, w, y, K, N, 2);
#endif
}

/* panels [p0, p1) against every activation row, in tiles of GAF_GH_ROWS rows */
static void gaf_gh_panels(const GafGemvH *j, int64_t p0, int64_t p1) {
    const int64_t K = j->K, N = j->N, M = j->M;
    for (int64_t p = p0; p < p1; p++) {
        const uint16_t *w = j->w + p * K * 16;
        int64_t m = 0;
        for (; m + GAF_GH_ROWS <= M; m += GAF_GH_ROWS)
            gaf_gh_tile(j->x + m * K, w, j->y + m * N + p * 16, K, N, GAF_GH_ROWS);
        const float *x = j->x + m * K;
        float *y = j->y + m * N + p * 16;
        switch (M - m) {
        case 7: gaf_gh_tile(x, w, y, K, N, 7); break;
        case 6: gaf_gh_tile(x, w, y, K, N, 6); break;
        case 5: gaf_gh_tile(x, w, y, K, N, 5); break;
        case 4: gaf_gh_tile(x, w, y, K, N, 4); break;
        case 3: gaf_gh_tile(x, w, y, K, N, 3); break;
        case 2: gaf_gh_tile2(x, w, y, K, N); break;
        case 1: gaf_gh_tile1(x, w, y, K); break;
        default: break;
        }
    }
}

/* weight rows [n0, n1) of the rows layout: one dot product per output */
static void gaf_gh_rows(const GafGemvH *j, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++)
        for (int64_t m = 0; m < j->M; m++)
            j->y[m * j->N + n] = gaf_gh_dot(j->x + m * j->K, j->w + n * j->K, j->K);
}

/* chunk i: ``rows`` panels (panels layout) or weight rows */
static void gaf_gh_chunk(void *data, size_t i) {
    const GafGemvH *j = (const GafGemvH *)data;
    int64_t units = j->panels ? j->N / 16 : j->N;
    int64_t a = (int64_t)i * j->rows, b = a + j->rows;
    if (b > units) b = units;
    if (b <= a) return;
    if (j->panels) gaf_gh_panels(j, a, b);
    else gaf_gh_rows(j, a, b);
}

/* the exported entry points, for tests outside onnxruntime (one thread) */
__attribute__((visibility("default")))
void gaf_gemv_f16_nk(const float *x, const uint16_t *w, float *y, int64_t M, int64_t N, int64_t K) {
    GafGemvH j = {x, w, y, M, N, K, 0, 0};
    gaf_gh_rows(&j, 0, N);
}

__attribute__((visibility("default")))
void gaf_gemv_f16_panels(const float *x, const uint16_t *w, float *y, int64_t M, int64_t N, int64_t K) {
    GafGemvH j = {x, w, y, M, N, K, 0, 1};
    gaf_gh_panels(&j, 0, N / 16);
}

static OrtStatus *gaf_gh_compute(OrtKernelContext *ctx) {
    const OrtApi *api = gaf_api; OrtStatus *err;
    void *x, *w, *y; int64_t M, N, K; int panels;
    if ((err = gaf_gv_bind(ctx, "GemvF16", &x, &w, &y, &M, &N, &K, &panels)) || M == 0) return err;
    GafGemvH job = {(const float *)x, (const uint16_t *)w, (float *)y, M, N, K, 0, panels};
    /* chunks of ~GAF_GH_CHUNK weight-products (weights x rows, rows counted up to 8: past
       that, more rows is more work per weight but no more weights), at most 64 */
    int64_t units = panels ? N / 16 : N;
    int64_t work = N * K * (M < 8 ? M : 8);
    int64_t chunks = gaf_gv_chunks(work, GAF_GH_CHUNK, GAF_GH_CHUNK_MID, units);
    job.rows = chunks < 2 ? units : (units + chunks - 1) / chunks;
    if (chunks < 2) { gaf_gh_chunk(&job, 0); return 0; }
    chunks = (units + job.rows - 1) / job.rows;
    return api->KernelContext_ParallelFor(ctx, gaf_gh_chunk, (size_t)chunks, 0, &job);
}

static const char *ORT_API_CALL gaf_gh_name(const OrtCustomOp *op) { (void)op; return "GemvF16"; }
static ONNXTensorElementDataType ORT_API_CALL gaf_gh_in_type(const OrtCustomOp *op, size_t i) { (void)op; return i == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
static ONNXTensorElementDataType ORT_API_CALL gaf_gh_out_type(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
static void ORT_API_CALL gaf_gh_compute1(void *k, OrtKernelContext *ctx) { (void)k; OrtStatus *s = gaf_gh_compute(ctx); if (s) gaf_api->ReleaseStatus(s); }
static OrtStatusPtr ORT_API_CALL gaf_gh_compute2(void *k, OrtKernelContext *ctx) { (void)k; return gaf_gh_compute(ctx); }

static OrtCustomOp gaf_gemv_f16_op;

static void gaf_gemv_f16_fill(OrtCustomOp *g) {
    gaf_gemv_fill(g);  /* Gemv's wiring (two inputs, one output, the same callbacks) */
    g->GetName = gaf_gh_name;
    g->GetInputType = gaf_gh_in_type;
    g->GetOutputType = gaf_gh_out_type;
    g->KernelCompute = gaf_gh_compute1;
    g->KernelComputeV2 = gaf_gh_compute2;
}
"""
