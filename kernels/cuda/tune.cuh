/* SPDX-License-Identifier: MIT */
/*
 * kernels/cuda/tune.cuh -- every tuning constant of the CUDA backend's host code in one
 * place: the planner's path choice and shapes, the staging grain, the copier's ring. A
 * constant here moves work, never results: any value gives the same bytes (the kernels'
 * hard limits, which do bound results, are in common.cuh). The measurements behind them
 * are in benchmarks/RESULTS.md.
 */
#ifndef XKNN_CUDA_TUNE_CUH
#define XKNN_CUDA_TUNE_CUH

#include <stddef.h>
#include <stdint.h>

namespace xknn_cuda {

/* ---- path choice (choose_path) -------------------------------------------------------
 * AUTO takes the fused path for min(k, n) <= kFusedAutoMaxK and either d <=
 * kFusedAutoSmallD, or d <= kFusedAutoMidD and n nq d <= kFusedAutoWork: below those the
 * fused kernel beats the GEMM pipelines; above them TF32 tiles or the selection work win. */
static const int64_t kFusedAutoSmallD = 16;
static const int64_t kFusedAutoMidD = 32;
static const int64_t kFusedAutoMaxK = 32;
static const double kFusedAutoWork = 4e9;
/* the fused plan's Z x QS x KP key lists stay below this many bytes (QS shrinks) */
static const size_t kFusedPartMax = (size_t)256 << 20;

/* ---- tensor-core plan (plan_mma, witness_c) ------------------------------------------
 * C of the witness prefix nA = sqrt(C kk n): kMmaWitnessSmallC for kk <= kMmaWitnessSmallK
 * (few witness groups give a loose threshold, so a longer prefix pays), kMmaWitnessC
 * above; the int8 path keeps kImmaWitnessC (its pass A is cheaper, its candidates too);
 * the CUDA-core passes kFfmaWitnessC (their pass A costs as much per pair as pass B). At
 * least kMmaMinPrefix references. */
static const double kMmaWitnessC = 200.0, kMmaWitnessSmallC = 1600.0, kImmaWitnessC = 200.0;
static const double kFfmaWitnessC = 50.0;
static const int64_t kMmaWitnessSmallK = 128;
static const int64_t kMmaMinPrefix = 8192;

/* Estimated thresholds (plan_estimate): the estimate aims at kEstMargin kk references
 * within tau, from the j-th smallest witness with j about kEstHits groups, which puts the
 * margin at about five standard deviations. */
static const double kEstMargin = 1.3, kEstHits = 256.0;
/* the estimate's re-rank by reference ranges of 1 / kRangeL2Part of the L2 */
static const int kRangeL2Part = 1;

/* l2 / euclidean TF32 passes run on centred rows from n nq >= kCenterMinPairs on: below
 * it the copy and its two launches cost more than the tighter band saves */
static const double kCenterMinPairs = 4294967296.0;

/* ffma_kernel carries its accumulators for the prune from kk >= n / kFfmaCarryRatio on
 * (the carried registers slow its whole pass; mma_kernel always carries them) */
static const int64_t kFfmaCarryRatio = 16384;

/* ---- host staging (stage_piece) ------------------------------------------------------
 * Two pinned buffers of kStagePiece bytes; pieces of kStageGrain bytes (smaller pieces
 * overlap more, larger ones pay less per copy: 512 KiB balances the two). */
static const size_t kStagePiece = (size_t)4 << 20, kStageGrain = (size_t)512 << 10;

/* ---- the copy helpers (pool_copy) ----------------------------------------------------
 * At most kPoolHelpers helper threads beside the caller (eight copying threads reach the
 * host memory's copy bandwidth); chunks of kPoolChunk bytes, small enough that a helper
 * the scheduler stops mid-chunk leaves the caller little to wait for. With helpers, the
 * staging pieces are kStagePiece bytes: one wake-up of the helpers a piece. */
static const int kPoolHelpers = 7;
static const size_t kPoolChunk = (size_t)128 << 10;
/* A wait for a helper's chunk longer than kPoolLate seconds (a chunk copies in about
 * 20 us; a descheduled thread waits a scheduler slice, milliseconds) rests the helpers
 * for kPoolRest seconds */
static const double kPoolLate = 200e-6, kPoolRest = 0.1;

/* ---- the copier (xknn_cuda_copy_lists_start) -----------------------------------------
 * kJobs tickets in flight at most; two pinned buffers of kCopierBuf bytes for pageable
 * destinations. */
static const int kJobs = 16;
static const size_t kCopierBuf = (size_t)16 << 20;

} // namespace xknn_cuda

#endif
