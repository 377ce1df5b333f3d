/* SPDX-License-Identifier: MIT */
/*
 * bench_selfjoin -- the all-kNN graph (self-join) on one device: the symmetric path
 * against the plain one (params.self_join = XKNN_SELF_JOIN_PLAIN) on the same data in
 * the same run, host arrays in and out (xknn_search with query = NULL; on the GPU each
 * path with a context of its own kept across the repeats: uploads go through its pinned
 * staging and its memory pool keeps the device buffers between calls).
 *
 *   bench_selfjoin --n 1M --d 128 --k 16 --backend cuda --repeats 3
 *   bench_selfjoin --backend cpu --n 4000 --d 16 --k 5 --repeats 1
 *
 * Checks: the symmetric and plain outputs are the same bytes (ids and distance bits),
 * and --check S contiguous rows (from n / 3 on) equal the CPU backend's search of those
 * rows as queries (exclude_self with their ids). Data: the uniform generator of
 * bench_common (seed 1, the reference stream). Prints one line per path and a summary;
 * --json FILE appends one JSON object; --write-data FILE writes the data (.fbin) for
 * peers_selfjoin.py. Exit status: 0 PASS, 1 FAIL (a difference or a failed search),
 * 2 usage/setup error.
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

#define PROG "bench_selfjoin"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [options]\n"
            "  --n N           points (K/M suffixes; default 100k)\n"
            "  --d D           dimensions (default 128)\n"
            "  --k K           neighbours per point (default 16)\n"
            "  --metric M      l2, euclidean, ip or cosine (default l2)\n"
            "  --backend B     cuda or cpu (default cuda)\n"
            "  --repeats R     timed runs per path after one warm-up (default 3; median)\n"
            "  --check S       rows compared with the CPU backend (default 64; 0: none)\n"
            "  --no-plain      time only the symmetric path (no byte comparison)\n"
            "  --json FILE     append one JSON object\n"
            "  --write-data F  write the points as .fbin\n"
            "  -v              the library's verbose lines (plan, path) of the warm-up calls\n"
            "  -vv             and of the timed calls\n");
}

static xknn_cuda_context *ctx_of[2]; /* [0] symmetric, [1] plain (cuda backend) */

static xknn_status run(const xknn_params *base, xknn_self_join mode, const xknn_matrix *x, int64_t k, int64_t *ids,
                       float *dist, double *ms, xknn_error *err)
{
    xknn_params p = *base;
    double t0;
    xknn_status st;
    p.self_join = mode;
    if (p.backend == XKNN_BACKEND_CUDA) p.cuda_context = ctx_of[mode == XKNN_SELF_JOIN_PLAIN];
    t0 = bench_now();
    st = xknn_search(&p, x, NULL, k, ids, dist, err);
    *ms = (bench_now() - t0) * 1e3;
    return st;
}

int main(int argc, char **argv)
{
    int64_t n = 100000, d = 128, k = 16, check = 64;
    int repeats = 3, plain = 1, verbose = 0, i;
    const char *json = NULL, *write_data = NULL, *backend = "cuda", *metric = "l2";
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_error err;
    bench_gen g;
    float *x, *sd, *pd = NULL;
    int64_t *sid, *pid = NULL;
    double ts[64], tp[64], sym_ms, plain_ms = 0.0;
    char date[64], device[256] = "cpu";
    int same = -1;
    int64_t wrong = -1;
    /* the options that take a size (each at least its minimum) or a word, and what each sets */
    static const char *const size_names[] = {"--n", "--d", "--k", "--check", NULL};
    static const int64_t size_min[] = {2, 1, 1, 0};
    int64_t *const size_dst[] = {&n, &d, &k, &check};
    static const char *const word_names[] = {"--backend", "--metric", "--json", "--write-data", NULL};
    const char **const word_dst[] = {&backend, &metric, &json, &write_data};
    int j;

    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-v")) {
            verbose = 1;
        } else if (!strcmp(a, "-vv")) {
            verbose = 2;
        } else if (!strcmp(a, "--no-plain")) {
            plain = 0;
        } else if (v && (j = bench_find_word(a, size_names)) >= 0) {
            if (bench_parse_size(v, size_dst[j]) || *size_dst[j] < size_min[j])
                bench_die(PROG, "%s %s: need an integer >= %lld", a, v, (long long)size_min[j]);
            i++;
        } else if (v && !strcmp(a, "--repeats")) {
            repeats = atoi(v);
            if (repeats < 1 || repeats > 64) bench_die(PROG, "--repeats %s: need 1..64", v);
            i++;
        } else if (v && (j = bench_find_word(a, word_names)) >= 0) {
            *word_dst[j] = v;
            i++;
        } else {
            usage(stderr);
            bench_die(PROG, "unknown or incomplete option '%s'", a);
        }
    }
    if (k > n - 1) bench_die(PROG, "--k %lld: need k <= n - 1", (long long)k);
    p.metric = xknn_metric_from_name(metric);
    if ((p.metric != XKNN_METRIC_L2 && p.metric != XKNN_METRIC_EUCLIDEAN && p.metric != XKNN_METRIC_IP &&
         p.metric != XKNN_METRIC_COSINE))
        bench_die(PROG, "--metric %s: l2, euclidean, ip or cosine", metric);
    p.verbose = verbose;
    if (!strcmp(backend, "cuda")) {
        p.backend = XKNN_BACKEND_CUDA;
        for (i = 0; i < 2; i++)
            if (xknn_cuda_context_create(0, &ctx_of[i], &err) != XKNN_SUCCESS) bench_die(PROG, "%s", err.message);
#ifdef XKNN_BENCH_CUDA
        {
            struct cudaDeviceProp prop;
            if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) snprintf(device, sizeof device, "%s", prop.name);
        }
#endif
    } else if (!strcmp(backend, "cpu")) {
        p.backend = XKNN_BACKEND_CPU;
        bench_cpu_model(device, sizeof device);
    } else {
        bench_die(PROG, "--backend %s: cuda or cpu", backend);
    }

    x = (float *)bench_xmalloc((size_t)(n * d) * sizeof(float), "points");
    if (bench_gen_init(&g, BENCH_DATA_UNIFORM, 1, d, 0, 0.0) != 0) bench_die(PROG, "out of memory");
    bench_gen_rows(&g, BENCH_STREAM_REF, 0, n, x);
    bench_gen_free(&g);
    if (write_data && bench_write_fbin(write_data, x, n, d) != 0) bench_die(PROG, "cannot write %s", write_data);
    sid = (int64_t *)bench_xmalloc((size_t)(n * k) * sizeof(int64_t), "ids");
    sd = (float *)bench_xmalloc((size_t)(n * k) * sizeof(float), "distances");
    if (plain) {
        pid = (int64_t *)bench_xmalloc((size_t)(n * k) * sizeof(int64_t), "ids");
        pd = (float *)bench_xmalloc((size_t)(n * k) * sizeof(float), "distances");
    }

    {
        const xknn_matrix xm = XKNN_MATRIX_F32(x, n, d);
        int r;
        /* warm-up of each path, then alternate so both see the same machine state */
        if (run(&p, XKNN_SELF_JOIN_AUTO, &xm, k, sid, sd, &sym_ms, &err) != XKNN_SUCCESS)
            bench_die(PROG, "symmetric: %s", err.message);
        if (plain && run(&p, XKNN_SELF_JOIN_PLAIN, &xm, k, pid, pd, &plain_ms, &err) != XKNN_SUCCESS)
            bench_die(PROG, "plain: %s", err.message);
        p.verbose = verbose > 1; /* -vv: the timed calls' lines too */
        for (r = 0; r < repeats; r++) {
            if (run(&p, XKNN_SELF_JOIN_AUTO, &xm, k, sid, sd, &ts[r], &err) != XKNN_SUCCESS)
                bench_die(PROG, "symmetric: %s", err.message);
            if (plain && run(&p, XKNN_SELF_JOIN_PLAIN, &xm, k, pid, pd, &tp[r], &err) != XKNN_SUCCESS)
                bench_die(PROG, "plain: %s", err.message);
        }
        sym_ms = bench_median(ts, repeats);
        if (plain) {
            plain_ms = bench_median(tp, repeats);
            same = !memcmp(sid, pid, (size_t)(n * k) * sizeof(int64_t)) &&
                   !memcmp(sd, pd, (size_t)(n * k) * sizeof(float));
        }
        if (check > 0) {
            /* rows [s0, s0 + S) as queries on the CPU backend, their own ids excluded */
            const int64_t S = check < n ? check : n, s0 = (n - S) / 3;
            const xknn_matrix qm = XKNN_MATRIX_F32(x + s0 * d, S, d);
            xknn_params c = XKNN_PARAMS_INIT;
            int64_t *cid = (int64_t *)bench_xmalloc((size_t)(S * k) * sizeof(int64_t), "ids");
            float *cd = (float *)bench_xmalloc((size_t)(S * k) * sizeof(float), "distances");
            int64_t q;
            c.backend = XKNN_BACKEND_CPU;
            c.metric = p.metric;
            c.exclude_self = 1;
            c.query_id_offset = s0;
            if (xknn_search(&c, &xm, &qm, k, cid, cd, &err) != XKNN_SUCCESS) bench_die(PROG, "check: %s", err.message);
            wrong = 0;
            for (q = 0; q < S; q++)
                wrong += memcmp(cid + q * k, sid + (s0 + q) * k, (size_t)k * sizeof(int64_t)) != 0 ||
                         memcmp(cd + q * k, sd + (s0 + q) * k, (size_t)k * sizeof(float)) != 0;
            free(cid);
            free(cd);
        }
    }

    bench_utc_date(date, sizeof date);
    printf("# " PROG " n=%lld d=%lld k=%lld %s backend=%s device=%s commit=%s date=%s\n", (long long)n, (long long)d,
           (long long)k, metric, backend, device, bench_commit(), date);
    printf("symmetric  %10.2f ms  (median of %d; %.3g distance pairs/s)\n", sym_ms, repeats,
           (double)n * (double)(n - 1) / 2.0 / (sym_ms * 1e-3));
    if (plain)
        printf("plain      %10.2f ms  speed-up plain/symmetric %.2fx; outputs %s\n", plain_ms, plain_ms / sym_ms,
               same ? "byte-identical" : "DIFFER");
    if (check > 0) printf("check      %lld of %lld sampled rows differ from the CPU backend\n", (long long)wrong,
                          (long long)(check < n ? check : n));
    if (json) {
        FILE *f = fopen(json, "a");
        if (!f) bench_die(PROG, "cannot open %s", json);
        fprintf(f, "{\"program\": \"" PROG "\", \"commit\": ");
        bench_json_str(f, bench_commit());
        bench_json_key_str(f, "date", date);
        bench_json_key_str(f, "device", device);
        bench_json_key_str(f, "backend", backend);
        bench_json_key_str(f, "metric", metric);
        fprintf(f, ", \"n\": %lld, \"d\": %lld, \"k\": %lld, \"repeats\": %d, \"symmetric_ms\": ", (long long)n,
                (long long)d, (long long)k, repeats);
        bench_json_num(f, sym_ms);
        bench_json_key_num(f, "plain_ms", plain ? plain_ms : -1.0);
        fprintf(f, ", \"same_bytes\": %d, \"check_rows\": %lld, \"check_wrong\": %lld}\n", same, (long long)check,
                (long long)wrong);
        fclose(f);
    }
    free(x);
    free(sid);
    free(sd);
    free(pid);
    free(pd);
    for (i = 0; i < 2; i++)
        if (ctx_of[i]) xknn_cuda_context_destroy(ctx_of[i]);
    return (plain && !same) || wrong > 0 ? 1 : 0;
}
