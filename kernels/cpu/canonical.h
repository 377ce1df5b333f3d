/* SPDX-License-Identifier: MIT */
/* Private: canonical distance kernels of the CPU backend (kernels/cpu). */
#ifndef XKNN_CPU_CANONICAL_H
#define XKNN_CPU_CANONICAL_H

#include <math.h>
#include <stdint.h>

#include "xknn/impl/backend.h"

/* Hot loops are compiled twice on x86-64 with GCC or clang: for AVX2+FMA and portable,
 * chosen at run time from the CPU's feature bits. Both give identical bits: fma() is
 * correctly rounded whether the instruction exists or libm emulates it, and every other
 * operation is a single IEEE operation in a fixed order (-ffp-contract=off).
 * XKNN__DISPATCH(name, args) defines name(args) calling name_body through the best clone. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(XKNN_NO_CLONES)
#define XKNN__HAVE_CLONES 1
#define XKNN__INLINE_BODY static inline __attribute__((always_inline))
#define XKNN__TARGET_FAST __attribute__((target("avx2,fma")))
static inline int xknn__cpu_has_fast(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#else
#define XKNN__INLINE_BODY static inline
#define XKNN__TARGET_FAST
static inline int xknn__cpu_has_fast(void) { return 0; }
#endif

static inline float xknn__finish(xknn_metric metric, double acc)
{
    return metric == XKNN_METRIC_EUCLIDEAN ? (float)sqrt(acc) : (float)acc;
}

void xknn__canonical_many(xknn_metric metric, const float *q, const float *ref, int64_t ldr,
                          const int64_t *rows, int64_t count, int64_t d, float *out);
void xknn__canonical_block(xknn_metric metric, const float *q, const float *rt, int64_t ldt,
                           int64_t nb, int64_t d, double *acc, float *out);
void xknn__sqnorms(const float *x, int64_t rows, int64_t ld, int64_t d, double *out);

/* kernels/cpu/int8_search.c: u8/i8 with l2, euclidean, ip, exact in integers. */
int xknn__cpu_int8_applies(const xknn__job *job);
xknn_status xknn__cpu_int8(const xknn__job *job);

/* kernels/cpu/gemm_ip.c (CBLAS only): f32 ip and cosine through certified sgemm
 * candidates; returns (xknn_status)-1 when values or sizes are out of its range. */
xknn_status xknn__cpu_gemm_ip(const xknn__job *job);

#endif
