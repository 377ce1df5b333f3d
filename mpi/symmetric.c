/*
 * mpi/symmetric.c -- the symmetric distributed self-join (the all-kNN graph).
 *
 * Rank r owns slice r (m_r rows). Every distance d(i, j) serves both i and j, so each
 * unordered pair of rows is evaluated exactly once, by one rank, with xknn_search_pair.
 * The ring schedule: in step s = 0 .. S, S = floor(P/2), rank r holds slice
 * (r + s) mod P (s = 0: its own) and works on the pair (slice r, slice (r + s) mod P).
 * With (b - a) mod P = s, the slice pair {a, b} is rank a's step s when s < P - s and
 * rank b's step P - s when s > P - s; only for even P is s = P - s = P/2 reached from
 * both ends, by rank r < P/2 and rank r + P/2 in step S, each holding the other's slice.
 *
 * Work is counted in distance evaluations: a rectangle of ra x rb rows is ra * rb, a
 * slice's diagonal (the slice with itself) is m(m-1)/2. What rank r computes:
 *   - step 0: the diagonal of slice r, except its first cut[r] rows;
 *   - step 1 (P >= 2): the first cut[j] rows of slice j = r + 1's diagonal, i.e. the
 *     triangle of rows [0, cut[j]) and their rectangle against rows [cut[j], m_j)
 *     (top(m, c) = c(c-1)/2 + c(m-c) evaluations);
 *   - steps 1 <= s < P/2 (every s <= S for odd P): the full pair, m_r * m_(r+s);
 *   - step S of even P: the pair (a, a + P/2), a < P/2, split by rows of slice a: rows
 *     [0, half[a]) against slice a + P/2 on rank a, rows [half[a], m_a) on rank
 *     a + P/2 (a rectangle feeding both sides' k-best lists; the ring has brought each
 *     rank the other's slice by then), half[a] = floor(m_a / 2).
 * Balance. With equal slices m, before the cuts every rank does m(m-1)/2 + (P-1)/2 m^2
 * (odd P: (P-1)/2 full pairs; even P: P/2 - 1 full pairs and two halves of m^2/2), which
 * sums to N(N-1)/2, N = P m: the schedule itself is balanced (the old even-P schedule,
 * with the whole last pair on ranks r < P/2, gave those ranks m^2 more than the others:
 * at P = 2, 1.5 m^2 against 0.5 m^2). Unequal slices (n not a multiple of P; the
 * standard slicing differs by one row) leave rank r's base work B_r off the mean T/P by
 * a few rows' worth; the cuts move diagonal rows between neighbours to absorb that: with
 * g_r = P * top(m_r, cut[r]) the work rank r hands to rank r - 1 (scaled by P), rank r
 * does W_r = B_r - top_r + top_(r+1), and g_(r+1) = g_r - (P B_r - T) makes every
 * P W_r - T zero; g_r = G - sum_(j<r) (P B_j - T) with G the largest prefix keeps
 * g >= 0. cut[r] is the row count whose top() is nearest to g_r / P: top grows by at most
 * m_r - 1 per row, so each cut is off by at most (m_r - 1)/2 evaluations and
 * |W_r - T/P| <= (m_r - 1)/2 + (m_(r+1) - 1)/2 < the largest slice's row count -- one
 * row of work -- whenever the cuts fit in their diagonals (g_r <= P m_r(m_r-1)/2; with
 * the standard slicing, whenever every slice has more than 1.5 P rows, checked
 * exhaustively for P <= 64; tiny or skewed slices get the nearest fit). The plan is integer arithmetic on the agreed slice table, identical on
 * every rank; above P n^2 ~ 2^61 (n ~ 10^9 / sqrt(P)) it keeps cut = 0 rather than
 * overflow. Every rank's evaluations and busy seconds come back in xknn_mpi_stats
 * (distance_evals, local.search) and, with verbose, are printed by rank 0.
 *
 * Slices travel around the ring: in step s rank r holds slice (r + s) mod P, so for
 * step s + 1 it receives from rank r + 1 the slice that rank held in step s, while it
 * sends its own to rank r - 1 (every rank relays, also one with an empty slice). Both
 * are posted (MPI_Isend/MPI_Irecv) before step s's compute and completed after it, so
 * the transfer overlaps the compute as far as the MPI library progresses it (no progress
 * thread: see xknn_mpi.h).
 *
 * A rank ends with k-best lists of its own rows and of the rows of the slices it
 * visited (one list set per step, all starting as padding). For each slice (in rank
 * order), every rank contributes what it has for those rows (padding if nothing) to the
 * binomial-tree reduction of the plain search (xknn__tree_reduce, whose merge orders by
 * (distance, id), padding last), rooted at the slice's owner, which then delivers its
 * rows (sink, gather) like a plain block. The lists are host memory, so they travel as
 * they are, without a staging copy. Each list set is the exact k best of the pairs
 * that rank evaluated for those rows, and the ranks' pairs partition all pairs, so the
 * merge gives the plain self-join's ids and distance bits.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "impl.h"

static void xknn__sym_pad(int64_t *ids, float *dist, int64_t m, int neg)
{
    int64_t i;
    for (i = 0; i < m; i++) {
        ids[i] = -1;
        dist[i] = neg ? -INFINITY : INFINITY;
    }
}

/* Distance evaluations of a diagonal of m rows, and of its first h rows (their
 * triangle and their rectangle against the rows after them). */
static int64_t xknn__sym_tri(int64_t m)
{
    return m > 1 ? m * (m - 1) / 2 : 0;
}

static int64_t xknn__sym_top(int64_t m, int64_t h)
{
    return xknn__sym_tri(h) + h * (m - h);
}

/* The plan (see the opening comment): half[a], a < P/2 (even P), and cut[j], from the
 * slice sizes m[0..P-1]; integer arithmetic only, so every rank computes the same.
 * g: scratch of P + 1 values. */
static void xknn__sym_plan(int P, const int64_t *m, int64_t *half, int64_t *cut, int64_t *g)
{
    const int S = P / 2;
    int64_t n = 0, T = 0, G = 0;
    int r, s;
    for (r = 0; r < P; r++) {
        half[r] = P % 2 == 0 && r < S ? m[r] / 2 : 0;
        cut[r] = 0;
        n += m[r];
    }
    if (P < 2 || n < 2) return;
    /* P * (prefix sums of P B_r - T) stays within 4 P T <= 2 P n^2 */
    if (n > INT64_C(2000000000) || n * n > INT64_MAX / 4 / P) return;
    for (r = 0; r < P; r++) {
        /* base work B_r, kept in g[r] for now */
        int64_t b = xknn__sym_tri(m[r]);
        for (s = 1; s <= S; s++) {
            const int j = (r + s) % P;
            if (s < P - s)
                b += m[r] * m[j];
            else if (r < S)
                b += half[r] * m[j];
            else
                b += (m[j] - half[j]) * m[r];
        }
        g[r] = b;
        T += b;
    }
    /* g[r] <- sum_(j<r) (P B_j - T) */
    {
        int64_t pre = 0;
        for (r = 0; r < P; r++) {
            const int64_t d = P * g[r] - T;
            g[r] = pre;
            pre += d;
            if (g[r] > G) G = g[r];
        }
    }
    for (r = 0; r < P; r++) {
        /* the cut whose P * top() is nearest to G - prefix: top() is nondecreasing */
        const int64_t want = G - g[r];
        int64_t lo = 0, hi = m[r];
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (P * xknn__sym_top(m[r], mid) >= want)
                hi = mid;
            else
                lo = mid + 1;
        }
        if (lo > 0 && want - P * xknn__sym_top(m[r], lo - 1) < P * xknn__sym_top(m[r], lo) - want) lo--;
        cut[r] = lo;
    }
}

/* Rows [r0, r0 + rows) of m, as a matrix of their own. */
static xknn_matrix xknn__sym_rows(const xknn_matrix *m, int64_t r0, int64_t rows)
{
    const int64_t elems = xknn_row_elems(m->dtype, m->cols);
    xknn_matrix v = *m;
    v.data = (const unsigned char *)m->data + r0 * (m->ld ? m->ld : elems) * (xknn_row_bytes(m->dtype, m->cols) / elems);
    v.rows = rows;
    return v;
}

/* Rows [a0, a0 + ra) of slice a (global ids aid + row, lists aids/adist of the whole
 * slice, ld = k) against rows [b0, b0 + rb) of slice b, or (b NULL) among themselves
 * (callers never pass an empty slice's NULL matrix as b);
 * adds the distance evaluations to *evals. Nothing to do for an empty side. */
static xknn_status xknn__sym_call(const xknn_params *p, int64_t k, const xknn_matrix *a, int64_t a0, int64_t ra,
                                  int64_t aid, int64_t *aids, float *adist, const xknn_matrix *b, int64_t b0,
                                  int64_t rb, int64_t bid, int64_t *bids, float *bdist, int64_t *evals, xknn_error *e)
{
    xknn_matrix va, vb;
    if (ra <= 0 || (b && rb <= 0)) return XKNN_SUCCESS;
    va = xknn__sym_rows(a, a0, ra);
    if (b) vb = xknn__sym_rows(b, b0, rb);
    *evals += b ? ra * rb : xknn__sym_tri(ra);
    return xknn_search_pair(p, &va, aid + a0, b ? &vb : NULL, b ? bid + b0 : 0, k, aids + a0 * k, adist + a0 * k,
                            b ? bids + b0 * k : NULL, b ? bdist + b0 * k : NULL, e);
}

xknn_status xknn__sym_ring(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                           int64_t ref_offset, int64_t k, const int64_t *row0s, const int64_t *rowss, int64_t d,
                           xknn_dtype dtype, const xknn_mpi_output *out, xknn_mpi_timings *tm, int64_t *owned,
                           int64_t *evals, int *mpi_broken, xknn_error *lerr)
{
    const int rank = ctx->rank, P = ctx->size, S = P / 2;
    const int neg = params->metric == XKNN_METRIC_IP;
    const int64_t row_bytes = xknn_row_bytes(dtype, d), nloc = rowss[rank];
    const int left = (rank - 1 + P) % P, right = (rank + 1) % P;
    xknn_params p = *params;
    xknn_status st = XKNN_SUCCESS;
    int64_t maxrows = 0, done_q = 0, n = 0, nev = 0;
    int64_t *plan = NULL, *half, *cut;   /* the plan: half, cut, scratch (P + 1)       */
    int64_t *allev = NULL;               /* rank 0: every rank's distance evaluations  */
    unsigned char *slice[2] = {NULL, NULL};
    int64_t *lid = NULL, *cid = NULL;
    float *ldist = NULL, *cdist = NULL;
    const unsigned char *own = NULL; /* the own slice as it travels: ref's rows, or a dense copy */
    double *all = NULL; /* rank 0: every rank's busy seconds */
    MPI_Datatype rowtype = MPI_DATATYPE_NULL;
    int s, j, rc;
    double t0;

    for (j = 0; j < P; j++) {
        if (rowss[j] > maxrows) maxrows = rowss[j];
        n += rowss[j];
    }
    /* lists: own rows (step 0) and the visited slices' rows (steps 1 .. S) */
    lid = (int64_t *)malloc((size_t)((S + 1) * maxrows * k) * sizeof(int64_t));
    ldist = (float *)malloc((size_t)((S + 1) * maxrows * k) * sizeof(float));
    /* tree reduction: received, spare, and padding for a slice this rank never held
     * (3 x maxrows x k); a held slice's lists go in as they are (the reduction may
     * overwrite them: they are not needed after it) */
    cid = (int64_t *)malloc((size_t)(3 * maxrows * k) * sizeof(int64_t));
    cdist = (float *)malloc((size_t)(3 * maxrows * k) * sizeof(float));
    slice[0] = (unsigned char *)malloc((size_t)(maxrows * row_bytes) + 1);
    slice[1] = (unsigned char *)malloc((size_t)(maxrows * row_bytes) + 1);
    plan = (int64_t *)malloc((size_t)(3 * P + 1) * sizeof(int64_t));
    if (rank == 0) {
        all = (double *)malloc((size_t)P * sizeof(double));
        allev = (int64_t *)malloc((size_t)P * sizeof(int64_t));
    }
    {
        /* Every rank learns whether all could allocate before anything travels; a rank
         * that could not carries the message to the caller's final agreement. */
        int have = lid && ldist && cid && cdist && slice[0] && slice[1] && plan && (rank != 0 || (all && allev)),
            all = 0;
        if (!have)
            st = xknn__mpi_fail(lerr, XKNN_ERROR_OUT_OF_MEMORY,
                                "rank %d: out of memory for the symmetric self-join (%d slices of %lld rows, k=%lld)",
                                rank, S + 1, (long long)maxrows, (long long)k);
        rc = MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, ctx->comm);
        if (rc != MPI_SUCCESS) {
            st = xknn__mpi_error(rank, lerr, rc, "MPI_Allreduce");
            *mpi_broken = 1;
            goto done;
        }
        if (!all) goto done;
    }
    xknn__sym_pad(lid, ldist, (S + 1) * maxrows * k, neg);
    half = plan;
    cut = plan + P;
    xknn__sym_plan(P, rowss, half, cut, plan + 2 * P);
    rc = MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &rowtype);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&rowtype);
    if (rc != MPI_SUCCESS) {
        st = xknn__mpi_error(rank, lerr, rc, "MPI_Type_contiguous");
        *mpi_broken = 1;
        goto done;
    }
    if (nloc > 0) {
        /* own slice, dense, as the first travelling buffer: ref's rows themselves when
         * they are dense, else a packed copy */
        const int64_t ld_bytes = (ref->ld ? ref->ld : xknn_row_elems(dtype, d)) * (row_bytes / xknn_row_elems(dtype, d));
        int64_t i;
        own = (const unsigned char *)ref->data;
        if (ld_bytes != row_bytes) {
            for (i = 0; i < nloc; i++)
                memcpy(slice[0] + i * row_bytes, (const unsigned char *)ref->data + i * ld_bytes, (size_t)row_bytes);
            own = slice[0];
        }
    }

    for (s = 0; s <= S && !*mpi_broken; s++) {
        const int jown = (rank + s) % P;             /* the slice held in this step */
        const int jnext = (rank + s + 1) % P;         /* the one needed in step s + 1 */
        const unsigned char *cur = s == 0 ? own : slice[s & 1];
        unsigned char *nxt = slice[(s + 1) & 1];
        MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};

        t0 = MPI_Wtime();
        if (s < S && P > 1) {
            /* receive slice jnext from the right, send the held slice to the left: every
             * rank works with the slice it holds in every step (even P's last included) */
            if (rowss[jnext] > 0)
                rc = MPI_Irecv(nxt, (int)rowss[jnext], rowtype, right, XKNN__TAG_SLICE, ctx->comm, &req[0]);
            else
                rc = MPI_SUCCESS;
            if (rc == MPI_SUCCESS && rowss[jown] > 0)
                rc = MPI_Isend(cur, (int)rowss[jown], rowtype, left, XKNN__TAG_SLICE, ctx->comm, &req[1]);
            if (rc != MPI_SUCCESS) {
                st = xknn__mpi_error(rank, lerr, rc, "MPI_Isend/MPI_Irecv (reference slice)");
                *mpi_broken = 1;
                MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
                break;
            }
        }
        tm->broadcast += MPI_Wtime() - t0;

        /* this step's work (see the opening comment), while the slices move */
        t0 = MPI_Wtime();
        if (st == XKNN_SUCCESS) {
            const int64_t mj = rowss[jown], r0 = ref_offset, j0 = row0s[jown];
            const xknn_matrix cm = XKNN_MATRIX_TYPED(cur, mj, d, dtype);
            int64_t *const l0 = lid, *const lj = lid + s * maxrows * k;
            float *const d0 = ldist, *const dj = ldist + s * maxrows * k;
            xknn_error e;
            xknn_status ss = XKNN_SUCCESS;
            e.message[0] = '\0';
            if (s == 0) {
                /* own diagonal, less its first cut rows (own rows are read from ref: the
                 * packed copy went travelling) */
                ss = xknn__sym_call(&p, k, ref, cut[rank], nloc - cut[rank], r0, l0, d0, NULL, 0, 0, 0, NULL, NULL,
                                    &nev, &e);
            } else {
                if (s == 1 && cut[jown] > 0) {
                    /* the first cut rows of the next slice's diagonal */
                    const int64_t c = cut[jown];
                    ss = xknn__sym_call(&p, k, &cm, 0, c, j0, lj, dj, NULL, 0, 0, 0, NULL, NULL, &nev, &e);
                    if (ss == XKNN_SUCCESS)
                        ss = xknn__sym_call(&p, k, &cm, 0, c, j0, lj, dj, &cm, c, mj - c, j0, lj, dj, &nev, &e);
                }
                if (ss != XKNN_SUCCESS) {
                    /* reported below */
                } else if (s < P - s) {
                    ss = xknn__sym_call(&p, k, ref, 0, nloc, r0, l0, d0, &cm, 0, mj, j0, lj, dj, &nev, &e);
                } else if (rank < S) {
                    /* even P, last step: the first half of the own rows against slice r + P/2 */
                    ss = xknn__sym_call(&p, k, ref, 0, half[rank], r0, l0, d0, &cm, 0, mj, j0, lj, dj, &nev, &e);
                } else if (nloc > 0) { /* (ref is NULL for an empty slice: not a triangle) */
                    /* ... and the second half of slice r - P/2's rows against the own */
                    ss = xknn__sym_call(&p, k, &cm, half[jown], mj - half[jown], j0, lj, dj, ref, 0, nloc, r0, l0,
                                        d0, &nev, &e);
                }
            }
            if (ss != XKNN_SUCCESS) st = xknn__mpi_fail(lerr, ss, "rank %d: %s", rank, e.message);
        }
        tm->search += MPI_Wtime() - t0;

        t0 = MPI_Wtime();
        rc = MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
        tm->broadcast += MPI_Wtime() - t0;
        if (rc != MPI_SUCCESS) {
            st = xknn__mpi_error(rank, lerr, rc, "MPI_Waitall (reference slice)");
            *mpi_broken = 1;
        }
    }

    /* per-slice merge to the owner with the search's tree reduction, then delivery */
    for (j = 0; j < P && !*mpi_broken; j++) {
        const int64_t rows = rowss[j], m = rows * k;
        const int sj = (j - rank + P) % P; /* the step in which this rank held slice j */
        xknn__cands mine, recvb, spare;
        const xknn__cands *res = NULL;
        if (rows == 0) continue; /* the same on every rank */
        recvb.ids = cid + maxrows * k;
        recvb.dist = cdist + maxrows * k;
        spare.ids = cid + 2 * maxrows * k;
        spare.dist = cdist + 2 * maxrows * k;
        if (sj <= S) { /* this rank's lists of slice j */
            mine.ids = lid + sj * maxrows * k;
            mine.dist = ldist + sj * maxrows * k;
        } else { /* padding where this rank evaluated nothing for slice j */
            mine.ids = cid;
            mine.dist = cdist;
            xknn__sym_pad(mine.ids, mine.dist, m, neg);
        }
        t0 = MPI_Wtime();
        rc = xknn__tree_reduce(ctx, j, rows, k, neg, &mine, &recvb, &spare, NULL, &res);
        if (rc == MPI_SUCCESS && out->gather_root >= 0) {
            if (rank == j && j == out->gather_root) {
                memcpy(out->ids + row0s[j] * k, res->ids, (size_t)m * sizeof(int64_t));
                if (out->dist) memcpy(out->dist + row0s[j] * k, res->dist, (size_t)m * sizeof(float));
            } else if (rank == j) {
                rc = xknn__mpi_send_cands(ctx, res, rows, k, NULL, out->gather_root, XKNN__TAG_GATHER);
            } else if (rank == out->gather_root) {
                rc = xknn__mpi_recv_cands(ctx, &recvb, rows, k, NULL, j, XKNN__TAG_GATHER);
                if (rc == MPI_SUCCESS) {
                    memcpy(out->ids + row0s[j] * k, recvb.ids, (size_t)m * sizeof(int64_t));
                    if (out->dist) memcpy(out->dist + row0s[j] * k, recvb.dist, (size_t)m * sizeof(float));
                }
            }
        }
        tm->reduce += MPI_Wtime() - t0;
        if (rc != MPI_SUCCESS) {
            st = xknn__mpi_error(rank, lerr, rc, "MPI_Send/MPI_Recv (candidate lists)");
            *mpi_broken = 1;
            break;
        }
        if (rank == j) {
            (*owned)++;
            if (out->sink && st == XKNN_SUCCESS) {
                xknn_error e;
                xknn_status ss;
                e.status = XKNN_SUCCESS;
                e.message[0] = '\0';
                t0 = MPI_Wtime();
                ss = out->sink(out->sink_user, row0s[j], rows, k, res->ids, res->dist, &e);
                tm->write += MPI_Wtime() - t0;
                if (ss != XKNN_SUCCESS)
                    st = e.message[0] ? xknn__mpi_fail(lerr, ss, "rank %d: %s", rank, e.message)
                                      : xknn__mpi_fail(lerr, ss, "rank %d: result sink failed on rows %lld..%lld: %s",
                                                       rank, (long long)row0s[j], (long long)(row0s[j] + rows - 1),
                                                       xknn_status_string(ss));
            }
        }
        done_q += rows;
        if (out->progress) out->progress(out->progress_user, done_q, n);
    }

    if (!*mpi_broken) {
        /* balance: every rank's distance evaluations and busy (compute) seconds,
         * printed by rank 0 with verbose (gathered always: verbose need not agree) */
        double busy = tm->search;
        rc = MPI_Gather(&nev, 1, MPI_INT64_T, allev, 1, MPI_INT64_T, 0, ctx->comm);
        if (rc == MPI_SUCCESS) rc = MPI_Gather(&busy, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, 0, ctx->comm);
        if (rc == MPI_SUCCESS && rank == 0 && ctx->config.verbose) {
            fprintf(stderr, "xknn_mpi: symmetric ring: %d steps, %lld distance evaluations over %d ranks\n", S + 1,
                    (long long)xknn__sym_tri(n), P);
            for (j = 0; j < P; j++)
                fprintf(stderr, "xknn_mpi: rank %d: distance_evals=%lld busy=%.3f s\n", j, (long long)allev[j],
                        all[j]);
        }
        if (rc != MPI_SUCCESS) {
            st = xknn__mpi_error(rank, lerr, rc, "MPI_Gather (busy times)");
            *mpi_broken = 1;
        }
    }

done:
    if (rowtype != MPI_DATATYPE_NULL) MPI_Type_free(&rowtype);
    free(allev);
    free(all);
    free(plan);
    free(slice[1]);
    free(slice[0]);
    free(cdist);
    free(cid);
    free(ldist);
    free(lid);
    *evals = nev;
    return st;
}
