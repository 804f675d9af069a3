"""Comparing a mounted view with llama.cpp's own conversion of the same weights."""

import gguf
import numpy as np
from gguf import GGMLQuantizationType as DT


def as_f32(t) -> np.ndarray:
    data = np.asarray(t.data)
    if t.tensor_type == DT.BF16:
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(-1)
    return gguf.quants.dequantize(data, t.tensor_type).astype(np.float32).reshape(-1)


def tolerance(a: DT, b: DT) -> float:
    """Relative rounding of the narrower of two dtypes."""
    if DT.BF16 in (a, b):
        return 2.0**-8
    if DT.F16 in (a, b):
        return 2.0**-11
    return 1e-7


def assert_same_tensors(mounted, upstream) -> None:
    mine = {t.name: t for t in gguf.GGUFReader(mounted).tensors}
    ref = {t.name: t for t in gguf.GGUFReader(upstream).tensors}
    assert sorted(mine) == sorted(ref)
    for name, r in ref.items():
        m = mine[name]
        assert list(m.shape) == list(r.shape), name
        a, b = as_f32(m), as_f32(r)
        rtol = tolerance(m.tensor_type, r.tensor_type) * 1.01
        np.testing.assert_allclose(a, b, rtol=rtol, atol=2.0**-24 * 4, err_msg=name)


def assert_same_gguf(mounted, upstream) -> None:
    """Every KV and tensor of `upstream` in `mounted` and no other: the same
    values, shapes and ggml types."""
    assert kvs(mounted) == kvs(upstream)
    assert_same_tensors(mounted, upstream)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(mounted).tensors}
    assert types == {t.name: t.tensor_type for t in gguf.GGUFReader(upstream).tensors}


def kvs(path) -> dict:
    """The KVs of a GGUF file, less the GGUF.* and general.* ones."""
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith(("GGUF.", "general."))}


def tensors(path) -> dict:
    """The tensors of a GGUF file by name (gguf-py's ReaderTensor)."""
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def shapes(path) -> dict:
    """ggml shapes by tensor name."""
    return {name: tuple(int(x) for x in t.shape) for name, t in tensors(path).items()}
