/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/staging.cu -- host memory to and from the device for host-array calls:
 * the pinned staging ring (inputs in pieces, copies overlapping the host's), kept rows
 * found and uploaded on first use, the pair's pinned result buffer, the list mirrors of
 * a call's parts, and the results' way back to the host. Every copy is ordered on a
 * stream; the host waits only for a pinned buffer it reuses.
 */
#include "engine.cuh"
#include "xknn/impl/knobs.h"

namespace xknn_cuda {

/* ---- pinned staging ------------------------------------------------------------------
 * Pieces of stage_piece() bytes alternate between two pinned buffers of kStagePiece
 * bytes; the host copies a piece in (pool_copy: the calling thread and the context's
 * copy helpers), the copy stream moves it to the device, and the buffer is reused once
 * its copy has completed (its event, a blocking one: the host sleeps). */
/* Bytes per piece of the staging pipeline: whole buffers where helpers share the host's
 * copies (one wake-up a piece), else kStageGrain (more overlap for a lone thread) */
size_t stage_piece(xknn_cuda_context *ctx, int threads)
{
    return pool_helpers(ctx, threads) > 0 ? kStagePiece : kStageGrain;
}

cudaError_t stage_make(xknn_cuda_context *ctx)
{
    cudaError_t e = cudaSuccess;
    if (!ctx->copy_stream) e = cudaStreamCreateWithFlags(&ctx->copy_stream, cudaStreamNonBlocking);
    for (int b = 0; b < 2 && e == cudaSuccess; ++b) {
        if (!ctx->stage_done[b]) e = cudaEventCreateWithFlags(&ctx->stage_done[b], kHostWaitEvent);
        if (e == cudaSuccess && !ctx->stage[b]) e = cudaHostAlloc((void **)&ctx->stage[b], kStagePiece, cudaHostAllocDefault);
    }
    const size_t fb = (2 + kStatCount) * sizeof(unsigned long long);
    if (e == cudaSuccess && !ctx->finite_dev) e = cudaMalloc((void **)&ctx->finite_dev, 2 * sizeof(unsigned long long));
    if (e == cudaSuccess && !ctx->finite_host) e = cudaHostAlloc((void **)&ctx->finite_host, fb, cudaHostAllocDefault);
    return e;
}

/* rows x row_bytes from host rows of stride ld_bytes into pinned memory, on the threads
 * of the step policy (xknn__step_threads: one below 8 MiB, no OpenMP team at all) */
void host_rows_copy(char *dst, const char *src, int64_t rows, size_t row_bytes, size_t ld_bytes, int threads)
{
    const int64_t total = rows * (int64_t)row_bytes;
    threads = xknn__step_threads(threads, total);
    if (threads <= 1) {
        if (ld_bytes == row_bytes)
            memcpy(dst, src, (size_t)total);
        else
            for (int64_t i = 0; i < rows; ++i)
                memcpy(dst + i * (int64_t)row_bytes, src + i * (int64_t)ld_bytes, row_bytes);
        return;
    }
    if (ld_bytes == row_bytes) {
        /* one part per thread, whole pages */
        const int64_t part = ((total + threads - 1) / threads + 4095) / 4096 * 4096;
        const int64_t np = (total + part - 1) / part;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
        for (int64_t i = 0; i < np; ++i) {
            const int64_t o = i * part, len = total - o < part ? total - o : part;
            memcpy(dst + o, src + o, (size_t)len);
        }
    } else {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
        for (int64_t i = 0; i < rows; ++i) memcpy(dst + i * (int64_t)row_bytes, src + i * (int64_t)ld_bytes, row_bytes);
    }
}

/* Host rows [0, rows) of row_bytes each, stride ld_bytes -> packed device rows, through
 * the staging ring; the copies are ordered on ctx->copy_stream; returns after the last
 * piece is enqueued. */
xknn_status stage_bytes(xknn_cuda_context *ctx, char *dev, const char *host, int64_t rows, size_t row_bytes,
                        size_t ld_bytes, int threads, int *piece, Err er, size_t grain)
{
    xknn_status st = XKNN_SUCCESS;
    if (!grain) grain = stage_piece(ctx, threads);
    const int64_t per = max64(1, (int64_t)(grain / row_bytes));
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
        const int64_t nr = min64(per, rows - r0);
        const int b = (*piece)++ & 1;
        if (nr * (int64_t)row_bytes > (int64_t)kStagePiece) {
            /* a row longer than a piece: direct pageable copy */
            XKNN__CUDA_CHECK(cudaMemcpy2DAsync(dev + r0 * row_bytes, row_bytes, host + r0 * ld_bytes, ld_bytes,
                                               row_bytes, (size_t)nr, cudaMemcpyHostToDevice, ctx->copy_stream));
            continue;
        }
        XKNN__CUDA_CHECK(cudaEventSynchronize(ctx->stage_done[b]));
        pool_copy(ctx, ctx->stage[b], host + r0 * ld_bytes, nr, row_bytes, ld_bytes, threads);
        XKNN__CUDA_CHECK(cudaMemcpyAsync(dev + r0 * row_bytes, ctx->stage[b], (size_t)nr * row_bytes,
                                         cudaMemcpyHostToDevice, ctx->copy_stream));
        XKNN__CUDA_CHECK(cudaEventRecord(ctx->stage_done[b], ctx->copy_stream));
    }
cleanup:
    return st;
}

/* f32 rows of d elements (stride ld elements) */
xknn_status stage_rows(xknn_cuda_context *ctx, float *dev, const float *host, int64_t rows, int64_t d, int64_t ld,
                       int threads, int *piece, Err er)
{
    return stage_bytes(ctx, (char *)dev, (const char *)host, rows, (size_t)d * sizeof(float),
                       (size_t)ld * sizeof(float), threads, piece, er);
}

/* A kept block's memory (NULL is fine); its device memory is freed once the device is
 * done with it (cudaFree waits). */
void kept_free(xknn_cuda_kept *kp)
{
    if (!kp) return;
    if (kp->dev && kp->freed_on)
        (void)cudaFreeAsync(kp->dev, kp->freed_on);
    else if (kp->dev)
        cudaFree(kp->dev);
    free(kp->valid);
    free(kp);
}

/* Rows [host, host + rows) (row_bytes each, stride ld_bytes) on the device from a kept
 * copy (xknn_cuda_keep_rows) holding them, its chunks not uploaded yet staged first (the
 * copies ordered before later work on s); NULL where no kept copy holds them (or *st set
 * on a device error). The caller must not forget the copy during the call. */
const char *kept_rows(xknn_cuda_context *ctx, const void *host, int64_t rows, size_t row_bytes, size_t ld_bytes,
                      cudaStream_t s, int threads, int *piece, Err er, xknn_status *st)
{
    const char *h = (const char *)host;
    xknn_cuda_kept *kp = NULL;
    int64_t r0 = 0;
    int staged = 0;
    *st = XKNN_SUCCESS;
    if (!ctx || rows <= 0) return NULL;
    pthread_mutex_lock(&ctx->kept_lock);
    for (int i = 0; i < 8 && !kp; ++i) {
        xknn_cuda_kept *c = ctx->kept[i];
        if (!c || c->row_bytes != row_bytes || c->ld_bytes != ld_bytes || h < c->host) continue;
        const size_t off = (size_t)(h - c->host);
        if (off % ld_bytes || (int64_t)(off / ld_bytes) + rows > c->rows) continue;
        kp = c;
        r0 = (int64_t)(off / ld_bytes);
    }
    pthread_mutex_unlock(&ctx->kept_lock);
    if (!kp) return NULL;
    for (int64_t c = r0 / kp->chunk; c <= (r0 + rows - 1) / kp->chunk; ++c) {
        if (kp->valid[c]) continue;
        const int64_t c0 = c * kp->chunk, nr = min64(kp->chunk, kp->rows - c0);
        *st = stage_bytes(ctx, kp->dev + c0 * (int64_t)row_bytes, kp->host + c0 * (int64_t)ld_bytes, nr, row_bytes,
                          ld_bytes, threads, piece, er);
        if (*st != XKNN_SUCCESS) return NULL;
        kp->valid[c] = 1;
        staged = 1;
    }
    if (staged) {
        const cudaError_t e = cudaStreamWaitEvent(s, ctx->stage_done[(*piece - 1) & 1], 0);
        if (e != cudaSuccess) {
            *st = failf(er, XKNN_ERROR_DEVICE, "cuda backend: %s (kept rows)", cudaGetErrorString(e));
            return NULL;
        }
    }
    return kp->dev + r0 * (int64_t)row_bytes;
}

/* The context's pinned host buffer of at least `bytes` for a pair's results (grown,
 * never shrunk, freed with the context); NULL where pinned memory cannot be had (the
 * caller falls back to pageable memory). */
void *pair_out_buffer(xknn_cuda_context *ctx, size_t bytes)
{
    if (ctx->pair_out_bytes >= bytes) return ctx->pair_out;
    if (ctx->pair_out) cudaFreeHost(ctx->pair_out);
    ctx->pair_out = NULL;
    ctx->pair_out_bytes = 0;
    if (cudaHostAlloc(&ctx->pair_out, bytes, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        ctx->pair_out = NULL;
        return NULL;
    }
    ctx->pair_out_bytes = bytes;
    return ctx->pair_out;
}

/* ---- running lists on the device for a host call's parts (list mirrors) -------------
 * xknn_search_pair and the blocked self-join run many parts over the same rows. A mirror
 * holds a side's lists on the device for the whole call: the parts merge into it on the
 * device (launch_lists_merge, the host merge's rules), read their thresholds from it
 * (launch_lists_kth), and the lists cross to the host once, at the end. A part that runs
 * on the CPU takes its rows' lists to the host and back (cpu_pair). */

/* 1 (and the device lists of rows [ids, ids + rows * k)) where m holds them */
static bool mirror_holds(const ListMirror &m, const int64_t *ids, int64_t rows, int64_t k, int64_t **dids,
                         float **ddist)
{
    if (!m.ids || m.k != k || !ids || ids < m.host_ids || rows < 0) return false;
    const int64_t off = (int64_t)(ids - m.host_ids);
    if (off % k || off / k + rows > m.rows) return false;
    *dids = m.ids + off;
    *ddist = m.dist + off;
    return true;
}

/* The device lists of rows [ids, ids + rows * k) where a mirror of this call, or lists
 * the caller keeps (xknn_cuda_keep_lists), hold them. */
bool mirror_of(const xknn_cuda_context *ctx, const int64_t *ids, int64_t rows, int64_t k, int64_t **dids,
               float **ddist)
{
    bool found = false;
    for (int i = 0; i < 2 && !found; ++i) found = mirror_holds(ctx->mirror[i], ids, rows, k, dids, ddist);
    if (found) return true;
    pthread_mutex_t *lock = (pthread_mutex_t *)&ctx->kept_lock;
    pthread_mutex_lock(lock);
    for (int i = 0; i < 4 && !found; ++i) found = mirror_holds(ctx->lists[i], ids, rows, k, dids, ddist);
    pthread_mutex_unlock(lock);
    return found;
}

/* Mirrors side s's lists in slot i: uploaded from the host (or, pad = 1, padding made on
 * the device), where they take at most an eighth of *budget (which then loses them) and
 * XKNN_CUDA_DEVICE_LISTS is not 0 (a diagnostic: the host merges, the same bytes).
 * Nothing where the allocation fails: the parts then merge on the host. */
xknn_status mirror_begin(xknn_cuda_context *ctx, int i, const xknn__sym_side *s, int64_t k, int pad, int ip,
                         size_t *budget, int threads, Err er)
{
    xknn_status st = XKNN_SUCCESS;
    const char *env = xknn__knob(XKNN__KNOB_CUDA_DEVICE_LISTS);
    const size_t cnt = (size_t)(s->rows * k), bytes = cnt * (sizeof(int64_t) + sizeof(float));
    ListMirror m = {s->ids, s->dist, s->rows, k, NULL, NULL};
    int piece = 0;
    if ((env && *env == '0') || s->rows <= 0 || !s->ids || !s->dist || bytes > *budget / 8) return st;
    if (!pad) {
        /* lists that are padding only (each row's first id -1, its last distance the
         * padding's, no bound) are made on the device rather than uploaded (the scan
         * reads two cache lines a row) */
        const float pv = ip ? -INFINITY : INFINITY;
        int64_t other = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) reduction(+ : other) num_threads(xknn__step_threads(threads, s->rows * 128))
#endif
        for (int64_t r = 0; r < s->rows; ++r) other += !(s->ids[r * k] < 0 && s->dist[r * k + k - 1] == pv);
        pad = other == 0;
    }
    if (cudaMalloc((void **)&m.ids, cnt * sizeof(int64_t)) != cudaSuccess ||
        cudaMalloc((void **)&m.dist, cnt * sizeof(float)) != cudaSuccess) {
        (void)cudaGetLastError(); /* (the host merges) */
        goto cleanup;
    }
    if (pad) {
        XKNN__CUDA_CHECK(launch_lists_pad(m.ids, m.dist, (int64_t)cnt, ip, ctx->sms, ctx->stream));
    } else {
        XKNN__TRY(stage_bytes(ctx, (char *)m.ids, (const char *)s->ids, s->rows, (size_t)k * sizeof(int64_t),
                              (size_t)k * sizeof(int64_t), threads, &piece, er, kStagePiece));
        XKNN__TRY(stage_bytes(ctx, (char *)m.dist, (const char *)s->dist, s->rows, (size_t)k * sizeof(float),
                              (size_t)k * sizeof(float), threads, &piece, er, kStagePiece));
        XKNN__CUDA_CHECK(cudaStreamWaitEvent(ctx->stream, ctx->stage_done[(piece - 1) & 1], 0));
    }
    ctx->mirror[i] = m;
    *budget -= bytes;
    m.ids = NULL;
    m.dist = NULL;
cleanup:
    if (m.ids || m.dist) (void)sync_stream(ctx, ctx->stream);
    if (m.ids) cudaFree(m.ids);
    if (m.dist) cudaFree(m.dist);
    return st;
}

/* Ends the mirror of slot i (if any): its lists to the host (download) and freed. */
xknn_status mirror_end(xknn_cuda_context *ctx, int i, int download, int threads, Err er)
{
    xknn_status st = XKNN_SUCCESS;
    const ListMirror m = ctx->mirror[i];
    int piece = 0;
    if (!m.ids) return st;
    memset(&ctx->mirror[i], 0, sizeof ctx->mirror[i]);
    if (download)
        st = results_out(ctx, 1, m.host_ids, m.ids, m.host_dist, m.dist, (size_t)(m.rows * m.k), threads, ctx->stream,
                         &piece, er, kStagePiece);
    (void)sync_stream(ctx, ctx->stream);
    cudaFree(m.ids);
    cudaFree(m.dist);
    return st;
}

/* Results out: ids (and dist when dist_host is not NULL) from the device to the host
 * once the work enqueued on s before the call is done; returns when the host has every
 * byte. staged (a caller's context, stage_make done): pieces move by DMA into the
 * pinned ring and the host copies them out in parallel while the next piece is in
 * flight; otherwise plain copies into pageable memory (the driver stages them). */
xknn_status results_out(xknn_cuda_context *ctx, int staged, int64_t *ids_host, const int64_t *ids_dev,
                        float *dist_host, const float *dist_dev, size_t count, int threads, cudaStream_t s,
                        int *piece, Err er, size_t grain)
{
    xknn_status st = XKNN_SUCCESS;
    char *const dst[2] = {(char *)ids_host, (char *)dist_host};
    const char *const src[2] = {(const char *)ids_dev, (const char *)dist_dev};
    const size_t bytes[2] = {count * sizeof(int64_t), count * sizeof(float)};
    char *pend_dst = NULL; /* the piece in flight, copied out after the next is enqueued */
    size_t pend_len = 0;
    int pend_b = 0;
    for (int i = 0; i < 2; ++i) {
        if (!dst[i] || !bytes[i]) continue;
        if (!staged) {
            XKNN__CUDA_CHECK(cudaMemcpyAsync(dst[i], src[i], bytes[i], cudaMemcpyDeviceToHost, s));
            continue;
        }
        if (!grain) grain = stage_piece(ctx, threads);
        for (size_t o = 0; o < bytes[i]; o += grain) {
            const size_t len = bytes[i] - o < grain ? bytes[i] - o : grain;
            const int b = (*piece)++ & 1;
            XKNN__CUDA_CHECK(cudaEventSynchronize(ctx->stage_done[b]));
            XKNN__CUDA_CHECK(cudaMemcpyAsync(ctx->stage[b], src[i] + o, len, cudaMemcpyDeviceToHost, s));
            XKNN__CUDA_CHECK(cudaEventRecord(ctx->stage_done[b], s));
            if (pend_dst) {
                XKNN__CUDA_CHECK(cudaEventSynchronize(ctx->stage_done[pend_b]));
                pool_copy(ctx, pend_dst, ctx->stage[pend_b], 1, pend_len, pend_len, threads);
            }
            pend_dst = dst[i] + o;
            pend_len = len;
            pend_b = b;
        }
    }
    if (pend_dst) {
        XKNN__CUDA_CHECK(cudaEventSynchronize(ctx->stage_done[pend_b]));
        pool_copy(ctx, pend_dst, ctx->stage[pend_b], 1, pend_len, pend_len, threads);
    }
    XKNN__CUDA_CHECK(sync_stream(ctx, s));
cleanup:
    return st;
}

} // namespace xknn_cuda
