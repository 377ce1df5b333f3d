#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""GPU peers of xknn on the same data: PyTorch brute force k-NN, self-checked.

Reads PREFIX.ref.fbin and PREFIX.query.fbin (big-ann layout: uint32 n, uint32 d, float32
rows), as written by `bench_knn --write-data PREFIX`, and times on the GPU:
  mm       fp32 |q|^2 + |x|^2 - 2 q.x with torch.addmm (TF32 off), then torch.topk
  cdist    torch.cdist (Euclidean), then torch.topk
  mm-tf32  as mm with TF32 tensor cores allowed (optional: --methods mm,cdist,mm-tf32)
in blocks of queries so that one block's distance matrix stays under --block-bytes.
Each row: warm-up, then the median of --repeats, timed with torch.cuda.Event around the
whole search (data already on the device, as in bench_knn's device-resident rows).

Check (#wrong): for --sample queries spread over the query set, the float32 distances
of the returned ids, recomputed in float64 and rounded to float32, sorted, must equal
the k smallest such distances over all references; a query with any difference (or an
invalid or repeated id) counts once. Peers are not exact by design: a nonzero #wrong
marks the row "inexact" and does not fail the run.

With --xknn-json (bench_knn JSON files) each row also shows xknn_speedup = xknn
queries/s / peer queries/s, against the fastest passing xknn CUDA device-resident row of
the same n, d, k (and the same nq when there is one).

--cpu adds faiss-cpu (IndexFlatL2) and scikit-learn (brute force) rows on the first
--cpu-nq queries when those packages can be imported (skipped otherwise).
--device cpu runs the torch methods on the CPU (for testing without a GPU).

Usage: peers_torch.py --data PREFIX [--k 10,100] [--repeats 5] [--json out.json]
                      [--xknn-json bench.json] [--cpu]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

from bench_util import read_json, runs_of


def read_fbin(path, rows=None):
    with open(path, "rb") as f:
        n, d = (int(v) for v in np.fromfile(f, dtype="<u4", count=2))
    size = os.path.getsize(path)
    if size != 8 + 4 * n * d:
        sys.exit(f"{path}: size {size} bytes does not match header n={n} d={d}")
    take = n if rows is None else min(rows, n)
    x = np.fromfile(path, dtype="<f4", count=take * d, offset=8).reshape(take, d)
    return np.ascontiguousarray(x, dtype=np.float32), n


def set_tf32(torch, on):
    """TF32 for float32 matmuls on or off: the fp32_precision setting (PyTorch >= 2.9),
    else the older allow_tf32 flag. Returns the name of the setting used."""
    m = torch.backends.cuda.matmul
    try:  # older versions raise AssertionError (not AttributeError) for unknown names
        if "fp32_precision" in dir(m) or hasattr(m, "fp32_precision"):
            m.fp32_precision = "tf32" if on else "ieee"
            return "fp32_precision"
    except Exception:
        pass
    m.allow_tf32 = on
    return "allow_tf32"


def sample_index(s, S, nq):
    return 0 if S <= 1 or nq <= 1 else s * (nq - 1) // (S - 1)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="PREFIX of PREFIX.ref.fbin and PREFIX.query.fbin")
    ap.add_argument("--k", default="10", help="comma-separated k values (default 10)")
    ap.add_argument("--n", type=int, help="use the first N references (default: all)")
    ap.add_argument("--nq", type=int, help="use the first NQ queries (default: all)")
    ap.add_argument("--methods", default="mm,cdist", help="mm,cdist,mm-tf32 (default mm,cdist)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--sample", type=int, default=20)
    ap.add_argument("--block-bytes", type=float, default=2 * 2**30,
                    help="bytes of one block's distance matrix (default 2 GiB)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--cpu", action="store_true", help="also faiss-cpu and scikit-learn, if importable")
    ap.add_argument("--cpu-nq", type=int, default=1000, help="queries for the CPU peers (default 1000)")
    ap.add_argument("--cpu-threads", type=int, default=os.cpu_count())
    ap.add_argument("--xknn-json", action="append", default=[], help="bench_knn JSON for the speedup column")
    ap.add_argument("--json", help="write the metadata and rows here")
    ap.add_argument("--label", default="", help="free text stored with the rows (e.g. W1)")
    args = ap.parse_args()
    ks = [int(v) for v in args.k.split(",")]
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in ("mm", "cdist", "mm-tf32"):
            sys.exit(f"peers_torch: unknown method {m!r} (mm, cdist, mm-tf32)")

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    x_np, n_file = read_fbin(args.data + ".ref.fbin", args.n)
    q_np, nq_file = read_fbin(args.data + ".query.fbin", args.nq)
    n, d = x_np.shape
    nq = q_np.shape[0]
    if q_np.shape[1] != d:
        sys.exit(f"dimension mismatch: ref has d={d}, query has d={q_np.shape[1]}")
    ks = [k for k in ks if 1 <= k <= n]
    if not ks:
        sys.exit("peers_torch: no k in 1..n")
    kmax = max(ks)
    S = min(args.sample, nq)
    sidx = [sample_index(s, S, nq) for s in range(S)]

    meta = dict(program="peers_torch", date=date, data=args.data, n=n, nq=nq, d=d, ks=ks, repeats=args.repeats,
                warmup=args.warmup, sample=S, label=args.label, cpu=cpu_model(), cpu_threads=args.cpu_threads,
                python=platform.python_version(), numpy=np.__version__)
    print(f"# peers_torch: {args.data}.{{ref,query}}.fbin n={n} (file {n_file}) nq={nq} (file {nq_file}) d={d} "
          f"k={','.join(map(str, ks))} {args.label}")
    print(f"# date {date}; cpu: {meta['cpu']}, {os.cpu_count()} cores; python {meta['python']}, numpy {np.__version__}")

    rows = []
    errors = 0
    try:
        import torch
    except ImportError:
        torch = None
        print("# torch is not importable: GPU peers skipped")

    exact_cache = {}

    def exact_topk_np(qidx, kk):
        """exact sorted k smallest float32 distances (float64 math) of queries qidx, on the host"""
        key = ("np", tuple(qidx), kk)
        if key not in exact_cache:
            out = np.empty((len(qidx), kk), dtype=np.float32)
            for i, qi in enumerate(qidx):
                q64 = q_np[qi].astype(np.float64)
                dd = np.empty(n, dtype=np.float32)
                for c0 in range(0, n, 1 << 16):
                    diff = x_np[c0:c0 + (1 << 16)].astype(np.float64) - q64
                    dd[c0:c0 + (1 << 16)] = np.einsum("ij,ij->i", diff, diff)
                out[i] = np.sort(np.partition(dd, kk - 1)[:kk])
            exact_cache[key] = out
        return exact_cache[key]

    def check_np(ids, qidx, rowsel, kk):
        """count sampled queries whose returned ids' sorted exact distances differ from the exact top k"""
        want = exact_topk_np(qidx, kk)
        bad = 0
        for i, qi in enumerate(qidx):
            got = np.asarray(ids[rowsel[i]][:kk], dtype=np.int64)
            if got.min() < 0 or got.max() >= n or len(np.unique(got)) != kk:
                bad += 1
                continue
            diff = x_np[got].astype(np.float64) - q_np[qi].astype(np.float64)
            dd = np.sort(np.einsum("ij,ij->i", diff, diff).astype(np.float32))
            bad += int(not np.array_equal(dd, want[i]))
        return bad

    if torch is not None:
        dev = torch.device(args.device)
        use_cuda = dev.type == "cuda"
        if use_cuda and not torch.cuda.is_available():
            sys.exit("peers_torch: CUDA is not available to torch (use --device cpu to test on the CPU)")
        meta["tf32_setting"] = set_tf32(torch, False)
        meta["torch"] = torch.__version__
        meta["torch_cuda"] = getattr(torch.version, "cuda", None)
        if use_cuda:
            props = torch.cuda.get_device_properties(dev)
            meta["device"] = f"{props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.1f} GiB"
        else:
            meta["device"] = "cpu (torch)"
        print(f"# torch {torch.__version__} (CUDA {meta['torch_cuda']}), device: {meta['device']}")
        x = torch.from_numpy(x_np).to(dev)
        q = torch.from_numpy(q_np).to(dev)

        # exact reference of the sampled queries: float64 distances rounded to float32
        t0 = time.perf_counter()
        D32 = torch.empty((S, n), dtype=torch.float32, device=dev)
        chunk = max(1, int(2**28 // (8 * d)))
        for s, qi in enumerate(sidx):
            q64 = q[qi].double()
            for c0 in range(0, n, chunk):
                diff = x[c0:c0 + chunk].double() - q64
                D32[s, c0:c0 + chunk] = (diff * diff).sum(dim=1).float()
        exact_vals = torch.topk(D32, kmax, dim=1, largest=False, sorted=True).values
        if use_cuda:
            torch.cuda.synchronize()
        print(f"# exact reference of {S} sampled queries (float64 on {dev.type}) in {time.perf_counter() - t0:.2f} s")
        sidx_t = torch.tensor(sidx, dtype=torch.int64, device=dev)

        def check_t(ids, kk):
            got = ids[sidx_t, :kk]
            bad = (got < 0) | (got >= n)
            gs = torch.sort(got.clamp(0, n - 1), dim=1).values
            dup = (gs[:, 1:] == gs[:, :-1]).any(dim=1) if kk > 1 else torch.zeros(S, dtype=torch.bool, device=dev)
            dd = torch.sort(torch.gather(D32, 1, got.clamp(0, n - 1)), dim=1).values
            diff = (dd != exact_vals[:, :kk]).any(dim=1)
            return int((bad.any(dim=1) | dup | diff).sum().item())

        row_bytes = 4 * n
        qb = int(max(1, min(nq, args.block_bytes // row_bytes)))

        def search(method, kk, out):
            set_tf32(torch, method == "mm-tf32")
            try:
                if method in ("mm", "mm-tf32"):
                    xn = (x * x).sum(dim=1)
                    qn = (q * q).sum(dim=1)
                for q0 in range(0, nq, qb):
                    qq = q[q0:q0 + qb]
                    if method == "cdist":
                        dist = torch.cdist(qq, x)
                    else:
                        dist = torch.addmm(xn.unsqueeze(0), qq, x.t(), beta=1.0, alpha=-2.0)
                        dist.add_(qn[q0:q0 + qb].unsqueeze(1))
                    out[q0:q0 + qb] = torch.topk(dist, kk, dim=1, largest=False, sorted=True).indices
                    del dist
            finally:
                set_tf32(torch, False)

        for method in methods:
            for kk in ks:
                name = f"torch-{method}"
                try:
                    out = torch.full((nq, kk), -1, dtype=torch.int64, device=dev)
                    for _ in range(args.warmup):
                        search(method, kk, out)
                    times = []
                    for r in range(args.repeats):
                        if r == args.repeats - 1:
                            out.fill_(-1)
                        if use_cuda:
                            e0 = torch.cuda.Event(enable_timing=True)
                            e1 = torch.cuda.Event(enable_timing=True)
                            e0.record()
                            search(method, kk, out)
                            e1.record()
                            e1.synchronize()
                            times.append(e0.elapsed_time(e1))
                        else:
                            t0 = time.perf_counter()
                            search(method, kk, out)
                            times.append(1e3 * (time.perf_counter() - t0))
                    wrong = check_t(out, kk)
                    rows.append(dict(impl=name, n=n, nq=nq, d=d, k=kk, times_ms=times,
                                     time_ms=statistics.median(times), min_ms=min(times), wrong=wrong, sampled=S,
                                     query_block=qb, status="ok" if wrong == 0 else "inexact"))
                    del out
                except Exception as e:  # a peer that fails (e.g. out of memory) is reported, not fatal
                    errors += 1
                    rows.append(dict(impl=name, n=n, nq=nq, d=d, k=kk, times_ms=[], time_ms=None, min_ms=None,
                                     wrong=None, sampled=S, query_block=qb, status="ERROR",
                                     error=f"{type(e).__name__}: {e}"))
                    if use_cuda:
                        torch.cuda.empty_cache()
        del x, q, D32

    if args.cpu:
        cnq = min(args.cpu_nq, nq)
        qc = np.ascontiguousarray(q_np[:cnq])
        Sc = min(args.sample, cnq)
        cidx = [sample_index(s, Sc, cnq) for s in range(Sc)]
        peers = []
        try:
            import faiss
            faiss.omp_set_num_threads(args.cpu_threads)
            index = faiss.IndexFlatL2(d)
            index.add(x_np)
            peers.append((f"faiss-cpu-{faiss.__version__}", lambda kk: index.search(qc, kk)[1]))
            meta["faiss"] = faiss.__version__
        except ImportError:
            print("# faiss is not importable: faiss-cpu skipped")
        try:
            import sklearn
            from sklearn.neighbors import NearestNeighbors
            nn = NearestNeighbors(algorithm="brute", metric="euclidean", n_jobs=args.cpu_threads).fit(x_np)
            peers.append((f"sklearn-{sklearn.__version__}-brute",
                          lambda kk: nn.kneighbors(qc, n_neighbors=kk, return_distance=False)))
            meta["sklearn"] = sklearn.__version__
        except ImportError:
            print("# scikit-learn is not importable: sklearn skipped")
        for name, fn in peers:
            for kk in ks:
                try:
                    times = []
                    for _ in range(max(1, min(args.repeats, 3))):
                        t0 = time.perf_counter()
                        ids = fn(kk)
                        times.append(1e3 * (time.perf_counter() - t0))
                    wrong = check_np(ids, cidx, cidx, kk)
                    rows.append(dict(impl=name, n=n, nq=cnq, d=d, k=kk, times_ms=times,
                                     time_ms=statistics.median(times), min_ms=min(times), wrong=wrong, sampled=Sc,
                                     threads=args.cpu_threads, status="ok" if wrong == 0 else "inexact"))
                except Exception as e:
                    errors += 1
                    rows.append(dict(impl=name, n=n, nq=cnq, d=d, k=kk, times_ms=[], time_ms=None, min_ms=None,
                                     wrong=None, sampled=Sc, status="ERROR", error=f"{type(e).__name__}: {e}"))

    # xknn rows for the speedup column
    xrows = []
    for path in args.xknn_json:
        doc = read_json(path)
        if doc is None:
            continue
        for run in runs_of(doc):
            for r in run.get("rows", []):
                on_device = r.get("backend") == "cuda" and r.get("mode") == "device"
                on_cpu = args.device == "cpu" and r.get("backend") == "cpu"  # testing without a GPU
                if (on_device or on_cpu) and r.get("status") == "ok" and r.get("time_ms"):
                    xrows.append(r)

    def best_xknn(r):
        cands = [x for x in xrows if x["n"] == r["n"] and x["d"] == r["d"] and x["k"] == r["k"]]
        same = [x for x in cands if x["nq"] == r["nq"]]
        cands = same or cands
        if not cands:
            return None
        return max(cands, key=lambda x: x["nq"] / x["time_ms"])

    print(f"#{'impl':>27s} {'n':>9s} {'nq':>7s} {'d':>5s} {'k':>6s} {'time_ms':>10s} {'min_ms':>10s} "
          f"{'queries_per_s':>13s} {'eff_TFLOPs':>10s} {'#wrong':>6s} {'status':>8s} {'xknn_path':>10s} "
          f"{'xknn_speedup':>12s}")
    for r in rows:
        if r["time_ms"]:
            r["queries_per_s"] = r["nq"] / (r["time_ms"] * 1e-3)
            r["eff_TFLOPs"] = 2.0 * r["n"] * r["nq"] * r["d"] / (r["time_ms"] * 1e-3) / 1e12
        else:
            r["queries_per_s"] = r["eff_TFLOPs"] = None
        bx = best_xknn(r) if r["time_ms"] else None
        r["xknn_path"] = bx["path"] if bx else None
        r["xknn_time_ms"] = bx["time_ms"] if bx else None
        r["xknn_nq"] = bx["nq"] if bx else None
        r["xknn_speedup"] = (bx["nq"] / (bx["time_ms"] * 1e-3)) / r["queries_per_s"] if bx else None

        def f(v, fmt):
            width = int("".join(ch for ch in fmt.split(".")[0] if ch.isdigit()) or 0)
            return "-".rjust(width) if v is None else format(v, fmt)

        print(f" {r['impl']:>27s} {r['n']:9d} {r['nq']:7d} {r['d']:5d} {r['k']:6d} {f(r['time_ms'], '10.3f')} "
              f"{f(r['min_ms'], '10.3f')} {f(r['queries_per_s'], '13.1f')} {f(r['eff_TFLOPs'], '10.3f')} "
              f"{f(r['wrong'], '6d')} {r['status']:>8s} {f(r['xknn_path'], '>10s')} {f(r['xknn_speedup'], '12.2f')}")
        if r.get("error"):
            print(f"# row above: {r['error']}")
    if errors:
        print(f"# FAIL: {errors} peer rows failed to run")
    else:
        print("# PASS (peers ran; #wrong of peers is informational)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"program": "peers_torch", "meta": meta, "rows": rows, "pass": errors == 0}, fh, indent=1)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
