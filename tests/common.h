/* SPDX-License-Identifier: MIT */
/* What the C test programs share beyond TAP and the oracle (tests/common.c). */
#ifndef XKNN_TEST_COMMON_H
#define XKNN_TEST_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "tap/tap.h"
#include "xknn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The buffers of one search checked against the oracle: ref (n x d floats), qry (nq x d,
 * NULL for a self-join, where nq = n), the search's ids/dist (nq x k, every byte 0xab:
 * the search must write each entry) and the oracle's wid/wd (nq x k). k <= 0 means n
 * (n - 1 in a self-join). */
typedef struct {
    int64_t n, nq, d, k;
    int self;
    float *ref, *qry;
    int64_t *ids, *wid;
    float *dist, *wd;
} knn_bufs;

void knn_bufs_alloc(knn_bufs *b, int64_t n, int64_t nq, int64_t d, int64_t k, int self);
void knn_bufs_free(knn_bufs *b);

/* xknn_search on the CPU backend (metric, path, query and reference blocks; no
 * self-join option) of b->qry (b->ref itself when NULL) against b->ref into b->ids and
 * b->dist. */
xknn_status knn_bufs_cpu_search(knn_bufs *b, xknn_metric metric, xknn_cpu_path path, int64_t qblock,
                                int64_t rblock, xknn_error *err);

/* A metric and its Minkowski exponent. */
typedef struct {
    xknn_metric metric;
    double p;
} mcase;

/* The element types of real-valued data: f32, f16, bf16, u8, i8. */
#define NDT 5
extern const xknn_dtype real_dtypes[NDT];

/* Sets p's metric, exponent mp and weights (w: one per dimension of d, or NULL). */
void params_metric(xknn_params *p, xknn_metric metric, double mp, const float *w, int64_t d);

/* malloc(n) (1 byte for n = 0) or bail out. */
void *xmalloc(size_t n);

/* rows x cols int64 or float values, uninitialised (bail when out of memory). */
int64_t *i64_alloc(int64_t rows, int64_t cols);
float *f32_alloc(int64_t rows, int64_t cols);

/* One search's test line: "not ok - DESC: the error message" where st is not
 * XKNN_SUCCESS, else is_knn_equal's line "DESC" (DESC from fmt, at most 1023 bytes). */
int is_knn_result(xknn_status st, const xknn_error *err, const int64_t *ids, const float *dist,
                  const int64_t *want_ids, const float *want_dist, int64_t nq, int64_t k, const char *fmt, ...)
    TAP_PRINTF(9, 10);

#ifdef __cplusplus
}
#endif

#endif
