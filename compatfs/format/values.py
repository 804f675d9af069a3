"""GGUF metadata values: one encoded value, decoded only when somebody asks.

A `Value` holds the bytes that follow a key in a GGUF header (the type tag and
its payload).  Values read from a blob are slices of the copy of its header
that `SourceGGUF` keeps, so a KV that no handler touches is carried to the
translated header as a byte span and never decoded.
"""

from __future__ import annotations

import array as _arr
import bisect
import struct
import threading
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Sequence

import numpy as np
from cachetools import LRUCache
from gguf import GGUFValueType as VT

from ..errors import GGUFError

__all__ = ["VT", "Value", "PastTheEnd", "u32", "i32", "f32", "boolean", "string", "array"]


class PastTheEnd(GGUFError):
    """A value, name or array of a header runs past the end of the bytes it
    was read from.  `SourceGGUF` reads a header in growing prefixes of the
    blob and reads more on this error, and on no other."""


_SCALAR = {
    VT.UINT8: "<B",
    VT.INT8: "<b",
    VT.UINT16: "<H",
    VT.INT16: "<h",
    VT.UINT32: "<I",
    VT.INT32: "<i",
    VT.FLOAT32: "<f",
    VT.BOOL: "<?",
    VT.UINT64: "<Q",
    VT.INT64: "<q",
    VT.FLOAT64: "<d",
}
_NUMPY = {
    VT.UINT8: "<u1",
    VT.INT8: "<i1",
    VT.UINT16: "<u2",
    VT.INT16: "<i2",
    VT.UINT32: "<u4",
    VT.INT32: "<i4",
    VT.FLOAT32: "<f4",
    VT.BOOL: "?",
    VT.UINT64: "<u8",
    VT.INT64: "<i8",
    VT.FLOAT64: "<f8",
}
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def _vtype(raw: int, where: str) -> VT:
    try:
        return VT(raw)
    except ValueError:
        raise GGUFError(f"unknown GGUF value type {raw} at {where}") from None


_BULK_MIN = 256  # shorter string arrays: the plain walk beats numpy's per-call overhead
_CHUNK = 1 << 17  # bytes scanned for guessed starts at a time (small temporaries: faster)
_PATIENCE = 32  # strings the bulk walk must take per round, on average, to go on
_HEAD = 64  # bytes at the start of an array that key the remembered layouts
_remembered: LRUCache = LRUCache(maxsize=8 << 20, getsizeof=lambda e: len(e[0]) + 8 * len(e[2]))
_remembered_lock = threading.Lock()


def string_starts(buf, off: int, count: int, end: int, base: int = 0) -> tuple[_arr.array, int]:
    """Offsets (less `base`) of `count` length-prefixed strings starting at
    `off`, and the offset just past the last one (GGUFError if they do not fit
    before `end`).

    The result is exactly that of the plain walk `_walk` (each start is the
    previous one + 8 + the u64 length stored there), which takes tens of ms
    for a 262k-token vocabulary.  Two shortcuts, each exact:

    - a layout remembered from an earlier call (an LRU bounded in bytes) is
      reused when the bytes it spans are identical here: the walk reads
      nothing else, so it would repeat itself step for step;
    - otherwise `_bulk_walk` guesses starts with numpy and keeps a guess only
      where it is what the walk's next step gives (see there).

    Tiny arrays and unusual arguments (base > off) take the plain walk.
    """
    if count > (end - off) // 8:
        raise PastTheEnd("string array runs past the end of the file")
    if count < _BULK_MIN or not 0 <= base <= off:
        return _walk(buf, off, count, end, base)
    mem = np.frombuffer(buf, np.uint8)
    hi = min(end, mem.size)  # an array that fits lies in mem[off:hi]
    key = (count, mem[off : off + _HEAD].tobytes())
    with _remembered_lock:
        seen = _remembered.get(key)
    if seen is not None:
        raw, delta, starts = seen
        # (startswith of a slice as long as `raw` is equality, without a copy)
        if off + len(raw) <= hi and raw.startswith(mem.data[off : off + len(raw)]):
            return _shifted(starts, off - base - delta), off + len(raw)
    starts, pos = _bulk_walk(buf, mem, off, count, end, base)
    with _remembered_lock:
        if pos - off + 8 * count <= _remembered.maxsize:
            _remembered[key] = (mem[off:pos].tobytes(), off - base, starts)
    return _arr.array("Q", starts), pos


def _shifted(starts: _arr.array, by: int) -> _arr.array:
    """A copy of `starts` with `by` added to each (the results stay >= 0)."""
    if not by:
        return _arr.array("Q", starts)
    out = _arr.array("Q")
    out.frombytes((np.frombuffer(starts, np.uint64).astype(np.int64) + by).astype(np.uint64).data.cast("B"))
    return out


def _bulk_walk(buf, mem: np.ndarray, off: int, count: int, end: int, base: int) -> tuple[_arr.array, int]:
    """The walk of `string_starts`, many steps at a time.

    In each chunk of the buffer `_candidates` guesses starts and marks where
    a guess is not followed by the guess the walk's next step gives.  From a
    known start that is a guess, the unbroken chain of guesses after it is
    taken whole: by induction each is the walk's next step (read in full and
    in bounds).  A known start that is no guess advances by one step of the
    walk itself.  Once a length field does not lie inside buf[:end], or when
    the guesses do not pay (hostile or unusual data: few strings taken per
    round), the plain walk `_walk` goes on from there and returns or raises
    as the walk does.
    """
    hi = min(end, mem.size)
    parts, pos, left, top, rounds = [], off, count, -1, 0
    while left and pos + 8 <= hi:
        rounds += 1
        if rounds > 64 and rounds * _PATIENCE > count - left:
            break
        if pos + 16 > top:
            top = min(hi, pos + max(64, min(_CHUNK, 32 * left)))
            cand, brk = _candidates(mem, pos, top)
        i = int(cand.searchsorted(pos))
        if i < cand.size and cand[i] == pos:
            j = int(brk[brk.searchsorted(i)])  # the last guess of the chain from i
            take = min(j + 1 - i, left)
            parts.append(cand[i : i + take])
            left -= take
            pos = int(cand[i + take - 1])
        else:
            parts.append(np.array([pos], np.int64))
            left -= 1
        pos += 8 + _U64.unpack_from(buf, pos)[0]
    starts = _arr.array("Q")
    if parts:
        starts.frombytes((np.concatenate(parts) - base).astype(np.uint64).data.cast("B"))
    if left:
        rest, pos = _walk(buf, pos, left, end, base)
        starts.extend(rest)
    elif pos > end:
        raise PastTheEnd("string array runs past the end of the file")
    return starts, pos


def _candidates(mem: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Guessed string starts in mem[lo:hi] (absolute, ascending, each with its
    length field inside) and the indices where a chain of guesses breaks: the
    last index, and each `k` where guess k + 1 is not guess k + 8 + the u64
    at guess k (a length >= 2**62 never links: it would leave any buffer).

    A guess is the last nonzero byte of a 4-byte word followed by a zero word
    (a short length's high bytes); how guesses are made does not matter for
    exactness, only how many of the true starts they hit."""
    chunk = np.array(mem[lo : lo + (hi - lo) // 4 * 4])  # an aligned copy: numpy is slow on unaligned data
    if chunk.size < 16:
        none = np.zeros(0, np.int64)
        return none, np.array([-1])
    w = chunk.view("<u4")
    z = np.flatnonzero(w[1:-2] == 0)
    low = w[z]
    cand = 4 * z + (low > 0xFF) + (low > 0xFFFF) + (low > 0xFFFFFF)
    length = np.ndarray((chunk.size - 7,), "<u8", chunk, 0, (1,))[cand]
    succ = cand + 8 + np.minimum(length, 1 << 62).astype(np.int64)
    brk = np.append(np.flatnonzero(cand[1:] != succ[:-1]), cand.size - 1)
    return cand + lo, brk


def _walk(buf, off: int, count: int, end: int, base: int) -> tuple[_arr.array, int]:
    """The plain walk (after the count check): one struct read per string."""
    unpack = _U64.unpack_from
    starts = _arr.array("Q")
    add = starts.append
    try:
        for _ in range(count):
            add(off - base)
            off += 8 + unpack(buf, off)[0]
    except struct.error:
        raise PastTheEnd("string array runs past the end of the file") from None
    if off > end:
        raise PastTheEnd("string array runs past the end of the file")
    return starts, off


MAX_NESTING = 8  # arrays of arrays deeper than this are refused (llama.cpp reads none at all)


def skip_value(buf: memoryview, off: int, vtype: VT, end: int, depth: int = 0) -> int:
    """Offset just past the payload of a value of type `vtype` at `off`."""
    if vtype in _SCALAR:
        off += struct.calcsize(_SCALAR[vtype])
    elif vtype == VT.STRING:
        if off + 8 > end:
            raise PastTheEnd("string runs past the end of the file")
        off += 8 + _U64.unpack_from(buf, off)[0]
    else:  # ARRAY
        if off + 12 > end:
            raise PastTheEnd("array header runs past the end of the file")
        etype = _vtype(_U32.unpack_from(buf, off)[0], f"offset {off}")
        count = _U64.unpack_from(buf, off + 4)[0]
        off += 12
        if etype == VT.STRING:
            off = string_starts(buf, off, count, end)[1]
        elif etype == VT.ARRAY:
            if depth >= MAX_NESTING:
                raise GGUFError(f"arrays nested more than {MAX_NESTING} deep")
            if count > (end - off) // 12:
                raise PastTheEnd("array runs past the end of the file")
            for _ in range(count):
                off = skip_value(buf, off, VT.ARRAY, end, depth + 1)
        else:
            off += count * struct.calcsize(_SCALAR[etype])
    if off > end:
        raise PastTheEnd("value runs past the end of the file")
    return off


@dataclass(frozen=True)
class Value:
    """One encoded GGUF value: `vtype` and the payload bytes that follow the tag."""

    vtype: VT
    payload: bytes | memoryview = field(repr=False)
    # For a string array: offset in `payload` of each element (see `strings`).
    starts: _arr.array | None = field(default=None, repr=False, compare=False)

    @classmethod
    def strings(cls, payload: bytes | memoryview) -> Value:
        """A string array value with its element offsets recorded."""
        return cls(VT.ARRAY, payload, _element_starts(payload))

    def _starts(self) -> _arr.array:
        return self.starts if self.starts is not None else _element_starts(self.payload)

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
        etype = self.element_type
        if etype is None:  # a scalar or a string
            if self.vtype == VT.STRING:
                return bytes(p[8 : 8 + _U64.unpack_from(p, 0)[0]]).decode("utf-8", "replace")
            return struct.unpack_from(_SCALAR[self.vtype], p, 0)[0]
        n = self.count
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
            yield bytes(p[off + 8 : off + 8 + n]).decode("utf-8", "replace")
            off += 8 + n

    def string_at(self, index: int) -> str | None:
        """Element `index` of a string array, or None if there is none."""
        if self.element_type != VT.STRING or index >= self.count:
            return None
        off = self._starts()[index]
        n = _U64.unpack_from(self.payload, off)[0]
        return bytes(self.payload[off + 8 : off + 8 + n]).decode("utf-8", "replace")

    def indices_of(self, texts: set[str]) -> dict[str, int]:
        """Index of the first element equal to each of `texts` in a string array."""
        if self.element_type != VT.STRING:
            return {}
        data, starts, found = bytes(self.payload), self._starts(), {}
        for text in texts:
            raw = text.encode("utf-8")
            needle = _U64.pack(len(raw)) + raw
            pos = data.find(needle)
            while pos >= 0:  # a match must start an element, not sit inside one
                i = bisect.bisect_left(starts, pos)
                if i < len(starts) and starts[i] == pos:
                    found[text] = i
                    break
                pos = data.find(needle, pos + 1)
        return found

    def with_items(self, items: Sequence[Any] | np.ndarray) -> Value:
        """An array of this array's element type holding `items`; GGUFError
        for a value that is not an array."""
        etype = self.element_type
        if etype is None:
            raise GGUFError(f"a {self.vtype.name.lower()} has no elements to replace")
        return array(etype, items)

    def truncated(self, n: int) -> Value:
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


def _element_starts(payload: bytes | memoryview) -> _arr.array:
    """The element offsets of the string array in `payload` (see `string_starts`)."""
    count = _U64.unpack_from(payload, 4)[0]
    return string_starts(payload, 12, count, len(payload))[0]


# -- constructors for handler tables -------------------------------------------


def _scalar(vtype: VT, v: Any) -> Value:
    try:
        return Value(vtype, struct.pack(_SCALAR[vtype], v))
    except struct.error:  # a value computed from a blob's numbers, out of range
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


def array(etype: VT, items: Sequence[Any] | np.ndarray) -> Value:
    """An array of `etype` (strings or numbers)."""
    head = _U32.pack(etype) + _U64.pack(len(items))
    if etype == VT.STRING:
        body = b"".join(_str_payload(s) for s in items)
    else:
        body = np.asarray(items, dtype=_NUMPY[etype]).tobytes()
    return Value(VT.ARRAY, head + body)
