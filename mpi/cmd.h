/*
 * mpi/cmd.h -- what the commands (knn_mpi, its prediction writer, knn_prune) share: the
 * documented exit statuses, the mapping from a status to them, and printf-style error
 * messages into an xknn_error. Private to mpi/; not installed.
 */
#ifndef XKNN_MPI_CMD_H
#define XKNN_MPI_CMD_H

#include <stdarg.h>
#include <stdio.h>

#include "xknn.h"

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

/* Fills *err (status and message); returns st. */
static inline xknn_status knn__fail(xknn_error *err, xknn_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static inline xknn_status knn__fail(xknn_error *err, xknn_status st, const char *fmt, ...)
{
    va_list ap;
    err->status = st;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return st;
}

#endif /* XKNN_MPI_CMD_H */
