"""The C of ``GemvQ``'s paths for CPUs without AVX-512 VNNI (:mod:`graph_autofusion.codegen.
ort_gemv_q` holds the operator, its VNNI path and its layout; its ``SOURCE`` takes these in).

* ``AVX2_INT`` (AVX2 + FMA without AVX-512 VNNI, AVX-512 F/BW included: there it ran 1.8x the
  AVX-512 fp32 path, ``benchmarks/results/epyc/gemv_q_paths.md``): the weights multiplied by int8 digits of the
  activations as VNNI does, with AVX2's ``vpmaddubsw`` (u8 x s8 pairs summed into int16, then
  ``vpmaddwd`` by ones into int32). ``vpmaddubsw`` saturates a pair's sum at 32767, so the
  digits stay within 63 (2 x 255 x 63 = 32130): ``x = sx (x0 + x1 / 126)``, ``sx = max|x| / 63``
  over the block, each activation to 1 / 7938 of its block's largest (VNNI's 1 / 64516;
  ``MatMulNBits``' int8 rounding 1 / 254). Two rows a tile share each weight load. 4-bit
  weights (at most 15) leave room in int16: a pair's sum is at most 2 x 15 x 63 = 1890, so the
  pairs of 16 groups (30240) are added in int16 before one ``vpmaddwd`` widens them, half the
  multiplies of the 8-bit loop and the same integers (bit-identical results). One thread, a
  hot 4096x1024 weight, AVX2 Zen 3: one row 28.8 G weight-products/s against 26.6, two rows
  29.7 against 28.8; the zoo Llama's int4 decode step 1.76 ms against 1.79 (within noise).
* ``FP32``: the weights widened to fp32 and multiplied by the fp32 activations (plain C, and
  AVX2 / AVX-512 without VNNI where the library is built with ``GAF_GQ_NO_I2``).
"""

from __future__ import annotations

AVX2_INT = r"""
/* AVX2 int8 path: per block, u8 weights x int8 digits (|d| <= 63) of the activations summed in
   int32 (vpmaddubsw pairs, vpmaddwd by ones: four k a lane), then scaled into fp32 */
#define GAF_GQ_ROWS 2
#define GAF_GQ_D 63
#ifndef GAF_GQ_I16_GROUPS
#define GAF_GQ_I16_GROUPS 16 /* 4-bit groups summed in int16 before widening (at most 17) */
#endif
GAF_GQ_INL void gaf_gq_tile(const GafGemvQ *j, int64_t p, int64_t m, const int R, const int bits) {
    const int64_t K = j->K, B = j->B, nb = j->nb, N = j->N;
    const uint8_t *w = j->w + p * K * (bits == 8 ? 16 : 8);
    const int8_t *x0 = j->x0 + m * K, *x1 = j->x1 + m * K;
    const float *xq = j->xq + m * nb, *xz = j->xz + m * nb;
    const int64_t s = p * nb * 16; /* the panel's first scale */
    const uint8_t *z = j->zfull ? j->z + p * nb * 16 : 0;
    const __m256 z0 = _mm256_set1_ps((float)j->z[0]), fr = _mm256_set1_ps(2.f * GAF_GQ_D);
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(15);
    __m256 cl[2], ch[2];
    for (int r = 0; r < R; r++) cl[r] = ch[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i al[2], ah[2], el[2], eh[2];
        for (int r = 0; r < R; r++) al[r] = ah[r] = el[r] = eh[r] = _mm256_setzero_si256();
        if (bits == 8) {
            for (int64_t g = b * B / 4; g < (b + 1) * B / 4; g++) {
                if (GAF_GQ_PREFETCH) _mm_prefetch((const char *)(w + g * 64 + GAF_GQ_PREFETCH), _MM_HINT_T0);
                __m256i wl = _mm256_loadu_si256((const __m256i *)(w + g * 64)); /* outputs 0-7 */
                __m256i wh = _mm256_loadu_si256((const __m256i *)(w + g * 64 + 32)); /* 8-15 */
                for (int r = 0; r < R; r++) {
                    int32_t d0, d1;
                    memcpy(&d0, x0 + r * K + 4 * g, 4);
                    memcpy(&d1, x1 + r * K + 4 * g, 4);
                    __m256i v0 = _mm256_set1_epi32(d0), v1 = _mm256_set1_epi32(d1);
                    al[r] = _mm256_add_epi32(al[r], _mm256_madd_epi16(_mm256_maddubs_epi16(wl, v0), ones));
                    ah[r] = _mm256_add_epi32(ah[r], _mm256_madd_epi16(_mm256_maddubs_epi16(wh, v0), ones));
                    el[r] = _mm256_add_epi32(el[r], _mm256_madd_epi16(_mm256_maddubs_epi16(wl, v1), ones));
                    eh[r] = _mm256_add_epi32(eh[r], _mm256_madd_epi16(_mm256_maddubs_epi16(wh, v1), ones));
                }
            }
        } else {
            /* 4-bit weights (<= 15) by digits (|d| <= 63): a pair's sum is at most 1890, so up
               to GAF_GQ_I16_GROUPS groups add up in int16 exactly (16 x 1890 = 30240) before one
               vpmaddwd widens them: half the multiplies of the 8-bit loop */
            for (int64_t c = b * B / 4, e = (b + 1) * B / 4; c < e; c += GAF_GQ_I16_GROUPS) {
                const int64_t ce = c + GAF_GQ_I16_GROUPS < e ? c + GAF_GQ_I16_GROUPS : e;
                __m256i sl[2], sh[2], tl[2], th[2];
                for (int r = 0; r < R; r++) sl[r] = sh[r] = tl[r] = th[r] = _mm256_setzero_si256();
                for (int64_t g = c; g < ce; g++) {
                    if (GAF_GQ_PREFETCH && !(g & 1)) _mm_prefetch((const char *)(w + g * 32 + GAF_GQ_PREFETCH), _MM_HINT_T0);
                    __m256i v = _mm256_loadu_si256((const __m256i *)(w + g * 32));
                    __m256i wl = _mm256_and_si256(v, m4), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    for (int r = 0; r < R; r++) {
                        int32_t d0, d1;
                        memcpy(&d0, x0 + r * K + 4 * g, 4);
                        memcpy(&d1, x1 + r * K + 4 * g, 4);
                        __m256i v0 = _mm256_set1_epi32(d0), v1 = _mm256_set1_epi32(d1);
                        sl[r] = _mm256_add_epi16(sl[r], _mm256_maddubs_epi16(wl, v0));
                        sh[r] = _mm256_add_epi16(sh[r], _mm256_maddubs_epi16(wh, v0));
                        tl[r] = _mm256_add_epi16(tl[r], _mm256_maddubs_epi16(wl, v1));
                        th[r] = _mm256_add_epi16(th[r], _mm256_maddubs_epi16(wh, v1));
                    }
                }
                for (int r = 0; r < R; r++) {
                    al[r] = _mm256_add_epi32(al[r], _mm256_madd_epi16(sl[r], ones));
                    ah[r] = _mm256_add_epi32(ah[r], _mm256_madd_epi16(sh[r], ones));
                    el[r] = _mm256_add_epi32(el[r], _mm256_madd_epi16(tl[r], ones));
                    eh[r] = _mm256_add_epi32(eh[r], _mm256_madd_epi16(th[r], ones));
                }
            }
        }
        __m256 sl = gaf_gq_s8v(j, s + b * 16), sh = gaf_gq_s8v(j, s + b * 16 + 8), zl = z0, zh = z0;
        if (z) {
            __m128i zb = _mm_loadu_si128((const __m128i *)(z + b * 16));
            zl = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(zb));
            zh = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(zb, 8)));
        }
        for (int r = 0; r < R; r++) {
            __m256 xb = _mm256_set1_ps(xz[r * nb + b]), qb = _mm256_set1_ps(xq[r * nb + b]);
            __m256 tl = _mm256_fmadd_ps(_mm256_cvtepi32_ps(al[r]), fr, _mm256_cvtepi32_ps(el[r]));
            __m256 th = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ah[r]), fr, _mm256_cvtepi32_ps(eh[r]));
            tl = _mm256_fnmadd_ps(zl, xb, tl);
            th = _mm256_fnmadd_ps(zh, xb, th);
            cl[r] = _mm256_fmadd_ps(tl, _mm256_mul_ps(sl, qb), cl[r]);
            ch[r] = _mm256_fmadd_ps(th, _mm256_mul_ps(sh, qb), ch[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(j->y + (m + r) * N + p * 16, cl[r]);
        _mm256_storeu_ps(j->y + (m + r) * N + p * 16 + 8, ch[r]);
    }
}

/* row x's two int8 digits per block of B: x = sx (x0 + x1 / 126), sx = max|x| / 63 (a NaN or
   infinite activation: the block's scale NaN, its products NaN) */
static void gaf_gq_digits(const float *x, int8_t *x0, int8_t *x1, float *xq, float *xz,
                          int64_t K, int64_t B, int64_t nb) {
    const float D = (float)GAF_GQ_D, R = 2.f * GAF_GQ_D;
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * B;
        float amax = 0.f;
        int bad = 0;
        for (int64_t k = 0; k < B; k++) {
            float a = fabsf(xb[k]);
            bad |= !(a <= 3.4e38f); /* NaN or infinite */
            amax = a > amax ? a : amax;
        }
        float sx = amax > 1e-30f && !bad ? amax / D : 1.f, inv = 1.f / sx; /* tiny: zeros */
        int64_t t0 = 0, t1 = 0;
        for (int64_t k = 0; k < B; k++) {
            float t = bad ? 0.f : xb[k] * inv, r0 = nearbyintf(t), r1 = nearbyintf((t - r0) * R);
            r0 = r0 > D ? D : r0 < -D ? -D : r0;
            r1 = r1 > D ? D : r1 < -D ? -D : r1;
            x0[b * B + k] = (int8_t)r0;
            x1[b * B + k] = (int8_t)r1;
            t0 += (int64_t)r0;
            t1 += (int64_t)r1;
        }
        xq[b] = bad ? NAN : sx / R;
        xz[b] = R * (float)t0 + (float)t1;
    }
    (void)K;
}
"""

FP32 = r"""/* fp32 paths: the weights widened to fp32 and multiplied by the activations; a block's sums
   per output as 4-lane partial sums over k, reduced at the block's end */
#if defined(__AVX512F__)
#define GAF_GQ_ROWS 4
/* the sums of four accumulators (outputs 4q + l, lanes 4l + kk) as outputs 0-15 in order */
GAF_GQ_INL __m512 gaf_gq_reduce(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    __m512 u0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    __m512 u1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    __m512 t = _mm512_add_ps(_mm512_shuffle_ps(u0, u1, 0x44), _mm512_shuffle_ps(u0, u1, 0xEE));
    /* t[4l + q] = output 4q + l */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(idx, t);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define GAF_GQ_ROWS 1
/* the sums of four accumulators (outputs 2q, 2q + 1 by lanes 4h + kk) as 8 outputs in order */
GAF_GQ_INL __m256 gaf_gq_reduce8(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    /* h = outputs 0, 2, 4, 6 | 1, 3, 5, 7 */
    return _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#else
#define GAF_GQ_ROWS 1
#endif

GAF_GQ_INL void gaf_gq_tile(const GafGemvQ *j, int64_t p, int64_t m, const int R, const int bits) {
    const int64_t K = j->K, B = j->B, nb = j->nb, N = j->N;
    const uint8_t *w = j->w + p * K * (bits == 8 ? 16 : 8);
    const float *xs = j->xs + m * nb;
    const int64_t s = p * nb * 16; /* the panel's first scale */
    const uint8_t *z = j->zfull ? j->z + p * nb * 16 : 0;
    float *y = j->y + m * N + p * 16;
#if defined(__AVX512F__)
    const __m512 z0 = _mm512_set1_ps((float)j->z[0]);
    __m512 c[4], a[4][4];
    for (int r = 0; r < R; r++) c[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < R; r++) a[r][0] = a[r][1] = a[r][2] = a[r][3] = _mm512_setzero_ps();
        for (int64_t g = b * B / 4; g < (b + 1) * B / 4; g++) {
            __m512i wv = gaf_gq_group(w, g, bits);
            __m512 v[4];
            v[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_castsi512_si128(wv)));
            v[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(wv, 1)));
            v[2] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(wv, 2)));
            v[3] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(wv, 3)));
            for (int r = 0; r < R; r++) {
                __m512 x4 = _mm512_broadcast_f32x4(_mm_loadu_ps(j->x + (m + r) * K + 4 * g));
                for (int q = 0; q < 4; q++) a[r][q] = _mm512_fmadd_ps(v[q], x4, a[r][q]);
            }
        }
        __m512 sv = gaf_gq_s16v(j, s + b * 16);
        __m512 zv = z ? _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(z + b * 16)))) : z0;
        __m512 zs = _mm512_mul_ps(sv, zv);
        for (int r = 0; r < R; r++) {
            __m512 t = gaf_gq_reduce(a[r][0], a[r][1], a[r][2], a[r][3]);
            c[r] = _mm512_fnmadd_ps(zs, _mm512_set1_ps(xs[r * nb + b]), _mm512_fmadd_ps(t, sv, c[r]));
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(y + r * N, c[r]);
#elif defined(__AVX2__) && defined(__FMA__)
    (void)R;
    const __m256 z0 = _mm256_set1_ps((float)j->z[0]);
    const float *x = j->x + m * K;
    __m256 cl = _mm256_setzero_ps(), ch = cl, a[8];
    for (int64_t b = 0; b < nb; b++) {
        for (int q = 0; q < 8; q++) a[q] = _mm256_setzero_ps();
        for (int64_t g = b * B / 4; g < (b + 1) * B / 4; g++) {
            __m128i h[4];
            if (bits == 8) {
                for (int i = 0; i < 4; i++) h[i] = _mm_loadu_si128((const __m128i *)(w + g * 64 + 16 * i));
            } else {
                __m128i m4 = _mm_set1_epi8(15);
                __m128i b0 = _mm_loadu_si128((const __m128i *)(w + g * 32)), b1 = _mm_loadu_si128((const __m128i *)(w + g * 32 + 16));
                h[0] = _mm_and_si128(b0, m4); h[1] = _mm_and_si128(b1, m4);
                h[2] = _mm_and_si128(_mm_srli_epi16(b0, 4), m4); h[3] = _mm_and_si128(_mm_srli_epi16(b1, 4), m4);
            }
            __m256 x4 = _mm256_broadcast_ps((const __m128 *)(x + 4 * g));
            for (int i = 0; i < 4; i++) {
                a[2 * i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h[i])), x4, a[2 * i]);
                a[2 * i + 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(h[i], 8))), x4, a[2 * i + 1]);
            }
        }
        __m256 tl = gaf_gq_reduce8(a[0], a[1], a[2], a[3]), th = gaf_gq_reduce8(a[4], a[5], a[6], a[7]);
        __m256 sl = gaf_gq_s8v(j, s + b * 16), sh = gaf_gq_s8v(j, s + b * 16 + 8), zl = z0, zh = z0;
        if (z) {
            __m128i zb = _mm_loadu_si128((const __m128i *)(z + b * 16));
            zl = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(zb));
            zh = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(zb, 8)));
        }
        __m256 xb = _mm256_set1_ps(xs[b]);
        cl = _mm256_fnmadd_ps(_mm256_mul_ps(sl, zl), xb, _mm256_fmadd_ps(tl, sl, cl));
        ch = _mm256_fnmadd_ps(_mm256_mul_ps(sh, zh), xb, _mm256_fmadd_ps(th, sh, ch));
    }
    _mm256_storeu_ps(y, cl);
    _mm256_storeu_ps(y + 8, ch);
#else
    (void)R;
    const float *x = j->x + m * K;
    float c[16];
    memset(c, 0, sizeof c);
    for (int64_t b = 0; b < nb; b++)
        for (int i = 0; i < 16; i++) {
            float t = 0.f;
            for (int64_t k = b * B; k < (b + 1) * B; k++) t += (float)gaf_gq_q(w, k, i, bits) * x[k];
            float sv = gaf_gq_s1(j, s + b * 16 + i), zv = (float)(z ? z[b * 16 + i] : j->z[0]);
            c[i] += t * sv - zv * sv * xs[b];
        }
    memcpy(y, c, sizeof c);
#endif
}
"""
