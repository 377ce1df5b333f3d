/* SPDX-License-Identifier: MIT */
/* Minimal TAP producer for the xknn tests (plan, ok, is_int, is_double, diag,
 * skip_all, bail) and the k-NN comparator is_knn_equal(). */
#ifndef XKNN_TAP_H
#define XKNN_TAP_H

#include <stdint.h>

#if defined(__GNUC__)
#define TAP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define TAP_NORETURN __attribute__((noreturn))
#else
#define TAP_PRINTF(a, b)
#define TAP_NORETURN
#endif

#ifdef __cplusplus
extern "C" {
#endif

void plan(int n);
int ok(int cond, const char *fmt, ...) TAP_PRINTF(2, 3);
int is_int(long long got, long long want, const char *fmt, ...) TAP_PRINTF(3, 4);
int is_double(double got, double want, double tol, const char *fmt, ...) TAP_PRINTF(4, 5);
int is_string(const char *got, const char *want, const char *fmt, ...) TAP_PRINTF(3, 4);
void diag(const char *fmt, ...) TAP_PRINTF(1, 2);
void skip(int n, const char *fmt, ...) TAP_PRINTF(2, 3);
TAP_NORETURN void skip_all(const char *fmt, ...) TAP_PRINTF(1, 2);
TAP_NORETURN void bail(const char *fmt, ...) TAP_PRINTF(1, 2);
/* free() each of the n pointers p[0..n-1] (NULL ones too); FREE_ALL(a, b, ...) frees
 * its arguments. */
void free_all(void *const *p, int n);
#define FREE_ALL(...) free_all((void *[]){__VA_ARGS__}, (int)(sizeof((void *[]){__VA_ARGS__}) / sizeof(void *)))
/* Ends the test: exit status 0 when every planned test ran and passed. */
int tap_done(void);

/* ids and distance bits equal for all nq x k entries; on mismatch prints the first
 * differing query with both lists around the difference. */
int is_knn_equal(const int64_t *ids, const float *dist, const int64_t *want_ids, const float *want_dist,
                 int64_t nq, int64_t k, const char *fmt, ...) TAP_PRINTF(7, 8);

#ifdef __cplusplus
}
#endif

#endif
