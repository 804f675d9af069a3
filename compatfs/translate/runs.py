"""The input bytes an op moves, laid out by arithmetic (`Runs`): strided
runs of one tensor, or rows of several interleaved; never listed byte
range by byte range, so any size costs the same to describe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..format.header import TensorInfo

__all__ = ["Part", "Runs", "RunsOrZeros", "strided_runs"]


class Part(NamedTuple):
    """`unit` bytes of input `tensor` from byte `start`, and again every
    `stride` bytes on (one part of a round of `Runs`)."""

    tensor: TensorInfo
    start: int
    unit: int
    stride: int


@dataclass(frozen=True, slots=True)
class Runs:
    """Input bytes taken in `count` rounds: round k takes, from each part in
    turn, `unit` bytes of its tensor from byte `start + k * stride`.  So
    many rows of any size are laid out by arithmetic, never listed (one
    part: a strided run, as a split or every other row; several: rows of
    several tensors interleaved, as a per-expert concatenation)."""

    parts: tuple[Part, ...]
    count: int

    @classmethod
    def span(cls, t: TensorInfo, start: int, size: int) -> Runs:
        """`size` bytes of `t` from byte `start`: one range."""
        return cls((Part(t, start, size, size),), 1)

    @property
    def nbytes(self) -> int:
        return self.count * sum(p.unit for p in self.parts)


def strided_runs(t: TensorInfo, start: int, unit: int, stride: int, count: int) -> Runs:
    """`count` runs of `unit` bytes of `t`, `stride` apart from `start`
    (one range when they touch)."""
    if stride == unit or count == 1:
        return Runs.span(t, start, unit * count if stride == unit else unit)
    return Runs((Part(t, start, unit, stride),), count)


RunsOrZeros = Runs | int  # an int: that many zero bytes
