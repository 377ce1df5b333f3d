/* SPDX-License-Identifier: MIT */
/*
 * mpi/resident.c -- a rank's reference slice kept in GPU memory for a whole distributed
 * search. Without it every query block went through xknn_search on host arrays, which
 * copies the whole slice to the device again for each block (the slice is the large
 * operand: 10M x 128 floats are 5 GB). Here the slice is uploaded once; each block then
 * costs one small query copy, a device search and the copy of its k candidates back to
 * host memory, where the tree reduction takes them. Results are those of xknn_search
 * (same engine, same contract).
 *
 * The library owns the device side (xknn__cuda_resident_*, kernels/cuda/resident.cu):
 * its memory, stream, staging, device scope and the rule of when the path applies
 * (backend cuda, or auto with a device; l2/euclidean on float32; the slice plus a
 * workspace within the device memory budget). Otherwise, and in a build without CUDA,
 * xknn__resident_open returns NULL with the reason, and the caller keeps the per-block
 * host path (which streams references that do not fit).
 *
 * Below, the caller's matrices that may lie in device memory (the index takes host or
 * device pointers): they are copied, checked or brought to the host here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "impl.h"
#include "xknn/impl/cuda_internal.h"

struct xknn__resident {
    xknn__cuda_resident *dev;
};

void xknn__resident_close(xknn__resident *r)
{
    if (!r) return;
    xknn__cuda_resident_close(r->dev);
    free(r);
}

int xknn__resident_reserve(xknn__resident *r, const xknn_params *params, int64_t qb, int64_t k, char *why,
                           size_t why_size)
{
    return xknn__cuda_resident_reserve(r->dev, params, qb, k, why, why_size);
}

xknn_status xknn__resident_update(xknn__resident *r, int64_t row0, const xknn_matrix *rows, xknn_error *err)
{
    return xknn__cuda_resident_update(r->dev, row0, rows, err);
}

xknn__resident *xknn__resident_open(const xknn_params *params, int device, const xknn_matrix *ref, int64_t qb,
                                    int64_t k, char *why, size_t why_size)
{
    xknn__resident *r = (xknn__resident *)calloc(1, sizeof *r);
    if (!r) {
        snprintf(why, why_size, "out of host memory");
        return NULL;
    }
    r->dev = xknn__cuda_resident_open(params, device, ref, qb, k, why, why_size);
    if (!r->dev) {
        free(r);
        return NULL;
    }
    return r;
}

xknn_status xknn__resident_start(xknn__resident *r, const xknn_params *params, const float *q, int64_t rows,
                                 xknn_error *err)
{
    return xknn__cuda_resident_start(r->dev, params, q, rows, err);
}

xknn_status xknn__resident_finish(xknn__resident *r, int64_t *ids, float *dist, void (*poll)(void *), void *poll_arg,
                                  xknn_error *err)
{
    return xknn__cuda_resident_finish(r->dev, ids, dist, poll, poll_arg, err);
}

const void *xknn__resident_rows(const xknn__resident *r)
{
    return xknn__cuda_resident_rows(r->dev);
}

int xknn__on_device(const xknn_mpi_context *ctx, const xknn_params *p, const xknn_matrix *m)
{
    /* (the probe would start a CUDA context on a rank that uses none) */
    if (!m || !m->data || ctx->device < 0 || (p && p->backend == XKNN_BACKEND_CPU)) return 0;
    return xknn__cuda_pointer_device(m->data) >= 0;
}

/* Bytes of a row of m, and between its rows. */
static void xknn__row_geometry(const xknn_matrix *m, int64_t *rb, int64_t *ldb)
{
    const int64_t el = xknn_row_elems(m->dtype, m->cols);
    *rb = xknn_row_bytes(m->dtype, m->cols);
    *ldb = (m->ld ? m->ld : el) * (*rb / el);
}

xknn_status xknn__rows_copy(void *dst, const xknn_matrix *m, int dev, xknn_error *err)
{
    int64_t rb, ldb, i;
    xknn__row_geometry(m, &rb, &ldb);
    if (dev)
        return xknn__cuda_copy_rows(dst, (size_t)rb, m->data, (size_t)ldb, (size_t)rb, m->rows, err);
    /* on the budget's threads: a slice is GBs, and its pages are touched here first */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(xknn_thread_budget()) if (m->rows * rb >= (64 << 20))
#endif
    for (i = 0; i < m->rows; i++)
        memcpy((unsigned char *)dst + i * rb, (const unsigned char *)m->data + i * ldb, (size_t)rb);
    return XKNN_SUCCESS;
}

xknn_status xknn__rows_to_host(int rank, const char *what, const xknn_matrix *m, int dev, unsigned char **buf,
                               xknn_matrix *out, xknn_error *err)
{
    int64_t rb, ldb;
    xknn_error e;
    xknn_status st;
    xknn__row_geometry(m, &rb, &ldb);
    *buf = (unsigned char *)malloc((size_t)(m->rows > 0 ? m->rows * rb : 1));
    if (!*buf)
        return xknn__mpi_fail(err, XKNN_ERROR_OUT_OF_MEMORY, "rank %d: out of memory for %s (%.1f MiB)", rank, what,
                              (double)(m->rows * rb) / 1048576.0);
    st = xknn__rows_copy(*buf, m, dev, &e);
    if (st != XKNN_SUCCESS) {
        free(*buf);
        *buf = NULL;
        return xknn__mpi_fail(err, st, "rank %d: %s", rank, e.message);
    }
    *out = *m;
    out->data = *buf;
    out->ld = 0;
    return XKNN_SUCCESS;
}

xknn_status xknn__rows_check(int rank, const xknn_params *p, const char *what, const xknn_matrix *m, int dev,
                             int64_t row0, xknn_error *err)
{
    xknn_matrix one = *m, h;
    unsigned char *buf = NULL;
    int64_t bad = -1, r = 0;
    xknn_error e;
    xknn_status st;
    if (m->rows <= 0 || !dev) {
        st = xknn_check_input(p, what, m, row0, &e);
        return st == XKNN_SUCCESS ? st : xknn__mpi_fail(err, st, "rank %d: %s", rank, e.message);
    }
    if (m->dtype == XKNN_DTYPE_F32 && p->metric != XKNN_METRIC_HELLINGER) {
        /* NaN/Inf on the device; the offending row (or row 0, for the metric's own
         * checks) then on the host, for xknn_check_input's message */
        st = xknn__cuda_first_nonfinite((const float *)m->data, m->rows, m->cols, m->ld ? m->ld : m->cols, &bad, &e);
        if (st != XKNN_SUCCESS) return xknn__mpi_fail(err, st, "rank %d: %s", rank, e.message);
        r = bad >= 0 ? bad : 0;
        one.data = (const unsigned char *)m->data + r * (m->ld ? m->ld : m->cols) * (int64_t)sizeof(float);
        one.rows = 1;
    }
    st = xknn__rows_to_host(rank, "a host copy of device rows", &one, 1, &buf, &h, err);
    if (st != XKNN_SUCCESS) return st;
    st = xknn_check_input(p, what, &h, row0 + r, &e);
    free(buf);
    return st == XKNN_SUCCESS ? st : xknn__mpi_fail(err, st, "rank %d: %s", rank, e.message);
}
