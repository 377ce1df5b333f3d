#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# benchmarks/device_load.sh -- host-array GPU searches (W4, W5: bench_knn --mode host)
# quiet and under a CPU load of one spinning process per core, for each build given
# (BUILDS="build-head .devcarry/base/build-base"), alternating. Prints one line a row:
# build, row, quiet ms, loaded ms, loaded / quiet. The spinners are always stopped.
set -uo pipefail
BUILDS=${BUILDS:-build-head}
REPEATS=${REPEATS:-20}
spin=()
stop() { [ ${#spin[@]} -gt 0 ] && kill "${spin[@]}" 2>/dev/null; spin=(); }
trap stop EXIT
row() { # row BUILD N
    "$1/benchmarks/bench_knn" --backend cuda --n "$2" --nq 4096 --d 128 --k 16 --path auto --mode host \
        --repeats "$REPEATS" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ && $7 == "host" { print $8 }'
}
for b in $BUILDS; do
    for n in 16384 65536; do
        q=$(row "$b" "$n")
        for i in $(seq "$(nproc)"); do (while :; do :; done) & spin+=($!); done
        sleep 1
        l=$(row "$b" "$n")
        stop
        echo "$b n=$n host: quiet ${q} ms, loaded ${l} ms, ratio $(awk -v a="$q" -v b="$l" 'BEGIN { if (a > 0) printf "%.2f", b / a }')"
    done
done
