/* SPDX-License-Identifier: MIT */
/*
 * xknn/impl/knobs.h -- every environment variable the library reads, in one table.
 *
 * None of them changes a result: each forces a path the planner takes only on other
 * shapes or when memory is short (so that tests reach it on small data), sets a tuning
 * constant whose every value gives the same bytes, or prints a trace. Unset, the library
 * chooses. The library reads them only through xknn__knob(); tests/knobs-t.sh checks
 * that no other code reads an XKNN_ variable and that docs/DESIGN.md lists each row.
 *
 * X(id, default, purpose): the variable is XKNN_<id>.
 */
#ifndef XKNN_IMPL_KNOBS_H
#define XKNN_IMPL_KNOBS_H

#include <stdlib.h>

#define XKNN__KNOBS(X)                                                                                          \
    /* GPU planner: paths forced for tests (same bytes) */                                                    \
    X(CUDA_MMA_SYNC, "unset", "1: the mma.sync kernels on Hopper instead of wgmma (the path of cc 8.x GPUs)")    \
    X(CUDA_WGMMA_WS, "1", "0: the single-schedule wgmma kernel instead of the warp-specialized one")             \
    X(CUDA_NO_IMMA, "unset", "1: u8/i8/binary data on the canonical tiles instead of integer tensor cores")     \
    X(CUDA_FP32_CUBLAS, "unset", "1: the fp32 path on cuBLAS SGEMM tiles for every shape")                      \
    X(CUDA_NO_ESTIMATE, "unset", "1: the rigorous threshold instead of the sampled estimate")                   \
    X(CUDA_CENTER, "by size", "1: centre every l2 tensor-core shape; 0: none")                                  \
    X(CUDA_RESOLVE_RANGES, "by L2 size", "N > 0: re-rank in reference ranges of 1/N of the L2; 0: one pass")    \
    X(CUDA_REF_SLICE, "2^31 - 1", "N: at most N references per device pass (the multi-slice merge)")            \
    X(CUDA_SYM_BAND, "by shape", "N > 0: the self-join's band of N tiles; 0: the prefix pass")                  \
    X(CUDA_SYM_SORT, "1", "0: the banded self-join in the caller's row order")                                  \
    X(CUDA_SYM_POOL, "by size", "N: the sorted self-join's pool of N pairs (its overflow path)")                 \
    X(CUDA_SYM_REQUIRE, "unset", "1: a self-join/pair call that cannot run on the GPU fails instead of "        \
                                 "falling back")                                                                \
    /* GPU memory fallbacks, forced (same bytes) */                                                            \
    X(CUDA_DEVICE_LISTS, "1", "0: self-join lists merge on the host")                                           \
    X(CUDA_KEEP, "1", "0: no rows kept on the device between a self-join's parts")                              \
    /* tuning (same bytes for every value) */                                                                  \
    X(CUDA_WITNESS_C, "by path", "C > 0: the witness constant of the tensor-core plans")                        \
    /* the symmetric ring (mpi/symmetric.c), forced (same bytes) */                                            \
    X(MPI_SYM_THREAD, "1", "0: the ring computes on the main thread (no worker)")                               \
    X(MPI_SYM_PIECES, "4", "0..16: P = 2's last pair in that many pieces")                                     \
    X(MPI_SYM_BOUNDS, "1", "0: no distance bounds exchanged in the ring")                                       \
    X(MPI_SYM_DEVICE_LISTS, "1", "0: the ring's running lists on the host")                                     \
    X(MPI_SYM_BLOCK_ROWS, "about 8 MiB", "N: rows per merge block of a piece")                                  \
    X(MPI_SYM_MERGE_THREADS, "by backend", "N: merge threads while the worker computes")                        \
    /* diagnostics */                                                                                           \
    X(MPI_SYM_TRACE, "unset", "1: the ring's per-step times on stderr")

#define XKNN__KNOB_ID(id, def, purpose) XKNN__KNOB_##id,
#define XKNN__KNOB_NAME(id, def, purpose) "XKNN_" #id,

typedef enum { XKNN__KNOBS(XKNN__KNOB_ID) XKNN__KNOB_COUNT } xknn__knob_id;

/* The variable's value, NULL when it is unset. */
static inline const char *xknn__knob(xknn__knob_id id)
{
    static const char *const names[] = {XKNN__KNOBS(XKNN__KNOB_NAME)};
    return getenv(names[id]);
}

#endif
