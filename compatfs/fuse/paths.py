"""What the mount keeps per path, with one owner: `Paths`, whose methods
take its own lock (no caller ever holds it).

- the open files (`OpenFile`: a path, the view it reads, the blob file it
  reads through), by number;
- per path, the view it keeps for its open files (`KeptView`): the kernel
  keeps one page cache per path, so a path serves the view its open files
  read until they close;
- per path, the sizes getattr gave the kernel, each with its view's blob
  identity (`gave_size`): an open of a view of another blob, or of the
  same blob with another size (other Modelfile layers), has the kernel ask
  again;
- getattr's and readdir's answers as of the last rescan, so that a listing
  is answered from memory (permissions are checked anew by the caller).
  They are dropped whenever a rescan sees a change, before the kernel is
  told, and a path's attributes when files open or close on it; a
  generation count keeps an answer computed across such a change out
  (told to whoever `follow`s it: the listings answered in C, `listings`).
  Every path that exists is remembered (as many as the mount shows); of
  paths that do not, at most `MISSES_KEPT`.  A path's attributes are not
  remembered while files are open on it (their answers follow the open
  view).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TypeVar
from collections.abc import Callable

from ..files.blobfile import BlobFile
from ..tree import FileRef
from ..view.layout import View
from ..view.sampling import Layers

log = logging.getLogger(__name__)

T = TypeVar("T")
_UNKNOWN = object()


@dataclass
class OpenFile:
    """One open file of the mount: what it owns, closed together by `close`."""

    path: str
    view: View
    file: BlobFile  # the blob, opened once: every byte of this file is read through it
    failed: bool = False  # its blob changed: every read is EIO (logged once)

    @property
    def blob(self) -> str:
        return str(self.file.path)

    def close(self) -> None:
        self.file.close()


@dataclass
class KeptView:
    """The view a path served last and the open files reading it; the view
    itself is held only while files are open (the kernel's page-cache
    decision needs just its blob and stamp)."""

    view: View | None
    blob: str
    stamp: tuple
    fhs: set[int] = field(default_factory=set)
    params: Layers | None = None  # the Modelfile layers a model folder's model.gguf was built with


def fstat(fd: int) -> os.stat_result | None:
    try:
        return os.fstat(fd)
    except OSError:
        return None


class Paths:
    """The open files and everything the mount keeps per path."""

    MISSES_KEPT = 1 << 14  # remembered answers "no such path" (a caller may ask for any number)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, OpenFile] = {}
        self._fh = itertools.count(1)
        self._kept: dict[str, KeptView] = {}  # path -> the view it served last (page-cache validity)
        self._sizes_given: dict[str, set] = {}  # path -> (blob identity, size) getattr gave (None: a bad file's)
        self._attrs: dict[str, dict | None] = {}  # getattr's answers (None: no such path)
        self._listings: dict[str, list] = {}  # readdir's answers
        self._generation = 0
        self._misses = 0
        self._on_change: Callable[[int], None] | None = None  # told each new generation (under the lock)

    # -- open files ----------------------------------------------------------
    @property
    def count(self) -> int:
        with self._lock:
            return len(self._open)

    def get(self, fh: int) -> OpenFile | None:
        with self._lock:
            return self._open.get(fh)

    def open_stamp(self, path: str) -> tuple | None:
        """The blob identity `path` serves to its open files, if any."""
        with self._lock:
            kept = self._kept.get(path)
            return kept.stamp if kept is not None and kept.fhs else None

    def kept(self, path: str, duplicate: bool = False) -> tuple[KeptView, os.stat_result, bool, BlobFile | None] | None:
        """What `path` keeps serving while files are open on it: the view
        (a copy), its blob's status by descriptor, whether that blob is
        intact, and with `duplicate` a descriptor of that blob of the
        caller's own (taken while no open file can close)."""
        with self._lock:
            kept = self._kept.get(path)
            if kept is None:
                return None
            file = next((self._open[fh].file for fh in kept.fhs if fh in self._open), None)
            if file is None or kept.view is None:
                return None
            kept = KeptView(kept.view, kept.blob, kept.stamp)
            st = fstat(file.fd)
            if st is None:
                return None
            intact = file.intact(st)  # its stamp is the kept view's (an open serves no other)
            own = file.duplicate() if duplicate and intact else None
        return kept, st, intact, own

    def add(self, path: str, node: FileRef, view: View, file: BlobFile) -> tuple[int, bool, bool]:
        """A new open file reading `view` at `path` through `file`: its number,
        whether the kernel may keep its pages of the path, and whether getattr
        gave the kernel another view's size for it since this was last done."""
        blob = str(file.path)
        with self._lock:
            fh = next(self._fh)
            self._open[fh] = OpenFile(path, view, file)
            kept = self._kept.get(path)
            # Views are immutable (the same blob, by identity, and params layer
            # make the same bytes): the kernel may keep its pages of this path
            # unless the path now shows another view than it did last time.
            params = kept.params if kept is not None and kept.view is view else node.params
            keep_cache = kept is not None and kept.blob == blob and kept.stamp == view.stamp and kept.params == params
            if kept is None or not keep_cache:
                if kept is not None and kept.fhs:
                    log.info(
                        "%s now serves blob %s; %d open file(s) still read the view before", path, blob, len(kept.fhs)
                    )
                kept = self._kept[path] = KeptView(view, blob, view.stamp, params=params)
            kept.view = view
            kept.fhs.add(fh)
            self._forget_path(path)
            given = self._sizes_given.get(path, set())
            stale = bool(given - {(view.stamp, view.size)})  # (another blob, or the same with other params)
            if stale:
                given.clear()
        return fh, keep_cache, stale

    def remove(self, fh: int) -> tuple[OpenFile | None, KeptView | None]:
        """Forget open file `fh` (the caller closes it): the open file, and
        the view its path keeps where no other file is open on it."""
        with self._lock:
            opened = self._open.pop(fh, None)
            if opened is None:
                return None, None
            kept = self._kept.get(opened.path)
            if kept is not None:
                kept.fhs.discard(fh)
                if not kept.fhs:
                    kept.view = None
            self._forget_path(opened.path)
            if kept is None or kept.fhs:
                return opened, None
            return opened, KeptView(None, kept.blob, kept.stamp, params=kept.params)

    def prune(self, changed: set[str], folders: dict[str, tuple | None]) -> None:
        """Forget the views changed or removed folders' paths kept, unless a file is still open on them."""
        with self._lock:
            for path, kept in list(self._kept.items()):
                folder = path.strip("/").rpartition("/")[0]
                if not kept.fhs and (folder in changed or folder not in folders):
                    del self._kept[path]

    def gave_size(self, path: str, stamp, size: int) -> None:
        """getattr gave the kernel `size` for `path`, the size of a view of
        the blob of identity `stamp`."""
        with self._lock:
            self._sizes_given.setdefault(path, set()).add((stamp, size))

    # -- getattr's and readdir's answers --------------------------------------
    def attrs(self, path: str, compute: Callable[[str], dict | None]) -> dict | None:
        """The attributes of `path`, remembered unless files are open on it."""
        return self._recall(self._attrs, path, compute, unless_open=True)

    def listing(self, path: str, compute: Callable[[str], list]) -> list:
        return self._recall(self._listings, path, compute)

    def follow(self, on_change: Callable[[int], None]) -> None:
        """Tell `on_change` the generation now, and each new one."""
        with self._lock:
            self._on_change = on_change
            on_change(self._generation)

    @property
    def generation(self) -> int:
        """The changes so far: answers computed since the last one hold until the next."""
        with self._lock:
            return self._generation

    def forget(self) -> None:
        """Drop every remembered attribute and listing."""
        with self._lock:
            self._changed()
            self._attrs.clear()
            self._listings.clear()
            self._misses = 0

    def _forget_path(self, path: str) -> None:
        """Drop what is remembered of `path`'s attributes (under the lock)."""
        self._changed()
        self._attrs.pop(path, None)

    def _changed(self) -> None:
        """A new generation (under the lock)."""
        self._generation += 1
        if self._on_change is not None:
            self._on_change(self._generation)

    def _recall(self, table: dict, path: str, compute: Callable[[str], T], unless_open: bool = False) -> T:
        """`table`'s answer for `path`, else `compute(path)` (called without
        the lock), remembered there unless a change came in meanwhile (or,
        with `unless_open`, while files are open on `path`)."""
        with self._lock:
            hit = table.get(path, _UNKNOWN)
            generation = self._generation
            kept = self._kept.get(path)
            remember = not (unless_open and kept is not None and kept.fhs)
        if hit is not _UNKNOWN and remember:
            return hit
        value = compute(path)
        if remember:
            with self._lock:
                if generation == self._generation and (value is not None or self._misses < self.MISSES_KEPT):
                    self._misses += value is None and path not in table
                    table[path] = value
        return value
