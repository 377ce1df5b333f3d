/* SPDX-License-Identifier: MIT */
/*
 * tools/outputs.h -- the one writer of every output of every command (knn_mpi's result,
 * predictions and JSON; knn_prune's three files; knn_softknn's weights).
 *
 * Guarantees:
 *  - No output touches an input or another output: knn_outs_collision compares them as
 *    files (device and inode where the file exists, the resolved path otherwise), so
 *    "./a/../x", symlinks and hard links are caught before any work.
 *  - All or nothing: each output is written to a temporary beside it,
 *    ".NAME.xknn-tmp.PID.XXXXXX" (NAME cut to its first 64 bytes, PID rank 0's), and the
 *    temporaries are renamed into place only once every output of the run is complete on
 *    every rank. A failure anywhere, or SIGINT / SIGTERM, removes every temporary and
 *    leaves files already at the output names untouched (a signal exits 128 + signal).
 *  - Every rank writes its own bytes with pwrite() at their offsets into the one shared
 *    temporary: no MPI-IO component sees the path, so any length the system accepts
 *    works, and every failure carries the system's errno (full disk, quota, file size
 *    limit and descriptor exhaustion are resource errors: exit status 3).
 * Under MPI (XKNN_HAVE_MPI) open and commit are collective over the command's context;
 * without it the same calls run as one process.
 */
#ifndef XKNN_TOOLS_OUTPUTS_H
#define XKNN_TOOLS_OUTPUTS_H

#include <stdint.h>

#include "xknn.h"
#ifdef XKNN_HAVE_MPI
#include <mpi.h>

#include "xknn_mpi.h"
#endif

#define KNN_OUTS_MAX 4

typedef struct knn_out_file {
    const char *option; /* the option that names it ("-o", "--json"): messages        */
    const char *path;   /* destination (the caller's string)                          */
    char *tmp;          /* temporary beside it, known to every rank after open        */
    int fd;             /* this rank's descriptor, -1 when closed                     */
    int rank0_only;     /* only rank 0 writes it (no other rank opens it)             */
} knn_out_file;

typedef struct knn_outs {
    knn_out_file f[KNN_OUTS_MAX];
    int n;
    int rank, size;
    int created;  /* rank 0: the temporaries exist                                   */
    int no_space; /* a write or open failed for want of space or descriptors: exit 3 */
#ifdef XKNN_HAVE_MPI
    xknn_mpi_context *ctx; /* NULL: one process */
    MPI_Comm comm;
#endif
} knn_outs;

/* One process (rank 0 of 1). */
void knn_outs_init(knn_outs *o);
#ifdef XKNN_HAVE_MPI
/* From here on open and commit are collective over ctx, whose communicator is comm. */
void knn_outs_attach(knn_outs *o, xknn_mpi_context *ctx, MPI_Comm comm);
#endif

/* Adds an output named by option; rank0_only: only rank 0 writes it. Returns its slot. */
int knn_outs_add(knn_outs *o, const char *option, const char *path, int rank0_only);

/* Not collective. 0 when no output is an input or another output; else 1 with msg
 * "OPT1 FILE1 and OPT2 FILE2 are the same file". Inputs are (option, path) pairs; a NULL
 * path is skipped. */
int knn_outs_collision(const knn_outs *o, const char *const *in_opt, const char *const *in_path, int nin, char *msg,
                       size_t msz);

/* Collective. Rank 0 creates every temporary (refusing an existing destination that is
 * not a regular file); every rank opens those it writes. */
xknn_status knn_outs_open(knn_outs *o, xknn_error *err);

/* Not collective. Writes len bytes at off of output slot i; what names the bytes in a
 * message ("rows 0..99"). */
xknn_status knn_outs_write(knn_outs *o, int i, int64_t off, const void *buf, int64_t len, const char *what,
                           xknn_error *err);

/* Collective. st is this rank's status so far; when it is success everywhere every rank
 * syncs and closes its files, rank 0 checks each temporary holds size[i] bytes (-1: any)
 * and renames them all. Returns the agreed status; on failure every temporary is gone. */
xknn_status knn_outs_commit(knn_outs *o, xknn_status st, const int64_t *size, xknn_error *err);

/* Not collective. Closes this rank's files; rank 0 removes the temporaries left. */
void knn_outs_discard(knn_outs *o);

/* SIGINT and SIGTERM remove the registered temporaries, then exit 128 + signal. */
void knn_outs_catch_signals(void);

/* errno values that mean "no room": a full disk, a quota, a file size limit, no
 * descriptor left. */
int knn_outs_is_resource_errno(int e);

#endif
