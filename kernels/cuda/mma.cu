/*
 * kernels/cuda/mma.cu -- the tensor-core path (XKNN_CUDA_PATH_MMA): TF32 mma.sync tiles
 * whose epilogue does the candidate work in registers, so no distance tile ever goes
 * through memory (DESIGN.md section 5, "a fused GEMM+select kernel that never writes
 * distances is the limit case").
 *
 * PIPELINE (one state block of qs queries, references resident on the device)
 *   pass A   mma tiles over the first nA references; per (query, group of kMmaGroup = 64
 *            references) the smallest rigorous UPPER bound U >= D of the group is written
 *            (the "witness" of the group). Groups are disjoint, so the kk smallest
 *            witnesses belong to kk distinct references.
 *   select   per query tau = kk-th smallest witness (radix select): at least kk
 *            references have D <= tau, so tau bounds the kk-th smallest distance.
 *   pass B   mma tiles over all n references; a pair whose rigorous LOWER bound satisfies
 *            L <= tau' = tau (1 + 2^-19) + 16 FLT_MIN is appended to the query's candidate
 *            buffer (atomic slot; rare: about kk n / nA pairs per query plus the bound's
 *            band). Any other reference has D > tau', so its canonical value is strictly
 *            greater than those of kk references: it cannot be in the top k (the same
 *            argument as filter.cu).
 *   rescue   a query whose buffer overflowed (cap slots; ties or a loose tau) is searched
 *            again exactly: every reference, canonical distances, the buffer cut to its
 *            exact top kk by (canonical, id) whenever it fills. Never approximated.
 *   then     the GEMM pipeline's resolve (canonical re-rank) and final (sort, write).
 * nA is chosen by the planner (engine.cu): larger for larger k, so that the expected
 * number of candidates stays a small multiple of k.
 *
 * THE BOUNDS. acc is the fp32 accumulation of TF32 products q't x't: the same quantity as
 * cuBLAS's TF32 GEMM (T = -2 acc exactly), so engine.cu's TF32 derivation holds: with
 * s = |q|^2 + |x|^2 (float norms), |s - 2 acc - D| <= eps s + abs, eps <= mrel, abs <=
 * mabs. The queries are rounded to TF32 (cvt.rna) when staged; the references enter the
 * tensor cores as raw fp32 bits, which the hardware reads as TF32 (the 13 low bits are not
 * used: truncation), the case the bound already covers (2^-9 per product). Padded
 * dimensions are exact zeros. The epilogue evaluates, with directed roundings:
 *   U = fma_ru(acc, -2, fma_ru(s_up, ua, ub)) >= s (1 + mrel) + mabs - 2 acc >= D
 *       (s_up = fadd_ru(|q|^2, |x|^2), ua >= 1 + mrel, ub = mabs);
 *   not a candidate  <=>  acc < r = fma_rd(s_dn, la, -thr),  la <= (1 - mrel) / 2,
 *       thr >= (mabs + tau') / 2, s_dn = fadd_rd(...): then 2 acc < s (1 - mrel) - mabs
 *       - tau', i.e. L = s (1 - mrel) - mabs - 2 acc > tau' and D >= L > tau'.
 * Norms above 5e36, NaN or infinite become NaN: such pairs are never witnesses and always
 * candidates (the canonical value decides; huge inputs stay exact, only slower).
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
 */
#include "block_primitives.cuh"
#include "kernels.cuh"

namespace xknn_cuda {

namespace {

constexpr int kBM = kMmaBM, kBN = kMmaBN, kBK = 32, kStages = kMmaStages;
constexpr int kRowB = kBK + 4; /* floats per staged reference row (16-byte aligned, conflict-free) */
constexpr int kThreads = kMmaThreads;

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

__device__ __forceinline__ float to_tf32(float x)
{
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}

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
template <bool VEC>
__device__ __forceinline__ void load_stage(float *stage, float *rn_ring, const MmaParams &p, int64_t tile, int kc)
{
    const int tid = (int)threadIdx.x;
    const int64_t ref0 = tile * kBN;
    const int k0 = kc * kBK;
    if (kc == 0 && tid < kBN / 4)
        cp_async16(rn_ring + (int)(tile % kRnSlots) * kBN + 4 * tid, p.rn + ref0 + 4 * tid, 16);
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

/*
 * MODE 0 = pass A (witnesses), 1 = pass B (filter). VEC: 16-byte reference loads (R
 * 16-byte aligned, ldr and d multiples of 4).
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

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp >> 1, wn = warp & 1;
    const int q0 = (int)blockIdx.x * kBM;
    const int64_t RT = (p.n + kBN - 1) / kBN;
    const int64_t t0 = (int64_t)blockIdx.y * p.tiles_per_cta;
    const int64_t t1 = t0 + p.tiles_per_cta < RT ? t0 + p.tiles_per_cta : RT;
    if (t0 >= t1) return;
    const int KC = dpad / kBK;
    const int64_t total = (t1 - t0) * KC;

    /* start the reference ring before staging the queries */
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < total) load_stage<VEC>(Rs + s * kBN * kRowB, rn_s, p, t0 + s / KC, s % KC);
        cp_async_commit();
    }
    for (int idx = tid; idx < kBM * dpad; idx += kThreads) {
        const int r = idx / dpad, c = idx - r * dpad;
        const int q = q0 + r;
        const float v = (q < p.qs && c < p.d) ? p.Q[(int64_t)q * p.ldq + c] : 0.0f;
        Qs[r * dq + c] = to_tf32(v);
    }
    /* per-row constants: pass A  A_i = fma_ru(ua, |q|^2, ub)  (NaN for padding rows);
     * pass B  r_i = fsub_rd(fmul_rd(la, |q|^2), thr)  (+inf for padding rows: never a
     * candidate). With the column terms C_j = fmul_ru(ua, |x|^2), c_j = fmul_rd(la, |x|^2):
     *   U = fma_ru(acc, -2, fadd_ru(A_i, C_j)) >= (1 + mrel) s + mabs - 2 acc,
     *   fadd_rd(c_j, r_i) <= la s - thr, so acc < it implies L > tau' (see the header). */
    for (int r = tid; r < kBM; r += kThreads) {
        const int q = q0 + r;
        const float qv = q < p.qs ? norm_or_nan(p.qn[q]) : __int_as_float(0x7fffffff);
        if (MODE == 0)
            row_s[r] = __fmaf_ru(p.ua, qv, p.ub);
        else
            row_s[r] = q < p.qs ? __fsub_rd(__fmul_rd(p.la, qv), p.thr[q]) : INFINITY;
    }

    float acc[4][8][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

    const float *Aw = Qs + (wm * 64 + g) * dq + 8 * t;
    const int boff = (wn * 64 + g) * kRowB + 8 * t;

#pragma unroll 1
    for (int64_t it = 0; it < total; ++it) {
        cp_async_wait<kStages - 2>();
        __syncthreads();
        {
            const int64_t nx = it + kStages - 1;
            if (nx < total)
                load_stage<VEC>(Rs + (int)(nx % kStages) * kBN * kRowB, rn_s, p, t0 + nx / KC, (int)(nx % KC));
            cp_async_commit();
        }
        const int kc = (int)(it % KC);
        const float *A = Aw + kc * kBK;
        const float *B = Rs + (int)(it % kStages) * kBN * kRowB + boff;
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
        const int64_t tile = t0 + it / KC;
        const int64_t ref0 = tile * kBN + wn * 64;
        const float *rnt = rn_s + (int)(tile % kRnSlots) * kBN + wn * 64;
        float cv[8][2]; /* column terms C_j (pass A) or c_j (pass B) */
#pragma unroll
        for (int ni = 0; ni < 8; ++ni) {
            const float2 r2 = *reinterpret_cast<const float2 *>(rnt + ni * 8 + 2 * t);
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int64_t j = ref0 + ni * 8 + 2 * t + c;
                const float x = norm_or_nan(c ? r2.y : r2.x);
                if (MODE == 0)
                    cv[ni][c] = j < p.n ? __fmul_ru(p.ua, x) : __int_as_float(0x7fffffff);
                else
                    cv[ni][c] = j < p.n ? __fmul_rd(p.la, x) : INFINITY;
            }
        }
        if (MODE == 0) {
            /* diagonal tiles (the query itself among the references) need a per-pair test */
            const int64_t s0 = p.self_local0 + q0;
            const bool diag = p.exclude && ref0 < s0 + kBM && s0 < ref0 + 64;
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int r = wm * 64 + mi * 16 + g + 8 * hh;
                    const float ai = row_s[r];
                    float mn = INFINITY;
#pragma unroll
                    for (int ni = 0; ni < 8; ++ni)
#pragma unroll
                        for (int c = 0; c < 2; ++c) {
                            float u = __fmaf_ru(acc[mi][ni][2 * hh + c], -2.0f, __fadd_ru(ai, cv[ni][c]));
                            if (diag && ref0 + ni * 8 + 2 * t + c == p.self_local0 + q0 + r)
                                u = __int_as_float(0x7fffffff);
                            mn = fminf(mn, u);
                        }
                    mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, 1));
                    mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, 2));
                    const int q = q0 + r;
                    const int64_t grp = ref0 / kMmaGroup;
                    if (t == 0 && q < p.qs && grp < p.ga) p.gmin[(int64_t)q * p.ga + grp] = mn;
                }
        } else {
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int r = wm * 64 + mi * 16 + g + 8 * hh;
                    const float ri = row_s[r];
                    bool any = false;
#pragma unroll
                    for (int ni = 0; ni < 8; ++ni)
#pragma unroll
                        for (int c = 0; c < 2; ++c) any |= !(acc[mi][ni][2 * hh + c] < __fadd_rd(cv[ni][c], ri));
                    if (!any) continue;
                    const int q = q0 + r;
                    if (q >= p.qs) continue;
                    const int64_t self = p.exclude ? p.self_local0 + q : -1;
#pragma unroll
                    for (int ni = 0; ni < 8; ++ni)
#pragma unroll
                        for (int c = 0; c < 2; ++c) {
                            const int64_t j = ref0 + ni * 8 + 2 * t + c;
                            if (!(acc[mi][ni][2 * hh + c] < __fadd_rd(cv[ni][c], ri)) && j < p.n && j != self) {
                                const int pos = atomicAdd(p.cnt + q, 1);
                                if (pos < p.cap) {
                                    Cand e;
                                    e.lo = -INFINITY;
                                    e.up = INFINITY;
                                    e.c = XKNN_CUDA_UNRESOLVED;
                                    e.idx = (int)j;
                                    p.cand[(int64_t)q * p.cap + pos] = e;
                                }
                            }
                        }
                }
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
 * 4 radix passes over the query's ga witnesses (float bits: all >= 0 or +inf). */
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
                    for (int64_t i = threadIdx.x; i < p.ga; i += kBlock) f(__float_as_uint(w[i]));
                },
                kk);
            tau = __uint_as_float(K);
        }
        if (threadIdx.x == 0) p.thr[q] = __fmul_ru(0.5f, __fadd_ru(p.ub, tau_prime(tau)));
        __syncthreads();
    }
}

/* Queries whose buffer overflowed: an exact scan of every reference (canonical values by
 * BlockResolve, whole warps per batch of rows), the buffer cut to its exact top kk by
 * (canonical, id) whenever the next 256 would not fit (cap >= kk + kBlock). Other queries
 * only add their count to the statistics. */
union RescueSm {
    BlockScan::TempStorage scan;
    BlockRadixSelect<unsigned long long>::TempStorage sel;
    BlockResolve::TempStorage res;
};

__global__ __launch_bounds__(kBlock) void mma_rescue_kernel(const MmaParams p, int kk, int euclid)
{
    __shared__ RescueSm sm;
    const int tid = (int)threadIdx.x;
    for (int q = (int)blockIdx.x; q < p.qs; q += (int)gridDim.x) {
        const int c0 = p.cnt[q];
        if (c0 <= p.cap) {
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
                BlockResolve::run(sm.res, seg, bc, INFINITY, qrow, p.d, p.R, p.ldr, 0, euclid);
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
        if (tid == 0) {
            p.cnt[q] = bc;
            atomicAdd(p.stats + kStatAppended, (unsigned long long)bc);
        }
        __syncthreads();
    }
}

template <int MODE, bool VEC>
cudaError_t launch_one(const MmaParams &p, int sms, cudaStream_t st)
{
    const int dpad = (int)((p.d + kBK - 1) / kBK * kBK);
    const size_t smem = mma_smem_bytes(p.d);
    cudaError_t e = cudaFuncSetAttribute(mma_kernel<MODE, VEC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    (void)dpad;
    const int64_t qt = (p.qs + kBM - 1) / kBM;
    const int64_t RT = (p.n + kBN - 1) / kBN;
    /* slices: at least 4 CTAs per SM in all (one resident per SM), query tiles fastest;
     * among up to 4x that many, the count whose last wave is fullest */
    int64_t z0 = (4 * (int64_t)sms + qt - 1) / qt, Z = z0;
    double best = 0.0;
    for (int64_t z = z0; z <= 4 * z0 && z <= RT; ++z) {
        const int64_t ctas = qt * z, waves = (ctas + sms - 1) / sms;
        const double eff = (double)ctas / (double)(waves * sms);
        if (eff > best + 1e-9) {
            best = eff;
            Z = z;
        }
    }
    if (Z > RT) Z = RT;
    if (Z > 65535) Z = 65535;
    if (Z < 1) Z = 1;
    MmaParams q = p;
    q.tiles_per_cta = (int)((RT + Z - 1) / Z);
    Z = (RT + q.tiles_per_cta - 1) / q.tiles_per_cta;
    mma_kernel<MODE, VEC><<<dim3((unsigned)qt, (unsigned)Z), kThreads, smem, st>>>(q);
    return cudaGetLastError();
}

} // namespace

size_t mma_smem_bytes(int64_t d)
{
    const int64_t dpad = (d + kBK - 1) / kBK * kBK;
    return sizeof(float) * (size_t)(kBM * (dpad + 4) + kStages * kBN * kRowB + kBM + kRnSlots * kBN);
}

cudaError_t launch_mma_pass(const MmaParams &p, int mode, int sms, cudaStream_t st)
{
    if (p.n <= 0 || p.qs <= 0) return cudaSuccess;
    const bool vec = ((uintptr_t)p.R % 16 == 0) && p.ldr % 4 == 0 && p.d % 4 == 0;
    if (mode == 0) return vec ? launch_one<0, true>(p, sms, st) : launch_one<0, false>(p, sms, st);
    return vec ? launch_one<1, true>(p, sms, st) : launch_one<1, false>(p, sms, st);
}

cudaError_t launch_mma_select(const MmaParams &p, int kk, int sms, cudaStream_t st)
{
    const int blocks = p.qs < 8 * sms ? p.qs : 8 * sms;
    mma_select_kernel<<<blocks, kBlock, 0, st>>>(p, kk);
    return cudaGetLastError();
}

cudaError_t launch_mma_rescue(const MmaParams &p, int kk, int euclid, int sms, cudaStream_t st)
{
    const int blocks = p.qs < 2 * sms ? p.qs : 2 * sms;
    mma_rescue_kernel<<<blocks, kBlock, 0, st>>>(p, kk, euclid);
    return cudaGetLastError();
}

} // namespace xknn_cuda
