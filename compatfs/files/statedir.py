"""compatfs's per-user state folder: the daemon's logs and the `models.ini`
each mount publishes, never inside a store."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
import contextlib


class StateDirError(OSError):
    """The state folder cannot be made, or is not this user's own; one line naming it."""


def state_dir() -> Path:
    """$XDG_STATE_HOME/compatfs, else ~/.local/state/compatfs; created 0700.
    StateDirError when it cannot be made or is not a folder of this user's
    own (a symlink, or another user's)."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    d = root / "compatfs"
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
        st = os.lstat(d)
    except OSError as e:
        raise StateDirError(f"cannot create the state folder {d}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise StateDirError(f"{d} is not a folder of yours (a symlink, or another user's)")
    if st.st_mode & 0o077:
        os.chmod(d, 0o700)
    return d


# Characters a mountpoint keeps in its file name; `/` becomes `_`, and every
# other byte (`_` and `%` too) `%XX`: one name per mountpoint, never two.
_KEPT = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")
_NAME_MAX = 200  # bytes of the encoded mountpoint kept as they are; longer ones are shortened


def mount_name(mountpoint: Path | str) -> str:
    """The mountpoint (made absolute) as one file name: `/mnt/compat` is
    `mnt_compat`, `/mnt/a_b` `mnt_a%5Fb` (and `/mnt/a/b` `mnt_a_b`), `/` is
    `_`.  A name longer than `_NAME_MAX` is its start, `~` and a SHA-256 of
    the whole (`~` is escaped in every other name)."""
    path = os.fsencode(os.path.abspath(mountpoint)).lstrip(b"/")
    name = "".join("_" if b == 0x2F else chr(b) if b in _KEPT else f"%{b:02X}" for b in path) or "_"
    if len(name) > _NAME_MAX:
        name = f"{name[: _NAME_MAX - 65]}~{hashlib.sha256(path).hexdigest()}"
    return name


def mount_file(prefix: str, mountpoint: Path | str, suffix: str) -> Path:
    """The state folder's file `prefix`-<mountpoint as one name>`suffix` of a
    mount (see `mount_name`)."""
    return state_dir() / f"{prefix}-{mount_name(mountpoint)}{suffix}"
