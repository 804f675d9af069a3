"""What an open file serves is one snapshot of the store: its size, bytes and
identity from the blob it opened; the daemon never asks its own mount for
anything; a store folder that disappears reads as gone."""
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compatfs.testing import gemma3, llama
from compatfs.testing.store import add_model

from conftest import needs_fuse
from test_hostile_mount import blob_of, expected, wait_for

pytestmark = needs_fuse


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    add_model(root, "text", gemma3.legacy_gemma3_text(tmp_path / "g.gguf"), tag="1b")
    add_model(root, "other", llama.plain_llama_text(tmp_path / "p.gguf"), tag="1b")
    return root


def _device(path: Path) -> str | None:
    """The FUSE connection mounted at `path` (its device), from mountinfo:
    nothing here asks the mount itself, which may be stuck."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == str(path):
            return fields[2]
    return None


def _abort(device: str) -> None:
    """Abort a FUSE connection through fusectl (mounted for it if need be):
    a daemon stuck in a request to itself cannot end otherwise."""
    conns = Path("/sys/fs/fuse/connections")
    if not any(conns.iterdir()):
        subprocess.run(["mount", "-t", "fusectl", "none", str(conns)], capture_output=True)
    try:
        (conns / device.split(":")[1] / "abort").write_text("1")
    except OSError:
        pass


def _finished(proc: subprocess.Popen, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return proc.poll() is not None


@pytest.mark.skipif(os.getuid() != 0, reason="needs root (a stuck connection is cleaned up through fusectl)")
def test_a_blob_that_points_into_the_mount_is_refused(store, tmp_path):
    """The landed code deadlocked at start-up (`compatfs mount` never
    returned, a SIGKILL left a thread in D state): it looked the blob up in
    its own mount.  Now the blob is refused in one line, the mount lives and
    ends on SIGTERM.  Everything that could hang is a child process watched
    with a deadline; a stuck connection is aborted."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    blob = blob_of(store, "text", "1b")
    looped = store / "blobs" / ("sha256-" + "ab" * 32)
    looped.symlink_to(mnt / "blobs" / blob.name / "model.gguf")
    manifest = store / "manifests/registry.ollama.ai/library/loop/latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text('{"layers": [{"mediaType": "application/vnd.ollama.image.model", '
                        f'"digest": "sha256:{"ab" * 32}", "size": 0}}]}}')
    log = open(tmp_path / "mnt.log", "wb")
    daemon = subprocess.Popen([sys.executable, "-m", "compatfs", "mount", "-f", "-v", str(store), str(mnt)],
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              env={**os.environ, "COMPATFS_CACHE_DIR": str(tmp_path / "cache")})
    device = None
    try:
        deadline = time.monotonic() + 20
        while device is None and time.monotonic() < deadline and daemon.poll() is None:
            time.sleep(0.1)
            device = _device(mnt)
        assert device is not None, (tmp_path / "mnt.log").read_text()
        probe = subprocess.Popen(["ls", "-lR", str(mnt)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert _finished(probe, 20), "a listing of the mount hangs"
        assert probe.returncode == 0
        assert (mnt / "loop:latest/model.gguf").stat().st_size == 0
        with pytest.raises(OSError) as e:
            (mnt / "loop:latest/model.gguf").read_bytes()
        assert e.value.errno == errno.EIO
        assert (mnt / "text:1b/model.gguf").read_bytes() == expected(blob)
        text = (tmp_path / "mnt.log").read_text()
        assert "compatfs's own mount" in text and looped.name in text
        daemon.send_signal(signal.SIGTERM)
        assert _finished(daemon, 15) and daemon.returncode == 0
        assert _device(mnt) is None
    finally:
        if daemon.poll() is None:
            daemon.kill()
        if not _finished(daemon, 5) and device is not None:
            _abort(device)
        if _device(mnt) is not None:
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        _finished(daemon, 10)
        log.close()


def test_a_blob_rewritten_in_place_with_its_mtime_restored(store, mount_store, tmp_path):
    """`cp -p`, `rsync --inplace -t`, `touch -r`: same inode, same size, the
    old mtime.  The landed identity (device, inode, size, mtime) took it for
    the same blob: an open file served the new bytes, the index entry was
    trusted.  ctime is part of the identity now."""
    m = mount_store(store)
    blob = blob_of(store, "text", "1b")
    old = expected(blob)
    path = m / "text:1b/model.gguf"
    # Same size, other bytes: another seed of the same writer.
    data = gemma3.legacy_gemma3_text(tmp_path / "g2.gguf", seed=9).read_bytes()
    assert len(data) == blob.stat().st_size and data != blob.read_bytes()
    before = blob.stat()
    with open(path, "rb", buffering=0) as f:
        assert f.read(4096) == old[:4096]
        time.sleep(0.05)   # a ctime the rewrite must move
        with open(blob, "r+b") as w:
            w.write(data)
        os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = blob.stat()
        assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
        f.seek(len(old) // 2)
        with pytest.raises(OSError) as e:
            f.read(4096)
        assert e.value.errno == errno.EIO
    new = expected(blob)
    assert new != old
    wait_for(lambda: path.read_bytes() == new, what="new opens serving the rewritten blob")
    m.close()
    # A remount over the same index: the entry of the old bytes is not trusted.
    m2 = mount_store(store, env={"COMPATFS_CACHE_DIR": str(m.path.parent / (m.path.name + ".cache"))})
    assert (m2 / "text:1b/model.gguf").read_bytes() == new
    assert (m2 / "text:1b/model.gguf").stat().st_size == len(new)


def test_a_removed_store_folder_reads_as_gone(store, mount_store):
    """The landed code answered a listing of a store whose manifests folder
    was removed with EACCES, as if the caller were not allowed; ENOENT now
    (which readdir(3) takes for the end of the folder: an empty listing)."""
    m = mount_store(store)
    assert "text:1b" in os.listdir(m.path)
    (store / "manifests").rename(store.parent / "manifests.away")
    wait_for(lambda: os.listdir(m.path) == [], seconds=4, what="an empty listing")
    time.sleep(1.5)
    assert os.listdir(m.path) == []     # never PermissionError
    assert m.alive
