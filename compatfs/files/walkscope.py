"""The folders one thread's walks share (`scope`): each reached from "/"
before any symlink, held by an O_PATH descriptor with its status and access
ACL as first read, so that a scan resolves a folder prefix once rather than
once per file below it (`lookup._walk` starts from the deepest one kept and
makes every check a walk from "/" makes on what is held)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator

from .access import ACL, read_acl


def proc_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


class Node:
    """What a walk holds: an O_PATH descriptor, the status read from it and
    its access ACL, read at most once; a `Scope`'s folder (`kept`, below
    `up`) is the scope's to close, any other the holder's (`release`)."""

    __slots__ = ("fd", "st", "path", "up", "kept", "depth", "_acl")

    def __init__(self, fd: int, st: os.stat_result, path: str):
        self.fd, self.st, self.path = fd, st, path
        self.up: Node | None = None
        self.kept, self.depth = False, 1
        self._acl: ACL | None | bool = False  # False: not read yet

    def acl(self) -> ACL | None:
        """Its access ACL (None: none); BadACL, read again next time, where unreadable."""
        if self._acl is False:
            self._acl = read_acl(proc_path(self.fd))
        return self._acl  # type: ignore[return-value]

    def chain(self) -> list[Node]:
        """The folders from "/" to this one."""
        return [self] if self.up is None else [*self.up.chain(), self]

    def release(self) -> None:
        if not self.kept:  # (a scope closes its own)
            os.close(self.fd)


SCOPE_FOLDERS = 64  # descriptors a scope keeps at most


class Scope:
    """The folders one thread's walks reached from "/" before any symlink, by
    path, held with their status and ACL as first read: `bound` at most, the
    least recently walked through let go first (a folder is used before, so
    let go after, every folder below it: those above a kept one are kept)."""

    def __init__(self, bound: int):
        self.bound = bound
        self.folders: OrderedDict[str, Node] = OrderedDict()

    def deepest(self, path: str) -> Node | None:
        """The deepest folder kept of absolute, normalised `path` (itself included)."""
        while True:
            node = self.folders.get(path)
            if node is not None:
                self._used(node)
                return node
            if path == "/":
                return None
            path = path[: path.rindex("/")] or "/"

    def keep(self, node: Node, up: Node | None) -> None:
        """Keep folder `node`, reached from the kept folder `up` (None: it is
        "/"), unless it lies `bound` folders deep; its descriptor is then the scope's."""
        depth = 1 if up is None else up.depth + 1
        if depth >= self.bound:
            return
        node.up, node.depth, node.kept = up, depth, True
        try:
            self.folders[node.path] = node
        except BaseException:
            node.kept = False
            raise
        self._used(node)
        while len(self.folders) > self.bound:  # (never a folder of `node`'s chain: all newer)
            os.close(self.folders.popitem(last=False)[1].fd)

    def _used(self, node: Node | None) -> None:
        while node is not None:  # (the folders above it last: used more recently)
            self.folders.move_to_end(node.path)
            node = node.up

    def close(self) -> None:
        while self.folders:
            os.close(self.folders.popitem()[1].fd)


_thread = threading.local()  # .scope: the calling thread's Scope, if it opened one


def current() -> Scope | None:
    """The calling thread's scope, if it opened one."""
    return getattr(_thread, "scope", None)


@contextlib.contextmanager
def scope() -> Iterator[Scope]:
    """Walks of the calling thread, until the block ends, share the folders
    they reach from "/" before any symlink: a walk starts from the deepest
    such folder of its path, making every check a walk from "/" makes (the
    keep-out mount; search permission and ACL for a `Caller`, recorded by a
    `Recorder`) on the status and ACL first read of each folder above it,
    and `status` of such a folder is that status.  So a scan sees each folder
    as of one moment (as a single walk does), the one it first reached it;
    a change after that is seen by the next scan, in a scope of its own (one
    in a watched folder has the rescan thread look again at once).  Other
    threads walk from "/".  Its descriptors (`SCOPE_FOLDERS` at most) close
    as the block ends, however it ends; a scope already open is shared."""
    held = getattr(_thread, "scope", None)
    if held is not None:
        yield held
        return
    _thread.scope = opened = Scope(SCOPE_FOLDERS)
    try:
        yield opened
    finally:
        _thread.scope = None
        opened.close()
