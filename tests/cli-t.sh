#!/bin/sh
# SPDX-License-Identifier: MIT
# cli-t.sh KNN_MPI MKDATA MPIRUN|none -- the knn_mpi command end to end (TAP).
# Options and usage errors (exit 1), input errors (exit 2, one message naming the
# file/option/rank), atomic output (no file, no temporary after a failure), results
# byte-identical to the oracle and across 1..5 ranks. POSIX sh.

KNN=$1
MK=$2
MPIRUN=${3:-none}
. "$(dirname "$0")/tap.sh"
tap_knn_begin cli-t 61
tmps_of() { # the temporaries of output $1 in its directory: .NAME.xknn-tmp.* (knn_mpi),
    # .NAME.tmp.* (the library's writer)
    ls -A "$(dirname "$1")" 2>/dev/null | grep -F -e ".$(basename "$1").xknn-tmp." -e ".$(basename "$1").tmp."
}
no_leftovers() { [ ! -e "$1" ] && [ -z "$(tmps_of "$1")" ]; } # no output $1, no temporary of it
no_tmp() { [ -z "$(tmps_of "$1")" ]; }                        # no temporary of output $1 remains

# ---- data (deterministic, tie-heavy) ---------------------------------------------------
mk data integer 600 8 1 "$T/ref.fbin"
mk data integer 77 8 2 "$T/q.fbin"
mk data integer 77 9 2 "$T/q9.fbin"
mk data integer 20 8 3 "$T/qnan.fbin" nan 3 5
mk data integer 600 8 1 "$T/refnan.fbin" nan 590 2
mk data integer 600 8 1 "$T/bad.fbin" truncate
mk data duplicates 300 5 4 "$T/dup.fbin"
mk data duplicates 300 5 4 "$T/dup.fvecs"
mk data gaussian 400 13 5 "$T/g.fbin"
mk data gaussian 33 13 6 "$T/gq.fbin"
mk data clustered 200 784 7 "$T/c784.fbin"
mk data clustered 20 784 8 "$T/c784q.fbin"
mk data integer 600 8 1 "$T/ref.u8bin" u8
mk data integer 600 8 1 "$T/refu8.bin" u8
mk data integer 3 4 9 "$T/tiny.fbin"
mk data integer 10 4 10 "$T/tinyq.fbin"
mk oracle l2 10 "$T/ref.fbin" "$T/q.fbin" "$T/want_q.bin"
mk oracle l2 10 "$T/ref.fbin" "$T/q.fbin" "$T/want_q.ivecs"
mk oracle l2 10 "$T/dup.fbin" - "$T/want_dup.bin"
mk oracle euclidean 7 "$T/g.fbin" "$T/gq.fbin" "$T/want_g.bin"
mk oracle l2 5 "$T/c784.fbin" "$T/c784q.fbin" "$T/want_c784.bin"
mk oracle l2 3 "$T/tiny.fbin" "$T/tinyq.fbin" "$T/want_tiny.bin"
mk oracle l2 599 "$T/ref.fbin" - "$T/want_self599.bin"
mk data integer 2000 4 11 "$T/big.fbin"
mk oracle l2 1999 "$T/big.fbin" - "$T/want_big.bin"
# rows of 512 bytes (k = 64): the writer's 8 MiB pieces hold 16384 of them, so one block
# of 20000 queries is written in two pieces
mk data integer 200 4 11 "$T/wref.fbin"
mk data integer 20000 4 12 "$T/wq.fbin"
mk oracle l2 64 "$T/wref.fbin" "$T/wq.fbin" "$T/want_w.bin"

# ---- help, version, usage errors (exit 1) -----------------------------------------------
knn --help
ok $(
    [ $RC -eq 0 ] && has "-k N" "$T/out" && has "--metric" "$T/out" && has "--query-block" "$T/out" &&
        has "--json" "$T/out" && has "--dtype" "$T/out" && has "--ids64" "$T/out" && has "--no-symmetric" "$T/out" && has "Example" "$T/out" &&
        has "--device-memory" "$T/out" && has ".NAME.xknn-tmp.PID.XXXXXX" "$T/out"
    echo $?
) "--help: exit 0, every option, the temporary's name and an example"
ok $(
    has ".fvecs" "$T/out" && has ".fbin" "$T/out" && has ".npy" "$T/out" && has "IDX" "$T/out" && has ".ivecs" "$T/out"
    echo $?
) "--help mentions the input and output formats"
knn --version
ok $([ $RC -eq 0 ] && has "0.1.0" "$T/out"; echo $?) "--version: exit 0 and the version"
knn
ok $([ $RC -eq 1 ] && has "missing REF" "$T/err"; echo $?) "no arguments: exit 1, 'missing REF'"
knn --frobnicate "$T/ref.fbin"
ok $([ $RC -eq 1 ] && has "unknown option '--frobnicate'" "$T/err"; echo $?) "unknown option: exit 1, named"
knn -k abc "$T/ref.fbin"
ok $([ $RC -eq 1 ] && has "-k: 'abc'" "$T/err"; echo $?) "-k abc: exit 1"
knn -k 0 "$T/ref.fbin"
ok $([ $RC -eq 1 ] && has "need k >= 1" "$T/err"; echo $?) "-k 0: exit 1"
knn "$T/ref.fbin" -k
ok $([ $RC -eq 1 ] && has "-k needs a value" "$T/err"; echo $?) "-k without a value: exit 1"
knn -m jaccard "$T/ref.fbin"
ok $([ $RC -eq 1 ] && has "unknown metric 'jaccard'" "$T/err"; echo $?) "unknown metric: exit 1, named"
knn --dtype f64 "$T/ref.fbin"
ok $([ $RC -eq 1 ] && has "--dtype" "$T/err"; echo $?) "--dtype f64: exit 1"
knn "$T/ref.fbin" "$T/q.fbin" "$T/q.fbin"
ok $([ $RC -eq 1 ] && has "unexpected argument" "$T/err"; echo $?) "three files: exit 1"
knn --ids64 -o "$T/x.ivecs" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 1 ] && has "--ids64" "$T/err" && no_leftovers "$T/x.ivecs"; echo $?) "--ids64 with .ivecs: exit 1"
knn --threads 0 "$T/ref.fbin"
ok $([ $RC -eq 1 ] && has "--threads" "$T/err"; echo $?) "--threads 0: exit 1"

# ---- input errors (exit 2), nothing written ------------------------------------------------
knn -o "$T/o1.bin" "$T/missing.fbin" "$T/q.fbin"
ok $([ $RC -eq 2 ] && has "$T/missing.fbin" "$T/err" && no_leftovers "$T/o1.bin"; echo $?) \
    "missing file: exit 2, file named, no output"
knn -o "$T/o2.bin" "$T/bad.fbin" "$T/q.fbin"
ok $([ $RC -eq 2 ] && has "$T/bad.fbin" "$T/err" && no_leftovers "$T/o2.bin"; echo $?) \
    "truncated .fbin: exit 2, file named, no output"
knn -o "$T/o3.bin" "$T/ref.fbin" "$T/q9.fbin"
ok $([ $RC -eq 2 ] && has "dimension mismatch: $T/ref.fbin has d=8, $T/q9.fbin has d=9" "$T/err" &&
    no_leftovers "$T/o3.bin"; echo $?) "dimension mismatch: exit 2, both files and d named"
knn -o "$T/o4.bin" "$T/ref.fbin" "$T/qnan.fbin"
ok $([ $RC -eq 2 ] && has "$T/qnan.fbin" "$T/err" && has "row 3" "$T/err" && has "column 5" "$T/err"; echo $?) \
    "NaN in the query: exit 2, file, row and column named"
ok $(no_leftovers "$T/o4.bin"; echo $?) "NaN in the query: no output file, no temporary"
knn -k 601 -o "$T/o5.bin" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 2 ] && has "-k 601 is too large" "$T/err" && has "n=600" "$T/err" && no_leftovers "$T/o5.bin"
    echo $?) "k > n: exit 2, no output"
knn -k 600 -o "$T/o6.bin" "$T/ref.fbin"
ok $([ $RC -eq 2 ] && has "n-1 = 599" "$T/err" && no_leftovers "$T/o6.bin"; echo $?) "self-join k = n: exit 2"
knn -o "$T/no/such/dir/o7.bin" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 2 ] && has "cannot write output $T/no/such/dir/o7.bin" "$T/err"; echo $?) "unwritable output: exit 2"
knn --backend cuda -o "$T/o8.bin" "$T/ref.fbin" "$T/q.fbin"
ok $({ [ $RC -eq 3 ] && has "cuda" "$T/err" && no_leftovers "$T/o8.bin"; } || [ $RC -eq 0 ]; echo $?) \
    "--backend cuda without CUDA or device: exit 3 (or 0 on a GPU machine)"

# ---- results against the oracle ------------------------------------------------------------
knn -q -k 10 --query-block 7 -o "$T/r_q.bin" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/r_q.bin" "$T/want_q.bin"; echo $?) ".bin output equals the oracle (ties)"
ok $([ ! -s "$T/out" ] && [ ! -s "$T/err" ] && no_tmp "$T/r_q.bin"; echo $?) "-q: nothing printed"
knn -q -k 10 -o "$T/r_q.ivecs" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/r_q.ivecs" "$T/want_q.ivecs"; echo $?) ".ivecs output equals the oracle"
knn "$T/dup.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/dup.knn10.bin" "$T/want_dup.bin"; echo $?) \
    "all-kNN graph, default output REF_BASENAME.knn10.bin, equals the oracle (duplicates)"
ok $(has "$T/dup.knn10.bin" "$T/out" && has "n=300" "$T/out" && has "queries/s" "$T/out"; echo $?) \
    "summary line names sizes, rate and output"
knn -q -o "$T/r_dupv.bin" "$T/dup.fvecs"
ok $([ $RC -eq 0 ] && cmp -s "$T/r_dupv.bin" "$T/want_dup.bin"; echo $?) ".fvecs input gives the same graph"
knn -q -k 599 -o "$T/r_self599.bin" "$T/ref.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/r_self599.bin" "$T/want_self599.bin"; echo $?) "self-join k = n - 1 equals the oracle"
knn -q -k 64 --query-block 20000 -o "$T/r_w.bin" "$T/wref.fbin" "$T/wq.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/r_w.bin" "$T/want_w.bin"; echo $?) "a block written in two pieces equals the oracle"
knn -q -k 7 -m euclidean -o "$T/r_g.bin" "$T/g.fbin" "$T/gq.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/r_g.bin" "$T/want_g.bin"; echo $?) "euclidean equals the oracle"
knn -q -k 5 -o "$T/r_c784.bin" "$T/c784.fbin" "$T/c784q.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/r_c784.bin" "$T/want_c784.bin"; echo $?) "d = 784 equals the oracle"
knn -q -k 10 -o "$T/r_u8.bin" "$T/ref.u8bin" "$T/q.fbin"
RC1=$RC
knn -q -k 10 --dtype u8 -o "$T/r_u8b.bin" "$T/refu8.bin" "$T/q.fbin"
ok $([ $RC1 -eq 0 ] && [ $RC -eq 0 ] && cmp -s "$T/r_u8.bin" "$T/want_q.bin" && cmp -s "$T/r_u8b.bin" "$T/want_q.bin"
    echo $?) ".u8bin and '.bin --dtype u8' give the float32 result"
knn -q -k 10 --ids64 -o "$T/r_64.bin" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 0 ] && [ "$(wc -c <"$T/r_64.bin")" -eq $((8 + 77 * 10 * 12)) ]; echo $?) "--ids64: 64-bit id layout size"
knn -q -k 10 --json "$T/run.json" -o "$T/r_j.bin" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 0 ] && has '"queries_per_s"' "$T/run.json" && has '"ranks": ' "$T/run.json" &&
    has '"broadcast"' "$T/run.json" && has '"nq": 77' "$T/run.json" && has '"backend"' "$T/run.json"
    echo $?) "--json: sizes, ranks, backend, phases, rate"
knn -q -k 10 -o "$T/r_q.bin" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/r_q.bin" "$T/want_q.bin" && no_tmp "$T/r_q.bin"; echo $?) \
    "an existing output is replaced"

# ---- many ranks: identical bytes, agreed errors ---------------------------------------------
if [ "$MPIRUN" = none ]; then
    skip 25 "MPI not built"
else
    for np in 1 2 3 4 5; do
        mknn $np -q -k 10 --query-block 7 -o "$T/m_q$np.bin" "$T/ref.fbin" "$T/q.fbin"
        ok $([ $RC -eq 0 ] && cmp -s "$T/m_q$np.bin" "$T/want_q.bin"; echo $?) "mpirun -np $np: query result identical"
    done
    for np in 1 2 3 4 5; do
        mknn $np -q --query-block 16 -o "$T/m_d$np.bin" "$T/dup.fbin"
        ok $([ $RC -eq 0 ] && cmp -s "$T/m_d$np.bin" "$T/want_dup.bin"; echo $?) \
            "mpirun -np $np: all-kNN graph identical"
    done
    for np in 1 2 3 4 5; do
        mknn $np -q --no-symmetric -o "$T/m_p$np.bin" "$T/dup.fbin"
        ok $([ $RC -eq 0 ] && cmp -s "$T/m_p$np.bin" "$T/m_d$np.bin" && cmp -s "$T/m_p$np.bin" "$T/want_dup.bin"
            echo $?) "mpirun -np $np: --no-symmetric all-kNN graph identical to the symmetric one"
    done
    mknn 3 -q -o "$T/m_q.ivecs" "$T/ref.fbin" "$T/q.fbin"
    ok $([ $RC -eq 0 ] && cmp -s "$T/m_q.ivecs" "$T/want_q.ivecs"; echo $?) "mpirun -np 3: .ivecs identical"
    mknn 5 -q -k 3 -o "$T/m_tiny.bin" "$T/tiny.fbin" "$T/tinyq.fbin"
    ok $([ $RC -eq 0 ] && cmp -s "$T/m_tiny.bin" "$T/want_tiny.bin"; echo $?) "mpirun -np 5, n = 3 < P, k = n: identical"
    mknn 4 -q -k 5 -o "$T/m_c784.bin" "$T/c784.fbin" "$T/c784q.fbin"
    ok $([ $RC -eq 0 ] && cmp -s "$T/m_c784.bin" "$T/want_c784.bin"; echo $?) "mpirun -np 4, d = 784: identical"
    mknn 3 -o "$T/m_nan.bin" "$T/refnan.fbin" "$T/q.fbin"
    ok $([ $RC -eq 2 ] && [ "$(count "is NaN" "$T/err")" -eq 1 ] && has "rank 2: " "$T/err" &&
        has "$T/refnan.fbin" "$T/err" && has "row 590" "$T/err"; echo $?) \
        "mpirun -np 3, NaN in rank 2's slice: exit 2, one message naming rank, file, row"
    ok $(no_leftovers "$T/m_nan.bin"; echo $?) "mpirun -np 3, NaN: no output file, no temporary"
    mknn 4 -k 601 -o "$T/m_k.bin" "$T/ref.fbin" "$T/q.fbin"
    ok $([ $RC -eq 2 ] && [ "$(count "is too large" "$T/err")" -eq 1 ] && no_leftovers "$T/m_k.bin"; echo $?) \
        "mpirun -np 4, k > n: exit 2, one message, no output"
    mknn 2 -o "$T/m_nq.bin" "$T/ref.fbin" "$T/qnan.fbin"
    ok $([ $RC -eq 2 ] && [ "$(count "is NaN" "$T/err")" -eq 1 ] && no_leftovers "$T/m_nq.bin"; echo $?) \
        "mpirun -np 2, NaN in the query: exit 2, one message, no output"
    mknn 2 -k 10 --json "$T/m.json" -o "$T/m_j.bin" "$T/ref.fbin" "$T/q.fbin"
    ok $([ $RC -eq 0 ] && has '"ranks": 2' "$T/m.json" && [ "$(count "knn_mpi: n=600" "$T/out")" -eq 1 ] &&
        cmp -s "$T/m_j.bin" "$T/want_q.bin"; echo $?) "mpirun -np 2 --json: ranks 2, one summary line"
    # rows of 23988 bytes of lists (k = n - 1 = 1999): rank 0's first 500 rows, final before the
    # last exchange, reach the writer in two pieces of about 8 MiB while the lists travel
    mknn 2 -q -k 1999 -o "$T/m_big.bin" "$T/big.fbin"
    ok $([ $RC -eq 0 ] && cmp -s "$T/m_big.bin" "$T/want_big.bin"; echo $?) \
        "mpirun -np 2, n = 2000, k = 1999: all-kNN graph identical (first rows in pieces during the exchange)"
    mknn 3 --frobnicate "$T/ref.fbin"
    ok $([ $RC -eq 1 ] && [ "$(count "unknown option" "$T/err")" -eq 1 ]; echo $?) \
        "mpirun -np 3, bad option: exit 1, one message"
fi

tap_end
