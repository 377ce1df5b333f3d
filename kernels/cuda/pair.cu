/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/pair.cu -- xknn_search_pair on the device (mma.cu's TWO SETS): both sides'
 * states live at once, each distance computed once for both of its points; pairs too big
 * for the device split in halves (pair_split), parts that cannot take the device run on
 * the CPU (cpu_pair); running lists merged on the host or on the device (list mirrors).
 */
#include "engine.cuh"
#include "xknn/impl/knobs.h"

namespace xknn_cuda {

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
    if (threads <= 0) threads = xknn_thread_budget();
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

/* 1 where a side's thresholds may come from its lists: l2 */
static int lists_thr_allowed(const xknn_params *prm)
{
    return prm->metric == XKNN_METRIC_L2;
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

/* The run's statistics to the host (waiting for the stream); with verbose, also the
 * device times between the phase events ev[0..3] into ms[0..2]. */
xknn_status run_stats_fetch(const Run &run, const cudaEvent_t ev[4], int verbose, cudaStream_t sc,
                            unsigned long long stats[kStatCount], float ms[3], Err er)
{
    xknn_status st = XKNN_SUCCESS;
    XKNN__CUDA_CHECK(sync_stream(NULL, sc)); /* (asleep: a pageable copy would spin on the passes) */
    /* into pageable memory: returns once the bytes are there */
    XKNN__CUDA_CHECK(cudaMemcpyAsync(stats, run.stats, kStatCount * sizeof *stats, cudaMemcpyDeviceToHost, sc));
    if (verbose)
        for (int i = 0; i < 3; ++i) XKNN__CUDA_CHECK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
cleanup:
    return st;
}

/* The end of a host call, whatever its outcome: its work on the stream sc and the copy
 * stream done, its phase events ev[0..3] and fin[0..1] (NULL: none) destroyed, its
 * device buffers released. */
void host_call_end(xknn_cuda_context *ctx, cudaStream_t sc, const cudaEvent_t ev[4], const cudaEvent_t *fin,
                   HostBuffers &hb)
{
    (void)sync_stream(ctx, sc);
    if (ctx->copy_stream) (void)sync_stream(ctx, ctx->copy_stream);
    for (int i = 0; i < 4; ++i)
        if (ev[i]) cudaEventDestroy(ev[i]);
    for (int i = 0; fin && i < 2; ++i)
        if (fin[i]) cudaEventDestroy(fin[i]);
    hb.release();
    (void)sync_stream(ctx, sc);
}

/* One host_pair call: its arguments, plan, buffers and what its phases hand on. */
struct PairCall {
    PairCall(const xknn__job *job_, xknn_cuda_context *ctx_, int staged_, size_t budget_, const xknn__sym_side *a_,
             const xknn__sym_side *b_, Err er_)
        : job(job_), ctx(ctx_), staged(staged_), budget(budget_), a(a_), b(b_), er(er_), prm(&job_->params),
          na(a_->rows), nb(b_->rows), d(job_->d), k(job_->k), b0(pair_b0(a_->rows)), row_bytes((size_t)d * sizeof(float))
    {
    }
    const xknn__job *job;
    xknn_cuda_context *ctx;
    int staged;
    size_t budget;
    const xknn__sym_side *a, *b;
    Err er;
    const xknn_params *prm;
    int64_t na, nb, d, k, b0;
    size_t row_bytes;
    HostBuffers hb;
    Plan plan;
    Run run;
    int64_t wa = 0, wb = 0, block = 0;
    int piece = 0;
    int64_t *tids = NULL;
    float *tdist = NULL;
    float *kth = NULL; /* the sides' k-th list values (A's, then B's), where full */
    int full_a = 0, full_b = 0, pinned_out = 0;
    const float *dA = NULL, *dB = NULL; /* A's and B's rows on the device: kept copies, or hb.dR, hb.dQ */
    /* the sides' lists on the device where a list mirror holds them (mirror_begin): the
     * results merge there, and full lists give their thresholds there */
    int64_t *mi[2] = {NULL, NULL};
    float *md[2] = {NULL, NULL};
    int mir_a = 0, mir_b = 0, ip = 0;
    cudaStream_t sc = nullptr;
    cudaEvent_t ev[4] = {NULL, NULL, NULL, NULL}; /* -v: phase times */
    double h0 = 0.0, h_up = 0.0, h_dev = 0.0, h_a = 0.0;
};

/* The host lists, the full sides' k-th values and the device buffers of a pair. ok: 1
 * allocated, 0 the device allocation failed (the caller reports too big), -1 an error
 * (in the return value). */
static xknn_status pair_alloc(PairCall &c, int *ok)
{
    const xknn_params *prm = c.prm;
    const int64_t na = c.na, nb = c.nb, k = c.k, block = c.block;
    Err er = c.er;
    xknn_status st = XKNN_SUCCESS;
    *ok = -1;
    /* two blocks: pair_out's double buffer; with a caller's context its pinned buffer,
     * which the device fills by DMA and which outlives the call (no staging copy, no
     * fresh pages a pair) */
    if (!c.mir_a || !c.mir_b) {
        const size_t tb = (size_t)(2 * block * k) * (sizeof(int64_t) + sizeof(float));
        char *pin = c.staged ? (char *)pair_out_buffer(c.ctx, tb) : NULL;
        if (pin) {
            c.tids = (int64_t *)pin;
            c.tdist = (float *)(pin + (size_t)(2 * block * k) * sizeof(int64_t));
            c.pinned_out = 1;
        } else {
            XKNN__TRY(host_lists(2 * block, k, &c.tids, &c.tdist, er));
        }
    }
    c.kth = (float *)malloc((size_t)(na + nb) * sizeof(float) + 1); /* (none: both sides run pass A) */
    /* (a mirrored side's lists are read on the device, below) */
    c.full_a = c.mir_a ? 0 : lists_kth(prm, c.a, k, c.kth);
    c.full_b = c.mir_b ? 0 : lists_kth(prm, c.b, k, c.kth ? c.kth + na : NULL);
    c.hb.pool = c.ctx->pool;
    c.hb.s = c.sc;
    if (c.staged) {
        /* rows the caller keeps on the device (xknn_cuda_keep_rows) are read there */
        c.dA = (const float *)kept_rows(c.ctx, c.a->data, na, c.row_bytes, (size_t)c.a->ld * sizeof(float), c.sc,
                                        prm->num_threads, &c.piece, er, &st);
        if (st == XKNN_SUCCESS)
            c.dB = (const float *)kept_rows(c.ctx, c.b->data, nb, c.row_bytes, (size_t)c.b->ld * sizeof(float), c.sc,
                                            prm->num_threads, &c.piece, er, &st);
        if (st != XKNN_SUCCESS) goto cleanup;
    }
    {
        HostBuffers &hb = c.hb;
        cudaError_t e = c.dA ? cudaSuccess : hb.alloc((void **)&hb.dR, (size_t)na * c.row_bytes);
        if (e == cudaSuccess && !c.dB) e = hb.alloc((void **)&hb.dQ, (size_t)nb * c.row_bytes);
        if (e == cudaSuccess) e = hb.alloc(&hb.dWs, c.plan.bytes);
        if (e == cudaSuccess) e = hb.alloc((void **)&hb.dIds, (size_t)(2 * block) * k * sizeof(int64_t));
        if (e == cudaSuccess) e = hb.alloc((void **)&hb.dDist, (size_t)(2 * block) * k * sizeof(float));
        if (e == cudaSuccess && (c.plan.kind == kCanonCosine || c.plan.center))
            e = hb.alloc((void **)&hb.dChunk[0], (size_t)(na + nb) * (size_t)c.plan.dh * sizeof(float));
        if (e == cudaSuccess && (c.mir_a || c.mir_b)) e = hb.alloc((void **)&hb.dFlag, 2 * sizeof(int));
        *ok = alloc_outcome(hb, e, er, &st);
    }
cleanup:
    return st;
}

/* Both sets' rows to the device (where they are not kept there); with -v, the upload
 * timed on its own and the phase events made. */
static xknn_status pair_upload(PairCall &c)
{
    const xknn_params *prm = c.prm;
    const int64_t na = c.na, nb = c.nb, d = c.d;
    const size_t row_bytes = c.row_bytes;
    const xknn__sym_side *a = c.a, *b = c.b;
    HostBuffers &hb = c.hb;
    cudaStream_t sc = c.sc;
    Err er = c.er;
    xknn_status st = XKNN_SUCCESS;
    if (c.staged && (!c.dA || !c.dB)) {
        if (!c.dA)
            XKNN__TRY(stage_rows(c.ctx, hb.dR, (const float *)a->data, na, d, a->ld, prm->num_threads, &c.piece, er));
        if (!c.dB)
            XKNN__TRY(stage_rows(c.ctx, hb.dQ, (const float *)b->data, nb, d, b->ld, prm->num_threads, &c.piece, er));
        XKNN__CUDA_CHECK(cudaStreamWaitEvent(sc, c.ctx->stage_done[(c.piece - 1) & 1], 0));
    } else if (!c.staged) {
        XKNN__CUDA_CHECK(cudaMemcpy2DAsync(hb.dR, row_bytes, a->data, (size_t)a->ld * sizeof(float), row_bytes,
                                           (size_t)na, cudaMemcpyHostToDevice, sc));
        XKNN__CUDA_CHECK(cudaMemcpy2DAsync(hb.dQ, row_bytes, b->data, (size_t)b->ld * sizeof(float), row_bytes,
                                           (size_t)nb, cudaMemcpyHostToDevice, sc));
    }
    if (!c.dA) c.dA = hb.dR;
    if (!c.dB) c.dB = hb.dQ;
    if (prm->verbose) { /* upload time on its own (verbose runs only) */
        XKNN__CUDA_CHECK(sync_stream(c.ctx, sc));
        c.h_up = wall_seconds();
        for (int i = 0; i < 4; ++i) XKNN__CUDA_CHECK(cudaEventCreateWithFlags(&c.ev[i], cudaEventBlockingSync));
    }
cleanup:
    return st;
}

/* The run's state, the tensor cores' operands and norms of both sides, and the passes'
 * parameters *ma (A's rows against B) and *mb (B's against A) set up for pass A; a
 * mirrored side's lists tell whether they are full (c.full_a, c.full_b). */
static xknn_status pair_operands(PairCall &c, MmaParams *pma, MmaParams *pmb)
{
    const xknn_params *prm = c.prm;
    const int64_t na = c.na, nb = c.nb, d = c.d, k = c.k, b0 = c.b0;
    const Plan &plan = c.plan;
    const float *dA = c.dA, *dB = c.dB;
    HostBuffers &hb = c.hb;
    Run &run = c.run;
    cudaStream_t sc = c.sc;
    Err er = c.er;
    xknn_status st = XKNN_SUCCESS;
    run = run_bind(c.ctx, &c.plan, hb.dWs, sc);
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
        const int sms = c.ctx->sms;
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
        MmaParams &ma = *pma, &mb = *pmb;
        ma = mma_params(run, XA, ldx, na, 0, 0, XB, ldx);
        mb = mma_params(run, XB, ldx, nb, 0, 0, XA, ldx);
        XKNN__CUDA_CHECK(cudaMemsetAsync(ma.thr, 0, (size_t)plan.QS * sizeof(float), sc));
        if (c.ev[0]) XKNN__CUDA_CHECK(cudaEventRecord(c.ev[0], sc));
        /* pass A and tau, per side: A's rows against B's first wa rows, B's against A's
         * first wb (a side's witnesses belong to the set it is searched in) */
        ma.rn = run.qn + b0;
        ma.n = c.wa;
        ma.ga = ceil_div(c.wa, kMmaGroup);
        mb.qn = run.qn + b0;
        mb.rn = run.qn;
        mb.n = c.wb;
        mb.ga = ceil_div(c.wb, kMmaGroup);
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
                if (c.mir_a) XKNN__CUDA_CHECK(launch_lists_kth(c.md[0], na, k, ma.gmin, hb.dFlag, sms, sc));
                if (c.mir_b) XKNN__CUDA_CHECK(launch_lists_kth(c.md[1], nb, k, mb.gmin, hb.dFlag + 1, sms, sc));
                XKNN__CUDA_CHECK(sync_stream(c.ctx, sc)); /* (asleep: a pageable copy would spin) */
                XKNN__CUDA_CHECK(cudaMemcpyAsync(bad, hb.dFlag, sizeof bad, cudaMemcpyDeviceToHost, sc));
                XKNN__CUDA_CHECK(sync_stream(c.ctx, sc));
            }
            if (c.mir_a) c.full_a = !bad[0];
            if (c.mir_b) c.full_b = !bad[1];
        }
    }
cleanup:
    return st;
}

/* Each side's thresholds (pass A and select, or its full lists), pass B over A x B for
 * both sides, and the exact re-runs of overflowed buffers. */
static xknn_status pair_passes(PairCall &c, MmaParams &ma, MmaParams &mb)
{
    const xknn_params *prm = c.prm;
    const int64_t na = c.na, nb = c.nb, d = c.d;
    const Plan &plan = c.plan;
    const int full_a = c.full_a, full_b = c.full_b, mir_a = c.mir_a, mir_b = c.mir_b;
    const float *kth = c.kth;
    const int sms = c.ctx->sms, wg = plan.wgmma ? (int)c.ctx->smem_optin : 0;
    cudaStream_t sc = c.sc;
    cudaEvent_t *ev = c.ev;
    Err er = c.er;
    xknn_status st = XKNN_SUCCESS;
    if (prm->verbose) {
        fprintf(stderr,
                "xknn: cuda: pair %lld x %lld: each tile feeds both sides (thresholds: A's from %s, B's from %s%s)\n",
                (long long)na, (long long)nb, full_a ? "its running lists" : "witnesses",
                full_b ? "its running lists" : "witnesses",
                mir_a && mir_b ? "; the lists on the device" : mir_a || mir_b ? "; one side's lists on the device" : "");
        if (!full_a || !full_b)
            fprintf(stderr, "xknn: cuda: pair %lld x %lld: witnesses: %lld of B, %lld of A\n", (long long)na,
                    (long long)nb, full_a ? 0LL : (long long)c.wa, full_b ? 0LL : (long long)c.wb);
    }
    {
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
    }
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
    ma.Q = mb.R = c.dA;
    ma.R = mb.Q = c.dB;
    ma.ldq = ma.ldr = mb.ldq = mb.ldr = d;
    mb.n = na;
    XKNN__CUDA_CHECK(launch_mma_rescue(ma, (int)plan.kk, plan.kind, sms, sc));
    XKNN__CUDA_CHECK(launch_mma_rescue(mb, (int)plan.kk, plan.kind, sms, sc));
    if (ev[3]) {
        XKNN__CUDA_CHECK(cudaEventRecord(ev[3], sc));
        XKNN__CUDA_CHECK(cudaEventSynchronize(ev[3]));
        c.h_dev = wall_seconds();
    }
cleanup:
    return st;
}

/* Both sides' results into their running lists: the host sides through pair_out, the
 * mirrored sides re-ranked and merged on the device block by block. */
static xknn_status pair_deliver(PairCall &c)
{
    const int64_t na = c.na, nb = c.nb, k = c.k, block = c.block;
    const int mir_a = c.mir_a, mir_b = c.mir_b;
    HostBuffers &hb = c.hb;
    Err er = c.er;
    xknn_status st = XKNN_SUCCESS;
    const PairSide sides[2] = {{0, na, c.b->id0, c.dA, c.dB, c.a}, {c.b0, nb, c.a->id0, c.dB, c.dA, c.b}};
    int64_t *const di[2] = {hb.dIds, hb.dIds + block * k};
    float *const dd[2] = {hb.dDist, hb.dDist + block * k};
    if (!mir_a || !mir_b) {
        /* the sides whose lists are on the host: out and merged there */
        const PairSide host_sides[2] = {mir_a ? sides[1] : sides[0], sides[1]};
        int64_t *const ti[2] = {c.tids, c.tids + block * k};
        float *const td[2] = {c.tdist, c.tdist + block * k};
        XKNN__TRY(pair_out(c.ctx, c.run, host_sides, !mir_a && !mir_b ? 2 : 1, block, di, dd, ti, td,
                           c.staged && !c.pinned_out, c.prm->num_threads, &c.piece, er));
    }
    for (int si = 0; si < 2; ++si) {
        /* a mirrored side: block by block, re-ranked into di[0] and merged on the
         * device (di[1]: the merge's scratch) */
        if (!c.mi[si]) continue;
        for (int64_t q0 = 0; q0 < sides[si].rows; q0 += block) {
            const int64_t qs = min64(block, sides[si].rows - q0);
            XKNN__TRY(pair_block_enqueue(c.run, sides[si], q0, qs, di[0], dd[0], er));
            XKNN__CUDA_CHECK(launch_lists_merge(c.mi[si] + q0 * k, c.md[si] + q0 * k, di[0], dd[0], qs, k, c.ip, di[1],
                                                dd[1], c.ctx->sms, c.sc));
        }
    }
cleanup:
    return st;
}

/* The pair (A, B) of two disjoint sets on the device: each distance of A x B once, for
 * A's lists and B's (mma.cu's TWO SETS), merged into the running lists on the host.
 * *done = 0 (and XKNN_SUCCESS) when the shape does not allow it (XKNN_CUDA_SYM_REQUIRE=1:
 * an error instead) or, with *too_big = 1, when the memory does not. */
xknn_status host_pair(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget, const xknn__sym_side *a,
                      const xknn__sym_side *b, int *done, int *too_big, Err er)
{
    PairCall c(job, ctx, staged, budget, a, b, er);
    const xknn_params *prm = c.prm;
    const int64_t na = c.na, nb = c.nb;
    xknn_status st = XKNN_SUCCESS;
    int ok = 0;
    unsigned long long stats[kStatCount];
    c.mir_a = mirror_of(ctx, a->ids, na, c.k, &c.mi[0], &c.md[0]);
    c.mir_b = mirror_of(ctx, b->ids, nb, c.k, &c.mi[1], &c.md[1]);
    c.ip = prm->metric == XKNN_METRIC_IP;
    c.sc = ctx->stream;
    cudaStream_t sc = c.sc;
    const char *why = plan_pair(ctx, job, na, nb, budget, &c.plan, &c.wa, &c.wb, &c.block);
    c.h0 = wall_seconds();
    const char *req = xknn__knob(XKNN__KNOB_CUDA_SYM_REQUIRE);
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
    st = pair_alloc(c, &ok);
    if (ok < 0) goto cleanup;
    if (ok == 0) {
        *too_big = 1;
        if (prm->verbose) fprintf(stderr, "xknn: cuda: pair %lld x %lld: the allocation failed\n", (long long)na, (long long)nb);
        goto cleanup;
    }
    *done = 1;
    if (prm->verbose) print_plan(ctx, c.plan, "pair of sets, resident", budget, 0);
    XKNN__TRY(pair_upload(c));
    {
        MmaParams ma, mb;
        XKNN__TRY(pair_operands(c, &ma, &mb));
        XKNN__TRY(pair_passes(c, ma, mb));
    }
    XKNN__TRY(pair_deliver(c));
    c.h_a = wall_seconds();
    {
        float ms[3] = {0.0f, 0.0f, 0.0f};
        XKNN__TRY(run_stats_fetch(c.run, c.ev, prm->verbose, sc, stats, ms, er));
        if (prm->verbose)
            fprintf(stderr,
                    "xknn: cuda: pair %lld x %lld: %llu candidates appended, %llu rows re-run exactly; ms: allocation + "
                    "upload %.1f, witnesses %.1f, rectangle %.1f, re-runs %.1f, then re-rank + output + host merge "
                    "%.1f; in all %.1f\n",
                    (long long)na, (long long)nb, stats[kStatAppended], stats[kStatReruns], (c.h_up - c.h0) * 1e3,
                    ms[0], ms[1], ms[2], (c.h_a - c.h_dev) * 1e3, (wall_seconds() - c.h0) * 1e3);
    }
    if (stats[kStatUnresolved]) st = unresolved_error(stats, er);
cleanup:
    host_call_end(ctx, sc, c.ev, NULL, c.hb);
    free(c.kth);
    if (!c.pinned_out) {
        free(c.tdist);
        free(c.tids);
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

/* The CPU pair (xknn__cpu_sym_pair) of a part; where a list mirror holds a side's lists,
 * they come to the host for it and go back after. Every copy is on the context's stream,
 * which the next part's merges and the lists' fetch follow: a plain cudaMemcpy from
 * pageable memory may return before its DMA lands, and the legacy stream it runs on does
 * not order the context's non-blocking one. */
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
    for (int i = 0; i < 2; ++i)
        if (di[i]) {
            const size_t cnt = (size_t)(sd[i]->rows * k);
            XKNN__CUDA_CHECK(
                cudaMemcpyAsync(sd[i]->ids, di[i], cnt * sizeof(int64_t), cudaMemcpyDeviceToHost, ctx->stream));
            XKNN__CUDA_CHECK(cudaMemcpyAsync(sd[i]->dist, dd[i], cnt * sizeof(float), cudaMemcpyDeviceToHost, ctx->stream));
        }
    if (any) XKNN__CUDA_CHECK(sync_stream(ctx, ctx->stream));
    st = xknn__cpu_sym_pair(job, a, b);
    for (int i = 0; i < 2 && st == XKNN_SUCCESS; ++i)
        if (di[i]) {
            const size_t cnt = (size_t)(sd[i]->rows * k);
            XKNN__CUDA_CHECK(
                cudaMemcpyAsync(di[i], sd[i]->ids, cnt * sizeof(int64_t), cudaMemcpyHostToDevice, ctx->stream));
            XKNN__CUDA_CHECK(cudaMemcpyAsync(dd[i], sd[i]->dist, cnt * sizeof(float), cudaMemcpyHostToDevice, ctx->stream));
        }
    /* (the host lists are the caller's again once this returns) */
    if (any) XKNN__CUDA_CHECK(sync_stream(ctx, ctx->stream));
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

} // namespace xknn_cuda
