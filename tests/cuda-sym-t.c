/* SPDX-License-Identifier: MIT */
/* cuda-sym-t: the symmetric self-join of the CUDA backend (the triangle of tensor-core
 * tiles, mma.cu mode 2; l2, euclidean, ip, cosine; in blocks where its state exceeds the
 * budget) against the plain self-join on the same device and against the oracle, byte for
 * byte (ids and distance bits); and xknn_search_pair on the device (mode 2 over two sets)
 * applied over a partition, against the oracle and the device's self-join.
 *
 * The symmetric cases run with XKNN_CUDA_SYM_REQUIRE=1, so a shape that silently fell
 * back to the plain search would fail here instead of passing as plain; the fallback
 * cases run without it and must still be exact. XKNN_CUDA_MMA_SYNC=1 (meson test
 * cuda-sym-mma-sync) takes the mma.sync kernel instead of wgmma; XKNN_CUDA_TEST_QUICK=1
 * (compute-sanitizer) skips the cases above 6000 points; XKNN_CUDA_TEST_ONLY=TEXT runs only
 * the cases whose description contains TEXT (the others skip). Skips everything
 * (1..0 # SKIP) when the CUDA backend is not built or no device is present. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "ref/ref.h"
#include "tap/tap.h"
#include "xknn.h"
#include "xknn/cuda.h"
#include "xknn/impl/cuda_internal.h"

typedef struct {
    const char *what;
    data_kind kind;
    int64_t n, d, k;   /* k <= 0: n - 1 */
    int metric;        /* xknn_metric: l2, euclidean, ip, cosine */
    int64_t ldpad;     /* extra floats per row */
    int64_t off;       /* ref_id_offset (a self-join's query ids follow it) */
    size_t budget;     /* device_memory_budget, 0 = default */
    int sym;           /* 1: must take the symmetric path (XKNN_CUDA_SYM_REQUIRE=1) */
    int ctx;           /* 1: a caller's context (staged copies; the symmetric path's results
                        * go out block by block on the copy stream, beside the next block) */
    int huge;          /* 1: four rows of huge norm (beyond the bounds' range: NaN norms there) */
} scase;

static const scase cases[] = {
    /* what                         kind            n      d    k   met ldp off     budget    sym ctx huge */
    {"k=1, n not a tile multiple", DATA_UNIFORM, 1000, 3, 1, 0, 0, 0, 0, 1, 0, 0},
    {"ties, integer data", DATA_INTEGER, 3001, 32, 8, 0, 0, 0, 0, 1, 0, 0},
    {"ties d=1: buffers overflow, exact re-run", DATA_INTEGER, 4100, 1, 10, 1, 0, 0, 0, 1, 0, 0},
    {"duplicates", DATA_DUPLICATES, 2600, 16, 9, 0, 0, 0, 0, 1, 0, 0},
    {"gaussian d=100 euclidean", DATA_GAUSSIAN, 5000, 100, 16, 1, 0, 0, 0, 1, 0, 0},
    {"ld = d + 3, d=17 (4-byte loads), id offset", DATA_UNIFORM, 2177, 17, 4, 0, 3, 1000000, 0, 1, 0, 0},
    {"clustered d=128 k=30", DATA_CLUSTERED, 9000, 128, 30, 0, 0, 0, 0, 1, 0, 0},
    {"uniform d=64 k=16, several chunks per tile row", DATA_UNIFORM, 12000, 64, 16, 0, 0, 0, 0, 1, 0, 0},
    /* ip and cosine (cosine's tensor cores see unit-length rows): ties, zero rows,
     * duplicates, offsets */
    {"ip, ties, integer data", DATA_INTEGER, 3001, 32, 8, XKNN_METRIC_IP, 0, 0, 0, 1, 0, 0},
    {"ip gaussian d=100", DATA_GAUSSIAN, 5000, 100, 16, XKNN_METRIC_IP, 0, 0, 0, 1, 0, 0},
    {"ip ld = d + 3, d=17, id offset", DATA_UNIFORM, 2177, 17, 4, XKNN_METRIC_IP, 3, 1000000, 0, 1, 0, 0},
    {"cosine, ties and zero rows d=3", DATA_INTEGER, 4100, 3, 10, XKNN_METRIC_COSINE, 0, 0, 0, 1, 0, 0},
    {"cosine duplicates", DATA_DUPLICATES, 2600, 16, 9, XKNN_METRIC_COSINE, 0, 0, 0, 1, 0, 0},
    {"cosine clustered d=128 k=30", DATA_CLUSTERED, 9000, 128, 30, XKNN_METRIC_COSINE, 0, 0, 0, 1, 0, 0},
    {"k=n-1: plain (too few witness groups)", DATA_INTEGER, 300, 8, -1, 0, 0, 0, 0, 0, 0, 0},
    /* a state larger than the budget: the blocked triangle (halves, their rectangles on
     * the pair kernel, every part on the device: SYM_REQUIRE) */
    {"200 MiB budget: blocked triangle", DATA_UNIFORM, 20000, 16, 8, 0, 0, 0, (size_t)200 << 20, 1, 0, 0},
    {"200 MiB budget: blocked triangle, ties", DATA_INTEGER, 20000, 16, 8, 0, 0, 0, (size_t)200 << 20, 1, 0, 0},
    /* the same with a caller's context: every part reads the rows from one kept device
     * copy (strided rows: the copy is packed) */
    {"200 MiB budget: blocked triangle, caller's context, ld = d + 3", DATA_INTEGER, 20000, 16, 8, 0, 3, 0,
     (size_t)200 << 20, 1, 1, 0},
    /* 2 MiB with a caller's context: the lists on the device, the CPU parts' lists to the
     * host and back */
    {"2 MiB budget: blocked, small parts on the CPU, caller's context", DATA_UNIFORM, 4000, 32, 5, 0, 0, 0,
     (size_t)2 << 20, 0, 1, 0},
    /* 1 MiB: halves down to parts too small for the kernels, which run on the CPU */
    {"1 MiB budget: blocked, small parts on the CPU", DATA_UNIFORM, 4000, 32, 5, 0, 0, 0, (size_t)1 << 20, 0, 0, 0},
    /* more points than a state block (32768) with a caller's context: the results of
     * each block go out while the next one is re-ranked */
    {"caller's context, 40000 points in two blocks", DATA_UNIFORM, 40000, 16, 8, 0, 0, 0, 0, 1, 1, 0},
    {"caller's context, 70001 points, ties", DATA_INTEGER, 70001, 8, 6, 0, 0, 0, 0, 1, 1, 0},
    /* rows whose norms are too large for the bounds (NaN there, mma.cu's norm_or_nan): such
     * a row's pairs are candidates on both sides of the triangle, never witnesses (prefix
     * pass or band: meson test cuda-sym-band). Euclidean: every reported value stays in
     * float's range (their l2 overflows it: an input error, one more line a case) */
    {"huge rows", DATA_UNIFORM, 5000, 32, 8, XKNN_METRIC_EUCLIDEAN, 0, 0, 0, 1, 0, 1},
    {"huge rows, ties", DATA_INTEGER, 3001, 16, 6, XKNN_METRIC_EUCLIDEAN, 0, 0, 0, 1, 0, 1},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

/* xknn_search_pair on the device: the slices of a partition (cut[0] = 0 < ... < cut[ns]
 * = n) applied pair by pair, (i, i) and (i, j > i), as the MPI ring does; the lists must
 * equal the oracle's and the device's own self-join, byte for byte. */
typedef struct {
    const char *what;
    data_kind kind;
    int64_t n, d, k;
    int metric;
    int64_t off;       /* global id of row 0 */
    size_t budget;     /* device_memory_budget, 0 = default */
    int require;       /* XKNN_CUDA_SYM_REQUIRE=1: every part on the device */
    int ns;            /* slices */
    int64_t cut[5];
    int ctx;           /* 1: a caller's context (pinned staging of rows and results) */
    int bounded;       /* 1: the lists start with the oracle's k-th distances as bounds */
    int keep;          /* with ctx: each slice kept on the device (xknn_cuda_keep_rows),
                        * 1: uploaded by the first pair that reads it, 2: at once */
    int lists;         /* with ctx: running lists kept on the device (xknn_cuda_keep_lists),
                        * 1: a pair's slices for that pair (uploaded), 2: every slice for
                        * all the pairs (padding, and bounds, made there) */
} pcase;

static const pcase pcases[] = {
    {"pair: uniform, slices not tile multiples", DATA_UNIFORM, 7001, 32, 8, 0, 0, 0, 1, 3, {0, 2100, 4501, 7001}, 0, 0, 0, 0},
    {"pair: ties, integer data d=8 (rescues)", DATA_INTEGER, 6000, 8, 10, 0, 0, 0, 1, 2, {0, 2999, 6000}, 0, 0, 0, 0},
    {"pair: duplicates, id offset", DATA_DUPLICATES, 5200, 16, 9, 0, 1000000, 0, 1, 2, {0, 2600, 5200}, 0, 0, 0, 0},
    {"pair: euclidean clustered d=128 k=16", DATA_CLUSTERED, 9000, 128, 16, 1, 0, 0, 1, 3, {0, 3000, 6100, 9000}, 0, 0, 0, 0},
    {"pair: ip gaussian d=100", DATA_GAUSSIAN, 5000, 100, 16, XKNN_METRIC_IP, 0, 0, 1, 2, {0, 2300, 5000}, 0, 0, 0, 0},
    {"pair: cosine, ties and zero rows d=3", DATA_INTEGER, 5000, 3, 8, XKNN_METRIC_COSINE, 0, 0, 1, 2, {0, 2500, 5000}, 0,
     0, 0, 0},
    {"pair: unequal slices, d=17 (4-byte loads)", DATA_UNIFORM, 6177, 17, 4, 0, 0, 0, 1, 4, {0, 600, 1700, 4000, 6177}, 0,
     0, 0, 0},
    /* a 96 MiB budget: the larger pairs run in parts (halves of the larger side) */
    {"pair: 96 MiB budget, in parts", DATA_UNIFORM, 16000, 16, 8, 0, 0, (size_t)96 << 20, 1, 2, {0, 7000, 16000}, 0, 0, 0, 0},
    /* slices too small for the kernels: the CPU pair (no REQUIRE) */
    {"pair: small slices on the CPU", DATA_INTEGER, 900, 8, 6, 0, 0, 0, 0, 3, {0, 250, 600, 900}, 0, 0, 0, 0},
    {"pair: caller's context, ties", DATA_INTEGER, 6000, 16, 8, 0, 0, 0, 1, 3, {0, 1900, 4000, 6000}, 1, 0, 0, 0},
    /* with a caller's context the lists stay on the device between the parts of a call;
     * a part on the CPU takes its rows' lists to the host and back */
    {"pair: small slices on the CPU, caller's context", DATA_INTEGER, 900, 8, 6, 0, 0, 0, 0, 3, {0, 250, 600, 900}, 1, 0,
     0, 0},
    /* later pairs find full running lists on a side (l2): its thresholds come from them,
     * with duplicates whose copies tie the lists' k-th values across slices */
    {"pair: duplicates, 3 slices (thresholds from full lists)", DATA_DUPLICATES, 7200, 16, 9, 0, 1000000, 0, 1, 3,
     {0, 2350, 4700, 7200}, 0, 0, 0, 0},
    {"pair: l2 clustered d=128 k=16, 3 slices", DATA_CLUSTERED, 9000, 128, 16, 0, 0, 0, 1, 3, {0, 3000, 6100, 9000}, 0,
     0, 0, 0},
    /* padding that carries a bound (the true k-th distance: ties at it must stay) */
    {"pair: bounds, duplicates, 3 slices", DATA_DUPLICATES, 7200, 16, 9, 0, 1000000, 0, 1, 3, {0, 2350, 4700, 7200}, 0,
     1, 0, 0},
    {"pair: bounds, uniform d=32, 2 slices", DATA_UNIFORM, 6000, 32, 8, 0, 0, 0, 1, 2, {0, 2900, 6000}, 0, 1, 0, 0},
    /* bounds and a pair in parts: the side that is not halved meets its bounds again in
     * the second part, after the first part's merge */
    {"pair: bounds, 96 MiB budget, in parts", DATA_DUPLICATES, 16000, 16, 8, 0, 0, (size_t)96 << 20, 1, 2,
     {0, 7000, 16000}, 0, 1, 0, 0},
    /* rows kept on the device: every pair reads them there (no upload of its own) */
    {"pair: kept rows (uploaded on first use), ties", DATA_INTEGER, 6000, 16, 8, 0, 0, 0, 1, 3, {0, 1900, 4000, 6000, 0},
     1, 0, 1, 0},
    {"pair: kept rows (uploaded at once), ip", DATA_GAUSSIAN, 5000, 100, 16, XKNN_METRIC_IP, 0, 0, 1, 2,
     {0, 2300, 5000}, 1, 0, 2, 0},
    {"pair: kept rows, bounds, 96 MiB budget, in parts", DATA_DUPLICATES, 16000, 16, 8, 0, 0, (size_t)96 << 20, 1,
     2, {0, 7000, 16000}, 1, 1, 1, 0},
    /* running lists kept on the device between the pairs: a pair merges into them there */
    {"pair: kept lists (a pair's, uploaded), ties", DATA_INTEGER, 6000, 16, 8, 0, 0, 0, 1, 3, {0, 1900, 4000, 6000}, 1,
     0, 0, 1},
    {"pair: kept lists (all pairs), duplicates, id offset", DATA_DUPLICATES, 5200, 16, 9, 0, 1000000, 0, 1, 3,
     {0, 1700, 3500, 5200}, 1, 0, 0, 2},
    {"pair: kept lists, ip gaussian d=100", DATA_GAUSSIAN, 5000, 100, 16, XKNN_METRIC_IP, 0, 0, 1, 2, {0, 2300, 5000},
     1, 0, 0, 2},
    {"pair: kept lists, bounds, kept rows, 96 MiB budget, in parts", DATA_DUPLICATES, 16000, 16, 8, 0, 0,
     (size_t)96 << 20, 1, 2, {0, 7000, 16000}, 1, 1, 1, 2},
    {"pair: kept lists, bounds, uniform d=32, 4 slices", DATA_UNIFORM, 6000, 32, 8, 0, 0, 0, 1, 4,
     {0, 1400, 2900, 4500, 6000}, 1, 1, 0, 2},
    {"pair: kept lists, small slices on the CPU", DATA_INTEGER, 900, 8, 6, 0, 0, 0, 0, 3, {0, 250, 600, 900}, 1, 0, 0,
     2},
};
#define NPCASES (int)(sizeof pcases / sizeof pcases[0])

static int quick;

static xknn_status self_join(const scase *c, const float *x, int64_t ld, int64_t k, xknn_self_join mode,
                             int64_t *ids, float *dist, xknn_error *err)
{
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix r = XKNN_MATRIX_F32(x, c->n, c->d);
    r.ld = ld;
    p.backend = XKNN_BACKEND_CUDA;
    p.metric = (xknn_metric)c->metric;
    p.cuda_path = XKNN_CUDA_PATH_MMA;
    p.self_join = mode;
    p.ref_id_offset = c->off;
    p.device_memory_budget = c->budget;
    p.verbose = getenv("XKNN_CUDA_TEST_VERBOSE") != NULL;
    memset(ids, 0xab, (size_t)(c->n * k) * sizeof(int64_t));
    memset(dist, 0xab, (size_t)(c->n * k) * sizeof(float));
    if (c->ctx) {
        xknn_cuda_context *cx = NULL;
        xknn_status st = xknn_cuda_context_create(0, &cx, err);
        if (st != XKNN_SUCCESS) return st;
        p.cuda_context = cx;
        st = xknn_search(&p, &r, NULL, k, ids, dist, err);
        xknn_cuda_context_destroy(cx);
        return st;
    }
    return xknn_search(&p, &r, NULL, k, ids, dist, err);
}

/* Three TAP lines per case. */
static void run_case(const scase *c)
{
    const int64_t n = c->n, d = c->d, ld = d + c->ldpad, k = c->k > 0 ? c->k : n - 1;
    float *tight = f32_alloc(n, d), *x = f32_alloc(n, ld);
    int64_t *sid = i64_alloc(n, k), *pid = i64_alloc(n, k), *wid = i64_alloc(n, k);
    float *sd = f32_alloc(n, k), *pd = f32_alloc(n, k), *wd = f32_alloc(n, k);
    char name[256];
    xknn_error serr, perr;
    xknn_status sst, pst;
    int64_t i, t;
    ref_spec spec;

    memset(&spec, 0, sizeof spec);
    spec.metric = c->metric; /* REF_* numbers are xknn_metric's */
    spec.dtype = REF_F32;
    snprintf(name, sizeof name, "%s: %s n=%lld d=%lld k=%lld %s", c->what, ref_data_name(c->kind), (long long)n,
             (long long)d, (long long)k, xknn_metric_name((xknn_metric)c->metric));
    ref_make_data(c->kind, tight, n, d, 7);
    if (c->huge) {
        tight[17 * d + 1] = 1e20f;
        tight[1000 * d] = -3e19f;
        tight[(n - 2) * d + d - 1] = 3e18f;
        tight[2345 * d + 2] = 1e20f;
    }
    for (i = 0; i < n; i++)
        for (t = 0; t < ld; t++) x[i * ld + t] = t < d ? tight[i * d + t] : 1e30f;

    if (c->sym) setenv("XKNN_CUDA_SYM_REQUIRE", "1", 1);
    sst = self_join(c, x, ld, k, XKNN_SELF_JOIN_AUTO, sid, sd, &serr);
    unsetenv("XKNN_CUDA_SYM_REQUIRE");
    pst = self_join(c, x, ld, k, XKNN_SELF_JOIN_PLAIN, pid, pd, &perr);
    if (ref_knn_ex(&spec, x, n, ld, NULL, n, ld, d, k, 1, c->off, c->off, wid, wd) != 0)
        bail("oracle out of memory");
    is_knn_result(sst, &serr, sid, sd, wid, wd, n, k, "%s: %s vs oracle", name, c->sym ? "symmetric" : "self-join (auto)");
    is_knn_result(pst, &perr, pid, pd, wid, wd, n, k, "%s: plain vs oracle", name);
    ok(sst == XKNN_SUCCESS && pst == XKNN_SUCCESS &&
           !memcmp(sid, pid, (size_t)(n * k) * sizeof(int64_t)) && !memcmp(sd, pd, (size_t)(n * k) * sizeof(float)),
       "%s: auto and plain outputs are the same bytes", name);
    if (c->huge) { /* the same rows in l2: their squared distances overflow float */
        scase l2 = *c;
        l2.metric = XKNN_METRIC_L2;
        sst = self_join(&l2, x, ld, k, XKNN_SELF_JOIN_AUTO, sid, sd, &serr);
        ok(sst == XKNN_ERROR_INVALID_VALUE && strstr(serr.message, "overflows float"),
           "%s: in l2 an input error naming the pair (%s)", name, sst == XKNN_SUCCESS ? "success" : serr.message);
    }
    FREE_ALL(tight, x, sid, pid, wid, sd, pd, wd);
}

/* Two TAP lines per case. */
static void run_pair_case(const pcase *c)
{
    const int64_t n = c->n, d = c->d, k = c->k;
    const int neg = c->metric == XKNN_METRIC_IP;
    float *x = f32_alloc(n, d);
    int64_t *ids = i64_alloc(n, k), *sid = i64_alloc(n, k), *wid = i64_alloc(n, k);
    float *dist = f32_alloc(n, k), *sd = f32_alloc(n, k), *wd = f32_alloc(n, k);
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_error e, serr;
    xknn_status sst;
    char name[256];
    int i, j, bad = 0;
    int64_t t;
    ref_spec spec;
    scase sc;
    xknn_cuda_context *cx = NULL;

    memset(&spec, 0, sizeof spec);
    spec.metric = c->metric;
    spec.dtype = REF_F32;
    snprintf(name, sizeof name, "%s: %s n=%lld d=%lld k=%lld %s, %d slices", c->what, ref_data_name(c->kind),
             (long long)n, (long long)d, (long long)k, xknn_metric_name((xknn_metric)c->metric), c->ns);
    ref_make_data(c->kind, x, n, d, 11);
    if (ref_knn_ex(&spec, x, n, d, NULL, n, d, d, k, 1, c->off, c->off, wid, wd) != 0) bail("oracle out of memory");
    for (t = 0; t < n * k; t++) {
        ids[t] = -1;
        dist[t] = neg ? -INFINITY : INFINITY;
    }
    if (c->bounded)
        for (t = 0; t < n; t++) dist[t * k + k - 1] = wd[t * k + k - 1];
    p.backend = XKNN_BACKEND_CUDA;
    p.metric = (xknn_metric)c->metric;
    p.device_memory_budget = c->budget;
    p.verbose = getenv("XKNN_CUDA_TEST_VERBOSE") != NULL;
    if (c->ctx && xknn_cuda_context_create(0, &cx, &e) != XKNN_SUCCESS) {
        diag("xknn_cuda_context_create: %s", e.message);
        bad = 1;
    }
    p.cuda_context = cx;
    for (i = 0; cx && c->keep && i < c->ns && !bad; i++) {
        const xknn_matrix m = XKNN_MATRIX_F32(x + c->cut[i] * d, c->cut[i + 1] - c->cut[i], d);
        if (xknn_cuda_keep_rows(cx, &m, c->keep == 2, &e) != XKNN_SUCCESS) {
            diag("xknn_cuda_keep_rows (slice %d): %s", i, e.message);
            bad = 1;
        }
    }
    for (i = 0; cx && c->lists == 2 && i < c->ns && !bad; i++) {
        /* every slice's lists on the device: padding made there, and the bounds */
        const int64_t ci = c->cut[i], ri = c->cut[i + 1] - ci;
        float *bnd = (float *)xmalloc((size_t)ri * sizeof(float) + 1);
        for (t = 0; t < ri; t++) bnd[t] = dist[(ci + t) * k + k - 1];
        for (t = 0; t < ri * k; t++) ids[ci * k + t] = 7; /* (unread: padding is made on the device) */
        if (xknn_cuda_keep_lists(cx, (xknn_metric)c->metric, ids + ci * k, dist + ci * k, ri, k,
                                 XKNN_CUDA_LISTS_PADDING, c->bounded ? bnd : NULL, &e) != XKNN_SUCCESS) {
            diag("xknn_cuda_keep_lists (slice %d): %s", i, e.message);
            bad = 1;
        }
        free(bnd);
    }
    if (c->require) setenv("XKNN_CUDA_SYM_REQUIRE", "1", 1);
    for (j = c->ns - 1; j >= 0 && !bad; j--)
        for (i = 0; i <= j && !bad; i++) {
            const int64_t ci = c->cut[i], cj = c->cut[j];
            xknn_matrix a = XKNN_MATRIX_F32(x + ci * d, c->cut[i + 1] - ci, d);
            xknn_matrix b = XKNN_MATRIX_F32(x + cj * d, c->cut[j + 1] - cj, d);
            if (cx && c->lists == 1) {
                /* this pair's slices' lists on the device, uploaded from the host */
                if (xknn_cuda_keep_lists(cx, (xknn_metric)c->metric, ids + ci * k, dist + ci * k, a.rows, k,
                                         XKNN_CUDA_LISTS_HOST, NULL, &e) != XKNN_SUCCESS ||
                    (i != j && xknn_cuda_keep_lists(cx, (xknn_metric)c->metric, ids + cj * k, dist + cj * k, b.rows,
                                                    k, XKNN_CUDA_LISTS_HOST, NULL, &e) != XKNN_SUCCESS)) {
                    diag("xknn_cuda_keep_lists (slices %d, %d): %s", i, j, e.message);
                    bad = 1;
                }
            }
            if (!bad && xknn_search_pair(&p, &a, c->off + ci, i == j ? NULL : &b, c->off + cj, k, ids + ci * k,
                                         dist + ci * k, ids + cj * k, dist + cj * k, &e) != XKNN_SUCCESS) {
                diag("xknn_search_pair (slices %d, %d): %s", i, j, e.message);
                bad = 1;
            }
            if (cx && c->lists == 1 && !bad &&
                (xknn_cuda_fetch_lists(cx, ids + ci * k, 1, &e) != XKNN_SUCCESS ||
                 (i != j && xknn_cuda_fetch_lists(cx, ids + cj * k, 1, &e) != XKNN_SUCCESS))) {
                diag("xknn_cuda_fetch_lists (slices %d, %d): %s", i, j, e.message);
                bad = 1;
            }
        }
    unsetenv("XKNN_CUDA_SYM_REQUIRE");
    for (i = 0; cx && c->lists == 2 && i < c->ns && !bad; i++) {
        /* each row's k-th value from the device, then the lists; the two must agree */
        const int64_t ci = c->cut[i], ri = c->cut[i + 1] - ci;
        float *kth = (float *)xmalloc((size_t)ri * sizeof(float) + 1);
        if (xknn_cuda_lists_kth(cx, ids + ci * k, kth, &e) != XKNN_SUCCESS ||
            xknn_cuda_fetch_lists(cx, ids + ci * k, 1, &e) != XKNN_SUCCESS) {
            diag("xknn_cuda_lists_kth / fetch_lists (slice %d): %s", i, e.message);
            bad = 1;
        }
        for (t = 0; t < ri && !bad; t++) {
            const float want = ids[(ci + t) * k + k - 1] >= 0 ? dist[(ci + t) * k + k - 1] : INFINITY;
            if (memcmp(&want, &kth[t], sizeof want)) {
                diag("slice %d row %lld: lists_kth %.9g, the fetched lists' %.9g", i, (long long)t, kth[t], want);
                bad = 1;
            }
        }
        free(kth);
    }
    if (cx && c->keep) xknn_cuda_forget_rows(cx, x); /* (the rest: freed with the context) */
    xknn_cuda_context_destroy(cx);
    if (bad)
        ok(0, "%s: pairs vs oracle (a pair failed)", name);
    else
        is_knn_equal(ids, dist, wid, wd, n, k, "%s: pairs vs oracle", name);
    memset(&sc, 0, sizeof sc);
    sc.n = n;
    sc.d = d;
    sc.metric = c->metric;
    sc.off = c->off;
    sst = self_join(&sc, x, d, k, XKNN_SELF_JOIN_AUTO, sid, sd, &serr);
    if (sst != XKNN_SUCCESS) diag("self-join: %s", serr.message);
    ok(!bad && sst == XKNN_SUCCESS && !memcmp(ids, sid, (size_t)(n * k) * sizeof(int64_t)) &&
           !memcmp(dist, sd, (size_t)(n * k) * sizeof(float)),
       "%s: pairs and the device self-join are the same bytes", name);
    FREE_ALL(x, ids, sid, wid, dist, sd, wd);
}

/* xknn_cuda_keep_lists' refusals and its limit, copy_lists and copy_lists_start: five TAP
 * lines. */
static void run_lists_errors(void)
{
    static int64_t ids[6][4 * 2];
    static float dist[6][4 * 2];
    xknn_cuda_context *cx = NULL;
    xknn_error e;
    const float bnd[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    int i, kept = 0, refused = 0;
    if (xknn_cuda_context_create(0, &cx, &e) != XKNN_SUCCESS) bail("xknn_cuda_context_create: %s", e.message);
    refused += xknn_cuda_keep_lists(NULL, XKNN_METRIC_L2, ids[0], dist[0], 4, 2, XKNN_CUDA_LISTS_PADDING, NULL, &e) ==
               XKNN_ERROR_INVALID_ARGUMENT;
    refused += xknn_cuda_keep_lists(cx, XKNN_METRIC_L2, ids[0], dist[0], 4, 2, 7, NULL, &e) ==
               XKNN_ERROR_INVALID_ARGUMENT;
    refused += xknn_cuda_keep_lists(cx, XKNN_METRIC_IP, ids[0], dist[0], 4, 2, XKNN_CUDA_LISTS_PADDING, bnd, &e) ==
               XKNN_ERROR_INVALID_ARGUMENT;
    refused += xknn_cuda_keep_lists(cx, XKNN_METRIC_L2, ids[0], dist[0], 4, 2, XKNN_CUDA_LISTS_HOST, bnd, &e) ==
               XKNN_ERROR_INVALID_ARGUMENT;
    refused += xknn_cuda_fetch_lists(cx, ids[0], 1, &e) == XKNN_ERROR_INVALID_ARGUMENT;
    ok(refused == 5 && e.message[0], "keep_lists: no context, a bad init, bounds with ip or uploaded lists, and a "
                                     "fetch of lists not kept are INVALID_ARGUMENT (%d of 5; %s)", refused, e.message);
    ok(xknn_cuda_keep_lists(cx, XKNN_METRIC_L2, ids[0], dist[0], 4, 2, XKNN_CUDA_LISTS_PADDING, bnd, &e) ==
               XKNN_SUCCESS &&
           xknn_cuda_keep_lists(cx, XKNN_METRIC_L2, ids[0] + 4, dist[0] + 4, 2, 2, XKNN_CUDA_LISTS_HOST, NULL, &e) ==
               XKNN_ERROR_INVALID_ARGUMENT &&
           xknn_cuda_fetch_lists(cx, ids[0], 1, &e) == XKNN_SUCCESS && ids[0][1] == -1 && dist[0][1] == 1.0f &&
           dist[0][3] == 2.0f && dist[0][0] == INFINITY,
       "keep_lists: overlapping lists are refused; padding with bounds comes back as such");
    {
        /* copy_lists: rows 1..2 of a kept set come to the host, the others stay as they
         * were; rows beyond the set are refused; the set stays kept */
        int good;
        for (i = 0; i < 8; i++) {
            ids[0][i] = 7;
            dist[0][i] = 7.0f;
        }
        good = xknn_cuda_keep_lists(cx, XKNN_METRIC_L2, ids[0], dist[0], 4, 2, XKNN_CUDA_LISTS_PADDING, bnd, &e) ==
                   XKNN_SUCCESS &&
               xknn_cuda_copy_lists(cx, ids[0], 1, 2, &e) == XKNN_SUCCESS;
        good = good && ids[0][0] == 7 && ids[0][1] == 7 && ids[0][2] == -1 && ids[0][5] == -1 && dist[0][2] == INFINITY &&
               dist[0][3] == 2.0f && dist[0][5] == 3.0f && ids[0][6] == 7 && dist[0][7] == 7.0f;
        good = good && xknn_cuda_copy_lists(cx, ids[0], 3, 2, &e) == XKNN_ERROR_INVALID_ARGUMENT &&
               xknn_cuda_copy_lists(cx, ids[1], 0, 1, &e) == XKNN_ERROR_INVALID_ARGUMENT &&
               xknn_cuda_fetch_lists(cx, ids[0], 1, &e) == XKNN_SUCCESS && ids[0][6] == -1 && dist[0][7] == 4.0f;
        ok(good, "copy_lists: the rows asked for come to the host and no others; rows outside the set or a set not "
                 "kept are INVALID_ARGUMENT; the set stays kept (%s)", e.message);
    }
    {
        /* copy_lists_start: the rows asked for, and no others, once tested over; into
         * page-locked arrays (one copy each) 20 starts, more than the copier's 16 slots;
         * into pageable ones (through the copier's pinned 16 MiB buffers) one start of
         * 3 chunks and a row; a ticket not issued is INVALID_ARGUMENT */
        enum { R = 3000, K = 4, RP = 1200000 };
        int64_t *hid = NULL, *pid = (int64_t *)malloc((size_t)RP * K * sizeof(int64_t)), t[20], tp[2];
        float *hd = NULL, *pd = (float *)malloc((size_t)RP * K * sizeof(float));
        int good = pid && pd && posix_memalign((void **)&hid, 4096, (size_t)R * K * sizeof(int64_t)) == 0 &&
                   posix_memalign((void **)&hd, 4096, (size_t)R * K * sizeof(float)) == 0;
        int over = 0, locked = 0, q;
        for (i = 0; good && i < RP * K; i++) {
            if (i < R * K) {
                hid[i] = 7;
                hd[i] = 7.0f;
            }
            pid[i] = 7;
            pd[i] = 7.0f;
        }
        locked = good && xknn_cuda_host_register(cx, hid, (size_t)R * K * sizeof(int64_t), &e) == XKNN_SUCCESS &&
                 xknn_cuda_host_register(cx, hd, (size_t)R * K * sizeof(float), &e) == XKNN_SUCCESS;
        good = locked &&
               xknn_cuda_keep_lists(cx, XKNN_METRIC_L2, hid, hd, R, K, XKNN_CUDA_LISTS_PADDING, NULL, &e) ==
                   XKNN_SUCCESS &&
               xknn_cuda_keep_lists(cx, XKNN_METRIC_L2, pid, pd, RP, K, XKNN_CUDA_LISTS_PADDING, NULL, &e) ==
                   XKNN_SUCCESS;
        /* rows 1000..2999 in 20 pieces of 100 */
        for (q = 0; good && q < 20; q++)
            good = xknn_cuda_copy_lists_start(cx, hid, 1000 + 100 * q, 100, &t[q], &e) == XKNN_SUCCESS && t[q] > 0;
        /* rows 100000..1199998 (17.6 MB of distances, 35.2 MB of ids) and row 5 */
        good = good && xknn_cuda_copy_lists_start(cx, pid, 100000, RP - 100001, &tp[0], &e) == XKNN_SUCCESS &&
               xknn_cuda_copy_lists_start(cx, pid, 5, 1, &tp[1], &e) == XKNN_SUCCESS && tp[1] > tp[0];
        good = good && xknn_cuda_copy_lists_test(cx, tp[1], 1, &over, &e) == XKNN_SUCCESS && over == 1 &&
               xknn_cuda_copy_lists_test(cx, t[0], 0, &over, &e) == XKNN_SUCCESS && over == 1;
        for (i = 0; good && i < R * K; i++)
            good = i < 1000 * K ? hid[i] == 7 && hd[i] == 7.0f : hid[i] == -1 && hd[i] == INFINITY;
        for (i = 0; good && i < RP * K; i++) {
            const int64_t row = i / K;
            const int copied = row == 5 || (row >= 100000 && row < RP - 1);
            good = copied ? pid[i] == -1 && pd[i] == INFINITY : pid[i] == 7 && pd[i] == 7.0f;
        }
        good = good && xknn_cuda_copy_lists_start(cx, hid, 2990, 11, &t[0], &e) == XKNN_ERROR_INVALID_ARGUMENT &&
               xknn_cuda_copy_lists_test(cx, tp[1] + 1, 0, &over, &e) == XKNN_ERROR_INVALID_ARGUMENT;
        (void)xknn_cuda_fetch_lists(cx, hid, 0, &e);
        (void)xknn_cuda_fetch_lists(cx, pid, 0, &e);
        xknn_cuda_host_unregister(cx, hid);
        xknn_cuda_host_unregister(cx, hd);
        ok(good, "copy_lists_start: the rows asked for and no others once over, into page-locked arrays (20 starts) "
                 "and pageable ones (3 chunks); rows outside or a ticket not issued are INVALID_ARGUMENT (%s)",
           e.message);
        FREE_ALL(hid, hd, pid, pd);
    }
    for (i = 0; i < 5; i++)
        if (xknn_cuda_keep_lists(cx, XKNN_METRIC_L2, ids[i], dist[i], 4, 2, XKNN_CUDA_LISTS_PADDING, NULL, &e) ==
            XKNN_SUCCESS)
            kept++;
    ok(kept == 4 && xknn_cuda_fetch_lists(cx, ids[2], 0, &e) == XKNN_SUCCESS &&
           xknn_cuda_keep_lists(cx, XKNN_METRIC_L2, ids[5], dist[5], 4, 2, XKNN_CUDA_LISTS_PADDING, NULL, &e) ==
               XKNN_SUCCESS,
       "keep_lists: 4 sets a context, a fifth once one is fetched (%d kept)", kept);
    xknn_cuda_context_destroy(cx); /* (frees the sets still kept) */
}

/* xknn_cuda_keep_rows' refusals and its limit: three TAP lines. */
static void run_keep_errors(void)
{
    static float rows[9][4];
    xknn_cuda_context *cx = NULL;
    xknn_error e;
    xknn_matrix m = XKNN_MATRIX_F32(rows[0], 1, 4);
    int i, kept = 0;
    if (xknn_cuda_context_create(0, &cx, &e) != XKNN_SUCCESS) bail("xknn_cuda_context_create: %s", e.message);
    ok(xknn_cuda_keep_rows(NULL, &m, 0, &e) == XKNN_ERROR_INVALID_ARGUMENT && e.message[0],
       "keep_rows: no context is INVALID_ARGUMENT (%s)", e.message);
    m.dtype = XKNN_DTYPE_F16;
    ok(xknn_cuda_keep_rows(cx, &m, 0, &e) == XKNN_ERROR_INVALID_ARGUMENT && e.message[0],
       "keep_rows: f16 rows are INVALID_ARGUMENT (%s)", e.message);
    m.dtype = XKNN_DTYPE_F32;
    for (i = 0; i < 9; i++) {
        m.data = rows[i];
        if (xknn_cuda_keep_rows(cx, &m, i & 1, &e) == XKNN_SUCCESS) kept++;
    }
    xknn_cuda_forget_rows(cx, rows[3]);
    m.data = rows[8];
    ok(kept == 8 && xknn_cuda_keep_rows(cx, &m, 1, &e) == XKNN_SUCCESS,
       "keep_rows: 8 blocks a context, a ninth once one is forgotten (%d kept)", kept);
    xknn_cuda_context_destroy(cx);
}

int main(void)
{
    int i, nhuge = 0;
    if (!xknn_backend_built(XKNN_BACKEND_CUDA) || xknn_cuda_device_count() == 0) skip_all("no CUDA device");
    const char *only = getenv("XKNN_CUDA_TEST_ONLY");
    quick = getenv("XKNN_CUDA_TEST_QUICK") ? atoi(getenv("XKNN_CUDA_TEST_QUICK")) : 0;
    for (i = 0; i < NCASES; i++) nhuge += cases[i].huge; /* one line more each */
    plan(3 * NCASES + nhuge + 2 * NPCASES + 8);
    run_keep_errors();
    run_lists_errors();
    for (i = 0; i < NCASES; i++) {
        if (only && *only && !strstr(cases[i].what, only))
            skip(3 + cases[i].huge, "%s: not selected by XKNN_CUDA_TEST_ONLY", cases[i].what);
        else if (quick && cases[i].n > 6000)
            skip(3 + cases[i].huge, "%s n=%lld: not with XKNN_CUDA_TEST_QUICK", cases[i].what, (long long)cases[i].n);
        else
            run_case(&cases[i]);
    }
    for (i = 0; i < NPCASES; i++) {
        if (only && *only && !strstr(pcases[i].what, only))
            skip(2, "%s: not selected by XKNN_CUDA_TEST_ONLY", pcases[i].what);
        else if (quick && pcases[i].n > 6000)
            skip(2, "%s n=%lld: not with XKNN_CUDA_TEST_QUICK", pcases[i].what, (long long)pcases[i].n);
        else
            run_pair_case(&pcases[i]);
    }
    return tap_done();
}
