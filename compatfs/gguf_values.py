"""GGUF metadata values: one encoded value, decoded only when somebody asks.

A `Value` holds the bytes that follow a key in a GGUF header (the type tag and
its payload).  Values read from a blob are slices of the blob's memory map, so
a KV that no handler touches is carried to the translated header as a byte
span and never decoded.
"""
from __future__ import annotations

import array as _arr
import bisect
import struct
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from gguf import GGUFValueType as VT

__all__ = ["VT", "Value", "GGUFError", "u32", "i32", "f32", "boolean", "string", "array"]


class GGUFError(ValueError):
    """A GGUF file that cannot be read; the message names what is wrong."""


_SCALAR = {
    VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h",
    VT.UINT32: "<I", VT.INT32: "<i", VT.FLOAT32: "<f", VT.BOOL: "<?",
    VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d",
}
_NUMPY = {
    VT.UINT8: "<u1", VT.INT8: "<i1", VT.UINT16: "<u2", VT.INT16: "<i2",
    VT.UINT32: "<u4", VT.INT32: "<i4", VT.FLOAT32: "<f4", VT.BOOL: "?",
    VT.UINT64: "<u8", VT.INT64: "<i8", VT.FLOAT64: "<f8",
}
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def _vtype(raw: int, where: str) -> VT:
    try:
        return VT(raw)
    except ValueError:
        raise GGUFError(f"unknown GGUF value type {raw} at {where}") from None


def string_starts(buf, off: int, count: int, end: int, base: int = 0) -> tuple[_arr.array, int]:
    """Offsets (less `base`) of `count` length-prefixed strings starting at
    `off`, and the offset just past the last one."""
    if count > (end - off) // 8:
        raise GGUFError("string array runs past the end of the file")
    unpack = _U64.unpack_from
    starts = _arr.array("Q")
    add = starts.append
    try:
        for _ in range(count):
            add(off - base)
            off += 8 + unpack(buf, off)[0]
    except struct.error:
        raise GGUFError("string array runs past the end of the file") from None
    if off > end:
        raise GGUFError("string array runs past the end of the file")
    return starts, off


def skip_value(buf: memoryview, off: int, vtype: VT, end: int) -> int:
    """Offset just past the payload of a value of type `vtype` at `off`."""
    if vtype in _SCALAR:
        off += struct.calcsize(_SCALAR[vtype])
    elif vtype == VT.STRING:
        if off + 8 > end:
            raise GGUFError("string runs past the end of the file")
        off += 8 + _U64.unpack_from(buf, off)[0]
    else:  # ARRAY
        if off + 12 > end:
            raise GGUFError("array header runs past the end of the file")
        etype = _vtype(_U32.unpack_from(buf, off)[0], f"offset {off}")
        count = _U64.unpack_from(buf, off + 4)[0]
        off += 12
        if etype == VT.STRING:
            off = string_starts(buf, off, count, end)[1]
        elif etype == VT.ARRAY:
            for _ in range(count):
                off = skip_value(buf, off, VT.ARRAY, end)
        else:
            off += count * struct.calcsize(_SCALAR[etype])
    if off > end:
        raise GGUFError("value runs past the end of the file")
    return off


@dataclass(frozen=True)
class Value:
    """One encoded GGUF value: `vtype` and the payload bytes that follow the tag."""

    vtype: VT
    payload: bytes | memoryview = field(repr=False)
    # For a string array: offset in `payload` of each element (see `strings`).
    starts: _arr.array | None = field(default=None, repr=False, compare=False)

    @classmethod
    def strings(cls, payload: bytes | memoryview) -> "Value":
        """A string array value with its element offsets recorded."""
        count = _U64.unpack_from(payload, 4)[0]
        return cls(VT.ARRAY, payload, string_starts(payload, 12, count, len(payload))[0])

    def _starts(self) -> _arr.array:
        return self.starts if self.starts is not None else Value.strings(self.payload).starts

    # -- inspection ------------------------------------------------------
    @property
    def element_type(self) -> VT | None:
        return VT(_U32.unpack_from(self.payload, 0)[0]) if self.vtype == VT.ARRAY else None

    @property
    def count(self) -> int:
        """Number of elements of an array value (1 for a scalar)."""
        return _U64.unpack_from(self.payload, 4)[0] if self.vtype == VT.ARRAY else 1

    def decode(self) -> Any:
        """The Python value: int/float/bool/str, a list of str, or a numpy array."""
        p = self.payload
        if self.vtype in _SCALAR:
            return struct.unpack_from(_SCALAR[self.vtype], p, 0)[0]
        if self.vtype == VT.STRING:
            return bytes(p[8:8 + _U64.unpack_from(p, 0)[0]]).decode("utf-8", "replace")
        etype, n = self.element_type, self.count
        if etype == VT.STRING:
            return [s for s in self.iter_strings()]
        if etype == VT.ARRAY:
            raise GGUFError("nested arrays are not decoded")
        return np.frombuffer(p, dtype=_NUMPY[etype], count=n, offset=12)

    def iter_strings(self):
        """The strings of a string array, in order."""
        p, off = self.payload, 12
        for _ in range(self.count):
            n = _U64.unpack_from(p, off)[0]
            yield bytes(p[off + 8:off + 8 + n]).decode("utf-8", "replace")
            off += 8 + n

    def string_at(self, index: int) -> str | None:
        """Element `index` of a string array, or None if there is none."""
        if self.element_type != VT.STRING or index >= self.count:
            return None
        off = self._starts()[index]
        n = _U64.unpack_from(self.payload, off)[0]
        return bytes(self.payload[off + 8:off + 8 + n]).decode("utf-8", "replace")

    def indices_of(self, texts: set[str]) -> dict[str, int]:
        """Index of the first element equal to each of `texts` in a string array."""
        if self.element_type != VT.STRING:
            return {}
        data, starts, found = bytes(self.payload), self._starts(), {}
        for text in texts:
            raw = text.encode("utf-8")
            needle = _U64.pack(len(raw)) + raw
            pos = data.find(needle)
            while pos >= 0:   # a match must start an element, not sit inside one
                i = bisect.bisect_left(starts, pos)
                if i < len(starts) and starts[i] == pos:
                    found[text] = i
                    break
                pos = data.find(needle, pos + 1)
        return found

    def truncated(self, n: int) -> "Value":
        """The first `n` elements of an array value (itself if it is not longer)."""
        if self.vtype != VT.ARRAY or n >= self.count:
            return self
        etype = self.element_type
        if etype == VT.STRING:
            starts = self._starts()
            end = starts[n]
        elif etype in _SCALAR:
            end = 12 + n * struct.calcsize(_SCALAR[etype])
        else:
            raise GGUFError("nested arrays cannot be truncated")
        head = _U32.pack(etype) + _U64.pack(n)
        if etype == VT.STRING:
            return Value(VT.ARRAY, head + bytes(self.payload[12:end]), starts[:n])
        return Value(VT.ARRAY, head + bytes(self.payload[12:end]))


# -- constructors for handler tables -------------------------------------------

def _scalar(vtype: VT, v: Any) -> Value:
    try:
        return Value(vtype, struct.pack(_SCALAR[vtype], v))
    except struct.error:   # a value computed from a blob's numbers, out of range
        raise GGUFError(f"{v!r} does not fit a GGUF {vtype.name.lower()}") from None


def u32(v: int) -> Value:
    return _scalar(VT.UINT32, v)


def i32(v: int) -> Value:
    return _scalar(VT.INT32, v)


def f32(v: float) -> Value:
    return _scalar(VT.FLOAT32, v)


def boolean(v: bool) -> Value:
    return _scalar(VT.BOOL, v)


def _str_payload(s: str) -> bytes:
    b = s.encode("utf-8")
    return _U64.pack(len(b)) + b


def string(s: str) -> Value:
    return Value(VT.STRING, _str_payload(s))


def array(etype: VT, items: Sequence[Any]) -> Value:
    """An array of `etype` (strings or numbers)."""
    head = _U32.pack(etype) + _U64.pack(len(items))
    if etype == VT.STRING:
        body = b"".join(_str_payload(s) for s in items)
    else:
        body = np.asarray(items, dtype=_NUMPY[etype]).tobytes()
    return Value(VT.ARRAY, head + body)
