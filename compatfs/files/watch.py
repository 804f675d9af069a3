"""Whether anything changed in a set of folders on disk since last asked:
Linux's inotify, asked without blocking.

A `Watch` follows each folder it is given (entries created, removed,
renamed, written, their owner, mode or times changed, and the folder's own),
not the folders below it.  `changed` tells whether any event came in (or
the kernel's queue overflowed, which means the same) and drains them.  It
sees changes made through the folder on this machine, not those of a file a
symlink leads elsewhere, nor those a network filesystem's other clients
make: what it reports is a reason to look, never a reason not to.  Where
inotify cannot be used (not Linux, no more watches allowed), `Watch.open`
gives None.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import struct
from pathlib import Path

log = logging.getLogger(__name__)

_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, 0o2000000
# modify, attrib, close-write, moved from/to, create, delete, delete-self, move-self
_EVENTS = 0x002 | 0x004 | 0x008 | 0x040 | 0x080 | 0x100 | 0x200 | 0x400 | 0x800
_ONLYDIR = 0x01000000
_IGNORED = 0x8000          # the watch is gone (its folder was removed)
_EVENT = struct.Struct("iIII")


def _libc():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        return lib
    except (OSError, AttributeError):
        return None


class Watch:
    """An inotify descriptor following some folders."""

    def __init__(self, lib, fd: int):
        self._lib = lib
        self._fd = fd
        self._watched: dict[str, int] = {}    # folder -> watch descriptor

    @classmethod
    def open(cls) -> "Watch | None":
        lib = _libc()
        if lib is None:
            return None
        fd = lib.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            log.info("no inotify (%s): the store is rescanned on a timer only", os.strerror(ctypes.get_errno()))
            return None
        return cls(lib, fd)

    def follow(self, folders: set[Path]) -> bool:
        """Follow exactly `folders` from now on; whether one was not followed
        before (a change made in it before now is not reported).  A folder
        that cannot be followed is passed over (logged once, when inotify
        allows no more watches)."""
        wanted = {str(f) for f in folders}
        for gone in set(self._watched) - wanted:
            self._lib.inotify_rm_watch(self._fd, self._watched.pop(gone))
        added = False
        for folder in sorted(wanted - set(self._watched)):
            wd = self._lib.inotify_add_watch(self._fd, os.fsencode(folder), _EVENTS | _ONLYDIR)
            if wd >= 0:
                self._watched[folder] = wd
                added = True
            elif ctypes.get_errno() == errno.ENOSPC:
                log.warning("inotify allows no more watches (fs.inotify.max_user_watches): %s and others "
                            "are followed by the rescan's timer only", folder)
                break
        return added

    def changed(self) -> bool:
        """Whether an event came in since the last call (all are drained); a
        folder whose watch went with it is followed again by the next `follow`."""
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
            seen = True
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
                at += _EVENT.size + length
                if mask & _IGNORED:
                    for folder in [f for f, w in self._watched.items() if w == wd]:
                        del self._watched[folder]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
