/* SPDX-License-Identifier: MIT */
/* Soft-kNN forward and backward passes on the CPU (see include/xknn/softknn.h and
 * include/xknn/impl/softknn_kernels.h for the model and the split host/pass):
 *   xknn__softknn_ref_eval  double precision, naive loops over pairs and bits: the
 *                           reference the tests check everything against;
 *   xknn__softknn_cpu_eval  float, OpenMP over rows; with CBLAS the weighted distances
 *                           and the per-bit sum (G X) are sgemm products on 0/1 floats,
 *                           without it word-by-word loops over the packed bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef XKNN_HAVE_CBLAS
#include <cblas.h>
#endif

#include "cpu_internal.h" /* xknn__cpu_fail */
#include "xknn/impl/softknn_kernels.h"

static int xknn__sk_bit(const uint64_t *row, int64_t b) { return (int)((row[b >> 6] >> (b & 63)) & 1u); }

/* ---- double-precision reference ----------------------------------------------------- */

xknn_status xknn__softknn_ref_eval(const xknn__sk_job *job)
{
    int64_t m = job->m, nr = job->nr, d = job->d, p, t, b;
    const double *th = job->theta;
    double s1 = xknn__sk_wnorm(th, d), a = th[d + 2], c = th[d + 3];
    double *z = (double *)malloc((size_t)(m * nr) * sizeof(double));
    double *f = (double *)malloc((size_t)(m * nr) * sizeof(double));
    double *mean = (double *)calloc((size_t)m, sizeof(double));
    double *coef = (double *)calloc((size_t)m, sizeof(double));
    double *tbit = (double *)calloc((size_t)d, sizeof(double));
    double sums[3] = {0, 0, 0}, loss;
    if (!z || !f || !mean || !coef || !tbit) {
        free(tbit), free(coef), free(mean), free(f), free(z);
        return xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY, "soft-kNN reference: out of memory for %lld x %lld pairs",
                              (long long)m, (long long)nr);
    }
    for (p = 0; p < m; p++) {
        const uint64_t *u = job->u + p * job->ld;
        for (t = 0; t < nr; t++) {
            const uint64_t *x = job->x + job->refs[t] * job->ld;
            double dist = 0;
            for (b = 0; b < d; b++)
                if (xknn__sk_bit(x, b) != xknn__sk_bit(u, b)) dist += fabs(th[b]);
            z[p * nr + t] = 1.0 - dist / s1;
            f[p * nr + t] = xknn__sk_sigmoid(a * (z[p * nr + t] - c));
            mean[p] += f[p * nr + t] * (double)job->y[job->refs[t]];
        }
        mean[p] /= (double)nr;
    }
    loss = xknn__sk_head(job, mean, coef);
    if (job->loss) *job->loss = loss;
    if (job->target && job->grad) {
        for (p = 0; p < m; p++) {
            const uint64_t *u = job->u + p * job->ld;
            for (t = 0; t < nr; t++) {
                const uint64_t *x = job->x + job->refs[t] * job->ld;
                double fv = f[p * nr + t];
                double g = coef[p] * (double)job->y[job->refs[t]] * fv * (1.0 - fv);
                sums[0] += g;
                sums[1] += g * z[p * nr + t];
                sums[2] += g * (1.0 - z[p * nr + t]) * s1;
                for (b = 0; b < d; b++)
                    if (xknn__sk_bit(x, b) != xknn__sk_bit(u, b)) tbit[b] += g;
            }
        }
        xknn__sk_assemble(job, mean, sums, tbit, job->grad);
    }
    free(tbit), free(coef), free(mean), free(f), free(z);
    return XKNN_SUCCESS;
}

/* ---- float path ------------------------------------------------------------------- */

#ifndef XKNN_HAVE_CBLAS
/* Weighted Hamming distance of two packed rows, word by word over the differing bits. */
static float xknn__sk_whamming(const uint64_t *x, const uint64_t *u, const float *wabs, int64_t words, int64_t d)
{
    float acc = 0;
    int64_t j;
    for (j = 0; j < words; j++) {
        uint64_t diff = x[j] ^ u[j];
        if (j == words - 1 && (d & 63)) diff &= ((uint64_t)1 << (d & 63)) - 1;
        while (diff) {
            int bit = __builtin_ctzll(diff);
            acc += wabs[j * 64 + bit];
            diff &= diff - 1;
        }
    }
    return acc;
}
#endif

xknn_status xknn__softknn_cpu_eval(const xknn__sk_job *job)
{
    int64_t m = job->m, nr = job->nr, d = job->d, words = (d + 63) / 64, p, b;
    const double *th = job->theta;
    double s1d = xknn__sk_wnorm(th, d);
    float s1 = (float)s1d, a = (float)th[d + 2], c = (float)th[d + 3];
    int want_grad = job->target && job->grad;
    int nt = job->num_threads;
    float *wabs = (float *)malloc((size_t)d * sizeof(float));
    float *dist = (float *)malloc((size_t)(m * nr) * sizeof(float)); /* d_pt, then G_pt */
    float *fval = (float *)malloc((size_t)(m * nr) * sizeof(float));
    double *mean = (double *)calloc((size_t)m, sizeof(double));
    double *coef = (double *)calloc((size_t)m, sizeof(double));
    double *tbit = (double *)calloc((size_t)d, sizeof(double));
    float *gx = want_grad ? (float *)calloc((size_t)(m * d), sizeof(float)) : NULL;
    double *rowsum = (double *)calloc((size_t)m, sizeof(double));
    double *psums = (double *)calloc((size_t)(3 * m), sizeof(double));
    double sums[3] = {0, 0, 0}, loss;
    xknn_status st = XKNN_SUCCESS;
#ifdef XKNN_HAVE_CBLAS
    float *xr = (float *)malloc((size_t)(nr * d) * sizeof(float)); /* gathered 0/1 rows  */
    float *uw = (float *)malloc((size_t)(m * d) * sizeof(float));  /* u_pb |W_b|         */
    float *wx = (float *)malloc((size_t)nr * sizeof(float));
    float *wu = (float *)malloc((size_t)m * sizeof(float));
    int blas_ok = xr && uw && wx && wu;
#else
    int blas_ok = 1;
#endif
#ifdef _OPENMP
    if (nt <= 0) nt = xknn_thread_budget();
#else
    nt = 1;
#endif
    (void)nt; /* unused without OpenMP */
    if (!wabs || !dist || !fval || !mean || !coef || !tbit || (want_grad && !gx) || !rowsum || !psums ||
        !blas_ok) {
        st = xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY, "soft-kNN cpu: out of memory for %lld x %lld pairs",
                            (long long)m, (long long)nr);
        goto done;
    }
    for (b = 0; b < d; b++) wabs[b] = (float)fabs(th[b]);

    /* forward: d_pt, F_pt, mean_p */
#ifdef XKNN_HAVE_CBLAS
    {
        int64_t t;
#pragma omp parallel for num_threads(nt) schedule(static) if (nr > 64)
        for (t = 0; t < nr; t++) {
            const uint64_t *x = job->x + job->refs[t] * job->ld;
            double acc = 0;
            int64_t bb;
            for (bb = 0; bb < d; bb++) {
                float v = (float)xknn__sk_bit(x, bb);
                xr[t * d + bb] = v;
                acc += v * wabs[bb];
            }
            wx[t] = (float)acc;
        }
        for (p = 0; p < m; p++) {
            const uint64_t *u = job->u + p * job->ld;
            double acc = 0;
            for (b = 0; b < d; b++) {
                float v = xknn__sk_bit(u, b) ? wabs[b] : 0.0f;
                uw[p * d + b] = v;
                acc += v;
            }
            wu[p] = (float)acc;
        }
        /* x XOR u weighted = w.x + w.u - 2 (u w).x */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)nr, (int)d, -2.0f, uw, (int)d, xr,
                    (int)d, 0.0f, dist, (int)nr);
#pragma omp parallel for num_threads(nt) schedule(static)
        for (p = 0; p < m; p++) {
            int64_t tt;
            for (tt = 0; tt < nr; tt++) {
                float v = dist[p * nr + tt] + wu[p] + wx[tt];
                dist[p * nr + tt] = v > 0 ? v : 0;
            }
        }
    }
#else
#pragma omp parallel for num_threads(nt) schedule(static)
    for (p = 0; p < m; p++) {
        int64_t tt;
        for (tt = 0; tt < nr; tt++)
            dist[p * nr + tt] =
                xknn__sk_whamming(job->x + job->refs[tt] * job->ld, job->u + p * job->ld, wabs, words, d);
    }
#endif
#pragma omp parallel for num_threads(nt) schedule(static)
    for (p = 0; p < m; p++) {
        int64_t tt;
        double acc = 0;
        for (tt = 0; tt < nr; tt++) {
            float z = 1.0f - dist[p * nr + tt] / s1;
            float fv = 1.0f / (1.0f + expf(-a * (z - c)));
            fval[p * nr + tt] = fv;
            acc += (double)(fv * job->y[job->refs[tt]]);
        }
        mean[p] = acc / (double)nr;
    }
    loss = xknn__sk_head(job, mean, coef);
    if (job->loss) *job->loss = loss;
    if (!want_grad) goto done;

    /* backward: G_pt (into dist), its sums, then (G X)_pb */
#pragma omp parallel for num_threads(nt) schedule(static)
    for (p = 0; p < m; p++) {
        int64_t tt;
        double s0 = 0, sz = 0, sd = 0;
        for (tt = 0; tt < nr; tt++) {
            float fv = fval[p * nr + tt], dv = dist[p * nr + tt];
            float g = (float)coef[p] * job->y[job->refs[tt]] * fv * (1.0f - fv);
            s0 += g;
            sz += (double)g * (1.0 - (double)dv / s1d);
            sd += (double)g * dv;
            dist[p * nr + tt] = g;
        }
        rowsum[p] = s0;
        psums[3 * p] = s0;
        psums[3 * p + 1] = sz;
        psums[3 * p + 2] = sd;
    }
#ifdef XKNN_HAVE_CBLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)d, (int)nr, 1.0f, dist, (int)nr, xr, (int)d,
                0.0f, gx, (int)d);
#else
#pragma omp parallel for num_threads(nt) schedule(static)
    for (p = 0; p < m; p++) {
        int64_t tt, j;
        float *row = gx + p * d;
        for (tt = 0; tt < nr; tt++) {
            const uint64_t *x = job->x + job->refs[tt] * job->ld;
            float g = dist[p * nr + tt];
            for (j = 0; j < words; j++) {
                uint64_t bits = x[j];
                if (j == words - 1 && (d & 63)) bits &= ((uint64_t)1 << (d & 63)) - 1;
                while (bits) {
                    row[j * 64 + __builtin_ctzll(bits)] += g;
                    bits &= bits - 1;
                }
            }
        }
    }
#endif
    /* sum_t G_pt [x_tb != u_pb] = u_pb ? rowsum_p - (G X)_pb : (G X)_pb */
    for (p = 0; p < m; p++) {
        const uint64_t *u = job->u + p * job->ld;
        for (b = 0; b < d; b++) tbit[b] += xknn__sk_bit(u, b) ? rowsum[p] - gx[p * d + b] : gx[p * d + b];
        sums[0] += psums[3 * p];
        sums[1] += psums[3 * p + 1];
        sums[2] += psums[3 * p + 2];
    }
    xknn__sk_assemble(job, mean, sums, tbit, job->grad);
done:
#ifdef XKNN_HAVE_CBLAS
    free(wu), free(wx), free(uw), free(xr);
#endif
    free(psums), free(rowsum), free(gx), free(tbit), free(coef), free(mean), free(fval), free(dist), free(wabs);
    (void)words;
    return st;
}
