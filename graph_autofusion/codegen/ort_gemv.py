"""The ``ai.graph_autofusion`` ``Gemv`` custom operator: ``MatMul(x, W)`` for few rows.

    y = Gemv(x, W)      # x [..., K] (any leading shape), W a [K, N] matrix: y [..., N]

Why: a decode step multiplies one row of activations by every weight matrix, so it is bound
by how fast the weights stream from memory, and onnxruntime's ``MatMul`` (MLAS on the
prepacked weight) streams them slower than a plain read runs (``benchmarks/gemv_ort.py``
times both). This kernel reads ``W`` in its stored ``[K, N]`` order (``MatMul``'s own
operand: nothing is transposed or duplicated, the rest of the graph keeps the weight as it
was): each chunk of columns ``[c0, c1)`` is walked one 512-column panel at a time, four
weight rows per step, the panel's accumulators (at most 8 rows x 512 floats, 16 KB) held in
L1, so every weight byte is read once in runs of 2 KB. Chunks of columns are run over
onnxruntime's own intra-op pool (``KernelContext_ParallelFor``), never a second pool.

Rows: any ``M`` works (the result is the same); the kernel re-reads ``W`` once per 8 rows, so
it is only *used* where ``M <= MAX_ROWS`` (:mod:`graph_autofusion.codegen.ort_matmul` puts it
in the then-branch of an ``If`` whose else-branch is the original ``MatMul``).

The C goes into the model's one custom-operator library
(:func:`graph_autofusion.codegen.ort_customop_c.customop_library_source` with
``gemv=True``); it uses that library's ``gaf_api``.
"""

from __future__ import annotations

#: The operator's name in the ``ai.graph_autofusion`` domain.
OP = "Gemv"
#: The most rows the lowering routes to the operator.
MAX_ROWS = 8

SOURCE = r"""
/* ---- Gemv: y[..., N] = x[..., K] @ Wt[N, K]^T, few rows (graph-autofusion) ---- */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#define GAF_GV_ROWS 8
#ifndef GAF_GV_CHUNK
#define GAF_GV_CHUNK 1048576 /* weights per chunk of the thread pool (fewer: one thread) */
#endif

typedef struct {
    const float *x, *w; float *y;
    int64_t M, N, K, blocks; /* blocks: 8-row weight blocks per chunk */
} GafGemvJob;

/* out[j] = dot(w0 + j * K, xr) for j < rows (rows <= 8): eight weight rows streamed at once,
   each with its own accumulator, the activation row reused from cache */
static inline void gaf_gv_rows(const float *restrict xr, const float *restrict w0, int64_t K,
                               int rows, float *restrict out) {
    int64_t k = 0;
    for (int j = 0; j < rows; j++) out[j] = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
    if (rows == GAF_GV_ROWS) {
        __m256 a[GAF_GV_ROWS];
        for (int j = 0; j < GAF_GV_ROWS; j++) a[j] = _mm256_setzero_ps();
        for (; k + 8 <= K; k += 8) {
            __m256 xv = _mm256_loadu_ps(xr + k);
            for (int j = 0; j < GAF_GV_ROWS; j++)
                a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + j * K + k), xv, a[j]);
        }
        for (int j = 0; j < GAF_GV_ROWS; j++) {
            float s[8];
            _mm256_storeu_ps(s, a[j]);
            out[j] = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
        }
    }
#endif
    for (int j = 0; j < rows; j++) {
        const float *wr = w0 + j * K;
        float r = 0.f;
        for (int64_t kk = k; kk < K; kk++) r += wr[kk] * xr[kk];
        out[j] += r;
    }
}

/* weight rows [n0, n1) against every activation row */
static void gaf_gv_cols(const GafGemvJob *j, int64_t n0, int64_t n1) {
    const int64_t K = j->K, N = j->N;
    float out[GAF_GV_ROWS];
    for (int64_t n = n0; n < n1; n += GAF_GV_ROWS) {
        const int rows = (int)(n1 - n < GAF_GV_ROWS ? n1 - n : GAF_GV_ROWS);
        for (int64_t m = 0; m < j->M; m++) {
            gaf_gv_rows(j->x + m * K, j->w + n * K, K, rows, out);
            for (int r = 0; r < rows; r++) j->y[m * N + n + r] = out[r];
        }
    }
}

static void gaf_gv_chunk(void *data, size_t i) {
    const GafGemvJob *j = (const GafGemvJob *)data;
    int64_t n0 = (int64_t)i * j->blocks * GAF_GV_ROWS, n1 = n0 + j->blocks * GAF_GV_ROWS;
    if (n1 > j->N) n1 = j->N;
    if (n1 > n0) gaf_gv_cols(j, n0, n1);
}

/* the exported entry point, for tests outside onnxruntime (one thread) */
__attribute__((visibility("default")))
void gaf_gemv_nk_f32(const float *x, const float *w, float *y, int64_t M, int64_t N, int64_t K) {
    GafGemvJob j = {x, w, y, M, N, K, 0};
    gaf_gv_cols(&j, 0, N);
}

static OrtStatus *gaf_gv_err(const char *msg) {
    char buf[256];
    snprintf(buf, sizeof buf, "graph-autofusion custom operator Gemv: %s", msg);
    return gaf_api->CreateStatus(ORT_INVALID_ARGUMENT, buf);
}

static OrtStatus *gaf_gv_compute(OrtKernelContext *ctx) {
    const OrtApi *api = gaf_api; OrtStatus *err;
    const OrtValue *xv, *wv; OrtValue *yv;
    int64_t xs[GAF_MAXD], ws[2]; size_t xr, wr;
    OrtTensorTypeAndShapeInfo *info;
    if ((err = api->KernelContext_GetInput(ctx, 0, &xv))) return err;
    if ((err = api->KernelContext_GetInput(ctx, 1, &wv))) return err;
    if ((err = api->GetTensorTypeAndShape(xv, &info))) return err;
    err = api->GetDimensionsCount(info, &xr);
    if (!err && (xr < 1 || xr > GAF_MAXD)) { api->ReleaseTensorTypeAndShapeInfo(info); return gaf_gv_err("x must have rank 1 to 12"); }
    if (!err) err = api->GetDimensions(info, xs, xr);
    api->ReleaseTensorTypeAndShapeInfo(info);
    if (err) return err;
    if ((err = api->GetTensorTypeAndShape(wv, &info))) return err;
    err = api->GetDimensionsCount(info, &wr);
    if (!err && wr != 2) { api->ReleaseTensorTypeAndShapeInfo(info); return gaf_gv_err("W must be a matrix"); }
    if (!err) err = api->GetDimensions(info, ws, 2);
    api->ReleaseTensorTypeAndShapeInfo(info);
    if (err) return err;
    const int64_t N = ws[0], K = ws[1];
    if (xs[xr - 1] != K) return gaf_gv_err("x's last dim differs from W's columns");
    int64_t ys[GAF_MAXD], M = 1;
    for (size_t i = 0; i + 1 < xr; i++) { ys[i] = xs[i]; M *= xs[i]; }
    ys[xr - 1] = N;
    if ((err = api->KernelContext_GetOutput(ctx, 0, ys, xr, &yv))) return err;
    void *x, *w, *y;
    if ((err = api->GetTensorMutableData((OrtValue *)xv, &x))) return err;
    if ((err = api->GetTensorMutableData((OrtValue *)wv, &w))) return err;
    if ((err = api->GetTensorMutableData(yv, &y))) return err;
    if (M == 0 || N == 0) return 0;
    if (K == 0) { memset(y, 0, sizeof(float) * (size_t)(M * N)); return 0; }
    GafGemvJob job = {(const float *)x, (const float *)w, (float *)y, M, N, K, 0};
    /* chunks of whole 8-row blocks and ~GAF_GV_CHUNK weights each, at most 64 */
    const int64_t nblocks = (N + GAF_GV_ROWS - 1) / GAF_GV_ROWS;
    int64_t chunks = (N * K) / GAF_GV_CHUNK;
    if (chunks > 64) chunks = 64;
    if (chunks > nblocks) chunks = nblocks;
    if (chunks < 2) { gaf_gv_cols(&job, 0, N); return 0; }
    job.blocks = (nblocks + chunks - 1) / chunks;
    chunks = (nblocks + job.blocks - 1) / job.blocks;
    return api->KernelContext_ParallelFor(ctx, gaf_gv_chunk, (size_t)chunks, 0, &job);
}

static const char *ORT_API_CALL gaf_gv_name(const OrtCustomOp *op) { (void)op; return "Gemv"; }
static ONNXTensorElementDataType ORT_API_CALL gaf_gv_type(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
static size_t ORT_API_CALL gaf_gv_nin(const OrtCustomOp *op) { (void)op; return 2; }
static size_t ORT_API_CALL gaf_gv_nout(const OrtCustomOp *op) { (void)op; return 1; }
static void *ORT_API_CALL gaf_gv_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) { (void)op; (void)api; (void)info; return (void *)1; }
static OrtStatusPtr ORT_API_CALL gaf_gv_create2(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **k) { (void)op; (void)api; (void)info; *k = (void *)1; return 0; }
static void ORT_API_CALL gaf_gv_compute1(void *k, OrtKernelContext *ctx) { (void)k; OrtStatus *s = gaf_gv_compute(ctx); if (s) gaf_api->ReleaseStatus(s); }
static OrtStatusPtr ORT_API_CALL gaf_gv_compute2(void *k, OrtKernelContext *ctx) { (void)k; return gaf_gv_compute(ctx); }

static OrtCustomOp gaf_gemv_op;

static void gaf_gemv_fill(OrtCustomOp *g) {
    memset(g, 0, sizeof *g);
    g->version = ORT_API_VERSION;
    g->CreateKernel = gaf_gv_create;
    g->GetName = gaf_gv_name;
    g->GetExecutionProviderType = gaf_ep;
    g->GetInputType = gaf_gv_type;
    g->GetInputTypeCount = gaf_gv_nin;
    g->GetOutputType = gaf_gv_type;
    g->GetOutputTypeCount = gaf_gv_nout;
    g->KernelCompute = gaf_gv_compute1;
    g->KernelDestroy = gaf_destroy;
    g->GetInputCharacteristic = gaf_required;
    g->GetOutputCharacteristic = gaf_required;
    g->GetInputMemoryType = gaf_memtype;
    g->GetVariadicInputMinArity = gaf_one;
    g->GetVariadicInputHomogeneity = gaf_one;
    g->GetVariadicOutputMinArity = gaf_one;
    g->GetVariadicOutputHomogeneity = gaf_one;
    g->CreateKernelV2 = gaf_gv_create2;
    g->KernelComputeV2 = gaf_gv_compute2;
    g->GetStartVersion = gaf_start;
    g->GetEndVersion = gaf_end;
}
"""
