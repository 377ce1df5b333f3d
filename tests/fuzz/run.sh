#!/bin/sh
# SPDX-License-Identifier: MIT
# run.sh SRCDIR BUILDDIR -- build the libFuzzer targets with clang and run each one for
# FUZZ_SECONDS (default 20) from its seed corpus (TAP). Per target: it builds; every seed
# and every saved crash (crashes/<target>/*, once fixed: a regression test) runs clean;
# the fuzz run finds nothing. Prints "1..0 # SKIP" when clang cannot build fuzzers.
# New crash inputs are saved under BUILDDIR/fuzz-artifacts/<target>/: copy them into
# tests/fuzz/crashes/<target>/ and report them.

SRC=${1:?usage: run.sh SRCDIR BUILDDIR}
OUT=${2:?usage: run.sh SRCDIR BUILDDIR}
SECS=${FUZZ_SECONDS:-20}
CC=${FUZZ_CC:-clang}
TARGETS="fvecs fbin npy idx options"
F=$SRC/tests/fuzz
mkdir -p "$OUT" || exit 1

if ! command -v "$CC" >/dev/null 2>&1; then
    echo "1..0 # SKIP $CC not found"
    exit 0
fi
probe=$OUT/fuzz-probe
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n);\n%s\n' \
    'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' \
    >"$probe.c"
if ! "$CC" -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" >/dev/null 2>&1; then
    echo "1..0 # SKIP $CC cannot build libFuzzer targets (-fsanitize=fuzzer)"
    exit 0
fi
ZLIB=""
printf '#include <zlib.h>\nint main(void) { return zlibVersion() == 0; }\n' >"$probe-z.c"
"$CC" "$probe-z.c" -lz -o "$probe-z" >/dev/null 2>&1 && ZLIB="-DXKNN_HAVE_ZLIB=1 -lz"

NUM=0
FAILED=0
echo "1..15"
ok() { # ok STATUS DESCRIPTION [LOG]
    NUM=$((NUM + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $NUM - $2"
    else
        echo "not ok $NUM - $2"
        FAILED=$((FAILED + 1))
        [ -n "$3" ] && grep -v '^#\|^INFO\|^ *$' "$3" | head -n 30 | sed 's/^/#   /'
    fi
}

for t in $TARGETS; do
    bin=$OUT/fuzz_$t
    # -Wno-unused-function: the option target compiles all of tools/knn_mpi.c for its parser
    # shellcheck disable=SC2086
    "$CC" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
        -D_POSIX_C_SOURCE=200809L -I"$SRC/include" -Wno-unused-function \
        "$F/fuzz_$t.c" $ZLIB -lm -o "$bin" >"$OUT/fuzz_$t.build.log" 2>&1
    built=$?
    ok $built "fuzz_$t: builds with $CC -fsanitize=fuzzer,address,undefined${ZLIB:+ and zlib}" \
        "$OUT/fuzz_$t.build.log"
    if [ $built -ne 0 ]; then
        ok 1 "fuzz_$t: seeds and saved crashes replay clean (not built)"
        ok 1 "fuzz_$t: $SECS s of fuzzing (not built)"
        continue
    fi
    # Replay: the seeds and every saved crash input, once each.
    set --
    for f in "$F/corpus/$t"/* "$F/crashes/$t"/*; do [ -f "$f" ] && set -- "$@" "$f"; done
    "$bin" -runs=1 "$@" >"$OUT/fuzz_$t.replay.log" 2>&1
    ok $? "fuzz_$t: $# seeds and saved crashes replay clean" "$OUT/fuzz_$t.replay.log"
    # Fuzz from a scratch copy of the seeds (the source tree is never written).
    work=$OUT/fuzz-corpus/$t
    art=$OUT/fuzz-artifacts/$t
    rm -rf "$work"
    mkdir -p "$work" "$art"
    cp "$F/corpus/$t"/* "$work"/
    "$bin" -max_total_time="$SECS" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$art/" "$work" >"$OUT/fuzz_$t.log" 2>&1
    rc=$?
    stats=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$OUT/fuzz_$t.log" | tail -n 1 | sed 's/[[:space:]]\{1,\}/ /g')
    ok $rc "fuzz_$t: $SECS s of fuzzing, no crash" "$OUT/fuzz_$t.log"
    echo "# fuzz_$t: ${stats:-no stats} (artifacts in $art)"
done
rm -f "$probe" "$probe.c" "$probe-z" "$probe-z.c"
[ $FAILED -eq 0 ]
