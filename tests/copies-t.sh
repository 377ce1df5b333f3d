#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/copies-t.sh SRCDIR -- the CUDA engine's copies are ordered on streams (docs/DESIGN.md
# §5): no synchronous cudaMemcpy, cudaMemcpy2D or cudaMemcpy3D in kernels/cuda but the
# ones listed here. A synchronous copy from pageable memory returns before the device
# holds the bytes, on the legacy stream, which the context's non-blocking streams do not
# follow: work enqueued after it may read the old bytes.
. "$(dirname "$0")/tap.sh"
S=$1
tap_begin copies 2
cd "$S" || exit 1
# the one allowed: resident.cu's xknn__cuda_copy_rows, which copies a caller's device rows
# into host memory (the host waits for the bytes) outside any context's streams
grep -rnE 'cudaMemcpy(2D|3D)?\(' kernels/cuda >"$T/all"
grep -vE '^kernels/cuda/resident\.cu:[0-9]+: +const cudaError_t ce = rows > 0 \? cudaMemcpy2D\(' "$T/all" >"$T/err"
WHY="synchronous copies outside the list"
ok $([ -s "$T/err" ] && echo 1 || echo 0) "kernels/cuda has no synchronous cudaMemcpy/2D/3D but xknn__cuda_copy_rows's"
grep -c 'cudaMemcpy2D(' "$T/all" >"$T/n"
WHY="the listed copy moved: update this test"
[ "$(cat "$T/n")" = 1 ]
ok $? "the listed copy is where the list says"
tap_end
