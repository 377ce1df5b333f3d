/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/lists.cu -- what a caller keeps on a context between calls: device copies
 * of host rows (xknn_cuda_keep_rows / forget_rows) and running lists on the device
 * (keep_lists, fetch_lists, copy_lists, lists_kth), page-locked host memory, and the
 * lists' thresholds. The tables are guarded by the context's kept_lock.
 */
#include "engine.cuh"

namespace xknn_cuda {

/* The kept set whose first list is at ids into *m (taken out of the table with take),
 * or 0 where there is none. */
static int kept_lists_find(xknn_cuda_context *ctx, const int64_t *ids, int take, ListMirror *m)
{
    int slot = -1;
    pthread_mutex_lock(&ctx->kept_lock);
    for (int i = 0; i < 4 && slot < 0; ++i)
        if (ctx->lists[i].ids && ctx->lists[i].host_ids == ids) slot = i;
    if (slot >= 0) {
        *m = ctx->lists[slot];
        if (take) memset(&ctx->lists[slot], 0, sizeof ctx->lists[slot]);
    }
    pthread_mutex_unlock(&ctx->kept_lock);
    return slot >= 0;
}

/* The kept set that begins at ids (into *m; it stays kept) and rows [row0, row0 + rows)
 * inside it, for the copies to the host: INVALID_ARGUMENT otherwise, the message led by
 * what (the public function's name). */
xknn_status kept_lists_rows(xknn_cuda_context *ctx, const int64_t *ids, int64_t row0, int64_t rows,
                            const char *what, ListMirror *m, Err er)
{
    if (!ctx || !ids) return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "%s: NULL argument", what);
    if (!kept_lists_find(ctx, ids, 0, m))
        return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "%s: the context keeps no lists that begin there", what);
    if (row0 < 0 || rows < 0 || row0 > m->rows || rows > m->rows - row0)
        return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "%s: rows %lld..%lld outside the set's %lld rows", what,
                     (long long)row0, (long long)(row0 + rows - 1), (long long)m->rows);
    return XKNN_SUCCESS;
}

} // namespace xknn_cuda

using namespace xknn_cuda;

extern "C" {

/* The context's upload stream for kept rows (made by the first keep that needs it, under
 * kept_lock: another thread may run a call on the context meanwhile) into *ks. */
static cudaError_t keep_stream_of(xknn_cuda_context *ctx, cudaStream_t *ks)
{
    pthread_mutex_lock(&ctx->kept_lock);
    const cudaError_t e =
        ctx->keep_stream ? cudaSuccess : cudaStreamCreateWithFlags(&ctx->keep_stream, cudaStreamNonBlocking);
    *ks = ctx->keep_stream;
    pthread_mutex_unlock(&ctx->kept_lock);
    return e;
}

xknn_status xknn_cuda_keep_rows(xknn_cuda_context *ctx, const xknn_matrix *rows, int upload_now, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    xknn_cuda_kept *kp = NULL;
    DeviceScope scope;
    cudaStream_t ks = NULL; /* the upload stream (keep_stream_of) */
    int slot = -1;
    if (!ctx || !rows || !rows->data || rows->rows <= 0 || rows->cols <= 0)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_keep_rows: a context and a matrix of at least one row are needed"));
    if (rows->dtype != XKNN_DTYPE_F32)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_keep_rows: f32 rows only"));
    const size_t row_bytes = (size_t)rows->cols * sizeof(float);
    const size_t ld_bytes = (size_t)(rows->ld ? rows->ld : rows->cols) * sizeof(float);
    if (ld_bytes < row_bytes)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_keep_rows: ld %lld < cols %lld",
                                     (long long)rows->ld, (long long)rows->cols));
    XKNN__CUDA_CHECK(scope.enter(ctx->device));
    kp = (xknn_cuda_kept *)calloc(1, sizeof *kp);
    if (kp) {
        kp->host = (const char *)rows->data;
        kp->rows = rows->rows;
        kp->row_bytes = row_bytes;
        kp->ld_bytes = ld_bytes;
        /* chunks of about 32 MiB: a call uploads the ones it reads */
        kp->chunk = max64(1, ((int64_t)32 << 20) / (int64_t)row_bytes);
        kp->valid = (unsigned char *)calloc((size_t)ceil_div(kp->rows, kp->chunk), 1);
    }
    if (!kp || !kp->valid) {
        st = failf(er, XKNN_ERROR_OUT_OF_MEMORY, "xknn_cuda_keep_rows: out of host memory");
        goto cleanup;
    }
    {
        /* from the context's pool, in order on the upload stream: cudaMalloc waits for the
         * work the device is running (an implicit synchronization), so a held slice kept
         * while a call computes on another thread would start its upload only once that
         * call is over */
        cudaError_t e = cudaErrorMemoryAllocation;
        if (ctx->pool) {
            e = keep_stream_of(ctx, &ks);
            if (e == cudaSuccess)
                e = cudaMallocFromPoolAsync((void **)&kp->dev, (size_t)kp->rows * row_bytes, ctx->pool, ks);
            if (e == cudaSuccess) e = sync_stream(ctx, ks);
            if (e == cudaSuccess) {
                kp->freed_on = ctx->stream;
            } else {
                (void)cudaGetLastError();
                if (kp->dev) (void)cudaFreeAsync(kp->dev, ks);
                kp->dev = NULL;
            }
        }
        if (e != cudaSuccess) e = cudaMalloc((void **)&kp->dev, (size_t)kp->rows * row_bytes);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            kp->dev = NULL;
            st = failf(er, e == cudaErrorMemoryAllocation ? XKNN_ERROR_OUT_OF_MEMORY : XKNN_ERROR_DEVICE,
                       "xknn_cuda_keep_rows: %lld rows (%.1f MiB) on device %d: %s", (long long)kp->rows,
                       (double)kp->rows * (double)row_bytes / 1048576.0, ctx->device, cudaGetErrorString(e));
            goto cleanup;
        }
    }
    if (upload_now) {
        /* on a stream of its own: another thread may run a call on the context meanwhile */
        cudaError_t e = keep_stream_of(ctx, &ks);
        /* a chunk a copy: from pageable memory each copy holds the calling thread while
         * the driver stages it, and a call on the context in another thread gets its
         * turn between them */
        for (int64_t r0 = 0; r0 < kp->rows && e == cudaSuccess; r0 += kp->chunk)
            e = cudaMemcpy2DAsync(kp->dev + r0 * (int64_t)row_bytes, row_bytes, kp->host + r0 * (int64_t)ld_bytes,
                                  ld_bytes, row_bytes, (size_t)min64(kp->chunk, kp->rows - r0), cudaMemcpyHostToDevice,
                                  ks);
        if (e == cudaSuccess) e = sync_stream(ctx, ks);
        XKNN__CUDA_CHECK(e);
        memset(kp->valid, 1, (size_t)ceil_div(kp->rows, kp->chunk));
    }
    pthread_mutex_lock(&ctx->kept_lock);
    for (int i = 0; i < 8 && slot < 0; ++i)
        if (!ctx->kept[i]) slot = i;
    if (slot >= 0) ctx->kept[slot] = kp;
    pthread_mutex_unlock(&ctx->kept_lock);
    if (slot < 0) {
        st = failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_keep_rows: the context keeps 8 blocks of rows already");
        goto cleanup;
    }
    kp = NULL;
cleanup:
    kept_free(kp);
    return finish_err(err, st);
}

void xknn_cuda_forget_rows(xknn_cuda_context *ctx, const void *data)
{
    xknn_cuda_kept *kp = NULL;
    if (!ctx || !data) return;
    pthread_mutex_lock(&ctx->kept_lock);
    for (int i = 0; i < 8 && !kp; ++i)
        if (ctx->kept[i] && ctx->kept[i]->host == (const char *)data) {
            kp = ctx->kept[i];
            ctx->kept[i] = NULL;
        }
    pthread_mutex_unlock(&ctx->kept_lock);
    if (!kp) return;
    DeviceScope scope;
    if (scope.enter(ctx->device) == cudaSuccess) kept_free(kp);
}

xknn_status xknn_cuda_keep_lists(xknn_cuda_context *ctx, xknn_metric metric, int64_t *ids, float *dist, int64_t rows,
                                 int64_t k, int init, const float *bounds, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    DeviceScope scope;
    ListMirror m = {ids, dist, rows, k, NULL, NULL};
    const int ip = metric == XKNN_METRIC_IP;
    int slot = -1, piece = 0;
    if (!ctx || !ids || !dist || rows <= 0 || k <= 0)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_keep_lists: a context and lists of at least one row are needed"));
    if (init != XKNN_CUDA_LISTS_HOST && init != XKNN_CUDA_LISTS_PADDING)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_keep_lists: init %d: XKNN_CUDA_LISTS_HOST or XKNN_CUDA_LISTS_PADDING",
                                     init));
    if (bounds && (init != XKNN_CUDA_LISTS_PADDING || ip))
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_keep_lists: bounds go with XKNN_CUDA_LISTS_PADDING and a metric of "
                                     "the l2 family only"));
    if (rows > INT64_MAX / 16 / k)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_keep_lists: %lld x %lld lists: too large",
                                     (long long)rows, (long long)k));
    const size_t cnt = (size_t)(rows * k);
    XKNN__CUDA_CHECK(scope.enter(ctx->device));
    {
        /* (the bounds, if any, travel in a tail of the distances' allocation) */
        cudaError_t e = cudaMalloc((void **)&m.ids, cnt * sizeof(int64_t));
        if (e == cudaSuccess) e = cudaMalloc((void **)&m.dist, (cnt + (bounds ? (size_t)rows : 0)) * sizeof(float));
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            st = failf(er, e == cudaErrorMemoryAllocation ? XKNN_ERROR_OUT_OF_MEMORY : XKNN_ERROR_DEVICE,
                       "xknn_cuda_keep_lists: %lld x %lld lists (%.1f MiB) on device %d: %s", (long long)rows,
                       (long long)k, (double)cnt * 12.0 / 1048576.0, ctx->device, cudaGetErrorString(e));
            goto cleanup;
        }
    }
    if (init == XKNN_CUDA_LISTS_PADDING) {
        XKNN__CUDA_CHECK(launch_lists_pad(m.ids, m.dist, (int64_t)cnt, ip, ctx->sms, ctx->stream));
        if (bounds) {
            XKNN__CUDA_CHECK(cudaMemcpyAsync(m.dist + cnt, bounds, (size_t)rows * sizeof(float), cudaMemcpyHostToDevice,
                                             ctx->stream));
            XKNN__CUDA_CHECK(launch_lists_bound(m.dist, m.dist + cnt, rows, k, ctx->sms, ctx->stream));
        }
    } else {
        XKNN__CUDA_CHECK(stage_make(ctx));
        XKNN__TRY(stage_bytes(ctx, (char *)m.ids, (const char *)ids, rows, (size_t)k * sizeof(int64_t),
                              (size_t)k * sizeof(int64_t), ctx->threads, &piece, er, kStagePiece));
        XKNN__TRY(stage_bytes(ctx, (char *)m.dist, (const char *)dist, rows, (size_t)k * sizeof(float),
                              (size_t)k * sizeof(float), ctx->threads, &piece, er, kStagePiece));
        XKNN__CUDA_CHECK(cudaStreamWaitEvent(ctx->stream, ctx->stage_done[(piece - 1) & 1], 0));
    }
    /* (the caller may change its arrays and bounds once this returns) */
    XKNN__CUDA_CHECK(sync_stream(ctx, ctx->stream));
    {
        /* a free slot, and no overlap with a set kept already (a row's lists live in one
         * place) */
        const char *lo = (const char *)ids, *hi = (const char *)(ids + cnt);
        int overlap = 0;
        pthread_mutex_lock(&ctx->kept_lock);
        for (int i = 0; i < 4; ++i) {
            const ListMirror &o = ctx->lists[i];
            if (!o.ids) {
                if (slot < 0) slot = i;
                continue;
            }
            const char *olo = (const char *)o.host_ids, *ohi = (const char *)(o.host_ids + o.rows * o.k);
            overlap |= lo < ohi && olo < hi;
        }
        if (slot >= 0 && !overlap) ctx->lists[slot] = m;
        pthread_mutex_unlock(&ctx->kept_lock);
        if (overlap || slot < 0) {
            st = failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                       overlap ? "xknn_cuda_keep_lists: the lists overlap lists the context keeps already"
                               : "xknn_cuda_keep_lists: the context keeps 4 list sets already");
            goto cleanup;
        }
    }
    m.ids = NULL;
    m.dist = NULL;
cleanup:
    if (m.ids || m.dist) (void)sync_stream(ctx, ctx->stream);
    if (m.ids) cudaFree(m.ids);
    if (m.dist) cudaFree(m.dist);
    return finish_err(err, st);
}

xknn_status xknn_cuda_fetch_lists(xknn_cuda_context *ctx, int64_t *ids, int download, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    DeviceScope scope;
    ListMirror m;
    int piece = 0;
    if (!ctx || !ids)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_fetch_lists: NULL argument"));
    if (!kept_lists_find(ctx, ids, 1, &m))
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_fetch_lists: the context keeps no lists that begin there"));
    XKNN__CUDA_CHECK(scope.enter(ctx->device));
    /* (copies started by xknn_cuda_copy_lists_start may still read the set) */
    if (ctx->copier) (void)copier_wait(ctx->copier, -1, 1, NULL);
    if (download) {
        XKNN__CUDA_CHECK(stage_make(ctx));
        XKNN__TRY(results_out(ctx, 1, m.host_ids, m.ids, m.host_dist, m.dist, (size_t)(m.rows * m.k), ctx->threads,
                              ctx->stream, &piece, er, kStagePiece));
    }
cleanup:
    (void)sync_stream(ctx, ctx->stream);
    cudaFree(m.ids);
    cudaFree(m.dist);
    return finish_err(err, st);
}

xknn_status xknn_cuda_copy_lists(xknn_cuda_context *ctx, const int64_t *ids, int64_t row0, int64_t rows,
                                 xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    DeviceScope scope;
    ListMirror m = {}; /* (filled by kept_lists_rows) */
    int piece = 0;
    /* (the set stays in the table: the caller runs neither fetch_lists nor a call that
     * merges into these rows meanwhile) */
    if ((st = kept_lists_rows(ctx, ids, row0, rows, "xknn_cuda_copy_lists", &m, er)) != XKNN_SUCCESS || rows == 0)
        return finish_err(err, st);
    XKNN__CUDA_CHECK(scope.enter(ctx->device));
    XKNN__CUDA_CHECK(stage_make(ctx));
    XKNN__TRY(results_out(ctx, 1, m.host_ids + row0 * m.k, m.ids + row0 * m.k, m.host_dist + row0 * m.k,
                          m.dist + row0 * m.k, (size_t)(rows * m.k), ctx->threads, ctx->stream, &piece, er,
                          kStagePiece));
cleanup:
    (void)sync_stream(ctx, ctx->stream);
    return finish_err(err, st);
}

xknn_status xknn_cuda_host_register(xknn_cuda_context *ctx, void *p, size_t bytes, xknn_error *err)
{
    Err er = err_of(err);
    DeviceScope scope; /* (on the context's device: no runtime state made on another) */
    if (!ctx || !p || !bytes)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_host_register: a context and a range of memory are needed"));
    cudaError_t e = scope.enter(ctx->device);
    if (e == cudaSuccess) e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return finish_err(err, failf(er, XKNN_ERROR_DEVICE, "cuda backend: cudaHostRegister of %zu bytes: %s", bytes,
                                     cudaGetErrorString(e)));
    }
    return finish_err(err, XKNN_SUCCESS);
}

void xknn_cuda_host_unregister(xknn_cuda_context *ctx, void *p)
{
    DeviceScope scope;
    if (!ctx || !p || scope.enter(ctx->device) != cudaSuccess) return;
    if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

xknn_status xknn_cuda_lists_kth(xknn_cuda_context *ctx, const int64_t *ids, float *kth, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    DeviceScope scope;
    float *dk = NULL;
    ListMirror m;
    if (!ctx || !ids || !kth)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_lists_kth: NULL argument"));
    /* (the set stays in the table: only fetch_lists, which the caller does not run
     * meanwhile, frees it) */
    if (!kept_lists_find(ctx, ids, 0, &m))
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_lists_kth: the context keeps no lists that begin there"));
    XKNN__CUDA_CHECK(scope.enter(ctx->device));
    XKNN__CUDA_CHECK(cudaMalloc((void **)&dk, (size_t)m.rows * sizeof(float)));
    XKNN__CUDA_CHECK(launch_lists_last(m.ids, m.dist, m.rows, m.k, dk, ctx->sms, ctx->stream));
    XKNN__CUDA_CHECK(cudaMemcpyAsync(kth, dk, (size_t)m.rows * sizeof(float), cudaMemcpyDeviceToHost, ctx->stream));
    XKNN__CUDA_CHECK(sync_stream(ctx, ctx->stream));
cleanup:
    if (dk) {
        (void)sync_stream(ctx, ctx->stream);
        cudaFree(dk);
    }
    return finish_err(err, st);
}

} /* extern "C" */
