/* SPDX-License-Identifier: MIT */
/* int8-t: float32 data whose values are 8-bit integers, searched by the CPU backend's
 * integer path (automatic and forced) against the oracle, byte for byte, and the forced
 * path's refusals. The integer kernel runs with AVX-512 VNNI where the CPU has it and a
 * portable kernel otherwise: both must give the oracle's bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "ref/ref.h"
#include "tap/tap.h"
#include "xknn.h"

typedef enum {
    V_U8,       /* uniform integers in [0, 255]                                   */
    V_S8,       /* uniform integers in [-128, 127]                                 */
    V_LEVELS,   /* {0, 128, 255} only: many equal distances                         */
    V_EXTREME,  /* 255 everywhere (queries) or 0 everywhere (references): the
                   largest products (a kernel that saturated 16-bit sums would fail) */
    V_PIXELS,   /* mostly 0 with bright patches, like image data                  */
    V_NEAR      /* integers, one query value 256: not 8-bit, must fall back       */
} vkind;

typedef struct {
    vkind rk, qk;
    int64_t n, nq, d, k; /* k <= 0: n (n - 1 in self-join) */
    int self;
    xknn_metric metric;
    int64_t qblock, rblock;
} icase;

static const icase cases[] = {
    {V_U8, V_U8, 1000, 97, 3, 7, 0, XKNN_METRIC_L2, 0, 0},
    {V_U8, V_U8, 1000, 97, 784, 100, 0, XKNN_METRIC_L2, 0, 0},
    {V_U8, V_U8, 1000, 97, 784, 100, 0, XKNN_METRIC_EUCLIDEAN, 13, 129},
    {V_S8, V_S8, 777, 61, 127, 10, 0, XKNN_METRIC_L2, 0, 0},
    {V_U8, V_S8, 777, 61, 33, 10, 0, XKNN_METRIC_L2, 0, 0},   /* mixed classes: no common */
    {V_S8, V_U8, 777, 61, 33, 10, 0, XKNN_METRIC_L2, 7, 100}, /* 8-bit type, forced refuses */
    {V_U8, V_U8, 1000, 97, 784, 100, 0, XKNN_METRIC_IP, 0, 0},
    {V_S8, V_S8, 777, 61, 127, 10, 0, XKNN_METRIC_IP, 13, 129},
    {V_LEVELS, V_LEVELS, 600, 40, 5, 100, 0, XKNN_METRIC_IP, 0, 0},
    {V_LEVELS, V_LEVELS, 600, 40, 1, 1, 0, XKNN_METRIC_L2, 0, 0},
    {V_LEVELS, V_LEVELS, 600, 40, 5, 100, 0, XKNN_METRIC_L2, 0, 0},
    {V_LEVELS, V_LEVELS, 300, 40, 4, 0, 0, XKNN_METRIC_L2, 0, 0},        /* k = n */
    {V_LEVELS, V_LEVELS, 350, 0, 64, 0, 1, XKNN_METRIC_L2, 16, 40},      /* self, k = n-1 */
    {V_PIXELS, V_PIXELS, 2000, 300, 784, 100, 0, XKNN_METRIC_L2, 0, 0},
    {V_PIXELS, V_PIXELS, 1200, 0, 784, 5, 1, XKNN_METRIC_EUCLIDEAN, 0, 0}, /* self-join */
    {V_EXTREME, V_EXTREME, 50, 3, 1000, 5, 0, XKNN_METRIC_L2, 0, 0},
    {V_U8, V_U8, 4097, 1, 200, 16, 0, XKNN_METRIC_L2, 0, 0},           /* one query */
    {V_U8, V_U8, 9000, 600, 64, 50, 0, XKNN_METRIC_L2, 0, 0},          /* several tiles */
    {V_U8, V_U8, 40, 9, 12001, 3, 0, XKNN_METRIC_L2, 0, 0},            /* int64 scan (d > 10000) */
    {V_U8, V_U8, 20000, 5, 8, 1000, 0, XKNN_METRIC_L2, 0, 0},          /* large k, near-equal values */
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

static void make(vkind kind, float *x, int64_t rows, int64_t d, uint64_t seed, int is_query)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 12345;
    int64_t i, t;
    for (i = 0; i < rows; i++) {
        const int64_t bright = (int64_t)(ref_rand_u64(&s) % (uint64_t)(d > 8 ? d / 8 : 1));
        for (t = 0; t < d; t++) {
            float v;
            switch (kind) {
            case V_U8: v = (float)(ref_rand_u64(&s) % 256); break;
            case V_S8: v = (float)((int)(ref_rand_u64(&s) % 256) - 128); break;
            case V_LEVELS: {
                const uint64_t l = ref_rand_u64(&s) % 3;
                v = l == 0 ? 0.0f : l == 1 ? 128.0f : 255.0f;
                break;
            }
            case V_EXTREME: v = is_query ? 255.0f : 0.0f; break;
            case V_PIXELS:
                v = (t >= bright * 8 && t < bright * 8 + 64) ? (float)(ref_rand_u64(&s) % 256)
                                                             : (ref_rand_u64(&s) % 16 == 0 ? 1.0f : 0.0f);
                break;
            default: v = (float)(ref_rand_u64(&s) % 200); break;
            }
            x[i * d + t] = v;
        }
    }
    if (kind == V_NEAR && rows > 0) x[(rows / 2) * d] = 256.0f;
}

static void run_case(const icase *c, xknn_cpu_path path)
{
    knn_bufs b;
    xknn_error err;
    xknn_status st;
    const char *pname = path == XKNN_CPU_PATH_INT8 ? "int8" : "auto";
    ref_spec rs;

    knn_bufs_alloc(&b, c->n, c->nq, c->d, c->k, c->self);
    make(c->rk, b.ref, c->n, c->d, 1, 0);
    if (b.qry) make(c->qk, b.qry, b.nq, c->d, 2, 1);
    memset(&rs, 0, sizeof rs);
    rs.metric = c->metric == XKNN_METRIC_EUCLIDEAN ? REF_EUCLIDEAN : c->metric == XKNN_METRIC_IP ? REF_IP : REF_L2;
    rs.dtype = REF_F32;
    ref_knn_ex(&rs, b.ref, c->n, c->d, b.qry, b.nq, c->d, c->d, b.k, c->self, 0, 0, b.wid, b.wd);
    st = knn_bufs_cpu_search(&b, c->metric, path, c->qblock, c->rblock, &err);
    if (path == XKNN_CPU_PATH_INT8 && c->rk != c->qk && (c->rk == V_S8 || c->qk == V_S8))
        ok(st == XKNN_ERROR_INVALID_ARGUMENT && strstr(err.message, "every value of both matrices"),
           "n=%lld nq=%lld d=%lld mixed u8/i8 values: forced integer path refuses: %s", (long long)c->n,
           (long long)b.nq, (long long)c->d, err.message);
    else if (st != XKNN_SUCCESS)
        ok(0, "n=%lld nq=%lld d=%lld k=%lld %s%s path=%s: %s", (long long)c->n, (long long)b.nq, (long long)c->d,
           (long long)b.k, xknn_metric_name(c->metric), c->self ? " self" : "", pname, err.message);
    else
        is_knn_equal(b.ids, b.dist, b.wid, b.wd, b.nq, b.k, "n=%lld nq=%lld d=%lld k=%lld %s%s blocks=%lldx%lld path=%s",
                     (long long)c->n, (long long)b.nq, (long long)c->d, (long long)b.k, xknn_metric_name(c->metric),
                     c->self ? " self" : "", (long long)c->qblock, (long long)c->rblock, pname);
    knn_bufs_free(&b);
}

/* 1 if the forced integer path runs on this build and CPU. */
/* The nearest of r's rows to each of q's on the forced integer path: ids only. */
static xknn_status search_forced(const xknn_matrix *r, const xknn_matrix *q, int64_t *ids, xknn_error *err)
{
    xknn_params p = XKNN_PARAMS_INIT;
    p.backend = XKNN_BACKEND_CPU;
    p.cpu_path = XKNN_CPU_PATH_INT8;
    return xknn_search(&p, r, q, 1, ids, NULL, err);
}

static int int8_available(void)
{
    float x[4] = {1, 2, 3, 4};
    int64_t ids[2];
    xknn_matrix r = XKNN_MATRIX_F32(x, 2, 2);
    xknn_error err;
    if (search_forced(&r, &r, ids, &err) == XKNN_SUCCESS) return 1;
    diag("integer path unavailable: %s", err.message);
    return 0;
}

int main(void)
{
    int i, have;
    plan(2 * NCASES + 3 + 1);
    have = int8_available();
    for (i = 0; i < NCASES; i++) {
        run_case(&cases[i], XKNN_CPU_PATH_AUTO);
        if (have)
            run_case(&cases[i], XKNN_CPU_PATH_INT8);
        else
            skip(1, "integer path not available");
    }
    /* values that are not 8-bit integers: auto falls back (checked above with V_NEAR),
     * a forced integer path refuses with a message naming the matrix */
    {
        float x[6] = {0, 1, 2, 3.5f, 4, 5}, y[2] = {1, 1};
        int64_t ids[3];
        xknn_matrix r = XKNN_MATRIX_F32(x, 3, 2), q = XKNN_MATRIX_F32(y, 1, 2);
        xknn_error err;
        xknn_status st = search_forced(&r, &q, ids, &err);
        if (have)
            ok(st == XKNN_ERROR_INVALID_ARGUMENT && strstr(err.message, "value to be an integer"),
               "forced integer path on 3.5 refuses: %s", err.message);
        else
            ok(st != XKNN_SUCCESS, "forced integer path unavailable: %s", err.message);
        x[3] = 300.0f;
        st = search_forced(&r, &q, ids, &err);
        ok(st != XKNN_SUCCESS, "forced integer path on 300 refuses: %s", err.message);
        x[3] = 3.0f;
        y[0] = 0.25f;
        st = search_forced(&r, &q, ids, &err);
        ok(st != XKNN_SUCCESS && (!have || strstr(err.message, "query value")),
           "forced integer path on a 0.25 query refuses: %s", err.message);
    }
    {
        /* a value that is not an 8-bit integer: auto must still be exact */
        icase c = {V_NEAR, V_NEAR, 500, 30, 16, 10, 0, XKNN_METRIC_L2, 0, 0};
        run_case(&c, XKNN_CPU_PATH_AUTO);
    }
    return tap_done();
}
