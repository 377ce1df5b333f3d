/* SPDX-License-Identifier: MIT */
/*
 * tools/npz.h -- NumPy outputs of knn_mpi: '-o NAME.npy' (the ids) and '-o NAME.npz' (an
 * uncompressed ZIP holding ids.npy and dist.npy).
 *
 * Guarantees:
 *  - The byte layout depends on nq and k alone, so every rank writes its rows at fixed
 *    offsets through the ordinary sink, as for the .bin layout: ids int64 '<i8' and
 *    distances float32 '<f4', shape (nq, k), C order, each row as the search returns it.
 *  - .npz members are stored (method 0); their CRC-32 is combined on rank 0 from the CRC
 *    each rank took of each block it wrote, in row order (crc32_combine), and rank 0
 *    writes the local headers, the central directory and the end record before the
 *    commit. No ZIP64: an archive over 4 GiB - 1 is refused before the search.
 *  - .npz needs zlib; without it the extension is a usage error.
 */
#ifndef XKNN_TOOLS_NPZ_H
#define XKNN_TOOLS_NPZ_H

#include <stddef.h>
#include <stdint.h>

#include "outputs.h"
#include "xknn/io.h"

typedef enum knn_npz_kind { KNN_NPZ_NONE = 0, KNN_NPZ_NPY, KNN_NPZ_NPZ } knn_npz_kind;

typedef struct knn_npz {
    knn_npz_kind kind;
    int64_t nq, k;
    int64_t member_at[2];    /* local header of ids.npy, dist.npy                 */
    int64_t data_at[2];      /* first data byte of each member (its .npy header)  */
    int64_t cd_at;           /* central directory                                 */
    int64_t *blocks;         /* per written block: q0, rows, crc ids, crc dist     */
    int64_t nblocks, cap;
} knn_npz;

/* Not collective. The kind of result file PATH names: .bin and .ivecs give NONE (the
 * library's layouts), .npy and .npz theirs. Returns 0, or 1 with msg for any other
 * extension (and for .npz without zlib). */
int knn_npz_kind_of(const char *path, knn_npz_kind *kind, char *msg, size_t msz);

/* Not collective. Fixes z's layout for nq x k and fills lay (header_bytes 0: the headers
 * are written by knn_npz_write_head and knn_npz_finish). Errors: INVALID_ARGUMENT when
 * the archive would pass 4 GiB - 1. */
xknn_status knn_npz_layout(knn_npz *z, knn_npz_kind kind, int64_t nq, int64_t k, xknn_result_layout *lay,
                           xknn_error *err);

/* Not collective; rank 0 after the outputs are open. .npy: writes its header. */
xknn_status knn_npz_write_head(knn_npz *z, knn_outs *o, int slot, xknn_error *err);

/* Not collective. Records the CRC-32 of an encoded block of rows (.npz only): ids and
 * dist are the bytes written for rows q0 .. q0+rows-1. */
xknn_status knn_npz_note(knn_npz *z, int64_t q0, int64_t rows, const void *ids, int64_t ids_len, const void *dist,
                         int64_t dist_len, xknn_error *err);

/* Collective over o's context (.npz only; a no-op otherwise). Gathers the blocks' CRCs on
 * rank 0, which writes the ZIP headers, central directory and end record. Returns rank
 * 0's status on rank 0 and the gather's elsewhere: agree on it before the commit. */
xknn_status knn_npz_finish(knn_npz *z, knn_outs *o, int slot, xknn_error *err);

void knn_npz_free(knn_npz *z);

#endif
