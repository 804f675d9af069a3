"""The folders one thread's walks share (`scope`): each kept under the path
prefix, as written, that resolves to it (through symlinks too), held by an
O_PATH descriptor with its status and access ACL as first read and the
checks resolving that prefix made, so that a scan resolves a folder prefix
once rather than once per file below it (`lookup._walk` starts from the
deepest one kept, making again every check a walk from "/" makes).

Why no outcome changes: what a prefix resolves to, and what resolving it
reads (each folder's status and ACL, each symlink's target), depends on
the prefix alone; what depends on the walk is checked again, in the order
a walk from "/" checks it, from what was kept (`Lookup`, `Link`): each name
looked up against the keep-out mounts as they are now, each folder searched
against the walk's caller (a `Recorder` records the same chain), each
symlink counted (the 40-link limit goes on from the prefix's count) and,
where the rest of this walk's path leads onto another mount, the hang
guard `probe.reach` asked of that rest, as a walk from "/" asks it.  What
is reused is only what was read, as first read: a scan sees what each
prefix resolves to as of one moment, the one it first resolved it (a new
scan, in a scope of its own, sees a symlink changed since).  Not kept, so
walked afresh: a prefix that resolves to a file, one whose resolution met a
folder with an unreadable ACL or made more than `ENTRY_STEPS` checks, one
below a prefix not kept.  Descriptors: one per kept folder (a folder let go
on the way is kept as `Seen`, without one), `SCOPE_FOLDERS` at most, all
closed as the scope ends."""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import NamedTuple

from .access import ACL, read_acl


def proc_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


class Node:
    """What a walk holds: an O_PATH descriptor, the status read from it and
    its access ACL, read at most once, and its `path` as resolved (no
    symlink in it); a `Scope`'s folder (`kept`) is the scope's to close, any
    other the holder's (`release`).  A kept one is what the prefix `key` (as
    written) resolves to, from the kept folder `up` of the prefix one
    component shorter by `steps` (the checks made on the way), with `links`
    symlinks met from "/"; every name its `steps` look up lies outside the
    keep-out mounts `clear` (as last tested)."""

    __slots__ = ("fd", "st", "path", "up", "kept", "depth", "key", "steps", "links", "clear", "_acl")

    def __init__(self, fd: int, st: os.stat_result, path: str):
        self.fd, self.st, self.path = fd, st, path
        self.up: Node | None = None
        self.kept, self.depth, self.key, self.links = False, 1, path, 0
        self.steps: tuple[Step, ...] = ()
        self.clear: tuple[str, ...] | None = None  # None: not tested yet
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


class Seen:
    """A folder a walk searched and let go (on the way through a symlink):
    its path, status and access ACL as read then (BadACL, from making one,
    where that ACL is unreadable)."""

    __slots__ = ("path", "st", "_acl")

    def __init__(self, node: Node):
        self.path, self.st, self._acl = node.path, node.st, node.acl()

    def acl(self) -> ACL | None:
        return self._acl


class Lookup(NamedTuple):
    """A name looked up: `there`, its path (tested against the keep-out
    mounts), in `folder` (searched), the kept folder it started from or one `Seen`."""

    there: str
    folder: Node | Seen


class Link(NamedTuple):
    """A symlink met: the rest of the path then was `base` joined with
    `pending` (its target, and what was left of the symlinks met before
    it), then the components of the walk's path after the prefix."""

    base: str
    pending: tuple[str, ...]


Step = Lookup | Link

SCOPE_FOLDERS = 64  # descriptors a scope keeps at most
ENTRY_STEPS = 128  # checks a kept folder's resolution holds at most, names a symlink's rest pends (more: not kept)


class Scope:
    """The folders one thread's walks resolved, by the path prefix as written
    (`Node.key`), held with their status and ACL as first read: `bound` at
    most, the least recently walked through let go first (a folder is used
    before, so let go after, every folder below it: those above a kept one
    are kept, and so is every folder a kept one's `steps` name)."""

    def __init__(self, bound: int):
        self.bound = bound
        self.folders: OrderedDict[str, Node] = OrderedDict()

    def deepest(self, path: str) -> Node | None:
        """The folder kept of the longest prefix of `path` (absolute, normalised, as written)."""
        while True:
            node = self.folders.get(path)
            if node is not None:
                self._used(node)
                return node
            if path == "/":
                return None
            path = path[: path.rindex("/")] or "/"

    def keep(self, node: Node, up: Node | None, key: str, steps: tuple[Step, ...], links: int) -> None:
        """Keep folder `node` as what prefix `key` resolves to, reached from the
        kept folder `up` (None: `key` is "/") by `steps`, `links` symlinks met
        from "/"; unless it lies `bound` folders deep.  Its descriptor is then the scope's."""
        depth = 1 if up is None else up.depth + 1
        if depth >= self.bound:
            return
        node.up, node.depth, node.key, node.steps, node.links, node.kept = up, depth, key, steps, links, True
        try:
            self.folders[key] = node
        except BaseException:
            node.kept = False
            raise
        self._used(node)
        while len(self.folders) > self.bound:  # (never a folder of `node`'s chain: all newer)
            os.close(self.folders.popitem(last=False)[1].fd)

    def _used(self, node: Node | None) -> None:
        while node is not None:  # (the folders above it last: used more recently)
            self.folders.move_to_end(node.key)
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
    the prefixes of their paths resolve to (through symlinks too): a walk
    starts from the deepest such folder of its path, making every check a
    walk from "/" makes (the keep-out mount; search permission and ACL for a
    `Caller`, recorded by a `Recorder`; the count of symlinks; the hang
    guard for a symlink onto another mount) on the status and ACL first read
    of each folder on the way, and `status` of such a folder is that status.  So a scan sees each folder
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
