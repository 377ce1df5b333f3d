#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""scikit-learn's KNeighborsClassifier(algorithm='brute') on Fashion-MNIST, compared with
the prediction files of benchmarks/fmnist_learn.sh (p_K_VOTE.txt): accuracy of both and
the number of test images whose predictions differ (0 expected: same votes, same ties).
usage: peers_learn.py DATA_DIR OUT_DIR"""
import gzip
import os
import sys
import time

import numpy as np
from sklearn.neighbors import KNeighborsClassifier


def idx(path, offset, shape):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset).reshape(shape)


def main():
    data, out = sys.argv[1], sys.argv[2]
    x = idx(os.path.join(data, "train-images-idx3-ubyte.gz"), 16, (-1, 784)).astype(np.float64)
    y = idx(os.path.join(data, "train-labels-idx1-ubyte.gz"), 8, (-1,)).astype(np.int64)
    q = idx(os.path.join(data, "t10k-images-idx3-ubyte.gz"), 16, (-1, 784)).astype(np.float64)
    t = idx(os.path.join(data, "t10k-labels-idx1-ubyte.gz"), 8, (-1,)).astype(np.int64)
    print("# k vote sklearn_accuracy xknn_accuracy differing_predictions sklearn_time_s")
    bad = 0
    for k in (1, 5, 9):
        for vote in ("uniform", "distance"):
            t0 = time.time()
            pred = KNeighborsClassifier(n_neighbors=k, weights=vote, algorithm="brute").fit(x, y).predict(q)
            dt = time.time() - t0
            mine = np.loadtxt(os.path.join(out, "p_%d_%s.txt" % (k, vote)), dtype=np.int64)
            diff = int((pred != mine).sum())
            bad += diff
            print("%d %s %.4f %.4f %d %.1f" % (k, vote, (pred == t).mean(), (mine == t).mean(), diff, dt), flush=True)
    print("PASS" if bad == 0 else "FAIL: %d predictions differ" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
