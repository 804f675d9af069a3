"""The persistent index: what `getattr` and `readdir` need of each blob's
views, so that a listing never parses a blob it has seen before, across
remounts.

One SQLite file in the user's cache folder (`$COMPATFS_CACHE_DIR`, else
`$XDG_CACHE_HOME/compatfs`, else `~/.cache/compatfs`), never inside the store.
An entry is keyed by the blob's path and identity (device, inode, size,
modification and change time), by the index's version (`INDEX_VERSION`
and gguf-py's version: `translation_version`) and by whether translation
is on; an entry whose identity differs is ignored and replaced.  Beside
each blob's summary (its views' sizes, handlers, whether model.gguf is an
embedding model, the model's trained context and block count) the index keeps the size of its model.gguf with each set
of params-layer sampling KVs a model folder gave it (`sampled`), keyed
alike and by those KVs' encoding.  An entry is a hint, never the truth for
serving: one whose values are not of their kinds is ignored, one that
records an error is made again once per mount, and every value is checked
against the view when it is built (`BlobViews.view`) before its bytes are
served (the trained context and block count against the blob's header),
and with the embedding flag where that is asked (`BlobViews.embedding`).

The file is used only where nobody but the daemon's user could have
written it: the file (and SQLite's `-wal`, `-shm` and `-journal` beside it)
a regular file owned by that user and writable by no one else, in a folder
owned by that user (or root) and writable by no one else; otherwise the
mount works without it, with one log line, and touches nothing.  A path
that is a folder is refused (`IndexPathError`).  A regular file of ours
that SQLite finds corrupt (not a database, or malformed) is moved to
`<file>.corrupt` (replacing a regular file there, never anything else) and
rebuilt; anything else that keeps the file from being used (a cache folder
that cannot be written, a folder at `<file>.corrupt`) leaves the mount
without the persistent index, with one log line.  Nothing else is ever
renamed.

Reading (`get`, `sampled`) is from memory only.  Writes go to memory at
once and to the disk from one writer thread, in one transaction per batch,
in WAL mode, not synced (a cache need not outlive a crash of the machine;
a file a crash left corrupt is set aside and rebuilt, as above): no `stat`
waits on the file, whoever else holds it, and indexing a thousand new
blobs costs no thousand disk flushes.  A file another process keeps locked
is written once it is free.  The writer also prunes: at start, the rows of
other versions and those of blobs that are gone; later, those of blobs that
left the store and are gone (`retain`).
"""

from __future__ import annotations

import dataclasses
import errno
import contextlib
import functools
import importlib.metadata
import logging
import os
import sqlite3
import stat
import threading
import time
from pathlib import Path

from ..files.blobfile import Stamp
from .summary import Summary, sound_size

log = logging.getLogger(__name__)

_CORRUPT = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB: the file is not a sound database


class IndexPathError(ValueError):
    """The index path names something that cannot be the index (a folder)."""


# The version of what an entry holds: raised whenever a change to compatfs
# changes what a summary or a sampled size of some blob is (a view's size,
# its claims, its handlers, the sampling keys' encoding).  gguf-py's own
# version is part of the index's version too (`translation_version`): its
# quantization sizes and names decide views as well.
INDEX_VERSION = 6


def _gguf_version() -> str:
    try:
        return importlib.metadata.version("gguf")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def translation_version() -> str:
    """The version entries are made and kept under: `INDEX_VERSION` and
    gguf-py's version (an entry of any other version is pruned)."""
    return f"{INDEX_VERSION}+gguf-{_gguf_version()}"


def default_path() -> Path:
    base = os.environ.get("COMPATFS_CACHE_DIR")
    if base:
        return Path(base) / "index.sqlite3"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "compatfs" / "index.sqlite3"


_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS views_v5 (
    path TEXT NOT NULL, version TEXT NOT NULL, translate INTEGER NOT NULL,
    dev INTEGER NOT NULL, ino INTEGER NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
    model_size INTEGER NOT NULL, mmproj_size INTEGER, text TEXT, clip TEXT, error TEXT, arch TEXT,
    model_error TEXT, mmproj_error TEXT, embedding INTEGER NOT NULL, context_length INTEGER, block_count INTEGER NOT NULL,
    PRIMARY KEY (path, version, translate))
""",
    """
CREATE TABLE IF NOT EXISTS sampled_v1 (
    path TEXT NOT NULL, version TEXT NOT NULL, translate INTEGER NOT NULL,
    dev INTEGER NOT NULL, ino INTEGER NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
    kvs TEXT NOT NULL, model_size INTEGER NOT NULL,
    PRIMARY KEY (path, version, translate, kvs))
""",
    # What the start-up queries ask: one version's entries.
    "CREATE INDEX IF NOT EXISTS views_v5_by_version ON views_v5 (version, translate)",
    "CREATE INDEX IF NOT EXISTS sampled_v1_by_version ON sampled_v1 (version, translate)",
)
_OLD_TABLES = ("views", "views_v2", "views_v3", "views_v4")  # earlier layouts, dropped
_TABLES = ("views_v5", "sampled_v1")

STARTUP_VIEWS = (
    "SELECT path, dev, ino, size, mtime_ns, ctime_ns, model_size, mmproj_size, text, clip, error, arch, "
    "model_error, mmproj_error, embedding, context_length, block_count FROM views_v5 WHERE version = ? AND translate = ?"
)
STARTUP_SAMPLED = (
    "SELECT path, dev, ino, size, mtime_ns, ctime_ns, kvs, model_size FROM sampled_v1 "
    "WHERE version = ? AND translate = ?"
)
_BUSY = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED: another connection holds the file; written later
_SIDE_FILES = ("-wal", "-shm", "-journal")


def untrusted(path: Path) -> str | None:
    """Why the index file `path` (or SQLite's files beside it, or its
    folder) could have been written by someone other than this process's
    user; None when it could not (a file that is not there yet is made by us)."""
    me = os.geteuid()
    try:
        st = os.lstat(path.parent)
    except OSError as e:
        return f"its folder cannot be examined ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (me, 0) or st.st_mode & 0o022:
        return f"its folder {path.parent} is not a folder of this user's that only its owner may write"
    for f in (path, *(path.with_name(path.name + s) for s in _SIDE_FILES)):
        try:
            st = os.lstat(f)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{f.name} cannot be examined ({e.strerror})"
        if stat.S_ISDIR(st.st_mode) and f == path:
            continue  # refused as a folder by `Index`
        if not stat.S_ISREG(st.st_mode):
            return f"{f.name} is not a regular file"
        if st.st_uid != me:
            return f"{f.name} is owned by uid {st.st_uid}, not by this user (uid {me})"
        if st.st_mode & 0o022:
            return f"{f.name} may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


class Index:
    """Summaries by blob path, kept in memory and (with a `path`) on disk."""

    RETRY = 0.5  # seconds between attempts to write a file another process holds
    BUSY_MS = 500  # how long one attempt waits for it

    def __init__(self, path: Path | None, translate: bool, version: str | None = None):
        self.path = path
        self.translate = int(translate)
        self.version = version or translation_version()
        self._lock = threading.Lock()
        self._mem: dict[str, tuple[Stamp, Summary]] = {}
        self._sampled: dict[tuple[str, str], tuple[Stamp, int]] = {}  # (path, kvs) -> (stamp, size)
        self._db: sqlite3.Connection | None = None
        # What the writer has to do: rows to write, paths to prune if gone.
        self._wake = threading.Condition(self._lock)
        self._rows: dict[tuple[str, object], tuple] = {}  # (statement, entry) -> row
        self._prune: set[str] = set()
        self._writing = False
        self._closed = False
        self._writer: threading.Thread | None = None
        if path is not None:
            self._open(path)
        if self._db is not None:
            self._prune |= set(self._mem) | {p for p, _ in self._sampled}
            self._writer = threading.Thread(target=self._write_loop, name="compatfs-index", daemon=True)
            self._writer.start()

    def _open(self, path: Path) -> None:
        try:
            if path.is_dir():
                raise IndexPathError(f"the index {path} is a folder, not a file")
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            why = untrusted(path)
            if why is not None:
                log.warning("index %s is not used (%s): working without the persistent index", path, why)
                return
            try:
                self._db = self._connect(path)
            except sqlite3.DatabaseError as e:
                if getattr(e, "sqlite_errorcode", None) not in _CORRUPT:
                    raise
                self._set_aside(path, e)
                self._db = self._connect(path)
        except (sqlite3.Error, OSError) as e:
            log.warning(
                "index %s cannot be used (%s): working without the persistent index",
                path,
                getattr(e, "strerror", None) or e,
            )
            self._db = None
            self._mem.clear()
            self._sampled.clear()

    def _set_aside(self, path: Path, why: Exception) -> None:
        """Move a corrupt index file (a regular file: ours) to `<file>.corrupt`;
        OSError when that cannot be done without touching anything else."""
        aside = path.with_name(path.name + ".corrupt")
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise OSError(f"{path} is not a regular file")
        try:
            if not stat.S_ISREG(os.lstat(aside).st_mode):
                raise OSError(f"{aside} is there and is not a regular file")
        except FileNotFoundError:
            pass
        log.warning("index %s is unreadable (%s): moved to %s and rebuilt", path, why, aside.name)
        os.replace(path, aside)

    def _connect(self, path: Path) -> sqlite3.Connection:
        with contextlib.suppress(FileExistsError):  # made by us, readable by us only, whatever the umask
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        db = sqlite3.connect(path, timeout=10, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = OFF")
            for table in _SCHEMA:
                db.execute(table)
            for old in _OLD_TABLES:
                db.execute(f"DROP TABLE IF EXISTS {old}")
            rows = db.execute(STARTUP_VIEWS, (self.version, self.translate)).fetchall()
            sampled = db.execute(STARTUP_SAMPLED, (self.version, self.translate)).fetchall()
            db.execute(f"PRAGMA busy_timeout = {self.BUSY_MS}")  # the writer's: it tries again itself
        except sqlite3.Error:
            db.close()
            raise
        ignored = 0
        for path, *stamp_summary in rows:
            stamp, values, embedding = tuple(stamp_summary[:5]), stamp_summary[5:-3], stamp_summary[-3]
            summary = dataclasses.replace(
                Summary(*values),  # SQLite gives 0 or 1; anything else is unsound
                embedding=embedding == 1 if embedding in (0, 1) else embedding,
                context_length=stamp_summary[-2],
                block_count=stamp_summary[-1],
            )
            if type(path) is str and all(type(v) is int for v in stamp) and summary.sound() and not summary.failed:
                self._mem[path] = (stamp, summary)
            else:
                ignored += 1
        for path, *stamp_kvs_size in sampled:
            stamp, kvs, size = tuple(stamp_kvs_size[:5]), stamp_kvs_size[5], stamp_kvs_size[6]
            if type(path) is str and type(kvs) is str and all(type(v) is int for v in stamp) and sound_size(size):
                self._sampled[(path, kvs)] = (stamp, size)
            else:
                ignored += 1
        if ignored:
            log.info(
                "index %s: %d entries made again (they record an error, or hold values of the wrong kind)",
                path,
                ignored,
            )
        return db

    def __len__(self) -> int:
        return len(self._mem)

    def get(self, path: Path, stamp: Stamp) -> Summary | None:
        """The summary of the blob at `path` if it is still the blob it was made of."""
        with self._lock:
            hit = self._mem.get(str(path))
        return hit[1] if hit is not None and hit[0] == stamp else None

    def put(self, path: Path, stamp: Stamp, summary: Summary) -> None:
        with self._lock:
            self._mem[str(path)] = (stamp, summary)
            self._queue(
                "INSERT OR REPLACE INTO views_v5 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                str(path),
                (
                    str(path),
                    self.version,
                    self.translate,
                    *stamp,
                    summary.model_size,
                    summary.mmproj_size,
                    summary.text,
                    summary.clip,
                    summary.error,
                    summary.arch,
                    summary.model_error,
                    summary.mmproj_error,
                    int(summary.embedding),
                    summary.context_length,
                    summary.block_count,
                ),
            )

    def sampled(self, path: Path, stamp: Stamp, kvs: str) -> int | None:
        """The size of the blob's model.gguf with the sampling KVs encoded as
        `kvs`, if recorded for the blob of that identity."""
        with self._lock:
            hit = self._sampled.get((str(path), kvs))
        return hit[1] if hit is not None and hit[0] == stamp else None

    def put_sampled(self, path: Path, stamp: Stamp, kvs: str, size: int) -> None:
        with self._lock:
            self._sampled[(str(path), kvs)] = (stamp, size)
            self._queue(
                "INSERT OR REPLACE INTO sampled_v1 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (str(path), kvs),
                (str(path), self.version, self.translate, *stamp, kvs, size),
            )

    def _queue(self, sql: str, key: object, row: tuple) -> None:
        """A row for the writer, replacing one of the same `key` not yet
        written (the lock is held): what waits is at most one row per entry."""
        if self._writer is not None and not self._closed:
            self._rows[(sql, key)] = row
            self._wake.notify()

    def retain(self, keep: set[str]) -> None:
        """Drop the in-memory entries of every blob path not in `keep` (blobs
        that left the store); their disk entries go once the blob is gone
        (they stay for a remount while it is there)."""
        with self._lock:
            gone = {p for p in self._mem if p not in keep} | {p for p, _ in self._sampled if p not in keep}
            for path in [p for p in self._mem if p not in keep]:
                del self._mem[path]
            for key in [k for k in self._sampled if k[0] not in keep]:
                del self._sampled[key]
            if self._writer is not None and gone:
                self._prune |= gone
                self._wake.notify()

    # -- the writer ----------------------------------------------------------
    def _write_loop(self) -> None:
        """Write what is queued, a batch per transaction; prune; until closed."""
        db = self._db
        assert db is not None
        if not self._batch(db, [], old_versions=True):
            return
        while True:
            with self._lock:
                while not (self._rows or self._prune or self._closed):
                    self._wake.wait()
                rows, self._rows = list(self._rows.items()), {}
                prune, self._prune = self._prune, set()
                if not rows and not prune:
                    return  # closed, all written
                self._writing = True
            gone = [(p,) for p in prune if _gone(p)]
            done = self._batch(db, rows, gone=gone)
            with self._lock:
                self._writing = False
                self._wake.notify_all()
            if not done:
                return

    def _batch(
        self,
        db: sqlite3.Connection,
        rows: list[tuple[tuple[str, object], tuple]],
        gone: list[tuple[str]] | None = None,
        old_versions: bool = False,
    ) -> bool:
        """Write `rows` and delete the rows of `gone` paths (and of other
        versions) in one transaction, again while another process holds the
        file; False when the file cannot be written (logged: the mount goes
        on without it)."""
        while True:
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    for (sql, _), row in rows:
                        db.execute(sql, row)
                    for table in _TABLES:
                        if gone:
                            db.executemany(f"DELETE FROM {table} WHERE path = ?", gone)
                        if old_versions:
                            db.execute(f"DELETE FROM {table} WHERE version != ?", (self.version,))
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                return True
            except sqlite3.Error as e:
                if getattr(e, "sqlite_errorcode", None) in _BUSY and not self._closed:
                    time.sleep(self.RETRY)
                    continue
                log.warning("index %s: cannot write (%s): working without it", self.path, e)
                with self._lock:
                    self._writer = None
                    self._rows.clear()
                    self._prune.clear()
                    self._wake.notify_all()
                return False

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until what was queued is on disk; whether it is."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._writer is not None and (self._rows or self._prune or self._writing):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._wake.wait(left)
            return True

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (waiting at most `timeout` seconds for a file
        another process holds), then stop the writer."""
        with self._lock:
            writer, self._closed = self._writer, True
            self._wake.notify_all()
        if writer is not None:
            writer.join(timeout)
            if writer.is_alive():
                log.warning("index %s: still held by another process; what this mount learnt is not kept", self.path)


def _gone(path: str) -> bool:
    """Whether nothing is at `path` any more."""
    try:
        os.lstat(path)
    except OSError as e:
        return e.errno in (errno.ENOENT, errno.ENOTDIR)
    return False
