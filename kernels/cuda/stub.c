/* CUDA backend entry points when xknn is built without CUDA (-Dcuda=disabled or no
 * nvcc found): every call reports "not built", including the embedding API of
 * include/xknn/cuda.h, so programs using it link against either build. */
#include <stdio.h>

#include "xknn/cuda.h"
#include "xknn/impl/backend.h"
#include "xknn/impl/softknn_kernels.h"

int xknn__cuda_built(void) { return 0; }

int xknn__cuda_device_count(void) { return 0; }

xknn_status xknn__cuda_search(const xknn__job *job)
{
    (void)job;
    return XKNN_ERROR_NOT_BUILT;
}

xknn_status xknn__cuda_pair(const xknn__job *job, const xknn__sym_side *a, const xknn__sym_side *b)
{
    (void)job;
    (void)a;
    (void)b;
    return XKNN_ERROR_NOT_BUILT;
}

static xknn_status xknn__cuda_not_built(xknn_error *err)
{
    if (err) {
        err->status = XKNN_ERROR_NOT_BUILT;
        snprintf(err->message, sizeof err->message,
                 "backend cuda: this xknn was built without CUDA (reconfigure with -Dcuda=enabled)");
    }
    return XKNN_ERROR_NOT_BUILT;
}

xknn_status xknn_cuda_context_create(int device, xknn_cuda_context **ctx, xknn_error *err)
{
    (void)device;
    if (ctx) *ctx = NULL;
    return xknn__cuda_not_built(err);
}

void xknn_cuda_context_destroy(xknn_cuda_context *ctx) { (void)ctx; }

int xknn_cuda_context_device(const xknn_cuda_context *ctx)
{
    (void)ctx;
    return -1;
}

xknn_status xknn_cuda_keep_rows(xknn_cuda_context *ctx, const xknn_matrix *rows, int upload_now, xknn_error *err)
{
    (void)ctx;
    (void)rows;
    (void)upload_now;
    return xknn__cuda_not_built(err);
}

void xknn_cuda_forget_rows(xknn_cuda_context *ctx, const void *data)
{
    (void)ctx;
    (void)data;
}

xknn_status xknn_cuda_keep_lists(xknn_cuda_context *ctx, xknn_metric metric, int64_t *ids, float *dist, int64_t rows,
                                 int64_t k, int init, const float *bounds, xknn_error *err)
{
    (void)ctx;
    (void)metric;
    (void)ids;
    (void)dist;
    (void)rows;
    (void)k;
    (void)init;
    (void)bounds;
    return xknn__cuda_not_built(err);
}

xknn_status xknn_cuda_fetch_lists(xknn_cuda_context *ctx, int64_t *ids, int download, xknn_error *err)
{
    (void)ctx;
    (void)ids;
    (void)download;
    return xknn__cuda_not_built(err);
}

xknn_status xknn_cuda_copy_lists(xknn_cuda_context *ctx, const int64_t *ids, int64_t row0, int64_t rows,
                                 xknn_error *err)
{
    (void)ctx;
    (void)ids;
    (void)row0;
    (void)rows;
    return xknn__cuda_not_built(err);
}

xknn_status xknn_cuda_copy_lists_start(xknn_cuda_context *ctx, const int64_t *ids, int64_t row0, int64_t rows,
                                       int64_t *ticket, xknn_error *err)
{
    (void)ctx;
    (void)ids;
    (void)row0;
    (void)rows;
    if (ticket) *ticket = 0;
    return xknn__cuda_not_built(err);
}

xknn_status xknn_cuda_copy_lists_test(xknn_cuda_context *ctx, int64_t ticket, int wait, int *done, xknn_error *err)
{
    (void)ctx;
    (void)ticket;
    (void)wait;
    if (done) *done = 0;
    return xknn__cuda_not_built(err);
}

xknn_status xknn_cuda_host_register(xknn_cuda_context *ctx, void *p, size_t bytes, xknn_error *err)
{
    (void)ctx;
    (void)p;
    (void)bytes;
    return xknn__cuda_not_built(err);
}

void xknn_cuda_host_unregister(xknn_cuda_context *ctx, void *p)
{
    (void)ctx;
    (void)p;
}

xknn_status xknn_cuda_lists_kth(xknn_cuda_context *ctx, const int64_t *ids, float *kth, xknn_error *err)
{
    (void)ctx;
    (void)ids;
    (void)kth;
    return xknn__cuda_not_built(err);
}

int xknn_cuda_path_for(const xknn_params *params, int64_t n, int64_t nq, int64_t d, int64_t k)
{
    (void)params;
    (void)n;
    (void)nq;
    (void)d;
    (void)k;
    return XKNN_CUDA_PATH_AUTO;
}

xknn_status xknn_cuda_workspace_size(xknn_cuda_context *ctx, const xknn_params *params, int64_t n, int64_t nq,
                                     int64_t d, int64_t k, size_t *bytes, xknn_error *err)
{
    (void)ctx;
    (void)params;
    (void)n;
    (void)nq;
    (void)d;
    (void)k;
    if (bytes) *bytes = 0;
    return xknn__cuda_not_built(err);
}

xknn_status xknn_cuda_search(xknn_cuda_context *ctx, const xknn_params *params, const xknn_matrix *ref,
                             const xknn_matrix *query, int64_t k, int64_t *ids, float *dist, void *workspace,
                             size_t workspace_bytes, xknn_error *err, struct CUstream_st *stream)
{
    (void)ctx;
    (void)params;
    (void)ref;
    (void)query;
    (void)k;
    (void)ids;
    (void)dist;
    (void)workspace;
    (void)workspace_bytes;
    (void)stream;
    return xknn__cuda_not_built(err);
}

/* Soft-kNN CUDA passes (include/xknn/softknn.h; the host code calls them for backend
 * cuda only). */
xknn_status xknn__softknn_cuda_create(int device, const uint64_t *x, const float *y, int64_t n, int64_t d,
                                      int64_t ld, xknn__sk_cuda **out, char *msg, size_t msg_size)
{
    (void)device, (void)x, (void)y, (void)n, (void)d, (void)ld;
    if (out) *out = NULL;
    if (msg && msg_size) snprintf(msg, msg_size, "backend cuda: this xknn was built without CUDA (reconfigure with -Dcuda=enabled)");
    return XKNN_ERROR_NOT_BUILT;
}

void xknn__softknn_cuda_destroy(xknn__sk_cuda *s) { (void)s; }

xknn_status xknn__softknn_cuda_eval(xknn__sk_cuda *s, const xknn__sk_job *job)
{
    (void)s;
    if (job && job->msg && job->msg_size)
        snprintf(job->msg, job->msg_size, "backend cuda: this xknn was built without CUDA");
    return XKNN_ERROR_NOT_BUILT;
}
