"""The store's current view at a file's path (as against the view a path
keeps for its open files, `paths.KeptView`): its blob's status, the size of
its view from the blob's summary (no view is built for `stat`), the view
itself.  A blob whose view cannot be made is EIO with one log line per
blob, kind and identity, and its view is not built again until it changes.
A transient fault instead (out of descriptors or memory, an I/O error:
`lookup.transient`; it says nothing of the blob) is EIO that is not
remembered (`unavailable`): the next open tries again, and such failures are
logged, at most one line per blob every `TRANSIENT_LOG_SECONDS` (a
`throttle.Throttle`).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from typing import NoReturn

from ..files.lookup import TRANSIENT_ERRNOS, identity, status, transient
from .libfuse import fuse
from .throttle import Throttle, left_out
from ..tree import FileRef, Tree
from ..view.layout import View
from ..names import LAYER_FILE, MODEL_FILE

log = logging.getLogger(__name__)


TRANSIENT_LOG_SECONDS = 10.0  # a blob's transient faults are logged at most once this often


class Changed(Exception):
    """The blob at a path became another file while it was looked at."""


class Unavailable(fuse.FuseOSError):
    """EIO for a transient fault, not of the blob (logged; nothing remembered)."""

    def __init__(self) -> None:
        super().__init__(errno.EIO)


class CurrentViews:
    """The store's current views of `tree`'s files, and the blobs found
    broken (guarded by its own lock)."""

    _FAILURES_KEPT = 1024

    def __init__(self, tree: Tree):
        self.tree = tree
        self._lock = threading.Lock()
        self._failures: dict[tuple, str] = {}  # what failed (blob, kind, stamp) -> the line logged once
        self._faults = Throttle(TRANSIENT_LOG_SECONDS)  # blob -> when its last fault was logged

    def blob_stat(self, ref: FileRef) -> os.stat_result:
        """The blob's status (through a symlink); EIO and a log line for anything
        but a regular file."""
        try:
            st = status(ref.blob)
        except OSError as e:
            if e.errno in TRANSIENT_ERRNOS:
                raise self.unavailable(str(ref.blob), f"cannot read blob {ref.blob} just now: {e.strerror}") from None
            self._fail(("missing", str(ref.blob), e.errno), f"cannot read blob {ref.blob}: {e.strerror}")
        if not stat.S_ISREG(st.st_mode):
            self._fail(("irregular", str(ref.blob), identity(st)), f"blob {ref.blob} is not a regular file: not served")
        return st

    def _fail(self, key: tuple, message: str) -> NoReturn:
        """Log `message` once per `key`, then EIO."""
        self._log_once(key, message)
        raise fuse.FuseOSError(errno.EIO)

    def unavailable(self, blob: str, message: str) -> Unavailable:
        """The EIO of a transient fault met on `blob`, with `message`
        logged unless a fault of that blob was logged less than
        `TRANSIENT_LOG_SECONDS` ago (the next line counts those left out)."""
        quiet = self._faults.due(blob)
        if quiet is not None:
            log.error("%s: not remembered, tried again the next time%s", message, left_out(quiet))
        return Unavailable()

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
        made; Unavailable where a transient fault stopped it (nothing
        remembered); Changed when the blob at that path is another by now."""
        key = (str(ref.blob), ref.kind, identity(st))
        if ref.kind == LAYER_FILE or (not self.tree.views.translate and ref.kind == MODEL_FILE):
            return st.st_size  # served byte for byte, GGUF or not (as `BlobViews.view` does)
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
        except Exception as e:  # a bad blob must never take the mount down
            if transient(e):
                raise self.unavailable(
                    str(ref.blob), f"cannot size {ref.kind} of {ref.blob} just now: {_reason(e)}"
                ) from None
            error, size = str(e), None
        if error or size is None:
            self._log_once(key, f"cannot present {ref.kind} of {ref.blob}: {error or 'no such view'}")
            return None
        return size

    def build(self, ref: FileRef, st: os.stat_result) -> View:
        """The store's current `ref.kind` view of the blob; a view that cannot be
        built is EIO with one log line (and not built again until the blob
        changes), Unavailable where a transient fault stopped the build."""
        key = (str(ref.blob), ref.kind, identity(st))
        with self._lock:
            known = self._failures.get(key)
        if known is not None:
            raise fuse.FuseOSError(errno.EIO)
        try:
            return self.tree.views.view(ref.blob, ref.kind, ref.params)
        except Exception as e:  # a bad blob must never take the mount down
            if transient(e):
                raise self.unavailable(
                    str(ref.blob), f"cannot present {ref.kind} of {ref.blob} just now: {_reason(e)}"
                ) from None
            self._fail(key, f"cannot present {ref.kind} of {ref.blob}: {e}")


def _reason(e: BaseException) -> str:
    """What an exception says, named by its type where its message is empty (a MemoryError)."""
    return str(e) or type(e).__name__
