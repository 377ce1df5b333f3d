/* SPDX-License-Identifier: MIT */
/* knn_softknn: trains the soft-kNN classifier of xknn/softknn.h on binarized
 * Fashion-MNIST (or MNIST), one class against the rest, and saves the learned weights
 * in the --weights format of knn_mpi (an .fbin of one row of d floats). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmd.h"
#include "outputs.h"
#include "xknn.h"
#include "xknn/io.h"
#include "xknn/softknn.h"

static void sk_usage(FILE *f)
{
    fprintf(f,
            "Usage: knn_softknn [options] DIR\n"
            "\n"
            "Soft-kNN with a learned weighted Hamming distance on binarized images: class C\n"
            "against the rest. DIR holds the MNIST-layout IDX files train-images-idx3-ubyte,\n"
            "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (each may\n"
            "end in .gz), e.g. Fashion-MNIST. Pixel t of an image becomes bit t: 1 when > T\n"
            "(the same bits as knn_mpi --binarize T). Each mini-batch of training images is\n"
            "scored against the rest of the training set; Adam. After each epoch: mean batch\n"
            "loss, training seconds, accuracy and balanced accuracy on the test set.\n"
            "\n"
            "Options:\n"
            "  --binarize T      threshold (default 127)\n"
            "  --class C         positive class (default 0: T-shirt/top in Fashion-MNIST)\n"
            "  --epochs E        (default 2)\n"
            "  --batch B         images per mini-batch (default 500)\n"
            "  --refs R          score each batch against R random images of the rest instead\n"
            "                    of all of them (default 0: all)\n"
            "  --lr X            Adam learning rate (default 0.01)\n"
            "  --seed S          order of the images and reference subsets (default 1)\n"
            "  --limit N         use the first N training images only (default: all)\n"
            "  --slope A         starting slope a of F (default 100)\n"
            "  --offset C        starting offset c of F (default 0.9)\n"
            "  --calibrate M     starting alpha, beta from M training images (default 2000,\n"
            "                    see xknn_softknn_calibrate)\n"
            "  --near EPS        a weight is near zero when |W_b| <= EPS * max |W| (default 0.01)\n"
            "  --backend NAME    auto (default), cpu or cuda\n"
            "  --threads N       CPU threads (default: OpenMP default)\n"
            "  -o FILE           save W as an .fbin (1 x 784 float32) for knn_mpi --weights\n"
            "  -h, --help        this text\n");
}

typedef struct {
    int64_t n, nt, d, ld;
    uint64_t *x, *xt;   /* training and test bits */
    uint8_t *y, *yt;    /* 0/1: class C or not    */
    double t0, train_s, total_s;
    double near_eps;
    xknn_softknn *model;
    double *scores;
    int failed;
} sk_run;

static double sk_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Reads an IDX file of DIR (NAME or NAME.gz) as uint8 rows; *rows, *cols out. */
static uint8_t *sk_read(const char *dir, const char *name, int64_t *rows, int64_t *cols, xknn_error *err)
{
    char path[4096];
    xknn_file_info info;
    uint8_t *out;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (access(path, R_OK) != 0) snprintf(path, sizeof path, "%s/%s.gz", dir, name);
    if (xknn_file_probe(path, NULL, &info, err) != XKNN_SUCCESS) return NULL;
    if (xknn_file_native_dtype(&info) != XKNN_DTYPE_U8) {
        snprintf(err->message, sizeof err->message, "%.400s: holds %s values, need uint8 (IDX ubyte)", path,
                 xknn_elem_name(info.elem));
        return NULL;
    }
    out = (uint8_t *)malloc((size_t)(info.rows * info.cols));
    if (!out) {
        snprintf(err->message, sizeof err->message, "%.400s: out of memory", path);
        return NULL;
    }
    if (xknn_file_read_rows_as(path, &info, 0, info.rows, XKNN_DTYPE_U8, out, err) != XKNN_SUCCESS) {
        free(out);
        return NULL;
    }
    *rows = info.rows, *cols = info.cols;
    return out;
}

/* Pixels -> bits (pixel > t), and labels -> 1 for class c. */
static uint64_t *sk_binarize(const uint8_t *img, int64_t n, int64_t d, int t, const uint8_t *lab, int c, uint8_t *y)
{
    int64_t ld = (d + 63) / 64, i, b;
    uint64_t *x = (uint64_t *)calloc((size_t)(n * ld), sizeof(uint64_t));
    if (!x) return NULL;
    for (i = 0; i < n; i++) {
        for (b = 0; b < d; b++)
            if (img[i * d + b] > t) x[i * ld + b / 64] |= (uint64_t)1 << (b % 64);
        y[i] = lab[i] == c;
    }
    return x;
}

/* Test accuracy, balanced accuracy; 0 on failure. */
static int sk_test(sk_run *r, const double *theta, double *acc, double *bacc)
{
    xknn_error err;
    int64_t i, tp = 0, tn = 0, pos = 0;
    if (xknn_softknn_score(r->model, r->xt, 0, r->nt, theta, r->scores, &err) != XKNN_SUCCESS) {
        fprintf(stderr, "knn_softknn: %s\n", err.message);
        return 0;
    }
    for (i = 0; i < r->nt; i++) {
        int pred = r->scores[i] > 0;
        pos += r->yt[i];
        tp += pred && r->yt[i];
        tn += !pred && !r->yt[i];
    }
    *acc = (double)(tp + tn) / (double)r->nt;
    *bacc = 0.5 * ((pos ? (double)tp / (double)pos : 0) + (r->nt > pos ? (double)tn / (double)(r->nt - pos) : 0));
    return 1;
}

static int sk_on_epoch(void *user, const xknn_softknn_epoch *e, const double *theta)
{
    sk_run *r = (sk_run *)user;
    double sec = sk_now() - r->t0, acc, bacc, t1, wmax = 0;
    int64_t b, near = 0;
    r->train_s += sec;
    t1 = sk_now();
    if (!sk_test(r, theta, &acc, &bacc)) {
        r->failed = 1;
        return 1;
    }
    for (b = 0; b < r->d; b++) wmax = fabs(theta[b]) > wmax ? fabs(theta[b]) : wmax;
    for (b = 0; b < r->d; b++) near += fabs(theta[b]) <= r->near_eps * wmax;
    printf("%5d %9.5f %9.1f %9.2f %8.4f %8.4f %9.4f %9.4f %8.3f %8.3f %7.4f\n", e->epoch, e->loss, sec,
           sk_now() - t1, acc, bacc, theta[r->d], theta[r->d + 1], theta[r->d + 2], theta[r->d + 3],
           (double)near / (double)r->d);
    fflush(stdout);
    r->t0 = sk_now();
    return 0;
}

/* W as an .fbin (uint32 n = 1, uint32 d, d float32, little-endian) through the run's
 * output (tools/outputs.h: a temporary renamed when complete). */
static int sk_save(knn_outs *outs, const double *w, int64_t d)
{
    unsigned char *buf = (unsigned char *)malloc((size_t)(8 + 4 * d));
    xknn_error err;
    xknn_status st;
    uint32_t n = 1, dd = (uint32_t)d;
    int64_t b;
    int k;
    if (!buf) {
        fprintf(stderr, "knn_softknn: out of memory\n");
        return 0;
    }
    for (b = 0; b < 4; b++) buf[b] = (unsigned char)(n >> (8 * b)), buf[4 + b] = (unsigned char)(dd >> (8 * b));
    for (b = 0; b < d; b++) {
        float v = (float)w[b];
        uint32_t u;
        memcpy(&u, &v, 4);
        for (k = 0; k < 4; k++) buf[8 + 4 * b + k] = (unsigned char)(u >> (8 * k));
    }
    st = knn_outs_write(outs, 0, 0, buf, 8 + 4 * d, "W", &err);
    free(buf);
    if (knn_outs_commit(outs, st, NULL, &err) != XKNN_SUCCESS) {
        fprintf(stderr, "knn_softknn: %s\n", err.message);
        return 0;
    }
    return 1;
}

/* The run's output -o, checked against the four input files and created before the
 * work; 0 with a message on failure (*code: the exit status). */
static int sk_open_output(knn_outs *outs, const char *dir, const char *out, int *code)
{
    static const char *const names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    const char *in_opt[8], *in_path[8];
    char paths[8][4096], msg[512];
    xknn_error err;
    int i;
    for (i = 0; i < 8; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/%s%s", dir, names[i / 2], i % 2 ? ".gz" : "");
        in_opt[i] = "DIR's";
        in_path[i] = paths[i];
    }
    knn_outs_add(outs, "-o", out, 0);
    if (knn_outs_collision(outs, in_opt, in_path, 8, msg, sizeof msg)) {
        fprintf(stderr, "knn_softknn: %s\n", msg);
        *code = EXIT_USAGE;
        return 0;
    }
    if (knn_outs_open(outs, &err) != XKNN_SUCCESS) {
        fprintf(stderr, "knn_softknn: %s\n", err.message);
        *code = outs->no_space ? EXIT_RESOURCE : EXIT_INPUT;
        return 0;
    }
    return 1;
}

static int sk_int_arg(const char *opt, const char *v, long long lo, long long *out)
{
    char *end;
    long long x;
    errno = 0;
    x = strtoll(v, &end, 10);
    if (errno || *end || end == v || x < lo) {
        fprintf(stderr, "knn_softknn: %s: '%s' is not an integer >= %lld\n", opt, v, lo);
        return 0;
    }
    *out = x;
    return 1;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *out = NULL;
    long long thr = 127, cls = 0, epochs = 2, batch = 500, refs = 0, seed = 1, limit = 0, threads = 0;
    double lr = 0.01, near = 0.01, slope = 100, offset = 0.9;
    long long calib = 2000;
    xknn_backend backend = XKNN_BACKEND_AUTO;
    sk_run r;
    xknn_error err;
    xknn_softknn_config cfg = XKNN_SOFTKNN_CONFIG_INIT;
    xknn_softknn_train_opts o = XKNN_SOFTKNN_TRAIN_INIT;
    uint8_t *img = NULL, *lab = NULL, *imgt = NULL, *labt = NULL;
    int64_t rows, cols, lrows, lcols, i, pos = 0;
    double *theta = NULL, acc, bacc;
    int rc = 1;
    knn_outs outs;
    memset(&r, 0, sizeof r);
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int okv = 1;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            sk_usage(stdout);
            return 0;
        }
        if (a[0] != '-') {
            if (dir) {
                fprintf(stderr, "knn_softknn: one DIR expected, got '%s' and '%s'\n", dir, a);
                return 2;
            }
            dir = a;
            continue;
        }
        if (!v) {
            fprintf(stderr, "knn_softknn: %s needs a value (knn_softknn --help)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--binarize")) okv = sk_int_arg(a, v, 0, &thr) && thr <= 255;
        else if (!strcmp(a, "--class")) okv = sk_int_arg(a, v, 0, &cls);
        else if (!strcmp(a, "--epochs")) okv = sk_int_arg(a, v, 1, &epochs);
        else if (!strcmp(a, "--batch")) okv = sk_int_arg(a, v, 1, &batch);
        else if (!strcmp(a, "--refs")) okv = sk_int_arg(a, v, 0, &refs);
        else if (!strcmp(a, "--seed")) okv = sk_int_arg(a, v, 0, &seed);
        else if (!strcmp(a, "--limit")) okv = sk_int_arg(a, v, 2, &limit);
        else if (!strcmp(a, "--threads")) okv = sk_int_arg(a, v, 0, &threads);
        else if (!strcmp(a, "--lr")) okv = (lr = atof(v)) > 0;
        else if (!strcmp(a, "--slope")) okv = (slope = atof(v)) != 0;
        else if (!strcmp(a, "--offset")) okv = isfinite(offset = atof(v));
        else if (!strcmp(a, "--calibrate")) okv = sk_int_arg(a, v, 2, &calib);
        else if (!strcmp(a, "--near")) okv = (near = atof(v)) >= 0;
        else if (!strcmp(a, "-o")) out = v;
        else if (!strcmp(a, "--backend")) {
            okv = knn__parse_backend(v, &backend) == 0;
        } else {
            fprintf(stderr, "knn_softknn: unknown option %s (knn_softknn --help)\n", a);
            return 2;
        }
        if (!okv) {
            fprintf(stderr, "knn_softknn: bad value '%s' for %s (knn_softknn --help)\n", v, a);
            return 2;
        }
    }
    if (!dir) {
        sk_usage(stderr);
        return 2;
    }
    err.message[0] = '\0';
    knn_outs_init(&outs);
    knn_outs_catch_signals();
    if (out && !sk_open_output(&outs, dir, out, &rc)) goto done;
    if (!(img = sk_read(dir, "train-images-idx3-ubyte", &rows, &cols, &err)) ||
        !(lab = sk_read(dir, "train-labels-idx1-ubyte", &lrows, &lcols, &err)) || lrows != rows || lcols != 1) {
        fprintf(stderr, "knn_softknn: %s\n", err.message[0] ? err.message : "training labels do not match the images");
        goto done;
    }
    r.d = cols, r.ld = (cols + 63) / 64;
    r.n = limit && limit < rows ? limit : rows;
    r.y = (uint8_t *)malloc((size_t)r.n);
    if (!r.y || !(r.x = sk_binarize(img, r.n, cols, (int)thr, lab, (int)cls, r.y))) goto oom;
    free(img), free(lab);
    img = lab = NULL;
    if (!(imgt = sk_read(dir, "t10k-images-idx3-ubyte", &rows, &lcols, &err)) || lcols != cols ||
        !(labt = sk_read(dir, "t10k-labels-idx1-ubyte", &lrows, &lcols, &err)) || lrows != rows || lcols != 1) {
        fprintf(stderr, "knn_softknn: %s\n", err.message[0] ? err.message : "test files do not match the training files");
        goto done;
    }
    r.nt = rows;
    r.yt = (uint8_t *)malloc((size_t)r.nt);
    r.scores = (double *)malloc((size_t)r.nt * sizeof(double));
    theta = (double *)malloc((size_t)XKNN_SOFTKNN_NPARAMS(r.d) * sizeof(double));
    if (!r.yt || !r.scores || !theta || !(r.xt = sk_binarize(imgt, r.nt, cols, (int)thr, labt, (int)cls, r.yt)))
        goto oom;
    free(imgt), free(labt);
    imgt = labt = NULL;

    cfg.backend = backend;
    cfg.num_threads = (int)threads;
    if (xknn_softknn_create(&cfg, r.x, 0, r.y, r.n, r.d, &r.model, &err) != XKNN_SUCCESS) {
        fprintf(stderr, "knn_softknn: %s\n", err.message);
        goto done;
    }
    for (i = 0; i < r.nt; i++) pos += r.yt[i];
    printf("# knn_softknn %s: class %lld vs rest, %lld training / %lld test images of %lld bits (pixel > %lld)\n",
           XKNN_VERSION_STRING, cls, (long long)r.n, (long long)r.nt, (long long)r.d, thr);
    printf("# backend %s, epochs %lld, batch %lld, refs %s%lld, lr %g, seed %lld\n",
           xknn_backend_name(xknn_softknn_backend(r.model)), epochs, batch, refs ? "" : "all the rest = ",
           refs ? refs : (long long)(r.n - batch), lr, seed);
    printf("# trivial classifier (always 'rest'): test accuracy %.4f, balanced accuracy 0.5000\n",
           (double)(r.nt - pos) / (double)r.nt);
    printf("# near zero: |W_b| <= %g * max |W|\n", near);
    printf("%5s %9s %9s %9s %8s %8s %9s %9s %8s %8s %7s\n", "epoch", "loss", "train_s", "test_s", "acc", "bal_acc",
           "alpha", "beta", "a", "c", "near0");
    xknn_softknn_init_params(r.d, theta);
    theta[XKNN_SOFTKNN_SLOPE(r.d)] = slope;
    theta[XKNN_SOFTKNN_OFFSET(r.d)] = offset;
    if (calib > r.n / 4) calib = r.n / 4 < 2 ? 2 : r.n / 4; /* the drawn rows are scored against the others */
    if (xknn_softknn_calibrate(r.model, calib, (uint64_t)seed, theta, &err) != XKNN_SUCCESS) {
        fprintf(stderr, "knn_softknn: %s\n", err.message);
        goto done;
    }
    r.near_eps = near;
    if (sk_test(&r, theta, &acc, &bacc))
        printf("%5d %9s %9s %9s %8.4f %8.4f\n", 0, "-", "-", "-", acc, bacc);
    o.epochs = (int)epochs, o.batch = batch, o.refs = refs, o.lr = lr, o.seed = (uint64_t)seed;
    o.on_epoch = sk_on_epoch, o.user = &r;
    if (o.batch > r.n - 1) o.batch = r.n - 1;
    r.t0 = sk_now();
    if (xknn_softknn_train(r.model, &o, theta, &err) != XKNN_SUCCESS) {
        fprintf(stderr, "knn_softknn: %s\n", err.message);
        goto done;
    }
    if (r.failed) goto done;
    printf("# training time %.1f s (%.1f s per epoch)\n", r.train_s, r.train_s / (double)epochs);
    if (out) {
        if (!sk_save(&outs, theta, r.d)) goto done;
        printf("# weights: %s (for knn_mpi -m whamming --weights %s --binarize %lld)\n", out, out, thr);
    }
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "knn_softknn: out of memory\n");
done:
    knn_outs_discard(&outs);
    xknn_softknn_destroy(r.model);
    free(theta), free(r.scores), free(r.yt), free(r.xt), free(r.y), free(r.x);
    free(labt), free(imgt), free(lab), free(img);
    return rc;
}
