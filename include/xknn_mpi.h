/* SPDX-License-Identifier: MIT */
/*
 * xknn_mpi.h -- distributed exact k-nearest-neighbour search over MPI, C99 public API.
 *
 * WHAT IT DOES
 *   Every rank holds a slice of the reference set (host or device memory, any size, empty
 *   allowed); the queries live on one root rank, or are the references themselves
 *   (self-join: the all-kNN graph). Queries are broadcast in blocks (non-blocking, the
 *   next block in flight while the current one is searched); each rank searches its
 *   slice with xknn_search() and global ids; a binomial-tree reduction merges the sorted
 *   candidate lists to the block's owner rank (block b is owned by rank b mod P, so no
 *   root is a bottleneck). Results are identical -- ids and distance bits -- to one
 *   xknn_search() over the whole reference set, for every rank count and slicing.
 *
 * WHAT IT DOES NOT DO
 *   - No file I/O: read your slice yourself (xknn/io.h, xknn_mpi_slice()); the
 *     knn_mpi command shows how, writing results with MPI-IO from a sink callback.
 *   - No result storage beyond one block: results go to a caller's sink callback on the
 *     owner rank, block by block; memory per rank is O(query_block * (k + d)) unless
 *     you ask for a gather of everything on one rank.
 *   - Results and the candidate lists that travel between ranks are host memory (see
 *     TRANSFER MODES). Slices, update rows and queries may be device memory on a rank
 *     with a GPU and a backend other than cpu (the index below keeps a device slice on
 *     the GPU; other calls bring device rows to host memory where they read them).
 *     Device memory must hold its values when a call starts: the caller has waited for
 *     the work that writes it (the calls wait on no stream of the caller's).
 *   - No global state; no MPI type but MPI_Comm in this header.
 *   - No progress thread: the next block's MPI_Ibcast overlaps the current search only
 *     as far as the MPI library moves it without being called (small blocks go
 *     eagerly; Open MPI without a progress thread moves large ones inside MPI calls).
 *
 * EXAMPLE
 *
 *     xknn_mpi_context *ctx;
 *     xknn_mpi_config cfg = XKNN_MPI_CONFIG_INIT;
 *     xknn_error err;
 *     int64_t row0, rows;
 *     xknn_mpi_create(MPI_COMM_WORLD, &cfg, &ctx, &err);     // collective
 *     int rank = xknn_mpi_rank(ctx);
 *     xknn_mpi_slice(n, rank, xknn_mpi_size(ctx), &row0, &rows);
 *     xknn_matrix mine = XKNN_MATRIX_F32(my_rows, rows, d);   // rows [row0, row0+rows)
 *     xknn_matrix q = XKNN_MATRIX_F32(queries, nq, d);         // meaningful on rank 0
 *     // ids, dist: nq x k arrays on rank 0 (NULL elsewhere)
 *     xknn_params p = XKNN_PARAMS_INIT;
 *     if (xknn_mpi_search_gather(ctx, &p, &mine, row0, rank == 0 ? &q : NULL, 0, k,
 *                                0, ids, dist, &err) != XKNN_SUCCESS)
 *         if (rank == 0) fprintf(stderr, "%s\n", err.message); // same on every rank
 *     xknn_mpi_destroy(ctx);                                    // collective
 *
 * ERRORS
 *   Every collective function agrees on its outcome before returning: all ranks return
 *   the same status and the same message (that of the lowest failing rank, prefixed
 *   "rank R: " when the failure was local to R). One bad slice or one failing sink
 *   never leaves another rank waiting. Only a failing MPI library can break this.
 *   MPI errors on the library's communicator are returned (MPI_ERRORS_RETURN) and
 *   reported as XKNN_ERROR_MPI with MPI_Error_string's text.
 *
 * TRANSFER MODES
 *   xknn_mpi_config.transfer selects how candidate lists move between ranks:
 *   HOST_STAGED packs ids and distances into one staging buffer per message (the path
 *   that will stage device candidates through pinned host memory); CUDA_AWARE hands the
 *   candidate arrays to MPI directly (the path that will pass device pointers to a
 *   CUDA-aware MPI). AUTO picks CUDA_AWARE only when the candidates live on a device
 *   and MPIX_Query_cuda_support() says yes; today candidates are always host memory, so
 *   AUTO means HOST_STAGED, and CUDA_AWARE, when asked for, moves host memory directly
 *   (valid with any MPI). Both paths give identical results and both are tested. The
 *   choice is made in one place (mpi/comm.c, xknn__mpi_pick_transfer).
 *
 * THREADS
 *   Call the functions of one context from one thread per rank. MPI must be
 *   initialised (MPI_THREAD_SINGLE is enough) and not yet finalised. With
 *   MPI_THREAD_FUNNELED or more, called from the main thread, the symmetric self-join
 *   computes in a worker thread of its own (which makes no MPI call) while the calling
 *   thread moves slices and lists: initialise with MPI_Init_thread(MPI_THREAD_FUNNELED)
 *   for the overlap.
 */
#ifndef XKNN_MPI_H
#define XKNN_MPI_H

#include <mpi.h>
#include <stdint.h>

#include "xknn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How candidate lists travel between ranks (see TRANSFER MODES above). */
typedef enum xknn_mpi_transfer {
    XKNN_MPI_TRANSFER_AUTO = 0,    /* CUDA_AWARE when useful and supported, else HOST_STAGED */
    XKNN_MPI_TRANSFER_HOST_STAGED, /* copy through a host staging buffer, one message  */
    XKNN_MPI_TRANSFER_CUDA_AWARE,  /* buffers handed to MPI as they are                */
    XKNN_MPI_TRANSFER_COUNT
} xknn_mpi_transfer;

/* Context configuration. Zero means default, except device (-1 in the INIT macro). */
typedef struct xknn_mpi_config {
    int device;                 /* CUDA device of this rank; -1: local rank mod device
                                   count (local rank from MPI_COMM_TYPE_SHARED)        */
    xknn_mpi_transfer transfer; /* XKNN_MPI_TRANSFER_AUTO                               */
    int64_t query_block;        /* queries per broadcast block; 0: automatic. Must be
                                   the same on every rank.                              */
    int verbose;                /* 1: rank 0 prints the plan of each search on stderr   */
} xknn_mpi_config;

#define XKNN_MPI_CONFIG_INIT { -1, XKNN_MPI_TRANSFER_AUTO, 0, 0 }

/* Opaque: a duplicate of the user's communicator and what was learnt about this rank. */
typedef struct xknn_mpi_context xknn_mpi_context;

/* query_root value selecting the self-join in xknn_mpi_search_gather(). */
#define XKNN_MPI_SELF_JOIN (-1)
/* gather_root value: no gather. */
#define XKNN_MPI_NO_GATHER (-1)

/*
 * Result sink: called on the owner rank of each finished block, and only there, in
 * increasing q0 order (in any order where the output sets any_order). ids/dist are rows
 * x k, host memory, ld = k, rows q0..q0+rows-1 of the query set (global query
 * numbering; in a self-join also the global reference ids of those rows); valid only
 * during the call. Return XKNN_SUCCESS, or a status and a message in *err
 * (pre-cleared): the search then stops on every rank after at most one more block and
 * returns that status everywhere. Not collective: do not call collective MPI operations
 * from a sink (independent MPI-IO such as MPI_File_write_at is fine).
 */
typedef xknn_status (*xknn_mpi_sink_fn)(void *user, int64_t q0, int64_t rows, int64_t k, const int64_t *ids,
                                        const float *dist, xknn_error *err);

/* Progress: called on every rank after each block with the number of queries finished
 * so far and the total. Not collective. */
typedef void (*xknn_mpi_progress_fn)(void *user, int64_t queries_done, int64_t nq);

/* Where results go. Start from XKNN_MPI_OUTPUT_INIT. Sink and gather may be combined. */
typedef struct xknn_mpi_output {
    xknn_mpi_sink_fn sink;         /* may be NULL                                       */
    void *sink_user;
    int gather_root;               /* rank receiving all results, or XKNN_MPI_NO_GATHER;
                                      the same on every rank                             */
    int64_t *ids;                  /* on gather_root: nq x k host, ld = k (else unused) */
    float *dist;                   /* on gather_root: nq x k host, ld = k; may be NULL   */
    xknn_mpi_progress_fn progress; /* may be NULL                                       */
    void *progress_user;
    int any_order;                 /* 1: the sink takes a rank's blocks in any order (each
                                      row once; e.g. a writer at file offsets), so the
                                      self-join may give rows as soon as they are final;
                                      0 (default): increasing q0                         */
} xknn_mpi_output;

#define XKNN_MPI_OUTPUT_INIT { NULL, NULL, XKNN_MPI_NO_GATHER, NULL, NULL, NULL, NULL, 0 }

/* Seconds spent per phase. read is never filled by the library (the caller's file
 * reading, kept here so one struct carries a whole run). */
typedef struct xknn_mpi_timings {
    double read;      /* caller's                                                */
    double broadcast; /* packing query blocks and waiting for their broadcast    */
    double search;    /* xknn_search on the local slice                          */
    double reduce;    /* tree reduction (transfers + merges) and gather forwarding */
    double write;     /* inside the sink callback                                */
    double total;     /* the whole call                                          */
} xknn_mpi_timings;

/* What a search did. Filled on every rank, also on failure (as far as it got). */
typedef struct xknn_mpi_stats {
    int64_t n, nq, d, k;         /* global sizes                                      */
    int64_t query_block;         /* effective queries per block                       */
    int64_t blocks;              /* number of blocks                                  */
    int64_t blocks_owned;        /* blocks delivered on this rank                     */
    int ranks;
    xknn_mpi_transfer transfer;  /* effective mode (never AUTO)                       */
    xknn_mpi_timings local;      /* this rank                                         */
    xknn_mpi_timings max;        /* maximum over ranks, phase by phase                */
    int64_t distance_evals;      /* query-reference distance evaluations this rank
                                    computed (plain: block rows x slice rows, summed;
                                    symmetric self-join: each unordered pair once, a
                                    slice's diagonal m(m-1)/2). With local.search (this
                                    rank's busy seconds) it shows the balance: the
                                    ring gives every rank the same count up to one row
                                    of the largest slice (see xknn_mpi_self_join)      */
} xknn_mpi_stats;

/* Not collective. Static names ("auto", "host-staged", "cuda-aware"); "unknown". */
XKNN_API const char *xknn_mpi_transfer_name(xknn_mpi_transfer transfer);
/* Not collective. Parses the names above; XKNN_MPI_TRANSFER_COUNT if unknown. */
XKNN_API xknn_mpi_transfer xknn_mpi_transfer_from_name(const char *name);

/* Not collective. 1 if the MPI library reports CUDA-aware support at run time
 * (MPIX_Query_cuda_support() from mpi-ext.h), 0 if not or when it cannot tell. */
XKNN_API int xknn_mpi_cuda_aware_supported(void);

/* Not collective. The standard slicing: rank r of size owns rows
 * [floor(r*n/size), floor((r+1)*n/size)), computed without overflow for any n >= 0
 * (row0 and rows are host pointers). */
XKNN_API void xknn_mpi_slice(int64_t n, int rank, int size, int64_t *row0, int64_t *rows);

/*
 * Collective over comm. Creates a context: duplicates comm (the library's traffic never
 * meets the caller's), sets MPI_ERRORS_RETURN on the duplicate, finds the local rank
 * (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)) and picks the device (config->device, or
 * local rank mod xknn_cuda_device_count(); -1 when there is none) and the transfer mode.
 *   config  host, may be NULL (defaults). *ctx (host) receives the context, NULL on error.
 * Errors (agreed): INVALID_ARGUMENT (bad config on some rank), OUT_OF_MEMORY, MPI.
 */
XKNN_API xknn_status xknn_mpi_create(MPI_Comm comm, const xknn_mpi_config *config, xknn_mpi_context **ctx,
                                     xknn_error *err);

/* Collective. Frees the duplicated communicator and the context. NULL is a no-op
 * (then not collective). Returns MPI when MPI_Comm_free fails (not agreed). */
XKNN_API xknn_status xknn_mpi_destroy(xknn_mpi_context *ctx);

/* Not collective. This rank, the number of ranks, the rank within the node and the
 * number of ranks on the node, the chosen device (-1: none), the effective transfer. */
XKNN_API int xknn_mpi_rank(const xknn_mpi_context *ctx);
XKNN_API int xknn_mpi_size(const xknn_mpi_context *ctx);
XKNN_API int xknn_mpi_local_rank(const xknn_mpi_context *ctx);
XKNN_API int xknn_mpi_local_size(const xknn_mpi_context *ctx);
XKNN_API int xknn_mpi_device(const xknn_mpi_context *ctx);
XKNN_API xknn_mpi_transfer xknn_mpi_transfer_mode(const xknn_mpi_context *ctx);

/* Not collective. The context's communicator (its duplicate of the one given to
 * xknn_mpi_create; MPI errors return), MPI_COMM_NULL for NULL. A caller may run its own
 * collectives on it between the library's calls, from the thread that makes them, so
 * that one communicator orders everything; it stays the context's (xknn_mpi_destroy
 * frees it). */
XKNN_API MPI_Comm xknn_mpi_comm(const xknn_mpi_context *ctx);

/*
 * Collective. Agrees on an outcome: every rank passes its own status (and, on failure,
 * its message in *err); every rank returns the same status, and *err (host, may be
 * NULL) receives the message of the lowest failing rank. XKNN_SUCCESS only if all
 * ranks passed XKNN_SUCCESS. For callers that keep the library's error discipline in
 * their own steps (the knn_mpi command does).
 */
XKNN_API xknn_status xknn_mpi_agree(xknn_mpi_context *ctx, xknn_status status, xknn_error *err);

/*
 * Collective. Distributed exact k-NN.
 *   params      host, may be NULL (defaults); the same metric, p and weights (whamming:
 *               each rank passes its own host copy of the same weights) on every rank;
 *               metric, p and weights_count are checked to agree. The library
 *               sets pad_missing, ref_id_offset and query_id_offset itself; device -1
 *               means the context's device. exclude_self (non-self-join) is honoured
 *               with query ids params->query_id_offset + row, as in xknn_search.
 *   ref         this rank's slice: host, rows x d, row-major with ld; NULL or 0 rows
 *               for an empty slice. Any dtype (xknn.h LIMITS), the same on every rank
 *               and for the queries; query blocks travel in that dtype. The slices of all ranks must together be exactly
 *               the rows [0, n) (any order of ranks, any sizes).
 *   ref_offset  global id of this slice's row 0 (ignored for an empty slice).
 *   query       on query_root: nq x d host matrix; ignored elsewhere (pass NULL).
 *   query_root  the rank holding the queries (the same on every rank);
 *               XKNN_MPI_SELF_JOIN: the self-join (xknn_mpi_self_join; query ignored).
 *   k           1 <= k <= n (n - 1 with exclude_self overlapping), the same everywhere.
 *   out         where results go (host; see xknn_mpi_output). NULL: results are
 *               computed, merged and dropped (benchmarks of the search itself).
 *   stats       host, may be NULL.
 *   err         host, may be NULL; the same message on every rank on failure.
 * Memory per rank: about query_block * (2*row_bytes + 4*k*12) bytes, plus the gather
 * arrays (row_bytes = d * element size; ceil(d/64) * 8 for bits). For ip the merge
 * orders by (-value, id), as xknn_search does.
 * Errors (agreed): INVALID_ARGUMENT (sizes, k, slices that do not partition [0, n),
 * mismatched arguments between ranks), INVALID_VALUE (NaN/Inf: rank, global row and
 * column), OUT_OF_MEMORY, NOT_BUILT/NO_DEVICE/DEVICE (backend), the sink's status, MPI.
 */
XKNN_API xknn_status xknn_mpi_search(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                                     int64_t ref_offset, const xknn_matrix *query, int query_root, int64_t k,
                                     const xknn_mpi_output *out, xknn_mpi_stats *stats, xknn_error *err);

/*
 * Collective. The all-kNN graph: the queries are the references (n = nq); a point is
 * never its own neighbour (duplicates at other ids are); 1 <= k <= n - 1.
 * One rank on a GPU whose self-join is symmetric (xknn_self_join_why_plain() is NULL)
 * runs the backend's own: one xknn_search of the whole graph.
 * Symmetric (params->self_join = XKNN_SELF_JOIN_AUTO, where every rank's backend
 * supports it: xknn_search_pair_why_not() is NULL on all ranks): only the slice pairs
 * (i, j), i <= j, are computed, each distance once for both points, with
 * xknn_search_pair(); in step s = 0 .. floor(P/2) rank r pairs its slice with slice
 * (r + s) mod P (for even P the last step's pair (r, r + P/2) is split by rows between
 * ranks r and r + P/2, and first rows of each slice's diagonal move to the previous
 * rank to absorb unequal slice sizes), so every rank computes the same number of
 * distance evaluations up to one row of the largest slice (stats->distance_evals;
 * slices of at most 1.5 P rows, or skewed ones, get the nearest fit); slices
 * travel around the ring, and the lists
 * of a step's held slice go to its owner during the next step's compute, where they are
 * merged with the search's pairwise merge (with MPI_THREAD_FUNNELED or more, the compute
 * runs in a worker thread while the calling thread progresses the transfers; below
 * that, inline with the transfers after it). Results: each non-empty slice delivered
 * on the rank that owns it, in one or more blocks (that follow each other, increasing
 * q0, unless the output sets any_order; every row once; at P = 2 the last pair runs in
 * pieces whose rows go to the sink as they end; the gather gets whole slices); the
 * ring's large buffers are freed in a thread of their own after the results are
 * delivered (joined by the next call on the context and by xknn_mpi_destroy); memory per
 * rank 4 (P = 2), 3 (P = 3) or 6 list sets of (n/P) * k * 12 bytes plus two slices. On
 * a GPU each rank keeps its own slice, the slice it holds and the running
 * lists of both on the device (xknn_cuda_keep_rows, xknn_cuda_keep_lists): rows cross
 * to the device once, lists once back. Plain (XKNN_SELF_JOIN_PLAIN, or a backend without
 * a pair kernel for the metric and dtype): each query block is broadcast by the rank that owns
 * those rows (blocks never straddle slices) and searched everywhere. Both give the same
 * ids and distance bits. The context's verbose prints which path ran and, for the
 * ring, every rank's distance evaluations and busy seconds. Arguments and errors as xknn_mpi_search().
 */
XKNN_API xknn_status xknn_mpi_self_join(xknn_mpi_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                                        int64_t ref_offset, int64_t k, const xknn_mpi_output *out,
                                        xknn_mpi_stats *stats, xknn_error *err);

/*
 * Collective. Convenience: search (or self-join when query_root == XKNN_MPI_SELF_JOIN)
 * and gather all nq x k results on gather_root into ids/dist (host, ld = k; dist may be
 * NULL; both ignored on other ranks). Memory on gather_root: nq * k * 12 bytes.
 */
XKNN_API xknn_status xknn_mpi_search_gather(xknn_mpi_context *ctx, const xknn_params *params,
                                            const xknn_matrix *ref, int64_t ref_offset, const xknn_matrix *query,
                                            int query_root, int64_t k, int gather_root, int64_t *ids, float *dist,
                                            xknn_error *err);

/*
 * The resident index: a search's slices kept where searches run, for codes that search
 * many query batches against the same (or slowly changing) references (a simulation's
 * time steps, a service). Each rank's slice is copied once, at create, into memory the
 * index owns (host memory, and the rank's GPU where the device path applies: CUDA
 * backend, l2 or euclidean on float32, room on the device) and its values checked once;
 * xknn_mpi_index_update replaces rows. Every search then moves only queries and
 * candidates, with the ids and distance bits of xknn_mpi_search on the same rows.
 * Device memory (a rank with a GPU, backend cuda or auto): a slice there goes device to
 * device to the GPU copy alone, its values checked on the device, where the device path
 * applies (else it is copied to host memory); update rows there likewise; queries there
 * are copied to the query root's host memory for the broadcast. A self-join of a slice
 * held on the GPU alone copies it to host memory for the call.
 */
typedef struct xknn_mpi_index xknn_mpi_index;

/* Collective. Arguments as xknn_mpi_search's params, ref and ref_offset (host or device
 * memory; the caller may free ref after the call). The index keeps params as given for every
 * search, query_id_offset and exclude_self included (a caller whose query roots take
 * turns asks for k + 1 and drops each query's own id). Memory per rank: the slice in
 * host memory, and on the device where it is resident. *index is NULL on failure
 * (agreed). */
XKNN_API xknn_status xknn_mpi_index_create(xknn_mpi_context *ctx, const xknn_params *params,
                                           const xknn_matrix *ref, int64_t ref_offset, xknn_mpi_index **index,
                                           xknn_error *err);
/* Collective. The index over the caller's slice instead of a copy (xknn_mpi_search is
 * this, one search and destroy): ref's rows must stay allocated and unchanged until
 * xknn_mpi_index_destroy. Nothing is copied or uploaded: each search keeps the slice on
 * the GPU for its own duration where the device path applies. The first search checks
 * the values, unless params->values_checked says the caller did (the xknn/io.h readers
 * do: NaN and Inf; hellinger's signs are the caller's then): only the metric's checks
 * (dtype pair, p, weights) run here, on the slice's first row. A search that succeeded
 * has checked the slice; later ones skip the scan. xknn_mpi_index_update refuses
 * (INVALID_ARGUMENT). Errors (agreed): OUT_OF_MEMORY, INVALID_ARGUMENT. */
XKNN_API xknn_status xknn_mpi_index_borrow(xknn_mpi_context *ctx, const xknn_params *params,
                                           const xknn_matrix *ref, int64_t ref_offset, xknn_mpi_index **index,
                                           xknn_error *err);
/* Collective. xknn_mpi_search against the index's slices (query, query_root, k, out,
 * stats and errors as there; query_root XKNN_MPI_SELF_JOIN: the self-join, as
 * xknn_mpi_index_self_join). */
XKNN_API xknn_status xknn_mpi_index_search(xknn_mpi_index *index, const xknn_matrix *query, int query_root,
                                           int64_t k, const xknn_mpi_output *out, xknn_mpi_stats *stats,
                                           xknn_error *err);
/* Collective. xknn_mpi_self_join of the index's rows (k, out, stats, errors as there). */
XKNN_API xknn_status xknn_mpi_index_self_join(xknn_mpi_index *index, int64_t k, const xknn_mpi_output *out,
                                              xknn_mpi_stats *stats, xknn_error *err);
/* Collective. xknn_mpi_search_gather against the index's slices. */
XKNN_API xknn_status xknn_mpi_index_search_gather(xknn_mpi_index *index, const xknn_matrix *query,
                                                  int query_root, int64_t k, int gather_root, int64_t *ids,
                                                  float *dist, xknn_error *err);
/* Collective. Rows [row0, row0 + rows->rows) of this rank's slice replaced by rows (host
 * or device memory, the slice's d and dtype; NULL or 0 rows: this rank changes nothing); their values are
 * checked (INVALID_VALUE names the global row). On failure no rank changed its slice
 * unless the failure came from the device copy (DEVICE): destroy the index then. */
XKNN_API xknn_status xknn_mpi_index_update(xknn_mpi_index *index, int64_t row0, const xknn_matrix *rows,
                                           xknn_error *err);
/* Not collective. Frees this rank's part (NULL: nothing). */
XKNN_API xknn_status xknn_mpi_index_destroy(xknn_mpi_index *index);

#ifdef __cplusplus
}
#endif

#endif /* XKNN_MPI_H */
