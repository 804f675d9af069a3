"""inotify is asked through the C library the process loaded once
(`files.libc.LIBC`): a mount's start and its first open run no search for
it (ctypes.util.find_library runs ldconfig, a process of its own, each time)."""

from __future__ import annotations

import ctypes.util

import pytest

from compatfs.files import watch
from compatfs.files.blobfile import BlobFile


@pytest.fixture
def no_library_search(monkeypatch):
    def searched(name: str) -> str:
        raise AssertionError(f"searched for the library {name!r}")

    monkeypatch.setattr(ctypes.util, "find_library", searched)
    monkeypatch.setattr(watch, "_contents", [])  # the process's Contents made afresh


def test_a_followed_file_is_judged_without_a_library_search(tmp_path, no_library_search):
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 4096)
    with BlobFile(path, follow=True) as f:
        assert f._followed is not None
        assert f.intact()
        with open(path, "r+b") as w:
            w.write(b"y")
        assert not f.intact()


def test_a_store_is_watched_without_a_library_search(tmp_path, no_library_search):
    w = watch.Watch.open()
    assert w is not None
    try:
        assert w.follow({tmp_path})
        (tmp_path / "new").write_bytes(b"")
        assert w.changed()
    finally:
        w.close()
