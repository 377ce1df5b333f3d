#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# benchmarks/device_compare.sh -- this tree against a baseline tree in the same call, on a
# GPU machine (two GPUs for the ring rows). From the repository root, OUT set:
#
#   BASE=<baseline source tree> bash benchmarks/device_compare.sh
#
# Both trees are built (release, CUDA, gpu_arch 90) side by side; then, alternating base
# and head on the same data, each row REPEATS times:
#   W1W2  bench_knn n = 1M, nq = 10k, d = 128, k = 10 and 100, path auto
#   W4    bench_knn n = 16384, nq = 4096, d = 128, k = 16, device and host arrays
#   RING  knn_mpi REF (the symmetric ring), MPI_N uniform points, k = 16, on 1 and 2 ranks;
#         every output must equal base's one-rank output byte for byte
#   TESTS meson test on head's build for the names in TESTS (GPU suites touched); with
#         STEPS containing both bench and tests and TEST_GPU set, the tests run on that GPU
#         beside the W1W2/W4 rows, which then run on BENCH_GPU (default 0)
# A summary table (median ms per row, head / base) is printed last and written to
# OUT/compare.txt (logs in OUT/compare.log).
# Environment: BASE (required), STEPS="build bench ring tests", REPEATS=5, MPI_N=4000000,
#   TESTS="...", TEST_GPU, BENCH_GPU=0, TEST_TIMEOUT=420, JOBS=(cores), WORK=/tmp/xknn-compare.
set -uo pipefail
OUT=${OUT:-$PWD/device-out}
BASE=${BASE:?set BASE to the baseline source tree}
STEPS=${STEPS:-"build bench ring tests"}
REPEATS=${REPEATS:-5}
MPI_N=${MPI_N:-4000000}
TESTS=${TESTS:-"cuda metrics-cuda-1 cuda-sym cuda-ring"}
TEST_GPU=${TEST_GPU:-}
BENCH_GPU=${BENCH_GPU:-0}
TEST_TIMEOUT=${TEST_TIMEOUT:-420}
JOBS=${JOBS:-$(nproc)}
WORK=${WORK:-/tmp/xknn-compare}
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/compare.log") 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
has() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
HB=$PWD/build-head
BB=$PWD/build-base-tree # beside head's: a carried BASE replaces what lies under it on each call
knn_of() { if [ -x "$1/tools/knn_mpi" ]; then echo "$1/tools/knn_mpi"; else echo "$1/mpi/knn_mpi"; fi; }

if has build; then
    t0=$SECONDS
    for t in head base; do
        src=$PWD; b=$HB; tests=true
        [ $t = base ] && { src=$BASE; b=$BB; tests=false; }
        ( [ -f "$b/build.ninja" ] || meson setup "$b" "$src" -Dbuildtype=release -Dcuda=enabled -Dgpu_arch=90 \
              -Dtests=$tests -Dexamples=false > "$WORK/setup-$t.log" 2>&1 ) || { tail -20 "$WORK/setup-$t.log"; exit 1; }
    done
    ninja -C "$HB" -j "$JOBS" > "$WORK/build-head.log" 2>&1 &
    hp=$!
    ninja -C "$BB" -j "$JOBS" benchmarks/bench_knn "$(basename "$(dirname "$(knn_of "$BB")")")/knn_mpi" \
        > "$WORK/build-base.log" 2>&1 || { tail -30 "$WORK/build-base.log"; exit 1; }
    wait $hp || { tail -30 "$WORK/build-head.log"; exit 1; }
    echo "=== built both trees in $((SECONDS - t0)) s"
fi

run_tests() {
    # shellcheck disable=SC2086 # TESTS: names
    timeout "$TEST_TIMEOUT" meson test -C "$HB" --print-errorlogs --num-processes 1 $TESTS > "$WORK/tests.log" 2>&1
    echo "=== tests ($TESTS): exit $?"
    grep -E "^ *[0-9]+/[0-9]+ " "$WORK/tests.log"
    cp "$HB/meson-logs/testlog.txt" "$OUT/compare_tests.txt" 2>/dev/null
}
beside=""
if has tests && has bench && [ -n "$TEST_GPU" ]; then
    ( export CUDA_VISIBLE_DEVICES=$TEST_GPU; run_tests ) &
    beside=$!
fi
if has bench; then
    export CUDA_VISIBLE_DEVICES=$BENCH_GPU
    for rep in 1 2; do # alternate: base, head, base, head
        for t in base head; do
            b=$HB; [ $t = base ] && b=$BB
            timeout 200 "$b/benchmarks/bench_knn" --backend cuda --n 1M --nq 10k --d 128 --k 10,100 --path auto \
                --repeats "$REPEATS" --json "$WORK/W1W2_${t}_$rep.json" || echo "W1W2 $t FAILED"
            timeout 200 "$b/benchmarks/bench_knn" --backend cuda --n 16384 --nq 4096 --d 128 --k 16 --path auto \
                --mode device,host --repeats 20 --json "$WORK/W4_${t}_$rep.json" || echo "W4 $t FAILED"
        done
    done
    unset CUDA_VISIBLE_DEVICES
fi
if [ -n "$beside" ]; then
    wait "$beside"
elif has tests; then
    run_tests
fi

if has ring; then
    D=$WORK/ring_$MPI_N.fbin
    [ -f "$D" ] || timeout 120 "$HB/tests/mkdata" data uniform "$MPI_N" 128 7 "$D"
    ref=$WORK/ring_ref.bin
    rm -f "$ref"
    for rep in $(seq 1 "$REPEATS"); do
        for t in base head; do
            b=$HB; [ $t = base ] && b=$BB
            for np in 1 2; do
                o=$WORK/ring_${t}_np$np.bin
                timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none \
                    --mca btl_vader_single_copy_mechanism cma -np $np "$(knn_of "$b")" "$D" -k 16 -q \
                    --backend cuda -o "$o" --json "$WORK/ring_${t}_np${np}_$rep.json" || echo "RING $t np$np FAILED"
                [ -f "$ref" ] || cp "$o" "$ref" # the first: base on one rank
                cmp -s "$o" "$ref" || echo "RING $t np$np rep $rep: output DIFFERS from base np1"
                rm -f "$o"
            done
        done
    done
fi

python3 - "$OUT" "$WORK" <<'PY' | tee "$OUT/compare.txt"
import glob, json, os, statistics, sys
out, work = sys.argv[1:3]
def rows(pattern):
    r, wrong = {}, 0
    for path in glob.glob(pattern):
        for row in json.load(open(path)).get("rows", []):
            key = (row.get("n"), row.get("k"), row.get("mode"), row.get("path"))
            if row.get("time_ms") is not None: r.setdefault(key, []).append(row["time_ms"])
            wrong += row.get("wrong") or 0
    return r, wrong
print("row                                   base ms    head ms   head/base")
for w in ("W1W2", "W4"):
    (b, wb), (h, wh) = rows(f"{work}/{w}_base_*.json"), rows(f"{work}/{w}_head_*.json")
    for key in sorted(set(b) | set(h), key=str):
        bm = statistics.median(b[key]) if key in b else float("nan")
        hm = statistics.median(h[key]) if key in h else float("nan")
        print(f"{w} n={key[0]} k={key[1]} {key[2]:6s} {str(key[3]):6s} {bm:10.3f} {hm:10.3f} {hm / bm:8.3f}")
    print(f"{w} wrong ids: base {wb}, head {wh}")
for np_ in (1, 2):
    m = {}
    for t in ("base", "head"):
        v = [json.load(open(p))["time_s"]["query_phase"] for p in glob.glob(f"{work}/ring_{t}_np{np_}_*.json")]
        m[t] = statistics.median(v) * 1e3 if v else float("nan")
    print(f"RING ranks={np_} self-join phase        {m['base']:10.1f} {m['head']:10.1f} {m['head'] / m['base']:8.3f}")
PY
