"""Per-path views kept while files are open, and what an open snapshots.

The kernel keeps one page cache per path: a path keeps serving the view its
open handles read while their blob is intact, and switches to the store's new
one when they close (the FUSE layer then has the kernel's caches of it
dropped).  An open takes one snapshot of the store: the view and the blob's
descriptor it is served from, permission decided on that very descriptor; a
read checks the handle's blob against the view's stamp, the blob followed
(`BlobFile(follow=True)`): a change of its metadata (mode, owner, ACL,
links) leaves open files reading, a write of its bytes does not.  Shares the FUSE
layer's lock.
"""
from __future__ import annotations

import errno
import itertools
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Callable

from ..files.access import READ, Caller
from ..files.blobfile import BlobFile, Denied, identity, status, transient
from ..errors import GGUFError
from .libfuse import fuse
from .presented import Presented
from ..tree import FileRef, Tree
from ..view.layout import View
from ..view.sampling import Layers

log = logging.getLogger(__name__)


@dataclass
class Handle:
    path: str
    view: View
    file: BlobFile           # the blob, opened once: every byte of this handle is read through it
    failed: bool = False     # its blob changed: every read is EIO (logged once)

    @property
    def blob(self) -> str:
        return str(self.file.path)


@dataclass
class Served:
    """The view a path served last and the handles open on it; the view itself
    is held only while handles are open (the kernel's page-cache decision
    needs just its blob and stamp)."""
    view: View | None
    blob: str
    stamp: tuple
    fhs: set[int] = field(default_factory=set)
    params: Layers | None = None   # the Modelfile layers a model folder's model.gguf was built with


class CannotOpen(fuse.FuseOSError):
    """EIO for a blob that cannot be opened; `message` is logged if opening
    the path's blob of a scan made then fails too."""

    def __init__(self, message: str):
        super().__init__(errno.EIO)
        self.message = message


def fstat(fd: int) -> os.stat_result | None:
    try:
        return os.fstat(fd)
    except OSError:
        return None


class OpenFiles:
    """The open handles and, per path, what it served last."""

    def __init__(self, tree: Tree, presented: Presented, lock: threading.Lock, forget: Callable[[str], None]):
        self.tree = tree
        self._presented = presented
        self._lock = lock
        self._forget = forget                      # drop a path's remembered attributes (the lock is held)
        self._handles: dict[int, Handle] = {}
        self._fh = itertools.count(1)
        self._served: dict[str, Served] = {}       # path -> what it served last (page-cache validity)
        self._told: dict[str, set] = {}           # path -> blob identities getattr gave sizes of (None: a bad file's 0)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._handles)

    def get(self, fh: int) -> Handle | None:
        return self._handles.get(fh)

    def open_on(self, path: str) -> bool:
        """Whether handles are open on `path` (the lock is held)."""
        served = self._served.get(path)
        return served is not None and bool(served.fhs)

    def told(self, path: str, stamp) -> None:
        """getattr gave the kernel the size of the view of blob identity `stamp` at `path`."""
        with self._lock:
            self._told.setdefault(path, set()).add(stamp)

    def open_stamp(self, path: str) -> tuple | None:
        """The blob identity `path` serves to its open handles, if any."""
        with self._lock:
            served = self._served.get(path)
            return served.stamp if served is not None and served.fhs else None

    def sticky(self, path: str, duplicate: bool = False) -> tuple[Served, os.stat_result, bool, BlobFile | None] | None:
        """What `path` served last while handles are open on it: the served
        view, its blob's status by descriptor, whether that blob is intact,
        and with `duplicate` a descriptor of that blob of the caller's own
        (taken while the handle cannot be closed)."""
        with self._lock:
            served = self._served.get(path)
            if served is None:
                return None
            file = next((self._handles[fh].file for fh in served.fhs if fh in self._handles), None)
            if file is None or served.view is None:
                return None
            served = Served(served.view, served.blob, served.stamp)   # as it is now, for the caller
            st = fstat(file.fd)
            if st is None:
                return None
            intact = file.intact(st)       # its stamp is the served view's (`open_view` serves no other)
            own = file.duplicate() if duplicate and intact else None
        return served, st, intact, own

    def _choose(self, path: str, ref: FileRef) -> tuple[View, str, BlobFile | None]:
        """The view `path` serves now: the one its open handles read while their
        blob is intact (with a descriptor of it, the caller's to close: the
        blob may have left the store), else the store's current one."""
        sticky = self.sticky(path, duplicate=True)
        view = sticky[0].view if sticky is not None else None
        if sticky is not None and view is not None and sticky[2]:
            return view, sticky[0].blob, sticky[3]
        return self._presented.build(ref, self._presented.blob_stat(ref)), str(ref.blob), None

    def open_view(self, path: str, node: FileRef, caller: Caller) -> tuple[View, str, BlobFile] | None:
        """The view `path` serves now, its blob's path and the file it is
        served from, opened for `caller` (EACCES unless it may read it; the
        permission is decided on that very file); None when the file opened
        is not the one the view was built from (it changed meanwhile).  A
        fault of the system is `Presented.unavailable`; whatever is raised,
        no descriptor is left open."""
        file: BlobFile | None = None
        try:
            view, blob, file = self._choose(path, node)
            if node.readable_as is not None:   # a file the mount makes: readable as that folder is, not as itself
                status(node.readable_as, caller, READ)
                caller = Caller(0, 0, caller.pid)
            if file is not None:
                file.allow(caller)
            else:
                file = BlobFile(blob, caller=caller, follow=True)
        except BaseException as e:
            if file is not None:
                file.close()
            raise self._refusal(node, e) from None
        if file.stamp != view.stamp:
            file.close()
            return None
        return view, blob, file

    def _refusal(self, node: FileRef, e: BaseException) -> BaseException:
        """What an open answers for `e`, raised while it took its snapshot:
        EACCES for Denied; for a fault of the system, `Presented.unavailable`;
        CannotOpen for another GGUFError; a lookup's own errno for another
        OSError; anything else as it is."""
        if isinstance(e, Denied):
            return fuse.FuseOSError(errno.EACCES)
        if isinstance(e, fuse.FuseOSError):
            return e
        if transient(e):
            return self._presented.unavailable(str(node.blob), f"cannot open blob just now: {e}")
        if isinstance(e, GGUFError):
            return CannotOpen(str(e))
        if isinstance(e, OSError):
            return fuse.FuseOSError(e.errno or errno.EIO)
        return e

    def add(self, path: str, node: FileRef, view: View, blob: str, file: BlobFile) -> tuple[int, bool, bool]:
        """A new handle reading `view` at `path`: its number, whether the
        kernel may keep its pages of the path, and whether getattr gave the
        kernel another view's size for it since this was last done."""
        fh = next(self._fh)
        with self._lock:
            self._handles[fh] = Handle(path, view, file)
            served = self._served.get(path)
            # Views are immutable (the same blob, by identity, and params layer
            # make the same bytes): the kernel may keep its pages of this path
            # unless the path now shows another view than it did last time.
            params = served.params if served is not None and served.view is view else node.params
            keep_cache = served is not None and served.blob == blob and served.stamp == view.stamp \
                and served.params == params
            if served is None or not keep_cache:
                if served is not None and served.fhs:
                    log.info("%s now serves blob %s; %d handle(s) still read the view before", path, blob,
                             len(served.fhs))
                served = self._served[path] = Served(view, blob, view.stamp, params=params)
            served.view = view
            served.fhs.add(fh)
            self._forget(path)
            told = self._told.get(path, set())
            stale = bool(told - {view.stamp})
            if stale:
                told.clear()
        return fh, keep_cache, stale

    def remove(self, fh: int) -> tuple[Handle | None, bool]:
        """Close handle `fh`: the handle, and whether its path kept its view for
        open files and the store has another at the path by now."""
        with self._lock:
            handle = self._handles.pop(fh, None)
            served = self._served.get(handle.path) if handle is not None else None
            if served is not None:
                served.fhs.discard(fh)
                if not served.fhs:
                    served.view = None
            if handle is not None:
                self._forget(handle.path)
        if handle is None:
            return None, False
        handle.file.close()
        return handle, served is not None and not served.fhs and self._outdated(handle.path, served)

    def _outdated(self, path: str, served: Served) -> bool:
        """Whether the store now has another blob (or bytes) at `path` than `served`."""
        ref = self.tree.lookup(path)
        if not isinstance(ref, FileRef) or str(ref.blob) != served.blob or ref.params != served.params:
            return True
        try:
            return identity(status(ref.blob)) != served.stamp
        except OSError:
            return True

    def handle(self, fh: int) -> Handle:
        """The open handle, checked against its blob: EIO once the blob was
        truncated or rewritten since the view was built."""
        handle = self._handles.get(fh)
        if handle is None:
            raise fuse.FuseOSError(errno.EBADF)
        if not handle.failed:
            if handle.file.intact():      # its stamp is the view's (`open_view` serves no other)
                return handle
            handle.failed = True
            log.error("blob %s changed under an open file (its bytes written, or its size or modification time "
                      "changed): reads of %s fail until it is opened again", handle.blob, handle.path)
        raise fuse.FuseOSError(errno.EIO)

    def prune(self, changed: set[str], folders: dict[str, tuple | None]) -> None:
        """Forget what changed or removed paths served, unless a handle still reads it."""
        with self._lock:
            for path, served in list(self._served.items()):
                folder = path.strip("/").rpartition("/")[0]
                if not served.fhs and (folder in changed or folder not in folders):
                    del self._served[path]
