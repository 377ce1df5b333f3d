#!/bin/sh
# SPDX-License-Identifier: MIT
# faults-t.sh KNN_MPI MKDATA MPIRUN|none [FAULT_INJECT_SO|none [KNN_PRUNE|none]] -- the
# fault catalogue of knn_mpi (TAP).
#
# Every bad input, bad option and resource fault below runs twice: as one plain process
# and under `mpirun -np 4`. Each run must end, within 60 s, with the documented exit
# code, exactly one "knn_mpi: " line on stderr that names the file or option at fault
# (lines from mpirun itself are ignored), and nothing in the output directory: no result
# file, no temporary. cli-t.sh covers the happy paths and a first set of errors; this
# file widens the errors to every reader, to faults seen by one rank only, and to the
# environment (unwritable output, full disk, file size limit, no GPU, a rank killed
# mid-run). Further groups:
#   - outputs naming an input (./, a/../, symbolic and hard links, the default name) or
#     each other, knn_prune's derived subset naming REF: exit 1, the input unchanged;
#   - one output failing (missing directory, disk full in --predict or --json): none left;
#   - path lengths: 200- and 255-byte names, a 4000-byte path work; a 300-byte name fails;
#   - Minkowski p = 1 .. 1e6 against the oracle; p = 300 distances finite;
#   - an L2 distance beyond float's range: exit 2 naming the query row;
#   - a FIFO or /dev/zero as input: refused, no hang;
#   - SIGINT / SIGTERM mid-search: 128 + signal, no result, no temporary (SIGTERM to
#     mpirun: at most the documented temporary, see there);
#   - no descriptor left (EMFILE) opening REF or creating the temporary: exit 3;
#   - ranks given different arguments (MPMD): every rank ends, exit 1, one message.
#
# A case that exposes a known knn_mpi bug is reported as "not ok ... # TODO <bug>" while
# the bug lasts (TAP: it does not fail the suite) and as a plain "ok" once fixed.
# POSIX sh: runs under dash.

KNN=$1
MK=$2
MPIRUN=${3:-none}
FI=${4:-none}     # tests/fault_inject.c: chosen writes fail with ENOSPC, opens with EMFILE
# with FI preloaded before the ASan runtime (a sanitizer build), its link-order check off
asan="ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
PRUNE=${5:-none}  # knn_prune, for its derived output names
. "$(dirname "$0")/tap.sh"
tap_knn_begin faults-t 210
O=$T/outdir       # the output directory of every case: must stay empty
D=$T/data
mkdir "$O" "$D" || exit 1

# ---- bytes (dash's printf has no \x: octal escapes) -------------------------------------
byte() { printf "\\$(printf %03o "$1")"; }
le32() { byte $(($1 & 255)); byte $((($1 >> 8) & 255)); byte $((($1 >> 16) & 255)); byte $((($1 >> 24) & 255)); }
be32() { byte $((($1 >> 24) & 255)); byte $((($1 >> 16) & 255)); byte $((($1 >> 8) & 255)); byte $(($1 & 255)); }
f32nan() { byte 0; byte 0; byte 192; byte 127; }
f32inf() { byte 0; byte 0; byte 128; byte 127; }
f32ninf() { byte 0; byte 0; byte 128; byte 255; }
f32one() { byte 0; byte 0; byte 128; byte 63; }
patch() { # patch FILE OFFSET < BYTES: overwrite in place
    dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null || { echo "Bail out! patch $1"; exit 1; }
}
chop() { # chop FILE BYTES: drop the last BYTES bytes
    sz=$(wc -c <"$1")
    head -c $((sz - $2)) "$1" >"$1.chop" && mv "$1.chop" "$1"
}
npy_header() { # npy_header DESCR SHAPE [FORTRAN]: a v1 header padded to 64 bytes
    h="{'descr': '$1', 'fortran_order': ${3:-False}, 'shape': ($2), }"
    pad=$(((64 - (10 + ${#h} + 1) % 64) % 64))
    hl=$((${#h} + pad + 1))
    byte 147; printf 'NUMPY'; byte 1; byte 0; byte $((hl & 255)); byte $((hl >> 8))
    printf '%s%*s\n' "$h" "$pad" ""
}
idx_header() { # idx_header TYPE DIM...: big-endian IDX header
    t=$1; shift
    byte 0; byte 0; byte "$t"; byte $#
    for dim in "$@"; do be32 "$dim"; done
}

# ---- data: n = 400 references, d = 8; on 4 ranks rank 2 owns rows 200..299 ---------------
mk data integer 400 8 1 "$D/ref.fbin"
mk data integer 30 8 2 "$D/q.fbin"
mk data integer 400 8 1 "$D/ref.fvecs"
mk data integer 400 8 1 "$D/ref.u8bin" u8
mk data integer 1 8 3 "$D/one.fbin"
cp "$D/ref.fbin" "$D/trunc.fbin"; chop "$D/trunc.fbin" 5
cp "$D/q.fbin" "$D/qtrunc.fbin"; chop "$D/qtrunc.fbin" 1
cp "$D/ref.fvecs" "$D/trunc.fvecs"; chop "$D/trunc.fvecs" 7
{ npy_header '<f4' '400, 8'; tail -c +9 "$D/ref.fbin"; } >"$D/ref.npy"
cp "$D/ref.npy" "$D/trunc.npy"; chop "$D/trunc.npy" 6
{ npy_header '<f4' '900, 8'; tail -c +9 "$D/ref.fbin"; } >"$D/more.npy"
{ npy_header '<f4' '1099511627776, 1099511627776'; tail -c +9 "$D/ref.fbin"; } >"$D/ovf.npy"
{ npy_header '<f4' '400, 8' True; tail -c +9 "$D/ref.fbin"; } >"$D/fortran.npy"
{ npy_header '<c8' '400, 8'; tail -c +9 "$D/ref.fbin"; tail -c +9 "$D/ref.fbin"; } >"$D/c8.npy"
{ npy_header '<f4' '30, 9'; head -c $((30 * 9 * 4)) "$D/ref.fbin"; } >"$D/q9.npy"
{ npy_header '<f4' '30, 8'; tail -c +9 "$D/q.fbin"; } >"$D/qnan.npy"
printf '' | f32nan | patch "$D/qnan.npy" $((128 + (17 * 8 + 3) * 4))
{ idx_header 8 400 8; tail -c +9 "$D/ref.u8bin"; } >"$D/ref-idx2-ubyte"
cp "$D/ref-idx2-ubyte" "$D/trunc-idx2-ubyte"; chop "$D/trunc-idx2-ubyte" 9
{ idx_header 8 500 8; tail -c +9 "$D/ref.u8bin"; } >"$D/more-idx2-ubyte"
{ idx_header 8 400 4294967295 4294967295; tail -c +9 "$D/ref.u8bin"; } >"$D/ovf-idx3-ubyte"
{ byte 1; byte 0; byte 8; byte 2; be32 400; be32 8; tail -c +9 "$D/ref.u8bin"; } >"$D/magic-idx2-ubyte"
{ idx_header 10 400 8; tail -c +9 "$D/ref.u8bin"; } >"$D/type-idx2-ubyte"
HAVE_GZIP=0
if command -v gzip >/dev/null 2>&1; then
    HAVE_GZIP=1
    gzip -c "$D/ref-idx2-ubyte" >"$D/gz-idx2-ubyte.gz"
    chop "$D/gz-idx2-ubyte.gz" 40
    gzip -c "$D/ref.fvecs" >"$D/crc.fvecs.gz"         # deflate data damaged: CRC or stream error
    printf 'XXXXXXXXXXXXXXXX' | patch "$D/crc.fvecs.gz" $(($(wc -c <"$D/crc.fvecs.gz") / 2))
fi
{ le32 1000; le32 8; tail -c +9 "$D/ref.fbin"; } >"$D/more.fbin"
{ le32 4294967295; le32 4294967295; tail -c +9 "$D/ref.fbin"; } >"$D/ovf.fbin"
{ le32 10; le32 0; } >"$D/d0.fbin"
le32 0 >"$D/d0.fvecs"
printf 'abcde' >"$D/hdr.fbin"
: >"$D/empty.fbin"
: >"$D/empty.fvecs"
cp "$D/ref.fvecs" "$D/mixlast.fvecs"; le32 7 | patch "$D/mixlast.fvecs" $((399 * 36))
cp "$D/ref.fvecs" "$D/mixmid.fvecs"; le32 9 | patch "$D/mixmid.fvecs" $((250 * 36))
cp "$D/ref.fbin" "$D/inf2.fbin"; f32inf | patch "$D/inf2.fbin" $((8 + (250 * 8 + 6) * 4))
cp "$D/ref.fbin" "$D/nan0.fbin"; f32nan | patch "$D/nan0.fbin" $((8 + (0 * 8 + 0) * 4))
cp "$D/ref.fvecs" "$D/nan3.fvecs"; f32nan | patch "$D/nan3.fvecs" $((333 * 36 + 4 + 1 * 4))
cp "$D/q.fbin" "$D/qninf.fbin"; f32ninf | patch "$D/qninf.fbin" $((8 + (29 * 8 + 7) * 4))
cp "$D/ref.fbin" "$D/ref.txt"
mkdir "$D/dir.fbin"
cp "$D/ref.fbin" "$D/noperm.fbin"; chmod 000 "$D/noperm.fbin"
mkdir "$T/ro"; chmod 555 "$T/ro"
mkdir "$T/isfile"; : >"$T/isfile/f"

# ---- running one case on 1 and on 4 ranks ----------------------------------------------------
# case_ WANT KEYS DESCRIPTION ARGS...: WANT is the exit code (or "A|B"), KEYS a list of
# "|"-separated fixed strings that the one knn_mpi line must all contain. TODO, when set,
# names the known bug that a failure of this case shows (cleared after each case).
TODO=
ONLY_NP1=
# XENV: "VAR=VALUE ..." (no blanks inside) set for knn_mpi on every rank: in its
# environment on 1 rank, through mpirun -x on more (not for mpirun itself).
XENV=
run_() { # run_ NP ARGS...
    np=$1; shift
    set -f # XENV is split on blanks, never globbed
    if [ "$np" -eq 1 ]; then
        timeout -k 5 60 env $XENV "$KNN" "$@" >"$T/out" 2>"$T/err"
    else
        xs=
        for v in $XENV; do xs="$xs -x $v"; done
        timeout -k 5 60 "$MPIRUN" --allow-run-as-root --oversubscribe $xs -np "$np" "$KNN" "$@" >"$T/out" 2>"$T/err"
    fi
    RC=$?
    set +f
}
verdict() { # verdict WANT KEYS: 0 when the last run matched; WHY says what did not
    WHY=
    if [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ]; then WHY="timed out (60 s)"; return 1; fi
    case "|$1|" in *"|$RC|"*) ;; *) WHY="exit $RC, want $1"; return 1 ;; esac
    one_message "$2" "$O"
}
case_() {
    want=$1 keys=$2 desc=$3
    shift 3
    for np in 1 4; do
        if [ "$np" -ne 1 ] && [ "$MPIRUN" = none ]; then
            skip "MPI not built: $desc (4 ranks)"
            continue
        fi
        if [ "$np" -ne 1 ] && [ -n "$ONLY_NP1" ]; then
            skip "$ONLY_NP1: $desc (4 ranks)"
            continue
        fi
        rm -rf "$O"/* "$O"/.[!.]* 2>/dev/null
        run_ $np "$@"
        verdict "$want" "$keys"
        ok $? "$desc ($np rank$([ $np -gt 1 ] && echo s))" "$TODO"
    done
    rm -rf "$O"/* "$O"/.[!.]* 2>/dev/null
    TODO=
    ONLY_NP1=
}
skip2() { skip "$1 (1 rank)"; skip "$1 (4 ranks)"; }

# ---- truncated files and headers that promise more than the file holds (exit 2) ---------------
case_ 2 "$D/trunc.fbin" "truncated .fbin reference" -o "$O/r.bin" "$D/trunc.fbin" "$D/q.fbin"
case_ 2 "$D/qtrunc.fbin" "truncated .fbin query (1 byte short)" -o "$O/r.bin" "$D/ref.fbin" "$D/qtrunc.fbin"
case_ 2 "$D/trunc.fvecs" "truncated .fvecs (last row cut)" -o "$O/r.bin" "$D/trunc.fvecs" "$D/q.fbin"
case_ 2 "$D/trunc.npy" "truncated .npy" -o "$O/r.bin" "$D/trunc.npy" "$D/q.fbin"
case_ 2 "$D/trunc-idx2-ubyte" "truncated IDX" -o "$O/r.bin" "$D/trunc-idx2-ubyte"
if [ $HAVE_GZIP -eq 1 ]; then
    case_ 2 "$D/gz-idx2-ubyte.gz" "truncated gzip stream (IDX .gz)" -o "$O/r.bin" "$D/gz-idx2-ubyte.gz"
    case_ 2 "$D/crc.fvecs.gz" "damaged gzip stream (.fvecs.gz)" -o "$O/r.bin" "$D/crc.fvecs.gz" "$D/q.fbin"
else
    skip2 "no gzip: truncated gzip stream"
    skip2 "no gzip: damaged gzip stream"
fi
case_ 2 "$D/hdr.fbin" "truncated header (.fbin of 5 bytes)" -o "$O/r.bin" "$D/hdr.fbin" "$D/q.fbin"
case_ 2 "$D/more.fbin|1000" ".fbin header n=1000, data for 400 rows" -o "$O/r.bin" "$D/more.fbin" "$D/q.fbin"
case_ 2 "$D/more.npy" ".npy shape (900, 8), data for 400 rows" -o "$O/r.bin" "$D/more.npy" "$D/q.fbin"
case_ 2 "$D/more-idx2-ubyte" "IDX dimension 500, data for 400 rows" -o "$O/r.bin" "$D/more-idx2-ubyte"

# ---- sizes that overflow, d = 0, bad magic and types (exit 2) ----------------------------------
case_ 2 "$D/ovf.fbin" ".fbin n = d = 2^32-1 (bytes overflow)" -o "$O/r.bin" "$D/ovf.fbin" "$D/q.fbin"
case_ 2 "$D/ovf.npy" ".npy shape 2^40 x 2^40 (n*d overflows 64 bits)" -o "$O/r.bin" "$D/ovf.npy" "$D/q.fbin"
case_ 2 "$D/ovf-idx3-ubyte" "IDX dims 400 x (2^32-1)^2 (d overflows)" -o "$O/r.bin" "$D/ovf-idx3-ubyte"
case_ 2 "$D/d0.fbin|d = 0" ".fbin with d = 0" -o "$O/r.bin" "$D/d0.fbin" "$D/q.fbin"
case_ 2 "$D/d0.fvecs" ".fvecs row with d = 0" -o "$O/r.bin" "$D/d0.fvecs" "$D/q.fbin"
case_ 2 "$D/magic-idx2-ubyte|magic" "wrong IDX magic" -o "$O/r.bin" "$D/magic-idx2-ubyte"
case_ 2 "$D/type-idx2-ubyte" "IDX type byte 0x0A (undefined)" -o "$O/r.bin" "$D/type-idx2-ubyte"
case_ 2 "$D/fortran.npy|ortran" ".npy in Fortran order" -o "$O/r.bin" "$D/fortran.npy" "$D/q.fbin"
case_ 2 "$D/c8.npy" ".npy dtype <c8 (complex: not accepted)" -o "$O/r.bin" "$D/c8.npy" "$D/q.fbin"
case_ 2 "$D/ref.txt|extension" "unknown file extension" -o "$O/r.bin" "$D/ref.txt" "$D/q.fbin"

# ---- mixed d, dimension mismatch, NaN and Inf (exit 2) ---------------------------------------
case_ 2 "$D/mixlast.fvecs|row 399" "mixed d in .fvecs (last row, seen by the probe)" \
    -o "$O/r.bin" "$D/mixlast.fvecs" "$D/q.fbin"
case_ 2 "$D/mixmid.fvecs|row 250" "mixed d in .fvecs (row 250: rank 2's slice)" \
    -o "$O/r.bin" "$D/mixmid.fvecs" "$D/q.fbin"
case_ 2 "dimension mismatch|$D/ref.fvecs|$D/q9.npy" "dimension mismatch .fvecs d=8 vs .npy d=9" \
    -o "$O/r.bin" "$D/ref.fvecs" "$D/q9.npy"
case_ 2 "$D/inf2.fbin|row 250|column 6" "Inf in REF row 250 (one rank's slice only)" \
    -o "$O/r.bin" "$D/inf2.fbin" "$D/q.fbin"
case_ 2 "$D/nan0.fbin|row 0|column 0" "NaN in REF row 0 (rank 0)" -o "$O/r.bin" "$D/nan0.fbin" "$D/q.fbin"
case_ 2 "$D/nan3.fvecs|row 333|column 1" "NaN in .fvecs REF row 333 (rank 3), self-join" \
    -o "$O/r.bin" "$D/nan3.fvecs"
case_ 2 "$D/qninf.fbin|row 29|column 7" "-Inf in the query (last value)" -o "$O/r.bin" "$D/ref.fbin" "$D/qninf.fbin"
case_ 2 "$D/qnan.npy|row 17|column 3" "NaN in a .npy query" -o "$O/r.bin" "$D/ref.fbin" "$D/qnan.npy"

# ---- k (usage 1 for k < 1, input 2 for k too large) ------------------------------------------
case_ 1 "-k" "k = 0" -k 0 -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 1 "-k|-5" "k = -5" -k -5 -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 1 "-k|10x" "k = 10x (not a number)" -k 10x -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 1 "-k|99999999999999999999" "k beyond int64" -k 99999999999999999999 -o "$O/r.bin" "$D/ref.fbin"
case_ 2 "401|too large" "k = n + 1" -k 401 -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 2 "too large" "self-join k = n (> n - 1)" -k 400 -o "$O/r.bin" "$D/ref.fvecs"
case_ 2 "too large" "self-join of one row, k = 1 (n - 1 = 0)" -k 1 -o "$O/r.bin" "$D/one.fbin"

# ---- empty, unreadable, missing files (exit 2) -----------------------------------------------
case_ 2 "$D/empty.fbin|empty" "empty REF .fbin" -o "$O/r.bin" "$D/empty.fbin" "$D/q.fbin"
case_ 2 "$D/empty.fvecs|empty" "empty QUERY .fvecs" -o "$O/r.bin" "$D/ref.fbin" "$D/empty.fvecs"
case_ 2 "$D/dir.fbin" "a directory given as REF" -o "$O/r.bin" "$D/dir.fbin" "$D/q.fbin"
if [ -r "$D/noperm.fbin" ]; then
    skip2 "chmod 000 file is readable (running as root)"
else
    case_ 2 "$D/noperm.fbin" "unreadable REF (mode 000)" -o "$O/r.bin" "$D/noperm.fbin" "$D/q.fbin"
fi
case_ 2 "$D/nosuch.fbin" "missing REF" -o "$O/r.bin" "$D/nosuch.fbin" "$D/q.fbin"
case_ 2 "$D/nosuch.npy" "missing QUERY" -o "$O/r.bin" "$D/ref.fbin" "$D/nosuch.npy"

# ---- outputs that cannot be written ------------------------------------------------------------
case_ 2 "$T/no/such/r.bin" "output in a missing directory" -o "$T/no/such/r.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 2 "$T/isfile/f/r.bin" "output under a regular file" -o "$T/isfile/f/r.bin" "$D/ref.fbin" "$D/q.fbin"
if touch "$T/ro/probe" 2>/dev/null; then
    rm -f "$T/ro/probe"
    skip2 "read-only directory is writable (running as root)"
else
    case_ 2 "$T/ro/r.bin" "output in a read-only directory" -o "$T/ro/r.bin" "$D/ref.fbin" "$D/q.fbin"
fi
case_ 1 "--json" "--json with an empty name" --json= -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"

# Disk full, injected: tests/fault_inject.c, preloaded into every knn_mpi process, makes
# each write to a file of the output directory fail with ENOSPC (all of them, or those
# past the first 4 KiB: the header and the first rows are written, later rows are
# refused on every rank that owns some). Every rank must end with exit 3 (resource) and
# the system's reason; the temporary is removed. The library comes before the ASan
# runtime in a sanitizer build: its link-order check is turned off for these runs.
mk data integer 10000 8 4 "$D/q10k.fbin"
if [ "$FI" != none ] && [ -f "$FI" ]; then
    OP=$(cd "$O" && pwd -P) # the kernel reports resolved paths
    XENV="LD_PRELOAD=$FI XKNN_TEST_ENOSPC_PATH=$OP/* $asan"
    case_ 3 "$O/r.bin|No space left on device" "disk full: every write to the output fails (ENOSPC)" \
        -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
    XENV="LD_PRELOAD=$FI XKNN_TEST_ENOSPC_PATH=$OP/* XKNN_TEST_ENOSPC_AFTER=4096 $asan"
    case_ 3 "$O/r.bin|No space left on device" "disk full after 4 KiB: result rows refused (ENOSPC)" \
        -k 100 --query-block 8 -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
    case_ 3 "$O/r.npz|No space left on device" "disk full after 4 KiB: .npz rows refused (ENOSPC)" \
        -k 100 --query-block 8 -o "$O/r.npz" "$D/ref.fbin" "$D/q.fbin"
    XENV=
else
    skip2 "no write-fault library (not Linux): disk full (ENOSPC)"
    skip2 "no write-fault library (not Linux): disk full after 4 KiB"
    skip2 "no write-fault library (not Linux): .npz, disk full after 4 KiB"
fi

# File too large: RLIMIT_FSIZE with SIGXFSZ ignored makes write() fail (EFBIG) past 4 MiB;
# the result here is 8 + 10000*100*8 = 8 MB. The limit is set in a wrapper around each
# knn_mpi process, not around mpirun (whose PMIx shared-memory store must stay writable:
# under the limit mpirun itself fails and hangs).
printf '#!/bin/sh\ntrap "" XFSZ\nulimit -f 8192\nexec "%s" "$@"\n' "$KNN" >"$T/fsz.sh"
chmod +x "$T/fsz.sh"
KNN_REAL=$KNN
KNN=$T/fsz.sh
# Under mpirun the file-size limit also hits Open MPI's shared-memory setup (ftruncate
# fails, the rank crashes before xknn runs): the limit cannot model it there.
ONLY_NP1="the file-size limit breaks Open MPI's own shared-memory setup"
case_ 3 "$O/r.bin|File too large" "file size limit (write fails with EFBIG past 4 MiB)" \
    -k 100 -o "$O/r.bin" "$D/ref.fbin" "$D/q10k.fbin"
KNN=$KNN_REAL

# /dev/full is a character device that fails every write with ENOSPC. Writing the result
# through a temporary + rename() must not replace the device node by a regular file:
# a copy of the node (root only) is the target, never /dev/full itself.
if mknod "$T/full.bin" c 1 7 2>/dev/null; then
    for np in 1 4; do
        if [ "$np" -ne 1 ] && [ "$MPIRUN" = none ]; then skip "MPI not built"; continue; fi
        [ -c "$T/full.bin" ] || { rm -f "$T/full.bin"; mknod "$T/full.bin" c 1 7; }
        run_ $np -o "$T/full.bin" "$D/ref.fbin" "$D/q.fbin"
        WHY=
        if [ "$RC" -eq 0 ] || [ "$RC" -eq 124 ]; then WHY="exit $RC, want nonzero"
        elif [ ! -c "$T/full.bin" ]; then WHY="the device node was replaced by a regular file"
        elif [ -n "$(ls -A "$T" | grep -F '.full.bin.xknn-tmp.')" ]; then WHY="temporary left: $(ls -A "$T" | grep -F '.full.bin.xknn-tmp.')"
        elif [ "$(grep -c '^knn_mpi: ' "$T/err")" -ne 1 ]; then WHY="not exactly one knn_mpi line"
        fi
        [ -z "$WHY" ]
        ok $? "output to a copy of /dev/full: nonzero exit, the device node kept ($np rank$([ $np -gt 1 ] && echo s))"
        rm -f "$T"/.full.bin.xknn-tmp.*
    done
else
    skip2 "mknod not permitted: output to a character device"
fi

# ---- side files of the wrong length (exit 2) ------------------------------------------------
awk 'BEGIN { for (i = 0; i < 399; i++) print i % 3 }' >"$D/lab399.txt"
{ le32 1; le32 7; i=0; while [ $i -lt 7 ]; do f32one; i=$((i + 1)); done; } >"$D/w7.fbin"
case_ 2 "lab399.txt|399 labels|n=400" "labels file of the wrong length (399 for 400 rows)" \
    --labels "$D/lab399.txt" --predict "$O/p.txt" "$D/ref.fbin" "$D/q.fbin"
case_ 2 "w7.fbin|1 x 7|8" "weights of the wrong length (7 for 8 bits)" \
    -m whamming --binarize 1 --weights "$D/w7.fbin" -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"

# ---- bad options (exit 1) ------------------------------------------------------------------
case_ 1 "jaccard" "unknown metric" -m jaccard -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 1 "--backend|gpu" "--backend gpu" --backend gpu -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 1 "--dtype|f64" "--dtype=f64" --dtype=f64 -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 1 "--query-block|0" "--query-block 0" --query-block 0 -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 1 "--query-block|-3" "--query-block -3" --query-block -3 -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 1 "--query-block|many" "--query-block many" --query-block many -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 1 "--query-block|needs a value" "--query-block without a value" -o "$O/r.bin" "$D/ref.fbin" --query-block
case_ 1 "--quiet|takes no value" "--quiet=yes" --quiet=yes -o "$O/r.bin" "$D/ref.fbin"
case_ 1 "--device-memory|12Q" "--device-memory 12Q (unknown suffix)" --device-memory 12Q -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 1 "--device-memory|'0'" "--device-memory 0" --device-memory 0 -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 1 "--no-such-option" "unknown option" --no-such-option -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"

# ---- resources (exit 3) ----------------------------------------------------------------------
# This machine has no GPU (or the build has no CUDA): a clear "not built" / "no device".
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    skip2 "a GPU is present: --backend cuda would succeed"
else
    case_ 3 "--backend cuda" "--backend cuda without a GPU" --backend cuda -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
fi

# ---- a rank killed mid-run ------------------------------------------------------------------
# 4 ranks on a problem of several seconds; once the output's temporary exists (the search
# has started) one rank (not rank 0) gets SIGKILL.
# Passes when mpirun ends nonzero within 60 s and no result file exists. A temporary left
# by the killed job (nobody is alive to remove it) is allowed, but only under the name
# that knn_mpi --help documents for it: .kill.bin.xknn-tmp.PID.XXXXXX.
if [ "$MPIRUN" = none ]; then
    skip "MPI not built: rank killed mid-run"
else
    mk data gaussian 200000 64 5 "$D/kref.fbin"
    mk data gaussian 20000 64 6 "$D/kq.fbin"
    rm -rf "$O"/*
    "$MPIRUN" --allow-run-as-root --oversubscribe -np 4 "$KNN" -k 50 --query-block 16 -o "$O/kill.bin" \
        "$D/kref.fbin" "$D/kq.fbin" >"$T/out" 2>"$T/err" &
    mp=$!
    # wait for the 4 ranks to exist, then let them start searching
    waited=0
    while [ "$(ps -o pid= --ppid "$mp" 2>/dev/null | wc -l)" -lt 4 ] && [ $waited -lt 100 ]; do
        sleep 0.1; waited=$((waited + 1))
    done
    # the temporary appears once every rank has read its slice and the search starts
    waited=0
    while [ -z "$(ls -A "$O" | grep -F 'xknn-tmp')" ] && kill -0 "$mp" 2>/dev/null && [ $waited -lt 300 ]; do
        sleep 0.1; waited=$((waited + 1))
    done
    sleep 0.5
    ranks=$(ps -o pid= --ppid "$mp" 2>/dev/null | tr -d ' ')
    victim=$(echo "$ranks" | sed -n 3p)
    if [ -n "$victim" ]; then kill -9 "$victim"; fi
    waited=0
    RC=0
    while kill -0 "$mp" 2>/dev/null && [ $waited -lt 600 ]; do sleep 0.1; waited=$((waited + 1)); done
    if kill -0 "$mp" 2>/dev/null; then
        kill -9 $ranks "$mp" 2>/dev/null
        RC=124
    fi
    wait "$mp"
    w=$?
    [ "$RC" = 124 ] || RC=$w
    WHY=
    if [ -z "$victim" ]; then WHY="found no rank process to kill (mpirun children: '$ranks')"
    elif [ "$RC" -eq 124 ]; then WHY="mpirun still running 60 s after a rank was killed"
    elif [ "$RC" -eq 0 ]; then WHY="mpirun exit 0 after a rank was killed"
    elif [ -e "$O/kill.bin" ]; then WHY="result file $O/kill.bin exists"
    elif [ -n "$(ls -A "$O" | grep -v '^\.kill\.bin\.xknn-tmp\.[0-9]*\.......$')" ]; then
        WHY="left in the output directory, not the documented temporary: $(ls -A "$O" | tr '\n' ' ')"
    fi
    [ -z "$WHY" ]
    ok $? "rank killed mid-run (4 ranks): mpirun exits nonzero in time, no result file, only a recognisable temporary"
    diag "killed pid $victim once the search ran; mpirun exit $RC after $((waited / 10)).$((waited % 10)) s"
    diag "left in the output directory: '$(ls -A "$O" | tr '\n' ' ')'"
    diag "what the user sees (stderr, first lines):"
    grep -v '^ *$' "$T/err" | grep -v '^---' | head -n 4 | sed 's/^/#   /'
    rm -rf "$O"/*
fi

# ---- outputs that would overwrite an input, or each other (exit 1) ----------------------------
# Caught before any work: the input keeps its bytes and no temporary is made beside it.
awk 'BEGIN { for (i = 0; i < 400; i++) print i % 3 }' >"$D/lab.txt"
awk 'BEGIN { for (i = 0; i < 30; i++) print i % 3 }' >"$D/ql.txt"
mk weights 8 3 "$D/w8.fbin"
mkdir "$D/sub"
ln -s ref.fbin "$D/ref-link.bin"
ln "$D/q.fbin" "$D/q-hard.bin"
cp "$D/q.fbin" "$D/ref.knn7.bin" # a QUERY at REF's default output name for -k 7
# collide FILE KEYS DESCRIPTION ARGS...: case_ with exit 1, then one more ok: FILE (an
# input named, in some spelling, as an output) has its old bytes, no temporary beside it.
# CL_LINK, when set, is the link the output names: it must still be the same directory
# entry (inode) with the same bytes (a rename over it would spare FILE but not the link).
CL_LINK=
inode() { ls -di "$1" | awk '{ print $1 }'; }
collide() {
    cl_file=$1 cl_desc=$3
    cl_sum=$(cksum <"$cl_file")
    [ -z "$CL_LINK" ] || cl_link="$(inode "$CL_LINK") $(cksum <"$CL_LINK")"
    shift
    case_ 1 "$@"
    WHY=
    cl_tmp=$(ls -A "$(dirname "$cl_file")" | grep -F '.xknn-tmp.')
    if [ "$(cksum <"$cl_file")" != "$cl_sum" ]; then WHY="$cl_file changed"
    elif [ -n "$cl_tmp" ]; then WHY="temporary beside $cl_file: $cl_tmp"
    elif [ -n "$CL_LINK" ] && [ "$(inode "$CL_LINK") $(cksum <"$CL_LINK")" != "$cl_link" ]; then
        WHY="the link $CL_LINK was replaced or changed"
    fi
    [ -z "$WHY" ]
    ok $? "$cl_desc: $(basename "$cl_file")${CL_LINK:+ and the link} unchanged afterwards, no temporary beside it"
    CL_LINK=
}
collide "$D/ref.fbin" "output $D/ref.fbin|input REF" "-o naming REF" \
    -o "$D/ref.fbin" "$D/ref.fbin" "$D/q.fbin"
collide "$D/q.fbin" "output $D/./q.fbin|input QUERY" "-o naming QUERY through ./" \
    -o "$D/./q.fbin" "$D/ref.fbin" "$D/q.fbin"
collide "$D/q.fbin" "output $D/sub/../q.fbin|input QUERY" "-o naming QUERY through sub/../" \
    -o "$D/sub/../q.fbin" "$D/ref.fbin" "$D/q.fbin"
CL_LINK=$D/ref-link.bin
collide "$D/ref.fbin" "output $D/ref-link.bin|input REF" "-o a symbolic link to REF" \
    -o "$D/ref-link.bin" "$D/ref.fbin" "$D/q.fbin"
CL_LINK=$D/q-hard.bin
collide "$D/q.fbin" "output $D/q-hard.bin|input QUERY" "-o a hard link to QUERY" \
    -o "$D/q-hard.bin" "$D/ref.fbin" "$D/q.fbin"
collide "$D/ref.fbin" "--json $D/ref.fbin|input REF" "--json naming REF" \
    --json "$D/ref.fbin" -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
collide "$D/lab.txt" "--predict $D/lab.txt|input --labels" "--predict naming the --labels file" \
    --labels "$D/lab.txt" --predict "$D/lab.txt" -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
collide "$D/ref.knn7.bin" "output $D/ref.knn7.bin|input QUERY" "no -o, QUERY at the default output name" \
    -k 7 "$D/ref.fbin" "$D/ref.knn7.bin"
collide "$D/ql.txt" "--predict $D/ql.txt|input --query-labels" "--predict naming the --query-labels file" \
    --labels "$D/lab.txt" --query-labels "$D/ql.txt" --predict "$D/ql.txt" -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
collide "$D/w8.fbin" "output $D/w8.fbin|input --weights" "-o naming the --weights file" \
    -m whamming --binarize 1 --weights "$D/w8.fbin" -o "$D/w8.fbin" "$D/ref.fbin" "$D/q.fbin"
case_ 1 "--json $O/f.bin|same file" "--json F -o F" --json "$O/f.bin" -o "$O/f.bin" "$D/ref.fbin" "$D/q.fbin"
case_ 1 "--predict $O/p.txt|same file" "--predict P -o P" \
    --labels "$D/lab.txt" --predict "$O/p.txt" -o "$O/p.txt" "$D/ref.fbin" "$D/q.fbin"

# knn_prune derives its subset's name from -o: OUT.txt -> OUT.fbin, here REF itself.
if [ "$PRUNE" = none ]; then
    skip 2 "knn_prune not given: -o whose derived subset is REF"
else
    mkdir "$T/prune"
    cp "$D/ref.fbin" "$T/prune/pref.fbin"
    pr_sum=$(cksum <"$T/prune/pref.fbin")
    timeout -k 5 60 "$PRUNE" --cnn --labels "$D/lab.txt" -o "$T/prune/pref.txt" "$T/prune/pref.fbin" \
        >"$T/out" 2>"$T/err"
    RC=$?
    WHY=
    if [ "$RC" -ne 1 ]; then WHY="exit $RC, want 1"
    elif [ "$(grep -c '^knn_prune: ' "$T/err")" -ne 1 ]; then WHY="not exactly one 'knn_prune: ' line"
    elif ! grep -q "^knn_prune: --subset $T/prune/pref.fbin is the input REF" "$T/err"; then
        WHY="the message does not name --subset and REF"
    elif [ "$(ls -A "$T/prune")" != pref.fbin ]; then WHY="left beside REF: $(ls -A "$T/prune" | tr '\n' ' ')"
    fi
    [ -z "$WHY" ]
    ok $? "knn_prune -o pref.txt, derived subset pref.fbin = REF: exit 1, one message, nothing written"
    WHY=
    [ "$(cksum <"$T/prune/pref.fbin")" = "$pr_sum" ] || WHY="REF changed"
    [ -z "$WHY" ]
    ok $? "knn_prune -o pref.txt, derived subset = REF: REF byte-identical afterwards"
fi

# ---- a failure in any one output leaves none of them --------------------------------------------
# The run's outputs are made as temporaries in order (result, --predict, --json): the last
# one failing must take the others with it.
case_ 2 "$T/no/such/run.json" "--json in a missing directory, -o and --predict in the output dir" \
    --json "$T/no/such/run.json" --labels "$D/lab.txt" --predict "$O/p.txt" -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
if [ "$FI" != none ] && [ -f "$FI" ]; then
    OP=$(cd "$O" && pwd -P)
    XENV="LD_PRELOAD=$FI XKNN_TEST_ENOSPC_PATH=$OP/.p.txt.xknn-tmp.* $asan"
    case_ 3 "$O/p.txt|No space left on device" "disk full while writing --predict (ENOSPC on its temporary)" \
        --labels "$D/lab.txt" --predict "$O/p.txt" -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
    XENV="LD_PRELOAD=$FI XKNN_TEST_ENOSPC_PATH=$OP/.run.json.xknn-tmp.* $asan"
    case_ 3 "$O/run.json|No space left on device" "disk full while writing --json (ENOSPC on its temporary)" \
        --json "$O/run.json" --labels "$D/lab.txt" --predict "$O/p.txt" -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
    XENV=
else
    skip2 "no write-fault library (not Linux): disk full while writing --predict"
    skip2 "no write-fault library (not Linux): disk full while writing --json"
fi

# ---- path lengths ------------------------------------------------------------------------------
# File names of 200 and 255 bytes (NAME_MAX on common file systems) and a path of 4000
# bytes through nested directories: exit 0 on 1 and 4 ranks, the bytes of a short-path
# run, no temporary left. A 300-byte file name is refused before any work (exit 2).
run_ 1 -o "$T/short.bin" "$D/ref.fbin" "$D/q.fbin"
[ "$RC" -eq 0 ] || diag "the short-path run failed (exit $RC): the path-length cases below cannot match it"
long_path() { # long_path DESCRIPTION PATH
    for np in 1 4; do
        if [ "$np" -ne 1 ] && [ "$MPIRUN" = none ]; then skip "MPI not built: $1 (4 ranks)"; continue; fi
        rm -rf "$O"/* "$O"/.[!.]* 2>/dev/null
        mkdir -p "$(dirname "$2")"
        run_ $np -o "$2" "$D/ref.fbin" "$D/q.fbin"
        WHY=
        lp_tmp=$(find "$O" -name '*.xknn-tmp.*')
        if [ "$RC" -ne 0 ]; then WHY="exit $RC, want 0"
        elif ! cmp -s "$2" "$T/short.bin"; then WHY="output differs from the short-path run"
        elif [ -n "$lp_tmp" ]; then WHY="temporary left: $lp_tmp"
        fi
        [ -z "$WHY" ]
        ok $? "$1: exit 0, bytes of the short-path run ($np rank$([ $np -gt 1 ] && echo s))"
    done
    rm -rf "$O"/* "$O"/.[!.]* 2>/dev/null
}
long_path "-o with a 200-byte file name" "$O/$(printf '%0196d' 0).bin"
long_path "-o with a 255-byte file name" "$O/$(printf '%0251d' 0).bin"
lp=$O
while [ $((${#lp} + 101)) -le 3950 ]; do lp=$lp/$(printf '%0100d' 0); done
lp=$lp/$(printf "%0$((4000 - ${#lp} - 1 - 4))d" 0).bin
[ ${#lp} -eq 4000 ] || diag "the long path has ${#lp} bytes, meant 4000"
long_path "-o with a 4000-byte path (nested directories)" "$lp"
case_ 2 "File name too long" "-o with a 300-byte file name" -o "$O/$(printf '%0296d' 0).bin" "$D/ref.fbin" "$D/q.fbin"

# ---- Minkowski in scaled form --------------------------------------------------------------------
# Integer data (values 0..3): |x-y|^p for p = 300 or 1e6 overflows float (and double for
# 1e6) unless scaled. Results byte-identical to the oracle (tests/ref) on 1 and 4 ranks.
for p in 1 2 3.5 300 1e6; do
    mk oracle2 minkowski "$p" 10 "$D/ref.fbin" "$D/q.fbin" "$T/mink$p.bin"
    for np in 1 4; do
        if [ "$np" -ne 1 ] && [ "$MPIRUN" = none ]; then skip "MPI not built: Minkowski p = $p (4 ranks)"; continue; fi
        run_ $np -q -m minkowski -p "$p" -k 10 -o "$T/m.bin" "$D/ref.fbin" "$D/q.fbin"
        WHY=
        if [ "$RC" -ne 0 ]; then WHY="exit $RC, want 0"
        elif ! cmp -s "$T/m.bin" "$T/mink$p.bin"; then WHY="differs from mkdata oracle2 minkowski $p"
        fi
        [ -z "$WHY" ]
        ok $? "Minkowski p = $p on integer data: bytes of the oracle ($np rank$([ $np -gt 1 ] && echo s))"
        [ "$p" = 300 ] && [ "$RC" -eq 0 ] && cp "$T/m.bin" "$T/m300.bin"
    done
done
# p = 300 is Chebyshev within a factor 8^(1/300) < 1.007 (d = 8): every distance is finite
# and lies in [m, 1.007 m] for an integer m = max|x-y| in 0..3.
WHY=
if [ ! -f "$T/m300.bin" ]; then WHY="no p = 300 result"
else
    bad=$(od -An -v -tf4 -j $((8 + 30 * 10 * 4)) "$T/m300.bin" | awk '
        { for (i = 1; i <= NF; i++) {
            n++
            if ($i !~ /^[0-9.]+(e[-+][0-9]+)?$/) { print "value " n ": " $i; next }
            m = int($i + 0.01)
            if (m > 3 || $i < m - 1e-5 || $i > 1.007 * m + 1e-5) print "value " n ": " $i
        } }
        END { if (n != 300) print n " distances, want 300" }')
    [ -z "$bad" ] || WHY="distances not finite or not near max|x-y|: $(echo "$bad" | head -n 3 | tr '\n' ' ')"
fi
[ -z "$WHY" ]
ok $? "Minkowski p = 300: all 300 distances finite, within [m, 1.007 m] of the Chebyshev distance m"

# ---- a distance beyond float's range (exit 2) ----------------------------------------------------
# Column 2 is -3e38 in every reference row and every query row but row 7, where it is
# +3e38: only query 7 is 6e38 from every reference, beyond FLT_MAX.
f32big() { byte 230; byte 177; byte 97; byte "$1"; } # +3e38 (127) or -3e38 (255)
mk data integer 40 8 7 "$D/oref.fbin"
mk data integer 10 8 8 "$D/oq.fbin"
i=0
while [ $i -lt 40 ]; do f32big 255 | patch "$D/oref.fbin" $((8 + (i * 8 + 2) * 4)); i=$((i + 1)); done
i=0
while [ $i -lt 10 ]; do
    f32big $([ $i -eq 7 ] && echo 127 || echo 255) | patch "$D/oq.fbin" $((8 + (i * 8 + 2) * 4))
    i=$((i + 1))
done
case_ 2 "overflows float|query row 7" "L2 distance beyond float (query +3e38, references -3e38)" \
    -k 3 -o "$O/r.bin" "$D/oref.fbin" "$D/oq.fbin"

# ---- inputs that are not regular files (exit 2, no hang) ------------------------------------------
mkfifo "$D/fifo.fbin"         # no writer: reading it would block forever
ln -s /dev/zero "$D/x.fbin"   # endless zeros
case_ 2 "$D/fifo.fbin|not a regular file" "a FIFO without a writer as REF" -o "$O/r.bin" "$D/fifo.fbin" "$D/q.fbin"
case_ 2 "$D/fifo.fbin|not a regular file" "a FIFO without a writer as QUERY" -o "$O/r.bin" "$D/ref.fbin" "$D/fifo.fbin"
case_ 2 "$D/x.fbin|not a regular file" "x.fbin, a symbolic link to /dev/zero, as REF" -o "$O/r.bin" "$D/x.fbin" "$D/q.fbin"

# ---- SIGINT / SIGTERM mid-run ---------------------------------------------------------------------
# Once the result's temporary exists (the search has started) the run gets a signal: it
# must end within 60 s, nonzero (128 + signal for knn_mpi itself), leaving no result and
# no temporary. mpirun (Open MPI 4.1) passes SIGTERM on to its ranks and sends SIGKILL a
# few milliseconds later: a rank 0 not scheduled in between dies before its handler runs
# and its temporary stays (as in "a rank killed mid-run" above). So the ranks' own
# handlers are checked by signalling the ranks; SIGTERM to mpirun allows only that
# documented temporary and says which happened.
[ -f "$D/kref.fbin" ] || mk data gaussian 200000 64 5 "$D/kref.fbin"
[ -f "$D/kq.fbin" ] || mk data gaussian 20000 64 6 "$D/kq.fbin"
signal_case() { # signal_case NP SIGNAL WANT TARGET DESCRIPTION
    # WANT: the exit status, or "nonzero"; TARGET: "self" (knn_mpi, or mpirun on more
    # ranks) or "ranks" (every rank process at once).
    rm -rf "$O"/* "$O"/.[!.]* 2>/dev/null
    set -- "$@" -k 50 --query-block 16 -o "$O/sig.bin" "$D/kref.fbin" "$D/kq.fbin"
    sc_np=$1 sc_sig=$2 sc_want=$3 sc_target=$4 sc_desc=$5
    shift 5
    if [ "$sc_np" -eq 1 ]; then
        "$KNN" "$@" >"$T/out" 2>"$T/err" &
    else
        "$MPIRUN" --allow-run-as-root --oversubscribe -np "$sc_np" "$KNN" "$@" >"$T/out" 2>"$T/err" &
    fi
    sc_pid=$!
    waited=0
    while [ -z "$(ls -A "$O" | grep -F 'xknn-tmp')" ] && kill -0 "$sc_pid" 2>/dev/null && [ $waited -lt 300 ]; do
        sleep 0.1; waited=$((waited + 1))
    done
    sleep 0.5
    sc_ranks=$(ps -o pid= --ppid "$sc_pid" 2>/dev/null | tr -d ' ' | tr '\n' ' ')
    sc_to=$sc_pid
    [ "$sc_target" = ranks ] && sc_to=$sc_ranks
    WHY=
    if ! kill -0 "$sc_pid" 2>/dev/null; then WHY="the run ended before the signal"
    elif [ -z "$sc_to" ]; then WHY="no process to signal (mpirun's children: '$sc_ranks')"
    else kill -"$sc_sig" $sc_to
    fi
    waited=0
    while kill -0 "$sc_pid" 2>/dev/null && [ $waited -lt 600 ]; do sleep 0.1; waited=$((waited + 1)); done
    if kill -0 "$sc_pid" 2>/dev/null; then
        kill -9 $sc_ranks "$sc_pid" 2>/dev/null
        [ -n "$WHY" ] || WHY="still running 60 s after SIG$sc_sig"
    fi
    wait "$sc_pid"
    RC=$?
    # mpirun may return before its ranks are gone (they are then reparented): the output
    # directory is judged once none of them runs any more.
    waited=0
    while [ -n "$sc_ranks" ] && [ -n "$(ps -o stat= -p "$(echo $sc_ranks | tr ' ' ',')" 2>/dev/null | grep -v Z)" ] &&
        [ $waited -lt 100 ]; do
        sleep 0.1; waited=$((waited + 1))
    done
    sc_left=$(ls -A "$O" | tr '\n' ' ')
    sc_doc='^\.sig\.bin\.xknn-tmp\.[0-9]*\.......$'
    if [ -n "$WHY" ]; then :
    elif [ "$sc_want" = nonzero ] && [ "$RC" -eq 0 ]; then WHY="exit 0 after SIG$sc_sig"
    elif [ "$sc_want" != nonzero ] && [ "$RC" -ne "$sc_want" ]; then WHY="exit $RC, want $sc_want"
    elif [ -e "$O/sig.bin" ]; then WHY="result file $O/sig.bin exists"
    elif [ "$sc_np" -gt 1 ] && [ "$sc_target" = self ]; then
        [ -z "$(ls -A "$O" | grep -v "$sc_doc")" ] || WHY="left in the output directory: $sc_left"
    elif [ -n "$sc_left" ]; then WHY="left in the output directory: $sc_left"
    fi
    [ -z "$WHY" ]
    ok $? "$sc_desc"
    if [ "$sc_np" -gt 1 ]; then
        diag "mpirun's exit status: $RC; left in the output directory: '$sc_left'"
    fi
    rm -rf "$O"/* "$O"/.[!.]* 2>/dev/null
}
signal_case 1 INT 130 self "SIGINT to knn_mpi mid-search (1 rank): exit 130, no result, no temporary"
signal_case 1 TERM 143 self "SIGTERM to knn_mpi mid-search (1 rank): exit 143, no result, no temporary"
if [ "$MPIRUN" = none ]; then
    skip 2 "MPI not built: SIGTERM mid-search on 4 ranks"
else
    signal_case 4 TERM nonzero ranks \
        "SIGTERM to the 4 ranks mid-search: mpirun exits nonzero, no result, no temporary"
    signal_case 4 TERM nonzero self \
        "SIGTERM to mpirun mid-search (4 ranks): nonzero, no result, at most the documented temporary"
fi

# ---- no file descriptor left (exit 3) ------------------------------------------------------------
# tests/fault_inject.c with XKNN_TEST_EMFILE_PATH: opening the matching path fails with
# EMFILE, as in a process at its descriptor limit.
if [ "$FI" != none ] && [ -f "$FI" ]; then
    XENV="LD_PRELOAD=$FI XKNN_TEST_EMFILE_PATH=$D/ref.fbin $asan"
    case_ 3 "$D/ref.fbin|Too many open files" "no descriptor left to open REF (EMFILE)" \
        -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
    XENV="LD_PRELOAD=$FI XKNN_TEST_EMFILE_PATH=*/.r.bin.xknn-tmp.* $asan"
    case_ 3 "$O/r.bin|Too many open files" "no descriptor left to create the output's temporary (EMFILE)" \
        -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
    XENV=
else
    skip2 "no fault library (not Linux): EMFILE opening REF"
    skip2 "no fault library (not Linux): EMFILE creating the temporary"
fi

# ---- ranks given different arguments (MPMD): every rank ends, exit 1, one message ------------------
mpmd() { # mpmd KEYS DESCRIPTION ARGS0 -- ARGS1-3
    md_keys=$1 md_desc=$2
    shift 2
    md_a=
    while [ "$1" != -- ]; do md_a="$md_a $1"; shift; done
    shift
    rm -rf "$O"/* "$O"/.[!.]* 2>/dev/null
    set -f # the arguments hold no blanks: split, never globbed
    timeout -k 5 60 "$MPIRUN" --allow-run-as-root --oversubscribe -np 1 "$KNN" $md_a : -np 3 "$KNN" "$@" \
        >"$T/out" 2>"$T/err"
    RC=$?
    set +f
    verdict 1 "$md_keys"
    ok $? "$md_desc"
    rm -rf "$O"/* "$O"/.[!.]* 2>/dev/null
}
if [ "$MPIRUN" = none ]; then
    skip 2 "MPI not built: ranks with different arguments"
else
    mpmd "-k|'0'" "usage error on ranks 1-3 only (-k 0): every rank ends, exit 1, one message" \
        -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin" -- -k 0 -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
    mpmd "--help|some ranks only" "--help on rank 0 only: every rank ends, exit 1, one message" \
        --help -- -o "$O/r.bin" "$D/ref.fbin" "$D/q.fbin"
fi

tap_end
