/* SPDX-License-Identifier: MIT */
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const xknn_dtype real_dtypes[NDT] = {XKNN_DTYPE_F32, XKNN_DTYPE_F16, XKNN_DTYPE_BF16, XKNN_DTYPE_U8,
                                     XKNN_DTYPE_I8};

void params_metric(xknn_params *p, xknn_metric metric, double mp, const float *w, int64_t d)
{
    p->metric = metric;
    p->p = mp;
    p->weights = w;
    p->weights_count = w ? d : 0;
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) bail("out of host memory (%zu bytes)", n);
    return p;
}

int64_t *i64_alloc(int64_t rows, int64_t cols) { return (int64_t *)xmalloc((size_t)(rows * cols) * sizeof(int64_t)); }

float *f32_alloc(int64_t rows, int64_t cols) { return (float *)xmalloc((size_t)(rows * cols) * sizeof(float)); }

void knn_bufs_alloc(knn_bufs *b, int64_t n, int64_t nq, int64_t d, int64_t k, int self)
{
    b->n = n;
    b->d = d;
    b->self = self;
    b->nq = self ? n : nq;
    b->k = k > 0 ? k : (self ? n - 1 : n);
    b->ref = malloc((size_t)(n * d) * sizeof(float));
    b->qry = self ? NULL : malloc((size_t)(b->nq * d) * sizeof(float));
    b->ids = malloc((size_t)(b->nq * b->k) * sizeof(int64_t));
    b->wid = malloc((size_t)(b->nq * b->k) * sizeof(int64_t));
    b->dist = malloc((size_t)(b->nq * b->k) * sizeof(float));
    b->wd = malloc((size_t)(b->nq * b->k) * sizeof(float));
    memset(b->ids, 0xab, (size_t)(b->nq * b->k) * sizeof(int64_t));
    memset(b->dist, 0xab, (size_t)(b->nq * b->k) * sizeof(float));
}

void knn_bufs_free(knn_bufs *b)
{
    FREE_ALL(b->ref, b->qry, b->ids, b->wid, b->dist, b->wd);
}

xknn_status knn_bufs_cpu_search(knn_bufs *b, xknn_metric metric, xknn_cpu_path path, int64_t qblock,
                                int64_t rblock, xknn_error *err)
{
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix r = XKNN_MATRIX_F32(b->ref, b->n, b->d), q = XKNN_MATRIX_F32(b->qry, b->nq, b->d);
    p.backend = XKNN_BACKEND_CPU;
    p.metric = metric;
    p.cpu_path = path;
    p.query_block = qblock;
    p.ref_block = rblock;
    return xknn_search(&p, &r, b->self ? NULL : &q, b->k, b->ids, b->dist, err);
}

int is_knn_result(xknn_status st, const xknn_error *err, const int64_t *ids, const float *dist,
                  const int64_t *want_ids, const float *want_dist, int64_t nq, int64_t k, const char *fmt, ...)
{
    char desc[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(desc, sizeof desc, fmt, ap);
    va_end(ap);
    if (st != XKNN_SUCCESS) return ok(0, "%s: %s", desc, err->message);
    return is_knn_equal(ids, dist, want_ids, want_dist, nq, k, "%s", desc);
}
