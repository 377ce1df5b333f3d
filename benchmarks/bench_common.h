/* SPDX-License-Identifier: MIT */
/*
 * bench_common.h -- shared parts of the benchmark programs (bench_knn, bench_scaling,
 * bench_metrics, bench_selfjoin): the deterministic data generator, the exact host oracle
 * for sampled queries, option parsing, timing and JSON helpers. Not part of the library.
 *
 * GENERATOR
 *   Row i of a stream (references, queries, cluster centres) depends only on (seed,
 *   stream, i): its state is a splitmix64 hash of those, then d splitmix64 draws. Any
 *   slicing of the rows (MPI ranks, chunks, threads) gives the same global data, bit for
 *   bit, on every machine (only integer operations and exact double arithmetic).
 *   uniform   each value a multiple of 2^-24 in [0, 1)
 *   clusters  centre c (stream "centres", uniform [0,1)^d) chosen uniformly per row;
 *             value = centre + sigma * g, g ~ N(0, 1) approximated by the centred sum
 *             of four 16-bit uniforms, scaled to unit variance
 *
 * ORACLE
 *   The exact answer for a few sampled queries, written here independently of the
 *   library with the canonical definition (docs/DESIGN.md section 2.2): per pair
 *   diff = (double)a - (double)b, acc = fma(diff, diff, acc) in dimension order, rounded
 *   once to float; neighbours ordered by (distance, id). Brute force over all rows,
 *   OpenMP over tiles of rows, a bounded max-heap per (thread, sampled query).
 */
#ifndef XKNN_BENCH_COMMON_H
#define XKNN_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#if defined(__GNUC__)
#define BENCH_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define BENCH_NORETURN __attribute__((noreturn))
#else
#define BENCH_PRINTF(a, b)
#define BENCH_NORETURN
#endif

/* ---- generator ----------------------------------------------------------------------- */
typedef enum bench_data_kind {
    BENCH_DATA_UNIFORM = 0,
    BENCH_DATA_CLUSTERS,
    BENCH_DATA_COUNT
} bench_data_kind;

enum { BENCH_STREAM_REF = 0, BENCH_STREAM_QUERY = 1, BENCH_STREAM_CENTRES = 2 };

typedef struct bench_gen {
    bench_data_kind kind;
    uint64_t seed;
    int64_t d;
    int64_t clusters; /* clusters only */
    double sigma;     /* clusters only */
    float *centres;   /* clusters x d, clusters only */
} bench_gen;

/* Returns 0, or -1 when out of memory. */
int bench_gen_init(bench_gen *g, bench_data_kind kind, uint64_t seed, int64_t d, int64_t clusters, double sigma);
void bench_gen_free(bench_gen *g);
/* Rows [row0, row0 + rows) of `stream` into out (rows x d, ld = d); OpenMP over rows. */
void bench_gen_rows(const bench_gen *g, int stream, int64_t row0, int64_t rows, float *out);
const char *bench_data_name(bench_data_kind kind);
/* BENCH_DATA_COUNT if unknown */
bench_data_kind bench_data_from_name(const char *name);

/* ---- oracle -------------------------------------------------------------------------- */
typedef struct bench_oracle bench_oracle;

/* queries: S x d (ld = d), copied. k >= 1. NULL when out of memory. */
bench_oracle *bench_oracle_create(const float *queries, int64_t S, int64_t d, int64_t k);
/* Adds reference rows [row0, row0 + nrows) (nrows x d, row stride ld, host memory);
 * global id of row j is row0 + j. Any order of calls, any split. */
void bench_oracle_add(bench_oracle *o, const float *rows, int64_t ld, int64_t row0, int64_t nrows);
/* Exact top k of every sampled query: ids S x k, dist S x k. Entries beyond the number
 * of rows added get id -1 and +inf. */
void bench_oracle_finish(bench_oracle *o, int64_t *ids, float *dist);
void bench_oracle_free(bench_oracle *o);

/* Index of sampled query s of S among nq (spread evenly, first and last included). */
int64_t bench_sample_index(int64_t s, int64_t S, int64_t nq);

/* Number of sampled queries whose k ids or k distance bits differ. got_* and want_*
 * are S x k with leading dimensions ld_got and ld_want (>= k). */
int64_t bench_count_wrong(int64_t S, int64_t k, const int64_t *got_ids, const float *got_dist, int64_t ld_got,
                          const int64_t *want_ids, const float *want_dist, int64_t ld_want);
/* Number of rows (of nq) whose k ids or distance bits differ between two full results. */
int64_t bench_count_differ(int64_t nq, int64_t k, const int64_t *ids_a, const float *dist_a,
                           const int64_t *ids_b, const float *dist_b);

/* ---- parsing ------------------------------------------------------------------------- */
/* "1000", "1e6", "10k", "1M", "2G" (powers of 1000), "64Ki", "2Gi", "2GiB" (powers of
 * 1024). Returns 0 or -1. */
int bench_parse_size(const char *s, int64_t *out);
/* Comma-separated list of sizes; returns the count (<= max) or -1. */
int bench_parse_size_list(const char *s, int64_t *out, int max);
/* Comma-separated words (each < 32 chars); returns the count (<= max) or -1. */
int bench_split_words(const char *s, char (*out)[32], int max);
/* Index of w in the NULL-terminated list names, or -1. */
int bench_find_word(const char *w, const char *const *names);

/* The defaults of the options bench_knn and bench_scaling share, set in their option
 * structs (members of these names): --data uniform, --clusters 100, --sigma 0.1,
 * --seed 1, --repeats 5, --warmup 1, --sample 20. */
#define BENCH_SHARED_DEFAULTS(o)        \
    do {                                \
        (o)->data = BENCH_DATA_UNIFORM; \
        (o)->clusters = 100;            \
        (o)->sigma = 0.1;               \
        (o)->seed = 1;                  \
        (o)->repeats = 5;               \
        (o)->warmup = 1;                \
        (o)->sample = 20;               \
    } while (0)

/* ---- misc ---------------------------------------------------------------------------- */
int64_t bench_list_max(const int64_t *v, int n); /* largest of v[0..n), n >= 1 */
double bench_now(void); /* monotonic seconds */
double bench_median(const double *x, int n);
double bench_min(const double *x, int n);
double bench_max(const double *x, int n);
void bench_utc_date(char *buf, size_t size);   /* 2026-01-31T12:00:00Z */
void bench_cpu_model(char *buf, size_t size);  /* /proc/cpuinfo model name, or "unknown" */
int bench_max_threads(void);                   /* OpenMP threads (1 without OpenMP) */
const char *bench_commit(void);                /* env XKNN_GIT_COMMIT, else build-time */
int bench_openmp(void);                        /* 1 if built with OpenMP */
/* JSON helpers: a quoted, escaped string; a number or null for NaN/Inf. */
void bench_json_str(FILE *f, const char *s);
void bench_json_num(FILE *f, double v);
/* The same after ", \"key\": " (key written as given: no escaping). */
void bench_json_key_str(FILE *f, const char *key, const char *s);
void bench_json_key_num(FILE *f, const char *key, double v);
/* Opens a result document: {"program": P, "meta": {"xknn_version", "commit", "date"
 * -- the caller continues the meta object with ", \"key\": value" pairs. */
void bench_json_begin(FILE *f, const char *program, const char *version, const char *date);
/* The rows of a result document: bench_json_open opens path for writing (NULL after
 * "prog: cannot write path" on stderr); bench_json_row_end ends a row's object with its
 * ", \"status\"" and ", \"error\"" strings; bench_json_close ends the rows list with
 * "pass" and the document, and closes the file ("prog: error writing path" on stderr
 * when that fails). */
FILE *bench_json_open(const char *prog, const char *path);
void bench_json_row_end(FILE *f, const char *status, const char *error);
void bench_json_close(FILE *f, const char *prog, const char *path, int pass);
/* Writes an .fbin file (uint32 n, uint32 d, float32 rows) through a temporary name in
 * the same directory, renamed when complete. Returns 0, or -1 with a message on stderr. */
int bench_write_fbin(const char *path, const float *x, int64_t n, int64_t d);
/* Allocation that prints a message and exits(2) on failure. */
void *bench_xmalloc(size_t bytes, const char *what);
/* Prints "prog: message" on stderr and exits with status 2 (usage/setup errors). */
BENCH_NORETURN void bench_die(const char *prog, const char *fmt, ...) BENCH_PRINTF(2, 3);

#ifdef XKNN_BENCH_CUDA
#include <cuda_runtime_api.h>
/* A CUDA runtime call that must succeed: bench_die names the call, the error and the line. */
#define BENCH_CUDA_DIE(prog, call)                                                                          \
    do {                                                                                                    \
        cudaError_t e_ = (call);                                                                            \
        if (e_ != cudaSuccess) bench_die((prog), "%s: %s (line %d)", #call, cudaGetErrorString(e_), __LINE__); \
    } while (0)
#endif

#endif
