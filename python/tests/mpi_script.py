# SPDX-License-Identifier: MIT
"""Run under mpirun by test_mpi.py: xknn.mpi against single-process xknn.search."""

import sys

import numpy as np
from mpi4py import MPI

import xknn
import xknn.mpi

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
rng = np.random.default_rng(11)
R = rng.integers(0, 3, size=(301, 6)).astype(np.float32)  # ties and duplicates
Q = rng.integers(0, 3, size=(40, 6)).astype(np.float32)
row0, row1 = rank * len(R) // size, (rank + 1) * len(R) // size
mine = R[row0:row1]


def same(got, want, what):
    ids, dist = got
    assert np.array_equal(ids, want[0]), what
    assert np.array_equal(dist.view(np.uint32), want[1].view(np.uint32)), what


for metric in ("l2", "l1", "cosine"):
    for root in (0, size - 1):
        got = xknn.mpi.search(comm, mine, row0, Q if rank == root else None, 7, root=root, metric=metric)
        if rank == root:
            same(got, xknn.search(R, Q, k=7, metric=metric), f"search {metric} root {root}")
        else:
            assert got is None
    got = xknn.mpi.search(comm, mine, row0, None, 5, metric=metric)
    if rank == 0:
        same(got, xknn.search(R, None, k=5, metric=metric), f"self-join {metric}")

# an index searched twice, on a communicator of the even ranks only
sub = comm.Split(rank % 2, rank)
srank, ssize = sub.Get_rank(), sub.Get_size()
s0, s1 = srank * len(R) // ssize, (srank + 1) * len(R) // ssize
with xknn.mpi.Index(sub, R[s0:s1], s0, metric="euclidean") as index:
    for k in (1, 301):
        got = index.search(Q if srank == 0 else None, k)
        if srank == 0:
            same(got, xknn.search(R, Q, k=k, metric="euclidean"), f"index k={k}")
sub.Free()

# one rank's bad slice: the same error on every rank, nobody left waiting
bad = mine.copy()
if rank == 1:
    bad[2, 3] = np.nan
try:
    xknn.mpi.search(comm, bad, row0, Q if rank == 0 else None, 3)
    raise AssertionError("NaN accepted")
except ValueError as e:
    msgs = comm.allgather(str(e))
    assert len(set(msgs)) == 1 and "NaN" in msgs[0], msgs
# a bad argument found by the Python layer on one rank only
try:
    xknn.mpi.search(comm, mine if rank != 2 else mine.astype(np.complex64), row0, Q if rank == 0 else None, 3)
    raise AssertionError("complex accepted")
except ValueError as e:
    msgs = comm.allgather(str(e))
    assert len(set(msgs)) == 1 and "rank 2" in msgs[0], msgs
try:
    xknn.mpi.search(comm, mine, row0, Q if rank == 0 else None, 0)
    raise AssertionError("k=0 accepted")
except ValueError as e:
    assert "k=0" in str(e)

comm.Barrier()
print(f"xknn.mpi ok on rank {rank} of {size}", flush=True)
sys.exit(0)
