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
 * (d >= 32, n*nq*d >= 1e10), else FP32 (xknn_cuda_path_for tells).
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
                                  XKNN_CUDA_WGMMA_KB32=1 the wgmma kernel's 32-dimension
                                  stages everywhere; XKNN_CUDA_WITNESS_C=C sets the witness
                                  prefix f = sqrt(C kk / n) (default 1600 for kk <= 128,
                                  200 above; diagnostics). l2/euclidean on mma.sync (and
                                  the fp32 path's CUDA-core passes for k >= n / 16384)
                                  drop the pairs whose lower bound exceeds the k-th upper
                                  bound before the re-rank; XKNN_CUDA_NO_PRUNE=1
                                  (diagnostic) re-ranks them all. For large k (l2, where
                                  a rigorous bound would need most references as
                                  witnesses) the bound is estimated from a short prefix
                                  and certified after the re-rank; a query whose
                                  certificate fails is searched again exactly (RERUNS),
                                  and the re-rank runs by reference ranges of the L2's
                                  size; XKNN_CUDA_NO_ESTIMATE=1 and
                                  XKNN_CUDA_RESOLVE_RANGES=0 (diagnostics) turn them off.
                                  Same bytes either way. In xknn_search_pair (l2) a
                                  side whose running lists are full takes its thresholds
                                  from their k-th values instead of witnesses;
                                  XKNN_CUDA_PAIR_WITNESSES=1 keeps the witnesses.        */
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
 * the blocks of rows and the running lists it keeps on the device (xknn_cuda_keep_rows,
 * xknn_cuda_keep_lists), and a cuBLAS handle
 * created by the first GEMM-path search. */
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
 * Keeps a device copy of host rows (f32, rows->rows x rows->cols, stride ld) for the
 * host-array calls on this context: a later xknn_search_pair or self-join whose rows lie
 * inside them (the same stride) reads the copy instead of uploading, so a caller that
 * runs many pairs over the same blocks (a distributed self-join) moves each row to the
 * device once. The copy is allocated now (it counts against later calls' device memory
 * budget); upload_now = 0 uploads each 32 MiB chunk when a call first reads it,
 * upload_now = 1 uploads all now, on a stream of the context's own (another thread may
 * run a call on the context meanwhile). The caller must not change the rows while they
 * are kept, nor forget them during a call that reads them. At most 8 blocks a context.
 * Not collective. Errors: INVALID_ARGUMENT, OUT_OF_MEMORY (host or device), DEVICE,
 * NOT_BUILT.
 */
XKNN_API xknn_status xknn_cuda_keep_rows(xknn_cuda_context *ctx, const xknn_matrix *rows, int upload_now,
                                         xknn_error *err);

/* Ends xknn_cuda_keep_rows for the block whose first row is data (frees its device
 * copy; nothing for rows not kept). xknn_cuda_context_destroy frees what is still kept. */
XKNN_API void xknn_cuda_forget_rows(xknn_cuda_context *ctx, const void *data);

/*
 * Keeps running k-best lists on the device between calls: ids and dist are rows x k host
 * arrays in xknn_search_pair's layout (each row sorted, padding last). A later
 * xknn_search_pair on this context (the CUDA backend) whose lists lie inside them merges
 * into the device copy instead, so a caller that runs many pairs over the same rows (a
 * distributed self-join) moves their lists once. The host arrays are not current, and
 * must not be read or written, until xknn_cuda_fetch_lists; a call that runs on the CPU
 * backend does not see the device copy. init: XKNN_CUDA_LISTS_HOST copies the host
 * arrays now; XKNN_CUDA_LISTS_PADDING makes padding on the device (id -1, distance +inf,
 * -inf for ip), the host arrays unread. bounds (PADDING, l2 family only; NULL: none):
 * rows floats, each row's padding carrying bounds[i] in its last entry, as a caller's
 * bounded padding for xknn_search_pair. The device copy counts against later calls'
 * device memory budget. At most 4 sets a context, none overlapping another. Not
 * collective. Errors: INVALID_ARGUMENT, OUT_OF_MEMORY, DEVICE, NOT_BUILT.
 */
#define XKNN_CUDA_LISTS_HOST 0
#define XKNN_CUDA_LISTS_PADDING 1
XKNN_API xknn_status xknn_cuda_keep_lists(xknn_cuda_context *ctx, xknn_metric metric, int64_t *ids, float *dist,
                                          int64_t rows, int64_t k, int init, const float *bounds, xknn_error *err);

/* Ends xknn_cuda_keep_lists for the set whose first list is at ids: download = 1 copies
 * the device lists into the host arrays first (returns once they are there), 0 drops them.
 * The device copy is freed either way. INVALID_ARGUMENT where no set begins at ids.
 * The host copies of keep_lists and fetch_lists run on as many threads as the context's
 * last host-array call had (params.num_threads; all before the first). */
XKNN_API xknn_status xknn_cuda_fetch_lists(xknn_cuda_context *ctx, int64_t *ids, int download, xknn_error *err);

/* Copies rows [row0, row0 + rows) of the kept set that begins at ids into those rows of
 * its host arrays (returns once they are there); the set stays kept. The copy is current
 * until a later call on this context merges into those rows. INVALID_ARGUMENT where no
 * set begins at ids or the rows lie outside it. */
XKNN_API xknn_status xknn_cuda_copy_lists(xknn_cuda_context *ctx, const int64_t *ids, int64_t row0, int64_t rows,
                                          xknn_error *err);

/* Starts copying rows [row0, row0 + rows) of the kept set that begins at ids into those
 * rows of its host arrays, after the work enqueued on the context so far (the calls that
 * wrote them), and returns at once with *ticket for xknn_cuda_copy_lists_test: a caller
 * can run its next call on the context meanwhile, as long as that call merges into other
 * rows and nothing else writes these host rows. The copies run in ticket order in a
 * thread of the context's own (made by the first start) on a stream of its own: into
 * page-locked host arrays (cudaHostRegister, xknn_cuda_host_register) as one copy, into
 * pageable ones through two pinned 16 MiB buffers. fetch_lists waits for the copies
 * started before it. INVALID_ARGUMENT where no set begins at ids or the rows lie outside
 * it; DEVICE. */
XKNN_API xknn_status xknn_cuda_copy_lists_start(xknn_cuda_context *ctx, const int64_t *ids, int64_t row0,
                                                int64_t rows, int64_t *ticket, xknn_error *err);

/* *done = 1 where the copy with this ticket is over (ticket 0: always), 0 where it has not
 * ended yet; wait = 1 returns once it is over. Callable from any thread. INVALID_ARGUMENT
 * for a ticket not issued; DEVICE where a copy up to this ticket failed. */
XKNN_API xknn_status xknn_cuda_copy_lists_test(xknn_cuda_context *ctx, int64_t ticket, int wait, int *done,
                                               xknn_error *err);

/* Page-locks bytes of host memory from p (cudaHostRegister, on the context's device), so
 * that the device's copy engines write it while the compute runs
 * (xknn_cuda_copy_lists_start); locking takes about a tenth of a second a gigabyte.
 * xknn_cuda_host_unregister(ctx, p) undoes it, before the memory is freed and the context
 * destroyed. INVALID_ARGUMENT, DEVICE (it cannot be locked), NOT_BUILT. */
XKNN_API xknn_status xknn_cuda_host_register(xknn_cuda_context *ctx, void *p, size_t bytes, xknn_error *err);
XKNN_API void xknn_cuda_host_unregister(xknn_cuda_context *ctx, void *p);

/* Each row's k-th distance in the kept set that begins at ids, into kth (rows floats, host
 * memory): the last entry's distance where the row holds k references, +inf where it does
 * not (the host arrays stay untouched). INVALID_ARGUMENT where no set begins at ids. */
XKNN_API xknn_status xknn_cuda_lists_kth(xknn_cuda_context *ctx, const int64_t *ids, float *kth, xknn_error *err);

/* The candidate path (XKNN_CUDA_PATH_FP32, _TF32 or _FUSED) that params->cuda_path selects
 * for these sizes (params NULL: defaults). Touches no device; a fused choice still falls
 * back to the GEMM paths when its workspace does not fit. Returns XKNN_CUDA_PATH_AUTO
 * when the CUDA backend is not built. Not collective. */
XKNN_API int xknn_cuda_path_for(const xknn_params *params, int64_t n, int64_t nq, int64_t d, int64_t k);

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
