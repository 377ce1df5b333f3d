/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/kernels.cuh -- device-level layer: kernel parameter blocks and the host
 * launchers (filter.cu, final.cu). Every launcher only enqueues on the given stream and
 * returns the launch status (cudaGetLastError); none synchronises.
 */
#ifndef XKNN_CUDA_KERNELS_CUH
#define XKNN_CUDA_KERNELS_CUH

#include "common.cuh"

namespace xknn_cuda {

/* Statistics counters at the start of the workspace (unsigned long long each); the
 * public names are XKNN_CUDA_STAT_* in include/xknn/cuda.h (same values, checked in
 * entry.cu). */
enum {
    kStatUnion = 0,     /* bound compactions (k-th smallest upper bound, drop by lower bound) */
    kStatExact = 1,     /* exact compactions (canonical top k of a full buffer)               */
    kStatAppended = 2,  /* candidates appended                                                */
    kStatUnresolved = 3, /* final candidates without a canonical value: must stay 0 (a bug)  */
    kStatReruns = 4,    /* fused path: queries whose certificate failed, searched again exactly */
    kStatCount = 8
};

/* Candidate filter of one tile (see filter.cu). */
struct FilterParams {
    const float *tile;  /* qb x ldt, row r = query qrow0 + r of the state block      */
    int64_t ldt;
    const float *rn;    /* squared norms of the tile's references (float)            */
    const float *qn;    /* squared norms of the state block's queries                */
    float *tau;         /* per state query: k-th smallest upper bound seen (+inf)     */
    int *cnt;           /* per (state query, split): entries in the buffer           */
    Cand *cand;         /* per (state query, split): buffer of cap entries           */
    int64_t rc;         /* valid columns of the tile                                 */
    int64_t rcs;        /* columns per split (multiple of 4)                         */
    int64_t col_local0; /* local reference index of tile column 0                    */
    int64_t self_local0;/* local reference index equal to state query 0's global id  */
    const float *Q;     /* state block queries, row stride ldq (exact compaction)    */
    int64_t ldq;
    const float *R;     /* current reference chunk, row stride ldr                   */
    int64_t ldr;
    int64_t r_local0;   /* local index of R's row 0                                  */
    int64_t d;
    unsigned long long *stats;
    float mrel, mabs;   /* margin m = mrel * s + mabs (see plan.cu)                  */
    int qrow0;          /* state index of tile row 0                                 */
    int S;              /* splits per query                                          */
    int cap;            /* entries per buffer                                        */
    int kk;             /* min(k, n)                                                 */
    int exclude;        /* skip the reference whose global id is the query's         */
    int euclid;
};

/* End-of-pass resolution: canonical values for every surviving candidate. */
struct ResolveParams {
    const float *tau;
    int *cnt;
    Cand *cand;
    const float *Q;
    int64_t ldq;
    const float *R;
    int64_t ldr;
    int64_t r_local0;
    int64_t d;
    int S, cap, kind; /* kind: common.cuh's kCanon* */
    /* cert > 0 (S = 1, kCanonL2): the estimated threshold's certificate. below[q] = how
     * many entries of query q have a canonical value <= tau[q] (0 for an overflowed
     * buffer, not resolved); the rescue then searches the queries with below[q] < cert. */
    int cert;
    int *below;
    /* resolve by reference range (filter.cu's launch_resolve_ranges; cert > 0): nb ranges
     * of rb references; boff: per query nb + 1 entry offsets (bucket_kernel); a query
     * with more than bmax entries keeps one range */
    int nb, bmax;
    int64_t rb;
    int *boff;
};
static const int kMaxRanges = 64; /* ResolveParams.nb at most */

/* Final selection: per query, the sorted first kk of its candidates, written with pad. */
struct FinalParams {
    const float *tau;
    const int *cnt;
    Cand *cand;          /* per-query region of S*cap entries reused as 2 key arrays */
    long long *mcount;   /* per query: surviving candidates M                        */
    int64_t *ids;        /* output rows of the block, ld = k                         */
    float *dist;         /* or NULL                                                  */
    int64_t k;
    int64_t id_offset;   /* global id of local reference 0                           */
    unsigned long long *stats;
    int S, cap, kk;
    int encoded;         /* generic path: c holds order_enc bits (always resolved)    */
    int negate;          /* ip: the value is -(decoded order value); padding is -inf  */
    int smem_merge;      /* the device gives a block kFinalMergeSmem bytes: queries with
                            M > kBlockSortMax and kk <= kBlockSortMax merge in shared
                            memory (final.cu's block_merge_kernel)                    */
};

/* Dynamic shared memory of block_merge_kernel: run, running list and merged list. */
static const size_t kFinalMergeSmem = 3 * (size_t)kBlockSortMax * sizeof(unsigned long long);

/* Fused path (fused.cu): distances and selection in one kernel, then per query the merge
 * of the z-slices' lists, the certificate, canonical re-rank and output; queries whose
 * certificate fails are searched again by the exact rescue kernel. */
struct FusedParams {
    const float *Q;        /* state block queries, row stride ldq                       */
    int64_t ldq;
    const float *R;        /* all references of the call, row stride ldr                */
    int64_t ldr;
    int64_t n, d;
    int64_t rz;            /* references per z-slice (multiple of the tile width)       */
    int64_t self_local0;   /* local reference index equal to state query 0's global id  */
    unsigned long long *part; /* Z x qsp x KP keys: sorted list of each (slice, query)   */
    int64_t qsp;           /* queries per slice in part (the plan's state block)        */
    int *flag;             /* per state query: 1 = certificate failed                  */
    float *tpv;            /* per state query: the threshold tau' of the fused pass     */
    int64_t *ids;          /* output rows of the block, ld = k                          */
    float *dist;           /* or NULL                                                   */
    int64_t k, id_offset;
    unsigned long long *stats;
    float lrel, labs, urel, uabs; /* bound: L = e lrel - labs (down), U = e urel + uabs (up) */
    int qs, Z, kk, exclude, euclid;
    int vec;               /* 16-byte loads of reference rows (aligned, ldr % 4 == 0, d % 4 == 0) */
    int z0;                /* first slice of a launch (launch_fused_slices sets it)      */
};

/* Tensor-core path (mma.cu): pass A (mode 0) writes witnesses, select turns them into
 * thresholds, pass B (mode 1) appends candidates, rescue re-runs overflowed queries.
 * Mode 2 is pass B of the symmetric self-join: Q = R, self_local0 = 0, qs = n, and thr
 * (like rn) holds round_up(n, kMmaBN) entries. */
struct MmaParams {
    const float *Q;        /* state block queries, row stride ldq                        */
    int64_t ldq;
    const float *R;        /* references, row stride ldr; local ids 0 .. n-1             */
    int64_t ldr;
    const float *qn;       /* per state query |q|^2 (float)                              */
    const float *rn;       /* per reference |x|^2 (float), at least n entries            */
    float *ct;             /* per reference column terms of the Hopper kernels' epilogue *
                            * (launch_mma_pass fills them), 2 RN entries                */
    int64_t n, d;          /* references this launch covers: [0, n) (pass A: nA)         */
    int64_t self_local0;   /* local reference index equal to state query 0's global id   */
    float *gmin;           /* qs x ga witnesses (pass A), row stride ga                  */
    int64_t ga;            /* witness groups: ceil(nA / kMmaGroup)                       */
    float *thr;            /* per state query: (mabs + tau') / 2 rounded up (pass B)     */
    int *cnt;              /* per state query: candidates appended (may exceed cap)      */
    Cand *cand;            /* per state query: cap slots                                 */
    unsigned long long *stats;
    float ua, ub, la;      /* U = fma_ru(acc, -2, fma_ru(s, ua, ub)); r = fma_rd(s, la, -thr) */
    int qs, cap, exclude;
    int tiles_per_cta;     /* set by the launcher (mode 2: tiles of a CTA's row chunk)   */
    int ffma;              /* 1: fp32 products on the CUDA cores (modes 0 and 1), not TF32 */
    int qt0;               /* ffma_kernel: query tile of blockIdx.x = 0 (launch_one)      */
    int carry;             /* ffma_kernel pass B: entries carry their accumulators (the   *
                            * prune follows; mma_kernel's always do)                     */
    float *tau_out;        /* select: per state query the selected witness, or NULL       */
    const int *below;      /* rescue: also search the queries with below[q] < kk (a      *
                            * failed certificate, ResolveParams.below); NULL: none        */
    /* Mode 2's column side: the state of reference j is cthr[j], ccnt[j], ccand[j cap ..]
     * (mma_params: the rows' own state, Q = R). rect = 1: Q and R are two disjoint sets
     * (xknn_search_pair): every CTA takes all reference tiles, none is a diagonal tile,
     * and the columns' state is the other set's. */
    const float *cthr;
    int *ccnt;
    Cand *ccand;
    int rect;
    /* Pass A of the self-join as a band (launch_mma_band): CTA I takes the band reference
     * tiles (2 I + j) mod RT, j < band, and feeds the witnesses of its rows and of the
     * band's columns (ga = 4 band slots a row) */
    int band;
    /* Mode 2 on rows sorted by threshold (launch_mma_sym_sort; NULL: the caller's order):
     * perm[i] the caller's id of sorted point i (lists and entries are the caller's ids),
     * msuf[x] the bound of sym_epilogue_sorted over sorted points x' >= x (n entries) */
    const int *perm;
    const float *msuf;
    /* and its candidates as pair entries (pool_append), pool_cap of them, the next free
     * one at *pool_next */
    unsigned long long *pool, *pool_next;
    int64_t pool_cap;
};

/* Generic path (generic.cu): canonical distances of any metric and dtype, tile by tile,
 * with a per-(query, split) buffer and threshold that persist across launches. */
struct GenParams {
    const char *Q;         /* state block queries, row stride ldq bytes                  */
    int64_t ldq;
    const char *R;         /* this launch's references, row stride ldr bytes             */
    int64_t ldr;
    int64_t n;             /* references of this launch                                  */
    int64_t r_local0;      /* local id of R's row 0                                      */
    int64_t d;             /* elements, or bits for bit-packed rows                      */
    int64_t words;         /* bit-packed rows: 64-bit words per row; 0 otherwise         */
    int64_t rs;            /* references per split (a multiple of kGenR)                 */
    int64_t self_local0;   /* local reference index equal to state query 0's global id   */
    const double *qnorm;   /* cosine: per state query / per reference of this launch,    */
    const double *rnorm;   /*   the canonical sums of squares                           */
    const float *weights;  /* whamming: one per bit (device)                             */
    Cand *cand;            /* per (state query, split): cap slots                        */
    int *cnt;              /* per (state query, split): entries                          */
    unsigned long long *th;/* per (state query, split): keys must be below it            */
    unsigned long long *stats;
    double p;              /* Minkowski exponent                                         */
    int metric, dtype;
    int sqrt_inputs;       /* hellinger: stage square roots                              */
    int negate;            /* ip: order by -value                                        */
    int qs, S, cap, kk, exclude;
};
cudaError_t launch_gen_norms(const void *X, int64_t ld_bytes, int64_t rows, int64_t d, int dtype, double *out,
                             cudaStream_t st);
cudaError_t launch_gen_init(unsigned long long *th, int64_t count, cudaStream_t st);
cudaError_t launch_gen_tiles(const GenParams &p, cudaStream_t st);

/* Reference slices of a tensor-core pass (one CTA resident per SM): at least 4 CTAs per
 * SM in all with query tiles fastest; among up to 4x that many slices, the count whose
 * last wave is fullest; at most rt (tiles) and 65535 (gridDim.y). A pass of fewer than
 * 32 tiles per SM in all runs as one wave (at most sms / qt slices): each CTA stages its
 * queries first, which costs several tiles' time, so short CTAs would mostly stage. */
inline int64_t choose_slices(int64_t qt, int64_t rt, int sms)
{
    if (qt * rt < 32 * (int64_t)sms) {
        const int64_t z = (int64_t)sms / qt;
        return z < 1 ? 1 : z > rt ? rt : z;
    }
    int64_t z0 = (4 * (int64_t)sms + qt - 1) / qt, Z = z0;
    double best = 0.0;
    for (int64_t z = z0; z <= 4 * z0 && z <= rt; ++z) {
        const int64_t ctas = qt * z, waves = (ctas + sms - 1) / sms;
        const double eff = (double)ctas / (double)(waves * sms);
        if (eff > best + 1e-9) {
            best = eff;
            Z = z;
        }
    }
    if (Z > rt) Z = rt;
    if (Z > 65535) Z = 65535;
    if (Z < 1) Z = 1;
    return Z;
}

/* Exact int8 tensor-core path (imma.cu): u8/i8 with l2, euclidean, ip. */
struct ImmaParams {
    const signed char *Q;  /* state block queries, signed rows of dp bytes               */
    const signed char *R;  /* references, signed rows of dp bytes                        */
    const int *qsum, *qsq; /* per state query: sum and sum of squares of its signed row  */
    const int *rsum, *rsq; /* per reference                                              */
    int64_t n, nA, ga;     /* references; pass A prefix; witness groups ceil(nA / 64)     */
    int64_t d, dp;         /* elements; padded row bytes (multiple of 64)                */
    int64_t self_local0;   /* local reference index equal to state query 0's global id   */
    long long *gmin;       /* qs x ga witnesses                                          */
    long long *th;         /* per state query: order values <= th are candidates         */
    int *cnt;              /* per state query: candidates appended (may exceed cap)      */
    Cand *cand;            /* per state query: cap slots                                 */
    unsigned long long *stats;
    int qs, cap, exclude;
    int ip, shift, euclid; /* ip: order by -q.x; shift: u8 data (v - 128); euclidean     */
    int bin;               /* bit-packed rows (hamming): b1 AND-popcount tensor cores     */
    int tiles_per_cta;     /* set by the launcher                                        */
    int wgmma_optin;       /* > 0: sm_90a code on a cc 9.0 device with this many bytes of
                              opt-in shared memory: the warp-specialized wgmma kernel for
                              u8/i8 rows where its queries fit (imma.cu)                  */
    int *ncol;             /* that kernel's column terms, imma_ncol_entries(n) ints       */
};
size_t imma_smem_bytes(int64_t dp);
size_t imma_ncol_entries(int64_t n);
/* shift: 1 u8, 0 i8 (ld, d in bytes); -1 bit-packed (ld in 64-bit words, d in bits) */
cudaError_t launch_imma_prep(const void *X, int64_t ld, int64_t rows, int64_t d, int64_t dp, int shift,
                             signed char *out, int *sum, int *sq, cudaStream_t st);
/* pass A, select, pass B, rescue + resolve; then launch_final (encoded keys, S = 1). */
cudaError_t launch_imma(const ImmaParams &p, int kk, int sms, cudaStream_t st);

size_t mma_smem_bytes(int64_t d);   /* mma.sync kernel (compute capability >= 8.0) */
size_t ffma_smem_bytes(int64_t d);  /* CUDA-core kernel of MmaParams.ffma (modes 0 and 1) */
size_t wgmma_smem_bytes(int64_t d, int sym); /* wgmma kernel (sm_90a code, cc 9.0); sym: mode 2 */
size_t mma_sym_smem_extra(void);    /* added to either in mode 2 (thr ring, p_i)          */
int mma_wgmma_built(void);          /* 1 when the build holds sm_90a code (gpu_arch has 90) */
/* wgmma: 0 for the mma.sync kernel; else the wgmma kernels, and the value is the
 * device's shared-memory opt-in per block in bytes (sizes the warp-specialized ring) */
cudaError_t launch_mma_pass(const MmaParams &p, int mode, int sms, int wgmma, cudaStream_t st);
cudaError_t launch_mma_select(const MmaParams &p, int kk, int sms, cudaStream_t st);
/* The self-join's symmetric pass A over the band p.band (mma.cu's SYMMETRIC WITNESSES):
 * p.gmin filled with +inf, then the band; cudaErrorNotSupported where the warp-
 * specialized Hopper kernel cannot run it (mma_band_supported is 0) */
int mma_band_supported(int64_t d, int wgmma);
cudaError_t launch_mma_band(const MmaParams &p, int sms, int wgmma, cudaStream_t st);
/* The symmetric triangle on rows sorted by decreasing threshold (mma.cu's
 * sym_epilogue_sorted): from p (mode 2 over Q = R, operand rows of stride ldx, 16-byte
 * aligned, ldx % 4 == 0), the permutation, the gathered rows, norms and thresholds and
 * the bounds in ws (mma_sym_sort_bytes), and in *out the parameters of the sorted pass
 * (launch_mma_pass mode 2, the warp-specialized Hopper kernel only); n < 2^30. */
size_t mma_sym_sort_bytes(int64_t n, int64_t ldx, int64_t pool_cap);
cudaError_t launch_mma_sym_sort(const MmaParams &p, int64_t ldx, int64_t pool_cap, void *ws, int sms, cudaStream_t st,
                                MmaParams *out);
/* after the sorted pass: its pool of candidates into the lists, or *overflow = 1 (nothing
 * moved; the pass must run again in the caller's order). Synchronizes st. */
cudaError_t launch_mma_sym_scatter(const MmaParams &ps, int sms, cudaStream_t st, int *overflow);
/* thr of queries with full running lists from their k-th values kth[0, p.qs) (l2) */
cudaError_t launch_mma_list_thr(const MmaParams &p, const float *kth, int sms, cudaStream_t st);
/* pass B's entries (l2 / euclidean, mma_kernel and ffma_kernel) cut to those whose lower
 * bound is within the kk-th smallest upper bound (mma.cu's prune) */
cudaError_t launch_mma_prune(const MmaParams &p, int kk, cudaStream_t st);
cudaError_t launch_mma_rescue(const MmaParams &p, int kk, int kind, int sms, cudaStream_t st);

cudaError_t launch_sqnorms(const float *X, int64_t ld, int64_t rows, int64_t d, float *out, cudaStream_t st);
/* l2's centred tensor-core operands (filter.cu): mu from a sample of the rows of X, then
 * rows tf32(x - mu) with the norms of x - mu */
cudaError_t launch_mean_rows(const float *X, int64_t ld, int64_t rows, int64_t d, float *mu, cudaStream_t st);
cudaError_t launch_center_rows(const float *X, int64_t ld, int64_t rows, int64_t d, const float *mu, float *out,
                               int64_t ld_out, float *norms, cudaStream_t st);
/* rows of X scaled to unit length (cosine's tensor-core operands; see filter.cu) */
cudaError_t launch_unit_rows(const float *X, int64_t ld, int64_t rows, int64_t d, float *out, int64_t ld_out,
                             cudaStream_t st);
cudaError_t launch_init_state(float *tau, int *cnt, int qs, int S, cudaStream_t st);
cudaError_t launch_filter(const FilterParams &p, int qb, cudaStream_t st);
cudaError_t launch_resolve(const ResolveParams &p, int qs, cudaStream_t st);
cudaError_t launch_resolve_ranges(const ResolveParams &p, int qs, int smem_optin, cudaStream_t st);
cudaError_t launch_final(const FinalParams &p, int qs, cudaStream_t st);
/* running lists on the device (final.cu): rows x k (id, distance) sorted by the result
 * order, padding (id -1) last. merge: the new lists' rows into the running ones (the host
 * merge's rules; sids / sdist: rows x k of scratch); pad: count entries of padding
 * (-inf for ip); kth: the rows' last distances, *bad = 1 where one is not finite */
cudaError_t launch_lists_merge(int64_t *ids, float *dist, const int64_t *nids, const float *ndist, int64_t rows,
                               int64_t k, int ip, int64_t *sids, float *sdist, int sms, cudaStream_t st);
cudaError_t launch_lists_pad(int64_t *ids, float *dist, int64_t count, int ip, int sms, cudaStream_t st);
cudaError_t launch_lists_kth(const float *dist, int64_t rows, int64_t k, float *kth, int *bad, int sms, cudaStream_t st);
/* dist[r * k + k - 1] = bound[r] (bounded padding); out[r] = row r's k-th distance where
 * its last id is >= 0, +inf where not */
cudaError_t launch_lists_bound(float *dist, const float *bound, int64_t rows, int64_t k, int sms, cudaStream_t st);
cudaError_t launch_lists_last(const int64_t *ids, const float *dist, int64_t rows, int64_t k, float *out, int sms,
                              cudaStream_t st);
/* kp: keys kept per (slice, query), one of 32, 64, 128, 256 (kFusedMaxKeep). The fused
 * kernel over slices [z0, z0 + nz); then, once every slice is done, finish + rescue. */
cudaError_t launch_fused_slices(const FusedParams &p, int kp, int z0, int nz, cudaStream_t st);
cudaError_t launch_fused_finish(const FusedParams &p, int kp, int rescue_blocks, cudaStream_t st);

} // namespace xknn_cuda

#endif
