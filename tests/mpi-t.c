/* SPDX-License-Identifier: MIT */
/*
 * mpi-t: the distributed layer (xknn_mpi.h) against the oracle and against one
 * single-process xknn_search, byte for byte, for whatever rank count mpirun gives.
 * Every rank runs the same sequence; only rank 0 prints TAP; each check is combined
 * over ranks first. The plan does not depend on the rank count.
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

/* 1 on every rank iff mine is 1 on every rank. */
static int all_ok(int mine)
{
    int all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all;
}

/* How a case slices the references over ranks. */
enum { SLICE_STANDARD = 0, SLICE_SKEWED, SLICE_REVERSED, SLICE_LAST_EMPTY };

static void slice_of(int how, int64_t n, int r, int P, int64_t *row0, int64_t *rows)
{
    if (how == SLICE_STANDARD) {
        xknn_mpi_slice(n, r, P, row0, rows);
    } else if (how == SLICE_LAST_EMPTY && P > 1) {
        /* the standard slicing over P - 1 ranks; the last rank has nothing */
        if (r < P - 1) {
            xknn_mpi_slice(n, r, P - 1, row0, rows);
        } else {
            *row0 = 0;
            *rows = 0;
        }
    } else if (how == SLICE_LAST_EMPTY) {
        xknn_mpi_slice(n, r, P, row0, rows);
    } else if (how == SLICE_REVERSED) {
        xknn_mpi_slice(n, P - 1 - r, P, row0, rows); /* rank order != row order */
    } else {
        /* rank 0: all but a few rows; rank 1: 1 row; rank 2: 2 rows; others empty */
        int64_t small = P > 2 ? 3 : (P > 1 ? 1 : 0);
        if (small > n - 1) small = 0;
        if (r == 0) {
            *row0 = 0;
            *rows = n - small;
        } else if (r == 1) {
            *row0 = n - small;
            *rows = small >= 1 ? 1 : 0;
        } else if (r == 2) {
            *row0 = n - small + 1;
            *rows = small >= 3 ? 2 : 0;
        } else {
            *row0 = 0;
            *rows = 0;
        }
    }
}

/* Sink state: everything a rank received, for checks after the call. */
typedef struct sink_rec {
    int64_t k;
    int64_t *ids; /* nq x k, written where delivered */
    float *dist;
    int64_t *q0s; /* delivered block starts, in call order */
    int64_t *rowsv; /* and their row counts */
    int64_t nblk, cap;
    int64_t rows_total;
    int fail_rank;  /* rank whose sink fails (-1: none) */
} sink_rec;

static xknn_status sink_fn(void *user, int64_t q0, int64_t rows, int64_t k, const int64_t *ids, const float *dist,
                           xknn_error *err)
{
    sink_rec *s = (sink_rec *)user;
    if (s->fail_rank == rank) {
        snprintf(err->message, sizeof err->message, "test sink refuses rows %lld..%lld", (long long)q0,
                 (long long)(q0 + rows - 1));
        return XKNN_ERROR_IO;
    }
    if (k != s->k) return XKNN_ERROR_INTERNAL;
    memcpy(s->ids + q0 * k, ids, (size_t)(rows * k) * sizeof(int64_t));
    memcpy(s->dist + q0 * k, dist, (size_t)(rows * k) * sizeof(float));
    if (s->nblk == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 16;
        s->q0s = (int64_t *)realloc(s->q0s, (size_t)s->cap * sizeof(int64_t));
        s->rowsv = (int64_t *)realloc(s->rowsv, (size_t)s->cap * sizeof(int64_t));
    }
    s->q0s[s->nblk] = q0;
    s->rowsv[s->nblk++] = rows;
    s->rows_total += rows;
    return XKNN_SUCCESS;
}

/* The block layout the library promises: non-self, q0 = b*qb; self-join, each slice
 * (in row order) cut into blocks of qb. Returns the block index of q0, or -1. */
static int64_t block_index(int self, int64_t q0, int64_t qb, const int64_t *row0s, const int64_t *rowss, int P)
{
    int64_t b = 0, next = 0;
    int r, guard;
    if (!self) return q0 % qb == 0 ? q0 / qb : -1;
    for (guard = 0; guard < P; guard++) { /* walk slices in row order */
        for (r = 0; r < P; r++)
            if (rowss[r] > 0 && row0s[r] == next) break;
        if (r == P) return -1;
        if (q0 >= next && q0 < next + rowss[r]) return (q0 - next) % qb == 0 ? b + (q0 - next) / qb : -1;
        b += (rowss[r] + qb - 1) / qb;
        next += rowss[r];
    }
    return -1;
}

typedef struct tcase {
    const char *what;
    data_kind kind;
    int64_t n, nq, d, k; /* k <= 0: n (or n - 1 in self-join) */
    int self, metric;
    int64_t qb; /* 0: automatic */
    xknn_mpi_transfer transfer;
    int slicing;
    int pad_ld; /* > 0: slices passed with ld = d + pad_ld */
    int plain;  /* self-join: params.self_join = plain (else the symmetric ring) */
} tcase;

static const tcase cases[] = {
    {"n not a multiple of P", DATA_UNIFORM, 1001, 97, 8, 7, 0, XKNN_METRIC_L2, 0, XKNN_MPI_TRANSFER_AUTO,
     SLICE_STANDARD, 0, 0},
    {"ties, blocks of 7 (not dividing nq)", DATA_INTEGER, 1000, 50, 3, 10, 0, XKNN_METRIC_L2, 7,
     XKNN_MPI_TRANSFER_HOST_STAGED, SLICE_STANDARD, 0, 0},
    {"ties, blocks of 7, cuda-aware path", DATA_INTEGER, 1000, 50, 3, 10, 0, XKNN_METRIC_L2, 7,
     XKNN_MPI_TRANSFER_CUDA_AWARE, SLICE_STANDARD, 0, 0},
    {"slices smaller than k", DATA_DUPLICATES, 203, 40, 5, 100, 0, XKNN_METRIC_L2, 16, XKNN_MPI_TRANSFER_AUTO,
     SLICE_STANDARD, 0, 0},
    {"n < P, k = n", DATA_INTEGER, 3, 11, 4, 0, 0, XKNN_METRIC_L2, 4, XKNN_MPI_TRANSFER_AUTO, SLICE_STANDARD, 0, 0},
    {"k = 1", DATA_INTEGER, 500, 64, 2, 1, 0, XKNN_METRIC_L2, 9, XKNN_MPI_TRANSFER_CUDA_AWARE, SLICE_STANDARD, 0, 0},
    {"k = n", DATA_INTEGER, 60, 30, 3, 0, 0, XKNN_METRIC_L2, 8, XKNN_MPI_TRANSFER_HOST_STAGED, SLICE_STANDARD, 0, 0},
    {"self-join k = n - 1", DATA_DUPLICATES, 50, 0, 3, 0, 1, XKNN_METRIC_L2, 6, XKNN_MPI_TRANSFER_AUTO,
     SLICE_STANDARD, 0, 0},
    {"self-join ties, blocks of 33", DATA_INTEGER, 700, 0, 4, 10, 1, XKNN_METRIC_L2, 33,
     XKNN_MPI_TRANSFER_CUDA_AWARE, SLICE_STANDARD, 0, 0},
    {"self-join skewed slices", DATA_DUPLICATES, 120, 0, 5, 12, 1, XKNN_METRIC_EUCLIDEAN, 5,
     XKNN_MPI_TRANSFER_HOST_STAGED, SLICE_SKEWED, 0, 0},
    {"self-join plain, ties", DATA_INTEGER, 700, 0, 4, 10, 1, XKNN_METRIC_L2, 33, XKNN_MPI_TRANSFER_CUDA_AWARE,
     SLICE_STANDARD, 0, 1},
    {"self-join plain k = n - 1", DATA_DUPLICATES, 50, 0, 3, 0, 1, XKNN_METRIC_L2, 6, XKNN_MPI_TRANSFER_AUTO,
     SLICE_STANDARD, 0, 1},
    {"self-join k = 1, rank order != row order, ld > d", DATA_DUPLICATES, 211, 0, 9, 1, 1, XKNN_METRIC_EUCLIDEAN, 0,
     XKNN_MPI_TRANSFER_AUTO, SLICE_REVERSED, 2, 0},
    {"self-join, last rank empty (it still works on visiting slices)", DATA_DUPLICATES, 150, 0, 4, 9, 1,
     XKNN_METRIC_L2, 0, XKNN_MPI_TRANSFER_AUTO, SLICE_LAST_EMPTY, 0, 0},
    {"self-join n < P", DATA_INTEGER, 3, 0, 4, 0, 1, XKNN_METRIC_L2, 4, XKNN_MPI_TRANSFER_HOST_STAGED,
     SLICE_STANDARD, 0, 0},
    {"skewed slices, empty ranks", DATA_INTEGER, 400, 45, 6, 20, 0, XKNN_METRIC_L2, 10, XKNN_MPI_TRANSFER_AUTO,
     SLICE_SKEWED, 0, 0},
    {"rank order != row order, ld > d", DATA_GAUSSIAN, 777, 61, 17, 25, 0, XKNN_METRIC_EUCLIDEAN, 0,
     XKNN_MPI_TRANSFER_AUTO, SLICE_REVERSED, 3, 0},
    {"d = 784 clustered", DATA_CLUSTERED, 300, 20, 784, 5, 0, XKNN_METRIC_L2, 6, XKNN_MPI_TRANSFER_AUTO,
     SLICE_STANDARD, 0, 0},
    {"single block", DATA_UNIFORM, 256, 5, 32, 16, 0, XKNN_METRIC_L2, 1000, XKNN_MPI_TRANSFER_AUTO,
     SLICE_STANDARD, 0, 0},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])
#define TESTS_PER_CASE 5

static xknn_mpi_context *make_ctx(xknn_mpi_transfer t, int64_t qb)
{
    xknn_mpi_config cfg = XKNN_MPI_CONFIG_INIT;
    xknn_mpi_context *ctx = NULL;
    xknn_error err;
    cfg.transfer = t;
    cfg.query_block = qb;
    if (xknn_mpi_create(MPI_COMM_WORLD, &cfg, &ctx, &err) != XKNN_SUCCESS) {
        if (rank == 0) bail("xknn_mpi_create: %s", err.message);
        MPI_Finalize();
        exit(1);
    }
    return ctx;
}

static void run_case(const tcase *c)
{
    const int64_t nq = c->self ? c->n : c->nq;
    const int64_t k = c->k > 0 ? c->k : (c->self ? c->n - 1 : c->n);
    const int64_t ld = c->d + c->pad_ld;
    float *all = (float *)malloc((size_t)(c->n * c->d) * sizeof(float));
    float *qry = c->self ? NULL : (float *)malloc((size_t)(nq * c->d) * sizeof(float));
    int64_t row0, rows, i, *row0s, *rowss;
    float *mine;
    int64_t *gids = NULL, *wids = NULL, *sids = NULL, *bc = NULL;
    float *gdist = NULL, *wdist = NULL, *sdist = NULL, *bd = NULL; /* bc, bd: the gathered rows everywhere */
    xknn_mpi_context *ctx = make_ctx(c->transfer, c->qb);
    xknn_mpi_output out = XKNN_MPI_OUTPUT_INIT;
    xknn_mpi_stats stats;
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix mref, mq;
    xknn_error err;
    xknn_status st;
    sink_rec rec;
    int good_sink = 1, r;
    char label[200];

    snprintf(label, sizeof label, "%s: %s n=%lld nq=%lld d=%lld k=%lld qb=%lld %s P=%d", c->what,
             ref_data_name(c->kind), (long long)c->n, (long long)nq, (long long)c->d, (long long)k,
             (long long)c->qb, xknn_mpi_transfer_name(c->transfer), size);

    ref_make_data(c->kind, all, c->n, c->d, 11);
    if (qry) ref_make_data(c->kind, qry, nq, c->d, 12);

    /* this rank's slice, copied with the case's leading dimension */
    slice_of(c->slicing, c->n, rank, size, &row0, &rows);
    mine = (float *)malloc((size_t)((rows > 0 ? rows : 1) * ld) * sizeof(float));
    for (i = 0; i < rows; i++) memcpy(mine + i * ld, all + (row0 + i) * c->d, (size_t)c->d * sizeof(float));
    row0s = (int64_t *)malloc((size_t)size * sizeof(int64_t));
    rowss = (int64_t *)malloc((size_t)size * sizeof(int64_t));
    for (r = 0; r < size; r++) slice_of(c->slicing, c->n, r, size, &row0s[r], &rowss[r]);

    memset(&rec, 0, sizeof rec);
    rec.k = k;
    rec.fail_rank = -1;
    rec.ids = (int64_t *)malloc((size_t)(nq * k) * sizeof(int64_t));
    rec.dist = (float *)malloc((size_t)(nq * k) * sizeof(float));
    if (rank == 0) {
        gids = (int64_t *)malloc((size_t)(nq * k) * sizeof(int64_t));
        gdist = (float *)malloc((size_t)(nq * k) * sizeof(float));
        memset(gids, 0xab, (size_t)(nq * k) * sizeof(int64_t));
    }

    p.metric = (xknn_metric)c->metric;
    p.backend = XKNN_BACKEND_CPU;
    p.self_join = c->plain ? XKNN_SELF_JOIN_PLAIN : XKNN_SELF_JOIN_AUTO;
    mref.data = mine;
    mref.rows = rows;
    mref.cols = c->d;
    mref.ld = ld;
    mref.dtype = XKNN_DTYPE_F32;
    mq.data = qry;
    mq.rows = nq;
    mq.cols = c->d;
    mq.ld = 0;
    mq.dtype = XKNN_DTYPE_F32;
    out.sink = sink_fn;
    out.sink_user = &rec;
    out.gather_root = 0;
    out.ids = gids;
    out.dist = gdist;
    if (c->self)
        st = xknn_mpi_self_join(ctx, &p, rows > 0 ? &mref : NULL, row0, k, &out, &stats, &err);
    else
        st = xknn_mpi_search(ctx, &p, rows > 0 ? &mref : NULL, row0, rank == 0 ? &mq : NULL, 0, k, &out, &stats, &err);

    /* 1, 2: gathered result vs the oracle and vs one xknn_search (rank 0) */
    if (rank == 0) {
        if (st != XKNN_SUCCESS) {
            ok(0, "%s: gather vs oracle: %s", label, err.message);
            ok(0, "%s: gather vs xknn_search", label);
        } else {
            xknn_matrix whole = XKNN_MATRIX_F32(all, c->n, c->d);
            xknn_params sp = XKNN_PARAMS_INIT;
            xknn_error e2;
            wids = (int64_t *)malloc((size_t)(nq * k) * sizeof(int64_t));
            wdist = (float *)malloc((size_t)(nq * k) * sizeof(float));
            ref_knn(c->metric == XKNN_METRIC_EUCLIDEAN ? REF_EUCLIDEAN : REF_L2, all, c->n, c->d, qry, nq, c->d,
                    c->d, k, c->self, 0, 0, wids, wdist);
            is_knn_equal(gids, gdist, wids, wdist, nq, k, "%s: gather vs oracle", label);
            sids = (int64_t *)malloc((size_t)(nq * k) * sizeof(int64_t));
            sdist = (float *)malloc((size_t)(nq * k) * sizeof(float));
            sp.metric = (xknn_metric)c->metric;
            sp.backend = XKNN_BACKEND_CPU;
            if (xknn_search(&sp, &whole, c->self ? NULL : &mq, k, sids, sdist, &e2) != XKNN_SUCCESS)
                ok(0, "%s: gather vs xknn_search: %s", label, e2.message);
            else
                is_knn_equal(gids, gdist, sids, sdist, nq, k, "%s: gather vs xknn_search", label);
        }
    }

    /* the gathered rows, on every rank (the status is the same everywhere) */
    if (st == XKNN_SUCCESS) {
        bc = (int64_t *)malloc((size_t)(nq * k + 1) * sizeof(int64_t));
        bd = (float *)malloc((size_t)(nq * k + 1) * sizeof(float));
        if (rank == 0) {
            memcpy(bc, gids, (size_t)(nq * k) * sizeof(int64_t));
            memcpy(bd, gdist, (size_t)(nq * k) * sizeof(float));
        }
        MPI_Bcast(bc, (int)(nq * k), MPI_INT64_T, 0, MPI_COMM_WORLD);
        MPI_Bcast(bd, (int)(nq * k), MPI_FLOAT, 0, MPI_COMM_WORLD);
    }

    /* 3: sink blocks: on rank b mod P (symmetric self-join: the slice's owner, in one
     * or more blocks that follow each other), each once, in order, equal to the gathered
     * rows */
    if (st == XKNN_SUCCESS) {
        int64_t b, prev = -1, owned_rows = 0, tot = 0, next = row0s[rank];
        for (b = 0; b < rec.nblk; b++) {
            const int64_t q0 = rec.q0s[b], nr = rec.rowsv[b];
            const int64_t bi = block_index(c->self, q0, stats.query_block, row0s, rowss, size);
            int64_t j;
            if (c->self && !c->plain) {
                /* symmetric ring: the owner's slice in blocks, each where the last ended */
                if (q0 != next || nr < 1 || q0 + nr > row0s[rank] + rowss[rank] || q0 <= prev) good_sink = 0;
                next = q0 + nr;
            } else if (bi < 0 || bi % size != rank || q0 <= prev || nr < 1 || nr > stats.query_block ||
                       q0 + nr > nq) {
                good_sink = 0;
            }
            prev = q0;
            for (j = q0 * k; good_sink && j < (q0 + nr) * k; j++)
                if (rec.ids[j] != bc[j] || memcmp(&rec.dist[j], &bd[j], sizeof(float))) good_sink = 0;
            owned_rows += nr;
        }
        if (owned_rows != rec.rows_total || rec.nblk != stats.blocks_owned) good_sink = 0;
        if (c->self && !c->plain && owned_rows != rowss[rank]) good_sink = 0;
        MPI_Allreduce(&owned_rows, &tot, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        if (tot != nq || stats.nq != nq || stats.k != k || stats.n != c->n || stats.ranks != size) good_sink = 0;
    } else {
        good_sink = 0;
    }
    good_sink = all_ok(good_sink);
    if (rank == 0) ok(good_sink, "%s%s: sink blocks on their owner rank, complete, equal", label, c->plain ? " plain" : "");

    /* 4: distance work. Every pair once over all ranks (plain: every query-reference
     * pair); symmetric ring: each rank within one row of the largest slice of the mean
     * (the bound of mpi/symmetric.c, which holds when every slice has more than 1.5 P
     * rows; the old schedule put a whole extra pair on ranks r < P/2 for even P) */
    {
        int64_t mine = st == XKNN_SUCCESS ? stats.distance_evals : -1, *evs = NULL;
        if (rank == 0) evs = (int64_t *)malloc((size_t)size * sizeof(int64_t));
        MPI_Gather(&mine, 1, MPI_INT64_T, evs, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            const int sym = c->self && !c->plain;
            const int64_t want = sym ? c->n * (c->n - 1) / 2 : nq * c->n;
            int64_t tot = 0, maxrows = 0, minrows = c->n, worst = 0;
            int good = 1, balanced;
            for (r = 0; r < size; r++) {
                if (evs[r] < 0) good = 0;
                tot += evs[r];
                if (rowss[r] > maxrows) maxrows = rowss[r];
                if (rowss[r] < minrows) minrows = rowss[r];
            }
            balanced = sym && 2 * minrows > 3 * size;
            for (r = 0; balanced && r < size; r++) {
                const int64_t dev = size * evs[r] - tot; /* P x (rank's work - mean) */
                if ((dev < 0 ? -dev : dev) > worst) worst = dev < 0 ? -dev : dev;
            }
            if (balanced && worst >= size * maxrows) good = 0;
            ok(good && tot == want, "%s: distance evaluations sum to %lld%s", label, (long long)want,
               balanced ? ", every rank within one row of the mean" : "");
            if (balanced || !(good && tot == want))
                for (r = 0; r < size; r++)
                    diag("rank %d: %lld rows, %lld distance evaluations (mean %.1f)", r, (long long)rowss[r],
                         (long long)evs[r], (double)tot / size);
            free(evs);
        }
    }

    /* 5: sink only, any order (as knn_mpi): each row once, on its owner (symmetric ring:
     * the slice's owner), equal to the gathered rows; at P = 2 the ring gives rows as
     * their pieces end, rank 0's own rows among rank 1's */
    {
        xknn_mpi_output o2 = XKNN_MPI_OUTPUT_INIT;
        xknn_mpi_stats s2;
        sink_rec r2;
        unsigned char *seen = (unsigned char *)calloc((size_t)nq + 1, 1);
        int64_t b, q, got = 0, tot = 0;
        int good = st == XKNN_SUCCESS;
        const int sym = c->self && !c->plain;
        xknn_status st2;
        memset(&r2, 0, sizeof r2);
        r2.k = k;
        r2.fail_rank = -1;
        r2.ids = (int64_t *)malloc((size_t)(nq * k + 1) * sizeof(int64_t));
        r2.dist = (float *)malloc((size_t)(nq * k + 1) * sizeof(float));
        o2.sink = sink_fn;
        o2.sink_user = &r2;
        o2.any_order = 1;
        if (c->self)
            st2 = xknn_mpi_self_join(ctx, &p, rows > 0 ? &mref : NULL, row0, k, &o2, &s2, &err);
        else
            st2 = xknn_mpi_search(ctx, &p, rows > 0 ? &mref : NULL, row0, rank == 0 ? &mq : NULL, 0, k, &o2, &s2,
                                  &err);
        if (st2 != XKNN_SUCCESS) good = 0;
        for (b = 0; good && b < r2.nblk; b++) {
            const int64_t q0 = r2.q0s[b], nr = r2.rowsv[b];
            if (nr < 1 || q0 < 0 || q0 + nr > nq || (sym && (q0 < row0s[rank] || q0 + nr > row0s[rank] + rowss[rank]))) {
                good = 0;
                break;
            }
            for (q = q0; q < q0 + nr; q++) {
                if (seen[q]) good = 0;
                seen[q] = 1;
            }
            got += nr;
            if (memcmp(r2.ids + q0 * k, bc + q0 * k, (size_t)(nr * k) * sizeof(int64_t)) ||
                memcmp(r2.dist + q0 * k, bd + q0 * k, (size_t)(nr * k) * sizeof(float)))
                good = 0;
        }
        if (sym && got != rowss[rank]) good = 0;
        MPI_Allreduce(&got, &tot, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        if (tot != nq) good = 0;
        good = all_ok(good);
        if (rank == 0)
            ok(good, "%s%s: sink only, any order: each row once, on its owner, equal to the gathered rows", label,
               c->plain ? " plain" : "");
        free(r2.ids);
        free(r2.dist);
        free(r2.q0s);
        free(r2.rowsv);
        free(seen);
    }

    xknn_mpi_destroy(ctx);
    FREE_ALL(rec.ids, rec.dist, rec.q0s, rec.rowsv, row0s, rowss, mine, all, qry, gids, gdist, wids, wdist, sids, sdist,
             bc, bd);
}

/* Every rank got the same status, and the same message; rank 0 checks and reports. */
static void same_everywhere(xknn_status st, const xknn_error *err, xknn_status want, const char *must_contain,
                            const char *what)
{
    int mine_ok = st == want, all;
    char *msgs = NULL;
    int good_msgs = 1, r;
    if (rank == 0) msgs = (char *)malloc((size_t)size * sizeof err->message);
    MPI_Gather(err->message, (int)sizeof err->message, MPI_CHAR, msgs, (int)sizeof err->message, MPI_CHAR, 0,
               MPI_COMM_WORLD);
    all = all_ok(mine_ok);
    if (rank == 0) {
        for (r = 1; r < size; r++)
            if (strcmp(msgs + r * sizeof err->message, msgs)) good_msgs = 0;
        if (must_contain && !strstr(msgs, must_contain)) good_msgs = 0;
        ok(all && good_msgs, "%s: status %s and the same message on all %d ranks", what, xknn_status_string(want),
           size);
        if (!(all && good_msgs)) diag("rank 0: status %s: %s", xknn_status_string(st), msgs);
        else diag("message: %s", msgs);
        free(msgs);
    }
}

int main(int argc, char **argv)
{
    int c, provided = 0;
    /* as knn_mpi: the symmetric ring's compute runs in a worker thread (the suite runs
     * once more with XKNN_MPI_SYM_THREAD=0: inline) */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == 0) plan(1 + NCASES * TESTS_PER_CASE + 9);

    /* the standard slicing covers [0, n) contiguously for any n and P */
    if (rank == 0) {
        int good = 1, P, r;
        int64_t ns[] = {0, 1, 2, 7, 1000, 1001, (int64_t)1 << 40, INT64_MAX / 2};
        unsigned t;
        for (t = 0; t < sizeof ns / sizeof ns[0]; t++)
            for (P = 1; P <= 9; P++) {
                int64_t next = 0, r0, nr;
                for (r = 0; r < P; r++) {
                    xknn_mpi_slice(ns[t], r, P, &r0, &nr);
                    if (r0 != next || nr < 0 || nr > ns[t] / P + 1) good = 0;
                    next = r0 + nr;
                }
                if (next != ns[t]) good = 0;
            }
        ok(good, "xknn_mpi_slice partitions [0, n) for n up to 2^62, P = 1..9");
    }

    for (c = 0; c < NCASES; c++) run_case(&cases[c]);

    /* ---- errors: every rank returns the same status and message ---------------------- */
    {
        const int64_t n = 300, d = 6, nq = 20, k = 5;
        float *all = (float *)malloc((size_t)(n * d) * sizeof(float));
        float *qry = (float *)malloc((size_t)(nq * d) * sizeof(float));
        int64_t row0, rows;
        xknn_mpi_context *ctx = make_ctx(XKNN_MPI_TRANSFER_AUTO, 4);
        xknn_params p = XKNN_PARAMS_INIT;
        xknn_matrix mref, mq = XKNN_MATRIX_F32(qry, nq, d);
        xknn_error err;
        xknn_status st;
        xknn_mpi_output out = XKNN_MPI_OUTPUT_INIT;
        sink_rec rec;
        char want[64];

        ref_make_data(DATA_UNIFORM, all, n, d, 5);
        ref_make_data(DATA_UNIFORM, qry, nq, d, 6);
        xknn_mpi_slice(n, rank, size, &row0, &rows);
        mref = (xknn_matrix)XKNN_MATRIX_F32(all + row0 * d, rows, d);
        p.backend = XKNN_BACKEND_CPU;

        /* NaN in the last rank's slice only (global row n - 2) */
        all[(n - 2) * d + 3] = NAN;
        st = xknn_mpi_search_gather(ctx, &p, &mref, row0, rank == 0 ? &mq : NULL, 0, k, XKNN_MPI_NO_GATHER, NULL,
                                    NULL, &err);
        snprintf(want, sizeof want, "rank %d: reference row %lld column 3 is NaN", size - 1, (long long)(n - 2));
        same_everywhere(st, &err, XKNN_ERROR_INVALID_VALUE, want, "NaN in one rank's slice");
        all[(n - 2) * d + 3] = 0.5f;

        /* Inf in the query (root only) */
        qry[7 * d + 1] = INFINITY;
        st = xknn_mpi_search_gather(ctx, &p, &mref, row0, rank == 0 ? &mq : NULL, 0, k, XKNN_MPI_NO_GATHER, NULL,
                                    NULL, &err);
        same_everywhere(st, &err, XKNN_ERROR_INVALID_VALUE, "rank 0: query row 7 column 1 is Inf", "Inf in the query");
        qry[7 * d + 1] = 0.25f;

        /* k too large */
        st = xknn_mpi_search_gather(ctx, &p, &mref, row0, rank == 0 ? &mq : NULL, 0, n + 1, XKNN_MPI_NO_GATHER, NULL,
                                    NULL, &err);
        same_everywhere(st, &err, XKNN_ERROR_INVALID_ARGUMENT, "k=301 is larger than the number of references n=300",
                        "k > n");

        /* dimension mismatch between ranks' slices (last rank says d + 1), or for P = 1
         * between the slice and the queries */
        if (rank == size - 1 && size > 1) { /* fewer rows, so d + 1 columns stay in its buffer */
            mref.cols = d + 1;
            mref.rows = rows / 2;
        }
        if (size == 1) {
            mq.cols = d - 1; /* same buffer, read as d - 1 columns with ld = d */
            mq.ld = d;
        }
        st = xknn_mpi_search_gather(ctx, &p, &mref, row0, rank == 0 ? &mq : NULL, 0, k, XKNN_MPI_NO_GATHER, NULL,
                                    NULL, &err);
        same_everywhere(st, &err, XKNN_ERROR_INVALID_ARGUMENT, "dimension mismatch", "dimension mismatch");
        mref.cols = d;
        mref.rows = rows;
        mq.cols = d;
        mq.ld = 0;

        /* slices that do not partition [0, n): rank 0 claims to start at row 1 */
        st = xknn_mpi_search_gather(ctx, &p, &mref, rank == 0 ? row0 + 1 : row0, rank == 0 ? &mq : NULL, 0, k,
                                    XKNN_MPI_NO_GATHER, NULL, NULL, &err);
        same_everywhere(st, &err, XKNN_ERROR_INVALID_ARGUMENT, "do not partition", "slices with a gap");

        /* the sink fails on the last rank only: everyone stops with its status */
        memset(&rec, 0, sizeof rec);
        rec.k = k;
        rec.fail_rank = size - 1;
        rec.ids = (int64_t *)malloc((size_t)(nq * k) * sizeof(int64_t));
        rec.dist = (float *)malloc((size_t)(nq * k) * sizeof(float));
        out.sink = sink_fn;
        out.sink_user = &rec;
        st = xknn_mpi_search(ctx, &p, &mref, row0, rank == 0 ? &mq : NULL, 0, k, &out, NULL, &err);
        snprintf(want, sizeof want, "rank %d: test sink refuses rows", size - 1);
        same_everywhere(st, &err, XKNN_ERROR_IO, want, "sink failing on one rank");
        free(rec.ids);
        free(rec.dist);
        free(rec.q0s);
        free(rec.rowsv);

        /* xknn_mpi_agree: the lowest failing rank's status and message win */
        err.status = XKNN_SUCCESS;
        err.message[0] = '\0';
        st = XKNN_SUCCESS;
        if (rank == size - 1) {
            st = XKNN_ERROR_FORMAT;
            snprintf(err.message, sizeof err.message, "rank %d: made-up format error", rank);
        }
        st = xknn_mpi_agree(ctx, st, &err);
        snprintf(want, sizeof want, "rank %d: made-up format error", size - 1);
        same_everywhere(st, &err, XKNN_ERROR_FORMAT, want, "xknn_mpi_agree");

        /* the context still works after all those errors */
        {
            int64_t *ids = rank == 0 ? (int64_t *)malloc((size_t)(nq * k) * sizeof(int64_t)) : NULL;
            float *dist = rank == 0 ? (float *)malloc((size_t)(nq * k) * sizeof(float)) : NULL;
            st = xknn_mpi_search_gather(ctx, &p, &mref, row0, rank == 0 ? &mq : NULL, 0, k, 0, ids, dist, &err);
            if (rank == 0) {
                int64_t *wids = (int64_t *)malloc((size_t)(nq * k) * sizeof(int64_t));
                float *wdist = (float *)malloc((size_t)(nq * k) * sizeof(float));
                ref_knn(REF_L2, all, n, d, qry, nq, d, d, k, 0, 0, 0, wids, wdist);
                is_knn_result(st, &err, ids, dist, wids, wdist, nq, k, "context usable after errors");
                free(wids);
                free(wdist);
            }
            free(ids);
            free(dist);
        }
        xknn_mpi_destroy(ctx);

        /* a bad config on one rank fails creation everywhere */
        {
            xknn_mpi_config cfg = XKNN_MPI_CONFIG_INIT;
            xknn_mpi_context *bad = NULL;
            if (rank == size - 1) cfg.transfer = (xknn_mpi_transfer)99;
            st = xknn_mpi_create(MPI_COMM_WORLD, &cfg, &bad, &err);
            snprintf(want, sizeof want, "rank %d: config unknown transfer mode 99", size - 1);
            same_everywhere(st, &err, XKNN_ERROR_INVALID_ARGUMENT, want, "bad config on one rank");
            if (bad) xknn_mpi_destroy(bad);
        }
        free(all);
        free(qry);
    }

    c = rank == 0 ? tap_done() : 0;
    MPI_Finalize();
    return c;
}
