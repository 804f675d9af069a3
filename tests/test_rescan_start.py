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


def _burn(until: threading.Event) -> None:
    """What a FUSE worker answering a listing does to the daemon's CPU."""
    while not until.is_set():
        sum(range(1000))


def test_the_first_look_waits_while_the_daemon_answers_requests(tmp_path, monkeypatch):
    """A remount's first listing is not slowed by the thread's first look:
    it waits while other threads use the CPU, `FIRST_LOOK_WAIT` seconds at
    most, and comes as soon as they stop."""
    monkeypatch.setattr(Rescan, "FIRST_LOOK_WAIT", 2.0)
    store = tmp_path / "store"
    add_model(store, "llama3", llama.legacy_llama3_instruct(tmp_path / "l3.gguf"))
    tree = Tree(open_source(store), BlobViews())
    rescan = Rescan(tree, Paths(), None)
    tree.snapshot()
    stop = threading.Event()
    burner = threading.Thread(target=_burn, args=(stop,))
    burner.start()
    try:
        rescan.start(0)
        time.sleep(1.0)
        assert rescan.rescans == 0  # (without the wait: after a quarter second)
        deadline = time.monotonic() + 10
        while rescan.rescans == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rescan.rescans >= 1 and burner.is_alive()  # at most FIRST_LOOK_WAIT, however busy
        stop.set()
        burner.join()
    finally:
        stop.set()
        rescan.stop()


def test_the_first_look_comes_at_once_when_the_daemon_is_idle(tmp_path):
    store = tmp_path / "store"
    add_model(store, "llama3", llama.legacy_llama3_instruct(tmp_path / "l3.gguf"))
    tree = Tree(open_source(store), BlobViews())
    rescan = Rescan(tree, Paths(), None)
    tree.snapshot()
    rescan.start(0)
    try:
        deadline = time.monotonic() + 5
        while rescan.rescans == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert rescan.rescans >= 1
    finally:
        rescan.stop()
