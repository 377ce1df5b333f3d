/* SPDX-License-Identifier: MIT */
/*
 * xknn/cuda.h -- embedding API of the CUDA backend: device pointers in and out, the
 * caller's stream, the caller's workspace. C99; needs no CUDA header (a cudaStream_t is
 * a `struct CUstream_st *`, which is what this API takes).
 *
 * WHAT IT DOES
 *   The same exact k-NN as xknn_search (same ids, same distance bits, same order, same
 *   exclude_self / id offsets / pad_missing semantics) on matrices already in device
 *   memory. Work is only enqueued on `stream`: no host synchronisation, no device memory
 *   allocation, no device-wide barrier happens inside xknn_cuda_search. Every decision
 *   that depends on data (candidate buffer compaction) is taken on the device.
 *
 * WHAT IT DOES NOT DO
 *   - It does not scan inputs for NaN/Inf (that would need a host synchronisation);
 *     such inputs give unspecified neighbours (never a crash or a hang).
 *   - No streaming from host memory: xknn_search (backend cuda) does that.
 *   - A context is not thread-safe: use one context per host thread (or serialise).
 *
 * EXAMPLE
 *     xknn_cuda_context *ctx;
 *     xknn_cuda_context_create(0, &ctx, &err);
 *     xknn_params p = XKNN_PARAMS_INIT;
 *     size_t bytes;
 *     xknn_cuda_workspace_size(ctx, &p, n, nq, d, k, &bytes, &err);
 *     cudaMalloc(&ws, bytes);                              // 256-byte aligned
 *     xknn_matrix ref = XKNN_MATRIX_F32(d_ref, n, d);       // device pointers
 *     xknn_matrix qry = XKNN_MATRIX_F32(d_qry, nq, d);
 *     xknn_cuda_search(ctx, &p, &ref, &qry, k, d_ids, d_dist, ws, bytes, &err, stream);
 *     // ... later: cudaStreamSynchronize(stream); results in d_ids, d_dist
 *     xknn_cuda_context_destroy(ctx);
 *
 * LIMITS
 *   n <= 2^31 - 1 references per call (xknn_search splits larger sets itself).
 *   Leading dimensions and d must fit in int (cuBLAS). Rows of ref and query should be
 *   4-byte aligned (float); 16-byte alignment of ld*4 lets cuBLAS use its fast kernels.
 *   Transient device memory other than the workspace: none (cuBLAS gets its workspace
 *   from ours through cublasSetWorkspace), except the cuBLAS handle a context creates on
 *   its first GEMM-path search.
 */
#ifndef XKNN_CUDA_H
#define XKNN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "../xknn.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st; /* = cudaStream_t's pointee; NULL means the legacy default stream */

/* Values of xknn_params.cuda_path: how the CUDA backend generates candidates. Results are
 * identical for all values (the canonical distance decides).
 * AUTO: FUSED where it is supported, min(k, n) <= 32 and either d <= 16, or d <= 32 and
 * n*nq*d <= 4e9; otherwise MMA where it is supported; otherwise TF32 for large problems
 * (d >= 32, n*nq*d >= 1e10), else FP32 (xknn_cuda_path_for of xknn/impl/cuda_internal.h
 * tells).
 * FUSED is supported for metric l2 / euclidean, d <= 128 and min(k, n) <= 128; beyond
 * that, or when its workspace does not fit, FUSED behaves as AUTO on the GEMM paths.
 * MMA is supported for metric l2 / euclidean and d <= 128 on GPUs of compute capability
 * 8.0 or newer, with the references resident in device memory; otherwise (or when its
 * workspace does not fit) it behaves as TF32. Where n*nq >= 2^32 and the workspace
 * holds them, its tensor cores see rows centred on the references' mean and rounded to
 * TF32, a narrower bound and fewer candidates (round_up(d, 4) floats a reference and a
 * state query of workspace; XKNN_CUDA_CENTER=1 / 0, diagnostics, centres every shape /
 * none; the results are the same bytes).
 * Metrics ip and cosine (f32) have one GEMM path, MMA (AUTO, FUSED and MMA choose it):
 * d <= 128, compute capability 8.0 or newer, at least 2 min(k, n) witness groups (n >=
 * 128 min(k, n)); cosine runs the tensor cores on unit-length copies of the rows (their
 * n d floats are part of the workspace). FP32 / TF32, or a shape the path does not
 * take, send host-array searches to the canonical tiles below and make the embedding
 * API answer INVALID_ARGUMENT with the reason. */
#define XKNN_CUDA_PATH_AUTO 0  /* see above                                                 */
#define XKNN_CUDA_PATH_FP32 1  /* FP32 products, no tensor cores: l2/euclidean with d <= 128
                                  and resident references run the MMA path's passes on
                                  the CUDA cores, anything else cuBLAS SGEMM (pedantic)   */
#define XKNN_CUDA_PATH_TF32 2  /* cuBLAS GEMM on TF32 tensor cores, wider certified margin   */
#define XKNN_CUDA_PATH_FUSED 3 /* one kernel: float distances of the direct form (q - x)^2
                                  with a relative error bound, warp-level selection of 2k or
                                  more candidates, canonical re-rank; a query whose candidates
                                  cannot be certified is searched again exactly (RERUNS)  */
#define XKNN_CUDA_PATH_MMA 4   /* TF32 tensor-core tiles (mma.sync) whose epilogue filters in
                                  registers: pass A bounds each query's k-th distance from
                                  witnesses on a prefix of the references, pass B keeps the
                                  pairs whose certified lower bound is within it; canonical
                                  re-rank; a query whose candidates overflow is searched
                                  again exactly (RERUNS). No distance tile is written.
                                  Hopper builds (gpu_arch 90, sm_90a code) run it on wgmma,
                                  other GPUs on mma.sync; the environment variable
                                  XKNN_CUDA_MMA_SYNC=1 forces mma.sync, and
                                  XKNN_CUDA_WITNESS_C=C sets the witness prefix
                                  f = sqrt(C kk / n) (default 1600 for kk <= 128, 200
                                  above; diagnostics; docs/DESIGN.md section 10 lists
                                  them all). l2/euclidean on mma.sync (and the fp32
                                  path's CUDA-core passes for k >= n / 16384) drop the
                                  pairs whose lower bound exceeds the k-th upper bound
                                  before the re-rank. For large k (l2, where
                                  a rigorous bound would need most references as
                                  witnesses) the bound is estimated from a short prefix
                                  and certified after the re-rank; a query whose
                                  certificate fails is searched again exactly (RERUNS),
                                  and the re-rank runs by reference ranges of the L2's
                                  size; XKNN_CUDA_NO_ESTIMATE=1 and
                                  XKNN_CUDA_RESOLVE_RANGES=0 (diagnostics) turn them off.
                                  Same bytes either way. In xknn_search_pair (l2) a
                                  side whose running lists are full takes its thresholds
                                  from their k-th values instead of witnesses.           */
/* Host-array searches of other metrics and dtypes (xknn_search with backend cuda or auto)
 * take kernels/cuda/imma.cu (u8/i8 l2, euclidean, ip; hamming: exact integer tensor cores
 * with fused candidate selection) or kernels/cuda/generic.cu (everything else: canonical
 * FP64 / popcount tiles with fused selection). On Hopper builds u8/i8 run a warp-
 * specialized wgmma kernel, other GPUs and hamming mma.sync. Environment (diagnostics):
 * XKNN_CUDA_NO_IMMA=1 sends the integer jobs to the canonical tiles; XKNN_CUDA_MMA_SYNC=1
 * keeps u8/i8 on mma.sync.
 * A host-array self-join (query NULL, self_join auto) of f32 l2/euclidean/ip/cosine on
 * the MMA path runs symmetric: pass B over the triangle of tiles, each off-diagonal tile feeding
 * its rows' and its columns' candidates, with the state of all n points on the device
 * (about n (16 cap + 4 groups + 32) bytes; verbose prints the plan). On the Hopper kernel
 * (d a multiple of 4, n above about 30k) pass A is a symmetric band of tiles whose
 * witnesses serve both rows and columns (XKNN_CUDA_SYM_BAND=0 / N, diagnostics: the
 * prefix pass / a band of N tiles; the results are the same bytes). With a context, the
 * results of each block of 32768 rows go out while the next is re-ranked. Where the
 * symmetric path does not apply it runs the plain search; XKNN_CUDA_SYM_REQUIRE=1
 * (diagnostics, the tests) makes that an error instead. */

/* Diagnostics: the workspace begins with XKNN_CUDA_STAT_COUNT unsigned 64-bit counters,
 * zeroed by each xknn_cuda_search and valid once its work on the stream has completed
 * (copy them out with cudaMemcpy). Bound compactions tighten the k-th upper bound and
 * drop candidates; exact compactions happen when near-ties fill a candidate buffer (its
 * canonical top k is kept); UNRESOLVED must always read 0. */
#define XKNN_CUDA_STAT_BOUND_COMPACTIONS 0
#define XKNN_CUDA_STAT_EXACT_COMPACTIONS 1
#define XKNN_CUDA_STAT_CANDIDATES 2
#define XKNN_CUDA_STAT_UNRESOLVED 3
#define XKNN_CUDA_STAT_RERUNS 4 /* fused / mma paths: queries searched again exactly       */
#define XKNN_CUDA_STAT_COUNT 8

/* Opaque reusable context: device ordinal, device properties, a stream and a device
 * memory pool for the host-array path (xknn_search with params.cuda_context keeps the
 * memory of its largest call in that pool until the context is destroyed, so repeated
 * calls allocate nothing), a pinned staging ring (two 4 MiB host buffers and a copy
 * stream, made by the first host-array search: every path's results, and the inputs
 * of the tensor-core and fused paths, go through it), a pinned buffer for the results
 * of xknn_search_pair (made by its first call, kept until the context is destroyed),
 * the blocks of rows and the running lists it keeps on the device (the distributed
 * layer's entry points, include/xknn/impl/cuda_internal.h), and a cuBLAS handle created
 * by the first GEMM-path search. */
typedef struct xknn_cuda_context xknn_cuda_context;

/*
 * Creates a context on `device` (-1: the calling thread's current device). Not
 * collective. Errors: NOT_BUILT, NO_DEVICE, INVALID_ARGUMENT (bad ordinal), DEVICE.
 * The calling thread's current device is unchanged on return.
 */
XKNN_API xknn_status xknn_cuda_context_create(int device, xknn_cuda_context **ctx, xknn_error *err);

/* Destroys a context (NULL is fine). The caller must have finished all work using it. */
XKNN_API void xknn_cuda_context_destroy(xknn_cuda_context *ctx);

/* Device ordinal of a context (-1 for NULL). */
XKNN_API int xknn_cuda_context_device(const xknn_cuda_context *ctx);

/*
 * Bytes of device workspace xknn_cuda_search needs for these sizes (host memory out
 * parameter). Touches no device memory and enqueues nothing. params->device_memory_budget
 * (0: 90% of the device's free memory now) bounds the result; the plan (query block,
 * tile, candidate buffers) is the largest that fits. Passing a smaller workspace to
 * xknn_cuda_search is allowed down to a minimum: it then picks a smaller plan.
 * Errors: INVALID_ARGUMENT, OUT_OF_MEMORY (even the smallest plan does not fit the
 * budget; the message gives both numbers), NOT_BUILT.
 */
XKNN_API xknn_status xknn_cuda_workspace_size(xknn_cuda_context *ctx, const xknn_params *params, int64_t n,
                                              int64_t nq, int64_t d, int64_t k, size_t *bytes, xknn_error *err);

/*
 * Exact k-NN on device arrays. Not collective; asynchronous with respect to the host.
 *   ref        n x d float matrix, DEVICE memory, row-major with leading dimension
 *   query      nq x d, DEVICE memory; NULL: self-join of ref (exclude_self forced on,
 *              query_id_offset = ref_id_offset), as in xknn_search
 *   k          1 <= k <= n (n - 1 with exclude_self), larger only with pad_missing
 *   ids        nq x k int64, DEVICE memory, row-major (ld = k); global ids
 *   dist       nq x k float, DEVICE memory, or NULL
 *   workspace  DEVICE memory, 256-byte aligned, at least the minimum for these sizes
 *              (xknn_cuda_workspace_size gives the preferred size); must stay allocated
 *              and untouched until the work on `stream` has completed
 *   stream     the caller's stream (last argument); all work is enqueued on it
 * metric: l2, euclidean; ip and cosine on the MMA path (see above); any other metric is
 * INVALID_ARGUMENT (xknn_search takes every metric on host arrays).
 * params: metric, exclude_self, pad_missing, ref_id_offset, query_id_offset, query_block
 * (queries per block), ref_block (tile width), cuda_path are honoured; backend, device,
 * num_threads, cpu_path, cuda_context are ignored (the context decides the device).
 * Host-side argument checks only (no synchronisation): errors INVALID_ARGUMENT,
 * OUT_OF_MEMORY (workspace below the minimum), DEVICE (a launch or cuBLAS call failed;
 * asynchronous faults surface at the caller's next synchronisation), NOT_BUILT.
 */
XKNN_API xknn_status xknn_cuda_search(xknn_cuda_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                                      const xknn_matrix *query, int64_t k, int64_t *ids, float *dist,
                                      void *workspace, size_t workspace_bytes, xknn_error *err,
                                      struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif

#endif /* XKNN_CUDA_H */
