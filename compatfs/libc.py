"""What compatfs asks of the C library itself: `malloc`/`free` for the read
replies libfuse frees, and the allocator's thresholds (the daemon and its
indexing workers tune them differently; a glibc call, elsewhere it does
nothing)."""
from __future__ import annotations

import ctypes
import ctypes.util

LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
LIBC.malloc.restype = ctypes.c_void_p
LIBC.malloc.argtypes = [ctypes.c_size_t]
LIBC.free.argtypes = [ctypes.c_void_p]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


def tune_malloc(mmap_threshold: int, trim_threshold: int, arenas: int | None = None) -> None:
    """Allocations of `mmap_threshold` bytes or more mapped on their own (and
    returned when freed); at most `trim_threshold` free bytes kept at the top
    of a heap; at most `arenas` heaps (glibc's `mallopt`)."""
    try:
        if arenas is not None:
            LIBC.mallopt(_M_ARENA_MAX, arenas)
        LIBC.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
        LIBC.mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    except AttributeError:      # not glibc
        pass
