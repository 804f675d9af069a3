"""The bytes of a view: the pieces a range of it is made of (`View.layout`),
and the one assembler of their bytes, which reads every byte of the blob,
op inputs included, through one open `BlobFile`.

The mount fills its reply buffers with `fill` through the blob its open file
holds; `compatfs export` takes `parts` (blob ranges left as ranges, so the
kernel can share or copy them; everything else assembled); in-process
readers (`View.read`: tests, the fuzzer, the bench) go through `fill` too.
A read through an open blob that continues the one before has the ranged
ops of the bytes after it computed ahead on worker threads (`ahead`); the
reads that reach them copy them out.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Hashable, Iterator, NamedTuple, Union

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import ahead
from ..files.blobfile import BlobFile
from ..errors import GGUFError
from .opcache import OpCache
from ..translate.ops import Op
from ..files.scratch import scratch

log = logging.getLogger(__name__)

class FileRange(NamedTuple):
    """`size` bytes of the blob at absolute `offset`."""
    offset: int
    size: int


class Zeros(NamedTuple):
    size: int


@dataclass(frozen=True, slots=True)
class Rounds:
    """Blob bytes laid out in `count` rounds of `period` bytes: round k
    holds, for each (at, offset, unit, stride) of `parts`, the `unit` blob
    bytes from `offset + k * stride` at byte `k * period + at` of the rounds."""
    period: int
    parts: tuple[tuple[int, int, int, int], ...]
    count: int


class InRounds(NamedTuple):
    """Bytes [lo, lo+size) of `rounds`."""
    rounds: Rounds
    lo: int
    size: int


class Computed(NamedTuple):
    """Bytes [lo, lo+size) of a ranged op, computed from the input bytes they need."""
    op: Op
    lo: int
    size: int


class Cached(NamedTuple):
    """Bytes [lo, lo+size) of an op computed `op.chunk_bytes` at a time into
    `cache`, its chunk k under (`key`, k)."""
    op: Op
    cache: OpCache
    key: Hashable
    lo: int
    size: int


Piece = Union[FileRange, memoryview, Zeros, InRounds, Computed, Cached]

GATHER = 4 << 20      # blob bytes read at once to gather short runs from
DIRECT = 64 << 10     # runs this long (or sparser than 1 in `SPARSE`) are read straight into place
SPARSE = 8


def size_of(piece: Piece) -> int:
    return len(piece) if isinstance(piece, memoryview) else piece.size


def fill(view, blob: BlobFile | None, offset: int, out: memoryview) -> None:
    """Bytes [offset, offset + len(out)) of `view` (which must hold them) into
    `out`, every blob byte read through `blob`; GGUFError when the blob
    cannot give them or an op fails on its data."""
    at = 0
    for piece, n in _assembled(view, blob, offset, len(out)):
        _fill(piece, blob, out[at:at + n], offset + at)
        at += n
    if at != len(out):
        raise GGUFError(f"a read of {len(out)} bytes at {offset} runs past the end of a view of {view.size}")


def parts(view, blob: BlobFile | None, offset: int, size: int) -> list[FileRange | bytearray]:
    """The bytes at [offset, offset+size) (clipped to the view): plain blob
    ranges as `FileRange`s, everything else assembled (as `fill` does)."""
    out: list[FileRange | bytearray] = []
    at = offset
    for piece, n in _assembled(view, blob, offset, size):
        if isinstance(piece, FileRange):
            out.append(piece)
        else:
            buf = bytearray(n)
            _fill(piece, blob, memoryview(buf), at)
            out.append(buf)
        at += n
    return out


def _assembled(view, blob: BlobFile | None, offset: int, size: int) -> Iterator[tuple[Piece, int]]:
    """The pieces of view bytes [offset, offset + size) and their sizes, for
    the caller to assemble; once they are, the ranges of ranged ops that
    follow are given to the file's `Ahead` (a read through an open blob)."""
    pieces = view.layout(offset, size)
    yield from ((p, size_of(p)) for p in pieces)
    state = ahead.of(blob) if blob is not None else None
    if blob is not None and state is not None:
        state.advance(blob, offset, sum(map(size_of, pieces)), lambda at, n: _spans(view, at, n), _compute)


def _spans(view, offset: int, size: int) -> Iterator[ahead.Span | ahead.Later]:
    """What view bytes [offset, offset + size) compute that is worth
    computing ahead: the ranges of ranged ops (that say so,
    `Op.computes_ahead`), and the op-cache chunks of the ops computed in
    chunks where the cache holds the reader's chunk and those computed ahead
    of it side by side (so none pushes out the one being read)."""
    for piece in view.layout(offset, size):
        n = size_of(piece)
        if isinstance(piece, Computed) and piece.op.computes_ahead:
            yield ahead.Span(piece.op, piece.lo, n, offset)
        elif isinstance(piece, Cached) and piece.op.chunk_bytes * (ahead.LATER + 1) <= piece.cache.max_bytes:
            chunk = piece.op.chunk_bytes
            for k in range(piece.lo // chunk, (piece.lo + n - 1) // chunk + 1):
                yield ahead.Later((piece.key, k), offset + max(0, k * chunk - piece.lo),
                                  partial(_cached_chunk, piece=piece, k=k))
        offset += n


def _compute(blob: BlobFile, op: Op, lo: int, out: memoryview) -> None:
    """Bytes [lo, lo + len(out)) of ranged `op` into `out`, its inputs read through `blob`."""
    op.compute_range_into(_reader(blob, op.reads_inputs_once), lo, lo + len(out), out)


def _fill(piece: Piece, blob: BlobFile | None, out: memoryview, at: int) -> None:
    """`piece`, at view offset `at`, into `out`."""
    if isinstance(piece, memoryview):
        out[:] = piece
    elif isinstance(piece, Zeros):
        np.frombuffer(out, np.uint8).fill(0)
    elif blob is None:
        raise GGUFError("a view's blob bytes read without its blob")
    elif isinstance(piece, FileRange):
        blob.read_once_into(out, piece.offset)
    elif isinstance(piece, InRounds):
        _fill_rounds(blob, piece.rounds, piece.lo, out)
    elif isinstance(piece, Computed):
        state = ahead.of(blob)
        if state is None:
            _compute(blob, piece.op, piece.lo, out)
        else:
            state.fill(ahead.Span(piece.op, piece.lo, piece.size, at), out, _compute, blob)
    else:
        _fill_cached(blob, piece, out)


def _reader(blob: BlobFile, once: bool = False):
    """An op's input reader: (tensor, start, size) -> those bytes, through
    `blob` (with `read_once_into` where the op reads them `once`)."""
    read_into = blob.read_once_into if once else blob.read_into

    def read(t, start: int, size: int) -> memoryview:
        buf = np.empty(size, np.uint8)
        read_into(buf.data, t.offset + start)
        return buf.data
    return read


def _fill_rounds(blob: BlobFile, r: Rounds, lo: int, out: memoryview) -> None:
    """Bytes [lo, lo + len(out)) of rounds `r`: per part, a run cut by the
    range's ends read alone; whole runs read straight into place when long
    or sparse, else gathered from `GATHER`-sized reads of the blob."""
    hi = lo + len(out)
    dst = np.frombuffer(out, np.uint8)
    for at, offset, unit, stride in r.parts:
        k = max(0, (lo - at - unit) // r.period + 1)          # the first run that ends past lo
        end = min(r.count, (hi - at - 1) // r.period + 1)     # past the last that starts before hi
        while k < end:
            a = k * r.period + at
            if a < lo or a + unit > hi:
                s, e = max(a, lo), min(a + unit, hi)
                blob.read_once_into(out[s - lo:e - lo], offset + k * stride + s - a)
                k += 1
                continue
            whole = min(end, (hi - at - unit) // r.period + 1)   # past the last run wholly in range
            if unit >= DIRECT or stride > SPARSE * unit:
                for j in range(k, whole):
                    a = j * r.period + at - lo
                    blob.read_once_into(out[a:a + unit], offset + j * stride)
            else:
                batch = max(1, GATHER // stride)
                with scratch((min(batch, whole - k) - 1) * stride + unit) as spans:
                    for j in range(k, whole, batch):
                        m = min(batch, whole - j)
                        blob.read_into(spans.data[:(m - 1) * stride + unit], offset + j * stride)
                        target = as_strided(dst[j * r.period + at - lo:], shape=(m, unit), strides=(r.period, 1))
                        target[...] = as_strided(spans, shape=(m, unit), strides=(stride, 1))
            k = whole


def _fill_cached(blob: BlobFile, piece: Cached, out: memoryview) -> None:
    """The chunks of the op that the range covers, each from the cache or
    computed into it (inputs read through `blob`), copied into `out`."""
    op, lo, hi = piece.op, piece.lo, piece.lo + piece.size
    size = op.chunk_bytes
    for k in range(lo // size, (hi - 1) // size + 1):
        first = k * size
        data = _cached_chunk(blob, piece, k)
        s, e = max(lo, first), min(hi, first + len(data))
        out[s - lo:e - lo] = memoryview(data)[s - first:e - first]


def _cached_chunk(blob: BlobFile, piece: Cached, k: int) -> bytes:
    """Chunk k of the piece's op, from the op cache or computed into it (inputs read through `blob`)."""
    op = piece.op
    n = min(op.chunk_bytes, op.nbytes - k * op.chunk_bytes)
    return piece.cache.get((piece.key, k), lambda: _chunk(op, _reader(blob), k, n))


def _chunk(op: Op, read, k: int, n: int) -> bytes:
    t = time.perf_counter()
    data = op.compute_chunk(read, k)
    if len(data) != n:
        raise GGUFError(f"{op.description} produced {len(data)} bytes for chunk {k}, expected {n}")
    log.debug("computed %s chunk %d (%d bytes) in %.3f s", op.description, k, n, time.perf_counter() - t)
    return data
