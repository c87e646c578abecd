"""The ``ai.graph_autofusion`` ``GemvQ`` custom operator: ``MatMul`` by a blockwise 8- or 4-bit
weight, the dequantization inside the contraction and the activations kept fp32.

    y = GemvQ(x, Wq, S, Z)   # x f32 [..., K]; y f32 [..., N]
    # Wq u8 [N/16, K, 16] (8-bit) or [N/16, K, 8] (4-bit, two weights a byte)
    # S  f32 [N/16, nb, 16]: one scale per output and block of B = K / nb along K
    # Z  u8  [N/16, nb, 16] (a zero point per output and block) or [1] (one for all)
    # W[k, n] = (q[n, k] - z[n, k / B]) * s[n, k / B]

Why: a decode step streams every weight once per token. onnxruntime's ``MatMulNBits`` reads
the same bytes, but on the few-row products of a decode step it carries a fixed cost a call
(its fast path quantizes the activations to int8 first; ``benchmarks/results/gemv_stream.md``:
44 us for a 0.35 MB int4 layer that the streaming rate reads in ~10) and it changes the
activations' precision. This operator is :mod:`graph_autofusion.codegen.ort_gemv_f16`'s panel
kernel with a narrower weight: sixteen outputs' weights at one k side by side (16 bytes at
8 bits, 8 at 4 bits: the low nibble of byte i is output 2i, the high one 2i + 1), widened in
registers (``vpmovzxbd``, ``vcvtdq2ps``) and multiplied by the broadcast activations, one
accumulator per activation row for a block, then scaled into the row's sum. The zero point is
subtracted once per block, as ``z * s * sum(x over the block)`` (the block sums of each
activation row are computed once a call), so the inner loop is a widen and a multiply-add.
The only error is the weight's own rounding: the activations stay fp32, as in the fp32 model.

Which of ``MatMulNBits`` and this runs a layer is decided by safe mode's per-layer timing
(:func:`graph_autofusion.pipeline.weights_checks.check_speed`); both read the same quantized
values (:func:`to_panels` re-lays ``MatMulNBits``' blocks), so the choice changes no number
beyond rounding order and the activation quantization ``MatMulNBits`` does.

Rows: any ``M`` works; tiles of up to 8 activation rows (4 on AVX2 with two halves of 8
outputs) re-read a panel from L1 (a prefill is a GEMM at a register-tile's rate).
Chunks of panels run on onnxruntime's intra-op pool, planned as ``GemvF16``'s (the same
weight-product counts: a panel chunk is a run of weights whatever their width).

Build: compiled with ``-march=native`` in the model's one custom-operator library
(:func:`graph_autofusion.codegen.ort_customop_c.customop_library_source` with ``gemv=True``):
AVX-512 where the machine has it, AVX2 + FMA otherwise, plain C elsewhere. ``gaf_gemv_q`` (one
thread) is exported for tests.
"""

from __future__ import annotations

import numpy as np

#: The operator's name in the ``ai.graph_autofusion`` domain.
OP = "GemvQ"

SOURCE = r"""
/* ---- GemvQ: y[..., N] = x[..., K] @ dequant(Wq)^T, 8- or 4-bit panels with block scales and
   zero points (graph-autofusion) ---- */
#ifndef GAF_GQ_CHUNK
#define GAF_GQ_CHUNK 2097152 /* weight-products per pool chunk (as GemvF16) */
#endif
#ifndef GAF_GQ_CHUNK_MID
#define GAF_GQ_CHUNK_MID 262144
#endif

typedef struct {
    const float *x; const uint8_t *w; const float *s; const uint8_t *z; const float *xs; float *y;
    int64_t M, N, K, B, nb, rows; /* rows: panels per chunk */
    int bits, zfull;              /* zfull: z per output and block (else z[0] for all) */
} GafGemvQ;

#define GAF_GQ_INL static inline __attribute__((always_inline))

/* the sixteen weights of panel row k as floats (plain C: also the reference for the tails) */
GAF_GQ_INL void gaf_gq_row(const uint8_t *w, int64_t k, int bits, float *out) {
    if (bits == 8) { const uint8_t *p = w + k * 16; for (int i = 0; i < 16; i++) out[i] = (float)p[i]; }
    else { const uint8_t *p = w + k * 8; for (int i = 0; i < 8; i++) { out[2 * i] = (float)(p[i] & 15); out[2 * i + 1] = (float)(p[i] >> 4); } }
}

#if defined(__AVX512F__)
GAF_GQ_INL __m512 gaf_gq_w(const uint8_t *w, int64_t k, const int bits) {
    if (bits == 8) return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + k * 16))));
    __m128i b = _mm_loadl_epi64((const __m128i *)(w + k * 8)), m = _mm_set1_epi8(15);
    __m128i v = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
}
/* the weights of panel rows k .. k + 3 (4-bit: one 32-byte load, unpacked per 128-bit lane) */
GAF_GQ_INL void gaf_gq_w4x(const uint8_t *w, int64_t k, const int bits, __m512 *v) {
    if (bits == 8) {
        for (int i = 0; i < 4; i++) v[i] = gaf_gq_w(w, k + i, 8);
        return;
    }
    __m256i b = _mm256_loadu_si256((const __m256i *)(w + k * 8)), m = _mm256_set1_epi8(15);
    __m256i lo = _mm256_and_si256(b, m), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m);
    __m256i u0 = _mm256_unpacklo_epi8(lo, hi), u1 = _mm256_unpackhi_epi8(lo, hi); /* k, k + 2 | k + 1, k + 3 */
    v[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(u0)));
    v[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(u1)));
    v[2] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(u0, 1)));
    v[3] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(u1, 1)));
}
#define GAF_GQ_ROWS 8
#elif defined(__AVX2__) && defined(__FMA__)
/* the two halves (outputs 0-7, 8-15) */
GAF_GQ_INL void gaf_gq_w2(const uint8_t *w, int64_t k, const int bits, __m256 *lo, __m256 *hi) {
    __m128i v;
    if (bits == 8) v = _mm_loadu_si128((const __m128i *)(w + k * 16));
    else {
        __m128i b = _mm_loadl_epi64((const __m128i *)(w + k * 8)), m = _mm_set1_epi8(15);
        v = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    }
    *lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    *hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
}
#define GAF_GQ_ROWS 2
#else
#define GAF_GQ_ROWS 4
#endif

/* a tile: R activation rows from row m by panel p, into y; two accumulators a row (even and
   odd k), so one row still has independent chains */
GAF_GQ_INL void gaf_gq_tile(const GafGemvQ *j, int64_t p, int64_t m, const int R, const int bits) {
    const int64_t K = j->K, B = j->B, nb = j->nb, N = j->N;
    const uint8_t *w = j->w + p * K * (bits == 8 ? 16 : 8);
    const float *x = j->x + m * K, *xs = j->xs + m * nb, *s = j->s + p * nb * 16;
    const uint8_t *z = j->zfull ? j->z + p * nb * 16 : 0;
    float *y = j->y + m * N + p * 16;
#if defined(__AVX512F__)
    __m512 c[8], a[8], e[8];
    const __m512 z0 = _mm512_set1_ps((float)j->z[0]);
    for (int r = 0; r < R; r++) c[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < R; r++) a[r] = e[r] = _mm512_setzero_ps();
        int64_t k = b * B, end = k + B;
        for (; k + 2 <= end; k += 2) {
            __m512 v0 = gaf_gq_w(w, k, bits), v1 = gaf_gq_w(w, k + 1, bits);
            for (int r = 0; r < R; r++) {
                a[r] = _mm512_fmadd_ps(v0, _mm512_set1_ps(x[r * K + k]), a[r]);
                e[r] = _mm512_fmadd_ps(v1, _mm512_set1_ps(x[r * K + k + 1]), e[r]);
            }
        }
        if (k < end) {
            __m512 v0 = gaf_gq_w(w, k, bits);
            for (int r = 0; r < R; r++) a[r] = _mm512_fmadd_ps(v0, _mm512_set1_ps(x[r * K + k]), a[r]);
        }
        __m512 sv = _mm512_loadu_ps(s + b * 16);
        __m512 zv = z ? _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(z + b * 16)))) : z0;
        __m512 zs = _mm512_mul_ps(sv, zv);
        for (int r = 0; r < R; r++) {
            c[r] = _mm512_fmadd_ps(_mm512_add_ps(a[r], e[r]), sv, c[r]);
            c[r] = _mm512_fnmadd_ps(zs, _mm512_set1_ps(xs[r * nb + b]), c[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(y + r * N, c[r]);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 cl[2], ch[2], al[2], ah[2], el[2], eh[2];
    const __m256 z0 = _mm256_set1_ps((float)j->z[0]);
    for (int r = 0; r < R; r++) cl[r] = ch[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < R; r++) al[r] = ah[r] = el[r] = eh[r] = _mm256_setzero_ps();
        int64_t k = b * B, end = k + B;
        for (; k + 2 <= end; k += 2) {
            __m256 l0, h0, l1, h1;
            gaf_gq_w2(w, k, bits, &l0, &h0);
            gaf_gq_w2(w, k + 1, bits, &l1, &h1);
            for (int r = 0; r < R; r++) {
                __m256 x0 = _mm256_set1_ps(x[r * K + k]), x1 = _mm256_set1_ps(x[r * K + k + 1]);
                al[r] = _mm256_fmadd_ps(l0, x0, al[r]); ah[r] = _mm256_fmadd_ps(h0, x0, ah[r]);
                el[r] = _mm256_fmadd_ps(l1, x1, el[r]); eh[r] = _mm256_fmadd_ps(h1, x1, eh[r]);
            }
        }
        if (k < end) {
            __m256 l0, h0;
            gaf_gq_w2(w, k, bits, &l0, &h0);
            for (int r = 0; r < R; r++) {
                __m256 x0 = _mm256_set1_ps(x[r * K + k]);
                al[r] = _mm256_fmadd_ps(l0, x0, al[r]); ah[r] = _mm256_fmadd_ps(h0, x0, ah[r]);
            }
        }
        __m256 sl = _mm256_loadu_ps(s + b * 16), sh = _mm256_loadu_ps(s + b * 16 + 8), zl = z0, zh = z0;
        if (z) {
            __m128i zb = _mm_loadu_si128((const __m128i *)(z + b * 16));
            zl = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(zb));
            zh = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(zb, 8)));
        }
        zl = _mm256_mul_ps(sl, zl); zh = _mm256_mul_ps(sh, zh);
        for (int r = 0; r < R; r++) {
            __m256 xb = _mm256_set1_ps(xs[r * nb + b]);
            cl[r] = _mm256_fnmadd_ps(zl, xb, _mm256_fmadd_ps(_mm256_add_ps(al[r], el[r]), sl, cl[r]));
            ch[r] = _mm256_fnmadd_ps(zh, xb, _mm256_fmadd_ps(_mm256_add_ps(ah[r], eh[r]), sh, ch[r]));
        }
    }
    for (int r = 0; r < R; r++) { _mm256_storeu_ps(y + r * N, cl[r]); _mm256_storeu_ps(y + r * N + 8, ch[r]); }
#else
    float c[4][16], a[4][16], v[16];
    memset(c, 0, sizeof c);
    for (int64_t b = 0; b < nb; b++) {
        memset(a, 0, sizeof a);
        for (int64_t k = b * B; k < b * B + B; k++) {
            gaf_gq_row(w, k, bits, v);
            for (int r = 0; r < R; r++)
                for (int i = 0; i < 16; i++) a[r][i] += v[i] * x[r * K + k];
        }
        for (int i = 0; i < 16; i++) {
            float sv = s[b * 16 + i], zv = (float)(z ? z[b * 16 + i] : j->z[0]);
            for (int r = 0; r < R; r++) c[r][i] += a[r][i] * sv - zv * sv * xs[r * nb + b];
        }
    }
    for (int r = 0; r < R; r++) memcpy(y + r * N, c[r], sizeof c[r]);
#endif
}

/* one activation row (a decode step) by panel p: four accumulators over k, so the multiply-adds
   do not wait on each other (AVX-512; elsewhere the tile's own) */
GAF_GQ_INL void gaf_gq_tile1(const GafGemvQ *j, int64_t p, int64_t m, const int bits) {
#if defined(__AVX512F__)
    const int64_t K = j->K, B = j->B, nb = j->nb;
    const uint8_t *w = j->w + p * K * (bits == 8 ? 16 : 8);
    const float *x = j->x + m * K, *xs = j->xs + m * nb, *s = j->s + p * nb * 16;
    const uint8_t *z = j->zfull ? j->z + p * nb * 16 : 0;
    const __m512 z0 = _mm512_set1_ps((float)j->z[0]);
    __m512 c = _mm512_setzero_ps(), v[4];
    for (int64_t b = 0; b < nb; b++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t k = b * B, end = k + B;
        for (; k + 4 <= end; k += 4) {
            gaf_gq_w4x(w, k, bits, v);
            a0 = _mm512_fmadd_ps(v[0], _mm512_set1_ps(x[k]), a0);
            a1 = _mm512_fmadd_ps(v[1], _mm512_set1_ps(x[k + 1]), a1);
            a2 = _mm512_fmadd_ps(v[2], _mm512_set1_ps(x[k + 2]), a2);
            a3 = _mm512_fmadd_ps(v[3], _mm512_set1_ps(x[k + 3]), a3);
        }
        for (; k < end; k++) a0 = _mm512_fmadd_ps(gaf_gq_w(w, k, bits), _mm512_set1_ps(x[k]), a0);
        __m512 sv = _mm512_loadu_ps(s + b * 16);
        __m512 zv = z ? _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(z + b * 16)))) : z0;
        c = _mm512_fmadd_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)), sv, c);
        c = _mm512_fnmadd_ps(_mm512_mul_ps(sv, zv), _mm512_set1_ps(xs[b]), c);
    }
    _mm512_storeu_ps(j->y + m * j->N + p * 16, c);
#else
    gaf_gq_tile(j, p, m, 1, bits);
#endif
}

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
        case 1: gaf_gq_tile1(j, p, m, bits); break;
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

/* each activation row's sums over the blocks: xs[m * nb + b] */
static void gaf_gq_sums(const float *x, float *xs, int64_t M, int64_t K, int64_t B, int64_t nb) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            float t = 0.f;
            const float *p = x + m * K + b * B;
            for (int64_t k = 0; k < B; k++) t += p[k];
            xs[m * nb + b] = t;
        }
}

/* the exported entry point, for tests outside onnxruntime (one thread); zfull 0: z[0] for all */
__attribute__((visibility("default")))
int gaf_gemv_q(const float *x, const uint8_t *w, const float *s, const uint8_t *z, int zfull,
               float *y, int64_t M, int64_t N, int64_t K, int64_t nb, int bits) {
    if (N % 16 || nb < 1 || K % nb || (bits != 8 && bits != 4)) return -1;
    float *xs = (float *)malloc(sizeof(float) * (size_t)(M * nb + 1));
    if (!xs) return -2;
    gaf_gq_sums(x, xs, M, K, K / nb, nb);
    GafGemvQ j = {x, w, s, z, xs, y, M, N, K, K / nb, nb, 0, bits, zfull};
    gaf_gq_panels(&j, 0, N / 16);
    free(xs);
    return 0;
}

/* the dims of input i (rank at most 3) */
static OrtStatus *gaf_gq_dims(OrtKernelContext *ctx, size_t i, const OrtValue **v, int64_t *d, size_t *rank) {
    const OrtApi *api = gaf_api; OrtStatus *err; OrtTensorTypeAndShapeInfo *info;
    if ((err = api->KernelContext_GetInput(ctx, i, v))) return err;
    if ((err = api->GetTensorTypeAndShape(*v, &info))) return err;
    err = api->GetDimensionsCount(info, rank);
    if (!err && *rank > 3) err = gaf_gv_err("GemvQ", "Wq, S and Z have rank 1 to 3");
    if (!err) err = api->GetDimensions(info, d, *rank);
    api->ReleaseTensorTypeAndShapeInfo(info);
    return err;
}

static OrtStatus *gaf_gq_compute(OrtKernelContext *ctx) {
    const OrtApi *api = gaf_api; OrtStatus *err;
    const OrtValue *xv, *wv, *sv, *zv; OrtValue *yv;
    int64_t xd[GAF_MAXD], wd[3], sd[3], zd[3]; size_t xr, wr, sr, zr;
    OrtTensorTypeAndShapeInfo *info;
    if ((err = api->KernelContext_GetInput(ctx, 0, &xv))) return err;
    if ((err = api->GetTensorTypeAndShape(xv, &info))) return err;
    err = api->GetDimensionsCount(info, &xr);
    if (!err && (xr < 1 || xr > GAF_MAXD)) err = gaf_gv_err("GemvQ", "x must have rank 1 to 12");
    if (!err) err = api->GetDimensions(info, xd, xr);
    api->ReleaseTensorTypeAndShapeInfo(info);
    if (err) return err;
    if ((err = gaf_gq_dims(ctx, 1, &wv, wd, &wr)) || (err = gaf_gq_dims(ctx, 2, &sv, sd, &sr)) ||
        (err = gaf_gq_dims(ctx, 3, &zv, zd, &zr))) return err;
    if (wr != 3 || (wd[2] != 16 && wd[2] != 8)) return gaf_gv_err("GemvQ", "Wq must be [N / 16, K, 16] (8-bit) or [N / 16, K, 8] (4-bit)");
    int64_t P = wd[0], K = wd[1], N = 16 * P, nb = sr == 3 ? sd[1] : 0;
    int bits = wd[2] == 16 ? 8 : 4;
    if (sr != 3 || sd[0] != P || sd[2] != 16 || nb < 1 || K % nb) return gaf_gv_err("GemvQ", "S must be [N / 16, nb, 16] with nb dividing K");
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
    float *xs = (float *)malloc(sizeof(float) * (size_t)(M * nb));
    if (!xs) return api->CreateStatus(ORT_FAIL, "graph-autofusion custom operator GemvQ: out of memory");
    gaf_gq_sums((const float *)x, xs, M, K, K / nb, nb);
    GafGemvQ job = {(const float *)x, (const uint8_t *)w, (const float *)s, (const uint8_t *)z, xs, (float *)y,
                    M, N, K, K / nb, nb, 0, bits, zfull};
    int64_t work = N * K * (M < 8 ? M : 8);
    int64_t chunks = gaf_gv_chunks(work, GAF_GQ_CHUNK, GAF_GQ_CHUNK_MID, P);
    if (chunks < 2) gaf_gq_panels(&job, 0, P);
    else {
        job.rows = (P + chunks - 1) / chunks;
        chunks = (P + job.rows - 1) / job.rows;
        err = api->KernelContext_ParallelFor(ctx, gaf_gq_chunk, (size_t)chunks, 0, &job);
    }
    free(xs);
    return err;
}

static const char *ORT_API_CALL gaf_gq_name(const OrtCustomOp *op) { (void)op; return "GemvQ"; }
static ONNXTensorElementDataType ORT_API_CALL gaf_gq_in_type(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i == 1 || i == 3 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
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


def eligible(k: int, n: int, block_size: int) -> bool:
    """Whether a ``[K, N]`` weight quantized in blocks of ``block_size`` can be ``GemvQ``'s:
    whole panels of 16 outputs and whole blocks along K."""
    return n % 16 == 0 and k % block_size == 0 and k > 0


def to_panels(
    b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, bits: int, k: int, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``MatMulNBits``' ``(B [N, nb, blob], scales [N, nb], zero_points)`` as ``GemvQ``'s
    ``(Wq, S, Z)`` (see the module docstring); the same quantized values. Symmetric weights
    (no zero points) get ``Z = [2 ** (bits - 1)]``, ``MatMulNBits``' default."""
    nb = scales.shape[1]
    p = n // 16
    if bits == 8:
        q = b.reshape(n, -1)[:, :k]  # [N, K]
        wq = q.reshape(p, 16, k).transpose(0, 2, 1)  # [P, K, 16]
    else:
        packed = b.reshape(n, -1)  # [N, nb * B / 2]: weight 2i low nibble, 2i + 1 high
        q = np.empty((n, packed.shape[1] * 2), np.uint8)
        q[:, 0::2], q[:, 1::2] = packed & 15, packed >> 4
        q = q[:, :k].reshape(p, 16, k).transpose(0, 2, 1)  # [P, K, 16]
        wq = q[..., 0::2] | (q[..., 1::2] << 4)  # [P, K, 8]
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
        np.ascontiguousarray(s, np.float32),
        np.ascontiguousarray(z, np.uint8),
    )
