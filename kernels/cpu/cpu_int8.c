/*
 * CPU backend, integer path: exact L2 / Euclidean search for data whose values are all
 * 8-bit integers (uint8 pixels, int8 embeddings), through oneDNN's u8 x s8 -> s32 GEMM.
 *
 * Why it is exact. Let every query value be an integer in [0, 255] or in [-128, 127], and
 * likewise every reference value (each matrix is classified on its own). Queries are
 * stored as a = q - oq in uint8 (oq = 0 or -128) and references as b = x - ox in int8
 * (ox = 128 or 0). Then
 *     q.x = a.b + ox sum(a) + oq sum(b) + d oq ox,
 * and the GEMM gives a.b exactly: each product fits 16 bits and VNNI (vpdpbusd) adds
 * them into int32 without saturation; |a.b| <= 32640 d < 2^31 for d <= 65536. So
 *     D = |q|^2 + |x|^2 - 2 q.x = cq_i + cx_j - 2 C_ij   (int64, exact)
 * is the exact squared distance. The canonical distance (double accumulation of
 * integer squares, exact below 2^53, one rounding) is then simply (float)D, and
 * (float)sqrt((double)D) for `euclidean`: no candidate margin and no re-rank needed.
 *
 * The result order is (float distance, id), not (D, id): two integers above 2^24 may
 * round to the same float. Each query keeps a max-heap of its k best (float, id); the
 * references of a query are visited in increasing id, so a newcomer enters only when its
 * float is strictly below the heap's top tau, i.e. when D < L(tau), the least integer
 * whose float is >= tau. The scan compares cx_j - 2 C_ij against L - cq_i in int32
 * (sixteen at a time with AVX-512) and touches the heap only for the rare winners.
 *
 * Only used when oneDNN reports a VNNI instruction set (avx512_core_vnni or avx2_vnni):
 * without VNNI oneDNN's int8 GEMM may saturate 16-bit intermediates, so the path is
 * refused there and the float paths run instead (same results, slower).
 *
 * Threads: OpenMP over blocks of queries; each thread calls the GEMM on its own tiles
 * (oneDNN runs single-threaded inside a parallel region). Memory: n d + nq d bytes of
 * converted data, 12 (n + nq) bytes of norms, and per thread a QB x RB int32 tile plus
 * QB k heap entries.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu_internal.h"

#ifdef XKNN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(XKNN_NO_CLONES)
#include <immintrin.h>
#define XKNN__INT8_AVX512 1
#endif

/* 1 if oneDNN will run its int8 GEMM with VNNI (no saturating intermediates). */
static int xknn__dnnl_has_vnni(void)
{
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    const unsigned avx512_vnni = (unsigned)dnnl_cpu_isa_avx512_core_vnni;
    const unsigned avx2_vnni = (unsigned)dnnl_cpu_isa_avx2_vnni;
    return (isa & avx512_vnni) == avx512_vnni || (isa & avx2_vnni) == avx2_vnni;
}

/* Value class of a matrix: 1 = every value an integer in [0, 255], 2 = every value an
 * integer in [-128, 127] (and some negative), 0 = neither. */
static int xknn__int8_class(const float *x, int64_t rows, int64_t ld, int64_t d, int nt)
{
    int64_t r;
    int bad = 0;
    float lo = 0.0f, hi = 0.0f;
    /* fail fast on ordinary float data: the first row decides most cases */
    for (r = 0; r < d; r++) {
        const float v = x[r];
        if (!(v >= -128.0f && v <= 255.0f) || v != (float)(int)v) return 0;
    }
#pragma omp parallel for num_threads(nt) schedule(static, 64) reduction(| : bad) reduction(min : lo) \
    reduction(max : hi)
    for (r = 0; r < rows; r++) {
        const float *row = x + r * ld;
        int64_t t;
        int b = 0;
        float l = 0.0f, h = 0.0f;
        for (t = 0; t < d; t++) {
            const float v = row[t];
            /* range first: the int conversion below is defined only inside it */
            const int in = v >= -128.0f && v <= 255.0f;
            b |= !in || v != (float)(int)(in ? v : 0.0f);
            l = v < l ? v : l;
            h = v > h ? v : h;
        }
        bad |= b;
        lo = l < lo ? l : lo;
        hi = h > hi ? h : hi;
    }
    if (bad) return 0;
    if (lo >= 0.0f) return 1;
    return hi <= 127.0f ? 2 : 0;
}

/* Least D >= 0 whose reported float is >= tau (tau finite, >= 0). */
static int64_t xknn__int_threshold(xknn_metric metric, float tau)
{
    const int eu = metric == XKNN_METRIC_EUCLIDEAN;
    double g = eu ? (double)tau * (double)tau : (double)tau;
    int64_t D;
    if (g > 0x1p62) return INT64_MAX;
    D = (int64_t)g;
#define XKNN__F(v) (eu ? (float)sqrt((double)(v)) : (float)(v))
    while (D > 0 && XKNN__F(D - 1) >= tau) D--;
    while (XKNN__F(D) < tau) D++;
#undef XKNN__F
    return D;
}

typedef struct {
    xknn__pair *heap; /* kk entries of this query */
    int64_t size;
    int64_t lim;      /* accept j iff cx_j - 2 C_ij < lim (int64) */
} xknn__int8_q;

/* Pushes the candidate (D, id); refreshes the query's limit when the heap is full. */
static void xknn__int8_take(const xknn__job *job, xknn__int8_q *s, int64_t kk, int64_t cq, int64_t D, int64_t id)
{
    const float f = job->params.metric == XKNN_METRIC_EUCLIDEAN ? (float)sqrt((double)D) : (float)D;
    xknn__pheap_push(s->heap, &s->size, kk, f, id);
    if (s->size == kk) {
        const int64_t L = xknn__int_threshold(job->params.metric, s->heap[0].d);
        s->lim = L == INT64_MAX ? INT64_MAX : L - cq;
    }
}

/* Scans one row of the tile: references r0 .. r0+rb-1 of query (global row) qg. */
static void xknn__int8_scan_portable(const xknn__job *job, xknn__int8_q *s, int64_t kk, int64_t cq,
                                     const int32_t *c, const int64_t *cx, int64_t r0, int64_t rb,
                                     int64_t self_row)
{
    const int64_t roff = job->params.ref_id_offset;
    int64_t j;
    for (j = 0; j < rb; j++) {
        const int64_t v = cx[r0 + j] - 2 * (int64_t)c[j];
        if (v < s->lim && r0 + j != self_row) xknn__int8_take(job, s, kk, cq, cq + v, roff + r0 + j);
    }
}

#ifdef XKNN__INT8_AVX512
/* Same as the portable scan, sixteen references at a time in int32 (the caller checks
 * that |cx_j| + 2 |C_ij| < 2^31). */
__attribute__((target("avx512f"))) static void
xknn__int8_scan_avx512(const xknn__job *job, xknn__int8_q *s, int64_t kk, int64_t cq, const int32_t *c,
                       const int32_t *cx32, int64_t r0, int64_t rb, int64_t self_row)
{
    const int64_t roff = job->params.ref_id_offset;
    int64_t j = 0;
    while (j < rb) {
        const int64_t lim = s->lim;
        const int32_t l32 = lim > INT32_MAX ? INT32_MAX : lim < INT32_MIN ? INT32_MIN : (int32_t)lim;
        const int all = lim > INT32_MAX; /* every value passes (the heap is not full yet) */
        const __m512i vl = _mm512_set1_epi32(l32);
        /* find the next chunk with a winner */
        for (; j + 16 <= rb; j += 16) {
            const __m512i vc = _mm512_loadu_si512((const void *)(c + j));
            const __m512i vx = _mm512_loadu_si512((const void *)(cx32 + r0 + j));
            const __m512i v = _mm512_sub_epi32(vx, _mm512_add_epi32(vc, vc));
            const __mmask16 m = all ? (__mmask16)0xFFFF : _mm512_cmplt_epi32_mask(v, vl);
            if (m) break;
        }
        if (j + 16 > rb) {
            /* tail: scalar, the limit refreshed after each take */
            for (; j < rb; j++) {
                const int64_t v = (int64_t)cx32[r0 + j] - 2 * (int64_t)c[j];
                if (v < s->lim && r0 + j != self_row) xknn__int8_take(job, s, kk, cq, cq + v, roff + r0 + j);
            }
            break;
        }
        {
            /* the chunk j .. j+15 has at least one winner: scalar over it, in id order */
            const int64_t e = j + 16;
            for (; j < e; j++) {
                const int64_t v = (int64_t)cx32[r0 + j] - 2 * (int64_t)c[j];
                if (v < s->lim && r0 + j != self_row) xknn__int8_take(job, s, kk, cq, cq + v, roff + r0 + j);
            }
        }
    }
}
#endif

static int xknn__has_avx512f(void)
{
#ifdef XKNN__INT8_AVX512
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

xknn_status xknn__cpu_int8_f32(const xknn__job *job, int required)
{
    const int64_t n = job->n, d = job->d, nq = job->nq, k = job->k;
    const int64_t kk = k < n ? k : n;
    const int nt = xknn__threads(job);
    const int64_t roff = job->params.ref_id_offset, qoff = job->params.query_id_offset;
    int qcls, rcls, use32, avx512;
    int64_t oq, ox, RB, QB, nblocks, r;
    uint8_t *A = NULL;
    int8_t *B = NULL;
    int64_t *cq = NULL, *cx = NULL;
    int32_t *cx32 = NULL;
    xknn_status status = XKNN_SUCCESS;
    int dnnl_bad = 0;

    if (job->params.metric != XKNN_METRIC_L2 && job->params.metric != XKNN_METRIC_EUCLIDEAN)
        return required ? xknn__cpu_fail(job, XKNN_ERROR_INVALID_ARGUMENT,
                                         "cpu backend: the integer path computes l2 and euclidean only")
                        : XKNN__FALLBACK;
    if (!xknn__dnnl_has_vnni())
        return required ? xknn__cpu_fail(job, XKNN_ERROR_NOT_BUILT,
                                         "cpu backend: the integer path needs a CPU with VNNI "
                                         "(AVX512-VNNI or AVX-VNNI) as reported by oneDNN")
                        : XKNN__FALLBACK;
    if (d > 65536)
        return required ? xknn__cpu_fail(job, XKNN_ERROR_INVALID_ARGUMENT,
                                         "cpu backend: the integer path handles d <= 65536 (d = %lld)", (long long)d)
                        : XKNN__FALLBACK;
    qcls = xknn__int8_class(job->query, nq, job->ldq, d, nt);
    rcls = qcls ? xknn__int8_class(job->ref, n, job->ldr, d, nt) : 0;
    if (!qcls || !rcls)
        return required ? xknn__cpu_fail(job, XKNN_ERROR_INVALID_ARGUMENT,
                                         "cpu backend: the integer path needs every %s value to be an integer in "
                                         "[0, 255] or in [-128, 127]",
                                         qcls ? "reference" : "query")
                        : XKNN__FALLBACK;
    oq = qcls == 1 ? 0 : -128;
    ox = rcls == 1 ? 128 : 0;
    /* int32 scan when |cx_j| + 2 |C_ij| < 2^31: |x|^2 + 256 |sum b| <= 97793 d and
     * 2 |C| <= 65280 d */
    use32 = d <= 10000;
    avx512 = use32 && xknn__has_avx512f();
    (void)avx512; /* unused without the AVX-512 clone */

    A = (uint8_t *)malloc((size_t)(nq * d));
    B = (int8_t *)malloc((size_t)(n * d));
    cq = (int64_t *)malloc((size_t)nq * sizeof(int64_t));
    cx = (int64_t *)malloc((size_t)n * sizeof(int64_t));
    cx32 = use32 ? (int32_t *)malloc((size_t)n * sizeof(int32_t)) : NULL;
    if (!A || !B || !cq || !cx || (use32 && !cx32)) {
        status = xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY,
                                "cpu backend: out of memory for %lld bytes of 8-bit copies",
                                (long long)((n + nq) * d));
        goto done;
    }
    /* convert; cq_i = |q|^2 - 2 ox sum(a) - 2 d oq ox, cx_j = |x|^2 - 2 oq sum(b) */
#pragma omp parallel for num_threads(nt) schedule(static, 64)
    for (r = 0; r < nq; r++) {
        const float *q = job->query + r * job->ldq;
        uint8_t *a = A + r * d;
        int64_t t, sq = 0, sa = 0;
        for (t = 0; t < d; t++) {
            const int64_t v = (int64_t)q[t];
            a[t] = (uint8_t)(v - oq);
            sq += v * v;
            sa += v - oq;
        }
        cq[r] = sq - 2 * ox * sa - 2 * d * oq * ox;
    }
#pragma omp parallel for num_threads(nt) schedule(static, 64)
    for (r = 0; r < n; r++) {
        const float *x = job->ref + r * job->ldr;
        int8_t *b = B + r * d;
        int64_t t, sx = 0, sb = 0;
        for (t = 0; t < d; t++) {
            const int64_t v = (int64_t)x[t];
            b[t] = (int8_t)(v - ox);
            sx += v * v;
            sb += v - ox;
        }
        cx[r] = sx - 2 * oq * sb;
        if (cx32) cx32[r] = (int32_t)cx[r];
    }

    /* Tiles: 512 x 4096 int32 (8 MiB) ran the Fashion-MNIST product at ~750 GOP/s on two
     * AVX-512 cores, against ~570 for 1280 x 8192 (the tile is re-read right after). */
    RB = job->params.ref_block ? job->params.ref_block : 4096;
    QB = job->params.query_block ? job->params.query_block : 512;
    if (RB > n) RB = n;
    if (QB * nt > nq) QB = (nq + nt - 1) / nt;
    if (QB < 1) QB = 1;
    while (QB > 1 && (double)QB * (double)kk * sizeof(xknn__pair) > 64.0 * 1024 * 1024) QB /= 2;
    nblocks = (nq + QB - 1) / QB;
    if (job->params.verbose)
        fprintf(stderr,
                "xknn: cpu backend: integer path (oneDNN u8 x s8 GEMM, VNNI): queries %s, references %s, "
                "%lld x %lld tiles\n",
                qcls == 1 ? "u8" : "i8", rcls == 1 ? "u8" : "i8", (long long)QB, (long long)RB);

#pragma omp parallel num_threads(nt)
    {
        int32_t *C = (int32_t *)malloc((size_t)(QB * RB) * sizeof(int32_t));
        xknn__pair *heaps = (xknn__pair *)malloc((size_t)(QB * kk) * sizeof(xknn__pair));
        xknn__int8_q *st = (xknn__int8_q *)malloc((size_t)QB * sizeof(xknn__int8_q));
        int64_t b;
        if (C && heaps && st) {
#pragma omp for schedule(dynamic, 1)
            for (b = 0; b < nblocks; b++) {
                const int64_t q0 = b * QB, qb = nq - q0 < QB ? nq - q0 : QB;
                int64_t i, r0;
                for (i = 0; i < qb; i++) {
                    st[i].heap = heaps + i * kk;
                    st[i].size = 0;
                    st[i].lim = INT64_MAX;
                }
                for (r0 = 0; r0 < n; r0 += RB) {
                    const int64_t rb = n - r0 < RB ? n - r0 : RB;
                    const int32_t co = 0;
                    if (dnnl_gemm_u8s8s32('N', 'T', 'F', qb, rb, d, 1.0f, A + q0 * d, d, 0, B + r0 * d, d, 0, 0.0f,
                                          C, RB, &co) != dnnl_success) {
#pragma omp atomic write
                        dnnl_bad = 1;
                        break;
                    }
                    for (i = 0; i < qb; i++) {
                        const int64_t self_row = job->params.exclude_self ? qoff + q0 + i - roff : -1;
#ifdef XKNN__INT8_AVX512
                        if (avx512) {
                            xknn__int8_scan_avx512(job, &st[i], kk, cq[q0 + i], C + i * RB, cx32, r0, rb, self_row);
                            continue;
                        }
#endif
                        xknn__int8_scan_portable(job, &st[i], kk, cq[q0 + i], C + i * RB, cx, r0, rb, self_row);
                    }
                }
                for (i = 0; i < qb; i++) {
                    qsort(st[i].heap, (size_t)st[i].size, sizeof(xknn__pair), xknn__pair_cmp);
                    xknn__emit(job, q0 + i, st[i].heap, st[i].size);
                }
            }
        } else {
#pragma omp atomic write
            dnnl_bad = 2;
        }
        free(st);
        free(heaps);
        free(C);
    }
    if (dnnl_bad == 2)
        status = xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY,
                                "cpu backend: out of memory for a %lld x %lld integer tile and %lld heap entries",
                                (long long)QB, (long long)RB, (long long)(QB * kk));
    else if (dnnl_bad)
        status = xknn__cpu_fail(job, XKNN_ERROR_INTERNAL, "cpu backend: oneDNN's int8 GEMM failed");
done:
    free(cx32);
    free(cx);
    free(cq);
    free(B);
    free(A);
    return status;
}

#else /* !XKNN_HAVE_DNNL */

xknn_status xknn__cpu_int8_f32(const xknn__job *job, int required)
{
    return required ? xknn__cpu_fail(job, XKNN_ERROR_NOT_BUILT,
                                     "cpu backend: integer path requested but xknn was built without oneDNN "
                                     "(-Ddnnl)")
                    : XKNN__FALLBACK;
}

#endif
