/* SPDX-License-Identifier: MIT */
/*
 * CPU backend: exact k-NN on host arrays.
 *
 * Two paths, identical results (the canonical distance decides, docs/DESIGN.md section 2.3):
 *
 * BLAS path (default when CBLAS is built in). Queries in blocks of QB, references in
 * blocks of RB. sgemm gives C = -2 Q R^T for the tile (float). For query i and
 * reference j let s = |q|^2 + |x|^2 (double, rounded to float) and D the exact squared
 * distance. The float estimate e = s - 2 q.x satisfies |e - D| <= eps*s + abs with
 *     eps = 1.25 (d + 16) u / (1 - (d + 16) u),  u = 2^-24,  abs = (d + 2) FLT_MIN,
 * because any summation order of the d products is within gamma_d sum|q_t x_t| <=
 * gamma_d s/2 of the dot product (Cauchy-Schwarz; Higham, Accuracy and Stability, 3.1),
 * the norms and the two additions each add at most u s, and products that underflow
 * lose at most FLT_MIN each. So L = e - eps s - abs <= D <= U = e + eps s + abs.
 * Per query a max-heap keeps the k smallest U: its top tau bounds the k-th distance.
 * Every reference with L <= tau' = tau (1 + 2^-19) + 16 FLT_MIN is kept as a candidate;
 * any other one has D > tau', so its canonical float is strictly greater than that of k
 * kept ones (the 2^-19 covers the float rounding of the canonical value and of its
 * square root), and cannot be in the top k whatever its id. Candidates are re-ranked
 * with the canonical distance and sorted by (distance, id). When a candidate buffer
 * fills (many ties), it is re-ranked and cut to its exact top k, which is exact too.
 *
 * Loop path (no BLAS, or values too large for float products): reference blocks are
 * transposed and the canonical distance is computed for every pair, vectorised across
 * references; a bounded (distance, id) max-heap keeps the top k.
 *
 * Threads: the BLAS call is threaded by the BLAS library; candidate filtering and
 * re-ranking are OpenMP-parallel over the queries of a block. Memory is bounded by the
 * blocks: QB*RB floats for the tile plus QB*(3k+512) candidate slots, never nq*n.
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef XKNN_HAVE_CBLAS
#include <cblas.h>
#endif

#include "canonical.h"
#include "cpu_internal.h"

int xknn__pair_cmp(const void *a, const void *b)
{
    const xknn__pair *x = (const xknn__pair *)a, *y = (const xknn__pair *)b;
    if (x->d < y->d) return -1;
    if (x->d > y->d) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* ----------------------------------------------------------------------------------- */
/* Bounded max-heap of (distance, id) under the result order: keeps the k best.         */
/* ----------------------------------------------------------------------------------- */
void xknn__pheap_push(xknn__pair *h, int64_t *size, int64_t cap, float d, int64_t id)
{
    int64_t i;
    if (*size < cap) {
        i = (*size)++;
        while (i > 0) {
            int64_t p = (i - 1) / 2;
            if (!xknn__result_less(h[p].d, h[p].id, d, id)) break;
            h[i] = h[p];
            i = p;
        }
        h[i].d = d;
        h[i].id = id;
        return;
    }
    if (!xknn__result_less(d, id, h[0].d, h[0].id)) return;
    i = 0;
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        float md = d;
        int64_t mid = id;
        if (l < cap && xknn__result_less(md, mid, h[l].d, h[l].id)) { m = l; md = h[l].d; mid = h[l].id; }
        if (r < cap && xknn__result_less(md, mid, h[r].d, h[r].id)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    h[i].d = d;
    h[i].id = id;
}

/* Writes the sorted pairs (first `have`) and pads to k (pad_missing only). */
void xknn__emit(const xknn__job *job, int64_t qi, const xknn__pair *best, int64_t have)
{
    int64_t j, k = job->k;
    int64_t *ids = job->ids + qi * k;
    float *dist = job->dist ? job->dist + qi * k : NULL;
    for (j = 0; j < k; j++) {
        ids[j] = j < have ? best[j].id : -1;
        if (dist) dist[j] = j < have ? best[j].d : INFINITY;
    }
}

int xknn__threads(const xknn__job *job)
{
#ifdef _OPENMP
    return job->params.num_threads > 0 ? job->params.num_threads : xknn_thread_budget();
#else
    (void)job;
    return 1;
#endif
}

/* ----------------------------------------------------------------------------------- */
/* Loop path                                                                           */
/* ----------------------------------------------------------------------------------- */
static xknn_status xknn__cpu_loop(const xknn__job *job)
{
    const int64_t n = job->n, d = job->d, nq = job->nq, k = job->k;
    const int64_t kk = k < n ? k : n;
    const xknn_metric metric = job->params.metric;
    const int64_t roff = job->params.ref_id_offset, qoff = job->params.query_id_offset;
    const int exclude = job->params.exclude_self;
    int64_t RB = job->params.ref_block ? job->params.ref_block : 256;
    int64_t QB = job->params.query_block ? job->params.query_block : 64;
    const int nt = xknn__threads(job);
    float *rt = NULL;
    xknn__pair *heaps = NULL;
    int64_t *hsize = NULL;
    int64_t q0, r0, i;
    xknn_status st = XKNN_SUCCESS;

    if (RB > n) RB = n;
    if (QB > nq) QB = nq;
    /* Bound heap memory to ~256 MiB for large k. */
    while (QB > 1 && (double)QB * (double)kk * sizeof(xknn__pair) > 256.0 * 1024 * 1024) QB /= 2;

    rt = (float *)malloc((size_t)(RB * d) * sizeof(float));
    heaps = (xknn__pair *)malloc((size_t)(QB * kk) * sizeof(xknn__pair));
    hsize = (int64_t *)malloc((size_t)QB * sizeof(int64_t));
    if (!rt || !heaps || !hsize) {
        st = xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory for blocks (%lld x %lld)",
                            (long long)QB, (long long)kk);
        goto done;
    }

    for (q0 = 0; q0 < nq; q0 += QB) {
        const int64_t qb = nq - q0 < QB ? nq - q0 : QB;
        for (i = 0; i < qb; i++) hsize[i] = 0;
        for (r0 = 0; r0 < n; r0 += RB) {
            const int64_t rb = n - r0 < RB ? n - r0 : RB;
            int64_t t, j;
            for (j = 0; j < rb; j++) {
                const float *x = job->ref + (r0 + j) * job->ldr;
                for (t = 0; t < d; t++) rt[t * RB + j] = x[t];
            }
#pragma omp parallel num_threads(nt)
            {
                double *acc = (double *)malloc((size_t)rb * sizeof(double));
                float *out = (float *)malloc((size_t)rb * sizeof(float));
                int64_t ii;
                if (acc && out) {
#pragma omp for schedule(dynamic, 1)
                    for (ii = 0; ii < qb; ii++) {
                        const int64_t qg = qoff + q0 + ii;
                        int64_t jj;
                        xknn__canonical_block(metric, job->query + (q0 + ii) * job->ldq, rt, RB, rb, d, acc,
                                              out);
                        for (jj = 0; jj < rb; jj++) {
                            const int64_t id = roff + r0 + jj;
                            if (exclude && id == qg) continue;
                            xknn__pheap_push(heaps + ii * kk, &hsize[ii], kk, out[jj], id);
                        }
                    }
                } else {
#pragma omp critical(xknn_cpu_oom)
                    st = XKNN_ERROR_OUT_OF_MEMORY;
                }
                free(acc);
                free(out);
            }
            if (st != XKNN_SUCCESS) {
                xknn__cpu_fail(job, st, "cpu backend: out of memory for a %lld-reference block", (long long)rb);
                goto done;
            }
        }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4)
        for (i = 0; i < qb; i++) {
            qsort(heaps + i * kk, (size_t)hsize[i], sizeof(xknn__pair), xknn__pair_cmp);
            xknn__emit(job, q0 + i, heaps + i * kk, hsize[i]);
        }
    }
done:
    free(rt);
    free(heaps);
    free(hsize);
    return st;
}

/* ----------------------------------------------------------------------------------- */
/* BLAS path                                                                           */
/* ----------------------------------------------------------------------------------- */
#ifdef XKNN_HAVE_CBLAS


/* k-th smallest (0-based) of v[0..n), reordering v: iterative quickselect. */
static float xknn__select_kth(float *v, int64_t n, int64_t kth)
{
    int64_t lo = 0, hi = n - 1;
    while (hi > lo) {
        const float pivot = v[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot) i++;
            while (v[j] > pivot) j--;
            if (i <= j) {
                float t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        if (kth <= j)
            hi = j;
        else if (kth >= i)
            lo = i;
        else
            return v[kth];
    }
    return v[kth];
}

/* Tighten tau' from the k smallest upper bounds in the buffer (k distinct references
 * whose distance is at most tau), then drop every candidate whose lower bound exceeds
 * tau': those have a canonical distance strictly greater than k others'. */
static void xknn__prune(xknn__qstate *s, int64_t kk, float *vals)
{
    int64_t c, m = 0;
    if (s->count >= kk) {
        float t;
        memcpy(vals, s->cand_hi, (size_t)s->count * sizeof(float));
        t = xknn__select_kth(vals, s->count, kk - 1) * (1.0f + 0x1p-19f) + 16.0f * FLT_MIN;
        if (t < s->tau) s->tau = t;
    }
    for (c = 0; c < s->count; c++) {
        if (s->cand_lo[c] > s->tau) continue;
        s->cand[m] = s->cand[c];
        s->cand_lo[m] = s->cand_lo[c];
        s->cand_hi[m] = s->cand_hi[c];
        s->cand_c[m] = s->cand_c[c];
        m++;
    }
    s->count = m;
}

/* Prune, compute the canonical distance of every remaining candidate, and if more than
 * `keep` remain, keep the exact best `keep` by (distance, id): anything cut has `keep`
 * better ones in the buffer, forever (they are marked exact and never dropped).
 * rows/vals/tmp are scratch of the buffer's capacity. */
int64_t xknn__rerank(const xknn__job *job, xknn__qstate *s, const float *q, int64_t keep, int64_t *rows,
                            float *vals, xknn__pair *tmp, int64_t kk)
{
    int64_t c, m, todo = 0;
    xknn__prune(s, kk, vals);
    m = s->count;
    for (c = 0; c < m; c++)
        if (s->cand_c[c] != s->cand_c[c]) tmp[todo++].id = c; /* buffer positions */
    if (todo) {
        int64_t t;
        for (t = 0; t < todo; t++) rows[t] = s->cand[tmp[t].id];
        xknn__canonical_many(job->params.metric, q, job->ref, job->ldr, rows, todo, job->d, vals);
        for (t = 0; t < todo; t++) s->cand_c[tmp[t].id] = vals[t];
    }
    if (m <= keep) return m;
    for (c = 0; c < m; c++) {
        tmp[c].d = s->cand_c[c];
        tmp[c].id = s->cand[c]; /* local row: same order as the global id */
    }
    qsort(tmp, (size_t)m, sizeof(xknn__pair), xknn__pair_cmp);
    for (c = 0; c < keep; c++) {
        /* an upper bound of the squared distance from the canonical value: it is the
         * double sum rounded once (relative error < 2^-23 with the sum's own error),
         * squared back for euclidean; 2^-21 and an absolute term are generous */
        const double cd = (double)tmp[c].d * (1.0 + 0x1p-21);
        const double hi = (job->params.metric == XKNN_METRIC_EUCLIDEAN ? cd * cd : cd) + 0x1p-140;
        float hf = (float)hi;
        if ((double)hf < hi) hf = nextafterf(hf, INFINITY);
        s->cand[c] = tmp[c].id;
        s->cand_c[c] = tmp[c].d;
        s->cand_hi[c] = hf;
        s->cand_lo[c] = -INFINITY; /* exact now: never dropped by the bound */
    }
    s->count = keep;
    return keep;
}

/* Slow path of the scan: the references of [j0, je) that pass the fast filter. */
static float xknn__scan_slow(const xknn__job *job, xknn__qstate *s, const float *crow, int64_t r0, int64_t j0,
                             int64_t je, const float *nx, float nqi, float eps, float absb, int64_t self_row,
                             int64_t kk, int64_t cap, const float *q, int64_t *rows, float *vals, xknn__pair *tmp,
                             float one_m, float thr)
{
    int64_t j;
    for (j = j0; j < je; j++) {
        double sj, e, lo, hi;
        float hf;
        if (!(nx[r0 + j] * one_m + crow[j] <= thr)) continue;
        if (r0 + j == self_row) continue;
        sj = (double)nqi + (double)nx[r0 + j];
        e = sj + (double)crow[j];
        lo = e - (double)eps * sj - (double)absb;
        if (lo > (double)s->tau) continue;
        hi = e + (double)eps * sj + (double)absb;
        if (s->count >= s->trigger) {
            xknn__prune(s, kk, vals);
            /* next prune when the buffer has grown by half of what is left in it */
            s->trigger = s->count + (s->count > kk ? s->count : kk) / 2 + 64;
            if (s->trigger > cap) s->trigger = cap;
            /* still crowded (ties): exact re-rank cuts the buffer to k */
            if (s->count > cap / 2) xknn__rerank(job, s, q, kk, rows, vals, tmp, kk);
            thr = s->tau - (nqi * one_m - 2.0f * absb);
        }
        hf = (float)hi; /* the upper bound must round up */
        if ((double)hf < hi) hf = nextafterf(hf, INFINITY);
        s->cand[s->count] = r0 + j;
        s->cand_lo[s->count] = (float)lo; /* compared with tau' only loosely: tau' has 2^-19 slack */
        s->cand_hi[s->count] = hf;
        s->cand_c[s->count] = NAN;
        s->count++;
    }
    return thr;
}

/* Scan one row of the tile: crow = -2 q.x for references r0 .. r0+rb-1. The fast filter
 * e - 2 eps s - 2 abs <= tau' (twice the margin: it covers its own float rounding) runs
 * 16 references at a time and branch-free; survivors take the slow path, which repeats
 * the same float test per reference and then the rigorous one in double. */
#define XKNN__SCAN_ARGS                                                                                         \
    const xknn__job *job, xknn__qstate *s, const float *crow, int64_t r0, int64_t rb, const float *nx, float nqi, \
        float eps, float absb, int64_t self_row, int64_t kk, int64_t cap, const float *q, int64_t *rows,       \
        float *vals, xknn__pair *tmp
#define XKNN__SCAN_SLOW(j0, je) \
    xknn__scan_slow(job, s, crow, r0, j0, je, nx, nqi, eps, absb, self_row, kk, cap, q, rows, vals, tmp, one_m, thr)

static void scan_row_portable(XKNN__SCAN_ARGS)
{
    const float one_m = 1.0f - 2.0f * eps;
    const float *nxr = nx + r0;
    float thr = s->tau - (nqi * one_m - 2.0f * absb);
    int64_t j0 = 0;
    for (; j0 + 16 <= rb; j0 += 16) {
        int any = 0, u;
        for (u = 0; u < 16; u++) any |= (nxr[j0 + u] * one_m + crow[j0 + u] <= thr);
        if (any) thr = XKNN__SCAN_SLOW(j0, j0 + 16);
    }
    if (j0 < rb) XKNN__SCAN_SLOW(j0, rb);
}

#ifdef XKNN__HAVE_CLONES
#include <immintrin.h>
XKNN__TARGET_FAST static void scan_row_fast(XKNN__SCAN_ARGS)
{
    const float one_m = 1.0f - 2.0f * eps;
    const float *nxr = nx + r0;
    const __m256 vone = _mm256_set1_ps(one_m);
    float thr = s->tau - (nqi * one_m - 2.0f * absb);
    __m256 vthr = _mm256_set1_ps(thr);
    int64_t j0 = 0;
    for (; j0 + 16 <= rb; j0 += 16) {
        /* separate multiply and add: the same two roundings as the scalar test */
        __m256 a = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(nxr + j0), vone), _mm256_loadu_ps(crow + j0));
        __m256 b = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(nxr + j0 + 8), vone), _mm256_loadu_ps(crow + j0 + 8));
        __m256 m = _mm256_or_ps(_mm256_cmp_ps(a, vthr, _CMP_LE_OQ), _mm256_cmp_ps(b, vthr, _CMP_LE_OQ));
        if (_mm256_movemask_ps(m)) {
            thr = XKNN__SCAN_SLOW(j0, j0 + 16);
            vthr = _mm256_set1_ps(thr);
        }
    }
    if (j0 < rb) XKNN__SCAN_SLOW(j0, rb);
}
#else
#define scan_row_fast scan_row_portable
#endif

#define XKNN__SCAN_CALL job, s, crow, r0, rb, nx, nqi, eps, absb, self_row, kk, cap, q, rows, vals, tmp
void xknn__scan_row(XKNN__SCAN_ARGS)
{
    if (s->tau == INFINITY && s->count == 0 && rb > kk) {
        /* First tile of this query: seed tau from the k smallest upper bounds of the
         * whole row (self excluded), so the filter is tight from the start instead of
         * admitting every early reference. vals holds at least rb floats. */
        /* A prefix of a few k references is enough for a tight first threshold. */
        const int64_t seed = rb < 4 * kk + 256 ? rb : 4 * kk + 256;
        int64_t j, m = 0;
        for (j = 0; j < seed; j++) {
            const double sj = (double)nqi + (double)nx[r0 + j];
            const double hi = sj + (double)crow[j] + (double)eps * sj + (double)absb;
            if (r0 + j == self_row) continue;
            /* hi >= D >= 0; rounding to float and the factor each err by <= 2^-24: up */
            vals[m++] = (float)hi * (1.0f + 0x1p-22f);
        }
        if (m >= kk) s->tau = xknn__select_kth(vals, m, kk - 1) * (1.0f + 0x1p-19f) + 16.0f * FLT_MIN;
    }
    if (xknn__cpu_has_fast())
        scan_row_fast(XKNN__SCAN_CALL);
    else
        scan_row_portable(XKNN__SCAN_CALL);
}

/* OpenBLAS, when it is the BLAS, is asked for its threading (weak references: any other
 * CBLAS links too). Each OpenMP thread runs its own single-threaded sgemm on its own
 * query block, so the tile stays in that core's cache and no BLAS thread pool competes
 * with ours. OpenBLAS's OpenMP build does this by itself inside a parallel region; its
 * pthreads build is set to one thread for the duration of the call and restored after
 * (the same thing threadpoolctl does for Python programs). */
#if defined(__GNUC__) || defined(__clang__)
extern int openblas_get_parallel(void) __attribute__((weak));
extern int openblas_get_num_threads(void) __attribute__((weak));
extern void openblas_set_num_threads(int) __attribute__((weak));
#define XKNN__HAVE_WEAK 1
#endif

int xknn__blas_threads_single(int nt)
{
#ifdef XKNN__HAVE_WEAK
    if (nt > 1 && openblas_get_parallel && openblas_get_num_threads && openblas_set_num_threads &&
        openblas_get_parallel() == 1) {
        const int saved = openblas_get_num_threads();
        openblas_set_num_threads(1);
        return saved;
    }
#endif
    (void)nt;
    return -1;
}

void xknn__blas_threads_restore(int saved)
{
#ifdef XKNN__HAVE_WEAK
    if (saved > 0) openblas_set_num_threads(saved);
#else
    (void)saved;
#endif
}


typedef struct {
    int64_t *rows;    /* re-rank scratch, cap each */
    float *vals;
    xknn__pair *tmp;
    float *tile;      /* QB x RB */
    xknn__qstate *st; /* QB      */
    float *nqv;       /* QB      */
    double *dn;       /* QB      */
    int64_t *cand;    /* QB x cap */
    float *lo, *hi, *cc; /* QB x cap */
} xknn__thread_ws;

static void xknn__ws_free(xknn__thread_ws *w)
{
    free(w->cc);
    free(w->lo);
    free(w->hi);
    free(w->cand);
    free(w->dn);
    free(w->nqv);
    free(w->st);
    free(w->tile);
    free(w->tmp);
    free(w->vals);
    free(w->rows);
}

static int xknn__ws_alloc(xknn__thread_ws *w, int64_t QB, int64_t RB, int64_t cap)
{
    memset(w, 0, sizeof *w);
    w->rows = (int64_t *)malloc((size_t)cap * sizeof(int64_t));
    w->vals = (float *)malloc((size_t)(cap > RB ? cap : RB) * sizeof(float));
    w->tmp = (xknn__pair *)malloc((size_t)cap * sizeof(xknn__pair));
    w->tile = (float *)malloc((size_t)(QB * RB) * sizeof(float));
    w->st = (xknn__qstate *)calloc((size_t)QB, sizeof(xknn__qstate));
    w->nqv = (float *)malloc((size_t)QB * sizeof(float));
    w->dn = (double *)malloc((size_t)QB * sizeof(double));
    w->hi = (float *)malloc((size_t)(QB * cap) * sizeof(float));
    w->cand = (int64_t *)malloc((size_t)(QB * cap) * sizeof(int64_t));
    w->lo = (float *)malloc((size_t)(QB * cap) * sizeof(float));
    w->cc = (float *)malloc((size_t)(QB * cap) * sizeof(float));
    return w->rows && w->vals && w->tmp && w->tile && w->st && w->nqv && w->dn && w->hi && w->cand && w->lo &&
           w->cc;
}

/* One query block [q0, q0+qb) against all references, on the calling thread. */
static void xknn__blas_block(const xknn__job *job, xknn__thread_ws *w, int64_t q0, int64_t qb, int64_t RB,
                             int64_t kk, int64_t cap, const float *nx, float eps, float absb)
{
    const int64_t n = job->n, d = job->d;
    const int64_t roff = job->params.ref_id_offset, qoff = job->params.query_id_offset;
    const float *qblk = job->query + q0 * job->ldq;
    int64_t i, r0;
    for (i = 0; i < qb; i++) {
        w->nqv[i] = nx[job->n + q0 + i]; /* query norms follow the reference norms */
        w->st[i].cand_hi = w->hi + i * cap;
        w->st[i].tau = INFINITY;
        w->st[i].trigger = kk + kk / 2 + 64 < cap ? kk + kk / 2 + 64 : cap;
        w->st[i].cand = w->cand + i * cap;
        w->st[i].cand_lo = w->lo + i * cap;
        w->st[i].cand_c = w->cc + i * cap;
        w->st[i].count = 0;
    }
    for (r0 = 0; r0 < n; r0 += RB) {
        const int64_t rb = n - r0 < RB ? n - r0 : RB;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)qb, (int)rb, (int)d, -2.0f, qblk, (int)job->ldq,
                    job->ref + r0 * job->ldr, (int)job->ldr, 0.0f, w->tile, (int)RB);
        for (i = 0; i < qb; i++) {
            const int64_t self_row = job->params.exclude_self ? qoff + q0 + i - roff : -1;
            xknn__scan_row(job, &w->st[i], w->tile + i * RB, r0, rb, nx, w->nqv[i], eps, absb, self_row, kk, cap,
                           qblk + i * job->ldq, w->rows, w->vals, w->tmp);
        }
    }
    for (i = 0; i < qb; i++) {
        xknn__qstate *s = &w->st[i];
        /* filter by the final tau', re-rank, cut to the exact best kk, sort */
        int64_t m = xknn__rerank(job, s, qblk + i * job->ldq, kk, w->rows, w->vals, w->tmp, kk), c;
        for (c = 0; c < m; c++) {
            w->tmp[c].d = s->cand_c[c];
            w->tmp[c].id = roff + s->cand[c];
        }
        qsort(w->tmp, (size_t)m, sizeof(xknn__pair), xknn__pair_cmp);
        xknn__emit(job, q0 + i, w->tmp, m);
    }
}

static xknn_status xknn__cpu_blas(const xknn__job *job)
{
    const int64_t n = job->n, d = job->d, nq = job->nq, k = job->k;
    const int64_t kk = k < n ? k : n;
    const int nt = xknn__threads(job);
    const double u = 0x1p-24;
    const float eps = (float)(1.25 * (double)(d + 16) * u / (1.0 - (double)(d + 16) * u));
    const float absb = (float)((double)(d + 2) * FLT_MIN);
    const int64_t cap = 4 * kk + 1024; /* room for the early candidates: few overflow re-ranks */
    /* Large blocks: OpenBLAS's single-threaded sgemm packs both operands on every call,
     * and 1280 x 8192 tiles ran the Fashion-MNIST product ~20 % faster than 512 x 2048
     * on a 2-core AVX-512 machine (the tile, 40 MiB, is read once right after). */
    int64_t RB = job->params.ref_block ? job->params.ref_block : 8192;
    int64_t QB = job->params.query_block ? job->params.query_block : 1280;
    int64_t nblocks;
    float *nx = NULL;
    int blas_threads = -1;
    xknn_status status = XKNN_SUCCESS;

    if (RB > n) RB = n;
    /* spread small query sets over the threads; bound candidate memory per thread */
    if (QB * nt > nq) QB = (nq + nt - 1) / nt;
    if (QB < 1) QB = 1;
    while (QB > 16 && (double)QB * (double)(cap * 20) > 128.0 * 1024 * 1024) QB /= 2;
    nblocks = (nq + QB - 1) / QB;

    /* Norms of every reference and query (double, rounded to float), in parallel. The
     * bound needs s = |q|^2 + |x|^2 far below FLT_MAX (then no float product or sum in
     * sgemm overflows, |q_t x_t| <= s/2); otherwise the exact loop path takes over. */
    nx = (float *)malloc((size_t)(n + nq) * sizeof(float));
    if (!nx)
        return xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory for %lld norms",
                              (long long)(n + nq));
    {
        double mref = 0.0, mqry = 0.0;
        int64_t r;
#pragma omp parallel for num_threads(nt) schedule(static, 256) reduction(max : mref)
        for (r = 0; r < n; r++) {
            double v;
            xknn__sqnorms(job->ref + r * job->ldr, 1, job->ldr, d, &v);
            nx[r] = (float)v;
            if (v > mref) mref = v;
        }
#pragma omp parallel for num_threads(nt) schedule(static, 256) reduction(max : mqry)
        for (r = 0; r < nq; r++) {
            double v;
            xknn__sqnorms(job->query + r * job->ldq, 1, job->ldq, d, &v);
            nx[n + r] = (float)v;
            if (v > mqry) mqry = v;
        }
        if (!(mref + mqry < 1e35)) {
            free(nx);
            return XKNN__FALLBACK;
        }
    }

    blas_threads = xknn__blas_threads_single(nt);

#pragma omp parallel num_threads(nt)
    {
        xknn__thread_ws w;
        int64_t b;
        if (xknn__ws_alloc(&w, QB, RB, cap)) {
#pragma omp for schedule(dynamic, 1)
            for (b = 0; b < nblocks; b++) {
                const int64_t q0 = b * QB, qb = nq - q0 < QB ? nq - q0 : QB;
                xknn__blas_block(job, &w, q0, qb, RB, kk, cap, nx, eps, absb);
            }
        } else {
#pragma omp critical(xknn_cpu_oom)
            status = XKNN_ERROR_OUT_OF_MEMORY;
        }
        xknn__ws_free(&w);
    }

    xknn__blas_threads_restore(blas_threads);
    free(nx);
    return status != XKNN_SUCCESS ? xknn__cpu_tile_oom(job, QB, RB, cap) : XKNN_SUCCESS;
}

xknn_status xknn__cpu_tile_oom(const xknn__job *job, int64_t qb, int64_t rb, int64_t cap)
{
    return xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY,
                          "cpu backend: out of memory for a %lld x %lld tile and %lld candidates per query",
                          (long long)qb, (long long)rb, (long long)cap);
}
#endif /* XKNN_HAVE_CBLAS */

/* ----------------------------------------------------------------------------------- */
/* Every metric and dtype: the canonical loop                                            */
/* ----------------------------------------------------------------------------------- */
xknn__dist_fn xknn__pick_dist(xknn_dtype dtype)
{
    switch (dtype) {
    case XKNN_DTYPE_F16: return xknn__cm_dist_f16;
    case XKNN_DTYPE_BF16: return xknn__cm_dist_bf16;
    case XKNN_DTYPE_U8: return xknn__cm_dist_u8;
    case XKNN_DTYPE_I8: return xknn__cm_dist_i8;
    case XKNN_DTYPE_BIN: return xknn__cm_dist_bin;
    default: return xknn__cm_dist_f32;
    }
}

/* Each query against every reference in id order, canonical value per pair, a bounded
 * max-heap of the k best by (key, id) where key is the value (its negation for ip).
 * OpenMP over queries; memory: one k-heap per thread. The result does not depend on
 * any block size: there is no candidate filter, every pair is exact. */
static xknn_status xknn__cpu_generic(const xknn__job *job)
{
    const int64_t n = job->n, d = job->d, nq = job->nq, k = job->k;
    const int64_t kk = k < n ? k : n;
    const int64_t roff = job->params.ref_id_offset, qoff = job->params.query_id_offset;
    const int exclude = job->params.exclude_self;
    const int neg = job->params.metric == XKNN_METRIC_IP;
    const size_t eb = xknn__dtype_bytes(job->dtype);
    const unsigned char *rbase = (const unsigned char *)job->ref_data;
    const unsigned char *qbase = (const unsigned char *)job->query_data;
    const xknn__dist_fn dist_fn = xknn__pick_dist(job->dtype);
    const int nt = xknn__threads(job);
    xknn__cm_spec spec;
    xknn_status st = XKNN_SUCCESS;
    int64_t qi;

    spec.metric = job->params.metric;
    spec.dtype = job->dtype;
    spec.p = job->params.p;
    spec.weights = job->params.weights;

#pragma omp parallel num_threads(nt)
    {
        xknn__pair *heap = (xknn__pair *)malloc((size_t)kk * sizeof(xknn__pair));
        if (heap) {
#pragma omp for schedule(dynamic, 4)
            for (qi = 0; qi < nq; qi++) {
                const void *q = qbase + (size_t)(qi * job->ldq) * eb;
                const int64_t qg = qoff + qi;
                int64_t j, have = 0;
                int64_t *ids = job->ids + qi * k;
                float *dist = job->dist ? job->dist + qi * k : NULL;
                for (j = 0; j < n; j++) {
                    const int64_t id = roff + j;
                    float v;
                    if (exclude && id == qg) continue;
                    v = dist_fn(&spec, q, rbase + (size_t)(j * job->ldr) * eb, d);
                    xknn__pheap_push(heap, &have, kk, neg ? -v : v, id);
                }
                qsort(heap, (size_t)have, sizeof(xknn__pair), xknn__pair_cmp);
                for (j = 0; j < k; j++) {
                    ids[j] = j < have ? heap[j].id : -1;
                    if (dist) dist[j] = j < have ? (neg ? -heap[j].d : heap[j].d) : (neg ? -INFINITY : INFINITY);
                }
            }
        } else {
#pragma omp critical(xknn_cpu_oom)
            st = XKNN_ERROR_OUT_OF_MEMORY;
        }
        free(heap);
    }
    if (st != XKNN_SUCCESS)
        return xknn__cpu_fail(job, st, "cpu backend: out of memory for a %lld-entry heap per thread", (long long)kk);
    return XKNN_SUCCESS;
}

xknn_status xknn__cpu_search(const xknn__job *job)
{
    xknn_cpu_path path = job->params.cpu_path;
    if (job->symmetric) {
        /* self-join: each distance once for both points where the metric's fast path
         * allows it (sym_search.c); otherwise the plain Q = R search below */
        const char *why = xknn__cpu_sym_why_not(&job->params, job->dtype, job->d);
        if (!why) {
            if (job->params.verbose) fprintf(stderr, "xknn: cpu backend: symmetric self-join\n");
            return xknn__cpu_sym_self(job);
        }
        if (job->params.verbose) fprintf(stderr, "xknn: cpu backend: %s\n", why);
    }
    /* u8/i8 with l2, euclidean, ip: exact integer dot products (VNNI where present);
     * cpu_path LOOP keeps the canonical loop (same results, used to cross-check). */
    if (path != XKNN_CPU_PATH_LOOP && xknn__cpu_int8_applies(job)) return xknn__cpu_int8(job);
    if (job->dtype == XKNN_DTYPE_F32 && (path == XKNN_CPU_PATH_AUTO || path == XKNN_CPU_PATH_INT8)) {
        /* f32 l2/euclidean/ip whose values are all 8-bit integers (pixels, int8 codes):
         * converted once and searched exactly by the integer kernel */
        xknn_status st = xknn__cpu_int8_f32(job, path == XKNN_CPU_PATH_INT8);
        if (st != XKNN__FALLBACK) return st;
    }
#ifdef XKNN_HAVE_CBLAS
    /* f32 ip and cosine: certified sgemm candidates, canonical re-rank */
    if (path != XKNN_CPU_PATH_LOOP && job->dtype == XKNN_DTYPE_F32 &&
        (job->params.metric == XKNN_METRIC_IP || job->params.metric == XKNN_METRIC_COSINE)) {
        xknn_status st = xknn__cpu_gemm_ip(job);
        if (st != XKNN__FALLBACK) return st;
        if (job->params.verbose)
            fprintf(stderr, "xknn: cpu backend: values or sizes out of the BLAS path's range; exact loop\n");
        return xknn__cpu_generic(job);
    }
#endif
    if (job->dtype != XKNN_DTYPE_F32 ||
        (job->params.metric != XKNN_METRIC_L2 && job->params.metric != XKNN_METRIC_EUCLIDEAN))
        return xknn__cpu_generic(job);
#ifdef XKNN_HAVE_CBLAS
    if (path != XKNN_CPU_PATH_LOOP) {
        /* The bound needs float products that neither overflow nor lose all meaning,
         * and BLAS takes int sizes. Otherwise the loop path gives the same result. */
        if (job->d < (1 << 20) && job->ldr <= INT_MAX && job->ldq <= INT_MAX) {
            xknn_status st = xknn__cpu_blas(job);
            if (st != XKNN__FALLBACK) return st;
        }
        if (job->params.verbose)
            fprintf(stderr, "xknn: cpu backend: values or sizes out of the BLAS path's range; exact loop\n");
    }
#else
    if (path == XKNN_CPU_PATH_BLAS)
        return xknn__cpu_fail(job, XKNN_ERROR_NOT_BUILT,
                              "cpu backend: BLAS path requested but xknn was built without CBLAS (-Dblas)");
#endif
    (void)path;
    return xknn__cpu_loop(job);
}
