"""The rescan thread's wake-up (`fuse.wakeup.Wakeup`): set by a call or by
a write to its eventfd (as the read gate's C code does), cleared, waited on
with a timeout whatever its descriptor's number, and closed for good (a late
`set` is nothing)."""

from __future__ import annotations

import os
import resource
import threading
import time

import pytest

from compatfs.fuse.wakeup import Wakeup


def _waited(w: Wakeup, timeout: float) -> float:
    t = time.monotonic()
    w.wait(timeout)
    return time.monotonic() - t


def test_a_wakeup_is_set_cleared_and_waited_on():
    w = Wakeup()
    try:
        assert _waited(w, 0.2) >= 0.15  # not set: the whole timeout
        w.set()
        assert _waited(w, 5) < 1 and _waited(w, 5) < 1  # set until cleared
        w.clear()
        assert _waited(w, 0.1) >= 0.08
        os.eventfd_write(w.fileno(), 1)  # (as C sets it)
        assert _waited(w, 5) < 1
        w.clear()
        threading.Timer(0.1, w.set).start()
        assert 0.05 < _waited(w, 5) < 2  # woken by another thread
    finally:
        w.close()
    w.set()
    w.clear()
    assert _waited(w, 0.01) < 1


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1200, reason="fewer than 1200 open files allowed")
def test_a_wakeup_past_descriptor_1024_is_waited_on():
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        w = Wakeup()
        assert w.fileno() >= 1024
        assert _waited(w, 0.1) >= 0.08
        w.set()
        assert _waited(w, 5) < 1
        w.close()
    finally:
        for fd in held:
            os.close(fd)
