# SPDX-License-Identifier: MIT
"""xknn.read against files NumPy writes, and xknn.write_result's layouts."""

import gzip
import struct

import numpy as np
import pytest

import xknn

RNG = np.random.default_rng(3)


def texmex(path, a):
    with open(path, "wb") as f:
        for row in a:
            f.write(struct.pack("<i", a.shape[1]))
            f.write(row.tobytes())


def bigann(path, a):
    with open(path, "wb") as f:
        f.write(struct.pack("<II", *a.shape))
        f.write(a.tobytes())


def idx(path, a, code, opener=open):
    with opener(path, "wb") as f:
        f.write(bytes([0, 0, code, a.ndim]))
        for s in a.shape:
            f.write(struct.pack(">I", s))
        f.write(a.astype(a.dtype.newbyteorder(">")).tobytes())


def data(dtype, shape=(17, 5)):
    if np.dtype(dtype).kind == "f":
        return RNG.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return RNG.integers(max(info.min, -1000), min(info.max, 1000), size=shape).astype(dtype)


@pytest.mark.parametrize("ext,dtype,writer", [
    ("fvecs", np.float32, texmex), ("ivecs", np.int32, texmex), ("bvecs", np.uint8, texmex),
    ("fbin", np.float32, bigann), ("u8bin", np.uint8, bigann), ("i8bin", np.int8, bigann),
    ("ibin", np.int32, bigann), ("bin", np.float32, bigann)])
def test_formats(tmp_path, ext, dtype, writer):
    a = data(dtype)
    path = tmp_path / f"x.{ext}"
    writer(path, a)
    got = xknn.read(path)
    native = {np.float32: np.float32, np.uint8: np.uint8, np.int8: np.int8, np.int32: np.float32}
    assert got.dtype == native[dtype] and got.shape == a.shape
    np.testing.assert_array_equal(got, a.astype(got.dtype))
    np.testing.assert_array_equal(xknn.read(path, dtype=np.float32), a.astype(np.float32))


def test_bin_dtype(tmp_path):
    a = data(np.uint8)
    bigann(tmp_path / "x.bin", a)
    np.testing.assert_array_equal(xknn.read(tmp_path / "x.bin", bin_dtype=np.uint8), a)
    h = data(np.float16)
    bigann(tmp_path / "h.bin", h)
    got = xknn.read(tmp_path / "h.bin", bin_dtype="float16")
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, h)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint8, np.int8, np.int32, np.int64,
                                   np.float64, np.int16])
def test_npy(tmp_path, dtype):
    a = data(dtype)
    np.save(tmp_path / "x.npy", a)
    got = xknn.read(tmp_path / "x.npy")
    np.testing.assert_array_equal(got, a.astype(got.dtype))
    if dtype in (np.float32, np.float16, np.uint8, np.int8):
        assert got.dtype == dtype


def test_npy_gz_and_1d(tmp_path):
    a = data(np.float32)
    with gzip.open(tmp_path / "x.npy.gz", "wb") as f:
        np.save(f, a)
    np.testing.assert_array_equal(xknn.read(tmp_path / "x.npy.gz"), a)
    np.save(tmp_path / "v.npy", a[:, 0])
    assert xknn.read(tmp_path / "v.npy").shape == (17, 1)


@pytest.mark.parametrize("code,dtype", [(0x08, np.uint8), (0x09, np.int8), (0x0B, np.int16),
                                        (0x0C, np.int32), (0x0D, np.float32), (0x0E, np.float64)])
def test_idx(tmp_path, code, dtype):
    a = data(dtype, (6, 4, 3))
    idx(tmp_path / "train-images-idx3-ubyte", a, code)
    got = xknn.read(tmp_path / "train-images-idx3-ubyte")
    np.testing.assert_array_equal(got, a.reshape(6, 12).astype(got.dtype))
    idx(tmp_path / "t.idx.gz", a, code, opener=gzip.open)
    np.testing.assert_array_equal(xknn.read(tmp_path / "t.idx.gz"), got)


def test_read_errors(tmp_path):
    with pytest.raises(OSError, match="nope.fvecs"):
        xknn.read(tmp_path / "nope.fvecs")
    (tmp_path / "x.weird").write_bytes(b"1234")
    with pytest.raises(ValueError, match="unknown file extension"):
        xknn.read(tmp_path / "x.weird")
    bigann(tmp_path / "t.fbin", data(np.float32))
    with open(tmp_path / "t.fbin", "ab") as f:
        f.write(b"xx")
    with pytest.raises(ValueError, match="does not match header"):
        xknn.read(tmp_path / "t.fbin")
    a = data(np.float32)
    a[4, 2] = np.nan
    bigann(tmp_path / "n.fbin", a)
    with pytest.raises(ValueError, match="row 4 column 2"):
        xknn.read(tmp_path / "n.fbin")
    np.save(tmp_path / "big.npy", np.array([[2 ** 40 + 1]], dtype=np.int64))
    with pytest.raises(ValueError):
        xknn.read(tmp_path / "big.npy")


def test_fashion_mnist_idx_gz():
    import os
    path = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
    if not os.path.exists(path):
        pytest.skip("dataset-fashion-mnist is not installed")
    with gzip.open(path, "rb") as f:
        raw = f.read()
    want = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(10000, 784)
    got = xknn.read(path)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)


def test_write_result(tmp_path):
    ids, dist = xknn.search(RNG.integers(0, 4, size=(50, 3)).astype(np.float32), k=4)
    xknn.write_result(tmp_path / "r.bin", ids, dist)
    raw = (tmp_path / "r.bin").read_bytes()
    nq, k = struct.unpack("<II", raw[:8])
    assert (nq, k) == (50, 4) and len(raw) == 8 + 50 * 4 * 8
    np.testing.assert_array_equal(np.frombuffer(raw, "<i4", 200, 8).reshape(50, 4), ids)
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4", 200, 808).reshape(50, 4), dist)
    xknn.write_result(tmp_path / "r.ivecs", ids)
    iv = np.fromfile(tmp_path / "r.ivecs", "<i4").reshape(50, 5)
    assert (iv[:, 0] == 4).all()
    np.testing.assert_array_equal(iv[:, 1:], ids)
    xknn.write_result(tmp_path / "r64.bin", ids, dist, fmt="bin64")
    raw = (tmp_path / "r64.bin").read_bytes()
    np.testing.assert_array_equal(np.frombuffer(raw, "<i8", 200, 8).reshape(50, 4), ids)
    with pytest.raises(ValueError):
        xknn.write_result(tmp_path / "bad.bin", ids + 2 ** 31, dist)
    assert not (tmp_path / "bad.bin").exists()
    with pytest.raises(ValueError):
        xknn.write_result(tmp_path / "nodist.bin", ids)
