/* SPDX-License-Identifier: MIT */
/*
 * CPU backend: float32 data whose values are all 8-bit integers (pixels stored as floats,
 * int8 codes), searched exactly in integer arithmetic.
 *
 * Such a job is the same search as one on u8 (or i8) data with the same values: every
 * canonical value (double accumulation in dimension order, one rounding) depends only on
 * the values. So the matrices are classified (every value an integer in [0, 255], or
 * every value an integer in [-128, 127]; each check stops at the first row for ordinary
 * float data), converted once to 8-bit copies, and handed to the integer path of
 * int8_search.c (l2, euclidean, ip; exact int32 dot products with AVX-512 VNNI where the
 * CPU has it, a portable kernel otherwise). Results are identical bit for bit to the
 * float paths, only faster (Fashion-MNIST: about 2x the sgemm path on two cores).
 * Memory: n d + nq d bytes of copies for the duration of the call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canonical.h"
#include "cpu_internal.h"

/* Value class of a matrix: bit 1 = every value an integer in [0, 255], bit 2 = every
 * value an integer in [-128, 127]; 0 = neither. */
static int xknn__int8_class(const float *x, int64_t rows, int64_t ld, int64_t d, int nt)
{
    int64_t r;
    int bad = 0;
    float lo = 0.0f, hi = 0.0f;
    /* fail fast on ordinary float data: the first row decides most cases */
    for (r = 0; r < d; r++) {
        const float v = x[r];
        if (!(v >= -128.0f && v <= 255.0f) || v != (float)(int)v) return 0;
    }
#pragma omp parallel for num_threads(nt) schedule(static, 64) reduction(| : bad) reduction(min : lo) \
    reduction(max : hi)
    for (r = 0; r < rows; r++) {
        const float *row = x + r * ld;
        int64_t t;
        int b = 0;
        float l = 0.0f, h = 0.0f;
        for (t = 0; t < d; t++) {
            const float v = row[t];
            /* range first: the int conversion below is defined only inside it */
            const int in = v >= -128.0f && v <= 255.0f;
            b |= !in || v != (float)(int)(in ? v : 0.0f);
            l = v < l ? v : l;
            h = v > h ? v : h;
        }
        bad |= b;
        lo = l < lo ? l : lo;
        hi = h > hi ? h : hi;
    }
    if (bad) return 0;
    return (lo >= 0.0f ? 1 : 0) | (lo >= -128.0f && hi <= 127.0f ? 2 : 0);
}

/* Copies rows x d floats (row stride ld) that are integers of the class into bytes. */
static void xknn__to_bytes(const float *x, int64_t rows, int64_t ld, int64_t d, int u8, void *out, int nt)
{
    int64_t r;
#pragma omp parallel for num_threads(nt) schedule(static, 64)
    for (r = 0; r < rows; r++) {
        const float *row = x + r * ld;
        int64_t t;
        if (u8) {
            uint8_t *o = (uint8_t *)out + r * d;
            for (t = 0; t < d; t++) o[t] = (uint8_t)(int)row[t];
        } else {
            int8_t *o = (int8_t *)out + r * d;
            for (t = 0; t < d; t++) o[t] = (int8_t)(int)row[t];
        }
    }
}

xknn_status xknn__cpu_int8_f32(const xknn__job *job, int required)
{
    const int64_t n = job->n, d = job->d, nq = job->nq;
    const int nt = xknn__threads(job);
    const int self = job->query == job->ref && job->ldq == job->ldr && nq == n;
    xknn__job sub = *job;
    int qcls, rcls, both;
    void *rb = NULL, *qb = NULL;
    xknn_status st;

    sub.dtype = XKNN_DTYPE_U8; /* for the applicability test: metric and d */
    if (job->dtype != XKNN_DTYPE_F32 || !xknn__cpu_int8_applies(&sub))
        return required ? xknn__cpu_fail(job, XKNN_ERROR_INVALID_ARGUMENT,
                                         "cpu backend: the integer path computes l2, euclidean and ip on d <= %d",
                                         XKNN_INT8_EXACT_MAX_D)
                        : XKNN__FALLBACK;
    qcls = xknn__int8_class(job->query, nq, job->ldq, d, nt);
    rcls = qcls ? (self ? qcls : xknn__int8_class(job->ref, n, job->ldr, d, nt)) : 0;
    both = qcls & rcls;
    if (!both)
        return required ? xknn__cpu_fail(job, XKNN_ERROR_INVALID_ARGUMENT,
                                         "cpu backend: the integer path needs every %s value to be an integer in "
                                         "[0, 255], or every value of both matrices in [-128, 127]",
                                         !qcls ? "query" : !rcls ? "reference" : "reference and query")
                        : XKNN__FALLBACK;
    sub.dtype = (both & 1) ? XKNN_DTYPE_U8 : XKNN_DTYPE_I8;
    rb = malloc((size_t)(n * d));
    qb = self ? rb : malloc((size_t)(nq * d));
    if (!rb || !qb) {
        if (qb != rb) free(qb);
        free(rb);
        return xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory for %lld bytes of 8-bit copies",
                              (long long)((self ? n : n + nq) * d));
    }
    xknn__to_bytes(job->ref, n, job->ldr, d, sub.dtype == XKNN_DTYPE_U8, rb, nt);
    if (!self) xknn__to_bytes(job->query, nq, job->ldq, d, sub.dtype == XKNN_DTYPE_U8, qb, nt);
    sub.ref = sub.query = NULL; /* no float32 view: the rows are rb and qb, d bytes each */
    sub.ref_data = rb;
    sub.query_data = qb;
    sub.ldr = sub.ldq = d;
    if (job->params.verbose)
        fprintf(stderr, "xknn: cpu backend: float32 values are all %s integers: exact integer path\n",
                sub.dtype == XKNN_DTYPE_U8 ? "8-bit unsigned" : "8-bit signed");
    st = xknn__cpu_int8(&sub);
    if (qb != rb) free(qb);
    free(rb);
    return st;
}
