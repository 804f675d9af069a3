"""The rescan does only the work of what changed: an idle store is not
scanned again at every look, a scan that finds nothing changed reads no
params layer and renders no models.ini, and a changed params layer is read
again alone, its section made again alone; a model pulled while idle is
still seen."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import compatfs.router.preset
from compatfs.fuse.wakeup import Wakeup
from compatfs.fuse.rescan import Rescan
from compatfs.sources.choose import open_source
from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.router.preset import RootPreset
from compatfs.tree import Tree
from compatfs.view.catalog import BlobViews
from test_rescan_start import Paths
from test_sampling import set_params


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    blob = llama.plain_llama_text(tmp_path / "t.gguf")
    for i in range(3):
        set_params(root, add_model(root, f"m{i}", blob, tag="1b"), f'{{"num_ctx": {1024 * (i + 1)}}}'.encode())
    return root


@pytest.fixture
def counted(monkeypatch):
    """Calls of the params reader (as the preset reads layers) and of the preset renderer."""
    calls: dict[str, list] = {"read_params": [], "render": []}
    read, render = compatfs.router.preset.read_params, compatfs.router.preset.render

    def reading(path, *args):
        calls["read_params"].append(path)
        return read(path, *args)

    def rendering(*args, **kwargs):
        calls["render"].append(1)
        return render(*args, **kwargs)

    monkeypatch.setattr(compatfs.router.preset, "read_params", reading)
    monkeypatch.setattr(compatfs.router.preset, "render", rendering)
    return calls


def published_tree(store: Path, tmp_path: Path, monkeypatch) -> Tree:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    tree = Tree(open_source(store), BlobViews())
    tree.publish(RootPreset.at(tmp_path / "mnt"))
    return tree


def test_a_scan_that_finds_nothing_changed_reads_no_params_and_renders_nothing(store, tmp_path, monkeypatch, counted):
    tree = published_tree(store, tmp_path, monkeypatch)
    tree.rescan()
    assert len(counted["read_params"]) == 3 and len(counted["render"]) == 1
    for key in counted:
        counted[key].clear()
    tree.rescan()
    tree.rescan()
    assert counted == {"read_params": [], "render": []}
    # One params layer changed: it alone is read again, and the preset rendered once.
    m1 = store / "manifests/registry.ollama.ai/library/m1/1b"
    set_params(store, m1, b'{"num_ctx": 4096}')
    snap = tree.rescan()
    assert counted["read_params"] == [snap.listing.folders["m1:1b"].params] and len(counted["render"]) == 1
    ref = tree.lookup("models.ini")
    assert not isinstance(ref, list) and ref is not None and "ctx-size = 4096" in ref.blob.read_text()


def test_an_idle_store_is_not_scanned_at_every_look(store, tmp_path, monkeypatch):
    tree = published_tree(store, tmp_path, monkeypatch)
    monkeypatch.setattr(Rescan, "RESCAN_SECONDS", 0.02)
    monkeypatch.setattr(Rescan, "LOOK_SECONDS", 0.02)  # looks as often as it may rescan
    monkeypatch.setattr(Rescan, "IDLE_SHARE", 1e-9, raising=False)  # the timer's scans: far apart (minutes)
    rescan = Rescan(tree, Paths())
    looks: list[float] = []
    scans: list[float] = []

    class Looks(Wakeup):
        def wait(self, timeout):
            looks.append(time.monotonic())
            return super().wait(timeout)

    rescan._kick.close()
    rescan._kick = Looks()
    scan = tree.rescan

    def scanning():
        scans.append(time.monotonic())
        return scan()

    monkeypatch.setattr(tree, "rescan", scanning)
    rescan.start(0)  # no FUSE session: nothing to tell a kernel
    try:
        deadline = time.monotonic() + 30
        while len(looks) < 25 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(looks) >= 25, "the rescan thread did not look at the store"
        # The thread's first look scans; with nothing changed, the later looks do not.
        assert len(scans) == 1, f"{len(scans)} scans in {len(looks)} looks of an idle store"
        # A model pulled meanwhile is still seen, at a look soon after.
        add_model(store, "new", llama.plain_llama_text(tmp_path / "n.gguf", seed=1), tag="1b")
        while "new:1b" not in tree.snapshot().models and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "new:1b" in tree.snapshot().models
    finally:
        rescan.stop()
