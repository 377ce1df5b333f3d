/* Soft-kNN CUDA passes when xknn is built without CUDA: every entry answers "not
 * built" (the host code only calls them for backend cuda). */
#include <stdio.h>

#include "xknn/impl/softknn_kernels.h"

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
