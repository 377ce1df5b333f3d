/* SPDX-License-Identifier: MIT */
/*
 * xknn/impl/io_results.h -- the result-file part of the xknn/io.h implementation:
 * xknn_result_format_from_path, _layout_of, _header, _encode_rows, _write and _read
 * (layouts in docs/DESIGN.md section 3). Not a public header: xknn/io.h includes it
 * inside its implementation section, after the helpers it uses (xknn__src_*,
 * xknn__io_* byte order and checked arithmetic), so it compiles only there.
 */
#ifndef XKNN_IMPL_IO_RESULTS_H
#define XKNN_IMPL_IO_RESULTS_H
#ifndef XKNN__IO_IMPLEMENTATION_DONE
#error "xknn/impl/io_results.h is part of the xknn/io.h implementation: include xknn/io.h"
#endif

/* ---- result files ------------------------------------------------------------------- */

xknn_result_format xknn_result_format_from_path(const char *path)
{
    if (path && xknn__io_ends(path, strlen(path), ".ivecs")) return XKNN_RESULT_IVECS;
    return XKNN_RESULT_BIN;
}

static const char *xknn__result_name(xknn_result_format fmt)
{
    switch (fmt) {
    case XKNN_RESULT_BIN: return "bin";
    case XKNN_RESULT_BIN64: return "bin64";
    case XKNN_RESULT_IVECS: return "ivecs";
    default: return "unknown";
    }
}

xknn_status xknn_result_layout_of(xknn_result_format fmt, int64_t nq, int64_t k, xknn_result_layout *layout,
                                  xknn_error *err)
{
    xknn_result_layout l;
    int64_t nk, idsz;
    if (!layout) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_result_layout_of: layout is NULL");
    if (fmt != XKNN_RESULT_BIN && fmt != XKNN_RESULT_BIN64 && fmt != XKNN_RESULT_IVECS)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          "result format %d: need BIN, BIN64 or IVECS (resolve AUTO with "
                          "xknn_result_format_from_path)",
                          (int)fmt);
    if (nq < 1) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "result nq=%lld: need nq >= 1", (long long)nq);
    if (k < 1) return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "result k=%lld: need k >= 1", (long long)k);
    memset(&l, 0, sizeof l);
    if (fmt == XKNN_RESULT_IVECS) {
        if (k > INT32_MAX)
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "result k=%lld does not fit the int32 k of .ivecs",
                              (long long)k);
        l.ids_row_bytes = 4 + 4 * k;
        if (!xknn__io_mul(nq, l.ids_row_bytes, &l.total_bytes))
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "result nq=%lld k=%lld: size overflows 64 bits",
                              (long long)nq, (long long)k);
        l.dist_offset = l.total_bytes;
        *layout = l;
        return xknn__io_ok(err);
    }
    if (nq > (int64_t)UINT32_MAX || k > (int64_t)UINT32_MAX)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                          "result nq=%lld k=%lld: both must fit the uint32 header of the %s format", (long long)nq,
                          (long long)k, xknn__result_name(fmt));
    idsz = fmt == XKNN_RESULT_BIN64 ? 8 : 4;
    l.header_bytes = 8;
    l.ids_offset = 8;
    l.ids_row_bytes = idsz * k;
    l.dist_row_bytes = 4 * k;
    if (!xknn__io_mul(nq, k, &nk) || !xknn__io_mul(nk, idsz, &l.dist_offset) ||
        !xknn__io_add(l.dist_offset, 8, &l.dist_offset) || !xknn__io_mul(nk, 4, &l.total_bytes) ||
        !xknn__io_add(l.total_bytes, l.dist_offset, &l.total_bytes))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "result nq=%lld k=%lld: size overflows 64 bits",
                          (long long)nq, (long long)k);
    *layout = l;
    return xknn__io_ok(err);
}

void xknn_result_header(xknn_result_format fmt, int64_t nq, int64_t k, unsigned char hdr[8])
{
    memset(hdr, 0, 8);
    if (fmt != XKNN_RESULT_BIN && fmt != XKNN_RESULT_BIN64) return;
    xknn__io_put32(hdr, (uint32_t)((uint64_t)nq & 0xffffffffu));
    xknn__io_put32(hdr + 4, (uint32_t)((uint64_t)k & 0xffffffffu));
}

/* Checks that ids[0, nk) fit the format's id type; names the first that does not. */
static xknn_status xknn__result_check_ids(const char *path, xknn_result_format fmt, int64_t nk, int64_t k,
                                          const int64_t *ids, xknn_error *err)
{
    int64_t i;
    if (fmt == XKNN_RESULT_BIN64) return XKNN_SUCCESS;
    for (i = 0; i < nk; i++)
        if (ids[i] < INT32_MIN || ids[i] > INT32_MAX)
            return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT,
                              "%s%sid %lld (row %lld, neighbour %lld) does not fit the int32 ids of the %s result "
                              "format: write XKNN_RESULT_BIN64 (int64 ids) instead; ids are never truncated",
                              path ? path : "", path ? ": " : "", (long long)ids[i], (long long)(i / k),
                              (long long)(i % k), xknn__result_name(fmt));
    return XKNN_SUCCESS;
}

/* nrows x k ids in the file's form (ids already checked); IVECS rows start with k. */
static void xknn__result_put_ids(xknn_result_format fmt, int64_t nrows, int64_t k, const int64_t *ids,
                                 unsigned char *out)
{
    int64_t i, j;
    for (i = 0; i < nrows; i++) {
        const int64_t *ri = ids + i * k;
        if (fmt == XKNN_RESULT_IVECS) {
            xknn__io_put32(out, (uint32_t)k);
            out += 4;
        }
        for (j = 0; j < k; j++) {
            if (fmt == XKNN_RESULT_BIN64) {
                xknn__io_put64(out, (uint64_t)ri[j]);
                out += 8;
            } else {
                xknn__io_put32(out, (uint32_t)ri[j]);
                out += 4;
            }
        }
    }
}

static void xknn__result_put_dist(int64_t nk, const float *dist, unsigned char *out)
{
    int64_t i;
    for (i = 0; i < nk; i++) {
        uint32_t b;
        memcpy(&b, dist + i, 4);
        xknn__io_put32(out + 4 * i, b);
    }
}

xknn_status xknn_result_encode_rows(xknn_result_format fmt, int64_t nrows, int64_t k, const int64_t *ids,
                                    const float *dist, void *ids_bytes, void *dist_bytes, xknn_error *err)
{
    int64_t nk;
    xknn_status st;
    if (fmt != XKNN_RESULT_BIN && fmt != XKNN_RESULT_BIN64 && fmt != XKNN_RESULT_IVECS)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "result format %d: need BIN, BIN64 or IVECS", (int)fmt);
    if (nrows < 0 || k < 1 || (fmt == XKNN_RESULT_IVECS && k > INT32_MAX) || !xknn__io_mul(nrows, k, &nk))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "result rows=%lld k=%lld: need rows >= 0 and k >= 1",
                          (long long)nrows, (long long)k);
    if (nrows == 0) return xknn__io_ok(err);
    if (!ids || !ids_bytes || (fmt != XKNN_RESULT_IVECS && (!dist || !dist_bytes)))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "result encoding: %s is NULL",
                          !ids ? "ids" : !ids_bytes ? "ids_bytes" : !dist ? "dist (the format stores distances)"
                                                                          : "dist_bytes");
    if ((st = xknn__result_check_ids(NULL, fmt, nk, k, ids, err)) != XKNN_SUCCESS) return st;
    {
        /* blocks of rows spread over threads (OpenMP's default count; a caller that shares
         * the cores sets it), each block's bytes where a one-thread pass puts them */
        const int64_t idb = (fmt == XKNN_RESULT_IVECS ? 4 : 0) + k * (fmt == XKNN_RESULT_BIN64 ? 8 : 4);
        const int64_t grain = (INT64_C(1) << 16) / k + 1;
        const int64_t blocks = (nrows + grain - 1) / grain;
        int64_t b;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (blocks > 1)
#endif
        for (b = 0; b < blocks; b++) {
            const int64_t r0 = b * grain, nr = nrows - r0 < grain ? nrows - r0 : grain;
            xknn__result_put_ids(fmt, nr, k, ids + r0 * k, (unsigned char *)ids_bytes + r0 * idb);
            if (fmt != XKNN_RESULT_IVECS)
                xknn__result_put_dist(nr * k, dist + r0 * k, (unsigned char *)dist_bytes + r0 * k * 4);
        }
    }
    return xknn__io_ok(err);
}

/* Writes all of buf; 0 or an errno value (short writes are continued). */
static int xknn__io_write_all(int fd, const unsigned char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, buf, len > (size_t)XKNN__IO_MAX_CALL ? (size_t)XKNN__IO_MAX_CALL : len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Creates "<dir>/.<name>.tmp.XXXXXX" with O_EXCL (mode 0666 minus the umask). */
static int xknn__io_tmp_create(const char *path, char *tmp, size_t tmp_size, int *fd)
{
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    const char *slash = strrchr(path, '/');
    const size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    struct timespec ts;
    uint64_t x;
    int attempt, i;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) ts.tv_sec = 0, ts.tv_nsec = 0;
    x = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 30 ^
        (uint64_t)(uintptr_t)&ts;
    for (attempt = 0; attempt < 100; attempt++) {
        char suffix[7];
        for (i = 0; i < 6; i++) { /* splitmix64 steps */
            uint64_t z = (x += 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            suffix[i] = alphabet[(z ^ (z >> 31)) % (sizeof alphabet - 1)];
        }
        suffix[6] = '\0';
        snprintf(tmp, tmp_size, "%.*s.%s.tmp.%s", (int)dir_len, path, path + dir_len, suffix);
        do *fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | XKNN__O_CLOEXEC, 0666);
        while (*fd < 0 && errno == EINTR);
        if (*fd >= 0) return 0;
        if (errno != EEXIST) return errno;
    }
    return EEXIST;
}

xknn_status xknn_result_write(const char *path, xknn_result_format fmt, int64_t nq, int64_t k, const int64_t *ids,
                              const float *dist, xknn_error *err)
{
    xknn_result_layout lay;
    unsigned char hdr[8], *buf = NULL;
    char *tmp = NULL;
    int fd = -1, in_place = 0, e = 0;
    const char *step = "write";
    int64_t rows_per_chunk, r;
    struct stat sb;
    size_t plen;
    xknn_status st;

    if (!path || !*path)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_result_write: path is %s", path ? "empty" : "NULL");
    if (fmt == XKNN_RESULT_AUTO) fmt = xknn_result_format_from_path(path);
    if ((st = xknn_result_layout_of(fmt, nq, k, &lay, err)) != XKNN_SUCCESS) {
        if (err) { /* prefix the path */
            char msg[sizeof err->message];
            memcpy(msg, err->message, sizeof msg);
            xknn__fail(err, st, "%s: %s", path, msg);
        }
        return st;
    }
    if (!ids || (fmt != XKNN_RESULT_IVECS && !dist))
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", path,
                          !ids ? "ids" : "dist (the format stores distances)");
    plen = strlen(path);
    if (path[plen - 1] == '/')
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s: names a directory, not a file", path);
    if ((st = xknn__result_check_ids(path, fmt, nq * k, k, ids, err)) != XKNN_SUCCESS) return st;
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode))
            return xknn__fail(err, XKNN_ERROR_IO, "%s: cannot write: %s", path, strerror(EISDIR));
        in_place = !S_ISREG(sb.st_mode); /* /dev/null, a FIFO: never replace them */
    }

    rows_per_chunk = XKNN__IO_CHUNK / (lay.ids_row_bytes > lay.dist_row_bytes ? lay.ids_row_bytes : lay.dist_row_bytes);
    if (rows_per_chunk < 1) rows_per_chunk = 1;
    if (rows_per_chunk > nq) rows_per_chunk = nq;
    buf = (unsigned char *)malloc((size_t)(rows_per_chunk * lay.ids_row_bytes));
    tmp = (char *)malloc(plen + 32);
    if (!buf || !tmp) {
        st = xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "%s: cannot allocate write buffers", path);
        goto done;
    }
    if (in_place) {
        do fd = open(path, O_WRONLY | XKNN__O_CLOEXEC);
        while (fd < 0 && errno == EINTR);
        if (fd < 0) {
            e = errno;
            st = xknn__fail(err, XKNN_ERROR_IO, "%s: cannot open for writing: %s", path, strerror(e));
            goto done;
        }
    } else if ((e = xknn__io_tmp_create(path, tmp, plen + 32, &fd)) != 0) {
        st = xknn__fail(err, XKNN_ERROR_IO, "%s: cannot create a temporary file beside it: %s", path, strerror(e));
        goto done;
    }

    xknn_result_header(fmt, nq, k, hdr);
    if (lay.header_bytes > 0 && (e = xknn__io_write_all(fd, hdr, (size_t)lay.header_bytes)) != 0) goto fail;
    for (r = 0; r < nq; r += rows_per_chunk) { /* ids part */
        const int64_t c = nq - r < rows_per_chunk ? nq - r : rows_per_chunk;
        xknn__result_put_ids(fmt, c, k, ids + r * k, buf);
        if ((e = xknn__io_write_all(fd, buf, (size_t)(c * lay.ids_row_bytes))) != 0) goto fail;
    }
    for (r = 0; lay.dist_row_bytes > 0 && r < nq; r += rows_per_chunk) { /* dist part */
        const int64_t c = nq - r < rows_per_chunk ? nq - r : rows_per_chunk;
        xknn__result_put_dist(c * k, dist + r * k, buf);
        if ((e = xknn__io_write_all(fd, buf, (size_t)(c * lay.dist_row_bytes))) != 0) goto fail;
    }
    if (!in_place) {
        step = "fsync";
        if (fsync(fd) != 0) {
            e = errno;
            goto fail;
        }
    }
    step = "close";
    e = close(fd) != 0 ? errno : 0;
    fd = -1;
    if (e != 0) goto fail;
    if (!in_place) {
        int dfd;
        step = "rename";
        if (rename(tmp, path) != 0) {
            e = errno;
            goto fail;
        }
        /* make the rename durable; some file systems refuse fsync on a directory */
        tmp[0] = '\0';
        {
            const char *slash = strrchr(path, '/');
            if (slash) snprintf(tmp, plen + 32, "%.*s", (int)(slash - path) + 1, path);
            else snprintf(tmp, plen + 32, ".");
        }
        dfd = open(tmp, O_RDONLY | XKNN__O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            (void)close(dfd);
        }
    }
    st = xknn__io_ok(err);
    goto done;

fail:
    st = xknn__fail(err, XKNN_ERROR_IO, "%s: %s failed: %s%s", path, step, strerror(e),
                    in_place ? "" : " (the temporary file was removed; the target is untouched)");
    if (fd >= 0) (void)close(fd);
    fd = -1;
    if (!in_place) (void)unlink(tmp);
done:
    if (fd >= 0) (void)close(fd);
    free(tmp);
    free(buf);
    return st;
}

xknn_status xknn_result_read(const char *path, xknn_result_format fmt, int64_t *nq, int64_t *k, int64_t **ids,
                             float **dist, xknn_error *err)
{
    xknn__src src;
    unsigned char hdr[8], *buf = NULL;
    int64_t n, kk, nk, idsz = 4, row_bytes = 0, i, j;
    int64_t *out_ids = NULL;
    float *out_dist = NULL;
    size_t got, buf_bytes = XKNN__IO_CHUNK;
    xknn_status st;

    if (!path || !nq || !k || !ids)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "xknn_result_read: %s is NULL",
                          !path ? "path" : !nq ? "nq" : !k ? "k" : "ids");
    *ids = NULL;
    if (dist) *dist = NULL;
    *nq = *k = 0;
    if (fmt == XKNN_RESULT_AUTO) fmt = xknn_result_format_from_path(path);
    if (fmt != XKNN_RESULT_BIN && fmt != XKNN_RESULT_BIN64 && fmt != XKNN_RESULT_IVECS)
        return xknn__fail(err, XKNN_ERROR_INVALID_ARGUMENT, "%s: unknown result format %d", path, (int)fmt);
    if ((st = xknn__src_open(&src, path, 0, err)) != XKNN_SUCCESS) return st;
    if (src.size == 0) {
        st = xknn__fail(err, XKNN_ERROR_FORMAT, "%s: file is empty", path);
        goto done;
    }
    if (src.size < (fmt == XKNN_RESULT_IVECS ? 4 : 8)) {
        st = xknn__io_truncated(path, src.size, fmt == XKNN_RESULT_IVECS ? 4 : 8, xknn__result_name(fmt), err);
        goto done;
    }
    if ((st = xknn__src_pread(&src, 0, hdr, fmt == XKNN_RESULT_IVECS ? 4 : 8, &got, err)) != XKNN_SUCCESS) goto done;
    if (fmt == XKNN_RESULT_IVECS) {
        kk = xknn__io_i32(xknn__io_u32(hdr, 0));
        if (kk <= 0) {
            st = xknn__fail(err, XKNN_ERROR_FORMAT, "%s: row 0 has k = %lld: need k >= 1", path, (long long)kk);
            goto done;
        }
        row_bytes = 4 + 4 * kk;
        if (src.size % row_bytes != 0) {
            st = xknn__fail(err, XKNN_ERROR_FORMAT,
                            "%s: size %lld bytes is not a multiple of the row size %lld bytes (k=%lld from row 0)",
                            path, (long long)src.size, (long long)row_bytes, (long long)kk);
            goto done;
        }
        n = src.size / row_bytes;
        if ((size_t)row_bytes > buf_bytes) buf_bytes = (size_t)row_bytes;
    } else {
        int64_t expected;
        idsz = fmt == XKNN_RESULT_BIN64 ? 8 : 4;
        n = (int64_t)xknn__io_u32(hdr, 0);
        kk = (int64_t)xknn__io_u32(hdr + 4, 0);
        if (n == 0 || kk == 0) {
            st = xknn__fail(err, XKNN_ERROR_FORMAT, "%s: header has %s = 0 (nq=%lld k=%lld)", path, n ? "k" : "nq",
                            (long long)n, (long long)kk);
            goto done;
        }
        expected = -1;
        if (!xknn__io_mul(n, kk, &nk) || !xknn__io_mul(nk, idsz + 4, &expected) ||
            !xknn__io_add(expected, 8, &expected) || expected != src.size) {
            st = xknn__fail(err, XKNN_ERROR_FORMAT,
                            "%s: size %lld bytes does not match header nq=%lld k=%lld (expected %lld bytes for the %s "
                            "result format)",
                            path, (long long)src.size, (long long)n, (long long)kk, (long long)expected,
                            xknn__result_name(fmt));
            goto done;
        }
    }
    nk = n * kk; /* at most size / 4: checked above */
    out_ids = (int64_t *)malloc((size_t)nk * sizeof *out_ids);
    if (dist && fmt != XKNN_RESULT_IVECS) out_dist = (float *)malloc((size_t)nk * sizeof *out_dist);
    buf = (unsigned char *)malloc(buf_bytes);
    if (!out_ids || !buf || (dist && fmt != XKNN_RESULT_IVECS && !out_dist)) {
        st = xknn__fail(err, XKNN_ERROR_OUT_OF_MEMORY, "%s: cannot allocate %lld x %lld results", path, (long long)n,
                        (long long)kk);
        goto done;
    }
    if (fmt == XKNN_RESULT_IVECS) {
        const int64_t per = (int64_t)buf_bytes / row_bytes;
        for (i = 0; i < n; i += per) {
            const int64_t c = n - i < per ? n - i : per;
            int64_t r;
            if ((st = xknn__src_pread(&src, i * row_bytes, buf, (size_t)(c * row_bytes), &got, err)) != XKNN_SUCCESS)
                goto done;
            if ((int64_t)got < c * row_bytes) {
                st = xknn__io_short(path, i + (int64_t)got / row_bytes, err);
                goto done;
            }
            for (r = 0; r < c; r++) {
                const unsigned char *row = buf + r * row_bytes;
                int32_t rk = xknn__io_i32(xknn__io_u32(row, 0));
                if (rk != kk) {
                    st = xknn__fail(err, XKNN_ERROR_FORMAT, "%s: row %lld has k=%ld, row 0 has k=%lld", path,
                                    (long long)(i + r), (long)rk, (long long)kk);
                    goto done;
                }
                for (j = 0; j < kk; j++) out_ids[(i + r) * kk + j] = xknn__io_i32(xknn__io_u32(row + 4 + 4 * j, 0));
            }
        }
    } else {
        int part;
        for (part = 0; part < 2; part++) { /* 0: ids, 1: distances */
            const int64_t esz = part ? 4 : idsz, base = part ? 8 + nk * idsz : 8, per = (int64_t)buf_bytes / esz;
            if (part && !out_dist) break;
            for (i = 0; i < nk; i += per) {
                const int64_t c = nk - i < per ? nk - i : per;
                if ((st = xknn__src_pread(&src, base + i * esz, buf, (size_t)(c * esz), &got, err)) != XKNN_SUCCESS)
                    goto done;
                if ((int64_t)got < c * esz) {
                    st = xknn__io_short(path, (i + (int64_t)got / esz) / kk, err);
                    goto done;
                }
                for (j = 0; j < c; j++) {
                    if (part) {
                        uint32_t b = xknn__io_u32(buf + 4 * j, 0);
                        memcpy(out_dist + i + j, &b, 4);
                    } else if (idsz == 8) {
                        out_ids[i + j] = (int64_t)xknn__io_u64(buf + 8 * j, 0);
                    } else {
                        out_ids[i + j] = xknn__io_i32(xknn__io_u32(buf + 4 * j, 0));
                    }
                }
            }
        }
    }
    *nq = n;
    *k = kk;
    *ids = out_ids;
    if (dist) *dist = out_dist;
    out_ids = NULL;
    out_dist = NULL;
    st = xknn__io_ok(err);
done:
    free(buf);
    free(out_dist);
    free(out_ids);
    xknn__src_close(&src);
    return st;
}

#endif /* XKNN_IMPL_IO_RESULTS_H */
