/* SPDX-License-Identifier: MIT */
/*
 * CPU backend: u8 and i8 inputs with l2, euclidean and ip, exact in integer arithmetic.
 *
 * For integer inputs the canonical value needs no bound and no re-rank: the double
 * chain of xknn.h only adds integers below 2^53, so it equals the integer
 *     D = sum (x_t - y_t)^2 = |x|^2 + |y|^2 - 2 x.y      (l2, euclidean)
 *     P = x.y                                           (ip)
 * and the reported value is D or P rounded once to float ((float)sqrt(D) for
 * euclidean). Every |x_t|, |y_t| <= 255, so |x_t y_t| and (x_t - y_t)^2 are <= 65025 and
 * D, |P| <= 65025 d < 2^31 for d <= XKNN_INT8_EXACT_MAX_D (33025): int32 arithmetic is
 * exact for the results, and the intermediate sums below are computed modulo 2^32
 * (unsigned, or SIMD lanes), which gives the exact value whenever the result fits.
 *
 * Dot products: AVX-512 VNNI vpdpbusd multiplies unsigned bytes by signed bytes and adds
 * groups of four into int32 lanes. u8 x u8: the reference side is stored as y ^ 0x80 =
 * y - 128 (signed), so x.y = dp + 128 sum(x). i8 x i8: the query side is stored as
 * x ^ 0x80 = x + 128 (unsigned), so x.y = dp - 128 sum(y). A portable kernel computes
 * the same dp in plain C when the CPU lacks VNNI (run-time check); both give the same
 * integers, so the same results.
 *
 * Blocking: OpenMP over chunks of up to 1024 queries (dynamic schedule, one parallel
 * region); a thread takes its chunk through every panel of 32 references, packing the
 * panel into the kernel's layout ([d/4 steps][32 refs][4 bytes], 32 x d bytes, in L1)
 * and running the kernel (8 queries x 32 references of int32 at a time) over the
 * chunk's queries (in L2). Memory: per thread the chunk's queries and top-k heaps
 * (<= 64 MiB), nothing of size n beyond one int per reference. Each query sees references in increasing id order, so a candidate
 * whose integer E (D for l2/euclidean, -P for ip: the value is monotone in it) exceeds
 * that of the heap's worst element cannot enter: that test runs on 16 lanes at once and
 * only the survivors are pushed with their exact (value, id).
 */
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

#define XKNN__I8_MR 8   /* queries per kernel tile        */
#define XKNN__I8_NR 32  /* references per kernel tile     */

typedef struct {
    float key;  /* order key: the value, or its negation for ip */
    int32_t e;  /* integer order key E                          */
    int64_t id;
} xknn__i8_entry;

static int xknn__i8_less(const xknn__i8_entry *a, float key, int64_t id)
{
    return a->key < key || (a->key == key && a->id < id);
}

/* Bounded max-heap under (key, id); h[0] is the worst kept. */
static void xknn__i8_push(xknn__i8_entry *h, int64_t *size, int64_t cap, float key, int32_t e, int64_t id)
{
    int64_t i;
    if (*size < cap) {
        i = (*size)++;
        while (i > 0) {
            int64_t p = (i - 1) / 2;
            if (!xknn__i8_less(&h[p], key, id)) break;
            h[i] = h[p];
            i = p;
        }
    } else {
        if (!(key < h[0].key || (key == h[0].key && id < h[0].id))) return;
        i = 0;
        for (;;) {
            int64_t l = 2 * i + 1, r = l + 1, m = i;
            float mk = key;
            int64_t mid = id;
            if (l < cap && (mk < h[l].key || (mk == h[l].key && mid < h[l].id))) {
                m = l;
                mk = h[l].key;
                mid = h[l].id;
            }
            if (r < cap && (mk < h[r].key || (mk == h[r].key && mid < h[r].id))) m = r;
            if (m == i) break;
            h[i] = h[m];
            i = m;
        }
    }
    h[i].key = key;
    h[i].e = e;
    h[i].id = id;
}

static int xknn__i8_cmp(const void *pa, const void *pb)
{
    const xknn__i8_entry *a = (const xknn__i8_entry *)pa, *b = (const xknn__i8_entry *)pb;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* ---- kernels: C[i][j] = sum_t A[i][t] * B[j][t] over d4 groups of 4 bytes ------------- */

/* A: MR rows of lda bytes (unsigned operand); Bp: packed panel (signed operand).
 * Epilogue: E[i][j] = qterm[i] + rterm[j] - (dp << shift) (mod 2^32) and mask[i] bit j
 * set when E[i][j] <= worst[i]; E rows are stored only where mask[i] != 0. */
typedef void (*xknn__i8_kernel)(const uint8_t *A, int64_t lda, const int8_t *Bp, int64_t d4, const uint32_t *qterm,
                                const uint32_t *rterm, int shift, const int32_t *worst, int32_t *E, uint32_t *mask);

static void xknn__i8_kernel_portable(const uint8_t *A, int64_t lda, const int8_t *Bp, int64_t d4,
                                     const uint32_t *qterm, const uint32_t *rterm, int shift, const int32_t *worst,
                                     int32_t *E, uint32_t *mask)
{
    int64_t t;
    int i, j, u;
    uint32_t acc[XKNN__I8_MR][XKNN__I8_NR];
    memset(acc, 0, sizeof acc);
    for (t = 0; t < d4; t++) {
        const int8_t *b = Bp + t * XKNN__I8_NR * 4;
        for (i = 0; i < XKNN__I8_MR; i++) {
            const uint8_t *a = A + i * lda + 4 * t;
            for (j = 0; j < XKNN__I8_NR; j++) {
                int32_t s = 0;
                for (u = 0; u < 4; u++) s += (int32_t)a[u] * (int32_t)b[4 * j + u];
                acc[i][j] += (uint32_t)s;
            }
        }
    }
    for (i = 0; i < XKNN__I8_MR; i++) {
        uint32_t m = 0;
        for (j = 0; j < XKNN__I8_NR; j++) {
            const int32_t e = (int32_t)(qterm[i] + rterm[j] - (acc[i][j] << shift));
            E[i * XKNN__I8_NR + j] = e;
            m |= (uint32_t)(e <= worst[i]) << j;
        }
        mask[i] = m;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(XKNN_NO_CLONES)
#include <immintrin.h>
#define XKNN__I8_HAVE_VNNI 1
#define XKNN__TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

/* F(i, x0, x1) for each row i of the 8-row block with its two accumulators (columns
 * 0-15 and 16-31). */
#define XKNN__I8_ROWS(F)                                        \
    F(0, c00, c01) F(1, c10, c11) F(2, c20, c21) F(3, c30, c31) \
    F(4, c40, c41) F(5, c50, c51) F(6, c60, c61) F(7, c70, c71)

XKNN__TARGET_VNNI static void xknn__i8_kernel_vnni(const uint8_t *A, int64_t lda, const int8_t *Bp, int64_t d4,
                                                   const uint32_t *qterm, const uint32_t *rterm, int shift,
                                                   const int32_t *worst, int32_t *E, uint32_t *mask)
{
    __m512i c00 = _mm512_setzero_si512(), c01 = _mm512_setzero_si512(), c10 = _mm512_setzero_si512(),
            c11 = _mm512_setzero_si512(), c20 = _mm512_setzero_si512(), c21 = _mm512_setzero_si512(),
            c30 = _mm512_setzero_si512(), c31 = _mm512_setzero_si512(), c40 = _mm512_setzero_si512(),
            c41 = _mm512_setzero_si512(), c50 = _mm512_setzero_si512(), c51 = _mm512_setzero_si512(),
            c60 = _mm512_setzero_si512(), c61 = _mm512_setzero_si512(), c70 = _mm512_setzero_si512(),
            c71 = _mm512_setzero_si512();
    int64_t t;
    for (t = 0; t < d4; t++) {
        const __m512i b0 = _mm512_loadu_si512((const void *)(Bp + t * 128));
        const __m512i b1 = _mm512_loadu_si512((const void *)(Bp + t * 128 + 64));
        const uint8_t *a = A + 4 * t;
        int32_t w;
        __m512i av;
#define XKNN__I8_ROW(i, x0, x1)                                  \
    memcpy(&w, a + (i) * lda, 4);                                \
    av = _mm512_set1_epi32(w);                                   \
    x0 = _mm512_dpbusd_epi32(x0, av, b0);                        \
    x1 = _mm512_dpbusd_epi32(x1, av, b1);
        XKNN__I8_ROWS(XKNN__I8_ROW)
#undef XKNN__I8_ROW
    }
    {
        const __m512i r0 = _mm512_loadu_si512((const void *)rterm), r1 = _mm512_loadu_si512((const void *)(rterm + 16));
        const __m128i sh = _mm_cvtsi32_si128(shift);
        __m512i q, w, e0, e1;
        uint32_t m;
#define XKNN__I8_EPI(i, x0, x1)                                                                   \
    q = _mm512_set1_epi32((int)qterm[i]);                                                         \
    w = _mm512_set1_epi32(worst[i]);                                                              \
    e0 = _mm512_sub_epi32(_mm512_add_epi32(q, r0), _mm512_sll_epi32(x0, sh));                     \
    e1 = _mm512_sub_epi32(_mm512_add_epi32(q, r1), _mm512_sll_epi32(x1, sh));                     \
    m = (uint32_t)_mm512_cmple_epi32_mask(e0, w) | (uint32_t)_mm512_cmple_epi32_mask(e1, w) << 16; \
    mask[i] = m;                                                                                  \
    if (m) {                                                                                      \
        _mm512_storeu_si512((void *)(E + (i) * 32), e0);                                          \
        _mm512_storeu_si512((void *)(E + (i) * 32 + 16), e1);                                     \
    }
        XKNN__I8_ROWS(XKNN__I8_EPI)
#undef XKNN__I8_EPI
    }
}
#undef XKNN__I8_ROWS

static int xknn__i8_has_vnni(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}
#endif

/* ---- the search ------------------------------------------------------------------------- */

int xknn__cpu_int8_applies(const xknn__job *job)
{
    const xknn_metric m = job->params.metric;
    return (job->dtype == XKNN_DTYPE_U8 || job->dtype == XKNN_DTYPE_I8) && job->d <= XKNN_INT8_EXACT_MAX_D &&
           (m == XKNN_METRIC_L2 || m == XKNN_METRIC_EUCLIDEAN || m == XKNN_METRIC_IP);
}

/* The reported value and order key from E. */
static float xknn__i8_key(xknn_metric m, int32_t e)
{
    if (m == XKNN_METRIC_EUCLIDEAN) return (float)sqrt((double)e);
    if (m == XKNN_METRIC_IP) return -(float)(-(int64_t)e); /* key = -value, value = (float)P, P = -E (P = 0: +0) */
    return (float)e;
}

/* Per-thread buffers: one chunk of queries and one packed panel of references. */
typedef struct {
    xknn__i8_entry *heaps; /* qc x kk */
    int64_t *hsize;        /* qc      */
    int32_t *worst;        /* qc: E of the worst kept, INT32_MAX until k are kept */
    uint8_t *qa;           /* qc x lda: unsigned operand rows (zero padded)        */
    uint32_t *qterm;       /* qc      */
    int8_t *panel;         /* d4 x 32 x 4                                         */
} xknn__i8_ws;

static void xknn__i8_ws_free(xknn__i8_ws *w)
{
    free(w->panel);
    free(w->qterm);
    free(w->qa);
    free(w->worst);
    free(w->hsize);
    free(w->heaps);
}

static int xknn__i8_ws_alloc(xknn__i8_ws *w, int64_t qc, int64_t kk, int64_t lda)
{
    memset(w, 0, sizeof *w);
    w->heaps = (xknn__i8_entry *)malloc((size_t)(qc * kk) * sizeof(xknn__i8_entry));
    w->hsize = (int64_t *)malloc((size_t)qc * sizeof(int64_t));
    w->worst = (int32_t *)malloc((size_t)qc * sizeof(int32_t));
    w->qa = (uint8_t *)malloc((size_t)(qc * lda));
    w->qterm = (uint32_t *)malloc((size_t)qc * sizeof(uint32_t));
    w->panel = (int8_t *)malloc((size_t)(lda * XKNN__I8_NR));
    return w->heaps && w->hsize && w->worst && w->qa && w->qterm && w->panel;
}

xknn_status xknn__cpu_int8(const xknn__job *job)
{
    const int64_t n = job->n, d = job->d, nq = job->nq, k = job->k;
    const int64_t kk = k < n ? k : n;
    const int64_t d4 = (d + 3) / 4, lda = 4 * d4;
    const int64_t npanels = (n + XKNN__I8_NR - 1) / XKNN__I8_NR;
    const int is_u8 = job->dtype == XKNN_DTYPE_U8;
    const xknn_metric metric = job->params.metric;
    const int shift = metric == XKNN_METRIC_IP ? 0 : 1;      /* E = qa + rb - (dp << shift) (mod 2^32) */
    const uint32_t flip = is_u8 ? 0x80808080u : 0u;        /* reference bytes -> signed       */
    const int64_t roff = job->params.ref_id_offset, qoff = job->params.query_id_offset;
    const int exclude = job->params.exclude_self;
    const uint8_t *rbase = (const uint8_t *)job->ref_data, *qbase = (const uint8_t *)job->query_data;
    const xknn__i8_kernel kernel =
#ifdef XKNN__I8_HAVE_VNNI
        xknn__i8_has_vnni() ? xknn__i8_kernel_vnni :
#endif
                            xknn__i8_kernel_portable;
    int nt = 1;
    int64_t qc, nchunks, i;
    uint32_t *rterm = NULL;
    xknn_status st = XKNN_SUCCESS;

#ifdef _OPENMP
    nt = job->params.num_threads > 0 ? job->params.num_threads : xknn_thread_budget();
#endif
    /* queries per work item: enough to amortise packing each panel (packing n x d bytes
     * per chunk was ~7 % of Fashion-MNIST's time at 512), few enough for the heaps
     * (<= 64 MiB per thread) and for every thread to get several chunks */
    qc = 1024;
    while (qc > XKNN__I8_MR && (double)qc * (double)kk * sizeof(xknn__i8_entry) > 64.0 * 1024 * 1024) qc /= 2;
    while (qc > XKNN__I8_MR && qc * 4 * nt > nq + qc) qc /= 2;
    qc = (qc + XKNN__I8_MR - 1) / XKNN__I8_MR * XKNN__I8_MR;
    nchunks = (nq + qc - 1) / qc;

    /* Per reference (padded to whole panels with 0): rb = |y|^2 - 2 cr (l2) or -cr (ip),
     * cr = 0 (u8) or -128 sum(y) (i8). */
    rterm = (uint32_t *)calloc((size_t)(npanels * XKNN__I8_NR), sizeof(uint32_t));
    if (!rterm)
        return xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory for %lld reference norms",
                              (long long)n);
#pragma omp parallel for num_threads(nt) schedule(static, 1024)
    for (i = 0; i < n; i++) {
        const uint8_t *y = rbase + i * job->ldr;
        uint32_t sq = 0, sum = 0, cr;
        int64_t t;
        for (t = 0; t < d; t++) {
            const int32_t v = is_u8 ? (int32_t)y[t] : (int32_t)(int8_t)y[t];
            sq += (uint32_t)(v * v);
            sum += (uint32_t)v;
        }
        cr = is_u8 ? 0u : (uint32_t)0 - 128u * sum;
        rterm[i] = metric == XKNN_METRIC_IP ? (uint32_t)0 - cr : sq - 2u * cr;
    }

#pragma omp parallel num_threads(nt)
    {
        xknn__i8_ws w;
        int64_t c;
        if (!xknn__i8_ws_alloc(&w, qc, kk, lda)) {
#pragma omp critical(xknn_cpu_oom)
            st = XKNN_ERROR_OUT_OF_MEMORY;
        } else {
#pragma omp for schedule(dynamic, 1)
            for (c = 0; c < nchunks; c++) {
                const int64_t q0 = c * qc, qn = nq - q0 < qc ? nq - q0 : qc;
                const int64_t qpad = (qn + XKNN__I8_MR - 1) / XKNN__I8_MR * XKNN__I8_MR;
                int64_t q, p, g, t, j;
                /* queries: qa = |x|^2 - 2 cq (l2) or -cq (ip), cq = 128 sum(x) (u8) or 0 (i8) */
                for (q = 0; q < qpad; q++) {
                    uint8_t *a = w.qa + q * lda;
                    w.hsize[q] = 0;
                    w.worst[q] = INT32_MAX;
                    if (q < qn) {
                        const uint8_t *x = qbase + (q0 + q) * job->ldq;
                        uint32_t sq = 0, sum = 0, cq;
                        for (t = 0; t < d; t++) {
                            const int32_t v = is_u8 ? (int32_t)x[t] : (int32_t)(int8_t)x[t];
                            sq += (uint32_t)(v * v);
                            sum += (uint32_t)v;
                            a[t] = is_u8 ? x[t] : (uint8_t)(x[t] ^ 0x80u);
                        }
                        for (; t < lda; t++) a[t] = 0;
                        cq = is_u8 ? 128u * sum : 0u;
                        w.qterm[q] = metric == XKNN_METRIC_IP ? (uint32_t)0 - cq : sq - 2u * cq;
                    } else {
                        memset(a, 0, (size_t)lda);
                        w.qterm[q] = 0;
                    }
                }
                for (p = 0; p < npanels; p++) {
                    const int64_t j0 = p * XKNN__I8_NR;
                    const int64_t jn = n - j0 < XKNN__I8_NR ? n - j0 : XKNN__I8_NR;
                    int32_t E[XKNN__I8_MR * XKNN__I8_NR];
                    uint32_t mask[XKNN__I8_MR];
                    /* pack: step t, reference j, byte u at t*128 + 4j + u (whole 4-byte groups;
                     * the zero padding of the query side cancels whatever lies past d) */
                    for (j = 0; j < XKNN__I8_NR; j++) {
                        const uint8_t *y = rbase + (j0 + j) * job->ldr;
                        uint32_t *dst = (uint32_t *)(void *)w.panel + j;
                        if (j >= jn) {
                            for (t = 0; t < d4; t++) dst[t * XKNN__I8_NR] = 0;
                            continue;
                        }
                        for (t = 0; t + 1 < d4 || (t < d4 && 4 * d4 == d); t++) {
                            uint32_t v;
                            memcpy(&v, y + 4 * t, 4);
                            dst[t * XKNN__I8_NR] = v ^ flip;
                        }
                        if (t < d4) { /* last partial group: only the bytes inside the row */
                            unsigned char b4[4] = {0, 0, 0, 0};
                            uint32_t v;
                            memcpy(b4, y + 4 * t, (size_t)(d - 4 * t));
                            memcpy(&v, b4, 4);
                            dst[t * XKNN__I8_NR] = v ^ flip;
                        }
                    }
                    for (g = 0; g < qpad; g += XKNN__I8_MR) {
                        int64_t ii;
                        kernel(w.qa + g * lda, lda, w.panel, d4, w.qterm + g, rterm + j0, shift, w.worst + g, E,
                               mask);
                        for (ii = 0; ii < XKNN__I8_MR && g + ii < qn; ii++) {
                            const int64_t qq = g + ii, qg = qoff + q0 + qq;
                            xknn__i8_entry *h = w.heaps + qq * kk;
                            uint32_t m = mask[ii];
                            while (m) {
                                const int jj = xknn__cm_popcount((uint64_t)((m & (0u - m)) - 1u));
                                const int32_t e = E[ii * XKNN__I8_NR + jj];
                                m &= m - 1u;
                                if (jj >= jn || e > w.worst[qq]) continue;
                                if (exclude && roff + j0 + jj == qg) continue;
                                xknn__i8_push(h, &w.hsize[qq], kk, xknn__i8_key(metric, e), e, roff + j0 + jj);
                                if (w.hsize[qq] == kk) w.worst[qq] = h[0].e;
                            }
                        }
                    }
                }
                for (q = 0; q < qn; q++) {
                    xknn__i8_entry *h = w.heaps + q * kk;
                    int64_t *ids = job->ids + (q0 + q) * k;
                    float *dist = job->dist ? job->dist + (q0 + q) * k : NULL;
                    qsort(h, (size_t)w.hsize[q], sizeof *h, xknn__i8_cmp);
                    for (j = 0; j < k; j++) {
                        const int have = j < w.hsize[q];
                        ids[j] = have ? h[j].id : -1;
                        if (dist)
                            dist[j] = have ? (metric == XKNN_METRIC_IP ? -h[j].key : h[j].key)
                                           : (metric == XKNN_METRIC_IP ? -INFINITY : INFINITY);
                    }
                }
            }
        }
        xknn__i8_ws_free(&w);
    }
    free(rterm);
    if (st != XKNN_SUCCESS)
        return xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY,
                              "cpu backend: out of memory for the integer path (%lld queries x k=%lld per thread)",
                              (long long)qc, (long long)kk);
    return XKNN_SUCCESS;
}
