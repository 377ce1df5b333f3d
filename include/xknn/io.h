/* SPDX-License-Identifier: MIT */
/*
 * xknn/io.h -- readers and writers of the data formats (docs/DESIGN.md section 3).
 * Host code; the implementation is compiled behind XKNN_IMPLEMENTATION (libxknn does).
 * Nothing here knows about MPI: a rank reads its rows with xknn_file_read_rows().
 *
 * Formats (chosen by extension, little-endian, ".gz" read transparently where noted):
 *   .fvecs .ivecs .bvecs    TEXMEX: per row int32 d, then d float32 / int32 / uint8
 *   .fbin .u8bin .i8bin .ibin  big-ann: uint32 n, uint32 d, then n*d values
 *   .bin                    same layout as .fbin; float32 unless opts.bin_dtype says
 *                           (f32, f16, u8, i8 or i32)
 *   .npy                    v1/v2/v3 header, C order, <f4 <f2 <f8 |u1 |i1 <i2 <i4 <i8;
 *                           1-D arrays are n x 1, N-D arrays n x (product of the rest)
 *   IDX (*-idx3-ubyte, *.idx1-ubyte, *.idx)  big-endian MNIST layout: rows = first
 *                           dimension, cols = product of the others
 * Every one of them may carry a ".gz" suffix: it is then read through zlib (a library
 * built without zlib answers XKNN_ERROR_NOT_BUILT), by streaming from the start.
 * xknn_file_read_rows converts to float32 rows on read (the historical interface) and
 * xknn_file_read_rows_as keeps the file's own type where xknn has one (u8, i8, f16,
 * f32: xknn_file_native_dtype) or packs uint8 bytes into bits (XKNN_DTYPE_BIN). Both
 * check values: NaN or Inf is an error naming the file, row and column. The
 * conversion is exact for u8, i8, i16 and f16; an i32 or i64 value that float32 cannot hold
 * exactly (|v| > 2^24 and not representable) is refused (INVALID_VALUE), never rounded;
 * f64 values are rounded to nearest float32 and refused when outside its range.
 * Headers are validated against the file size before anything is allocated; sizes are
 * computed in int64 with every multiplication checked.
 *
 * Results are written in the big-ann ground-truth layout (".bin" or any other name):
 * uint32 nq, uint32 k, int32 ids[nq*k], float32 dist[nq*k]; or ".ivecs" (per row int32
 * k then k int32 ids). Ids above 2^31-1 need XKNN_RESULT_BIN64 (int64 ids), chosen
 * explicitly; ids are never truncated. Writers go to a temporary name in the same
 * directory and rename when complete.
 *
 * Byte order: files are decoded and encoded byte by byte (little-endian, IDX big-endian)
 * so any host works; the fast path that reads float32 rows straight into the caller's
 * buffer is taken only on little-endian hosts (all supported targets are).
 * Platform: POSIX (open, pread, fstat, fsync, rename). A translation unit that defines
 * XKNN_IMPLEMENTATION under strict C99 must define _POSIX_C_SOURCE 200809L (or
 * _GNU_SOURCE) before its first #include, as src/xknn.c does.
 * Error messages start with the path as given: "ref.fbin: size 1000 bytes does not match
 * header n=10 d=3 (expected 128 bytes)". Every function here is thread-safe (no state is
 * shared between calls) and none is collective.
 */
#ifndef XKNN_IO_H
#define XKNN_IO_H

#include <stdint.h>

#include "../xknn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum xknn_file_format {
    XKNN_FORMAT_AUTO = 0, /* from the file name                       */
    XKNN_FORMAT_FVECS,
    XKNN_FORMAT_IVECS,
    XKNN_FORMAT_BVECS,
    XKNN_FORMAT_FBIN,
    XKNN_FORMAT_U8BIN,
    XKNN_FORMAT_I8BIN,
    XKNN_FORMAT_IBIN,
    XKNN_FORMAT_F16BIN,   /* ".bin" read with bin_dtype = f16         */
    XKNN_FORMAT_NPY,
    XKNN_FORMAT_IDX,
    XKNN_FORMAT_COUNT
} xknn_file_format;

/* Element type stored in a file. */
typedef enum xknn_elem {
    XKNN_ELEM_F32 = 0,
    XKNN_ELEM_F16,
    XKNN_ELEM_F64,
    XKNN_ELEM_U8,
    XKNN_ELEM_I8,
    XKNN_ELEM_I16,
    XKNN_ELEM_I32,
    XKNN_ELEM_I64,        /* .npy <i8 (NumPy's default integer); float reads refuse
                             values float32 cannot hold exactly                    */
    XKNN_ELEM_COUNT
} xknn_elem;

typedef struct xknn_read_opts {
    xknn_file_format format; /* XKNN_FORMAT_AUTO: from the extension (a ".gz" suffix
                                still means gzip when a format is forced)        */
    xknn_elem bin_dtype;     /* element type of ".bin" files (default f32); one of
                                f32 f16 u8 i8 i32 (they map to FBIN F16BIN U8BIN
                                I8BIN IBIN)                                      */
} xknn_read_opts;

#define XKNN_READ_OPTS_INIT { XKNN_FORMAT_AUTO, XKNN_ELEM_F32 }

/* What a file holds, from its header (and size). Offsets are in the uncompressed
 * stream. Row i's values start at data_offset + i*row_bytes; for TEXMEX files each
 * row's int32 d sits in the 4 bytes before its values. */
typedef struct xknn_file_info {
    xknn_file_format format;
    xknn_elem elem;
    int compressed;       /* 1: gzip (rows are read by streaming)             */
    int64_t rows;         /* n                                                */
    int64_t cols;         /* d (IDX: product of the dimensions after the first) */
    int64_t data_offset;  /* byte offset of row 0 (uncompressed stream)        */
    int64_t row_bytes;    /* bytes from one row to the next                    */
    int big_endian;       /* IDX                                               */
    int64_t file_bytes;   /* size of the (uncompressed) file in bytes          */
} xknn_file_info;

/* Not collective. Reads and validates the header of `path` against its size.
 * opts may be NULL (XKNN_READ_OPTS_INIT). Allocates nothing that depends on the header.
 * TEXMEX files: row 0's d and the last row's d are checked against each other here
 * (for .gz, every row's d, since the whole stream is read to count its size); each row
 * read later is checked again by xknn_file_read_rows().
 * .gz files are decompressed once, from start to end, to count their size.
 * Errors: INVALID_ARGUMENT (NULL path/info, bad opts), NOT_BUILT (.gz without zlib),
 * IO (cannot open/read, names the path and strerror; also for anything but a regular file:
 * a FIFO, device or directory is refused before any read, so none can block), OUT_OF_MEMORY
 * (also when no file descriptor is left: EMFILE, ENFILE), FORMAT (names the path and what is
 * wrong: "file is empty", "truncated header", "size 1000 bytes does not match header
 * n=10 d=3 (expected 128 bytes)", "row 5 has d=7, row 0 has d=8", "d = 0", "n = 0",
 * "overflows", "bad IDX magic", "npy dtype", "Fortran order", "unknown file extension"
 * (with the list of accepted ones), "truncated gzip stream"). */
XKNN_API xknn_status xknn_file_probe(const char *path, const xknn_read_opts *opts, xknn_file_info *info,
                                     xknn_error *err);

/* Not collective. Reads rows [row0, row0 + nrows) of a probed file as float32 into
 * `out` (host memory, nrows x info->cols, row-major, ld = cols). Reads only those rows
 * (pread; for .gz: streams and skips). NaN/Inf -> INVALID_VALUE naming file, row (global
 * row number) and column. Rows outside [0, info->rows) -> INVALID_ARGUMENT; a TEXMEX
 * row whose d differs, or a file shorter than its probe said -> FORMAT. On failure the
 * contents of `out` are unspecified. nrows = 0 succeeds without touching the file. */
XKNN_API xknn_status xknn_file_read_rows(const char *path, const xknn_file_info *info, int64_t row0,
                                         int64_t nrows, float *out, xknn_error *err);

/* Not collective. The xknn dtype that holds a probed file's elements as they are:
 * u8 -> XKNN_DTYPE_U8, i8 -> I8, f16 -> F16, f32 -> F32; f64, i16 and i32 have no xknn
 * dtype and answer F32 (read_rows_as then converts as xknn_file_read_rows does). */
XKNN_API xknn_dtype xknn_file_native_dtype(const xknn_file_info *info);

/* Not collective. Reads rows [row0, row0 + nrows) of a probed file into `out` (host,
 * dense rows, ld = xknn_row_elems(dtype, cols)) as `dtype`:
 *   XKNN_DTYPE_F32                exactly xknn_file_read_rows;
 *   xknn_file_native_dtype(info)  the stored values, byte order fixed (f16 as its bits;
 *                                 NaN/Inf refused as above);
 *   XKNN_DTYPE_BIN                uint8 files only: each row of cols bytes becomes
 *                                 8*cols bits, byte j holding bits 8j..8j+7 (bit b of
 *                                 byte j is bit 8j+b, little-endian as in xknn.h), zero
 *                                 past the last bit; the search then has d = 8*cols.
 * Any other dtype -> INVALID_ARGUMENT. Errors otherwise as xknn_file_read_rows. */
XKNN_API xknn_status xknn_file_read_rows_as(const char *path, const xknn_file_info *info, int64_t row0,
                                            int64_t nrows, xknn_dtype dtype, void *out, xknn_error *err);

/* Names for messages: "fvecs", "npy", "idx"...; "float32", "uint8"... ("unknown" for
 * values out of range). */
XKNN_API const char *xknn_file_format_name(xknn_file_format format);
XKNN_API const char *xknn_elem_name(xknn_elem elem);
/* Bytes per element (0 for values out of range). */
XKNN_API int xknn_elem_size(xknn_elem elem);
/* Parses a dtype name ("f32" "float32" "float" "f16" "float16" "half" "f64" "float64"
 * "double" "u8" "uint8" "i8" "int8" "i16" "int16" "i32" "int32" "i64" "int64"), e.g. a
 * --dtype option;
 * XKNN_ELEM_COUNT if unknown. */
XKNN_API xknn_elem xknn_elem_from_name(const char *name);

/* Result files ---------------------------------------------------------------------- */
typedef enum xknn_result_format {
    XKNN_RESULT_AUTO = 0, /* ".ivecs" -> IVECS, anything else -> BIN                 */
    XKNN_RESULT_BIN,      /* uint32 nq, uint32 k, int32 ids[nq*k], float32 dist[nq*k] */
    XKNN_RESULT_BIN64,    /* uint32 nq, uint32 k, int64 ids[nq*k], float32 dist[nq*k] */
    XKNN_RESULT_IVECS,    /* per row: int32 k, k int32 ids                            */
    XKNN_RESULT_COUNT
} xknn_result_format;

/* Never returns AUTO or BIN64 (BIN64 is always an explicit choice). NULL -> BIN. */
XKNN_API xknn_result_format xknn_result_format_from_path(const char *path);

/* Byte layout of a result file, for writers that place rows at offsets (MPI-IO):
 * header bytes at 0; row i's ids at ids_offset + i*ids_row_bytes; row i's distances
 * at dist_offset + i*dist_row_bytes (dist_row_bytes = 0: no distances in the format).
 * BIN:   header 8, ids_offset 8, ids_row_bytes 4k, dist_offset 8 + 4*nq*k, dist 4k.
 * BIN64: header 8, ids_offset 8, ids_row_bytes 8k, dist_offset 8 + 8*nq*k, dist 4k.
 * IVECS: header 0, ids_offset 0, ids_row_bytes 4 + 4k (the row's int32 k is part of
 *        its ids bytes), dist_offset = total_bytes, dist_row_bytes 0. */
typedef struct xknn_result_layout {
    int64_t total_bytes;
    int64_t header_bytes;
    int64_t ids_offset, ids_row_bytes;
    int64_t dist_offset, dist_row_bytes;
} xknn_result_layout;

/* Not collective. fmt must be BIN, BIN64 or IVECS (resolve AUTO with
 * xknn_result_format_from_path). nq >= 1, k >= 1; BIN/BIN64 need nq, k <= 2^32-1 (uint32
 * header), IVECS needs k <= 2^31-1. Errors: INVALID_ARGUMENT. */
XKNN_API xknn_status xknn_result_layout_of(xknn_result_format fmt, int64_t nq, int64_t k,
                                           xknn_result_layout *layout, xknn_error *err);
/* Encodes the header (8 bytes for BIN/BIN64, none for IVECS) into hdr[8]. Formats
 * without a header (and invalid ones) get 8 zero bytes. */
XKNN_API void xknn_result_header(xknn_result_format fmt, int64_t nq, int64_t k, unsigned char hdr[8]);
/* Encodes rows [0, nrows) of ids/dist (host, ld = k) into the file's byte form for the
 * ids part and the dist part (buffers of nrows*ids_row_bytes and nrows*dist_row_bytes).
 * Fails (INVALID_ARGUMENT) if an id does not fit the format (int32 for BIN/IVECS); the
 * ids are checked before anything is written. dist and dist_bytes may be NULL for IVECS. */
XKNN_API xknn_status xknn_result_encode_rows(xknn_result_format fmt, int64_t nrows, int64_t k, const int64_t *ids,
                                             const float *dist, void *ids_bytes, void *dist_bytes,
                                             xknn_error *err);

/* Not collective. Writes a whole result to `path` via a temporary file in the same
 * directory, renamed at the end; on any failure the temporary is removed and `path`
 * is untouched. fmt AUTO: from the path. ids: nq x k (host, ld = k); dist: nq x k,
 * required unless the format is IVECS.
 * Details: the temporary is ".NAME.tmp.XXXXXX" beside the target, created with
 * O_EXCL and mode 0666 minus the umask, fsync'ed, then renamed over `path` (a symlink
 * at `path` is replaced, not followed); the directory is then fsync'ed (best effort).
 * If `path` exists and is not a regular file (a device such as /dev/null, a FIFO), it
 * is written in place instead. Errors: INVALID_ARGUMENT (ids out of range for the
 * format, bad nq/k), IO (path and strerror), OUT_OF_MEMORY. */
XKNN_API xknn_status xknn_result_write(const char *path, xknn_result_format fmt, int64_t nq, int64_t k,
                                       const int64_t *ids, const float *dist, xknn_error *err);

/* Reads a result file written above (tests, benchmarks). ids/dist allocated with
 * malloc (dist NULL for IVECS); caller frees. fmt AUTO: from the path. dist may be
 * NULL when the distances are not wanted. Sizes are validated like the readers'
 * (FORMAT errors); on failure *ids (and *dist) are NULL. */
XKNN_API xknn_status xknn_result_read(const char *path, xknn_result_format fmt, int64_t *nq, int64_t *k,
                                      int64_t **ids, float **dist, xknn_error *err);

/* Labels and targets ---------------------------------------------------------------- */
/* Not collective. Reads one value per row -- reference labels for a classifier -- as
 * int32 into *labels (malloc'ed, *n values; the caller frees; NULL on failure):
 *   IDX label files (*-idx1-ubyte; uint8, int8, int16 or int32), .npy of an integer
 *   dtype (|u1 |i1 <i2 <i4 <i8; shape (n,) or (n, 1)), .ibin / .u8bin / .i8bin with
 *   d = 1, each optionally ".gz"; or text (".txt" or ".csv", optionally ".gz"): one
 *   decimal integer per line, blanks around it allowed, a final newline optional, no
 *   empty lines.
 * Values must fit int32 (an <i8 value outside it is refused). Errors: FORMAT (more than
 * one column, a float dtype, a text line that is not an integer: names the line), IO,
 * NOT_BUILT (.gz without zlib), OUT_OF_MEMORY, INVALID_VALUE (out of int32 range). */
XKNN_API xknn_status xknn_labels_read(const char *path, int64_t *n, int32_t **labels, xknn_error *err);

/* Not collective. Reads one float value per row -- regression targets -- into *targets
 * (malloc'ed, *n values): any one-column file the data readers accept (converted to
 * float32 like data, NaN/Inf refused), or text (".txt"/".csv"): one number per line
 * (strtod syntax), finite and within the float32 range. Errors as xknn_labels_read. */
XKNN_API xknn_status xknn_targets_read(const char *path, int64_t *n, float **targets, xknn_error *err);

#ifdef __cplusplus
}
#endif

#endif /* XKNN_IO_H */

/* ===================================================================================== */
/*                                  IMPLEMENTATION                                       */
/* ===================================================================================== */
#ifdef XKNN_IMPLEMENTATION
#ifndef XKNN__IO_IMPLEMENTATION_DONE
#define XKNN__IO_IMPLEMENTATION_DONE

#if defined(__STRICT_ANSI__) && !defined(__cplusplus) && !defined(_POSIX_C_SOURCE) && \
    !defined(_XOPEN_SOURCE) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE)
#error "xknn/io.h implementation needs POSIX: #define _POSIX_C_SOURCE 200809L before the first #include"
#endif

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#if defined(_OPENMP)
#include <omp.h>
#endif
#ifdef XKNN_HAVE_ZLIB
#include <zlib.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#ifdef O_CLOEXEC
#define XKNN__O_CLOEXEC O_CLOEXEC
#else
#define XKNN__O_CLOEXEC 0 /* POSIX before 2008 */
#endif

enum {
    XKNN__IO_PREFIX = 16384,     /* header bytes the probe reads (largest npy header)  */
    XKNN__IO_CHUNK = 1 << 20,    /* bounce buffers of readers and writers               */
    XKNN__IO_MAX_CALL = 1 << 30, /* bytes per pread/write/gzread call                   */
    XKNN__IO_PAR_CALL = 1 << 26  /* bytes per pread of a threaded direct read           */
};

#define XKNN__IO_EXTENSIONS                                                                  \
    ".fvecs .ivecs .bvecs .fbin .u8bin .i8bin .ibin .bin .npy, IDX names (*-idx3-ubyte, " \
    "*.idx1-ubyte, *.idx); each may end in .gz"

/* ---- small helpers ----------------------------------------------------------------- */

static int xknn__io_lower(int c) { return (c >= 'A' && c <= 'Z') ? c - 'A' + 'a' : c; }

/* 1 if s[0, n) ends with `suffix`, ASCII case-insensitively. */
static int xknn__io_ends(const char *s, size_t n, const char *suffix)
{
    size_t m = strlen(suffix), i;
    if (m > n) return 0;
    for (i = 0; i < m; i++)
        if (xknn__io_lower((unsigned char)s[n - m + i]) != xknn__io_lower((unsigned char)suffix[i])) return 0;
    return 1;
}

/* IDX file names: "*.idx", or "...idx<digits>-ubyte" (train-images-idx3-ubyte,
 * t10k-labels.idx1-ubyte). */
static int xknn__io_is_idx_name(const char *s, size_t n)
{
    size_t i;
    if (xknn__io_ends(s, n, ".idx")) return 1;
    if (!xknn__io_ends(s, n, "-ubyte")) return 0;
    i = n - 6;
    if (i == 0 || s[i - 1] < '0' || s[i - 1] > '9') return 0;
    while (i > 0 && s[i - 1] >= '0' && s[i - 1] <= '9') i--;
    return xknn__io_ends(s, i, "idx");
}

/* Checked int64 arithmetic on non-negative values: 0 on overflow. */
static int xknn__io_mul(int64_t a, int64_t b, int64_t *r)
{
    if (a < 0 || b < 0 || (a != 0 && b > INT64_MAX / a)) return 0;
    *r = a * b;
    return 1;
}

static int xknn__io_add(int64_t a, int64_t b, int64_t *r)
{
    if (a < 0 || b < 0 || a > INT64_MAX - b) return 0;
    *r = a + b;
    return 1;
}

static uint16_t xknn__io_u16(const unsigned char *p, int be)
{
    return be ? (uint16_t)((unsigned)p[0] << 8 | p[1]) : (uint16_t)((unsigned)p[1] << 8 | p[0]);
}

static uint32_t xknn__io_u32(const unsigned char *p, int be)
{
    if (be) return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
    return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | (uint32_t)p[0];
}

static uint64_t xknn__io_u64(const unsigned char *p, int be)
{
    uint64_t a = xknn__io_u32(p, be), b = xknn__io_u32(p + 4, be);
    return be ? a << 32 | b : b << 32 | a;
}

static int32_t xknn__io_i32(uint32_t u)
{
    return u <= 0x7fffffffu ? (int32_t)u : (int32_t)(u - 0x80000000u) - 0x7fffffff - 1;
}

static void xknn__io_put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v & 0xffu);
    p[1] = (unsigned char)(v >> 8 & 0xffu);
    p[2] = (unsigned char)(v >> 16 & 0xffu);
    p[3] = (unsigned char)(v >> 24 & 0xffu);
}

static void xknn__io_put64(unsigned char *p, uint64_t v)
{
    xknn__io_put32(p, (uint32_t)(v & 0xffffffffu));
    xknn__io_put32(p + 4, (uint32_t)(v >> 32));
}

static int xknn__io_host_le(void)
{
    const uint32_t one = 1;
    unsigned char c;
    memcpy(&c, &one, 1);
    return c == 1;
}

/* IEEE binary16 -> binary32, exact for every value (subnormals normalised). */
static float xknn__io_half(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (uint32_t)(h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    float f;
    if (e == 0) {
        if (m == 0) {
            bits = sign;
        } else { /* m * 2^-24: shift the leading one into the implicit bit */
            uint32_t s = 0;
            while (!(m & 0x400u)) {
                m <<= 1;
                s++;
            }
            bits = sign | (113u - s) << 23 | (m & 0x3ffu) << 13;
        }
    } else if (e == 31) {
        bits = sign | 0x7f800000u | m << 13;
    } else {
        bits = sign | (e + 112u) << 23 | m << 13;
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---- names ------------------------------------------------------------------------- */

const char *xknn_file_format_name(xknn_file_format format)
{
    static const char *const names[XKNN_FORMAT_COUNT] = {"auto", "fvecs", "ivecs", "bvecs",  "fbin", "u8bin",
                                                         "i8bin", "ibin", "f16bin", "npy", "idx"};
    if ((int)format < 0 || format >= XKNN_FORMAT_COUNT) return "unknown";
    return names[format];
}

const char *xknn_elem_name(xknn_elem elem)
{
    static const char *const names[XKNN_ELEM_COUNT] = {"float32", "float16", "float64", "uint8",
                                                       "int8",    "int16",   "int32",   "int64"};
    if ((int)elem < 0 || elem >= XKNN_ELEM_COUNT) return "unknown";
    return names[elem];
}

int xknn_elem_size(xknn_elem elem)
{
    switch (elem) {
    case XKNN_ELEM_F32: return 4;
    case XKNN_ELEM_F16: return 2;
    case XKNN_ELEM_F64: return 8;
    case XKNN_ELEM_U8: return 1;
    case XKNN_ELEM_I8: return 1;
    case XKNN_ELEM_I16: return 2;
    case XKNN_ELEM_I32: return 4;
    case XKNN_ELEM_I64: return 8;
    default: return 0;
    }
}

xknn_elem xknn_elem_from_name(const char *name)
{
    static const struct {
        const char *name;
        xknn_elem elem;
    } table[] = {
        {"f32", XKNN_ELEM_F32},   {"float32", XKNN_ELEM_F32}, {"float", XKNN_ELEM_F32},
        {"f16", XKNN_ELEM_F16},   {"float16", XKNN_ELEM_F16}, {"half", XKNN_ELEM_F16},
        {"f64", XKNN_ELEM_F64},   {"float64", XKNN_ELEM_F64}, {"double", XKNN_ELEM_F64},
        {"u8", XKNN_ELEM_U8},     {"uint8", XKNN_ELEM_U8},    {"i8", XKNN_ELEM_I8},
        {"int8", XKNN_ELEM_I8},   {"i16", XKNN_ELEM_I16},     {"int16", XKNN_ELEM_I16},
        {"i32", XKNN_ELEM_I32},   {"int32", XKNN_ELEM_I32},   {"i64", XKNN_ELEM_I64},
        {"int64", XKNN_ELEM_I64},
    };
    size_t i;
    if (!name) return XKNN_ELEM_COUNT;
    for (i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(name, table[i].name)) return table[i].elem;
    return XKNN_ELEM_COUNT;
}

static xknn_status xknn__io_ok(xknn_error *err)
{
    if (err) {
        err->status = XKNN_SUCCESS;
        err->message[0] = '\0';
    }
    return XKNN_SUCCESS;
}

/* ---- byte sources: a plain file read with pread, or a gzip stream ------------------- */

typedef struct xknn__src {
    const char *path;
    int fd;          /* plain file (-1 once a gzip reader owns it)          */
    int compressed;
    int64_t size;    /* size on disk                                        */
    int64_t pos;     /* gzip: uncompressed bytes consumed so far            */
#ifdef XKNN_HAVE_ZLIB
    gzFile gz;
#endif
} xknn__src;

static void xknn__src_close(xknn__src *s)
{
#ifdef XKNN_HAVE_ZLIB
    if (s->gz) (void)gzclose(s->gz); /* read-only: nothing to flush */
    s->gz = NULL;
#endif
    if (s->fd >= 0) (void)close(s->fd);
    s->fd = -1;
}

static xknn_status xknn__src_open(xknn__src *s, const char *path, int compressed, xknn_error *err)
{
    struct stat sb;
    int e;
    memset(s, 0, sizeof *s);
    s->path = path;
    s->fd = -1;
    s->compressed = compressed;
#ifndef XKNN_HAVE_ZLIB
    if (compressed)
        return xknn__fail(err, XKNN_ERROR_NOT_BUILT,
                          "%s: cannot read a .gz file: this xknn was built without zlib (install zlib "
                          "development files and reconfigure, or gunzip the file)",
                          path);
#endif
    /* O_NONBLOCK: a FIFO without a writer must not block the open; only regular files,
     * whose size is known, are read. */
    do s->fd = open(path, O_RDONLY | O_NONBLOCK | XKNN__O_CLOEXEC);
    while (s->fd < 0 && errno == EINTR);
    if (s->fd < 0) {
        e = errno;
        /* no descriptor left is a resource fault, not a bad file */
        return xknn__fail(err, (e == EMFILE || e == ENFILE) ? XKNN_ERROR_OUT_OF_MEMORY : XKNN_ERROR_IO,
                          "%s: cannot open: %s", path, strerror(e));
    }
    if (fstat(s->fd, &sb) != 0) {
        e = errno;
        xknn__src_close(s);
        return xknn__fail(err, XKNN_ERROR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (S_ISDIR(sb.st_mode)) {
        xknn__src_close(s);
        return xknn__fail(err, XKNN_ERROR_IO, "%s: cannot read: %s", path, strerror(EISDIR));
    }
    if (!S_ISREG(sb.st_mode)) {
        xknn__src_close(s);
        return xknn__fail(err, XKNN_ERROR_IO, "%s: not a regular file (%s): inputs must be files", path,
                          S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISCHR(sb.st_mode) ? "a character device"
                                                        : S_ISSOCK(sb.st_mode) ? "a socket" : "a special file");
    }
    s->size = (int64_t)sb.st_size;
#ifdef XKNN_HAVE_ZLIB
    if (compressed) {
        s->gz = gzdopen(s->fd, "rb");
        if (!s->gz) {
            xknn__src_close(s);
            return xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "%s: cannot start the gzip reader", path);
        }
        s->fd = -1; /* gzclose closes it */
        if (gzbuffer(s->gz, 1u << 17) != 0) {
            xknn__src_close(s);
            return xknn__fail(err, XKNN_ERROR_INTERNAL, "%s: gzbuffer failed", path);
        }
    }
#endif
    return XKNN_SUCCESS;
}

/* pread until len bytes or end of file; *got = bytes read. */
static xknn_status xknn__src_pread(xknn__src *s, int64_t off, void *buf, size_t len, size_t *got,
                                   xknn_error *err)
{
    size_t done = 0;
    *got = 0;
    while (done < len) {
        size_t ask = len - done > (size_t)XKNN__IO_MAX_CALL ? (size_t)XKNN__IO_MAX_CALL : len - done;
        int64_t at = off + (int64_t)done;
        ssize_t r;
        if ((int64_t)(off_t)at != at)
            return xknn__fail(err, XKNN_ERROR_IO, "%s: offset %lld does not fit this system's off_t", s->path,
                              (long long)at);
        r = pread(s->fd, (char *)buf + done, ask, (off_t)at);
        if (r < 0) {
            int e = errno;
            if (e == EINTR) continue;
            return xknn__fail(err, XKNN_ERROR_IO, "%s: read failed at byte %lld: %s", s->path, (long long)at,
                              strerror(e));
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    *got = done;
    return XKNN_SUCCESS;
}

#ifdef XKNN_HAVE_ZLIB
static xknn_status xknn__src_gzfail(xknn__src *s, xknn_error *err)
{
    int zerr = Z_OK, e = errno;
    const char *msg = gzerror(s->gz, &zerr);
    switch (zerr) {
    case Z_ERRNO:
        return xknn__fail(err, XKNN_ERROR_IO, "%s: read failed: %s", s->path, strerror(e));
    case Z_MEM_ERROR:
        return xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "%s: out of memory in the gzip reader", s->path);
    case Z_BUF_ERROR:
        return xknn__fail(err, XKNN_ERROR_FORMAT,
                          "%s: truncated gzip stream (it ends after %lld uncompressed bytes)", s->path,
                          (long long)s->pos);
    default:
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: corrupt gzip data after %lld uncompressed bytes: %s",
                          s->path, (long long)s->pos, msg ? msg : "unknown error");
    }
}
#endif

/* Next len bytes of the gzip stream, or fewer at its (complete) end. A stream that
 * ends early or is corrupt is a FORMAT error. */
static xknn_status xknn__src_gzread(xknn__src *s, void *buf, size_t len, size_t *got, xknn_error *err)
{
#ifdef XKNN_HAVE_ZLIB
    size_t done = 0;
    *got = 0;
    while (done < len) {
        unsigned ask = (unsigned)(len - done > (size_t)XKNN__IO_MAX_CALL ? (size_t)XKNN__IO_MAX_CALL : len - done);
        int r = gzread(s->gz, (char *)buf + done, ask);
        if (r < 0) {
            s->pos += (int64_t)done;
            return xknn__src_gzfail(s, err);
        }
        done += (size_t)r;
        if ((unsigned)r < ask) { /* end of input: a complete stream, or not */
            int zerr = Z_OK;
            (void)gzerror(s->gz, &zerr);
            s->pos += (int64_t)done;
            if (zerr != Z_OK) return xknn__src_gzfail(s, err);
            *got = done;
            return XKNN_SUCCESS;
        }
    }
    s->pos += (int64_t)done;
    *got = done;
    return XKNN_SUCCESS;
#else
    (void)buf;
    (void)len;
    *got = 0;
    return xknn__fail(err, XKNN_ERROR_NOT_BUILT, "%s: this xknn was built without zlib", s->path);
#endif
}

/* len bytes at offset off. gzip streams only move forward: bytes before off are
 * decompressed into `scratch` and dropped. *got < len only at the end of the data. */
static xknn_status xknn__src_read_at(xknn__src *s, int64_t off, void *buf, size_t len, size_t *got,
                                     void *scratch, size_t scratch_len, xknn_error *err)
{
    xknn_status st;
    if (!s->compressed) return xknn__src_pread(s, off, buf, len, got, err);
    *got = 0;
    if (off < s->pos)
        return xknn__fail(err, XKNN_ERROR_INTERNAL, "%s: gzip stream read backwards (%lld < %lld)", s->path,
                          (long long)off, (long long)s->pos);
    while (s->pos < off) {
        size_t ask = off - s->pos < (int64_t)scratch_len ? (size_t)(off - s->pos) : scratch_len, n;
        if ((st = xknn__src_gzread(s, scratch, ask, &n, err)) != XKNN_SUCCESS) return st;
        if (n < ask) return XKNN_SUCCESS; /* ended before off: *got = 0 */
    }
    return xknn__src_gzread(s, buf, len, got, err);
}

/* ---- TEXMEX row-header scan: every row's int32 d must equal row 0's ---------------- */

typedef struct xknn__vscan {
    int64_t next;      /* offset of the next row header                      */
    int64_t row;       /* its row number                                     */
    int64_t row_bytes; /* 4 + d * element size                               */
    int32_t d0;        /* row 0's d                                          */
    int have;          /* bytes of that header gathered so far               */
    unsigned char b[4];
    int64_t bad_row;   /* first row whose d differs; -1: none so far         */
    int32_t bad_d;
} xknn__vscan;

/* Feeds the bytes [pos, pos + len) of the file; calls must come in file order. */
static void xknn__vscan_feed(xknn__vscan *v, const unsigned char *buf, int64_t pos, int64_t len)
{
    while (v->bad_row < 0) {
        int64_t at = v->next + v->have;
        if (at >= pos + len || at < pos) break;
        v->b[v->have++] = buf[at - pos];
        if (v->have == 4) {
            int32_t d = xknn__io_i32(xknn__io_u32(v->b, 0));
            if (d != v->d0) {
                v->bad_row = v->row;
                v->bad_d = d;
                break;
            }
            v->have = 0;
            v->row++;
            v->next += v->row_bytes;
        }
    }
}

static xknn_status xknn__vscan_fail(const char *path, const xknn__vscan *v, xknn_error *err)
{
    return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: row %lld has d=%ld, row 0 has d=%ld (every row must have the same d)",
                      path, (long long)v->bad_row, (long)v->bad_d, (long)v->d0);
}

/* ---- headers ----------------------------------------------------------------------- */

static xknn_status xknn__io_detect(const char *path, const xknn_read_opts *o, xknn_file_info *info,
                                   xknn_error *err)
{
    size_t n = strlen(path);
    xknn_file_format f = o->format;
    if (xknn__io_ends(path, n, ".gz")) {
        info->compressed = 1;
        n -= 3;
    }
    if ((int)f < 0 || f >= XKNN_FORMAT_COUNT)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s: unknown file format %d in read options", path,
                          (int)f);
    if (f == XKNN_FORMAT_AUTO) {
        if (xknn__io_ends(path, n, ".fvecs")) f = XKNN_FORMAT_FVECS;
        else if (xknn__io_ends(path, n, ".ivecs")) f = XKNN_FORMAT_IVECS;
        else if (xknn__io_ends(path, n, ".bvecs")) f = XKNN_FORMAT_BVECS;
        else if (xknn__io_ends(path, n, ".fbin")) f = XKNN_FORMAT_FBIN;
        else if (xknn__io_ends(path, n, ".u8bin")) f = XKNN_FORMAT_U8BIN;
        else if (xknn__io_ends(path, n, ".i8bin")) f = XKNN_FORMAT_I8BIN;
        else if (xknn__io_ends(path, n, ".ibin")) f = XKNN_FORMAT_IBIN;
        else if (xknn__io_ends(path, n, ".npy")) f = XKNN_FORMAT_NPY;
        else if (xknn__io_is_idx_name(path, n)) f = XKNN_FORMAT_IDX;
        else if (xknn__io_ends(path, n, ".bin")) {
            switch (o->bin_dtype) {
            case XKNN_ELEM_F32: f = XKNN_FORMAT_FBIN; break;
            case XKNN_ELEM_F16: f = XKNN_FORMAT_F16BIN; break;
            case XKNN_ELEM_U8: f = XKNN_FORMAT_U8BIN; break;
            case XKNN_ELEM_I8: f = XKNN_FORMAT_I8BIN; break;
            case XKNN_ELEM_I32: f = XKNN_FORMAT_IBIN; break;
            default:
                return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                                  "%s: bin_dtype %s is not supported for .bin files (f32, f16, u8, i8, i32)", path,
                                  xknn_elem_name(o->bin_dtype));
            }
        } else {
            return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: unknown file extension (accepted: %s)", path,
                              XKNN__IO_EXTENSIONS);
        }
    }
    info->format = f;
    switch (f) {
    case XKNN_FORMAT_FVECS: case XKNN_FORMAT_FBIN: info->elem = XKNN_ELEM_F32; break;
    case XKNN_FORMAT_IVECS: case XKNN_FORMAT_IBIN: info->elem = XKNN_ELEM_I32; break;
    case XKNN_FORMAT_BVECS: case XKNN_FORMAT_U8BIN: info->elem = XKNN_ELEM_U8; break;
    case XKNN_FORMAT_I8BIN: info->elem = XKNN_ELEM_I8; break;
    case XKNN_FORMAT_F16BIN: info->elem = XKNN_ELEM_F16; break;
    default: info->elem = XKNN_ELEM_F32; break; /* NPY, IDX: from the header */
    }
    return XKNN_SUCCESS;
}

static int xknn__io_is_vecs(xknn_file_format f)
{
    return f == XKNN_FORMAT_FVECS || f == XKNN_FORMAT_IVECS || f == XKNN_FORMAT_BVECS;
}

static xknn_status xknn__io_truncated(const char *path, int64_t got, int64_t need, const char *what,
                                      xknn_error *err)
{
    return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: truncated header (%lld bytes; the %s header needs %lld)", path,
                      (long long)got, what, (long long)need);
}

/* Rows, cols and element size known: checks n, d, and that the data size fits int64.
 * Sets row_bytes and file_bytes (the size the file must have). */
static xknn_status xknn__io_finish_header(const char *path, xknn_file_info *info, xknn_error *err)
{
    const int64_t es = xknn_elem_size(info->elem);
    int64_t nd, data;
    if (info->cols == 0)
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: header has d = 0 (n=%lld): need d >= 1", path,
                          (long long)info->rows);
    if (info->rows == 0)
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: header has n = 0 rows (d=%lld): the file holds no data", path,
                          (long long)info->cols);
    if (!xknn__io_mul(info->rows, info->cols, &nd) || !xknn__io_mul(nd, es, &data) ||
        !xknn__io_add(data, info->data_offset, &info->file_bytes))
        return xknn__fail(err, XKNN_ERROR_FORMAT,
                          "%s: header n=%lld d=%lld: n*d*%lld bytes overflows 64-bit sizes (corrupt header?)", path,
                          (long long)info->rows, (long long)info->cols, (long long)es);
    info->row_bytes = info->cols * es;
    return XKNN_SUCCESS;
}

/* Value of 'key' in a Python dict literal [p, end): pointer after "key:" and spaces. */
static const char *xknn__npy_key(const char *p, const char *end, const char *key)
{
    const size_t kl = strlen(key);
    for (; p + kl + 2 <= end; p++) {
        if ((*p == '\'' || *p == '"') && p[kl + 1] == *p && memcmp(p + 1, key, kl) == 0) {
            const char *q = p + kl + 2;
            while (q < end && *q == ' ') q++;
            if (q >= end || *q != ':') continue;
            q++;
            while (q < end && *q == ' ') q++;
            return q;
        }
    }
    return NULL;
}

static xknn_status xknn__io_parse_npy(const char *path, const unsigned char *h, int64_t got, int whole,
                                      xknn_file_info *info, xknn_error *err)
{
    static const struct {
        const char *descr;
        xknn_elem elem;
    } dtypes[] = {
        {"<f4", XKNN_ELEM_F32}, {"<f2", XKNN_ELEM_F16}, {"<f8", XKNN_ELEM_F64}, {"|u1", XKNN_ELEM_U8},
        {"<u1", XKNN_ELEM_U8},  {">u1", XKNN_ELEM_U8},  {"|i1", XKNN_ELEM_I8},  {"<i1", XKNN_ELEM_I8},
        {">i1", XKNN_ELEM_I8},  {"<i2", XKNN_ELEM_I16}, {"<i4", XKNN_ELEM_I32},
        {"<i8", XKNN_ELEM_I64},
    };
    int64_t start, hlen, shape[32];
    int ndims = 0, i, found = 0;
    const char *p, *end, *q;
    char descr[16];
    size_t dl = 0;

    if (got < 10) return xknn__io_truncated(path, got, 10, "npy", err);
    if (memcmp(h, "\x93NUMPY", 6) != 0)
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: bad npy magic (expected \\x93NUMPY)", path);
    if (h[6] == 1) {
        start = 10;
        hlen = xknn__io_u16(h + 8, 0);
    } else if (h[6] == 2 || h[6] == 3) {
        if (got < 12) return xknn__io_truncated(path, got, 12, "npy", err);
        start = 12;
        hlen = (int64_t)xknn__io_u32(h + 8, 0);
    } else {
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: unsupported npy format version %d.%d (1, 2, 3 are read)",
                          path, (int)h[6], (int)h[7]);
    }
    info->data_offset = start + hlen;
    if (info->data_offset > got) {
        if (whole) return xknn__io_truncated(path, got, info->data_offset, "npy", err);
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: npy header of %lld bytes is larger than the %d bytes read",
                          path, (long long)hlen, (int)XKNN__IO_PREFIX);
    }
    p = (const char *)h + start;
    end = p + hlen;

    q = xknn__npy_key(p, end, "descr");
    if (!q || q >= end || (*q != '\'' && *q != '"'))
        return xknn__fail(err, XKNN_ERROR_FORMAT,
                          "%s: npy header has no simple 'descr' (structured dtypes are not supported)", path);
    for (p = q + 1; p < end && *p != *q && dl < sizeof descr - 1; p++) descr[dl++] = *p;
    descr[dl] = '\0';
    for (i = 0; i < (int)(sizeof dtypes / sizeof dtypes[0]); i++)
        if (!strcmp(descr, dtypes[i].descr)) {
            info->elem = dtypes[i].elem;
            found = 1;
        }
    if (!found)
        return xknn__fail(err, XKNN_ERROR_FORMAT,
                          "%s: npy dtype '%s' is not supported (accepted: <f4 <f2 <f8 |u1 |i1 <i2 <i4 <i8)", path, descr);

    p = (const char *)h + start;
    q = xknn__npy_key(p, end, "fortran_order");
    if (!q) return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: npy header has no 'fortran_order'", path);
    if (end - q >= 4 && !memcmp(q, "True", 4))
        return xknn__fail(err, XKNN_ERROR_FORMAT,
                          "%s: npy array is in Fortran order (only C order is read: save "
                          "numpy.ascontiguousarray(a))",
                          path);
    if (end - q < 5 || memcmp(q, "False", 5) != 0)
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: npy 'fortran_order' is neither True nor False", path);

    q = xknn__npy_key(p, end, "shape");
    if (!q || q >= end || *q != '(') return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: npy header has no 'shape'", path);
    for (q++;;) {
        int64_t v = 0;
        while (q < end && (*q == ' ' || *q == ',')) q++;
        if (q < end && *q == ')') break;
        if (q >= end || *q < '0' || *q > '9' || ndims == 32)
            return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: npy 'shape' is not a tuple of at most 32 sizes", path);
        for (; q < end && *q >= '0' && *q <= '9'; q++)
            if (!xknn__io_mul(v, 10, &v) || !xknn__io_add(v, *q - '0', &v))
                return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: npy 'shape' has a size beyond 2^63", path);
        if (q < end && (*q == 'L' || *q == 'l')) q++; /* Python 2 long */
        shape[ndims++] = v;
    }
    if (ndims == 0)
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: npy array has shape () (a scalar): need 1 or 2 dimensions",
                          path);
    info->rows = shape[0];
    info->cols = 1;
    for (i = 1; i < ndims; i++)
        if (!xknn__io_mul(info->cols, shape[i], &info->cols))
            return xknn__fail(err, XKNN_ERROR_FORMAT,
                              "%s: npy shape (%lld, %lld, ...): the product of the dimensions overflows 64-bit sizes",
                              path, (long long)shape[0], (long long)shape[1]);
    return xknn__io_finish_header(path, info, err);
}

static xknn_status xknn__io_parse_idx(const char *path, const unsigned char *h, int64_t got, xknn_file_info *info,
                                      xknn_error *err)
{
    int ndims, i;
    if (got < 4) return xknn__io_truncated(path, got, 4, "IDX", err);
    if (h[0] != 0 || h[1] != 0)
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: bad IDX magic 0x%02x 0x%02x (expected two zero bytes)", path,
                          (unsigned)h[0], (unsigned)h[1]);
    switch (h[2]) {
    case 0x08: info->elem = XKNN_ELEM_U8; break;
    case 0x09: info->elem = XKNN_ELEM_I8; break;
    case 0x0B: info->elem = XKNN_ELEM_I16; break;
    case 0x0C: info->elem = XKNN_ELEM_I32; break;
    case 0x0D: info->elem = XKNN_ELEM_F32; break;
    case 0x0E: info->elem = XKNN_ELEM_F64; break;
    default:
        return xknn__fail(err, XKNN_ERROR_FORMAT,
                          "%s: bad IDX magic: unknown type byte 0x%02x (0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, "
                          "0x0D f32, 0x0E f64)",
                          path, (unsigned)h[2]);
    }
    ndims = h[3];
    if (ndims == 0) return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: IDX header has 0 dimensions", path);
    info->data_offset = 4 + 4 * (int64_t)ndims;
    if (got < info->data_offset) return xknn__io_truncated(path, got, info->data_offset, "IDX", err);
    info->big_endian = 1;
    info->rows = (int64_t)xknn__io_u32(h + 4, 1);
    info->cols = 1;
    for (i = 1; i < ndims; i++)
        if (!xknn__io_mul(info->cols, (int64_t)xknn__io_u32(h + 4 + 4 * i, 1), &info->cols)) {
            char dims[96];
            size_t at = 0;
            for (i = 0; i < ndims && at + 24 < sizeof dims; i++)
                at += (size_t)snprintf(dims + at, sizeof dims - at, "%s%lu", i ? " x " : "",
                                       (unsigned long)xknn__io_u32(h + 4 + 4 * i, 1));
            return xknn__fail(err, XKNN_ERROR_FORMAT,
                              "%s: IDX header dimensions %s%s: their product overflows 64-bit sizes", path, dims,
                              i < ndims ? " ..." : "");
        }
    return xknn__io_finish_header(path, info, err);
}

/* Parses the header in h[0, got). whole: h holds the whole (uncompressed) file. */
static xknn_status xknn__io_parse(const char *path, const unsigned char *h, int64_t got, int whole,
                                  xknn_file_info *info, xknn_error *err)
{
    const int64_t es = xknn_elem_size(info->elem);
    if (got == 0)
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: file is empty%s", path,
                          info->compressed ? " (no uncompressed data)" : "");
    switch (info->format) {
    case XKNN_FORMAT_FVECS:
    case XKNN_FORMAT_IVECS:
    case XKNN_FORMAT_BVECS: {
        int32_t d;
        if (got < 4) return xknn__io_truncated(path, got, 4, "row", err);
        d = xknn__io_i32(xknn__io_u32(h, 0));
        if (d <= 0)
            return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: row 0 has d = %ld: need d >= 1", path, (long)d);
        info->cols = d;
        info->data_offset = 4;
        info->row_bytes = 4 + (int64_t)d * es;
        info->rows = -1; /* from the size */
        return XKNN_SUCCESS;
    }
    case XKNN_FORMAT_FBIN:
    case XKNN_FORMAT_U8BIN:
    case XKNN_FORMAT_I8BIN:
    case XKNN_FORMAT_IBIN:
    case XKNN_FORMAT_F16BIN:
        if (got < 8) return xknn__io_truncated(path, got, 8, "bin (uint32 n, uint32 d)", err);
        info->rows = (int64_t)xknn__io_u32(h, 0);
        info->cols = (int64_t)xknn__io_u32(h + 4, 0);
        info->data_offset = 8;
        return xknn__io_finish_header(path, info, err);
    case XKNN_FORMAT_NPY: return xknn__io_parse_npy(path, h, got, whole, info, err);
    case XKNN_FORMAT_IDX: return xknn__io_parse_idx(path, h, got, info, err);
    default:
        return xknn__fail(err, XKNN_ERROR_INTERNAL, "%s: format %d has no parser", path, (int)info->format);
    }
}

/* Compares the (uncompressed) size with what the header says. */
static xknn_status xknn__io_check_size(const char *path, xknn_file_info *info, int64_t size, xknn_error *err)
{
    const char *what = info->compressed ? " uncompressed" : "";
    if (xknn__io_is_vecs(info->format)) {
        if (size % info->row_bytes != 0)
            return xknn__fail(err, XKNN_ERROR_FORMAT,
                              "%s: size %lld bytes%s is not a multiple of the row size %lld bytes (d=%lld from "
                              "row 0): the last row is truncated",
                              path, (long long)size, what, (long long)info->row_bytes, (long long)info->cols);
        info->rows = size / info->row_bytes;
        info->file_bytes = size;
        return XKNN_SUCCESS;
    }
    if (size != info->file_bytes)
        return xknn__fail(err, XKNN_ERROR_FORMAT,
                          "%s: size %lld bytes%s does not match header n=%lld d=%lld (expected %lld bytes)", path,
                          (long long)size, what, (long long)info->rows, (long long)info->cols,
                          (long long)info->file_bytes);
    return XKNN_SUCCESS;
}

xknn_status xknn_file_probe(const char *path, const xknn_read_opts *opts, xknn_file_info *info, xknn_error *err)
{
    xknn_read_opts o = XKNN_READ_OPTS_INIT;
    unsigned char hdr[XKNN__IO_PREFIX];
    unsigned char *chunk = NULL;
    xknn__src src;
    xknn__vscan vs;
    size_t got = 0;
    int64_t size = 0;
    int whole, vecs;
    xknn_status st;

    if (!path || !info)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_file_probe: %s is NULL", path ? "info" : "path");
    if (opts) o = *opts;
    memset(info, 0, sizeof *info);
    if ((st = xknn__io_detect(path, &o, info, err)) != XKNN_SUCCESS) return st;
    if ((st = xknn__src_open(&src, path, info->compressed, err)) != XKNN_SUCCESS) return st;

    if (!info->compressed) {
        size = src.size;
        whole = size <= (int64_t)sizeof hdr;
        st = xknn__src_pread(&src, 0, hdr, whole ? (size_t)size : sizeof hdr, &got, err);
        if (st == XKNN_SUCCESS && whole) size = (int64_t)got; /* a file that shrank: judge what is there */
    } else {
        st = xknn__src_gzread(&src, hdr, sizeof hdr, &got, err);
        whole = got < sizeof hdr;
    }
    if (st != XKNN_SUCCESS) goto done;
    if ((st = xknn__io_parse(path, hdr, (int64_t)got, whole, info, err)) != XKNN_SUCCESS) goto done;

    vecs = xknn__io_is_vecs(info->format);
    memset(&vs, 0, sizeof vs);
    vs.row_bytes = info->row_bytes;
    vs.d0 = (int32_t)info->cols;
    vs.bad_row = -1;

    if (info->compressed) { /* stream to the end: size, and every TEXMEX row header */
        size_t n = got;
        if (vecs) xknn__vscan_feed(&vs, hdr, 0, (int64_t)got);
        size = (int64_t)got;
        if (!whole) {
            chunk = (unsigned char *)malloc(XKNN__IO_CHUNK);
            if (!chunk) {
                st = xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "%s: cannot allocate a read buffer", path);
                goto done;
            }
            do {
                if ((st = xknn__src_gzread(&src, chunk, XKNN__IO_CHUNK, &n, err)) != XKNN_SUCCESS) goto done;
                if (vecs) xknn__vscan_feed(&vs, chunk, size, (int64_t)n);
                size += (int64_t)n;
            } while (n == (size_t)XKNN__IO_CHUNK);
        }
        if (vs.bad_row >= 0) {
            st = xknn__vscan_fail(path, &vs, err);
            goto done;
        }
    } else if (vecs) {
        /* Plain TEXMEX: the size must be a multiple of the row size and the last row's d
         * must be row 0's. Only when either fails is every row header scanned, to name
         * the first row whose d differs (xknn_file_read_rows checks the rows it reads). */
        int scan = size % info->row_bytes != 0;
        if (!scan && size / info->row_bytes > 1) {
            unsigned char b[4];
            if ((st = xknn__src_pread(&src, size - info->row_bytes, b, 4, &got, err)) != XKNN_SUCCESS) goto done;
            scan = got != 4 || xknn__io_i32(xknn__io_u32(b, 0)) != vs.d0;
        }
        if (scan) {
            int64_t pos = 0;
            while (vs.bad_row < 0 && pos < size) {
                if ((st = xknn__src_pread(&src, pos, hdr, sizeof hdr, &got, err)) != XKNN_SUCCESS) goto done;
                if (got == 0) break;
                xknn__vscan_feed(&vs, hdr, pos, (int64_t)got);
                pos += (int64_t)got;
            }
            if (vs.bad_row >= 0) {
                st = xknn__vscan_fail(path, &vs, err);
                goto done;
            }
        }
    }
    if ((st = xknn__io_check_size(path, info, size, err)) != XKNN_SUCCESS) goto done;
    st = xknn__io_ok(err);
done:
    free(chunk);
    xknn__src_close(&src);
    return st;
}

/* ---- rows -------------------------------------------------------------------------- */

static xknn_status xknn__io_bad_value(const char *path, int64_t row, int64_t col, int nan, xknn_error *err)
{
    return xknn__fail(err, XKNN_ERROR_INVALID_VALUE, "%s: row %lld column %lld is %s", path, (long long)row,
                      (long long)col, nan ? "NaN" : "Inf");
}

/* Converts one row of `cols` stored values to float32, checking each. */
static xknn_status xknn__io_convert(const char *path, const xknn_file_info *info, const unsigned char *src,
                                    float *dst, int64_t row, xknn_error *err)
{
    const int be = info->big_endian;
    const int64_t cols = info->cols;
    int64_t j;
    switch (info->elem) {
    case XKNN_ELEM_F32:
        for (j = 0; j < cols; j++) {
            uint32_t b = xknn__io_u32(src + 4 * j, be);
            if ((b & 0x7f800000u) == 0x7f800000u) return xknn__io_bad_value(path, row, j, (b & 0x7fffffu) != 0, err);
            memcpy(dst + j, &b, 4);
        }
        break;
    case XKNN_ELEM_F16:
        for (j = 0; j < cols; j++) {
            uint16_t h = xknn__io_u16(src + 2 * j, be);
            if ((h & 0x7c00u) == 0x7c00u) return xknn__io_bad_value(path, row, j, (h & 0x3ffu) != 0, err);
            dst[j] = xknn__io_half(h);
        }
        break;
    case XKNN_ELEM_F64: {
        /* values at or beyond the midpoint between FLT_MAX and 2^128 round to Inf */
        const double limit = 340282356779733661637539395458142568448.0; /* 2^128 - 2^103 */
        for (j = 0; j < cols; j++) {
            uint64_t b = xknn__io_u64(src + 8 * j, be);
            double v;
            if ((b & 0x7ff0000000000000ull) == 0x7ff0000000000000ull)
                return xknn__io_bad_value(path, row, j, (b & 0xfffffffffffffull) != 0, err);
            memcpy(&v, &b, 8);
            if (v >= limit || v <= -limit)
                return xknn__fail(err, XKNN_ERROR_INVALID_VALUE,
                                  "%s: row %lld column %lld is %g, outside the float32 range (it would be Inf)", path,
                                  (long long)row, (long long)j, v);
            dst[j] = (float)v;
        }
        break;
    }
    case XKNN_ELEM_U8:
        for (j = 0; j < cols; j++) dst[j] = (float)src[j];
        break;
    case XKNN_ELEM_I8:
        for (j = 0; j < cols; j++) dst[j] = (float)((int)src[j] - ((src[j] & 0x80u) ? 256 : 0));
        break;
    case XKNN_ELEM_I16:
        for (j = 0; j < cols; j++) {
            uint16_t u = xknn__io_u16(src + 2 * j, be);
            dst[j] = (float)((int32_t)u - ((u & 0x8000u) ? 65536 : 0));
        }
        break;
    case XKNN_ELEM_I32:
        for (j = 0; j < cols; j++) {
            int32_t v = xknn__io_i32(xknn__io_u32(src + 4 * j, be));
            float f = (float)v;
            if ((double)f != (double)v)
                return xknn__fail(err, XKNN_ERROR_INVALID_VALUE,
                                  "%s: row %lld column %lld is %ld, which float32 cannot hold exactly (|v| > 2^24)",
                                  path, (long long)row, (long long)j, (long)v);
            dst[j] = f;
        }
        break;
    case XKNN_ELEM_I64:
        for (j = 0; j < cols; j++) {
            int64_t v = (int64_t)xknn__io_u64(src + 8 * j, be);
            float f = (float)v;
            if (v > ((int64_t)1 << 62) || v < -((int64_t)1 << 62) || (int64_t)f != v)
                return xknn__fail(err, XKNN_ERROR_INVALID_VALUE,
                                  "%s: row %lld column %lld is %lld, which float32 cannot hold exactly (|v| > 2^24)",
                                  path, (long long)row, (long long)j, (long long)v);
            dst[j] = f;
        }
        break;
    default:
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s: unknown element type %d", path, (int)info->elem);
    }
    return XKNN_SUCCESS;
}

static xknn_status xknn__io_short(const char *path, int64_t row, xknn_error *err)
{
    return xknn__fail(err, XKNN_ERROR_FORMAT,
                      "%s: the file ends before row %lld (was it changed after it was probed?)", path, (long long)row);
}

xknn_dtype xknn_file_native_dtype(const xknn_file_info *info)
{
    if (!info) return XKNN_DTYPE_F32;
    switch (info->elem) {
    case XKNN_ELEM_U8: return XKNN_DTYPE_U8;
    case XKNN_ELEM_I8: return XKNN_DTYPE_I8;
    case XKNN_ELEM_F16: return XKNN_DTYPE_F16;
    default: return XKNN_DTYPE_F32;
    }
}

/* One row of stored values into `dst` as `as` (not F32): native copy or bit packing. */
static xknn_status xknn__io_copy_row(const char *path, const xknn_file_info *info, const unsigned char *src,
                                     void *dst, xknn_dtype as, int64_t row, xknn_error *err)
{
    const int64_t cols = info->cols;
    int64_t j;
    if (as == XKNN_DTYPE_BIN) {
        const int64_t words = (cols * 8 + 63) / 64;
        uint64_t *w = (uint64_t *)dst;
        for (j = 0; j < words; j++) w[j] = 0;
        for (j = 0; j < cols; j++) w[j / 8] |= (uint64_t)src[j] << (8 * (j % 8));
        return XKNN_SUCCESS;
    }
    if (as == XKNN_DTYPE_F16) {
        uint16_t *h = (uint16_t *)dst;
        for (j = 0; j < cols; j++) {
            const uint16_t v = xknn__io_u16(src + 2 * j, info->big_endian);
            if ((v & 0x7c00u) == 0x7c00u) return xknn__io_bad_value(path, row, j, (v & 0x3ffu) != 0, err);
            h[j] = v;
        }
        return XKNN_SUCCESS;
    }
    memcpy(dst, src, (size_t)cols); /* u8, i8 */
    return XKNN_SUCCESS;
}

/* Index of the first NaN or Inf among n float32 values, or -1: a branch-free pass over
 * blocks (vectorised), element by element only inside a bad block. */
static int64_t xknn__io_first_nonfinite(const float *v, int64_t n)
{
    int64_t i0, i;
    for (i0 = 0; i0 < n; i0 += 4096) {
        const int64_t m = n - i0 < 4096 ? n - i0 : 4096;
        uint32_t bad = 0, b;
        for (i = 0; i < m; i++) {
            memcpy(&b, v + i0 + i, 4);
            bad |= (uint32_t)((b & 0x7f800000u) == 0x7f800000u);
        }
        if (!bad) continue;
        for (i = 0; i < m; i++) {
            memcpy(&b, v + i0 + i, 4);
            if ((b & 0x7f800000u) == 0x7f800000u) return i0 + i;
        }
    }
    return -1;
}

/* One thread's part of a direct read: rows [r0, r1) of the request. */
typedef struct xknn__io_part {
    xknn_status st;  /* a read failure (message in e), else SUCCESS          */
    int64_t short_at; /* first request row the file did not hold; -1: none   */
    int64_t bad;     /* first non-finite value (index into the request); -1 */
    xknn_error e;
} xknn__io_part;

/* Rows [row0, row0 + nrows) of a plain file whose stored rows are the output's bytes
 * (float32 or u8/i8 rows without a TEXMEX d), straight into out: up to `threads`
 * threads, each its own contiguous range of whole rows, in preads of about
 * XKNN__IO_PAR_CALL bytes; float32 values checked right after each pread, while in
 * cache (check_f32). The outcome is the serial reader's whatever the thread count: a
 * read failure or a short file first (the one earliest in the file), then the first
 * NaN or Inf in row-major order. */
static xknn_status xknn__io_read_direct(const char *path, xknn__src *src, const xknn_file_info *info, int64_t start,
                                        int64_t row0, int64_t nrows, unsigned char *out, int check_f32,
                                        xknn_error *err)
{
    const int64_t rb = info->row_bytes;
    const int64_t call_rows = rb < (int64_t)XKNN__IO_PAR_CALL ? (int64_t)XKNN__IO_PAR_CALL / rb : 1;
    const int64_t calls = (nrows + call_rows - 1) / call_rows;
    const int budget = xknn_thread_budget();
    const int threads = (int64_t)budget < calls ? budget : (int)calls;
    const int64_t per = (nrows + threads - 1) / threads;
    xknn__io_part one, *parts = threads > 1 ? (xknn__io_part *)malloc((size_t)threads * sizeof *parts) : &one;
    int t;
    if (!parts)
        return xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "%s: cannot allocate the read's %d parts", path, threads);
#if defined(_OPENMP)
#pragma omp parallel for schedule(static, 1) num_threads(threads) if (threads > 1)
#endif
    for (t = 0; t < threads; t++) {
        xknn__io_part *pt = parts + t;
        const int64_t r1 = (t + 1) * per < nrows ? (t + 1) * per : nrows;
        int64_t r;
        pt->st = XKNN_SUCCESS;
        pt->short_at = -1;
        pt->bad = -1;
        for (r = t * per; r < r1; r += call_rows) {
            const int64_t c = r1 - r < call_rows ? r1 - r : call_rows;
            size_t got = 0;
            pt->st = xknn__src_pread(src, start + r * rb, out + r * rb, (size_t)(c * rb), &got, &pt->e);
            if (pt->st != XKNN_SUCCESS) break;
            if ((int64_t)got < c * rb) {
                pt->short_at = r + (int64_t)got / rb;
                break;
            }
            if (check_f32 && pt->bad < 0) {
                const int64_t i = xknn__io_first_nonfinite((const float *)(void *)(out + r * rb), c * info->cols);
                if (i >= 0) pt->bad = r * info->cols + i;
            }
        }
    }
    {
        xknn_status st = XKNN_SUCCESS;
        for (t = 0; t < threads && st == XKNN_SUCCESS; t++) {
            if (parts[t].st != XKNN_SUCCESS) {
                st = parts[t].st;
                if (err) *err = parts[t].e;
            } else if (parts[t].short_at >= 0) {
                st = xknn__io_short(path, row0 + parts[t].short_at, err);
            }
        }
        for (t = 0; t < threads && st == XKNN_SUCCESS; t++) {
            if (parts[t].bad >= 0) {
                const int64_t i = parts[t].bad;
                uint32_t b;
                memcpy(&b, out + i * 4, 4);
                st = xknn__io_bad_value(path, row0 + i / info->cols, i % info->cols, (b & 0x7fffffu) != 0, err);
            }
        }
        if (parts != &one) free(parts);
        return st;
    }
}

xknn_status xknn_file_read_rows(const char *path, const xknn_file_info *info, int64_t row0, int64_t nrows,
                                float *out, xknn_error *err)
{
    return xknn_file_read_rows_as(path, info, row0, nrows, XKNN_DTYPE_F32, out, err);
}

xknn_status xknn_file_read_rows_as(const char *path, const xknn_file_info *info, int64_t row0, int64_t nrows,
                                   xknn_dtype as, void *out_any, xknn_error *err)
{
    float *out = (float *)out_any;
    unsigned char *outb = (unsigned char *)out_any;
    int64_t out_row_bytes = 0;
    xknn__src src;
    unsigned char *buf = NULL, *skip = NULL;
    int64_t es, payload, gap, start, span, r;
    size_t got;
    xknn_status st;

    if (!path || !info)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_file_read_rows: %s is NULL", path ? "info" : "path");
    if (as != XKNN_DTYPE_F32 && !(as == XKNN_DTYPE_BIN && info->elem == XKNN_ELEM_U8) &&
        !(as == xknn_file_native_dtype(info) && info->elem != XKNN_ELEM_F32))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s: %s elements cannot be read as %s%s", path,
                          xknn_elem_name(info->elem), xknn_dtype_name(as),
                          as == XKNN_DTYPE_BIN ? " (bit packing needs uint8 data)" : "");
    es = xknn_elem_size(info->elem);
    if (es == 0 || info->cols < 1 || info->rows < 0 || !xknn__io_mul(info->cols, es, &payload) ||
        info->row_bytes < payload || info->data_offset < info->row_bytes - payload ||
        (info->row_bytes != payload && (!xknn__io_is_vecs(info->format) || info->row_bytes - payload != 4)))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          "%s: file info is not one filled by xknn_file_probe (elem %d, cols %lld, row_bytes %lld)",
                          path, (int)info->elem, (long long)info->cols, (long long)info->row_bytes);
    if (row0 < 0 || nrows < 0 || row0 > info->rows || nrows > info->rows - row0)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          "%s: rows [%lld, %lld + %lld) are outside the file's rows [0, %lld)", path, (long long)row0,
                          (long long)row0, (long long)nrows, (long long)info->rows);
    if (nrows == 0) return xknn__io_ok(err);
    if (!out) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s: output buffer is NULL", path);
    gap = info->row_bytes - payload; /* 4: the row's int32 d (TEXMEX) */
    if (!xknn__io_mul(row0, info->row_bytes, &start) || !xknn__io_add(start, info->data_offset - gap, &start) ||
        !xknn__io_mul(nrows, info->row_bytes, &span) || (uint64_t)span > (uint64_t)SIZE_MAX)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s: rows [%lld, %lld) overflow the address space", path,
                          (long long)row0, (long long)(row0 + nrows));
    if ((st = xknn__src_open(&src, path, info->compressed, err)) != XKNN_SUCCESS) return st;
    if (info->compressed) { /* rows before row0 are decompressed into this and dropped */
        skip = (unsigned char *)malloc(XKNN__IO_CHUNK);
        if (!skip) {
            st = xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "%s: cannot allocate a read buffer", path);
            goto done;
        }
    }

    out_row_bytes = as == XKNN_DTYPE_BIN ? (info->cols * 8 + 63) / 64 * 8
                    : as == XKNN_DTYPE_F32 ? info->cols * 4
                                           : info->cols * (int64_t)xknn_elem_size(info->elem);
    if (!info->compressed && gap == 0 &&
        ((as == XKNN_DTYPE_F32 && info->elem == XKNN_ELEM_F32 && !info->big_endian && xknn__io_host_le()) ||
         ((as == XKNN_DTYPE_U8 || as == XKNN_DTYPE_I8) && (int64_t)xknn_elem_size(info->elem) == 1))) {
        /* the stored rows are the output's bytes: threads, no bounce buffer */
        st = xknn__io_read_direct(path, &src, info, start, row0, nrows, outb, as == XKNN_DTYPE_F32, err);
        if (st != XKNN_SUCCESS) goto done;
    } else if (as == XKNN_DTYPE_F32 && info->elem == XKNN_ELEM_F32 && gap == 0 && !info->big_endian &&
               xknn__io_host_le()) {
        /* float32 rows straight into out, then checked in place (gzip: one stream) */
        const int64_t total = nrows * info->cols;
        int64_t i;
        if ((st = xknn__src_read_at(&src, start, out, (size_t)span, &got, skip, XKNN__IO_CHUNK, err)) !=
            XKNN_SUCCESS)
            goto done;
        if ((int64_t)got < span) {
            st = xknn__io_short(path, row0 + (int64_t)got / info->row_bytes, err);
            goto done;
        }
        for (i = 0; i < total; i++) {
            uint32_t b;
            memcpy(&b, out + i, 4);
            if ((b & 0x7f800000u) == 0x7f800000u) {
                st = xknn__io_bad_value(path, row0 + i / info->cols, i % info->cols, (b & 0x7fffffu) != 0, err);
                goto done;
            }
        }
    } else {
        int64_t chunk_rows = XKNN__IO_CHUNK / info->row_bytes;
        if (chunk_rows < 1) chunk_rows = 1;
        if (chunk_rows > nrows) chunk_rows = nrows;
        buf = (unsigned char *)malloc((size_t)(chunk_rows * info->row_bytes));
        if (!buf) {
            st = xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "%s: cannot allocate %lld bytes for reading", path,
                            (long long)(chunk_rows * info->row_bytes));
            goto done;
        }
        for (r = 0; r < nrows; r += chunk_rows) {
            const int64_t c = nrows - r < chunk_rows ? nrows - r : chunk_rows;
            const size_t want = (size_t)(c * info->row_bytes);
            int64_t i;
            if ((st = xknn__src_read_at(&src, start + r * info->row_bytes, buf, want, &got, skip, XKNN__IO_CHUNK,
                                        err)) != XKNN_SUCCESS)
                goto done;
            if (got < want) {
                st = xknn__io_short(path, row0 + r + (int64_t)got / info->row_bytes, err);
                goto done;
            }
            for (i = 0; i < c; i++) {
                const unsigned char *row = buf + i * info->row_bytes;
                if (gap) {
                    int32_t d = xknn__io_i32(xknn__io_u32(row, 0));
                    if (d != info->cols) {
                        st = xknn__fail(err, XKNN_ERROR_FORMAT,
                                        "%s: row %lld has d=%ld, row 0 has d=%lld (every row must have the same d)",
                                        path, (long long)(row0 + r + i), (long)d, (long long)info->cols);
                        goto done;
                    }
                }
                if (as == XKNN_DTYPE_F32)
                    st = xknn__io_convert(path, info, row + gap, out + (r + i) * info->cols, row0 + r + i, err);
                else
                    st = xknn__io_copy_row(path, info, row + gap, outb + (r + i) * out_row_bytes, as, row0 + r + i,
                                           err);
                if (st != XKNN_SUCCESS) goto done;
            }
        }
    }
    st = xknn__io_ok(err);
done:
    free(buf);
    free(skip);
    xknn__src_close(&src);
    return st;
}

/* Result files (xknn_result_*): in their own file to keep this one readable. */
#include "impl/io_results.h"

/* ---- labels and targets ------------------------------------------------------------ */

/* 1 if path names a text file (".txt" / ".csv", optionally ".gz"). */
static int xknn__io_is_text(const char *path, int *compressed)
{
    size_t n = strlen(path);
    *compressed = 0;
    if (xknn__io_ends(path, n, ".gz")) {
        *compressed = 1;
        n -= 3;
    }
    return xknn__io_ends(path, n, ".txt") || xknn__io_ends(path, n, ".csv");
}

/* Whole (decompressed) file into a NUL-terminated malloc'ed buffer. */
static xknn_status xknn__io_slurp(const char *path, int compressed, char **out, int64_t *len, xknn_error *err)
{
    xknn__src src;
    char *buf = NULL;
    int64_t cap = 0, used = 0;
    xknn_status st;
    *out = NULL;
    if ((st = xknn__src_open(&src, path, compressed, err)) != XKNN_SUCCESS) return st;
    for (;;) {
        size_t got = 0;
        if (cap - used < (int64_t)XKNN__IO_CHUNK + 1) {
            char *nb;
            int64_t ncap = cap ? 2 * cap : (int64_t)XKNN__IO_CHUNK + 1;
            if ((uint64_t)ncap > (uint64_t)SIZE_MAX || !(nb = (char *)realloc(buf, (size_t)ncap))) {
                st = xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "%s: cannot allocate %lld bytes to read it", path,
                                (long long)ncap);
                break;
            }
            buf = nb;
            cap = ncap;
        }
        if ((st = xknn__src_read_at(&src, used, buf + used, (size_t)XKNN__IO_CHUNK, &got, NULL, 0, err)) !=
            XKNN_SUCCESS)
            break;
        used += (int64_t)got;
        if (got < (size_t)XKNN__IO_CHUNK) break;
    }
    xknn__src_close(&src);
    if (st != XKNN_SUCCESS) {
        free(buf);
        return st;
    }
    buf[used] = '\0';
    *out = buf;
    *len = used;
    return XKNN_SUCCESS;
}

/* Parses a text file of one value per line; as_int: int32 into ints, else float. */
static xknn_status xknn__io_text_values(const char *path, int compressed, int as_int, int64_t *n, int32_t **ints,
                                        float **floats, xknn_error *err)
{
    char *buf, *p, *end;
    int64_t len, lines = 0, i = 0;
    xknn_status st;
    if ((st = xknn__io_slurp(path, compressed, &buf, &len, err)) != XKNN_SUCCESS) return st;
    if ((int64_t)strlen(buf) != len) {
        free(buf);
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: holds a NUL byte: not a text file of one number per line", path);
    }
    for (p = buf; *p; p++) lines += *p == '\n';
    if (len > 0 && buf[len - 1] != '\n') lines++;
    if (lines == 0) {
        free(buf);
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: file is empty (need one value per line)", path);
    }
    if (as_int)
        *ints = (int32_t *)malloc((size_t)lines * sizeof(int32_t));
    else
        *floats = (float *)malloc((size_t)lines * sizeof(float));
    if (as_int ? !*ints : !*floats) {
        free(buf);
        return xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "%s: cannot allocate %lld values", path, (long long)lines);
    }
    for (p = buf; i < lines; i++) {
        char *eol = strchr(p, '\n'), *q;
        if (eol) *eol = '\0';
        while (*p == ' ' || *p == '\t') p++;
        errno = 0;
        if (as_int) {
            long long v = strtoll(p, &end, 10);
            if (end == p || errno == ERANGE || v < INT32_MIN || v > INT32_MAX) {
                st = xknn__fail(err, end == p ? XKNN_ERROR_FORMAT : XKNN_ERROR_INVALID_VALUE,
                                "%s: line %lld is '%.40s': %s", path, (long long)(i + 1), p,
                                end == p ? "not an integer" : "outside the int32 range");
                goto fail;
            }
            (*ints)[i] = (int32_t)v;
        } else {
            double v = strtod(p, &end);
            if (end == p || !isfinite(v) || v > 3.4028234663852886e38 || v < -3.4028234663852886e38) {
                st = xknn__fail(err, end == p ? XKNN_ERROR_FORMAT : XKNN_ERROR_INVALID_VALUE,
                                "%s: line %lld is '%.40s': %s", path, (long long)(i + 1), p,
                                end == p ? "not a number" : "not a finite float32 value");
                goto fail;
            }
            (*floats)[i] = (float)v;
        }
        for (q = end; *q == ' ' || *q == '\t' || *q == '\r'; q++) {
        }
        if (*q) {
            st = xknn__fail(err, XKNN_ERROR_FORMAT, "%s: line %lld is '%.40s': one %s per line expected", path,
                            (long long)(i + 1), p, as_int ? "integer" : "number");
            goto fail;
        }
        p = eol ? eol + 1 : p + strlen(p);
    }
    free(buf);
    *n = lines;
    return XKNN_SUCCESS;
fail:
    free(buf);
    if (as_int) {
        free(*ints);
        *ints = NULL;
    } else {
        free(*floats);
        *floats = NULL;
    }
    return st;
}

static xknn_status xknn__io_one_column(const char *path, const xknn_file_info *info, xknn_error *err)
{
    if (info->cols != 1)
        return xknn__fail(err, XKNN_ERROR_FORMAT,
                          "%s holds %lld values per row: labels and targets need one value per row", path,
                          (long long)info->cols);
    return XKNN_SUCCESS;
}

xknn_status xknn_labels_read(const char *path, int64_t *n, int32_t **labels, xknn_error *err)
{
    xknn_file_info info;
    xknn__src src;
    unsigned char *buf = NULL;
    int64_t es, r, chunk;
    int compressed;
    xknn_status st;

    if (!path || !n || !labels)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_labels_read: a NULL argument");
    *labels = NULL;
    *n = 0;
    if (xknn__io_is_text(path, &compressed)) return xknn__io_text_values(path, compressed, 1, n, labels, NULL, err);
    if ((st = xknn_file_probe(path, NULL, &info, err)) != XKNN_SUCCESS) return st;
    if ((st = xknn__io_one_column(path, &info, err)) != XKNN_SUCCESS) return st;
    if (info.elem != XKNN_ELEM_U8 && info.elem != XKNN_ELEM_I8 && info.elem != XKNN_ELEM_I16 &&
        info.elem != XKNN_ELEM_I32 && info.elem != XKNN_ELEM_I64)
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s holds %s values: labels must be integers (uint8 to int64)",
                          path, xknn_elem_name(info.elem));
    es = xknn_elem_size(info.elem);
    if (info.row_bytes != es || (uint64_t)info.rows > (uint64_t)(SIZE_MAX / sizeof(int32_t)))
        return xknn__fail(err, XKNN_ERROR_FORMAT, "%s: %lld rows of %lld bytes cannot be read as labels", path,
                          (long long)info.rows, (long long)info.row_bytes);
    *labels = (int32_t *)malloc((size_t)(info.rows > 0 ? info.rows : 1) * sizeof(int32_t));
    chunk = XKNN__IO_CHUNK / es;
    buf = (unsigned char *)malloc((size_t)XKNN__IO_CHUNK);
    if (!*labels || !buf) {
        st = xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "%s: cannot allocate %lld labels", path, (long long)info.rows);
        goto done_nosrc;
    }
    if ((st = xknn__src_open(&src, path, info.compressed, err)) != XKNN_SUCCESS) goto done_nosrc;
    for (r = 0; r < info.rows; r += chunk) {
        const int64_t c = info.rows - r < chunk ? info.rows - r : chunk;
        size_t got = 0;
        int64_t i;
        if ((st = xknn__src_read_at(&src, info.data_offset + r * es, buf, (size_t)(c * es), &got, buf,
                                    (size_t)XKNN__IO_CHUNK, err)) != XKNN_SUCCESS)
            break;
        if ((int64_t)got < c * es) {
            st = xknn__io_short(path, r + (int64_t)got / es, err);
            break;
        }
        for (i = 0; i < c; i++) {
            const unsigned char *q = buf + i * es;
            int64_t v;
            switch (info.elem) {
            case XKNN_ELEM_U8: v = q[0]; break;
            case XKNN_ELEM_I8: v = (int64_t)q[0] - ((q[0] & 0x80u) ? 256 : 0); break;
            case XKNN_ELEM_I16: {
                uint16_t u = xknn__io_u16(q, info.big_endian);
                v = (int64_t)u - ((u & 0x8000u) ? 65536 : 0);
                break;
            }
            case XKNN_ELEM_I32: v = xknn__io_i32(xknn__io_u32(q, info.big_endian)); break;
            default: v = (int64_t)xknn__io_u64(q, info.big_endian); break;
            }
            if (v < INT32_MIN || v > INT32_MAX) {
                st = xknn__fail(err, XKNN_ERROR_INVALID_VALUE, "%s: row %lld is %lld, outside the int32 range of labels",
                                path, (long long)(r + i), (long long)v);
                break;
            }
            (*labels)[r + i] = (int32_t)v;
        }
        if (st != XKNN_SUCCESS) break;
    }
    xknn__src_close(&src);
done_nosrc:
    free(buf);
    if (st != XKNN_SUCCESS) {
        free(*labels);
        *labels = NULL;
        return st;
    }
    *n = info.rows;
    return xknn__io_ok(err);
}

xknn_status xknn_targets_read(const char *path, int64_t *n, float **targets, xknn_error *err)
{
    xknn_file_info info;
    int compressed;
    xknn_status st;

    if (!path || !n || !targets)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_targets_read: a NULL argument");
    *targets = NULL;
    *n = 0;
    if (xknn__io_is_text(path, &compressed)) return xknn__io_text_values(path, compressed, 0, n, NULL, targets, err);
    if ((st = xknn_file_probe(path, NULL, &info, err)) != XKNN_SUCCESS) return st;
    if ((st = xknn__io_one_column(path, &info, err)) != XKNN_SUCCESS) return st;
    if ((uint64_t)info.rows > (uint64_t)(SIZE_MAX / sizeof(float)))
        return xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "%s: %lld targets do not fit in memory", path,
                          (long long)info.rows);
    *targets = (float *)malloc((size_t)(info.rows > 0 ? info.rows : 1) * sizeof(float));
    if (!*targets)
        return xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "%s: cannot allocate %lld targets", path, (long long)info.rows);
    if ((st = xknn_file_read_rows(path, &info, 0, info.rows, *targets, err)) != XKNN_SUCCESS) {
        free(*targets);
        *targets = NULL;
        return st;
    }
    *n = info.rows;
    return XKNN_SUCCESS;
}

#ifdef __cplusplus
}
#endif

#endif /* XKNN__IO_IMPLEMENTATION_DONE */
#endif /* XKNN_IMPLEMENTATION */
