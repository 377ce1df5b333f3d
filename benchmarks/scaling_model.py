#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Scaling model of the distributed search, fitted to bench_scaling runs, with projections.

    python3 benchmarks/scaling_model.py RUNS.json [RUNS.json ...] [--n 400M] [--weak-n 50M]
                                        [--ranks 1,2,4,8,64,512] [--net-gbs 25] [--net-us 5]
                                        [--gpus-per-node 8] [--mode resident] [--json model.json]

Model (one query set of nq queries, d dimensions, k neighbours, P ranks, one GPU each):

    T(P) = S(n / P) + L(P) * (bcast + reduce)

  S(m)   per-rank local time for a slice of m references: S(m) = s0 + m * nq * d * 2 / R,
         R the effective rate of one GPU (flop/s, everything a rank does on its own slice
         included: value checks, the upload to the GPU, the distance work), s0 a fixed cost
         per search. Fitted by least squares to every measured row's total minus its
         broadcast and reduction (phases are maxima over ranks: imbalance is inside).
  L(P)   = ceil(log2 P): levels of the binomial broadcast and of the binomial-tree
         reduction (mpi/search.c, mpi/tree_reduce.c).
  bcast  per level: a + nq * d * 4 / B   (query block, float32)
  reduce per level: a + nq * k * 12 / B + nq * k * c  (ids + distances, then the merge)

The per-level cost inside one node is fitted from the measured 2-rank rows (their
measured broadcast + reduce); between nodes (ranks beyond --gpus-per-node) the link is
assumed: --net-gbs GB/s per rank and --net-us microseconds latency per message (say what
cluster you project for). Reading the inputs is outside the model (file systems differ);
bench_scaling generates each slice in place.

--mode picks the rows of one kind of search: resident (an index created once; its
searches move only queries and candidates) or one-shot (each search stages the slice);
runs from before the modes existed count as one-shot.

Every row of the printed table says whether it was measured or projected.
"""
import argparse
import json
import math
import sys

from bench_util import json_runs


def parse_size(s):
    s = str(s).strip()
    mult = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(float(s))


def load_rows(paths, mode):
    rows = []
    for _, run in json_runs(paths):
        if run.get("program") != "bench_scaling":
            continue
        meta = run.get("meta", {})
        if meta.get("backend") != "cuda":
            continue
        for r in run.get("rows", []):
            if r.get("status") != "ok" or r.get("wrong", 0) or r.get("mode", "one-shot") != mode:
                continue
            rows.append(dict(scaling=meta.get("scaling"), ranks=r["ranks"], n=r["n"], nq=r["nq"], d=r["d"],
                             k=r["k"], search=r["search_ms"] / 1e3, bcast=r["broadcast_ms"] / 1e3,
                             reduce=r["reduce_ms"] / 1e3, total=r["total_ms"] / 1e3,
                             commit=meta.get("commit"), device=(meta.get("devices") or ["?"])[0]))
    return rows


def fit(rows):
    """least squares for S(m) = s0 + w / R, w = m nq d 2; per-level cost from P = 2 rows"""
    xs, ys = [], []
    for r in rows:
        m = r["n"] / r["ranks"]
        xs.append(m * r["nq"] * r["d"] * 2.0)
        ys.append(r["total"] - r["bcast"] - r["reduce"])
    nrow = len(xs)
    if nrow == 0:
        sys.exit("scaling_model: no usable CUDA rows in the input")
    if nrow == 1 or max(xs) == min(xs):
        s0, inv_r = 0.0, ys[0] / xs[0]
    else:
        mx, my = sum(xs) / nrow, sum(ys) / nrow
        sxx = sum((x - mx) ** 2 for x in xs)
        sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
        inv_r = sxy / sxx
        s0 = my - inv_r * mx
        if s0 < 0:  # a negative fixed cost means noise: fit through the origin
            s0, inv_r = 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    two = [r for r in rows if r["ranks"] >= 2]
    level = (sum((r["bcast"] + r["reduce"]) / math.ceil(math.log2(r["ranks"])) for r in two) / len(two)
             if two else 0.0)
    return dict(s0=s0, rate=1.0 / inv_r, level_intra=level)


def project(model, n, nq, d, k, P, gpn, net_gbs, net_us):
    search = model["s0"] + (n / P) * nq * d * 2.0 / model["rate"]
    levels = math.ceil(math.log2(P)) if P > 1 else 0
    intra = min(levels, math.ceil(math.log2(min(P, gpn)))) if P > 1 else 0
    inter = levels - intra
    per_inter = 2 * net_us * 1e-6 + (nq * d * 4 + nq * k * 12) / (net_gbs * 1e9) + nq * k * 2e-9
    comm = intra * model["level_intra"] + inter * per_inter
    return search, comm, search + comm


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="bench_scaling JSON files (device_scaling.sh's bench_scaling.json)")
    ap.add_argument("--n", default="400M", help="strong-scaling problem size to project")
    ap.add_argument("--weak-n", default="50M", help="references per rank for the weak-scaling projection")
    ap.add_argument("--nq", default="10k")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--ranks", default="1,2,4,8,64,512")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--net-gbs", type=float, default=25.0, help="inter-node GB/s per rank (assumed)")
    ap.add_argument("--net-us", type=float, default=5.0, help="inter-node latency per message, us (assumed)")
    ap.add_argument("--mode", default="resident", choices=("resident", "one-shot"),
                    help="the rows to fit (default resident)")
    ap.add_argument("--json", help="write the fitted model and the projections here")
    a = ap.parse_args()

    rows = load_rows(a.runs, a.mode)
    model = fit(rows)
    n, wn, nq = parse_size(a.n), parse_size(a.weak_n), parse_size(a.nq)
    ranks = [int(x) for x in a.ranks.split(",")]
    print(f"# scaling model of {a.mode} searches fitted to {len(rows)} measured rows "
          f"(commits {sorted(set(r['commit'] for r in rows))}, {rows[0]['device']})")
    print(f"# S(m) = {model['s0'] * 1e3:.1f} ms + m*nq*d*2 / {model['rate'] / 1e12:.1f} TFLOP/s; "
          f"per tree level inside a node {model['level_intra'] * 1e3:.1f} ms (bcast + reduce); "
          f"between nodes assumed {a.net_gbs:g} GB/s, {a.net_us:g} us, {a.gpus_per_node} GPUs per node")
    print("| kind | ranks | n | local s | comm s | total s | speed-up / efficiency | source |")
    print("|---|---|---|---|---|---|---|---|")
    out = dict(model=model, assumptions=dict(net_gbs=a.net_gbs, net_us=a.net_us, gpus_per_node=a.gpus_per_node),
               strong=[], weak=[], measured=rows)
    t1 = project(model, n, nq, a.d, a.k, 1, a.gpus_per_node, a.net_gbs, a.net_us)[2]
    for P in ranks:
        s, c, t = project(model, n, nq, a.d, a.k, P, a.gpus_per_node, a.net_gbs, a.net_us)
        print(f"| strong | {P} | {n / 1e6:g}M | {s:.3f} | {c:.4f} | {t:.3f} | {t1 / t:.2f}x | model |")
        out["strong"].append(dict(ranks=P, n=n, search_s=s, comm_s=c, total_s=t, speedup=t1 / t))
    w1 = project(model, wn, nq, a.d, a.k, 1, a.gpus_per_node, a.net_gbs, a.net_us)[2]
    for P in ranks:
        s, c, t = project(model, wn * P, nq, a.d, a.k, P, a.gpus_per_node, a.net_gbs, a.net_us)
        print(f"| weak | {P} | {P} x {wn / 1e6:g}M | {s:.3f} | {c:.4f} | {t:.3f} | {w1 / t:.3f} | model |")
        out["weak"].append(dict(ranks=P, n=wn * P, search_s=s, comm_s=c, total_s=t, efficiency=w1 / t))
    for r in rows:
        s, c, t = project(model, r["n"], r["nq"], r["d"], r["k"], r["ranks"], a.gpus_per_node, a.net_gbs, a.net_us)
        loc = r["total"] - r["bcast"] - r["reduce"]
        print(f"| {r['scaling']} | {r['ranks']} | {r['n'] / 1e6:g}M | {loc:.3f} (model {s:.3f}) | "
              f"{r['bcast'] + r['reduce']:.4f} (model {c:.4f}) | {r['total']:.3f} | | measured, {r['commit']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
