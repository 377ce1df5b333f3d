#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# benchmarks/device_selfjoin.sh -- issue 7's GPU rows. From the repository root, OUT set:
#
#   XKNN_GIT_COMMIT=<short hash> bash benchmarks/device_selfjoin.sh
#
# Steps (STEPS, default "single"):
#   single  one GPU, bench_selfjoin: the all-kNN graph of n = N uniform points (d = 128,
#           k = 16, l2) symmetric against plain in the same run, and at n = NPEER the same
#           with PyTorch's blocked mm + topk on the same data
#   mpi     knn_mpi REF (no query file: the symmetric ring) under mpirun for each rank
#           count in NPS, one GPU a rank (kind nvidia-h200-x2 or nvidia-h100-x2), on
#           MPI_N uniform points written by tests/mkdata; the outputs must be byte-identical
#           across rank counts, and SAMPLE rows are checked against a float64 brute force
#           (benchmarks/check_result.py --self); per-rank busy seconds come from --json;
#           speed-ups are against the first rank count of NPS
#
# Environment (all optional): BUILD=build-dev  GPU_ARCH=90  N=1M  NPEER=100k  REPEATS=3
#   PEERS=1 (0: no PyTorch)  WORK=/tmp/xknn-selfjoin  MPI_N=4000000  NPS="1 2"  SAMPLE=8
#   BACKEND=cuda (knn_mpi --backend; cpu to try the mpi step on a machine without GPU)
#   MPI_ARGS (extra mpirun options; default "--mca btl_vader_single_copy_mechanism cma":
#   single-copy transfers between the ranks of a node, where the kernel allows it; the
#   4M graph's 1 GB slice then arrives in 0.65-1.06 s, not 1.4-2.0 s; MPI_ARGS= for none)
# Files written to OUT: bench_selfjoin.json and peers_selfjoin.json (one JSON object per
# line), knn_mpi_npP.json (mpi step, one per rank count), device_selfjoin.log (everything).
set -uo pipefail
# shellcheck source=benchmarks/device_lib.sh
. "$(dirname "$0")/device_lib.sh"
OUT=${OUT:-$PWD/device-out}
BUILD=${BUILD:-build-dev}
GPU_ARCH=${GPU_ARCH:-90}
N=${N:-1M}
NPEER=${NPEER:-100k}
REPEATS=${REPEATS:-3}
PEERS=${PEERS:-1}
WORK=${WORK:-/tmp/xknn-selfjoin}
STEPS=${STEPS:-single}
MPI_N=${MPI_N:-4000000}
NPS=${NPS:-"1 2"}
SAMPLE=${SAMPLE:-8}
BACKEND=${BACKEND:-cuda}
MPI_ARGS=${MPI_ARGS-"--mca btl_vader_single_copy_mechanism cma"}
device_outputs selfjoin
device_env

if [ ! -f "$BUILD/build.ninja" ]; then
    quiet_or_exit setup.log meson setup "$BUILD" -Dbuildtype=release -Dcuda=enabled "-Dgpu_arch=$GPU_ARCH"
fi
quiet_or_exit build.log ninja -C "$BUILD" benchmarks/bench_selfjoin tools/knn_mpi tests/mkdata
rc=0

if has_step single; then
    B=$BUILD/benchmarks/bench_selfjoin
    timeout 400 "$B" -v --n "$N" --d 128 --k 16 --repeats "$REPEATS" --check 64 --json "$J" || rc=1
    timeout 200 "$B" --n "$NPEER" --d 128 --k 16 --repeats "$REPEATS" --check 64 --json "$J" \
        --write-data "$WORK/peer.fbin" || rc=1
    if [ "$PEERS" = 1 ]; then
        timeout 300 python3 benchmarks/peers_selfjoin.py --data "$WORK/peer.fbin" --k 16 --repeats "$REPEATS" \
            --json "$P" || rc=1
    fi
fi

if has_step mpi; then
    D=$WORK/sj_$MPI_N.fbin
    echo "=== mpi: $MPI_N uniform points, d = 128 -> $D"
    [ -f "$D" ] || timeout 120 "$BUILD/tests/mkdata" data uniform "$MPI_N" 128 7 "$D" || rc=1
    first=""
    for np in $NPS; do
        echo "=== mpi: knn_mpi, $np rank(s), backend $BACKEND (cuda: one GPU a rank)"
        # shellcheck disable=SC2086 # MPI_ARGS: words
        timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none $MPI_ARGS -np "$np" \
            "$BUILD/tools/knn_mpi" "$D" -k 16 -o "$WORK/sj_np$np.bin" --backend "$BACKEND" -v \
            --json "$OUT/knn_mpi_np$np.json" || { rc=1; continue; }
        if [ -z "$first" ]; then
            first=$WORK/sj_np$np.bin
        elif cmp "$first" "$WORK/sj_np$np.bin"; then
            echo "=== mpi: $np ranks: output byte-identical to $first"
        else
            echo "=== mpi: $np ranks: output DIFFERS from $first"; rc=1
        fi
    done
    [ -n "$first" ] && { timeout 200 python3 benchmarks/check_result.py "$first" "$D" "$D" --self \
        --sample "$SAMPLE" || rc=1; }
    python3 - "$OUT" $NPS <<'PY'
import json, os, sys
out, nps = sys.argv[1], sys.argv[2:]
base = None
for np_ in nps:
    p = os.path.join(out, f"knn_mpi_np{np_}.json")
    if not os.path.exists(p):
        print(f"ranks {np_}: no result"); continue
    j = json.load(open(p)); t = j["time_s"]
    base = base or t["query_phase"]
    busy = [r["busy_s"] for r in j.get("per_rank", [])]
    bal = f" busy {'/'.join(f'{b:.2f}' for b in busy)} s (max/mean {max(busy) * len(busy) / sum(busy):.3f})" if busy else ""
    print(f"ranks {np_}: n={j['n']} k={j['k']} {j.get('self_join_path')} read {t['read']:.2f} s, "
          f"self-join {t['query_phase']:.3f} s (search {t['search']:.3f}, reduce {t['reduce']:.3f}), "
          f"total {t['total']:.2f} s; speed-up {base / t['query_phase']:.2f}x;{bal}")
PY
fi
exit $rc
