/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/warp_primitives.cuh -- thread and warp layer.
 *
 *   warp_inclusive_sum      shuffle scan of one int per lane
 *   warp_rank_bin           radix-select step: the bin of a 256-bin histogram holding
 *                           the r-th key, and the key's rank within it
 *   WarpBitonic64           sort of up to 64 unique 64-bit keys, 2 per lane, registers
 *                           only (every register index is a compile-time constant)
 *   WarpCanonical           canonical values (squared distances, ip, cosine) of one
 *                           query to up to 32 reference rows, one row per lane,
 *                           dimension order, double
 *   WarpKeys<R>             sort / bitonic clean / merge of 32R 64-bit keys held striped
 *                           in registers (element i: lane i % 32, register i / 32)
 *
 * All functions must be called by the 32 lanes of a warp together (full mask).
 */
#ifndef XKNN_CUDA_WARP_PRIMITIVES_CUH
#define XKNN_CUDA_WARP_PRIMITIVES_CUH

#include "common.cuh"
#include "xknn/impl/canonical_math.h"

namespace xknn_cuda {

__device__ __forceinline__ int lane_id() { return (int)(threadIdx.x & (kWarp - 1)); }
__device__ __forceinline__ int warp_id() { return (int)(threadIdx.x / kWarp); }

/* The sum of v over the warp, on every lane: a butterfly of correctly rounded double
 * additions (the same order on every run). */
__device__ __forceinline__ double warp_sum(double v)
{
#pragma unroll
    for (int o = kWarp / 2; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int warp_inclusive_sum(int v)
{
    const int lane = lane_id();
#pragma unroll
    for (int o = 1; o < kWarp; o <<= 1) {
        const int t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    return v;
}

/* One radix-select step over hist[0, kRadixBins) (lane l reads bins kPer l .. kPer l +
 * kPer - 1): *bin = the bin holding the r-th key (1-based), *rank = that key's rank
 * within the bin; on every lane. When r exceeds the total (the callers guarantee it
 * does not) the last bin is taken. */
__device__ __forceinline__ void warp_rank_bin(const int *hist, int r, int *bin, int *rank)
{
    constexpr int kPer = kRadixBins / kWarp;
    const int lane = lane_id();
    int c[kPer], sum = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        c[j] = hist[lane * kPer + j];
        sum += c[j];
    }
    const int incl = warp_inclusive_sum(sum), excl = incl - sum;
    const unsigned hit = __ballot_sync(0xffffffffu, excl < r && r <= incl);
    const int owner = hit ? __ffs(hit) - 1 : kWarp - 1;
    int b = kPer - 1, rr = r - excl;
    bool found = false;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        if (!found) {
            if (rr <= c[j]) {
                b = j;
                found = true;
            } else {
                rr -= c[j];
            }
        }
    }
    *bin = owner * kPer + __shfl_sync(0xffffffffu, b, owner);
    *rank = __shfl_sync(0xffffffffu, rr, owner);
}

/* Bitonic sort of 64 keys held striped: lane l holds elements l (v0) and 32 + l (v1).
 * Ascending; pad unused slots with ~0ull. Fully unrolled: 21 compare-exchange steps. */
struct WarpBitonic64 {
    __device__ __forceinline__ static unsigned long long cmpx(unsigned long long mine, int partner_mask_bit,
                                                             bool ascending)
    {
        const unsigned long long other = __shfl_xor_sync(0xffffffffu, mine, partner_mask_bit);
        const bool lower = (lane_id() & partner_mask_bit) == 0;
        const bool take_min = (lower == ascending);
        return take_min ? (mine < other ? mine : other) : (mine > other ? mine : other);
    }

    __device__ __forceinline__ static void sort(unsigned long long &v0, unsigned long long &v1)
    {
        const int lane = lane_id();
        /* sizes 2..32: within each striped half (element e = lane or 32 + lane) */
#pragma unroll
        for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
            for (int stride = size >> 1; stride > 0; stride >>= 1) {
                /* element e = lane (v0) and 32 + lane (v1); (e & size) for size <= 32
                 * equals (lane & size) for v0, and for v1 only when size < 32 */
                const bool asc0 = (lane & size) == 0;
                const bool asc1 = size == 32 ? false : ((lane & size) == 0);
                v0 = cmpx(v0, stride, asc0);
                v1 = cmpx(v1, stride, asc1);
            }
        }
        /* size 64: first stride 32 (v0 against v1 in the same lane), then 16..1 */
        {
            const unsigned long long lo = v0 < v1 ? v0 : v1, hi = v0 < v1 ? v1 : v0;
            v0 = lo;
            v1 = hi;
        }
#pragma unroll
        for (int stride = 16; stride > 0; stride >>= 1) {
            v0 = cmpx(v0, stride, true);
            v1 = cmpx(v1, stride, true);
        }
    }
};

/* Canonical squared distance of query q to up to 32 rows, lane r taking row r:
 *   acc = 0; for t in 0..d-1: diff = (double)q[t] - (double)x[t]; acc = fma(diff, diff, acc)
 * exactly the CPU's value (same operations, same order; explicit _rn intrinsics so that
 * no contraction or reassociation can change them). Rows are staged through shared
 * memory 32 dimensions at a time: lane l loads dimension t0 + l of every row (one
 * coalesced 128-byte line per row), then each lane walks its own row sequentially; the
 * next 32 dimensions are loaded into registers meanwhile. The row pitch of 33 words makes
 * both the stores and the per-lane reads conflict-free. */
struct WarpCanonical {
    struct TempStorage {
        float xs[kWarp][kWarp + 1];
        float qs[kWarp];
        const float *rows[kWarp];
    };

    /* The double sums of lane < nrows's row against q in dimension order (0 for the other
     * lanes): l2/euclidean acc = fma(q_t - x_t, q_t - x_t, acc); ip and cosine acc =
     * fma(q_t, x_t, acc), cosine also nq = fma(q_t, q_t, nq), nx = fma(x_t, x_t, nx).
     * rows[0..nrows) must be set in ts.rows before the call (any lanes), followed by
     * __syncwarp(). */
    template <int KIND, bool PF = true>
    __device__ __forceinline__ static void sums(TempStorage &ts, const float *__restrict__ q, int64_t d, int nrows,
                                                double &acc, double &nq, double &nx)
    {
        const int lane = lane_id();
        acc = nq = nx = 0.0;
        if (!PF) {
            for (int64_t t0 = 0; t0 < d; t0 += kWarp) {
                const int64_t t = t0 + lane;
                const bool in = t < d;
                ts.qs[lane] = in ? __ldg(q + t) : 0.0f;
#pragma unroll 8
                for (int r = 0; r < nrows; ++r) ts.xs[r][lane] = in ? __ldg(ts.rows[r] + t) : 0.0f;
                __syncwarp();
                chunk<KIND>(ts, d - t0, nrows, acc, nq, nx);
            }
            return;
        }
        /* PF: the next chunk's 32 row elements are loaded into registers (all 32 loads in
         * flight) while the lanes walk the current chunk; the gather is latency-bound
         * otherwise (8 lines in flight per warp). About 40 more registers. */
        float nxt[kWarp];
        float qn;
        {
            const bool in = lane < d;
            qn = in ? __ldg(q + lane) : 0.0f;
#pragma unroll
            for (int r = 0; r < kWarp; ++r) nxt[r] = in && r < nrows ? __ldg(ts.rows[r] + lane) : 0.0f;
        }
        for (int64_t t0 = 0; t0 < d; t0 += kWarp) {
            ts.qs[lane] = qn;
#pragma unroll
            for (int r = 0; r < kWarp; ++r) ts.xs[r][lane] = nxt[r];
            __syncwarp();
            const int64_t tn = t0 + kWarp + lane;
            if (t0 + kWarp < d) {
                const bool in = tn < d;
                qn = in ? __ldg(q + tn) : 0.0f;
#pragma unroll
                for (int r = 0; r < kWarp; ++r) nxt[r] = in && r < nrows ? __ldg(ts.rows[r] + tn) : 0.0f;
            }
            chunk<KIND>(ts, d - t0, nrows, acc, nq, nx);
        }
    }

    /* Lane < nrows walks its staged row over the chunk's min(left, 32) dimensions, then
     * the warp syncs (the staging may be overwritten after). */
    template <int KIND>
    __device__ __forceinline__ static void chunk(TempStorage &ts, int64_t left, int nrows, double &acc, double &nq,
                                                 double &nx)
    {
        const int lane = lane_id();
        const int lim = left < kWarp ? (int)left : kWarp;
        if (lane < nrows) {
            for (int tt = 0; tt < lim; ++tt) {
                const double a = (double)ts.qs[tt], b = (double)ts.xs[lane][tt];
                if (KIND == kCanonL2 || KIND == kCanonEuclid) {
                    const double diff = __dsub_rn(a, b);
                    acc = __fma_rn(diff, diff, acc);
                } else {
                    acc = __fma_rn(a, b, acc);
                    if (KIND == kCanonCosine) {
                        nq = __fma_rn(a, a, nq);
                        nx = __fma_rn(b, b, nx);
                    }
                }
            }
        }
        __syncwarp();
    }

    /* The resolved c (common.cuh, kCanon*) of lane < nrows's row against q, the CPU's
     * operations in the CPU's order (sums, then the metric's finish; cosine through
     * xknn__cm_cosine); 0 for lanes >= nrows. */
    template <int KIND, bool PF = true>
    __device__ __forceinline__ static float value(TempStorage &ts, const float *__restrict__ q, int64_t d, int nrows)
    {
        double acc, nq, nx;
        sums<KIND, PF>(ts, q, d, nrows, acc, nq, nx);
        if (KIND == kCanonL2 || KIND == kCanonEuclid) return finish_metric(acc, KIND);
        if (KIND == kCanonCosine) return __double2float_rn(xknn__cm_cosine(acc, nq, nx));
        return __uint_as_float(order_enc(__fsub_rn(0.0f, __double2float_rn(acc)))); /* kCanonIp */
    }
};


/* A warp array of N = 32 R unsigned 64-bit keys (R a power of two), striped: element i
 * is register i / 32 of lane i % 32. Every register index is a compile-time constant
 * (all loops unroll), so the array never leaves registers. Compare-exchange distances
 * >= 32 pair two registers of the same lane; shorter ones pair lanes through shuffles. */
template <int R>
struct WarpKeys {
    static_assert(R >= 1 && (R & (R - 1)) == 0, "R must be a power of two");
    static constexpr int N = kWarp * R;
    typedef unsigned long long Key;

    __device__ __forceinline__ static Key kmin(Key a, Key b) { return a < b ? a : b; }
    __device__ __forceinline__ static Key kmax(Key a, Key b) { return a < b ? b : a; }

    /* One network stage: elements i and i ^ stride exchange so that the lower index gets
     * the minimum when (i & size) == 0 (ascending run) and the maximum otherwise;
     * size = 0 means "ascending everywhere" (a clean of one bitonic sequence). */
    template <int SIZE, int STRIDE>
    __device__ __forceinline__ static void stage(Key (&v)[R])
    {
        const int lane = lane_id();
        if (STRIDE >= kWarp) {
            constexpr int rs = STRIDE / kWarp;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if ((r & rs) == 0) {
                    const bool asc = SIZE == 0 || ((r * kWarp) & SIZE) == 0;
                    const Key a = v[r], b = v[r | rs];
                    v[r] = asc ? kmin(a, b) : kmax(a, b);
                    v[r | rs] = asc ? kmax(a, b) : kmin(a, b);
                }
            }
        } else {
            const bool lower = (lane & STRIDE) == 0;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const Key o = __shfl_xor_sync(0xffffffffu, v[r], STRIDE);
                const bool asc = SIZE == 0 || ((r * kWarp + lane) & SIZE) == 0;
                v[r] = (lower == asc) ? kmin(v[r], o) : kmax(v[r], o);
            }
        }
    }

    template <int SIZE, int STRIDE>
    __device__ __forceinline__ static void strides(Key (&v)[R])
    {
        stage<SIZE, STRIDE>(v);
        if constexpr (STRIDE > 1) strides<SIZE, STRIDE / 2>(v);
    }

    template <int SIZE>
    __device__ __forceinline__ static void sizes(Key (&v)[R])
    {
        strides<SIZE, SIZE / 2>(v);
        if constexpr (SIZE < N) sizes<SIZE * 2>(v);
    }

    /* Ascending sort of all N keys. */
    __device__ __forceinline__ static void sort(Key (&v)[R]) { sizes<2>(v); }

    /* Ascending order of a bitonic sequence (half-cleaner cascade). */
    __device__ __forceinline__ static void clean(Key (&v)[R]) { strides<0, N / 2>(v); }

    /* w (sorted, N keys) becomes the N smallest of w and t (sorted, 32 RT keys), sorted.
     * The last M = 32 min(R, RT) keys of w meet the first M of t reversed: the minima
     * are the M smallest of those 2M, every earlier key of w is among the N smallest,
     * and the result is bitonic, so one clean sorts it. */
    template <int RT>
    __device__ __forceinline__ static void merge(Key (&w)[R], const Key (&t)[RT])
    {
        constexpr int m = R < RT ? R : RT;
        const int lane = lane_id();
#pragma unroll
        for (int r = 0; r < m; ++r) {
            const Key o = __shfl_sync(0xffffffffu, t[m - 1 - r], kWarp - 1 - lane);
            w[R - m + r] = kmin(w[R - m + r], o);
        }
        clean(w);
    }

    /* Element i (0 <= i < N, warp-uniform) in every lane. */
    __device__ __forceinline__ static Key get(const Key (&v)[R], int i)
    {
        Key x = 0;
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (r == i / kWarp) x = v[r];
        return __shfl_sync(0xffffffffu, x, i % kWarp);
    }
};

} // namespace xknn_cuda

#endif
