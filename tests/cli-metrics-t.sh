#!/bin/sh
# SPDX-License-Identifier: MIT
# cli-metrics-t.sh KNN_MPI MKDATA MPIRUN|none -- knn_mpi's metric options end to end
# (TAP): -m (every metric), -p, --weights, --bits, --binarize on float32 and uint8 files,
# results byte-identical to the oracle (tests/ref through mkdata oracle2) on 1 process
# and on 3 ranks; usage errors (exit 1) and input errors (exit 2, nothing written).
# POSIX sh.

KNN=$1
MK=$2
MPIRUN=${3:-none}
. "$(dirname "$0")/tap.sh"
tap_knn_begin cli-metrics-t 37
no_leftovers() { [ ! -e "$1" ] && [ -z "$(ls "$1".tmp.* 2>/dev/null)" ]; }

# ---- data (deterministic, tie-heavy) ---------------------------------------------------
mk data gaussian 300 20 1 "$T/g.fbin"
mk data gaussian 41 20 2 "$T/gq.fbin"
mk data integer 260 9 3 "$T/i.fbin"
mk data integer 250 9 3 "$T/w.u8bin" u8wide
mk data integer 31 9 4 "$T/wq.u8bin" u8wide
mk data duplicates 200 7 5 "$T/d.u8bin" u8
mk weights 72 5 "$T/wts.fbin"
mk weights 71 5 "$T/wts71.fbin"

# ---- --help -------------------------------------------------------------------------------
knn --help
ok $(
    [ $RC -eq 0 ] && has "minkowski" "$T/out" && has "chebyshev" "$T/out" && has "hellinger" "$T/out" &&
        has "whamming" "$T/out" && has "-p P" "$T/out" && has "--weights FILE" "$T/out" && has "--bits" "$T/out" &&
        has "--binarize T" "$T/out"
    echo $?
) "--help lists every metric and the metric options"

# ---- results vs the oracle, 1 process and 3 ranks ------------------------------------------
# case NAME "KNN OPTIONS" "ORACLE ARGS (METRIC P K REF QUERY|-)" "ORACLE WORDS"
case_() {
    name=$1
    opts=$2
    oargs=$3
    owords=$4
    # shellcheck disable=SC2086
    mk oracle2 $oargs "$T/want_$name.bin" $owords
    # shellcheck disable=SC2086
    knn -q $opts -o "$T/got_$name.bin"
    ok $([ $RC -eq 0 ] && cmp -s "$T/got_$name.bin" "$T/want_$name.bin"; echo $?) "$name: 1 process = oracle"
    if [ "$MPIRUN" = none ]; then
        skip 1 "no mpirun"
    else
        # shellcheck disable=SC2086
        mknn 3 -q $opts -o "$T/got3_$name.bin"
        ok $([ $RC -eq 0 ] && cmp -s "$T/got3_$name.bin" "$T/want_$name.bin"; echo $?) "$name: 3 ranks = oracle"
    fi
}
case_ l1 "-m l1 -k 7 $T/g.fbin $T/gq.fbin" "l1 0 7 $T/g.fbin $T/gq.fbin" ""
case_ ip "-m ip -k 7 $T/g.fbin $T/gq.fbin" "ip 0 7 $T/g.fbin $T/gq.fbin" ""
case_ ip-u8-self "-m ip -k 10 --query-block 16 $T/d.u8bin" "ip 0 10 $T/d.u8bin -" ""
case_ cosine-self "-m cosine -k 5 $T/g.fbin" "cosine 0 5 $T/g.fbin -" ""
case_ chebyshev-u8 "-m chebyshev -k 100 $T/w.u8bin $T/wq.u8bin" "chebyshev 0 100 $T/w.u8bin $T/wq.u8bin" ""
case_ minkowski-2.5-u8 "-m minkowski -p 2.5 -k 9 $T/w.u8bin $T/wq.u8bin" "minkowski 2.5 9 $T/w.u8bin $T/wq.u8bin" ""
case_ minkowski-3-self "-m minkowski -p 3 -k 4 $T/i.fbin" "minkowski 3 4 $T/i.fbin -" ""
case_ hellinger-u8-self "-m hellinger -k 8 $T/d.u8bin" "hellinger 0 8 $T/d.u8bin -" ""
case_ hamming-bits-self "-m hamming --bits -k 12 $T/w.u8bin" "hamming 0 12 $T/w.u8bin -" "bits"
case_ whamming-bits "-m whamming --bits --weights $T/wts.fbin -k 9 $T/w.u8bin $T/wq.u8bin" \
    "whamming 0 9 $T/w.u8bin $T/wq.u8bin" "bits weights $T/wts.fbin"
case_ hamming-binarize "-m hamming --binarize 0.1 -k 9 $T/g.fbin $T/gq.fbin" "hamming 0 9 $T/g.fbin $T/gq.fbin" \
    "binarize 0.1"

# ---- usage errors (exit 1) -------------------------------------------------------------------
knn -m jaccard "$T/g.fbin"
ok $([ $RC -eq 1 ] && has "unknown metric 'jaccard'" "$T/err" && has "whamming" "$T/err"; echo $?) \
    "unknown metric: exit 1, the metrics listed"
knn -m minkowski -p 0.5 "$T/g.fbin"
ok $([ $RC -eq 1 ] && has "-p: '0.5'" "$T/err"; echo $?) "-p 0.5: exit 1"
knn -m l1 -p 3 "$T/g.fbin"
ok $([ $RC -eq 1 ] && has "-m minkowski" "$T/err"; echo $?) "-p without minkowski: exit 1"
knn -m hamming "$T/w.u8bin"
ok $([ $RC -eq 1 ] && has "--bits" "$T/err" && has "--binarize" "$T/err"; echo $?) "hamming without bits: exit 1"
knn --bits "$T/w.u8bin"
ok $([ $RC -eq 1 ] && has "-m hamming" "$T/err"; echo $?) "--bits with l2: exit 1"
knn -m hamming --bits --binarize 0 "$T/w.u8bin"
ok $([ $RC -eq 1 ] && has "give one of them" "$T/err"; echo $?) "--bits and --binarize together: exit 1"
knn -m whamming --bits "$T/w.u8bin"
ok $([ $RC -eq 1 ] && has "--weights" "$T/err"; echo $?) "whamming without --weights: exit 1"
knn -m l1 --weights "$T/wts.fbin" "$T/w.u8bin"
ok $([ $RC -eq 1 ] && has "--weights is for -m whamming" "$T/err"; echo $?) "--weights without whamming: exit 1"
knn -m hamming --binarize abc "$T/g.fbin"
ok $([ $RC -eq 1 ] && has "--binarize: 'abc'" "$T/err"; echo $?) "--binarize abc: exit 1"

# ---- input errors (exit 2), nothing written -------------------------------------------------
knn -m hamming --bits -o "$T/e1.bin" "$T/g.fbin"
ok $([ $RC -eq 2 ] && has "--bits: $T/g.fbin holds float32" "$T/err" && no_leftovers "$T/e1.bin"; echo $?) \
    "--bits on float data: exit 2, file named, no output"
knn -m whamming --bits --weights "$T/wts71.fbin" -o "$T/e2.bin" "$T/w.u8bin"
ok $([ $RC -eq 2 ] && has "need one weight per bit (72)" "$T/err" && no_leftovers "$T/e2.bin"; echo $?) \
    "weights of the wrong length: exit 2, no output"
knn -m hellinger -o "$T/e3.bin" "$T/g.fbin" "$T/gq.fbin"
ok $([ $RC -eq 2 ] && has "$T/g.fbin row 0 column" "$T/err" && has "hellinger needs non-negative" "$T/err" &&
    no_leftovers "$T/e3.bin"; echo $?) "hellinger on negative data: exit 2, file, row, column named, no output"
if [ "$MPIRUN" = none ]; then
    skip 2 "no mpirun"
else
    mknn 3 -m whamming --bits --weights "$T/wts71.fbin" -o "$T/e4.bin" "$T/w.u8bin"
    ok $([ $RC -eq 2 ] && has "need one weight per bit (72)" "$T/err" && no_leftovers "$T/e4.bin"; echo $?) \
        "3 ranks, weights of the wrong length: exit 2, no output"
    mknn 3 -m hellinger -o "$T/e5.bin" "$T/g.fbin"
    ok $([ $RC -eq 2 ] && has "hellinger needs non-negative" "$T/err" && no_leftovers "$T/e5.bin"; echo $?) \
        "3 ranks, hellinger on negative data: exit 2, no output"
fi
