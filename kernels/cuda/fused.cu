/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/fused.cu -- the fused path: distance tiles and warp-level k-selection in
 * one kernel, for small d (<= kFusedMaxD) and k (<= kFusedMaxKeep / 2).
 *
 *   fused_kernel   grid (query blocks, Z): block (x, z) holds kFusedQB queries in shared
 *                  memory and walks the references of slice z in tiles of kFusedBR;
 *                  each warp owns kFusedQW queries, each lane kFusedTR references of a
 *                  tile, so a thread keeps a kFusedQW x kFusedTR register tile of float
 *                  distances. Selection per query (WarpSelect idea): a sorted warp list
 *                  of KP keys in registers; a distance is only queued when below the
 *                  list's largest, in a per-warp queue in shared memory; every 32 queued
 *                  keys the warp sorts them (bitonic, shuffles) and merges them into the
 *                  list (bitonic merge). Output: the sorted list of every (slice, query).
 *   finish_kernel  one warp per query: merges the Z lists (bitonic merge), checks the
 *                  certificate, computes canonical distances of the candidates, sorts
 *                  them by (canonical, id) and writes the first k.
 *   rescue_kernel  one block per failed query (grid-stride over the state block): an
 *                  exact scan of all references with a fixed threshold, keys kept in
 *                  shared memory and cut to the k smallest by radix select when full.
 *
 * THE BOUND (direct form; the functor L2Direct). With h_t = fl(q_t - x_t) and
 * e = fma(h_t, h_t, e) over t (any order), in float without flush to zero:
 *   h_t = (q_t - x_t)(1 + d_t), |d_t| <= u = 2^-24 (a subnormal difference is exact),
 *   each fma rounds once: relative u, or absolute <= 2^-150 when the result is subnormal.
 * All terms are non-negative, so every term carries at most d + 2 factors (1 + theta),
 * |theta| <= u:  |e - D| <= gamma_{d+2} D + d 2^-149,  gamma_m = m u / (1 - m u),
 * D the exact squared distance. Hence, with g = gamma_{d+2} and a = d 2^-149,
 *   L = e (1 - g) - a <= D <= U = e (1 + g / (1 - g)) + a / (1 - g),
 * evaluated with directed roundings (__fmul_rd/__fsub_rd for L, _ru for U). plan.cu
 * rounds the four constants outward. A distance that overflows is clamped to FLT_MAX
 * before selection: its U is +inf, so a certificate that would need it fails and the
 * query goes to the rescue kernel (exact; huge inputs stay correct, only slower).
 *
 * THE CERTIFICATE. Per query the merged list M holds the KP smallest keys (e, id) of all
 * references (every reference not in M has e >= e(M[KP-1])). With e_k = e(M[kk-1]),
 * tau = U(e_k) bounds the kk-th smallest D, and tau' = tau (1 + 2^-19) + 16 FLT_MIN (as
 * everywhere in the backend) separates canonical values: a reference with D > tau' has a
 * canonical value strictly greater than those of kk references. L is monotone in e, so if
 * L(e(M[KP-1])) > tau', no reference outside M can be in the top k, and the candidates
 * are the prefix of M with L <= tau'. If M is not full (its last key is the pad), it
 * holds every reference. Otherwise the certificate fails: the query is searched again by
 * rescue_kernel with the same tau' (still a valid threshold), never approximated.
 */
#include "block_primitives.cuh"
#include "kernels.cuh"

namespace xknn_cuda {

/* e = +inf in the high word, the largest id below: sorts after every real key */
static constexpr unsigned long long kPadKey = (0x7f800000ull << 32) | 0xffffffffull;

__device__ __forceinline__ float fkey_e(unsigned long long key) { return __uint_as_float((unsigned)(key >> 32)); }
__device__ __forceinline__ unsigned long long fkey(float e, int j)
{
    return ((unsigned long long)__float_as_uint(e) << 32) | (unsigned)j;
}

/* Distance functor: the fast float step, its certified bounds, the canonical step.
 * Another metric plugs in with its own functor (and bound constants from plan.cu). */
struct L2Direct {
    __device__ __forceinline__ static float step(float acc, float q, float x)
    {
        const float h = __fsub_rn(q, x);
        return __fmaf_rn(h, h, acc);
    }
    /* NaN and +inf become FLT_MAX: always comparable, U = +inf */
    __device__ __forceinline__ static float clamp(float e) { return fminf(e, FLT_MAX); }
    __device__ __forceinline__ static float lower(const FusedParams &p, float e)
    {
        return __fsub_rd(__fmul_rd(e, p.lrel), p.labs);
    }
    __device__ __forceinline__ static float upper(const FusedParams &p, float e)
    {
        return __fadd_ru(__fmul_ru(e, p.urel), p.uabs);
    }
    /* canonical value: double, dimension order, explicit fma, one rounding */
    __device__ __forceinline__ static float canonical(const FusedParams &p, const float *__restrict__ q,
                                                      const float *__restrict__ x)
    {
        double acc = 0.0;
        for (int64_t t = 0; t < p.d; ++t) {
            const double h = __dsub_rn((double)__ldg(q + t), (double)__ldg(x + t));
            acc = __fma_rn(h, h, acc);
        }
        return finish_metric(acc, p.euclid);
    }
    /* the float distance the fused kernel computes, evaluated the same way */
    __device__ __forceinline__ static float fast(const FusedParams &p, const float *__restrict__ q,
                                                 const float *__restrict__ x)
    {
        float acc = 0.0f;
        for (int64_t t = 0; t < p.d; ++t) acc = step(acc, __ldg(q + t), __ldg(x + t));
        return clamp(acc);
    }
};

/* ---- fused distance + selection ----------------------------------------------------- */
/* Selection state of one warp for its kFusedQW queries: the sorted lists in registers,
 * the thresholds, and the count of keys waiting in the warp's shared-memory queue of each
 * query (warp-uniform values). */
template <int R>
struct FusedSel {
    typedef unsigned long long Key;
    Key w[kFusedQW][R];
    float thr[kFusedQW]; /* e of the list's last key: only smaller distances are queued */
    int qc[kFusedQW];
};

/* Merges the first min(qc, 32) queued keys of query qi into its list: one 32-key warp
 * sort and a bitonic merge; keys beyond 32 move to the front of the queue. */
template <int R>
__device__ __forceinline__ void fused_flush(FusedSel<R> &fs, unsigned long long *queue, int qi)
{
    const int lane = lane_id();
    const int c = fs.qc[qi];
    __syncwarp();
    unsigned long long t[1] = {lane < c ? queue[lane] : kPadKey};
    const int rem = c > kWarp ? c - kWarp : 0;
    const unsigned long long v = lane < rem ? queue[kWarp + lane] : 0ull;
    __syncwarp();
    if (lane < rem) queue[lane] = v;
    fs.qc[qi] = rem;
    WarpKeys<1>::sort(t);
    WarpKeys<R>::template merge<1>(fs.w[qi], t);
    fs.thr[qi] = fkey_e(__shfl_sync(0xffffffffu, fs.w[qi][R - 1], kWarp - 1));
}

/* Dynamic shared memory of the fused kernel: per warp and query a queue of kFusedQueue
 * keys, the block's queries (dpad x kFusedQB floats, transposed), one reference stage of
 * kFusedDC rows x kFusedBR floats (transposed). */
static constexpr int kFusedQueue = 2 * kWarp;
__host__ __device__ constexpr size_t fused_smem_bytes(int dpad)
{
    return (size_t)kFusedWarps * kFusedQW * kFusedQueue * sizeof(unsigned long long) +
           ((size_t)dpad * kFusedQB + (size_t)kFusedDC * kFusedBR) * sizeof(float);
}

/*
 * Launch: kFusedThreads = 256 threads, grid (ceil(qs / kFusedQB), slices), dynamic shared
 * memory fused_smem_bytes(dpad) (33-65 KB). Queries and references are stored transposed
 * so a lane reads its 4 references of a dimension as one float4 and a warp its 4 queries
 * as one broadcast float4: 2 shared loads per 32 FP32 operations. Reference stages are
 * loaded with 16-byte loads when rows allow it (p.vec), consecutive threads taking
 * consecutive references, so the transposed shared stores are conflict-free.
 * Selection (WarpSelect idea, with the queue in shared memory): a lane whose distance is
 * below the list's largest appends it to the warp's queue of that query (ballot + popc
 * positions); when 32 keys wait, one 32-key bitonic sort and one bitonic merge (shuffles)
 * fold them into the list. Measured on an H100, per-thread register queues of 2-4 keys
 * flushed the warp about every 8 insertions and made the merges the bottleneck for small
 * d; this flushes every 32. Registers: 16 distances and 2R words per query;
 * __launch_bounds__(256, 2) for R <= 4 (2 blocks = 16 warps per SM, 100-122 registers,
 * no spills), (256, 1) for R = 8 (155 registers).
 */
template <class Dist, int R>
__global__ __launch_bounds__(kFusedThreads, R <= 4 ? 2 : 1) void fused_kernel(const FusedParams p)
{
    extern __shared__ __align__(16) unsigned long long fsm_keys[];
    const int tid = (int)threadIdx.x, lane = lane_id(), warp = warp_id();
    const int q0 = (int)blockIdx.x * kFusedQB;
    const int d = (int)p.d, dpad = (d + 3) & ~3;
    unsigned long long *queues = fsm_keys + warp * kFusedQW * kFusedQueue; /* this warp's */
    float *qsm = reinterpret_cast<float *>(fsm_keys + kFusedWarps * kFusedQW * kFusedQueue); /* [dpad][QB] */
    float *xsm = qsm + dpad * kFusedQB;                                                      /* [DC][BR]   */
    /* local reference indices fit in int (n < 2^31); int64 only for addresses */
    const int z = p.z0 + (int)blockIdx.y;
    const int j0 = (int)((int64_t)z * p.rz);
    const int j1 = (int)((int64_t)j0 + p.rz < p.n ? (int64_t)j0 + p.rz : p.n);

    for (int e = tid; e < dpad * kFusedQB; e += kFusedThreads) {
        const int i = e % kFusedQB, t = e / kFusedQB;
        qsm[e] = (q0 + i < p.qs && t < d) ? __ldg(p.Q + (int64_t)(q0 + i) * p.ldq + t) : 0.0f;
    }

    FusedSel<R> fs;
    /* the warp's queries are the local references sb + qi (exclude_self); sb = -8 when
     * none is in range, which no index matches. (unsigned)(j - sb) == qi is exact: both
     * j and sb + qi lie in [-8, 2^31). */
    int sb = -8;
    {
        const int64_t s64 = p.self_local0 + q0 + warp * kFusedQW;
        if (p.exclude && s64 + kFusedQW > 0 && s64 < p.n) sb = (int)s64;
    }
#pragma unroll
    for (int qi = 0; qi < kFusedQW; ++qi) {
#pragma unroll
        for (int r = 0; r < R; ++r) fs.w[qi][r] = kPadKey;
        fs.thr[qi] = INFINITY;
        fs.qc[qi] = 0;
    }

    /* Stages: for dpad <= kFusedDC a stage holds tps = kFusedDC / dpad whole tiles (all
     * dimensions), so small d still gives each barrier pair enough work; for larger d a
     * stage is one kFusedDC-dimension chunk of one tile. Shared row rho = sub * dpad + t. */
    const int nchunk = dpad <= kFusedDC ? 1 : (dpad + kFusedDC - 1) / kFusedDC;
    const int tps = dpad <= kFusedDC ? kFusedDC / dpad : 1;
    const int rows = dpad <= kFusedDC ? tps * dpad : kFusedDC;
    const int ntile = (j1 - j0 + kFusedBR - 1) / kFusedBR;
    const int nstage = ntile <= 0 ? 0 : ((ntile + tps - 1) / tps) * nchunk;

    auto load = [&](int st) {
        const int jt = j0 + (st / nchunk) * tps * kFusedBR;
        const int t0 = (st % nchunk) * kFusedDC;
        if (p.vec) {
            for (int e = tid; e < kFusedBR * (rows / 4); e += kFusedThreads) {
                const int jj = e % kFusedBR, rho = 4 * (e / kFusedBR);
                const int sub = dpad <= kFusedDC ? rho / dpad : 0, t = rho - sub * dpad;
                const int j = jt + sub * kFusedBR + jj;
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (j < j1 && t0 + t < d) v = __ldg(reinterpret_cast<const float4 *>(p.R + (int64_t)j * p.ldr + t0 + t));
                xsm[(rho + 0) * kFusedBR + jj] = v.x;
                xsm[(rho + 1) * kFusedBR + jj] = v.y;
                xsm[(rho + 2) * kFusedBR + jj] = v.z;
                xsm[(rho + 3) * kFusedBR + jj] = v.w;
            }
        } else {
            for (int e = tid; e < kFusedBR * rows; e += kFusedThreads) {
                const int jj = e % kFusedBR, rho = e / kFusedBR;
                const int sub = dpad <= kFusedDC ? rho / dpad : 0, t = rho - sub * dpad;
                const int j = jt + sub * kFusedBR + jj;
                xsm[e] = (j < j1 && t0 + t < d) ? __ldg(p.R + (int64_t)j * p.ldr + t0 + t) : 0.0f;
            }
        }
    };

    float acc[kFusedQW][kFusedTR];
    /* distances of shared rows [row0, row0 + nt) against query dimensions [t0, t0 + nt) */
    auto dot = [&](int row0, int t0, int nt) {
#pragma unroll 4
        for (int t = 0; t < nt; ++t) {
            const float4 xv = *reinterpret_cast<const float4 *>(xsm + (row0 + t) * kFusedBR + 4 * lane);
            const float4 qv = *reinterpret_cast<const float4 *>(qsm + (t0 + t) * kFusedQB + kFusedQW * warp);
            const float xr[4] = {xv.x, xv.y, xv.z, xv.w};
            const float qr[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
            for (int qi = 0; qi < kFusedQW; ++qi)
#pragma unroll
                for (int r = 0; r < kFusedTR; ++r) acc[qi][r] = Dist::step(acc[qi][r], qr[qi], xr[r]);
        }
    };
    auto zero = [&]() {
#pragma unroll
        for (int qi = 0; qi < kFusedQW; ++qi)
#pragma unroll
            for (int r = 0; r < kFusedTR; ++r) acc[qi][r] = 0.0f;
    };
    /* selection of one tile, one reference column of the register tile at a time */
    const unsigned lt_mask = (1u << lane) - 1u;
    auto select = [&](int jt) {
#pragma unroll
        for (int r = 0; r < kFusedTR; ++r) {
            const int j = jt + 4 * lane + r;
#pragma unroll
            for (int qi = 0; qi < kFusedQW; ++qi) {
                const float e = Dist::clamp(acc[qi][r]);
                const bool in = e < fs.thr[qi] && j < j1 && (unsigned)j - (unsigned)sb != (unsigned)qi;
                const unsigned m = __ballot_sync(0xffffffffu, in);
                if (m) { /* warp-uniform */
                    unsigned long long *queue = queues + qi * kFusedQueue;
                    if (in) queue[fs.qc[qi] + __popc(m & lt_mask)] = fkey(e, j);
                    fs.qc[qi] += __popc(m);
                    if (fs.qc[qi] >= kWarp) fused_flush(fs, queue, qi);
                }
            }
        }
    };

    for (int st = 0; st < nstage; ++st) {
        __syncthreads(); /* readers of the previous stage are done */
        load(st);
        __syncthreads(); /* the stage (and, the first time, qsm) is visible to all */
        const int jt = j0 + (st / nchunk) * tps * kFusedBR;
        if (dpad <= kFusedDC) {
            for (int sub = 0; sub < tps; ++sub) {
                if (jt + sub * kFusedBR >= j1) break; /* block-uniform */
                zero();
                dot(sub * dpad, 0, dpad);
                select(jt + sub * kFusedBR);
            }
        } else {
            const int c = st % nchunk, t0 = c * kFusedDC;
            if (c == 0) zero();
            dot(0, t0, dpad - t0 < kFusedDC ? dpad - t0 : kFusedDC);
            if (c == nchunk - 1) select(jt);
        }
    }
#pragma unroll
    for (int qi = 0; qi < kFusedQW; ++qi)
        if (fs.qc[qi] > 0) fused_flush(fs, queues + qi * kFusedQueue, qi);

#pragma unroll
    for (int qi = 0; qi < kFusedQW; ++qi) {
        const int q = q0 + warp * kFusedQW + qi;
        if (q < p.qs) {
            unsigned long long *out = p.part + ((int64_t)z * p.qsp + q) * (kWarp * R);
#pragma unroll
            for (int r = 0; r < R; ++r) out[r * kWarp + lane] = fs.w[qi][r];
        }
    }
}

/* ---- merge of the slices, certificate, canonical re-rank, output ------------------- */
__device__ __forceinline__ void fused_write(const FusedParams &p, int q, int64_t i, unsigned long long key, bool real)
{
    const int64_t o = (int64_t)q * p.k + i;
    p.ids[o] = real ? p.id_offset + (int64_t)key_idx(key) : -1;
    if (p.dist) p.dist[o] = real ? key_dist(key) : INFINITY;
}

/* One warp per query, kWarpsPerBlock queries per 256-thread block; registers only
 * (2R keys per lane), no shared memory: full occupancy. The canonical distances are
 * computed one candidate per lane, row loads through the read-only cache. */
template <class Dist, int R>
__global__ __launch_bounds__(kBlock) void finish_kernel(const FusedParams p)
{
    typedef WarpKeys<R> WK;
    const int q = (int)blockIdx.x * kWarpsPerBlock + warp_id();
    if (q >= p.qs) return;
    const int lane = lane_id();
    unsigned long long w[R], t[R];
#pragma unroll
    for (int r = 0; r < R; ++r) w[r] = p.part[(int64_t)q * WK::N + r * kWarp + lane];
    for (int z = 1; z < p.Z; ++z) {
        const unsigned long long *src = p.part + ((int64_t)z * p.qsp + q) * WK::N;
#pragma unroll
        for (int r = 0; r < R; ++r) t[r] = src[r * kWarp + lane];
        WK::template merge<R>(w, t);
    }
    const unsigned long long last = __shfl_sync(0xffffffffu, w[R - 1], kWarp - 1);
    const float ek = fkey_e(WK::get(w, p.kk - 1));
    const float tp = ek == INFINITY ? INFINITY : tau_prime(Dist::upper(p, ek));
    const bool ok = last == kPadKey || Dist::lower(p, fkey_e(last)) > tp;
    if (lane == 0) {
        p.flag[q] = ok ? 0 : 1;
        p.tpv[q] = tp;
        if (!ok) atomicAdd(p.stats + kStatReruns, 1ull);
    }
    if (!ok) return;

    const float *qrow = p.Q + (int64_t)q * p.ldq;
    int have = 0;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const bool cand = w[r] != kPadKey && Dist::lower(p, fkey_e(w[r])) <= tp;
        const int j = key_idx(w[r]);
        w[r] = cand ? make_key(Dist::canonical(p, qrow, p.R + (int64_t)j * p.ldr), j) : ~0ull;
        have += __popc(__ballot_sync(0xffffffffu, cand));
    }
    if (lane == 0) atomicAdd(p.stats + kStatAppended, (unsigned long long)have);
    WK::sort(w);
    const int lim = have < p.kk ? have : p.kk;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = r * kWarp + lane;
        if (i < p.k) fused_write(p, q, i, w[r], i < lim);
    }
    /* pad_missing with k beyond the list (only when fewer than k references exist) */
    for (int64_t i = WK::N + lane; i < p.k; i += kWarp) fused_write(p, q, i, 0ull, false);
}

/* ---- rescue: exact search of the queries whose certificate failed ------------------- */
struct RescueSmem {
    unsigned long long keys[kRescueCap];
    union {
        BlockScan::TempStorage scan;
        BlockRadixSelect<unsigned long long>::TempStorage sel;
    } u;
};

/* Cuts keys[0, cnt) to its kk smallest (unique keys), in place, order kept; returns kk. */
__device__ __forceinline__ int rescue_shrink(RescueSmem &sm, int cnt, int kk)
{
    const unsigned long long K = BlockRadixSelect<unsigned long long>::select(
        sm.u.sel,
        [&](auto f) {
            for (int i = (int)threadIdx.x; i < cnt; i += kBlock) f(sm.keys[i]);
        },
        kk);
    int out = 0;
    for (int b = 0; b < cnt; b += kBlock) {
        const int i = b + (int)threadIdx.x;
        const unsigned long long v = i < cnt ? sm.keys[i] : ~0ull;
        const bool keep = i < cnt && v <= K;
        int total;
        const int pos = BlockScan::exclusive(sm.u.scan, keep ? 1 : 0, total);
        if (keep) sm.keys[out + pos] = v; /* below every index a later step reads */
        out += total;
    }
    __syncthreads();
    return out;
}

/* Launch: 256 threads, grid min(qs, 2 SMs): blocks stride over the state block and skip
 * certified queries (one flag read). 33 KB static shared memory. The per-reference work
 * (float distance, bound, and for candidates the canonical distance) reads rows through
 * the read-only cache; only failed queries pay it. */
template <class Dist>
__global__ __launch_bounds__(kBlock) void rescue_kernel(const FusedParams p)
{
    __shared__ RescueSmem sm;
    const int tid = (int)threadIdx.x;
    for (int q = (int)blockIdx.x; q < p.qs; q += (int)gridDim.x) {
        if (!p.flag[q]) continue;
        const float tp = p.tpv[q];
        const float *qrow = p.Q + (int64_t)q * p.ldq;
        const int64_t sj = p.self_local0 + q;
        const int64_t self = p.exclude ? sj : -1;
        int cnt = 0;
        for (int64_t b = 0; b < p.n; b += kBlock) {
            const int64_t j = b + tid;
            bool cand = false;
            unsigned long long key = 0;
            if (j < p.n && j != self) {
                const float *x = p.R + j * p.ldr;
                if (Dist::lower(p, Dist::fast(p, qrow, x)) <= tp) {
                    key = make_key(Dist::canonical(p, qrow, x), (int)j);
                    cand = true;
                }
            }
            int total;
            const int pos = BlockScan::exclusive(sm.u.scan, cand ? 1 : 0, total);
            if (cnt + total > kRescueCap) cnt = rescue_shrink(sm, cnt, p.kk);
            if (cand) sm.keys[cnt + pos] = key;
            cnt += total;
            __syncthreads();
        }
        if (cnt > p.kk) cnt = rescue_shrink(sm, cnt, p.kk);
        int P = 2;
        while (P < cnt) P <<= 1;
        for (int i = tid; i < P; i += kBlock)
            if (i >= cnt) sm.keys[i] = ~0ull;
        __syncthreads();
        block_bitonic_sort(sm.keys, P);
        for (int64_t i = tid; i < p.k; i += kBlock) fused_write(p, q, i, i < cnt ? sm.keys[i] : 0ull, i < cnt);
        if (tid == 0) atomicAdd(p.stats + kStatAppended, (unsigned long long)cnt);
        __syncthreads();
    }
}

template <class Dist, int R>
cudaError_t launch_fused_r(const FusedParams &p, int z0, int nz, cudaStream_t st)
{
    FusedParams q = p;
    q.z0 = z0;
    const dim3 grid((unsigned)((p.qs + kFusedQB - 1) / kFusedQB), (unsigned)nz);
    const size_t smem = fused_smem_bytes((int)((p.d + 3) & ~3));
    cudaError_t e = cudaFuncSetAttribute(fused_kernel<Dist, R>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess) return e;
    fused_kernel<Dist, R><<<grid, kFusedThreads, smem, st>>>(q);
    return cudaGetLastError();
}

template <class Dist, int R>
cudaError_t launch_finish_r(const FusedParams &p, int rescue_blocks, cudaStream_t st)
{
    finish_kernel<Dist, R><<<(unsigned)((p.qs + kWarpsPerBlock - 1) / kWarpsPerBlock), kBlock, 0, st>>>(p);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    rescue_kernel<Dist><<<(unsigned)rescue_blocks, kBlock, 0, st>>>(p);
    return cudaGetLastError();
}

cudaError_t launch_fused_slices(const FusedParams &p, int kp, int z0, int nz, cudaStream_t st)
{
    switch (kp) {
    case 32: return launch_fused_r<L2Direct, 1>(p, z0, nz, st);
    case 64: return launch_fused_r<L2Direct, 2>(p, z0, nz, st);
    case 128: return launch_fused_r<L2Direct, 4>(p, z0, nz, st);
    case 256: return launch_fused_r<L2Direct, 8>(p, z0, nz, st);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_fused_finish(const FusedParams &p, int kp, int rescue_blocks, cudaStream_t st)
{
    switch (kp) {
    case 32: return launch_finish_r<L2Direct, 1>(p, rescue_blocks, st);
    case 64: return launch_finish_r<L2Direct, 2>(p, rescue_blocks, st);
    case 128: return launch_finish_r<L2Direct, 4>(p, rescue_blocks, st);
    case 256: return launch_finish_r<L2Direct, 8>(p, rescue_blocks, st);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace xknn_cuda
