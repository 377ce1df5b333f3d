/* SPDX-License-Identifier: MIT */
/* The resident reference rows of include/xknn/impl/cuda_internal.h
 * (xknn__cuda_resident_*, kernels/cuda/resident.cu) when xknn is built without CUDA, as
 * stub.c answers for the other CUDA entry points: nothing opens, so the distributed
 * layer links against either build and searches on host arrays. */
#include <stdio.h>

#include "xknn/impl/cuda_internal.h"

/* A stub reads none of its parameters. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif

static const char kNotBuilt[] = "backend cuda: this xknn was built without CUDA (reconfigure with -Dcuda=enabled)";

xknn__cuda_resident *xknn__cuda_resident_open(const xknn_params *params, int device, const xknn_matrix *ref,
                                              int64_t qb, int64_t k, char *why, size_t why_size)
{
    if (why && why_size) snprintf(why, why_size, "%s", kNotBuilt);
    return NULL;
}

int xknn__cuda_resident_reserve(xknn__cuda_resident *r, const xknn_params *params, int64_t qb, int64_t k, char *why,
                                size_t why_size)
{
    if (why && why_size) snprintf(why, why_size, "%s", kNotBuilt);
    return -1;
}

static xknn_status xknn__resident_not_built(xknn_error *err)
{
    if (err) {
        err->status = XKNN_ERROR_NOT_BUILT;
        snprintf(err->message, sizeof err->message, "%s", kNotBuilt);
    }
    return XKNN_ERROR_NOT_BUILT;
}

xknn_status xknn__cuda_resident_update(xknn__cuda_resident *r, int64_t row0, const xknn_matrix *rows, xknn_error *err)
{
    return xknn__resident_not_built(err);
}

xknn_status xknn__cuda_resident_search(xknn__cuda_resident *r, const xknn_params *params, const float *q,
                                       int64_t rows, int64_t *ids, float *dist, void (*poll)(void *), void *poll_arg,
                                       xknn_error *err)
{
    return xknn__resident_not_built(err);
}

void xknn__cuda_resident_close(xknn__cuda_resident *r) {}
