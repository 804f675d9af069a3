"""The worker threads that compute ahead (`ahead`): how many there are
(`workers`: a worker for each CPU the process may use beyond two;
`COMPATFS_AHEAD_WORKERS=N` in the environment sets it, 0 turns computing
ahead off), and the pool that runs them (`Pool`).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from concurrent.futures import Future
from collections.abc import Callable

log = logging.getLogger(__name__)


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def workers() -> int:
    """How many worker threads compute ahead: `COMPATFS_AHEAD_WORKERS` where
    set, else the CPUs this process may use less two.  A sequential reader
    through the mount already has two requests in flight (the mount's
    read-ahead of 2048 KiB asks for 1 MiB at a time), each computed on a
    core of its own: workers are the cores beyond those, and on two cores or
    fewer there are none (nothing is computed ahead)."""
    raw = os.environ.get("COMPATFS_AHEAD_WORKERS", "")
    if raw:
        try:
            if int(raw) >= 0:
                return int(raw)
        except ValueError:
            pass
        log.warning("COMPATFS_AHEAD_WORKERS=%r is not a whole number of workers: using the default", raw)
    return max(0, cores() - 2)


class Pool:
    """`workers` daemon threads running submitted calls, started on first
    use (and again in a forked child, which has none of its parent's
    threads); a thread that cannot be started is tried again on the next
    call, and a call is refused (RuntimeError) while none runs."""

    def __init__(self, workers: int):
        self._workers = workers
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pid = -1
        self._started = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], None], future: Future) -> None:
        with self._lock:
            if self._pid != os.getpid():
                self._pid, self._started = os.getpid(), 0
                self._queue = queue.SimpleQueue()
            while self._started < self._workers:
                try:
                    threading.Thread(
                        target=self._run, args=(self._queue,), name=f"compatfs-ahead-{self._started}", daemon=True
                    ).start()
                except RuntimeError:
                    if not self._started:
                        raise
                    break
                self._started += 1
            self._queue.put((fn, future))

    @staticmethod
    def _run(q: queue.SimpleQueue) -> None:
        while True:
            fn, future = q.get()
            if future.set_running_or_notify_cancel():
                try:
                    fn()
                except BaseException as e:
                    future.set_exception(e)
                else:
                    future.set_result(None)
