/* SPDX-License-Identifier: MIT */
/*
 * CPU backend: symmetric self-join (the all-kNN graph). Every canonical distance is
 * symmetric in its two points bit for bit (xknn.h METRICS: x - y and y - x differ only
 * in sign, then are squared or taken absolute; products, xor and the cosine norms
 * commute), so one distance serves both points' selections.
 *
 * The primitive is a tile update (xknn__cpu_sym_pair): given block A and block B (rows
 * and global ids) with their running k-best lists, every pair (a, b) is evaluated once
 * and offered to a's list and to b's list; B == NULL means A against itself (each row's
 * own id skipped). A self-join of n rows is this primitive on (A, NULL); the MPI layer
 * calls it on (own slice, visiting slice) pairs. Results are exact under the result
 * order, so they equal the plain search's ids and distance bits.
 *
 * Two tile kernels, chosen per call:
 * - BLAS (f32 l2/euclidean, CBLAS built in): one sgemm tile C = -2 A B^T; rows of C feed
 *   A's candidate buffers, rows of C^T (a transpose, O(TB^2)) feed B's, both through
 *   cpu_search.c's certified scan and canonical re-rank (xknn__scan_row, xknn__rerank).
 *   Each buffer starts with tau' from its running list's k-th canonical value, turned
 *   into an upper bound exactly as the re-rank does for exact entries, so a tile only
 *   proposes what can enter the list; the re-ranked survivors are merged into the list.
 *   Diagonal tiles are computed square and scanned by rows only.
 * - Canonical loop (every other metric and dtype): each pair's canonical value once,
 *   pushed into two bounded (key, id) max-heaps seeded with the running lists.
 *
 * Threads: tiles are scheduled in rounds in which no two tiles share a block (the
 * round-robin "circle" schedule: tile (I, J) of the triangle runs in round (I + J) mod
 * m, m = the block count rounded up to odd; bipartite pairs (I, J) in round
 * (J - I) mod max(blocks)), so each tile writes its blocks' lists without locks; the
 * tiles of a round are spread over OpenMP threads, each with its own workspace, and
 * sgemm runs single-threaded inside them. Small tiles (384 rows): the sgemm tile and its
 * transpose stay in cache while they are scanned.
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef XKNN_HAVE_CBLAS
#include <cblas.h>
#endif

#include "canonical.h"
#include "cpu_internal.h"

const char *xknn__cpu_sym_why_not(const xknn_params *p, xknn_dtype dtype, int64_t d)
{
    const xknn_metric m = p->metric;
    const int int_metric = m == XKNN_METRIC_L2 || m == XKNN_METRIC_EUCLIDEAN || m == XKNN_METRIC_IP;
    if (p->cpu_path == XKNN_CPU_PATH_INT8) return "cpu_path int8 asked for: plain integer self-join";
    if (p->cpu_path != XKNN_CPU_PATH_LOOP && (dtype == XKNN_DTYPE_U8 || dtype == XKNN_DTYPE_I8) && int_metric &&
        d <= XKNN_INT8_EXACT_MAX_D)
        return "u8/i8 l2/euclidean/ip take the exact integer path: plain self-join";
#ifdef XKNN_HAVE_CBLAS
    if (p->cpu_path != XKNN_CPU_PATH_LOOP && dtype == XKNN_DTYPE_F32 &&
        (m == XKNN_METRIC_IP || m == XKNN_METRIC_COSINE))
        return "f32 ip/cosine take the sgemm inner-product path: plain self-join";
#endif
    return NULL;
}

/* A tile: blocks I of A and J of B (rows [i0, i0+ni) and [j0, j0+nj)); diag: A is B
 * and I == J. */
typedef struct {
    int64_t i0, ni, j0, nj;
    int diag;
} xknn__sym_tile;

typedef struct {
    const xknn__job *job;
    const xknn__sym_side *a, *b; /* b == a for the triangle                      */
    int64_t k;
    int neg;                     /* ip: keys are -value                            */
    xknn__dist_fn dist_fn;       /* loop kernel                                    */
    xknn__cm_spec spec;
    size_t eb;
    int use_blas;
#ifdef XKNN_HAVE_CBLAS
    float *na, *nb;              /* float norms of A's and B's rows (BLAS kernel)  */
    float eps, absb;
    int64_t cap;
    xknn__job ja, jb;            /* the job seen with A's / B's rows as references */
#endif
} xknn__sym_ctx;

/* Per-thread scratch. */
typedef struct {
    xknn__pair *heap; /* loop: (ni + nj) x k                                     */
    int64_t *hsize;
#ifdef XKNN_HAVE_CBLAS
    float *tile, *tileT; /* TB x TB                                               */
    xknn__qstate st;
    int64_t *cand, *rows;
    float *lo, *hi, *cc, *vals;
    xknn__pair *tmp, *merged;
#endif
} xknn__sym_ws;

static void xknn__sym_ws_free(xknn__sym_ws *w)
{
#ifdef XKNN_HAVE_CBLAS
    free(w->merged);
    free(w->tmp);
    free(w->vals);
    free(w->cc);
    free(w->hi);
    free(w->lo);
    free(w->rows);
    free(w->cand);
    free(w->tileT);
    free(w->tile);
#endif
    free(w->hsize);
    free(w->heap);
}

static int xknn__sym_ws_alloc(xknn__sym_ws *w, const xknn__sym_ctx *c, int64_t TB)
{
    memset(w, 0, sizeof *w);
#ifdef XKNN_HAVE_CBLAS
    if (c->use_blas) {
        const int64_t cap = c->cap;
        w->tile = (float *)malloc((size_t)(TB * TB) * sizeof(float));
        w->tileT = (float *)malloc((size_t)(TB * TB) * sizeof(float));
        w->cand = (int64_t *)malloc((size_t)cap * sizeof(int64_t));
        w->rows = (int64_t *)malloc((size_t)cap * sizeof(int64_t));
        w->lo = (float *)malloc((size_t)cap * sizeof(float));
        w->hi = (float *)malloc((size_t)cap * sizeof(float));
        w->cc = (float *)malloc((size_t)cap * sizeof(float));
        w->vals = (float *)malloc((size_t)(cap > TB ? cap : TB) * sizeof(float));
        w->tmp = (xknn__pair *)malloc((size_t)cap * sizeof(xknn__pair));
        w->merged = (xknn__pair *)malloc((size_t)c->k * sizeof(xknn__pair));
        return w->tile && w->tileT && w->cand && w->rows && w->lo && w->hi && w->cc && w->vals && w->tmp &&
               w->merged;
    }
#endif
    w->heap = (xknn__pair *)malloc((size_t)(2 * TB * c->k) * sizeof(xknn__pair));
    w->hsize = (int64_t *)malloc((size_t)(2 * TB) * sizeof(int64_t));
    return w->heap && w->hsize;
}

/* ---- canonical loop kernel ------------------------------------------------------------ */

/* Seeds a heap with a running list (its real entries, as order keys). */
static void xknn__sym_seed_heap(const xknn__sym_ctx *c, xknn__pair *h, int64_t *hs, const int64_t *ids,
                                const float *dist)
{
    int64_t t;
    *hs = 0;
    for (t = 0; t < c->k && ids[t] >= 0; t++) xknn__pheap_push(h, hs, c->k, c->neg ? -dist[t] : dist[t], ids[t]);
}

/* Writes a heap back as a sorted, padded list. */
static void xknn__sym_store_heap(const xknn__sym_ctx *c, xknn__pair *h, int64_t hs, int64_t *ids, float *dist)
{
    int64_t t;
    qsort(h, (size_t)hs, sizeof(xknn__pair), xknn__pair_cmp);
    for (t = 0; t < c->k; t++) {
        ids[t] = t < hs ? h[t].id : -1;
        dist[t] = t < hs ? (c->neg ? -h[t].d : h[t].d) : (c->neg ? -INFINITY : INFINITY);
    }
}

static void xknn__sym_tile_loop(const xknn__sym_ctx *c, xknn__sym_ws *w, const xknn__sym_tile *t)
{
    const xknn__sym_side *a = c->a, *b = c->b;
    const int64_t k = c->k, d = c->job->d;
    const unsigned char *abase = (const unsigned char *)a->data, *bbase = (const unsigned char *)b->data;
    xknn__pair *ha = w->heap, *hb = w->heap + t->ni * k;
    int64_t *sa = w->hsize, *sb = w->hsize + t->ni;
    int64_t i, j;
    for (i = 0; i < t->ni; i++)
        xknn__sym_seed_heap(c, ha + i * k, &sa[i], a->ids + (t->i0 + i) * k, a->dist + (t->i0 + i) * k);
    if (!t->diag)
        for (j = 0; j < t->nj; j++)
            xknn__sym_seed_heap(c, hb + j * k, &sb[j], b->ids + (t->j0 + j) * k, b->dist + (t->j0 + j) * k);
    for (i = 0; i < t->ni; i++) {
        const void *x = abase + (size_t)((t->i0 + i) * a->ld) * c->eb;
        const int64_t ida = a->id0 + t->i0 + i;
        /* diagonal: each unordered pair once, j > i; both ends are rows of A */
        for (j = t->diag ? i + 1 : 0; j < t->nj; j++) {
            const float v = c->dist_fn(&c->spec, x, bbase + (size_t)((t->j0 + j) * b->ld) * c->eb, d);
            const float key = c->neg ? -v : v;
            xknn__pheap_push(ha + i * k, &sa[i], k, key, b->id0 + t->j0 + j);
            if (t->diag)
                xknn__pheap_push(ha + j * k, &sa[j], k, key, ida);
            else
                xknn__pheap_push(hb + j * k, &sb[j], k, key, ida);
        }
    }
    for (i = 0; i < t->ni; i++)
        xknn__sym_store_heap(c, ha + i * k, sa[i], a->ids + (t->i0 + i) * k, a->dist + (t->i0 + i) * k);
    if (!t->diag)
        for (j = 0; j < t->nj; j++)
            xknn__sym_store_heap(c, hb + j * k, sb[j], b->ids + (t->j0 + j) * k, b->dist + (t->j0 + j) * k);
}

/* ---- BLAS kernel ---------------------------------------------------------------------- */
#ifdef XKNN_HAVE_CBLAS

/* One row's scan of a tile row against the references [r0, r0+rb) of rj (rows of the
 * other side, norms nref), then re-rank and merge into the row's running list. */
static void xknn__sym_row(const xknn__sym_ctx *c, xknn__sym_ws *w, const xknn__job *rj, int64_t ref_id0,
                          const float *crow, int64_t r0, int64_t rb, const float *nref, float nq, const float *q,
                          int64_t self_row, int64_t *ids, float *dist)
{
    const int64_t k = c->k;
    /* a caller's bound in a short list's last entry stays there while the row is short */
    const float bound = ids[k - 1] < 0 ? dist[k - 1] : INFINITY;
    xknn__qstate *s = &w->st;
    int64_t m, x, i = 0, j = 0, o;
    s->cand = w->cand;
    s->cand_lo = w->lo;
    s->cand_hi = w->hi;
    s->cand_c = w->cc;
    s->count = 0;
    s->trigger = k + k / 2 + 64 < c->cap ? k + k / 2 + 64 : c->cap;
    s->tau = INFINITY;
    if (ids[k - 1] >= 0 || dist[k - 1] <= FLT_MAX) {
        /* k exact entries already, or a caller's bound in the last entry of a short list
         * (xknn_search_pair): an upper bound of that squared distance as xknn__rerank
         * derives it, then the same slack as xknn__prune's tau' */
        const double cd = (double)dist[k - 1] * (1.0 + 0x1p-21);
        const double hi = (c->job->params.metric == XKNN_METRIC_EUCLIDEAN ? cd * cd : cd) + 0x1p-140;
        float hf = (float)hi;
        if ((double)hf < hi) hf = nextafterf(hf, INFINITY);
        s->tau = hf * (1.0f + 0x1p-19f) + 16.0f * FLT_MIN;
    }
    xknn__scan_row(rj, s, crow, r0, rb, nref, nq, c->eps, c->absb, self_row, k, c->cap, q, w->rows, w->vals,
                   w->tmp);
    m = xknn__rerank(rj, s, q, k, w->rows, w->vals, w->tmp, k);
    if (m == 0) return;
    for (x = 0; x < m; x++) {
        w->tmp[x].d = s->cand_c[x];
        w->tmp[x].id = ref_id0 + s->cand[x];
    }
    qsort(w->tmp, (size_t)m, sizeof(xknn__pair), xknn__pair_cmp);
    /* merge with the running list (real entries first, padding last) */
    for (o = 0; o < k; o++) {
        const int take_new =
            j < m && (ids[i] < 0 || xknn__result_less(w->tmp[j].d, w->tmp[j].id, dist[i], ids[i]));
        if (take_new) {
            w->merged[o] = w->tmp[j++];
        } else if (i < k && ids[i] >= 0) {
            w->merged[o].d = dist[i];
            w->merged[o].id = ids[i++];
        } else {
            w->merged[o].d = o == k - 1 ? bound : INFINITY;
            w->merged[o].id = -1;
        }
    }
    for (o = 0; o < k; o++) {
        ids[o] = w->merged[o].id;
        dist[o] = w->merged[o].d;
    }
}

static void xknn__sym_tile_blas(const xknn__sym_ctx *c, xknn__sym_ws *w, const xknn__sym_tile *t, int64_t TB)
{
    const xknn__sym_side *a = c->a, *b = c->b;
    const int64_t k = c->k, d = c->job->d;
    const float *A = (const float *)a->data + t->i0 * a->ld, *B = (const float *)b->data + t->j0 * b->ld;
    int64_t i, j;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)t->ni, (int)t->nj, (int)d, -2.0f, A, (int)a->ld, B,
                (int)b->ld, 0.0f, w->tile, (int)TB);
    for (i = 0; i < t->ni; i++)
        xknn__sym_row(c, w, &c->jb, b->id0, w->tile + i * TB, t->j0, t->nj, c->nb, c->na[t->i0 + i], A + i * a->ld,
                      t->diag ? t->i0 + i : -1, a->ids + (t->i0 + i) * k, a->dist + (t->i0 + i) * k);
    if (t->diag) return;
    /* transpose in 32 x 32 blocks: both sides stay within a few cache lines */
    for (i = 0; i < t->ni; i += 32)
        for (j = 0; j < t->nj; j += 32) {
            const int64_t ie = i + 32 < t->ni ? i + 32 : t->ni, je = j + 32 < t->nj ? j + 32 : t->nj;
            int64_t ii, jj;
            for (ii = i; ii < ie; ii++)
                for (jj = j; jj < je; jj++) w->tileT[jj * TB + ii] = w->tile[ii * TB + jj];
        }
    for (j = 0; j < t->nj; j++)
        xknn__sym_row(c, w, &c->ja, a->id0, w->tileT + j * TB, t->i0, t->ni, c->na, c->nb[t->j0 + j],
                      B + j * b->ld, -1, b->ids + (t->j0 + j) * k, b->dist + (t->j0 + j) * k);
}

/* Float norms of a side's rows; returns the largest (double). */
static double xknn__sym_norms(const xknn__sym_side *s, int64_t d, float *out, int nt)
{
    double mx = 0.0;
    int64_t r;
    (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static, 256) reduction(max : mx)
    for (r = 0; r < s->rows; r++) {
        double v;
        xknn__sqnorms((const float *)s->data + r * s->ld, 1, s->ld, d, &v);
        out[r] = (float)v;
        if (v > mx) mx = v;
    }
    return mx;
}
#endif /* XKNN_HAVE_CBLAS */

/* ---- schedule --------------------------------------------------------------------------- */

/* Fills tiles in round order; round_start[r] .. round_start[r+1] are round r's tiles,
 * no two of them sharing a block. Returns the number of rounds. */
static int64_t xknn__sym_schedule(int64_t na, int64_t nb, int64_t TB, int tri, xknn__sym_tile *tiles,
                                  int64_t *round_start)
{
    const int64_t ba = (na + TB - 1) / TB, bb = tri ? ba : (nb + TB - 1) / TB;
    const int64_t m = tri ? (ba | 1) : (ba > bb ? ba : bb);
    int64_t r, bi, cnt = 0;
    for (r = 0; r < m; r++) {
        round_start[r] = cnt;
        for (bi = 0; bi < (tri ? ba : m); bi++) {
            /* triangle: bj with bi + bj = r (mod m), bj >= bi; bipartite: bj = bi + r (mod m) */
            const int64_t bj = tri ? ((r - bi) % m + m) % m : (bi + r) % m;
            xknn__sym_tile *t;
            if (tri ? (bj < bi || bj >= ba) : (bi >= ba || bj >= bb)) continue;
            t = &tiles[cnt++];
            t->i0 = bi * TB;
            t->ni = na - t->i0 < TB ? na - t->i0 : TB;
            t->j0 = bj * TB;
            t->nj = (tri ? na : nb) - t->j0 < TB ? (tri ? na : nb) - t->j0 : TB;
            t->diag = tri && bi == bj;
        }
    }
    round_start[m] = cnt;
    return m;
}

xknn_status xknn__cpu_sym_pair(const xknn__job *job, const xknn__sym_side *a, const xknn__sym_side *b_in)
{
    const int tri = b_in == NULL;
    const xknn__sym_side *b = tri ? a : b_in;
    const int nt = xknn__threads(job);
    const xknn_metric metric = job->params.metric;
    xknn__sym_ctx c;
    xknn__sym_tile *tiles = NULL;
    int64_t *round_start = NULL, TB, ba, bb, ntiles, rounds;
    xknn_status st = XKNN_SUCCESS;
    int blas_threads = -1;

    if (a->rows <= 0 || b->rows <= 0 || job->k <= 0) return XKNN_SUCCESS;
    memset(&c, 0, sizeof c);
    c.job = job;
    c.a = a;
    c.b = b;
    c.k = job->k;
    c.neg = metric == XKNN_METRIC_IP;
    c.spec.metric = metric;
    c.spec.dtype = job->dtype;
    c.spec.p = job->params.p;
    c.spec.weights = job->params.weights;
    c.dist_fn = xknn__pick_dist(job->dtype);
    c.eb = xknn__dtype_bytes(job->dtype);

#ifdef XKNN_HAVE_CBLAS
    c.use_blas = job->dtype == XKNN_DTYPE_F32 && (metric == XKNN_METRIC_L2 || metric == XKNN_METRIC_EUCLIDEAN) &&
                 job->params.cpu_path != XKNN_CPU_PATH_LOOP && job->d < (1 << 20) && a->ld <= INT_MAX &&
                 b->ld <= INT_MAX;
    if (c.use_blas) {
        const double u = 0x1p-24;
        c.eps = (float)(1.25 * (double)(job->d + 16) * u / (1.0 - (double)(job->d + 16) * u));
        c.absb = (float)((double)(job->d + 2) * FLT_MIN);
        c.cap = 4 * c.k + 1024;
        c.na = (float *)malloc((size_t)a->rows * sizeof(float));
        c.nb = tri ? c.na : (float *)malloc((size_t)b->rows * sizeof(float));
        if (!c.na || !c.nb) {
            st = xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory for norms");
            goto done;
        }
        /* the bound needs |q|^2 + |x|^2 far below FLT_MAX (as the plain BLAS path) */
        {
            const double ma = xknn__sym_norms(a, job->d, c.na, nt);
            const double mb = tri ? ma : xknn__sym_norms(b, job->d, c.nb, nt);
            if (!(ma + mb < 1e35)) c.use_blas = 0;
        }
        if (!c.use_blas) {
            c.use_blas = 0;
            if (job->params.verbose)
                fprintf(stderr, "xknn: cpu backend: values out of the BLAS path's range; symmetric exact loop\n");
        }
        c.ja = *job;
        c.ja.ref = (const float *)a->data;
        c.ja.ldr = a->ld;
        c.ja.n = a->rows;
        c.jb = *job;
        c.jb.ref = (const float *)b->data;
        c.jb.ldr = b->ld;
        c.jb.n = b->rows;
    }
#endif
    /* Tile edge: params.query_block when set, else 384 (BLAS: a 576 KiB tile and its
     * transpose stay in a core's L2; 50k x 128 ran 2.3 s with 384, 3.4 s with 512 and
     * 5.6 s with 2048 on a 2-core machine) or 256 (loop: two heaps of k per row, kept
     * under ~64 MiB). */
    TB = job->params.query_block ? job->params.query_block : (c.use_blas ? 384 : 256);
    if (!c.use_blas)
        while (TB > 8 && (double)TB * 2.0 * (double)c.k * sizeof(xknn__pair) > 64.0 * 1024 * 1024) TB /= 2;
    if (TB > (a->rows > b->rows ? a->rows : b->rows)) TB = a->rows > b->rows ? a->rows : b->rows;
    ba = (a->rows + TB - 1) / TB;
    bb = (b->rows + TB - 1) / TB;
    ntiles = tri ? ba * (ba + 1) / 2 : ba * bb;
    rounds = tri ? (ba | 1) : (ba > bb ? ba : bb);
    tiles = (xknn__sym_tile *)malloc((size_t)ntiles * sizeof(xknn__sym_tile));
    round_start = (int64_t *)malloc((size_t)(rounds + 1) * sizeof(int64_t));
    if (!tiles || !round_start) {
        st = xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory for %lld tiles",
                            (long long)ntiles);
        goto done;
    }
    rounds = xknn__sym_schedule(a->rows, b->rows, TB, tri, tiles, round_start);

#ifdef XKNN_HAVE_CBLAS
    if (c.use_blas) blas_threads = xknn__blas_threads_single(nt);
#endif
#pragma omp parallel num_threads(nt)
    {
        xknn__sym_ws w;
        const int ok = xknn__sym_ws_alloc(&w, &c, TB);
        int all_ok = 1;
        int64_t rr, x;
        if (!ok) {
#pragma omp critical(xknn_cpu_oom)
            st = XKNN_ERROR_OUT_OF_MEMORY;
        }
#pragma omp barrier
        all_ok = st == XKNN_SUCCESS;
        for (rr = 0; rr < rounds && all_ok; rr++) {
#pragma omp for schedule(dynamic, 1)
            for (x = round_start[rr]; x < round_start[rr + 1]; x++) {
#ifdef XKNN_HAVE_CBLAS
                if (c.use_blas) {
                    xknn__sym_tile_blas(&c, &w, &tiles[x], TB);
                    continue;
                }
#endif
                xknn__sym_tile_loop(&c, &w, &tiles[x]);
            }
        }
        xknn__sym_ws_free(&w);
    }
#ifdef XKNN_HAVE_CBLAS
    xknn__blas_threads_restore(blas_threads);
#else
    (void)blas_threads;
#endif
    if (st != XKNN_SUCCESS)
        st = xknn__cpu_fail(job, st, "cpu backend: out of memory for symmetric tiles of %lld rows (k=%lld)",
                            (long long)TB, (long long)c.k);
done:
#ifdef XKNN_HAVE_CBLAS
    if (c.nb != c.na) free(c.nb);
    free(c.na);
#endif
    free(round_start);
    free(tiles);
    return st;
}

xknn_status xknn__cpu_sym_self(const xknn__job *job)
{
    const int64_t n = job->n, k = job->k;
    const int neg = job->params.metric == XKNN_METRIC_IP;
    float *dist = job->dist ? job->dist : (float *)malloc((size_t)(n * k) * sizeof(float));
    xknn__sym_side a;
    xknn_status st;
    if (!dist)
        return xknn__cpu_fail(job, XKNN_ERROR_OUT_OF_MEMORY, "cpu backend: out of memory for %lld x %lld distances",
                              (long long)n, (long long)k);
    xknn__lists_pad(job->ids, dist, n * k, neg);
    a = xknn__job_side(job, dist);
    st = xknn__cpu_sym_pair(job, &a, NULL);
    if (dist != job->dist) free(dist);
    return st;
}
