/* SPDX-License-Identifier: MIT */
/*
 * fuzz_io.h -- shared part of the reader fuzz targets (libFuzzer, clang only).
 *
 * Each target includes this once. It compiles the header-only io code in the same
 * translation unit, stubs the search backends (the readers never call them), writes
 * the fuzzer's bytes to a file with the extension under test in a private temporary
 * directory (/dev/shm when it exists), then probes it and reads every row when the
 * probed size is small (XKNN_FUZZ_MAX_VALUES floats). Any crash, sanitizer report or
 * leak is a bug in include/xknn/io.h. A read that succeeds must not contradict its
 * probe (checked below).
 */
#ifndef XKNN_FUZZ_IO_H
#define XKNN_FUZZ_IO_H

#define _POSIX_C_SOURCE 200809L
#define XKNN_IMPLEMENTATION

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xknn.h"
#include "xknn/io.h"
#include "xknn/impl/backend.h"

#ifdef XKNN_HAVE_ZLIB
#include <zlib.h>
#endif

#include "fuzz_stubs.h"
xknn_status xknn__cuda_search(const xknn__job *job) { (void)job; return XKNN_ERROR_INTERNAL; }
float xknn__canonical(xknn_metric metric, const float *a, const float *b, int64_t d)
{
    (void)metric; (void)a; (void)b; (void)d;
    return 0.0f;
}

enum { XKNN_FUZZ_MAX_VALUES = 1 << 20 }; /* 4 MB of float32 per input at most */

static char xknn_fuzz_dir[256];

static const char *xknn_fuzz_path(const char *name)
{
    static char path[512];
    if (!xknn_fuzz_dir[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(xknn_fuzz_dir, sizeof xknn_fuzz_dir, "%s/xknn-fuzz.XXXXXX", base);
        if (!mkdtemp(xknn_fuzz_dir)) abort();
    }
    snprintf(path, sizeof path, "%s/%s", xknn_fuzz_dir, name);
    return path;
}

static int xknn_fuzz_write(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    if (size && fwrite(data, 1, size, f) != size) {
        fclose(f);
        return -1;
    }
    return fclose(f);
}

#ifdef XKNN_HAVE_ZLIB
/* The bytes, gzip-compressed, so the fuzzer explores the format behind the .gz path. */
static int xknn_fuzz_write_gz(const char *path, const uint8_t *data, size_t size)
{
    gzFile g = gzopen(path, "wb1");
    if (!g) return -1;
    if (size && gzwrite(g, data, (unsigned)size) != (int)size) {
        gzclose(g);
        return -1;
    }
    return gzclose(g) == Z_OK ? 0 : -1;
}
#endif

/* Probe, then read all rows at once, then the last row alone (offset path). */
static void xknn_fuzz_probe_read(const char *path, const xknn_read_opts *opts)
{
    xknn_file_info info;
    xknn_error err;
    xknn_status st;
    float *out;
    memset(&info, 0, sizeof info);
    st = xknn_file_probe(path, opts, &info, &err);
    if (st != XKNN_SUCCESS) {
        if (!memchr(err.message, 0, sizeof err.message)) abort(); /* unterminated message */
        return;
    }
    if (info.rows < 1 || info.cols < 1) abort(); /* probe accepted an empty shape */
    if (info.cols > XKNN_FUZZ_MAX_VALUES || info.rows > XKNN_FUZZ_MAX_VALUES / info.cols) return;
    out = (float *)malloc((size_t)(info.rows * info.cols) * sizeof *out);
    if (!out) return;
    st = xknn_file_read_rows(path, &info, 0, info.rows, out, &err);
    if (st == XKNN_SUCCESS) {
        int64_t i;
        for (i = 0; i < info.rows * info.cols; i++) /* success means finite values */
            if (out[i] != out[i] || out[i] - out[i] != 0.0f) abort();
        (void)xknn_file_read_rows(path, &info, info.rows - 1, 1, out, &err);
    }
    /* Out-of-range requests must be refused, not read. */
    if (xknn_file_read_rows(path, &info, info.rows, 1, out, &err) == XKNN_SUCCESS) abort();
    free(out);
}

/* Writes data to `name` (gzip-compressing it first when compress is set and zlib is
 * built in), probes and reads it, removes it. Always returns 0 (libFuzzer's contract). */
static int xknn_fuzz_run_file(const char *name, int compress, const uint8_t *data, size_t size)
{
    const char *path = xknn_fuzz_path(name);
#ifdef XKNN_HAVE_ZLIB
    if (compress) {
        if (xknn_fuzz_write_gz(path, data, size)) return 0;
    } else
#endif
    if (xknn_fuzz_write(path, data, size))
        return 0;
    (void)compress;
    xknn_fuzz_probe_read(path, NULL);
    unlink(path);
    return 0;
}

#endif /* XKNN_FUZZ_IO_H */
