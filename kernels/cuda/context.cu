/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/context.cu -- the CUDA context (xknn_cuda_context_create / destroy): the
 * device's properties, its streams and memory pool, and what it owns until destroyed
 * (kept rows and lists, the staging ring, the copier). Also the device memory budget of
 * a host call, the outcome of its allocations, and the start of every host call.
 */
#include "engine.cuh"

namespace xknn_cuda {

/* Returns once the work enqueued on s is done, the thread asleep meanwhile (a blocking-
 * sync event, not cudaStreamSynchronize, which spins unless the device was made with
 * cudaDeviceScheduleBlockingSync). The context's event serves one waiter at a time;
 * another thread (or no context) records an event of its own. Errors as
 * cudaStreamSynchronize's: the record's, or those of the work waited for. */
cudaError_t sync_stream(xknn_cuda_context *ctx, cudaStream_t s)
{
    cudaEvent_t ev = NULL;
    const bool mine = ctx && ctx->sync_ev && pthread_mutex_trylock(&ctx->sync_lock) == 0;
    cudaError_t e = cudaSuccess;
    if (mine)
        ev = ctx->sync_ev;
    else
        e = cudaEventCreateWithFlags(&ev, kHostWaitEvent);
    if (e == cudaSuccess) e = cudaEventRecord(ev, s);
    if (e == cudaSuccess) e = cudaEventSynchronize(ev);
    if (mine)
        pthread_mutex_unlock(&ctx->sync_lock);
    else if (ev)
        cudaEventDestroy(ev);
    return e;
}

/* After a round of allocations: 1 when they all succeeded; 0 when one ran out of memory
 * (everything released, the caller plans again with a smaller budget); -1 on any other
 * device error (*st set). */
int alloc_outcome(HostBuffers &hb, cudaError_t e, Err er, xknn_status *st)
{
    if (e == cudaSuccess) return 1;
    (void)cudaGetLastError();
    hb.release();
    if (e == cudaErrorMemoryAllocation) return 0;
    *st = failf(er, XKNN_ERROR_DEVICE, "cuda backend: cudaMalloc: %s", cudaGetErrorString(e));
    return -1;
}

xknn_status fail_alloc_kept_failing(Err er, size_t budget, size_t bytes)
{
    return failf(er, XKNN_ERROR_OUT_OF_MEMORY,
                 "cuda backend: device allocations of the planned sizes kept failing (budget %zu bytes, last "
                 "workspace %zu bytes)",
                 budget, bytes);
}

/* The device memory budget: the caller's, or 0.9 x what is free, counting as free what
 * the context's pool holds unused from earlier calls (HostBuffers::alloc trims it when
 * an allocation needs it). */
size_t budget_of(const xknn_params *prm, cudaMemPool_t pool, Err er, xknn_status *st)
{
    size_t free_b = 0, total_b = 0;
    *st = XKNN_SUCCESS;
    if (prm->device_memory_budget) return prm->device_memory_budget;
    const cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *st = failf(er, XKNN_ERROR_DEVICE, "cuda backend: cudaMemGetInfo: %s", cudaGetErrorString(e));
        return 0;
    }
    if (pool) {
        uint64_t reserved = 0, used = 0;
        if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess &&
            cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess && reserved > used)
            free_b += (size_t)(reserved - used);
        (void)cudaGetLastError();
    }
    return (size_t)((double)free_b * 0.9);
}

/* The start of every host-array search: sizes checked, the caller's context or a
 * temporary one (*own_ctx, which the caller destroys), its device made current for the
 * call (scope), the device memory budget, and on a caller's context its pinned staging
 * ring (every staged copy of the call goes through it). */
xknn_status host_begin(const xknn__job *job, DeviceScope &scope, xknn_cuda_context **ctx,
                       xknn_cuda_context **own_ctx, size_t *budget, Err er)
{
    const xknn_params *prm = &job->params;
    xknn_status st = XKNN_SUCCESS;
    xknn_error tmp_err;
    XKNN__TRY(check_sizes(er, prm, job->n, job->nq, job->d, job->k, job->ldr, job->ldq));
    *ctx = (xknn_cuda_context *)prm->cuda_context;
    if (!*ctx) {
        const xknn_status cs = xknn_cuda_context_create(prm->device, own_ctx, &tmp_err);
        if (cs != XKNN_SUCCESS) return failf(er, cs, "%s", tmp_err.message);
        *ctx = *own_ctx;
        (*ctx)->copy_pool_none = 1; /* one call's context: no helper threads to start */
    }
    XKNN__CUDA_CHECK(scope.enter((*ctx)->device));
    *budget = budget_of(prm, (*ctx)->pool, er, &st);
    if (!*own_ctx) {
        XKNN__CUDA_CHECK(stage_make(*ctx));
        (*ctx)->threads = prm->num_threads;
    }
cleanup:
    return st;
}

} // namespace xknn_cuda

using namespace xknn_cuda;

extern "C" {

xknn_status xknn_cuda_context_create(int device, xknn_cuda_context **out, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    xknn_cuda_context *c = NULL;
    DeviceScope scope;
    cudaDeviceProp prop;
    int count = 0, l2 = 0, optin = 0, pools = 0;
    if (!out) return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_context_create: ctx is NULL"));
    *out = NULL;
    count = xknn__cuda_device_count();
    if (count <= 0)
        return finish_err(err, failf(er, XKNN_ERROR_NO_DEVICE, "cuda backend: no CUDA device is available"));
    if (device == -1) XKNN__CUDA_CHECK(cudaGetDevice(&device));
    if (device < 0 || device >= count) {
        st = failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                   "cuda backend: device ordinal %d is out of range (%d CUDA device%s: 0..%d)", device, count,
                   count == 1 ? "" : "s", count - 1);
        goto cleanup;
    }
    c = (xknn_cuda_context *)calloc(1, sizeof *c);
    if (!c) {
        st = failf(er, XKNN_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory for a context");
        goto cleanup;
    }
    c->device = device;
    pthread_mutex_init(&c->kept_lock, NULL);
    pthread_mutex_init(&c->sync_lock, NULL);
    XKNN__CUDA_CHECK(scope.enter(device));
    XKNN__CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    XKNN__CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    XKNN__CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    c->sms = prop.multiProcessorCount;
    c->cc_major = prop.major;
    c->cc_minor = prop.minor;
    c->l2 = (size_t)l2;
    c->smem_optin = (size_t)optin;
    c->global_mem = prop.totalGlobalMem;
    snprintf(c->name, sizeof c->name, "%s", prop.name);
    XKNN__CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    XKNN__CUDA_CHECK(cudaEventCreateWithFlags(&c->sync_ev, kHostWaitEvent));
    /* a pool of its own that keeps freed memory (release threshold: all), so repeated host
     * calls on one context do not pay cudaMalloc; without pool support, plain cudaMalloc */
    XKNN__CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
    if (pools) {
        cudaMemPoolProps pp;
        memset(&pp, 0, sizeof pp);
        pp.allocType = cudaMemAllocationTypePinned;
        pp.handleTypes = cudaMemHandleTypeNone;
        pp.location.type = cudaMemLocationTypeDevice;
        pp.location.id = device;
        XKNN__CUDA_CHECK(cudaMemPoolCreate(&c->pool, &pp));
        uint64_t keep = UINT64_MAX;
        XKNN__CUDA_CHECK(cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &keep));
    }
    *out = c;
    c = NULL;
cleanup:
    if (c) {
        if (c->pool) cudaMemPoolDestroy(c->pool);
        if (c->sync_ev) cudaEventDestroy(c->sync_ev);
        if (c->stream) cudaStreamDestroy(c->stream);
        pthread_mutex_destroy(&c->sync_lock);
        pthread_mutex_destroy(&c->kept_lock);
        free(c);
    }
    return finish_err(err, st);
}

void xknn_cuda_context_destroy(xknn_cuda_context *ctx)
{
    if (!ctx) return;
    DeviceScope scope;
    if (scope.enter(ctx->device) == cudaSuccess) {
        /* (first: a copy still running reads the kept lists) */
        copier_destroy(ctx->copier);
        pool_destroy(ctx->copy_pool);
        for (int i = 0; i < 8; ++i) kept_free(ctx->kept[i]);
        for (int i = 0; i < 4; ++i) {
            if (ctx->lists[i].ids) cudaFree(ctx->lists[i].ids);
            if (ctx->lists[i].dist) cudaFree(ctx->lists[i].dist);
        }
        if (ctx->keep_stream) cudaStreamDestroy(ctx->keep_stream);
        if (ctx->pair_out) cudaFreeHost(ctx->pair_out);
        for (int b = 1; b >= 0; --b) {
            if (ctx->stage_done[b]) cudaEventDestroy(ctx->stage_done[b]);
            if (ctx->stage[b]) cudaFreeHost(ctx->stage[b]);
        }
        if (ctx->copy_stream) cudaStreamDestroy(ctx->copy_stream);
        if (ctx->finite_dev) cudaFree(ctx->finite_dev);
        if (ctx->finite_host) cudaFreeHost(ctx->finite_host);
        if (ctx->blas) cublasDestroy(ctx->blas);
        if (ctx->pool) cudaMemPoolDestroy(ctx->pool);
        if (ctx->sync_ev) cudaEventDestroy(ctx->sync_ev);
        if (ctx->stream) cudaStreamDestroy(ctx->stream);
    }
    pthread_mutex_destroy(&ctx->sync_lock);
    pthread_mutex_destroy(&ctx->kept_lock);
    free(ctx);
}

int xknn_cuda_context_device(const xknn_cuda_context *ctx) { return ctx ? ctx->device : -1; }

} /* extern "C" */
