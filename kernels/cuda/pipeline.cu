/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/pipeline.cu -- the device-level pipeline of one state block on the
 * device: cuBLAS bound to the call's stream and workspace, the GEMM path's passes (tiles
 * filtered while they are in L2), the tensor-core passes, the fused path's launches and
 * the final selection. Every function only enqueues on the run's stream; none
 * synchronises. The plans and workspaces it runs are plan.cu's.
 */
#include "engine.cuh"

namespace xknn_cuda {

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
 * pass (its hot loop's registers are allocated less well), so it carries them only for
 * kk >= n / kFfmaCarryRatio; mma_kernel always does. */
static int mma_prunes(const Plan &p)
{
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

/* The final selection's parameters for a block of queries whose candidate state is tau,
 * cnt, cand, mcount (S slices of cap slots, kk kept a query) with statistics stats: ids
 * and dist (ld k, dist NULL: none) with ids from id_offset; encoded and negate as
 * FinalParams says; the shared-memory merge where the device has room for it. Every
 * final selection on the device (block_finish, the canonical tiles, the int8 tiles)
 * starts from this. */
FinalParams final_params(const xknn_cuda_context *ctx, const float *tau, const int *cnt, Cand *cand, long long *mcount,
                         unsigned long long *stats, int64_t S, int64_t cap, int64_t kk, int64_t *ids, float *dist,
                         int64_t k, int64_t id_offset, int encoded, int negate)
{
    FinalParams fp;
    memset(&fp, 0, sizeof fp);
    fp.tau = tau;
    fp.cnt = cnt;
    fp.cand = cand;
    fp.mcount = mcount;
    fp.ids = ids;
    fp.dist = dist;
    fp.k = k;
    fp.id_offset = id_offset;
    fp.stats = stats;
    fp.S = (int)S;
    fp.cap = (int)cap;
    fp.kk = (int)kk;
    fp.encoded = encoded;
    fp.negate = negate;
    fp.smem_merge = ctx->smem_optin >= kFinalMergeSmem;
    return fp;
}

xknn_status block_finish(const Run &r, int64_t qs, int64_t *ids, float *dist, int64_t id_offset, Err er)
{
    const Plan &p = *r.p;
    const int ip = p.kind == kCanonIp;
    xknn_status st = XKNN_SUCCESS;
    const FinalParams fp =
        final_params(r.ctx, r.tau, r.cnt, r.cand, r.mcount, r.stats, p.S, p.cap, p.kk, ids, dist, p.k, id_offset, ip, ip);
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

/* A run's statistics counted final candidates without a canonical value (they must
 * stay 0): the INTERNAL error that says how many. */
xknn_status unresolved_error(const unsigned long long *stats, Err er)
{
    return failf(er, XKNN_ERROR_INTERNAL, "cuda backend: %llu final candidates had no canonical distance",
                 stats[kStatUnresolved]);
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

} // namespace xknn_cuda
