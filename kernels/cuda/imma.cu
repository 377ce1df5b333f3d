/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/imma.cu -- u8/i8 data with l2, euclidean or ip, and hamming on bit-packed
 * rows, exactly, on integer tensor cores (mma.sync m16n8k32 s8, or m16n8k256 b1 with
 * AND + popcount; int32 accumulation), with no distance tile in memory.
 *
 * EXACT VALUES
 * Rows are first rewritten as signed bytes (u8: v - 128, i8 as is; prep kernel) in rows of
 * dp = round_up(d, 128) bytes, zero-padded, with per-row sums s = sum x' and squares
 * n = sum x'^2 (int32). With acc = q'.x' from the tensor cores (exact: |acc| <= 16384 d
 * < 2^31 for d <= XKNN_INT8_EXACT_MAX_D):
 *   l2, euclidean   v = n_q + n_x - 2 acc   (the shift cancels)
 *   ip (u8)         q.x = acc + 128 (s_q + s_x) + 16384 d;   ip (i8): q.x = acc
 * Hamming is the l2 distance of the 0/1 vectors: rows stay packed (bits past d cleared),
 * n = popcount, acc = popcount(q AND x) from the b1 tensor cores, v = n_q + n_x - 2 acc.
 * Every value is an integer below 2^31, so its canonical float is (float)v (euclidean:
 * (float)sqrt((double)v)), the value the CPU's integer path reports. The selection works
 * on the ORDER value o (l2/euclidean: v; ip: -q.x) and its float F(o) (l2, ip: (float)o;
 * euclidean: (float)sqrt(o)), non-decreasing in o; results are ordered by (F(o), id).
 *
 * PIPELINE (the tensor-core path's, mma.cu, with exact values instead of bounds)
 *   pass A   tiles over the first nA references: per (query, group of kImmaGroup = 32
 *            references) the smallest o (a witness; groups are disjoint).
 *   select   tau = kk-th smallest witness; th = the largest integer with F(th) = F(tau):
 *            kk references have F(o) <= F(tau), so one with o > th cannot be in the top.
 *   pass B   tiles over all references; o <= th appends the reference (atomic slot).
 *   rescue   a query whose buffer overflowed is searched again exactly, every reference.
 *   resolve  the exact o of every candidate, stored as the encoded key of F(o); final.cu
 *            sorts and writes (ip: the value -F(o) = (float)q.x).
 *
 * THE KERNEL. 256 threads as 4 x 2 warps of 64 x 32 tiles (4 x 4 m16n8k32 mma, 64 int32
 * accumulators a thread, so two CTAs share an SM and one's epilogue overlaps the other's
 * tensor work); kBM = 256 queries resident in shared memory (rows of dp + 16
 * bytes: the two rows a quarter-warp reads hit disjoint banks), the references through a
 * 4-deep cp.async ring of 64 rows x 128 bytes (+16). In a 128-byte chunk thread t of a
 * quad takes bytes [32t, 32t + 32) of its rows for both operands, 8 per k-step: A and B
 * agree on the assignment, so it only permutes the (exact) integer sum.
 */
#include <limits.h>

#include "async_primitives.cuh"
#include "block_primitives.cuh"
#include "kernels.cuh"

namespace xknn_cuda {

namespace {

constexpr int kBM = 256, kWN = 32, kBN = 2 * kWN, kBK = 128, kStages = 4, kThreads = 256;
constexpr int kNI = kWN / 8; /* n8 blocks per warp tile */
constexpr int kGroup = kImmaGroup; /* witness group: one warp tile's columns */
static_assert(kGroup == kWN, "a witness group is one warp tile's columns");
constexpr int kRowB = kBK + 16; /* staged reference row: 16 bytes of padding, conflict-free */

__device__ __forceinline__ void mma_s8(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                       unsigned b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Bit-packed rows: the same fragment layout with 8 bits per byte, AND + popcount. */
__device__ __forceinline__ void mma_b1(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                       unsigned b1)
{
    asm("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <bool BIN>
__device__ __forceinline__ void mma_op(int (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                       unsigned b1)
{
    if (BIN)
        mma_b1(c, a0, a1, a2, a3, b0, b1);
    else
        mma_s8(c, a0, a1, a2, a3, b0, b1);
}

/* F(o): the float the order compares (see the header). */
__device__ __forceinline__ float order_float(long long o, int euclid)
{
    return euclid ? __double2float_rn(__dsqrt_rn((double)o)) : __ll2float_rn(o);
}

/* The order value in two parts: o = P_q - x, x = a acc - C_j (int32, exact), with
 *   l2, euclidean  a = 2, C_j = n_x,           P_q = n_q
 *   ip (u8)        a = 1, C_j = -128 s_x,      P_q = -(128 s_q + 16384 d)
 *   ip (i8)        a = 1, C_j = 0,             P_q = 0
 * so the epilogue's hot test is one multiply-add and a compare per pair. */
__device__ __forceinline__ int col_term(const ImmaParams &p, int64_t j)
{
    if (!p.ip) return p.rsq[j];
    return p.shift ? -128 * p.rsum[j] : 0;
}
__device__ __forceinline__ long long row_term(const ImmaParams &p, int q)
{
    if (!p.ip) return p.qsq[q];
    return p.shift ? -(128ll * p.qsum[q] + 16384ll * p.d) : 0ll;
}
__device__ __forceinline__ long long order_value(const ImmaParams &p, int acc, int q, int64_t j)
{
    return row_term(p, q) - (long long)((p.ip ? 1 : 2) * acc - col_term(p, j));
}

/* One 128-byte chunk kc of reference tile `tile` into a stage (128 rows of kRowB bytes);
 * rows >= n are zero-filled. */
__device__ __forceinline__ void load_stage(unsigned char *stage, const ImmaParams &p, int64_t tile, int kc)
{
    const int tid = (int)threadIdx.x;
#pragma unroll
    for (int i = 0; i < kBN * kBK / 16 / kThreads; ++i) {
        const int idx = tid + i * kThreads, row = idx >> 3, c = idx & 7;
        const int64_t j = tile * kBN + row;
        const bool ok = j < p.n;
        cp_async16(stage + row * kRowB + 16 * c, ok ? p.R + j * p.dp + kc * kBK + 16 * c : p.R, ok ? 16 : 0);
    }
}

/* Candidate j of query q into its global buffer: columns past n and the query itself
 * are dropped here; slots past cap only count (the buffer's overflow makes the query
 * re-run exactly). */
__device__ __forceinline__ void push_cand(const ImmaParams &p, int q, int64_t j)
{
    if (j >= p.n || (p.exclude && j == p.self_local0 + q)) return;
    const int pos = atomicAdd(p.cnt + q, 1);
    if (pos < p.cap) {
        Cand e;
        e.lo = -INFINITY;
        e.up = INFINITY;
        e.c = XKNN_CUDA_UNRESOLVED;
        e.idx = (int)j;
        p.cand[(int64_t)q * p.cap + pos] = e;
    }
}

/* The candidates of query q in mask (bit 2 b + c: column j0 + 8 b + c) */
__device__ __noinline__ void append(const ImmaParams &p, int q, int64_t j0, unsigned mask)
{
    for (; mask; mask &= mask - 1) {
        const int bit = __ffs(mask) - 1;
        push_cand(p, q, j0 + (bit >> 1) * 8 + (bit & 1));
    }
}

/* Per row of the CTA's query tile: pass A P_q; pass B R_q = P_q - th clamped to int32
 * (x >= R_q <=> o <= th; INT_MIN when every reference qualifies; INT_MAX + 1 for padding
 * rows and R_q > INT_MAX: never a candidate). */
template <int MODE>
__device__ __forceinline__ void stage_row_consts(long long *row_s, const ImmaParams &p, int q0)
{
    for (int r = (int)threadIdx.x; r < kBM; r += kThreads) {
        const int q = q0 + r;
        long long v = 0;
        if (MODE == 0) {
            v = q < p.qs ? row_term(p, q) : 0ll;
        } else {
            v = q < p.qs && p.th[q] != LLONG_MAX ? row_term(p, q) - p.th[q] : (q < p.qs ? (long long)INT_MIN : 1ll << 31);
            v = v < (long long)INT_MIN ? (long long)INT_MIN : (v > (long long)INT_MAX ? 1ll << 31 : v);
        }
        row_s[r] = v;
    }
}

/* The reference tiles [t0, t1) of tile width BN in slice blockIdx.y (p.tiles_per_cta
 * tiles each) of both kernels */
template <int BN>
__device__ __forceinline__ void slice_tiles(const ImmaParams &p, int64_t &t0, int64_t &t1)
{
    const int64_t RT = (p.n + BN - 1) / BN;
    t0 = (int64_t)blockIdx.y * p.tiles_per_cta;
    t1 = t0 + p.tiles_per_cta < RT ? t0 + p.tiles_per_cta : RT;
}

/* MODE 0: pass A (witnesses), 1: pass B (candidates). Grid (query tiles, reference
 * slices of tiles_per_cta tiles), 256 threads, dynamic shared memory imma_smem_bytes. */
template <int MODE, bool BIN>
__global__ __launch_bounds__(kThreads, 2) void imma_kernel(const ImmaParams p)
{
    extern __shared__ __align__(16) unsigned char sm[];
    const int qstride = (int)p.dp + 16;
    unsigned char *Qs = sm;                                /* kBM x qstride */
    unsigned char *Rs = Qs + kBM * qstride;                /* kStages x kBN x kRowB */
    long long *row_s = (long long *)(Rs + kStages * kBN * kRowB); /* kBM: per-row constant */

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;
    const int q0 = (int)blockIdx.x * kBM;
    int64_t t0, t1;
    slice_tiles<kBN>(p, t0, t1);
    if (t0 >= t1) return;
    const int KC = (int)(p.dp / kBK);
    const int64_t total = (t1 - t0) * KC;

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < total) load_stage(Rs + s * kBN * kRowB, p, t0 + s / KC, s % KC);
        cp_async_commit();
    }
    /* resident queries (rows past qs are zero) */
    for (int idx = tid; idx < kBM * (int)(p.dp / 16); idx += kThreads) {
        const int r = idx / (int)(p.dp / 16), c = idx - r * (int)(p.dp / 16);
        const int q = q0 + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (q < p.qs) v = *reinterpret_cast<const uint4 *>(p.Q + (int64_t)q * p.dp + 16 * c);
        *reinterpret_cast<uint4 *>(Qs + r * qstride + 16 * c) = v;
    }
    stage_row_consts<MODE>(row_s, p, q0);

    int acc[4][kNI][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0;

    const unsigned char *Aw = Qs + (wm * 64 + g) * qstride + 32 * t;
    const int boff = (wn * kWN + g) * kRowB + 32 * t;

#pragma unroll 1
    for (int64_t it = 0; it < total; ++it) {
        cp_async_wait<kStages - 2>();
        __syncthreads();
        {
            const int64_t nx = it + kStages - 1;
            if (nx < total) load_stage(Rs + (int)(nx % kStages) * kBN * kRowB, p, t0 + nx / KC, (int)(nx % KC));
            cp_async_commit();
        }
        const int kc = (int)(it % KC);
        const unsigned char *A = Aw + kc * kBK;
        const unsigned char *B = Rs + (int)(it % kStages) * kBN * kRowB + boff;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            uint4 a[4][2], b[kNI];
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                a[mi][0] = *reinterpret_cast<const uint4 *>(A + (mi * 16) * qstride + 16 * h);
                a[mi][1] = *reinterpret_cast<const uint4 *>(A + (mi * 16 + 8) * qstride + 16 * h);
            }
#pragma unroll
            for (int ni = 0; ni < kNI; ++ni) b[ni] = *reinterpret_cast<const uint4 *>(B + ni * 8 * kRowB + 16 * h);
            /* k-step 2h: bytes 32t + 16h .. +7 (a0/a2: row g, a1/a3: row g+8); 2h+1: the next 8 */
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < kNI; ++ni)
                    mma_op<BIN>(acc[mi][ni], a[mi][0].x, a[mi][1].x, a[mi][0].y, a[mi][1].y, b[ni].x, b[ni].y);
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < kNI; ++ni)
                    mma_op<BIN>(acc[mi][ni], a[mi][0].z, a[mi][1].z, a[mi][0].w, a[mi][1].w, b[ni].z, b[ni].w);
        }
        if (kc != KC - 1) continue;

        /* ---- epilogue of reference tile `tile` ---- */
        const int64_t tile = t0 + it / KC;
        const int64_t ref0 = tile * kBN + wn * kWN;
        const int a2 = p.ip ? 1 : 2;
        int cv[kNI][2]; /* C_j; columns past n: INT_MIN + 1 (x huge, masked below) */
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int64_t j = ref0 + ni * 8 + 2 * t + c;
                cv[ni][c] = j < p.n ? col_term(p, j) : 0;
            }
        if (MODE == 0) {
            const int64_t s0 = p.self_local0 + q0;
            const bool diag = p.exclude && ref0 < s0 + kBM && s0 < ref0 + kWN;
            const bool edge = ref0 + kWN > p.n;
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int r = wm * 64 + mi * 16 + g + 8 * hh;
                    const int q = q0 + r;
                    int mx = INT_MIN; /* max x over the row's 16 columns of this thread */
#pragma unroll
                    for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
                        for (int c = 0; c < 2; ++c) {
                            int x = a2 * acc[mi][ni][2 * hh + c] - cv[ni][c];
                            if (diag || edge) {
                                const int64_t j = ref0 + ni * 8 + 2 * t + c;
                                if (j >= p.n || (diag && j == p.self_local0 + q)) x = INT_MIN;
                            }
                            mx = max(mx, x);
                        }
                    mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const int64_t grp = ref0 / kGroup;
                    if (t == 0 && q < p.qs && grp < p.ga)
                        p.gmin[(int64_t)q * p.ga + grp] = mx == INT_MIN ? LLONG_MAX : row_s[r] - (long long)mx;
                }
        } else {
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int r = wm * 64 + mi * 16 + g + 8 * hh;
                    const long long R = row_s[r];
                    if (R > (long long)INT_MAX) continue; /* padding row or nothing qualifies */
                    const int Ri = (int)R;
                    int mx = INT_MIN;
#pragma unroll
                    for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
                        for (int c = 0; c < 2; ++c) mx = max(mx, a2 * acc[mi][ni][2 * hh + c] - cv[ni][c]);
                    if (mx < Ri) continue;
                    unsigned mask = 0; /* bit 2 ni + c */
#pragma unroll
                    for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
                        for (int c = 0; c < 2; ++c)
                            mask |= (unsigned)(a2 * acc[mi][ni][2 * hh + c] - cv[ni][c] >= Ri) << (2 * ni + c);
                    append(p, q0 + r, ref0 + 2 * t, mask);
                }
        }
#pragma unroll
        for (int mi = 0; mi < 4; ++mi)
#pragma unroll
            for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0;
    }
    cp_async_wait<0>();
}

/* ---- Hopper: warp-specialized wgmma (sm_90a code, compute capability 9.0) ------------
 * The same passes as imma_kernel (same witnesses, thresholds and candidates: only the
 * schedule differs), as mma.cu's wgmma_ws_kernel runs the TF32 ones. 384 threads:
 *   producer  (warpgroup 0, 56 registers) streams 128-byte chunks of 128 reference rows
 *             (16 KB) by cp.async into an S-deep ring, 128-byte swizzled; each stage has
 *             a `full` mbarrier (its 128 threads' copies) and an `empty` one (the 8
 *             consumer warps);
 *   consumers (warpgroups 1 and 2, 224 registers): 128 resident queries each (kWsBM =
 *             256, swizzled like the chunks), wgmma m64n128k32 s8 with int32 accumulators
 *             (exact), taking turns on the tensor cores (named barriers 1 and 2) so that
 *             one's epilogue runs while the other's wgmma execute.
 * A reference tile is kWsBN = 128 columns; witness groups stay kImmaGroup = 32 columns
 * (4 per tile). Launch: grid (query tiles of 256, reference slices), 384 threads, S
 * stages from the shared memory left after the queries (11 at d <= 128). */
constexpr int kWsBM = 256, kWsBN = 128, kWsThreads = 384, kWsMaxStages = 12, kWsChunk = 128;
/* Pass B's candidates are staged in shared memory, kWarpStage (reference id, query row)
 * per consumer warp, and the warp moves them to the global buffers (one atomic each, all
 * in flight) once half full and at the end: a global atomic per candidate in the
 * epilogue stalled the warpgroup for its round trip (a fifth of the consumers' time at
 * u8 W1). Each warp touches only its own stage, ordered by __syncwarp. */
constexpr int kWarpStage = 256, kWsStageWarps = 8;
static_assert(kWsBN % kGroup == 0, "witness groups inside a tile");

__host__ __device__ constexpr size_t ws_smem_bytes(int64_t dp, int S)
{
    return (size_t)(kWsBM * dp + (int64_t)S * kWsBN * kWsChunk) + sizeof(long long) * kWsBM +
           2 * kWsMaxStages * sizeof(uint64_t) + (size_t)kWsStageWarps * (16 + kWarpStage * (sizeof(int) + 1)) + 1024;
}

#ifdef XKNN__HAVE_WGMMA
/* d[64] = A (64 x 32 bytes, descriptor) * B (32 x 128 bytes, descriptor) + (acc ? d : 0):
 * s8 in, exact s32 */
__device__ __forceinline__ void wgmma_m64n128k32_s8(int (&d)[64], uint64_t da, uint64_t db, int acc)
{
    asm volatile("{\n"
                 ".reg .pred sd;\n"
                 "setp.ne.b32 sd, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
                 "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "
                 "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
                 "%56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, sd;\n"
                 "}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
                 "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
                 "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
                 "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
                 "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
                 "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
                 "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
                 "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
                 : "l"(da), "l"(db), "r"(acc)
                 : "memory");
}

/* The producer's copy of chunk kc (bytes [128 kc, 128 kc + 128) of each row) of reference
 * tile `tile`: row j's 128 bytes at 128 j, its 16-byte piece c at piece c ^ (j % 8); rows
 * >= n zero-filled. Thread tid (< 128) copies piece (tid / 8) % 8 of rows
 * 8 (tid / 64) + tid % 8 + 16 i, i < 8. */
__device__ __forceinline__ void ws_load_chunk(unsigned char *stage, const ImmaParams &p, int64_t tile, int kc, int tid)
{
    const int jr = tid & 7, c4 = (tid >> 3) & 7, jg = tid >> 6;
    const int64_t j = tile * kWsBN + jg * 8 + jr;
    const signed char *src = p.R + j * p.dp + kc * kWsChunk + 16 * c4;
    const int64_t step = 16 * p.dp;
    unsigned char *dst = stage + (jg * 8 + jr) * kWsChunk + ((c4 ^ jr) << 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const bool ok = j + 16 * i < p.n;
        cp_async16(dst + 16 * kWsChunk * i, ok ? (const void *)src : (const void *)p.R, ok ? 16 : 0);
        src += step;
    }
}

/* Candidates of query row r (bit 2 nb + c of mask: column j0 + 8 nb + c) into the
 * warp's stage; what does not fit goes straight to the global buffers (append). */
__device__ __forceinline__ void stage_cands(const ImmaParams &p, int *wcount, int *sj, unsigned char *sq, int q0,
                                            int r, int64_t j0, unsigned mask)
{
    int pos = atomicAdd(wcount, __popc(mask));
    for (; mask; mask &= mask - 1, ++pos) {
        const int bit = __ffs(mask) - 1;
        if (pos < kWarpStage) {
            sj[pos] = (int)(j0 + (bit >> 1) * 8 + (bit & 1));
            sq[pos] = (unsigned char)r;
        } else {
            append(p, q0 + r, j0, 1u << bit);
        }
    }
}

/* The warp's staged candidates to the global buffers; the stage is empty after. Called
 * by all 32 lanes. */
__device__ __forceinline__ void flush_stage(const ImmaParams &p, int *wcount, const int *sj, const unsigned char *sq,
                                            int q0, int lane)
{
    __syncwarp();
    const int ns = *wcount < kWarpStage ? *wcount : kWarpStage;
    for (int i = lane; i < ns; i += 32) push_cand(p, q0 + sq[i], sj[i]);
    __syncwarp();
    if (lane == 0) *wcount = 0;
    __syncwarp();
}
#endif

template <int MODE>
__global__ __launch_bounds__(kWsThreads, 1) void imma_ws_kernel(const ImmaParams p, int S)
{
#ifdef XKNN__HAVE_WGMMA
    extern __shared__ __align__(16) unsigned char ws_raw[];
    /* the swizzle follows address bits: operands start 1024-aligned */
    unsigned char *Qs =
        reinterpret_cast<unsigned char *>((reinterpret_cast<uintptr_t>(ws_raw) + 1023) & ~(uintptr_t)1023);
    unsigned char *Rs = Qs + kWsBM * p.dp; /* S x kWsBN x kWsChunk */
    long long *row_s = reinterpret_cast<long long *>(Rs + (int64_t)S * kWsBN * kWsChunk);
    uint64_t *full = reinterpret_cast<uint64_t *>(row_s + kWsBM);
    uint64_t *empty = full + kWsMaxStages;
    /* mode 1: consumer warp w's stage: count (16 bytes), kWarpStage ids, kWarpStage rows */
    char *stage_base = reinterpret_cast<char *>(empty + kWsMaxStages);

    const int tid = (int)threadIdx.x, warp = tid >> 5;
    const int role = warp >> 2; /* 0 producer, 1 and 2 consumers */
    const int q0 = (int)blockIdx.x * kWsBM;
    int64_t t0, t1;
    slice_tiles<kWsBN>(p, t0, t1);
    if (t0 >= t1) return;
    const int KC = (int)(p.dp / kWsChunk);
    const int64_t total = (t1 - t0) * KC;

    if (tid == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(full + s, 128); /* the producer's threads, one cp.async arrival each */
            mbar_init(empty + s, 8);  /* the consumer warps */
        }
        for (int w = 0; w < kWsStageWarps; ++w)
            *reinterpret_cast<int *>(stage_base + (size_t)w * (16 + kWarpStage * (sizeof(int) + 1))) = 0;
    }
    __syncthreads();

    if (role == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
#pragma unroll 1
        for (int64_t it = 0; it < total; ++it) {
            const int s = (int)(it % S);
            const int round = (int)(it / S);
            if (round > 0) mbar_wait(empty + s, (unsigned)((round - 1) & 1));
            ws_load_chunk(Rs + s * kWsBN * kWsChunk, p, t0 + it / KC, (int)(it % KC), tid);
            mbar_arrive_cp_async(full + s);
        }
        cp_async_wait<0>();
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
    const int ctid = tid - 128; /* 0..255 */
    const int lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wg = role - 1, wi = warp & 3;
    char *my_stage = stage_base + (size_t)(warp - 4) * (16 + kWarpStage * (sizeof(int) + 1));
    int *wcount = reinterpret_cast<int *>(my_stage);
    int *sj = reinterpret_cast<int *>(my_stage + 16);
    unsigned char *sq = reinterpret_cast<unsigned char *>(sj + kWarpStage);
    /* queries: chunk kc of row r at (kc kWsBM + r) 128 bytes, piece c at c ^ (r % 8);
     * rows past qs are zero */
    {
        const int pieces = (int)(p.dp / 16);
        for (int idx = ctid; idx < kWsBM * pieces; idx += 256) {
            const int r = idx / pieces, c = idx - r * pieces;
            const int q = q0 + r;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (q < p.qs) v = __ldg(reinterpret_cast<const uint4 *>(p.Q + (int64_t)q * p.dp + 16 * c));
            *reinterpret_cast<uint4 *>(Qs + ((c >> 3) * kWsBM + r) * kWsChunk + (((c & 7) ^ (r & 7)) << 4)) = v;
        }
    }
    for (int r = ctid; r < kWsBM; r += 256) {
        const int q = q0 + r;
        long long v = 0;
        if (MODE == 0) {
            v = q < p.qs ? row_term(p, q) : 0ll;
        } else {
            /* R as stage_row_consts; the epilogue tests acc + ncol_j >= Rh: l2 and
             * euclidean Rh = floor(R / 2) = ceil((R - 1) / 2), ip Rh = R; INT_MAX never */
            v = q < p.qs && p.th[q] != LLONG_MAX ? row_term(p, q) - p.th[q]
                                                 : (q < p.qs ? (long long)INT_MIN : 1ll << 31);
            v = v < (long long)INT_MIN ? (long long)INT_MIN : v;
            v = v > (long long)INT_MAX ? (long long)INT_MAX : p.ip ? v : v >> 1;
        }
        row_s[r] = v;
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* the queries, for the async proxy */
    named_sync(3, 256); /* the queries and row constants are in place */

    int acc[2][64];
#pragma unroll
    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[mb][e] = 0;
    const unsigned char *Am[2] = {Qs + (wg * 128) * kWsChunk, Qs + (wg * 128 + 64) * kWsChunk};
    int64_t it = 0;
#pragma unroll 1
    for (int64_t tile = t0; tile < t1; ++tile) {
        /* the tile's column terms load while this consumer waits for its turn and data */
        const int64_t ref0 = tile * kWsBN;
        int nc[16][2];
#pragma unroll
        for (int nb = 0; nb < 16; ++nb) {
            const int2 v = __ldg(reinterpret_cast<const int2 *>(p.ncol + ref0 + nb * 8 + 2 * t));
            nc[nb][0] = v.x;
            nc[nb][1] = v.y;
        }
        __syncwarp(); /* bar.sync counts whole warps: converge after the epilogue's branches */
        if (wg == 1 || tile != t0) named_sync(wg == 0 ? 1 : 2, 256); /* this consumer's turn */
        int prev = -1;
#pragma unroll 1
        for (int kc = 0; kc < KC; ++kc, ++it) {
            const int s = (int)(it % S);
            mbar_wait(full + s, (unsigned)((it / S) & 1));
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            const unsigned char *Bst = Rs + s * kWsBN * kWsChunk;
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int k4 = 0; k4 < kWsChunk / 32; ++k4) {
                /* k-step k4 is 32 bytes into each swizzled row */
                const uint64_t db = gmma_desc_sw128(Bst + 32 * k4);
#pragma unroll
                for (int mb = 0; mb < 2; ++mb)
                    wgmma_m64n128k32_s8(acc[mb], gmma_desc_sw128(Am[mb] + kc * kWsBM * kWsChunk + 32 * k4), db,
                                        kc | k4); /* a tile's first k-step overwrites */
            }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            if (prev >= 0) {
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                __syncwarp(); /* the warp's earlier shared reads precede lane 0's release */
                if (lane == 0) mbar_arrive(empty + prev);
            }
            prev = s;
        }
        /* the other consumer's turn: consumer 1 does not signal after the last tile */
        if (wg == 0)
            named_arrive(2, 256);
        else if (tile + 1 < t1)
            named_arrive(1, 256);
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + prev);

        /* ---- epilogue: element 4 nb + 2 hh + c of acc[mb] is row wg 128 + mb 64 + wi 16 +
         * g + 8 hh, column nb 8 + 2 t + c of the tile. acc + ncol_j is x / a (ip: exact;
         * l2, euclidean: x / 2 rounded down), one add-max per pair (sm_90's fused
         * VIADDMNMX), so every test below is conservative: a pass A witness is never
         * below its group's smallest o, a pass B candidate set holds every o <= th. ---- */
        if (MODE == 0) {
            const int64_t s0 = p.self_local0 + q0;
            const bool diag = p.exclude && ref0 < s0 + kWsBM && s0 < ref0 + kWsBN;
            const bool edge = ref0 + kWsBN > p.n; /* pass A: columns past nA are real references */
#pragma unroll
            for (int mb = 0; mb < 2; ++mb)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int r = wg * 128 + mb * 64 + wi * 16 + g + 8 * hh;
                    const int q = q0 + r;
                    int mx[4] = {INT_MIN, INT_MIN, INT_MIN, INT_MIN}; /* per group of 32 columns */
                    if (diag || edge) {
#pragma unroll
                        for (int nb = 0; nb < 16; ++nb)
#pragma unroll
                            for (int c = 0; c < 2; ++c) {
                                const int64_t j = ref0 + nb * 8 + 2 * t + c;
                                if (j < p.n && !(diag && j == p.self_local0 + q))
                                    mx[nb >> 2] = max(acc[mb][4 * nb + 2 * hh + c] + nc[nb][c], mx[nb >> 2]);
                            }
                    } else {
#pragma unroll
                        for (int nb = 0; nb < 16; ++nb)
#pragma unroll
                            for (int c = 0; c < 2; ++c)
                                mx[nb >> 2] = max(acc[mb][4 * nb + 2 * hh + c] + nc[nb][c], mx[nb >> 2]);
                    }
#pragma unroll
                    for (int gi = 0; gi < 4; ++gi) {
                        mx[gi] = max(mx[gi], __shfl_xor_sync(0xffffffffu, mx[gi], 1));
                        mx[gi] = max(mx[gi], __shfl_xor_sync(0xffffffffu, mx[gi], 2));
                    }
                    /* lane t of the quad writes group t */
                    const int m = t == 0 ? mx[0] : t == 1 ? mx[1] : t == 2 ? mx[2] : mx[3];
                    const int64_t grp = ref0 / kGroup + t;
                    if (q < p.qs && grp < p.ga)
                        p.gmin[(int64_t)q * p.ga + grp] =
                            m == INT_MIN ? LLONG_MAX : row_s[r] - (long long)(p.ip ? 1 : 2) * (long long)m;
                }
        } else {
#pragma unroll
            for (int mb = 0; mb < 2; ++mb)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int r = wg * 128 + mb * 64 + wi * 16 + g + 8 * hh;
                    const int Rh = (int)row_s[r];
                    int m0 = INT_MIN, m1 = INT_MIN; /* two chains */
#pragma unroll
                    for (int nb = 0; nb < 16; nb += 2)
#pragma unroll
                        for (int c = 0; c < 2; ++c) {
                            m0 = max(acc[mb][4 * nb + 2 * hh + c] + nc[nb][c], m0);
                            m1 = max(acc[mb][4 * nb + 4 + 2 * hh + c] + nc[nb + 1][c], m1);
                        }
                    if (max(m0, m1) < Rh) continue;
                    unsigned mask = 0; /* bit 2 nb + c */
#pragma unroll
                    for (int nb = 0; nb < 16; ++nb)
#pragma unroll
                        for (int c = 0; c < 2; ++c)
                            mask |= (unsigned)(acc[mb][4 * nb + 2 * hh + c] + nc[nb][c] >= Rh) << (2 * nb + c);
                    stage_cands(p, wcount, sj, sq, q0, r, ref0 + 2 * t, mask);
                }
            __syncwarp();
            if (*wcount >= kWarpStage / 2) flush_stage(p, wcount, sj, sq, q0, lane);
        }
    }
    if (MODE == 1) flush_stage(p, wcount, sj, sq, q0, lane);
#else
    (void)p;
    (void)S;
    __trap(); /* never launched: the host takes this kernel only for sm_90a code */
#endif
}

/* ncol_j of imma_ws_kernel's epilogue for j < cols (a multiple of kWsBN): l2 and
 * euclidean -ceil(n_x / 2), ip -C_j (u8: 128 s_x, i8: 0); -INT_MAX past n. */
__global__ __launch_bounds__(kBlock) void imma_cols_kernel(const ImmaParams p, int64_t cols)
{
    for (int64_t j = (int64_t)blockIdx.x * kBlock + threadIdx.x; j < cols; j += (int64_t)gridDim.x * kBlock)
        p.ncol[j] = j >= p.n ? -INT_MAX : !p.ip ? -((p.rsq[j] + 1) >> 1) : p.shift ? 128 * p.rsum[j] : 0;
}

/* Stages of imma_ws_kernel that fit in `optin` bytes (at most kWsMaxStages); 0 when
 * fewer than 3 fit (imma_kernel then). */
int ws_stages(int64_t dp, size_t optin)
{
    int S = kWsMaxStages;
    while (S >= 3 && ws_smem_bytes(dp, S) > optin) --S;
    return S >= 3 ? S : 0;
}

/* Rows of any u8/i8 layout -> signed rows of dp bytes (u8: v ^ 0x80 = v - 128), zero
 * padding; per row the sum and the sum of squares. One warp per row. */
__global__ __launch_bounds__(kBlock) void imma_prep_kernel(const unsigned char *X, int64_t ld, int64_t rows, int64_t d,
                                                           int64_t dp, int shift, signed char *out, int *sum, int *sq)
{
    const int64_t row = (int64_t)blockIdx.x * kWarpsPerBlock + warp_id();
    if (row >= rows) return;
    const unsigned char *x = X + row * ld;
    signed char *o = out + row * dp;
    int s = 0, s2 = 0;
    for (int64_t t = lane_id(); t < dp; t += kWarp) {
        int v = 0;
        if (t < d) v = shift ? (int)x[t] - 128 : (int)(signed char)x[t];
        o[t] = (signed char)v;
        s += v;
        s2 += v * v;
    }
    s = __reduce_add_sync(0xffffffffu, s);
    s2 = __reduce_add_sync(0xffffffffu, s2);
    if (lane_id() == 0) {
        sum[row] = s;
        sq[row] = s2;
    }
}

/* Bit-packed rows (words 64-bit words at stride ld words, bits >= d ignored) -> rows of
 * dp bytes with the bits past d cleared and zero padding; sq = the popcount (= the sum of
 * squares of the 0/1 vector: hamming is the l2 distance of the unpacked bits). */
__global__ __launch_bounds__(kBlock) void imma_prep_bin_kernel(const unsigned long long *X, int64_t ld, int64_t rows,
                                                               int64_t d, int64_t dp, unsigned long long *out, int *sum,
                                                               int *sq)
{
    const int64_t row = (int64_t)blockIdx.x * kWarpsPerBlock + warp_id();
    if (row >= rows) return;
    const int64_t words = (d + 63) / 64, ow = dp / 8;
    int s2 = 0;
    for (int64_t w = lane_id(); w < ow; w += kWarp) {
        unsigned long long v = 0;
        if (w < words) {
            v = X[row * ld + w];
            if (w == words - 1 && (d & 63)) v &= (1ull << (d & 63)) - 1ull;
        }
        out[row * ow + w] = v;
        s2 += __popcll(v);
    }
    s2 = __reduce_add_sync(0xffffffffu, s2);
    if (lane_id() == 0) {
        sum[row] = 0;
        sq[row] = s2;
    }
}

/* Per query: tau = kk-th smallest witness (radix select on o + 2^63 as unsigned), th =
 * the largest integer with F(th) = F(tau) (LLONG_MAX, every reference, when fewer than
 * kk groups exist). One block per query, grid-stride. */
__global__ __launch_bounds__(kBlock) void imma_select_kernel(const ImmaParams p, int kk)
{
    __shared__ BlockRadixSelect<unsigned long long>::TempStorage sm;
    for (int q = (int)blockIdx.x; q < p.qs; q += (int)gridDim.x) {
        const long long *w = p.gmin + (int64_t)q * p.ga;
        long long th = LLONG_MAX;
        if (p.ga >= kk) {
            const unsigned long long K = BlockRadixSelect<unsigned long long>::select(
                sm,
                [&](auto f) {
                    for (int64_t i = threadIdx.x; i < p.ga; i += kBlock) f((unsigned long long)w[i] ^ (1ull << 63));
                },
                kk);
            const long long tau = (long long)(K ^ (1ull << 63));
            if (tau != LLONG_MAX) {
                const float ft = order_float(tau, p.euclid);
                th = tau;
                while (th < (1ll << 40) && order_float(th + 1, p.euclid) == ft) ++th;
            }
        }
        if (threadIdx.x == 0) p.th[q] = th;
        __syncthreads();
    }
}

/* o of query q (state index) and reference j, on the CUDA cores. */
__device__ __forceinline__ long long exact_order(const ImmaParams &p, int q, int64_t j)
{
    const int *a = reinterpret_cast<const int *>(p.Q + (int64_t)q * p.dp);
    const int *b = reinterpret_cast<const int *>(p.R + j * p.dp);
    int acc = 0;
    if (p.bin)
        for (int64_t i = 0; i < p.dp / 4; ++i) acc += __popc((unsigned)(a[i] & b[i]));
    else
        for (int64_t i = 0; i < p.dp / 4; ++i) acc = __dp4a(a[i], b[i], acc);
    return order_value(p, acc, q, j);
}

__device__ __forceinline__ unsigned long long cand_key_of(const ImmaParams &p, long long o, int64_t j)
{
    return ((unsigned long long)order_enc(order_float(o, p.euclid)) << 32) | (unsigned)j;
}

/* Overflowed queries: every reference, exact keys, the buffer cut to its top kk by key
 * whenever the next 256 would not fit (cap >= kk + 256). Then every candidate of every
 * query gets its encoded key (resolve). One block per query, grid-stride. */
union ImmaRescueSm {
    BlockScan::TempStorage scan;
    BlockRadixSelect<unsigned long long>::TempStorage sel;
};

__global__ __launch_bounds__(kBlock) void imma_finish_kernel(const ImmaParams p, int kk)
{
    __shared__ ImmaRescueSm sm;
    const int tid = (int)threadIdx.x;
    for (int q = (int)blockIdx.x; q < p.qs; q += (int)gridDim.x) {
        Cand *seg = p.cand + (int64_t)q * p.cap;
        const int c0 = p.cnt[q];
        if (c0 <= p.cap) {
            for (int i = tid; i < c0; i += kBlock) {
                const int64_t j = seg[i].idx;
                seg[i].c = __uint_as_float((unsigned)(cand_key_of(p, exact_order(p, q, j), j) >> 32));
            }
            if (tid == 0) atomicAdd(p.stats + kStatAppended, (unsigned long long)c0);
            __syncthreads();
            continue;
        }
        if (tid == 0) atomicAdd(p.stats + kStatReruns, 1ull);
        const int64_t self = p.exclude ? p.self_local0 + q : -1;
        unsigned long long K = ~0ull; /* keys must be below it */
        int bc = 0;
        for (int64_t b = 0; b < p.n; b += kBlock) {
            const int64_t j = b + tid;
            unsigned long long key = ~0ull;
            if (j < p.n && j != self) key = cand_key_of(p, exact_order(p, q, j), j);
            bool take = key < K;
            int total;
            int pos = BlockScan::exclusive(sm.scan, take ? 1 : 0, total);
            if (bc + total > p.cap) {
                K = BlockRadixSelect<unsigned long long>::select(
                    sm.sel,
                    [&](auto f) {
                        for (int i = tid; i < bc; i += kBlock) f(make_key(seg[i].c, seg[i].idx));
                    },
                    kk);
                bc = compact_cands(sm.scan, seg, bc, [&](Cand &e) { return make_key(e.c, e.idx) <= K; });
                take = key < K;
                pos = BlockScan::exclusive(sm.scan, take ? 1 : 0, total);
            }
            if (take) {
                Cand e;
                e.lo = -INFINITY;
                e.up = 0.0f;
                e.c = __uint_as_float((unsigned)(key >> 32));
                e.idx = (int)j;
                seg[bc + pos] = e;
            }
            bc += total;
            __syncthreads();
        }
        if (tid == 0) {
            p.cnt[q] = bc;
            atomicAdd(p.stats + kStatAppended, (unsigned long long)bc);
        }
        __syncthreads();
    }
}

/* A pass's grid: *qt query tiles of bm rows by Z slices (choose_slices) of the
 * reference tiles of bn columns; sets q.tiles_per_cta (slice_tiles reads it), returns Z */
int64_t slice_grid(ImmaParams &q, int64_t bm, int64_t bn, int sms, int64_t *qt)
{
    *qt = (q.qs + bm - 1) / bm;
    const int64_t RT = (q.n + bn - 1) / bn;
    const int64_t Z = choose_slices(*qt, RT, sms);
    q.tiles_per_cta = (int)((RT + Z - 1) / Z);
    return (RT + q.tiles_per_cta - 1) / q.tiles_per_cta;
}

template <int MODE, bool BIN>
cudaError_t launch_pass(const ImmaParams &p, int sms, cudaStream_t st)
{
    if (!BIN && p.wgmma_optin > 0) {
        const int S = ws_stages(p.dp, (size_t)p.wgmma_optin);
        if (S) {
            const size_t wsm = ws_smem_bytes(p.dp, S);
            cudaError_t e =
                cudaFuncSetAttribute(imma_ws_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wsm);
            if (e != cudaSuccess) return e;
            ImmaParams q = p;
            int64_t qt;
            const int64_t Z = slice_grid(q, kWsBM, kWsBN, sms, &qt);
            imma_ws_kernel<MODE><<<dim3((unsigned)qt, (unsigned)Z), kWsThreads, wsm, st>>>(q, S);
            return cudaGetLastError();
        }
    }
    const size_t smem = imma_smem_bytes(p.dp);
    cudaError_t e =
        cudaFuncSetAttribute(imma_kernel<MODE, BIN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    ImmaParams q = p;
    int64_t qt;
    const int64_t Z = slice_grid(q, kBM, kBN, sms, &qt);
    imma_kernel<MODE, BIN><<<dim3((unsigned)qt, (unsigned)Z), kThreads, smem, st>>>(q);
    return cudaGetLastError();
}

} // namespace

size_t imma_ncol_entries(int64_t n) { return (size_t)((n + kWsBN - 1) / kWsBN * kWsBN); }

size_t imma_smem_bytes(int64_t dp)
{
    return (size_t)(kBM * (dp + 16) + kStages * kBN * kRowB) + sizeof(long long) * kBM;
}

cudaError_t launch_imma_prep(const void *X, int64_t ld, int64_t rows, int64_t d, int64_t dp, int shift,
                             signed char *out, int *sum, int *sq, cudaStream_t st)
{
    if (rows <= 0) return cudaSuccess;
    const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    if (shift < 0) { /* bit-packed rows: ld in words, d in bits */
        imma_prep_bin_kernel<<<(unsigned)blocks, kBlock, 0, st>>>((const unsigned long long *)X, ld, rows, d, dp,
                                                                 (unsigned long long *)out, sum, sq);
        return cudaGetLastError();
    }
    imma_prep_kernel<<<(unsigned)blocks, kBlock, 0, st>>>((const unsigned char *)X, ld, rows, d, dp, shift, out, sum,
                                                         sq);
    return cudaGetLastError();
}

cudaError_t launch_imma(const ImmaParams &p, int kk, int sms, cudaStream_t st)
{
    if (p.n <= 0 || p.qs <= 0) return cudaSuccess;
    ImmaParams a = p;
    a.n = p.nA;
    if (!p.bin && p.wgmma_optin > 0 && p.ncol) {
        const int64_t cols = (p.n + kWsBN - 1) / kWsBN * kWsBN;
        const int64_t blocks = (cols + kBlock - 1) / kBlock;
        imma_cols_kernel<<<(unsigned)(blocks < 16 * sms ? blocks : 16 * sms), kBlock, 0, st>>>(p, cols);
        cudaError_t e0 = cudaGetLastError();
        if (e0 != cudaSuccess) return e0;
    } else {
        a.wgmma_optin = 0; /* imma_kernel */
    }
    cudaError_t e = p.bin ? launch_pass<0, true>(a, sms, st) : launch_pass<0, false>(a, sms, st);
    if (e != cudaSuccess) return e;
    imma_select_kernel<<<p.qs < 8 * sms ? p.qs : 8 * sms, kBlock, 0, st>>>(p, kk);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    ImmaParams b = p;
    b.wgmma_optin = a.wgmma_optin;
    if ((e = p.bin ? launch_pass<1, true>(b, sms, st) : launch_pass<1, false>(b, sms, st)) != cudaSuccess) return e;
    imma_finish_kernel<<<p.qs < 4 * sms ? p.qs : 4 * sms, kBlock, 0, st>>>(p, kk);
    return cudaGetLastError();
}

} // namespace xknn_cuda
