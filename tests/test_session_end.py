"""A path invalidated as the session ends: libfuse frees the nodes
`fuse_invalidate_path` looks a path up in on its way out, before the
filesystem's destroy stops the rescan thread, and an invalidation sent
meanwhile crashed the daemon (a store changed just before an unmount).
The session's end (the FUSE device read finding the connection gone, or
the loop ended on a signal) now waits for an invalidation under way, and
none is sent after it (`fuse.ending`, `_accel`'s `notices_*`)."""

from __future__ import annotations

import threading
import time

import pytest

from compatfs.fuse import ending, libfuse
from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.translate import accel

pytestmark = pytest.mark.skipif(accel.native is None, reason="compatfs._accel is not built")


@pytest.fixture
def begun():
    ending.begins()
    yield
    ending.begins()  # (a later session of this process, in another test, goes on)


@pytest.mark.usefixtures("begun")
def test_the_rescan_thread_invalidates_no_path_once_the_session_ends(tmp_path, monkeypatch, store_fs):
    sent: list[str] = []
    monkeypatch.setattr(libfuse, "invalidate_path", lambda session, path: sent.append(path))
    store = tmp_path / "store"
    add_model(store, "text", llama.plain_llama_text(tmp_path / "t.gguf"), tag="1b")
    rescan = store_fs(store)._rescan
    rescan._fuse_ptr = 1  # (a session never dereferenced; the thread is not started: this one sends)
    rescan._invalidate_paths({"/a"})
    ending.ends()
    rescan._invalidate_paths({"/b"})
    assert sent == ["/a"]
    ending.begins()
    rescan._invalidate_paths({"/c"})
    assert sent == ["/a", "/c"]


@pytest.mark.usefixtures("begun")
def test_the_end_waits_for_an_invalidation_under_way():
    ended = threading.Event()
    with ending.going() as going:
        assert going
        end = threading.Thread(target=lambda: (ending.ends(), ended.set()))
        end.start()
        time.sleep(0.2)
        assert not ended.is_set()  # the end waits for it
    end.join(5)
    assert ended.is_set()
    with ending.going() as going:
        assert not going
