/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/generic.cu -- every metric and dtype on the device: the canonical
 * distance itself, tile by tile, with the selection fused in.
 *
 * WHAT IT COMPUTES
 * For the pairs the tensor-core and cuBLAS paths do not cover (l1, minkowski, chebyshev,
 * ip, cosine, hellinger on any dtype; l2/euclidean on f16, bf16, u8, i8; hamming and
 * whamming on bit-packed rows) every distance is the canonical value of docs/DESIGN.md
 * section 2, evaluated with the per-dimension steps of xknn/impl/canonical_math.h, the
 * same source the CPU backend compiles. No bound, no re-rank: the value computed here is
 * the reported one, so there is nothing to certify.
 *
 * TILES
 * A block of 256 threads owns kGenQ = 64 queries of the state block and one split of the
 * references. It walks the split in tiles of kGenR = 128 references; each tile's
 * dimensions pass through shared memory kGenD at a time, converted once to double (for
 * hellinger: to their square roots; bit-packed rows stay 64-bit words). Warp w holds
 * queries 8w .. 8w+7 and lane l references l, l+32, l+64, l+96 of the tile: 32
 * accumulators per thread, 12 shared-memory loads per dimension for 32 steps. Every
 * accumulator runs through the dimensions in order, as the canonical definition asks.
 *
 * SELECTION (per query, warp-local: a query's 128 tile values are all in one warp)
 * Keys are 64-bit: the order encoding of the value (for ip: of -value) above the local
 * reference id, so (key ascending) == (result order) and keys are unique. Each (query,
 * split) has a buffer of cap >= kk + kGenR entries in global memory and a threshold th
 * (initially ~0). A tile value is appended when its key is below th. When a tile's
 * appends would overflow the buffer, the warp selects the kk-th smallest key K of the
 * buffer (radix select, 8-bit digits, a 256-bin histogram per warp), keeps the kk keys
 * <= K and sets th = K: any key above K has kk better ones and cannot be in the top kk.
 * The buffers are Cand records (c = the encoded key bits, lo = -inf), so final.cu's
 * gather and sort produce the output exactly as for the other paths.
 */
#include <type_traits>

#include "block_primitives.cuh"
#include "kernels.cuh"
#include "xknn/impl/canonical_math.h"

namespace xknn_cuda {

namespace {

enum : int {
    kGenThreads = 256,
    kGenQW = kGenQ / kWarpsPerBlock, /* queries per warp   */
    kGenRL = kGenR / kWarp,          /* references per lane */
};
static_assert((int)kGenThreads == (int)kBlock, "the generic kernel uses the block layer's warp count");

/* ---- element loading -------------------------------------------------------------- */
/* Element t of a row of the given dtype as double, exactly (the canonical conversion). */
__device__ __forceinline__ double load_elem(const char *row, int64_t t, int dtype)
{
    switch (dtype) {
    case XKNN_DTYPE_F16: return xknn__cm_f16(((const uint16_t *)row)[t]);
    case XKNN_DTYPE_BF16: return xknn__cm_bf16(((const uint16_t *)row)[t]);
    case XKNN_DTYPE_U8: return (double)((const uint8_t *)row)[t];
    case XKNN_DTYPE_I8: return (double)((const int8_t *)row)[t];
    default: return (double)((const float *)row)[t];
    }
}

/* ---- per-metric operations -------------------------------------------------------- */
/* Each Op: Elem (what shared memory holds per dimension), Acc, stage() (global element
 * -> Elem), step(), and value() (the reported float). */
struct RealOp {
    typedef double Elem;
    typedef double Acc;
    __device__ __forceinline__ static Elem stage(const char *row, int64_t t, const GenParams &p)
    {
        const double v = load_elem(row, t, p.dtype);
        return p.sqrt_inputs ? __dsqrt_rn(v) : v;
    }
};

struct OpL2 : RealOp { /* l2, euclidean, hellinger (on square roots) */
    __device__ __forceinline__ static Acc step(Acc a, Elem x, Elem y, double) { return xknn__cm_step_l2(a, x, y); }
};
struct OpL1 : RealOp {
    __device__ __forceinline__ static Acc step(Acc a, Elem x, Elem y, double) { return xknn__cm_step_l1(a, x, y); }
};
struct OpMinkowski : RealOp { /* two passes: max(|x - y|), then the scaled sum */
    __device__ __forceinline__ static Acc step(Acc a, Elem x, Elem y, double p, double m)
    {
        return xknn__cm_step_minkowski(a, x, y, p, m);
    }
};
struct OpChebyshev : RealOp {
    __device__ __forceinline__ static Acc step(Acc a, Elem x, Elem y, double)
    {
        return xknn__cm_step_chebyshev(a, x, y);
    }
};
struct OpIp : RealOp { /* ip and cosine (the norms are per row, computed once) */
    __device__ __forceinline__ static Acc step(Acc a, Elem x, Elem y, double) { return xknn__cm_step_ip(a, x, y); }
};

/* Bit-packed rows: 64-bit words, bits past d already cleared by stage(). */
struct BinOp {
    typedef unsigned long long Elem;
    __device__ __forceinline__ static Elem stage(const char *row, int64_t w, const GenParams &p)
    {
        Elem v = ((const unsigned long long *)row)[w];
        if (w == p.words - 1 && (p.d & 63)) v &= (1ull << (p.d & 63)) - 1ull;
        return v;
    }
};
struct OpHamming : BinOp {
    typedef int Acc; /* d <= INT_MAX bits (check_sizes) */
    __device__ __forceinline__ static Acc step(Acc a, Elem x, Elem y, double) { return a + __popcll(x ^ y); }
};

/* whamming: the word index is needed for the weights, so its step is written in the
 * kernel's dimension loop through step_w(). */
struct OpWHamming : BinOp {
    typedef double Acc;
};

__device__ __forceinline__ double whamming_word(double acc, unsigned long long v, const float *__restrict__ w)
{
    while (v) {
        const int bit = __ffsll((long long)v) - 1; /* lowest set bit first: increasing b */
        acc = xknn__cm_add(acc, fabs((double)__ldg(w + bit)));
        v &= v - 1ull;
    }
    return acc;
}

/* The reported float of one pair. */
template <class Op>
__device__ __forceinline__ float pair_value(typename Op::Acc acc, const GenParams &p, int qi, int col)
{
    if (p.metric == XKNN_METRIC_COSINE) return (float)xknn__cm_cosine(acc, p.qnorm[qi], p.rnorm[col]);
    if (p.metric == XKNN_METRIC_HAMMING) return (float)acc;
    return xknn__cm_finish((xknn_metric)p.metric, (double)acc);
}

/* ---- selection -------------------------------------------------------------------- */
__device__ __forceinline__ unsigned long long cand_key(const Cand &e)
{
    return ((unsigned long long)__float_as_uint(e.c) << 32) | (unsigned)e.idx;
}

/* r-th smallest key (1-based, r <= count) of buf[0, count), by one warp; hist: 256 ints
 * of this warp's shared memory. */
__device__ __noinline__ unsigned long long warp_select(int *hist, const Cand *buf, int count, int r)
{
    const int lane = lane_id();
    unsigned long long prefix = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = lane; i < kRadixBins; i += kWarp) hist[i] = 0;
        __syncwarp();
        const unsigned long long hi = shift == 56 ? 0ull : (~0ull << (shift + 8));
        for (int i = lane; i < count; i += kWarp) {
            const unsigned long long key = cand_key(buf[i]);
            if ((key & hi) == prefix) atomicAdd(&hist[(int)((key >> shift) & 255u)], 1);
        }
        __syncwarp();
        int bin;
        warp_rank_bin(hist, r, &bin, &r);
        prefix |= (unsigned long long)bin << shift;
        __syncwarp();
    }
    return prefix;
}

/* Keeps the entries with key <= K, in order, in place; returns their number. */
__device__ __noinline__ int warp_keep_le(Cand *buf, int count, unsigned long long K)
{
    const int lane = lane_id();
    int out = 0;
    for (int base = 0; base < count; base += kWarp) {
        const int i = base + lane;
        Cand e;
        bool keep = false;
        if (i < count) {
            e = buf[i];
            keep = cand_key(e) <= K;
        }
        const unsigned m = __ballot_sync(0xffffffffu, keep);
        __syncwarp(); /* every read of this step precedes its writes (out <= base) */
        if (keep) buf[out + __popc(m & ((1u << lane) - 1u))] = e;
        out += __popc(m);
        __syncwarp();
    }
    return out;
}

/* One query's tile values (lane l: references l + 32 j of the tile at column t0) into
 * its (query, split) buffer; th and cnt are the query's state in shared memory. Returns
 * this lane's share of the appended count (lane 0 counts all). */
template <class Op>
__device__ __forceinline__ unsigned long long select_tile(const GenParams &p, int *hist, unsigned long long &th_s,
                                                          int &cnt_s, const typename Op::Acc (&acc)[kGenRL], int qi,
                                                          int s, int64_t t0, int64_t c1)
{
    const int lane = lane_id();
    Cand *seg = p.cand + ((int64_t)qi * p.S + s) * p.cap;
    unsigned long long th = th_s;
    unsigned long long key[kGenRL];
    bool ok[kGenRL];
    int total = 0;
#pragma unroll
    for (int j = 0; j < kGenRL; ++j) {
        const int64_t col = t0 + lane + kWarp * j;
        const int64_t id = p.r_local0 + col;
        ok[j] = col < c1 && !(p.exclude && id == p.self_local0 + qi);
        float v = 0.0f;
        if (ok[j]) v = pair_value<Op>(acc[j], p, qi, (int)col);
        key[j] = ((unsigned long long)order_enc(p.negate ? __fsub_rn(0.0f, v) : v) << 32) | (unsigned)id;
        total += __popc(__ballot_sync(0xffffffffu, ok[j] && key[j] < th));
    }
    if (total == 0) return 0;
    int c = cnt_s;
    if (c + total > p.cap) { /* c > cap - kGenR >= kk: the select is defined */
        th = warp_select(hist, seg, c, p.kk);
        c = warp_keep_le(seg, c, th);
    }
    unsigned long long appended = 0;
#pragma unroll
    for (int j = 0; j < kGenRL; ++j) {
        const bool f = ok[j] && key[j] < th;
        const unsigned m = __ballot_sync(0xffffffffu, f);
        if (f) {
            Cand e;
            e.lo = -INFINITY;
            e.up = 0.0f;
            e.c = __uint_as_float((unsigned)(key[j] >> 32));
            e.idx = (int)(unsigned)(key[j] & 0xffffffffu);
            seg[c + __popc(m & ((1u << lane) - 1u))] = e;
        }
        c += __popc(m);
        appended += lane == 0 ? __popc(m) : 0;
    }
    __syncwarp();
    if (lane == 0) {
        th_s = th;
        cnt_s = c;
    }
    __syncwarp();
    return appended;
}

/* ---- the tile kernel ---------------------------------------------------------------- */
template <class Op>
struct GenSmem {
    typename Op::Elem q[kGenD][kGenQ];
    typename Op::Elem r[kGenD][kGenR + 1]; /* +1: conflict-free transposed stores */
    int hist[kWarpsPerBlock][kRadixBins];
    unsigned long long th[kGenQ];
    int cnt[kGenQ];
};

/*
 * Grid (S, ceil(qs / kGenQ)), 256 threads, static shared memory ~36 KB (double
 * elements). Launch bounds (256, 2): up to 128 registers for the 32 accumulators.
 * Split s covers columns [s rs, min(n, (s+1) rs)) of this launch's references, whose
 * local ids start at r_local0; state (buffer counts and thresholds) persists across
 * launches, so streamed chunks continue the same selection.
 */
template <class Op>
__global__ __launch_bounds__(kGenThreads, 2) void gen_tile_kernel(const GenParams p)
{
    __shared__ GenSmem<Op> sm;
    typedef typename Op::Acc Acc;
    const int s = (int)blockIdx.x, tid = (int)threadIdx.x, lane = lane_id(), warp = warp_id();
    const int qg0 = (int)blockIdx.y * kGenQ;
    const int64_t c0 = (int64_t)s * p.rs;
    if (c0 >= p.n) return;
    const int64_t c1 = c0 + p.rs < p.n ? c0 + p.rs : p.n;
    const int64_t dims = p.words ? p.words : p.d; /* BIN: words */

    if (tid < kGenQ) {
        const int qi = qg0 + tid;
        const int64_t st = (int64_t)(qi < p.qs ? qi : 0) * p.S + s;
        sm.th[tid] = qi < p.qs ? p.th[st] : 0ull;
        sm.cnt[tid] = qi < p.qs ? p.cnt[st] : 0;
    }
    unsigned long long appended = 0;

    constexpr bool kTwoPass = std::is_same<Op, OpMinkowski>::value; /* pass 0: the max |x - y| */
    for (int64_t t0 = c0; t0 < c1; t0 += kGenR) {
        Acc acc[kGenQW][kGenRL];
        double mx[kGenQW][kGenRL];
#pragma unroll
        for (int pass = 0; pass < (kTwoPass ? 2 : 1); ++pass) {
#pragma unroll
        for (int i = 0; i < kGenQW; ++i)
#pragma unroll
            for (int j = 0; j < kGenRL; ++j) {
                if (kTwoPass && pass == 1) mx[i][j] = (double)acc[i][j];
                acc[i][j] = 0;
            }

        for (int64_t d0 = 0; d0 < dims; d0 += kGenD) {
            const int dc = dims - d0 < kGenD ? (int)(dims - d0) : kGenD;
            __syncthreads(); /* the previous chunk's reads are done */
            for (int e = tid; e < kGenQ * kGenD; e += kGenThreads) {
                const int row = e / kGenD, t = e % kGenD, qi = qg0 + row;
                typename Op::Elem v = 0;
                if (qi < p.qs && t < dc) v = Op::stage(p.Q + (int64_t)qi * p.ldq, d0 + t, p);
                sm.q[t][row] = v;
            }
            for (int e = tid; e < kGenR * kGenD; e += kGenThreads) {
                const int row = e / kGenD, t = e % kGenD;
                const int64_t col = t0 + row;
                typename Op::Elem v = 0;
                if (col < c1 && t < dc) v = Op::stage(p.R + col * p.ldr, d0 + t, p);
                sm.r[t][row] = v;
            }
            __syncthreads();
            for (int t = 0; t < dc; ++t) {
                typename Op::Elem xr[kGenRL];
#pragma unroll
                for (int j = 0; j < kGenRL; ++j) xr[j] = sm.r[t][lane + kWarp * j];
#pragma unroll
                for (int i = 0; i < kGenQW; ++i) {
                    const typename Op::Elem xq = sm.q[t][warp * kGenQW + i];
#pragma unroll
                    for (int j = 0; j < kGenRL; ++j) {
                        if constexpr (std::is_same<Op, OpWHamming>::value)
                            acc[i][j] = whamming_word(acc[i][j], xq ^ xr[j], p.weights + (d0 + t) * 64);
                        else if constexpr (kTwoPass)
                            acc[i][j] = pass == 0 ? xknn__cm_step_chebyshev(acc[i][j], xq, xr[j])
                                                  : Op::step(acc[i][j], xq, xr[j], p.p, mx[i][j]);
                        else
                            acc[i][j] = Op::step(acc[i][j], xq, xr[j], p.p);
                    }
                }
            }
        }
        }
        if constexpr (kTwoPass) /* the reported value, which pair_value passes on */
#pragma unroll
            for (int i = 0; i < kGenQW; ++i)
#pragma unroll
                for (int j = 0; j < kGenRL; ++j) acc[i][j] = xknn__cm_minkowski(acc[i][j], p.p, mx[i][j]);

        /* selection: warp w, its kGenQW queries, one at a time (unrolled: acc[i] must
         * stay in registers) */
#pragma unroll
        for (int i = 0; i < kGenQW; ++i) {
            const int ql = warp * kGenQW + i, qi = qg0 + ql;
            if (qi < p.qs) /* warp-uniform */
                appended += select_tile<Op>(p, sm.hist[warp], sm.th[ql], sm.cnt[ql], acc[i], qi, s, t0, c1);
        }
    }

    __syncthreads();
    if (tid < kGenQ && qg0 + tid < p.qs) {
        const int64_t st = (int64_t)(qg0 + tid) * p.S + s;
        p.th[st] = sm.th[tid];
        p.cnt[st] = sm.cnt[tid];
    }
    if (lane == 0 && appended) atomicAdd(p.stats + kStatAppended, appended);
}

/* Per row: the canonical sum of squares (cosine's nx), dimension order, one thread per
 * row (the chain is sequential by definition). */
__global__ __launch_bounds__(kBlock) void gen_norm_kernel(const char *X, int64_t ld, int64_t rows, int64_t d,
                                                          int dtype, double *out)
{
    const int64_t row = (int64_t)blockIdx.x * kBlock + threadIdx.x;
    if (row >= rows) return;
    const char *x = X + row * ld;
    double nx = 0.0;
    for (int64_t t = 0; t < d; ++t) {
        const double v = load_elem(x, t, dtype);
        nx = xknn__cm_step_ip(nx, v, v);
    }
    out[row] = nx;
}

__global__ __launch_bounds__(kBlock) void gen_init_kernel(unsigned long long *th, int64_t count)
{
    for (int64_t i = (int64_t)blockIdx.x * kBlock + threadIdx.x; i < count; i += (int64_t)gridDim.x * kBlock)
        th[i] = ~0ull;
}

template <class Op>
cudaError_t launch_tiles(const GenParams &p, cudaStream_t st)
{
    const dim3 grid((unsigned)p.S, (unsigned)((p.qs + kGenQ - 1) / kGenQ));
    gen_tile_kernel<Op><<<grid, kGenThreads, 0, st>>>(p);
    return cudaGetLastError();
}

} // namespace

cudaError_t launch_gen_norms(const void *X, int64_t ld_bytes, int64_t rows, int64_t d, int dtype, double *out,
                             cudaStream_t st)
{
    if (rows <= 0) return cudaSuccess;
    gen_norm_kernel<<<(unsigned)((rows + kBlock - 1) / kBlock), kBlock, 0, st>>>((const char *)X, ld_bytes, rows, d,
                                                                               dtype, out);
    return cudaGetLastError();
}

cudaError_t launch_gen_init(unsigned long long *th, int64_t count, cudaStream_t st)
{
    int64_t blocks = (count + kBlock - 1) / kBlock;
    if (blocks > 4096) blocks = 4096;
    if (blocks < 1) blocks = 1;
    gen_init_kernel<<<(unsigned)blocks, kBlock, 0, st>>>(th, count);
    return cudaGetLastError();
}

cudaError_t launch_gen_tiles(const GenParams &p, cudaStream_t st)
{
    switch (p.metric) {
    case XKNN_METRIC_L2:
    case XKNN_METRIC_EUCLIDEAN:
    case XKNN_METRIC_HELLINGER: return launch_tiles<OpL2>(p, st);
    case XKNN_METRIC_L1: return launch_tiles<OpL1>(p, st);
    case XKNN_METRIC_MINKOWSKI: return launch_tiles<OpMinkowski>(p, st);
    case XKNN_METRIC_CHEBYSHEV: return launch_tiles<OpChebyshev>(p, st);
    case XKNN_METRIC_IP:
    case XKNN_METRIC_COSINE: return launch_tiles<OpIp>(p, st);
    case XKNN_METRIC_HAMMING: return launch_tiles<OpHamming>(p, st);
    case XKNN_METRIC_WHAMMING: return launch_tiles<OpWHamming>(p, st);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace xknn_cuda
