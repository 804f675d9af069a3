"""The shared core of the legacy writers: GGUF files laid out the way
Ollama's `fs/ggml/gguf.go` WriteGGUF wrote them (KVs sorted by key, tensors
`blk.N.*` by block number first, then the rest by name; alignment 32 and no
`general.alignment` key), and seeded weights."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Sequence

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
Dims = dict[str, Any]     # a writer's widths and settings, by name


V = gguf.GGUFValueType

def kv_type(value: Any) -> tuple[V, V | None]:
    if isinstance(value, bool):
        return V.BOOL, None
    if isinstance(value, np.uint32):
        return V.UINT32, None
    if isinstance(value, int):
        return V.UINT32, None
    if isinstance(value, float):
        return V.FLOAT32, None
    if isinstance(value, str):
        return V.STRING, None
    if isinstance(value, (list, tuple)):
        first = value[0]
        if isinstance(first, bool):
            return V.ARRAY, V.BOOL
        if isinstance(first, int):
            return V.ARRAY, V.INT32
        if isinstance(first, float):
            return V.ARRAY, V.FLOAT32
        return V.ARRAY, V.STRING
    raise TypeError(f"unsupported KV value {value!r}")


def ollama_tensor_order(names: Iterable[str]) -> list[str]:
    def key(n: str):
        m = re.match(r"blk\.(\d+)\.", n)
        return (0, int(m.group(1)), n) if m else (1, 0, n)
    return sorted(names, key=key)


def write(path: Path, arch: str, kvs: dict[str, Any], tensors: dict[str, tuple[np.ndarray, T]],
           *, ollama_order: bool) -> Path:
    """kvs: key -> value (int -> u32, float -> f32, list of int -> i32 array);
    tensors: name -> (numpy array in HF layout, stored dtype).  With ollama_order the
    keys are written sorted and the tensors in WriteGGUF's block order; otherwise
    in insertion order (gguf-py script style, general.architecture first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.kv_data[0].clear()
    items = dict(kvs)
    items["general.architecture"] = arch
    keys = sorted(items) if ollama_order else ["general.architecture"] + [k for k in kvs if k != "general.architecture"]
    for k in keys:
        vtype, sub = kv_type(items[k])
        w.add_key_value(k, list(items[k]) if vtype == V.ARRAY else items[k], vtype, sub_type=sub)
    names = ollama_tensor_order(tensors) if ollama_order else list(tensors)
    for name in names:
        arr, dtype = tensors[name]
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if dtype == T.F32:
            w.add_tensor(name, arr)
        elif dtype == T.F16:
            w.add_tensor(name, arr.astype(np.float16))
        elif dtype == T.BF16:
            w.add_tensor(name, gguf.quants.quantize(arr, T.BF16), raw_dtype=T.BF16)
        else:
            raise ValueError(dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def normal(rng: np.random.Generator, shape: Sequence[int], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)

