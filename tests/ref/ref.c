/* SPDX-License-Identifier: MIT */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "xknn/impl/canonical_math.h" /* only the non-integer Minkowski power and root */

float ref_distance(int metric, const float *a, const float *b, int64_t d)
{
    double acc = 0.0;
    int64_t t;
    for (t = 0; t < d; t++) {
        const double diff = (double)a[t] - (double)b[t];
        acc = fma(diff, diff, acc);
    }
    return metric == REF_EUCLIDEAN ? (float)sqrt(acc) : (float)acc;
}

int ref_pair_cmp(const void *pa, const void *pb)
{
    const ref_pair *a = (const ref_pair *)pa, *b = (const ref_pair *)pb;
    if (a->d != b->d) return a->d < b->d ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

int ref_knn(int metric, const float *ref, int64_t n, int64_t ldr, const float *query, int64_t nq, int64_t ldq,
            int64_t d, int64_t k, int exclude_self, int64_t ref_off, int64_t query_off, int64_t *ids,
            float *dist)
{
    ref_pair *all;
    int64_t i, j;
    if (!query) /* the self-join: ref against itself, each query's own id excluded */
        return ref_knn(metric, ref, n, ldr, ref, n, ldr, d, k, 1, ref_off, ref_off, ids, dist);
    all = (ref_pair *)malloc((size_t)(n > 0 ? n : 1) * sizeof(ref_pair));
    if (!all) return -1;
    for (i = 0; i < nq; i++) {
        int64_t m = 0;
        for (j = 0; j < n; j++) {
            if (exclude_self && ref_off + j == query_off + i) continue;
            all[m].d = ref_distance(metric, query + i * ldq, ref + j * ldr, d);
            all[m].id = ref_off + j;
            m++;
        }
        qsort(all, (size_t)m, sizeof(ref_pair), ref_pair_cmp);
        for (j = 0; j < k; j++) {
            ids[i * k + j] = j < m ? all[j].id : -1;
            if (dist) dist[i * k + j] = j < m ? all[j].d : INFINITY;
        }
    }
    free(all);
    return 0;
}

uint64_t ref_rand_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double ref_rand_unit(uint64_t *s) { return (double)(ref_rand_u64(s) >> 11) * 0x1p-53; }

static double ref_gauss(uint64_t *s)
{
    double u1 = ref_rand_unit(s), u2 = ref_rand_unit(s);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

const char *ref_data_name(data_kind kind)
{
    static const char *const names[] = {"uniform", "gaussian", "integer", "duplicates", "clustered"};
    return (int)kind >= 0 && kind < DATA_KIND_COUNT ? names[kind] : "unknown";
}

void ref_make_data(data_kind kind, float *x, int64_t rows, int64_t d, uint64_t seed)
{
    uint64_t s = seed * 0x2545F4914F6CDD1Dull + 12345u;
    int64_t i, t;
    switch (kind) {
    case DATA_UNIFORM:
        for (i = 0; i < rows * d; i++) x[i] = (float)(2.0 * ref_rand_unit(&s) - 1.0);
        break;
    case DATA_GAUSSIAN:
        for (i = 0; i < rows * d; i++) x[i] = (float)ref_gauss(&s);
        break;
    case DATA_INTEGER:
        for (i = 0; i < rows * d; i++) x[i] = (float)(ref_rand_u64(&s) % 4);
        break;
    case DATA_DUPLICATES: {
        /* 5 distinct rows (integer-valued), each row a copy of one of them */
        float proto[5 * 1024];
        int64_t dd = d < 1024 ? d : 1024;
        for (i = 0; i < 5 * dd; i++) proto[i] = (float)(ref_rand_u64(&s) % 3);
        for (i = 0; i < rows; i++) {
            int64_t p = (int64_t)(ref_rand_u64(&s) % 5);
            for (t = 0; t < d; t++) x[i * d + t] = proto[p * dd + (t % dd)];
        }
        break;
    }
    case DATA_CLUSTERED: {
        /* 8 centres far apart; points within 1e-3 of a centre */
        for (i = 0; i < rows; i++) {
            int64_t c = (int64_t)(ref_rand_u64(&s) % 8);
            for (t = 0; t < d; t++)
                x[i * d + t] = (float)(100.0 * (double)((c * 7 + t * 3) % 11) + 1e-3 * ref_gauss(&s));
        }
        break;
    }
    default:
        for (i = 0; i < rows * d; i++) x[i] = 0.0f;
        break;
    }
}

/* ---- every metric and dtype ------------------------------------------------------------ */


int ref_elem_bytes(int dtype)
{
    static const int bytes[] = {4, 2, 2, 1, 1, 8};
    return dtype >= 0 && dtype <= REF_BIN ? bytes[dtype] : 0;
}

int64_t ref_row_elems(int dtype, int64_t d) { return dtype == REF_BIN ? (d + 63) / 64 : d; }

/* binary16 by its formula: (-1)^s 2^(e-15) (1 + m/1024), subnormal 2^-14 (m/1024) */
static double ref_half(uint16_t h)
{
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp((double)m / 1024.0, -14) : ldexp(1.0 + (double)m / 1024.0, e - 15);
    return s ? -v : v;
}

static double ref_bfloat(uint16_t h)
{
    const int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v = e == 0 ? ldexp((double)m / 128.0, -126) : ldexp(1.0 + (double)m / 128.0, e - 127);
    return s ? -v : v;
}

static double ref_elem(int dtype, const void *row, int64_t t)
{
    switch (dtype) {
    case REF_F16: return ref_half(((const uint16_t *)row)[t]);
    case REF_BF16: return ref_bfloat(((const uint16_t *)row)[t]);
    case REF_U8: return (double)((const uint8_t *)row)[t];
    case REF_I8: return (double)((const int8_t *)row)[t];
    default: return (double)((const float *)row)[t];
    }
}

static int ref_bit(const void *row, int64_t b) { return (int)((((const uint64_t *)row)[b / 64] >> (b % 64)) & 1u); }

float ref_distance_ex(const ref_spec *s, const void *a, const void *b, int64_t d)
{
    double acc = 0.0, na = 0.0, nb = 0.0;
    int64_t t;
    int i;
    switch (s->metric) {
    case REF_HAMMING:
    case REF_WHAMMING: {
        int64_t cnt = 0;
        for (t = 0; t < d; t++) {
            if (ref_bit(a, t) == ref_bit(b, t)) continue;
            cnt++;
            if (s->metric == REF_WHAMMING) acc = acc + fabs((double)s->weights[t]);
        }
        return s->metric == REF_HAMMING ? (float)cnt : (float)acc;
    }
    case REF_L2:
    case REF_EUCLIDEAN:
        for (t = 0; t < d; t++) {
            const double df = ref_elem(s->dtype, a, t) - ref_elem(s->dtype, b, t);
            acc = fma(df, df, acc);
        }
        return s->metric == REF_L2 ? (float)acc : (float)sqrt(acc);
    case REF_L1:
        for (t = 0; t < d; t++) acc = acc + fabs(ref_elem(s->dtype, a, t) - ref_elem(s->dtype, b, t));
        return (float)acc;
    case REF_MINKOWSKI: { /* m (sum (|x - y| / m)^p)^(1/p), m the largest |x - y| */
        const int integer = s->p == floor(s->p) && s->p <= 64;
        double m = 0.0;
        for (t = 0; t < d; t++) {
            const double df = fabs(ref_elem(s->dtype, a, t) - ref_elem(s->dtype, b, t));
            if (df > m) m = df;
        }
        if (m == 0.0) return 0.0f;
        for (t = 0; t < d; t++) {
            const double u = fabs(ref_elem(s->dtype, a, t) - ref_elem(s->dtype, b, t)) / m;
            double term = u;
            if (integer)
                for (i = 1; i < (int)s->p; i++) term = term * u;
            else
                term = xknn__cm_pow_term(u, s->p);
            acc = acc + term;
        }
        if (s->p == 1.0) return (float)(m * acc);
        if (s->p == 2.0) return (float)(m * sqrt(acc));
        return (float)(m * xknn__cm_root(acc, s->p));
    }
    case REF_CHEBYSHEV:
        for (t = 0; t < d; t++) {
            const double df = fabs(ref_elem(s->dtype, a, t) - ref_elem(s->dtype, b, t));
            acc = df > acc ? df : acc;
        }
        return (float)acc;
    case REF_IP:
        for (t = 0; t < d; t++) acc = fma(ref_elem(s->dtype, a, t), ref_elem(s->dtype, b, t), acc);
        return (float)acc;
    case REF_COSINE: {
        double c;
        for (t = 0; t < d; t++) {
            const double x = ref_elem(s->dtype, a, t), y = ref_elem(s->dtype, b, t);
            acc = fma(x, y, acc);
            na = fma(x, x, na);
            nb = fma(y, y, nb);
        }
        if (na == 0.0 || nb == 0.0) return 1.0f;
        c = 1.0 - acc / sqrt(na * nb);
        if (c < 0.0) c = 0.0;
        if (c > 2.0) c = 2.0;
        return (float)c;
    }
    case REF_HELLINGER:
        for (t = 0; t < d; t++) {
            const double df = sqrt(ref_elem(s->dtype, a, t)) - sqrt(ref_elem(s->dtype, b, t));
            acc = fma(df, df, acc);
        }
        return (float)sqrt(0.5 * acc);
    default:
        return NAN;
    }
}

int ref_knn_ex(const ref_spec *s, const void *ref, int64_t n, int64_t ldr, const void *query, int64_t nq,
               int64_t ldq, int64_t d, int64_t k, int exclude_self, int64_t ref_off, int64_t query_off,
               int64_t *ids, float *dist)
{
    const int eb = ref_elem_bytes(s->dtype);
    const int neg = s->metric == REF_IP;
    int fail = 0;
    if (!query) /* the self-join: ref against itself, each query's own id excluded */
        return ref_knn_ex(s, ref, n, ldr, ref, n, ldr, d, k, 1, ref_off, ref_off, ids, dist);
    /* Queries are independent: spread over OpenMP threads (each with its own list of all
     * n pairs); every query's list is the same as in one thread. */
#ifdef _OPENMP
#pragma omp parallel reduction(| : fail)
#endif
    {
        ref_pair *all = (ref_pair *)malloc((size_t)(n > 0 ? n : 1) * sizeof(ref_pair));
        int64_t i;
        if (!all) fail = 1;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 8)
#endif
        for (i = 0; i < nq; i++) {
            const void *q = (const unsigned char *)query + i * ldq * eb;
            int64_t m = 0, j;
            if (!all) continue;
            for (j = 0; j < n; j++) {
                float v;
                if (exclude_self && ref_off + j == query_off + i) continue;
                v = ref_distance_ex(s, q, (const unsigned char *)ref + j * ldr * eb, d);
                all[m].d = neg ? -v : v;
                all[m].id = ref_off + j;
                m++;
            }
            qsort(all, (size_t)m, sizeof(ref_pair), ref_pair_cmp);
            for (j = 0; j < k; j++) {
                ids[i * k + j] = j < m ? all[j].id : -1;
                if (dist) dist[i * k + j] = j < m ? (neg ? -all[j].d : all[j].d) : (neg ? -INFINITY : INFINITY);
            }
        }
        free(all);
    }
    return fail ? -1 : 0;
}

/* float -> binary16 bits by truncation (any valid half will do for test data):
 * too large -> largest finite, too small -> zero */
static uint16_t ref_to_half(float f)
{
    uint32_t u;
    int e;
    uint16_t sign;
    memcpy(&u, &f, sizeof u);
    sign = (uint16_t)((u >> 16) & 0x8000u);
    e = (int)((u >> 23) & 255) - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7bffu);
    if (e <= 0) return sign;
    return (uint16_t)(sign | (uint16_t)(e << 10) | (uint16_t)((u >> 13) & 1023u));
}

void *ref_make_typed(data_kind kind, int dtype, int64_t rows, int64_t d, uint64_t seed)
{
    const int64_t ld = ref_row_elems(dtype, d);
    unsigned char *out = (unsigned char *)malloc((size_t)(rows * ld * ref_elem_bytes(dtype)) + 1);
    float *f;
    int64_t i, t;
    if (!out) return NULL;
    if (dtype == REF_BIN) {
        uint64_t *w = (uint64_t *)out, st = seed * 0x9E3779B97F4A7C15ull + 7u, proto[5 * 16];
        const int64_t pw = ld < 16 ? ld : 16;
        for (i = 0; i < 5 * pw; i++) proto[i] = ref_rand_u64(&st);
        for (i = 0; i < rows; i++) {
            const int64_t pr = (int64_t)(ref_rand_u64(&st) % 5);
            for (t = 0; t < ld; t++) {
                uint64_t v;
                if (kind == DATA_INTEGER)
                    v = ref_rand_u64(&st) & ref_rand_u64(&st) & ref_rand_u64(&st); /* sparse: ties */
                else if (kind == DATA_DUPLICATES)
                    v = proto[pr * pw + (t % pw)];
                else
                    v = ref_rand_u64(&st);
                w[i * ld + t] = v;
            }
            if (d % 64) w[i * ld + ld - 1] |= ref_rand_u64(&st) << (d % 64); /* junk past the last bit */
        }
        return out;
    }
    f = (float *)malloc((size_t)(rows * d) * sizeof(float) + 1);
    if (!f) {
        free(out);
        return NULL;
    }
    ref_make_data(kind, f, rows, d, seed);
    for (i = 0; i < rows * d; i++) {
        const float v = f[i];
        switch (dtype) {
        case REF_F16: ((uint16_t *)out)[i] = ref_to_half(v); break;
        case REF_BF16: {
            uint32_t u;
            memcpy(&u, &v, sizeof u);
            ((uint16_t *)out)[i] = (uint16_t)(u >> 16);
            break;
        }
        case REF_U8: {
            /* integer kinds keep their values; others map [-1, 1) (or wider) to 0..255 */
            double x = (kind == DATA_INTEGER || kind == DATA_DUPLICATES) ? (double)v : floor(((double)v + 1.0) * 128.0);
            if (kind == DATA_CLUSTERED) x = fmod(fabs((double)v), 256.0);
            ((uint8_t *)out)[i] = (uint8_t)(x < 0 ? 0 : (x > 255 ? 255 : x));
            break;
        }
        case REF_I8: {
            double x = (kind == DATA_INTEGER || kind == DATA_DUPLICATES) ? (double)v - 1.0 : floor((double)v * 128.0);
            if (kind == DATA_CLUSTERED) x = fmod((double)v, 256.0) - 128.0;
            ((int8_t *)out)[i] = (int8_t)(x < -128 ? -128 : (x > 127 ? 127 : x));
            break;
        }
        default: ((float *)out)[i] = v; break;
        }
    }
    free(f);
    return out;
}

void ref_make_nonnegative(int dtype, void *x, int64_t count)
{
    int64_t i;
    for (i = 0; i < count; i++) {
        switch (dtype) {
        case REF_F32: ((float *)x)[i] = fabsf(((float *)x)[i]); break;
        case REF_F16:
        case REF_BF16: ((uint16_t *)x)[i] &= 0x7fffu; break;
        case REF_I8: {
            int8_t *v = (int8_t *)x + i;
            if (*v < 0) *v = (int8_t)(*v == -128 ? 127 : -*v);
            break;
        }
        default: break;
        }
    }
}
