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
