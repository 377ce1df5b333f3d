/* SPDX-License-Identifier: MIT */
/*
 * xknn/impl/backend.h -- private interface between the header-only host code and the
 * compiled backends (kernels/cpu, kernels/cuda). Not part of the public API.
 *
 * A job arrives here validated: n, nq, d >= 1, 1 <= k (k may exceed the available
 * references only when params.pad_missing is set), pointers non-NULL (dist may be
 * NULL), values finite (and >= 0 for hellinger), metric/dtype/backend in range and
 * compatible, whamming weights present (one per bit).
 */
#ifndef XKNN_IMPL_BACKEND_H
#define XKNN_IMPL_BACKEND_H

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../../xknn.h"
#include "canonical_math.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define XKNN__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define XKNN__PRINTF(a, b)
#endif

/* The one formatter of the library's error messages (host code, kernels/cpu, mpi/ and
 * tools/): fmt printf-style into msg (size bytes, always terminated); nothing when msg
 * is NULL or size is 0. Returns st. */
static inline xknn_status xknn__vmsg(char *msg, size_t size, xknn_status st, const char *fmt, va_list ap)
{
    if (msg && size) vsnprintf(msg, size, fmt, ap);
    return st;
}

/* xknn__vmsg with the arguments inline, for `return xknn__msgf(...)`. */
static inline xknn_status xknn__msgf(char *msg, size_t size, xknn_status st, const char *fmt, ...) XKNN__PRINTF(4, 5);
static inline xknn_status xknn__msgf(char *msg, size_t size, xknn_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    xknn__vmsg(msg, size, st, fmt, ap);
    va_end(ap);
    return st;
}

/* Fills *err (nothing when err is NULL): its status and the printf-style message.
 * Returns status, for `return xknn__fail(...)`. */
static inline xknn_status xknn__fail(xknn_error *err, xknn_status status, const char *fmt, ...) XKNN__PRINTF(3, 4);
static inline xknn_status xknn__fail(xknn_error *err, xknn_status status, const char *fmt, ...)
{
    va_list ap;
    if (!err) return status;
    err->status = status;
    va_start(ap, fmt);
    xknn__vmsg(err->message, sizeof err->message, status, fmt, ap);
    va_end(ap);
    return status;
}

typedef struct xknn__job {
    const float *ref;   /* n x d, row stride ldr, host memory  */
    int64_t n, d, ldr;
    const float *query; /* nq x d, row stride ldq, host memory */
    int64_t nq, ldq;
    int64_t k;
    int64_t *ids;       /* nq x k, host memory                 */
    float *dist;        /* nq x k or NULL, host memory          */
    xknn_params params;
    char *msg;          /* error message buffer, may be NULL    */
    size_t msg_size;
    /* Any dtype (the float pointers above are set for XKNN_DTYPE_F32 only): rows of
     * dtype at ref_data + i*ldr elements (BIN: uint64 words); d is in bits for BIN.
     * params.p is resolved (2 when it was 0 for minkowski). */
    const void *ref_data;
    const void *query_data;
    xknn_dtype dtype;
    /* 1: a self-join (query_data == ref_data, the same ids) that may take the
     * symmetric path: each distance computed once for both of its points. */
    int symmetric;
} xknn__job;

/* One side of a symmetric tile update: rows of the job's dtype at data + i*ld elements
 * (BIN: words), global ids id0 + i, and their running k-best lists (rows x k, host,
 * sorted by the result order, padded with id -1 and +inf, -inf for ip). */
typedef struct xknn__sym_side {
    const void *data;
    int64_t rows, ld, id0;
    int64_t *ids;
    float *dist;
} xknn__sym_side;

/* A self-join job's whole reference set as one side, its lists job->ids and dist. */
static inline xknn__sym_side xknn__job_side(const xknn__job *job, float *dist)
{
    xknn__sym_side a;
    a.data = job->ref_data;
    a.rows = job->n;
    a.ld = job->ldr;
    a.id0 = job->params.ref_id_offset;
    a.ids = job->ids;
    a.dist = dist;
    return a;
}

/* kernels/cpu */
xknn_status xknn__cpu_search(const xknn__job *job);

/* Symmetric self-join on the CPU (kernels/cpu/sym_search.c). why_not: NULL when the
 * symmetric path serves this metric/dtype/cpu_path, else a static reason (the plain
 * path then runs). pair: a's lists updated with b's rows and b's with a's (b NULL:
 * a against itself, each row's own id skipped); job gives d, k, dtype, params, msg. */
const char *xknn__cpu_sym_why_not(const xknn_params *p, xknn_dtype dtype, int64_t d);
xknn_status xknn__cpu_sym_pair(const xknn__job *job, const xknn__sym_side *a, const xknn__sym_side *b);

/* kernels/cuda (stubs returning NOT_BUILT when CUDA is not compiled in) */
int xknn__cuda_built(void);
int xknn__cuda_device_count(void);
xknn_status xknn__cuda_search(const xknn__job *job);
/* xknn_search_pair on a CUDA device (f32, l2/euclidean/ip/cosine, d <= 128): the
 * tensor-core pair kernel where the shape and memory allow, in parts where only the
 * memory does not, the CPU pair (xknn__cpu_sym_pair) for parts the kernels do not take. */
xknn_status xknn__cuda_pair(const xknn__job *job, const xknn__sym_side *a, const xknn__sym_side *b);

/* Canonical distance (host): double accumulation in dimension order with fma,
 * rounded once to float. Shared by every backend's re-rank and by tests. */
float xknn__canonical(xknn_metric metric, const float *a, const float *b, int64_t d);

/* Bytes of one element of a row of this dtype (BIN: of one uint64 word): the unit of a
 * leading dimension. */
static inline size_t xknn__dtype_bytes(xknn_dtype dtype)
{
    switch (dtype) {
    case XKNN_DTYPE_F16:
    case XKNN_DTYPE_BF16: return 2;
    case XKNN_DTYPE_U8:
    case XKNN_DTYPE_I8: return 1;
    case XKNN_DTYPE_BIN: return 8;
    default: return 4;
    }
}

/* count entries of k-best lists set to padding: id -1, distance +inf (-inf for ip). */
static inline void xknn__lists_pad(int64_t *ids, float *dist, int64_t count, int ip)
{
    int64_t i;
    for (i = 0; i < count; i++) {
        ids[i] = -1;
        dist[i] = ip ? -INFINITY : INFINITY;
    }
}

/* Order of two results: (dist ascending, id ascending). NaN never occurs here. */
static inline int xknn__result_less(float da, int64_t ia, float db, int64_t ib)
{
    return da < db || (da == db && ia < ib);
}

/* An id with its sort key (a distance, widened exactly to double where it is a float),
 * and qsort's comparator of the order (key ascending, id ascending). */
typedef struct xknn__keyed {
    double key;
    int64_t id;
} xknn__keyed;

static inline int xknn__keyed_cmp(const void *pa, const void *pb)
{
    const xknn__keyed *a = (const xknn__keyed *)pa, *b = (const xknn__keyed *)pb;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

#ifdef __cplusplus
}
#endif

#endif /* XKNN_IMPL_BACKEND_H */
