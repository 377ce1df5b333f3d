# SPDX-License-Identifier: MIT
"""Distributed exact k-NN over mpi4py communicators (the library's xknn_mpi.h).

Every rank holds a slice of the references (rows [ref_offset, ref_offset + len) of the
whole set; the slices of all ranks partition it, empty slices allowed); the queries live
on the root rank. Results are gathered on root: (ids, dist) there, None elsewhere,
identical to xknn.search over the whole reference set. Every call is collective over
comm and ends the same way on every rank: a bad argument or value on any rank raises the
same exception, with the message of the lowest failing rank, everywhere. The library
works on its own duplicate of comm (never on MPI_COMM_WORLD unless that is comm); the
Index learns the total row count and which search is asked for (queries or the graph)
through small collectives on comm itself.

Needs mpi4py (MPI is initialised by importing mpi4py.MPI) and an xknn built with MPI.
"""

import numpy as np

from . import _core

try:
    from . import _xknn_mpi
except ImportError:  # built without MPI
    _xknn_mpi = None


def _handle_address(comm):
    from mpi4py import MPI
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py communicator, not {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL")
    return MPI._addressof(comm)


def _ext():
    if _xknn_mpi is None:
        raise RuntimeError("this xknn was built without MPI (install an MPI library and rebuild)")
    return _xknn_mpi


class Index:
    """This rank's slice of the references, resident for repeated distributed searches.
    Collective: create it on every rank with the same metric, p and backend; close()
    (collective) frees the library's communicator (a `with` block calls it)."""

    def __init__(self, comm, ref_slice, ref_offset, metric="l2", p=None, backend="auto", threads=None,
                 weights=None, bits=False, device=-1, query_block=0):
        ext = _ext()
        self._ctx = ext.create(_handle_address(comm), int(device), int(query_block))
        self.rank, self.size = ext.rank_size(self._ctx)
        self.comm = comm
        self.metric = str(metric)
        self.p = _core._p_of(metric, p)
        self.backend = str(backend)
        self.threads = _core._threads_of(threads)
        self.weights = _core._weights_of(weights)
        self._bits = 0
        self.ref, self.ref_offset, err = None, int(ref_offset), None
        try:
            if ref_slice is not None and np.shape(ref_slice)[0] > 0:
                self._bits = _core._nbits(ref_slice, bits)
                self.ref = _core.as_rows(ref_slice, "reference", self._bits > 0)
        except (ValueError, TypeError) as e:
            err = f"rank {self.rank}: {e}"
        try:  # every rank raises the lowest failing rank's error
            ext.agree(self._ctx, err)
        except BaseException:
            self.close()
            raise
        # ranks with an empty slice learn the bit count from the others
        self._bits = comm.allreduce(self._bits, op=_max())
        self.n = comm.allreduce(0 if self.ref is None else self.ref.shape[0])

    def search(self, query=None, k=10, root=0):
        """(ids, dist) on root, None elsewhere: the k nearest references of each query
        row (query: on root; ignored elsewhere), or with query=None on every rank the
        all-kNN graph of the whole reference set (ids are global row numbers)."""
        ext = _ext()
        root = int(root)
        if not 0 <= root < self.size:
            raise ValueError(f"root={root}: the communicator has ranks 0 .. {self.size - 1}")
        self_join = self.comm.bcast(query is None if self.rank == root else None, root=root)
        err, q, ids, dist = None, None, None, None
        try:
            kk = _core._k_of(k)
            if self.rank == root:
                if not self_join:
                    q = _core.as_rows(query, "query", self._bits > 0)
                nq = self.n if self_join else q.shape[0]
                ids = np.empty((nq, max(kk, 0)), dtype=np.int64)
                dist = np.empty((nq, max(kk, 0)), dtype=np.float32)
        except (ValueError, TypeError) as e:
            kk = 1
            err = f"rank {self.rank}: {e}"
        ext.search(self._ctx, self.ref, self.ref_offset, q, root, bool(self_join), kk, ids, dist,
                   self.metric, self.p, self.backend, self.threads, self.weights, self._bits, err)
        return (ids, dist) if self.rank == root else None

    def close(self):
        """Collective: frees the library's context and its communicator."""
        if self._ctx is not None:
            _ext().destroy(self._ctx)
            self._ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _max():
    from mpi4py import MPI
    return MPI.MAX


def search(comm, ref_slice, ref_offset, query, k, root=0, metric="l2", p=None, backend="auto",
           threads=None, weights=None, bits=False):
    """Collective: (ids, dist) on root, None elsewhere; query=None on every rank is the
    all-kNN graph. See Index."""
    with Index(comm, ref_slice, ref_offset, metric=metric, p=p, backend=backend, threads=threads,
               weights=weights, bits=bits) as index:
        return index.search(query, k, root)
