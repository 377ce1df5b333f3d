/* SPDX-License-Identifier: MIT */
/*
 * xknn/impl/cuda_internal.h -- entry points of the CUDA backend that the distributed
 * layer (mpi/), the tests and the benchmarks use, and embedding callers do not: rows and
 * running lists kept on a context between calls, their copies to the host, page-locked
 * host memory, the path a search would take, and reference rows resident on a GPU for
 * the distributed layer's searches. Not part of the public API; exported
 * (XKNN_API) so that the MPI library links against them. Built without CUDA, each
 * answers as kernels/cuda/stub.c and resident_stub.c say (NOT_BUILT, or nothing to do).
 */
#ifndef XKNN_IMPL_CUDA_INTERNAL_H
#define XKNN_IMPL_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "../cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * Reference rows kept resident on a GPU for many searches (the distributed layer's rank
 * slice, mpi/resident.c): the library owns their device memory, stream, staging and
 * device scope. Opaque; every call makes the handle's device current and restores the
 * caller's. Not collective; one thread at a time a handle.
 *
 * _open uploads ref (f32 rows, l2 or euclidean, backend cuda or auto with device >= 0;
 * params->cuda_context, if set, is used and gives the device) and sizes buffers for
 * blocks of up to qb queries and k results and a workspace: the caller's
 * device_memory_budget less the slice and buffers, without a budget at most 8 GiB of
 * what is free. NULL, with the reason in why, where the path does not apply or does
 * not fit (the caller searches on host arrays instead).
 * _reserve grows the buffers for blocks of qb queries and k results (they keep the
 * largest seen; k is this search's): 0, or -1 with the reason in why.
 * _update copies rows (f32, rows->ld or dense; host or device memory) over resident rows
 * [row0, row0 + rows). _open takes ref in host or device memory too.
 * _start searches rows host queries q (dense, d floats a row; reusable on return)
 * against the resident rows with params (xknn_cuda_search's contract), enqueued on the
 * handle's stream, and returns; _finish waits for that search and writes its ids and
 * dist (NULL: none) as rows x k in host memory. While the device works, poll (if not
 * NULL) is called with poll_arg between short sleeps; the wait itself sleeps (a
 * blocking-sync event). One search in flight a handle; a _start that failed leaves none.
 * _close frees all (NULL: nothing).
 * Built without CUDA: _open and _reserve say so in why, _start, _finish and _update
 * return NOT_BUILT.
 */
typedef struct xknn__cuda_resident xknn__cuda_resident;
XKNN_API xknn__cuda_resident *xknn__cuda_resident_open(const xknn_params *params, int device, const xknn_matrix *ref,
                                                       int64_t qb, int64_t k, char *why, size_t why_size);
XKNN_API int xknn__cuda_resident_reserve(xknn__cuda_resident *r, const xknn_params *params, int64_t qb, int64_t k,
                                         char *why, size_t why_size);
XKNN_API xknn_status xknn__cuda_resident_update(xknn__cuda_resident *r, int64_t row0, const xknn_matrix *rows,
                                                xknn_error *err);
XKNN_API xknn_status xknn__cuda_resident_start(xknn__cuda_resident *r, const xknn_params *params, const float *q,
                                               int64_t rows, xknn_error *err);
XKNN_API xknn_status xknn__cuda_resident_finish(xknn__cuda_resident *r, int64_t *ids, float *dist,
                                                void (*poll)(void *), void *poll_arg, xknn_error *err);
XKNN_API void xknn__cuda_resident_close(xknn__cuda_resident *r);
/* The rows' device memory (r->n x d floats, dense), for the caller's bookkeeping. */
XKNN_API const float *xknn__cuda_resident_rows(const xknn__cuda_resident *r);

/*
 * Caller memory that may lie on a device (the distributed index takes host or device
 * pointers). _pointer_device: the device whose memory p points into (cudaMalloc'd or
 * managed), -1 for host memory or without CUDA. _copy_rows: rows of width bytes from
 * src (pitch spitch) to dst (pitch dpitch), either side host or device memory (unified
 * addressing); returns once the bytes are there. _first_nonfinite: over device f32 rows
 * (rows x d, stride ld elements), *row is the first row holding a NaN or an Inf, -1
 * where none; the caller names it with xknn_check_input on a host copy of that row.
 * Not collective. Built without CUDA: -1, and NOT_BUILT.
 */
XKNN_API int xknn__cuda_pointer_device(const void *p);
XKNN_API xknn_status xknn__cuda_copy_rows(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                          int64_t rows, xknn_error *err);
XKNN_API xknn_status xknn__cuda_first_nonfinite(const float *dev, int64_t rows, int64_t d, int64_t ld, int64_t *row,
                                                xknn_error *err);

#ifdef __cplusplus
}
#endif

#endif /* XKNN_IMPL_CUDA_INTERNAL_H */
