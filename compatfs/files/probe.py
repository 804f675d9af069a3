"""Lookups that may hang, tried first where a hung one cannot hold the caller.

A store's symlink may lead onto another mount whose server no longer answers
(a dead NFS or sshfs server, a user's FUSE mount that stopped answering):
the kernel then holds the thread that looks it up, often where no signal
reaches it, and a process holding such a thread cannot even exit.  Before
`blobfile` follows a symlink onto another mount than the one the path it
resolves starts on, `reach` has a helper process look the rest of the path
up, and waits for it at most `BOUND` seconds: past that, the lookup fails
(ETIMEDOUT, naming the path and the mount), the helper is left where it is
stuck, and every lookup on that mount fails at once until the helper's
lookup ends.  So is a folder a walk is about to list where a mount is made
(`guard`: a user's own FUSE mount in a shared folder).  A path that stays on
its mount (a store with no symlink out of it) costs a set lookup at most:
the mount table is read at most once a second.
"""

from __future__ import annotations

import errno
import os
import select
import subprocess
import sys
import threading
import time

from .mounttable import mounts

BOUND = 1.0  # seconds a lookup on another mount may take in the helper before it counts as hung
_TABLE_SECONDS = 1.0  # the mount table is read again after this long

# The helper: one request a line, `S <hex of a path's bytes>` (stat it) or
# `L <hex>` (list the folder and lstat each entry, as a walk of it does),
# answered with 0 or the errno met.
_HELPER = """
import os, sys
for line in sys.stdin:
    kind, _, path = line.strip().partition(" ")
    try:
        if kind == "L":
            with os.scandir(bytes.fromhex(path)) as it:
                for entry in it:
                    entry.stat(follow_symlinks=False)
        else:
            os.stat(bytes.fromhex(path))
        answer = 0
    except OSError as e:
        answer = e.errno or 0
    sys.stdout.write(f"{answer}\\n")
    sys.stdout.flush()
"""

_lock = threading.Lock()
_helper: list[subprocess.Popen] = []  # the helper answering now (one at most)
_stuck: dict[str, tuple[subprocess.Popen, str]] = {}  # mountpoint -> the helper stuck on it, and the path it looks up
_table: list[tuple[float, list[str], set[str]]] = []  # (when read, mountpoints longest first, and as a set)
_owner: list[int] = []  # the process the helpers above are of


def _points() -> list[str]:
    """The mountpoints, longest first (read at most once every `_TABLE_SECONDS`)."""
    now = time.monotonic()
    if not _table or now - _table[0][0] > _TABLE_SECONDS:
        points = {str(m.point) for m in mounts()}
        _table[:] = [(now, sorted(points, key=len, reverse=True), points)]
    return _table[0][1]


def guard(folder: str) -> None:
    """Before a folder is listed: where a mount is made at `folder` (a walk
    would step onto it), `reach` it first (ETIMEDOUT where its lookups hang)."""
    _points()
    if folder in _table[0][2]:
        reach(folder, folder, listing=True)


def mount_of(path: str) -> str:
    """The mountpoint `path` (absolute, normalised) lies on, by its spelling."""
    for point in _points():
        if path == point or path.startswith(point.rstrip("/") + "/"):
            return point
    return "/"


def leaves(start: str, path: str) -> str | None:
    """The mount `path` lies on when that is not the one `start` lies on (both
    absolute and normalised), else None."""
    there = mount_of(path)
    return there if there != mount_of(start) else None


def _hung(path: str, mount: str, looked_up: str) -> OSError:
    still = f" ({looked_up}, looked up before, has not ended)" if looked_up != path else ""
    return OSError(
        errno.ETIMEDOUT, f"{path}: a lookup on {mount} did not end within {BOUND:g} s{still} (a hung mount?)"
    )


def _start() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _HELPER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        close_fds=True,
    )


def _ended(helper: subprocess.Popen) -> bool:
    """Whether a stuck helper's lookup has ended (it is then let go)."""
    assert helper.stdout is not None and helper.stdin is not None
    if helper.poll() is None and not select.select([helper.stdout], [], [], 0)[0]:
        return False
    helper.stdin.close()
    return True


def reach(path: str, mount: str, listing: bool = False) -> None:
    """Return once `path` (on `mount`) was looked up in the helper (with
    `listing`, the folder listed and each entry's own status read) within
    `BOUND` seconds, whatever the answer (the caller's own lookup meets the
    same); OSError ETIMEDOUT naming both when it was not, or a lookup on
    that mount is stuck still."""
    with _lock:
        if _owner != [os.getpid()]:  # a forked child: its parent's helpers are not its own
            _helper.clear()
            _stuck.clear()
            _owner[:] = [os.getpid()]
        stuck = _stuck.get(mount)
        if stuck is not None:
            if not _ended(stuck[0]):
                raise _hung(path, mount, stuck[1])
            del _stuck[mount]
        if not _helper or _helper[0].poll() is not None:
            try:
                _helper[:] = [_start()]
            except OSError as e:
                raise OSError(e.errno, f"{path}: cannot start a helper to look it up: {e.strerror}") from None
        helper = _helper[0]
        assert helper.stdin is not None and helper.stdout is not None
        try:
            helper.stdin.write(("L " if listing else "S ") + os.fsencode(path).hex() + "\n")
            helper.stdin.flush()
        except OSError:
            _helper.clear()
            raise OSError(errno.EIO, f"{path}: the helper looking it up ended") from None
        if select.select([helper.stdout], [], [], BOUND)[0]:
            if helper.stdout.readline():
                return
            _helper.clear()
            raise OSError(errno.EIO, f"{path}: the helper looking it up ended")
        _helper.clear()
        _stuck[mount] = (helper, path)
        raise _hung(path, mount, path)
