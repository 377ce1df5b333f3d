/* SPDX-License-Identifier: MIT */
/*
 * knn_predict -- the classification / regression part of the knn_mpi command
 * (--labels, --targets, --query-labels, --vote, --predict). Private to the command.
 *
 * Flow (every function but knn_predict_rows is collective over the command's ranks):
 *   knn_predict_open     every rank reads the reference labels (or targets) and the
 *                        query labels and checks their lengths.
 *   knn_predict_rows     in the search's sink, on the owner rank of a query block: the
 *                        vote of each row (include/xknn/learn.h), kept on that rank.
 *   knn_predict_finish   accuracy (and confusion matrix) summed over ranks; each rank
 *                        writes its rows at their offsets into the run's --predict
 *                        output (tools/outputs.h: for .txt the offsets come from every
 *                        line's length, summed over ranks); bytes holds its size.
 *   knn_predict_free     frees.
 * The prediction file is byte-identical for any number of ranks.
 */
#ifndef XKNN_MPI_KNN_PREDICT_H
#define XKNN_MPI_KNN_PREDICT_H

#include <stdint.h>
#include <stdio.h>

#include "xknn.h"
#include "xknn/learn.h"

#include "outputs.h"

#ifdef XKNN_HAVE_MPI
#include <mpi.h>

#include "xknn_mpi.h"
#endif

typedef struct knn_predict {
    /* options (from the command line; all NULL: nothing to do) */
    const char *labels_path, *targets_path, *qlabels_path, *out_path;
    xknn_vote vote;
    int verbose;
    /* the run */
    int rank, size;
#ifdef XKNN_HAVE_MPI
    MPI_Comm comm;
    xknn_mpi_context *ctx;
#endif
    knn_outs *outs;            /* the run's outputs; slot: --predict's        */
    int slot;
    int64_t bytes;             /* size of the --predict file (after finish)   */
    xknn_metric metric;
    int64_t n, nq;
    int32_t *labels, *qlabels; /* n, nq                                     */
    float *targets;            /* n                                         */
    uint32_t *pred;            /* nq: int32 label or float bits, owned rows */
    unsigned char *owned;      /* nq: 1 where this rank computed the row    */
    int npy;                   /* 1: .npy output, 0: text                   */
    int64_t correct;           /* summed over ranks after finish            */
    double accuracy;
    int32_t *classes;          /* confusion (rank 0, -v)                    */
    int64_t nclasses, *confusion;
} knn_predict;

/* Zeroes the state (before the options are filled in). */
void knn_predict_init(knn_predict *p);
/* 1 when any learning option was given. */
int knn_predict_active(const knn_predict *p);
/* Checks option combinations (not collective, same verdict on every rank): 0 or a
 * message in msg. */
int knn_predict_check_options(const knn_predict *p, char *msg, size_t msz);

#ifdef XKNN_HAVE_MPI
xknn_status knn_predict_open(knn_predict *p, MPI_Comm comm, xknn_mpi_context *ctx, int64_t n, int64_t nq,
                             xknn_metric metric, xknn_error *err);
#else
xknn_status knn_predict_open(knn_predict *p, int64_t n, int64_t nq, xknn_metric metric, xknn_error *err);
#endif
xknn_status knn_predict_rows(knn_predict *p, int64_t q0, int64_t rows, int64_t k, const int64_t *ids,
                             const float *dist, xknn_error *err);
xknn_status knn_predict_finish(knn_predict *p, xknn_error *err);
/* Rank 0: the confusion matrix (after finish, with verbose and query labels). */
void knn_predict_print_confusion(const knn_predict *p, FILE *f);
void knn_predict_free(knn_predict *p);

#endif
