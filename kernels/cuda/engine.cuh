/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/engine.cuh -- what the host files of the CUDA backend share: the context,
 * the plan, the device-level run, the host path's device buffers, and one declaration of
 * every host function another file calls, grouped by the file that defines it. Not
 * included by kernel files (finite.cu, host code with one small kernel of its own,
 * excepted); nothing here is public.
 */
#ifndef XKNN_CUDA_ENGINE_CUH
#define XKNN_CUDA_ENGINE_CUH

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
#include "tune.cuh"
#include "xknn/cuda.h"
#include "xknn/impl/backend.h"
#include "xknn/impl/cuda_internal.h"

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
    /* finite.cu's two check words (references, queries) on the device; pinned host
     * words: their copy, then a search's kStatCount counters. Made with the staging ring */
    unsigned long long *finite_dev, *finite_host;
    /* pool_copy's helper threads (made by the first staged copy that can use them;
     * copy_pool_none: none could be had) */
    struct xknn_cuda_pool *copy_pool;
    int copy_pool_none;
    /* sync_stream's event (blocking sync), one waiter at a time (sync_lock) */
    cudaEvent_t sync_ev;
    pthread_mutex_t sync_lock;
};

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

/* The thread policy of host steps (include/xknn.h): params.num_threads or the budget,
 * at most one thread per 8 MiB the step touches */
extern "C" int xknn__step_threads(int nt, int64_t bytes);

namespace xknn_cuda {

typedef xknn_cuda_context::xknn_cuda_mirror ListMirror;

/* Events the host waits on: a blocking sync puts the waiting thread to sleep instead of
 * spinning a core the machine may need (the device's own flags, cudaDeviceScheduleSpin
 * or not, stay the embedding application's). */
static const unsigned kHostWaitEvent = cudaEventBlockingSync | cudaEventDisableTiming;
cudaError_t sync_stream(xknn_cuda_context *ctx, cudaStream_t s);

/* ---- small helpers ------------------------------------------------------------------ */
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t m) { return ceil_div(a, m) * m; }
inline size_t align_up(size_t a) { return (a + kAlign - 1) / kAlign * kAlign; }
inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

inline float round_up_float(double x)
{
    float f = (float)x;
    if ((double)f < x) f = nextafterf(f, INFINITY);
    return f;
}

inline float round_down_float(double x)
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

/* Seconds on a monotonic clock (the verbose output's phase times). */
inline double wall_seconds(void)
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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
            if (sync_stream(NULL, s) == cudaSuccess && cudaMemPoolTrimTo(pool, 0) == cudaSuccess)
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

/* ---- plan.cu: path choice, plans, workspace layouts, bounds */
void plan_bounds(Plan &p);
void plan_layout(Plan &p);
void plan_shape(Plan &p, const xknn_cuda_context *ctx, int64_t QS, int64_t QB, int64_t RC, int64_t RN,
                size_t cublas_ws);
int choose_tf32(const xknn_params *prm, int64_t n, int64_t nq, int64_t d);
int fused_supported(const xknn_params *prm, int64_t n, int64_t d, int64_t k);
int gemm_ipcos(const xknn_params *prm);
int mma_supported(const xknn_params *prm, int64_t d);
int choose_path(const xknn_params *prm, int64_t n, int64_t nq, int64_t d, int64_t k);
int64_t ref_block_slices(const xknn_params *prm, int64_t n);
Plan plan_init(const xknn_params *prm, int64_t n, int64_t nq, int64_t d, int64_t k);
void plan_fused_bounds(Plan &p);
int plan_fused(const xknn_cuda_context *ctx, const xknn_params *prm, int64_t n, int64_t nq, int64_t d, int64_t k,
               size_t limit, size_t per_query_extra, Plan *out, size_t *min_needed);
double witness_c(int64_t kk, double def);
int64_t plan_estimate(int64_t n, int64_t kk, int64_t nA_rig, int64_t *ej);
void mma_bounds(Plan &p);
int plan_set_center(Plan &p, int on);
int center_wanted(const Plan &p);
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
             size_t limit, size_t per_query_extra, int ffma, Plan *out, int estimate = 0);
const char *ipcos_why_not(const xknn_cuda_context *ctx, int64_t n, int64_t d, int64_t k);
int ffma_wanted(const xknn_params *prm, int64_t d);
int plan_fit(const xknn_cuda_context *ctx, const xknn_params *prm, int64_t n, int64_t nq, int64_t d, int64_t k,
             int64_t pass_rows, size_t limit, size_t per_query_extra, int streaming, Plan *out, size_t *min_needed);
void print_plan(const xknn_cuda_context *ctx, const Plan &p, const char *mode, size_t budget, int64_t chunk);

/* ---- pipeline.cu: the device-level pipeline of one state block */
Run run_bind(xknn_cuda_context *ctx, const Plan *p, void *ws, cudaStream_t st);
xknn_status run_start(const Run &r, Err er);
xknn_status block_begin(const Run &r, const float *Q, int64_t ldq, int64_t qs, Err er);
ResolveParams resolve_params(const Run &r, const float *Q, int64_t ldq, const float *R, int64_t ldr,
                             int64_t r_local0);
MmaParams mma_params(const Run &r, const float *Q, int64_t ldq, int64_t qs, int exclude, int64_t self_local0,
                     const float *R, int64_t ldr);
xknn_status mma_pass(const Run &r, const float *Q, int64_t ldq, int64_t qs, int exclude, int64_t self_local0,
                     const float *R, int64_t ldr, Err er);
xknn_status block_pass(const Run &r, const float *Q, int64_t ldq, int64_t qs, int exclude, int64_t self_local0,
                       const float *R, int64_t ldr, int64_t nr, int64_t r_local0, Err er);
xknn_status block_finish(const Run &r, int64_t qs, int64_t *ids, float *dist, int64_t id_offset, Err er);
/* a block's final selection parameters (block_finish, host_generic, host_imma) */
FinalParams final_params(const xknn_cuda_context *ctx, const float *tau, const int *cnt, Cand *cand, long long *mcount,
                         unsigned long long *stats, int64_t S, int64_t cap, int64_t kk, int64_t *ids, float *dist,
                         int64_t k, int64_t id_offset, int encoded, int negate);
FusedParams fused_params(const Plan &p, void *ws, const float *Q, int64_t ldq, int64_t qs, const float *R,
                         int64_t ldr, int exclude, int64_t self_local0, int64_t *ids, float *dist, int64_t id_offset);
int rescue_blocks(const xknn_cuda_context *ctx, int64_t qs);
xknn_status unresolved_error(const unsigned long long *stats, Err er);
xknn_status fused_block(const xknn_cuda_context *ctx, const Plan &p, void *ws, cudaStream_t stream, const float *Q,
                        int64_t ldq, int64_t qs, const float *R, int64_t ldr, int exclude, int64_t self_local0,
                        int64_t *ids, float *dist, int64_t id_offset, Err er);

/* ---- context.cu: the memory budget, device allocations, the start of a host call */
int alloc_outcome(HostBuffers &hb, cudaError_t e, Err er, xknn_status *st);
xknn_status fail_alloc_kept_failing(Err er, size_t budget, size_t bytes);
size_t budget_of(const xknn_params *prm, cudaMemPool_t pool, Err er, xknn_status *st);
xknn_status host_begin(const xknn__job *job, DeviceScope &scope, xknn_cuda_context **ctx,
                       xknn_cuda_context **own_ctx, size_t *budget, Err er);

/* ---- pool.cu: the context's copy helpers (threads: params.num_threads, 0: the budget) */
int pool_helpers(xknn_cuda_context *ctx, int threads);
void pool_copy(xknn_cuda_context *ctx, char *dst, const char *src, int64_t rows, size_t row_bytes, size_t ld_bytes,
               int threads);
void pool_destroy(struct xknn_cuda_pool *p);

/* ---- staging.cu: pinned staging, kept rows, list mirrors, results to the host */
size_t stage_piece(xknn_cuda_context *ctx, int threads);
cudaError_t stage_make(xknn_cuda_context *ctx);
void host_rows_copy(char *dst, const char *src, int64_t rows, size_t row_bytes, size_t ld_bytes, int threads);
xknn_status stage_bytes(xknn_cuda_context *ctx, char *dev, const char *host, int64_t rows, size_t row_bytes,
                        size_t ld_bytes, int threads, int *piece, Err er, size_t grain = 0);
xknn_status stage_rows(xknn_cuda_context *ctx, float *dev, const float *host, int64_t rows, int64_t d, int64_t ld,
                       int threads, int *piece, Err er);
void kept_free(xknn_cuda_kept *kp);
const char *kept_rows(xknn_cuda_context *ctx, const void *host, int64_t rows, size_t row_bytes, size_t ld_bytes,
                      cudaStream_t s, int threads, int *piece, Err er, xknn_status *st);
void *pair_out_buffer(xknn_cuda_context *ctx, size_t bytes);
bool mirror_of(const xknn_cuda_context *ctx, const int64_t *ids, int64_t rows, int64_t k, int64_t **dids,
               float **ddist);
xknn_status mirror_begin(xknn_cuda_context *ctx, int i, const xknn__sym_side *s, int64_t k, int pad, int ip,
                         size_t *budget, int threads, Err er);
xknn_status mirror_end(xknn_cuda_context *ctx, int i, int download, int threads, Err er);
/* (grain: bytes a piece; 0: stage_piece(ctx, threads), the pipeline's latency grain; bulk copies of
 * whole list sets pass kStagePiece) */
xknn_status results_out(xknn_cuda_context *ctx, int staged, int64_t *ids_host, const int64_t *ids_dev,
                        float *dist_host, const float *dist_dev, size_t count, int threads, cudaStream_t s,
                        int *piece, Err er, size_t grain = 0);

/* ---- finite.cu: NaN/Inf of f32 host rows, on the device after their upload (staged
 * resident paths) or on the host (the others); finite_pending: the job leaves it to us */
int finite_pending(const xknn__job *job);
xknn_status finite_host_scan(const xknn__job *job, Err er);
cudaError_t finite_begin(xknn_cuda_context *ctx, cudaStream_t s);
cudaError_t finite_check(xknn_cuda_context *ctx, int which, const float *dev, int64_t rows, int64_t d, int64_t row0,
                         cudaStream_t s);
cudaError_t finite_fetch(xknn_cuda_context *ctx, cudaStream_t s);
xknn_status finite_end(const xknn_cuda_context *ctx, const xknn__job *job, Err er);

/* ---- host_fused.cu, host_generic.cu, host_imma.cu: the host-array drivers of each path */
xknn_status host_fused(const xknn__job *job, xknn_cuda_context *ctx, const Plan &plan, int self_res, int staged,
                       size_t budget, int *alloc_failed, Err er);
int generic_job(const xknn__job *job);
int64_t imma_rows(const xknn__job *job, const xknn_cuda_context *ctx);
xknn_status host_imma(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget, int64_t dp, int *done,
                      Err er);
xknn_status host_generic(const xknn__job *job, Err er);

/* ---- selfjoin.cu: the symmetric self-join */
int64_t sym_band(const xknn_cuda_context *ctx, const Plan &p, int64_t n, int64_t d);
const char *plan_sym(const xknn_cuda_context *ctx, const xknn__job *job, size_t budget, Plan *out,
                     int64_t *out_block, size_t *out_need);
xknn_status host_sym(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget, int *done,
                     int *too_big, Err er, int64_t *mir_ids, float *mir_dist);
xknn_status host_sym_blocked(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget, Err er);

/* ---- pair.cu: xknn_search_pair and the blocked triangle */
void merge_row(int64_t *ai, float *ad, const int64_t *bi, const float *bd, int64_t k, int ip, int64_t *mid, float *md);
xknn_status merge_lists(int64_t *ids, float *dist, const int64_t *nids, const float *ndist, int64_t rows, int64_t k,
                        int ip, int threads, Err er);
int64_t pair_b0(int64_t na);
const char *plan_pair(const xknn_cuda_context *ctx, const xknn__job *job, int64_t na, int64_t nb, size_t budget,
                      Plan *out, int64_t *wa, int64_t *wb, int64_t *out_block);
xknn_status host_lists(int64_t rows, int64_t k, int64_t **ids, float **dist, Err er);
int lists_kth(const xknn_params *prm, const xknn__sym_side *s, int64_t k, float *kth);
xknn_status host_pair(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget, const xknn__sym_side *a,
                      const xknn__sym_side *b, int *done, int *too_big, Err er);
xknn_status host_pair_self(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget,
                           const xknn__sym_side *a, int *done, int *too_big, Err er);
xknn__sym_side side_rows(const xknn__sym_side *s, int64_t r0, int64_t rows, int64_t k);
xknn_status pair_rec(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget, const xknn__sym_side *a,
                     const xknn__sym_side *b, Err er);
xknn_status cpu_pair(const xknn__job *job, xknn_cuda_context *ctx, const xknn__sym_side *a, const xknn__sym_side *b,
                     Err er);
xknn_status pair_split(const xknn__job *job, xknn_cuda_context *ctx, int staged, size_t budget,
                       const xknn__sym_side *a, const xknn__sym_side *b, Err er);
/* the run's statistics to the host (with verbose, the device times between the phase
 * events); the end of a host_pair/host_sym call: streams done, events destroyed, buffers
 * released */
xknn_status run_stats_fetch(const Run &run, const cudaEvent_t ev[4], int verbose, cudaStream_t sc,
                            unsigned long long stats[kStatCount], float ms[3], Err er);
void host_call_end(xknn_cuda_context *ctx, cudaStream_t sc, const cudaEvent_t ev[4], const cudaEvent_t *fin,
                   HostBuffers &hb);

/* ---- entry.cu: validation and the host-array search */
xknn_status check_sizes(Err er, const xknn_params *prm, int64_t n, int64_t nq, int64_t d, int64_t k, int64_t ldr,
                        int64_t ldq);
xknn_status host_search(const xknn__job *job, Err er);
xknn_status host_search_sliced(const xknn__job *job, int64_t slice, Err er);

/* ---- lists.cu: kept rows and lists */
xknn_status kept_lists_rows(xknn_cuda_context *ctx, const int64_t *ids, int64_t row0, int64_t rows,
                            const char *what, ListMirror *m, Err er);

/* ---- copier.cu: the copier thread of xknn_cuda_copy_lists_start */
void copier_destroy(xknn_cuda_copier *c);
xknn_cuda_copier *copier_of(xknn_cuda_context *ctx, cudaError_t *e);
cudaError_t copier_wait(xknn_cuda_copier *c, int64_t ticket, int wait, int *over, const char **why = NULL);

} // namespace xknn_cuda

#endif
