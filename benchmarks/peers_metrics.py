#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""GPU peers of bench_metrics on the same data: PyTorch brute force for other metrics.

Reads PREFIX.ref.bin and PREFIX.query.bin as written by `bench_metrics --write-data
PREFIX` (uint32 rows, uint32 d, raw rows of --dtype; bin: d bits in 64-bit words) and
times on the GPU, data already on the device, in blocks of queries so one block's
distance matrix stays under --block-bytes:
  l1        torch.cdist(p=1), then torch.topk
  cosine    rows normalised once (not timed), torch.mm, then torch.topk (largest)
  ip        torch.mm, then torch.topk (largest)
  l2 (u8)   int8 tensor cores: torch._int_mm on the values shifted by -128 (l2 does not
            change), |q|^2 + |x|^2 - 2 q.x in int32, then torch.topk
  hamming   bits unpacked to float16 {0, 1} once (not timed), |a| + |b| - 2 a.b with
            torch.mm (fp32 accumulation: exact up to 2^24 bits), then torch.topk
Each row: one warm-up, then the median of --repeats, torch.cuda.Event around the search.

Usage: peers_metrics.py --data PREFIX --metric l1 --dtype f32 --k 10 [--json out.json]
"""
import argparse
import datetime
import json
import statistics
import sys

import numpy as np

from bench_util import cuda_times_ms

NP = {"f32": np.float32, "f16": np.float16, "u8": np.uint8, "i8": np.int8, "bin": np.uint64}


def read_bin(path, dtype):
    with open(path, "rb") as f:
        n, d = (int(v) for v in np.fromfile(f, dtype="<u4", count=2))
    cols = (d + 63) // 64 if dtype == "bin" else d
    x = np.fromfile(path, dtype=NP[dtype], count=n * cols, offset=8).reshape(n, cols)
    return x, n, d


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--metric", required=True, choices=["l1", "cosine", "ip", "l2", "hamming"])
    ap.add_argument("--dtype", default="f32", choices=sorted(NP))
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--block-bytes", type=float, default=2 * 2**30)
    ap.add_argument("--json")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    import torch

    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    R, n, d = read_bin(a.data + ".ref.bin", a.dtype)
    Q, nq, _ = read_bin(a.data + ".query.bin", a.dtype)
    method = {"l1": "cdist(p=1)+topk", "cosine": "normalised mm+topk", "ip": "mm+topk",
              "l2": "int8 _int_mm+topk" if a.dtype == "u8" else "mm+topk (fp32)",
              "hamming": "fp16 mm on unpacked bits+topk"}[a.metric]

    if a.metric == "hamming":
        def unpack(x):
            b = np.unpackbits(x.view(np.uint8), axis=1, bitorder="little")[:, :d]
            return torch.from_numpy(b).to(dev, torch.float16)
        r, q = unpack(R), unpack(Q)
        rn = r.float().sum(1)
        qn = q.float().sum(1)
    elif a.metric == "l2" and a.dtype == "f32":
        r = torch.from_numpy(R.astype(np.float32)).to(dev)
        q = torch.from_numpy(Q.astype(np.float32)).to(dev)
        rn = (r * r).sum(1)
        qn = (q * q).sum(1)
    elif a.metric == "l2":
        if a.dtype != "u8":
            sys.exit("l2 peer: u8 or f32 data only")
        r = torch.from_numpy((R.astype(np.int16) - 128).astype(np.int8)).to(dev)
        q = torch.from_numpy((Q.astype(np.int16) - 128).astype(np.int8)).to(dev)
        rn = (r.int() * r.int()).sum(1)
        qn = (q.int() * q.int()).sum(1)
    else:
        r = torch.from_numpy(R.astype(np.float32)).to(dev)
        q = torch.from_numpy(Q.astype(np.float32)).to(dev)
        if a.metric == "cosine":
            r = torch.nn.functional.normalize(r, dim=1)
            q = torch.nn.functional.normalize(q, dim=1)
    rt = r.t().contiguous() if a.metric != "l1" else None
    qb = max(1, min(nq, int(a.block_bytes // (4 * n))))
    if a.metric == "l2" and a.dtype == "u8":
        qb = max(32, qb // 8 * 8)

    def search():
        out = []
        for q0 in range(0, nq, qb):
            qq = q[q0:q0 + qb]
            if a.metric == "l1":
                v = torch.cdist(qq, r, p=1)
                out.append(torch.topk(v, a.k, dim=1, largest=False))
            elif a.metric in ("cosine", "ip"):
                out.append(torch.topk(qq @ rt, a.k, dim=1, largest=True))
            elif a.metric == "l2" and a.dtype == "u8":
                m = qq.shape[0]
                if m % 8 or m <= 16:  # _int_mm shape rules: pad the block
                    pad = max(24, (m + 7) // 8 * 8) - m
                    qq = torch.cat([qq, qq.new_zeros(pad, qq.shape[1])])
                dot = torch._int_mm(qq, rt)[:m]
                v = qn[q0:q0 + m, None] + rn[None, :] - 2 * dot
                out.append(torch.topk(v, a.k, dim=1, largest=False))
            else:
                dot = (qq @ rt).float()
                v = qn[q0:q0 + qb, None] + rn[None, :] - 2 * dot
                out.append(torch.topk(v, a.k, dim=1, largest=False))
        return out

    times = cuda_times_ms(torch, search, a.repeats)
    med = statistics.median(times)
    row = {"program": "peers_metrics", "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "peer": "torch " + torch.__version__, "method": method, "metric": a.metric, "dtype": a.dtype,
           "n": n, "nq": nq, "d": d, "k": a.k, "median_ms": round(med, 3), "min_ms": round(min(times), 3),
           "device": torch.cuda.get_device_name(0), "label": a.label}
    print(f"peer torch {method}: metric {a.metric} dtype {a.dtype} n {n} nq {nq} d {d} k {a.k}: "
          f"median {med:.2f} ms, min {min(times):.2f} ms")
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
