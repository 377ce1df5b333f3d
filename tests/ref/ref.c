#include "ref.h"

#include <math.h>
#include <stdlib.h>

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

typedef struct {
    float d;
    int64_t id;
} ref_pair;

static int ref_cmp(const void *pa, const void *pb)
{
    const ref_pair *a = (const ref_pair *)pa, *b = (const ref_pair *)pb;
    if (a->d != b->d) return a->d < b->d ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

int ref_knn(int metric, const float *ref, int64_t n, int64_t ldr, const float *query, int64_t nq, int64_t ldq,
            int64_t d, int64_t k, int exclude_self, int64_t ref_off, int64_t query_off, int64_t *ids,
            float *dist)
{
    ref_pair *all = (ref_pair *)malloc((size_t)(n > 0 ? n : 1) * sizeof(ref_pair));
    int64_t i, j;
    if (!all) return -1;
    if (!query) {
        query = ref;
        nq = n;
        ldq = ldr;
        exclude_self = 1;
        query_off = ref_off;
    }
    for (i = 0; i < nq; i++) {
        int64_t m = 0;
        for (j = 0; j < n; j++) {
            if (exclude_self && ref_off + j == query_off + i) continue;
            all[m].d = ref_distance(metric, query + i * ldq, ref + j * ldr, d);
            all[m].id = ref_off + j;
            m++;
        }
        qsort(all, (size_t)m, sizeof(ref_pair), ref_cmp);
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
