/* SPDX-License-Identifier: MIT */
/*
 * Soft-kNN forward and backward passes on the GPU (model and notation in
 * include/xknn/impl/softknn_kernels.h). Everything works on the packed 64-bit words of
 * the rows; the largest buffers are the m x nr pair values (distance and F), never an
 * m x nr x d tensor. Reductions run in a fixed order (no atomics): results are the same
 * bits on every run of one GPU model.
 *
 *   sk_forward   grid m (one block per scored row p), 256 threads striding over the nr
 *                references: d_pt word by word (set bits of x XOR u, ascending), F_pt,
 *                then a fixed-shape block tree sums F Y in double -> mean_p.
 *   host         logits, loss and coef_p from mean_p (xknn__sk_head, shared with the CPU)
 *   sk_backward  grid m, 256 threads: per chunk of 256 references, each thread computes
 *                one G_pt into shared memory; then each thread owns bits b = tid + 256 k
 *                and adds G_pt [x_tb != u_pb] over the chunk (a warp's 32 bits share one
 *                word: one broadcast load per row), into its own row of tpart (m x d).
 *   sk_reduce    one thread per bit: tbit_b = sum over p of tpart, p ascending; the
 *                three scalar sums likewise.
 * Occupancy: 256-thread blocks with a few hundred bytes of static shared memory plus one
 * row of u (ld words); blocks are independent rows, so m >= a few hundred fills an H100.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xknn/impl/softknn_kernels.h"

namespace {

const int kSkThreads = 256;
/* u row in shared memory: at most 6144 words (393216 bits, 48 KiB). */
const int64_t kSkMaxWords = 6144;

__device__ double sk_block_sum(double v, double *sh)
{
    int tid = threadIdx.x;
    sh[tid] = v;
    __syncthreads();
    for (int s = kSkThreads / 2; s > 0; s >>= 1) {
        if (tid < s) sh[tid] += sh[tid + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

__global__ void sk_forward(const uint64_t *__restrict__ x, const float *__restrict__ y, int64_t ld,
                           const uint64_t *__restrict__ u, const int64_t *__restrict__ refs, int64_t nr,
                           const float *__restrict__ wabs, float s1, float a, float c, float *__restrict__ dist,
                           float *__restrict__ fval, double *__restrict__ mean)
{
    extern __shared__ uint64_t su[];
    __shared__ double red[kSkThreads];
    const int64_t p = blockIdx.x;
    for (int64_t j = threadIdx.x; j < ld; j += blockDim.x) su[j] = u[p * ld + j];
    __syncthreads();
    double acc = 0;
    for (int64_t t = threadIdx.x; t < nr; t += blockDim.x) {
        const uint64_t *xr = x + refs[t] * ld;
        float dv = 0;
        for (int64_t j = 0; j < ld; j++) {
            uint64_t diff = __ldg(xr + j) ^ su[j];
            while (diff) {
                int bit = __ffsll((long long)diff) - 1;
                dv += __ldg(wabs + j * 64 + bit);
                diff &= diff - 1;
            }
        }
        float z = 1.0f - dv / s1;
        float fv = 1.0f / (1.0f + expf(-a * (z - c)));
        dist[p * nr + t] = dv;
        fval[p * nr + t] = fv;
        acc += (double)(fv * __ldg(y + refs[t]));
    }
    double s = sk_block_sum(acc, red);
    if (threadIdx.x == 0) mean[p] = s / (double)nr;
}

__global__ void sk_backward(const uint64_t *__restrict__ x, const float *__restrict__ y, int64_t ld, int64_t d,
                            const uint64_t *__restrict__ u, const int64_t *__restrict__ refs, int64_t nr,
                            const float *__restrict__ dist, const float *__restrict__ fval, double s1,
                            const double *__restrict__ coef, double *__restrict__ tpart, double *__restrict__ psums)
{
    extern __shared__ uint64_t su[];
    __shared__ float gs[kSkThreads];
    __shared__ int64_t rs[kSkThreads];
    __shared__ double red[kSkThreads];
    const int64_t p = blockIdx.x;
    const int tid = threadIdx.x;
    const float cp = (float)coef[p];
    for (int64_t j = tid; j < ld; j += blockDim.x) su[j] = u[p * ld + j];
    for (int64_t b = tid; b < d; b += blockDim.x) tpart[p * d + b] = 0;
    __syncthreads();
    double s0 = 0, sz = 0, sd = 0;
    for (int64_t t0 = 0; t0 < nr; t0 += kSkThreads) {
        int64_t t = t0 + tid;
        int cnt = (int)(nr - t0 < kSkThreads ? nr - t0 : kSkThreads);
        if (t < nr) {
            int64_t i = refs[t];
            float fv = fval[p * nr + t], dv = dist[p * nr + t];
            float g = cp * __ldg(y + i) * fv * (1.0f - fv);
            s0 += g;
            sz += (double)g * (1.0 - (double)dv / s1);
            sd += (double)g * dv;
            gs[tid] = g;
            rs[tid] = i;
        }
        __syncthreads();
        for (int64_t b = tid; b < d; b += blockDim.x) {
            const int64_t j = b >> 6;
            const int sh = (int)(b & 63);
            const uint64_t ub = (su[j] >> sh) & 1u;
            float acc = 0;
            for (int e = 0; e < cnt; e++) {
                uint64_t xb = (__ldg(x + rs[e] * ld + j) >> sh) & 1u;
                acc += (xb ^ ub) ? gs[e] : 0.0f;
            }
            tpart[p * d + b] += (double)acc;
        }
        __syncthreads();
    }
    s0 = sk_block_sum(s0, red);
    sz = sk_block_sum(sz, red);
    sd = sk_block_sum(sd, red);
    if (tid == 0) {
        psums[3 * p] = s0;
        psums[3 * p + 1] = sz;
        psums[3 * p + 2] = sd;
    }
}

__global__ void sk_reduce(const double *__restrict__ tpart, const double *__restrict__ psums, int64_t m, int64_t d,
                          double *__restrict__ out /* d + 3 */)
{
    int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b < d) {
        double s = 0;
        for (int64_t p = 0; p < m; p++) s += tpart[p * d + b];
        out[b] = s;
    } else if (b < d + 3) {
        double s = 0;
        for (int64_t p = 0; p < m; p++) s += psums[3 * p + (b - d)];
        out[b] = s;
    }
}

} // namespace

struct xknn__sk_cuda {
    int device;
    cudaStream_t stream; /* the state's own stream: the default stream is never used */
    int64_t n, d, ld;
    uint64_t *x;
    float *y;
    /* scratch, grown on demand */
    int64_t cap_m, cap_nr, cap_pairs;
    uint64_t *u;
    int64_t *refs;
    float *wabs;
    float *dist, *fval;
    double *mean, *coef, *psums, *tpart, *out;
};

#define XKNN__SK_CUDA(call)                                                                                  \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            if (msg && msg_size) snprintf(msg, msg_size, "CUDA error in %s: %s", #call, cudaGetErrorString(e_)); \
            st = e_ == cudaErrorMemoryAllocation ? XKNN_ERROR_OUT_OF_MEMORY : XKNN_ERROR_DEVICE;             \
            goto fail;                                                                                       \
        }                                                                                                    \
    } while (0)

static void sk_free_scratch(xknn__sk_cuda *s)
{
    cudaFree(s->out), cudaFree(s->tpart), cudaFree(s->psums), cudaFree(s->coef), cudaFree(s->mean);
    cudaFree(s->fval), cudaFree(s->dist), cudaFree(s->refs), cudaFree(s->u);
    s->out = NULL, s->tpart = NULL, s->psums = NULL, s->coef = NULL, s->mean = NULL;
    s->fval = NULL, s->dist = NULL, s->refs = NULL, s->u = NULL;
    s->cap_m = s->cap_nr = s->cap_pairs = 0;
}

extern "C" void xknn__softknn_cuda_destroy(xknn__sk_cuda *s)
{
    if (!s) return;
    int prev = -1;
    bool changed = cudaGetDevice(&prev) == cudaSuccess && prev != s->device && cudaSetDevice(s->device) == cudaSuccess;
    sk_free_scratch(s);
    cudaFree(s->wabs), cudaFree(s->y), cudaFree(s->x);
    if (s->stream) cudaStreamDestroy(s->stream);
    if (changed) (void)cudaSetDevice(prev);
    free(s);
}

extern "C" xknn_status xknn__softknn_cuda_create(int device, const uint64_t *x, const float *y, int64_t n, int64_t d,
                                                 int64_t ld, xknn__sk_cuda **out, char *msg, size_t msg_size)
{
    xknn_status st = XKNN_SUCCESS;
    int count = 0, prev = -1;
    xknn__sk_cuda *s = NULL;
    *out = NULL;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
        (void)cudaGetLastError();
        if (msg && msg_size) snprintf(msg, msg_size, "backend cuda: no CUDA device found");
        return XKNN_ERROR_NO_DEVICE;
    }
    if (ld > kSkMaxWords) {
        if (msg && msg_size)
            snprintf(msg, msg_size, "backend cuda: rows of %lld bits exceed the limit of %lld bits", (long long)d,
                     (long long)(kSkMaxWords * 64));
        return XKNN_ERROR_INVALID_ARGUMENT;
    }
    s = (xknn__sk_cuda *)calloc(1, sizeof *s);
    if (!s) {
        if (msg && msg_size) snprintf(msg, msg_size, "out of memory");
        return XKNN_ERROR_OUT_OF_MEMORY;
    }
    if (device < 0) XKNN__SK_CUDA(cudaGetDevice(&device));
    if (device >= count) {
        if (msg && msg_size) snprintf(msg, msg_size, "backend cuda: device %d does not exist (%d devices)", device, count);
        st = XKNN_ERROR_NO_DEVICE;
        goto fail;
    }
    s->device = device, s->n = n, s->d = d, s->ld = ld;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1; /* the caller's device, restored below */
    XKNN__SK_CUDA(cudaSetDevice(device));
    XKNN__SK_CUDA(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    XKNN__SK_CUDA(cudaMalloc((void **)&s->x, (size_t)(n * ld) * sizeof(uint64_t)));
    XKNN__SK_CUDA(cudaMalloc((void **)&s->y, (size_t)n * sizeof(float)));
    XKNN__SK_CUDA(cudaMalloc((void **)&s->wabs, (size_t)(ld * 64) * sizeof(float)));
    XKNN__SK_CUDA(cudaMemcpyAsync(s->x, x, (size_t)(n * ld) * sizeof(uint64_t), cudaMemcpyHostToDevice, s->stream));
    XKNN__SK_CUDA(cudaMemcpyAsync(s->y, y, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, s->stream));
    XKNN__SK_CUDA(cudaStreamSynchronize(s->stream)); /* x and y are the caller's pageable memory */
    if (prev >= 0 && prev != device) (void)cudaSetDevice(prev);
    *out = s;
    return XKNN_SUCCESS;
fail:
    xknn__softknn_cuda_destroy(s);
    if (prev >= 0 && prev != device) (void)cudaSetDevice(prev);
    return st;
}

extern "C" xknn_status xknn__softknn_cuda_eval(xknn__sk_cuda *s, const xknn__sk_job *job)
{
    char *msg = job->msg;
    size_t msg_size = job->msg_size;
    xknn_status st = XKNN_SUCCESS;
    const int64_t m = job->m, nr = job->nr, d = job->d, ld = s->ld;
    const double *th = job->theta;
    const double s1 = xknn__sk_wnorm(th, d);
    const int want_grad = job->target && job->grad;
    const size_t shmem = (size_t)ld * sizeof(uint64_t);
    double *mean = (double *)malloc((size_t)m * sizeof(double));
    double *coef = (double *)calloc((size_t)m, sizeof(double));
    double *red = (double *)malloc((size_t)(d + 3) * sizeof(double));
    float *wabs = (float *)calloc((size_t)(ld * 64), sizeof(float));
    double loss;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1; /* the caller's device, restored at the end */
    if (!mean || !coef || !red || !wabs) {
        if (msg && msg_size) snprintf(msg, msg_size, "out of memory");
        st = XKNN_ERROR_OUT_OF_MEMORY;
        goto fail;
    }
    XKNN__SK_CUDA(cudaSetDevice(s->device));
    if (m > s->cap_m || nr > s->cap_nr || m * nr > s->cap_pairs) {
        int64_t cm = m > s->cap_m ? m : s->cap_m, cn = nr > s->cap_nr ? nr : s->cap_nr;
        int64_t cp = m * nr > s->cap_pairs ? m * nr : s->cap_pairs;
        XKNN__SK_CUDA(cudaStreamSynchronize(s->stream));
        sk_free_scratch(s);
        XKNN__SK_CUDA(cudaMalloc((void **)&s->u, (size_t)(cm * ld) * sizeof(uint64_t)));
        XKNN__SK_CUDA(cudaMalloc((void **)&s->refs, (size_t)cn * sizeof(int64_t)));
        XKNN__SK_CUDA(cudaMalloc((void **)&s->dist, (size_t)cp * sizeof(float)));
        XKNN__SK_CUDA(cudaMalloc((void **)&s->fval, (size_t)cp * sizeof(float)));
        XKNN__SK_CUDA(cudaMalloc((void **)&s->mean, (size_t)cm * sizeof(double)));
        XKNN__SK_CUDA(cudaMalloc((void **)&s->coef, (size_t)cm * sizeof(double)));
        XKNN__SK_CUDA(cudaMalloc((void **)&s->psums, (size_t)(3 * cm) * sizeof(double)));
        XKNN__SK_CUDA(cudaMalloc((void **)&s->tpart, (size_t)(cm * d) * sizeof(double)));
        XKNN__SK_CUDA(cudaMalloc((void **)&s->out, (size_t)(d + 3) * sizeof(double)));
        s->cap_m = cm, s->cap_nr = cn, s->cap_pairs = cp;
    }
    for (int64_t b = 0; b < d; b++) wabs[b] = (float)fabs(th[b]);
    XKNN__SK_CUDA(cudaMemcpyAsync(s->wabs, wabs, (size_t)(ld * 64) * sizeof(float), cudaMemcpyHostToDevice, s->stream));
    XKNN__SK_CUDA(cudaMemcpyAsync(s->u, job->u, (size_t)(m * ld) * sizeof(uint64_t), cudaMemcpyHostToDevice, s->stream));
    XKNN__SK_CUDA(cudaMemcpyAsync(s->refs, job->refs, (size_t)nr * sizeof(int64_t), cudaMemcpyHostToDevice, s->stream));

    sk_forward<<<(unsigned)m, kSkThreads, shmem, s->stream>>>(s->x, s->y, ld, s->u, s->refs, nr, s->wabs, (float)s1,
                                                   (float)th[d + 2], (float)th[d + 3], s->dist, s->fval, s->mean);
    XKNN__SK_CUDA(cudaGetLastError());
    XKNN__SK_CUDA(cudaMemcpyAsync(mean, s->mean, (size_t)m * sizeof(double), cudaMemcpyDeviceToHost, s->stream));
    XKNN__SK_CUDA(cudaStreamSynchronize(s->stream));
    loss = xknn__sk_head(job, mean, coef);
    if (job->loss) *job->loss = loss;
    if (want_grad) {
        XKNN__SK_CUDA(cudaMemcpyAsync(s->coef, coef, (size_t)m * sizeof(double), cudaMemcpyHostToDevice, s->stream));
        sk_backward<<<(unsigned)m, kSkThreads, shmem, s->stream>>>(s->x, s->y, ld, d, s->u, s->refs, nr, s->dist, s->fval, s1,
                                                        s->coef, s->tpart, s->psums);
        XKNN__SK_CUDA(cudaGetLastError());
        sk_reduce<<<(unsigned)((d + 3 + kSkThreads - 1) / kSkThreads), kSkThreads, 0, s->stream>>>(s->tpart, s->psums, m, d, s->out);
        XKNN__SK_CUDA(cudaGetLastError());
        XKNN__SK_CUDA(cudaMemcpyAsync(red, s->out, (size_t)(d + 3) * sizeof(double), cudaMemcpyDeviceToHost, s->stream));
        XKNN__SK_CUDA(cudaStreamSynchronize(s->stream));
        xknn__sk_assemble(job, mean, red + d, red, job->grad);
    }
fail:
    if (st != XKNN_SUCCESS) (void)cudaStreamSynchronize(s->stream); /* nothing in flight reads freed memory */
    if (prev >= 0 && prev != s->device) (void)cudaSetDevice(prev);
    free(wabs), free(red), free(coef), free(mean);
    return st;
}
