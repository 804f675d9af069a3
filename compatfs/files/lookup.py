"""Store paths looked up one way: never following a symlink implicitly,
never into the daemon's own mount, never without bound, and opened only as
regular files, without blocking.

A path is resolved by walking it one component at a time from the root,
each relative to the folder descriptor before it (symlinks are read and
resolved here, at most 40): so the folders traversed are known exactly, a
path that leads into a mount compatfs serves (`keep_out`) is refused before
anything in it is looked up, one a symlink leads onto another mount whose
lookups hang fails in bounded time (`probe`), and with a `Caller` each folder
must grant it search permission (mode bits and ACL, on the folder's
descriptor).  The last component is held by an O_PATH descriptor (nothing is
opened yet: no device or FIFO is ever opened); only a regular file is then
opened, without blocking, from that very descriptor (`open_regular`), and a
caller must be allowed to read the opened file.  A scan's walks share the
folders their paths' prefixes resolve to (`walkscope.scope`).  What
identifies a file's bytes (`identity`, `unchanged`) and what a refusal
(`Denied`) or a transient fault (`Transient`: out of descriptors or memory,
an I/O error, saying nothing of the file) is are defined here too.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

from .access import ACL, READ, SEARCH, BadACL, Caller, read_acl
from ..errors import GGUFError
from .probe import leaves, reach
from .walkscope import ENTRY_STEPS, Link, Lookup, Node, Scope, Seen, Step, current, proc_path

Stamp = tuple[int, int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns

OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40  # the kernel's own limit
KEEP_OUT_ENV = "COMPATFS_KEEP_OUT"  # mounts never looked into, a JSON list (inherited by workers)


class Denied(PermissionError):
    """The caller may not reach or read the file: a refusal (EACCES), not a
    verdict on the file's bytes; its text names the file."""

    def __init__(self, message: str):
        super().__init__(errno.EACCES, message)

    def __str__(self) -> str:
        return str(self.strerror)


def keep_out(mountpoint: str | os.PathLike) -> None:
    """Never look inside `mountpoint` (a mount this process serves): a request
    to it from the process answering it could wait forever.  Call before it
    is mounted (its real path is taken then).  Kept in the environment, so
    that the processes this one starts (indexing workers) keep out too."""
    kept = [*_kept_out(), os.path.realpath(mountpoint)]
    os.environ[KEEP_OUT_ENV] = json.dumps(list(dict.fromkeys(kept)))


def _kept_out() -> tuple[str, ...]:
    return _parse_kept(os.environ.get(KEEP_OUT_ENV) or "[]")


@functools.lru_cache(maxsize=4)
def _parse_kept(raw: str) -> tuple[str, ...]:
    """The mounts of a `KEEP_OUT_ENV` value (parsed once per value: every walk reads it)."""
    try:
        kept = json.loads(raw)
    except ValueError:
        return ()
    return tuple(m for m in kept if isinstance(m, str)) if isinstance(kept, list) else ()


def identity(st: os.stat_result) -> Stamp:
    """What identifies a file's bytes: device, inode, size, modification and
    change time (a rewrite that restores the mtime still moves the ctime,
    which cannot be set back)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def unchanged(stamp: Stamp, links: int | None, st: os.stat_result) -> bool:
    """The one rule for whether a file that had identity `stamp` and `links`
    links (None: not known) still holds the same bytes, judged by its status
    `st` now: the same device, inode, size and modification time, and the
    same change time unless its link count went down meanwhile (removing a
    name of it, as `ollama rm` does, moves the change time and nothing else).
    A link added, or a rewrite that restores the mtime, is a change."""
    now = identity(st)
    return now[:4] == tuple(stamp[:4]) and (now[4] == stamp[4] or (links is not None and st.st_nlink < links))


# A failed open or read with one of these says nothing of the file: the
# system is out of descriptors or memory, or its device failed this once.
TRANSIENT_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EIO, errno.EAGAIN, errno.EINTR}
)


class Transient(GGUFError):
    """A store file could not be opened or read just now for a transient
    fault (`TRANSIENT_ERRNOS`, or memory running out): nothing is known of
    its bytes, and the same request may succeed next time."""


def failure(path: str | os.PathLike, doing: str, e: OSError) -> GGUFError:
    """The error naming `path` of an OSError met while `doing` it (open, read):
    Transient for a transient fault, GGUFError otherwise."""
    kind = Transient if e.errno in TRANSIENT_ERRNOS else GGUFError
    return kind(f"{path}: cannot {doing}: {e.strerror}")


def transient(e: BaseException | None) -> bool:
    """Whether `e` is a transient fault (the system out of descriptors or
    memory, a device failing this once) rather than a verdict on a
    file's bytes: a Transient, a MemoryError or an OSError of
    `TRANSIENT_ERRNOS`; so is one raised from or while handling such a fault
    (an error reworded on its way up, even `from None`, keeps it as its
    context)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, (Transient, MemoryError)) or (isinstance(e, OSError) and e.errno in TRANSIENT_ERRNOS):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def require(caller: Caller, fd: int, st: os.stat_result, bit: int, where: str) -> None:
    """Denied unless `caller` has permission `bit` on the file `fd` holds."""
    _require(caller, st, lambda: read_acl(proc_path(fd)), bit, where)


def _require(caller: Caller, st: os.stat_result, acl: Callable[[], ACL | None], bit: int, where: str) -> None:
    """Denied unless `caller` has permission `bit` on a file of status `st`
    whose access ACL `acl` reads (read only for a caller other than root)."""
    if caller.uid == 0:
        return
    try:
        allowed = caller.may(st, acl(), bit)
    except BadACL as e:
        raise Denied(f"{where}: its access ACL is unreadable ({e}): refused") from None
    if not allowed:
        raise Denied(f"{where}: uid {caller.uid} may not {'read' if bit == READ else 'search'} it")


def _inside_mount(path: str, kept: tuple[str, ...]) -> str | None:
    return next((m for m in kept if path == m or path.startswith(m.rstrip("/") + "/")), None)


def _root() -> Node:
    fd = os.open("/", _PATH_FLAGS)
    try:
        return Node(fd, os.fstat(fd), "/")
    except BaseException:
        os.close(fd)
        raise


def _look(there: str, folder: Node | Seen, caller: Caller | None, kept: tuple[str, ...]) -> None:
    """The checks before a name is looked up in `folder`, `there` its path:
    not into the keep-out mount, in a folder, which `caller` may search."""
    mount = _inside_mount(there, kept) if kept else None
    if mount is not None:
        raise OSError(errno.ELOOP, f"it leads into {mount}, compatfs's own mount")
    if not stat.S_ISDIR(folder.st.st_mode):
        raise OSError(errno.ENOTDIR, f"{folder.path} is not a folder")
    if caller is not None:
        _require(caller, folder.st, folder.acl, SEARCH, folder.path)


def _guard(start: str, rest: str, kept: tuple[str, ...]) -> None:
    """After a symlink, the rest of the path `rest` (normalised) to resolve
    from `start`: looked up first by `probe.reach` where it lies on another
    mount (ETIMEDOUT where a lookup there hangs), but never in the keep-out mount."""
    elsewhere = leaves(start, rest)
    if elsewhere is not None and _inside_mount(rest, kept) is None:
        reach(rest, elsewhere)


def _replay(node: Node, start: str, literal: str, caller: Caller | None, kept: tuple[str, ...]) -> None:
    """The checks the walks that reached kept folder `node` made from "/", in
    order, for a walk of `literal` (`start` as written): a symlink's rest of
    the path is this walk's; names are tested again only against keep-out
    mounts other than those they were last found clear of."""
    for entry in node.chain()[1:]:
        tested = () if entry.clear == kept else kept
        for step in entry.steps:
            if isinstance(step, Link):
                after = [c for c in literal[len(entry.key) :].split("/") if c]
                _guard(start, os.path.normpath(os.path.join(step.base, *step.pending, *after)), kept)
            else:
                _look(step.there, step.folder, caller, tested)
        entry.clear = kept


def _noted(steps: list[Step] | None, step: Step) -> list[Step] | None:
    """`steps` and then `step`; None (not to be kept) past `ENTRY_STEPS`
    checks, or for a symlink whose rest pends more names than that."""
    if steps is None or len(steps) >= ENTRY_STEPS or (isinstance(step, Link) and len(step.pending) > ENTRY_STEPS):
        return None
    steps.append(step)
    return steps


def _walk(path: str | os.PathLike, caller: Caller | None) -> Node:
    """What `path` resolves to (never a symlink), held by an O_PATH descriptor (to
    `release`); OSError as the kernel's lookup would fail, Denied when `caller` lacks
    search permission on a folder on the way.  A symlink that leads onto another mount
    than `path` starts on is looked up first by `probe.reach` (ETIMEDOUT where that
    lookup hangs).  In a `walkscope.scope`: from the folder it keeps of the longest
    prefix of `path`, keeping each folder a further prefix resolves to."""
    start = os.path.abspath(os.fspath(path))
    literal = "/" + start.lstrip("/")  # (abspath leaves a leading "//")
    kept = _kept_out()
    held: Scope | None = current()
    here = held.deepest(literal) if held is not None else None
    if here is None:
        here = _root()
        if held is not None:
            held.keep(here, None, "/", (), 0)
    else:
        _replay(here, start, literal, caller, kept)
    links, key, up = here.links, here.key, here
    todo = [c for c in literal[len(key) :].split("/") if c][::-1]  # components still to resolve, next last
    bottom = len(todo)  # those of them of `literal`: the others come from symlinks
    steps: list[Step] | None = None  # the checks resolving prefix `key`, while it may be kept
    try:
        while todo:
            name = todo.pop()
            if len(todo) < bottom:  # the next component of `literal`: recorded when `key` is kept
                steps = [] if held is not None and here.kept and here.key == key else None
                bottom, key, up = len(todo), os.path.join(key, name), here
            if name not in ("", "."):
                there = os.path.dirname(here.path) if name == ".." else os.path.join(here.path, name)
                _look(there, here, caller, kept)
                if steps is not None:
                    try:  # (a folder let go on the way: as read now, its ACL too)
                        steps = _noted(steps, Lookup(there, here if here.kept else Seen(here)))
                    except BadACL:
                        steps = None
                child = os.open(name, _PATH_FLAGS, dir_fd=here.fd)
                try:
                    cst = os.fstat(child)
                    link = stat.S_ISLNK(cst.st_mode)
                    target = os.readlink("", dir_fd=child) if link else ""
                    reached = None if link else Node(child, cst, there)
                except BaseException:
                    os.close(child)
                    raise
                if reached is not None:
                    left, here = here, reached
                    left.release()
                else:
                    os.close(child)
                    links += 1
                    if links > _MAX_LINKS:
                        raise OSError(errno.ELOOP, "too many levels of symbolic links")
                    todo.extend(target.split("/")[::-1])
                    base = "/" if target.startswith("/") else here.path
                    steps = _noted(steps, Link(base, tuple(todo[bottom:][::-1])))
                    _guard(start, os.path.normpath(os.path.join(base, *todo[::-1])), kept)
                    if target.startswith("/"):
                        left, here = here, _root()
                        left.release()
            if len(todo) == bottom and steps is not None:  # prefix `key` resolved
                if held is not None and stat.S_ISDIR(here.st.st_mode) and not here.kept:
                    held.keep(here, up, key, tuple(steps), links)
                steps = None
    except BaseException:
        here.release()
        raise
    return here


def status(path: str | os.PathLike, caller: Caller | None = None, need: int = 0) -> os.stat_result:
    """The status of what `path` resolves to (through symlinks, as resolved
    here; nothing is opened); with `caller`: Denied unless it may search every
    folder on the way and has permission `need` (READ, SEARCH) on the file.
    OSError otherwise, as a lookup would fail."""
    node = _walk(path, caller)
    try:
        if caller is not None and need:
            _require(caller, node.st, node.acl, need, str(path))
        return node.st
    finally:
        node.release()


def resolved(path: str | os.PathLike) -> int:
    """An O_PATH descriptor (the caller's to close) of what `path` resolves
    to, as `status` resolves it (never into compatfs's own mount); OSError
    as the lookup fails."""
    node = _walk(path, None)
    return os.dup(node.fd) if node.kept else node.fd


def is_folder(path: str | os.PathLike) -> bool:
    """Whether `path` resolves, as `status` resolves it, to a folder; a
    lookup that hung (ETIMEDOUT) is raised, naming the path."""
    try:
        return stat.S_ISDIR(status(path).st_mode)
    except OSError as e:
        if e.errno == errno.ETIMEDOUT:
            raise
        return False


def statuses(files: set[Path]) -> dict[Path, os.stat_result | OSError]:
    """The status of each of `files` as `status` resolves it (or
    why it cannot be had), with one walk per folder they are in: the folder is
    walked (`resolved`) and each file's own status read in the descriptor the
    walk reached, never through a symlink; a symlink, or a file whose status
    cannot be read so, is walked on its own."""
    by_folder: dict[Path, list[Path]] = {}
    for f in files:
        by_folder.setdefault(f.parent, []).append(f)
    out: dict[Path, os.stat_result | OSError] = {}
    for folder, inside in by_folder.items():
        fd = -1
        if len(inside) > 1:
            try:
                fd = resolved(folder)
            except OSError:
                fd = -1
        try:
            for f in inside:
                if fd >= 0:
                    try:
                        st = os.stat(f.name, dir_fd=fd, follow_symlinks=False)
                        if not stat.S_ISLNK(st.st_mode):
                            out[f] = st
                            continue
                    except OSError:
                        pass
                try:
                    out[f] = status(f)
                except OSError as e:
                    out[f] = e
        finally:
            if fd >= 0:
                os.close(fd)
    return out


def open_regular(path: str | os.PathLike, caller: Caller | None = None) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file at `path` and its status
    (taken from the descriptor); with `caller`: Denied unless it may search
    every folder on the way and read the opened file; GGUFError naming the
    path otherwise (Transient for a transient fault)."""
    try:
        node = _walk(path, caller)
    except Denied:
        raise
    except OSError as e:
        raise failure(path, "open", e) from None
    try:
        if not stat.S_ISREG(node.st.st_mode):
            raise GGUFError(f"{path}: not a regular file")
        fd = os.open(proc_path(node.fd), OPEN_FLAGS)
    except OSError as e:
        raise failure(path, "open", e) from None
    finally:
        node.release()
    try:
        st = os.fstat(fd)
        if caller is not None:
            require(caller, fd, st, READ, str(path))
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError) and not isinstance(e, Denied):
            raise failure(path, "read", e) from None
        raise
    return fd, st
