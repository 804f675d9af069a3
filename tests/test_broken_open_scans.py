"""A failed open of a blob already known to be broken does not rescan the
store: opening it in a loop costs no scan, until something changes."""

from __future__ import annotations

import errno
import os
from types import SimpleNamespace

import pytest

from compatfs.files.access import Caller
from compatfs.fuse import libfuse
from compatfs.fuse.operations import CompatFS
from compatfs.sources.ollama import OllamaStore
from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.tree import Tree
from compatfs.view.catalog import BlobViews
from test_hostile_mount import blob_of

PATH = "/broken:1b/model.gguf"


@pytest.fixture
def broken(tmp_path, monkeypatch):
    """A CompatFS, in process, over a store whose model broken:1b has a blob
    that is not a GGUF file; `scans` counts the store scans after the first."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(libfuse, "caller", lambda: Caller(os.getuid(), os.getgid(), os.getpid()))
    good = llama.plain_llama_text(tmp_path / "good.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    store = tmp_path / "store"
    add_model(store, "broken", bad, tag="1b")
    add_model(store, "fine", good, tag="1b")
    source = OllamaStore(store)
    (tmp_path / "mnt").mkdir()
    fs = CompatFS(Tree(source, BlobViews(), rescan_seconds=3600), str(tmp_path / "mnt"))
    fs.tree.snapshot()
    scans: list[int] = []
    scan = source.scan
    monkeypatch.setattr(source, "scan", lambda: scans.append(1) or scan())
    return SimpleNamespace(fs=fs, store=store, scans=scans, good=good)


def _open(fs: CompatFS, path: str = PATH) -> int:
    fi = SimpleNamespace(flags=os.O_RDONLY, keep_cache=0, fh=0)
    assert fs.open(path, fi) == 0
    return fi.fh


def test_opening_a_known_broken_blob_again_and_again_scans_nothing(broken):
    for _ in range(5):
        with pytest.raises(OSError) as e:
            _open(broken.fs)
        assert e.value.errno == errno.EIO
    assert broken.scans == []
    # Pulled again (a new blob, the manifest naming it, the broken one removed):
    # the next open finds the blob gone, looks, and serves the new one.
    old = blob_of(broken.store, "broken", "1b")
    add_model(broken.store, "broken", broken.good, tag="1b")
    old.unlink()
    fh = _open(broken.fs)
    assert len(broken.scans) == 1
    broken.fs.release(PATH, SimpleNamespace(fh=fh))
