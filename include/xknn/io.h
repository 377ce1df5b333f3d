/*
 * xknn/io.h -- readers and writers of the data formats (DESIGN.md section 3).
 * Host code; the implementation is compiled behind XKNN_IMPLEMENTATION (libxknn does).
 * Nothing here knows about MPI: a rank reads its rows with xknn_file_read_rows().
 *
 * Formats (chosen by extension, little-endian, ".gz" read transparently where noted):
 *   .fvecs .ivecs .bvecs    TEXMEX: per row int32 d, then d float32 / int32 / uint8
 *   .fbin .u8bin .i8bin .ibin  big-ann: uint32 n, uint32 d, then n*d values
 *   .bin                    same layout as .fbin; float32 unless opts.bin_dtype says
 *   .npy                    v1/v2/v3 header, C order, <f4 <f2 |u1 |i1 <i4
 *   IDX (-idx?-ubyte, .idx) big-endian MNIST layout; .gz allowed (zlib)
 * Every reader converts to float32 rows on read (the dtype the library searches today)
 * and checks values: NaN or Inf is an error naming the file, row and column.
 * Headers are validated against the file size before anything is allocated.
 *
 * Results are written in the big-ann ground-truth layout (".bin" or any other name):
 * uint32 nq, uint32 k, int32 ids[nq*k], float32 dist[nq*k]; or ".ivecs" (per row int32
 * k then k int32 ids). Ids above 2^31-1 need XKNN_RESULT_BIN64 (int64 ids), chosen
 * explicitly; ids are never truncated. Writers go to a temporary name in the same
 * directory and rename when complete.
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
    XKNN_ELEM_COUNT
} xknn_elem;

typedef struct xknn_read_opts {
    xknn_file_format format; /* XKNN_FORMAT_AUTO: from the extension             */
    xknn_elem bin_dtype;     /* element type of ".bin" files (default f32)       */
} xknn_read_opts;

#define XKNN_READ_OPTS_INIT { XKNN_FORMAT_AUTO, XKNN_ELEM_F32 }

/* What a file holds, from its header (and size). */
typedef struct xknn_file_info {
    xknn_file_format format;
    xknn_elem elem;
    int compressed;       /* 1: gzip (rows are read by streaming)             */
    int64_t rows;         /* n                                                */
    int64_t cols;         /* d (IDX: product of the dimensions after the first) */
    int64_t data_offset;  /* byte offset of row 0 (uncompressed stream)        */
    int64_t row_bytes;    /* bytes from one row to the next                    */
    int big_endian;       /* IDX                                               */
} xknn_file_info;

/* Not collective. Reads and validates the header of `path` against its size.
 * Errors: IO (cannot open/read, names the path and strerror), FORMAT (names the path
 * and what is wrong: "truncated header", "size 1000 does not match header n=10 d=3
 * (expected 128 bytes)", "row 5 has d=7, row 0 has d=8", "d = 0", "bad magic"...). */
XKNN_API xknn_status xknn_file_probe(const char *path, const xknn_read_opts *opts, xknn_file_info *info,
                                     xknn_error *err);

/* Not collective. Reads rows [row0, row0 + nrows) of a probed file as float32 into
 * `out` (host memory, nrows x info->cols, row-major, ld = cols). Reads only those rows
 * (pread; for .gz: streams and skips). NaN/Inf -> INVALID_VALUE naming file, row (global
 * row number) and column. */
XKNN_API xknn_status xknn_file_read_rows(const char *path, const xknn_file_info *info, int64_t row0,
                                         int64_t nrows, float *out, xknn_error *err);

/* Result files ---------------------------------------------------------------------- */
typedef enum xknn_result_format {
    XKNN_RESULT_AUTO = 0, /* ".ivecs" -> IVECS, anything else -> BIN                 */
    XKNN_RESULT_BIN,      /* uint32 nq, uint32 k, int32 ids[nq*k], float32 dist[nq*k] */
    XKNN_RESULT_BIN64,    /* uint32 nq, uint32 k, int64 ids[nq*k], float32 dist[nq*k] */
    XKNN_RESULT_IVECS,    /* per row: int32 k, k int32 ids                            */
    XKNN_RESULT_COUNT
} xknn_result_format;

XKNN_API xknn_result_format xknn_result_format_from_path(const char *path);

/* Byte layout of a result file, for writers that place rows at offsets (MPI-IO):
 * header bytes at 0; row i's ids at ids_offset + i*ids_row_bytes; row i's distances
 * at dist_offset + i*dist_row_bytes (dist_row_bytes = 0: no distances in the format). */
typedef struct xknn_result_layout {
    int64_t total_bytes;
    int64_t header_bytes;
    int64_t ids_offset, ids_row_bytes;
    int64_t dist_offset, dist_row_bytes;
} xknn_result_layout;

XKNN_API xknn_status xknn_result_layout_of(xknn_result_format fmt, int64_t nq, int64_t k,
                                           xknn_result_layout *layout, xknn_error *err);
/* Encodes the header (8 bytes for BIN/BIN64, none for IVECS) into hdr[8]. */
XKNN_API void xknn_result_header(xknn_result_format fmt, int64_t nq, int64_t k, unsigned char hdr[8]);
/* Encodes rows [0, nrows) of ids/dist (host, ld = k) into the file's byte form for the
 * ids part and the dist part (buffers of nrows*ids_row_bytes and nrows*dist_row_bytes).
 * Fails (INVALID_ARGUMENT) if an id does not fit the format (int32 for BIN/IVECS). */
XKNN_API xknn_status xknn_result_encode_rows(xknn_result_format fmt, int64_t nrows, int64_t k, const int64_t *ids,
                                             const float *dist, void *ids_bytes, void *dist_bytes,
                                             xknn_error *err);

/* Not collective. Writes a whole result to `path` via a temporary file in the same
 * directory, renamed at the end; on any failure the temporary is removed and `path`
 * is untouched. */
XKNN_API xknn_status xknn_result_write(const char *path, xknn_result_format fmt, int64_t nq, int64_t k,
                                       const int64_t *ids, const float *dist, xknn_error *err);

/* Reads a result file written above (tests, benchmarks). ids/dist allocated with
 * malloc (dist NULL for IVECS); caller frees. */
XKNN_API xknn_status xknn_result_read(const char *path, xknn_result_format fmt, int64_t *nq, int64_t *k,
                                      int64_t **ids, float **dist, xknn_error *err);

#ifdef __cplusplus
}
#endif

#endif /* XKNN_IO_H */

/* ===================================================================================== */
#ifdef XKNN_IMPLEMENTATION
#ifndef XKNN__IO_IMPLEMENTATION_DONE
#define XKNN__IO_IMPLEMENTATION_DONE
/* implementation: to be written (see the contract above) */
#endif
#endif
