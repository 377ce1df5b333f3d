# tests/tap.sh -- what the knn_mpi shell tests share (TAP; sourced, POSIX sh).
#
#   . "$(dirname "$0")/tap.sh"
#   tap_begin NAME PLAN
#
# tap_begin makes the scratch directory $T (removed on exit), prints the plan and starts
# the counts NUM and FAILED. mk ARGS... runs mkdata ($MK) quietly or bails out. ok STATUS
# DESCRIPTION prints a test line; on failure also $WHY and the last run's stderr
# ($T/err). skip REASON prints a skipped line. A script may define its own ok after
# sourcing this file.

tap_begin() { # tap_begin NAME PLAN
    T=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX") || exit 1
    trap 'rm -rf "$T"' EXIT
    trap 'exit 1' INT TERM
    PLAN=$2
    NUM=0
    FAILED=0
    echo "1..$PLAN"
}
mk() { "$MK" "$@" >/dev/null || { echo "Bail out! mkdata $*"; exit 1; }; }
ok() { # ok STATUS DESCRIPTION
    NUM=$((NUM + 1))
    if [ "$1" -eq 0 ]; then
        echo "ok $NUM - $2"
    else
        echo "not ok $NUM - $2"
        FAILED=$((FAILED + 1))
        echo "# $WHY"
        sed 's/^/#   stderr: /' "$T/err" 2>/dev/null | head -n 10
    fi
}
skip() { NUM=$((NUM + 1)); echo "ok $NUM # SKIP $1"; }
