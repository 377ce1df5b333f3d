/* SPDX-License-Identifier: MIT */
/* mpi_sharded: a code whose data is already distributed over its ranks, and which runs
 * the distributed search on ITS OWN sub-communicator.
 *
 * MPI_COMM_WORLD is split in two groups (even and odd world ranks). Each group owns a
 * different data set, sliced unevenly over its ranks (rank r of P holds a share
 * proportional to r + 1: no rank ever sees the whole set). Each group, independently
 * and concurrently:
 *   1. creates an xknn_mpi context on its group communicator,
 *   2. searches nq queries held by its rank 0 and builds the all-kNN graph (self-join),
 *      gathering the results on its rank 0 (xknn_mpi_search_gather),
 *   3. gathers the slices on its rank 0 with its own MPI_Gatherv on the same group
 *      communicator (the library works on a duplicate, so the traffic never mixes) and
 *      checks both results against one local xknn_search, byte for byte (ids and
 *      distance bits).
 * Group rank 0 prints one line per group; the exit status is agreed over the world.
 * Run: mpirun -np 3 ./mpi_sharded   (any rank count >= 1; with one rank, one group)
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xknn.h>
#include <xknn_mpi.h>

/* Value of (row, col) of a group's data set: a hash on a grid of 1/32 steps, so there
 * are exact ties; every tenth row duplicates the row before it. */
static float value(uint32_t seed, int64_t row, int64_t col)
{
    uint64_t h;
    if (row % 10 == 9) row -= 1;
    h = (uint64_t)row * 0x9E3779B97F4A7C15u ^ (uint64_t)col * 0xC2B2AE3D27D4EB4Fu ^ (uint64_t)seed << 32;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9u;
    h ^= h >> 29;
    return (float)(h % 64) / 32.0f;
}

static void fill(float *x, uint32_t seed, int64_t row0, int64_t rows, int64_t d)
{
    int64_t i, j;
    for (i = 0; i < rows; i++)
        for (j = 0; j < d; j++) x[i * d + j] = value(seed, row0 + i, j);
}

/* Uneven slicing of n rows over P ranks: rank r owns a share proportional to r + 1. */
static void my_slice(int64_t n, int r, int P, int64_t *row0, int64_t *rows)
{
    int64_t w = (int64_t)P * (P + 1) / 2;
    int64_t a = n * ((int64_t)r * (r + 1) / 2) / w, b = n * ((int64_t)(r + 1) * (r + 2) / 2) / w;
    *row0 = a;
    *rows = b - a;
}

static int same(const int64_t *ia, const float *da, const int64_t *ib, const float *db, int64_t count)
{
    return memcmp(ia, ib, (size_t)count * sizeof *ia) == 0 && memcmp(da, db, (size_t)count * sizeof *da) == 0;
}

int main(int argc, char **argv)
{
    int wrank, wsize, color, grank, gsize, bad = 0, any_bad = 0, i;
    MPI_Comm group;
    xknn_mpi_context *ctx = NULL;
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_error err;
    xknn_status st = XKNN_SUCCESS;
    int64_t n, d, k, nq = 97, row0, rows;
    float *mine = NULL, *qry = NULL, *all = NULL, *dist = NULL, *dist_ref = NULL;
    int64_t *ids = NULL, *ids_ref = NULL;
    int *counts = NULL, *displs = NULL;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    color = wrank % 2;
    MPI_Comm_split(MPI_COMM_WORLD, color, wrank, &group);
    MPI_Comm_rank(group, &grank);
    MPI_Comm_size(group, &gsize);

    /* Each group has its own data set. */
    n = 1000 + 337 * color;
    d = 8 + 4 * color;
    k = 5 + 3 * color;
    p.backend = XKNN_BACKEND_CPU;
    my_slice(n, grank, gsize, &row0, &rows);
    mine = malloc((size_t)((rows ? rows : 1) * d) * sizeof *mine);
    if (grank == 0) {
        qry = malloc((size_t)(nq * d) * sizeof *qry);
        all = malloc((size_t)(n * d) * sizeof *all);
        ids = malloc((size_t)(n * k) * sizeof *ids);
        ids_ref = malloc((size_t)(n * k) * sizeof *ids_ref);
        dist = malloc((size_t)(n * k) * sizeof *dist);
        dist_ref = malloc((size_t)(n * k) * sizeof *dist_ref);
        counts = malloc((size_t)gsize * sizeof *counts);
        displs = malloc((size_t)gsize * sizeof *displs);
        bad = !qry || !all || !ids || !ids_ref || !dist || !dist_ref || !counts || !displs;
    }
    bad |= !mine;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    if (bad) {
        if (wrank == 0) fprintf(stderr, "mpi_sharded: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fill(mine, 1234u + (uint32_t)color, row0, rows, d);
    if (grank == 0) fill(qry, 999u + (uint32_t)color, n, nq, d); /* rows beyond n: new points */

    st = xknn_mpi_create(group, NULL, &ctx, &err);
    if (st == XKNN_SUCCESS) {
        xknn_matrix m = XKNN_MATRIX_F32(mine, rows, d), q = XKNN_MATRIX_F32(qry, nq, d);
        st = xknn_mpi_search_gather(ctx, &p, &m, row0, grank == 0 ? &q : NULL, 0, k, 0, ids, dist, &err);
    }

    /* The caller's own traffic on its group communicator: gather the slices on rank 0. */
    if (grank == 0)
        for (i = 0; i < gsize; i++) {
            int64_t r0, nr;
            my_slice(n, i, gsize, &r0, &nr);
            counts[i] = (int)(nr * d);
            displs[i] = (int)(r0 * d);
        }
    MPI_Gatherv(mine, (int)(rows * d), MPI_FLOAT, all, counts, displs, MPI_FLOAT, 0, group);

    if (st == XKNN_SUCCESS && grank == 0) {
        xknn_matrix a = XKNN_MATRIX_F32(all, n, d), q = XKNN_MATRIX_F32(qry, nq, d);
        xknn_error lerr;
        if (xknn_search(&p, &a, &q, k, ids_ref, dist_ref, &lerr) != XKNN_SUCCESS) {
            fprintf(stderr, "mpi_sharded: group %d: local xknn_search: %s\n", color, lerr.message);
            bad = 1;
        } else if (!same(ids, dist, ids_ref, dist_ref, nq * k)) {
            fprintf(stderr, "mpi_sharded: group %d: distributed search differs from xknn_search\n", color);
            bad = 1;
        }
    }
    if (st == XKNN_SUCCESS) {
        xknn_matrix m = XKNN_MATRIX_F32(mine, rows, d);
        st = xknn_mpi_search_gather(ctx, &p, &m, row0, NULL, XKNN_MPI_SELF_JOIN, k, 0, ids, dist, &err);
    }
    if (st == XKNN_SUCCESS && grank == 0) {
        xknn_matrix a = XKNN_MATRIX_F32(all, n, d);
        xknn_error lerr;
        if (xknn_search(&p, &a, NULL, k, ids_ref, dist_ref, &lerr) != XKNN_SUCCESS) {
            fprintf(stderr, "mpi_sharded: group %d: local self-join: %s\n", color, lerr.message);
            bad = 1;
        } else if (!same(ids, dist, ids_ref, dist_ref, n * k)) {
            fprintf(stderr, "mpi_sharded: group %d: distributed self-join differs from xknn_search\n", color);
            bad = 1;
        }
    }
    /* xknn_mpi statuses are agreed inside the group: every rank of it saw the same. */
    if (st != XKNN_SUCCESS) {
        if (grank == 0) fprintf(stderr, "mpi_sharded: group %d: %s\n", color, err.message);
        bad = 1;
    }
    if (grank == 0 && !bad)
        printf("group %d: %d rank%s, n=%lld d=%lld k=%lld: search of %lld queries and self-join "
               "match xknn_search on the gathered data\n",
               color, gsize, gsize == 1 ? "" : "s", (long long)n, (long long)d, (long long)k, (long long)nq);
    xknn_mpi_destroy(ctx);
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    MPI_Comm_free(&group);
    free(mine);
    free(qry);
    free(all);
    free(ids);
    free(ids_ref);
    free(dist);
    free(dist_ref);
    free(counts);
    free(displs);
    MPI_Finalize();
    return any_bad ? 1 : 0;
}
