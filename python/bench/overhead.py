"""Python's calling overhead on a search: xknn.search against the same xknn_search call
from C (overhead.c), alternating, each REPEAT times; prints both medians and the ratio.

    python overhead.py PATH/TO/overhead REF QUERY [K [REPEAT]]
"""

import statistics
import subprocess
import sys
import time

import xknn


def main():
    exe, ref_path, query_path = sys.argv[1:4]
    k = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    repeat = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    ref, query = xknn.read(ref_path), xknn.read(query_path)
    py_t, c_t = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        xknn.search(ref, query, k=k)
        py_t.append(time.perf_counter() - t0)
        out = subprocess.run([exe, ref_path, query_path, str(k), "1"], check=True, capture_output=True, text=True)
        c_t.append(float(out.stdout.split()[0]))
    py_m, c_m = statistics.median(py_t), statistics.median(c_t)
    print(f"# {ref.shape[0]} x {query.shape[0]} x {ref.shape[1]} {ref.dtype}, k={k}, {repeat} runs each")
    print(f"python xknn.search  s: {' '.join(f'{t:.3f}' for t in py_t)}  median {py_m:.3f}")
    print(f"C xknn_search       s: {' '.join(f'{t:.3f}' for t in c_t)}  median {c_m:.3f}")
    print(f"overhead: {100 * (py_m - c_m) / c_m:+.2f}% of the C time")


if __name__ == "__main__":
    main()
