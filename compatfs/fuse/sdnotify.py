"""systemd readiness for `compatfs mount -f` in a `Type=notify` unit: once the
mount table shows the mount, READY=1 goes to $NOTIFY_SOCKET (the sd_notify
protocol: one datagram on a unix socket; a name starting with @ is abstract).
The mountpoint itself is never looked at: a request there would be one to
this very daemon."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path
from collections.abc import Callable

from ..files.mounttable import Mount, mounts

log = logging.getLogger(__name__)


def notify(message: str) -> bool:
    """Send `message` to systemd; False when not run by systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr or addr[0] not in "@/":
        return False
    if addr[0] == "@":
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(message.encode())
    except OSError as e:
        log.warning("cannot notify systemd (%s): %s", os.environ.get("NOTIFY_SOCKET"), e)
        return False
    return True


MOUNT_TYPE = "fuse.compatfs"


def notify_when_mounted(
    mountpoint: Path, timeout: float = 120.0, table: Callable[[], list[Mount]] = mounts
) -> threading.Thread | None:
    """Watch, in a daemon thread, for a compatfs mount at `mountpoint` that
    `table` (the mount table) did not hold when this was called, then send
    READY=1.  Nothing when not run by systemd."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return None
    point = Path(os.path.abspath(mountpoint))  # as the mount table writes it (no lookup)

    def ours() -> int:
        return sum(1 for m in table() if m.point == point and m.fstype == MOUNT_TYPE)

    before = ours()

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ours() > before:
                notify(f"READY=1\nSTATUS=serving at {mountpoint}\nMAINPID={os.getpid()}")
                return
            time.sleep(0.05)
        log.error("%s was not mounted within %.0f s: systemd not notified", mountpoint, timeout)

    t = threading.Thread(target=watch, name="sd_notify", daemon=True)
    t.start()
    return t
