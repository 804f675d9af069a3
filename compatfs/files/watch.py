"""What the kernel reports of changes on disk: Linux's inotify, asked
without blocking.

A `Watch` follows each folder it is given (entries created, removed,
renamed, written, their owner, mode or times changed, and the folder's own),
not the folders below it, and for some only the entries of given names.
`changed` tells whether any event that counts came in (or the kernel's queue
overflowed, which means the same) and drains them.  It
sees changes made through the folder on this machine, not those of a file a
symlink leads elsewhere, nor those a network filesystem's other clients
make: what it reports is a reason to look, never a reason not to.  Where
inotify cannot be used (not Linux, no more watches allowed), `Watch.open`
gives None.

`Contents` (one per process: `contents()`) follows the inodes of files held
open to serve reads, and tells, per file, whether the kernel reported a
write of its bytes or only a change of its metadata (`Followed`):
`blobfile.BlobFile` judges a followed file by that.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .libc import LIBC
from .lookup import resolved
from .walkscope import scope

log = logging.getLogger(__name__)

_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, 0o2000000
# modify, attrib, close-write, moved from/to, create, delete, delete-self, move-self
_EVENTS = 0x002 | 0x004 | 0x008 | 0x040 | 0x080 | 0x100 | 0x200 | 0x400 | 0x800
_ONLYDIR = 0x01000000
_IGNORED = 0x8000  # the watch is gone (its folder was removed)
_EVENT = struct.Struct("iIII")


def _libc():
    """The C library loaded once for the process (`libc.LIBC`: no search for
    it, which runs ldconfig, at a mount's start or its first open), with
    inotify's calls typed; None where it has none."""
    try:
        lib = LIBC
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        return lib
    except AttributeError:
        return None


class Watch:
    """An inotify descriptor following some folders."""

    def __init__(self, lib, fd: int):
        self._lib = lib
        self._fd = fd
        self._watched: dict[str, int] = {}  # folder -> watch descriptor
        self._only: dict[int, set[str]] = {}  # watch descriptor -> the only names whose events count in it

    @classmethod
    def open(cls) -> Watch | None:
        lib = _libc()
        if lib is None:
            return None
        fd = lib.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            log.info("no inotify (%s): the store is rescanned on a timer only", os.strerror(ctypes.get_errno()))
            return None
        return cls(lib, fd)

    def follow(self, folders: set[Path], only: dict[Path, set[str]] | None = None) -> bool:
        """Follow exactly `folders` from now on; whether one was not followed
        before (a change made in it before now is not reported).  In a
        folder of `only`, only events naming one of its names (or the folder
        itself) count: the others (a file being downloaded beside the blobs a
        scan named) are drained unseen.  A folder that cannot be followed is
        passed over (logged once, when inotify allows no more watches)."""
        wanted = {str(f) for f in folders}
        for gone in set(self._watched) - wanted:
            self._lib.inotify_rm_watch(self._fd, self._watched.pop(gone))
        added = False
        with scope():  # (the folders' walks share what they pass, as a scan's do)
            for folder in sorted(wanted - set(self._watched)):
                wd = self._add(folder)
                if wd >= 0:
                    self._watched[folder] = wd
                    added = True
                elif ctypes.get_errno() == errno.ENOSPC:
                    log.warning(
                        "inotify allows no more watches (fs.inotify.max_user_watches): %s and others "
                        "are followed by the rescan's timer only",
                        folder,
                    )
                    break
        self._only = {self._watched[str(f)]: names for f, names in (only or {}).items() if str(f) in self._watched}
        return added

    def _add(self, folder: str) -> int:
        """A watch of `folder` as `lookup` resolves it (never into compatfs's
        own mount; a hung lookup fails in bounded time), added by its
        descriptor; -1 (errno set where inotify refused it) when there is none."""
        try:
            fd = resolved(folder)
        except OSError:
            ctypes.set_errno(0)
            return -1
        try:
            return self._lib.inotify_add_watch(self._fd, f"/proc/self/fd/{fd}".encode(), _EVENTS | _ONLYDIR)
        finally:
            os.close(fd)

    def changed(self) -> bool:
        """Whether an event that counts came in since the last call (all are
        drained); a folder whose watch went with it is followed again by the
        next `follow`."""
        seen = False
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return seen
            except OSError:
                return True
            if not data:
                return seen
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size : at + _EVENT.size + length].rstrip(b"\0")
                at += _EVENT.size + length
                only = self._only.get(wd)
                seen = seen or only is None or not name or os.fsdecode(name) in only
                if mask & _IGNORED:
                    for folder in [f for f, w in self._watched.items() if w == wd]:
                        del self._watched[folder]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# -- open files ----------------------------------------------------------------
# What the kernel reports of a file's inode: its bytes written (a write, a
# truncation, fallocate, a writable descriptor closed: IN_MODIFY,
# IN_CLOSE_WRITE), its metadata changed (mode, owner, ACL and other
# xattrs, times, links: IN_ATTRIB).
_WRITTEN = 0x002 | 0x008
_TOUCHED = 0x004
_OVERFLOW = 0x4000


class Followed:
    """What the kernel reported of one open file's inode since `Contents.follow`:
    `written` (its bytes may have changed), `touched` (its metadata changed,
    since `touched` was last cleared), `lost` (events of it may be missing:
    its watch went, or the queue overflowed).  `ctime` is its holder's: the
    change time it last found the file intact with."""

    __slots__ = ("wd", "ctime", "written", "touched", "lost", "users")

    def __init__(self, wd: int, ctime: int):
        self.wd, self.ctime = wd, ctime
        self.written = self.touched = self.lost = False
        self.users = 1  # its holder and the duplicates of its descriptor


class Contents:
    """One inotify descriptor following the inodes of open files (each
    added by its descriptor, `/proc/self/fd/N`, so a file removed from its
    folder is followed all the same), for the process: `contents()`."""

    def __init__(self, lib, fd: int):
        self._lib, self._fd = lib, fd
        self._lock = threading.Lock()
        self._by_wd: dict[int, list[Followed]] = {}
        self._queued = select.poll()
        self._queued.register(fd, select.POLLIN)
        # Told before each batch of events is read, with an event queued
        # (what answers reads in C judges an open file by: the batch counted
        # before its events are taken in, none queued means none missed).
        self.on_events: Callable[[], None] | None = None

    @property
    def fd(self) -> int:
        """The inotify descriptor (events queued on it are news not yet taken in)."""
        return self._fd

    def follow(self, fd: int, ctime: int) -> Followed | None:
        """Follow the file open as `fd` from now on (what happened to it
        before is not reported); None where it cannot be followed."""
        with self._lock:
            wd = self._lib.inotify_add_watch(self._fd, f"/proc/self/fd/{fd}".encode(), _WRITTEN | _TOUCHED)
            if wd < 0:
                if ctypes.get_errno() == errno.ENOSPC:
                    log.warning(
                        "inotify allows no more watches (fs.inotify.max_user_watches): an open file's "
                        "blob changing its mode, owner or links now fails its reads"
                    )
                return None
            self._drain()  # what came before this follower began is not its news
            followed = Followed(wd, ctime)
            self._by_wd.setdefault(wd, []).append(followed)
            return followed

    def share(self, followed: Followed) -> None:
        """Another holder (a duplicate descriptor) judges by `followed` too."""
        with self._lock:
            followed.users += 1

    def unfollow(self, followed: Followed) -> None:
        """One holder of `followed` closed; its inode's watch goes with the last follower."""
        with self._lock:
            followed.users -= 1
            if followed.users > 0:
                return
            others = [f for f in self._by_wd.get(followed.wd, []) if f is not followed]
            if others:
                self._by_wd[followed.wd] = others
            elif self._by_wd.pop(followed.wd, None) is not None:
                self._lib.inotify_rm_watch(self._fd, followed.wd)

    def news(self, followed: Followed, wait: float = 0.0) -> None:
        """Take in every event reported so far; with `wait`, wait up to that
        many seconds for one of `followed` (written or touched) first."""
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                self._drain()
                if followed.written or followed.touched or followed.lost:
                    return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            select.select([self._fd], [], [], left)

    def settle(self, followed: Followed, fd: int) -> os.stat_result | None:
        """The status of the file open as `fd` now, after every event reported
        so far was taken in, its change time made `followed`'s and `touched`
        cleared (a later change is reported afresh); None when a write of it
        was reported, or it cannot be had."""
        with self._lock:
            self._drain()
            if followed.written:
                return None
            try:
                st = os.fstat(fd)
            except OSError:
                return None
            followed.touched, followed.ctime = False, st.st_ctime_ns
            return st

    def _drain(self) -> None:
        """Read every queued event into its followers (the lock is held)."""
        while True:
            if self.on_events is not None:
                if not self._queued.poll(0):
                    return
                self.on_events()
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._all_lost()
                return
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
                at += _EVENT.size + length
                if mask & _OVERFLOW:
                    self._all_lost()
                for f in self._by_wd.get(wd, ()):
                    f.written |= bool(mask & _WRITTEN)
                    f.touched |= bool(mask & _TOUCHED)
                    f.lost |= bool(mask & _IGNORED)
                if mask & _IGNORED:
                    self._by_wd.pop(wd, None)

    def _all_lost(self) -> None:
        for followers in self._by_wd.values():
            for f in followers:
                f.lost = True


_contents: list[tuple[int, Contents | None]] = []  # (pid, the process's Contents): made on first use
_contents_lock = threading.Lock()


def contents() -> Contents | None:
    """The process's `Contents` (a forked child makes its own), None where
    inotify cannot be used."""
    with _contents_lock:
        if not _contents or _contents[0][0] != os.getpid():
            lib = _libc()
            fd = lib.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC) if lib is not None else -1
            if lib is not None and fd < 0:
                log.warning(
                    "no inotify (%s): an open file's blob changing its mode, owner or links fails its reads",
                    os.strerror(ctypes.get_errno()),
                )
            _contents[:] = [(os.getpid(), Contents(lib, fd) if fd >= 0 else None)]
        return _contents[0][1]
