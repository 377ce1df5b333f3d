#!/bin/sh
# SPDX-License-Identifier: MIT
# learn-cli-t.sh KNN_MPI MKDATA LEARN_ORACLE MPIRUN|none KNN_PRUNE -- knn_mpi's classification and
# regression options (--labels, --targets, --vote, --predict, --query-labels) end to end
# (TAP): predictions byte for byte equal to tests/learn-oracle.c's votes on the search
# oracle's neighbours (tests/mkdata.c), identical files for 1 and 3 ranks, usage errors
# (exit 1), input errors (exit 2 on every rank, one message, no output); and the knn_prune
# command (its algorithms are checked against naive definitions in learn-t.c). POSIX sh.

KNN=$1
MK=$2
LO=$3
MPIRUN=${4:-none}
PRUNE=$5
. "$(dirname "$0")/tap.sh"
tap_knn_begin learn-cli-t 39
no_leftovers() { [ ! -e "$1" ] && [ -z "$(ls "$1".tmp.* 2>/dev/null)" ]; }
lo() { "$LO" "$@" || { echo "Bail out! learn-oracle $*"; exit 1; }; }

# ---- data: tie-heavy points, labels in 4 classes, float targets -----------------------
mk data integer 600 8 1 "$T/ref.fbin"
mk data integer 77 8 2 "$T/q.fbin"
mk data duplicates 300 5 4 "$T/dup.fbin"
lo labels 600 4 11 "$T/lab.txt"
lo labels 77 4 12 "$T/qlab.txt"
lo labels 300 3 13 "$T/duplab.txt"
lo targets 600 14 "$T/tgt.txt"
lo labels 599 4 11 "$T/short.txt"
printf '1\n2\nbanana\n' >"$T/badlab.txt"
mk data gaussian 400 13 5 "$T/g.fbin"
lo labels 400 4 15 "$T/glab.txt"
mk oracle l2 9 "$T/ref.fbin" "$T/q.fbin" "$T/nn_l2.bin"
mk oracle euclidean 9 "$T/ref.fbin" "$T/q.fbin" "$T/nn_eu.bin"
mk oracle l2 5 "$T/dup.fbin" - "$T/nn_dup.bin"
lo classify uniform l2 "$T/nn_l2.bin" "$T/lab.txt" "$T/want_u.txt"
lo classify distance l2 "$T/nn_l2.bin" "$T/lab.txt" "$T/want_d.txt"
lo classify distance euclidean "$T/nn_eu.bin" "$T/lab.txt" "$T/want_deu.txt"
lo classify distance l2 "$T/nn_dup.bin" "$T/duplab.txt" "$T/want_dup.txt"
lo regress uniform l2 "$T/nn_l2.bin" "$T/tgt.txt" "$T/want_ru.txt"
lo regress distance l2 "$T/nn_l2.bin" "$T/tgt.txt" "$T/want_rd.txt"
lo accuracy "$T/want_d.txt" "$T/qlab.txt" >"$T/want_acc.txt"

# ---- options and usage errors (exit 1) -----------------------------------------------------
knn --help
ok $([ $RC -eq 0 ] && has "--labels FILE" "$T/out" && has "--targets FILE" "$T/out" && has "--vote" "$T/out" &&
    has "--predict OUT" "$T/out" && has "--query-labels" "$T/out"; echo $?) "--help lists the learning options"
knn --vote majority --labels "$T/lab.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 1 ] && has "unknown vote 'majority'" "$T/err"; echo $?) "--vote majority: exit 1"
knn --predict "$T/p.csv" --labels "$T/lab.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 1 ] && has ".txt" "$T/err" && no_leftovers "$T/p.csv"; echo $?) "--predict with another extension: exit 1"
knn --predict "$T/p.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 1 ] && has "--predict needs --labels" "$T/err"; echo $?) "--predict without labels: exit 1"
knn --labels "$T/lab.txt" --targets "$T/tgt.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 1 ] && has "exclude each other" "$T/err"; echo $?) "--labels with --targets: exit 1"
knn --query-labels "$T/qlab.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 1 ] && has "--query-labels needs --labels" "$T/err"; echo $?) "--query-labels alone: exit 1"
knn --labels "$T/ref.fbin" --labels
ok $([ $RC -eq 1 ] && has "--labels needs a value" "$T/err"; echo $?) "--labels without a value: exit 1"

# ---- predictions against the oracle, one process ------------------------------------------
knn -q -k 9 --labels "$T/lab.txt" --predict "$T/p_u.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/p_u.txt" "$T/want_u.txt"; echo $?) "uniform vote, l2: predictions equal the oracle"
ok $([ ! -e "$T/ref.knn9.bin" ] && no_leftovers "$T/ref.knn9.bin"; echo $?) \
    "--predict without -o writes no neighbour file"
knn -q -k 9 --vote distance --labels "$T/lab.txt" --predict "$T/p_d.txt" -o "$T/nn_d.bin" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/p_d.txt" "$T/want_d.txt" && cmp -s "$T/nn_d.bin" "$T/nn_l2.bin"; echo $?) \
    "distance vote, l2 (1/sqrt weights): predictions equal the oracle; -o still writes the neighbours"
knn -q -k 9 -m euclidean --vote distance --labels "$T/lab.txt" --predict "$T/p_deu.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/p_deu.txt" "$T/want_deu.txt"; echo $?) "distance vote, euclidean: equal to the oracle"
knn -q -k 5 --vote distance --labels "$T/duplab.txt" --predict "$T/p_dup.txt" "$T/dup.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/p_dup.txt" "$T/want_dup.txt"; echo $?) \
    "self-join with duplicates (zero distances vote alone): equal to the oracle"
knn -q -k 9 --targets "$T/tgt.txt" --predict "$T/p_ru.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/p_ru.txt" "$T/want_ru.txt"; echo $?) "regression, mean: equal to the oracle"
knn -q -k 9 --vote distance --targets "$T/tgt.txt" --predict "$T/p_rd.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 0 ] && cmp -s "$T/p_rd.txt" "$T/want_rd.txt"; echo $?) "regression, distance-weighted: equal to the oracle"
knn -k 9 --vote distance --labels "$T/lab.txt" --query-labels "$T/qlab.txt" --predict "$T/p_acc.npy" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 0 ] && has "$(cat "$T/want_acc.txt")" "$T/out" && [ "$(count "knn_mpi:" "$T/out")" -eq 1 ]; echo $?) \
    "--query-labels: accuracy=... on the one summary line, as the oracle counts"
ok $([ "$(wc -c <"$T/p_acc.npy")" -eq $((128 + 77 * 4)) ] && head -c 6 "$T/p_acc.npy" | grep -q NUMPY &&
    has "'<i4'" "$T/p_acc.npy"; echo $?) ".npy prediction: int32, header + 4 bytes per query"
knn -v -k 9 --labels "$T/lab.txt" --query-labels "$T/qlab.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 0 ] && has "confusion matrix" "$T/out" && has "accuracy=" "$T/out"; echo $?) "-v: confusion matrix"

# ---- input errors (exit 2), nothing written -------------------------------------------------
knn -k 9 --labels "$T/short.txt" --predict "$T/e1.txt" -o "$T/e1.bin" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 2 ] && has "holds 599 labels" "$T/err" && has "n=600" "$T/err" && no_leftovers "$T/e1.txt" &&
    no_leftovers "$T/e1.bin"; echo $?) "labels shorter than REF: exit 2, both counts named, no output"
knn -k 9 --labels "$T/lab.txt" --query-labels "$T/lab.txt" --predict "$T/e2.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 2 ] && has "nq=77" "$T/err" && no_leftovers "$T/e2.txt"; echo $?) \
    "query labels of the wrong length: exit 2, no output"
knn -k 9 --labels "$T/badlab.txt" --predict "$T/e3.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 2 ] && has "line 3" "$T/err" && has "banana" "$T/err" && no_leftovers "$T/e3.txt"; echo $?) \
    "a label that is not an integer: exit 2, line named"
knn -k 9 --labels "$T/missing.txt" --predict "$T/e4.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 2 ] && has "missing.txt" "$T/err" && no_leftovers "$T/e4.txt"; echo $?) "missing label file: exit 2"
knn -k 9 --labels "$T/ref.fbin" --predict "$T/e5.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 2 ] && has "one value per row" "$T/err" && no_leftovers "$T/e5.txt"; echo $?) \
    "a data file as labels: exit 2"
knn -k 9 --labels "$T/lab.txt" --predict "$T/no/dir/e6.txt" "$T/ref.fbin" "$T/q.fbin"
ok $([ $RC -eq 2 ] && has "cannot write" "$T/err"; echo $?) "unwritable --predict: exit 2"

# ---- 1 and 3 ranks: identical files -----------------------------------------------------------
if [ "$MPIRUN" = none ]; then
    skip 10 "no mpirun"
else
    mknn 1 -q -k 9 --vote distance --labels "$T/lab.txt" --predict "$T/m1.txt" "$T/ref.fbin" "$T/q.fbin"
    ok $([ $RC -eq 0 ] && cmp -s "$T/m1.txt" "$T/want_d.txt"; echo $?) "mpirun -np 1: predictions equal the oracle"
    mknn 3 -q -k 9 --vote distance --query-block 5 --labels "$T/lab.txt" --predict "$T/m3.txt" "$T/ref.fbin" "$T/q.fbin"
    ok $([ $RC -eq 0 ] && cmp -s "$T/m3.txt" "$T/m1.txt"; echo $?) "3 ranks, blocks of 5: the .txt file is byte-identical"
    mknn 1 -q -k 9 --labels "$T/lab.txt" --predict "$T/m1.npy" "$T/ref.fbin" "$T/q.fbin"
    RC1=$RC
    mknn 3 -q -k 9 --query-block 4 --labels "$T/lab.txt" --predict "$T/m3.npy" "$T/ref.fbin" "$T/q.fbin"
    ok $([ $RC1 -eq 0 ] && [ $RC -eq 0 ] && cmp -s "$T/m3.npy" "$T/m1.npy"; echo $?) "3 ranks: the .npy file is byte-identical"
    mknn 3 -q -k 9 --vote distance --query-block 6 --targets "$T/tgt.txt" --predict "$T/m3r.txt" "$T/ref.fbin" "$T/q.fbin"
    ok $([ $RC -eq 0 ] && cmp -s "$T/m3r.txt" "$T/want_rd.txt"; echo $?) "3 ranks, regression: equal to the oracle"
    mknn 3 -q -k 5 --vote distance --query-block 7 --labels "$T/duplab.txt" --predict "$T/m3dup.txt" "$T/dup.fbin"
    ok $([ $RC -eq 0 ] && cmp -s "$T/m3dup.txt" "$T/want_dup.txt"; echo $?) "3 ranks, self-join with duplicates: equal"
    mknn 3 -k 9 --vote distance --query-block 5 --labels "$T/lab.txt" --query-labels "$T/qlab.txt" "$T/ref.fbin" "$T/q.fbin"
    ok $([ $RC -eq 0 ] && has "$(cat "$T/want_acc.txt")" "$T/out" && has "ranks=3" "$T/out"; echo $?) \
        "3 ranks: the same accuracy"
    mknn 3 -k 9 --labels "$T/short.txt" --predict "$T/me1.txt" -o "$T/me1.bin" "$T/ref.fbin" "$T/q.fbin"
    ok $([ $RC -eq 2 ] && [ "$(count "holds 599 labels" "$T/err")" -eq 1 ] && no_leftovers "$T/me1.txt" &&
        no_leftovers "$T/me1.bin"; echo $?) "3 ranks, short labels: exit 2, one message, no output"
    mknn 3 -k 9 --labels "$T/lab.txt" --query-labels "$T/short.txt" --predict "$T/me2.txt" "$T/ref.fbin" "$T/q.fbin"
    ok $([ $RC -eq 2 ] && [ "$(count "nq=77" "$T/err")" -eq 1 ] && no_leftovers "$T/me2.txt"; echo $?) \
        "3 ranks, query labels of the wrong length: exit 2, one message, no output"
    mknn 3 -k 9 --labels "$T/badlab.txt" --predict "$T/me3.txt" "$T/ref.fbin" "$T/q.fbin"
    ok $([ $RC -eq 2 ] && no_leftovers "$T/me3.txt"; echo $?) "3 ranks, bad label value: exit 2, no output"
    mknn 3 --vote nope --labels "$T/lab.txt" "$T/ref.fbin" "$T/q.fbin"
    ok $([ $RC -eq 1 ] && [ "$(count "unknown vote" "$T/err")" -eq 1 ]; echo $?) "3 ranks, bad --vote: exit 1, one message"
fi

# ---- knn_prune ------------------------------------------------------------------------------
run "$PRUNE" --cnn --labels "$T/glab.txt" -o "$T/cnn.txt" "$T/g.fbin"
NK=$(wc -l <"$T/cnn.txt" 2>/dev/null)
ok $([ $RC -eq 0 ] && [ "$NK" -gt 0 ] && [ "$NK" -lt 400 ] && [ "$(wc -l <"$T/cnn.labels.txt")" -eq "$NK" ] &&
    [ "$(wc -c <"$T/cnn.fbin")" -eq $((8 + NK * 13 * 4)) ] && has "kept=$NK" "$T/out"; echo $?) \
    "--cnn: ids, .fbin subset and labels agree in size, summary names the kept count"
ok $(awk 'NR == FNR { lab[NR - 1] = $1; next } { print lab[$1] }' "$T/glab.txt" "$T/cnn.txt" |
    cmp -s - "$T/cnn.labels.txt"; echo $?) "--cnn: the subset's labels are the labels of the kept ids"
knn -k 1 --labels "$T/cnn.labels.txt" --query-labels "$T/glab.txt" "$T/cnn.fbin" "$T/g.fbin"
ok $([ $RC -eq 0 ] && has "accuracy=1.0000" "$T/out"; echo $?) \
    "the condensed set classifies every training point correctly by 1-NN (Hart's consistency)"
run "$PRUNE" --enn -k 3 --labels "$T/glab.txt" -o "$T/enn.ibin" "$T/g.fbin"
NK=$(sed -n 's/.*kept=\([0-9]*\).*/\1/p' "$T/out")
ok $([ $RC -eq 0 ] && [ "$(wc -c <"$T/enn.ibin")" -eq $((8 + NK * 4)) ] &&
    [ "$(wc -c <"$T/enn.fbin")" -eq $((8 + NK * 13 * 4)) ]; echo $?) "--enn: .ibin ids and the .fbin subset"
run "$PRUNE" --enn --labels "$T/short.txt" -o "$T/pe.txt" "$T/ref.fbin"
ok $([ $RC -eq 2 ] && has "holds 599 labels" "$T/err" && no_leftovers "$T/pe.txt" && no_leftovers "$T/pe.fbin" &&
    no_leftovers "$T/pe.labels.txt"; echo $?) "knn_prune, labels of the wrong length: exit 2, no output"
run "$PRUNE" --labels "$T/lab.txt" -o "$T/pe2.txt" "$T/ref.fbin"
ok $([ $RC -eq 1 ] && has "--cnn and --enn" "$T/err"; echo $?) "knn_prune without --cnn or --enn: exit 1"
