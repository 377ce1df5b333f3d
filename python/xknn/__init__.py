# SPDX-License-Identifier: MIT
"""xknn: exact k-nearest-neighbour search (CPU, CUDA, MPI) for NumPy arrays.

    ids, dist = xknn.search(ref, query, k=10, metric="l2")

search, Index, read, write_result and backends come from the C library; the
scikit-learn estimators NearestNeighbors, KNeighborsClassifier and KNeighborsRegressor
(xknn.neighbors) import scikit-learn when first used; xknn.mpi needs mpi4py.
"""

from . import _xknn
from ._core import Index, backends, read, search, write_result

__version__ = _xknn.__version__
__all__ = ["search", "Index", "read", "write_result", "backends", "NearestNeighbors",
           "KNeighborsClassifier", "KNeighborsRegressor"]

_ESTIMATORS = ("NearestNeighbors", "KNeighborsClassifier", "KNeighborsRegressor")


def __getattr__(name):
    if name in _ESTIMATORS:
        from . import neighbors
        return getattr(neighbors, name)
    if name == "mpi":
        import importlib
        return importlib.import_module(".mpi", __name__)
    raise AttributeError(f"module 'xknn' has no attribute {name!r}")
