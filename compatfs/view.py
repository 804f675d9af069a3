"""A virtual GGUF file: a synthesised header stitched to ranges of a blob and
to op tensors, read by (offset, size).

The layout is fixed when the view is built: the GGUF v3 header (KVs, tensor
infos, padding), then tensor data aligned to `general.alignment`, in the
blob's data order so that a sequential read of the view is a sequential read
of the blob (the tensor infos are listed in that order too, as GGUF readers
require).  A read maps to `Piece`s by binary search over the segments.
"""
from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from typing import Hashable, NamedTuple, Union

from .gguf_source import MAGIC, SourceGGUF
from .gguf_values import GGUFError
from .opcache import OpCache
from .ops import InputRange, Op
from .translation import ViewSpec, ViewTensor


class FileRange(NamedTuple):
    """`size` bytes of the blob at absolute `offset`."""
    offset: int
    size: int


class Computed(NamedTuple):
    """Bytes [lo, lo+size) of an op computed per requested range: left for
    the reader to compute into its own buffer (`View.layout`)."""
    op: Op
    lo: int
    size: int


Piece = Union[FileRange, bytes, memoryview]


@dataclass(frozen=True)
class _Segment:
    start: int
    size: int
    kind: str                 # "mem", "zero", "file", "range", "op"
    arg: object = None        # bytes, blob offset, Op, or (cache key, Op)


def _pad(n: int, align: int) -> int:
    return -n % align


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def render_header(spec: ViewSpec, offsets: dict[str, int]) -> bytes:
    """The GGUF v3 header of `spec`, with data offsets `offsets`, padded to alignment."""
    out = bytearray(MAGIC)
    out += struct.pack("<IQQ", 3, len(spec.tensors), len(spec.kvs))
    for key, value in spec.kvs:
        out += _str(key)
        out += struct.pack("<I", value.vtype)
        out += value.payload
    for t in spec.tensors:
        out += _str(t.name)
        out += struct.pack(f"<I{len(t.shape)}QIQ", len(t.shape), *t.shape, t.dtype, offsets[t.name])
    out += bytes(_pad(len(out), spec.alignment))
    return bytes(out)


class View:
    """The bytes of one translated (or identity) file of one blob."""

    def __init__(self, stamp: tuple, source: SourceGGUF | None, segments: list[_Segment], size: int,
                 spec: ViewSpec | None, cache: OpCache | None):
        self.stamp = stamp          # `blobfile.identity` of the blob it was built from
        self.source = source
        self.spec = spec
        self.size = size
        self._segments = segments
        self._starts = [s.start for s in segments]
        self._cache = cache

    @property
    def nbytes_held(self) -> int:
        """Memory this view keeps: its rendered header and the parsed blob header."""
        held = sum(len(s.arg) for s in self._segments if s.kind == "mem")
        return held + (self.source.header_size if self.source is not None else 0)

    # -- construction ------------------------------------------------------
    @classmethod
    def identity(cls, stamp: tuple) -> "View":
        """The blob itself, byte for byte (`stamp` as in `View.stamp`)."""
        size = stamp[2]
        segs = [_Segment(0, size, "file", 0)] if size else []
        return cls(stamp, None, segs, size, None, None)

    @classmethod
    def translated(cls, source: SourceGGUF, spec: ViewSpec, cache: OpCache, key: Hashable) -> "View":
        """Lay out `spec` over `source`; op tensors are cached under (`key`, name)."""
        spec, offsets = _data_order(spec)
        header = render_header(spec, offsets)
        segs, size = _data_segments(spec, len(header), key)
        return cls(source.identity, source, [_Segment(0, len(header), "mem", header), *segs], size, spec, cache)

    @staticmethod
    def translated_size(spec: ViewSpec) -> int:
        """The size `translated` gives a view of `spec`, every tensor checked the
        same way, without rendering its header (what `stat` needs)."""
        spec = _data_order(spec)[0]
        return _data_segments(spec, _header_size(spec), None)[1]

    # -- reads ----------------------------------------------------------------
    def pieces(self, offset: int, size: int) -> list[Piece]:
        """The bytes at [offset, offset+size), clipped to the file, as pieces
        (ranges of ops computed here, their inputs read from the blob)."""
        return [p.op.compute_range(self._read_range, p.lo, p.lo + p.size) if isinstance(p, Computed) else p
                for p in self.layout(offset, size)]

    def layout(self, offset: int, size: int) -> list[Piece | Computed]:
        """As `pieces`, with ranges of ranged ops left to compute (`Computed`)."""
        end = min(offset + size, self.size)
        out: list[Piece | Computed] = []
        i = bisect.bisect_right(self._starts, offset) - 1
        while offset < end and i < len(self._segments):
            seg = self._segments[i]
            lo = offset - seg.start
            n = min(seg.size - lo, end - offset)
            if seg.kind == "file":
                out.append(FileRange(seg.arg + lo, n))
            elif seg.kind == "mem":
                out.append(memoryview(seg.arg)[lo:lo + n])
            elif seg.kind == "zero":
                out.append(bytes(n))
            elif seg.kind == "range":
                out.append(Computed(seg.arg, lo, n))
            else:
                key, op = seg.arg
                data = self._cache.get(key, lambda: self._compute(op))
                out.append(memoryview(data)[lo:lo + n])
            offset += n
            i += 1
        return out

    def _read_range(self, t, start: int, size: int) -> bytes:
        return self.source.read(t.offset + start, size)

    def _compute(self, op) -> bytes:
        """The op's bytes, its inputs read from the blob now."""
        return op.compute(lambda t: self.source.read(t.offset, t.nbytes))

    def read(self, offset: int, size: int) -> bytes:
        """The bytes at [offset, offset+size) as one bytes object (in-process;
        identity views have no parsed source and are read by file descriptor)."""
        return b"".join(bytes(self.source.read(p.offset, p.size)) if isinstance(p, FileRange) else bytes(p)
                        for p in self.pieces(offset, size))


def _data_order(spec: ViewSpec) -> tuple[ViewSpec, dict[str, int]]:
    """`spec` with its tensors in data order, and their data offsets.  GGUF
    readers expect each tensor's data right after the previous one's, in
    tensor-info order: the infos are written in data order."""
    data_order = sorted(spec.tensors, key=lambda t: t.order)
    offsets: dict[str, int] = {}
    rel = 0
    for t in data_order:
        offsets[t.name] = rel
        rel += t.nbytes + _pad(t.nbytes, spec.alignment)
    spec = ViewSpec(spec.kvs, data_order, spec.alignment, spec.handler, spec.idle_renames)
    return spec, offsets


def _header_size(spec: ViewSpec) -> int:
    """len(render_header(spec, ...)), counted (a test holds the two equal;
    `BlobViews.view` replaces an index entry whose size the view belies)."""
    n = len(MAGIC) + 4 + 8 + 8
    for key, value in spec.kvs:
        n += 8 + len(key.encode("utf-8")) + 4 + len(value.payload)
    for t in spec.tensors:
        n += 8 + len(t.name.encode("utf-8")) + 4 + 8 * len(t.shape) + 4 + 8
    return n + _pad(n, spec.alignment)


def _data_segments(spec: ViewSpec, pos: int, key: Hashable) -> tuple[list[_Segment], int]:
    """The segments of the tensor data from `pos` (padding included), and
    where they end: the view's size."""
    segs = []
    for t in spec.tensors:
        segs.extend(s for s in _tensor_segments(t, pos, key) if s.size)
        pos += t.nbytes
        pad = _pad(t.nbytes, spec.alignment)
        if pad:
            segs.append(_Segment(pos, pad, "zero"))
            pos += pad
    return segs, pos


def _tensor_segments(t: ViewTensor, pos: int, key: Hashable) -> list[_Segment]:
    """How tensor `t`, at `pos` in the view, is served: blob bytes; an op's
    input ranges and zeros (an op that only moves bytes); an op computed per
    requested range; or an op computed whole into the op cache."""
    op = t.op
    if op is None:
        return [_Segment(pos, t.nbytes, "file", t.source.offset)]
    pieces = op.pieces()
    if pieces is not None:
        segs = []
        for p in pieces:
            if isinstance(p, InputRange):
                if p.start < 0 or p.start + p.size > p.tensor.nbytes:
                    raise GGUFError(f"{op.description}: piece outside input {p.tensor.name}")
                segs.append(_Segment(pos, p.size, "file", p.tensor.offset + p.start))
                pos += p.size
            else:
                segs.append(_Segment(pos, p, "zero"))
                pos += p
        if sum(s.size for s in segs) != t.nbytes:
            raise GGUFError(f"{op.description}: pieces make {sum(s.size for s in segs)} bytes, not {t.nbytes}")
        return segs
    if op.ranged:
        return [_Segment(pos, t.nbytes, "range", op)]
    return [_Segment(pos, t.nbytes, "op", ((key, t.name), op))]
