"""Small GGUF files for unit tests, written with gguf-py."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def write_gguf(path: Path, arch: str, kvs: dict | None = None, tensors: dict | None = None) -> Path:
    """`kvs`: key -> python value (int -> u32, float -> f32, str, bool, list);
    `tensors`: name -> numpy array (f32/f16) or (bytes array, GGMLQuantizationType)."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in (kvs or {}).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    for name, t in (tensors or {}).items():
        if isinstance(t, tuple):
            w.add_tensor(name, t[0], raw_dtype=t[1])
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def bf16(a: np.ndarray) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """`a` stored as BF16 (truncated), for GGUFWriter."""
    raw = (np.asarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return raw, gguf.GGMLQuantizationType.BF16
