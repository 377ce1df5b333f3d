# SPDX-License-Identifier: MIT
"""xknn.search and xknn.Index against the float64 oracle, on tie-heavy data."""

import tracemalloc

import numpy as np
import pytest

import xknn
from oracle import knn

RNG = np.random.default_rng(47)


def grid(n, d, levels=3, scale=1.0):
    """Integer grid points with many duplicates and equal distances."""
    return (RNG.integers(0, levels, size=(n, d)) * scale).astype(np.float32)


def binade(n, d):
    """float32 values in +-[1, 2): every difference and product is exact in double."""
    v = RNG.uniform(1.0, 2.0, size=(n, d)).astype(np.float32)
    return v * RNG.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(n, d))


def check(R, Q, k, metric, **kw):
    ids, dist = xknn.search(R, Q, k=k, metric=metric, **kw)
    oi, od = knn(R, Q, k, metric, p=kw.get("p") or 2.0, weights=kw.get("weights"), self_join=Q is None)
    assert ids.dtype == np.int64 and dist.dtype == np.float32
    assert ids.shape == dist.shape == (R.shape[0] if Q is None else Q.shape[0], k)
    np.testing.assert_array_equal(ids, oi)
    np.testing.assert_array_equal(dist.view(np.uint32), od.view(np.uint32))


DENSE = ["l2", "euclidean", "l1", "chebyshev", "ip", "cosine"]


@pytest.mark.parametrize("metric", DENSE)
@pytest.mark.parametrize("data", ["grid", "binade"])
def test_metrics_exact(metric, data):
    make = grid if data == "grid" else binade
    R, Q = make(300, 7), make(40, 7)
    Q[:5] = R[10:15]  # queries equal to references: zero distances
    for k in (1, 10, 300):
        check(R, Q, k, metric)


@pytest.mark.parametrize("metric", DENSE + ["hellinger"])
def test_self_join(metric):
    R = grid(120, 5) ** (2 if metric == "hellinger" else 1)  # perfect squares: exact sqrt
    R[:10] = R[10:20]  # duplicates at other ids are neighbours
    for k in (1, 7, 119):
        check(R, None, k, metric)


@pytest.mark.parametrize("p", [1, 2])
def test_minkowski_p1_p2(p):
    # differences 0 or 3 only: the plain and the scaled Minkowski forms give the same bits
    R, Q = grid(200, 6, levels=2, scale=3.0), grid(30, 6, levels=2, scale=3.0)
    check(R, Q, 9, "minkowski", p=p)
    check(R, None, 9, "minkowski", p=p)


def test_hellinger():
    R, Q = grid(150, 5, levels=4) ** 2, grid(20, 5, levels=4) ** 2
    check(R, Q, 6, "hellinger")


def test_hamming_whamming_bits():
    R = RNG.integers(0, 256, size=(200, 8), dtype=np.uint8)
    Q = RNG.integers(0, 256, size=(25, 8), dtype=np.uint8)
    R[:4] = Q[:4]
    check(R, Q, 12, "hamming", bits=True)
    check(R, None, 12, "hamming", bits=True)
    w = (RNG.integers(1, 64, size=64) / 16.0).astype(np.float32)
    check(R, Q, 12, "whamming", bits=True, weights=w)


def test_bits_padded_rows():
    # 3 bytes per row: padded once to a whole word, the bits beyond ignored
    R = RNG.integers(0, 256, size=(60, 3), dtype=np.uint8)
    Q = RNG.integers(0, 256, size=(9, 3), dtype=np.uint8)
    check(R, Q, 5, "hamming", bits=True)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float16])
def test_native_dtypes(dtype):
    lo = -3 if dtype == np.int8 else 0
    R = RNG.integers(lo, 4, size=(150, 9)).astype(dtype)
    Q = RNG.integers(lo, 4, size=(20, 9)).astype(dtype)
    for metric in ("l2", "euclidean", "ip", "l1"):
        check(R, Q, 8, metric)


def test_converted_dtypes():
    R = RNG.integers(-50, 50, size=(100, 4))
    ids, dist = xknn.search(R, R[:7], k=3)
    ids32, dist32 = xknn.search(R.astype(np.float32), R[:7].astype(np.float32), k=3)
    np.testing.assert_array_equal(ids, ids32)
    np.testing.assert_array_equal(dist, dist32)
    xknn.search(R.astype(np.float64) / 4, k=2)  # quarters: exact in float32
    xknn.search(np.array([[2 ** 40, 1], [3, 4]], dtype=np.int64), k=1)  # 2^40 is a float32
    with pytest.raises(ValueError, match="row 1 column 0 .*cannot"):
        xknn.search(np.array([[0.5], [0.1]]), k=1)
    with pytest.raises(ValueError, match="row 0 column 1 .*cannot"):
        xknn.search(np.array([[1, 2 ** 24 + 1]], dtype=np.int64), k=1)
    with pytest.raises(ValueError, match="dtype"):
        xknn.search(np.ones((3, 2), dtype=np.complex64), k=1)


def test_errors_carry_library_messages():
    R, Q = grid(20, 4), grid(5, 4)
    with pytest.raises(ValueError, match=r"^k=0: need k >= 1$"):
        xknn.search(R, Q, k=0)
    with pytest.raises(ValueError, match=r"k=21 is larger than the number of references n=20"):
        xknn.search(R, Q, k=21)
    with pytest.raises(ValueError, match=r"k=20 is larger than n-1=19"):
        xknn.search(R, None, k=20)
    bad = Q.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match=r"query row 3 column 2 is NaN"):
        xknn.search(R, bad, k=2)
    bad = R.copy()
    bad[7, 1] = np.inf
    with pytest.raises(ValueError, match=r"reference row 7 column 1"):
        xknn.search(bad, Q, k=2)
    with pytest.raises(ValueError, match=r"dimension mismatch: reference has d=4, query has d=3"):
        xknn.search(R, Q[:, :3], k=2)
    with pytest.raises(ValueError, match=r"2-D"):
        xknn.search(R[0], k=1)
    with pytest.raises(ValueError, match=r"2-D"):
        xknn.search(R[None], k=1)
    with pytest.raises(ValueError, match=r"dtype mismatch"):
        xknn.search(R, Q.astype(np.uint8), k=1)
    with pytest.raises(ValueError, match=r"unknown metric 'nope'"):
        xknn.search(R, Q, k=1, metric="nope")
    with pytest.raises(ValueError, match=r"0 rows"):
        xknn.search(R[:0], Q, k=1)
    with pytest.raises(ValueError, match=r"hellinger"):
        xknn.search(-R - 1, Q, k=1, metric="hellinger")
    if not xknn.backends()["cuda_devices"]:
        with pytest.raises(RuntimeError, match=r"backend cuda"):
            xknn.search(R, Q, k=1, backend="cuda")
    try:
        xknn.search(R, Q, k=0)
    except ValueError as e:
        assert e.status == "invalid argument"


def _peak_during(fn):
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint8, np.int8])
def test_no_copy_of_inputs(dtype):
    R = RNG.integers(0, 3, size=(40000, 64)).astype(dtype)  # 2.5-10 MB
    Q = R[:50]
    assert xknn._core.as_rows(R, "reference") is R
    peak = _peak_during(lambda: xknn.search(R, Q, k=4, threads=1))
    # the results (50 x 4) and Python objects only: far below one copy of either input
    assert peak < R.nbytes // 20, peak
    index = xknn.Index(R)
    assert index.ref is R
    peak = _peak_during(lambda: index.search(Q, 4))
    assert peak < R.nbytes // 20, peak


def test_non_contiguous_input_is_copied_once():
    R = grid(100, 8)
    ids, dist = xknn.search(R[:, ::2], R[:5, ::2], k=3)
    oi, od = knn(R[:, ::2], R[:5, ::2], 3, "l2")
    np.testing.assert_array_equal(ids, oi)


def test_index_search_and_update():
    R = grid(500, 6)
    Q = grid(30, 6)
    index = xknn.Index(R, metric="l1")
    i1, d1 = index.search(Q, 7)
    oi, od = knn(R, Q, 7, "l1")
    np.testing.assert_array_equal(i1, oi)
    np.testing.assert_array_equal(d1, od)
    ig, dg = index.search(None, 5)
    np.testing.assert_array_equal(ig, knn(R, None, 5, "l1", self_join=True)[0])
    new = grid(20, 6, levels=5)
    index.update(100, new)
    assert index.ref is R and np.array_equal(R[100:120], new)
    np.testing.assert_array_equal(index.search(Q, 7)[0], knn(R, Q, 7, "l1")[0])
    bad = new.copy()
    bad[4, 3] = np.nan
    with pytest.raises(ValueError, match=r"rows row 204 column 3 is NaN"):
        index.update(200, bad)
    assert not np.isnan(R).any()  # a refused batch changes nothing
    badq = Q.copy()
    badq[2, 0] = np.inf
    with pytest.raises(ValueError, match=r"query row 2 column 0"):
        index.search(badq, 3)
    with pytest.raises(ValueError, match=r"outside"):
        index.update(495, new)
    with pytest.raises(ValueError, match=r"NaN"):
        xknn.Index(np.full((3, 2), np.nan, dtype=np.float32))


def test_gil_released_during_search():
    import threading
    R, Q = grid(20000, 64), grid(400, 64)
    done = threading.Event()
    counted = [0]

    def run():
        xknn.search(R, Q, k=5, threads=1, metric="l1")
        done.set()

    t = threading.Thread(target=run)
    t.start()
    while not done.is_set():  # runs only while the search has let go of the GIL
        counted[0] += 1
    t.join()
    assert counted[0] > 10000, counted[0]
