# SPDX-License-Identifier: MIT
"""The naive float64 search the tests compare xknn with, bit for bit.

Canonical distances (include/xknn.h): double accumulation in dimension order, rounded
once to float32. The data the tests use keep every product and difference exact in
double (small integers, or float32 values whose differences share one binade), so a
plain left-to-right sum in float64 is the fma chain the library computes.
"""

import numpy as np


def _chain(terms):
    """Left-to-right float64 sum over the last axis (dimension order)."""
    acc = np.zeros(terms.shape[:-1])
    for t in range(terms.shape[-1]):
        acc = acc + terms[..., t]
    return acc


def distances(R, Q, metric, p=2.0, weights=None):
    """float32 canonical distance of every (query, reference) pair (nq, n)."""
    if metric in ("hamming", "whamming"):
        bits = np.unpackbits(Q[:, None, :] ^ R[None, :, :], axis=-1, bitorder="little").astype(np.float64)
        if metric == "hamming":
            return bits.sum(-1).astype(np.float32)
        return _chain(bits * np.abs(np.asarray(weights, dtype=np.float64))).astype(np.float32)
    X = Q.astype(np.float64)[:, None, :]
    Y = R.astype(np.float64)[None, :, :]
    if metric in ("l2", "euclidean"):
        acc = _chain((X - Y) ** 2)
        return (acc if metric == "l2" else np.sqrt(acc)).astype(np.float32)
    if metric == "l1":
        return _chain(np.abs(X - Y)).astype(np.float32)
    if metric == "minkowski":  # tests use p = 1 or 2 only
        acc = _chain(np.abs(X - Y) ** p)
        return (acc if p == 1 else np.sqrt(acc)).astype(np.float32)
    if metric == "chebyshev":
        return np.abs(X - Y).max(-1).astype(np.float32)
    if metric == "ip":
        return _chain(X * Y).astype(np.float32)
    if metric == "cosine":
        dot, nx, ny = _chain(X * Y), _chain(X * X), _chain(Y * Y)
        with np.errstate(invalid="ignore", divide="ignore"):
            c = 1.0 - dot / np.sqrt(nx * ny)
        c = np.where((nx == 0) | (ny == 0), 1.0, np.clip(c, 0.0, 2.0))
        return c.astype(np.float32)
    if metric == "hellinger":
        s = np.sqrt(X) - np.sqrt(Y)
        return np.sqrt(_chain(s * s) * 0.5).astype(np.float32)
    raise ValueError(metric)


def knn(R, Q, k, metric, p=2.0, weights=None, self_join=False):
    """(ids, dist): each row ordered by (reported float32 value, id); -value for ip."""
    D = distances(R, R if Q is None else Q, metric, p, weights)
    if self_join:
        D = D.copy()
        np.fill_diagonal(D, np.inf if metric != "ip" else -np.inf)
    ids = np.broadcast_to(np.arange(D.shape[1]), D.shape)
    key = -D if metric == "ip" else D
    order = np.lexsort((ids, key), axis=-1)[:, :k]
    return order.astype(np.int64), np.take_along_axis(D, order, axis=1)
