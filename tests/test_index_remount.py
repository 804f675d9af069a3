"""A remount over a warm index parses no header but, once per model blob,
where `models.ini` asks whether it is an embedding model (that flag is
checked against the header before it is published): what the mount's
start (which models show an mmproj.gguf) and `ls -l` of every model folder
(sizes, with the params layer's sampling keys too) need of each blob is in
the index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import compatfs.format.header
import compatfs.router.preset
import compatfs.view.sampling
import compatfs.view.catalog
import compatfs.view.summaries
from compatfs.files.lookup import status
from compatfs.view.index import Index
from compatfs.fuse.current import CurrentViews
from compatfs.sources.choose import open_source
from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.router.preset import RootPreset
from compatfs.tree import FileRef, Tree
from compatfs.view.catalog import BlobViews
from ggufs import synthetic_gemma3, write_gguf
from test_sampling import set_params


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    text = llama.plain_llama_text(tmp_path / "t.gguf")
    set_params(root, add_model(root, "chat", text, tag="1b"), b'{"temperature": 0.3, "top_k": 9, "num_ctx": 2048}')
    add_model(root, "plain", text, tag="1b")
    add_model(root, "vision", synthetic_gemma3(tmp_path / "g.gguf"), tag="4b")
    embed = write_gguf(
        tmp_path / "e.gguf",
        "qwen2",
        kvs={"qwen2.block_count": 1, "qwen2.pooling_type": 1},
        tensors={"token_embd.weight": np.zeros((4, 16), dtype=np.float32)},
    )
    add_model(root, "embed", embed, tag="1b")
    return root


def mount_and_list(store: Path, index: Path, mountpoint: Path) -> tuple[str, dict[str, int]]:
    """What a mount's start and `ls -l` of every model folder ask of the
    store, in-process: the published models.ini and each model file's size."""
    tree = Tree(open_source(store), BlobViews(index=Index(index, translate=True)))
    tree.publish(RootPreset.at(mountpoint))
    snap = tree.snapshot()
    presented = CurrentViews(tree)
    sizes = {}
    for name in snap.models:
        listing = tree.lookup(name)
        assert isinstance(listing, list)
        for file in listing:
            ref = tree.lookup(f"{name}/{file}")
            assert isinstance(ref, FileRef)
            size = presented.size(ref, status(ref.blob))
            assert size is not None
            sizes[f"{name}/{file}"] = size
    ref = tree.lookup("models.ini")
    assert isinstance(ref, FileRef)
    tree.views.close()  # as the daemon does at unmount: what the index learnt is written
    return ref.blob.read_text(), sizes


def test_a_remount_over_a_warm_index_parses_no_header(store, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    index = tmp_path / "index.sqlite3"
    first = mount_and_list(store, index, tmp_path / "mnt")
    compatfs.router.preset._embedding_memo.clear()  # a remount is a new daemon: nothing kept in memory
    compatfs.view.sampling.retain_layers(set())  # (every layer's reading forgotten)
    parsed = []
    real = compatfs.format.header.SourceGGUF

    def counted(path, *args, **kwargs):
        parsed.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(compatfs.format.header, "SourceGGUF", counted)  # as the preset imports it
    monkeypatch.setattr(compatfs.view.catalog, "SourceGGUF", counted)
    monkeypatch.setattr(compatfs.view.summaries, "SourceGGUF", counted)
    # The one parse a remount may make: a model blob's header, once, where
    # models.ini asks whether it is an embedding model (`BlobViews.embedding`:
    # the index's flag is checked before it reaches models.ini).
    checks: list[Path] = []
    real_parsing = BlobViews._parsing

    def parsing(self, path: Path, why: str) -> None:
        if why == "a check of its embedding flag":
            checks.append(path)
        real_parsing(self, path, why)

    monkeypatch.setattr(BlobViews, "_parsing", parsing)
    again = mount_and_list(store, index, tmp_path / "mnt")
    assert len(checks) == len(set(checks)) and sorted(parsed) == sorted(checks), (
        f"headers parsed on the remount: {parsed} (of which checks of the embedding flag: {checks})"
    )
    assert again == first
    text, sizes = again
    embed = text.split("[embed@1b]", 1)[1].split("\n\n", 1)[0]
    assert "embeddings = true" in embed and "embeddings" not in text.split("[chat@1b]", 1)[1].split("\n\n", 1)[0]
    assert "mmproj = " in text.split("[vision@4b]", 1)[1].split("\n\n", 1)[0]
    # The params layer's sampling keys make chat's model.gguf larger than the blob's own view.
    assert sizes["chat:1b/model.gguf"] > sizes["plain:1b/model.gguf"]
