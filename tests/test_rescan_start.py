"""The rescan thread's first look at the store: a change made after the
mount's first lookups and before the thread starts is still a change (its
baseline is the snapshot those lookups answered from, not a new scan)."""

from __future__ import annotations

import os
import threading
import time

from compatfs.fuse.rescan import Rescan
from compatfs.sources.choose import open_source
from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.tree import Tree
from compatfs.view.catalog import BlobViews


class Paths:
    def __init__(self):
        self.forgotten = threading.Event()

    def forget(self):
        self.forgotten.set()

    def prune(self, *args):
        pass


def test_a_change_before_the_thread_starts_is_seen(tmp_path):
    store = tmp_path / "store"
    add_model(store, "llama3", llama.legacy_llama3_instruct(tmp_path / "l3.gguf"))
    tree = Tree(open_source(store), BlobViews(), rescan_seconds=0.2)
    memo = Paths()
    rescan = Rescan(tree, memo, None)  # as the daemon makes it, before mounting
    tree.snapshot()  # the mount's first lookups answer from it
    blob = next((store / "blobs").iterdir())
    os.chmod(blob, 0o640)
    time.sleep(0.3)  # the thread starts later than one rescan interval
    rescan.start(0)  # no FUSE session: nothing to tell a kernel
    try:
        assert memo.forgotten.wait(5), "the mode changed before the rescan thread started was never seen"
    finally:
        rescan.stop()
