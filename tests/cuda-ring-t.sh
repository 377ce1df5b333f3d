#!/bin/sh
# SPDX-License-Identifier: MIT
# cuda-ring-t.sh KNN_MPI MKDATA MPIRUN|none -- the all-kNN graph (no query file: the
# symmetric self-join) on the CUDA backend, 1..5 ranks sharing the devices there are
# (TAP, suite cuda).
#
# Device budgets small enough that the one-rank triangle runs in blocks and the ranks'
# pairs in parts: the rows kept on the device (xknn_cuda_keep_rows; with 4 and 5 ranks
# the ring's two slice buffers are reused, so a kept slice is forgotten and another
# kept in its place), the running lists merged on the device between parts, parts too
# small for the kernels on the CPU (their lists to the host and back). Every output must
# be byte-identical: tie-heavy duplicates against the oracle (tests/ref via mkdata), a
# larger uniform set against the one-rank run. Where `knn_mpi --backend cuda` does not
# work every line is "# SKIP". BACKEND=cpu runs the same lines on the CPU, and N_UNI
# (default 300007) sets the uniform set's size (a check of the script itself on a
# machine without a GPU: BACKEND=cpu N_UNI=20001). POSIX sh.

KNN=$1
MK=$2
MPIRUN=${3:-none}
BACKEND=${BACKEND:-cuda}
N_UNI=${N_UNI:-300007}
. "$(dirname "$0")/tap.sh"
tap_begin cuda-ring-t 10

export OMP_WAIT_POLICY=PASSIVE
run() { # run NP OUT ARGS...: the self-join on NP ranks (1: a plain process), 240 s at most
    np=$1 out=$2
    shift 2
    rm -f "$out"
    if [ "$np" -eq 1 ]; then
        timeout -k 5 240 "$KNN" --backend "$BACKEND" -q -o "$out" "$@" <"/dev/null" >"$T/out" 2>"$T/err"
    else
        timeout -k 5 240 "$MPIRUN" --allow-run-as-root --oversubscribe -np "$np" "$KNN" --backend "$BACKEND" -q \
            -o "$out" "$@" <"/dev/null" >"$T/out" 2>"$T/err"
    fi
    RC=$?
}
same() { # same GOT WANT: 0 when the last run ended 0 and GOT holds WANT's bytes
    WHY=
    if [ "$RC" -ne 0 ]; then WHY="exit status $RC, want 0"; return 1; fi
    cmp "$1" "$2" >"$T/cmp" 2>&1 || { WHY="$(cat "$T/cmp")"; return 1; }
    return 0
}

# Does the backend work here? (a small problem first: no data made for nothing)
mk data uniform 301 8 30 "$T/probe.fbin"
run 1 "$T/probe.bin" -k 4 "$T/probe.fbin"
if [ "$RC" -ne 0 ]; then
    echo "# --backend $BACKEND: exit $RC ($(grep -m 1 '^knn_mpi: ' "$T/err"))"
    while [ "$NUM" -lt "$PLAN" ]; do skip "knn_mpi --backend $BACKEND does not work here"; done
    exit 0
fi

# ties: every row twice or more (duplicates), n no multiple of any tile
mk data duplicates 20011 16 31 "$T/dup.fbin"
mk oracle l2 8 "$T/dup.fbin" - "$T/want_dup.bin"
mk data uniform "$N_UNI" 16 32 "$T/uni.fbin"
if [ "$MPIRUN" = none ] || ! command -v "$MPIRUN" >/dev/null 2>&1; then
    MULTI=0
else
    MULTI=1
fi

for np in 1 2 3 4 5; do
    if [ "$np" -gt 1 ] && [ $MULTI -eq 0 ]; then skip "no mpirun"; continue; fi
    run "$np" "$T/dup$np.bin" -k 8 --device-memory 96M "$T/dup.fbin"
    same "$T/dup$np.bin" "$T/want_dup.bin"
    ok $? "duplicates n=20011 d=16 k=8, 96 MiB device budget, $np rank(s): the oracle's bytes"
done

run 1 "$T/uni1.bin" -k 8 --device-memory 512M "$T/uni.fbin"
WHY="exit status $RC, want 0"
ok $([ "$RC" -eq 0 ]; echo $?) "uniform n=$N_UNI d=16 k=8, 512 MiB device budget, 1 rank"
for np in 2 3 4 5; do
    if [ $MULTI -eq 0 ]; then skip "no mpirun"; continue; fi
    run "$np" "$T/uni$np.bin" -k 8 --device-memory 512M "$T/uni.fbin"
    same "$T/uni$np.bin" "$T/uni1.bin"
    ok $? "uniform n=$N_UNI, 512 MiB device budget, $np ranks: the one-rank run's bytes"
done

[ "$FAILED" -eq 0 ]
