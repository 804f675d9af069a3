"""The libfuse 3 binding: which library mfusepy loads, its version, the
structs of a buffer reply, the session calls compatfs makes itself
(invalidate a path's kernel caches, end the loop), the Python thread
state its worker threads keep between callbacks, and `FUSE`, mfusepy's
loop with folders kept by the kernel and listed with their attributes.

libfuse 3 is chosen explicitly: mfusepy would take libfuse 2 first.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import sys
import threading

# mfusepy takes libfuse 2 when both are installed; this layer is written for 3.
if not os.environ.get("FUSE_LIBRARY_PATH"):
    os.environ["FUSE_LIBRARY_NAME"] = "fuse3"

import mfusepy as fuse  # noqa: E402

from ..files.access import Caller  # noqa: E402
from ..files.libc import LIBC  # noqa: E402
from ..translate import accel  # noqa: E402
from . import gates, readgate  # noqa: E402
from .listings import Listings  # noqa: E402
from .statfill import EntryFiller, StatFiller  # noqa: E402

log = logging.getLogger(__name__)


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


# libfuse 3's readdir flags (fuse.h): the request is a READDIRPLUS; an
# entry filled with its attributes.
FUSE_READDIR_PLUS = 1 << 0
FUSE_FILL_DIR_PLUS = 1 << 1
# fuse_common.h's capabilities: listings with attributes, and the kernel's
# choice of when to ask for them.
FUSE_CAP_READDIRPLUS = 1 << 13
FUSE_CAP_READDIRPLUS_AUTO = 1 << 14


def want_listings_with_attributes(conn) -> None:
    """Have the kernel ask for every listing with its entries' attributes
    (READDIRPLUS, not only for a listing's first part as libfuse's default
    `readdirplus=auto` has it): `ls -l` then looks up no entry one by one."""
    if conn.capable & FUSE_CAP_READDIRPLUS:
        conn.want = (conn.want | FUSE_CAP_READDIRPLUS) & ~FUSE_CAP_READDIRPLUS_AUTO


class FUSE(fuse.FUSE):
    """mfusepy's loop, with folders the kernel keeps and lists with attributes:

    - `opendir` answers with `keep_cache` and `cache_readdir`: the kernel
      keeps a folder's listing across opens, until the filesystem
      invalidates the folder (`invalidate_path`) or it is evicted; the
      filesystem's `opendir` (every open of a folder reaches it) decides
      who may list it.
    - `readdir` fills each entry with an offset (its position + 1: a later
      request goes on from there) and, when the kernel asks for attributes
      (READDIRPLUS), with what the filesystem's `entry_attrs` gives for it,
      as getattr would (none: the kernel looks the entry up itself).
      libfuse 3.14 counts a lookup of an entry that does not fit in the
      reply any more: its node is then kept until unmount (one per path).
    - where compatfs._accel is built and the filesystem's `opendir` lets
      root list anything with nothing looked up (`root_lists_all`), root's
      opens of folders and the ends of listings are answered in C
      (`gates`); each open of a folder then has an fh of its own; where
      it also follows what it remembers (`follow_changes`), so are the
      listings of folders kept after one listed in Python (`listings`);
      and reads of open files' blob ranges are answered in C (`readgate`).
    """

    _gates: gates.Gates | None = None
    _listings: Listings | None = None

    def __init__(self, operations, mountpoint: str, **kwargs) -> None:
        if accel.native is None or not getattr(operations, "root_lists_all", False):
            super().__init__(operations, mountpoint, **kwargs)
            return
        real = fuse.fuse_main_real

        def main_real(argc, argv, ops, size, data):
            fuse.fuse_main_real = real
            _patching.release()
            try:
                self._gate_folders(ops.contents)
            except Exception as e:  # the gates only save time: the mount goes on without them
                log.warning("folders opened by root answered in Python (no gate: %s)", e)
            try:
                readgate.install(ops.contents, functools.partial(self._wrapper, self.read_buf), _FuseBufvec, _FuseBuf)
            except Exception as e:
                log.warning("reads answered in Python (no gate: %s)", e)
            try:
                return real(argc, argv, ops, size, data)
            finally:
                if self._listings is not None:
                    self._listings.close()

        _patching.acquire()
        fuse.fuse_main_real = main_real  # mfusepy's __init__ calls it with the table it made
        try:
            super().__init__(operations, mountpoint, **kwargs)
        finally:
            if fuse.fuse_main_real is main_real:  # (not called: mfusepy failed before mounting)
                fuse.fuse_main_real = real
                _patching.release()

    def _gate_folders(self, ops) -> None:
        bits = _listing_bits()
        if bits is not None:
            opendir = functools.partial(self._wrapper, self.opendir)
            readdir = functools.partial(self._wrapper, self.readdir_fuse_3)
            plus = (ctypes.sizeof(fuse.c_stat), FUSE_READDIR_PLUS)
            self._gates = gates.install(ops, bits, _libfuse.fuse_get_context, opendir, readdir, plus)
            follows = getattr(self.operations, "follow_changes", None) is not None
            if follows and self._gates is not None and self._gates.listed is not None:
                self._listings = Listings(self.operations, self._entries)

    def opendir(self, path: bytes, fip) -> int:
        fi = fip.contents
        fh = self.operations.opendir(path.decode(self.encoding, self.errors))
        fi.fh = self._gates.handle() if self._gates is not None else fh  # (CompatFS.opendir's is always 0)
        fi.keep_cache = 1
        fi.cache_readdir = 1
        return 0

    def readdir_fuse_3(self, path: bytes | None, buf, filler, offset: int, fip, flags: int) -> int:
        folder = None if path is None else path.decode(self.encoding, self.errors)
        entries = self.operations.readdir(folder, fip.contents.fh)
        plus = bool(flags & FUSE_READDIR_PLUS) and folder is not None
        base = "" if folder is None else folder.rstrip("/")
        st = fuse.c_stat()
        filled = self._entries
        for position in range(max(offset, 0), len(entries)):
            name, fill = filled.plus(base, entries[position], st) if plus else filled.plain(entries[position], st)
            if filler(buf, name, st, position + 1, fill) != 0:
                return 0  # the reply is full: the kernel asks again from this entry's offset
        if self._gates is not None and self._gates.listed is not None and offset < len(entries):
            self._gates.listed(fip.contents.fh, len(entries))
        if plus and offset <= 0 and self._listings is not None:
            assert folder is not None
            self._listings.after(folder)
        return 0

    @functools.cached_property
    def _entries(self) -> EntryFiller:
        return EntryFiller(self.operations, _STAT, self.use_ns, self.encoding, self.errors, FUSE_FILL_DIR_PLUS)


_STAT = StatFiller(fuse.c_stat, fuse.set_st_attrs)
_patching = threading.Lock()  # held while mfusepy's fuse_main_real is FUSE's own (one FUSE made at a time)


# libfuse before 3.16.1 answers an OPENDIR with its own copy of the
# high-level `fuse_file_info` (upstream commit 98eb808, "Pass cache_readdir
# and keep_cache from high level API"): what `opendir` sets is dropped.
# There the session's low-level opendir is wrapped to set both in the reply
# it makes: in C (`_accel.keep_opendir`, no Python callback per folder
# opened) where compatfs._accel is built, else by a ctypes callback.  Where
# it sits in libfuse's private `struct fuse_session` (the same from 3.14 to
# 3.16): the public `fuse_lowlevel_ops` 40 bytes in, of 8-byte members,
# open the 15th, opendir the 21st; the high-level library sets every one of
# its first 26 but the 17th (write: it answers writes by write_buf).
_PASSES_DIR_FLAGS = (3, 16, 1)
_SESSION_OPS, _OPENDIR, _UNSET, _CHECKED = 40, 20, 16, 26
OP_OPEN = 14  # where `session_ops` has the low-level open
# libfuse's low-level open and opendir: (request, node id, fuse_file_info *)
_LOWLEVEL_OPEN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(fuse.fuse_file_info))
_libfuse.fuse_get_session.argtypes = [ctypes.c_void_p]
_libfuse.fuse_get_session.restype = ctypes.c_void_p
_libfuse.fuse_session_fd.argtypes = [ctypes.c_void_p]
_libfuse.fuse_session_fd.restype = ctypes.c_int
_libfuse.fuse_lowlevel_notify_store.argtypes = [
    ctypes.c_void_p,
    ctypes.c_uint64,
    ctypes.c_int64,
    ctypes.c_void_p,
    ctypes.c_int,
]
_libfuse.fuse_lowlevel_notify_store.restype = ctypes.c_int
_libfuse.fuse_session_custom_io.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
_libfuse.fuse_session_custom_io.restype = ctypes.c_int
_SESSION_IO = 16  # where `struct fuse_session` has its custom io (after the mountpoint, exited and fd)
_wrapped: list = []  # the wrappers installed (kept alive for the process's life)


def _version_tuple() -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in libfuse_version().split(".")[:3])
    except ValueError:
        return (0,)


def session_ops(ptr: int, mountpoint: str):
    """The low-level operations table (`_CHECKED` addresses, writable) of
    session `ptr`, mounted at `mountpoint`, on libfuse 3.14 to 3.16; None
    where the session is not laid out as expected (its descriptor and
    mountpoint, the operations set and unset, where they should be).  A
    caller may replace an operation only while no request but INIT is
    answered."""
    if not (3, 14) <= _version_tuple() < (3, 17):
        return None
    se = _libfuse.fuse_get_session(ptr)
    if not se:
        return None
    ops = (ctypes.c_void_p * _CHECKED).from_address(se + _SESSION_OPS)
    mounted = ctypes.c_char_p.from_address(se).value
    if (
        ctypes.c_int.from_address(se + 12).value != _libfuse.fuse_session_fd(se)
        or mounted is None
        or os.fsdecode(mounted) != mountpoint
        or [bool(op) for op in ops] != [i != _UNSET for i in range(_CHECKED)]
    ):
        return None
    return ops


def use_io(ptr: int, mountpoint: str, io: int) -> bool:
    """Have session `ptr` (mounted at `mountpoint`) read requests and write
    replies through `io`, the address of a `struct fuse_custom_io` that
    lives as long as the process, where the session is laid out as expected
    (`session_ops`) and has no io of its own; whether it does.  Call while
    no request but INIT is answered."""
    if session_ops(ptr, mountpoint) is None:
        return False
    se = _libfuse.fuse_get_session(ptr)
    if ctypes.c_void_p.from_address(se + _SESSION_IO).value:
        return False
    return _libfuse.fuse_session_custom_io(se, io, _libfuse.fuse_session_fd(se)) == 0


def wrap_op(ops, index: int, wrapper) -> None:
    """Answer the low-level open or opendir at `index` of `ops` (from
    `session_ops`) with `wrapper(original, req, ino, fi)`, where `original`
    is the one it replaces (kept alive for the process's life)."""
    original = _LOWLEVEL_OPEN(ops[index])
    installed = _LOWLEVEL_OPEN(functools.partial(wrapper, original))
    _wrapped.append((installed, original))
    ops[index] = ctypes.cast(installed, ctypes.c_void_p).value


def keep_listings(ptr: int, mountpoint: str) -> str:
    """Have the kernel keep the listings of session `ptr`'s folders (see
    `FUSE.opendir`) on a libfuse that drops what `opendir` sets: its
    low-level opendir wrapped, once the session is found laid out as
    expected (`session_ops`); call while no request but INIT is answered.
    Returns the line to log."""
    version = _version_tuple()
    if version >= _PASSES_DIR_FLAGS:
        return "folder listings kept by the kernel"
    if version < (3, 14):
        return f"folder listings not kept by the kernel (libfuse {libfuse_version()})"
    ops = session_ops(ptr, mountpoint)
    if ops is None:
        return f"folder listings not kept by the kernel (libfuse {libfuse_version()}'s session is not as expected)"
    bits = _listing_bits()
    if accel.native is not None and bits is not None:
        try:
            ops[_OPENDIR] = accel.native.keep_opendir(ops[_OPENDIR], *bits)
        except ValueError:
            pass  # (another opendir wrapped already in this process: the ctypes wrapper below)
        else:
            return f"folder listings kept by the kernel (libfuse {libfuse_version()}'s opendir wrapped in C)"

    def opendir(original, req, ino, llfi) -> None:
        fi = llfi.contents
        fi.keep_cache = 1
        fi.cache_readdir = 1
        original(req, ino, llfi)

    wrap_op(ops, _OPENDIR, opendir)
    return f"folder listings kept by the kernel (libfuse {libfuse_version()}'s opendir wrapped)"


def _listing_bits() -> tuple[int, int] | None:
    """Where `fuse_file_info`'s keep_cache and cache_readdir bits are (as
    mfusepy declares the struct): the offset of the 32-bit word holding
    both and the word with only them set, for `_accel.keep_opendir`; None
    where they are not in one word."""
    fi = fuse.fuse_file_info()
    fi.keep_cache = fi.cache_readdir = 1
    raw = bytes(fi)
    at = [i for i, b in enumerate(raw) if b]
    offset = at[0] - at[0] % 4
    if at[-1] >= offset + 4:
        return None
    return offset, int.from_bytes(raw[offset : offset + 4], sys.byteorder)


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


def notify_store(ptr: int, node: int, offset: int, mem: int, n: int) -> bool:
    """Put the `n` bytes at `mem` in the kernel's page cache of node `node`
    of session `ptr` from `offset` (`fuse_lowlevel_notify_store`); whether
    the kernel took them."""
    se = _libfuse.fuse_get_session(ptr)
    if not se:
        return False
    vec = _FuseBufvec(count=1)
    vec.buf[0].size, vec.buf[0].mem = n, mem
    return _libfuse.fuse_lowlevel_notify_store(se, node, offset, ctypes.byref(vec), 0) == 0


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
