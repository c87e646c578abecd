"""The ``ai.graph_autofusion`` ``GeluErf`` and ``GeluTanh`` custom operators: GELU, with an
optional bias added first, in one pass whose inner loop the compiler vectorizes.

    y = GeluErf(x[, bias])    # v = x + bias; y = v * (1 + erf(v / sqrt 2)) / 2
    y = GeluTanh(x[, bias])   # y = v * (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3))) / 2
    # x f32 [..., N]; bias f32 [N]; y f32, x's shape

Why: onnxruntime's ``BiasGelu`` / ``Gelu`` / ``FastGelu`` make several passes over each row
(the bias add, then MLAS's erf or tanh over a buffer, then the product) and run near 1 G
elements/s a thread on this project's CPUs (``benchmarks/gelu_kernels.py``), while the GELU
after a transformer's or a ConvNeXt's 4x-wide linear layer touches the widest activation of the
block. Here each element is read once and written once, and its function is branch-free
arithmetic that ``-O3 -march=native`` turns into 16-wide AVX-512 (8-wide AVX2) code:

* **erf**: ``erf(a) = a P(a^2) / Q(a^2)`` with ``a`` clamped to 4 (``erf(4) = 1 - 1.5e-8``),
  P and Q of degree 5, fitted to ``erf`` on [0, 4] (a weighted least-squares iteration toward
  the minimax error): largest absolute error 3.7e-7 evaluated in fp32 (onnxruntime's ``Gelu``
  measures 4.5e-7 against a float64 reference), so ``GELU``'s own error is within
  ``|v| * 1.9e-7``. Coefficients: :data:`ERF_P`, :data:`ERF_Q`.
* **tanh**: ``tanh(a) = a P(a^2) / Q(a^2)``, ``a`` clamped to 7.9 (``tanh(7.9) = 1 - 2.7e-7``),
  P and Q of degree 4, fitted the same way on [0, 7.9]: largest absolute error 3.0e-7 in fp32.
  Coefficients: :data:`TANH_P`, :data:`TANH_Q`.

NaN inputs give NaN; +-inf give +inf and -0/NaN as the formula does (``inf * 0``: an erf
GELU of ``-inf`` is NaN here, 0 in float64 math; no model feeds GELU infinities). A call of
more than :data:`CHUNK` elements is split into chunks of that many over onnxruntime's intra-op
pool (``KernelContext_ParallelFor``). ``gaf_gelu`` (one thread) is exported for tests.
"""

from __future__ import annotations

#: The operators' names in the ``ai.graph_autofusion`` domain: the erf and the tanh GELU.
OP_ERF = "GeluErf"
OP_TANH = "GeluTanh"
OPS = (OP_ERF, OP_TANH)
#: Elements per thread-pool chunk (a call of more elements uses onnxruntime's pool).
CHUNK = 32768
#: ``erf(a) ~ a P(a^2) / Q(a^2)`` on [0, 4], lowest degree first (Q[0] = 1).
ERF_P = (
    1.128378987312317,
    0.1962740123271942,
    0.053470712155103683,
    0.00400466937571764,
    0.00028805562760680914,
    1.974543238247861e-06,
)
ERF_Q = (
    1.0,
    0.5072744488716125,
    0.11648669093847275,
    0.015446518547832966,
    0.001216589123941958,
    3.7478584999917075e-05,
)

#: ``tanh(a) ~ a P(a^2) / Q(a^2)`` on [0, 7.9], lowest degree first.
TANH_P = (
    1.0,
    0.13444404304027557,
    0.003571639768779278,
    2.1902465960010886e-05,
    1.5258299512765916e-08,
)
TANH_Q = (
    1.0,
    0.467777281999588,
    0.02616420015692711,
    0.00034116499591618776,
    8.52999733069737e-07,
)


def _horner(name: str, coefs: tuple[float, ...]) -> str:
    """C statements evaluating the polynomial ``coefs`` (lowest first) at ``s`` into ``name``."""
    out = [f"float {name} = {coefs[-1]!r}f;"]
    out += [f"{name} = {name} * s + {c!r}f;" for c in reversed(coefs[:-1])]
    return " ".join(out)


def _rational(fn: str, bound: float, p: tuple[float, ...], q: tuple[float, ...]) -> str:
    """``static inline float gaf_ge_<fn>(float x)``: the odd function ``x P(x^2) / Q(x^2)``,
    ``|x|`` clamped to ``bound``, at most 1 in magnitude and exactly 1 from ``bound`` on (so
    GELU(-big) is 0); branch-free."""
    return f"""
/* {fn}(x): x P(x^2) / Q(x^2), |x| clamped to {bound} (ort_gelu.{fn.upper()}_P / _Q) */
static inline float gaf_ge_{fn}(float x) {{
    float a = x < 0.f ? -x : x;
    a = a < {bound!r}f ? a : {bound!r}f;
    float s = a * a;
    {_horner("p", p)}
    {_horner("q", q)}
    float e = a * p / q;
    e = e < 1.f ? e : 1.f;
    e = a < {bound!r}f ? e : 1.f;  /* two selects: gcc 12 does not vectorize a nested one */
    return x < 0.f ? -e : e;
}}
"""


SOURCE = (
    r"""
/* ---- GeluErf / GeluTanh: y = gelu(x + bias), one pass (graph-autofusion) ---- */
#define GAF_GE_CHUNK """
    + str(CHUNK)
    + r"""

"""
    + _rational("erf", 4.0, ERF_P, ERF_Q)
    + _rational("tanh", 7.9, TANH_P, TANH_Q)
    + r"""
/* y[i] = gelu(x[i] + b[i]) over n elements (b NULL: no bias); four loops, each one the
   compiler vectorizes without a test inside */
#define GAF_GE_LOOP(V, F) _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { float v = V; y[i] = F; }
#define GAF_GE_ERF (0.5f * v * (1.f + gaf_ge_erf(v * 0.70710678118654752f)))
/* tanh form: u = sqrt(2 / pi) (v + 0.044715 v^3) */
#define GAF_GE_TANH (0.5f * v * (1.f + gaf_ge_tanh(0.7978845608028654f * (v + 0.044715f * v * v * v))))
static void gaf_ge_row(const float *restrict x, const float *restrict b, float *restrict y,
                       int64_t n, int tanh_form) {
    if (tanh_form && b) { GAF_GE_LOOP(x[i] + b[i], GAF_GE_TANH) }
    else if (tanh_form) { GAF_GE_LOOP(x[i], GAF_GE_TANH) }
    else if (b) { GAF_GE_LOOP(x[i] + b[i], GAF_GE_ERF) }
    else { GAF_GE_LOOP(x[i], GAF_GE_ERF) }
}

typedef struct {
    const float *x, *b; float *y;
    int64_t total, N; /* elements, and the bias's length (the rows' length) */
    int tanh_form;
} GafGelu;

/* elements [a, c): row pieces, each against its part of the bias */
static void gaf_ge_range(const GafGelu *j, int64_t a, int64_t c) {
    while (a < c) {
        int64_t col = a % j->N, len = j->N - col;
        if (len > c - a) len = c - a;
        gaf_ge_row(j->x + a, j->b ? j->b + col : 0, j->y + a, len, j->tanh_form);
        a += len;
    }
}

static void gaf_ge_chunk(void *data, size_t i) {
    const GafGelu *j = (const GafGelu *)data;
    int64_t a = (int64_t)i * GAF_GE_CHUNK, c = a + GAF_GE_CHUNK;
    if (c > j->total) c = j->total;
    if (a < c) gaf_ge_range(j, a, c);
}

/* the exported entry point, for tests outside onnxruntime (one thread): x [M, N], b [N] or NULL */
__attribute__((visibility("default")))
void gaf_gelu(const float *x, const float *b, float *y, int64_t M, int64_t N, int tanh_form) {
    GafGelu j = {x, b, y, M * N, N, tanh_form};
    if (N > 0) gaf_ge_range(&j, 0, M * N);
}

static OrtStatus *gaf_ge_compute(OrtKernelContext *ctx, int tanh_form) {
    const OrtApi *api = gaf_api; OrtStatus *err;
    const char *op = tanh_form ? "GeluTanh" : "GeluErf";
    const OrtValue *xv, *bv = 0; OrtValue *yv;
    int64_t xs[GAF_MAXD], bs[GAF_MAXD]; size_t xr, br = 0, nin;
    OrtTensorTypeAndShapeInfo *info;
    if ((err = api->KernelContext_GetInputCount(ctx, &nin))) return err;
    if ((err = api->KernelContext_GetInput(ctx, 0, &xv))) return err;
    if (nin > 1 && (err = api->KernelContext_GetInput(ctx, 1, &bv))) return err;
    if ((err = api->GetTensorTypeAndShape(xv, &info))) return err;
    err = api->GetDimensionsCount(info, &xr);
    if (!err && xr > GAF_MAXD) { api->ReleaseTensorTypeAndShapeInfo(info); return gaf_gv_err(op, "x must have rank 0 to 12"); }
    if (!err) err = api->GetDimensions(info, xs, xr);
    api->ReleaseTensorTypeAndShapeInfo(info);
    if (err) return err;
    if (bv) {
        if ((err = api->GetTensorTypeAndShape(bv, &info))) return err;
        err = api->GetDimensionsCount(info, &br);
        if (!err && br > GAF_MAXD) err = gaf_gv_err(op, "bias has too many dimensions");
        if (!err) err = api->GetDimensions(info, bs, br);
        api->ReleaseTensorTypeAndShapeInfo(info);
        if (err) return err;
        if (br != 1 || bs[0] != (xr ? xs[xr - 1] : 1)) return gaf_gv_err(op, "bias must be 1-D, as long as x's last dimension");
    }
    int64_t total = 1;
    for (size_t i = 0; i < xr; i++) total *= xs[i];
    if ((err = api->KernelContext_GetOutput(ctx, 0, xs, xr, &yv))) return err;
    if (total == 0) return 0;
    void *x, *b = 0, *y;
    if ((err = api->GetTensorMutableData((OrtValue *)xv, &x))) return err;
    if (bv && (err = api->GetTensorMutableData((OrtValue *)bv, &b))) return err;
    if ((err = api->GetTensorMutableData(yv, &y))) return err;
    GafGelu job = {(const float *)x, (const float *)b, (float *)y, total, xr ? xs[xr - 1] : 1, tanh_form};
    int64_t chunks = (total + GAF_GE_CHUNK - 1) / GAF_GE_CHUNK;
    if (chunks < 2) { gaf_ge_range(&job, 0, total); return 0; }
    return api->KernelContext_ParallelFor(ctx, gaf_ge_chunk, (size_t)chunks, 0, &job);
}

/* the kernel pointer says which GELU: 1 erf, 2 tanh */
static void *ORT_API_CALL gaf_ge_create_erf(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) { (void)op; (void)api; (void)info; return (void *)1; }
static void *ORT_API_CALL gaf_ge_create_tanh(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) { (void)op; (void)api; (void)info; return (void *)2; }
static OrtStatusPtr ORT_API_CALL gaf_ge_create2_erf(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **k) { (void)op; (void)api; (void)info; *k = (void *)1; return 0; }
static OrtStatusPtr ORT_API_CALL gaf_ge_create2_tanh(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **k) { (void)op; (void)api; (void)info; *k = (void *)2; return 0; }
static void ORT_API_CALL gaf_ge_compute1(void *k, OrtKernelContext *ctx) { OrtStatus *s = gaf_ge_compute(ctx, k == (void *)2); if (s) gaf_api->ReleaseStatus(s); }
static OrtStatusPtr ORT_API_CALL gaf_ge_compute2(void *k, OrtKernelContext *ctx) { return gaf_ge_compute(ctx, k == (void *)2); }
static const char *ORT_API_CALL gaf_ge_name_erf(const OrtCustomOp *op) { (void)op; return "GeluErf"; }
static const char *ORT_API_CALL gaf_ge_name_tanh(const OrtCustomOp *op) { (void)op; return "GeluTanh"; }
/* input 1 (the bias) is optional */
static OrtCustomOpInputOutputCharacteristic ORT_API_CALL gaf_ge_in_char(const OrtCustomOp *op, size_t i) { (void)op; return i ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED; }

static OrtCustomOp gaf_gelu_erf_op, gaf_gelu_tanh_op;

static void gaf_gelu_fill(OrtCustomOp *g, int tanh_form) {
    gaf_gemv_fill(g);  /* Gemv's wiring: two float inputs, one float output */
    g->GetName = tanh_form ? gaf_ge_name_tanh : gaf_ge_name_erf;
    g->CreateKernel = tanh_form ? gaf_ge_create_tanh : gaf_ge_create_erf;
    g->CreateKernelV2 = tanh_form ? gaf_ge_create2_tanh : gaf_ge_create2_erf;
    g->KernelCompute = gaf_ge_compute1;
    g->KernelComputeV2 = gaf_ge_compute2;
    g->GetInputCharacteristic = gaf_ge_in_char;
}
"""
)
