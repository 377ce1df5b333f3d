/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/mma_hopper.cuh -- what the two Hopper kernel families share (mma_wgmma.cu,
 * mma_wgmma_ws.cu): the wgmma instruction and its operand layouts, the epilogues of its
 * accumulator fragment, the reference chunk loads, and the warp-specialized kernel's
 * shared memory layout (which the host sizes too).
 */
#ifndef XKNN_CUDA_MMA_HOPPER_CUH
#define XKNN_CUDA_MMA_HOPPER_CUH

#include "mma_common.cuh"

namespace xknn_cuda {

namespace {

/* ---- Hopper: the same passes on wgmma (sm_90a) ----------------------------------------
 * Same bounds, same epilogue contract, same grid; what changes is the matrix unit. Two
 * warpgroups per CTA, each owning 128 resident queries as two m64 blocks, issue
 * wgmma.mma_async m64n128k8 (tf32 in, fp32 accumulators) with BOTH operands read from
 * shared memory through matrix descriptors, so no fragment passes through registers.
 * Operands are stored in the no-swizzle K-major canonical layout: 8 rows x 16 bytes
 * (4 tf32 along k) per 128-byte core matrix; core matrices adjacent in k are 128 bytes
 * apart (leading byte offset), those adjacent in rows (8 rows on) are kp * 128 bytes
 * apart (stride byte offset), kp = k-groups of 4 per row of the stored block. The
 * accumulator fragment of a warp (rows 16w .. 16w+15 of an m64 block) has the mma.sync
 * m16n8 layout repeated over the 16 n8 blocks. Reference chunks of KB dimensions
 * (wgmma_chunk_of: 64 where the padded depth allows, 32 otherwise and in mode 2) arrive
 * by cp.async (generic proxy): every thread fences them (fence.proxy.async) before the
 * barrier that precedes the wgmma reading them; each chunk's wgmma are drained before
 * the next barrier, so 64-dimension chunks halve the drains and barriers per tile.
 * Witness groups are the two 64-column
 * halves of a tile. Launch: 256 threads, 1 CTA per SM (227 KB of shared memory at
 * d = 128 with KB = 64, the whole opt-in; 179 KB with KB = 32). */
#ifdef XKNN__HAVE_WGMMA

/* The Hopper kernels' accumulator fragment, per thread: four rows i = 2 mb + hh at
 * 128 wg + 64 mb + 16 wi + g + 8 hh and 32 columns nb * 8 + 2 t + c; wg_acc is the
 * accumulator of row i, column (nb, c). */
__device__ __forceinline__ float wg_acc(const float (&acc)[2][64], int i, int nb, int c)
{
    return acc[i >> 1][4 * nb + 2 * (i & 1) + c];
}

/* A read-only load the compiler neither merges with an earlier load of the same address
 * nor hoists (sym_epilogue_wg's slow parts reload column terms rather than keep the first
 * loop's 64 registers of them live) */
__device__ __forceinline__ float ldg_again(const float *a)
{
    float v;
    asm volatile("ld.global.nc.f32 %0, [%1];\n" : "=f"(v) : "l"(a));
    return v;
}

/* A reference tile's column terms as the Hopper epilogues read them, per thread: modes 0
 * and 1 c_j of columns nb * 8 + 2 t + c (v[2 nb + c]); mode 2 (c_j, c'_x) of both columns
 * (v[4 nb + 2 c], v[4 nb + 2 c + 1]). wgmma_ws_kernel loads them before it waits for the
 * tile's last wgmma, so that their latency hides behind the tensor work. In the SASS,
 * ptxas keeps modes 0 and 1's 32 loads before the wait but puts mode 2's 64 after it
 * (register pressure). */
template <int MODE>
struct WgTerms {
    float v[MODE == 2 ? 64 : 32];
};

template <int MODE>
__device__ __forceinline__ void wg_load_terms(WgTerms<MODE> &T, const MmaParams &p, int64_t tile, int t)
{
    const int64_t ref0 = tile * kBN;
#pragma unroll
    for (int nb = 0; nb < 16; ++nb) {
        if constexpr (MODE == 2) {
            const float4 w = __ldg(reinterpret_cast<const float4 *>(reinterpret_cast<const float2 *>(p.ct) + ref0 +
                                                                   2 * t + nb * 8));
            T.v[4 * nb] = w.x;
            T.v[4 * nb + 1] = w.y;
            T.v[4 * nb + 2] = w.z;
            T.v[4 * nb + 3] = w.w;
        } else {
            const float2 c2 = __ldg(reinterpret_cast<const float2 *>(p.ct + ref0 + nb * 8 + 2 * t));
            T.v[2 * nb] = c2.x;
            T.v[2 * nb + 1] = c2.y;
        }
    }
}

/* A read of shared memory the compiler neither merges with an earlier one nor hoists
 * (ldg_again's counterpart) */
__device__ __forceinline__ float lds_again(const float *a)
{
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(smem_addr(a)));
    return v;
}

/* Where sym_epilogue_wg reads the tile's column terms (c_j, c'_x): quad(nb) those of the
 * thread's columns nb * 8 + 2 t + c, c = 0, 1; again(nb, c) the c_j of one, read again.
 * SymTermsReg: registers loaded by wg_load_terms (again from global memory); SymTermsSmem:
 * the warp's copy of the tile's terms in shared memory (wgmma_ws_kernel). */
struct SymTermsReg {
    const WgTerms<2> &T;
    const float2 *g; /* global, offset to the thread's first column */
    __device__ __forceinline__ float4 quad(int nb) const
    {
        return make_float4(T.v[4 * nb], T.v[4 * nb + 1], T.v[4 * nb + 2], T.v[4 * nb + 3]);
    }
    __device__ __forceinline__ float again(int nb, int c) const { return ldg_again(&g[nb * 8 + c].x); }
};
struct SymTermsSmem {
    const float2 *s; /* shared, offset to the thread's first column */
    template <bool VOL>
    __device__ __forceinline__ float4 load4(int nb) const
    {
        float4 v;
        if constexpr (VOL)
            asm volatile("ld.volatile.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                         : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                         : "r"(smem_addr(s + nb * 8)));
        else
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                         : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                         : "r"(smem_addr(s + nb * 8)));
        return v;
    }
    __device__ __forceinline__ float4 quad(int nb) const { return load4<false>(nb); }
    __device__ __forceinline__ float again(int nb, int c) const { return lds_again(&s[nb * 8 + c].x); }
    /* quad(nb) read again: a volatile load, so that ptxas does not keep the first read's
     * registers live across the main loop instead */
    __device__ __forceinline__ float4 quad_again(int nb) const { return load4<true>(nb); }
};

/* Mode 2 epilogue of the Hopper kernels (fragment: rows rbase + 64 mb + 8 hh, i = 2 mb + hh,
 * columns nb * 8 + 2 t + c, accumulator acc[mb][4 nb + 2 hh + c]): sym_epilogue's masks,
 * each behind a quick test. The row side takes the row maximum of fadd_ru(acc, -c_j) as
 * mode 1 does; the column side the maximum over the thread's four rows of
 * fadd_ru(acc, -p_i) against the column's c'_x. Only a row or column whose maximum passes
 * (max.NaN keeps NaN: a candidate) has its mask bits computed, as sym_epilogue computes
 * them; every other bit is 0 there too, as the maximum bounds each of its pairs. At
 * n = 1M, k = 16 (about 650 candidates a query) that is a few rows and columns per warp
 * and tile. ct2: the tile's column terms (c_j, c'_x) as pairs, offset to the thread's
 * first column. (Computing the column bits in a second loop after the row maxima made
 * ptxas spill the accumulators.) */
template <class Terms>
__device__ __forceinline__ void sym_epilogue_wg(const MmaParams &p, float (&acc)[2][64], const Terms &ts,
                                                const float *row_s, const float *prow_s, int rbase, int q0,
                                                int64_t ref0, int t, bool offdiag
                                                XKNN_PROF(, unsigned long long *pr = nullptr))
{
    XKNN_PROF(const unsigned long long e0 = clock64();)
    float rc[4], pv[4], mx[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = rbase + (i >> 1) * 64 + 8 * (i & 1);
        rc[i] = row_s[r];
        pv[i] = prow_s[r];
        mx[i] = -INFINITY;
    }
    unsigned rm[4] = {0u, 0u, 0u, 0u}, cmk[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int nb = 0; nb < 16; ++nb) {
        /* (c_j, c'_x) of both columns */
        const float4 w = ts.quad(nb);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const float cj = c ? w.z : w.x, cx = c ? w.w : w.y;
            float cm = -INFINITY;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float a = wg_acc(acc, i, nb, c);
                mx[i] = max_nan(mx[i], __fadd_ru(a, -cj));
                cm = max_nan(cm, __fadd_ru(a, -pv[i]));
            }
            if (offdiag && !(cm < cx)) /* the column's four bits (diagonal tiles: the row side sees both orders) */
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    cmk[i] |= (unsigned)!(__fadd_ru(wg_acc(acc, i, nb, c), -pv[i]) < cx)
                              << (2 * nb + c);
        }
    }
    XKNN_PROF(const unsigned long long e1 = clock64(); if (pr) {
        pr[4] += e1 - e0;
        const bool hr = !(mx[0] < rc[0]) || !(mx[1] < rc[1]) || !(mx[2] < rc[2]) || !(mx[3] < rc[3]);
        pr[6] += __ballot_sync(0xffffffffu, hr) != 0u;
        pr[7] += __ballot_sync(0xffffffffu, (cmk[0] | cmk[1] | cmk[2] | cmk[3]) != 0u) != 0u;
    })
#pragma unroll
    for (int i = 0; i < 4; ++i)
        if (!(mx[i] < rc[i])) {
#pragma unroll
            for (int nb = 0; nb < 16; ++nb)
#pragma unroll
                for (int c = 0; c < 2; ++c)
                {
                    const float a = wg_acc(acc, i, nb, c);
                    rm[i] |= (unsigned)!(__fadd_ru(a, -ts.again(nb, c)) < rc[i]) << (2 * nb + c);
                }
        }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int q = q0 + rbase + (i >> 1) * 64 + 8 * (i & 1);
        if (q >= p.qs) continue;
        if (rm[i]) append_cands(p.cnt, p.cand, p.cap, p.n, p.exclude ? p.self_local0 + q : -1, q, ref0 + 2 * t, rm[i]);
        if (cmk[i]) append_cols(p.ccnt, p.ccand, p.cap, p.n, q, ref0 + 2 * t, cmk[i]);
    }
    XKNN_PROF(if (pr) pr[5] += clock64() - e1;)
}

/* The sorted triangle's candidates (sym_epilogue_sorted) go to a pool of pair entries,
 * not to the lists: sorted row i (bits 0..29), 1 << 30 when the pair is a candidate of
 * row i, 1 << 31 when of column j, and sorted column j in the high 32 bits. Each warp
 * writes into its own chunk of the pool (one atomic a chunk of at least kPoolChunk
 * entries, not a round trip a row), so no store waits; launch_mma_sym_scatter then moves
 * the entries into the lists (the caller's ids) with the appenders' slot atomics. An
 * entry past pool_cap is not written: the host sees pool_next > pool_cap and runs the
 * triangle again in the caller's order. Unused entries hold all ones (row past n). */
constexpr int kPoolChunk = 1024;

__device__ __forceinline__ void pool_append(const MmaParams &p, const unsigned (&rm)[4], const unsigned (&cmk)[4],
                                            int qb, int64_t j0, unsigned long long &wcur, unsigned long long &wend)
{
    const int lane = (int)threadIdx.x & 31;
    unsigned u[4];
    int cntl = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u[i] = rm[i] | cmk[i];
        cntl += __popc(u[i]);
    }
    int incl = cntl; /* the warp's inclusive prefix sum of entries */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    if (wcur + (unsigned long long)total > wend) { /* (warp-uniform) a new chunk */
        const unsigned long long grab = total > kPoolChunk ? (unsigned long long)total : kPoolChunk;
        unsigned long long b = 0;
        if (lane == 0) b = atomicAdd(p.pool_next, grab);
        b = __shfl_sync(0xffffffffu, b, 0);
        wcur = b;
        wend = b + grab;
    }
    unsigned long long pos = wcur + (unsigned long long)(incl - cntl);
    wcur += (unsigned long long)total;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned q = (unsigned)(qb + (i >> 1) * 64 + 8 * (i & 1));
        for (unsigned m = u[i]; m; m &= m - 1, ++pos) {
            const int bit = __ffs(m) - 1;
            const unsigned j = (unsigned)(j0 + (bit >> 1) * 8 + (bit & 1));
            const unsigned lo = q | ((rm[i] >> bit) & 1u) << 30 | ((cmk[i] >> bit) & 1u) << 31;
            if (pos < (unsigned long long)p.pool_cap) p.pool[pos] = (unsigned long long)j << 32 | lo;
        }
    }
}

/* Mode 2 epilogue on rows sorted by decreasing threshold (p.perm; selfjoin.cu's host_sym,
 * launch_mma_sym_sort). A column x of a later tile then has thr_x <= thr_i for every row
 * i of the CTA, so the column test of a pair implies a slightly looser row test:
 * fadd_ru(acc, -p_i) >= c'_x gives acc - p_i > pred(c'_x) (pred: the float below),
 * so fadd_ru(acc, -c_x) >= acc - c_x > p_i + m_x with m_x = fsub_rd(pred(c'_x), c_x),
 * and with msuf the smallest m_x of the CTA's later columns (p.msuf, NaN when one is),
 * every pair of row i that is a candidate of either side has fadd_ru(acc, -c_x) >= rq_i =
 * min(r_i, fadd_rd(p_i, msuf)). The main loop is then pass B's: the row maximum of
 * fadd_ru(acc, -c_x) against rq_i decides for all 32 pairs of the row at once (NaN
 * anywhere: the row is computed), and only a row that passes has both masks computed
 * exactly, as sym_epilogue_wg computes them. Sorting makes rq_i equal r_i up to
 * roundings, so the quick test passes about as often as the row test alone. */
template <class Terms>
__device__ __forceinline__ void sym_epilogue_sorted(const MmaParams &p, float (&acc)[2][64], const Terms &ts,
                                                    const float *row_s, const float *prow_s, float msuf, int rbase,
                                                    int q0, int64_t ref0, int t, bool offdiag,
                                                    unsigned long long &wcur, unsigned long long &wend
                                                    XKNN_PROF(, unsigned long long *pr = nullptr))
{
    XKNN_PROF(const unsigned long long e0 = clock64();)
    float rq[4], mx[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = rbase + (i >> 1) * 64 + 8 * (i & 1);
        rq[i] = min_nan(row_s[r], __fadd_rd(prow_s[r], msuf));
        mx[i] = -INFINITY;
    }
#pragma unroll
    for (int nb = 0; nb < 16; ++nb) {
        const float4 w = ts.quad(nb);
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
            for (int i = 0; i < 4; ++i) mx[i] = max_nan(mx[i], __fadd_ru(wg_acc(acc, i, nb, c), -(c ? w.z : w.x)));
    }
    XKNN_PROF(const unsigned long long e1 = clock64(); if (pr) {
        pr[4] += e1 - e0;
        const bool hr = !(mx[0] < rq[0]) || !(mx[1] < rq[1]) || !(mx[2] < rq[2]) || !(mx[3] < rq[3]);
        pr[6] += __ballot_sync(0xffffffffu, hr) != 0u;
    })
    unsigned rm[4] = {0u, 0u, 0u, 0u}, cmk[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int i = 0; i < 4; ++i)
        if (!(mx[i] < rq[i])) {
            const int r = rbase + (i >> 1) * 64 + 8 * (i & 1);
            const float rc = lds_again(row_s + r), pv = lds_again(prow_s + r);
            unsigned a1 = 0u, a2 = 0u;
#pragma unroll
            for (int nb = 0; nb < 16; ++nb) {
                const float4 w = ts.quad_again(nb);
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const float a = wg_acc(acc, i, nb, c);
                    a1 |= (unsigned)!(__fadd_ru(a, -(c ? w.z : w.x)) < rc) << (2 * nb + c);
                    a2 |= (unsigned)!(__fadd_ru(a, -pv) < (c ? w.w : w.y)) << (2 * nb + c);
                }
            }
            rm[i] = a1;
            cmk[i] = offdiag ? a2 : 0u; /* diagonal tiles: the row side sees both orders */
        }
    XKNN_PROF(if (pr) pr[7] += __ballot_sync(0xffffffffu, (cmk[0] | cmk[1] | cmk[2] | cmk[3]) != 0u) != 0u;)
    /* (rows past qs: rq is +inf or NaN there, so their bits are 0 or dropped here) */
#pragma unroll
    for (int i = 0; i < 4; ++i)
        if (q0 + rbase + (i >> 1) * 64 + 8 * (i & 1) >= p.qs) rm[i] = cmk[i] = 0u;
    if (__any_sync(0xffffffffu, (rm[0] | rm[1] | rm[2] | rm[3] | cmk[0] | cmk[1] | cmk[2] | cmk[3]) != 0u))
        pool_append(p, rm, cmk, q0 + rbase, ref0 + 2 * t, wcur, wend);
    XKNN_PROF(if (pr) pr[5] += clock64() - e1;)
}

/* d[64] += A (64 x 8, descriptor) * B (8 x 128, descriptor), tf32 in, fp32 out */
__device__ __forceinline__ void wgmma_m64n128k8(float (&d)[64], uint64_t da, uint64_t db)
{
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db)
        : "memory");
}
#endif

/* One KB-dimension chunk of tile `tile` in the core-matrix layout (16-byte chunk (j, c4)
 * to core matrix (j / 8, c4), row j % 8); zero-filled past n and d. 8 consecutive threads
 * fill one core matrix (conflict-free stores). Norms as in load_stage. */
template <int MODE, bool VEC, int KB>
__device__ __forceinline__ void gload_stage(float *stage, float *rn_ring, const MmaParams &p, int64_t tile, int kc)
{
    const int tid = (int)threadIdx.x;
    const int64_t ref0 = tile * kBN;
    const int k0 = kc * KB;
    if (kc == 0) load_tile_terms<MODE>(rn_ring, p, tile);
#pragma unroll
    for (int i = 0; i < kBN * KB / 4 / kThreads; ++i) {
        const int idx = tid + i * kThreads;
        const int jr = idx & 7, c4 = (idx >> 3) & (KB / 4 - 1), jg = idx / (2 * KB);
        const int row = jg * 8 + jr;
        float *dst = stage + (jg * (KB / 4) + c4) * 32 + jr * 4;
        const int64_t j = ref0 + row;
        const int col = k0 + 4 * c4;
        if (VEC) {
            const bool ok = j < p.n && col < p.d;
            cp_async16(dst, ok ? p.R + j * p.ldr + col : p.R, ok ? 16 : 0);
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool ok = j < p.n && col + e < p.d;
                cp_async4(dst + e, ok ? p.R + j * p.ldr + col + e : p.R, ok ? 4 : 0);
            }
        }
    }
}

#ifdef XKNN__HAVE_WGMMA
/* The candidates of a thread's four rows of one tile (wg_epilogue, mode 1): row
 * qb + 64 mb + 8 hh has mask m(2 mb + hh) (bits as append_cands). All the rows' slot
 * atomics are issued before any slot is written, so a thread waits for one round trip
 * to L2 per tile, not one per row (at k = 4096 nearly every row of every tile has a
 * candidate). */
__device__ __noinline__ void append_rows(int *cnt, Cand *cand, int cap, int64_t n, int64_t self0, int qb, int64_t j0,
                                         unsigned m0, unsigned m1, unsigned m2, unsigned m3)
{
    const unsigned mask[4] = {m0, m1, m2, m3};
    unsigned keep[4];
    int pos[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int dq = (i >> 1) * 64 + (i & 1) * 8;
        keep[i] = 0;
        for (unsigned m = mask[i]; m; m &= m - 1) {
            const int bit = __ffs(m) - 1;
            const int64_t j = j0 + (bit >> 1) * 8 + (bit & 1);
            if (j < n && (self0 < 0 || j != self0 + dq)) keep[i] |= 1u << bit;
        }
        pos[i] = keep[i] ? atomicAdd(cnt + qb + dq, __popc(keep[i])) : 0;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int dq = (i >> 1) * 64 + (i & 1) * 8;
        for (unsigned m = keep[i]; m; m &= m - 1, ++pos[i]) {
            const int bit = __ffs(m) - 1;
            put_cand_at(cand, cap, qb + dq, pos[i], (int)(j0 + (bit >> 1) * 8 + (bit & 1)));
        }
    }
}

/* Pass A's row side of one tile for a thread's four rows (wg_epilogue mode 0, band_rows):
 * mn[i][h] = min over the thread's columns of 64-column group h of fma_ru(acc, -2, C_j)
 * (cj: the tile's column terms, C_j of column nb * 8 + 2 t + c at cj[2 nb + c]; the four
 * rows' chains interleave). */
__device__ __forceinline__ void row_group_minima(const float (&acc)[2][64], const float (&cj)[32], float (&mn)[4][2])
{
#pragma unroll
    for (int nb = 0; nb < 16; ++nb)
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
            for (int i = 0; i < 4; ++i)
                mn[i][nb >> 3] = fminf(mn[i][nb >> 3], __fmaf_ru(wg_acc(acc, i, nb, c), -2.0f, cj[2 * nb + c]));
}

/* U = fadd_ru(A_i, min), the minimum across the quad's 4 lanes (a group's 64 columns),
 * written by lane t = 0 of each row q < qs to slot slot0 + h of its witnesses. CHECK: slots
 * past ga are not written (a prefix's last tile may hold one group too many; the band's
 * slots 2 j + h are always below 4 W). Rounding up is monotone, so this is the same value
 * as the per-pair U's minimum. */
template <bool CHECK>
__device__ __forceinline__ void put_row_witnesses(const MmaParams &p, const float (&mn)[4][2], const float *row_s,
                                                  int wg, int wi, int g, int t, int q0, int64_t slot0)
{
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = wg * 128 + (i >> 1) * 64 + wi * 16 + g + 8 * (i & 1);
        const int q = q0 + r;
        const float rc = row_s[r];
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            float m = __fadd_ru(rc, mn[i][h2]);
            m = fminf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fminf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            const int64_t slot = slot0 + h2;
            if (t == 0 && q < p.qs && (!CHECK || slot < p.ga)) p.gmin[(int64_t)q * p.ga + slot] = m;
        }
    }
}

/* The epilogue of reference tile `tile` for warp wi of warpgroup wg (the mma_kernel
 * contract): pass A witnesses, pass B candidates, mode 2 both sides. The column terms
 * come from p.ct (mma_col_terms_kernel; wgmma_kernel's norm ring in shared memory is
 * mma_kernel's layout, unused here). Leaves acc as it found it. */
template <int MODE>
__device__ __forceinline__ void wg_epilogue(const MmaParams &p, float (&acc)[2][64], int64_t tile,
                                            const WgTerms<MODE> &T, const float *row_s, const float *prow_s, int wg,
                                            int wi, int g, int t, int q0)
{
    const int64_t ref0 = tile * kBN;
    if constexpr (MODE == 2) {
        sym_epilogue_wg(p, acc, SymTermsReg{T, reinterpret_cast<const float2 *>(p.ct) + ref0 + 2 * t}, row_s, prow_s,
                        wg * 128 + wi * 16 + g, q0, ref0, t, p.rect || tile * kBN >= (int64_t)q0 + kBM);
    } else {
        /* T: the tile's column terms (col_term, computed once a pass by
         * mma_col_terms_kernel), c_j of column nb * 8 + 2 t + c at T.v[2 nb + c] */
        if constexpr (MODE == 0) {
            const int64_t s0 = p.self_local0 + q0;
            const bool diag = p.exclude && ref0 < s0 + kBM && s0 < ref0 + kBN;
            /* per row and 64-column group, min_j fma_ru(acc, -2, C_j), then U = fadd_ru(A_i,
             * min): the same value as the per-pair U of mma_kernel (rounding up is
             * monotone). The four rows' minima are taken together (their chains interleave). */
            float mn[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) mn[i][0] = mn[i][1] = INFINITY;
            row_group_minima(acc, T.v, mn);
            if (diag) { /* the tile holds some of the CTA's queries: no query is its own witness */
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int r = wg * 128 + (i >> 1) * 64 + wi * 16 + g + 8 * (i & 1);
                    const int64_t jq = p.self_local0 + q0 + r - ref0; /* the query's column in the tile */
                    if (jq < 0 || jq >= kBN || (int)(jq & 7) >> 1 != t) continue;
                    mn[i][0] = mn[i][1] = INFINITY;
#pragma unroll
                    for (int nb = 0; nb < 16; ++nb)
#pragma unroll
                        for (int c = 0; c < 2; ++c)
                            if (nb * 8 + 2 * t + c != jq) {
                                const float u = __fmaf_ru(wg_acc(acc, i, nb, c), -2.0f, T.v[2 * nb + c]);
                                mn[i][nb >> 3] = fminf(mn[i][nb >> 3], u);
                            }
                }
            }
            put_row_witnesses<true>(p, mn, row_s, wg, wi, g, t, q0, ref0 / kMmaGroup);
        } else {
            /* not a candidate <=> fadd_ru(acc, -c_j) < r_i (then acc < c_j + r_i <= la s - thr
             * exactly); the row maximum decides for all 32 pairs at once (max.NaN keeps NaN:
             * such pairs are candidates). The four rows' maxima are taken together, so
             * their chains interleave; masks only for rows that need them. */
            float mx[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) mx[i] = -INFINITY;
#pragma unroll
            for (int nb = 0; nb < 16; ++nb)
#pragma unroll
                for (int c = 0; c < 2; ++c)
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        mx[i] = max_nan(mx[i], __fadd_ru(wg_acc(acc, i, nb, c), -T.v[2 * nb + c]));
            unsigned masks[4] = {0u, 0u, 0u, 0u}; /* row 2 mb + hh's candidates */
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = wg * 128 + (i >> 1) * 64 + wi * 16 + g + 8 * (i & 1);
                if (mx[i] < row_s[r] || q0 + r >= p.qs) continue;
                const float rc = row_s[r];
                unsigned mask = 0; /* bit 2 nb + c: a candidate */
#pragma unroll
                for (int nb = 0; nb < 16; ++nb)
#pragma unroll
                    for (int c = 0; c < 2; ++c)
                        mask |= (unsigned)!(__fadd_ru(wg_acc(acc, i, nb, c), -T.v[2 * nb + c]) < rc)
                                << (2 * nb + c);
                masks[i] = mask;
            }
            if (masks[0] | masks[1] | masks[2] | masks[3]) {
                const int qb = q0 + wg * 128 + wi * 16 + g;
                append_rows(p.cnt, p.cand, p.cap, p.n, p.exclude ? p.self_local0 + qb : -1, qb, ref0 + 2 * t, masks[0],
                            masks[1], masks[2], masks[3]);
            }
        }
    }
}

/* One lane's half of 2 H values after a min with lane ^ M's other half (a reduce-scatter
 * step): the lane whose bit M is set keeps v[H + e], the other v[e]; both end with the
 * kept half in v[0, H). */
template <int H, int M>
__device__ __forceinline__ void min_scatter(float (&v)[16], int lane)
{
    const bool hi = (lane & M) != 0;
#pragma unroll
    for (int e = 0; e < H; ++e) {
        const float keep = hi ? v[H + e] : v[e], give = hi ? v[e] : v[H + e];
        v[e] = fminf(keep, __shfl_xor_sync(0xffffffffu, give, M));
    }
}

/* band_epilogue_wg's row side; DIAG: tiles that may hold the CTA's own rows (j < 2) */
template <bool DIAG>
__device__ __forceinline__ void band_rows(const MmaParams &p, const float (&acc)[2][64], const WgTerms<3> &T,
                                          const float *row_s, int wg, int wi, int g, int t, int q0, int64_t ref0,
                                          int j)
{
    float mn[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) mn[i][0] = mn[i][1] = INFINITY;
    if (DIAG) { /* no row is its own witness: its column in the tile, or -1 */
        const int64_t s0 = p.self_local0 + q0;
        int jq[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int64_t c = s0 + wg * 128 + (i >> 1) * 64 + wi * 16 + g + 8 * (i & 1) - ref0;
            jq[i] = p.exclude && c >= 0 && c < kBN ? (int)c : -1;
        }
#pragma unroll
        for (int nb = 0; nb < 16; ++nb)
#pragma unroll
            for (int c = 0; c < 2; ++c)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float u = __fmaf_ru(wg_acc(acc, i, nb, c), -2.0f, T.v[2 * nb + c]);
                    mn[i][nb >> 3] = fminf(mn[i][nb >> 3], nb * 8 + 2 * t + c == jq[i] ? INFINITY : u);
                }
    } else {
        row_group_minima(acc, T.v, mn);
    }
    put_row_witnesses<false>(p, mn, row_s, wg, wi, g, t, q0, 2 * j);
}

/* Mode 3's epilogue (SYMMETRIC WITNESSES): band tile j (reference tile ref0 / kBN) of the
 * CTA's rows. Row side (band_rows): pass A's per-row minima of the tile's two 64-column
 * groups, into slots 2 j, 2 j + 1. Column side (j >= 2; tiles 0 and 1 hold the CTA's own
 * rows): per column and 64-row group m = 2 wg + mb of the CTA the minimum over its rows
 * of fma_ru(acc, -2, C_q), then U = fadd_ru(A'_x, min) with A'_x = fadd_ru(C_x, ub), into
 * slot 2 band + 2 j - m - 1 of the column. The rows' minima go across the warp's lanes by
 * a reduce-scatter (lane bits 4, 3, 2; per group and half of the columns each lane ends
 * with 2 of 16 values) and across the warpgroup's 4 warps through wbuf (4 x 2 x 128
 * floats): after named barrier 4 + wg, thread wi * 32 + lane takes column wi * 32 + lane
 * of both groups (cx: that column's C_x, loaded before the wgmma wait). wbuf is written
 * again only after the next tile's turn barrier, which each of the warpgroup's warps
 * reaches after its reads here. (The row side's self test is a select in its one loop:
 * a second loop over a diagonal row's columns, as pass A has, made ptxas spill next to
 * the column side.) */
__device__ __forceinline__ void band_epilogue_wg(const MmaParams &p, float (&acc)[2][64], const WgTerms<3> &T,
                                                 float cx, const float *row_s, const float *prow_s, float *wbuf,
                                                 int wg, int wi, int g, int t, int lane, int q0, int64_t ref0, int j)
{
    if (j < 2) { /* (the same j for the whole CTA) */
        band_rows<true>(p, acc, T, row_s, wg, wi, g, t, q0, ref0, j);
        return;
    }
    band_rows<false>(p, acc, T, row_s, wg, wi, g, t, q0, ref0, j);
    float cq[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) cq[i] = prow_s[wg * 128 + (i >> 1) * 64 + wi * 16 + g + 8 * (i & 1)];
    float *mine = wbuf + wi * 2 * kBN;
#pragma unroll
    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int h = 0; h < 2; ++h) { /* columns nb * 8 + 2 t + c, nb in [8 h, 8 h + 8) */
            float v[16];          /* index 2 (nb - 8 h) + c */
#pragma unroll
            for (int nb = 0; nb < 8; ++nb)
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    v[2 * nb + c] = fminf(__fmaf_ru(wg_acc(acc, 2 * mb, 8 * h + nb, c), -2.0f, cq[2 * mb]),
                                          __fmaf_ru(wg_acc(acc, 2 * mb + 1, 8 * h + nb, c), -2.0f, cq[2 * mb + 1]));
            min_scatter<8, 16>(v, lane);
            min_scatter<4, 8>(v, lane);
            min_scatter<2, 4>(v, lane);
            /* v[u] is index 2 g + u: column (8 h + g) 8 + 2 t + u */
            float *dst = mine + mb * kBN + (8 * h + g) * 8 + 2 * t;
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(smem_addr(dst)), "f"(v[0]), "f"(v[1]) : "memory");
        }
    named_sync(4 + wg, 128);
    const int col = wi * 32 + lane;
    const int64_t x = ref0 + col;
    if (x < p.n) {
        const float ax = __fadd_ru(cx, p.ub);
#pragma unroll
        for (int mb = 0; mb < 2; ++mb) {
            /* a group of padding rows only (the last CTA's second tile when RT is odd) has
             * no witness, and its slot is that of CTA 0's group m - 2 (4 I + m = 2 RT + m - 2) */
            if (q0 + 64 * (2 * wg + mb) >= p.qs) continue;
            float m = lds_again(wbuf + mb * kBN + col);
#pragma unroll
            for (int w = 1; w < 4; ++w) m = fminf(m, lds_again(wbuf + w * 2 * kBN + mb * kBN + col));
            const int64_t slot = 2 * (int64_t)p.band + 2 * j - (2 * wg + mb) - 1;
            p.gmin[x * p.ga + slot] = __fadd_ru(ax, m);
        }
    }
}

#endif

/* wgmma_ws_kernel (mma_wgmma_ws.cu): 384 threads, a ring of at most kWsMaxStages chunks */
constexpr int kWsThreads = 384;
constexpr int kWsMaxStages = 12;

/* wgmma_ws_kernel's shared memory with S stages: queries, row constants (mode 2's p_i
 * too), S chunks, barriers, and up to 1024 bytes to align the operands. */
__host__ __device__ constexpr size_t ws_smem_bytes(int64_t dpad, int S)
{
    return sizeof(float) * (size_t)(kBM * dpad + 2 * kBM + (int64_t)S * kBN * 32) +
           2 * kWsMaxStages * sizeof(uint64_t) + 8 * kBN * 2 * sizeof(float) /* mode 2's term copies */ + 1024;
}

} // namespace

} // namespace xknn_cuda

#endif
