"""What an open snapshots, and what a release closes (the last one also
gives malloc's free memory back to the system).

The kernel keeps one page cache per path: a path keeps serving the view its
open files read while their blob is intact, and switches to the store's new
one when they close (the rescan thread then has the kernel's caches of it
dropped); `paths.Paths` keeps that per path.  An open takes one snapshot of
the store: the view and the blob's descriptor it is served from, permission
decided on that very descriptor; a read checks the open file's blob against
the view's stamp, the blob followed (`BlobFile(follow=True)`): a change of
its metadata (mode, owner, ACL, links) leaves open files reading, a write of
its bytes does not.
"""

from __future__ import annotations

import errno
import logging

from ..files.access import READ, Caller
from ..files.blobfile import BlobFile
from ..files.libc import give_back_free_memory
from ..files.lookup import Denied, identity, status, transient
from ..errors import GGUFError
from .libfuse import fuse
from .paths import KeptView, OpenFile, Paths
from .current import CurrentViews
from ..tree import FileRef, Tree
from ..view.layout import View

log = logging.getLogger(__name__)


class CannotOpen(fuse.FuseOSError):
    """EIO for a blob that cannot be opened; `message` is logged if opening
    the path's blob of a scan made then fails too."""

    def __init__(self, message: str):
        super().__init__(errno.EIO)
        self.message = message


class OpenFiles:
    """Opens and closes the mount's files; what is kept per path is `paths`'."""

    def __init__(self, tree: Tree, current: CurrentViews, paths: Paths):
        self.tree = tree
        self._current = current
        self._paths = paths

    def _choose(self, path: str, ref: FileRef) -> tuple[View, str, BlobFile | None]:
        """The view `path` serves now: the one its open files read while their
        blob is intact (with a descriptor of it, the caller's to close: the
        blob may have left the store), else the store's current one."""
        kept = self._paths.kept(path, duplicate=True)
        view = kept[0].view if kept is not None else None
        if kept is not None and view is not None and kept[2]:
            return view, kept[0].blob, kept[3]
        return self._current.build(ref, self._current.blob_stat(ref)), str(ref.blob), None

    def open_view(self, path: str, node: FileRef, caller: Caller) -> tuple[View, BlobFile] | None:
        """The view `path` serves now and the blob file it is served from, opened for `caller` (EACCES unless it may read it; the
        permission is decided on that very file); None when the file opened
        is not the one the view was built from (it changed meanwhile).  A
        transient fault is `CurrentViews.unavailable`; whatever is raised,
        no descriptor is left open."""
        file: BlobFile | None = None
        try:
            view, blob, file = self._choose(path, node)
            if node.readable_as is not None:  # a file the mount makes: readable as that folder is, not as itself
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
        return view, file

    def _refusal(self, node: FileRef, e: BaseException) -> BaseException:
        """What an open answers for `e`, raised while it took its snapshot:
        EACCES for Denied; for a transient fault, `CurrentViews.unavailable`;
        CannotOpen for another GGUFError; a lookup's own errno for another
        OSError; anything else as it is."""
        if isinstance(e, Denied):
            return fuse.FuseOSError(errno.EACCES)
        if isinstance(e, fuse.FuseOSError):
            return e
        if transient(e):
            return self._current.unavailable(str(node.blob), f"cannot open blob just now: {e}")
        if isinstance(e, GGUFError):
            return CannotOpen(str(e))
        if isinstance(e, OSError):
            return fuse.FuseOSError(e.errno or errno.EIO)
        return e

    def release(self, fh: int) -> tuple[OpenFile | None, bool]:
        """Close open file `fh` and all it owns: the open file, and whether its
        path kept its view for open files and the store has another at the
        path by now."""
        opened, kept = self._paths.remove(fh)
        if opened is None:
            return None, False
        opened.close()
        if not self._paths.count:
            # The mount is quiet: the memory its reads' replies and buffers
            # took at their peak (a model server's start has many in flight)
            # is free inside malloc's heaps, and goes back to the system.
            give_back_free_memory()
        return opened, kept is not None and self._outdated(opened.path, kept)

    def _outdated(self, path: str, kept: KeptView) -> bool:
        """Whether the store now has another blob (or bytes) at `path` than `kept`."""
        ref = self.tree.lookup(path)
        if not isinstance(ref, FileRef) or str(ref.blob) != kept.blob or ref.params != kept.params:
            return True
        try:
            return identity(status(ref.blob)) != kept.stamp
        except OSError:
            return True

    def reading(self, fh: int) -> OpenFile:
        """Open file `fh`, checked against its blob: EIO once the blob was
        truncated or rewritten since the view was built."""
        opened = self._paths.get(fh)
        if opened is None:
            raise fuse.FuseOSError(errno.EBADF)
        if not opened.failed:
            if opened.file.intact():  # its stamp is the view's (`open_view` serves no other)
                return opened
            opened.failed = True
            log.error(
                "blob %s changed under an open file (its bytes written, or its size or modification time "
                "changed): reads of %s fail until it is opened again",
                opened.blob,
                opened.path,
            )
        raise fuse.FuseOSError(errno.EIO)
