#!/bin/sh
# SPDX-License-Identifier: MIT
# faults-gpu-t.sh KNN_MPI MKDATA MPIRUN|none -- knn_mpi's GPU faults (TAP, suite cuda).
#
#   - a rank that sees no device (simulated: a wrapper empties CUDA_VISIBLE_DEVICES on
#     rank 1): with --backend auto it searches on the CPU, the result is the oracle's
#     and -v names the rank; with --backend cuda every rank ends with exit 3 and one
#     message naming rank 1, no output file;
#   - more ranks than devices (visible devices + 1): ranks share them (local rank mod
#     device count) and the result is the oracle's, which is also the CPU's;
#   - a device memory budget (--device-memory) below what one tile needs: exit 3 and one
#     message with the minimum, on 1 and 4 ranks; twice that minimum: smaller tiles, the
#     oracle's result on 1 and 3 ranks;
#   - a launcher's local rank (MPI_LOCALRANKID) that names another device than the one
#     the library picks (a single process is local rank 0): the context made early on
#     it is dropped, the result is the oracle's.
# Where `knn_mpi --backend cuda` does not work (no CUDA build, no device) the GPU lines
# are "# SKIP no CUDA device"; the lines that need no device run everywhere. Fixed plan.
# POSIX sh.

KNN=$1
MK=$2
MPIRUN=${3:-none}
. "$(dirname "$0")/tap.sh"
tap_begin faults-gpu-t 10
O=$T/outdir # the output directory of every run: must hold the result only on success
mkdir "$O" || exit 1

TAP_DIAG=tap_run_diag # ($WHY, the exit status, stdout and stderr)
run() { # run NP PROGRAM ARGS...: on NP ranks (1: a plain process), 60 s at most
    np=$1 prog=$2
    shift 2
    rm -rf "$O"/* "$O"/.[!.]* 2>/dev/null
    if [ "$np" -eq 1 ]; then
        timeout -k 5 60 "$prog" "$@" <"/dev/null" >"$T/out" 2>"$T/err"
    else
        timeout -k 5 60 "$MPIRUN" --allow-run-as-root --oversubscribe -np "$np" "$prog" "$@" \
            <"/dev/null" >"$T/out" 2>"$T/err"
    fi
    RC=$?
}
# good: 0 when the last run ended 0 and wrote the oracle's bytes to $O/r.bin
good() {
    WHY=
    if [ "$RC" -ne 0 ]; then WHY="exit status $RC, want 0"; return 1; fi
    cmp "$O/r.bin" "$T/want.bin" >"$T/cmp" 2>&1 || { WHY="result differs from the oracle: $(cat "$T/cmp")"; return 1; }
    left=$(ls -A "$O" | grep -v '^r\.bin$')
    [ -z "$left" ] || { WHY="left beside the result: $left"; return 1; }
    return 0
}
# bad WANT KEYS: 0 when the last run ended with exit WANT, one "knn_mpi: " line holding
# every "|"-separated KEY, and nothing in $O
bad() {
    WHY=
    if [ "$RC" -ne "$1" ]; then WHY="exit status $RC, want $1"; return 1; fi
    one_message "$2" "$O"
}

# ---- data: tie-heavy, sizes that are no multiples of any block -------------------------------
mk data integer 2003 8 21 "$T/ref.fbin"
mk data integer 101 8 22 "$T/q.fbin"
mk oracle l2 10 "$T/ref.fbin" "$T/q.fbin" "$T/want.bin"
set -- -k 10 -o "$O/r.bin" "$T/ref.fbin" "$T/q.fbin" # every run's problem

# rank 1 sees no device; the others see what the job was given
cat >"$T/hide1.sh" <<EOF
#!/bin/sh
if [ "\${OMPI_COMM_WORLD_RANK:-}" = 1 ]; then CUDA_VISIBLE_DEVICES=; export CUDA_VISIBLE_DEVICES; fi
exec "$KNN" "\$@"
EOF
chmod +x "$T/hide1.sh"

# Is there a usable device? How many does a rank see?
run 1 "$KNN" --backend cuda -q "$@"
GPU=0
[ "$RC" -eq 0 ] && GPU=1
[ $GPU -eq 1 ] || echo "# --backend cuda: exit $RC ($(grep -m 1 '^knn_mpi: ' "$T/err"))"
NDEV=$("$KNN" --version 2>/dev/null | sed -n 's/.*cuda (\([0-9]*\) device.*/\1/p')
[ -n "$NDEV" ] || NDEV=0
echo "# CUDA devices visible: $NDEV"

# ---- no device anywhere needed -----------------------------------------------------------------
run 1 "$KNN" --device-memory 512K --backend cpu -q "$@"
good
ok $? "--device-memory 512K with --backend cpu: accepted (CUDA only), the oracle's result"

if [ "$MPIRUN" = none ]; then
    skip "MPI not built: rank 1 without a device, --backend auto (4 ranks)"
else
    run 4 "$T/hide1.sh" --backend auto -v "$@"
    good
    ok $? "rank 1 sees no device, --backend auto (4 ranks): exit 0, the oracle's result"
    cp "$T/err" "$T/err_auto"
fi

# ---- GPU --------------------------------------------------------------------------------------------
if [ $GPU -eq 0 ]; then
    i=$NUM
    while [ "$i" -lt $PLAN ]; do
        skip "no CUDA device"
        i=$((i + 1))
    done
elif [ "$MPIRUN" = none ]; then
    skip "MPI not built: -v names the rank on the CPU"
    skip "MPI not built: --backend cuda with a rank without a device"
    skip "MPI not built: more ranks than devices"
    run 1 "$KNN" --backend cuda --device-memory 1K "$@"
    bad 3 "device memory budget|minimum"
    ok $? "--device-memory 1K (below one tile), 1 rank: exit 3, one message with the minimum"
    skip "MPI not built: --device-memory below one tile (4 ranks)"
    MIN=$(sed -n 's/.*minimum of \([0-9]*\) bytes.*/\1/p' "$T/err" | head -n 1)
    run 1 "$KNN" --backend cuda -q --device-memory $((2 * ${MIN:-0})) "$@"
    good
    ok $? "--device-memory twice the minimum ($((2 * ${MIN:-0})) bytes), 1 rank: the oracle's result"
    skip "MPI not built: --device-memory twice the minimum (3 ranks)"
    skip "MPI not built: no launcher's local rank"
else
    # the --backend auto run above, rank 1 without a device
    cp "$T/err_auto" "$T/err"
    RC=0
    WHY="no '1 of 4 ranks ... CPU backend ...: rank 1' line"
    grep -q '^knn_mpi: backend auto: 1 of 4 ranks sees no CUDA device and uses the CPU backend.*: rank 1$' "$T/err"
    ok $? "rank 1 sees no device, --backend auto (4 ranks): -v says rank 1 uses the CPU backend"

    run 4 "$T/hide1.sh" --backend cuda "$@"
    bad 3 "rank 1: no CUDA device"
    ok $? "rank 1 sees no device, --backend cuda (4 ranks): exit 3, one message naming rank 1, no output"

    np=$((NDEV + 1))
    [ $np -ge 2 ] || np=2
    run $np "$KNN" --backend cuda -q "$@"
    good
    ok $? "$np ranks on $NDEV device(s), --backend cuda: devices shared, the oracle's (the CPU's) result"

    run 1 "$KNN" --backend cuda --device-memory 1K "$@"
    bad 3 "device memory budget|minimum"
    ok $? "--device-memory 1K (below one tile), 1 rank: exit 3, one message with the minimum"
    MIN=$(sed -n 's/.*minimum of \([0-9]*\) bytes.*/\1/p' "$T/err" | head -n 1)
    echo "# minimum device memory reported: ${MIN:-none} bytes"
    run 4 "$KNN" --backend cuda --device-memory 1K "$@"
    bad 3 "device memory budget|minimum"
    ok $? "--device-memory 1K (below one tile), 4 ranks: exit 3, one message with the minimum"

    B=$((2 * ${MIN:-0}))
    run 1 "$KNN" --backend cuda -q --device-memory $B "$@"
    good
    ok $? "--device-memory twice the minimum ($B bytes), 1 rank: smaller tiles, the oracle's result"
    run 3 "$KNN" --backend cuda -q --device-memory $B "$@"
    good
    ok $? "--device-memory twice the minimum ($B bytes), 3 ranks: the oracle's result"

    MPI_LOCALRANKID=$((NDEV > 1 ? 1 : 0))
    export MPI_LOCALRANKID
    run 1 "$KNN" --backend cuda -q "$@"
    unset MPI_LOCALRANKID
    good
    ok $? "a launcher's local rank naming device $((NDEV > 1 ? 1 : 0)) (the library picks 0): the oracle's result"
fi

tap_end
