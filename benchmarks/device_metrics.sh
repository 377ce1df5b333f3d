#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# benchmarks/device_metrics.sh -- issue 8's rows on one GPU in one call: every metric and
# dtype row of benchmarks/RESULTS.md ("Metrics and dtypes on the GPU") with its PyTorch
# peer on the same data, in the same call. From the repository root, OUT set:
#
#   XKNN_GIT_COMMIT=<short hash> bash benchmarks/device_metrics.sh
#
# Environment (all optional): BUILD=build-dev  GPU_ARCH=90  BACKEND=cuda
#   N=1M NQ=10k (the W1 size)  WHAM_NQ=1k (whamming: ~1 s per 1000 queries)  REPEATS=5
#   PEERS=1 (0: no PyTorch)  WORK=/tmp/xknn-metrics
# A CPU smoke run of the script itself: BACKEND=cpu N=20000 NQ=50 PEERS=0.
# Files written to OUT: bench_metrics.json and peers_metrics.json (one JSON object per
# line), device_metrics.log (everything).
set -uo pipefail
# shellcheck source=benchmarks/device_lib.sh
. "$(dirname "$0")/device_lib.sh"
OUT=${OUT:-$PWD/device-out}
BUILD=${BUILD:-build-dev}
GPU_ARCH=${GPU_ARCH:-90}
BACKEND=${BACKEND:-cuda}
N=${N:-1M}
NQ=${NQ:-10k}
WHAM_NQ=${WHAM_NQ:-1k}
REPEATS=${REPEATS:-5}
PEERS=${PEERS:-1}
WORK=${WORK:-/tmp/xknn-metrics}
device_outputs metrics

if [ ! -x "$BUILD/benchmarks/bench_metrics" ]; then
    args=(-Dbuildtype=release)
    [ "$BACKEND" = cuda ] && args+=(-Dcuda=enabled "-Dgpu_arch=$GPU_ARCH")
    quiet_or_exit setup.log meson setup "$BUILD" "${args[@]}"
fi
quiet_or_exit build.log ninja -C "$BUILD" benchmarks/bench_metrics
B=$BUILD/benchmarks/bench_metrics

# row: metric dtype d k repeats [peer-metric]
row() {
    local m=$1 t=$2 d=$3 k=$4 r=$5 peer=${6:-}
    local data=$WORK/${m}_${t}_${d} nq=$NQ
    [ "$m" = whamming ] && nq=$WHAM_NQ
    local log=$WORK/row.log
    timeout 300 "$B" -v --backend "$BACKEND" --metric "$m" --dtype "$t" --n "$N" --nq "$nq" --d "$d" --k "$k" \
        --repeats "$r" --check 8 --json "$J" ${peer:+--write-data "$data"} > "$log" 2>&1
    # the warm-up run's lines (plan, phases), the result line, and on the integer
    # tensor-core path the median device part of the timed runs
    awk '/^bench_metrics: warm-up run/ {w = 1; next} /^bench_metrics: timed run/ {w = 0; next}
         (w || !/^(xknn|bench_metrics):/) && !/^#/' "$log" | sed 's/^xknn: cuda: /  /'
    awk '/^bench_metrics: timed run/ {t = 1} t && /ms on the device/' "$log" |
        sed -E 's/.*then ([0-9.]+) ms on the device.*/\1/' | sort -n |
        awk '{a[NR] = $1} END {if (NR) printf "  device part, median of %d timed runs: %.2f ms (min %.2f, max %.2f)\n",
             NR, NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2, a[1], a[NR]}'
    if [ -n "$peer" ] && [ "$PEERS" = 1 ]; then
        timeout 300 python3 benchmarks/peers_metrics.py --data "$data" --metric "$peer" --dtype "$t" --k "$k" \
            --repeats "$([ "$peer" = l1 ] && echo 1 || echo 3)" --label "$m $t" --json "$P" 2>&1 | tail -1
    fi
}

row hamming bin 1024 10 "$REPEATS" hamming
row l2 u8 128 10 "$REPEATS" l2
row ip i8 128 10 "$REPEATS"
row l2 u8 128 100 3
row l2 f32 128 10 3 l2
row l1 f32 128 10 3 l1
row cosine f32 128 10 3 cosine
row ip f32 128 10 3 ip
row whamming bin 1024 10 3
echo "done: $(wc -l < "$J") xknn rows, $(wc -l < "$P") peer rows"
