"""`StatFiller`: mfusepy's `c_stat` filled from an attributes dict (what
getattr answers) in one `struct.pack_into`, as a listing with attributes
fills each entry's (`libfuse.FUSE.readdir_fuse_3`, which hands it the
struct and mfusepy's `set_st_attrs`)."""

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

    def fill(self, st, attrs: dict) -> None:
        """`st` (a c_stat) holding `attrs` and zeros."""
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
