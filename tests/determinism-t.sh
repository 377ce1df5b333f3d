#!/bin/sh
# SPDX-License-Identifier: MIT
# determinism-t.sh KNN_MPI MKDATA MPIRUN|none -- the same search 20 times gives the same
# bytes (TAP).
#
# One tie-heavy problem (integer coordinates in 0..3: many equal distances, decided by
# id; n = 9001 references, more than one CPU reference block on one rank, nq = 301) is
# solved 20 times on the CPU, on 1 rank and on 3, with query blocks of 1, 7, 13, 64,
# 300 and the automatic size, on 1 and 2 threads. Every result must equal the oracle's
# (tests/ref via mkdata) byte for byte, ids and distance bits. 3 ranks of 2 threads
# share the cores: OpenMP threads sleep instead of spinning while they wait. Then, when
# `knn_mpi --backend cuda` works here, 20 runs on the GPU (1 and 3 ranks sharing the
# devices, several query blocks, a small reference slice in some) must give the same
# bytes; on a machine without a usable device those lines are "# SKIP no CUDA device".
# POSIX sh.

KNN=$1
MK=$2
MPIRUN=${3:-none}
. "$(dirname "$0")/tap.sh"
tap_begin determinism-t 42

export OMP_WAIT_POLICY=PASSIVE

# run NP THREADS QB SLICE OUT [ARGS...]: one search; QB "auto" leaves the block size to
# knn_mpi, SLICE "-" leaves XKNN_CUDA_REF_SLICE unset.
run() {
    np=$1 th=$2 qb=$3 sl=$4 out=$5
    shift 5
    set -- -q -k 10 --threads "$th" -o "$out" "$@" "$D/ref.fbin" "$D/q.fbin"
    [ "$qb" = auto ] || set -- --query-block "$qb" "$@"
    if [ "$np" -eq 1 ]; then
        if [ "$sl" = - ]; then
            timeout -k 5 120 "$KNN" "$@" <"/dev/null" >"$T/out" 2>"$T/err"
        else
            XKNN_CUDA_REF_SLICE=$sl timeout -k 5 120 "$KNN" "$@" <"/dev/null" >"$T/out" 2>"$T/err"
        fi
    else
        if [ "$sl" = - ]; then
            timeout -k 5 120 "$MPIRUN" --allow-run-as-root --oversubscribe -np "$np" "$KNN" "$@" <"/dev/null" >"$T/out" 2>"$T/err"
        else
            timeout -k 5 120 "$MPIRUN" --allow-run-as-root --oversubscribe -x XKNN_CUDA_REF_SLICE="$sl" -np "$np" \
                "$KNN" "$@" <"/dev/null" >"$T/out" 2>"$T/err"
        fi
    fi
    RC=$?
}
# same FILE WANT: 0 when the last run ended 0 and FILE equals WANT byte for byte
same() {
    WHY=
    if [ "$RC" -ne 0 ]; then WHY="exit status $RC"; return 1; fi
    if ! cmp "$1" "$2" >"$T/cmp" 2>&1; then WHY="$(cat "$T/cmp")"; return 1; fi
    return 0
}

D=$T
mk data integer 9001 8 11 "$D/ref.fbin"
mk data integer 301 8 12 "$D/q.fbin"
mk oracle l2 10 "$D/ref.fbin" "$D/q.fbin" "$D/want.bin"

# ---- 20 CPU runs: NP THREADS QB ------------------------------------------------------------
CPU_RUNS="1 1 auto
1 2 7
3 1 7
3 2 64
1 1 1
3 1 300
1 2 64
3 2 auto
1 1 300
3 1 1
1 2 auto
3 2 7
1 1 64
3 1 auto
1 2 1
3 2 300
1 1 7
3 1 64
1 2 300
3 2 13"
i=0
echo "$CPU_RUNS" >"$T/cpu_runs"
while read -r np th qb; do
    i=$((i + 1))
    if [ "$np" -gt 1 ] && [ "$MPIRUN" = none ]; then
        skip "MPI not built: CPU run $i ($np ranks)"
        continue
    fi
    run "$np" "$th" "$qb" - "$T/cpu$i.bin" --backend cpu
    same "$T/cpu$i.bin" "$D/want.bin"
    ok $? "CPU run $i/20 ($np rank(s), $th thread(s), query block $qb): the oracle's bytes"
done <"$T/cpu_runs"
WHY=
bad=
for f in "$T"/cpu*.bin; do
    [ -f "$f" ] || continue
    cmp -s "$f" "$T/cpu1.bin" || bad="$bad $(basename "$f")"
done
[ -f "$T/cpu1.bin" ] && [ -z "$bad" ]
st=$?
WHY="differ from run 1:$bad"
ok $st "the CPU runs' result files are byte-identical"

# ---- 20 GPU runs (when a CUDA device is usable): NP QB SLICE ------------------------------
GPU_RUNS="1 auto -
3 auto -
1 7 -
3 7 -
1 64 1000
3 64 1000
1 300 -
3 300 -
1 1 -
3 1 -
1 auto 4096
3 auto 4096
1 7 -
3 7 -
1 64 -
3 64 -
1 300 1000
3 300 1000
1 auto -
3 auto -"
run 1 1 auto - "$T/probe.bin" --backend cuda
if [ "$RC" -eq 0 ]; then
    echo "$GPU_RUNS" >"$T/gpu_runs"
    i=0
    while read -r np qb sl; do
        i=$((i + 1))
        if [ "$np" -gt 1 ] && [ "$MPIRUN" = none ]; then
            skip "MPI not built: GPU run $i ($np ranks)"
            continue
        fi
        run "$np" 1 "$qb" "$sl" "$T/gpu$i.bin" --backend cuda
        same "$T/gpu$i.bin" "$D/want.bin"
        ok $? "GPU run $i/20 ($np rank(s), query block $qb, reference slice $sl): the oracle's bytes"
    done <"$T/gpu_runs"
    bad=
    for f in "$T"/gpu*.bin; do
        cmp -s "$f" "$T/gpu1.bin" || bad="$bad $(basename "$f")"
    done
    [ -f "$T/gpu1.bin" ] && [ -z "$bad" ] && cmp -s "$T/gpu1.bin" "$T/cpu1.bin"
    st=$?
    WHY="differ from GPU run 1 or from the CPU:$bad"
    ok $st "the GPU runs' result files are byte-identical, and equal the CPU's"
else
    echo "# --backend cuda: exit $RC ($(grep -m 1 '^knn_mpi: ' "$T/err"))"
    i=0
    while [ $i -lt 21 ]; do
        skip "no CUDA device"
        i=$((i + 1))
    done
fi

tap_end
