/* SPDX-License-Identifier: MIT */
/*
 * bench_metrics.c -- times xknn_search for any metric and dtype (host arrays in and out,
 * copies included; a reused CUDA context, so context creation is not timed) and checks
 * sampled queries against the CPU backend, byte for byte.
 *
 *   bench_metrics --metric l1 --dtype f32 --n 1M --nq 10k --d 128 --k 10
 *                 [--backend cuda|cpu|auto] [--repeats 5] [--check 16] [--p 3]
 *                 [--seed 1] [--write-data PREFIX] [--json FILE] [-v]
 *
 * Data: uniform values (f32/f16/bf16 in [0, 1), u8 in 0..255, i8 in -128..127) or random
 * bits (--dtype bin, --d in bits), from a splitmix64 stream per (seed, matrix, row): the
 * same data on every machine. whamming uses weights 0.25 * (1 + b % 8) for bit b.
 * --write-data writes PREFIX.ref.bin and PREFIX.query.bin (uint32 rows, uint32 d, raw
 * rows; d in bits and 64-bit words for bin) for benchmarks/peers_metrics.py.
 *
 * Printed per run: median and min of --repeats timed searches (after one warm-up), the
 * rate in distance pairs per second (bin: also bit operations per second, n nq d / t),
 * and #wrong: sampled queries whose ids or distance bits differ from the CPU backend's.
 * On a GPU, for f32 l2, euclidean, ip and cosine (the metrics of xknn_cuda_search), also
 * the device-resident time: CUDA events around xknn_cuda_search with the inputs already
 * on the device (the way PyTorch peers are timed), whose results must equal the host-array
 * run's byte for byte (exit status 1 otherwise, as for #wrong).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "xknn.h"
#include "xknn/cuda.h"

#ifdef XKNN_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

#define PROG "bench_metrics"

#ifdef XKNN_BENCH_CUDA
#define CUDA_DIE(call) BENCH_CUDA_DIE(PROG, call)

/* Device-resident timing (f32 l2, euclidean, ip, cosine: the metrics xknn_cuda_search
 * takes): inputs already on the device, CUDA events around xknn_cuda_search on a stream
 * with the preferred workspace; median of `repeats` after one warm-up. The last run's
 * results must equal the host-array run's (ids, dist) byte for byte: *same. */
static double device_median(xknn_cuda_context *ctx, const xknn_params *prm, const float *ref, int64_t n,
                            const float *qry, int64_t nq, int64_t d, int64_t k, int repeats, const int64_t *ids,
                            const float *dist, int *same)
{
    float *dr, *dq, *dd;
    int64_t *di;
    void *ws;
    size_t bytes = 0;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    xknn_error err;
    double t[64];
    int64_t *hi = (int64_t *)bench_xmalloc((size_t)(nq * k) * sizeof(int64_t), "ids");
    float *hd = (float *)bench_xmalloc((size_t)(nq * k) * sizeof(float), "dist");
    xknn_matrix R = XKNN_MATRIX_F32(NULL, n, d), Q = XKNN_MATRIX_F32(NULL, nq, d);
    int r;
    if (xknn_cuda_workspace_size(ctx, prm, n, nq, d, k, &bytes, &err) != XKNN_SUCCESS)
        bench_die(PROG, "xknn_cuda_workspace_size: %s", err.message);
    CUDA_DIE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_DIE(cudaEventCreate(&e0));
    CUDA_DIE(cudaEventCreate(&e1));
    CUDA_DIE(cudaMalloc((void **)&dr, (size_t)(n * d) * sizeof(float)));
    CUDA_DIE(cudaMalloc((void **)&dq, (size_t)(nq * d) * sizeof(float)));
    CUDA_DIE(cudaMalloc((void **)&di, (size_t)(nq * k) * sizeof(int64_t)));
    CUDA_DIE(cudaMalloc((void **)&dd, (size_t)(nq * k) * sizeof(float)));
    CUDA_DIE(cudaMalloc(&ws, bytes));
    CUDA_DIE(cudaMemcpy(dr, ref, (size_t)(n * d) * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_DIE(cudaMemcpy(dq, qry, (size_t)(nq * d) * sizeof(float), cudaMemcpyHostToDevice));
    R.data = dr;
    Q.data = dq;
    for (r = -1; r < repeats; r++) {
        float ms = 0.0f;
        CUDA_DIE(cudaEventRecord(e0, s));
        if (xknn_cuda_search(ctx, prm, &R, &Q, k, di, dd, ws, bytes, &err, s) != XKNN_SUCCESS)
            bench_die(PROG, "xknn_cuda_search: %s", err.message);
        CUDA_DIE(cudaEventRecord(e1, s));
        CUDA_DIE(cudaEventSynchronize(e1));
        CUDA_DIE(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t[r] = ms * 1e-3;
    }
    CUDA_DIE(cudaMemcpy(hi, di, (size_t)(nq * k) * sizeof(int64_t), cudaMemcpyDeviceToHost));
    CUDA_DIE(cudaMemcpy(hd, dd, (size_t)(nq * k) * sizeof(float), cudaMemcpyDeviceToHost));
    *same = !memcmp(hi, ids, (size_t)(nq * k) * sizeof(int64_t)) && !memcmp(hd, dist, (size_t)(nq * k) * sizeof(float));
    {
        void *const bufs[] = {ws, dd, di, dq, dr}; /* freed in this order */
        for (r = 0; r < 5; r++) CUDA_DIE(cudaFree(bufs[r]));
    }
    CUDA_DIE(cudaEventDestroy(e1));
    CUDA_DIE(cudaEventDestroy(e0));
    CUDA_DIE(cudaStreamDestroy(s));
    free(hi);
    free(hd);
    return bench_median(t, repeats);
}
#endif

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* float in [0, 1) -> IEEE half bits (exact: 11-bit multiples of 2^-11 are used) */
static uint16_t half_of(uint32_t m11)
{
    /* value m11 * 2^-11, m11 in [0, 2048) */
    int e;
    uint32_t m = m11;
    if (!m) return 0;
    e = 0;
    while (!(m & 0x400u)) {
        m <<= 1;
        e++;
    }
    /* m in [1024, 2048): value = m * 2^(-11 - e), exponent -1 - e */
    return (uint16_t)(((uint32_t)(15 - 1 - e) << 10) | (m & 0x3ffu));
}

static void *make_rows(xknn_dtype dt, int64_t rows, int64_t d, uint64_t seed, int which)
{
    const size_t rb = (size_t)xknn_row_bytes(dt, d);
    unsigned char *x = (unsigned char *)bench_xmalloc(rb * (size_t)rows, "data");
    int64_t i;
#pragma omp parallel for schedule(static)
    for (i = 0; i < rows; i++) {
        uint64_t s = mix(seed * 0x100000001b3ull + (uint64_t)which * 0x9e37ull + (uint64_t)i * 0x2545f4914f6cdd1dull);
        unsigned char *r = x + (size_t)i * rb;
        int64_t t;
        if (dt == XKNN_DTYPE_BIN) {
            for (t = 0; t < (d + 63) / 64; t++) {
                const uint64_t w = mix(s + (uint64_t)t);
                memcpy(r + 8 * t, &w, 8);
            }
            continue;
        }
        for (t = 0; t < d; t++) {
            const uint64_t v = mix(s + (uint64_t)t);
            switch (dt) {
            case XKNN_DTYPE_F16: {
                const uint16_t h = half_of((uint32_t)(v & 0x7ffu));
                memcpy(r + 2 * t, &h, 2);
                break;
            }
            case XKNN_DTYPE_BF16: {
                const float f = (float)(v & 0xffu) / 256.0f; /* 8 significant bits: exact in bf16 */
                uint32_t b;
                uint16_t h;
                memcpy(&b, &f, 4);
                h = (uint16_t)(b >> 16);
                memcpy(r + 2 * t, &h, 2);
                break;
            }
            case XKNN_DTYPE_U8: r[t] = (unsigned char)(v & 0xffu); break;
            case XKNN_DTYPE_I8: r[t] = (unsigned char)(int8_t)(int)((v & 0xffu) - 128); break;
            default: {
                const float f = (float)(v & 0xffffffu) / 16777216.0f;
                memcpy(r + 4 * t, &f, 4);
                break;
            }
            }
        }
    }
    return x;
}

static void write_raw(const char *path, const void *x, int64_t rows, int64_t d, size_t rb)
{
    FILE *f = fopen(path, "wb");
    uint32_t h[2];
    h[0] = (uint32_t)rows;
    h[1] = (uint32_t)d;
    if (!f || fwrite(h, 4, 2, f) != 2 || fwrite(x, rb, (size_t)rows, f) != (size_t)rows || fclose(f) != 0)
        bench_die(PROG, "cannot write %s", path);
}

static void usage(void)
{
    fputs("usage: bench_metrics --metric NAME --dtype f32|f16|bf16|u8|i8|bin --n N --nq NQ --d D --k K\n"
          "                     [--backend cuda|cpu|auto] [--repeats 5] [--check 16] [--p P] [--seed 1]\n"
          "                     [--write-data PREFIX] [--json FILE] [-v: the warm-up run prints its plan]\n"
          "sizes take k/M/G suffixes (powers of 1000). See the header of bench_metrics.c.\n",
          stdout);
}

int main(int argc, char **argv)
{
    xknn_metric metric = XKNN_METRIC_L1;
    xknn_dtype dt = XKNN_DTYPE_F32;
    xknn_backend backend = XKNN_BACKEND_CUDA;
    int64_t n = 100000, nq = 1000, d = 128, k = 10, check = 16;
    int repeats = 5, r, verbose = 0;
    double p = 0.0;
    uint64_t seed = 1;
    const char *json = NULL, *prefix = NULL;
    xknn_cuda_context *ctx = NULL;
    xknn_params prm = XKNN_PARAMS_INIT;
    xknn_error err;
    float *w = NULL;
    double t[64];
    int i;

    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 0;
        }
        if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose = 1;
            continue;
        }
        if (!v) bench_die(PROG, "%s needs a value (--help)", a);
        i++;
        if (!strcmp(a, "--metric")) {
            metric = xknn_metric_from_name(v);
            if (metric == XKNN_METRIC_COUNT) bench_die(PROG, "unknown metric '%s'", v);
        } else if (!strcmp(a, "--dtype")) {
            dt = xknn_dtype_from_name(v);
            if (dt == XKNN_DTYPE_COUNT) bench_die(PROG, "unknown dtype '%s'", v);
        } else if (!strcmp(a, "--backend")) {
            backend = !strcmp(v, "cpu") ? XKNN_BACKEND_CPU : !strcmp(v, "auto") ? XKNN_BACKEND_AUTO : XKNN_BACKEND_CUDA;
        } else if (!strcmp(a, "--n")) {
            if (bench_parse_size(v, &n) != 0 || n < 1) bench_die(PROG, "bad --n '%s'", v);
        } else if (!strcmp(a, "--nq")) {
            if (bench_parse_size(v, &nq) != 0 || nq < 1) bench_die(PROG, "bad --nq '%s'", v);
        } else if (!strcmp(a, "--d")) {
            if (bench_parse_size(v, &d) != 0 || d < 1) bench_die(PROG, "bad --d '%s'", v);
        } else if (!strcmp(a, "--k")) {
            if (bench_parse_size(v, &k) != 0 || k < 1) bench_die(PROG, "bad --k '%s'", v);
        } else if (!strcmp(a, "--check")) {
            if (bench_parse_size(v, &check) != 0 || check < 0) bench_die(PROG, "bad --check '%s'", v);
        } else if (!strcmp(a, "--repeats")) {
            repeats = atoi(v);
            if (repeats < 1 || repeats > 64) bench_die(PROG, "--repeats must be 1..64");
        } else if (!strcmp(a, "--p")) {
            p = atof(v);
        } else if (!strcmp(a, "--seed")) {
            seed = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--write-data")) {
            prefix = v;
        } else if (!strcmp(a, "--json")) {
            json = v;
        } else {
            bench_die(PROG, "unknown option %s (--help)", a);
        }
    }
    if (check > nq) check = nq;

    {
        void *ref = make_rows(dt, n, d, seed, 0), *qry = make_rows(dt, nq, d, seed, 1);
        const size_t rb = (size_t)xknn_row_bytes(dt, d);
        xknn_matrix R = XKNN_MATRIX_TYPED(ref, n, d, dt), Q = XKNN_MATRIX_TYPED(qry, nq, d, dt);
        int64_t *ids = (int64_t *)bench_xmalloc((size_t)(nq * k) * sizeof(int64_t), "ids");
        float *dist = (float *)bench_xmalloc((size_t)(nq * k) * sizeof(float), "dist");
        int64_t wrong = 0;
        double med, mn, pairs, dev_med = 0.0;
        int dev_same = 1;
        char date[32];

        if (prefix) {
            char path[4096];
            snprintf(path, sizeof path, "%s.ref.bin", prefix);
            write_raw(path, ref, n, d, rb);
            snprintf(path, sizeof path, "%s.query.bin", prefix);
            write_raw(path, qry, nq, d, rb);
        }
        if (metric == XKNN_METRIC_WHAMMING) {
            w = (float *)bench_xmalloc((size_t)d * sizeof(float), "weights");
            for (i = 0; i < d; i++) w[i] = 0.25f * (float)(1 + i % 8);
        }
        prm.metric = metric;
        prm.p = p;
        prm.weights = w;
        prm.weights_count = w ? d : 0;
        prm.backend = backend;
        if (backend != XKNN_BACKEND_CPU && xknn_cuda_device_count() > 0) {
            if (xknn_cuda_context_create(-1, &ctx, &err) != XKNN_SUCCESS)
                bench_die(PROG, "xknn_cuda_context_create: %s", err.message);
            prm.cuda_context = ctx;
        }
        for (r = -1; r < repeats; r++) {
            const double t0 = bench_now();
            /* -v: every run prints the library's lines (the plan; on the integer
             * tensor-core path the device time after the reference upload), each after a
             * line naming the run, so scripts can take medians of the timed runs */
            prm.verbose = verbose;
            if (verbose) fprintf(stderr, "bench_metrics: %s\n", r < 0 ? "warm-up run" : "timed run");
            if (xknn_search(&prm, &R, &Q, k, ids, dist, &err) != XKNN_SUCCESS) bench_die(PROG, "search: %s", err.message);
            if (r >= 0) t[r] = bench_now() - t0;
        }
        med = bench_median(t, repeats);
        mn = bench_min(t, repeats);
#ifdef XKNN_BENCH_CUDA
        if (ctx && dt == XKNN_DTYPE_F32 &&
            (metric == XKNN_METRIC_L2 || metric == XKNN_METRIC_EUCLIDEAN || metric == XKNN_METRIC_IP ||
             metric == XKNN_METRIC_COSINE))
            dev_med = device_median(ctx, &prm, (const float *)ref, n, (const float *)qry, nq, d, k, repeats, ids, dist,
                                    &dev_same);
#endif

        /* check: sampled queries against the CPU backend (its own exact paths) */
        if (check > 0) {
            xknn_params cp = prm;
            int64_t s;
            unsigned char *sq = (unsigned char *)bench_xmalloc(rb * (size_t)check, "sample");
            int64_t *cid = (int64_t *)bench_xmalloc((size_t)(check * k) * sizeof(int64_t), "ids");
            float *cd = (float *)bench_xmalloc((size_t)(check * k) * sizeof(float), "dist");
            xknn_matrix S;
            for (s = 0; s < check; s++)
                memcpy(sq + (size_t)s * rb, (unsigned char *)qry + (size_t)bench_sample_index(s, check, nq) * rb, rb);
            S = (xknn_matrix)XKNN_MATRIX_TYPED(sq, check, d, dt);
            cp.backend = XKNN_BACKEND_CPU;
            cp.cuda_context = NULL;
            if (xknn_search(&cp, &R, &S, k, cid, cd, &err) != XKNN_SUCCESS) bench_die(PROG, "cpu check: %s", err.message);
            for (s = 0; s < check; s++) {
                const int64_t qi = bench_sample_index(s, check, nq);
                if (memcmp(cid + s * k, ids + qi * k, (size_t)k * sizeof(int64_t)) ||
                    memcmp(cd + s * k, dist + qi * k, (size_t)k * sizeof(float)))
                    wrong++;
            }
            free(sq);
            free(cid);
            free(cd);
        }
        pairs = (double)n * (double)nq;
        bench_utc_date(date, sizeof date);
        printf("# bench_metrics %s commit %s, %s\n", date, bench_commit(),
               ctx ? "cuda (host arrays in and out, copies included)" : "cpu");
        printf("metric %s dtype %s n %lld nq %lld d %lld k %lld: median %.2f ms, min %.2f ms, %.3g pairs/s",
               xknn_metric_name(metric), xknn_dtype_name(dt), (long long)n, (long long)nq, (long long)d, (long long)k,
               med * 1e3, mn * 1e3, pairs / med);
        if (dt == XKNN_DTYPE_BIN) printf(", %.3g bit-ops/s", pairs * (double)d / med);
        printf(", #wrong %lld of %lld sampled\n", (long long)wrong, (long long)check);
        if (dev_med > 0.0)
            printf("  device arrays (xknn_cuda_search, events): median %.2f ms, results %s the host-array run's\n",
                   dev_med * 1e3, dev_same ? "identical to" : "DIFFERENT from");
        if (json) {
            FILE *f = fopen(json, "a");
            if (!f) bench_die(PROG, "cannot open %s", json);
            fprintf(f,
                    "{\"program\": \"bench_metrics\", \"date\": \"%s\", \"commit\": \"%s\", \"backend\": \"%s\", "
                    "\"metric\": \"%s\", \"dtype\": \"%s\", \"n\": %lld, \"nq\": %lld, \"d\": %lld, \"k\": %lld, "
                    "\"median_ms\": %.4f, \"min_ms\": %.4f, \"device_median_ms\": %.4f, \"repeats\": %d, "
                    "\"wrong\": %lld, \"checked\": %lld}\n",
                    date, bench_commit(), ctx ? "cuda" : "cpu", xknn_metric_name(metric), xknn_dtype_name(dt),
                    (long long)n, (long long)nq, (long long)d, (long long)k, med * 1e3, mn * 1e3, dev_med * 1e3, repeats,
                    (long long)wrong, (long long)check);
            fclose(f);
        }
        xknn_cuda_context_destroy(ctx);
        free(ref);
        free(qry);
        free(ids);
        free(dist);
        free(w);
        return wrong || !dev_same ? 1 : 0;
    }
}
