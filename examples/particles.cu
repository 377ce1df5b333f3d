/* SPDX-License-Identifier: MIT */
/* particles: a smoothed-particle (SPH-style) gas in 3-D whose neighbour lists come from
 * xknn_cuda_search, with the positions kept on the GPU for the whole run.
 *
 * Per step, all on one caller-created cudaStream_t, with nothing copied to the host:
 *   1. xknn_cuda_search, self-join (query NULL: a particle is never its own neighbour):
 *      the k nearest neighbours of every particle, ids and squared distances;
 *   2. density:  rho_i = m (W(0, h_i) + sum_j W(r_ij, h_i)), h_i from the k-th distance;
 *   3. forces:   a symmetric pairwise pressure impulse J_ij for every neighbour pair,
 *                added to i and subtracted from j (whether or not i is among j's
 *                neighbours), so total momentum is conserved exactly;
 *   4. drift:    x += v dt.
 * The context and the workspace are created once (workspace size query, cudaMalloc).
 *
 * Velocities are kept in 64-bit fixed point and impulses are rounded to it before they
 * are added, so the pairwise sums are exact integer sums: the total momentum at the end
 * must equal the initial one bit for bit (the check that makes this a test, with the
 * total mass). For small runs (n <= 50000) the final positions are also copied out once
 * after the loop, and a device search is compared byte for byte with xknn_search on the
 * host CPU backend.
 *
 * Usage: particles [n = 1000000] [k = 32] [steps = 50]
 * Prints steps/s; exit 0 ok, 1 failure, 77 (with "1..0 # SKIP no CUDA device") when no
 * CUDA device is present.
 */
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xknn.h>
#include <xknn/cuda.h>

#define CUDA_CHECK(call)                                                                               \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "particles: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

static const double VSCALE = 1099511627776.0; /* 2^40 fixed-point units per velocity unit */
static const double JMAX = 1125899906842624.0; /* |impulse| clamp: 2^50 units             */
static const double PI = 3.14159265358979323846;

struct sim {
    int64_t n, k;
    double m;  /* particle mass: total mass 1                            */
    double c2; /* pressure constant: P = c2 * rho                        */
    double dt;
};

__device__ static uint64_t mix(uint64_t h)
{
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 32;
    return h;
}

__device__ static double uniform01(uint64_t key) { return (double)(mix(key) >> 11) * (1.0 / 9007199254740992.0); }

/* Positions uniform in the unit cube, velocities uniform in [-0.01, 0.01) per component. */
__global__ void init_kernel(int64_t n, float *pos, unsigned long long *vel)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    for (int c = 0; c < 3; c++) {
        pos[i * 3 + c] = (float)uniform01((uint64_t)i * 8 + (uint64_t)c);
        double v = 0.02 * (uniform01((uint64_t)i * 8 + 4 + (uint64_t)c) - 0.5);
        vel[i * 3 + c] = (unsigned long long)__double2ll_rn(v * VSCALE);
    }
}

/* Smoothing length from the k-th (largest) squared neighbour distance. */
__device__ static double smoothing(const float *dist, int64_t i, int64_t k)
{
    return 1.2 * sqrt((double)dist[i * k + k - 1]) + 1e-12;
}

/* Density (poly6 kernel) and pressure term P/rho^2; counts invalid neighbour ids. */
__global__ void density_kernel(sim s, const float *pos, const int64_t *ids, const float *dist, double *rho,
                               double *pterm, unsigned long long *bad)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= s.n) return;
    double h = smoothing(dist, i, s.k), h2 = h * h;
    double norm = 315.0 / (64.0 * PI * h2 * h2 * h2 * h2 * h);
    double sum = h2 * h2 * h2; /* W(0, h) / norm */
    double xi = pos[i * 3], yi = pos[i * 3 + 1], zi = pos[i * 3 + 2];
    for (int64_t a = 0; a < s.k; a++) {
        int64_t j = ids[i * s.k + a];
        if (j < 0 || j >= s.n || j == i) {
            atomicAdd(bad, 1ull);
            continue;
        }
        double dx = xi - pos[j * 3], dy = yi - pos[j * 3 + 1], dz = zi - pos[j * 3 + 2];
        double r2 = dx * dx + dy * dy + dz * dz;
        if (r2 < h2) sum += (h2 - r2) * (h2 - r2) * (h2 - r2);
    }
    double r = s.m * norm * sum;
    rho[i] = r;
    pterm[i] = s.c2 * r / (r * r);
}

/* Pairwise pressure impulses (spiky kernel gradient with h_i): +J to i, -J to j, each
 * rounded once to fixed point, so every pair adds exactly zero to the total momentum. */
__global__ void force_kernel(sim s, const float *pos, const int64_t *ids, const float *dist,
                             const double *pterm, unsigned long long *vel)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= s.n) return;
    double h = smoothing(dist, i, s.k);
    double g = 45.0 / (PI * h * h * h * h * h * h);
    double xi = pos[i * 3], yi = pos[i * 3 + 1], zi = pos[i * 3 + 2];
    long long acc[3] = {0, 0, 0};
    for (int64_t a = 0; a < s.k; a++) {
        int64_t j = ids[i * s.k + a];
        if (j < 0 || j >= s.n || j == i) continue;
        double d[3] = {xi - pos[j * 3], yi - pos[j * 3 + 1], zi - pos[j * 3 + 2]};
        double r = sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]);
        if (r <= 0.0 || r >= h) continue; /* duplicates and pairs beyond h: no force */
        double f = s.m * (pterm[i] + pterm[j]) * g * (h - r) * (h - r) / r * s.dt;
        for (int c = 0; c < 3; c++) {
            double q = fmin(fmax(f * d[c] * VSCALE, -JMAX), JMAX);
            long long J = __double2ll_rn(q);
            acc[c] += J;
            atomicAdd(&vel[j * 3 + c], (unsigned long long)(-J));
        }
    }
    for (int c = 0; c < 3; c++) atomicAdd(&vel[i * 3 + c], (unsigned long long)acc[c]);
}

__global__ void drift_kernel(sim s, float *pos, const unsigned long long *vel)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= s.n) return;
    for (int c = 0; c < 3; c++)
        pos[i * 3 + c] = (float)((double)pos[i * 3 + c] + (double)(long long)vel[i * 3 + c] / VSCALE * s.dt);
}

/* Total momentum (in fixed-point units, mass factored out: equal masses) and mass. */
__global__ void totals_kernel(int64_t n, const unsigned long long *vel, const double *rho,
                              unsigned long long *mom, double *rho_sum)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    for (int c = 0; c < 3; c++) atomicAdd(&mom[c], vel[i * 3 + c]);
    if (rho) atomicAdd(rho_sum, rho[i]);
}

static int64_t arg(int argc, char **argv, int i, int64_t def)
{
    if (argc <= i) return def;
    char *end;
    long long v = strtoll(argv[i], &end, 10);
    if (*end || v <= 0) {
        fprintf(stderr, "usage: particles [n = 1000000] [k = 32] [steps = 50] (positive integers)\n");
        exit(1);
    }
    return (int64_t)v;
}

static void check_xknn(xknn_status st, const xknn_error *err, const char *what)
{
    if (st != XKNN_SUCCESS) {
        fprintf(stderr, "particles: %s: %s\n", what, err->message);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    const int64_t n = arg(argc, argv, 1, 1000000), k = arg(argc, argv, 2, 32), steps = arg(argc, argv, 3, 50);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("1..0 # SKIP no CUDA device\n");
        return 77;
    }
    if (k >= n) {
        fprintf(stderr, "particles: need k < n (got n=%lld k=%lld)\n", (long long)n, (long long)k);
        return 1;
    }
    sim s;
    s.n = n;
    s.k = k;
    s.m = 1.0 / (double)n;
    s.c2 = 1e-2;
    s.dt = 0.1 * pow((double)n, -1.0 / 3.0); /* a tenth of the mean spacing per unit speed */

    xknn_error err;
    xknn_cuda_context *ctx = NULL;
    xknn_status st = xknn_cuda_context_create(-1, &ctx, &err);
    if (st == XKNN_ERROR_NO_DEVICE) {
        printf("1..0 # SKIP no CUDA device\n");
        return 77;
    }
    check_xknn(st, &err, "xknn_cuda_context_create");

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    float *pos, *dist;
    int64_t *ids;
    unsigned long long *vel, *mom, *bad;
    double *rho, *pterm, *rho_sum;
    CUDA_CHECK(cudaMalloc(&pos, (size_t)n * 3 * sizeof *pos));
    CUDA_CHECK(cudaMalloc(&vel, (size_t)n * 3 * sizeof *vel));
    CUDA_CHECK(cudaMalloc(&ids, (size_t)(n * k) * sizeof *ids));
    CUDA_CHECK(cudaMalloc(&dist, (size_t)(n * k) * sizeof *dist));
    CUDA_CHECK(cudaMalloc(&rho, (size_t)n * sizeof *rho));
    CUDA_CHECK(cudaMalloc(&pterm, (size_t)n * sizeof *pterm));
    CUDA_CHECK(cudaMalloc(&mom, 6 * sizeof *mom));
    CUDA_CHECK(cudaMalloc(&bad, sizeof *bad));
    CUDA_CHECK(cudaMalloc(&rho_sum, sizeof *rho_sum));

    /* Workspace: sized once for this problem, within a quarter of the free memory. */
    size_t free_b = 0, total_b = 0, ws_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    xknn_params p = XKNN_PARAMS_INIT;
    p.device_memory_budget = free_b / 4;
    check_xknn(xknn_cuda_workspace_size(ctx, &p, n, n, 3, k, &ws_bytes, &err), &err, "xknn_cuda_workspace_size");
    void *ws;
    CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    xknn_matrix ref = XKNN_MATRIX_F32(pos, n, 3); /* device pointer; query NULL: self-join */

    const unsigned threads = 256, blocks = (unsigned)((n + threads - 1) / threads);
    init_kernel<<<blocks, threads, 0, stream>>>(n, pos, vel);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemsetAsync(mom, 0, 6 * sizeof *mom, stream));
    CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof *bad, stream));
    CUDA_CHECK(cudaMemsetAsync(rho_sum, 0, sizeof *rho_sum, stream));
    totals_kernel<<<blocks, threads, 0, stream>>>(n, vel, NULL, mom, NULL);
    CUDA_CHECK(cudaGetLastError());
    /* warm-up search (cuBLAS and module loading), not timed */
    check_xknn(xknn_cuda_search(ctx, &p, &ref, NULL, k, ids, dist, ws, ws_bytes, &err, stream), &err,
               "xknn_cuda_search");

    cudaEvent_t t0, t1, t2;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    CUDA_CHECK(cudaEventCreate(&t2));
    CUDA_CHECK(cudaEventRecord(t0, stream));
    for (int64_t step = 0; step < steps; step++) {
        check_xknn(xknn_cuda_search(ctx, &p, &ref, NULL, k, ids, dist, ws, ws_bytes, &err, stream), &err,
                   "xknn_cuda_search");
        density_kernel<<<blocks, threads, 0, stream>>>(s, pos, ids, dist, rho, pterm, bad);
        force_kernel<<<blocks, threads, 0, stream>>>(s, pos, ids, dist, pterm, vel);
        drift_kernel<<<blocks, threads, 0, stream>>>(s, pos, vel);
        CUDA_CHECK(cudaGetLastError());
    }
    CUDA_CHECK(cudaEventRecord(t1, stream));
    /* The search alone, for the share of the step it takes. */
    const int64_t searches = steps < 10 ? steps : 10;
    for (int64_t r = 0; r < searches; r++)
        check_xknn(xknn_cuda_search(ctx, &p, &ref, NULL, k, ids, dist, ws, ws_bytes, &err, stream), &err,
                   "xknn_cuda_search");
    CUDA_CHECK(cudaEventRecord(t2, stream));
    totals_kernel<<<blocks, threads, 0, stream>>>(n, vel, rho, mom + 3, rho_sum);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaStreamSynchronize(stream));

    float ms_loop = 0, ms_search = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms_loop, t0, t1));
    CUDA_CHECK(cudaEventElapsedTime(&ms_search, t1, t2));
    unsigned long long mom_h[6], bad_h;
    double rho_sum_h;
    CUDA_CHECK(cudaMemcpy(mom_h, mom, sizeof mom_h, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&bad_h, bad, sizeof bad_h, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&rho_sum_h, rho_sum, sizeof rho_sum_h, cudaMemcpyDeviceToHost));

    int failed = 0;
    printf("particles: n=%lld k=%lld steps=%lld workspace=%.1f MiB\n", (long long)n, (long long)k,
           (long long)steps, (double)ws_bytes / 1048576.0);
    printf("particles: %.2f steps/s (%.3f ms/step, of which search %.3f ms), mean density %.4f\n",
           1000.0 * (double)steps / ms_loop, ms_loop / (double)steps,
           searches ? ms_search / (double)searches : 0.0, rho_sum_h / (double)n);
    for (int c = 0; c < 3; c++) {
        /* Exact integer conservation: tolerance 0 fixed-point units. */
        long long drift = (long long)(mom_h[3 + c] - mom_h[c]);
        printf("particles: momentum[%d] = %.9e, drift %lld fixed-point units\n", c,
               (double)(long long)mom_h[3 + c] / VSCALE * s.m, drift);
        if (drift != 0) failed = 1;
    }
    if (bad_h) {
        printf("particles: %llu invalid neighbour ids\n", bad_h);
        failed = 1;
    }
    if (!(rho_sum_h > 0) || !isfinite(rho_sum_h)) failed = 1;

    /* Small runs: the last device search against xknn_search on the CPU, byte for byte. */
    if (n <= 50000) {
        size_t nk = (size_t)(n * k);
        float *hpos = (float *)malloc((size_t)n * 3 * sizeof *hpos);
        float *hd = (float *)malloc(nk * sizeof *hd), *rd = (float *)malloc(nk * sizeof *rd);
        int64_t *hi = (int64_t *)malloc(nk * sizeof *hi), *ri = (int64_t *)malloc(nk * sizeof *ri);
        if (!hpos || !hd || !rd || !hi || !ri) {
            fprintf(stderr, "particles: out of host memory\n");
            return 1;
        }
        CUDA_CHECK(cudaMemcpy(hpos, pos, (size_t)n * 3 * sizeof *hpos, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(hi, ids, nk * sizeof *hi, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(hd, dist, nk * sizeof *hd, cudaMemcpyDeviceToHost));
        xknn_params cp = XKNN_PARAMS_INIT;
        cp.backend = XKNN_BACKEND_CPU;
        xknn_matrix href = XKNN_MATRIX_F32(hpos, n, 3);
        check_xknn(xknn_search(&cp, &href, NULL, k, ri, rd, &err), &err, "xknn_search (cpu)");
        int same = memcmp(hi, ri, nk * sizeof *hi) == 0 && memcmp(hd, rd, nk * sizeof *hd) == 0;
        printf("particles: final device search %s the CPU backend byte for byte\n", same ? "matches" : "DIFFERS from");
        if (!same) failed = 1;
        free(hpos);
        free(hd);
        free(rd);
        free(hi);
        free(ri);
    }
    printf("particles: %s\n", failed ? "FAIL" : "PASS");

    CUDA_CHECK(cudaEventDestroy(t0));
    CUDA_CHECK(cudaEventDestroy(t1));
    CUDA_CHECK(cudaEventDestroy(t2));
    CUDA_CHECK(cudaFree(ws));
    CUDA_CHECK(cudaFree(rho_sum));
    CUDA_CHECK(cudaFree(bad));
    CUDA_CHECK(cudaFree(mom));
    CUDA_CHECK(cudaFree(pterm));
    CUDA_CHECK(cudaFree(rho));
    CUDA_CHECK(cudaFree(dist));
    CUDA_CHECK(cudaFree(ids));
    CUDA_CHECK(cudaFree(vel));
    CUDA_CHECK(cudaFree(pos));
    CUDA_CHECK(cudaStreamDestroy(stream));
    xknn_cuda_context_destroy(ctx);
    return failed;
}
