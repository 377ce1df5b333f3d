/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/host_imma.cu -- the exact int8 tensor-core path (imma.cu) for host arrays:
 * u8 / i8 with l2, euclidean or ip and bit-packed hamming, references resident.
 */
#include "engine.cuh"
#include "xknn/impl/knobs.h"

namespace xknn_cuda {

/* ---- exact int8 tensor-core path (imma.cu) ---------------------------------------- */
/* Padded row bytes when the job takes the int8 tensor-core path, else 0: u8/i8 with l2,
 * euclidean or ip, d <= XKNN_INT8_EXACT_MAX_D, or hamming on bit-packed rows (b1 tensor
 * cores); the resident queries within shared memory,
 * at least kMmaWitnessRatio kk witness groups (as the TF32 path). XKNN_CUDA_NO_IMMA=1 (diagnostic)
 * keeps the canonical tiles. */
int64_t imma_rows(const xknn__job *job, const xknn_cuda_context *ctx)
{
    const xknn_metric m = job->params.metric;
    const char *off = xknn__knob(XKNN__KNOB_CUDA_NO_IMMA);
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

/* Offsets into the int8 path's single device allocation, for state blocks of QS queries
 * (raw: the packed input rows; rawq: the queries' own area on a staged call). */
struct ImmaLayout {
    size_t stats, R, rsum, rsq, ncol, raw, rawq, Q, qsum, qsq, gmin, th, cnt, tau, mcount, cand, ids, dist, bytes;
};

static void imma_layout(ImmaLayout &w, const xknn__job *job, int64_t QS, int64_t dp, int64_t ga, int64_t cap,
                        size_t raw_row, int self_res, int staged, int wgmma)
{
    const int64_t n = job->n, k = job->k;
    size_t o = 0;
    auto take = [&](size_t bytes) {
        const size_t at = o;
        o = align_up(o + bytes);
        return at;
    };
    w.stats = take(sizeof(unsigned long long) * kStatCount);
    w.R = take((size_t)n * dp);
    w.rsum = take((size_t)n * sizeof(int));
    w.rsq = take((size_t)n * sizeof(int));
    w.ncol = take(wgmma ? imma_ncol_entries(n) * sizeof(int) : 0);
    w.raw = take((size_t)max64(self_res || staged ? n : max64(n, QS), 1) * raw_row);
    w.rawq = staged && !self_res ? take((size_t)QS * raw_row) : w.raw;
    w.Q = take(self_res ? 0 : (size_t)QS * dp);
    w.qsum = take(self_res ? 0 : (size_t)QS * sizeof(int));
    w.qsq = take(self_res ? 0 : (size_t)QS * sizeof(int));
    w.gmin = take((size_t)QS * ga * sizeof(long long));
    w.th = take((size_t)QS * sizeof(long long));
    w.cnt = take((size_t)QS * sizeof(int));
    w.tau = take((size_t)QS * sizeof(float));
    w.mcount = take((size_t)QS * sizeof(long long));
    w.cand = take((size_t)QS * cap * sizeof(Cand));
    w.ids = take((size_t)QS * k * sizeof(int64_t));
    w.dist = take(job->dist ? (size_t)QS * k * sizeof(float) : 0);
    w.bytes = o;
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
    ImmaLayout w;
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
    const char *ms = xknn__knob(XKNN__KNOB_CUDA_MMA_SYNC);
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
        imma_layout(w, job, QS, dp, ga, cap, raw_row, self_res, staged, imma_wgmma);
        if (w.bytes <= budget) break;
        if (QS == 1) return XKNN_SUCCESS; /* does not fit: canonical tiles */
    }
    if (hb.alloc(&hb.dWs, w.bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return XKNN_SUCCESS;
    }
    *done = 1;
    if (prm->verbose)
        fprintf(stderr,
                "xknn: cuda: %s on %s (%s), exact integer tensor cores: %lld queries per block, witnesses over "
                "%lld references (%lld groups), %lld candidate slots, workspace %.1f MiB of a %.1f MiB budget\n",
                xknn_metric_name(prm->metric), xknn_dtype_name(job->dtype), ctx->name, (long long)QS, (long long)nA,
                (long long)ga, (long long)cap, (double)w.bytes / 1048576.0, (double)budget / 1048576.0);
    b = (char *)hb.dWs;
    if (prm->verbose) { /* -v: the device time after the reference upload, for benchmarks */
        for (int i = 0; i < 7; ++i) XKNN__CUDA_CHECK(cudaEventCreateWithFlags(&ev[i], cudaEventBlockingSync));
        XKNN__CUDA_CHECK(cudaEventRecord(ev[0], sc));
    }
    XKNN__CUDA_CHECK(cudaMemsetAsync(b + w.stats, 0, sizeof(unsigned long long) * kStatCount, sc));
    if (staged) {
        XKNN__TRY(stage_bytes(ctx, b + w.raw, (const char *)job->ref_data, n, raw_row, (size_t)job->ldr * ub,
                              prm->num_threads, &piece, er));
        XKNN__CUDA_CHECK(cudaStreamWaitEvent(sc, ctx->stage_done[(piece - 1) & 1], 0));
    } else {
        XKNN__CUDA_CHECK(cudaMemcpy2DAsync(b + w.raw, raw_row, job->ref_data, (size_t)job->ldr * ub, raw_row,
                                           (size_t)n, cudaMemcpyHostToDevice, sc));
    }
    if (ev[1]) XKNN__CUDA_CHECK(cudaEventRecord(ev[1], sc));
    XKNN__CUDA_CHECK(launch_imma_prep(b + w.raw, (int64_t)(raw_row / ub), n, d, dp, shift, (signed char *)(b + w.R),
                                      (int *)(b + w.rsum), (int *)(b + w.rsq), sc));
    for (int64_t q0 = 0; q0 < nq; q0 += QS) {
        const int64_t qs = min64(QS, nq - q0);
        ImmaParams ip;
        memset(&ip, 0, sizeof ip);
        if (ev[3]) XKNN__CUDA_CHECK(cudaEventRecord(ev[3], sc));
        if (self_res) {
            ip.Q = (const signed char *)(b + w.R) + q0 * dp;
            ip.qsum = (const int *)(b + w.rsum) + q0;
            ip.qsq = (const int *)(b + w.rsq) + q0;
        } else {
            const char *hq = (const char *)job->query_data + (size_t)q0 * job->ldq * ub;
            if (staged) {
                XKNN__TRY(stage_bytes(ctx, b + w.rawq, hq, qs, raw_row, (size_t)job->ldq * ub, prm->num_threads,
                                      &piece, er));
                XKNN__CUDA_CHECK(cudaStreamWaitEvent(sc, ctx->stage_done[(piece - 1) & 1], 0));
            } else {
                XKNN__CUDA_CHECK(cudaMemcpy2DAsync(b + w.rawq, raw_row, hq, (size_t)job->ldq * ub, raw_row,
                                                   (size_t)qs, cudaMemcpyHostToDevice, sc));
            }
            XKNN__CUDA_CHECK(launch_imma_prep(b + w.rawq, (int64_t)(raw_row / ub), qs, d, dp, shift,
                                              (signed char *)(b + w.Q), (int *)(b + w.qsum), (int *)(b + w.qsq),
                                              sc));
            ip.Q = (const signed char *)(b + w.Q);
            ip.qsum = (const int *)(b + w.qsum);
            ip.qsq = (const int *)(b + w.qsq);
        }
        ip.R = (const signed char *)(b + w.R);
        ip.rsum = (const int *)(b + w.rsum);
        ip.rsq = (const int *)(b + w.rsq);
        ip.n = n;
        ip.nA = nA;
        ip.ga = ga;
        ip.d = d;
        ip.dp = dp;
        ip.self_local0 = prm->query_id_offset + q0 - prm->ref_id_offset;
        ip.gmin = (long long *)(b + w.gmin);
        ip.th = (long long *)(b + w.th);
        ip.cnt = (int *)(b + w.cnt);
        ip.cand = (Cand *)(b + w.cand);
        ip.stats = (unsigned long long *)(b + w.stats);
        ip.qs = (int)qs;
        ip.cap = (int)cap;
        ip.exclude = prm->exclude_self;
        ip.ip = prm->metric == XKNN_METRIC_IP;
        ip.shift = shift > 0;
        ip.bin = bin;
        ip.euclid = prm->metric == XKNN_METRIC_EUCLIDEAN;
        ip.wgmma_optin = imma_wgmma ? (int)ctx->smem_optin : 0;
        ip.ncol = imma_wgmma ? (int *)(b + w.ncol) : NULL;
        if (ev[4]) XKNN__CUDA_CHECK(cudaEventRecord(ev[4], sc));
        XKNN__CUDA_CHECK(launch_init_state((float *)(b + w.tau), ip.cnt, (int)qs, 1, sc));
        XKNN__CUDA_CHECK(launch_imma(ip, (int)kk, ctx->sms, sc));
        const FinalParams fp = final_params(ctx, (const float *)(b + w.tau), ip.cnt, ip.cand,
                                            (long long *)(b + w.mcount), ip.stats, 1, cap, kk,
                                            (int64_t *)(b + w.ids), job->dist ? (float *)(b + w.dist) : NULL, k,
                                            prm->ref_id_offset, 1, ip.ip);
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
    XKNN__CUDA_CHECK(sync_stream(ctx, sc)); /* (asleep: a pageable copy would spin on the passes) */
    XKNN__CUDA_CHECK(cudaMemcpyAsync(stats, b + w.stats, sizeof stats, cudaMemcpyDeviceToHost, sc));
    XKNN__CUDA_CHECK(sync_stream(ctx, sc));
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
    if (staged && ctx->copy_stream) (void)sync_stream(ctx, ctx->copy_stream);
    (void)sync_stream(ctx, sc);
    hb.release();
    (void)sync_stream(ctx, sc);
    return st;
}

} // namespace xknn_cuda
