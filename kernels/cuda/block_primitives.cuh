/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/block_primitives.cuh -- block layer (kBlock threads). Each primitive takes
 * the caller's shared-memory TempStorage (CUB style) so kernels can union them, and must
 * be called by all threads of the block (they contain __syncthreads).
 *
 *   BlockScan           exclusive prefix sum of one int per thread, plus the total
 *   BlockRadixSelect<K> r-th smallest of a distributed multiset of unsigned keys (K =
 *                       32 or 64 bit), 8-bit digits, shared-memory histograms
 *   compact_cands       in-order in-place compaction of a candidate buffer
 *   block_bitonic_sort  ascending sort of a power-of-two array in shared memory
 *   BlockResolve        canonical distances for the buffer entries that need one, each
 *                       warp packing 32 of them per WarpCanonical batch (PF: with the
 *                       register prefetch; false where registers are scarce)
 */
#ifndef XKNN_CUDA_BLOCK_PRIMITIVES_CUH
#define XKNN_CUDA_BLOCK_PRIMITIVES_CUH

#include "common.cuh"
#include "warp_primitives.cuh"

namespace xknn_cuda {

struct BlockScan {
    struct TempStorage {
        int warp_sums[kWarpsPerBlock];
        int total;
    };
    /* Returns the exclusive prefix of v over threads 0..tid-1; *total gets the block sum.
     * Ends with a barrier, so the storage may be reused at once and every read of shared
     * or global memory made before the call is complete block-wide. */
    __device__ __forceinline__ static int exclusive(TempStorage &ts, int v, int &total)
    {
        const int lane = lane_id(), warp = warp_id();
        const int inc = warp_inclusive_sum(v);
        if (lane == kWarp - 1) ts.warp_sums[warp] = inc;
        __syncthreads();
        if (warp == 0) {
            const int w = lane < kWarpsPerBlock ? ts.warp_sums[lane] : 0;
            const int wi = warp_inclusive_sum(w);
            if (lane < kWarpsPerBlock) ts.warp_sums[lane] = wi - w;
            if (lane == kWarpsPerBlock - 1) ts.total = wi;
        }
        __syncthreads();
        const int r = ts.warp_sums[warp] + inc - v;
        total = ts.total;
        __syncthreads();
        return r;
    }
};

template <typename K>
struct BlockRadixSelect {
    struct TempStorage {
        int hist[kRadixBins];
        K prefix;
        int rank;
    };

    /* r-th smallest key (1-based; the caller guarantees at least r keys). each(f) must call
     * f(key) once for every key this thread contributes, identically on every call. */
    template <class Each>
    __device__ __forceinline__ static K select(TempStorage &ts, Each each, int r)
    {
        constexpr int kBits = (int)sizeof(K) * 8;
        const int tid = (int)threadIdx.x, lane = lane_id(), warp = warp_id();
        K prefix = 0;
#pragma unroll 1
        for (int shift = kBits - kRadixBits; shift >= 0; shift -= kRadixBits) {
            for (int i = tid; i < kRadixBins; i += kBlock) ts.hist[i] = 0;
            __syncthreads();
            const K hi_mask = (shift + kRadixBits >= kBits) ? (K)0 : (K)(~(K)0 << (shift + kRadixBits));
            each([&](K key) {
                if ((key & hi_mask) == prefix) atomicAdd(&ts.hist[(int)((key >> shift) & (K)(kRadixBins - 1))], 1);
            });
            __syncthreads();
            if (warp == 0) {
                int bin, rank;
                warp_rank_bin(ts.hist, r, &bin, &rank);
                if (lane == 0) {
                    ts.prefix = prefix | ((K)bin << shift);
                    ts.rank = rank;
                }
            }
            __syncthreads();
            prefix = ts.prefix;
            r = ts.rank;
            __syncthreads();
        }
        return prefix;
    }
};

/* Keeps the entries e of buf[0, count) for which keep(e) is true (keep may modify e, the
 * modified value is stored), preserving their order; returns the new count. In place:
 * each block step reads its entries before the barrier in BlockScan and writes only to
 * positions below the next step's reads. */
template <class Keep>
__device__ __forceinline__ int compact_cands(BlockScan::TempStorage &ts, Cand *buf, int count, Keep keep)
{
    int out = 0;
    for (int base = 0; base < count; base += kBlock) {
        const int i = base + (int)threadIdx.x;
        Cand e;
        bool k = false;
        if (i < count) {
            e = buf[i];
            k = keep(e);
        }
        int total;
        const int pos = BlockScan::exclusive(ts, k ? 1 : 0, total);
        if (k) buf[out + pos] = e;
        out += total;
    }
    return out;
}

/* Ascending bitonic sort of s[0, P), P a power of two <= kBlockSortMax, by a block of NT
 * threads (a multiple of 32). The caller puts a barrier between filling s and the call;
 * the call ends with one. Thread t takes the pairs t + NT i of each step; in a step of
 * stride <= 16 the 32 pairs of a warp lie within 64 consecutive keys, the same 64 for
 * every such step, so two such steps in a row need only __syncwarp between them: a
 * block barrier comes after a step of stride >= 32 or before one (4096 keys: 36 of the
 * 78 steps). */
template <int NT = kBlock>
__device__ __forceinline__ void block_bitonic_sort(unsigned long long *s, int P)
{
    static_assert(NT % 32 == 0, "whole warps");
    for (int size = 2; size <= P; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = (int)threadIdx.x; t < P / 2; t += NT) {
                const int lo = 2 * stride * (t / stride) + (t % stride);
                const int hi = lo + stride;
                const bool asc = (lo & size) == 0;
                const unsigned long long a = s[lo], b = s[hi];
                if ((a > b) == asc) {
                    s[lo] = b;
                    s[hi] = a;
                }
            }
            const int next = stride > 1 ? stride >> 1 : size; /* the next step's stride */
            if (stride >= 32 || next >= 32 || (stride == 1 && size == P))
                __syncthreads();
            else
                __syncwarp();
        }
    }
}

/* Canonical values (kind: common.cuh's kCanon*), written into buf[i].c, for the entries
 * not resolved yet (cand_unresolved) with lo <= tp. Entry idx is a local reference row; its vector is
 * R + (idx - r_local0) * ldr, which must be on the device (the current chunk). */
struct BlockResolve {
    struct TempStorage {
        WarpCanonical::TempStorage w[kWarpsPerBlock];
        int pos[kWarpsPerBlock][kWarp];
    };

    /* returns how many of the n values are <= ctau (the same on every lane) */
    template <bool PF>
    __device__ __forceinline__ static int flush(WarpCanonical::TempStorage &wt, const int *pos, int n, Cand *buf,
                                                const float *q, int64_t d, int kind, float ctau)
    {
        __syncwarp();
        float v;
        switch (kind) {
        case kCanonIp: v = WarpCanonical::value<kCanonIp, PF>(wt, q, d, n); break;
        case kCanonCosine: v = WarpCanonical::value<kCanonCosine, PF>(wt, q, d, n); break;
        case kCanonEuclid: v = WarpCanonical::value<kCanonEuclid, PF>(wt, q, d, n); break;
        default: v = WarpCanonical::value<kCanonL2, PF>(wt, q, d, n); break;
        }
        if (lane_id() < n) buf[pos[lane_id()]].c = v;
        const int below = __popc(__ballot_sync(0xffffffffu, lane_id() < n && v <= ctau));
        __syncwarp();
        return below;
    }

    /* Canonical values of the unresolved entries of buf[0, count) with lo <= tp. Returns,
     * for the warp (the same on every lane), how many entries with lo <= tp have a value
     * <= ctau once resolved (ctau NaN: none, no cost that matters; meaningful for kinds
     * whose resolved c is the value itself, not kCanonIp). */
    template <bool PF = true>
    __device__ __forceinline__ static int run(TempStorage &ts, Cand *buf, int count, float tp,
                                              const float *__restrict__ q, int64_t d, const float *__restrict__ R,
                                              int64_t ldr, int64_t r_local0, int kind, float ctau = NAN)
    {
        const int lane = lane_id(), warp = warp_id();
        WarpCanonical::TempStorage &wt = ts.w[warp];
        int *pos = ts.pos[warp];
        int pending = 0, below = 0;
        for (int base = warp * kWarp; base < count; base += kBlock) {
            const int i = base + lane;
            bool need = false, known = false;
            int idx = 0;
            if (i < count) {
                const Cand e = buf[i];
                const bool in = e.lo <= tp;
                need = cand_unresolved(e.c, kind) && in;
                known = in && !need && e.c <= ctau;
                idx = e.idx;
            }
            below += __popc(__ballot_sync(0xffffffffu, known));
            const unsigned m = __ballot_sync(0xffffffffu, need);
            const int nm = __popc(m);
            if (pending + nm > kWarp) {
                below += flush<PF>(wt, pos, pending, buf, q, d, kind, ctau);
                pending = 0;
            }
            if (need) {
                const int slot = pending + __popc(m & ((1u << lane) - 1u));
                pos[slot] = i;
                wt.rows[slot] = R + (int64_t)(idx - r_local0) * ldr;
            }
            pending += nm;
            __syncwarp();
        }
        if (pending) below += flush<PF>(wt, pos, pending, buf, q, d, kind, ctau);
        return below;
    }
};

} // namespace xknn_cuda

#endif
