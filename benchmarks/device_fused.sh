#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# benchmarks/device_fused.sh -- the fused path's checks and rows on a single-GPU machine,
# from the repository root, with OUT set to a folder whose files come back:
#
#   XKNN_GIT_COMMIT=<short hash> bash benchmarks/device_fused.sh
#
# Steps (each under a time limit, a failure does not stop the rest):
#   build      meson setup BUILD (release, gpu_arch 90) + ninja
#   test       meson test --suite cuda (cuda-t and the particles example)
#   bench      bench_knn: W4 / W5 (device and host modes; auto, fused, tf32), few queries at
#              d = 3 and d = 32 (fused vs fp32), and the dispatcher's crossover rows
#              (1M x 10k at d = 32 and d = 128, fused vs tf32; at d = 3, fused vs fp32)
#   particles  examples/particles 1000000 32 5 (d = 3 self-join of 1M points, k = 32)
# Files in OUT: fused.log (everything), test.log, bench_*.json, summary.txt. The summary
# table is printed last.
set -uo pipefail

OUT=${OUT:-$PWD/device-out}
BUILD=${BUILD:-build-dev}
STEPS=${STEPS:-"build test bench particles"}
TOTAL_S=${TOTAL_S:-460}
DEADLINE=$((SECONDS + TOTAL_S))
NPROC=$(nproc 2>/dev/null || echo 8)
mkdir -p "$OUT"
command -v nvcc >/dev/null 2>&1 || export PATH=/usr/local/cuda/bin:$PATH
SUM=$OUT/summary.txt
: >"$SUM"

has_step() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# step NAME LIMIT CMD...: CMD under min(LIMIT, time left - 20 s); one summary line.
step() {
    local name=$1 limit=$2 left rc t0
    shift 2
    left=$((DEADLINE - SECONDS - 20))
    if [ "$left" -lt 10 ]; then
        echo "$name SKIP(no time)" >>"$SUM"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== [$name] $*"
    t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    echo "$name rc=$rc $((SECONDS - t0))s" >>"$SUM"
}

main() {
    echo "# device_fused.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) commit ${XKNN_GIT_COMMIT:-unknown}"
    nvidia-smi -L
    local B=$BUILD/benchmarks/bench_knn
    if has_step build; then
        step setup 120 meson setup "$BUILD" -Dcuda=enabled -Dgpu_arch=90 -Dbuildtype=release
        step ninja 300 ninja -C "$BUILD" -j "$NPROC"
    fi
    if has_step test; then
        step test 200 meson test -C "$BUILD" --suite cuda --print-errorlogs
        cp "$BUILD/meson-logs/testlog.txt" "$OUT/test.log" 2>/dev/null || true
        grep -E "^(not ok|Bail)" "$OUT/test.log" | head -n 20
    fi
    if has_step bench && [ -x "$B" ]; then
        step W4 60 "$B" --backend cuda --n 16384 --nq 4096 --d 128 --k 16 --path auto,fused,tf32 \
            --mode device,host --repeats 20 --json "$OUT/bench_W4.json"
        step W5 60 "$B" --backend cuda --n 65536 --nq 4096 --d 128 --k 16 --path auto,fused,tf32 \
            --mode device,host --repeats 20 --json "$OUT/bench_W5.json"
        step D3-D32 60 "$B" --backend cuda --n 1M --nq 100 --d 3,32 --k 10,100 --path fused,fp32 \
            --repeats 5 --json "$OUT/bench_D.json"
        step X 90 "$B" --backend cuda --n 1M --nq 10k --d 32,128 --k 10 --path fused,tf32 --repeats 3 \
            --json "$OUT/bench_X.json"
        step D3N 60 "$B" --backend cuda --n 1M --nq 10k --d 3 --k 10,32 --path fused,fp32 --repeats 3 \
            --json "$OUT/bench_D3N.json"
    fi
    if has_step particles && [ -x "$BUILD/examples/particles" ]; then
        step particles 90 "$BUILD/examples/particles" 1000000 32 5
    fi
    echo "==== summary"
    cat "$SUM"
}

main 2>&1 | tee "$OUT/fused.log"
# the bench rows, compact, last
grep -hE "^ *[0-9]" "$OUT/fused.log" | grep -E "cuda" | cut -c1-150 | tail -n 40
grep -E "steps/s|per step|search" "$OUT/fused.log" | tail -n 5
