/* SPDX-License-Identifier: MIT */
/* io-par-t: the threaded direct read of xknn_file_read_rows_as (plain .fbin, .u8bin,
 * .i8bin; files over two 64 MiB preads, so two threads with OMP_NUM_THREADS=2, which
 * meson sets). Rows equal the file's, whole or in part; the outcome is the serial
 * reader's for any thread count: the first NaN/Inf in row order whichever thread
 * found it, a short file before any bad value. TAP. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap/tap.h"
#include "xknn.h"
#include "xknn/io.h"

enum { FD = 16, FROWS = 1500000, UD = 64, UROWS = 1100000 };

static char tdir[64], path[128];

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* A big-ann file: header (n, d), then bytes. */
static void write_bin(const char *p, uint32_t n, uint32_t d, const void *data, size_t bytes)
{
    unsigned char h[8];
    FILE *f = fopen(p, "wb");
    if (!f) bail("%s: %s", p, strerror(errno));
    put_u32(h, n);
    put_u32(h + 4, d);
    if (fwrite(h, 1, 8, f) != 8 || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) bail("writing %s", p);
}

static xknn_status read_as(const char *p, int64_t row0, int64_t n, xknn_dtype as, void *out, xknn_error *e)
{
    xknn_file_info info;
    xknn_status st = xknn_file_probe(p, NULL, &info, e);
    return st == XKNN_SUCCESS ? xknn_file_read_rows_as(p, &info, row0, n, as, out, e) : st;
}

static void floats(void)
{
    const size_t n = (size_t)FROWS * FD;
    float *v = (float *)malloc(n * sizeof(float)), *got = (float *)malloc(n * sizeof(float));
    xknn_file_info info;
    xknn_error e;
    xknn_status st;
    size_t i;
    if (!v || !got) bail("out of memory");
    for (i = 0; i < n; i++) v[i] = (float)(i % 1009) - 500.0f;
    snprintf(path, sizeof path, "%s/big.fbin", tdir);
    write_bin(path, FROWS, FD, v, n * sizeof(float));
    st = read_as(path, 0, FROWS, XKNN_DTYPE_F32, got, &e);
    ok(st == XKNN_SUCCESS && !memcmp(v, got, n * sizeof(float)), "float32: %d rows of %d read whole", FROWS, FD);
    memset(got, 0, n * sizeof(float));
    st = read_as(path, 1234, 1200000, XKNN_DTYPE_F32, got, &e);
    ok(st == XKNN_SUCCESS && !memcmp(v + 1234 * FD, got, (size_t)1200000 * FD * sizeof(float)),
       "float32: rows 1234 .. 1201233");
    /* a NaN in the second half, an Inf in the first: the Inf is reported */
    v[(size_t)1200000 * FD + 3] = NAN;
    v[(size_t)100 * FD + 5] = INFINITY;
    write_bin(path, FROWS, FD, v, n * sizeof(float));
    st = read_as(path, 0, FROWS, XKNN_DTYPE_F32, got, &e);
    ok(st == XKNN_ERROR_INVALID_VALUE && strstr(e.message, "row 100 column 5 is Inf"), "the first bad value: %s",
       e.message);
    v[(size_t)100 * FD + 5] = 1.0f;
    write_bin(path, FROWS, FD, v, n * sizeof(float));
    st = read_as(path, 0, FROWS, XKNN_DTYPE_F32, got, &e);
    ok(st == XKNN_ERROR_INVALID_VALUE && strstr(e.message, "row 1200000 column 3 is NaN"),
       "a bad value in the second thread's range: %s", e.message);
    st = read_as(path, 5, 1000000, XKNN_DTYPE_F32, got, &e);
    ok(st == XKNN_SUCCESS, "rows before the bad one read");
    /* a short file (changed after the probe) before any bad value, an Inf in the first half */
    v[(size_t)10 * FD] = -INFINITY;
    write_bin(path, FROWS, FD, v, n * sizeof(float));
    st = xknn_file_probe(path, NULL, &info, &e);
    if (st == XKNN_SUCCESS && truncate(path, 8 + (off_t)1300000 * FD * 4 + 7) != 0)
        bail("truncate: %s", strerror(errno));
    if (st == XKNN_SUCCESS) st = xknn_file_read_rows_as(path, &info, 0, FROWS, XKNN_DTYPE_F32, got, &e);
    ok(st == XKNN_ERROR_FORMAT && strstr(e.message, "ends before row 1300000"), "a short file first: %s", e.message);
    free(v);
    free(got);
}

static void bytes(xknn_dtype as, const char *ext)
{
    const size_t n = (size_t)UROWS * UD;
    unsigned char *v = (unsigned char *)malloc(n), *got = (unsigned char *)malloc(n);
    xknn_error e;
    xknn_status st;
    size_t i;
    if (!v || !got) bail("out of memory");
    for (i = 0; i < n; i++) v[i] = (unsigned char)(i * 7 + i / 251);
    snprintf(path, sizeof path, "%s/big.%s", tdir, ext);
    write_bin(path, UROWS, UD, v, n);
    st = read_as(path, 0, UROWS, as, got, &e);
    ok(st == XKNN_SUCCESS && !memcmp(v, got, n), "%s: %d rows of %d read whole as %s", ext, UROWS, UD,
       xknn_dtype_name(as));
    st = read_as(path, 77, UROWS - 78, as, got, &e);
    ok(st == XKNN_SUCCESS && !memcmp(v + 77 * UD, got, (size_t)(UROWS - 78) * UD), "%s: rows 77 .. %d", ext, UROWS - 2);
    remove(path);
    free(v);
    free(got);
}

int main(void)
{
    plan(10);
    snprintf(tdir, sizeof tdir, "/tmp/xknn-io-par-XXXXXX");
    if (!mkdtemp(tdir)) bail("mkdtemp: %s", strerror(errno));
    diag("read threads: %d", xknn_thread_budget());
    floats();
    bytes(XKNN_DTYPE_U8, "u8bin");
    bytes(XKNN_DTYPE_I8, "i8bin");
    snprintf(path, sizeof path, "%s/big.fbin", tdir);
    remove(path);
    rmdir(tdir);
    return tap_done();
}
