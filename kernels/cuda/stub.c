/* SPDX-License-Identifier: MIT */
/* CUDA backend entry points when xknn is built without CUDA (-Dcuda=disabled or no
 * nvcc found): every call reports "not built", including the embedding API of
 * include/xknn/cuda.h and the internal entry points of include/xknn/impl/cuda_internal.h,
 * so programs using them link against either build. Out parameters get their "nothing"
 * values (NULL, 0) first. */
#include <stdio.h>

#include "xknn/cuda.h"
#include "xknn/impl/backend.h"
#include "xknn/impl/cuda_internal.h"
#include "xknn/impl/softknn_kernels.h"

/* A stub reads none of its parameters. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif

static const char kNotBuilt[] = "backend cuda: this xknn was built without CUDA (reconfigure with -Dcuda=enabled)";

static xknn_status xknn__cuda_not_built(xknn_error *err)
{
    if (err) {
        err->status = XKNN_ERROR_NOT_BUILT;
        snprintf(err->message, sizeof err->message, "%s", kNotBuilt);
    }
    return XKNN_ERROR_NOT_BUILT;
}

/* An entry point with an xknn_error *err: `out` (a statement, or nothing) clears its out
 * parameters, then err says why and NOT_BUILT is returned. */
#define XKNN__CUDA_STUB(name, params, out)   \
    xknn_status name params                  \
    {                                        \
        out;                                 \
        return xknn__cuda_not_built(err);    \
    }

int xknn__cuda_built(void) { return 0; }
int xknn__cuda_device_count(void) { return 0; }
xknn_status xknn__cuda_search(const xknn__job *job) { return XKNN_ERROR_NOT_BUILT; }
xknn_status xknn__cuda_pair(const xknn__job *job, const xknn__sym_side *a, const xknn__sym_side *b)
{
    return XKNN_ERROR_NOT_BUILT;
}

/* include/xknn/cuda.h */
XKNN__CUDA_STUB(xknn_cuda_context_create, (int device, xknn_cuda_context **ctx, xknn_error *err), if (ctx) *ctx = NULL)
void xknn_cuda_context_destroy(xknn_cuda_context *ctx) {}
int xknn_cuda_context_device(const xknn_cuda_context *ctx) { return -1; }
XKNN__CUDA_STUB(xknn_cuda_workspace_size,
                (xknn_cuda_context *ctx, const xknn_params *params, int64_t n, int64_t nq, int64_t d, int64_t k,
                 size_t *bytes, xknn_error *err),
                if (bytes) *bytes = 0)
XKNN__CUDA_STUB(xknn_cuda_search,
                (xknn_cuda_context *ctx, const xknn_params *params, const xknn_matrix *ref, const xknn_matrix *query,
                 int64_t k, int64_t *ids, float *dist, void *workspace, size_t workspace_bytes, xknn_error *err,
                 struct CUstream_st *stream),
                )

/* include/xknn/impl/cuda_internal.h */
XKNN__CUDA_STUB(xknn_cuda_keep_rows, (xknn_cuda_context *ctx, const xknn_matrix *rows, int upload_now, xknn_error *err), )
void xknn_cuda_forget_rows(xknn_cuda_context *ctx, const void *data) {}
XKNN__CUDA_STUB(xknn_cuda_keep_lists,
                (xknn_cuda_context *ctx, xknn_metric metric, int64_t *ids, float *dist, int64_t rows, int64_t k,
                 int init, const float *bounds, xknn_error *err),
                )
XKNN__CUDA_STUB(xknn_cuda_fetch_lists, (xknn_cuda_context *ctx, int64_t *ids, int download, xknn_error *err), )
XKNN__CUDA_STUB(xknn_cuda_copy_lists,
                (xknn_cuda_context *ctx, const int64_t *ids, int64_t row0, int64_t rows, xknn_error *err), )
XKNN__CUDA_STUB(xknn_cuda_copy_lists_start,
                (xknn_cuda_context *ctx, const int64_t *ids, int64_t row0, int64_t rows, int64_t *ticket,
                 xknn_error *err),
                if (ticket) *ticket = 0)
XKNN__CUDA_STUB(xknn_cuda_copy_lists_test,
                (xknn_cuda_context *ctx, int64_t ticket, int wait, int *done, xknn_error *err), if (done) *done = 0)
XKNN__CUDA_STUB(xknn_cuda_host_register, (xknn_cuda_context *ctx, void *p, size_t bytes, xknn_error *err), )
void xknn_cuda_host_unregister(xknn_cuda_context *ctx, void *p) {}
XKNN__CUDA_STUB(xknn_cuda_lists_kth, (xknn_cuda_context *ctx, const int64_t *ids, float *kth, xknn_error *err), )
int xknn_cuda_path_for(const xknn_params *params, int64_t n, int64_t nq, int64_t d, int64_t k)
{
    return XKNN_CUDA_PATH_AUTO;
}

/* Soft-kNN CUDA passes (include/xknn/softknn.h; the host code calls them for backend
 * cuda only). */
xknn_status xknn__softknn_cuda_create(int device, const uint64_t *x, const float *y, int64_t n, int64_t d,
                                      int64_t ld, xknn__sk_cuda **out, char *msg, size_t msg_size)
{
    if (out) *out = NULL;
    if (msg && msg_size) snprintf(msg, msg_size, "%s", kNotBuilt);
    return XKNN_ERROR_NOT_BUILT;
}

void xknn__softknn_cuda_destroy(xknn__sk_cuda *s) {}

xknn_status xknn__softknn_cuda_eval(xknn__sk_cuda *s, const xknn__sk_job *job)
{
    if (job && job->msg && job->msg_size)
        snprintf(job->msg, job->msg_size, "backend cuda: this xknn was built without CUDA");
    return XKNN_ERROR_NOT_BUILT;
}

/* Resident reference rows (xknn__cuda_resident_*, kernels/cuda/resident.cu): nothing
 * opens, so the distributed layer keeps its host path. */
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

xknn_status xknn__cuda_resident_update(xknn__cuda_resident *r, int64_t row0, const xknn_matrix *rows, xknn_error *err)
{
    return xknn__cuda_not_built(err);
}

xknn_status xknn__cuda_resident_start(xknn__cuda_resident *r, const xknn_params *params, const float *q,
                                      int64_t rows, xknn_error *err)
{
    return xknn__cuda_not_built(err);
}

xknn_status xknn__cuda_resident_finish(xknn__cuda_resident *r, int64_t *ids, float *dist, void (*poll)(void *),
                                       void *poll_arg, xknn_error *err)
{
    return xknn__cuda_not_built(err);
}

void xknn__cuda_resident_close(xknn__cuda_resident *r) {}

const float *xknn__cuda_resident_rows(const xknn__cuda_resident *r)
{
    return NULL;
}

int xknn__cuda_pointer_device(const void *p)
{
    return -1;
}

xknn_status xknn__cuda_copy_rows(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, int64_t rows,
                                 xknn_error *err)
{
    return xknn__cuda_not_built(err);
}

xknn_status xknn__cuda_first_nonfinite(const float *dev, int64_t rows, int64_t d, int64_t ld, int64_t *row,
                                       xknn_error *err)
{
    if (row) *row = -1;
    return xknn__cuda_not_built(err);
}
