"""The libfuse 3 binding: which library mfusepy loads, its version, the
structs of a buffer reply, the session calls compatfs makes itself
(invalidate a path's kernel caches, end the loop), and the Python thread
state its worker threads keep between callbacks.

libfuse 3 is chosen explicitly: mfusepy would take libfuse 2 first.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading

# mfusepy takes libfuse 2 when both are installed; this layer is written for 3.
if not os.environ.get("FUSE_LIBRARY_PATH"):
    os.environ["FUSE_LIBRARY_NAME"] = "fuse3"

import mfusepy as fuse  # noqa: E402

from ..files.access import Caller  # noqa: E402
from ..files.libc import LIBC  # noqa: E402


class _FuseBuf(ctypes.Structure):
    # libfuse 3's struct fuse_buf.
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("flags", ctypes.c_int),
        ("mem", ctypes.c_void_p),
        ("fd", ctypes.c_int),
        ("pos", ctypes.c_int64),
    ]


class _FuseBufvec(ctypes.Structure):
    # libfuse 3's struct fuse_bufvec holding one buffer (libfuse declares
    # `buf[1]` inline; mfusepy's declaration has a pointer there).
    _fields_ = [
        ("count", ctypes.c_size_t),
        ("idx", ctypes.c_size_t),
        ("off", ctypes.c_size_t),
        ("buf", _FuseBuf * 1),
        ("_slack", ctypes.c_size_t * 2),
    ]


def libfuse_version() -> str:
    """The libfuse this process runs on, e.g. "3.14.0"."""
    lib = fuse._libfuse
    try:
        lib.fuse_pkgversion.restype = ctypes.c_char_p
        return lib.fuse_pkgversion().decode()
    except AttributeError:
        return f"{fuse.fuse_version_major}.{fuse.fuse_version_minor}"


def libfuse_tuple() -> tuple[int, int]:
    try:
        major, minor = libfuse_version().split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


if fuse.fuse_version_major != 3:
    raise OSError(f"compatfs needs libfuse 3; {fuse._libfuse_path} is libfuse {libfuse_version()}")

# A read is answered in one memory buffer, whatever it spans (the serving
# log line names it).
READ_REPLIES = "single-buffer"

_libfuse = fuse._libfuse
_libfuse.fuse_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_libfuse.fuse_invalidate_path.restype = ctypes.c_int
_libfuse.fuse_exit.argtypes = [ctypes.c_void_p]


# Beyond this libfuse ignores a max_idle_threads value (and keeps its default).
_MAX_LOOP_THREADS = 100_000


def workers_stay(options: dict) -> bool:
    """Whether the loop's worker threads, once started, all run until it ends
    (the `max_threads` and `max_idle_threads` of `options`, as libfuse takes
    them): libfuse 3.12+ ends a worker only while more than max_idle_threads
    are idle, by default never; older ones end them after 10 idle."""
    if libfuse_tuple() < (3, 12):
        return False
    try:
        idle = int(options.get("max_idle_threads", -1))
        workers = int(options.get("max_threads", 10))
    except (TypeError, ValueError):
        return False
    return idle < 0 or idle > _MAX_LOOP_THREADS or idle >= workers


# libfuse's (and the kernel's) own default limit on requests in flight.
_KERNEL_BACKGROUND = 12


def background(options: dict) -> tuple[int, int]:
    """The INIT reply's `max_background` and `congestion_threshold` for a
    loop run with `options`: as many read-ahead requests in flight as the
    loop has workers to answer them (`max_threads`, libfuse's 10 when
    unset), never fewer than the kernel's 12, and the kernel's own ratio of
    the two (3/4).  A cold mapped read (llama-server's MAP_POPULATE after
    FADV_SEQUENTIAL) keeps two read-ahead windows of 1 MiB requests in
    flight: at 12, most of them wait in the kernel for a slot."""
    try:
        workers = int(options.get("max_threads", 10))
    except (TypeError, ValueError):
        workers = 10
    most = max(_KERNEL_BACKGROUND, workers)  # libfuse caps it at 65535
    return most, most * 3 // 4


_kept = threading.local()


def keep_thread_state() -> None:
    """Keep the calling thread's Python thread state from this callback to
    the next.  ctypes runs a callback from a thread Python did not start in
    a new thread state and deletes it on return: per request a
    PyThreadState_New, an mmap of its frame stack and an munmap, whose TLB
    shootdown interrupts the other cores.  One more PyGILState_Ensure, once
    per thread, keeps the state (and the thread-local values) for the
    thread's life.  Only for threads that run until the loop ends
    (`workers_stay`): each keeps one state of a few KiB."""
    if not getattr(_kept, "held", False):
        ctypes.pythonapi.PyGILState_Ensure()
        _kept.held = True


def session() -> int:
    """The FUSE session of the request being answered (libfuse's context)."""
    return _libfuse.fuse_get_context().contents.fuse


def caller() -> Caller:
    """The process whose request is being answered (libfuse's context)."""
    return Caller(*fuse.fuse_get_context())


def invalidate_path(ptr: int, path: str) -> None:
    """Drop the kernel's attributes and pages of `path` (if it knows it)."""
    _libfuse.fuse_invalidate_path(ptr, path.encode())


def exit_loop(ptr: int) -> None:
    """Flag the session's loop to end."""
    _libfuse.fuse_exit(ptr)


def reply_buffer(bufpp, mem: int, n: int) -> None:
    """Answer a read_buf with the `n` bytes at `mem` (malloc'ed; libfuse frees
    it, and the bufvec put in `bufpp`); ENOMEM, `mem` still the caller's, when
    the bufvec cannot be allocated."""
    out = LIBC.malloc(ctypes.sizeof(_FuseBufvec))
    if not out:
        raise fuse.FuseOSError(errno.ENOMEM)
    vec = _FuseBufvec(count=1)
    vec.buf[0].size, vec.buf[0].mem = n, mem
    ctypes.memmove(out, ctypes.addressof(vec), ctypes.sizeof(vec))
    ctypes.cast(bufpp, ctypes.POINTER(ctypes.c_void_p))[0] = out
