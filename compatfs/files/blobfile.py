"""Store files read one way: `BlobFile`, one open store file (opened by
`lookup.open_regular`: never blocking, only regular files, never through the
daemon's own mount), every read checked against the identity the file had
when it was opened.

Everything compatfs reads out of a store (blobs, manifests, params layers)
comes through here.  `BlobFile` reads exactly the bytes asked for or raises.
Bytes that go on to be cached elsewhere (a view's blob ranges, which the
kernel keeps as the mount's own file) are read through the page cache, with
the kernel's read-ahead, and from a file the page cache did not mostly hold
already its pages are given back behind the reads (`read_once_into`): a
model read through the mount is then cached once, not twice.  The lookups'
names other layers import from here (`status`, `identity`, `Denied`, ...)
are `lookup`'s.
"""

from __future__ import annotations

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
    TRANSIENT_ERRNOS,
    Denied,
    Stamp,
    Transient,
    failure,
    identity,
    is_folder,
    keep_out,
    open_regular,
    require,
    resolved,
    status,
    statuses,
    transient,
    unchanged,
)
from .watch import Followed, contents

__all__ = [
    "DROP_LAG",
    "DROP_UNIT",
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


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)

# A cold file's pages are given back once reads are this far past them (the kernel keeps up to 64 reads
# of 1 MiB of a mount's file in flight at once, which may come in any order)...
DROP_LAG = 64 << 20
# ... in whole blocks of this many bytes (the page cache holds a file's bytes in folios of up to 2 MiB
# here, and gives one back only where all of it is asked for).
DROP_UNIT = 8 << 20
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
    closed with it by `close`, as its descriptor is."""

    def __init__(
        self, path: str | os.PathLike, expect: Stamp | None = None, caller: Caller | None = None, follow: bool = False
    ):
        self.path = Path(path)
        self.fd, st = open_regular(path, caller)
        self.stamp = identity(st)
        self._seen = (self.stamp, st.st_nlink)  # the identity and link count it was last found intact with
        self._behind: bool | None = None  # whether reads drop behind (`drops_behind`): None not decided yet
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
        """Close what it owns (`owned`), its descriptor, and stop following it."""
        with self._owned_lock:
            owned, self._owned = list(self._owned.values()), {}
        for made in owned:
            made.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
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
        again._behind, again._followed = None, self._followed
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
        again from this file: where this file `drops_behind`, the reads have
        then `passed` those bytes."""
        self.read_into(out, offset)
        self.passed(offset, offset + len(out))

    def passed(self, offset: int, end: int) -> None:
        """Bytes [offset, end) were read to be cached elsewhere: where this
        file `drops_behind`, its pages are given back to the kernel in the
        whole `DROP_UNIT` blocks that end in [offset, end) moved `DROP_LAG`
        bytes back (reads that cover a stretch of the file between them give
        back each block once, `DROP_LAG` behind them)."""
        if not self.drops_behind:
            return
        start = max(0, offset - DROP_LAG) // DROP_UNIT * DROP_UNIT
        stop = max(0, end - DROP_LAG) // DROP_UNIT * DROP_UNIT
        if start < stop and self.fd >= 0:
            os.posix_fadvise(self.fd, start, stop - start, os.POSIX_FADV_DONTNEED)

    def settled(self) -> tuple[int, bool, Stamp, int] | None:
        """What reading its bytes as `read_once_into` does takes, where
        nothing reported of the file is left to judge: its descriptor,
        whether it `drops_behind` (decided here where no read has decided it
        yet, as the first would), the identity its status must keep (change
        time included), and the inotify descriptor whose events are news of
        it (-1: not followed).  None once a change of it was reported, or for
        a file closed."""
        if self.fd < 0:
            return None
        followed = self._followed
        if followed is None:
            return self.fd, self.drops_behind, self._seen[0], -1
        watch = contents()
        if watch is None or followed.written or followed.touched or followed.lost:
            return None
        return self.fd, self.drops_behind, (*self.stamp[:4], followed.ctime), watch.fd

    @property
    def drops_behind(self) -> bool:
        """Whether reads of bytes to be cached elsewhere give this file's
        pages back behind them (`passed`): decided on first use, when the
        page cache held fewer than half of its pages and the kernel could
        tell (`cached_pages`; a file mostly cached, as one a model server has
        just used, is left as it is).  Decided once: what the page cache
        holds after a read of it would speak of that read, not of the
        file's use."""
        if self._behind is None:
            with _DECIDING:
                if self._behind is None:
                    cached = cached_pages(self.fd, 0, self.stamp[2]) if self.fd >= 0 else None
                    self._behind = cached is not None and 2 * cached < pages(0, self.stamp[2])
        return self._behind

    def read(self, offset: int, size: int) -> bytearray:
        """Exactly `size` bytes at `offset`."""
        buf = bytearray(size)
        self.read_into(memoryview(buf), offset)
        return buf


_DECIDING = threading.Lock()  # (`BlobFile.drops_behind`)
