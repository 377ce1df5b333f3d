/* SPDX-License-Identifier: MIT */
/* selfjoin-t: the symmetric self-join (each distance once for both points) against the
 * plain self-join and the oracle, byte for byte, for every metric and dtype, on
 * tie-heavy data, n not a multiple of the tile edge, k = 1 and k = n - 1; the tile
 * primitive xknn_search_pair over an uneven partition; which paths stay plain. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "ref/ref.h"
#include "tap/tap.h"
#include "xknn.h"

static const mcase metrics[] = {
    {XKNN_METRIC_L2, 0},        {XKNN_METRIC_EUCLIDEAN, 0}, {XKNN_METRIC_L1, 0},          {XKNN_METRIC_MINKOWSKI, 3},
    {XKNN_METRIC_MINKOWSKI, 2.5}, {XKNN_METRIC_CHEBYSHEV, 0}, {XKNN_METRIC_IP, 0},        {XKNN_METRIC_COSINE, 0},
    {XKNN_METRIC_HELLINGER, 0}, {XKNN_METRIC_HAMMING, 0},   {XKNN_METRIC_WHAMMING, 0},
};
#define NMETRICS (int)(sizeof metrics / sizeof metrics[0])


typedef struct {
    data_kind kind;
    int64_t n, d, k; /* k <= 0: n - 1 */
    int64_t tile;    /* params.query_block: the symmetric tile edge (0: automatic) */
} shape;

static const shape shapes[] = {
    {DATA_INTEGER, 67, 5, 1, 8},      /* ties everywhere, 9 tiles per side, k = 1     */
    {DATA_DUPLICATES, 67, 19, 0, 8},  /* duplicates, k = n - 1                          */
    {DATA_CLUSTERED, 150, 33, 5, 0},  /* automatic tile                                 */
    {DATA_INTEGER, 150, 70, 7, 16},   /* 150 = 9 * 16 + 6                               */
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

static float *make_weights(int64_t d, uint64_t seed)
{
    float *w = (float *)malloc((size_t)d * sizeof(float));
    int64_t b;
    for (b = 0; b < d; b++) w[b] = (float)((int)(ref_rand_unit(&seed) * 4.0) - 2) * 0.5f; /* ties, negatives */
    return w;
}

/* The oracle's self-join of x (n x d of dt; made nonnegative first for hellinger) with
 * mc's metric (exponent 2 where mc has none) and weights w: k per row into wi, wd. */
static void oracle_self(const mcase *mc, xknn_dtype dt, void *x, int64_t n, int64_t d, int64_t k, const float *w,
                        int64_t *wi, float *wd)
{
    ref_spec rs;
    if (mc->metric == XKNN_METRIC_HELLINGER) ref_make_nonnegative((int)dt, x, n * ref_row_elems((int)dt, d));
    rs.metric = (int)mc->metric;
    rs.dtype = (int)dt;
    rs.p = mc->p > 0 ? mc->p : 2.0;
    rs.weights = w;
    ref_knn_ex(&rs, x, n, ref_row_elems((int)dt, d), NULL, n, 0, d, k, 1, 0, 0, wi, wd);
}

/* One self-join: symmetric (auto) and plain against the oracle: 2 tests. */
static void check(const mcase *mc, xknn_dtype dt, const shape *sh, xknn_cpu_path path, const char *what)
{
    const int64_t n = sh->n, d = sh->d, k = sh->k > 0 ? sh->k : n - 1;
    void *x = ref_make_typed(sh->kind, (int)dt, n, d, 1000 + (uint64_t)sh->n * 7 + (uint64_t)mc->metric);
    float *w = mc->metric == XKNN_METRIC_WHAMMING ? make_weights(d, 77) : NULL;
    int64_t *wi = i64_alloc(n, k), *si = i64_alloc(n, k), *pi = i64_alloc(n, k);
    float *wd = f32_alloc(n, k), *sd = f32_alloc(n, k), *pd = f32_alloc(n, k);
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix m = XKNN_MATRIX_TYPED(x, n, d, dt);
    xknn_error e1, e2;
    xknn_status s1, s2;
    oracle_self(mc, dt, x, n, d, k, w, wi, wd);
    p.backend = XKNN_BACKEND_CPU;
    params_metric(&p, mc->metric, mc->p, w, d);
    p.cpu_path = path;
    p.query_block = sh->tile;
    s1 = xknn_search(&p, &m, NULL, k, si, sd, &e1);
    p.self_join = XKNN_SELF_JOIN_PLAIN;
    p.query_block = 0;
    s2 = xknn_search(&p, &m, NULL, k, pi, pd, &e2);
    if (s1 != XKNN_SUCCESS) diag("symmetric: %s", e1.message);
    if (s2 != XKNN_SUCCESS) diag("plain: %s", e2.message);
    is_knn_equal(si, sd, wi, wd, n, k, "%s %s %s n=%lld d=%lld k=%lld tile=%lld%s: symmetric == oracle",
                 xknn_metric_name(mc->metric), xknn_dtype_name(dt), ref_data_name(sh->kind), (long long)n,
                 (long long)d, (long long)k, (long long)sh->tile, what);
    is_knn_equal(pi, pd, wi, wd, n, k, "%s %s %s n=%lld k=%lld%s: plain == oracle", xknn_metric_name(mc->metric),
                 xknn_dtype_name(dt), ref_data_name(sh->kind), (long long)n, (long long)k, what);
    FREE_ALL(pd, sd, wd, pi, si, wi, w, x);
}

/* xknn_search_pair over blocks [0, 20), [20, 21), [21, 57) of 57 rows: all pairs i <= j
 * in an arbitrary order, lists starting as padding: equal to the oracle (1 test).
 * bounded: the padding's last entry carries each row's true k-th distance as the bound
 * (ties at it must be kept; duplicates make many). */
static void check_pair(const mcase *mc, xknn_dtype dt, int64_t k, int bounded, int checked)
{
    const int64_t n = 57, d = 9, cut[4] = {0, 20, 21, 57};
    const size_t eb = (size_t)ref_elem_bytes((int)dt), row = (size_t)ref_row_elems((int)dt, d) * eb;
    unsigned char *x = (unsigned char *)ref_make_typed(DATA_DUPLICATES, (int)dt, n, d, 4242);
    int64_t *wi = i64_alloc(n, k), *ids = i64_alloc(n, k);
    float *wd = f32_alloc(n, k), *dist = f32_alloc(n, k);
    const int neg = mc->metric == XKNN_METRIC_IP;
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_error e;
    int i, j, bad = 0;
    int64_t t;
    oracle_self(mc, dt, x, n, d, k, NULL, wi, wd);
    for (t = 0; t < n * k; t++) {
        ids[t] = -1;
        dist[t] = neg ? -INFINITY : INFINITY;
    }
    if (bounded)
        for (t = 0; t < n; t++) dist[t * k + k - 1] = wd[t * k + k - 1];
    p.backend = XKNN_BACKEND_CPU;
    p.metric = mc->metric;
    p.p = mc->p;
    p.query_block = 4;
    p.values_checked = checked;
    for (j = 2; j >= 0; j--)
        for (i = 0; i <= j; i++) {
            xknn_matrix a = XKNN_MATRIX_TYPED(x + (size_t)cut[i] * row, cut[i + 1] - cut[i], d, dt);
            xknn_matrix b = XKNN_MATRIX_TYPED(x + (size_t)cut[j] * row, cut[j + 1] - cut[j], d, dt);
            if (xknn_search_pair(&p, &a, cut[i], i == j ? NULL : &b, cut[j], k, ids + cut[i] * k,
                                 dist + cut[i] * k, ids + cut[j] * k, dist + cut[j] * k, &e) != XKNN_SUCCESS) {
                diag("xknn_search_pair: %s", e.message);
                bad = 1;
            }
        }
    if (bad) memset(ids, 0, (size_t)(n * k) * sizeof(int64_t));
    is_knn_equal(ids, dist, wi, wd, n, k, "xknn_search_pair %s %s k=%lld over blocks 20+1+36%s%s == oracle",
                 xknn_metric_name(mc->metric), xknn_dtype_name(dt), (long long)k,
                 bounded ? ", bounds at the k-th distances" : "", checked ? ", values_checked" : "");
    FREE_ALL(dist, wd, ids, wi, x);
}

int main(void)
{
    int mi, di, si;
    const shape big[] = {
        {DATA_GAUSSIAN, 3001, 16, 16, 0}, /* two automatic BLAS tiles: off-diagonal seeding */
        {DATA_INTEGER, 2100, 3, 10, 0},   /* massive ties: crowded candidate buffers        */
    };
    const mcase l2 = {XKNN_METRIC_L2, 0}, eu = {XKNN_METRIC_EUCLIDEAN, 0};
    /* every real metric x dtype x shape, the bit metrics x shape (2 tests each), the
     * loop kernel for f32 l2/euclidean, two larger BLAS cases, pairs (two with bounds,
     * one of them values_checked), the skipped scan, path choice */
    plan((9 * NDT * NSHAPES + 2 * NSHAPES) * 2 + 2 * NSHAPES * 2 + 2 * 2 + 7 + 4 + 12);

    for (mi = 0; mi < NMETRICS; mi++) {
        const int bin = metrics[mi].metric == XKNN_METRIC_HAMMING || metrics[mi].metric == XKNN_METRIC_WHAMMING;
        for (di = 0; di < (bin ? 1 : NDT); di++)
            for (si = 0; si < NSHAPES; si++) check(&metrics[mi], bin ? XKNN_DTYPE_BIN : real_dtypes[di], &shapes[si], XKNN_CPU_PATH_AUTO, "");
    }
    for (si = 0; si < NSHAPES; si++) {
        check(&l2, XKNN_DTYPE_F32, &shapes[si], XKNN_CPU_PATH_LOOP, " (loop)");
        check(&eu, XKNN_DTYPE_F32, &shapes[si], XKNN_CPU_PATH_LOOP, " (loop)");
    }
    check(&l2, XKNN_DTYPE_F32, &big[0], XKNN_CPU_PATH_AUTO, "");
    check(&eu, XKNN_DTYPE_F32, &big[1], XKNN_CPU_PATH_AUTO, "");

    check_pair(&metrics[0], XKNN_DTYPE_F32, 1, 0, 0);
    check_pair(&metrics[0], XKNN_DTYPE_F32, 56, 0, 0);
    check_pair(&metrics[2], XKNN_DTYPE_F16, 7, 0, 0);
    check_pair(&metrics[6], XKNN_DTYPE_I8, 5, 0, 0);
    check_pair(&l2, XKNN_DTYPE_F32, 7, 1, 0);
    check_pair(&eu, XKNN_DTYPE_F32, 5, 1, 0);
    check_pair(&l2, XKNN_DTYPE_F32, 7, 1, 1);

    {
        /* values_checked: the caller's word that the values were checked; the scan for
         * NaN/Inf is skipped (an Inf row is then an error only without it) */
        float x[4 * 3] = {0, 0, 0, 1, 0, 0, 0, 2, 0, 3, 3, 3};
        int64_t ia[4 * 2], ib[4 * 2];
        float da[4 * 2], db[4 * 2];
        xknn_matrix a = XKNN_MATRIX_F32(x, 2, 3), b = XKNN_MATRIX_F32(x + 6, 2, 3), r = XKNN_MATRIX_F32(x, 4, 3);
        xknn_params p = XKNN_PARAMS_INIT;
        xknn_error e;
        int64_t t;
        p.backend = XKNN_BACKEND_CPU;
        x[7] = INFINITY;
        for (t = 0; t < 4; t++) {
            ia[t] = ib[t] = -1;
            da[t] = db[t] = INFINITY;
        }
        ok(xknn_search_pair(&p, &a, 0, &b, 2, 2, ia, da, ib, db, &e) == XKNN_ERROR_INVALID_VALUE &&
               strstr(e.message, "b row 2 column 1 is Inf"),
           "xknn_search_pair: an Inf is INVALID_VALUE (%s)", e.message);
        ok(xknn_search(&p, &r, NULL, 1, ia, da, &e) == XKNN_ERROR_INVALID_VALUE, "xknn_search: an Inf is INVALID_VALUE");
        p.values_checked = 1;
        ok(xknn_search_pair(&p, &a, 0, &b, 2, 2, ia, da, ib, db, &e) == XKNN_SUCCESS,
           "xknn_search_pair with values_checked: no scan (%s)", e.message);
        /* no scan: the Inf row is searched, and its infinite distances are then refused by
         * the result check (a different message from the scan's "is Inf") */
        {
            const xknn_status s = xknn_search(&p, &r, NULL, 1, ia, da, &e);
            ok(s == XKNN_SUCCESS || (s == XKNN_ERROR_INVALID_VALUE && strstr(e.message, "overflows float") &&
                                     !strstr(e.message, "is Inf")),
               "xknn_search with values_checked: no scan (%s)", s == XKNN_SUCCESS ? "success" : e.message);
        }
    }

    {
        xknn_params p = XKNN_PARAMS_INIT;
        p.backend = XKNN_BACKEND_CPU;
        p.metric = XKNN_METRIC_L1;
        ok(xknn_self_join_why_plain(&p, XKNN_DTYPE_F32, 8) == NULL, "f32 l1 self-join is symmetric");
        p.metric = XKNN_METRIC_L2;
        ok(xknn_self_join_why_plain(&p, XKNN_DTYPE_U8, 8) != NULL, "u8 l2 self-join stays on the integer path");
        p.self_join = XKNN_SELF_JOIN_PLAIN;
        ok(xknn_self_join_why_plain(&p, XKNN_DTYPE_F32, 8) != NULL, "self_join plain is plain");
        p.backend = XKNN_BACKEND_CUDA;
        p.self_join = XKNN_SELF_JOIN_AUTO;
        ok(xknn_self_join_why_plain(&p, XKNN_DTYPE_F32, 8) == NULL, "backend cuda, f32 l2: the symmetric kernel");
        ok(xknn_self_join_why_plain(&p, XKNN_DTYPE_F32, 200) != NULL, "backend cuda, d = 200: plain");
        ok(xknn_self_join_why_plain(&p, XKNN_DTYPE_U8, 8) != NULL, "backend cuda, u8: plain");
        ok(xknn_search_pair_why_not(&p, XKNN_DTYPE_F32, 8) == NULL, "backend cuda, f32 l2: the pair kernel");
        ok(xknn_search_pair_why_not(&p, XKNN_DTYPE_F32, 200) != NULL, "backend cuda, d = 200: no pair kernel");
        ok(xknn_search_pair_why_not(&p, XKNN_DTYPE_U8, 8) != NULL, "backend cuda, u8: no pair kernel");
        p.backend = XKNN_BACKEND_CPU;
        ok(xknn_search_pair_why_not(&p, XKNN_DTYPE_F32, 8) == NULL, "backend cpu: the pair kernel");
        p.metric = XKNN_METRIC_L1;
        p.backend = XKNN_BACKEND_CUDA;
        ok(xknn_self_join_why_plain(&p, XKNN_DTYPE_F32, 8) != NULL, "backend cuda, l1: plain");
        p.metric = XKNN_METRIC_COSINE;
        ok(xknn_self_join_why_plain(&p, XKNN_DTYPE_F32, 8) == NULL, "backend cuda, f32 cosine: the symmetric kernel");
    }
    return tap_done();
}
