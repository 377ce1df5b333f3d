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

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
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

has_step() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

step() {
    local name=$1 limit=$2 t0 t1 rc verdict left
    shift 2
    # never run past the deadline: the summary must still be printed inside the call
    left=$((DEADLINE - SECONDS - 20))
    if [ "$left" -lt 10 ]; then
        printf '%-24s %-16s %8s\n' "$name" "SKIP(no time)" "-" >>"$WORK/steps.txt"
        echo "=== [$name] skipped: less than 30 s left of TOTAL_S=$TOTAL_S"
        LAST_RC=124
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo
    echo "=== [$name] $*"
    t0=$(date +%s.%N)
    timeout --kill-after=15 "$limit" "$@"
    rc=$?
    t1=$(date +%s.%N)
    case $rc in
    0) verdict=ok ;;
    124 | 137) verdict="TIMEOUT(${limit}s)" ;;
    *) verdict="FAIL(rc=$rc)" ;;
    esac
    printf '%-24s %-16s %8ss\n' "$name" "$verdict" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" \
        >>"$WORK/steps.txt"
    echo "=== [$name] $verdict"
    LAST_RC=$rc
    return 0
}

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
    if [ -z "${XKNN_GIT_COMMIT:-}" ] && git rev-parse --short HEAD >/dev/null 2>&1; then
        XKNN_GIT_COMMIT=$(git rev-parse --short HEAD)
    fi
    export XKNN_GIT_COMMIT=${XKNN_GIT_COMMIT:-unknown}
    echo "# commit $XKNN_GIT_COMMIT; $NPROC cores; $(uname -r)"
    nvidia-smi -L
    nvidia-smi topo -m || true
    command -v nvcc >/dev/null 2>&1 || export PATH=/usr/local/cuda/bin:$PATH
    echo "# $(mpirun --version 2>/dev/null | head -n 1)"

    if has_step build; then
        if [ -f "$BUILD/build.ninja" ]; then
            step meson-setup 300 meson setup --reconfigure "$BUILD" -Dcuda=enabled -Dmpi=enabled -Dgpu_arch=90 \
                -Dbuildtype=release
        else
            step meson-setup 300 meson setup "$BUILD" -Dcuda=enabled -Dmpi=enabled -Dgpu_arch=90 -Dbuildtype=release
        fi
        step ninja 600 ninja -C "$BUILD" -j "$NPROC"
    fi
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
jdir, out = sys.argv[1:3]
runs = []
for p in sorted(glob.glob(os.path.join(jdir, "*.json"))):
    try:
        with open(p) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"# cannot read {p}: {e}")
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
