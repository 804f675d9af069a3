"""At most one log line per key every so often (`Throttle`): a blob whose
every read or open fails logs a line now and then, counting those left out."""

from __future__ import annotations

import threading
import time


class Throttle:
    """At most one log line per key every `seconds`: `due(key)` says whether
    one is due now, and how many were left out since the last."""

    _KEPT = 1024  # keys remembered; past that all are forgotten (a line is due for each again)

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._lock = threading.Lock()
        self._last: dict[object, tuple[float, int]] = {}  # key -> when its last line was, how many left out since

    def due(self, key: object) -> int | None:
        """None when a line for `key` came less than `seconds` ago (this one
        is counted), else how many were left out since that line."""
        now = time.monotonic()
        with self._lock:
            last, quiet = self._last.get(key, (-self.seconds, 0))
            if now - last < self.seconds:
                self._last[key] = (last, quiet + 1)
                return None
            if len(self._last) >= self._KEPT:
                self._last.clear()
            self._last[key] = (now, 0)
            return quiet


def left_out(quiet: int) -> str:
    """What a throttled line adds about the `quiet` lines left out before it."""
    return f" ({quiet} more since the last such line)" if quiet else ""
