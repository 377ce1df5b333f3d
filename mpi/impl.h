/* SPDX-License-Identifier: MIT */
/*
 * mpi/impl.h -- private pieces of the distributed layer shared by its .c files.
 * Not installed, not part of the API.
 */
#ifndef XKNN_MPI_IMPL_H
#define XKNN_MPI_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "xknn_mpi.h"
#include "xknn/impl/backend.h" /* xknn__lists_pad */

struct xknn_mpi_context {
    MPI_Comm comm;              /* the library's duplicate, MPI_ERRORS_RETURN        */
    int rank, size;             /* in comm                                            */
    int local_rank, local_size; /* within the node (MPI_COMM_TYPE_SHARED)             */
    int device;                 /* -1: none                                           */
    int cuda_aware_mpi;         /* MPIX_Query_cuda_support() at creation              */
    xknn_mpi_config config;
    xknn_mpi_transfer transfer; /* effective mode: HOST_STAGED or CUDA_AWARE          */
    pthread_t later;            /* xknn__mpi_later's thread, while later_live         */
    int later_live;
};

/* Runs run(arg) in a thread of its own, off the caller's path: the release of a call's
 * large buffers (freeing gigabytes of touched pages is a long wait)
 * after its results are delivered. One at a time a context: the one before is joined
 * first. Where no thread can be made, runs it here. xknn__mpi_later_wait joins it; every
 * call of the layer and xknn_mpi_destroy do so first, so a call finds the memory of
 * the one before released. */
void xknn__mpi_later(xknn_mpi_context *ctx, void (*run)(void *), void *arg);
void xknn__mpi_later_wait(xknn_mpi_context *ctx);

/* Message tags on the private communicator. */
enum {
    XKNN__TAG_REDUCE = 0x6b01,
    XKNN__TAG_GATHER = 0x6b02,
    XKNN__TAG_SLICE = 0x6b03,
    XKNN__TAG_LIST_IDS = 0x6b04, /* the symmetric ring's lists on their way to the owner */
    XKNN__TAG_LIST_DIST = 0x6b05
};

/* Fills *err (may be NULL) printf-style; returns status: the library's xknn__fail
 * (xknn/impl/backend.h) under the layer's name. */
#define xknn__mpi_fail xknn__fail

/* Maps a failed MPI return code to XKNN_ERROR_MPI with MPI_Error_string's text. */
xknn_status xknn__mpi_error(int rank, xknn_error *err, int rc, const char *what);

/* The check after an MPI call: 0 when rc is MPI_SUCCESS; else 1, with *st and err the
 * failure of `what` on rank (xknn__mpi_error) and *broken (when given) set: no more
 * communication. For `if (xknn__mpi_check(...)) return -1;`. */
static inline int xknn__mpi_check(int rc, int rank, xknn_status *st, xknn_error *err, int *broken, const char *what)
{
    if (rc == MPI_SUCCESS) return 0;
    *st = xknn__mpi_error(rank, err, rc, what);
    if (broken) *broken = 1;
    return 1;
}

/* The one place where the transfer mode is decided (see xknn_mpi.h, TRANSFER MODES).
 * candidates_on_device: 1 once a backend hands back device candidate buffers.
 * Returns XKNN_MPI_TRANSFER_COUNT (and a message) when the request cannot be honoured. */
xknn_mpi_transfer xknn__mpi_pick_transfer(xknn_mpi_transfer requested, int candidates_on_device,
                                          int cuda_aware_mpi, xknn_error *err);

/* A candidate list set: rows x k ids and distances, host memory, ld = k. */
typedef struct xknn__cands {
    int64_t *ids;
    float *dist;
} xknn__cands;

/* Point-to-point moves of rows x k candidates in the context's transfer mode.
 * staging: rows x k x 12 bytes (HOST_STAGED only), or NULL for lists that are host
 * memory: then ids and distances go as two messages from the arrays themselves.
 * Not collective. */
int xknn__mpi_send_cands(const xknn_mpi_context *ctx, const xknn__cands *c, int64_t rows, int64_t k,
                         unsigned char *staging, int dst, int tag);
int xknn__mpi_recv_cands(const xknn_mpi_context *ctx, xknn__cands *c, int64_t rows, int64_t k,
                         unsigned char *staging, int src, int tag);

/* Merges two sorted candidate lists per row into out (k per row): order (distance,
 * id), by (-distance, id) when neg (metric ip), padding (id < 0) last. Not collective. */
void xknn__merge_rows(const xknn__cands *a, const xknn__cands *b, xknn__cands *out, int64_t rows, int64_t k,
                      int neg);

/* Binomial-tree reduction of rows x k candidate lists to `owner`. On entry *cur holds
 * this rank's sorted lists; recv and spare are scratch of the same size. On the owner,
 * *result points to the merged lists (one of cur/spare); elsewhere NULL. neg: as in
 * xknn__merge_rows.
 * Returns an MPI return code. Collective over the context (every rank calls it). */
int xknn__tree_reduce(const xknn_mpi_context *ctx, int owner, int64_t rows, int64_t k, int neg, xknn__cands *cur,
                      xknn__cands *recv, xknn__cands *spare, unsigned char *staging, const xknn__cands **result);

/* What the symmetric self-join (mpi/symmetric.c) is asked, agreed on every rank. */
typedef struct xknn__sym_job {
    const xknn_params *params;    /* ref_id_offset and device set for this rank        */
    const xknn_matrix *ref;       /* own slice; NULL when it is empty                  */
    int64_t ref_offset, k, d;
    xknn_dtype dtype;
    const int64_t *row0s, *rowss; /* every rank's slice: the agreed table              */
    const xknn_mpi_output *out;
} xknn__sym_job;

/* What it reports beside its status. */
typedef struct xknn__sym_tally {
    int64_t owned;  /* deliveries this rank made (added to)                            */
    int64_t evals;  /* this rank's distance evaluations                                */
    int mpi_broken; /* an MPI call failed                                              */
} xknn__sym_tally;

/* The symmetric self-join: a ring of slice pairs i <= j, every rank doing the same
 * number of distance evaluations up to one row, each step's lists of the held slice
 * merged on its owner during the next step, delivery as a block per slice. Called by
 * every rank after the arguments were agreed; returns this rank's status (the caller
 * agrees on it); its seconds are added to tm. Collective. */
xknn_status xknn__sym_ring(xknn_mpi_context *ctx, const xknn__sym_job *job, xknn_mpi_timings *tm,
                           xknn__sym_tally *tally, xknn_error *lerr);

/* A rank's reference slice resident on its GPU for a whole search (mpi/resident.c). */
typedef struct xknn__resident xknn__resident;

/* Uploads the slice and sizes a workspace for blocks of up to qb queries and k results.
 * NULL (with the reason in why) when the device path does not apply or does not fit:
 * the caller then searches each block with xknn_search on host arrays. Not collective. */
xknn__resident *xknn__resident_open(const xknn_params *params, int device, const xknn_matrix *ref, int64_t qb,
                                    int64_t k, char *why, size_t why_size);
/* Starts the search of one block of host queries (rows x d, q reusable on return)
 * against the resident slice on the GPU and returns; _finish waits for it (poll, if not
 * NULL, called repeatedly with poll_arg meanwhile) and writes its lists (rows x k, global
 * ids) into host memory. One block in flight at a time. Not collective. */
xknn_status xknn__resident_start(xknn__resident *r, const xknn_params *params, const float *q, int64_t rows,
                                 xknn_error *err);
xknn_status xknn__resident_finish(xknn__resident *r, int64_t *ids, float *dist, void (*poll)(void *), void *poll_arg,
                                  xknn_error *err);
void xknn__resident_close(xknn__resident *r);
/* What an index keeps of its slice between searches (mpi/index.c). */
typedef struct xknn__slice_state {
    xknn__resident *resident; /* the slice on the rank's GPU, or NULL (host searches)    */
    int checked;              /* its values passed xknn_check_input when they came       */
} xknn__slice_state;

/* xknn_mpi_search on a slice an index holds. Collective. */
xknn_status xknn__search_held(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                              int64_t ref_offset, const xknn__slice_state *held, const xknn_matrix *query,
                              int query_root, int64_t k, const xknn_mpi_output *out, xknn_mpi_stats *stats,
                              xknn_error *err);

/* Buffers for blocks of up to qb queries and k results (grown when needed; the slice
 * stays). 0 on success, else -1 with the reason. Not collective. */
int xknn__resident_reserve(xknn__resident *r, const xknn_params *params, int64_t qb, int64_t k, char *why,
                           size_t why_size);
/* Replaces rows [row0, row0 + rows->rows) of the resident slice (float32 rows, host or
 * device memory). Synchronous. Not collective. */
xknn_status xknn__resident_update(xknn__resident *r, int64_t row0, const xknn_matrix *rows, xknn_error *err);
/* The resident rows' device memory (dense). */
const void *xknn__resident_rows(const xknn__resident *r);

/* Caller matrices in device memory (mpi/resident.c). _on_device: 1 where m's rows lie
 * in a GPU's memory; asked only where the rank has a device and params' backend is not
 * cpu (elsewhere 0: the question would start a CUDA context). The others take dev, m's
 * answer. _rows_copy: m's rows into dense host memory dst (host-to-host on the budget's
 * threads). _to_host: a dense host copy of m in *buf (malloc'ed; the caller frees it),
 * described by *out; what names it in an out-of-memory message. _check:
 * xknn_check_input's verdict and message on m wherever it lies, rows named from row0:
 * device f32 rows are scanned for NaN/Inf on the device and the first offending row (or
 * row 0, for the metric's own checks) is checked on the host; other device rows on a
 * host copy. Not collective. */
int xknn__on_device(const xknn_mpi_context *ctx, const xknn_params *p, const xknn_matrix *m);
xknn_status xknn__rows_copy(void *dst, const xknn_matrix *m, int dev, xknn_error *err);
xknn_status xknn__rows_to_host(int rank, const char *what, const xknn_matrix *m, int dev, unsigned char **buf,
                               xknn_matrix *out, xknn_error *err);
xknn_status xknn__rows_check(int rank, const xknn_params *p, const char *what, const xknn_matrix *m, int dev,
                             int64_t row0, xknn_error *err);

#endif /* XKNN_MPI_IMPL_H */
