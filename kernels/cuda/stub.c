/* CUDA backend entry points when xknn is built without CUDA (-Dcuda=disabled or no
 * nvcc found): every call reports "not built". */
#include "xknn/impl/backend.h"

int xknn__cuda_built(void) { return 0; }

int xknn__cuda_device_count(void) { return 0; }

xknn_status xknn__cuda_search(const xknn__job *job)
{
    (void)job;
    return XKNN_ERROR_NOT_BUILT;
}
