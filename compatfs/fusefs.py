"""The FUSE layer: paths to tree lookups, file handles to views, reads to pieces.

Kept thin on purpose: every decision about what a file contains lives in
`tree`, `views` and `view`.  Blob ranges are handed to libfuse as file
descriptor buffers (`read_buf`), so passthrough bytes never pass through
Python; header bytes and op tensors go as one malloc'ed buffer.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import itertools
import logging
import os
import stat
import threading
from dataclasses import dataclass

import mfusepy as fuse

from .tree import FileRef, Tree
from .view import FileRange, View

log = logging.getLogger("compatfs")

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]

FUSE_BUF_IS_FD = 1 << 1
FUSE_BUF_FD_SEEK = 1 << 2


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


def _libfuse_version() -> tuple[int, int]:
    try:
        lib = fuse._libfuse
        lib.fuse_pkgversion.restype = ctypes.c_char_p
        major, minor = lib.fuse_pkgversion().decode().split(".")[:2]
        return int(major), int(minor)
    except (AttributeError, ValueError):
        return (0, 0)


# Several buffers in one reply need the exact struct fuse_buf stride, known
# for libfuse 3.0-3.16; elsewhere a read that spans pieces is gathered into
# one memory buffer.
_MULTI_BUF = (3, 0) <= _libfuse_version() < (3, 17)


@dataclass
class _Handle:
    view: View
    fd: int
    blob: str


def _malloc_copy(data) -> int:
    """A malloc'ed copy of `data` (bytes-like), for libfuse to free."""
    n = len(data)
    mem = _libc.malloc(max(n, 1))
    if not mem:
        raise fuse.FuseOSError(errno.ENOMEM)
    if n:
        memoryview((ctypes.c_char * n).from_address(mem)).cast("B")[:] = data
    return mem


def _erofs(*_args, **_kwargs):
    raise fuse.FuseOSError(errno.EROFS)


class CompatFS(fuse.Operations):
    """Read-only operations over a `Tree`."""

    use_ns = True

    def __init__(self, tree: Tree):
        self.tree = tree
        self._handles: dict[int, _Handle] = {}
        self._fh = itertools.count(1)
        self._lock = threading.Lock()
        self._last_view: dict[str, View] = {}   # path -> view it served last (page-cache validity)
        self._uid, self._gid = os.getuid(), os.getgid()

    # -- lookups -------------------------------------------------------------
    def _node(self, path: str):
        node = self.tree.lookup(path)
        if node is None:
            raise fuse.FuseOSError(errno.ENOENT)
        return node

    def _view(self, ref: FileRef) -> View:
        try:
            return self.tree.views.view(ref.blob, ref.kind)
        except Exception as e:   # a bad blob must never take the mount down
            log.error("cannot present %s of %s: %s", ref.kind, ref.blob, e)
            raise fuse.FuseOSError(errno.EIO) from None

    def getattr(self, path, fh=None):
        node = self._node(path)
        base = {"st_uid": self._uid, "st_gid": self._gid}
        if isinstance(node, list):
            return {**base, "st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2}
        try:
            st = os.stat(node.blob)
            times = {"st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns, "st_atime": st.st_atime_ns}
        except OSError:
            times = {}
        size = self.tree.views.size(node.blob, node.kind)   # 0 for a bad blob: opening it says why
        return {**base, **times, "st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": size}

    def readdir(self, path, fh):
        node = self._node(path)
        if not isinstance(node, list):
            raise fuse.FuseOSError(errno.ENOTDIR)
        return [".", ".."] + node

    def statfs(self, path):
        return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}

    # -- files ---------------------------------------------------------------
    def open(self, path, fi):
        if fi.flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise fuse.FuseOSError(errno.EROFS)
        node = self._node(path)
        if isinstance(node, list):
            raise fuse.FuseOSError(errno.EISDIR)
        view = self._view(node)
        try:
            fd = os.open(node.blob, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            log.error("cannot open blob %s: %s", node.blob, e.strerror)
            raise fuse.FuseOSError(errno.EIO) from None
        fh = next(self._fh)
        with self._lock:
            self._handles[fh] = _Handle(view, fd, str(node.blob))
            # Views are immutable: the kernel may keep their pages unless the
            # path now shows a different view than it did last time.
            fi.keep_cache = 1 if self._last_view.get(path) is view else 0
            self._last_view[path] = view
        fi.fh = fh
        return 0

    def release(self, path, fi):
        with self._lock:
            handle = self._handles.pop(fi.fh, None)
        if handle is not None:
            os.close(handle.fd)
        return 0

    def _handle(self, fi) -> _Handle:
        handle = self._handles.get(fi.fh)
        if handle is None:
            raise fuse.FuseOSError(errno.EBADF)
        return handle

    def _pieces(self, handle: _Handle, size: int, offset: int):
        try:
            return handle.view.pieces(offset, size)
        except Exception as e:   # an op that fails on bad tensor data
            log.error("read of %s at %d failed: %s", handle.blob, offset, e)
            raise fuse.FuseOSError(errno.EIO) from None

    @staticmethod
    def _pread(handle: _Handle, r: FileRange) -> bytes:
        data = os.pread(handle.fd, r.size, r.offset)
        if len(data) != r.size:
            log.error("blob %s is shorter than its header says (read at %d)", handle.blob, r.offset)
            raise fuse.FuseOSError(errno.EIO)
        return data

    def read(self, path, size, offset, fi):
        handle = self._handle(fi)
        return b"".join(self._pread(handle, p) if isinstance(p, FileRange) else bytes(p)
                        for p in self._pieces(handle, size, offset))

    def read_buf(self, path, bufpp, size, offset, fi):
        handle = self._handle(fi)
        pieces = self._pieces(handle, size, offset)
        if len(pieces) > 1 and not _MULTI_BUF:
            pieces = [b"".join(self._pread(handle, p) if isinstance(p, FileRange) else p for p in pieces)]
        vec = _bufvec_type(len(pieces))(count=len(pieces))
        for buf, piece in zip(vec.buf, pieces):
            if isinstance(piece, FileRange):   # libfuse reads these from the blob itself
                buf.size, buf.flags, buf.fd, buf.pos = piece.size, FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK, handle.fd, piece.offset
            else:                               # libfuse frees these with free()
                buf.size, buf.mem = len(piece), _malloc_copy(piece)
        out = _libc.malloc(ctypes.sizeof(vec))
        if not out:
            raise fuse.FuseOSError(errno.ENOMEM)
        ctypes.memmove(out, ctypes.addressof(vec), ctypes.sizeof(vec))
        ctypes.cast(bufpp, ctypes.POINTER(ctypes.c_void_p))[0] = out
        return 0

    # -- everything that would write -------------------------------------------
    write = create = mkdir = mknod = unlink = rmdir = rename = _erofs
    chmod = chown = truncate = utimens = symlink = link = setxattr = removexattr = _erofs


def mount(tree: Tree, mountpoint: str, foreground: bool = True, options: dict | None = None) -> None:
    """Serve `tree` at `mountpoint` until unmounted (blocks)."""
    opts = {"ro": True, "fsname": "compatfs", "subtype": "compatfs",
            "attr_timeout": 60, "entry_timeout": 60, "default_permissions": True}
    if os.getuid() == 0:
        opts["allow_other"] = True
    opts.update(options or {})
    fuse.FUSE(CompatFS(tree), mountpoint, foreground=foreground, raw_fi=True, **opts)
