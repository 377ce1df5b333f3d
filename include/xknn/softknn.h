/* SPDX-License-Identifier: MIT */
/*
 * xknn/softknn.h -- soft-kNN binary classifier with a learned weighted Hamming distance.
 *
 * THE MODEL
 *   Training set: n bit-packed rows X_i of d bits (the XKNN_DTYPE_BIN layout of xknn.h:
 *   bit b of a row is bit b % 64 of uint64 word b / 64) with labels l_i in {0, 1}.
 *   Parameters theta (d + 4 doubles, in this order): W_0 .. W_{d-1}, alpha, beta, a, c.
 *   For a row U_p scored against a set R of training rows:
 *     whamming(X_i, U_p) = sum of |W_b| over the bits b where X_i and U_p differ
 *                          (the whamming metric of xknn.h with weights W)
 *     r_pi    = whamming(X_i, U_p) / ||W||_1                 in [0, 1]
 *     F(t)    = sigmoid(a (t - c))                           slope a, offset c
 *     score_p = beta * (mean over i in R of F(1 - r_pi) Y_i + alpha)   (a logit)
 *     loss    = mean over p of BCE(sigmoid(score_p), l_p)    (binary cross-entropy on
 *                                                             the logits, stable form)
 *   Y_i = l_i in {0, 1}: the mean is then a soft density of class-1 neighbours, and
 *   alpha the (negative) level above which a row is called class 1. With Y in
 *   {-1, +1} the mean becomes a vote of both classes, and a class-1 row near a dense
 *   cluster of class 0 gets a strongly negative logit; the
 *   binary cross-entropy, dominated by those rows, prefers nearly constant scores.
 *   Measured on binarized Fashion-MNIST, class 0 against the rest, 10k training
 *   images, a = 100, c = 0.9, alpha and beta from xknn_softknn_calibrate: with {0, 1}
 *   the start has test accuracy 0.921 and three epochs (lr 0.01) give mean batch
 *   losses 0.231, 0.216, 0.205 and accuracies 0.926, 0.929, 0.931; with {-1, +1} the
 *   calibrated start is the trivial classifier (accuracy 0.900) and three epochs
 *   (lr 0.003) leave it there (loss 0.283 to 0.274). The targets of the BCE are the labels.
 *   The gradient of |W_b| at W_b = 0 is taken from the right (sign(0) = +1).
 *
 * TRAINING (xknn_softknn_train): mini-batches of distinct training rows; each batch is
 *   scored against the rest of the training set (its own rows are excluded from the
 *   mean), or against a random subset of `refs` rows of the rest; Adam on theta.
 *   Epoch order and subsets come from a seeded generator (splitmix64): a run is fixed
 *   by its seed. Adam's step (about lr per step in the usual form) is taken in each
 *   parameter's own unit, so that one lr suits all of them: W in units of mean |W|
 *   (r does not depend on the scale of W), alpha in units of 1/|beta| (the scale of
 *   mean_p that moves a logit by one), beta in units of |beta|, a in units of |a|, c
 *   in units of 1/|a| (the width of F's transition). Start from
 *   xknn_softknn_init_params and xknn_softknn_calibrate.
 *
 * BACKENDS AND PRECISION
 *   cpu float   float distances and sigmoids, double sums per row; OpenMP threads; with
 *               CBLAS the weighted distances and the per-bit gradient sum are sgemm
 *               products on 0/1 floats.
 *   cpu double  (XKNN_SOFTKNN_DOUBLE_REF) naive double loops over pairs and bits: the
 *               reference of the tests, for small data only (O(m * nr * d)).
 *   cuda        float kernels over packed 64-bit words (never an m x nr x d tensor), one
 *               block per scored row, fixed-order reductions.
 *   Determinism: for one backend, machine, thread count and seed, every evaluation and
 *   every training run gives the same bits (the CUDA reductions are in a fixed order,
 *   without atomics; the CPU path is as deterministic as its sgemm, which OpenBLAS is
 *   for a fixed thread count). CPU and CUDA, and float and double, do NOT give
 *   identical numbers: they agree within rounding (tests/softknn-t.c: loss within
 *   1e-5 relative, the weights' gradient within 1e-3 of its largest component), and
 *   training runs drift apart over many steps.
 *
 * MEMORY
 *   Every pointer of this API is host memory. The model copies the training set (and,
 *   with CUDA, uploads it once to the device). One evaluation of m rows against nr
 *   rows allocates about 8 m nr bytes (host, CPU; device, CUDA) plus O((m + nr) d);
 *   xknn_softknn_score works in chunks of XKNN_SOFTKNN_SCORE_CHUNK rows.
 *   No global state: models are independent; one model is used by one thread at a
 *   time. Calls are synchronous.
 *
 * HOST CODE: compiled behind XKNN_IMPLEMENTATION like xknn.h (libxknn does it); the
 * passes live in kernels/cpu/softknn.c and kernels/cuda/softknn.cu.
 */
#ifndef XKNN_SOFTKNN_H
#define XKNN_SOFTKNN_H

#include <stddef.h>
#include <stdint.h>

#include "../xknn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parameter vector layout: d weights, then alpha, beta, a, c. */
#define XKNN_SOFTKNN_NPARAMS(d) ((d) + 4)
#define XKNN_SOFTKNN_ALPHA(d) ((d) + 0)
#define XKNN_SOFTKNN_BETA(d) ((d) + 1)
#define XKNN_SOFTKNN_SLOPE(d) ((d) + 2)
#define XKNN_SOFTKNN_OFFSET(d) ((d) + 3)
/* Rows per evaluation inside xknn_softknn_score. */
#define XKNN_SOFTKNN_SCORE_CHUNK 256

typedef enum xknn_softknn_precision {
    XKNN_SOFTKNN_FLOAT = 0,   /* float passes on the CPU or CUDA (default)        */
    XKNN_SOFTKNN_DOUBLE_REF,  /* double-precision naive CPU reference (backend cpu) */
    XKNN_SOFTKNN_PRECISION_COUNT
} xknn_softknn_precision;

typedef struct xknn_softknn_config {
    xknn_backend backend;             /* AUTO: CUDA when built and a device is present */
    xknn_softknn_precision precision; /* XKNN_SOFTKNN_FLOAT                            */
    int device;                       /* CUDA device ordinal; -1: current device        */
    int num_threads;                  /* CPU threads; 0: OpenMP default                 */
} xknn_softknn_config;
#define XKNN_SOFTKNN_CONFIG_INIT { XKNN_BACKEND_AUTO, XKNN_SOFTKNN_FLOAT, -1, 0 }

/* A training set on its backend. Opaque. */
typedef struct xknn_softknn xknn_softknn;

/* What xknn_softknn_train reports after each epoch. */
typedef struct xknn_softknn_epoch {
    int epoch;       /* 1-based                                   */
    int64_t batches; /* mini-batches in the epoch                 */
    double loss;     /* mean of the batches' losses (before each step) */
} xknn_softknn_epoch;

typedef struct xknn_softknn_train_opts {
    int epochs;      /* passes over the training set (>= 1)                              */
    int64_t batch;   /* rows per mini-batch (1 .. n-1; the last batch may be smaller)    */
    int64_t refs;    /* rows each batch is scored against: 0 = all the rest, else a random
                        subset of the rest of this size (faster, noisier gradients)       */
    double lr, beta1, beta2, eps; /* Adam                                                */
    uint64_t seed;   /* order of the rows and reference subsets                          */
    /* Called after each epoch with the current parameters; nonzero stops training
     * (not an error). May be NULL. */
    int (*on_epoch)(void *user, const xknn_softknn_epoch *info, const double *theta);
    void *user;
} xknn_softknn_train_opts;
#define XKNN_SOFTKNN_TRAIN_INIT { 1, 256, 0, 0.01, 0.9, 0.999, 1e-8, 1, NULL, NULL }

/* Not collective. Copies the training set: x holds n rows of d bits, ldx uint64 words
 * between rows (0: ceil(d/64)), host memory; labels: n values in {0, 1}, host memory.
 * Needs n >= 2, d >= 1. Backend AUTO picks CUDA for XKNN_SOFTKNN_FLOAT when it is built
 * and a device is present; DOUBLE_REF runs on the CPU only.
 * Errors: INVALID_ARGUMENT (sizes, a label not 0/1 naming its row, precision with
 * backend cuda), OUT_OF_MEMORY, NOT_BUILT / NO_DEVICE / DEVICE (backend cuda). */
XKNN_API xknn_status xknn_softknn_create(const xknn_softknn_config *cfg, const uint64_t *x, int64_t ldx,
                                         const uint8_t *labels, int64_t n, int64_t d, xknn_softknn **model,
                                         xknn_error *err);
XKNN_API void xknn_softknn_destroy(xknn_softknn *model);
/* The backend the model runs on (CPU or CUDA, never AUTO). */
XKNN_API xknn_backend xknn_softknn_backend(const xknn_softknn *model);

/* Starting parameters (host, d + 4 doubles): W_b = 1, alpha = 0, beta = 1, a = 100,
 * c = 0.9 (F(1 - r) is above 1/2 for the rows within 10% of ||W||_1, below 0.01 past
 * 15%: suits images whose near neighbours differ in a few percent of their bits).
 * Then set alpha and beta with xknn_softknn_calibrate. */
XKNN_API void xknn_softknn_init_params(int64_t d, double *theta);

/* Not collective. Sets alpha and beta of theta (host, d + 4; the other parameters are
 * kept) from m training rows drawn with `seed`, each scored against the other n - m
 * rows (keep m well below n): with W, a, c fixed the loss is a logistic regression of the labels on mean_p (weight
 * beta, bias beta * alpha), convex; it is fitted by Newton's method with step halving.
 * Needs rows of both labels among the drawn ones and a larger vote mean_p indicating
 * label 1. Errors as xknn_softknn_loss_grad, and INVALID_VALUE when the classes cannot
 * be told apart. */
XKNN_API xknn_status xknn_softknn_calibrate(xknn_softknn *model, int64_t m, uint64_t seed, double *theta,
                                            xknn_error *err);

/* Not collective. Loss (and gradient) of the training rows batch[0..m) (distinct row
 * numbers, host) scored against the training rows refs[0..nr) (host; none of them in
 * the batch), or, with refs NULL, against every training row not in the batch.
 * theta: d + 4 (host, ||W||_1 > 0, all finite); loss: mean BCE; grad: d + 4 (host),
 * may be NULL. Errors: INVALID_ARGUMENT (rows out of range, repeated, or a reference
 * in the batch, no reference left), INVALID_VALUE (theta), OUT_OF_MEMORY, DEVICE. */
XKNN_API xknn_status xknn_softknn_loss_grad(xknn_softknn *model, const int64_t *batch, int64_t m,
                                            const int64_t *refs, int64_t nr, const double *theta, double *loss,
                                            double *grad, xknn_error *err);

/* Not collective. Logits score_p of m new rows u (host, d bits, ldu words between rows,
 * 0: ceil(d/64)) against every training row; predict class 1 when score_p > 0.
 * Errors as xknn_softknn_loss_grad. */
XKNN_API xknn_status xknn_softknn_score(xknn_softknn *model, const uint64_t *u, int64_t ldu, int64_t m,
                                        const double *theta, double *scores, xknn_error *err);

/* Not collective. Adam from theta (host, d + 4, updated in place). Errors as above and
 * INVALID_ARGUMENT for bad options. */
XKNN_API xknn_status xknn_softknn_train(xknn_softknn *model, const xknn_softknn_train_opts *opts, double *theta,
                                        xknn_error *err);

#ifdef __cplusplus
}
#endif

#endif /* XKNN_SOFTKNN_H */

/* ===================================================================================== */
/*                                  IMPLEMENTATION                                       */
/* ===================================================================================== */
#ifdef XKNN_IMPLEMENTATION
#ifndef XKNN__SOFTKNN_IMPLEMENTATION_DONE
#define XKNN__SOFTKNN_IMPLEMENTATION_DONE

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "impl/backend.h" /* xknn__fail */
#include "impl/softknn_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

struct xknn_softknn {
    xknn_backend backend;
    xknn_softknn_precision precision;
    int num_threads;
    int64_t n, d, ld;
    uint64_t *x;      /* host copy, ld = ceil(d/64) */
    float *y;         /* -1 / +1                    */
    uint8_t *labels;  /* 0 / 1                      */
    xknn__sk_cuda *cuda;
};

void xknn_softknn_init_params(int64_t d, double *theta)
{
    int64_t b;
    for (b = 0; b < d; b++) theta[b] = 1.0;
    theta[d] = 0.0;
    theta[d + 1] = 1.0;
    theta[d + 2] = 100.0;
    theta[d + 3] = 0.9;
}

xknn_backend xknn_softknn_backend(const xknn_softknn *model) { return model ? model->backend : XKNN_BACKEND_COUNT; }

void xknn_softknn_destroy(xknn_softknn *model)
{
    if (!model) return;
    if (model->cuda) xknn__softknn_cuda_destroy(model->cuda);
    free(model->labels);
    free(model->y);
    free(model->x);
    free(model);
}

xknn_status xknn_softknn_create(const xknn_softknn_config *cfg, const uint64_t *x, int64_t ldx,
                                const uint8_t *labels, int64_t n, int64_t d, xknn_softknn **model, xknn_error *err)
{
    xknn_softknn_config c = XKNN_SOFTKNN_CONFIG_INIT;
    xknn_softknn *s;
    int64_t words, i;
    if (err) err->status = XKNN_SUCCESS, err->message[0] = '\0';
    if (!model) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN: model pointer is NULL");
    *model = NULL;
    if (cfg) c = *cfg;
    if (!x || !labels) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN: x or labels is NULL");
    if (n < 2 || d < 1)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN: need n >= 2 rows and d >= 1 bits (n=%lld d=%lld)",
                          (long long)n, (long long)d);
    words = (d + 63) / 64;
    if (ldx == 0) ldx = words;
    if (ldx < words)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN: ldx=%lld words is less than ceil(d/64)=%lld",
                          (long long)ldx, (long long)words);
    if ((int)c.backend < 0 || c.backend >= XKNN_BACKEND_COUNT || (int)c.precision < 0 ||
        c.precision >= XKNN_SOFTKNN_PRECISION_COUNT)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN: unknown backend or precision value");
    if (c.precision == XKNN_SOFTKNN_DOUBLE_REF && c.backend == XKNN_BACKEND_CUDA)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          "soft-kNN: the double-precision reference runs on the CPU only (backend cuda asked)");
    for (i = 0; i < n; i++)
        if (labels[i] > 1)
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN: label of row %lld is %d, must be 0 or 1",
                              (long long)i, (int)labels[i]);
    if (c.backend == XKNN_BACKEND_AUTO)
        c.backend = (c.precision == XKNN_SOFTKNN_FLOAT && xknn_cuda_device_count() > 0) ? XKNN_BACKEND_CUDA
                                                                                      : XKNN_BACKEND_CPU;
    s = (xknn_softknn *)calloc(1, sizeof *s);
    if (!s) return xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "soft-kNN: out of memory");
    s->backend = c.backend;
    s->precision = c.precision;
    s->num_threads = c.num_threads;
    s->n = n, s->d = d, s->ld = words;
    s->x = (uint64_t *)malloc((size_t)(n * words) * sizeof(uint64_t));
    s->y = (float *)malloc((size_t)n * sizeof(float));
    s->labels = (uint8_t *)malloc((size_t)n);
    if (!s->x || !s->y || !s->labels) {
        xknn_softknn_destroy(s);
        return xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "soft-kNN: out of memory for %lld rows of %lld bits",
                          (long long)n, (long long)d);
    }
    for (i = 0; i < n; i++) {
        memcpy(s->x + i * words, x + i * ldx, (size_t)words * sizeof(uint64_t));
        if (d & 63) s->x[i * words + words - 1] &= ((uint64_t)1 << (d & 63)) - 1; /* bits past d: zero */
        s->y[i] = labels[i] ? 1.0f : 0.0f;
        s->labels[i] = labels[i];
    }
    if (s->backend == XKNN_BACKEND_CUDA) {
        char msg[512] = "";
        xknn_status st = xknn__softknn_cuda_create(c.device, s->x, s->y, n, d, words, &s->cuda, msg, sizeof msg);
        if (st != XKNN_SUCCESS) {
            xknn_softknn_destroy(s);
            return xknn__fail(err, st, "soft-kNN: %s", msg);
        }
    }
    *model = s;
    return XKNN_SUCCESS;
}

static xknn_status xknn__sk_check_theta(const xknn_softknn *s, const double *theta, xknn_error *err)
{
    int64_t i;
    if (!theta) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN: theta is NULL");
    for (i = 0; i < s->d + 4; i++)
        if (!isfinite(theta[i]))
            return xknn__fail(err, XKNN_ERROR_INVALID_VALUE, "soft-kNN: parameter %lld is not finite", (long long)i);
    if (!(xknn__sk_wnorm(theta, s->d) > 0))
        return xknn__fail(err, XKNN_ERROR_INVALID_VALUE, "soft-kNN: every weight is zero (||W||_1 = 0)");
    return XKNN_SUCCESS;
}

/* One evaluation on the model's backend; u, target: m rows; refs: nr rows (checked). */
static xknn_status xknn__sk_run(xknn_softknn *s, const uint64_t *u, int64_t m, const int64_t *refs, int64_t nr,
                                const double *theta, const uint8_t *target, double *scores, double *loss,
                                double *grad, xknn_error *err)
{
    char msg[512] = "";
    xknn_status st;
    xknn__sk_job job;
    memset(&job, 0, sizeof job);
    job.x = s->x, job.y = s->y, job.n = s->n, job.d = s->d, job.ld = s->ld;
    job.u = u, job.m = m, job.refs = refs, job.nr = nr, job.theta = theta;
    job.target = target, job.scores = scores, job.loss = loss, job.grad = grad;
    job.num_threads = s->num_threads, job.msg = msg, job.msg_size = sizeof msg;
    if (s->backend == XKNN_BACKEND_CUDA)
        st = xknn__softknn_cuda_eval(s->cuda, &job);
    else if (s->precision == XKNN_SOFTKNN_DOUBLE_REF)
        st = xknn__softknn_ref_eval(&job);
    else
        st = xknn__softknn_cpu_eval(&job);
    if (st != XKNN_SUCCESS) return xknn__fail(err, st, "soft-kNN: %s", msg);
    return XKNN_SUCCESS;
}

/* Gathers the batch rows and targets, builds or checks the reference list, runs. */
static xknn_status xknn__sk_batch(xknn_softknn *s, const int64_t *batch, int64_t m, const int64_t *refs, int64_t nr,
                                  const double *theta, double *scores, double *loss, double *grad, xknn_error *err)
{
    uint8_t *mark = (uint8_t *)calloc((size_t)s->n, 1);
    uint64_t *u = (uint64_t *)malloc((size_t)(m > 0 ? m * s->ld : 1) * sizeof(uint64_t));
    uint8_t *target = (uint8_t *)malloc((size_t)(m > 0 ? m : 1));
    int64_t *own = NULL, i;
    xknn_status st = XKNN_SUCCESS;
    if (!mark || !u || !target) {
        st = xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "soft-kNN: out of memory");
        goto done;
    }
    for (i = 0; i < m; i++) {
        int64_t r = batch[i];
        if (r < 0 || r >= s->n || mark[r]) {
            st = xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN: batch[%lld] = %lld is %s", (long long)i,
                            (long long)r, (r < 0 || r >= s->n) ? "out of range" : "repeated");
            goto done;
        }
        mark[r] = 1;
        memcpy(u + i * s->ld, s->x + r * s->ld, (size_t)s->ld * sizeof(uint64_t));
        target[i] = s->labels[r];
    }
    if (refs) {
        for (i = 0; i < nr; i++)
            if (refs[i] < 0 || refs[i] >= s->n || mark[refs[i]]) {
                st = xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN: refs[%lld] = %lld is %s", (long long)i,
                                (long long)refs[i], (refs[i] < 0 || refs[i] >= s->n) ? "out of range" : "in the batch");
                goto done;
            }
    } else {
        int64_t k = 0;
        nr = s->n - m;
        own = (int64_t *)malloc((size_t)(nr > 0 ? nr : 1) * sizeof(int64_t));
        if (!own) {
            st = xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "soft-kNN: out of memory");
            goto done;
        }
        for (i = 0; i < s->n; i++)
            if (!mark[i]) own[k++] = i;
        refs = own;
    }
    if (nr < 1) {
        st = xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN: no reference row left to score the batch against");
        goto done;
    }
    st = xknn__sk_run(s, u, m, refs, nr, theta, target, scores, loss, grad, err);
done:
    free(own);
    free(target);
    free(u);
    free(mark);
    return st;
}

xknn_status xknn_softknn_loss_grad(xknn_softknn *model, const int64_t *batch, int64_t m, const int64_t *refs,
                                   int64_t nr, const double *theta, double *loss, double *grad, xknn_error *err)
{
    xknn_status st;
    double l = 0;
    if (err) err->status = XKNN_SUCCESS, err->message[0] = '\0';
    if (!model || !batch || m < 1 || (refs && nr < 1))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN loss_grad: model and batch needed, m >= 1 (m=%lld)",
                          (long long)m);
    st = xknn__sk_check_theta(model, theta, err);
    if (st != XKNN_SUCCESS) return st;
    st = xknn__sk_batch(model, batch, m, refs, nr, theta, NULL, &l, grad, err);
    if (st == XKNN_SUCCESS && loss) *loss = l;
    return st;
}

xknn_status xknn_softknn_score(xknn_softknn *model, const uint64_t *u, int64_t ldu, int64_t m, const double *theta,
                               double *scores, xknn_error *err)
{
    int64_t *all = NULL, i, p0;
    uint64_t *chunk = NULL;
    xknn_status st;
    if (err) err->status = XKNN_SUCCESS, err->message[0] = '\0';
    if (!model || !u || !scores || m < 1)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN score: model, rows and scores needed, m >= 1");
    if (ldu == 0) ldu = model->ld;
    if (ldu < model->ld)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN score: ldu=%lld words is less than %lld",
                          (long long)ldu, (long long)model->ld);
    st = xknn__sk_check_theta(model, theta, err);
    if (st != XKNN_SUCCESS) return st;
    all = (int64_t *)malloc((size_t)model->n * sizeof(int64_t));
    chunk = (uint64_t *)malloc((size_t)(XKNN_SOFTKNN_SCORE_CHUNK * model->ld) * sizeof(uint64_t));
    if (!all || !chunk) {
        free(chunk), free(all);
        return xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "soft-kNN score: out of memory");
    }
    for (i = 0; i < model->n; i++) all[i] = i;
    for (p0 = 0; p0 < m && st == XKNN_SUCCESS; p0 += XKNN_SOFTKNN_SCORE_CHUNK) {
        int64_t mc = m - p0 < XKNN_SOFTKNN_SCORE_CHUNK ? m - p0 : XKNN_SOFTKNN_SCORE_CHUNK;
        for (i = 0; i < mc; i++) {
            memcpy(chunk + i * model->ld, u + (p0 + i) * ldu, (size_t)model->ld * sizeof(uint64_t));
            if (model->d & 63) chunk[i * model->ld + model->ld - 1] &= ((uint64_t)1 << (model->d & 63)) - 1;
        }
        st = xknn__sk_run(model, chunk, mc, all, model->n, theta, NULL, scores + p0, NULL, NULL, err);
    }
    free(chunk);
    free(all);
    return st;
}

/* splitmix64: the training's only source of randomness (seeded, no global state). */
static uint64_t xknn__sk_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int64_t xknn__sk_below(uint64_t *state, int64_t n) { return (int64_t)(xknn__sk_rand(state) % (uint64_t)n); }

static int xknn__sk_cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Mean BCE of logits w[0] v_i + w[1] against the labels of rows order[i]. */
static double xknn__sk_logloss(const double *v, const int64_t *order, const uint8_t *labels, int64_t m,
                               const double *w)
{
    double l = 0;
    int64_t i;
    for (i = 0; i < m; i++) {
        double s = w[0] * v[i] + w[1];
        l += (s > 0 ? s : 0) - (labels[order[i]] ? s : 0) + log1p(exp(-fabs(s)));
    }
    return l / (double)m;
}

xknn_status xknn_softknn_calibrate(xknn_softknn *model, int64_t m, uint64_t seed, double *theta, xknn_error *err)
{
    int64_t *order = NULL, i, n1 = 0, n0 = 0, d;
    double *tmp = NULL, *sc = NULL;
    uint64_t rng = seed;
    xknn_status st;
    if (err) err->status = XKNN_SUCCESS, err->message[0] = '\0';
    if (!model || m < 2 || m > model->n - 1)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN calibrate: need a model and 2 <= m <= n-1");
    st = xknn__sk_check_theta(model, theta, err);
    if (st != XKNN_SUCCESS) return st;
    d = model->d;
    order = (int64_t *)malloc((size_t)model->n * sizeof(int64_t));
    tmp = (double *)malloc((size_t)(d + 4) * sizeof(double));
    sc = (double *)malloc((size_t)m * sizeof(double));
    if (!order || !tmp || !sc) {
        st = xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "soft-kNN calibrate: out of memory");
        goto done;
    }
    for (i = 0; i < model->n; i++) order[i] = i;
    for (i = 0; i < m; i++) { /* m distinct rows */
        int64_t j = i + xknn__sk_below(&rng, model->n - i), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    memcpy(tmp, theta, (size_t)(d + 4) * sizeof(double));
    tmp[d] = 0, tmp[d + 1] = 1; /* score = mean_p */
    st = xknn__sk_batch(model, order, m, NULL, 0, tmp, sc, NULL, NULL, err);
    if (st != XKNN_SUCCESS) goto done;
    for (i = 0; i < m; i++) n1 += model->labels[order[i]];
    n0 = m - n1;
    {
        /* logit = w1 v + w0 on the standardised vote v = (mean_p - mu) / sd: a convex
         * two-parameter logistic regression, Newton's method with step halving */
        double mu = 0, sd = 0, w[2] = {0, 0}, lcur;
        int it;
        for (i = 0; i < m; i++) mu += sc[i] / (double)m;
        for (i = 0; i < m; i++) sd += (sc[i] - mu) * (sc[i] - mu) / (double)m;
        sd = sqrt(sd);
        if (n1 == 0 || n0 == 0 || !(sd > 0)) {
            st = xknn__fail(err, XKNN_ERROR_INVALID_VALUE,
                            "soft-kNN calibrate: %lld rows of label 1 and %lld of label 0 drawn, spread of mean_p %g: "
                            "draw more rows or change a, c",
                            (long long)n1, (long long)n0, sd);
            goto done;
        }
        for (i = 0; i < m; i++) sc[i] = (sc[i] - mu) / sd;
        lcur = xknn__sk_logloss(sc, order, model->labels, m, w);
        for (it = 0; it < 100; it++) {
            double g1 = 0, g0 = 0, h11 = 1e-9, h10 = 0, h00 = 1e-9, det, s1, s0, lnew = lcur, wn[2];
            int half;
            for (i = 0; i < m; i++) {
                double pr = xknn__sk_sigmoid(w[0] * sc[i] + w[1]), r = pr - (model->labels[order[i]] ? 1.0 : 0.0);
                double q = pr * (1 - pr);
                g1 += r * sc[i], g0 += r;
                h11 += q * sc[i] * sc[i], h10 += q * sc[i], h00 += q;
            }
            det = h11 * h00 - h10 * h10;
            if (!(det > 0)) break;
            s1 = (h00 * g1 - h10 * g0) / det, s0 = (h11 * g0 - h10 * g1) / det;
            for (half = 0; half < 40; half++, s1 *= 0.5, s0 *= 0.5) {
                wn[0] = w[0] - s1, wn[1] = w[1] - s0;
                lnew = xknn__sk_logloss(sc, order, model->labels, m, wn);
                if (lnew <= lcur) break;
            }
            if (half == 40) break;
            w[0] = wn[0], w[1] = wn[1];
            if (lcur - lnew <= 1e-14 * lcur) break;
            lcur = lnew;
        }
        /* w1 (mean - mu) / sd + w0 = beta (mean + alpha) */
        theta[d + 1] = w[0] / sd;
        if (!(theta[d + 1] > 0) || !isfinite(theta[d + 1])) {
            st = xknn__fail(err, XKNN_ERROR_INVALID_VALUE,
                            "soft-kNN calibrate: a larger vote mean_p does not indicate label 1 (fitted beta %g)",
                            theta[d + 1]);
            goto done;
        }
        theta[d] = w[1] / theta[d + 1] - mu;
    }
done:
    free(sc), free(tmp), free(order);
    return st;
}

xknn_status xknn_softknn_train(xknn_softknn *model, const xknn_softknn_train_opts *opts, double *theta,
                               xknn_error *err)
{
    xknn_softknn_train_opts o;
    int64_t np, n, i, *order = NULL, *rest = NULL;
    uint8_t *mark = NULL;
    double *g = NULL, *m1 = NULL, *m2 = NULL;
    uint64_t rng;
    long long step = 0;
    int ep;
    xknn_status st;
    if (err) err->status = XKNN_SUCCESS, err->message[0] = '\0';
    if (!model || !opts) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "soft-kNN train: model and options needed");
    o = *opts;
    n = model->n;
    np = XKNN_SOFTKNN_NPARAMS(model->d);
    if (o.epochs < 1 || o.batch < 1 || o.batch > n - 1 || o.refs < 0 || !(o.lr > 0) || !(o.beta1 >= 0 && o.beta1 < 1) ||
        !(o.beta2 >= 0 && o.beta2 < 1) || !(o.eps > 0))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          "soft-kNN train: need epochs >= 1, 1 <= batch <= n-1 (n=%lld), refs >= 0, lr > 0, "
                          "0 <= beta1, beta2 < 1, eps > 0",
                          (long long)n);
    st = xknn__sk_check_theta(model, theta, err);
    if (st != XKNN_SUCCESS) return st;
    order = (int64_t *)malloc((size_t)n * sizeof(int64_t));
    rest = (int64_t *)malloc((size_t)n * sizeof(int64_t));
    mark = (uint8_t *)calloc((size_t)n, 1);
    g = (double *)malloc((size_t)np * sizeof(double));
    m1 = (double *)calloc((size_t)np, sizeof(double));
    m2 = (double *)calloc((size_t)np, sizeof(double));
    if (!order || !rest || !mark || !g || !m1 || !m2) {
        st = xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "soft-kNN train: out of memory");
        goto done;
    }
    rng = o.seed;
    for (i = 0; i < n; i++) order[i] = i;
    for (ep = 1; ep <= o.epochs && st == XKNN_SUCCESS; ep++) {
        xknn_softknn_epoch info;
        int64_t b0, nb = 0;
        double lsum = 0;
        for (i = n - 1; i > 0; i--) { /* Fisher-Yates */
            int64_t j = xknn__sk_below(&rng, i + 1), t = order[i];
            order[i] = order[j], order[j] = t;
        }
        for (b0 = 0; b0 < n && st == XKNN_SUCCESS; b0 += o.batch) {
            int64_t m = n - b0 < o.batch ? n - b0 : o.batch, nr = 0, k;
            double loss = 0, bc1, bc2;
            if (n - m < 1) break;
            for (i = 0; i < m; i++) mark[order[b0 + i]] = 1;
            for (i = 0; i < n; i++)
                if (!mark[i]) rest[nr++] = i;
            for (i = 0; i < m; i++) mark[order[b0 + i]] = 0;
            if (o.refs > 0 && o.refs < nr) { /* random subset of the rest, kept sorted */
                for (k = 0; k < o.refs; k++) {
                    int64_t j = k + xknn__sk_below(&rng, nr - k), t = rest[k];
                    rest[k] = rest[j], rest[j] = t;
                }
                nr = o.refs;
                qsort(rest, (size_t)nr, sizeof(int64_t), xknn__sk_cmp_i64);
            }
            st = xknn__sk_batch(model, order + b0, m, rest, nr, theta, NULL, &loss, g, err);
            if (st != XKNN_SUCCESS) break;
            step++;
            bc1 = 1.0 - pow(o.beta1, (double)step);
            bc2 = 1.0 - pow(o.beta2, (double)step);
            {
                /* Adam, each step in the parameter's own unit (see TRAINING above) */
                int64_t dd = model->d;
                double wunit = xknn__sk_wnorm(theta, dd) / (double)dd, ab = fabs(theta[dd + 1]),
                       aa = fabs(theta[dd + 2]);
                double unit[4];
                unit[0] = ab > 0 ? 1 / ab : 1, unit[1] = ab > 0 ? ab : 1;
                unit[2] = aa > 0 ? aa : 1, unit[3] = aa > 0 ? 1 / aa : 1;
                for (i = 0; i < np; i++) {
                    m1[i] = o.beta1 * m1[i] + (1 - o.beta1) * g[i];
                    m2[i] = o.beta2 * m2[i] + (1 - o.beta2) * g[i] * g[i];
                    theta[i] -= o.lr * (i < dd ? wunit : unit[i - dd]) * (m1[i] / bc1) / (sqrt(m2[i] / bc2) + o.eps);
                }
            }
            lsum += loss;
            nb++;
            if (!(xknn__sk_wnorm(theta, model->d) > 0)) {
                st = xknn__fail(err, XKNN_ERROR_INVALID_VALUE, "soft-kNN train: every weight reached zero at step %lld",
                                step);
                break;
            }
        }
        if (st != XKNN_SUCCESS) break;
        info.epoch = ep;
        info.batches = nb;
        info.loss = nb ? lsum / (double)nb : 0;
        if (o.on_epoch && o.on_epoch(o.user, &info, theta)) break;
    }
done:
    free(m2), free(m1), free(g), free(mark), free(rest), free(order);
    return st;
}

#ifdef __cplusplus
}
#endif

#endif /* XKNN__SOFTKNN_IMPLEMENTATION_DONE */
#endif /* XKNN_IMPLEMENTATION */
