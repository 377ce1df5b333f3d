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
 * Blocking: queries in super-blocks of at most QS (per-query top-k heaps for the whole
 * super-block, <= 256 MiB); references in blocks of RB = 1024 packed once per super-block
 * in the kernel's layout ([32-reference panel][d/4 steps][32 refs][4 bytes]); OpenMP over
 * chunks of 64 queries against each block; the kernel makes 8 queries x 32 references of
 * int32 at a time. Each query sees references in increasing id order, so a candidate
 * whose integer E (D for l2/euclidean, -P for ip: the value is monotone in it) exceeds
 * that of the heap's worst element cannot enter: that test runs on 16 lanes at once and
 * only the survivors are pushed with their exact (value, id).
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "canonical.h"

#define XKNN__I8_MR 8   /* queries per kernel tile        */
#define XKNN__I8_NR 32  /* references per kernel tile     */
#define XKNN__I8_RB 1024 /* references per packed block    */
#define XKNN__I8_QC 64  /* queries per OpenMP work item   */

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

/* A: MR rows of lda bytes (unsigned operand); Bp: packed panel (signed operand). */
typedef void (*xknn__i8_kernel)(const uint8_t *A, int64_t lda, const int8_t *Bp, int64_t d4, int32_t *C);

static void xknn__i8_kernel_portable(const uint8_t *A, int64_t lda, const int8_t *Bp, int64_t d4, int32_t *C)
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
    for (i = 0; i < XKNN__I8_MR; i++)
        for (j = 0; j < XKNN__I8_NR; j++) C[i * XKNN__I8_NR + j] = (int32_t)acc[i][j];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(XKNN_NO_CLONES)
#include <immintrin.h>
#define XKNN__I8_HAVE_VNNI 1
#define XKNN__TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

XKNN__TARGET_VNNI static void xknn__i8_kernel_vnni(const uint8_t *A, int64_t lda, const int8_t *Bp, int64_t d4,
                                                   int32_t *C)
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
        XKNN__I8_ROW(0, c00, c01)
        XKNN__I8_ROW(1, c10, c11)
        XKNN__I8_ROW(2, c20, c21)
        XKNN__I8_ROW(3, c30, c31)
        XKNN__I8_ROW(4, c40, c41)
        XKNN__I8_ROW(5, c50, c51)
        XKNN__I8_ROW(6, c60, c61)
        XKNN__I8_ROW(7, c70, c71)
#undef XKNN__I8_ROW
    }
    _mm512_storeu_si512((void *)(C + 0), c00);
    _mm512_storeu_si512((void *)(C + 16), c01);
    _mm512_storeu_si512((void *)(C + 32), c10);
    _mm512_storeu_si512((void *)(C + 48), c11);
    _mm512_storeu_si512((void *)(C + 64), c20);
    _mm512_storeu_si512((void *)(C + 80), c21);
    _mm512_storeu_si512((void *)(C + 96), c30);
    _mm512_storeu_si512((void *)(C + 112), c31);
    _mm512_storeu_si512((void *)(C + 128), c40);
    _mm512_storeu_si512((void *)(C + 144), c41);
    _mm512_storeu_si512((void *)(C + 160), c50);
    _mm512_storeu_si512((void *)(C + 176), c51);
    _mm512_storeu_si512((void *)(C + 192), c60);
    _mm512_storeu_si512((void *)(C + 208), c61);
    _mm512_storeu_si512((void *)(C + 224), c70);
    _mm512_storeu_si512((void *)(C + 240), c71);
}

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

static xknn_status xknn__i8_fail(const xknn__job *job, const char *fmt, ...)
{
    if (job->msg && job->msg_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(job->msg, job->msg_size, fmt, ap);
        va_end(ap);
    }
    return XKNN_ERROR_OUT_OF_MEMORY;
}

xknn_status xknn__cpu_int8(const xknn__job *job)
{
    const int64_t n = job->n, d = job->d, nq = job->nq, k = job->k;
    const int64_t kk = k < n ? k : n;
    const int64_t d4 = (d + 3) / 4, lda = 4 * d4;
    const int is_u8 = job->dtype == XKNN_DTYPE_U8;
    const xknn_metric metric = job->params.metric;
    const uint32_t s = metric == XKNN_METRIC_IP ? 1u : 2u; /* E = qa + rb - s dp (mod 2^32) */
    const int64_t roff = job->params.ref_id_offset, qoff = job->params.query_id_offset;
    const int exclude = job->params.exclude_self;
    const uint8_t *rbase = (const uint8_t *)job->ref_data, *qbase = (const uint8_t *)job->query_data;
    const xknn__i8_kernel kernel =
#ifdef XKNN__I8_HAVE_VNNI
        xknn__i8_has_vnni() ? xknn__i8_kernel_vnni :
#endif
                            xknn__i8_kernel_portable;
    int nt = 1;
    int64_t QS, q0, i;
    uint32_t *rterm = NULL;
    int8_t *packed = NULL;
    xknn__i8_entry *heaps = NULL;
    int64_t *hsize = NULL;
    int32_t *worst = NULL;
    uint8_t *qa_bytes = NULL;
    uint32_t *qterm = NULL;
    xknn_status st = XKNN_SUCCESS;

#ifdef _OPENMP
    nt = job->params.num_threads > 0 ? job->params.num_threads : omp_get_max_threads();
#endif
    QS = nq;
    while (QS > XKNN__I8_QC && (double)QS * (double)kk * sizeof(xknn__i8_entry) > 256.0 * 1024 * 1024) QS /= 2;
    QS = (QS + XKNN__I8_MR - 1) / XKNN__I8_MR * XKNN__I8_MR;

    rterm = (uint32_t *)malloc((size_t)n * sizeof(uint32_t));
    packed = (int8_t *)malloc((size_t)(XKNN__I8_RB * lda));
    heaps = (xknn__i8_entry *)malloc((size_t)(QS * kk) * sizeof(xknn__i8_entry));
    hsize = (int64_t *)malloc((size_t)QS * sizeof(int64_t));
    worst = (int32_t *)malloc((size_t)QS * sizeof(int32_t));
    qa_bytes = (uint8_t *)calloc((size_t)(QS * lda), 1);
    qterm = (uint32_t *)malloc((size_t)QS * sizeof(uint32_t));
    if (!rterm || !packed || !heaps || !hsize || !worst || !qa_bytes || !qterm) {
        st = xknn__i8_fail(job, "cpu backend: out of memory for the integer path (%lld queries x k=%lld)",
                           (long long)QS, (long long)kk);
        goto done;
    }

    /* Per reference: rb = |y|^2 - 2 cr (l2) or -cr (ip), cr = 0 (u8) or -128 sum(y) (i8). */
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

    for (q0 = 0; q0 < nq; q0 += QS) {
        const int64_t qs = nq - q0 < QS ? nq - q0 : QS;
        int64_t r0;
        /* queries: unsigned operand rows (zero padded), qa = |x|^2 - 2 cq (l2) or -cq (ip),
         * cq = 128 sum(x) (u8) or 0 (i8) */
#pragma omp parallel for num_threads(nt) schedule(static, 64)
        for (i = 0; i < QS; i++) {
            uint8_t *a = qa_bytes + i * lda;
            hsize[i] = 0;
            worst[i] = INT32_MAX;
            if (i < qs) {
                const uint8_t *x = qbase + (q0 + i) * job->ldq;
                uint32_t sq = 0, sum = 0, cq;
                int64_t t;
                for (t = 0; t < d; t++) {
                    const int32_t v = is_u8 ? (int32_t)x[t] : (int32_t)(int8_t)x[t];
                    sq += (uint32_t)(v * v);
                    sum += (uint32_t)v;
                    a[t] = is_u8 ? x[t] : (uint8_t)(x[t] ^ 0x80u);
                }
                for (; t < lda; t++) a[t] = 0;
                cq = is_u8 ? 128u * sum : 0u;
                qterm[i] = metric == XKNN_METRIC_IP ? (uint32_t)0 - cq : sq - 2u * cq;
            } else {
                memset(a, 0, (size_t)lda);
                qterm[i] = 0;
            }
        }
        for (r0 = 0; r0 < n; r0 += XKNN__I8_RB) {
            const int64_t rb = n - r0 < XKNN__I8_RB ? n - r0 : XKNN__I8_RB;
            const int64_t npanels = (rb + XKNN__I8_NR - 1) / XKNN__I8_NR;
            int64_t pnl;
            /* pack: panel p, step t, reference j, byte u at p*d4*128 + t*128 + 4j + u */
#pragma omp parallel for num_threads(nt) schedule(static)
            for (pnl = 0; pnl < npanels; pnl++) {
                int8_t *dst = packed + pnl * d4 * XKNN__I8_NR * 4;
                int64_t j, t;
                for (j = 0; j < XKNN__I8_NR; j++) {
                    const int64_t row = pnl * XKNN__I8_NR + j;
                    const uint8_t *y = row < rb ? rbase + (r0 + row) * job->ldr : NULL;
                    for (t = 0; t < lda; t++) {
                        int8_t v = 0;
                        if (y && t < d) v = is_u8 ? (int8_t)(y[t] ^ 0x80u) : (int8_t)y[t];
                        dst[(t / 4) * XKNN__I8_NR * 4 + 4 * j + (t % 4)] = v;
                    }
                }
            }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
            for (i = 0; i < (qs + XKNN__I8_QC - 1) / XKNN__I8_QC; i++) {
                int32_t C[XKNN__I8_MR * XKNN__I8_NR];
                const int64_t c0 = i * XKNN__I8_QC, c1 = c0 + XKNN__I8_QC < qs ? c0 + XKNN__I8_QC : qs;
                int64_t p, g, ii, jj;
                for (p = 0; p < npanels; p++) {
                    const int8_t *bp = packed + p * d4 * XKNN__I8_NR * 4;
                    const int64_t j0 = r0 + p * XKNN__I8_NR;
                    const int64_t jn = rb - p * XKNN__I8_NR < XKNN__I8_NR ? rb - p * XKNN__I8_NR : XKNN__I8_NR;
                    for (g = c0; g < c1; g += XKNN__I8_MR) {
                        kernel(qa_bytes + g * lda, lda, bp, d4, C);
                        for (ii = 0; ii < XKNN__I8_MR && g + ii < c1; ii++) {
                            const int64_t q = g + ii, qg = qoff + q0 + q;
                            const uint32_t qt = qterm[q];
                            const int32_t *c = C + ii * XKNN__I8_NR;
                            for (jj = 0; jj < jn; jj++) {
                                const int32_t e = (int32_t)(qt + rterm[j0 + jj] - s * (uint32_t)c[jj]);
                                if (e > worst[q]) continue;
                                if (exclude && roff + j0 + jj == qg) continue;
                                xknn__i8_push(heaps + q * kk, &hsize[q], kk, xknn__i8_key(metric, e), e,
                                              roff + j0 + jj);
                                if (hsize[q] == kk) worst[q] = heaps[q * kk].e;
                            }
                        }
                    }
                }
            }
        }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 16)
        for (i = 0; i < qs; i++) {
            xknn__i8_entry *h = heaps + i * kk;
            int64_t *ids = job->ids + (q0 + i) * k;
            float *dist = job->dist ? job->dist + (q0 + i) * k : NULL;
            int64_t j;
            qsort(h, (size_t)hsize[i], sizeof *h, xknn__i8_cmp);
            for (j = 0; j < k; j++) {
                const int have = j < hsize[i];
                ids[j] = have ? h[j].id : -1;
                if (dist)
                    dist[j] = have ? (metric == XKNN_METRIC_IP ? -h[j].key : h[j].key)
                                   : (metric == XKNN_METRIC_IP ? -INFINITY : INFINITY);
            }
        }
    }
done:
    free(qterm);
    free(qa_bytes);
    free(worst);
    free(hsize);
    free(heaps);
    free(packed);
    free(rterm);
    return st;
}
