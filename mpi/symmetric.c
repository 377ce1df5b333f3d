/*
 * mpi/symmetric.c -- the symmetric distributed self-join (the all-kNN graph).
 *
 * Rank r owns slice r. Every distance d(i, j) serves both i and j, so only the slice
 * pairs (i, j), i <= j, are computed: P(P+1)/2 tiles. The ring schedule: in step
 * s = 0 .. floor(P/2), rank r computes the pair (slice r, slice (r + s) mod P) with
 * xknn_search_pair (s = 0: its own slice against itself, diagonal). Each unordered
 * pair {a, b} is done exactly once: with (b - a) mod P = s <= floor(P/2) it is rank a's
 * step s, and with s > floor(P/2) rank b's step P - s; only for even P is
 * s = P - s = P/2 reached from both ends, so in that last step only ranks r < P/2
 * compute. Balance: for odd P every rank computes (P+1)/2 tiles; for even P ranks
 * r < P/2 compute P/2 + 1 and the others P/2 -- equal up to one, for any P (the -v
 * output prints each rank's tiles and busy time).
 *
 * Slices travel around the ring: in step s rank r holds slice (r + s) mod P, so for
 * step s + 1 it receives from rank r + 1 the slice that rank held in step s, while it
 * sends its own to rank r - 1. Both are posted (MPI_Isend/MPI_Irecv) before step s's
 * compute and completed after it, so the transfer overlaps the compute as far as the
 * MPI library progresses it (no progress thread: see xknn_mpi.h).
 *
 * A rank ends with k-best lists of its own rows (updated by every tile it computed)
 * and of the rows of the slices it visited. For each slice (in rank order), every rank
 * contributes what it has for those rows (padding if nothing) to the binomial-tree
 * reduction of the plain search (xknn__tree_reduce, whose merge orders by (distance,
 * id), padding last), rooted at the slice's owner, which then delivers its rows
 * (sink, gather) like a plain block. Results are those of the plain self-join.
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

/* Does rank r compute in step s (0 <= s <= floor(P/2))? */
static int xknn__sym_computes(int r, int s, int P)
{
    return !(P % 2 == 0 && s == P / 2 && r >= P / 2);
}

xknn_status xknn__sym_ring(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                           int64_t ref_offset, int64_t k, const int64_t *row0s, const int64_t *rowss, int64_t d,
                           xknn_dtype dtype, const xknn_mpi_output *out, xknn_mpi_timings *tm, int64_t *owned,
                           int *mpi_broken, xknn_error *lerr)
{
    const int rank = ctx->rank, P = ctx->size, S = P / 2;
    const int neg = params->metric == XKNN_METRIC_IP;
    const int64_t row_bytes = xknn_row_bytes(dtype, d), nloc = rowss[rank];
    const int left = (rank - 1 + P) % P, right = (rank + 1) % P;
    xknn_params p = *params;
    xknn_status st = XKNN_SUCCESS;
    int64_t maxrows = 0, done_q = 0, n = 0, tiles = 0;
    unsigned char *slice[2] = {NULL, NULL};
    int64_t *lid = NULL, *cid = NULL;
    float *ldist = NULL, *cdist = NULL;
    unsigned char *staging = NULL;
    double *all = NULL; /* rank 0: every rank's tiles and busy seconds */
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
    /* tree reduction: this rank's lists, received, spare (3 x maxrows x k) */
    cid = (int64_t *)malloc((size_t)(3 * maxrows * k) * sizeof(int64_t));
    cdist = (float *)malloc((size_t)(3 * maxrows * k) * sizeof(float));
    slice[0] = (unsigned char *)malloc((size_t)(maxrows * row_bytes) + 1);
    slice[1] = (unsigned char *)malloc((size_t)(maxrows * row_bytes) + 1);
    if (ctx->transfer == XKNN_MPI_TRANSFER_HOST_STAGED)
        staging = (unsigned char *)malloc((size_t)(maxrows * k) * (sizeof(int64_t) + sizeof(float)) + 1);
    if (rank == 0) all = (double *)malloc((size_t)P * 2 * sizeof(double));
    {
        /* Every rank learns whether all could allocate before anything travels; a rank
         * that could not carries the message to the caller's final agreement. */
        int have = lid && ldist && cid && cdist && slice[0] && slice[1] &&
                   (ctx->transfer != XKNN_MPI_TRANSFER_HOST_STAGED || staging) &&
                   (rank != 0 || all),
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
    rc = MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &rowtype);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&rowtype);
    if (rc != MPI_SUCCESS) {
        st = xknn__mpi_error(rank, lerr, rc, "MPI_Type_contiguous");
        *mpi_broken = 1;
        goto done;
    }
    if (nloc > 0) {
        /* own slice, dense, as the first travelling buffer */
        const int64_t ld_bytes = (ref->ld ? ref->ld : xknn_row_elems(dtype, d)) * (row_bytes / xknn_row_elems(dtype, d));
        int64_t i;
        for (i = 0; i < nloc; i++)
            memcpy(slice[0] + i * row_bytes, (const unsigned char *)ref->data + i * ld_bytes, (size_t)row_bytes);
    }

    for (s = 0; s <= S && !*mpi_broken; s++) {
        const int jown = (rank + s) % P;             /* the slice held in this step */
        const int jnext = (rank + s + 1) % P;         /* the one needed in step s + 1 */
        unsigned char *cur = slice[s & 1], *nxt = slice[(s + 1) & 1];
        MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};

        t0 = MPI_Wtime();
        if (s < S && P > 1) {
            /* receive slice jnext from the right if this rank computes with it; send the
             * held slice to the left if that rank computes with it in step s + 1 */
            if (xknn__sym_computes(rank, s + 1, P) && rowss[jnext] > 0)
                rc = MPI_Irecv(nxt, (int)rowss[jnext], rowtype, right, XKNN__TAG_SLICE, ctx->comm, &req[0]);
            else
                rc = MPI_SUCCESS;
            if (rc == MPI_SUCCESS && xknn__sym_computes(left, s + 1, P) && rowss[jown] > 0)
                rc = MPI_Isend(cur, (int)rowss[jown], rowtype, left, XKNN__TAG_SLICE, ctx->comm, &req[1]);
            if (rc != MPI_SUCCESS) {
                st = xknn__mpi_error(rank, lerr, rc, "MPI_Isend/MPI_Irecv (reference slice)");
                *mpi_broken = 1;
                MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
                break;
            }
        }
        tm->broadcast += MPI_Wtime() - t0;

        /* the tile of this step, while the slices move */
        t0 = MPI_Wtime();
        if (st == XKNN_SUCCESS && xknn__sym_computes(rank, s, P) && nloc > 0 && rowss[jown] > 0) {
            /* the own rows are read from ref (step 0's packed copy went travelling) */
            xknn_matrix b = XKNN_MATRIX_TYPED(cur, rowss[jown], d, dtype);
            xknn_error e;
            xknn_status ss;
            if (s == 0)
                ss = xknn_search_pair(&p, ref, ref_offset, NULL, 0, k, lid, ldist, NULL, NULL, &e);
            else
                ss = xknn_search_pair(&p, ref, ref_offset, &b, row0s[jown], k, lid, ldist, lid + s * maxrows * k,
                                      ldist + s * maxrows * k, &e);
            if (ss != XKNN_SUCCESS) st = xknn__mpi_fail(lerr, ss, "rank %d: %s", rank, e.message);
            tiles++;
        } else if (xknn__sym_computes(rank, s, P)) {
            tiles++; /* an empty slice: the tile is assigned, with nothing in it */
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
        mine.ids = cid;
        mine.dist = cdist;
        recvb.ids = cid + maxrows * k;
        recvb.dist = cdist + maxrows * k;
        spare.ids = cid + 2 * maxrows * k;
        spare.dist = cdist + 2 * maxrows * k;
        if (sj <= S && xknn__sym_computes(rank, sj, P) && nloc > 0) {
            memcpy(mine.ids, lid + sj * maxrows * k, (size_t)m * sizeof(int64_t));
            memcpy(mine.dist, ldist + sj * maxrows * k, (size_t)m * sizeof(float));
        } else {
            xknn__sym_pad(mine.ids, mine.dist, m, neg);
        }
        t0 = MPI_Wtime();
        rc = xknn__tree_reduce(ctx, j, rows, k, neg, &mine, &recvb, &spare, staging, &res);
        if (rc == MPI_SUCCESS && out->gather_root >= 0) {
            if (rank == j && j == out->gather_root) {
                memcpy(out->ids + row0s[j] * k, res->ids, (size_t)m * sizeof(int64_t));
                if (out->dist) memcpy(out->dist + row0s[j] * k, res->dist, (size_t)m * sizeof(float));
            } else if (rank == j) {
                rc = xknn__mpi_send_cands(ctx, res, rows, k, staging, out->gather_root, XKNN__TAG_GATHER);
            } else if (rank == out->gather_root) {
                rc = xknn__mpi_recv_cands(ctx, &recvb, rows, k, staging, j, XKNN__TAG_GATHER);
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
        /* balance: every rank's tiles and busy (compute) time, printed by rank 0 with
         * verbose (gathered always: verbose need not agree between ranks) */
        double mine[2];
        mine[0] = (double)tiles;
        mine[1] = tm->search;
        rc = MPI_Gather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, ctx->comm);
        if (rc == MPI_SUCCESS && rank == 0 && ctx->config.verbose) {
            fprintf(stderr, "xknn_mpi: symmetric ring: %d steps, %lld slice-pair tiles over %d ranks\n", S + 1,
                    (long long)P * (P + 1) / 2, P);
            for (j = 0; j < P; j++)
                fprintf(stderr, "xknn_mpi: rank %d: tiles=%.0f busy=%.3f s\n", j, all[2 * j], all[2 * j + 1]);
        }
        if (rc != MPI_SUCCESS) {
            st = xknn__mpi_error(rank, lerr, rc, "MPI_Gather (busy times)");
            *mpi_broken = 1;
        }
    }

done:
    if (rowtype != MPI_DATATYPE_NULL) MPI_Type_free(&rowtype);
    free(all);
    free(staging);
    free(slice[1]);
    free(slice[0]);
    free(cdist);
    free(cid);
    free(ldist);
    free(lid);
    return st;
}
