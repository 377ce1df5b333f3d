/* SPDX-License-Identifier: MIT */
/*
 * bench_scaling -- strong and weak scaling of the distributed search (xknn_mpi.h).
 * Run under mpirun; every rank generates its own slice of the references with the
 * deterministic generator (row i depends only on (seed, i), so the global data are the
 * same for any rank count), rank 0 generates the queries, and xknn_mpi_search gathers
 * the results on rank 0, which checks sampled queries against the exact oracle over the
 * global data, regenerated chunk by chunk (never held whole).
 * benchmarks/README.md documents the options, columns and derived metrics.
 *
 *   mpirun -np 2 bench_scaling --backend cuda --n 20M --nq 10k --d 128 --k 100
 *   mpirun -np 2 bench_scaling --backend cuda --n-per-rank 10M --nq 10k --d 128 --k 100
 *   mpirun -np 2 bench_scaling --backend cuda --n 20M --mode both
 *
 * One-shot (default): each timed call is xknn_mpi_search, which stages the slice (scan,
 * copy to the device) inside the call. --mode resident: the slice goes into a resident
 * index once (xknn_mpi_index_create, timed on its own), and each timed call is
 * xknn_mpi_index_search, which moves only queries and candidates. --mode both: the
 * one-shot rows, then the resident ones, on the same data and oracle.
 *
 * Exit status (every rank): 0 PASS, 1 FAIL (wrong results or a failed search), 2 usage
 * or setup error.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "xknn.h"
#include "xknn_mpi.h"

#ifdef XKNN_BENCH_CUDA
#include <cuda_runtime_api.h>

#include "xknn/cuda.h"
#endif

#define PROG "bench_scaling"
#define MAXL 32

typedef struct opts {
    int64_t n, n_per_rank, nq, d;
    int64_t k[MAXL];
    int nk;
    int backend; /* XKNN_BACKEND_CPU or XKNN_BACKEND_CUDA */
    int path;    /* xknn_params.cuda_path */
    bench_data_kind data;
    int64_t clusters;
    double sigma;
    uint64_t seed;
    int repeats, warmup;
    int64_t sample, query_block, chunk;
    xknn_mpi_transfer transfer;
    int threads, verbose, modes; /* modes: 1 one-shot, 2 resident, 3 both */
    const char *json;
} opts;

typedef struct row {
    int64_t k;
    double bcast_ms, search_ms, reduce_ms, total_ms, min_total_ms, qps, tflops, imbalance;
    double *rank_search_ms; /* size entries, rank 0 only */
    double *totals_ms;      /* repeats */
    int ntimes, resident;
    int64_t wrong, nondet, blocks, query_block;
    char transfer[32];
    char status[16];
    char error[512];
} row;

static int usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np P " PROG " (--n N | --n-per-rank N) [options]\n"
            "  --n N             global references (strong scaling)\n"
            "  --n-per-rank N    references per rank (weak scaling: n = N * P)\n"
            "  --nq N            queries, on rank 0 (default 10000)\n"
            "  --d N             dimension (default 128)\n"
            "  --k LIST          neighbours, comma-separated (default 100)\n"
            "  --backend B       cpu|cuda (default: cuda when built and a device is present)\n"
            "  --path P          CUDA candidate path auto|fp32|tf32 (default auto)\n"
            "  --data KIND       uniform|clusters (default uniform); --clusters C, --sigma S\n"
            "  --seed S          generator seed (default 1)\n"
            "  --repeats R       timed repeats (default 5); medians are reported\n"
            "  --warmup W        untimed runs first (default 1)\n"
            "  --sample S        sampled queries checked on rank 0 (default 20)\n"
            "  --query-block N   xknn_mpi_config.query_block (default 0: automatic)\n"
            "  --transfer T      auto|host-staged|cuda-aware (default auto)\n"
            "  --threads N       CPU threads per rank for the CPU backend (default 0: OpenMP)\n"
            "  --chunk N         rows per chunk of the oracle's regeneration (default 65536)\n"
            "  --json FILE       rank 0 writes the metadata and rows as JSON\n"
            "  --mode M          one-shot (default: xknn_mpi_search), resident (an index\n"
            "                    created once, its searches timed), or both\n"
            "  --verbose         the library prints its plan on stderr\n"
            "sizes take k M G (powers of 1000) or Ki Mi Gi (powers of 1024)\n");
    return 2;
}

/* Returns 0, or 2 after printing a message on rank 0 (every rank parses the same argv). */
static int parse_opts(int argc, char **argv, opts *o, int rank)
{
    /* the options that take a size, and the member each sets */
    static const char *const size_names[] = {"--n",        "--n-per-rank", "--nq",          "--d",
                                             "--clusters", "--sample",     "--query-block", "--chunk", NULL};
    int64_t *const size_dst[] = {&o->n,        &o->n_per_rank, &o->nq,          &o->d,
                                 &o->clusters, &o->sample,     &o->query_block, &o->chunk};
    /* those that take a size into an int member */
    static const char *const int_names[] = {"--repeats", "--warmup", "--threads", NULL};
    int *const int_dst[] = {&o->repeats, &o->warmup, &o->threads};
    int i, j;
    memset(o, 0, sizeof *o);
    o->nq = 10000;
    o->d = 128;
    o->k[0] = 100;
    o->nk = 1;
    o->backend = xknn_backend_built(XKNN_BACKEND_CUDA) && xknn_cuda_device_count() > 0 ? XKNN_BACKEND_CUDA
                                                                                         : XKNN_BACKEND_CPU;
    BENCH_SHARED_DEFAULTS(o);
    o->chunk = 65536;
    o->transfer = XKNN_MPI_TRANSFER_AUTO;
    o->modes = 1;
#define BAD(...)                                                                                                  \
    do {                                                                                                          \
        if (rank == 0) {                                                                                          \
            fprintf(stderr, PROG ": ");                                                                           \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fputc('\n', stderr);                                                                                  \
        }                                                                                                         \
        return 2;                                                                                                 \
    } while (0)
#define VALUE() (i + 1 < argc ? argv[++i] : NULL)
#define SIZE(dst)                                                                                                 \
    do {                                                                                                          \
        const char *v_ = VALUE();                                                                                 \
        if (!v_ || bench_parse_size(v_, &(dst)) != 0) BAD("%s needs a size", argv[i - (v_ != NULL)]);             \
    } while (0)
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        int64_t v = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            if (rank == 0) usage(stdout);
            return 1;
        } else if ((j = bench_find_word(a, size_names)) >= 0) {
            SIZE(*size_dst[j]);
        } else if ((j = bench_find_word(a, int_names)) >= 0) {
            SIZE(v);
            *int_dst[j] = (int)v;
        } else if (!strcmp(a, "--k")) {
            const char *s = VALUE();
            if (!s || (o->nk = bench_parse_size_list(s, o->k, MAXL)) < 1) BAD("--k needs a list of sizes");
        } else if (!strcmp(a, "--backend")) {
            const char *s = VALUE();
            if (s && !strcmp(s, "cpu")) o->backend = XKNN_BACKEND_CPU;
            else if (s && !strcmp(s, "cuda")) o->backend = XKNN_BACKEND_CUDA;
            else BAD("--backend: cpu or cuda");
        } else if (!strcmp(a, "--path")) {
            static const char *const paths[] = {"auto", "fp32", "tf32", NULL}; /* xknn_params.cuda_path */
            const char *s = VALUE();
            if (!s || (o->path = bench_find_word(s, paths)) < 0) BAD("--path: auto, fp32 or tf32");
        } else if (!strcmp(a, "--data")) {
            const char *s = VALUE();
            if (!s || (o->data = bench_data_from_name(s)) == BENCH_DATA_COUNT) BAD("--data: uniform or clusters");
        } else if (!strcmp(a, "--sigma")) {
            const char *s = VALUE();
            char *end = NULL;
            if (s) o->sigma = strtod(s, &end);
            if (!s || *end || !(o->sigma >= 0)) BAD("--sigma needs a number >= 0");
        } else if (!strcmp(a, "--seed")) {
            SIZE(v);
            o->seed = (uint64_t)v;
        } else if (!strcmp(a, "--transfer")) {
            const char *s = VALUE();
            if (!s || (o->transfer = xknn_mpi_transfer_from_name(s)) == XKNN_MPI_TRANSFER_COUNT)
                BAD("--transfer: auto, host-staged or cuda-aware");
        } else if (!strcmp(a, "--json")) {
            if (!(o->json = VALUE())) BAD("--json needs a file name");
        } else if (!strcmp(a, "--verbose")) {
            o->verbose = 1;
        } else if (!strcmp(a, "--mode")) {
            static const char *const modes[] = {"one-shot", "resident", "both", NULL}; /* modes 1, 2, 3 */
            const char *m = VALUE();
            if (!m || (o->modes = bench_find_word(m, modes) + 1) < 1) BAD("--mode: one-shot, resident or both");
        } else {
            if (rank == 0) usage(stderr);
            BAD("unknown option '%s'", a);
        }
    }
    if ((o->n > 0) == (o->n_per_rank > 0)) BAD("give exactly one of --n (strong) and --n-per-rank (weak)");
    if (o->nq < 1 || o->d < 1) BAD("--nq and --d must be >= 1");
    if (o->repeats < 1 || o->warmup < 1) BAD("--repeats and --warmup must be >= 1");
    if (o->sample < 1) BAD("--sample must be >= 1 (every row is checked)");
    if (o->chunk < 1 || o->clusters < 1) BAD("--chunk and --clusters must be >= 1");
    for (i = 0; i < o->nk; i++)
        if (o->k[i] < 1) BAD("k must be >= 1");
#ifndef XKNN_BENCH_CUDA
    if (o->backend == XKNN_BACKEND_CUDA) BAD("--backend cuda: this " PROG " was built without CUDA");
#endif
#undef BAD
#undef VALUE
#undef SIZE
    return 0;
}

static void write_json(const char *path, const opts *o, int size, int64_t n, const char *cpu, const char *date,
                       const char *devices, double gen_s, double create_ms, const row *rows, int nrows, int pass)
{
    FILE *f = bench_json_open(PROG, path);
    int i, j;
    if (!f) return;
    bench_json_begin(f, "bench_scaling", XKNN_VERSION_STRING, date);
    bench_json_key_str(f, "cpu", cpu);
    fprintf(f, ", \"devices\": %s", devices);
    fprintf(f, ", \"threads_per_rank\": %d, \"ranks\": %d, \"scaling\": \"%s\"", bench_max_threads(), size,
            o->n_per_rank > 0 ? "weak" : "strong");
    fprintf(f, ", \"n\": %lld, \"n_per_rank\": %lld, \"nq\": %lld, \"d\": %lld, \"backend\": \"%s\"",
            (long long)n, (long long)(n / size), (long long)o->nq, (long long)o->d,
            o->backend == XKNN_BACKEND_CUDA ? "cuda" : "cpu");
    fprintf(f, ", \"path\": \"%s\", \"data\": ", o->path == 1 ? "fp32" : o->path == 2 ? "tf32" : "auto");
    bench_json_str(f, bench_data_name(o->data));
    fprintf(f, ", \"seed\": %llu, \"clusters\": %lld, \"sigma\": %g, \"metric\": \"l2\", \"dtype\": \"float32\"",
            (unsigned long long)o->seed, (long long)o->clusters, o->sigma);
    fprintf(f, ", \"repeats\": %d, \"warmup\": %d, \"sample\": %lld, \"generate_s_max\": ", o->repeats, o->warmup,
            (long long)o->sample);
    bench_json_num(f, gen_s);
    fprintf(f, ", \"mode\": \"%s\"", o->modes == 3 ? "both" : o->modes == 2 ? "resident" : "one-shot");
    bench_json_key_num(f, "create_ms", create_ms);
    fprintf(f, "},\n \"rows\": [");
    for (i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        fprintf(f, "%s\n  {\"ranks\": %d, \"n\": %lld, \"nq\": %lld, \"d\": %lld, \"k\": %lld, \"mode\": \"%s\"",
                i ? "," : "", size, (long long)n, (long long)o->nq, (long long)o->d, (long long)r->k,
                r->resident ? "resident" : "one-shot");
        fprintf(f, ", \"query_block\": %lld, \"blocks\": %lld, \"transfer\": ", (long long)r->query_block,
                (long long)r->blocks);
        bench_json_str(f, r->transfer);
        bench_json_key_num(f, "broadcast_ms", r->bcast_ms);
        bench_json_key_num(f, "search_ms", r->search_ms);
        bench_json_key_num(f, "reduce_ms", r->reduce_ms);
        bench_json_key_num(f, "total_ms", r->total_ms);
        bench_json_key_num(f, "min_total_ms", r->min_total_ms);
        fprintf(f, ", \"totals_ms\": [");
        for (j = 0; j < r->ntimes; j++) {
            if (j) fputs(", ", f);
            bench_json_num(f, r->totals_ms[j]);
        }
        fprintf(f, "], \"rank_search_ms\": [");
        for (j = 0; r->rank_search_ms && j < size; j++) {
            if (j) fputs(", ", f);
            bench_json_num(f, r->rank_search_ms[j]);
        }
        fprintf(f, "], \"queries_per_s\": ");
        bench_json_num(f, r->qps);
        bench_json_key_num(f, "eff_TFLOPs", r->tflops);
        bench_json_key_num(f, "imbalance", r->imbalance);
        fprintf(f, ", \"wrong\": %lld, \"nondet\": %lld", (long long)r->wrong, (long long)r->nondet);
        bench_json_row_end(f, r->status, r->error);
    }
    bench_json_close(f, PROG, path, pass);
}

/* The search parameters of every call (and of the resident index). */
static xknn_params bench_params(const opts *o, void *cuda_ctx)
{
    xknn_params p = XKNN_PARAMS_INIT;
    p.backend = (xknn_backend)o->backend;
    p.cuda_path = o->path;
    p.cuda_context = cuda_ctx;
    p.num_threads = o->threads;
    p.verbose = o->verbose;
    return p;
}

/* One timed call: the resident index's search where there is one, else xknn_mpi_search. */
static xknn_status bench_search(xknn_mpi_context *ctx, xknn_mpi_index *index, const xknn_params *p,
                                const xknn_matrix *M, int64_t row0, const xknn_matrix *Q, int64_t k,
                                const xknn_mpi_output *out, xknn_mpi_stats *stats, xknn_error *err)
{
    if (index) return xknn_mpi_index_search(index, Q, 0, k, out, stats, err);
    return xknn_mpi_search(ctx, p, M, row0, Q, 0, k, out, stats, err);
}

/* The resident index over this rank's slice (collective), its creation time (the max over
 * ranks) into *create_ms. Returns NULL after a message on rank 0 where it fails. */
static xknn_mpi_index *bench_index(xknn_mpi_context *ctx, const opts *o, void *cuda_ctx, float *mine, int64_t rows,
                                   int64_t row0, int rank, double *create_ms)
{
    const xknn_params p = bench_params(o, cuda_ctx);
    const xknn_matrix M = XKNN_MATRIX_F32(mine, rows, o->d);
    xknn_mpi_index *index = NULL;
    xknn_error err;
    double t = MPI_Wtime();
    const xknn_status st = xknn_mpi_index_create(ctx, &p, &M, row0, &index, &err);
    t = 1e3 * (MPI_Wtime() - t);
    MPI_Allreduce(&t, create_ms, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (st != XKNN_SUCCESS) { /* agreed by the library */
        if (rank == 0) fprintf(stderr, PROG ": xknn_mpi_index_create: %s\n", err.message);
        return NULL;
    }
    if (rank == 0) printf("# resident index: created in %.1f ms (max over ranks)\n", *create_ms);
    return index;
}

static void fmt_ms(char *buf, size_t size, double v)
{
    if (isfinite(v))
        snprintf(buf, size, "%.3f", v);
    else
        snprintf(buf, size, "-");
}

int main(int argc, char **argv)
{
    opts o;
    int rank = 0, size = 1, rc, i, ki, failed = 0, nrows = 0;
    int64_t n, row0 = 0, rows_mine = 0, S = 0, kmax = 0, s;
    float *mine = NULL, *qry = NULL;
    int64_t *ex_ids = NULL, *sidx = NULL, *got_ids = NULL;
    float *ex_dist = NULL, *got_dist = NULL;
    double gen_s, gen_max = 0.0, create_ms = NAN;
    xknn_mpi_context *ctx = NULL;
    xknn_mpi_index *index = NULL;
    xknn_mpi_config cfg = XKNN_MPI_CONFIG_INIT;
    xknn_error err;
    xknn_status st;
    bench_gen gen;
    row *rows = NULL;
    char date[64], cpu[256], dev_local[256], *devs_all = NULL, *devices_json = NULL;
    void *cuda_ctx = NULL;

    {
        int provided = 0; /* as knn_mpi (the symmetric ring's worker thread) */
        MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    rc = parse_opts(argc, argv, &o, rank);
    if (rc) {
        MPI_Finalize();
        return rc == 1 ? 0 : rc;
    }
    n = o.n > 0 ? o.n : o.n_per_rank * size;
    bench_utc_date(date, sizeof date);
    bench_cpu_model(cpu, sizeof cpu);

    cfg.transfer = o.transfer;
    cfg.query_block = o.query_block;
    cfg.verbose = o.verbose;
    st = xknn_mpi_create(MPI_COMM_WORLD, &cfg, &ctx, &err);
    if (st != XKNN_SUCCESS) {
        if (rank == 0) fprintf(stderr, PROG ": xknn_mpi_create: %s\n", err.message);
        MPI_Finalize();
        return 2;
    }

    /* the device of each rank, for the metadata */
    snprintf(dev_local, sizeof dev_local, "none");
    st = XKNN_SUCCESS;
    err.message[0] = '\0';
#ifdef XKNN_BENCH_CUDA
    if (o.backend == XKNN_BACKEND_CUDA) {
        xknn_cuda_context *cc = NULL;
        const int dev = xknn_mpi_device(ctx);
        st = xknn_cuda_context_create(dev, &cc, &err);
        if (st == XKNN_SUCCESS) {
            struct cudaDeviceProp prop;
            cuda_ctx = cc;
            if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
                snprintf(dev_local, sizeof dev_local, "%.180s (device %d, %d SMs, %.1f GiB)", prop.name, dev,
                         prop.multiProcessorCount, (double)prop.totalGlobalMem / 1073741824.0);
        }
    }
#endif
    st = xknn_mpi_agree(ctx, st, &err);
    if (st != XKNN_SUCCESS) {
        if (rank == 0) fprintf(stderr, PROG ": CUDA context: %s\n", err.message);
        MPI_Finalize();
        return 2;
    }
    if (rank == 0) devs_all = (char *)bench_xmalloc((size_t)size * sizeof dev_local, "devices");
    MPI_Gather(dev_local, (int)sizeof dev_local, MPI_CHAR, devs_all, (int)sizeof dev_local, MPI_CHAR, 0,
               MPI_COMM_WORLD);

    /* this rank's slice, rank 0's queries */
    if (bench_gen_init(&gen, o.data, o.seed, o.d, o.clusters, o.sigma) != 0) bench_die(PROG, "out of memory");
    xknn_mpi_slice(n, rank, size, &row0, &rows_mine);
    gen_s = bench_now();
    mine = (float *)bench_xmalloc((size_t)(rows_mine * o.d) * sizeof(float), "reference slice");
    bench_gen_rows(&gen, BENCH_STREAM_REF, row0, rows_mine, mine);
    if (rank == 0) {
        qry = (float *)bench_xmalloc((size_t)(o.nq * o.d) * sizeof(float), "queries");
        bench_gen_rows(&gen, BENCH_STREAM_QUERY, 0, o.nq, qry);
    }
    gen_s = bench_now() - gen_s;
    MPI_Reduce(&gen_s, &gen_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    if (rank == 0) {
        size_t len = 16;
        printf("# xknn bench_scaling %s, commit %s\n", XKNN_VERSION_STRING, bench_commit());
        printf("# date %s\n", date);
        printf("# ranks %d (%s scaling), cpu: %s, %d OpenMP threads per rank\n", size,
               o.n_per_rank > 0 ? "weak" : "strong", cpu, bench_max_threads());
        for (i = 0; i < size; i++) {
            printf("# rank %d device: %s\n", i, devs_all + (size_t)i * sizeof dev_local);
            len += 2 * sizeof dev_local + 4;
        }
        devices_json = (char *)bench_xmalloc(len, "devices");
        strcpy(devices_json, "[");
        for (i = 0; i < size; i++) {
            const char *dname = devs_all + (size_t)i * sizeof dev_local;
            size_t p = strlen(devices_json);
            const char *c;
            devices_json[p++] = i ? ',' : ' ';
            devices_json[p++] = '"';
            for (c = dname; *c; c++) {
                if (*c == '"' || *c == '\\') devices_json[p++] = '\\';
                devices_json[p++] = (char)((unsigned char)*c < 0x20 ? ' ' : *c);
            }
            devices_json[p++] = '"';
            devices_json[p] = '\0';
        }
        strcat(devices_json, "]");
        printf("# n=%lld (%lld per rank) nq=%lld d=%lld metric l2 float32, data %s seed %llu, backend %s, path %s, "
               "transfer %s\n",
               (long long)n, (long long)(n / size), (long long)o.nq, (long long)o.d, bench_data_name(o.data),
               (unsigned long long)o.seed, o.backend == XKNN_BACKEND_CUDA ? "cuda" : "cpu",
               o.path == 1 ? "fp32" : o.path == 2 ? "tf32" : "auto", xknn_mpi_transfer_name(xknn_mpi_transfer_mode(ctx)));
        printf("# generated the slices and queries in %.2f s (max over ranks)\n", gen_max);
        printf("# timing: warm-up %d, median of %d repeats of %s (gather to rank 0) after a barrier; "
               "phases from xknn_mpi_stats.max (max over ranks)\n",
               o.warmup, o.repeats, o.modes == 3 ? "xknn_mpi_search (one-shot), then xknn_mpi_index_search (resident)"
                               : o.modes == 2 ? "xknn_mpi_index_search (resident)" : "xknn_mpi_search (one-shot)");
        fflush(stdout);

        /* exact answer of the sampled queries over the global data, regenerated */
        {
            const double t0 = bench_now();
            float *sq, *chunk;
            bench_oracle *orc;
            int64_t i0;
            S = o.sample < o.nq ? o.sample : o.nq;
            kmax = bench_list_max(o.k, o.nk);
            if (kmax > n) kmax = n;
            sidx = (int64_t *)bench_xmalloc((size_t)S * sizeof(int64_t), "sample");
            sq = (float *)bench_xmalloc((size_t)(S * o.d) * sizeof(float), "sample");
            for (s = 0; s < S; s++) {
                sidx[s] = bench_sample_index(s, S, o.nq);
                memcpy(sq + s * o.d, qry + sidx[s] * o.d, (size_t)o.d * sizeof(float));
            }
            ex_ids = (int64_t *)bench_xmalloc((size_t)(S * kmax) * sizeof(int64_t), "oracle");
            ex_dist = (float *)bench_xmalloc((size_t)(S * kmax) * sizeof(float), "oracle");
            got_ids = (int64_t *)bench_xmalloc((size_t)(S * kmax) * sizeof(int64_t), "oracle");
            got_dist = (float *)bench_xmalloc((size_t)(S * kmax) * sizeof(float), "oracle");
            chunk = (float *)bench_xmalloc((size_t)(o.chunk * o.d) * sizeof(float), "oracle chunk");
            orc = bench_oracle_create(sq, S, o.d, kmax);
            if (!orc) bench_die(PROG, "out of memory for the oracle");
            for (i0 = 0; i0 < n; i0 += o.chunk) {
                const int64_t c = n - i0 < o.chunk ? n - i0 : o.chunk;
                bench_gen_rows(&gen, BENCH_STREAM_REF, i0, c, chunk);
                bench_oracle_add(orc, chunk, o.d, i0, c);
            }
            bench_oracle_finish(orc, ex_ids, ex_dist);
            bench_oracle_free(orc);
            free(chunk);
            free(sq);
            printf("# oracle (rank 0): %lld sampled queries x %lld regenerated references (k=%lld) in %.2f s\n",
                   (long long)S, (long long)n, (long long)kmax, bench_now() - t0);
        }
        printf("#ranks %10s %10s %7s %5s %6s %-7s %9s %10s %10s %10s %13s %10s %9s %6s  %s\n", "n", "n_per_rank",
               "nq", "d", "k", "backend", "bcast_ms", "search_ms", "reduce_ms", "total_ms", "queries_per_s",
               "eff_TFLOPs", "imbalance", "#wrong", "status");
        fflush(stdout);
    }
    bench_gen_free(&gen);
    MPI_Barrier(MPI_COMM_WORLD);

    rows = (row *)calloc((size_t)(2 * o.nk), sizeof(row));
    if (!rows) bench_die(PROG, "out of memory");
    for (ki = 0; ki < 2 * o.nk; ki++) {
        const int resident = ki >= o.nk; /* the one-shot rows, then the resident ones */
        const int64_t k = o.k[ki % o.nk];
        row *r;
        if (!(o.modes & (resident ? 2 : 1))) continue;
        if (rank == 0 && o.modes == 3 && ki % o.nk == 0) printf("# %s\n", resident ? "resident" : "one-shot");
        if (resident && !index) {
            /* (made after the one-shot rows: a GPU need not hold two copies of the slice) */
            index = bench_index(ctx, &o, cuda_ctx, mine, rows_mine, row0, rank, &create_ms);
            if (!index) {
                MPI_Finalize();
                return 1;
            }
        }
        r = &rows[nrows++];
        const size_t cnt = rank == 0 ? (size_t)(o.nq * k) : 0;
        int64_t *ids_a = NULL, *ids_b = NULL;
        float *dist_a = NULL, *dist_b = NULL;
        double *bc = (double *)bench_xmalloc((size_t)o.repeats * sizeof(double), "times");
        double *se = (double *)bench_xmalloc((size_t)o.repeats * sizeof(double), "times");
        double *re = (double *)bench_xmalloc((size_t)o.repeats * sizeof(double), "times");
        double *lo = (double *)bench_xmalloc((size_t)o.repeats * sizeof(double), "times");
        double local_search;
        xknn_matrix M = XKNN_MATRIX_F32(mine, rows_mine, o.d), Q = XKNN_MATRIX_F32(qry, o.nq, o.d);
        xknn_mpi_output out = XKNN_MPI_OUTPUT_INIT;
        xknn_mpi_stats stats;
        const xknn_params p = bench_params(&o, cuda_ctx);
        memset(r, 0, sizeof *r);
        r->k = k;
        r->resident = resident;
        r->totals_ms = (double *)bench_xmalloc((size_t)o.repeats * sizeof(double), "times");
        r->bcast_ms = r->search_ms = r->reduce_ms = r->total_ms = r->min_total_ms = NAN;
        r->qps = r->tflops = r->imbalance = NAN;
        if (k > n) {
            if (rank == 0) printf("# skipped k=%lld > n=%lld\n", (long long)k, (long long)n);
            snprintf(r->status, sizeof r->status, "skipped");
            nrows--;
            free(bc);
            free(se);
            free(re);
            free(lo);
            free(r->totals_ms);
            continue;
        }
        if (rank == 0) {
            ids_a = (int64_t *)bench_xmalloc(cnt * sizeof(int64_t), "ids");
            ids_b = (int64_t *)bench_xmalloc(cnt * sizeof(int64_t), "ids");
            dist_a = (float *)bench_xmalloc(cnt * sizeof(float), "dist");
            dist_b = (float *)bench_xmalloc(cnt * sizeof(float), "dist");
            memset(ids_a, 0xFF, cnt * sizeof(int64_t));
            memset(dist_a, 0xFF, cnt * sizeof(float));
        }
        out.gather_root = 0;
        out.ids = ids_a;
        out.dist = dist_a;
        st = XKNN_SUCCESS;
        for (i = 0; st == XKNN_SUCCESS && i < o.warmup; i++)
            st = bench_search(ctx, resident ? index : NULL, &p, &M, row0, rank == 0 ? &Q : NULL, k, &out, &stats,
                              &err);
        out.ids = ids_b;
        out.dist = dist_b;
        for (i = 0; st == XKNN_SUCCESS && i < o.repeats; i++) {
            if (rank == 0 && i == o.repeats - 1) {
                memset(ids_b, 0xFF, cnt * sizeof(int64_t));
                memset(dist_b, 0xFF, cnt * sizeof(float));
            }
            MPI_Barrier(MPI_COMM_WORLD);
            st = bench_search(ctx, resident ? index : NULL, &p, &M, row0, rank == 0 ? &Q : NULL, k, &out, &stats,
                              &err);
            if (st != XKNN_SUCCESS) break;
            bc[i] = 1e3 * stats.max.broadcast;
            se[i] = 1e3 * stats.max.search;
            re[i] = 1e3 * stats.max.reduce;
            r->totals_ms[i] = 1e3 * stats.max.total;
            lo[i] = 1e3 * stats.local.search;
            r->ntimes = i + 1;
        }
        if (st != XKNN_SUCCESS) { /* agreed by the library: the same on every rank */
            snprintf(r->status, sizeof r->status, "ERROR");
            snprintf(r->error, sizeof r->error, "%s: %.400s (%s)", resident ? "xknn_mpi_index_search" : "xknn_mpi_search",
                     err.message, xknn_status_string(st));
            r->ntimes = 0;
        } else {
            r->blocks = stats.blocks;
            r->query_block = stats.query_block;
            snprintf(r->transfer, sizeof r->transfer, "%s", xknn_mpi_transfer_name(stats.transfer));
            r->bcast_ms = bench_median(bc, r->ntimes);
            r->search_ms = bench_median(se, r->ntimes);
            r->reduce_ms = bench_median(re, r->ntimes);
            r->total_ms = bench_median(r->totals_ms, r->ntimes);
            r->min_total_ms = bench_min(r->totals_ms, r->ntimes);
        }
        /* per-rank search busy time (median over repeats), gathered for the balance */
        local_search = r->ntimes ? bench_median(lo, r->ntimes) : NAN;
        if (rank == 0) r->rank_search_ms = (double *)bench_xmalloc((size_t)size * sizeof(double), "per rank");
        MPI_Gather(&local_search, 1, MPI_DOUBLE, r->rank_search_ms, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32], wr[32];
            if (r->ntimes) {
                double mean = 0.0, mx = 0.0;
                int64_t w2;
                for (i = 0; i < size; i++) {
                    mean += r->rank_search_ms[i] / size;
                    if (r->rank_search_ms[i] > mx) mx = r->rank_search_ms[i];
                }
                r->imbalance = mean > 0 ? mx / mean : NAN;
                for (s = 0; s < S; s++) {
                    memcpy(got_ids + s * k, ids_a + sidx[s] * k, (size_t)k * sizeof(int64_t));
                    memcpy(got_dist + s * k, dist_a + sidx[s] * k, (size_t)k * sizeof(float));
                }
                r->wrong = bench_count_wrong(S, k, got_ids, got_dist, k, ex_ids, ex_dist, kmax);
                for (s = 0; s < S; s++) {
                    memcpy(got_ids + s * k, ids_b + sidx[s] * k, (size_t)k * sizeof(int64_t));
                    memcpy(got_dist + s * k, dist_b + sidx[s] * k, (size_t)k * sizeof(float));
                }
                w2 = bench_count_wrong(S, k, got_ids, got_dist, k, ex_ids, ex_dist, kmax);
                if (w2 > r->wrong) r->wrong = w2;
                r->nondet = bench_count_differ(o.nq, k, ids_a, dist_a, ids_b, dist_b);
                r->qps = (double)o.nq / (r->total_ms * 1e-3);
                r->tflops = 2.0 * (double)n * (double)o.nq * (double)o.d / (r->total_ms * 1e-3) / 1e12;
                snprintf(r->status, sizeof r->status, r->wrong || r->nondet ? "FAIL" : "ok");
            }
            if (strcmp(r->status, "ok") != 0) failed++;
            fmt_ms(b1, sizeof b1, r->bcast_ms);
            fmt_ms(b2, sizeof b2, r->search_ms);
            fmt_ms(b3, sizeof b3, r->reduce_ms);
            fmt_ms(b4, sizeof b4, r->total_ms);
            if (!strcmp(r->status, "ok")) {
                snprintf(b5, sizeof b5, "%.1f", r->qps);
                snprintf(b6, sizeof b6, "%.3f", r->tflops);
                snprintf(b7, sizeof b7, "%.3f", r->imbalance);
            } else {
                snprintf(b5, sizeof b5, "-");
                snprintf(b6, sizeof b6, "-");
                snprintf(b7, sizeof b7, "-");
            }
            if (r->ntimes)
                snprintf(wr, sizeof wr, "%lld", (long long)r->wrong);
            else
                snprintf(wr, sizeof wr, "-");
            printf(" %5d %10lld %10lld %7lld %5lld %6lld %-7s %9s %10s %10s %10s %13s %10s %9s %6s  %s\n", size,
                   (long long)n, (long long)(n / size), (long long)o.nq, (long long)o.d, (long long)k,
                   o.backend == XKNN_BACKEND_CUDA ? "cuda" : "cpu", b1, b2, b3, b4, b5, b6, b7, wr, r->status);
            if (r->ntimes) {
                printf("# search_ms per rank (median):");
                for (i = 0; i < size; i++) printf(" %.3f", r->rank_search_ms[i]);
                printf("; query_block %lld, %lld blocks, transfer %s\n", (long long)r->query_block,
                       (long long)r->blocks, r->transfer);
            }
            if (r->nondet)
                printf("# row above: %lld of %lld queries differ between the warm-up and the last repeat\n",
                       (long long)r->nondet, (long long)o.nq);
            if (r->error[0]) printf("# row above: %s\n", r->error);
            fflush(stdout);
        }
        free(bc);
        free(se);
        free(re);
        free(lo);
        free(ids_a);
        free(ids_b);
        free(dist_a);
        free(dist_b);
    }

    if (rank == 0) {
        if (nrows == 0) {
            printf("# no rows ran (every k was larger than n)\n");
            failed++;
        }
        if (o.json) write_json(o.json, &o, size, n, cpu, date, devices_json, gen_max, create_ms, rows, nrows, failed == 0);
        if (failed)
            printf("# FAIL: %d of %d rows wrong or failed\n", failed, nrows);
        else
            printf("# PASS\n");
        fflush(stdout);
    }
    MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);

    for (i = 0; i < nrows; i++) {
        free(rows[i].rank_search_ms);
        free(rows[i].totals_ms);
    }
    free(rows);
    if (index) xknn_mpi_index_destroy(index);
    free(mine);
    free(qry);
    free(sidx);
    free(ex_ids);
    free(ex_dist);
    free(got_ids);
    free(got_dist);
    free(devs_all);
    free(devices_json);
    xknn_mpi_destroy(ctx);
#ifdef XKNN_BENCH_CUDA
    xknn_cuda_context_destroy((xknn_cuda_context *)cuda_ctx);
#endif
    MPI_Finalize();
    return failed ? 1 : 0;
}
