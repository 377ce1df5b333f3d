/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/mma_common.cuh -- what the tensor-core path's tile kernels share (mma.cu's
 * header describes the passes and their bounds): tile constants, the reference ring's
 * loads, the CTA's tiles and its block prologue (XKNN__MMA_BLOCK_TILES), the per-row and per-column
 * epilogue terms, candidate appends, and the epilogues of mma.sync-shaped fragments. One
 * family of tile kernels a file (mma.cu: mma.sync; mma_ffma.cu, mma_wgmma.cu,
 * mma_wgmma_ws.cu), each with the host functions that set its shared memory and launch it.
 */
#ifndef XKNN_CUDA_MMA_COMMON_CUH
#define XKNN_CUDA_MMA_COMMON_CUH

#include "async_primitives.cuh"
#include "block_primitives.cuh"
#include "kernels.cuh"

namespace xknn_cuda {

namespace {

constexpr int kBM = kMmaBM, kBN = kMmaBN, kBK = 32, kStages = kMmaStages;
constexpr int kRowB = kBK + 4; /* floats per staged reference row (16-byte aligned, conflict-free) */
constexpr int kThreads = kMmaThreads;
constexpr int kGStages = 3; /* wgmma kernel: cp.async ring depth */

/* XKNN_CUDA_PROFILE (a developer's build option: meson setup -Dcuda_args=-DXKNN_CUDA_PROFILE)
 * times the phases of wgmma_ws_kernel with clock64: lane 0 of each consumer warp sums, over
 * its tiles, the wait for its turn, the issue of its chunks, the drain of the last one and
 * the epilogue (mode 2: its main loop and the rest apart), and counts its warp-tiles; lane
 * 0 of each producer warp sums its waits on the stages' empty barriers and its loads.
 * launch_one prints the means after each launch (it waits for the kernel) and clears them.
 * Without the option the kernel is unchanged. */
#ifdef XKNN_CUDA_PROFILE
__device__ unsigned long long g_ws_prof[4][16];
#define XKNN_PROF(...) __VA_ARGS__
#else
#define XKNN_PROF(...)
#endif

/* wgmma kernel: dimensions per ring stage, KB = 64 where the padded depth is a multiple of
 * 64 (one barrier and one wgmma drain per 64 dimensions instead of per 32), else 32. Mode
 * 2 keeps 32: its extra rings would not fit next to 64-dimension stages at d = 128. */
__host__ __device__ constexpr int wgmma_chunk_of(int64_t dpad, bool sym) { return !sym && dpad % 64 == 0 ? 64 : 32; }

__device__ __forceinline__ void mma_tf32(float (&c)[4], float a0, float a1, float a2, float a3, float b0, float b1)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(__float_as_uint(a0)), "r"(__float_as_uint(a1)), "r"(__float_as_uint(a2)), "r"(__float_as_uint(a3)),
          "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
}

/* |x|^2 as the epilogue uses it: NaN unless 0 <= v <= 5e36 (see the header) */
__device__ __forceinline__ float norm_or_nan(float v) { return v <= 5e36f ? v : __int_as_float(0x7fffffff); }

/* One 32-dimension chunk of reference tile `tile` into a stage: 128 rows x 8 x 16 bytes
 * (vec) or 128 x 32 x 4 bytes; rows >= n and dimensions >= d are zero-filled. With the
 * first chunk of a tile come its 128 reference norms, into slot tile % kRnSlots of the
 * norm ring (rn has round_up(n, kMmaBN) entries; those past n are masked later). */
constexpr int kRnSlots = 4;
/* Mode 2 also brings the tile's thresholds thr_x, into a second ring right after the
 * norms' (p.cthr has round_up(n, kMmaBN) entries; those past n are masked later). */
template <int MODE>
__device__ __forceinline__ void load_tile_terms(float *rn_ring, const MmaParams &p, int64_t tile)
{
    const int tid = (int)threadIdx.x;
    const int64_t ref0 = tile * kBN;
    const int slot = (int)(tile % kRnSlots) * kBN;
    if (tid < kBN / 4)
        cp_async16(rn_ring + slot + 4 * tid, p.rn + ref0 + 4 * tid, 16);
    else if (MODE == 2 && tid < kBN / 2)
        cp_async16(rn_ring + kRnSlots * kBN + slot + 4 * (tid - kBN / 4), p.cthr + ref0 + 4 * (tid - kBN / 4), 16);
}

template <int MODE, bool VEC>
__device__ __forceinline__ void load_stage(float *stage, float *rn_ring, const MmaParams &p, int64_t tile, int kc)
{
    const int tid = (int)threadIdx.x;
    const int64_t ref0 = tile * kBN;
    const int k0 = kc * kBK;
    if (MODE == 2 && kc == 0) load_tile_terms<MODE>(rn_ring, p, tile);
    if (VEC) {
#pragma unroll
        for (int i = 0; i < kBN * kBK / 4 / kThreads; ++i) {
            const int idx = tid + i * kThreads, row = idx >> 3, c4 = idx & 7;
            const int64_t j = ref0 + row;
            const int col = k0 + 4 * c4;
            const bool ok = j < p.n && col < p.d;
            cp_async16(stage + row * kRowB + 4 * c4, ok ? p.R + j * p.ldr + col : p.R, ok ? 16 : 0);
        }
    } else {
#pragma unroll 4
        for (int i = 0; i < kBN * kBK / kThreads; ++i) {
            const int idx = tid + i * kThreads, row = idx >> 5, c = idx & 31;
            const int64_t j = ref0 + row;
            const int col = k0 + c;
            const bool ok = j < p.n && col < p.d;
            cp_async4(stage + row * kRowB + c, ok ? p.R + j * p.ldr + col : p.R, ok ? 4 : 0);
        }
    }
}

/* The reference tiles [t0, t1) of this CTA: slice blockIdx.y of p.tiles_per_cta tiles;
 * mode 2's slices start at the CTA's own rows (the triangle), except for two sets (rect). */
template <int MODE>
__device__ __forceinline__ void cta_tiles(const MmaParams &p, int q0, int64_t &t0, int64_t &t1)
{
    const int64_t RT = (p.n + kBN - 1) / kBN;
    t0 = (MODE == 2 && !p.rect || MODE == 3 ? (int64_t)q0 / kBN : 0) + (int64_t)blockIdx.y * p.tiles_per_cta;
    /* mode 3: virtual tiles of the band, [q0 / kBN, q0 / kBN + band), tile v is v mod RT */
    const int64_t end = MODE == 3 ? (int64_t)q0 / kBN + p.band : RT;
    t1 = t0 + p.tiles_per_cta < end ? t0 + p.tiles_per_cta : end;
}

/* Per-row epilogue constants of rows [0, bm) of the CTA's query tile (see mma_kernel):
 * pass A  A_i = fma_ru(ua, |q|^2, ub)  (NaN for padding rows);
 * pass B  r_i = fsub_rd(fmul_rd(la, |q|^2), thr)  (+inf for padding rows: never a
 * candidate); mode 2 also p_i = fmul_rd(la, |q|^2) in prow_s (+inf for padding rows);
 * mode 3 (the band) A_i as pass A and C_q = fmul_ru(ua, |q|^2) in prow_s (NaN for padding).
 * Thread `first` of the nt that share the work starts at row first. */
template <int MODE>
__device__ __forceinline__ void stage_row_consts(float *row_s, float *prow_s, const MmaParams &p, int q0, int bm,
                                                 int nt, int first = (int)threadIdx.x)
{
    for (int r = first; r < bm; r += nt) {
        const int q = q0 + r;
        const float qv = q < p.qs ? norm_or_nan(p.qn[q]) : __int_as_float(0x7fffffff);
        if (MODE == 0 || MODE == 3)
            row_s[r] = __fmaf_ru(p.ua, qv, p.ub);
        else
            row_s[r] = q < p.qs ? __fsub_rd(__fmul_rd(p.la, qv), p.thr[q]) : INFINITY;
        if (MODE == 2) prow_s[r] = q < p.qs ? __fmul_rd(p.la, qv) : INFINITY;
        if (MODE == 3) prow_s[r] = __fmul_ru(p.ua, qv); /* the row as a column: C_q (NaN for padding) */
    }
}

/* Mode 2 column constant c'_x of reference j (its norm x, its thr in thr_x): +inf past n
 * (never a candidate), NaN for huge norms (always one). */
__device__ __forceinline__ float col_sym_term(const MmaParams &p, int64_t j, float x, float thr_x)
{
    return j < p.n ? __fsub_rd(__fmul_rd(p.la, norm_or_nan(x)), thr_x) : INFINITY;
}

/* Column term of reference j with stored norm x: pass A C_j = fmul_ru(ua, |x|^2) (NaN
 * past n), pass B c_j = fmul_rd(la, |x|^2) (+inf past n). */
template <int MODE>
__device__ __forceinline__ float col_term(const MmaParams &p, int64_t j, float x)
{
    x = norm_or_nan(x);
    if (MODE == 0) return j < p.n ? __fmul_ru(p.ua, x) : __int_as_float(0x7fffffff);
    return j < p.n ? __fmul_rd(p.la, x) : INFINITY; /* modes 1 and 2 */
}

/* Candidate entry idx at slot pos of list (a state query); a slot past cap is not
 * written: the buffer only counts then (the query is re-run exactly). */
__device__ __forceinline__ void put_cand_at(Cand *cand, int cap, int64_t list, int pos, int idx, float up = INFINITY)
{
    if (pos < cap) {
        Cand e;
        e.lo = -INFINITY;
        e.up = up;
        e.c = XKNN_CUDA_UNRESOLVED;
        e.idx = idx;
        cand[list * cap + pos] = e;
    }
}

/* The appenders below are __noinline__ and take what they need as scalars: a reference
 * to the kernel's parameters would make the compiler copy them to the stack, and every
 * later read of a parameter in the kernel would then be a local load. */

/* Appends the candidates of one row: bit 2 b + c of mask is column j0 + 8 b + c (rare:
 * about kk n / nA per query in all). Columns past n and the query itself (self, -1 for
 * none) are dropped here, never in the hot test. One atomic reserves the row's slots (a
 * round trip to L2 per candidate, one after the other, was most of the epilogue's stall
 * time). One call site per row (a call per pair, or passing the accumulators, cost
 * registers in the hot loop). */
/* The bits of mask whose column j0 + 8 b + c (bit 2 b + c) is a reference other than self */
__device__ __forceinline__ unsigned row_keep(unsigned mask, int64_t n, int64_t self, int64_t j0)
{
    unsigned keep = 0;
    for (unsigned m = mask; m; m &= m - 1) {
        const int bit = __ffs(m) - 1;
        const int64_t j = j0 + (bit >> 1) * 8 + (bit & 1);
        if (j < n && j != self) keep |= 1u << bit;
    }
    return keep;
}

__device__ __noinline__ void append_cands(int *cnt, Cand *cand, int cap, int64_t n, int64_t self, int q, int64_t j0,
                                          unsigned mask)
{
    unsigned keep = row_keep(mask, n, self, j0);
    if (!keep) return;
    int pos = atomicAdd(cnt + q, __popc(keep));
    for (; keep; keep &= keep - 1, ++pos) {
        const int bit = __ffs(keep) - 1;
        put_cand_at(cand, cap, q, pos, (int)(j0 + (bit >> 1) * 8 + (bit & 1)));
    }
}

/* Pass B's rows of mma_kernel and ffma_kernel: append_cands, each entry carrying its
 * accumulator in up for mma_prune_kernel (acc[2 bit], bits as mask; the caller's local
 * array, written only on this rare path, so the accumulators stay in registers). */
__device__ __noinline__ void append_cands_acc(int *cnt, Cand *cand, int cap, int64_t n, int64_t self, int q,
                                              int64_t j0, unsigned mask, const float *acc)
{
    unsigned keep = row_keep(mask, n, self, j0);
    if (!keep) return;
    int pos = atomicAdd(cnt + q, __popc(keep));
    for (; keep; keep &= keep - 1, ++pos) {
        const int bit = __ffs(keep) - 1;
        put_cand_at(cand, cap, q, pos, (int)(j0 + (bit >> 1) * 8 + (bit & 1)), acc[2 * bit]);
    }
}

/* Mode 2: query qid (a local id, as Q = R) joins the buffers of the columns in mask (bit
 * 2 b + c is column j0 + 8 b + c). Columns past n are dropped; none is qid itself (the
 * column side runs on off-diagonal tiles only). Each column is its own list, one atomic
 * each. */
__device__ __noinline__ void append_cols(int *cnt, Cand *cand, int cap, int64_t n, int qid, int64_t j0, unsigned mask)
{
    for (; mask; mask &= mask - 1) {
        const int bit = __ffs(mask) - 1;
        const int64_t j = j0 + (bit >> 1) * 8 + (bit & 1);
        if (j < n) put_cand_at(cand, cap, j, atomicAdd(cnt + j, 1), qid);
    }
}

/* Mode 2 epilogue of one tile for the thread's R rows (tile rows rows[i]) and 2 NB
 * columns (column nb * 8 + 2 t + c; A(i, nb, c) its accumulator): both masks of every
 * pair, without a quick test (with hundreds of candidates per query nearly every warp
 * would have a lane in a slow path behind it on every tile). The row mask
 * is mode 1's test, the column mask the header's; columns are skipped on diagonal tiles
 * (not offdiag), whose pairs the row side sees in both orders. The appends come after
 * the last use of the accumulators. rnt / thrt: the tile's norms and thresholds, offset
 * to the thread's column block; row_s / prow_s indexed by tile row. */
template <int R, int NB, typename Acc>
__device__ __forceinline__ void sym_epilogue(const MmaParams &p, Acc A, const float *rnt, const float *thrt,
                                             const float *row_s, const float *prow_s, const int (&rows)[R], int q0,
                                             int64_t ref0, int t, bool offdiag)
{
    float rc[R], pv[R];
    unsigned rm[R], cm[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        rc[i] = row_s[rows[i]];
        pv[i] = prow_s[rows[i]];
        rm[i] = 0;
        cm[i] = 0;
    }
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int col = nb * 8 + 2 * t + c;
            const float xn = rnt[col];
            const float cj = col_term<2>(p, ref0 + col, xn);
            const float ct = col_sym_term(p, ref0 + col, xn, thrt[col]);
#pragma unroll
            for (int i = 0; i < R; ++i) {
                const float a = A(i, nb, c);
                rm[i] |= (unsigned)!(__fadd_ru(a, -cj) < rc[i]) << (2 * nb + c);
                cm[i] |= (unsigned)!(__fadd_ru(a, -pv[i]) < ct) << (2 * nb + c);
            }
        }
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const int q = q0 + rows[i];
        if (q >= p.qs) continue;
        if (rm[i]) append_cands(p.cnt, p.cand, p.cap, p.n, p.exclude ? p.self_local0 + q : -1, q, ref0 + 2 * t, rm[i]);
        if (offdiag && cm[i]) append_cols(p.ccnt, p.ccand, p.cap, p.n, q, ref0 + 2 * t, cm[i]);
    }
}

/* mma_kernel's fragment: rows wm 64 + 16 mi + g + 8 hh, accumulator acc[mi][ni][2 hh + c] */
__device__ __forceinline__ void sym_epilogue_mma(const MmaParams &p, float (&acc)[4][8][4], const float *rnt,
                                                 const float *thrt, const float *row_s, const float *prow_s,
                                                 int rbase, int q0, int64_t ref0, int t, bool offdiag)
{
    int rows[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) rows[i] = rbase + (i >> 1) * 16 + 8 * (i & 1);
    sym_epilogue<8, 8>(p, [&](int i, int nb, int c) { return acc[i >> 1][nb][2 * (i & 1) + c]; }, rnt, thrt,
                       row_s, prow_s, rows, q0, ref0, t, offdiag);
}

/* max (MAX) or min that returns NaN when either operand is NaN */
template <bool MAX>
__device__ __forceinline__ float extreme_nan(float a, float b)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float r;
    if constexpr (MAX)
        asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
    else
        asm("min.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return (MAX ? a > b : a < b) || a != a ? a : b;
#endif
}
__device__ __forceinline__ float max_nan(float a, float b) { return extreme_nan<true>(a, b); }
__device__ __forceinline__ float min_nan(float a, float b) { return extreme_nan<false>(a, b); }

/* Passes A and B of mma_kernel's fragment for one tile: rows rbase + 16 mi + 8 hh
 * (accumulator acc[mi][ni][2 hh + c]), columns ref0 + 8 ni + 2 t + c. The column terms
 * come from p.ct (col_term, computed once a pass by mma_col_terms_kernel).
 * pass A  per row, U = fadd_ru(A_i, min_j fma_ru(acc, -2, C_j)) >= A_i + C_j - 2 acc for
 *         every j (each step rounds up), written as the witness of the warp's 64-column
 *         group; NaN terms are never the minimum, and on a diagonal tile the query's own
 *         column is left out.
 * pass B  not a candidate <=> fadd_ru(acc, -c_j) < r_i (then acc < c_j + r_i <= la s -
 *         thr exactly); the row maximum decides for a whole row at once (max.NaN keeps
 *         NaN: such pairs are candidates), and masks are built only for rows that pass.
 *         CARRY: each entry carries its accumulator (append_cands_acc; mma_prune_kernel).
 * Other thread layouts (ffma_kernel): 2 MI rows rbase + RS0 (i >> 1) + RS1 (i & 1), and
 * the 4 threads that share a row's 64 columns (t = 0..3) are lanes apart by X1, X2. */
template <int MODE, int MI = 4, int RS0 = 16, int RS1 = 8, int X1 = 1, int X2 = 2, bool CARRY = true>
__device__ __forceinline__ void mma_epilogue(const MmaParams &p, const float (&acc)[MI][8][4], const float *row_s,
                                             int rbase, int q0, int64_t ref0, int t)
{
    float cv[8][2];
#pragma unroll
    for (int ni = 0; ni < 8; ++ni) {
        const float2 c2 = __ldg(reinterpret_cast<const float2 *>(p.ct + ref0 + ni * 8 + 2 * t));
        cv[ni][0] = c2.x;
        cv[ni][1] = c2.y;
    }
    if (MODE == 0) {
        const int64_t s0 = p.self_local0 + q0;
        const bool diag = p.exclude && ref0 < s0 + kBM && s0 < ref0 + 64;
        float mn[2 * MI];
#pragma unroll
        for (int i = 0; i < 2 * MI; ++i) mn[i] = INFINITY;
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
            for (int c = 0; c < 2; ++c)
#pragma unroll
                for (int i = 0; i < 2 * MI; ++i)
                    mn[i] = fminf(mn[i], __fmaf_ru(acc[i >> 1][ni][2 * (i & 1) + c], -2.0f, cv[ni][c]));
        if (diag) { /* the tile holds some of the CTA's queries: no query is its own witness */
#pragma unroll
            for (int i = 0; i < 2 * MI; ++i) {
                const int r = rbase + (i >> 1) * RS0 + RS1 * (i & 1);
                const int64_t jq = s0 + r - ref0; /* the query's column in the warp's 64 */
                if (jq < 0 || jq >= 64 || (int)(jq & 7) >> 1 != t) continue;
                mn[i] = INFINITY;
#pragma unroll
                for (int ni = 0; ni < 8; ++ni)
#pragma unroll
                    for (int c = 0; c < 2; ++c)
                        if (ni * 8 + 2 * t + c != jq)
                            mn[i] = fminf(mn[i], __fmaf_ru(acc[i >> 1][ni][2 * (i & 1) + c], -2.0f, cv[ni][c]));
            }
        }
        const int64_t grp = ref0 / kMmaGroup;
#pragma unroll
        for (int i = 0; i < 2 * MI; ++i) {
            const int r = rbase + (i >> 1) * RS0 + RS1 * (i & 1);
            float m = __fadd_ru(row_s[r], mn[i]);
            m = fminf(m, __shfl_xor_sync(0xffffffffu, m, X1));
            m = fminf(m, __shfl_xor_sync(0xffffffffu, m, X2));
            const int q = q0 + r;
            if (t == 0 && q < p.qs && grp < p.ga) p.gmin[(int64_t)q * p.ga + grp] = m;
        }
    } else {
        float mx[2 * MI];
#pragma unroll
        for (int i = 0; i < 2 * MI; ++i) mx[i] = -INFINITY;
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
            for (int c = 0; c < 2; ++c)
#pragma unroll
                for (int i = 0; i < 2 * MI; ++i)
                    mx[i] = max_nan(mx[i], __fadd_ru(acc[i >> 1][ni][2 * (i & 1) + c], -cv[ni][c]));
#pragma unroll
        for (int i = 0; i < 2 * MI; ++i) {
            const int r = rbase + (i >> 1) * RS0 + RS1 * (i & 1);
            const int q = q0 + r;
            const float rc = row_s[r];
            if (mx[i] < rc || q >= p.qs) continue;
            unsigned mask = 0; /* bit 2 ni + c: a candidate */
#pragma unroll
            for (int ni = 0; ni < 8; ++ni)
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    mask |= (unsigned)!(__fadd_ru(acc[i >> 1][ni][2 * (i & 1) + c], -cv[ni][c]) < rc) << (2 * ni + c);
            if (CARRY) {
                /* the row's accumulators, bit b at av[2 b]: stored apart, so that no store
                 * takes several accumulators at once (a 16-byte store asks for four in
                 * consecutive registers, which moved the hot loop's operands into
                 * conflicting register banks: W1 fp32 +7 %) */
                float av[32];
#pragma unroll
                for (int ni = 0; ni < 8; ++ni)
#pragma unroll
                    for (int c = 0; c < 2; ++c) av[2 * (2 * ni + c)] = acc[i >> 1][ni][2 * (i & 1) + c];
                append_cands_acc(p.cnt, p.cand, p.cap, p.n, p.exclude ? p.self_local0 + q : -1, q, ref0 + 2 * t, mask,
                                 av);
            } else {
                append_cands(p.cnt, p.cand, p.cap, p.n, p.exclude ? p.self_local0 + q : -1, q, ref0 + 2 * t, mask);
            }
        }
    }
}

/* The block prologue of every tile kernel: the reference tiles [t0, t1) of the CTA whose
 * first query is q0 (cta_tiles; the kernel returns at once when it has none) and its
 * trips over chunks of KB of the dpad dimensions, KC a tile and total in all. A macro:
 * it returns from the kernel, and as a __forceinline__ function it changed ptxas's
 * register allocation of some kernels. */
#define XKNN__MMA_BLOCK_TILES(KB)   \
    int64_t t0, t1;                 \
    cta_tiles<MODE>(p, q0, t0, t1); \
    if (t0 >= t1) return;           \
    const int KC = dpad / (KB);     \
    const int64_t total = (t1 - t0) * KC

} // namespace

/* The host side of the tile kernels of the other files, instantiated there for every
 * MODE and VEC (KB, SORTED) that launch_one takes: *_smem sets an instance's dynamic
 * shared memory limit; *_launch enqueues it on st (the caller reads cudaGetLastError). */
template <int MODE, bool VEC, int KB>
cudaError_t wgmma_smem(int bytes);
template <int MODE, bool VEC, int KB>
void wgmma_launch(dim3 grid, size_t smem, cudaStream_t st, const MmaParams &p);
template <int MODE, bool SORTED>
cudaError_t wgmma_ws_smem(int bytes);
template <int MODE, bool SORTED>
void wgmma_ws_launch(dim3 grid, size_t smem, cudaStream_t st, const MmaParams &p, int S);
/* ffma_kernel's grid for pass `mode` (0 or 1), launched on st */
cudaError_t launch_ffma(const MmaParams &p, int mode, int sms, cudaStream_t st);
#ifdef XKNN_CUDA_PROFILE
void ws_profile_print(int mode);
#endif

} // namespace xknn_cuda

#endif
