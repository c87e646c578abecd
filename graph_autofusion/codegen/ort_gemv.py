"""The ``ai.graph_autofusion`` ``Gemv`` custom operator: ``MatMul(x, W)`` for few rows.

    y = Gemv(x, Wt)     # x [..., K] (any leading shape), Wt = W.T a [N, K] matrix: y [..., N]

Why: a decode step multiplies one row of activations by every weight matrix, so it is bound
by how fast the weights stream from memory. The kernel reads ``Wt`` (nn.Linear's layout) once:
four weight rows side by side (``GAF_GV_ROWS``), each a contiguous run of ``K`` floats, dotted
with every activation row while they sit in L1 (two AVX2 accumulators a row, each activation
vector loaded once for the four), the next four rows' cache lines prefetched as these are
read. Chunks of 4 MB of weights per thread (``GAF_GV_CHUNK``) for a matrix of 8 MB or more; a
smaller one in chunks of 1 MB (``GAF_GV_CHUNK_MID``), and in two at least from 256 KB
(``GAF_GV_SPLIT_MIN``, 8 rows or more); an even count under eight (``GAF_GV_EVEN``), of whole
four-row blocks.

Measured on a 2-core Intel Xeon (AVX-512, AMX), the zoo Llama's decode graph on the PyTorch
route (28 one-row layer contractions of 1-2.8 MB and a 65 MB LM head, 2026-12-06): one row at a
time, and one thread under 2 MB (this kernel until then), its session ran 5.07 ms; four rows
with the prefetch and two threads from 256 KB, 3.99, as fast as onnxruntime's packed GEMM on
the same weights (3.96) without its copy of them. Per layer: 512x512 78 -> 37-39 us, 1376x512
105-110 -> 85-88, the head 2450 -> 1980. A standalone harness over the same weights (OpenMP, 2
threads): one row at a time 33 GB/s, four rows 37, one row with the prefetch 39, four rows
with it 48; an AVX-512 row 39. The older measurements, from an AMD EPYC with a 65 MB head
streamed cold: one row at a time 54 GB/s with 2 threads, eight rows interleaved 50, a plain
read 53, 64 small chunks 44; a 16-wide AVX-512 dot 10% slower than AVX2 there, so it is not
used. Not yet measured on that machine: four rows with the prefetch, and two threads for a
1-2 MB matrix (there ``benchmarks/gemv_chain.py`` once found one thread faster for 1 MB, with
onnxruntime's workers asleep between operators; the serving sessions' now spin inside a run).
Chunks run on onnxruntime's own intra-op pool (``KernelContext_ParallelFor``), never a second
pool.

Rows: any ``M`` works (same result); the kernel re-reads ``Wt`` once per activation row from
L1, so it is only *used* where ``M <= MAX_ROWS``
(:mod:`graph_autofusion.codegen.ort_matmul` puts it in the then-branch of an ``If`` whose
else-branch is onnxruntime's GEMM on the same weight, or alone where the row count is
static and at most ``MAX_ROWS``).

The C goes into the model's one custom-operator library
(:func:`graph_autofusion.codegen.ort_customop_c.customop_library_source` with
``gemv=True``); it uses that library's ``gaf_api``. ``gaf_gemv_nk_f32`` (the kernel on one
thread) and ``gaf_gemv_plan`` (its thread-pool chunks) are exported for tests.
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
#ifndef GAF_GV_CHUNK
#define GAF_GV_CHUNK 1048576 /* weights per thread-pool chunk of a large matrix */
#endif
#ifndef GAF_GV_CHUNK_MID
#define GAF_GV_CHUNK_MID 262144 /* a matrix under two of those: chunks of this */
#endif
#ifndef GAF_GV_SPLIT_MIN
#define GAF_GV_SPLIT_MIN 65536 /* a matrix of at least this many weights: two chunks at least */
#endif
#ifndef GAF_GV_ROWS
#define GAF_GV_ROWS 4 /* weight rows read side by side (1: one at a time) */
#endif
#if GAF_GV_ROWS != 1 && GAF_GV_ROWS != 4
#error "GAF_GV_ROWS must be 1 or 4"
#endif
#ifndef GAF_GV_EVEN
#define GAF_GV_EVEN 1 /* an odd chunk count under 8 takes one more (two threads: even shares) */
#endif

typedef struct {
    const float *x, *w; float *y;
    int64_t M, N, K, rows; /* rows: weight rows per chunk */
} GafGemvJob;

#if defined(__AVX2__) && defined(__FMA__)
static inline float gaf_gv_hsum(__m256 a) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#endif

/* dot(x, w) over K: four accumulators, the weight row read once, front to back (the rows
   left over after the four-row blocks, and the GAF_GV_ROWS=1 build) */
static inline float gaf_gv_dot(const float *restrict x, const float *restrict w, int64_t K) {
    int64_t k = 0;
    float r = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; k + 32 <= K; k += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
    }
    for (; k + 8 <= K; k += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
    r = gaf_gv_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#endif
    for (; k < K; k++) r += w[k] * x[k];
    return r;
}

/* four weight rows w, w + K, w + 2K, w + 3K dotted with x into r[0..3]: four streams side
   by side, each x vector loaded once for the four; ``pf`` (not NULL): the next four rows, one
   cache line of each prefetched per line read here, so the next block arrives in time */
static inline void gaf_gv_dot4(const float *restrict x, const float *restrict w, int64_t K,
                               float *restrict r, const float *pf) {
    const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
    int64_t k = 0;
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (; k + 16 <= K; k += 16) {
        if (pf) {
            _mm_prefetch((const char *)(pf + k), _MM_HINT_T0);
            _mm_prefetch((const char *)(pf + K + k), _MM_HINT_T0);
            _mm_prefetch((const char *)(pf + 2 * K + k), _MM_HINT_T0);
            _mm_prefetch((const char *)(pf + 3 * K + k), _MM_HINT_T0);
        }
        __m256 xa = _mm256_loadu_ps(x + k), xb = _mm256_loadu_ps(x + k + 8);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), xa, a0);
        b0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k + 8), xb, b0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), xa, a1);
        b1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k + 8), xb, b1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), xa, a2);
        b2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k + 8), xb, b2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), xa, a3);
        b3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k + 8), xb, b3);
    }
    s0 = gaf_gv_hsum(_mm256_add_ps(a0, b0));
    s1 = gaf_gv_hsum(_mm256_add_ps(a1, b1));
    s2 = gaf_gv_hsum(_mm256_add_ps(a2, b2));
    s3 = gaf_gv_hsum(_mm256_add_ps(a3, b3));
#else
    (void)pf;
#endif
    for (; k < K; k++) {
        s0 += w0[k] * x[k]; s1 += w1[k] * x[k]; s2 += w2[k] * x[k]; s3 += w3[k] * x[k];
    }
    r[0] = s0; r[1] = s1; r[2] = s2; r[3] = s3;
}

/* weight rows [n0, n1) against every activation row, GAF_GV_ROWS at a time, the rest one by
   one (a block of four rows, 16 K bytes, stays in L1 for the next activation rows while K is
   up to ~2-3K) */
static void gaf_gv_cols(const GafGemvJob *j, int64_t n0, int64_t n1) {
    const int64_t K = j->K, N = j->N;
    int64_t n = n0;
#if GAF_GV_ROWS == 4
    for (; n + 4 <= n1; n += 4) {
        const float *wr = j->w + n * K;
        const float *pf = n + 8 <= n1 ? wr + 4 * K : 0;
        for (int64_t m = 0; m < j->M; m++) {
            float r[4];
            gaf_gv_dot4(j->x + m * K, wr, K, r, m == 0 ? pf : 0);
            float *ym = j->y + m * N + n;
            ym[0] = r[0]; ym[1] = r[1]; ym[2] = r[2]; ym[3] = r[3];
        }
    }
#endif
    for (; n < n1; n++) {
        const float *wr = j->w + n * K;
        for (int64_t m = 0; m < j->M; m++) j->y[m * N + n] = gaf_gv_dot(j->x + m * K, wr, K);
    }
}

/* thread-pool chunks for `work` (weights, or weight-products) over `units` weight rows or
   panels: chunks of `big` for a large matrix, of `mid` for one under two of those, at most 64
   and at most one per unit; under two, the caller runs it on its own thread (GemvF16; Gemv
   raises one chunk to two from GAF_GV_SPLIT_MIN, gaf_gv_plan) */
static inline int64_t gaf_gv_chunks(int64_t work, int64_t big, int64_t mid, int64_t units) {
    int64_t chunks = work / big;
    if (chunks < 2) chunks = work / mid;
    if (chunks > 64) chunks = 64;
    if (chunks > units) chunks = units;
    return chunks;
}

/* the thread-pool chunks of an N x K matrix (returned; under two: one thread) and the weight
   rows of each (*rows): chunks of ~GAF_GV_CHUNK weights (4 MB: 64 small chunks streamed a
   large matrix ~20% slower); a matrix under 8 MB in chunks of GAF_GV_CHUNK_MID (1 MB), and in
   two at least from GAF_GV_SPLIT_MIN weights (256 KB) when it has 8 rows or more (the serving
   sessions' workers spin inside a run, so a second thread costs little to wake); an odd count
   under 8 one more (GAF_GV_EVEN); at most 64; whole GAF_GV_ROWS blocks a chunk, which may
   leave the count odd again on a matrix of under ~200 rows */
static int64_t gaf_gv_plan(int64_t N, int64_t K, int64_t *rows) {
    int64_t chunks = gaf_gv_chunks(N * K, GAF_GV_CHUNK, GAF_GV_CHUNK_MID, N);
    if (chunks < 2 && GAF_GV_SPLIT_MIN > 0 && N * K >= GAF_GV_SPLIT_MIN && N >= 8) chunks = 2;
    if (GAF_GV_EVEN && chunks > 2 && chunks < 8 && (chunks & 1)) chunks++;
    if (chunks < 2) { *rows = N; return 1; }
    *rows = (N + chunks - 1) / chunks;
    *rows = (*rows + GAF_GV_ROWS - 1) / GAF_GV_ROWS * GAF_GV_ROWS; /* whole row blocks */
    return (N + *rows - 1) / *rows;
}

/* the plan, exported for tests: chunks and rows[0] */
__attribute__((visibility("default")))
int64_t gaf_gemv_plan(int64_t N, int64_t K, int64_t *rows) { return gaf_gv_plan(N, K, rows); }

static void gaf_gv_chunk(void *data, size_t i) {
    const GafGemvJob *j = (const GafGemvJob *)data;
    int64_t n0 = (int64_t)i * j->rows, n1 = n0 + j->rows;
    if (n1 > j->N) n1 = j->N;
    if (n1 > n0) gaf_gv_cols(j, n0, n1);
}

/* the exported entry point, for tests outside onnxruntime (one thread) */
__attribute__((visibility("default")))
void gaf_gemv_nk_f32(const float *x, const float *w, float *y, int64_t M, int64_t N, int64_t K) {
    GafGemvJob j = {x, w, y, M, N, K, 0};
    gaf_gv_cols(&j, 0, N);
}

static OrtStatus *gaf_gv_err(const char *op, const char *msg) {
    char buf[256];
    snprintf(buf, sizeof buf, "graph-autofusion custom operator %s: %s", op, msg);
    return gaf_api->CreateStatus(ORT_INVALID_ARGUMENT, buf);
}

/* the inputs x [..., K] and W [N, K] of a Gemv-like operator ``op`` (errors name it), its
   output y [..., N] allocated, and M (x's rows); *M = 0 when there is nothing to compute.
   ``panels`` (not NULL): W may also be [N / 16, K, 16], sixteen weight rows interleaved
   along K (*panels = 1 then) */
static OrtStatus *gaf_gv_bind(OrtKernelContext *ctx, const char *op, void **x, void **w, void **y,
                              int64_t *M, int64_t *N, int64_t *K, int *panels) {
    const OrtApi *api = gaf_api; OrtStatus *err;
    const OrtValue *xv, *wv; OrtValue *yv;
    int64_t xs[GAF_MAXD], ws[3]; size_t xr, wr;
    OrtTensorTypeAndShapeInfo *info;
    if ((err = api->KernelContext_GetInput(ctx, 0, &xv))) return err;
    if ((err = api->KernelContext_GetInput(ctx, 1, &wv))) return err;
    if ((err = api->GetTensorTypeAndShape(xv, &info))) return err;
    err = api->GetDimensionsCount(info, &xr);
    if (!err && (xr < 1 || xr > GAF_MAXD)) { api->ReleaseTensorTypeAndShapeInfo(info); return gaf_gv_err(op, "x must have rank 1 to 12"); }
    if (!err) err = api->GetDimensions(info, xs, xr);
    api->ReleaseTensorTypeAndShapeInfo(info);
    if (err) return err;
    if ((err = api->GetTensorTypeAndShape(wv, &info))) return err;
    err = api->GetDimensionsCount(info, &wr);
    if (!err && wr != 2 && !(panels && wr == 3)) { api->ReleaseTensorTypeAndShapeInfo(info); return gaf_gv_err(op, "W must be a matrix"); }
    if (!err) err = api->GetDimensions(info, ws, wr);
    api->ReleaseTensorTypeAndShapeInfo(info);
    if (err) return err;
    if (wr == 3 && ws[2] != 16) return gaf_gv_err(op, "a panel W must be [N / 16, K, 16]");
    if (panels) *panels = wr == 3;
    *N = wr == 3 ? 16 * ws[0] : ws[0]; *K = ws[1];
    if (xs[xr - 1] != *K) return gaf_gv_err(op, "x's last dim differs from W's columns");
    int64_t ys[GAF_MAXD], m = 1;
    for (size_t i = 0; i + 1 < xr; i++) { ys[i] = xs[i]; m *= xs[i]; }
    ys[xr - 1] = *N;
    *M = m;
    if ((err = api->KernelContext_GetOutput(ctx, 0, ys, xr, &yv))) return err;
    if ((err = api->GetTensorMutableData((OrtValue *)xv, x))) return err;
    if ((err = api->GetTensorMutableData((OrtValue *)wv, w))) return err;
    if ((err = api->GetTensorMutableData(yv, y))) return err;
    if (*N == 0) *M = 0;
    if (*M && *K == 0) { memset(*y, 0, sizeof(float) * (size_t)(*M * *N)); *M = 0; }
    return 0;
}

static OrtStatus *gaf_gv_compute(OrtKernelContext *ctx) {
    const OrtApi *api = gaf_api; OrtStatus *err;
    void *x, *w, *y; int64_t M, N, K;
    if ((err = gaf_gv_bind(ctx, "Gemv", &x, &w, &y, &M, &N, &K, 0)) || M == 0) return err;
    GafGemvJob job = {(const float *)x, (const float *)w, (float *)y, M, N, K, 0};
    int64_t chunks = gaf_gv_plan(N, K, &job.rows);
    if (chunks < 2) { gaf_gv_cols(&job, 0, N); return 0; }
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
