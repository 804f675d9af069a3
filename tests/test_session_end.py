"""A path invalidated as the session ends: libfuse frees the nodes
`fuse_invalidate_path` looks a path up in on its way out, before the
filesystem's destroy stops the rescan thread, and an invalidation sent
meanwhile crashed the daemon (a store changed just before an unmount).
The session's end (the FUSE device read saying the connection ended, or
the loop ended on a signal) now waits for an invalidation under way, and
none is sent after it (`_accel`'s `notices_*`, `libfuse.invalidate_path`)."""

from __future__ import annotations

import threading
import time

import pytest

from compatfs.fuse import libfuse
from compatfs.translate import accel

pytestmark = pytest.mark.skipif(accel.native is None, reason="compatfs._accel is not built")


@pytest.fixture
def sent(monkeypatch):
    """The paths `libfuse.invalidate_path` hands libfuse (none is sent to a kernel)."""
    paths: list[str] = []

    class Recorder:
        def fuse_invalidate_path(self, ptr, path):
            paths.append(path.decode())
            return 0

        def fuse_exit(self, ptr):
            return None

    monkeypatch.setattr(libfuse, "_libfuse", Recorder())
    libfuse.session_begins()
    yield paths
    libfuse.session_begins()  # (the process's next session, in another test, goes on)


def test_no_path_is_invalidated_once_the_session_ends(sent):
    libfuse.invalidate_path(1, "/a")
    libfuse.exit_loop(1)
    libfuse.invalidate_path(1, "/b")
    assert sent == ["/a"]
    libfuse.session_begins()
    libfuse.invalidate_path(1, "/c")
    assert sent == ["/a", "/c"]


def test_the_end_waits_for_an_invalidation_under_way(sent):
    native = accel.native
    assert native.notices_hold()  # (an invalidation under way on this thread)
    ended = threading.Event()
    end = threading.Thread(target=lambda: (native.notices_end(), ended.set()))
    end.start()
    time.sleep(0.2)
    assert not ended.is_set()  # the end waits for it
    native.notices_release()
    end.join(5)
    assert ended.is_set()
    assert not native.notices_hold()  # (nothing held: none goes on)
    libfuse.invalidate_path(1, "/late")
    assert sent == []
