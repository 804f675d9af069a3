"""A flag one thread waits on and any other, or C code with no Python
(the read gate's kin pages, `readgate.stores_wake`), sets: an eventfd, as
`threading.Event` but for `fileno`."""

from __future__ import annotations

import contextlib
import os
import select
import threading


class Wakeup:
    """Set (`set`, or a write to `fileno`) until cleared; `wait` returns
    once set.  Closed, it is set no more (a late `set` is nothing)."""

    def __init__(self):
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._lock = threading.Lock()  # `set` and `close`: no write to a number closed meanwhile

    def fileno(self) -> int:
        return self._fd

    def set(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.eventfd_write(self._fd, 1)

    def wait(self, timeout: float) -> None:
        """Return once set, or after `timeout` seconds (poll: any descriptor
        number, where select takes those under 1024 only)."""
        fd = self._fd
        if fd >= 0:
            waiting = select.poll()
            waiting.register(fd, select.POLLIN)
            waiting.poll(max(timeout, 0.0) * 1000)

    def clear(self) -> None:
        fd = self._fd
        if fd >= 0:
            with contextlib.suppress(OSError):  # (not set: EAGAIN)
                os.eventfd_read(fd)

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
