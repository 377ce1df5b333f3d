#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/device-run.sh -- the CUDA backend's checks on a GPU machine, from the repository
# root:  bash tests/device-run.sh
#
# Steps (each runs even when an earlier one failed, unless it needs the build):
#   configure   meson setup build-dev -Dgpu_arch=$GPU_ARCH -Dbuildtype=release (fresh)
#   build       ninja -C build-dev
#   device      nvidia-smi -L
#   test        meson test -C build-dev --print-errorlogs (all suites; with a device this
#               includes the 20 GPU runs of cli/determinism and the GPU faults of
#               cuda/faults-gpu: a rank without a device, more ranks than devices,
#               --device-memory below one tile)
#   memcheck    compute-sanitizer --tool memcheck  build-dev/tests/cuda-t (quick list)
#   racecheck   compute-sanitizer --tool racecheck build-dev/tests/cuda-t (quick list)
#   synccheck   compute-sanitizer --tool synccheck build-dev/tests/cuda-t (quick list)
#   symcheck    compute-sanitizer --tool memcheck build-dev/tests/cuda-sym-t (quick list:
#               the triangle, the blocked triangle and the pair kernel up to n = 6000)
# The sanitizer runs set XKNN_CUDA_TEST_QUICK: same TAP plan, fewer cases (1: heavy cases
# skipped, ~30 s each on an H100 for memcheck and synccheck; 2: a covering subset for
# racecheck, which is ~100x slower).
#
# Environment:
#   OUT             if set, logs are copied there (device-run-<step>.log, summary.txt)
#   STEPS           subset to run, e.g. STEPS="configure build test" (default: all)
#   GPU_ARCH        default 90
#   STEP_TIMEOUT    seconds per step (default 1800; sanitizer steps are the slow ones)
# Exit status: 0 only if every selected step passed.
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=build-dev
GPU_ARCH=${GPU_ARCH:-90}
STEPS=${STEPS:-"configure build device test memcheck racecheck synccheck symcheck"}
STEP_TIMEOUT=${STEP_TIMEOUT:-1800}
LOGDIR=$(mktemp -d /tmp/xknn-device-run.XXXXXX)
declare -a RESULTS=()
FAILED=0
BUILD_OK=1

want() { [[ " $STEPS " == *" $1 "* ]]; }

# step NAME NEEDS_BUILD CMD...: runs CMD with its output teed to a log; records PASS/FAIL.
step() {
    local name=$1 needs_build=$2
    shift 2
    want "$name" || return 0
    if [[ $needs_build == 1 && $BUILD_OK == 0 ]]; then
        RESULTS+=("SKIP  $name (no build)")
        FAILED=1
        return 0
    fi
    local log="$LOGDIR/device-run-$name.log" rc=0 t0=$SECONDS
    echo "==== $name: $*"
    set +e
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    if [[ $rc == 0 ]]; then
        RESULTS+=("PASS  $name ($((SECONDS - t0)) s)")
    else
        RESULTS+=("FAIL  $name (exit $rc, $((SECONDS - t0)) s)")
        FAILED=1
    fi
    return 0
}

# t CMD...: CMD under the per-step time limit.
t() { timeout "$STEP_TIMEOUT" "$@"; }

# sanitize LEVEL TOOL ARGS...: cuda-t (TEST: another test program) under compute-sanitizer
# with a reduced case list
sanitize() {
    local level=$1 tool=$2
    shift 2
    XKNN_CUDA_TEST_QUICK=$level t compute-sanitizer --tool "$tool" --error-exitcode 99 "$@" "$BUILD/tests/${TEST:-cuda-t}"
}

if want configure; then
    rm -rf "$BUILD"
    step configure 0 t meson setup "$BUILD" -Dgpu_arch="$GPU_ARCH" -Dbuildtype=release
    [[ ${RESULTS[-1]} == PASS* ]] || BUILD_OK=0
fi
if want build; then
    step build 0 t ninja -C "$BUILD"
    [[ ${RESULTS[-1]} == PASS* ]] || BUILD_OK=0
fi
step device 0 nvidia-smi -L
step test 1 t meson test -C "$BUILD" --print-errorlogs
step memcheck 1 sanitize 1 memcheck --leak-check full
step racecheck 1 sanitize 2 racecheck --racecheck-report all
step synccheck 1 sanitize 1 synccheck
TEST=cuda-sym-t step symcheck 1 sanitize 1 memcheck

{
    echo "device-run on $(hostname) at $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi -L 2>/dev/null || true
    printf '%s\n' "${RESULTS[@]}"
    if [[ $FAILED == 0 ]]; then echo "ALL PASSED"; else echo "SOME STEPS FAILED"; fi
} | tee "$LOGDIR/summary.txt"

if [[ -n ${OUT:-} ]]; then
    mkdir -p "$OUT"
    # at most 8 files: configure+build in one log, the device log only in the summary
    cat "$LOGDIR"/device-run-configure.log "$LOGDIR"/device-run-build.log >"$OUT/device-run-build.log" 2>/dev/null || true
    for s in test memcheck racecheck synccheck symcheck; do
        [[ -f $LOGDIR/device-run-$s.log ]] && cp "$LOGDIR/device-run-$s.log" "$OUT"/ || true
    done
    cp "$LOGDIR/summary.txt" "$OUT"/
    [[ -f $BUILD/meson-logs/testlog.txt ]] && cp "$BUILD/meson-logs/testlog.txt" "$OUT/device-run-testlog.txt" || true
fi
exit "$FAILED"
