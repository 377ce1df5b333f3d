/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/checks.cuh -- the checked calls of the CUDA backend's host code: an error
 * sink (Err) that writes the caller's xknn_error message, and the CUDA / cuBLAS macros
 * that map a failed call to an xknn_status, say which call failed and why, and jump to
 * the enclosing function's cleanup. The one definition of each; every host file uses it.
 */
#ifndef XKNN_CUDA_CHECKS_CUH
#define XKNN_CUDA_CHECKS_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>

#include "xknn.h"

namespace xknn_cuda {

/* Where a message goes: the caller's xknn_error buffer, or nowhere (msg NULL). */
struct Err {
    char *msg;
    size_t size;
};

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
inline xknn_status failf(Err er, xknn_status st, const char *fmt, ...)
{
    if (er.msg && er.size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(er.msg, er.size, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* The sink of err (NULL: none), its status and message cleared. */
inline Err err_of(xknn_error *err)
{
    Err e;
    e.msg = err ? err->message : NULL;
    e.size = err ? sizeof err->message : 0;
    if (err) {
        err->status = XKNN_SUCCESS;
        err->message[0] = '\0';
    }
    return e;
}

inline xknn_status finish_err(xknn_error *err, xknn_status st)
{
    if (err) err->status = st;
    return st;
}

} // namespace xknn_cuda

/* Checked calls: map to a status, say which call failed and why, jump to cleanup. They
 * need `xknn_status st`, `Err er` and a `cleanup:` label in the enclosing function. */
#define XKNN__CUDA_CHECK(call)                                                                                  \
    do {                                                                                                        \
        const cudaError_t e_ = (call);                                                                          \
        if (e_ != cudaSuccess) {                                                                                \
            (void)cudaGetLastError();                                                                           \
            st = failf(er, e_ == cudaErrorMemoryAllocation ? XKNN_ERROR_OUT_OF_MEMORY : XKNN_ERROR_DEVICE,      \
                       "cuda backend: %s: %s (%s, %s:%d)", cudaGetErrorName(e_), cudaGetErrorString(e_), #call, \
                       __FILE__, __LINE__);                                                                     \
            goto cleanup;                                                                                       \
        }                                                                                                       \
    } while (0)

#define XKNN__CUBLAS_CHECK(call)                                                                             \
    do {                                                                                                     \
        const cublasStatus_t s_ = (call);                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                   \
            st = failf(er, s_ == CUBLAS_STATUS_ALLOC_FAILED ? XKNN_ERROR_OUT_OF_MEMORY : XKNN_ERROR_DEVICE,  \
                       "cuda backend: cuBLAS %s (%s, %s:%d)", cublasGetStatusName(s_), #call, __FILE__,      \
                       __LINE__);                                                                            \
            goto cleanup;                                                                                    \
        }                                                                                                    \
    } while (0)

/* A call returning xknn_status: on failure st keeps it and control goes to cleanup. */
#define XKNN__TRY(expr)                                \
    do {                                               \
        st = (expr);                                   \
        if (st != XKNN_SUCCESS) goto cleanup;          \
    } while (0)

#endif
