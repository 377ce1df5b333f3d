/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/common.cuh -- every limit of the CUDA backend's kernels in one place, the
 * candidate record and the key encodings (the host code's checked calls: checks.cuh).
 *
 * Layering (CUB-like): warp_primitives.cuh (thread -> warp), block_primitives.cuh
 * (warp -> block, each taking the caller's shared-memory TempStorage), kernels in
 * filter.cu / final.cu (block -> device), host code in the files of engine.cuh.
 */
#ifndef XKNN_CUDA_COMMON_CUH
#define XKNN_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

namespace xknn_cuda {

/* ---- limits ------------------------------------------------------------------------ */
enum : int {
    kWarp = 32,
    /* Threads of every block-level kernel (filter, resolve, final block sort). 8 warps:
     * enough independent loads in flight per block, small enough that 6-8 blocks share
     * an SM (see the occupancy notes beside each kernel). */
    kBlock = 256,
    kWarpsPerBlock = kBlock / kWarp,
    /* Filter kernel: items per thread per chunk (two float4 groups) and chunk width. */
    kItems = 8,
    kChunk = kBlock * kItems, /* 2048 tile columns per block step */
    /* Final selection tiers, by the number M of surviving candidates of a query:
     *   M <= kWarpSortMax      one warp, bitonic network in registers (2 keys per lane)
     *   M <= kBlockSortMax     one block, bitonic network in shared memory (32 KiB)
     *   M >  kBlockSortMax     one block: sorted runs of kBlockSortMax keys in shared
     *                          memory, merged in shared memory (k <= kBlockSortMax) or
     *                          by passes in global memory, each run cut to its first k
     *                          keys (only the first k are ever needed). */
    kWarpSortMax = 64,
    kBlockSortMax = 4096,
    /* Radix select digit width (8 bits: 256 shared-memory bins). */
    kRadixBits = 8,
    kRadixBins = 1 << kRadixBits,
    /* Norm kernel: one warp per row. */
    kNormRowsPerBlock = kWarpsPerBlock,
};

/* Fused path (fused.cu). A block of kFusedWarps warps owns kFusedQW queries per warp
 * (kFusedQB per block); each lane takes kFusedTR references of a kFusedBR-wide tile, whose
 * dimensions pass through shared memory kFusedDC at a time; queries stay in shared memory
 * whole, so d <= kFusedMaxD. Each (slice, query) keeps KP <= kFusedMaxKeep keys, KP >= 2k,
 * so k <= kFusedMaxKeep / 2. The rescue kernel keeps kRescueCap keys in shared memory. */
enum : int {
    kFusedWarps = 8,
    kFusedThreads = kFusedWarps * kWarp,
    kFusedQW = 4,
    kFusedQB = kFusedWarps * kFusedQW,
    kFusedTR = 4,
    kFusedBR = kWarp * kFusedTR,
    kFusedDC = 32,
    kFusedMaxD = 128,
    kFusedMaxKeep = 256,
    kRescueCap = 4096,
};

/* Tensor-core path (mma.cu): kMmaBM queries resident per CTA, reference tiles of kMmaBN
 * rows, kMmaStages-deep cp.async ring of 32-dimension chunks, 8 warps of 64 x 64 tiles;
 * witnesses per group of kMmaGroup references (a warp tile's width); d <= kMmaMaxD keeps
 * the resident queries within shared memory (186 KB at d = 128). */
enum : int {
    kMmaBM = 256,
    kMmaBN = 128,
    kMmaStages = 3,
    kMmaThreads = 256,
    kMmaGroup = 64,
    kMmaMaxD = 128,
    /* witness groups per kept neighbour: the kk-th smallest of ga >= 2 kk group minima
     * sits at most at their median, so about ga ln(ga / (ga - kk)) <= 1.39 kk references
     * of the prefix pass it (fewer groups: a looser threshold, more re-ranking) */
    kMmaWitnessRatio = 2,
};

/* Integer tensor-core path (imma.cu): witness groups of kImmaGroup references. */
enum : int { kImmaGroup = 32 };

/* Generic path (generic.cu): kGenQ queries per block, reference tiles of kGenR rows,
 * kGenD dimensions (bit-packed rows: 64-bit words) per shared-memory stage. */
enum : int {
    kGenQ = 64,
    kGenR = 128,
    kGenD = 16,
};

/* Candidate slots per (query, split) beyond 2k: one filter chunk plus slack, so that
 * after an exact compaction (k entries left) a whole chunk always fits. */
static const int64_t kCapSlack = kChunk + 1024;
/* Largest tile the planner makes: rows x columns of the -2 Q R^T tile. */
static const int64_t kMaxTileRows = 2048;     /* also bounds gridDim.y of the filter  */
static const int64_t kMaxStateQueries = 32768; /* bounds gridDim.y of the resolve kernel */
static const int64_t kMaxRefsPerCall = 2147483647; /* local ids are int32 */
/* cuBLAS workspace handed over through cublasSetWorkspace (recommended 32 MiB on Hopper;
 * at least 16 KiB prevents CUBLAS_STATUS_ALLOC_FAILED). */
static const size_t kCublasWsPreferred = (size_t)32 << 20;
static const size_t kCublasWsMin = (size_t)64 << 10;
static const size_t kAlign = 256;

/* ---- candidate record ----------------------------------------------------------------
 * One slot of a per-(query, split) candidate buffer, 16 bytes, loaded as one float4.
 *   lo   lower bound of the squared distance; -inf marks an entry kept by an exact
 *        compaction (never dropped by a bound again)
 *   up   upper bound of the squared distance (> 0)
 *   c    canonical value in the metric (sqrt for euclidean; for ip the encoded order key,
 *        see kCanonIp); XKNN_CUDA_UNRESOLVED: not computed yet (cand_unresolved)
 *   idx  local reference row (0 .. n-1 of this call)                                   */
struct __align__(16) Cand {
    float lo;
    float up;
    float c;
    int idx;
};

#define XKNN_CUDA_UNRESOLVED (-1.0f)

/* What a candidate's c holds once resolved (the `kind` of ResolveParams, BlockResolve and
 * the rescue kernels): the canonical value of docs/DESIGN.md section 2.2 in the metric, as a
 * float whose bits order the candidates (make_key).
 *   kCanonL2, kCanonEuclid, kCanonCosine  the value itself (never negative);
 *   kCanonIp  order_enc(-value): the order key of ip (larger is nearer) encoded as
 *             unsigned bits; final.cu decodes it (FinalParams encoded + negate). */
enum : int { kCanonL2 = 0, kCanonEuclid = 1, kCanonIp = 2, kCanonCosine = 3 };

/* An entry not resolved yet (c still XKNN_CUDA_UNRESOLVED). For kCanonIp the bits must
 * match exactly (a resolved key may read as a negative float); an order_enc key equal to
 * them (value -1.0) is only computed again, to the same bits. */
__device__ __forceinline__ bool cand_unresolved(float c, int kind)
{
    return kind == kCanonIp ? __float_as_uint(c) == __float_as_uint(XKNN_CUDA_UNRESOLVED) : c < 0.0f;
}

/* Sort key of a resolved candidate: canonical distance bits (non-negative float, so
 * unsigned order = float order; NaN from invalid input sorts last) above the local id.
 * (distance, id) ascending == key ascending, and keys are unique. */
__host__ __device__ __forceinline__ unsigned long long make_key(float c, int idx)
{
#ifdef __CUDA_ARCH__
    return ((unsigned long long)__float_as_uint(c) << 32) | (unsigned)idx;
#else
    union {
        float f;
        unsigned u;
    } v;
    v.f = c;
    return ((unsigned long long)v.u << 32) | (unsigned)idx;
#endif
}
__device__ __forceinline__ float key_dist(unsigned long long key) { return __uint_as_float((unsigned)(key >> 32)); }
__device__ __forceinline__ int key_idx(unsigned long long key) { return (int)(unsigned)(key & 0xffffffffu); }

/* x rounded to TF32 (10 mantissa bits, nearest, ties away: cvt.rna), in a float whose 13
 * low bits are zero; relative error <= 2^-11 */
__device__ __forceinline__ float to_tf32(float x)
{
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}

/* Order encoding of a float (not NaN) as unsigned: a < b as floats <=> enc(a) < enc(b),
 * -0 and +0 both encode as +0. The generic path's keys use it, so values of either sign
 * (ip orders by -value) sort as unsigned integers; order_dec inverts it (+0 for zero). */
__device__ __forceinline__ unsigned order_enc(float v)
{
    const unsigned u = v == 0.0f ? 0u : __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float order_dec(unsigned e)
{
    return __uint_as_float((e & 0x80000000u) ? (e & 0x7fffffffu) : ~e);
}

/* tau' = tau (1 + 2^-19) + 16 FLT_MIN, the CPU backend's expression, with explicit
 * roundings (no contraction); +inf stays +inf. */
__device__ __forceinline__ float tau_prime(float tau)
{
    return __fadd_rn(__fmul_rn(tau, 1.0f + 0x1p-19f), 16.0f * FLT_MIN);
}

/* e = s + T and the margin m of one pair (L = e - m, U = e + m), explicit roundings. When
 * s leaves the float range (huge or NaN inputs), e = 0 and m = +inf: L = -inf, U = +inf.
 * For s <= 1e37 every partial sum of the GEMM is below s/2 (1 + 2^-8), so T is finite. */
__device__ __forceinline__ void pair_em(float nq, float nx, float t, float mrel, float mabs, float &e, float &m)
{
    const float s = __fadd_rn(nq, nx);
    e = __fadd_rn(s, t);
    m = __fadd_rn(__fmul_rn(mrel, s), mabs);
    if (!(s <= 1e37f)) {
        e = 0.0f;
        m = INFINITY;
    }
}

/* Canonical value from the double sum of squares (docs/DESIGN.md section 2.2). */
__device__ __forceinline__ float finish_metric(double acc, int euclidean)
{
    return euclidean ? __double2float_rn(__dsqrt_rn(acc)) : __double2float_rn(acc);
}

} // namespace xknn_cuda

#endif
