#!/bin/sh
# SPDX-License-Identifier: MIT
# Two translation units that both define XKNN_IMPLEMENTATION must fail clearly at link
# time ("multiple definition of `xknn_search'"), never link silently. TAP; test 2 is the
# expected failure, test 1 the control (one unit links with the same flags).
# Usage: impl-twice-t.sh INCLUDE_DIR CC [CC ARGS...]
inc=$1; shift
tmp=$(mktemp -d "${TMPDIR:-/tmp}/xknn-impl.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
echo "1..3"

cat > "$tmp/a.c" <<'EOS'
#define _POSIX_C_SOURCE 200809L
#define XKNN_IMPLEMENTATION
#include <xknn.h>
int other(void);
int main(void) { return other() + (xknn_params_default().metric == XKNN_METRIC_L2 ? 0 : 1); }
EOS
cat > "$tmp/b.c" <<'EOS'
#define _POSIX_C_SOURCE 200809L
#define XKNN_IMPLEMENTATION
#include <xknn.h>
int other(void);
int other(void) { return (int)xknn_metric_from_name("l2"); }
EOS
sed -e 's/^#define XKNN_IMPLEMENTATION$//' "$tmp/b.c" > "$tmp/c.c"

flags="-std=c99 -Wall -Wextra -Wpedantic -Werror -I$inc"
# The backends are not linked here: unresolved xknn__* symbols are ignored so the only
# possible link error is the one under test.
ign="-Wl,--unresolved-symbols=ignore-all"
if "$@" $flags -c "$tmp/a.c" -o "$tmp/a.o" 2>"$tmp/err" && "$@" $flags -c "$tmp/b.c" -o "$tmp/b.o" 2>>"$tmp/err" &&
   "$@" $flags -c "$tmp/c.c" -o "$tmp/c.o" 2>>"$tmp/err"; then
    echo "ok 1 - both units compile alone as C99 with XKNN_IMPLEMENTATION"
else
    echo "not ok 1 - units compile"; sed 's/^/# /' "$tmp/err"
fi
if "$@" "$tmp/a.o" "$tmp/c.o" $ign -o "$tmp/one" 2>"$tmp/err"; then
    echo "ok 2 - control: one implementing unit + one plain unit link"
else
    echo "not ok 2 - control link failed"; sed 's/^/# /' "$tmp/err"
fi
if "$@" "$tmp/a.o" "$tmp/b.o" $ign -o "$tmp/two" 2>"$tmp/err"; then
    echo "not ok 3 - two units defining XKNN_IMPLEMENTATION linked without error (expected a failure)"
elif grep -Eq "multiple definition of .xknn_|duplicate symbol:? .?xknn_" "$tmp/err"; then
    echo "ok 3 - expected link failure: $(grep -Eo "multiple definition of .xknn_[a-z_]*.|duplicate symbol:? .?xknn_[a-z_]*" "$tmp/err" | head -n 1)"
else
    echo "not ok 3 - link failed, but not with a multiple-definition error"; sed 's/^/# /' "$tmp/err"
fi
