/* Private: canonical distance kernels of the CPU backend (kernels/cpu). */
#ifndef XKNN_CPU_CANONICAL_H
#define XKNN_CPU_CANONICAL_H

#include <math.h>
#include <stdint.h>

#include "xknn/impl/backend.h"

/* On x86-64 with GCC or clang, compile hot loops twice: with FMA/AVX2 and portable.
 * Both give identical bits (fma() is correctly rounded either way). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(XKNN_NO_CLONES)
#define XKNN__FMA_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define XKNN__FMA_CLONES
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

#endif
