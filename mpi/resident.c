/* SPDX-License-Identifier: MIT */
/*
 * mpi/resident.c -- a rank's reference slice kept in GPU memory for a whole distributed
 * search. Without it every query block went through xknn_search on host arrays, which
 * copies the whole slice to the device again for each block (the slice is the large
 * operand: 10M x 128 floats are 5 GB). Here the slice is uploaded once; each block then
 * costs one small query copy, xknn_cuda_search (device pointers, our stream, our
 * workspace) and the copy of its k candidates back to host memory, where the tree
 * reduction takes them. Results are those of xknn_search (same engine, same contract).
 *
 * Used when the backend resolves to CUDA (cuda, or auto with a device), the metric is
 * l2/euclidean on float32 and the slice plus a workspace fit the device memory budget;
 * otherwise xknn__resident_open returns NULL with the reason, and the caller keeps the
 * per-block host path (which streams references that do not fit).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "impl.h"

#ifdef XKNN_MPI_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "xknn/cuda.h"

struct xknn__resident {
    xknn_cuda_context *ctx, *own_ctx;
    int device;
    float *dR, *dQ, *dDist;
    int64_t *dIds;
    void *ws;
    size_t ws_bytes;
    cudaStream_t stream;
    int64_t n, d, qb, k;  /* the buffers' capacity in queries; the current search's k  */
    int64_t cap_k;        /* the buffers' capacity in results a query                   */
    size_t budget;        /* the caller's device memory budget (0: none)                */
};

/* Runs on `device`, restoring the caller's current device afterwards. */
typedef struct {
    int prev, ok;
} xknn__dev_scope;

static cudaError_t xknn__dev_enter(xknn__dev_scope *s, int device)
{
    cudaError_t e = cudaGetDevice(&s->prev);
    s->ok = e == cudaSuccess;
    if (e != cudaSuccess) return e;
    return cudaSetDevice(device);
}

static void xknn__dev_leave(const xknn__dev_scope *s)
{
    if (s->ok) (void)cudaSetDevice(s->prev);
}

void xknn__resident_close(xknn__resident *r)
{
    xknn__dev_scope sc;
    if (!r) return;
    if (xknn__dev_enter(&sc, r->device) == cudaSuccess) {
        if (r->stream) (void)cudaStreamSynchronize(r->stream);
        if (r->ws) cudaFree(r->ws);
        if (r->dDist) cudaFree(r->dDist);
        if (r->dIds) cudaFree(r->dIds);
        if (r->dQ) cudaFree(r->dQ);
        if (r->dR) cudaFree(r->dR);
        if (r->stream) cudaStreamDestroy(r->stream);
    }
    xknn__dev_leave(&sc);
    (void)cudaGetLastError();
    xknn_cuda_context_destroy(r->own_ctx);
    free(r);
}

/* Copies the slice to r->dR through two pinned staging buffers: OpenMP threads fill one
 * while the copy engine drains the other (a pageable cudaMemcpy goes through the
 * driver's single-threaded staging, several times slower for a slice of tens of GB). */
static cudaError_t xknn__upload(xknn__resident *r, const xknn_matrix *ref, int64_t ld)
{
    const size_t row = (size_t)r->d * sizeof(float), stage = (size_t)64 << 20;
    const int64_t per = (int64_t)(stage / row) > 0 ? (int64_t)(stage / row) : 1;
    const float *src = (const float *)ref->data;
    float *pin[2] = {NULL, NULL};
    cudaEvent_t done[2] = {NULL, NULL};
    cudaError_t ce = cudaSuccess;
    int64_t r0, c = 0;
    int b;
    for (b = 0; b < 2 && ce == cudaSuccess; b++) {
        ce = cudaHostAlloc((void **)&pin[b], (size_t)per * row, cudaHostAllocDefault);
        if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&done[b], cudaEventDisableTiming);
    }
    for (r0 = 0; r0 < r->n && ce == cudaSuccess; r0 += per, c++) {
        const int64_t rows = r->n - r0 < per ? r->n - r0 : per;
        float *dst;
        int64_t i;
        b = (int)(c & 1);
        ce = cudaEventSynchronize(done[b]); /* the copy out of pin[b] is complete */
        if (ce != cudaSuccess) break;
        dst = pin[b];
#pragma omp parallel for schedule(static)
        for (i = 0; i < rows; i++) memcpy(dst + i * r->d, src + (r0 + i) * ld, row);
        ce = cudaMemcpyAsync(r->dR + r0 * r->d, pin[b], (size_t)rows * row, cudaMemcpyHostToDevice, r->stream);
        if (ce == cudaSuccess) ce = cudaEventRecord(done[b], r->stream);
    }
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(r->stream);
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
static int xknn__resident_buffers(xknn__resident *r, const xknn_params *params, int64_t qb, int64_t k, char *why,
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
    ce = cudaStreamSynchronize(r->stream);
    if (r->ws) cudaFree(r->ws);
    if (r->dDist) cudaFree(r->dDist);
    if (r->dIds) cudaFree(r->dIds);
    if (r->dQ) cudaFree(r->dQ);
    r->ws = NULL, r->dDist = NULL, r->dIds = NULL, r->dQ = NULL;
    r->qb = r->k = r->cap_k = 0;
    if (ce == cudaSuccess) ce = cudaMalloc((void **)&r->dQ, (size_t)qb * row);
    if (ce == cudaSuccess) ce = cudaMalloc((void **)&r->dIds, (size_t)(qb * k) * sizeof(int64_t));
    if (ce == cudaSuccess) ce = cudaMalloc((void **)&r->dDist, (size_t)(qb * k) * sizeof(float));
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
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(r->stream);
    if (ce != cudaSuccess) {
        snprintf(why, why_size, "device setup: %s", cudaGetErrorString(ce));
        return -1;
    }
    r->qb = qb;
    r->cap_k = k;
    r->k = want_k;
    return 0;
}

int xknn__resident_reserve(xknn__resident *r, const xknn_params *params, int64_t qb, int64_t k, char *why,
                           size_t why_size)
{
    xknn__dev_scope sc;
    int rc;
    if (xknn__dev_enter(&sc, r->device) != cudaSuccess) {
        snprintf(why, why_size, "cannot select device %d", r->device);
        return -1;
    }
    rc = xknn__resident_buffers(r, params, qb, k, why, why_size);
    xknn__dev_leave(&sc);
    return rc;
}

xknn_status xknn__resident_update(xknn__resident *r, int64_t row0, const xknn_matrix *rows, xknn_error *err)
{
    const int64_t ld = rows->ld ? rows->ld : rows->cols;
    const size_t row = (size_t)r->d * sizeof(float);
    xknn__dev_scope sc;
    cudaError_t ce = xknn__dev_enter(&sc, r->device);
    if (ce == cudaSuccess)
        ce = cudaMemcpy2DAsync(r->dR + row0 * r->d, row, rows->data, (size_t)ld * sizeof(float), row,
                               (size_t)rows->rows, cudaMemcpyHostToDevice, r->stream);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(r->stream);
    xknn__dev_leave(&sc);
    if (ce != cudaSuccess)
        return xknn__mpi_fail(err, XKNN_ERROR_DEVICE, "cuda backend (device slice update): %s", cudaGetErrorString(ce));
    return XKNN_SUCCESS;
}

xknn__resident *xknn__resident_open(const xknn_params *params, int device, const xknn_matrix *ref, int64_t qb,
                                    int64_t k, char *why, size_t why_size)
{
    const int64_t n = ref->rows, d = ref->cols, ld = ref->ld ? ref->ld : ref->cols;
    const size_t row = (size_t)d * sizeof(float);
    size_t used, free_b = 0, total_b = 0;
    xknn__resident *r;
    xknn__dev_scope sc;
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
    r = (xknn__resident *)calloc(1, sizeof *r);
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
    ce = xknn__dev_enter(&sc, r->device);
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
    if (ce == cudaSuccess) ce = cudaMalloc((void **)&r->dR, (size_t)n * row);
    if (ce == cudaSuccess) ce = xknn__upload(r, ref, ld);
    if (ce != cudaSuccess) {
        snprintf(why, why_size, "device setup: %s", cudaGetErrorString(ce));
        goto fail;
    }
    r->qb = r->k = r->cap_k = 0;
    if (xknn__resident_buffers(r, &p, qb, k, why, why_size) != 0) goto fail;
    xknn__dev_leave(&sc);
    return r;
fail:
    xknn__dev_leave(&sc);
    xknn__resident_close(r);
    return NULL;
}

xknn_status xknn__resident_search(xknn__resident *r, const xknn_params *params, const float *q, int64_t rows,
                                  int64_t *ids, float *dist, void (*poll)(void *), void *poll_arg, xknn_error *err)
{
    const size_t row = (size_t)r->d * sizeof(float);
    xknn_matrix refm = XKNN_MATRIX_F32(r->dR, r->n, r->d), qm = XKNN_MATRIX_F32(r->dQ, rows, r->d);
    xknn__dev_scope sc;
    xknn_status st = XKNN_SUCCESS;
    cudaError_t ce;

    if (rows > r->qb)
        return xknn__mpi_fail(err, XKNN_ERROR_INTERNAL, "device slice: block of %lld rows exceeds %lld",
                              (long long)rows, (long long)r->qb);
    ce = xknn__dev_enter(&sc, r->device);
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(r->dQ, q, (size_t)rows * row, cudaMemcpyHostToDevice, r->stream);
    if (ce == cudaSuccess) {
        st = xknn_cuda_search(r->ctx, params, &refm, &qm, r->k, r->dIds, dist ? r->dDist : NULL, r->ws,
                              r->ws_bytes, err, r->stream);
        if (st == XKNN_SUCCESS) {
            ce = cudaMemcpyAsync(ids, r->dIds, (size_t)(rows * r->k) * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                 r->stream);
            if (ce == cudaSuccess && dist)
                ce = cudaMemcpyAsync(dist, r->dDist, (size_t)(rows * r->k) * sizeof(float), cudaMemcpyDeviceToHost,
                                     r->stream);
        }
        if (ce == cudaSuccess && poll) {
            /* let the caller's non-blocking MPI (the next query block's broadcast)
             * progress while the GPU works: MPI progresses only inside MPI calls */
            while ((ce = cudaStreamQuery(r->stream)) == cudaErrorNotReady) poll(poll_arg);
        }
        if (ce == cudaSuccess) ce = cudaStreamSynchronize(r->stream);
    }
    xknn__dev_leave(&sc);
    if (st == XKNN_SUCCESS && ce != cudaSuccess)
        st = xknn__mpi_fail(err, XKNN_ERROR_DEVICE, "cuda backend (device slice): %s", cudaGetErrorString(ce));
    return st;
}

#else /* !XKNN_MPI_HAVE_CUDA */

xknn__resident *xknn__resident_open(const xknn_params *params, int device, const xknn_matrix *ref, int64_t qb,
                                    int64_t k, char *why, size_t why_size)
{
    (void)params;
    (void)device;
    (void)ref;
    (void)qb;
    (void)k;
    snprintf(why, why_size, "xknn_mpi built without CUDA");
    return NULL;
}

xknn_status xknn__resident_search(xknn__resident *r, const xknn_params *params, const float *q, int64_t rows,
                                  int64_t *ids, float *dist, void (*poll)(void *), void *poll_arg, xknn_error *err)
{
    (void)poll;
    (void)poll_arg;
    (void)r;
    (void)params;
    (void)q;
    (void)rows;
    (void)ids;
    (void)dist;
    return xknn__mpi_fail(err, XKNN_ERROR_NOT_BUILT, "xknn_mpi built without CUDA");
}

void xknn__resident_close(xknn__resident *r) { (void)r; }

int xknn__resident_reserve(xknn__resident *r, const xknn_params *params, int64_t qb, int64_t k, char *why,
                           size_t why_size)
{
    (void)r;
    (void)params;
    (void)qb;
    (void)k;
    snprintf(why, why_size, "xknn_mpi built without CUDA");
    return -1;
}

xknn_status xknn__resident_update(xknn__resident *r, int64_t row0, const xknn_matrix *rows, xknn_error *err)
{
    (void)r;
    (void)row0;
    (void)rows;
    return xknn__mpi_fail(err, XKNN_ERROR_NOT_BUILT, "xknn_mpi built without CUDA");
}

#endif
