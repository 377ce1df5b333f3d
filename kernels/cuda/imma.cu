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

__device__ __noinline__ void append(const ImmaParams &p, int q, int64_t j0, unsigned mask)
{
    const int64_t self = p.exclude ? p.self_local0 + q : -1;
    while (mask) {
        const int bit = __ffs(mask) - 1;
        mask &= mask - 1;
        const int64_t j = j0 + (bit >> 1) * 8 + (bit & 1);
        if (j >= p.n || j == self) continue;
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
    const int64_t RT = (p.n + kBN - 1) / kBN;
    const int64_t t0 = (int64_t)blockIdx.y * p.tiles_per_cta;
    const int64_t t1 = t0 + p.tiles_per_cta < RT ? t0 + p.tiles_per_cta : RT;
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

template <int MODE, bool BIN>
cudaError_t launch_pass(const ImmaParams &p, int sms, cudaStream_t st)
{
    const size_t smem = imma_smem_bytes(p.dp);
    cudaError_t e =
        cudaFuncSetAttribute(imma_kernel<MODE, BIN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const int64_t qt = (p.qs + kBM - 1) / kBM;
    const int64_t RT = (p.n + kBN - 1) / kBN;
    int64_t Z = choose_slices(qt, RT, sms);
    ImmaParams q = p;
    q.tiles_per_cta = (int)((RT + Z - 1) / Z);
    Z = (RT + q.tiles_per_cta - 1) / q.tiles_per_cta;
    imma_kernel<MODE, BIN><<<dim3((unsigned)qt, (unsigned)Z), kThreads, smem, st>>>(q);
    return cudaGetLastError();
}

} // namespace

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
    cudaError_t e = p.bin ? launch_pass<0, true>(a, sms, st) : launch_pass<0, false>(a, sms, st);
    if (e != cudaSuccess) return e;
    imma_select_kernel<<<p.qs < 8 * sms ? p.qs : 8 * sms, kBlock, 0, st>>>(p, kk);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if ((e = p.bin ? launch_pass<1, true>(p, sms, st) : launch_pass<1, false>(p, sms, st)) != cudaSuccess) return e;
    imma_finish_kernel<<<p.qs < 4 * sms ? p.qs : 4 * sms, kBlock, 0, st>>>(p, kk);
    return cudaGetLastError();
}

} // namespace xknn_cuda
