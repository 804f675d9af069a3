"""`StatFiller`: mfusepy's `c_stat` filled from an attributes dict (what
getattr answers) in one `struct.pack_into`, as a listing with attributes
fills each entry's; `EntryFiller`: a listing's entry as readdir fills it
(`libfuse.FUSE.readdir_fuse_3`, and the listings kept for C, `listings`)."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import Any


class StatFiller:
    """Fills `c_stat` (mfusepy's struct stat) from an attributes dict as
    `set_st_attrs` (mfusepy's) does with times in nanoseconds (every other
    field 0), in one `struct.pack_into`: each field of the struct at its
    offset, in the size and signedness ctypes declares it, the three times
    as seconds and nanoseconds."""

    _TIMES = {"st_atimespec": "st_atime", "st_mtimespec": "st_mtime", "st_ctimespec": "st_ctime"}

    def __init__(self, c_stat: Any, set_st_attrs: Callable[..., None]) -> None:
        self._set_st_attrs = set_st_attrs
        fmt, at = "=", 0
        self._slots: list[tuple[str, bool]] = []  # (attribute, whether a time in ns) in the struct's order
        for name, ctype in c_stat._fields_:
            offset = getattr(c_stat, name).offset
            if name in self._TIMES:
                codes = [_code(t) for _, t in ctype._fields_]
                ends = [getattr(ctype, sub).offset + getattr(ctype, sub).size for sub, _ in ctype._fields_]
                if len(codes) != 2 or None in codes or ends != [ctypes.sizeof(ctype) // 2, ctypes.sizeof(ctype)]:
                    raise OSError(f"mfusepy's c_stat.{name} is not a timespec")
                fmt += "x" * (offset - at) + "".join(str(c) for c in codes)
                self._slots.append((self._TIMES[name], True))
            elif name.startswith("st_") and _code(ctype) is not None:
                fmt += "x" * (offset - at) + _code(ctype)
                self._slots.append((name, False))
            else:
                continue  # (padding, reserved: zero)
            at = offset + ctypes.sizeof(ctype)
        fmt += "x" * (ctypes.sizeof(c_stat) - at)
        self._struct = struct.Struct(fmt)
        if self._struct.size != ctypes.sizeof(c_stat):
            raise OSError("mfusepy's c_stat is not laid out as its fields say")

    def fill(self, st, attrs: dict, use_ns: bool = True) -> None:
        """`st` (a c_stat) holding `attrs` and zeros (times in seconds
        without `use_ns`, as mfusepy's `set_st_attrs` stores them)."""
        if not use_ns:
            ctypes.memset(ctypes.byref(st), 0, ctypes.sizeof(st))
            self._set_st_attrs(st, attrs, use_ns=False)
            return
        values: list[int] = []
        get = attrs.get
        for key, is_time in self._slots:
            if is_time:
                values.extend(divmod(int(get(key, 0)), 1_000_000_000))
            else:
                values.append(get(key, 0))
        try:
            self._struct.pack_into(st, 0, *values)
        except struct.error:  # a value out of its field's range: as ctypes itself stores it
            ctypes.memset(ctypes.byref(st), 0, ctypes.sizeof(st))
            self._set_st_attrs(st, attrs, use_ns=True)


def _code(ctype) -> str | None:
    """The `struct` code of a ctypes integer type (None for any other)."""
    kind = getattr(ctype, "_type_", None)
    if not isinstance(kind, str) or kind not in "bBhHiIlLqQ":
        return None
    code = {1: "b", 2: "h", 4: "i", 8: "q"}[ctypes.sizeof(ctype)]
    return code.upper() if kind.isupper() else code


class EntryFiller:
    """A listing's entries as the readdir of `operations` (the mount's
    `CompatFS`) fills them: each entry (name, attrs, _) of the folder at
    `base` into a c_stat, with `stat` (times in nanoseconds with `use_ns`),
    its name encoded as mfusepy decodes paths (`encoding`, `errors`)."""

    def __init__(self, operations, stat: StatFiller, use_ns: bool, encoding: str, errors: str, fill_plus: int):
        self._ops = operations
        self._stat = stat
        self._use_ns = use_ns
        self._encoding, self._errors = encoding, errors
        self._fill_plus = fill_plus

    def plus(self, base: str, entry: tuple, st) -> tuple[bytes, int]:
        """`st` filled for `entry` in a listing with attributes: getattr's
        answer for it, filled with it (`fill_plus`); "." and "..", and an
        entry getattr fails for, as `plain` fills them (the kernel looks the
        entry up itself).  Its name as bytes, and its fill flags."""
        name = entry[0]
        full = self._ops.entry_attrs(f"{base}/{name}") if name not in (".", "..") else None
        if full is None:
            return self.plain(entry, st)
        self._stat.fill(st, full, self._use_ns)
        return self.encode(name), self._fill_plus

    def plain(self, entry: tuple, st) -> tuple[bytes, int]:
        """`st` filled with an entry's type and inode number (what readdir's
        entries carry); its name as bytes, no fill flags."""
        self._stat.fill(st, entry[1], self._use_ns)
        return self.encode(entry[0]), 0

    def encode(self, name: str) -> bytes:
        return name.encode(self._encoding, self._errors)
