"""What `ls -l` of every model folder costs the daemon once it has forgotten
its answers (a remount, a rescan that saw a change): each folder's entries
come from one look at the tree, and a model folder's blob summary is looked
at once per listing of it, not once per request about it (a folder without
a projector GGUF has mmproj.gguf only if its blob's summary says so)."""

from __future__ import annotations

import collections
import ctypes

import pytest

from compatfs.fuse import libfuse
from compatfs.fuse.libfuse import fuse
from compatfs.fuse.operations import CompatFS
from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.tree import Tree
from compatfs.view.catalog import BlobViews

_MODELS = ("alpha", "beta", "gamma", "delta")


@pytest.fixture
def fs(tmp_path, store_fs) -> CompatFS:
    store = tmp_path / "store"
    blob = llama.plain_llama_text(tmp_path / "t.gguf")
    for name in _MODELS:
        add_model(store, name, blob, tag="1b")
    return store_fs(store)


def _ls_l_everything(fs: CompatFS) -> dict[str, dict[bytes, int]]:
    """What the kernel asks for `ls -l` of every model folder (READDIRPLUS:
    each listing with its entries' attributes, as `libfuse.FUSE` answers it):
    each folder's entries with their inode numbers."""
    loop = object.__new__(libfuse.FUSE)
    loop.operations, loop.encoding, loop.errors, loop.use_ns = fs, "utf-8", "surrogateescape", True
    fi = fuse.fuse_file_info()
    out: dict[str, dict[bytes, int]] = {}
    for folder in ["/", *(f"/{name}:1b" for name in _MODELS)]:
        got: dict[bytes, int] = {}

        def filler(buf, name, st, offset, flags, got=got):
            got[name] = st.st_ino
            return 0

        loop.opendir(folder.encode(), ctypes.pointer(fi))
        loop.readdir_fuse_3(folder.encode(), None, filler, 0, ctypes.pointer(fi), libfuse.FUSE_READDIR_PLUS)
        out[folder] = got
    return out


def test_each_folder_is_looked_at_once(fs, monkeypatch):
    counted: collections.Counter = collections.Counter()
    for name in ("lookup", "entries"):
        real = getattr(Tree, name, None)
        if real is None:
            continue

        def counting(self, path, real=real, name=name):
            counted[name, path.strip("/")] += 1
            return real(self, path)

        monkeypatch.setattr(Tree, name, counting)
    has_mmproj = BlobViews.has_mmproj

    def summaries(self, path):
        counted["has_mmproj"] += 1
        return has_mmproj(self, path)

    monkeypatch.setattr(BlobViews, "has_mmproj", summaries)
    listed = _ls_l_everything(fs)
    assert set(listed["/"]) >= {f"{name}:1b".encode() for name in _MODELS}
    for name in _MODELS:
        folder = f"{name}:1b"
        assert set(listed[f"/{folder}"]) == {b".", b"..", b"model.gguf"}
        assert listed[f"/{folder}"][b"model.gguf"] == fs.getattr(f"/{folder}/model.gguf")["st_ino"]
        assert listed["/"][folder.encode()] == listed[f"/{folder}"][b"."] == fs.getattr(f"/{folder}")["st_ino"]
        assert counted["lookup", folder] == 0, counted
        assert counted["entries", folder] == 1, counted
    assert counted["has_mmproj"] == len(_MODELS), counted
