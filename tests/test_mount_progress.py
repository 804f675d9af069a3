"""`compatfs mount` on a terminal shows a bar of the store's GGUF blobs the
index holds while the mount comes up; `-q`, or stderr that is not a
terminal, shows none."""

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

from compatfs.testing.llama import plain_llama_text
from compatfs.testing.store import add_model
from conftest import needs_fuse


def mount(store, mnt, index, *extra, tty: bool) -> str:
    """Run `compatfs mount` in the background mode (stderr a terminal when
    `tty`), then unmount; what it wrote on stderr."""
    mnt.mkdir()
    if tty:
        main, sub = pty.openpty()
        fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal 100 columns wide
        err = sub
    else:
        err = subprocess.PIPE
    try:
        res = subprocess.run(
            [sys.executable, "-m", "compatfs", "mount", str(store), str(mnt), "--index", str(index), *extra],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )
        assert res.returncode == 0
        if not tty:
            return res.stderr.decode()
        os.close(sub)
        out = b""
        while True:
            try:
                chunk = os.read(main, 1 << 16)
            except OSError:  # the terminal's other end is closed: all is read
                break
            if not chunk:
                break
            out += chunk
        return out.decode(errors="replace")
    finally:
        if tty:
            os.close(main)
        subprocess.run([sys.executable, "-m", "compatfs", "umount", str(mnt)], capture_output=True, timeout=60)


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    for i in range(3):
        add_model(root, f"m{i}", plain_llama_text(tmp_path / f"m{i}.gguf", seed=i), tag="1b")
    return root


@needs_fuse
def test_a_bar_while_the_mount_comes_up_on_a_terminal_only(store, tmp_path):
    shown = mount(store, tmp_path / "a", tmp_path / "index.sqlite3", tty=True)
    assert "indexing" in shown and "/3" in shown and "blob" in shown, shown
    assert "indexing" not in mount(store, tmp_path / "b", tmp_path / "index2.sqlite3", "-q", tty=True)
    assert "indexing" not in mount(store, tmp_path / "c", tmp_path / "index3.sqlite3", tty=False)
