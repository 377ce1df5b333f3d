#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# benchmarks/device_python.sh -- the Python package on a GPU machine without a package
# registry: the extension module is compiled against an existing CUDA build of the
# library (BUILD, default build-head) for the machine's python3, pytest comes from WHEELS
# (a folder of wheels, optional), then the GPU tests and python/bench/gpu_torch.py run.
#   BUILD=build-head WHEELS=.devcarry/wheels OUT=... bash benchmarks/device_python.sh
set -uo pipefail
BUILD=${BUILD:-build-head}
WHEELS=${WHEELS:-}
OUT=${OUT:-$PWD/device-out}
PY=${PY:-python3}
PKG=$(mktemp -d /tmp/xknn-py.XXXXXX)
mkdir -p "$OUT" "$PKG/xknn"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
inc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
ext=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
[ -f "$inc/Python.h" ] || { echo "no Python.h in $inc: the extension cannot be built here"; exit 2; }
cp python/xknn/*.py "$PKG/xknn/"
gcc -O2 -shared -fPIC -std=c99 -I include -I "$inc" -DXKNN_PY_VERSION='"0.1.0"' python/src/_xknn.c \
    -L "$BUILD" -lxknn -Wl,-rpath,"$PWD/$BUILD" -o "$PKG/xknn/_xknn$ext" || exit 1
[ -n "$WHEELS" ] && "$PY" -m pip install -q --no-index --find-links "$WHEELS" pytest >/dev/null 2>&1
export PYTHONPATH=$PKG
(cd python/tests && "$PY" -m pytest -q -rs test_gpu.py test_search.py 2>&1 | tail -n 15) | tee "$OUT/python_gpu.txt"
"$PY" python/bench/gpu_torch.py "$@" | tee -a "$OUT/python_gpu.txt"
