/* SPDX-License-Identifier: MIT */
/* metrics-t: every metric x dtype through xknn_search (CPU) and xknn_distance_ex against
 * the oracle, byte for byte, on tie-heavy data; the documented edge cases and errors.
 *
 * `metrics-t cuda [1|2]` (suite cuda): the same searches on the CUDA backend, plus shapes
 * that reach its splits, buffer compactions, merge sorts, the int8 tensor-core path,
 * streamed reference chunks and sliced references (part 1: the real-valued metrics; 2:
 * the rest; none: both); skips everything without a CUDA device. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "ref/ref.h"
#include "tap/tap.h"
#include "xknn.h"
#include "xknn/cuda.h"
#include "xknn/impl/canonical_math.h"

static const mcase real_metrics[] = {
    {XKNN_METRIC_L2, 0},        {XKNN_METRIC_EUCLIDEAN, 0}, {XKNN_METRIC_L1, 0},        {XKNN_METRIC_MINKOWSKI, 1},
    {XKNN_METRIC_MINKOWSKI, 2}, {XKNN_METRIC_MINKOWSKI, 3}, {XKNN_METRIC_MINKOWSKI, 2.5}, {XKNN_METRIC_CHEBYSHEV, 0},
    {XKNN_METRIC_IP, 0},        {XKNN_METRIC_COSINE, 0},    {XKNN_METRIC_HELLINGER, 0},
};
#define NREAL (int)(sizeof real_metrics / sizeof real_metrics[0])


typedef struct {
    data_kind kind;
    int64_t n, nq, d, k; /* k <= 0: n (n - 1 in self-join); nq = 0: self-join */
    int64_t qblock, rblock;
} shape;

static const shape shapes[] = {
    {DATA_GAUSSIAN, 301, 37, 19, 7, 0, 0},
    {DATA_INTEGER, 257, 20, 5, 1, 13, 100},   /* many equal distances */
    {DATA_DUPLICATES, 130, 0, 33, 0, 0, 0},   /* self-join, k = n - 1, duplicates */
    {DATA_CLUSTERED, 200, 15, 70, 0, 7, 64},  /* k = n */
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

static float *make_weights(int64_t bits, uint64_t seed)
{
    float *w = malloc((size_t)bits * sizeof(float));
    uint64_t s = seed;
    int64_t b;
    /* few distinct values (ties), some negative (|w| is used) */
    for (b = 0; b < bits; b++) w[b] = (float)((int)(ref_rand_u64(&s) % 7) - 2) * 0.375f;
    return w;
}

/* Larger shapes for the integer path (u8/i8 with l2, euclidean, ip) and the sgemm path
 * (f32 ip, cosine): several reference panels and tiles, query counts not multiples of
 * the kernel tile, k = 1 / 7 / 100, ties. */
static const shape big_shapes[] = {
    {DATA_GAUSSIAN, 2100, 150, 61, 7, 0, 0},
    {DATA_INTEGER, 1500, 0, 13, 100, 0, 0}, /* self-join, ties */
    {DATA_UNIFORM, 1100, 77, 784, 1, 0, 0},
    {DATA_INTEGER, 33, 9, 3, 0, 0, 0},      /* one panel and one row, k = n */
    {DATA_DUPLICATES, 2, 0, 5, 0, 0, 0},    /* self-join of two points */
};
#define NBIG (int)(sizeof big_shapes / sizeof big_shapes[0])

/* CUDA shapes: several splits and compactions (k = 10), a tie-heavy self-join (k = 100),
 * k = 1000 on duplicates, and k = n = 6000 (more than 4096 candidates: merge passes). */
static const shape gpu_shapes[] = {
    {DATA_GAUSSIAN, 12011, 150, 45, 10, 0, 0},
    {DATA_INTEGER, 4000, 0, 7, 100, 0, 0},
    {DATA_DUPLICATES, 5000, 60, 20, 1000, 0, 0},
    {DATA_CLUSTERED, 4500, 20, 66, 0, 0, 0},
};
#define NGPU (int)(sizeof gpu_shapes / sizeof gpu_shapes[0])

/* u8/i8 with l2, euclidean, ip (and hamming on bits) on the integer tensor-core path (at least 4k groups of 64
 * references): several slices, tie-heavy data (buffer overflows, exact re-runs), a
 * self-join, d not a multiple of 64. */
static const shape imma_shapes[] = {
    {DATA_GAUSSIAN, 12011, 150, 45, 10, 0, 0},
    {DATA_INTEGER, 20000, 100, 16, 5, 0, 0},
    {DATA_UNIFORM, 4500, 0, 33, 16, 0, 0},
    {DATA_CLUSTERED, 5000, 70, 300, 7, 0, 0},
};
#define NIMMA (int)(sizeof imma_shapes / sizeof imma_shapes[0])

static xknn_cpu_path cur_path = XKNN_CPU_PATH_AUTO;
static xknn_backend cur_backend = XKNN_BACKEND_CPU;
static size_t cur_budget;    /* CUDA device_memory_budget (0: default) */
static xknn_cuda_context *cur_ctx; /* CUDA context reused by the calls (NULL: their own) */
static const char *cur_note = ""; /* appended to test names */

/* One search vs the oracle. */
static void run_case(xknn_metric metric, double p, xknn_dtype dtype, const shape *sh)
{
    const int self = sh->nq == 0;
    const int64_t nq = self ? sh->n : sh->nq, d = sh->d;
    const int64_t k = sh->k > 0 ? sh->k : (self ? sh->n - 1 : sh->n);
    const int64_t ld = ref_row_elems((int)dtype, d);
    void *ref = ref_make_typed(sh->kind, (int)dtype, sh->n, d, 11);
    void *qry = self ? NULL : ref_make_typed(sh->kind, (int)dtype, nq, d, 12);
    float *w = metric == XKNN_METRIC_WHAMMING ? make_weights(d, 5) : NULL;
    int64_t *ids = malloc((size_t)(nq * k) * sizeof(int64_t)), *wid = malloc((size_t)(nq * k) * sizeof(int64_t));
    float *dist = malloc((size_t)(nq * k) * sizeof(float)), *wd = malloc((size_t)(nq * k) * sizeof(float));
    xknn_params prm = XKNN_PARAMS_INIT;
    xknn_matrix r = XKNN_MATRIX_TYPED(ref, sh->n, d, dtype), q = XKNN_MATRIX_TYPED(qry, nq, d, dtype);
    ref_spec spec;
    xknn_error err;
    char name[160];

    if (metric == XKNN_METRIC_HELLINGER) {
        ref_make_nonnegative((int)dtype, ref, sh->n * ld);
        if (qry) ref_make_nonnegative((int)dtype, qry, nq * ld);
    }
    spec.metric = (int)metric;
    spec.dtype = (int)dtype;
    spec.p = p;
    spec.weights = w;
    ref_knn_ex(&spec, ref, sh->n, ld, qry, nq, ld, d, k, self, 0, 0, wid, wd);

    prm.backend = cur_backend;
    prm.device_memory_budget = cur_budget;
    prm.cuda_context = cur_ctx;
    params_metric(&prm, metric, p, w, d);
    prm.query_block = sh->qblock;
    prm.ref_block = sh->rblock;
    prm.cpu_path = cur_path;
    memset(ids, 0xab, (size_t)(nq * k) * sizeof(int64_t));
    memset(dist, 0xab, (size_t)(nq * k) * sizeof(float));
    snprintf(name, sizeof name, "%s%s%s p=%g %s %s n=%lld nq=%lld d=%lld k=%lld%s%s", xknn_metric_name(metric),
             cur_backend == XKNN_BACKEND_CUDA ? " cuda" : "", cur_path == XKNN_CPU_PATH_LOOP ? " (loop path)" : "", p,
             xknn_dtype_name(dtype), ref_data_name(sh->kind), (long long)sh->n, (long long)nq, (long long)d,
             (long long)k, self ? " self" : "", cur_note);
    if (xknn_search(&prm, &r, self ? NULL : &q, k, ids, dist, &err) != XKNN_SUCCESS)
        ok(0, "%s: %s", name, err.message);
    else
        is_knn_equal(ids, dist, wid, wd, nq, k, "%s", name);
    free(ref);
    free(qry);
    free(w);
    free(ids);
    free(wid);
    free(dist);
    free(wd);
}

/* xknn_distance_ex equals the oracle's value on 200 pairs (bits). */
static void distance_case(xknn_metric metric, double p, xknn_dtype dtype)
{
    const int64_t d = 77, rows = 40;
    void *x = ref_make_typed(DATA_GAUSSIAN, (int)dtype, rows, d, 21);
    float *w = make_weights(d, 3);
    const int eb = ref_elem_bytes((int)dtype);
    const int64_t ld = ref_row_elems((int)dtype, d);
    xknn_params prm = XKNN_PARAMS_INIT;
    ref_spec spec;
    int64_t i, j, bad = 0;
    if (metric == XKNN_METRIC_HELLINGER) ref_make_nonnegative((int)dtype, x, rows * ld);
    prm.metric = metric;
    prm.p = p;
    prm.weights = w;
    prm.weights_count = d;
    spec.metric = (int)metric;
    spec.dtype = (int)dtype;
    spec.p = p;
    spec.weights = w;
    for (i = 0; i < rows; i++)
        for (j = 0; j < 5; j++) {
            const void *a = (const unsigned char *)x + i * ld * eb, *b = (const unsigned char *)x + ((i * 7 + j) % rows) * ld * eb;
            float got = -1.0f, want = ref_distance_ex(&spec, a, b, d);
            if (xknn_distance_ex(&prm, dtype, a, b, d, &got, NULL) != XKNN_SUCCESS ||
                memcmp(&got, &want, sizeof got) != 0) {
                if (!bad) diag("row %lld vs %lld: got %.9g want %.9g", (long long)i, (long long)j, got, want);
                bad++;
            }
        }
    ok(bad == 0, "xknn_distance_ex %s p=%g %s: %lld of %lld values differ from the oracle", xknn_metric_name(metric),
       p, xknn_dtype_name(dtype), (long long)bad, (long long)(rows * 5));
    free(x);
    free(w);
}

static int has(const char *msg, const char *part) { return strstr(msg, part) != NULL; }

static void error_cases(void)
{
    float a[4 * 3] = {1, 2, 3, 4, 5, 6, 0.5f, -0.25f, 1, 0, 0, 0};
    float b[2 * 3] = {1, 1, 1, 0, 0, 0};
    int64_t ids[4 * 3];
    float dist[4 * 3], wts[70];
    uint64_t bits[2 * 2] = {0x5ull, 0, 0x3ull, 0};
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix r = XKNN_MATRIX_F32(a, 4, 3), q = XKNN_MATRIX_F32(b, 2, 3);
    xknn_matrix rb = XKNN_MATRIX_TYPED(bits, 2, 70, XKNN_DTYPE_BIN);
    xknn_error err;
    xknn_status st;
    int i;

    /* hellinger: negative input named by row and column (f32 reference, i8 query) */
    p.metric = XKNN_METRIC_HELLINGER;
    st = xknn_search(&p, &r, &q, 2, ids, dist, &err);
    ok(st == XKNN_ERROR_INVALID_VALUE && has(err.message, "reference row 2 column 1") && has(err.message, "hellinger"),
       "hellinger rejects a negative reference value: %s", err.message);
    {
        int8_t r8[2 * 3] = {1, 2, 3, 4, 5, 6}, q8[2 * 3] = {0, 1, 2, 3, -4, 5};
        xknn_matrix mr = XKNN_MATRIX_TYPED(r8, 2, 3, XKNN_DTYPE_I8), mq = XKNN_MATRIX_TYPED(q8, 2, 3, XKNN_DTYPE_I8);
        st = xknn_search(&p, &mr, &mq, 1, ids, dist, &err);
        ok(st == XKNN_ERROR_INVALID_VALUE && has(err.message, "query row 1 column 1"),
           "hellinger rejects a negative i8 query value: %s", err.message);
    }

    /* cosine and zero vectors: distance exactly 1, ordered by id */
    p = xknn_params_default();
    p.metric = XKNN_METRIC_COSINE;
    p.backend = XKNN_BACKEND_CPU;
    st = xknn_search(&p, &r, &q, 4, ids, dist, &err);
    ok(st == XKNN_SUCCESS && dist[4 + 0] == 1.0f && dist[4 + 1] == 1.0f && dist[4 + 2] == 1.0f && dist[4 + 3] == 1.0f &&
           ids[4] == 0 && ids[5] == 1 && ids[6] == 2 && ids[7] == 3,
       "cosine: a zero query is at distance 1 from every reference, ties by id");
    {
        float one = -1.0f;
        ok(xknn_distance_ex(&p, XKNN_DTYPE_F32, a + 9, b, 3, &one, NULL) == XKNN_SUCCESS && one == 1.0f &&
               xknn_distance_ex(&p, XKNN_DTYPE_F32, a + 9, b + 3, 3, &one, NULL) == XKNN_SUCCESS && one == 1.0f,
           "cosine: zero reference vs non-zero query and zero vs zero give exactly 1");
    }
    {
        float c = -1.0f;
        ok(xknn_distance_ex(&p, XKNN_DTYPE_F32, a, a, 3, &c, NULL) == XKNN_SUCCESS && c >= 0.0f && c < 1e-7f,
           "cosine: a vector against itself is at distance ~0 and never negative (%g)", c);
    }

    /* the float-only xknn_distance covers the real-valued metrics */
    {
        ref_spec sp;
        float w1, w2;
        sp.dtype = REF_F32;
        sp.p = 2.0;
        sp.weights = NULL;
        sp.metric = REF_L1;
        w1 = ref_distance_ex(&sp, a, a + 6, 3);
        sp.metric = REF_CHEBYSHEV;
        w2 = ref_distance_ex(&sp, a, a + 6, 3);
        ok(xknn_distance(XKNN_METRIC_L1, a, a + 6, 3) == w1 && xknn_distance(XKNN_METRIC_CHEBYSHEV, a, a + 6, 3) == w2 &&
               isnan(xknn_distance(XKNN_METRIC_HAMMING, a, a + 6, 3)),
           "xknn_distance: l1 and chebyshev canonical, hamming NaN");
    }

    /* whamming weights */
    p = xknn_params_default();
    p.metric = XKNN_METRIC_WHAMMING;
    for (i = 0; i < 70; i++) wts[i] = 1.0f;
    p.weights = wts;
    p.weights_count = 69;
    st = xknn_search(&p, &rb, NULL, 1, ids, dist, &err);
    ok(st == XKNN_ERROR_INVALID_ARGUMENT && has(err.message, "69 weights for 70 bits"),
       "whamming: weights of the wrong length: %s", err.message);
    p.weights = NULL;
    p.weights_count = 70;
    st = xknn_search(&p, &rb, NULL, 1, ids, dist, &err);
    ok(st == XKNN_ERROR_INVALID_ARGUMENT && has(err.message, "weights"), "whamming: no weights: %s", err.message);
    p.weights = wts;
    wts[33] = NAN;
    st = xknn_search(&p, &rb, NULL, 1, ids, dist, &err);
    ok(st == XKNN_ERROR_INVALID_VALUE && has(err.message, "weight 33"), "whamming: NaN weight: %s", err.message);
    wts[33] = 2.0f;
    st = xknn_search(&p, &rb, NULL, 1, ids, dist, &err);
    /* row 0: bits 0, 2; row 1: bits 0, 1 -> differ in bits 1 and 2: weights 1 + 1 */
    ok(st == XKNN_SUCCESS && ids[0] == 1 && dist[0] == 2.0f && ids[1] == 0 && dist[1] == 2.0f,
       "whamming on a 70-bit pair: distance 2 both ways");

    /* minkowski p */
    p = xknn_params_default();
    p.metric = XKNN_METRIC_MINKOWSKI;
    p.p = 0.5;
    st = xknn_search(&p, &r, &q, 1, ids, dist, &err);
    ok(st == XKNN_ERROR_INVALID_ARGUMENT && has(err.message, "p=0.5"), "minkowski p < 1: %s", err.message);
    p.p = NAN;
    st = xknn_search(&p, &r, &q, 1, ids, dist, &err);
    ok(st == XKNN_ERROR_INVALID_ARGUMENT, "minkowski p = NaN: %s", err.message);
    {
        float d0 = 0, d2 = 0;
        p.p = 0.0;
        xknn_distance_ex(&p, XKNN_DTYPE_F32, a, b, 3, &d0, NULL);
        p.p = 2.0;
        xknn_distance_ex(&p, XKNN_DTYPE_F32, a, b, 3, &d2, NULL);
        ok(d0 == d2 && d2 == sqrtf(0.0f + 0 + 1 + 4), "minkowski p = 0 means p = 2 (%g)", d0);
    }

    /* metric / dtype pairs */
    p = xknn_params_default();
    st = xknn_search(&p, &rb, NULL, 1, ids, dist, &err);
    ok(st == XKNN_ERROR_INVALID_ARGUMENT && has(err.message, "'l2' does not accept bit-packed"),
       "l2 on bits refused: %s", err.message);
    p.metric = XKNN_METRIC_HAMMING;
    st = xknn_search(&p, &r, &q, 1, ids, dist, &err);
    ok(st == XKNN_ERROR_INVALID_ARGUMENT && has(err.message, "needs bit-packed"), "hamming on f32 refused: %s",
       err.message);
    {
        uint8_t q8[2 * 3] = {0};
        xknn_matrix mq = XKNN_MATRIX_TYPED(q8, 2, 3, XKNN_DTYPE_U8);
        p.metric = XKNN_METRIC_L1;
        st = xknn_search(&p, &r, &mq, 1, ids, dist, &err);
        ok(st == XKNN_ERROR_INVALID_ARGUMENT && has(err.message, "dtype mismatch"), "dtype mismatch: %s",
           err.message);
    }

    /* CUDA routing: every metric is on the device; without one, backend cuda says so */
    p = xknn_params_default();
    p.metric = XKNN_METRIC_L1;
    p.backend = XKNN_BACKEND_CUDA;
    st = xknn_search(&p, &r, &q, 1, ids, dist, &err);
    if (xknn_backend_built(XKNN_BACKEND_CUDA) && xknn_cuda_device_count() > 0)
        ok(st == XKNN_SUCCESS, "backend cuda runs l1: %s", st == XKNN_SUCCESS ? "ok" : err.message);
    else
        ok((st == XKNN_ERROR_NO_DEVICE || st == XKNN_ERROR_NOT_BUILT) && has(err.message, "backend cuda"),
           "backend cuda without a device: %s", err.message);
    p.backend = XKNN_BACKEND_AUTO;
    st = xknn_search(&p, &r, &q, 1, ids, dist, &err);
    ok(st == XKNN_SUCCESS, "backend auto runs l1");

    /* NaN / Inf in half types */
    {
        uint16_t h[2 * 3] = {0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x7e00, 0x3c00};
        uint16_t bf[2 * 3] = {0x3f80, 0x7f80, 0, 0, 0, 0};
        xknn_matrix m16 = XKNN_MATRIX_TYPED(h, 2, 3, XKNN_DTYPE_F16), mbf = XKNN_MATRIX_TYPED(bf, 2, 3, XKNN_DTYPE_BF16);
        p = xknn_params_default();
        st = xknn_search(&p, &m16, NULL, 1, ids, dist, &err);
        ok(st == XKNN_ERROR_INVALID_VALUE && has(err.message, "row 1 column 1 is NaN"), "f16 NaN: %s", err.message);
        st = xknn_search(&p, &mbf, NULL, 1, ids, dist, &err);
        ok(st == XKNN_ERROR_INVALID_VALUE && has(err.message, "row 0 column 1 is Inf"), "bf16 Inf: %s", err.message);
    }

    /* ip: largest first; padding reports -inf */
    p = xknn_params_default();
    p.metric = XKNN_METRIC_IP;
    p.pad_missing = 1;
    p.backend = XKNN_BACKEND_CPU;
    st = xknn_search(&p, &r, &q, 5, ids, dist, &err);
    ok(st == XKNN_SUCCESS && ids[0] == 1 && dist[0] == 15.0f && ids[1] == 0 && dist[1] == 6.0f && ids[4] == -1 &&
           dist[4] == -INFINITY,
       "ip: largest inner product first, padding -inf");
}

/* The library's own log/exp are accurate (they only need to be deterministic, but a
 * Minkowski distance should still mean what it says). */
static void math_case(void)
{
    double worst = 0.0, x;
    for (x = 1e-300; x < 1e300; x *= 1.7) {
        double l = xknn__cm_log(x), e;
        double rel = fabs(l - log(x)) / fmax(fabs(log(x)), 1e-300);
        if (rel > worst && fabs(log(x)) > 1e-3) worst = rel;
        if (fabs(l) < 700) {
            e = xknn__cm_exp(l);
            rel = fabs(e - x) / x;
            if (rel > worst * 1.0 && rel > 1e-13) worst = rel;
        }
    }
    ok(worst < 1e-14, "canonical log/exp agree with libm to %.3g relative", worst);
}

/* The CUDA backend: every search above plus the CUDA shapes, streamed and sliced
 * variants; the oracle decides. */
static int cuda_main(int part)
{
    int m, t, s;
    xknn_error err;
    if (!xknn_backend_built(XKNN_BACKEND_CUDA) || xknn_cuda_device_count() == 0) skip_all("no CUDA device");
    cur_backend = XKNN_BACKEND_CUDA;
    if (xknn_cuda_context_create(-1, &cur_ctx, &err) != XKNN_SUCCESS) bail("context: %s", err.message);
    /* every metric x dtype on the small shapes; the CUDA shapes once per metric, on a
     * dtype that rotates with the metric */
    if (part == 1)
        plan(NREAL * NDT * NSHAPES + NREAL * NGPU);
    else if (part == 2)
        plan(2 * (NSHAPES + NGPU) + 3 * 2 * NIMMA + NIMMA + 2 * (NREAL + 2));
    else
        plan(NREAL * NDT * NSHAPES + NREAL * NGPU + 2 * (NSHAPES + NGPU) + 3 * 2 * NIMMA + NIMMA + 2 * (NREAL + 2));
    for (m = 0; m < NREAL && part != 2; m++) {
        for (t = 0; t < NDT; t++)
            for (s = 0; s < NSHAPES; s++) run_case(real_metrics[m].metric, real_metrics[m].p, real_dtypes[t], &shapes[s]);
        for (s = 0; s < NGPU; s++)
            run_case(real_metrics[m].metric, real_metrics[m].p, real_dtypes[(m + s) % NDT], &gpu_shapes[s]);
    }
    if (part == 1) {
        xknn_cuda_context_destroy(cur_ctx);
        return tap_done();
    }
    for (m = XKNN_METRIC_HAMMING; m <= XKNN_METRIC_WHAMMING; m++) {
        for (s = 0; s < NSHAPES; s++) run_case((xknn_metric)m, 0, XKNN_DTYPE_BIN, &shapes[s]);
        for (s = 0; s < NGPU; s++) run_case((xknn_metric)m, 0, XKNN_DTYPE_BIN, &gpu_shapes[s]);
    }
    {
        static const xknn_metric im[] = {XKNN_METRIC_L2, XKNN_METRIC_EUCLIDEAN, XKNN_METRIC_IP};
        for (m = 0; m < 3; m++)
            for (t = 0; t < 2; t++)
                for (s = 0; s < NIMMA; s++) run_case(im[m], 0, t ? XKNN_DTYPE_I8 : XKNN_DTYPE_U8, &imma_shapes[s]);
        /* hamming: the b1 tensor cores (d bits) */
        for (s = 0; s < NIMMA; s++) run_case(XKNN_METRIC_HAMMING, 0, XKNN_DTYPE_BIN, &imma_shapes[s]);
    }
    /* each call with its own context: references streamed in chunks (a 512 KiB budget),
     * and split into slices of 5000 rows merged on the host (ip merges by -value) */
    xknn_cuda_context_destroy(cur_ctx);
    cur_ctx = NULL;
    for (m = 0; m < NREAL + 2; m++) {
        const xknn_metric met = m < NREAL ? real_metrics[m].metric : (xknn_metric)(XKNN_METRIC_HAMMING + m - NREAL);
        const double pp = m < NREAL ? real_metrics[m].p : 0;
        const xknn_dtype dt = m < NREAL ? real_dtypes[m % NDT] : XKNN_DTYPE_BIN;
        cur_budget = (size_t)512 << 10;
        cur_note = " (streamed, 512 KiB budget)";
        run_case(met, pp, dt, &gpu_shapes[0]);
        cur_budget = 0;
        cur_note = " (slices of 5000)";
        setenv("XKNN_CUDA_REF_SLICE", "5000", 1);
        run_case(met, pp, dt, &gpu_shapes[0]);
        unsetenv("XKNN_CUDA_REF_SLICE");
        cur_note = "";
    }
    return tap_done();
}

int main(int argc, char **argv)
{
    int m, t, s;
    if (argc > 1 && !strcmp(argv[1], "cuda")) return cuda_main(argc > 2 ? atoi(argv[2]) : 0);
    plan(1 + 1 + NREAL * NDT + 2 + NREAL * NDT * NSHAPES + 2 * NSHAPES + 2 * (2 * 3 + 2) * NBIG + 22);

    ok((int)REF_L1 == (int)XKNN_METRIC_L1 && (int)REF_WHAMMING == (int)XKNN_METRIC_WHAMMING &&
           (int)REF_IP == (int)XKNN_METRIC_IP && (int)REF_BIN == (int)XKNN_DTYPE_BIN &&
           (int)REF_I8 == (int)XKNN_DTYPE_I8 && (int)REF_BF16 == (int)XKNN_DTYPE_BF16,
       "oracle numbering matches xknn_metric and xknn_dtype");
    {
        int good = 1;
        for (m = 0; m < XKNN_METRIC_COUNT; m++) good &= (int)xknn_metric_from_name(xknn_metric_name((xknn_metric)m)) == m;
        for (t = 0; t < XKNN_DTYPE_COUNT; t++) good &= (int)xknn_dtype_from_name(xknn_dtype_name((xknn_dtype)t)) == t;
        good &= xknn_metric_from_name("manhattan") == XKNN_METRIC_L1 && xknn_metric_from_name("nope") == XKNN_METRIC_COUNT;
        ok(good, "metric and dtype names round-trip");
    }

    for (m = 0; m < NREAL; m++)
        for (t = 0; t < NDT; t++) distance_case(real_metrics[m].metric, real_metrics[m].p, real_dtypes[t]);
    distance_case(XKNN_METRIC_HAMMING, 0, XKNN_DTYPE_BIN);
    distance_case(XKNN_METRIC_WHAMMING, 0, XKNN_DTYPE_BIN);

    for (m = 0; m < NREAL; m++)
        for (t = 0; t < NDT; t++)
            for (s = 0; s < NSHAPES; s++) run_case(real_metrics[m].metric, real_metrics[m].p, real_dtypes[t], &shapes[s]);
    for (s = 0; s < NSHAPES; s++) run_case(XKNN_METRIC_HAMMING, 0, XKNN_DTYPE_BIN, &shapes[s]);
    for (s = 0; s < NSHAPES; s++) run_case(XKNN_METRIC_WHAMMING, 0, XKNN_DTYPE_BIN, &shapes[s]);

    {
        static const xknn_metric im[] = {XKNN_METRIC_L2, XKNN_METRIC_EUCLIDEAN, XKNN_METRIC_IP};
        static const xknn_dtype it[] = {XKNN_DTYPE_U8, XKNN_DTYPE_I8};
        int pth;
        for (pth = 0; pth < 2; pth++) {
            cur_path = pth ? XKNN_CPU_PATH_LOOP : XKNN_CPU_PATH_AUTO;
            for (m = 0; m < 3; m++)
                for (t = 0; t < 2; t++)
                    for (s = 0; s < NBIG; s++) run_case(im[m], 0, it[t], &big_shapes[s]);
            /* f32 ip and cosine: the certified sgemm path (auto) and the loop */
            for (s = 0; s < NBIG; s++) run_case(XKNN_METRIC_IP, 0, XKNN_DTYPE_F32, &big_shapes[s]);
            for (s = 0; s < NBIG; s++) run_case(XKNN_METRIC_COSINE, 0, XKNN_DTYPE_F32, &big_shapes[s]);
        }
        cur_path = XKNN_CPU_PATH_AUTO;
    }

    error_cases();
    math_case();
    return tap_done();
}
