/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/entry.cu -- the entry points: the backend's (xknn__cuda_search,
 * xknn__cuda_pair; include/xknn/impl/backend.h), which route a host-array job to its path
 * (host_search), and the embedding API on device pointers (xknn_cuda_workspace_size,
 * xknn_cuda_search; include/xknn/cuda.h).
 */
#include "engine.cuh"
#include "xknn/impl/knobs.h"

namespace xknn_cuda {

static_assert(kStatUnion == XKNN_CUDA_STAT_BOUND_COMPACTIONS && kStatExact == XKNN_CUDA_STAT_EXACT_COMPACTIONS &&
                  kStatAppended == XKNN_CUDA_STAT_CANDIDATES && kStatUnresolved == XKNN_CUDA_STAT_UNRESOLVED &&
                  kStatReruns == XKNN_CUDA_STAT_RERUNS && kStatCount == XKNN_CUDA_STAT_COUNT,
              "workspace counters and their public names disagree");

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

/* The host scan of the f32 values xknn_search left to the backend (finite_pending), for
 * a path that does not check them on the device: *job becomes *copy, marked checked. */
static xknn_status scan_on_host(const xknn__job **job, xknn__job *copy, Err er)
{
    if (!finite_pending(*job)) return XKNN_SUCCESS;
    const xknn_status st = finite_host_scan(*job, er);
    *copy = **job;
    copy->params.values_checked = 1;
    *job = copy;
    return st;
}

/* host_search's plan and buffers: the references resident where they fit the budget,
 * else streamed in chunks; an allocation failure shrinks the budget and plans again. */
static xknn_status plan_alloc(const xknn__job *job, xknn_cuda_context *ctx, size_t budget, int self_res, Plan *out,
                              HostBuffers &hb, int *resident, int64_t *chunk_out, Err er)
{
    const xknn_params *prm = &job->params;
    const int64_t n = job->n, nq = job->nq, d = job->d, k = job->k;
    const size_t row_bytes = (size_t)d * sizeof(float);
    const size_t per_q_out = (size_t)k * sizeof(int64_t) + (job->dist ? (size_t)k * sizeof(float) : 0);
    Plan &plan = *out;
    size_t min_needed = 0;
    int64_t chunk = 0;
    int have_plan = 0;
    xknn_status st = XKNN_SUCCESS;
    for (int attempt = 0; attempt < 6 && !have_plan; ++attempt) {
        const size_t B = (size_t)((double)budget * pow(0.75, attempt));
        const size_t ref_bytes = (size_t)n * row_bytes;
        cudaError_t e = cudaSuccess;
        *resident = 0;
        if (B > ref_bytes &&
            plan_fit(ctx, prm, n, nq, d, k, n, B - ref_bytes, per_q_out + (self_res ? 0 : row_bytes), 0, &plan,
                     &min_needed)) {
            *resident = 1;
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
                return failf(er, XKNN_ERROR_OUT_OF_MEMORY,
                             "cuda backend: device memory budget of %zu bytes is below the minimum of %zu bytes "
                             "(n=%lld, d=%lld, k=%lld: one query, a 4-reference tile, %lld candidate slots, "
                             "two 1-row reference chunks)%s",
                             B, min_stream + 2 * row_bytes, (long long)n, (long long)d, (long long)k,
                             (long long)(2 * min64(k, n) + kCapSlack),
                             attempt ? " after allocation failures shrank it" : "");
            }
        }
        if (*resident) {
            e = hb.alloc((void **)&hb.dR, (size_t)n * row_bytes);
        } else {
            e = hb.alloc((void **)&hb.dChunk[0], (size_t)chunk * row_bytes);
            if (e == cudaSuccess) e = hb.alloc((void **)&hb.dChunk[1], (size_t)chunk * row_bytes);
        }
        if (e == cudaSuccess && !(*resident && self_res)) e = hb.alloc((void **)&hb.dQ, (size_t)plan.QS * row_bytes);
        if (e == cudaSuccess) e = hb.alloc((void **)&hb.dIds, (size_t)plan.QS * k * sizeof(int64_t));
        if (e == cudaSuccess && job->dist) e = hb.alloc((void **)&hb.dDist, (size_t)plan.QS * k * sizeof(float));
        if (e == cudaSuccess) e = hb.alloc(&hb.dWs, plan.bytes);
        have_plan = alloc_outcome(hb, e, er, &st);
        if (have_plan < 0) return st;
    }
    *chunk_out = chunk;
    return have_plan ? XKNN_SUCCESS : fail_alloc_kept_failing(er, budget, plan.bytes);
}

xknn_status host_search(const xknn__job *job, Err er)
{
    xknn__job scanned;
    if (generic_job(job)) {
        const xknn_status cs = scan_on_host(&job, &scanned, er);
        return cs != XKNN_SUCCESS ? cs : host_generic(job, er);
    }
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
    int resident = 0, dev_check = 0;
    int64_t chunk = 0;
    int piece = 0;
    unsigned long long stats[kStatCount];

    memset(&plan, 0, sizeof plan);
    XKNN__TRY(host_begin(job, scope, &ctx, &own_ctx, &budget, er));
    /* (a temporary context has no staging ring: its copies are plain, its scan the host's) */
    if (own_ctx) XKNN__TRY(scan_on_host(&job, &scanned, er));

    /* The symmetric self-join where it applies (else the plain search, -v says why). */
    if (job->symmetric) {
        int done = 0, big = 0;
        XKNN__TRY(scan_on_host(&job, &scanned, er));
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
            XKNN__TRY(scan_on_host(&job, &scanned, er));
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

    XKNN__TRY(plan_alloc(job, ctx, budget, self_res, &plan, hb, &resident, &chunk, er));
    if (prm->verbose) print_plan(ctx, plan, resident ? "resident references" : "streamed references", budget, chunk);

    if (!resident) {
        XKNN__CUDA_CHECK(cudaStreamCreateWithFlags(&sx, cudaStreamNonBlocking));
        for (int b = 0; b < 2; ++b) {
            XKNN__CUDA_CHECK(cudaEventCreateWithFlags(&h2d_done[b], kHostWaitEvent));
            XKNN__CUDA_CHECK(cudaEventCreateWithFlags(&use_done[b], cudaEventDisableTiming));
            XKNN__CUDA_CHECK(cudaHostAlloc((void **)&hb.pinned[b], (size_t)chunk * row_bytes, cudaHostAllocDefault));
        }
    }
    /* the values: on the device as they arrive (resident references, staged), else here */
    if (!resident) XKNN__TRY(scan_on_host(&job, &scanned, er));
    dev_check = finite_pending(job);
    run = run_bind(ctx, &plan, hb.dWs, sc);
    XKNN__TRY(run_start(run, er));
    if (dev_check) XKNN__CUDA_CHECK(finite_begin(ctx, sc));
    if (resident && own_ctx == NULL) {
        XKNN__TRY(stage_rows(ctx, hb.dR, job->ref, n, d, job->ldr, prm->num_threads, &piece, er));
        XKNN__CUDA_CHECK(cudaStreamWaitEvent(sc, ctx->stage_done[(piece - 1) & 1], 0));
        if (dev_check) XKNN__CUDA_CHECK(finite_check(ctx, 0, hb.dR, n, d, 0, sc));
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
            if (dev_check) XKNN__CUDA_CHECK(finite_check(ctx, 1, hb.dQ, qs, d, q0, sc));
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
                 * (pool_copy: a chunk may be large) */
                XKNN__CUDA_CHECK(cudaEventSynchronize(h2d_done[b]));
                pool_copy(ctx, (char *)hb.pinned[b], (const char *)(job->ref + r0 * job->ldr), rows, row_bytes,
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
    /* the counters through pinned memory where there is some (a copy into pageable memory
     * waits for the stream inside the driver, spinning) */
    XKNN__CUDA_CHECK(cudaMemcpyAsync(own_ctx ? stats : ctx->finite_host + 2, run.stats, sizeof stats,
                                     cudaMemcpyDeviceToHost, sc));
    if (dev_check) XKNN__CUDA_CHECK(finite_fetch(ctx, sc));
    XKNN__CUDA_CHECK(sync_stream(ctx, sc));
    if (!own_ctx) memcpy(stats, ctx->finite_host + 2, sizeof stats);
    /* (a NaN's search ran on it: its message, not what the search made of it) */
    if (dev_check) XKNN__TRY(finite_end(ctx, job, er));
    if (prm->verbose)
        fprintf(stderr,
                "xknn: cuda: %llu candidates appended, %llu bound compactions, %llu exact compactions, %llu "
                "queries re-run exactly\n",
                stats[kStatAppended], stats[kStatUnion], stats[kStatExact], stats[kStatReruns]);
    if (stats[kStatUnresolved]) st = unresolved_error(stats, er);

cleanup:
    if (sc) (void)sync_stream(ctx, sc);
    if (sx) (void)sync_stream(ctx, sx);
    for (int b = 1; b >= 0; --b) {
        if (use_done[b]) cudaEventDestroy(use_done[b]);
        if (h2d_done[b]) cudaEventDestroy(h2d_done[b]);
    }
    if (sx) cudaStreamDestroy(sx);
    if (ctx && ctx->copy_stream) (void)sync_stream(ctx, ctx->copy_stream);
    hb.release(); /* sc is the context's stream: not destroyed */
    if (sc) (void)sync_stream(ctx, sc);
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
    /* (the slices' rows are scanned here, at their global row numbers) */
    if (finite_pending(job)) XKNN__TRY(finite_host_scan(job, er));
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
        sub.params.values_checked = 1;
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

} // namespace xknn_cuda

using namespace xknn_cuda;

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
    const char *env = xknn__knob(XKNN__KNOB_CUDA_REF_SLICE);
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
