/* SPDX-License-Identifier: MIT */
/*
 * tools/cmd.h -- what the commands (knn_mpi, its prediction writer, knn_prune) share: the
 * documented exit statuses, the mapping from a status to them, printf-style error
 * messages into an xknn_error (MPI failures included), and small parsers. Private to tools/; not installed.
 */
#ifndef XKNN_MPI_CMD_H
#define XKNN_MPI_CMD_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xknn.h"
#include "xknn/impl/backend.h" /* xknn__fail */
#ifdef XKNN_HAVE_MPI
#include <mpi.h>

#include "xknn_mpi.h"
#endif

enum { EXIT_OK = 0, EXIT_USAGE = 1, EXIT_INPUT = 2, EXIT_RESOURCE = 3, EXIT_INTERNAL = 4 };

/* Exit status of a failed call: input errors 2, resources 3, anything else 4. */
static inline int knn__exit_code(xknn_status st)
{
    switch (st) {
    case XKNN_SUCCESS: return EXIT_OK;
    case XKNN_ERROR_INVALID_ARGUMENT:
    case XKNN_ERROR_INVALID_VALUE:
    case XKNN_ERROR_IO:
    case XKNN_ERROR_FORMAT: return EXIT_INPUT;
    case XKNN_ERROR_OUT_OF_MEMORY:
    case XKNN_ERROR_NOT_BUILT:
    case XKNN_ERROR_NO_DEVICE:
    case XKNN_ERROR_DEVICE: return EXIT_RESOURCE;
    default: return EXIT_INTERNAL;
    }
}

/* Fills *err (status and printf-style message); returns st: the library's xknn__fail
 * (xknn/impl/backend.h) under the commands' name. */
#define knn__fail xknn__fail

/* Prefixes the message with "rank R: " (rank-local failures in a multi-rank run). */
static inline void knn__prefix_rank(xknn_error *err, int rank, int size)
{
    char m[sizeof err->message];
    if (size <= 1) return;
    snprintf(m, sizeof m, "%s", err->message);
    snprintf(err->message, sizeof err->message, "rank %d: %.480s", rank, m);
}

/* Parses a whole decimal integer in [lo, hi]; 0 on success. */
static inline int knn__parse_int(const char *s, int64_t lo, int64_t hi, int64_t *v)
{
    char *end;
    long long x;
    if (!s || !*s) return -1;
    errno = 0;
    x = strtoll(s, &end, 10);
    if (errno || *end || x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

/* 1 if s ends with suffix. */
static inline int knn__ends(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* Parses a backend by its xknn_backend_name ("auto", "cpu", "cuda"); 0 on success. */
static inline int knn__parse_backend(const char *s, xknn_backend *out)
{
    int b;
    for (b = 0; b < (int)XKNN_BACKEND_COUNT; b++)
        if (!strcmp(s, xknn_backend_name((xknn_backend)b))) {
            *out = (xknn_backend)b;
            return 0;
        }
    return -1;
}

/* Index of s among names[0 .. count-1]; count when it is none of them. */
static inline int knn__index_of(const char *s, const char *const *names, int count)
{
    int i;
    for (i = 0; i < count && strcmp(s, names[i]); i++) continue;
    return i;
}

/* Collective: every rank of ctx gets the same status and message (the lowest failing
 * rank's); without MPI the one process's st, and ctx (a field MPI builds alone have) is
 * not compiled. */
#ifdef XKNN_HAVE_MPI
#define knn__agree_ctx(ctx, st, err) xknn_mpi_agree((ctx), (st), (err))
#else
#define knn__agree_ctx(ctx, st, err) knn__agree_alone((st), (err))
static inline xknn_status knn__agree_alone(xknn_status st, xknn_error *err)
{
    (void)err;
    return st;
}
#endif

#ifdef XKNN_HAVE_MPI
/* A failed MPI call on rank `rank`: XKNN_ERROR_MPI with MPI_Error_string's text. */
static inline xknn_status knn__mpi_fail(xknn_error *err, int rank, int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "MPI error %d", rc);
    return knn__fail(err, XKNN_ERROR_MPI, "rank %d: %s failed: %s", rank, what, text);
}
#endif

#endif /* XKNN_MPI_CMD_H */
