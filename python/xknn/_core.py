# SPDX-License-Identifier: MIT
"""Host searches, the resident Index, and the file readers and writer."""

import numpy as np

from . import _gpu
from . import _xknn

# dtypes the library searches as they are: such C-contiguous arrays are read in place
_NATIVE = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint8), np.dtype(np.int8))
_F32_EXACT_INT = 1 << 24  # every integer of magnitude <= 2^24 is a float32


def _first_bad(a, c, bad, what):
    i, j = (int(v[0]) for v in np.nonzero(bad))
    return ValueError(
        f"{what} row {i} column {j} holds {a[i, j].item()!r} ({a.dtype}), which float32 cannot "
        f"hold exactly (as float32: {c[i, j].item()!r}); convert the array yourself (e.g. "
        f"x.astype(numpy.float32)) to accept the rounding")


def _to_f32_exact(a, what):
    """float32 copy of a float or integer array whose every value float32 holds exactly."""
    with np.errstate(over="ignore", invalid="ignore"):
        c = a.astype(np.float32)
    if a.dtype.kind == "f":
        bad = (c != a) & ~(np.isnan(a) & np.isnan(c))
    elif a.dtype.kind in "iu":
        big = (a > _F32_EXACT_INT) | (a < -_F32_EXACT_INT)
        bad = np.zeros(a.shape, dtype=bool)
        if big.any():
            cb = c[big].astype(np.float64)
            lim = 2.0 ** (8 * a.dtype.itemsize - (1 if a.dtype.kind == "i" else 0))
            fits = np.abs(cb) < lim
            back = np.zeros(cb.shape, dtype=a.dtype)
            back[fits] = cb[fits].astype(a.dtype)
            bad[big] = ~fits | (back != a[big])
    else:  # bool
        bad = np.zeros(a.shape, dtype=bool)
    if bad.any():
        raise _first_bad(a, c, bad, what)
    return c


def as_rows(x, what, bits=False):
    """x as a C-contiguous 2-D array the library searches: the array itself when it
    already is one of float32, float16, uint8, int8 (bits: uint8 rows whose byte count
    is a multiple of 8), else a converted copy (see search())."""
    a = np.asarray(x)
    if a.ndim != 2:
        raise ValueError(f"{what} must be a 2-D array (n, d); got {a.ndim} dimension(s)")
    if bits:
        if a.dtype != np.uint8:
            raise ValueError(f"{what}: bits=True needs uint8 rows of packed bits, got {a.dtype}")
        pad = (-a.shape[1]) % 8
        if pad or not a.flags.c_contiguous or a.ctypes.data % 8:
            b = np.zeros((a.shape[0], a.shape[1] + pad), dtype=np.uint8)
            b[:, :a.shape[1]] = a
            a = b
        return a
    if a.dtype in _NATIVE and a.dtype.isnative:
        return np.ascontiguousarray(a)
    if a.dtype.kind in "fiub" and a.dtype.itemsize <= 16:
        return _to_f32_exact(a, what)
    raise ValueError(f"{what} has dtype {a.dtype}: xknn searches float32, float16, uint8 and int8 "
                     f"(float and integer arrays are converted when float32 holds them exactly)")


def _nbits(x, bits):
    """Bits per row: 0 for dense rows; bits=True: every bit of the row's bytes."""
    if bits is True or isinstance(bits, np.bool_):
        return 8 * np.shape(x)[-1] if bits else 0
    return int(bits) if bits else 0


def _p_of(metric, p):
    """Minkowski's p (0: the library's default, 2); ignored by the other metrics."""
    return 0.0 if p is None else float(p)


def _weights_of(weights):
    if weights is None:
        return None
    return np.ascontiguousarray(weights, dtype=np.float32).reshape(-1)


def _k_of(k):
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"k={k!r}: need an integer k >= 1")
    return int(k)


def _threads_of(threads):
    return 0 if threads is None else int(threads)


def _search_host(ref, query, k, metric, p, backend, weights, threads, nbits, ref_checked):
    nq = (query if query is not None else ref).shape[0]
    kk = max(k, 0)
    ids = np.empty((nq, kk), dtype=np.int64)
    dist = np.empty((nq, kk), dtype=np.float32)
    _xknn.search(ref, query, ids, dist, k, metric, p, backend, threads, weights, nbits, ref_checked)
    return ids, dist


def search(ref, query=None, k=10, metric="l2", p=None, backend="auto", weights=None, threads=None,
           bits=False):
    """Exact k nearest neighbours of each query row among the rows of ref.

    Returns (ids, dist): ids int64 (nq, k), dist float32 (nq, k), each row ordered by
    (distance, id) ascending (for metric "ip": by inner product descending, then id),
    distances the library's canonical values (computed in double precision in
    dimension order, rounded once to float32). query=None gives the all-kNN graph of
    ref: a row is never its own neighbour (its duplicates at other ids are).

    Arrays: 2-D (n, d) rows. C-contiguous NumPy arrays of float32, float16, uint8 or
    int8 are searched in place, without a copy. Other arrays are copied once:
    non-contiguous or byte-swapped ones of those dtypes as they are; float64 (and other
    float) and integer (and bool) arrays are converted to float32 when float32 holds
    every value exactly (integers up to 2^24 in magnitude always), and refused with a
    ValueError naming the first value it cannot hold otherwise (convert it yourself to
    accept the rounding); other dtypes are refused. ref and query must end up with the
    same dtype. bits=True: uint8 rows of packed bits (bit b of a row is bit b % 8 of byte
    b // 8), for metric "hamming" or "whamming" (weights: one per bit); bits=an int
    gives the number of bits per row when the last byte is not full. Rows whose byte
    count is not a multiple of 8 are copied once into padded rows.

    GPU arrays (PyTorch CUDA tensors, CuPy arrays, or any CUDA array exporting
    __dlpack__ when one of the two is installed) are searched in place on their device
    with the library's device entry point (float32, metric l2 or euclidean, and ip or
    cosine where its tensor-core path applies): see xknn._gpu.

    metric: "l2" (squared Euclidean, the default), "euclidean", "l1", "minkowski" (p >=
    1), "chebyshev", "ip", "cosine", "hellinger", "hamming", "whamming" and the
    library's aliases. backend: "auto" (CUDA when built and a device is present), "cpu"
    or "cuda". threads: CPU threads (None: OpenMP's default). The GIL is released during
    the search.

    Errors: ValueError with the library's message for bad arguments and values (k < 1,
    k > n (n - 1 for the graph), NaN or Inf naming row and column, mismatched d or
    dtype), MemoryError, RuntimeError for device and internal failures.
    """
    if _gpu.is_gpu_array(ref) or (query is not None and _gpu.is_gpu_array(query)):
        return _gpu.search(ref, query, _k_of(k), metric)
    nbits = _nbits(ref, bits)
    r = as_rows(ref, "reference", nbits > 0)
    q = None if query is None else as_rows(query, "query", nbits > 0)
    return _search_host(r, q, _k_of(k), str(metric), _p_of(metric, p), str(backend),
                        _weights_of(weights), _threads_of(threads), nbits, 0)


class Index:
    """The reference rows resident for repeated searches (one process).

    Holds ref itself when search() would read it in place (a reference, no copy), else
    the one converted copy search() would make. Its values are checked once here (NaN,
    Inf, hellinger's sign); searches then skip that scan of the references and check
    each query batch. update() writes rows in place and checks only those rows. Writing
    into the array by other means leaves the index's check stale: use update().
    GPU arrays are held as they are and searched on their device (not checked).
    """

    def __init__(self, ref, metric="l2", p=None, backend="auto", threads=None, weights=None, bits=False):
        self.metric = str(metric)
        self.p = _p_of(metric, p)
        self.backend = str(backend)
        self.threads = _threads_of(threads)
        self.weights = _weights_of(weights)
        self._gpu = _gpu.is_gpu_array(ref)
        if self._gpu:
            self.ref = ref
            self._bits = 0
            return
        self._bits = _nbits(ref, bits)
        self.ref = as_rows(ref, "reference", self._bits > 0)
        _xknn.check(self.ref, "reference", self.metric, self.p, self.weights, self._bits, 0)

    @property
    def shape(self):
        return tuple(self.ref.shape)

    def search(self, query=None, k=10):
        """(ids, dist) of the k nearest references of each query row (None: the
        all-kNN graph of the references), as xknn.search."""
        if self._gpu:
            return _gpu.search(self.ref, query, _k_of(k), self.metric)
        q = None if query is None else as_rows(query, "query", bool(self._bits))
        return _search_host(self.ref, q, _k_of(k), self.metric, self.p, self.backend, self.weights,
                            self.threads, self._bits, 1)

    def update(self, row0, rows):
        """Replaces references [row0, row0 + len(rows)) with rows (checked first: a
        refused batch changes nothing)."""
        if self._gpu:
            raise ValueError("update() takes host indexes; write into the GPU array itself")
        new = as_rows(rows, "rows", bool(self._bits))
        row0 = int(row0)
        n = self.ref.shape[0]
        if new.dtype != self.ref.dtype or new.shape[1] != self.ref.shape[1]:
            raise ValueError(f"rows are {new.dtype} of width {new.shape[1]}, the index holds "
                             f"{self.ref.dtype} of width {self.ref.shape[1]}")
        if row0 < 0 or row0 + new.shape[0] > n:
            raise ValueError(f"rows [{row0}, {row0 + new.shape[0]}) lie outside the index's {n} rows")
        if not self.ref.flags.writeable:
            raise ValueError("the index holds a read-only array: it cannot be updated in place")
        if new.shape[0]:
            _xknn.check(new, "rows", self.metric, self.p, self.weights, self._bits, row0)
        self.ref[row0:row0 + new.shape[0]] = new


def read(path, dtype=None, bin_dtype=None):
    """Reads a whole data file as a 2-D NumPy array (rows, d), with the library's
    readers: .fvecs .ivecs .bvecs, .fbin .u8bin .i8bin .ibin, .bin (bin_dtype: float32
    by default, or float16, uint8, int8, int32), .npy, IDX (MNIST names such as
    train-images-idx3-ubyte), each optionally .gz. dtype None: the file's own type where
    xknn has one (uint8, int8, float16, float32), float32 for the others (int32/int64
    values float32 cannot hold exactly are refused, float64 rounded); dtype float32:
    always float32. NaN/Inf in a file is a ValueError naming the row and column."""
    as_f32 = False
    if dtype is not None:
        if np.dtype(dtype) != np.float32:
            raise ValueError(f"dtype={dtype!r}: read gives the file's own type (None) or float32")
        as_f32 = True
    names = {"f32": np.float32, "f16": np.float16, "u8": np.uint8, "i8": np.int8}

    def alloc(rows, cols, name):
        return np.empty((rows, cols), dtype=names[name])

    return _xknn.read(str(path), None if bin_dtype is None else str(np.dtype(bin_dtype)), as_f32, alloc)


def write_result(path, ids, dist=None, fmt="auto"):
    """Writes a search result with the library's writer: ".ivecs" (ids only), else the
    big-ann layout (uint32 nq, uint32 k, int32 ids, float32 dist); fmt "bin64" (int64
    ids) must be asked for. The file appears complete or not at all."""
    i = np.ascontiguousarray(ids, dtype=np.int64)
    if i.ndim != 2:
        raise ValueError(f"ids must be 2-D (nq, k); got {i.ndim} dimension(s)")
    d = None
    if dist is not None:
        d = np.ascontiguousarray(dist, dtype=np.float32)
        if d.shape != i.shape:
            raise ValueError(f"dist has shape {d.shape}, ids {i.shape}")
    _xknn.write_result(str(path), i, d, i.shape[0], i.shape[1], str(fmt))


def backends():
    """{'cuda_built': bool, 'cuda_devices': int}: what this build and machine offer."""
    built, devices = _xknn.info()
    return {"cuda_built": bool(built), "cuda_devices": int(devices)}
