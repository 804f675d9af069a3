"""What getattr and readdir answer for a path of the mount.

A folder mirrors the owner and mode (minus write bits) of the store folder it
comes from; a file shows its blob's owner, mode (minus write bits) and times
(its status as the last scan of the store found it, `BlobViews.saw`),
the size of the view it serves (the one its open files read while they
are open), one inode number per (path, blob identity).  A file whose blob
cannot be served is shown empty and unreadable, so that opening it
reports the error.  Listings carry every entry's inode number, as stat gives it.
"""

from __future__ import annotations

import errno
import os
import stat

from . import inodes
from ..files.lookup import identity, status
from .libfuse import fuse
from .paths import Paths
from .current import Changed, CurrentViews, Unavailable
from ..tree import FileRef, Tree


def file_attrs(path: str, stamp: tuple, size: int, st: os.stat_result | None) -> dict:
    """A file's attributes: its blob's owner, mode (minus write bits) and
    times, one inode number per (path, blob identity); `st_stamp` the
    identity (getattr notes that it gave the kernel its size, and drops it)."""
    attrs = {
        "st_mode": stat.S_IFREG | (st.st_mode & 0o555 if st else 0),
        "st_nlink": 1,
        "st_size": size,
        "st_blocks": (size + 511) // 512,
        "st_ino": inodes.file_ino(path, stamp),
        "st_stamp": tuple(stamp),
    }
    if st is not None:
        attrs.update(
            st_uid=st.st_uid,
            st_gid=st.st_gid,
            st_mtime=st.st_mtime_ns,
            st_ctime=st.st_ctime_ns,
            st_atime=st.st_atime_ns,
        )
    return attrs


class Attributes:
    """Attributes and listings of `tree`'s paths."""

    def __init__(self, tree: Tree, current: CurrentViews, paths: Paths):
        self.tree = tree
        self._current = current
        self._paths = paths

    def node(self, path: str):
        """What the tree has at `path`; ENOENT when nothing is there."""
        node = self.tree.lookup(path)
        if node is None:
            raise fuse.FuseOSError(errno.ENOENT)
        return node

    def _dir_attrs(self, path: str) -> dict:
        rel = path.strip("/")
        snap = self.tree.snapshot()
        # Link count: 2 + subfolders, as `find` expects of a Unix folder.
        subdirs = sum(1 for c in snap.dirs.get(rel, ()) if (f"{rel}/{c}" if rel else c) in snap.dirs)
        return {**self.tree.folder_attrs(rel), "st_nlink": 2 + subdirs, "st_ino": inodes.dir_ino(rel)}

    def of(self, path: str) -> dict | None:
        """The attributes of `path`; None when nothing is there."""
        if self.tree.is_folder(path):
            return self._dir_attrs(path)
        node = self.tree.lookup(path)
        if node is None:
            return None
        if isinstance(node, list):  # (a folder since)
            return self._dir_attrs(path)
        kept = self._paths.kept(path)
        held = kept[0].view if kept is not None else None  # the view its open files read
        if kept is not None and held is not None and kept[2]:
            return file_attrs(path, held.stamp, held.size, kept[1])
        st: os.stat_result | None = None
        size: int | None = None
        seen = self.tree.views.seen(node.blob)  # as the last scan found it (no path resolved again)
        for _attempt in range(3):
            # Size and identity of one blob (the path may name another by the
            # time its summary is looked up: then as it is now).
            try:
                st, seen = seen or self._current.blob_stat(node), None
                size = self._current.size(node, st)
                break
            except Unavailable:
                raise  # EIO for this stat only: an answer not remembered, the next one tries again
            except fuse.FuseOSError:
                st = size = None
                break
            except Changed:
                st = size = None
        if st is not None and size is not None:
            return file_attrs(path, identity(st), size, st)
        if kept is not None and held is not None:
            # Its blob broke under open files: they keep their size (and get
            # EIO on read), rather than an early end of file.
            return file_attrs(path, held.stamp, held.size, kept[1])
        # Shown (empty, unreadable), so that opening it reports the error.
        return {
            "st_mode": stat.S_IFREG,
            "st_nlink": 1,
            "st_size": 0,
            "st_ino": inodes.bad_ino(path),
            "st_uid": os.getuid(),
            "st_gid": os.getgid(),
        }

    def listing(self, path: str) -> list[tuple]:
        found = self.tree.entries(path)  # (its folders not looked up: looking one up reads its blob's header)
        if found is None:
            self.node(path)  # ENOENT when nothing is there
            raise fuse.FuseOSError(errno.ENOTDIR)
        rel = path.strip("/")
        # d_ino must be set (readers skip entries with inode 0) and match stat's.
        entries = [
            (".", {"st_mode": stat.S_IFDIR, "st_ino": inodes.dir_ino(rel)}, 0),
            ("..", {"st_mode": stat.S_IFDIR, "st_ino": inodes.dir_ino(rel.rpartition("/")[0])}, 0),
        ]
        for name, ref in found:
            child = f"{path.rstrip('/')}/{name}"
            if ref is not None:
                entries.append((name, {"st_mode": stat.S_IFREG, "st_ino": self._file_ino(child, ref)}, 0))
            else:
                entries.append((name, {"st_mode": stat.S_IFDIR, "st_ino": inodes.dir_ino(child.strip("/"))}, 0))
        return entries

    def _file_ino(self, path: str, ref: FileRef) -> int:
        """The inode number `getattr` gives `path`: one per (path, view)."""
        stamp = self._paths.open_stamp(path)
        seen = self.tree.views.seen(ref.blob)
        if stamp is None and seen is not None:
            stamp = identity(seen)
        if stamp is None:
            try:
                stamp = identity(status(ref.blob))
            except OSError:
                return inodes.bad_ino(path)
        return inodes.file_ino(path, stamp)
