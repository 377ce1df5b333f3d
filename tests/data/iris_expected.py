#!/usr/bin/env python3
"""Expected accuracies of scikit-learn's brute-force k-NN classifier on iris.csv.

Split (the one tests/learn-t.c uses): row i (0-based, data rows only) is a test row when
i % 3 == 0 (50 rows), a training row otherwise (100 rows). Prints one line per
(k, weights): the number of correct test predictions, which learn-t.c stores.
Run: python3 tests/data/iris_expected.py  (needs numpy and scikit-learn)
"""
import os
import sys

import numpy as np
import sklearn
from sklearn.neighbors import KNeighborsClassifier


def main():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "iris.csv")
    rows = [line.split(",") for line in open(path) if line.strip() and not line.startswith("#")]
    X = np.array([[float(v) for v in r[:4]] for r in rows])
    y = np.array([int(r[4]) for r in rows])
    test = np.arange(len(y)) % 3 == 0
    print("# scikit-learn %s, %d train, %d test rows" % (sklearn.__version__, (~test).sum(), test.sum()))
    for k in (1, 5, 9):
        for weights in ("uniform", "distance"):
            clf = KNeighborsClassifier(n_neighbors=k, weights=weights, algorithm="brute")
            clf.fit(X[~test], y[~test])
            correct = int((clf.predict(X[test]) == y[test]).sum())
            print("k=%d %s correct=%d of %d" % (k, weights, correct, test.sum()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
