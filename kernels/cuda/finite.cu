/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/finite.cu -- NaN/Inf in f32 host rows checked on the device once they are
 * uploaded, so that a host-array search does not scan its inputs on the host first. The
 * kernel finds the first offending element in row-major order (the smallest flat index,
 * atomicMin over the rows of every launch into one word); the host then names it with
 * the message of xknn_check_input (finite_end), the host scan's, row and column alike.
 */
#include "engine.cuh"

namespace xknn_cuda {

/* Rows [row0, row0 + rows) of d floats, packed: *first = min(*first, (row0 + i) * d + j)
 * over the elements whose exponent bits are all ones (NaN, +Inf, -Inf). Each thread's
 * elements rise along its stride, so it stops at its first; a warp's minimum goes to
 * the word in one atomic. */
__global__ void first_nonfinite_kernel(const float *__restrict__ x, int64_t count, int64_t base,
                                       unsigned long long *first)
{
    unsigned long long best = ~0ull;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step)
        if ((__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u) {
            best = (unsigned long long)(base + i);
            break;
        }
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
        best = other < best ? other : best;
    }
    if ((threadIdx.x & 31) == 0 && best != ~0ull) atomicMin(first, best);
}

/* One of the call's two words (0: references, 1: queries) on ctx->finite_dev. */
static cudaError_t launch_first_nonfinite(const xknn_cuda_context *ctx, int which, const float *x, int64_t rows,
                                          int64_t d, int64_t row0, cudaStream_t s)
{
    const int64_t count = rows * d;
    if (count <= 0) return cudaSuccess;
    const int64_t want = ceil_div(count, 256);
    const int blocks = (int)min64(want, (int64_t)ctx->sms * 8);
    first_nonfinite_kernel<<<blocks, 256, 0, s>>>(x, count, row0 * d, ctx->finite_dev + which);
    return cudaGetLastError();
}

/* The search's check words set to "none" on s, before any check launch of the call */
cudaError_t finite_begin(xknn_cuda_context *ctx, cudaStream_t s)
{
    return cudaMemsetAsync(ctx->finite_dev, 0xff, 2 * sizeof(unsigned long long), s);
}

/* Packed device rows [row0, row0 + rows) of the references (which 0) or the queries (1),
 * checked on s after their upload */
cudaError_t finite_check(xknn_cuda_context *ctx, int which, const float *dev, int64_t rows, int64_t d, int64_t row0,
                         cudaStream_t s)
{
    return launch_first_nonfinite(ctx, which, dev, rows, d, row0, s);
}

/* The words to the host, ordered on s after every check; read by finite_end once the
 * caller has waited for s. */
cudaError_t finite_fetch(xknn_cuda_context *ctx, cudaStream_t s)
{
    return cudaMemcpyAsync(ctx->finite_host, ctx->finite_dev, 2 * sizeof(unsigned long long),
                           cudaMemcpyDeviceToHost, s);
}

/* After the wait: INVALID_VALUE with the host scan's message (xknn_check_input on the
 * offending row, so the same first row and column, references before queries) where a
 * word holds an element; else XKNN_SUCCESS. */
xknn_status finite_end(const xknn_cuda_context *ctx, const xknn__job *job, Err er)
{
    for (int which = 0; which < 2; ++which) {
        const unsigned long long idx = ctx->finite_host[which];
        if (idx == ~0ull) continue;
        const int64_t row = (int64_t)(idx / (unsigned long long)job->d);
        const float *base = which ? job->query : job->ref;
        const int64_t ld = which ? job->ldq : job->ldr;
        xknn_matrix m = XKNN_MATRIX_F32(base + row * ld, 1, job->d);
        xknn_error e;
        const xknn_status st = xknn_check_input(&job->params, which ? "query" : "reference", &m, row, &e);
        if (st != XKNN_SUCCESS) return failf(er, st, "%s", e.message);
    }
    return XKNN_SUCCESS;
}

/* The host scan where the device does not check (a temporary context, the streamed, the
 * symmetric and the canonical-tile paths): xknn_check_input on the references, then on
 * the queries when they are other rows. */
xknn_status finite_host_scan(const xknn__job *job, Err er)
{
    xknn_matrix r = XKNN_MATRIX_F32(job->ref, job->n, job->d), q = XKNN_MATRIX_F32(job->query, job->nq, job->d);
    xknn_error e;
    xknn_status st;
    r.ld = job->ldr;
    q.ld = job->ldq;
    if ((st = xknn_check_input(&job->params, "reference", &r, 0, &e)) != XKNN_SUCCESS)
        return failf(er, st, "%s", e.message);
    if (job->query == job->ref && job->ldq == job->ldr && job->nq <= job->n) return XKNN_SUCCESS;
    if ((st = xknn_check_input(&job->params, "query", &q, 0, &e)) != XKNN_SUCCESS)
        return failf(er, st, "%s", e.message);
    return XKNN_SUCCESS;
}

/* 1 where the job's values are the backend's to check: xknn_search leaves f32 rows
 * without hellinger's sign check to it (values_checked 0). */
int finite_pending(const xknn__job *job)
{
    return !job->params.values_checked && job->dtype == XKNN_DTYPE_F32 && job->params.metric != XKNN_METRIC_HELLINGER;
}

} // namespace xknn_cuda

namespace {

/* Rows x d floats at stride ld: *first = min over the offending elements of i * d + j
 * (the flat order of the packed rows, as first_nonfinite_kernel). One block a row at a
 * time, threads along the row; for the distributed index's device rows, not a hot path. */
__global__ void first_nonfinite_rows_kernel(const float *__restrict__ x, int64_t rows, int64_t d, int64_t ld,
                                            unsigned long long *first)
{
    for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
        unsigned long long best = ~0ull;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            if ((__float_as_uint(x[i * ld + j]) & 0x7f800000u) == 0x7f800000u) {
                best = (unsigned long long)(i * d + j);
                break;
            }
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
            best = other < best ? other : best;
        }
        if ((threadIdx.x & 31) == 0 && best != ~0ull) atomicMin(first, best);
    }
}

} // namespace

extern "C" xknn_status xknn__cuda_first_nonfinite(const float *dev, int64_t rows, int64_t d, int64_t ld, int64_t *row,
                                                  xknn_error *err)
{
    using namespace xknn_cuda;
    cudaPointerAttributes a;
    unsigned long long *word = nullptr, first = ~0ull;
    cudaStream_t s = nullptr;
    cudaError_t ce;
    *row = -1;
    if (rows <= 0 || d <= 0) return XKNN_SUCCESS;
    ce = cudaPointerGetAttributes(&a, dev);
    DeviceScope sc;
    if (ce == cudaSuccess) ce = sc.enter(a.device);
    if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (ce == cudaSuccess) ce = cudaMallocAsync((void **)&word, sizeof *word, s);
    if (ce == cudaSuccess) ce = cudaMemsetAsync(word, 0xff, sizeof *word, s);
    if (ce == cudaSuccess) {
        first_nonfinite_rows_kernel<<<(unsigned)min64(rows, 4096), 128, 0, s>>>(dev, rows, d, ld, word);
        ce = cudaGetLastError();
    }
    if (ce == cudaSuccess) ce = cudaMemcpyAsync(&first, word, sizeof first, cudaMemcpyDeviceToHost, s);
    if (word) (void)cudaFreeAsync(word, s);
    if (s) {
        const cudaError_t se = cudaStreamSynchronize(s);
        if (ce == cudaSuccess) ce = se;
        (void)cudaStreamDestroy(s);
    }
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return finish_err(err, failf(err_of(err), XKNN_ERROR_DEVICE, "cuda backend (value check of device rows): %s",
                                     cudaGetErrorString(ce)));
    }
    if (first != ~0ull) *row = (int64_t)(first / (unsigned long long)d);
    return XKNN_SUCCESS;
}
