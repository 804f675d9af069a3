"""What a rescan and a listing resolve: a rescan reads each manifest's status
from its own walk of `manifests/` (deciding which names every caller may see
resolves no manifest path again), and a folder's attributes come from its
owner's status as the scan found it (no path resolved per folder), yet a
change of that owner shows after the next scan."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
import os
import stat

import pytest

from compatfs.files import lookup
from compatfs.files.access import Caller
from compatfs.fuse import libfuse
from compatfs.fuse.libfuse import fuse
from compatfs.fuse.operations import CompatFS
from compatfs.sources.ollama import OllamaStore
from compatfs.testing import llama
from compatfs.testing.store import add_model
from compatfs.tree import Tree
from compatfs.view.catalog import BlobViews
from conftest import wait_until


def _fs(base, monkeypatch) -> CompatFS:
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))
    monkeypatch.setattr(libfuse, "caller", lambda: Caller(os.getuid(), os.getgid(), os.getpid()))
    store = base / "store"
    blob = llama.plain_llama_text(base / "t.gguf")
    for name in ("alpha", "beta", "gamma"):
        add_model(store, name, blob, tag="1b")
    for p in [store, *store.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    (base / "mnt").mkdir()
    fs = CompatFS(Tree(OllamaStore(store), BlobViews(), rescan_seconds=3600), str(base / "mnt"))
    fs.tree.snapshot()
    return fs


@pytest.fixture
def fs(tmp_path, monkeypatch) -> CompatFS:
    return _fs(tmp_path, monkeypatch)


@pytest.fixture
def walked(monkeypatch) -> list[str]:
    """The paths resolved from now on (`lookup._walk`)."""
    out: list[str] = []
    real = lookup._walk

    def counted(path, caller):
        out.append(os.fspath(path))
        return real(path, caller)

    monkeypatch.setattr(lookup, "_walk", counted)
    return out


@contextlib.contextmanager
def _rescanning(fs: CompatFS) -> Iterator[None]:
    """The rescan thread running on `fs` (a session never dereferenced:
    `told` records what it sends), its first look made."""
    fs._rescan.start(1)
    try:
        wait_until(lambda: fs._rescan.rescans >= 1, what="the first look")
        yield
    finally:
        fs._rescan.stop()


@pytest.fixture
def told(monkeypatch) -> list[str]:
    """The paths the kernel is told to drop, in order."""
    sent: list[str] = []
    monkeypatch.setattr(libfuse, "invalidate_path", lambda session, path: sent.append(path) or 0)
    return sent


def test_a_rescan_resolves_no_manifest_path_again(fs, walked):
    manifests = {str(p) for f in fs.tree.snapshot().listing.folders.values() for p in f.told_by[-1:]}
    assert len(manifests) == 3
    fs.tree.rescan()
    assert not manifests & set(walked), walked
    names = set(fs.tree.snapshot().models)
    assert names == {"alpha:1b", "beta:1b", "gamma:1b"}


def test_a_hidden_manifest_is_still_left_out(open_tmp, monkeypatch):
    """The scan's statuses decide as a walk would: a manifest made unreadable
    to others (who may list the folder its model's folder mirrors) is left
    out at the next scan, shown again once readable."""
    if os.getuid() != 0:
        pytest.skip("needs root (a manifest root reads, others may not)")
    fs = _fs(open_tmp, monkeypatch)
    manifest = next(p for f in fs.tree.snapshot().listing.folders.values() for p in f.told_by[-1:] if "beta" in str(p))
    manifest.chmod(0o600)
    fs.tree.rescan()
    assert "beta:1b" not in fs.tree.snapshot().models
    manifest.chmod(0o644)
    fs.tree.rescan()
    assert "beta:1b" in fs.tree.snapshot().models


def test_folder_attributes_resolve_no_path(fs, walked):
    attrs = {name: fs.getattr(f"/{name}") for name in ("", "alpha:1b", "beta:1b", "blobs")}
    assert not walked, walked
    assert all(stat.S_ISDIR(a["st_mode"]) for a in attrs.values())


def test_a_changed_owner_shows_after_the_next_scan(fs):
    manifests = fs.tree.source.root / "manifests"
    before = fs.getattr("/alpha:1b")["st_mode"] & 0o777
    manifests.chmod(0o750)
    fs.tree.rescan()
    fs._paths.forget()  # (the rescan thread does this when it sees the change)
    after = fs.getattr("/alpha:1b")["st_mode"] & 0o777
    assert before != after == 0o550
    assert fs.getattr("/")["st_mode"] & 0o777 == 0o550


def test_a_pull_tells_the_kernel_only_what_changed(tmp_path, monkeypatch, told):
    """A model pulled and another pulled again: the kernel is told to drop
    the root, blobs/, the new folder and the re-pulled model's folder and
    files, and nothing of untouched models (a pull moves the time of blobs/,
    not what the folders mirroring the store show); the re-pulled file is
    answered with its new size, the untouched ones as before."""
    fs = _fs(tmp_path, monkeypatch)
    untouched = ["/alpha:1b", "/alpha:1b/model.gguf", "/gamma:1b", "/gamma:1b/model.gguf"]
    before = {p: fs.getattr(p) for p in [*untouched, "/beta:1b/model.gguf"]}
    with _rescanning(fs):
        store = fs.tree.source.root
        add_model(store, "delta", llama.plain_llama_text(tmp_path / "d.gguf", seed=3), tag="1b")
        bigger = tmp_path / "b.gguf"
        bigger.write_bytes(llama.plain_llama_text(tmp_path / "t2.gguf").read_bytes() + bytes(4096))
        add_model(store, "beta", bigger, tag="1b")
        wait_until(lambda: "/delta:1b" in told and "/beta:1b/model.gguf" in told, what="the pull and re-pull seen")
        after = {p: fs.getattr(p) for p in [*untouched, "/beta:1b/model.gguf"]}
    assert not set(untouched) & set(told), sorted(told)
    assert {"/", "/blobs", "/delta:1b", "/beta:1b", "/beta:1b/model.gguf"} <= set(told), sorted(told)
    assert "//models.ini" not in told

    def shown(attrs: dict) -> dict:
        return {k: v for k, v in attrs.items() if k != "st_atime"}  # (a blob read moves its atime: not told)

    assert all(shown(after[p]) == shown(before[p]) for p in untouched), [(before[p], after[p]) for p in untouched]
    assert after["/beta:1b/model.gguf"]["st_size"] == before["/beta:1b/model.gguf"]["st_size"] + 4096


def test_an_owner_opened_or_closed_has_every_folder_mirroring_it_told(tmp_path, monkeypatch, told):
    fs = _fs(tmp_path, monkeypatch)
    with _rescanning(fs):
        (fs.tree.source.root / "manifests").chmod(0o750)
        wait_until(lambda: "/alpha:1b" in told, what="the change seen")
        wait_until(lambda: fs.getattr("/gamma:1b")["st_mode"] & 0o777 == 0o550, what="the new mode answered")
    assert {"/", "/alpha:1b", "/beta:1b", "/gamma:1b"} <= set(told), sorted(told)
    assert not {p for p in told if p.startswith("/blobs/")}, sorted(told)  # (they mirror blobs/)


def test_a_rescan_keeps_the_files_of_unchanged_folders(fs, tmp_path):
    first = fs.tree.snapshot()
    add_model(fs.tree.source.root, "delta", llama.plain_llama_text(tmp_path / "d.gguf", seed=3), tag="1b")
    second = fs.tree.rescan()
    assert second.files["alpha:1b"] is first.files["alpha:1b"]  # made once
    assert set(second.files["delta:1b"]) == {"model.gguf"} and "delta:1b" not in first.files


def test_a_changed_folder_is_dropped_again_at_the_next_look(tmp_path, monkeypatch, told):
    """The kernel keeps listings: a listing made just before a change, whose
    reply reaches the kernel after the rescan dropped the folder, is dropped
    by a second drop at the next look."""
    fs = _fs(tmp_path, monkeypatch)
    with _rescanning(fs):
        add_model(fs.tree.source.root, "delta", llama.plain_llama_text(tmp_path / "d.gguf", seed=3), tag="1b")
        wait_until(lambda: told.count("/") >= 2 and told.count("/delta:1b") >= 2, what="the second drop")
    assert told.count("/delta:1b/model.gguf") == 1  # (a file's attributes: the kernel discards a reply made before)


def test_a_listing_of_blobs_with_attributes_resolves_no_path(fs, walked):
    """What READDIRPLUS of blobs/ gives for each blob's folder (its time is
    its blob's, as the last scan found it) resolves no path."""
    entries = [e[0] for e in fs.readdir("/blobs", None) if e[0] not in (".", "..")]
    attrs = [fs.getattr(f"/blobs/{name}") for name in entries]  # (what entry_attrs gives)
    assert entries and not walked, walked
    blob = fs.tree.snapshot().listing.folders[f"blobs/{entries[0]}"].model
    assert attrs[0] is not None and attrs[0]["st_mtime"] == os.stat(blob).st_mtime_ns


def test_a_folder_gone_from_the_store_lists_for_nobody_but_root(open_tmp, monkeypatch):
    """Until the next scan drops it, a mounted folder whose store folder is
    gone is refused to every caller but root, as any folder its caller may
    not list (the kernel keeps listings: who may list is decided at opendir)."""
    import shutil

    fs = _fs(open_tmp, monkeypatch)
    shutil.rmtree(fs.tree.owner("alpha:1b"))
    assert fs.opendir("/alpha:1b") == 0  # root
    monkeypatch.setattr(libfuse, "caller", lambda: Caller(65534, 65534, os.getpid()))
    with pytest.raises(fuse.FuseOSError) as refused:
        fs.opendir("/alpha:1b")
    assert refused.value.errno == errno.ENOENT
