/* SPDX-License-Identifier: MIT */
/* cuda-t: the CUDA backend against the oracle and the CPU backend, byte for byte (ids
 * and distance bits), the embedding API on device buffers, and the error paths.
 *
 * Skips everything (1..0 # SKIP) when the CUDA backend is not built or no device is
 * present. XKNN_CUDA_TEST_QUICK=1 (memcheck, synccheck) or 2 (racecheck) keeps the plan
 * but skips cases, see skipped_by_quick (used under compute-sanitizer by
 * tests/device-run.sh). */
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

#ifdef XKNN_TEST_HAVE_CUDA_RT
#include <cuda_runtime_api.h>
#endif

enum { CMP_ORACLE = 0, CMP_CPU_ONLY = 1 };

typedef struct {
    const char *what;
    data_kind kind;
    int64_t n, nq, d, k; /* k <= 0: n - 1 (self-join) or n */
    int self;            /* query == NULL */
    int metric;
    int path;            /* XKNN_CUDA_PATH_* */
    size_t budget;       /* device_memory_budget, 0 = default */
    int64_t qblock, rblock;
    int64_t ldpad;       /* extra floats per row (leading dimension > d) */
    int64_t roff, qoff;
    int exclude, pad;
    int cmp;             /* CMP_CPU_ONLY: too big for the oracle; second test = other path */
    int heavy;           /* skipped with XKNN_CUDA_TEST_QUICK */
} tcase;

#define L2 XKNN_METRIC_L2
#define EU XKNN_METRIC_EUCLIDEAN
#define IP XKNN_METRIC_IP
#define CO XKNN_METRIC_COSINE
#define FP XKNN_CUDA_PATH_FP32
#define TF XKNN_CUDA_PATH_TF32
#define AU XKNN_CUDA_PATH_AUTO
#define FU XKNN_CUDA_PATH_FUSED
#define MM XKNN_CUDA_PATH_MMA

static const tcase cases[] = {
    /* what                    kind             n      nq    d    k     self met path budget qb rb ldp roff qoff ex pad cmp heavy */
    {"d=1 k=1", DATA_UNIFORM, 1237, 101, 1, 1, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"d=3 k=16", DATA_UNIFORM, 1237, 101, 3, 16, 0, EU, TF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"d=32 k=100 fp32", DATA_GAUSSIAN, 2001, 77, 32, 100, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"d=32 k=100 tf32", DATA_GAUSSIAN, 2001, 77, 32, 100, 0, L2, TF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"d=100 k=16", DATA_GAUSSIAN, 3001, 53, 100, 16, 0, EU, TF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"d=128 k=1024", DATA_UNIFORM, 2500, 65, 128, 1024, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"d=128 k=1024 tf32", DATA_UNIFORM, 2500, 65, 128, 1024, 0, EU, TF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"ties d=32", DATA_INTEGER, 1500, 40, 32, 100, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"ties d=32 tf32", DATA_INTEGER, 1500, 40, 32, 100, 0, EU, TF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"dups d=3", DATA_DUPLICATES, 600, 50, 3, 100, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"dups exact compaction", DATA_DUPLICATES, 20000, 20, 8, 16, 0, L2, FP, 0, 0, 2048, 0, 0, 0, 0, 0, 0, 0},
    {"dups exact compaction tf32", DATA_DUPLICATES, 20000, 20, 8, 16, 0, EU, TF, 0, 0, 2048, 0, 0, 0, 0, 0, 0, 0},
    {"int d=1 exact compaction", DATA_INTEGER, 30001, 10, 1, 1, 0, L2, FP, 0, 0, 2048, 0, 0, 0, 0, 0, 0, 0},
    {"int d=1 k=100", DATA_INTEGER, 30001, 10, 1, 100, 0, EU, TF, 0, 0, 1000, 0, 0, 0, 0, 0, 0, 0},
    /* more than 4096 keys tie at the k-th distance: the final merge's fallback runs */
    {"int d=1 k=3000 ties at the cut", DATA_INTEGER, 30001, 10, 1, 3000, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"int d=2 k=2000 ties at the cut", DATA_INTEGER, 20011, 9, 2, 2000, 0, EU, TF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"clustered d=784", DATA_CLUSTERED, 3000, 40, 784, 100, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"clustered d=784 tf32", DATA_CLUSTERED, 3000, 40, 784, 16, 0, EU, TF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"d=960 k=1024", DATA_GAUSSIAN, 3000, 20, 960, 1024, 0, L2, TF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
    {"d=100 k=4096", DATA_GAUSSIAN, 5003, 20, 100, 4096, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"d=100 k=4096 tf32", DATA_UNIFORM, 5003, 20, 100, 4096, 0, EU, TF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
    {"k=40000", DATA_GAUSSIAN, 50021, 6, 32, 40000, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
    {"blocks 7 x 129", DATA_GAUSSIAN, 2001, 77, 32, 100, 0, L2, FP, 0, 7, 129, 0, 0, 0, 0, 0, 0, 0},
    {"blocks 3 x 5000 ld+3", DATA_UNIFORM, 9000, 11, 17, 33, 0, EU, TF, 0, 3, 5000, 3, 0, 0, 0, 0, 0, 0},
    {"self k=n-1", DATA_DUPLICATES, 400, 0, 3, 0, 1, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"self k=n-1 tf32", DATA_UNIFORM, 300, 0, 32, 0, 1, EU, TF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"self d=784 k=1", DATA_UNIFORM, 350, 0, 784, 1, 1, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"self ties k=100", DATA_INTEGER, 350, 0, 127, 100, 1, L2, TF, 0, 16, 40, 0, 0, 0, 0, 0, 0, 0},
    {"offsets exclude", DATA_INTEGER, 800, 300, 5, 20, 0, L2, FP, 0, 0, 0, 0, 1000, 1100, 1, 0, 0, 0},
    {"pad_missing", DATA_GAUSSIAN, 50, 9, 7, 60, 0, L2, FP, 0, 0, 0, 0, 7, 0, 0, 1, 0, 0},
    {"pad_missing self", DATA_INTEGER, 40, 0, 2, 45, 1, EU, FP, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0},
    {"n=1", DATA_GAUSSIAN, 1, 3, 5, 1, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"self n=2", DATA_UNIFORM, 2, 0, 1, 0, 1, L2, TF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"stream 2 MB", DATA_GAUSSIAN, 20000, 100, 32, 16, 0, L2, FP, (size_t)2 << 20, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"stream 1 MB ties", DATA_DUPLICATES, 20000, 10, 8, 16, 0, EU, TF, (size_t)1 << 20, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"stream self", DATA_UNIFORM, 5000, 0, 16, 10, 1, L2, FP, (size_t)400 << 10, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"stream k=1024", DATA_GAUSSIAN, 6000, 30, 24, 1024, 0, L2, TF, (size_t)3 << 20, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"big d=128 auto", DATA_GAUSSIAN, 200000, 1000, 128, 100, 0, L2, AU, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1},
    {"big d=960", DATA_UNIFORM, 50000, 500, 960, 10, 0, EU, TF, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1},
    {"big n=1M nq=37", DATA_GAUSSIAN, 1000003, 37, 32, 10, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1},
    {"big clustered", DATA_CLUSTERED, 100000, 200, 128, 64, 0, L2, TF, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1},
    /* the fused path (forced; beyond its limits it must fall back to the GEMM paths) */
    {"fused d=1 k=1", DATA_UNIFORM, 1237, 101, 1, 1, 0, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused d=3 k=16", DATA_UNIFORM, 5003, 333, 3, 16, 0, EU, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused d=32 k=100", DATA_GAUSSIAN, 4001, 77, 32, 100, 0, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused d=100 k=16", DATA_GAUSSIAN, 3001, 53, 100, 16, 0, EU, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused d=128 k=128", DATA_UNIFORM, 2500, 65, 128, 128, 0, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused d=128 k=16", DATA_UNIFORM, 16411, 203, 128, 16, 0, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused ties d=32", DATA_INTEGER, 1500, 40, 32, 100, 0, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused dups d=3 k=100", DATA_DUPLICATES, 600, 50, 3, 100, 0, EU, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused dups re-run", DATA_DUPLICATES, 20000, 20, 8, 16, 0, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused int d=1 re-run", DATA_INTEGER, 30001, 10, 1, 1, 0, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused clustered d=64", DATA_CLUSTERED, 3000, 40, 64, 16, 0, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused blocks 7 x 129", DATA_GAUSSIAN, 2001, 77, 32, 33, 0, L2, FU, 0, 7, 129, 0, 0, 0, 0, 0, 0, 0},
    {"fused ld+3 d=17", DATA_UNIFORM, 9000, 11, 17, 33, 0, EU, FU, 0, 3, 5000, 3, 0, 0, 0, 0, 0, 0},
    {"fused self d=3 k=32", DATA_UNIFORM, 3001, 0, 3, 32, 1, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused self ties k=100", DATA_INTEGER, 350, 0, 5, 100, 1, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused offsets exclude", DATA_INTEGER, 800, 300, 5, 20, 0, L2, FU, 0, 0, 0, 0, 1000, 1100, 1, 0, 0, 0},
    {"fused pad_missing", DATA_GAUSSIAN, 50, 9, 7, 60, 0, L2, FU, 0, 0, 0, 0, 7, 0, 0, 1, 0, 0},
    {"fused pad_missing self", DATA_INTEGER, 40, 0, 2, 45, 1, EU, FU, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0},
    {"fused n=1", DATA_GAUSSIAN, 1, 3, 5, 1, 0, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused k=1024 falls back", DATA_UNIFORM, 2500, 65, 32, 1024, 0, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused d=784 falls back", DATA_CLUSTERED, 3000, 40, 784, 16, 0, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"fused n=300k nq=37 d=3", DATA_GAUSSIAN, 300007, 37, 3, 10, 0, L2, FU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"auto d=128 W4-like", DATA_UNIFORM, 16384, 4096, 128, 16, 0, L2, AU, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1},
    /* the tensor-core path (forced): witnesses, epilogue filter, rescue of overflowed
     * queries (duplicates and integer ties overflow their buffers and are re-run) */
    {"mma d=1 k=1", DATA_UNIFORM, 1237, 101, 1, 1, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma d=3 k=16", DATA_UNIFORM, 5003, 333, 3, 16, 0, EU, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma d=32 k=100", DATA_GAUSSIAN, 30011, 300, 32, 100, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma d=100 k=16", DATA_GAUSSIAN, 30001, 257, 100, 16, 0, EU, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma d=128 k=1", DATA_UNIFORM, 40000, 513, 128, 1, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma d=128 k=1024", DATA_UNIFORM, 270000, 65, 128, 1024, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
    {"mma k=1024 small n falls back", DATA_UNIFORM, 25000, 65, 128, 1024, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* between 2 kk and 4 kk witness groups: the loosest thresholds the path takes */
    {"mma ties k=100 2k groups", DATA_INTEGER, 12900, 70, 20, 100, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma d=128 k=1024 2k groups", DATA_UNIFORM, 140000, 40, 128, 1024, 0, EU, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
    {"mma ip k=64 2k groups", DATA_GAUSSIAN, 8200, 50, 64, 64, 0, IP, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma d=100 k=4096", DATA_UNIFORM, 1100003, 8, 100, 4096, 0, EU, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
    {"mma ties d=32", DATA_INTEGER, 30000, 140, 32, 100, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma dups re-run", DATA_DUPLICATES, 20000, 20, 8, 16, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma int d=1 re-run", DATA_INTEGER, 30001, 10, 1, 100, 0, EU, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma clustered d=128", DATA_CLUSTERED, 30000, 300, 128, 16, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma blocks 7", DATA_GAUSSIAN, 2001, 77, 32, 5, 0, L2, MM, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma ld+3 d=17", DATA_UNIFORM, 9000, 11, 17, 33, 0, EU, MM, 0, 3, 0, 3, 0, 0, 0, 0, 0, 0},
    {"mma self k=16", DATA_UNIFORM, 6001, 0, 64, 16, 1, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma self ties k=10", DATA_INTEGER, 3500, 0, 5, 10, 1, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma self k=n-1 falls back", DATA_DUPLICATES, 400, 0, 3, 0, 1, EU, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma offsets exclude", DATA_INTEGER, 800, 300, 5, 3, 0, L2, MM, 0, 0, 0, 0, 1000, 1100, 1, 0, 0, 0},
    {"mma pad_missing falls back", DATA_GAUSSIAN, 50, 9, 7, 60, 0, L2, MM, 0, 0, 0, 0, 7, 0, 0, 1, 0, 0},
    {"mma n=1", DATA_GAUSSIAN, 1, 3, 5, 1, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma d=784 falls back", DATA_CLUSTERED, 3000, 40, 784, 16, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma stream falls back", DATA_GAUSSIAN, 20000, 100, 32, 16, 0, L2, MM, (size_t)2 << 20, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma big W1-like", DATA_UNIFORM, 300007, 2000, 128, 10, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1},
    {"mma big clustered k=100", DATA_CLUSTERED, 200000, 1000, 128, 100, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1},
    /* ip and cosine on the tensor-core path (engine.cu's mma_bounds; cosine on unit rows):
     * ties, duplicates, zero rows (integer data, d = 3), ip keys of either sign; where the
     * path does not apply (d, k, budget) the canonical tiles take them. The second test of
     * a CMP_CPU_ONLY case runs path tf32, which for ip and cosine is the canonical tiles. */
    {"mma ip d=128 k=10 auto", DATA_UNIFORM, 40000, 300, 128, 10, 0, IP, AU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma ip d=100 k=100", DATA_GAUSSIAN, 30011, 200, 100, 100, 0, IP, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma ip ties d=32", DATA_INTEGER, 30000, 140, 32, 100, 0, IP, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma ip dups re-run", DATA_DUPLICATES, 20000, 20, 8, 16, 0, IP, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma ip self ties k=10", DATA_INTEGER, 3500, 0, 5, 10, 1, IP, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma ip offsets exclude", DATA_INTEGER, 800, 300, 5, 3, 0, IP, MM, 0, 0, 0, 0, 1000, 1100, 1, 0, 0, 0},
    {"mma ip ld+3 d=17 blocks 3", DATA_UNIFORM, 9000, 11, 17, 33, 0, IP, MM, 0, 3, 0, 3, 0, 0, 0, 0, 0, 0},
    {"mma ip k=1024 falls back", DATA_UNIFORM, 25000, 65, 128, 1024, 0, IP, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma ip d=784 falls back", DATA_CLUSTERED, 3000, 40, 784, 16, 0, IP, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma cosine d=128 k=10 auto", DATA_UNIFORM, 40000, 300, 128, 10, 0, CO, AU, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma cosine clustered d=128", DATA_CLUSTERED, 30000, 300, 128, 16, 0, CO, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma cosine ties zero rows d=3", DATA_INTEGER, 30000, 100, 3, 100, 0, CO, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma cosine dups re-run", DATA_DUPLICATES, 20000, 20, 8, 16, 0, CO, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma cosine self k=16", DATA_GAUSSIAN, 6001, 0, 64, 16, 1, CO, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma cosine ld+3 d=17", DATA_GAUSSIAN, 9000, 11, 17, 33, 0, CO, MM, 0, 3, 0, 3, 0, 0, 0, 0, 0, 0},
    {"mma cosine stream falls back", DATA_GAUSSIAN, 20000, 100, 32, 16, 0, CO, MM, (size_t)2 << 20, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mma ip big W1-like", DATA_UNIFORM, 300007, 2000, 128, 10, 0, IP, MM, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1},
    {"mma cosine big clustered k=100", DATA_CLUSTERED, 200000, 1000, 128, 100, 0, CO, MM, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1},
    /* path fp32 with resident references and d <= 128: the same passes with fp32 products
     * on the CUDA cores (mma.cu's ffma_kernel, the FP32 bound); aligned and unaligned rows,
     * d below and past one 64-dimension stage, ties, re-runs, self-joins, tails of every
     * tile size */
    {"cores d=3 k=16", DATA_UNIFORM, 5003, 333, 3, 16, 0, EU, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"cores d=32 k=100", DATA_GAUSSIAN, 30011, 300, 32, 100, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"cores d=100 k=16", DATA_GAUSSIAN, 30001, 257, 100, 16, 0, EU, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"cores d=128 k=1", DATA_UNIFORM, 40000, 513, 128, 1, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"cores ties d=32", DATA_INTEGER, 30000, 140, 32, 100, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"cores dups re-run", DATA_DUPLICATES, 20000, 20, 8, 16, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"cores int d=1 re-run", DATA_INTEGER, 30001, 10, 1, 100, 0, EU, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"cores clustered d=128", DATA_CLUSTERED, 30000, 300, 128, 16, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"cores ld+3 d=17 blocks 3", DATA_UNIFORM, 9000, 11, 17, 33, 0, EU, FP, 0, 3, 0, 3, 0, 0, 0, 0, 0, 0},
    {"cores self k=16", DATA_UNIFORM, 6001, 0, 64, 16, 1, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"cores self ties k=10", DATA_INTEGER, 3500, 0, 5, 10, 1, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* 46 full query tiles and one of 100 rows: on 132 SMs the full tiles and the light
     * one are two grids (46 x 93 reference tiles >= 32 x 132) */
    {"cores self light tile", DATA_GAUSSIAN, 11876, 0, 64, 16, 1, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"cores d=128 k=1024 2k groups", DATA_UNIFORM, 140000, 40, 128, 1024, 0, EU, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
    {"cores big W1-like", DATA_UNIFORM, 300007, 2000, 128, 10, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1},
    /* large k, l2: tau estimated from a short witness prefix and certified after the
     * re-rank (engine.cu's plan_estimate) */
    {"mma k=512 estimated tau", DATA_UNIFORM, 100000, 200, 128, 512, 0, L2, MM, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"cores k=1000 estimated tau clustered", DATA_CLUSTERED, 150001, 100, 64, 1000, 0, L2, FP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

/* XKNN_CUDA_TEST_QUICK=1: heavy cases skipped (memcheck, synccheck).
 * XKNN_CUDA_TEST_QUICK=2: only these cases, which still reach every kernel path (warp,
 * block and merge sorts, splits, exact compaction, streaming, self-join, padding), for
 * racecheck, which is two orders of magnitude slower.
 * XKNN_CUDA_TEST_MATCH=text: only the cases whose name contains text (skipped otherwise). */
static int quick;
static const char *const tiny_cases[] = {
    "d=3 k=16", "d=32 k=100 fp32", "dups exact compaction", "d=100 k=4096", "blocks 7 x 129",
    "self k=n-1", "pad_missing self", "stream 1 MB ties", "fused d=3 k=16", "fused dups d=3 k=100",
    "fused blocks 7 x 129", "fused pad_missing self", "mma d=3 k=16", "mma dups re-run", "mma self k=n-1 falls back",
    "mma ld+3 d=17", "mma ip dups re-run", "mma ip offsets exclude", "mma d=128 k=1",
    "cores dups re-run", "cores ld+3 d=17 blocks 3",
};

static int skipped_by_quick(const tcase *c)
{
    size_t i;
    const char *match = getenv("XKNN_CUDA_TEST_MATCH"); /* only the cases whose name has it */
    if (match && *match && !strstr(c->what, match)) return 1;
    if (quick == 1) return c->heavy;
    if (quick >= 2) {
        for (i = 0; i < sizeof tiny_cases / sizeof tiny_cases[0]; i++)
            if (!strcmp(c->what, tiny_cases[i])) return 0;
        return 1;
    }
    return 0;
}

/* rows x d data with row stride ld (extra columns filled with junk that must be ignored) */
static float *make_matrix(data_kind kind, int64_t rows, int64_t d, int64_t ld, uint64_t seed)
{
    float *tight = f32_alloc(rows, d);
    float *m = f32_alloc(rows, ld);
    int64_t i, t;
    ref_make_data(kind, tight, rows, d, seed);
    for (i = 0; i < rows; i++)
        for (t = 0; t < ld; t++) m[i * ld + t] = t < d ? tight[i * d + t] : 1e30f;
    free(tight);
    return m;
}

static xknn_status search(const tcase *c, xknn_backend backend, int path, const float *ref, const float *qry,
                          int64_t nq, int64_t k, int64_t *ids, float *dist, xknn_error *err)
{
    xknn_params p = XKNN_PARAMS_INIT;
    const int64_t ld = c->d + c->ldpad;
    xknn_matrix r = XKNN_MATRIX_F32(ref, c->n, c->d), q = XKNN_MATRIX_F32(qry, nq, c->d);
    r.ld = ld;
    q.ld = ld;
    p.backend = backend;
    p.metric = (xknn_metric)c->metric;
    p.cuda_path = path;
    p.device_memory_budget = backend == XKNN_BACKEND_CUDA ? c->budget : 0;
    p.query_block = c->qblock;
    p.ref_block = c->rblock;
    p.ref_id_offset = c->roff;
    p.query_id_offset = c->qoff;
    p.exclude_self = c->exclude;
    p.pad_missing = c->pad;
    p.verbose = getenv("XKNN_CUDA_TEST_VERBOSE") != NULL && backend == XKNN_BACKEND_CUDA;
    memset(ids, 0xab, (size_t)(nq * k) * sizeof(int64_t));
    memset(dist, 0xab, (size_t)(nq * k) * sizeof(float));
    return xknn_search(&p, &r, c->self ? NULL : &q, k, ids, dist, err);
}

/* Two TAP lines per case. */
static void run_case(const tcase *c)
{
    const int64_t nq = c->self ? c->n : c->nq;
    const int64_t k = c->k > 0 ? c->k : (c->self ? c->n - 1 : c->n);
    const int64_t ld = c->d + c->ldpad;
    char name[256];
    float *ref, *qry = NULL, *dist, *wd;
    int64_t *ids, *wid;
    xknn_error err;
    xknn_status st;

    snprintf(name, sizeof name, "%s: %s n=%lld nq=%lld d=%lld k=%lld %s%s path=%s%s", c->what, ref_data_name(c->kind),
             (long long)c->n, (long long)nq, (long long)c->d, (long long)k, xknn_metric_name((xknn_metric)c->metric),
             c->self ? " self" : "", c->path == TF   ? "tf32"
             : c->path == FP ? "fp32"
             : c->path == FU ? "fused"
             : c->path == MM ? "mma"
                             : "auto",
             c->budget ? " (streamed)" : "");
    if (skipped_by_quick(c)) {
        skip(2, "%s: not in the XKNN_CUDA_TEST_QUICK=%d list", name, quick);
        return;
    }
    ref = make_matrix(c->kind, c->n, c->d, ld, 1);
    if (!c->self) qry = make_matrix(c->kind, nq, c->d, ld, 2);
    ids = i64_alloc(nq, k);
    wid = i64_alloc(nq, k);
    dist = f32_alloc(nq, k);
    wd = f32_alloc(nq, k);

    st = search(c, XKNN_BACKEND_CUDA, c->path, ref, qry, nq, k, ids, dist, &err);
    if (c->cmp == CMP_ORACLE) {
        ref_spec spec;
        memset(&spec, 0, sizeof spec);
        spec.metric = c->metric; /* REF_* numbers are xknn_metric's */
        spec.dtype = REF_F32;
        if (ref_knn_ex(&spec, ref, c->n, ld, qry, nq, ld, c->d, k, c->self || c->exclude, c->roff,
                       c->self ? c->roff : c->qoff, wid, wd) != 0)
            bail("oracle out of memory");
        is_knn_result(st, &err, ids, dist, wid, wd, nq, k, "%s vs oracle", name);
        st = search(c, XKNN_BACKEND_CPU, 0, ref, qry, nq, k, wid, wd, &err);
        if (st != XKNN_SUCCESS) bail("cpu backend failed: %s", err.message);
        st = search(c, XKNN_BACKEND_CUDA, c->path, ref, qry, nq, k, ids, dist, &err);
        if (st != XKNN_SUCCESS)
            ok(0, "%s vs cpu backend: %s", name, err.message);
        else
            is_knn_equal(ids, dist, wid, wd, nq, k, "%s vs cpu backend (second run)", name);
    } else {
        const int other = c->path == TF ? FP : c->path == FU ? FP : TF;
        xknn_error cerr;
        const xknn_status cst = search(c, XKNN_BACKEND_CPU, 0, ref, qry, nq, k, wid, wd, &cerr);
        if (cst != XKNN_SUCCESS) bail("cpu backend failed: %s", cerr.message);
        is_knn_result(st, &err, ids, dist, wid, wd, nq, k, "%s vs cpu backend", name);
        st = search(c, XKNN_BACKEND_CUDA, other, ref, qry, nq, k, ids, dist, &err);
        is_knn_result(st, &err, ids, dist, wid, wd, nq, k, "%s, path %s, vs cpu backend", name, other == TF ? "tf32" : "fp32");
    }
    FREE_ALL(ref, qry, ids, wid, dist, wd);
}

/* ---- ip and cosine on extreme magnitudes (4 tests) ------------------------------------
 * Every 7th reference row times 1e18 (|x|^2 above the 5e36 where the tensor-core
 * epilogue gives up bounding a pair: such pairs are always candidates), every 5th times
 * 1e-38 (subnormal elements, which the tensor cores may flush), every 3rd query times
 * 1e-30. The canonical value must still decide, equal to the oracle and the CPU backend. */
#define NEXTREME 4
static void run_extreme(void)
{
    const int64_t n = 20011, nq = 60, d = 64, k = 5;
    float *ref = make_matrix(DATA_GAUSSIAN, n, d, d, 31), *qry = make_matrix(DATA_GAUSSIAN, nq, d, d, 32);
    int64_t *ids = i64_alloc(nq, k), *wid = i64_alloc(nq, k);
    float *dist = f32_alloc(nq, k), *wd = f32_alloc(nq, k);
    xknn_matrix r = XKNN_MATRIX_F32(ref, n, d), q = XKNN_MATRIX_F32(qry, nq, d);
    int64_t i, t;
    int m;
    for (i = 0; i < n; i++)
        for (t = 0; t < d; t++) ref[i * d + t] *= i % 7 == 0 ? 1e18f : i % 5 == 0 ? 1e-38f : 1.0f;
    for (i = 0; i < nq; i += 3)
        for (t = 0; t < d; t++) qry[i * d + t] *= 1e-30f;
    for (m = 0; m < 2; m++) {
        const xknn_metric metric = m ? XKNN_METRIC_COSINE : XKNN_METRIC_IP;
        xknn_params p = XKNN_PARAMS_INIT;
        xknn_error err;
        xknn_status st;
        ref_spec spec;
        memset(&spec, 0, sizeof spec);
        spec.metric = (int)metric;
        spec.dtype = REF_F32;
        if (ref_knn_ex(&spec, ref, n, d, qry, nq, d, d, k, 0, 0, 0, wid, wd) != 0) bail("oracle out of memory");
        p.backend = XKNN_BACKEND_CUDA;
        p.metric = metric;
        p.cuda_path = XKNN_CUDA_PATH_MMA;
        p.verbose = getenv("XKNN_CUDA_TEST_VERBOSE") != NULL;
        st = xknn_search(&p, &r, &q, k, ids, dist, &err);
        if (st != XKNN_SUCCESS)
            ok(0, "%s, extreme magnitudes, mma: %s", xknn_metric_name(metric), err.message);
        else
            is_knn_equal(ids, dist, wid, wd, nq, k, "%s, extreme magnitudes (1e18, 1e-38, 1e-30 rows), mma vs oracle",
                         xknn_metric_name(metric));
        p.backend = XKNN_BACKEND_CPU;
        p.verbose = 0;
        st = xknn_search(&p, &r, &q, k, wid, wd, &err);
        if (st != XKNN_SUCCESS) bail("cpu backend failed: %s", err.message);
        is_knn_equal(ids, dist, wid, wd, nq, k, "%s, extreme magnitudes, mma vs cpu backend", xknn_metric_name(metric));
    }
    FREE_ALL(ref, qry, ids, wid, dist, wd);
}

/* ---- errors and the host path's knobs (7 tests) ----------------------------------- */
static void run_errors(void)
{
    const int64_t n = 3000, nq = 20, d = 9, k = 5;
    float *ref = make_matrix(DATA_GAUSSIAN, n, d, d, 5), *qry = make_matrix(DATA_GAUSSIAN, nq, d, d, 6);
    int64_t *ids = i64_alloc(nq, k), *wid = i64_alloc(nq, k);
    float *dist = f32_alloc(nq, k), *wd = f32_alloc(nq, k);
    xknn_matrix r = XKNN_MATRIX_F32(ref, n, d), q = XKNN_MATRIX_F32(qry, nq, d);
    xknn_params p = XKNN_PARAMS_INIT;
    xknn_error err;
    xknn_status st;

    p.backend = XKNN_BACKEND_CUDA;
    p.device_memory_budget = 1000;
    st = xknn_search(&p, &r, &q, k, ids, dist, &err);
    is_int(st, XKNN_ERROR_OUT_OF_MEMORY, "budget of 1000 bytes: out of memory (%s)", err.message);
    ok(strstr(err.message, "budget") != NULL && strstr(err.message, "minimum") != NULL,
       "out-of-memory message names the budget and the minimum");

    p = xknn_params_default();
    p.backend = XKNN_BACKEND_CUDA;
    p.device = 9999;
    st = xknn_search(&p, &r, &q, k, ids, dist, &err);
    is_int(st, XKNN_ERROR_INVALID_ARGUMENT, "device ordinal 9999: invalid argument (%s)", err.message);
    ok(strstr(err.message, "9999") != NULL, "bad-ordinal message names the ordinal");

    p = xknn_params_default();
    p.backend = XKNN_BACKEND_CUDA;
    p.cuda_path = 7;
    st = xknn_search(&p, &r, &q, k, ids, dist, &err);
    is_int(st, XKNN_ERROR_INVALID_ARGUMENT, "cuda_path 7: invalid argument (%s)", err.message);

    /* reference slices (the > 2^31 rows path) merged on the host */
    if (ref_knn(REF_L2, ref, n, d, qry, nq, d, d, k, 0, 0, 0, wid, wd) != 0) bail("oracle out of memory");
    setenv("XKNN_CUDA_REF_SLICE", "777", 1);
    p = xknn_params_default();
    p.backend = XKNN_BACKEND_CUDA;
    st = xknn_search(&p, &r, &q, k, ids, dist, &err);
    unsetenv("XKNN_CUDA_REF_SLICE");
    if (st != XKNN_SUCCESS)
        ok(0, "reference slices of 777 rows: %s", err.message);
    else
        is_knn_equal(ids, dist, wid, wd, nq, k, "reference slices of 777 rows, merged");

    /* self-join in slices: exclusion by global id across slices */
    {
        int64_t *sid = i64_alloc(n, k), *swid = i64_alloc(n, k);
        float *sd = f32_alloc(n, k), *swd = f32_alloc(n, k);
        if (ref_knn(REF_EUCLIDEAN, ref, n, d, NULL, n, d, d, k, 1, 0, 0, swid, swd) != 0) bail("oracle out of memory");
        setenv("XKNN_CUDA_REF_SLICE", "1001", 1);
        p = xknn_params_default();
        p.backend = XKNN_BACKEND_CUDA;
        p.metric = XKNN_METRIC_EUCLIDEAN;
        st = xknn_search(&p, &r, NULL, k, sid, sd, &err);
        unsetenv("XKNN_CUDA_REF_SLICE");
        if (st != XKNN_SUCCESS)
            ok(0, "self-join in slices of 1001 rows: %s", err.message);
        else
            is_knn_equal(sid, sd, swid, swd, n, k, "self-join in slices of 1001 rows, merged");
        FREE_ALL(sid, swid, sd, swd);
    }
    FREE_ALL(ref, qry, ids, wid, dist, wd);
}
#define NERRORS 7

/* ---- the embedding API on device buffers (26 tests) --------------------------------- */
#define NDEVICE 26
#ifdef XKNN_TEST_HAVE_CUDA_RT
#define CK(call)                                                                                       \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) bail("%s failed: %s (line %d)", #call, cudaGetErrorString(e_), __LINE__); \
    } while (0)

typedef struct {
    float *ref, *qry, *dist;
    int64_t *ids;
    void *ws;
} dbufs;

/* One device-API search; results copied back into host ids/dist; returns the status and
 * fills stats (may be NULL) from the workspace head. */
static xknn_status dsearch(xknn_cuda_context *ctx, const xknn_params *p, const float *ref, int64_t n, const float *qry,
                           int64_t nq, int64_t d, int64_t k, int64_t *ids, float *dist, size_t ws_bytes,
                           size_t ws_offset, unsigned long long *stats, xknn_error *err)
{
    dbufs b;
    cudaStream_t s;
    xknn_matrix r = XKNN_MATRIX_F32(NULL, n, d), q = XKNN_MATRIX_F32(NULL, nq, d);
    xknn_status st;
    memset(&b, 0, sizeof b);
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&b.ref, (size_t)(n * d) * sizeof(float)));
    CK(cudaMemcpy(b.ref, ref, (size_t)(n * d) * sizeof(float), cudaMemcpyHostToDevice));
    if (qry) {
        CK(cudaMalloc((void **)&b.qry, (size_t)(nq * d) * sizeof(float)));
        CK(cudaMemcpy(b.qry, qry, (size_t)(nq * d) * sizeof(float), cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc((void **)&b.ids, (size_t)(nq * k) * sizeof(int64_t)));
    CK(cudaMemset(b.ids, 0xab, (size_t)(nq * k) * sizeof(int64_t)));
    if (dist) {
        CK(cudaMalloc((void **)&b.dist, (size_t)(nq * k) * sizeof(float)));
        CK(cudaMemset(b.dist, 0xab, (size_t)(nq * k) * sizeof(float)));
    }
    CK(cudaMalloc(&b.ws, ws_bytes + ws_offset));
    r.data = b.ref;
    q.data = b.qry;
    st = xknn_cuda_search(ctx, p, &r, qry ? &q : NULL, k, b.ids, b.dist, (char *)b.ws + ws_offset, ws_bytes, err, s);
    CK(cudaStreamSynchronize(s));
    if (st == XKNN_SUCCESS) {
        CK(cudaMemcpy(ids, b.ids, (size_t)(nq * k) * sizeof(int64_t), cudaMemcpyDeviceToHost));
        if (dist) CK(cudaMemcpy(dist, b.dist, (size_t)(nq * k) * sizeof(float), cudaMemcpyDeviceToHost));
        if (stats)
            CK(cudaMemcpy(stats, b.ws, XKNN_CUDA_STAT_COUNT * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
    }
    CK(cudaFree(b.ws));
    CK(cudaFree(b.dist));
    CK(cudaFree(b.ids));
    CK(cudaFree(b.qry));
    CK(cudaFree(b.ref));
    CK(cudaStreamDestroy(s));
    return st;
}

/* dsearch with the workspace xknn_cuda_workspace_size asks for (its status when that fails) */
static xknn_status sized_dsearch(xknn_cuda_context *ctx, const xknn_params *p, const float *ref, int64_t n,
                                 const float *qry, int64_t nq, int64_t d, int64_t k, int64_t *ids, float *dist,
                                 unsigned long long *stats, xknn_error *err)
{
    size_t bytes = 0;
    const xknn_status st = xknn_cuda_workspace_size(ctx, p, n, nq, d, k, &bytes, err);
    return st == XKNN_SUCCESS ? dsearch(ctx, p, ref, n, qry, nq, d, k, ids, dist, bytes, 0, stats, err) : st;
}

static int cmp_first_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void run_device_api(void)
{
    xknn_cuda_context *ctx = NULL;
    xknn_error err;
    xknn_status st;
    xknn_params p = XKNN_PARAMS_INIT;
    const int64_t n = 3001, nq = 203, d = 64, k = 32;
    float *ref = make_matrix(DATA_GAUSSIAN, n, d, d, 11), *qry = make_matrix(DATA_GAUSSIAN, nq, d, d, 12);
    const int64_t ns = 1000; /* self-join on the first ns rows, k = ns - 1 */
    int64_t *ids = i64_alloc(ns, ns), *wid = i64_alloc(ns, ns);
    float *dist = f32_alloc(ns, ns), *wd = f32_alloc(ns, ns);
    size_t bytes = 0, small = 0;
    unsigned long long stats[XKNN_CUDA_STAT_COUNT];

    st = xknn_cuda_context_create(-1, &ctx, &err);
    is_int(st, XKNN_SUCCESS, "context on the current device (%s)", err.message);
    if (st != XKNN_SUCCESS) bail("no context: %s", err.message);

    st = xknn_cuda_workspace_size(ctx, &p, n, nq, d, k, &bytes, &err);
    ok(st == XKNN_SUCCESS && bytes > 0, "workspace size %zu bytes (%s)", bytes, err.message);

    ref_knn(REF_L2, ref, n, d, qry, nq, d, d, k, 0, 0, 0, wid, wd);
    st = dsearch(ctx, &p, ref, n, qry, nq, d, k, ids, dist, bytes, 0, stats, &err);
    is_knn_result(st, &err, ids, dist, wid, wd, nq, k, "device API, user stream, preferred workspace");
    ok(st == XKNN_SUCCESS && stats[XKNN_CUDA_STAT_UNRESOLVED] == 0 && stats[XKNN_CUDA_STAT_CANDIDATES] >= (unsigned long long)(nq * k),
       "workspace counters: %llu candidates, %llu bound and %llu exact compactions", stats[XKNN_CUDA_STAT_CANDIDATES],
       stats[XKNN_CUDA_STAT_BOUND_COMPACTIONS], stats[XKNN_CUDA_STAT_EXACT_COMPACTIONS]);

    /* a smaller workspace: the plan shrinks (query blocks, tiles), results do not change */
    p.device_memory_budget = (size_t)3 << 20;
    p.cuda_path = XKNN_CUDA_PATH_TF32;
    p.metric = XKNN_METRIC_EUCLIDEAN;
    st = xknn_cuda_workspace_size(ctx, &p, n, nq, d, k, &small, &err);
    if (st == XKNN_SUCCESS) st = dsearch(ctx, &p, ref, n, qry, nq, d, k, ids, dist, small, 0, NULL, &err);
    ref_knn(REF_EUCLIDEAN, ref, n, d, qry, nq, d, d, k, 0, 0, 0, wid, wd);
    is_knn_result(st, &err, ids, dist, wid, wd, nq, k, "device API, %zu-byte workspace, tf32, euclidean", small);

    /* self-join on the device, k = n - 1, ids only */
    p = xknn_params_default();
    st = sized_dsearch(ctx, &p, ref, ns, NULL, ns, d, ns - 1, ids, NULL, NULL, &err);
    ref_knn(REF_L2, ref, ns, d, NULL, ns, d, d, ns - 1, 1, 0, 0, wid, wd);
    if (st != XKNN_SUCCESS)
        ok(0, "device API self-join k=n-1, dist NULL: %s", err.message);
    else
        is_knn_equal(ids, NULL, wid, NULL, ns, ns - 1, "device API self-join n=%lld k=n-1, dist NULL", (long long)ns);

    /* heavy ties: the buffer fills and exact compaction must keep the result exact */
    {
        const int64_t hn = 20000, hq = 16, hd = 8, hk = 16;
        float *href = make_matrix(DATA_DUPLICATES, hn, hd, hd, 21), *hqry = make_matrix(DATA_DUPLICATES, hq, hd, hd, 22);
        p = xknn_params_default();
        p.cuda_path = XKNN_CUDA_PATH_FP32;
        p.ref_id_offset = 5;
        p.ref_block = 2048; /* one split per query: ~4000 ties per value reach one buffer */
        /* the cuBLAS tiles' filter (this shape's fp32 path is otherwise the CUDA-core passes) */
        setenv("XKNN_CUDA_FP32_CUBLAS", "1", 1);
        st = sized_dsearch(ctx, &p, href, hn, hqry, hq, hd, hk, ids, dist, stats, &err);
        unsetenv("XKNN_CUDA_FP32_CUBLAS");
        ref_knn(REF_L2, href, hn, hd, hqry, hq, hd, hd, hk, 0, 5, 0, wid, wd);
        is_knn_result(st, &err, ids, dist, wid, wd, hq, hk, "device API, 20000 rows of 5 distinct values");
        ok(st == XKNN_SUCCESS && stats[XKNN_CUDA_STAT_EXACT_COMPACTIONS] > 0,
           "heavy ties forced exact compactions (%llu)", stats[XKNN_CUDA_STAT_EXACT_COMPACTIONS]);
        /* the fp32 CUDA-core passes: ~4000 ties overflow the candidate slots, so every
         * query is re-run exactly */
        st = sized_dsearch(ctx, &p, href, hn, hqry, hq, hd, hk, ids, dist, stats, &err);
        is_knn_result(st, &err, ids, dist, wid, wd, hq, hk, "device API, fp32 CUDA-core passes, 20000 rows of 5 distinct values");
        ok(st == XKNN_SUCCESS && stats[XKNN_CUDA_STAT_RERUNS] > 0 && stats[XKNN_CUDA_STAT_UNRESOLVED] == 0,
           "fp32 CUDA-core passes: overflowed buffers re-run exactly (%llu of %lld queries)",
           stats[XKNN_CUDA_STAT_RERUNS], (long long)hq);
        /* the fused path: thousands of exact ties at the k-th distance cannot be certified
         * from a 32-key list, so every query must be re-run exactly */
        p.cuda_path = XKNN_CUDA_PATH_FUSED;
        st = sized_dsearch(ctx, &p, href, hn, hqry, hq, hd, hk, ids, dist, stats, &err);
        is_knn_result(st, &err, ids, dist, wid, wd, hq, hk, "device API, fused path, 20000 rows of 5 distinct values");
        ok(st == XKNN_SUCCESS && stats[XKNN_CUDA_STAT_RERUNS] > 0 && stats[XKNN_CUDA_STAT_UNRESOLVED] == 0,
           "fused path: failed certificates re-run exactly (%llu of %lld queries)", stats[XKNN_CUDA_STAT_RERUNS],
           (long long)hq);
        free(href);
        free(hqry);
    }

    /* estimated thresholds (engine.cu's plan_estimate: l2, large k). With the references
     * sorted by their first coordinate the witness prefix is no fair sample: queries on
     * one side get too small a tau (the certificate fails), the others too large a one
     * (buffers overflow); both are searched again exactly. XKNN_CUDA_NO_ESTIMATE=1 keeps
     * the rigorous tau: the same bytes. */
    {
        const int64_t en = 100000, eq = 64, ed = 4, ek = 512;
        float *eref = make_matrix(DATA_UNIFORM, en, ed, ed, 31), *eqry = make_matrix(DATA_UNIFORM, eq, ed, ed, 32);
        unsigned long long reruns[2] = {0, 0};
        int pass;
        p = xknn_params_default();
        p.cuda_path = XKNN_CUDA_PATH_MMA;
        /* passes 2 and 3: the re-rank by reference range with ranges of 1/64 of the L2
         * (several ranges here) */
        for (pass = 0; pass < 4; pass++) {
            const char *what = pass == 0   ? "uniform"
                               : pass == 1 ? "uniform, reference ranges"
                               : pass == 2 ? "sorted by the first coordinate, reference ranges"
                                           : "sorted, XKNN_CUDA_NO_ESTIMATE=1";
            if (pass == 2) qsort(eref, (size_t)en, (size_t)ed * sizeof(float), cmp_first_float);
            if (pass == 1 || pass == 2) setenv("XKNN_CUDA_RESOLVE_RANGES", "64", 1);
            if (pass == 3) setenv("XKNN_CUDA_NO_ESTIMATE", "1", 1);
            st = sized_dsearch(ctx, &p, eref, en, eqry, eq, ed, ek, ids, dist, stats, &err);
            unsetenv("XKNN_CUDA_RESOLVE_RANGES");
            unsetenv("XKNN_CUDA_NO_ESTIMATE");
            if ((pass == 0 || pass == 2) && st == XKNN_SUCCESS) reruns[pass / 2] = stats[XKNN_CUDA_STAT_RERUNS];
            if (pass == 0 || pass == 2) ref_knn(REF_L2, eref, en, ed, eqry, eq, ed, ed, ek, 0, 0, 0, wid, wd);
            if (st != XKNN_SUCCESS)
                ok(0, "device API, k=512 estimated tau, %s: %s", what, err.message);
            else
                is_knn_equal(ids, dist, wid, wd, eq, ek, "device API, k=512 estimated tau, %s (%llu re-runs)", what,
                             stats[XKNN_CUDA_STAT_RERUNS]);
        }
        ok(reruns[1] > 0, "sorted references: failed certificates or overflows re-run (%llu of %lld queries; uniform: %llu)",
           reruns[1], (long long)eq, reruns[0]);
        free(eref);
        free(eqry);
    }

    /* centred rows (engine.cu's center_wanted; XKNN_CUDA_CENTER=1 here) with a NaN and an
     * infinite reference among the rows whose mean they are centred on (rows 0 and 4 of
     * 20000 are in its sample): the mean leaves them out, so only their own pairs are
     * candidates and no query is searched again. (A NaN mean made every centred row NaN,
     * every pair a candidate and every query a re-run: exact, but slow.) */
    {
        const int64_t cn = 20000, cq = 500, cd = 32, ck = 10;
        float *cref = make_matrix(DATA_UNIFORM, cn, cd, cd, 41), *cqry = make_matrix(DATA_UNIFORM, cq, cd, cd, 42);
        cref[0 * cd + 3] = NAN;
        cref[4 * cd + 7] = INFINITY;
        p = xknn_params_default();
        p.cuda_path = XKNN_CUDA_PATH_MMA;
        setenv("XKNN_CUDA_CENTER", "1", 1);
        st = sized_dsearch(ctx, &p, cref, cn, cqry, cq, cd, ck, ids, dist, stats, &err);
        unsetenv("XKNN_CUDA_CENTER");
        ref_knn(REF_L2, cref, cn, cd, cqry, cq, cd, cd, ck, 0, 0, 0, wid, wd);
        is_knn_result(st, &err, ids, dist, wid, wd, cq, ck, "device API, centred rows, a NaN and an infinite reference in the mean's sample");
        ok(st == XKNN_SUCCESS && stats[XKNN_CUDA_STAT_RERUNS] == 0,
           "centred rows with a NaN and an infinite reference: no query re-run (%llu of %lld)",
           st == XKNN_SUCCESS ? stats[XKNN_CUDA_STAT_RERUNS] : 0ull, (long long)cq);
        free(cref);
        free(cqry);
    }

    /* offsets + exclude_self through the device API */
    p = xknn_params_default();
    p.ref_id_offset = 100;
    p.query_id_offset = 150;
    p.exclude_self = 1;
    st = sized_dsearch(ctx, &p, ref, n, ref + 50 * d, nq, d, k, ids, dist, NULL, &err);
    ref_knn(REF_L2, ref, n, d, ref + 50 * d, nq, d, d, k, 1, 100, 150, wid, wd);
    is_knn_result(st, &err, ids, dist, wid, wd, nq, k, "device API, id offsets and exclude_self");

    /* ip and cosine on device arrays (the tensor-core path), other metrics refused */
    {
        const int64_t k5 = 5;
        ref_spec spec;
        memset(&spec, 0, sizeof spec);
        spec.dtype = REF_F32;
        p = xknn_params_default();
        p.metric = XKNN_METRIC_IP;
        p.ref_id_offset = 7;
        spec.metric = REF_IP;
        st = sized_dsearch(ctx, &p, ref, n, qry, nq, d, k5, ids, dist, stats, &err);
        ref_knn_ex(&spec, ref, n, d, qry, nq, d, d, k5, 0, 7, 0, wid, wd);
        if (st != XKNN_SUCCESS)
            ok(0, "device API, ip: %s", err.message);
        else
            is_knn_equal(ids, dist, wid, wd, nq, k5, "device API, ip (%llu candidates)",
                         stats[XKNN_CUDA_STAT_CANDIDATES]);
        p.metric = XKNN_METRIC_COSINE;
        p.ref_id_offset = 0;
        spec.metric = REF_COSINE;
        st = sized_dsearch(ctx, &p, ref, n, NULL, n, d, k5, ids, dist, NULL, &err);
        {
            int64_t *sid = i64_alloc(n, k5);
            float *sd = f32_alloc(n, k5);
            ref_knn_ex(&spec, ref, n, d, NULL, n, d, d, k5, 1, 0, 0, sid, sd);
            if (st != XKNN_SUCCESS)
                ok(0, "device API, cosine self-join: %s", err.message);
            else
                is_knn_equal(ids, dist, sid, sd, n, k5, "device API, cosine self-join n=%lld", (long long)n);
            free(sid);
            free(sd);
        }
        p.metric = XKNN_METRIC_L1;
        st = xknn_cuda_workspace_size(ctx, &p, n, nq, d, k5, &bytes, &err);
        is_int(st, XKNN_ERROR_INVALID_ARGUMENT, "device API, l1: invalid argument (%s)", err.message);
    }

    /* errors: workspace below the minimum, misaligned workspace */
    p = xknn_params_default();
    st = dsearch(ctx, &p, ref, n, qry, nq, d, k, ids, dist, 1024, 0, NULL, &err);
    is_int(st, XKNN_ERROR_OUT_OF_MEMORY, "1 KiB workspace: out of memory (%s)", err.message);
    st = xknn_cuda_workspace_size(ctx, &p, n, nq, d, k, &bytes, &err);
    st = dsearch(ctx, &p, ref, n, qry, nq, d, k, ids, dist, bytes, 8, NULL, &err);
    is_int(st, XKNN_ERROR_INVALID_ARGUMENT, "misaligned workspace: invalid argument (%s)", err.message);

    /* the host path reusing the context */
    {
        xknn_matrix r = XKNN_MATRIX_F32(ref, n, d), q = XKNN_MATRIX_F32(qry, nq, d);
        p = xknn_params_default();
        p.backend = XKNN_BACKEND_CUDA;
        p.cuda_context = ctx;
        ref_knn(REF_L2, ref, n, d, qry, nq, d, d, k, 0, 0, 0, wid, wd);
        st = xknn_search(&p, &r, &q, k, ids, dist, &err);
        is_knn_result(st, &err, ids, dist, wid, wd, nq, k, "host path with params.cuda_context");
    }
    xknn_cuda_context_destroy(ctx);
    FREE_ALL(ref, qry, ids, wid, dist, wd);
}
#else
static void run_device_api(void) { skip(NDEVICE, "test built without the CUDA runtime headers"); }
#endif

int main(void)
{
    int i;
    if (!xknn_backend_built(XKNN_BACKEND_CUDA) || xknn_cuda_device_count() == 0) skip_all("no CUDA device");
    quick = getenv("XKNN_CUDA_TEST_QUICK") ? atoi(getenv("XKNN_CUDA_TEST_QUICK")) : 0;
    plan(2 * NCASES + NEXTREME + NERRORS + NDEVICE);
    for (i = 0; i < NCASES; i++) run_case(&cases[i]);
    run_extreme();
    run_errors();
    run_device_api();
    return tap_done();
}
