/* SPDX-License-Identifier: MIT */
/*
 * mpi/resident.c -- a rank's reference slice kept in GPU memory for a whole distributed
 * search. Without it every query block went through xknn_search on host arrays, which
 * copies the whole slice to the device again for each block (the slice is the large
 * operand: 10M x 128 floats are 5 GB). Here the slice is uploaded once; each block then
 * costs one small query copy, a device search and the copy of its k candidates back to
 * host memory, where the tree reduction takes them. Results are those of xknn_search
 * (same engine, same contract).
 *
 * The library owns the device side (xknn__cuda_resident_*, kernels/cuda/resident.cu):
 * its memory, stream, staging, device scope and the rule of when the path applies
 * (backend cuda, or auto with a device; l2/euclidean on float32; the slice plus a
 * workspace within the device memory budget). Otherwise, and in a build without CUDA,
 * xknn__resident_open returns NULL with the reason, and the caller keeps the per-block
 * host path (which streams references that do not fit).
 */
#include <stdio.h>
#include <stdlib.h>

#include "impl.h"
#include "xknn/impl/cuda_internal.h"

struct xknn__resident {
    xknn__cuda_resident *dev;
};

void xknn__resident_close(xknn__resident *r)
{
    if (!r) return;
    xknn__cuda_resident_close(r->dev);
    free(r);
}

int xknn__resident_reserve(xknn__resident *r, const xknn_params *params, int64_t qb, int64_t k, char *why,
                           size_t why_size)
{
    return xknn__cuda_resident_reserve(r->dev, params, qb, k, why, why_size);
}

xknn_status xknn__resident_update(xknn__resident *r, int64_t row0, const xknn_matrix *rows, xknn_error *err)
{
    return xknn__cuda_resident_update(r->dev, row0, rows, err);
}

xknn__resident *xknn__resident_open(const xknn_params *params, int device, const xknn_matrix *ref, int64_t qb,
                                    int64_t k, char *why, size_t why_size)
{
    xknn__resident *r = (xknn__resident *)calloc(1, sizeof *r);
    if (!r) {
        snprintf(why, why_size, "out of host memory");
        return NULL;
    }
    r->dev = xknn__cuda_resident_open(params, device, ref, qb, k, why, why_size);
    if (!r->dev) {
        free(r);
        return NULL;
    }
    return r;
}

xknn_status xknn__resident_start(xknn__resident *r, const xknn_params *params, const float *q, int64_t rows,
                                 xknn_error *err)
{
    return xknn__cuda_resident_start(r->dev, params, q, rows, err);
}

xknn_status xknn__resident_finish(xknn__resident *r, int64_t *ids, float *dist, void (*poll)(void *), void *poll_arg,
                                  xknn_error *err)
{
    return xknn__cuda_resident_finish(r->dev, ids, dist, poll, poll_arg, err);
}
