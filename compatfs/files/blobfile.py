"""Store files read one way: `BlobFile`, one open store file (opened by
`lookup.open_regular`: never blocking, only regular files, never through the
daemon's own mount), every read checked against the identity the file had
when it was opened.

Everything compatfs reads out of a store (blobs, manifests, params layers)
comes through here.  `BlobFile` reads exactly the bytes asked for or raises.
Bytes that go on to be cached elsewhere (a view's blob ranges, which the
kernel keeps as the mount's own file) are read with O_DIRECT from a file the
page cache does not mostly hold already (`read_once_into`): a model read
through the mount is then cached once, not twice.  The lookups' names other
layers import from here (`status`, `identity`, `Denied`, ...) are
`lookup`'s.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from pathlib import Path
from typing import Protocol, TypeVar, cast
from collections.abc import Callable, Hashable

from .access import READ, SEARCH, Caller
from ..errors import GGUFError
from .libc import cached_pages, pages, written_by_others
from .lookup import (
    KEEP_OUT_ENV,
    OPEN_FLAGS,
    TRANSIENT_ERRNOS,
    Denied,
    Stamp,
    Transient,
    failure,
    identity,
    is_folder,
    keep_out,
    open_regular,
    proc_path,
    require,
    resolved,
    status,
    statuses,
    transient,
    unchanged,
)
from .scratch import scratch
from .watch import Followed, contents

__all__ = [
    "ALIGN",
    "DIRECT_MIN",
    "blocks_for",
    "KEEP_OUT_ENV",
    "TRANSIENT_ERRNOS",
    "BlobFile",
    "Denied",
    "Stamp",
    "Transient",
    "identity",
    "is_folder",
    "keep_out",
    "read_small",
    "resolved",
    "status",
    "statuses",
    "transient",
    "unchanged",
]

_DIRECT_FLAGS = OPEN_FLAGS | os.O_DIRECT


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)

ALIGN = 4096  # O_DIRECT offsets, sizes and buffers: whole 4 KiB blocks
DIRECT_MIN = 64 << 10  # shorter reads go through the page cache
_BOUNCE = (1 << 20) + 2 * ALIGN  # the aligned buffer an O_DIRECT read goes through
EXPLAINED_WITHIN = 0.05  # seconds a followed file's moved change time waits for the event that tells why


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
    write of its bytes does not, whatever was done to its times or links.
    It owns what was made for it (`owned`: the reads it computes ahead),
    closed with it by `close`, as its descriptors are."""

    def __init__(
        self, path: str | os.PathLike, expect: Stamp | None = None, caller: Caller | None = None, follow: bool = False
    ):
        self.path = Path(path)
        self.fd, st = open_regular(path, caller)
        self.stamp = identity(st)
        self._seen = (self.stamp, st.st_nlink)  # the identity and link count it was last found intact with
        self._direct: int | None = None  # the O_DIRECT descriptor: None not opened yet, -1 none to be had
        self._refused = False  # its reads failed: kept open until `close`, no longer read
        self._followed: Followed | None = None
        self._owned: dict[Hashable, Closable] = {}
        self._owned_lock = threading.Lock()
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

    def __enter__(self) -> BlobFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def owned(self, key: Hashable, make: Callable[[], C]) -> C:
        """What was made for this open file under `key` (by `make`, on the
        first ask): closed, first, when this file is (`close`); made and
        closed at once once this file is closed."""
        with self._owned_lock:
            made = self._owned.get(key)
            if made is None:
                made = make()
                if self.fd >= 0:
                    self._owned[key] = made
                else:
                    made.close()
        return cast(C, made)  # (made by `make` for this key)

    def close(self) -> None:
        """Close what it owns (`owned`), its descriptors, and stop following it."""
        with self._owned_lock:
            owned, self._owned = list(self._owned.values()), {}
        for made in owned:
            made.close()
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

    def duplicate(self) -> BlobFile:
        """Another descriptor of this very file (removed from its folder or
        not), judged as this one is."""
        again = object.__new__(BlobFile)
        try:
            again.fd = os.dup(self.fd)
        except OSError as e:
            raise failure(self.path, "open", e) from None
        again.path, again.stamp, again._seen = self.path, self.stamp, self._seen
        again._direct, again._refused, again._followed = None, False, self._followed
        again._owned, again._owned_lock = {}, threading.Lock()
        watch = contents() if self._followed is not None else None
        if watch is not None and self._followed is not None:
            watch.share(self._followed)
        return again

    def allow(self, caller: Caller) -> None:
        """Denied unless `caller` may search the folders that lead to the
        file's path now and read this file (a `duplicate` is checked so)."""
        try:
            status(self.path.parent, caller, SEARCH)
            require(caller, self.fd, os.fstat(self.fd), READ, str(self.path))
        except Denied:
            raise
        except OSError as e:
            raise failure(self.path, "open", e) from None

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
        if not followed.touched:  # what moved it may not have been reported yet
            watch.news(followed, EXPLAINED_WITHIN)
            if followed.written or followed.lost or not followed.touched:
                return False
        if written_by_others(self.fd) is not False:
            return False
        now = watch.settle(followed, self.fd)  # every change reported so far is in its change time
        return now is not None and identity(now)[:4] == identity(st)[:4]

    def check(self) -> None:
        """GGUFError when the file was truncated or rewritten since it was opened."""
        if not self.intact():
            raise GGUFError(f"{self.path}: the file changed since it was opened (size, modification or change time)")

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
            raise failure(self.path, "read", e) from None

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
                self._bounced(fd, out[: lo - offset], offset)
                done = lo - offset
                self._read_direct(fd, out[done : hi - offset], lo, hi - lo, offset + size)
                done = hi - offset
            self._bounced(fd, out[done:], offset + done)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise failure(self.path, "read", e) from None
            self._refused = True  # the filesystem refuses these reads: the page cache from now on
            self.read_into(out[done:], offset + done)

    def read_once_in_blocks(self, buf: memoryview, offset: int, size: int) -> memoryview:
        """`size` bytes at `offset`, read as `read_once_into` reads them,
        into `buf` (page-aligned, at least `blocks_for(offset, size)` bytes)
        at `offset % ALIGN`, as they lie in the blob: with O_DIRECT, the
        whole blocks they lie in are read straight into `buf` in one go (no
        separate reads of the blocks cut at either end); returns the part of
        `buf` that holds them."""
        skip = offset % ALIGN
        if len(buf) < blocks_for(offset, size) or ctypes.addressof(ctypes.c_char.from_buffer(buf)) % ALIGN:
            raise ValueError(f"a buffer of {len(buf)} bytes, not page-aligned or short of {size} bytes at {offset}")
        fd = self._direct_fd() if size >= DIRECT_MIN else -1
        if fd < 0:
            self.read_into(buf[skip : skip + size], offset)
            return buf[skip : skip + size]
        try:
            self._read_direct(fd, buf[: blocks_for(offset, size)], offset - skip, skip + size, offset + size)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise failure(self.path, "read", e) from None
            self._refused = True  # the filesystem refuses these reads: the page cache from now on
            self.read_into(buf[skip : skip + size], offset)
        return buf[skip : skip + size]

    def _read_direct(self, fd: int, out: memoryview, offset: int, need: int, end: int) -> None:
        """Bytes at block-aligned `offset` straight into `out` (page-aligned,
        whole blocks) through the O_DIRECT descriptor `fd`, until at least
        `need` are in (the file may end inside its last block); the read
        wanted bytes up to `end` (the error says so where the file ends first)."""
        done = 0
        while done < need:
            got = os.preadv(fd, [out[done:]], offset + done)
            if got <= 0:
                raise self._ended(offset + done, end)
            done += got

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
                ctypes.memmove(target + done, source + skip, got)  # (ctypes lets go of the GIL meanwhile)
                done += got

    def settled(self) -> tuple[int, int, Stamp, int] | None:
        """What reading its bytes as `read_once_into` does takes, where
        nothing reported of the file is left to judge: its descriptor, the
        O_DIRECT one (-1: none; `reads_directly` decided here where no read
        has decided it yet, as the first would), the identity its status
        must keep (change time included), and the inotify descriptor whose
        events are news of it (-1: not followed).  None once a change of it
        was reported, or for a file closed."""
        if self.fd < 0:
            return None
        followed = self._followed
        if followed is None:
            return self.fd, self._direct_fd(), self._seen[0], -1
        watch = contents()
        if watch is None or followed.written or followed.touched or followed.lost:
            return None
        return self.fd, self._direct_fd(), (*self.stamp[:4], followed.ctime), watch.fd

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
            direct = os.open(proc_path(self.fd), _DIRECT_FLAGS)
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


def blocks_for(offset: int, size: int) -> int:
    """Bytes of the whole `ALIGN` blocks that bytes [offset, offset + size) lie in."""
    return -(-(offset % ALIGN + size) // ALIGN) * ALIGN
