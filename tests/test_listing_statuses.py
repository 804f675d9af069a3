"""`stat` and `readdir` of a model's files answer from the blobs' statuses
the last scan of the store took (`BlobViews.saw`): no blob path is resolved
again per request, and what they answer is what the blob was at that scan
(an index entry of another identity is not taken for it)."""

from __future__ import annotations

import os

import pytest

from compatfs.files import lookup
from compatfs.fuse.operations import CompatFS
from compatfs.testing import llama
from compatfs.testing.store import add_model
from hostile import vision_and_text_store
from test_sampling import set_params


@pytest.fixture
def fs(tmp_path, store_fs) -> CompatFS:
    store = vision_and_text_store(tmp_path)
    text = llama.plain_llama_text(tmp_path / "t.gguf")
    set_params(store, add_model(store, "chat", text, tag="1b"), b'{"temperature": 0.3, "num_ctx": 2048}')
    return store_fs(store)


def _ls_l(fs: CompatFS) -> dict[str, int]:
    """What `ls -l` of every model folder asks: each folder's attributes and
    listing, each file's attributes; the files' sizes."""
    sizes = {}
    for name in fs.tree.snapshot().models:
        fs.getattr(f"/{name}")
        for entry in fs.readdir(f"/{name}", None):
            leaf = entry if isinstance(entry, str) else entry[0]
            if leaf not in (".", ".."):
                sizes[f"{name}/{leaf}"] = fs.getattr(f"/{name}/{leaf}")["st_size"]
    return sizes


def test_listing_resolves_no_model_blob_path_again(fs, monkeypatch):
    ggufs = {str(p) for p in fs.tree.snapshot().ggufs}
    walked: list[str] = []
    real = lookup._walk

    def counted(path, caller):
        walked.append(os.fspath(path))
        return real(path, caller)

    first = _ls_l(fs)  # (sizes with the params layer's sampling keys: counted from the header once)
    fs._paths.forget()  # what the FUSE layer remembered of its answers: asked again
    monkeypatch.setattr(lookup, "_walk", counted)
    sizes = _ls_l(fs)
    assert sizes == first
    assert {"chat:1b/model.gguf", "vision:4b/model.gguf", "vision:4b/mmproj.gguf"} <= set(sizes)
    assert all(size > 0 for size in sizes.values())
    assert ggufs and not ggufs & set(walked), walked


def test_what_the_scan_saw_is_answered_until_the_next_scan(fs):
    ref = fs.tree.lookup("chat:1b/model.gguf")
    seen = fs.tree.views.seen(ref.blob)
    assert seen is not None and (seen.st_dev, seen.st_ino) == (os.stat(ref.blob).st_dev, os.stat(ref.blob).st_ino)
    before = fs.getattr("/chat:1b/model.gguf")
    # The blob rewritten in place: the next scan's statuses are answered from.
    data = ref.blob.read_bytes()
    ref.blob.write_bytes(data)
    os.utime(ref.blob, ns=(1, 1))
    fs.tree.rescan()
    after = fs.tree.views.seen(ref.blob)
    assert after is not None and after.st_mtime_ns == 1 and before["st_size"] == _ls_l(fs)["chat:1b/model.gguf"]


def test_a_blob_that_left_is_seen_no_more(fs):
    ref = fs.tree.lookup("chat:1b/model.gguf")
    fs.tree.views.retain(set())
    assert fs.tree.views.seen(ref.blob) is None


def test_a_summary_resolves_its_blob_path_once(tmp_path, monkeypatch):
    from compatfs.view.summaries import summarize

    blob = llama.plain_llama_text(tmp_path / "t.gguf")
    walked: list[str] = []
    real = lookup._walk
    monkeypatch.setattr(lookup, "_walk", lambda path, caller: walked.append(os.fspath(path)) or real(path, caller))
    stamp, summary = summarize(blob, True)
    assert walked == [str(blob)] and summary.model_size > 0 and stamp[2] == blob.stat().st_size
