# SPDX-License-Identifier: MIT
"""Python's calling overhead on a search: xknn.search against the same xknn_search call
from C (overhead.c), alternating, each REPEAT times; prints the medians of wall and
process CPU seconds and their ratios (and of the best runs: on a loaded machine the
best of several runs is the estimate least disturbed by other work), and the fixed cost of one call (a 1 x 1 search)
for the Python layer and C.

    python overhead.py PATH/TO/overhead REF QUERY [K [REPEAT [BACKEND]]]

With PATH/TO/overhead.so beside the program (overhead.c built with -shared -fPIC
-DXKNN_OVERHEAD_LIB), the C call also runs inside this process through ctypes on the
same arrays, alternating with xknn.search: the comparison least disturbed by the rest of
the machine.
"""

import ctypes
import os
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
    so = exe + ".so"
    if os.path.exists(so):
        in_process(so, ref, query, k, backend, repeat)
    tiny = ref[:1]
    calls = 2000
    t0 = time.perf_counter()
    for _ in range(calls):
        xknn.search(tiny, tiny, k=1, backend=backend)
    per_call = (time.perf_counter() - t0) / calls
    print(f"one 1 x 1 xknn.search call: {1e6 * per_call:.1f} us "
          f"({100 * per_call / med(c_t):.5f}% of the C search above)")


def in_process(so, ref, query, k, backend, repeat):
    import numpy as np
    lib = ctypes.CDLL(so)
    fn = lib.xknn_overhead_search
    fn.restype = ctypes.c_double
    i64, vp, cp = ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p
    fn.argtypes = [vp, i64, vp, i64, i64, cp, i64, cp, vp, vp]
    ids = np.empty((query.shape[0], k), dtype=np.int64)
    dist = np.empty((query.shape[0], k), dtype=np.float32)
    name = {"float32": b"f32", "float16": b"f16", "uint8": b"u8", "int8": b"i8"}[str(ref.dtype)]
    py_t, c_t = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        got = xknn.search(ref, query, k=k, backend=backend)
        py_t.append(time.perf_counter() - t0)
        c = fn(ref.ctypes.data, ref.shape[0], query.ctypes.data, query.shape[0], ref.shape[1], name, k,
               backend.encode(), ids.ctypes.data, dist.ctypes.data)
        assert c > 0 and np.array_equal(ids, got[0]) and np.array_equal(dist, got[1])
        c_t.append(c)
    med = statistics.median
    print(f"in one process (ctypes), {repeat} runs each, alternating, same results:")
    print(f"python xknn.search wall s: {' '.join(f'{t:.3f}' for t in py_t)}  median {med(py_t):.3f}")
    print(f"C xknn_search      wall s: {' '.join(f'{t:.3f}' for t in c_t)}  median {med(c_t):.3f}")
    print(f"python/C - 1: wall median {100 * (med(py_t) / med(c_t) - 1):+.2f}%, wall best "
          f"{100 * (min(py_t) / min(c_t) - 1):+.2f}%")


if __name__ == "__main__":
    main()
