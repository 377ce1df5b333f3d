# SPDX-License-Identifier: MIT
"""GPU arrays searched in place (PyTorch, CuPy); skipped without CUDA and the library."""

import numpy as np
import pytest

import xknn
from xknn import _gpu


def device_libs():
    libs = []
    if xknn.backends()["cuda_devices"] < 1:
        return libs
    try:
        import torch
        if torch.cuda.is_available():
            libs.append("torch")
    except ImportError:
        pass
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            libs.append("cupy")
    except Exception:
        pass
    return libs


LIBS = device_libs()
needs_gpu = pytest.mark.skipif(not LIBS, reason="no CUDA device with PyTorch or CuPy")


def to_device(a, lib):
    if lib == "torch":
        import torch
        return torch.from_numpy(a).cuda()
    import cupy
    return cupy.asarray(a)


def to_host(a, lib):
    return a.cpu().numpy() if lib == "torch" else a.get()


def test_host_arrays_are_not_gpu_arrays():
    assert not _gpu.is_gpu_array(np.zeros((2, 2), dtype=np.float32))

    class FakeCuda:  # a CUDA DLPack exporter (device type 2) is taken as a GPU array
        def __dlpack_device__(self):
            return (2, 0)

    class FakeCpu:
        def __dlpack_device__(self):
            return (1, 0)

    class FakeCai:
        __cuda_array_interface__ = {"shape": (2, 2), "typestr": "<f4", "data": (0, False), "version": 3}

    assert _gpu.is_gpu_array(FakeCuda()) and not _gpu.is_gpu_array(FakeCpu())
    assert _gpu.is_gpu_array(FakeCai())


@needs_gpu
@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("metric", ["l2", "euclidean"])
def test_device_search_equals_host(lib, metric):
    rng = np.random.default_rng(5)
    R = rng.integers(0, 4, size=(5000, 32)).astype(np.float32)
    Q = rng.integers(0, 4, size=(300, 32)).astype(np.float32)
    ids, dist = xknn.search(to_device(R, lib), to_device(Q, lib), k=10, metric=metric)
    assert type(ids).__module__.split(".")[0] == lib  # results stay on the device
    hi, hd = xknn.search(R, Q, k=10, metric=metric, backend="cpu")
    np.testing.assert_array_equal(to_host(ids, lib), hi)
    np.testing.assert_array_equal(to_host(dist, lib), hd)
    gi, gd = xknn.search(to_device(R, lib), None, k=5, metric=metric)
    np.testing.assert_array_equal(to_host(gi, lib), xknn.search(R, None, k=5, metric=metric, backend="cpu")[0])


def cudart():
    import ctypes
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    return None


@pytest.mark.skipif(xknn.backends()["cuda_devices"] < 1, reason="no CUDA device")
def test_device_entry_point_with_raw_pointers():
    # xknn._xknn.cuda_search on cudaMalloc'ed memory: no array library needed
    import ctypes
    rt = cudart()
    if rt is None:
        pytest.skip("libcudart not found")
    rng = np.random.default_rng(9)
    R = rng.integers(0, 4, size=(4096, 24)).astype(np.float32)
    Q = rng.integers(0, 4, size=(100, 24)).astype(np.float32)
    k = 8
    ctx = _gpu._context(0)[0]
    ws_bytes = xknn._xknn.cuda_workspace_size(ctx, "l2", len(R), len(Q), R.shape[1], k)
    ptrs = []

    def dalloc(nbytes):
        p = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(nbytes)) == 0
        ptrs.append(p)
        return p

    try:
        rp, qp = dalloc(R.nbytes), dalloc(Q.nbytes)
        ip, dp, wp = dalloc(len(Q) * k * 8), dalloc(len(Q) * k * 4), dalloc(ws_bytes)
        assert rt.cudaMemcpy(rp, R.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(R.nbytes), 1) == 0
        assert rt.cudaMemcpy(qp, Q.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(Q.nbytes), 1) == 0
        xknn._xknn.cuda_search(ctx, "l2", rp.value, len(R), R.shape[1], qp.value, len(Q), k, ip.value, dp.value,
                               wp.value, ws_bytes, 0)
        assert rt.cudaDeviceSynchronize() == 0
        ids = np.empty((len(Q), k), dtype=np.int64)
        dist = np.empty((len(Q), k), dtype=np.float32)
        assert rt.cudaMemcpy(ids.ctypes.data_as(ctypes.c_void_p), ip, ctypes.c_size_t(ids.nbytes), 2) == 0
        assert rt.cudaMemcpy(dist.ctypes.data_as(ctypes.c_void_p), dp, ctypes.c_size_t(dist.nbytes), 2) == 0
    finally:
        for p in ptrs:
            rt.cudaFree(p)
    hi, hd = xknn.search(R, Q, k=k, backend="cpu")
    np.testing.assert_array_equal(ids, hi)
    np.testing.assert_array_equal(dist, hd)


@needs_gpu
@pytest.mark.parametrize("lib", LIBS)
def test_device_errors(lib):
    R = to_device(np.zeros((100, 4), dtype=np.float32), lib)
    with pytest.raises(ValueError, match="float32"):
        xknn.search(to_device(np.zeros((100, 4)), lib), k=1)
    with pytest.raises(ValueError, match="dimension mismatch"):
        xknn.search(R, to_device(np.zeros((3, 5), dtype=np.float32), lib), k=1)
    with pytest.raises(ValueError):
        xknn.search(R, k=100)
    with pytest.raises(ValueError):
        xknn.search(R, k=1, metric="l1")
