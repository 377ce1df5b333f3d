#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# benchmarks/device_scaling.sh -- strong and weak scaling of the distributed search on the
# two-GPU machine (nvidia-h200-x2). From the repository root, with OUT set:
#
#   XKNN_GIT_COMMIT=<short hash> bash benchmarks/device_scaling.sh
#
# Steps, each timed and allowed to fail without stopping the rest:
#   build    meson setup BUILD (-Dcuda=enabled -Dmpi=enabled ...) + ninja
#   probe    a tiny CPU bench_scaling under mpirun -np 2; if it fails, retried with
#            "--mca pml ob1 --mca btl self,vader,tcp", which the later runs then use
#   gpu      --backend cuda, for each NP: strong (n = STRONG_N, d, nq, k) and weak
#            (n = WEAK_N per rank)
#   cpu      --backend cpu, strong (n = CPU_N, nq = CPU_NQ), for each NP
#   summary  efficiency table (benchmarks/plot.py; PNGs when matplotlib is there)
# Environment (optional): STEPS="build probe gpu cpu", NPS="1 2", STRONG_N=20M,
#   WEAK_N=10M, NQ=10k, D=128, K=100, QB=<queries per broadcast block; default NQ: one
#   block>, REPEATS=3, SAMPLE=20 (queries checked against the oracle on rank 0, which
#   regenerates all n references: ~0.5 s per sampled query and 10M references),
#   CPU_N=2M, CPU_NQ=1000, RUN_TIMEOUT=300, BUILD=build-dev, WORK=/tmp/xknn-scaling,
#   MPI_EXTRA (more mpirun arguments), XKNN_GIT_COMMIT, TOTAL_S=570 (deadline of the
#   whole script: steps are cut short or skipped so the summary is always printed).
# Files written to OUT: device_scaling.log, bench_scaling.json (list of runs),
# summary.txt, scaling_strong.png, scaling_weak.png.
set -uo pipefail
# shellcheck source=benchmarks/device_lib.sh
. "$(dirname "$0")/device_lib.sh"

device_env
export OMPI_MCA_btl_vader_single_copy_mechanism=none

OUT=${OUT:-$PWD/device-out}
STEPS=${STEPS:-"build probe gpu cpu"}
NPS=${NPS:-"1 2"}
STRONG_N=${STRONG_N:-20M}
WEAK_N=${WEAK_N:-10M}
NQ=${NQ:-10k}
D=${D:-128}
K=${K:-100}
QB=${QB:-$NQ}
REPEATS=${REPEATS:-3}
SAMPLE=${SAMPLE:-20}
CPU_N=${CPU_N:-2M}
CPU_NQ=${CPU_NQ:-1000}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
BUILD=${BUILD:-build-dev}
WORK=${WORK:-/tmp/xknn-scaling}
MPI_EXTRA=${MPI_EXTRA:-}
TOTAL_S=${TOTAL_S:-570}
NPROC=$(nproc 2>/dev/null || echo 8)
DEADLINE=$((SECONDS + TOTAL_S))

mkdir -p "$OUT" "$WORK/json"
rm -f "$WORK"/json/*.json "$WORK/steps.txt"

# run_np NAME NP ARGS...: bench_scaling under mpirun with NPROC/NP OpenMP threads per rank
run_np() {
    local name=$1 np=$2 threads
    shift 2
    local envs=() v
    threads=$((NPROC / np))
    [ "$threads" -lt 1 ] && threads=1
    for v in XKNN_GIT_COMMIT NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS PATH LD_LIBRARY_PATH; do
        [ -n "${!v:-}" ] && envs+=(-x "$v")
    done
    # shellcheck disable=SC2086
    step "$name" "$RUN_TIMEOUT" mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
        -x OMP_NUM_THREADS="$threads" "${envs[@]}" $MPI_EXTRA "$BUILD/benchmarks/bench_scaling" "$@"
}

main() {
    local BS=$BUILD/benchmarks/bench_scaling np
    echo "# device_scaling.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ), steps: $STEPS, ranks: $NPS"
    device_commit
    nvidia-smi topo -m || true
    command -v nvcc >/dev/null 2>&1 || export PATH=/usr/local/cuda/bin:$PATH
    echo "# $(mpirun --version 2>/dev/null | head -n 1)"

    has_step build && build_steps -Dcuda=enabled -Dmpi=enabled -Dgpu_arch=90
    if [ ! -x "$BS" ]; then
        echo "=== no $BS: nothing to run"
        return 0
    fi

    if has_step probe; then
        run_np probe 2 --backend cpu --n 3000 --nq 50 --d 16 --k 1,10 --repeats 1
        if [ "$LAST_RC" -ne 0 ]; then
            MPI_EXTRA="$MPI_EXTRA --mca pml ob1 --mca btl self,vader,tcp"
            echo "# probe failed: retrying with MPI_EXTRA=$MPI_EXTRA"
            run_np probe-ob1 2 --backend cpu --n 3000 --nq 50 --d 16 --k 1,10 --repeats 1
        fi
    fi

    if has_step gpu; then
        for np in $NPS; do
            run_np "gpu-strong-np$np" "$np" --backend cuda --n "$STRONG_N" --nq "$NQ" --d "$D" --k "$K" \
                --query-block "$QB" --repeats "$REPEATS" --sample "$SAMPLE" --json "$WORK/json/gpu_strong_np$np.json"
        done
        for np in $NPS; do
            run_np "gpu-weak-np$np" "$np" --backend cuda --n-per-rank "$WEAK_N" --nq "$NQ" --d "$D" --k "$K" \
                --query-block "$QB" --repeats "$REPEATS" --sample "$SAMPLE" --json "$WORK/json/gpu_weak_np$np.json"
        done
    fi
    if has_step cpu; then
        for np in $NPS; do
            run_np "cpu-strong-np$np" "$np" --backend cpu --n "$CPU_N" --nq "$CPU_NQ" --d "$D" --k "$K" \
                --repeats "$REPEATS" --json "$WORK/json/cpu_strong_np$np.json"
        done
    fi

    python3 - "$WORK/json" "$OUT" <<'PY'
import glob, json, os, sys
sys.path.insert(0, "benchmarks")
from bench_util import read_json
jdir, out = sys.argv[1:3]
runs = []
for p in sorted(glob.glob(os.path.join(jdir, "*.json"))):
    doc = read_json(p)
    if doc is None:
        continue
    doc["label"] = os.path.basename(p)[:-5]
    runs.append(doc)
if runs:
    with open(os.path.join(out, "bench_scaling.json"), "w") as f:
        json.dump(runs, f, indent=1)
PY
    {
        echo "== steps"
        cat "$WORK/steps.txt" 2>/dev/null
        echo "== rows"
        printf '%-16s %5s %10s %6s %5s %9s %10s %10s %10s %13s %9s %6s %s\n' label ranks n nq k bcast_ms search_ms \
            reduce_ms total_ms queries_per_s imbalance wrong status
        python3 - "$OUT/bench_scaling.json" <<'PY'
import json, sys
try:
    runs = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    runs = []
f = lambda v, fmt: "-" if v is None else format(v, fmt)
for run in runs:
    for r in run["rows"]:
        print(f"{run['label']:16s} {r['ranks']:5d} {r['n']:10d} {r['nq']:6d} {r['k']:5d} {f(r['broadcast_ms'], '9.1f')} "
              f"{f(r['search_ms'], '10.1f')} {f(r['reduce_ms'], '10.1f')} {f(r['total_ms'], '10.1f')} "
              f"{f(r['queries_per_s'], '13.0f')} {f(r['imbalance'], '9.3f')} {r['wrong']:6d} {r['status']}")
PY
        echo "== efficiency (strong T1/(p Tp), weak T1/Tp)"
        [ -f "$OUT/bench_scaling.json" ] && python3 benchmarks/plot.py --out "$OUT" "$OUT/bench_scaling.json" 2>&1
    } | tee "$OUT/summary.txt"
}

LAST_RC=0
main 2>&1 | tee "$OUT/device_scaling.log"
exit 0
