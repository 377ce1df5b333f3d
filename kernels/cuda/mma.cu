/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/mma.cu -- the tensor-core path (XKNN_CUDA_PATH_MMA): TF32 mma.sync tiles
 * whose epilogue does the candidate work in registers, so no distance tile ever goes
 * through memory (docs/DESIGN.md section 5: "a kernel that never writes
 * distances is the limit case"). This file holds the mma.sync tile kernel (THE KERNEL
 * below), the passes around the tile kernels (select, rescue, column terms, the sorted
 * triangle's sort, prune) and the launchers; the other tile kernels are one family a file
 * over mma_common.cuh: mma_ffma.cu, mma_wgmma.cu and mma_wgmma_ws.cu (Hopper's two, over
 * mma_hopper.cuh).
 *
 * PIPELINE (one state block of qs queries, references resident on the device)
 *   pass A   mma tiles over the first nA references; per (query, group of kMmaGroup = 64
 *            references) the smallest rigorous UPPER bound U >= D of the group is written
 *            (the "witness" of the group). Groups are disjoint, so the kk smallest
 *            witnesses belong to kk distinct references.
 *   select   per query tau = kk-th smallest witness (radix select): at least kk
 *            references have D <= tau, so tau bounds the kk-th smallest distance.
 *            (Large k, l2: plan.cu's plan_estimate takes a short prefix and the j-th
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
 * nA is chosen by the planner (plan.cu): larger for larger k, so that the expected
 * number of candidates stays a small multiple of k.
 *
 * SYMMETRIC SELF-JOIN (pass B in mode 2; selfjoin.cu's host_sym). The queries are the
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
 * cuBLAS's TF32 GEMM (T = -2 acc exactly), so plan.cu's TF32 derivation holds: with
 * s = |q|^2 + |x|^2 (float norms), |s - 2 acc - D| <= eps s + abs, eps <= mrel, abs <=
 * mabs. The queries are rounded to TF32 (cvt.rna) when staged; the references enter the
 * tensor cores as raw fp32 bits, which the hardware reads as TF32 (the 13 low bits are not
 * used: truncation), the case the bound already covers (2^-9 per product). Padded
 * dimensions are exact zeros. l2 / euclidean with p.center (plan.cu's center_wanted):
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
 * ip and cosine run the same kernels with other constants (plan.cu's mma_bounds): U and
 * the threshold are in units of twice the order key, ua is the relative margin itself
 * and la < 0; every rounding above keeps its direction whatever the signs.
 *
 * TWO SETS (pass B in mode 2 with rect = 1; pair.cu's host_pair, xknn_search_pair). The
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
 * FP32 ON THE CUDA CORES (MmaParams.ffma: plan.cu's path fp32 where the references are
 * resident, l2 / euclidean). ffma_kernel (below) runs passes A and B with the same grid,
 * tiles, bounds and epilogue, and fp32 products summed with fmaf on the CUDA cores; the
 * queries are staged unrounded. select, rescue and re-rank are shared. acc is then an fp32
 * dot product in some order with FMA, the case of plan.cu's FP32 bound (plan_bounds
 * with tf32 = 0), which mma_bounds turns into the same epilogue constants.
 */
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <thrust/iterator/reverse_iterator.h>

#include "mma_hopper.cuh"
#include "xknn/impl/knobs.h"

namespace xknn_cuda {

namespace {

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
    XKNN__MMA_BLOCK_TILES(kBK);

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

/* tau = kk-th smallest witness of each query (+inf when fewer than kk groups), and the
 * pass-B threshold thr = (mabs + tau') / 2 rounded up. One block per query (grid-stride);
 * 4 radix passes over the query's ga witnesses as order_enc keys (ip's witnesses may be
 * negative; a witness is NaN only when every pair of its group is, and order_enc puts
 * the canonical NaN last). tau' = tau_prime(tau) for tau >= 0 (l2: the canonical float
 * gap, see the header); a negative tau (ip, cosine, whose bounds already cover the
 * canonical rounding: plan.cu's plan_mma) is used as it is. */
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

template <int MODE, bool VEC>
cudaError_t launch_one(const MmaParams &p, int sms, int wgmma, cudaStream_t st)
{
    constexpr int KB2 = MODE == 2 ? 32 : 64; /* no 64-dimension instance of mode 2 */
    const bool kb64 = wgmma_chunk_of((p.d + kBK - 1) / kBK * kBK, MODE == 2) == 64;
    /* (the 32-dimension layout's bytes are those of mode 2's stages) */
    const bool ff = p.ffma != 0;
    if (ff) wgmma = 0;
    const size_t smem = (wgmma ? wgmma_smem_bytes(p.d, !kb64) : mma_smem_bytes(p.d)) + (MODE == 2 ? mma_sym_smem_extra() : 0);
    if (ff && MODE == 2) return cudaErrorInvalidValue; /* the CUDA-core kernel has passes A and B only */
    if (ff) return launch_ffma(p, MODE, sms, st); /* mode 0 or 1 (mode 2 returned above) */
    cudaError_t e = !wgmma ? cudaFuncSetAttribute(mma_kernel<MODE, VEC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)
                    : kb64 ? wgmma_smem<MODE, VEC, KB2>((int)smem)
                           : wgmma_smem<MODE, VEC, 32>((int)smem);
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
    const char *ws = xknn__knob(XKNN__KNOB_CUDA_WGMMA_WS);
    if (wgmma && !ff && VEC && !(ws && *ws == '0')) {
        const int S = ws_stages(p.d, (size_t)wgmma); /* wgmma: the device's opt-in bytes */
        if (S) {
            const size_t wsm = ws_smem_bytes((p.d + kBK - 1) / kBK * kBK, S);
            /* mode 2 on rows sorted by threshold (launch_mma_sym_sort) */
            const bool sorted = MODE == 2 && p.perm;
            e = sorted ? wgmma_ws_smem<MODE, MODE == 2>((int)wsm) : wgmma_ws_smem<MODE, false>((int)wsm);
            if (e != cudaSuccess) return e;
            if (sorted)
                wgmma_ws_launch<MODE, MODE == 2>(dim3((unsigned)qt, (unsigned)Z), wsm, st, q, S);
            else
                wgmma_ws_launch<MODE, false>(dim3((unsigned)qt, (unsigned)Z), wsm, st, q, S);
#ifdef XKNN_CUDA_PROFILE
            ws_profile_print(MODE);
#endif
            return cudaGetLastError();
        }
    }
    if (p.perm) return cudaErrorNotSupported; /* sorted rows: the warp-specialized kernel only */
    if (wgmma && kb64)
        wgmma_launch<MODE, VEC, KB2>(dim3((unsigned)qt, (unsigned)Z), smem, st, q);
    else if (wgmma)
        wgmma_launch<MODE, VEC, 32>(dim3((unsigned)qt, (unsigned)Z), smem, st, q);
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
    const char *ws = xknn__knob(XKNN__KNOB_CUDA_WGMMA_WS);
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
    cudaError_t e = wgmma_ws_smem<3, false>((int)wsm);
    if (e != cudaSuccess) return e;
    wgmma_ws_launch<3, false>(dim3((unsigned)qt, (unsigned)Z), wsm, st, q, S);
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
    cudaEvent_t ev = NULL;
    /* the pass done first, asleep on a blocking-sync event: a copy into pageable memory
     * would wait for it inside the driver, spinning */
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventBlockingSync | cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, st);
    if (e == cudaSuccess) e = cudaEventSynchronize(ev);
    if (ev) cudaEventDestroy(ev);
    if (e == cudaSuccess) e = cudaMemcpyAsync(&used, ps.pool_next, sizeof used, cudaMemcpyDeviceToHost, st);
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
