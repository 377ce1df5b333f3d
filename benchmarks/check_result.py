#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Checks a knn_mpi result file (.bin ground-truth layout) against an exact float64 brute
force on a sample of query rows: ids in (distance, id) order and distance bits must match.
Reads IDX (.gz) and .fbin inputs. usage: check_result.py RESULT.bin REF QUERY [--sample N] [--self]
(--self: the result is the self-join of REF, QUERY is REF, and a row is never its own neighbour)"""
import argparse
import gzip
import sys

import numpy as np


def read_any(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rb") as f:
        raw = f.read()
    if path.endswith(".fbin"):
        n, d = np.frombuffer(raw[:8], dtype="<u4")
        return np.frombuffer(raw, dtype="<f4", offset=8).reshape(n, d)
    assert raw[0] == 0 and raw[1] == 0 and raw[2] == 0x08, "expected a uint8 IDX file"
    nd = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * nd).reshape(dims[0], -1).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("result")
    ap.add_argument("ref")
    ap.add_argument("query")
    ap.add_argument("--sample", type=int, default=100)
    ap.add_argument("--self", action="store_true", help="self-join: row i is not a neighbour of query i")
    a = ap.parse_args()
    raw = open(a.result, "rb").read()
    nq, k = np.frombuffer(raw[:8], dtype="<u4")
    ids = np.frombuffer(raw, dtype="<i4", count=nq * k, offset=8).reshape(nq, k)
    dist = np.frombuffer(raw, dtype="<f4", count=nq * k, offset=8 + 4 * nq * k).reshape(nq, k)
    ref = read_any(a.ref).astype(np.float64)
    qry = read_any(a.query).astype(np.float64)
    assert qry.shape[0] == nq, f"result has nq={nq}, query file {qry.shape[0]}"
    rows = np.random.default_rng(1).choice(nq, size=min(a.sample, nq), replace=False)
    bad = 0
    for i in rows:
        # the sum of squares of exact float differences in dimension order, rounded once:
        # numpy's pairwise sum differs from sequential fma by far less than float rounding,
        # so values equal the canonical ones except at rare half-way cases (reported)
        dd = ((ref - qry[i]) ** 2).sum(axis=1).astype(np.float32)
        if a.self:
            dd[i] = np.inf  # ordered last: k < n in a self-join
        order = np.lexsort((np.arange(ref.shape[0]), dd))[:k]
        if not (np.array_equal(order, ids[i]) and np.array_equal(dd[order], dist[i])):
            bad += 1
            print(f"row {i}: differs (first ids {ids[i][:5]} vs {order[:5]})")
    print(f"{len(rows)} sampled rows of {nq} x k={k}: {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
