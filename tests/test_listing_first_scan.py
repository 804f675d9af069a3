"""A mount's first scan makes models.ini, which needs every blob's summary
(a header parsed where the index has none): the indexing workers are handed
every new blob before models.ini is made, in the opposite order, so that
they and the scan meet halfway; every summary is then made once, and
models.ini names every model."""

from __future__ import annotations

from pathlib import Path

from compatfs.router.preset import RootPreset
from compatfs.sources.choose import open_source
from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.tree import Tree
from compatfs.view.catalog import BlobViews


def test_the_first_scan_hands_the_workers_every_blob_before_models_ini(tmp_path: Path, monkeypatch):
    store = tmp_path / "store"
    for i in range(12):
        add_model(store, f"m{i:02d}", llama.plain_llama_text(tmp_path / f"t{i}.gguf", seed=i), tag="1b")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    views = BlobViews(workers=2)
    tree = Tree(open_source(store), views)
    preset = RootPreset.at(tmp_path / "mnt")
    assert preset is not None
    tree.publish(preset)
    handed: list[list[Path]] = []
    made: list[int] = []  # how many blobs had been handed to the workers when models.ini was made
    prefetch, files = views.prefetch, preset.files

    def handing(paths):
        handed.append(list(paths))
        return prefetch(paths)

    def making(*args):
        made.append(len(handed))
        return files(*args)

    monkeypatch.setattr(views, "prefetch", handing)
    monkeypatch.setattr(preset, "files", making)
    try:
        snap = tree.snapshot()
        assert made == [1], (made, handed)
        assert handed[0] == list(reversed(snap.ggufs)) and len(handed[0]) == 12
        text = tree.lookup("models.ini")
        assert text is not None and not isinstance(text, list)
        assert all(f"[m{i:02d}@1b]" in text.blob.read_text() for i in range(12))
        assert all(views.index.get(p, views._stamp(p)) is not None for p in snap.ggufs)
    finally:
        views.close()
        tree.unpublish()
