#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fashion-MNIST with knn_mpi on the GPU machine: 1 and 2 ranks (one GPU each when there
# are two), CUDA backend, k = 100, per-phase JSON; the result files are compared byte for
# byte with each other and with a CPU-backend result file made elsewhere (REF_RESULT).
#   usage: bash benchmarks/device_fmnist.sh BUILD_DIR DATA_DIR REF_RESULT OUT_DIR
set -uo pipefail
build=$1 data=$2 cpu_result=$3 out=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
rc=0
for np in 1 2; do
    [ "$np" -le "$ngpu" ] || continue
    timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" "$build/tools/knn_mpi" \
        --backend cuda -k 100 --json "$out/fmnist_gpu_np$np.json" -o "/tmp/fmnist_gpu_np$np.bin" \
        "$data/train-images-idx3-ubyte.gz" "$data/t10k-images-idx3-ubyte.gz" || rc=1
    if cmp "/tmp/fmnist_gpu_np$np.bin" "$cpu_result"; then
        echo "fmnist: GPU np=$np result identical to the CPU backend's"
    else
        echo "fmnist: GPU np=$np result DIFFERS from the CPU backend's"; rc=1
    fi
done
exit $rc
