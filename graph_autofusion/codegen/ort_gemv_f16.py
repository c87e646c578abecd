"""The ``ai.graph_autofusion`` ``GemvF16`` custom operator: ``MatMul`` by an fp16 weight.

    y = GemvF16(x, Wt16)    # x f32 [..., K], Wt16 = W.T in fp16, [N, K]: y f32 [..., N]

Why: onnxruntime's CPU provider has no fused form of an fp32 activation times an fp16
weight (a ``Cast`` of an fp16 initializer is constant-folded back to fp32 when the session
loads; an fp16 ``MatMul`` with its activation cast runs slower than fp32 on x86; ``MatMulNBits``
takes 2-8 bits). A decode step streams every weight once per token, so half the bytes is
close to half the time. This operator is the fp16 form of ``FuseOptions.weights``
(:mod:`graph_autofusion.pipeline.weights`): the weight stays fp16 in memory and in the saved
file and is widened to fp32 in registers (F16C's ``vcvtph2ps``, 8 or 16 at a time), the
products accumulated in fp32, so the only error is the weight's rounding to fp16 (relative
2^-11 per weight).

Layout, shape checks (``gaf_gv_bind``) and threading follow ``Gemv``
(:mod:`graph_autofusion.codegen.ort_gemv`, whose source comes first in the library): ``Wt16`` is
nn.Linear's ``[N, K]``, each weight row one contiguous run of ``K`` halves; chunks of weight
rows run on onnxruntime's intra-op pool (``KernelContext_ParallelFor``), one thread below
``GAF_GH_CHUNK`` weights. One activation row: the row is widened and dotted in one pass.
More rows: four weight rows are widened at a time into a per-chunk fp32 buffer (L1) and each
activation row is dotted with all four (one activation load per four products), so a
prefill of a few dozen rows costs a few times a decode step, not one weight pass per row.

Build: the library is compiled with ``-march=native`` (:mod:`graph_autofusion.codegen.
compiler`): AVX-512 on a machine that has it, AVX2 with F16C otherwise, plain C (a portable
half-to-float) elsewhere. ``gaf_gemv_f16_nk`` is exported for tests.
"""

from __future__ import annotations

#: The operator's name in the ``ai.graph_autofusion`` domain.
OP = "GemvF16"

SOURCE = r"""
/* ---- GemvF16: y[..., N] = x[..., K] @ f32(Wt16[N, K])^T (graph-autofusion) ---- */
#if (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#ifndef GAF_GH_CHUNK
#define GAF_GH_CHUNK 2097152 /* weights per thread-pool chunk (4 MB of fp16) */
#endif

typedef struct {
    const float *x; const uint16_t *w; float *y;
    int64_t M, N, K, rows;
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

/* dst[0..K) = f32(w[0..K)) */
static inline void gaf_gh_widen(float *restrict dst, const uint16_t *restrict w, int64_t K) {
    int64_t k = 0;
#if defined(__AVX512F__)
    for (; k + 16 <= K; k += 16)
        _mm512_storeu_ps(dst + k, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + k))));
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    for (; k + 8 <= K; k += 8)
        _mm256_storeu_ps(dst + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k))));
#endif
    for (; k < K; k++) dst[k] = gaf_h2f(w[k]);
}

/* four fp32 weight rows (b, stride K) against one activation row: out[0..4) */
static inline void gaf_gh_dot4(const float *restrict x, const float *restrict b, int64_t K, float *out) {
    int64_t k = 0; float r0 = 0.f, r1 = 0.f, r2 = 0.f, r3 = 0.f;
#if defined(__AVX512F__)
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (; k + 16 <= K; k += 16) {
        __m512 v = _mm512_loadu_ps(x + k);
        c0 = _mm512_fmadd_ps(_mm512_loadu_ps(b + k), v, c0);
        c1 = _mm512_fmadd_ps(_mm512_loadu_ps(b + K + k), v, c1);
        c2 = _mm512_fmadd_ps(_mm512_loadu_ps(b + 2 * K + k), v, c2);
        c3 = _mm512_fmadd_ps(_mm512_loadu_ps(b + 3 * K + k), v, c3);
    }
    r0 = _mm512_reduce_add_ps(c0); r1 = _mm512_reduce_add_ps(c1);
    r2 = _mm512_reduce_add_ps(c2); r3 = _mm512_reduce_add_ps(c3);
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (; k + 8 <= K; k += 8) {
        __m256 v = _mm256_loadu_ps(x + k);
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(b + k), v, c0);
        c1 = _mm256_fmadd_ps(_mm256_loadu_ps(b + K + k), v, c1);
        c2 = _mm256_fmadd_ps(_mm256_loadu_ps(b + 2 * K + k), v, c2);
        c3 = _mm256_fmadd_ps(_mm256_loadu_ps(b + 3 * K + k), v, c3);
    }
    float t[8];
    _mm256_storeu_ps(t, c0); for (int i = 0; i < 8; i++) r0 += t[i];
    _mm256_storeu_ps(t, c1); for (int i = 0; i < 8; i++) r1 += t[i];
    _mm256_storeu_ps(t, c2); for (int i = 0; i < 8; i++) r2 += t[i];
    _mm256_storeu_ps(t, c3); for (int i = 0; i < 8; i++) r3 += t[i];
#endif
    for (; k < K; k++) {
        float v = x[k];
        r0 += b[k] * v; r1 += b[K + k] * v; r2 += b[2 * K + k] * v; r3 += b[3 * K + k] * v;
    }
    out[0] = r0; out[1] = r1; out[2] = r2; out[3] = r3;
}

/* weight rows [n0, n1); buf: 4 * K floats (NULL: one activation row) */
static void gaf_gh_cols(const GafGemvH *j, int64_t n0, int64_t n1, float *buf) {
    const int64_t K = j->K, N = j->N, M = j->M;
    int64_t n = n0;
    if (buf) {
        for (; n + 4 <= n1; n += 4) {
            for (int i = 0; i < 4; i++) gaf_gh_widen(buf + i * K, j->w + (n + i) * K, K);
            for (int64_t m = 0; m < M; m++) {
                float o[4];
                gaf_gh_dot4(j->x + m * K, buf, K, o);
                memcpy(j->y + m * N + n, o, sizeof o);
            }
        }
    }
    for (; n < n1; n++)
        for (int64_t m = 0; m < M; m++) j->y[m * N + n] = gaf_gh_dot(j->x + m * K, j->w + n * K, K);
}

static void gaf_gh_run(const GafGemvH *j, int64_t n0, int64_t n1) {
    float *buf = j->M > 1 ? (float *)malloc(sizeof(float) * 4 * (size_t)j->K) : 0;
    gaf_gh_cols(j, n0, n1, buf);  /* buf NULL (one row, or no memory): the one-pass dot */
    free(buf);
}

static void gaf_gh_chunk(void *data, size_t i) {
    const GafGemvH *j = (const GafGemvH *)data;
    int64_t n0 = (int64_t)i * j->rows, n1 = n0 + j->rows;
    if (n1 > j->N) n1 = j->N;
    if (n1 > n0) gaf_gh_run(j, n0, n1);
}

/* the exported entry point, for tests outside onnxruntime (one thread) */
__attribute__((visibility("default")))
void gaf_gemv_f16_nk(const float *x, const uint16_t *w, float *y, int64_t M, int64_t N, int64_t K) {
    GafGemvH j = {x, w, y, M, N, K, 0};
    gaf_gh_run(&j, 0, N);
}

static OrtStatus *gaf_gh_compute(OrtKernelContext *ctx) {
    const OrtApi *api = gaf_api; OrtStatus *err;
    void *x, *w, *y; int64_t M, N, K;
    if ((err = gaf_gv_bind(ctx, "GemvF16", &x, &w, &y, &M, &N, &K)) || M == 0) return err;
    GafGemvH job = {(const float *)x, (const uint16_t *)w, (float *)y, M, N, K, 0};
    /* chunks of ~GAF_GH_CHUNK weights, at most 64, whole groups of four rows; more rows of
       activations: more work per weight, so smaller matrices are split too */
    int64_t work = N * K * (M < 8 ? M : 8);
    int64_t chunks = work / GAF_GH_CHUNK;
    if (chunks > 64) chunks = 64;
    if (chunks > N / 4) chunks = N / 4;
    if (chunks < 2) { gaf_gh_run(&job, 0, N); return 0; }
    job.rows = ((N + chunks - 1) / chunks + 3) / 4 * 4;
    chunks = (N + job.rows - 1) / job.rows;
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
