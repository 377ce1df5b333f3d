/*
 * The oracle: naive double-precision exact k-NN, kept forever (HPCG's _ref idea).
 * It shares no code with the library: every pair's distance is accumulated in double
 * in dimension order with fma and rounded once to float; all n pairs are sorted by
 * (distance, global id) and the first k kept. Slow by design.
 *
 * Also: deterministic test-data makers (splitmix64), the same on every machine.
 */
#ifndef XKNN_TEST_REF_H
#define XKNN_TEST_REF_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { REF_L2 = 0, REF_EUCLIDEAN = 1 };

/* ref: n x d (row stride ldr), query: nq x d (row stride ldq); query == NULL: self-join.
 * exclude_self: skip the reference whose global id (ref_off + j) equals the query's
 * (query_off + i). Writes nq x k ids/dist; entries beyond the available references get
 * id -1 and +inf. Returns 0, or -1 on allocation failure. */
int ref_knn(int metric, const float *ref, int64_t n, int64_t ldr, const float *query, int64_t nq, int64_t ldq,
            int64_t d, int64_t k, int exclude_self, int64_t ref_off, int64_t query_off, int64_t *ids,
            float *dist);

/* The canonical distance, written independently of the library. */
float ref_distance(int metric, const float *a, const float *b, int64_t d);

/* Deterministic generators. */
uint64_t ref_rand_u64(uint64_t *state);
double ref_rand_unit(uint64_t *state); /* [0, 1) */

typedef enum {
    DATA_UNIFORM = 0,  /* uniform [-1, 1)                                         */
    DATA_GAUSSIAN,     /* standard normal                                         */
    DATA_INTEGER,      /* integers in [0, 4): many equal distances                */
    DATA_DUPLICATES,   /* a few distinct rows repeated many times                 */
    DATA_CLUSTERED,    /* tight clusters: near-equal neighbour distances          */
    DATA_KIND_COUNT
} data_kind;

/* Fills rows x d floats (row stride d). */
void ref_make_data(data_kind kind, float *x, int64_t rows, int64_t d, uint64_t seed);
const char *ref_data_name(data_kind kind);

#ifdef __cplusplus
}
#endif

#endif
