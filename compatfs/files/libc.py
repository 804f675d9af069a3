"""What compatfs asks of the C library itself: `malloc`/`free` for the read
replies libfuse frees (page-aligned),
memory mapped on its own (`map_memory`: given back to the system whole when
unmapped, never kept in malloc's heaps), the allocator's thresholds (the daemon and its
indexing workers tune them differently; a glibc call, elsewhere it does
nothing) and the free memory inside its heaps given back, how much of a file
range the page cache holds (`cachestat`), and whether a file may be written
by anyone now (a lease's answer)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
import platform
import signal

LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
LIBC.malloc.restype = ctypes.c_void_p
LIBC.malloc.argtypes = [ctypes.c_size_t]
LIBC.free.argtypes = [ctypes.c_void_p]
LIBC.posix_memalign.restype = ctypes.c_int
LIBC.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


def malloc_aligned(size: int, align: int) -> int:
    """`size` bytes from malloc's heap at an address that is a multiple of
    `align` (a power of two), freed with `free`; 0 when there is no memory."""
    mem = ctypes.c_void_p()
    return (mem.value or 0) if LIBC.posix_memalign(ctypes.byref(mem), align, size) == 0 else 0


LIBC.mmap.restype = ctypes.c_void_p
LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def map_memory(size: int) -> int:
    """`size` bytes of zeroed, page-aligned memory mapped on their own,
    given back with `unmap_memory(mem, size)`; 0 when there is no memory."""
    mem = LIBC.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    return 0 if mem in (None, _MAP_FAILED) else int(mem)


def unmap_memory(mem: int, size: int) -> None:
    """Memory from `map_memory` given back to the system."""
    LIBC.munmap(mem, size)


def tune_malloc(mmap_threshold: int, trim_threshold: int, arenas: int | None = None) -> None:
    """Allocations of `mmap_threshold` bytes or more mapped on their own (and
    returned when freed); at most `trim_threshold` free bytes kept at the top
    of a heap; at most `arenas` heaps (glibc's `mallopt`)."""
    try:
        if arenas is not None:
            LIBC.mallopt(_M_ARENA_MAX, arenas)
        LIBC.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
        LIBC.mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    except AttributeError:  # not glibc
        pass


PAGE = os.sysconf("SC_PAGE_SIZE")
GROWN = 32 << 20  # resident memory grown this much since the last give-back: free memory is given back again
_given_back = [0]  # resident bytes right after the last give-back


def resident() -> int:
    """This process's resident memory in bytes (/proc/self/statm)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * PAGE


def give_back_free_memory() -> None:
    """The free memory inside malloc's heaps, not just at their tops, given
    back to the system, whole pages of it (glibc's `malloc_trim`; elsewhere
    nothing), where resident memory grew by `GROWN` since the last time:
    the walk of the heaps (up to a millisecond once they are fragmented) is
    not made for every quiet moment."""
    trim = getattr(LIBC, "malloc_trim", None)  # (None: not glibc)
    if trim is None or resident() < _given_back[0] + GROWN:
        return
    trim(0)
    _given_back[0] = resident()


_SYS_CACHESTAT = 451  # since Linux 6.5, on every architecture of the common numbering (all but alpha)
_no_cachestat: list[bool] = [] if platform.machine() != "alpha" else [True]  # set: the call is not to be made


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _CacheStat(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")
    ]


def cached_pages(fd: int, offset: int, size: int) -> int | None:
    """How many of the pages that bytes [offset, offset+size) of the file open
    as `fd` lie in the page cache holds (Linux's `cachestat`); None where the
    kernel does not tell: no such call (before 6.5), or not for this caller
    and file (it answers only for files the caller owns or could write)."""
    if _no_cachestat:
        return None
    where, stat = _Range(offset, size), _CacheStat()
    if LIBC.syscall(_SYS_CACHESTAT, fd, ctypes.byref(where), ctypes.byref(stat), 0) == 0:
        return stat.nr_cache
    if ctypes.get_errno() == errno.ENOSYS:
        _no_cachestat.append(True)
    return None


def pages(offset: int, size: int) -> int:
    """How many pages bytes [offset, offset+size) of a file lie in."""
    return (offset + size - 1) // PAGE - offset // PAGE + 1 if size else 0


_F_SETSIG = 10  # fcntl: the signal a lease break sends (Python's fcntl names F_SETLEASE only)


def written_by_others(fd: int) -> bool | None:
    """Whether any descriptor (or writable shared mapping) of the file open
    as `fd`, a read-only descriptor of this process, may write it now: a
    read lease is refused exactly then (Linux's F_SETLEASE; taken and let go
    at once, its break signal one that is ignored); None where the kernel
    would not say (no leases on that filesystem, or not this caller's file
    without CAP_LEASE)."""
    try:
        fcntl.fcntl(fd, _F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as e:
        return True if e.errno == errno.EAGAIN else None
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    return False
