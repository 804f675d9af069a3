"""Scratch memory for one read (or one range computed ahead of a reader),
given back after it and reused by the next:
a read that mapped fresh pages for its buffers would fault each of them in
again (and on a VM whose host takes freed memory back, each fault is dear:
a fresh 2 MiB buffer per 1 MiB read cost the daemon more CPU than the copies
themselves).  Buffers are page-aligned (whole pages mapped), sized in
powers of two up to 1 MiB and in whole MiB above; at most `KEEP` wait for a
reader, who takes the smallest large enough (or, finding none, a new one).
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from collections.abc import Iterator

import numpy as np

KEEP = 16  # spare buffers kept at most (about one per read running at once)
SMALLEST = 64 << 10
MiB = 1 << 20

_spare: list[np.ndarray] = []
_lock = threading.Lock()


@contextlib.contextmanager
def scratch(nbytes: int) -> Iterator[np.ndarray]:
    """A page-aligned uint8 array of at least `nbytes` bytes, for this block only."""
    buf = take(nbytes)
    try:
        yield buf
    finally:
        give(buf)


def take(nbytes: int) -> np.ndarray:
    """A page-aligned uint8 array of at least `nbytes` bytes, the caller's
    until it is given back with `give`."""
    with _lock:
        fits = [i for i, b in enumerate(_spare) if len(b) >= nbytes]
        found = min(fits, key=lambda i: len(_spare[i])) if fits else None
        buf = _spare.pop(found) if found is not None else None
    if buf is None:
        size = max(SMALLEST, 1 << (nbytes - 1).bit_length()) if nbytes <= MiB else -(-nbytes // MiB) * MiB
        buf = np.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.uint8)
    return buf


def give(buf: np.ndarray) -> None:
    """A buffer from `take` given back (kept for the next reader, or unmapped)."""
    with _lock:
        _spare.append(buf)
        if len(_spare) > KEEP:
            _spare.pop(min(range(len(_spare)), key=lambda i: len(_spare[i])))
