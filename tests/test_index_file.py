"""The index file: written in WAL mode, with an SQL index on what the
start-up query asks, pruned of other versions' rows and of blobs that are
gone, and written off every `stat`'s path (a file another process holds
delays nothing but its own writing).  Measured before: the start-up query
scanned the whole table, the journal was a rollback one, rows were never
deleted, and a `stat` waited up to 10 s on a locked file (then the mount
gave the index up)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from compatfs.testing.gemma3 import legacy_gemma3_text
from compatfs.testing.store import add_model
from compatfs.view.index import Index
from compatfs.view.summary import Summary

from conftest import needs_fuse, wait_until

# The start-up query (as the base commit had it too).
STARTUP = (
    "SELECT path, dev, ino, size, mtime_ns, ctime_ns, model_size, mmproj_size, text, clip, error, arch, "
    "model_error, mmproj_error, embedding FROM views_v5 WHERE version = ? AND translate = ?"
)


def _paths(path: Path, version: str | None = None) -> set[str]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        sql, args = (
            ("SELECT path FROM views_v5", ())
            if version is None
            else ("SELECT path FROM views_v5 WHERE version = ?", (version,))
        )
        return {p for (p,) in db.execute(sql, args)}
    finally:
        db.close()


def test_wal_and_an_sql_index_on_the_startup_query(tmp_path):
    path = tmp_path / "index.sqlite3"
    Index(path, translate=True, version="v1")
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        plan = " ".join(str(row[-1]) for row in db.execute("EXPLAIN QUERY PLAN " + STARTUP, ("v1", 1)))
        assert "USING INDEX" in plan and "SCAN" not in plan, plan
    finally:
        db.close()


def test_rows_of_other_versions_and_of_gone_blobs_are_pruned(tmp_path):
    path = tmp_path / "index.sqlite3"
    blobs = [tmp_path / f"b{i}" for i in range(4)]
    for b in blobs:
        b.touch()
    old = Index(path, translate=True, version="v0")
    old.put(blobs[0], (0, 1, 1, 1, 1), Summary(1, None))
    old.close()
    index = Index(path, translate=True, version="v1")
    for i, b in enumerate(blobs):
        index.put(b, (i, 1, 1, 1, 1), Summary(1, None))
    index.close()
    assert _paths(path, "v1") == {str(b) for b in blobs}
    assert _paths(path, "v0") == set()  # another version's rows: gone
    blobs[1].unlink()  # removed while no mount ran
    index = Index(path, translate=True, version="v1")
    assert index.flush(30)
    assert _paths(path) == {str(b) for b in blobs} - {str(blobs[1])}
    blobs[2].unlink()  # removed while mounted: left the store
    index.retain({str(blobs[0]), str(blobs[3])})
    assert index.flush(30)
    assert _paths(path) == {str(blobs[0]), str(blobs[3])}
    index.close()


@needs_fuse
def test_a_stat_never_waits_on_an_index_file_another_process_holds(tmp_path, mount_store):
    """Another process (as a second first mount would) holds the index file
    locked while this mount indexes three models: each `stat` is answered,
    and what they learnt is written once the file is free."""
    store = tmp_path / "store"
    add_model(store, "first", legacy_gemma3_text(tmp_path / "f.gguf", seed=7), tag="1b")
    cache = {"COMPATFS_CACHE_DIR": str(tmp_path / "cache")}
    warm = mount_store(store, env=cache)  # makes the file
    assert os.stat(warm / "first:1b/model.gguf").st_size > 0
    warm.close()
    index = tmp_path / "cache" / "index.sqlite3"
    for i in range(3):
        add_model(store, f"m{i}", legacy_gemma3_text(tmp_path / f"g{i}.gguf", seed=i), tag="1b")
    holder = sqlite3.connect(index, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        m = mount_store(store, env=cache)
        sizes = [os.stat(m / f"m{i}:1b/model.gguf").st_size for i in range(3)]
        assert all(sizes)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    wait_until(lambda: len(_paths(index)) >= 4, 30, what="the held file written once free")
    assert "cannot write" not in m.log_text() and "without the persistent index" not in m.log_text(), m.log_text()
