"""The FUSE layer: paths to tree lookups, file handles to views, reads to pieces.

Kept thin on purpose: every decision about what a file contains lives in
`tree`, `views` and `view`.  A read is answered with one malloc'ed buffer
that libfuse frees (`read_buf`), filled by `viewbytes` through the blob the
open file holds: blob ranges are read with preadv straight into C memory
(their bytes never become Python objects), ranges of elementwise ops are
computed straight into it, header bytes and op tensors' chunks copied in.

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
import itertools
import logging
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path


from . import inodes, libfuse
from .libfuse import fuse
from .tree import BLOBS, FileRef, Tree
from .access import READ, Caller
from .blobfile import BlobFile, Denied, identity, keep_out, status, unchanged
from .gguf_values import GGUFError
from .libc import LIBC
from .memo import Memo
from .presented import Changed, Presented
from . import viewbytes
from .view import View
from .views import MMPROJ_FILE, MODEL_FILE

log = logging.getLogger("compatfs")




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
    params: Path | None = None     # the params layer a model folder's model.gguf was built with


class _CannotOpen(fuse.FuseOSError):
    """EIO for a blob that cannot be opened; `message` is logged if opening
    the path's blob of a scan made then fails too."""

    def __init__(self, message: str):
        super().__init__(errno.EIO)
        self.message = message


def _erofs(*_args, **_kwargs):
    raise fuse.FuseOSError(errno.EROFS)


class CompatFS(fuse.Operations):
    """Read-only operations over a `Tree`."""

    use_ns = True
    RESCAN_SECONDS = 1.0
    _OPEN_ATTEMPTS = 8          # an open racing re-pulls tries the path's newest blob this often

    def __init__(self, tree: Tree, mountpoint: str, read_ahead_kb: int = 0, on_start=None):
        self.tree = tree
        self._mountpoint = mountpoint
        keep_out(mountpoint)     # nothing is ever looked up through it (a request to this very daemon)
        self._read_ahead_kb = read_ahead_kb
        self._on_start = on_start                 # run by the rescan thread as it starts (the mount is up)
        self.root = tree.store.root
        self._handles: dict[int, _Handle] = {}
        self._fh = itertools.count(1)
        self._lock = threading.Lock()
        self._served: dict[str, _Served] = {}       # path -> what it served last (page-cache validity)
        self._store = Presented(tree, self._lock)     # the store's current views, failures logged once
        self._stale_paths: set[str] = set()      # to invalidate: they kept a view for open files
        self._opening = [threading.Lock() for _ in range(64)]   # opens of one path, one at a time
        self._told: dict[str, set] = {}           # path -> blob identities getattr gave sizes of (None: a bad file's 0)
        self._memo = Memo(self._lock, self._open_on)   # getattr's and readdir's answers
        self._fuse_ptr: int | None = None
        self._stop = threading.Event()
        self._kick = threading.Event()             # rescan now
        self._watcher: threading.Thread | None = None
        tree.views.on_belied = self._belied      # an index entry was wrong: the kernel's attributes too

    # -- lifetime ------------------------------------------------------------
    def init_with_config(self, conn, config):
        # The kernel lowers the mount's read-ahead to the INIT reply's
        # max_readahead when it takes the reply (sent after this returns):
        # allowing `read_ahead_kb` keeps set_read_ahead's value, whenever it lands.
        if self._read_ahead_kb:
            conn.max_readahead = max(conn.max_readahead, self._read_ahead_kb << 10)
        self.init("/")

    def init(self, path):
        self._fuse_ptr = libfuse.session()
        self._watcher = threading.Thread(target=self._watch, name="compatfs-rescan", daemon=True)
        self._watcher.start()

    def destroy(self, path):
        self._stop.set()
        self._kick.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        self._fuse_ptr = None

    @property
    def session(self) -> int | None:
        """The FUSE session while the loop runs (set in `init`), else None."""
        return self._fuse_ptr

    @property
    def open_files(self) -> int:
        with self._lock:
            return len(self._handles)

    def _watch(self) -> None:
        """Rescan the store every second; tell the kernel what changed."""
        if self._on_start is not None:
            self._on_start()
        old_snap = self.tree.snapshot()
        self.tree.follow()     # from now on only this thread rescans; lookups never wait for it
        before = self._marks(old_snap)
        while not self._stop.is_set():
            self._kick.wait(self.RESCAN_SECONDS)
            self._kick.clear()
            if self._stop.is_set():
                return
            try:
                with self._lock:
                    stale, self._stale_paths = self._stale_paths, set()
                snap = self.tree.rescan()
                now = self._marks(snap)
                changed = {d for d in before.keys() | now.keys() if before.get(d) != now.get(d)}
                before = now
                if changed or stale:
                    self._memo.forget()
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
                st = status(self.root / top)
                marks[f"<{top}>"] = (st.st_uid, st.st_gid, st.st_mode, st.st_mtime_ns)
            except OSError:
                marks[f"<{top}>"] = None
        return marks

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

    def _sticky(self, path: str, duplicate: bool = False) -> tuple[_Served, os.stat_result, bool, BlobFile | None] | None:
        """What `path` served last while handles are open on it: the served
        view, its blob's status by descriptor, whether that blob is intact,
        and with `duplicate` a descriptor of that blob of the caller's own
        (taken while the handle cannot be closed)."""
        with self._lock:
            served = self._served.get(path)
            file = next((self._handles[fh].file for fh in served.fhs if fh in self._handles), None) if served else None
            if file is None or served.view is None:
                return None
            served = _Served(served.view, served.blob, served.stamp)   # as it is now, for the caller
            st = self._fstat(file.fd)
            if st is None:
                return None
            own = file.duplicate() if duplicate and unchanged(served.stamp, st) else None
        return served, st, unchanged(served.stamp, st), own

    def _choose(self, path: str, ref: FileRef) -> tuple[View, str, BlobFile | None]:
        """The view `path` serves now: the one its open handles read while their
        blob is intact (with a descriptor of it, the caller's to close: the
        blob may have left the store), else the store's current one."""
        sticky = self._sticky(path, duplicate=True)
        if sticky is not None and sticky[2]:
            return sticky[0].view, sticky[0].blob, sticky[3]
        return self._store.build(ref, self._store.blob_stat(ref)), str(ref.blob), None

    def _dir_attrs(self, path: str) -> dict:
        rel = path.strip("/")
        base = self.root / (BLOBS if rel == BLOBS or rel.startswith(BLOBS + "/") else "manifests")
        try:
            st = status(base)
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
                mtime = status(snap.blobs[rel.rpartition("/")[2]]).st_mtime_ns
            except (KeyError, OSError):
                pass
        else:
            mtime = snap.dir_mtimes.get(rel, mtime)
        # Link count: 2 + subfolders, as `find` expects of a Unix folder.
        if rel == BLOBS:
            subdirs = len(snap.blobs)
        else:
            subdirs = sum(1 for c in snap.dirs.get(rel, ()) if (f"{rel}/{c}" if rel else c) in snap.dirs)
        return {**owner, "st_nlink": 2 + subdirs, "st_ino": inodes.dir_ino(rel),
                "st_mtime": mtime, "st_ctime": mtime, "st_atime": mtime}

    def getattr(self, path, fh=None):
        handle = self._handles.get(fh.fh) if fh is not None else None
        if handle is not None:
            attrs = self._file_attrs(path, handle.view.stamp, handle.view.size, self._fstat(handle.file.fd))
        else:
            attrs = self._memo.attrs(path, self._getattr)
        if attrs is None:
            raise fuse.FuseOSError(errno.ENOENT)
        if stat.S_ISREG(attrs["st_mode"]):
            attrs = dict(attrs)
            with self._lock:
                self._told.setdefault(path, set()).add(attrs.pop("st_stamp", None))
        return attrs

    def _open_on(self, path: str) -> bool:
        """Whether handles are open on `path` (the lock is held)."""
        served = self._served.get(path)
        return served is not None and bool(served.fhs)

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
        for _attempt in range(3):
            # Size and identity of one blob (the path may name another by the
            # time its summary is looked up).
            try:
                st = self._store.blob_stat(node)
                size = self._store.size(node, st)
                break
            except fuse.FuseOSError:
                st = size = None
                break
            except Changed:
                st = size = None
        if size is not None:
            return self._file_attrs(path, identity(st), size, st)
        if sticky is not None:
            # Its blob broke under open files: they keep their size (and get
            # EIO on read), rather than an early end of file.
            return self._file_attrs(path, sticky[0].view.stamp, sticky[0].view.size, sticky[1])
        # Shown (empty, unreadable), so that opening it reports the error.
        return {"st_mode": stat.S_IFREG, "st_nlink": 1, "st_size": 0, "st_ino": inodes.bad_ino(path),
                "st_uid": os.getuid(), "st_gid": os.getgid()}

    @staticmethod
    def _file_attrs(path: str, stamp: tuple, size: int, st: os.stat_result | None) -> dict:
        """A file's attributes: its blob's owner, mode (minus write bits) and
        times, one inode number per (path, blob identity); `st_stamp` the
        identity (getattr notes it as told to the kernel, and drops it)."""
        attrs = {"st_mode": stat.S_IFREG | (st.st_mode & 0o555 if st else 0), "st_nlink": 1,
                 "st_size": size, "st_blocks": (size + 511) // 512, "st_ino": inodes.file_ino(path, stamp),
                 "st_stamp": tuple(stamp)}
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
        entries = self._memo.listing(path, self._list)
        rel = path.strip("/")
        # Listing needs what listing the store folder it comes from needs.
        try:
            status(self.root / (BLOBS if rel.split("/")[0] == BLOBS else "manifests"), libfuse.caller(), READ)
        except Denied:
            raise fuse.FuseOSError(errno.EACCES) from None
        except OSError as e:
            raise fuse.FuseOSError(e.errno or errno.EIO) from None
        return entries

    def _list(self, path: str) -> list[tuple]:
        node = self._node(path)
        if not isinstance(node, list):
            raise fuse.FuseOSError(errno.ENOTDIR)
        rel = path.strip("/")
        # d_ino must be set (readers skip entries with inode 0) and match stat's.
        entries = [(".", {"st_mode": stat.S_IFDIR, "st_ino": inodes.dir_ino(rel)}, 0),
                   ("..", {"st_mode": stat.S_IFDIR, "st_ino": inodes.dir_ino(rel.rpartition("/")[0])}, 0)]
        snap = self.tree.snapshot()
        for name in node:
            child = f"{path.rstrip('/')}/{name}"
            # Files are looked up, folders not (looking one up reads its blob's header).
            is_dir = rel == BLOBS or (f"{rel}/{name}" if rel else name) in snap.dirs
            ref = None if is_dir else self.tree.lookup(child)
            if isinstance(ref, FileRef):
                entries.append((name, {"st_mode": stat.S_IFREG, "st_ino": self._file_ino(child, ref)}, 0))
            else:
                entries.append((name, {"st_mode": stat.S_IFDIR, "st_ino": inodes.dir_ino(child.strip("/"))}, 0))
        return entries

    def _file_ino(self, path: str, ref: FileRef) -> int:
        """The inode number `getattr` gives `path`: one per (path, view)."""
        with self._lock:
            served = self._served.get(path)
            stamp = served.stamp if served is not None and served.fhs else None
        if stamp is None:
            try:
                stamp = identity(status(ref.blob))
            except OSError:
                return inodes.bad_ino(path)
        return inodes.file_ino(path, stamp)

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
        with self._opening[hash(path) % len(self._opening)]:
            return self._open(path, node, fi)

    def _open(self, path: str, node: FileRef, fi) -> int:
        """`open` of `path`, one at a time per path: what it serves is chosen
        knowing every handle opened on it before."""
        caller = libfuse.caller()
        for _attempt in range(self._OPEN_ATTEMPTS):
            try:
                opened = self._open_view(path, node, caller)
            except fuse.FuseOSError as e:
                if e.errno != errno.EIO:
                    raise
                opened, failed = None, e
            else:
                failed = None
            if opened is not None:
                break
            # The blob changed as it was opened, or the store moved on since
            # the last scan (a model pulled again, its old blob removed):
            # the path's current blob, from a scan made now.
            self.tree.snapshot(fresh=True)
            node = self._node(path)
        else:
            if isinstance(failed, _CannotOpen):
                log.error("cannot open blob: %s", failed.message)
            elif failed is None:
                log.error("blob %s changes while it is opened: not served", node.blob)
            raise failed or fuse.FuseOSError(errno.EIO)
        view, blob, file = opened
        fh = next(self._fh)
        with self._lock:
            self._handles[fh] = _Handle(path, view, file)
            served = self._served.get(path)
            # Views are immutable (the same blob, by identity, and params layer
            # make the same bytes): the kernel may keep its pages of this path
            # unless the path now shows another view than it did last time.
            params = served.params if served is not None and served.view is view else node.params
            fi.keep_cache = int(served is not None and served.blob == blob and served.stamp == view.stamp
                                and served.params == params)
            if not fi.keep_cache:
                if served is not None and served.fhs:
                    log.info("%s now serves blob %s; %d handle(s) still read the view before", path, blob,
                             len(served.fhs))
                served = self._served[path] = _Served(view, blob, view.stamp, params=params)
            served.view = view
            served.fhs.add(fh)
            self._memo.forget_path(path)
            told = self._told.get(path, set())
            stale = bool(told - {view.stamp})
            if stale:
                told.clear()
        if stale and self._fuse_ptr:
            # Since this was last done, getattr gave the kernel another view's
            # size for this path (it may hold it, or a reply still on its way
            # may set it): it must ask again (getattr with this handle) before
            # it serves any byte of this view, or it would cut it short or
            # mix the two.  Invalidating also discards replies sent before.
            libfuse.invalidate_path(self._fuse_ptr, path)
        fi.fh = fh
        return 0

    def _open_view(self, path: str, node: FileRef, caller: Caller) -> tuple[View, str, BlobFile] | None:
        """The view `path` serves now, its blob's path and the file it is
        served from, opened for `caller` (EACCES unless it may read it; the
        permission is decided on that very file); None when the file opened
        is not the one the view was built from (it changed meanwhile)."""
        view, blob, file = self._choose(path, node)
        try:
            if file is not None:
                try:
                    file.allow(caller)
                except BaseException:
                    file.close()
                    raise
            else:
                file = BlobFile(blob, caller=caller)
        except Denied:
            raise fuse.FuseOSError(errno.EACCES) from None
        except GGUFError as e:
            raise _CannotOpen(str(e)) from None
        if file.stamp != view.stamp:
            file.close()
            return None
        return view, blob, file

    def release(self, path, fi):
        with self._lock:
            handle = self._handles.pop(fi.fh, None)
            served = self._served.get(handle.path) if handle is not None else None
            if served is not None:
                served.fhs.discard(fi.fh)
                if not served.fhs:
                    served.view = None
            if handle is not None:
                self._memo.forget_path(handle.path)
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
        if not isinstance(ref, FileRef) or str(ref.blob) != served.blob or ref.params != served.params:
            return True
        try:
            return identity(status(ref.blob)) != served.stamp
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

    @staticmethod
    def _fill(handle: _Handle, offset: int, out: memoryview) -> None:
        """The view's bytes at `offset` into `out`, every blob byte (op inputs
        included) read through the handle's blob; EIO and a log line when the
        blob cannot give them or an op fails on its data."""
        try:
            viewbytes.fill(handle.view, handle.file, offset, out)
        except Exception as e:   # a blob cut short, an op that fails on bad tensor data
            log.error("read of %s at %d failed: %s", handle.blob, offset, e)
            raise fuse.FuseOSError(errno.EIO) from None

    def read_buf(self, path, bufpp, size, offset, fi):
        handle = self._handle(fi)
        n = max(0, min(size, handle.view.size - offset))
        # One memory buffer, which libfuse frees, filled here (a blob cut
        # short under a read is EIO, never a short reply, which the kernel
        # would take for the end of the file).
        mem = LIBC.malloc(max(n, 1))
        if not mem:
            raise fuse.FuseOSError(errno.ENOMEM)
        try:
            if n:
                self._fill(handle, offset, memoryview((ctypes.c_char * n).from_address(mem)).cast("B"))
            self._handle(fi)   # the blob is still the one the view was built from
            libfuse.reply_buffer(bufpp, mem, n)
        except BaseException:
            LIBC.free(mem)
            raise
        return 0

    # -- everything that would write -------------------------------------------
    write = create = mkdir = mknod = unlink = rmdir = rename = _erofs
    chmod = chown = truncate = utimens = symlink = link = setxattr = removexattr = _erofs
