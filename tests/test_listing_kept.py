"""Listings through a real mount: the kernel keeps each folder's listing
(OPENDIR answered with keep_cache and cache_readdir) and gets every entry's
attributes with it (READDIRPLUS filled with getattr's answers), so `ls -l`
looks up no entry and a listing read again does not reach the daemon.  What
the kernel keeps is dropped when the rescan sees the folder change: a model
pulled shows, one removed goes, a blob rewritten shows its new size; and a
caller the store refuses is refused whatever the kernel keeps.  The daemon's
requests are counted from libfuse's own debug lines (`-o debug`)."""

from __future__ import annotations

import collections
import os
import shutil
import stat
import subprocess

import pytest

from compatfs.fuse import libfuse
from compatfs.testing import llama
from compatfs.translate import accel
from compatfs.testing.store import add_model
from conftest import Mount, needs_fuse, wait_until

pytestmark = needs_fuse

_FIELDS = ("st_mode", "st_ino", "st_size", "st_uid", "st_gid", "st_nlink", "st_mtime_ns")


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    blob = llama.plain_llama_text(tmp_path / "t.gguf")
    for name in ("alpha", "beta", "gamma"):
        add_model(root, name, blob, tag="1b")
    return root


def requests(m: Mount) -> collections.Counter:
    """The requests the daemon has answered so far, by opcode and path where its debug line names one."""
    out: collections.Counter = collections.Counter()
    for line in m.log_text().splitlines():
        if "opcode:" in line:
            out[line.split("opcode:")[1].split()[0]] += 1
    return out


def ls_l(folder) -> dict[str, tuple]:
    """What `ls -l` of `folder` shows: each entry's status."""
    with os.scandir(folder) as it:
        names = sorted(e.name for e in it)
    return {n: tuple(getattr(os.lstat(os.path.join(folder, n)), f) for f in _FIELDS) for n in names}


# libfuse 3.14 to 3.16.0 drops the flags the high-level opendir sets:
# compatfs wraps the session's low-level opendir, in C where compatfs._accel
# is built, else with a ctypes callback.
_WRAPPED = (3, 14) <= libfuse._version_tuple() < libfuse._PASSES_DIR_FLAGS


@pytest.mark.parametrize("compiled", [True, False], ids=["accel", "no-accel"])
def test_a_folder_listed_again_is_answered_by_the_kernel(store, mount_store, compiled):
    if compiled and accel.native is None:
        pytest.skip("compatfs._accel is not built")
    m = mount_store(store, "-o", "debug", env={"COMPATFS_NO_ACCEL": "0" if compiled else "1"})
    if _WRAPPED:
        wrapped = "opendir wrapped in C)" if compiled else "opendir wrapped)"
        assert wrapped in m.log_text(), m.log_text()
    first = sorted(os.listdir(m / "alpha:1b"))
    before = requests(m)
    assert sorted(os.listdir(m / "alpha:1b")) == first == ["model.gguf"]
    again = requests(m) - before
    assert again["OPENDIR"] == 1, again  # every open still reaches the daemon (who may list it)
    assert not again["READDIR"] and not again["READDIRPLUS"], again


def test_ls_l_looks_up_no_entry_and_shows_what_stat_does(store, mount_store):
    """Every entry's attributes come with the listing, and they are what
    getattr answers: the same as a mount whose every stat reaches getattr
    (timeouts 0) shows."""
    m = mount_store(store, "-o", "debug")
    before = requests(m)
    listed = {name: ls_l(m / name) for name in sorted(os.listdir(m.path)) if (m / name).is_dir()}
    asked = requests(m) - before
    assert {"alpha:1b", "beta:1b", "gamma:1b", "blobs"} <= set(listed), listed
    assert not asked["LOOKUP"] and not asked["GETATTR"], asked
    plain = mount_store(store, "-o", "attr_timeout=0,entry_timeout=0")
    for name, entries in listed.items():
        stated = {n: tuple(getattr(os.lstat(plain / name / n), f) for f in _FIELDS) for n in entries}
        assert entries == stated, name
    for name in ("alpha:1b", "beta:1b", "gamma:1b"):
        assert all(stat.S_ISREG(e[0]) and e[2] > 0 for e in listed[name].values()), listed[name]


def test_a_kept_listing_follows_pulls_and_removals(tmp_path, store, mount_store):
    m = mount_store(store)
    assert {"alpha:1b", "beta:1b", "gamma:1b"} <= set(os.listdir(m.path))
    assert os.listdir(m / "alpha:1b") == ["model.gguf"]  # kept by the kernel from here on
    pulled = add_model(store, "delta", llama.plain_llama_text(tmp_path / "d.gguf"), tag="1b")
    wait_until(lambda: "delta:1b" in os.listdir(m.path), 5, what="a pulled model listed")
    assert os.listdir(m / "delta:1b") == ["model.gguf"]
    shutil.rmtree(store / "manifests" / "registry.ollama.ai" / "library" / "alpha")
    wait_until(lambda: "alpha:1b" not in os.listdir(m.path), 5, what="a removed model gone")
    assert not (m / "alpha:1b").exists()
    pulled.unlink()
    wait_until(lambda: "delta:1b" not in os.listdir(m.path), 5, what="a second removed model gone")


def test_a_kept_folder_shows_a_rewritten_blobs_new_size(tmp_path, store, mount_store):
    """A model pulled again with a blob of another size: `ls -l` of its kept
    folder (attributes with the listing) shows the new size, never the old."""
    m = mount_store(store)
    old = ls_l(m / "beta:1b")["model.gguf"][2]
    bigger = tmp_path / "b.gguf"
    bigger.write_bytes(llama.plain_llama_text(tmp_path / "t2.gguf").read_bytes() + bytes(4096))  # a new blob
    add_model(store, "beta", bigger, tag="1b")
    wait_until(lambda: ls_l(m / "beta:1b")["model.gguf"][2] != old, 5, what="the new size listed")
    new = ls_l(m / "beta:1b")["model.gguf"]
    assert new == tuple(getattr(os.stat(m / "beta:1b" / "model.gguf"), f) for f in _FIELDS)
    assert new[2] == len((m / "beta:1b" / "model.gguf").read_bytes())


@pytest.mark.skipif(os.getuid() != 0, reason="needs root (allow_other, another user)")
def test_a_caller_the_store_refuses_cannot_list_a_kept_folder(open_tmp):
    """The store sits in a folder only root may pass: the mount's folders
    mirror the store's own (readable by all), and root's listing is kept by
    the kernel, yet uid 65534 is refused every listing."""
    private = open_tmp / "private"
    root = private / "store"
    blob = llama.plain_llama_text(open_tmp / "t.gguf")
    add_model(root, "alpha", blob, tag="1b")
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    private.chmod(0o700)
    m = Mount(root, open_tmp / "mnt", env={"XDG_STATE_HOME": str(open_tmp / "state")})
    try:
        assert "alpha:1b" in os.listdir(m.path) and os.listdir(m / "alpha:1b") == ["model.gguf"]
        for folder in (m.path, m / "alpha:1b"):
            assert os.stat(folder).st_mode & 0o005 == 0o005  # the kernel's own check lets others in
            res = subprocess.run(
                ["ls", "-a", str(folder)], user=65534, group=65534, extra_groups=[], capture_output=True, timeout=30
            )
            assert res.returncode != 0 and b"Permission denied" in res.stderr, (folder, res)
        assert m.alive
    finally:
        m.close()
