#!/usr/bin/env bash
# benchmarks/device_selfjoin.sh -- issue 7's GPU rows in one call: the all-kNN graph of
# n = 1M uniform points (d = 128, k = 16, l2) symmetric against plain in the same run,
# and at n = 100k the same with PyTorch's blocked mm + topk on the same data. From the
# repository root, OUT set:
#
#   XKNN_GIT_COMMIT=<short hash> bash benchmarks/device_selfjoin.sh
#
# Environment (all optional): BUILD=build-dev  GPU_ARCH=90  N=1M  NPEER=100k  REPEATS=3
#   PEERS=1 (0: no PyTorch)  WORK=/tmp/xknn-selfjoin
# Files written to OUT: bench_selfjoin.json and peers_selfjoin.json (one JSON object per
# line), device_selfjoin.log (everything).
set -uo pipefail
OUT=${OUT:-$PWD/device-out}
BUILD=${BUILD:-build-dev}
GPU_ARCH=${GPU_ARCH:-90}
N=${N:-1M}
NPEER=${NPEER:-100k}
REPEATS=${REPEATS:-3}
PEERS=${PEERS:-1}
WORK=${WORK:-/tmp/xknn-selfjoin}
mkdir -p "$OUT" "$WORK"
LOG=$OUT/device_selfjoin.log
J=$OUT/bench_selfjoin.json
P=$OUT/peers_selfjoin.json
: > "$J"
: > "$P"
exec > >(tee -a "$LOG") 2>&1

if [ ! -x "$BUILD/benchmarks/bench_selfjoin" ]; then
    meson setup "$BUILD" -Dbuildtype=release -Dcuda=enabled "-Dgpu_arch=$GPU_ARCH" > "$WORK/setup.log" 2>&1 ||
        { tail -20 "$WORK/setup.log"; exit 1; }
fi
ninja -C "$BUILD" benchmarks/bench_selfjoin > "$WORK/build.log" 2>&1 || { tail -20 "$WORK/build.log"; exit 1; }
B=$BUILD/benchmarks/bench_selfjoin
rc=0
timeout 400 "$B" -v --n "$N" --d 128 --k 16 --repeats "$REPEATS" --check 64 --json "$J" || rc=1
timeout 200 "$B" --n "$NPEER" --d 128 --k 16 --repeats "$REPEATS" --check 64 --json "$J" \
    --write-data "$WORK/peer.fbin" || rc=1
if [ "$PEERS" = 1 ]; then
    timeout 300 python3 benchmarks/peers_selfjoin.py --data "$WORK/peer.fbin" --k 16 --repeats "$REPEATS" \
        --json "$P" || rc=1
fi
exit $rc
