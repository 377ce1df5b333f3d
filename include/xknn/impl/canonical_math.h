/* SPDX-License-Identifier: MIT */
/*
 * xknn/impl/canonical_math.h -- the canonical distance definitions, one source for the
 * host (C99) and the device (CUDA). Private: not part of the public API.
 *
 * Every function here is static inline and marked XKNN__HD, which expands to
 * __host__ __device__ under nvcc, so the CPU and CUDA backends compile the SAME text.
 * Only IEEE operations that are correctly rounded on both sides are used: +, -, *, /,
 * sqrt, fabs, fma. Every multiply-add is written as an explicit fma() and no other
 * expression multiplies and adds in one statement, so a compiler that contracts (nvcc
 * does by default) finds nothing to contract. No libm transcendental is called: the
 * logarithm and exponential below are written here (docs/DESIGN.md section 2.2).
 *
 * The definitions (what is accumulated, in which order, where the single rounding is)
 * are documented with the metrics in include/xknn.h; this file implements them.
 */
#ifndef XKNN_IMPL_CANONICAL_MATH_H
#define XKNN_IMPL_CANONICAL_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../xknn.h"

#if defined(__CUDACC__)
#define XKNN__HD __host__ __device__
#else
#define XKNN__HD
#endif

/* Integer Minkowski exponents up to this value are computed by repeated multiplication;
 * other exponents by xknn__cm_pow's exp/log. */
#define XKNN_MINKOWSKI_INT_MAX 64

/* Additions and multiplications that no compiler may contract into an fma: the CUDA
 * intrinsics are never contracted; host code is compiled with -ffp-contract=off. */
static inline XKNN__HD double xknn__cm_add(double a, double b)
{
#if defined(__CUDA_ARCH__)
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

static inline XKNN__HD double xknn__cm_mul(double a, double b)
{
#if defined(__CUDA_ARCH__)
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

/* ---- element conversion (all exact) ------------------------------------------------ */

/* IEEE binary16 bits -> double, exactly (subnormals, Inf and NaN included). */
static inline XKNN__HD double xknn__cm_f16(uint16_t h)
{
    const int sign = h >> 15, e = (h >> 10) & 0x1f;
    const uint32_t m = h & 0x3ffu;
    double v;
    if (e == 0x1f) {
        v = m ? NAN : INFINITY;
    } else if (e == 0) {
        v = (double)m * 5.960464477539063e-08; /* subnormal: m * 2^-24, exact */
    } else {
        uint64_t bits = ((uint64_t)(e - 15 + 1023) << 52) | ((uint64_t)m << 42);
        memcpy(&v, &bits, sizeof v);
    }
    return sign ? -v : v;
}

/* bfloat16 bits -> double, exactly (the high half of a float32). */
static inline XKNN__HD double xknn__cm_bf16(uint16_t h)
{
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return (double)f;
}

/* Number of set bits of a 64-bit word. */
static inline XKNN__HD int xknn__cm_popcount(uint64_t x)
{
#if defined(__CUDA_ARCH__)
    return __popcll(x);
#elif defined(__GNUC__) || defined(__clang__)
    return __builtin_popcountll(x);
#else
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (int)((x * 0x0101010101010101ull) >> 56);
#endif
}

/* ---- logarithm and exponential (double, about 1 ulp, deterministic) ------------- */

/* 2^e for an integer e in [-1022, 1023], exactly. */
static inline XKNN__HD double xknn__cm_pow2i(int e)
{
    const uint64_t bits = (uint64_t)(e + 1023) << 52;
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* Natural logarithm of a finite x > 0. x = 2^e m with m in [sqrt(1/2), sqrt(2)),
 * log m = 2 atanh(s), s = (m - 1)/(m + 1), |s| < 0.1716, by its series to s^25
 * (next term < 2^-60 relative), Horner with fma; then e ln2 in two parts. */
static inline XKNN__HD double xknn__cm_log(double x)
{
    uint64_t bits;
    int e;
    double m, s, z, r;
    memcpy(&bits, &x, sizeof bits);
    e = (int)((bits >> 52) & 0x7ff);
    if (e == 0) { /* subnormal: scale into the normal range first (exact) */
        x = x * 1.8014398509481984e+16;
        memcpy(&bits, &x, sizeof bits);
        e = (int)((bits >> 52) & 0x7ff) - 54;
    }
    e -= 1023;
    bits = (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull; /* m in [1, 2) */
    memcpy(&m, &bits, sizeof m);
    if (m > 1.4142135623730951) {
        m = m * 0.5;
        e += 1;
    }
    s = (m - 1.0) / (m + 1.0);
    z = s * s;
    r = 1.0 / 25;
    r = fma(r, z, 1.0 / 23);
    r = fma(r, z, 1.0 / 21);
    r = fma(r, z, 1.0 / 19);
    r = fma(r, z, 1.0 / 17);
    r = fma(r, z, 1.0 / 15);
    r = fma(r, z, 1.0 / 13);
    r = fma(r, z, 1.0 / 11);
    r = fma(r, z, 1.0 / 9);
    r = fma(r, z, 1.0 / 7);
    r = fma(r, z, 1.0 / 5);
    r = fma(r, z, 1.0 / 3);
    r = r * z;              /* s^2 (1/3 + s^2/5 + ...)      */
    r = fma(r, s, s);       /* s + s^3/3 + ...             */
    r = r * 2.0;            /* log m                        */
    /* e ln2: ln2 = 0.6931471805598903 + 5.497923018708371e-14 (hi has 43 bits: e*hi exact) */
    return xknn__cm_add(fma((double)e, 5.497923018708371e-14, r), xknn__cm_mul((double)e, 0.6931471805598903));
}

/* e^x for finite x. x = k ln2 + r, |r| <= ln2/2 (k = nearest integer to x/ln2), e^r by
 * its Taylor series to r^17 with fma, times 2^k in two exact steps. */
static inline XKNN__HD double xknn__cm_exp(double x)
{
    double kd, r, p;
    int k, k1;
    if (x > 709.78) return INFINITY;
    if (x < -745.2) return 0.0;
    kd = x * 1.4426950408889634; /* x / ln2, rounded; k need not be exact nearest */
    kd = kd < 0 ? -floor(-kd + 0.5) : floor(kd + 0.5);
    k = (int)kd;
    /* r = x - k ln2 with ln2 in two parts; k*hi is exact (|k| < 2^11, hi has 43 bits) */
    r = fma(-kd, 0.6931471805598903, x);
    r = fma(-kd, 5.497923018708371e-14, r);
    p = 1.0 / 355687428096000.0; /* 1/17! */
    p = fma(p, r, 1.0 / 20922789888000.0);
    p = fma(p, r, 1.0 / 1307674368000.0);
    p = fma(p, r, 1.0 / 87178291200.0);
    p = fma(p, r, 1.0 / 6227020800.0);
    p = fma(p, r, 1.0 / 479001600.0);
    p = fma(p, r, 1.0 / 39916800.0);
    p = fma(p, r, 1.0 / 3628800.0);
    p = fma(p, r, 1.0 / 362880.0);
    p = fma(p, r, 1.0 / 40320.0);
    p = fma(p, r, 1.0 / 5040.0);
    p = fma(p, r, 1.0 / 720.0);
    p = fma(p, r, 1.0 / 120.0);
    p = fma(p, r, 1.0 / 24.0);
    p = fma(p, r, 1.0 / 6.0);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    /* scale by 2^k: split so that each factor is a normal power of two */
    k1 = k / 2;
    return (p * xknn__cm_pow2i(k1)) * xknn__cm_pow2i(k - k1);
}

/* 1 if p is an integer in [1, XKNN_MINKOWSKI_INT_MAX]. */
static inline XKNN__HD int xknn__cm_int_exponent(double p)
{
    return p >= 1.0 && p <= (double)XKNN_MINKOWSKI_INT_MAX && p == floor(p);
}

/* a^p for a >= 0 and p >= 1 (the Minkowski term |x_t - y_t|^p):
 * integer p <= XKNN_MINKOWSKI_INT_MAX: r = a, then p - 1 times r = r * a (left to right);
 * otherwise: 0 for a = 0, else exp(p * log(a)) with the functions above. */
static inline XKNN__HD double xknn__cm_pow_term(double a, double p)
{
    if (xknn__cm_int_exponent(p)) {
        const int n = (int)p;
        double r = a;
        int i;
        for (i = 1; i < n; i++) r = xknn__cm_mul(r, a);
        return r;
    }
    if (a == 0.0) return 0.0;
    if (a == INFINITY) return INFINITY;
    return xknn__cm_exp(xknn__cm_mul(p, xknn__cm_log(a)));
}

/* The Minkowski root acc^(1/p) for acc >= 0: acc for p = 1, sqrt(acc) for p = 2,
 * otherwise 0 for acc = 0, else exp(log(acc) / p). */
static inline XKNN__HD double xknn__cm_root(double acc, double p)
{
    if (p == 1.0) return acc;
    if (p == 2.0) return sqrt(acc);
    if (acc == 0.0) return 0.0;
    if (acc == INFINITY) return INFINITY;
    return xknn__cm_exp(xknn__cm_log(acc) / p);
}

/* Cosine distance from the three dimension-ordered sums (dot = sum x_t y_t,
 * nx = sum x_t^2, ny = sum y_t^2, each with fma): 1 - dot / sqrt(nx * ny), clipped to
 * [0, 2]; 1 when either vector is zero (cos taken as 0). */
static inline XKNN__HD double xknn__cm_cosine(double dot, double nx, double ny)
{
    double c;
    if (nx == 0.0 || ny == 0.0) return 1.0;
    c = 1.0 - dot / sqrt(nx * ny);
    return c < 0.0 ? 0.0 : (c > 2.0 ? 2.0 : c);
}

/* ---- one canonical distance ---------------------------------------------------------- */

/* What a distance needs besides the two rows. weights: host or device memory matching
 * where the call runs (whamming only); p: the Minkowski exponent (>= 1). */
typedef struct xknn__cm_spec {
    xknn_metric metric;
    xknn_dtype dtype;
    double p;
    const float *weights;
} xknn__cm_spec;

/* One dimension of each real-valued metric: acc is the running sum (the running maximum
 * for chebyshev), x and y the two elements converted to double (hellinger: their square
 * roots). The row loops below and the CUDA tile kernels (kernels/cuda/generic.cu) both
 * call these, so every backend performs the same operations in the same order. Each is
 * symmetric in x and y bit for bit (|x - y| = |y - x|, (x - y)^2 = (y - x)^2, and the
 * product inside an fma is exact). */
static inline XKNN__HD double xknn__cm_step_l2(double acc, double x, double y)
{
    const double df = x - y;
    return fma(df, df, acc);
}
static inline XKNN__HD double xknn__cm_step_l1(double acc, double x, double y)
{
    return xknn__cm_add(acc, fabs(x - y));
}
/* Minkowski in scaled form, m (sum_t (|x_t - y_t| / m)^p)^(1/p) with m = max_t |x_t - y_t|
 * (the chebyshev accumulator of a first pass): every term is at most 1 and the largest is
 * exactly 1, so for any finite p >= 1 the sum lies in [1, d] and neither it nor the root
 * overflows or underflows. m = 0: every term is 0 (the pair is equal). */
static inline XKNN__HD double xknn__cm_step_minkowski(double acc, double x, double y, double p, double m)
{
    return m > 0.0 ? xknn__cm_add(acc, xknn__cm_pow_term(fabs(x - y) / m, p)) : acc;
}
static inline XKNN__HD double xknn__cm_minkowski(double acc, double p, double m)
{
    return m > 0.0 ? xknn__cm_mul(m, xknn__cm_root(acc, p)) : 0.0;
}
static inline XKNN__HD double xknn__cm_step_chebyshev(double acc, double x, double y)
{
    const double df = fabs(x - y);
    return df > acc ? df : acc;
}
static inline XKNN__HD double xknn__cm_step_ip(double acc, double x, double y) { return fma(x, y, acc); }

/* The reported value from the accumulator (every real-valued metric but cosine, whose
 * value needs the two norms: xknn__cm_cosine). */
static inline XKNN__HD float xknn__cm_finish(xknn_metric metric, double acc)
{
    switch (metric) {
    case XKNN_METRIC_EUCLIDEAN: return (float)sqrt(acc);
    case XKNN_METRIC_MINKOWSKI: return (float)acc; /* xknn__cm_minkowski's value */
    case XKNN_METRIC_HELLINGER: return (float)sqrt(acc * 0.5);
    default: return (float)acc; /* l2, l1, chebyshev, ip */
    }
}

/* Per element type: the rows as typed pointers, element t converted to double. */
#define XKNN__CM_LOAD_F32(row, t) ((double)((const float *)(row))[t])
#define XKNN__CM_LOAD_F16(row, t) xknn__cm_f16(((const uint16_t *)(row))[t])
#define XKNN__CM_LOAD_BF16(row, t) xknn__cm_bf16(((const uint16_t *)(row))[t])
#define XKNN__CM_LOAD_U8(row, t) ((double)((const uint8_t *)(row))[t])
#define XKNN__CM_LOAD_I8(row, t) ((double)((const int8_t *)(row))[t])

/* Inside xknn__cm_dist_<sfx>: acc folded over the d elements of rows a and b by step. */
#define XKNN__CM_FOLD(step, LOAD) for (t = 0; t < d; t++) acc = step(acc, LOAD(a, t), LOAD(b, t))

/* Defines xknn__cm_dist_<sfx>(spec, a, b, d): the canonical value (the reported one: the
 * inner product itself for ip) of two rows of d elements, every real-valued metric. */
#define XKNN__CM_DEFINE_DIST(sfx, LOAD)                                                                   \
    static inline XKNN__HD float xknn__cm_dist_##sfx(const xknn__cm_spec *s, const void *a,               \
                                                     const void *b, int64_t d)                            \
    {                                                                                                     \
        double acc = 0.0, nx = 0.0, ny = 0.0;                                                             \
        int64_t t;                                                                                        \
        switch (s->metric) {                                                                              \
        case XKNN_METRIC_L2:                                                                              \
        case XKNN_METRIC_EUCLIDEAN: XKNN__CM_FOLD(xknn__cm_step_l2, LOAD); break;                         \
        case XKNN_METRIC_L1: XKNN__CM_FOLD(xknn__cm_step_l1, LOAD); break;                                \
        case XKNN_METRIC_MINKOWSKI: /* nx: the largest |x_t - y_t| */                                     \
            for (t = 0; t < d; t++) nx = xknn__cm_step_chebyshev(nx, LOAD(a, t), LOAD(b, t));             \
            for (t = 0; t < d; t++) acc = xknn__cm_step_minkowski(acc, LOAD(a, t), LOAD(b, t), s->p, nx); \
            return (float)xknn__cm_minkowski(acc, s->p, nx);                                              \
        case XKNN_METRIC_CHEBYSHEV: XKNN__CM_FOLD(xknn__cm_step_chebyshev, LOAD); break;                  \
        case XKNN_METRIC_IP: XKNN__CM_FOLD(xknn__cm_step_ip, LOAD); break;                                \
        case XKNN_METRIC_COSINE:                                                                          \
            for (t = 0; t < d; t++) {                                                                     \
                const double x = LOAD(a, t), y = LOAD(b, t);                                              \
                acc = xknn__cm_step_ip(acc, x, y);                                                        \
                nx = xknn__cm_step_ip(nx, x, x);                                                          \
                ny = xknn__cm_step_ip(ny, y, y);                                                          \
            }                                                                                             \
            return (float)xknn__cm_cosine(acc, nx, ny);                                                   \
        case XKNN_METRIC_HELLINGER:                                                                       \
            for (t = 0; t < d; t++) acc = xknn__cm_step_l2(acc, sqrt(LOAD(a, t)), sqrt(LOAD(b, t)));      \
            break;                                                                                        \
        default: return NAN;                                                                              \
        }                                                                                                 \
        return xknn__cm_finish(s->metric, acc);                                                           \
    }

XKNN__CM_DEFINE_DIST(f32, XKNN__CM_LOAD_F32)
XKNN__CM_DEFINE_DIST(f16, XKNN__CM_LOAD_F16)
XKNN__CM_DEFINE_DIST(bf16, XKNN__CM_LOAD_BF16)
XKNN__CM_DEFINE_DIST(u8, XKNN__CM_LOAD_U8)
XKNN__CM_DEFINE_DIST(i8, XKNN__CM_LOAD_I8)

/* Bit-packed rows of `bits` bits (ceil(bits/64) words; bits past `bits` in the last
 * word are ignored). hamming: the number of differing bits, summed in integers over the
 * words, rounded once to float. whamming: sum of |w_b| over the differing bits b, in
 * increasing b, in double; rounded once to float. */
static inline XKNN__HD float xknn__cm_dist_bin(const xknn__cm_spec *s, const void *a, const void *b, int64_t bits)
{
    const uint64_t *x = (const uint64_t *)a, *y = (const uint64_t *)b;
    const int64_t words = (bits + 63) / 64;
    int64_t w;
    if (s->metric == XKNN_METRIC_HAMMING) {
        int64_t cnt = 0;
        for (w = 0; w < words; w++) {
            uint64_t v = x[w] ^ y[w];
            if (w == words - 1 && (bits & 63)) v &= (1ull << (bits & 63)) - 1;
            cnt += xknn__cm_popcount(v);
        }
        return (float)cnt;
    }
    if (s->metric == XKNN_METRIC_WHAMMING) {
        double acc = 0.0;
        for (w = 0; w < words; w++) {
            uint64_t v = x[w] ^ y[w];
            if (w == words - 1 && (bits & 63)) v &= (1ull << (bits & 63)) - 1;
            while (v) {
                const int bit = xknn__cm_popcount((v & (0 - v)) - 1); /* lowest set bit */
                acc = xknn__cm_add(acc, fabs((double)s->weights[w * 64 + bit]));
                v &= v - 1;
            }
        }
        return (float)acc;
    }
    return NAN;
}

/* The canonical value of any metric and dtype (d = cols: elements, or bits for BIN). */
static inline XKNN__HD float xknn__cm_distance(const xknn__cm_spec *s, const void *a, const void *b, int64_t d)
{
    switch (s->dtype) {
    case XKNN_DTYPE_F32: return xknn__cm_dist_f32(s, a, b, d);
    case XKNN_DTYPE_F16: return xknn__cm_dist_f16(s, a, b, d);
    case XKNN_DTYPE_BF16: return xknn__cm_dist_bf16(s, a, b, d);
    case XKNN_DTYPE_U8: return xknn__cm_dist_u8(s, a, b, d);
    case XKNN_DTYPE_I8: return xknn__cm_dist_i8(s, a, b, d);
    case XKNN_DTYPE_BIN: return xknn__cm_dist_bin(s, a, b, d);
    default: return NAN;
    }
}

#endif /* XKNN_IMPL_CANONICAL_MATH_H */
