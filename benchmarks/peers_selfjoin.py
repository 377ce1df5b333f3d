#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""PyTorch peer of bench_selfjoin: the all-kNN graph of an .fbin file by blocked
`mm + topk` on the GPU (fp32, TF32 off; each point's own column set to +inf), timed with
CUDA synchronisation, median of --repeats after a warm-up. Self-checked on --check
sampled rows against a float64 NumPy brute force (a row is wrong when its id list differs;
ties at equal float64 distances make that possible without an error of the peer).

  python3 benchmarks/peers_selfjoin.py --data pts.fbin --k 16 --block 4096 --json out.json
"""
import argparse
import json
import sys
import time

import numpy as np


def read_fbin(path):
    with open(path, "rb") as f:
        n, d = np.fromfile(f, dtype=np.int32, count=2)
        x = np.fromfile(f, dtype=np.float32, count=int(n) * int(d))
    return x.reshape(int(n), int(d))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--block", type=int, default=4096, help="query rows per mm")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--check", type=int, default=8)
    ap.add_argument("--json")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("peers_selfjoin: PyTorch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("peers_selfjoin: no CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    x = read_fbin(a.data)
    n, d = x.shape
    k = a.k
    dev = torch.device("cuda")
    xt = torch.from_numpy(x).to(dev)
    norms = (xt * xt).sum(1)

    def graph():
        ids = torch.empty((n, k), dtype=torch.int64, device=dev)
        for q0 in range(0, n, a.block):
            q1 = min(n, q0 + a.block)
            dist = norms[q0:q1, None] + norms[None, :] - 2.0 * (xt[q0:q1] @ xt.T)
            r = torch.arange(q1 - q0, device=dev)
            dist[r, r + q0] = float("inf")
            ids[q0:q1] = torch.topk(dist, k, dim=1, largest=False, sorted=True).indices
        return ids

    graph()
    torch.cuda.synchronize()
    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        ids = graph()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    ms = float(np.median(times))
    ids = ids.cpu().numpy()
    wrong = 0
    rows = np.linspace(0, n - 1, num=min(a.check, n)).astype(np.int64)
    x64 = x.astype(np.float64)
    for i in rows:
        dd = ((x64 - x64[i]) ** 2).sum(1)
        dd[i] = np.inf
        want = np.lexsort((np.arange(n), dd))[:k]
        wrong += int(not np.array_equal(want, ids[i]))
    print(f"peer torch mm+topk fp32 (blocks of {a.block}) n={n} d={d} k={k}: {ms:.1f} ms "
          f"(median of {a.repeats}); {wrong} of {len(rows)} sampled rows differ from float64")
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps({"program": "peers_selfjoin", "peer": "torch mm+topk fp32", "torch": torch.__version__,
                                "device": torch.cuda.get_device_name(0), "n": int(n), "d": int(d), "k": k,
                                "block": a.block, "ms": ms, "check_rows": int(len(rows)), "check_wrong": wrong})
                    + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
