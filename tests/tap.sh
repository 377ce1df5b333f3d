# SPDX-License-Identifier: MIT
# tests/tap.sh -- what the knn_mpi shell tests share (TAP; sourced, POSIX sh).
#
#   . "$(dirname "$0")/tap.sh"
#   tap_begin NAME PLAN
#
# tap_begin makes the scratch directory $T (removed on exit, made writable first: a test
# may leave unreadable files there), prints the plan and starts the counts NUM and
# FAILED. mk ARGS... runs mkdata ($MK) quietly or bails out. ok STATUS DESCRIPTION [TODO]
# prints a test line; on failure also what $TAP_DIAG prints: tap_why (the default: $WHY
# and the last run's stderr, $T/err) or tap_run_diag (for scripts whose run() sets RC and
# $T/out: $WHY if any, the exit status, stdout and stderr). With TODO (a known bug the
# case shows) a failure is "not ok ... # TODO TODO", which does not fail the script, and
# a pass says the bug is not reproduced any more. skip [COUNT] REASON prints COUNT
# (default 1) skipped lines. diag TEXT prints a comment line. tap_end checks the count
# against the plan and returns the verdict.
#
# The knn_mpi scripts' prologue: tap_knn_begin NAME PLAN is tap_begin with tap_run_diag.
# run CMD... leaves stdout, stderr and the exit status in $T/out, $T/err and RC; knn
# ARGS... runs $KNN so, mknn NP ARGS... runs $KNN on NP ranks of $MPIRUN. has TEXT FILE
# holds when FILE has TEXT; count TEXT FILE prints the lines of FILE holding it. A script
# may define its own run (and the others) after sourcing this file. one_message KEYS DIR
# holds when $T/err has exactly one "knn_mpi: " line, holding each of the '|'-separated
# KEYS, and DIR is empty; else WHY says what is wrong.

tap_begin() { # tap_begin NAME PLAN
    T=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX") || exit 1
    trap 'chmod -R u+rwx "$T" 2>/dev/null; rm -rf "$T"' EXIT
    trap 'exit 1' INT TERM
    PLAN=$2
    NUM=0
    FAILED=0
    TAP_DIAG=tap_why
    echo "1..$PLAN"
}
tap_knn_begin() { # tap_knn_begin NAME PLAN
    tap_begin "$1" "$2"
    TAP_DIAG=tap_run_diag
}
run() { "$@" >"$T/out" 2>"$T/err"; RC=$?; }
knn() { run "$KNN" "$@"; }
mknn() { np=$1; shift; run "$MPIRUN" --allow-run-as-root --oversubscribe -np "$np" "$KNN" "$@"; }
has() { grep -q -F -- "$1" "$2"; }
count() { grep -c -F -- "$1" "$2"; }
one_message() { # one_message KEYS DIR
    n=$(grep -c '^knn_mpi: ' "$T/err")
    [ "$n" -eq 1 ] || { WHY="$n 'knn_mpi: ' lines on stderr, want 1"; return 1; }
    line=$(grep '^knn_mpi: ' "$T/err")
    oldifs=$IFS; IFS='|'
    for key in $1; do
        case "$line" in *"$key"*) ;; *) IFS=$oldifs; WHY="message lacks '$key'"; return 1 ;; esac
    done
    IFS=$oldifs
    left=$(ls -A "$2")
    [ -z "$left" ] || { WHY="left in the output directory: $left"; return 1; }
}
mk() { "$MK" "$@" >/dev/null || { echo "Bail out! mkdata $*"; exit 1; }; }
tap_why() {
    echo "# $WHY"
    sed 's/^/#   stderr: /' "$T/err" 2>/dev/null | head -n 10
}
tap_run_diag() {
    if [ -n "${WHY:-}" ]; then echo "# $WHY"; fi
    echo "# exit status $RC; stdout:"
    sed 's/^/#   /' "$T/out" 2>/dev/null | head -n 15
    echo "# stderr:"
    sed 's/^/#   /' "$T/err" 2>/dev/null | head -n 15
}
diag() { echo "# $*"; }
ok() { # ok STATUS DESCRIPTION [TODO]
    NUM=$((NUM + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $NUM - $2"
        if [ -n "${3:-}" ]; then diag "known bug not reproduced any more: $3"; fi
    elif [ -n "${3:-}" ]; then
        echo "not ok $NUM - $2 # TODO $3"
        "$TAP_DIAG"
    else
        echo "not ok $NUM - $2"
        FAILED=$((FAILED + 1))
        "$TAP_DIAG"
    fi
}
skip() { # skip [COUNT] REASON
    if [ $# -ge 2 ]; then tap_n=$1; shift; else tap_n=1; fi
    while [ "$tap_n" -gt 0 ]; do
        NUM=$((NUM + 1))
        echo "ok $NUM # SKIP $1"
        tap_n=$((tap_n - 1))
    done
}
tap_end() {
    [ "$NUM" -eq "$PLAN" ] || echo "# planned $PLAN tests, ran $NUM"
    [ "$FAILED" -eq 0 ] && [ "$NUM" -eq "$PLAN" ]
}
