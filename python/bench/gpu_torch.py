# SPDX-License-Identifier: MIT
"""xknn.search on PyTorch CUDA tensors, in place, against torch mm + topk in the same run.

    python3 python/bench/gpu_torch.py [--n 1000000] [--nq 10000] [--d 128] [--k 10]

Prints one JSON line: median milliseconds of each (CUDA events, warm-up first), their
ratio, and whether xknn's ids and distance bits on the device equal the CPU backend's
on a sample of the queries (the whole problem on the CPU would take minutes)."""
import argparse
import json
import os
import statistics
import sys

import numpy as np
import torch

import xknn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
from bench_util import cuda_times_ms  # noqa: E402 (the benchmarks' shared helpers)


def timed(fn, repeats):
    """Median milliseconds of fn() on the GPU (CUDA events, one warm-up first)."""
    return statistics.median(cuda_times_ms(torch, fn, repeats))


def torch_knn(R, Q, k, rn, block=2048):
    """Squared l2 by mm: |q|^2 - 2 q.x + |x|^2, then topk, in query blocks."""
    ids = []
    for i in range(0, Q.shape[0], block):
        q = Q[i:i + block]
        d = (q * q).sum(1, keepdim=True) - 2.0 * (q @ R.T) + rn
        ids.append(torch.topk(d, k, dim=1, largest=False).indices)
    return torch.cat(ids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000000)
    ap.add_argument("--nq", type=int, default=10000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sample", type=int, default=64)
    a = ap.parse_args()
    rng = np.random.default_rng(7)
    Rh = rng.standard_normal((a.n, a.d), dtype=np.float32)
    Qh = rng.standard_normal((a.nq, a.d), dtype=np.float32)
    R, Q = torch.from_numpy(Rh).cuda(), torch.from_numpy(Qh).cuda()
    rn = (R * R).sum(1)
    t_x = timed(lambda: xknn.search(R, Q, k=a.k), a.repeats)
    t_t = timed(lambda: torch_knn(R, Q, a.k, rn), a.repeats)
    ids, dist = xknn.search(R, Q, k=a.k)
    s = a.sample
    hi, hd = xknn.search(Rh, Qh[:s], k=a.k, backend="cpu")
    same = bool(np.array_equal(ids[:s].cpu().numpy(), hi) and np.array_equal(dist[:s].cpu().numpy(), hd))
    print(json.dumps({"n": a.n, "nq": a.nq, "d": a.d, "k": a.k, "device": torch.cuda.get_device_name(),
                      "on_device": type(ids).__module__.split(".")[0] == "torch",
                      "xknn_ms": round(t_x, 3), "torch_mm_topk_ms": round(t_t, 3),
                      "speedup": round(t_t / t_x, 2), "sample_equal_cpu": same, "sampled": s}))


if __name__ == "__main__":
    main()
