/* SPDX-License-Identifier: MIT */
/*
 * mkdata -- deterministic test files for the cli suite, and oracle results.
 *
 *   mkdata data KIND N D SEED OUT [nan ROW COL] [u8] [truncate]
 *       KIND: uniform gaussian integer duplicates clustered. OUT by extension:
 *       .fvecs (TEXMEX), anything else the big-ann layout (uint32 n, uint32 d, values);
 *       "u8" stores uint8 values (integer data), "nan" poisons one value, "truncate"
 *       drops the last 3 bytes (a malformed file).
 *   mkdata oracle METRIC K REF QUERY|- OUT
 *       METRIC l2|euclidean; REF/QUERY big-ann float32 files written above; "-" is the
 *       self-join. OUT: .ivecs (per row int32 k, k ids) or the big-ann result layout
 *       (uint32 nq, uint32 k, int32 ids, float32 dist), from the oracle in tests/ref.
 *   mkdata data ... u8wide
 *       uint8 values spread over 0..255 (from any kind), for bit and u8 metric tests.
 *   mkdata weights BITS SEED OUT
 *       a big-ann float32 file of n=1 row, d=BITS weights (few distinct values, some
 *       negative), for whamming.
 *   mkdata oracle2 METRIC P K REF QUERY|- OUT [bits | binarize T] [weights FILE]
 *       any metric (P: the Minkowski exponent, ignored otherwise); REF/QUERY .fbin or
 *       .u8bin (searched in their own type); "bits" packs uint8 bytes into bits (byte j
 *       -> bits 8j..8j+7), "binarize T" makes bit t = (value t > T). Big-ann result.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/ref.h"
#include "tap/tap.h"

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static void put_u32(FILE *f, uint32_t v)
{
    unsigned char b[4];
    b[0] = (unsigned char)(v & 0xff);
    b[1] = (unsigned char)((v >> 8) & 0xff);
    b[2] = (unsigned char)((v >> 16) & 0xff);
    b[3] = (unsigned char)((v >> 24) & 0xff);
    fwrite(b, 1, 4, f);
}

static void put_f32(FILE *f, float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    put_u32(f, u);
}

/* A result as knn_mpi's .bin writes it: nq, k, the ids as int32, the distances. */
static void put_result(FILE *f, const int64_t *ids, const float *dist, int64_t nq, int64_t k)
{
    int64_t i;
    put_u32(f, (uint32_t)nq);
    put_u32(f, (uint32_t)k);
    for (i = 0; i < nq * k; i++) put_u32(f, (uint32_t)(int32_t)ids[i]);
    for (i = 0; i < nq * k; i++) put_f32(f, dist[i]);
}

static int kind_of(const char *name, data_kind *k)
{
    int i;
    for (i = 0; i < DATA_KIND_COUNT; i++)
        if (!strcmp(name, ref_data_name((data_kind)i))) {
            *k = (data_kind)i;
            return 0;
        }
    return -1;
}

static int cmd_data(int argc, char **argv)
{
    data_kind kind;
    long long n, d, seed, nan_row = -1, nan_col = -1;
    int u8 = 0, u8wide = 0, truncate = 0, i;
    const char *out;
    float *x;
    FILE *f;
    long long r, c;

    if (argc < 7 || kind_of(argv[2], &kind)) {
        fprintf(stderr, "mkdata data KIND N D SEED OUT [nan ROW COL] [u8] [truncate]\n");
        return 2;
    }
    n = atoll(argv[3]);
    d = atoll(argv[4]);
    seed = atoll(argv[5]);
    out = argv[6];
    for (i = 7; i < argc; i++) {
        if (!strcmp(argv[i], "nan") && i + 2 < argc) {
            nan_row = atoll(argv[i + 1]);
            nan_col = atoll(argv[i + 2]);
            i += 2;
        } else if (!strcmp(argv[i], "u8")) {
            u8 = 1;
        } else if (!strcmp(argv[i], "u8wide")) {
            u8 = u8wide = 1;
        } else if (!strcmp(argv[i], "truncate")) {
            truncate = 1;
        } else {
            fprintf(stderr, "mkdata: unknown word '%s'\n", argv[i]);
            return 2;
        }
    }
    x = (float *)malloc((size_t)(n * d) * sizeof(float) + 1);
    if (!x) return 3;
    ref_make_data(kind, x, n, d, (uint64_t)seed);
    if (nan_row >= 0) x[nan_row * d + nan_col] = NAN;
    f = fopen(out, "wb");
    if (!f) {
        perror(out);
        free(x);
        return 3;
    }
    if (ends_with(out, ".fvecs")) {
        for (r = 0; r < n; r++) {
            put_u32(f, (uint32_t)d);
            for (c = 0; c < d; c++) put_f32(f, x[r * d + c]);
        }
    } else {
        put_u32(f, (uint32_t)n);
        put_u32(f, (uint32_t)d);
        for (r = 0; r < n * d; r++) {
            if (u8wide) {
                double v = floor((double)x[r] * 64.0 + 128.0);
                fputc(v < 0 ? 0 : (v > 255 ? 255 : (int)v), f);
            } else if (u8)
                fputc((int)x[r] & 0xff, f);
            else
                put_f32(f, x[r]);
        }
    }
    if (fclose(f) != 0) {
        free(x);
        return 3;
    }
    if (truncate) {
        /* rewrite without the last 3 bytes */
        FILE *g = fopen(out, "rb");
        long sz;
        unsigned char *buf;
        if (!g) return 3;
        fseek(g, 0, SEEK_END);
        sz = ftell(g);
        fseek(g, 0, SEEK_SET);
        buf = (unsigned char *)malloc((size_t)sz + 1);
        if (!buf || fread(buf, 1, (size_t)sz, g) != (size_t)sz) return 3;
        fclose(g);
        g = fopen(out, "wb");
        if (!g) return 3;
        fwrite(buf, 1, (size_t)(sz - 3), g);
        fclose(g);
        free(buf);
    }
    free(x);
    return 0;
}

/* Reads a big-ann float32 file (uint32 n, uint32 d, values). */
static float *read_fbin(const char *path, int64_t *n, int64_t *d)
{
    unsigned char h[8];
    FILE *f = fopen(path, "rb");
    float *x;
    if (!f) return NULL;
    if (fread(h, 1, 8, f) != 8) {
        fclose(f);
        return NULL;
    }
    *n = (int64_t)(h[0] | h[1] << 8 | h[2] << 16 | (uint32_t)h[3] << 24);
    *d = (int64_t)(h[4] | h[5] << 8 | h[6] << 16 | (uint32_t)h[7] << 24);
    x = (float *)malloc((size_t)(*n * *d) * sizeof(float) + 1);
    if (!x || fread(x, sizeof(float), (size_t)(*n * *d), f) != (size_t)(*n * *d)) {
        free(x);
        fclose(f);
        return NULL;
    }
    fclose(f);
    return x; /* little-endian host assumed, as in every test machine */
}

static int cmd_oracle(int argc, char **argv)
{
    int metric;
    int64_t k, n, d, nq, qd, i, j;
    float *ref, *qry = NULL, *dist;
    int64_t *ids;
    int self;
    FILE *f;

    if (argc != 7) {
        fprintf(stderr, "mkdata oracle METRIC K REF QUERY|- OUT\n");
        return 2;
    }
    metric = !strcmp(argv[2], "euclidean") ? REF_EUCLIDEAN : REF_L2;
    k = atoll(argv[3]);
    ref = read_fbin(argv[4], &n, &d);
    if (!ref) {
        fprintf(stderr, "mkdata: cannot read %s\n", argv[4]);
        return 3;
    }
    self = !strcmp(argv[5], "-");
    if (!self) {
        qry = read_fbin(argv[5], &nq, &qd);
        if (!qry || qd != d) {
            fprintf(stderr, "mkdata: cannot read %s (or d differs)\n", argv[5]);
            return 3;
        }
    } else {
        nq = n;
    }
    ids = (int64_t *)malloc((size_t)(nq * k) * sizeof(int64_t));
    dist = (float *)malloc((size_t)(nq * k) * sizeof(float));
    if (!ids || !dist) return 3;
    if (ref_knn(metric, ref, n, d, self ? NULL : qry, nq, d, d, k, self, 0, 0, ids, dist) != 0) return 3;
    f = fopen(argv[6], "wb");
    if (!f) return 3;
    if (ends_with(argv[6], ".ivecs")) {
        for (i = 0; i < nq; i++) {
            put_u32(f, (uint32_t)k);
            for (j = 0; j < k; j++) put_u32(f, (uint32_t)(int32_t)ids[i * k + j]);
        }
    } else {
        put_result(f, ids, dist, nq, k);
    }
    if (fclose(f) != 0) return 3;
    FREE_ALL(ids, dist, ref, qry);
    return 0;
}

/* Reads a big-ann file: .u8bin as uint8 (*dtype REF_U8), anything else float32. */
static void *read_any(const char *path, int64_t *n, int64_t *d, int *dtype)
{
    unsigned char h[8];
    FILE *f;
    unsigned char *x;
    size_t es;
    *dtype = ends_with(path, ".u8bin") ? REF_U8 : REF_F32;
    es = *dtype == REF_U8 ? 1 : 4;
    f = fopen(path, "rb");
    if (!f) return NULL;
    if (fread(h, 1, 8, f) != 8) {
        fclose(f);
        return NULL;
    }
    *n = (int64_t)(h[0] | h[1] << 8 | h[2] << 16 | (uint32_t)h[3] << 24);
    *d = (int64_t)(h[4] | h[5] << 8 | h[6] << 16 | (uint32_t)h[7] << 24);
    x = (unsigned char *)malloc((size_t)(*n * *d) * es + 1);
    if (!x || fread(x, es, (size_t)(*n * *d), f) != (size_t)(*n * *d)) {
        free(x);
        fclose(f);
        return NULL;
    }
    fclose(f);
    return x;
}

/* rows x d values of dtype -> bit rows: packed bytes (bits) or value > t (binarize) */
static uint64_t *to_bits(const void *x, int dtype, int64_t rows, int64_t d, int bits, double t, int64_t *dbits)
{
    const int64_t nb = bits ? 8 * d : d, words = (nb + 63) / 64;
    uint64_t *w = (uint64_t *)calloc((size_t)(rows * words) + 1, sizeof(uint64_t));
    int64_t i, j, b;
    if (!w) return NULL;
    for (i = 0; i < rows; i++)
        for (j = 0; j < d; j++) {
            const double v = dtype == REF_U8 ? (double)((const uint8_t *)x)[i * d + j] : (double)((const float *)x)[i * d + j];
            if (bits) {
                for (b = 0; b < 8; b++)
                    if ((((const uint8_t *)x)[i * d + j] >> b) & 1) w[i * words + (8 * j + b) / 64] |= 1ull << ((8 * j + b) % 64);
            } else if (v > t) {
                w[i * words + j / 64] |= 1ull << (j % 64);
            }
        }
    *dbits = nb;
    return w;
}

static int cmd_weights(int argc, char **argv)
{
    long long bits, b;
    uint64_t st;
    FILE *f;
    if (argc != 5) {
        fprintf(stderr, "mkdata weights BITS SEED OUT\n");
        return 2;
    }
    bits = atoll(argv[2]);
    st = (uint64_t)atoll(argv[3]);
    f = fopen(argv[4], "wb");
    if (!f) return 3;
    put_u32(f, 1);
    put_u32(f, (uint32_t)bits);
    for (b = 0; b < bits; b++) put_f32(f, (float)((int)(ref_rand_u64(&st) % 6) - 2) * 0.25f);
    return fclose(f) == 0 ? 0 : 3;
}

static int cmd_oracle2(int argc, char **argv)
{
    ref_spec spec;
    int64_t k, n, d, nq = 0, qd, dd;
    void *ref, *qry = NULL;
    float *dist, *w = NULL;
    int64_t *ids;
    int self, dtype, qdtype, bits = 0, binarize = 0, a;
    double t = 0;
    FILE *f;

    if (argc < 8) {
        fprintf(stderr, "mkdata oracle2 METRIC P K REF QUERY|- OUT [bits | binarize T] [weights FILE]\n");
        return 2;
    }
    spec.metric = -1;
    {
        static const char *const names[] = {"l2", "euclidean", "l1", "minkowski", "chebyshev",
                                            "ip", "cosine", "hellinger", "hamming", "whamming"};
        for (a = 0; a < 10; a++)
            if (!strcmp(argv[2], names[a])) spec.metric = a;
    }
    if (spec.metric < 0) {
        fprintf(stderr, "mkdata: unknown metric %s\n", argv[2]);
        return 2;
    }
    spec.p = atof(argv[3]);
    k = atoll(argv[4]);
    for (a = 8; a < argc; a++) {
        if (!strcmp(argv[a], "bits")) {
            bits = 1;
        } else if (!strcmp(argv[a], "binarize") && a + 1 < argc) {
            binarize = 1;
            t = atof(argv[++a]);
        } else if (!strcmp(argv[a], "weights") && a + 1 < argc) {
            int64_t wn, wd;
            w = read_fbin(argv[++a], &wn, &wd);
            if (!w) return 3;
        } else {
            fprintf(stderr, "mkdata: unknown word '%s'\n", argv[a]);
            return 2;
        }
    }
    spec.weights = w;
    ref = read_any(argv[5], &n, &d, &dtype);
    if (!ref) {
        fprintf(stderr, "mkdata: cannot read %s\n", argv[5]);
        return 3;
    }
    self = !strcmp(argv[6], "-");
    if (!self) {
        qry = read_any(argv[6], &nq, &qd, &qdtype);
        if (!qry || qd != d || qdtype != dtype) {
            fprintf(stderr, "mkdata: cannot read %s (or d or type differs)\n", argv[6]);
            return 3;
        }
    } else {
        nq = n;
    }
    dd = d;
    spec.dtype = dtype;
    if (bits || binarize) {
        void *rb = to_bits(ref, dtype, n, d, bits, t, &dd), *qb = NULL;
        if (!self) qb = to_bits(qry, dtype, nq, d, bits, t, &dd);
        free(ref);
        free(qry);
        ref = rb;
        qry = qb;
        spec.dtype = REF_BIN;
    }
    ids = (int64_t *)malloc((size_t)(nq * k) * sizeof(int64_t));
    dist = (float *)malloc((size_t)(nq * k) * sizeof(float));
    if (!ids || !dist) return 3;
    if (ref_knn_ex(&spec, ref, n, ref_row_elems(spec.dtype, dd), self ? NULL : qry, nq, ref_row_elems(spec.dtype, dd),
                   dd, k, self, 0, 0, ids, dist) != 0)
        return 3;
    f = fopen(argv[7], "wb");
    if (!f) return 3;
    put_result(f, ids, dist, nq, k);
    if (fclose(f) != 0) return 3;
    FREE_ALL(ids, dist, ref, qry, w);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "weights")) return cmd_weights(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "oracle2")) return cmd_oracle2(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "data")) return cmd_data(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "oracle")) return cmd_oracle(argc, argv);
    fprintf(stderr, "usage: mkdata data ... | mkdata oracle ... (see the comment in tests/mkdata.c)\n");
    return 2;
}
