"""What the store presents at a file's path now: its blob's status, the
size of its view from the blob's summary (no view is built for `stat`), the
view itself.  A blob that cannot be presented is EIO with one log line per
blob, kind and identity, and its view is not built again until it changes.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from typing import NoReturn

from .blobfile import identity, status
from .libfuse import fuse
from .tree import FileRef, Tree
from .view import View
from .views import LAYER_FILE, MODEL_FILE

log = logging.getLogger(__name__)


class Changed(Exception):
    """The blob at a path became another file while it was looked at."""


class Presented:
    """The store's current views of `tree`'s files; shares the FUSE layer's lock."""

    _FAILURES_KEPT = 1024

    def __init__(self, tree: Tree, lock: threading.Lock):
        self.tree = tree
        self._lock = lock
        self._failures: dict[tuple, str] = {}      # what failed (blob, kind, stamp) -> the line logged once

    def blob_stat(self, ref: FileRef) -> os.stat_result:
        """The blob's status (through a symlink); EIO and a log line for anything
        but a regular file."""
        try:
            st = status(ref.blob)
        except OSError as e:
            self._fail(("missing", str(ref.blob), e.errno), f"cannot read blob {ref.blob}: {e.strerror}")
        if not stat.S_ISREG(st.st_mode):
            self._fail(("irregular", str(ref.blob), identity(st)), f"blob {ref.blob} is not a regular file: not served")
        return st

    def _fail(self, key: tuple, message: str) -> NoReturn:
        """Log `message` once per `key`, then EIO."""
        self._log_once(key, message)
        raise fuse.FuseOSError(errno.EIO)

    def _log_once(self, key: tuple, message: str) -> None:
        with self._lock:
            new = key not in self._failures
            if new:
                if len(self._failures) >= self._FAILURES_KEPT:
                    self._failures.clear()
                self._failures[key] = message
        if new:
            log.error("%s", message)

    def size(self, ref: FileRef, st: os.stat_result) -> int | None:
        """The file's size from the summary of the blob of status `st` (no view
        is built for `stat`); None, logged once, when the view cannot be
        presented; Changed when the blob at that path is another by now."""
        key = (str(ref.blob), ref.kind, identity(st))
        if ref.kind == LAYER_FILE or (not self.tree.views.translate and ref.kind == MODEL_FILE):
            return st.st_size   # served byte for byte, GGUF or not (as `BlobViews.view` does)
        try:
            summary = self.tree.views.summary(ref.blob, identity(st))
            if summary is None:
                raise Changed
            error = summary.error
            size = summary.model_size if ref.kind == MODEL_FILE else summary.mmproj_size
            if size is not None and not error:
                size = self.tree.views.sampled_size(ref.blob, ref.params, size)
        except Changed:
            raise
        except Exception as e:   # a bad blob must never take the mount down
            error, size = str(e), None
        if error or size is None:
            self._log_once(key, f"cannot present {ref.kind} of {ref.blob}: {error or 'no such view'}")
            return None
        return size

    def build(self, ref: FileRef, st: os.stat_result) -> View:
        """The store's current `ref.kind` view of the blob; a view that cannot be
        built is EIO with one log line (and not built again until the blob changes)."""
        key = (str(ref.blob), ref.kind, identity(st))
        with self._lock:
            known = self._failures.get(key)
        if known is not None:
            raise fuse.FuseOSError(errno.EIO)
        try:
            return self.tree.views.view(ref.blob, ref.kind, ref.params)
        except Exception as e:   # a bad blob must never take the mount down
            self._fail(key, f"cannot present {ref.kind} of {ref.blob}: {e}")
