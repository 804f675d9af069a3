"""A virtual GGUF file: a synthesised header stitched to ranges of a blob and
to op tensors, read by (offset, size).

The layout is fixed when the view is built: the GGUF v3 header (KVs, tensor
infos, padding), then tensor data aligned to `general.alignment`, in the
blob's data order so that a sequential read of the view is a sequential read
of the blob (the tensor infos are listed in that order too, as GGUF readers
require).  The layout is the view's `segments` (a `segments.Segments`); a read
is those clipped to its range, and `assemble` assembles their bytes.
"""

from __future__ import annotations

import struct
from dataclasses import replace
from collections.abc import Hashable

from . import assemble
from ..files.blobfile import BlobFile
from ..format.header import MAGIC, SourceGGUF
from ..errors import GGUFError
from .opcache import OpCache
from ..translate.runs import Runs
from ..translate import ViewSpec, ViewTensor
from .assemble import FileRange
from .segments import BlobBytes, Cached, Computed, HeldBytes, InRounds, Rounds, Segment, Segments, ZeroBytes


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

    def __init__(
        self, stamp: tuple, source: SourceGGUF | None, segments: list[Segment], size: int, spec: ViewSpec | None
    ):
        self.stamp = stamp  # `blobfile.identity` of the blob it was built from
        self.source = source
        self.spec = spec
        self.size = size
        self.segments = Segments(segments, size)

    @property
    def nbytes_held(self) -> int:
        """Memory this view keeps: its rendered header and the parsed blob header."""
        held = sum(len(s.data) for s in self.segments if isinstance(s, HeldBytes))
        return held + (self.source.header_size if self.source is not None else 0)

    # -- construction ------------------------------------------------------
    @classmethod
    def identity(cls, stamp: tuple) -> View:
        """The blob itself, byte for byte (`stamp` as in `View.stamp`)."""
        size = stamp[2]
        segs: list[Segment] = [BlobBytes(0, size, 0)] if size else []
        return cls(stamp, None, segs, size, None)

    @classmethod
    def translated(cls, source: SourceGGUF, spec: ViewSpec, cache: OpCache, key: Hashable) -> View:
        """Lay out `spec` over `source`; op tensors are cached under (`key`, name)."""
        spec, offsets = _data_order(spec)
        header = render_header(spec, offsets)
        segs, size = _data_segments(spec, len(header), key, cache)
        return cls(source.identity, source, [HeldBytes(0, len(header), 0, header), *segs], size, spec)

    @staticmethod
    def translated_size(spec: ViewSpec) -> int:
        """The size `translated` gives a view of `spec`, every tensor checked the
        same way, without rendering its header (what `stat` needs)."""
        spec = _data_order(spec)[0]
        return _data_segments(spec, _header_size(spec), None, None)[1]

    # -- reads ----------------------------------------------------------------
    def open(self) -> BlobFile:
        """The blob this translated view was built from, opened (GGUFError
        when it is no longer that blob)."""
        if self.source is None:
            raise GGUFError("an identity view knows no path: read it through its blob's descriptor")
        return BlobFile(self.source.path, expect=self.stamp)

    def read(self, offset: int, size: int, blob: BlobFile | None = None) -> bytes:
        """The bytes at [offset, offset+size), clipped to the file, as one
        bytes object (in-process): assembled by `assemble` through `blob`,
        or the view's own blob opened for this read."""
        size = max(0, min(offset + size, self.size) - max(offset, 0))
        buf = bytearray(size)
        if blob is not None:
            assemble.fill(self.segments, blob, offset, memoryview(buf))
        else:
            with self.open() as f:
                assemble.fill(self.segments, f, offset, memoryview(buf))
        return bytes(buf)

    def pieces(self, offset: int, size: int, blob: BlobFile | None = None) -> list[FileRange | bytearray]:
        """The bytes at [offset, offset+size), clipped to the file: blob
        ranges as `FileRange`s, everything else assembled (`assemble.parts`)
        through `blob`, or the view's own blob opened for this call (an
        identity view is all blob ranges: it needs none)."""
        if blob is not None or self.source is None:
            return assemble.parts(self.segments, blob, offset, size)
        with self.open() as f:
            return assemble.parts(self.segments, f, offset, size)


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


def _data_segments(spec: ViewSpec, pos: int, key: Hashable, cache: OpCache | None) -> tuple[list[Segment], int]:
    """The segments of the tensor data from `pos` (padding included), and
    where they end: the view's size; ops computed in chunks go into `cache`
    (None: a layout made for its size alone).  An op tensor served as one
    segment, ranged or in rounds, whose op shares its input spans with
    others of the same size and kind (`Op.span_group`) has theirs as its kin."""
    segs: list[Segment] = []
    groups: dict[Hashable, list[int]] = {}  # span group -> where its ops' segments are in `segs`
    for t in spec.tensors:
        made = [s for s in _tensor_segments(t, pos, key, cache) if s.size]
        group = t.op.span_group if t.op is not None else None
        if group is not None and len(made) == 1 and isinstance(made[0], (InRounds, Computed)):
            groups.setdefault((group.key, type(made[0]), t.nbytes), []).append(len(segs))
        segs.extend(made)
        pos += t.nbytes
        pad = _pad(t.nbytes, spec.alignment)
        if pad:
            segs.append(ZeroBytes(pos, pad, 0))
            pos += pad
    for members in groups.values():
        kin = [segs[i] for i in members]
        for i in members:
            segs[i] = replace(segs[i], kin=tuple(k for k in kin if k is not segs[i]))  # type: ignore[call-arg]
    return segs, pos


def _tensor_segments(t: ViewTensor, pos: int, key: Hashable, cache: OpCache | None) -> list[Segment]:
    """How tensor `t`, at `pos` in the view, is served: blob bytes; an op's
    input bytes and zeros (an op that only moves bytes: ranges, and rounds
    of strided runs laid out by arithmetic); an op computed per requested
    range; or an op computed in chunks (or whole) into the op cache."""
    op = t.op
    if op is None:
        if t.source is None:
            raise GGUFError(f"tensor {t.name} is neither blob bytes nor an op")
        return [BlobBytes(pos, t.nbytes, t.source.offset)]
    pieces = op.pieces()
    if pieces is not None:
        segs: list[Segment] = []
        for p in pieces:
            if isinstance(p, Runs):
                segs.append(_runs_segment(op.description, p, pos))
                pos += p.nbytes
            else:
                segs.append(ZeroBytes(pos, p, 0))
                pos += p
        if sum(s.size for s in segs) != t.nbytes:
            raise GGUFError(f"{op.description}: pieces make {sum(s.size for s in segs)} bytes, not {t.nbytes}")
        return segs
    if op.ranged:
        return [Computed(pos, t.nbytes, 0, op)]
    if op.nbytes and op.chunk_bytes <= 0:
        raise GGUFError(f"{op.description}: chunks of {op.chunk_bytes} bytes")
    return [Cached(pos, t.nbytes, 0, op, cache, (key, t.name))]


def _runs_segment(what: str, runs: Runs, pos: int) -> Segment:
    """The segment of `runs` at `pos`: a blob range, or rounds; every run
    checked to lie inside its input tensor."""
    if runs.nbytes == 0:
        return ZeroBytes(pos, 0, 0)
    parts, at = [], 0
    for p in runs.parts:
        if (
            runs.count < 1
            or p.unit < 0
            or p.start < 0
            or p.stride < 0
            or p.start + (runs.count - 1) * p.stride + p.unit > p.tensor.nbytes
        ):
            raise GGUFError(f"{what}: runs outside input {p.tensor.name}")
        parts.append((at, p.tensor.offset + p.start, p.unit, p.stride))
        at += p.unit
    if runs.count == 1 and len(parts) == 1:
        return BlobBytes(pos, at, parts[0][1])
    return InRounds(pos, runs.nbytes, 0, Rounds(at, tuple(parts), runs.count))
