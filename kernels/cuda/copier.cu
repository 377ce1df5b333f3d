/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/copier.cu -- xknn_cuda_copy_lists_start / test: copies of kept lists to
 * the host run by a thread of the context's own, in ticket order, so the caller's thread
 * never waits for them.
 */
#include "engine.cuh"

using namespace xknn_cuda;

/* ---- the copier: xknn_cuda_copy_lists_start's copies in a thread of their own ----------
 * Jobs run in ticket order on the copier's stream, each after the context's stream as it
 * was at its start (an event recorded then). Into page-locked host rows a job is one
 * copy; into pageable ones it goes through two pinned buffers, the host copying one out
 * while the device fills the other, so the caller's thread (which runs the next call)
 * never waits for it. */
struct CopyJob {
    int64_t ticket;
    char *dst[2];
    const char *src[2];
    size_t bytes[2];
    int locked;
};

struct xknn_cuda_copier {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int device, stop, thread_made;
    cudaStream_t s;
    cudaEvent_t after[kJobs]; /* job t's: recorded on the context's stream at its start  */
    cudaEvent_t filled[2];    /* the pinned buffers' copies from the device            */
    char *buf[2];             /* pinned, kCopierBuf each                               */
    CopyJob q[kJobs];         /* jobs with tickets (done, issued]                      */
    int64_t issued, done;     /* tickets issued; tickets <= done are over             */
    int64_t failed;           /* the first ticket whose copy failed (0: none)          */
    char why[160];
};

extern "C" {

/* 1 where [p, p + bytes) is page-locked host memory (cudaHostAlloc, cudaHostRegister):
 * the copy engines write it without the host's help. Checked at both ends (a registered
 * range is one allocation to the runtime). */
static int host_locked(const void *p, size_t bytes)
{
    for (int i = 0; i < 2; ++i) {
        cudaPointerAttributes a;
        const char *q = (const char *)p + (i ? bytes - 1 : 0);
        if (cudaPointerGetAttributes(&a, q) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        if (a.type != cudaMemoryTypeHost) return 0;
    }
    return 1;
}

static cudaError_t copier_run(xknn_cuda_copier *c, const CopyJob &j, cudaEvent_t after)
{
    cudaError_t e = cudaStreamWaitEvent(c->s, after, 0);
    for (int i = 0; i < 2 && e == cudaSuccess; ++i) {
        if (!j.bytes[i]) continue;
        if (j.locked) {
            e = cudaMemcpyAsync(j.dst[i], j.src[i], j.bytes[i], cudaMemcpyDeviceToHost, c->s);
            continue;
        }
        /* chunk n goes to buffer n & 1; chunk n - 1 is copied out while chunk n fills */
        const size_t n = (j.bytes[i] + kCopierBuf - 1) / kCopierBuf;
        for (size_t ch = 0; ch <= n && e == cudaSuccess; ++ch) {
            if (ch < n) {
                const size_t off = ch * kCopierBuf, len = min64((int64_t)kCopierBuf, (int64_t)(j.bytes[i] - off));
                e = cudaMemcpyAsync(c->buf[ch & 1], j.src[i] + off, len, cudaMemcpyDeviceToHost, c->s);
                if (e == cudaSuccess) e = cudaEventRecord(c->filled[ch & 1], c->s);
            }
            if (e == cudaSuccess && ch >= 1) {
                const size_t off = (ch - 1) * kCopierBuf, len = min64((int64_t)kCopierBuf, (int64_t)(j.bytes[i] - off));
                e = cudaEventSynchronize(c->filled[(ch - 1) & 1]);
                if (e == cudaSuccess) memcpy(j.dst[i] + off, c->buf[(ch - 1) & 1], len);
            }
        }
    }
    if (e == cudaSuccess) e = sync_stream(NULL, c->s);
    return e;
}

static void *copier_main(void *arg)
{
    xknn_cuda_copier *c = (xknn_cuda_copier *)arg;
    cudaError_t e0 = cudaSetDevice(c->device);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && c->done == c->issued) pthread_cond_wait(&c->cv, &c->mu);
        if (c->done == c->issued) break; /* (stop, nothing left) */
        const CopyJob j = c->q[(c->done + 1) % kJobs];
        const cudaEvent_t after = c->after[(c->done + 1) % kJobs];
        pthread_mutex_unlock(&c->mu);
        const cudaError_t e = e0 != cudaSuccess ? e0 : copier_run(c, j, after);
        pthread_mutex_lock(&c->mu);
        if (e != cudaSuccess && !c->failed) {
            c->failed = j.ticket;
            snprintf(c->why, sizeof c->why, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        }
        c->done = j.ticket;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

} /* extern "C" */

namespace xknn_cuda {

void copier_destroy(xknn_cuda_copier *c)
{
    if (!c) return;
    if (c->thread_made) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->th, NULL);
    }
    if (c->s) cudaStreamDestroy(c->s);
    for (int i = 0; i < kJobs; ++i)
        if (c->after[i]) cudaEventDestroy(c->after[i]);
    for (int b = 0; b < 2; ++b) {
        if (c->filled[b]) cudaEventDestroy(c->filled[b]);
        if (c->buf[b]) cudaFreeHost(c->buf[b]);
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* The context's copier, made on first use (on the context's device, the caller's scope
 * entered); NULL and *e set where it cannot be made. */
xknn_cuda_copier *copier_of(xknn_cuda_context *ctx, cudaError_t *e)
{
    pthread_mutex_lock(&ctx->kept_lock);
    xknn_cuda_copier *c = ctx->copier;
    *e = cudaSuccess;
    if (!c) {
        c = (xknn_cuda_copier *)calloc(1, sizeof *c);
        if (!c) {
            *e = cudaErrorMemoryAllocation;
        } else {
            pthread_mutex_init(&c->mu, NULL);
            pthread_cond_init(&c->cv, NULL);
            c->device = ctx->device;
            *e = cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking);
            for (int i = 0; i < kJobs && *e == cudaSuccess; ++i)
                *e = cudaEventCreateWithFlags(&c->after[i], cudaEventDisableTiming);
            for (int b = 0; b < 2 && *e == cudaSuccess; ++b) {
                *e = cudaEventCreateWithFlags(&c->filled[b], kHostWaitEvent);
                if (*e == cudaSuccess) *e = cudaHostAlloc((void **)&c->buf[b], kCopierBuf, cudaHostAllocDefault);
            }
            if (*e == cudaSuccess) {
                if (pthread_create(&c->th, NULL, copier_main, c) == 0)
                    c->thread_made = 1;
                else
                    *e = cudaErrorMemoryAllocation;
            }
            if (*e != cudaSuccess) {
                (void)cudaGetLastError();
                copier_destroy(c);
                c = NULL;
            }
            ctx->copier = c;
        }
    }
    pthread_mutex_unlock(&ctx->kept_lock);
    return c;
}

/* Waits (wait = 1) or looks: *over = 1 once ticket (-1: every one issued) is done. Returns
 * the failure of a copy up to ticket (cudaErrorUnknown, why in *why), else cudaSuccess. */
cudaError_t copier_wait(xknn_cuda_copier *c, int64_t ticket, int wait, int *over, const char **why)
{
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&c->mu);
    if (ticket < 0) ticket = c->issued;
    while (wait && c->done < ticket) pthread_cond_wait(&c->cv, &c->mu);
    if (over) *over = c->done >= ticket;
    if (c->failed && c->failed <= ticket && c->done >= c->failed) {
        e = cudaErrorUnknown;
        if (why) *why = c->why;
    }
    pthread_mutex_unlock(&c->mu);
    return e;
}

} // namespace xknn_cuda

extern "C" {

xknn_status xknn_cuda_copy_lists_start(xknn_cuda_context *ctx, const int64_t *ids, int64_t row0, int64_t rows,
                                       int64_t *ticket, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    DeviceScope scope;
    ListMirror m = {}; /* (filled by kept_lists_rows) */
    xknn_cuda_copier *c = NULL;
    CopyJob j;
    cudaError_t e = cudaSuccess;
    if (!ticket)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_copy_lists_start: NULL argument"));
    *ticket = 0;
    if ((st = kept_lists_rows(ctx, ids, row0, rows, "xknn_cuda_copy_lists_start", &m, er)) != XKNN_SUCCESS ||
        rows == 0)
        return finish_err(err, st);
    XKNN__CUDA_CHECK(scope.enter(ctx->device));
    memset(&j, 0, sizeof j);
    j.dst[0] = (char *)(m.host_ids + row0 * m.k);
    j.src[0] = (const char *)(m.ids + row0 * m.k);
    j.bytes[0] = (size_t)(rows * m.k) * sizeof(int64_t);
    j.dst[1] = (char *)(m.host_dist + row0 * m.k);
    j.src[1] = (const char *)(m.dist + row0 * m.k);
    j.bytes[1] = (size_t)(rows * m.k) * sizeof(float);
    j.locked = host_locked(j.dst[0], j.bytes[0]) && host_locked(j.dst[1], j.bytes[1]);
    c = copier_of(ctx, &e);
    XKNN__CUDA_CHECK(e);
    pthread_mutex_lock(&c->mu);
    /* (a slot is free once the job that had it kJobs tickets ago is done) */
    while (c->issued - c->done >= kJobs) pthread_cond_wait(&c->cv, &c->mu);
    j.ticket = c->issued + 1;
    e = cudaEventRecord(c->after[j.ticket % kJobs], ctx->stream);
    if (e == cudaSuccess) {
        c->q[j.ticket % kJobs] = j;
        c->issued = j.ticket;
        *ticket = j.ticket;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    XKNN__CUDA_CHECK(e);
cleanup:
    return finish_err(err, st);
}

xknn_status xknn_cuda_copy_lists_test(xknn_cuda_context *ctx, int64_t ticket, int wait, int *done, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    if (!ctx || !done)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_copy_lists_test: NULL argument"));
    *done = 1;
    if (ticket == 0) return finish_err(err, st);
    pthread_mutex_lock(&ctx->kept_lock);
    xknn_cuda_copier *c = ctx->copier;
    pthread_mutex_unlock(&ctx->kept_lock);
    int64_t issued = 0;
    if (c) {
        pthread_mutex_lock(&c->mu);
        issued = c->issued;
        pthread_mutex_unlock(&c->mu);
    }
    if (ticket < 0 || ticket > issued)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_copy_lists_test: ticket %lld was not issued",
                                     (long long)ticket));
    const char *why = "";
    if (copier_wait(c, ticket, wait, done, &why) != cudaSuccess) {
        *done = 0;
        st = failf(er, XKNN_ERROR_DEVICE, "cuda backend: the lists' copy to the host failed: %s", why);
    }
    return finish_err(err, st);
}

} /* extern "C" */
