/*
 * kernels/cuda/mma.cu -- the tensor-core path (XKNN_CUDA_PATH_MMA): TF32 mma.sync tiles
 * whose epilogue does the candidate work in registers, so no distance tile ever goes
 * through memory (docs/DESIGN.md section 5: "a kernel that never writes
 * distances is the limit case").
 *
 * PIPELINE (one state block of qs queries, references resident on the device)
 *   pass A   mma tiles over the first nA references; per (query, group of kMmaGroup = 64
 *            references) the smallest rigorous UPPER bound U >= D of the group is written
 *            (the "witness" of the group). Groups are disjoint, so the kk smallest
 *            witnesses belong to kk distinct references.
 *   select   per query tau = kk-th smallest witness (radix select): at least kk
 *            references have D <= tau, so tau bounds the kk-th smallest distance.
 *            (Large k, l2: engine.cu's plan_estimate takes a short prefix and the j-th
 *            smallest witness, j < kk, an ESTIMATE of that bound; the re-rank then
 *            certifies it and the rescue searches the queries whose certificate fails.)
 *   pass B   mma tiles over all n references; a pair whose rigorous LOWER bound satisfies
 *            L <= tau' = tau (1 + 2^-19) + 16 FLT_MIN is appended to the query's candidate
 *            buffer (atomic slot; rare: about kk n / nA pairs per query plus the bound's
 *            band). Any other reference has D > tau', so its canonical value is strictly
 *            greater than those of kk references: it cannot be in the top k (the same
 *            argument as filter.cu).
 *   prune    (l2 / euclidean; mma_kernel, and ffma_kernel for larger k) the entries
 *            carry their accumulators: those whose lower bound exceeds the kk-th
 *            smallest upper bound are dropped before the re-rank (mma_prune_kernel).
 *   rescue   a query whose buffer overflowed (cap slots; ties or a loose tau) is searched
 *            again exactly: every reference, canonical distances, the buffer cut to its
 *            exact top kk by (canonical, id) whenever it fills. Never approximated.
 *   then     the GEMM pipeline's resolve (canonical re-rank) and final (sort, write).
 * nA is chosen by the planner (engine.cu): larger for larger k, so that the expected
 * number of candidates stays a small multiple of k.
 *
 * SYMMETRIC SELF-JOIN (pass B in mode 2; engine.cu's host_sym). The queries are the
 * references (Q = R, local id = query index, every query's state live at once) and every
 * query has its tau from pass A. The CTA of query tile I (rows [256 I, 256 I + 256))
 * takes only the reference tiles from its own rows on: the two diagonal tiles feed the
 * rows' buffers alone (both (q, x) and (x, q) of the block are rows there), every later
 * tile feeds the rows' buffers AND the columns' buffers: reference x receives query q
 * when the same lower bound L(q, x) <= tau'_x. Tiles before the CTA's rows are some
 * earlier CTA's later tiles, so every ordered pair is tested once against the right
 * threshold with about half the tensor work. The bound is symmetric (it depends on s =
 * |q|^2 + |x|^2 and on the products, whichever operand is rounded to TF32 and which
 * truncated), and so is the canonical distance, so the candidate sets are those of the
 * plain pass: the same re-rank and final selection give the same bits. The column test:
 *   not a candidate of x  <=>  fadd_ru(acc, -p_i) < c'_x,  p_i = fmul_rd(la, |q|^2),
 *   c'_x = fsub_rd(fmul_rd(la, |x|^2), thr_x): then acc < p_i + c'_x <= la s - thr_x;
 * the maximum over a thread's rows decides for a whole column at once.
 *
 * SORTED TRIANGLE (host_sym where the band runs; launch_mma_sym_sort, sym_epilogue_sorted).
 * Any order of the points gives a triangle that meets every pair once, so the triangle
 * runs over the points in decreasing order of thr (rows, norms and thresholds gathered;
 * perm maps a sorted position back to the caller's id, and lists and entries stay the
 * caller's). Every column of a CTA's later tiles then has a threshold no larger than its
 * rows', so a pair that is a candidate of its column is also one of a slightly looser
 * row test, and the epilogue's quick test is pass B's row maximum alone (a row and a
 * column test a pair before). The rows that pass get both masks exactly, as above. Their
 * candidates go to a pool of pair entries, in a chunk per warp, and a scatter kernel
 * moves them into the lists afterwards, so no slot atomic waits on the tile's path. Every
 * pair still meets the same two tests once, so the lists hold the references they must,
 * and the re-rank makes the output bits independent of the order (the 1M graph appended
 * 112193152 candidates in either order). On that graph (one H100) the triangle drops from
 * about 530 ms to about 425 ms.
 *
 * SYMMETRIC WITNESSES (pass A of the self-join in mode 3: launch_mma_band, wgmma_ws_kernel
 * only). Pass A over a prefix of nA references costs n nA pairs for nA witnesses a row.
 * The band: CTA I (rows in tiles 2 I, 2 I + 1) takes the reference tiles (2 I + j) mod
 * RT, j < W, and each tile with j >= 2 feeds the witnesses of both its rows (per 64
 * columns, as pass A) and its columns (per 64 rows of the CTA: U(x, q) is the same
 * rigorous bound with the roles swapped, s and acc being symmetric). A row's witnesses are
 * then its band's columns (j < W, itself excluded) and the rows of the CTAs whose band
 * holds it (tiles T - W + 1 .. T - 1 of its tile T): about 256 (W - 1) references for
 * n 128 W pairs of tensor work, half of the prefix pass's for as many. The two sets are
 * disjoint while 2 W + 4 <= RT, and every group of 64 is a distinct set of references,
 * so the kk-th smallest witness still bounds the kk-th distance. Slots: a row's own
 * groups 2 j + h; a column's, from group m = 2 wg + mb of CTA I at band offset j, 2 W +
 * 2 j - m - 1 (2 j - m = 2 T - (4 I + m) mod 2 RT: distinct groups of real rows, 4 I + m
 * < 2 RT, distinct slots; a group of padding rows only writes nothing); ga = 4 W, and the
 * slots no CTA fills stay +inf (launch_mma_band fills them first).
 *
 * THE BOUNDS. acc is the fp32 accumulation of TF32 products q't x't: the same quantity as
 * cuBLAS's TF32 GEMM (T = -2 acc exactly), so engine.cu's TF32 derivation holds: with
 * s = |q|^2 + |x|^2 (float norms), |s - 2 acc - D| <= eps s + abs, eps <= mrel, abs <=
 * mabs. The queries are rounded to TF32 (cvt.rna) when staged; the references enter the
 * tensor cores as raw fp32 bits, which the hardware reads as TF32 (the 13 low bits are not
 * used: truncation), the case the bound already covers (2^-9 per product). Padded
 * dimensions are exact zeros. l2 / euclidean with p.center (engine.cu's center_wanted):
 * the passes see both sets centred on one mu and already rounded to TF32 (filter.cu's
 * center_rows_kernel), and the norms are those of x - mu: the same epilogue, with the
 * constants of plan_bounds for that case (about an eighth of the band on uniform data).
 * The epilogue evaluates, with directed roundings:
 *   U = fma_ru(acc, -2, fma_ru(s_up, ua, ub)) >= s (1 + mrel) + mabs - 2 acc >= D
 *       (s_up = fadd_ru(|q|^2, |x|^2), ua >= 1 + mrel, ub = mabs);
 *   not a candidate  <=>  acc < r = fma_rd(s_dn, la, -thr),  la <= (1 - mrel) / 2,
 *       thr >= (mabs + tau') / 2, s_dn = fadd_rd(...): then 2 acc < s (1 - mrel) - mabs
 *       - tau', i.e. L = s (1 - mrel) - mabs - 2 acc > tau' and D >= L > tau'.
 * Norms above 5e36, NaN or infinite become NaN: such pairs are never witnesses and always
 * candidates (the canonical value decides; huge inputs stay exact, only slower).
 * ip and cosine run the same kernels with other constants (engine.cu's mma_bounds): U and
 * the threshold are in units of twice the order key, ua is the relative margin itself
 * and la < 0; every rounding above keeps its direction whatever the signs.
 *
 * TWO SETS (pass B in mode 2 with rect = 1; engine.cu's host_pair, xknn_search_pair). The
 * queries are a set A and the references a disjoint set B, each with its own state (A's
 * at p.thr / p.cnt / p.cand, B's at p.cthr / p.ccnt / p.ccand; ids local to the other
 * set). Every CTA takes every reference tile, none is diagonal, and each tile feeds A's
 * rows and B's columns with the tests above: each pair of A x B is evaluated once for
 * both sides. Pass A runs twice (A's rows against a prefix of B, B's against a prefix of
 * A), and rescue and resolve once per side with the other set as the references. A side
 * whose running lists already hold k references a row (l2: the rows of an earlier
 * triangle or pair) skips its pass A and select: tau is its lists' k-th canonical value
 * (mma_list_thr_kernel), and what the pair adds is merged into those lists, so a
 * reference beyond tau' could not enter them. Such a side may end with fewer than kk
 * candidates; final pads them, and the merge keeps the lists' entries.
 *
 * THE KERNEL. A CTA keeps kMmaBM = 256 queries resident in shared memory (TF32, rows of
 * dpad + 4 floats: the padding makes the fragment loads conflict-free) and streams its
 * slice of reference tiles (kMmaBN = 128 rows) through a kMmaStages-deep cp.async ring of
 * 32-dimension chunks. 8 warps as 4 (queries) x 2 (references), each a 64 x 64 tile of
 * m16n8k8 mma.sync: 128 fp32 accumulators per thread. Within a 32-dimension chunk thread
 * t of a quad owns dimensions [8t, 8t + 8) of both operands (any assignment of dimensions
 * to the k slots is valid when A and B agree: it only permutes the summation), so each
 * operand is read with 16-byte loads, 4 per 2 mma k-steps. Launch: 256 threads, ~186 KB
 * dynamic shared memory at d = 128, one CTA per SM (about 200 registers a thread); grid
 * (query tiles, reference slices), query tiles fastest so the CTAs resident together
 * share reference tiles through L2 (each reference row is read from HBM about once).
 *
 * FP32 ON THE CUDA CORES (MmaParams.ffma: engine.cu's path fp32 where the references are
 * resident, l2 / euclidean). ffma_kernel (below) runs passes A and B with the same grid,
 * tiles, bounds and epilogue, and fp32 products summed with fmaf on the CUDA cores; the
 * queries are staged unrounded. select, rescue and re-rank are shared. acc is then an fp32
 * dot product in some order with FMA, the case of engine.cu's FP32 bound (plan_bounds
 * with tf32 = 0), which mma_bounds turns into the same epilogue constants.
 */
#ifdef XKNN_CUDA_PROFILE
#include <stdio.h>
#endif

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <thrust/iterator/reverse_iterator.h>

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
 * each (issuing four before writing any was not faster on the 1M self-join). */
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
 * pair, without a quick test. (A quick row and column maximum with a slow path behind
 * it was measured 2.7x slower than the plain search: with about 650 candidates per query
 * at n = 1M nearly every warp has a lane in the slow path on every tile.) The row mask
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

/*
 * MODE 0 = pass A (witnesses), 1 = pass B (filter), 2 = symmetric pass B (the CTA's
 * slices start at its own rows; see the header). VEC: 16-byte reference loads (R 16-byte
 * aligned, ldr and d multiples of 4).
 */
template <int MODE, bool VEC>
__global__ __launch_bounds__(kThreads, 1) void mma_kernel(const MmaParams p)
{
    extern __shared__ __align__(16) float smem[];
    const int dpad = (int)((p.d + kBK - 1) / kBK * kBK);
    const int dq = dpad + 4;
    float *Qs = smem;                      /* kBM x dq */
    float *Rs = Qs + kBM * dq;             /* kStages x kBN x kRowB */
    float *row_s = Rs + kStages * kBN * kRowB; /* kBM: per-row epilogue constant */
    float *rn_s = row_s + kBM;                 /* kRnSlots x kBN reference norms */
    float *prow_s = rn_s + 2 * kRnSlots * kBN; /* mode 2: after the thr ring, kBM p_i */

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;
    const int q0 = (int)blockIdx.x * kBM;
    int64_t t0, t1;
    cta_tiles<MODE>(p, q0, t0, t1);
    if (t0 >= t1) return;
    const int KC = dpad / kBK;
    const int64_t total = (t1 - t0) * KC;

    /* start the reference ring before staging the queries */
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < total) load_stage<MODE, VEC>(Rs + s * kBN * kRowB, rn_s, p, t0 + s / KC, s % KC);
        cp_async_commit();
    }
    for (int idx = tid; idx < kBM * dpad; idx += kThreads) {
        const int r = idx / dpad, c = idx - r * dpad;
        const int q = q0 + r;
        const float v = (q < p.qs && c < p.d) ? p.Q[(int64_t)q * p.ldq + c] : 0.0f;
        Qs[r * dq + c] = to_tf32(v);
    }
    /* per-row constants A_i / r_i and column terms C_j / c_j (stage_row_consts,
     * col_term):  U = fma_ru(acc, -2, fadd_ru(A_i, C_j)) >= (1 + mrel) s + mabs - 2 acc,
     *   fadd_rd(c_j, r_i) <= la s - thr, so acc < it implies L > tau' (see the header). */
    stage_row_consts<MODE>(row_s, prow_s, p, q0, kBM, kThreads);

    float acc[4][8][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

    const float *Aw = Qs + (wm * 64 + g) * dq + 8 * t;
    const int boff = (wn * 64 + g) * kRowB + 8 * t;
    /* ring positions by counters (no 64-bit division per chunk): chunk kc of tile `tile`
     * in stage stg; the chunk loaded next (it + kStages - 1) is lkc of ltile, stage lst */
    int kc = KC - 1, stg = kStages - 1;
    int64_t tile = t0 - 1;
    int lkc = (kStages - 1) % KC, lst = kStages - 1;
    int64_t ltile = t0 + (kStages - 1) / KC;

#pragma unroll 1
    for (int64_t it = 0; it < total; ++it) {
        if (++kc == KC) {
            kc = 0;
            ++tile;
        }
        if (++stg == kStages) stg = 0;
        cp_async_wait<kStages - 2>();
        __syncthreads();
        if (it + kStages - 1 < total) load_stage<MODE, VEC>(Rs + lst * kBN * kRowB, rn_s, p, ltile, lkc);
        cp_async_commit();
        if (++lkc == KC) {
            lkc = 0;
            ++ltile;
        }
        if (++lst == kStages) lst = 0;
        const float *A = Aw + kc * kBK;
        const float *B = Rs + stg * kBN * kRowB + boff;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float4 a[4][2], b[8];
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                a[mi][0] = *reinterpret_cast<const float4 *>(A + (mi * 16) * dq + 4 * h);
                a[mi][1] = *reinterpret_cast<const float4 *>(A + (mi * 16 + 8) * dq + 4 * h);
            }
#pragma unroll
            for (int ni = 0; ni < 8; ++ni) b[ni] = *reinterpret_cast<const float4 *>(B + ni * 8 * kRowB + 4 * h);
            /* k-step 2h, then 2h + 1: 32 independent accumulators between dependent mma */
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 8; ++ni)
                    mma_tf32(acc[mi][ni], a[mi][0].x, a[mi][1].x, a[mi][0].y, a[mi][1].y, b[ni].x, b[ni].y);
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 8; ++ni)
                    mma_tf32(acc[mi][ni], a[mi][0].z, a[mi][1].z, a[mi][0].w, a[mi][1].w, b[ni].z, b[ni].w);
        }
        if (kc != KC - 1) continue;

        /* ---- epilogue of reference tile `tile` ---- */
        const int64_t ref0 = tile * kBN + wn * 64;
        const float *rnt = rn_s + (int)(tile % kRnSlots) * kBN + wn * 64;
        if (MODE == 2) {
            sym_epilogue_mma(p, acc, rnt, rn_s + kRnSlots * kBN + (int)(tile % kRnSlots) * kBN + wn * 64, row_s,
                             prow_s, wm * 64 + g, q0, ref0, t, p.rect || tile * kBN >= (int64_t)q0 + kBM);
        } else {
            mma_epilogue<MODE>(p, acc, row_s, wm * 64 + g, q0, ref0, t);
        }
#pragma unroll
        for (int mi = 0; mi < 4; ++mi)
#pragma unroll
            for (int ni = 0; ni < 8; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
    }
    cp_async_wait<0>();
}

/* ---- fp32 on the CUDA cores: ffma_kernel (MmaParams.ffma, modes 0 and 1) -------------
 * The grid, ring, passes and epilogue of mma_kernel with 16 warps of 64 accumulators a
 * thread instead of 8 warps of 128, so that 4 warps per scheduler hide the latency of
 * shared memory. The CTA tile is the same 256 queries x 128 references; warp w takes
 * rows 16 w .. 16 w + 15 against all 128 columns. Lane (g, t) = (lane / 4, lane % 4)
 * owns rows 16 w + t + 4 i (i = 0..3) and columns 64 h + 8 ni + 2 u + c (h = g / 4, u =
 * g % 4, m = 2 ni + c = 0..15): the 4 threads that share a row's 64-column witness group
 * are lanes 4 apart, which mma_epilogue<MODE, 2, 8, 4, 4, 8> handles with u in the role
 * of the fragment's t. Both operands are stored dimension-major; within a dimension a
 * thread's 4 rows (16 columns) are contiguous, so one dimension is one 16-byte load of
 * rows and four of columns, and the column groups are swizzled by (u >> 1) | 2 h so that
 * the 8 distinct addresses of a warp's load fall in distinct banks. Rows vary with t and
 * columns with g because a 16-byte shared load costs one wavefront per distinct address
 * within a quarter warp (ncu): 4 + 4 x 2 wavefronts per dimension and warp, against 2 + 4
 * x 4 with the roles the other way round, which made the kernel shared-memory bound.
 * Reference chunks arrive transposed by 4-byte cp.async (8 a thread, 32-byte runs of
 * global memory). Each accumulator sums its dimensions in order with fmaf: an fp32 dot
 * product, the case of engine.cu's FP32 bound. */
constexpr int kFfThreads = 512;
constexpr int kFfBK = 64;           /* dimensions per ring stage: one barrier per 64 */
constexpr int kFfStages = 2;        /* ring depth: a stage loads while the other is used */
/* dimensions per loop trip (ffma_kernel's U). ptxas loads the next dimension's operands
 * during the current one's products within a trip, but not across the loop's back edge,
 * so the first dimension of every trip waits on its loads (ncu on W1's pass B: the
 * short-scoreboard stalls were 29 % of the samples, most on FFMAs). Longer trips wait less
 * often. One H100, W1 fp32 against unroll 8 (60.03-60.07 ms): 16 59.60-59.64, 32
 * 59.46-59.52, 64 59.29-59.35 ms; but with 64 everywhere nq = 300 (a last tile of 44
 * rows) went 2.52 -> 2.89 ms. So grids whose last tile is mostly full take 64, and a
 * light last tile, pass A and the kernel carrying its accumulators (which spills at 64)
 * take 16: W1 fp32 60.01-60.05 -> 58.90-58.97 ms, nq = 300 2.54 -> 2.50 ms, k = 100
 * 65.90 -> 64.94 ms (another H100). */
constexpr int kFfUnroll = 16, kFfUnrollFull = 64;
constexpr int kFfPitch = kBN + 4;   /* floats per dimension of a staged reference chunk */

/* position of query row r (of the CTA's kBM) within a dimension of the staged queries */
__device__ __forceinline__ int ff_qpos(int r) { return (r >> 4) * 16 + (r & 3) * 4 + ((r >> 2) & 3); }

/* position of reference row j (of a kBN tile) within a dimension of a staged chunk */
__device__ __forceinline__ int ff_rpos(int j)
{
    const int h = j >> 6, ni = (j >> 3) & 7, u = (j >> 1) & 3, m = 2 * ni + (j & 1);
    return h * 64 + u * 16 + 4 * ((m >> 2) ^ ((u >> 1) | (h << 1))) + (m & 3);
}

/* Per-thread constants of ff_load_stage: the thread copies dimensions kq + 8 b (kq = tid
 * % 8, b = 0..7) of rows jq + 64 a (jq = tid / 8, a = 0, 1) of a chunk: a warp covers 4
 * rows x 8 dimensions, four 32-byte runs. dst[a] = ff_rpos(jq + 64 a) + kq kFfPitch. */
struct FfCopy {
    int dst[2];
    int kq, jq;
};

__device__ __forceinline__ FfCopy ff_copy_init()
{
    FfCopy c;
    const int tid = (int)threadIdx.x;
    c.kq = tid & 7;
    c.jq = tid >> 3;
#pragma unroll
    for (int a = 0; a < 2; ++a) c.dst[a] = ff_rpos(c.jq + 64 * a) + c.kq * kFfPitch;
    return c;
}

/* chunk kc of reference tile `tile`, transposed: stage[k * kFfPitch + ff_rpos(j)];
 * rows >= n and dimensions >= d are zero-filled (checked only for a chunk that has any) */
__device__ __forceinline__ void ff_load_stage(float *stage, const MmaParams &p, const FfCopy &fc, int64_t tile, int kc)
{
    static_assert(kBN * kFfBK / kFfThreads == 16 && kBN == 128 && kFfBK == 64, "2 rows x 8 dimensions a thread");
    const int64_t ref0 = tile * kBN;
    const int k0 = kc * kFfBK;
    const float *src = p.R + (ref0 + fc.jq) * p.ldr + k0 + fc.kq;
    const int64_t ld64 = 64 * p.ldr;
    if (ref0 + kBN <= p.n && k0 + kFfBK <= p.d) {
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
            for (int b = 0; b < 8; ++b) cp_async4(stage + fc.dst[a] + 8 * b * kFfPitch, src + a * ld64 + 8 * b, 4);
    } else {
#pragma unroll
        for (int a = 0; a < 2; ++a) {
            const bool row = ref0 + fc.jq + 64 * a < p.n;
#pragma unroll
            for (int b = 0; b < 8; ++b) {
                const bool ok = row && k0 + fc.kq + 8 * b < p.d;
                cp_async4(stage + fc.dst[a] + 8 * b * kFfPitch, ok ? src + a * ld64 + 8 * b : p.R, ok ? 4 : 0);
            }
        }
    }
}

template <int MODE, bool CARRY, int U>
__global__ __launch_bounds__(kFfThreads, 1) void ffma_kernel(const MmaParams p)
{
    static_assert(MODE == 0 || MODE == 1, "passes A and B only");
    static_assert(kFfBK % U == 0, "whole trips per stage");
    static_assert(kBM == 256 && kBN == 128, "the layout assumes these tiles");
    extern __shared__ __align__(16) float smem[];
    const int dpad = (int)((p.d + kFfBK - 1) / kFfBK * kFfBK);
    float *Qt = smem;                                 /* dpad x kBM */
    float *Rs = Qt + dpad * kBM;                      /* kFfStages x kFfBK x kFfPitch */
    float *row_s = Rs + kFfStages * kFfBK * kFfPitch; /* kBM: per-row epilogue constant */

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int h = g >> 2, u = g & 3;
    const int q0 = (p.qt0 + (int)blockIdx.x) * kBM;
    /* a warp whose 16 rows are all past the queries (in the last query tile) only copies
     * and waits at the barriers: its products and epilogue would all be discarded (100
     * queries on an H100: 1.87 -> 1.20 ms) */
    const bool idle = q0 + warp * 16 >= p.qs;
    int64_t t0, t1;
    cta_tiles<MODE>(p, q0, t0, t1);
    if (t0 >= t1) return;
    const int KC = dpad / kFfBK;
    const int64_t total = (t1 - t0) * KC;
    const FfCopy fc = ff_copy_init();

#pragma unroll
    for (int s = 0; s < kFfStages - 1; ++s) {
        if (s < total) ff_load_stage(Rs + s * kFfBK * kFfPitch, p, fc, t0 + s / KC, s % KC);
        cp_async_commit();
    }
    /* The queries, transposed: the lanes of a load take 32 consecutive rows, whose
     * positions fall in 32 distinct banks. With 16-byte aligned rows each lane loads 4
     * dimensions at once (a quarter of the scattered sectors of 4-byte loads, which cost
     * a CTA about a tile's time in L2 traffic). */
    if (((uintptr_t)p.Q & 15) == 0 && (p.ldq & 3) == 0) {
        for (int idx = tid; idx < kBM * dpad / 4; idx += kFfThreads) {
            const int r = idx & (kBM - 1), c = idx / kBM * 4;
            const int q = q0 + r;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (q < p.qs && c < p.d) {
                const float *src = p.Q + (int64_t)q * p.ldq + c;
                if (c + 4 <= p.d) {
                    v = __ldg(reinterpret_cast<const float4 *>(src));
                } else {
                    v.x = src[0];
                    if (c + 1 < p.d) v.y = src[1];
                    if (c + 2 < p.d) v.z = src[2];
                }
            }
            float *dst = Qt + c * kBM + ff_qpos(r);
            dst[0] = v.x;
            dst[kBM] = v.y;
            dst[2 * kBM] = v.z;
            dst[3 * kBM] = v.w;
        }
    } else {
        for (int idx = tid; idx < kBM * dpad; idx += kFfThreads) {
            const int r = idx & (kBM - 1), c = idx / kBM;
            const int q = q0 + r;
            Qt[c * kBM + ff_qpos(r)] = (q < p.qs && c < p.d) ? p.Q[(int64_t)q * p.ldq + c] : 0.0f;
        }
    }
    stage_row_consts<MODE>(row_s, nullptr, p, q0, kBM, kFfThreads);

    float acc[2][8][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

    const float *Aw = Qt + warp * 16 + t * 4;
    const int bsw = (u >> 1) | (h << 1);
    const int bw = h * 64 + u * 16;
    int kc = KC - 1, stg = kFfStages - 1;
    int64_t tile = t0 - 1;
    int lkc = (kFfStages - 1) % KC, lst = kFfStages - 1;
    int64_t ltile = t0 + (kFfStages - 1) / KC;

#pragma unroll 1
    for (int64_t it = 0; it < total; ++it) {
        if (++kc == KC) {
            kc = 0;
            ++tile;
        }
        if (++stg == kFfStages) stg = 0;
        cp_async_wait<kFfStages - 2>();
        __syncthreads();
        if (it + kFfStages - 1 < total) ff_load_stage(Rs + lst * kFfBK * kFfPitch, p, fc, ltile, lkc);
        cp_async_commit();
        if (++lkc == KC) {
            lkc = 0;
            ++ltile;
        }
        if (++lst == kFfStages) lst = 0;
        if (idle) continue;
        const float *A = Aw + kc * kFfBK * kBM;
        const float *B = Rs + stg * kFfBK * kFfPitch + bw;
#pragma unroll U
        for (int k = 0; k < kFfBK; ++k) {
            const float4 a4 = *reinterpret_cast<const float4 *>(A + k * kBM);
            float4 b4[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) b4[e] = *reinterpret_cast<const float4 *>(B + k * kFfPitch + 4 * (e ^ bsw));
            const float a[4] = {a4.x, a4.y, a4.z, a4.w};
            /* The 64 products of the dimension, each column's 4 rows in a row (ptxas gives
             * the column a reuse chain) in the order i = c + o_p (mod 4), c = m % 4, o =
             * 0, 3, 1, 2 (mode 1) or 3, 1, 0, 2 (mode 0): with a[i] in register bank i and
             * b[m] in bank c, these orders got ptxas's fewest FFMAs whose operands not
             * marked .reuse share a bank (counted in the loop's SASS, CUDA 13 ptxas, at
             * trips of 8: <1, false> 57 -> 1, <0, false> 137 -> 14; with the trips of
             * kFfUnrollFull and kFfUnroll, <1, false, 64> has 5 of 4096 and <1, false,
             * 16> 7 of 1024). On one H100 (W1 fp32) orders
             * with 1, 34, 57 and 110 such FFMAs ran 60.06, 60.73, 60.37 and 61.33 ms.
             * With the accumulators carried (CARRY) the order 2, 0, 3, 1 was faster
             * (k = 100: 65.85 against 66.24 ms), though it has more of them (102 against
             * 13). Only the order of independent FMAs changes: each accumulator still
             * adds its dimensions in order, with the same fmaf. */
            constexpr int kOrd = MODE == 0 ? 0x2013 : CARRY ? 0x1302 : 0x2130; /* o_p = kOrd >> 4 p & 15 */
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float b[4] = {b4[e].x, b4[e].y, b4[e].z, b4[e].w};
#pragma unroll
                for (int c = 0; c < 4; ++c)
#pragma unroll
                    for (int p = 0; p < 4; ++p) {
                        const int i = (c + (kOrd >> (4 * p) & 15)) & 3;
                        /* column m = 4 e + c: ni = 2 e + (c >> 1), element 2 (i & 1) + (c & 1) */
                        float &r = acc[i >> 1][2 * e + (c >> 1)][2 * (i & 1) + (c & 1)];
                        r = fmaf(a[i], b[c], r);
                    }
            }
        }
        if (kc != KC - 1) continue;

        mma_epilogue<MODE, 2, 8, 4, 4, 8, CARRY>(p, acc, row_s, warp * 16 + t, q0, tile * kBN + h * 64, u);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int ni = 0; ni < 8; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
    }
    cp_async_wait<0>();
}

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
 * the next barrier, so 64-dimension chunks halve the drains and barriers per tile (W1 on
 * an H100: 22.7 against 24.6 ms in the same call). Witness groups are the two 64-column
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
 * tile's last wgmma, so that their latency hides behind the tensor work (ncu: long-
 * scoreboard stalls were the largest share in passes B and the self-join triangle). In
 * the SASS, ptxas keeps modes 0 and 1's 32 loads before the wait (one H100: W1 10.74 ->
 * 10.14-10.34 ms, W2 15.27 -> 14.76-15.00, k = 1024 20.1 -> 19.7) but puts mode 2's 64
 * after it (register pressure), so the triangle is unchanged. */
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

/* Mode 2 epilogue on rows sorted by decreasing threshold (p.perm; engine.cu's host_sym,
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

template <int MODE, bool VEC, int KB>
__global__ __launch_bounds__(kThreads, 1) void wgmma_kernel(const MmaParams p)
{
#ifdef XKNN__HAVE_WGMMA
    extern __shared__ __align__(16) float smem[];
    const int dpad = (int)((p.d + kBK - 1) / kBK * kBK); /* a multiple of KB (wgmma_chunk_of) */
    const int kp = dpad / 4; /* k-groups of a query row */
    float *Qs = smem;                          /* kBM x dpad, core-matrix layout */
    float *Rs = Qs + kBM * dpad;               /* kGStages x kBN x KB, core-matrix layout */
    float *row_s = Rs + kGStages * kBN * KB;   /* kBM */
    float *rn_s = row_s + kBM;                 /* kRnSlots x kBN */
    float *prow_s = rn_s + 2 * kRnSlots * kBN; /* mode 2: after the thr ring, kBM p_i */

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wg = warp >> 2, wi = warp & 3;
    const int q0 = (int)blockIdx.x * kBM;
    int64_t t0, t1;
    cta_tiles<MODE>(p, q0, t0, t1);
    if (t0 >= t1) return;
    const int KC = dpad / KB;
    const int64_t total = (t1 - t0) * KC;

#pragma unroll
    for (int s = 0; s < kGStages - 1; ++s) {
        if (s < total) gload_stage<MODE, VEC, KB>(Rs + s * kBN * KB, rn_s, p, t0 + s / KC, s % KC);
        cp_async_commit();
    }
    for (int idx = tid; idx < kBM * dpad; idx += kThreads) {
        const int r = idx / dpad, c = idx - r * dpad;
        const int q = q0 + r;
        const float v = (q < p.qs && c < p.d) ? p.Q[(int64_t)q * p.ldq + c] : 0.0f;
        Qs[((r >> 3) * kp + (c >> 2)) * 32 + (r & 7) * 4 + (c & 3)] = to_tf32(v);
    }
    stage_row_consts<MODE>(row_s, prow_s, p, q0, kBM, kThreads);

    float acc[2][64];
#pragma unroll
    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[mb][e] = 0.0f;
    /* this warpgroup's two m64 blocks of queries: rows 128 wg + 64 mb */
    const float *Am[2] = {Qs + ((wg * 128) >> 3) * kp * 32, Qs + ((wg * 128 + 64) >> 3) * kp * 32};
    const unsigned sboA = (unsigned)kp * 128u;

    /* Pipeline: chunk it + 2 is loaded into the stage chunk it - 1 used; each chunk's
     * wgmma are waited for before the next barrier (a measured variant keeping one chunk
     * in flight with a 4-deep ring made the compiler serialise the wgmma instead). */
#pragma unroll 1
    for (int64_t it = 0; it < total; ++it) {
        cp_async_wait<kGStages - 2>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        {
            const int64_t nx = it + kGStages - 1;
            if (nx < total)
                gload_stage<MODE, VEC, KB>(Rs + (int)(nx % kGStages) * kBN * KB, rn_s, p, t0 + nx / KC, (int)(nx % KC));
            cp_async_commit();
        }
        const int kc = (int)(it % KC);
        const float *Bst = Rs + (int)(it % kGStages) * kBN * KB;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < KB / 8; ++s) {
            const uint64_t db = gmma_desc(Bst + 2 * s * 32, 128u, (KB / 4) * 128u);
#pragma unroll
            for (int mb = 0; mb < 2; ++mb)
                wgmma_m64n128k8(acc[mb], gmma_desc(Am[mb] + (kc * (KB / 4) + 2 * s) * 32, 128u, sboA), db);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (kc != KC - 1) continue;

        /* ---- epilogue of reference tile `tile` ---- */
        const int64_t tile = t0 + it / KC;
        WgTerms<MODE> T;
        wg_load_terms<MODE>(T, p, tile, t);
        wg_epilogue<MODE>(p, acc, tile, T, row_s, prow_s, wg, wi, g, t, q0);
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
#pragma unroll
            for (int e = 0; e < 64; ++e) acc[mb][e] = 0.0f;
    }
    cp_async_wait<0>();
#else
    (void)p;
    __trap(); /* never launched: the host takes this kernel only for sm_90a code */
#endif
}

/* ---- Hopper, warp-specialized: the same passes with a producer and ping-pong consumers ----
 * wgmma_kernel's two warpgroups wait for their tensor work and then run the epilogue
 * together, so the tensor pipe idles through every epilogue (ncu on W1's pass B: 28 % of
 * its peak, 70 % of cycles without an eligible warp). Here a CTA has three warpgroups:
 *   producer  (warpgroup 0, 56 registers): streams 32-dimension reference chunks by
 *             cp.async into an S-deep ring; each stage has a `full` mbarrier (its 128
 *             threads arrive when their copies land) and an `empty` one (the 8 consumer
 *             warps arrive when their wgmma reading it are done);
 *   consumers (warpgroups 1 and 2, 224 registers): 128 resident queries each, as in
 *             wgmma_kernel, taking turns on the tensor pipe: consumer 1 issues tile T's
 *             wgmma only after consumer 0 has issued its own (named barrier 2), and
 *             consumer 0 those of tile T + 1 only after consumer 1 has issued T's
 *             (named barrier 1). So one consumer's epilogue runs while the other's wgmma
 *             execute, and the tensor pipe sees the two in a fixed alternation.
 * A chunk is released as soon as the wgmma reading it complete (one wgmma group kept in
 * flight), so the producer refills while the later consumer still works on the tile.
 * The epilogue reads a tile's norms (and mode 2's thresholds) from global memory: 512
 * bytes a tile each, shared by the CTA's warps, L1/L2 hits, and read-only during a pass.
 * (A shared ring refilled by the producer cost no less and needed a fence between the
 * consumers' reads and the refill.) The chunks
 * land in the generic proxy; each consumer fences (fence.proxy.async) after its `full`
 * wait, before the wgmma that read them. Both operands are stored 128-byte swizzled
 * (gmma_desc_sw128; 3-4 % faster than the core-matrix layout of wgmma_kernel on the W1,
 * W2 and self-join rows). Same bounds, same epilogue (wg_epilogue), same candidates and
 * witnesses as wgmma_kernel: only the schedule and the layout differ. Launch: 384
 * threads, S from the shared memory left after the queries (5 at d = 128). */
constexpr int kWsThreads = 384;
constexpr int kWsMaxStages = 12;

/* wgmma_ws_kernel's shared memory with S stages: queries, row constants (mode 2's p_i
 * too), S chunks, barriers, and up to 1024 bytes to align the operands. */
__host__ __device__ constexpr size_t ws_smem_bytes(int64_t dpad, int S)
{
    return sizeof(float) * (size_t)(kBM * dpad + 2 * kBM + (int64_t)S * kBN * 32) +
           2 * kWsMaxStages * sizeof(uint64_t) + 8 * kBN * 2 * sizeof(float) /* mode 2's term copies */ + 1024;
}

#ifdef XKNN__HAVE_WGMMA /* (only the sm_90a kernel body uses it) */
/* The producer's copy of one 32-dimension chunk of tile `tile` (gload_stage's layout and
 * zero fill, 128 threads) in the 128-byte-swizzled layout: row j's 128 bytes at 128 j, its
 * 16-byte piece c at piece c ^ (j % 8). Thread tid owns piece (tid / 8) % 8 of rows
 * 8 (tid / 64) + tid % 8 + 16 i, i < 8, so its 8 sources are 16 rows apart. */
__device__ __forceinline__ void ws_load_chunk(float *stage, const MmaParams &p, int64_t tile, int kc, int tid)
{
    const int jr = tid & 7, c4 = (tid >> 3) & 7, jg = tid >> 6;
    const int col = kc * 32 + 4 * c4;
    const int64_t j = tile * kBN + jg * 8 + jr;
    const float *src = p.R + j * p.ldr + col;
    const int64_t step = 16 * p.ldr;
    float *dst = stage + (jg * 8 + jr) * 32 + (c4 ^ jr) * 4; /* 128-byte swizzle: row % 8 == jr */
    const bool colok = col < p.d;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const bool ok = colok && j + 16 * i < p.n;
        cp_async16(dst + 512 * i, ok ? src : p.R, ok ? 16 : 0);
        src += step;
    }
}
#endif

template <int MODE, bool SORTED = false>
__global__ __launch_bounds__(kWsThreads, 1) void wgmma_ws_kernel(const MmaParams p, int S)
{
#ifdef XKNN__HAVE_WGMMA
    constexpr int KB = 32;
    extern __shared__ __align__(16) float smem_raw[];
    const int dpad = (int)((p.d + kBK - 1) / kBK * kBK);
    /* the swizzle pattern follows address bits, so both operands start 1024-aligned */
    /* (an offset from smem_raw, not an integer round trip, so that the compiler keeps the
     * shared address space: shared loads and stores instead of generic ones) */
    float *Qs = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u) / sizeof(float);
    float *Rs = Qs + kBM * dpad;            /* S x kBN x KB: swizzled rows of 128 bytes */
    float *row_s = Rs + S * kBN * KB;       /* kBM */
    float *prow_s = row_s + kBM;            /* kBM (mode 2) */
    uint64_t *full = reinterpret_cast<uint64_t *>(prow_s + kBM);
    uint64_t *empty = full + kWsMaxStages;
    float2 *terms_s = reinterpret_cast<float2 *>(empty + kWsMaxStages); /* mode 2: kBN a consumer warp; mode 3: wbuf */

    const int tid = (int)threadIdx.x, warp = tid >> 5;
    const int role = warp >> 2; /* 0 producer, 1 and 2 consumers */
    const int q0 = (int)blockIdx.x * kBM;
    int64_t t0, t1;
    cta_tiles<MODE>(p, q0, t0, t1);
    if (t0 >= t1) return;
    const int64_t RT = (p.n + kBN - 1) / kBN; /* (mode 3's virtual tiles wrap at RT) */
    const int KC = dpad / KB;
    const int64_t total = (t1 - t0) * KC;

    if (tid == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(full + s, 128); /* the producer's threads, one cp.async arrival each */
            mbar_init(empty + s, 8);  /* the consumer warps */
        }
    }
    __syncthreads();

    if (role == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
        const int ptid = tid; /* 0..127 */
        /* stage s of round `round` (its parity); no division in the loop */
        int s = 0, kc = 0;
        unsigned round = 0;
        int64_t tile = t0;
        XKNN_PROF(unsigned long long pw = 0, pl = 0;)
#pragma unroll 1
        for (int64_t it = 0; it < total; ++it) {
            XKNN_PROF(const unsigned long long a0 = clock64();)
            if (round > 0) mbar_wait(empty + s, (round - 1) & 1);
            XKNN_PROF(const unsigned long long a1 = clock64(); pw += a1 - a0;)
            ws_load_chunk(Rs + s * kBN * KB, p, MODE == 3 && tile >= RT ? tile - RT : tile, kc, ptid);
            mbar_arrive_cp_async(full + s);
            XKNN_PROF(pl += clock64() - a1;)
            if (++s == S) {
                s = 0;
                ++round;
            }
            if (++kc == KC) {
                kc = 0;
                ++tile;
            }
        }
        cp_async_wait<0>();
        XKNN_PROF(if ((tid & 31) == 0) {
            atomicAdd(&g_ws_prof[MODE][10], pw);
            atomicAdd(&g_ws_prof[MODE][11], pl);
            atomicAdd(&g_ws_prof[MODE][12], 1ull);
        })
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
    const int ctid = tid - 128; /* 0..255 */
    const int lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wg = role - 1, wi = warp & 3;
    /* queries: TF32 into 32-dimension blocks (c / 32) of kBM swizzled rows of 128 bytes;
     * 16-byte loads, 8 in flight per thread (d % 4 == 0 here: VEC), where Q allows */
    if (((uintptr_t)p.Q % 16) == 0 && p.ldq % 4 == 0) {
        const int dq = dpad / 4;
        for (int base = ctid; base < kBM * dq; base += 256 * 8) {
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int idx = base + u * 256, r = idx / dq, c = 4 * (idx - r * dq);
                const int q = q0 + r;
                v[u] = idx < kBM * dq && q < p.qs && c < p.d
                           ? __ldg(reinterpret_cast<const float4 *>(p.Q + (int64_t)q * p.ldq + c))
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                const int idx = base + u * 256, r = idx / dq, c = 4 * (idx - r * dq);
                if (idx < kBM * dq) {
                    const float4 w = make_float4(to_tf32(v[u].x), to_tf32(v[u].y), to_tf32(v[u].z), to_tf32(v[u].w));
                    *reinterpret_cast<float4 *>(Qs + ((c >> 5) * kBM + r) * 32 + ((((c >> 2) & 7) ^ (r & 7)) << 2)) = w;
                }
            }
        }
    } else {
        for (int idx = ctid; idx < kBM * dpad; idx += 256) {
            const int r = idx / dpad, c = idx - r * dpad;
            const int q = q0 + r;
            const float v = (q < p.qs && c < p.d) ? p.Q[(int64_t)q * p.ldq + c] : 0.0f;
            Qs[((c >> 5) * kBM + r) * 32 + ((((c >> 2) & 7) ^ (r & 7)) << 2) + (c & 3)] = to_tf32(v);
        }
    }
    stage_row_consts<MODE>(row_s, prow_s, p, q0, kBM, 256, ctid);
    named_sync(3, 256); /* the queries and row constants are in place */

    float acc[2][64];
#pragma unroll
    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[mb][e] = 0.0f;
    const float *Am[2] = {Qs + (wg * 128) * 32, Qs + (wg * 128 + 64) * 32};

    /* matrix descriptors: the start address moves by 16-byte units (a k-step is 32 bytes,
     * a query block of 32 dimensions kBM * 128 bytes, a stage kBN * 128 bytes); adding to
     * the descriptor is exact, as every address stays below 2^18 */
    const uint64_t dA0 = gmma_desc_sw128(Am[0]), dA1 = gmma_desc_sw128(Am[1]), dB = gmma_desc_sw128(Rs);
    /* the sorted triangle's bound on m_x over the CTA's later columns (sym_epilogue_sorted) */
    float msuf = INFINITY;
    unsigned long long wcur = 0, wend = 0; /* the warp's chunk of the pool (sorted: pool_append) */
    if constexpr (SORTED) {
        const int64_t f0 = (int64_t)(q0 + kBM) / kBN, f = (f0 > t0 ? f0 : t0) * kBN; /* the first later column */
        msuf = f < p.n ? p.msuf[f] : INFINITY;
    }
    int s = 0; /* the stage of the next chunk and its round's parity */
    unsigned ph = 0;
    XKNN_PROF(unsigned long long pr[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};)
#pragma unroll 1
    for (int64_t tile = t0; tile < t1; ++tile) {
        __syncwarp(); /* bar.sync counts whole warps: converge after the epilogue's branches */
        XKNN_PROF(const unsigned long long c0 = clock64();)
        if (wg == 1 || tile != t0) named_sync(wg == 0 ? 1 : 2, 256); /* this consumer's turn */
        XKNN_PROF(const unsigned long long c1 = clock64(); pr[0] += c1 - c0;)
        int prev = -1;
#pragma unroll 1
        for (int kc = 0; kc < KC; ++kc) {
            mbar_wait(full + s, ph);
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            const uint64_t db = dB + (uint64_t)(s * (kBN * KB * 4 / 16));
            const uint64_t da = (uint64_t)(kc * (kBM * 32 * 4 / 16));
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int k8 = 0; k8 < KB / 8; ++k8) {
                /* k-step k8 is 32 bytes into each swizzled row */
                wgmma_m64n128k8(acc[0], dA0 + da + 2 * k8, db + 2 * k8);
                wgmma_m64n128k8(acc[1], dA1 + da + 2 * k8, db + 2 * k8);
            }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            if (prev >= 0) {
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
                __syncwarp(); /* the warp's earlier shared reads precede lane 0's release */
                if (lane == 0) mbar_arrive(empty + prev);
            }
            prev = s;
            if (++s == S) {
                s = 0;
                ph ^= 1;
            }
        }
        /* the other consumer's turn: consumer 1 does not signal after the last tile */
        if (wg == 0)
            named_arrive(2, 256);
        else if (tile + 1 < t1)
            named_arrive(1, 256);
        XKNN_PROF(const unsigned long long c2 = clock64(); pr[1] += c2 - c1; unsigned long long c3 = c2;)
        if constexpr (MODE == 2) {
            /* the tile's 128 (c_j, c'_x) pairs (1 KiB) copied by cp.async into the warp's
             * own area while the last wgmma run: no registers held across the wait (64
             * registers of them made ptxas load them after it). The area is rewritten
             * only after the warp's previous epilogue (the __syncwarp at the tile's top). */
            float2 *ts = terms_s + (warp - 4) * kBN;
            const float2 *src = reinterpret_cast<const float2 *>(p.ct) + tile * kBN;
            cp_async16(ts + 2 * lane, src + 2 * lane, 16);
            cp_async16(ts + 64 + 2 * lane, src + 64 + 2 * lane, 16);
            cp_async_commit();
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            __syncwarp();
            if (lane == 0) mbar_arrive(empty + prev);
            cp_async_wait<0>();
            __syncwarp();
            XKNN_PROF(c3 = clock64();)
            if constexpr (SORTED)
                sym_epilogue_sorted(p, acc, SymTermsSmem{ts + 2 * t}, row_s, prow_s, msuf, wg * 128 + wi * 16 + g, q0,
                                    tile * kBN, t, tile * kBN >= (int64_t)q0 + kBM, wcur, wend XKNN_PROF(, pr));
            else
                sym_epilogue_wg(p, acc, SymTermsSmem{ts + 2 * t}, row_s, prow_s, wg * 128 + wi * 16 + g, q0,
                                tile * kBN, t, p.rect || tile * kBN >= (int64_t)q0 + kBM XKNN_PROF(, pr));
        } else if constexpr (MODE == 3) {
            const int64_t rt = tile >= RT ? tile - RT : tile;
            WgTerms<3> T;
            wg_load_terms<3>(T, p, rt, t);
            /* the column side's C_x of column wi * 32 + lane (ct has round_up(n, kBN) entries) */
            const float cx = __ldg(p.ct + rt * kBN + wi * 32 + lane);
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            __syncwarp();
            if (lane == 0) mbar_arrive(empty + prev);
            XKNN_PROF(c3 = clock64();)
            band_epilogue_wg(p, acc, T, cx, row_s, prow_s, reinterpret_cast<float *>(terms_s) + wg * 4 * 2 * kBN, wg,
                             wi, g, t, lane, q0, rt * kBN, (int)(tile - q0 / kBN));
        } else {
            /* the tile's column terms from global memory (L1/L2), loaded while the tile's
             * last wgmma run */
            WgTerms<MODE> T;
            wg_load_terms<MODE>(T, p, tile, t);
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            __syncwarp();
            if (lane == 0) mbar_arrive(empty + prev);
            XKNN_PROF(c3 = clock64();)
            wg_epilogue<MODE>(p, acc, tile, T, row_s, prow_s, wg, wi, g, t, q0);
        }
        XKNN_PROF(pr[2] += c3 - c2; pr[3] += clock64() - c3; pr[9] += 1;)
        /* zeroed after the epilogue, so they are dead across the appenders' calls */
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
#pragma unroll
            for (int e = 0; e < 64; ++e) acc[mb][e] = 0.0f;
    }
    XKNN_PROF(if (lane == 0) for (int i = 0; i < 10; ++i) atomicAdd(&g_ws_prof[MODE][i], pr[i]);)
#else
    (void)p;
    (void)S;
    __trap(); /* never launched: the host takes this kernel only for sm_90a code */
#endif
}

/* tau = kk-th smallest witness of each query (+inf when fewer than kk groups), and the
 * pass-B threshold thr = (mabs + tau') / 2 rounded up. One block per query (grid-stride);
 * 4 radix passes over the query's ga witnesses as order_enc keys (ip's witnesses may be
 * negative; a witness is NaN only when every pair of its group is, and order_enc puts
 * the canonical NaN last). tau' = tau_prime(tau) for tau >= 0 (l2: the canonical float
 * gap, see the header); a negative tau (ip, cosine, whose bounds already cover the
 * canonical rounding: engine.cu's plan_mma) is used as it is. */
__global__ __launch_bounds__(kBlock) void mma_select_kernel(const MmaParams p, int kk)
{
    __shared__ BlockRadixSelect<unsigned>::TempStorage sm;
    for (int q = (int)blockIdx.x; q < p.qs; q += (int)gridDim.x) {
        const float *w = p.gmin + (int64_t)q * p.ga;
        float tau = INFINITY;
        if (p.ga >= kk) {
            const unsigned K = BlockRadixSelect<unsigned>::select(
                sm,
                [&](auto f) {
                    for (int64_t i = threadIdx.x; i < p.ga; i += kBlock) f(order_enc(w[i]));
                },
                kk);
            tau = order_dec(K);
        }
        const float tp = tau >= 0.0f ? tau_prime(tau) : tau;
        if (threadIdx.x == 0) {
            p.thr[q] = __fmul_ru(0.5f, __fadd_ru(p.ub, tp));
            if (p.tau_out) p.tau_out[q] = tau;
        }
        __syncthreads();
    }
}

/* The pass-B threshold of queries that already hold k references in running lists
 * (host_pair, l2): tau = the k-th canonical value of the query's list, thr = (mabs +
 * tau') / 2 rounded up as mma_select_kernel writes it. A reference x of the pass that is
 * not appended has D >= L > tau', so its canonical value is greater than tau (the gap
 * tau' - tau is 2^-19 tau + 16 FLT_MIN, far above the canonical rounding): it ranks after
 * the k references of the list and cannot enter the merged top k. */
__global__ __launch_bounds__(kBlock) void mma_list_thr_kernel(const MmaParams p, const float *kth)
{
    for (int q = (int)(blockIdx.x * kBlock + threadIdx.x); q < p.qs; q += (int)(gridDim.x * kBlock)) {
        const float tau = kth[q];
        const float tp = tau >= 0.0f ? tau_prime(tau) : tau;
        p.thr[q] = __fmul_ru(0.5f, __fadd_ru(p.ub, tp));
    }
}

/* Queries whose buffer overflowed: an exact scan of every reference (canonical values by
 * BlockResolve, whole warps per batch of rows), the buffer cut to its exact top kk by
 * (canonical, id) whenever the next 256 would not fit (cap >= kk + kBlock). Other queries
 * only add their count to the statistics. With p.below (after a resolve that checked the
 * estimated threshold's certificate, filter.cu) the queries with below[q] < kk are
 * scanned too, and a scanned buffer is resolved at the end, as the resolve has run
 * already. */
union RescueSm {
    BlockScan::TempStorage scan;
    BlockRadixSelect<unsigned long long>::TempStorage sel;
    BlockResolve::TempStorage res;
};

__global__ __launch_bounds__(kBlock) void mma_rescue_kernel(const MmaParams p, int kk, int kind)
{
    __shared__ RescueSm sm;
    const int tid = (int)threadIdx.x;
    for (int q = (int)blockIdx.x; q < p.qs; q += (int)gridDim.x) {
        const int c0 = p.cnt[q];
        if (c0 <= p.cap && !(p.below && p.below[q] < kk)) {
            if (tid == 0) atomicAdd(p.stats + kStatAppended, (unsigned long long)c0);
            continue;
        }
        if (tid == 0) atomicAdd(p.stats + kStatReruns, 1ull);
        Cand *seg = p.cand + (int64_t)q * p.cap;
        const float *qrow = p.Q + (int64_t)q * p.ldq;
        const int64_t self = p.exclude ? p.self_local0 + q : -1;
        int bc = 0;
        for (int64_t b = 0; b < p.n; b += kBlock) {
            const int64_t j = b + tid;
            const bool take = j < p.n && j != self;
            int total;
            const int pos = BlockScan::exclusive(sm.scan, take ? 1 : 0, total);
            if (bc + total > p.cap) {
                BlockResolve::run(sm.res, seg, bc, INFINITY, qrow, p.d, p.R, p.ldr, 0, kind);
                __syncthreads();
                const unsigned long long K = BlockRadixSelect<unsigned long long>::select(
                    sm.sel,
                    [&](auto f) {
                        for (int i = tid; i < bc; i += kBlock) f(make_key(seg[i].c, seg[i].idx));
                    },
                    kk);
                bc = compact_cands(sm.scan, seg, bc, [&](Cand &e) { return make_key(e.c, e.idx) <= K; });
            }
            if (take) {
                Cand e;
                e.lo = -INFINITY;
                e.up = INFINITY;
                e.c = XKNN_CUDA_UNRESOLVED;
                e.idx = (int)j;
                seg[bc + pos] = e;
            }
            bc += total;
            __syncthreads();
        }
        if (p.below) BlockResolve::run(sm.res, seg, bc, INFINITY, qrow, p.d, p.R, p.ldr, 0, kind);
        if (tid == 0) {
            p.cnt[q] = bc;
            atomicAdd(p.stats + kStatAppended, (unsigned long long)bc);
        }
        __syncthreads();
    }
}

/* The column terms of references [0, round_up(p.n, kBN)) into p.ct, for the Hopper
 * kernels' epilogue (which reads them instead of computing them per tile and thread):
 * modes 0 and 1 col_term<MODE>; mode 2 the pairs (c_j, c'_x) of sym_epilogue_wg (c'_x
 * from the final thresholds: launched after the select). */
template <int MODE>
__global__ __launch_bounds__(kBlock) void mma_col_terms_kernel(const MmaParams p)
{
    const int64_t RN = (p.n + kBN - 1) / kBN * kBN;
    for (int64_t j = (int64_t)blockIdx.x * kBlock + threadIdx.x; j < RN; j += (int64_t)gridDim.x * kBlock) {
        const float x = j < p.n ? p.rn[j] : 0.0f;
        if (MODE == 2)
            reinterpret_cast<float2 *>(p.ct)[j] =
                make_float2(col_term<2>(p, j, x), col_sym_term(p, j, x, j < p.n ? p.cthr[j] : 0.0f));
        else
            p.ct[j] = col_term<MODE>(p, j, x);
    }
}

/* Stages of wgmma_ws_kernel that fit in `optin` bytes of shared memory (at most
 * kWsMaxStages); 0 when fewer than 3 fit. */
int ws_stages(int64_t d, size_t optin)
{
    const int64_t dpad = (d + kBK - 1) / kBK * kBK;
    int S = kWsMaxStages;
    while (S >= 3 && ws_smem_bytes(dpad, S) > optin) --S;
    return S >= 3 ? S : 0;
}

#ifdef XKNN_CUDA_PROFILE
/* XKNN_CUDA_PROFILE: the phases of the launch just made, per warp-tile, to stderr */
void ws_profile_print(int mode)
{
    unsigned long long h[4][16];
    static const unsigned long long zero[4][16] = {};
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(h, g_ws_prof, sizeof h) != cudaSuccess) return;
    const unsigned long long *v = h[mode];
    const double wt = v[9] ? (double)v[9] : 1.0, pw = v[12] ? (double)v[12] : 1.0;
    fprintf(stderr,
            "xknn: cuda: profile of wgmma_ws_kernel mode %d: %llu warp-tiles; cycles a warp-tile: turn %.0f, issue "
            "%.0f, drain %.0f, epilogue %.0f (mode 2: main loop %.0f, exact rows and appends %.0f; warp-tiles with "
            "a hot row %.3f, with column bits %.3f); %llu producer warps, cycles a warp: waiting %.0f, loading %.0f\n",
            mode, v[9], v[0] / wt, v[1] / wt, v[2] / wt, v[3] / wt, v[4] / wt, v[5] / wt, v[6] / wt, v[7] / wt, v[12],
            v[10] / pw, v[11] / pw);
    (void)cudaMemcpyToSymbol(g_ws_prof, zero, sizeof zero);
}
#endif

template <int MODE, bool VEC>
cudaError_t launch_one(const MmaParams &p, int sms, int wgmma, cudaStream_t st)
{
    constexpr int KB2 = MODE == 2 ? 32 : 64; /* no 64-dimension instance of mode 2 */
    const char *kb32 = getenv("XKNN_CUDA_WGMMA_KB32"); /* diagnostic: the 32-dimension stages everywhere */
    const bool kb64 = wgmma_chunk_of((p.d + kBK - 1) / kBK * kBK, MODE == 2) == 64 && !(kb32 && *kb32 && *kb32 != '0');
    /* (the 32-dimension layout's bytes are those of mode 2's stages) */
    const bool ff = p.ffma != 0;
    if (ff) wgmma = 0;
    const size_t smem = (wgmma ? wgmma_smem_bytes(p.d, !kb64) : mma_smem_bytes(p.d)) + (MODE == 2 ? mma_sym_smem_extra() : 0);
    if (ff && MODE == 2) return cudaErrorInvalidValue; /* the CUDA-core kernel has passes A and B only */
    if (ff) { /* ffma_kernel: mma_kernel's grid with its own block and shared memory */
        const int64_t qt = (p.qs + kBM - 1) / kBM;
        const int64_t RT = (p.n + kBN - 1) / kBN;
        const int fsm = (int)ffma_smem_bytes(p.d);
        constexpr int M = MODE == 2 ? 1 : MODE; /* (mode 2 returned above) */
        /* pass B's entries carry their accumulators only where p.carry asks (mma_prune);
         * pass B without them takes the longer trips where its last tile is mostly full
         * (kFfUnrollFull) */
        void (*const kern)(const MmaParams) =
            M == 1 && p.carry ? ffma_kernel<1, true, kFfUnroll> : ffma_kernel<M, false, kFfUnroll>;
        void (*const kfull)(const MmaParams) = M == 1 && !p.carry ? ffma_kernel<1, false, kFfUnrollFull> : kern;
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, fsm);
        if (e == cudaSuccess && kfull != kern)
            e = cudaFuncSetAttribute(kfull, cudaFuncAttributeMaxDynamicSharedMemorySize, fsm);
        if (e != cudaSuccess) return e;
        /* query tiles [qt0, qt0 + nqt) over all reference tiles, sliced by choose_slices */
        auto grid = [&](int64_t qt0, int64_t nqt) {
            MmaParams q = p;
            q.qt0 = (int)qt0;
            int64_t Z = choose_slices(nqt, RT, sms);
            q.tiles_per_cta = (int)((RT + Z - 1) / Z);
            Z = (RT + q.tiles_per_cta - 1) / q.tiles_per_cta;
            const int64_t last_rows = p.qs - (qt0 + nqt - 1) * kBM; /* rows of the grid's last tile */
            void (*const k)(const MmaParams) = last_rows > kBM / 2 ? kfull : kern;
            k<<<dim3((unsigned)nqt, (unsigned)Z), kFfThreads, fsm, st>>>(q);
            return cudaGetLastError();
        };
        /* A last tile of at most kBM / 2 queries has idle warps, so its CTAs end early
         * and their SMs run out of work before the others: in one grid of full waves (W1:
         * 40 tiles x 33 slices on 132 SMs, the last tile 16 rows) that leaves a wave's
         * tail idle. Where the grid is many waves, the full tiles get a grid of their own,
         * sliced into whole waves (39 x 44), and the light tile follows in a second one
         * (an H100: W1 61.70 -> 61.04 ms, 1M x 300 queries 3.28 -> 2.90 ms; a last tile
         * of 232 rows was 1.3 % slower split, so a fuller one stays in the grid). */
        const int64_t full = p.qs / kBM, rest = p.qs % kBM;
        if (full > 0 && rest > 0 && rest <= kBM / 2 && full * RT >= 32 * (int64_t)sms) {
            const cudaError_t e1 = grid(0, full);
            return e1 != cudaSuccess ? e1 : grid(full, 1);
        }
        return grid(0, qt);
    }
    cudaError_t e = !wgmma ? cudaFuncSetAttribute(mma_kernel<MODE, VEC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)
                    : kb64 ? cudaFuncSetAttribute(wgmma_kernel<MODE, VEC, KB2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)
                           : cudaFuncSetAttribute(wgmma_kernel<MODE, VEC, 32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const int64_t qt = (p.qs + kBM - 1) / kBM;
    const int64_t RT = (p.n + kBN - 1) / kBN;
    MmaParams q = p;
    int64_t Z;
    if (MODE == 2 && !p.rect) {
        /* triangle: CTA (I, z) takes tiles [2 I + z L, 2 I + (z + 1) L) of its row's
         * RT - 2 I (the diagonal is at most one tile past n's last); L makes at least 8
         * CTAs' worth per SM of the qt RT - qt (qt - 1) tiles in all, so the shorter rows
         * (launched last) even out the waves */
        static_assert(kBM % kBN == 0, "a query tile is whole reference tiles");
        const int64_t per = kBM / kBN;
        const int64_t total = qt * RT - per * qt * (qt - 1) / 2;
        int64_t L = (total + 8 * (int64_t)sms - 1) / (8 * (int64_t)sms);
        if (L < 16) L = 16;
        if (L > RT) L = RT;
        q.tiles_per_cta = (int)L;
        Z = (RT + L - 1) / L;
        if (Z > 65535) return cudaErrorInvalidConfiguration;
    } else {
        Z = choose_slices(qt, RT, sms);
        q.tiles_per_cta = (int)((RT + Z - 1) / Z);
        Z = (RT + q.tiles_per_cta - 1) / q.tiles_per_cta;
    }
    /* the warp-specialized kernel unless asked not to (diagnostic XKNN_CUDA_WGMMA_WS=0) */
    const char *ws = getenv("XKNN_CUDA_WGMMA_WS");
    if (wgmma && !ff && VEC && !(ws && *ws == '0')) {
        const int S = ws_stages(p.d, (size_t)wgmma); /* wgmma: the device's opt-in bytes */
        if (S) {
            const size_t wsm = ws_smem_bytes((p.d + kBK - 1) / kBK * kBK, S);
            /* mode 2 on rows sorted by threshold (launch_mma_sym_sort) */
            void (*const kern)(const MmaParams, int) =
                MODE == 2 && p.perm ? wgmma_ws_kernel<MODE, MODE == 2> : wgmma_ws_kernel<MODE, false>;
            e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wsm);
            if (e != cudaSuccess) return e;
            kern<<<dim3((unsigned)qt, (unsigned)Z), kWsThreads, wsm, st>>>(q, S);
#ifdef XKNN_CUDA_PROFILE
            ws_profile_print(MODE);
#endif
            return cudaGetLastError();
        }
    }
    if (p.perm) return cudaErrorNotSupported; /* sorted rows: the warp-specialized kernel only */
    if (wgmma && kb64)
        wgmma_kernel<MODE, VEC, KB2><<<dim3((unsigned)qt, (unsigned)Z), kThreads, smem, st>>>(q);
    else if (wgmma)
        wgmma_kernel<MODE, VEC, 32><<<dim3((unsigned)qt, (unsigned)Z), kThreads, smem, st>>>(q);
    else
        mma_kernel<MODE, VEC><<<dim3((unsigned)qt, (unsigned)Z), kThreads, smem, st>>>(q);
    return cudaGetLastError();
}

} // namespace

size_t wgmma_smem_bytes(int64_t d, int sym)
{
    const int64_t dpad = (d + kBK - 1) / kBK * kBK;
    return sizeof(float) * (size_t)(kBM * dpad + kGStages * kBN * wgmma_chunk_of(dpad, sym != 0) + kBM + kRnSlots * kBN);
}

size_t mma_sym_smem_extra(void) { return sizeof(float) * (size_t)(kRnSlots * kBN + kBM); }

size_t ffma_smem_bytes(int64_t d)
{
    const int64_t dpad = (d + kFfBK - 1) / kFfBK * kFfBK;
    return sizeof(float) * (size_t)(kBM * dpad + kFfStages * kFfBK * kFfPitch + kBM);
}

size_t mma_smem_bytes(int64_t d)
{
    const int64_t dpad = (d + kBK - 1) / kBK * kBK;
    return sizeof(float) * (size_t)(kBM * (dpad + 4) + kStages * kBN * kRowB + kBM + kRnSlots * kBN);
}

int mma_wgmma_built(void)
{
#ifdef XKNN_CUDA_SM90A
    return 1;
#else
    return 0;
#endif
}

cudaError_t launch_mma_pass(const MmaParams &p, int mode, int sms, int wgmma, cudaStream_t st)
{
    if (p.n <= 0 || p.qs <= 0) return cudaSuccess;
    { /* the column terms of this pass (every epilogue but mma_kernel's mode 2 reads them) */
        const int64_t RN = (p.n + kBN - 1) / kBN * kBN;
        const int blocks = (int)(RN / kBlock + 1 < 4 * (int64_t)sms ? RN / kBlock + 1 : 4 * (int64_t)sms);
        if (mode == 0)
            mma_col_terms_kernel<0><<<blocks, kBlock, 0, st>>>(p);
        else if (mode == 1)
            mma_col_terms_kernel<1><<<blocks, kBlock, 0, st>>>(p);
        else
            mma_col_terms_kernel<2><<<blocks, kBlock, 0, st>>>(p);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    const bool vec = ((uintptr_t)p.R % 16 == 0) && p.ldr % 4 == 0 && p.d % 4 == 0;
    if (mode == 0) return vec ? launch_one<0, true>(p, sms, wgmma, st) : launch_one<0, false>(p, sms, wgmma, st);
    if (mode == 2) return vec ? launch_one<2, true>(p, sms, wgmma, st) : launch_one<2, false>(p, sms, wgmma, st);
    return vec ? launch_one<1, true>(p, sms, wgmma, st) : launch_one<1, false>(p, sms, wgmma, st);
}

cudaError_t launch_mma_select(const MmaParams &p, int kk, int sms, cudaStream_t st)
{
    const int blocks = p.qs < 8 * sms ? p.qs : 8 * sms;
    mma_select_kernel<<<blocks, kBlock, 0, st>>>(p, kk);
    return cudaGetLastError();
}

__global__ __launch_bounds__(kBlock) void fill_inf_kernel(float *a, int64_t count)
{
    for (int64_t i = (int64_t)blockIdx.x * kBlock + threadIdx.x; i < count; i += (int64_t)gridDim.x * kBlock)
        a[i] = INFINITY;
}

int mma_band_supported(int64_t d, int wgmma)
{
    const char *ws = getenv("XKNN_CUDA_WGMMA_WS");
    return wgmma > 0 && d % 4 == 0 && !(ws && *ws == '0') && ws_stages(d, (size_t)wgmma) > 0;
}

cudaError_t launch_mma_band(const MmaParams &p, int sms, int wgmma, cudaStream_t st)
{
    if (p.n <= 0 || p.qs <= 0) return cudaSuccess;
    const int64_t RT = (p.n + kBN - 1) / kBN, qt = (p.qs + kBM - 1) / kBM;
    /* the band's tiles of a row and its columns' must be disjoint (2 band + 4 <= RT) and the
     * CTA's own rows the band's first two tiles (Q = R, the self-join) */
    if (!mma_band_supported(p.d, wgmma) || p.band < 2 || 2 * (int64_t)p.band + 4 > RT || p.ga < 4 * p.band ||
        p.qs != p.n || ((uintptr_t)p.R % 16) != 0 || p.ldr % 4 != 0)
        return cudaErrorNotSupported;
    { /* every slot +inf: a column's slots are filled only by the CTAs whose band holds it */
        const int64_t count = (int64_t)p.qs * p.ga;
        const int64_t need = (count + kBlock - 1) / kBlock;
        fill_inf_kernel<<<(unsigned)(need < 16 * (int64_t)sms ? need : 16 * (int64_t)sms), kBlock, 0, st>>>(p.gmin,
                                                                                                        count);
        const int64_t RN = (p.n + kBN - 1) / kBN * kBN;
        const int blocks = (int)(RN / kBlock + 1 < 4 * (int64_t)sms ? RN / kBlock + 1 : 4 * (int64_t)sms);
        mma_col_terms_kernel<0><<<blocks, kBlock, 0, st>>>(p);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    MmaParams q = p;
    int64_t Z = choose_slices(qt, p.band, sms);
    q.tiles_per_cta = (int)((p.band + Z - 1) / Z);
    Z = (p.band + q.tiles_per_cta - 1) / q.tiles_per_cta;
    const int S = ws_stages(p.d, (size_t)wgmma);
    const size_t wsm = ws_smem_bytes((p.d + kBK - 1) / kBK * kBK, S);
    cudaError_t e = cudaFuncSetAttribute(wgmma_ws_kernel<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wsm);
    if (e != cudaSuccess) return e;
    wgmma_ws_kernel<3><<<dim3((unsigned)qt, (unsigned)Z), kWsThreads, wsm, st>>>(q, S);
#ifdef XKNN_CUDA_PROFILE
    ws_profile_print(3);
#endif
    return cudaGetLastError();
}

/* ---- the sorted triangle (sym_epilogue_sorted) --------------------------------------
 * The points in decreasing order of thr (first those whose terms are NaN: huge norms,
 * or a NaN threshold), then the operand rows, norms and thresholds gathered in that
 * order with m_x = fsub_rd(pred(c'_x), c_x) of each sorted point x, and msuf[x] = min
 * over sorted points x' >= x of m_x' with NaN kept (CUB's scan of m read backwards). */
namespace {

struct MinNan {
    __device__ __forceinline__ float operator()(float a, float b) const { return min_nan(a, b); }
};

struct SymSortLayout {
    size_t xs, rn, thr, perm, m, msuf, kin, kout, iin, tmp, tmp_bytes, pool, next, total;
};

SymSortLayout sym_sort_layout(int64_t n, int64_t ldx, int64_t pool_cap)
{
    const int64_t QS = (n + kBN - 1) / kBN * kBN;
    SymSortLayout L;
    size_t off = 0;
    auto take = [&](size_t bytes) {
        const size_t at = off;
        off += (bytes + 255) / 256 * 256;
        return at;
    };
    L.xs = take((size_t)n * (size_t)ldx * sizeof(float));
    L.rn = take((size_t)QS * sizeof(float));
    L.thr = take((size_t)QS * sizeof(float));
    L.perm = take((size_t)QS * sizeof(int));
    L.m = take((size_t)n * sizeof(float));
    L.msuf = take((size_t)n * sizeof(float));
    L.kin = take((size_t)n * sizeof(unsigned));
    L.kout = take((size_t)n * sizeof(unsigned));
    L.iin = take((size_t)n * sizeof(int));
    size_t sort_bytes = 0, scan_bytes = 0;
    cub::DeviceRadixSort::SortPairsDescending(nullptr, sort_bytes, (const unsigned *)nullptr, (unsigned *)nullptr,
                                              (const int *)nullptr, (int *)nullptr, (int)n);
    cub::DeviceScan::InclusiveScan(nullptr, scan_bytes, thrust::make_reverse_iterator((const float *)nullptr),
                                   thrust::make_reverse_iterator((float *)nullptr), MinNan(), (int)n);
    L.tmp_bytes = sort_bytes > scan_bytes ? sort_bytes : scan_bytes;
    L.tmp = take(L.tmp_bytes);
    L.pool = take((size_t)pool_cap * sizeof(unsigned long long));
    L.next = take(sizeof(unsigned long long));
    L.total = off;
    return L;
}

__global__ __launch_bounds__(kBlock) void sym_sort_keys_kernel(const MmaParams p, unsigned *key, int *idx)
{
    for (int64_t j = (int64_t)blockIdx.x * kBlock + threadIdx.x; j < p.n; j += (int64_t)gridDim.x * kBlock) {
        const float x = p.rn[j], t = p.thr[j];
        const float c = col_term<2>(p, j, x), cx = col_sym_term(p, j, x, t);
        key[j] = c != c || cx != cx || t != t ? 0xffffffffu : order_enc(t);
        idx[j] = (int)j;
    }
}

/* one warp a row (ldx % 4 == 0, 16-byte aligned rows); then the norms and thresholds
 * (zero past n, as host_sym leaves them) and m of each sorted point */
__global__ __launch_bounds__(kBlock) void sym_sort_gather_kernel(const MmaParams p, int64_t ldx, const int *perm,
                                                                 float *xs, float *rn_s, float *thr_s, float *m)
{
    const int64_t q4 = ldx / 4, QS = (p.n + kBN - 1) / kBN * kBN;
    const int lane = (int)threadIdx.x & 31;
    const int64_t w0 = ((int64_t)blockIdx.x * kBlock + threadIdx.x) >> 5, nw = ((int64_t)gridDim.x * kBlock) >> 5;
    for (int64_t r = w0; r < p.n; r += nw) {
        const float4 *src = reinterpret_cast<const float4 *>(p.R) + (int64_t)perm[r] * q4;
        float4 *dst = reinterpret_cast<float4 *>(xs) + r * q4;
        for (int64_t c = lane; c < q4; c += 32) dst[c] = __ldg(src + c);
    }
    for (int64_t r = (int64_t)blockIdx.x * kBlock + threadIdx.x; r < QS; r += (int64_t)gridDim.x * kBlock) {
        const float x = r < p.n ? p.rn[perm[r]] : 0.0f, t = r < p.n ? p.thr[perm[r]] : 0.0f;
        rn_s[r] = x;
        thr_s[r] = t;
        if (r < p.n) m[r] = __fsub_rd(nextafterf(col_sym_term(p, r, x, t), -INFINITY), col_term<2>(p, r, x));
    }
}

/* the pool's entries (pool_append) into the lists: row i's list perm[i] gets perm[j],
 * column j's list perm[j] gets perm[i] (appenders' slots: a slot past cap only counts) */
__global__ __launch_bounds__(kBlock) void sym_pool_scatter_kernel(const MmaParams p, unsigned long long total)
{
    for (unsigned long long e = (unsigned long long)blockIdx.x * kBlock + threadIdx.x; e < total;
         e += (unsigned long long)gridDim.x * kBlock) {
        const unsigned long long v = p.pool[e];
        const unsigned lo = (unsigned)v, i = lo & 0x3fffffffu, j = (unsigned)(v >> 32);
        if ((int64_t)i >= p.qs || (int64_t)j >= p.n) continue;
        const int qi = __ldg(p.perm + i), qj = __ldg(p.perm + j);
        if ((lo >> 30 & 1u) && !(p.exclude && i == j)) put_cand_at(p.cand, p.cap, qi, atomicAdd(p.cnt + qi, 1), qj);
        if (lo >> 31) put_cand_at(p.ccand, p.cap, qj, atomicAdd(p.ccnt + qj, 1), qi);
    }
}

} // namespace

size_t mma_sym_sort_bytes(int64_t n, int64_t ldx, int64_t pool_cap) { return sym_sort_layout(n, ldx, pool_cap).total; }

cudaError_t launch_mma_sym_scatter(const MmaParams &ps, int sms, cudaStream_t st, int *overflow)
{
    unsigned long long used = 0;
    cudaError_t e = cudaMemcpyAsync(&used, ps.pool_next, sizeof used, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) return e;
    *overflow = used > (unsigned long long)ps.pool_cap;
    if (*overflow || used == 0) return cudaSuccess;
    const unsigned long long want = (used + kBlock - 1) / kBlock;
    const int blocks = (int)(want < 16ull * (unsigned long long)sms ? want : 16ull * (unsigned long long)sms);
    sym_pool_scatter_kernel<<<blocks, kBlock, 0, st>>>(ps, used);
    return cudaGetLastError();
}

cudaError_t launch_mma_sym_sort(const MmaParams &p, int64_t ldx, int64_t pool_cap, void *ws, int sms, cudaStream_t st,
                                MmaParams *out)
{
    if (p.n <= 0 || ldx % 4 != 0 || (uintptr_t)p.R % 16 != 0 || p.n >= (1 << 30) || pool_cap < 1)
        return cudaErrorNotSupported;
    const SymSortLayout L = sym_sort_layout(p.n, ldx, pool_cap);
    char *b = (char *)ws;
    unsigned *kin = (unsigned *)(b + L.kin), *kout = (unsigned *)(b + L.kout);
    int *iin = (int *)(b + L.iin), *perm = (int *)(b + L.perm);
    float *xs = (float *)(b + L.xs), *rn_s = (float *)(b + L.rn), *thr_s = (float *)(b + L.thr);
    float *m = (float *)(b + L.m), *msuf = (float *)(b + L.msuf);
    const int blocks = (int)(p.n / kBlock + 1 < 8 * (int64_t)sms ? p.n / kBlock + 1 : 8 * (int64_t)sms);
    sym_sort_keys_kernel<<<blocks, kBlock, 0, st>>>(p, kin, iin);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    size_t tb = L.tmp_bytes;
    e = cub::DeviceRadixSort::SortPairsDescending(b + L.tmp, tb, kin, kout, iin, perm, (int)p.n, 0, 32, st);
    if (e != cudaSuccess) return e;
    sym_sort_gather_kernel<<<8 * sms, kBlock, 0, st>>>(p, ldx, perm, xs, rn_s, thr_s, m);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    tb = L.tmp_bytes;
    e = cub::DeviceScan::InclusiveScan(b + L.tmp, tb, thrust::make_reverse_iterator((const float *)m + p.n),
                                       thrust::make_reverse_iterator(msuf + p.n), MinNan(), (int)p.n, st);
    if (e != cudaSuccess) return e;
    MmaParams q = p;
    q.Q = q.R = xs;
    q.ldq = q.ldr = ldx;
    q.qn = q.rn = rn_s;
    q.thr = thr_s;
    q.cthr = thr_s;
    q.perm = perm;
    q.msuf = msuf;
    q.pool = (unsigned long long *)(b + L.pool);
    q.pool_next = (unsigned long long *)(b + L.next);
    q.pool_cap = pool_cap;
    /* unused entries all ones (a row past n); no entry taken yet */
    if ((e = cudaMemsetAsync(q.pool, 0xff, (size_t)pool_cap * sizeof(unsigned long long), st)) != cudaSuccess) return e;
    if ((e = cudaMemsetAsync(q.pool_next, 0, sizeof(unsigned long long), st)) != cudaSuccess) return e;
    *out = q;
    return cudaSuccess;
}

cudaError_t launch_mma_list_thr(const MmaParams &p, const float *kth, int sms, cudaStream_t st)
{
    const int need = (p.qs + kBlock - 1) / kBlock;
    const int blocks = need < 8 * sms ? need : 8 * sms;
    if (p.qs <= 0) return cudaSuccess;
    mma_list_thr_kernel<<<blocks, kBlock, 0, st>>>(p, kth);
    return cudaGetLastError();
}

/* ---- prune (l2 / euclidean, pass B of mma_kernel and ffma_kernel) --------------------
 * Pass B appends every reference whose lower bound passes tau' of the witnesses, about
 * kk n / nA a query (W1: some 450 for k = 10), and each costs the re-rank a gather of its
 * row. The entries carry their accumulator (in up), so both bounds of each are at hand:
 *   U = fma_ru(acc, -2, fma_ru(s_up, ua, ub)) >= s (1 + mrel) + mabs - 2 acc >= D,
 *   L = fma_rd(acc, -2, fma_rd(s_dn, 2 la, -ub)) <= s (1 - mrel) - mabs - 2 acc <= D
 * (mma_bounds: ua >= 1 + mrel, 2 la <= 1 - mrel, ub = mabs; s_up, s_dn the norms' sum
 * rounded up and down). With K the kk-th smallest U of the buffer, kk entries have
 * D <= K, and an entry with L > K' = tau_prime(K) has D > K': its canonical value is
 * greater than theirs (filter.cu's tighten, the same argument), so it is dropped before
 * the re-rank. NaN bounds (norms past 5e36) keep their entry. Survivors get lo = -inf,
 * as put_cand_at writes them, so resolve and final keep them all. A query whose buffer
 * overflowed (rescue re-runs it) or holds at most kk entries is left as it is. One block
 * per state query. */
__global__ __launch_bounds__(kBlock) void mma_prune_kernel(const MmaParams p, int kk)
{
    __shared__ union {
        BlockScan::TempStorage scan;
        BlockRadixSelect<unsigned>::TempStorage sel;
    } sm;
    const int q = (int)blockIdx.x;
    const int bc = p.cnt[q];
    if (bc <= kk || bc > p.cap) return;
    Cand *seg = p.cand + (int64_t)q * p.cap;
    const float qv = norm_or_nan(p.qn[q]);
    const float la2 = 2.0f * p.la;
    /* each thread rewrites, and below reads, entries tid + kBlock i only */
    for (int j = (int)threadIdx.x; j < bc; j += kBlock) {
        Cand e = seg[j];
        const float xv = norm_or_nan(p.rn[e.idx]);
        const float acc = e.up;
        e.up = __fmaf_ru(acc, -2.0f, __fmaf_ru(__fadd_ru(qv, xv), p.ua, p.ub));
        e.lo = __fmaf_rd(acc, -2.0f, __fmaf_rd(__fadd_rd(qv, xv), la2, -p.ub));
        seg[j] = e;
    }
    const unsigned K = BlockRadixSelect<unsigned>::select(
        sm.sel,
        [&](auto f) {
            for (int j = (int)threadIdx.x; j < bc; j += kBlock) f(__float_as_uint(seg[j].up));
        },
        kk);
    const float kp = tau_prime(__uint_as_float(K));
    const int m = compact_cands(sm.scan, seg, bc, [&](Cand &e) {
        if (e.lo > kp) return false;
        e.lo = -INFINITY;
        return true;
    });
    if (threadIdx.x == 0) p.cnt[q] = m;
}

cudaError_t launch_mma_prune(const MmaParams &p, int kk, cudaStream_t st)
{
    if (p.qs <= 0) return cudaSuccess;
    mma_prune_kernel<<<(unsigned)p.qs, kBlock, 0, st>>>(p, kk);
    return cudaGetLastError();
}

cudaError_t launch_mma_rescue(const MmaParams &p, int kk, int kind, int sms, cudaStream_t st)
{
    const int blocks = p.qs < 2 * sms ? p.qs : 2 * sms;
    mma_rescue_kernel<<<blocks, kBlock, 0, st>>>(p, kk, kind);
    return cudaGetLastError();
}

} // namespace xknn_cuda
