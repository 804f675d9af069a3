"""Reading a blob's KVs with their types checked: what predicates and edits
use, so that a value of the wrong type (a string where a count belongs, a
nested array, NaN) gives a verdict or a `GGUFError` naming the key, never
another exception."""

from __future__ import annotations

import math
from typing import TypeGuard

import numpy as np

from ..format.header import SourceGGUF
from ..errors import GGUFError
from ..format.values import VT, Value

INTEGERS = (VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.UINT64, VT.INT64)
NUMBERS = INTEGERS + (VT.FLOAT32, VT.FLOAT64)


def describe(value: Value | None) -> str:
    """What `value` is, in a few words (for error messages; never its contents)."""
    if value is None:
        return "absent"
    etype = value.element_type
    if etype is None:  # a scalar or a string
        if value.vtype == VT.STRING:
            return "a string"
        return f"{value.vtype.name} {value.decode()!r}"
    return f"an array of {value.count} {etype.name}" if etype != VT.ARRAY else f"a nested array of {value.count}"


def scalar(value: Value | None):
    """The decoded value of a scalar or string KV; None for an array or no value."""
    return None if value is None or value.vtype == VT.ARRAY else value.decode()


def whole(value: Value | None) -> int | None:
    """The value of an integer KV (bool excluded); None for anything else."""
    return value.decode() if value is not None and value.vtype in INTEGERS else None


def finite(value: Value | None) -> float | None:
    """The value of a numeric KV when it is a finite number; None otherwise."""
    if value is None or value.vtype not in NUMBERS:
        return None
    x = value.decode()
    return x if math.isfinite(x) else None


def is_integer_array(value: Value | None) -> TypeGuard[Value]:
    return value is not None and value.element_type in INTEGERS


def integer_array(key: str, value: Value) -> np.ndarray:
    """The elements of the integer array `value` of KV `key` (int64 when they
    fit, else uint64); GGUFError naming the key for anything else."""
    if not is_integer_array(value):
        raise GGUFError(f"{key} is {describe(value)}, not an array of integers")
    return value.decode()


def layers_held(src: SourceGGUF, tensor: str, n: int) -> np.ndarray:
    """Of layers 0..n-1, those i for which the blob holds tensor
    `tensor.format(i)` (a per-layer array's length is read from the header:
    only the blocks the blob holds are looked at, never n of them)."""
    held = np.zeros(n, dtype=bool)
    prefix = tensor.partition("{}")[0]
    for i in src.block_ids(prefix):
        if i < n and tensor.format(i) in src.tensors:
            held[i] = True
    return held


__all__ = [
    "describe",
    "scalar",
    "whole",
    "finite",
    "is_integer_array",
    "integer_array",
    "layers_held",
    "INTEGERS",
    "NUMBERS",
]
