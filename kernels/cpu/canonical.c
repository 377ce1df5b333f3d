/* SPDX-License-Identifier: MIT */
/*
 * Canonical distances on the CPU: the value every backend reports (docs/DESIGN.md section 2.2).
 *
 *   acc = 0 (double); for t in 0..d-1: diff = (double)a[t] - (double)b[t];
 *                                      acc = fma(diff, diff, acc);
 *   l2 = (float)acc, euclidean = (float)sqrt(acc).
 *
 * fma() is correctly rounded whether the CPU has the instruction or libm emulates it,
 * so the x86 "fma" target clone and the portable one give identical bits; the clone
 * only makes the re-rank fast. The CUDA backend computes the same with __fma_rn.
 */
#include <math.h>
#include <stdlib.h>

#include "canonical.h"

float xknn__canonical(xknn_metric metric, const float *a, const float *b, int64_t d)
{
    double acc = 0.0;
    int64_t t;
    for (t = 0; t < d; t++) {
        double diff = (double)a[t] - (double)b[t];
        acc = fma(diff, diff, acc);
    }
    return xknn__finish(metric, acc);
}

/* Four independent accumulation chains (four candidates) so the fma latency hides. */
XKNN__INLINE_BODY void canonical_many_body(xknn_metric metric, const float *q, const float *ref, int64_t ldr,
                                           const int64_t *rows, int64_t count, int64_t d, float *out)
{
    int64_t c = 0, t;
    for (; c + 4 <= count; c += 4) {
        const float *x0 = ref + rows[c] * ldr, *x1 = ref + rows[c + 1] * ldr;
        const float *x2 = ref + rows[c + 2] * ldr, *x3 = ref + rows[c + 3] * ldr;
        double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
        for (t = 0; t < d; t++) {
            double qt = (double)q[t];
            double d0 = qt - (double)x0[t], d1 = qt - (double)x1[t];
            double d2 = qt - (double)x2[t], d3 = qt - (double)x3[t];
            a0 = fma(d0, d0, a0);
            a1 = fma(d1, d1, a1);
            a2 = fma(d2, d2, a2);
            a3 = fma(d3, d3, a3);
        }
        out[c] = xknn__finish(metric, a0);
        out[c + 1] = xknn__finish(metric, a1);
        out[c + 2] = xknn__finish(metric, a2);
        out[c + 3] = xknn__finish(metric, a3);
    }
    for (; c < count; c++) {
        const float *x = ref + rows[c] * ldr;
        double a = 0.0;
        for (t = 0; t < d; t++) {
            double diff = (double)q[t] - (double)x[t];
            a = fma(diff, diff, a);
        }
        out[c] = xknn__finish(metric, a);
    }
}

/* Distances of one query to a transposed reference block rt[t*ldt + j], j < nb:
 * the cache-blocked exact loop. The j loop vectorises; each lane keeps its own
 * dimension-ordered chain, so the values are canonical. acc has room for nb doubles. */
XKNN__INLINE_BODY void canonical_block_body(xknn_metric metric, const float *q, const float *rt, int64_t ldt,
                                            int64_t nb, int64_t d, double *acc, float *out)
{
    int64_t t, j;
    for (j = 0; j < nb; j++) acc[j] = 0.0;
    for (t = 0; t < d; t++) {
        const double qt = (double)q[t];
        const float *row = rt + t * ldt;
        for (j = 0; j < nb; j++) {
            double diff = qt - (double)row[j];
            acc[j] = fma(diff, diff, acc[j]);
        }
    }
    for (j = 0; j < nb; j++) out[j] = xknn__finish(metric, acc[j]);
}

/* Squared norms in double, dimension order (used for the BLAS path's bounds). */
void xknn__sqnorms(const float *x, int64_t rows, int64_t ld, int64_t d, double *out)
{
    int64_t i, t;
    for (i = 0; i < rows; i++) {
        const float *r = x + i * ld;
        double acc = 0.0;
        for (t = 0; t < d; t++) acc = fma((double)r[t], (double)r[t], acc);
        out[i] = acc;
    }
}

XKNN__TARGET_FAST static void canonical_many_fast(xknn_metric metric, const float *q, const float *ref, int64_t ldr,
                                                  const int64_t *rows, int64_t count, int64_t d, float *out)
{
    canonical_many_body(metric, q, ref, ldr, rows, count, d, out);
}

static void canonical_many_portable(xknn_metric metric, const float *q, const float *ref, int64_t ldr,
                                    const int64_t *rows, int64_t count, int64_t d, float *out)
{
    canonical_many_body(metric, q, ref, ldr, rows, count, d, out);
}

XKNN__TARGET_FAST static void canonical_block_fast(xknn_metric metric, const float *q, const float *rt, int64_t ldt,
                                                   int64_t nb, int64_t d, double *acc, float *out);

#ifdef XKNN__HAVE_CLONES
#include <immintrin.h>
/* rt[t*ldt + j] = xs[j][t] for j < nb, t < d: 8 x 8 blocks transposed in registers
 * (eight 32-byte loads, 24 shuffles, eight 32-byte stores), scalar edges. */
XKNN__TARGET_FAST static void gather_transposed_fast(const float *const *xs, int64_t nb, int64_t d, float *rt,
                                                     int64_t ldt)
{
    int64_t j0 = 0, t, j;
    for (; j0 + 8 <= nb; j0 += 8) {
        int64_t t0 = 0;
        for (; t0 + 8 <= d; t0 += 8) {
            __m256 r0 = _mm256_loadu_ps(xs[j0 + 0] + t0), r1 = _mm256_loadu_ps(xs[j0 + 1] + t0);
            __m256 r2 = _mm256_loadu_ps(xs[j0 + 2] + t0), r3 = _mm256_loadu_ps(xs[j0 + 3] + t0);
            __m256 r4 = _mm256_loadu_ps(xs[j0 + 4] + t0), r5 = _mm256_loadu_ps(xs[j0 + 5] + t0);
            __m256 r6 = _mm256_loadu_ps(xs[j0 + 6] + t0), r7 = _mm256_loadu_ps(xs[j0 + 7] + t0);
            __m256 a0 = _mm256_unpacklo_ps(r0, r1), a1 = _mm256_unpackhi_ps(r0, r1);
            __m256 a2 = _mm256_unpacklo_ps(r2, r3), a3 = _mm256_unpackhi_ps(r2, r3);
            __m256 a4 = _mm256_unpacklo_ps(r4, r5), a5 = _mm256_unpackhi_ps(r4, r5);
            __m256 a6 = _mm256_unpacklo_ps(r6, r7), a7 = _mm256_unpackhi_ps(r6, r7);
            __m256 b0 = _mm256_shuffle_ps(a0, a2, _MM_SHUFFLE(1, 0, 1, 0));
            __m256 b1 = _mm256_shuffle_ps(a0, a2, _MM_SHUFFLE(3, 2, 3, 2));
            __m256 b2 = _mm256_shuffle_ps(a1, a3, _MM_SHUFFLE(1, 0, 1, 0));
            __m256 b3 = _mm256_shuffle_ps(a1, a3, _MM_SHUFFLE(3, 2, 3, 2));
            __m256 b4 = _mm256_shuffle_ps(a4, a6, _MM_SHUFFLE(1, 0, 1, 0));
            __m256 b5 = _mm256_shuffle_ps(a4, a6, _MM_SHUFFLE(3, 2, 3, 2));
            __m256 b6 = _mm256_shuffle_ps(a5, a7, _MM_SHUFFLE(1, 0, 1, 0));
            __m256 b7 = _mm256_shuffle_ps(a5, a7, _MM_SHUFFLE(3, 2, 3, 2));
            float *o = rt + t0 * ldt + j0;
            _mm256_storeu_ps(o + 0 * ldt, _mm256_permute2f128_ps(b0, b4, 0x20));
            _mm256_storeu_ps(o + 1 * ldt, _mm256_permute2f128_ps(b1, b5, 0x20));
            _mm256_storeu_ps(o + 2 * ldt, _mm256_permute2f128_ps(b2, b6, 0x20));
            _mm256_storeu_ps(o + 3 * ldt, _mm256_permute2f128_ps(b3, b7, 0x20));
            _mm256_storeu_ps(o + 4 * ldt, _mm256_permute2f128_ps(b0, b4, 0x31));
            _mm256_storeu_ps(o + 5 * ldt, _mm256_permute2f128_ps(b1, b5, 0x31));
            _mm256_storeu_ps(o + 6 * ldt, _mm256_permute2f128_ps(b2, b6, 0x31));
            _mm256_storeu_ps(o + 7 * ldt, _mm256_permute2f128_ps(b3, b7, 0x31));
        }
        for (t = t0; t < d; t++)
            for (j = j0; j < j0 + 8; j++) rt[t * ldt + j] = xs[j][t];
    }
    for (t = 0; t < d; t++)
        for (j = j0; j < nb; j++) rt[t * ldt + j] = xs[j][t];
}
#else
static void gather_transposed_fast(const float *const *xs, int64_t nb, int64_t d, float *rt, int64_t ldt)
{
    int64_t t, j;
    for (t = 0; t < d; t++)
        for (j = 0; j < nb; j++) rt[t * ldt + j] = xs[j][t];
}
#endif

void xknn__canonical_many(xknn_metric metric, const float *q, const float *ref, int64_t ldr, const int64_t *rows,
                          int64_t count, int64_t d, float *out)
{
    enum { CH = 32 };
    if (xknn__cpu_has_fast() && count >= 8) {
        /* Gather CH candidate rows transposed, then the vectorised block kernel: many
         * independent chains per instruction instead of four. Same bits. */
        float *rt = (float *)malloc((size_t)d * CH * sizeof(float));
        if (rt) {
            double acc[CH];
            int64_t c0, j;
            for (c0 = 0; c0 < count; c0 += CH) {
                const int64_t nb = count - c0 < CH ? count - c0 : CH;
                const float *xs[CH];
                for (j = 0; j < nb; j++) xs[j] = ref + rows[c0 + j] * ldr;
                gather_transposed_fast(xs, nb, d, rt, CH);
                canonical_block_fast(metric, q, rt, CH, nb, d, acc, out + c0);
            }
            free(rt);
            return;
        }
    }
    if (xknn__cpu_has_fast())
        canonical_many_fast(metric, q, ref, ldr, rows, count, d, out);
    else
        canonical_many_portable(metric, q, ref, ldr, rows, count, d, out);
}

XKNN__TARGET_FAST static void canonical_block_fast(xknn_metric metric, const float *q, const float *rt, int64_t ldt,
                                                   int64_t nb, int64_t d, double *acc, float *out)
{
    canonical_block_body(metric, q, rt, ldt, nb, d, acc, out);
}

static void canonical_block_portable(xknn_metric metric, const float *q, const float *rt, int64_t ldt, int64_t nb,
                                     int64_t d, double *acc, float *out)
{
    canonical_block_body(metric, q, rt, ldt, nb, d, acc, out);
}

void xknn__canonical_block(xknn_metric metric, const float *q, const float *rt, int64_t ldt, int64_t nb, int64_t d,
                           double *acc, float *out)
{
    if (xknn__cpu_has_fast())
        canonical_block_fast(metric, q, rt, ldt, nb, d, acc, out);
    else
        canonical_block_portable(metric, q, rt, ldt, nb, d, acc, out);
}
