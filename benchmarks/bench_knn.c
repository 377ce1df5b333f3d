/* SPDX-License-Identifier: MIT */
/*
 * bench_knn -- single-device benchmark of xknn: sweeps of n, nq, d, k over the CPU and
 * CUDA backends, self-checked against an exact host oracle on sampled queries.
 * benchmarks/README.md documents every option, column and derived metric.
 *
 *   bench_knn --n 1M --nq 10k --d 128 --k 10,100 --backend cuda --path auto,fp32
 *   bench_knn --backend cpu --n 3000 --nq 50 --d 16 --k 1,10 --repeats 1
 *
 * Timing: device-resident CUDA rows put CUDA events around xknn_cuda_search (inputs
 * already on the device, workspace preallocated, inputs rotated over copies when they
 * fit in L2); --host CUDA rows and CPU rows put a host clock around xknn_search (host
 * arrays in and out, copies included). Each row: warm-up first, then the median of the
 * repeats. Exit status: 0 PASS, 1 FAIL (a wrong or failed row), 2 usage/setup error.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "xknn.h"
#include "xknn/cuda.h"
#include "xknn/impl/cuda_internal.h"
#include "xknn/io.h"

#ifdef XKNN_BENCH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#endif
#ifdef XKNN_BENCH_CBLAS
#include <cblas.h>
#endif

#define PROG "bench_knn"
#define MAXL 32

/* Candidate paths of the CUDA backend: the values of XKNN_CUDA_PATH_* (xknn/cuda.h). */
enum { PATH_AUTO = 0, PATH_FP32 = 1, PATH_TF32 = 2, PATH_FUSED = 3, PATH_MMA = 4 };
enum { BK_CPU = 0, BK_CUDA = 1 };
enum { MODE_DEVICE = 0, MODE_HOST = 1 };

typedef struct opts {
    int64_t n[MAXL], nq[MAXL], d[MAXL], k[MAXL];
    int nn, nnq, nd, nk;
    int backend[2], nbackend;
    int path[5], npath;
    int mode[2], nmode;
    xknn_cpu_path cpu_path;
    bench_data_kind data;
    int64_t clusters;
    double sigma;
    uint64_t seed;
    int repeats, warmup;
    int64_t sample;
    int64_t query_block, ref_block, budget;
    int threads, device, rotate, verbose, no_ceiling;
    int64_t ceiling_size;
    const char *json, *write_data, *read_data;
} opts;

typedef struct row {
    int64_t n, nq, d, k;
    int backend, path, mode;
    char path_name[24];
    double *times; /* ms, one per repeat */
    int ntimes;
    double time_ms, min_ms, qps, tflops, ceiling, pct, gbps, link, pct_link; /* link: GB/s ceiling */
    int64_t wrong, sampled, nondet;
    size_t workspace;
    int copies;
    char status[16];
    char error[512];
} row;

typedef struct meta {
    char date[64], cpu[256], device[512];
    int threads;
    double sgemm_gpu, tf32_gpu, sgemm_cpu; /* TFLOP/s; NaN: not measured */
    double h2d_pinned, h2d_pageable;       /* GB/s of the host link; NaN: not measured */
    int64_t ceil_gpu_n, ceil_cpu_n;
    char data_source[600];
} meta;

/* ---- options ------------------------------------------------------------------------- */
static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [options]   (lists are comma-separated; every combination is a row)\n"
            "  --n LIST           references (default 100000); sizes take k M G (1000s) or Ki Mi Gi\n"
            "  --nq LIST          queries (default 1000)\n"
            "  --d LIST           dimension (default 128)\n"
            "  --k LIST           neighbours (default 10)\n"
            "  --backend LIST     cuda,cpu (default: cuda when built and a device is present)\n"
            "  --path LIST        CUDA candidate path: auto,fp32,tf32,fused,mma (default auto)\n"
            "  --mode LIST        CUDA timing: device (device-resident, events) and/or host\n"
            "                     (xknn_search on host arrays, copies included); default device\n"
            "  --host             same as --mode host\n"
            "  --cpu-path P       CPU candidate path: auto|blas|loop (default auto)\n"
            "  --data KIND        uniform|clusters (default uniform)\n"
            "  --clusters C       clusters of --data clusters (default 100)\n"
            "  --sigma S          cluster standard deviation (default 0.1)\n"
            "  --seed S           generator seed (default 1)\n"
            "  --repeats R        timed repeats per row (default 5); the median is reported\n"
            "  --warmup W         untimed runs before the repeats (default 1)\n"
            "  --sample S         sampled queries checked against the exact oracle (default 20)\n"
            "  --query-block N    xknn_params.query_block (default 0: automatic)\n"
            "  --ref-block N      xknn_params.ref_block (default 0: automatic)\n"
            "  --budget BYTES     xknn_params.device_memory_budget (default 0: free memory)\n"
            "  --threads N        CPU threads of the CPU backend (default 0: OpenMP default)\n"
            "  --device N         CUDA device (default 0)\n"
            "  --rotate N         at most N copies of inputs that fit in L2 (default 16; 1: off)\n"
            "  --ceiling-size N   square GEMM size of the ceilings (default 8192 GPU, 2048 CPU)\n"
            "  --no-ceiling       do not measure the GEMM ceilings (pct_ceiling blank)\n"
            "  --json FILE        write the metadata and all rows as JSON\n"
            "  --write-data P     write P.ref.fbin and P.query.fbin (P-dD.* when several d)\n"
            "  --read-data P      read P.ref.fbin and P.query.fbin instead of generating\n"
            "  --verbose          the backend prints its plan on stderr\n");
}

/* Parses a comma/space list of names (NULL-terminated table `names`, values `vals`)
 * into out[0..max); returns the count. Dies with the option and the accepted names. */
static int parse_names(const char *opt, const char *v, const char *const *names, const int *vals, int *out, int max)
{
    char w[8][32];
    int c = bench_split_words(v, w, max), j, m;
    if (c < 1) bench_die(PROG, "%s: cannot parse '%s'", opt, v);
    for (j = 0; j < c; j++) {
        for (m = 0; names[m] && strcmp(w[j], names[m]); m++)
            ;
        if (!names[m]) {
            char list[128] = "";
            for (m = 0; names[m]; m++) {
                strncat(list, m ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, names[m], sizeof list - strlen(list) - 1);
            }
            bench_die(PROG, "%s: unknown value '%s' (%s)", opt, w[j], list);
        }
        out[j] = vals[m];
    }
    return c;
}

static const char *need(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) bench_die(PROG, "%s needs a value (see --help)", argv[*i]);
    return argv[++*i];
}

static void parse_list(const char *opt, const char *v, int64_t *out, int *count, int64_t min)
{
    int i;
    *count = bench_parse_size_list(v, out, MAXL);
    if (*count < 1) bench_die(PROG, "%s: cannot parse '%s' (a comma-separated list of sizes)", opt, v);
    for (i = 0; i < *count; i++)
        if (out[i] < min) bench_die(PROG, "%s: %lld is below %lld", opt, (long long)out[i], (long long)min);
}

static int64_t parse_one(const char *opt, const char *v)
{
    int64_t x;
    if (bench_parse_size(v, &x) != 0) bench_die(PROG, "%s: cannot parse '%s'", opt, v);
    return x;
}

static void parse_opts(int argc, char **argv, opts *o)
{
    int i, n_set = 0, nq_set = 0, d_set = 0, backend_set = 0;
    memset(o, 0, sizeof *o);
    o->n[0] = 100000;
    o->nq[0] = 1000;
    o->d[0] = 128;
    o->k[0] = 10;
    o->nn = o->nnq = o->nd = o->nk = 1;
    o->path[0] = PATH_AUTO;
    o->npath = 1;
    o->mode[0] = MODE_DEVICE;
    o->nmode = 1;
    o->cpu_path = XKNN_CPU_PATH_AUTO;
    BENCH_SHARED_DEFAULTS(o);
    o->rotate = 16;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--n")) {
            parse_list(a, need(argc, argv, &i), o->n, &o->nn, 1);
            n_set = 1;
        } else if (!strcmp(a, "--nq")) {
            parse_list(a, need(argc, argv, &i), o->nq, &o->nnq, 1);
            nq_set = 1;
        } else if (!strcmp(a, "--d")) {
            parse_list(a, need(argc, argv, &i), o->d, &o->nd, 1);
            d_set = 1;
        } else if (!strcmp(a, "--k")) {
            parse_list(a, need(argc, argv, &i), o->k, &o->nk, 1);
        } else if (!strcmp(a, "--backend")) {
            static const char *const nm[] = {"cpu", "cuda", NULL};
            static const int val[] = {BK_CPU, BK_CUDA};
            o->nbackend = parse_names(a, need(argc, argv, &i), nm, val, o->backend, 2);
            backend_set = 1;
        } else if (!strcmp(a, "--path")) {
            static const char *const nm[] = {"auto", "fp32", "tf32", "fused", "mma", NULL};
            static const int val[] = {PATH_AUTO, PATH_FP32, PATH_TF32, PATH_FUSED, PATH_MMA};
            o->npath = parse_names(a, need(argc, argv, &i), nm, val, o->path, 5);
        } else if (!strcmp(a, "--mode")) {
            static const char *const nm[] = {"device", "host", NULL};
            static const int val[] = {MODE_DEVICE, MODE_HOST};
            o->nmode = parse_names(a, need(argc, argv, &i), nm, val, o->mode, 2);
        } else if (!strcmp(a, "--host")) {
            o->mode[0] = MODE_HOST;
            o->nmode = 1;
        } else if (!strcmp(a, "--cpu-path")) {
            const char *v = need(argc, argv, &i);
            if (!strcmp(v, "auto")) o->cpu_path = XKNN_CPU_PATH_AUTO;
            else if (!strcmp(v, "blas")) o->cpu_path = XKNN_CPU_PATH_BLAS;
            else if (!strcmp(v, "loop")) o->cpu_path = XKNN_CPU_PATH_LOOP;
            else bench_die(PROG, "--cpu-path: unknown path '%s' (auto, blas, loop)", v);
        } else if (!strcmp(a, "--data")) {
            const char *v = need(argc, argv, &i);
            o->data = bench_data_from_name(v);
            if (o->data == BENCH_DATA_COUNT) bench_die(PROG, "--data: unknown kind '%s' (uniform, clusters)", v);
        } else if (!strcmp(a, "--clusters")) {
            o->clusters = parse_one(a, need(argc, argv, &i));
            if (o->clusters < 1) bench_die(PROG, "--clusters must be >= 1");
        } else if (!strcmp(a, "--sigma")) {
            const char *v = need(argc, argv, &i);
            char *end;
            o->sigma = strtod(v, &end);
            if (*end || !(o->sigma >= 0)) bench_die(PROG, "--sigma: cannot parse '%s'", v);
        } else if (!strcmp(a, "--seed")) {
            o->seed = (uint64_t)parse_one(a, need(argc, argv, &i));
        } else if (!strcmp(a, "--repeats")) {
            o->repeats = (int)parse_one(a, need(argc, argv, &i));
            if (o->repeats < 1 || o->repeats > 100000) bench_die(PROG, "--repeats must be in 1..100000");
        } else if (!strcmp(a, "--warmup")) {
            o->warmup = (int)parse_one(a, need(argc, argv, &i));
            if (o->warmup < 1 || o->warmup > 1000) bench_die(PROG, "--warmup must be in 1..1000");
        } else if (!strcmp(a, "--sample")) {
            o->sample = parse_one(a, need(argc, argv, &i));
            if (o->sample < 1) bench_die(PROG, "--sample must be >= 1 (every row is checked)");
        } else if (!strcmp(a, "--query-block")) {
            o->query_block = parse_one(a, need(argc, argv, &i));
        } else if (!strcmp(a, "--ref-block")) {
            o->ref_block = parse_one(a, need(argc, argv, &i));
        } else if (!strcmp(a, "--budget")) {
            o->budget = parse_one(a, need(argc, argv, &i));
        } else if (!strcmp(a, "--threads")) {
            o->threads = (int)parse_one(a, need(argc, argv, &i));
        } else if (!strcmp(a, "--device")) {
            o->device = (int)parse_one(a, need(argc, argv, &i));
        } else if (!strcmp(a, "--rotate")) {
            o->rotate = (int)parse_one(a, need(argc, argv, &i));
            if (o->rotate < 1) o->rotate = 1;
        } else if (!strcmp(a, "--ceiling-size")) {
            o->ceiling_size = parse_one(a, need(argc, argv, &i));
            if (o->ceiling_size < 16) bench_die(PROG, "--ceiling-size must be >= 16");
        } else if (!strcmp(a, "--no-ceiling")) {
            o->no_ceiling = 1;
        } else if (!strcmp(a, "--json")) {
            o->json = need(argc, argv, &i);
        } else if (!strcmp(a, "--write-data")) {
            o->write_data = need(argc, argv, &i);
        } else if (!strcmp(a, "--read-data")) {
            o->read_data = need(argc, argv, &i);
        } else if (!strcmp(a, "--verbose")) {
            o->verbose = 1;
        } else {
            usage(stderr);
            bench_die(PROG, "unknown option '%s'", a);
        }
    }
    if (!backend_set) {
        o->nbackend = 1;
        o->backend[0] = xknn_backend_built(XKNN_BACKEND_CUDA) && xknn_cuda_device_count() > 0 ? BK_CUDA : BK_CPU;
    }
    if (o->read_data && d_set) bench_die(PROG, "--d cannot be combined with --read-data (d comes from the files)");
    if (o->read_data && o->write_data) bench_die(PROG, "--read-data and --write-data exclude each other");
    /* with --read-data, n and nq default to the files' sizes (marked 0 here) */
    if (o->read_data && !n_set) o->n[0] = 0;
    if (o->read_data && !nq_set) o->nq[0] = 0;
#ifndef XKNN_BENCH_CUDA
    for (i = 0; i < o->nbackend; i++)
        if (o->backend[i] == BK_CUDA)
            bench_die(PROG, "--backend cuda: this bench_knn was built without CUDA (reconfigure with -Dcuda=enabled)");
#endif
}

static int uses_backend(const opts *o, int b)
{
    int i;
    for (i = 0; i < o->nbackend; i++)
        if (o->backend[i] == b) return 1;
    return 0;
}

#ifdef XKNN_BENCH_CUDA
static int uses_mode(const opts *o, int m)
{
    int i;
    for (i = 0; i < o->nmode; i++)
        if (o->mode[i] == m) return 1;
    return 0;
}
#endif

/* The CUDA backend's choice for these sizes (xknn/cuda.h). */
static int effective_path(int path, int64_t n, int64_t nq, int64_t d, int64_t k)
{
    xknn_params p = XKNN_PARAMS_INIT;
    p.cuda_path = path;
    return xknn_cuda_path_for(&p, n, nq, d, k);
}

static const char *path_name(int path)
{
    return path == PATH_FP32    ? "fp32"
           : path == PATH_TF32  ? "tf32"
           : path == PATH_FUSED ? "fused"
           : path == PATH_MMA   ? "mma"
                                : "auto";
}

static const char *cpu_path_name(xknn_cpu_path p)
{
    return p == XKNN_CPU_PATH_BLAS ? "blas" : p == XKNN_CPU_PATH_LOOP ? "loop" : "auto";
}

/* ---- checking ------------------------------------------------------------------------ */
typedef struct check {
    int64_t S, kmax;
    int64_t *sidx;      /* S sampled query indices */
    int64_t *ex_ids;    /* S x kmax exact          */
    float *ex_dist;
    int64_t *got_ids;   /* S x kmax scratch        */
    float *got_dist;
} check;

/* Wrong sampled queries of a full nq x k result. */
static int64_t count_wrong_full(const check *c, int64_t k, const int64_t *ids, const float *dist)
{
    int64_t s;
    for (s = 0; s < c->S; s++) {
        memcpy(c->got_ids + s * k, ids + c->sidx[s] * k, (size_t)k * sizeof(int64_t));
        memcpy(c->got_dist + s * k, dist + c->sidx[s] * k, (size_t)k * sizeof(float));
    }
    return bench_count_wrong(c->S, k, c->got_ids, c->got_dist, k, c->ex_ids, c->ex_dist, c->kmax);
}

static void poison(int64_t *ids, float *dist, size_t count)
{
    memset(ids, 0xFF, count * sizeof(int64_t));
    memset(dist, 0xFF, count * sizeof(float));
}

/* The two host copies of a row's result: a, the warm-up's; b, the last repeat's. */
typedef struct results {
    int64_t *ids_a, *ids_b;
    float *dist_a, *dist_b;
} results;

/* One block of ids and one of distances, each holding both copies. */
static void results_alloc(results *res, size_t count)
{
    res->ids_a = (int64_t *)bench_xmalloc(2 * count * sizeof(int64_t), "ids");
    res->ids_b = res->ids_a + count;
    res->dist_a = (float *)bench_xmalloc(2 * count * sizeof(float), "dist");
    res->dist_b = res->dist_a + count;
}

static void results_free(results *res)
{
    free(res->ids_a);
    free(res->dist_a);
}

/* Fills the derived columns and the status of a finished row. */
static void finish_row(row *r)
{
    const double flops = 2.0 * (double)r->n * (double)r->nq * (double)r->d;
    r->time_ms = bench_median(r->times, r->ntimes);
    r->min_ms = bench_min(r->times, r->ntimes);
    r->qps = (double)r->nq / (r->time_ms * 1e-3);
    r->tflops = flops / (r->time_ms * 1e-3) / 1e12;
    r->pct = isfinite(r->ceiling) && r->ceiling > 0 ? 100.0 * r->tflops / r->ceiling : NAN;
    r->gbps = r->backend == BK_CUDA && r->mode == MODE_HOST
                  ? (double)r->n * (double)r->d * 4.0 / (r->time_ms * 1e-3) / 1e9
                  : NAN;
    r->pct_link = isfinite(r->gbps) && isfinite(r->link) && r->link > 0 ? 100.0 * r->gbps / r->link : NAN;
    if (r->wrong > 0 || r->nondet > 0)
        snprintf(r->status, sizeof r->status, "FAIL");
    else
        snprintf(r->status, sizeof r->status, "ok");
}

/* Checks both copies of a completed row: wrong, the worse of the two against the sampled
 * exact answers; nondet, the rows that differ between them; then finish_row. */
static void check_row(row *r, const check *c, const results *res)
{
    int64_t w;
    r->wrong = count_wrong_full(c, r->k, res->ids_a, res->dist_a);
    w = count_wrong_full(c, r->k, res->ids_b, res->dist_b);
    if (w > r->wrong) r->wrong = w;
    r->nondet = bench_count_differ(r->nq, r->k, res->ids_a, res->dist_a, res->ids_b, res->dist_b);
    finish_row(r);
}

/* ---- CPU backend and CUDA --host rows: host arrays, host clock ---------------------------- */
static void run_host_row(row *r, const opts *o, const check *c, const float *ref, const float *qry,
                         const xknn_params *p)
{
    const size_t cnt = (size_t)(r->nq * r->k);
    results res;
    xknn_matrix R = XKNN_MATRIX_F32(ref, r->n, r->d), Q = XKNN_MATRIX_F32(qry, r->nq, r->d);
    xknn_error err;
    int i;
    results_alloc(&res, cnt);
    poison(res.ids_a, res.dist_a, cnt);
    for (i = 0; i < o->warmup; i++) {
        if (xknn_search(p, &R, &Q, r->k, res.ids_a, res.dist_a, &err) != XKNN_SUCCESS) goto fail;
    }
    for (i = 0; i < o->repeats; i++) {
        double t0;
        if (i == o->repeats - 1) poison(res.ids_b, res.dist_b, cnt);
        t0 = bench_now();
        if (xknn_search(p, &R, &Q, r->k, res.ids_b, res.dist_b, &err) != XKNN_SUCCESS) goto fail;
        r->times[r->ntimes++] = 1e3 * (bench_now() - t0);
    }
    check_row(r, c, &res);
    goto done;
fail:
    snprintf(r->status, sizeof r->status, "ERROR");
    snprintf(r->error, sizeof r->error, "xknn_search: %.400s (%s)", err.message, xknn_status_string(err.status));
done:
    results_free(&res);
}

/* ---- CUDA ---------------------------------------------------------------------------- */
#ifdef XKNN_BENCH_CUDA
typedef struct gpu {
    int device;
    char name[256];
    int sms, cc_major, cc_minor;
    size_t mem, l2;
    xknn_cuda_context *ctx;
    cudaStream_t stream;
    cudaEvent_t e0, e1;
    /* device-resident inputs of the current (n, nq, d): copies for rotation */
    float *ref[64], *qry[64];
    int copies;
} gpu;

#define CUDA_DIE(call) BENCH_CUDA_DIE(PROG, call)

static void gpu_init(gpu *g, int device, meta *m)
{
    struct cudaDeviceProp prop;
    int drv = 0, rt = 0;
    xknn_error err;
    memset(g, 0, sizeof *g);
    g->device = device;
    CUDA_DIE(cudaSetDevice(device));
    CUDA_DIE(cudaGetDeviceProperties(&prop, device));
    CUDA_DIE(cudaDriverGetVersion(&drv));
    CUDA_DIE(cudaRuntimeGetVersion(&rt));
    snprintf(g->name, sizeof g->name, "%s", prop.name);
    g->sms = prop.multiProcessorCount;
    g->mem = prop.totalGlobalMem;
    g->l2 = (size_t)prop.l2CacheSize;
    g->cc_major = prop.major;
    g->cc_minor = prop.minor;
    snprintf(m->device, sizeof m->device,
             "%s, %d SMs, %.1f GiB, L2 %.0f MiB, cc %d.%d, CUDA driver %d.%d runtime %d.%d (device %d)", g->name,
             g->sms, (double)g->mem / 1073741824.0, (double)g->l2 / 1048576.0, g->cc_major, g->cc_minor, drv / 1000,
             (drv % 1000) / 10, rt / 1000, (rt % 1000) / 10, device);
    if (xknn_cuda_context_create(device, &g->ctx, &err) != XKNN_SUCCESS)
        bench_die(PROG, "xknn_cuda_context_create: %s", err.message);
    CUDA_DIE(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    CUDA_DIE(cudaEventCreate(&g->e0));
    CUDA_DIE(cudaEventCreate(&g->e1));
}

static void gpu_free_inputs(gpu *g)
{
    int c;
    for (c = 0; c < g->copies; c++) {
        cudaFree(g->ref[c]);
        cudaFree(g->qry[c]);
        g->ref[c] = g->qry[c] = NULL;
    }
    g->copies = 0;
}

/* Uploads n x d references and nq x d queries; several copies when they fit in L2 (so
 * repeats, rotating over the copies, read them from device memory, not from L2). */
static void gpu_upload(gpu *g, const opts *o, const float *ref, const float *qry, int64_t n, int64_t nq, int64_t d)
{
    const size_t rb = (size_t)(n * d) * sizeof(float), qb = (size_t)(nq * d) * sizeof(float);
    size_t free_b = 0, total_b = 0;
    int want = 1, c;
    gpu_free_inputs(g);
    if (o->rotate > 1 && rb + qb < 2 * g->l2) {
        want = (int)(1 + (3 * g->l2 + rb + qb - 1) / (rb + qb));
        if (want > o->rotate) want = o->rotate;
        if (want > 64) want = 64;
        CUDA_DIE(cudaMemGetInfo(&free_b, &total_b));
        while (want > 1 && (size_t)want * (rb + qb) > free_b / 4) want--;
    }
    for (c = 0; c < want; c++) {
        CUDA_DIE(cudaMalloc((void **)&g->ref[c], rb));
        CUDA_DIE(cudaMalloc((void **)&g->qry[c], qb));
        CUDA_DIE(cudaMemcpy(g->ref[c], ref, rb, cudaMemcpyHostToDevice));
        CUDA_DIE(cudaMemcpy(g->qry[c], qry, qb, cudaMemcpyHostToDevice));
        g->copies = c + 1;
    }
    /* pageable copies on the legacy stream may still be in flight, and the benchmark's
     * stream is non-blocking: wait for them before any search reads the inputs */
    CUDA_DIE(cudaDeviceSynchronize());
}

#define ROW_CUDA(call)                                                                                   \
    do {                                                                                                 \
        cudaError_t e_ = (call);                                                                         \
        if (e_ != cudaSuccess) {                                                                         \
            snprintf(r->error, sizeof r->error, "%.100s: %.300s", #call, cudaGetErrorString(e_));                \
            goto fail;                                                                                   \
        }                                                                                                \
    } while (0)

#define ROW_XKNN(call)                                                                                   \
    do {                                                                                                 \
        if ((call) != XKNN_SUCCESS) {                                                                    \
            snprintf(r->error, sizeof r->error, "%.60s: %.400s (%s)", #call, err.message, xknn_status_string(err.status)); \
            goto fail;                                                                                   \
        }                                                                                                \
    } while (0)

/* Device-resident row: CUDA events around xknn_cuda_search on the benchmark's stream. */
static void run_device_row(row *r, const opts *o, const check *c, gpu *g, const xknn_params *p)
{
    const size_t cnt = (size_t)(r->nq * r->k);
    results res;
    int64_t *d_ids = NULL;
    float *d_dist = NULL;
    void *ws = NULL;
    size_t ws_bytes = 0;
    xknn_error err;
    int i;
    results_alloc(&res, cnt);
    r->copies = g->copies;
    ROW_CUDA(cudaMalloc((void **)&d_ids, cnt * sizeof(int64_t)));
    ROW_CUDA(cudaMalloc((void **)&d_dist, cnt * sizeof(float)));
    ROW_XKNN(xknn_cuda_workspace_size(g->ctx, p, r->n, r->nq, r->d, r->k, &ws_bytes, &err));
    ROW_CUDA(cudaMalloc(&ws, ws_bytes ? ws_bytes : 256));
    r->workspace = ws_bytes;
    ROW_CUDA(cudaMemsetAsync(d_ids, 0xFF, cnt * sizeof(int64_t), g->stream));
    ROW_CUDA(cudaMemsetAsync(d_dist, 0xFF, cnt * sizeof(float), g->stream));
    for (i = 0; i < o->warmup; i++) {
        xknn_matrix R = XKNN_MATRIX_F32(g->ref[0], r->n, r->d), Q = XKNN_MATRIX_F32(g->qry[0], r->nq, r->d);
        ROW_XKNN(xknn_cuda_search(g->ctx, p, &R, &Q, r->k, d_ids, d_dist, ws, ws_bytes, &err, g->stream));
    }
    ROW_CUDA(cudaStreamSynchronize(g->stream));
    ROW_CUDA(cudaGetLastError());
    ROW_CUDA(cudaMemcpy(res.ids_a, d_ids, cnt * sizeof(int64_t), cudaMemcpyDeviceToHost));
    ROW_CUDA(cudaMemcpy(res.dist_a, d_dist, cnt * sizeof(float), cudaMemcpyDeviceToHost));
    for (i = 0; i < o->repeats; i++) {
        const int cp = (i + 1) % g->copies; /* copy 0 was the warm-up's */
        xknn_matrix R = XKNN_MATRIX_F32(g->ref[cp], r->n, r->d), Q = XKNN_MATRIX_F32(g->qry[cp], r->nq, r->d);
        float ms = 0.0f;
        if (i == o->repeats - 1) {
            ROW_CUDA(cudaMemsetAsync(d_ids, 0xFF, cnt * sizeof(int64_t), g->stream));
            ROW_CUDA(cudaMemsetAsync(d_dist, 0xFF, cnt * sizeof(float), g->stream));
        }
        ROW_CUDA(cudaEventRecord(g->e0, g->stream));
        ROW_XKNN(xknn_cuda_search(g->ctx, p, &R, &Q, r->k, d_ids, d_dist, ws, ws_bytes, &err, g->stream));
        ROW_CUDA(cudaEventRecord(g->e1, g->stream));
        ROW_CUDA(cudaEventSynchronize(g->e1));
        ROW_CUDA(cudaEventElapsedTime(&ms, g->e0, g->e1));
        r->times[r->ntimes++] = (double)ms;
    }
    ROW_CUDA(cudaGetLastError());
    ROW_CUDA(cudaMemcpy(res.ids_b, d_ids, cnt * sizeof(int64_t), cudaMemcpyDeviceToHost));
    ROW_CUDA(cudaMemcpy(res.dist_b, d_dist, cnt * sizeof(float), cudaMemcpyDeviceToHost));
    check_row(r, c, &res);
    goto done;
fail:
    snprintf(r->status, sizeof r->status, "ERROR");
    (void)cudaStreamSynchronize(g->stream);
    (void)cudaGetLastError();
done:
    cudaFree(ws);
    cudaFree(d_dist);
    cudaFree(d_ids);
    results_free(&res);
}

/* cuBLAS SGEMM and TF32 GEMM ceilings at N x N x N (random operands, events, median). */
static void gpu_ceilings(gpu *g, int64_t N, meta *m)
{
    const size_t bytes = (size_t)(N * N) * sizeof(float);
    float *hA = (float *)bench_xmalloc(2 * bytes, "ceiling operands");
    float *dA = NULL, *dB = NULL, *dC = NULL;
    cublasHandle_t h;
    bench_gen gen;
    const float alpha = 1.0f, beta = 0.0f;
    int t, i;
    if (bench_gen_init(&gen, BENCH_DATA_UNIFORM, 0xC0FFEE, N, 1, 0.0) != 0) bench_die(PROG, "out of memory");
    bench_gen_rows(&gen, BENCH_STREAM_REF, 0, 2 * N, hA);
    bench_gen_free(&gen);
    CUDA_DIE(cudaMalloc((void **)&dA, bytes));
    CUDA_DIE(cudaMalloc((void **)&dB, bytes));
    CUDA_DIE(cudaMalloc((void **)&dC, bytes));
    CUDA_DIE(cudaMemcpy(dA, hA, bytes, cudaMemcpyHostToDevice));
    CUDA_DIE(cudaMemcpy(dB, hA + N * N, bytes, cudaMemcpyHostToDevice));
    CUDA_DIE(cudaDeviceSynchronize());
    free(hA);
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) bench_die(PROG, "cublasCreate failed");
    if (cublasSetStream(h, g->stream) != CUBLAS_STATUS_SUCCESS) bench_die(PROG, "cublasSetStream failed");
    for (t = 0; t < 2; t++) {
        const cublasComputeType_t ct = t ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        double ms[7];
        for (i = -2; i < 7; i++) { /* two warm-ups */
            float e = 0.0f;
            CUDA_DIE(cudaEventRecord(g->e0, g->stream));
            if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)N, (int)N, (int)N, &alpha, dA, CUDA_R_32F, (int)N, dB,
                             CUDA_R_32F, (int)N, &beta, dC, CUDA_R_32F, (int)N, ct,
                             CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
                bench_die(PROG, "cublasGemmEx (%s) failed", t ? "tf32" : "fp32");
            CUDA_DIE(cudaEventRecord(g->e1, g->stream));
            CUDA_DIE(cudaEventSynchronize(g->e1));
            CUDA_DIE(cudaEventElapsedTime(&e, g->e0, g->e1));
            if (i >= 0) ms[i] = (double)e;
        }
        {
            const double tf = 2.0 * (double)N * (double)N * (double)N / (bench_median(ms, 7) * 1e-3) / 1e12;
            if (t)
                m->tf32_gpu = tf;
            else
                m->sgemm_gpu = tf;
        }
    }
    cublasDestroy(h);
    cudaFree(dC);
    cudaFree(dB);
    cudaFree(dA);
    m->ceil_gpu_n = N;
}

/* The host link's ceiling: cudaMemcpy host to device of 1 GiB, from pinned memory (the
 * streamed path copies through pinned buffers) and from pageable memory, events, median
 * of 5 after a warm-up. NaN where the memory cannot be had. */
static void gpu_link(gpu *g, meta *m)
{
    const size_t bytes = (size_t)1 << 30;
    char *pinned = NULL, *pageable = NULL, *dev = NULL;
    int t, i;
    m->h2d_pinned = m->h2d_pageable = NAN;
    if (cudaMalloc((void **)&dev, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    if (cudaHostAlloc((void **)&pinned, bytes, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        pinned = NULL;
    }
    pageable = (char *)malloc(bytes);
    if (pinned) memset(pinned, 1, bytes);
    if (pageable) memset(pageable, 1, bytes);
    for (t = 0; t < 2; t++) {
        const char *src = t ? pageable : pinned;
        double ms[5];
        if (!src) continue;
        for (i = -1; i < 5; i++) {
            float e = 0.0f;
            CUDA_DIE(cudaEventRecord(g->e0, g->stream));
            CUDA_DIE(cudaMemcpyAsync(dev, src, bytes, cudaMemcpyHostToDevice, g->stream));
            CUDA_DIE(cudaEventRecord(g->e1, g->stream));
            CUDA_DIE(cudaEventSynchronize(g->e1));
            CUDA_DIE(cudaEventElapsedTime(&e, g->e0, g->e1));
            if (i >= 0) ms[i] = (double)e;
        }
        if (t)
            m->h2d_pageable = (double)bytes / (bench_median(ms, 5) * 1e-3) / 1e9;
        else
            m->h2d_pinned = (double)bytes / (bench_median(ms, 5) * 1e-3) / 1e9;
    }
    free(pageable);
    if (pinned) cudaFreeHost(pinned);
    cudaFree(dev);
}
#endif /* XKNN_BENCH_CUDA */

#ifdef XKNN_BENCH_CBLAS
/* cblas_sgemm ceiling at N x N x N (BLAS's own threads, host clock, median of 3). */
static void cpu_ceiling(int64_t N, meta *m)
{
    const size_t cnt = (size_t)(N * N);
    float *a = (float *)bench_xmalloc(3 * cnt * sizeof(float), "ceiling operands");
    bench_gen gen;
    double s[3];
    int i;
    if (bench_gen_init(&gen, BENCH_DATA_UNIFORM, 0xC0FFEE, N, 1, 0.0) != 0) bench_die(PROG, "out of memory");
    bench_gen_rows(&gen, BENCH_STREAM_REF, 0, 2 * N, a);
    bench_gen_free(&gen);
    for (i = -1; i < 3; i++) {
        const double t0 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)N, (int)N, 1.0f, a, (int)N, a + cnt,
                    (int)N, 0.0f, a + 2 * cnt, (int)N);
        if (i >= 0) s[i] = bench_now() - t0;
    }
    m->sgemm_cpu = 2.0 * (double)N * (double)N * (double)N / bench_median(s, 3) / 1e12;
    m->ceil_cpu_n = N;
    free(a);
}
#endif

/* ---- output -------------------------------------------------------------------------- */
static void print_columns(void)
{
    printf("#%9s %7s %5s %6s %-7s %-9s %-6s %10s %10s %13s %10s %11s %8s %6s  %s\n", "n", "nq", "d", "k", "backend",
           "path", "mode", "time_ms", "min_ms", "queries_per_s", "eff_TFLOPs", "pct_ceiling", "GB_per_s", "#wrong",
           "status");
}

static void fmt_num(char *buf, size_t size, double v, const char *fmt)
{
    if (isfinite(v))
        snprintf(buf, size, fmt, v);
    else
        snprintf(buf, size, "-");
}

static void print_row(const row *r)
{
    char t[32], mn[32], q[32], tf[32], pc[32], gb[32], wr[32];
    const int ok = !strcmp(r->status, "ok");
    const int timed = r->ntimes > 0 && strcmp(r->status, "ERROR") != 0;
    fmt_num(t, sizeof t, timed ? r->time_ms : NAN, "%.3f");
    fmt_num(mn, sizeof mn, timed ? r->min_ms : NAN, "%.3f");
    fmt_num(q, sizeof q, ok ? r->qps : NAN, "%.1f");
    fmt_num(tf, sizeof tf, ok ? r->tflops : NAN, "%.3f");
    fmt_num(pc, sizeof pc, ok ? r->pct : NAN, "%.1f");
    fmt_num(gb, sizeof gb, ok ? r->gbps : NAN, "%.2f");
    if (timed)
        snprintf(wr, sizeof wr, "%lld", (long long)r->wrong);
    else
        snprintf(wr, sizeof wr, "-");
    printf(" %9lld %7lld %5lld %6lld %-7s %-9s %-6s %10s %10s %13s %10s %11s %8s %6s  %s\n", (long long)r->n,
           (long long)r->nq, (long long)r->d, (long long)r->k, r->backend == BK_CUDA ? "cuda" : "cpu", r->path_name,
           r->backend == BK_CPU ? "host" : r->mode == MODE_HOST ? "host" : "device", t, mn, q, tf, pc, gb, wr,
           r->status);
    if (r->nondet > 0)
        printf("# row above: %lld of %lld queries differ between the warm-up and the last repeat\n",
               (long long)r->nondet, (long long)r->nq);
    if (r->error[0]) printf("# row above: %s\n", r->error);
    fflush(stdout);
}

static void write_json(const char *path, const opts *o, const meta *m, const row *rows, int nrows, int pass)
{
    FILE *f = bench_json_open(PROG, path);
    int i, j;
    if (!f) return;
    bench_json_begin(f, "bench_knn", XKNN_VERSION_STRING, m->date);
    bench_json_key_str(f, "device", m->device);
    bench_json_key_str(f, "cpu", m->cpu);
    fprintf(f, ", \"threads\": %d, \"data\": ", m->threads);
    bench_json_str(f, bench_data_name(o->data));
    bench_json_key_str(f, "data_source", m->data_source);
    fprintf(f, ", \"seed\": %llu, \"clusters\": %lld, \"sigma\": %g, \"metric\": \"l2\", \"dtype\": \"float32\"",
            (unsigned long long)o->seed, (long long)o->clusters, o->sigma);
    fprintf(f, ", \"repeats\": %d, \"warmup\": %d, \"sample\": %lld", o->repeats, o->warmup, (long long)o->sample);
    bench_json_key_num(f, "ceiling_sgemm_gpu_TFLOPs", m->sgemm_gpu);
    bench_json_key_num(f, "ceiling_tf32_gpu_TFLOPs", m->tf32_gpu);
    fprintf(f, ", \"ceiling_gpu_size\": %lld, \"ceiling_sgemm_cpu_TFLOPs\": ", (long long)m->ceil_gpu_n);
    bench_json_num(f, m->sgemm_cpu);
    fprintf(f, ", \"ceiling_cpu_size\": %lld, \"ceiling_h2d_pinned_GBps\": ", (long long)m->ceil_cpu_n);
    bench_json_num(f, m->h2d_pinned);
    bench_json_key_num(f, "ceiling_h2d_pageable_GBps", m->h2d_pageable);
    fprintf(f, "},\n \"rows\": [");
    for (i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        fprintf(f, "%s\n  {\"n\": %lld, \"nq\": %lld, \"d\": %lld, \"k\": %lld, \"backend\": \"%s\", \"path\": ",
                i ? "," : "", (long long)r->n, (long long)r->nq, (long long)r->d, (long long)r->k,
                r->backend == BK_CUDA ? "cuda" : "cpu");
        bench_json_str(f, r->path_name);
        fprintf(f, ", \"mode\": \"%s\", \"query_block\": %lld, \"ref_block\": %lld, \"budget_bytes\": %lld",
                r->backend == BK_CPU || r->mode == MODE_HOST ? "host" : "device", (long long)o->query_block,
                (long long)o->ref_block, (long long)o->budget);
        fprintf(f, ", \"times_ms\": [");
        for (j = 0; j < r->ntimes; j++) {
            if (j) fputs(", ", f);
            bench_json_num(f, r->times[j]);
        }
        fprintf(f, "], \"time_ms\": ");
        bench_json_num(f, r->ntimes ? r->time_ms : NAN);
        bench_json_key_num(f, "min_ms", r->ntimes ? r->min_ms : NAN);
        bench_json_key_num(f, "queries_per_s", r->ntimes ? r->qps : NAN);
        bench_json_key_num(f, "eff_TFLOPs", r->ntimes ? r->tflops : NAN);
        bench_json_key_num(f, "ceiling_TFLOPs", r->ceiling);
        bench_json_key_num(f, "pct_ceiling", r->ntimes ? r->pct : NAN);
        bench_json_key_num(f, "GB_per_s", r->ntimes ? r->gbps : NAN);
        bench_json_key_num(f, "pct_link", r->ntimes ? r->pct_link : NAN);
        fprintf(f, ", \"wrong\": %lld, \"sampled\": %lld, \"nondet\": %lld, \"workspace_bytes\": %zu, \"copies\": %d",
                (long long)r->wrong, (long long)r->sampled, (long long)r->nondet, r->workspace, r->copies);
        bench_json_row_end(f, r->status, r->error);
    }
    bench_json_close(f, PROG, path, pass);
}

/* ---- data ---------------------------------------------------------------------------- */
static float *read_fbin(const char *path, int64_t *rows, int64_t *cols)
{
    xknn_file_info info;
    xknn_read_opts ro = XKNN_READ_OPTS_INIT;
    xknn_error err;
    float *x;
    if (xknn_file_probe(path, &ro, &info, &err) != XKNN_SUCCESS) bench_die(PROG, "%s", err.message);
    x = (float *)bench_xmalloc((size_t)(info.rows * info.cols) * sizeof(float), path);
    if (xknn_file_read_rows(path, &info, 0, info.rows, x, &err) != XKNN_SUCCESS) bench_die(PROG, "%s", err.message);
    *rows = info.rows;
    *cols = info.cols;
    return x;
}

/* ---- main ---------------------------------------------------------------------------- */
int main(int argc, char **argv)
{
    opts o;
    meta m;
    row *rows = NULL;
    int nrows = 0, cap = 0, failed = 0, di, ni, qi, ki, bi, pi, mi, i;
    int64_t maxk;
#ifdef XKNN_BENCH_CUDA
    gpu g;
    int gpu_on = 0;
#endif

    parse_opts(argc, argv, &o);
    memset(&m, 0, sizeof m);
    m.sgemm_gpu = m.tf32_gpu = m.sgemm_cpu = m.h2d_pinned = m.h2d_pageable = NAN;
    bench_utc_date(m.date, sizeof m.date);
    bench_cpu_model(m.cpu, sizeof m.cpu);
    m.threads = bench_max_threads();
    snprintf(m.device, sizeof m.device, "none");
    maxk = bench_list_max(o.k, o.nk);

    printf("# xknn bench_knn %s, commit %s\n", XKNN_VERSION_STRING, bench_commit());
    printf("# date %s\n", m.date);
    printf("# cpu: %s, %d OpenMP threads%s\n", m.cpu, m.threads, bench_openmp() ? "" : " (built without OpenMP)");
#ifdef XKNN_BENCH_CUDA
    if (uses_backend(&o, BK_CUDA)) {
        gpu_init(&g, o.device, &m);
        gpu_on = 1;
        printf("# device: %s\n", m.device);
        if (!o.no_ceiling) gpu_ceilings(&g, o.ceiling_size ? o.ceiling_size : 8192, &m);
        if (!o.no_ceiling && uses_mode(&o, MODE_HOST)) gpu_link(&g, &m);
    }
#endif
#ifdef XKNN_BENCH_CBLAS
    if (uses_backend(&o, BK_CPU) && !o.no_ceiling) cpu_ceiling(o.ceiling_size ? o.ceiling_size : 2048, &m);
#endif
    if (isfinite(m.sgemm_gpu))
        printf("# ceiling (cuBLAS GEMM %lld^3, median of 7): fp32 %.2f TFLOP/s, tf32 %.2f TFLOP/s\n",
               (long long)m.ceil_gpu_n, m.sgemm_gpu, m.tf32_gpu);
    if (isfinite(m.h2d_pinned) || isfinite(m.h2d_pageable))
        printf("# host link (cudaMemcpy host to device, 1 GiB, median of 5): pinned %.1f GB/s, pageable %.1f GB/s "
               "(pct_link in the JSON rows: GB_per_s of a host row over the pinned rate)\n",
               m.h2d_pinned, m.h2d_pageable);
    if (isfinite(m.sgemm_cpu))
        printf("# ceiling (cblas_sgemm %lld^3, median of 3): %.3f TFLOP/s\n", (long long)m.ceil_cpu_n, m.sgemm_cpu);
    {
        char buf[4][512];
        const int64_t *lists[4] = {o.n, o.nq, o.d, o.k};
        const int counts[4] = {o.nn, o.nnq, o.nd, o.nk};
        int li, j;
        for (li = 0; li < 4; li++) {
            size_t len = 0;
            buf[li][0] = '\0';
            for (j = 0; j < counts[li] && len + 24 < sizeof buf[li]; j++)
                len += (size_t)snprintf(buf[li] + len, sizeof buf[li] - len, "%s%lld", j ? "," : "",
                                        (long long)lists[li][j]);
        }
        printf("# sizes: n=%s nq=%s d=%s k=%s%s\n", o.read_data && o.n[0] == 0 ? "file" : buf[0],
               o.read_data && o.nq[0] == 0 ? "file" : buf[1], o.read_data ? "file" : buf[2], buf[3],
               o.read_data ? " (file sizes unless given)" : "");
    }
    printf("# metric l2, float32; data %s seed %llu", bench_data_name(o.data), (unsigned long long)o.seed);
    if (o.data == BENCH_DATA_CLUSTERS) printf(" (%lld clusters, sigma %g)", (long long)o.clusters, o.sigma);
    printf("%s%s\n", o.read_data ? ", read from " : "", o.read_data ? o.read_data : "");
    printf("# timing: warm-up %d, median of %d repeats; device rows: CUDA events around xknn_cuda_search "
           "(inputs resident, workspace preallocated, inputs rotated when they fit in L2); host/cpu rows: host "
           "clock around xknn_search (copies included)\n",
           o.warmup, o.repeats);
    printf("# check: %lld sampled queries per row against the exact double-precision oracle (ids and distance "
           "bits); params query_block=%lld ref_block=%lld budget=%lld threads=%d\n",
           (long long)o.sample, (long long)o.query_block, (long long)o.ref_block, (long long)o.budget, o.threads);

    for (di = 0; di < o.nd; di++) {
        int64_t d = o.d[di], nmax, nqmax, frows = 0, fcols = 0;
        float *ref, *qry;
        double t0 = bench_now();
        if (o.read_data) {
            char path[4096];
            snprintf(path, sizeof path, "%s.ref.fbin", o.read_data);
            ref = read_fbin(path, &frows, &fcols);
            d = fcols;
            nmax = frows;
            snprintf(path, sizeof path, "%s.query.fbin", o.read_data);
            qry = read_fbin(path, &nqmax, &fcols);
            if (fcols != d)
                bench_die(PROG, "dimension mismatch: %s.ref.fbin has d=%lld, %s.query.fbin has d=%lld", o.read_data,
                          (long long)d, o.read_data, (long long)fcols);
            if (o.n[0] == 0) o.n[0] = nmax;
            if (o.nq[0] == 0) o.nq[0] = nqmax;
            if (bench_list_max(o.n, o.nn) > nmax || bench_list_max(o.nq, o.nnq) > nqmax)
                bench_die(PROG, "--n/--nq larger than the files (%lld references, %lld queries)", (long long)nmax,
                          (long long)nqmax);
            o.d[di] = d;
            snprintf(m.data_source, sizeof m.data_source, "read %s.{ref,query}.fbin", o.read_data);
            printf("# data d=%lld: read %lld references and %lld queries in %.2f s\n", (long long)d, (long long)nmax,
                   (long long)nqmax, bench_now() - t0);
        } else {
            bench_gen gen;
            nmax = bench_list_max(o.n, o.nn);
            nqmax = bench_list_max(o.nq, o.nnq);
            if (bench_gen_init(&gen, o.data, o.seed, d, o.clusters, o.sigma) != 0) bench_die(PROG, "out of memory");
            ref = (float *)bench_xmalloc((size_t)(nmax * d) * sizeof(float), "references");
            qry = (float *)bench_xmalloc((size_t)(nqmax * d) * sizeof(float), "queries");
            bench_gen_rows(&gen, BENCH_STREAM_REF, 0, nmax, ref);
            bench_gen_rows(&gen, BENCH_STREAM_QUERY, 0, nqmax, qry);
            bench_gen_free(&gen);
            snprintf(m.data_source, sizeof m.data_source, "generated");
            printf("# data d=%lld: generated %lld references and %lld queries in %.2f s\n", (long long)d,
                   (long long)nmax, (long long)nqmax, bench_now() - t0);
            if (o.write_data) {
                char path[4096];
                char dsuf[32] = "";
                if (o.nd > 1) snprintf(dsuf, sizeof dsuf, "-d%lld", (long long)d);
                t0 = bench_now();
                snprintf(path, sizeof path, "%s%s.ref.fbin", o.write_data, dsuf);
                if (bench_write_fbin(path, ref, nmax, d) != 0) bench_die(PROG, "cannot write %s", path);
                snprintf(path, sizeof path, "%s%s.query.fbin", o.write_data, dsuf);
                if (bench_write_fbin(path, qry, nqmax, d) != 0) bench_die(PROG, "cannot write %s", path);
                printf("# wrote %s%s.ref.fbin (%lld x %lld) and %s%s.query.fbin (%lld x %lld) in %.2f s\n",
                       o.write_data, dsuf, (long long)nmax, (long long)d, o.write_data, dsuf, (long long)nqmax,
                       (long long)d, bench_now() - t0);
            }
        }
        fflush(stdout);

        for (ni = 0; ni < o.nn; ni++) {
            for (qi = 0; qi < o.nnq; qi++) {
                const int64_t n = o.n[ni], nq = o.nq[qi];
                check c;
                bench_oracle *orc;
                float *sq;
                int64_t s;
                memset(&c, 0, sizeof c);
                c.S = o.sample < nq ? o.sample : nq;
                c.kmax = maxk < n ? maxk : n;
                c.sidx = (int64_t *)bench_xmalloc((size_t)c.S * sizeof(int64_t), "sample");
                sq = (float *)bench_xmalloc((size_t)(c.S * d) * sizeof(float), "sample");
                c.ex_ids = (int64_t *)bench_xmalloc((size_t)(c.S * c.kmax) * sizeof(int64_t), "oracle");
                c.ex_dist = (float *)bench_xmalloc((size_t)(c.S * c.kmax) * sizeof(float), "oracle");
                c.got_ids = (int64_t *)bench_xmalloc((size_t)(c.S * c.kmax) * sizeof(int64_t), "oracle");
                c.got_dist = (float *)bench_xmalloc((size_t)(c.S * c.kmax) * sizeof(float), "oracle");
                for (s = 0; s < c.S; s++) {
                    c.sidx[s] = bench_sample_index(s, c.S, nq);
                    memcpy(sq + s * d, qry + c.sidx[s] * d, (size_t)d * sizeof(float));
                }
                t0 = bench_now();
                orc = bench_oracle_create(sq, c.S, d, c.kmax);
                if (!orc) bench_die(PROG, "out of memory for the oracle");
                bench_oracle_add(orc, ref, d, 0, n);
                bench_oracle_finish(orc, c.ex_ids, c.ex_dist);
                bench_oracle_free(orc);
                printf("# oracle: %lld sampled queries x %lld references (k=%lld) in %.2f s\n", (long long)c.S,
                       (long long)n, (long long)c.kmax, bench_now() - t0);
#ifdef XKNN_BENCH_CUDA
                if (gpu_on && uses_mode(&o, MODE_DEVICE)) gpu_upload(&g, &o, ref, qry, n, nq, d);
#endif
                print_columns();
                fflush(stdout);
                for (ki = 0; ki < o.nk; ki++) {
                    const int64_t k = o.k[ki];
                    if (k > n) {
                        printf("# skipped k=%lld > n=%lld\n", (long long)k, (long long)n);
                        continue;
                    }
                    for (bi = 0; bi < o.nbackend; bi++) {
                        const int b = o.backend[bi];
                        const int np = b == BK_CUDA ? o.npath : 1, nm = b == BK_CUDA ? o.nmode : 1;
                        for (pi = 0; pi < np; pi++) {
                            for (mi = 0; mi < nm; mi++) {
                                row *r;
                                xknn_params p = XKNN_PARAMS_INIT;
                                if (nrows == cap) {
                                    cap = cap ? 2 * cap : 16;
                                    rows = (row *)realloc(rows, (size_t)cap * sizeof(row));
                                    if (!rows) bench_die(PROG, "out of memory");
                                }
                                r = &rows[nrows++];
                                memset(r, 0, sizeof *r);
                                r->n = n;
                                r->nq = nq;
                                r->d = d;
                                r->k = k;
                                r->backend = b;
                                r->path = o.path[pi];
                                r->mode = b == BK_CUDA ? o.mode[mi] : MODE_HOST;
                                r->sampled = c.S;
                                r->ceiling = NAN;
                                r->link = NAN;
                                r->copies = 1;
                                r->times = (double *)bench_xmalloc((size_t)o.repeats * sizeof(double), "times");
                                p.query_block = o.query_block;
                                p.ref_block = o.ref_block;
                                p.device_memory_budget = (size_t)o.budget;
                                p.num_threads = o.threads;
                                p.verbose = o.verbose;
                                if (b == BK_CPU) {
                                    p.backend = XKNN_BACKEND_CPU;
                                    p.cpu_path = o.cpu_path;
                                    snprintf(r->path_name, sizeof r->path_name, "%s", cpu_path_name(o.cpu_path));
                                    r->ceiling = m.sgemm_cpu;
                                    run_host_row(r, &o, &c, ref, qry, &p);
                                } else {
#ifdef XKNN_BENCH_CUDA
                                    const int eff = effective_path(r->path, n, nq, d, k);
                                    p.backend = XKNN_BACKEND_CUDA;
                                    p.cuda_path = r->path;
                                    p.device = g.device;
                                    p.cuda_context = g.ctx;
                                    if (r->path == PATH_AUTO)
                                        snprintf(r->path_name, sizeof r->path_name, "auto:%s", path_name(eff));
                                    else
                                        snprintf(r->path_name, sizeof r->path_name, "%s", path_name(eff));
                                    r->ceiling = eff == PATH_TF32 || eff == PATH_MMA ? m.tf32_gpu : m.sgemm_gpu;
                                    r->link = m.h2d_pinned;
                                    if (r->mode == MODE_HOST)
                                        run_host_row(r, &o, &c, ref, qry, &p);
                                    else
                                        run_device_row(r, &o, &c, &g, &p);
#else
                                    (void)effective_path;
                                    (void)path_name;
#endif
                                }
                                if (strcmp(r->status, "ok") != 0) failed++;
                                print_row(r);
                            }
                        }
                    }
                }
#ifdef XKNN_BENCH_CUDA
                if (gpu_on) gpu_free_inputs(&g);
#endif
                free(c.sidx);
                free(sq);
                free(c.ex_ids);
                free(c.ex_dist);
                free(c.got_ids);
                free(c.got_dist);
            }
        }
        free(ref);
        free(qry);
    }

    if (nrows == 0) {
        printf("# no rows ran (every k was larger than n)\n");
        failed++;
    }
    if (o.json) write_json(o.json, &o, &m, rows, nrows, failed == 0);
    if (failed)
        printf("# FAIL: %d of %d rows wrong or failed\n", failed, nrows);
    else
        printf("# PASS\n");
#ifdef XKNN_BENCH_CUDA
    if (gpu_on) {
        cudaEventDestroy(g.e0);
        cudaEventDestroy(g.e1);
        cudaStreamDestroy(g.stream);
        xknn_cuda_context_destroy(g.ctx);
    }
#endif
    for (i = 0; i < nrows; i++) free(rows[i].times);
    free(rows);
    return failed ? 1 : 0;
}
