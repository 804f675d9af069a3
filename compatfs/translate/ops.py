"""Tensor operations that produce a view's transformed tensors.

An op names its input tensors (as the blob stores them), declares the shape
and dtype it produces, and says how its bytes are made, in one of three
ways: as input bytes moved (`pieces`: splits, strided halves,
concatenations, zero padding, laid out by arithmetic at any size; those ops
are in `byte_ops`, same-dtype `Concat` here); any byte
range computed from the input bytes it needs (`ranged`: dtype promotions and
other elementwise ops, mixed-dtype concatenations); or computed with numpy
`chunk_bytes` at a time (a permutation, block by block), by default whole
(resamplings and the like).  Shapes are ggml shapes: fastest-varying axis
first, so the numpy array of a tensor has the reversed shape.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple
from collections.abc import Callable, Hashable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as DT
from gguf import quants

from ..format.header import TensorInfo, tensor_nbytes
from ..errors import GGUFError
from .runs import Runs, RunsOrZeros

ReadTensor = Callable[[TensorInfo], bytes | memoryview]

_FLOAT = {DT.F32: "<f4", DT.F16: "<f2", DT.F64: "<f8"}
PLAIN_TYPES = {**_FLOAT, DT.I8: "<i1", DT.I16: "<i2", DT.I32: "<i4", DT.I64: "<i8", DT.BF16: "<u2"}


def as_array(t: TensorInfo, data: bytes | memoryview) -> np.ndarray:
    """The stored elements of an unquantized tensor, numpy-shaped (slow axis first)."""
    dtype = t.known_dtype()
    if dtype not in PLAIN_TYPES:
        raise GGUFError(f"{t.name}: {dtype.name} cannot be reshaped without dequantizing")
    return np.frombuffer(data, dtype=PLAIN_TYPES[dtype]).reshape(tuple(reversed(t.shape)))


def to_f32(t: TensorInfo, data: bytes | memoryview) -> np.ndarray:
    """The tensor's values as float32, numpy-shaped; any ggml dtype."""
    if t.dtype == DT.BF16:
        raw = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return raw.view("<f4").reshape(tuple(reversed(t.shape)))
    if t.dtype in PLAIN_TYPES:
        return as_array(t, data).astype("<f4")
    flat = quants.dequantize(np.frombuffer(data, dtype=np.uint8), t.known_dtype())
    return np.asarray(flat, dtype="<f4").reshape(tuple(reversed(t.shape)))


@dataclass(frozen=True)
class Op(ABC):
    """Base: `inputs` in, a tensor of `shape`/`dtype` out.

    The contract.  Every op defines `_compute` (the whole output from its
    whole inputs: how an op computed whole is served, and the reference the
    other ways are tested against); an op without it cannot be made.  An op
    may say that its bytes are made another way, and then defines what that
    way needs: `pieces` (input bytes moved and zeros); `ranged` true and
    `compute_range_into` (any byte range from the input bytes it needs: a
    class that overrides `ranged` without defining `compute_range_into` is
    refused when it is created); or `chunk_bytes` and `compute_chunk`
    (computed a chunk at a time).  `compute_range` is derived from
    `compute_range_into` and is not overridden (refused, too).  It may also
    override `description`, `computes_ahead`, `reads_inputs_once`,
    `span_group` and `compiled_blocks`."""

    inputs: tuple[TensorInfo, ...]
    shape: tuple[int, ...]
    dtype: DT

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.shape, self.dtype)

    @property
    def description(self) -> str:
        names = ", ".join(t.name for t in self.inputs)
        return f"{type(self).__name__}({names})"

    def compute(self, read: ReadTensor) -> bytes:
        """The whole output tensor (for ops that need all of their input)."""
        out = self._compute([read(t) for t in self.inputs])
        if len(out) != self.nbytes:
            raise GGUFError(f"{self.description} produced {len(out)} bytes, expected {self.nbytes}")
        return out

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuses a class that breaks the contract above for ranged ops."""
        super().__init_subclass__(**kwargs)
        if "compute_range" in vars(cls):
            raise TypeError(f"op {cls.__name__} overrides compute_range: ranged ops define compute_range_into")
        if cls.ranged is not Op.ranged and cls.compute_range_into is Op.compute_range_into:
            raise TypeError(f"op {cls.__name__} says whether it is ranged but does not define compute_range_into")

    @abstractmethod
    def _compute(self, data: list[bytes | memoryview]) -> bytes:
        """The whole output from the whole inputs' bytes (in `inputs` order)."""

    def pieces(self) -> list[RunsOrZeros] | None:
        """The output as input bytes (`Runs`) and zeros, when it is made of
        them (served from the blob like any other tensor, never computed);
        else None."""
        return None

    @property
    def chunk_bytes(self) -> int:
        """How many output bytes are computed at a time: `compute_chunk`
        computes chunk k, bytes [k * chunk_bytes, (k + 1) * chunk_bytes) (the
        last one may be shorter).  The whole tensor unless the op says more."""
        return self.nbytes

    def compute_chunk(self, read: ReadRange, k: int) -> bytes:
        """Chunk k of the output (see `chunk_bytes`), its inputs read with `read`."""
        if k:
            raise GGUFError(f"{self.description} is computed whole: it has no chunk {k}")
        return self.compute(lambda t: read(t, 0, t.nbytes))

    @property
    def ranged(self) -> bool:
        """True: any byte range is made from just the input bytes it needs;
        such an op defines `compute_range_into`.  A subclass sets it as a
        class attribute or a property."""
        return False

    @property
    def computes_ahead(self) -> bool:
        """True: a sequential reader's next ranges are worth computing ahead
        on worker threads (`ahead`); a ranged op's are, unless a range
        costs about what copying it does (the copy out of a range computed
        ahead would take what computing it ahead saves)."""
        return self.ranged

    @property
    def reads_inputs_once(self) -> bool:
        """True: the input bytes a range of the output is made from are read for
        that range alone, not again for another (so they need not stay in the
        page cache: `view.assemble` reads them with `BlobFile.read_once_into`);
        a ranged op's are, unless it says otherwise."""
        return self.ranged

    @property
    def span_group(self) -> SpanGroup | None:
        """The ops of a view whose `span_group` is equal to this one's (same
        `key`) make each byte range [lo, hi) of their outputs from one span
        of the same input, which each reaches at most `reach` bytes beyond
        on either side (the halves of an interleaved stack): a reader of one
        op's range may make the others' same range from one read of the
        span.  None (the default): the op shares no span."""
        return None

    @property
    def compiled_blocks(self) -> CompiledBlocks | None:
        """The op's bytes as a compiled kernel makes them from the blob, block
        by block (`CompiledBlocks`): what lets the FUSE layer's read gate
        serve them with no Python.  None (the default): made in Python alone."""
        return None

    def compute_range(self, read: ReadRange, lo: int, hi: int) -> bytes | memoryview:
        """Bytes [lo, hi) of the output of a ranged op (`compute_range_into`
        into a buffer of their own)."""
        out = memoryview(bytearray(hi - lo))
        self.compute_range_into(read, lo, hi, out)
        return out

    def compute_range_into(self, read: ReadRange, lo: int, hi: int, out: memoryview) -> None:
        """Bytes [lo, hi) of the output written into `out` (hi - lo bytes; the
        FUSE layer passes the reply buffer, so a range is never copied again).
        Only a ranged op has them: this one raises GGUFError."""
        raise GGUFError(f"{self.description} is not computed by range")


class SpanGroup(NamedTuple):
    """Ops that make each range of their outputs from one input span (`Op.span_group`)."""

    key: Hashable
    reach: int


class CompiledBlocks(NamedTuple):
    """Output row r (`row` bytes, whole blocks of `block` bytes) is compiled
    kernel `kernel` of the `row` blob bytes at absolute offset `origin + r *
    stride`, block by block (`stride` equal to `row`: the rows lie end to end)."""

    kernel: str
    block: int
    origin: int
    row: int
    stride: int


ReadRange = Callable[[TensorInfo, int, int], bytes | memoryview]  # (tensor, start, size) -> its bytes


@dataclass(frozen=True)
class Elementwise(Op):
    """An op whose output element i depends on input element i alone; its
    output is F32 and any byte range is computed from the input blocks that
    hold those elements."""

    ranged = True

    # A subclass's output values for flat float32 input values (None: the values).
    _values: ClassVar[Callable[[Any, np.ndarray], np.ndarray] | None] = None

    def _compute(self, data):
        return bytes(self.compute_range(lambda t, start, size: data[0][start : start + size], 0, self.nbytes))

    def compute_range_into(self, read: ReadRange, lo: int, hi: int, out: memoryview) -> None:
        _elementwise_into(self.inputs[0], read, lo, hi, out, self._values)


CHUNK = 1 << 18  # elements converted at a time: input and output stay in the CPU's cache
CHUNK_BYTES = 4 << 20  # output bytes an op computed in chunks (a permutation) computes at a time


def _elementwise_into(
    src: TensorInfo,
    read: ReadRange,
    lo: int,
    hi: int,
    out: memoryview,
    fn: Callable[[np.ndarray], np.ndarray] | None = None,
) -> None:
    """Bytes [lo, hi) of fn(src as flat float32) into `out`, reading only the
    input blocks needed and converting them chunk by chunk straight into
    `out` (a range that starts or ends inside an element goes through one
    small buffer)."""
    if lo % 4 or hi % 4:
        first = lo - lo % 4
        whole = memoryview(bytearray(-(-hi // 4) * 4 - first))
        _elementwise_into(src, read, first, first + len(whole), whole, fn)
        out[:] = whole[lo - first : hi - first]
        return
    dtype = src.known_dtype()
    block, block_bytes = GGML_QUANT_SIZES[dtype]
    first, last = lo // 4, hi // 4  # output elements (F32)
    b0, b1 = first // block, -(-last // block)  # input blocks
    raw = read(src, b0 * block_bytes, (b1 - b0) * block_bytes)
    values = np.frombuffer(out, dtype="<f4")
    skip = first - b0 * block
    if dtype in _BITS:
        stored = np.frombuffer(raw, dtype=_BITS[dtype])[skip : skip + len(values)]
        for at in range(0, len(values), CHUNK):
            _to_f32(dtype, stored[at : at + CHUNK], values[at : at + CHUNK])
    else:
        flat = src.part(src.name, ((b1 - b0) * block,), dtype, b0 * block_bytes)
        values[:] = to_f32(flat, raw)[skip : skip + len(values)]
    if fn is not None:
        for at in range(0, len(values), CHUNK):
            part = values[at : at + CHUNK]
            part[:] = fn(part)


_F16_MAX = 65504.0
_BITS = {DT.F32: "<f4", DT.F16: "<u2", DT.BF16: "<u2"}  # how `_to_f32` takes each type's elements


def _to_f32(dtype: DT, stored: np.ndarray, out: np.ndarray) -> None:
    """F32, BF16 or F16 elements (as `_BITS` reads them) converted into `out`, bit for bit as numpy's
    `astype(float32)` would (checked for all 65,536 F16 values in the tests).

    numpy converts F16 one element at a time (~0.7 GB/s here); this moves the
    bits instead, in whole-array integer passes: widen to 32 bits with the
    half in the top 16, an arithmetic shift by 3 puts the exponent and
    mantissa in place (sign kept), a mask clears what the shift smeared, and
    a multiply by 2^112 rebases the exponent (exactly: F16 subnormals come out
    as the F32 normals they are).  Infinities and NaNs (exponent all ones)
    come out finite and beyond the F16 range; the few there are set apart."""
    if dtype == DT.F32:
        out[:] = stored
        return
    bits = out.view("<u4")
    bits[:] = stored
    if dtype == DT.BF16:
        np.left_shift(bits, 16, out=bits)
        return
    np.left_shift(bits, 16, out=bits)
    signed = bits.view("<i4")
    np.right_shift(signed, 3, out=signed)
    np.bitwise_and(bits, 0x8FFFE000, out=bits)
    np.multiply(out, np.float32(2.0**112), out=out)
    if len(out) and (out.max() > _F16_MAX or out.min() < -_F16_MAX):
        special = (stored & 0x7C00) == 0x7C00
        half = stored[special].astype("<u4")
        bits[special] = (half & 0x8000) << 16 | 0x7F800000 | (half & 0x3FF) << 13


def _concat_shape(inputs: tuple[TensorInfo, ...]) -> tuple[int, ...]:
    fast = {t.shape[:-1] for t in inputs}
    if len(fast) != 1:
        raise GGUFError(f"cannot concatenate {[t.name for t in inputs]}: shapes {[t.shape for t in inputs]}")
    return inputs[0].shape[:-1] + (sum(t.shape[-1] for t in inputs),)


@dataclass(frozen=True)
class Promote(Elementwise):
    """Dtype promotion to F32 (from F16, BF16 or any quantized type)."""

    @classmethod
    def of(cls, src: TensorInfo) -> Promote:
        return cls((src,), src.shape, DT.F32)


@dataclass(frozen=True)
class Concat(Op):
    """Concatenation along the slow axis; same-dtype inputs keep their bytes
    (served straight from the blob), mixed dtypes are dequantized and
    concatenated as F32 (also a QKV merge), computed range by range."""

    @classmethod
    def of(cls, *srcs: TensorInfo) -> Concat:
        same = len({t.dtype for t in srcs}) == 1
        return cls(tuple(srcs), _concat_shape(srcs), srcs[0].known_dtype() if same else DT.F32)

    @property
    def _same(self) -> bool:
        return self.dtype != DT.F32 or all(t.dtype == DT.F32 for t in self.inputs)

    def pieces(self):
        return [Runs.span(t, 0, t.nbytes) for t in self.inputs] if self._same else None

    @property
    def ranged(self) -> bool:
        return not self._same

    def _compute(self, data):
        if self._same:
            return b"".join(bytes(d) for d in data)
        return b"".join(to_f32(t, d).tobytes() for t, d in zip(self.inputs, data, strict=True))

    def compute_range_into(self, read, lo, hi, out):
        base = 0
        for t in self.inputs:
            size = 4 * elements(t.shape)
            a, b = max(lo, base), min(hi, base + size)
            if a < b:
                _elementwise_into(t, read, a - base, b - base, out[a - lo : b - lo])
            base += size


def elements(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass(frozen=True)
class Permute(Op):
    """Reshape the numpy-ordered array to `view`, transpose it by `axes`
    (numpy axis order, as llama.cpp's Python converters write permutes),
    and store it back with the input's ggml shape."""

    view: tuple[int, ...] = ()
    axes: tuple[int, ...] = ()

    @classmethod
    def of(cls, src: TensorInfo, view: tuple[int, ...], axes: tuple[int, ...]) -> Permute:
        if int(np.prod(view)) != int(np.prod(src.shape)) or sorted(axes) != list(range(len(view))):
            raise GGUFError(f"{src.name}: cannot permute shape {src.shape} as {view} by {axes}")
        return cls((src,), src.shape, src.known_dtype(), tuple(view), tuple(axes))

    def _compute(self, data):
        arr = as_array(self.inputs[0], data[0]).reshape(self.view)
        return np.ascontiguousarray(arr.transpose(self.axes)).tobytes()

    @property
    def _kept(self) -> int:
        """How many leading (slowest) axes the permutation leaves in place."""
        n = 0
        while n < len(self.axes) and self.axes[n] == n:
            n += 1
        return n

    @property
    def chunk_bytes(self) -> int:
        """Each index of the axes left in place is a block of the tensor that
        moves within itself, at the same bytes in input and output: chunks
        are whole such blocks, about `CHUNK_BYTES` (the whole tensor when the
        slowest axis moves)."""
        kept = self._kept
        if not kept or self.dtype not in PLAIN_TYPES:  # (a quantized input is refused when computed)
            return self.nbytes
        block = elements(self.view[kept:]) * np.dtype(PLAIN_TYPES[self.dtype]).itemsize
        return block * max(1, min(elements(self.view[:kept]), CHUNK_BYTES // block))

    def compute_chunk(self, read, k):
        size = self.chunk_bytes
        lo = k * size
        if not 0 <= lo < self.nbytes:
            raise GGUFError(f"{self.description} has no chunk {k}")
        src, kept = self.inputs[0], self._kept
        data = read(src, lo, min(size, self.nbytes - lo))
        if size == self.nbytes:
            return self._compute([data])
        arr = np.frombuffer(data, dtype=PLAIN_TYPES[src.known_dtype()]).reshape(-1, *self.view[kept:])
        axes = (0, *(a - kept + 1 for a in self.axes[kept:]))
        return np.ascontiguousarray(arr.transpose(axes)).tobytes()


@dataclass(frozen=True)
class AddScalar(Elementwise):
    """Elementwise `value` added to every element (e.g. a norm weight shift); F32 out."""

    value: float = 0.0

    @classmethod
    def of(cls, src: TensorInfo, value: float) -> AddScalar:
        return cls((src,), src.shape, DT.F32, value)

    def _values(self, values):
        return values + np.float32(self.value)


__all__ = [
    "Op",
    "Elementwise",
    "Promote",
    "Concat",
    "Permute",
    "AddScalar",
    "SpanGroup",
    "CompiledBlocks",
    "ReadRange",
    "ReadTensor",
    "as_array",
    "to_f32",
    "elements",
]
