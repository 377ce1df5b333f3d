/* SPDX-License-Identifier: MIT */
/*
 * mpi/tree_reduce.c -- moving candidate lists between ranks (both transfer modes), the
 * pairwise merge, and the binomial-tree reduction to a block's owner.
 */
#include <math.h>
#include <string.h>

#include "impl.h"

/* MPI counts are int: move large buffers in chunks of at most 1 GiB. Both sides
 * compute the same sizes, so the chunking matches. */
#define XKNN__CHUNK ((int64_t)1 << 30)

static int xknn__send_bytes(MPI_Comm comm, const void *buf, int64_t bytes, int dst, int tag)
{
    const unsigned char *p = (const unsigned char *)buf;
    int rc = MPI_SUCCESS;
    do {
        int64_t c = bytes < XKNN__CHUNK ? bytes : XKNN__CHUNK;
        rc = MPI_Send((void *)p, (int)c, MPI_BYTE, dst, tag, comm);
        p += c;
        bytes -= c;
    } while (rc == MPI_SUCCESS && bytes > 0);
    return rc;
}

static int xknn__recv_bytes(MPI_Comm comm, void *buf, int64_t bytes, int src, int tag)
{
    unsigned char *p = (unsigned char *)buf;
    int rc = MPI_SUCCESS;
    do {
        int64_t c = bytes < XKNN__CHUNK ? bytes : XKNN__CHUNK;
        rc = MPI_Recv(p, (int)c, MPI_BYTE, src, tag, comm, MPI_STATUS_IGNORE);
        p += c;
        bytes -= c;
    } while (rc == MPI_SUCCESS && bytes > 0);
    return rc;
}

int xknn__mpi_send_cands(const xknn_mpi_context *ctx, const xknn__cands *c, int64_t rows, int64_t k,
                         unsigned char *staging, int dst, int tag)
{
    const int64_t m = rows * k;
    int rc;
    if (ctx->transfer == XKNN_MPI_TRANSFER_HOST_STAGED && staging) {
        /* Staged: one message through the staging buffer (pinned host memory once the
         * candidates live on a device; then this memcpy becomes the device->host copy). */
        memcpy(staging, c->ids, (size_t)m * sizeof(int64_t));
        memcpy(staging + m * (int64_t)sizeof(int64_t), c->dist, (size_t)m * sizeof(float));
        return xknn__send_bytes(ctx->comm, staging, m * (int64_t)(sizeof(int64_t) + sizeof(float)), dst, tag);
    }
    /* Direct (cuda-aware, or host lists without staging): the arrays themselves. */
    rc = xknn__send_bytes(ctx->comm, c->ids, m * (int64_t)sizeof(int64_t), dst, tag);
    if (rc == MPI_SUCCESS) rc = xknn__send_bytes(ctx->comm, c->dist, m * (int64_t)sizeof(float), dst, tag);
    return rc;
}

int xknn__mpi_recv_cands(const xknn_mpi_context *ctx, xknn__cands *c, int64_t rows, int64_t k,
                         unsigned char *staging, int src, int tag)
{
    const int64_t m = rows * k;
    int rc;
    if (ctx->transfer == XKNN_MPI_TRANSFER_HOST_STAGED && staging) {
        rc = xknn__recv_bytes(ctx->comm, staging, m * (int64_t)(sizeof(int64_t) + sizeof(float)), src, tag);
        if (rc == MPI_SUCCESS) {
            memcpy(c->ids, staging, (size_t)m * sizeof(int64_t));
            memcpy(c->dist, staging + m * (int64_t)sizeof(int64_t), (size_t)m * sizeof(float));
        }
        return rc;
    }
    rc = xknn__recv_bytes(ctx->comm, c->ids, m * (int64_t)sizeof(int64_t), src, tag);
    if (rc == MPI_SUCCESS) rc = xknn__recv_bytes(ctx->comm, c->dist, m * (int64_t)sizeof(float), src, tag);
    return rc;
}

/* (da, ia) before (db, ib)? Padding entries (id < 0) come after every real entry, even
 * one whose distance overflowed to +inf; ties in distance go to the smaller id. The
 * callers pass order keys: the distance, or its negation for ip (exact). */
static int xknn__before(float da, int64_t ia, float db, int64_t ib)
{
    if (ib < 0) return ia >= 0;
    if (ia < 0) return 0;
    return da < db || (da == db && ia < ib);
}

void xknn__merge_rows(const xknn__cands *a, const xknn__cands *b, xknn__cands *out, int64_t rows, int64_t k,
                      int neg)
{
    const float sg = neg ? -1.0f : 1.0f;
    int64_t r;
    for (r = 0; r < rows; r++) {
        const int64_t *ia = a->ids + r * k, *ib = b->ids + r * k;
        const float *da = a->dist + r * k, *db = b->dist + r * k;
        int64_t *io = out->ids + r * k;
        float *dout = out->dist + r * k;
        int64_t i = 0, j = 0, o;
        for (o = 0; o < k; o++) {
            /* i + j == o < k, so neither index can run past its list. */
            if (xknn__before(sg * db[j], ib[j], sg * da[i], ia[i])) {
                io[o] = ib[j];
                dout[o] = db[j];
                j++;
            } else {
                io[o] = ia[i];
                dout[o] = da[i];
                i++;
            }
        }
    }
}

int xknn__tree_reduce(const xknn_mpi_context *ctx, int owner, int64_t rows, int64_t k, int neg, xknn__cands *cur,
                      xknn__cands *recv, xknn__cands *spare, unsigned char *staging, const xknn__cands **result)
{
    const int P = ctx->size;
    const int vr = (ctx->rank - owner + P) % P; /* rank relative to the owner */
    xknn__cands a = *cur, s = *spare, t;
    int mask, rc;

    *result = NULL;
    /* Binomial tree: at step `mask`, ranks with that bit set send their merged subtree
     * to vr - mask and are done; the others receive from vr + mask when it exists.
     * Merging is associative on (distance, id) with padding last, so the owner ends
     * with the exact top k whatever the tree's shape. */
    for (mask = 1; mask < P; mask <<= 1) {
        if (vr & mask) {
            int dst = (vr - mask + owner) % P;
            return xknn__mpi_send_cands(ctx, &a, rows, k, staging, dst, XKNN__TAG_REDUCE);
        }
        if (vr + mask < P) {
            int src = (vr + mask + owner) % P;
            rc = xknn__mpi_recv_cands(ctx, recv, rows, k, staging, src, XKNN__TAG_REDUCE);
            if (rc != MPI_SUCCESS) return rc;
            xknn__merge_rows(&a, recv, &s, rows, k, neg);
            t = a;
            a = s;
            s = t;
        }
    }
    /* Only vr == 0 (the owner) gets here. Report which buffer holds the result. */
    *cur = a;
    *spare = s;
    *result = cur;
    return MPI_SUCCESS;
}
