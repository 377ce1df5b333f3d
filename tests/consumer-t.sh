#!/bin/sh
# Consumption of xknn by an outside project (tests/consumer), two ways. TAP.
#  (a) as a Meson subproject: the xknn sources copied to subprojects/xknn (no wrap file),
#      dependency('xknn') resolved through xknn's meson.override_dependency;
#  (b) through pkg-config after `meson install --destdir`: installed headers, library,
#      pkg-config files and the knn_mpi command are checked, then the consumer is built
#      with Meson and with a plain `cc $(pkg-config --cflags --libs xknn)`.
# Usage: consumer-t.sh XKNN_SOURCE_ROOT mpi|nompi
# Optional features are disabled to keep it short (cuda, tests, examples, benchmarks).
src=$1
want_mpi=$2
meson=${MESON:-meson}
ninja=${NINJA:-ninja}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/xknn-consumer.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
unset PKG_CONFIG_SYSROOT_DIR
n=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
fail() { # description, log file
    n=$((n + 1)); echo "not ok $n - $1"
    # progress bars end their lines with \r and a log may lack its last newline: each
    # diagnostic line is a line of its own, so the next TAP line starts a line
    [ -n "$2" ] && [ -f "$2" ] && { tail -n 30 "$2"; echo; } | tr '\r' '\n' | grep -v '^ *$' | sed 's/^/# /'
}
check() { # description, log, command...
    d=$1; l=$2; shift 2
    if "$@" >"$l" 2>&1; then ok "$d"; else fail "$d" "$l"; fi
}

if [ "$want_mpi" = mpi ]; then echo "1..17"; else echo "1..15"; fi

# ---- (a) subproject ------------------------------------------------------------------
a=$tmp/a
mkdir -p "$a/subprojects/xknn"
cp "$src/tests/consumer/meson.build" "$src/tests/consumer/main.c" "$a/"
# The build files, the headers and sources, and every directory the top-level meson.build
# enters, except tests, examples and benchmarks (switched off below; benchmarks/data may
# hold large data sets).
dirs=$(sed -n "s/^ *subdir('\([^'/]*\).*/\1/p" "$src/meson.build" | sort -u | grep -Ev '^(tests|examples|benchmarks)$')
for f in meson.build meson_options.txt LICENSE include src $dirs; do
    [ -e "$src/$f" ] && cp -R "$src/$f" "$a/subprojects/xknn/"
done
check "subproject: configure with dependency('xknn') from subprojects/xknn" "$tmp/a-setup.log" \
    "$meson" setup "$a/build" "$a" --force-fallback-for=xknn \
    -Dxknn:tests=false -Dxknn:cuda=disabled -Dxknn:mpi=disabled -Dxknn:examples=false \
    -Dxknn:benchmarks=false
# Meson 1.0 logs "Dependency xknn found: YES 0.1.0 (overridden)", Meson 1.12 "Dependency
# xknn for host machine found: YES 0.1.0 (overridden)".
if grep -Eq "Dependency xknn (for host machine )?found: YES .*\(overridden\)" "$tmp/a-setup.log"; then
    ok "subproject: xknn resolved through its meson.override_dependency"
else
    fail "subproject: xknn resolved through its meson.override_dependency" "$tmp/a-setup.log"
fi
check "subproject: build (warning_level=3, werror)" "$tmp/a-build.log" "$ninja" -C "$a/build"
check "subproject: consumer finds the right neighbours" "$tmp/a-run.log" "$a/build/consumer"

# ---- (b) install + pkg-config --------------------------------------------------------
b=$tmp/b
D=$tmp/dest
prefix=/opt/xknn
check "install: configure xknn (cuda, tests, examples, benchmarks off)" "$tmp/b-setup.log" \
    "$meson" setup "$b" "$src" --prefix="$prefix" --libdir=lib -Dcuda=disabled -Dtests=false \
    -Dexamples=false -Dbenchmarks=false
check "install: build xknn" "$tmp/b-build.log" "$ninja" -C "$b"
check "install: meson install --destdir" "$tmp/b-install.log" "$meson" install -C "$b" --destdir "$D"
P=$D$prefix
missing=
files="include/xknn.h include/xknn/io.h include/xknn/cuda.h include/xknn/impl/backend.h
       lib/libxknn.so lib/pkgconfig/xknn.pc bin/knn_mpi"
[ "$want_mpi" = mpi ] && files="$files include/xknn_mpi.h lib/libxknn_mpi.so lib/pkgconfig/xknn_mpi.pc"
for f in $files; do [ -e "$P/$f" ] || missing="$missing $f"; done
if [ -z "$missing" ]; then ok "install: headers, libraries, pkg-config files, knn_mpi present"
else fail "install: missing:$missing"; (cd "$D" && find . -type f) | sed 's/^/# /'; fi

export LD_LIBRARY_PATH="$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$P/lib/pkgconfig"
if "$P/bin/knn_mpi" --help >"$tmp/help.log" 2>&1 && grep -qi "usage" "$tmp/help.log"; then
    ok "install: knn_mpi --help runs from the install"
else fail "install: knn_mpi --help runs from the install" "$tmp/help.log"; fi
# The .pc files name the final prefix; the sysroot maps it into the destdir.
export PKG_CONFIG_SYSROOT_DIR=$D
check "pkg-config: xknn version 0.1.0 or newer" "$tmp/pc.log" pkg-config --atleast-version=0.1.0 xknn
if pkg-config --cflags xknn 2>"$tmp/pc.log" | grep -q -- "-I$P/include"; then
    ok "pkg-config: --cflags points into the install"
else fail "pkg-config: --cflags points into the install" "$tmp/pc.log"; fi

c=$tmp/c
mkdir -p "$c"
cp "$src/tests/consumer/meson.build" "$src/tests/consumer/main.c" "$c/"
check "pkg-config: configure the consumer (no fallback allowed)" "$tmp/c-setup.log" \
    "$meson" setup "$c/build" "$c" --wrap-mode=nofallback
if grep -q "Run-time dependency xknn found: YES" "$tmp/c-setup.log"; then
    ok "pkg-config: xknn found by pkg-config"
else fail "pkg-config: xknn found by pkg-config" "$tmp/c-setup.log"; fi
check "pkg-config: build and run the consumer" "$tmp/c-build.log" sh -c "'$ninja' -C '$c/build' && '$c/build/consumer'"
cc=${CC:-cc}
# shellcheck disable=SC2046
check "pkg-config: plain cc -std=c99 main.c \$(pkg-config --cflags --libs xknn)" "$tmp/cc.log" \
    sh -c "$cc -std=c99 -Wall -Wextra -Wpedantic -Werror '$c/main.c' \$(pkg-config --cflags --libs xknn) -o '$tmp/plain' && '$tmp/plain'"
if [ "$want_mpi" = mpi ]; then
    check "pkg-config: xknn_mpi resolves (requires xknn)" "$tmp/pcm.log" pkg-config --cflags --libs xknn_mpi
    printf '#include <xknn_mpi.h>\nint main(void) { return xknn_mpi_transfer_from_name("auto") != XKNN_MPI_TRANSFER_AUTO; }\n' > "$tmp/m.c"
    check "pkg-config: mpicc links a program against xknn_mpi" "$tmp/mcc.log" \
        sh -c "mpicc -std=c99 '$tmp/m.c' \$(pkg-config --cflags --libs xknn_mpi) -o '$tmp/m' && '$tmp/m'"
fi
