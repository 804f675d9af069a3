"""Whether the mount's FUSE session goes on, for the path invalidations the
rescan thread sends (`compatfs._accel`'s `notices_*`, accel_c/ending.c):
on its way out libfuse frees the high-level library's nodes, which
`fuse_invalidate_path` looks a path up in, before the filesystem's destroy
stops that thread.  The session's end (a read of the FUSE device that finds
the connection gone, seen in C, or `ends` before the loop is ended on a
signal) waits for an invalidation under way, and none is sent after it.
Without compatfs._accel, as libfuse has it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..translate import accel


@contextlib.contextmanager
def going() -> Iterator[bool]:
    """Whether the session goes on; where it does, its end waits until the block is left."""
    native = accel.native
    held = native.notices_hold() if native is not None else True
    try:
        yield held
    finally:
        if held and native is not None:
            native.notices_release()


def begins() -> None:
    """A session begins (an earlier one's end forgotten)."""
    if accel.native is not None:
        accel.native.notices_begin()


def ends() -> None:
    """The session ends, once no invalidation is under way."""
    if accel.native is not None:
        accel.native.notices_end()
