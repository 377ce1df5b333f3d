/*
 * kernels/cuda/engine.cu -- host side of the CUDA backend: contexts, the planner and
 * workspace layout, the device-level pipeline, the embedding API (include/xknn/cuda.h)
 * and the host-array entry point xknn__cuda_search (include/xknn/impl/backend.h).
 *
 * PATHS: choose_path picks the fused path (fused.cu: distances and warp selection in one
 * kernel, for small d and k), the tensor-core path (mma.cu: TF32 mma tiles with the
 * filter in their epilogue, references resident, d <= 128) or the GEMM pipeline below
 * (cuBLAS fp32 or TF32 candidates); the fused plan and workspace come from plan_fused,
 * the others from plan_fit (plan_mma for the tensor-core path). Path fp32 with resident
 * references, l2 / euclidean and d <= 128 runs the tensor-core pipeline with fp32
 * products on the CUDA cores instead (ffma_wanted, plan_mma's ffma).
 *
 * TENSOR-CORE PIPELINE (one state block; mma.cu describes the passes and their bounds)
 *   begin    as below (tau = +inf, counts = 0, query norms)
 *   pass     reference norms; pass A over the first nA references (witnesses), select
 *            (thresholds), pass B over all references (candidates), prune by the
 *            entries' bounds (mma_prunes), rescue of overflowed queries, resolve
 *            (canonical values)
 *   finish   as below
 *   Workspace: stats | qn QS*4 | tau QS*4 | cnt QS*4 | mcount QS*8 | cand QS*cap*16 |
 *   rn round_up(n, 128)*4 | witnesses QS*ga*4 | thr QS*4 | column terms round_up(n, 128)*8,
 *   ga = ceil(nA / 64) (the self-join's band of W tiles, sym_band: 4 W); cosine's unit
 *   rows and l2's centred rows (center_wanted, where they fit): round_up(n, 128)*dh*4 |
 *   QS*dh*4 (the self-join: none) | mu d*4, dh = round_up(d, 4).
 *
 * FUSED PIPELINE (one state block of QS queries, one stream): fused kernel over Z slices
 * of RZ references (one launch, or on the host path one launch per quarter of the slices
 * as their references arrive), then finish + rescue. Workspace:
 *   stats 64 B | part Z*QS*KP*8 (sorted keys per slice and query) | flag QS*4 | tpv QS*4
 *   KP = smallest power of two >= max(32, 2 min(k, n)); Z about 4 blocks per SM; QS as
 *   large as fits, with part <= 256 MiB.
 *
 * GEMM PIPELINE (one state block of QS queries; all on one stream, no host synchronisation)
 *   begin    tau = +inf, buffer counts = 0, query norms |q|^2 (double, stored as float)
 *   pass     over the references on the device (all of them, or one streamed chunk):
 *              reference norms (once per pass; per tile if the workspace is too small)
 *              for each tile of RC references, for each group of QB queries:
 *                cuBLAS T = -2 Q R^T (QB x RC, fp32 pedantic or TF32), immediately
 *                filtered (filter.cu) while T is still in L2
 *            then resolve: canonical distances of the survivors (needs this chunk)
 *   finish   gather + sort + write the first k per query (final.cu)
 * Device API: one pass over all references per state block. Host path: references
 * resident (one pass) or streamed from host memory in chunks through two pinned buffers
 * and two device buffers, copies on a second stream overlapping the passes. Resident
 * host inputs of a caller's context go through its pinned staging ring; device buffers
 * come from its memory pool (see host_fused and stage_rows).
 *
 * GEMM WORKSPACE (one layout function, used by the size query and by the search)
 *   stats 64 B | qn QS*4 | tau QS*4 | cnt QS*S*4 | mcount QS*8 | cand QS*S*cap*16 |
 *   rn RN*4 | tile QB*RC*4 | cuBLAS workspace (32 MiB preferred, 64 KiB minimum)
 *   RN = rows of a pass (norms computed once per pass) when that fits, else RC.
 *   each 256-byte aligned; cap = 2*min(k,n) + 2048 + 1024; S = splits of a tile row.
 *
 * THE BOUND (see filter.cu for its use). For float inputs q, x with exact squared
 * distance D, s = |q|^2 + |x|^2, and T the GEMM's value of -2 q.x:
 *   FP32 (cuBLAS pedantic, any summation order, with or without FMA): as in the CPU
 *     backend, |nq + nx + T - D| <= eps s + abs, eps = 1.25 (d+16) u / (1 - (d+16) u),
 *     u = 2^-24 (gamma_d on sum|q_t x_t| <= s/2, times 2, plus the float rounding of
 *     both norms and their double accumulation, d 2^-53 each).
 *   TF32 tensor cores: each input is rounded OR truncated to 10 mantissa bits (relative
 *     error < 2^-10), so each product q't x't = q_t x_t (1 + r), |r| <= 2^-9 + 2^-20; the
 *     products of two TF32 values are exact in fp32; accumulation is fp32 in an unknown
 *     order and may truncate and align addends with few guard bits (Fasi et al. 2021
 *     measured such behaviour on NVIDIA tensor cores): we allow 2u per addition relative
 *     to the running sum of magnitudes, i.e. gamma'_d with u' = 2u. With
 *     g = 2^-9 + 2^-18 + (d+16) 2^-23 and 2 sum|q_t x_t| <= s,
 *     |T + 2 q.x| <= [2^-9 + 2^-20 + gamma'_d (1 + 2^-8)] s <= g (1 + 2^-8)(1 + 2g) s,
 *     and eps_tf32 = 1.25 g / (1 - g) exceeds that plus the norm terms (2u + d 2^-52)
 *     by at least 0.15 g for every g < 1/4.
 *   TF32 on centred rows (p.center: both operands rounded, < 2^-11 each, so |r| <=
 *     2^-10 + 2^-22): the same with g = 2^-10 + 2^-21 + 2^-18 + (d+16) 2^-23, for D
 *     and s of the centred floats; mrel adds 2^-20 for their distance to the inputs' D
 *     (plan_bounds).
 *   Both: inputs or products flushed to zero (FTZ in tensor cores or cuBLAS kernels)
 *     lose at most FLT_MIN |other factor| <= FLT_MIN (1 + s)/2 per term; with underflow
 *     of partial results abs = (3d + 8) FLT_MIN and a relative d 2^-126, negligible.
 *   The filter evaluates s, e, m, e -/+ m in float: |float error| <= ~5.2 u s, so
 *     m = mrel s + mabs with mrel = eps (1 + 2^-20) + 8u, mabs = 2 abs (both rounded up)
 *     gives L <= D <= U rigorously. For d so large that g >= 1/4, mrel = 0 and
 *     mabs = +inf: every pair is a candidate and compactions make it exact.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <chrono>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "checks.cuh"
#include "kernels.cuh"
#include "xknn/cuda.h"
#include "xknn/impl/backend.h"

using namespace xknn_cuda;

static_assert(kStatUnion == XKNN_CUDA_STAT_BOUND_COMPACTIONS && kStatExact == XKNN_CUDA_STAT_EXACT_COMPACTIONS &&
                  kStatAppended == XKNN_CUDA_STAT_CANDIDATES && kStatUnresolved == XKNN_CUDA_STAT_UNRESOLVED &&
                  kStatReruns == XKNN_CUDA_STAT_RERUNS && kStatCount == XKNN_CUDA_STAT_COUNT,
              "workspace counters and their public names disagree");

struct xknn_cuda_context {
    int device;
    cublasHandle_t blas; /* created by the first search that takes the GEMM path */
    cudaMemPool_t pool;  /* host path's device buffers (NULL: plain cudaMalloc)     */
    cudaStream_t stream; /* host path's stream                                      */
    /* host path's pinned staging ring, made by the first host call on a caller's context:
     * two buffers of kStagePiece bytes, a copy stream, one event per buffer */
    char *stage[2];
    cudaStream_t copy_stream;
    cudaEvent_t stage_done[2];
    int sms;
    int cc_major, cc_minor;
    size_t l2;
    size_t smem_optin;
    size_t global_mem;
    char name[256];
    /* kept rows (xknn_cuda_keep_rows): device copies of host rows that outlive a call;
     * the table is guarded by kept_lock (a caller may keep rows from one thread while
     * another runs a call on the context) */
    pthread_mutex_t kept_lock;
    struct xknn_cuda_kept *kept[8];
    cudaStream_t keep_stream; /* the eager uploads' own stream */
    /* the pair's results on the host: pinned, kept between calls (grown as needed) */
    void *pair_out;
    size_t pair_out_bytes;
    /* running lists on the device for the parts of one host call (mirror_begin) */
    struct xknn_cuda_mirror {
        int64_t *host_ids;
        float *host_dist;
        int64_t rows, k;
        int64_t *ids;
        float *dist;
    } mirror[2];
    /* running lists a caller keeps on the device between calls (xknn_cuda_keep_lists;
     * the table guarded by kept_lock, like the kept rows) */
    struct xknn_cuda_mirror lists[4];
    /* the host threads of the last host-array call (params.num_threads; 0: OpenMP's
     * default), which keep_lists and fetch_lists copy with */
    int threads;
    /* xknn_cuda_copy_lists_start's copies, run by a thread of the context's own (made by
     * the first start) */
    struct xknn_cuda_copier *copier;
};
extern "C" { /* (defined with the public functions, below) */
static void copier_destroy(xknn_cuda_copier *c);
static cudaError_t copier_wait(xknn_cuda_copier *c, int64_t ticket, int wait, int *over, const char **why = NULL);
}

/* One kept block of host rows: rows x row_bytes packed on the device, uploaded a chunk of
 * `chunk` rows at a time when a call first reads it (valid[c]), or at once. */
struct xknn_cuda_kept {
    const char *host;
    int64_t rows, chunk;
    size_t row_bytes, ld_bytes;
    char *dev;
    unsigned char *valid;
    cudaStream_t freed_on; /* dev from the context's pool: freed in order on this stream
                            * (the context's, after the calls that read it); else NULL */
};

namespace {

/* ---- small helpers ------------------------------------------------------------------ */
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t m) { return ceil_div(a, m) * m; }
size_t align_up(size_t a) { return (a + kAlign - 1) / kAlign * kAlign; }
int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

float round_up_float(double x)
{
    float f = (float)x;
    if ((double)f < x) f = nextafterf(f, INFINITY);
    return f;
}

float round_down_float(double x)
{
    float f = (float)x;
    if ((double)f > x) f = nextafterf(f, -INFINITY);
    return f;
}

/* Makes ctx->device current for the duration of a call; restores the previous one. */
struct DeviceScope {
    int prev = -1;
    bool changed = false;
    cudaError_t enter(int device)
    {
        cudaError_t e = cudaGetDevice(&prev);
        if (e != cudaSuccess) return e;
        if (prev != device) {
            e = cudaSetDevice(device);
            if (e != cudaSuccess) return e;
            changed = true;
        }
        return cudaSuccess;
    }
    ~DeviceScope()
    {
        if (changed) (void)cudaSetDevice(prev);
    }
};

/* ---- plan and workspace layout ------------------------------------------------------ */
struct Plan {
    int64_t n, nq, d, k, kk;
    int euclid, tf32;
    int64_t QS, QB, RC, RCs, cap;
    int64_t RN; /* reference norms held: the rows of a whole pass, or one tile (RC) */
    int S;
    size_t cublas_ws;
    size_t off_stats, off_qn, off_tau, off_cnt, off_mcount, off_cand, off_rn, off_tile, off_cublas, bytes;
    float mrel, mabs;
    /* fused path (fused = 1): KP keys per (slice, query), Z slices of RZ references */
    int fused, KP;
    int64_t Z, RZ;
    size_t off_part, off_flag, off_tpv;
    float lrel, labs, urel, uabs;
    /* tensor-core path (mma = 1): witnesses over nA references in ga groups */
    int mma, wgmma; /* wgmma: the Hopper kernel of the tensor-core passes */
    int ffma;       /* the same passes with fp32 products on the CUDA cores (path fp32) */
    int64_t nA, ga;
    int est;    /* tau estimated from a witness sample (plan_estimate), certified after the re-rank */
    int64_t ej; /* est: tau = the ej-th smallest witness */
    int nb, bmax; /* est: the re-rank by nb reference ranges of rb rows (0: one pass) */
    int64_t rb;
    size_t off_gmin, off_thr, off_ct, off_below, off_boff;
    float la, ua, ub;
    /* what resolve computes (common.cuh's kCanon*); cosine's unit rows (ld dh; sym: the
     * queries are the references, no query copy) */
    int kind, sym;
    int64_t dh;
    size_t off_rhat, off_qhat;
    /* l2 / euclidean on the TF32 tensor cores: the passes see the rows centred on mu and
     * rounded to TF32 (center_wanted), in the off_rhat / off_qhat copies */
    int center;
    size_t off_mu;
    /* the self-join's pass A as a band of `band` tiles (sym_band; 0: over the prefix nA) */
    int64_t band;
};

/* TF32 products: the queries are rounded (cvt.rna, 2^-11) and the references truncated
 * (2^-10), so a product errs by less than 2^-9 of |q_t x_t|; centred rows (p.center)
 * are rounded on both sides, (1 + 2^-11)^2 - 1 < 2^-10 + 2^-21. Centring itself: with
 * a = q - mu, b = x - mu (exact) and a', b' their float roundings (|a'_t - a_t| <= u
 * |a_t|), e = (a' - b') - (a - b) has |e_t| <= u (|a_t| + |b_t|), so
 * | |a' - b'|^2 - |q - x|^2 | = |2 (a - b).e + |e|^2| <= (4 u + 2 u^2) (|a|^2 + |b|^2),
 * at most 4.001 u s with s the float norms of a', b': the 2^-20 s added to mrel
 * covers it four times over. */
void plan_bounds(Plan &p)
{
    const double u = 0x1p-24, dd = (double)p.d;
    const double prod = p.center ? 0x1p-10 + 0x1p-21 : 0x1p-9;
    const double g = p.tf32 ? prod + 0x1p-18 + (dd + 16.0) * 0x1p-23 : (dd + 16.0) * u;
    if (g < 0.25) {
        const double eps = 1.25 * g / (1.0 - g);
        p.mrel = round_up_float(eps * (1.0 + 0x1p-20) + 8.0 * u + (p.center ? 0x1p-20 : 0.0));
        p.mabs = round_up_float(2.0 * (3.0 * dd + 8.0) * (double)FLT_MIN);
    } else {
        p.mrel = 0.0f;
        p.mabs = INFINITY;
    }
}

void plan_layout(Plan &p)
{
    size_t o = 0;
    auto take = [&o](size_t b) {
        const size_t r = o;
        o = align_up(o + b);
        return r;
    };
    p.off_stats = take(sizeof(unsigned long long) * kStatCount);
    p.off_qn = take((size_t)p.QS * sizeof(float));
    p.off_tau = take((size_t)p.QS * sizeof(float));
    p.off_cnt = take((size_t)p.QS * p.S * sizeof(int));
    p.off_mcount = take((size_t)p.QS * sizeof(long long));
    p.off_cand = take((size_t)p.QS * p.S * p.cap * sizeof(Cand));
    p.off_rn = take((size_t)p.RN * sizeof(float));
    /* the tensor-core path has no tile and no cuBLAS workspace (QB = RC = cublas_ws =
     * 0), but per-query witnesses and thresholds */
    p.off_tile = take((size_t)p.QB * p.RC * sizeof(float));
    p.off_cublas = take(p.cublas_ws);
    if (p.mma) {
        p.off_gmin = take((size_t)p.QS * p.ga * sizeof(float));
        p.off_thr = take((size_t)p.QS * sizeof(float));
        p.off_ct = take(2 * (size_t)p.RN * sizeof(float));
        p.off_below = take(p.est ? (size_t)p.QS * sizeof(int) : 0);
        p.off_boff = take(p.nb > 1 ? (size_t)p.QS * (size_t)(p.nb + 1) * sizeof(int) : 0);
    }
    if (p.kind == kCanonCosine || p.center) {
        p.off_rhat = take((size_t)p.RN * p.dh * sizeof(float));
        p.off_qhat = take(p.sym ? 0 : (size_t)p.QS * p.dh * sizeof(float));
    }
    if (p.center) p.off_mu = take((size_t)p.d * sizeof(float));
    p.bytes = o;
}

void plan_shape(Plan &p, const xknn_cuda_context *ctx, int64_t QS, int64_t QB, int64_t RC, int64_t RN,
                size_t cublas_ws)
{
    p.RN = RN < RC ? RC : RN;
    p.QS = QS;
    p.QB = QB;
    p.RC = RC;
    p.cublas_ws = cublas_ws;
    /* splits: enough blocks to fill the GPU when the tile has few rows, at least one
     * chunk of columns each */
    const int64_t want = ceil_div(4 * (int64_t)ctx->sms, QB);
    int64_t S = min64(max64(want, 1), ceil_div(RC, kChunk));
    p.RCs = round_up(ceil_div(RC, S), 4);
    p.S = (int)ceil_div(RC, p.RCs);
    plan_layout(p);
}

int choose_tf32(const xknn_params *prm, int64_t n, int64_t nq, int64_t d)
{
    if (prm->cuda_path == XKNN_CUDA_PATH_TF32 || prm->cuda_path == XKNN_CUDA_PATH_MMA) return 1;
    if (prm->cuda_path == XKNN_CUDA_PATH_FP32) return 0;
    return d >= 32 && (double)n * (double)nq * (double)d >= 1e10;
}

/* ---- fused path plan ------------------------------------------------------------------
 * Supported: l2 / euclidean, d <= kFusedMaxD, min(k, n) <= kFusedMaxKeep / 2. Chosen by
 * XKNN_CUDA_PATH_FUSED, or by AUTO for min(k, n) <= kFusedAutoMaxK and either
 * d <= kFusedAutoSmallD, or d <= kFusedAutoMidD and n nq d <= kFusedAutoWork. From the
 * H100 rows in benchmarks/RESULTS.md: at d = 3 the fused path beats the GEMM path by
 * 1.5x (1M refs, 100 queries) to 2.7x (10k queries) and 3.5x on the 1M self-join; at
 * d = 32 it wins with 100 queries (0.86 vs 0.96 ms) and loses with 10k (64 vs 47 ms, TF32
 * tensor cores); at d = 128 TF32 wins (W4 1.17 vs 1.59 ms); at k = 100 the selection
 * work makes it 5x slower than the GEMM path with few queries.                       */
static const int64_t kFusedAutoSmallD = 16;
static const int64_t kFusedAutoMidD = 32;
static const int64_t kFusedAutoMaxK = 32;
static const double kFusedAutoWork = 4e9;
/* the Z x QS x KP key lists stay below this many bytes (QS shrinks) */
static const size_t kFusedPartMax = (size_t)256 << 20;

int fused_supported(const xknn_params *prm, int64_t n, int64_t d, int64_t k)
{
    return (prm->metric == XKNN_METRIC_L2 || prm->metric == XKNN_METRIC_EUCLIDEAN) && d <= kFusedMaxD &&
           min64(k, n) <= kFusedMaxKeep / 2;
}

/* Tensor-core path: l2 / euclidean, ip and cosine, d <= kMmaMaxD (queries resident in
 * shared memory). Chosen by XKNN_CUDA_PATH_MMA, or by AUTO wherever the fused path is not
 * taken. It needs the references resident (a streamed host search takes the cuBLAS TF32
 * path) and a GPU of compute capability >= 8.0 with enough shared memory per block
 * (plan_fit checks). ip and cosine have no other GEMM path: where this one does not
 * apply, host arrays take the canonical tiles (generic.cu) and device arrays an error. */
int gemm_ipcos(const xknn_params *prm) { return prm->metric == XKNN_METRIC_IP || prm->metric == XKNN_METRIC_COSINE; }

int mma_supported(const xknn_params *prm, int64_t d)
{
    return (prm->metric == XKNN_METRIC_L2 || prm->metric == XKNN_METRIC_EUCLIDEAN || gemm_ipcos(prm)) &&
           d <= kMmaMaxD;
}

int choose_path(const xknn_params *prm, int64_t n, int64_t nq, int64_t d, int64_t k)
{
    if (gemm_ipcos(prm)) /* their only GEMM path; FP32 / TF32 asked: the canonical tiles */
        return mma_supported(prm, d) && prm->cuda_path != XKNN_CUDA_PATH_FP32 && prm->cuda_path != XKNN_CUDA_PATH_TF32
                   ? XKNN_CUDA_PATH_MMA
                   : XKNN_CUDA_PATH_FP32;
    if (prm->cuda_path == XKNN_CUDA_PATH_FUSED || prm->cuda_path == XKNN_CUDA_PATH_AUTO) {
        if (fused_supported(prm, n, d, k) &&
            (prm->cuda_path == XKNN_CUDA_PATH_FUSED ||
             (min64(k, n) <= kFusedAutoMaxK &&
              (d <= kFusedAutoSmallD ||
               (d <= kFusedAutoMidD && (double)n * (double)nq * (double)d <= kFusedAutoWork)))))
            return XKNN_CUDA_PATH_FUSED;
    }
    if ((prm->cuda_path == XKNN_CUDA_PATH_MMA || prm->cuda_path == XKNN_CUDA_PATH_AUTO) && mma_supported(prm, d))
        return XKNN_CUDA_PATH_MMA;
    return choose_tf32(prm, n, nq, d) ? XKNN_CUDA_PATH_TF32 : XKNN_CUDA_PATH_FP32;
}

/* Slices of the caller's ref_block references (0: automatic). */
int64_t ref_block_slices(const xknn_params *prm, int64_t n)
{
    return prm->ref_block > 0 ? ceil_div(n, round_up(prm->ref_block, kFusedBR)) : 0;
}

/* The sizes and metric every plan starts from; everything else zero. */
Plan plan_init(const xknn_params *prm, int64_t n, int64_t nq, int64_t d, int64_t k)
{
    Plan p;
    memset(&p, 0, sizeof p);
    p.n = n;
    p.nq = nq;
    p.d = d;
    p.k = k;
    p.kk = min64(k, n);
    p.euclid = prm->metric == XKNN_METRIC_EUCLIDEAN;
    p.kind = prm->metric == XKNN_METRIC_IP ? kCanonIp : prm->metric == XKNN_METRIC_COSINE ? kCanonCosine : p.euclid;
    return p;
}

/* Bound constants of the direct form (fused.cu): g = gamma_{d+2}, a = d 2^-149. */
void plan_fused_bounds(Plan &p)
{
    const double u = 0x1p-24, m = (double)p.d + 2.0;
    const double g = m * u / (1.0 - m * u) * (1.0 + 0x1p-40);
    const double a = (double)p.d * 0x1p-149;
    p.lrel = round_down_float(1.0 - g);
    p.labs = round_up_float(a);
    p.urel = round_up_float(1.0 + g / (1.0 - g) * (1.0 + 0x1p-40));
    p.uabs = round_up_float(a * (1.0 + 4.0 * g));
}

/* The fused plan with the largest state block QS whose workspace plus QS *
 * per_query_extra fits in `limit`. Returns 0 and the minimum in *min_needed if none. */
int plan_fused(const xknn_cuda_context *ctx, const xknn_params *prm, int64_t n, int64_t nq, int64_t d, int64_t k,
               size_t limit, size_t per_query_extra, Plan *out, size_t *min_needed)
{
    Plan p = plan_init(prm, n, nq, d, k);
    p.fused = 1;
    p.KP = 32;
    while (p.KP < 2 * p.kk) p.KP *= 2;
    plan_fused_bounds(p);
    int64_t QS = prm->query_block > 0 ? min64(prm->query_block, nq) : nq;
    for (;; QS = (QS + 1) / 2) {
        const int64_t xb = ceil_div(QS, kFusedQB);
        /* slices: about 4 blocks per SM in all (2 resident, 2 waves), each slice at least
         * 8 tiles; or the caller's ref_block as the slice width */
        int64_t Z = ref_block_slices(prm, n);
        if (!Z) Z = max64(1, min64(ceil_div(4 * (int64_t)ctx->sms, xb), ceil_div(n, 8 * kFusedBR)));
        Z = min64(Z, 65535); /* gridDim.y */
        p.RZ = round_up(ceil_div(n, Z), kFusedBR);
        p.Z = ceil_div(n, p.RZ);
        p.QS = QS;
        size_t o = 0;
        auto take = [&o](size_t b) {
            const size_t r = o;
            o = align_up(o + b);
            return r;
        };
        const size_t part = (size_t)p.Z * (size_t)QS * (size_t)p.KP * sizeof(unsigned long long);
        p.off_stats = take(sizeof(unsigned long long) * kStatCount);
        p.off_part = take(part);
        p.off_flag = take((size_t)QS * sizeof(int));
        p.off_tpv = take((size_t)QS * sizeof(float));
        p.bytes = o;
        if ((part <= kFusedPartMax || QS == 1) && p.bytes + (size_t)QS * per_query_extra <= limit) {
            *out = p;
            return 1;
        }
        if (QS == 1) break;
    }
    *min_needed = p.bytes + per_query_extra;
    return 0;
}

/* ---- tensor-core plan ----------------------------------------------------------------
 * Witness prefix nA = f n with f = sqrt(C kk / n): pass A costs f of the GEMM, and about
 * kk / f references per query then pass the threshold, each re-ranked by gathering its
 * row (d floats); C balances the two. Measured on an H100 (1M x 10k, d = 128; benchmarks/
 * RESULTS.md): for kk <= 128 the threshold of few witness groups is loose (tens of
 * candidates per neighbour), so a longer prefix pays (C = 1600: W1 16.5 -> 15.2 ms, W2
 * 22.9 -> 21.3); for k = 1024 C = 200 was best (600: +0.7 ms, 1600: +1.7). The int8 path
 * (host_imma) keeps 200: its pass A is cheaper but its candidates are too. At least
 * kMmaWitnessRatio kk witness groups, at least kMmaMinPrefix references.
 * cap: twice the expected candidates (times 3 for the bound's band) plus slack; a query
 * that overflows it is re-run exactly (counted in XKNN_CUDA_STAT_RERUNS). */
static const double kMmaWitnessC = 200.0, kMmaWitnessSmallC = 1600.0, kImmaWitnessC = 200.0;
/* the CUDA-core passes (plan_mma's ffma): pass A costs as much per pair as pass B, so a
 * shorter prefix balances the re-rank */
static const double kFfmaWitnessC = 50.0;
static const int64_t kMmaWitnessSmallK = 128;

/* C for kk neighbours (def: the int8 path's fixed constant, else 0), or
 * XKNN_CUDA_WITNESS_C when set to a positive number (a diagnostic for tuning the balance;
 * any value gives the same results, only the work moves) */
double witness_c(int64_t kk, double def)
{
    const char *e = getenv("XKNN_CUDA_WITNESS_C");
    const double v = e && *e ? atof(e) : 0.0;
    if (v > 0.0) return v;
    if (def > 0.0) return def;
    return kk <= kMmaWitnessSmallK ? kMmaWitnessSmallC : kMmaWitnessC;
}
static const int64_t kMmaMinPrefix = 8192;

/* ---- estimated thresholds (large k) --------------------------------------------------
 * A rigorous tau from a prefix of nA references is at best the kk-th neighbour within the
 * prefix, so about kk n / nA references pass it: for large kk the prefix must be most of
 * the references (k = 4096 at n = 1M: 905k, pass A about a full GEMM). Instead, tau may
 * be ESTIMATED from a short prefix and CERTIFIED after the re-rank (filter.cu's resolve):
 * if at least kk candidates have a canonical value <= tau, no reference left out can be
 * in the top kk, whatever tau was; a query with fewer is searched again exactly
 * (mma_rescue_kernel). DESIGN.md section 2's "re-run every query whose certificate
 * fails". The estimate: with a fraction F of the references within distance t of a query,
 * a group of 64 has its smallest witness <= t with probability about P = 1 - (1 - F)^64;
 * over ga groups the j-th smallest witness with j = P ga estimates the t at which F n =
 * kEstMargin kk. Its relative error is about 1 / sqrt(j) (F from P), so kEstHits = 256
 * groups below tau put the margin of 30 % at about five standard deviations; witnesses
 * are upper bounds, which only moves tau up. This assumes the prefix is a fair sample
 * of the references; where it is not (references sorted, clustered in order), the
 * certificate fails and queries are searched again: slower, never wrong. Used where the
 * estimate's prefix is at most half the rigorous one, l2 only (the certificate compares
 * canonical values with tau); XKNN_CUDA_NO_ESTIMATE=1 (a diagnostic: the results are
 * the same bytes) keeps the rigorous tau. */
static const double kEstMargin = 1.3, kEstHits = 256.0;
/* ranges of the whole L2 (W3, k = 4096, on an H100: 30.11 / 30.21 ms against 30.31 /
 * 30.33 ms with half, 31.1 / 31.6 / 32.3 ms with a third, a quarter, a sixth) */
static const int kRangeL2Part = 1;

/* The estimate's prefix (0: none) and its rank ej for kk of n references, where a
 * rigorous tau would need nA_rig. */
int64_t plan_estimate(int64_t n, int64_t kk, int64_t nA_rig, int64_t *ej)
{
    const char *e = getenv("XKNN_CUDA_NO_ESTIMATE");
    if (e && *e && *e != '0') return 0;
    const double f = kEstMargin * (double)kk / (double)n;
    if (!(f < 1.0)) return 0;
    const double P = -expm1((double)kMmaGroup * log1p(-f));
    const int64_t nA = round_up((int64_t)ceil(kEstHits / P) * kMmaGroup, kMmaBN);
    if (2 * nA > nA_rig || nA > n) return 0;
    const int64_t ga = ceil_div(nA, kMmaGroup);
    *ej = max64(1, min64(ga, (int64_t)floor(P * (double)ga)));
    return nA;
}

/* The epilogue constants (mma.cu's header) from mrel, mabs of the TF32 derivation, which
 * give |2 acc - 2 P| <= mrel S + mabs for P = q.x exact, S = |q|^2 + |x|^2 exact.
 *   l2, euclidean  U = (1 + mrel) s + mabs - 2 acc >= D; la = (1 - mrel) / 2.
 *   ip       the order key is -f (f the canonical float); witnesses and the threshold
 *            are in units of 2 (-f): U = m1 s + b1 - 2 acc >= -2 f, la = -m1 / 2, where
 *            m1 = mrel + (d 2^-53 + 2^-24)(1 + 2^-20) and b1 = mabs + 2^-148 add
 *            2 |P - f| (the double chain errs by d 2^-53 |q||x| <= d 2^-53 S / 2, the
 *            float rounding by 2^-24 |P| + 2^-150), so the bound holds the canonical
 *            value itself and any tau' >= tau is a valid threshold (mma_select_kernel).
 *   cosine   the tensor cores see unit rows (launch_unit_rows: each element within
 *            rho = 2^-24 + (d + 4) 2^-53 of x_t / |x|, relative), so P' = q'.x' is within
 *            2 rho (1 + rho) of cos; the canonical c is within 2^-24 + (2 d + 5) 2^-53 of
 *            1 - cos (double chain, sqrt, division, the float rounding of a value <= 2).
 *            Units of 2 (c - 1): U = mrel s + b2 - 2 acc >= 2 (c - 1), la = -mrel / 2,
 *            b2 = mabs + (2^-22 + 2^-23 + (2 d + 7) 2^-51 + d 2^-147)(1 + 2^-10) (the
 *            last term: elements that underflow). Zero rows: P' = 0 and c = 1 exactly.
 * ip and cosine: s is the sum of the float norms of the operands the tensor cores see,
 * within 2^-23 of S (relative; double sums rounded once, d <= 128), so ua and |la|
 * carry a factor 1 + 2^-12 and la < 0 keeps every rounding in the safe direction. */
void mma_bounds(Plan &p)
{
    const double mrel = (double)p.mrel, mabs = (double)p.mabs, dd = (double)p.d;
    if (p.kind == kCanonIp || p.kind == kCanonCosine) {
        const double m = p.kind == kCanonIp ? mrel + (dd * 0x1p-53 + 0x1p-24) * (1.0 + 0x1p-20) : mrel;
        const double b = p.kind == kCanonIp
                             ? mabs + 0x1p-148
                             : mabs + (0x1p-22 + 0x1p-23 + (2.0 * dd + 7.0) * 0x1p-51 + dd * 0x1p-147) * (1.0 + 0x1p-10);
        p.ua = round_up_float(m * (1.0 + 0x1p-12));
        p.la = round_down_float(-0.5 * m * (1.0 + 0x1p-12));
        p.ub = round_up_float(b);
    } else {
        p.la = round_down_float(0.5 * (1.0 - mrel));
        p.ua = round_up_float(1.0 + mrel);
        p.ub = p.mabs;
    }
}

/* The bound constants for p.center = on (plan_bounds at the padded depth, then the
 * epilogue's); 0 where no bound holds (the tensor-core path does not apply). */
int plan_set_center(Plan &p, int on)
{
    const int64_t d = p.d;
    p.center = on;
    p.d = round_up(d, 32);
    plan_bounds(p);
    p.d = d;
    if (!(p.mabs < INFINITY)) return 0;
    mma_bounds(p);
    return 1;
}

/* Centred rows for the TF32 passes of l2 / euclidean (plan_bounds): the band of the
 * bound scales with |q - mu|^2 + |x - mu|^2 instead of |q|^2 + |x|^2 (uniform data in
 * [0, 1]^d: a quarter), and both operands are rounded, not one truncated (half again).
 * Costs a copy of the references (n round_up(d, 4) floats, made once a call) and two
 * launches, which pay where the passes have many pairs: n nq >= kCenterMinPairs (on an
 * H100, W1's 1e10 pairs: 10.19 -> 9.65 ms; W4's 6.7e7: 0.312 -> 0.339 ms; d = 32 with
 * nq = 100: 0.483 ms centred, 0.430 not). XKNN_CUDA_CENTER (a diagnostic: the results
 * are the same bytes, only the candidates change): 1 centres every shape, 0 none. */
static const double kCenterMinPairs = 4294967296.0;
int center_wanted(const Plan &p)
{
    if (!(p.tf32 && (p.kind == kCanonL2 || p.kind == kCanonEuclid))) return 0;
    const char *e = getenv("XKNN_CUDA_CENTER");
    if (e && *e) return *e != '0';
    return (double)p.n * (double)p.nq >= kCenterMinPairs;
}

/* A plan whose centred copies fit where p (without them) did: keeps p.QS; otherwise p
 * stays as it is. need(p): the bytes the caller checks against its budget. */
template <class Need>
void plan_try_center(Plan &p, size_t budget, Need need)
{
    if (p.center || !center_wanted(p)) return;
    Plan c = p;
    if (!plan_set_center(c, 1)) return;
    plan_layout(c);
    if (need(c) <= budget) p = c;
}

int plan_mma(const xknn_cuda_context *ctx, const xknn_params *prm, int64_t n, int64_t nq, int64_t d, int64_t k,
             size_t limit, size_t per_query_extra, int ffma, Plan *out, int estimate = 0)
{
    if (ctx->cc_major < 8 || (ffma ? ffma_smem_bytes(d) : mma_smem_bytes(d)) > ctx->smem_optin ||
        n > kMaxRefsPerCall - kMmaBN)
        return 0;
    /* witnesses need groups: with fewer than 2 kk groups in all the threshold would be
     * loose or infinite (every query re-run), so such shapes take the cuBLAS path */
    if (ceil_div(n, kMmaGroup) < kMmaWitnessRatio * min64(k, n)) return 0;
    Plan p = plan_init(prm, n, nq, d, k);
    p.tf32 = !ffma;
    p.mma = 1;
    p.ffma = ffma;
    p.S = 1;
    p.dh = round_up(d, 4); /* cosine's unit rows: 16-byte rows for the vector loads */
    /* Hopper (sm_90a code in the build): wgmma (mma.cu's warp-specialized kernel where
     * the rows are 16-byte aligned; XKNN_CUDA_WGMMA_WS=0, a diagnostic, keeps the
     * single-schedule one); XKNN_CUDA_MMA_SYNC=1 (diagnostic) keeps the mma.sync kernel,
     * which every GPU of compute capability >= 8.0 runs */
    {
        const char *ms = getenv("XKNN_CUDA_MMA_SYNC");
        p.wgmma = !ffma && ctx->cc_major == 9 && ctx->cc_minor == 0 && mma_wgmma_built() &&
                  !(ms && *ms && *ms != '0') && wgmma_smem_bytes(d, 0) <= ctx->smem_optin;
    }
    /* the bound of the TF32 derivation (ffma: of FP32) for the padded depth, rows as they
     * are (plan_try_center adds the centred copies where they fit) */
    if (!plan_set_center(p, 0)) return 0;
    const double f = sqrt(witness_c(p.kk, ffma ? kFfmaWitnessC : 0.0) * (double)p.kk / (double)n);
    int64_t nA = (int64_t)ceil(f * (double)n);
    nA = max64(nA, max64(kMmaWitnessRatio * kMmaGroup * p.kk, kMmaMinPrefix));
    nA = round_up(nA, kMmaBN);
    p.nA = min64(nA, n);
    /* estimate: only mma_pass (the plain search) certifies; l2 only */
    const int64_t nAe = estimate && p.kind == kCanonL2 ? plan_estimate(n, p.kk, p.nA, &p.ej) : 0;
    /* cap: as the rigorous prefix asks, or more for the estimate's. Not less: the TF32
     * band alone may hold more candidates than the estimate's count (tight clusters,
     * whose distances are small next to the norms: 1M points in 100 clusters of sigma
     * 0.03, k = 1024, overflowed nearly every query with the estimate's cap, 1.92 s
     * against 38.8 ms with the rigorous tau) */
    double expect = 3.0 * (double)p.kk * (double)n / (double)p.nA + 256.0;
    p.est = nAe > 0;
    if (p.est) {
        p.nA = nAe;
        expect = fmax(expect, 3.0 * kEstMargin * (double)p.kk + 256.0);
    }
    p.ga = ceil_div(p.nA, kMmaGroup);
    const double capd = 2.0 * expect + 1024.0;
    p.cap = round_up(max64((int64_t)capd, 2 * p.kk + 1024 + kBlock), 256);
    if (p.cap > INT_MAX / 2) return 0;
    if (p.est) {
        /* the re-rank by reference range (filter.cu): ranges of 1 / kRangeL2Part of the
         * L2. XKNN_CUDA_RESOLVE_RANGES (a diagnostic: the results are the same
         * bytes): 0 = one pass, N > 0 = ranges of 1 / N of the L2. */
        const char *e = getenv("XKNN_CUDA_RESOLVE_RANGES");
        const int part = e && *e ? atoi(e) : kRangeL2Part;
        const int64_t row = round_up(d, 8) * (int64_t)sizeof(float);
        p.rb = max64(1, (int64_t)(ctx->l2 / (size_t)(part > 0 ? part : 1)) / row);
        if (ceil_div(n, p.rb) > kMaxRanges) p.rb = ceil_div(n, kMaxRanges);
        p.nb = (int)ceil_div(n, p.rb);
        p.bmax = (int)min64(p.cap, (int64_t)((ctx->smem_optin - 1024) / sizeof(Cand)));
        if (p.nb < 2 || part <= 0) p.nb = 0;
    }
    p.RN = round_up(n, kMmaBN);
    int64_t QS = prm->query_block > 0 ? min64(prm->query_block, nq) : min64(nq, kMaxStateQueries);
    for (;; QS = (QS + 1) / 2) {
        p.QS = QS;
        plan_layout(p);
        if (p.bytes + (size_t)QS * per_query_extra <= limit) {
            plan_try_center(p, limit, [&](const Plan &c) { return c.bytes + (size_t)QS * per_query_extra; });
            *out = p;
            return 1;
        }
        if (QS == 1) return 0;
    }
}

/* Why ip / cosine cannot take the tensor-core path for this shape (plan_mma's shape
 * conditions), or NULL when only memory could stop it. */
const char *ipcos_why_not(const xknn_cuda_context *ctx, int64_t n, int64_t d, int64_t k)
{
    if (d > kMmaMaxD) return "the tensor-core path needs d <= 128";
    if (ctx->cc_major < 8) return "the tensor-core path needs compute capability 8.0 or newer";
    if (mma_smem_bytes(d) > ctx->smem_optin) return "the tensor-core kernel's shared memory exceeds the device's";
    if (n > kMaxRefsPerCall - kMmaBN) return "too many references for one tensor-core call";
    if (ceil_div(n, kMmaGroup) < kMmaWitnessRatio * min64(k, n))
        return "the tensor-core path needs n >= 128 min(k, n) (2 k witness groups of 64 references)";
    return NULL;
}

/* Path fp32 with resident references, l2 / euclidean and d <= kMmaMaxD: the tensor-core
 * path's passes with fp32 products on the CUDA cores (mma.cu's ffma_kernel; the FP32 bound
 * of the header), where plan_mma finds a plan; cuBLAS SGEMM tiles and the filter
 * otherwise. XKNN_CUDA_FP32_CUBLAS=1 (a diagnostic, for tests and comparisons) keeps the
 * cuBLAS tiles everywhere. */
int ffma_wanted(const xknn_params *prm, int64_t d)
{
    const char *e = getenv("XKNN_CUDA_FP32_CUBLAS");
    return (prm->metric == XKNN_METRIC_L2 || prm->metric == XKNN_METRIC_EUCLIDEAN) && d <= kMmaMaxD &&
           !(e && *e && *e != '0');
}

/* The largest plan whose workspace plus QS * per_query_extra fits in `limit` bytes.
 * Resident: QS = QB. Streaming: QS (queries with live state, amortising each reference
 * pass) as large as fits, QB <= QS. Returns 0 and the minimum in *min_needed if none. */
int plan_fit(const xknn_cuda_context *ctx, const xknn_params *prm, int64_t n, int64_t nq, int64_t d, int64_t k,
             int64_t pass_rows, size_t limit, size_t per_query_extra, int streaming, Plan *out, size_t *min_needed)
{
    const int path = choose_path(prm, n, nq, d, k);
    if (!streaming && path == XKNN_CUDA_PATH_MMA && plan_mma(ctx, prm, n, nq, d, k, limit, per_query_extra, 0, out, 1))
        return 1;
    if (!streaming && path == XKNN_CUDA_PATH_FP32 && ffma_wanted(prm, d) &&
        plan_mma(ctx, prm, n, nq, d, k, limit, per_query_extra, 1, out, 1))
        return 1;
    if (gemm_ipcos(prm)) { /* no cuBLAS path for them (the filter is l2's) */
        xknn_params one = *prm;
        Plan q;
        one.query_block = 1;
        *min_needed = !streaming && plan_mma(ctx, &one, n, 1, d, k, SIZE_MAX / 4, 0, 0, &q) ? q.bytes + per_query_extra : 0;
        return 0;
    }
    Plan p = plan_init(prm, n, nq, d, k);
    p.tf32 = choose_tf32(prm, n, nq, d);
    p.cap = 2 * p.kk + kCapSlack;
    plan_bounds(p);

    const int64_t tile_elems = max64((int64_t)1 << 16, (int64_t)(ctx->l2 / 2 / sizeof(float)));
    const int64_t nround = round_up(n, 4);
    int64_t QB0 = prm->query_block > 0 ? prm->query_block : 1024;
    QB0 = min64(min64(QB0, nq), kMaxTileRows);
    const int64_t rc_user = prm->ref_block > 0 ? round_up(prm->ref_block, 4) : 0;
    const size_t cublas_pref = ctx->cc_major >= 9 ? kCublasWsPreferred : ((size_t)4 << 20);
    const size_t cublas_opts[2] = {cublas_pref, kCublasWsMin};

    for (int64_t QB = QB0;; QB = (QB + 1) / 2) {
        /* whole filter chunks per tile row when the row is at least one chunk wide */
        const int64_t auto_rc = tile_elems / QB >= kChunk ? tile_elems / QB / kChunk * kChunk
                                                           : max64(128, tile_elems / QB / 128 * 128);
        int64_t RC0 = rc_user ? rc_user : auto_rc;
        RC0 = min64(RC0, nround);
        for (int64_t RC = RC0;; RC = round_up(RC / 2, 4)) {
            for (int c = 0; c < 4; ++c) {
                /* norms of a whole pass first (one launch per pass), else per tile */
                const int64_t RN = c < 2 ? round_up(pass_rows, 4) : RC;
                int64_t QS = streaming ? min64(nq, kMaxStateQueries) : QB;
                for (;;) {
                    plan_shape(p, ctx, QS, QB, RC, RN, cublas_opts[c & 1]);
                    if (p.bytes + (size_t)QS * per_query_extra <= limit) {
                        *out = p;
                        return 1;
                    }
                    if (!streaming || QS <= QB) break;
                    QS = max64(QB, QS / 2);
                }
            }
            if (RC <= 4) break;
        }
        if (QB == 1) break;
    }
    plan_shape(p, ctx, 1, 1, 4, 4, kCublasWsMin);
    *min_needed = p.bytes + per_query_extra;
    return 0;
}

/* ---- validation shared by the entry points ----------------------------------------- */
xknn_status check_sizes(Err er, const xknn_params *prm, int64_t n, int64_t nq, int64_t d, int64_t k, int64_t ldr,
                        int64_t ldq)
{
    if (n < 1 || nq < 1 || d < 1)
        return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "cuda backend: n=%lld nq=%lld d=%lld: all must be >= 1",
                     (long long)n, (long long)nq, (long long)d);
    if (k < 1) return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "k=%lld: need k >= 1", (long long)k);
    if (n > kMaxRefsPerCall)
        return failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                     "cuda backend: n=%lld references in one device call (at most %lld; xknn_search splits)",
                     (long long)n, (long long)kMaxRefsPerCall);
    if (d > INT_MAX || ldr > INT_MAX || ldq > INT_MAX)
        return failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                     "cuda backend: d=%lld or a leading dimension (%lld, %lld) exceeds INT_MAX (cuBLAS)",
                     (long long)d, (long long)ldr, (long long)ldq);
    if (2 * min64(k, n) + kCapSlack > INT_MAX / 2)
        return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "cuda backend: k=%lld is too large (at most %lld)",
                     (long long)k, (long long)((INT_MAX / 2 - kCapSlack) / 2));
    if (prm->cuda_path < XKNN_CUDA_PATH_AUTO || prm->cuda_path > XKNN_CUDA_PATH_MMA)
        return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "cuda backend: unknown cuda_path %d", prm->cuda_path);
    if ((int)prm->metric < 0 || prm->metric >= XKNN_METRIC_COUNT)
        return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "unknown metric %d", (int)prm->metric);
    return XKNN_SUCCESS;
}

/* ---- the device-level pipeline ------------------------------------------------------ */
struct Run {
    xknn_cuda_context *ctx;
    const Plan *p;
    cudaStream_t st;
    unsigned long long *stats;
    float *qn, *tau, *rn, *tile;
    int *cnt;
    long long *mcount;
    Cand *cand;
    void *cublas_ws;
    /* p.center: the centred references and their norms are in the workspace (made by
     * the call's first state block; the references do not change within a call) */
    mutable bool centred;
};

Run run_bind(xknn_cuda_context *ctx, const Plan *p, void *ws, cudaStream_t st)
{
    char *b = (char *)ws;
    Run r;
    r.ctx = ctx;
    r.p = p;
    r.st = st;
    r.stats = (unsigned long long *)(b + p->off_stats);
    r.qn = (float *)(b + p->off_qn);
    r.tau = (float *)(b + p->off_tau);
    r.cnt = (int *)(b + p->off_cnt);
    r.mcount = (long long *)(b + p->off_mcount);
    r.cand = (Cand *)(b + p->off_cand);
    r.rn = (float *)(b + p->off_rn);
    r.tile = (float *)(b + p->off_tile);
    r.cublas_ws = b + p->off_cublas;
    r.centred = false;
    return r;
}

/* Binds cuBLAS to the stream and to our workspace (cublasSetStream resets the workspace
 * to cuBLAS's default pool, so the order matters), and zeroes the statistics. */
xknn_status run_start(const Run &r, Err er)
{
    xknn_status st = XKNN_SUCCESS;
    if (r.p->mma) { /* no cuBLAS on the tensor-core path */
        XKNN__CUDA_CHECK(cudaMemsetAsync(r.stats, 0, sizeof(unsigned long long) * kStatCount, r.st));
        return st;
    }
    if (!r.ctx->blas) XKNN__CUBLAS_CHECK(cublasCreate(&r.ctx->blas));
    XKNN__CUBLAS_CHECK(cublasSetStream(r.ctx->blas, r.st));
    XKNN__CUBLAS_CHECK(cublasSetWorkspace(r.ctx->blas, r.cublas_ws, r.p->cublas_ws));
    XKNN__CUBLAS_CHECK(cublasSetPointerMode(r.ctx->blas, CUBLAS_POINTER_MODE_HOST));
    XKNN__CUBLAS_CHECK(
        cublasSetMathMode(r.ctx->blas, r.p->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
    XKNN__CUDA_CHECK(cudaMemsetAsync(r.stats, 0, sizeof(unsigned long long) * kStatCount, r.st));
cleanup:
    return st;
}

xknn_status block_begin(const Run &r, const float *Q, int64_t ldq, int64_t qs, Err er)
{
    xknn_status st = XKNN_SUCCESS;
    XKNN__CUDA_CHECK(launch_init_state(r.tau, r.cnt, (int)qs, r.p->S, r.st));
    XKNN__CUDA_CHECK(launch_sqnorms(Q, ldq, qs, r.p->d, r.qn, r.st));
cleanup:
    return st;
}

/* The end-of-pass resolution of the state block bound to r, queries at Q, references
 * R[0, ...) with local ids from r_local0. */
ResolveParams resolve_params(const Run &r, const float *Q, int64_t ldq, const float *R, int64_t ldr,
                             int64_t r_local0)
{
    const Plan &p = *r.p;
    ResolveParams rp;
    memset(&rp, 0, sizeof rp);
    rp.tau = r.tau;
    rp.cnt = r.cnt;
    rp.cand = r.cand;
    rp.Q = Q;
    rp.ldq = ldq;
    rp.R = R;
    rp.ldr = ldr;
    rp.r_local0 = r_local0;
    rp.d = p.d;
    rp.S = p.S;
    rp.cap = (int)p.cap;
    rp.kind = p.kind;
    return rp;
}

/* Whether pass B's entries are pruned by their bounds before the re-rank (mma.cu's
 * mma_prune_kernel): l2 / euclidean where the pass is mma_kernel or ffma_kernel, whose
 * entries can carry their accumulators. The prune saves a row gather per dropped entry,
 * about sqrt(kk n / C) entries a query. ffma_kernel pays for carrying them in the whole
 * pass: its hot loop's registers are allocated less well (W1 fp32 on an H100: pass B
 * +2.1 ms, prune -0.9 ms at k = 10; at k = 100 68.8 -> 67.3 ms, at k = 1024 88.1 ->
 * 83.7 ms), so it carries them only for kk >= n / kFfmaCarryRatio; mma_kernel always
 * does (no cost measured). XKNN_CUDA_NO_PRUNE=1 (a diagnostic: the results are the same
 * bytes) re-ranks every entry. */
static const int64_t kFfmaCarryRatio = 16384;

static int mma_prunes(const Plan &p)
{
    const char *e = getenv("XKNN_CUDA_NO_PRUNE");
    if (e && *e && *e != '0') return 0;
    if (p.wgmma || (p.kind != kCanonL2 && p.kind != kCanonEuclid)) return 0;
    return !p.ffma || p.kk * kFfmaCarryRatio >= p.n;
}

/* The tensor-core passes' parameters for the state block bound to r (mp.n is set per pass). */
MmaParams mma_params(const Run &r, const float *Q, int64_t ldq, int64_t qs, int exclude, int64_t self_local0,
                     const float *R, int64_t ldr)
{
    const Plan &p = *r.p;
    char *b = (char *)r.stats; /* the workspace starts with the statistics */
    MmaParams mp;
    memset(&mp, 0, sizeof mp);
    mp.Q = Q;
    mp.ldq = ldq;
    mp.R = R;
    mp.ldr = ldr;
    mp.qn = r.qn;
    mp.rn = r.rn;
    mp.d = p.d;
    mp.self_local0 = self_local0;
    mp.gmin = (float *)(b + p.off_gmin);
    mp.ga = p.ga;
    mp.thr = (float *)(b + p.off_thr);
    mp.ct = (float *)(b + p.off_ct);
    mp.cnt = r.cnt;
    mp.cand = r.cand;
    mp.stats = r.stats;
    mp.carry = mma_prunes(p);
    mp.ua = p.ua;
    mp.ub = p.ub;
    mp.la = p.la;
    mp.qs = (int)qs;
    mp.cap = (int)p.cap;
    mp.exclude = exclude;
    mp.ffma = p.ffma;
    mp.cthr = mp.thr; /* mode 2's columns: the rows' own state (Q = R) */
    mp.ccnt = mp.cnt;
    mp.ccand = mp.cand;
    return mp;
}

/* The tensor-core pass (mma.cu) over all p.n references, resident at R. */
xknn_status mma_pass(const Run &r, const float *Q, int64_t ldq, int64_t qs, int exclude, int64_t self_local0,
                     const float *R, int64_t ldr, Err er)
{
    const Plan &p = *r.p;
    const int sms = r.ctx->sms;
    xknn_status st = XKNN_SUCCESS;
    MmaParams mp = mma_params(r, Q, ldq, qs, exclude, self_local0, R, ldr);
    if (p.kind == kCanonCosine) {
        /* the passes run on unit rows (mma_bounds); rescue and resolve on the inputs */
        char *b = (char *)r.stats;
        float *rh = (float *)(b + p.off_rhat), *qh = (float *)(b + p.off_qhat);
        XKNN__CUDA_CHECK(launch_unit_rows(R, ldr, p.n, p.d, rh, p.dh, r.st));
        XKNN__CUDA_CHECK(launch_unit_rows(Q, ldq, qs, p.d, qh, p.dh, r.st));
        XKNN__CUDA_CHECK(launch_sqnorms(qh, p.dh, qs, p.d, r.qn, r.st));
        mp.R = rh;
        mp.Q = qh;
        mp.ldr = mp.ldq = p.dh;
    } else if (p.center) {
        /* the passes run on centred TF32 rows with their norms (plan_bounds); rescue and
         * resolve on the inputs */
        char *b = (char *)r.stats;
        float *rh = (float *)(b + p.off_rhat), *qh = (float *)(b + p.off_qhat), *mu = (float *)(b + p.off_mu);
        if (!r.centred) {
            XKNN__CUDA_CHECK(launch_mean_rows(R, ldr, p.n, p.d, mu, r.st));
            XKNN__CUDA_CHECK(launch_center_rows(R, ldr, p.n, p.d, mu, rh, p.dh, r.rn, r.st));
            r.centred = true;
        }
        XKNN__CUDA_CHECK(launch_center_rows(Q, ldq, qs, p.d, mu, qh, p.dh, r.qn, r.st));
        mp.R = rh;
        mp.Q = qh;
        mp.ldr = mp.ldq = p.dh;
    }
    if (!p.center) XKNN__CUDA_CHECK(launch_sqnorms(mp.R, mp.ldr, p.n, p.d, r.rn, r.st));
    mp.n = p.nA;
    XKNN__CUDA_CHECK(launch_mma_pass(mp, 0, sms, p.wgmma ? (int)r.ctx->smem_optin : 0, r.st));
    mp.tau_out = p.est ? r.tau : nullptr; /* the certificate's tau (plan_estimate) */
    XKNN__CUDA_CHECK(launch_mma_select(mp, (int)(p.est ? p.ej : p.kk), sms, r.st));
    mp.tau_out = nullptr;
    mp.n = p.n;
    XKNN__CUDA_CHECK(launch_mma_pass(mp, 1, sms, p.wgmma ? (int)r.ctx->smem_optin : 0, r.st));
    if (mp.carry) XKNN__CUDA_CHECK(launch_mma_prune(mp, (int)p.kk, r.st)); /* mma_prunes */
    mp.R = R;
    mp.Q = Q;
    mp.ldr = ldr;
    mp.ldq = ldq;
    if (p.est) {
        /* re-rank and certify first; the rescue then searches the failed and overflowed */
        int *below = (int *)((char *)r.stats + p.off_below);
        ResolveParams rp = resolve_params(r, Q, ldq, R, ldr, 0);
        rp.cert = (int)p.kk;
        rp.below = below;
        if (p.nb > 1) {
            rp.nb = p.nb;
            rp.rb = p.rb;
            rp.bmax = p.bmax;
            rp.boff = (int *)((char *)r.stats + p.off_boff);
            XKNN__CUDA_CHECK(launch_resolve_ranges(rp, (int)qs, (int)r.ctx->smem_optin, r.st));
        } else {
            XKNN__CUDA_CHECK(launch_resolve(rp, (int)qs, r.st));
        }
        mp.below = below;
        XKNN__CUDA_CHECK(launch_mma_rescue(mp, (int)p.kk, p.kind, sms, r.st));
    } else {
        XKNN__CUDA_CHECK(launch_mma_rescue(mp, (int)p.kk, p.kind, sms, r.st));
        XKNN__CUDA_CHECK(launch_resolve(resolve_params(r, Q, ldq, R, ldr, 0), (int)qs, r.st));
    }
cleanup:
    return st;
}

/* One pass of the state block's qs queries over references R[0, nr) whose local ids
 * start at r_local0. self_local0: local id of state query 0 itself (exclude_self). */
xknn_status block_pass(const Run &r, const float *Q, int64_t ldq, int64_t qs, int exclude, int64_t self_local0,
                       const float *R, int64_t ldr, int64_t nr, int64_t r_local0, Err er)
{
    const Plan &p = *r.p;
    xknn_status st = XKNN_SUCCESS;
    if (p.mma) {
        if (nr != p.n || r_local0 != 0)
            return failf(er, XKNN_ERROR_INTERNAL, "cuda backend: tensor-core pass over a partial reference set");
        return mma_pass(r, Q, ldq, qs, exclude, self_local0, R, ldr, er);
    }
    const float alpha = -2.0f, beta = 0.0f;
    const cublasComputeType_t ct = p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC;
    FilterParams fp;
    memset(&fp, 0, sizeof fp);
    fp.tile = r.tile;
    fp.ldt = p.RC;
    fp.rn = r.rn;
    fp.qn = r.qn;
    fp.tau = r.tau;
    fp.cnt = r.cnt;
    fp.cand = r.cand;
    fp.rcs = p.RCs;
    fp.self_local0 = self_local0;
    fp.Q = Q;
    fp.ldq = ldq;
    fp.R = R;
    fp.ldr = ldr;
    fp.r_local0 = r_local0;
    fp.d = p.d;
    fp.stats = r.stats;
    fp.mrel = p.mrel;
    fp.mabs = p.mabs;
    fp.S = p.S;
    fp.cap = (int)p.cap;
    fp.kk = (int)p.kk;
    fp.exclude = exclude;
    fp.euclid = p.euclid;
    const bool norms_once = p.RN >= nr;
    if (norms_once) XKNN__CUDA_CHECK(launch_sqnorms(R, ldr, nr, p.d, r.rn, r.st));
    for (int64_t t0 = 0; t0 < nr; t0 += p.RC) {
        const int64_t rc = min64(p.RC, nr - t0);
        const float *Rt = R + t0 * ldr;
        if (!norms_once) XKNN__CUDA_CHECK(launch_sqnorms(Rt, ldr, rc, p.d, r.rn, r.st));
        fp.rn = norms_once ? r.rn + t0 : r.rn; /* t0 is a multiple of RC, so of 4 */
        fp.rc = rc;
        fp.col_local0 = r_local0 + t0;
        for (int64_t q0 = 0; q0 < qs; q0 += p.QB) {
            const int64_t qb = min64(p.QB, qs - q0);
            /* column-major view: T^T (rc x qb, ld RC) = -2 * R_t (d x rc)^T * Q (d x qb) */
            XKNN__CUBLAS_CHECK(cublasGemmEx(r.ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rc, (int)qb, (int)p.d,
                                            &alpha, Rt, CUDA_R_32F, (int)ldr, Q + q0 * ldq, CUDA_R_32F, (int)ldq,
                                            &beta, r.tile, CUDA_R_32F, (int)p.RC, ct, CUBLAS_GEMM_DEFAULT));
            fp.qrow0 = (int)q0;
            XKNN__CUDA_CHECK(launch_filter(fp, (int)qb, r.st));
        }
    }
    XKNN__CUDA_CHECK(launch_resolve(resolve_params(r, Q, ldq, R, ldr, r_local0), (int)qs, r.st));
cleanup:
    return st;
}

xknn_status block_finish(const Run &r, int64_t qs, int64_t *ids, float *dist, int64_t id_offset, Err er)
{
    const Plan &p = *r.p;
    xknn_status st = XKNN_SUCCESS;
    FinalParams fp;
    memset(&fp, 0, sizeof fp);
    fp.tau = r.tau;
    fp.cnt = r.cnt;
    fp.cand = r.cand;
    fp.mcount = r.mcount;
    fp.ids = ids;
    fp.dist = dist;
    fp.k = p.k;
    fp.id_offset = id_offset;
    fp.stats = r.stats;
    fp.S = p.S;
    fp.cap = (int)p.cap;
    fp.kk = (int)p.kk;
    fp.encoded = fp.negate = p.kind == kCanonIp;
    fp.smem_merge = r.ctx->smem_optin >= kFinalMergeSmem;
    XKNN__CUDA_CHECK(launch_final(fp, (int)qs, r.st));
cleanup:
    return st;
}

/* The fused path for one state block of qs queries against all n references (device
 * memory): fused kernel, merge + certificate + re-rank + output, rescue. Enqueue only. */
FusedParams fused_params(const Plan &p, void *ws, const float *Q, int64_t ldq, int64_t qs, const float *R,
                         int64_t ldr, int exclude, int64_t self_local0, int64_t *ids, float *dist, int64_t id_offset)
{
    char *b = (char *)ws;
    FusedParams fp;
    memset(&fp, 0, sizeof fp);
    fp.Q = Q;
    fp.ldq = ldq;
    fp.R = R;
    fp.ldr = ldr;
    fp.n = p.n;
    fp.d = p.d;
    fp.rz = p.RZ;
    fp.self_local0 = self_local0;
    fp.part = (unsigned long long *)(b + p.off_part);
    fp.qsp = p.QS;
    fp.flag = (int *)(b + p.off_flag);
    fp.tpv = (float *)(b + p.off_tpv);
    fp.ids = ids;
    fp.dist = dist;
    fp.k = p.k;
    fp.id_offset = id_offset;
    fp.stats = (unsigned long long *)(b + p.off_stats);
    fp.lrel = p.lrel;
    fp.labs = p.labs;
    fp.urel = p.urel;
    fp.uabs = p.uabs;
    fp.qs = (int)qs;
    fp.Z = (int)p.Z;
    fp.kk = (int)p.kk;
    fp.exclude = exclude;
    fp.euclid = p.euclid;
    fp.vec = ((uintptr_t)R % 16 == 0) && ldr % 4 == 0 && p.d % 4 == 0;
    return fp;
}

int rescue_blocks(const xknn_cuda_context *ctx, int64_t qs) { return (int)min64(qs, 2 * (int64_t)ctx->sms); }

xknn_status fused_block(const xknn_cuda_context *ctx, const Plan &p, void *ws, cudaStream_t stream, const float *Q,
                        int64_t ldq, int64_t qs, const float *R, int64_t ldr, int exclude, int64_t self_local0,
                        int64_t *ids, float *dist, int64_t id_offset, Err er)
{
    xknn_status st = XKNN_SUCCESS;
    const FusedParams fp = fused_params(p, ws, Q, ldq, qs, R, ldr, exclude, self_local0, ids, dist, id_offset);
    XKNN__CUDA_CHECK(launch_fused_slices(fp, p.KP, 0, (int)p.Z, stream));
    XKNN__CUDA_CHECK(launch_fused_finish(fp, p.KP, rescue_blocks(ctx, qs), stream));
cleanup:
    return st;
}

void print_plan(const xknn_cuda_context *ctx, const Plan &p, const char *mode, size_t budget, int64_t chunk)
{
    if (p.fused) {
        fprintf(stderr,
                "xknn: cuda: device %d (%s, %d SMs): %s, path fused, n=%lld nq=%lld d=%lld k=%lld; state block "
                "%lld, %lld slice(s) of %lld references, %d keys kept per query and slice, workspace %.1f MiB, "
                "budget %.1f MiB\n",
                ctx->device, ctx->name, ctx->sms, mode, (long long)p.n, (long long)p.nq, (long long)p.d,
                (long long)p.k, (long long)p.QS, (long long)p.Z, (long long)p.RZ, p.KP,
                (double)p.bytes / 1048576.0, (double)budget / 1048576.0);
        return;
    }
    if (p.mma) {
        fprintf(stderr,
                "xknn: cuda: device %d (%s, %d SMs): %s, path %s (%s %s tiles%s, filter in the "
                "epilogue), n=%lld nq=%lld d=%lld k=%lld; state block %lld, witnesses over %lld references (%lld "
                "groups%s%s), %lld candidate slots per query, workspace %.1f MiB, budget %.1f MiB\n",
                ctx->device, ctx->name, ctx->sms, mode, p.ffma ? "fp32" : "mma", p.ffma ? "FP32" : "TF32",
                p.ffma ? "CUDA-core" : p.wgmma ? "wgmma" : "mma.sync", p.center ? " on centred rows" : "",
                (long long)p.n, (long long)p.nq, (long long)p.d, (long long)p.k, (long long)p.QS, (long long)p.nA, (long long)p.ga,
                p.est ? (p.nb > 1 ? ", tau estimated and certified, re-rank by reference range"
                                  : ", tau estimated and certified")
                      : "",
                p.band ? ", a symmetric band of tiles" : "",
                (long long)p.cap,
                (double)p.bytes / 1048576.0, (double)budget / 1048576.0);
        return;
    }
    fprintf(stderr,
            "xknn: cuda: device %d (%s, %d SMs, L2 %zu MiB): %s, path %s, n=%lld nq=%lld d=%lld k=%lld; "
            "state block %lld, tile %lld x %lld, %d split(s), %lld slots/buffer, workspace %.1f MiB, "
            "budget %.1f MiB, chunk %lld rows\n",
            ctx->device, ctx->name, ctx->sms, ctx->l2 >> 20, mode, p.tf32 ? "tf32" : "fp32", (long long)p.n,
            (long long)p.nq, (long long)p.d, (long long)p.k, (long long)p.QS, (long long)p.QB, (long long)p.RC,
            p.S, (long long)p.cap, (double)p.bytes / 1048576.0, (double)budget / 1048576.0, (long long)chunk);
}

/* ---- host path ---------------------------------------------------------------------- */
struct HostBuffers {
    float *dR = nullptr, *dQ = nullptr, *dDist = nullptr;
    float *dChunk[2] = {nullptr, nullptr};
    float *pinned[2] = {nullptr, nullptr};
    int64_t *dIds = nullptr;
    void *dWs = nullptr;
    void *dSort = nullptr; /* the symmetric triangle's sorted rows (launch_mma_sym_sort) */
    int *dFlag = nullptr;  /* a pair's two flags: a side's list thresholds are not all finite */
    /* device buffers come from the context's pool on its stream when it has one */
    cudaMemPool_t pool = nullptr;
    cudaStream_t s = nullptr;
    cudaError_t alloc(void **p, size_t bytes)
    {
        if (!pool) return cudaMalloc(p, bytes);
        cudaError_t e = cudaMallocFromPoolAsync(p, bytes, pool, s);
        if (e == cudaErrorMemoryAllocation) {
            /* the pool keeps what earlier calls freed (budget_of counts it as free): give
             * the unused part back and try once more */
            (void)cudaGetLastError();
            if (cudaStreamSynchronize(s) == cudaSuccess && cudaMemPoolTrimTo(pool, 0) == cudaSuccess)
                e = cudaMallocFromPoolAsync(p, bytes, pool, s);
        }
        return e;
    }
    void dfree(void *p)
    {
        if (!p) return;
        if (pool)
            (void)cudaFreeAsync(p, s);
        else
            (void)cudaFree(p);
    }
    void release()
    {
        /* reverse order of allocation */
        dfree(dSort);
        dSort = nullptr;
        dfree(dFlag);
        dfree(dWs);
        dfree(dDist);
        dfree(dIds);
        dfree(dQ);
        dfree(dChunk[1]);
        dfree(dChunk[0]);
        dfree(dR);
        cudaFreeHost(pinned[1]);
        cudaFreeHost(pinned[0]);
        const cudaMemPool_t keep_pool = pool;
        const cudaStream_t keep_s = s;
        *this = HostBuffers();
        pool = keep_pool;
        s = keep_s;
    }
};

/* After a round of allocations: 1 when they all succeeded; 0 when one ran out of memory
 * (everything released, the caller plans again with a smaller budget); -1 on any other
 * device error (*st set). */
int alloc_outcome(HostBuffers &hb, cudaError_t e, Err er, xknn_status *st)
{
    if (e == cudaSuccess) return 1;
    (void)cudaGetLastError();
    hb.release();
    if (e == cudaErrorMemoryAllocation) return 0;
    *st = failf(er, XKNN_ERROR_DEVICE, "cuda backend: cudaMalloc: %s", cudaGetErrorString(e));
    return -1;
}

xknn_status fail_alloc_kept_failing(Err er, size_t budget, size_t bytes)
{
    return failf(er, XKNN_ERROR_OUT_OF_MEMORY,
                 "cuda backend: device allocations of the planned sizes kept failing (budget %zu bytes, last "
                 "workspace %zu bytes)",
                 budget, bytes);
}

/* The device memory budget: the caller's, or 0.9 x what is free, counting as free what
 * the context's pool holds unused from earlier calls (HostBuffers::alloc trims it when
 * an allocation needs it). */
size_t budget_of(const xknn_params *prm, cudaMemPool_t pool, Err er, xknn_status *st)
{
    size_t free_b = 0, total_b = 0;
    *st = XKNN_SUCCESS;
    if (prm->device_memory_budget) return prm->device_memory_budget;
    const cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *st = failf(er, XKNN_ERROR_DEVICE, "cuda backend: cudaMemGetInfo: %s", cudaGetErrorString(e));
        return 0;
    }
    if (pool) {
        uint64_t reserved = 0, used = 0;
        if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess &&
            cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess && reserved > used)
            free_b += (size_t)(reserved - used);
        (void)cudaGetLastError();
    }
    return (size_t)((double)free_b * 0.9);
}

cudaError_t stage_make(xknn_cuda_context *ctx);

/* The start of every host-array search: sizes checked, the caller's context or a
 * temporary one (*own_ctx, which the caller destroys), its device made current for the
 * call (scope), the device memory budget, and on a caller's context its pinned staging
 * ring (every staged copy of the call goes through it). */
xknn_status host_begin(const xknn__job *job, DeviceScope &scope, xknn_cuda_context **ctx,
                       xknn_cuda_context **own_ctx, size_t *budget, Err er)
{
    const xknn_params *prm = &job->params;
    xknn_status st = XKNN_SUCCESS;
    xknn_error tmp_err;
    XKNN__TRY(check_sizes(er, prm, job->n, job->nq, job->d, job->k, job->ldr, job->ldq));
    *ctx = (xknn_cuda_context *)prm->cuda_context;
    if (!*ctx) {
        const xknn_status cs = xknn_cuda_context_create(prm->device, own_ctx, &tmp_err);
        if (cs != XKNN_SUCCESS) return failf(er, cs, "%s", tmp_err.message);
        *ctx = *own_ctx;
    }
    XKNN__CUDA_CHECK(scope.enter((*ctx)->device));
    *budget = budget_of(prm, (*ctx)->pool, er, &st);
    if (!*own_ctx) {
        XKNN__CUDA_CHECK(stage_make(*ctx));
        (*ctx)->threads = prm->num_threads;
    }
cleanup:
    return st;
}

/* ---- host path on the fused plan ----------------------------------------------------- */
/* Pinned staging: pieces of stage_piece() bytes alternate between two pinned buffers of
 * kStagePiece bytes; the host copies a piece in (OpenMP threads: host memory bandwidth,
 * not one core, is the limit), the copy stream moves it to the device, and the buffer is
 * reused once its copy has completed (its event). Pieces of 512 KiB: on an H100 host
 * (benchmarks/RESULTS.md) W4 with host arrays took 0.90 ms against 0.97 (4 MiB pieces),
 * 0.97 (1 MiB) and 1.26 (256 KiB); W5 2.45 against 2.58, 2.67 and 3.05 ms. */
static const size_t kStagePiece = (size_t)4 << 20, kStageGrain = (size_t)512 << 10;

/* Bytes per piece: kStageGrain, or XKNN_CUDA_STAGE_KIB (a diagnostic for measuring the
 * pipeline's grain; 64 KiB to kStagePiece) */
size_t stage_piece(void)
{
    const char *e = getenv("XKNN_CUDA_STAGE_KIB");
    const long v = e && *e ? atol(e) : 0;
    if (v <= 0) return kStageGrain;
    const size_t b = (size_t)v << 10;
    return b < ((size_t)64 << 10) ? (size_t)64 << 10 : b > kStagePiece ? kStagePiece : b;
}

cudaError_t stage_make(xknn_cuda_context *ctx)
{
    cudaError_t e = cudaSuccess;
    if (!ctx->copy_stream) e = cudaStreamCreateWithFlags(&ctx->copy_stream, cudaStreamNonBlocking);
    for (int b = 0; b < 2 && e == cudaSuccess; ++b) {
        if (!ctx->stage_done[b]) e = cudaEventCreateWithFlags(&ctx->stage_done[b], cudaEventDisableTiming);
        if (e == cudaSuccess && !ctx->stage[b]) e = cudaHostAlloc((void **)&ctx->stage[b], kStagePiece, cudaHostAllocDefault);
    }
    return e;
}

/* rows x row_bytes from host rows of stride ld_bytes into pinned memory, in parallel */
void host_rows_copy(char *dst, const char *src, int64_t rows, size_t row_bytes, size_t ld_bytes, int threads)
{
    const int64_t total = rows * (int64_t)row_bytes;
#ifdef _OPENMP
    if (threads <= 0) threads = omp_get_max_threads();
#endif
    if (ld_bytes == row_bytes) {
        /* one part per thread, at least 32 KiB each */
        int64_t part = (total + (threads > 0 ? threads : 1) - 1) / (threads > 0 ? threads : 1);
        part = part < (32 << 10) ? 32 << 10 : (part + 4095) / 4096 * 4096;
        const int64_t np = (total + part - 1) / part;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (np > 1)
#endif
        for (int64_t i = 0; i < np; ++i) {
            const int64_t o = i * part, len = total - o < part ? total - o : part;
            memcpy(dst + o, src + o, (size_t)len);
        }
    } else {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (total > (256 << 10))
#endif
        for (int64_t i = 0; i < rows; ++i) memcpy(dst + i * (int64_t)row_bytes, src + i * (int64_t)ld_bytes, row_bytes);
    }
    (void)threads;
}

/* Host rows [0, rows) of row_bytes each, stride ld_bytes -> packed device rows, through
 * the staging ring; the copies are ordered on ctx->copy_stream; returns after the last
 * piece is enqueued. */
xknn_status stage_bytes(xknn_cuda_context *ctx, char *dev, const char *host, int64_t rows, size_t row_bytes,
                        size_t ld_bytes, int threads, int *piece, Err er, size_t grain = 0)
{
    xknn_status st = XKNN_SUCCESS;
    if (!grain) grain = stage_piece();
    const int64_t per = max64(1, (int64_t)(grain / row_bytes));
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
        const int64_t nr = min64(per, rows - r0);
        const int b = (*piece)++ & 1;
        if (nr * (int64_t)row_bytes > (int64_t)kStagePiece) {
            /* a row longer than a piece: direct pageable copy */
            XKNN__CUDA_CHECK(cudaMemcpy2DAsync(dev + r0 * row_bytes, row_bytes, host + r0 * ld_bytes, ld_bytes,
                                               row_bytes, (size_t)nr, cudaMemcpyHostToDevice, ctx->copy_stream));
            continue;
        }
        XKNN__CUDA_CHECK(cudaEventSynchronize(ctx->stage_done[b]));
        host_rows_copy(ctx->stage[b], host + r0 * ld_bytes, nr, row_bytes, ld_bytes, threads);
        XKNN__CUDA_CHECK(cudaMemcpyAsync(dev + r0 * row_bytes, ctx->stage[b], (size_t)nr * row_bytes,
                                         cudaMemcpyHostToDevice, ctx->copy_stream));
        XKNN__CUDA_CHECK(cudaEventRecord(ctx->stage_done[b], ctx->copy_stream));
    }
cleanup:
    return st;
}

/* f32 rows of d elements (stride ld elements) */
xknn_status stage_rows(xknn_cuda_context *ctx, float *dev, const float *host, int64_t rows, int64_t d, int64_t ld,
                       int threads, int *piece, Err er)
{
    return stage_bytes(ctx, (char *)dev, (const char *)host, rows, (size_t)d * sizeof(float),
                       (size_t)ld * sizeof(float), threads, piece, er);
}

/* A kept block's memory (NULL is fine); its device memory is freed once the device is
 * done with it (cudaFree waits). */
void kept_free(xknn_cuda_kept *kp)
{
    if (!kp) return;
    if (kp->dev && kp->freed_on)
        (void)cudaFreeAsync(kp->dev, kp->freed_on);
    else if (kp->dev)
        cudaFree(kp->dev);
    free(kp->valid);
    free(kp);
}

/* Rows [host, host + rows) (row_bytes each, stride ld_bytes) on the device from a kept
 * copy (xknn_cuda_keep_rows) holding them, its chunks not uploaded yet staged first (the
 * copies ordered before later work on s); NULL where no kept copy holds them (or *st set
 * on a device error). The caller must not forget the copy during the call. */
const char *kept_rows(xknn_cuda_context *ctx, const void *host, int64_t rows, size_t row_bytes, size_t ld_bytes,
                      cudaStream_t s, int threads, int *piece, Err er, xknn_status *st)
{
    const char *h = (const char *)host;
    xknn_cuda_kept *kp = NULL;
    int64_t r0 = 0;
    int staged = 0;
    *st = XKNN_SUCCESS;
    if (!ctx || rows <= 0) return NULL;
    pthread_mutex_lock(&ctx->kept_lock);
    for (int i = 0; i < 8 && !kp; ++i) {
        xknn_cuda_kept *c = ctx->kept[i];
        if (!c || c->row_bytes != row_bytes || c->ld_bytes != ld_bytes || h < c->host) continue;
        const size_t off = (size_t)(h - c->host);
        if (off % ld_bytes || (int64_t)(off / ld_bytes) + rows > c->rows) continue;
        kp = c;
        r0 = (int64_t)(off / ld_bytes);
    }
    pthread_mutex_unlock(&ctx->kept_lock);
    if (!kp) return NULL;
    for (int64_t c = r0 / kp->chunk; c <= (r0 + rows - 1) / kp->chunk; ++c) {
        if (kp->valid[c]) continue;
        const int64_t c0 = c * kp->chunk, nr = min64(kp->chunk, kp->rows - c0);
        *st = stage_bytes(ctx, kp->dev + c0 * (int64_t)row_bytes, kp->host + c0 * (int64_t)ld_bytes, nr, row_bytes,
                          ld_bytes, threads, piece, er);
        if (*st != XKNN_SUCCESS) return NULL;
        kp->valid[c] = 1;
        staged = 1;
    }
    if (staged) {
        const cudaError_t e = cudaStreamWaitEvent(s, ctx->stage_done[(*piece - 1) & 1], 0);
        if (e != cudaSuccess) {
            *st = failf(er, XKNN_ERROR_DEVICE, "cuda backend: %s (kept rows)", cudaGetErrorString(e));
            return NULL;
        }
    }
    return kp->dev + r0 * (int64_t)row_bytes;
}

/* The context's pinned host buffer of at least `bytes` for a pair's results (grown,
 * never shrunk, freed with the context); NULL where pinned memory cannot be had (the
 * caller falls back to pageable memory). */
void *pair_out_buffer(xknn_cuda_context *ctx, size_t bytes)
{
    if (ctx->pair_out_bytes >= bytes) return ctx->pair_out;
    if (ctx->pair_out) cudaFreeHost(ctx->pair_out);
    ctx->pair_out = NULL;
    ctx->pair_out_bytes = 0;
    if (cudaHostAlloc(&ctx->pair_out, bytes, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        ctx->pair_out = NULL;
        return NULL;
    }
    ctx->pair_out_bytes = bytes;
    return ctx->pair_out;
}

/* ---- running lists on the device for a host call's parts (list mirrors) -------------
 * xknn_search_pair and the blocked self-join run many parts over the same rows; each part
 * used to bring its results to the host and merge them into the running lists there, so
 * the host merged a pair's two sides once a part. A mirror holds a side's lists on the
 * device for the whole call: the parts merge into it on the device (launch_lists_merge,
 * the host merge's rules), read their thresholds from it (launch_lists_kth), and the
 * lists cross to the host once, at the end. A part that runs on the CPU takes its rows'
 * lists to the host and back (cpu_pair). */
typedef xknn_cuda_context::xknn_cuda_mirror ListMirror;

/* (grain: bytes a piece; 0: stage_piece(), the pipeline's latency grain; bulk copies of
 * whole list sets pass kStagePiece) */
xknn_status results_out(xknn_cuda_context *ctx, int staged, int64_t *ids_host, const int64_t *ids_dev,
                        float *dist_host, const float *dist_dev, size_t count, int threads, cudaStream_t s,
                        int *piece, Err er, size_t grain = 0);

/* 1 (and the device lists of rows [ids, ids + rows * k)) where m holds them */
static bool mirror_holds(const ListMirror &m, const int64_t *ids, int64_t rows, int64_t k, int64_t **dids,
                         float **ddist)
{
    if (!m.ids || m.k != k || !ids || ids < m.host_ids || rows < 0) return false;
    const int64_t off = (int64_t)(ids - m.host_ids);
    if (off % k || off / k + rows > m.rows) return false;
    *dids = m.ids + off;
    *ddist = m.dist + off;
    return true;
}

/* The device lists of rows [ids, ids + rows * k) where a mirror of this call, or lists
 * the caller keeps (xknn_cuda_keep_lists), hold them. */
bool mirror_of(const xknn_cuda_context *ctx, const int64_t *ids, int64_t rows, int64_t k, int64_t **dids,
               float **ddist)
{
    bool found = false;
    for (int i = 0; i < 2 && !found; ++i) found = mirror_holds(ctx->mirror[i], ids, rows, k, dids, ddist);
    if (found) return true;
    pthread_mutex_t *lock = (pthread_mutex_t *)&ctx->kept_lock;
    pthread_mutex_lock(lock);
    for (int i = 0; i < 4 && !found; ++i) found = mirror_holds(ctx->lists[i], ids, rows, k, dids, ddist);
    pthread_mutex_unlock(lock);
    return found;
}

/* Mirrors side s's lists in slot i: uploaded from the host (or, pad = 1, padding made on
 * the device), where they take at most an eighth of *budget (which then loses them) and
 * XKNN_CUDA_DEVICE_LISTS is not 0 (a diagnostic: the host merges, the same bytes).
 * Nothing where the allocation fails: the parts then merge on the host. */
xknn_status mirror_begin(xknn_cuda_context *ctx, int i, const xknn__sym_side *s, int64_t k, int pad, int ip,
                         size_t *budget, int threads, Err er)
{
    xknn_status st = XKNN_SUCCESS;
    const char *env = getenv("XKNN_CUDA_DEVICE_LISTS");
    const size_t cnt = (size_t)(s->rows * k), bytes = cnt * (sizeof(int64_t) + sizeof(float));
    ListMirror m = {s->ids, s->dist, s->rows, k, NULL, NULL};
    int piece = 0;
    if ((env && *env == '0') || s->rows <= 0 || !s->ids || !s->dist || bytes > *budget / 8) return st;
    if (!pad) {
        /* lists that are padding only (each row's first id -1, its last distance the
         * padding's, no bound) are made on the device rather than uploaded */
        const float pv = ip ? -INFINITY : INFINITY;
        int64_t other = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) reduction(+ : other) num_threads(threads > 0 ? threads : omp_get_max_threads())
#endif
        for (int64_t r = 0; r < s->rows; ++r) other += !(s->ids[r * k] < 0 && s->dist[r * k + k - 1] == pv);
        pad = other == 0;
    }
    if (cudaMalloc((void **)&m.ids, cnt * sizeof(int64_t)) != cudaSuccess ||
        cudaMalloc((void **)&m.dist, cnt * sizeof(float)) != cudaSuccess) {
        (void)cudaGetLastError(); /* (the host merges) */
        goto cleanup;
    }
    if (pad) {
        XKNN__CUDA_CHECK(launch_lists_pad(m.ids, m.dist, (int64_t)cnt, ip, ctx->sms, ctx->stream));
    } else {
        XKNN__TRY(stage_bytes(ctx, (char *)m.ids, (const char *)s->ids, s->rows, (size_t)k * sizeof(int64_t),
                              (size_t)k * sizeof(int64_t), threads, &piece, er, kStagePiece));
        XKNN__TRY(stage_bytes(ctx, (char *)m.dist, (const char *)s->dist, s->rows, (size_t)k * sizeof(float),
                              (size_t)k * sizeof(float), threads, &piece, er, kStagePiece));
        XKNN__CUDA_CHECK(cudaStreamWaitEvent(ctx->stream, ctx->stage_done[(piece - 1) & 1], 0));
    }
    ctx->mirror[i] = m;
    *budget -= bytes;
    m.ids = NULL;
    m.dist = NULL;
cleanup:
    if (m.ids || m.dist) (void)cudaStreamSynchronize(ctx->stream);
    if (m.ids) cudaFree(m.ids);
    if (m.dist) cudaFree(m.dist);
    return st;
}

/* Ends the mirror of slot i (if any): its lists to the host (download) and freed. */
xknn_status mirror_end(xknn_cuda_context *ctx, int i, int download, int threads, Err er)
{
    xknn_status st = XKNN_SUCCESS;
    const ListMirror m = ctx->mirror[i];
    int piece = 0;
    if (!m.ids) return st;
    memset(&ctx->mirror[i], 0, sizeof ctx->mirror[i]);
    if (download)
        st = results_out(ctx, 1, m.host_ids, m.ids, m.host_dist, m.dist, (size_t)(m.rows * m.k), threads, ctx->stream,
                         &piece, er, kStagePiece);
    (void)cudaStreamSynchronize(ctx->stream);
    cudaFree(m.ids);
    cudaFree(m.dist);
    return st;
}

/* Results out: ids (and dist when dist_host is not NULL) from the device to the host
 * once the work enqueued on s before the call is done; returns when the host has every
 * byte. staged (a caller's context, stage_make done): pieces move by DMA into the
 * pinned ring and the host copies them out in parallel while the next piece is in
 * flight; otherwise plain copies into pageable memory (the driver stages them). */
xknn_status results_out(xknn_cuda_context *ctx, int staged, int64_t *ids_host, const int64_t *ids_dev,
                        float *dist_host, const float *dist_dev, size_t count, int threads, cudaStream_t s,
                        int *piece, Err er, size_t grain)
{
    xknn_status st = XKNN_SUCCESS;
    char *const dst[2] = {(char *)ids_host, (char *)dist_host};
    const char *const src[2] = {(const char *)ids_dev, (const char *)dist_dev};
    const size_t bytes[2] = {count * sizeof(int64_t), count * sizeof(float)};
    char *pend_dst = NULL; /* the piece in flight, copied out after the next is enqueued */
    size_t pend_len = 0;
    int pend_b = 0;
    for (int i = 0; i < 2; ++i) {
        if (!dst[i] || !bytes[i]) continue;
        if (!staged) {
            XKNN__CUDA_CHECK(cudaMemcpyAsync(dst[i], src[i], bytes[i], cudaMemcpyDeviceToHost, s));
            continue;
        }
        if (!grain) grain = stage_piece();
        for (size_t o = 0; o < bytes[i]; o += grain) {
            const size_t len = bytes[i] - o < grain ? bytes[i] - o : grain;
            const int b = (*piece)++ & 1;
            XKNN__CUDA_CHECK(cudaEventSynchronize(ctx->stage_done[b]));
            XKNN__CUDA_CHECK(cudaMemcpyAsync(ctx->stage[b], src[i] + o, len, cudaMemcpyDeviceToHost, s));
            XKNN__CUDA_CHECK(cudaEventRecord(ctx->stage_done[b], s));
            if (pend_dst) {
                XKNN__CUDA_CHECK(cudaEventSynchronize(ctx->stage_done[pend_b]));
                host_rows_copy(pend_dst, ctx->stage[pend_b], 1, pend_len, pend_len, threads);
            }
            pend_dst = dst[i] + o;
            pend_len = len;
            pend_b = b;
        }
    }
    if (pend_dst) {
        XKNN__CUDA_CHECK(cudaEventSynchronize(ctx->stage_done[pend_b]));
        host_rows_copy(pend_dst, ctx->stage[pend_b], 1, pend_len, pend_len, threads);
    }
    XKNN__CUDA_CHECK(cudaStreamSynchronize(s));
cleanup:
    return st;
}

/* Host path on the fused plan: one device allocation (from the context's pool: after the
 * first call of a context no cudaMalloc), the context's stream. With a caller's context
 * (staged = 1) inputs go through the pinned staging ring on the copy stream, and the
 * first query block's fused kernel runs slice group by slice group as its references
 * arrive (copies overlap the search); a temporary context copies from pageable memory.
 * One synchronisation per query block (results_out).
 * *alloc_failed = 1 when the allocation fails, so the caller can plan the GEMM path. */
xknn_status host_fused(const xknn__job *job, xknn_cuda_context *ctx, const Plan &plan, int self_res, int staged,
                       size_t budget, int *alloc_failed, Err er)
{
    const xknn_params *prm = &job->params;
    const int64_t n = job->n, nq = job->nq, d = job->d, k = job->k;
    const size_t row_bytes = (size_t)d * sizeof(float);
    const size_t o_q = align_up((size_t)n * row_bytes);
    const size_t o_ids = o_q + align_up(self_res ? 0 : (size_t)plan.QS * row_bytes);
    const size_t o_dist = o_ids + align_up((size_t)plan.QS * k * sizeof(int64_t));
    const size_t o_ws = o_dist + align_up(job->dist ? (size_t)plan.QS * k * sizeof(float) : 0);
    const size_t total = o_ws + plan.bytes;
    const int threads = prm->num_threads > 0 ? prm->num_threads : 0;
    cudaStream_t s = ctx->stream;
    xknn_status st = XKNN_SUCCESS;
    char *mem = NULL;
    float *dR, *dQ, *dDist;
    int64_t *dIds;
    unsigned long long stats[kStatCount];
    cudaError_t e;
    int piece = 0;

    *alloc_failed = 0;
    {
        HostBuffers hb; /* (its alloc: from the pool, trimmed once when it runs out) */
        hb.pool = ctx->pool;
        hb.s = s;
        e = hb.alloc((void **)&mem, total);
    }
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        *alloc_failed = 1;
        return XKNN_SUCCESS;
    }
    XKNN__CUDA_CHECK(e);
    dR = (float *)mem;
    dQ = (float *)(mem + o_q);
    dIds = (int64_t *)(mem + o_ids);
    dDist = job->dist ? (float *)(mem + o_dist) : NULL;
    if (prm->verbose) print_plan(ctx, plan, staged ? "resident references, staged copies" : "resident references", budget, 0);
    XKNN__CUDA_CHECK(cudaMemsetAsync(mem + o_ws + plan.off_stats, 0, sizeof(unsigned long long) * kStatCount, s));
    if (!staged)
        XKNN__CUDA_CHECK(cudaMemcpy2DAsync(dR, row_bytes, job->ref, (size_t)job->ldr * sizeof(float), row_bytes,
                                           (size_t)n, cudaMemcpyHostToDevice, s));
    for (int64_t q0 = 0; q0 < nq; q0 += plan.QS) {
        const int64_t qs = min64(plan.QS, nq - q0);
        const float *Q = self_res ? dR + q0 * d : dQ;
        const FusedParams fp = fused_params(plan, mem + o_ws, Q, d, qs, dR, d, prm->exclude_self,
                                            prm->query_id_offset + q0 - prm->ref_id_offset, dIds, dDist,
                                            prm->ref_id_offset);
        if (staged && q0 == 0) {
            /* slice groups of about a quarter of the references each: the first group's
             * kernel runs while the later groups are copied (self-join: the queries are
             * all the references, so one group) */
            const int64_t groups = self_res ? 1 : min64(plan.Z, 4), per = ceil_div(plan.Z, groups);
            if (!self_res) {
                XKNN__TRY(stage_rows(ctx, dQ, job->query, qs, d, job->ldq, threads, &piece, er));
            }
            for (int64_t z0 = 0; z0 < plan.Z; z0 += per) {
                const int64_t nz = min64(per, plan.Z - z0), r0 = z0 * plan.RZ, r1 = min64(n, (z0 + nz) * plan.RZ);
                XKNN__TRY(stage_rows(ctx, dR + r0 * d, job->ref + r0 * job->ldr, r1 - r0, d, job->ldr, threads,
                                     &piece, er));
                XKNN__CUDA_CHECK(cudaStreamWaitEvent(s, ctx->stage_done[(piece - 1) & 1], 0));
                XKNN__CUDA_CHECK(launch_fused_slices(fp, plan.KP, (int)z0, (int)nz, s));
            }
        } else {
            if (!self_res) {
                if (staged) {
                    /* the previous block's kernels read dQ until they finish */
                    XKNN__CUDA_CHECK(cudaStreamSynchronize(s));
                    XKNN__TRY(stage_rows(ctx, dQ, job->query + q0 * job->ldq, qs, d, job->ldq, threads, &piece, er));
                    XKNN__CUDA_CHECK(cudaStreamWaitEvent(s, ctx->stage_done[(piece - 1) & 1], 0));
                } else {
                    XKNN__CUDA_CHECK(cudaMemcpy2DAsync(dQ, row_bytes, job->query + q0 * job->ldq,
                                                       (size_t)job->ldq * sizeof(float), row_bytes, (size_t)qs,
                                                       cudaMemcpyHostToDevice, s));
                }
            }
            XKNN__CUDA_CHECK(launch_fused_slices(fp, plan.KP, 0, (int)plan.Z, s));
        }
        XKNN__CUDA_CHECK(launch_fused_finish(fp, plan.KP, rescue_blocks(ctx, qs), s));
        XKNN__TRY(results_out(ctx, staged, job->ids + q0 * k, dIds, job->dist ? job->dist + q0 * k : NULL, dDist,
                              (size_t)(qs * k), threads, s, &piece, er));
    }
    if (prm->verbose) {
        XKNN__CUDA_CHECK(cudaMemcpyAsync(stats, mem + o_ws + plan.off_stats, sizeof stats, cudaMemcpyDeviceToHost, s));
        XKNN__CUDA_CHECK(cudaStreamSynchronize(s));
        fprintf(stderr, "xknn: cuda: fused path: %llu candidates re-ranked, %llu queries re-run exactly\n",
                stats[kStatAppended], stats[kStatReruns]);
    }
    XKNN__CUDA_CHECK(cudaStreamSynchronize(s));
cleanup:
    if (staged && ctx->copy_stream) (void)cudaStreamSynchronize(ctx->copy_stream);
    if (mem) {
        if (ctx->pool)
            (void)cudaFreeAsync(mem, s);
        else
            (void)cudaFree(mem);
    }
    (void)cudaStreamSynchronize(s);
    return st;
}

/* ---- generic path: every other metric and dtype (generic.cu) ------------------------ */
/* 1 when the job is not f32 l2/euclidean/ip/cosine, the metrics the certified fast paths
 * cover (ip and cosine only on the tensor-core path: host_search sends them back here
 * where that does not apply). */
int generic_job(const xknn__job *job)
{
    return job->dtype != XKNN_DTYPE_F32 || (job->params.metric != XKNN_METRIC_L2 &&
                                            job->params.metric != XKNN_METRIC_EUCLIDEAN && !gemm_ipcos(&job->params));
}

/* Layout of the generic path's single device allocation. */
struct GenPlan {
    int64_t QS, S, rs, chunk, cap, kk;
    int resident;
    size_t off_ref, off_rnorm, off_w, off_q, off_qnorm, off_cand, off_cnt, off_th, off_tau, off_mcount, off_ids,
        off_dist, off_stats, bytes;
};

void gen_layout(GenPlan &g, int64_t n, int64_t d, int64_t k, size_t row_bytes, int cosine, int weights, int has_dist,
                int own_q, int sms)
{
    const int64_t groups = ceil_div(g.QS, kGenQ);
    const int64_t tiles = ceil_div(g.chunk, kGenR);
    int64_t S = ceil_div(4 * (int64_t)sms, groups);
    S = max64(1, min64(S, ceil_div(tiles, 4)));
    g.rs = ceil_div(tiles, S) * kGenR;
    g.S = ceil_div(g.chunk, g.rs);
    size_t o = 0;
    auto take = [&](size_t bytes) {
        const size_t at = o;
        o = align_up(o + bytes);
        return at;
    };
    g.off_stats = take(sizeof(unsigned long long) * kStatCount);
    g.off_ref = take((size_t)g.chunk * row_bytes);
    g.off_rnorm = take(cosine ? (size_t)g.chunk * sizeof(double) : 0);
    g.off_w = take(weights ? (size_t)d * sizeof(float) : 0);
    g.off_q = take(own_q ? (size_t)g.QS * row_bytes : 0);
    g.off_qnorm = take(cosine ? (size_t)g.QS * sizeof(double) : 0);
    g.off_cand = take((size_t)g.QS * g.S * g.cap * sizeof(Cand));
    g.off_cnt = take((size_t)g.QS * g.S * sizeof(int));
    g.off_th = take((size_t)g.QS * g.S * sizeof(unsigned long long));
    g.off_tau = take((size_t)g.QS * sizeof(float));
    g.off_mcount = take((size_t)g.QS * sizeof(long long));
    g.off_ids = take((size_t)g.QS * k * sizeof(int64_t));
    g.off_dist = take(has_dist ? (size_t)g.QS * k * sizeof(float) : 0);
    g.bytes = o;
    (void)n;
}

/* ---- exact int8 tensor-core path (imma.cu) ---------------------------------------- */
/* Padded row bytes when the job takes the int8 tensor-core path, else 0: u8/i8 with l2,
 * euclidean or ip, d <= XKNN_INT8_EXACT_MAX_D, or hamming on bit-packed rows (b1 tensor
 * cores); the resident queries within shared memory,
 * at least kMmaWitnessRatio kk witness groups (as the TF32 path). XKNN_CUDA_NO_IMMA=1 (diagnostic)
 * keeps the canonical tiles. */
int64_t imma_rows(const xknn__job *job, const xknn_cuda_context *ctx)
{
    const xknn_metric m = job->params.metric;
    const char *off = getenv("XKNN_CUDA_NO_IMMA");
    if (off && *off && *off != '0') return 0;
    const int bin = job->dtype == XKNN_DTYPE_BIN;
    if (bin ? m != XKNN_METRIC_HAMMING
            : ((job->dtype != XKNN_DTYPE_U8 && job->dtype != XKNN_DTYPE_I8) ||
               (m != XKNN_METRIC_L2 && m != XKNN_METRIC_EUCLIDEAN && m != XKNN_METRIC_IP)))
        return 0;
    if (ctx->cc_major < 8 || job->n > kMaxRefsPerCall - kMmaBN) return 0;
    if (bin ? job->d > (int64_t)1 << 29 : job->d > XKNN_INT8_EXACT_MAX_D) return 0;
    if (ceil_div(job->n, kImmaGroup) < kMmaWitnessRatio * min64(job->k, job->n)) return 0;
    const int64_t dp = round_up(bin ? (job->d + 63) / 64 * 8 : job->d, 128);
    return imma_smem_bytes(dp) <= ctx->smem_optin ? dp : 0;
}

/* The int8 path for host arrays, references resident. *done = 0 (and SUCCESS) when its
 * workspace does not fit the budget: the canonical tiles take the job. staged (a
 * caller's context): inputs in and results out through the pinned staging ring; the raw
 * query rows then have their own area, so their copies need not wait for the reference
 * preparation. */
xknn_status host_imma(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget, int64_t dp, int *done,
                      Err er)
{
    const xknn_params *prm = &job->params;
    const int64_t n = job->n, nq = job->nq, d = job->d, k = job->k, kk = min64(k, n);
    const int self_res = job->query_data == job->ref_data && job->ldq == job->ldr && nq == n;
    const int bin = job->dtype == XKNN_DTYPE_BIN;
    const int shift = bin ? -1 : job->dtype == XKNN_DTYPE_U8; /* launch_imma_prep's convention */
    const size_t raw_row = bin ? (size_t)(d + 63) / 64 * 8 : (size_t)d; /* bytes of a packed input row */
    const size_t ub = bin ? 8 : 1;                                      /* bytes per ld unit */
    cudaStream_t sc = ctx->stream;
    HostBuffers hb;
    xknn_status st = XKNN_SUCCESS;
    int64_t QS, nA, ga, cap;
    size_t o = 0, off_stats, off_R, off_rsum, off_rsq, off_ncol, off_raw, off_rawq, off_Q, off_qsum, off_qsq, off_gmin,
           off_th, off_cnt, off_tau, off_mcount, off_cand, off_ids, off_dist;
    int piece = 0;
    char *b;
    unsigned long long stats[kStatCount];
    /* -v: phase times. ev[0..2]: before the reference upload, after it, at the end;
     * ev[3..6] per query block: before the queries, before the search, before the results
     * out, after them (summed over the blocks in ph[]) */
    cudaEvent_t ev[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    float ph[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* ref preparation, queries in, search, results out */
    /* Hopper: the warp-specialized wgmma kernel for u8/i8 (XKNN_CUDA_MMA_SYNC=1, a
     * diagnostic, keeps the mma.sync one, which every GPU of compute capability >= 8.0 runs) */
    const char *ms = getenv("XKNN_CUDA_MMA_SYNC");
    const int imma_wgmma = !bin && ctx->cc_major == 9 && ctx->cc_minor == 0 && mma_wgmma_built() &&
                           !(ms && *ms && *ms != '0');
    *done = 0;
    hb.pool = ctx->pool;
    hb.s = sc;
    {
        const double f = sqrt(witness_c(kk, kImmaWitnessC) * (double)kk / (double)n);
        nA = max64((int64_t)ceil(f * (double)n), max64(kMmaWitnessRatio * kMmaGroup * kk, 8192));
        nA = min64(round_up(nA, kMmaBN), n);
        ga = ceil_div(nA, kImmaGroup);
        const double expect = (double)kk * (double)n / (double)nA + 256.0;
        cap = round_up(max64((int64_t)(2.0 * expect) + 1024, 2 * kk + 1024 + kBlock), 256);
        if (cap > INT_MAX / 2) return XKNN_SUCCESS;
    }
    for (QS = min64(nq, kMaxStateQueries);; QS = (QS + 1) / 2) {
        auto take = [&](size_t bytes) {
            const size_t at = o;
            o = align_up(o + bytes);
            return at;
        };
        o = 0;
        off_stats = take(sizeof(unsigned long long) * kStatCount);
        off_R = take((size_t)n * dp);
        off_rsum = take((size_t)n * sizeof(int));
        off_rsq = take((size_t)n * sizeof(int));
        off_ncol = take(imma_wgmma ? imma_ncol_entries(n) * sizeof(int) : 0);
        off_raw = take((size_t)max64(self_res || staged ? n : max64(n, QS), 1) * raw_row);
        off_rawq = staged && !self_res ? take((size_t)QS * raw_row) : off_raw;
        off_Q = take(self_res ? 0 : (size_t)QS * dp);
        off_qsum = take(self_res ? 0 : (size_t)QS * sizeof(int));
        off_qsq = take(self_res ? 0 : (size_t)QS * sizeof(int));
        off_gmin = take((size_t)QS * ga * sizeof(long long));
        off_th = take((size_t)QS * sizeof(long long));
        off_cnt = take((size_t)QS * sizeof(int));
        off_tau = take((size_t)QS * sizeof(float));
        off_mcount = take((size_t)QS * sizeof(long long));
        off_cand = take((size_t)QS * cap * sizeof(Cand));
        off_ids = take((size_t)QS * k * sizeof(int64_t));
        off_dist = take(job->dist ? (size_t)QS * k * sizeof(float) : 0);
        if (o <= budget) break;
        if (QS == 1) return XKNN_SUCCESS; /* does not fit: canonical tiles */
    }
    if (hb.alloc(&hb.dWs, o) != cudaSuccess) {
        (void)cudaGetLastError();
        return XKNN_SUCCESS;
    }
    *done = 1;
    if (prm->verbose)
        fprintf(stderr,
                "xknn: cuda: %s on %s (%s), exact integer tensor cores: %lld queries per block, witnesses over "
                "%lld references (%lld groups), %lld candidate slots, workspace %.1f MiB of a %.1f MiB budget\n",
                xknn_metric_name(prm->metric), xknn_dtype_name(job->dtype), ctx->name, (long long)QS, (long long)nA,
                (long long)ga, (long long)cap, (double)o / 1048576.0, (double)budget / 1048576.0);
    b = (char *)hb.dWs;
    if (prm->verbose) { /* -v: the device time after the reference upload, for benchmarks */
        for (int i = 0; i < 7; ++i) XKNN__CUDA_CHECK(cudaEventCreate(&ev[i]));
        XKNN__CUDA_CHECK(cudaEventRecord(ev[0], sc));
    }
    XKNN__CUDA_CHECK(cudaMemsetAsync(b + off_stats, 0, sizeof(unsigned long long) * kStatCount, sc));
    if (staged) {
        XKNN__TRY(stage_bytes(ctx, b + off_raw, (const char *)job->ref_data, n, raw_row, (size_t)job->ldr * ub,
                              prm->num_threads, &piece, er));
        XKNN__CUDA_CHECK(cudaStreamWaitEvent(sc, ctx->stage_done[(piece - 1) & 1], 0));
    } else {
        XKNN__CUDA_CHECK(cudaMemcpy2DAsync(b + off_raw, raw_row, job->ref_data, (size_t)job->ldr * ub, raw_row,
                                           (size_t)n, cudaMemcpyHostToDevice, sc));
    }
    if (ev[1]) XKNN__CUDA_CHECK(cudaEventRecord(ev[1], sc));
    XKNN__CUDA_CHECK(launch_imma_prep(b + off_raw, (int64_t)(raw_row / ub), n, d, dp, shift, (signed char *)(b + off_R),
                                      (int *)(b + off_rsum), (int *)(b + off_rsq), sc));
    for (int64_t q0 = 0; q0 < nq; q0 += QS) {
        const int64_t qs = min64(QS, nq - q0);
        ImmaParams ip;
        FinalParams fp;
        memset(&ip, 0, sizeof ip);
        memset(&fp, 0, sizeof fp);
        fp.smem_merge = ctx->smem_optin >= kFinalMergeSmem;
        if (ev[3]) XKNN__CUDA_CHECK(cudaEventRecord(ev[3], sc));
        if (self_res) {
            ip.Q = (const signed char *)(b + off_R) + q0 * dp;
            ip.qsum = (const int *)(b + off_rsum) + q0;
            ip.qsq = (const int *)(b + off_rsq) + q0;
        } else {
            const char *hq = (const char *)job->query_data + (size_t)q0 * job->ldq * ub;
            if (staged) {
                XKNN__TRY(stage_bytes(ctx, b + off_rawq, hq, qs, raw_row, (size_t)job->ldq * ub, prm->num_threads,
                                      &piece, er));
                XKNN__CUDA_CHECK(cudaStreamWaitEvent(sc, ctx->stage_done[(piece - 1) & 1], 0));
            } else {
                XKNN__CUDA_CHECK(cudaMemcpy2DAsync(b + off_rawq, raw_row, hq, (size_t)job->ldq * ub, raw_row,
                                                   (size_t)qs, cudaMemcpyHostToDevice, sc));
            }
            XKNN__CUDA_CHECK(launch_imma_prep(b + off_rawq, (int64_t)(raw_row / ub), qs, d, dp, shift,
                                              (signed char *)(b + off_Q), (int *)(b + off_qsum), (int *)(b + off_qsq),
                                              sc));
            ip.Q = (const signed char *)(b + off_Q);
            ip.qsum = (const int *)(b + off_qsum);
            ip.qsq = (const int *)(b + off_qsq);
        }
        ip.R = (const signed char *)(b + off_R);
        ip.rsum = (const int *)(b + off_rsum);
        ip.rsq = (const int *)(b + off_rsq);
        ip.n = n;
        ip.nA = nA;
        ip.ga = ga;
        ip.d = d;
        ip.dp = dp;
        ip.self_local0 = prm->query_id_offset + q0 - prm->ref_id_offset;
        ip.gmin = (long long *)(b + off_gmin);
        ip.th = (long long *)(b + off_th);
        ip.cnt = (int *)(b + off_cnt);
        ip.cand = (Cand *)(b + off_cand);
        ip.stats = (unsigned long long *)(b + off_stats);
        ip.qs = (int)qs;
        ip.cap = (int)cap;
        ip.exclude = prm->exclude_self;
        ip.ip = prm->metric == XKNN_METRIC_IP;
        ip.shift = shift > 0;
        ip.bin = bin;
        ip.euclid = prm->metric == XKNN_METRIC_EUCLIDEAN;
        ip.wgmma_optin = imma_wgmma ? (int)ctx->smem_optin : 0;
        ip.ncol = imma_wgmma ? (int *)(b + off_ncol) : NULL;
        if (ev[4]) XKNN__CUDA_CHECK(cudaEventRecord(ev[4], sc));
        XKNN__CUDA_CHECK(launch_init_state((float *)(b + off_tau), ip.cnt, (int)qs, 1, sc));
        XKNN__CUDA_CHECK(launch_imma(ip, (int)kk, ctx->sms, sc));
        fp.tau = (const float *)(b + off_tau);
        fp.cnt = ip.cnt;
        fp.cand = ip.cand;
        fp.mcount = (long long *)(b + off_mcount);
        fp.ids = (int64_t *)(b + off_ids);
        fp.dist = job->dist ? (float *)(b + off_dist) : NULL;
        fp.k = k;
        fp.id_offset = prm->ref_id_offset;
        fp.stats = ip.stats;
        fp.S = 1;
        fp.cap = (int)cap;
        fp.kk = (int)kk;
        fp.encoded = 1;
        fp.negate = ip.ip;
        XKNN__CUDA_CHECK(launch_final(fp, (int)qs, sc));
        if (ev[5]) XKNN__CUDA_CHECK(cudaEventRecord(ev[5], sc));
        XKNN__TRY(results_out(ctx, staged, job->ids + q0 * k, fp.ids, job->dist ? job->dist + q0 * k : NULL, fp.dist,
                              (size_t)(qs * k), prm->num_threads, sc, &piece, er));
        if (ev[6]) {
            XKNN__CUDA_CHECK(cudaEventRecord(ev[6], sc));
            XKNN__CUDA_CHECK(cudaEventSynchronize(ev[6]));
            float t;
            if (q0 == 0) {
                XKNN__CUDA_CHECK(cudaEventElapsedTime(&t, ev[1], ev[3]));
                ph[0] += t;
            }
            for (int i = 0; i < 3; ++i) {
                XKNN__CUDA_CHECK(cudaEventElapsedTime(&t, ev[3 + i], ev[4 + i]));
                ph[1 + i] += t;
            }
        }
    }
    XKNN__CUDA_CHECK(cudaMemcpyAsync(stats, b + off_stats, sizeof stats, cudaMemcpyDeviceToHost, sc));
    XKNN__CUDA_CHECK(cudaStreamSynchronize(sc));
    if (prm->verbose) {
        float up = 0.0f, rest = 0.0f;
        XKNN__CUDA_CHECK(cudaEventRecord(ev[2], sc));
        XKNN__CUDA_CHECK(cudaEventSynchronize(ev[2]));
        XKNN__CUDA_CHECK(cudaEventElapsedTime(&up, ev[0], ev[1]));
        XKNN__CUDA_CHECK(cudaEventElapsedTime(&rest, ev[1], ev[2]));
        fprintf(stderr,
                "xknn: cuda: %llu candidates kept, %llu queries re-run exactly (buffer overflow); reference upload "
                "%.2f ms, then %.2f ms on the device (reference preparation %.2f, queries in %.2f, search %.2f, "
                "results out %.2f)\n",
                stats[kStatAppended], stats[kStatReruns], up, rest, ph[0], ph[1], ph[2], ph[3]);
    }
cleanup:
    for (int i = 0; i < 7; ++i)
        if (ev[i]) cudaEventDestroy(ev[i]);
    if (staged && ctx->copy_stream) (void)cudaStreamSynchronize(ctx->copy_stream);
    (void)cudaStreamSynchronize(sc);
    hb.release();
    (void)cudaStreamSynchronize(sc);
    return st;
}

/* Host arrays of any metric and dtype: references resident (or in chunks that fit the
 * budget, each copied once per state block), queries in state blocks, canonical tiles
 * with fused selection, then final.cu's sort and output. */
xknn_status host_generic(const xknn__job *job, Err er)
{
    const xknn_params *prm = &job->params;
    const int64_t n = job->n, nq = job->nq, d = job->d, k = job->k;
    const xknn_dtype dt = job->dtype;
    const int bin = dt == XKNN_DTYPE_BIN;
    const int64_t words = bin ? (d + 63) / 64 : 0;
    const size_t ub = xknn__dtype_bytes(dt);
    const size_t row_bytes = bin ? (size_t)words * 8 : (size_t)d * ub;
    const size_t ldr_b = (size_t)job->ldr * ub, ldq_b = (size_t)job->ldq * ub;
    const int cosine = prm->metric == XKNN_METRIC_COSINE, wham = prm->metric == XKNN_METRIC_WHAMMING;
    const int self_res = job->query_data == job->ref_data && job->ldq == job->ldr && nq == n;
    xknn_status st = XKNN_SUCCESS;
    xknn_cuda_context *ctx = (xknn_cuda_context *)prm->cuda_context;
    xknn_cuda_context *own_ctx = NULL;
    DeviceScope scope;
    HostBuffers hb;
    cudaStream_t sc = NULL;
    GenPlan g;
    size_t budget = 0;
    int planned = 0;
    char *b = NULL;
    unsigned long long stats[kStatCount];
    int piece = 0;

    memset(&g, 0, sizeof g);
    XKNN__TRY(host_begin(job, scope, &ctx, &own_ctx, &budget, er));
    {
        const int64_t dp = imma_rows(job, ctx);
        int done = 0;
        if (dp) {
            st = host_imma(job, ctx, own_ctx == NULL, budget, dp, &done, er);
            if (st != XKNN_SUCCESS || done) goto cleanup;
        }
    }
    g.kk = min64(k, n);
    /* after a compaction kk entries remain and a whole tile (kGenR per query) must fit */
    g.cap = round_up(g.kk + kGenR + max64(g.kk, 256), 32);

    /* Plan: references resident if possible, else the largest chunk that fits; queries
     * per state block halved until the workspace fits. An allocation failure shrinks
     * the budget and plans again. */
    sc = ctx->stream;
    hb.pool = ctx->pool;
    hb.s = sc;
    for (int attempt = 0; attempt < 6 && !planned; ++attempt) {
        const size_t B = (size_t)((double)budget * pow(0.75, attempt));
        int fits = 0;
        for (g.chunk = n; g.chunk >= 1 && !fits; g.chunk = g.chunk > 1 ? ceil_div(g.chunk, 2) : 0) {
            g.resident = g.chunk == n;
            for (g.QS = min64(nq, 8192); g.QS >= 1; g.QS /= 2) {
                gen_layout(g, n, d, k, row_bytes, cosine, wham, job->dist != NULL, !(g.resident && self_res),
                           ctx->sms);
                if (g.bytes <= B) {
                    fits = 1;
                    break;
                }
            }
            if (fits || g.chunk == 1) break;
        }
        if (!fits) {
            g.chunk = 1;
            g.QS = 1;
            gen_layout(g, n, d, k, row_bytes, cosine, wham, job->dist != NULL, 1, ctx->sms);
            st = failf(er, XKNN_ERROR_OUT_OF_MEMORY,
                       "cuda backend: device memory budget of %zu bytes is below the minimum of %zu bytes (n=%lld, "
                       "d=%lld, k=%lld, metric %s, dtype %s: one query, one reference row, %lld candidate slots)%s",
                       B, g.bytes, (long long)n, (long long)d, (long long)k, xknn_metric_name(prm->metric),
                       xknn_dtype_name(dt), (long long)g.cap, attempt ? " after allocation failures shrank it" : "");
            goto cleanup;
        }
        planned = alloc_outcome(hb, hb.alloc(&hb.dWs, g.bytes), er, &st);
        if (planned < 0) goto cleanup;
    }
    if (!planned) {
        st = fail_alloc_kept_failing(er, budget, g.bytes);
        goto cleanup;
    }
    if (prm->verbose)
        fprintf(stderr,
                "xknn: cuda: %s on %s (%s), canonical tiles: %lld queries per block, %lld splits of %lld references, "
                "%lld candidate slots, references %s %lld rows, workspace %.1f MiB of a %.1f MiB budget\n",
                xknn_metric_name(prm->metric), xknn_dtype_name(dt), ctx->name, (long long)g.QS, (long long)g.S,
                (long long)g.rs, (long long)g.cap, g.resident ? "resident:" : "streamed in chunks of",
                (long long)g.chunk, (double)g.bytes / 1048576.0, (double)budget / 1048576.0);

    b = (char *)hb.dWs;
    XKNN__CUDA_CHECK(cudaMemsetAsync(b + g.off_stats, 0, sizeof(unsigned long long) * kStatCount, sc));
    if (wham)
        XKNN__CUDA_CHECK(cudaMemcpyAsync(b + g.off_w, prm->weights, (size_t)d * sizeof(float), cudaMemcpyHostToDevice,
                                         sc));
    if (g.resident) {
        XKNN__CUDA_CHECK(cudaMemcpy2DAsync(b + g.off_ref, row_bytes, job->ref_data, ldr_b, row_bytes, (size_t)n,
                                           cudaMemcpyHostToDevice, sc));
        if (cosine) XKNN__CUDA_CHECK(launch_gen_norms(b + g.off_ref, row_bytes, n, d, dt, (double *)(b + g.off_rnorm), sc));
    }
    for (int64_t q0 = 0; q0 < nq; q0 += g.QS) {
        const int64_t qs = min64(g.QS, nq - q0);
        GenParams gp;
        FinalParams fp;
        memset(&gp, 0, sizeof gp);
        memset(&fp, 0, sizeof fp);
        fp.smem_merge = ctx->smem_optin >= kFinalMergeSmem;
        if (g.resident && self_res) {
            gp.Q = b + g.off_ref + (size_t)q0 * row_bytes;
            gp.qnorm = (const double *)(b + g.off_rnorm) + q0;
        } else {
            XKNN__CUDA_CHECK(cudaMemcpy2DAsync(b + g.off_q, row_bytes, (const char *)job->query_data + (size_t)q0 * ldq_b,
                                               ldq_b, row_bytes, (size_t)qs, cudaMemcpyHostToDevice, sc));
            gp.Q = b + g.off_q;
            if (cosine) XKNN__CUDA_CHECK(launch_gen_norms(gp.Q, row_bytes, qs, d, dt, (double *)(b + g.off_qnorm), sc));
            gp.qnorm = (const double *)(b + g.off_qnorm);
        }
        gp.ldq = (int64_t)row_bytes;
        gp.ldr = (int64_t)row_bytes;
        gp.d = d;
        gp.words = words;
        gp.rs = g.rs;
        gp.self_local0 = prm->query_id_offset + q0 - prm->ref_id_offset;
        gp.weights = (const float *)(b + g.off_w);
        gp.cand = (Cand *)(b + g.off_cand);
        gp.cnt = (int *)(b + g.off_cnt);
        gp.th = (unsigned long long *)(b + g.off_th);
        gp.stats = (unsigned long long *)(b + g.off_stats);
        gp.p = prm->p;
        gp.metric = (int)prm->metric;
        gp.dtype = (int)dt;
        gp.sqrt_inputs = prm->metric == XKNN_METRIC_HELLINGER;
        gp.negate = prm->metric == XKNN_METRIC_IP;
        gp.qs = (int)qs;
        gp.S = (int)g.S;
        gp.cap = (int)g.cap;
        gp.kk = (int)g.kk;
        gp.exclude = prm->exclude_self;
        XKNN__CUDA_CHECK(launch_init_state((float *)(b + g.off_tau), gp.cnt, (int)qs, (int)g.S, sc));
        XKNN__CUDA_CHECK(launch_gen_init(gp.th, qs * g.S, sc));
        for (int64_t r0 = 0; r0 < n; r0 += g.chunk) {
            const int64_t rows = min64(g.chunk, n - r0);
            if (!g.resident) {
                XKNN__CUDA_CHECK(cudaMemcpy2DAsync(b + g.off_ref, row_bytes,
                                                   (const char *)job->ref_data + (size_t)r0 * ldr_b, ldr_b, row_bytes,
                                                   (size_t)rows, cudaMemcpyHostToDevice, sc));
                if (cosine)
                    XKNN__CUDA_CHECK(
                        launch_gen_norms(b + g.off_ref, row_bytes, rows, d, dt, (double *)(b + g.off_rnorm), sc));
            }
            gp.R = b + g.off_ref;
            gp.rnorm = (const double *)(b + g.off_rnorm);
            gp.n = rows;
            gp.r_local0 = r0;
            XKNN__CUDA_CHECK(launch_gen_tiles(gp, sc));
        }
        fp.tau = (const float *)(b + g.off_tau);
        fp.cnt = gp.cnt;
        fp.cand = gp.cand;
        fp.mcount = (long long *)(b + g.off_mcount);
        fp.ids = (int64_t *)(b + g.off_ids);
        fp.dist = job->dist ? (float *)(b + g.off_dist) : NULL;
        fp.k = k;
        fp.id_offset = prm->ref_id_offset;
        fp.stats = gp.stats;
        fp.S = (int)g.S;
        fp.cap = (int)g.cap;
        fp.kk = (int)g.kk;
        fp.encoded = 1;
        fp.negate = gp.negate;
        XKNN__CUDA_CHECK(launch_final(fp, (int)qs, sc));
        XKNN__TRY(results_out(ctx, own_ctx == NULL, job->ids + q0 * k, fp.ids, job->dist ? job->dist + q0 * k : NULL,
                              fp.dist, (size_t)(qs * k), prm->num_threads, sc, &piece, er));
    }
    XKNN__CUDA_CHECK(cudaMemcpyAsync(stats, b + g.off_stats, sizeof stats, cudaMemcpyDeviceToHost, sc));
    XKNN__CUDA_CHECK(cudaStreamSynchronize(sc));
    if (prm->verbose) fprintf(stderr, "xknn: cuda: %llu candidates appended\n", stats[kStatAppended]);

cleanup:
    if (sc) (void)cudaStreamSynchronize(sc);
    hb.release();
    if (sc) (void)cudaStreamSynchronize(sc);
    if (own_ctx) xknn_cuda_context_destroy(own_ctx);
    return st;
}

/* ---- symmetric self-join on the tensor-core path -------------------------------------
 * mma.cu's passes with the state of every point live at once: pass A and the select as
 * for a plain search of all n queries, then pass B in mode 2 over the triangle of tiles
 * (each off-diagonal tile feeds its rows' and its columns' buffers), the exact re-run of
 * overflowed buffers, and the resolve + final of the plain path in blocks of queries.
 * Candidate sets, canonical values and so the output bits are those of the plain path.
 * With n states the slots per query are fewer than the plain plan's (1.25x the expected
 * count plus 512 instead of 2x plus 1024); an overflow is re-run exactly as there.
 * Where the band runs, the triangle runs on the points sorted by threshold (mma.cu's
 * SORTED TRIANGLE), its candidates through a pool of pairs; without room for the sorted
 * copy and the pool beside the state it runs in the caller's order. */
static double wall_seconds(void)
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/* The self-join's pass A as a band (mma.cu's SYMMETRIC WITNESSES): W tiles give each row
 * about 256 (W - 1) witnesses (its own 128 W columns and the rows of the CTAs whose band
 * holds it) for n 128 W pairs of tensor work, where the prefix pass gives nA witnesses for
 * n nA. W = nA / 256 + 1 keeps the prefix plan's witnesses a row at about half its work.
 * 0 (the prefix pass) off the warp-specialized Hopper kernel, or where the band would
 * wrap onto itself (2 W + 4 > n / 128 tiles) or have too few groups for kk.
 * XKNN_CUDA_SYM_BAND (a diagnostic; the results are the same bytes): 0 = the prefix pass,
 * N > 0 = a band of N tiles (at most what fits, at least 2). */
int64_t sym_band(const xknn_cuda_context *ctx, const Plan &p, int64_t n, int64_t d)
{
    if (!p.wgmma || p.ffma || !mma_band_supported(d, (int)ctx->smem_optin)) return 0;
    const int64_t most = (ceil_div(n, kMmaBN) - 4) / 2;
    const char *e = getenv("XKNN_CUDA_SYM_BAND");
    if (e && *e) {
        const long long v = atoll(e);
        return v <= 0 || most < 2 ? 0 : max64(2, min64((int64_t)v, most));
    }
    const int64_t W = ceil_div(p.nA, 2 * kMmaBN) + 1;
    if (W > most || 4 * (W - 1) < kMmaWitnessRatio * p.kk) return 0;
    return W;
}

static const char kSymNoFit[] = "the state of all n points does not fit the device memory budget";

static const char *plan_sym(const xknn_cuda_context *ctx, const xknn__job *job, size_t budget, Plan *out,
                            int64_t *out_block, size_t *out_need)
{
    const xknn_params *prm = &job->params;
    const int64_t n = job->n, d = job->d, k = job->k;
    if (!(job->query == job->ref && job->ldq == job->ldr && job->nq == n)) return "the queries are not the references";
    if (prm->query_id_offset != prm->ref_id_offset) return "query_id_offset differs from ref_id_offset";
    if (choose_path(prm, n, n, d, k) != XKNN_CUDA_PATH_MMA)
        return "the symmetric kernel is the tensor-core path's, and this shape takes another path";
    Plan p;
    if (!plan_mma(ctx, prm, n, n, d, k, SIZE_MAX / 4, 0, 0, &p))
        return "no tensor-core plan (device, d, or fewer than 4k witness groups of 64 references)";
    if ((p.wgmma ? wgmma_smem_bytes(d, 1) : mma_smem_bytes(d)) + mma_sym_smem_extra() > ctx->smem_optin)
        return "the symmetric kernel's shared memory exceeds the device's";
    p.band = sym_band(ctx, p, n, d);
    if (p.band) {
        p.ga = 4 * p.band;
        p.nA = min64(n, 2 * kMmaBN * (p.band - 1)); /* about the witnesses a row gets */
    }
    const double expect = 3.0 * (double)p.kk * (double)n / (double)p.nA + 256.0;
    p.cap = round_up(max64((int64_t)(1.25 * expect) + 512, p.kk + kBlock + 256), 256);
    p.QS = round_up(n, kMmaBN); /* thr and the norms are read a whole tile at a time */
    p.sym = 1;
    const int64_t block = min64(n, kMaxStateQueries);
    auto need = [&](const Plan &c) {
        /* (two output buffers where host_sym may pipeline the blocks' output) */
        const size_t out = (size_t)block * (size_t)k * (sizeof(int64_t) + (job->dist ? sizeof(float) : 0));
        return c.bytes + (size_t)n * (size_t)d * sizeof(float) + (n > block ? 2 : 1) * out;
    };
    if (!plan_set_center(p, 0)) return "no tensor-core bound for this shape";
    plan_layout(p);
    if (need(p) > budget) return kSymNoFit;
    plan_try_center(p, budget, need);
    *out = p;
    *out_block = block;
    *out_need = need(p);
    return NULL;
}

/* *done = 0 (and XKNN_SUCCESS) when the symmetric path does not apply or its allocation
 * fails: the caller runs the plain search, or with *too_big = 1 (only the memory stood in
 * the way) the blocked triangle (host_sym_blocked). staged: a caller's context (pinned
 * staging). XKNN_CUDA_SYM_REQUIRE=1 (diagnostic, for the tests) makes a shape that does
 * not apply an error instead. */
xknn_status host_sym(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget, int *done,
                     int *too_big, Err er, int64_t *mir_ids, float *mir_dist)
{
    const xknn_params *prm = &job->params;
    const int64_t n = job->n, d = job->d, k = job->k;
    const size_t row_bytes = (size_t)d * sizeof(float);
    xknn_status st = XKNN_SUCCESS;
    HostBuffers hb;
    Plan plan;
    Run run;
    MmaParams mp;
    int64_t block = 0;
    size_t need = 0; /* the device bytes of the plan, the rows and the outputs */
    int piece = 0, ok, unsorted;
    unsigned long long stats[kStatCount];
    cudaStream_t sc = ctx->stream;
    const char *why = plan_sym(ctx, job, budget, &plan, &block, &need);
    cudaEvent_t ev[4] = {NULL, NULL, NULL, NULL}; /* -v: phase times */
    cudaEvent_t fin[2] = {NULL, NULL};            /* pipelined output: block b's results enqueued */
    const double h0 = wall_seconds();
    double h_alloc = 0.0, h_up = 0.0;
    cudaError_t e;
    /* block b's results (buffer b & 1) to the host on the copy stream, once fin[b & 1] */
    auto sym_out = [&](int64_t b) -> xknn_status {
        const int64_t q0 = b * block, qs = min64(block, n - q0), o = (b & 1) * block * k;
        const cudaError_t w = cudaStreamWaitEvent(ctx->copy_stream, fin[b & 1], 0);
        if (w != cudaSuccess)
            return failf(er, XKNN_ERROR_DEVICE, "cuda backend: %s: %s (output stream)", cudaGetErrorName(w),
                         cudaGetErrorString(w));
        return results_out(ctx, 1, job->ids + q0 * k, hb.dIds + o, job->dist ? job->dist + q0 * k : NULL,
                           hb.dDist ? hb.dDist + o : NULL, (size_t)(qs * k), prm->num_threads, ctx->copy_stream,
                           &piece, er);
    };

    const char *req = getenv("XKNN_CUDA_SYM_REQUIRE");
    const int require = req && *req && *req != '0';

    *done = 0;
    *too_big = why == kSymNoFit;
    if (*too_big) {
        if (prm->verbose) fprintf(stderr, "xknn: cuda: self-join of %lld points: %s\n", (long long)n, why);
        return XKNN_SUCCESS;
    }
    if (why) {
        if (require) return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "XKNN_CUDA_SYM_REQUIRE: plain search: %s", why);
        if (prm->verbose) fprintf(stderr, "xknn: cuda: self-join: plain search (%s)\n", why);
        return XKNN_SUCCESS;
    }
    hb.pool = ctx->pool;
    hb.s = sc;
    /* two output buffers where the blocks' results go out on the copy stream while the
     * next block is re-ranked (staged, more than one block) */
    /* mir_ids / mir_dist: running lists on the device (a list mirror): each block's results
     * merge into them there (the second half of the output buffers is the merge's
     * scratch), nothing goes to the host */
    const int dev_out = mir_ids != nullptr;
    const int pipe = staged && n > block && !dev_out;
    /* rows the caller keeps on the device (xknn_cuda_keep_rows) are read there */
    const float *dR = staged ? (const float *)kept_rows(ctx, job->ref, n, row_bytes, (size_t)job->ldr * sizeof(float),
                                                        sc, prm->num_threads, &piece, er, &st)
                             : NULL;
    if (st != XKNN_SUCCESS) return st;
    e = dR ? cudaSuccess : hb.alloc((void **)&hb.dR, (size_t)n * row_bytes);
    if (e == cudaSuccess) e = hb.alloc(&hb.dWs, plan.bytes);
    if (e == cudaSuccess)
        e = hb.alloc((void **)&hb.dIds, (pipe || dev_out ? 2 : 1) * (size_t)block * k * sizeof(int64_t));
    if (e == cudaSuccess && (job->dist || dev_out))
        e = hb.alloc((void **)&hb.dDist, (pipe || dev_out ? 2 : 1) * (size_t)block * k * sizeof(float));
    ok = alloc_outcome(hb, e, er, &st);
    if (ok < 0) return st;
    if (ok == 0) {
        *too_big = 1;
        if (prm->verbose) fprintf(stderr, "xknn: cuda: self-join: the symmetric state's allocation failed\n");
        return XKNN_SUCCESS;
    }
    /* The triangle on rows sorted by threshold (mma.cu's sym_epilogue_sorted) where the
     * warp-specialized kernel runs it (it runs the band) and its copy of the operand rows
     * fits the budget beside the state; XKNN_CUDA_SYM_SORT=0 (a diagnostic: the same
     * bytes) keeps the caller's order. A failed allocation keeps it too. */
    const int64_t ldx = plan.kind == kCanonCosine || plan.center ? plan.dh : d;
    /* the sorted pass's pool of candidate pairs: a quarter of the lists' slots (each
     * entry fills one or two; an overflow runs the pass again in the caller's order) */
    int64_t pool_cap = max64(n * (plan.cap / 4), 1 << 20);
    {
        /* XKNN_CUDA_SYM_POOL=N (a diagnostic for the tests: the overflow's path) */
        const char *e_pool = getenv("XKNN_CUDA_SYM_POOL");
        if (e_pool && *e_pool) pool_cap = max64(1, atoll(e_pool));
    }
    {
        const char *e_sort = getenv("XKNN_CUDA_SYM_SORT");
        const size_t sbytes = mma_sym_sort_bytes(n, ldx, pool_cap);
        if (plan.band && ldx % 4 == 0 && n < (1 << 30) && !(e_sort && *e_sort == '0') && need + sbytes <= budget &&
            hb.alloc(&hb.dSort, sbytes) != cudaSuccess) {
            (void)cudaGetLastError();
            hb.dSort = nullptr;
        }
    }
    *done = 1;
    h_alloc = wall_seconds();
    if (prm->verbose) {
        print_plan(ctx, plan, "symmetric self-join, resident references", budget, 0);
        fprintf(stderr, "xknn: cuda: self-join: symmetric (triangle of tiles, pass B feeds rows and columns%s)\n",
                hb.dSort ? "; rows sorted by threshold" : "");
    }
    if (dR) {
        /* (kept rows: on the device already) */
    } else if (staged) {
        XKNN__TRY(stage_rows(ctx, hb.dR, job->ref, n, d, job->ldr, prm->num_threads, &piece, er));
        XKNN__CUDA_CHECK(cudaStreamWaitEvent(sc, ctx->stage_done[(piece - 1) & 1], 0));
    } else {
        XKNN__CUDA_CHECK(cudaMemcpy2DAsync(hb.dR, row_bytes, job->ref, (size_t)job->ldr * sizeof(float), row_bytes,
                                           (size_t)n, cudaMemcpyHostToDevice, sc));
    }
    if (!dR) dR = hb.dR;
    if (prm->verbose) { /* upload time on its own (verbose runs only) */
        XKNN__CUDA_CHECK(cudaStreamSynchronize(sc));
        h_up = wall_seconds();
    }
    run = run_bind(ctx, &plan, hb.dWs, sc);
    XKNN__TRY(run_start(run, er));
    XKNN__CUDA_CHECK(launch_init_state(run.tau, run.cnt, (int)n, 1, sc));
    {
        /* the tensor cores' operand: the rows, or their unit-length (cosine, mma_bounds)
         * or centred (l2, plan_bounds) copies; rescue and resolve read the rows themselves */
        const float *X = dR;
        float *xh = (float *)((char *)run.stats + plan.off_rhat);
        if (plan.kind == kCanonCosine) {
            XKNN__CUDA_CHECK(launch_unit_rows(dR, d, n, d, xh, plan.dh, sc));
            X = xh;
        } else if (plan.center) {
            float *mu = (float *)((char *)run.stats + plan.off_mu);
            XKNN__CUDA_CHECK(launch_mean_rows(dR, d, n, d, mu, sc));
            XKNN__CUDA_CHECK(launch_center_rows(dR, d, n, d, mu, xh, plan.dh, run.rn, sc));
            X = xh;
        }
        if (!plan.center) XKNN__CUDA_CHECK(launch_sqnorms(X, ldx, n, d, run.rn, sc));
        run.qn = run.rn; /* the queries are the references */
        mp = mma_params(run, X, ldx, n, prm->exclude_self, 0, X, ldx);
    }
    /* thresholds past n are read with their tile (and masked): defined values */
    XKNN__CUDA_CHECK(cudaMemsetAsync(mp.thr, 0, (size_t)plan.QS * sizeof(float), sc));
    if (prm->verbose)
        for (int i = 0; i < 4; ++i) XKNN__CUDA_CHECK(cudaEventCreate(&ev[i]));
    if (ev[0]) XKNN__CUDA_CHECK(cudaEventRecord(ev[0], sc));
    if (plan.band) {
        mp.n = n;
        mp.band = (int)plan.band;
        XKNN__CUDA_CHECK(launch_mma_band(mp, ctx->sms, (int)ctx->smem_optin, sc));
    } else {
        mp.n = plan.nA;
        XKNN__CUDA_CHECK(launch_mma_pass(mp, 0, ctx->sms, plan.wgmma ? (int)ctx->smem_optin : 0, sc));
    }
    XKNN__CUDA_CHECK(launch_mma_select(mp, (int)plan.kk, ctx->sms, sc));
    if (ev[1]) XKNN__CUDA_CHECK(cudaEventRecord(ev[1], sc));
    mp.n = n;
    unsorted = !hb.dSort;
    if (hb.dSort) {
        MmaParams ms;
        /* (cudaErrorNotSupported: rows it cannot gather; the caller's order then) */
        e = launch_mma_sym_sort(mp, ldx, pool_cap, hb.dSort, ctx->sms, sc, &ms);
        if (e == cudaErrorNotSupported) {
            (void)cudaGetLastError();
            unsorted = 1;
        } else {
            XKNN__CUDA_CHECK(e);
            XKNN__CUDA_CHECK(launch_mma_pass(ms, 2, ctx->sms, plan.wgmma ? (int)ctx->smem_optin : 0, sc));
            XKNN__CUDA_CHECK(launch_mma_sym_scatter(ms, ctx->sms, sc, &unsorted));
        }
        hb.dfree(hb.dSort); /* (stream-ordered: after the scatter) */
        hb.dSort = nullptr;
        if (unsorted && prm->verbose)
            fprintf(stderr, "xknn: cuda: self-join: %s: the triangle in the caller's order\n",
                    e == cudaErrorNotSupported ? "rows the sort cannot gather"
                                               : "more candidate pairs than the pool holds");
    }
    if (unsorted) XKNN__CUDA_CHECK(launch_mma_pass(mp, 2, ctx->sms, plan.wgmma ? (int)ctx->smem_optin : 0, sc));
    if (ev[2]) XKNN__CUDA_CHECK(cudaEventRecord(ev[2], sc));
    mp.Q = mp.R = dR;
    mp.ldq = mp.ldr = d;
    XKNN__CUDA_CHECK(launch_mma_rescue(mp, (int)plan.kk, plan.kind, ctx->sms, sc));
    if (pipe)
        for (int i = 0; i < 2; ++i) XKNN__CUDA_CHECK(cudaEventCreateWithFlags(&fin[i], cudaEventDisableTiming));
    for (int64_t q0 = 0, b = 0; q0 < n; q0 += block, ++b) {
        const int64_t qs = min64(block, n - q0);
        const int64_t o = pipe ? (b & 1) * block * k : 0;
        Run rb = run; /* the run's state from query q0 on */
        rb.tau = run.tau + q0;
        rb.cnt = run.cnt + q0;
        rb.cand = run.cand + q0 * plan.cap;
        XKNN__CUDA_CHECK(launch_resolve(resolve_params(rb, dR + q0 * d, d, dR, d, 0), (int)qs, sc));
        XKNN__TRY(block_finish(rb, qs, hb.dIds + o, hb.dDist ? hb.dDist + o : NULL, prm->ref_id_offset, er));
        if (dev_out) {
            XKNN__CUDA_CHECK(launch_lists_merge(mir_ids + q0 * k, mir_dist + q0 * k, hb.dIds, hb.dDist, qs, k,
                                                prm->metric == XKNN_METRIC_IP, hb.dIds + block * k,
                                                hb.dDist + block * k, ctx->sms, sc));
            continue;
        }
        if (!pipe) {
            XKNN__TRY(results_out(ctx, staged, job->ids + q0 * k, hb.dIds, job->dist ? job->dist + q0 * k : NULL,
                                  hb.dDist, (size_t)(qs * k), prm->num_threads, sc, &piece, er));
            continue;
        }
        /* block b's results are enqueued; block b - 1's go out on the copy stream while
         * they compute (its buffer is written again by block b + 1, enqueued only after
         * results_out has returned) */
        XKNN__CUDA_CHECK(cudaEventRecord(fin[b & 1], sc));
        if (b > 0) XKNN__TRY(sym_out(b - 1));
    }
    if (pipe) XKNN__TRY(sym_out((n - 1) / block));
    if (ev[3]) XKNN__CUDA_CHECK(cudaEventRecord(ev[3], sc));
    XKNN__CUDA_CHECK(cudaMemcpyAsync(stats, run.stats, sizeof stats, cudaMemcpyDeviceToHost, sc));
    XKNN__CUDA_CHECK(cudaStreamSynchronize(sc));
    if (prm->verbose) {
        float ms[3] = {0.0f, 0.0f, 0.0f};
        for (int i = 0; i < 3; ++i) XKNN__CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
        fprintf(stderr,
                "xknn: cuda: %llu candidates appended, %llu queries re-run exactly; ms: allocation %.1f, upload "
                "%.1f, then on the device: witnesses %.1f, triangle %.1f, re-run + re-rank + output %.1f; in all "
                "%.1f\n",
                stats[kStatAppended], stats[kStatReruns], (h_alloc - h0) * 1e3, (h_up - h_alloc) * 1e3, ms[0], ms[1],
                ms[2], (wall_seconds() - h0) * 1e3);
    }
    if (stats[kStatUnresolved])
        st = failf(er, XKNN_ERROR_INTERNAL, "cuda backend: %llu final candidates had no canonical distance",
                   stats[kStatUnresolved]);
cleanup:
    (void)cudaStreamSynchronize(sc);
    if (ctx->copy_stream) (void)cudaStreamSynchronize(ctx->copy_stream);
    for (int i = 0; i < 4; ++i)
        if (ev[i]) cudaEventDestroy(ev[i]);
    for (int i = 0; i < 2; ++i)
        if (fin[i]) cudaEventDestroy(fin[i]);
    hb.release();
    (void)cudaStreamSynchronize(sc);
    return st;
}

/* ---- xknn_search_pair on the device (mma.cu's TWO SETS), the blocked triangle ------- */

/* Row a (ai, ad: k entries sorted by the result order, missing ids -1 last) merged with
 * row b the same way: the k first of both by (distance, id), -distance for ip, missing
 * last, back into a. mid / md: k entries of scratch. A row that ends in padding keeps
 * the smaller of the bounds its inputs' last entries carried (xknn_search_pair's bounded
 * padding; +inf where none), so that the later parts of a halved pair still find it. */
void merge_row(int64_t *ai, float *ad, const int64_t *bi, const float *bd, int64_t k, int ip, int64_t *mid, float *md)
{
    const float bound = ip ? 0.0f : fminf(ai[k - 1] < 0 ? ad[k - 1] : INFINITY, bi[k - 1] < 0 ? bd[k - 1] : INFINITY);
    int64_t a = 0, b = 0;
    for (int64_t j = 0; j < k; ++j) {
        /* a + b == j < k: neither index runs past its row */
        const int take_a = bi[b] < 0 || (ai[a] >= 0 && (ip ? xknn__result_less(-ad[a], ai[a], -bd[b], bi[b])
                                                          : xknn__result_less(ad[a], ai[a], bd[b], bi[b])));
        if (take_a) {
            mid[j] = ai[a];
            md[j] = ad[a];
            ++a;
        } else {
            mid[j] = bi[b];
            md[j] = bd[b];
            ++b;
        }
    }
    if (!ip && mid[k - 1] < 0 && bound < md[k - 1]) md[k - 1] = bound;
    memcpy(ai, mid, (size_t)k * sizeof(int64_t));
    memcpy(ad, md, (size_t)k * sizeof(float));
}

/* Rows [0, rows) of the running lists ids / dist (ld k) merged with the new lists nids /
 * ndist, rows spread over OpenMP threads (threads: 0 for the default). */
xknn_status merge_lists(int64_t *ids, float *dist, const int64_t *nids, const float *ndist, int64_t rows, int64_t k,
                        int ip, int threads, Err er)
{
#ifdef _OPENMP
    if (threads <= 0) threads = omp_get_max_threads();
#endif
    if (threads < 1) threads = 1;
    int64_t *mid = (int64_t *)malloc((size_t)threads * (size_t)k * sizeof(int64_t));
    float *md = (float *)malloc((size_t)threads * (size_t)k * sizeof(float));
    if (!mid || !md) {
        free(mid);
        free(md);
        return failf(er, XKNN_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory for a merge of lists (k=%lld)",
                     (long long)k);
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) if (rows * k > (1 << 16))
#endif
    {
#ifdef _OPENMP
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        const int t = 0, nt = 1;
#endif
        for (int64_t r = t; r < rows; r += nt)
            merge_row(ids + r * k, dist + r * k, nids + r * k, ndist + r * k, k, ip, mid + (int64_t)t * k,
                      md + (int64_t)t * k);
    }
    free(md);
    free(mid);
    return XKNN_SUCCESS;
}

static const char kPairNoFit[] = "the state of both sets does not fit the device memory budget";

/* B's first row in a pair's state (norms, thresholds, counts, buffers): A's rows rounded
 * up to 32, so that B's norms and thresholds start 16-byte aligned (the mma.sync kernel
 * stages them with 16-byte copies). */
int64_t pair_b0(int64_t na) { return round_up(na, 32); }

/* The plan of a pair of disjoint sets A (na rows, the queries of the kernels) and B (nb
 * rows): the tensor-core plans of each side against the other give the witness prefixes
 * *wa (of B, for A's rows) and *wb (of A, for B's rows) and the epilogue constants; the
 * state holds both sides (A's first, B's from na on), cap covers the larger side's
 * expected count as plan_sym's does. NULL, or why the pair cannot run on the device
 * (kPairNoFit: only the memory). */
const char *plan_pair(const xknn_cuda_context *ctx, const xknn__job *job, int64_t na, int64_t nb, size_t budget,
                      Plan *out, int64_t *wa, int64_t *wb, int64_t *out_block)
{
    const xknn_params *prm = &job->params;
    const int64_t d = job->d, k = job->k;
    Plan pa, pb;
    if (prm->cuda_path != XKNN_CUDA_PATH_AUTO && prm->cuda_path != XKNN_CUDA_PATH_MMA)
        return "the pair kernel is the tensor-core path's (cuda_path auto or mma)";
    if (!mma_supported(prm, d)) return "the pair kernel takes f32 l2/euclidean/ip/cosine with d <= 128";
    if (!plan_mma(ctx, prm, nb, na, d, k, SIZE_MAX / 4, 0, 0, &pa) ||
        !plan_mma(ctx, prm, na, nb, d, k, SIZE_MAX / 4, 0, 0, &pb))
        return "no tensor-core plan (device, d, or fewer than 4k witness groups of 64 rows on a side)";
    if ((pa.wgmma ? wgmma_smem_bytes(d, 1) : mma_smem_bytes(d)) + mma_sym_smem_extra() > ctx->smem_optin)
        return "the symmetric kernel's shared memory exceeds the device's";
    if (pa.kk != pb.kk || pa.wgmma != pb.wgmma) return "the two sides' plans differ";
    Plan p = pa;
    *wa = pa.nA;
    *wb = pb.nA;
    const double ea = 3.0 * (double)p.kk * (double)nb / (double)pa.nA + 256.0;
    const double eb = 3.0 * (double)p.kk * (double)na / (double)pb.nA + 256.0;
    p.cap = round_up(max64((int64_t)(1.25 * (ea > eb ? ea : eb)) + 512, p.kk + kBlock + 256), 256);
    p.QS = pair_b0(na) + round_up(nb, kMmaBN) + kMmaBN; /* B's thresholds and norms are read a whole tile at a time */
    p.ga = max64(pa.ga, pb.ga);
    p.RN = round_up(max64(na, nb), kMmaBN);
    p.sym = 1;
    const int64_t block = min64(max64(na, nb), kMaxStateQueries);
    /* the rows, and the tensor cores' copies of both sets (cosine's unit rows, l2's
     * centred rows) */
    auto need = [&](const Plan &c) {
        const size_t per_row =
            (size_t)d * sizeof(float) + (c.kind == kCanonCosine || c.center ? (size_t)c.dh * sizeof(float) : 0);
        return c.bytes + (size_t)(na + nb) * per_row + 2 * (size_t)block * (size_t)k * (sizeof(int64_t) + sizeof(float));
    };
    if (!plan_set_center(p, 0)) return "no tensor-core bound for this shape";
    plan_layout(p);
    if (need(p) > budget) return kPairNoFit;
    plan_try_center(p, budget, need);
    *out = p;
    *out_block = block;
    return NULL;
}

/* Host lists of rows x k (ids, dist) for a pair's results; OUT_OF_MEMORY with a message. */
xknn_status host_lists(int64_t rows, int64_t k, int64_t **ids, float **dist, Err er)
{
    *ids = (int64_t *)malloc((size_t)(rows * k) * sizeof(int64_t));
    *dist = (float *)malloc((size_t)(rows * k) * sizeof(float));
    if (*ids && *dist) return XKNN_SUCCESS;
    return failf(er, XKNN_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory for %lld x %lld pair results",
                 (long long)rows, (long long)k);
}

/* One side of a pair for the output: rows [0, rows) of the state from `base` on, the
 * queries Q, the other set R as references (ids from id0), the running lists. */
struct PairSide {
    int64_t base, rows, id0;
    const float *Q, *R;
    const xknn__sym_side *lists;
};

/* Enqueues the re-rank and final selection of rows [q0, q0 + qs) of side ps into
 * (dIds, dDist) on the run's stream. */
xknn_status pair_block_enqueue(const Run &run, const PairSide &ps, int64_t q0, int64_t qs, int64_t *dIds,
                               float *dDist, Err er)
{
    const Plan &p = *run.p;
    xknn_status st = XKNN_SUCCESS;
    Run rb = run; /* the state from row base + q0 on */
    rb.tau = run.tau + ps.base + q0;
    rb.cnt = run.cnt + ps.base + q0;
    rb.cand = run.cand + (ps.base + q0) * p.cap;
    XKNN__CUDA_CHECK(launch_resolve(resolve_params(rb, ps.Q + q0 * p.d, p.d, ps.R, p.d, 0), (int)qs, run.st));
    XKNN__TRY(block_finish(rb, qs, dIds, dDist, ps.id0, er));
cleanup:
    return st;
}

/* Both sides' results, block by block (block rows of a side at a time), each merged
 * into its side's running lists on the host. Two device and two host buffers
 * (dIds[b], dDist[b]: block x k; tids[b], tdist[b] likewise): while the host merges
 * block i the device re-ranks block i + 1. */
xknn_status pair_out(xknn_cuda_context *ctx, const Run &run, const PairSide *sides, int nsides, int64_t block,
                     int64_t *const dIds[2], float *const dDist[2], int64_t *const tids[2], float *const tdist[2],
                     int staged, int threads, int *piece, Err er)
{
    const Plan &p = *run.p;
    xknn_status st = XKNN_SUCCESS;
    int si = 0, b = 0;
    int64_t q0 = 0;
    while (si < nsides && sides[si].rows == 0) ++si;
    if (si < nsides) XKNN__TRY(pair_block_enqueue(run, sides[si], 0, min64(block, sides[si].rows), dIds[0], dDist[0], er));
    while (si < nsides) {
        const PairSide &ps = sides[si];
        const int64_t qs = min64(block, ps.rows - q0);
        /* the next block: later in this side, or the next side's first */
        int nsi = si;
        int64_t nq0 = q0 + qs;
        if (nq0 >= ps.rows) {
            nq0 = 0;
            for (++nsi; nsi < nsides && sides[nsi].rows == 0;) ++nsi;
        }
        XKNN__TRY(results_out(ctx, staged, tids[b], dIds[b], tdist[b], dDist[b], (size_t)(qs * p.k), threads, run.st,
                              piece, er));
        if (nsi < nsides)
            XKNN__TRY(pair_block_enqueue(run, sides[nsi], nq0, min64(block, sides[nsi].rows - nq0), dIds[b ^ 1],
                                         dDist[b ^ 1], er));
        XKNN__TRY(merge_lists(ps.lists->ids + q0 * p.k, ps.lists->dist + q0 * p.k, tids[b], tdist[b], qs, p.k,
                              p.kind == kCanonIp, threads, er));
        si = nsi;
        q0 = nq0;
        b ^= 1;
    }
cleanup:
    return st;
}

/* 1 where a side's thresholds may come from its lists: l2, unless
 * XKNN_CUDA_PAIR_WITNESSES=1 (a diagnostic: always witnesses) */
static int lists_thr_allowed(const xknn_params *prm)
{
    const char *w = getenv("XKNN_CUDA_PAIR_WITNESSES");
    return prm->metric == XKNN_METRIC_L2 && !(w && *w == '1');
}

/* The k-th canonical values of a side's running lists into kth[0, rows) when every row
 * already holds k references, or ends in padding that carries a caller's bound (a finite
 * distance with id -1: xknn_search_pair): then, for l2, they bound what the pair can add
 * (mma_list_thr_kernel), and the side needs no witnesses. 0 where any row has neither,
 * the metric is not l2, or kth is NULL. */
int lists_kth(const xknn_params *prm, const xknn__sym_side *s, int64_t k, float *kth)
{
    if (!kth || !lists_thr_allowed(prm) || !s->ids || !s->dist) return 0;
    for (int64_t i = 0; i < s->rows; ++i) {
        const float v = s->dist[i * k + k - 1];
        if (!(v <= FLT_MAX)) return 0;
        kth[i] = v;
    }
    return 1;
}

/* The pair (A, B) of two disjoint sets on the device: each distance of A x B once, for
 * A's lists and B's (mma.cu's TWO SETS), merged into the running lists on the host.
 * *done = 0 (and XKNN_SUCCESS) when the shape does not allow it (XKNN_CUDA_SYM_REQUIRE=1:
 * an error instead) or, with *too_big = 1, when the memory does not. */
xknn_status host_pair(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget, const xknn__sym_side *a,
                      const xknn__sym_side *b, int *done, int *too_big, Err er)
{
    const xknn_params *prm = &job->params;
    const int64_t na = a->rows, nb = b->rows, d = job->d, k = job->k, b0 = pair_b0(na);
    const size_t row_bytes = (size_t)d * sizeof(float);
    xknn_status st = XKNN_SUCCESS;
    HostBuffers hb;
    Plan plan;
    Run run;
    int64_t wa = 0, wb = 0, block = 0;
    int piece = 0, ok = 0;
    unsigned long long stats[kStatCount];
    int64_t *tids = NULL;
    float *tdist = NULL;
    float *kth = NULL; /* the sides' k-th list values (A's, then B's), where full */
    int full_a = 0, full_b = 0, pinned_out = 0;
    const float *dA = NULL, *dB = NULL; /* A's and B's rows on the device: kept copies, or hb.dR, hb.dQ */
    /* the sides' lists on the device where a list mirror holds them (mirror_begin): the
     * results merge there, and full lists give their thresholds there */
    int64_t *mi[2] = {NULL, NULL};
    float *md[2] = {NULL, NULL};
    const int mir_a = mirror_of(ctx, a->ids, na, k, &mi[0], &md[0]);
    const int mir_b = mirror_of(ctx, b->ids, nb, k, &mi[1], &md[1]);
    const int ip = prm->metric == XKNN_METRIC_IP;
    cudaStream_t sc = ctx->stream;
    const char *why = plan_pair(ctx, job, na, nb, budget, &plan, &wa, &wb, &block);
    cudaEvent_t ev[4] = {NULL, NULL, NULL, NULL}; /* -v: phase times */
    const double h0 = wall_seconds();
    double h_up = 0.0, h_dev = 0.0, h_a = 0.0;
    const char *req = getenv("XKNN_CUDA_SYM_REQUIRE");
    const int require = req && *req && *req != '0';

    *done = 0;
    *too_big = why == kPairNoFit;
    if (why) {
        if (prm->verbose) fprintf(stderr, "xknn: cuda: pair %lld x %lld: %s\n", (long long)na, (long long)nb, why);
        if (require && !*too_big)
            return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "XKNN_CUDA_SYM_REQUIRE: pair %lld x %lld: %s", (long long)na,
                         (long long)nb, why);
        return XKNN_SUCCESS;
    }
    /* two blocks: pair_out's double buffer; with a caller's context its pinned buffer,
     * which the device fills by DMA and which outlives the call (no staging copy, no
     * fresh pages a pair) */
    if (!mir_a || !mir_b) {
        const size_t tb = (size_t)(2 * block * k) * (sizeof(int64_t) + sizeof(float));
        char *pin = staged ? (char *)pair_out_buffer(ctx, tb) : NULL;
        if (pin) {
            tids = (int64_t *)pin;
            tdist = (float *)(pin + (size_t)(2 * block * k) * sizeof(int64_t));
            pinned_out = 1;
        } else {
            XKNN__TRY(host_lists(2 * block, k, &tids, &tdist, er));
        }
    }
    kth = (float *)malloc((size_t)(na + nb) * sizeof(float) + 1); /* (none: both sides run pass A) */
    /* (a mirrored side's lists are read on the device, below) */
    full_a = mir_a ? 0 : lists_kth(prm, a, k, kth);
    full_b = mir_b ? 0 : lists_kth(prm, b, k, kth ? kth + na : NULL);
    hb.pool = ctx->pool;
    hb.s = sc;
    if (staged) {
        /* rows the caller keeps on the device (xknn_cuda_keep_rows) are read there */
        dA = (const float *)kept_rows(ctx, a->data, na, row_bytes, (size_t)a->ld * sizeof(float), sc,
                                      prm->num_threads, &piece, er, &st);
        if (st == XKNN_SUCCESS)
            dB = (const float *)kept_rows(ctx, b->data, nb, row_bytes, (size_t)b->ld * sizeof(float), sc,
                                          prm->num_threads, &piece, er, &st);
        if (st != XKNN_SUCCESS) goto cleanup;
    }
    {
        cudaError_t e = dA ? cudaSuccess : hb.alloc((void **)&hb.dR, (size_t)na * row_bytes);
        if (e == cudaSuccess && !dB) e = hb.alloc((void **)&hb.dQ, (size_t)nb * row_bytes);
        if (e == cudaSuccess) e = hb.alloc(&hb.dWs, plan.bytes);
        if (e == cudaSuccess) e = hb.alloc((void **)&hb.dIds, (size_t)(2 * block) * k * sizeof(int64_t));
        if (e == cudaSuccess) e = hb.alloc((void **)&hb.dDist, (size_t)(2 * block) * k * sizeof(float));
        if (e == cudaSuccess && (plan.kind == kCanonCosine || plan.center))
            e = hb.alloc((void **)&hb.dChunk[0], (size_t)(na + nb) * (size_t)plan.dh * sizeof(float));
        if (e == cudaSuccess && (mir_a || mir_b)) e = hb.alloc((void **)&hb.dFlag, 2 * sizeof(int));
        ok = alloc_outcome(hb, e, er, &st);
    }
    if (ok < 0) goto cleanup;
    if (ok == 0) {
        *too_big = 1;
        if (prm->verbose) fprintf(stderr, "xknn: cuda: pair %lld x %lld: the allocation failed\n", (long long)na, (long long)nb);
        goto cleanup;
    }
    *done = 1;
    if (prm->verbose) print_plan(ctx, plan, "pair of sets, resident", budget, 0);
    if (staged && (!dA || !dB)) {
        if (!dA) XKNN__TRY(stage_rows(ctx, hb.dR, (const float *)a->data, na, d, a->ld, prm->num_threads, &piece, er));
        if (!dB) XKNN__TRY(stage_rows(ctx, hb.dQ, (const float *)b->data, nb, d, b->ld, prm->num_threads, &piece, er));
        XKNN__CUDA_CHECK(cudaStreamWaitEvent(sc, ctx->stage_done[(piece - 1) & 1], 0));
    } else if (!staged) {
        XKNN__CUDA_CHECK(cudaMemcpy2DAsync(hb.dR, row_bytes, a->data, (size_t)a->ld * sizeof(float), row_bytes,
                                           (size_t)na, cudaMemcpyHostToDevice, sc));
        XKNN__CUDA_CHECK(cudaMemcpy2DAsync(hb.dQ, row_bytes, b->data, (size_t)b->ld * sizeof(float), row_bytes,
                                           (size_t)nb, cudaMemcpyHostToDevice, sc));
    }
    if (!dA) dA = hb.dR;
    if (!dB) dB = hb.dQ;
    if (prm->verbose) { /* upload time on its own (verbose runs only) */
        XKNN__CUDA_CHECK(cudaStreamSynchronize(sc));
        h_up = wall_seconds();
        for (int i = 0; i < 4; ++i) XKNN__CUDA_CHECK(cudaEventCreate(&ev[i]));
    }
    run = run_bind(ctx, &plan, hb.dWs, sc);
    XKNN__TRY(run_start(run, er));
    XKNN__CUDA_CHECK(launch_init_state(run.tau, run.cnt, (int)(b0 + nb), 1, sc));
    /* norms and thresholds past each side's rows are read with their tile (and masked):
     * defined values */
    XKNN__CUDA_CHECK(cudaMemsetAsync(run.qn, 0, (size_t)plan.QS * sizeof(float), sc));
    {
        /* the tensor cores' operands (cosine: unit rows, A's then B's) and their norms:
         * A's at qn[0, na), B's at qn[b0, b0 + nb) */
        const float *XA = dA, *XB = dB;
        int64_t ldx = d;
        const int sms = ctx->sms, wg = plan.wgmma ? (int)ctx->smem_optin : 0;
        if (plan.kind == kCanonCosine) {
            float *xh = hb.dChunk[0];
            XKNN__CUDA_CHECK(launch_unit_rows(dA, d, na, d, xh, plan.dh, sc));
            XKNN__CUDA_CHECK(launch_unit_rows(dB, d, nb, d, xh + na * plan.dh, plan.dh, sc));
            XA = xh;
            XB = xh + na * plan.dh;
            ldx = plan.dh;
        } else if (plan.center) { /* both sets on one mu (any mu serves, the same for both) */
            float *xh = hb.dChunk[0], *mu = (float *)((char *)run.stats + plan.off_mu);
            XKNN__CUDA_CHECK(launch_mean_rows(dA, d, na, d, mu, sc));
            XKNN__CUDA_CHECK(launch_center_rows(dA, d, na, d, mu, xh, plan.dh, run.qn, sc));
            XKNN__CUDA_CHECK(launch_center_rows(dB, d, nb, d, mu, xh + na * plan.dh, plan.dh, run.qn + b0, sc));
            XA = xh;
            XB = xh + na * plan.dh;
            ldx = plan.dh;
        }
        if (!plan.center) {
            XKNN__CUDA_CHECK(launch_sqnorms(XA, ldx, na, d, run.qn, sc));
            XKNN__CUDA_CHECK(launch_sqnorms(XB, ldx, nb, d, run.qn + b0, sc));
        }
        MmaParams ma = mma_params(run, XA, ldx, na, 0, 0, XB, ldx);
        MmaParams mb = mma_params(run, XB, ldx, nb, 0, 0, XA, ldx);
        XKNN__CUDA_CHECK(cudaMemsetAsync(ma.thr, 0, (size_t)plan.QS * sizeof(float), sc));
        if (ev[0]) XKNN__CUDA_CHECK(cudaEventRecord(ev[0], sc));
        /* pass A and tau, per side: A's rows against B's first wa rows, B's against A's
         * first wb (a side's witnesses belong to the set it is searched in) */
        ma.rn = run.qn + b0;
        ma.n = wa;
        ma.ga = ceil_div(wa, kMmaGroup);
        mb.qn = run.qn + b0;
        mb.rn = run.qn;
        mb.n = wb;
        mb.ga = ceil_div(wb, kMmaGroup);
        mb.gmin = ma.gmin + b0 * ma.ga;
        mb.thr = ma.thr + b0;
        mb.cnt = run.cnt + b0;
        mb.cand = run.cand + b0 * plan.cap;
        /* a side's thresholds: pass A and select, or, where its running lists are full,
         * their k-th values (side_kth), through its own rows of gmin, which its pass A
         * would have used */
        if (hb.dFlag) {
            /* a mirrored side's k-th list values into its rows of gmin on the device; its
             * lists are full (or bounded) where every one is finite (lists_kth's rule) */
            int bad[2] = {1, 1};
            if (lists_thr_allowed(prm)) {
                XKNN__CUDA_CHECK(cudaMemsetAsync(hb.dFlag, 0, 2 * sizeof(int), sc));
                if (mir_a) XKNN__CUDA_CHECK(launch_lists_kth(md[0], na, k, ma.gmin, hb.dFlag, sms, sc));
                if (mir_b) XKNN__CUDA_CHECK(launch_lists_kth(md[1], nb, k, mb.gmin, hb.dFlag + 1, sms, sc));
                XKNN__CUDA_CHECK(cudaMemcpyAsync(bad, hb.dFlag, sizeof bad, cudaMemcpyDeviceToHost, sc));
                XKNN__CUDA_CHECK(cudaStreamSynchronize(sc));
            }
            if (mir_a) full_a = !bad[0];
            if (mir_b) full_b = !bad[1];
        }
        if (prm->verbose) {
            fprintf(stderr,
                    "xknn: cuda: pair %lld x %lld: each tile feeds both sides (thresholds: A's from %s, B's from %s%s)\n",
                    (long long)na, (long long)nb, full_a ? "its running lists" : "witnesses",
                    full_b ? "its running lists" : "witnesses",
                    mir_a && mir_b ? "; the lists on the device" : mir_a || mir_b ? "; one side's lists on the device" : "");
            if (!full_a || !full_b)
                fprintf(stderr, "xknn: cuda: pair %lld x %lld: witnesses: %lld of B, %lld of A\n", (long long)na,
                        (long long)nb, full_a ? 0LL : (long long)wa, full_b ? 0LL : (long long)wb);
        }
        /* a side's thresholds: pass A and select, or from its full lists' k-th values (on
         * the host: copied into gmin; mirrored: in gmin already) */
        auto side_thr = [&](const MmaParams &m, int full, int mirrored, const float *side_kth, int64_t rows) {
            cudaError_t e;
            if (!full) {
                e = launch_mma_pass(m, 0, sms, wg, sc);
                return e == cudaSuccess ? launch_mma_select(m, (int)plan.kk, sms, sc) : e;
            }
            e = mirrored ? cudaSuccess
                         : cudaMemcpyAsync(m.gmin, side_kth, (size_t)rows * sizeof(float), cudaMemcpyHostToDevice, sc);
            return e == cudaSuccess ? launch_mma_list_thr(m, m.gmin, sms, sc) : e;
        };
        XKNN__CUDA_CHECK(side_thr(ma, full_a, mir_a, kth, na));
        XKNN__CUDA_CHECK(side_thr(mb, full_b, mir_b, kth ? kth + na : NULL, nb));
        if (ev[1]) XKNN__CUDA_CHECK(cudaEventRecord(ev[1], sc));
        /* pass B: A's row tiles against every tile of B, candidates for both sides */
        ma.n = nb;
        ma.rect = 1;
        ma.cthr = mb.thr;
        ma.ccnt = mb.cnt;
        ma.ccand = mb.cand;
        XKNN__CUDA_CHECK(launch_mma_pass(ma, 2, sms, wg, sc));
        if (ev[2]) XKNN__CUDA_CHECK(cudaEventRecord(ev[2], sc));
        /* overflowed buffers re-run exactly, per side, on the rows themselves (ma.n is
         * nb already) */
        ma.Q = mb.R = dA;
        ma.R = mb.Q = dB;
        ma.ldq = ma.ldr = mb.ldq = mb.ldr = d;
        mb.n = na;
        XKNN__CUDA_CHECK(launch_mma_rescue(ma, (int)plan.kk, plan.kind, sms, sc));
        XKNN__CUDA_CHECK(launch_mma_rescue(mb, (int)plan.kk, plan.kind, sms, sc));
        if (ev[3]) {
            XKNN__CUDA_CHECK(cudaEventRecord(ev[3], sc));
            XKNN__CUDA_CHECK(cudaEventSynchronize(ev[3]));
            h_dev = wall_seconds();
        }
    }
    {
        const PairSide sides[2] = {{0, na, b->id0, dA, dB, a}, {b0, nb, a->id0, dB, dA, b}};
        int64_t *const di[2] = {hb.dIds, hb.dIds + block * k};
        float *const dd[2] = {hb.dDist, hb.dDist + block * k};
        if (!mir_a || !mir_b) {
            /* the sides whose lists are on the host: out and merged there */
            const PairSide host_sides[2] = {mir_a ? sides[1] : sides[0], sides[1]};
            int64_t *const ti[2] = {tids, tids + block * k};
            float *const td[2] = {tdist, tdist + block * k};
            XKNN__TRY(pair_out(ctx, run, host_sides, !mir_a && !mir_b ? 2 : 1, block, di, dd, ti, td,
                               staged && !pinned_out, prm->num_threads, &piece, er));
        }
        for (int si = 0; si < 2; ++si) {
            /* a mirrored side: block by block, re-ranked into di[0] and merged on the
             * device (di[1]: the merge's scratch) */
            if (!mi[si]) continue;
            for (int64_t q0 = 0; q0 < sides[si].rows; q0 += block) {
                const int64_t qs = min64(block, sides[si].rows - q0);
                XKNN__TRY(pair_block_enqueue(run, sides[si], q0, qs, di[0], dd[0], er));
                XKNN__CUDA_CHECK(launch_lists_merge(mi[si] + q0 * k, md[si] + q0 * k, di[0], dd[0], qs, k, ip, di[1],
                                                    dd[1], ctx->sms, sc));
            }
        }
    }
    h_a = wall_seconds();
    XKNN__CUDA_CHECK(cudaMemcpyAsync(stats, run.stats, sizeof stats, cudaMemcpyDeviceToHost, sc));
    XKNN__CUDA_CHECK(cudaStreamSynchronize(sc));
    if (prm->verbose) {
        float ms[3] = {0.0f, 0.0f, 0.0f};
        for (int i = 0; i < 3; ++i) XKNN__CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
        fprintf(stderr,
                "xknn: cuda: pair %lld x %lld: %llu candidates appended, %llu rows re-run exactly; ms: allocation + "
                "upload %.1f, witnesses %.1f, rectangle %.1f, re-runs %.1f, then re-rank + output + host merge "
                "%.1f; in all %.1f\n",
                (long long)na, (long long)nb, stats[kStatAppended], stats[kStatReruns], (h_up - h0) * 1e3, ms[0], ms[1],
                ms[2], (h_a - h_dev) * 1e3, (wall_seconds() - h0) * 1e3);
    }
    if (stats[kStatUnresolved])
        st = failf(er, XKNN_ERROR_INTERNAL, "cuda backend: %llu final candidates had no canonical distance",
                   stats[kStatUnresolved]);
cleanup:
    (void)cudaStreamSynchronize(sc);
    if (ctx->copy_stream) (void)cudaStreamSynchronize(ctx->copy_stream);
    for (int i = 0; i < 4; ++i)
        if (ev[i]) cudaEventDestroy(ev[i]);
    hb.release();
    (void)cudaStreamSynchronize(sc);
    free(kth);
    if (!pinned_out) {
        free(tdist);
        free(tids);
    }
    return st;
}

/* A set against itself (b NULL in xknn_search_pair): host_sym's self-join of its rows
 * (each row's own id excluded, ids from a->id0) merged into the running lists. *done = 0
 * where host_sym does not apply, with *too_big = 1 where only the memory stood in the way. */
xknn_status host_pair_self(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget,
                           const xknn__sym_side *a, int *done, int *too_big, Err er)
{
    const int64_t n = a->rows, k = job->k;
    xknn_status st = XKNN_SUCCESS;
    xknn__job j = *job;
    int64_t *tids = NULL, *mi = NULL;
    float *tdist = NULL, *md = NULL;
    int fresh = 1; /* every running list is padding: the results go there directly */
    *done = 0;
    *too_big = 0;
    if (n <= k) return XKNN_SUCCESS; /* (fewer than k others: the CPU pair pads) */
    j.ref = j.query = (const float *)a->data;
    j.ref_data = j.query_data = a->data;
    j.n = j.nq = n;
    j.ldr = j.ldq = a->ld;
    j.params.exclude_self = 1;
    j.params.ref_id_offset = j.params.query_id_offset = a->id0;
    j.params.self_join = XKNN_SELF_JOIN_AUTO;
    /* the triangle is the tensor-core path's: auto must not pick a plain path's shape rule */
    if (j.params.cuda_path == XKNN_CUDA_PATH_AUTO) j.params.cuda_path = XKNN_CUDA_PATH_MMA;
    j.symmetric = 1;
    if (mirror_of(ctx, a->ids, n, k, &mi, &md)) {
        /* the lists are on the device (a list mirror): the triangle merges into them there */
        j.ids = a->ids;
        j.dist = a->dist;
        return host_sym(&j, ctx, staged, budget, done, too_big, er, mi, md);
    }
    /* (a list is sorted with its padding last: padding first means padding only; with
     * n > k every row of the self-join has k real neighbours, so writing them over the
     * padding is the merge) */
    for (int64_t r = 0; r < n && fresh; ++r) fresh = a->ids[r * k] < 0;
    if (fresh) {
        tids = a->ids;
        tdist = a->dist;
    } else {
        XKNN__TRY(host_lists(n, k, &tids, &tdist, er));
    }
    j.ids = tids;
    j.dist = tdist;
    XKNN__TRY(host_sym(&j, ctx, staged, budget, done, too_big, er, nullptr, nullptr));
    if (*done && !fresh)
        XKNN__TRY(merge_lists(a->ids, a->dist, tids, tdist, n, k, job->params.metric == XKNN_METRIC_IP,
                              job->params.num_threads, er));
cleanup:
    if (!fresh) {
        free(tdist);
        free(tids);
    }
    return st;
}

/* Rows [r0, r0 + rows) of a side, as a side of their own. */
xknn__sym_side side_rows(const xknn__sym_side *s, int64_t r0, int64_t rows, int64_t k)
{
    xknn__sym_side h = *s;
    h.data = (const float *)s->data + r0 * s->ld;
    h.rows = rows;
    h.id0 = s->id0 + r0;
    h.ids = s->ids + r0 * k;
    h.dist = s->dist + r0 * k;
    return h;
}

xknn_status pair_rec(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget, const xknn__sym_side *a,
                     const xknn__sym_side *b, Err er);

/* The CPU pair (xknn__cpu_sym_pair) of a part; where a list mirror holds a side's lists,
 * they come to the host for it and go back after. */
xknn_status cpu_pair(const xknn__job *job, xknn_cuda_context *ctx, const xknn__sym_side *a, const xknn__sym_side *b,
                     Err er)
{
    const xknn__sym_side *sd[2] = {a, b};
    int64_t *di[2] = {NULL, NULL};
    float *dd[2] = {NULL, NULL};
    const int64_t k = job->k;
    xknn_status st = XKNN_SUCCESS;
    int any = 0;
    for (int i = 0; i < 2; ++i) any |= sd[i] && mirror_of(ctx, sd[i]->ids, sd[i]->rows, k, &di[i], &dd[i]);
    if (any) XKNN__CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    for (int i = 0; i < 2; ++i)
        if (di[i]) {
            XKNN__CUDA_CHECK(cudaMemcpy(sd[i]->ids, di[i], (size_t)(sd[i]->rows * k) * sizeof(int64_t),
                                        cudaMemcpyDeviceToHost));
            XKNN__CUDA_CHECK(cudaMemcpy(sd[i]->dist, dd[i], (size_t)(sd[i]->rows * k) * sizeof(float),
                                        cudaMemcpyDeviceToHost));
        }
    st = xknn__cpu_sym_pair(job, a, b);
    for (int i = 0; i < 2 && st == XKNN_SUCCESS; ++i)
        if (di[i]) {
            XKNN__CUDA_CHECK(cudaMemcpy(di[i], sd[i]->ids, (size_t)(sd[i]->rows * k) * sizeof(int64_t),
                                        cudaMemcpyHostToDevice));
            XKNN__CUDA_CHECK(cudaMemcpy(dd[i], sd[i]->dist, (size_t)(sd[i]->rows * k) * sizeof(float),
                                        cudaMemcpyHostToDevice));
        }
cleanup:
    return st;
}

/* The pair (a, b) (b NULL: a against itself) as halves of its larger side (a set against
 * itself: two triangles and their rectangle), each through pair_rec; a single row on the
 * CPU pair. */
xknn_status pair_split(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget,
                       const xknn__sym_side *a, const xknn__sym_side *b, Err er)
{
    const xknn__sym_side *s = b && b->rows > a->rows ? b : a; /* the side to halve */
    const int64_t h = s->rows / 2, k = job->k;
    const xknn__sym_side h0 = side_rows(s, 0, h, k), h1 = side_rows(s, h, s->rows - h, k);
    xknn_status st = XKNN_SUCCESS;
    int mine[2] = {0, 0}; /* the list mirrors this call began */
    if (s->rows < 2) return cpu_pair(job, ctx, a, b, er);
    if (job->params.verbose)
        fprintf(stderr, "xknn: cuda: pair %lld x %lld: in parts (%lld rows halved)\n", (long long)a->rows,
                (long long)(b ? b->rows : a->rows), (long long)s->rows);
    if (staged) {
        /* parts: the sides' lists on the device until the last part is done (where no
         * mirror holds them yet), so that no part merges on the host */
        const xknn__sym_side *sd[2] = {a, b};
        const int ip = job->params.metric == XKNN_METRIC_IP;
        int64_t *di;
        float *dd;
        for (int i = 0; i < 2 && st == XKNN_SUCCESS; ++i) {
            if (!sd[i] || ctx->mirror[i].ids || mirror_of(ctx, sd[i]->ids, sd[i]->rows, k, &di, &dd)) continue;
            st = mirror_begin(ctx, i, sd[i], k, 0, ip, &budget, job->params.num_threads, er);
            mine[i] = ctx->mirror[i].ids != NULL;
        }
    }
    if (st != XKNN_SUCCESS) {
        /* reported below */
    } else if (!b) {
        st = pair_rec(job, ctx, staged, budget, &h0, NULL, er);
        if (st == XKNN_SUCCESS) st = pair_rec(job, ctx, staged, budget, &h1, NULL, er);
        if (st == XKNN_SUCCESS) st = pair_rec(job, ctx, staged, budget, &h0, &h1, er);
    } else if (s == a) {
        st = pair_rec(job, ctx, staged, budget, &h0, b, er);
        if (st == XKNN_SUCCESS) st = pair_rec(job, ctx, staged, budget, &h1, b, er);
    } else {
        st = pair_rec(job, ctx, staged, budget, a, &h0, er);
        if (st == XKNN_SUCCESS) st = pair_rec(job, ctx, staged, budget, a, &h1, er);
    }
    for (int i = 0; i < 2; ++i)
        if (mine[i]) {
            const xknn_status se = mirror_end(ctx, i, st == XKNN_SUCCESS, job->params.num_threads, er);
            if (st == XKNN_SUCCESS) st = se;
        }
    return st;
}

/* The pair (a, b) (b NULL: a against itself) into the running lists, on the device where
 * it fits: a pair whose state does not fit the budget is split in halves (pair_split),
 * recursively, each part merged into the lists as it is done; a part the device kernels
 * do not take runs the CPU pair (xknn__cpu_sym_pair), so the lists always end complete.
 * The merge is by (distance, id) of canonical values, so any split gives the same bits. */
xknn_status pair_rec(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget, const xknn__sym_side *a,
                     const xknn__sym_side *b, Err er)
{
    int done = 0, big = 0;
    xknn_status st = b ? host_pair(job, ctx, staged, budget, a, b, &done, &big, er)
                       : host_pair_self(job, ctx, staged, budget, a, &done, &big, er);
    if (st != XKNN_SUCCESS || done) return st;
    if (big) return pair_split(job, ctx, staged, budget, a, b, er);
    if (job->params.verbose)
        fprintf(stderr, "xknn: cuda: pair %lld x %lld: on the CPU\n", (long long)a->rows,
                (long long)(b ? b->rows : a->rows));
    return cpu_pair(job, ctx, a, b, er);
}

/* The self-join whose state does not fit the device at once (host_sym's *too_big): the
 * blocked triangle, the whole set's halves (pair_split) into job's lists (padding
 * first). */
xknn_status host_sym_blocked(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget, Err er)
{
    const int64_t n = job->n, k = job->k;
    const int ip = job->params.metric == XKNN_METRIC_IP;
    xknn_status st = XKNN_SUCCESS;
    float *dist = job->dist ? job->dist : (float *)malloc((size_t)(n * k) * sizeof(float));
    const void *kept = NULL;
    xknn__sym_side a;
    xknn_status st2;
    if (!dist)
        return failf(er, XKNN_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory for %lld x %lld distances",
                     (long long)n, (long long)k);
    a = xknn__job_side(job, dist);
    /* the lists on the device for all the parts (padding made there), or on the host */
    st = staged ? mirror_begin(ctx, 0, &a, k, 1, ip, &budget, job->params.num_threads, er) : XKNN_SUCCESS;
    if (st != XKNN_SUCCESS) {
        if (dist != job->dist) free(dist);
        return st;
    }
    if (!ctx->mirror[0].ids) xknn__lists_pad(job->ids, dist, n * k, ip);
    {
        /* Every part reads its rows from one device copy of the set (each row uploaded
         * once, by the first part that reads it), where it takes at most an eighth of the
         * budget (a caller's context; XKNN_CUDA_KEEP=0, a diagnostic, uploads each part's
         * rows as it runs) */
        const char *env = getenv("XKNN_CUDA_KEEP");
        const size_t bytes = (size_t)n * (size_t)job->d * sizeof(float);
        if (staged && !(env && *env == '0') && bytes <= budget / 8) {
            const xknn_matrix m = {job->ref, n, job->d, job->ldr, XKNN_DTYPE_F32};
            xknn_error ke;
            if (xknn_cuda_keep_rows(ctx, &m, 0, &ke) == XKNN_SUCCESS) {
                kept = job->ref;
                budget -= bytes;
            }
        }
    }
    if (job->params.verbose)
        fprintf(stderr, "xknn: cuda: self-join: symmetric in blocks (triangles and rectangles of halves%s%s)\n",
                kept ? "; the rows kept on the device" : "", ctx->mirror[0].ids ? "; the lists on the device" : "");
    st = pair_split(job, ctx, staged, budget, &a, NULL, er);
    st2 = mirror_end(ctx, 0, st == XKNN_SUCCESS, job->params.num_threads, er);
    if (st == XKNN_SUCCESS) st = st2;
    if (kept) xknn_cuda_forget_rows(ctx, kept);
    if (dist != job->dist) free(dist);
    return st;
}

xknn_status host_search(const xknn__job *job, Err er)
{
    if (generic_job(job)) return host_generic(job, er);
    const xknn_params *prm = &job->params;
    const int64_t n = job->n, nq = job->nq, d = job->d, k = job->k;
    const int self_res = job->query == job->ref && job->ldq == job->ldr && nq == n;
    const size_t row_bytes = (size_t)d * sizeof(float);
    const size_t per_q_out = (size_t)k * sizeof(int64_t) + (job->dist ? (size_t)k * sizeof(float) : 0);
    xknn_status st = XKNN_SUCCESS;
    xknn_cuda_context *ctx = (xknn_cuda_context *)prm->cuda_context;
    xknn_cuda_context *own_ctx = NULL;
    DeviceScope scope;
    HostBuffers hb;
    cudaStream_t sc = NULL, sx = NULL;
    cudaEvent_t h2d_done[2] = {NULL, NULL}, use_done[2] = {NULL, NULL};
    Plan plan;
    Run run;
    size_t budget = 0, min_needed = 0;
    int resident = 0, have_plan = 0;
    int64_t chunk = 0;
    int piece = 0;
    unsigned long long stats[kStatCount];

    memset(&plan, 0, sizeof plan);
    XKNN__TRY(host_begin(job, scope, &ctx, &own_ctx, &budget, er));

    /* The symmetric self-join where it applies (else the plain search, -v says why). */
    if (job->symmetric) {
        int done = 0, big = 0;
        st = host_sym(job, ctx, own_ctx == NULL, budget, &done, &big, er, nullptr, nullptr);
        if (st == XKNN_SUCCESS && !done && big) {
            st = host_sym_blocked(job, ctx, own_ctx == NULL, budget, er);
            done = 1;
        }
        if (st != XKNN_SUCCESS || done) goto cleanup;
    }

    /* ip and cosine: the tensor-core path with the references resident, else the
     * canonical tiles (on this context) */
    if (gemm_ipcos(prm)) {
        const size_t ref_bytes = (size_t)n * row_bytes;
        if (!(budget > ref_bytes && plan_fit(ctx, prm, n, nq, d, k, n, budget - ref_bytes,
                                             per_q_out + (self_res ? 0 : row_bytes), 0, &plan, &min_needed))) {
            xknn__job on_ctx = *job;
            on_ctx.params.cuda_context = ctx;
            if (prm->verbose)
                fprintf(stderr, "xknn: cuda: %s: %s; canonical tiles\n", xknn_metric_name(prm->metric),
                        ipcos_why_not(ctx, n, d, k) ? ipcos_why_not(ctx, n, d, k)
                                                         : "the tensor-core plan does not fit the memory budget");
            st = host_generic(&on_ctx, er);
            goto cleanup;
        }
        memset(&plan, 0, sizeof plan);
    }

    /* Fused path when chosen and the references fit the budget with the plan. */
    if (choose_path(prm, n, nq, d, k) == XKNN_CUDA_PATH_FUSED) {
        const size_t ref_bytes = (size_t)n * row_bytes;
        int failed = 0;
        if (budget > ref_bytes && plan_fused(ctx, prm, n, nq, d, k, budget - ref_bytes,
                                             per_q_out + (self_res ? 0 : row_bytes), &plan, &min_needed)) {
            st = host_fused(job, ctx, plan, self_res, own_ctx == NULL, budget, &failed, er);
            if (st != XKNN_SUCCESS || !failed) goto cleanup;
        }
        memset(&plan, 0, sizeof plan);
    }
    sc = ctx->stream;
    hb.pool = ctx->pool;
    hb.s = sc;

    /* Plan and allocate; an allocation failure shrinks the budget and plans again. */
    for (int attempt = 0; attempt < 6 && !have_plan; ++attempt) {
        const size_t B = (size_t)((double)budget * pow(0.75, attempt));
        const size_t ref_bytes = (size_t)n * row_bytes;
        cudaError_t e = cudaSuccess;
        resident = 0;
        if (B > ref_bytes &&
            plan_fit(ctx, prm, n, nq, d, k, n, B - ref_bytes, per_q_out + (self_res ? 0 : row_bytes), 0, &plan,
                     &min_needed)) {
            resident = 1;
        } else {
            int found = 0;
            size_t min_stream = 0;
            for (chunk = min64(n, max64(1, (int64_t)(B / 3 / (2 * row_bytes)))); chunk >= 1; chunk /= 2) {
                const size_t cbytes = 2 * (size_t)chunk * row_bytes;
                if (cbytes < B && plan_fit(ctx, prm, n, nq, d, k, chunk, B - cbytes, per_q_out + row_bytes, 1, &plan,
                                           &min_stream)) {
                    found = 1;
                    break;
                }
                if (chunk == 1) break;
            }
            if (!found) {
                plan_fit(ctx, prm, n, nq, d, k, 1, 0, per_q_out + row_bytes, 1, &plan, &min_stream);
                st = failf(er, XKNN_ERROR_OUT_OF_MEMORY,
                           "cuda backend: device memory budget of %zu bytes is below the minimum of %zu bytes "
                           "(n=%lld, d=%lld, k=%lld: one query, a 4-reference tile, %lld candidate slots, "
                           "two 1-row reference chunks)%s",
                           B, min_stream + 2 * row_bytes, (long long)n, (long long)d, (long long)k,
                           (long long)(2 * min64(k, n) + kCapSlack),
                           attempt ? " after allocation failures shrank it" : "");
                goto cleanup;
            }
        }
        if (resident) {
            e = hb.alloc((void **)&hb.dR, (size_t)n * row_bytes);
        } else {
            e = hb.alloc((void **)&hb.dChunk[0], (size_t)chunk * row_bytes);
            if (e == cudaSuccess) e = hb.alloc((void **)&hb.dChunk[1], (size_t)chunk * row_bytes);
        }
        if (e == cudaSuccess && !(resident && self_res)) e = hb.alloc((void **)&hb.dQ, (size_t)plan.QS * row_bytes);
        if (e == cudaSuccess) e = hb.alloc((void **)&hb.dIds, (size_t)plan.QS * k * sizeof(int64_t));
        if (e == cudaSuccess && job->dist) e = hb.alloc((void **)&hb.dDist, (size_t)plan.QS * k * sizeof(float));
        if (e == cudaSuccess) e = hb.alloc(&hb.dWs, plan.bytes);
        have_plan = alloc_outcome(hb, e, er, &st);
        if (have_plan < 0) goto cleanup;
    }
    if (!have_plan) {
        st = fail_alloc_kept_failing(er, budget, plan.bytes);
        goto cleanup;
    }
    if (prm->verbose) print_plan(ctx, plan, resident ? "resident references" : "streamed references", budget, chunk);

    if (!resident) {
        XKNN__CUDA_CHECK(cudaStreamCreateWithFlags(&sx, cudaStreamNonBlocking));
        for (int b = 0; b < 2; ++b) {
            XKNN__CUDA_CHECK(cudaEventCreateWithFlags(&h2d_done[b], cudaEventDisableTiming));
            XKNN__CUDA_CHECK(cudaEventCreateWithFlags(&use_done[b], cudaEventDisableTiming));
            XKNN__CUDA_CHECK(cudaHostAlloc((void **)&hb.pinned[b], (size_t)chunk * row_bytes, cudaHostAllocDefault));
        }
    }
    run = run_bind(ctx, &plan, hb.dWs, sc);
    XKNN__TRY(run_start(run, er));
    if (resident && own_ctx == NULL) {
        XKNN__TRY(stage_rows(ctx, hb.dR, job->ref, n, d, job->ldr, prm->num_threads, &piece, er));
        XKNN__CUDA_CHECK(cudaStreamWaitEvent(sc, ctx->stage_done[(piece - 1) & 1], 0));
    } else if (resident) {
        XKNN__CUDA_CHECK(cudaMemcpy2DAsync(hb.dR, row_bytes, job->ref, (size_t)job->ldr * sizeof(float), row_bytes,
                                           (size_t)n, cudaMemcpyHostToDevice, sc));
    }

    for (int64_t q0 = 0; q0 < nq; q0 += plan.QS) {
        const int64_t qs = min64(plan.QS, nq - q0);
        const float *Q;
        int64_t ldq;
        const int64_t self_local0 = prm->query_id_offset + q0 - prm->ref_id_offset;
        if (resident && self_res) {
            Q = hb.dR + q0 * d;
            ldq = d;
        } else if (resident && own_ctx == NULL) {
            XKNN__TRY(stage_rows(ctx, hb.dQ, job->query + q0 * job->ldq, qs, d, job->ldq, prm->num_threads, &piece, er));
            XKNN__CUDA_CHECK(cudaStreamWaitEvent(sc, ctx->stage_done[(piece - 1) & 1], 0));
            Q = hb.dQ;
            ldq = d;
        } else {
            XKNN__CUDA_CHECK(cudaMemcpy2DAsync(hb.dQ, row_bytes, job->query + q0 * job->ldq,
                                               (size_t)job->ldq * sizeof(float), row_bytes, (size_t)qs,
                                               cudaMemcpyHostToDevice, sc));
            Q = hb.dQ;
            ldq = d;
        }
        XKNN__TRY(block_begin(run, Q, ldq, qs, er));
        if (resident) {
            XKNN__TRY(block_pass(run, Q, ldq, qs, prm->exclude_self, self_local0, hb.dR, d, n, 0, er));
        } else {
            int64_t c = 0;
            for (int64_t r0 = 0; r0 < n; r0 += chunk, ++c) {
                const int b = (int)(c & 1);
                const int64_t rows = min64(chunk, n - r0);
                /* the previous copy out of pinned[b] is complete: refill it on the host
                 * (OpenMP threads, as the staging ring: one core's copy bounded this loop
                 * at 3.5-4.2 GB/s in the streamed rows of benchmarks/RESULTS.md) */
                XKNN__CUDA_CHECK(cudaEventSynchronize(h2d_done[b]));
                host_rows_copy((char *)hb.pinned[b], (const char *)(job->ref + r0 * job->ldr), rows, row_bytes,
                               (size_t)job->ldr * sizeof(float), prm->num_threads);
                /* device buffer b is free once the pass that used it is done */
                XKNN__CUDA_CHECK(cudaStreamWaitEvent(sx, use_done[b], 0));
                XKNN__CUDA_CHECK(cudaMemcpyAsync(hb.dChunk[b], hb.pinned[b], (size_t)rows * row_bytes,
                                                 cudaMemcpyHostToDevice, sx));
                XKNN__CUDA_CHECK(cudaEventRecord(h2d_done[b], sx));
                XKNN__CUDA_CHECK(cudaStreamWaitEvent(sc, h2d_done[b], 0));
                XKNN__TRY(block_pass(run, Q, ldq, qs, prm->exclude_self, self_local0, hb.dChunk[b], d, rows, r0, er));
                XKNN__CUDA_CHECK(cudaEventRecord(use_done[b], sc));
            }
        }
        XKNN__TRY(block_finish(run, qs, hb.dIds, hb.dDist, prm->ref_id_offset, er));
        XKNN__TRY(results_out(ctx, own_ctx == NULL, job->ids + q0 * k, hb.dIds, job->dist ? job->dist + q0 * k : NULL,
                              hb.dDist, (size_t)(qs * k), prm->num_threads, sc, &piece, er));
    }
    XKNN__CUDA_CHECK(cudaMemcpyAsync(stats, run.stats, sizeof stats, cudaMemcpyDeviceToHost, sc));
    XKNN__CUDA_CHECK(cudaStreamSynchronize(sc));
    if (prm->verbose)
        fprintf(stderr,
                "xknn: cuda: %llu candidates appended, %llu bound compactions, %llu exact compactions, %llu "
                "queries re-run exactly\n",
                stats[kStatAppended], stats[kStatUnion], stats[kStatExact], stats[kStatReruns]);
    if (stats[kStatUnresolved])
        st = failf(er, XKNN_ERROR_INTERNAL, "cuda backend: %llu final candidates had no canonical distance",
                   stats[kStatUnresolved]);

cleanup:
    if (sc) (void)cudaStreamSynchronize(sc);
    if (sx) (void)cudaStreamSynchronize(sx);
    for (int b = 1; b >= 0; --b) {
        if (use_done[b]) cudaEventDestroy(use_done[b]);
        if (h2d_done[b]) cudaEventDestroy(h2d_done[b]);
    }
    if (sx) cudaStreamDestroy(sx);
    if (ctx && ctx->copy_stream) (void)cudaStreamSynchronize(ctx->copy_stream);
    hb.release(); /* sc is the context's stream: not destroyed */
    if (sc) (void)cudaStreamSynchronize(sc);
    if (own_ctx) {
        /* a temporary context's cuBLAS handle must not keep pointing at freed memory */
        xknn_cuda_context_destroy(own_ctx);
    } else if (ctx && ctx->blas) {
        (void)cublasSetStream(ctx->blas, NULL); /* drops our workspace from the handle */
    }
    return st;
}

/* References split into slices of at most `slice` rows (ids are int32 on the device):
 * each slice is searched with pad_missing, and the sorted lists are merged on the host
 * by (distance, id), missing entries last. Canonical distances are identical whatever
 * the slicing, so the merge is exact. */
xknn_status host_search_sliced(const xknn__job *job, int64_t slice, Err er)
{
    const int64_t nq = job->nq, k = job->k;
    const size_t nk = (size_t)nq * (size_t)k;
    const int ip = job->params.metric == XKNN_METRIC_IP; /* ordered by -value */
    int64_t *tid = (int64_t *)malloc(nk * sizeof(int64_t)), *mid = (int64_t *)malloc((size_t)k * sizeof(int64_t));
    float *td = (float *)malloc(nk * sizeof(float)), *cd = (float *)malloc(nk * sizeof(float));
    float *md = (float *)malloc((size_t)k * sizeof(float));
    xknn_status st = XKNN_SUCCESS;
    if (!tid || !mid || !td || !cd || !md) {
        st = failf(er, XKNN_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory for %lld x %lld slice results",
                   (long long)nq, (long long)k);
        goto cleanup;
    }
    for (size_t i = 0; i < nk; ++i) {
        job->ids[i] = -1;
        cd[i] = ip ? -INFINITY : INFINITY;
    }
    for (int64_t r0 = 0; r0 < job->n; r0 += slice) {
        xknn__job sub = *job;
        sub.ref = job->ref ? job->ref + r0 * job->ldr : NULL;
        sub.ref_data = (const char *)job->ref_data + (size_t)r0 * (size_t)job->ldr * xknn__dtype_bytes(job->dtype);
        sub.n = min64(slice, job->n - r0);
        sub.params.ref_id_offset += r0;
        sub.params.pad_missing = 1;
        sub.ids = tid;
        sub.dist = td;
        XKNN__TRY(host_search(&sub, er));
        for (int64_t q = 0; q < nq; ++q) merge_row(job->ids + q * k, cd + q * k, tid + q * k, td + q * k, k, ip, mid, md);
    }
    if (job->dist) memcpy(job->dist, cd, nk * sizeof(float));
cleanup:
    free(md);
    free(cd);
    free(td);
    free(mid);
    free(tid);
    return st;
}

} // namespace

/* ---- public and backend entry points ------------------------------------------------ */
/* Device arrays: l2 and euclidean on every path, ip and cosine on the tensor-core path
 * (no other GEMM path has their bound); INVALID_ARGUMENT with the reason otherwise. */
xknn_status device_metric_check(Err er, const xknn_cuda_context *ctx, const xknn_params *prm, int64_t n, int64_t d,
                                int64_t k, const char *fn)
{
    if (prm->metric == XKNN_METRIC_L2 || prm->metric == XKNN_METRIC_EUCLIDEAN) return XKNN_SUCCESS;
    if (!gemm_ipcos(prm))
        return failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                     "%s: metric %s on device arrays: l2, euclidean, ip and cosine only (xknn_search takes every "
                     "metric on host arrays)",
                     fn, xknn_metric_name(prm->metric));
    const char *why = ipcos_why_not(ctx, n, d, k);
    if (!why && (prm->cuda_path == XKNN_CUDA_PATH_FP32 || prm->cuda_path == XKNN_CUDA_PATH_TF32))
        why = "cuda_path FP32 and TF32 are l2's cuBLAS paths (ip and cosine: AUTO or MMA)";
    if (why)
        return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "%s: metric %s on device arrays: %s (xknn_search takes it on host arrays)",
                     fn, xknn_metric_name(prm->metric), why);
    return XKNN_SUCCESS;
}

extern "C" {

int xknn__cuda_built(void) { return 1; }

int xknn__cuda_device_count(void)
{
    int c = 0;
    const cudaError_t e = cudaGetDeviceCount(&c);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return c;
}

xknn_status xknn__cuda_search(const xknn__job *job)
{
    Err er;
    er.msg = job->msg;
    er.size = job->msg_size;
    int64_t slice = kMaxRefsPerCall;
    /* testing knob: a smaller slice exercises the multi-slice merge on small data */
    const char *env = getenv("XKNN_CUDA_REF_SLICE");
    if (env && *env) {
        const long long v = strtoll(env, NULL, 10);
        if (v > 0 && v < slice) slice = v;
    }
    if (job->n > slice) return host_search_sliced(job, slice, er);
    return host_search(job, er);
}

/* xknn_search_pair on the device (pair_rec: the pair kernel where it fits, halves where
 * it does not, the CPU pair for parts the kernels do not take). */
xknn_status xknn__cuda_pair(const xknn__job *job, const xknn__sym_side *a, const xknn__sym_side *b)
{
    Err er;
    er.msg = job->msg;
    er.size = job->msg_size;
    if (a->rows <= 0 || (b && b->rows <= 0) || job->k <= 0) return XKNN_SUCCESS;
    xknn__job j = *job; /* the sizes host_begin checks: a's rows as queries, b's (or a's) as references */
    j.query = (const float *)a->data;
    j.query_data = a->data;
    j.nq = a->rows;
    j.ldq = a->ld;
    j.ref = (const float *)(b ? b->data : a->data);
    j.ref_data = j.ref;
    j.n = b ? b->rows : a->rows;
    j.ldr = b ? b->ld : a->ld;
    DeviceScope scope;
    xknn_cuda_context *ctx = NULL, *own_ctx = NULL;
    size_t budget = 0;
    xknn_status st = host_begin(&j, scope, &ctx, &own_ctx, &budget, er);
    if (st == XKNN_SUCCESS) st = pair_rec(&j, ctx, own_ctx == NULL, budget, a, b, er);
    if (own_ctx) xknn_cuda_context_destroy(own_ctx);
    return st;
}

xknn_status xknn_cuda_context_create(int device, xknn_cuda_context **out, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    xknn_cuda_context *c = NULL;
    DeviceScope scope;
    cudaDeviceProp prop;
    int count = 0, l2 = 0, optin = 0, pools = 0;
    if (!out) return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_context_create: ctx is NULL"));
    *out = NULL;
    count = xknn__cuda_device_count();
    if (count <= 0)
        return finish_err(err, failf(er, XKNN_ERROR_NO_DEVICE, "cuda backend: no CUDA device is available"));
    if (device == -1) XKNN__CUDA_CHECK(cudaGetDevice(&device));
    if (device < 0 || device >= count) {
        st = failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                   "cuda backend: device ordinal %d is out of range (%d CUDA device%s: 0..%d)", device, count,
                   count == 1 ? "" : "s", count - 1);
        goto cleanup;
    }
    c = (xknn_cuda_context *)calloc(1, sizeof *c);
    if (!c) {
        st = failf(er, XKNN_ERROR_OUT_OF_MEMORY, "cuda backend: out of host memory for a context");
        goto cleanup;
    }
    c->device = device;
    pthread_mutex_init(&c->kept_lock, NULL);
    XKNN__CUDA_CHECK(scope.enter(device));
    XKNN__CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    XKNN__CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    XKNN__CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    c->sms = prop.multiProcessorCount;
    c->cc_major = prop.major;
    c->cc_minor = prop.minor;
    c->l2 = (size_t)l2;
    c->smem_optin = (size_t)optin;
    c->global_mem = prop.totalGlobalMem;
    snprintf(c->name, sizeof c->name, "%s", prop.name);
    XKNN__CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    /* a pool of its own that keeps freed memory (release threshold: all), so repeated host
     * calls on one context do not pay cudaMalloc; without pool support, plain cudaMalloc */
    XKNN__CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
    if (pools) {
        cudaMemPoolProps pp;
        memset(&pp, 0, sizeof pp);
        pp.allocType = cudaMemAllocationTypePinned;
        pp.handleTypes = cudaMemHandleTypeNone;
        pp.location.type = cudaMemLocationTypeDevice;
        pp.location.id = device;
        XKNN__CUDA_CHECK(cudaMemPoolCreate(&c->pool, &pp));
        uint64_t keep = UINT64_MAX;
        XKNN__CUDA_CHECK(cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &keep));
    }
    *out = c;
    c = NULL;
cleanup:
    if (c) {
        if (c->pool) cudaMemPoolDestroy(c->pool);
        if (c->stream) cudaStreamDestroy(c->stream);
        pthread_mutex_destroy(&c->kept_lock);
        free(c);
    }
    return finish_err(err, st);
}

void xknn_cuda_context_destroy(xknn_cuda_context *ctx)
{
    if (!ctx) return;
    DeviceScope scope;
    if (scope.enter(ctx->device) == cudaSuccess) {
        /* (first: a copy still running reads the kept lists) */
        copier_destroy(ctx->copier);
        for (int i = 0; i < 8; ++i) kept_free(ctx->kept[i]);
        for (int i = 0; i < 4; ++i) {
            if (ctx->lists[i].ids) cudaFree(ctx->lists[i].ids);
            if (ctx->lists[i].dist) cudaFree(ctx->lists[i].dist);
        }
        if (ctx->keep_stream) cudaStreamDestroy(ctx->keep_stream);
        if (ctx->pair_out) cudaFreeHost(ctx->pair_out);
        for (int b = 1; b >= 0; --b) {
            if (ctx->stage_done[b]) cudaEventDestroy(ctx->stage_done[b]);
            if (ctx->stage[b]) cudaFreeHost(ctx->stage[b]);
        }
        if (ctx->copy_stream) cudaStreamDestroy(ctx->copy_stream);
        if (ctx->blas) cublasDestroy(ctx->blas);
        if (ctx->pool) cudaMemPoolDestroy(ctx->pool);
        if (ctx->stream) cudaStreamDestroy(ctx->stream);
    }
    pthread_mutex_destroy(&ctx->kept_lock);
    free(ctx);
}

int xknn_cuda_context_device(const xknn_cuda_context *ctx) { return ctx ? ctx->device : -1; }

/* The context's upload stream for kept rows (made by the first keep that needs it, under
 * kept_lock: another thread may run a call on the context meanwhile) into *ks. */
static cudaError_t keep_stream_of(xknn_cuda_context *ctx, cudaStream_t *ks)
{
    pthread_mutex_lock(&ctx->kept_lock);
    const cudaError_t e =
        ctx->keep_stream ? cudaSuccess : cudaStreamCreateWithFlags(&ctx->keep_stream, cudaStreamNonBlocking);
    *ks = ctx->keep_stream;
    pthread_mutex_unlock(&ctx->kept_lock);
    return e;
}

xknn_status xknn_cuda_keep_rows(xknn_cuda_context *ctx, const xknn_matrix *rows, int upload_now, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    xknn_cuda_kept *kp = NULL;
    DeviceScope scope;
    cudaStream_t ks = NULL; /* the upload stream (keep_stream_of) */
    int slot = -1;
    if (!ctx || !rows || !rows->data || rows->rows <= 0 || rows->cols <= 0)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_keep_rows: a context and a matrix of at least one row are needed"));
    if (rows->dtype != XKNN_DTYPE_F32)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_keep_rows: f32 rows only"));
    const size_t row_bytes = (size_t)rows->cols * sizeof(float);
    const size_t ld_bytes = (size_t)(rows->ld ? rows->ld : rows->cols) * sizeof(float);
    if (ld_bytes < row_bytes)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_keep_rows: ld %lld < cols %lld",
                                     (long long)rows->ld, (long long)rows->cols));
    XKNN__CUDA_CHECK(scope.enter(ctx->device));
    kp = (xknn_cuda_kept *)calloc(1, sizeof *kp);
    if (kp) {
        kp->host = (const char *)rows->data;
        kp->rows = rows->rows;
        kp->row_bytes = row_bytes;
        kp->ld_bytes = ld_bytes;
        /* chunks of about 32 MiB: a call uploads the ones it reads */
        kp->chunk = max64(1, ((int64_t)32 << 20) / (int64_t)row_bytes);
        kp->valid = (unsigned char *)calloc((size_t)ceil_div(kp->rows, kp->chunk), 1);
    }
    if (!kp || !kp->valid) {
        st = failf(er, XKNN_ERROR_OUT_OF_MEMORY, "xknn_cuda_keep_rows: out of host memory");
        goto cleanup;
    }
    {
        /* from the context's pool, in order on the upload stream: cudaMalloc waits for the
         * work the device is running (an implicit synchronization), so a held slice kept
         * while a call computes on another thread would start its upload only once that
         * call is over (on two H200s, 2.4 s into the 4M graph's ring, not 0.7 s) */
        cudaError_t e = cudaErrorMemoryAllocation;
        if (ctx->pool) {
            e = keep_stream_of(ctx, &ks);
            if (e == cudaSuccess)
                e = cudaMallocFromPoolAsync((void **)&kp->dev, (size_t)kp->rows * row_bytes, ctx->pool, ks);
            if (e == cudaSuccess) e = cudaStreamSynchronize(ks);
            if (e == cudaSuccess) {
                kp->freed_on = ctx->stream;
            } else {
                (void)cudaGetLastError();
                if (kp->dev) (void)cudaFreeAsync(kp->dev, ks);
                kp->dev = NULL;
            }
        }
        if (e != cudaSuccess) e = cudaMalloc((void **)&kp->dev, (size_t)kp->rows * row_bytes);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            kp->dev = NULL;
            st = failf(er, e == cudaErrorMemoryAllocation ? XKNN_ERROR_OUT_OF_MEMORY : XKNN_ERROR_DEVICE,
                       "xknn_cuda_keep_rows: %lld rows (%.1f MiB) on device %d: %s", (long long)kp->rows,
                       (double)kp->rows * (double)row_bytes / 1048576.0, ctx->device, cudaGetErrorString(e));
            goto cleanup;
        }
    }
    if (upload_now) {
        /* on a stream of its own: another thread may run a call on the context meanwhile */
        cudaError_t e = keep_stream_of(ctx, &ks);
        /* a chunk a copy: from pageable memory each copy holds the calling thread while
         * the driver stages it, and a call on the context in another thread gets its
         * turn between them */
        for (int64_t r0 = 0; r0 < kp->rows && e == cudaSuccess; r0 += kp->chunk)
            e = cudaMemcpy2DAsync(kp->dev + r0 * (int64_t)row_bytes, row_bytes, kp->host + r0 * (int64_t)ld_bytes,
                                  ld_bytes, row_bytes, (size_t)min64(kp->chunk, kp->rows - r0), cudaMemcpyHostToDevice,
                                  ks);
        if (e == cudaSuccess) e = cudaStreamSynchronize(ks);
        XKNN__CUDA_CHECK(e);
        memset(kp->valid, 1, (size_t)ceil_div(kp->rows, kp->chunk));
    }
    pthread_mutex_lock(&ctx->kept_lock);
    for (int i = 0; i < 8 && slot < 0; ++i)
        if (!ctx->kept[i]) slot = i;
    if (slot >= 0) ctx->kept[slot] = kp;
    pthread_mutex_unlock(&ctx->kept_lock);
    if (slot < 0) {
        st = failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_keep_rows: the context keeps 8 blocks of rows already");
        goto cleanup;
    }
    kp = NULL;
cleanup:
    kept_free(kp);
    return finish_err(err, st);
}

void xknn_cuda_forget_rows(xknn_cuda_context *ctx, const void *data)
{
    xknn_cuda_kept *kp = NULL;
    if (!ctx || !data) return;
    pthread_mutex_lock(&ctx->kept_lock);
    for (int i = 0; i < 8 && !kp; ++i)
        if (ctx->kept[i] && ctx->kept[i]->host == (const char *)data) {
            kp = ctx->kept[i];
            ctx->kept[i] = NULL;
        }
    pthread_mutex_unlock(&ctx->kept_lock);
    if (!kp) return;
    DeviceScope scope;
    if (scope.enter(ctx->device) == cudaSuccess) kept_free(kp);
}

xknn_status xknn_cuda_keep_lists(xknn_cuda_context *ctx, xknn_metric metric, int64_t *ids, float *dist, int64_t rows,
                                 int64_t k, int init, const float *bounds, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    DeviceScope scope;
    ListMirror m = {ids, dist, rows, k, NULL, NULL};
    const int ip = metric == XKNN_METRIC_IP;
    int slot = -1, piece = 0;
    if (!ctx || !ids || !dist || rows <= 0 || k <= 0)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_keep_lists: a context and lists of at least one row are needed"));
    if (init != XKNN_CUDA_LISTS_HOST && init != XKNN_CUDA_LISTS_PADDING)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_keep_lists: init %d: XKNN_CUDA_LISTS_HOST or XKNN_CUDA_LISTS_PADDING",
                                     init));
    if (bounds && (init != XKNN_CUDA_LISTS_PADDING || ip))
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_keep_lists: bounds go with XKNN_CUDA_LISTS_PADDING and a metric of "
                                     "the l2 family only"));
    if (rows > INT64_MAX / 16 / k)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_keep_lists: %lld x %lld lists: too large",
                                     (long long)rows, (long long)k));
    const size_t cnt = (size_t)(rows * k);
    XKNN__CUDA_CHECK(scope.enter(ctx->device));
    {
        /* (the bounds, if any, travel in a tail of the distances' allocation) */
        cudaError_t e = cudaMalloc((void **)&m.ids, cnt * sizeof(int64_t));
        if (e == cudaSuccess) e = cudaMalloc((void **)&m.dist, (cnt + (bounds ? (size_t)rows : 0)) * sizeof(float));
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            st = failf(er, e == cudaErrorMemoryAllocation ? XKNN_ERROR_OUT_OF_MEMORY : XKNN_ERROR_DEVICE,
                       "xknn_cuda_keep_lists: %lld x %lld lists (%.1f MiB) on device %d: %s", (long long)rows,
                       (long long)k, (double)cnt * 12.0 / 1048576.0, ctx->device, cudaGetErrorString(e));
            goto cleanup;
        }
    }
    if (init == XKNN_CUDA_LISTS_PADDING) {
        XKNN__CUDA_CHECK(launch_lists_pad(m.ids, m.dist, (int64_t)cnt, ip, ctx->sms, ctx->stream));
        if (bounds) {
            XKNN__CUDA_CHECK(cudaMemcpyAsync(m.dist + cnt, bounds, (size_t)rows * sizeof(float), cudaMemcpyHostToDevice,
                                             ctx->stream));
            XKNN__CUDA_CHECK(launch_lists_bound(m.dist, m.dist + cnt, rows, k, ctx->sms, ctx->stream));
        }
    } else {
        XKNN__CUDA_CHECK(stage_make(ctx));
        XKNN__TRY(stage_bytes(ctx, (char *)m.ids, (const char *)ids, rows, (size_t)k * sizeof(int64_t),
                              (size_t)k * sizeof(int64_t), ctx->threads, &piece, er, kStagePiece));
        XKNN__TRY(stage_bytes(ctx, (char *)m.dist, (const char *)dist, rows, (size_t)k * sizeof(float),
                              (size_t)k * sizeof(float), ctx->threads, &piece, er, kStagePiece));
        XKNN__CUDA_CHECK(cudaStreamWaitEvent(ctx->stream, ctx->stage_done[(piece - 1) & 1], 0));
    }
    /* (the caller may change its arrays and bounds once this returns) */
    XKNN__CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    {
        /* a free slot, and no overlap with a set kept already (a row's lists live in one
         * place) */
        const char *lo = (const char *)ids, *hi = (const char *)(ids + cnt);
        int overlap = 0;
        pthread_mutex_lock(&ctx->kept_lock);
        for (int i = 0; i < 4; ++i) {
            const ListMirror &o = ctx->lists[i];
            if (!o.ids) {
                if (slot < 0) slot = i;
                continue;
            }
            const char *olo = (const char *)o.host_ids, *ohi = (const char *)(o.host_ids + o.rows * o.k);
            overlap |= lo < ohi && olo < hi;
        }
        if (slot >= 0 && !overlap) ctx->lists[slot] = m;
        pthread_mutex_unlock(&ctx->kept_lock);
        if (overlap || slot < 0) {
            st = failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                       overlap ? "xknn_cuda_keep_lists: the lists overlap lists the context keeps already"
                               : "xknn_cuda_keep_lists: the context keeps 4 list sets already");
            goto cleanup;
        }
    }
    m.ids = NULL;
    m.dist = NULL;
cleanup:
    if (m.ids || m.dist) (void)cudaStreamSynchronize(ctx->stream);
    if (m.ids) cudaFree(m.ids);
    if (m.dist) cudaFree(m.dist);
    return finish_err(err, st);
}

/* The kept set whose first list is at ids into *m (taken out of the table with take),
 * or 0 where there is none. */
static int kept_lists_find(xknn_cuda_context *ctx, const int64_t *ids, int take, ListMirror *m)
{
    int slot = -1;
    pthread_mutex_lock(&ctx->kept_lock);
    for (int i = 0; i < 4 && slot < 0; ++i)
        if (ctx->lists[i].ids && ctx->lists[i].host_ids == ids) slot = i;
    if (slot >= 0) {
        *m = ctx->lists[slot];
        if (take) memset(&ctx->lists[slot], 0, sizeof ctx->lists[slot]);
    }
    pthread_mutex_unlock(&ctx->kept_lock);
    return slot >= 0;
}

/* The kept set that begins at ids (into *m; it stays kept) and rows [row0, row0 + rows)
 * inside it, for the copies to the host: INVALID_ARGUMENT otherwise, the message led by
 * what (the public function's name). */
static xknn_status kept_lists_rows(xknn_cuda_context *ctx, const int64_t *ids, int64_t row0, int64_t rows,
                                   const char *what, ListMirror *m, Err er)
{
    if (!ctx || !ids) return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "%s: NULL argument", what);
    if (!kept_lists_find(ctx, ids, 0, m))
        return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "%s: the context keeps no lists that begin there", what);
    if (row0 < 0 || rows < 0 || row0 > m->rows || rows > m->rows - row0)
        return failf(er, XKNN_ERROR_INVALID_ARGUMENT, "%s: rows %lld..%lld outside the set's %lld rows", what,
                     (long long)row0, (long long)(row0 + rows - 1), (long long)m->rows);
    return XKNN_SUCCESS;
}

xknn_status xknn_cuda_fetch_lists(xknn_cuda_context *ctx, int64_t *ids, int download, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    DeviceScope scope;
    ListMirror m;
    int piece = 0;
    if (!ctx || !ids)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_fetch_lists: NULL argument"));
    if (!kept_lists_find(ctx, ids, 1, &m))
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_fetch_lists: the context keeps no lists that begin there"));
    XKNN__CUDA_CHECK(scope.enter(ctx->device));
    /* (copies started by xknn_cuda_copy_lists_start may still read the set) */
    if (ctx->copier) (void)copier_wait(ctx->copier, -1, 1, NULL);
    if (download) {
        XKNN__CUDA_CHECK(stage_make(ctx));
        XKNN__TRY(results_out(ctx, 1, m.host_ids, m.ids, m.host_dist, m.dist, (size_t)(m.rows * m.k), ctx->threads,
                              ctx->stream, &piece, er, kStagePiece));
    }
cleanup:
    (void)cudaStreamSynchronize(ctx->stream);
    cudaFree(m.ids);
    cudaFree(m.dist);
    return finish_err(err, st);
}

xknn_status xknn_cuda_copy_lists(xknn_cuda_context *ctx, const int64_t *ids, int64_t row0, int64_t rows,
                                 xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    DeviceScope scope;
    ListMirror m = {}; /* (filled by kept_lists_rows) */
    int piece = 0;
    /* (the set stays in the table: the caller runs neither fetch_lists nor a call that
     * merges into these rows meanwhile) */
    if ((st = kept_lists_rows(ctx, ids, row0, rows, "xknn_cuda_copy_lists", &m, er)) != XKNN_SUCCESS || rows == 0)
        return finish_err(err, st);
    XKNN__CUDA_CHECK(scope.enter(ctx->device));
    XKNN__CUDA_CHECK(stage_make(ctx));
    XKNN__TRY(results_out(ctx, 1, m.host_ids + row0 * m.k, m.ids + row0 * m.k, m.host_dist + row0 * m.k,
                          m.dist + row0 * m.k, (size_t)(rows * m.k), ctx->threads, ctx->stream, &piece, er,
                          kStagePiece));
cleanup:
    (void)cudaStreamSynchronize(ctx->stream);
    return finish_err(err, st);
}

/* 1 where [p, p + bytes) is page-locked host memory (cudaHostAlloc, cudaHostRegister):
 * the copy engines write it without the host's help. Checked at both ends (a registered
 * range is one allocation to the runtime). */
static int host_locked(const void *p, size_t bytes)
{
    for (int i = 0; i < 2; ++i) {
        cudaPointerAttributes a;
        const char *q = (const char *)p + (i ? bytes - 1 : 0);
        if (cudaPointerGetAttributes(&a, q) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        if (a.type != cudaMemoryTypeHost) return 0;
    }
    return 1;
}

/* ---- the copier: xknn_cuda_copy_lists_start's copies in a thread of their own ----------
 * Jobs run in ticket order on the copier's stream, each after the context's stream as it
 * was at its start (an event recorded then). Into page-locked host rows a job is one
 * copy; into pageable ones it goes through two pinned buffers, the host copying one out
 * while the device fills the other, so the caller's thread (which runs the next call)
 * never waits for it. */
static const int kJobs = 16;
static const size_t kCopierBuf = (size_t)16 << 20;

struct CopyJob {
    int64_t ticket;
    char *dst[2];
    const char *src[2];
    size_t bytes[2];
    int locked;
};

struct xknn_cuda_copier {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int device, stop, thread_made;
    cudaStream_t s;
    cudaEvent_t after[kJobs]; /* job t's: recorded on the context's stream at its start  */
    cudaEvent_t filled[2];    /* the pinned buffers' copies from the device            */
    char *buf[2];             /* pinned, kCopierBuf each                               */
    CopyJob q[kJobs];         /* jobs with tickets (done, issued]                      */
    int64_t issued, done;     /* tickets issued; tickets <= done are over             */
    int64_t failed;           /* the first ticket whose copy failed (0: none)          */
    char why[160];
};

static cudaError_t copier_run(xknn_cuda_copier *c, const CopyJob &j, cudaEvent_t after)
{
    cudaError_t e = cudaStreamWaitEvent(c->s, after, 0);
    for (int i = 0; i < 2 && e == cudaSuccess; ++i) {
        if (!j.bytes[i]) continue;
        if (j.locked) {
            e = cudaMemcpyAsync(j.dst[i], j.src[i], j.bytes[i], cudaMemcpyDeviceToHost, c->s);
            continue;
        }
        /* chunk n goes to buffer n & 1; chunk n - 1 is copied out while chunk n fills */
        const size_t n = (j.bytes[i] + kCopierBuf - 1) / kCopierBuf;
        for (size_t ch = 0; ch <= n && e == cudaSuccess; ++ch) {
            if (ch < n) {
                const size_t off = ch * kCopierBuf, len = min64((int64_t)kCopierBuf, (int64_t)(j.bytes[i] - off));
                e = cudaMemcpyAsync(c->buf[ch & 1], j.src[i] + off, len, cudaMemcpyDeviceToHost, c->s);
                if (e == cudaSuccess) e = cudaEventRecord(c->filled[ch & 1], c->s);
            }
            if (e == cudaSuccess && ch >= 1) {
                const size_t off = (ch - 1) * kCopierBuf, len = min64((int64_t)kCopierBuf, (int64_t)(j.bytes[i] - off));
                e = cudaEventSynchronize(c->filled[(ch - 1) & 1]);
                if (e == cudaSuccess) memcpy(j.dst[i] + off, c->buf[(ch - 1) & 1], len);
            }
        }
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->s);
    return e;
}

static void *copier_main(void *arg)
{
    xknn_cuda_copier *c = (xknn_cuda_copier *)arg;
    cudaError_t e0 = cudaSetDevice(c->device);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && c->done == c->issued) pthread_cond_wait(&c->cv, &c->mu);
        if (c->done == c->issued) break; /* (stop, nothing left) */
        const CopyJob j = c->q[(c->done + 1) % kJobs];
        const cudaEvent_t after = c->after[(c->done + 1) % kJobs];
        pthread_mutex_unlock(&c->mu);
        const cudaError_t e = e0 != cudaSuccess ? e0 : copier_run(c, j, after);
        pthread_mutex_lock(&c->mu);
        if (e != cudaSuccess && !c->failed) {
            c->failed = j.ticket;
            snprintf(c->why, sizeof c->why, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        }
        c->done = j.ticket;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static void copier_destroy(xknn_cuda_copier *c)
{
    if (!c) return;
    if (c->thread_made) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->th, NULL);
    }
    if (c->s) cudaStreamDestroy(c->s);
    for (int i = 0; i < kJobs; ++i)
        if (c->after[i]) cudaEventDestroy(c->after[i]);
    for (int b = 0; b < 2; ++b) {
        if (c->filled[b]) cudaEventDestroy(c->filled[b]);
        if (c->buf[b]) cudaFreeHost(c->buf[b]);
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* The context's copier, made on first use (on the context's device, the caller's scope
 * entered); NULL and *e set where it cannot be made. */
static xknn_cuda_copier *copier_of(xknn_cuda_context *ctx, cudaError_t *e)
{
    pthread_mutex_lock(&ctx->kept_lock);
    xknn_cuda_copier *c = ctx->copier;
    *e = cudaSuccess;
    if (!c) {
        c = (xknn_cuda_copier *)calloc(1, sizeof *c);
        if (!c) {
            *e = cudaErrorMemoryAllocation;
        } else {
            pthread_mutex_init(&c->mu, NULL);
            pthread_cond_init(&c->cv, NULL);
            c->device = ctx->device;
            *e = cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking);
            for (int i = 0; i < kJobs && *e == cudaSuccess; ++i)
                *e = cudaEventCreateWithFlags(&c->after[i], cudaEventDisableTiming);
            for (int b = 0; b < 2 && *e == cudaSuccess; ++b) {
                *e = cudaEventCreateWithFlags(&c->filled[b], cudaEventDisableTiming);
                if (*e == cudaSuccess) *e = cudaHostAlloc((void **)&c->buf[b], kCopierBuf, cudaHostAllocDefault);
            }
            if (*e == cudaSuccess) {
                if (pthread_create(&c->th, NULL, copier_main, c) == 0)
                    c->thread_made = 1;
                else
                    *e = cudaErrorMemoryAllocation;
            }
            if (*e != cudaSuccess) {
                (void)cudaGetLastError();
                copier_destroy(c);
                c = NULL;
            }
            ctx->copier = c;
        }
    }
    pthread_mutex_unlock(&ctx->kept_lock);
    return c;
}

/* Waits (wait = 1) or looks: *over = 1 once ticket (-1: every one issued) is done. Returns
 * the failure of a copy up to ticket (cudaErrorUnknown, why in *why), else cudaSuccess. */
static cudaError_t copier_wait(xknn_cuda_copier *c, int64_t ticket, int wait, int *over, const char **why)
{
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&c->mu);
    if (ticket < 0) ticket = c->issued;
    while (wait && c->done < ticket) pthread_cond_wait(&c->cv, &c->mu);
    if (over) *over = c->done >= ticket;
    if (c->failed && c->failed <= ticket && c->done >= c->failed) {
        e = cudaErrorUnknown;
        if (why) *why = c->why;
    }
    pthread_mutex_unlock(&c->mu);
    return e;
}

xknn_status xknn_cuda_copy_lists_start(xknn_cuda_context *ctx, const int64_t *ids, int64_t row0, int64_t rows,
                                       int64_t *ticket, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    DeviceScope scope;
    ListMirror m = {}; /* (filled by kept_lists_rows) */
    xknn_cuda_copier *c = NULL;
    CopyJob j;
    cudaError_t e = cudaSuccess;
    if (!ticket)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_copy_lists_start: NULL argument"));
    *ticket = 0;
    if ((st = kept_lists_rows(ctx, ids, row0, rows, "xknn_cuda_copy_lists_start", &m, er)) != XKNN_SUCCESS ||
        rows == 0)
        return finish_err(err, st);
    XKNN__CUDA_CHECK(scope.enter(ctx->device));
    memset(&j, 0, sizeof j);
    j.dst[0] = (char *)(m.host_ids + row0 * m.k);
    j.src[0] = (const char *)(m.ids + row0 * m.k);
    j.bytes[0] = (size_t)(rows * m.k) * sizeof(int64_t);
    j.dst[1] = (char *)(m.host_dist + row0 * m.k);
    j.src[1] = (const char *)(m.dist + row0 * m.k);
    j.bytes[1] = (size_t)(rows * m.k) * sizeof(float);
    j.locked = host_locked(j.dst[0], j.bytes[0]) && host_locked(j.dst[1], j.bytes[1]);
    c = copier_of(ctx, &e);
    XKNN__CUDA_CHECK(e);
    pthread_mutex_lock(&c->mu);
    /* (a slot is free once the job that had it kJobs tickets ago is done) */
    while (c->issued - c->done >= kJobs) pthread_cond_wait(&c->cv, &c->mu);
    j.ticket = c->issued + 1;
    e = cudaEventRecord(c->after[j.ticket % kJobs], ctx->stream);
    if (e == cudaSuccess) {
        c->q[j.ticket % kJobs] = j;
        c->issued = j.ticket;
        *ticket = j.ticket;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    XKNN__CUDA_CHECK(e);
cleanup:
    return finish_err(err, st);
}

xknn_status xknn_cuda_copy_lists_test(xknn_cuda_context *ctx, int64_t ticket, int wait, int *done, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    if (!ctx || !done)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_copy_lists_test: NULL argument"));
    *done = 1;
    if (ticket == 0) return finish_err(err, st);
    pthread_mutex_lock(&ctx->kept_lock);
    xknn_cuda_copier *c = ctx->copier;
    pthread_mutex_unlock(&ctx->kept_lock);
    int64_t issued = 0;
    if (c) {
        pthread_mutex_lock(&c->mu);
        issued = c->issued;
        pthread_mutex_unlock(&c->mu);
    }
    if (ticket < 0 || ticket > issued)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_copy_lists_test: ticket %lld was not issued",
                                     (long long)ticket));
    const char *why = "";
    if (copier_wait(c, ticket, wait, done, &why) != cudaSuccess) {
        *done = 0;
        st = failf(er, XKNN_ERROR_DEVICE, "cuda backend: the lists' copy to the host failed: %s", why);
    }
    return finish_err(err, st);
}

xknn_status xknn_cuda_host_register(xknn_cuda_context *ctx, void *p, size_t bytes, xknn_error *err)
{
    Err er = err_of(err);
    DeviceScope scope; /* (on the context's device: no runtime state made on another) */
    if (!ctx || !p || !bytes)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_host_register: a context and a range of memory are needed"));
    cudaError_t e = scope.enter(ctx->device);
    if (e == cudaSuccess) e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return finish_err(err, failf(er, XKNN_ERROR_DEVICE, "cuda backend: cudaHostRegister of %zu bytes: %s", bytes,
                                     cudaGetErrorString(e)));
    }
    return finish_err(err, XKNN_SUCCESS);
}

void xknn_cuda_host_unregister(xknn_cuda_context *ctx, void *p)
{
    DeviceScope scope;
    if (!ctx || !p || scope.enter(ctx->device) != cudaSuccess) return;
    if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

xknn_status xknn_cuda_lists_kth(xknn_cuda_context *ctx, const int64_t *ids, float *kth, xknn_error *err)
{
    Err er = err_of(err);
    xknn_status st = XKNN_SUCCESS;
    DeviceScope scope;
    float *dk = NULL;
    ListMirror m;
    if (!ctx || !ids || !kth)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_lists_kth: NULL argument"));
    /* (the set stays in the table: only fetch_lists, which the caller does not run
     * meanwhile, frees it) */
    if (!kept_lists_find(ctx, ids, 0, &m))
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                                     "xknn_cuda_lists_kth: the context keeps no lists that begin there"));
    XKNN__CUDA_CHECK(scope.enter(ctx->device));
    XKNN__CUDA_CHECK(cudaMalloc((void **)&dk, (size_t)m.rows * sizeof(float)));
    XKNN__CUDA_CHECK(launch_lists_last(m.ids, m.dist, m.rows, m.k, dk, ctx->sms, ctx->stream));
    XKNN__CUDA_CHECK(cudaMemcpyAsync(kth, dk, (size_t)m.rows * sizeof(float), cudaMemcpyDeviceToHost, ctx->stream));
    XKNN__CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
cleanup:
    if (dk) {
        (void)cudaStreamSynchronize(ctx->stream);
        cudaFree(dk);
    }
    return finish_err(err, st);
}

int xknn_cuda_path_for(const xknn_params *params, int64_t n, int64_t nq, int64_t d, int64_t k)
{
    const xknn_params prm = params ? *params : xknn_params_default();
    return choose_path(&prm, n, nq, d, k);
}

xknn_status xknn_cuda_workspace_size(xknn_cuda_context *ctx, const xknn_params *params, int64_t n, int64_t nq,
                                     int64_t d, int64_t k, size_t *bytes, xknn_error *err)
{
    Err er = err_of(err);
    xknn_params prm = params ? *params : xknn_params_default();
    xknn_status st = XKNN_SUCCESS;
    DeviceScope scope;
    Plan plan;
    size_t budget = 0, min_needed = 0;
    if (!ctx || !bytes)
        return finish_err(err, failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_workspace_size: ctx or bytes is NULL"));
    *bytes = 0;
    XKNN__TRY(check_sizes(er, &prm, n, nq, d, k, d, d));
    XKNN__TRY(device_metric_check(er, ctx, &prm, n, d, k, "xknn_cuda_workspace_size"));
    if (!prm.device_memory_budget) XKNN__CUDA_CHECK(scope.enter(ctx->device));
    budget = budget_of(&prm, nullptr, er, &st); /* (the caller allocates the workspace: not from the pool) */
    if (st != XKNN_SUCCESS) goto cleanup;
    if (choose_path(&prm, n, nq, d, k) == XKNN_CUDA_PATH_FUSED &&
        plan_fused(ctx, &prm, n, nq, d, k, budget, 0, &plan, &min_needed)) {
        *bytes = plan.bytes;
        goto cleanup;
    }
    if (!plan_fit(ctx, &prm, n, nq, d, k, n, budget, 0, 0, &plan, &min_needed)) {
        st = failf(er, XKNN_ERROR_OUT_OF_MEMORY,
                   "cuda backend: device memory budget of %zu bytes is below the minimum workspace of %zu bytes "
                   "(n=%lld, d=%lld, k=%lld)",
                   budget, min_needed, (long long)n, (long long)d, (long long)k);
        goto cleanup;
    }
    *bytes = plan.bytes;
cleanup:
    return finish_err(err, st);
}

xknn_status xknn_cuda_search(xknn_cuda_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                             const xknn_matrix *query, int64_t k, int64_t *ids, float *dist, void *workspace,
                             size_t workspace_bytes, xknn_error *err, struct CUstream_st *stream)
{
    Err er = err_of(err);
    xknn_params prm = params ? *params : xknn_params_default();
    xknn_status st = XKNN_SUCCESS;
    DeviceScope scope;
    Plan plan;
    Run run;
    size_t min_needed = 0;
    int64_t n, nq, d, ldr, ldq, avail;
    const float *R, *Q;
    cudaStream_t cs = (cudaStream_t)stream;

    if (!ctx || !ref || !ref->data || !ids || !workspace) {
        st = failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_search: ctx, ref, ref->data, ids and workspace must not be NULL");
        goto cleanup;
    }
    if (ref->dtype != XKNN_DTYPE_F32 || (query && query->dtype != XKNN_DTYPE_F32)) {
        st = failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_search: float32 matrices only");
        goto cleanup;
    }
    if (query && !query->data) {
        st = failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_search: query->data is NULL");
        goto cleanup;
    }
    n = ref->rows;
    d = ref->cols;
    ldr = ref->ld ? ref->ld : ref->cols;
    R = (const float *)ref->data;
    if (query) {
        if (query->cols != d) {
            st = failf(er, XKNN_ERROR_INVALID_ARGUMENT,
                       "dimension mismatch: reference has d=%lld, query has d=%lld", (long long)d,
                       (long long)query->cols);
            goto cleanup;
        }
        nq = query->rows;
        ldq = query->ld ? query->ld : query->cols;
        Q = (const float *)query->data;
    } else {
        nq = n;
        ldq = ldr;
        Q = R;
        prm.exclude_self = 1;
        prm.query_id_offset = prm.ref_id_offset;
    }
    if (ldr < d || ldq < d) {
        st = failf(er, XKNN_ERROR_INVALID_ARGUMENT, "leading dimension (%lld, %lld) is smaller than d=%lld",
                   (long long)ldr, (long long)ldq, (long long)d);
        goto cleanup;
    }
    XKNN__TRY(check_sizes(er, &prm, n, nq, d, k, ldr, ldq));
    XKNN__TRY(device_metric_check(er, ctx, &prm, n, d, k, "xknn_cuda_search"));
    avail = n;
    if (prm.exclude_self) {
        const int64_t q0 = prm.query_id_offset, q1 = q0 + nq, r0 = prm.ref_id_offset, r1 = r0 + n;
        if (q0 < r1 && r0 < q1) avail = n - 1;
    }
    if (k > avail && !prm.pad_missing) {
        st = failf(er, XKNN_ERROR_INVALID_ARGUMENT, "k=%lld is larger than the %lld available references",
                   (long long)k, (long long)avail);
        goto cleanup;
    }
    if (((uintptr_t)workspace) % kAlign) {
        st = failf(er, XKNN_ERROR_INVALID_ARGUMENT, "xknn_cuda_search: workspace must be 256-byte aligned");
        goto cleanup;
    }
    if (choose_path(&prm, n, nq, d, k) == XKNN_CUDA_PATH_FUSED &&
        plan_fused(ctx, &prm, n, nq, d, k, workspace_bytes, 0, &plan, &min_needed)) {
        XKNN__CUDA_CHECK(scope.enter(ctx->device));
        XKNN__CUDA_CHECK(cudaMemsetAsync((char *)workspace + plan.off_stats, 0, sizeof(unsigned long long) * kStatCount, cs));
        for (int64_t q0 = 0; q0 < nq; q0 += plan.QS) {
            const int64_t qs = min64(plan.QS, nq - q0);
            XKNN__TRY(fused_block(ctx, plan, workspace, cs, Q + q0 * ldq, ldq, qs, R, ldr, prm.exclude_self,
                                  prm.query_id_offset + q0 - prm.ref_id_offset, ids + q0 * k, dist ? dist + q0 * k : NULL,
                                  prm.ref_id_offset, er));
        }
        goto cleanup;
    }
    if (!plan_fit(ctx, &prm, n, nq, d, k, n, workspace_bytes, 0, 0, &plan, &min_needed)) {
        st = failf(er, XKNN_ERROR_OUT_OF_MEMORY,
                   "cuda backend: workspace of %zu bytes is below the minimum of %zu bytes (n=%lld, d=%lld, k=%lld)",
                   workspace_bytes, min_needed, (long long)n, (long long)d, (long long)k);
        goto cleanup;
    }
    XKNN__CUDA_CHECK(scope.enter(ctx->device));
    run = run_bind(ctx, &plan, workspace, cs);
    XKNN__TRY(run_start(run, er));
    for (int64_t q0 = 0; q0 < nq; q0 += plan.QS) {
        const int64_t qs = min64(plan.QS, nq - q0);
        const float *Qb = Q + q0 * ldq;
        XKNN__TRY(block_begin(run, Qb, ldq, qs, er));
        XKNN__TRY(block_pass(run, Qb, ldq, qs, prm.exclude_self, prm.query_id_offset + q0 - prm.ref_id_offset, R,
                             ldr, n, 0, er));
        XKNN__TRY(block_finish(run, qs, ids + q0 * k, dist ? dist + q0 * k : NULL, prm.ref_id_offset, er));
    }
cleanup:
    return finish_err(err, st);
}

} /* extern "C" */
