#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Plots and aggregates the JSON written by bench_knn, bench_scaling and peers_torch.py.

Usage: plot.py [--out DIR] FILE.json [FILE.json ...]

A file holds one program's run ({"program": ..., "meta": ..., "rows": [...]}) or a list
of such runs (benchmarks/device_run.sh merges them). Writes PNG files into --out
(default: the current directory):
  knn_time_vs_k.png, knn_time_vs_d.png, knn_time_vs_n.png   bench_knn rows (log-log)
  scaling_strong.png, scaling_weak.png                         bench_scaling total time
                                                               with the ideal line
  peers.png                                                    xknn vs peers, queries/s
and prints the scaling efficiencies (benchmarks/README.md defines them):
  strong  E(p) = T(1) / (p * T(p)),  T = median total_ms, same global n
  weak    E(p) = T(1) / T(p),        same n per rank
Without matplotlib it prints the tables and skips the plots.
"""
import argparse
import os
import sys
from collections import defaultdict

from bench_util import json_runs


def load(paths):
    runs = []
    for p, run in json_runs(paths):
        if isinstance(run, dict) and "rows" in run:
            run.setdefault("meta", {})
            run["_file"] = p
            runs.append(run)
    return runs


def knn_rows(runs):
    out = []
    for run in runs:
        if run.get("program") != "bench_knn":
            continue
        for r in run["rows"]:
            if r.get("status") == "ok" and r.get("time_ms"):
                out.append(r)
    return out


def label_of(r):
    return f"{r['backend']} {r['path']} {r['mode']}"


def sweep_groups(rows, var):
    """rows grouped by everything but `var` (and the timings); groups with 2+ values of var"""
    fixed = [f for f in ("n", "nq", "d", "k") if f != var]
    groups = defaultdict(dict)
    for r in rows:
        key = tuple(r[f] for f in fixed) + (label_of(r),)
        groups[key][r[var]] = r["time_ms"]  # a later run of the same configuration wins
    return fixed, {k: v for k, v in groups.items() if len(v) >= 2}


def scaling_series(runs):
    """{(scaling, backend, n or n_per_rank, nq, d, k): {ranks: total_ms}}"""
    series = defaultdict(dict)
    for run in runs:
        if run.get("program") != "bench_scaling":
            continue
        m = run["meta"]
        scaling = m.get("scaling", "strong")
        for r in run["rows"]:
            if r.get("status") != "ok" or not r.get("total_ms"):
                continue
            size = m["n"] if scaling == "strong" else m["n_per_rank"]
            key = (scaling, m.get("backend", "?"), size, r["nq"], r["d"], r["k"])
            series[key][r["ranks"]] = r["total_ms"]
    return series


def efficiencies(series):
    table = []
    for key, pts in sorted(series.items()):
        scaling = key[0]
        if 1 not in pts:
            continue
        t1 = pts[1]
        for p in sorted(pts):
            e = t1 / (p * pts[p]) if scaling == "strong" else t1 / pts[p]
            table.append((key, p, pts[p], e))
    return table


def peer_groups(runs):
    """{(n, d, k): {label: queries_per_s}} over xknn rows and peer rows"""
    groups = defaultdict(dict)
    for run in runs:
        prog = run.get("program")
        for r in run["rows"]:
            if not r.get("time_ms") or r.get("status") not in ("ok", "inexact"):
                continue
            qps = r["nq"] / (r["time_ms"] * 1e-3)
            if prog == "bench_knn":
                name = f"xknn {r['backend']} {r['path']} {r['mode']}"
            elif prog == "peers_torch":
                name = r["impl"] + (" (inexact)" if r["status"] == "inexact" else "")
            else:
                continue
            groups[(r["n"], r["d"], r["k"])][name] = qps
    return {k: v for k, v in groups.items() if any(not n.startswith("xknn") for n in v)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".", help="directory for the PNG files")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    runs = load(args.files)
    rows = knn_rows(runs)
    series = scaling_series(runs)
    eff = efficiencies(series)
    if eff:
        print(f"{'scaling':7s} {'backend':7s} {'n_or_n_per_rank':>15s} {'nq':>7s} {'d':>5s} {'k':>6s} "
              f"{'ranks':>5s} {'total_ms':>10s} {'efficiency':>10s}")
        for key, p, t, e in eff:
            print(f"{key[0]:7s} {key[1]:7s} {key[2]:15d} {key[3]:7d} {key[4]:5d} {key[5]:6d} {p:5d} {t:10.3f} {e:10.3f}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: matplotlib is not importable: plots skipped")
        return 0
    os.makedirs(args.out, exist_ok=True)
    written = []

    def save(name, fig):
        """Lays fig out, writes it as OUT/name (120 dpi), closes it and notes its path."""
        fig.tight_layout()
        path = os.path.join(args.out, name)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    for var in ("k", "d", "n"):
        fixed, groups = sweep_groups(rows, var)
        if not groups:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for key, pts in sorted(groups.items()):
            xs = sorted(pts)
            lab = ", ".join(f"{f}={v}" for f, v in zip(fixed, key[:-1])) + f" [{key[-1]}]"
            ax.plot(xs, [pts[x] for x in xs], marker="o", label=lab)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(var)
        ax.set_ylabel("time_ms (median)")
        ax.set_title(f"bench_knn: time vs {var}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        save(f"knn_time_vs_{var}.png", fig)

    for scaling in ("strong", "weak"):
        sel = {k: v for k, v in series.items() if k[0] == scaling and 1 in v and len(v) >= 2}
        if not sel:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for key, pts in sorted(sel.items()):
            ps = sorted(pts)
            size_name = "n" if scaling == "strong" else "n/rank"
            line = ax.plot(ps, [pts[p] for p in ps], marker="o",
                           label=f"{key[1]} {size_name}={key[2]} nq={key[3]} d={key[4]} k={key[5]}")[0]
            ideal = [pts[1] / p for p in ps] if scaling == "strong" else [pts[1] for p in ps]
            ax.plot(ps, ideal, linestyle="--", color=line.get_color(), alpha=0.6)
        ax.set_xlabel("ranks")
        ax.set_ylabel("total_ms (median, max over ranks)")
        ax.set_xticks(sorted({p for v in sel.values() for p in v}))
        ax.set_title(f"bench_scaling: {scaling} scaling (dashed: ideal)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        save(f"scaling_{scaling}.png", fig)

    groups = peer_groups(runs)
    if groups:
        keys = sorted(groups)
        fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 4.5), squeeze=False)
        for ax, key in zip(axes[0], keys):
            names = sorted(groups[key], key=lambda s: (not s.startswith("xknn"), s))
            vals = [groups[key][nm] for nm in names]
            colors = ["tab:blue" if nm.startswith("xknn") else "tab:gray" for nm in names]
            ax.barh(range(len(names)), vals, color=colors)
            ax.set_yticks(range(len(names)))
            ax.set_yticklabels(names, fontsize=7)
            for i, v in enumerate(vals):
                ax.text(v, i, f" {v:.3g}", va="center", fontsize=7)
            ax.set_xlim(0, max(vals) * 1.25)
            ax.set_xlabel("queries_per_s")
            ax.set_title(f"n={key[0]} d={key[1]} k={key[2]}", fontsize=9)
            ax.grid(True, axis="x", alpha=0.3)
        fig.suptitle("xknn vs peers (higher is better)")
        save("peers.png", fig)

    for p in written:
        print(f"wrote {p}")
    if not written:
        print("plot.py: nothing to plot (no sweeps with two or more points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
