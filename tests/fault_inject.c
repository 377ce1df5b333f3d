/* SPDX-License-Identifier: MIT */
/*
 * fault_inject.c -- an LD_PRELOAD library for the fault tests: writes to chosen files fail
 * with ENOSPC, the way they fail on a full disk; opens of chosen files fail with EMFILE,
 * the way they fail once the process has no descriptor left.
 *
 *   XKNN_TEST_ENOSPC_PATH=PATTERN LD_PRELOAD=.../libxknn_fault_inject.so knn_mpi ...
 *
 * Every write(2)-family call (write, pwrite, writev, pwritev, pwritev2 and their 64-bit
 * names) on a file descriptor whose path matches PATTERN (fnmatch(3) without flags, on
 * the path the kernel reports in /proc/self/fd/N: absolute, symbolic links resolved)
 * returns -1 with errno ENOSPC and writes nothing. With XKNN_TEST_ENOSPC_AFTER=BYTES
 * only the writes that would end past offset BYTES fail (a disk with BYTES free): the
 * first part of a file is written, the rest is refused. Every other descriptor (sockets,
 * pipes, terminals, Open MPI's shared-memory files) and every call while the variable is
 * unset or empty goes to the C library unchanged. Under mpirun, pass both variables to
 * every rank with `-x`.
 *
 * The stdio functions of glibc write through internal entry points that a preloaded
 * library cannot replace; everything in xknn writes with the calls above (knn_mpi's
 * MPI-IO goes through Open MPI's posix fbtl: pwritev / pwrite).
 *
 *   XKNN_TEST_EMFILE_PATH=PATTERN LD_PRELOAD=.../libxknn_fault_inject.so knn_mpi ...
 *
 * Every open, open64, openat, openat64 (and glibc's __open_2, __open64_2) and every
 * mkstemp, mkstemp64, mkostemp, mkostemp64 whose path matches PATTERN (fnmatch(3) without
 * flags, on the path as the caller passes it: for mkstemp the template, "XXXXXX"
 * included) returns -1 with errno EMFILE and opens nothing. Other paths, and every call
 * while the variable is unset or empty, go to the C library unchanged. The C library's
 * own opens (fopen, its mkstemp's inner open) are not seen: xknn opens with the calls
 * above.
 *
 * Under AddressSanitizer the preloaded library comes before the ASan runtime: run the
 * program with ASAN_OPTIONS=verify_asan_link_order=0.
 */
#ifdef __linux__

/* The build may define _FILE_OFFSET_BITS=64, which renames pwrite to pwrite64 in the
 * headers; this file defines both names itself. */
#undef _FILE_OFFSET_BITS
#define _GNU_SOURCE 1

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__GNUC__)
#define XKNN__FI_EXPORT __attribute__((visibility("default")))
#else
#define XKNN__FI_EXPORT
#endif

/* Bytes in an iovec array (the size of the write). */
static size_t xknn__fi_iov_bytes(const struct iovec *iov, int n)
{
    size_t t = 0;
    int i;
    for (i = 0; iov && i < n; i++) t += iov[i].iov_len;
    return t;
}

/* 1 when this write must fail: the variable is set, fd's path matches it, and the write
 * of count bytes at off (-1: the current position) ends past XKNN_TEST_ENOSPC_AFTER. */
static int xknn__fi_hit(int fd, long long off, size_t count)
{
    const char *pattern = getenv("XKNN_TEST_ENOSPC_PATH");
    const char *after = getenv("XKNN_TEST_ENOSPC_AFTER");
    char link[64], path[4096];
    long long room = 0;
    ssize_t len;
    int saved = errno;
    if (!pattern || !*pattern || fd < 0 || count == 0) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    len = readlink(link, path, sizeof path - 1);
    errno = saved;
    if (len <= 0) return 0;
    path[len] = '\0';
    if (fnmatch(pattern, path, 0) != 0) return 0;
    if (after && *after) room = strtoll(after, NULL, 10);
    if (room <= 0) return 1;
    if (off < 0) off = (long long)lseek(fd, 0, SEEK_CUR);
    errno = saved;
    return off < 0 || off + (long long)count > room;
}

/* Stores in *fn (a function pointer of fn_size bytes) the next definition of name in
 * lookup order: the C library's, or a sanitizer's interceptor. */
static void xknn__fi_next(const char *name, void *fn, size_t fn_size)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (!f) abort(); /* nothing to forward to: a broken test setup, stop loudly */
    memcpy(fn, &f, fn_size); /* ISO C has no cast from object to function pointer */
}

#define XKNN__FI_FAIL()    \
    do {                   \
        errno = ENOSPC;    \
        return -1;         \
    } while (0)

typedef ssize_t (*xknn__fi_write_fn)(int, const void *, size_t);
typedef ssize_t (*xknn__fi_pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*xknn__fi_writev_fn)(int, const struct iovec *, int);
typedef ssize_t (*xknn__fi_pwritev_fn)(int, const struct iovec *, int, off_t);
typedef ssize_t (*xknn__fi_pwritev2_fn)(int, const struct iovec *, int, off_t, int);

XKNN__FI_EXPORT ssize_t write(int fd, const void *buf, size_t count)
{
    xknn__fi_write_fn next;
    if (xknn__fi_hit(fd, -1, count)) XKNN__FI_FAIL();
    xknn__fi_next("write", &next, sizeof next);
    return next(fd, buf, count);
}

XKNN__FI_EXPORT ssize_t pwrite(int fd, const void *buf, size_t count, off_t off)
{
    xknn__fi_pwrite_fn next;
    if (xknn__fi_hit(fd, (long long)off, count)) XKNN__FI_FAIL();
    xknn__fi_next("pwrite", &next, sizeof next);
    return next(fd, buf, count, off);
}

XKNN__FI_EXPORT ssize_t pwrite64(int fd, const void *buf, size_t count, off64_t off)
{
    xknn__fi_pwrite_fn next;
    if (xknn__fi_hit(fd, (long long)off, count)) XKNN__FI_FAIL();
    xknn__fi_next("pwrite64", &next, sizeof next);
    return next(fd, buf, count, (off_t)off);
}

XKNN__FI_EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
    xknn__fi_writev_fn next;
    if (xknn__fi_hit(fd, -1, xknn__fi_iov_bytes(iov, n))) XKNN__FI_FAIL();
    xknn__fi_next("writev", &next, sizeof next);
    return next(fd, iov, n);
}

XKNN__FI_EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int n, off_t off)
{
    xknn__fi_pwritev_fn next;
    if (xknn__fi_hit(fd, (long long)off, xknn__fi_iov_bytes(iov, n))) XKNN__FI_FAIL();
    xknn__fi_next("pwritev", &next, sizeof next);
    return next(fd, iov, n, off);
}

XKNN__FI_EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int n, off64_t off)
{
    xknn__fi_pwritev_fn next;
    if (xknn__fi_hit(fd, (long long)off, xknn__fi_iov_bytes(iov, n))) XKNN__FI_FAIL();
    xknn__fi_next("pwritev64", &next, sizeof next);
    return next(fd, iov, n, (off_t)off);
}

XKNN__FI_EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int n, off_t off, int flags)
{
    xknn__fi_pwritev2_fn next;
    if (xknn__fi_hit(fd, (long long)off, xknn__fi_iov_bytes(iov, n))) XKNN__FI_FAIL();
    xknn__fi_next("pwritev2", &next, sizeof next);
    return next(fd, iov, n, off, flags);
}

XKNN__FI_EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int n, off64_t off, int flags)
{
    xknn__fi_pwritev2_fn next;
    if (xknn__fi_hit(fd, (long long)off, xknn__fi_iov_bytes(iov, n))) XKNN__FI_FAIL();
    xknn__fi_next("pwritev64v2", &next, sizeof next);
    return next(fd, iov, n, (off_t)off, flags);
}

/* ---- descriptor exhaustion ------------------------------------------------------------ */
/* 1 when opening path must fail with EMFILE: XKNN_TEST_EMFILE_PATH is set and matches. */
static int xknn__fi_emfile(const char *path)
{
    const char *pattern = getenv("XKNN_TEST_EMFILE_PATH");
    return pattern && *pattern && path && fnmatch(pattern, path, 0) == 0;
}

#define XKNN__FI_NO_FD()   \
    do {                   \
        errno = EMFILE;    \
        return -1;         \
    } while (0)

/* The mode argument exists only with O_CREAT or O_TMPFILE; reading it otherwise is
 * undefined, so it is fetched only then. */
#ifdef O_TMPFILE
#define XKNN__FI_NEEDS_MODE(flags) (((flags) & O_CREAT) || ((flags) & O_TMPFILE) == O_TMPFILE)
#else
#define XKNN__FI_NEEDS_MODE(flags) ((flags) & O_CREAT)
#endif
#define XKNN__FI_MODE(flags, mode)             \
    do {                                       \
        if (XKNN__FI_NEEDS_MODE(flags)) {      \
            va_list ap;                        \
            va_start(ap, flags);               \
            mode = (mode_t)va_arg(ap, int);    \
            va_end(ap);                        \
        }                                      \
    } while (0)

typedef int (*xknn__fi_open_fn)(const char *, int, ...);
typedef int (*xknn__fi_openat_fn)(int, const char *, int, ...);
typedef int (*xknn__fi_open2_fn)(const char *, int);
typedef int (*xknn__fi_mkstemp_fn)(char *);
typedef int (*xknn__fi_mkostemp_fn)(char *, int);

/* The interposers, each under the name given (parameters params, of which key is the
 * path or template): EMFILE where key matches XKNN_TEST_EMFILE_PATH, else the next
 * definition of that name (a function of type fn) on args. Those with a variadic mode
 * (open, openat and their 64-bit twins) read it only where the flags need one. */
#define XKNN__FI_WITH_MODE(name, fn, params, args)   \
    XKNN__FI_EXPORT int name params                  \
    {                                                \
        fn next;                                     \
        mode_t mode = 0;                             \
        XKNN__FI_MODE(flags, mode);                  \
        if (xknn__fi_emfile(path)) XKNN__FI_NO_FD(); \
        xknn__fi_next(#name, &next, sizeof next);    \
        return next args;                            \
    }
#define XKNN__FI_NO_MODE(name, fn, key, params, args) \
    XKNN__FI_EXPORT int name params                   \
    {                                                 \
        fn next;                                      \
        if (xknn__fi_emfile(key)) XKNN__FI_NO_FD();   \
        xknn__fi_next(#name, &next, sizeof next);     \
        return next args;                             \
    }

XKNN__FI_WITH_MODE(open, xknn__fi_open_fn, (const char *path, int flags, ...), (path, flags, mode))
XKNN__FI_WITH_MODE(open64, xknn__fi_open_fn, (const char *path, int flags, ...), (path, flags, mode))
XKNN__FI_WITH_MODE(openat, xknn__fi_openat_fn, (int dirfd, const char *path, int flags, ...), (dirfd, path, flags, mode))
XKNN__FI_WITH_MODE(openat64, xknn__fi_openat_fn, (int dirfd, const char *path, int flags, ...),
                   (dirfd, path, flags, mode))
/* what open() becomes under _FORTIFY_SOURCE when no mode is passed */
XKNN__FI_NO_MODE(__open_2, xknn__fi_open2_fn, path, (const char *path, int flags), (path, flags))
XKNN__FI_NO_MODE(__open64_2, xknn__fi_open2_fn, path, (const char *path, int flags), (path, flags))
XKNN__FI_NO_MODE(mkstemp, xknn__fi_mkstemp_fn, tmpl, (char *tmpl), (tmpl))
XKNN__FI_NO_MODE(mkstemp64, xknn__fi_mkstemp_fn, tmpl, (char *tmpl), (tmpl))
XKNN__FI_NO_MODE(mkostemp, xknn__fi_mkostemp_fn, tmpl, (char *tmpl, int flags), (tmpl, flags))
XKNN__FI_NO_MODE(mkostemp64, xknn__fi_mkostemp_fn, tmpl, (char *tmpl, int flags), (tmpl, flags))

#else
/* Not Linux: nothing to inject (the tests that need this library skip). */
typedef int xknn__fault_inject_unused;
#endif
