"""systemd readiness for `compatfs mount -f` in a `Type=notify` unit: once the
mountpoint is mounted, READY=1 goes to $NOTIFY_SOCKET (the sd_notify
protocol: one datagram on a unix socket; a name starting with @ is abstract)."""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path

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


def notify_when_mounted(mountpoint: Path, timeout: float = 120.0) -> threading.Thread | None:
    """Watch, in a daemon thread, for `mountpoint` to be mounted, then send READY=1.
    Nothing when not run by systemd."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return None

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.ismount(mountpoint):
                notify(f"READY=1\nSTATUS=serving at {mountpoint}\nMAINPID={os.getpid()}")
                return
            time.sleep(0.05)
        log.error("%s was not mounted within %.0f s: systemd not notified", mountpoint, timeout)

    t = threading.Thread(target=watch, name="sd_notify", daemon=True)
    t.start()
    return t
