"""When the mount's last open file closes, the memory its reads took at
their peak goes back to the system (`libc.give_back_free_memory`, called by
`OpenFiles.release`): a model server's start has many reads in flight at
once, and glibc otherwise keeps what they freed inside its heaps."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from compatfs.files import libc
from compatfs.fuse import openfiles
from compatfs.fuse.operations import CompatFS
from compatfs.testing import llama
from compatfs.testing.store import add_model

PATH = "/text:1b/model.gguf"


@pytest.fixture
def fs(tmp_path, store_fs) -> CompatFS:
    store = tmp_path / "store"
    add_model(store, "text", llama.plain_llama_text(tmp_path / "t.gguf"), tag="1b")
    return store_fs(store)


def _open(fs: CompatFS) -> int:
    fi = SimpleNamespace(flags=os.O_RDONLY, keep_cache=0, fh=0)
    assert fs.open(PATH, fi) == 0
    return fi.fh


def test_only_the_last_release_gives_memory_back(fs, monkeypatch):
    given: list[int] = []
    monkeypatch.setattr(openfiles, "give_back_free_memory", lambda: given.append(fs._paths.count))
    first, second = _open(fs), _open(fs)
    fs.release(PATH, SimpleNamespace(fh=first))
    assert given == []  # another file is still open
    fs.release(PATH, SimpleNamespace(fh=second))
    assert given == [0]
    fs.release(PATH, SimpleNamespace(fh=second))  # (a release of a file already closed)
    assert given == [0]


_HEAPS = textwrap.dedent(
    """
    import ctypes, sys
    from compatfs.files import libc
    libc.tune_malloc(mmap_threshold=(1 << 20) + (64 << 10), trim_threshold=4 << 20, arenas=2)  # as the daemon
    def anon():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) << 10
    blocks = [libc.LIBC.malloc(1 << 20) for _ in range(256)]
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
    for b in blocks[:-1]:  # the last one stays: what is free lies inside the heap, not at its top
        libc.LIBC.free(b)
    before = anon()
    if sys.argv[1] == "give":
        libc.give_back_free_memory()
    print(before - anon())
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc")
def test_free_memory_inside_the_heaps_goes_back_to_the_system():
    """255 MiB freed under a block still in use stay resident in the heap;
    given back, nearly all of it leaves the process."""

    def returned(how: str) -> int:
        run = subprocess.run([sys.executable, "-c", _HEAPS, how], capture_output=True, text=True, check=True)
        return int(run.stdout)

    assert returned("keep") < 16 << 20
    assert returned("give") > 200 << 20


def test_memory_is_given_back_again_only_once_resident_memory_grew(monkeypatch):
    """The heaps are walked where the process grew by `GROWN` since the
    last give-back, not at every quiet moment."""
    walks: list[int] = []
    now = [500 << 20]
    monkeypatch.setattr(
        libc, "LIBC", SimpleNamespace(malloc_trim=lambda pad: walks.append(pad) or now.__setitem__(0, 60 << 20))
    )
    monkeypatch.setattr(libc, "resident", lambda: now[0])
    monkeypatch.setattr(libc, "_given_back", [0])
    libc.give_back_free_memory()
    assert walks == [0] and libc._given_back == [60 << 20]  # what was resident right after
    now[0] = (60 << 20) + libc.GROWN - 1
    libc.give_back_free_memory()
    assert walks == [0]
    now[0] = (60 << 20) + libc.GROWN
    libc.give_back_free_memory()
    assert walks == [0, 0]


def test_resident_memory_is_this_process_s():
    block = mmap.mmap(-1, 64 << 20)  # (mapped, not yet resident)
    before = libc.resident()
    for at in range(0, len(block), libc.PAGE):
        block[at] = 1
    assert libc.resident() - before > 48 << 20
    block.close()
