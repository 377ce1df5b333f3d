/* SPDX-License-Identifier: MIT */
/* softknn-t: the soft-kNN model of include/xknn/softknn.h.
 *   (no argument)  suite unit: argument checks; the analytic gradient of every
 *                  parameter of the double-precision reference against central finite
 *                  differences; the CPU float passes against that reference; a small
 *                  training run that must lower the loss and classify held-out rows.
 *   cuda           suite cuda: the CUDA passes against the double reference and the
 *                  CPU float passes; identical bits on repeated runs. Skips everything
 *                  (1..0 # SKIP no CUDA device) without CUDA or a device.
 * Tolerances (float passes against the double reference): loss and logits within
 * 1e-5 relative (+1e-6 absolute); gradient: alpha, beta, a, c within 1e-4 of the
 * largest of the four, the weights within 1e-3 of the largest |dL/dW_b| of the reference. Finite differences: h = 1e-5 (1 + |theta|),
 * agreement within 1e-6 relative + 1e-9 absolute. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap/tap.h"
#include "xknn.h"
#include "xknn/softknn.h"

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

/* n rows of d bits: two class prototypes, each row its class's prototype with bits
 * flipped with probability `noise`; every 7th row a copy of the one before it
 * (duplicates); `junk` bits (the last ones) are pure noise. Garbage past d in the last
 * word, which every pass must ignore. */
typedef struct {
    int64_t n, d, ld;
    uint64_t *x;
    uint8_t *y;
} dataset;

static void make_data(dataset *ds, int64_t n, int64_t d, double noise, int64_t junk, uint64_t seed)
{
    int64_t i, b, ld = (d + 63) / 64;
    uint64_t s = seed;
    uint8_t *proto = (uint8_t *)malloc((size_t)(2 * d));
    for (b = 0; b < 2 * d; b++) proto[b] = (uint8_t)(rng_next(&s) & 1);
    ds->n = n, ds->d = d, ds->ld = ld;
    ds->x = (uint64_t *)calloc((size_t)(n * ld), sizeof(uint64_t));
    ds->y = (uint8_t *)malloc((size_t)n);
    for (i = 0; i < n; i++) {
        if (i % 7 == 6) {
            memcpy(ds->x + i * ld, ds->x + (i - 1) * ld, (size_t)ld * sizeof(uint64_t));
            ds->y[i] = ds->y[i - 1];
            continue;
        }
        ds->y[i] = (uint8_t)(rng_unit(&s) < 0.3);
        for (b = 0; b < d; b++) {
            int v = b >= d - junk ? (int)(rng_next(&s) & 1) : proto[ds->y[i] * d + b] ^ (rng_unit(&s) < noise);
            if (v) ds->x[i * ld + b / 64] |= (uint64_t)1 << (b % 64);
        }
        if (d % 64) ds->x[i * ld + ld - 1] |= ~(((uint64_t)1 << (d % 64)) - 1) & rng_next(&s);
    }
    free(proto);
}

static void free_data(dataset *ds)
{
    free(ds->x);
    free(ds->y);
}

static void random_theta(int64_t d, double *th, uint64_t seed)
{
    uint64_t s = seed;
    int64_t b;
    for (b = 0; b < d; b++) th[b] = (0.5 + rng_unit(&s)) * ((rng_next(&s) & 3) == 0 ? -1.0 : 1.0);
    th[d] = 0.15, th[d + 1] = 3.0, th[d + 2] = 4.0, th[d + 3] = 0.6;
}

static xknn_softknn *make_model(const dataset *ds, xknn_backend be, xknn_softknn_precision prec)
{
    xknn_softknn_config cfg = XKNN_SOFTKNN_CONFIG_INIT;
    xknn_softknn *m = NULL;
    xknn_error err;
    cfg.backend = be, cfg.precision = prec;
    if (xknn_softknn_create(&cfg, ds->x, 0, ds->y, ds->n, ds->d, &m, &err) != XKNN_SUCCESS)
        bail("xknn_softknn_create: %s", err.message);
    return m;
}

static double eval(xknn_softknn *m, const int64_t *batch, int64_t mb, const int64_t *refs, int64_t nr,
                   const double *th, double *grad)
{
    double loss = 0;
    xknn_error err;
    if (xknn_softknn_loss_grad(m, batch, mb, refs, nr, th, &loss, grad, &err) != XKNN_SUCCESS)
        bail("xknn_softknn_loss_grad: %s", err.message);
    return loss;
}

static const char *const pname[5] = {"W", "alpha", "beta", "a (slope)", "c (offset)"};

/* 5 tests: the double reference's gradient against central differences, per group. */
static void check_fd(const char *what, int64_t n, int64_t d, int64_t mb, int use_refs, uint64_t seed)
{
    dataset ds;
    xknn_softknn *m;
    int64_t np = d + 4, k, batch[64], refs[256], nr = 0, i;
    double *th = (double *)malloc((size_t)np * sizeof(double)), *g = (double *)malloc((size_t)np * sizeof(double));
    double worst[5] = {0, 0, 0, 0, 0};
    int64_t wk[5] = {0, 0, 0, 0, 0};
    make_data(&ds, n, d, 0.25, 5, seed);
    m = make_model(&ds, XKNN_BACKEND_CPU, XKNN_SOFTKNN_DOUBLE_REF);
    for (i = 0; i < mb; i++) batch[i] = (i * 5 + 3) % n;
    if (use_refs)
        for (i = 0; i < n && nr < 256; i++) {
            int in = 0, j;
            for (j = 0; j < mb; j++) in |= batch[j] == i;
            if (!in && i % 3 != 1) refs[nr++] = i;
        }
    random_theta(d, th, seed + 1);
    eval(m, batch, mb, use_refs ? refs : NULL, nr, th, g);
    for (k = 0; k < np; k++) {
        double save = th[k], h = 1e-5 * (1 + fabs(save)), lp, lm, fd, e;
        int grp = k < d ? 0 : (int)(k - d + 1);
        th[k] = save + h;
        lp = eval(m, batch, mb, use_refs ? refs : NULL, nr, th, NULL);
        th[k] = save - h;
        lm = eval(m, batch, mb, use_refs ? refs : NULL, nr, th, NULL);
        th[k] = save;
        fd = (lp - lm) / (2 * h);
        e = fabs(g[k] - fd) / (1e-9 + 1e-6 * fabs(fd));
        if (e > worst[grp]) worst[grp] = e, wk[grp] = k;
    }
    for (k = 0; k < 5; k++)
        ok(worst[k] <= 1.0, "%s: d loss / d %s matches central differences (worst ratio to tolerance %.3g at %lld)",
           what, pname[k], worst[k], (long long)wk[k]);
    xknn_softknn_destroy(m);
    free_data(&ds);
    free(g);
    free(th);
}

/* 3 tests: a float model (CPU or CUDA) against the double reference: loss, gradient
 * and logits of held-out rows; 1 more: a repeated evaluation gives the same bits. */
static void check_float(const char *what, xknn_backend be, int64_t n, int64_t d, int64_t mb, uint64_t seed)
{
    dataset ds, q;
    xknn_softknn *mf, *md;
    int64_t np = d + 4, i, k, *batch = (int64_t *)malloc((size_t)mb * sizeof(int64_t));
    double *th = (double *)malloc((size_t)np * sizeof(double));
    double *gf = (double *)malloc((size_t)np * sizeof(double)), *gd = (double *)malloc((size_t)np * sizeof(double));
    double *g2 = (double *)malloc((size_t)np * sizeof(double));
    double *sf = (double *)malloc(300 * sizeof(double)), *sd = (double *)malloc(300 * sizeof(double));
    double lf, ld_, l2, gmax = 0, gerr = 0, wmax = 0, werr = 0, serr = 0;
    xknn_error err;
    make_data(&ds, n, d, 0.3, 7, seed);
    make_data(&q, 300, d, 0.3, 7, seed + 7);
    mf = make_model(&ds, be, XKNN_SOFTKNN_FLOAT);
    md = make_model(&ds, XKNN_BACKEND_CPU, XKNN_SOFTKNN_DOUBLE_REF);
    for (i = 0; i < mb; i++) batch[i] = (i * 7 + 1) % n;
    random_theta(d, th, seed + 2);
    lf = eval(mf, batch, mb, NULL, 0, th, gf);
    ld_ = eval(md, batch, mb, NULL, 0, th, gd);
    for (k = 0; k < np; k++) { /* the weights' group and the four scalars apart */
        double *mx = k < d ? &wmax : &gmax, *er = k < d ? &werr : &gerr;
        if (fabs(gd[k]) > *mx) *mx = fabs(gd[k]);
        if (fabs(gf[k] - gd[k]) > *er) *er = fabs(gf[k] - gd[k]);
    }
    ok(fabs(lf - ld_) <= 1e-6 + 1e-5 * fabs(ld_), "%s: loss %.9g, double reference %.9g", what, lf, ld_);
    ok(gerr <= 1e-4 * gmax && werr <= 1e-3 * wmax,
       "%s: gradient: alpha, beta, a, c within 1e-4 of the largest (%.3g of %.3g), W within 1e-3 of the largest "
       "|dL/dW_b| (%.3g of %.3g)",
       what, gerr, gmax, werr, wmax);
    if (xknn_softknn_score(mf, q.x, 0, q.n, th, sf, &err) != XKNN_SUCCESS) bail("score: %s", err.message);
    if (xknn_softknn_score(md, q.x, 0, q.n, th, sd, &err) != XKNN_SUCCESS) bail("score: %s", err.message);
    for (i = 0; i < q.n; i++) {
        double e = fabs(sf[i] - sd[i]) / (1e-6 + 1e-5 * fabs(sd[i]));
        if (e > serr) serr = e;
    }
    ok(serr <= 1.0, "%s: logits of %lld held-out rows match the reference (worst ratio to tolerance %.3g)", what,
       (long long)q.n, serr);
    l2 = eval(mf, batch, mb, NULL, 0, th, g2);
    ok(memcmp(&l2, &lf, sizeof l2) == 0 && memcmp(g2, gf, (size_t)np * sizeof(double)) == 0,
       "%s: a second evaluation gives the same bits", what);
    xknn_softknn_destroy(md);
    xknn_softknn_destroy(mf);
    free_data(&q);
    free_data(&ds);
    free(sd), free(sf), free(g2), free(gd), free(gf), free(th), free(batch);
}

typedef struct {
    double first, last;
    int epochs;
} curve;

static int on_epoch(void *user, const xknn_softknn_epoch *e, const double *theta)
{
    curve *c = (curve *)user;
    (void)theta;
    if (e->epoch == 1) c->first = e->loss;
    c->last = e->loss;
    c->epochs = e->epoch;
    return 0;
}

/* 3 tests: training lowers the loss, classifies held-out rows, and shrinks the weights
 * of the noise bits below those of the informative ones. */
static void check_training(xknn_backend be, double *theta_out, int64_t np_out)
{
    dataset ds, q;
    xknn_softknn *m;
    xknn_softknn_train_opts o = XKNN_SOFTKNN_TRAIN_INIT;
    const int64_t d = 96, junk = 32;
    int64_t i, b, right = 0;
    double th[96 + 4], sc[400], winfo = 0, wjunk = 0;
    curve c = {0, 0, 0};
    xknn_error err;
    make_data(&ds, 400, d, 0.35, junk, 11);
    make_data(&q, 400, d, 0.35, junk, 11); /* same prototypes (same seed), new rows below */
    {
        uint64_t s = 99;
        for (i = 0; i < q.n; i++) /* fresh noise: flip 10% more bits outside the junk */
            for (b = 0; b < d - junk; b++)
                if (rng_unit(&s) < 0.1) q.x[i * q.ld + b / 64] ^= (uint64_t)1 << (b % 64);
    }
    m = make_model(&ds, be, XKNN_SOFTKNN_FLOAT);
    xknn_softknn_init_params(d, th);
    th[XKNN_SOFTKNN_SLOPE(d)] = 10, th[XKNN_SOFTKNN_OFFSET(d)] = 0.5; /* rows differ in ~40% of bits */
    if (xknn_softknn_calibrate(m, 200, 3, th, &err) != XKNN_SUCCESS) bail("calibrate: %s", err.message);
    o.epochs = 30, o.batch = 40, o.lr = 0.05, o.seed = 5, o.on_epoch = on_epoch, o.user = &c;
    if (xknn_softknn_train(m, &o, th, &err) != XKNN_SUCCESS) bail("train: %s", err.message);
    ok(c.epochs == 30 && c.last < 0.7 * c.first, "training lowers the loss: epoch 1 %.4f, epoch %d %.4f", c.first,
       c.epochs, c.last);
    if (xknn_softknn_score(m, q.x, 0, q.n, th, sc, &err) != XKNN_SUCCESS) bail("score: %s", err.message);
    for (i = 0; i < q.n; i++) right += (sc[i] > 0) == (q.y[i] == 1);
    ok(right >= (int64_t)(0.9 * (double)q.n), "held-out accuracy %lld / %lld >= 90%%", (long long)right,
       (long long)q.n);
    for (b = 0; b < d; b++) {
        if (b < d - junk) winfo += fabs(th[b]) / (double)(d - junk);
        else wjunk += fabs(th[b]) / (double)junk;
    }
    ok(wjunk < 0.8 * winfo, "mean |W| of noise bits %.4f below that of informative bits %.4f", wjunk, winfo);
    if (theta_out) memcpy(theta_out, th, (size_t)np_out * sizeof(double));
    xknn_softknn_destroy(m);
    free_data(&q);
    free_data(&ds);
}

static void check_errors(void)
{
    dataset ds;
    xknn_softknn *m = NULL;
    xknn_softknn_config cfg = XKNN_SOFTKNN_CONFIG_INIT;
    xknn_error err;
    int64_t batch[3] = {1, 2, 1};
    double th[70 + 4];
    xknn_status st;
    make_data(&ds, 20, 70, 0.2, 0, 3);
    ds.y[4] = 2;
    st = xknn_softknn_create(&cfg, ds.x, 0, ds.y, ds.n, ds.d, &m, &err);
    ok(st == XKNN_ERROR_INVALID_ARGUMENT && strstr(err.message, "row 4"), "label 2 refused: %s", err.message);
    ds.y[4] = 1;
    cfg.backend = XKNN_BACKEND_CUDA, cfg.precision = XKNN_SOFTKNN_DOUBLE_REF;
    st = xknn_softknn_create(&cfg, ds.x, 0, ds.y, ds.n, ds.d, &m, &err);
    ok(st == XKNN_ERROR_INVALID_ARGUMENT && m == NULL, "double reference on cuda refused: %s", err.message);
    m = make_model(&ds, XKNN_BACKEND_CPU, XKNN_SOFTKNN_FLOAT);
    xknn_softknn_init_params(70, th);
    st = xknn_softknn_loss_grad(m, batch, 3, NULL, 0, th, NULL, NULL, &err);
    ok(st == XKNN_ERROR_INVALID_ARGUMENT && strstr(err.message, "repeated"), "repeated batch row refused: %s",
       err.message);
    memset(th, 0, sizeof th);
    st = xknn_softknn_loss_grad(m, batch, 2, NULL, 0, th, NULL, NULL, &err);
    ok(st == XKNN_ERROR_INVALID_VALUE, "all-zero weights refused: %s", err.message);
    xknn_softknn_destroy(m);
    free_data(&ds);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "cuda")) {
        if (!xknn_backend_built(XKNN_BACKEND_CUDA) || xknn_cuda_device_count() < 1) skip_all("no CUDA device");
        plan(4 + 4 + 4 + 3);
        check_float("cuda d=70 n=97 m=13", XKNN_BACKEND_CUDA, 97, 70, 13, 21);
        check_float("cuda d=784 n=700 m=64", XKNN_BACKEND_CUDA, 700, 784, 64, 22);
        check_float("cuda d=130 n=1200 m=300", XKNN_BACKEND_CUDA, 1200, 130, 300, 23);
        check_training(XKNN_BACKEND_CUDA, NULL, 0);
        return tap_done();
    }
    plan(4 + 5 + 5 + 4 + 4 + 3);
    check_errors();
    check_fd("reference d=70 m=6", 37, 70, 6, 0, 1);
    check_fd("reference d=64 m=9 refs subset", 41, 64, 9, 1, 2);
    check_float("cpu d=70 n=97 m=13", XKNN_BACKEND_CPU, 97, 70, 13, 21);
    check_float("cpu d=784 n=700 m=64", XKNN_BACKEND_CPU, 700, 784, 64, 22);
    check_training(XKNN_BACKEND_CPU, NULL, 0);
    return tap_done();
}
