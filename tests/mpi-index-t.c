/* SPDX-License-Identifier: MIT */
/* mpi-index-t: the resident distributed index (xknn_mpi_index_*) under mpirun, any rank
 * count. Slices of unequal sizes (an empty one from 3 ranks on), tie-heavy integer data
 * (n not a multiple of anything); every search compared byte for byte with
 * xknn_mpi_search_gather on the same rows and with the oracle; updates between searches;
 * bad values at create and update agreed on every rank. XKNN_TEST_BACKEND=cuda runs
 * the same with the backend auto (the slice resident on the GPU). TAP on rank 0. */
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

enum { N = 613, D = 8, NQ = 37 };

static int rank, size;
static xknn_mpi_context *ctx;
static float all[N * D], qry[NQ * D];
static int64_t row0s[64], rowss[64];

/* Unequal slices: rank r's share grows with r; rank 1's is empty from 3 ranks on. */
static void partition(void)
{
    int64_t w = 0, at = 0;
    int r;
    for (r = 0; r < size; r++) w += (size >= 3 && r == 1) ? 0 : r + 1;
    for (r = 0; r < size; r++) {
        const int64_t wr = (size >= 3 && r == 1) ? 0 : r + 1;
        rowss[r] = r == size - 1 ? N - at : N * wr / w;
        row0s[r] = at;
        at += rowss[r];
    }
}

static xknn_params params_for(xknn_metric m)
{
    xknn_params p = XKNN_PARAMS_INIT;
    const char *b = getenv("XKNN_TEST_BACKEND");
    p.metric = m;
    p.backend = b && !strcmp(b, "cuda") ? XKNN_BACKEND_AUTO : XKNN_BACKEND_CPU;
    return p;
}

static xknn_matrix my_rows(void)
{
    xknn_matrix m = XKNN_MATRIX_F32(all + row0s[rank] * D, rowss[rank], D);
    return m;
}

/* The index's gathered result equals xknn_mpi_search_gather's on the rows in `all` and
 * the oracle's: two tests on rank 0. */
static void compare(xknn_mpi_index *ix, xknn_metric m, int64_t k, const char *what)
{
    static int64_t ids[NQ * N], ids2[NQ * N], want[NQ * N];
    static float dist[NQ * N], dist2[NQ * N], wdist[NQ * N];
    const xknn_params p = params_for(m);
    const xknn_matrix mine = my_rows(), q = XKNN_MATRIX_F32(qry, NQ, D);
    xknn_error e1, e2;
    const xknn_status s1 = xknn_mpi_index_search_gather(ix, rank == 0 ? &q : NULL, 0, k, 0, ids, dist, &e1);
    const xknn_status s2 = xknn_mpi_search_gather(ctx, &p, rowss[rank] > 0 ? &mine : NULL, row0s[rank],
                                                  rank == 0 ? &q : NULL, 0, k, 0, ids2, dist2, &e2);
    ref_spec rs;
    if (rank != 0) return;
    if (s1 != XKNN_SUCCESS) diag("index search: %s", e1.message);
    if (s2 != XKNN_SUCCESS) diag("xknn_mpi_search_gather: %s", e2.message);
    memset(&rs, 0, sizeof rs);
    rs.metric = (int)m;
    rs.dtype = REF_F32;
    ref_knn_ex(&rs, all, N, D, qry, NQ, D, D, k, 0, 0, 0, want, wdist);
    ok(s1 == XKNN_SUCCESS && s2 == XKNN_SUCCESS && !memcmp(ids, ids2, (size_t)(NQ * k) * sizeof *ids) &&
           !memcmp(dist, dist2, (size_t)(NQ * k) * sizeof *dist),
       "%s: %s k=%lld: the index gives xknn_mpi_search's bytes", what, xknn_metric_name(m), (long long)k);
    is_knn_equal(ids, dist, want, wdist, NQ, k, "%s: %s k=%lld equals the oracle", what, xknn_metric_name(m),
                 (long long)k);
}

/* Rows [1, 3) of every slice of at least 3 rows replaced: in `all` for every slice (each
 * rank keeps the whole data set for the checks), in the index for this rank's. */
static xknn_status update_rows(xknn_mpi_index *ix, float v, xknn_error *e)
{
    int r;
    int64_t i;
    for (r = 0; r < size; r++)
        if (rowss[r] >= 3)
            for (i = 0; i < 2 * D; i++) all[(row0s[r] + 1) * D + i] = v + (float)(i % 3);
    {
        const int64_t n = rowss[rank] >= 3 ? 2 : 0;
        xknn_matrix rows = XKNN_MATRIX_F32(all + (row0s[rank] + 1) * D, n, D);
        return xknn_mpi_index_update(ix, 1, n > 0 ? &rows : NULL, e);
    }
}

static void run_metric(xknn_metric m)
{
    const xknn_params p = params_for(m);
    const size_t bytes = (size_t)(rowss[rank] > 0 ? rowss[rank] : 1) * D * sizeof(float);
    float *copy = (float *)malloc(sizeof all), *src = (float *)malloc(bytes);
    xknn_matrix mine = XKNN_MATRIX_F32(src, rowss[rank], D);
    xknn_mpi_index *ix = NULL;
    xknn_error e;
    xknn_status st;
    if (!copy || !src) bail("out of memory");
    memcpy(copy, all, sizeof all);
    memcpy(src, all + row0s[rank] * D, (size_t)rowss[rank] * D * sizeof(float));
    st = xknn_mpi_index_create(ctx, &p, rowss[rank] > 0 ? &mine : NULL, row0s[rank], &ix, &e);
    if (st != XKNN_SUCCESS) bail("xknn_mpi_index_create: %s", e.message);
    /* the index holds its own copy: the caller's rows may go after create */
    memset(src, 0xff, bytes); /* NaN patterns */
    free(src);
    compare(ix, m, 1, "created");
    compare(ix, m, 7, "created");
    compare(ix, m, N, "created, k = n");
    st = update_rows(ix, 2.0f, &e);
    if (rank == 0) ok(st == XKNN_SUCCESS, "%s: update of rows 1..2 of each slice", xknn_metric_name(m));
    compare(ix, m, 7, "after an update");
    /* a bad value: refused everywhere, no slice changed */
    if (rowss[rank] >= 3 && rank == size - 1) {
        float bad[D];
        xknn_matrix b = XKNN_MATRIX_F32(bad, 1, D);
        memset(bad, 0, sizeof bad);
        bad[3] = NAN;
        st = xknn_mpi_index_update(ix, 2, &b, &e);
    } else {
        st = xknn_mpi_index_update(ix, 0, NULL, &e);
    }
    same_everywhere(st, &e, XKNN_ERROR_INVALID_VALUE, "NaN", "update with a NaN on the last rank");
    compare(ix, m, 7, "after a refused update");
    xknn_mpi_index_destroy(ix);
    memcpy(all, copy, sizeof all);
    free(copy);
}

int main(int argc, char **argv)
{
    xknn_error e;
    xknn_status st;
    int provided = 0;
    const xknn_metric metrics[] = {XKNN_METRIC_L2, XKNN_METRIC_L1, XKNN_METRIC_IP};
    unsigned mi;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 64) bail("at most 64 ranks");
    if (rank == 0) plan(3 * 12 + 2);
    if (xknn_mpi_create(MPI_COMM_WORLD, NULL, &ctx, &e) != XKNN_SUCCESS) bail("xknn_mpi_create: %s", e.message);
    partition();
    ref_make_data(DATA_INTEGER, all, N, D, 11);
    ref_make_data(DATA_INTEGER, qry, NQ, D, 12);
    for (mi = 0; mi < sizeof metrics / sizeof metrics[0]; mi++) run_metric(metrics[mi]);
    {
        /* a NaN in one slice at create: no index anywhere, the same message */
        const xknn_params p = params_for(XKNN_METRIC_L2);
        xknn_matrix mine = my_rows();
        xknn_mpi_index *ix = (xknn_mpi_index *)&e; /* must become NULL */
        const float keep = all[(N - 1) * D + 5];
        all[(N - 1) * D + 5] = INFINITY;
        st = xknn_mpi_index_create(ctx, &p, rowss[rank] > 0 ? &mine : NULL, row0s[rank], &ix, &e);
        same_everywhere(st, &e, XKNN_ERROR_INVALID_VALUE, "612", "create with an Inf in the last row");
        if (rank == 0) ok(ix == NULL, "a failed create leaves no index");
        all[(N - 1) * D + 5] = keep;
        if (ix != (xknn_mpi_index *)&e) xknn_mpi_index_destroy(ix);
    }
    xknn_mpi_destroy(ctx);
    MPI_Finalize();
    return rank == 0 ? tap_done() : 0;
}
