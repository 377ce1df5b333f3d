/* SPDX-License-Identifier: MIT */
/* mpi_consumer: the distributed search through the installed xknn_mpi. Each rank holds
 * one slice of 12 points on a line (x = 0..11); rank 0 asks for the 3 nearest
 * neighbours of x = 4.4 and gathers them. Exit 0 on every rank when rank 0 got ids
 * 4 5 3 and distance 0.4^2, whatever the number of ranks. */
#include <mpi.h>
#include <stdio.h>

#include <xknn_mpi.h>

int main(int argc, char **argv)
{
    float pts[12], qry[1] = {4.4f}, dist[3] = {0};
    int64_t ids[3] = {-1, -1, -1}, row0, rows, i;
    int rank = 0, bad = 0, any_bad = 1;
    xknn_mpi_context *ctx = NULL;
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_error err;
    xknn_status st;

    MPI_Init(&argc, &argv);
    st = xknn_mpi_create(MPI_COMM_WORLD, NULL, &ctx, &err);
    if (st == XKNN_SUCCESS) {
        xknn_matrix mine, q = XKNN_MATRIX_F32(qry, 1, 1);
        rank = xknn_mpi_rank(ctx);
        xknn_mpi_slice(12, rank, xknn_mpi_size(ctx), &row0, &rows);
        for (i = 0; i < rows; i++) pts[i] = (float)(row0 + i);
        mine = (xknn_matrix)XKNN_MATRIX_F32(pts, rows, 1);
        p.backend = XKNN_BACKEND_CPU;
        st = xknn_mpi_search_gather(ctx, &p, &mine, row0, rank == 0 ? &q : NULL, 0, 3, 0, ids, dist, &err);
    }
    if (st != XKNN_SUCCESS) {
        if (rank == 0) fprintf(stderr, "mpi_consumer: %s\n", err.message);
        bad = 1;
    } else if (rank == 0) {
        printf("mpi_consumer: %d ranks: ids %lld %lld %lld\n", xknn_mpi_size(ctx), (long long)ids[0],
               (long long)ids[1], (long long)ids[2]);
        bad = !(ids[0] == 4 && ids[1] == 5 && ids[2] == 3 && dist[0] == (4.4f - 4.0f) * (4.4f - 4.0f));
    }
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    xknn_mpi_destroy(ctx);
    MPI_Finalize();
    return any_bad;
}
