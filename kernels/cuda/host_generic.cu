/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/host_generic.cu -- the generic path for host arrays: every metric and
 * dtype the certified fast paths do not cover, through generic.cu's canonical tiles,
 * with its single device allocation (GenPlan) and the references resident or streamed.
 */
#include "engine.cuh"

namespace xknn_cuda {

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
        memset(&gp, 0, sizeof gp);
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
        const FinalParams fp = final_params(ctx, (const float *)(b + g.off_tau), gp.cnt, gp.cand,
                                            (long long *)(b + g.off_mcount), gp.stats, g.S, g.cap, g.kk,
                                            (int64_t *)(b + g.off_ids), job->dist ? (float *)(b + g.off_dist) : NULL, k,
                                            prm->ref_id_offset, 1, gp.negate);
        XKNN__CUDA_CHECK(launch_final(fp, (int)qs, sc));
        XKNN__TRY(results_out(ctx, own_ctx == NULL, job->ids + q0 * k, fp.ids, job->dist ? job->dist + q0 * k : NULL,
                              fp.dist, (size_t)(qs * k), prm->num_threads, sc, &piece, er));
    }
    XKNN__CUDA_CHECK(sync_stream(ctx, sc)); /* (asleep: a pageable copy would spin on the passes) */
    XKNN__CUDA_CHECK(cudaMemcpyAsync(stats, b + g.off_stats, sizeof stats, cudaMemcpyDeviceToHost, sc));
    XKNN__CUDA_CHECK(sync_stream(ctx, sc));
    if (prm->verbose) fprintf(stderr, "xknn: cuda: %llu candidates appended\n", stats[kStatAppended]);

cleanup:
    if (sc) (void)sync_stream(ctx, sc);
    hb.release();
    if (sc) (void)sync_stream(ctx, sc);
    if (own_ctx) xknn_cuda_context_destroy(own_ctx);
    return st;
}

} // namespace xknn_cuda
