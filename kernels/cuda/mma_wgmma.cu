/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/mma_wgmma.cu -- wgmma_kernel: the tensor-core passes on Hopper's wgmma
 * (sm_90a code; mma_hopper.cuh has the layouts), two warpgroups of 128 resident queries
 * each; the host takes it where the warp-specialized kernel does not apply.
 */
#include "mma_hopper.cuh"

namespace xknn_cuda {

namespace {

template <int MODE, bool VEC, int KB>
__global__ __launch_bounds__(kThreads, 1) void wgmma_kernel(const MmaParams p)
{
#ifdef XKNN__HAVE_WGMMA
    extern __shared__ __align__(16) float smem[];
    const int dpad = (int)((p.d + kBK - 1) / kBK * kBK); /* a multiple of KB (wgmma_chunk_of) */
    const int kp = dpad / 4; /* k-groups of a query row */
    float *Qs = smem;                          /* kBM x dpad, core-matrix layout */
    float *Rs = Qs + kBM * dpad;               /* kGStages x kBN x KB, core-matrix layout */
    float *row_s = Rs + kGStages * kBN * KB;   /* kBM */
    float *rn_s = row_s + kBM;                 /* kRnSlots x kBN */
    float *prow_s = rn_s + 2 * kRnSlots * kBN; /* mode 2: after the thr ring, kBM p_i */

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wg = warp >> 2, wi = warp & 3;
    const int q0 = (int)blockIdx.x * kBM;
    XKNN__MMA_BLOCK_TILES(KB);

#pragma unroll
    for (int s = 0; s < kGStages - 1; ++s) {
        if (s < total) gload_stage<MODE, VEC, KB>(Rs + s * kBN * KB, rn_s, p, t0 + s / KC, s % KC);
        cp_async_commit();
    }
    for (int idx = tid; idx < kBM * dpad; idx += kThreads) {
        const int r = idx / dpad, c = idx - r * dpad;
        const int q = q0 + r;
        const float v = (q < p.qs && c < p.d) ? p.Q[(int64_t)q * p.ldq + c] : 0.0f;
        Qs[((r >> 3) * kp + (c >> 2)) * 32 + (r & 7) * 4 + (c & 3)] = to_tf32(v);
    }
    stage_row_consts<MODE>(row_s, prow_s, p, q0, kBM, kThreads);

    float acc[2][64];
#pragma unroll
    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[mb][e] = 0.0f;
    /* this warpgroup's two m64 blocks of queries: rows 128 wg + 64 mb */
    const float *Am[2] = {Qs + ((wg * 128) >> 3) * kp * 32, Qs + ((wg * 128 + 64) >> 3) * kp * 32};
    const unsigned sboA = (unsigned)kp * 128u;

    /* Pipeline: chunk it + 2 is loaded into the stage chunk it - 1 used; each chunk's
     * wgmma are waited for before the next barrier (one chunk in flight with a 4-deep ring
     * makes the compiler serialise the wgmma instead). */
#pragma unroll 1
    for (int64_t it = 0; it < total; ++it) {
        cp_async_wait<kGStages - 2>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        {
            const int64_t nx = it + kGStages - 1;
            if (nx < total)
                gload_stage<MODE, VEC, KB>(Rs + (int)(nx % kGStages) * kBN * KB, rn_s, p, t0 + nx / KC, (int)(nx % KC));
            cp_async_commit();
        }
        const int kc = (int)(it % KC);
        const float *Bst = Rs + (int)(it % kGStages) * kBN * KB;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < KB / 8; ++s) {
            const uint64_t db = gmma_desc(Bst + 2 * s * 32, 128u, (KB / 4) * 128u);
#pragma unroll
            for (int mb = 0; mb < 2; ++mb)
                wgmma_m64n128k8(acc[mb], gmma_desc(Am[mb] + (kc * (KB / 4) + 2 * s) * 32, 128u, sboA), db);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (kc != KC - 1) continue;

        /* ---- epilogue of reference tile `tile` ---- */
        const int64_t tile = t0 + it / KC;
        WgTerms<MODE> T;
        wg_load_terms<MODE>(T, p, tile, t);
        wg_epilogue<MODE>(p, acc, tile, T, row_s, prow_s, wg, wi, g, t, q0);
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
#pragma unroll
            for (int e = 0; e < 64; ++e) acc[mb][e] = 0.0f;
    }
    cp_async_wait<0>();
#else
    (void)p;
    __trap(); /* never launched: the host takes this kernel only for sm_90a code */
#endif
}

} // namespace

template <int MODE, bool VEC, int KB>
cudaError_t wgmma_smem(int bytes)
{
    return cudaFuncSetAttribute(wgmma_kernel<MODE, VEC, KB>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

template <int MODE, bool VEC, int KB>
void wgmma_launch(dim3 grid, size_t smem, cudaStream_t st, const MmaParams &p)
{
    wgmma_kernel<MODE, VEC, KB><<<grid, kThreads, smem, st>>>(p);
}

#define XKNN__WGMMA(M, V, K)                         \
    template cudaError_t wgmma_smem<M, V, K>(int); \
    template void wgmma_launch<M, V, K>(dim3, size_t, cudaStream_t, const MmaParams &);
XKNN__WGMMA(0, false, 32)
XKNN__WGMMA(0, false, 64)
XKNN__WGMMA(0, true, 32)
XKNN__WGMMA(0, true, 64)
XKNN__WGMMA(1, false, 32)
XKNN__WGMMA(1, false, 64)
XKNN__WGMMA(1, true, 32)
XKNN__WGMMA(1, true, 64)
XKNN__WGMMA(2, false, 32)
XKNN__WGMMA(2, true, 32)

} // namespace xknn_cuda
