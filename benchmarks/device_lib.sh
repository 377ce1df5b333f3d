# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# shellcheck disable=SC2034,SC2153 # globals set for the callers; BUILD is theirs
# benchmarks/device_lib.sh -- shell functions shared by the device scripts (sourced, never
# run; defines functions and sets nothing until one is called). Callers set OUT, WORK,
# BUILD, STEPS, NPROC and DEADLINE (SECONDS-based) as their headers document.

# device_env: the environment of every GPU run: no NVLink multicast (NCCL, torch,
# NVSHMEM), unbuffered Python, mpirun allowed as root.
device_env() {
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    export PYTHONUNBUFFERED=1
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# has_step NAME: whether NAME is one of the words of STEPS.
has_step() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# has_word WORD LIST: whether WORD is one of the words of LIST.
has_word() { case " $2 " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# step NAME LIMIT_S CMD...: runs CMD under timeout (LIMIT_S, cut to the time left before
# DEADLINE less 20 s; skipped when under 10 s are left), appends "NAME verdict seconds"
# to $WORK/steps.txt and sets LAST_RC to CMD's status (124 when skipped). Returns 0.
step() {
    local name=$1 limit=$2 t0 t1 rc verdict left
    shift 2
    # never run past the deadline: the summary must still be printed inside the call
    left=$((DEADLINE - SECONDS - 20))
    if [ "$left" -lt 10 ]; then
        printf '%-24s %-16s %8s\n' "$name" "SKIP(no time)" "-" >>"$WORK/steps.txt"
        echo "=== [$name] skipped: less than 30 s left of TOTAL_S=$TOTAL_S"
        LAST_RC=124
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo
    echo "=== [$name] $*"
    t0=$(date +%s.%N)
    timeout --kill-after=15 "$limit" "$@"
    rc=$?
    t1=$(date +%s.%N)
    case $rc in
    0) verdict=ok ;;
    124 | 137) verdict="TIMEOUT(${limit}s)" ;;
    *) verdict="FAIL(rc=$rc)" ;;
    esac
    printf '%-24s %-16s %8ss\n' "$name" "$verdict" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" \
        >>"$WORK/steps.txt"
    echo "=== [$name] $verdict"
    LAST_RC=$rc
    return 0
}

# skip NAME WHY: records NAME as skipped in $WORK/steps.txt.
skip() { printf '%-24s %-16s %8s\n' "$1" "SKIP($2)" "-" >>"$WORK/steps.txt"; echo "=== [$1] skipped: $2"; }

# device_commit: exports XKNN_GIT_COMMIT (as given, else the tree's short hash, else
# "unknown"), prints it with the cores and kernel, and lists the GPUs.
device_commit() {
    if [ -z "${XKNN_GIT_COMMIT:-}" ] && git rev-parse --short HEAD >/dev/null 2>&1; then
        XKNN_GIT_COMMIT=$(git rev-parse --short HEAD)
    fi
    export XKNN_GIT_COMMIT=${XKNN_GIT_COMMIT:-unknown}
    echo "# commit $XKNN_GIT_COMMIT; $NPROC cores; $(uname -r)"
    nvidia-smi -L
}

# build_steps MESON_OPTION...: the steps meson-setup (--reconfigure when BUILD is
# configured already) and ninja (NPROC jobs) of a release build in BUILD.
build_steps() {
    if [ -f "$BUILD/build.ninja" ]; then
        step meson-setup 300 meson setup --reconfigure "$BUILD" "$@" -Dbuildtype=release
    else
        step meson-setup 300 meson setup "$BUILD" "$@" -Dbuildtype=release
    fi
    step ninja 600 ninja -C "$BUILD" -j "$NPROC"
}

# quiet_or_exit LOG CMD...: CMD with its output in $WORK/LOG; when it fails, the log's last
# 20 lines and exit 1.
quiet_or_exit() {
    local log=$WORK/$1
    shift
    "$@" >"$log" 2>&1 || { tail -20 "$log"; exit 1; }
}

# device_outputs NAME: OUT and WORK created; J=$OUT/bench_NAME.json and
# P=$OUT/peers_NAME.json emptied; everything printed from here on also goes to
# $OUT/device_NAME.log.
device_outputs() {
    mkdir -p "$OUT" "$WORK"
    J=$OUT/bench_$1.json
    P=$OUT/peers_$1.json
    : >"$J"
    : >"$P"
    exec > >(tee -a "$OUT/device_$1.log") 2>&1
}

# fmnist_files DEFAULT_OUT [BUILD_DIR [OUT_DIR]]: build (default build) and out (default
# DEFAULT_OUT, created), data (FMNIST, default Debian's dataset-fashion-mnist folder),
# ref and qry (its training and test images); mpirun allowed as root.
fmnist_files() {
    build=${2:-build}
    out=${3:-$1}
    data=${FMNIST:-/usr/share/datasets/fashion-mnist}
    ref=$data/train-images-idx3-ubyte.gz
    qry=$data/t10k-images-idx3-ubyte.gz
    mkdir -p "$out"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}
