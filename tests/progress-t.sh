#!/bin/sh
# SPDX-License-Identifier: MIT
# progress-t.sh KNN_MPI MKDATA MPIRUN|none -- knn_mpi --progress under mpirun (TAP): stderr
# is a file here, not a terminal, and rank 0 must still print full progress lines at
# least every 2 s on a job of several seconds; -q prints none. POSIX sh.

KNN=$1
MK=$2
MPIRUN=${3:-none}
. "$(dirname "$0")/tap.sh"
tap_knn_begin progress-t 3
lines() { grep -c '^knn_mpi: [0-9]*/[0-9]* queries (.*%), [0-9]* queries/s, ETA .*, [0-9]* s elapsed$' "$T/err"; }

if [ "$MPIRUN" = none ]; then
    skip 3 "MPI not built"
    tap_end
    exit $?
fi
# 90000 queries of d = 64 against 20000 rows: about 12 s on two ranks of a 2-core machine
# (at least 5 s: two lines); -q needs only a run past the first tick (24000: about 3 s)
mk data gaussian 20000 64 5 "$T/ref.fbin"
mk data gaussian 90000 64 6 "$T/q.fbin"
mk data gaussian 24000 64 7 "$T/q24k.fbin"

mknn 2 --progress -k 10 -o "$T/r.bin" "$T/ref.fbin" "$T/q.fbin"
n=$(lines)
WHY="$n progress lines"
[ "$RC" -eq 0 ] && [ "$n" -ge 2 ]
ok $? "mpirun -np 2 --progress, stderr a file: at least two full progress lines ($n)"
el=$(sed -n 's/^knn_mpi: n=.* time=\([0-9]*\)\..*/\1/p' "$T/out")
WHY="$n lines in ${el:-?} s"
[ -n "$el" ] && [ "$n" -ge $(((el - 1) / 2)) ]
ok $? "a line every 2 s: $n lines for a run of ${el:-?} s (at least (s - 1) / 2: reading and writing)"

mknn 2 --progress -q -k 10 -o "$T/r.bin" "$T/ref.fbin" "$T/q24k.fbin"
WHY="$(lines) progress lines under -q"
[ "$RC" -eq 0 ] && [ "$(grep -c '' "$T/err")" -eq 0 ]
ok $? "mpirun -np 2 --progress -q: nothing on stderr"
tap_end
