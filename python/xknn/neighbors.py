# SPDX-License-Identifier: MIT
"""scikit-learn estimators over xknn.search: NearestNeighbors, KNeighborsClassifier,
KNeighborsRegressor (importing this module imports scikit-learn).

They take scikit-learn's constructor arguments where they apply and predict as its
brute-force estimators do:
- neighbours are the exact k nearest in float64 distance, ties broken by the lower
  training index: xknn proposes candidates on float32 rows (the data itself when float32
  holds it exactly, else its rounding), each candidate's distance is recomputed in
  float64 from the data as given, and a query is searched again with more candidates
  until a bound proves no other training row can enter (the float32 distance of the last
  candidate, less the rounding of the rows, exceeds the k-th float64 distance).
  Metrics with such a bound: minkowski (any p >= 1), euclidean (= "l2" here, as in
  scikit-learn), sqeuclidean, manhattan/cityblock/l1, chebyshev. cosine, and xknn's own
  "ip" and "hellinger", take xknn's order on the float32 rows and report float64
  distances recomputed from the data. Where several rows tie at the k-th distance,
  scikit-learn's brute force keeps the ones its heap happens to keep, so the two can
  differ there (and only there);
- weights "uniform" or "distance" (callables are refused); "distance" is 1/d, and a
  query at distance 0 of some training rows gives those rows weight 1 and the others 0;
  class ties go to the first class in classes_;
- kneighbors(None) searches the training rows for k + 1 neighbours and drops each row
  itself (the first column when the row is not among them, as duplicates can push it
  out), as scikit-learn does.
algorithm and leaf_size are accepted and ignored (the search is always exhaustive);
n_jobs gives the CPU threads (None or -1: all of OpenMP's). backend selects xknn's
backend ("auto", "cpu", "cuda").
"""

import numbers
import os

import numpy as np
from scipy import sparse
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.extmath import weighted_mode
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from . import _core

try:
    from sklearn.utils.validation import validate_data as _validate_data
except ImportError:  # scikit-learn < 1.6
    def _validate_data(est, *args, **kw):
        return est._validate_data(*args, **kw)

# p-norm metrics: (xknn metric, p) by scikit-learn name
_NORMS = {"euclidean": ("euclidean", 2.0), "l2": ("euclidean", 2.0), "sqeuclidean": ("euclidean", 2.0),
          "manhattan": ("l1", 1.0), "cityblock": ("l1", 1.0), "l1": ("l1", 1.0),
          "chebyshev": ("chebyshev", np.inf), "infinity": ("chebyshev", np.inf)}
_OTHER = {"cosine": "cosine", "ip": "ip", "inner_product": "ip", "dot": "ip", "hellinger": "hellinger"}
_SLACK = 2.0 ** -20  # covers float32 rounding of the bound (2^-24) and float64 sums


def _metric_of(metric, p, metric_params):
    """(xknn metric, p of the float64 norm or None, squared) for the estimator's args."""
    if not isinstance(metric, str):
        raise ValueError(f"metric={metric!r}: xknn estimators take a metric name")
    params = dict(metric_params or {})
    p = params.pop("p", p)
    if params:
        raise ValueError(f"metric_params {sorted(params)} are not supported")
    if metric == "minkowski":
        if p is None:
            p = 2
        if not isinstance(p, numbers.Real) or not p >= 1:
            raise ValueError(f"p={p!r}: xknn needs p >= 1")
        if p == 2:
            return "euclidean", 2.0, False
        if p == 1:
            return "l1", 1.0, False
        if np.isinf(p):
            return "chebyshev", np.inf, False
        return "minkowski", float(p), False
    if metric in _NORMS:
        xm, norm_p = _NORMS[metric]
        return xm, norm_p, metric == "sqeuclidean"
    if metric in _OTHER:
        return _OTHER[metric], None, False
    raise ValueError(f"metric={metric!r}: xknn estimators take minkowski, euclidean, l2, sqeuclidean, "
                     f"manhattan, cityblock, l1, chebyshev, infinity, cosine, ip, hellinger")


def _pnorm(v, p):
    """The p-norm of each row of v (float64), p in [1, inf]."""
    a = np.abs(v)
    if p == 1:
        return a.sum(axis=-1)
    if p == 2:
        return np.sqrt((a * a).sum(axis=-1))
    if np.isinf(p):
        return a.max(axis=-1, initial=0.0)
    return (a ** p).sum(axis=-1) ** (1.0 / p)


def _pair_dist(Q, R, qi, ids, metric, p):
    """float64 distances between rows qi of Q and rows ids (per row) of R."""
    X = Q[qi][:, None, :].astype(np.float64)
    Y = R[ids].astype(np.float64)
    if p is not None:
        return _pnorm(X - Y, p)
    if metric == "cosine":
        den = np.sqrt((X * X).sum(-1)) * np.sqrt((Y * Y).sum(-1))
        with np.errstate(invalid="ignore", divide="ignore"):
            c = np.where(den > 0, (X * Y).sum(-1) / np.where(den > 0, den, 1.0), 0.0)
        return np.clip(1.0 - c, 0.0, 2.0)
    if metric == "ip":
        return (X * Y).sum(-1)
    s = np.sqrt(X) - np.sqrt(Y)  # hellinger
    return np.sqrt((s * s).sum(-1) * 0.5)


def _threads(n_jobs):
    if n_jobs is None or n_jobs == -1:
        return None
    if n_jobs < 0:
        return max(1, (os.cpu_count() or 1) + 1 + n_jobs)
    return int(n_jobs)


class _Base(BaseEstimator):
    """What the three estimators share: the fitted rows and the exact kneighbors."""

    def _store_params(self, args):
        """Stores a constructor's arguments (its locals(), self aside) as attributes of the
        same names, unchanged, as scikit-learn's get_params and clone expect."""
        for name, value in args.items():
            if name != "self":
                setattr(self, name, value)

    def _fit_rows(self, X):
        xm, norm_p, squared = _metric_of(self.metric, self.p, self.metric_params)
        if not (isinstance(self.n_neighbors, numbers.Integral) and self.n_neighbors >= 1):
            raise ValueError(f"n_neighbors={self.n_neighbors!r}: need an integer >= 1")
        if xm == "hellinger" and (X < 0).any():
            raise ValueError("hellinger needs non-negative values")
        self._fit_X = X
        self._X32 = X.astype(np.float32) if X.dtype != np.float32 else X
        self._err = _pnorm(X - self._X32, norm_p if norm_p is not None else 2.0)
        self._xm, self._norm_p, self._squared = xm, norm_p, squared
        self.n_samples_fit_ = X.shape[0]
        self.effective_metric_ = self.metric
        self.effective_metric_params_ = dict(self.metric_params or {})
        return self

    def _search(self, Q, Q32, qerr, k):
        """(dist float64, ids) of the exact k nearest training rows of each row of Q."""
        n = self.n_samples_fit_
        R, R32 = self._fit_X, self._X32
        nq = Q.shape[0]
        out_i = np.empty((nq, k), dtype=np.int64)
        out_d = np.empty((nq, k), dtype=np.float64)
        rmax = float(self._err.max(initial=0.0))
        todo = np.arange(nq)
        kk = min(n, k + 8)
        while todo.size:
            ids, d32 = _core.search(R32, Q32[todo], k=kk, metric=self._xm,
                                    p=self._norm_p if self._xm == "minkowski" else None,
                                    backend=self.backend, threads=_threads(self.n_jobs))
            d64 = np.empty(ids.shape, dtype=np.float64)
            for s in range(0, todo.size, 256):
                d64[s:s + 256] = _pair_dist(Q, R, todo[s:s + 256], ids[s:s + 256], self._xm, self._norm_p)
            if self._xm == "ip":
                order = np.lexsort((ids, -d64))
            else:
                order = np.lexsort((ids, d64))
            ids = np.take_along_axis(ids, order, axis=1)[:, :k]
            d64 = np.take_along_axis(d64, order, axis=1)[:, :k]
            if self._norm_p is None or kk == n:
                done = np.ones(todo.size, dtype=bool)
            else:
                last = d32[:, -1].astype(np.float64) * (1 - _SLACK) - qerr[todo] - rmax
                done = last > d64[:, -1] * (1 + _SLACK)
            out_i[todo[done]] = ids[done]
            out_d[todo[done]] = d64[done]
            todo = todo[~done]
            kk = min(n, 2 * kk)
        if self._squared:
            out_d *= out_d
        return out_d, out_i

    def kneighbors(self, X=None, n_neighbors=None, return_distance=True):
        """(dist, ind) of the n_neighbors nearest training rows of each row of X; X None:
        of each training row, itself excluded (see the module's description)."""
        check_is_fitted(self, "_fit_X")
        k = self.n_neighbors if n_neighbors is None else n_neighbors
        if not isinstance(k, numbers.Integral) or isinstance(k, bool):
            raise TypeError(f"n_neighbors does not take {type(k)} value, enter integer value")
        if k <= 0:
            raise ValueError(f"Expected n_neighbors > 0. Got {k}")
        train = X is None
        if train:
            Q, Q32, qerr, k = self._fit_X, self._X32, self._err, k + 1
        else:
            Q = _validate_data(self, X, reset=False, dtype=[np.float64, np.float32], order="C")
            Q32 = Q.astype(np.float32) if Q.dtype != np.float32 else Q
            qerr = _pnorm(Q - Q32, self._norm_p if self._norm_p is not None else 2.0)
        n = self.n_samples_fit_
        if k > n:
            rel = "<" if train else "<="
            raise ValueError(f"Expected n_neighbors {rel} n_samples_fit, but n_neighbors = "
                             f"{k - train}, n_samples_fit = {n}, n_samples = {Q.shape[0]}")
        dist, ind = self._search(Q, Q32, qerr, int(k))
        if train:
            keep = ind != np.arange(n)[:, None]
            absent = keep.all(axis=1)
            keep[absent, 0] = False
            ind = ind[keep].reshape(n, k - 1)
            dist = dist[keep].reshape(n, k - 1)
        return (dist, ind) if return_distance else ind

    def kneighbors_graph(self, X=None, n_neighbors=None, mode="connectivity"):
        """Sparse CSR (n_queries, n_samples_fit) graph of the neighbours: 1 for each
        (mode "connectivity") or the distance (mode "distance")."""
        check_is_fitted(self, "_fit_X")
        k = self.n_neighbors if n_neighbors is None else n_neighbors
        if mode == "connectivity":
            ind = self.kneighbors(X, k, return_distance=False)
            data = np.ones(ind.size)
        elif mode == "distance":
            dist, ind = self.kneighbors(X, k)
            data = dist.ravel()
        else:
            raise ValueError(f'Unsupported mode, must be one of "connectivity", or "distance" but got "{mode}" instead')
        nq, kk = ind.shape
        return sparse.csr_matrix((data, ind.ravel(), np.arange(0, nq * kk + 1, kk)),
                                 shape=(nq, self.n_samples_fit_))

    def _weights(self, dist):
        """None (uniform), or 1/d with scikit-learn's rule for zero distances."""
        if self.weights == "uniform":
            return None
        with np.errstate(divide="ignore"):
            w = 1.0 / dist
        zero = np.isinf(w)
        rows = zero.any(axis=1)
        w[rows] = zero[rows]
        return w

    def _neighbours(self, X):
        if self.weights not in ("uniform", "distance"):
            raise ValueError(f"weights={self.weights!r}: 'uniform' or 'distance'")
        dist, ind = self.kneighbors(X)
        return ind, self._weights(dist)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        return tags


class NearestNeighbors(_Base):
    """Unsupervised exact neighbours (scikit-learn's NearestNeighbors, brute force)."""

    def __init__(self, *, n_neighbors=5, algorithm="auto", leaf_size=30, metric="minkowski", p=2,
                 metric_params=None, n_jobs=None, backend="auto"):
        self._store_params(locals())

    def fit(self, X, y=None):
        X = _validate_data(self, X, dtype=[np.float64, np.float32], order="C")
        return self._fit_rows(X)


class _Supervised(_Base):
    """The constructor of the classifier and the regressor (scikit-learn's arguments of
    KNeighborsClassifier and KNeighborsRegressor, which are the same), stored as given."""

    def __init__(self, n_neighbors=5, *, weights="uniform", algorithm="auto", leaf_size=30, p=2,
                 metric="minkowski", metric_params=None, n_jobs=None, backend="auto"):
        self._store_params(locals())


class KNeighborsClassifier(ClassifierMixin, _Supervised):
    """Exact k-NN classification (scikit-learn's KNeighborsClassifier, brute force)."""

    def fit(self, X, y):
        X, y = _validate_data(self, X, y, dtype=[np.float64, np.float32], order="C")
        check_classification_targets(y)
        self.classes_, self._y = np.unique(y, return_inverse=True)
        self.outputs_2d_ = False
        return self._fit_rows(X)

    def predict_proba(self, X):
        """(n_queries, n_classes) class probabilities, classes in classes_ order."""
        check_is_fitted(self, "_fit_X")
        ind, w = self._neighbours(X)
        nq = ind.shape[0]
        if w is None:
            w = np.ones(ind.shape)
        proba = np.zeros((nq, self.classes_.size))
        rows = np.arange(nq)
        labels = self._y[ind]
        for j in range(ind.shape[1]):
            proba[rows, labels[:, j]] += w[:, j]
        proba /= proba.sum(axis=1)[:, None]
        return proba

    def predict(self, X):
        """The class of each query: the most frequent (weights "uniform") or heaviest
        ("distance") among its neighbours; ties go to the first class in classes_."""
        check_is_fitted(self, "_fit_X")
        ind, w = self._neighbours(X)
        labels = self._y[ind]
        if w is None:
            counts = np.zeros((ind.shape[0], self.classes_.size), dtype=np.int64)
            for j in range(ind.shape[1]):
                np.add.at(counts, (np.arange(ind.shape[0]), labels[:, j]), 1)
            best = counts.argmax(axis=1)
        else:
            best = weighted_mode(labels, w, axis=1)[0].ravel().astype(np.intp)
        return self.classes_.take(best)


class KNeighborsRegressor(RegressorMixin, _Supervised):
    """Exact k-NN regression (scikit-learn's KNeighborsRegressor, brute force)."""

    def fit(self, X, y):
        X, y = _validate_data(self, X, y, dtype=[np.float64, np.float32], order="C", multi_output=True,
                              y_numeric=True)
        self._y = y
        return self._fit_rows(X)

    def predict(self, X):
        """The mean (weights "uniform") or 1/d-weighted mean ("distance") of the
        neighbours' targets."""
        check_is_fitted(self, "_fit_X")
        ind, w = self._neighbours(X)
        y = self._y.reshape(-1, 1) if self._y.ndim == 1 else self._y
        if w is None:
            pred = np.mean(y[ind], axis=1)
        else:
            pred = np.empty((ind.shape[0], y.shape[1]), dtype=np.float64)
            den = np.sum(w, axis=1)
            for j in range(y.shape[1]):
                pred[:, j] = np.sum(y[ind, j] * w, axis=1) / den
        return pred.ravel() if self._y.ndim == 1 else pred

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags
