"""The rescan thread looks for a reported change every `LOOK_SECONDS` (less
than the second that bounds how often a changing store is scanned): a model
pulled into a store that was quiet for that second is scanned at the very
next look, and one pulled less than a second after a scan waits until that
second has passed, never sooner (the one look again at folders followed
anew aside)."""

from __future__ import annotations

import time
from pathlib import Path

from compatfs.fuse.paths import Paths
from compatfs.fuse.wakeup import Wakeup
from compatfs.fuse.rescan import Rescan
from compatfs.sources.ollama import OllamaStore
from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.tree import Tree
from compatfs.view.catalog import BlobViews


def test_a_change_is_scanned_at_the_next_look_and_scans_stay_a_second_apart(tmp_path: Path, monkeypatch):
    store = tmp_path / "store"
    add_model(store, "m0", llama.plain_llama_text(tmp_path / "t.gguf"), tag="1b")
    tree = Tree(OllamaStore(store), BlobViews(), rescan_seconds=3600)
    monkeypatch.setattr(Rescan, "IDLE_SHARE", 1e-9)  # the timer's scans: far apart (minutes)
    rescan = Rescan(tree, Paths())
    looks: list[tuple[float, float | None]] = []  # (when, how long the thread was to wait)
    scans: list[tuple[float, int]] = []  # (when, at which look)
    ended: list[float] = []  # when each scan ended

    class Looks(Wakeup):
        def wait(self, timeout):
            looks.append((time.monotonic(), timeout))
            return super().wait(timeout)

    rescan._kick.close()
    rescan._kick = Looks()
    scan = tree.rescan

    def scanning():
        scans.append((time.monotonic(), len(looks)))
        try:
            return scan()
        finally:
            ended.append(time.monotonic())

    monkeypatch.setattr(tree, "rescan", scanning)

    def until(cond, what: str) -> None:
        deadline = time.monotonic() + 30
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.005)

    def quiet_for(seconds: float) -> bool:
        return len(ended) == len(scans) > 0 and time.monotonic() - ended[-1] > seconds

    assert Rescan.LOOK_SECONDS < Rescan.RESCAN_SECONDS
    rescan.start(0)  # no FUSE session: nothing to tell a kernel
    try:
        until(lambda: quiet_for(Rescan.RESCAN_SECONDS + 0.05), "a quiet second")
        assert len(scans) == 1  # the first look's
        assert all(t == Rescan.LOOK_SECONDS for _, t in looks[1:]), looks
        made_at = len(looks)
        add_model(store, "m1", llama.plain_llama_text(tmp_path / "n1.gguf", seed=1), tag="1b")
        until(lambda: "m1:1b" in tree.snapshot().models, "m1 scanned")
        assert scans[1][1] <= made_at + 1, (scans, made_at)  # at the look after it was made
        # Its new folders are looked at again (a scan at a next look); then,
        # 3 looks after the last scan (less than a second), a tag made in a
        # folder already followed is not scanned before a second has passed
        # since that scan.
        until(lambda: quiet_for(3 * Rescan.LOOK_SECONDS), "quiet")
        last = len(scans)
        add_model(store, "m1", llama.plain_llama_text(tmp_path / "n1.gguf", seed=1), tag="2b")
        until(lambda: "m1:2b" in tree.snapshot().models, "m1:2b scanned")
        assert scans[last][0] - ended[last - 1] >= Rescan.RESCAN_SECONDS, (scans, ended)
    finally:
        rescan.stop()
