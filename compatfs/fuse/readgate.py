"""Reads of an open file's plain ranges answered in C (`compatfs._accel`'s
read gate), put in the operations table mfusepy hands libfuse as its
read_buf, with the Python read as its fallback.

Each open file gets a plan (`plan`) once a read Python served finds its
blob intact and how it is read decided (`BlobFile.settled`): the view's
blob ranges and zeros, the blob's descriptors (duplicated by the gate) and
the identity the blob must keep.  The gate then answers a read itself where
every byte of it, and `WINDOW` bytes past it, is one of those (the header,
op tensors and the ranges just before them go to Python, which computes
ahead), reading the blob as `BlobFile.read_once_into` reads it, and checks
the blob before and after as `OpenFiles.reading` does: the same status, and
for a followed blob no inotify event queued or taken in since the plan was
made (`Contents.on_events` counts each batch before it is read).  Anything
else, a check that fails or a read that fails or comes short, goes to the
Python read, which judges the file and serves the read or fails it, as
without the gate; the plan is then dropped, and made again after a read
Python serves finds the file intact.  A release forgets the plan (a read
under way finishes on the gate's own descriptors).
"""

from __future__ import annotations

import ctypes
import logging
from array import array
from collections.abc import Callable

import mfusepy as fuse

from ..files.blobfile import DIRECT_MIN
from ..files.watch import contents
from ..translate import accel
from ..view.ahead import WINDOW
from ..view.layout import View
from ..view.segments import BlobBytes, ZeroBytes
from .paths import OpenFile

log = logging.getLogger(__name__)

_BLOB, _ZEROS = 0, 1  # the gate's kinds of segment
_installed = False
_kept: list = []  # the fallbacks libfuse calls through the gate


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
    kind = dict(fuse.fuse_operations._fields_)["read_buf"]
    fallback = kind(read_buf)
    buf = vec_type.buf.offset
    try:
        gate = native.read_gate(
            ctypes.cast(fallback, ctypes.c_void_p).value,
            fuse.fuse_file_info.fh.offset,
            ctypes.sizeof(vec_type),
            vec_type.count.offset,
            buf + buf_type.size.offset,
            buf + buf_type.mem.offset,
        )
    except ValueError:
        return False
    _kept.append(fallback)
    ops.read_buf = kind(gate)
    watch = contents()
    if watch is not None:
        watch.on_events = native.read_events
    _installed = True
    log.info("reads of open files' blob ranges answered in C (compatfs._accel)")
    return True


def plan(fh: int, opened: OpenFile) -> None:
    """After a read of open file `fh` that Python served: a plan for it,
    where the gate is in and it has none alive, once its blob is found
    intact again (the events counted before that judge it from then on)."""
    native = accel.native
    if not _installed or native is None or opened.failed or native.read_planned(fh):
        return
    generation = native.read_generation()
    if not opened.file.intact():
        return
    settled = opened.file.settled()
    if settled is None:
        return
    fd, direct, identity, watch = settled
    native.read_plan(
        fh, fd, direct, identity, watch, generation, _segments(opened.view), opened.view.size, WINDOW, DIRECT_MIN
    )


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


def _segments(view: View) -> bytes:
    """The view's blob ranges and zeros as the gate takes them: (at, size,
    lo, kind) quadruples of signed 64-bit numbers, in view order."""
    out = array("q")
    for seg in view.segments:
        if seg.size <= 0:
            continue
        if isinstance(seg, BlobBytes):
            out.extend((seg.at, seg.size, seg.lo, _BLOB))
        elif isinstance(seg, ZeroBytes):
            out.extend((seg.at, seg.size, 0, _ZEROS))
    return out.tobytes()
