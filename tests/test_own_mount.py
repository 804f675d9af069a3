"""The daemon never looks into its own mount: systemd's readiness is told
from the mount table, and a folder source's scan follows no symlink (one
into the mount would be a request to this very daemon)."""

from __future__ import annotations

import os
import socket

import pytest

from compatfs.files.mounttable import Mount
from compatfs.fuse import sdnotify


def test_readiness_is_told_from_the_mount_table_without_looking_at_the_mountpoint(tmp_path, monkeypatch):
    sock_path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", str(sock_path))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    looked: list[str] = []
    for name in ("stat", "lstat"):
        real = getattr(os, name)

        def spy(path, *args, real=real, **kwargs):
            if os.fspath(path).startswith(os.fspath(mnt)):
                looked.append(os.fspath(path))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, name, spy)
    table = [Mount(mnt / "other", "fuse.compatfs", "store", "0:1")]
    try:
        thread = sdnotify.notify_when_mounted(mnt, timeout=10, table=lambda: list(table))
        assert thread is not None
        table.append(Mount(mnt, "fuse.compatfs", "store", "0:2"))  # the mount is made
        msg = sock.recv(4096).decode().splitlines()
        thread.join(5)
    finally:
        sock.close()
    assert "READY=1" in msg and f"MAINPID={os.getpid()}" in msg
    assert looked == []


def test_an_earlier_mount_at_the_mountpoint_is_not_this_one(tmp_path, monkeypatch):
    sock_path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    monkeypatch.setenv("NOTIFY_SOCKET", str(sock_path))
    mnt = tmp_path / "mnt"
    table = [Mount(mnt, "fuse.compatfs", "store", "0:1")]  # lazily detached, still listed
    try:
        thread = sdnotify.notify_when_mounted(mnt, timeout=0.3, table=lambda: list(table))
        assert thread is not None
        thread.join(5)
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            sock.recv(4096)
    finally:
        sock.close()


class _Entry:
    """A DirEntry that records each question answered by following a symlink."""

    def __init__(self, entry: os.DirEntry, followed: list[str]):
        self._entry, self._followed = entry, followed

    def __getattr__(self, name):
        return getattr(self._entry, name)

    def _follows(self, follow_symlinks: bool) -> None:
        if follow_symlinks and self._entry.is_symlink():
            self._followed.append(self._entry.name)

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        self._follows(follow_symlinks)
        return self._entry.is_dir(follow_symlinks=follow_symlinks)

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        self._follows(follow_symlinks)
        return self._entry.is_file(follow_symlinks=follow_symlinks)

    def stat(self, *, follow_symlinks: bool = True):
        self._follows(follow_symlinks)
        return self._entry.stat(follow_symlinks=follow_symlinks)


class _Listing:
    def __init__(self, it, followed: list[str]):
        self._it, self._followed = it, followed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._it.close()

    def __iter__(self):
        return self

    def __next__(self):
        return _Entry(next(self._it), self._followed)

    def close(self):
        self._it.close()


def test_a_folder_scan_follows_no_symlink_into_the_mount(tmp_path, monkeypatch):
    from compatfs.files import blobfile
    from compatfs.sources.folder import GGUFFolder
    from compatfs.testing import llama

    root = tmp_path / "models"
    (root / "pub" / "repo").mkdir(parents=True)
    llama.plain_llama_text(root / "pub" / "repo" / "x.gguf")
    mnt = tmp_path / "mnt"
    (mnt / "inside").mkdir(parents=True)
    monkeypatch.setenv(blobfile.KEEP_OUT_ENV, "[]")
    blobfile.keep_out(mnt)
    (root / "pub" / "into-mount").symlink_to(mnt / "inside")
    (root / "pub" / "repo" / "y.gguf").symlink_to(mnt / "inside" / "y.gguf")
    followed: list[str] = []
    scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path=".": _Listing(scandir(path), followed))
    listing = GGUFFolder(root).scan()
    assert followed == []
    assert set(listing.folders) == {"pub/repo/x", "pub/repo/y"}
    assert listing.folders["pub/repo/x"].model == root / "pub" / "repo" / "x.gguf"
