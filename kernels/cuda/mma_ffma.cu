/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/mma_ffma.cu -- ffma_kernel: the tensor-core path's passes A and B with
 * fp32 products on the CUDA cores (MmaParams.ffma; mma.cu's header: FP32 ON THE CUDA
 * CORES), its grid, and its shared memory size.
 */
#include "mma_common.cuh"

namespace xknn_cuda {

namespace {

/* ---- fp32 on the CUDA cores: ffma_kernel (MmaParams.ffma, modes 0 and 1) -------------
 * The grid, ring, passes and epilogue of mma_kernel with 16 warps of 64 accumulators a
 * thread instead of 8 warps of 128, so that 4 warps per scheduler hide the latency of
 * shared memory. The CTA tile is the same 256 queries x 128 references; warp w takes
 * rows 16 w .. 16 w + 15 against all 128 columns. Lane (g, t) = (lane / 4, lane % 4)
 * owns rows 16 w + t + 4 i (i = 0..3) and columns 64 h + 8 ni + 2 u + c (h = g / 4, u =
 * g % 4, m = 2 ni + c = 0..15): the 4 threads that share a row's 64-column witness group
 * are lanes 4 apart, which mma_epilogue<MODE, 2, 8, 4, 4, 8> handles with u in the role
 * of the fragment's t. Both operands are stored dimension-major; within a dimension a
 * thread's 4 rows (16 columns) are contiguous, so one dimension is one 16-byte load of
 * rows and four of columns, and the column groups are swizzled by (u >> 1) | 2 h so that
 * the 8 distinct addresses of a warp's load fall in distinct banks. Rows vary with t and
 * columns with g because a 16-byte shared load costs one wavefront per distinct address
 * within a quarter warp: 4 + 4 x 2 wavefronts per dimension and warp, against 2 + 4
 * x 4 with the roles the other way round, which made the kernel shared-memory bound.
 * Reference chunks arrive transposed by 4-byte cp.async (8 a thread, 32-byte runs of
 * global memory). Each accumulator sums its dimensions in order with fmaf: an fp32 dot
 * product, the case of plan.cu's FP32 bound. */
constexpr int kFfThreads = 512;
constexpr int kFfBK = 64;           /* dimensions per ring stage: one barrier per 64 */
constexpr int kFfStages = 2;        /* ring depth: a stage loads while the other is used */
/* dimensions per loop trip (ffma_kernel's U): ptxas overlaps a dimension's loads with the
 * products of the one before only within a trip, so longer trips wait less often. 64 where
 * the grid's last tile is mostly full; 16 for a light last tile, pass A and the kernel
 * carrying its accumulators (which spills at 64). */
constexpr int kFfUnroll = 16, kFfUnrollFull = 64;
constexpr int kFfPitch = kBN + 4;   /* floats per dimension of a staged reference chunk */

/* position of query row r (of the CTA's kBM) within a dimension of the staged queries */
__device__ __forceinline__ int ff_qpos(int r) { return (r >> 4) * 16 + (r & 3) * 4 + ((r >> 2) & 3); }

/* position of reference row j (of a kBN tile) within a dimension of a staged chunk */
__device__ __forceinline__ int ff_rpos(int j)
{
    const int h = j >> 6, ni = (j >> 3) & 7, u = (j >> 1) & 3, m = 2 * ni + (j & 1);
    return h * 64 + u * 16 + 4 * ((m >> 2) ^ ((u >> 1) | (h << 1))) + (m & 3);
}

/* Per-thread constants of ff_load_stage: the thread copies dimensions kq + 8 b (kq = tid
 * % 8, b = 0..7) of rows jq + 64 a (jq = tid / 8, a = 0, 1) of a chunk: a warp covers 4
 * rows x 8 dimensions, four 32-byte runs. dst[a] = ff_rpos(jq + 64 a) + kq kFfPitch. */
struct FfCopy {
    int dst[2];
    int kq, jq;
};

__device__ __forceinline__ FfCopy ff_copy_init()
{
    FfCopy c;
    const int tid = (int)threadIdx.x;
    c.kq = tid & 7;
    c.jq = tid >> 3;
#pragma unroll
    for (int a = 0; a < 2; ++a) c.dst[a] = ff_rpos(c.jq + 64 * a) + c.kq * kFfPitch;
    return c;
}

/* chunk kc of reference tile `tile`, transposed: stage[k * kFfPitch + ff_rpos(j)];
 * rows >= n and dimensions >= d are zero-filled (checked only for a chunk that has any) */
__device__ __forceinline__ void ff_load_stage(float *stage, const MmaParams &p, const FfCopy &fc, int64_t tile, int kc)
{
    static_assert(kBN * kFfBK / kFfThreads == 16 && kBN == 128 && kFfBK == 64, "2 rows x 8 dimensions a thread");
    const int64_t ref0 = tile * kBN;
    const int k0 = kc * kFfBK;
    const float *src = p.R + (ref0 + fc.jq) * p.ldr + k0 + fc.kq;
    const int64_t ld64 = 64 * p.ldr;
    if (ref0 + kBN <= p.n && k0 + kFfBK <= p.d) {
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
            for (int b = 0; b < 8; ++b) cp_async4(stage + fc.dst[a] + 8 * b * kFfPitch, src + a * ld64 + 8 * b, 4);
    } else {
#pragma unroll
        for (int a = 0; a < 2; ++a) {
            const bool row = ref0 + fc.jq + 64 * a < p.n;
#pragma unroll
            for (int b = 0; b < 8; ++b) {
                const bool ok = row && k0 + fc.kq + 8 * b < p.d;
                cp_async4(stage + fc.dst[a] + 8 * b * kFfPitch, ok ? src + a * ld64 + 8 * b : p.R, ok ? 4 : 0);
            }
        }
    }
}

template <int MODE, bool CARRY, int U>
__global__ __launch_bounds__(kFfThreads, 1) void ffma_kernel(const MmaParams p)
{
    static_assert(MODE == 0 || MODE == 1, "passes A and B only");
    static_assert(kFfBK % U == 0, "whole trips per stage");
    static_assert(kBM == 256 && kBN == 128, "the layout assumes these tiles");
    extern __shared__ __align__(16) float smem[];
    const int dpad = (int)((p.d + kFfBK - 1) / kFfBK * kFfBK);
    float *Qt = smem;                                 /* dpad x kBM */
    float *Rs = Qt + dpad * kBM;                      /* kFfStages x kFfBK x kFfPitch */
    float *row_s = Rs + kFfStages * kFfBK * kFfPitch; /* kBM: per-row epilogue constant */

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int h = g >> 2, u = g & 3;
    const int q0 = (p.qt0 + (int)blockIdx.x) * kBM;
    /* a warp whose 16 rows are all past the queries (in the last query tile) only copies
     * and waits at the barriers: its products and epilogue would all be discarded */
    const bool idle = q0 + warp * 16 >= p.qs;
    XKNN__MMA_BLOCK_TILES(kFfBK);
    const FfCopy fc = ff_copy_init();

#pragma unroll
    for (int s = 0; s < kFfStages - 1; ++s) {
        if (s < total) ff_load_stage(Rs + s * kFfBK * kFfPitch, p, fc, t0 + s / KC, s % KC);
        cp_async_commit();
    }
    /* The queries, transposed: the lanes of a load take 32 consecutive rows, whose
     * positions fall in 32 distinct banks. With 16-byte aligned rows each lane loads 4
     * dimensions at once (a quarter of the scattered sectors of 4-byte loads, which cost
     * a CTA about a tile's time in L2 traffic). */
    if (((uintptr_t)p.Q & 15) == 0 && (p.ldq & 3) == 0) {
        for (int idx = tid; idx < kBM * dpad / 4; idx += kFfThreads) {
            const int r = idx & (kBM - 1), c = idx / kBM * 4;
            const int q = q0 + r;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (q < p.qs && c < p.d) {
                const float *src = p.Q + (int64_t)q * p.ldq + c;
                if (c + 4 <= p.d) {
                    v = __ldg(reinterpret_cast<const float4 *>(src));
                } else {
                    v.x = src[0];
                    if (c + 1 < p.d) v.y = src[1];
                    if (c + 2 < p.d) v.z = src[2];
                }
            }
            float *dst = Qt + c * kBM + ff_qpos(r);
            dst[0] = v.x;
            dst[kBM] = v.y;
            dst[2 * kBM] = v.z;
            dst[3 * kBM] = v.w;
        }
    } else {
        for (int idx = tid; idx < kBM * dpad; idx += kFfThreads) {
            const int r = idx & (kBM - 1), c = idx / kBM;
            const int q = q0 + r;
            Qt[c * kBM + ff_qpos(r)] = (q < p.qs && c < p.d) ? p.Q[(int64_t)q * p.ldq + c] : 0.0f;
        }
    }
    stage_row_consts<MODE>(row_s, nullptr, p, q0, kBM, kFfThreads);

    float acc[2][8][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

    const float *Aw = Qt + warp * 16 + t * 4;
    const int bsw = (u >> 1) | (h << 1);
    const int bw = h * 64 + u * 16;
    int kc = KC - 1, stg = kFfStages - 1;
    int64_t tile = t0 - 1;
    int lkc = (kFfStages - 1) % KC, lst = kFfStages - 1;
    int64_t ltile = t0 + (kFfStages - 1) / KC;

#pragma unroll 1
    for (int64_t it = 0; it < total; ++it) {
        if (++kc == KC) {
            kc = 0;
            ++tile;
        }
        if (++stg == kFfStages) stg = 0;
        cp_async_wait<kFfStages - 2>();
        __syncthreads();
        if (it + kFfStages - 1 < total) ff_load_stage(Rs + lst * kFfBK * kFfPitch, p, fc, ltile, lkc);
        cp_async_commit();
        if (++lkc == KC) {
            lkc = 0;
            ++ltile;
        }
        if (++lst == kFfStages) lst = 0;
        if (idle) continue;
        const float *A = Aw + kc * kFfBK * kBM;
        const float *B = Rs + stg * kFfBK * kFfPitch + bw;
#pragma unroll U
        for (int k = 0; k < kFfBK; ++k) {
            const float4 a4 = *reinterpret_cast<const float4 *>(A + k * kBM);
            float4 b4[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) b4[e] = *reinterpret_cast<const float4 *>(B + k * kFfPitch + 4 * (e ^ bsw));
            const float a[4] = {a4.x, a4.y, a4.z, a4.w};
            /* The 64 products of the dimension, each column's 4 rows in a row (ptxas gives
             * the column a reuse chain) in the order i = c + o_p (mod 4), c = m % 4, o =
             * 0, 3, 1, 2 (mode 1) or 3, 1, 0, 2 (mode 0): with a[i] in register bank i and
             * b[m] in bank c, these orders got ptxas's fewest FFMAs whose operands not
             * marked .reuse share a bank (counted in the loop's SASS, CUDA 13 ptxas, at
             * trips of 8: <1, false> 57 -> 1, <0, false> 137 -> 14; with the trips of
             * kFfUnrollFull and kFfUnroll, <1, false, 64> has 5 of 4096 and <1, false,
             * 16> 7 of 1024); with the accumulators carried (CARRY) the order 2, 0, 3, 1
             * runs faster though it has more of them. Only the order of independent FMAs
             * changes: each accumulator still adds its dimensions in order, with the same
             * fmaf. */
            constexpr int kOrd = MODE == 0 ? 0x2013 : CARRY ? 0x1302 : 0x2130; /* o_p = kOrd >> 4 p & 15 */
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float b[4] = {b4[e].x, b4[e].y, b4[e].z, b4[e].w};
#pragma unroll
                for (int c = 0; c < 4; ++c)
#pragma unroll
                    for (int p = 0; p < 4; ++p) {
                        const int i = (c + (kOrd >> (4 * p) & 15)) & 3;
                        /* column m = 4 e + c: ni = 2 e + (c >> 1), element 2 (i & 1) + (c & 1) */
                        float &r = acc[i >> 1][2 * e + (c >> 1)][2 * (i & 1) + (c & 1)];
                        r = fmaf(a[i], b[c], r);
                    }
            }
        }
        if (kc != KC - 1) continue;

        mma_epilogue<MODE, 2, 8, 4, 4, 8, CARRY>(p, acc, row_s, warp * 16 + t, q0, tile * kBN + h * 64, u);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int ni = 0; ni < 8; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
    }
    cp_async_wait<0>();
}

} // namespace

cudaError_t launch_ffma(const MmaParams &p, int mode, int sms, cudaStream_t st)
{
    const int64_t qt = (p.qs + kBM - 1) / kBM;
    const int64_t RT = (p.n + kBN - 1) / kBN;
    const int fsm = (int)ffma_smem_bytes(p.d);
    const int M = mode;
    /* pass B's entries carry their accumulators only where p.carry asks (mma_prune);
     * pass B without them takes the longer trips where its last tile is mostly full
     * (kFfUnrollFull) */
    void (*const kern)(const MmaParams) = M == 1 && p.carry ? ffma_kernel<1, true, kFfUnroll>
                                          : M == 1         ? ffma_kernel<1, false, kFfUnroll>
                                                           : ffma_kernel<0, false, kFfUnroll>;
    void (*const kfull)(const MmaParams) = M == 1 && !p.carry ? ffma_kernel<1, false, kFfUnrollFull> : kern;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, fsm);
    if (e == cudaSuccess && kfull != kern)
        e = cudaFuncSetAttribute(kfull, cudaFuncAttributeMaxDynamicSharedMemorySize, fsm);
    if (e != cudaSuccess) return e;
    /* query tiles [qt0, qt0 + nqt) over all reference tiles, sliced by choose_slices */
    auto grid = [&](int64_t qt0, int64_t nqt) {
        MmaParams q = p;
        q.qt0 = (int)qt0;
        int64_t Z = choose_slices(nqt, RT, sms);
        q.tiles_per_cta = (int)((RT + Z - 1) / Z);
        Z = (RT + q.tiles_per_cta - 1) / q.tiles_per_cta;
        const int64_t last_rows = p.qs - (qt0 + nqt - 1) * kBM; /* rows of the grid's last tile */
        void (*const k)(const MmaParams) = last_rows > kBM / 2 ? kfull : kern;
        k<<<dim3((unsigned)nqt, (unsigned)Z), kFfThreads, fsm, st>>>(q);
        return cudaGetLastError();
    };
    /* A last tile of at most kBM / 2 queries has idle warps, so its CTAs end early
     * and their SMs run out of work before the others, which leaves a wave's tail idle.
     * Where the grid is many waves, the full tiles get a grid of their own, sliced into
     * whole waves, and the light tile follows in a second one (a fuller last tile stays
     * in the grid: split, it ran slower). */
    const int64_t full = p.qs / kBM, rest = p.qs % kBM;
    if (full > 0 && rest > 0 && rest <= kBM / 2 && full * RT >= 32 * (int64_t)sms) {
        const cudaError_t e1 = grid(0, full);
        return e1 != cudaSuccess ? e1 : grid(full, 1);
    }
    return grid(0, qt);
}

size_t ffma_smem_bytes(int64_t d)
{
    const int64_t dpad = (d + kFfBK - 1) / kFfBK * kFfBK;
    return sizeof(float) * (size_t)(kBM * dpad + kFfStages * kFfBK * kFfPitch + kBM);
}

} // namespace xknn_cuda
