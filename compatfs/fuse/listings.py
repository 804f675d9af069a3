"""Folders' first listings answered in C (`compatfs._accel`'s readdir gate,
from what `_accel.listings_put` keeps).

A caller listing folder after folder (`ls -l` of every model, `find`)
goes through a folder's siblings in the order its parent lists them.  Once
a folder's first listing with attributes is answered in Python, a thread
of its own keeps that folder and the folders after it in its parent for
C, while the caller goes on: each entry's name, `struct stat` and fill
flags as the Python readdir fills them (`statfill.EntryFiller`), under the generation of
what the mount remembers (`CompatFS.generation`, read before anything is
looked at).  How many folders after it: `FIRST`, and twice as many as the
last time (up to `MOST_AHEAD`) when the caller got past the last ones
kept in the same parent (as the kernel's read-ahead grows for a
sequential reader).  A newer folder listed in Python ends the keeping and
starts it from there.

The gate answers a listing with attributes of a kept folder while that
generation lasts: any change the mount remembers (a rescan that saw one, a
file opened or closed) starts a new one, and nothing kept before is
answered from again.  Not kept: a folder with a file open on it (its
attributes follow the open view), one with an entry getattr fails for
(a transient fault is not kept), one of more than `MOST` entries.  Who
may list a folder is still decided at each open (`opendir`).
"""

from __future__ import annotations

import bisect
import logging
import stat
import threading

import mfusepy as fuse

from ..translate import accel
from .statfill import EntryFiller

log = logging.getLogger(__name__)


class Listings:
    """Keeps folders' listings for the readdir gate; `operations` is the
    mount's `CompatFS`, `entries` fills each entry as its readdir does."""

    FIRST = 16  # folders after the one listed in Python kept, at first
    MOST_AHEAD = 4096  # ... at most (about a fifth of a second of Python)
    MOST = 256  # entries of a folder kept at most (`_accel.listings_put` keeps no more)

    def __init__(self, operations, entries: EntryFiller):
        native = accel.native
        assert native is not None  # (made only where the readdir gate is in)
        self._native = native
        self._ops = operations
        self._entries = entries
        self._lock = threading.Lock()
        self._asked: str | None = None  # the newest folder listed in Python, not taken yet (under the lock)
        self._last: tuple[str, str, int] | None = None  # the last keeping: (parent, folder listed, how many after it)
        self._stop = False
        self._wake = threading.Event()
        operations.follow_changes(native.listings_generation)
        self._thread = threading.Thread(target=self._keeping, name="compatfs-listings", daemon=True)
        self._thread.start()

    def after(self, folder: str) -> None:
        """`folder`'s first listing with attributes was answered in Python."""
        with self._lock:
            self._asked = folder
        self._wake.set()

    def close(self) -> None:
        """End the thread (its keeping stops at the next folder)."""
        self._stop = True
        self._wake.set()
        self._thread.join()

    @staticmethod
    def served() -> int:
        """The listings the gate answered so far."""
        native = accel.native
        return native.listings_served() if native is not None else 0

    def _keeping(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop:
                return
            with self._lock:
                folder, self._asked = self._asked, None
            if folder is None:
                continue
            try:
                self._ahead(folder)
            except Exception as e:  # (only time is lost: those folders are listed in Python)
                log.warning("folders after %s not kept for C: %s", folder, e)

    def _ahead(self, folder: str) -> None:
        """Keep `folder` and the folders after it in its parent, until a
        newer folder is asked for or the generation changes."""
        generation = self._ops.generation
        base = folder.rstrip("/")
        self._keep(base or "/", generation)
        if not base:
            return
        parent, _, name = base.rpartition("/")
        try:
            siblings = self._ops.listing(parent or "/")
        except fuse.FuseOSError:
            return
        last = self._last
        went_on = last is not None and last[0] == parent and name > last[1]  # (a caller going through them)
        count = min(last[2] * 2, self.MOST_AHEAD) if last is not None and went_on else self.FIRST
        at = bisect.bisect_right(siblings, name, lo=2, key=lambda e: e[0])  # (after "." and "..": in name order)
        self._last = (parent, name, count)
        for sibling, attrs, _ in siblings[at : at + count]:
            if self._asked is not None or self._stop or self._ops.generation != generation:
                return
            if stat.S_ISDIR(attrs["st_mode"]):
                self._keep(f"{parent}/{sibling}", generation)

    def _keep(self, path: str, generation: int) -> None:
        key = self._entries.encode(path)
        if self._native.listings_has(key, generation):
            return
        try:
            entries = self._ops.listing(path)
        except fuse.FuseOSError:
            return
        if len(entries) > self.MOST:
            return
        base = path.rstrip("/")
        packed = []
        st = fuse.c_stat()
        for entry in entries:
            if entry[0] not in (".", "..") and self._ops.is_open(f"{base}/{entry[0]}"):
                return
            name, fill = self._entries.plus(base, entry, st)
            if not fill and entry[0] not in (".", ".."):
                return  # (getattr failed for it: the kernel looks it up itself, as it is then)
            packed.append((name, bytes(st), fill))
        self._native.listings_put(key, generation, packed)
