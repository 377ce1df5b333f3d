/* SPDX-License-Identifier: MIT */
/*
 * CPU backend: ip and cosine on float32 through sgemm candidates, certified, then the
 * canonical value decides (docs/DESIGN.md section 2.3).
 *
 * For a query q and a reference x let B = |q| |x| (double norms), P = q.x exactly, and
 * e the float sgemm value of q.x. Whatever order and blocking the BLAS uses,
 *     |e - P| <= eps B + abs,  eps = 1.25 (d + 16) u / (1 - (d + 16) u),  u = 2^-24,
 *     abs = (d + 2) FLT_MIN        (Cauchy-Schwarz: sum |q_t x_t| <= B; products that
 * underflow lose at most FLT_MIN each), as for the l2 path in cpu_search.c. The
 * canonical value is f = (float)Pd with Pd the double chain of xknn.h:
 * |Pd - P| <= d 2^-53 B (1 + tiny) and |f - Pd| <= 2^-24 |Pd| + 2^-150, so
 *     ip:      |f - e| <= M = (eps + d 2^-52 + 2^-22) B + abs + 2^-140
 *     cosine:  c = 1 - Pd / sqrt(nx ny) adds the relative errors of the norms, the
 *              square root and the division (each <= d 2^-52 for the norms, 2^-53 for
 *              the others) and the float rounding of a value in [0, 2] (<= 2^-23):
 *              |f - (1 - e/B)| <= Mc = eps + abs / B + d 2^-50 + 2^-21 + 2^-27 (the last
 *              for B being computed 2^-30 above the norms' product), clipped to [0, 2]
 * (the factors are generous: every double operation of the bound itself errs by far
 * less than the slack). B = 0 (a zero vector): f = 1 exactly. So every pair has a key
 * interval [kl, ku] holding its exact order key (-f for ip, f for cosine). Per query the
 * k smallest ku give tau; a reference with kl > tau has a key strictly greater than k
 * others and cannot be in the top k whatever its id. Candidates (kl <= tau when seen)
 * are re-ranked with the canonical value; when a candidate buffer fills with ties, an
 * exact re-rank cuts it to its best k, which is exact too.
 *
 * Range: every |q_t x_t| and partial sum is <= B, so max|q| max|x| < 1e37 keeps sgemm
 * finite; otherwise the canonical loop runs (same results).
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

#include "canonical.h"
#include "cpu_internal.h"

#ifdef XKNN_HAVE_CBLAS
#include <cblas.h>

typedef struct {
    double kl, ku; /* key interval; kl = ku = key once exact */
    int64_t row;
    int exact;
} xknn__gc;

/* Per-query state: candidates and the k smallest ku seen (max-heap). */
typedef struct {
    xknn__gc *cand;
    int64_t count, cap;
    double *top; /* max-heap of the kk smallest ku */
    int64_t ntop;
} xknn__gq;

static double xknn__gq_tau(const xknn__gq *s, int64_t kk) { return s->ntop == kk ? s->top[0] : INFINITY; }

static void xknn__gq_top(xknn__gq *s, int64_t kk, double ku)
{
    int64_t i;
    if (s->ntop < kk) {
        i = s->ntop++;
        while (i > 0 && s->top[(i - 1) / 2] < ku) {
            s->top[i] = s->top[(i - 1) / 2];
            i = (i - 1) / 2;
        }
        s->top[i] = ku;
        return;
    }
    if (!(ku < s->top[0])) return;
    i = 0;
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        double mv = ku;
        if (l < kk && s->top[l] > mv) {
            m = l;
            mv = s->top[l];
        }
        if (r < kk && s->top[r] > mv) m = r;
        if (m == i) break;
        s->top[i] = s->top[m];
        i = m;
    }
    s->top[i] = ku;
}

static float xknn__gemm_canon(const xknn__job *job, const float *q, int64_t row)
{
    xknn__cm_spec sp;
    sp.metric = job->params.metric;
    sp.dtype = XKNN_DTYPE_F32;
    sp.p = 0;
    sp.weights = NULL;
    return xknn__cm_dist_f32(&sp, q, job->ref + row * job->ldr, job->d);
}

/* Drop candidates with kl > tau; if still more than half full, make every candidate
 * exact and keep the best kk by (key, id). tmp: cap entries. */
static void xknn__gq_shrink(const xknn__job *job, xknn__gq *s, int64_t kk, const float *q, xknn__keyed *tmp,
                            int force_exact)
{
    const int ip = job->params.metric == XKNN_METRIC_IP;
    const double tau = xknn__gq_tau(s, kk);
    int64_t c, m = 0;
    for (c = 0; c < s->count; c++)
        if (s->cand[c].kl <= tau) s->cand[m++] = s->cand[c];
    s->count = m;
    if (!force_exact && s->count <= s->cap / 2) return;
    for (c = 0; c < s->count; c++) {
        if (!s->cand[c].exact) {
            const float f = xknn__gemm_canon(job, q, s->cand[c].row);
            s->cand[c].kl = s->cand[c].ku = ip ? -(double)f : (double)f;
            s->cand[c].exact = 1;
        }
        tmp[c].key = s->cand[c].kl;
        tmp[c].id = s->cand[c].row;
    }
    qsort(tmp, (size_t)s->count, sizeof *tmp, xknn__keyed_cmp);
    if (s->count > kk) s->count = kk;
    for (c = 0; c < s->count; c++) {
        s->cand[c].kl = s->cand[c].ku = tmp[c].key;
        s->cand[c].row = tmp[c].id;
        s->cand[c].exact = 1; /* (already counted in the top heap through its ku) */
    }
}

xknn_status xknn__cpu_gemm_ip(const xknn__job *job)
{
    const int64_t n = job->n, d = job->d, nq = job->nq, k = job->k;
    const int64_t kk = k < n ? k : n;
    const int ip = job->params.metric == XKNN_METRIC_IP;
    const double u = 0x1p-24;
    const double eps = 1.25 * (double)(d + 16) * u / (1.0 - (double)(d + 16) * u);
    const double absb = (double)(d + 2) * (double)FLT_MIN;
    const double m_ip = eps + (double)d * 0x1p-52 + 0x1p-22;
    const double m_cos = eps + (double)d * 0x1p-50 + 0x1p-21 + 0x1p-27; /* 2^-27: the norms' slack */
    const int64_t roff = job->params.ref_id_offset, qoff = job->params.query_id_offset;
    const int64_t cap = 4 * kk + 1024;
    int64_t RB = job->params.ref_block ? job->params.ref_block : 4096;
    int64_t QB = job->params.query_block ? job->params.query_block : 256;
    int nt = 1, blas_threads = -1;
    double *nrm = NULL, mref = 0.0, mqry = 0.0;
    int64_t r, nblocks;
    xknn_status st = XKNN_SUCCESS;

#ifdef _OPENMP
    nt = job->params.num_threads > 0 ? job->params.num_threads : xknn_thread_budget();
#endif
    if (d >= (1 << 20) || job->ldr > INT_MAX || job->ldq > INT_MAX) return (xknn_status)-1;
    if (RB > n) RB = n;
    if (QB * nt > nq) QB = (nq + nt - 1) / nt;
    if (QB < 1) QB = 1;
    while (QB > 8 && (double)QB * (double)(RB + cap * 3) * 8.0 > 128.0 * 1024 * 1024) QB /= 2;
    nblocks = (nq + QB - 1) / QB;

    nrm = (double *)malloc((size_t)(n + nq) * sizeof(double));
    if (!nrm)
        return xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory for %lld norms",
                              (long long)(n + nq));
#pragma omp parallel for num_threads(nt) schedule(static, 256) reduction(max : mref)
    for (r = 0; r < n; r++) {
        double v;
        xknn__sqnorms(job->ref + r * job->ldr, 1, job->ldr, d, &v);
        nrm[r] = sqrt(v) * (1.0 + 0x1p-30); /* an upper bound of the exact norm (d < 2^20) */
        if (nrm[r] > mref) mref = nrm[r];
    }
#pragma omp parallel for num_threads(nt) schedule(static, 256) reduction(max : mqry)
    for (r = 0; r < nq; r++) {
        double v;
        xknn__sqnorms(job->query + r * job->ldq, 1, job->ldq, d, &v);
        nrm[n + r] = sqrt(v) * (1.0 + 0x1p-30);
        if (nrm[n + r] > mqry) mqry = nrm[n + r];
    }
    if (!(mref * mqry < 1e37)) {
        free(nrm);
        return (xknn_status)-1;
    }

    blas_threads = xknn__blas_threads_single(nt);

#pragma omp parallel num_threads(nt)
    {
        float *tile = (float *)malloc((size_t)(QB * RB) * sizeof(float));
        xknn__gc *cands = (xknn__gc *)malloc((size_t)(QB * cap) * sizeof(xknn__gc));
        double *tops = (double *)malloc((size_t)(QB * kk) * sizeof(double));
        xknn__gq *qs = (xknn__gq *)malloc((size_t)QB * sizeof(xknn__gq));
        xknn__keyed *tmp = (xknn__keyed *)malloc((size_t)cap * sizeof(xknn__keyed));
        int64_t b;
        if (!tile || !cands || !tops || !qs || !tmp) {
#pragma omp critical(xknn_cpu_oom)
            st = XKNN_ERROR_OUT_OF_MEMORY;
        } else {
#pragma omp for schedule(dynamic, 1)
            for (b = 0; b < nblocks; b++) {
                const int64_t q0 = b * QB, qb = nq - q0 < QB ? nq - q0 : QB;
                const float *qblk = job->query + q0 * job->ldq;
                int64_t i, r0, c;
                for (i = 0; i < qb; i++) {
                    qs[i].cand = cands + i * cap;
                    qs[i].count = 0;
                    qs[i].cap = cap;
                    qs[i].top = tops + i * kk;
                    qs[i].ntop = 0;
                }
                for (r0 = 0; r0 < n; r0 += RB) {
                    const int64_t rb = n - r0 < RB ? n - r0 : RB;
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)qb, (int)rb, (int)d, 1.0f, qblk,
                                (int)job->ldq, job->ref + r0 * job->ldr, (int)job->ldr, 0.0f, tile, (int)RB);
                    for (i = 0; i < qb; i++) {
                        xknn__gq *s = &qs[i];
                        const float *row = tile + i * RB;
                        const double nqi = nrm[n + q0 + i];
                        const int64_t qg = qoff + q0 + i;
                        double tau = xknn__gq_tau(s, kk);
                        int64_t j;
                        for (j = 0; j < rb; j++) {
                            const double B = nqi * nrm[r0 + j], e = (double)row[j];
                            double kl, ku;
                            if (job->params.exclude_self && roff + r0 + j == qg) continue;
                            if (ip) {
                                const double m = m_ip * B + absb + 0x1p-140;
                                kl = -(e + m);
                                ku = -(e - m);
                            } else if (B == 0.0) {
                                kl = ku = 1.0;
                            } else {
                                const double est = 1.0 - e / B, m = m_cos + absb / B;
                                kl = est - m;
                                ku = est + m;
                                if (kl < 0.0) kl = 0.0;
                                if (ku > 2.0) ku = 2.0;
                            }
                            if (kl > tau) continue;
                            xknn__gq_top(s, kk, ku);
                            tau = xknn__gq_tau(s, kk);
                            if (s->count == s->cap) {
                                xknn__gq_shrink(job, s, kk, qblk + i * job->ldq, tmp, 0);
                                tau = xknn__gq_tau(s, kk);
                            }
                            s->cand[s->count].kl = kl;
                            s->cand[s->count].ku = ku;
                            s->cand[s->count].row = r0 + j;
                            s->cand[s->count].exact = 0;
                            s->count++;
                        }
                    }
                }
                for (i = 0; i < qb; i++) {
                    xknn__gq *s = &qs[i];
                    int64_t *ids = job->ids + (q0 + i) * k;
                    float *dist = job->dist ? job->dist + (q0 + i) * k : NULL;
                    xknn__gq_shrink(job, s, kk, qblk + i * job->ldq, tmp, 1);
                    for (c = 0; c < k; c++) {
                        const int have = c < s->count;
                        ids[c] = have ? roff + s->cand[c].row : -1;
                        if (dist)
                            dist[c] = have ? (ip ? (float)-s->cand[c].kl : (float)s->cand[c].kl)
                                           : (ip ? -INFINITY : INFINITY);
                    }
                }
            }
        }
        free(tmp);
        free(qs);
        free(tops);
        free(cands);
        free(tile);
    }
    xknn__blas_threads_restore(blas_threads);
    free(nrm);
    return st != XKNN_SUCCESS ? xknn__cpu_tile_oom(job, QB, RB, cap) : XKNN_SUCCESS;
}
#endif /* XKNN_HAVE_CBLAS */
