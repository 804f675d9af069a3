"""Store files opened and read one way: never blocking, only regular files,
never through the daemon's own mount, every read checked against the
identity the file had when it was opened.

Everything compatfs reads out of a store (blobs, manifests, params layers)
comes through here.  A path is resolved by walking it one component at a
time from the root, each relative to the folder descriptor before it and
never following a symlink implicitly (symlinks are read and resolved here,
at most 40): so the folders traversed are known exactly, a path that leads
into a mount compatfs serves (`keep_out`) is refused before anything in it is
looked up, one a symlink leads onto another mount whose lookups hang fails
in bounded time (`probe`), and with a `Caller` each folder must grant it search permission
(mode bits and ACL, on the folder's descriptor).  The last component is held
by an O_PATH descriptor (nothing is opened yet: no device or FIFO is ever
opened); only a regular file is then opened, without blocking, from that very
descriptor, and a caller must be allowed to read the opened file.
`BlobFile` is one open file, its descriptor and identity, and reads exactly
the bytes asked for or raises.  Bytes that go on to be cached elsewhere (a
view's blob ranges, which the kernel keeps as the mount's own file) are read
with O_DIRECT from a file the page cache does not mostly hold already
(`read_once_into`): a model read through the mount is then cached once, not
twice.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import stat
import threading
from pathlib import Path

from .access import READ, SEARCH, BadACL, Caller, read_acl
from ..errors import GGUFError
from .libc import cached_pages, pages, written_by_others
from .probe import leaves, reach
from .scratch import scratch
from .watch import Followed, contents

Stamp = tuple[int, int, int, int, int]   # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns

_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_DIRECT_FLAGS = _OPEN_FLAGS | os.O_DIRECT
_MAX_LINKS = 40                          # the kernel's own limit
ALIGN = 4096                             # O_DIRECT offsets, sizes and buffers: whole 4 KiB blocks
DIRECT_MIN = 64 << 10                    # shorter reads go through the page cache
_BOUNCE = (1 << 20) + 2 * ALIGN          # the aligned buffer an O_DIRECT read goes through
KEEP_OUT_ENV = "COMPATFS_KEEP_OUT"       # mounts never looked into, a JSON list (inherited by workers)
EXPLAINED_WITHIN = 0.05                  # seconds a followed file's moved change time waits for the event that tells why


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
TRANSIENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EIO, errno.EAGAIN,
                              errno.EINTR})


class Transient(GGUFError):
    """A store file could not be opened or read just now for a fault of the
    system (`TRANSIENT_ERRNOS`, or memory running out): nothing is known of
    its bytes, and the same request may succeed next time."""


def _failed(path: str | os.PathLike, doing: str, e: OSError) -> GGUFError:
    """The error naming `path` of an OSError met while `doing` it (open, read):
    Transient for a fault of the system, GGUFError otherwise."""
    kind = Transient if e.errno in TRANSIENT_ERRNOS else GGUFError
    return kind(f"{path}: cannot {doing}: {e.strerror}")


def transient(e: BaseException | None) -> bool:
    """Whether `e` is a fault of the system rather than a verdict on a
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


def _proc(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def _require(caller: Caller, fd: int, st: os.stat_result, bit: int, where: str) -> None:
    """Denied unless `caller` has permission `bit` on the file `fd` holds."""
    if caller.uid == 0:
        return
    try:
        allowed = caller.may(st, read_acl(_proc(fd)), bit)
    except BadACL as e:
        raise Denied(f"{where}: its access ACL is unreadable ({e}): refused") from None
    if not allowed:
        raise Denied(f"{where}: uid {caller.uid} may not {'read' if bit == READ else 'search'} it")


def _inside_mount(path: str, kept: tuple[str, ...]) -> str | None:
    return next((m for m in kept if path == m or path.startswith(m.rstrip("/") + "/")), None)


def _walk(path: str | os.PathLike, caller: Caller | None) -> int:
    """An O_PATH descriptor of what `path` resolves to (never a symlink);
    OSError as the kernel's lookup would fail, Denied when `caller` lacks
    search permission on a folder on the way.  A symlink that leads onto
    another mount than `path` starts on is looked up first by `probe.reach`
    (ETIMEDOUT where that lookup hangs)."""
    start = os.path.abspath(os.fspath(path))
    todo = start.split("/")[::-1]   # components still to resolve, next last
    here, fd = "/", os.open("/", _PATH_FLAGS)
    links, kept = 0, _kept_out()
    try:
        st = os.fstat(fd)
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            there = os.path.dirname(here) if name == ".." else os.path.join(here, name)
            mount = _inside_mount(there, kept)
            if mount is not None:
                raise OSError(errno.ELOOP, f"it leads into {mount}, compatfs's own mount")
            if not stat.S_ISDIR(st.st_mode):
                raise OSError(errno.ENOTDIR, f"{here} is not a folder")
            if caller is not None:
                _require(caller, fd, st, SEARCH, here)
            child = os.open(name, _PATH_FLAGS, dir_fd=fd)
            try:
                cst = os.fstat(child)
                target = os.readlink("", dir_fd=child) if stat.S_ISLNK(cst.st_mode) else None
            except BaseException:
                os.close(child)
                raise
            if target is None:
                os.close(fd)
                fd, here, st = child, there, cst
                continue
            os.close(child)
            links += 1
            if links > _MAX_LINKS:
                raise OSError(errno.ELOOP, "too many levels of symbolic links")
            todo.extend(target.split("/")[::-1])
            rest = os.path.normpath(os.path.join("/" if target.startswith("/") else here, *todo[::-1]))
            elsewhere = leaves(start, rest)
            if elsewhere is not None and _inside_mount(rest, kept) is None:
                reach(rest, elsewhere)       # (ETIMEDOUT where a lookup there hangs)
            if target.startswith("/"):
                os.close(fd)
                fd = -1
                here, fd = "/", os.open("/", _PATH_FLAGS)
                st = os.fstat(fd)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return fd


def status(path: str | os.PathLike, caller: Caller | None = None, need: int = 0) -> os.stat_result:
    """The status of what `path` resolves to (through symlinks, as resolved
    here; nothing is opened); with `caller`: Denied unless it may search every
    folder on the way and has permission `need` (READ, SEARCH) on the file.
    OSError otherwise, as a lookup would fail."""
    fd = _walk(path, caller)
    try:
        st = os.fstat(fd)
        if caller is not None and need:
            _require(caller, fd, st, need, str(path))
        return st
    finally:
        os.close(fd)


def resolved(path: str | os.PathLike) -> int:
    """An O_PATH descriptor (the caller's to close) of what `path` resolves
    to, as `status` resolves it (never into compatfs's own mount); OSError
    as the lookup fails."""
    return _walk(path, None)


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
    walked, opened again by path (and used only when that is the folder the
    walk reached), and each file's own status read in it, never through a
    symlink; a symlink, or a file whose status cannot be read so, is walked
    on its own."""
    by_folder: dict[Path, list[Path]] = {}
    for f in files:
        by_folder.setdefault(f.parent, []).append(f)
    out: dict[Path, os.stat_result | OSError] = {}
    for folder, inside in by_folder.items():
        fd = -1
        if len(inside) > 1:
            try:
                walked = status(folder)
                fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                here = os.fstat(fd)
                if (here.st_dev, here.st_ino) != (walked.st_dev, walked.st_ino):
                    os.close(fd)
                    fd = -1
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
    path otherwise (Transient for a fault of the system)."""
    try:
        pfd = _walk(path, caller)
    except Denied:
        raise
    except OSError as e:
        raise _failed(path, "open", e) from None
    try:
        if not stat.S_ISREG(os.fstat(pfd).st_mode):
            raise GGUFError(f"{path}: not a regular file")
        fd = os.open(_proc(pfd), _OPEN_FLAGS)
    except OSError as e:
        raise _failed(path, "open", e) from None
    finally:
        os.close(pfd)
    try:
        st = os.fstat(fd)
        if caller is not None:
            _require(caller, fd, st, READ, str(path))
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError) and not isinstance(e, Denied):
            raise _failed(path, "read", e) from None
        raise
    return fd, st


def read_small(path: str | os.PathLike, limit: int) -> bytes:
    """The whole of a small store file (a manifest, a params layer); GGUFError
    when it is not a regular file or larger than `limit` bytes."""
    with BlobFile(path) as f:
        if f.stamp[2] > limit:
            raise GGUFError(f"{path}: {f.stamp[2]} bytes, more than the {limit} such a file may have")
        return bytes(f.read(0, f.stamp[2]))


class BlobFile:
    """One open store file: its descriptor and the identity it had when
    opened (`expect`: the identity it must have, else GGUFError; `caller`:
    who must be allowed to read it, else Denied; see `open_regular`).
    Whether it still holds those bytes is judged by `unchanged` against its
    link count at open: a name of it removed meanwhile leaves it intact.
    With `follow` (a file kept open to serve reads) it is judged instead by
    what the kernel reports of it (`files.watch.Contents`): a change of its
    metadata alone (mode, owner, ACL, links, xattrs) leaves it intact, any
    write of its bytes does not, whatever was done to its times or links."""

    def __init__(self, path: str | os.PathLike, expect: Stamp | None = None, caller: Caller | None = None,
                 follow: bool = False):
        self.path = Path(path)
        self.fd, st = open_regular(path, caller)
        self.stamp = identity(st)
        self._seen = (self.stamp, st.st_nlink)   # the identity and link count it was last found intact with
        self._direct: int | None = None      # the O_DIRECT descriptor: None not opened yet, -1 none to be had
        self._refused = False                # its reads failed: kept open until `close`, no longer read
        self._followed: Followed | None = None
        if follow:
            self._follow(st)
        if expect is not None and not unchanged(expect, None, st):
            self.close()
            raise GGUFError(f"{path}: the file changed since it was read")

    def _follow(self, st: os.stat_result) -> None:
        """Have the kernel's events judge the file from now on (where inotify
        follows it); a change between the open and that is a change."""
        watch = contents()
        followed = watch.follow(self.fd, st.st_ctime_ns) if watch is not None else None
        if followed is None:
            return
        self._followed = followed
        try:
            now = os.fstat(self.fd)
        except OSError:
            now = None
        if now is None or identity(now) != self.stamp:
            followed.written = True

    def __enter__(self) -> "BlobFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._direct is not None and self._direct >= 0:
            os.close(self._direct)
        self._direct = -1
        followed, self._followed = self._followed, None
        watch = contents() if followed is not None else None
        if watch is not None and followed is not None:
            watch.unfollow(followed)

    def duplicate(self) -> "BlobFile":
        """Another descriptor of this very file (removed from its folder or
        not), judged as this one is."""
        again = object.__new__(BlobFile)
        try:
            again.fd = os.dup(self.fd)
        except OSError as e:
            raise _failed(self.path, "open", e) from None
        again.path, again.stamp, again._seen = self.path, self.stamp, self._seen
        again._direct, again._refused, again._followed = None, False, self._followed
        watch = contents() if self._followed is not None else None
        if watch is not None and self._followed is not None:
            watch.share(self._followed)
        return again

    def allow(self, caller: Caller) -> None:
        """Denied unless `caller` may search the folders that lead to the
        file's path now and read this file (a `duplicate` is checked so)."""
        try:
            status(self.path.parent, caller, SEARCH)
            _require(caller, self.fd, os.fstat(self.fd), READ, str(self.path))
        except Denied:
            raise
        except OSError as e:
            raise _failed(self.path, "open", e) from None

    def intact(self, st: os.stat_result | None = None) -> bool:
        """Whether the file still holds the bytes it was opened with, judged
        on its status `st` (default: taken now from its descriptor): its
        device, inode, size and modification time as at open, and then, for
        a followed file, `_same_bytes`; otherwise by `unchanged`: a change
        time moved by a name removed is accepted once, from then on the file
        must keep that change time and link count, or lose another name."""
        if st is None:
            try:
                st = os.fstat(self.fd)
            except OSError:
                return False
        stamp, links = self._seen
        if self._followed is not None:
            return identity(st)[:4] == tuple(stamp[:4]) and self._same_bytes(self._followed, st)
        if not unchanged(stamp, links, st):
            return False
        if st.st_ctime_ns != stamp[4]:
            self._seen = (identity(st), st.st_nlink)
        return True

    def _same_bytes(self, followed: Followed, st: os.stat_result) -> bool:
        """Whether a followed file of unchanged size and modification time
        (status `st`) holds the bytes it was opened with: never once the
        kernel reported a write of it; otherwise a change time that moved
        is accepted where the kernel reported a change of metadata and
        nothing may write the file now (a writable mapping writes unseen:
        `written_by_others`); and so where events may be missing."""
        watch = contents()
        if watch is None:
            return False
        watch.news(followed)
        if followed.written:
            return False
        if st.st_ctime_ns == followed.ctime:
            return True
        if followed.lost:
            return False
        if not followed.touched:     # what moved it may not have been reported yet
            watch.news(followed, EXPLAINED_WITHIN)
            if followed.written or followed.lost or not followed.touched:
                return False
        if written_by_others(self.fd) is not False:
            return False
        now = watch.settle(followed, self.fd)     # every change reported so far is in its change time
        return now is not None and identity(now)[:4] == identity(st)[:4]

    def check(self) -> None:
        """GGUFError when the file was truncated or rewritten since it was opened."""
        if not self.intact():
            raise GGUFError(f"{self.path}: the file changed since it was opened (size, modification or "
                            "change time)")

    def read_into(self, out: memoryview, offset: int) -> None:
        """Exactly len(out) bytes at `offset` into `out`; GGUFError when the
        file ends first or cannot be read."""
        done, size = 0, len(out)
        try:
            while done < size:
                n = os.preadv(self.fd, [out[done:]], offset + done)
                if n == 0:
                    raise self._ended(offset + done, offset + size)
                done += n
        except OSError as e:
            raise _failed(self.path, "read", e) from None

    def _ended(self, at: int, end: int) -> GGUFError:
        """The error of a read that wanted bytes up to `end` and found the file ending at `at`."""
        return GGUFError(f"{self.path}: ends at {at}, before {end} (truncated?)")

    def read_once_into(self, out: memoryview, offset: int) -> None:
        """As `read_into`, for bytes read to be cached elsewhere and not read
        again from this file: read with O_DIRECT (neither cached a second
        time nor copied out of freshly filled pages) where this file
        `reads_directly`; otherwise, and for reads under `DIRECT_MIN`,
        through the page cache.  Where `out` lies as the file does (its
        address and `offset` alike modulo `ALIGN`: a reply buffer of a view
        served as the blob is), the whole blocks are read straight into it;
        the rest through an aligned buffer, copied out with the GIL released."""
        size = len(out)
        fd = self._direct_fd() if size >= DIRECT_MIN else -1
        if fd < 0:
            return self.read_into(out, offset)
        done = 0
        try:
            address = ctypes.addressof(ctypes.c_char.from_buffer(out))
            lo, hi = -(-offset // ALIGN) * ALIGN, (offset + size) // ALIGN * ALIGN
            if (address - offset) % ALIGN == 0 and hi - lo >= DIRECT_MIN:
                self._bounced(fd, out[:lo - offset], offset)
                done = lo - offset
                while done < hi - offset:
                    got = os.preadv(fd, [out[done:hi - offset]], offset + done)
                    if got <= 0:
                        raise self._ended(offset + done, offset + size)
                    done += got
            self._bounced(fd, out[done:], offset + done)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise _failed(self.path, "read", e) from None
            self._refused = True         # the filesystem refuses these reads: the page cache from now on
            self.read_into(out[done:], offset + done)

    def _bounced(self, fd: int, out: memoryview, offset: int) -> None:
        """Bytes at `offset` into `out` through the O_DIRECT descriptor `fd`,
        read a whole aligned buffer at a time and copied out of it."""
        size = len(out)
        if not size:
            return
        done = 0
        with scratch(_BOUNCE) as bounce:
            buf, source = bounce.data, bounce.ctypes.data
            target = ctypes.addressof(ctypes.c_char.from_buffer(out))
            while done < size:
                at = offset + done
                start = at - at % ALIGN
                skip = at - start
                want = min(len(buf), -(-(skip + size - done) // ALIGN) * ALIGN)
                got = min(os.preadv(fd, [buf[:want]], start) - skip, size - done)
                if got <= 0:
                    raise self._ended(at, offset + size)
                ctypes.memmove(target + done, source + skip, got)    # (ctypes lets go of the GIL meanwhile)
                done += got

    @property
    def reads_directly(self) -> bool:
        """Whether `read_once_into` reads this file with O_DIRECT: decided on
        first use, when the page cache held fewer than half of its pages (a
        file mostly cached, as one a model server has just used, is read
        from there), the kernel could tell (`cached_pages`) and the
        filesystem gave an O_DIRECT descriptor.  Decided once: reads through
        the page cache fill it a large folio at a time, so what it holds
        after one would speak of that read, not of the file's use."""
        return self._direct_fd() >= 0

    def _direct_fd(self) -> int:
        """The O_DIRECT descriptor `reads_directly` decides on, opened from
        the open descriptor (the same file, wherever its path leads now); -1
        where there is none."""
        if self._direct is None:
            with _DIRECT_OPENING:
                if self._direct is None:
                    cached = cached_pages(self.fd, 0, self.stamp[2])
                    cold = cached is not None and 2 * cached < pages(0, self.stamp[2])
                    self._direct = self._reopen_direct() if cold else -1
        return -1 if self._refused else self._direct

    def _reopen_direct(self) -> int:
        """An O_DIRECT descriptor of the file the open descriptor holds, or -1
        where its filesystem refuses one (or the file reopened is not this
        one, holding the same bytes: `intact`)."""
        try:
            direct = os.open(_proc(self.fd), _DIRECT_FLAGS)
        except OSError:
            return -1
        try:
            same = self.intact(os.fstat(direct))
        except OSError:
            same = False
        if not same:
            os.close(direct)
            return -1
        return direct

    def read(self, offset: int, size: int) -> bytearray:
        """Exactly `size` bytes at `offset`."""
        buf = bytearray(size)
        self.read_into(memoryview(buf), offset)
        return buf


_DIRECT_OPENING = threading.Lock()
