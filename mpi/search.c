/* SPDX-License-Identifier: MIT */
/*
 * mpi/search.c -- the distributed search: argument agreement, query-block broadcast
 * pipeline (MPI_Ibcast, next block in flight), local xknn_search with global ids,
 * tree reduction to the rotating owner, delivery (sink, gather), error agreement.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "impl.h"
#include "xknn/impl/knobs.h"

/* What each rank tells the others before anything moves (allgathered, int64). */
enum {
    D_STATUS, D_ROW0, D_ROWS, D_COLS, D_K, D_METRIC, D_SELF, D_QROOT, D_GROOT, D_QBLOCK,
    D_NQ, D_QCOLS, D_EXCL, D_QOFF, D_DTYPE, D_QDTYPE, D_PBITS, D_WCOUNT, D_COUNT
};

/* One query block: global rows [q0, q0 + rows), broadcast by rank src. */
typedef struct xknn__block {
    int64_t q0, rows;
    int src;
} xknn__block;

/* Walks the blocks in order. Non-self: fixed blocks of the root's queries. Self-join:
 * each slice (in row order) cut into blocks, so a block has exactly one source rank. */
typedef struct xknn__blocks {
    int self, P;
    int64_t nq, qb;
    int qroot;
    const int *order;    /* self: ranks with rows > 0, sorted by row0 */
    int norder;
    const int64_t *tab;  /* allgathered descriptors                  */
    int si;              /* iterator: slice index / block index      */
    int64_t off;
} xknn__blocks;

static int64_t xknn__count_blocks(const xknn__blocks *it)
{
    int64_t nb = 0;
    int s;
    if (!it->self) return (it->nq + it->qb - 1) / it->qb;
    for (s = 0; s < it->norder; s++) nb += (it->tab[it->order[s] * D_COUNT + D_ROWS] + it->qb - 1) / it->qb;
    return nb;
}

static void xknn__next_block(xknn__blocks *it, xknn__block *b)
{
    if (!it->self) {
        b->q0 = it->off;
        b->rows = it->nq - it->off < it->qb ? it->nq - it->off : it->qb;
        b->src = it->qroot;
        it->off += b->rows;
        return;
    }
    {
        const int r = it->order[it->si];
        const int64_t r0 = it->tab[r * D_COUNT + D_ROW0], nr = it->tab[r * D_COUNT + D_ROWS];
        b->q0 = r0 + it->off;
        b->rows = nr - it->off < it->qb ? nr - it->off : it->qb;
        b->src = r;
        it->off += b->rows;
        if (it->off == nr) {
            it->si++;
            it->off = 0;
        }
    }
}

/* Progress of the next block's broadcast during a device search (MPI progresses only
 * inside MPI calls). A completed request becomes MPI_REQUEST_NULL, which the later
 * MPI_Wait accepts. */
static void xknn__progress(void *arg)
{
    MPI_Request *req = (MPI_Request *)arg;
    int flag;
    if (*req != MPI_REQUEST_NULL) MPI_Test(req, &flag, MPI_STATUS_IGNORE);
}

/* Copies rows [row, row + rows) of a host matrix into a dense buffer of rows of
 * row_bytes bytes (the matrix's dtype, its ld in elements). */
static void xknn__pack(unsigned char *dst, const xknn_matrix *m, int64_t row, int64_t rows, int64_t row_bytes)
{
    const int64_t elems = xknn_row_elems(m->dtype, m->cols);
    const int64_t esz = row_bytes / elems;
    const int64_t ld_bytes = (m->ld ? m->ld : elems) * esz;
    const unsigned char *src = (const unsigned char *)m->data + row * ld_bytes;
    int64_t i;
    if (ld_bytes == row_bytes) {
        memcpy(dst, src, (size_t)(rows * row_bytes));
        return;
    }
    for (i = 0; i < rows; i++) memcpy(dst + i * row_bytes, src + i * ld_bytes, (size_t)row_bytes);
}

/* Structural checks of one matrix argument (not the values). */
static xknn_status xknn__check_arg(int rank, const char *what, const xknn_matrix *m, xknn_error *err)
{
    if (!m->data)
        return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: %s data is NULL", rank, what);
    if ((int)m->dtype < 0 || m->dtype >= XKNN_DTYPE_COUNT)
        return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: %s has unknown dtype %d", rank, what,
                              (int)m->dtype);
    if (m->cols <= 0)
        return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: %s has dimension d=%lld: need d >= 1",
                              rank, what, (long long)m->cols);
    if (m->cols > INT32_MAX)
        return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: %s dimension d=%lld is too large",
                              rank, what, (long long)m->cols);
    if (m->ld != 0 && m->ld < xknn_row_elems(m->dtype, m->cols))
        return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                              "rank %d: %s leading dimension %lld is smaller than its row of %lld elements", rank,
                              what, (long long)m->ld, (long long)xknn_row_elems(m->dtype, m->cols));
    return XKNN_SUCCESS;
}

/* Global checks on the allgathered table: identical inputs on every rank give an
 * identical verdict and message, with no further communication. */
static xknn_status xknn__check_table(const int64_t *tab, int P, int *order, int *norder, int64_t *n_out,
                                     int64_t *d_out, int64_t *nq_out, xknn_error *err)
{
    const int64_t *t0 = tab;
    int r, i, j, dref = -1;
    int64_t n = 0, d = 0, nq, next;
    const int self = (int)t0[D_SELF];

    for (r = 1; r < P; r++) {
        const int64_t *t = tab + r * D_COUNT;
        static const struct { int field; const char *name; } same[] = {
            {D_K, "k"}, {D_METRIC, "metric"}, {D_SELF, "search kind (self-join or not)"}, {D_QROOT, "query_root"},
            {D_GROOT, "gather_root"}, {D_QBLOCK, "config query_block"}, {D_EXCL, "params exclude_self"},
            {D_QOFF, "params query_id_offset"}, {D_PBITS, "params p"}, {D_WCOUNT, "params weights_count"}};
        for (i = 0; i < (int)(sizeof same / sizeof same[0]); i++)
            if (t[same[i].field] != t0[same[i].field] && same[i].field == D_PBITS) {
                double p0, pr;
                memcpy(&p0, &t0[D_PBITS], sizeof p0);
                memcpy(&pr, &t[D_PBITS], sizeof pr);
                return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                                      "params p differs between ranks: rank 0 has %g, rank %d has %g", p0, r, pr);
            } else if (t[same[i].field] != t0[same[i].field])
                return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                                      "%s differs between ranks: rank 0 has %lld, rank %d has %lld", same[i].name,
                                      (long long)t0[same[i].field], r, (long long)t[same[i].field]);
    }
    if (t0[D_K] < 1)
        return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "k=%lld: need k >= 1", (long long)t0[D_K]);
    if (!self && (t0[D_QROOT] < 0 || t0[D_QROOT] >= P))
        return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "query_root=%lld is not a rank (size %d)",
                              (long long)t0[D_QROOT], P);
    if (t0[D_GROOT] < XKNN_MPI_NO_GATHER || t0[D_GROOT] >= P)
        return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "gather_root=%lld is not a rank (size %d)",
                              (long long)t0[D_GROOT], P);

    /* Dimension, total size, and the slices partitioning [0, n). */
    *norder = 0;
    for (r = 0; r < P; r++) {
        const int64_t *t = tab + r * D_COUNT;
        if (t[D_ROWS] == 0) continue;
        if (dref < 0) {
            dref = r;
            d = t[D_COLS];
        } else if (t[D_DTYPE] != tab[dref * D_COUNT + D_DTYPE]) {
            return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                                  "dtype mismatch: rank %d's references are %s, rank %d's are %s", dref,
                                  xknn_dtype_name((xknn_dtype)tab[dref * D_COUNT + D_DTYPE]), r,
                                  xknn_dtype_name((xknn_dtype)t[D_DTYPE]));
        } else if (t[D_COLS] != d) {
            return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                                  "dimension mismatch: rank %d's references have d=%lld, rank %d's have d=%lld", dref,
                                  (long long)d, r, (long long)t[D_COLS]);
        }
        n += t[D_ROWS];
        /* insertion sort by row0: P is small */
        for (j = *norder; j > 0 && tab[order[j - 1] * D_COUNT + D_ROW0] > t[D_ROW0]; j--) order[j] = order[j - 1];
        order[j] = r;
        (*norder)++;
    }
    if (n == 0)
        return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "no references: every rank passed an empty slice");
    next = 0;
    for (i = 0; i < *norder; i++) {
        const int64_t *t = tab + order[i] * D_COUNT;
        if (t[D_ROW0] != next)
            return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                                  "reference slices do not partition rows [0, %lld): rank %d's slice starts at row "
                                  "%lld, expected %lld",
                                  (long long)n, order[i], (long long)t[D_ROW0], (long long)next);
        next += t[D_ROWS];
    }
    if (self) {
        nq = n;
        if (t0[D_K] > n - 1)
            return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                                  "k=%lld is larger than n-1=%lld (self-join excludes each point itself)",
                                  (long long)t0[D_K], (long long)(n - 1));
    } else {
        const int64_t *tq = tab + t0[D_QROOT] * D_COUNT;
        int64_t avail = n;
        nq = tq[D_NQ];
        if (tq[D_QCOLS] != d)
            return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                                  "dimension mismatch: references have d=%lld, queries (rank %lld) have d=%lld",
                                  (long long)d, (long long)t0[D_QROOT], (long long)tq[D_QCOLS]);
        if (tq[D_QDTYPE] != tab[dref * D_COUNT + D_DTYPE])
            return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                                  "dtype mismatch: references are %s, queries (rank %lld) are %s",
                                  xknn_dtype_name((xknn_dtype)tab[dref * D_COUNT + D_DTYPE]), (long long)t0[D_QROOT],
                                  xknn_dtype_name((xknn_dtype)tq[D_QDTYPE]));
        if (t0[D_EXCL] && t0[D_QOFF] < n && 0 < t0[D_QOFF] + nq) avail = n - 1;
        if (t0[D_K] > avail)
            return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                                  avail < n ? "k=%lld is larger than n-1=%lld (exclude_self excludes each query's own id)"
                                            : "k=%lld is larger than the number of references n=%lld",
                                  (long long)t0[D_K], (long long)avail);
    }
    *n_out = n;
    *d_out = d;
    *nq_out = nq;
    return XKNN_SUCCESS;
}

/* Queries per block: the configured value, or about 4 blocks per rank within
 * [min(64, nq), 2048]; then capped so buffers stay under ~256 MiB and MPI counts fit. */
/* A self-join on one rank whose backend has a symmetric self-join of its own (the GPU's
 * triangle of tiles): the whole graph in one xknn_search, then the output as the
 * pipeline delivers it (gather, one sink call, progress). */
static void xknn__free_pair(void *arg)
{
    void **pair = (void **)arg;
    free(pair[0]);
    free(pair[1]);
    free(pair);
}

static xknn_status xknn__self_local(xknn_mpi_context *ctx, int rank, const xknn_params *params, const xknn_matrix *ref, int64_t ref_offset,
                                    int64_t k, const xknn_mpi_output *out, xknn_mpi_timings *tm, xknn_error *lerr)
{
    const int64_t n = ref->rows;
    const int direct = out->gather_root == rank && out->ids && out->dist;
    int64_t *ids = direct ? out->ids : (int64_t *)malloc((size_t)(n * k) * sizeof(int64_t));
    float *dist = direct ? out->dist : (float *)malloc((size_t)(n * k) * sizeof(float));
    xknn_params p = *params;
    xknn_error e;
    xknn_status st;
    double t0;
    if (!ids || !dist) {
        st = xknn__mpi_fail(lerr, XKNN_ERROR_OUT_OF_MEMORY, "rank %d: out of memory for the %lld x %lld graph", rank,
                            (long long)n, (long long)k);
        goto done;
    }
    p.ref_id_offset = ref_offset;
    t0 = MPI_Wtime();
    st = xknn_search(&p, ref, NULL, k, ids, dist, &e);
    tm->search += MPI_Wtime() - t0;
    if (st != XKNN_SUCCESS) {
        st = xknn__mpi_fail(lerr, st, "rank %d: %s", rank, e.message);
        goto done;
    }
    if (out->gather_root == rank && !direct) {
        memcpy(out->ids, ids, (size_t)(n * k) * sizeof(int64_t));
        if (out->dist) memcpy(out->dist, dist, (size_t)(n * k) * sizeof(float));
    }
    if (out->sink) {
        e.status = XKNN_SUCCESS;
        e.message[0] = '\0';
        t0 = MPI_Wtime();
        st = out->sink(out->sink_user, ref_offset, n, k, ids, dist, &e);
        tm->write += MPI_Wtime() - t0;
        if (st != XKNN_SUCCESS)
            st = e.message[0] ? xknn__mpi_fail(lerr, st, "rank %d: %s", rank, e.message)
                              : xknn__mpi_fail(lerr, st, "rank %d: result sink failed: %s", rank, xknn_status_string(st));
    }
    if (st == XKNN_SUCCESS && out->progress) out->progress(out->progress_user, n, n);
done:
    if (!direct) {
        /* (the graph's buffers, released off the caller's path like the ring's) */
        void **pair = (void **)malloc(2 * sizeof(void *));
        if (pair) {
            pair[0] = ids;
            pair[1] = dist;
            xknn__mpi_later(ctx, xknn__free_pair, pair);
        } else {
            free(ids);
            free(dist);
        }
    }
    return st;
}

static int64_t xknn__pick_query_block(int64_t cfg, int64_t nq, int64_t row_bytes, int64_t k)
{
    int64_t qb;
    if (cfg > 0) {
        qb = cfg;
    } else {
        /* every rank searches every block at once, so more blocks a rank add no
         * parallelism, only per-block costs: four blocks overlap the broadcast and the
         * reduction with the search whatever P is */
        qb = (nq + 3) / 4;
        if (qb < 64) qb = 64;
        if (qb > 2048) qb = 2048;
        while (qb > 1 && (double)qb * (double)(2 * row_bytes + 4 * k * 12) > 256.0 * 1024 * 1024) qb /= 2;
    }
    if (qb > nq) qb = nq;
    if (qb > INT32_MAX / row_bytes) qb = INT32_MAX / row_bytes; /* MPI_Ibcast count is an int */
    if (qb < 1) qb = 1;
    return qb;
}

/* One search's state on a rank, from the checks to the verdict. */
typedef struct xknn__search {
    xknn_mpi_context *ctx;
    const xknn_matrix *ref, *query;
    const xknn_mpi_output *out;
    xknn_mpi_stats *stats;
    int64_t ref_offset, k;
    int query_root, self;
    double t_begin;
    xknn_params p;
    xknn_error lerr;
    xknn_status st; /* this rank's own status */
    xknn_mpi_timings tm;
    int rank, P, neg, mpi_broken;
    int64_t *tab; /* every rank's descriptor (D_COUNT values each), allgathered */
    int *order, norder;
    int64_t nloc, n, d, nq, qb, nblocks, done_q, owned, evals, row_bytes;
    xknn_dtype dtype;
    unsigned char *qbuf[2];
    void *cbase;
    unsigned char *staging;
    xknn__cands cand, recvb, spare;
    xknn__blocks it;
    xknn__block cur, nxt;
    MPI_Request breq, freq; /* the next block's broadcast, the error flag's reduction */
    int fsend, frecv, stop;
    xknn__resident *resident;
    xknn__resident *kept; /* an index's resident slice, or early: used, not closed    */
    xknn__resident *early; /* a one-shot search's slice, uploaded at the checks       */
    int early_tried;       /* ... or the device path found not to apply then          */
    int ref_checked;      /* an index's slice: its values were checked when they came */
    unsigned char *host_ref, *host_query; /* device rows brought to host memory, and */
    xknn_matrix ref_h, query_h;           /* their matrices (freed at the end)       */
} xknn__search;

/* A one-shot search's slice uploaded at the checks, where the device path applies, and
 * its values checked there: the host reads the slice once, for the upload, instead of
 * once more for a scan. 1 when uploaded (the verdict in *st), 0: the host checks. */
static int xknn__run_upload_early(xknn__search *S, xknn_status *st)
{
    char why[256];
    xknn_matrix dev;
    const double t0 = MPI_Wtime();
    if (S->self || S->kept) return 0;
    if (S->p.device < 0) S->p.device = S->ctx->device;
    S->early_tried = 1;
    S->early = xknn__resident_open(&S->p, S->p.device, S->ref, 1, 1, why, sizeof why);
    if (S->ctx->config.verbose && (S->p.backend != XKNN_BACKEND_CPU || S->early))
        fprintf(stderr, "xknn_mpi: rank %d: %s\n", S->rank, S->early ? "reference slice resident on the GPU" : why);
    if (!S->early) return 0;
    dev = *S->ref;
    dev.data = xknn__resident_rows(S->early);
    dev.ld = 0;
    *st = xknn__rows_check(S->rank, &S->p, "reference", &dev, 1, S->ref_offset, &S->lerr);
    S->kept = S->early; /* the pipeline then takes it as an index's */
    S->tm.search += MPI_Wtime() - t0;
    return 1;
}

/* Local checks (no communication): the slice, the metric, the query root's queries, the
 * gather root's output, the values. */
static void xknn__run_check_local(xknn__search *S)
{
    const int rank = S->rank;
    const xknn_matrix *ref = S->ref, *query = S->query;
    xknn_error *lerr = &S->lerr;
    xknn_status st = XKNN_SUCCESS;
    if (S->nloc < 0)
        st = xknn__mpi_fail(lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: reference has %lld rows", rank,
                            (long long)S->nloc);
    else if (S->nloc > 0) {
        st = xknn__check_arg(rank, "reference", ref, lerr);
        if (st == XKNN_SUCCESS && S->ref_offset < 0)
            st = xknn__mpi_fail(lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: ref_offset=%lld: need >= 0", rank,
                                (long long)S->ref_offset);
        /* a one-shot slice goes to the GPU now where it can (checked there); device rows
         * that this search reads on the host (a self-join's, a slice the device path does
         * not take) come to host memory */
        if (st == XKNN_SUCCESS && !S->ref_checked && xknn__run_upload_early(S, &st)) {
            /* checked on the GPU */
        } else if (st == XKNN_SUCCESS && (S->self || !S->kept) && xknn__on_device(S->ctx, &S->p, ref)) {
            st = xknn__rows_to_host(rank, "a host copy of device rows", ref, 1, &S->host_ref, &S->ref_h, lerr);
            if (st == XKNN_SUCCESS) S->ref = ref = &S->ref_h;
        }
    }
    if (st == XKNN_SUCCESS && ((int)S->p.metric < 0 || S->p.metric >= XKNN_METRIC_COUNT))
        st = xknn__mpi_fail(lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: unknown metric %d", rank, (int)S->p.metric);
    if (st == XKNN_SUCCESS && !S->self && rank == S->query_root) {
        if (!query)
            st = xknn__mpi_fail(lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: query matrix is NULL on the query root",
                                rank);
        else if (query->rows <= 0)
            st = xknn__mpi_fail(lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: query has %lld rows: need at least 1",
                                rank, (long long)query->rows);
        else
            st = xknn__check_arg(rank, "query", query, lerr);
        if (st == XKNN_SUCCESS && xknn__on_device(S->ctx, &S->p, query)) { /* MPI broadcasts host memory */
            st = xknn__rows_to_host(rank, "a host copy of device rows", query, 1, &S->host_query, &S->query_h, lerr);
            if (st == XKNN_SUCCESS) S->query = query = &S->query_h;
        }
    }
    if (st == XKNN_SUCCESS && S->out->gather_root == rank && !S->out->ids)
        st = xknn__mpi_fail(lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: gather ids is NULL on the gather root", rank);
    if (st == XKNN_SUCCESS && S->nloc > 0 && !S->ref_checked && !S->early)
        st = xknn__rows_check(rank, &S->p, "reference", ref, 0, S->ref_offset, lerr);
    if (st == XKNN_SUCCESS && !S->self && rank == S->query_root)
        st = xknn__rows_check(rank, &S->p, "query", query, 0, 0, lerr);
    S->st = st;
}

/* Everyone learns everyone's arguments (MPI_Allgather of the descriptors). Returns 0
 * when the table is here; else the ranks go straight to the agreement. */
static int xknn__run_exchange(xknn__search *S)
{
    const int self = S->self, rank = S->rank, root = rank == S->query_root && S->query;
    int64_t my[D_COUNT];
    int have, all = 0, rc;
    memset(my, 0, sizeof my);
    my[D_STATUS] = S->st;
    my[D_ROW0] = S->nloc > 0 ? S->ref_offset : 0;
    my[D_ROWS] = S->nloc > 0 ? S->nloc : 0;
    my[D_COLS] = S->nloc > 0 ? S->ref->cols : 0;
    my[D_K] = S->k;
    my[D_METRIC] = S->p.metric;
    my[D_SELF] = self;
    my[D_QROOT] = self ? -1 : S->query_root;
    my[D_GROOT] = S->out->gather_root;
    my[D_QBLOCK] = S->ctx->config.query_block;
    my[D_NQ] = !self && root ? S->query->rows : 0;
    my[D_QCOLS] = !self && root ? S->query->cols : 0;
    my[D_EXCL] = self ? 1 : (S->p.exclude_self != 0);
    my[D_QOFF] = self ? 0 : S->p.query_id_offset;
    my[D_DTYPE] = S->nloc > 0 ? S->ref->dtype : 0;
    my[D_QDTYPE] = !self && root ? S->query->dtype : 0;
    memcpy(&my[D_PBITS], &S->p.p, sizeof(double));
    my[D_WCOUNT] = S->p.metric == XKNN_METRIC_WHAMMING ? S->p.weights_count : 0;
    S->tab = (int64_t *)malloc((size_t)S->P * D_COUNT * sizeof(int64_t));
    S->order = (int *)malloc((size_t)S->P * sizeof(int));
    /* A rank that could not allocate the table cannot join the allgather: everyone learns
     * that first. Healthy ranks keep their own status: the agreement takes the message of
     * the rank that actually failed. */
    have = S->tab && S->order;
    if (!have)
        S->st = xknn__mpi_fail(&S->lerr, XKNN_ERROR_OUT_OF_MEMORY, "rank %d: out of memory (table of %d ranks)", rank,
                               S->P);
    rc = MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, S->ctx->comm);
    if (rc != MPI_SUCCESS) {
        S->st = xknn__mpi_error(rank, &S->lerr, rc, "MPI_Allreduce");
        return -1;
    }
    if (!all) return -1;
    rc = MPI_Allgather(my, D_COUNT, MPI_INT64_T, S->tab, D_COUNT, MPI_INT64_T, S->ctx->comm);
    if (rc != MPI_SUCCESS) {
        S->st = xknn__mpi_error(rank, &S->lerr, rc, "MPI_Allgather");
        return -1;
    }
    return 0;
}

/* The query blocks' and candidate lists' buffers (qb queries, k candidates). */
static void xknn__run_buffers(xknn__search *S)
{
    const int64_t qb = S->qb, k = S->k;
    const size_t m = (size_t)qb * (size_t)k;
    const int staged = S->ctx->transfer == XKNN_MPI_TRANSFER_HOST_STAGED;
    size_t bytes;
    if ((double)qb * (double)k * 12.0 * 4.0 > (double)SIZE_MAX / 2) {
        S->st = xknn__mpi_fail(&S->lerr, XKNN_ERROR_OUT_OF_MEMORY, "rank %d: k=%lld is too large for this machine",
                               S->rank, (long long)k);
        return;
    }
    bytes = 3 * m * (sizeof(int64_t) + sizeof(float));
    S->qbuf[0] = (unsigned char *)malloc((size_t)(qb * S->row_bytes));
    S->qbuf[1] = (unsigned char *)malloc((size_t)(qb * S->row_bytes));
    S->cbase = malloc(bytes);
    if (staged) S->staging = (unsigned char *)malloc(m * (sizeof(int64_t) + sizeof(float)));
    if (!S->qbuf[0] || !S->qbuf[1] || !S->cbase || (staged && !S->staging)) {
        S->st = xknn__mpi_fail(&S->lerr, XKNN_ERROR_OUT_OF_MEMORY,
                               "rank %d: out of memory for query block buffers (query_block=%lld, k=%lld, "
                               "d=%lld: %.1f MiB); lower query_block",
                               S->rank, (long long)qb, (long long)k, (long long)S->d,
                               (double)(bytes + 2 * (size_t)(qb * S->row_bytes) + (S->staging ? m * 12 : 0)) /
                                   1048576.0);
    } else {
        int64_t *ib = (int64_t *)S->cbase;
        float *fb = (float *)(ib + 3 * m);
        S->cand.ids = ib;
        S->cand.dist = fb;
        S->recvb.ids = ib + m;
        S->recvb.dist = fb + m;
        S->spare.ids = ib + 2 * m;
        S->spare.dist = fb + 2 * m;
    }
}

/* Global checks on the table, the plan (dtype, query block, blocks), the buffers. If
 * some rank failed its local checks, the others skip the plan and agree: the verdict
 * carries the failing rank's message. */
static void xknn__run_plan(xknn__search *S)
{
    const int64_t *tab = S->tab;
    int i;
    for (i = 0; i < S->P; i++)
        if (tab[i * D_COUNT + D_STATUS] != XKNN_SUCCESS) return;
    S->st = xknn__check_table(tab, S->P, S->order, &S->norder, &S->n, &S->d, &S->nq, &S->lerr);
    if (S->st != XKNN_SUCCESS) return;
    for (i = 0; i < S->P; i++)
        if (tab[i * D_COUNT + D_ROWS] > 0) {
            S->dtype = (xknn_dtype)tab[i * D_COUNT + D_DTYPE];
            break;
        }
    S->row_bytes = xknn_row_bytes(S->dtype, S->d);
    S->qb = xknn__pick_query_block(S->ctx->config.query_block, S->nq, S->row_bytes, S->k);
    S->it.self = S->self;
    S->it.P = S->P;
    S->it.nq = S->nq;
    S->it.qb = S->qb;
    S->it.qroot = S->self ? -1 : S->query_root;
    S->it.order = S->order;
    S->it.norder = S->norder;
    S->it.tab = tab;
    S->nblocks = xknn__count_blocks(&S->it);
    xknn__run_buffers(S);
}

/* The symmetric ring over the agreed slice table (mpi/symmetric.c). */
static void xknn__run_ring(xknn__search *S)
{
    const int P = S->P;
    int64_t *row0s = (int64_t *)malloc((size_t)P * 2 * sizeof(int64_t));
    int have = row0s != NULL, every = 0, i, rc;
    if (!have) S->st = xknn__mpi_fail(&S->lerr, XKNN_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", S->rank);
    rc = MPI_Allreduce(&have, &every, 1, MPI_INT, MPI_MIN, S->ctx->comm);
    if (rc == MPI_SUCCESS && every) {
        xknn__sym_job job;
        xknn__sym_tally tally = {0, 0, 0};
        const char *env = xknn__knob(XKNN__KNOB_MPI_SYM_TRACE);
        double tr;
        for (i = 0; i < P; i++) {
            row0s[i] = S->tab[i * D_COUNT + D_ROW0];
            row0s[P + i] = S->tab[i * D_COUNT + D_ROWS];
        }
        S->p.ref_id_offset = S->ref_offset;
        if (S->p.device < 0) S->p.device = S->ctx->device; /* the pair kernel runs on the rank's GPU */
        job.params = &S->p;
        job.ref = S->nloc > 0 ? S->ref : NULL;
        job.ref_offset = S->ref_offset;
        job.k = S->k;
        job.d = S->d;
        job.dtype = S->dtype;
        job.row0s = row0s;
        job.rowss = row0s + P;
        job.out = S->out;
        tr = MPI_Wtime();
        S->st = xknn__sym_ring(S->ctx, &job, &S->tm, &tally, &S->lerr);
        S->owned += tally.owned;
        S->evals = tally.evals;
        S->mpi_broken = tally.mpi_broken;
        /* XKNN_MPI_SYM_TRACE=1 (a diagnostic): what the setup took before the ring */
        if (env && env[0] == '1')
            fprintf(stderr, "xknn_mpi: trace rank %d: the ring ran from %.3f to %.3f s of the self-join\n", S->rank,
                    tr - S->t_begin, MPI_Wtime() - S->t_begin);
    } else if (rc != MPI_SUCCESS) {
        S->st = xknn__mpi_error(S->rank, &S->lerr, rc, "MPI_Allreduce");
    }
    free(row0s);
    if (S->stats) S->stats->blocks = S->norder;
}

/* A self-join that does not take the pipeline: the backend's own on one rank, or the
 * symmetric ring where every rank's backend allows it. Returns 1 when it was done here
 * (its status in S->st), 0 for the pipeline. */
static int xknn__run_self(xknn__search *S)
{
    xknn_params *p = &S->p;
    /* Symmetric when every rank's backend allows it (the device count may differ between
     * ranks): one more agreement, on a flag. */
    const char *why = xknn_search_pair_why_not(p, S->dtype, S->d);
    int mine = why == NULL, all = 0, gpu;
    const int rc = MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, S->ctx->comm);
    if (rc != MPI_SUCCESS) {
        S->st = xknn__mpi_error(S->rank, &S->lerr, rc, "MPI_Allreduce (symmetric)");
        return 1;
    }
    /* one rank on a GPU: the backend's own self-join (its triangle, in blocks where the
     * state does not fit), not the ring's one pair through extra lists */
    gpu = p->backend == XKNN_BACKEND_CUDA || (p->backend == XKNN_BACKEND_AUTO && S->ctx->device >= 0);
    if ((!all || gpu) && S->P == 1 && S->nloc > 0 && xknn_self_join_why_plain(p, S->dtype, S->d) == NULL) {
        if (S->ctx->config.verbose) fprintf(stderr, "xknn_mpi: self-join: one rank: the backend's own symmetric self-join\n");
        if (p->device < 0) p->device = S->ctx->device;
        S->st = xknn__self_local(S->ctx, S->rank, p, S->ref, S->ref_offset, S->k, S->out, &S->tm, &S->lerr);
        if (S->st == XKNN_SUCCESS) {
            S->owned = 1;
            S->evals = S->n * (S->n - 1) / 2;
        }
        if (S->stats) S->stats->blocks = 1;
        return 1;
    }
    if (S->ctx->config.verbose && S->rank == 0) {
        if (all)
            fprintf(stderr, "xknn_mpi: self-join: symmetric ring\n");
        else
            fprintf(stderr, "xknn_mpi: self-join: plain search (%s)\n",
                    why ? why : "another rank's backend has no symmetric kernel");
    }
    if (!all) return 0;
    xknn__run_ring(S);
    return 1;
}

/* Broadcasts block b's queries from their source rank (packed there), non-blocking. */
static int xknn__run_bcast(xknn__search *S, const xknn__block *b, unsigned char *buf)
{
    if (b->src == S->rank)
        xknn__pack(buf, S->self ? S->ref : S->query, S->self ? b->q0 - S->ref_offset : b->q0, b->rows, S->row_bytes);
    return MPI_Ibcast(buf, (int)(b->rows * S->row_bytes), MPI_BYTE, b->src, S->ctx->comm, &S->breq);
}

/* Local top k of the current block with global ids on the host path (xknn_search);
 * padding when there is nothing to search (or after a failure). */
static void xknn__run_search_block(xknn__search *S, const xknn_matrix *refm, const unsigned char *qcur,
                                   int64_t qoff_user, xknn__cands *mine)
{
    const xknn__block *cur = &S->cur;
    const int64_t k = S->k;
    const double t0 = MPI_Wtime();
    if (S->st != XKNN_SUCCESS || S->nloc == 0) {
        xknn__lists_pad(mine->ids, mine->dist, cur->rows * k, S->neg);
    } else {
        xknn_matrix qm = XKNN_MATRIX_TYPED(qcur, cur->rows, S->d, S->dtype);
        xknn_error e;
        xknn_status s;
        S->p.query_id_offset = (S->self ? 0 : qoff_user) + cur->q0;
        s = xknn_search(&S->p, refm, &qm, k, mine->ids, mine->dist, &e);
        S->evals += cur->rows * S->nloc;
        if (s != XKNN_SUCCESS) {
            S->st = xknn__mpi_fail(&S->lerr, s, "rank %d: %s", S->rank, e.message);
            xknn__lists_pad(mine->ids, mine->dist, cur->rows * k, S->neg);
        }
    }
    S->tm.search += MPI_Wtime() - t0;
}

/* The block's merged lists to the gather root (res: on the owner). Returns an MPI
 * return code. */
static int xknn__run_gather_block(xknn__search *S, int owner, const xknn__cands *res)
{
    const xknn_mpi_output *out = S->out;
    const xknn__block *cur = &S->cur;
    const int64_t k = S->k, m = cur->rows * k;
    int rc = MPI_SUCCESS;
    if (S->rank == owner && owner == out->gather_root) {
        memcpy(out->ids + cur->q0 * k, res->ids, (size_t)m * sizeof(int64_t));
        if (out->dist) memcpy(out->dist + cur->q0 * k, res->dist, (size_t)m * sizeof(float));
    } else if (S->rank == owner) {
        rc = xknn__mpi_send_cands(S->ctx, res, cur->rows, k, S->staging, out->gather_root, XKNN__TAG_GATHER);
    } else if (S->rank == out->gather_root) {
        rc = xknn__mpi_recv_cands(S->ctx, &S->recvb, cur->rows, k, S->staging, owner, XKNN__TAG_GATHER);
        if (rc == MPI_SUCCESS) {
            memcpy(out->ids + cur->q0 * k, S->recvb.ids, (size_t)m * sizeof(int64_t));
            if (out->dist) memcpy(out->dist + cur->q0 * k, S->recvb.dist, (size_t)m * sizeof(float));
        }
    }
    return rc;
}

/* The owner's block to the sink, its seconds counted as write. */
static void xknn__run_sink_block(xknn__search *S, const xknn__cands *res)
{
    const xknn__block *cur = &S->cur;
    xknn_error e;
    xknn_status s;
    const double t0 = MPI_Wtime();
    e.status = XKNN_SUCCESS;
    e.message[0] = '\0';
    s = S->out->sink(S->out->sink_user, cur->q0, cur->rows, S->k, res->ids, res->dist, &e);
    S->tm.write += MPI_Wtime() - t0;
    if (s == XKNN_SUCCESS) return;
    if (e.message[0])
        S->st = xknn__mpi_fail(&S->lerr, s, "rank %d: %s", S->rank, e.message);
    else
        S->st = xknn__mpi_fail(&S->lerr, s, "rank %d: result sink failed on rows %lld..%lld: %s", S->rank,
                               (long long)cur->q0, (long long)(cur->q0 + cur->rows - 1), xknn_status_string(s));
}

/* Error agreement, one block behind so it overlaps the next search: every rank sees the
 * same flag at the same block and stops together. Returns 0 to go on. */
static int xknn__run_error_flag(xknn__search *S, int64_t b)
{
    int rc;
    if (S->freq != MPI_REQUEST_NULL) {
        rc = MPI_Wait(&S->freq, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            S->st = xknn__mpi_error(S->rank, &S->lerr, rc, "MPI_Wait (error flag)");
            S->mpi_broken = 1;
            return -1;
        }
        if (S->frecv) S->stop = 1;
    }
    if (S->stop) return -1;
    if (b + 1 < S->nblocks) {
        S->fsend = S->st != XKNN_SUCCESS;
        rc = MPI_Iallreduce(&S->fsend, &S->frecv, 1, MPI_INT, MPI_MAX, S->ctx->comm, &S->freq);
        if (rc != MPI_SUCCESS) {
            S->st = xknn__mpi_error(S->rank, &S->lerr, rc, "MPI_Iallreduce (error flag)");
            S->mpi_broken = 1;
            return -1;
        }
    }
    return 0;
}

/* Block b (S->cur) after its local search (mine): the tree reduction to the rotating
 * owner, delivery, the error flag; S->cur becomes S->nxt. Returns 0 to go on. */
static int xknn__run_deliver(xknn__search *S, int64_t b, xknn__cands mine)
{
    const int owner = (int)(b % S->P);
    const xknn__cands *res = NULL;
    xknn__cands sp = S->spare;
    const double t0 = MPI_Wtime();
    int rc = xknn__tree_reduce(S->ctx, owner, S->cur.rows, S->k, S->neg, &mine, &S->recvb, &sp, S->staging, &res);
    if (rc == MPI_SUCCESS && S->out->gather_root >= 0) rc = xknn__run_gather_block(S, owner, res);
    S->tm.reduce += MPI_Wtime() - t0;
    if (rc != MPI_SUCCESS) {
        S->st = xknn__mpi_error(S->rank, &S->lerr, rc, "MPI_Send/MPI_Recv (candidate lists)");
        S->mpi_broken = 1;
        return -1;
    }
    if (S->rank == owner) {
        S->owned++;
        if (S->out->sink && S->st == XKNN_SUCCESS) xknn__run_sink_block(S, res);
    }
    S->done_q += S->cur.rows;
    if (S->out->progress) S->out->progress(S->out->progress_user, S->done_q, S->nq);
    if (xknn__run_error_flag(S, b) != 0) return -1;
    S->cur = S->nxt;
    return 0;
}

/* Waits for block b's broadcast and sends block b + 1's (into *next). Returns 0, or -1
 * with the MPI error recorded. */
static int xknn__run_block_queries(xknn__search *S, int64_t b, xknn__block *next)
{
    const double t0 = MPI_Wtime();
    int rc = MPI_Wait(&S->breq, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS && b + 1 < S->nblocks) {
        xknn__next_block(&S->it, next);
        rc = xknn__run_bcast(S, next, S->qbuf[(b + 1) & 1]);
    }
    S->tm.broadcast += MPI_Wtime() - t0;
    if (rc != MPI_SUCCESS) {
        S->st = xknn__mpi_error(S->rank, &S->lerr, rc, "MPI_Wait/MPI_Ibcast (query block)");
        S->mpi_broken = 1;
        return -1;
    }
    return 0;
}

/* Block b on the host path: its queries (the next block then goes in flight), the local
 * search, delivery. Returns 0 to go on. */
static int xknn__run_block(xknn__search *S, int64_t b, const xknn_matrix *refm, int64_t qoff_user)
{
    if (xknn__run_block_queries(S, b, &S->nxt) != 0) return -1;
    xknn__run_search_block(S, refm, S->qbuf[b & 1], qoff_user, &S->cand);
    return xknn__run_deliver(S, b, S->cand);
}

/* The resident path's block b (blk[b % 3]): its queries here and block b + 1's sent, then
 * its search enqueued on the GPU. 1: a search is in flight; 0: none (nothing to search,
 * or this rank failed: its lists are padding); -1: MPI is broken. */
static int xknn__resident_begin(xknn__search *S, int64_t b, xknn__block *blk, int64_t qoff_user)
{
    const xknn__block *cur = &blk[b % 3];
    xknn_error e;
    xknn_status s;
    double t0;
    if (xknn__run_block_queries(S, b, &blk[(b + 1) % 3]) != 0) return -1;
    if (S->st != XKNN_SUCCESS || S->nloc == 0) return 0;
    t0 = MPI_Wtime();
    S->p.query_id_offset = (S->self ? 0 : qoff_user) + cur->q0;
    s = xknn__resident_start(S->resident, &S->p, (const float *)(const void *)S->qbuf[b & 1], cur->rows, &e);
    S->tm.search += MPI_Wtime() - t0;
    if (s != XKNN_SUCCESS) {
        S->st = xknn__mpi_fail(&S->lerr, s, "rank %d: %s", S->rank, e.message);
        return 0;
    }
    S->evals += cur->rows * S->nloc;
    return 1;
}

/* The resident path's block: its lists into S->cand once the GPU is done (the next
 * block's broadcast progressing meanwhile), or padding. */
static void xknn__resident_end(xknn__search *S, const xknn__block *cur, int inflight)
{
    xknn__cands *mine = &S->cand;
    if (inflight > 0) {
        MPI_Request pending = S->breq;
        xknn_error e;
        const double t0 = MPI_Wtime();
        const xknn_status s = xknn__resident_finish(S->resident, mine->ids, mine->dist, xknn__progress, &pending, &e);
        S->breq = pending;
        S->tm.search += MPI_Wtime() - t0;
        if (s != XKNN_SUCCESS) {
            S->st = xknn__mpi_fail(&S->lerr, s, "rank %d: %s", S->rank, e.message);
            inflight = 0;
        }
    }
    if (inflight <= 0) xknn__lists_pad(mine->ids, mine->dist, cur->rows * S->k, S->neg);
}

/* The blocks on a resident slice: block b + 1's search runs on the GPU while block b's
 * lists are reduced and delivered, so the GPU does not wait for the reduction. The
 * collectives keep one order on every rank: block b + 2's broadcast, then block b's
 * reduction and error flag. */
static void xknn__run_resident_blocks(xknn__search *S, int64_t qoff_user)
{
    xknn__block blk[3];
    int64_t b;
    int inflight, next;
    blk[0] = S->cur;
    inflight = xknn__resident_begin(S, 0, blk, qoff_user);
    for (b = 0; b < S->nblocks && inflight >= 0; b++, inflight = next) {
        xknn__resident_end(S, &blk[b % 3], inflight);
        next = b + 1 < S->nblocks ? xknn__resident_begin(S, b + 1, blk, qoff_user) : 0;
        if (next < 0) break;
        S->cur = blk[b % 3];
        S->nxt = blk[(b + 1) % 3];
        if (xknn__run_deliver(S, b, S->cand) != 0) {
            xknn__resident_end(S, &blk[(b + 1) % 3], next); /* (its device work done) */
            break;
        }
    }
}

/* The pipeline: the slice resident on the GPU where it can be, the first block's
 * broadcast, then block after block; requests every rank posted completed before the
 * final agreement. */
static void xknn__run_pipeline(xknn__search *S)
{
    const int64_t qoff_user = S->self ? 0 : S->p.query_id_offset;
    xknn_matrix refm;
    double t0;
    int64_t b;
    int rc;
    S->p.pad_missing = 1;
    S->p.ref_id_offset = S->ref_offset;
    S->p.exclude_self = S->self ? 1 : S->p.exclude_self;
    if (S->p.device < 0) S->p.device = S->ctx->device;
    memset(&refm, 0, sizeof refm);
    if (S->nloc > 0) refm = *S->ref;
    if (S->nloc > 0 && S->st == XKNN_SUCCESS && S->kept) {
        /* an index's slice is on the GPU already: buffers for this search's blocks */
        char why[256];
        t0 = MPI_Wtime();
        if (xknn__resident_reserve(S->kept, &S->p, S->qb, S->k, why, sizeof why) == 0)
            S->resident = S->kept;
        else
            S->st = xknn__mpi_fail(&S->lerr, XKNN_ERROR_OUT_OF_MEMORY, "rank %d: %s", S->rank, why);
        S->tm.search += MPI_Wtime() - t0;
    } else if (S->nloc > 0 && S->st == XKNN_SUCCESS && !S->early_tried) {
        /* keep the slice on this rank's GPU for every block (counted as search time) */
        char why[256];
        t0 = MPI_Wtime();
        S->resident = xknn__resident_open(&S->p, S->p.device, &refm, S->qb, S->k, why, sizeof why);
        S->tm.search += MPI_Wtime() - t0;
        if (S->ctx->config.verbose && (S->p.backend != XKNN_BACKEND_CPU || S->resident))
            fprintf(stderr, "xknn_mpi: rank %d: %s\n", S->rank, S->resident ? "reference slice resident on the GPU" : why);
    }
    xknn__next_block(&S->it, &S->cur);
    t0 = MPI_Wtime();
    rc = xknn__run_bcast(S, &S->cur, S->qbuf[0]);
    S->tm.broadcast += MPI_Wtime() - t0;
    if (rc != MPI_SUCCESS) {
        S->st = xknn__mpi_error(S->rank, &S->lerr, rc, "MPI_Ibcast");
        S->mpi_broken = 1;
    }
    if (S->resident && !S->mpi_broken)
        xknn__run_resident_blocks(S, qoff_user);
    else
        for (b = 0; b < S->nblocks && !S->mpi_broken; b++)
            if (xknn__run_block(S, b, &refm, qoff_user) != 0) break;
    if (S->breq != MPI_REQUEST_NULL) MPI_Wait(&S->breq, MPI_STATUS_IGNORE);
    if (S->freq != MPI_REQUEST_NULL) MPI_Wait(&S->freq, MPI_STATUS_IGNORE);
}

/* The sizes agreed at the set-up, into the caller's stats. */
static void xknn__run_stats_setup(const xknn__search *S)
{
    xknn_mpi_stats *stats = S->stats;
    if (!stats) return;
    stats->n = S->n;
    stats->nq = S->nq;
    stats->d = S->d;
    stats->k = S->k;
    stats->query_block = S->qb;
    stats->blocks = S->nblocks;
    stats->ranks = S->P;
    stats->transfer = S->ctx->transfer;
}

/* Per-phase maxima: one more collective, on every path that reached an agreement (all
 * ranks take the same path); then the buffers go. */
static void xknn__run_finish(xknn__search *S)
{
    xknn_mpi_stats *stats = S->stats;
    double lt[6], mt[6];
    S->tm.total = MPI_Wtime() - S->t_begin;
    lt[0] = S->tm.read;
    lt[1] = S->tm.broadcast;
    lt[2] = S->tm.search;
    lt[3] = S->tm.reduce;
    lt[4] = S->tm.write;
    lt[5] = S->tm.total;
    if (MPI_Allreduce(lt, mt, 6, MPI_DOUBLE, MPI_MAX, S->ctx->comm) != MPI_SUCCESS) memcpy(mt, lt, sizeof mt);
    if (stats) {
        stats->blocks_owned = S->owned;
        stats->distance_evals = S->evals;
        stats->local = S->tm;
        stats->max.read = mt[0];
        stats->max.broadcast = mt[1];
        stats->max.search = mt[2];
        stats->max.reduce = mt[3];
        stats->max.write = mt[4];
        stats->max.total = mt[5];
    }
    if (S->resident != S->kept) xknn__resident_close(S->resident);
    xknn__resident_close(S->early);
    free(S->staging);
    free(S->cbase);
    free(S->qbuf[1]);
    free(S->qbuf[0]);
    free(S->order);
    free(S->tab);
    free(S->host_query);
    free(S->host_ref);
}

static xknn_status xknn__run(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                             int64_t ref_offset, const xknn__slice_state *held, const xknn_matrix *query,
                             int query_root, int self, int64_t k, const xknn_mpi_output *out_in,
                             xknn_mpi_stats *stats, xknn_error *err)
{
    const xknn_mpi_output none = XKNN_MPI_OUTPUT_INIT;
    xknn__search search, *S = &search;
    xknn_status agreed;
    memset(S, 0, sizeof *S);
    S->t_begin = MPI_Wtime();
    S->p = params ? *params : xknn_params_default();
    /* (the buffers of the call before, released in the background, are gone first) */
    xknn__mpi_later_wait(ctx);
    S->st = XKNN_SUCCESS;
    S->lerr.status = XKNN_SUCCESS;
    S->lerr.message[0] = '\0';
    S->dtype = XKNN_DTYPE_F32;
    S->breq = S->freq = MPI_REQUEST_NULL;
    if (stats) memset(stats, 0, sizeof *stats);
    if (!ctx) return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_mpi search: context is NULL");
    S->ctx = ctx;
    S->ref = ref;
    S->query = query;
    S->out = out_in ? out_in : &none;
    S->stats = stats;
    S->ref_offset = ref_offset;
    S->k = k;
    S->query_root = query_root;
    S->self = self;
    S->rank = ctx->rank;
    S->P = ctx->size;
    S->nloc = ref ? ref->rows : 0;
    if (held) {
        S->kept = held->resident;
        S->ref_checked = held->checked;
    }
    if (S->p.metric == XKNN_METRIC_MINKOWSKI && S->p.p == 0.0) S->p.p = 2.0;
    S->neg = S->p.metric == XKNN_METRIC_IP;

    xknn__run_check_local(S);
    if (xknn__run_exchange(S) == 0) xknn__run_plan(S);
    agreed = xknn_mpi_agree(ctx, S->st, &S->lerr);
    xknn__run_stats_setup(S);
    if (agreed != XKNN_SUCCESS) {
        S->st = agreed;
    } else {
        /* every rank's slice and the query root's queries passed the checks above: the
         * calls below (rows that travel included) do not scan them again */
        S->p.values_checked = 1;
        if (!self || !xknn__run_self(S)) {
            if (ctx->config.verbose && S->rank == 0)
                fprintf(stderr,
                        "xknn_mpi: %s n=%lld nq=%lld d=%lld k=%lld ranks=%d query_block=%lld blocks=%lld transfer=%s\n",
                        self ? "self-join" : "search", (long long)S->n, (long long)S->nq, (long long)S->d,
                        (long long)k, S->P, (long long)S->qb, (long long)S->nblocks,
                        xknn_mpi_transfer_name(ctx->transfer));
            xknn__run_pipeline(S);
        }
        S->st = xknn_mpi_agree(ctx, S->st, &S->lerr);
    }
    xknn__run_finish(S);
    if (err) *err = S->lerr;
    return S->st;
}

/* The one distributed search: every entry point (mpi/index.c) comes here with the state
 * of the slice it holds. query_root XKNN_MPI_SELF_JOIN selects the self-join (query
 * ignored), as in xknn_mpi_search_gather. */
xknn_status xknn__search_held(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                              int64_t ref_offset, const xknn__slice_state *held, const xknn_matrix *query,
                              int query_root, int64_t k, const xknn_mpi_output *out, xknn_mpi_stats *stats,
                              xknn_error *err)
{
    if (query_root == XKNN_MPI_SELF_JOIN)
        return xknn__run(ctx, params, ref, ref_offset, held, NULL, -1, 1, k, out, stats, err);
    return xknn__run(ctx, params, ref, ref_offset, held, query, query_root, 0, k, out, stats, err);
}
