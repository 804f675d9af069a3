"""An open that finds the index entry its path was sized by wrong (the view
built for it belies it) returns only once the rescan thread has had the
kernel drop that path's attributes: else the kernel may serve the open from
the wrong size (a short file) before the invalidation arrives."""

from __future__ import annotations

import os
import threading
import time

from compatfs.fuse import libfuse
from compatfs.fuse.rescan import Rescan
from test_listing_rescan import _fs, _rescanning


class _Info:
    flags = os.O_RDONLY
    keep_cache = 0
    fh = 0


def test_an_open_that_belies_its_index_entry_waits_for_the_invalidation(tmp_path, monkeypatch):
    told: list[str] = []
    monkeypatch.setattr(libfuse, "invalidate_path", lambda session, path: told.append(path) or 0)
    slow = Rescan._send_queued

    def slowly(self):
        time.sleep(0.5)  # a rescan thread busy elsewhere when the open queues its invalidation
        slow(self)

    monkeypatch.setattr(Rescan, "_send_queued", slowly)
    fs = _fs(tmp_path, monkeypatch)
    path = "/alpha:1b/model.gguf"
    blob = fs.tree.lookup(path).blob
    real = fs._files.open_view

    def belied(path, node, caller):
        opened = real(path, node, caller)
        fs.tree.views.on_belied(blob)  # what BlobViews does when the view's size is not the entry's
        return opened

    monkeypatch.setattr(fs._files, "open_view", belied)
    info = _Info()
    with _rescanning(fs):
        opener = threading.Thread(target=lambda: fs.open(path, info))
        opener.start()
        opener.join(20)
        assert not opener.is_alive()
        assert path in told, told  # sent before the open returned
    assert info.fh
    fs.release(path, info)
