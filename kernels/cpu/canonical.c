/*
 * Canonical distances on the CPU: the value every backend reports (DESIGN.md section 2).
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
            int64_t c0, t, j;
            for (c0 = 0; c0 < count; c0 += CH) {
                const int64_t nb = count - c0 < CH ? count - c0 : CH;
                const float *xs[CH];
                for (j = 0; j < nb; j++) xs[j] = ref + rows[c0 + j] * ldr;
                for (t = 0; t < d; t++) /* contiguous writes, CH sequential read streams */
                    for (j = 0; j < nb; j++) rt[t * CH + j] = xs[j][t];
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
