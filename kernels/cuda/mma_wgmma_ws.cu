/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/mma_wgmma_ws.cu -- wgmma_ws_kernel: the Hopper passes warp-specialized, a
 * producer warpgroup and two consumers taking turns on the tensor pipe; also the
 * self-join's band of witnesses (mode 3) and the sorted triangle (SORTED).
 */
#ifdef XKNN_CUDA_PROFILE
#include <stdio.h>
#endif

#include "mma_hopper.cuh"

namespace xknn_cuda {

namespace {

/* ---- Hopper, warp-specialized: the same passes with a producer and ping-pong consumers ----
 * wgmma_kernel's two warpgroups wait for their tensor work and then run the epilogue
 * together, so the tensor pipe idles through every epilogue. Here a CTA has three
 * warpgroups:
 *   producer  (warpgroup 0, 56 registers): streams 32-dimension reference chunks by
 *             cp.async into an S-deep ring; each stage has a `full` mbarrier (its 128
 *             threads arrive when their copies land) and an `empty` one (the 8 consumer
 *             warps arrive when their wgmma reading it are done);
 *   consumers (warpgroups 1 and 2, 224 registers): 128 resident queries each, as in
 *             wgmma_kernel, taking turns on the tensor pipe: consumer 1 issues tile T's
 *             wgmma only after consumer 0 has issued its own (named barrier 2), and
 *             consumer 0 those of tile T + 1 only after consumer 1 has issued T's
 *             (named barrier 1). So one consumer's epilogue runs while the other's wgmma
 *             execute, and the tensor pipe sees the two in a fixed alternation.
 * A chunk is released as soon as the wgmma reading it complete (one wgmma group kept in
 * flight), so the producer refills while the later consumer still works on the tile.
 * The epilogue reads a tile's norms (and mode 2's thresholds) from global memory: 512
 * bytes a tile each, shared by the CTA's warps, L1/L2 hits, and read-only during a pass.
 * The chunks land in the generic proxy; each consumer fences (fence.proxy.async) after
 * its `full` wait, before the wgmma that read them. Both operands are stored 128-byte
 * swizzled (gmma_desc_sw128, faster than wgmma_kernel's core-matrix layout). Same
 * bounds, same epilogue (wg_epilogue), same candidates and witnesses as wgmma_kernel:
 * only the schedule and the layout differ. Launch: 384
 * threads, S from the shared memory left after the queries (5 at d = 128). */

#ifdef XKNN__HAVE_WGMMA /* (only the sm_90a kernel body uses it) */
/* The producer's copy of one 32-dimension chunk of tile `tile` (gload_stage's layout and
 * zero fill, 128 threads) in the 128-byte-swizzled layout: row j's 128 bytes at 128 j, its
 * 16-byte piece c at piece c ^ (j % 8). Thread tid owns piece (tid / 8) % 8 of rows
 * 8 (tid / 64) + tid % 8 + 16 i, i < 8, so its 8 sources are 16 rows apart. */
__device__ __forceinline__ void ws_load_chunk(float *stage, const MmaParams &p, int64_t tile, int kc, int tid)
{
    const int jr = tid & 7, c4 = (tid >> 3) & 7, jg = tid >> 6;
    const int col = kc * 32 + 4 * c4;
    const int64_t j = tile * kBN + jg * 8 + jr;
    const float *src = p.R + j * p.ldr + col;
    const int64_t step = 16 * p.ldr;
    float *dst = stage + (jg * 8 + jr) * 32 + (c4 ^ jr) * 4; /* 128-byte swizzle: row % 8 == jr */
    const bool colok = col < p.d;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const bool ok = colok && j + 16 * i < p.n;
        cp_async16(dst + 512 * i, ok ? src : p.R, ok ? 16 : 0);
        src += step;
    }
}
#endif

template <int MODE, bool SORTED = false>
__global__ __launch_bounds__(kWsThreads, 1) void wgmma_ws_kernel(const MmaParams p, int S)
{
#ifdef XKNN__HAVE_WGMMA
    constexpr int KB = 32;
    extern __shared__ __align__(16) float smem_raw[];
    const int dpad = (int)((p.d + kBK - 1) / kBK * kBK);
    /* the swizzle pattern follows address bits, so both operands start 1024-aligned */
    /* (an offset from smem_raw, not an integer round trip, so that the compiler keeps the
     * shared address space: shared loads and stores instead of generic ones) */
    float *Qs = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u) / sizeof(float);
    float *Rs = Qs + kBM * dpad;            /* S x kBN x KB: swizzled rows of 128 bytes */
    float *row_s = Rs + S * kBN * KB;       /* kBM */
    float *prow_s = row_s + kBM;            /* kBM (mode 2) */
    uint64_t *full = reinterpret_cast<uint64_t *>(prow_s + kBM);
    uint64_t *empty = full + kWsMaxStages;
    float2 *terms_s = reinterpret_cast<float2 *>(empty + kWsMaxStages); /* mode 2: kBN a consumer warp; mode 3: wbuf */

    const int tid = (int)threadIdx.x, warp = tid >> 5;
    const int role = warp >> 2; /* 0 producer, 1 and 2 consumers */
    const int q0 = (int)blockIdx.x * kBM;
    XKNN__MMA_BLOCK_TILES(KB);
    const int64_t RT = (p.n + kBN - 1) / kBN; /* (mode 3's virtual tiles wrap at RT) */

    if (tid == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(full + s, 128); /* the producer's threads, one cp.async arrival each */
            mbar_init(empty + s, 8);  /* the consumer warps */
        }
    }
    __syncthreads();

    if (role == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
        const int ptid = tid; /* 0..127 */
        /* stage s of round `round` (its parity); no division in the loop */
        int s = 0, kc = 0;
        unsigned round = 0;
        int64_t tile = t0;
        XKNN_PROF(unsigned long long pw = 0, pl = 0;)
#pragma unroll 1
        for (int64_t it = 0; it < total; ++it) {
            XKNN_PROF(const unsigned long long a0 = clock64();)
            if (round > 0) mbar_wait(empty + s, (round - 1) & 1);
            XKNN_PROF(const unsigned long long a1 = clock64(); pw += a1 - a0;)
            ws_load_chunk(Rs + s * kBN * KB, p, MODE == 3 && tile >= RT ? tile - RT : tile, kc, ptid);
            mbar_arrive_cp_async(full + s);
            XKNN_PROF(pl += clock64() - a1;)
            if (++s == S) {
                s = 0;
                ++round;
            }
            if (++kc == KC) {
                kc = 0;
                ++tile;
            }
        }
        cp_async_wait<0>();
        XKNN_PROF(if ((tid & 31) == 0) {
            atomicAdd(&g_ws_prof[MODE][10], pw);
            atomicAdd(&g_ws_prof[MODE][11], pl);
            atomicAdd(&g_ws_prof[MODE][12], 1ull);
        })
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
    const int ctid = tid - 128; /* 0..255 */
    const int lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wg = role - 1, wi = warp & 3;
    /* queries: TF32 into 32-dimension blocks (c / 32) of kBM swizzled rows of 128 bytes;
     * 16-byte loads, 8 in flight per thread (d % 4 == 0 here: VEC), where Q allows */
    if (((uintptr_t)p.Q % 16) == 0 && p.ldq % 4 == 0) {
        const int dq = dpad / 4;
        for (int base = ctid; base < kBM * dq; base += 256 * 8) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int idx = base + u * 256, r = idx / dq, c = 4 * (idx - r * dq);
                const int q = q0 + r;
                v[u] = idx < kBM * dq && q < p.qs && c < p.d
                           ? __ldg(reinterpret_cast<const float4 *>(p.Q + (int64_t)q * p.ldq + c))
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int idx = base + u * 256, r = idx / dq, c = 4 * (idx - r * dq);
                if (idx < kBM * dq) {
                    const float4 w = make_float4(to_tf32(v[u].x), to_tf32(v[u].y), to_tf32(v[u].z), to_tf32(v[u].w));
                    *reinterpret_cast<float4 *>(Qs + ((c >> 5) * kBM + r) * 32 + ((((c >> 2) & 7) ^ (r & 7)) << 2)) = w;
                }
            }
        }
    } else {
        for (int idx = ctid; idx < kBM * dpad; idx += 256) {
            const int r = idx / dpad, c = idx - r * dpad;
            const int q = q0 + r;
            const float v = (q < p.qs && c < p.d) ? p.Q[(int64_t)q * p.ldq + c] : 0.0f;
            Qs[((c >> 5) * kBM + r) * 32 + ((((c >> 2) & 7) ^ (r & 7)) << 2) + (c & 3)] = to_tf32(v);
        }
    }
    stage_row_consts<MODE>(row_s, prow_s, p, q0, kBM, 256, ctid);
    named_sync(3, 256); /* the queries and row constants are in place */

    float acc[2][64];
#pragma unroll
    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[mb][e] = 0.0f;
    const float *Am[2] = {Qs + (wg * 128) * 32, Qs + (wg * 128 + 64) * 32};

    /* matrix descriptors: the start address moves by 16-byte units (a k-step is 32 bytes,
     * a query block of 32 dimensions kBM * 128 bytes, a stage kBN * 128 bytes); adding to
     * the descriptor is exact, as every address stays below 2^18 */
    const uint64_t dA0 = gmma_desc_sw128(Am[0]), dA1 = gmma_desc_sw128(Am[1]), dB = gmma_desc_sw128(Rs);
    /* the sorted triangle's bound on m_x over the CTA's later columns (sym_epilogue_sorted) */
    float msuf = INFINITY;
    unsigned long long wcur = 0, wend = 0; /* the warp's chunk of the pool (sorted: pool_append) */
    if constexpr (SORTED) {
        const int64_t f0 = (int64_t)(q0 + kBM) / kBN, f = (f0 > t0 ? f0 : t0) * kBN; /* the first later column */
        msuf = f < p.n ? p.msuf[f] : INFINITY;
    }
    int s = 0; /* the stage of the next chunk and its round's parity */
    unsigned ph = 0;
    XKNN_PROF(unsigned long long pr[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};)
#pragma unroll 1
    for (int64_t tile = t0; tile < t1; ++tile) {
        __syncwarp(); /* bar.sync counts whole warps: converge after the epilogue's branches */
        XKNN_PROF(const unsigned long long c0 = clock64();)
        if (wg == 1 || tile != t0) named_sync(wg == 0 ? 1 : 2, 256); /* this consumer's turn */
        XKNN_PROF(const unsigned long long c1 = clock64(); pr[0] += c1 - c0;)
        int prev = -1;
#pragma unroll 1
        for (int kc = 0; kc < KC; ++kc) {
            mbar_wait(full + s, ph);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            const uint64_t db = dB + (uint64_t)(s * (kBN * KB * 4 / 16));
            const uint64_t da = (uint64_t)(kc * (kBM * 32 * 4 / 16));
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int k8 = 0; k8 < KB / 8; ++k8) {
                /* k-step k8 is 32 bytes into each swizzled row */
                wgmma_m64n128k8(acc[0], dA0 + da + 2 * k8, db + 2 * k8);
                wgmma_m64n128k8(acc[1], dA1 + da + 2 * k8, db + 2 * k8);
            }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            if (prev >= 0) {
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                __syncwarp(); /* the warp's earlier shared reads precede lane 0's release */
                if (lane == 0) mbar_arrive(empty + prev);
            }
            prev = s;
            if (++s == S) {
                s = 0;
                ph ^= 1;
            }
        }
        /* the other consumer's turn: consumer 1 does not signal after the last tile */
        if (wg == 0)
            named_arrive(2, 256);
        else if (tile + 1 < t1)
            named_arrive(1, 256);
        XKNN_PROF(const unsigned long long c2 = clock64(); pr[1] += c2 - c1; unsigned long long c3 = c2;)
        if constexpr (MODE == 2) {
            /* the tile's 128 (c_j, c'_x) pairs (1 KiB) copied by cp.async into the warp's
             * own area while the last wgmma run: no registers held across the wait (64
             * registers of them made ptxas load them after it). The area is rewritten
             * only after the warp's previous epilogue (the __syncwarp at the tile's top). */
            float2 *ts = terms_s + (warp - 4) * kBN;
            const float2 *src = reinterpret_cast<const float2 *>(p.ct) + tile * kBN;
            cp_async16(ts + 2 * lane, src + 2 * lane, 16);
            cp_async16(ts + 64 + 2 * lane, src + 64 + 2 * lane, 16);
            cp_async_commit();
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            __syncwarp();
            if (lane == 0) mbar_arrive(empty + prev);
            cp_async_wait<0>();
            __syncwarp();
            XKNN_PROF(c3 = clock64();)
            if constexpr (SORTED)
                sym_epilogue_sorted(p, acc, SymTermsSmem{ts + 2 * t}, row_s, prow_s, msuf, wg * 128 + wi * 16 + g, q0,
                                    tile * kBN, t, tile * kBN >= (int64_t)q0 + kBM, wcur, wend XKNN_PROF(, pr));
            else
                sym_epilogue_wg(p, acc, SymTermsSmem{ts + 2 * t}, row_s, prow_s, wg * 128 + wi * 16 + g, q0,
                                tile * kBN, t, p.rect || tile * kBN >= (int64_t)q0 + kBM XKNN_PROF(, pr));
        } else if constexpr (MODE == 3) {
            const int64_t rt = tile >= RT ? tile - RT : tile;
            WgTerms<3> T;
            wg_load_terms<3>(T, p, rt, t);
            /* the column side's C_x of column wi * 32 + lane (ct has round_up(n, kBN) entries) */
            const float cx = __ldg(p.ct + rt * kBN + wi * 32 + lane);
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            __syncwarp();
            if (lane == 0) mbar_arrive(empty + prev);
            XKNN_PROF(c3 = clock64();)
            band_epilogue_wg(p, acc, T, cx, row_s, prow_s, reinterpret_cast<float *>(terms_s) + wg * 4 * 2 * kBN, wg,
                             wi, g, t, lane, q0, rt * kBN, (int)(tile - q0 / kBN));
        } else {
            /* the tile's column terms from global memory (L1/L2), loaded while the tile's
             * last wgmma run */
            WgTerms<MODE> T;
            wg_load_terms<MODE>(T, p, tile, t);
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            __syncwarp();
            if (lane == 0) mbar_arrive(empty + prev);
            XKNN_PROF(c3 = clock64();)
            wg_epilogue<MODE>(p, acc, tile, T, row_s, prow_s, wg, wi, g, t, q0);
        }
        XKNN_PROF(pr[2] += c3 - c2; pr[3] += clock64() - c3; pr[9] += 1;)
        /* zeroed after the epilogue, so they are dead across the appenders' calls */
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
#pragma unroll
            for (int e = 0; e < 64; ++e) acc[mb][e] = 0.0f;
    }
    XKNN_PROF(if (lane == 0) for (int i = 0; i < 10; ++i) atomicAdd(&g_ws_prof[MODE][i], pr[i]);)
#else
    (void)p;
    (void)S;
    __trap(); /* never launched: the host takes this kernel only for sm_90a code */
#endif
}

} // namespace

template <int MODE, bool SORTED>
cudaError_t wgmma_ws_smem(int bytes)
{
    return cudaFuncSetAttribute(wgmma_ws_kernel<MODE, SORTED>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

template <int MODE, bool SORTED>
void wgmma_ws_launch(dim3 grid, size_t smem, cudaStream_t st, const MmaParams &p, int S)
{
    wgmma_ws_kernel<MODE, SORTED><<<grid, kWsThreads, smem, st>>>(p, S);
}

#define XKNN__WGMMA_WS(M, S)                            \
    template cudaError_t wgmma_ws_smem<M, S>(int); \
    template void wgmma_ws_launch<M, S>(dim3, size_t, cudaStream_t, const MmaParams &, int);
XKNN__WGMMA_WS(0, false)
XKNN__WGMMA_WS(1, false)
XKNN__WGMMA_WS(2, false)
XKNN__WGMMA_WS(2, true)
XKNN__WGMMA_WS(3, false)

#ifdef XKNN_CUDA_PROFILE
/* XKNN_CUDA_PROFILE: the phases of the launch just made, per warp-tile, to stderr */
void ws_profile_print(int mode)
{
    unsigned long long h[4][16];
    static const unsigned long long zero[4][16] = {};
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(h, g_ws_prof, sizeof h) != cudaSuccess) return;
    const unsigned long long *v = h[mode];
    const double wt = v[9] ? (double)v[9] : 1.0, pw = v[12] ? (double)v[12] : 1.0;
    fprintf(stderr,
            "xknn: cuda: profile of wgmma_ws_kernel mode %d: %llu warp-tiles; cycles a warp-tile: turn %.0f, issue "
            "%.0f, drain %.0f, epilogue %.0f (mode 2: main loop %.0f, exact rows and appends %.0f; warp-tiles with "
            "a hot row %.3f, with column bits %.3f); %llu producer warps, cycles a warp: waiting %.0f, loading %.0f\n",
            mode, v[9], v[0] / wt, v[1] / wt, v[2] / wt, v[3] / wt, v[4] / wt, v[5] / wt, v[6] / wt, v[7] / wt, v[12],
            v[10] / pw, v[11] / pw);
    (void)cudaMemcpyToSymbol(g_ws_prof, zero, sizeof zero);
}
#endif

} // namespace xknn_cuda
