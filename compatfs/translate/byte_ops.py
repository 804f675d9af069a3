"""Tensor ops that only move bytes: a split, strided rows or elements,
per-expert row concatenation, zero padding and zeros.  Each lays its output
out as strided runs of its input (`Runs`) and zeros, served from the blob by
arithmetic at any size; `_compute` makes the same bytes whole with numpy
(what the tests compare the runs against, and the fallback where a split
cuts through quantization blocks)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as DT

from ..format.header import TensorInfo, tensor_nbytes
from ..errors import GGUFError
from .ops import PLAIN_TYPES, Op, SpanGroup, as_array, elements
from .runs import Part, Runs, strided_runs


@dataclass(frozen=True)
class Split(Op):
    """Elements [start, start+length) of ggml `axis` of one tensor."""

    axis: int = 0
    start: int = 0

    @classmethod
    def of(cls, src: TensorInfo, axis: int, start: int, length: int) -> Split:
        shape = list(src.shape)
        if start + length > shape[axis]:
            raise GGUFError(f"{src.name}: split {start}+{length} exceeds axis {axis} of {shape[axis]}")
        shape[axis] = length
        return cls((src,), tuple(shape), src.known_dtype(), axis, start)

    def pieces(self):
        """Each slab of the slower axes holds one contiguous run of the split
        axis: that run, slab after slab, `stride` apart (whole quantization
        blocks of quantized types, else computed)."""
        src = self.inputs[0]
        if self.axis == 0:
            row = tensor_nbytes(src.shape[:1], src.dtype)
            block = GGML_QUANT_SIZES[src.known_dtype()][0]
            if self.start % block or self.shape[0] % block:
                return None
            unit, stride, outer = row * self.shape[0] // src.shape[0], row, elements(src.shape[1:])
            first = row * self.start // src.shape[0]
        else:
            inner = tensor_nbytes(src.shape[: self.axis], src.dtype)
            unit, stride = inner * self.shape[self.axis], inner * src.shape[self.axis]
            outer, first = elements(src.shape[self.axis + 1 :]), inner * self.start
        return [strided_runs(src, first, unit, stride, outer)]

    def _compute(self, data):
        src = self.inputs[0]
        arr = as_array(src, data[0])
        np_axis = len(src.shape) - 1 - self.axis
        index = [slice(None)] * arr.ndim
        index[np_axis] = slice(self.start, self.start + self.shape[self.axis])
        return np.ascontiguousarray(arr[tuple(index)]).tobytes()


@dataclass(frozen=True)
class ZeroTensor(Op):
    """A tensor of zeros with no input."""

    @classmethod
    def of(cls, shape: tuple[int, ...], dtype: DT = DT.F32) -> ZeroTensor:
        return cls((), tuple(shape), dtype)

    def pieces(self):
        return [self.nbytes] if self.nbytes else []

    def _compute(self, data):
        return bytes(self.nbytes)


@dataclass(frozen=True)
class ConcatRows(Op):
    """Concatenation along ggml axis 1 within each slab of the slower axes:
    for expert stacks [n_embd, n_ff, n_expert], expert e's rows of the first
    input, then its rows of the second (a per-expert gate/up merge).  Inputs
    of one dtype; bytes kept (a row is whole quantization blocks)."""

    @classmethod
    def of(cls, *srcs: TensorInfo) -> ConcatRows:
        if len({t.dtype for t in srcs}) != 1 or len({(t.shape[0], *t.shape[2:]) for t in srcs}) != 1:
            raise GGUFError(f"cannot concatenate rows of {[(t.name, t.shape, t.dtype) for t in srcs]}")
        first = srcs[0]
        return cls(tuple(srcs), (first.shape[0], sum(t.shape[1] for t in srcs), *first.shape[2:]), first.known_dtype())

    def pieces(self):
        """Slab by slab, each input's rows of that slab: one round a slab."""
        slabs = elements(self.shape[2:])
        sizes = [t.nbytes // slabs for t in self.inputs]
        if slabs == 1:
            return [Runs.span(t, 0, size) for t, size in zip(self.inputs, sizes, strict=True)]
        return [Runs(tuple(Part(t, 0, size, size) for t, size in zip(self.inputs, sizes, strict=True)), slabs)]

    def _compute(self, data):
        slabs = int(np.prod(self.shape[2:], dtype=np.int64))
        parts = [np.frombuffer(d, dtype=np.uint8).reshape(slabs, -1) for d in data]
        return np.concatenate(parts, axis=1).tobytes()


@dataclass(frozen=True)
class PadRows(Op):
    """Rows of zeros appended to a matrix (ggml shape [n, rows]) up to `rows`
    rows: the stored rows served from the blob, then zeros; any dtype (a block
    of zero bytes decodes to zeros in every ggml type: its scales are zero)."""

    @classmethod
    def of(cls, src: TensorInfo, rows: int) -> PadRows:
        if len(src.shape) != 2 or rows < src.shape[1]:
            raise GGUFError(f"{src.name}: cannot pad shape {src.shape} to {rows} rows")
        return cls((src,), (src.shape[0], rows), src.known_dtype())

    def pieces(self):
        src = self.inputs[0]
        pad = self.nbytes - src.nbytes
        return ([Runs.span(src, 0, src.nbytes)] if src.nbytes else []) + ([pad] if pad else [])

    def _compute(self, data):
        return bytes(data[0]) + bytes(self.nbytes - len(data[0]))


@dataclass(frozen=True)
class Strided(Op):
    """Every `step`-th element of ggml `axis` from `start`, within each slab
    of the slower axes: one half of a stack whose two halves are interleaved
    (gate = fused[0::2], up = fused[1::2]).  Along axis 0 the tensor must be
    unquantized; along a slower axis a row is whole quantization blocks and
    its bytes are kept."""

    axis: int = 1
    start: int = 0
    step: int = 1

    @classmethod
    def of(cls, src: TensorInfo, axis: int, start: int, step: int) -> Strided:
        shape = list(src.shape)
        if not 0 <= axis < len(shape) or not 0 <= start < step or shape[axis] % step:
            raise GGUFError(f"{src.name}: cannot take elements {start}::{step} of axis {axis} of shape {src.shape}")
        if axis == 0 and src.dtype not in PLAIN_TYPES:
            raise GGUFError(f"{src.name}: elements of a {src.dtype!r} row cannot be taken apart")
        shape[axis] //= step
        return cls((src,), tuple(shape), src.known_dtype(), axis, start, step)

    @property
    def description(self) -> str:
        return f"Strided({self.inputs[0].name}, axis {self.axis}, {self.start}::{self.step})"

    @property
    def _unit(self) -> int:
        """Bytes of one element (along axis 0) or row (along a slower axis)."""
        src = self.inputs[0]
        if self.axis:
            return tensor_nbytes(src.shape[: self.axis], src.dtype)
        return np.dtype(PLAIN_TYPES[src.known_dtype()]).itemsize

    @property
    def span_group(self) -> SpanGroup | None:
        """The `step` ops taking every `step`-th element of the same axis of
        one tensor (one per `start`): range [lo, hi) of each lies in the
        same span of the input, give or take the `step` - 1 elements (or
        rows) between two taken."""
        if self.step == 1:
            return None
        src = self.inputs[0]
        return SpanGroup(("Strided", src.offset, src.nbytes, self.axis, self.step), (self.step - 1) * self._unit)

    def pieces(self):
        """The elements (along axis 0) or rows and slabs (along a slower axis)
        taken, slab after slab: one strided run, as `step` divides the axis
        (the last taken of a slab is `step` before the first of the next)."""
        src, unit = self.inputs[0], self._unit
        count = elements(src.shape[self.axis + 1 :]) * (src.shape[self.axis] // self.step)
        return [strided_runs(src, self.start * unit, unit, self.step * unit, count)]

    def _compute(self, data):
        src = self.inputs[0]
        if self.axis == 0:
            arr = as_array(src, data[0])
        else:  # rows as byte strings: the row axis stands in for axis 0
            arr = np.frombuffer(data[0], dtype=np.uint8).reshape(*reversed(src.shape[1:]), -1)
        index = [slice(None)] * arr.ndim
        index[arr.ndim - 1 - self.axis] = slice(self.start, None, self.step)
        return np.ascontiguousarray(arr[tuple(index)]).tobytes()


__all__ = ["Split", "ZeroTensor", "ConcatRows", "PadRows", "Strided"]
