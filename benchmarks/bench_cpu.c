/* SPDX-License-Identifier: MIT */
/* bench_cpu: times one xknn_search on raw float32 files (used by peers_cpu.py).
 * usage: bench_cpu REF.f32 QRY.f32 n nq d k threads IDS_OUT.i64 DIST_OUT.f32 [loop|blas [QB [RB]]] */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xknn.h"

static void *slurp(const char *path, size_t bytes)
{
    FILE *f = fopen(path, "rb");
    void *p = malloc(bytes);
    if (!f || !p || fread(p, 1, bytes, f) != bytes) {
        fprintf(stderr, "bench_cpu: cannot read %zu bytes from %s\n", bytes, path);
        exit(2);
    }
    fclose(f);
    return p;
}

static void dump(const char *path, const void *p, size_t bytes)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0) {
        fprintf(stderr, "bench_cpu: cannot write %s\n", path);
        exit(2);
    }
}

int main(int argc, char **argv)
{
    int64_t n, nq, d, k;
    float *ref, *qry, *dist;
    int64_t *ids;
    struct timespec t0, t1;
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_error err;
    if (argc < 10) {
        fprintf(stderr, "usage: bench_cpu REF.f32 QRY.f32 n nq d k threads IDS_OUT DIST_OUT [auto|blas|loop|int8 [QB [RB]]]\n");
        return 1;
    }
    n = atoll(argv[3]);
    nq = atoll(argv[4]);
    d = atoll(argv[5]);
    k = atoll(argv[6]);
    p.num_threads = atoi(argv[7]);
    p.backend = XKNN_BACKEND_CPU;
    if (argc > 10) {
        static const char *const names[] = {"auto", "blas", "loop", "int8"};
        static const xknn_cpu_path paths[] = {XKNN_CPU_PATH_AUTO, XKNN_CPU_PATH_BLAS, XKNN_CPU_PATH_LOOP,
                                              XKNN_CPU_PATH_INT8};
        size_t i;
        for (i = 0; i < sizeof names / sizeof names[0] && strcmp(argv[10], names[i]); i++) continue;
        if (i == sizeof names / sizeof names[0]) {
            fprintf(stderr, "bench_cpu: unknown path '%s' (auto, blas, loop, int8)\n", argv[10]);
            return 1;
        }
        p.cpu_path = paths[i];
    }
    if (argc > 11) p.query_block = atoll(argv[11]);
    if (argc > 12) p.ref_block = atoll(argv[12]);
    ref = slurp(argv[1], (size_t)(n * d) * sizeof(float));
    qry = slurp(argv[2], (size_t)(nq * d) * sizeof(float));
    ids = malloc((size_t)(nq * k) * sizeof(int64_t));
    dist = malloc((size_t)(nq * k) * sizeof(float));
    {
        xknn_matrix r = XKNN_MATRIX_F32(ref, n, d), q = XKNN_MATRIX_F32(qry, nq, d);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (xknn_search(&p, &r, &q, k, ids, dist, &err) != XKNN_SUCCESS) {
            fprintf(stderr, "bench_cpu: %s\n", err.message);
            return 3;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
    }
    printf("time_s=%.6f\n", (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    dump(argv[8], ids, (size_t)(nq * k) * sizeof(int64_t));
    dump(argv[9], dist, (size_t)(nq * k) * sizeof(float));
    free(ref);
    free(qry);
    free(ids);
    free(dist);
    return 0;
}
