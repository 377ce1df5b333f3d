/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/host_fused.cu -- the fused path for host arrays: the references resident
 * (staged in quarters, each launch of slices waiting only for its quarter) and the
 * queries in state blocks of the fused plan.
 */
#include "engine.cuh"

namespace xknn_cuda {

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
    /* the values xknn_search left to the backend, checked here as they arrive (a
     * temporary context's call, not staged, had them scanned on the host) */
    const int dev_check = staged && finite_pending(job);

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
    if (dev_check) XKNN__CUDA_CHECK(finite_begin(ctx, s));
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
                if (dev_check && z0 == 0 && !self_res) XKNN__CUDA_CHECK(finite_check(ctx, 1, dQ, qs, d, 0, s));
                if (dev_check) XKNN__CUDA_CHECK(finite_check(ctx, 0, dR + r0 * d, r1 - r0, d, r0, s));
            }
        } else {
            if (!self_res) {
                if (staged) {
                    /* the previous block's kernels read dQ until they finish */
                    XKNN__CUDA_CHECK(sync_stream(ctx, s));
                    XKNN__TRY(stage_rows(ctx, dQ, job->query + q0 * job->ldq, qs, d, job->ldq, threads, &piece, er));
                    XKNN__CUDA_CHECK(cudaStreamWaitEvent(s, ctx->stage_done[(piece - 1) & 1], 0));
                    if (dev_check) XKNN__CUDA_CHECK(finite_check(ctx, 1, dQ, qs, d, q0, s));
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
        XKNN__CUDA_CHECK(sync_stream(ctx, s));
        fprintf(stderr, "xknn: cuda: fused path: %llu candidates re-ranked, %llu queries re-run exactly\n",
                stats[kStatAppended], stats[kStatReruns]);
    }
    if (dev_check) XKNN__CUDA_CHECK(finite_fetch(ctx, s));
    XKNN__CUDA_CHECK(sync_stream(ctx, s));
    if (dev_check) XKNN__TRY(finite_end(ctx, job, er));
cleanup:
    if (staged && ctx->copy_stream) (void)sync_stream(ctx, ctx->copy_stream);
    if (mem) {
        if (ctx->pool)
            (void)cudaFreeAsync(mem, s);
        else
            (void)cudaFree(mem);
    }
    (void)sync_stream(ctx, s);
    return st;
}

} // namespace xknn_cuda
