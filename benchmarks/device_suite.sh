#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# benchmarks/device_suite.sh -- the whole cuda suite (plus NAMES) on a GPU machine, the
# tests shared out over its GPUs: each GPU runs one test at a time, taking the next name
# from one queue (the longest first), so the suite takes about its serial time over the
# number of GPUs. From the repository root, OUT set:
#
#   bash benchmarks/device_suite.sh
#
# Environment: BUILD=build-suite (configured fresh: release, CUDA, gpu_arch 90), GPUS
#   (default: every GPU nvidia-smi lists), FIRST (names to start with: the long ones),
#   NAMES (more test names, e.g. of other suites that use a GPU), LIMIT (seconds for the
#   whole run, default 540). Prints one line per test (name, GPU, seconds, meson's
#   verdict) and `N passed, N failed, N not run`; logs in OUT/suite-<gpu>.txt.
set -uo pipefail
OUT=${OUT:-$PWD/device-out}
BUILD=${BUILD:-build-suite}
LIMIT=${LIMIT:-540}
FIRST=${FIRST:-"cuda metrics-cuda-1 cuda-sym cuda-sym-mma-sync cuda-sym-center metrics-cuda-2"}
NAMES=${NAMES:-}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
t_start=$SECONDS
[ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" -Dbuildtype=release -Dcuda=enabled -Dgpu_arch=90 \
    -Dexamples=true > "$OUT/suite-setup.txt" 2>&1 || { tail -20 "$OUT/suite-setup.txt"; exit 1; }
ninja -C "$BUILD" > "$OUT/suite-build.txt" 2>&1 || { tail -30 "$OUT/suite-build.txt"; exit 1; }
echo "=== built in $((SECONDS - t_start)) s"
GPUS=${GPUS:-$(nvidia-smi -L | sed -n 's/^GPU \([0-9]*\):.*/\1/p' | tr '\n' ' ')}
all=$(meson introspect --tests "$BUILD" | python3 -c 'import json, sys
for t in json.load(sys.stdin):
    if any(s.split(":")[-1] == "cuda" for s in t["suite"]): print(t["name"])')
Q=$(mktemp)
for n in $FIRST; do echo "$all" | grep -qx "$n" && echo "$n"; done > "$Q"
for n in $all $NAMES; do grep -qx "$n" "$Q" || echo "$n" >> "$Q"; done
total=$(wc -l < "$Q")
worker() { # worker GPU: runs names from the queue until it is empty or time is up
    local g=$1 n t0 v
    while [ $((SECONDS - t_start)) -lt "$LIMIT" ]; do
        n=$(flock "$Q" sh -c 'head -n 1 "$1"; sed -i 1d "$1"' _ "$Q")
        [ -n "$n" ] || return 0
        t0=$SECONDS
        CUDA_VISIBLE_DEVICES=$g timeout $((LIMIT - (SECONDS - t_start) + 5)) meson test -C "$BUILD" --no-rebuild \
            --print-errorlogs --logbase "suite-$g-$n" "$n" >> "$OUT/suite-$g.txt" 2>&1 && v=OK || v=FAIL
        echo "$n gpu$g $((SECONDS - t0)) s $v" | tee -a "$OUT/suite-done.txt"
    done
}
for g in $GPUS; do worker "$g" & done
wait
pass=$(grep -c ' OK$' "$OUT/suite-done.txt" 2>/dev/null || echo 0)
fail=$(grep -c ' FAIL$' "$OUT/suite-done.txt" 2>/dev/null || echo 0)
echo "not run: $(tr '\n' ' ' < "$Q")"
echo "$pass passed, $fail failed, $((total - pass - fail)) not run (of $total, $((SECONDS - t_start)) s)"
