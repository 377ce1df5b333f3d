#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fashion-MNIST classification and pruning with knn_mpi / knn_prune: test accuracy for
# k = 1, 5, 9 x {uniform, distance} (l2), the k = 5 distance run again on 2 ranks (its
# prediction file must be byte-identical), Hart condensing (k = 1) and Wilson editing
# (k = 3) of the 60k training images with the 1-NN test accuracy of each kept subset,
# and, when numpy and scikit-learn are installed, the same predictions from scikit-learn
# (benchmarks/peers_learn.py).
#   usage: bash benchmarks/fmnist_learn.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
# shellcheck source=benchmarks/device_lib.sh
. "$(dirname "$0")/device_lib.sh"
fmnist_files fmnist-learn "$@"
lab=$data/train-labels-idx1-ubyte.gz
qlab=$data/t10k-labels-idx1-ubyte.gz
knn() { mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$1" "$build/tools/knn_mpi" "${@:2}"; }
for k in 1 5 9; do
    for v in uniform distance; do
        knn 1 -k "$k" --vote "$v" --labels "$lab" --query-labels "$qlab" --predict "$out/p_${k}_$v.txt" "$ref" "$qry"
    done
done
knn 2 -k 5 --vote distance --labels "$lab" --query-labels "$qlab" --predict "$out/p2_5_distance.txt" "$ref" "$qry"
if cmp -s "$out/p2_5_distance.txt" "$out/p_5_distance.txt"; then echo "2 ranks: identical predictions"; else
    echo "2 ranks: predictions DIFFER"; exit 1; fi
"$build/tools/knn_prune" --cnn -k 1 --labels "$lab" -o "$out/cnn.txt" "$ref"
"$build/tools/knn_prune" --enn -k 3 --labels "$lab" -o "$out/enn.txt" "$ref"
for s in cnn enn; do
    knn 1 -k 1 --labels "$out/$s.labels.txt" --query-labels "$qlab" --predict "$out/p_$s.txt" "$out/$s.fbin" "$qry"
done
if python3 -c 'import numpy, sklearn' 2>/dev/null; then
    python3 "$(dirname "$0")/peers_learn.py" "$data" "$out"
else
    echo "numpy/scikit-learn not installed: no comparison with scikit-learn"
fi
