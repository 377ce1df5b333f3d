/* SPDX-License-Identifier: MIT */
/*
 * tools/progress.h -- knn_mpi's progress lines on rank 0's stderr.
 *
 * Guarantees: while running, a line at least every KNN_PROGRESS_PERIOD seconds (a thread
 * wakes that often and prints the latest counters, so a block that takes longer still
 * shows the time going by), whether or not stderr is a terminal: on a terminal one line
 * rewritten in place ('\r'), elsewhere full lines. The thread makes no MPI call; stop
 * joins it (call it before MPI_Finalize). Counters are updated from the search's
 * progress callback (any thread) under a mutex.
 */
#ifndef XKNN_TOOLS_PROGRESS_H
#define XKNN_TOOLS_PROGRESS_H

#include <pthread.h>
#include <stdint.h>

#define KNN_PROGRESS_PERIOD 2.0

typedef struct knn_progress {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running, stop, tty;
    const char *unit;   /* "queries" or "rows" (self-join)     */
    int64_t done, total;
    double t_start, last_print;
} knn_progress;

/* Not collective (rank 0 only). Starts the thread; 0 on success, else -1 (no lines). */
int knn_progress_start(knn_progress *p, int64_t total, const char *unit, int tty);

/* The search's progress callback (xknn_mpi_progress_fn): records done of total. */
void knn_progress_update(void *user, int64_t done, int64_t total);

/* Stops and joins the thread; on a terminal clears the line. A no-op when not started. */
void knn_progress_stop(knn_progress *p);

#endif
