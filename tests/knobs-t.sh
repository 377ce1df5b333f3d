#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/knobs-t.sh SRCDIR -- the environment knobs have one owner: the library reads an
# XKNN_ variable only through include/xknn/impl/knobs.h's table, every row of the table
# is read somewhere and documented in docs/DESIGN.md, and nothing outside the table
# reads one by name.
. "$(dirname "$0")/tap.sh"
S=$1
TABLE=$S/include/xknn/impl/knobs.h
ids=$(sed -n 's/^ *X(\([A-Z0-9_]*\),.*/\1/p' "$TABLE")
n=$(echo "$ids" | wc -l)
tap_begin knobs $((2 + 2 * n))
cd "$S" || exit 1
lib="include src kernels mpi tools"
# shellcheck disable=SC2086
grep -rnE 'getenv\("XKNN_' $lib >"$T/err" 2>/dev/null
WHY="getenv on an XKNN_ name outside the table"
ok $([ -s "$T/err" ] && echo 1 || echo 0) "no code reads an XKNN_ variable by name"
# shellcheck disable=SC2086
grep -rhoE 'XKNN__KNOB_[A-Z0-9_]+' $lib | sed 's/XKNN__KNOB_//' | sort -u | grep -v '^ID$\|^NAME$\|^COUNT$' >"$T/used"
echo "$ids" | sort >"$T/table"
comm -23 "$T/used" "$T/table" >"$T/err"
WHY="knobs used but not in the table"
ok $([ -s "$T/err" ] && echo 1 || echo 0) "every knob the code names is in the table"
for id in $ids; do
    WHY="XKNN_$id"
    grep -q "^$id\$" "$T/used"
    ok $? "XKNN_$id is read"
    grep -q "| \`XKNN_$id\` |" docs/DESIGN.md
    ok $? "XKNN_$id is in docs/DESIGN.md"
done
tap_end
