"""What an open file serves is one snapshot of the store: its size, bytes and
identity from the blob it opened; the daemon never asks its own mount for
anything; a store folder that disappears reads as gone."""

import errno
import os
import signal
import threading
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compatfs.testing import gemma3, llama
from compatfs.testing.store import add_model

from conftest import needs_fuse, wait_until
from test_hostile_mount import blob_of, expected
import contextlib

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
    with contextlib.suppress(OSError):
        (conns / device.split(":")[1] / "abort").write_text("1")


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
    manifest.write_text(
        '{"layers": [{"mediaType": "application/vnd.ollama.image.model", '
        f'"digest": "sha256:{"ab" * 32}", "size": 0}}]}}'
    )
    log = open(tmp_path / "mnt.log", "wb")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "compatfs", "mount", "-f", "-v", str(store), str(mnt)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "COMPATFS_CACHE_DIR": str(tmp_path / "cache")},
    )
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
        time.sleep(0.05)  # a ctime the rewrite must move
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
    wait_until(lambda: path.read_bytes() == new, what="new opens serving the rewritten blob")
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
    wait_until(lambda: os.listdir(m.path) == [], seconds=4, what="an empty listing")
    time.sleep(1.5)  # on purpose: the listing stays empty through a rescan or more
    assert os.listdir(m.path) == []  # never PermissionError
    assert m.alive


def test_reads_during_re_pulls_are_one_view_each(store, mount_store, tmp_path):
    """A model pulled again every 50 ms (a new blob written beside and
    renamed into place, as a pull does, the manifest renamed over it, the
    blob before last removed) while 3 readers open and
    read it whole, 10 s.  Measured on the landed code: reads with one view's
    size and another blob's bytes, short reads, and opens failing with an
    errno though the path always named a model.  Every read is now exactly
    one of the views, as long as the size its open showed, and no open fails."""
    sources = [
        gemma3.legacy_gemma3_text(tmp_path / "a.gguf", seed=1),
        llama.plain_llama_text(tmp_path / "b.gguf"),
        gemma3.legacy_gemma3_vision(tmp_path / "c.gguf", seed=2),
    ]
    views = {}
    for src in sources:
        add_model(store, "churn", src, tag="1b")
        b = blob_of(store, "churn", "1b")
        views[b.name] = expected(b)
    assert len({len(v) for v in views.values()}) == 3
    contents = {name: (store / "blobs" / name).read_bytes() for name in views}
    manifest = store / "manifests/registry.ollama.ai/library/churn/1b"
    layout = manifest.read_text()
    current = blob_of(store, "churn", "1b").name
    m = mount_store(store)
    path = m / "churn:1b/model.gguf"
    assert path.read_bytes() == views[current]
    stop = threading.Event()
    counts = {"reads": 0, "mixed": 0, "short": 0, "errors": 0}
    seen = []

    def reader():
        while not stop.is_set():
            try:
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    data = f.read()
            except OSError as e:
                counts["errors"] += 1
                seen.append(repr(e))
                continue
            counts["reads"] += 1
            if data not in views.values():
                counts["mixed"] += 1
            elif len(data) != size:
                counts["short"] += 1

    def repull():
        names = list(views)
        i = names.index(current)
        while not stop.is_set():
            old, i = names[i], (i + 1) % len(names)
            new = names[i]
            partial = store / "blobs" / f"{new}-partial"  # pulled anew, as a pull writes it: a file of its
            partial.write_bytes(contents[new])  # own, renamed into place (the first one over a blob of that name)
            os.replace(partial, store / "blobs" / new)
            tmp = manifest.with_name(".1b.tmp")
            tmp.write_text(layout.replace(current_digest(layout), new.replace("-", ":")))
            os.replace(tmp, manifest)
            gone = store / "blobs" / names[(i + 1) % len(names)]  # neither the new nor the one before
            gone.unlink(missing_ok=True)
            del old
            time.sleep(0.05)  # on purpose: a re-pull every 50 ms

    threads = [threading.Thread(target=reader) for _ in range(3)] + [threading.Thread(target=repull)]
    for t in threads:
        t.start()
    time.sleep(10)  # on purpose: readers and re-pulls race for 10 s
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert counts["reads"] > 50, counts
    assert counts["mixed"] == counts["short"] == counts["errors"] == 0, (counts, seen[:3])
    assert m.alive


def current_digest(layout: str) -> str:
    import json

    return json.loads(layout)["layers"][0]["digest"]
