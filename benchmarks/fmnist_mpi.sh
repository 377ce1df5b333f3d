#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fashion-MNIST acceptance run of knn_mpi: exact top-100 of the 10k test images among
# the 60k training images with 1..5 MPI ranks (CPU backend), byte-identical result files,
# per-phase JSON, and an exactness check of a sample of rows against a float64 brute
# force (benchmarks/check_result.py).
#   usage: bash benchmarks/fmnist_mpi.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
# shellcheck source=benchmarks/device_lib.sh
. "$(dirname "$0")/device_lib.sh"
fmnist_files fmnist-out "$@"
cores=$(nproc)
for np in 1 2 3 4 5; do
    t=$(( cores / np )); [ "$t" -ge 1 ] || t=1
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" "$build/tools/knn_mpi" -k 100 \
        --threads "$t" --json "$out/np$np.json" -o "$out/np$np.bin" "$ref" "$qry"
done
for np in 2 3 4 5; do
    if cmp -s "$out/np1.bin" "$out/np$np.bin"; then echo "np$np.bin identical to np1.bin"; else
        echo "np$np.bin DIFFERS from np1.bin"; exit 1; fi
done
python3 "$(dirname "$0")/check_result.py" "$out/np1.bin" "$ref" "$qry" --sample 200
