"""Folder requests answered in C (`compatfs._accel`), put in the operations
table mfusepy hands libfuse before libfuse copies it:

- root's opens of folders (`_accel.opendir_gate`): root may list every
  folder and has nothing looked up, which is what the filesystem's
  `opendir` answers for root; every other caller's open goes to the
  Python `opendir`;
- the end of a folder's listing (`_accel.readdir_gate`): a request from an
  offset at or past the end of a folder that `readdir` listed to its end
  under the same fh (`listed`), which a caller's last getdents sends after
  every folder, is answered with nothing; so is a listing with attributes
  of a folder whose listing is kept (`listings`), from what is kept; every
  other request goes to the Python `readdir`.

Each open of a folder has an fh of its own (`handle`), root's from the C
gate, every other one's from the Python `opendir`.  `put` puts any C gate
in the table in front of its Python callback (the read gate's too,
`readgate`).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass

import mfusepy as fuse

from ..translate import accel

log = logging.getLogger(__name__)


@dataclass
class Gates:
    """What the Python callbacks need once the gates are in place (and the
    fallbacks libfuse calls through them, kept alive)."""

    handle: Callable[[], int]  # a folder's fh that no other open of a folder has
    listed: Callable[[int, int], None] | None  # (fh, entries): that open was listed to its end
    fallbacks: list


def put(ops, name: str, fallback: Callable, make: Callable[[int | None], int]):
    """Put in `ops` (mfusepy's fuse_operations) the C function `make` gives,
    as field `name`, given the address of `fallback` (a Python callback, as
    mfusepy wraps it) made a function of that field's type: that function
    (for the caller to keep alive while libfuse may call it), or None where
    `make` refuses (ValueError) and `ops` is left as it was."""
    kind = dict(fuse.fuse_operations._fields_)[name]
    wrapped = kind(fallback)
    try:
        gate = make(ctypes.cast(wrapped, ctypes.c_void_p).value)
    except ValueError:
        return None
    setattr(ops, name, kind(gate))
    return wrapped


def install(
    ops, bits: tuple[int, int], context, opendir: Callable, readdir: Callable, plus: tuple[int, int]
) -> Gates | None:
    """Put the gates in `ops` (mfusepy's fuse_operations), with `opendir`
    and `readdir` (the Python callbacks, as mfusepy wraps them) as their
    fallbacks; `bits` where fuse_file_info's keep_cache and cache_readdir
    are (`_accel.opendir_gate`), `context` libfuse's fuse_get_context,
    `plus` the size of mfusepy's struct stat and the flag of a listing with
    attributes (`_accel.readdir_gate`).
    None where compatfs._accel is not built, the table has no opendir, a
    uid is not 32 bits, or another mount in this process has the gates."""
    native = accel.native
    if native is None or not ops.opendir or ctypes.sizeof(fuse.c_uid_t) != 4:
        return None
    fh = fuse.fuse_file_info.fh.offset
    context_at = ctypes.cast(context, ctypes.c_void_p).value
    uid = fuse.fuse_context.uid.offset
    opened = put(ops, "opendir", opendir, lambda at: native.opendir_gate(at, context_at, uid, fh, *bits))
    if opened is None:
        return None
    gates = Gates(native.dir_handle, None, [opened])
    log.info("folders opened by root answered in C (compatfs._accel), by others in Python")
    if not ops.readdir:
        return gates
    listing = put(ops, "readdir", readdir, lambda at: native.readdir_gate(at, fh, *plus))
    if listing is None:
        return gates
    gates.fallbacks.append(listing)
    gates.listed = native.listed
    log.info("the end of a folder's listing, and kept folders' listings, answered in C (compatfs._accel)")
    return gates
