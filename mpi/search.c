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

/* What the metric allows (NaN/Inf, negatives for hellinger, metric/dtype pair, p,
 * weights), naming the rank, the global row and the column. */
static xknn_status xknn__check_values(int rank, const xknn_params *p, const char *what, const xknn_matrix *m,
                                      int64_t row_offset, xknn_error *err)
{
    xknn_error e;
    xknn_status st = xknn_check_input(p, what, m, row_offset, &e);
    if (st != XKNN_SUCCESS) return xknn__mpi_fail(err, st, "rank %d: %s", rank, e.message);
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

static int64_t xknn__pick_query_block(int64_t cfg, int64_t nq, int64_t row_bytes, int64_t k, int P)
{
    int64_t qb;
    if (cfg > 0) {
        qb = cfg;
    } else {
        qb = (nq + 4 * (int64_t)P - 1) / (4 * (int64_t)P);
        if (qb < 64) qb = 64;
        if (qb > 2048) qb = 2048;
        while (qb > 1 && (double)qb * (double)(2 * row_bytes + 4 * k * 12) > 256.0 * 1024 * 1024) qb /= 2;
    }
    if (qb > nq) qb = nq;
    if (qb > INT32_MAX / row_bytes) qb = INT32_MAX / row_bytes; /* MPI_Ibcast count is an int */
    if (qb < 1) qb = 1;
    return qb;
}

static xknn_status xknn__run(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                             int64_t ref_offset, const xknn_matrix *query, int query_root, int self, int64_t k,
                             const xknn_mpi_output *out_in, xknn_mpi_stats *stats, xknn_error *err)
{
    const xknn_mpi_output none = XKNN_MPI_OUTPUT_INIT;
    const xknn_mpi_output *out = out_in ? out_in : &none;
    const double t_begin = MPI_Wtime();
    xknn_params p = params ? *params : xknn_params_default();
    /* (the buffers of the call before, released in the background, are gone first) */
    xknn__mpi_later_wait(ctx);
    xknn_error lerr;
    xknn_status st = XKNN_SUCCESS; /* this rank's own status                      */
    xknn_status agreed;
    xknn_mpi_timings tm;
    int rank, P, i, rc;
    int64_t my[D_COUNT], *tab = NULL;
    int *order = NULL, norder = 0;
    int64_t nloc, n = 0, d = 0, nq = 0, qb = 0, nblocks = 0, b, done_q = 0, owned = 0, evals = 0;
    unsigned char *qbuf[2] = {NULL, NULL};
    int64_t row_bytes = 0;
    xknn_dtype dtype = XKNN_DTYPE_F32;
    int neg;
    void *cbase = NULL;
    unsigned char *staging = NULL;
    xknn__cands cand, recvb, spare;
    xknn__blocks it;
    xknn__block cur, nxt;
    MPI_Request breq = MPI_REQUEST_NULL, freq = MPI_REQUEST_NULL;
    int fsend = 0, frecv = 0, stop = 0, mpi_broken = 0;
    xknn__resident *resident = NULL;

    memset(&tm, 0, sizeof tm);
    memset(&it, 0, sizeof it);
    memset(&cur, 0, sizeof cur);
    memset(&nxt, 0, sizeof nxt);
    lerr.status = XKNN_SUCCESS;
    lerr.message[0] = '\0';
    if (stats) memset(stats, 0, sizeof *stats);
    if (!ctx) return xknn__mpi_fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_mpi search: context is NULL");
    rank = ctx->rank;
    P = ctx->size;
    nloc = ref ? ref->rows : 0;
    if (p.metric == XKNN_METRIC_MINKOWSKI && p.p == 0.0) p.p = 2.0;
    neg = p.metric == XKNN_METRIC_IP;

    /* ---- 1. local checks (no communication) ---------------------------------------- */
    if (nloc < 0)
        st = xknn__mpi_fail(&lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: reference has %lld rows", rank,
                            (long long)nloc);
    else if (nloc > 0) {
        st = xknn__check_arg(rank, "reference", ref, &lerr);
        if (st == XKNN_SUCCESS && ref_offset < 0)
            st = xknn__mpi_fail(&lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: ref_offset=%lld: need >= 0", rank,
                                (long long)ref_offset);
    }
    if (st == XKNN_SUCCESS && ((int)p.metric < 0 || p.metric >= XKNN_METRIC_COUNT))
        st = xknn__mpi_fail(&lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: unknown metric %d", rank, (int)p.metric);
    if (st == XKNN_SUCCESS && !self && rank == query_root) {
        if (!query)
            st = xknn__mpi_fail(&lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: query matrix is NULL on the query root",
                                rank);
        else if (query->rows <= 0)
            st = xknn__mpi_fail(&lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: query has %lld rows: need at least 1",
                                rank, (long long)query->rows);
        else
            st = xknn__check_arg(rank, "query", query, &lerr);
    }
    if (st == XKNN_SUCCESS && out->gather_root == rank && !out->ids)
        st = xknn__mpi_fail(&lerr, XKNN_ERROR_INVALID_ARGUMENT, "rank %d: gather ids is NULL on the gather root", rank);
    if (st == XKNN_SUCCESS && nloc > 0) st = xknn__check_values(rank, &p, "reference", ref, ref_offset, &lerr);
    if (st == XKNN_SUCCESS && !self && rank == query_root)
        st = xknn__check_values(rank, &p, "query", query, 0, &lerr);

    /* ---- 2. everyone learns everyone's arguments ----------------------------------- */
    memset(my, 0, sizeof my);
    my[D_STATUS] = st;
    my[D_ROW0] = nloc > 0 ? ref_offset : 0;
    my[D_ROWS] = nloc > 0 ? nloc : 0;
    my[D_COLS] = nloc > 0 ? ref->cols : 0;
    my[D_K] = k;
    my[D_METRIC] = p.metric;
    my[D_SELF] = self;
    my[D_QROOT] = self ? -1 : query_root;
    my[D_GROOT] = out->gather_root;
    my[D_QBLOCK] = ctx->config.query_block;
    my[D_NQ] = (!self && rank == query_root && query) ? query->rows : 0;
    my[D_QCOLS] = (!self && rank == query_root && query) ? query->cols : 0;
    my[D_EXCL] = self ? 1 : (p.exclude_self != 0);
    my[D_QOFF] = self ? 0 : p.query_id_offset;
    my[D_DTYPE] = nloc > 0 ? ref->dtype : 0;
    my[D_QDTYPE] = (!self && rank == query_root && query) ? query->dtype : 0;
    memcpy(&my[D_PBITS], &p.p, sizeof(double));
    my[D_WCOUNT] = p.metric == XKNN_METRIC_WHAMMING ? p.weights_count : 0;
    tab = (int64_t *)malloc((size_t)P * D_COUNT * sizeof(int64_t));
    order = (int *)malloc((size_t)P * sizeof(int));
    {
        /* A rank that could not allocate the table cannot join the allgather: everyone
         * learns that first. Healthy ranks keep their own status: the agreement takes
         * the message of the rank that actually failed. */
        int have = tab && order, all = 0;
        if (!have)
            st = xknn__mpi_fail(&lerr, XKNN_ERROR_OUT_OF_MEMORY, "rank %d: out of memory (table of %d ranks)", rank,
                                P);
        rc = MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, ctx->comm);
        if (rc != MPI_SUCCESS) {
            st = xknn__mpi_error(rank, &lerr, rc, "MPI_Allreduce");
            goto agree_setup;
        }
        if (!all) goto agree_setup;
    }
    rc = MPI_Allgather(my, D_COUNT, MPI_INT64_T, tab, D_COUNT, MPI_INT64_T, ctx->comm);
    if (rc != MPI_SUCCESS) {
        st = xknn__mpi_error(rank, &lerr, rc, "MPI_Allgather");
        goto agree_setup;
    }

    /* ---- 3. global checks, plan, buffers ------------------------------------------- */
    /* If some rank failed its local checks, the others skip the plan and agree: the
     * verdict carries the failing rank's message. */
    for (i = 0; i < P; i++)
        if (tab[i * D_COUNT + D_STATUS] != XKNN_SUCCESS) goto agree_setup;
    st = xknn__check_table(tab, P, order, &norder, &n, &d, &nq, &lerr);
    if (st == XKNN_SUCCESS) {
        size_t m, bytes;
        for (i = 0; i < P; i++)
            if (tab[i * D_COUNT + D_ROWS] > 0) {
                dtype = (xknn_dtype)tab[i * D_COUNT + D_DTYPE];
                break;
            }
        row_bytes = xknn_row_bytes(dtype, d);
        qb = xknn__pick_query_block(ctx->config.query_block, nq, row_bytes, k, P);
        it.self = self;
        it.P = P;
        it.nq = nq;
        it.qb = qb;
        it.qroot = self ? -1 : query_root;
        it.order = order;
        it.norder = norder;
        it.tab = tab;
        nblocks = xknn__count_blocks(&it);
        m = (size_t)qb * (size_t)k;
        if ((double)qb * (double)k * 12.0 * 4.0 > (double)SIZE_MAX / 2) {
            st = xknn__mpi_fail(&lerr, XKNN_ERROR_OUT_OF_MEMORY, "rank %d: k=%lld is too large for this machine",
                                rank, (long long)k);
        } else {
            bytes = 3 * m * (sizeof(int64_t) + sizeof(float));
            qbuf[0] = (unsigned char *)malloc((size_t)(qb * row_bytes));
            qbuf[1] = (unsigned char *)malloc((size_t)(qb * row_bytes));
            cbase = malloc(bytes);
            if (ctx->transfer == XKNN_MPI_TRANSFER_HOST_STAGED)
                staging = (unsigned char *)malloc(m * (sizeof(int64_t) + sizeof(float)));
            if (!qbuf[0] || !qbuf[1] || !cbase || (ctx->transfer == XKNN_MPI_TRANSFER_HOST_STAGED && !staging)) {
                st = xknn__mpi_fail(&lerr, XKNN_ERROR_OUT_OF_MEMORY,
                                    "rank %d: out of memory for query block buffers (query_block=%lld, k=%lld, "
                                    "d=%lld: %.1f MiB); lower query_block",
                                    rank, (long long)qb, (long long)k, (long long)d,
                                    (double)(bytes + 2 * (size_t)(qb * row_bytes) + (staging ? m * 12 : 0)) / 1048576.0);
            } else {
                int64_t *ib = (int64_t *)cbase;
                float *fb = (float *)(ib + 3 * m);
                cand.ids = ib;
                cand.dist = fb;
                recvb.ids = ib + m;
                recvb.dist = fb + m;
                spare.ids = ib + 2 * m;
                spare.dist = fb + 2 * m;
            }
        }
    }

agree_setup:
    agreed = xknn_mpi_agree(ctx, st, &lerr);
    if (stats) {
        stats->n = n;
        stats->nq = nq;
        stats->d = d;
        stats->k = k;
        stats->query_block = qb;
        stats->blocks = nblocks;
        stats->ranks = P;
        stats->transfer = ctx->transfer;
    }
    if (agreed != XKNN_SUCCESS) {
        st = agreed;
        goto finish;
    }
    /* every rank's slice and the query root's queries passed the checks above: the
     * calls below (rows that travel included) do not scan them again */
    p.values_checked = 1;
    if (self) {
        /* Symmetric when every rank's backend allows it (the device count may differ
         * between ranks): one more agreement, on a flag. */
        const char *why = xknn_search_pair_why_not(&p, dtype, d);
        int mine = why == NULL, all = 0;
        rc = MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, ctx->comm);
        if (rc != MPI_SUCCESS) {
            st = xknn__mpi_error(rank, &lerr, rc, "MPI_Allreduce (symmetric)");
            goto verdict;
        }
        /* one rank on a GPU: the backend's own self-join (its triangle, in blocks where
         * the state does not fit), not the ring's one pair through extra lists */
        const int gpu = p.backend == XKNN_BACKEND_CUDA || (p.backend == XKNN_BACKEND_AUTO && ctx->device >= 0);
        if ((!all || gpu) && P == 1 && nloc > 0 && xknn_self_join_why_plain(&p, dtype, d) == NULL) {
            if (ctx->config.verbose)
                fprintf(stderr, "xknn_mpi: self-join: one rank: the backend's own symmetric self-join\n");
            if (p.device < 0) p.device = ctx->device;
            st = xknn__self_local(ctx, rank, &p, ref, ref_offset, k, out, &tm, &lerr);
            if (st == XKNN_SUCCESS) {
                owned = 1;
                evals = n * (n - 1) / 2;
            }
            if (stats) stats->blocks = 1;
            goto verdict;
        }
        if (ctx->config.verbose && rank == 0) {
            if (all)
                fprintf(stderr, "xknn_mpi: self-join: symmetric ring\n");
            else
                fprintf(stderr, "xknn_mpi: self-join: plain search (%s)\n",
                        why ? why : "another rank's backend has no symmetric kernel");
        }
        if (all) {
            int64_t *row0s = (int64_t *)malloc((size_t)P * 2 * sizeof(int64_t));
            int have = row0s != NULL, every = 0;
            if (!have) st = xknn__mpi_fail(&lerr, XKNN_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", rank);
            rc = MPI_Allreduce(&have, &every, 1, MPI_INT, MPI_MIN, ctx->comm);
            if (rc == MPI_SUCCESS && every) {
                for (i = 0; i < P; i++) {
                    row0s[i] = tab[i * D_COUNT + D_ROW0];
                    row0s[P + i] = tab[i * D_COUNT + D_ROWS];
                }
                p.ref_id_offset = ref_offset;
                if (p.device < 0) p.device = ctx->device; /* the pair kernel runs on the rank's GPU */
                const double tr = MPI_Wtime();
                xknn__sym_job job;
                xknn__sym_tally tally = {0, 0, 0};
                job.params = &p;
                job.ref = nloc > 0 ? ref : NULL;
                job.ref_offset = ref_offset;
                job.k = k;
                job.d = d;
                job.dtype = dtype;
                job.row0s = row0s;
                job.rowss = row0s + P;
                job.out = out;
                st = xknn__sym_ring(ctx, &job, &tm, &tally, &lerr);
                owned += tally.owned;
                evals = tally.evals;
                mpi_broken = tally.mpi_broken;
                {
                    /* XKNN_MPI_SYM_TRACE=1 (a diagnostic): what the setup took before the ring */
                    const char *env = getenv("XKNN_MPI_SYM_TRACE");
                    if (env && env[0] == '1')
                        fprintf(stderr, "xknn_mpi: trace rank %d: the ring ran from %.3f to %.3f s of the self-join\n",
                                rank, tr - t_begin, MPI_Wtime() - t_begin);
                }
            } else if (rc != MPI_SUCCESS) {
                st = xknn__mpi_error(rank, &lerr, rc, "MPI_Allreduce");
            }
            free(row0s);
            if (stats) stats->blocks = norder;
            goto verdict;
        }
    }
    if (ctx->config.verbose && rank == 0)
        fprintf(stderr,
                "xknn_mpi: %s n=%lld nq=%lld d=%lld k=%lld ranks=%d query_block=%lld blocks=%lld transfer=%s\n",
                self ? "self-join" : "search", (long long)n, (long long)nq, (long long)d, (long long)k, P,
                (long long)qb, (long long)nblocks, xknn_mpi_transfer_name(ctx->transfer));

    /* ---- 4. the pipeline ----------------------------------------------------------- */
    p.pad_missing = 1;
    p.ref_id_offset = ref_offset;
    p.exclude_self = self ? 1 : p.exclude_self;
    if (p.device < 0) p.device = ctx->device;
    {
        const int64_t qoff_user = self ? 0 : p.query_id_offset;
        double t0;
        xknn_matrix refm;
        memset(&refm, 0, sizeof refm);
        if (nloc > 0) refm = *ref;
        if (nloc > 0 && st == XKNN_SUCCESS) {
            /* keep the slice on this rank's GPU for every block (counted as search time) */
            char why[256];
            t0 = MPI_Wtime();
            resident = xknn__resident_open(&p, p.device, &refm, qb, k, why, sizeof why);
            tm.search += MPI_Wtime() - t0;
            if (ctx->config.verbose && (p.backend != XKNN_BACKEND_CPU || resident))
                fprintf(stderr, "xknn_mpi: rank %d: %s\n", rank,
                        resident ? "reference slice resident on the GPU" : why);
        }

        xknn__next_block(&it, &cur);
        t0 = MPI_Wtime();
        if (cur.src == rank)
            xknn__pack(qbuf[0], self ? ref : query, self ? cur.q0 - ref_offset : cur.q0, cur.rows, row_bytes);
        rc = MPI_Ibcast(qbuf[0], (int)(cur.rows * row_bytes), MPI_BYTE, cur.src, ctx->comm, &breq);
        tm.broadcast += MPI_Wtime() - t0;
        if (rc != MPI_SUCCESS) {
            st = xknn__mpi_error(rank, &lerr, rc, "MPI_Ibcast");
            mpi_broken = 1;
        }

        for (b = 0; b < nblocks && !mpi_broken; b++) {
            unsigned char *qcur = qbuf[b & 1];
            const int owner = (int)(b % P);
            const xknn__cands *res = NULL;
            xknn__cands mine = cand, sp = spare;

            /* this block's queries; then the next block goes in flight */
            t0 = MPI_Wtime();
            rc = MPI_Wait(&breq, MPI_STATUS_IGNORE);
            if (rc == MPI_SUCCESS && b + 1 < nblocks) {
                xknn__next_block(&it, &nxt);
                if (nxt.src == rank)
                    xknn__pack(qbuf[(b + 1) & 1], self ? ref : query, self ? nxt.q0 - ref_offset : nxt.q0, nxt.rows,
                               row_bytes);
                rc = MPI_Ibcast(qbuf[(b + 1) & 1], (int)(nxt.rows * row_bytes), MPI_BYTE, nxt.src, ctx->comm,
                                &breq);
            }
            tm.broadcast += MPI_Wtime() - t0;
            if (rc != MPI_SUCCESS) {
                st = xknn__mpi_error(rank, &lerr, rc, "MPI_Wait/MPI_Ibcast (query block)");
                mpi_broken = 1;
                break;
            }

            /* local top k with global ids; padding when there is nothing to search */
            t0 = MPI_Wtime();
            if (st != XKNN_SUCCESS || nloc == 0) {
                xknn__lists_pad(mine.ids, mine.dist, cur.rows * k, neg); /* nothing to search */
            } else {
                xknn_matrix qm = XKNN_MATRIX_TYPED(qcur, cur.rows, d, dtype);
                xknn_error e;
                xknn_status s;
                MPI_Request pending = breq; /* the next block's broadcast progresses meanwhile */
                p.query_id_offset = (self ? 0 : qoff_user) + cur.q0;
                s = resident ? xknn__resident_search(resident, &p, (const float *)(const void *)qcur, cur.rows, mine.ids,
                                                   mine.dist, xknn__progress, &pending, &e)
                             : xknn_search(&p, &refm, &qm, k, mine.ids, mine.dist, &e);
                breq = pending;
                evals += cur.rows * nloc;
                if (s != XKNN_SUCCESS) {
                    st = xknn__mpi_fail(&lerr, s, "rank %d: %s", rank, e.message);
                    xknn__lists_pad(mine.ids, mine.dist, cur.rows * k, neg);
                }
            }
            tm.search += MPI_Wtime() - t0;

            /* merge to the owner, then deliver */
            t0 = MPI_Wtime();
            rc = xknn__tree_reduce(ctx, owner, cur.rows, k, neg, &mine, &recvb, &sp, staging, &res);
            if (rc == MPI_SUCCESS && out->gather_root >= 0) {
                if (rank == owner && owner == out->gather_root) {
                    memcpy(out->ids + cur.q0 * k, res->ids, (size_t)(cur.rows * k) * sizeof(int64_t));
                    if (out->dist) memcpy(out->dist + cur.q0 * k, res->dist, (size_t)(cur.rows * k) * sizeof(float));
                } else if (rank == owner) {
                    rc = xknn__mpi_send_cands(ctx, res, cur.rows, k, staging, out->gather_root, XKNN__TAG_GATHER);
                } else if (rank == out->gather_root) {
                    rc = xknn__mpi_recv_cands(ctx, &recvb, cur.rows, k, staging, owner, XKNN__TAG_GATHER);
                    if (rc == MPI_SUCCESS) {
                        memcpy(out->ids + cur.q0 * k, recvb.ids, (size_t)(cur.rows * k) * sizeof(int64_t));
                        if (out->dist)
                            memcpy(out->dist + cur.q0 * k, recvb.dist, (size_t)(cur.rows * k) * sizeof(float));
                    }
                }
            }
            tm.reduce += MPI_Wtime() - t0;
            if (rc != MPI_SUCCESS) {
                st = xknn__mpi_error(rank, &lerr, rc, "MPI_Send/MPI_Recv (candidate lists)");
                mpi_broken = 1;
                break;
            }
            if (rank == owner) {
                owned++;
                if (out->sink && st == XKNN_SUCCESS) {
                    xknn_error e;
                    xknn_status s;
                    e.status = XKNN_SUCCESS;
                    e.message[0] = '\0';
                    t0 = MPI_Wtime();
                    s = out->sink(out->sink_user, cur.q0, cur.rows, k, res->ids, res->dist, &e);
                    tm.write += MPI_Wtime() - t0;
                    if (s != XKNN_SUCCESS) {
                        if (e.message[0])
                            st = xknn__mpi_fail(&lerr, s, "rank %d: %s", rank, e.message);
                        else
                            st = xknn__mpi_fail(&lerr, s, "rank %d: result sink failed on rows %lld..%lld: %s", rank,
                                                (long long)cur.q0, (long long)(cur.q0 + cur.rows - 1),
                                                xknn_status_string(s));
                    }
                }
            }
            done_q += cur.rows;
            if (out->progress) out->progress(out->progress_user, done_q, nq);

            /* Error agreement, one block behind so it overlaps the next search: every
             * rank sees the same flag at the same block and stops together. */
            if (freq != MPI_REQUEST_NULL) {
                rc = MPI_Wait(&freq, MPI_STATUS_IGNORE);
                if (rc != MPI_SUCCESS) {
                    st = xknn__mpi_error(rank, &lerr, rc, "MPI_Wait (error flag)");
                    mpi_broken = 1;
                    break;
                }
                if (frecv) stop = 1;
            }
            if (stop) break;
            if (b + 1 < nblocks) {
                fsend = st != XKNN_SUCCESS;
                rc = MPI_Iallreduce(&fsend, &frecv, 1, MPI_INT, MPI_MAX, ctx->comm, &freq);
                if (rc != MPI_SUCCESS) {
                    st = xknn__mpi_error(rank, &lerr, rc, "MPI_Iallreduce (error flag)");
                    mpi_broken = 1;
                    break;
                }
            }
            cur = nxt;
        }
        /* Requests every rank posted: complete them before the final agreement. */
        if (breq != MPI_REQUEST_NULL) MPI_Wait(&breq, MPI_STATUS_IGNORE);
        if (freq != MPI_REQUEST_NULL) MPI_Wait(&freq, MPI_STATUS_IGNORE);
    }

    /* ---- 5. the verdict ------------------------------------------------------------ */
verdict:
    st = xknn_mpi_agree(ctx, st, &lerr);

finish:
    tm.total = MPI_Wtime() - t_begin;
    {
        /* Per-phase maxima: one more collective, on every path that reached an
         * agreement (all ranks take the same path). */
        double lt[6], mt[6];
        lt[0] = tm.read;
        lt[1] = tm.broadcast;
        lt[2] = tm.search;
        lt[3] = tm.reduce;
        lt[4] = tm.write;
        lt[5] = tm.total;
        if (MPI_Allreduce(lt, mt, 6, MPI_DOUBLE, MPI_MAX, ctx->comm) != MPI_SUCCESS) memcpy(mt, lt, sizeof mt);
        if (stats) {
            stats->blocks_owned = owned;
            stats->distance_evals = evals;
            stats->local = tm;
            stats->max.read = mt[0];
            stats->max.broadcast = mt[1];
            stats->max.search = mt[2];
            stats->max.reduce = mt[3];
            stats->max.write = mt[4];
            stats->max.total = mt[5];
        }
    }
    xknn__resident_close(resident);
    free(staging);
    free(cbase);
    free(qbuf[1]);
    free(qbuf[0]);
    free(order);
    free(tab);
    if (err) *err = lerr;
    return st;
}

xknn_status xknn_mpi_search(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                            int64_t ref_offset, const xknn_matrix *query, int query_root, int64_t k,
                            const xknn_mpi_output *out, xknn_mpi_stats *stats, xknn_error *err)
{
    return xknn__run(ctx, params, ref, ref_offset, query, query_root, 0, k, out, stats, err);
}

xknn_status xknn_mpi_self_join(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                               int64_t ref_offset, int64_t k, const xknn_mpi_output *out, xknn_mpi_stats *stats,
                               xknn_error *err)
{
    return xknn__run(ctx, params, ref, ref_offset, NULL, -1, 1, k, out, stats, err);
}

xknn_status xknn_mpi_search_gather(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                                   int64_t ref_offset, const xknn_matrix *query, int query_root, int64_t k,
                                   int gather_root, int64_t *ids, float *dist, xknn_error *err)
{
    xknn_mpi_output out = XKNN_MPI_OUTPUT_INIT;
    out.gather_root = gather_root;
    out.ids = ids;
    out.dist = dist;
    if (query_root == XKNN_MPI_SELF_JOIN) return xknn__run(ctx, params, ref, ref_offset, NULL, -1, 1, k, &out, NULL, err);
    return xknn__run(ctx, params, ref, ref_offset, query, query_root, 0, k, &out, NULL, err);
}
