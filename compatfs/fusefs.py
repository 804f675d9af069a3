"""The FUSE layer: paths to tree lookups, file handles to views, reads to pieces.

Kept thin on purpose: every decision about what a file contains lives in
`tree`, `views` and `view`.  A read is answered with malloc'ed buffers that
libfuse frees (`read_buf`): blob ranges are read with preadv straight into C
memory (their bytes never become Python objects), ranges of elementwise ops
are computed straight into it, header bytes and whole-computed op tensors
are copied in.

What this layer guarantees on its own:
- libfuse 3, chosen explicitly (mfusepy would take libfuse 2 first).
- A file shows its blob's owner and mode (minus write bits); opening it also
  needs the caller to be able to reach and read the blob in the store itself.
  Only regular files are served (a blob symlink counts as what it points to).
- Every read checks the handle's blob against the view's stamp, before and
  after reading it: a blob that was truncated or rewritten gives EIO and a
  log line, never bytes of another file and never a short reply.
- A path keeps serving the view its open handles read (the kernel keeps one
  page cache per path), and switches to the store's new one when they close.
- The store is rescanned every second in the background; the kernel's cached
  attributes and pages of changed folders are invalidated at once.
- SIGTERM, SIGINT and SIGHUP unmount cleanly.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import itertools
import logging
import os
import signal
import re
import stat
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, NoReturn

import numpy as np

# mfusepy takes libfuse 2 when both are installed; this layer is written for 3.
if not os.environ.get("FUSE_LIBRARY_PATH"):
    os.environ["FUSE_LIBRARY_NAME"] = "fuse3"

import mfusepy as fuse  # noqa: E402

from .tree import BLOBS, FileRef, Tree  # noqa: E402
from .blobfile import BlobFile, unchanged  # noqa: E402
from .gguf_values import GGUFError  # noqa: E402
from .gguf_source import blob_identity  # noqa: E402
from .libc import LIBC  # noqa: E402
from .view import Computed, FileRange, View  # noqa: E402
from .views import LAYER_FILE, MMPROJ_FILE, MODEL_FILE  # noqa: E402

log = logging.getLogger("compatfs")




class MountError(Exception):
    """The mount could not be set up or ended in an error; one line for the user."""


class _FuseBuf(ctypes.Structure):
    # libfuse 3's struct fuse_buf.
    _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", ctypes.c_void_p),
                ("fd", ctypes.c_int), ("pos", ctypes.c_int64)]


@functools.lru_cache(maxsize=None)
def _bufvec_type(n: int) -> type:
    """struct fuse_bufvec with `n` buffers inline (libfuse declares `buf[1]`
    inline; mfusepy's declaration has a pointer there)."""
    return type(f"_FuseBufvec{n}", (ctypes.Structure,), {"_fields_": [
        ("count", ctypes.c_size_t), ("idx", ctypes.c_size_t), ("off", ctypes.c_size_t),
        ("buf", _FuseBuf * max(n, 1)), ("_slack", ctypes.c_size_t * 2)]})


def libfuse_version() -> str:
    """The libfuse this process runs on, e.g. "3.14.0"."""
    lib = fuse._libfuse
    try:
        lib.fuse_pkgversion.restype = ctypes.c_char_p
        return lib.fuse_pkgversion().decode()
    except AttributeError:
        return f"{fuse.fuse_version_major}.{fuse.fuse_version_minor}"


def _libfuse_tuple() -> tuple[int, int]:
    try:
        major, minor = libfuse_version().split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


if fuse.fuse_version_major != 3:
    raise OSError(f"compatfs needs libfuse 3; {fuse._libfuse_path} is libfuse {libfuse_version()}")

# Several buffers in one reply need the exact struct fuse_buf stride, known
# for libfuse 3.0-3.16; elsewhere (or with COMPATFS_SINGLE_BUFFER=1, which the
# tests use to cover that path) a read that spans pieces is gathered into one
# memory buffer.
_MULTI_BUF = (3, 0) <= _libfuse_tuple() < (3, 17) and os.environ.get("COMPATFS_SINGLE_BUFFER") != "1"
READ_REPLIES = "multi-buffer" if _MULTI_BUF else "single-buffer"

_libfuse = fuse._libfuse
_libfuse.fuse_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_libfuse.fuse_invalidate_path.restype = ctypes.c_int
_libfuse.fuse_exit.argtypes = [ctypes.c_void_p]


def _ino(*parts) -> int:
    """A stable inode number for what `parts` name (never 0 or 1, the root's)."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(h, "little") >> 2) + 2


class _Caller:
    """The process calling now: its uid, and its groups (primary and
    supplementary) read from /proc only when a permission check needs them."""

    def __init__(self):
        self.uid, self._gid, self._pid = fuse.fuse_get_context()
        self._groups: set[int] | None = None

    @property
    def groups(self) -> set[int]:
        if self._groups is None:
            self._groups = {self._gid}
            try:
                with open(f"/proc/{self._pid}/status") as f:
                    for line in f:
                        if line.startswith("Groups:"):
                            self._groups.update(int(g) for g in line.split()[1:])
                            break
            except (OSError, ValueError):
                pass
        return self._groups

    def allows(self, st: os.stat_result, bit: int) -> bool:
        """Whether its owner/group/other class has permission `bit` (4 r, 1 x)."""
        if self.uid == 0:
            return True
        if self.uid == st.st_uid:
            return bool(st.st_mode >> 6 & bit)
        if st.st_gid in self.groups:
            return bool(st.st_mode >> 3 & bit)
        return bool(st.st_mode & bit)


def may_access(path: Path, caller: _Caller, read: bool = True) -> bool:
    """Whether `caller` could open `path` for reading (a directory: list it)
    in the store itself: search permission on every folder on the way to it, as
    named and as its symlinks resolve, and read permission on it (root: that
    it is there)."""
    if caller.uid == 0:
        return os.path.exists(path)
    try:
        real = Path(os.path.realpath(path))
        for chain in (path.parents, real.parents):
            for d in chain:
                if not caller.allows(os.stat(d), 1):
                    return False
        return not read or caller.allows(os.stat(real), 4)
    except OSError:
        return False


@dataclass
class _Handle:
    path: str
    view: View
    file: BlobFile           # the blob, opened once: every byte of this handle is read through it
    failed: bool = False     # its blob changed: every read is EIO (logged once)

    @property
    def blob(self) -> str:
        return str(self.file.path)


@dataclass
class _Served:
    """The view a path served last and the handles open on it; the view itself
    is held only while handles are open (the kernel's page-cache decision
    needs just its blob and stamp)."""
    view: View | None
    blob: str
    stamp: tuple
    fhs: set[int] = field(default_factory=set)


class _Gathered(NamedTuple):
    """Pieces answered in one buffer (libfuse without the multi-buffer layout)."""
    pieces: list


def _piece_size(piece) -> int:
    if isinstance(piece, (FileRange, Computed)):
        return piece.size
    if isinstance(piece, _Gathered):
        return sum(map(_piece_size, piece.pieces))
    return len(piece)


_UNKNOWN = object()


def _erofs(*_args, **_kwargs):
    raise fuse.FuseOSError(errno.EROFS)


class CompatFS(fuse.Operations):
    """Read-only operations over a `Tree`."""

    use_ns = True
    RESCAN_SECONDS = 1.0
    _FAILURES_KEPT = 1024
    _ATTRS_KEPT = 1 << 14       # remembered answers (a few per model; ~10 MB at most)

    def __init__(self, tree: Tree, mountpoint: str, read_ahead_kb: int = 0):
        self.tree = tree
        self._mountpoint = mountpoint
        self._read_ahead_kb = read_ahead_kb
        self.root = tree.store.root
        self._handles: dict[int, _Handle] = {}
        self._fh = itertools.count(1)
        self._lock = threading.Lock()
        self._served: dict[str, _Served] = {}       # path -> what it served last (page-cache validity)
        self._failures: dict[tuple, str] = {}      # what failed (blob, kind, stamp) -> the line logged once
        self._stale_paths: set[str] = set()      # to invalidate: they kept a view for open files
        # getattr's answers (None: no such path) as of the last rescan, so that
        # a listing is answered from memory (permissions are checked anew); emptied whenever a rescan sees a
        # change, before the kernel is told, and for a path whose files open
        # or close.  `_generation` keeps an answer computed across a change out.
        self._attrs: dict[str, dict | None] = {}
        self._listings: dict[str, list] = {}       # readdir's answers, remembered alike
        self._generation = 0
        self._fuse_ptr: int | None = None
        self._stop = threading.Event()
        self._kick = threading.Event()             # rescan now
        self._watcher: threading.Thread | None = None

    # -- lifetime ------------------------------------------------------------
    def init_with_config(self, conn, config):
        # The kernel lowers the mount's read-ahead to the INIT reply's
        # max_readahead when it takes the reply (sent after this returns):
        # allowing `read_ahead_kb` keeps set_read_ahead's value, whenever it lands.
        if self._read_ahead_kb:
            conn.max_readahead = max(conn.max_readahead, self._read_ahead_kb << 10)
        self.init("/")

    def init(self, path):
        self._fuse_ptr = _libfuse.fuse_get_context().contents.fuse
        self._watcher = threading.Thread(target=self._watch, name="compatfs-rescan", daemon=True)
        self._watcher.start()

    def destroy(self, path):
        self._stop.set()
        self._kick.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        self._fuse_ptr = None

    def exit(self) -> None:
        """End the FUSE loop (libfuse then unmounts): flag the session, and wake
        a worker with a lookup the kernel cannot answer from its cache."""
        ptr = self._fuse_ptr
        if ptr:
            _libfuse.fuse_exit(ptr)
            try:
                os.stat(os.path.join(self._mountpoint, f".compatfs-exit-{os.getpid()}"))
            except OSError:
                pass
        else:
            lazy_unmount(self._mountpoint)

    @property
    def open_files(self) -> int:
        with self._lock:
            return len(self._handles)

    def _watch(self) -> None:
        """Rescan the store every second; tell the kernel what changed."""
        if self._read_ahead_kb:
            log.info(set_read_ahead(self._mountpoint, self._read_ahead_kb))
        old_snap = self.tree.snapshot()
        before = self._marks(old_snap)
        while not self._stop.is_set():
            self._kick.wait(self.RESCAN_SECONDS)
            self._kick.clear()
            if self._stop.is_set():
                return
            try:
                with self._lock:
                    stale, self._stale_paths = self._stale_paths, set()
                snap = self.tree.snapshot()
                now = self._marks(snap)
                changed = {d for d in before.keys() | now.keys() if before.get(d) != now.get(d)}
                before = now
                if changed or stale:
                    self._forget_attrs()
                if changed:
                    log.info("store changed: %s", ", ".join(sorted(changed)))
                    self._invalidate(changed, old_snap, snap)
                    self.tree.views.retain(set(snap.blobs.values()))
                old_snap = snap
                self._invalidate_paths(stale)
                self._prune(changed | {p.strip("/").rpartition("/")[0] for p in stale}, now)
            except Exception:   # the mount outlives a failed rescan
                log.exception("rescan of %s failed", self.root)

    def _marks(self, snap) -> dict[str, tuple]:
        """What the rescan compares: each folder's blobs (`Tree.folders`), and
        the owner, mode and time of the store's two top folders (which every
        folder of the mount shows)."""
        marks = self.tree.folders(snap)
        for top in ("manifests", BLOBS):
            try:
                st = os.stat(self.root / top)
                marks[f"<{top}>"] = (st.st_uid, st.st_gid, st.st_mode, st.st_mtime_ns)
            except OSError:
                marks[f"<{top}>"] = None
        return marks

    def _forget_attrs(self) -> None:
        """Drop every remembered attribute and listing."""
        with self._lock:
            self._generation += 1
            self._attrs.clear()
            self._listings.clear()

    def _invalidate(self, folders: set[str], *snaps) -> None:
        """Invalidate the folders, their files (as either snapshot names them) and parents."""
        paths = set()
        if any(d.startswith("<") for d in folders):   # the store's top folders: every folder shows them
            folders = {d for d in folders if not d.startswith("<")} | set(snaps[-1].dirs)
        for d in folders:
            names = {MODEL_FILE, MMPROJ_FILE}
            for snap in snaps:
                names |= {n for n, _ in getattr(snap.model_dirs.get(d), "layers", ())}
            paths |= {f"/{d}/{n}" for n in names} | {f"/{d}"}
            parts = d.split("/")
            paths |= {"/" + "/".join(parts[:i]) for i in range(len(parts))}
        self._invalidate_paths(paths)

    def _invalidate_paths(self, paths: set[str]) -> None:
        """Drop the kernel's attributes and pages of `paths` (those it knows)."""
        for p in sorted(paths, key=len, reverse=True):
            if self._stop.is_set() or not self._fuse_ptr:
                return
            _libfuse.fuse_invalidate_path(self._fuse_ptr, p.encode())

    def _prune(self, changed: set[str], folders: dict[str, tuple]) -> None:
        """Forget what changed or removed paths served, unless a handle still reads it."""
        with self._lock:
            for path, served in list(self._served.items()):
                folder = path.strip("/").rpartition("/")[0]
                if not served.fhs and (folder in changed or folder not in folders):
                    del self._served[path]

    # -- lookups -------------------------------------------------------------
    def _node(self, path: str):
        node = self.tree.lookup(path)
        if node is None:
            raise fuse.FuseOSError(errno.ENOENT)
        return node

    def _blob_stat(self, ref: FileRef) -> os.stat_result:
        """The blob's status (through a symlink); EIO and a log line for anything
        but a regular file."""
        try:
            st = os.stat(ref.blob)
        except OSError as e:
            self._fail(("missing", str(ref.blob), e.errno), f"cannot read blob {ref.blob}: {e.strerror}")
        if not stat.S_ISREG(st.st_mode):
            self._fail(("irregular", str(ref.blob), blob_identity(st)), f"blob {ref.blob} is not a regular file: not served")
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

    def _size(self, ref: FileRef, st: os.stat_result) -> int | None:
        """The file's size from the blob's summary (no view is built for
        `stat`); None, logged once, when the view cannot be presented."""
        key = (str(ref.blob), ref.kind, blob_identity(st))
        if ref.kind == LAYER_FILE or (not self.tree.views.translate and ref.kind == MODEL_FILE):
            return st.st_size   # served byte for byte, GGUF or not (as `BlobViews.view` does)
        try:
            summary = self.tree.views.summary(ref.blob)
            error = summary.error
            size = summary.model_size if ref.kind == MODEL_FILE else summary.mmproj_size
        except Exception as e:   # a bad blob must never take the mount down
            error, size = str(e), None
        if error or size is None:
            self._log_once(key, f"cannot present {ref.kind} of {ref.blob}: {error or 'no such view'}")
            return None
        return size

    def _build(self, ref: FileRef, st: os.stat_result) -> View:
        """The store's current `ref.kind` view of the blob; a view that cannot be
        built is EIO with one log line (and not built again until the blob changes)."""
        key = (str(ref.blob), ref.kind, blob_identity(st))
        with self._lock:
            known = self._failures.get(key)
        if known is not None:
            raise fuse.FuseOSError(errno.EIO)
        try:
            return self.tree.views.view(ref.blob, ref.kind)
        except Exception as e:   # a bad blob must never take the mount down
            self._fail(key, f"cannot present {ref.kind} of {ref.blob}: {e}")

    def _sticky(self, path: str) -> tuple[_Served, os.stat_result, bool] | None:
        """What `path` served last while handles are open on it: the served
        view, its blob's status by descriptor, and whether that blob is intact."""
        with self._lock:
            served = self._served.get(path)
            fd = next((self._handles[fh].file.fd for fh in served.fhs if fh in self._handles), None) if served else None
            if fd is None or served.view is None:
                return None
            served = _Served(served.view, served.blob, served.stamp)   # as it is now, for the caller
        st = self._fstat(fd)
        if st is None:
            return None
        return served, st, unchanged(served.stamp, st)

    def _choose(self, path: str, ref: FileRef) -> tuple[View, str]:
        """The view `path` serves now: the one its open handles read while their
        blob is intact, else the store's current one."""
        sticky = self._sticky(path)
        if sticky is not None and sticky[2]:
            return sticky[0].view, sticky[0].blob
        return self._build(ref, self._blob_stat(ref)), str(ref.blob)

    def _dir_attrs(self, path: str) -> dict:
        rel = path.strip("/")
        base = self.root / (BLOBS if rel == BLOBS or rel.startswith(BLOBS + "/") else "manifests")
        try:
            st = os.stat(base)
            owner = {"st_uid": st.st_uid, "st_gid": st.st_gid, "st_mode": stat.S_IFDIR | st.st_mode & 0o555}
            mtime = st.st_mtime_ns
        except OSError:
            owner = {"st_uid": os.getuid(), "st_gid": os.getgid(), "st_mode": stat.S_IFDIR | 0o500}
            mtime = 0
        # Folder times: the newest manifest under it (the root and blobs/: of
        # the whole store), a blob folder: its blob's.
        snap = self.tree.snapshot()
        if rel in ("", BLOBS):
            mtime = max([mtime, *snap.dir_mtimes.values()])
        elif rel.startswith(BLOBS + "/"):
            try:
                mtime = os.stat(snap.blobs[rel.rpartition("/")[2]]).st_mtime_ns
            except (KeyError, OSError):
                pass
        else:
            mtime = snap.dir_mtimes.get(rel, mtime)
        # Link count: 2 + subfolders, as `find` expects of a Unix folder.
        if rel == BLOBS:
            subdirs = len(snap.blobs)
        else:
            subdirs = sum(1 for c in snap.dirs.get(rel, ()) if (f"{rel}/{c}" if rel else c) in snap.dirs)
        return {**owner, "st_nlink": 2 + subdirs, "st_ino": self._dir_ino(rel),
                "st_mtime": mtime, "st_ctime": mtime, "st_atime": mtime}

    def getattr(self, path, fh=None):
        handle = self._handles.get(fh.fh) if fh is not None else None
        if handle is not None:
            return self._file_attrs(path, handle.view.stamp, handle.view.size, self._fstat(handle.file.fd))
        attrs = self._recall(self._attrs, path, self._getattr, unless_open=True)
        if attrs is None:
            raise fuse.FuseOSError(errno.ENOENT)
        return attrs

    def _recall(self, table: dict, path: str, compute, unless_open: bool = False):
        """`table`'s answer for `path`, else `compute(path)`, remembered there
        unless a change came in meanwhile (or, with `unless_open`, while files
        are open on `path`: their answers follow the open view)."""
        with self._lock:
            hit = table.get(path, _UNKNOWN)
            generation = self._generation
            served = self._served.get(path) if unless_open else None
            remember = served is None or not served.fhs
        if hit is not _UNKNOWN and remember:
            return hit
        value = compute(path)
        if remember:
            with self._lock:
                if generation == self._generation and len(table) < self._ATTRS_KEPT:
                    table[path] = value
        return value

    def _getattr(self, path: str) -> dict | None:
        """The attributes of `path`; None when nothing is there."""
        node = self.tree.lookup(path)
        if node is None:
            return None
        if isinstance(node, list):
            return self._dir_attrs(path)
        sticky = self._sticky(path)
        if sticky is not None and sticky[2]:
            return self._file_attrs(path, sticky[0].view.stamp, sticky[0].view.size, sticky[1])
        try:
            st = self._blob_stat(node)
            size = self._size(node, st)
        except fuse.FuseOSError:
            st = size = None
        if size is not None:
            return self._file_attrs(path, blob_identity(st), size, st)
        if sticky is not None:
            # Its blob broke under open files: they keep their size (and get
            # EIO on read), rather than an early end of file.
            return self._file_attrs(path, sticky[0].view.stamp, sticky[0].view.size, sticky[1])
        # Shown (empty, unreadable), so that opening it reports the error.
        return {"st_mode": stat.S_IFREG, "st_nlink": 1, "st_size": 0, "st_ino": _ino("bad", path),
                "st_uid": os.getuid(), "st_gid": os.getgid()}

    @staticmethod
    def _file_attrs(path: str, stamp: tuple, size: int, st: os.stat_result | None) -> dict:
        """A file's attributes: its blob's owner, mode (minus write bits) and
        times, one inode number per (path, blob identity)."""
        attrs = {"st_mode": stat.S_IFREG | (st.st_mode & 0o555 if st else 0), "st_nlink": 1,
                 "st_size": size, "st_blocks": (size + 511) // 512, "st_ino": _ino(path, stamp)}
        if st is not None:
            attrs.update(st_uid=st.st_uid, st_gid=st.st_gid, st_mtime=st.st_mtime_ns,
                         st_ctime=st.st_ctime_ns, st_atime=st.st_atime_ns)
        return attrs

    @staticmethod
    def _fstat(fd: int) -> os.stat_result | None:
        try:
            return os.fstat(fd)
        except OSError:
            return None

    def readdir(self, path, fh):
        entries = self._recall(self._listings, path, self._list)
        rel = path.strip("/")
        if not may_access(self.root / (BLOBS if rel.split("/")[0] == BLOBS else "manifests"), _Caller()):
            raise fuse.FuseOSError(errno.EACCES)
        return entries

    def _list(self, path: str) -> list[tuple]:
        node = self._node(path)
        if not isinstance(node, list):
            raise fuse.FuseOSError(errno.ENOTDIR)
        rel = path.strip("/")
        # d_ino must be set (readers skip entries with inode 0) and match stat's.
        entries = [(".", {"st_mode": stat.S_IFDIR, "st_ino": self._dir_ino(rel)}, 0),
                   ("..", {"st_mode": stat.S_IFDIR, "st_ino": self._dir_ino(rel.rpartition("/")[0])}, 0)]
        snap = self.tree.snapshot()
        for name in node:
            child = f"{path.rstrip('/')}/{name}"
            # Files are looked up, folders not (looking one up reads its blob's header).
            is_dir = rel == BLOBS or (f"{rel}/{name}" if rel else name) in snap.dirs
            ref = None if is_dir else self.tree.lookup(child)
            if isinstance(ref, FileRef):
                entries.append((name, {"st_mode": stat.S_IFREG, "st_ino": self._file_ino(child, ref)}, 0))
            else:
                entries.append((name, {"st_mode": stat.S_IFDIR, "st_ino": self._dir_ino(child.strip("/"))}, 0))
        return entries

    @staticmethod
    def _dir_ino(rel: str) -> int:
        return 1 if not rel else _ino("dir", rel)

    def _file_ino(self, path: str, ref: FileRef) -> int:
        """The inode number `getattr` gives `path`: one per (path, view)."""
        with self._lock:
            served = self._served.get(path)
            stamp = served.stamp if served is not None and served.fhs else None
        if stamp is None:
            try:
                stamp = blob_identity(os.stat(ref.blob))
            except OSError:
                return _ino("bad", path)
        return _ino(path, stamp)

    def statfs(self, path):
        try:
            sv = os.statvfs(self.root)
        except OSError:
            return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}
        return {k: getattr(sv, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                            "f_files", "f_ffree", "f_favail", "f_namemax")}

    # -- files ---------------------------------------------------------------
    def open(self, path, fi):
        if fi.flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise fuse.FuseOSError(errno.EROFS)
        node = self._node(path)
        if isinstance(node, list):
            raise fuse.FuseOSError(errno.EISDIR)
        caller = _Caller()
        for _attempt in range(2):
            view, blob = self._choose(path, node)
            if not may_access(Path(blob), caller):
                raise fuse.FuseOSError(errno.EACCES)
            try:
                file = BlobFile(blob)
            except GGUFError as e:
                log.error("cannot open blob: %s", e)
                raise fuse.FuseOSError(errno.EIO) from None
            if file.stamp == view.stamp:
                break
            file.close()
        else:
            log.error("blob %s changes while it is opened: not served", node.blob)
            raise fuse.FuseOSError(errno.EIO)
        fh = next(self._fh)
        with self._lock:
            self._handles[fh] = _Handle(path, view, file)
            served = self._served.get(path)
            # Views are immutable (the same blob, by identity, makes the same
            # bytes): the kernel may keep its pages of this path unless the
            # path now shows another blob than it did last time.
            fi.keep_cache = int(served is not None and served.blob == blob and served.stamp == view.stamp)
            if not fi.keep_cache:
                if served is not None and served.fhs:
                    log.info("%s now serves blob %s; %d handle(s) still read the view before", path, blob,
                             len(served.fhs))
                served = self._served[path] = _Served(view, blob, view.stamp)
            served.view = view
            served.fhs.add(fh)
            self._generation += 1
            self._attrs.pop(path, None)
        fi.fh = fh
        return 0

    def release(self, path, fi):
        with self._lock:
            handle = self._handles.pop(fi.fh, None)
            served = self._served.get(handle.path) if handle is not None else None
            if served is not None:
                served.fhs.discard(fi.fh)
                if not served.fhs:
                    served.view = None
            if handle is not None:
                self._generation += 1
                self._attrs.pop(handle.path, None)
        if handle is None:
            return 0
        handle.file.close()
        if served is not None and not served.fhs and self._outdated(handle.path, served):
            # The path kept its view for open files: now the kernel learns the
            # store's current one (from the rescan thread: no notification from
            # inside an operation).
            with self._lock:
                self._stale_paths.add(handle.path)
            self._kick.set()
        return 0

    def _outdated(self, path: str, served: _Served) -> bool:
        """Whether the store now has another blob (or bytes) at `path` than `served`."""
        ref = self.tree.lookup(path)
        if not isinstance(ref, FileRef) or str(ref.blob) != served.blob:
            return True
        try:
            return blob_identity(os.stat(ref.blob)) != served.stamp
        except OSError:
            return True

    def _handle(self, fi) -> _Handle:
        """The open handle, checked against its blob: EIO once the blob was
        truncated or rewritten since the view was built."""
        handle = self._handles.get(fi.fh)
        if handle is None:
            raise fuse.FuseOSError(errno.EBADF)
        if not handle.failed:
            try:
                intact = unchanged(handle.view.stamp, os.fstat(handle.file.fd))
            except OSError:
                intact = False
            if intact:
                return handle
            handle.failed = True
            log.error("blob %s changed under an open file (size, modification or change time): reads of %s fail "
                      "until it is opened again", handle.blob, handle.path)
        raise fuse.FuseOSError(errno.EIO)

    def _pieces(self, handle: _Handle, size: int, offset: int) -> list:
        """The view's layout of the range; ops computed whole are computed here."""
        try:
            return handle.view.layout(offset, size)
        except Exception as e:   # an op that fails on bad tensor data
            self._failed_read(handle, offset, e)

    @staticmethod
    def _failed_read(handle: _Handle, offset: int, e: Exception) -> NoReturn:
        log.error("read of %s at %d failed: %s", handle.blob, offset, e)
        raise fuse.FuseOSError(errno.EIO) from None

    def _compute_into(self, handle: _Handle, piece: Computed, out: memoryview, offset: int) -> None:
        """A range of a ranged op computed straight into `out`, its inputs read
        from the handle's blob (checked against the view's stamp by the caller)."""
        def read(t, start: int, size: int) -> memoryview:
            buf = np.empty(size, np.uint8)
            self._pread_into(handle, memoryview(buf), t.offset + start)
            return memoryview(buf)
        try:
            piece.op.compute_range_into(read, piece.lo, piece.lo + piece.size, out)
        except fuse.FuseOSError:
            raise
        except Exception as e:   # an op that fails on bad tensor data
            self._failed_read(handle, offset, e)

    def _fill(self, handle: _Handle, pieces: list, out: memoryview, offset: int) -> None:
        """The pieces' bytes, one after another, into `out`."""
        at = 0
        for piece in pieces:
            n = _piece_size(piece)
            self._fill_piece(handle, piece, out[at:at + n], offset + at)
            at += n

    def _fill_piece(self, handle: _Handle, piece, out: memoryview, offset: int) -> None:
        if isinstance(piece, FileRange):
            self._pread_into(handle, out, piece.offset)
        elif isinstance(piece, Computed):
            self._compute_into(handle, piece, out, offset)
        else:
            out[:] = piece

    def read_buf(self, path, bufpp, size, offset, fi):
        handle = self._handle(fi)
        pieces = self._pieces(handle, size, offset)
        if len(pieces) > 1 and not _MULTI_BUF:
            pieces = [_Gathered(pieces)]
        vec = _bufvec_type(len(pieces))(count=len(pieces))
        taken: list[int] = []
        try:
            at = offset
            for buf, piece in zip(vec.buf, pieces):
                # Memory buffers, which libfuse frees, filled here: blob ranges
                # are read straight into C memory (a blob cut short under a
                # read is EIO, never a short reply, which the kernel would take
                # for the end of the file), op ranges computed into it.
                n = _piece_size(piece)
                mem = LIBC.malloc(max(n, 1))
                if not mem:
                    raise fuse.FuseOSError(errno.ENOMEM)
                taken.append(mem)
                out = memoryview((ctypes.c_char * n).from_address(mem)).cast("B") if n else memoryview(b"")
                if isinstance(piece, _Gathered):
                    self._fill(handle, piece.pieces, out, at)
                else:
                    self._fill_piece(handle, piece, out, at)
                buf.size, buf.mem = n, mem
                at += n
            self._handle(fi)   # the blob is still the one the view was built from
            out = LIBC.malloc(ctypes.sizeof(vec))
            if not out:
                raise fuse.FuseOSError(errno.ENOMEM)
        except BaseException:
            for mem in taken:
                LIBC.free(mem)
            raise
        ctypes.memmove(out, ctypes.addressof(vec), ctypes.sizeof(vec))
        ctypes.cast(bufpp, ctypes.POINTER(ctypes.c_void_p))[0] = out
        return 0

    @staticmethod
    def _pread_into(handle: _Handle, out: memoryview, offset: int) -> None:
        """The blob's bytes at `offset` into all of `out`; EIO when the blob ends first."""
        try:
            handle.file.read_into(out, offset)
        except GGUFError as e:
            log.error("%s", e)
            raise fuse.FuseOSError(errno.EIO) from None

    # -- everything that would write -------------------------------------------
    write = create = mkdir = mknod = unlink = rmdir = rename = _erofs
    chmod = chown = truncate = utimens = symlink = link = setxattr = removexattr = _erofs


# The kernel keeps attributes and entries this long: the rescan invalidates
# whatever changed within about a second, so a repeat listing is answered by
# the kernel, not by a round trip per file.
ATTR_TIMEOUT = 3600

# Options this layer sets itself (or that mfusepy takes as its own arguments).
RESERVED_OPTIONS = frozenset({"foreground", "nothreads", "raw_fi", "encoding", "errors", "operations",
                              "mountpoint", "use_ino", "rw"})

# fuse_main_real's exit codes.
_LIBFUSE_ERRORS = {1: "invalid mount options", 2: "no mountpoint", 3: "libfuse set-up failed",
                   4: "mounting failed", 5: "cannot daemonize", 6: "cannot set signal handlers",
                   7: "the filesystem loop failed", 8: "the filesystem loop ended with an error"}
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def check_options(options: dict) -> None:
    """MountError naming an option the FUSE layer sets itself."""
    bad = sorted(set(options) & RESERVED_OPTIONS)
    if bad:
        hint = " (stay in the foreground with -f)" if "foreground" in bad else ""
        raise MountError(f"option {', '.join('-o ' + b for b in bad)} is set by compatfs itself{hint}")


def lazy_unmount(mountpoint: str) -> bool:
    """`fusermount3 -u`, else `-u -z` (lazily, when busy or its daemon is gone)."""
    for args in (["-u"], ["-u", "-z"]):
        for tool in ("fusermount3", "fusermount"):
            try:
                if subprocess.run([tool, *args, "-q", mountpoint], capture_output=True).returncode == 0:
                    return True
            except FileNotFoundError:
                continue
    return False


def _keep_handler(signum, _handler):
    """Stands in for `signal.signal` in mfusepy while it mounts: mfusepy resets
    SIGINT to SIG_DFL there, and libfuse then installs its own handler, which
    ends the loop only once the main thread notices (and exits with status 8)."""
    return signal.getsignal(signum)


def _stop_on_signal(fs: CompatFS, mountpoint: str, wake: int, done: threading.Event) -> None:
    """Wait for SIGTERM/SIGINT/SIGHUP (Python's handler writes its number to
    `wake` from whichever thread it lands on), then unmount; files still open
    after a grace period end with the process."""
    while True:
        sig = os.read(wake, 1)
        if done.is_set() or not sig:
            return
        if sig[0] in _STOP_SIGNALS:
            break
    log.info("%s: unmounting %s", signal.Signals(sig[0]).name, mountpoint)
    fs.exit()
    if not done.wait(5):
        lazy_unmount(mountpoint)
        log.info("%d file(s) still open at %s: exiting, their readers get ENOTCONN", fs.open_files, mountpoint)
        logging.shutdown()
        os._exit(0)


def set_read_ahead(mountpoint: str, kb: int) -> str:
    """Raise the kernel's read-ahead for the mount (its backing device's
    `read_ahead_kb`): FUSE negotiates 128 KiB, so a cold sequential read
    crosses into the daemon every 128 KiB; with more, every 1 MiB (libfuse's
    largest request).  Root may write it; others keep the kernel's value.
    The device comes from /proc/self/mountinfo: the daemon never stats its own
    mount (a request to itself that a kill would leave unanswered forever).
    The INIT reply allows `kb` as its max_readahead (`CompatFS.init_with_config`),
    else the kernel, taking that reply, would lower a value written before it
    to the 128 KiB it offered.  Returns the line to log."""
    device = _mount_device(mountpoint)
    if device is None:
        return f"read-ahead not set: {mountpoint} is not in /proc/self/mountinfo"
    knob = Path(f"/sys/class/bdi/{device}/read_ahead_kb")
    try:
        knob.write_text(f"{kb}\n")
        return f"read-ahead {kb} KiB ({knob})"
    except OSError as e:
        try:
            current = knob.read_text().strip()
        except OSError:
            current = "?"
        return f"read-ahead left at the kernel's {current} KiB: cannot write {knob} ({e.strerror})"


def _mount_device(mountpoint: str, tries: int = 20) -> str | None:
    """`major:minor` of the mount at `mountpoint` (the last one mounted there)."""
    want = os.path.abspath(mountpoint)
    for _ in range(tries):
        try:
            lines = Path("/proc/self/mountinfo").read_text().splitlines()
        except OSError:
            return None
        found = [fields[2] for fields in (line.split() for line in lines)
                 if len(fields) > 4 and _unescape(fields[4]) == want]
        if found:
            return found[-1]
        time.sleep(0.05)
    return None


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount(tree: Tree, mountpoint: str, options: dict | None = None, read_ahead_kb: int = 0) -> None:
    """Serve `tree` at `mountpoint` in the foreground until unmounted or
    signalled (blocks; call from the main thread); MountError when libfuse fails."""
    options = dict(options or {})
    check_options(options)
    opts = {"ro": True, "fsname": "compatfs", "subtype": "compatfs", "use_ino": True,
            "attr_timeout": ATTR_TIMEOUT, "entry_timeout": ATTR_TIMEOUT, "default_permissions": True}
    if os.getuid() == 0:
        opts["allow_other"] = True
    if _libfuse_tuple() >= (3, 12) and "max_threads" not in options:
        # libfuse 3.12+ warns about its own default for this ("Ignoring invalid
        # max threads value 4294967295"); 10 is libfuse's historic default.
        opts["max_idle_threads"] = 10
    opts.update(options)
    fs = CompatFS(tree, mountpoint, read_ahead_kb)
    done = threading.Event()
    wake, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    # A Python handler (not SIG_DFL) keeps libfuse from installing its own;
    # the wakeup fd carries the signal to the thread that unmounts.
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    old_handlers = {s: signal.signal(s, lambda *_: None) for s in _STOP_SIGNALS}
    watcher = threading.Thread(target=_stop_on_signal, args=(fs, mountpoint, wake, done),
                               name="compatfs-signals", daemon=True)
    watcher.start()
    saved, fuse.signal = fuse.signal, _keep_handler
    try:
        fuse.FUSE(fs, mountpoint, foreground=True, raw_fi=True, **opts)
    except RuntimeError as e:
        code = e.args[0] if e.args else 0
        raise MountError(f"libfuse: {_LIBFUSE_ERRORS.get(code, f'error {code}')} (see its message above)") from None
    finally:
        fuse.signal = saved
        done.set()
        os.write(wake_w, b"\0")
        watcher.join(timeout=5)
        signal.set_wakeup_fd(old_wakeup)
        for s, h in old_handlers.items():
            signal.signal(s, h)
        os.close(wake)
        os.close(wake_w)
