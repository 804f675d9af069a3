"""The kernel is told what to drop by one thread, the rescan's: an open that
needs its path invalidated, a release of a path that kept its view, and a
wrong index entry found while a view is built queue it, and the rescan thread
sends it (an open returns once it is sent).  What the mount keeps per path
has one owner, whose methods take its own lock: no lock is handed around."""

from __future__ import annotations

import inspect
import os
import threading
from types import SimpleNamespace

import pytest

from compatfs.fuse import current, libfuse, openfiles, paths, rescan
from compatfs.fuse.operations import CompatFS
from compatfs.testing import llama
from compatfs.testing.store import add_model
from test_hostile_mount import blob_of

PATH = "/text:1b/model.gguf"


@pytest.fixture
def fs(tmp_path, monkeypatch, store_fs):
    """A CompatFS, in process, whose rescan thread runs with a stand-in FUSE
    session: every invalidation is recorded with the thread that sent it."""
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(
        libfuse, "invalidate_path", lambda session, path: sent.append((threading.current_thread().name, path)) or 0
    )
    store = tmp_path / "store"
    add_model(store, "text", llama.plain_llama_text(tmp_path / "t.gguf"), tag="1b")
    fs = store_fs(store)
    fs._rescan.start(1)  # a session that is never dereferenced: invalidate_path is the recorder
    yield SimpleNamespace(fs=fs, sent=sent, store=store)
    fs._rescan.stop()


def _open(fs: CompatFS, path: str = PATH) -> int:
    fi = SimpleNamespace(flags=os.O_RDONLY, keep_cache=0, fh=0)
    assert fs.open(path, fi) == 0
    return fi.fh


def test_an_open_that_needs_its_path_invalidated_waits_for_the_rescan_thread_to_send_it(fs):
    fs.fs.getattr(PATH)
    fs.fs._paths.gave_size(PATH, ("another", "view"), 1)  # getattr gave the kernel another view's size
    fs.sent.clear()
    fh = _open(fs.fs)
    assert ("compatfs-rescan", PATH) in fs.sent, fs.sent  # sent before the open returned
    assert {thread for thread, _ in fs.sent} == {"compatfs-rescan"}, fs.sent
    fs.fs.release(PATH, SimpleNamespace(fh=fh))


def test_an_open_of_a_view_of_the_same_blob_with_another_size_has_its_path_invalidated(fs):
    """A file held open while its params layer changed kept the kernel at
    the old view's size (getattr answers with the open view); the blob is
    the same, the new view's size another: the next open has the kernel
    drop that size before it returns, or a reader would take the old size
    for the new view."""
    attrs = fs.fs.getattr(PATH)
    fh = _open(fs.fs)
    fs.fs.release(PATH, SimpleNamespace(fh=fh))
    fs.sent.clear()
    fh = _open(fs.fs)  # (the size the kernel was given: nothing to send)
    fs.fs.release(PATH, SimpleNamespace(fh=fh))
    assert (("compatfs-rescan", PATH) in fs.sent) is False, fs.sent
    stamp = next(iter(fs.fs._paths._sizes_given[PATH]))[0]
    fs.fs._paths.gave_size(PATH, stamp, attrs["st_size"] + 4096)  # as while the old view was open
    fs.sent.clear()
    fh = _open(fs.fs)
    assert ("compatfs-rescan", PATH) in fs.sent, fs.sent  # sent before the open returned
    fs.fs.release(PATH, SimpleNamespace(fh=fh))


def test_a_wrong_index_entry_is_told_to_the_kernel_by_the_rescan_thread(fs):
    blob = blob_of(fs.store, "text", "1b")
    fs.sent.clear()
    fs.fs.tree.views.on_belied(blob)  # as BlobViews calls it, from the thread that built a view
    fs.fs._rescan.invalidate(set(), wait=5)  # queued after it: sent once this returns
    assert ("compatfs-rescan", PATH) in fs.sent and ("compatfs-rescan", "/text:1b") in fs.sent, fs.sent
    assert {thread for thread, _ in fs.sent} == {"compatfs-rescan"}, fs.sent


def test_no_lock_is_handed_between_the_fuse_layers_objects():
    for cls in (paths.Paths, current.CurrentViews, openfiles.OpenFiles, rescan.Rescan):
        assert "lock" not in inspect.signature(cls.__init__).parameters, cls


def test_only_the_rescan_module_sends_notifications():
    """No other module of the FUSE layer calls libfuse's notification."""
    from conftest import ROOT

    callers = {
        p.name
        for p in (ROOT / "compatfs" / "fuse").glob("*.py")
        if p.name != "libfuse.py" and "invalidate_path(" in p.read_text()
    }
    assert callers == {"rescan.py"}, callers
