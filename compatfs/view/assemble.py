"""The bytes of a view: the one assembler of the segments a range of it is
made of (`Segments.cover`), one function per kind of segment, which reads
every byte of the blob, op inputs included, through one open `BlobFile`.

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
from functools import partial
from typing import Any, NamedTuple
from collections.abc import Callable, Iterable, Iterator

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import ahead
from ..files.blobfile import BlobFile
from ..errors import GGUFError
from ..format.header import TensorInfo
from ..translate import accel
from ..translate.ops import Op
from ..files.scratch import give, scratch, take
from .segments import BlobBytes, Cached, Computed, HeldBytes, InRounds, Rounds, Segment, Segments, ZeroBytes, kin_of

log = logging.getLogger(__name__)


class FileRange(NamedTuple):
    """`size` bytes of the blob at absolute `offset` (what `parts` leaves as a range)."""

    offset: int
    size: int


GATHER = 4 << 20  # blob bytes read at once to gather short runs from
DIRECT = 64 << 10  # runs this long (or sparser than 1 in `SPARSE`) are read straight into place
SPARSE = 8
SCATTER = 512  # runs this long (and shorter than `DIRECT`) scattered into place by the compiled gather_read


KinInto = Callable[[int, int], memoryview | None]  # (view offset, size) -> where to put those bytes, or None


def fill(
    segments: Segments, blob: BlobFile | None, offset: int, out: memoryview, kin_into: KinInto | None = None
) -> None:
    """View bytes [offset, offset + len(out)) of `segments` (which must hold
    them) into `out`, every blob byte read through `blob`; GGUFError when the
    blob cannot give them or an op fails on its data.  With `kin_into`, the
    bytes of op tensors made from the same input spans as the op tensors
    read (their kin, `segments.kin_of`) are made too, from the same reads
    of the blob, into the buffers `kin_into` gives for them (where it gives one)."""
    _fill_from(_assembled(segments, blob, offset, len(out)), segments, blob, offset, out, kin_into)


def fill_aside(segments: Segments, blob: BlobFile, offset: int, out: memoryview) -> None:
    """As `fill`, for view bytes no reader asked for (the pages around a kin
    range): the open file's `Ahead` takes them for no read of its reader."""
    _fill_from(segments.cover(offset, len(out)), segments, blob, offset, out, None)


def _fill_from(
    segs: Iterable[Segment],
    segments: Segments,
    blob: BlobFile | None,
    offset: int,
    out: memoryview,
    kin_into: KinInto | None,
) -> None:
    """`segs`, the segments of `segments` that cover view bytes [offset,
    offset + len(out)), assembled into `out` (as `fill` says)."""
    at = 0
    for seg in segs:
        if kin_into is not None and isinstance(seg, (InRounds, Computed)) and seg.kin:
            _with_kin(seg, blob, out[at : at + seg.size], kin_into)
        else:
            _FILL[type(seg)](seg, blob, out[at : at + seg.size])  # (`_fill`, one call fewer on the hot path)
        at += seg.size
    if at != len(out):
        raise GGUFError(f"a read of {len(out)} bytes at {offset} runs past the end of a view of {segments.size}")


def parts(segments: Segments, blob: BlobFile | None, offset: int, size: int) -> list[FileRange | bytearray]:
    """View bytes [offset, offset+size) of `segments` (clipped to the view):
    plain blob ranges as `FileRange`s, everything else assembled (as `fill` does)."""
    out: list[FileRange | bytearray] = []
    for seg in _assembled(segments, blob, offset, size):
        if isinstance(seg, BlobBytes):
            out.append(FileRange(seg.lo, seg.size))
        else:
            buf = bytearray(seg.size)
            _fill(seg, blob, memoryview(buf))
            out.append(buf)
    return out


def _assembled(segments: Segments, blob: BlobFile | None, offset: int, size: int) -> Iterator[Segment]:
    """The segments of view bytes [offset, offset + size), for the caller to
    assemble; once they are, the ranges of ranged ops that follow are given
    to the file's `Ahead` (a read through an open blob)."""
    covered = segments.cover(offset, size)
    yield from covered
    state = ahead.of(blob) if blob is not None else None
    if blob is not None and state is not None:
        state.advance(blob, offset, sum(s.size for s in covered), lambda at, n: _spans(segments, at, n), _compute)


def _spans(segments: Segments, offset: int, size: int) -> Iterator[Computed | ahead.Later]:
    """What view bytes [offset, offset + size) compute that is worth
    computing ahead: the ranges of ranged ops (that say so,
    `Op.computes_ahead`), and the op-cache chunks of the ops computed in
    chunks where the cache holds the reader's chunk and those computed ahead
    of it side by side (so none pushes out the one being read)."""
    for seg in segments.cover(offset, size):
        if isinstance(seg, Computed) and seg.op.computes_ahead:
            yield seg
        elif (
            isinstance(seg, Cached)
            and seg.cache is not None
            and seg.op.chunk_bytes * (ahead.LATER + 1) <= seg.cache.max_bytes
        ):
            chunk = seg.op.chunk_bytes
            for k in range(seg.lo // chunk, (seg.lo + seg.size - 1) // chunk + 1):
                yield ahead.Later(
                    (seg.key, k), seg.at + max(0, k * chunk - seg.lo), partial(_cached_chunk, seg=seg, k=k)
                )


def _fill(seg: Segment, blob: BlobFile | None, out: memoryview) -> None:
    """The segment's bytes into `out` (its size), by the function of its kind."""
    _FILL[type(seg)](seg, blob, out)


def _compute(blob: BlobFile, op: Op, lo: int, out: memoryview) -> None:
    """Bytes [lo, lo + len(out)) of ranged `op` into `out`, its inputs read through `blob`."""
    with _Inputs(blob, op.reads_inputs_once, len(out)) as read:
        op.compute_range_into(read, lo, lo + len(out), out)


def _held(seg: HeldBytes, blob: BlobFile | None, out: memoryview) -> None:
    out[:] = memoryview(seg.data)[seg.lo : seg.lo + seg.size]


def _zeros(seg: ZeroBytes, blob: BlobFile | None, out: memoryview) -> None:
    np.frombuffer(out, np.uint8).fill(0)


def _opened(blob: BlobFile | None) -> BlobFile:
    if blob is None:
        raise GGUFError("a view's blob bytes read without its blob")
    return blob


def _blob(seg: BlobBytes, blob: BlobFile | None, out: memoryview) -> None:
    _opened(blob).read_once_into(out, seg.lo)


def _computed(seg: Computed, blob: BlobFile | None, out: memoryview) -> None:
    blob = _opened(blob)
    state = ahead.of(blob)
    if state is None:
        _compute(blob, seg.op, seg.lo, out)
    else:
        state.fill(seg, out, _compute, blob)


def _reader(blob: BlobFile):
    """An op's input reader for a computation whose result is kept (an op
    cache chunk): (tensor, start, size) -> those bytes, through `blob`, in
    memory of their own."""

    def read(t, start: int, size: int) -> memoryview:
        buf = np.empty(size, np.uint8)
        blob.read_into(buf.data, t.offset + start)
        return buf.data

    return read


def _with_kin(seg: InRounds | Computed, blob: BlobFile | None, out: memoryview, kin_into: KinInto) -> None:
    """The segment's bytes into `out`, and the same bytes of each of its kin
    into the buffer `kin_into` gives for them, their input span read once
    (with `read_once_into`: the blob's bytes are not read again): for
    an op in rounds the span all their runs lie in, for a ranged op the
    span its range reads widened by the op's `reach` (`Op.span_group`)."""
    blob = _opened(blob)
    wanted = [(k, kin_into(k.at, k.size)) for k in kin_of(seg)]
    pairs = [(k, buf) for k, buf in wanted if buf is not None]
    if not pairs:
        _FILL[type(seg)](seg, blob, out)
    elif isinstance(seg, Computed):
        group = seg.op.span_group
        with _Inputs(blob, True, len(out), reach=group.reach if group is not None else 0) as read:
            seg.op.compute_range_into(read, seg.lo, seg.lo + seg.size, out)
            for k, buf in pairs:
                assert isinstance(k, Computed)
                k.op.compute_range_into(read, k.lo, k.lo + k.size, buf)
    else:
        assert isinstance(seg, InRounds)
        spans = [_rounds_span(s) for s in (seg, *(k for k, _ in pairs)) if isinstance(s, InRounds)]
        first, end = min(a for a, _ in spans), max(b for _, b in spans)
        held = take(end - first)
        try:
            data = held[: end - first]
            blob.read_once_into(data.data, first)
            _rounds_held(seg, first, data, out)
            for k, buf in pairs:
                assert isinstance(k, InRounds)
                _rounds_held(k, first, data, buf)
        finally:
            give(held)


def _runs_of(r: Rounds, at: int, unit: int, lo: int, hi: int) -> tuple[int, int]:
    """The runs of a part (at `at` of each round, `unit` bytes) that bytes
    [lo, hi) of rounds `r` hold some of: the first, and past the last."""
    return max(0, (lo - at - unit) // r.period + 1), min(r.count, (hi - at - 1) // r.period + 1)


def _rounds_span(seg: InRounds) -> tuple[int, int]:
    """The blob bytes [first, end) that the runs of the segment's bytes lie in."""
    r, lo, hi = seg.rounds, seg.lo, seg.lo + seg.size
    first, end = None, None
    for at, offset, unit, stride in r.parts:
        k, e = _runs_of(r, at, unit, lo, hi)
        if k < e:
            a, b = offset + k * stride, offset + (e - 1) * stride + unit
            first, end = a if first is None else min(first, a), b if end is None else max(end, b)
    if first is None or end is None:
        raise GGUFError(f"rounds at {seg.at} of {seg.size} bytes hold no run")
    return first, end


def _rounds_held(seg: InRounds, first: int, held: np.ndarray, out: memoryview) -> None:
    """Bytes [lo, lo + len(out)) of the segment's rounds into `out`, from
    `held`, the blob's bytes from `first` (holding every run they take,
    `_rounds_span`): runs cut by the range's ends one by one, the whole
    runs between in one strided copy per part."""
    r, lo = seg.rounds, seg.lo
    hi = lo + len(out)
    dst = np.frombuffer(out, np.uint8)
    for at, offset, unit, stride in r.parts:
        k, end = _runs_of(r, at, unit, lo, hi)
        if k >= end:
            continue
        if offset + k * stride < first or offset + (end - 1) * stride + unit > first + len(held):
            raise GGUFError(f"rounds at {seg.at}: runs outside the span read")
        whole_lo = k if k * r.period + at >= lo else k + 1  # the first run wholly in range
        whole_hi = max(whole_lo, min(end, (hi - at - unit) // r.period + 1))  # past the last
        for j in sorted({k, end - 1}):
            if whole_lo <= j < whole_hi:
                continue
            a = j * r.period + at
            s, e = max(a, lo), min(a + unit, hi)
            src = offset + j * stride + s - a - first
            dst[s - lo : e - lo] = held[src : src + e - s]
        m = whole_hi - whole_lo
        if m:
            target = as_strided(dst[whole_lo * r.period + at - lo :], shape=(m, unit), strides=(r.period, 1))
            source = as_strided(held[offset + whole_lo * stride - first :], shape=(m, unit), strides=(stride, 1))
            target[...] = source


class _Inputs:
    """A ranged op's input reader for one range of `budget` output bytes:
    (tensor, start, size) -> those bytes, through `blob` (with
    `read_once_into` where the op reads them `once`), valid until the
    reader is closed, each read into scratch memory.  A read that starts
    where the one before of the same input ended (an op that reads its
    input in pieces) reads ahead at once as many bytes as the range has
    left to fill (within the input), which serve the reads that follow:
    one read of the blob instead of many."""

    def __init__(self, blob: BlobFile, once: bool, budget: int, reach: int = 0):
        self._blob, self._once = blob, once
        self._left = budget
        self._reach = reach
        self._taken: list[np.ndarray] = []
        self._held: tuple[int, memoryview] | None = None  # the last read: its first blob byte, its bytes
        self._end: tuple[TensorInfo, int] | None = None  # where the last read asked ended

    def __enter__(self) -> _Inputs:
        return self

    def __exit__(self, *exc) -> None:
        for buf in self._taken:
            give(buf)
        self._taken.clear()

    def __call__(self, t: TensorInfo, start: int, size: int) -> memoryview:
        held, self._left = self._held, self._left - size
        at = t.offset + start
        if held is not None and held[0] <= at and at + size <= held[0] + len(held[1]):
            data = held[1][at - held[0] : at - held[0] + size]
        else:
            want = size
            if self._end is not None and self._end[0] is t and self._end[1] == start:
                want = max(size, min(self._left + size, t.nbytes - start))
            before = min(self._reach, start)  # (a reach: bytes the kin's reads of the span take too)
            want = min(want + before + self._reach, t.nbytes - start + before)
            buf = take(want)
            self._taken.append(buf)
            whole = buf.data[:want]
            if self._once:
                self._blob.read_once_into(whole, at - before)
            else:
                self._blob.read_into(whole, at - before)
            self._held = (at - before, whole)
            data = whole[before : before + size]
        self._end = (t, start + size)
        return data


def _rounds(seg: InRounds, blob: BlobFile | None, out: memoryview) -> None:
    """Bytes [lo, lo + len(out)) of the segment's rounds: per part, a run cut
    by the range's ends read alone; whole runs read straight into place when
    long or sparse, else scattered into place in one pass over the blob by
    the compiled `gather_read` (runs of `SCATTER` bytes or more, where it is
    built) or gathered with numpy from `GATHER`-sized reads of the blob."""
    blob, r, lo = _opened(blob), seg.rounds, seg.lo
    hi = lo + len(out)
    dst = np.frombuffer(out, np.uint8)
    for at, offset, unit, stride in r.parts:
        k = max(0, (lo - at - unit) // r.period + 1)  # the first run that ends past lo
        end = min(r.count, (hi - at - 1) // r.period + 1)  # past the last that starts before hi
        while k < end:
            a = k * r.period + at
            if a < lo or a + unit > hi:
                s, e = max(a, lo), min(a + unit, hi)
                blob.read_once_into(out[s - lo : e - lo], offset + k * stride + s - a)
                k += 1
                continue
            whole = min(end, (hi - at - unit) // r.period + 1)  # past the last run wholly in range
            if unit >= DIRECT or stride > SPARSE * unit:
                for j in range(k, whole):
                    a = j * r.period + at - lo
                    blob.read_once_into(out[a : a + unit], offset + j * stride)
            elif unit >= SCATTER and accel.native is not None:
                _scattered(blob, out[k * r.period + at - lo :], offset + k * stride, unit, stride, whole - k, r.period)
            else:
                batch = max(1, GATHER // stride)
                with scratch((min(batch, whole - k) - 1) * stride + unit) as spans:
                    for j in range(k, whole, batch):
                        m = min(batch, whole - j)
                        blob.read_once_into(spans.data[: (m - 1) * stride + unit], offset + j * stride)
                        target = as_strided(dst[j * r.period + at - lo :], shape=(m, unit), strides=(r.period, 1))
                        target[...] = as_strided(spans, shape=(m, unit), strides=(stride, 1))
            k = whole


def _scattered(blob: BlobFile, out: memoryview, offset: int, unit: int, stride: int, count: int, period: int) -> None:
    """`count` runs of `unit` blob bytes, `stride` apart from `offset`, into
    `out` `period` apart, by the compiled `gather_read`: one pass over the
    blob's span through its descriptor (the page cache), each run read
    straight into its place (the bytes between runs into a buffer thrown
    away), the reads having then `passed` the span; GGUFError naming the
    blob when it cannot be read or ends first."""
    assert accel.native is not None
    span = (count - 1) * stride + unit
    try:
        got = accel.native.gather_read(blob.fd, out, offset, unit, stride, count, period)
    except OSError as e:
        raise GGUFError(f"{blob.path}: cannot read: {e.strerror}") from e
    if got != span:
        raise GGUFError(f"{blob.path}: ends at {offset + got}, before {offset + span} (truncated?)")
    blob.passed(offset, offset + span)


def _cached(seg: Cached, blob: BlobFile | None, out: memoryview) -> None:
    """The chunks of the op that the segment covers, each from the cache or
    computed into it (inputs read through `blob`), copied into `out`."""
    blob, op, lo, hi = _opened(blob), seg.op, seg.lo, seg.lo + seg.size
    size = op.chunk_bytes
    for k in range(lo // size, (hi - 1) // size + 1):
        first = k * size
        data = _cached_chunk(blob, seg, k)
        s, e = max(lo, first), min(hi, first + len(data))
        out[s - lo : e - lo] = memoryview(data)[s - first : e - first]


def _cached_chunk(blob: BlobFile, seg: Cached, k: int) -> bytes:
    """Chunk k of the segment's op, from the op cache or computed into it (inputs read through `blob`)."""
    op = seg.op
    n = min(op.chunk_bytes, op.nbytes - k * op.chunk_bytes)
    if seg.cache is None:
        raise GGUFError(f"{op.description}: a layout made for its size alone has no op cache")
    return seg.cache.get((seg.key, k), lambda: _chunk(op, _reader(blob), k, n))


def _chunk(op: Op, read, k: int, n: int) -> bytes:
    t = time.perf_counter()
    data = op.compute_chunk(read, k)
    if len(data) != n:
        raise GGUFError(f"{op.description} produced {len(data)} bytes for chunk {k}, expected {n}")
    log.debug("computed %s chunk %d (%d bytes) in %.3f s", op.description, k, n, time.perf_counter() - t)
    return data


# How each kind of segment is assembled: (segment, blob, out) -> its bytes into out.
_FILL: dict[type, Callable[[Any, BlobFile | None, memoryview], None]] = {
    HeldBytes: _held,
    ZeroBytes: _zeros,
    BlobBytes: _blob,
    InRounds: _rounds,
    Computed: _computed,
    Cached: _cached,
}
