"""A store symlink whose target is on a mount whose lookups hang (a dead NFS
or sshfs server, a user's FUSE mount: here `hungfs.py`, whose getattr
sleeps for an hour): the rescan goes on (a model pulled meanwhile shows),
the other models are served, and `compatfs ls` of the store ends, naming the
path that hung (measured on 0c32945: the rescan thread, and `ls`, stuck for
as long as the mount hangs; `timeout -s KILL` did not end `ls`)."""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compatfs.testing import gemma3
from compatfs.testing.store import add_model

from conftest import needs_fuse, wait_until
from hostile import abort_fuse, bounded

pytestmark = needs_fuse

HUNGFS = Path(__file__).with_name("hungfs.py")


@pytest.fixture
def hung(tmp_path):
    """A mount whose `file` hangs every lookup of it; aborted afterwards."""
    point = tmp_path / "hung"
    proc = _hanging_mount(point)
    try:
        yield point
    finally:
        abort_fuse(point)
        proc.kill()
        proc.wait(timeout=10)


def _hanging_mount(point: Path):
    """`hungfs.py` mounted at `point` (made); its process."""
    point.mkdir(parents=True)
    proc = subprocess.Popen(
        [sys.executable, str(HUNGFS), str(point)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_until(lambda: os.path.ismount(point), seconds=20, what="the hanging mount up")
    return proc


@pytest.fixture
def store(tmp_path, hung):
    """`text:1b`, and `away:1b` whose model blob is a symlink to the hanging file."""
    root = tmp_path / "store"
    add_model(root, "text", gemma3.legacy_gemma3_text(tmp_path / "t.gguf"), tag="1b")
    digest = hashlib.sha256(b"away").hexdigest()
    (root / "blobs" / f"sha256-{digest}").symlink_to(hung / "file")
    manifest = root / "manifests/registry.ollama.ai/library/away/1b"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "layers": [
                    {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": 4}
                ],
            }
        )
    )
    return root


def test_a_hanging_symlink_stalls_neither_the_rescan_nor_other_models(store, tmp_path, hung, mount_store):
    m = mount_store(store)
    with open(m / "text:1b/model.gguf", "rb") as f:
        assert f.read(4) == b"GGUF"
    add_model(store, "pulled", gemma3.legacy_gemma3_text(tmp_path / "p.gguf", seed=3), tag="1b")
    wait_until(lambda: "pulled:1b" in os.listdir(m.path), what="a model pulled meanwhile listed")
    with open(m / "pulled:1b/model.gguf", "rb") as f:
        assert f.read(4) == b"GGUF"
    assert "did not end within" in m.log_text() or "away:1b" in os.listdir(m.path)
    assert m.alive


def test_ls_of_the_store_ends_naming_what_hung(store, hung):
    t = time.monotonic()
    res = bounded([sys.executable, "-m", "compatfs", "ls", str(store)], 60, mountpoint=hung)
    assert res.returncode == 0, res.stderr
    assert "text:1b" in res.stdout
    out = res.stdout + res.stderr
    assert "away:1b" in out and "did not end within" in out and str(hung) in out, out
    assert time.monotonic() - t < 60


def test_only_a_symlink_off_the_mount_is_looked_up_first(tmp_path, monkeypatch):
    """A store with no symlink leading off its own mount pays nothing for
    this: no helper is asked (a relative symlink inside the store is
    resolved as before); one leading onto another mount is."""
    from compatfs.files import lookup, probe

    asked: list[str] = []
    monkeypatch.setattr(lookup, "reach", lambda path, mount: asked.append(path))
    root = tmp_path / "store"
    add_model(root, "text", gemma3.legacy_gemma3_text(tmp_path / "t.gguf"), tag="1b")
    blob = next(p for p in (root / "blobs").iterdir())
    os.rename(blob, root / "blobs" / "real")
    blob.symlink_to("real")
    assert lookup.status(blob).st_size == (root / "blobs" / "real").stat().st_size
    assert asked == []
    elsewhere = Path("/dev/null")
    assert probe.mount_of(str(elsewhere)) != probe.mount_of(str(root))
    (root / "blobs" / "away").symlink_to(elsewhere)
    lookup.status(root / "blobs" / "away")
    assert asked == [str(elsewhere)]


def test_a_hanging_mount_in_a_folder_source_stalls_nothing(tmp_path, mount_store):
    """A user mounts a FUSE filesystem that stops answering in their own
    folder of a shared folder source: the folder is left out (it cannot be
    listed, naming what hung), the rest is served, a model added meanwhile
    shows, and `ls` ends."""
    shared = tmp_path / "shared"
    (shared / "alice").mkdir(parents=True)
    gemma3.legacy_gemma3_text(shared / "alice" / "alice.gguf")
    trap = shared / "mallory" / "trap"
    proc = _hanging_mount(trap)
    try:
        m = mount_store(shared)
        with open(m / "alice" / "model.gguf", "rb") as f:
            assert f.read(4) == b"GGUF"
        (shared / "bob").mkdir()
        gemma3.legacy_gemma3_text(shared / "bob" / "bob.gguf", seed=5)
        wait_until(lambda: "bob" in os.listdir(m.path), what="a model added meanwhile listed")
        res = bounded([sys.executable, "-m", "compatfs", "ls", str(shared), "--json"], 60, mountpoint=trap)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert {r["name"] for r in doc["models"]} == {"alice", "bob"}
        reasons = {r["name"]: r["reason"] for r in doc["left_out"]}
        assert "did not end within" in reasons[str(trap)], reasons
        assert m.alive
    finally:
        abort_fuse(trap)
        proc.kill()
        proc.wait(timeout=10)
