/* SPDX-License-Identifier: MIT */
/*
 * tools/npz.c -- NumPy outputs of knn_mpi (tools/npz.h): the fixed layout, the .npy
 * headers, and the ZIP records of an uncompressed .npz.
 */
#include "npz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#ifdef KNN_HAVE_ZLIB
#include <zlib.h>
#endif

#define KNN__ZIP_LOCAL 30   /* local file header, without the name    */
#define KNN__ZIP_CENTRAL 46 /* central directory entry, without name  */
#define KNN__ZIP_END 22     /* end of central directory record        */

static const char *const knn__member[2] = {"ids.npy", "dist.npy"};
static const char *const knn__descr[2] = {"<i8", "<f4"};
static const int64_t knn__elem[2] = {8, 4};

int knn_npz_kind_of(const char *path, knn_npz_kind *kind, char *msg, size_t msz)
{
    *kind = KNN_NPZ_NONE;
    if (knn__ends(path, ".bin") || knn__ends(path, ".ivecs")) return 0;
    if (knn__ends(path, ".npy")) {
        *kind = KNN_NPZ_NPY;
        return 0;
    }
    if (knn__ends(path, ".npz")) {
#ifdef KNN_HAVE_ZLIB
        *kind = KNN_NPZ_NPZ;
        return 0;
#else
        snprintf(msg, msz, "%s: this knn_mpi was built without zlib, which .npz outputs need (CRC-32); use .npy or .bin",
                 path);
        return 1;
#endif
    }
    snprintf(msg, msz, "%s: unknown result extension; use .bin, .ivecs, .npy or .npz", path);
    return 1;
}

/* The .npy header of member m (version 1.0): magic, length, the dict padded with spaces
 * and ended by '\n' so that the data starts at a multiple of 64. Returns its length. */
static int64_t knn__npz_member_header(int m, int64_t nq, int64_t k, char *out, size_t cap)
{
    char dict[160];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld, %lld), }",
                     knn__descr[m], (long long)nq, (long long)k);
    int64_t total = ((10 + n + 1 + 63) / 64) * 64, i;
    if (n < 0 || (size_t)total > cap) return -1;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (char)((total - 10) & 0xff);
    out[9] = (char)((total - 10) >> 8);
    memcpy(out + 10, dict, (size_t)n);
    for (i = 10 + n; i < total - 1; i++) out[i] = ' ';
    out[total - 1] = '\n';
    return total;
}

xknn_status knn_npz_layout(knn_npz *z, knn_npz_kind kind, int64_t nq, int64_t k, xknn_result_layout *lay,
                           xknn_error *err)
{
    char h[256];
    int64_t at = 0;
    int m;
    z->kind = kind;
    z->nq = nq;
    z->k = k;
    memset(lay, 0, sizeof *lay);
    if (kind == KNN_NPZ_NPY) {
        lay->ids_offset = knn__npz_member_header(0, nq, k, h, sizeof h);
        lay->ids_row_bytes = 8 * k;
        lay->dist_offset = lay->total_bytes = lay->ids_offset + 8 * nq * k;
        return XKNN_SUCCESS;
    }
    for (m = 0; m < 2; m++) {
        z->member_at[m] = at;
        z->data_at[m] = at + KNN__ZIP_LOCAL + (int64_t)strlen(knn__member[m]);
        at = z->data_at[m] + knn__npz_member_header(m, nq, k, h, sizeof h);
        if (m == 0) lay->ids_offset = at;
        else lay->dist_offset = at;
        at += knn__elem[m] * nq * k;
    }
    z->cd_at = at;
    lay->ids_row_bytes = 8 * k;
    lay->dist_row_bytes = 4 * k;
    lay->total_bytes = at + 2 * KNN__ZIP_CENTRAL + (int64_t)(strlen(knn__member[0]) + strlen(knn__member[1])) +
                       KNN__ZIP_END;
    if (lay->total_bytes > (int64_t)UINT32_MAX)
        return knn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                         "nq=%lld k=%lld: the .npz would hold %lld bytes, past the 4 GiB - 1 of a ZIP without "
                         "ZIP64 records (not written); use a .npy (ids) or .bin output",
                         (long long)nq, (long long)k, (long long)lay->total_bytes);
    return XKNN_SUCCESS;
}

xknn_status knn_npz_write_head(knn_npz *z, knn_outs *o, int slot, xknn_error *err)
{
    char h[256];
    int64_t n;
    if (z->kind != KNN_NPZ_NPY || o->rank != 0) return XKNN_SUCCESS;
    n = knn__npz_member_header(0, z->nq, z->k, h, sizeof h);
    return knn_outs_write(o, slot, 0, h, n, "the .npy header", err);
}

#ifdef KNN_HAVE_ZLIB
/* CRC-32 of len bytes (zlib takes lengths of 32 bits). */
static uint32_t knn__crc(uint32_t crc, const void *buf, int64_t len)
{
    const unsigned char *p = (const unsigned char *)buf;
    while (len > 0) {
        const uInt c = (uInt)(len < ((int64_t)1 << 30) ? len : ((int64_t)1 << 30));
        crc = (uint32_t)crc32(crc, p, c);
        p += c;
        len -= c;
    }
    return crc;
}
#endif

xknn_status knn_npz_note(knn_npz *z, int64_t q0, int64_t rows, const void *ids, int64_t ids_len, const void *dist,
                         int64_t dist_len, xknn_error *err)
{
#ifdef KNN_HAVE_ZLIB
    int64_t *b;
    if (z->kind != KNN_NPZ_NPZ) return XKNN_SUCCESS;
    if (z->nblocks == z->cap) {
        const int64_t cap = z->cap ? 2 * z->cap : 64;
        int64_t *nb = (int64_t *)realloc(z->blocks, (size_t)(4 * cap) * sizeof(int64_t));
        if (!nb) return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "out of memory for the .npz block list");
        z->blocks = nb;
        z->cap = cap;
    }
    b = z->blocks + 4 * z->nblocks++;
    b[0] = q0;
    b[1] = rows;
    b[2] = (int64_t)knn__crc(0, ids, ids_len);
    b[3] = (int64_t)knn__crc(0, dist, dist_len);
#else
    (void)z; (void)q0; (void)rows; (void)ids; (void)ids_len; (void)dist; (void)dist_len; (void)err;
#endif
    return XKNN_SUCCESS;
}

#ifdef KNN_HAVE_ZLIB
static void knn__put16(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v & 0xff);
    p[1] = (unsigned char)((v >> 8) & 0xff);
}

static void knn__put32(unsigned char *p, uint32_t v)
{
    knn__put16(p, v & 0xffff);
    knn__put16(p + 2, v >> 16);
}

static int knn__by_q0(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Collective. Every rank's blocks on rank 0 (*all, *n); elsewhere *all stays NULL. */
static xknn_status knn__gather_blocks(knn_npz *z, knn_outs *o, int64_t **all, int64_t *n, xknn_error *err)
{
    *all = NULL;
    *n = z->nblocks;
#ifdef XKNN_HAVE_MPI
    if (o->ctx && o->size > 1) {
        int mine = (int)(4 * z->nblocks), *cnt = NULL, *dsp = NULL, i, rc, have = 1;
        if (o->rank == 0) {
            cnt = (int *)malloc(2 * (size_t)o->size * sizeof(int));
            dsp = cnt ? cnt + o->size : NULL;
            have = cnt != NULL;
        }
        rc = MPI_Bcast(&have, 1, MPI_INT, 0, o->comm);
        if (rc == MPI_SUCCESS && !have)
            return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "rank 0: out of memory gathering the .npz CRCs");
        if (rc == MPI_SUCCESS) rc = MPI_Gather(&mine, 1, MPI_INT, cnt, 1, MPI_INT, 0, o->comm);
        if (rc == MPI_SUCCESS && o->rank == 0) {
            int64_t t = 0;
            for (i = 0; i < o->size; i++) {
                dsp[i] = (int)t;
                t += cnt[i];
            }
            *n = t / 4;
            *all = (int64_t *)malloc((size_t)(t > 0 ? t : 1) * sizeof(int64_t));
        }
        if (rc == MPI_SUCCESS)
            rc = MPI_Gatherv(z->blocks, mine, MPI_INT64_T, *all, cnt, dsp, MPI_INT64_T, 0, o->comm);
        free(cnt);
        if (rc != MPI_SUCCESS) return knn__mpi_fail(err, o->rank, rc, "MPI_Gatherv (.npz CRCs)");
        if (o->rank == 0 && !*all)
            return knn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "rank 0: out of memory for the .npz block list");
        return XKNN_SUCCESS;
    }
#endif
    (void)o;
    (void)err;
    *all = z->blocks;
    z->blocks = NULL;
    z->nblocks = z->cap = 0;
    return XKNN_SUCCESS;
}

/* Rank 0: member m's local header, .npy header and central entry, given its CRC. */
static xknn_status knn__write_member(knn_npz *z, knn_outs *o, int slot, int m, uint32_t crc, unsigned char *cd,
                                     xknn_error *err)
{
    unsigned char lh[KNN__ZIP_LOCAL + 16];
    char h[256];
    const uint32_t nlen = (uint32_t)strlen(knn__member[m]);
    const int64_t hl = knn__npz_member_header(m, z->nq, z->k, h, sizeof h);
    const uint32_t size = (uint32_t)(hl + knn__elem[m] * z->nq * z->k);
    xknn_status st;
    memset(lh, 0, sizeof lh);
    knn__put32(lh, 0x04034b50u);
    knn__put16(lh + 4, 20);     /* version needed: 2.0 */
    knn__put16(lh + 12, 0x21);  /* date: 1980-01-01 (no time is recorded) */
    knn__put32(lh + 14, crc);
    knn__put32(lh + 18, size);  /* stored: compressed size = size */
    knn__put32(lh + 22, size);
    knn__put16(lh + 26, nlen);
    memcpy(lh + KNN__ZIP_LOCAL, knn__member[m], nlen);
    st = knn_outs_write(o, slot, z->member_at[m], lh, KNN__ZIP_LOCAL + nlen, "a ZIP local header", err);
    if (st == XKNN_SUCCESS) st = knn_outs_write(o, slot, z->data_at[m], h, hl, "a .npy header", err);
    memset(cd, 0, KNN__ZIP_CENTRAL);
    knn__put32(cd, 0x02014b50u);
    knn__put16(cd + 4, 20); /* made by: 2.0, MS-DOS attributes */
    knn__put16(cd + 6, 20);
    knn__put16(cd + 14, 0x21);
    knn__put32(cd + 16, crc);
    knn__put32(cd + 20, size);
    knn__put32(cd + 24, size);
    knn__put16(cd + 28, nlen);
    knn__put32(cd + 42, (uint32_t)z->member_at[m]);
    memcpy(cd + KNN__ZIP_CENTRAL, knn__member[m], nlen);
    return st;
}

/* Rank 0: the members' CRCs from the blocks in row order, then every ZIP record. */
static xknn_status knn__write_zip(knn_npz *z, knn_outs *o, int slot, int64_t *all, int64_t n, xknn_error *err)
{
    unsigned char cd[2 * (KNN__ZIP_CENTRAL + 16) + KNN__ZIP_END], *p = cd;
    char h[256];
    uint32_t crc[2];
    int64_t i, next = 0;
    int m;
    xknn_status st = XKNN_SUCCESS;
    qsort(all, (size_t)n, 4 * sizeof(int64_t), knn__by_q0);
    for (m = 0; m < 2; m++) crc[m] = knn__crc(0, h, knn__npz_member_header(m, z->nq, z->k, h, sizeof h));
    for (i = 0; i < n; i++) {
        const int64_t *b = all + 4 * i;
        if (b[0] != next) break;
        for (m = 0; m < 2; m++)
            crc[m] = (uint32_t)crc32_combine(crc[m], (uLong)b[2 + m], (z_off_t)(knn__elem[m] * b[1] * z->k));
        next += b[1];
    }
    if (next != z->nq)
        return knn__fail(err, XKNN_ERROR_INTERNAL, ".npz: the written blocks cover rows 0..%lld of %lld",
                         (long long)next - 1, (long long)z->nq);
    for (m = 0; m < 2 && st == XKNN_SUCCESS; m++) {
        st = knn__write_member(z, o, slot, m, crc[m], p, err);
        p += KNN__ZIP_CENTRAL + strlen(knn__member[m]);
    }
    memset(p, 0, KNN__ZIP_END);
    knn__put32(p, 0x06054b50u);
    knn__put16(p + 8, 2);
    knn__put16(p + 10, 2);
    knn__put32(p + 12, (uint32_t)(p - cd));
    knn__put32(p + 16, (uint32_t)z->cd_at);
    p += KNN__ZIP_END;
    if (st == XKNN_SUCCESS) st = knn_outs_write(o, slot, z->cd_at, cd, p - cd, "the ZIP central directory", err);
    return st;
}
#endif

xknn_status knn_npz_finish(knn_npz *z, knn_outs *o, int slot, xknn_error *err)
{
#ifdef KNN_HAVE_ZLIB
    int64_t *all, n;
    xknn_status st;
    if (z->kind != KNN_NPZ_NPZ) return XKNN_SUCCESS;
    st = knn__gather_blocks(z, o, &all, &n, err);
    if (st == XKNN_SUCCESS && o->rank == 0) st = knn__write_zip(z, o, slot, all, n, err);
    free(all);
    return st;
#else
    (void)z; (void)o; (void)slot; (void)err;
    return XKNN_SUCCESS;
#endif
}

void knn_npz_free(knn_npz *z)
{
    free(z->blocks);
    z->blocks = NULL;
    z->nblocks = z->cap = 0;
}
