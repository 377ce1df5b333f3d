/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/final.cu -- final selection of a state block.
 *
 * After the last pass every candidate with L <= tau' has its canonical value. Per query:
 *   gather   (one warp) keep L <= tau', turn entries into 64-bit keys (canonical bits,
 *            local id) packed at the start of the query's buffer region: M keys
 *   sort     kk <= 64:   the same warp keeps the 64 smallest keys in registers while it
 *                        gathers (bitonic networks; no key is written), and finishes
 *            M <= 64:    the same warp, bitonic network in registers
 *            M <= 4096:  one block, bitonic network in shared memory
 *            otherwise:  one block, 4096-key runs sorted in shared memory, then
 *                        kk <= 4096: the keys at or below the kk-th distance part
 *                        (radix select) sorted at once when they fit in 4096, else
 *                        each run merged into the running first kk keys in shared
 *                        memory (block_merge_kernel, a launch of its own)
 *                        kk > 4096: merge passes in global memory (the region's second
 *                        half is the other buffer), every run cut to its first kk keys
 *   write    the first min(M, kk) as (ref_id_offset + id, distance), then id -1 / +inf
 *            up to k (pad_missing; M < kk only when fewer references are available).
 * Keys are unique (ids), so the order is total and the result is the exact top k.
 */
#include "block_primitives.cuh"
#include "kernels.cuh"

namespace xknn_cuda {

__device__ __forceinline__ void write_result(const FinalParams &p, int qi, int64_t j, unsigned long long key)
{
    const int64_t o = (int64_t)qi * p.k + j;
    p.ids[o] = p.id_offset + (int64_t)key_idx(key);
    if (!p.dist) return;
    if (p.encoded) {
        const float v = order_dec((unsigned)(key >> 32));
        p.dist[o] = p.negate ? __fsub_rn(0.0f, v) : v;
    } else {
        p.dist[o] = key_dist(key);
    }
}

__device__ __forceinline__ void write_pad(const FinalParams &p, int qi, int64_t j)
{
    const int64_t o = (int64_t)qi * p.k + j;
    p.ids[o] = -1;
    if (p.dist) p.dist[o] = p.negate ? -INFINITY : INFINITY;
}

__device__ __forceinline__ unsigned long long *region_keys(const FinalParams &p, int qi)
{
    return reinterpret_cast<unsigned long long *>(p.cand + (int64_t)qi * p.S * p.cap);
}

/*
 * Gather (+ warp sort for M <= 64). One warp per query, 8 queries per 256-thread block,
 * grid ceil(qs / 8); no shared memory, few registers: full occupancy. Keys are written
 * in place over the entries already read: key j occupies bytes [8j, 8j+8) and is only
 * written after every entry up to j has been read (reads of a step precede its writes
 * via __syncwarp; later steps read higher entries).
 */
__global__ __launch_bounds__(kBlock) void gather_kernel(const FinalParams p, int qs)
{
    const int qi = (int)blockIdx.x * kWarpsPerBlock + warp_id();
    if (qi >= qs) return;
    const int lane = lane_id();
    const float tp = tau_prime(*(const volatile float *)(p.tau + qi));
    unsigned long long *keys = region_keys(p, qi);
    int64_t M = 0;
    unsigned long long unresolved = 0;
    /* kk <= 64: the warp keeps the 64 smallest keys so far, sorted (element l in t0 of
     * lane l, 32 + l in t1), and writes no keys. A chunk holding a key below the 64th
     * is merged: the first sort leaves in t1 the 32 smallest of t1 and the chunk, which
     * hold every key of the 64 smallest that is not in t0 (t0's keys are below t1's, so
     * such a key has at most 31 of t1 and the chunk below it); the second sorts t0 and t1. */
    const bool in_regs = p.kk <= kWarpSortMax;
    unsigned long long t0 = ~0ull, t1 = ~0ull;
    for (int s = 0; s < p.S; ++s) {
        const Cand *seg = p.cand + ((int64_t)qi * p.S + s) * p.cap;
        const int bc = p.cnt[(int64_t)qi * p.S + s];
        for (int base = 0; base < bc; base += kWarp) {
            const int i = base + lane;
            bool keep = false;
            unsigned long long key = 0;
            if (i < bc) {
                const Cand e = seg[i];
                keep = e.lo <= tp;
                key = make_key(e.c, e.idx);
                unresolved += (keep && !p.encoded && e.c < 0.0f);
            }
            const unsigned m = __ballot_sync(0xffffffffu, keep);
            if (in_regs) {
                unsigned long long c = keep ? key : ~0ull;
                if (__any_sync(0xffffffffu, c < __shfl_sync(0xffffffffu, t1, kWarp - 1))) {
                    WarpBitonic64::sort(t1, c);
                    WarpBitonic64::sort(t0, t1);
                }
            } else {
                __syncwarp();
                if (keep) keys[M + __popc(m & ((1u << lane) - 1u))] = key;
            }
            M += __popc(m);
        }
    }
    if (unresolved) atomicAdd(p.stats + kStatUnresolved, unresolved);
    if (lane == 0) p.mcount[qi] = M;
    if (in_regs) {
        const int64_t have = M < p.kk ? M : p.kk;
        if (lane < have) write_result(p, qi, lane, t0);
        if (lane + kWarp < have) write_result(p, qi, lane + kWarp, t1);
        for (int64_t j = have + lane; j < p.k; j += kWarp) write_pad(p, qi, j);
        return;
    }
    if (M > kWarpSortMax) return;
    __syncwarp();
    unsigned long long v0 = lane < M ? keys[lane] : ~0ull;
    unsigned long long v1 = lane + kWarp < M ? keys[lane + kWarp] : ~0ull;
    WarpBitonic64::sort(v0, v1);
    const int64_t have = M < p.kk ? M : p.kk;
    if (lane < have) write_result(p, qi, lane, v0);
    if (lane + kWarp < have) write_result(p, qi, lane + kWarp, v1);
    for (int64_t j = have + lane; j < p.k; j += kWarp) write_pad(p, qi, j);
}

/* Lower bound: the number of keys of s[0, n) (ascending, unique) below key; I is int
 * for shared-memory lists, int64_t for the global merge passes. */
template <typename I>
__device__ __forceinline__ I rank_below(const unsigned long long *s, I n, unsigned long long key)
{
    I lo = 0, hi = n;
    while (lo < hi) {
        const I mid = (lo + hi) >> 1;
        if (s[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

__device__ __forceinline__ int64_t run_valid(int64_t W, int64_t r, int64_t M, int64_t kk)
{
    int64_t span = M - r * W;
    if (span < 0) span = 0;
    if (span > W) span = W;
    return span < kk ? span : kk;
}

/*
 * Block sort of the queries with M > 64. One block per state query (grid qs; blocks of
 * queries the gather kernel finished exit at once). Launch: 256 threads, 32 KB static
 * shared memory (4096 keys): 7 blocks per SM. The merge step is rank-based: every valid
 * key of run A finds its rank in run B by binary search (keys are unique, so there are
 * no ties) and lands at pos + rank if that is below the output run's kk cut.
 */
__global__ __launch_bounds__(kBlock) void block_sort_kernel(const FinalParams p)
{
    __shared__ unsigned long long sk[kBlockSortMax];
    const int qi = (int)blockIdx.x, tid = (int)threadIdx.x;
    const int64_t M = p.mcount[qi];
    if (M <= kWarpSortMax || p.kk <= kWarpSortMax) return; /* the gather kernel's */
    const int64_t kk = p.kk;
    const int64_t have = M < kk ? M : kk;
    if (M > kBlockSortMax && kk <= kBlockSortMax && p.smem_merge) return; /* block_merge_kernel's */
    unsigned long long *keys = region_keys(p, qi);
    unsigned long long *src = keys;
    if (M <= kBlockSortMax) {
        int P = kWarpSortMax;
        while (P < M) P <<= 1;
        for (int i = tid; i < P; i += kBlock) sk[i] = i < M ? keys[i] : ~0ull;
        __syncthreads();
        block_bitonic_sort(sk, P);
        for (int64_t j = tid; j < have; j += kBlock) write_result(p, qi, j, sk[j]);
    } else {
        unsigned long long *dst = keys + (int64_t)p.S * p.cap;
        for (int64_t r0 = 0; r0 < M; r0 += kBlockSortMax) {
            const int64_t len = M - r0 < kBlockSortMax ? M - r0 : kBlockSortMax;
            for (int i = tid; i < kBlockSortMax; i += kBlock) sk[i] = i < len ? keys[r0 + i] : ~0ull;
            __syncthreads();
            block_bitonic_sort(sk, kBlockSortMax);
            const int64_t keep = len < kk ? len : kk;
            for (int64_t i = tid; i < keep; i += kBlock) keys[r0 + i] = sk[i];
            __syncthreads();
        }
        for (int64_t W = kBlockSortMax; W < M; W *= 2) {
            for (int64_t x = tid; x < M; x += kBlock) {
                const int64_t run = x / W, pos = x - run * W;
                if (pos >= run_valid(W, run, M, kk)) continue;
                const int64_t other = run ^ 1, pair = run >> 1;
                const int64_t ovl = run_valid(W, other, M, kk);
                const unsigned long long key = src[x];
                const int64_t out = pos + rank_below(src + other * W, ovl, key);
                if (out < run_valid(2 * W, pair, M, kk)) dst[pair * 2 * W + out] = key;
            }
            __syncthreads();
            unsigned long long *t = src;
            src = dst;
            dst = t;
        }
        for (int64_t j = tid; j < have; j += kBlock) write_result(p, qi, j, src[j]);
    }
    for (int64_t j = have + tid; j < p.k; j += kBlock) write_pad(p, qi, j);
}

/*
 * The queries with M > kBlockSortMax when kk <= kBlockSortMax (k up to 4096; M is then
 * about 1.3 to 2 kk). A radix select of the kk-th smallest distance part first keeps
 * only the keys at or below it; when those fit in kBlockSortMax (they are kk plus the
 * ties at the cut), one sort in shared memory finishes the query. Otherwise runs of
 * kBlockSortMax keys are sorted in shared memory one after the
 * other and each is merged into the running first kk keys, also in shared memory (rank
 * of every key in the other list by binary search; keys are unique). The global-memory
 * merge passes of block_sort_kernel did the same with every probe a round trip to
 * memory. Launch: kMergeThreads = 1024 threads (the network's barriers are the cost: two
 * blocks fill an SM), 3 kBlockSortMax keys of dynamic shared memory (96 KiB: run,
 * running list, merged list), grid qs; every other query returns at once.
 */
static const int kMergeThreads = 1024;

__global__ __launch_bounds__(kMergeThreads) void block_merge_kernel(const FinalParams p)
{
    extern __shared__ unsigned long long smk[];
    const int qi = (int)blockIdx.x, tid = (int)threadIdx.x;
    const int64_t M = p.mcount[qi];
    const int kk = (int)p.kk;
    if (M <= kBlockSortMax || kk > kBlockSortMax || kk <= kWarpSortMax || !p.smem_merge) return;
    const unsigned long long *keys = region_keys(p, qi);
    /* T = the kk-th smallest distance part (a key's high word): at least kk keys are at
     * or below it, so a key whose distance part exceeds T is beaten by kk others and is
     * not in the top kk. The rest go to shared memory and, when they fit (unless many
     * keys tie at T, they are about kk), one sort finishes the query. */
    __shared__ BlockRadixSelect<unsigned>::TempStorage rs;
    __shared__ int nsel;
    const unsigned *hi = reinterpret_cast<const unsigned *>(keys) + 1; /* little-endian high words */
    const unsigned T = BlockRadixSelect<unsigned>::select(
        rs,
        [&](auto f) {
            for (int64_t i = tid; i < M; i += kMergeThreads) f(hi[2 * i]);
        },
        kk);
    if (tid == 0) nsel = 0;
    __syncthreads();
    for (int64_t i = tid; i < M; i += kMergeThreads) {
        if (hi[2 * i] > T) continue;
        const int pos = atomicAdd(&nsel, 1);
        if (pos < kBlockSortMax) smk[pos] = keys[i];
    }
    __syncthreads();
    const int ns = nsel;
    if (ns <= kBlockSortMax) {
        int P = kWarpSortMax;
        while (P < ns) P <<= 1;
        for (int i = ns + tid; i < P; i += kMergeThreads) smk[i] = ~0ull;
        __syncthreads();
        block_bitonic_sort<kMergeThreads>(smk, P);
        for (int j = tid; j < kk; j += kMergeThreads) write_result(p, qi, j, smk[j]);
        for (int64_t j = kk + tid; j < p.k; j += kMergeThreads) write_pad(p, qi, j);
        return;
    }
    /* many keys tie at T: sorted runs merged into the running first kk keys */
    unsigned long long *run = smk, *acc = smk + kBlockSortMax, *out = smk + 2 * kBlockSortMax;
    int la = 0;
    for (int64_t r0 = 0; r0 < M; r0 += kBlockSortMax) {
        const int len = (int)(M - r0 < kBlockSortMax ? M - r0 : kBlockSortMax);
        int P = kWarpSortMax;
        while (P < len) P <<= 1;
        unsigned long long *dst = r0 == 0 ? acc : run;
        for (int i = tid; i < P; i += kMergeThreads) dst[i] = i < len ? keys[r0 + i] : ~0ull;
        __syncthreads();
        block_bitonic_sort<kMergeThreads>(dst, P);
        const int lr = len < kk ? len : kk;
        if (r0 == 0) {
            la = lr;
            continue;
        }
        const int lo = la + lr < kk ? la + lr : kk;
        for (int i = tid; i < la; i += kMergeThreads) {
            const int pos = i + rank_below(run, lr, acc[i]);
            if (pos < lo) out[pos] = acc[i];
        }
        for (int i = tid; i < lr; i += kMergeThreads) {
            const int pos = i + rank_below(acc, la, run[i]);
            if (pos < lo) out[pos] = run[i];
        }
        __syncthreads();
        unsigned long long *t = acc;
        acc = out;
        out = t;
        la = lo;
    }
    for (int j = tid; j < la; j += kMergeThreads) write_result(p, qi, j, acc[j]);
    for (int64_t j = la + tid; j < p.k; j += kMergeThreads) write_pad(p, qi, j);
}

cudaError_t launch_final(const FinalParams &p, int qs, cudaStream_t st)
{
    const unsigned gblocks = (unsigned)((qs + kWarpsPerBlock - 1) / kWarpsPerBlock);
    gather_kernel<<<gblocks, kBlock, 0, st>>>(p, qs);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || p.kk <= kWarpSortMax) return e; /* kk <= 64: the gather finished every query */
    block_sort_kernel<<<(unsigned)qs, kBlock, 0, st>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess || !p.smem_merge || p.kk > kBlockSortMax || (int64_t)p.S * p.cap <= kBlockSortMax) return e;
    const size_t smem = kFinalMergeSmem;
    e = cudaFuncSetAttribute(block_merge_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    block_merge_kernel<<<(unsigned)qs, kMergeThreads, smem, st>>>(p);
    return cudaGetLastError();
}

/* ---- running lists on the device (staging.cu's list mirrors) -----------------------
 * A list is k entries (id, distance) sorted by the result order -- (distance, id), by
 * -distance for ip -- with its padding (id -1) last, as on the host (pair.cu's
 * merge_row, whose rules these kernels follow bit for bit). One thread a row: the rows
 * of a pair's block are a few million at most, and the merge reads each entry once. */

__device__ __forceinline__ bool list_less(float da, long long ia, float db, long long ib)
{
    return da < db || (da == db && ia < ib);
}

/* Rows of a (ids ai, distances ad) merged with rows of b: the k first of both, back into
 * a (through the scratch rows si / sd). A row that ends in padding keeps the smaller of
 * the bounds its inputs' last entries carried (l2 family; ip: none). */
__global__ __launch_bounds__(kBlock) void lists_merge_kernel(int64_t *ai, float *ad, const int64_t *bi,
                                                              const float *bd, int64_t rows, int64_t k, int ip,
                                                              int64_t *si, float *sd)
{
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
        int64_t *ri = ai + r * k, *ti = si + r * k;
        float *rd = ad + r * k, *td = sd + r * k;
        const int64_t *ni = bi + r * k;
        const float *nd = bd + r * k;
        const float bound =
            ip ? 0.0f : fminf(ri[k - 1] < 0 ? rd[k - 1] : INFINITY, ni[k - 1] < 0 ? nd[k - 1] : INFINITY);
        int64_t a = 0, b = 0;
        for (int64_t j = 0; j < k; ++j) {
            /* a + b == j < k: neither index runs past its row */
            const int64_t ia = ri[a], ib = ni[b];
            const float da = rd[a], db = nd[b];
            const bool take_a =
                ib < 0 || (ia >= 0 && (ip ? list_less(-da, ia, -db, ib) : list_less(da, ia, db, ib)));
            ti[j] = take_a ? ia : ib;
            td[j] = take_a ? da : db;
            a += take_a;
            b += !take_a;
        }
        if (!ip && ti[k - 1] < 0 && bound < td[k - 1]) td[k - 1] = bound;
        for (int64_t j = 0; j < k; ++j) {
            ri[j] = ti[j];
            rd[j] = td[j];
        }
    }
}

__global__ __launch_bounds__(kBlock) void lists_pad_kernel(int64_t *ids, float *dist, int64_t count, float pad)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        ids[i] = -1;
        dist[i] = pad;
    }
}

/* kth[r] = the last distance of row r; *bad = 1 where one is not finite (NaN or +inf:
 * the row neither holds k references nor carries a bound) */
__global__ __launch_bounds__(kBlock) void lists_kth_kernel(const float *dist, int64_t rows, int64_t k, float *kth,
                                                            int *bad)
{
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
        const float v = dist[r * k + k - 1];
        kth[r] = v;
        if (!(v <= FLT_MAX)) atomicOr(bad, 1);
    }
}

/* Each row's last distance becomes bound[r] (padding that carries a caller's bound) */
__global__ __launch_bounds__(kBlock) void lists_bound_kernel(float *dist, const float *bound, int64_t rows, int64_t k)
{
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x)
        dist[r * k + k - 1] = bound[r];
}

/* out[r] = row r's k-th distance where it holds k references, +inf where not */
__global__ __launch_bounds__(kBlock) void lists_last_kernel(const int64_t *ids, const float *dist, int64_t rows,
                                                             int64_t k, float *out)
{
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x)
        out[r] = ids[r * k + k - 1] >= 0 ? dist[r * k + k - 1] : INFINITY;
}

static unsigned lists_grid(int64_t n, int sms)
{
    const int64_t need = (n + kBlock - 1) / kBlock, cap = 16 * (int64_t)sms;
    return (unsigned)(need < cap ? (need > 0 ? need : 1) : cap);
}

cudaError_t launch_lists_merge(int64_t *ids, float *dist, const int64_t *nids, const float *ndist, int64_t rows,
                               int64_t k, int ip, int64_t *sids, float *sdist, int sms, cudaStream_t st)
{
    if (rows <= 0) return cudaSuccess;
    lists_merge_kernel<<<lists_grid(rows, sms), kBlock, 0, st>>>(ids, dist, nids, ndist, rows, k, ip, sids, sdist);
    return cudaGetLastError();
}

cudaError_t launch_lists_pad(int64_t *ids, float *dist, int64_t count, int ip, int sms, cudaStream_t st)
{
    if (count <= 0) return cudaSuccess;
    lists_pad_kernel<<<lists_grid(count, sms), kBlock, 0, st>>>(ids, dist, count, ip ? -INFINITY : INFINITY);
    return cudaGetLastError();
}

cudaError_t launch_lists_kth(const float *dist, int64_t rows, int64_t k, float *kth, int *bad, int sms, cudaStream_t st)
{
    if (rows <= 0) return cudaSuccess;
    lists_kth_kernel<<<lists_grid(rows, sms), kBlock, 0, st>>>(dist, rows, k, kth, bad);
    return cudaGetLastError();
}

cudaError_t launch_lists_bound(float *dist, const float *bound, int64_t rows, int64_t k, int sms, cudaStream_t st)
{
    if (rows <= 0) return cudaSuccess;
    lists_bound_kernel<<<lists_grid(rows, sms), kBlock, 0, st>>>(dist, bound, rows, k);
    return cudaGetLastError();
}

cudaError_t launch_lists_last(const int64_t *ids, const float *dist, int64_t rows, int64_t k, float *out, int sms,
                              cudaStream_t st)
{
    if (rows <= 0) return cudaSuccess;
    lists_last_kernel<<<lists_grid(rows, sms), kBlock, 0, st>>>(ids, dist, rows, k, out);
    return cudaGetLastError();
}

} // namespace xknn_cuda
