"""Store files opened and read one way: never blocking, only regular files,
every read checked against the identity the file had when it was opened.

Everything compatfs reads out of a store (blobs, manifests, params layers)
comes through here: `open_regular` opens without blocking (a FIFO or device
put in place of a file never hangs the caller) and refuses anything the open
descriptor does not show to be a regular file; `BlobFile` is one open blob,
its descriptor and identity, and reads exactly the bytes asked for or raises.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from .gguf_values import GGUFError

Stamp = tuple[int, int, int, int, int]   # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns

_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def identity(st: os.stat_result) -> Stamp:
    """What identifies a file's bytes: device, inode, size, modification and
    change time (a rewrite that restores the mtime still moves the ctime,
    which cannot be set back)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def unchanged(stamp: Stamp, st: os.stat_result) -> bool:
    """Whether a file opened with identity `stamp` still holds the same bytes,
    judged by its status `st` now (from its descriptor).  Removing a file's
    last link moves its change time too: a file no longer in any folder
    (`ollama rm` while it is read) that is otherwise the same still is."""
    now = identity(st)
    return now == tuple(stamp) or (st.st_nlink == 0 and now[:4] == tuple(stamp[:4]))


def open_regular(path: str | os.PathLike) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file at `path` and its status
    (taken from the descriptor); GGUFError naming the path otherwise."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        raise GGUFError(f"{path}: cannot open: {e.strerror}") from None
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise GGUFError(f"{path}: cannot read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise GGUFError(f"{path}: not a regular file")
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
    opened (`expect`: the identity it must have, else GGUFError)."""

    def __init__(self, path: str | os.PathLike, expect: Stamp | None = None):
        self.path = Path(path)
        self.fd, st = open_regular(path)
        self.stamp = identity(st)
        if expect is not None and self.stamp != tuple(expect):
            self.close()
            raise GGUFError(f"{path}: the file changed since it was read")

    def __enter__(self) -> "BlobFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def intact(self) -> bool:
        """Whether the file still has the identity it was opened with."""
        try:
            return unchanged(self.stamp, os.fstat(self.fd))
        except OSError:
            return False

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
                    raise GGUFError(f"{self.path}: ends at {offset + done}, before {offset + size} (truncated?)")
                done += n
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot read: {e.strerror}") from None

    def read(self, offset: int, size: int) -> bytearray:
        """Exactly `size` bytes at `offset`."""
        buf = bytearray(size)
        self.read_into(memoryview(buf), offset)
        return buf
