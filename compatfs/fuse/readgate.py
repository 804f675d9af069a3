"""Reads of an open file's plain ranges answered in C (`compatfs._accel`'s
read gate), put in the operations table mfusepy hands libfuse as its
read_buf, with the Python read as its fallback.

Each open file gets a plan (`plan`) at its open, or once a read Python
served finds its blob intact again, with how its blob is read decided
(`BlobFile.settled`): the view's header (copied into the plan where it is
at most `HELD_MOST` bytes), blob ranges and zeros, rows of the blob
(`_rows`): rounds of one row each (a split of an interleaved stack) and
the op tensors a compiled kernel makes row by row from the blob
(`Op.compiled_blocks`: a type-4 MXFP4 stack, whole or a half), the blob's
descriptor, the identity the blob must keep and whether reads give its
pages back behind them.  Where rows have a kin (the other half of the
stack) the gate makes the kin's same rows from the same read, as pages of
the file that `pagecache` hands the kernel (`stores`).  The gate then
answers a read itself where every byte of it, and `WINDOW` bytes past it,
is one of those (a larger header, other op tensors and the ranges just
before them go to Python, which computes ahead), reading the blob as
`BlobFile.read_once_into` reads it (a compiled kernel's blocks into a
buffer, the kernel's output into the reply, pages given back behind the
reads where it `drops_behind`), and checks the blob before and after as
`OpenFiles.reading` does: the same status, and for a followed blob no
inotify event queued or taken in since the plan was made
(`Contents.on_events` counts each batch before it is read).  Anything
else, a check that fails or a read that fails or comes short, goes to the
Python read, which judges the file and serves the read or fails it, as
without the gate; the plan is then dropped, and made again after a read
Python serves finds the file intact.  A release forgets the plan before
the descriptor is closed (the kernel sends it once no read of the file is
under way).  The gate only saves time: a plan that cannot be made is not.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from array import array
from collections.abc import Callable

import mfusepy as fuse

from ..files.blobfile import DROP_LAG, DROP_UNIT
from ..files.watch import contents
from ..translate import accel
from ..view.ahead import WINDOW
from ..view.layout import View
from ..view import assemble
from ..view.segments import BlobBytes, Computed, HeldBytes, InRounds, Segment, ZeroBytes
from . import gates
from .paths import OpenFile

log = logging.getLogger(__name__)

_BLOB, _ZEROS, _MXFP4, _HELD, _ROWS = 0, 1, 2, 3, 4  # the gate's kinds of segment
_NOT_ROWS = (0, 0, 0, -1)  # origin, row, stride and kin of a segment that is not rows
_KERNELS = {("mxfp4", 17): _MXFP4}  # compiled kernels (name, block bytes) the gate runs, as its kind
MAX_RUNS = 1 << 16  # runs of one segment's rounds a plan takes as blob ranges, at most
# A row, or a row of each of two kin and the bytes between them, the gate reads at once: at most this
# (what one of its span buffers holds).
SPAN_MOST = 1 << 20
# A header up to this size is copied into each open file's plan: a projector's, a model's without a big
# vocabulary (whose header is Python's to serve); so many opens make the daemon hold 16 KiB each at most.
HELD_MOST = 16 << 10
_installed = False
_kept: list = []  # the fallbacks libfuse calls through the gate
_packings: weakref.WeakKeyDictionary[View, tuple[bytes, bytes]] = weakref.WeakKeyDictionary()  # (`_packed`)
_packing = threading.Lock()


def install(ops, read_buf: Callable, vec_type: type[ctypes.Structure], buf_type: type[ctypes.Structure]) -> bool:
    """Put the gate in `ops` (mfusepy's fuse_operations), with `read_buf`
    (the Python callback, as mfusepy wraps it) as its fallback, answering
    with a `vec_type` (libfuse's fuse_bufvec, its `buf` one `buf_type`,
    libfuse's fuse_buf).  False where compatfs._accel is not built, the
    table has no read_buf or another mount in this process has the gate."""
    global _installed
    native = accel.native
    if native is None or not ops.read_buf:
        return False
    buf = vec_type.buf.offset
    fallback = gates.put(
        ops,
        "read_buf",
        read_buf,
        lambda at: native.read_gate(
            at,
            fuse.fuse_file_info.fh.offset,
            ctypes.sizeof(vec_type),
            vec_type.count.offset,
            buf + buf_type.size.offset,
            buf + buf_type.mem.offset,
        ),
    )
    if fallback is None:
        return False
    _kept.append(fallback)
    watch = contents()
    if watch is not None:
        watch.on_events = native.read_events
    _installed = True
    log.info("reads of open files' blob ranges answered in C (compatfs._accel)")
    return True


def plan(fh: int, opened: OpenFile, stores: bool) -> None:
    """At the open of `fh`, or after a read of it that Python served: a plan
    for it, where the gate is in and it has none alive, once its blob is
    found intact again (the events counted before that judge it from then
    on); with `stores`, its reads make kin pages."""
    native = accel.native
    if not _installed or native is None or opened.failed or native.read_planned(fh):
        return
    generation = native.read_generation()
    if not opened.file.intact():
        return
    settled = opened.file.settled()
    if settled is None:
        return
    fd, drops, identity, watch = settled
    segments, held = _packed(opened.view)
    lag = DROP_LAG if drops else -1
    try:
        native.read_plan(
            fh, fd, lag, DROP_UNIT, identity, watch, generation, segments, held, opened.view.size, WINDOW, stores
        )
    except (MemoryError, ValueError) as e:
        log.debug("reads of %s answered in Python (no plan: %s)", opened.path, e)


def installed() -> bool:
    """Whether the gate is in (this process has a mount with it)."""
    return _installed


def served() -> int:
    """The reads the gate answered so far."""
    return accel.native.read_served() if _installed and accel.native is not None else 0


def forget(fh: int) -> None:
    """Open file `fh` released: its plan gone."""
    if _installed and accel.native is not None:
        accel.native.read_forget(fh)


def stores_wake(fd: int, limit: int) -> None:
    """Kin pages made from now on while at most `limit` bytes are queued,
    eventfd `fd` written to as they are queued (-1: none made from now on)."""
    if _installed and accel.native is not None:
        accel.native.read_stores_wake(fd, limit)


def stores() -> list[tuple[int, int, int, int]]:
    """The kin pages the gate queued, taken: (fh, offset, mem, size) each,
    its memory given back with `store_free` once sent or dropped."""
    return accel.native.read_stores() if _installed and accel.native is not None else []


def store_free(mem: int, size: int) -> None:
    """A store's memory (from `stores`) given back."""
    if accel.native is not None:
        accel.native.read_store_free(mem, size)


def stores_refused() -> int:
    """Kin ranges the gate did not make so far (its queue full)."""
    return accel.native.read_stores_refused() if _installed and accel.native is not None else 0


def _packed(view: View) -> tuple[bytes, bytes]:
    """`_segments` of `view`, made once per view (a view never changes) and
    kept while the view lives."""
    with _packing:
        hit = _packings.get(view)
    if hit is None:
        hit = _segments(view)
        with _packing:
            _packings[view] = hit
    return hit


def _segments(view: View) -> tuple[bytes, bytes]:
    """The view's segments the gate serves, as it takes them: (at, size, lo,
    kind, origin, row, stride, kin) octuples of signed 64-bit numbers, in
    view order (origin, row, stride 0 and kin -1 but for rows), and the
    bytes held ones are taken from (the header, where it is at most
    `HELD_MOST` bytes).  Rounds whose runs `assemble` reads one by one as
    blob bytes (`_straight`) are those runs."""
    out = array("q")
    held = b""
    for seg in view.segments:
        if isinstance(seg, HeldBytes):
            if seg.size > 0 and not held and len(seg.data) <= HELD_MOST:
                held = seg.data
                out.extend((seg.at, seg.size, seg.lo, _HELD, *_NOT_ROWS))
        elif seg.size > 0:
            for part in _served(seg):
                out.extend(part)
    return out.tobytes(), held


def _served(seg: Segment) -> list[tuple[int, ...]]:
    """What of one segment the gate serves: blob bytes, zeros, the runs of
    straight rounds, or rows (`_rows`) with their kin's; nothing: Python serves it."""
    if isinstance(seg, BlobBytes):
        return [(seg.at, seg.size, seg.lo, _BLOB, *_NOT_ROWS)]
    if isinstance(seg, ZeroBytes):
        return [(seg.at, seg.size, 0, _ZEROS, *_NOT_ROWS)]
    if isinstance(seg, InRounds) and _straight(seg):
        return [(at, size, lo, _BLOB, *_NOT_ROWS) for at, size, lo in _runs(seg)]
    if not isinstance(seg, (InRounds, Computed)) or (rows := _rows(seg)) is None:
        return []
    if not seg.kin:  # (rounds sparser than `assemble.SPARSE`: Python reads them as runs, not whole spans)
        sparse = isinstance(seg, InRounds) and rows[3] > assemble.SPARSE * rows[2]
        return [] if sparse else [(seg.at, seg.size, seg.lo, *rows, -1)]
    kin = seg.kin[0]
    theirs = _rows(kin)
    # The gate takes one kin of the same kind, rows and whole size, whose rows lie close to these.
    if (
        len(seg.kin) != 1
        or theirs is None
        or (theirs[0], *theirs[2:]) != (rows[0], *rows[2:])
        or rows[2] == rows[3]
        or kin.lo
        or kin.size != seg.lo + seg.size
        or abs(theirs[1] - rows[1]) + rows[2] > SPAN_MOST
    ):
        return []
    return [(seg.at, seg.size, seg.lo, *rows, kin.at)]


def _rows(seg: InRounds | Computed) -> tuple[int, int, int, int] | None:
    """(kind, origin, row, stride) where the segment's output is rows of the
    blob (row r the `row` bytes at origin + r * stride) the gate makes:
    rounds of one row each, copied, or an op of a compiled kernel it runs;
    None for any other, or rows apart wider than `SPAN_MOST`."""
    rows = None
    if isinstance(seg, InRounds) and len(seg.rounds.parts) == 1:
        (at, offset, unit, stride) = seg.rounds.parts[0]
        if at == 0 and unit == seg.rounds.period and stride > unit:
            rows = (_ROWS, offset, unit, stride)
    elif isinstance(seg, Computed) and (c := seg.op.compiled_blocks) is not None:
        kind = _KERNELS.get((c.kernel, c.block))
        rows = (kind, c.origin, c.row, c.stride) if kind is not None else None
    return rows if rows is not None and (rows[2] <= SPAN_MOST or rows[2] == rows[3]) else None


def _straight(seg: InRounds) -> bool:
    """Whether `assemble` reads every run of the segment's rounds straight
    into place, as blob bytes (each `assemble.DIRECT` bytes or more, or
    sparser than one in `assemble.SPARSE`), and makes no kin's pages from
    those reads; and they are at most `MAX_RUNS`."""
    r = seg.rounds
    return (
        not seg.kin
        and r.count * len(r.parts) <= MAX_RUNS
        and all(unit >= assemble.DIRECT or stride > assemble.SPARSE * unit for _, _, unit, stride in r.parts)
    )


def _runs(seg: InRounds) -> list[tuple[int, int, int]]:
    """The segment's bytes as blob runs: (view offset, size, blob offset), in view order."""
    r, lo, hi = seg.rounds, seg.lo, seg.lo + seg.size
    runs = []
    for k in range(r.count):
        for at, offset, unit, stride in sorted(r.parts):
            a = k * r.period + at
            s, e = max(a, lo), min(a + unit, hi)
            if s < e:
                runs.append((seg.at + s - lo, e - s, offset + k * stride + s - a))
    return runs
