/* SPDX-License-Identifier: MIT */
/*
 * overhead.c -- the C side of python/bench/overhead.py: reads REF and QUERY in their own
 * type, runs xknn_search (k, metric l2, defaults otherwise) REPEAT times and prints each
 * call's seconds on one line, for comparison with the same search through xknn.search.
 *   cc -O2 -Iinclude python/bench/overhead.c -Lbuild/... -lxknn -o overhead
 *   overhead REF QUERY K REPEAT [BACKEND]     (BACKEND: auto, cpu or cuda; default auto)
 * Built as a shared object (-shared -fPIC -DXKNN_OVERHEAD_LIB), it exports
 * xknn_overhead_search instead, which overhead.py calls through ctypes on the very arrays
 * it gives xknn.search: the same process, memory and threads on both sides.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xknn.h"
#include "xknn/io.h"

static double seconds(const struct timespec *t0, const struct timespec *t1)
{
    return (double)(t1->tv_sec - t0->tv_sec) + 1e-9 * (double)(t1->tv_nsec - t0->tv_nsec);
}

static xknn_backend backend_of(const char *name)
{
    return !strcmp(name, "cpu") ? XKNN_BACKEND_CPU : !strcmp(name, "cuda") ? XKNN_BACKEND_CUDA : XKNN_BACKEND_AUTO;
}

#ifdef XKNN_OVERHEAD_LIB
/* One xknn_search of host rows (dtype by xknn_dtype_from_name) into ids/dist; returns
 * its wall seconds, or -1 on failure. */
double xknn_overhead_search(const void *ref, int64_t n, const void *query, int64_t nq, int64_t d, const char *dtype,
                            int64_t k, const char *backend, int64_t *ids, float *dist);
double xknn_overhead_search(const void *ref, int64_t n, const void *query, int64_t nq, int64_t d, const char *dtype,
                            int64_t k, const char *backend, int64_t *ids, float *dist)
{
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_matrix rm = XKNN_MATRIX_TYPED(ref, n, d, xknn_dtype_from_name(dtype));
    xknn_matrix qm = XKNN_MATRIX_TYPED(query, nq, d, xknn_dtype_from_name(dtype));
    xknn_error err;
    struct timespec t0, t1;
    xknn_status st;
    p.backend = backend_of(backend);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = xknn_search(&p, &rm, &qm, k, ids, dist, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return st == XKNN_SUCCESS ? seconds(&t0, &t1) : -1.0;
}
#else
static void *read_all(const char *path, xknn_matrix *m)
{
    xknn_file_info info;
    xknn_error err;
    void *buf;
    if (xknn_file_probe(path, NULL, &info, &err) != XKNN_SUCCESS) {
        fprintf(stderr, "%s\n", err.message);
        exit(1);
    }
    m->dtype = xknn_file_native_dtype(&info);
    m->rows = info.rows;
    m->cols = info.cols;
    m->ld = 0;
    buf = malloc((size_t)(xknn_row_bytes(m->dtype, info.cols) * info.rows));
    if (!buf || xknn_file_read_rows_as(path, &info, 0, info.rows, m->dtype, buf, &err) != XKNN_SUCCESS) {
        fprintf(stderr, "%s: %s\n", path, buf ? err.message : "out of memory");
        exit(1);
    }
    m->data = buf;
    return buf;
}

int main(int argc, char **argv)
{
    xknn_matrix ref, qry;
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_error err;
    int64_t k, *ids;
    float *dist;
    int r, repeat;
    void *rb, *qb;
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: overhead REF QUERY K REPEAT [BACKEND]\n");
        return 2;
    }
    if (argc == 6) p.backend = backend_of(argv[5]);
    rb = read_all(argv[1], &ref);
    qb = read_all(argv[2], &qry);
    k = atoll(argv[3]);
    repeat = atoi(argv[4]);
    ids = malloc((size_t)(qry.rows * k) * sizeof *ids);
    dist = malloc((size_t)(qry.rows * k) * sizeof *dist);
    if (!ids || !dist) return 1;
    for (r = 0; r < repeat; r++) {
        struct timespec t0, t1, c0, c1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (xknn_search(&p, &ref, &qry, k, ids, dist, &err) != XKNN_SUCCESS) {
            fprintf(stderr, "%s\n", err.message);
            return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        printf("%.6f %.6f\n", seconds(&t0, &t1), seconds(&c0, &c1));
        fflush(stdout);
    }
    free(ids);
    free(dist);
    free(rb);
    free(qb);
    return 0;
}
#endif /* XKNN_OVERHEAD_LIB */
