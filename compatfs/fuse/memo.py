"""The attribute and listing memo: getattr's and readdir's answers as of the
last rescan, so that a listing is answered from memory (permissions are
checked anew by the caller).

It is emptied whenever a rescan sees a change, before the kernel is told,
and loses a path's attributes when files open or close on it; a generation
count keeps an answer computed across such a change out.  Every path that
exists is remembered (as many as the mount shows); of paths that do not,
at most `MISSES_KEPT`.  It shares the FUSE
layer's lock: whether files are open on a path is read under it.
"""
from __future__ import annotations

import threading
from typing import Callable

_UNKNOWN = object()


class Memo:
    """Remembered attributes (None: no such path) and listings by path."""

    MISSES_KEPT = 1 << 14    # remembered answers "no such path" (a caller may ask for any number)

    def __init__(self, lock: threading.Lock, open_on: Callable[[str], bool]):
        self._lock = lock
        self._open_on = open_on                    # whether handles are open on a path (called under the lock)
        self._attrs: dict[str, dict | None] = {}
        self._listings: dict[str, list] = {}       # readdir's answers, remembered alike
        self._generation = 0
        self._misses = 0

    def attrs(self, path: str, compute: Callable[[str], dict | None]) -> dict | None:
        """The attributes of `path`, not remembered while files are open on it
        (their answers follow the open view)."""
        return self._recall(self._attrs, path, compute, unless_open=True)

    def listing(self, path: str, compute: Callable[[str], list]) -> list:
        return self._recall(self._listings, path, compute)

    def forget(self) -> None:
        """Drop every remembered attribute and listing."""
        with self._lock:
            self._generation += 1
            self._attrs.clear()
            self._listings.clear()
            self._misses = 0

    def forget_path(self, path: str) -> None:
        """Drop what is remembered of `path`'s attributes (the lock is held)."""
        self._generation += 1
        self._attrs.pop(path, None)

    def _recall(self, table: dict, path: str, compute, unless_open: bool = False):
        """`table`'s answer for `path`, else `compute(path)`, remembered there
        unless a change came in meanwhile (or, with `unless_open`, while files
        are open on `path`: their answers follow the open view)."""
        with self._lock:
            hit = table.get(path, _UNKNOWN)
            generation = self._generation
            remember = not (unless_open and self._open_on(path))
        if hit is not _UNKNOWN and remember:
            return hit
        value = compute(path)
        if remember:
            with self._lock:
                if generation == self._generation and (value is not None or self._misses < self.MISSES_KEPT):
                    self._misses += value is None and path not in table
                    table[path] = value
        return value
