"""The persistent index: sizes survive a remount without parsing a blob again,
stale entries (blob replaced, translation changed) are not trusted, an
unreadable index is rebuilt, and listing a store of many models keeps the
daemon's memory bounded."""

import logging
import os
import time
from pathlib import Path


from compatfs.format.header import SourceGGUF
from compatfs.format.values import string
from compatfs.view.index import Index
from compatfs.view.summary import Summary
from compatfs.view.opcache import OpCache
from compatfs.testing.gemma3 import legacy_gemma3_text
from compatfs.testing.llama import legacy_llama3_instruct
from compatfs.testing.store import add_model
from compatfs.translate import ALWAYS, Set, Translation, plan
from compatfs.view.layout import View

from conftest import needs_fuse, wait_until


def test_entries_survive_reopening_and_stale_ones_are_ignored(tmp_path):
    path = tmp_path / "index.sqlite3"
    blob, stamp, summary = (
        tmp_path / "sha256-1",
        (1, 2, 3, 4, 5),
        Summary(100, 50, "gemma3", "gemma3-clip", arch="gemma3"),
    )
    blob.touch()  # a blob that is gone is pruned
    index = Index(path, translate=True, version="v1")
    index.put(blob, stamp, summary)
    index.close()
    assert Index(path, translate=True, version="v1").get(blob, stamp) == summary
    assert (
        Index(path, translate=True, version="v1").get(blob, (1, 2, 3, 4, 6)) is None
    )  # blob rewritten in place (ctime moved)
    assert Index(path, translate=True, version="v2").get(blob, stamp) is None  # handlers changed
    assert Index(path, translate=False, version="v1").get(blob, stamp) is None  # translation off


def test_an_unreadable_index_is_moved_aside_and_rebuilt(tmp_path, caplog):
    path = tmp_path / "index.sqlite3"
    path.write_bytes(b"this is not an SQLite database" * 100)
    with caplog.at_level(logging.WARNING, logger="compatfs"):
        index = Index(path, translate=True, version="v1")
    assert "unreadable" in caplog.text and "rebuilt" in caplog.text
    blob = tmp_path / "b"
    blob.touch()
    index.put(blob, (1, 1, 1, 1, 1), Summary(1, None))
    index.close()
    assert Index(path, translate=True, version="v1").get(blob, (1, 1, 1, 1, 1)) == Summary(1, None)
    assert path.with_name(path.name + ".corrupt").exists()


def _indexed(log: str) -> int:
    return log.count(" indexed ")


@needs_fuse
def test_a_remount_lists_without_parsing(tmp_path, mount_store):
    store = tmp_path / "store"
    for i in range(3):
        add_model(store, f"g{i}", legacy_gemma3_text(tmp_path / f"g{i}.gguf", seed=i), tag="1b")
    cache = {"COMPATFS_CACHE_DIR": str(tmp_path / "cache")}
    first = mount_store(store, "-v", "-v", env=cache)
    sizes = {i: os.stat(first / f"g{i}:1b/model.gguf").st_size for i in range(3)}
    assert _indexed(first.log_text()) >= 3
    first.close()
    second = mount_store(store, "-v", "-v", env=cache)
    assert {i: os.stat(second / f"g{i}:1b/model.gguf").st_size for i in range(3)} == sizes
    assert _indexed(second.log_text()) == 0
    # A blob replaced under the same name is indexed again, with its own size.
    second.close()
    add_model(store, "g0", legacy_gemma3_text(tmp_path / "other.gguf", seed=9), tag="1b")
    third = mount_store(store, "-v", "-v", env=cache)
    os.stat(third / "g0:1b/model.gguf")
    assert _indexed(third.log_text()) == 1


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _variant(src: SourceGGUF, out: Path, name: str) -> Path:
    """The blob at `src` with another general.name: a distinct blob, same layout."""
    view = View.translated(
        src, plan(Translation("rename", ALWAYS, kv=(Set("general.name", string(name)),)), src), OpCache(0), key=name
    )
    out.write_bytes(view.read(0, view.size))
    return out


@needs_fuse
def test_listing_many_models_keeps_the_daemon_small(tmp_path, mount_store):
    """24 models with a 128,256-token vocabulary (a translated header of about
    3 MiB each): after `ls -l` of them all, the daemon holds about one view's
    worth of headers, not one per model."""
    src = SourceGGUF(legacy_llama3_instruct(tmp_path / "l3.gguf"))
    store = tmp_path / "store"
    n = 24
    for i in range(n):
        add_model(store, f"m{i}", _variant(src, tmp_path / "v.gguf", f"model {i}"))
    m = mount_store(store)
    before = _rss_mib(m.proc.pid)
    t0 = time.monotonic()
    sizes = [os.stat(m / f"m{i}:latest/model.gguf").st_size for i in range(n)]
    assert all(s > 0 for s in sizes)
    assert time.monotonic() - t0 < 120
    grown = _rss_mib(m.proc.pid) - before
    assert grown < 60, f"daemon RSS grew by {grown:.0f} MiB listing {n} models"
    # Reading each file's header builds its view in the daemon: the views
    # kept are bounded in bytes, not one per model.
    for i in range(n):
        with open(m / f"m{i}:latest/model.gguf", "rb") as f:
            assert f.read(4) == b"GGUF"
    grown = _rss_mib(m.proc.pid) - before
    assert grown < 100, f"daemon RSS grew by {grown:.0f} MiB reading {n} headers"


WORKERS_THEN_DIE = """
import os, signal, sys, time
from pathlib import Path
from compatfs.view.catalog import BlobViews
from compatfs.view.index import Index
views = BlobViews(index=Index(None, True), workers=2)
views.prefetch([Path(p) for p in sys.argv[1:]])
deadline = time.monotonic() + 60
while not (views._pool and views._pool._processes) and time.monotonic() < deadline:
    time.sleep(0.01)
print(" ".join(str(p) for p in views._pool._processes), flush=True)
if os.environ.get("HOW") == "close":
    views.close()
    print("closed", flush=True)
    time.sleep(30)   # on purpose: alive while the test checks the workers ended with close(), not with it
os.kill(os.getpid(), signal.SIGKILL)
"""


def _gone(pids: list[int]) -> bool:
    """None of `pids` runs (a zombie is gone)."""
    return not any(Path(f"/proc/{p}").exists() and "zombie" not in _state(p) for p in pids)


def _state(pid: int) -> str:
    try:
        return next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State"))
    except (OSError, StopIteration):
        return "zombie"


def test_indexing_workers_end_with_the_daemon(tmp_path):
    """Whether the daemon closes its workers (unmount) or is killed with
    SIGKILL while they index, no worker outlives it."""
    import subprocess
    import sys

    blobs = [str(legacy_gemma3_text(tmp_path / f"g{i}.gguf")) for i in range(6)]
    for how in ("close", "kill"):
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKERS_THEN_DIE, *blobs],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "HOW": how},
        )
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids, how
        if how == "close":
            assert proc.stdout.readline().strip() == "closed"
            wait_until(lambda pids=pids: _gone(pids), 10, what=f"workers {pids} ending with close()")
            proc.kill()
        proc.wait(timeout=30)
        wait_until(lambda pids=pids: _gone(pids), 10, what=f"workers {pids} ending with a daemon ended by {how}")


def test_a_stat_never_waits_on_a_worker_that_has_not_answered(tmp_path):
    """A summary a worker has taken but not delivered (its pool still
    starting, or stuck) is made by the request itself after a short wait."""
    from concurrent.futures import Future
    from compatfs.view.catalog import BlobViews
    from compatfs.view.summaries import summarize

    blob = legacy_gemma3_text(tmp_path / "g.gguf")
    views = BlobViews(index=Index(None, True), workers=2)
    taken = Future()
    assert taken.set_running_or_notify_cancel()  # running: it cannot be cancelled
    views._pending[str(blob)] = taken
    assert views.summary(blob) == summarize(blob, True)[1]
    assert not taken.done()


def test_a_folder_named_as_the_index_is_refused_and_never_renamed(tmp_path):
    """Measured on the landed code: `--index DIR` renamed DIR to DIR.corrupt
    and made a database in its place."""
    import subprocess
    import sys
    from compatfs.view.index import IndexPathError
    import pytest

    folder = tmp_path / "precious"
    folder.mkdir()
    (folder / "keep").write_text("mine")
    with pytest.raises(IndexPathError, match="is a folder"):
        Index(folder, translate=True, version="v1")
    store = tmp_path / "store"
    add_model(store, "g", legacy_gemma3_text(tmp_path / "g.gguf"), tag="1b")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        res = subprocess.run(
            [sys.executable, "-m", "compatfs", "mount", "-f", str(store), str(mnt), "--index", str(folder)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:  # a mount that came up (and was killed by the timeout) is taken down
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
    assert res.returncode == 1 and res.stderr.count("\n") == 1 and "is a folder" in res.stderr, res.stderr
    assert (folder / "keep").read_text() == "mine" and not (tmp_path / "precious.corrupt").exists()


def test_an_index_that_cannot_be_used_leaves_only_a_log_line(tmp_path, caplog):
    """A `<index>.corrupt` folder where a corrupt index would go, and (as
    root) a cache folder on a read-only filesystem: the index works from
    memory, with one log line, and nothing is renamed.  Measured on the
    landed code: OSError from os.replace (the mount failed with a traceback
    fragment)."""
    import subprocess

    path = tmp_path / "index.sqlite3"
    path.write_bytes(b"garbage" * 100)
    aside = tmp_path / "index.sqlite3.corrupt"
    aside.mkdir()
    cases = [path]
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ro)]).returncode == 0:
        cases.append(ro / "index.sqlite3")  # the cache folder exists, read-only
    try:
        for where in cases:
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="compatfs"):
                index = Index(where, translate=True, version="v1")
            assert len(caplog.records) == 1 and "without the persistent index" in caplog.text, caplog.text
            index.put(Path("/b"), (1, 1, 1, 1, 1), Summary(1, None))
            assert index.get(Path("/b"), (1, 1, 1, 1, 1)) == Summary(1, None)
        assert path.read_bytes() == b"garbage" * 100 and aside.is_dir() and not any(aside.iterdir())
    finally:
        if len(cases) > 1:
            subprocess.run(["umount", str(ro)])


def test_entries_of_the_wrong_kind_or_with_errors_are_made_again(tmp_path):
    """Entries on disk are hints: one with a value that is no size (text, a
    negative number) or that records an error is not taken."""
    import sqlite3

    path = tmp_path / "index.sqlite3"
    index = Index(path, translate=True, version="v1")
    good = Summary(100, None, "gemma3", arch="gemma3")
    for i in range(7):
        (tmp_path / f"b{i}").touch()
        index.put(tmp_path / f"b{i}", (i, 1, 1, 1, 1), good)
    index.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE views_v5 SET model_size = 'abc' WHERE path = ?", (str(tmp_path / "b1"),))
    db.execute("UPDATE views_v5 SET model_size = -5 WHERE path = ?", (str(tmp_path / "b2"),))
    db.execute("UPDATE views_v5 SET error = 'forged' WHERE path = ?", (str(tmp_path / "b3"),))
    db.execute("UPDATE views_v5 SET context_length = 0 WHERE path = ?", (str(tmp_path / "b4"),))
    db.execute("UPDATE views_v5 SET context_length = ? WHERE path = ?", (1 << 40, str(tmp_path / "b5")))
    db.execute("UPDATE views_v5 SET block_count = 'many' WHERE path = ?", (str(tmp_path / "b6"),))
    db.commit()
    db.close()
    again = Index(path, translate=True, version="v1")
    assert again.get(tmp_path / "b0", (0, 1, 1, 1, 1)) == good
    assert [again.get(tmp_path / f"b{i}", (i, 1, 1, 1, 1)) for i in range(1, 7)] == [None] * 6


def test_a_view_that_belies_its_entry_rebuilds_it(tmp_path):
    from compatfs.view.catalog import BlobViews
    from compatfs.view.summaries import summarize
    from compatfs.names import MMPROJ_FILE, MODEL_FILE
    from compatfs.files.lookup import identity
    import pytest
    from compatfs.errors import GGUFError

    blob = legacy_gemma3_text(tmp_path / "g.gguf")
    stamp, true = summarize(blob, True)
    index = Index(None, translate=True, version="v1")
    told = []
    views = BlobViews(index=index)
    views.on_belied = told.append
    index.put(
        blob, stamp, Summary(true.model_size - 1000, 1234, true.text, arch=true.arch)
    )  # too small, phantom mmproj
    assert views.view(blob, MODEL_FILE).size == true.model_size
    assert index.get(blob, stamp) == true and told == [blob]
    index.put(blob, stamp, Summary(true.model_size, 1234, true.text, arch=true.arch))
    with pytest.raises(GGUFError, match="no projector view"):
        views.view(blob, MMPROJ_FILE)
    assert index.get(blob, stamp) == true and told == [blob, blob]
    assert identity(blob.stat()) == stamp


@needs_fuse
def test_a_mount_comes_up_without_an_index_it_cannot_write(tmp_path, mount_store):
    """As root: the cache folder on a read-only filesystem.  Measured on the
    landed code: the mount failed with a traceback fragment (OSError: [Errno
    30] Read-only file system, from os.replace)."""
    import subprocess
    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root (a read-only tmpfs)")
    ro = tmp_path / "ro"
    ro.mkdir()
    assert subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(ro)]).returncode == 0
    try:
        store = tmp_path / "store"
        add_model(store, "g", legacy_gemma3_text(tmp_path / "g.gguf"), tag="1b")
        m = mount_store(store, env={"COMPATFS_CACHE_DIR": str(ro)})  # the folder exists, read-only
        assert os.stat(m / "g:1b/model.gguf").st_size > 0
        log = m.log_text()
        assert log.count("without the persistent index") == 1 and "Traceback" not in log, log
        m.close()
    finally:
        subprocess.run(["umount", str(ro)])


def test_the_version_is_declared_and_follows_gguf_py(tmp_path, monkeypatch):
    """The index's version is compatfs's declared one and gguf-py's: an edit
    to a comment keeps every entry, a gguf-py of another version (its
    quantization sizes decide views too) makes them again.  Measured
    before: a digest of the source files, blind to gguf-py."""
    import importlib.metadata
    import compatfs.view.index as index_module

    real = importlib.metadata.version("gguf")
    assert index_module.translation_version() == f"{index_module.INDEX_VERSION}+gguf-{real}"
    path, blob = tmp_path / "index.sqlite3", tmp_path / "b"
    blob.touch()
    first = Index(path, translate=True)
    first.put(blob, (1, 1, 1, 1, 1), Summary(1, None))
    first.close()
    assert Index(path, translate=True).get(blob, (1, 1, 1, 1, 1)) == Summary(1, None)
    index_module.translation_version.cache_clear()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.1" if name == "gguf" else real)
    try:
        assert Index(path, translate=True).get(blob, (1, 1, 1, 1, 1)) is None
    finally:
        monkeypatch.undo()
        index_module.translation_version.cache_clear()
