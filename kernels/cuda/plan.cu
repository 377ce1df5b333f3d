/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/plan.cu -- the planner: the path a search takes (choose_path), each path's
 * plan and workspace layout (one layout function per path, used by the size query and by
 * the search alike), the error bounds a plan carries, and the validation of sizes. A
 * plan depends only on the shapes, the parameters and the device's properties.
 *
 * PATHS: choose_path picks the fused path (fused.cu: distances and warp selection in one
 * kernel, for small d and k), the tensor-core path (mma.cu: TF32 mma tiles with the
 * filter in their epilogue, references resident, d <= 128) or the GEMM pipeline
 * (pipeline.cu; cuBLAS fp32 or TF32 candidates); the fused plan and workspace come from plan_fused,
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
 * come from its memory pool (host_fused.cu, staging.cu).
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
#include "engine.cuh"
#include "xknn/impl/knobs.h"

namespace xknn_cuda {

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
 * XKNN_CUDA_PATH_FUSED, or by AUTO for the small shapes of tune.cuh (kFusedAuto*). */
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
 * row (d floats); C (witness_c, tune.cuh) balances the two. At least kMmaWitnessRatio kk
 * witness groups, at least kMmaMinPrefix references.
 * cap: twice the expected candidates (times 3 for the bound's band) plus slack; a query
 * that overflows it is re-run exactly (counted in XKNN_CUDA_STAT_RERUNS). */
/* C for kk neighbours (def: the int8 path's fixed constant, else 0), or
 * XKNN_CUDA_WITNESS_C when set to a positive number (a diagnostic for tuning the balance;
 * any value gives the same results, only the work moves) */
double witness_c(int64_t kk, double def)
{
    const char *e = xknn__knob(XKNN__KNOB_CUDA_WITNESS_C);
    const double v = e && *e ? atof(e) : 0.0;
    if (v > 0.0) return v;
    if (def > 0.0) return def;
    return kk <= kMmaWitnessSmallK ? kMmaWitnessSmallC : kMmaWitnessC;
}

/* ---- estimated thresholds (large k) --------------------------------------------------
 * A rigorous tau from a prefix of nA references is at best the kk-th neighbour within the
 * prefix, so about kk n / nA references pass it: for large kk the prefix must be most of
 * the references (k = 4096 at n = 1M: 905k, pass A about a full GEMM). Instead, tau may
 * be ESTIMATED from a short prefix and CERTIFIED after the re-rank (filter.cu's resolve):
 * if at least kk candidates have a canonical value <= tau, no reference left out can be
 * in the top kk, whatever tau was; a query with fewer is searched again exactly
 * (mma_rescue_kernel): docs/DESIGN.md section 2.3, "a query whose certificate
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
/* The estimate's prefix (0: none) and its rank ej for kk of n references, where a
 * rigorous tau would need nA_rig. */
int64_t plan_estimate(int64_t n, int64_t kk, int64_t nA_rig, int64_t *ej)
{
    const char *e = xknn__knob(XKNN__KNOB_CUDA_NO_ESTIMATE);
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
 * launches, which pay where the passes have many pairs: n nq >= kCenterMinPairs.
 * XKNN_CUDA_CENTER (a diagnostic: the results are the same bytes, only the candidates
 * change): 1 centres every shape, 0 none. */
int center_wanted(const Plan &p)
{
    if (!(p.tf32 && (p.kind == kCanonL2 || p.kind == kCanonEuclid))) return 0;
    const char *e = xknn__knob(XKNN__KNOB_CUDA_CENTER);
    if (e && *e) return *e != '0';
    return (double)p.n * (double)p.nq >= kCenterMinPairs;
}

int plan_mma(const xknn_cuda_context *ctx, const xknn_params *prm, int64_t n, int64_t nq, int64_t d, int64_t k,
             size_t limit, size_t per_query_extra, int ffma, Plan *out, int estimate)
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
        const char *ms = xknn__knob(XKNN__KNOB_CUDA_MMA_SYNC);
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
     * whose distances are small next to the norms, overflow nearly every query with the
     * estimate's cap) */
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
        const char *e = xknn__knob(XKNN__KNOB_CUDA_RESOLVE_RANGES);
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
    const char *e = xknn__knob(XKNN__KNOB_CUDA_FP32_CUBLAS);
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

} // namespace xknn_cuda
