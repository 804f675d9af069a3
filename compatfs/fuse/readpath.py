"""The read path: a read is answered with one page-aligned malloc'ed buffer
that libfuse frees (`read_buf`), filled by `view.assemble` through the blob the
open file holds: blob ranges are read into C memory (with preadv, as
`BlobFile.read_once_into` reads them; their bytes never become Python
objects), ranges of elementwise ops are computed straight
into it, header bytes and op tensors' chunks copied in; the same ranges of
the kin of the op tensors read (`segments.kin_of`) are made from the same
reads and queued for the kernel's page cache (`pagecache`).  The open file's blob is
checked again after filling: a blob cut short or rewritten under a read is
EIO, never a short reply or bytes of another file.  A failed read is logged
at most once per blob every `READ_LOG_SECONDS`, the next line counting the
failures left out.
"""

from __future__ import annotations

import ctypes
import errno
import logging
from collections.abc import Callable

from . import libfuse
from ..view import assemble
from ..files.libc import LIBC, PAGE, malloc_aligned
from .libfuse import fuse
from .pagecache import Gathered
from .paths import OpenFile
from .throttle import Throttle, left_out

log = logging.getLogger(__name__)

READ_LOG_SECONDS = 10.0  # a blob's failed reads are logged at most once this often
_failures = Throttle(READ_LOG_SECONDS)  # of the process: one mount serves from it


def _fill(opened: OpenFile, offset: int, out: memoryview, kin: Gathered | None) -> None:
    """The view's bytes at `offset` into `out`, every blob byte (op inputs
    included) read through the open file's blob (and the same ranges of
    their kin's into `kin`); EIO and a log line when the
    blob cannot give them or an op fails on its data (throttled per blob)."""
    try:
        assemble.fill(opened.view.segments, opened.file, offset, out, kin.into if kin is not None else None)
    except Exception as e:  # a blob cut short, an op that fails on bad tensor data
        quiet = _failures.due(opened.blob)
        if quiet is not None:
            log.error("read of %s at %d failed: %s%s", opened.blob, offset, e, left_out(quiet))
        raise fuse.FuseOSError(errno.EIO) from None


def reply(
    opened: OpenFile, bufpp, size: int, offset: int, recheck: Callable[[], OpenFile], kin: Gathered | None = None
) -> None:
    """Answer a read of `size` bytes at `offset` of `opened`'s view in `bufpp`;
    `recheck` checks the open file's blob again once the bytes are in.  With
    `kin`, the pages of the kin of the op tensors read, made from the same
    reads of the blob, are queued for the kernel's page cache once the blob
    is found intact after them (`pagecache`)."""
    n = max(0, min(size, opened.view.size - offset))
    # One memory buffer, which libfuse frees, filled here (a blob cut
    # short under a read is EIO, never a short reply, which the kernel
    # would take for the end of the file).
    mem = malloc_aligned(max(n, 1), PAGE)
    if not mem:
        raise fuse.FuseOSError(errno.ENOMEM)
    try:
        if n:
            _fill(opened, offset, memoryview((ctypes.c_char * n).from_address(mem)).cast("B"), kin)
        if kin is not None:
            kin.complete(lambda at, out: assemble.fill_aside(opened.view.segments, opened.file, at, out))
        recheck()  # the blob is still the one the view was built from (the kin's bytes too)
        libfuse.reply_buffer(bufpp, mem, n)
    except BaseException:
        LIBC.free(mem)
        if kin is not None:
            kin.drop()
        raise
    if kin is not None:
        kin.queue()
