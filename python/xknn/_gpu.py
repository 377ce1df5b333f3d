# SPDX-License-Identifier: MIT
"""GPU arrays searched in place with the library's device entry point (xknn/cuda.h).

PyTorch CUDA tensors and CuPy arrays are read where they are; another CUDA array is
taken without a copy through CuPy (cupy.asarray for __cuda_array_interface__, which
waits for the stream the interface names; cupy.from_dlpack for __dlpack__), else
PyTorch (torch.as_tensor, torch.from_dlpack), and the results are arrays of that
library. Inputs: C-contiguous float32 (n, d) on one device; metric l2 or euclidean (ip and
cosine where the tensor-core path applies, else ValueError with the library's reason).
The search is enqueued on the array library's current stream of that device
(torch.cuda.current_stream, cupy.cuda.get_current_stream): work the caller queued there
before runs first, and the results (ids int64, dist float32, of the same library on the
same device) are ready for later work on that stream; the call does not wait for the
device. The workspace comes from the library's allocator on that stream. GPU inputs are
not scanned for NaN/Inf (the device entry point does not; such rows give unspecified
neighbours). One context per device is made on first use and kept for the process.
"""

import threading

from . import _xknn

_contexts = {}
_lock = threading.Lock()
_ALIGN = 256  # the workspace's alignment (xknn_cuda_search)


def _kind(x):
    """'torch', 'cupy', 'cai' (__cuda_array_interface__), 'dlpack' or None."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        return "torch" if getattr(x, "is_cuda", False) else None
    if mod == "cupy":
        return "cupy"
    if hasattr(x, "__cuda_array_interface__"):
        return "cai"
    dev = getattr(x, "__dlpack_device__", None)
    if dev is not None and not hasattr(x, "__array_interface__"):
        try:
            return "dlpack" if int(dev()[0]) in (2, 3) else None  # kDLCUDA, kDLCUDAHost
        except Exception:
            return None
    return None


def is_gpu_array(x):
    return _kind(x) is not None


def _adopt(x):
    """(array of torch or cupy, library name)."""
    kind = _kind(x)
    if kind in ("torch", "cupy"):
        return x, kind
    try:
        import cupy
        return (cupy.asarray(x) if kind == "cai" else cupy.from_dlpack(x)), "cupy"
    except ImportError:
        import torch
        return (torch.as_tensor(x, device="cuda") if kind == "cai" else torch.from_dlpack(x)), "torch"


def _describe(a, lib, what):
    """(pointer, rows, cols, device ordinal) of a C-contiguous float32 2-D array."""
    if lib == "torch":
        import torch
        ok = a.dtype == torch.float32 and a.dim() == 2 and a.is_contiguous()
        ptr, dev = a.data_ptr(), a.device.index
    else:
        import cupy
        ok = a.dtype == cupy.float32 and a.ndim == 2 and a.flags.c_contiguous
        ptr, dev = a.data.ptr, a.device.id
    if not ok:
        raise ValueError(f"{what}: GPU arrays must be C-contiguous float32 (n, d); got "
                         f"{a.dtype} with shape {tuple(a.shape)}")
    return ptr, int(a.shape[0]), int(a.shape[1]), int(dev)


def _context(device):
    with _lock:
        if device not in _contexts:
            _contexts[device] = (_xknn.cuda_context(device), threading.Lock())
        return _contexts[device]


def _empty(lib, shape, dtype_name, device):
    if lib == "torch":
        import torch
        return torch.empty(shape, dtype=getattr(torch, dtype_name), device=f"cuda:{device}")
    import cupy
    with cupy.cuda.Device(device):
        return cupy.empty(shape, dtype=dtype_name)


def _stream(lib, device):
    if lib == "torch":
        import torch
        return int(torch.cuda.current_stream(device).cuda_stream)
    import cupy
    with cupy.cuda.Device(device):
        return int(cupy.cuda.get_current_stream().ptr)


def _ptr(a, lib):
    return a.data_ptr() if lib == "torch" else a.data.ptr


def search(ref, query, k, metric):
    """(ids, dist) on the device of ref; see the module's description."""
    metric = str(metric)
    r, lib = _adopt(ref)
    rp, n, d, dev = _describe(r, lib, "reference")
    qp, nq = 0, n
    if query is not None:
        if not is_gpu_array(query):
            raise ValueError("query is a host array and the references a GPU array: put both on one device")
        q, qlib = _adopt(query)
        if qlib != lib:
            raise ValueError(f"reference is a {lib} array, query a {qlib} array: use one library")
        qp, nq, dq, qdev = _describe(q, lib, "query")
        if qdev != dev:
            raise ValueError(f"reference is on cuda:{dev}, query on cuda:{qdev}")
        if dq != d:
            raise ValueError(f"dimension mismatch: reference has d={d}, query has d={dq}")
    if k < 1:
        raise ValueError(f"k={k}: need k >= 1")
    ctx, lock = _context(dev)
    with lock:  # a context serves one host thread at a time
        bytes_ = _xknn.cuda_workspace_size(ctx, metric, n, nq, d, k)
        ids = _empty(lib, (nq, k), "int64", dev)
        dist = _empty(lib, (nq, k), "float32", dev)
        ws = _empty(lib, (bytes_ + _ALIGN,), "uint8", dev)
        wp = _ptr(ws, lib)
        wp += (-wp) % _ALIGN
        _xknn.cuda_search(ctx, metric, rp, n, d, qp, nq, k, _ptr(ids, lib), _ptr(dist, lib), wp, bytes_,
                          _stream(lib, dev))
        # the workspace returns to the allocator in stream order: later allocations on
        # this stream run after the search
        del ws
    return ids, dist
