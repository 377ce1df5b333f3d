# SPDX-License-Identifier: MIT
"""KNeighborsClassifier(n_neighbors=5) on the full Fashion-MNIST (60k train, 10k test):
xknn's estimator against scikit-learn's brute force, weights uniform and distance;
prints each fit+predict time and whether the predictions are identical.

    python fmnist_estimators.py [/usr/share/datasets/fashion-mnist]
"""

import gzip
import os
import sys
import time

import numpy as np
from sklearn.neighbors import KNeighborsClassifier as SkKNN

import xknn


def labels(path):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=8)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/datasets/fashion-mnist"
    Xtr = xknn.read(os.path.join(root, "train-images-idx3-ubyte.gz"))
    Xte = xknn.read(os.path.join(root, "t10k-images-idx3-ubyte.gz"))
    ytr = labels(os.path.join(root, "train-labels-idx1-ubyte.gz"))
    yte = labels(os.path.join(root, "t10k-labels-idx1-ubyte.gz"))
    print(f"# train {Xtr.shape} test {Xte.shape} {Xtr.dtype}, k=5")
    ok = True
    for w in ("uniform", "distance"):
        t0 = time.perf_counter()
        ours = xknn.KNeighborsClassifier(5, weights=w).fit(Xtr, ytr).predict(Xte)
        t1 = time.perf_counter()
        ref = SkKNN(5, weights=w, algorithm="brute").fit(Xtr, ytr).predict(Xte)
        t2 = time.perf_counter()
        same = np.array_equal(ours, ref)
        ok &= same
        print(f"weights={w:8s} xknn {t1 - t0:7.1f} s  scikit-learn {t2 - t1:7.1f} s  "
              f"identical predictions: {same} ({int((ours != ref).sum())} differ)  accuracy {np.mean(ours == yte):.4f}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
