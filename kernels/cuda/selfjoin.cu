/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/selfjoin.cu -- the symmetric self-join on the tensor-core path: every
 * point's state live at once (host_sym), or where that does not fit the device, the
 * blocked triangle of pair.cu's halves (host_sym_blocked). Output bits are the plain
 * search's.
 */
#include "engine.cuh"
#include "xknn/impl/knobs.h"

namespace xknn_cuda {

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
    const char *e = xknn__knob(XKNN__KNOB_CUDA_SYM_BAND);
    if (e && *e) {
        const long long v = atoll(e);
        return v <= 0 || most < 2 ? 0 : max64(2, min64((int64_t)v, most));
    }
    const int64_t W = ceil_div(p.nA, 2 * kMmaBN) + 1;
    if (W > most || 4 * (W - 1) < kMmaWitnessRatio * p.kk) return 0;
    return W;
}

static const char kSymNoFit[] = "the state of all n points does not fit the device memory budget";

const char *plan_sym(const xknn_cuda_context *ctx, const xknn__job *job, size_t budget, Plan *out,
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

/* One host_sym call: its arguments, plan, buffers and what its phases hand on. */
struct SymCall {
    SymCall(const xknn__job *job_, xknn_cuda_context *ctx_, int staged_, size_t budget_, Err er_, int64_t *mir_ids_,
            float *mir_dist_)
        : job(job_), ctx(ctx_), staged(staged_), budget(budget_), er(er_), mir_ids(mir_ids_), mir_dist(mir_dist_),
          prm(&job_->params), n(job_->n), d(job_->d), k(job_->k), row_bytes((size_t)d * sizeof(float))
    {
    }
    const xknn__job *job;
    xknn_cuda_context *ctx;
    int staged;
    size_t budget;
    Err er;
    int64_t *mir_ids;
    float *mir_dist;
    const xknn_params *prm;
    int64_t n, d, k;
    size_t row_bytes;
    HostBuffers hb;
    Plan plan;
    Run run;
    MmaParams mp;
    int64_t block = 0;
    size_t need = 0; /* the device bytes of the plan, the rows and the outputs */
    int piece = 0;
    int dev_out = 0, pipe = 0;
    const float *dR = NULL;
    int64_t ldx = 0, pool_cap = 0;
    cudaStream_t sc = nullptr;
    cudaEvent_t ev[4] = {NULL, NULL, NULL, NULL}; /* -v: phase times */
    cudaEvent_t fin[2] = {NULL, NULL};            /* pipelined output: block b's results enqueued */
    double h0 = 0.0, h_alloc = 0.0, h_up = 0.0;
};

/* The device buffers of the symmetric state (rows kept on the device are read there),
 * then the sorted triangle's buffer where it applies and fits. ok: 1 allocated, 0 the
 * state's allocation failed (the caller reports too big), -1 an error (returned). */
static xknn_status sym_alloc(SymCall &c, int *ok)
{
    const xknn__job *job = c.job;
    const xknn_params *prm = c.prm;
    const int64_t n = c.n, d = c.d, k = c.k, block = c.block;
    const Plan &plan = c.plan;
    HostBuffers &hb = c.hb;
    cudaStream_t sc = c.sc;
    Err er = c.er;
    xknn_status st = XKNN_SUCCESS;
    cudaError_t e;
    const int pipe = c.pipe, dev_out = c.dev_out;
    *ok = -1;
    /* rows the caller keeps on the device (xknn_cuda_keep_rows) are read there */
    c.dR = c.staged ? (const float *)kept_rows(c.ctx, job->ref, n, c.row_bytes, (size_t)job->ldr * sizeof(float), sc,
                                               prm->num_threads, &c.piece, er, &st)
                    : NULL;
    if (st != XKNN_SUCCESS) return st;
    e = c.dR ? cudaSuccess : hb.alloc((void **)&hb.dR, (size_t)n * c.row_bytes);
    if (e == cudaSuccess) e = hb.alloc(&hb.dWs, plan.bytes);
    if (e == cudaSuccess)
        e = hb.alloc((void **)&hb.dIds, (pipe || dev_out ? 2 : 1) * (size_t)block * k * sizeof(int64_t));
    if (e == cudaSuccess && (job->dist || dev_out))
        e = hb.alloc((void **)&hb.dDist, (pipe || dev_out ? 2 : 1) * (size_t)block * k * sizeof(float));
    *ok = alloc_outcome(hb, e, er, &st);
    if (*ok <= 0) return st;
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
        const char *e_pool = xknn__knob(XKNN__KNOB_CUDA_SYM_POOL);
        if (e_pool && *e_pool) pool_cap = max64(1, atoll(e_pool));
    }
    {
        const char *e_sort = xknn__knob(XKNN__KNOB_CUDA_SYM_SORT);
        const size_t sbytes = mma_sym_sort_bytes(n, ldx, pool_cap);
        if (plan.band && ldx % 4 == 0 && n < (1 << 30) && !(e_sort && *e_sort == '0') && c.need + sbytes <= c.budget &&
            hb.alloc(&hb.dSort, sbytes) != cudaSuccess) {
            (void)cudaGetLastError();
            hb.dSort = nullptr;
        }
    }
    c.ldx = ldx;
    c.pool_cap = pool_cap;
    return st;
}

/* The rows to the device (where they are not kept there); with -v, the upload timed on
 * its own. */
static xknn_status sym_upload(SymCall &c)
{
    const xknn__job *job = c.job;
    const xknn_params *prm = c.prm;
    const int64_t n = c.n, d = c.d;
    const size_t row_bytes = c.row_bytes;
    HostBuffers &hb = c.hb;
    cudaStream_t sc = c.sc;
    Err er = c.er;
    xknn_status st = XKNN_SUCCESS;
    if (c.dR) {
        /* (kept rows: on the device already) */
    } else if (c.staged) {
        XKNN__TRY(stage_rows(c.ctx, hb.dR, job->ref, n, d, job->ldr, prm->num_threads, &c.piece, er));
        XKNN__CUDA_CHECK(cudaStreamWaitEvent(sc, c.ctx->stage_done[(c.piece - 1) & 1], 0));
    } else {
        XKNN__CUDA_CHECK(cudaMemcpy2DAsync(hb.dR, row_bytes, job->ref, (size_t)job->ldr * sizeof(float), row_bytes,
                                           (size_t)n, cudaMemcpyHostToDevice, sc));
    }
    if (!c.dR) c.dR = hb.dR;
    if (prm->verbose) { /* upload time on its own (verbose runs only) */
        XKNN__CUDA_CHECK(sync_stream(c.ctx, sc));
        c.h_up = wall_seconds();
    }
cleanup:
    return st;
}

/* The state, the operand rows and norms, pass A (prefix or band) and the select, pass B
 * over the triangle (sorted by threshold where it can), and the exact re-runs. */
static xknn_status sym_passes(SymCall &c)
{
    const xknn_params *prm = c.prm;
    const int64_t n = c.n, d = c.d, ldx = c.ldx;
    const Plan &plan = c.plan;
    const float *dR = c.dR;
    xknn_cuda_context *ctx = c.ctx;
    HostBuffers &hb = c.hb;
    Run &run = c.run;
    MmaParams &mp = c.mp;
    cudaStream_t sc = c.sc;
    cudaEvent_t *ev = c.ev;
    Err er = c.er;
    xknn_status st = XKNN_SUCCESS;
    cudaError_t e;
    int unsorted;
    run = run_bind(ctx, &c.plan, hb.dWs, sc);
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
        for (int i = 0; i < 4; ++i) XKNN__CUDA_CHECK(cudaEventCreateWithFlags(&ev[i], cudaEventBlockingSync));
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
        e = launch_mma_sym_sort(mp, ldx, c.pool_cap, hb.dSort, ctx->sms, sc, &ms);
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
cleanup:
    return st;
}

/* Block b's results (buffer b & 1) to the host on the copy stream, once fin[b & 1]. */
static xknn_status sym_out(SymCall &c, int64_t b)
{
    const xknn__job *job = c.job;
    const int64_t block = c.block, k = c.k;
    const int64_t q0 = b * block, qs = min64(block, c.n - q0), o = (b & 1) * block * k;
    Err er = c.er;
    const cudaError_t w = cudaStreamWaitEvent(c.ctx->copy_stream, c.fin[b & 1], 0);
    if (w != cudaSuccess)
        return failf(er, XKNN_ERROR_DEVICE, "cuda backend: %s: %s (output stream)", cudaGetErrorName(w),
                     cudaGetErrorString(w));
    return results_out(c.ctx, 1, job->ids + q0 * k, c.hb.dIds + o, job->dist ? job->dist + q0 * k : NULL,
                       c.hb.dDist ? c.hb.dDist + o : NULL, (size_t)(qs * k), c.prm->num_threads, c.ctx->copy_stream,
                       &c.piece, er);
}

/* The resolve and final selection block by block, each block's results merged into the
 * device lists (a list mirror), or to the host: at once, or pipelined on the copy
 * stream while the next block computes. */
static xknn_status sym_deliver(SymCall &c)
{
    const xknn__job *job = c.job;
    const xknn_params *prm = c.prm;
    const int64_t n = c.n, d = c.d, k = c.k, block = c.block;
    const int pipe = c.pipe;
    const float *dR = c.dR;
    xknn_cuda_context *ctx = c.ctx;
    HostBuffers &hb = c.hb;
    const Run &run = c.run;
    cudaStream_t sc = c.sc;
    Err er = c.er;
    xknn_status st = XKNN_SUCCESS;
    if (pipe)
        for (int i = 0; i < 2; ++i) XKNN__CUDA_CHECK(cudaEventCreateWithFlags(&c.fin[i], kHostWaitEvent));
    for (int64_t q0 = 0, b = 0; q0 < n; q0 += block, ++b) {
        const int64_t qs = min64(block, n - q0);
        const int64_t o = pipe ? (b & 1) * block * k : 0;
        Run rb = run; /* the run's state from query q0 on */
        rb.tau = run.tau + q0;
        rb.cnt = run.cnt + q0;
        rb.cand = run.cand + q0 * c.plan.cap;
        XKNN__CUDA_CHECK(launch_resolve(resolve_params(rb, dR + q0 * d, d, dR, d, 0), (int)qs, sc));
        XKNN__TRY(block_finish(rb, qs, hb.dIds + o, hb.dDist ? hb.dDist + o : NULL, prm->ref_id_offset, er));
        if (c.dev_out) {
            XKNN__CUDA_CHECK(launch_lists_merge(c.mir_ids + q0 * k, c.mir_dist + q0 * k, hb.dIds, hb.dDist, qs, k,
                                                prm->metric == XKNN_METRIC_IP, hb.dIds + block * k,
                                                hb.dDist + block * k, ctx->sms, sc));
            continue;
        }
        if (!pipe) {
            XKNN__TRY(results_out(ctx, c.staged, job->ids + q0 * k, hb.dIds, job->dist ? job->dist + q0 * k : NULL,
                                  hb.dDist, (size_t)(qs * k), prm->num_threads, sc, &c.piece, er));
            continue;
        }
        /* block b's results are enqueued; block b - 1's go out on the copy stream while
         * they compute (its buffer is written again by block b + 1, enqueued only after
         * results_out has returned) */
        XKNN__CUDA_CHECK(cudaEventRecord(c.fin[b & 1], sc));
        if (b > 0) XKNN__TRY(sym_out(c, b - 1));
    }
    if (pipe) XKNN__TRY(sym_out(c, (n - 1) / block));
cleanup:
    return st;
}

/* *done = 0 (and XKNN_SUCCESS) when the symmetric path does not apply or its allocation
 * fails: the caller runs the plain search, or with *too_big = 1 (only the memory stood in
 * the way) the blocked triangle (host_sym_blocked). staged: a caller's context (pinned
 * staging). XKNN_CUDA_SYM_REQUIRE=1 (diagnostic, for the tests) makes a shape that does
 * not apply an error instead. */
xknn_status host_sym(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget, int *done,
                     int *too_big, Err er, int64_t *mir_ids, float *mir_dist)
{
    SymCall c(job, ctx, staged, budget, er, mir_ids, mir_dist);
    const xknn_params *prm = c.prm;
    const int64_t n = c.n;
    xknn_status st = XKNN_SUCCESS;
    int ok;
    unsigned long long stats[kStatCount];
    c.sc = ctx->stream;
    cudaStream_t sc = c.sc;
    const char *why = plan_sym(ctx, job, budget, &c.plan, &c.block, &c.need);
    c.h0 = wall_seconds();

    const char *req = xknn__knob(XKNN__KNOB_CUDA_SYM_REQUIRE);
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
    c.hb.pool = ctx->pool;
    c.hb.s = sc;
    /* two output buffers where the blocks' results go out on the copy stream while the
     * next block is re-ranked (staged, more than one block) */
    /* mir_ids / mir_dist: running lists on the device (a list mirror): each block's results
     * merge into them there (the second half of the output buffers is the merge's
     * scratch), nothing goes to the host */
    c.dev_out = mir_ids != nullptr;
    c.pipe = staged && n > c.block && !c.dev_out;
    st = sym_alloc(c, &ok);
    if (ok < 0) return st;
    if (ok == 0) {
        *too_big = 1;
        if (prm->verbose) fprintf(stderr, "xknn: cuda: self-join: the symmetric state's allocation failed\n");
        return XKNN_SUCCESS;
    }
    *done = 1;
    c.h_alloc = wall_seconds();
    if (prm->verbose) {
        print_plan(ctx, c.plan, "symmetric self-join, resident references", budget, 0);
        fprintf(stderr, "xknn: cuda: self-join: symmetric (triangle of tiles, pass B feeds rows and columns%s)\n",
                c.hb.dSort ? "; rows sorted by threshold" : "");
    }
    XKNN__TRY(sym_upload(c));
    XKNN__TRY(sym_passes(c));
    XKNN__TRY(sym_deliver(c));
    if (c.ev[3]) XKNN__CUDA_CHECK(cudaEventRecord(c.ev[3], sc));
    {
        float ms[3] = {0.0f, 0.0f, 0.0f};
        XKNN__TRY(run_stats_fetch(c.run, c.ev, prm->verbose, sc, stats, ms, er));
        if (prm->verbose)
            fprintf(stderr,
                    "xknn: cuda: %llu candidates appended, %llu queries re-run exactly; ms: allocation %.1f, upload "
                    "%.1f, then on the device: witnesses %.1f, triangle %.1f, re-run + re-rank + output %.1f; in all "
                    "%.1f\n",
                    stats[kStatAppended], stats[kStatReruns], (c.h_alloc - c.h0) * 1e3, (c.h_up - c.h_alloc) * 1e3,
                    ms[0], ms[1], ms[2], (wall_seconds() - c.h0) * 1e3);
    }
    if (stats[kStatUnresolved]) st = unresolved_error(stats, er);
cleanup:
    host_call_end(ctx, sc, c.ev, c.fin, c.hb);
    return st;
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
        const char *env = xknn__knob(XKNN__KNOB_CUDA_KEEP);
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

} // namespace xknn_cuda
