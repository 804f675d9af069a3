"""The kernel's mount table as this process sees it (/proc/self/mountinfo).

Each line: `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE
SOURCE SUPEROPTIONS`; the kernel writes space, tab, newline and backslash in
ROOT, MOUNTPOINT and SOURCE as three-digit octal escapes (`\\040`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
_ESCAPE = re.compile(rb"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    point: Path
    fstype: str
    source: str
    device: str  # MAJ:MINOR


def unescape(field: bytes) -> str:
    """A mountinfo field with its octal escapes undone (bytes, then the file
    system's encoding, as a path)."""
    return os.fsdecode(_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8) & 0xFF]), field))


def parse(text: bytes) -> list[Mount]:
    """Every well-formed line of a mountinfo text, in the kernel's order
    (later mounts over the same point come later)."""
    out = []
    for line in text.splitlines():
        head, sep, tail = line.partition(b" - ")
        fields, rest = head.split(b" "), tail.split(b" ")
        if not sep or len(fields) < 6 or len(rest) < 2:
            continue
        out.append(
            Mount(
                Path(unescape(fields[4])),
                rest[0].decode("utf-8", "replace"),
                unescape(rest[1]),
                fields[2].decode("ascii", "replace"),
            )
        )
    return out


def mounts(path: Path = MOUNTINFO) -> list[Mount]:
    """The mount table now; empty when it cannot be read."""
    try:
        return parse(path.read_bytes())
    except OSError:
        return []


def last_at(point: Path, path: Path = MOUNTINFO) -> Mount | None:
    """The mount made last at `point` (the one a lookup there sees), if any."""
    return next((m for m in reversed(mounts(path)) if m.point == point), None)


def fstype_at(point: Path, path: Path = MOUNTINFO) -> str | None:
    """The type of the filesystem mounted last at `point`, if any."""
    m = last_at(point, path)
    return m.fstype if m is not None else None


def points_of(fstype: str, path: Path = MOUNTINFO) -> list[Path]:
    """Mountpoints of filesystems of type `fstype`."""
    return [m.point for m in mounts(path) if m.fstype == fstype]
