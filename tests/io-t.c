/* SPDX-License-Identifier: MIT */
/* io-t: the file readers and result writers of xknn/io.h (docs/DESIGN.md section 3).
 * Every file is written byte by byte here, into a fresh directory under /tmp, and read
 * back through the library; values are compared bit for bit. Malformed files must give
 * their status with a message that starts with the path and names the fault. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#ifdef XKNN_HAVE_ZLIB
#include <zlib.h>
#endif

#include "ref/ref.h"
#include "tap/tap.h"
#include "xknn.h"
#include "xknn/io.h"

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

static char tdir[64]; /* the test's temporary directory */

/* ---- byte buffers ------------------------------------------------------------------ */

typedef struct {
    unsigned char *p;
    size_t n, cap;
} bytes;

static void b_put(bytes *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        unsigned char *q;
        while (cap < b->n + n) cap *= 2;
        q = (unsigned char *)realloc(b->p, cap);
        if (!q) bail("out of memory");
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void b_u8(bytes *b, unsigned v)
{
    unsigned char c = (unsigned char)v;
    b_put(b, &c, 1);
}

static void b_u16(bytes *b, uint32_t v, int be)
{
    unsigned char c[2];
    c[be ? 1 : 0] = (unsigned char)(v & 0xff);
    c[be ? 0 : 1] = (unsigned char)(v >> 8 & 0xff);
    b_put(b, c, 2);
}

static void b_u32(bytes *b, uint32_t v, int be)
{
    unsigned char c[4];
    int i;
    for (i = 0; i < 4; i++) c[be ? 3 - i : i] = (unsigned char)(v >> (8 * i) & 0xff);
    b_put(b, c, 4);
}

static void b_u64(bytes *b, uint64_t v, int be)
{
    b_u32(b, (uint32_t)(be ? v >> 32 : v & 0xffffffffu), be);
    b_u32(b, (uint32_t)(be ? v & 0xffffffffu : v >> 32), be);
}

static void b_f32(bytes *b, float f, int be)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    b_u32(b, u, be);
}

/* n floats, little-endian */
static void b_f32s(bytes *b, const float *f, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i++) b_f32(b, f[i], 0);
}

static void b_f64(bytes *b, double f, int be)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    b_u64(b, u, be);
}

static void b_free(bytes *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- files ------------------------------------------------------------------------- */

static const char *tpath(char *out, const char *name)
{
    snprintf(out, 4096, "%s/%s", tdir, name);
    return out;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) bail("cannot write %s: %s", path, strerror(errno));
}

static void write_bytes(const char *name, const bytes *b)
{
    char path[4096];
    write_file(tpath(path, name), b->p, b->n);
}

/* Appends .fvecs rows of ds[0..rows-1] values 1.0f each. */
static void put_fvecs_ones(bytes *b, const int *ds, int rows)
{
    int r, j;
    for (r = 0; r < rows; r++) {
        b_u32(b, (uint32_t)ds[r], 0);
        for (j = 0; j < ds[r]; j++) b_f32(b, 1.0f, 0);
    }
}

#ifdef XKNN_HAVE_ZLIB
static void write_gz(const char *name, const bytes *b)
{
    char path[4096];
    gzFile g = gzopen(tpath(path, name), "wb");
    if (!g || gzwrite(g, b->p, (unsigned)b->n) != (int)b->n || gzclose(g) != Z_OK) bail("cannot write %s", path);
}
#endif

/* write_bytes, and where zlib is found the same bytes gzipped as NAME.gz too */
static void write_bytes_gz(const char *name, const bytes *b)
{
    write_bytes(name, b);
#ifdef XKNN_HAVE_ZLIB
    {
        char gz[256];
        snprintf(gz, sizeof gz, "%s.gz", name);
        write_gz(gz, b);
    }
#endif
}

static int exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* Number of leftover temporaries (".*.tmp.*") in dir. */
static int count_temps(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] == '.' && strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[4096];
    if (!d) return;
    while ((e = readdir(d)) != NULL) {
        struct stat sb;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            chmod(p, 0700);
            remove_tree(p);
        } else if (unlink(p) != 0) {
            diag("cannot remove %s: %s", p, strerror(errno));
        }
    }
    closedir(d);
    if (rmdir(dir) != 0) diag("cannot remove %s: %s", dir, strerror(errno));
}

/* ---- checks ------------------------------------------------------------------------ */

static int same_bits(const float *a, const float *b, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(float)) != 0) {
            diag("value %lld differs: got %.9g, want %.9g", (long long)i, (double)a[i], (double)b[i]);
            return 0;
        }
    return 1;
}

/* status, and a message "PATH: ..." holding every key (NULL-terminated list). */
static int check_err(xknn_status st, const xknn_error *err, xknn_status want, const char *path, const char *what,
                     const char *k1, const char *k2, const char *k3)
{
    const char *keys[3];
    size_t pl = strlen(path);
    int good = st == want && err->status == want && strncmp(err->message, path, pl) == 0 &&
               err->message[pl] == ':', i;
    keys[0] = k1;
    keys[1] = k2;
    keys[2] = k3;
    for (i = 0; i < 3; i++)
        if (keys[i] && !strstr(err->message, keys[i])) good = 0;
    ok(good, "%s", what);
    if (!good)
        diag("status \"%s\" (want \"%s\"), message: %s", xknn_status_string(st), xknn_status_string(want),
             err->message);
    return good;
}

static int probe_err(const char *name, const xknn_read_opts *o, xknn_status want, const char *what, const char *k1,
                     const char *k2, const char *k3)
{
    char path[4096];
    xknn_file_info info;
    xknn_error err;
    xknn_status st = xknn_file_probe(tpath(path, name), o, &info, &err);
    return check_err(st, &err, want, path, what, k1, k2, k3);
}

/* Probes `name`, reads rows [row0, row0 + nrows) and reads all into a new array. */
static float *probe_read(const char *name, const xknn_read_opts *o, xknn_file_info *info, int64_t row0, int64_t nrows,
                         xknn_error *err, xknn_status *st)
{
    char path[4096];
    float *out;
    *st = xknn_file_probe(tpath(path, name), o, info, err);
    if (*st != XKNN_SUCCESS) return NULL;
    if (nrows < 0) nrows = info->rows - row0;
    out = (float *)malloc((size_t)(nrows * info->cols + 1) * sizeof(float));
    if (!out) bail("out of memory");
    *st = xknn_file_read_rows(path, info, row0, nrows, out, err);
    return out;
}

/* Writes b as file name (freeing b); reading all its rows with options o must fail with
 * want, the message naming the file and holding k1..k3 (check_err's test line). */
static void write_read_err(const char *name, bytes *b, const xknn_read_opts *o, xknn_status want, const char *what,
                           const char *k1, const char *k2, const char *k3)
{
    char path[4096];
    xknn_file_info info;
    xknn_error err;
    xknn_status st;
    float *out;
    write_bytes(name, b);
    b_free(b);
    out = probe_read(name, o, &info, 0, -1, &err, &st);
    check_err(st, &err, want, tpath(path, name), what, k1, k2, k3);
    free(out);
}

/* Two tests: the probe's answer, then every value of rows [row0, row0 + nrows). */
static void roundtrip(const char *name, const xknn_read_opts *o, xknn_file_format fmt, xknn_elem elem, int gz,
                      int64_t n, int64_t d, int64_t row0, int64_t nrows, const float *want)
{
    xknn_file_info info;
    xknn_error err;
    xknn_status st;
    float *got = probe_read(name, o, &info, row0, nrows, &err, &st);
    int probed = got != NULL;
    ok(probed && info.format == fmt && info.elem == elem && info.rows == n && info.cols == d && info.compressed == gz,
       "%s: probe says %s %s %lld x %lld%s", name, xknn_file_format_name(fmt), xknn_elem_name(elem), (long long)n,
       (long long)d, gz ? " gzip" : "");
    if (!probed)
        diag("probe: %s", err.message);
    else
        diag("  got %s %s %lld x %lld compressed=%d", xknn_file_format_name(info.format), xknn_elem_name(info.elem),
             (long long)info.rows, (long long)info.cols, info.compressed);
    ok(probed && st == XKNN_SUCCESS && info.cols == d && same_bits(got, want + row0 * d, nrows * d),
       "%s: rows [%lld, %lld) read back exactly", name, (long long)row0, (long long)(row0 + nrows));
    if (probed && st != XKNN_SUCCESS) diag("read: %s", err.message);
    free(got);
}

/* One test: the probe succeeds and all rows read back exactly. */
static void roundtrip1(const char *name, const xknn_read_opts *o, xknn_elem elem, int64_t n, int64_t d,
                       const float *want)
{
    xknn_file_info info;
    xknn_error err;
    xknn_status st;
    float *got = probe_read(name, o, &info, 0, -1, &err, &st);
    ok(got && st == XKNN_SUCCESS && info.elem == elem && info.rows == n && info.cols == d && same_bits(got, want, n * d),
       "%s: %s %lld x %lld reads back exactly", name, xknn_elem_name(elem), (long long)n, (long long)d);
    if (st != XKNN_SUCCESS) diag("%s", err.message);
    free(got);
}

/* Writes b as file name (freeing b), then roundtrip1 on it without options. */
static void write_roundtrip1(const char *name, bytes *b, xknn_elem elem, int64_t n, int64_t d, const float *want)
{
    write_bytes(name, b);
    b_free(b);
    roundtrip1(name, NULL, elem, n, d, want);
}

/* ---- file makers ------------------------------------------------------------------- */

static void make_vecs(bytes *b, int64_t n, int64_t d, xknn_elem e, const void *v)
{
    int64_t i, j;
    for (i = 0; i < n; i++) {
        b_u32(b, (uint32_t)d, 0);
        for (j = 0; j < d; j++) {
            if (e == XKNN_ELEM_F32) b_f32(b, ((const float *)v)[i * d + j], 0);
            else if (e == XKNN_ELEM_I32) b_u32(b, (uint32_t)((const int32_t *)v)[i * d + j], 0);
            else b_u8(b, ((const unsigned char *)v)[i * d + j]);
        }
    }
}

static void make_bin_header(bytes *b, uint32_t n, uint32_t d)
{
    b_u32(b, n, 0);
    b_u32(b, d, 0);
}

/* npy header padded to a multiple of 64 bytes, ending in '\n'. */
static void make_npy_header(bytes *b, int version, const char *descr, int fortran, const char *shape)
{
    char dict[256];
    const int pre = version == 1 ? 10 : 12;
    int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr,
                       fortran ? "True" : "False", shape);
    int total = pre + len + 1, pad = (64 - total % 64) % 64, i;
    b_put(b, "\x93NUMPY", 6);
    b_u8(b, (unsigned)version);
    b_u8(b, 0);
    if (version == 1) b_u16(b, (uint32_t)(len + pad + 1), 0);
    else b_u32(b, (uint32_t)(len + pad + 1), 0);
    b_put(b, dict, (size_t)len);
    for (i = 0; i < pad; i++) b_u8(b, ' ');
    b_u8(b, '\n');
}

static void make_idx_header(bytes *b, unsigned type, int ndims, const uint32_t *dims)
{
    int i;
    b_u8(b, 0);
    b_u8(b, 0);
    b_u8(b, type);
    b_u8(b, (unsigned)ndims);
    for (i = 0; i < ndims; i++) b_u32(b, dims[i], 1);
}

/* Independent binary16 decoder for the expectations. */
static float half_value(unsigned h)
{
    unsigned e = (h >> 10) & 31u, m = h & 1023u;
    double v = e == 0 ? ldexp((double)m, -24) : ldexp((double)(1024u + m), (int)e - 25);
    return (float)((h & 0x8000u) ? -v : v);
}

/* ---- the tests --------------------------------------------------------------------- */

enum { N = 37, D = 5 };

static void test_texmex(void)
{
    float f[N * D], want[N * D];
    int32_t iv[N * D];
    unsigned char u8[N * D];
    bytes b = {0};
    int64_t i;

    ref_make_data(DATA_GAUSSIAN, f, N, D, 11);
    for (i = 0; i < N * D; i++) {
        iv[i] = (int32_t)((i * 7919 + 104729) % 33554433) - 16777216; /* [-2^24, 2^24]: exact */
        u8[i] = (unsigned char)((i * 31 + 7) & 255);
    }
    make_vecs(&b, N, D, XKNN_ELEM_F32, f);
    write_bytes("a.fvecs", &b);
    roundtrip("a.fvecs", NULL, XKNN_FORMAT_FVECS, XKNN_ELEM_F32, 0, N, D, 0, N, f);
    roundtrip("a.fvecs", NULL, XKNN_FORMAT_FVECS, XKNN_ELEM_F32, 0, N, D, 11, 9, f);
    b_free(&b);

    make_vecs(&b, N, D, XKNN_ELEM_I32, iv);
    write_bytes("a.ivecs", &b);
    for (i = 0; i < N * D; i++) want[i] = (float)iv[i];
    roundtrip("a.ivecs", NULL, XKNN_FORMAT_IVECS, XKNN_ELEM_I32, 0, N, D, 0, N, want);
    b_free(&b);

    make_vecs(&b, N, D, XKNN_ELEM_U8, u8);
    write_bytes("a.bvecs", &b);
    for (i = 0; i < N * D; i++) want[i] = (float)u8[i];
    roundtrip("a.bvecs", NULL, XKNN_FORMAT_BVECS, XKNN_ELEM_U8, 0, N, D, 0, N, want);
    b_free(&b);

#ifdef XKNN_HAVE_ZLIB
    make_vecs(&b, N, D, XKNN_ELEM_F32, f);
    write_gz("a.fvecs.gz", &b);
    roundtrip("a.fvecs.gz", NULL, XKNN_FORMAT_FVECS, XKNN_ELEM_F32, 1, N, D, 0, N, f);
    roundtrip("a.fvecs.gz", NULL, XKNN_FORMAT_FVECS, XKNN_ELEM_F32, 1, N, D, 20, 13, f);
    b_free(&b);
#else
    skip(4, "built without zlib");
#endif
}

static void test_bin(void)
{
    float f[N * D], want[N * D];
    bytes b = {0};
    xknn_read_opts o = XKNN_READ_OPTS_INIT;
    int64_t i;

    ref_make_data(DATA_UNIFORM, f, N, D, 12);
    make_bin_header(&b, N, D);
    b_f32s(&b, f, N * D);
    write_bytes_gz("a.fbin", &b);
    write_bytes("a.bin", &b);
    write_bytes("a.raw", &b);
    b_free(&b);
    roundtrip("a.fbin", NULL, XKNN_FORMAT_FBIN, XKNN_ELEM_F32, 0, N, D, 0, N, f);
    roundtrip("a.fbin", NULL, XKNN_FORMAT_FBIN, XKNN_ELEM_F32, 0, N, D, 10, 10, f);
    roundtrip("a.bin", NULL, XKNN_FORMAT_FBIN, XKNN_ELEM_F32, 0, N, D, 0, N, f);
    o.format = XKNN_FORMAT_FBIN;
    roundtrip1("a.raw", &o, XKNN_ELEM_F32, N, D, f);
    o.format = XKNN_FORMAT_AUTO;
#ifdef XKNN_HAVE_ZLIB
    roundtrip("a.fbin.gz", NULL, XKNN_FORMAT_FBIN, XKNN_ELEM_F32, 1, N, D, 0, N, f);
    roundtrip("a.fbin.gz", NULL, XKNN_FORMAT_FBIN, XKNN_ELEM_F32, 1, N, D, 36, 1, f);
#else
    skip(4, "built without zlib");
#endif

    make_bin_header(&b, N, D);
    for (i = 0; i < N * D; i++) b_u8(&b, (unsigned)((i * 13 + 5) & 255));
    write_bytes("a.u8bin", &b);
    write_bytes("u8.bin", &b);
    for (i = 0; i < N * D; i++) want[i] = (float)((i * 13 + 5) & 255);
    roundtrip("a.u8bin", NULL, XKNN_FORMAT_U8BIN, XKNN_ELEM_U8, 0, N, D, 0, N, want);
    o.bin_dtype = XKNN_ELEM_U8;
    roundtrip1("u8.bin", &o, XKNN_ELEM_U8, N, D, want);
    b_free(&b);

    make_bin_header(&b, N, D);
    for (i = 0; i < N * D; i++) b_u8(&b, (unsigned)((i * 13 + 5) & 255));
    write_bytes("a.i8bin", &b);
    for (i = 0; i < N * D; i++) want[i] = (float)(((i * 13 + 5) & 255) - (((i * 13 + 5) & 128) ? 256 : 0));
    roundtrip("a.i8bin", NULL, XKNN_FORMAT_I8BIN, XKNN_ELEM_I8, 0, N, D, 0, N, want);
    b_free(&b);

    make_bin_header(&b, N, D);
    for (i = 0; i < N * D; i++) {
        int32_t v = i == 0 ? 16777216 : i == 1 ? -16777216 : i == 2 ? 1 << 30 /* exact in float */
                                                                     : (int32_t)(i * 1000003 % 2000001) - 1000000;
        b_u32(&b, (uint32_t)v, 0);
        want[i] = (float)v;
    }
    write_bytes("a.ibin", &b);
    roundtrip("a.ibin", NULL, XKNN_FORMAT_IBIN, XKNN_ELEM_I32, 0, N, D, 0, N, want);
    b_free(&b);
}

static void test_f16(void)
{
    const int64_t n = 62, d = 1024; /* every finite binary16 value, once */
    float *want = (float *)malloc((size_t)(n * d) * sizeof(float));
    static const struct {
        unsigned h;
        double v;
    } named[] = {
        {0x0000, 0.0},           {0x0001, 5.9604644775390625e-08}, {0x03ff, 6.0975551605224609e-05},
        {0x0400, 6.103515625e-05}, {0x3c00, 1.0},                 {0x7bff, 65504.0},
        {0xc100, -2.5},          {0x8001, -5.9604644775390625e-08}, {0x3555, 0.333251953125},
    };
    xknn_read_opts o = XKNN_READ_OPTS_INIT;
    xknn_file_info info;
    xknn_error err;
    xknn_status st;
    bytes b = {0};
    unsigned h;
    int64_t i = 0;
    float *got;
    int good = 1;
    size_t t;

    if (!want) bail("out of memory");
    make_bin_header(&b, (uint32_t)n, (uint32_t)d);
    for (h = 0; h < 65536u; h++) {
        if (((h >> 10) & 31u) == 31u) continue;
        b_u16(&b, h, 0);
        want[i++] = half_value(h);
    }
    write_bytes("h.bin", &b);
    b_free(&b);
    o.bin_dtype = XKNN_ELEM_F16;
    roundtrip("h.bin", &o, XKNN_FORMAT_F16BIN, XKNN_ELEM_F16, 0, n, d, 0, n, want);

    /* the independent decoder agrees with hand-checked values (subnormals included) */
    got = probe_read("h.bin", &o, &info, 0, -1, &err, &st);
    for (t = 0; t < sizeof named / sizeof named[0]; t++) {
        int64_t at = (int64_t)named[t].h - (named[t].h >= 0x8000u ? 0x400 : 0); /* skips 0x7c00-0x7fff */
        if (!got || st != XKNN_SUCCESS || (double)got[at] != named[t].v || !signbit(got[at]) != !signbit(named[t].v)) {
            diag("half 0x%04x: got %.17g, want %.17g", named[t].h, got ? (double)got[at] : 0.0, named[t].v);
            good = 0;
        }
    }
    ok(good, "f16 .bin: zero, subnormals, min normal, max, negatives decode exactly");
    free(got);
    free(want);
}

/* xknn_file_read_rows_as: values kept in their type, uint8 bytes packed into bits. */
static void test_native(void)
{
    const int64_t n = 5, d = 11; /* 88 bits: two words per row, the second one partly used */
    xknn_read_opts o = XKNN_READ_OPTS_INIT;
    xknn_file_info info, i8info, f32info;
    xknn_error err;
    bytes b = {0};
    unsigned char u8[5 * 11];
    uint16_t h[3 * 4], hgot[3 * 4];
    unsigned char got8[5 * 11];
    uint64_t bits[5 * 2];
    int64_t i, j, t;
    int good = 1;
    char path[128], p8[128], p32[128];

    for (i = 0; i < n * d; i++) u8[i] = (unsigned char)(i * 37 + 11);
    make_bin_header(&b, (uint32_t)n, (uint32_t)d);
    b_put(&b, u8, sizeof u8);
    write_bytes("nat.u8bin", &b);
    b_free(&b);
    make_bin_header(&b, (uint32_t)n, (uint32_t)d);
    b_put(&b, u8, sizeof u8);
    write_bytes("nat.i8bin", &b);
    b_free(&b);
    make_bin_header(&b, 1, 1);
    b_f32(&b, 1.5f, 0);
    write_bytes("nat.fbin", &b);
    b_free(&b);
    good = xknn_file_probe(tpath(path, "nat.u8bin"), &o, &info, &err) == XKNN_SUCCESS &&
           xknn_file_probe(tpath(p8, "nat.i8bin"), &o, &i8info, &err) == XKNN_SUCCESS &&
           xknn_file_probe(tpath(p32, "nat.fbin"), &o, &f32info, &err) == XKNN_SUCCESS;
    ok(good && xknn_file_native_dtype(&info) == XKNN_DTYPE_U8 && xknn_file_native_dtype(&i8info) == XKNN_DTYPE_I8 &&
           xknn_file_native_dtype(&f32info) == XKNN_DTYPE_F32,
       "native dtypes: .u8bin u8, .i8bin i8, .fbin f32");
    memset(got8, 0, sizeof got8);
    ok(xknn_file_read_rows_as(path, &info, 1, 3, XKNN_DTYPE_U8, got8, &err) == XKNN_SUCCESS &&
           !memcmp(got8, u8 + d, (size_t)(3 * d)),
       "u8 rows read as u8: the stored bytes");
    memset(bits, 0xff, sizeof bits);
    good = xknn_file_read_rows_as(path, &info, 0, n, XKNN_DTYPE_BIN, bits, &err) == XKNN_SUCCESS;
    for (i = 0; i < n && good; i++)
        for (j = 0; j < 2 * 64; j++) {
            const int bit = (int)((bits[i * 2 + j / 64] >> (j % 64)) & 1u);
            const int want = j < 8 * d ? (u8[i * d + j / 8] >> (j % 8)) & 1 : 0;
            if (bit != want) good = 0;
        }
    ok(good, "u8 rows read as bits: bit 8j+b is bit b of byte j, zero past 8d bits");
    ok(xknn_file_read_rows_as(p32, &f32info, 0, 1, XKNN_DTYPE_U8, got8, &err) == XKNN_ERROR_INVALID_ARGUMENT &&
           strstr(err.message, "cannot be read as u8") != NULL &&
           xknn_file_read_rows_as(p8, &i8info, 0, 1, XKNN_DTYPE_BIN, bits, &err) == XKNN_ERROR_INVALID_ARGUMENT,
       "float32 as u8 and int8 as bits are refused: %s", err.message);

    /* f16 kept as its bits; Inf refused with row and column */
    for (t = 0; t < 12; t++) h[t] = (uint16_t)(0x3c00u + 97u * (unsigned)t);
    make_bin_header(&b, 3, 4);
    for (t = 0; t < 12; t++) b_u16(&b, h[t], 0);
    write_bytes("nat16.bin", &b);
    b_free(&b);
    o.bin_dtype = XKNN_ELEM_F16;
    good = xknn_file_probe(tpath(path, "nat16.bin"), &o, &info, &err) == XKNN_SUCCESS &&
           xknn_file_native_dtype(&info) == XKNN_DTYPE_F16 &&
           xknn_file_read_rows_as(path, &info, 0, 3, XKNN_DTYPE_F16, hgot, &err) == XKNN_SUCCESS &&
           !memcmp(h, hgot, sizeof h);
    h[6] = 0x7c00u;
    make_bin_header(&b, 3, 4);
    for (t = 0; t < 12; t++) b_u16(&b, h[t], 0);
    write_bytes("nat16inf.bin", &b);
    b_free(&b);
    good = good && xknn_file_probe(tpath(path, "nat16inf.bin"), &o, &info, &err) == XKNN_SUCCESS &&
           xknn_file_read_rows_as(path, &info, 0, 3, XKNN_DTYPE_F16, hgot, &err) == XKNN_ERROR_INVALID_VALUE &&
           strstr(err.message, "row 1 column 2 is Inf") != NULL;
    ok(good, "f16 rows read as f16: the stored bits; Inf refused (%s)", err.message);
}

static void test_npy(void)
{
    float f[N * D], want[N * D];
    double f8[N * D];
    bytes b = {0};
    int64_t i;
    char shape[32];

    ref_make_data(DATA_GAUSSIAN, f, N, D, 13);
    snprintf(shape, sizeof shape, "(%d, %d)", N, D);

    make_npy_header(&b, 1, "<f4", 0, shape);
    b_f32s(&b, f, N * D);
    write_bytes_gz("v1.npy", &b);
    b_free(&b);
    roundtrip("v1.npy", NULL, XKNN_FORMAT_NPY, XKNN_ELEM_F32, 0, N, D, 0, N, f);
    roundtrip("v1.npy", NULL, XKNN_FORMAT_NPY, XKNN_ELEM_F32, 0, N, D, 5, 17, f);
#ifdef XKNN_HAVE_ZLIB
    roundtrip1("v1.npy.gz", NULL, XKNN_ELEM_F32, N, D, f);
#else
    skip(1, "built without zlib");
#endif

    make_npy_header(&b, 2, "<f4", 0, shape);
    b_f32s(&b, f, N * D);
    write_bytes("v2.npy", &b);
    b_free(&b);
    roundtrip("v2.npy", NULL, XKNN_FORMAT_NPY, XKNN_ELEM_F32, 0, N, D, 0, N, f);

    make_npy_header(&b, 3, "|u1", 0, shape);
    for (i = 0; i < N * D; i++) {
        b_u8(&b, (unsigned)(255 - i % 256));
        want[i] = (float)(255 - i % 256);
    }
    write_roundtrip1("v3u1.npy", &b, XKNN_ELEM_U8, N, D, want);

    make_npy_header(&b, 1, "|i1", 0, shape);
    for (i = 0; i < N * D; i++) {
        b_u8(&b, (unsigned)(i % 256));
        want[i] = (float)(i % 256 >= 128 ? i % 256 - 256 : i % 256);
    }
    write_roundtrip1("i1.npy", &b, XKNN_ELEM_I8, N, D, want);

    make_npy_header(&b, 1, "<i4", 0, shape);
    for (i = 0; i < N * D; i++) {
        int32_t v = (int32_t)(i * 65537) - 6000000;
        b_u32(&b, (uint32_t)v, 0);
        want[i] = (float)v;
    }
    write_roundtrip1("i4.npy", &b, XKNN_ELEM_I32, N, D, want);

    make_npy_header(&b, 1, "<f2", 0, shape);
    for (i = 0; i < N * D; i++) {
        unsigned h = (unsigned)((i * 977) % 0x7c00) | (i % 2 ? 0x8000u : 0u);
        b_u16(&b, h, 0);
        want[i] = half_value(h);
    }
    write_roundtrip1("f2.npy", &b, XKNN_ELEM_F16, N, D, want);

    make_npy_header(&b, 1, "<f8", 0, shape);
    for (i = 0; i < N * D; i++) {
        f8[i] = (double)f[i] * (1.0 + 1e-12) + 1e-3;
        b_f64(&b, f8[i], 0);
        want[i] = (float)f8[i];
    }
    write_roundtrip1("f8.npy", &b, XKNN_ELEM_F64, N, D, want);

    snprintf(shape, sizeof shape, "(%d,)", N * D);
    make_npy_header(&b, 1, "<f4", 0, shape);
    b_f32s(&b, f, N * D);
    write_roundtrip1("1d.npy", &b, XKNN_ELEM_F32, N * D, 1, f);
}

static void test_idx(void)
{
    const uint32_t dims3[3] = {N, 5, 3}, dims2[2] = {N, D}, dims1[1] = {N * D};
    float want[N * 15];
    double f8[N * D];
    bytes b = {0};
    int64_t i;

    make_idx_header(&b, 0x08, 3, dims3);
    for (i = 0; i < N * 15; i++) {
        b_u8(&b, (unsigned)((i * 7 + 3) & 255));
        want[i] = (float)((i * 7 + 3) & 255);
    }
    write_bytes("train-images-idx3-ubyte", &b);
    write_bytes("x.idx3-ubyte", &b);
#ifdef XKNN_HAVE_ZLIB
    write_gz("t-images-idx3-ubyte.gz", &b);
#endif
    b_free(&b);
    roundtrip("train-images-idx3-ubyte", NULL, XKNN_FORMAT_IDX, XKNN_ELEM_U8, 0, N, 15, 0, N, want);
    roundtrip("x.idx3-ubyte", NULL, XKNN_FORMAT_IDX, XKNN_ELEM_U8, 0, N, 15, 30, 7, want);
#ifdef XKNN_HAVE_ZLIB
    roundtrip("t-images-idx3-ubyte.gz", NULL, XKNN_FORMAT_IDX, XKNN_ELEM_U8, 1, N, 15, 0, N, want);
    roundtrip("t-images-idx3-ubyte.gz", NULL, XKNN_FORMAT_IDX, XKNN_ELEM_U8, 1, N, 15, 17, 3, want);
#else
    skip(4, "built without zlib");
#endif

    make_idx_header(&b, 0x08, 1, dims1);
    for (i = 0; i < N * D; i++) b_u8(&b, (unsigned)(i % 10));
    for (i = 0; i < N * D; i++) want[i] = (float)(i % 10);
    write_roundtrip1("labels-idx1-ubyte", &b, XKNN_ELEM_U8, N * D, 1, want);

    make_idx_header(&b, 0x09, 2, dims2);
    for (i = 0; i < N * D; i++) {
        b_u8(&b, (unsigned)((i * 37) & 255));
        want[i] = (float)(((i * 37) & 255) >= 128 ? ((i * 37) & 255) - 256 : ((i * 37) & 255));
    }
    write_roundtrip1("i8.idx", &b, XKNN_ELEM_I8, N, D, want);

    make_idx_header(&b, 0x0B, 2, dims2);
    for (i = 0; i < N * D; i++) {
        int v = (int)((i * 1237) % 65536) - 32768;
        b_u16(&b, (uint32_t)(v & 0xffff), 1);
        want[i] = (float)v;
    }
    write_roundtrip1("i16.idx", &b, XKNN_ELEM_I16, N, D, want);

    make_idx_header(&b, 0x0C, 2, dims2);
    for (i = 0; i < N * D; i++) {
        int32_t v = (int32_t)(i * 99991) - 9000000;
        b_u32(&b, (uint32_t)v, 1);
        want[i] = (float)v;
    }
    write_roundtrip1("i32.idx", &b, XKNN_ELEM_I32, N, D, want);

    ref_make_data(DATA_GAUSSIAN, want, N, D, 14);
    make_idx_header(&b, 0x0D, 2, dims2);
    for (i = 0; i < N * D; i++) b_f32(&b, want[i], 1);
    write_roundtrip1("f32.idx", &b, XKNN_ELEM_F32, N, D, want);

    make_idx_header(&b, 0x0E, 2, dims2);
    for (i = 0; i < N * D; i++) {
        f8[i] = (double)want[i] / 3.0;
        b_f64(&b, f8[i], 1);
    }
    for (i = 0; i < N * D; i++) want[i] = (float)f8[i];
    write_roundtrip1("f64.idx", &b, XKNN_ELEM_F64, N, D, want);
}

static void test_malformed(void)
{
    xknn_read_opts o = XKNN_READ_OPTS_INIT;
    const uint32_t dims[3] = {10, 28, 28}, huge[3] = {0xffffffffu, 0xffffffffu, 0xffffffffu};
    char path[4096], want[4200];
    xknn_file_info info;
    xknn_error err;
    xknn_status st;
    bytes b = {0};
    float out[64];
    int i;

    /* the documented example message, word for word */
    make_bin_header(&b, 10, 3);
    while (b.n < 1000) b_u8(&b, 0);
    write_bytes("ref.fbin", &b);
    b_free(&b);
    st = xknn_file_probe(tpath(path, "ref.fbin"), NULL, &info, &err);
    snprintf(want, sizeof want, "%s: size 1000 bytes does not match header n=10 d=3 (expected 128 bytes)", path);
    ok(st == XKNN_ERROR_FORMAT, "size mismatch is a format error");
    is_string(err.message, want, "size mismatch message names path, size, n, d and the expected size");

    b_u32(&b, 5, 0);
    b_u8(&b, 0);
    write_bytes("trunc.fbin", &b);
    b_free(&b);
    probe_err("trunc.fbin", NULL, XKNN_ERROR_FORMAT, "fbin: truncated header", "truncated header", NULL, NULL);

    make_npy_header(&b, 1, "<f4", 0, "(3, 4)");
    b.n = 30;
    write_bytes("trunc.npy", &b);
    b_free(&b);
    probe_err("trunc.npy", NULL, XKNN_ERROR_FORMAT, "npy: truncated header", "truncated header", NULL, NULL);

    make_idx_header(&b, 0x08, 3, dims);
    b.n = 10;
    write_bytes("trunc-idx3-ubyte", &b);
    b_free(&b);
    probe_err("trunc-idx3-ubyte", NULL, XKNN_ERROR_FORMAT, "IDX: truncated header", "truncated header", NULL, NULL);

    b_u32(&b, 4, 0);
    b_u16(&b, 0, 0);
    write_bytes("trunc.fvecs", &b);
    b_free(&b);
    probe_err("trunc.fvecs", NULL, XKNN_ERROR_FORMAT, "fvecs: last row truncated", "not a multiple", "truncated",
              NULL);

    make_npy_header(&b, 1, "<f4", 0, "(3, 4)");
    for (i = 0; i < 11; i++) b_f32(&b, 1.0f, 0);
    write_bytes("short.npy", &b);
    b_free(&b);
    probe_err("short.npy", NULL, XKNN_ERROR_FORMAT, "npy: size mismatch", "does not match header n=3 d=4",
              "expected", NULL);

    make_idx_header(&b, 0x08, 3, dims);
    for (i = 0; i < 10 * 784 + 1; i++) b_u8(&b, 0);
    write_bytes("long-idx3-ubyte", &b);
    b_free(&b);
    probe_err("long-idx3-ubyte", NULL, XKNN_ERROR_FORMAT, "IDX: size mismatch", "does not match header n=10 d=784",
              NULL, NULL);

    b_u8(&b, 0);
    b_u8(&b, 8);
    b_u8(&b, 8);
    b_u8(&b, 1);
    b_u32(&b, 1, 1);
    b_u8(&b, 0);
    write_bytes("magic-idx1-ubyte", &b);
    b_free(&b);
    probe_err("magic-idx1-ubyte", NULL, XKNN_ERROR_FORMAT, "IDX: wrong magic bytes", "bad IDX magic", NULL, NULL);

    make_idx_header(&b, 0x0A, 1, dims);
    for (i = 0; i < 10; i++) b_u8(&b, 0);
    write_bytes("type.idx", &b);
    b_free(&b);
    probe_err("type.idx", NULL, XKNN_ERROR_FORMAT, "IDX: unknown type byte", "bad IDX magic", "0x0a", NULL);

    make_bin_header(&b, 10, 0);
    write_bytes("d0.fbin", &b);
    b_free(&b);
    probe_err("d0.fbin", NULL, XKNN_ERROR_FORMAT, "fbin: d = 0", "d = 0", NULL, NULL);

    make_bin_header(&b, 0, 3);
    write_bytes("n0.fbin", &b);
    b_free(&b);
    probe_err("n0.fbin", NULL, XKNN_ERROR_FORMAT, "fbin: n = 0", "n = 0", NULL, NULL);

    b_u32(&b, 0, 0);
    write_bytes("d0.fvecs", &b);
    b_free(&b);
    probe_err("d0.fvecs", NULL, XKNN_ERROR_FORMAT, "fvecs: d = 0", "d = 0", NULL, NULL);

    make_npy_header(&b, 1, "<f4", 0, "(0, 4)");
    write_bytes("n0.npy", &b);
    b_free(&b);
    probe_err("n0.npy", NULL, XKNN_ERROR_FORMAT, "npy: shape (0, 4) has n = 0", "n = 0", NULL, NULL);

    /* rows of d 3, 3, 2, 3: the size is not a multiple of 16; row 2 is named */
    {
        const int ds[4] = {3, 3, 2, 3};
        put_fvecs_ones(&b, ds, 4);
    }
    write_bytes_gz("mixed.fvecs", &b);
    b_free(&b);
    probe_err("mixed.fvecs", NULL, XKNN_ERROR_FORMAT, "fvecs: mixed d, row named", "row 2 has d=2", "row 0 has d=3",
              NULL);
#ifdef XKNN_HAVE_ZLIB
    probe_err("mixed.fvecs.gz", NULL, XKNN_ERROR_FORMAT, "fvecs.gz: mixed d, row named", "row 2 has d=2",
              "row 0 has d=3", NULL);
#else
    skip(1, "built without zlib");
#endif

    /* rows of d 3, 2, 4, 3: 64 bytes = 4 rows of 16, first and last agree; the reader
     * finds row 1 */
    {
        const int ds[4] = {3, 2, 4, 3};
        put_fvecs_ones(&b, ds, 4);
    }
    write_bytes("mixed2.fvecs", &b);
    b_free(&b);
    st = xknn_file_probe(tpath(path, "mixed2.fvecs"), NULL, &info, &err);
    if (st == XKNN_SUCCESS) st = xknn_file_read_rows(path, &info, 0, info.rows, out, &err);
    check_err(st, &err, XKNN_ERROR_FORMAT, path, "fvecs: mixed d hidden from the probe is found by the reader",
              "row 1 has d=2", NULL, NULL);

    /* rows of d 3, 8, 2: 64 bytes = 4 rows of 16, but no d=3 at the last row's place:
     * the probe names row 1 */
    {
        const int ds[3] = {3, 8, 2};
        put_fvecs_ones(&b, ds, 3);
    }
    write_bytes("mixed3.fvecs", &b);
    b_free(&b);
    probe_err("mixed3.fvecs", NULL, XKNN_ERROR_FORMAT, "fvecs: last row's d differs, first bad row named",
              "row 1 has d=8", NULL, NULL);

    make_bin_header(&b, 0xffffffffu, 0xffffffffu);
    for (i = 0; i < 16; i++) b_u8(&b, 0);
    write_bytes("overflow.fbin", &b);
    b_free(&b);
    probe_err("overflow.fbin", NULL, XKNN_ERROR_FORMAT, "fbin: n*d beyond 2^63 is refused, numbers named",
              "n=4294967295 d=4294967295", "overflow", NULL);

    make_idx_header(&b, 0x08, 3, huge);
    write_bytes("overflow-idx3-ubyte", &b);
    b_free(&b);
    probe_err("overflow-idx3-ubyte", NULL, XKNN_ERROR_FORMAT, "IDX: product of dimensions overflows, numbers named",
              "4294967295 x 4294967295 x 4294967295", "overflow", NULL);

    write_file(tpath(path, "empty.fbin"), "", 0);
    probe_err("empty.fbin", NULL, XKNN_ERROR_FORMAT, "empty .fbin", "empty", NULL, NULL);
    write_file(tpath(path, "empty.fvecs"), "", 0);
    probe_err("empty.fvecs", NULL, XKNN_ERROR_FORMAT, "empty .fvecs", "empty", NULL, NULL);

    probe_err("missing.fbin", NULL, XKNN_ERROR_IO, "missing file is an I/O error with strerror", "cannot open",
              strerror(ENOENT), NULL);
    if (mkdir(tpath(path, "dir.fbin"), 0755) != 0) bail("mkdir %s: %s", path, strerror(errno));
    probe_err("dir.fbin", NULL, XKNN_ERROR_IO, "a directory is an I/O error", strerror(EISDIR), NULL, NULL);
    probe_err("a.txt", NULL, XKNN_ERROR_FORMAT, "unknown extension lists the accepted ones",
              "unknown file extension", ".fvecs", ".npy");
    o.bin_dtype = XKNN_ELEM_F64;
    probe_err("a.bin", &o, XKNN_ERROR_INVALID_ARGUMENT, ".bin with an unsupported bin_dtype", "bin_dtype", NULL,
              NULL);

    make_npy_header(&b, 1, "<f4", 1, "(3, 4)");
    for (i = 0; i < 12; i++) b_f32(&b, 1.0f, 0);
    write_bytes("fortran.npy", &b);
    b_free(&b);
    probe_err("fortran.npy", NULL, XKNN_ERROR_FORMAT, "npy: Fortran order is refused", "Fortran order", NULL, NULL);

    make_npy_header(&b, 1, "<c8", 0, "(3, 4)");
    for (i = 0; i < 24; i++) b_f32(&b, 1.0f, 0);
    write_bytes("complex.npy", &b);
    b_free(&b);
    probe_err("complex.npy", NULL, XKNN_ERROR_FORMAT, "npy: unknown dtype", "dtype '<c8'", "not supported", NULL);

    make_npy_header(&b, 1, ">f4", 0, "(3, 4)");
    for (i = 0; i < 12; i++) b_f32(&b, 1.0f, 1);
    write_bytes("bigend.npy", &b);
    b_free(&b);
    probe_err("bigend.npy", NULL, XKNN_ERROR_FORMAT, "npy: big-endian dtype is refused", "dtype '>f4'", NULL, NULL);

    b_put(&b, "\x93NUMPZ\x01\x00\x10\x00", 10);
    for (i = 0; i < 64; i++) b_u8(&b, ' ');
    write_bytes("magic.npy", &b);
    b_free(&b);
    probe_err("magic.npy", NULL, XKNN_ERROR_FORMAT, "npy: bad magic", "magic", NULL, NULL);

#ifdef XKNN_HAVE_ZLIB
    { /* a .gz cut in the middle: the probe's stream count sees it */
        float big[3000];
        struct stat sb;
        ref_make_data(DATA_GAUSSIAN, big, 1000, 3, 15);
        make_vecs(&b, 1000, 3, XKNN_ELEM_F32, big);
        write_gz("cut.fvecs.gz", &b);
        b_free(&b);
        if (stat(tpath(path, "cut.fvecs.gz"), &sb) != 0 || truncate(path, sb.st_size / 2) != 0)
            bail("cannot truncate %s", path);
        probe_err("cut.fvecs.gz", NULL, XKNN_ERROR_FORMAT, "a truncated gzip stream is a format error",
                  "truncated gzip", NULL, NULL);

        make_vecs(&b, 1000, 3, XKNN_ELEM_F32, big);
        write_gz("bad.fvecs.gz", &b);
        b_free(&b);
        { /* flip bits in the middle of the deflate data: corrupt data or a CRC mismatch */
            int fd = open(tpath(path, "bad.fvecs.gz"), O_RDWR);
            unsigned char c;
            if (fd < 0 || stat(path, &sb) != 0 || pread(fd, &c, 1, sb.st_size / 2) != 1) bail("cannot open %s", path);
            c ^= 0x5a;
            if (pwrite(fd, &c, 1, sb.st_size / 2) != 1 || close(fd) != 0) bail("cannot write %s", path);
        }
        probe_err("bad.fvecs.gz", NULL, XKNN_ERROR_FORMAT, "corrupt gzip data is a format error", "gzip", NULL,
                  NULL);
    }
#else
    skip(2, "built without zlib");
#endif

#ifndef XKNN_HAVE_ZLIB
    make_bin_header(&b, 1, 1);
    b_f32(&b, 1.0f, 0);
    write_bytes("plain.fbin.gz", &b);
    b_free(&b);
    probe_err("plain.fbin.gz", NULL, XKNN_ERROR_NOT_BUILT, ".gz without zlib: not built", "built without zlib", NULL,
              NULL);
#else
    skip(1, "zlib is built in: the not-built message cannot be shown");
#endif
}

static void test_values(void)
{
    const uint32_t dims[2] = {4, 3};
    char path[4096];
    xknn_read_opts o = XKNN_READ_OPTS_INIT;
    xknn_file_info info;
    xknn_error err;
    xknn_status st;
    bytes b = {0};
    float f[N * D], *out;
    int64_t i;

    ref_make_data(DATA_UNIFORM, f, N, D, 16);
    f[13 * D + 2] = NAN;
    make_bin_header(&b, N, D);
    b_f32s(&b, f, N * D);
    write_bytes("nan.fbin", &b);
    b_free(&b);
    out = probe_read("nan.fbin", NULL, &info, 10, 10, &err, &st);
    check_err(st, &err, XKNN_ERROR_INVALID_VALUE, tpath(path, "nan.fbin"),
              "NaN in rows [10, 20): global row and column named", "row 13 column 2 is NaN", NULL, NULL);
    free(out);
    out = probe_read("nan.fbin", NULL, &info, 0, 13, &err, &st);
    ok(st == XKNN_SUCCESS, "rows before the NaN read fine");
    free(out);

    f[13 * D + 2] = 0.5f;
    f[30 * D + 4] = -INFINITY;
    make_vecs(&b, N, D, XKNN_ELEM_F32, f);
    write_read_err("inf.fvecs", &b, NULL, XKNN_ERROR_INVALID_VALUE, "-Inf in .fvecs: row and column named",
                   "row 30 column 4 is Inf", NULL, NULL);

    make_bin_header(&b, 2, 3);
    for (i = 0; i < 6; i++) b_u16(&b, i == 4 ? 0x7e00u : 0x3c00u, 0);
    o.bin_dtype = XKNN_ELEM_F16;
    write_read_err("nan16.bin", &b, &o, XKNN_ERROR_INVALID_VALUE, "f16 NaN: row and column named",
                   "row 1 column 1 is NaN", NULL, NULL);

    make_npy_header(&b, 1, "<f8", 0, "(2, 2)");
    b_f64(&b, 1.0, 0);
    b_f64(&b, 2.0, 0);
    b_f64(&b, 3.0, 0);
    b_f64(&b, 1e300, 0);
    write_read_err("range.npy", &b, NULL, XKNN_ERROR_INVALID_VALUE, "f64 beyond float32 range is refused",
                   "row 1 column 1", "float32 range", NULL);

    make_idx_header(&b, 0x0D, 2, dims);
    for (i = 0; i < 12; i++) b_f32(&b, i == 7 ? NAN : (float)i, 1);
    write_read_err("nan.idx", &b, NULL, XKNN_ERROR_INVALID_VALUE, "big-endian IDX f32 NaN: row and column",
                   "row 2 column 1 is NaN", NULL, NULL);

    make_bin_header(&b, 1, 2);
    b_u32(&b, 16777216u, 0);
    b_u32(&b, 16777217u, 0);
    write_read_err("inexact.ibin", &b, NULL, XKNN_ERROR_INVALID_VALUE, "int32 2^24+1 is refused, not rounded",
                   "row 0 column 1", "16777217", NULL);

    /* rows outside [0, rows) */
    {
        float one[D * 2];
        int good;
        st = xknn_file_probe(tpath(path, "a.fbin"), NULL, &info, &err);
        good = st == XKNN_SUCCESS;
        good = good && xknn_file_read_rows(path, &info, N - 1, 2, one, &err) == XKNN_ERROR_INVALID_ARGUMENT &&
               strstr(err.message, path) == err.message;
        good = good && xknn_file_read_rows(path, &info, -1, 1, one, &err) == XKNN_ERROR_INVALID_ARGUMENT;
        good = good && xknn_file_read_rows(path, &info, N, 0, one, &err) == XKNN_SUCCESS;
        ok(good, "rows outside [0, n) are an invalid argument; an empty range is fine");
        if (!good) diag("%s", err.message);
    }
}

/* A sparse .fbin beyond 4 GiB: the last row sits past every 32-bit offset. */
static void test_large(void)
{
    const int64_t n = 1100000, d = 1024;
    const int64_t size = 8 + n * d * 4;
    char path[4096];
    float row[1024], out[2 * 1024], want[2 * 1024];
    unsigned char hdr[8];
    xknn_file_info info;
    xknn_error err;
    xknn_status st;
    int fd, i;

    for (i = 0; i < 1024; i++) row[i] = (float)i * 0.25f - 7.0f;
    memset(want, 0, sizeof want);
    memcpy(want + 1024, row, sizeof row);
    fd = open(tpath(path, "large.fbin"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    hdr[0] = (unsigned char)(n & 0xff);
    hdr[1] = (unsigned char)(n >> 8 & 0xff);
    hdr[2] = (unsigned char)(n >> 16 & 0xff);
    hdr[3] = (unsigned char)(n >> 24 & 0xff);
    hdr[4] = 0;
    hdr[5] = 4; /* d = 1024 */
    hdr[6] = hdr[7] = 0;
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 || pwrite(fd, hdr, 8, 0) != 8 ||
        pwrite(fd, row, sizeof row, (off_t)(size - (int64_t)sizeof row)) != (ssize_t)sizeof row) {
        diag("cannot make a sparse %lld-byte file: %s", (long long)size, strerror(errno));
        if (fd >= 0) close(fd);
        unlink(path);
        skip(2, "no sparse file beyond 4 GiB here");
        return;
    }
    close(fd);
    st = xknn_file_probe(path, NULL, &info, &err);
    ok(st == XKNN_SUCCESS && info.rows == n && info.cols == d, "fbin of %lld bytes (> 4 GiB) probes as %lld x %lld",
       (long long)size, (long long)n, (long long)d);
    if (st != XKNN_SUCCESS) diag("%s", err.message);
    st = xknn_file_read_rows(path, &info, n - 2, 2, out, &err);
    ok(st == XKNN_SUCCESS && same_bits(out, want, 2 * d), "its last two rows (offset > 4 GiB) read back");
    if (st != XKNN_SUCCESS) diag("%s", err.message);
    unlink(path);
}

static void test_fmnist(void)
{
    static const struct {
        const char *file;
        int64_t rows, cols;
    } sets[] = {{FMNIST_DIR "/train-images-idx3-ubyte.gz", 60000, 784},
                {FMNIST_DIR "/t10k-images-idx3-ubyte.gz", 10000, 784},
                {FMNIST_DIR "/train-labels-idx1-ubyte.gz", 60000, 1}};
    size_t s;
    for (s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        xknn_file_info info;
        xknn_error err;
        xknn_status st;
        struct timespec t0, t1;
        double secs;
        float row[784];
        int64_t j, nz = 0, integral = 1;
        if (access(sets[s].file, R_OK) != 0) {
            skip(s == 0 ? 4 : 2, "%s is absent", sets[s].file);
            continue;
        }
#ifndef XKNN_HAVE_ZLIB
        skip(s == 0 ? 4 : 2, "built without zlib");
        continue;
#endif
        clock_gettime(CLOCK_MONOTONIC, &t0);
        st = xknn_file_probe(sets[s].file, NULL, &info, &err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        ok(st == XKNN_SUCCESS && info.format == XKNN_FORMAT_IDX && info.elem == XKNN_ELEM_U8 && info.compressed &&
               info.rows == sets[s].rows && info.cols == sets[s].cols,
           "%s probes as %lld x %lld uint8 (%.3f s)", sets[s].file, (long long)sets[s].rows, (long long)sets[s].cols,
           secs);
        if (st != XKNN_SUCCESS) diag("%s", err.message);
        if (s == 0) ok(secs < 1.0, "probing the 26 MB .gz takes %.3f s (< 1 s)", secs);
        st = st == XKNN_SUCCESS ? xknn_file_read_rows(sets[s].file, &info, 0, 1, row, &err) : st;
        for (j = 0; st == XKNN_SUCCESS && j < info.cols; j++) {
            nz += row[j] != 0.0f;
            integral = integral && row[j] >= 0.0f && row[j] <= 255.0f && row[j] == floorf(row[j]);
        }
        ok(st == XKNN_SUCCESS && integral && (info.cols == 1 || nz > 0), "%s: row 0 reads (%lld nonzero of %lld)",
           sets[s].file, (long long)nz, (long long)info.cols);
        if (st != XKNN_SUCCESS) diag("%s", err.message);
#ifdef XKNN_HAVE_ZLIB
        if (s == 0) { /* the last row, 47 MB into the stream, against zlib directly */
            unsigned char *all = (unsigned char *)malloc((size_t)(16 + 60000 * 784));
            gzFile g = gzopen(sets[s].file, "rb");
            int good = all && g && gzread(g, all, 16 + 60000 * 784) == 16 + 60000 * 784;
            if (g) gzclose(g);
            st = xknn_file_read_rows(sets[s].file, &info, 59999, 1, row, &err);
            good = good && st == XKNN_SUCCESS;
            for (j = 0; good && j < 784; j++) good = row[j] == (float)all[16 + 59999 * 784 + j];
            ok(good, "%s: row 59999 (read by skipping) matches zlib's bytes", sets[s].file);
            if (st != XKNN_SUCCESS) diag("%s", err.message);
            free(all);
        }
#endif
    }
}

/* ---- result files ------------------------------------------------------------------ */

/* One test line for a result read back with status st: nq x k as wanted, the ids equal
 * ids and the distances dist's bits, or, for dist NULL, no distances returned. Frees
 * both buffers and sets them to NULL. */
static void ok_result_read(xknn_status st, const xknn_error *err, const int64_t *nq, const int64_t *k,
                           int64_t want_nq, int64_t want_k, int64_t **rid, float **rdist, const int64_t *ids,
                           const float *dist, const char *what)
{
    int good = st == XKNN_SUCCESS && *nq == want_nq && *k == want_k && (dist || *rdist == NULL);
    int64_t i;
    for (i = 0; good && i < want_nq * want_k; i++) good = (*rid)[i] == ids[i];
    ok(good && (!dist || same_bits(*rdist, dist, want_nq * want_k)), "%s", what);
    if (st != XKNN_SUCCESS) diag("%s", err->message);
    free(*rid);
    free(*rdist);
    *rid = NULL;
    *rdist = NULL;
}

static void test_results(void)
{
    enum { NQ = 23, K = 7 };
    int64_t ids[NQ * K], ids64[NQ * K], *rid = NULL;
    float dist[NQ * K], *rdist = NULL;
    int64_t nq, k, i;
    char path[4096], sub[2048];
    xknn_result_layout lay;
    xknn_error err;
    xknn_status st;
    unsigned char hdr[8], ib[NQ * K * 8], db[NQ * K * 4]; /* ib: room for bin64 */
    FILE *f;
    int good;

    for (i = 0; i < NQ * K; i++) {
        ids[i] = (i * 7919) % 100003 - (i == 5 ? 100 : 0);
        ids64[i] = (int64_t)INT32_MAX + 1 + i * 1000003;
        dist[i] = (float)i * 0.37f - 3.0f;
    }
    dist[3] = -0.0f;
    dist[4] = INFINITY;

    is_int(xknn_result_format_from_path("x/out.ivecs"), XKNN_RESULT_IVECS, "'.ivecs' means the ivecs result format");
    is_int(xknn_result_format_from_path("x/out.bin"), XKNN_RESULT_BIN, "anything else means bin");

    st = xknn_result_layout_of(XKNN_RESULT_BIN, NQ, K, &lay, &err);
    ok(st == XKNN_SUCCESS && lay.header_bytes == 8 && lay.ids_offset == 8 && lay.ids_row_bytes == 4 * K &&
           lay.dist_offset == 8 + 4 * NQ * K && lay.dist_row_bytes == 4 * K && lay.total_bytes == 8 + 8 * NQ * K,
       "bin layout");
    st = xknn_result_layout_of(XKNN_RESULT_BIN64, NQ, K, &lay, &err);
    ok(st == XKNN_SUCCESS && lay.ids_row_bytes == 8 * K && lay.dist_offset == 8 + 8 * NQ * K &&
           lay.total_bytes == 8 + 12 * NQ * K,
       "bin64 layout");
    st = xknn_result_layout_of(XKNN_RESULT_IVECS, NQ, K, &lay, &err);
    ok(st == XKNN_SUCCESS && lay.header_bytes == 0 && lay.ids_offset == 0 && lay.ids_row_bytes == 4 + 4 * K &&
           lay.dist_row_bytes == 0 && lay.total_bytes == NQ * (4 + 4 * K),
       "ivecs layout");
    ok(xknn_result_layout_of(XKNN_RESULT_BIN, 0, K, &lay, &err) == XKNN_ERROR_INVALID_ARGUMENT &&
           xknn_result_layout_of(XKNN_RESULT_BIN, NQ, 0, &lay, &err) == XKNN_ERROR_INVALID_ARGUMENT &&
           xknn_result_layout_of(XKNN_RESULT_AUTO, NQ, K, &lay, &err) == XKNN_ERROR_INVALID_ARGUMENT &&
           xknn_result_layout_of(XKNN_RESULT_BIN, (int64_t)1 << 32, K, &lay, &err) == XKNN_ERROR_INVALID_ARGUMENT,
       "layout refuses nq = 0, k = 0, AUTO, nq beyond uint32");

    /* bin: file bytes = header + encoded rows */
    st = xknn_result_write(tpath(path, "r.bin"), XKNN_RESULT_AUTO, NQ, K, ids, dist, &err);
    if (st != XKNN_SUCCESS) diag("%s", err.message);
    xknn_result_header(XKNN_RESULT_BIN, NQ, K, hdr);
    st = xknn_result_encode_rows(XKNN_RESULT_BIN, NQ, K, ids, dist, ib, db, &err);
    {
        unsigned char file[8 + 8 * NQ * K];
        good = st == XKNN_SUCCESS && (f = fopen(path, "rb")) != NULL;
        if (good) {
            good = fread(file, 1, sizeof file, f) == sizeof file && fgetc(f) == EOF;
            fclose(f);
        }
        good = good && !memcmp(file, hdr, 8) && !memcmp(file + 8, ib, 4 * NQ * K) &&
               !memcmp(file + 8 + 4 * NQ * K, db, 4 * NQ * K) && file[0] == NQ && file[4] == K;
        ok(good, "bin result file = header + encoded ids + encoded distances");
    }
    st = xknn_result_read(path, XKNN_RESULT_AUTO, &nq, &k, &rid, &rdist, &err);
    ok_result_read(st, &err, &nq, &k, NQ, K, &rid, &rdist, ids, dist,
                   "bin result round trip (ids, distance bits incl. -0 and Inf)");

    /* bin64 with ids beyond int32 */
    st = xknn_result_write(tpath(path, "r64.bin"), XKNN_RESULT_BIN64, NQ, K, ids64, dist, &err);
    if (st == XKNN_SUCCESS) st = xknn_result_read(path, XKNN_RESULT_BIN64, &nq, &k, &rid, &rdist, &err);
    ok_result_read(st, &err, &nq, &k, NQ, K, &rid, &rdist, ids64, dist, "bin64 result round trip with ids > 2^31-1");
    st = xknn_result_read(path, XKNN_RESULT_BIN, &nq, &k, &rid, &rdist, &err);
    check_err(st, &err, XKNN_ERROR_FORMAT, path, "a bin64 file read as bin: size mismatch", "does not match header",
              NULL, NULL);
    ok(rid == NULL && rdist == NULL, "failed result read returns no buffers");

    /* ivecs */
    st = xknn_result_write(tpath(path, "r.ivecs"), XKNN_RESULT_AUTO, NQ, K, ids, NULL, &err);
    if (st == XKNN_SUCCESS) st = xknn_result_read(path, XKNN_RESULT_AUTO, &nq, &k, &rid, &rdist, &err);
    ok_result_read(st, &err, &nq, &k, NQ, K, &rid, &rdist, ids, NULL, "ivecs result round trip (ids only)");
    {
        xknn_file_info info;
        float out[NQ * K];
        st = xknn_file_probe(path, NULL, &info, &err); /* it is an .ivecs data file as well */
        if (st == XKNN_SUCCESS) st = xknn_file_read_rows(path, &info, 0, NQ, out, &err);
        good = st == XKNN_SUCCESS && info.rows == NQ && info.cols == K;
        for (i = 0; good && i < NQ * K; i++) good = out[i] == (float)ids[i];
        ok(good, "the ivecs result reads as an .ivecs data file");
    }

    /* ids beyond int32 are refused for bin and ivecs, never truncated */
    st = xknn_result_write(tpath(path, "big.bin"), XKNN_RESULT_BIN, NQ, K, ids64, dist, &err);
    check_err(st, &err, XKNN_ERROR_INVALID_ARGUMENT, path, "bin refuses id > INT32_MAX, suggests BIN64",
              "2147483648", "BIN64", NULL);
    ok(!exists(path), "and writes nothing");
    st = xknn_result_write(tpath(path, "big.ivecs"), XKNN_RESULT_AUTO, NQ, K, ids64, NULL, &err);
    check_err(st, &err, XKNN_ERROR_INVALID_ARGUMENT, path, "ivecs refuses id > INT32_MAX", "BIN64", NULL, NULL);
    st = xknn_result_encode_rows(XKNN_RESULT_BIN, NQ, K, ids64, dist, ib, db, &err);
    ok(st == XKNN_ERROR_INVALID_ARGUMENT && strstr(err.message, "BIN64") != NULL,
       "encode_rows refuses id > INT32_MAX for bin");
    st = xknn_result_encode_rows(XKNN_RESULT_BIN64, NQ, K, ids64, dist, ib, db, &err);
    ok(st == XKNN_SUCCESS, "encode_rows takes it for bin64");

    { /* the result file gets mode 0666 minus the umask, like any new file */
        struct stat sb;
        mode_t mask = umask(022);
        int have = stat(tpath(path, "r.bin"), &sb) == 0;
        umask(mask);
        ok(have && (sb.st_mode & 0777) == (0666 & ~mask), "result file mode is 0666 minus the umask (0%o)",
           have ? (unsigned)(sb.st_mode & 0777) : 0u);
    }

    /* overwrite: the new content replaces the old */
    st = xknn_result_write(tpath(path, "r.bin"), XKNN_RESULT_BIN, 1, K, ids, dist, &err);
    if (st == XKNN_SUCCESS) st = xknn_result_read(path, XKNN_RESULT_BIN, &nq, &k, &rid, &rdist, &err);
    ok(st == XKNN_SUCCESS && nq == 1 && k == K, "rewriting a result replaces it");
    free(rid);
    free(rdist);
    rid = NULL;
    rdist = NULL;

    /* failures leave nothing behind */
    snprintf(sub, sizeof sub, "%s/missing-dir/out.bin", tdir);
    st = xknn_result_write(sub, XKNN_RESULT_BIN, NQ, K, ids, dist, &err);
    check_err(st, &err, XKNN_ERROR_IO, sub, "writing into a missing directory fails with strerror",
              strerror(ENOENT), NULL, NULL);
    snprintf(sub, sizeof sub, "%s/r.ivecs/out.bin", tdir);
    st = xknn_result_write(sub, XKNN_RESULT_BIN, NQ, K, ids, dist, &err);
    check_err(st, &err, XKNN_ERROR_IO, sub, "writing under a regular file fails with strerror", strerror(ENOTDIR),
              NULL, NULL);
    st = xknn_result_write(tdir, XKNN_RESULT_BIN, NQ, K, ids, dist, &err);
    check_err(st, &err, XKNN_ERROR_IO, tdir, "a directory as target is refused", strerror(EISDIR), NULL, NULL);

    snprintf(sub, sizeof sub, "%s/ro", tdir);
    if (mkdir(sub, 0555) != 0) bail("mkdir %s: %s", sub, strerror(errno));
    snprintf(path, sizeof path, "%s/out.bin", sub);
    if (access(sub, W_OK) == 0) {
        skip(1, "running as root: a read-only directory is writable");
    } else {
        st = xknn_result_write(path, XKNN_RESULT_BIN, NQ, K, ids, dist, &err);
        good = check_err(st, &err, XKNN_ERROR_IO, path, "read-only directory: fails with strerror",
                         strerror(EACCES), NULL, NULL);
        (void)good;
    }
    ok(count_temps(sub) == 0 && !exists(path), "read-only directory: nothing left");

    if (access("/dev/full", W_OK) == 0) {
        struct stat sb;
        st = xknn_result_write("/dev/full", XKNN_RESULT_BIN, NQ, K, ids, dist, &err);
        check_err(st, &err, XKNN_ERROR_IO, "/dev/full", "/dev/full: ENOSPC reported", strerror(ENOSPC), NULL, NULL);
        ok(stat("/dev/full", &sb) == 0 && S_ISCHR(sb.st_mode) && count_temps("/dev") == 0,
           "/dev/full is still the device (written in place, never replaced)");
    } else {
        skip(2, "no writable /dev/full");
    }
    if (access("/dev/null", W_OK) == 0) {
        struct stat sb;
        st = xknn_result_write("/dev/null", XKNN_RESULT_BIN, NQ, K, ids, dist, &err);
        ok(st == XKNN_SUCCESS && stat("/dev/null", &sb) == 0 && S_ISCHR(sb.st_mode),
           "/dev/null takes a result and stays a device");
    } else {
        skip(1, "no writable /dev/null");
    }

    { /* a write that stops short (file size limit): temporary removed, target absent */
        struct rlimit old, lim;
        void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
        int64_t bids[4096];
        float bdist[4096];
        for (i = 0; i < 4096; i++) {
            bids[i] = i;
            bdist[i] = (float)i;
        }
        tpath(path, "fsize.bin");
        if (getrlimit(RLIMIT_FSIZE, &old) != 0) bail("getrlimit: %s", strerror(errno));
        lim = old;
        lim.rlim_cur = 4096;
        if (setrlimit(RLIMIT_FSIZE, &lim) != 0) {
            skip(2, "cannot lower RLIMIT_FSIZE");
        } else {
            st = xknn_result_write(path, XKNN_RESULT_BIN, 512, 8, bids, bdist, &err);
            if (setrlimit(RLIMIT_FSIZE, &old) != 0) bail("cannot restore RLIMIT_FSIZE");
            check_err(st, &err, XKNN_ERROR_IO, path, "short write (file size limit) is an I/O error",
                      strerror(EFBIG), "removed", NULL);
            ok(!exists(path) && count_temps(tdir) == 0, "short write: no target, no temporary left");
        }
        signal(SIGXFSZ, oldsig);
    }

    { /* result files with bad sizes */
        bytes b = {0};
        make_bin_header(&b, 3, 2);
        for (i = 0; i < 11; i++) b_u32(&b, 1, 0);
        write_bytes("bad.bin", &b);
        b_free(&b);
        st = xknn_result_read(tpath(path, "bad.bin"), XKNN_RESULT_BIN, &nq, &k, &rid, &rdist, &err);
        check_err(st, &err, XKNN_ERROR_FORMAT, path, "result read: size mismatch named",
                  "does not match header nq=3 k=2", NULL, NULL);
    }
    ok(count_temps(tdir) == 0, "no temporary files left in the test directory");
}

static void test_names(void)
{
    ok(xknn_elem_from_name("f16") == XKNN_ELEM_F16 && xknn_elem_from_name("uint8") == XKNN_ELEM_U8 &&
           xknn_elem_from_name("float32") == XKNN_ELEM_F32 && xknn_elem_from_name("nope") == XKNN_ELEM_COUNT &&
           xknn_elem_size(XKNN_ELEM_F64) == 8 && !strcmp(xknn_elem_name(XKNN_ELEM_I16), "int16") &&
           !strcmp(xknn_file_format_name(XKNN_FORMAT_IDX), "idx"),
       "dtype and format names");
}

int main(void)
{
    plan(149);
    snprintf(tdir, sizeof tdir, "/tmp/xknn-io-XXXXXX");
    if (!mkdtemp(tdir)) bail("mkdtemp: %s", strerror(errno));
    diag("files in %s", tdir);
#ifndef XKNN_HAVE_ZLIB
    diag("built without zlib: .gz cases are skipped");
#endif
    test_names();
    test_texmex();
    test_bin();
    test_f16();
    test_native();
    test_npy();
    test_idx();
    test_malformed();
    test_values();
    test_large();
    test_fmnist();
    test_results();
    remove_tree(tdir);
    return tap_done();
}
