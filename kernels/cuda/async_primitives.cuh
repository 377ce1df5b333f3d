/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/async_primitives.cuh -- the asynchronous-copy and matrix-descriptor layer
 * shared by the tensor-core kernels (mma.cu, imma.cu): cp.async into shared memory
 * (16-byte .cg and 4-byte .ca, zero-filling beyond `bytes`), commit/wait groups, and the
 * wgmma shared-memory matrix descriptor (no swizzle).
 */
#ifndef XKNN_CUDA_ASYNC_PRIMITIVES_CUH
#define XKNN_CUDA_ASYNC_PRIMITIVES_CUH

#include <stdint.h>

namespace xknn_cuda {

__device__ __forceinline__ unsigned smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(void *dst, const void *src, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src, int bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* mbarrier (shared-memory transaction barrier, sm_80+): init by one thread before a CTA
 * barrier; arrive; arrive when all the calling thread's earlier cp.async have landed
 * (noinc: the init count includes these arrivals); wait for the phase of the given parity
 * to complete. */
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t *bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
{
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "XKNN_MBAR_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra XKNN_MBAR_WAIT;\n"
                 "}\n" ::"r"(smem_addr(bar)),
                 "r"(parity)
                 : "memory");
}

/* Named CTA barriers over `count` threads (ids 1..15; 0 is __syncthreads): sync waits,
 * arrive only signals. */
__device__ __forceinline__ void named_sync(unsigned id, unsigned count)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(unsigned id, unsigned count)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

/* wgmma needs sm_90a code (the architecture-specific feature set). */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define XKNN__HAVE_WGMMA 1
#endif

/* Shared-memory matrix descriptor: start address, leading and stride byte offsets, base
 * offset 0, no swizzle. The K-major canonical layout of core matrices of 8 rows x 16
 * bytes: lbo = distance of core matrices adjacent in k, sbo = of those 8 rows apart. */
__device__ __forceinline__ uint64_t gmma_desc(const void *smem, unsigned lbo, unsigned sbo)
{
    const uint64_t a = smem_addr(smem);
    return ((a & 0x3FFFFu) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFFu) << 16) | ((uint64_t)((sbo >> 4) & 0x3FFFu) << 32);
}

/* The same for the 128-byte-swizzled K-major layout (layout type 1): rows of 128 bytes,
 * 8-row groups 1024 bytes apart (stride byte offset), the 16-byte piece c of row r stored
 * at piece c ^ (r % 8) of a 1024-aligned group; the leading byte offset is unused (1). A
 * k-step inside the 128 bytes moves the start address. */
__device__ __forceinline__ uint64_t gmma_desc_sw128(const void *smem)
{
    const uint64_t a = smem_addr(smem);
    return ((a & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

} // namespace xknn_cuda

#endif
