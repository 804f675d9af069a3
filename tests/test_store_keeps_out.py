"""An Ollama store never has the daemon look into its own mount: a mountpoint
inside the store is refused, a blob folder's time is read as every store
path is (never through a symlink into the mount), and the rescan's watches
are added without following a symlink into it (on 0c32945 the mount was
made under `manifests/`, `mtime` stat-ed through the symlink and inotify
followed it)."""

import os
import subprocess
import sys

from compatfs.files import blobfile
from compatfs.files.watch import Watch
from compatfs.sources.ollama import OllamaStore
from compatfs.testing import gemma3
from compatfs.testing.store import add_model


def _kept_out(tmp_path, monkeypatch):
    """A folder standing for compatfs's own mount, kept out of."""
    mnt = tmp_path / "mnt"
    (mnt / "inside").mkdir(parents=True)
    monkeypatch.setenv(blobfile.KEEP_OUT_ENV, "[]")
    blobfile.keep_out(mnt)
    return mnt


def test_a_mountpoint_inside_the_store_is_refused(tmp_path):
    store = tmp_path / "store"
    add_model(store, "text", gemma3.legacy_gemma3_text(tmp_path / "t.gguf"), tag="1b")
    for inside in (store / "manifests" / "mnt", store / "blobs" / "mnt", store):
        inside.mkdir(exist_ok=True)
        try:
            res = subprocess.run(
                [sys.executable, "-m", "compatfs", "mount", str(store), str(inside)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert res.returncode != 0 and "inside the store" in res.stderr, (inside, res.stderr)
            assert not os.path.ismount(inside)
        finally:
            if os.path.ismount(inside):
                subprocess.run(["fusermount3", "-u", str(inside)], capture_output=True)
    assert OllamaStore(store).refuses_mountpoint(tmp_path / "elsewhere") is None


def test_a_blob_folders_time_is_not_read_through_the_mount(tmp_path, monkeypatch):
    mnt = _kept_out(tmp_path, monkeypatch)
    store = tmp_path / "store"
    add_model(store, "text", gemma3.legacy_gemma3_text(tmp_path / "t.gguf"), tag="1b")
    src = OllamaStore(store)
    listing = src.scan()
    folder = next(d for d, f in listing.folders.items() if not f.is_model)
    blob = listing.folders[folder].model
    (mnt / "inside" / "blob").write_bytes(blob.read_bytes())
    os.utime(mnt / "inside" / "blob", ns=(1, 10**18))
    blob.unlink()
    blob.symlink_to(mnt / "inside" / "blob")
    assert src.mtime(folder, listing, 7) == 7


def test_watches_follow_no_symlink_into_the_mount(tmp_path, monkeypatch):
    mnt = _kept_out(tmp_path, monkeypatch)
    (tmp_path / "into").symlink_to(mnt / "inside")
    (tmp_path / "plain").mkdir()
    w = Watch.open()
    assert w is not None
    try:
        assert w.follow({tmp_path / "into", tmp_path / "plain"})
        assert set(w._watched) == {str(tmp_path / "plain")}
        (mnt / "inside" / "x").write_bytes(b"")
        assert not w.changed()
        (tmp_path / "plain" / "x").write_bytes(b"")
        assert w.changed()
    finally:
        w.close()
