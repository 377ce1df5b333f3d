/* SPDX-License-Identifier: MIT */
/* core-t: the public API and the CPU backend against the oracle, byte for byte. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "ref/ref.h"
#include "tap/tap.h"
#include "xknn.h"

typedef struct {
    data_kind kind;
    int64_t n, nq, d, k; /* k <= 0 means n (or n-1 in self-join) */
    int self;            /* self-join via query == NULL */
    int metric;
    int64_t qblock, rblock; /* 0 = automatic */
} tcase;

static const tcase cases[] = {
    {DATA_UNIFORM, 1000, 97, 3, 7, 0, XKNN_METRIC_L2, 0, 0},
    {DATA_UNIFORM, 1000, 97, 3, 7, 0, XKNN_METRIC_L2, 13, 129},
    {DATA_GAUSSIAN, 777, 61, 127, 100, 0, XKNN_METRIC_L2, 0, 0},
    {DATA_GAUSSIAN, 777, 61, 127, 100, 0, XKNN_METRIC_EUCLIDEAN, 7, 100},
    {DATA_INTEGER, 513, 70, 1, 1, 0, XKNN_METRIC_L2, 0, 0},
    {DATA_INTEGER, 513, 70, 1, 7, 0, XKNN_METRIC_L2, 3, 31},
    {DATA_INTEGER, 300, 40, 3, 0, 0, XKNN_METRIC_L2, 0, 0},           /* k = n */
    {DATA_INTEGER, 600, 33, 127, 100, 0, XKNN_METRIC_EUCLIDEAN, 0, 0},
    {DATA_DUPLICATES, 400, 50, 3, 100, 0, XKNN_METRIC_L2, 0, 0},
    {DATA_DUPLICATES, 400, 50, 127, 7, 0, XKNN_METRIC_L2, 5, 17},
    {DATA_DUPLICATES, 400, 50, 3, 0, 1, XKNN_METRIC_L2, 0, 0},        /* self, k = n-1 */
    {DATA_CLUSTERED, 500, 45, 784, 100, 0, XKNN_METRIC_L2, 0, 0},
    {DATA_CLUSTERED, 500, 45, 784, 7, 0, XKNN_METRIC_EUCLIDEAN, 0, 64},
    {DATA_UNIFORM, 350, 0, 784, 1, 1, XKNN_METRIC_L2, 0, 0},          /* self-join */
    {DATA_INTEGER, 350, 0, 127, 100, 1, XKNN_METRIC_L2, 16, 40},      /* self-join, ties */
    {DATA_GAUSSIAN, 1, 3, 5, 1, 0, XKNN_METRIC_L2, 0, 0},             /* n = 1 */
    {DATA_UNIFORM, 2, 5, 1, 0, 1, XKNN_METRIC_L2, 0, 0},              /* self-join n = 2 */
    {DATA_INTEGER, 5000, 37, 784, 100, 0, XKNN_METRIC_L2, 0, 0},      /* several default blocks */
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

static int run_case(const tcase *c, xknn_cpu_path path)
{
    const xknn_metric metric = (xknn_metric)c->metric;
    knn_bufs b;
    xknn_error err;
    xknn_status st;
    int res;

    knn_bufs_alloc(&b, c->n, c->nq, c->d, c->k, c->self);
    ref_make_data(c->kind, b.ref, c->n, c->d, 1);
    if (b.qry) ref_make_data(c->kind, b.qry, b.nq, c->d, 2);
    ref_knn(c->metric == XKNN_METRIC_EUCLIDEAN ? REF_EUCLIDEAN : REF_L2, b.ref, c->n, c->d, b.qry, b.nq, c->d, c->d,
            b.k, c->self, 0, 0, b.wid, b.wd);
    st = knn_bufs_cpu_search(&b, metric, path, c->qblock, c->rblock, &err);
    if (st != XKNN_SUCCESS) {
        res = ok(0, "%s n=%lld nq=%lld d=%lld k=%lld %s%s path=%s: %s", ref_data_name(c->kind), (long long)c->n,
                 (long long)b.nq, (long long)c->d, (long long)b.k, xknn_metric_name(metric), c->self ? " self" : "",
                 path == XKNN_CPU_PATH_BLAS ? "blas" : "loop", err.message);
    } else {
        res = is_knn_equal(b.ids, b.dist, b.wid, b.wd, b.nq, b.k,
                           "%s n=%lld nq=%lld d=%lld k=%lld %s%s blocks=%lldx%lld path=%s", ref_data_name(c->kind),
                           (long long)c->n, (long long)b.nq, (long long)c->d, (long long)b.k, xknn_metric_name(metric),
                           c->self ? " self" : "", (long long)c->qblock, (long long)c->rblock,
                           path == XKNN_CPU_PATH_BLAS ? "blas" : "loop");
    }
    knn_bufs_free(&b);
    return res;
}

/* Expect an error status whose message contains `needle`. */
static void expect_error(xknn_status got, xknn_status want, const xknn_error *err, const char *needle,
                         const char *what)
{
    ok(got == want && strstr(err->message, needle) != NULL, "error: %s -> %s: \"%s\"", what,
       xknn_status_string(want), err->message);
}

static void error_cases(void)
{
    float x[4 * 3] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    float y[2 * 2] = {0, 1, 2, 3};
    int64_t ids[16];
    float dist[16];
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix r = XKNN_MATRIX_F32(x, 4, 3), q = XKNN_MATRIX_F32(x, 2, 3), bad;
    xknn_error err;
    xknn_status st;

    p.backend = XKNN_BACKEND_CPU;
    st = xknn_search(&p, &r, &q, 0, ids, dist, &err);
    expect_error(st, XKNN_ERROR_INVALID_ARGUMENT, &err, "k=0", "k = 0");
    st = xknn_search(&p, &r, &q, 5, ids, dist, &err);
    expect_error(st, XKNN_ERROR_INVALID_ARGUMENT, &err, "larger than the number of references n=4", "k > n");
    st = xknn_search(&p, &r, NULL, 4, ids, dist, &err);
    expect_error(st, XKNN_ERROR_INVALID_ARGUMENT, &err, "larger than n-1=3", "self-join k > n-1");
    bad = r;
    bad.rows = 0;
    st = xknn_search(&p, &bad, &q, 1, ids, dist, &err);
    expect_error(st, XKNN_ERROR_INVALID_ARGUMENT, &err, "0 rows", "n = 0");
    bad = r;
    bad.cols = 0;
    st = xknn_search(&p, &bad, NULL, 1, ids, dist, &err);
    expect_error(st, XKNN_ERROR_INVALID_ARGUMENT, &err, "d=0", "d = 0");
    bad = r;
    bad.data = NULL;
    st = xknn_search(&p, &bad, &q, 1, ids, dist, &err);
    expect_error(st, XKNN_ERROR_INVALID_ARGUMENT, &err, "reference data is NULL", "NULL reference data");
    st = xknn_search(&p, NULL, &q, 1, ids, dist, &err);
    expect_error(st, XKNN_ERROR_INVALID_ARGUMENT, &err, "reference matrix is NULL", "NULL reference");
    st = xknn_search(&p, &r, &q, 1, NULL, dist, &err);
    expect_error(st, XKNN_ERROR_INVALID_ARGUMENT, &err, "ids is NULL", "NULL ids");
    bad = q;
    bad.data = y;
    bad.cols = 2;
    st = xknn_search(&p, &r, &bad, 1, ids, dist, &err);
    expect_error(st, XKNN_ERROR_INVALID_ARGUMENT, &err, "reference has d=3, query has d=2", "dimension mismatch");
    bad = r;
    bad.ld = 2;
    st = xknn_search(&p, &bad, &q, 1, ids, dist, &err);
    expect_error(st, XKNN_ERROR_INVALID_ARGUMENT, &err, "leading dimension 2", "ld < d");
    x[7] = NAN;
    st = xknn_search(&p, &r, &q, 1, ids, dist, &err);
    expect_error(st, XKNN_ERROR_INVALID_VALUE, &err, "reference row 2 column 1 is NaN", "NaN in reference");
    x[7] = 7.0f;
    x[5] = INFINITY;
    q.data = x + 3;
    st = xknn_search(&p, &r, &q, 1, ids, dist, &err);
    expect_error(st, XKNN_ERROR_INVALID_VALUE, &err, "row 1 column 2 is Inf", "Inf in reference");
    x[5] = 5.0f;
    y[3] = -INFINITY;
    {
        xknn_matrix r2 = XKNN_MATRIX_F32(x, 4, 2), q2 = XKNN_MATRIX_F32(y, 2, 2);
        r2.ld = 3;
        st = xknn_search(&p, &r2, &q2, 1, ids, dist, &err);
        expect_error(st, XKNN_ERROR_INVALID_VALUE, &err, "query row 1 column 1 is Inf", "Inf in query");
    }
    p.metric = (xknn_metric)99;
    st = xknn_search(&p, &r, &q, 1, ids, dist, &err);
    expect_error(st, XKNN_ERROR_INVALID_ARGUMENT, &err, "unknown metric 99", "unknown metric");
    p.metric = XKNN_METRIC_L2;
    p.backend = XKNN_BACKEND_CUDA;
    st = xknn_search(&p, &r, &q, 1, ids, dist, &err);
    ok((st == XKNN_ERROR_NOT_BUILT && strstr(err.message, "without CUDA")) ||
           (st == XKNN_ERROR_NO_DEVICE && strstr(err.message, "no CUDA device")) || st == XKNN_SUCCESS,
       "backend cuda without a device: %s \"%s\"", xknn_status_string(st), err.message);
    p.backend = XKNN_BACKEND_CPU;
    /* pad_missing: fewer references than k */
    p.pad_missing = 1;
    st = xknn_search(&p, &r, &q, 6, ids, dist, &err);
    ok(st == XKNN_SUCCESS && ids[3] >= 0 && ids[4] == -1 && ids[5] == -1 && isinf(dist[5]),
       "pad_missing pads with id -1 and +inf");
    p.pad_missing = 0;
    /* ids with offsets and the exclude-self flag with a separate query matrix */
    p.ref_id_offset = 100;
    p.query_id_offset = 101;
    p.exclude_self = 1;
    q.data = x;
    st = xknn_search(&p, &r, &q, 3, ids, dist, &err);
    ok(st == XKNN_SUCCESS && ids[0] == 100 && ids[1] == 102 && ids[3] == 101 && ids[4] == 100 &&
           dist[4] == 27.0f,
       "global id offsets and exclude_self (query 1 = ref 1 skipped)");
}

static void misc(void)
{
    float a[3] = {1, 2, 3}, b[3] = {2, 4, 6};
    is_string(xknn_status_string(XKNN_SUCCESS), "success", "status string of success");
    is_string(xknn_status_string(XKNN_STATUS_COUNT), "unknown status", "status string out of range");
    is_int(xknn_metric_from_name("euclidean"), XKNN_METRIC_EUCLIDEAN, "metric by name");
    is_int(xknn_metric_from_name("cosine?"), XKNN_METRIC_COUNT, "unknown metric name");
    ok(xknn_distance(XKNN_METRIC_L2, a, b, 3) == 14.0f, "xknn_distance l2");
    ok(xknn_distance(XKNN_METRIC_EUCLIDEAN, a, b, 3) == (float)sqrt(14.0), "xknn_distance euclidean");
}

int main(void)
{
    int i;
    plan(2 * NCASES + 17 + 6);
    for (i = 0; i < NCASES; i++) {
        run_case(&cases[i], XKNN_CPU_PATH_LOOP);
        if (xknn_backend_built(XKNN_BACKEND_CPU)) {
#ifdef XKNN_TEST_HAVE_CBLAS
            run_case(&cases[i], XKNN_CPU_PATH_BLAS);
#else
            skip(1, "built without CBLAS");
#endif
        }
    }
    error_cases();
    misc();
    return tap_done();
}
