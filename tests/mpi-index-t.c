/* SPDX-License-Identifier: MIT */
/* mpi-index-t: the resident distributed index (xknn_mpi_index_*) under mpirun, any rank
 * count. Slices of unequal sizes (an empty one from 3 ranks on), tie-heavy integer data
 * (n not a multiple of anything); every search compared byte for byte with
 * xknn_mpi_search_gather on the same rows and with the oracle; updates between searches;
 * bad values at create and update agreed on every rank; the index's self-join against
 * xknn_mpi_self_join. XKNN_TEST_BACKEND=cuda runs the same with the backend auto (the
 * slice resident on the GPU); XKNN_TEST_MEMORY=device passes every slice, query and
 * update row in device memory (the one-shot search too), against host-memory
 * searches (1..0 # SKIP without a CUDA device). TAP on rank 0. */
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
#ifdef XKNN_TEST_HAVE_CUDA_RT
#include <cuda_runtime_api.h>
#endif

enum { N = 613, D = 8, NQ = 37 };

static int rank, size, dev_mode;
static xknn_mpi_context *ctx;
static float all[N * D], qry[NQ * D];
static int64_t row0s[64], rowss[64];

/* bytes of host in the memory under test: device memory with XKNN_TEST_MEMORY=device,
 * else a host copy. Freed with mem_free, which first overwrites them (the library must
 * have taken its own copy). */
static void *mem_copy(const void *host, size_t bytes)
{
    void *p = NULL;
    if (!bytes) bytes = sizeof(float);
#ifdef XKNN_TEST_HAVE_CUDA_RT
    if (dev_mode) {
        if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
            bail("device memory for the test: %s", cudaGetErrorString(cudaGetLastError()));
        return p;
    }
#endif
    if (!(p = malloc(bytes))) bail("out of memory");
    memcpy(p, host, bytes);
    return p;
}

static void mem_free(void *p, size_t bytes)
{
#ifdef XKNN_TEST_HAVE_CUDA_RT
    if (dev_mode) {
        (void)cudaMemset(p, 0xff, bytes ? bytes : sizeof(float)); /* NaN patterns */
        (void)cudaFree(p);
        return;
    }
#endif
    memset(p, 0xff, bytes ? bytes : sizeof(float));
    free(p);
}

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
    static int64_t ids3[NQ * N];
    static float dist3[NQ * N];
    const xknn_params p = params_for(m);
    const xknn_matrix mine = my_rows(), q = XKNN_MATRIX_F32(qry, NQ, D);
    const size_t rbytes = (size_t)rowss[rank] * D * sizeof(float);
    void *dq = mem_copy(qry, sizeof qry), *dr = mem_copy(all + row0s[rank] * D, rbytes);
    const xknn_matrix qm = XKNN_MATRIX_F32(dq, NQ, D), rm = XKNN_MATRIX_F32(dr, rowss[rank], D);
    xknn_error e1, e2, e3;
    const xknn_status s1 = xknn_mpi_index_search_gather(ix, rank == 0 ? &qm : NULL, 0, k, 0, ids, dist, &e1);
    const xknn_status s2 = xknn_mpi_search_gather(ctx, &p, rowss[rank] > 0 ? &mine : NULL, row0s[rank],
                                                  rank == 0 ? &q : NULL, 0, k, 0, ids2, dist2, &e2);
    /* the one-shot search on the memory under test */
    const xknn_status s3 = xknn_mpi_search_gather(ctx, &p, rowss[rank] > 0 ? &rm : NULL, row0s[rank],
                                                  rank == 0 ? &qm : NULL, 0, k, 0, ids3, dist3, &e3);
    ref_spec rs;
    mem_free(dq, sizeof qry);
    mem_free(dr, rbytes);
    if (rank != 0) return;
    if (s1 != XKNN_SUCCESS) diag("index search: %s", e1.message);
    if (s2 != XKNN_SUCCESS) diag("xknn_mpi_search_gather: %s", e2.message);
    if (s3 != XKNN_SUCCESS) diag("xknn_mpi_search_gather (memory under test): %s", e3.message);
    memset(&rs, 0, sizeof rs);
    rs.metric = (int)m;
    rs.dtype = REF_F32;
    ref_knn_ex(&rs, all, N, D, qry, NQ, D, D, k, 0, 0, 0, want, wdist);
    ok(s1 == XKNN_SUCCESS && s2 == XKNN_SUCCESS && s3 == XKNN_SUCCESS &&
           !memcmp(ids, ids2, (size_t)(NQ * k) * sizeof *ids) && !memcmp(dist, dist2, (size_t)(NQ * k) * sizeof *dist) &&
           !memcmp(ids3, ids2, (size_t)(NQ * k) * sizeof *ids) && !memcmp(dist3, dist2, (size_t)(NQ * k) * sizeof *dist),
       "%s: %s k=%lld: the index gives xknn_mpi_search's bytes", what, xknn_metric_name(m), (long long)k);
    is_knn_equal(ids, dist, want, wdist, NQ, k, "%s: %s k=%lld equals the oracle", what, xknn_metric_name(m),
                 (long long)k);
}

/* The index's self-join, gathered on rank 0, equals xknn_mpi_self_join's on the rows in
 * `all`: one test on rank 0. */
static void compare_self(xknn_mpi_index *ix, xknn_metric m, int64_t k)
{
    static int64_t ids[N * 8], ids2[N * 8];
    static float dist[N * 8], dist2[N * 8];
    const xknn_params p = params_for(m);
    const xknn_matrix mine = my_rows();
    xknn_mpi_output o1 = XKNN_MPI_OUTPUT_INIT, o2 = XKNN_MPI_OUTPUT_INIT;
    xknn_error e1, e2;
    xknn_status s1, s2;
    o1.gather_root = o2.gather_root = 0;
    o1.ids = ids, o1.dist = dist, o2.ids = ids2, o2.dist = dist2;
    memset(ids, 0x5a, sizeof ids); /* unlike patterns: a gather that wrote nothing fails */
    memset(ids2, 0xa5, sizeof ids2);
    s1 = xknn_mpi_index_self_join(ix, k, &o1, NULL, &e1);
    s2 = xknn_mpi_self_join(ctx, &p, rowss[rank] > 0 ? &mine : NULL, row0s[rank], k, &o2, NULL, &e2);
    if (rank != 0) return;
    if (s1 != XKNN_SUCCESS) diag("index self-join: %s", e1.message);
    if (s2 != XKNN_SUCCESS) diag("xknn_mpi_self_join: %s", e2.message);
    ok(s1 == XKNN_SUCCESS && s2 == XKNN_SUCCESS && !memcmp(ids, ids2, (size_t)(N * k) * sizeof *ids) &&
           !memcmp(dist, dist2, (size_t)(N * k) * sizeof *dist),
       "%s k=%lld: the index's self-join gives xknn_mpi_self_join's bytes", xknn_metric_name(m), (long long)k);
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
        void *src = mem_copy(all + (row0s[rank] + 1) * D, (size_t)(n * D) * sizeof(float));
        xknn_matrix rows = XKNN_MATRIX_F32(src, n, D);
        const xknn_status st = xknn_mpi_index_update(ix, 1, n > 0 ? &rows : NULL, e);
        mem_free(src, (size_t)(n * D) * sizeof(float));
        return st;
    }
}

static void run_metric(xknn_metric m)
{
    const xknn_params p = params_for(m);
    const size_t bytes = (size_t)(rowss[rank] > 0 ? rowss[rank] : 1) * D * sizeof(float);
    float *copy = (float *)malloc(sizeof all);
    void *src = mem_copy(all + row0s[rank] * D, bytes);
    xknn_matrix mine = XKNN_MATRIX_F32(src, rowss[rank], D);
    xknn_mpi_index *ix = NULL;
    xknn_error e;
    xknn_status st;
    if (!copy) bail("out of memory");
    memcpy(copy, all, sizeof all);
    st = xknn_mpi_index_create(ctx, &p, rowss[rank] > 0 ? &mine : NULL, row0s[rank], &ix, &e);
    if (st != XKNN_SUCCESS) bail("xknn_mpi_index_create: %s", e.message);
    /* the index holds its own copy: the caller's rows may go after create */
    mem_free(src, bytes);
    compare(ix, m, 1, "created");
    compare_self(ix, m, 5);
    compare(ix, m, 7, "created");
    compare(ix, m, N, "created, k = n");
    st = update_rows(ix, 2.0f, &e);
    if (rank == 0) ok(st == XKNN_SUCCESS, "%s: update of rows 1..2 of each slice", xknn_metric_name(m));
    compare(ix, m, 7, "after an update");
    /* a bad value: refused everywhere, no slice changed */
    if (rowss[rank] >= 3 && rank == size - 1) {
        float bad[D];
        void *db;
        memset(bad, 0, sizeof bad);
        bad[3] = NAN;
        db = mem_copy(bad, sizeof bad);
        {
            xknn_matrix b = XKNN_MATRIX_F32(db, 1, D);
            st = xknn_mpi_index_update(ix, 2, &b, &e);
        }
        mem_free(db, sizeof bad);
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
    if (xknn_mpi_create(MPI_COMM_WORLD, NULL, &ctx, &e) != XKNN_SUCCESS) bail("xknn_mpi_create: %s", e.message);
    if (getenv("XKNN_TEST_MEMORY") && !strcmp(getenv("XKNN_TEST_MEMORY"), "device")) {
        int have = 0;
#ifdef XKNN_TEST_HAVE_CUDA_RT
        have = xknn_mpi_device(ctx) >= 0 && cudaSetDevice(xknn_mpi_device(ctx)) == cudaSuccess;
#endif
        MPI_Allreduce(MPI_IN_PLACE, &have, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!have) {
            if (rank == 0) printf("1..0 # SKIP no CUDA device\n");
            xknn_mpi_destroy(ctx);
            MPI_Finalize();
            return 0;
        }
        dev_mode = 1;
    }
    if (rank == 0) plan(3 * 13 + 2);
    partition();
    ref_make_data(DATA_INTEGER, all, N, D, 11);
    ref_make_data(DATA_INTEGER, qry, NQ, D, 12);
    for (mi = 0; mi < sizeof metrics / sizeof metrics[0]; mi++) run_metric(metrics[mi]);
    {
        /* a NaN in one slice at create: no index anywhere, the same message */
        const xknn_params p = params_for(XKNN_METRIC_L2);
        const size_t bytes = (size_t)rowss[rank] * D * sizeof(float);
        xknn_mpi_index *ix = (xknn_mpi_index *)&e; /* must become NULL */
        const float keep = all[(N - 1) * D + 5];
        void *src;
        all[(N - 1) * D + 5] = INFINITY;
        src = mem_copy(all + row0s[rank] * D, bytes);
        {
            xknn_matrix mine = XKNN_MATRIX_F32(src, rowss[rank], D);
            st = xknn_mpi_index_create(ctx, &p, rowss[rank] > 0 ? &mine : NULL, row0s[rank], &ix, &e);
        }
        mem_free(src, bytes);
        same_everywhere(st, &e, XKNN_ERROR_INVALID_VALUE, "612", "create with an Inf in the last row");
        if (rank == 0) ok(ix == NULL, "a failed create leaves no index");
        all[(N - 1) * D + 5] = keep;
        if (ix != (xknn_mpi_index *)&e) xknn_mpi_index_destroy(ix);
    }
    xknn_mpi_destroy(ctx);
    MPI_Finalize();
    return rank == 0 ? tap_done() : 0;
}
