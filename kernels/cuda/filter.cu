/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/filter.cu -- norms, state initialisation, the candidate filter of each
 * distance tile, and the end-of-pass resolution.
 *
 * THE FILTER (the CPU backend's certificate, kernels/cpu/cpu_search.c, on the GPU)
 * For query i and reference j the tile holds T = -2 q.x from cuBLAS; with s = |q|^2 +
 * |x|^2 (norms rounded to float) and D the exact squared distance,
 *     L = e - m <= D <= U = e + m,   e = s + T,   m = mrel * s + mabs,
 * evaluated in float with explicit roundings. plan.cu derives mrel and mabs: they hold
 * the GEMM's error bound (fp32 or TF32) plus the float rounding of these four operations.
 * Per query tau = the k-th smallest U seen so far (only decreases; shared by the splits
 * of a query through atomicMin on its bits: U > 0, so integer order = float order).
 * Every reference with L <= tau' = tau (1 + 2^-19) + 16 FLT_MIN goes into the query's
 * candidate buffer; any other one has D > tau', so its canonical float is strictly
 * greater than that of k references with D <= tau, whatever its id: it cannot be in the
 * top k. Pairs whose s or e leave the float range get L = -inf, U = +inf (always kept,
 * never tightening tau): huge values stay exact, only slower.
 *
 * BUFFER FULL -> EXACT COMPACTION, NEVER A RE-RUN
 * docs/DESIGN.md section 2.3's exact re-run becomes: when the buffer cannot take the
 * next chunk's candidates, (1) tau is tightened to the k-th smallest U over buffer and
 * chunk, and entries with L > tau' are dropped; (2) if it is still too full (many
 * near-ties), canonical distances of the buffer are computed and only its exact top k by
 * (canonical, id) stays, marked exact (lo = -inf: never dropped by a bound again). Both
 * steps only drop references that k others provably beat, so nothing that could be in
 * the top k is ever lost and no query is ever searched twice. The capacity is
 * 2k + kChunk + 1024, so after (2) a whole chunk always fits.
 */
#include "block_primitives.cuh"
#include "kernels.cuh"

namespace xknn_cuda {

/* ---- norms ------------------------------------------------------------------------ */
/* One warp per row; lanes stride the dimensions, double accumulation, shuffle tree.
 * Any order is fine here: the norms only enter the bound, whose derivation allows a
 * relative error of u + d 2^-53. Launch: 256 threads = 8 rows per block, grid rows/8;
 * no shared memory, ~30 registers: full occupancy; memory-bound, coalesced. */
/* The double sum of squares of row x (d elements), on every lane of the warp. */
__device__ __forceinline__ double warp_row_sumsq(const float *__restrict__ x, int64_t d)
{
    double acc = 0.0;
    for (int64_t t = lane_id(); t < d; t += kWarp) {
        const double v = (double)__ldg(x + t);
        acc = __fma_rn(v, v, acc);
    }
    return warp_sum(acc);
}

__global__ __launch_bounds__(kBlock) void sqnorm_kernel(const float *__restrict__ X, int64_t ld, int64_t rows,
                                                        int64_t d, float *__restrict__ out)
{
    const int64_t row = (int64_t)blockIdx.x * kNormRowsPerBlock + warp_id();
    if (row >= rows) return;
    const double acc = warp_row_sumsq(X + row * ld, d);
    if (lane_id() == 0) out[row] = __double2float_rn(acc);
}

cudaError_t launch_sqnorms(const float *X, int64_t ld, int64_t rows, int64_t d, float *out, cudaStream_t st)
{
    if (rows <= 0) return cudaSuccess;
    const int64_t blocks = (rows + kNormRowsPerBlock - 1) / kNormRowsPerBlock;
    sqnorm_kernel<<<(unsigned)blocks, kBlock, 0, st>>>(X, ld, rows, d, out);
    return cudaGetLastError();
}

/* ---- state ------------------------------------------------------------------------ */
/* Unit rows for cosine's tensor-core candidates: out row = x / |x| (0 for a zero row),
 * ld_out >= d, the columns [d, ld_out) zero. One warp per row: the sum of squares in
 * double (any order), inv = 1 / sqrt(sum) in double, each element (float)(x_t * inv).
 * Every element is then x_t / |x| (1 + r), |r| <= 2^-24 + (d + 4) 2^-53 (plus an
 * absolute 2^-150 where it underflows), the error plan.cu's cosine bound allows; no
 * input can overflow it. */
__global__ __launch_bounds__(kBlock) void unit_rows_kernel(const float *__restrict__ X, int64_t ld, int64_t rows,
                                                           int64_t d, float *__restrict__ out, int64_t ld_out)
{
    const int64_t row = (int64_t)blockIdx.x * kNormRowsPerBlock + warp_id();
    if (row >= rows) return;
    const float *x = X + row * ld;
    const double acc = warp_row_sumsq(x, d);
    const double inv = acc > 0.0 ? __drcp_rn(__dsqrt_rn(acc)) : 0.0;
    float *y = out + row * ld_out;
    for (int64_t t = lane_id(); t < ld_out; t += kWarp)
        y[t] = t < d ? __double2float_rn(__dmul_rn((double)__ldg(x + t), inv)) : 0.0f;
}

cudaError_t launch_unit_rows(const float *X, int64_t ld, int64_t rows, int64_t d, float *out, int64_t ld_out,
                             cudaStream_t st)
{
    if (rows <= 0) return cudaSuccess;
    const int64_t blocks = (rows + kNormRowsPerBlock - 1) / kNormRowsPerBlock;
    unit_rows_kernel<<<(unsigned)blocks, kBlock, 0, st>>>(X, ld, rows, d, out, ld_out);
    return cudaGetLastError();
}

/* ---- centred rows (l2 / euclidean tensor-core passes) --------------------------------
 * The TF32 bound is relative to s = |q|^2 + |x|^2, and L2 distances do not change when
 * both points move by the same vector mu; plan.cu (center_wanted) takes mu = the mean
 * of the references (a sample of them), so the tensor cores see rows of smaller norm
 * and the bound's band holds fewer candidates. */

/* mu[c] = the mean of the finite values of column c over the rows floor(j rows / m),
 * j = 0..m-1 (m = min(rows, kMeanSample); 0 where none is finite): double sums in a fixed
 * order, so mu is the same bits on every run. Any finite mu is valid (mma.cu's derivation
 * holds for every mu); a fair one only makes the band narrower. A NaN or infinite input
 * left out keeps mu finite, so only its own rows' pairs become candidates (norm NaN or
 * infinite), not every pair. One block per column (a gather of m scattered floats). */
constexpr int64_t kMeanSample = 8192;
__global__ __launch_bounds__(kBlock) void mean_rows_kernel(const float *__restrict__ X, int64_t ld, int64_t rows,
                                                           int64_t m, float *__restrict__ mu)
{
    constexpr int kU = 8; /* loads in flight a thread (the gather is latency-bound) */
    __shared__ double part[kBlock];
    __shared__ int cnt[kBlock];
    const int64_t c = blockIdx.x;
    double a[kU];
    int nf = 0;
#pragma unroll
    for (int u = 0; u < kU; ++u) a[u] = 0.0;
    int64_t j = threadIdx.x;
    for (; j + (kU - 1) * kBlock < m; j += kU * kBlock) {
        float v[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) v[u] = __ldg(X + ((j + u * kBlock) * rows / m) * ld + c);
#pragma unroll
        for (int u = 0; u < kU; ++u)
            if (isfinite(v[u])) {
                a[u] += (double)v[u];
                ++nf;
            }
    }
    for (; j < m; j += kBlock) {
        const float v = __ldg(X + (j * rows / m) * ld + c);
        if (isfinite(v)) {
            a[0] += (double)v;
            ++nf;
        }
    }
    double acc = 0.0;
#pragma unroll
    for (int u = 0; u < kU; ++u) acc += a[u];
    part[threadIdx.x] = acc;
    cnt[threadIdx.x] = nf;
    __syncthreads();
    for (int h = kBlock / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) {
            part[threadIdx.x] += part[threadIdx.x + h];
            cnt[threadIdx.x] += cnt[threadIdx.x + h];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) mu[c] = cnt[0] > 0 ? __double2float_rn(part[0] / (double)cnt[0]) : 0.0f;
}

cudaError_t launch_mean_rows(const float *X, int64_t ld, int64_t rows, int64_t d, float *mu, cudaStream_t st)
{
    if (rows <= 0 || d <= 0) return cudaSuccess;
    mean_rows_kernel<<<(unsigned)d, kBlock, 0, st>>>(X, ld, rows, rows < kMeanSample ? rows : kMeanSample, mu);
    return cudaGetLastError();
}

/* out row = tf32(b), b_t = fl(x_t - mu_t) (one float rounding: b_t = (x_t - mu_t)(1 + e),
 * |e| <= 2^-24, exact where the difference is subnormal), tf32 = cvt.rna (the 13 low
 * bits zero, relative error <= 2^-11), the columns [d, ld_out) zero; norms[row] = |b|^2
 * (double sum of the unrounded b_t, rounded to float once), the norm the bound takes
 * for the operand the tensor cores round (as the staged queries). One warp per row. */
__global__ __launch_bounds__(kBlock) void center_rows_kernel(const float *__restrict__ X, int64_t ld, int64_t rows,
                                                             int64_t d, const float *__restrict__ mu,
                                                             float *__restrict__ out, int64_t ld_out,
                                                             float *__restrict__ norms)
{
    const int64_t row = (int64_t)blockIdx.x * kNormRowsPerBlock + warp_id();
    if (row >= rows) return;
    const float *x = X + row * ld;
    float *y = out + row * ld_out;
    double acc = 0.0;
    for (int64_t t = lane_id(); t < ld_out; t += kWarp) {
        float v = 0.0f;
        if (t < d) {
            const float b = __fsub_rn(__ldg(x + t), __ldg(mu + t));
            acc = __fma_rn((double)b, (double)b, acc);
            v = to_tf32(b);
        }
        y[t] = v;
    }
    acc = warp_sum(acc);
    if (lane_id() == 0) norms[row] = __double2float_rn(acc);
}

cudaError_t launch_center_rows(const float *X, int64_t ld, int64_t rows, int64_t d, const float *mu, float *out,
                               int64_t ld_out, float *norms, cudaStream_t st)
{
    if (rows <= 0) return cudaSuccess;
    const int64_t blocks = (rows + kNormRowsPerBlock - 1) / kNormRowsPerBlock;
    center_rows_kernel<<<(unsigned)blocks, kBlock, 0, st>>>(X, ld, rows, d, mu, out, ld_out, norms);
    return cudaGetLastError();
}

/* tau = +inf, buffer counts = 0. Grid-stride, 256 threads. */
__global__ __launch_bounds__(kBlock) void init_state_kernel(float *tau, int *cnt, int qs, int S)
{
    const int64_t total = (int64_t)qs * S;
    for (int64_t i = (int64_t)blockIdx.x * kBlock + threadIdx.x; i < total; i += (int64_t)gridDim.x * kBlock) {
        cnt[i] = 0;
        if (i < qs) tau[i] = __int_as_float(0x7f800000);
    }
}

cudaError_t launch_init_state(float *tau, int *cnt, int qs, int S, cudaStream_t st)
{
    const int64_t total = (int64_t)qs * S;
    int64_t blocks = (total + kBlock - 1) / kBlock;
    if (blocks > 4096) blocks = 4096;
    init_state_kernel<<<(unsigned)blocks, kBlock, 0, st>>>(tau, cnt, qs, S);
    return cudaGetLastError();
}

/* ---- filter ----------------------------------------------------------------------- */
__device__ __forceinline__ float load_tau(const float *p) { return *(const volatile float *)p; }

/* Raw tile values and reference norms of one chunk for this thread: two groups of four
 * consecutive columns (float4, 16-byte aligned: ldt and chunk starts are multiples of 4),
 * scalar loads at the ragged end; columns >= c1 read as 0 (and are masked later). */
__device__ __forceinline__ void load_chunk(const float *__restrict__ trow, const float *__restrict__ rn, int base,
                                           int c1, int tid, float (&tv)[kItems], float (&nv)[kItems])
{
#pragma unroll
    for (int g = 0; g < 2; ++g) {
        const int col = base + g * (kChunk / 2) + 4 * tid;
        if (col + 3 < c1) {
            const float4 t = *reinterpret_cast<const float4 *>(trow + col);
            const float4 n = *reinterpret_cast<const float4 *>(rn + col);
            tv[g * 4 + 0] = t.x;
            tv[g * 4 + 1] = t.y;
            tv[g * 4 + 2] = t.z;
            tv[g * 4 + 3] = t.w;
            nv[g * 4 + 0] = n.x;
            nv[g * 4 + 1] = n.y;
            nv[g * 4 + 2] = n.z;
            nv[g * 4 + 3] = n.w;
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                tv[g * 4 + e] = col + e < c1 ? trow[col + e] : 0.0f;
                nv[g * 4 + e] = col + e < c1 ? rn[col + e] : 0.0f;
            }
        }
    }
}

union FilterSmem {
    BlockScan::TempStorage scan;
    BlockRadixSelect<unsigned>::TempStorage sel32;
    BlockRadixSelect<unsigned long long>::TempStorage sel64;
    BlockResolve::TempStorage res;
};

/* Lowers tau[qi] to the kk-th smallest U among the buffer's entries and (optionally) the
 * thread's flagged items, drops buffer entries with L > tau'; returns the new tau' (the
 * same in every thread) and updates bc. */
template <class EachItem>
__device__ __forceinline__ float tighten(FilterSmem &sm, float *bcast, const FilterParams &p, int qi, Cand *seg,
                                         int &bc, EachItem each_item)
{
    const unsigned K = BlockRadixSelect<unsigned>::select(
        sm.sel32,
        [&](auto f) {
            for (int j = (int)threadIdx.x; j < bc; j += kBlock) f(__float_as_uint(seg[j].up));
            each_item(f);
        },
        p.kk);
    if (threadIdx.x == 0) {
        const int old = atomicMin((int *)(p.tau + qi), (int)K);
        const float t = __int_as_float(old < (int)K ? old : (int)K);
        *bcast = tau_prime(t);
        atomicAdd(p.stats + kStatUnion, 1ull);
    }
    __syncthreads();
    const float tp = *bcast;
    bc = compact_cands(sm.scan, seg, bc, [&](Cand &e) { return e.lo <= tp; });
    return tp;
}

/*
 * One block per (split s = blockIdx.x, tile row = blockIdx.y): walks its columns of the
 * row in chunks of kChunk = 2048 (8 per thread as two float4 loads of the tile and of the
 * norms, coalesced, 16-byte aligned: ldt and split starts are multiples of 4), computes
 * L and U in registers (fixed indices only), and appends the flagged ones to the buffer
 * at positions from a block scan (one block owns a buffer: no atomics on it).
 * Launch: 256 threads, grid (S, qb) with S * qb >= 4 * SMs when the planner can; static
 * shared memory ~38 KB (union; BlockResolve's per-warp staging dominates: 5 blocks per
 * SM); __launch_bounds__(256, 3) caps registers at 80 (uncapped, the rare compaction
 * paths push it to 128; the cap spills 4 bytes) so 3 blocks = 24 warps per SM. The hot
 * path per item is 5 FP operations and a compare in 32-bit index arithmetic; a chunk
 * without candidates costs one __syncthreads_or. The tile was written by the preceding
 * GEMM and is still in L2 (the planner keeps it <= L2/2), so this pass reads L2.
 */
__global__ __launch_bounds__(kBlock, 3) void filter_kernel(const FilterParams p)
{
    __shared__ FilterSmem sm;
    __shared__ float bcast;
    const int s = (int)blockIdx.x, row = (int)blockIdx.y, tid = (int)threadIdx.x;
    /* 32-bit column arithmetic inside the tile (RC < 2^31); int64 only for addresses */
    const int rc = (int)p.rc;
    const int c0 = s * (int)p.rcs;
    if (c0 >= rc) return;
    const int c1 = c0 + (int)p.rcs < rc ? c0 + (int)p.rcs : rc;
    const int qi = p.qrow0 + row;
    Cand *seg = p.cand + ((int64_t)qi * p.S + s) * p.cap;
    int *cntp = p.cnt + (int64_t)qi * p.S + s;
    const float *trow = p.tile + (int64_t)row * p.ldt;
    const float nq = p.qn[qi];
    int self_col = -1; /* the tile column of the query itself, if in [c0, c1) */
    if (p.exclude) {
        const int64_t sc = p.self_local0 + qi - p.col_local0;
        if (sc >= c0 && sc < c1) self_col = (int)sc;
    }
    int bc = *cntp;
    if (tid == 0) bcast = tau_prime(load_tau(p.tau + qi));
    __syncthreads();
    float tp = bcast;
    const bool tau_was_inf = tp == INFINITY;
    const float qnan = __int_as_float(0x7fffffff);

    for (int base = c0; base < c1; base += kChunk) {
        float E[kItems], M[kItems]; /* L = E - M, U = E + M */
        {
            float tv[kItems], nv[kItems];
            load_chunk(trow, p.rn, base, c1, tid, tv, nv);
#pragma unroll
            for (int e = 0; e < kItems; ++e) pair_em(nq, nv[e], tv[e], p.mrel, p.mabs, E[e], M[e]);
        }
        /* block-uniform: only the last chunk and the one holding the query itself need
         * per-item masks (NaN e: never flagged) */
        if (base + kChunk > c1 || (self_col >= base && self_col < base + kChunk)) {
#pragma unroll
            for (int e = 0; e < kItems; ++e) {
                const int col = base + (e / 4) * (kChunk / 2) + 4 * tid + (e % 4);
                if (col >= c1 || col == self_col) E[e] = qnan;
            }
        }
        int nflag = 0;
#pragma unroll
        for (int e = 0; e < kItems; ++e) nflag += __fsub_rn(E[e], M[e]) <= tp;
        /* steady state: once tau is tight almost no chunk has a candidate; one barrier
         * then decides for the whole block and the scan is skipped */
        if (!__syncthreads_or(nflag)) continue;
        int total;
        int off = BlockScan::exclusive(sm.scan, nflag, total);
        if (bc + total > p.cap) {
            /* (1) bound compaction over buffer + this chunk */
            tp = tighten(sm, &bcast, p, qi, seg, bc, [&](auto f) {
#pragma unroll
                for (int e = 0; e < kItems; ++e)
                    if (__fsub_rn(E[e], M[e]) <= tp) f(__float_as_uint(__fadd_rn(E[e], M[e])));
            });
            nflag = 0;
#pragma unroll
            for (int e = 0; e < kItems; ++e) nflag += __fsub_rn(E[e], M[e]) <= tp;
            off = BlockScan::exclusive(sm.scan, nflag, total);
            if (bc + total > p.cap) {
                /* (2) exact compaction of the buffer to its canonical top kk */
                __syncthreads();
                BlockResolve::run<false>(sm.res, seg, bc, INFINITY, p.Q + (int64_t)qi * p.ldq, p.d, p.R, p.ldr,
                                  p.r_local0, p.euclid);
                __syncthreads();
                const unsigned long long K = BlockRadixSelect<unsigned long long>::select(
                    sm.sel64,
                    [&](auto f) {
                        for (int j = tid; j < bc; j += kBlock) f(make_key(seg[j].c, seg[j].idx));
                    },
                    p.kk);
                bc = compact_cands(sm.scan, seg, bc, [&](Cand &c) {
                    const bool keep = make_key(c.c, c.idx) <= K;
                    if (keep) c.lo = -INFINITY;
                    return keep;
                });
                if (tid == 0) atomicAdd(p.stats + kStatExact, 1ull);
            }
        }
        /* append this chunk's flagged items */
        int pos = bc + off;
#pragma unroll
        for (int e = 0; e < kItems; ++e) {
            const float lo = __fsub_rn(E[e], M[e]);
            if (lo <= tp) {
                const int col = base + (e / 4) * (kChunk / 2) + 4 * tid + (e % 4);
                Cand c;
                c.lo = lo;
                c.up = __fadd_rn(E[e], M[e]);
                c.c = XKNN_CUDA_UNRESOLVED;
                c.idx = (int)(p.col_local0 + col);
                seg[pos++] = c;
            }
        }
        bc += total;
        if (tid == 0) atomicAdd(p.stats + kStatAppended, (unsigned long long)total);
    }

    /* End of the row: a loose buffer (tau still +inf, or well over 2k entries) is
     * tightened now, so that the splits of a query publish a finite tau early. */
    if (bc >= p.kk && (tau_was_inf || bc > 2 * p.kk + 256)) {
        __syncthreads();
        tighten(sm, &bcast, p, qi, seg, bc, [&](auto) {});
    }
    if (tid == 0) *cntp = bc;
}

cudaError_t launch_filter(const FilterParams &p, int qb, cudaStream_t st)
{
    const dim3 grid((unsigned)p.S, (unsigned)qb);
    filter_kernel<<<grid, kBlock, 0, st>>>(p);
    return cudaGetLastError();
}

/* ---- resolve ---------------------------------------------------------------------- */
/* One block per (split, state query): drops entries with L > tau', then computes the
 * canonical distance of every unresolved survivor while its reference chunk is still on
 * the device (streamed chunks are overwritten after the pass). Launch: 256 threads, grid
 * (S, qs); ~38 KB static shared memory (WarpCanonical staging), 5 blocks per SM; the
 * work is FP64 FMAs on staged rows, coalesced 128-byte row loads.
 *
 * THE ESTIMATED THRESHOLD'S CERTIFICATE (cert > 0: plan.cu's plan_estimate, kCanonL2,
 * S = 1). tau is then the select's estimate, not a bound, and pass B appended every
 * reference with L <= tau'. If at least cert = kk entries have a canonical value <= tau,
 * no other reference can be in the top kk: it has D > tau', so its canonical value is
 * above tau' (1 - 2^-23) > tau (the canonical float is within D (2^-24 + (d + 2) 2^-53) of
 * D; tau' - tau is 2^-19 tau + 16 FLT_MIN), beyond those kk whatever the ids. A query with
 * fewer is searched again exactly (mma_rescue_kernel with p.below), and so is a query
 * whose buffer overflowed (this resolve then runs before the rescue). */
__global__ __launch_bounds__(kBlock) void resolve_kernel(const ResolveParams p)
{
    __shared__ union {
        BlockScan::TempStorage scan;
        BlockResolve::TempStorage res;
    } sm;
    __shared__ int below;
    const int s = (int)blockIdx.x, qi = (int)blockIdx.y;
    Cand *seg = p.cand + ((int64_t)qi * p.S + s) * p.cap;
    int *cntp = p.cnt + (int64_t)qi * p.S + s;
    const float tau = load_tau(p.tau + qi);
    const float tp = tau_prime(tau);
    int bc = *cntp;
    if (p.cert && threadIdx.x == 0) below = 0;
    if (bc == 0 || (p.cert && bc > p.cap)) { /* cert: an overflowed buffer is searched again too */
        if (p.cert && threadIdx.x == 0) p.below[qi] = 0;
        return;
    }
    bc = compact_cands(sm.scan, seg, bc, [&](Cand &e) { return e.lo <= tp; });
    __syncthreads();
    const int wb = BlockResolve::run(sm.res, seg, bc, tp, p.Q + (int64_t)qi * p.ldq, p.d, p.R, p.ldr, p.r_local0,
                                     p.kind, p.cert ? tau : NAN);
    if (threadIdx.x == 0) *cntp = bc;
    if (p.cert) {
        if (lane_id() == 0) atomicAdd(&below, wb);
        __syncthreads();
        if (threadIdx.x == 0) p.below[qi] = below;
    }
}

cudaError_t launch_resolve(const ResolveParams &p, int qs, cudaStream_t st)
{
    const dim3 grid((unsigned)p.S, (unsigned)qs);
    resolve_kernel<<<grid, kBlock, 0, st>>>(p);
    return cudaGetLastError();
}

/* ---- resolve by reference range --------------------------------------------------------
 * With an estimated threshold at large k (plan.cu's plan_estimate) each query holds
 * thousands of candidates, and the re-rank gathers one reference row per candidate from
 * all over the references: about 50 GB of random row reads at W3 (k = 4096), bound by
 * HBM. Each reference row is wanted by about kk / n of the queries, so the rows are read
 * many times, but queries resolved together share almost none. Resolving by reference
 * range instead: bucket_kernel reorders each query's entries by range (nb ranges of rb
 * references, a range's rows as large as the L2: tune.cuh's kRangeL2Part), then
 * resolve_range_kernel's grid runs range 0 of every query, then range 1, ...: the rows
 * of one range stay in L2 while every query gathers from it. The certificate counts are
 * summed over the ranges. Entry order within a query does not matter downstream (the
 * final selection sorts by (canonical, id)). */
constexpr int kBucketThreads = 1024;
constexpr int kRangeQueries = 8; /* queries per block of resolve_range_kernel */

__device__ __forceinline__ int range_of(const ResolveParams &p, int idx)
{
    const int64_t b = (int64_t)idx / p.rb;
    return b < p.nb ? (int)b : p.nb - 1;
}

/* One block per query: its entries through shared memory, reordered by range, and the
 * nb + 1 offsets. An overflowed buffer gets empty ranges (the rescue searches it); one
 * with more than bmax entries keeps them in range 0. below[q] is zeroed. */
__global__ __launch_bounds__(kBucketThreads) void bucket_kernel(const ResolveParams p)
{
    extern __shared__ __align__(16) unsigned char bucket_sm[];
    Cand *buf = reinterpret_cast<Cand *>(bucket_sm);
    __shared__ int hist[kMaxRanges], fill[kMaxRanges];
    const int qi = (int)blockIdx.x, tid = (int)threadIdx.x;
    Cand *seg = p.cand + (int64_t)qi * p.cap;
    int *off = p.boff + (int64_t)qi * (p.nb + 1);
    const int bc = p.cnt[qi];
    if (tid == 0) p.below[qi] = 0;
    if (bc <= 0 || bc > p.cap || bc > p.bmax) {
        const int all = bc > 0 && bc <= p.cap ? bc : 0; /* range 0 holds them all, or none */
        for (int b = tid; b <= p.nb; b += kBucketThreads) off[b] = b == 0 ? 0 : all;
        return;
    }
    for (int b = tid; b < p.nb; b += kBucketThreads) hist[b] = 0;
    __syncthreads();
    for (int i0 = 0; i0 < bc; i0 += 4 * kBucketThreads) { /* four loads in flight a thread */
        Cand e[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = i0 + u * kBucketThreads + tid;
            if (i < bc) e[u] = seg[i];
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = i0 + u * kBucketThreads + tid;
            if (i < bc) {
                buf[i] = e[u];
                atomicAdd(&hist[range_of(p, e[u].idx)], 1);
            }
        }
    }
    __syncthreads();
    if (tid == 0) {
        int sum = 0;
        for (int b = 0; b < p.nb; ++b) {
            fill[b] = sum;
            off[b] = sum;
            sum += hist[b];
        }
        off[p.nb] = sum;
    }
    __syncthreads();
    for (int i = tid; i < bc; i += kBucketThreads) {
        const Cand e = buf[i];
        seg[atomicAdd(&fill[range_of(p, e.idx)], 1)] = e;
    }
}

/* Block (x, r): range r of queries kRangeQueries x .. + kRangeQueries - 1 (blockIdx.x
 * runs fastest, so every query's range r is resolved before range r + 1 starts). The
 * entries' lo are -inf (the tensor-core passes), so nothing is compacted. */
__global__ __launch_bounds__(kBlock) void resolve_range_kernel(const ResolveParams p, int qs)
{
    __shared__ BlockResolve::TempStorage res;
    const int r = (int)blockIdx.y;
    const int q1 = min(qs, ((int)blockIdx.x + 1) * kRangeQueries);
    for (int qi = (int)blockIdx.x * kRangeQueries; qi < q1; ++qi) {
        const int *off = p.boff + (int64_t)qi * (p.nb + 1);
        const int o0 = off[r], o1 = off[r + 1];
        if (o1 <= o0) continue;
        const int wb = BlockResolve::run(res, p.cand + (int64_t)qi * p.cap + o0, o1 - o0, INFINITY,
                                         p.Q + (int64_t)qi * p.ldq, p.d, p.R, p.ldr, p.r_local0, p.kind,
                                         load_tau(p.tau + qi));
        if (lane_id() == 0 && wb) atomicAdd(p.below + qi, wb);
        __syncthreads(); /* res is reused by the next query */
    }
}

cudaError_t launch_resolve_ranges(const ResolveParams &p, int qs, int smem_optin, cudaStream_t st)
{
    if (qs <= 0) return cudaSuccess;
    const size_t smem = (size_t)p.bmax * sizeof(Cand);
    if ((int)smem > smem_optin || p.nb < 1 || p.nb > kMaxRanges) return cudaErrorInvalidValue;
    cudaError_t e = cudaFuncSetAttribute(bucket_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    bucket_kernel<<<qs, kBucketThreads, smem, st>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const dim3 grid((unsigned)((qs + kRangeQueries - 1) / kRangeQueries), (unsigned)p.nb);
    resolve_range_kernel<<<grid, kBlock, 0, st>>>(p, qs);
    return cudaGetLastError();
}

} // namespace xknn_cuda
