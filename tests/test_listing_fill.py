"""A listing with attributes (READDIRPLUS) fills each entry's `struct stat`
in one `struct.pack_into` (`statfill.StatFiller`): the very bytes mfusepy's
`set_st_attrs` writes for the same attributes, times in nanoseconds, every
field not given zero; a value out of its field's range is stored as ctypes
stores it."""

from __future__ import annotations

import ctypes
import stat

import pytest

from compatfs.fuse.libfuse import fuse
from compatfs.fuse.statfill import StatFiller

_CASES = [
    # a file as getattr gives it
    {
        "st_mode": stat.S_IFREG | 0o444,
        "st_nlink": 1,
        "st_size": 123_456_789,
        "st_blocks": 241_127,
        "st_ino": (1 << 62) + 5,
        "st_uid": 1000,
        "st_gid": (1 << 32) - 2,
        "st_mtime": 1_733_000_000_123_456_789,
        "st_ctime": 1_733_000_001_000_000_001,
        "st_atime": 0,
    },
    # a folder, a listing's own entries, a file that cannot be served
    {"st_uid": 0, "st_gid": 0, "st_mode": stat.S_IFDIR | 0o555, "st_nlink": 10_002, "st_ino": 1, "st_mtime": 5},
    {"st_mode": stat.S_IFDIR, "st_ino": 7},
    {"st_mode": stat.S_IFREG, "st_nlink": 1, "st_size": 0, "st_ino": 9, "st_uid": 0, "st_gid": 0},
    # a time before 1970, and keys a struct stat does not have
    {"st_mode": stat.S_IFREG, "st_mtime": -1_500_000_001, "st_stamp": (1, 2, 3, 4, 5), "st_birthtime": 3},
    # out of range: stored as ctypes stores it
    {"st_mode": stat.S_IFREG, "st_uid": -1, "st_size": -(1 << 63)},
]


@pytest.mark.parametrize("attrs", _CASES, ids=range(len(_CASES)))
def test_filled_as_set_st_attrs_fills(attrs):
    want = fuse.c_stat()
    fuse.set_st_attrs(want, attrs, use_ns=True)
    got = fuse.c_stat()
    ctypes.memset(ctypes.byref(got), 0xA5, ctypes.sizeof(got))  # (what a previous entry left)
    StatFiller(fuse.c_stat, fuse.set_st_attrs).fill(got, attrs)
    assert bytes(got) == bytes(want)
    assert got.st_ino == attrs.get("st_ino", 0) and got.st_mode == attrs["st_mode"]
