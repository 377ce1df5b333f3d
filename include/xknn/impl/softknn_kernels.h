/* SPDX-License-Identifier: MIT */
/*
 * xknn/impl/softknn_kernels.h -- private interface between the soft-kNN host code
 * (include/xknn/softknn.h) and its compiled passes (kernels/cpu/softknn.c,
 * kernels/cuda/softknn.cu). Not part of the public API.
 *
 * One evaluation scores m packed rows U_p against nr training rows X_i (i = refs[t]):
 *   d_pt  = sum over bits b where x_ib != u_pb of |W_b|      (S1 = sum_b |W_b| > 0)
 *   z_pt  = 1 - d_pt / S1,  F_pt = sigmoid(a (z_pt - c))
 *   mean_p = (1/nr) sum_t F_pt Y_i                           (Y_i = label in {0, 1})
 * The host turns mean_p into logits, loss and the per-row coefficient
 *   coef_p = dL/dscore_p * beta / nr  (xknn__sk_head)
 * and the backward pass returns, with G_pt = coef_p Y_i F_pt (1 - F_pt):
 *   sums[0] = sum G,  sums[1] = sum G z,  sums[2] = sum G d,
 *   tbit[b] = sum_pt G_pt [x_ib != u_pb]   (b < d)
 * from which xknn__sk_assemble builds the gradient. The per-bit sum never forms an
 * m x nr x d tensor: CPU through (G X)_pb and u_pb, CUDA word by word per row p.
 */
#ifndef XKNN_IMPL_SOFTKNN_KERNELS_H
#define XKNN_IMPL_SOFTKNN_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "../../xknn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct xknn__sk_job {
    const uint64_t *x; /* n rows of ld words (host for the CPU pass)                 */
    const float *y;    /* n labels as 0.0f / 1.0f (host for the CPU pass)            */
    int64_t n, d, ld;
    const uint64_t *u; /* m rows of ld words, host                                   */
    int64_t m;
    const int64_t *refs; /* nr row numbers into x, host                              */
    int64_t nr;
    const double *theta; /* d + 4 parameters (W, alpha, beta, a, c), host            */
    const uint8_t *target; /* m targets in {0, 1}, or NULL: scores only              */
    double *scores;    /* m logits out, or NULL                                      */
    double *loss;      /* mean BCE out (needs target), or NULL                       */
    double *grad;      /* d + 4 out (needs target), or NULL                          */
    int num_threads;   /* CPU threads, 0: OpenMP default                             */
    char *msg;         /* error message buffer                                       */
    size_t msg_size;
} xknn__sk_job;

/* kernels/cpu/softknn.c */
xknn_status xknn__softknn_cpu_eval(const xknn__sk_job *job);      /* float path          */
xknn_status xknn__softknn_ref_eval(const xknn__sk_job *job);      /* double, naive       */

/* kernels/cuda/softknn.cu (kernels/cuda/softknn_stub.c without CUDA). The state holds
 * the training set on the device and the scratch buffers of one evaluation. */
typedef struct xknn__sk_cuda xknn__sk_cuda;
xknn_status xknn__softknn_cuda_create(int device, const uint64_t *x, const float *y, int64_t n, int64_t d,
                                      int64_t ld, xknn__sk_cuda **out, char *msg, size_t msg_size);
void xknn__softknn_cuda_destroy(xknn__sk_cuda *s);
/* job->x and job->y are ignored (the state's device copies are used). */
xknn_status xknn__softknn_cuda_eval(xknn__sk_cuda *s, const xknn__sk_job *job);

/* ---- formulas shared by every pass (host side) ------------------------------------ */

static inline double xknn__sk_sigmoid(double v)
{
    if (v >= 0) return 1.0 / (1.0 + exp(-v));
    {
        double e = exp(v);
        return e / (1.0 + e);
    }
}

/* sum_b |W_b| */
static inline double xknn__sk_wnorm(const double *theta, int64_t d)
{
    double s = 0;
    int64_t b;
    for (b = 0; b < d; b++) s += fabs(theta[b]);
    return s;
}

/* From mean_p: logits (scores), mean BCE (loss) and coef_p. Returns the loss (0
 * without targets). coef may be NULL. */
static inline double xknn__sk_head(const xknn__sk_job *job, const double *mean, double *coef)
{
    const double *th = job->theta;
    double alpha = th[job->d], beta = th[job->d + 1], loss = 0;
    int64_t p;
    for (p = 0; p < job->m; p++) {
        double s = beta * (mean[p] + alpha);
        if (job->scores) job->scores[p] = s;
        if (job->target) {
            double t = job->target[p] ? 1.0 : 0.0;
            /* softplus(s) - t s, stable for large |s| */
            loss += (s > 0 ? s : 0) - t * s + log1p(exp(-fabs(s)));
            if (coef) coef[p] = (xknn__sk_sigmoid(s) - t) / (double)job->m * beta / (double)job->nr;
        }
    }
    return job->target ? loss / (double)job->m : 0;
}

/* The gradient from the backward sums (see the top of this file); the gradients of
 * alpha and beta need mean_p and dL/dscore_p again. */
static inline void xknn__sk_assemble(const xknn__sk_job *job, const double *mean, const double sums[3],
                                     const double *tbit, double *grad)
{
    const double *th = job->theta;
    int64_t d = job->d, b, p;
    double s1 = xknn__sk_wnorm(th, d), alpha = th[d], beta = th[d + 1], a = th[d + 2], c = th[d + 3];
    double galpha = 0, gbeta = 0;
    for (p = 0; p < job->m; p++) {
        double s = beta * (mean[p] + alpha);
        double gs = (xknn__sk_sigmoid(s) - (job->target[p] ? 1.0 : 0.0)) / (double)job->m;
        galpha += gs * beta;
        gbeta += gs * (mean[p] + alpha);
    }
    for (b = 0; b < d; b++) {
        double gabs = a * (sums[2] / (s1 * s1) - tbit[b] / s1);
        grad[b] = th[b] < 0 ? -gabs : gabs;
    }
    grad[d] = galpha;
    grad[d + 1] = gbeta;
    grad[d + 2] = sums[1] - c * sums[0];
    grad[d + 3] = -a * sums[0];
}

#ifdef __cplusplus
}
#endif

#endif /* XKNN_IMPL_SOFTKNN_KERNELS_H */
