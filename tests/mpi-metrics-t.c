/* SPDX-License-Identifier: MIT */
/*
 * mpi-metrics-t: every metric family and dtype through the distributed layer, gathered
 * on rank 0 and compared with the oracle byte for byte, for whatever rank count mpirun
 * gives (the plan does not depend on it); and the agreed errors of the new checks.
 * `mpi-metrics-t cuda`: the searches on the CUDA backend (every rank on its device, the
 * ranks sharing one when there are fewer devices); skips without a CUDA device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "common.h"
#include "ref/ref.h"
#include "tap/tap.h"
#include "xknn.h"
#include "xknn_mpi.h"

static int rank, size;
static xknn_backend backend = XKNN_BACKEND_CPU;

typedef struct {
    xknn_metric metric;
    double p;
    xknn_dtype dtype;
    data_kind kind;
    int64_t n, nq, d, k; /* nq = 0: self-join; k = 0: n (n - 1 self) */
    int64_t qb;          /* config query_block */
    int uneven;          /* 1: the last rank holds nothing (P > 1) */
} dcase;

static const dcase cases[] = {
    {XKNN_METRIC_IP, 0, XKNN_DTYPE_F32, DATA_GAUSSIAN, 211, 45, 17, 9, 8, 0},
    {XKNN_METRIC_IP, 0, XKNN_DTYPE_I8, DATA_INTEGER, 150, 0, 6, 0, 16, 1},
    {XKNN_METRIC_COSINE, 0, XKNN_DTYPE_I8, DATA_DUPLICATES, 120, 0, 9, 7, 11, 0},
    {XKNN_METRIC_L1, 0, XKNN_DTYPE_U8, DATA_INTEGER, 173, 30, 5, 100, 7, 1},
    {XKNN_METRIC_MINKOWSKI, 2.5, XKNN_DTYPE_F16, DATA_UNIFORM, 160, 21, 13, 7, 0, 0},
    {XKNN_METRIC_CHEBYSHEV, 0, XKNN_DTYPE_F32, DATA_DUPLICATES, 140, 25, 4, 0, 6, 1},
    {XKNN_METRIC_HELLINGER, 0, XKNN_DTYPE_BF16, DATA_CLUSTERED, 130, 19, 40, 7, 5, 0},
    {XKNN_METRIC_HAMMING, 0, XKNN_DTYPE_BIN, DATA_INTEGER, 190, 0, 70, 7, 13, 0},
    {XKNN_METRIC_WHAMMING, 0, XKNN_DTYPE_BIN, DATA_UNIFORM, 170, 33, 130, 10, 9, 1},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

static int all_ok(int mine)
{
    int all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

static void slice(const dcase *c, int r, int64_t *row0, int64_t *rows)
{
    if (c->uneven && size > 1) {
        if (r == size - 1) {
            *row0 = 0;
            *rows = 0;
        } else {
            xknn_mpi_slice(c->n, r, size - 1, row0, rows);
        }
    } else {
        xknn_mpi_slice(c->n, r, size, row0, rows);
    }
}

static void run_case(const dcase *c)
{
    const int self = c->nq == 0;
    const int64_t nq = self ? c->n : c->nq, d = c->d;
    const int64_t k = c->k > 0 ? c->k : (self ? c->n - 1 : c->n);
    const int64_t ld = ref_row_elems((int)c->dtype, d), rb = xknn_row_bytes(c->dtype, d);
    unsigned char *all = ref_make_typed(c->kind, (int)c->dtype, c->n, d, 31);
    unsigned char *qry = self ? NULL : ref_make_typed(c->kind, (int)c->dtype, nq, d, 32);
    float *w = NULL;
    int64_t row0, rows, *ids = NULL, *wids = NULL;
    float *dist = NULL, *wdist = NULL;
    xknn_mpi_config cfg = XKNN_MPI_CONFIG_INIT;
    xknn_mpi_context *ctx = NULL;
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix mref, mq = XKNN_MATRIX_TYPED(qry, nq, d, c->dtype);
    xknn_error err;
    xknn_status st;
    int good = 1;
    char label[200];

    snprintf(label, sizeof label, "%s p=%g %s %s n=%lld nq=%lld d=%lld k=%lld qb=%lld%s%s P=%d",
             xknn_metric_name(c->metric), c->p, xknn_dtype_name(c->dtype), ref_data_name(c->kind), (long long)c->n,
             (long long)nq, (long long)d, (long long)k, (long long)c->qb, self ? " self" : "",
             c->uneven ? " last-rank-empty" : "", size);
    if (c->metric == XKNN_METRIC_HELLINGER) {
        ref_make_nonnegative((int)c->dtype, all, c->n * ld);
        if (qry) ref_make_nonnegative((int)c->dtype, qry, nq * ld);
    }
    if (c->metric == XKNN_METRIC_WHAMMING) {
        uint64_t s = 77;
        int64_t b;
        w = (float *)malloc((size_t)d * sizeof(float));
        for (b = 0; b < d; b++) w[b] = (float)((int)(ref_rand_u64(&s) % 5) - 1) * 0.5f;
    }
    slice(c, rank, &row0, &rows);
    mref = (xknn_matrix)XKNN_MATRIX_TYPED(all + row0 * rb, rows, d, c->dtype);
    params_metric(&p, c->metric, c->p, w, d);
    p.backend = backend;
    cfg.query_block = c->qb;
    if (rank == 0) {
        ids = (int64_t *)malloc((size_t)(nq * k) * sizeof(int64_t));
        dist = (float *)malloc((size_t)(nq * k) * sizeof(float));
        memset(ids, 0xab, (size_t)(nq * k) * sizeof(int64_t));
    }
    st = xknn_mpi_create(MPI_COMM_WORLD, &cfg, &ctx, &err);
    if (st == XKNN_SUCCESS)
        st = xknn_mpi_search_gather(ctx, &p, rows > 0 ? &mref : NULL, row0, rank == 0 ? &mq : NULL,
                                    self ? XKNN_MPI_SELF_JOIN : 0, k, 0, ids, dist, &err);
    if (st != XKNN_SUCCESS) good = 0;
    if (rank == 0) {
        ref_spec spec;
        spec.metric = (int)c->metric;
        spec.dtype = (int)c->dtype;
        spec.p = c->p;
        spec.weights = w;
        wids = (int64_t *)malloc((size_t)(nq * k) * sizeof(int64_t));
        wdist = (float *)malloc((size_t)(nq * k) * sizeof(float));
        ref_knn_ex(&spec, all, c->n, ld, qry, nq, ld, d, k, self, 0, 0, wids, wdist);
        good = all_ok(good);
        if (!good)
            ok(0, "%s: %s", label, err.message);
        else
            is_knn_equal(ids, dist, wids, wdist, nq, k, "%s", label);
    } else {
        all_ok(good);
    }
    if (ctx) xknn_mpi_destroy(ctx);
    FREE_ALL(all, qry, w, ids, dist, wids, wdist);
}

/* every rank gets the same status and a message containing `part` */
static void same_everywhere(xknn_status st, const xknn_error *err, xknn_status want, const char *part,
                            const char *what)
{
    const int mine = st == want && strstr(err->message, part) != NULL;
    const int good = all_ok(mine);
    if (rank == 0) ok(good, "%s: every rank returns '%s' (rank 0: %s)", what, part, err->message);
}

static void error_cases(void)
{
    const int64_t n = 40, d = 3;
    float *all = (float *)malloc((size_t)(n * d) * sizeof(float));
    int8_t q8[2 * 3] = {1, 2, 3, 4, 5, 6};
    int64_t row0, rows, ids[2 * 3];
    float dist[2 * 3];
    xknn_mpi_config cfg = XKNN_MPI_CONFIG_INIT;
    xknn_mpi_context *ctx = NULL;
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix mref, mq = XKNN_MATRIX_TYPED(q8, 2, 3, XKNN_DTYPE_I8);
    xknn_error err;
    xknn_status st;
    char want[160];
    int64_t i;

    for (i = 0; i < n * d; i++) all[i] = (float)(i % 7);
    all[(n - 1) * d + 2] = -1.0f; /* last row, held by the last rank */
    xknn_mpi_slice(n, rank, size, &row0, &rows);
    mref = (xknn_matrix)XKNN_MATRIX_F32(all + row0 * d, rows, d);
    xknn_mpi_create(MPI_COMM_WORLD, &cfg, &ctx, &err);

    p.metric = XKNN_METRIC_HELLINGER;
    st = xknn_mpi_self_join(ctx, &p, &mref, row0, 3, NULL, NULL, &err);
    snprintf(want, sizeof want, "rank %d: reference row %lld column 2 is -1: hellinger needs non-negative", size - 1,
             (long long)(n - 1));
    same_everywhere(st, &err, XKNN_ERROR_INVALID_VALUE, want, "hellinger negative value on the last rank");

    p.metric = XKNN_METRIC_L1;
    st = xknn_mpi_search_gather(ctx, &p, &mref, row0, rank == 0 ? &mq : NULL, 0, 3, 0, ids, dist, &err);
    same_everywhere(st, &err, XKNN_ERROR_INVALID_ARGUMENT, "dtype mismatch: references are f32, queries (rank 0) are i8",
                    "query dtype differs from the references");

    p.metric = XKNN_METRIC_MINKOWSKI;
    p.p = rank == size - 1 ? 3.0 : 2.0;
    st = xknn_mpi_self_join(ctx, &p, &mref, row0, 3, NULL, NULL, &err);
    if (size > 1)
        same_everywhere(st, &err, XKNN_ERROR_INVALID_ARGUMENT, "params p differs between ranks",
                        "minkowski p differs between ranks");
    else
        same_everywhere(st == XKNN_ERROR_INVALID_ARGUMENT ? XKNN_SUCCESS : st, &err, XKNN_SUCCESS, "",
                        "minkowski p differs between ranks (one rank: nothing to differ)");

    p.metric = XKNN_METRIC_HAMMING;
    p.p = 0;
    st = xknn_mpi_self_join(ctx, &p, &mref, row0, 3, NULL, NULL, &err);
    same_everywhere(st, &err, XKNN_ERROR_INVALID_ARGUMENT, "needs bit-packed input", "hamming on float input");

    xknn_mpi_destroy(ctx);
    free(all);
}

int main(int argc, char **argv)
{
    int c;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 1 && !strcmp(argv[1], "cuda")) {
        if (!xknn_backend_built(XKNN_BACKEND_CUDA) || xknn_cuda_device_count() == 0) {
            if (rank == 0) printf("1..0 # SKIP no CUDA device\n");
            MPI_Finalize();
            return 0;
        }
        backend = XKNN_BACKEND_CUDA;
    }
    if (rank == 0) plan(NCASES + 4);
    for (c = 0; c < NCASES; c++) run_case(&cases[c]);
    error_cases();
    c = rank == 0 ? tap_done() : 0;
    MPI_Finalize();
    return c;
}
