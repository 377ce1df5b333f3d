#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""CPU peers benchmark: xknn (CPU backend, through libxknn) vs faiss-cpu IndexFlatL2
and scikit-learn brute force, same data, same process, same machine.

Default data: Fashion-MNIST (60k x 784 references, 10k queries, uint8 pixels as float32)
from Debian's dataset-fashion-mnist package. Self-checking: xknn is compared byte for
byte with the exact oracle on a sample of queries, and the peers' neighbour ids are
compared with xknn's up to ties (a peer id counts as "equal up to ties" when its exact
distance equals the exact distance at that rank).

xknn runs once per CPU path named by --paths (default "auto,blas"): `auto` is what a
caller gets (on these integer pixels: the exact integer path, AVX-512 VNNI where present), `blas` forces the float32 sgemm path. Ratios are against the first.

Usage: peers_cpu.py --bench build/benchmarks/bench_cpu [-k 100] [--nq 10000] [--paths auto,blas] [--json out.json]
"""
import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

FMNIST = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rb") as f:
        raw = f.read()
    assert raw[0] == 0 and raw[1] == 0 and raw[2] == 0x08, "expected uint8 IDX"
    nd = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(nd)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * nd)
    return data.reshape(dims[0], -1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True, help="path of the bench_cpu program (benchmarks/bench_cpu)")
    ap.add_argument("-k", type=int, default=100)
    ap.add_argument("--nq", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--peers", default="faiss,sklearn")
    ap.add_argument("--paths", default="auto,blas", help="xknn CPU paths to time (auto, blas, loop, int8)")
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--data", default=FMNIST)
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each implementation, interleaved; the median is reported")
    args = ap.parse_args()

    ref = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz")).astype(np.float32)
    qry = read_idx(os.path.join(args.data, "t10k-images-idx3-ubyte.gz")).astype(np.float32)[: args.nq]
    ref = np.ascontiguousarray(ref)
    qry = np.ascontiguousarray(qry)
    n, d = ref.shape
    nq = qry.shape[0]
    k = args.k
    rows = []
    print(f"# xknn CPU peers benchmark: Fashion-MNIST n={n} nq={nq} d={d} k={k} threads={args.threads}")
    print(f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")

    # xknn through the bench_cpu program (a plain C program timing one xknn_search call)
    import tempfile
    tmp = tempfile.mkdtemp()
    ref.tofile(os.path.join(tmp, "ref.f32"))
    qry.tofile(os.path.join(tmp, "qry.f32"))

    paths = args.paths.split(",")

    def run_xknn(path):
        out = subprocess.run([args.bench, os.path.join(tmp, "ref.f32"), os.path.join(tmp, "qry.f32"), str(n),
                              str(nq), str(d), str(k), str(args.threads), os.path.join(tmp, f"ids-{path}.i64"),
                              os.path.join(tmp, f"dist-{path}.f32"), path], capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stdout, out.stderr)
            sys.exit(1)
        return float(out.stdout.split("time_s=")[1].split()[0])

    peers = {}
    if "faiss" in args.peers:
        import faiss
        faiss.omp_set_num_threads(args.threads)
        index = faiss.IndexFlatL2(d)
        index.add(ref)
        peers[f"faiss-cpu {faiss.__version__} IndexFlatL2"] = lambda: index.search(qry, k)[1]
    if "sklearn" in args.peers:
        import sklearn
        from sklearn.neighbors import NearestNeighbors
        nn = NearestNeighbors(n_neighbors=k, algorithm="brute", metric="euclidean", n_jobs=args.threads).fit(ref)
        peers[f"scikit-learn {sklearn.__version__} brute"] = lambda: nn.kneighbors(qry)[1]

    # interleaved repeats: xknn, peer 1, peer 2, xknn, ... so load changes hit all alike
    xnames = {p: f"xknn-cpu ({p})" for p in paths}
    times = {xnames[p]: [] for p in paths}
    peer_ids = {}
    for name in peers:
        times[name] = []
    for rep in range(args.repeats):
        for p in paths:
            times[xnames[p]].append(run_xknn(p))
        for name, fn in peers.items():
            t0 = time.perf_counter()
            peer_ids[name] = fn()
            times[name].append(time.perf_counter() - t0)
        print("# repeat %d: %s" % (rep + 1, ", ".join(f"{nm} {ts[-1]:.3f} s" for nm, ts in times.items())),
              flush=True)
    med = {nm: float(np.median(ts)) for nm, ts in times.items()}
    t_xknn = med[xnames[paths[0]]]
    ids = {p: np.fromfile(os.path.join(tmp, f"ids-{p}.i64"), dtype=np.int64).reshape(nq, k) for p in paths}
    dists = {p: np.fromfile(os.path.join(tmp, f"dist-{p}.f32"), dtype=np.float32).reshape(nq, k) for p in paths}
    dist = dists[paths[0]]

    # exact check of xknn on a sample (double precision, dimension order: equal to canonical)
    rng = np.random.default_rng(0)
    sample = rng.choice(nq, size=min(50, nq), replace=False)
    wrong = {p: 0 for p in paths}
    r64 = ref.astype(np.float64)
    for i in sample:
        dd = ((r64 - qry[i].astype(np.float64)) ** 2).sum(axis=1).astype(np.float32)
        order = np.lexsort((np.arange(n), dd))[:k]
        for p in paths:
            if not (np.array_equal(order, ids[p][i]) and np.array_equal(dd[order], dists[p][i])):
                wrong[p] += 1
    for p in paths:
        # every path's whole output must also be byte-identical to the first path's
        same = np.array_equal(ids[p], ids[paths[0]]) and np.array_equal(dists[p].view(np.uint32),
                                                                         dist.view(np.uint32))
        rows.append(dict(name=xnames[p], time_s=med[xnames[p]], times=times[xnames[p]],
                         wrong=wrong[p] + (0 if same else 1), identical_to_first=same))

    def agree(pids):
        """entries of the sample where the peer's neighbour is not at xknn's exact distance"""
        bad = 0
        for i in sample:
            dd = ((r64[pids[i]] - qry[i].astype(np.float64)) ** 2).sum(axis=1).astype(np.float32)
            bad += int(np.sum(dd != dist[i]))
        return bad

    for name in peers:
        rows.append(dict(name=name, time_s=med[name], times=times[name], wrong=agree(peer_ids[name])))

    print(f"{'impl':40s} {'time_s':>9s} {'queries/s':>10s} {'vs_xknn':>8s} {'#wrong':>7s}")
    for r in rows:
        print(f"{r['name']:40s} {r['time_s']:9.3f} {nq / r['time_s']:10.1f} {r['time_s'] / t_xknn:8.2f} {r['wrong']:7d}")
    ok = all(r["wrong"] == 0 for r in rows)
    print("PASS" if ok else "FAIL")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(n=n, nq=nq, d=d, k=k, threads=args.threads, rows=rows), f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
