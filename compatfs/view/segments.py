"""What a view's bytes are made of: one family of segments, each a run of
the view's bytes of one kind, and `Segments`, a view's segments end to end.

A view is laid out once (`layout`) as segments; a read of it is the same
segments clipped to the range it asks for (`Segments.cover`), which
`assemble` turns into bytes, one kind at a time.  Every segment is `size`
bytes of the view from `at`, taken from byte `lo` of what its kind names
(the blob, the rendered header, rounds of blob runs, an op's output), so
that clipping one is the same for every kind (`Segment.clip`).

A segment that is a whole op tensor made from the same input spans as other
op tensors of the view (`Op.span_group`) holds theirs as its `kin`: bytes
[lo, lo + size) of a kin are made from the span its own are (`Segment.kin_of`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TypeVar
from collections.abc import Hashable, Iterator

from ..translate.ops import Op
from .opcache import OpCache

S = TypeVar("S", bound="Segment")


@dataclass(slots=True)
class Segment:
    """View bytes [at, at + size), from byte `lo` of what the kind names.
    Segments are never changed once made; they are not frozen dataclasses
    because a read makes some (`clip`), and a frozen one takes about three
    times as long to make."""

    at: int
    size: int
    lo: int

    def clip(self: S, at: int, end: int) -> S:
        """This segment's bytes at view bytes [at, end) (which it holds): the
        same kind, its own fields (those after `lo`) kept."""
        names: tuple[str, ...] = self.__match_args__[3:]
        own = [getattr(self, name) for name in names]
        return type(self)(at, end - at, self.lo + at - self.at, *own)


@dataclass(slots=True)
class HeldBytes(Segment):
    """Bytes held in memory (the rendered header): data[lo:lo + size]."""

    data: bytes


@dataclass(slots=True)
class ZeroBytes(Segment):
    """Zero bytes (padding, an op's zero pieces); `lo` says nothing."""


@dataclass(slots=True)
class BlobBytes(Segment):
    """The blob's bytes from absolute offset `lo`."""


@dataclass(frozen=True, slots=True)
class Rounds:
    """Blob bytes laid out in `count` rounds of `period` bytes: round k
    holds, for each (at, offset, unit, stride) of `parts`, the `unit` blob
    bytes from `offset + k * stride` at byte `k * period + at` of the rounds."""

    period: int
    parts: tuple[tuple[int, int, int, int], ...]
    count: int


@dataclass(slots=True)
class InRounds(Segment):
    """Bytes from `lo` of `rounds`; `kin`: the whole segments of the op
    tensors made from the same input spans as this one's (`Op.span_group`)."""

    rounds: Rounds
    kin: tuple[InRounds, ...] = ()


@dataclass(slots=True)
class Computed(Segment):
    """Bytes from `lo` of ranged `op`, computed from the input bytes they
    need; `kin`: as `InRounds.kin`."""

    op: Op
    kin: tuple[Computed, ...] = ()


@dataclass(slots=True)
class Cached(Segment):
    """Bytes from `lo` of `op`, computed `op.chunk_bytes` at a time into
    `cache`, its chunk k under (`key`, k); no cache in a layout made only
    for its size."""

    op: Op
    cache: OpCache | None
    key: Hashable


def kin_of(seg: InRounds | Computed) -> list[InRounds | Computed]:
    """The bytes of `seg`'s kin that are made from the input span its own
    bytes are: each kin's bytes [seg.lo, seg.lo + seg.size)."""
    return [k.clip(k.at + seg.lo, k.at + seg.lo + seg.size) for k in seg.kin]


class Segments:
    """A view's segments, end to end from 0 to `size`."""

    def __init__(self, segments: list[Segment], size: int):
        self.size = size
        self._segments = segments
        self._starts = [s.at for s in segments]

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._segments)

    def cover(self, offset: int, size: int) -> list[Segment]:
        """The segments of view bytes [offset, offset + size), clipped to
        that range and to the view."""
        end = min(offset + size, self.size)
        out: list[Segment] = []
        i = bisect.bisect_right(self._starts, offset) - 1
        segments = self._segments
        while offset < end and i < len(segments):
            seg = segments[i]
            stop = min(seg.at + seg.size, end)
            out.append(seg if offset == seg.at and stop == seg.at + seg.size else seg.clip(offset, stop))
            offset = stop
            i += 1
        return out
