"""Python's calling overhead on a search: xknn.search against the same xknn_search call
from C (overhead.c), alternating, each REPEAT times; prints the medians of wall and
process CPU seconds and their ratios (and of the best runs: on a loaded machine the
best of several runs is the estimate least disturbed by other work), and the fixed cost of one call (a 1 x 1 search)
for the Python layer and C.

    python overhead.py PATH/TO/overhead REF QUERY [K [REPEAT [BACKEND]]]
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
    backend = sys.argv[6] if len(sys.argv) > 6 else "auto"
    ref, query = xknn.read(ref_path), xknn.read(query_path)
    py_t, py_c, c_t, c_c = [], [], [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        xknn.search(ref, query, k=k, backend=backend)
        py_t.append(time.perf_counter() - t0)
        py_c.append(time.process_time() - c0)
        out = subprocess.run([exe, ref_path, query_path, str(k), "1", backend], check=True, capture_output=True, text=True)
        wall, cpu = out.stdout.split()[:2]
        c_t.append(float(wall))
        c_c.append(float(cpu))
    med = statistics.median
    print(f"# {ref.shape[0]} x {query.shape[0]} x {ref.shape[1]} {ref.dtype}, k={k}, backend {backend}, "
          f"{repeat} runs each, alternating")
    print(f"python xknn.search wall s: {' '.join(f'{t:.3f}' for t in py_t)}  median {med(py_t):.3f}  "
          f"cpu median {med(py_c):.3f}")
    print(f"C xknn_search      wall s: {' '.join(f'{t:.3f}' for t in c_t)}  median {med(c_t):.3f}  "
          f"cpu median {med(c_c):.3f}")
    print(f"python/C - 1: wall median {100 * (med(py_t) / med(c_t) - 1):+.2f}%, wall best "
          f"{100 * (min(py_t) / min(c_t) - 1):+.2f}%, cpu median {100 * (med(py_c) / med(c_c) - 1):+.2f}%")
    tiny = ref[:1]
    calls = 2000
    t0 = time.perf_counter()
    for _ in range(calls):
        xknn.search(tiny, tiny, k=1, backend=backend)
    per_call = (time.perf_counter() - t0) / calls
    print(f"one 1 x 1 xknn.search call: {1e6 * per_call:.1f} us "
          f"({100 * per_call / med(c_t):.5f}% of the C search above)")


if __name__ == "__main__":
    main()
