"""Inode numbers of the mount: stable, derived from what a node is.

The root is 1; a folder's number comes from its path; a file's from its path
and the identity of the blob it serves (another blob, or the same blob
rewritten, is another inode); a file that cannot be served has one of its
own per path.  Each number is hashed once and remembered (the last
`REMEMBERED` asked for: a listing of every folder asks for each a few times).
"""

from __future__ import annotations

import functools
import hashlib

REMEMBERED = 1 << 16


@functools.lru_cache(maxsize=REMEMBERED)
def ino(*parts) -> int:
    """A stable inode number for what `parts` name (never 0 or 1, the root's)."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(h, "little") >> 2) + 2


def dir_ino(rel: str) -> int:
    """The folder at `rel` (relative to the mount; "" is the root)."""
    return 1 if not rel else ino("dir", rel)


def file_ino(path: str, stamp: tuple) -> int:
    """The file at `path` serving the blob of identity `stamp`."""
    return ino(path, stamp)


def bad_ino(path: str) -> int:
    """The file at `path` when its blob cannot be served."""
    return ino("bad", path)
