/* SPDX-License-Identifier: MIT */
/* mpi-borrow-t: the borrowed index (xknn_mpi_index_borrow, xknn_mpi_index_self_join)
 * under mpirun, any rank count. Its searches and self-joins give the bytes of
 * xknn_mpi_search_gather on the same rows (the one-shot search is a borrowed index on
 * the stack); a second search on it gives them again; values vouched for skip the scan
 * but not the metric's checks; updates are refused; a NaN in a slice still stops the
 * first search on every rank with one message. TAP on rank 0. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/ref.h"
#include "mpi_agree.h"
#include "tap/tap.h"
#include "xknn.h"
#include "xknn_mpi.h"

enum { N = 401, D = 6, NQ = 29, K = 5 };

static int rank, size;
static xknn_mpi_context *ctx;
static float all[N * D], qry[NQ * D];
static int64_t row0, rows;

static void same_bytes(int self, int values_checked)
{
    const int64_t nq = self ? N : NQ;
    int64_t *gi = (int64_t *)malloc((size_t)(N * K) * sizeof(int64_t));
    int64_t *gi2 = (int64_t *)malloc((size_t)(N * K) * sizeof(int64_t));
    float *gd = (float *)malloc((size_t)(N * K) * sizeof(float));
    float *gd2 = (float *)malloc((size_t)(N * K) * sizeof(float));
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix mine = XKNN_MATRIX_F32(all + row0 * D, rows, D), q = XKNN_MATRIX_F32(qry, NQ, D);
    xknn_mpi_output out = XKNN_MPI_OUTPUT_INIT;
    xknn_mpi_index *ix = NULL;
    xknn_error e1, e2;
    xknn_status s1, s2, s3 = XKNN_SUCCESS;
    int again = 1, t;
    if (!gi || !gi2 || !gd || !gd2) bail("out of memory");
    p.backend = XKNN_BACKEND_CPU;
    s2 = xknn_mpi_search_gather(ctx, &p, rows > 0 ? &mine : NULL, row0, rank == 0 ? &q : NULL,
                                self ? XKNN_MPI_SELF_JOIN : 0, K, 0, gi2, gd2, &e2);
    p.values_checked = values_checked;
    s1 = xknn_mpi_index_borrow(ctx, &p, rows > 0 ? &mine : NULL, row0, &ix, &e1);
    out.gather_root = 0;
    out.ids = gi;
    out.dist = gd;
    for (t = 0; t < 2 && s1 == XKNN_SUCCESS; t++) {
        memset(gi, 0, (size_t)(N * K) * sizeof(int64_t));
        s1 = self ? xknn_mpi_index_self_join(ix, K, &out, NULL, &e1)
                  : xknn_mpi_index_search(ix, rank == 0 ? &q : NULL, 0, K, &out, NULL, &e1);
        if (rank == 0 && s1 == XKNN_SUCCESS)
            again = again && !memcmp(gi, gi2, (size_t)(nq * K) * sizeof *gi) &&
                    !memcmp(gd, gd2, (size_t)(nq * K) * sizeof *gd);
    }
    if (s1 == XKNN_SUCCESS) {
        xknn_matrix one = XKNN_MATRIX_F32(all, 1, D);
        s3 = xknn_mpi_index_update(ix, 0, rows > 0 ? &one : NULL, &e2);
    }
    xknn_mpi_index_destroy(ix);
    if (rank == 0) {
        if (s1 != XKNN_SUCCESS) diag("borrowed index: %s", e1.message);
        ok(s1 == XKNN_SUCCESS && s2 == XKNN_SUCCESS && again,
           "%s%s: two searches of a borrowed index give xknn_mpi_search_gather's bytes", self ? "self-join" : "search",
           values_checked ? " (values vouched for)" : "");
    }
    same_everywhere(s3, &e2, XKNN_ERROR_INVALID_ARGUMENT, "borrowed", "update of a borrowed index");
    free(gi);
    free(gi2);
    free(gd);
    free(gd2);
}

int main(int argc, char **argv)
{
    xknn_error e;
    xknn_status st;
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == 0) plan(4 * 2 + 3);
    if (xknn_mpi_create(MPI_COMM_WORLD, NULL, &ctx, &e) != XKNN_SUCCESS) bail("xknn_mpi_create: %s", e.message);
    xknn_mpi_slice(N, rank, size, &row0, &rows);
    ref_make_data(DATA_INTEGER, all, N, D, 21);
    ref_make_data(DATA_INTEGER, qry, NQ, D, 22);
    same_bytes(0, 0);
    same_bytes(0, 1);
    same_bytes(1, 0);
    same_bytes(1, 1);
    {
        /* vouched-for values: the metric's checks still run, at borrow */
        xknn_params p = XKNN_PARAMS_INIT;
        xknn_matrix mine = XKNN_MATRIX_F32(all + row0 * D, rows, D);
        xknn_mpi_index *ix = (xknn_mpi_index *)&e;
        p.backend = XKNN_BACKEND_CPU;
        p.metric = XKNN_METRIC_HAMMING; /* not on float32 rows */
        p.values_checked = 1;
        st = xknn_mpi_index_borrow(ctx, &p, rows > 0 ? &mine : NULL, row0, &ix, &e);
        same_everywhere(st, &e, XKNN_ERROR_INVALID_ARGUMENT, NULL, "borrow with a metric the dtype does not take");
        if (rank == 0) ok(ix == NULL, "a failed borrow leaves no index");
        if (ix != (xknn_mpi_index *)&e) xknn_mpi_index_destroy(ix);
    }
    {
        /* values not vouched for: the first search finds the NaN, on every rank */
        xknn_params p = XKNN_PARAMS_INIT;
        xknn_matrix mine = XKNN_MATRIX_F32(all + row0 * D, rows, D), q = XKNN_MATRIX_F32(qry, NQ, D);
        xknn_mpi_index *ix = NULL;
        static int64_t ids[NQ * K];
        all[(N - 1) * D + 2] = NAN;
        p.backend = XKNN_BACKEND_CPU;
        st = xknn_mpi_index_borrow(ctx, &p, rows > 0 ? &mine : NULL, row0, &ix, &e);
        if (st == XKNN_SUCCESS) st = xknn_mpi_index_search_gather(ix, rank == 0 ? &q : NULL, 0, K, 0, ids, NULL, &e);
        same_everywhere(st, &e, XKNN_ERROR_INVALID_VALUE, "400", "a NaN in the last row stops the first search");
        xknn_mpi_index_destroy(ix);
    }
    xknn_mpi_destroy(ctx);
    MPI_Finalize();
    return rank == 0 ? tap_done() : 0;
}
