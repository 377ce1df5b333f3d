/* SPDX-License-Identifier: MIT */
/* tests/mpi_agree.h -- what the MPI test programs share (header only: the tap library
 * links no MPI). */
#ifndef XKNN_TESTS_MPI_AGREE_H
#define XKNN_TESTS_MPI_AGREE_H

#include <mpi.h>
#include <string.h>

#include "tap/tap.h"
#include "xknn.h"

/* One test on rank 0: every rank returned status want with one and the same message,
 * which holds key (NULL: any). Collective on MPI_COMM_WORLD. */
static void same_everywhere(xknn_status st, const xknn_error *e, xknn_status want, const char *key, const char *what)
{
    int mine = (int)st, lo = 0, hi = 0, same, rank = 0;
    char first[sizeof e->message];
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    memcpy(first, e->message, sizeof first);
    MPI_Allreduce(&mine, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Bcast(first, (int)sizeof first, MPI_CHAR, 0, MPI_COMM_WORLD);
    same = strcmp(first, e->message) == 0;
    MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0) {
        const int good = lo == hi && st == want && same && (!key || strstr(e->message, key));
        ok(good, "%s: status %s and one message on every rank", what, xknn_status_string(want));
        if (!good) diag("got %d..%d: %s", lo, hi, e->message);
    }
}

#endif
