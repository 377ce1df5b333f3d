/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/resident.cu -- reference rows kept resident on a GPU for many searches
 * (xknn__cuda_resident_*, include/xknn/impl/cuda_internal.h): the distributed layer's
 * rank slice (mpi/resident.c). The slice is uploaded once; each block of queries then
 * costs one small query copy, xknn_cuda_search (device pointers, the handle's stream and
 * workspace) and the copy of its k candidates back to host memory. Results are those of
 * xknn_search (same engine, same contract). Applies to f32 l2/euclidean on backend cuda
 * (or auto with a device) where the slice plus a workspace fit the device memory budget.
 */
#include <time.h>

#include "engine.cuh"

using namespace xknn_cuda;

struct xknn__cuda_resident {
    xknn_cuda_context *ctx, *own_ctx;
    int device;
    float *dR, *dQ, *dDist;
    int64_t *dIds;
    void *hOut;           /* pinned: a block's ids then distances on their way back, so
                           * the copy is asynchronous (into pageable memory the driver
                           * returns only once the kernel and the copy are done) */
    void *ws;
    size_t ws_bytes;
    cudaStream_t stream;
    cudaEvent_t done;     /* blocking-sync: a waiting thread sleeps                      */
    int64_t n, d, qb, k;  /* the buffers' capacity in queries; the current search's k  */
    int64_t pend;         /* rows of the search _start left in flight (0: none)        */
    int64_t cap_k;        /* the buffers' capacity in results a query                   */
    size_t budget;        /* the caller's device memory budget (0: none)                */
};

namespace {

/* Threads for a host copy of bytes: at most xknn_thread_budget() (and params'
 * num_threads where set); one under 8 MiB, where starting threads costs more than the
 * copy. */
int copy_threads(const xknn_params *params, size_t bytes)
{
    int t = xknn_thread_budget();
    if (params->num_threads > 0 && params->num_threads < t) t = params->num_threads;
    if (bytes < ((size_t)8 << 20) || t < 1) t = 1;
    return t;
}

/* Copies the slice to r->dR: from device memory directly; from host memory through two
 * pinned staging buffers, threads filling one while the copy engine drains the other (a pageable cudaMemcpy goes through the driver's
 * single-threaded staging, several times slower for a slice of tens of GB). */
cudaError_t resident_upload(xknn__cuda_resident *r, const xknn_params *params, const xknn_matrix *ref, int64_t ld)
{
    const size_t row = (size_t)r->d * sizeof(float), stage = (size_t)64 << 20;
    const int64_t per = (int64_t)(stage / row) > 0 ? (int64_t)(stage / row) : 1;
    const float *src = (const float *)ref->data;
    float *pin[2] = {NULL, NULL};
    cudaEvent_t done[2] = {NULL, NULL};
    cudaError_t ce = cudaSuccess;
    int64_t r0, c = 0;
    int b;
    if (xknn__cuda_pointer_device(src) >= 0) { /* device rows: one copy on the device */
        ce = cudaMemcpy2DAsync(r->dR, row, src, (size_t)ld * sizeof(float), row, (size_t)r->n, cudaMemcpyDefault,
                               r->stream);
        return ce == cudaSuccess ? sync_stream(r->ctx, r->stream) : ce;
    }
    for (b = 0; b < 2 && ce == cudaSuccess; b++) {
        ce = cudaHostAlloc((void **)&pin[b], (size_t)per * row, cudaHostAllocDefault);
        if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&done[b], kHostWaitEvent);
    }
    for (r0 = 0; r0 < r->n && ce == cudaSuccess; r0 += per, c++) {
        const int64_t rows = r->n - r0 < per ? r->n - r0 : per;
        const int threads = copy_threads(params, (size_t)rows * row);
        float *dst;
        int64_t i;
        b = (int)(c & 1);
        ce = cudaEventSynchronize(done[b]); /* the copy out of pin[b] is complete */
        if (ce != cudaSuccess) break;
        dst = pin[b];
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
        for (i = 0; i < rows; i++) memcpy(dst + i * r->d, src + (r0 + i) * ld, row);
        (void)threads;
        ce = cudaMemcpyAsync(r->dR + r0 * r->d, pin[b], (size_t)rows * row, cudaMemcpyHostToDevice, r->stream);
        if (ce == cudaSuccess) ce = cudaEventRecord(done[b], r->stream);
    }
    if (ce == cudaSuccess) ce = sync_stream(r->ctx, r->stream);
    for (b = 1; b >= 0; b--) {
        if (done[b]) cudaEventDestroy(done[b]);
        if (pin[b]) cudaFreeHost(pin[b]);
    }
    return ce;
}

/* On the device (current): buffers for blocks of qb queries and k results, and the
 * workspace, which takes what is left of the budget; without a budget at most 8 GiB of
 * what is free, so ranks sharing a GPU each find room for their own slice. Grows only;
 * 0 on success, else -1 with the reason. */
int resident_buffers(xknn__cuda_resident *r, const xknn_params *params, int64_t qb, int64_t k, char *why,
                     size_t why_size)
{
    const size_t row = (size_t)r->d * sizeof(float);
    xknn_params p = *params;
    size_t free_b = 0, total_b = 0;
    cudaError_t ce = cudaSuccess;
    xknn_error e;
    const int64_t want_k = k; /* this search's k; the buffers keep the largest seen */
    if (qb <= r->qb && k <= r->cap_k) {
        r->k = k;
        return 0;
    }
    if (qb < r->qb) qb = r->qb;
    if (k < r->cap_k) k = r->cap_k;
    ce = sync_stream(r->ctx, r->stream);
    if (r->ws) cudaFree(r->ws);
    if (r->dDist) cudaFree(r->dDist);
    if (r->dIds) cudaFree(r->dIds);
    if (r->dQ) cudaFree(r->dQ);
    if (r->hOut) cudaFreeHost(r->hOut);
    r->ws = NULL, r->dDist = NULL, r->dIds = NULL, r->dQ = NULL, r->hOut = NULL;
    r->qb = r->k = r->cap_k = 0;
    if (ce == cudaSuccess) ce = cudaMalloc((void **)&r->dQ, (size_t)qb * row);
    if (ce == cudaSuccess) ce = cudaMalloc((void **)&r->dIds, (size_t)(qb * k) * sizeof(int64_t));
    if (ce == cudaSuccess) ce = cudaMalloc((void **)&r->dDist, (size_t)(qb * k) * sizeof(float));
    if (ce == cudaSuccess)
        ce = cudaHostAlloc(&r->hOut, (size_t)(qb * k) * (sizeof(int64_t) + sizeof(float)), cudaHostAllocDefault);
    if (ce == cudaSuccess && r->budget) {
        const size_t used = (size_t)r->n * row + (size_t)qb * (row + (size_t)k * (sizeof(int64_t) + sizeof(float)));
        p.device_memory_budget = r->budget > used ? r->budget - used : 1;
    } else if (ce == cudaSuccess && (ce = cudaMemGetInfo(&free_b, &total_b)) == cudaSuccess) {
        p.device_memory_budget = free_b / 10 * 9;
        if (p.device_memory_budget > ((size_t)8 << 30)) p.device_memory_budget = (size_t)8 << 30;
    }
    if (ce != cudaSuccess) {
        snprintf(why, why_size, "device setup: %s", cudaGetErrorString(ce));
        return -1;
    }
    if (xknn_cuda_workspace_size(r->ctx, &p, r->n, qb, r->d, k, &r->ws_bytes, &e) != XKNN_SUCCESS) {
        snprintf(why, why_size, "%s", e.message);
        return -1;
    }
    ce = cudaMalloc(&r->ws, r->ws_bytes);
    if (ce == cudaSuccess) ce = sync_stream(r->ctx, r->stream);
    if (ce != cudaSuccess) {
        snprintf(why, why_size, "device setup: %s", cudaGetErrorString(ce));
        return -1;
    }
    r->qb = qb;
    r->cap_k = k;
    r->k = want_k;
    return 0;
}

/* Waits for the work enqueued on r->stream: the thread sleeps in cudaEventSynchronize
 * (r->done is a blocking-sync event). With poll, the caller's non-blocking MPI (the next
 * query block's broadcast) progresses meanwhile, MPI progressing only inside MPI calls:
 * poll, then a short sleep, until the device is done. */
cudaError_t resident_wait(xknn__cuda_resident *r, void (*poll)(void *), void *poll_arg)
{
    cudaError_t ce = cudaEventRecord(r->done, r->stream);
    if (ce == cudaSuccess && poll) {
        const struct timespec nap = {0, 50 * 1000}; /* 50 us */
        while ((ce = cudaEventQuery(r->done)) == cudaErrorNotReady) {
            poll(poll_arg);
            nanosleep(&nap, NULL);
        }
    }
    if (ce == cudaSuccess) ce = cudaEventSynchronize(r->done);
    return ce;
}

} // namespace

extern "C" {

int xknn__cuda_pointer_device(const void *p)
{
    cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

xknn_status xknn__cuda_copy_rows(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, int64_t rows,
                                 xknn_error *err)
{
    const cudaError_t ce = rows > 0 ? cudaMemcpy2D(dst, dpitch, src, spitch, width, (size_t)rows, cudaMemcpyDefault)
                                    : cudaSuccess;
    if (ce == cudaSuccess) return XKNN_SUCCESS;
    (void)cudaGetLastError();
    return finish_err(err, failf(err_of(err), XKNN_ERROR_DEVICE, "cuda backend (copy of device rows): %s",
                                 cudaGetErrorString(ce)));
}

const float *xknn__cuda_resident_rows(const xknn__cuda_resident *r)
{
    return r->dR;
}

void xknn__cuda_resident_close(xknn__cuda_resident *r)
{
    DeviceScope sc;
    if (!r) return;
    if (sc.enter(r->device) == cudaSuccess) {
        if (r->stream) (void)sync_stream(r->ctx, r->stream);
        if (r->ws) cudaFree(r->ws);
        if (r->dDist) cudaFree(r->dDist);
        if (r->dIds) cudaFree(r->dIds);
        if (r->dQ) cudaFree(r->dQ);
        if (r->hOut) cudaFreeHost(r->hOut);
        if (r->dR) cudaFree(r->dR);
        if (r->done) cudaEventDestroy(r->done);
        if (r->stream) cudaStreamDestroy(r->stream);
    }
    (void)cudaGetLastError();
    xknn_cuda_context_destroy(r->own_ctx);
    free(r);
}

int xknn__cuda_resident_reserve(xknn__cuda_resident *r, const xknn_params *params, int64_t qb, int64_t k, char *why,
                                size_t why_size)
{
    DeviceScope sc;
    if (sc.enter(r->device) != cudaSuccess) {
        snprintf(why, why_size, "cannot select device %d", r->device);
        return -1;
    }
    return resident_buffers(r, params, qb, k, why, why_size);
}

xknn_status xknn__cuda_resident_update(xknn__cuda_resident *r, int64_t row0, const xknn_matrix *rows, xknn_error *err)
{
    const int64_t ld = rows->ld ? rows->ld : rows->cols;
    const size_t row = (size_t)r->d * sizeof(float);
    cudaError_t ce;
    {
        DeviceScope sc;
        ce = sc.enter(r->device);
        if (ce == cudaSuccess)
            ce = cudaMemcpy2DAsync(r->dR + row0 * r->d, row, rows->data, (size_t)ld * sizeof(float), row,
                                   (size_t)rows->rows, cudaMemcpyDefault, r->stream);
        if (ce == cudaSuccess) ce = resident_wait(r, NULL, NULL);
    }
    if (ce != cudaSuccess)
        return finish_err(err, failf(err_of(err), XKNN_ERROR_DEVICE, "cuda backend (device slice update): %s",
                                     cudaGetErrorString(ce)));
    return XKNN_SUCCESS;
}

xknn__cuda_resident *xknn__cuda_resident_open(const xknn_params *params, int device, const xknn_matrix *ref,
                                              int64_t qb, int64_t k, char *why, size_t why_size)
{
    const int64_t n = ref->rows, d = ref->cols, ld = ref->ld ? ref->ld : ref->cols;
    const size_t row = (size_t)d * sizeof(float);
    size_t used, free_b = 0, total_b = 0;
    xknn__cuda_resident *r;
    xknn_error e;
    xknn_params p = *params;
    cudaError_t ce;

    why[0] = '\0';
    if (p.backend == XKNN_BACKEND_CPU || device < 0) {
        snprintf(why, why_size, "%s", p.backend == XKNN_BACKEND_CPU ? "backend cpu" : "no CUDA device");
        return NULL;
    }
    if (p.metric != XKNN_METRIC_L2 && p.metric != XKNN_METRIC_EUCLIDEAN) {
        snprintf(why, why_size, "metric %s is not on the device path", xknn_metric_name(p.metric));
        return NULL;
    }
    if (ref->dtype != XKNN_DTYPE_F32 || n < 1 || n > 2147483647LL) {
        snprintf(why, why_size, "slice of %lld rows is outside the device path's range", (long long)n);
        return NULL;
    }
    r = (xknn__cuda_resident *)calloc(1, sizeof *r);
    if (!r) {
        snprintf(why, why_size, "out of host memory");
        return NULL;
    }
    r->device = device;
    r->n = n;
    r->d = d;
    r->qb = qb;
    r->k = k;
    if (p.cuda_context) {
        r->ctx = (xknn_cuda_context *)p.cuda_context;
        r->device = xknn_cuda_context_device(r->ctx);
    } else {
        if (xknn_cuda_context_create(device, &r->own_ctx, &e) != XKNN_SUCCESS) {
            snprintf(why, why_size, "%s", e.message);
            free(r);
            return NULL;
        }
        r->ctx = r->own_ctx;
    }
    {
        DeviceScope sc;
        ce = sc.enter(r->device);
        if (ce == cudaSuccess) ce = cudaMemGetInfo(&free_b, &total_b);
        used = (size_t)n * row + (size_t)qb * (row + (size_t)k * (sizeof(int64_t) + sizeof(float)));
        if (ce == cudaSuccess && p.device_memory_budget && used >= p.device_memory_budget) {
            snprintf(why, why_size, "slice and buffers (%zu bytes) exceed the device memory budget (%zu bytes)", used,
                     p.device_memory_budget);
            goto fail;
        }
        if (ce == cudaSuccess && used >= free_b) {
            snprintf(why, why_size, "slice and buffers (%zu bytes) exceed the free device memory (%zu bytes)", used,
                     free_b);
            goto fail;
        }
        r->budget = p.device_memory_budget;
        if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking);
        if (ce == cudaSuccess)
            ce = cudaEventCreateWithFlags(&r->done, cudaEventBlockingSync | cudaEventDisableTiming);
        if (ce == cudaSuccess) ce = cudaMalloc((void **)&r->dR, (size_t)n * row);
        if (ce == cudaSuccess) ce = resident_upload(r, &p, ref, ld);
        if (ce != cudaSuccess) {
            snprintf(why, why_size, "device setup: %s", cudaGetErrorString(ce));
            goto fail;
        }
        r->qb = r->k = r->cap_k = 0;
        if (resident_buffers(r, &p, qb, k, why, why_size) != 0) goto fail;
        return r;
    fail:;
    }
    xknn__cuda_resident_close(r);
    return NULL;
}

xknn_status xknn__cuda_resident_start(xknn__cuda_resident *r, const xknn_params *params, const float *q,
                                      int64_t rows, xknn_error *err)
{
    const size_t row = (size_t)r->d * sizeof(float);
    xknn_matrix refm = XKNN_MATRIX_F32(r->dR, r->n, r->d), qm = XKNN_MATRIX_F32(r->dQ, rows, r->d);
    xknn_status st = XKNN_SUCCESS;
    cudaError_t ce;

    r->pend = 0;
    if (rows > r->qb)
        return finish_err(err, failf(err_of(err), XKNN_ERROR_INTERNAL, "device slice: block of %lld rows exceeds %lld",
                                     (long long)rows, (long long)r->qb));
    {
        DeviceScope sc;
        ce = sc.enter(r->device);
        /* (from pageable q: returns once q is staged, so the caller may reuse it) */
        if (ce == cudaSuccess) ce = cudaMemcpyAsync(r->dQ, q, (size_t)rows * row, cudaMemcpyHostToDevice, r->stream);
        if (ce == cudaSuccess) {
            const size_t ib = (size_t)(rows * r->k) * sizeof(int64_t), fb = (size_t)(rows * r->k) * sizeof(float);
            char *h = (char *)r->hOut;
            st = xknn_cuda_search(r->ctx, params, &refm, &qm, r->k, r->dIds, r->dDist, r->ws, r->ws_bytes, err,
                                  r->stream);
            if (st == XKNN_SUCCESS) ce = cudaMemcpyAsync(h, r->dIds, ib, cudaMemcpyDeviceToHost, r->stream);
            if (st == XKNN_SUCCESS && ce == cudaSuccess)
                ce = cudaMemcpyAsync(h + ib, r->dDist, fb, cudaMemcpyDeviceToHost, r->stream);
        }
        if (st != XKNN_SUCCESS || ce != cudaSuccess) (void)sync_stream(r->ctx, r->stream); /* none left in flight */
    }
    if (st == XKNN_SUCCESS && ce != cudaSuccess)
        st = finish_err(err, failf(err_of(err), XKNN_ERROR_DEVICE, "cuda backend (device slice): %s",
                                   cudaGetErrorString(ce)));
    if (st == XKNN_SUCCESS) r->pend = rows;
    return st;
}

xknn_status xknn__cuda_resident_finish(xknn__cuda_resident *r, int64_t *ids, float *dist, void (*poll)(void *),
                                       void *poll_arg, xknn_error *err)
{
    const int64_t rows = r->pend;
    cudaError_t ce;
    r->pend = 0;
    {
        DeviceScope sc;
        ce = sc.enter(r->device);
        if (ce == cudaSuccess) ce = resident_wait(r, poll, poll_arg);
    }
    if (ce != cudaSuccess)
        return finish_err(err, failf(err_of(err), XKNN_ERROR_DEVICE, "cuda backend (device slice): %s",
                                     cudaGetErrorString(ce)));
    const size_t ib = (size_t)(rows * r->k) * sizeof(int64_t);
    if (ids) memcpy(ids, r->hOut, ib);
    if (dist) memcpy(dist, (const char *)r->hOut + ib, (size_t)(rows * r->k) * sizeof(float));
    return XKNN_SUCCESS;
}

} // extern "C"
