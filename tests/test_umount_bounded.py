"""`compatfs umount` returns whatever state the daemon is in: a stopped
(or wedged) daemon is waited on for a bounded time, then its FUSE
connection is aborted and the mount detached.  Measured before: it never
returned (it stat'ed the mount)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from compatfs.files.mounttable import last_at
from compatfs.testing.gemma3 import legacy_gemma3_text
from compatfs.testing.store import add_model

from conftest import needs_fuse


@needs_fuse
def test_umount_of_a_stopped_daemon_returns_and_detaches(tmp_path, mount_store):
    store = tmp_path / "store"
    add_model(store, "g", legacy_gemma3_text(tmp_path / "g.gguf"), tag="1b")
    m = mount_store(store)
    # A file left open on it, as a server would, by another process (this
    # one must hold nothing there: starting a process closes descriptors,
    # and closing one waits on the daemon).
    with open(m / "g:1b/model.gguf", "rb") as f:
        reader = subprocess.Popen(["sleep", "600"], stdin=f)
    os.kill(m.proc.pid, signal.SIGSTOP)
    try:
        res = subprocess.run(
            [sys.executable, "-m", "compatfs", "umount", str(m.path)], capture_output=True, text=True, timeout=60
        )  # never returned before
        assert res.returncode == 0, res.stderr
        assert "did not answer" in res.stderr, res.stderr
        if os.path.isdir("/sys/fs/fuse/connections") and os.listdir("/sys/fs/fuse/connections"):
            assert "aborted its FUSE connection" in res.stderr, res.stderr
        assert last_at(m.path) is None
    finally:
        os.kill(m.proc.pid, signal.SIGCONT)
        reader.kill()
        reader.wait()
    m.proc.wait(timeout=30)  # its connection gone, the daemon ends


@needs_fuse
def test_umount_of_an_answering_mount_still_unmounts_it(tmp_path, mount_store):
    store = tmp_path / "store"
    add_model(store, "g", legacy_gemma3_text(tmp_path / "g.gguf"), tag="1b")
    m = mount_store(store)
    res = subprocess.run(
        [sys.executable, "-m", "compatfs", "umount", str(m.path)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert last_at(m.path) is None
    m.proc.wait(timeout=30)
