#!/bin/sh
# SPDX-License-Identifier: MIT
# npz-t.sh KNN_MPI MKDATA MPIRUN|none -- knn_mpi's NumPy outputs (TAP). On 1 and 3 ranks
# '-o X.npz' must be, byte for byte, the archive built here from the --ids64 .bin output
# of the same search (.npy headers, ZIP records, CRC-32 from gzip's trailer), '-o X.npy'
# the ids' .npy; numpy, where it imports, loads both to the same ids and distances.
# Unknown result extensions are usage errors. POSIX sh.

KNN=$1
MK=$2
MPIRUN=${3:-none}
. "$(dirname "$0")/tap.sh"
tap_knn_begin npz-t 14
knn_np() { # knn_np NP ARGS...
    np=$1; shift
    if [ "$np" -eq 1 ]; then run "$KNN" -q "$@"
    else run "$MPIRUN" --allow-run-as-root --oversubscribe -np "$np" "$KNN" -q "$@"; fi
}

# ---- bytes (dash's printf has no \x: octal escapes) -------------------------------------
byte() { printf "\\$(printf %03o "$1")"; }
le16() { byte $(($1 & 255)); byte $((($1 >> 8) & 255)); }
le32() { le16 $(($1 & 65535)); le16 $((($1 >> 16) & 65535)); }
u32at() { # u32at FILE OFFSET: the little-endian uint32 there
    od -An -tu4 -j "$2" -N 4 "$1" | tr -d ' '
}
npy_header() { # npy_header DESCR SHAPE: a v1 header padded to 64 bytes
    h="{'descr': '$1', 'fortran_order': False, 'shape': ($2), }"
    pad=$(((64 - (10 + ${#h} + 1) % 64) % 64))
    hl=$((${#h} + pad + 1))
    byte 147; printf 'NUMPY'; byte 1; byte 0; le16 "$hl"
    printf '%s%*s\n' "$h" "$pad" ""
}
crc32() { gzip -c <"$1" | tail -c 8 | head -c 4; } # raw little-endian CRC-32 of FILE
zip_local() { # zip_local NAME FILE: local header (stored, 1980-01-01) + FILE
    sz=$(wc -c <"$2")
    le32 $((0x04034b50)); le16 20; le16 0; le16 0; le16 0; le16 33; crc32 "$2"
    le32 "$sz"; le32 "$sz"; le16 ${#1}; le16 0; printf '%s' "$1"; cat "$2"
}
zip_central() { # zip_central NAME FILE OFFSET
    sz=$(wc -c <"$2")
    le32 $((0x02014b50)); le16 20; le16 20; le16 0; le16 0; le16 0; le16 33; crc32 "$2"
    le32 "$sz"; le32 "$sz"; le16 ${#1}; le16 0; le16 0; le16 0; le16 0; le32 0; le32 "$3"; printf '%s' "$1"
}
# expect BIN64 NPZ NPY: the archive and the ids' .npy an --ids64 .bin result stands for
expect() {
    nq=$(u32at "$1" 0); k=$(u32at "$1" 4)
    { npy_header '<i8' "$nq, $k"; tail -c +9 "$1" | head -c $((8 * nq * k)); } >"$3"
    { npy_header '<f4' "$nq, $k"; tail -c +$((9 + 8 * nq * k)) "$1"; } >"$T/dist.npy"
    zip_local ids.npy "$3" >"$T/m1"
    zip_local dist.npy "$T/dist.npy" >"$T/m2"
    o2=$(wc -c <"$T/m1")
    cdo=$((o2 + $(wc -c <"$T/m2")))
    { zip_central ids.npy "$3" 0; zip_central dist.npy "$T/dist.npy" "$o2"; } >"$T/cd"
    { cat "$T/m1" "$T/m2" "$T/cd"
      le32 $((0x06054b50)); le16 0; le16 0; le16 2; le16 2; le32 "$(wc -c <"$T/cd")"; le32 "$cdo"; le16 0
    } >"$2"
}
HAVE_NUMPY=0
python3 -c 'import numpy' >/dev/null 2>&1 && HAVE_NUMPY=1
np_check() { # np_check BIN64 NPZ NPY: numpy loads them to the .bin's ids and distance bits
    python3 - "$@" <<'PY'
import sys, numpy as np
b = open(sys.argv[1], 'rb').read()
nq, k = np.frombuffer(b[:8], '<u4')
ids = np.frombuffer(b[8:8 + 8 * nq * k], '<i8').reshape(nq, k)
dist = np.frombuffer(b[8 + 8 * nq * k:], '<f4').reshape(nq, k)
z = np.load(sys.argv[2])
assert z['ids'].dtype == np.int64 and z['dist'].dtype == np.float32, (z['ids'].dtype, z['dist'].dtype)
assert (z['ids'] == ids).all() and (z['dist'].view('<u4') == dist.view('<u4')).all()
assert (np.diff(z['dist'], axis=1) >= 0).all(), 'rows not sorted'
a = np.load(sys.argv[3])
assert a.dtype == np.int64 and a.shape == (nq, k) and (a == ids).all()
PY
}

# nq = 77 and k = 7, n = 1001: multiples of nothing the writer uses
mk data gaussian 1001 13 5 "$T/ref.fbin"
mk data gaussian 77 13 6 "$T/q.fbin"
command -v gzip >/dev/null 2>&1 && command -v od >/dev/null 2>&1 && HAVE_TOOLS=1 || HAVE_TOOLS=0

for np in 1 3; do
    if [ "$np" -ne 1 ] && [ "$MPIRUN" = none ]; then skip 6 "MPI not built"; continue; fi
    for job in query self; do
        if [ $job = query ]; then set -- -k 7 "$T/ref.fbin" "$T/q.fbin"; else set -- -k 5 "$T/ref.fbin"; fi
        rm -f "$T"/r.*
        knn_np $np --ids64 -o "$T/r.bin" "$@" && knn_np $np -o "$T/r.npz" "$@" && knn_np $np -o "$T/r.npy" "$@"
        if [ $HAVE_TOOLS -eq 0 ]; then skip 2 "gzip or od missing"
        else
            [ "$RC" -eq 0 ] && expect "$T/r.bin" "$T/want.npz" "$T/want.npy"
            WHY="exit $RC or .npz differs from the archive of the .bin"
            [ "$RC" -eq 0 ] && cmp "$T/want.npz" "$T/r.npz" >"$T/out"
            ok $? "$job, $np rank(s): .npz byte-identical to the archive of the .bin's ids and distances"
            WHY="exit $RC or .npy differs from the .bin's ids"
            [ "$RC" -eq 0 ] && cmp "$T/want.npy" "$T/r.npy" >"$T/out"
            ok $? "$job, $np rank(s): .npy byte-identical to the .bin's ids as int64 (nq, k)"
            WHY=
        fi
        if [ $HAVE_NUMPY -eq 0 ]; then skip "numpy not importable: np.load"
        else
            np_check "$T/r.bin" "$T/r.npz" "$T/r.npy" 2>"$T/err"
            ok $? "$job, $np rank(s): np.load gives int64 ids and float32 dist of the .bin, rows sorted"
        fi
    done
done

# ---- unknown extensions: usage errors before any work -------------------------------------
for ext in txt fbin; do
    run "$KNN" -q -k 3 -o "$T/u.$ext" "$T/ref.fbin" "$T/q.fbin"
    [ "$RC" -eq 1 ] && grep -q -F "unknown result extension" "$T/err" && [ -z "$(ls -A "$T" | grep -F "u.$ext")" ]
    ok $? "-o u.$ext: exit 1, 'unknown result extension', nothing written"
done
tap_end
