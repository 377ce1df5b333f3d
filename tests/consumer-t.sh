#!/bin/sh
# SPDX-License-Identifier: MIT
# Consumption of xknn by an outside project (tests/consumer), two ways. TAP.
#  (a) as a Meson subproject: the xknn sources copied to subprojects/xknn (no wrap file),
#      dependency('xknn') resolved through xknn's meson.override_dependency;
#  (b) through pkg-config after `meson install --destdir`: installed headers, library,
#      pkg-config files and the knn_mpi command are checked, then the consumer is built
#      with Meson and with a plain `cc $(pkg-config --cflags --libs xknn)`; with MPI, a
#      plain `cc mpi_main.c $(pkg-config --cflags --libs xknn_mpi)` (no mpicc) runs under
#      mpirun. A program linked against the install finds libxknn.so.0 at run time
#      through an rpath to pkg-config's libdir, and does not without one (nor
#      LD_LIBRARY_PATH): the README's install notes;
#  (c) through the installed CMake package: find_package(xknn CONFIG) and the imported
#      targets xknn::xknn and (with MPI) xknn::xknn_mpi; a version the install does not
#      satisfy is refused. Skipped where cmake is missing.
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

if [ "$want_mpi" = mpi ]; then echo "1..26"; else echo "1..21"; fi

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
       lib/libxknn.so lib/pkgconfig/xknn.pc bin/knn_mpi share/doc/xknn/LICENSE
       lib/cmake/xknn/xknnConfig.cmake lib/cmake/xknn/xknnConfigVersion.cmake"
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
    cp "$src/tests/consumer/mpi_main.c" "$c/"
fi
# The sysroot would also prefix Open MPI's own paths (ompi-c.pc lives outside it): from
# here on, copies of the installed .pc files with the destdir in their prefix, which is
# what an install made directly at that prefix has.
unset PKG_CONFIG_SYSROOT_DIR
mkdir -p "$tmp/pc"
for f in "$P"/lib/pkgconfig/*.pc; do sed "s|^prefix=.*|prefix=$P|" "$f" >"$tmp/pc/$(basename "$f")"; done
export PKG_CONFIG_PATH="$tmp/pc"
if [ "$want_mpi" = mpi ]; then
    # shellcheck disable=SC2046
    check "pkg-config: plain cc mpi_main.c \$(pkg-config --cflags --libs xknn_mpi) links (no mpicc)" "$tmp/mpc.log" \
        sh -c "$cc -std=c99 -Wall -Wextra -Wpedantic -Werror '$c/mpi_main.c' \$(pkg-config --cflags --libs xknn_mpi) -o '$tmp/mplain'"
    check "pkg-config: that program finds its neighbours under mpirun -np 3" "$tmp/mpr.log" \
        mpirun --oversubscribe -np 3 "$tmp/mplain"
fi

# ---- run time: where a program finds libxknn.so.0 ------------------------------------
# shellcheck disable=SC2046
if sh -c "$cc -std=c99 '$c/main.c' \$(pkg-config --cflags --libs xknn) -o '$tmp/norpath'" >"$tmp/nr.log" 2>&1 &&
   ! env -u LD_LIBRARY_PATH "$tmp/norpath" >>"$tmp/nr.log" 2>&1 && grep -q "libxknn.so.0" "$tmp/nr.log"; then
    ok "run time: without an rpath or LD_LIBRARY_PATH the loader does not find libxknn.so.0 outside its paths"
else fail "run time: without an rpath or LD_LIBRARY_PATH the loader does not find libxknn.so.0 outside its paths" "$tmp/nr.log"; fi
libdir=$(pkg-config --variable=libdir xknn)
# shellcheck disable=SC2046
check "run time: linked with -Wl,-rpath,\$(pkg-config --variable=libdir xknn) it runs without LD_LIBRARY_PATH" \
    "$tmp/rp.log" sh -c "$cc -std=c99 '$c/main.c' \$(pkg-config --cflags --libs xknn) -Wl,-rpath,'$libdir' -o '$tmp/rpath' && env -u LD_LIBRARY_PATH '$tmp/rpath'"

# ---- (c) CMake package ---------------------------------------------------------------
if [ "$want_mpi" = mpi ]; then ncm=5; cm_mpi=ON; else ncm=4; cm_mpi=OFF; fi
if ! command -v cmake >/dev/null 2>&1; then
    i=0; while [ $i -lt $ncm ]; do n=$((n + 1)); echo "ok $n # SKIP cmake not installed"; i=$((i + 1)); done
    exit 0
fi
e=$tmp/e
mkdir -p "$e"
cp "$src/tests/consumer/CMakeLists.txt" "$src/tests/consumer/main.c" "$src/tests/consumer/mpi_main.c" "$e/"
check "cmake: find_package(xknn CONFIG) from the install (MPI component: $cm_mpi)" "$tmp/e-setup.log" \
    cmake -S "$e" -B "$e/build" -DCMAKE_PREFIX_PATH="$P" -DWITH_MPI=$cm_mpi
check "cmake: build against xknn::xknn$([ $cm_mpi = ON ] && echo ' and xknn::xknn_mpi')" "$tmp/e-build.log" \
    cmake --build "$e/build"
check "cmake: consumer (xknn::xknn) runs without LD_LIBRARY_PATH" "$tmp/e-run.log" \
    env -u LD_LIBRARY_PATH "$e/build/consumer"
if [ "$want_mpi" = mpi ]; then
    check "cmake: mpi_consumer (xknn::xknn_mpi) runs under mpirun -np 3 without LD_LIBRARY_PATH" "$tmp/e-mpi.log" \
        env -u LD_LIBRARY_PATH mpirun --oversubscribe -np 3 "$e/build/mpi_consumer"
fi
if cmake -S "$e" -B "$e/build-v" -DCMAKE_PREFIX_PATH="$P" -DXKNN_MIN_VERSION=1.0 >"$tmp/e-v.log" 2>&1; then
    fail "cmake: find_package(xknn 1.0) refuses the installed 0.x" "$tmp/e-v.log"
elif grep -q "xknnConfig.cmake, version: 0.1.0" "$tmp/e-v.log"; then
    ok "cmake: find_package(xknn 1.0) refuses the installed 0.x"
else fail "cmake: find_package(xknn 1.0) refuses the installed 0.x" "$tmp/e-v.log"; fi
