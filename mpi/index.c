/* SPDX-License-Identifier: MIT */
/*
 * mpi/index.c -- the distributed index (xknn_mpi_index_*) and the one-shot searches
 * built on it (xknn_mpi_search, xknn_mpi_self_join, xknn_mpi_search_gather): one
 * implementation of the distributed search, the pipeline of mpi/search.c
 * (xknn__search_held), whatever the entry point.
 *   created  (xknn_mpi_index_create): each rank's slice is copied once into host memory
 *            the index owns (updates write it) and its values checked once; where the
 *            device path applies (xknn__resident_open: CUDA backend, l2/euclidean on
 *            float32, room on the device) it is kept on the rank's GPU as well. A search
 *            then moves only queries and candidate lists.
 *   borrowed (xknn_mpi_index_borrow, and the one-shot searches on the stack): the
 *            caller's slice, not a copy; nothing happens before the first search, which
 *            checks the values (unless the caller vouched for them with
 *            params->values_checked) and keeps the slice on the GPU for its own
 *            duration, exactly as the one-shot search always did. A search that
 *            succeeded checked the slice: later ones skip the scan.
 * Either way a search gives the same ids and distance bits. A slice in device memory
 * goes to the GPU copy alone, device to device, and is checked there, where the device
 * path applies; else to host memory. Queries in device memory come to the root's host
 * memory for the broadcast (mpi/search.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "impl.h"

struct xknn_mpi_index {
    xknn_mpi_context *ctx;
    xknn_params p;        /* the caller's parameters (minkowski's p resolved)         */
    xknn_matrix slice;    /* this rank's rows, dense: data is rows below              */
    unsigned char *rows;  /* host memory owned here; NULL when borrowed or when the
                             slice came from device memory and lives on the GPU alone */
    int64_t ref_offset;
    xknn__slice_state held;
    int borrowed;         /* slice is the caller's ref (see the head of this file)    */
    int lent_ref;         /* borrowed: the caller passed a ref (searched as given,
                             rows <= 0 included, so the search's checks see it)      */
    int allocated;        /* 1: calloc'ed (destroy frees it); 0: on a caller's stack  */
};

/* This rank's dense host copy of ref (host or device memory). */
static xknn_status xknn__index_copy(xknn_mpi_index *x, const xknn_matrix *ref, int dev, xknn_error *err)
{
    if (!ref->data || ref->cols <= 0 || (int)ref->dtype < 0 || ref->dtype >= XKNN_DTYPE_COUNT)
        return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: reference slice has no data, d=%lld or an "
                              "unknown dtype", x->ctx->rank, (long long)ref->cols);
    return xknn__rows_to_host(x->ctx->rank, "the index's slice", ref, dev, &x->rows, &x->slice, err);
}

/* A slice in device memory: on the GPU alone where the device path applies (copied
 * device to device, its values checked there), else copied to host memory. why: the
 * reason the device path did not apply. */
static xknn_status xknn__index_from_device(xknn_mpi_index *x, const xknn_matrix *ref, char *why, size_t why_size)
{
    x->held.resident = xknn__resident_open(&x->p, x->p.device, ref, 1, 1, why, why_size);
    if (!x->held.resident) return XKNN_ERROR_NOT_BUILT; /* the caller copies to host memory */
    x->slice = *ref;
    x->slice.ld = 0;
    x->slice.data = xknn__resident_rows(x->held.resident);
    return XKNN_SUCCESS;
}

/* The values of rows [r0, r0 + rows) of m (host or device memory), named by global row
 * (rank prefixed). */
static xknn_status xknn__index_check(const xknn_mpi_index *x, const xknn_matrix *m, int64_t row0, xknn_error *err)
{
    return xknn__rows_check(x->ctx->rank, &x->p, "reference", m, xknn__on_device(x->ctx, &x->p, m), row0, err);
}

/* The fields every index starts with: the context, the parameters (Minkowski's p
 * defaulting to 2) and the slice's first global row; the rest zero. */
static void xknn__index_init(xknn_mpi_index *x, xknn_mpi_context *ctx, const xknn_params *params,
                             int64_t ref_offset)
{
    memset(x, 0, sizeof *x);
    x->ctx = ctx;
    x->p = params ? *params : xknn_params_default();
    if (x->p.metric == XKNN_METRIC_MINKOWSKI && x->p.p == 0.0) x->p.p = 2.0;
    x->ref_offset = ref_offset;
}

/* An index's memory for create and borrow, lerr cleared; NULL with *st and lerr set
 * when there is none (the caller still reaches the agreement). */
static xknn_mpi_index *xknn__index_alloc(const xknn_mpi_context *ctx, xknn_error *lerr, xknn_status *st)
{
    xknn_mpi_index *x = (xknn_mpi_index *)malloc(sizeof *x);
    lerr->status = XKNN_SUCCESS;
    lerr->message[0] = '\0';
    if (!x) *st = xknn__mpi_fail(lerr, XKNN_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", ctx->rank);
    return x;
}

/* Fills a borrowed index on the caller's memory (no allocation, no communication):
 * trust = 1 takes the slice's values as checked. */
static void xknn__index_lend(xknn_mpi_index *x, xknn_mpi_context *ctx, const xknn_params *params,
                             const xknn_matrix *ref, int64_t ref_offset, int trust)
{
    xknn__index_init(x, ctx, params, ref_offset);
    if (ref) x->slice = *ref;
    x->lent_ref = ref != NULL;
    x->borrowed = 1;
    x->held.checked = trust;
}

xknn_status xknn_mpi_index_create(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                                  int64_t ref_offset, xknn_mpi_index **index, xknn_error *err)
{
    xknn_mpi_index *x;
    xknn_status st = XKNN_SUCCESS;
    xknn_error lerr;
    char why[256] = "";
    int tried = 0; /* the device path was tried on a device slice and did not apply */
    if (!ctx || !index) return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_mpi_index_create: NULL argument");
    *index = NULL;
    x = xknn__index_alloc(ctx, &lerr, &st);
    if (x) {
        xknn__index_init(x, ctx, params, ref_offset);
        x->allocated = 1;
        if (x->p.device < 0) x->p.device = ctx->device;
        if (ref && ref->rows > 0) {
            if (ref_offset < 0)
                st = xknn__mpi_fail(&lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: ref_offset=%lld: need >= 0",
                                    ctx->rank, (long long)ref_offset);
            const int dev = st == XKNN_SUCCESS && xknn__on_device(ctx, &x->p, ref);
            if (st == XKNN_SUCCESS && (!dev || xknn__index_from_device(x, ref, why, sizeof why) != XKNN_SUCCESS)) {
                st = xknn__index_copy(x, ref, dev, &lerr);
                tried = dev;
            }
            if (st == XKNN_SUCCESS) st = xknn__index_check(x, &x->slice, ref_offset, &lerr);
        }
    }
    st = xknn_mpi_agree(ctx, st, &lerr);
    if (st == XKNN_SUCCESS && x->slice.rows > 0) {
        /* the device copy where the device path applies; the host path otherwise */
        if (!tried && !x->held.resident)
            x->held.resident = xknn__resident_open(&x->p, x->p.device, &x->slice, 1, 1, why, sizeof why);
        if (ctx->config.verbose && (x->p.backend != XKNN_BACKEND_CPU || x->held.resident))
            fprintf(stderr, "xknn_mpi: index: rank %d: %s\n", ctx->rank,
                    x->held.resident ? "slice resident on the GPU" : why);
    }
    if (st != XKNN_SUCCESS) {
        xknn_mpi_index_destroy(x);
        x = NULL;
    } else {
        x->held.checked = 1;
    }
    *index = x;
    if (err) *err = lerr;
    return st;
}

xknn_status xknn_mpi_index_search(xknn_mpi_index *index, const xknn_matrix *query, int query_root, int64_t k,
                                  const xknn_mpi_output *out, xknn_mpi_stats *stats, xknn_error *err)
{
    xknn_status st;
    if (!index) return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_mpi_index_search: index is NULL");
    st = xknn__search_held(index->ctx, &index->p,
                           (index->borrowed ? index->lent_ref : index->slice.rows > 0) ? &index->slice : NULL,
                           index->ref_offset, &index->held, query, query_root, k, out, stats, err);
    /* agreed: every rank's slice passed the search's checks */
    if (st == XKNN_SUCCESS) index->held.checked = 1;
    return st;
}

xknn_status xknn_mpi_index_self_join(xknn_mpi_index *index, int64_t k, const xknn_mpi_output *out,
                                     xknn_mpi_stats *stats, xknn_error *err)
{
    if (!index) return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_mpi_index_self_join: index is NULL");
    return xknn_mpi_index_search(index, NULL, XKNN_MPI_SELF_JOIN, k, out, stats, err);
}

xknn_status xknn_mpi_index_borrow(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                                  int64_t ref_offset, xknn_mpi_index **index, xknn_error *err)
{
    xknn_mpi_index *x;
    xknn_status st = XKNN_SUCCESS;
    xknn_error lerr;
    if (!ctx || !index) return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_mpi_index_borrow: NULL argument");
    *index = NULL;
    x = xknn__index_alloc(ctx, &lerr, &st);
    if (x) {
        xknn__index_lend(x, ctx, params, ref, ref_offset, params && params->values_checked);
        x->allocated = 1;
        /* vouched-for values skip the scan, not the metric's checks (dtype pair, p,
         * weights): those run here on the slice's first row, as a search would */
        if (x->held.checked && ref && ref->rows > 0) {
            xknn_matrix one = *ref;
            one.rows = 1;
            st = xknn__index_check(x, &one, ref_offset, &lerr);
        }
    }
    st = xknn_mpi_agree(ctx, st, &lerr);
    if (st != XKNN_SUCCESS) {
        free(x);
        x = NULL;
    }
    *index = x;
    if (err) *err = lerr;
    return st;
}

xknn_status xknn_mpi_index_search_gather(xknn_mpi_index *index, const xknn_matrix *query, int query_root, int64_t k,
                                         int gather_root, int64_t *ids, float *dist, xknn_error *err)
{
    xknn_mpi_output out = XKNN_MPI_OUTPUT_INIT;
    out.gather_root = gather_root;
    out.ids = ids;
    out.dist = dist;
    return xknn_mpi_index_search(index, query, query_root, k, &out, NULL, err);
}

xknn_status xknn_mpi_index_update(xknn_mpi_index *index, int64_t row0, const xknn_matrix *rows, xknn_error *err)
{
    xknn_status st = XKNN_SUCCESS;
    xknn_error lerr;
    const xknn_matrix *s;
    int64_t n;
    if (!index) return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_mpi_index_update: index is NULL");
    s = &index->slice;
    lerr.status = XKNN_SUCCESS;
    lerr.message[0] = '\0';
    n = rows ? rows->rows : 0;
    if (index->borrowed) /* the same on every rank: each refuses alone, the agreement is moot */
        st = xknn__mpi_fail(&lerr, XKNN_ERROR_INVALID_ARGUMENT,
                            "rank %d: xknn_mpi_index_update: a borrowed index's rows are the caller's: update them "
                            "there and borrow again", index->ctx->rank);
    else if (n < 0 || (n > 0 && (!rows->data || rows->cols != s->cols || rows->dtype != s->dtype)))
        st = xknn__mpi_fail(&lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: update rows must be %lld columns of %s",
                            index->ctx->rank, (long long)s->cols, xknn_dtype_name(s->dtype));
    else if (n > 0 && (row0 < 0 || row0 + n > s->rows))
        st = xknn__mpi_fail(&lerr, XKNN_ERROR_INVALID_ARGUMENT,
                            "rank %d: update of rows %lld..%lld outside the slice's %lld rows", index->ctx->rank,
                            (long long)row0, (long long)(row0 + n - 1), (long long)s->rows);
    else if (n > 0)
        st = xknn__index_check(index, rows, index->ref_offset + row0, &lerr);
    st = xknn_mpi_agree(index->ctx, st, &lerr);
    if (st == XKNN_SUCCESS) { /* agreed: every rank is here */
        if (n > 0 && index->rows)
            st = xknn__rows_copy(index->rows + row0 * xknn_row_bytes(s->dtype, s->cols), rows,
                                 xknn__on_device(index->ctx, &index->p, rows), &lerr);
        if (n > 0 && st == XKNN_SUCCESS && index->held.resident)
            st = xknn__resident_update(index->held.resident, row0, rows, &lerr);
        st = xknn_mpi_agree(index->ctx, st, &lerr); /* the device copies */
    }
    if (err) *err = lerr;
    return st;
}

xknn_status xknn_mpi_index_destroy(xknn_mpi_index *index)
{
    if (!index) return XKNN_SUCCESS;
    xknn__resident_close(index->held.resident);
    free(index->rows);
    if (index->allocated) free(index);
    return XKNN_SUCCESS;
}

/* ---- the one-shot searches: a borrowed index on the stack, one search --------------- */

xknn_status xknn_mpi_search(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                            int64_t ref_offset, const xknn_matrix *query, int query_root, int64_t k,
                            const xknn_mpi_output *out, xknn_mpi_stats *stats, xknn_error *err)
{
    xknn_mpi_index x;
    xknn_status st;
    xknn__index_lend(&x, ctx, params, ref, ref_offset, 0);
    st = xknn_mpi_index_search(&x, query, query_root, k, out, stats, err);
    xknn_mpi_index_destroy(&x);
    return st;
}

xknn_status xknn_mpi_self_join(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                               int64_t ref_offset, int64_t k, const xknn_mpi_output *out, xknn_mpi_stats *stats,
                               xknn_error *err)
{
    return xknn_mpi_search(ctx, params, ref, ref_offset, NULL, XKNN_MPI_SELF_JOIN, k, out, stats, err);
}

xknn_status xknn_mpi_search_gather(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                                   int64_t ref_offset, const xknn_matrix *query, int query_root, int64_t k,
                                   int gather_root, int64_t *ids, float *dist, xknn_error *err)
{
    xknn_mpi_output out = XKNN_MPI_OUTPUT_INIT;
    out.gather_root = gather_root;
    out.ids = ids;
    out.dist = dist;
    return xknn_mpi_search(ctx, params, ref, ref_offset, query_root == XKNN_MPI_SELF_JOIN ? NULL : query, query_root,
                           k, &out, NULL, err);
}
