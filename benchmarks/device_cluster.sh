#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# benchmarks/device_cluster.sh -- the distributed data path's rows on one GPU machine
# (every GPU it has), from the repository root, OUT set:
#
#   bash benchmarks/device_cluster.sh
#
# Steps (STEPS, default all):
#   build    release, CUDA, gpu_arch 90, in $BUILD (bench_scaling, knn_mpi, bench_knn)
#   scaling  bench_scaling --mode both (one-shot, then a resident index) with 1, 2, 4 ...
#            ranks (a GPU each): strong n = $N_STRONG, weak $N_WEAK per rank; nq 10k,
#            d = 128, k = 100 (RANKS_STRONG, RANKS_WEAK: other rank lists for either)
#   files    knn_mpi end to end on .fbin files in the page cache: the W1 files (1M x 128,
#            10k queries) on one GPU, and $N_FILE x 128 on 1, 2, 4 ... ranks (k = 100);
#            total, read and search seconds and read GB/s per rank from --json
#   load     bench_knn W4/W5 host arrays quiet and under a spinning process per core
#            (device_load.sh)
#   ring     the symmetric ring (knn_mpi REF -k 16) on $N_RING x 128 with 2 and 4 ...
#            ranks; with 2, also under the load
# Prints one line a row and writes OUT/cluster.txt; JSON of every run in OUT/cluster/.
set -uo pipefail
OUT=${OUT:-$PWD/device-out}
BUILD=${BUILD:-build-cluster}
STEPS=${STEPS:-"build scaling files load ring"}
N_STRONG=${N_STRONG:-100M}
N_WEAK=${N_WEAK:-25M}
N_FILE=${N_FILE:-20000000}
N_RING=${N_RING:-8000000}
REPEATS=${REPEATS:-3}
WORK=${WORK:-/tmp/xknn-cluster}
GPUS=$(nvidia-smi -L | wc -l)
RANKS=${RANKS:-$(p=1; while [ "$p" -le "$GPUS" ]; do printf '%s ' "$p"; p=$((p * 2)); done)}
mkdir -p "$OUT/cluster" "$WORK"
exec > >(tee -a "$OUT/cluster.txt") 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
has() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism cma"
spin=()
load_on() { for _ in $(seq "$(nproc)"); do (while :; do :; done) & spin+=($!); done; sleep 1; }
load_off() { [ ${#spin[@]} -gt 0 ] && kill "${spin[@]}" 2>/dev/null; spin=(); }
trap load_off EXIT
echo "# device_cluster: $GPUS GPUs ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)), $(nproc) cores," \
    "commit ${XKNN_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}, $(date -u +%FT%TZ)"

if has build; then
    t0=$SECONDS
    [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" -Dbuildtype=release -Dcuda=enabled -Dgpu_arch=90 -Dtests=true \
        -Dexamples=false > "$WORK/setup.log" 2>&1 || { tail -20 "$WORK/setup.log"; exit 1; }
    ninja -C "$BUILD" benchmarks/bench_scaling benchmarks/bench_knn tools/knn_mpi tests/mkdata > "$WORK/build.log" 2>&1 ||
        { tail -30 "$WORK/build.log"; exit 1; }
    echo "# built in $((SECONDS - t0)) s"
fi
KNN=$BUILD/tools/knn_mpi

if has scaling; then
    for kind in strong weak; do
        ranks=${RANKS_STRONG:-$RANKS}
        [ $kind = weak ] && ranks=${RANKS_WEAK:-$RANKS}
        for p in $ranks; do
            size="--n $N_STRONG"; [ $kind = weak ] && size="--n-per-rank $N_WEAK"
            j=$OUT/cluster/scaling_${kind}_np$p.json
            # shellcheck disable=SC2086 # size: two words
            timeout 400 $MPIRUN -np "$p" "$BUILD/benchmarks/bench_scaling" --backend cuda $size --nq 10k --d 128 --k 100 \
                --repeats "$REPEATS" --mode both --json "$j" > "$WORK/scaling.log" 2>&1 || echo "scaling $kind np$p FAILED"
            grep -E '^# resident index|^# PASS|^# FAIL' "$WORK/scaling.log"
            python3 - "$j" "$kind" "$p" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(f"scaling {sys.argv[2]} ranks={sys.argv[3]} n={r['n']} {r['mode']:8s} total {r['total_ms']:.1f} ms"
          f" (bcast {r['broadcast_ms']:.1f}, search {r['search_ms']:.1f}, reduce {r['reduce_ms']:.1f}),"
          f" wrong {r['wrong']}, create {d['meta'].get('create_ms') if 'meta' in d else d.get('create_ms')} ms")
PY
        done
    done
fi

gen() { # gen FILE ROWS SEED: float32 .fbin of uniform values, written once
    [ -f "$1" ] || python3 - "$1" "$2" "$3" <<'PY'
import sys, numpy as np
path, rows, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(seed)
with open(path, "wb") as f:
    np.array([rows, 128], dtype=np.int32).tofile(f)
    for r0 in range(0, rows, 1 << 20):
        rng.random((min(1 << 20, rows - r0), 128), dtype=np.float32).tofile(f)
PY
}
files_row() { # files_row NAME NP REF QUERY
    local j=$OUT/cluster/files_$1_np$2.json
    cat "$3" "$4" > /dev/null # in the page cache
    timeout 300 $MPIRUN -np "$2" "$KNN" "$3" "$4" -k 100 --backend cuda -q -o "$WORK/out.bin" --json "$j" ||
        echo "files $1 np$2 FAILED"
    python3 - "$j" "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); t = d["time_s"]
per = " ".join(f"{r.get('read_GB_per_s', 0):.2f}" for r in d.get("per_rank", []))
print(f"knn_mpi {sys.argv[2]} ranks={sys.argv[3]} total {t['total']:.3f} s, read {t['read']:.3f} s"
      f" ({d['read']['GB_per_s']:.2f} GB/s all ranks; per rank {per}), search {t['search']:.3f} s,"
      f" query phase {t['query_phase']:.3f} s, setup {t.get('setup', 0):.3f} s (MPI_Init"
      f" {t.get('mpi_init', 0):.3f}, CUDA driver {t.get('cuda_init', 0):.3f}), context {t.get('context', 0):.3f} s"
      f" beside the read, device wait {t.get('device_wait', 0):.3f} s")
PY
    rm -f "$WORK/out.bin"
}
if has files; then
    gen "$WORK/w1_ref.fbin" 1000000 1
    gen "$WORK/q10k.fbin" 10000 2
    files_row W1 1 "$WORK/w1_ref.fbin" "$WORK/q10k.fbin"
    files_row W1 1 "$WORK/w1_ref.fbin" "$WORK/q10k.fbin"
    gen "$WORK/big_ref.fbin" "$N_FILE" 3
    for p in $RANKS; do files_row big "$p" "$WORK/big_ref.fbin" "$WORK/q10k.fbin"; done
    rm -f "$WORK/big_ref.fbin"
fi

if has load; then
    BUILDS=$BUILD REPEATS=20 bash benchmarks/device_load.sh
fi

ring_row() { # ring_row NP LABEL
    local j=$OUT/cluster/ring_$2_np$1.json
    timeout 200 $MPIRUN -np "$1" "$KNN" "$WORK/ring.fbin" -k 16 --backend cuda -q -o "$WORK/ring_out.bin" --json "$j" ||
        echo "ring np$1 $2 FAILED (or over 200 s)"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f'ring {sys.argv[2]} ranks={sys.argv[3]} self-join phase {d[\"time_s\"][\"query_phase\"]:.2f} s, total {d[\"time_s\"][\"total\"]:.2f} s')" "$j" "$2" "$1" 2>/dev/null
    rm -f "$WORK/ring_out.bin"
}
if has ring; then
    gen "$WORK/ring.fbin" "$N_RING" 4
    cat "$WORK/ring.fbin" > /dev/null
    for p in $RANKS; do [ "$p" -ge 2 ] && ring_row "$p" quiet; done
    load_on
    ring_row 2 loaded
    load_off
fi
