"""The rescan thread: the store is rescanned every second in the background,
and the kernel's cached attributes and pages of what changed are invalidated
at once (a changed folder, its files and parents; every folder when the
store's top folders change; a path that kept its view for open files once
they closed).  The attribute memo is emptied before the kernel is told.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from . import libfuse
from .memo import Memo
from .openfiles import OpenFiles
from .tree import Tree
from .views import MMPROJ_FILE, MODEL_FILE

log = logging.getLogger(__name__)


class Rescan:
    """Follows the store for a mounted `tree` from its own thread."""

    RESCAN_SECONDS = 1.0

    def __init__(self, tree: Tree, lock: threading.Lock, memo: Memo, open_files: OpenFiles,
                 on_start: Callable[[], None] | None = None):
        self.tree = tree
        self.root = tree.source.root
        self._lock = lock
        self._memo = memo
        self._files = open_files
        self._on_start = on_start                 # run by the thread as it starts (the mount is up)
        self._stale_paths: set[str] = set()      # to invalidate: they kept a view for open files
        self._fuse_ptr: int | None = None
        self._stop = threading.Event()
        self._kick = threading.Event()             # rescan now
        self._watcher: threading.Thread | None = None
        tree.views.on_belied = self._belied      # an index entry was wrong: the kernel's attributes too
        # What the first rescan compares against, taken before the mount
        # answers anything (marks are taken from the store as it is when they
        # are made): a change made between the mount's first answers and the
        # thread's start is then a change, and the kernel forgets those answers.
        self._first = tree.snapshot()
        self._first_marks = tree.marks(self._first)

    @property
    def session(self) -> int | None:
        """The FUSE session while the thread runs, else None."""
        return self._fuse_ptr

    def start(self, session: int) -> None:
        self._fuse_ptr = session
        self._watcher = threading.Thread(target=self._watch, name="compatfs-rescan", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        self._fuse_ptr = None

    def stale(self, path: str) -> None:
        """`path` kept its view for open files, which closed: the kernel learns
        the store's current one now, from this thread (no notification from
        inside an operation)."""
        with self._lock:
            self._stale_paths.add(path)
        self._kick.set()

    def _watch(self) -> None:
        """Rescan the store every second; tell the kernel what changed."""
        if self._on_start is not None:
            self._on_start()
        self.tree.follow()     # from now on only this thread rescans; lookups never wait for it
        old_snap, before = self._first, self._first_marks
        del self._first, self._first_marks      # the loop keeps them from here on, as the last rescan's
        while not self._stop.is_set():
            self._kick.wait(self.RESCAN_SECONDS)
            self._kick.clear()
            if self._stop.is_set():
                return
            try:
                with self._lock:
                    stale, self._stale_paths = self._stale_paths, set()
                snap = self.tree.rescan()
                now = self.tree.marks(snap)
                changed = {d for d in before.keys() | now.keys() if before.get(d) != now.get(d)}
                before = now
                if changed or stale:
                    self._memo.forget()
                if changed:
                    log.info("store changed: %s", ", ".join(sorted(changed)))
                    self._invalidate(changed, old_snap, snap)
                    self.tree.views.retain(set(snap.ggufs))
                old_snap = snap
                self._invalidate_paths(stale)
                self._files.prune(changed | {p.strip("/").rpartition("/")[0] for p in stale}, now)
            except Exception:   # the mount outlives a failed rescan
                log.exception("rescan of %s failed", self.root)

    def _invalidate(self, folders: set[str], *snaps) -> None:
        """Invalidate the folders, their files (as either snapshot names them) and parents."""
        paths = set()
        if any(d.startswith("<") for d in folders):   # a folder on disk whose owner and mode folders show
            folders = {d for d in folders if not d.startswith("<")} | set(snaps[-1].dirs)
        for d in folders:
            names = {MODEL_FILE, MMPROJ_FILE}
            for snap in snaps:
                names |= set(snap.files.get(d, ()))
            paths |= {f"/{d}/{n}" for n in names} | {f"/{d}"}
            parts = d.split("/")
            paths |= {"/" + "/".join(parts[:i]) for i in range(len(parts))}
        self._invalidate_paths(paths)

    def _belied(self, blob: Path) -> None:
        """The index entry of `blob` was wrong (its sizes, or whether it has an
        mmproj.gguf) and is made again: drop every remembered answer, and the
        kernel's attributes of the folders that show the blob and their files."""
        snap = self.tree.snapshot()
        folders = {name for name, files in snap.files.items() if any(ref.blob == blob for ref in files.values())}
        self._memo.forget()
        self._invalidate(folders, snap)

    def _invalidate_paths(self, paths: set[str]) -> None:
        """Drop the kernel's attributes and pages of `paths` (those it knows)."""
        for p in sorted(paths, key=len, reverse=True):
            if self._stop.is_set() or not self._fuse_ptr:
                return
            libfuse.invalidate_path(self._fuse_ptr, p)
