# SPDX-License-Identifier: MIT
"""The scikit-learn estimators: scikit-learn's own estimator checks, and predictions
equal to its brute-force estimators on iris and Fashion-MNIST."""

import gzip
import os

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")
from sklearn import neighbors as sk  # noqa: E402
from sklearn.datasets import load_iris  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

import xknn  # noqa: E402
from xknn.neighbors import KNeighborsClassifier, KNeighborsRegressor, NearestNeighbors  # noqa: E402

FMNIST = "/usr/share/datasets/fashion-mnist"


@parametrize_with_checks([NearestNeighbors(), KNeighborsClassifier(), KNeighborsRegressor(),
                          KNeighborsClassifier(weights="distance", metric="manhattan")])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def exact_dist(A, B, metric, p):
    """float64 distances, exact on the integer data used with them."""
    diff = np.abs(A[:, None, :].astype(np.float64) - B[None].astype(np.float64))
    if metric == "chebyshev":
        return diff.max(-1)
    if metric == "manhattan" or (metric == "minkowski" and p == 1):
        return diff.sum(-1)
    return np.sqrt((diff * diff).sum(-1))


def boundary_tie(D, k):
    """Queries whose k-th and (k+1)-th nearest distances are equal: scikit-learn's brute
    force picks among such rows by its heap's order, xknn by the lower index."""
    s = np.sort(D, axis=1)
    return s[:, k - 1] == s[:, k] if k < D.shape[1] else np.zeros(D.shape[0], dtype=bool)


def compare(Xtr, ytr, Xte, k, weights, metric, p):
    ours = KNeighborsClassifier(k, weights=weights, metric=metric, p=p).fit(Xtr, ytr)
    ref = sk.KNeighborsClassifier(k, weights=weights, metric=metric, p=p, algorithm="brute").fit(Xtr, ytr)
    D = exact_dist(Xte, Xtr, metric, p)
    clean = ~boundary_tie(D, k)
    assert clean.mean() > 0.1  # chebyshev on tenths ties often
    np.testing.assert_array_equal(ours.predict(Xte)[clean], ref.predict(Xte)[clean])
    np.testing.assert_allclose(ours.predict_proba(Xte)[clean], ref.predict_proba(Xte)[clean], rtol=0, atol=1e-12)
    d1, i1 = ours.kneighbors(Xte)
    d2, i2 = ref.kneighbors(Xte)
    np.testing.assert_allclose(d1, d2, rtol=1e-12, atol=0)  # the same distances in every row
    want = np.lexsort((np.broadcast_to(np.arange(len(Xtr)), D.shape), D), axis=1)[:, :k]
    np.testing.assert_array_equal(i1, want)  # (distance, index) order, ties included
    r1 = KNeighborsRegressor(k, weights=weights, metric=metric, p=p).fit(Xtr, Xtr[:, 0] * 1.5).predict(Xte)
    r2 = sk.KNeighborsRegressor(k, weights=weights, metric=metric, p=p, algorithm="brute").fit(
        Xtr, Xtr[:, 0] * 1.5).predict(Xte)
    np.testing.assert_allclose(r1[clean], r2[clean], rtol=1e-12)


@pytest.mark.parametrize("metric,p", [("minkowski", 2), ("minkowski", 1), ("manhattan", 2), ("chebyshev", 2),
                                      ("euclidean", 2)])
@pytest.mark.parametrize("weights", ["uniform", "distance"])
@pytest.mark.parametrize("k", [1, 5, 10])
def test_iris_as_scikit_learn(metric, p, weights, k):
    X, y = load_iris(return_X_y=True)
    X = np.rint(X * 10)  # the same data in tenths: every distance exact in float64
    compare(X[::2], y[::2], X[1::2], k, weights, metric, p)


def test_iris_float_data():
    # float64 decimals: xknn's candidates come from the float32 rounding and the
    # certificate brings in every row the rounding could have moved
    X, y = load_iris(return_X_y=True)
    for metric, p in (("manhattan", 1), ("chebyshev", 2), ("minkowski", 3)):
        ours = KNeighborsClassifier(7, weights="distance", metric=metric, p=p).fit(X[::2], y[::2])
        ref = sk.KNeighborsClassifier(7, weights="distance", metric=metric, p=p, algorithm="brute").fit(
            X[::2], y[::2])
        d1, _ = ours.kneighbors(X[1::2])
        d2, _ = ref.kneighbors(X[1::2])
        # the same float64 sums; pow (p = 3) may differ from scikit-learn's by an ulp
        np.testing.assert_allclose(d1, d2, rtol=0 if p < 3 else 1e-15, atol=0)


def test_kneighbors_of_training_set_and_graph():
    X = np.array([[0.0], [0.0], [0.0], [1.0], [3.0]])
    nn = NearestNeighbors(n_neighbors=2).fit(X)
    ref = sk.NearestNeighbors(n_neighbors=2, algorithm="brute").fit(X)
    d1, i1 = nn.kneighbors()
    d2, i2 = ref.kneighbors()
    np.testing.assert_array_equal(d1, d2)
    # each row without itself, its duplicates first; ties by the lower index
    np.testing.assert_array_equal(i1, [[1, 2], [0, 2], [0, 1], [0, 1], [3, 0]])
    g = nn.kneighbors_graph(X, mode="distance").toarray()
    np.testing.assert_array_equal(g, ref.kneighbors_graph(X, mode="distance").toarray())
    with pytest.raises(ValueError, match="n_neighbors <= n_samples_fit"):
        nn.kneighbors(X, 6)


def test_zero_distance_weights():
    X = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [5.0, 5.0], [0.0, 2.0]])
    y = np.array([0, 1, 1, 0, 0])
    q = np.array([[0.0, 0.0], [4.0, 4.0]])
    ours = KNeighborsClassifier(3, weights="distance").fit(X, y)
    ref = sk.KNeighborsClassifier(3, weights="distance", algorithm="brute").fit(X, y)
    np.testing.assert_array_equal(ours.predict_proba(q), ref.predict_proba(q))
    np.testing.assert_array_equal(ours.predict(q), ref.predict(q))


def read_fmnist(n_train, n_test):
    def images(name, n):
        return xknn.read(os.path.join(FMNIST, name))[:n]

    def labels(name, n):
        with gzip.open(os.path.join(FMNIST, name)) as f:
            return np.frombuffer(f.read(), dtype=np.uint8, offset=8)[:n]

    return (images("train-images-idx3-ubyte.gz", n_train), labels("train-labels-idx1-ubyte.gz", n_train),
            images("t10k-images-idx3-ubyte.gz", n_test), labels("t10k-labels-idx1-ubyte.gz", n_test))


def fmnist_as_scikit_learn(n_train, n_test, weights):
    if not os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")):
        pytest.skip("dataset-fashion-mnist is not installed")
    Xtr, ytr, Xte, yte = read_fmnist(n_train, n_test)
    ours = KNeighborsClassifier(5, weights=weights).fit(Xtr, ytr).predict(Xte)
    ref = sk.KNeighborsClassifier(5, weights=weights, algorithm="brute").fit(Xtr, ytr).predict(Xte)
    np.testing.assert_array_equal(ours, ref)
    assert (ours == yte).mean() > 0.7


@pytest.mark.parametrize("weights", ["uniform", "distance"])
def test_fashion_mnist_subset_as_scikit_learn(weights):
    fmnist_as_scikit_learn(6000, 500, weights)


@pytest.mark.skipif(not os.environ.get("XKNN_FULL_FMNIST"), reason="set XKNN_FULL_FMNIST=1 (minutes on 2 cores)")
@pytest.mark.parametrize("weights", ["uniform", "distance"])
def test_fashion_mnist_full_as_scikit_learn(weights):
    fmnist_as_scikit_learn(60000, 10000, weights)
