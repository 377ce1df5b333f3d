/* SPDX-License-Identifier: MIT */
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

/* One candidate of a query; ref_pair_cmp (for qsort) orders by (d, id). */
typedef struct { float d; int64_t id; } ref_pair;
int ref_pair_cmp(const void *pa, const void *pb);

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

/* ---- every metric and dtype ------------------------------------------------------ */
/* Metric and dtype numbers are those of xknn_metric / xknn_dtype (the tests check it). */
enum {
    REF_L1 = 2, REF_MINKOWSKI, REF_CHEBYSHEV, REF_IP, REF_COSINE, REF_HELLINGER, REF_HAMMING, REF_WHAMMING
};
enum { REF_F32 = 0, REF_F16, REF_BF16, REF_U8, REF_I8, REF_BIN };

typedef struct ref_spec {
    int metric;            /* REF_L2 ... REF_WHAMMING                             */
    int dtype;             /* REF_F32 ... REF_BIN                                 */
    double p;              /* minkowski exponent (>= 1)                           */
    const float *weights;  /* whamming: one per bit                               */
} ref_spec;

/* The canonical value of xknn.h's METRICS, written from that text (the reported value:
 * the inner product itself for ip). a, b: one row each; d elements (bits for REF_BIN:
 * rows of ceil(d/64) uint64 words, bits past d ignored). Only the non-integer
 * Minkowski power and root come from the library's shared source, as docs/DESIGN.md
 * section 2 demands one implementation of transcendental steps. */
float ref_distance_ex(const ref_spec *s, const void *a, const void *b, int64_t d);

/* ref_knn for any metric/dtype: ldr/ldq in elements (words for REF_BIN); order by
 * (value, id), by (-value, id) for ip; padding id -1 with +inf (-inf for ip). */
int ref_knn_ex(const ref_spec *s, const void *ref, int64_t n, int64_t ldr, const void *query, int64_t nq,
               int64_t ldq, int64_t d, int64_t k, int exclude_self, int64_t ref_off, int64_t query_off,
               int64_t *ids, float *dist);

/* Bytes per element of a dtype (REF_BIN: per uint64 word) and elements per row. */
int ref_elem_bytes(int dtype);
int64_t ref_row_elems(int dtype, int64_t d);

/* rows x d values of dtype (row stride ref_row_elems) made from ref_make_data's floats:
 * f16/bf16 by truncating the float's bits, u8/i8 from an integer map of each kind,
 * BIN: random bits (DATA_INTEGER: sparse bits; DATA_DUPLICATES: 5 distinct rows), with
 * junk in the unused bits of the last word. Returns a malloc'ed buffer (NULL on
 * failure). */
void *ref_make_typed(data_kind kind, int dtype, int64_t rows, int64_t d, uint64_t seed);

/* count values of dtype made non-negative in place (hellinger's inputs): |v| for f32,
 * f16, bf16 (sign bit cleared) and i8 (-128 becomes 127); u8 and BIN unchanged. */
void ref_make_nonnegative(int dtype, void *x, int64_t count);

#ifdef __cplusplus
}
#endif

#endif
