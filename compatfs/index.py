"""The persistent index: what `getattr` and `readdir` need of each blob's
views, so that a listing never parses a blob it has seen before, across
remounts.

One SQLite file in the user's cache folder (`$COMPATFS_CACHE_DIR`, else
`$XDG_CACHE_HOME/compatfs`, else `~/.cache/compatfs`), never inside the store.
An entry is keyed by the blob's path and identity (device, inode, size,
modification and change time), by the translation's version (a digest of the code that
decides a view's bytes) and by whether translation is on; an entry whose
identity or version differs is ignored and replaced.  The file is safe to
delete; a file that SQLite cannot read is moved aside and rebuilt, with a log
line.  Each write is one transaction.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from .blobfile import Stamp

log = logging.getLogger("compatfs")



@dataclass(frozen=True)
class Summary:
    """A blob's views as `stat` sees them: sizes (None: no such view), the
    handlers that make them, or why the blob cannot be presented."""

    model_size: int
    mmproj_size: int | None
    text: str | None = None
    clip: str | None = None
    error: str | None = None
    arch: str | None = None     # general.architecture of model.gguf (after translation)


@functools.lru_cache(maxsize=None)
def translation_version() -> str:
    """A digest of the source of every module that decides a view's bytes."""
    from . import handlers
    here = Path(__file__).resolve().parent
    files = sorted(here.glob("*.py")) + sorted(Path(handlers.__file__).resolve().parent.glob("*.py"))
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def default_path() -> Path:
    base = os.environ.get("COMPATFS_CACHE_DIR")
    if base:
        return Path(base) / "index.sqlite3"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "compatfs" / "index.sqlite3"


_SCHEMA = """
CREATE TABLE IF NOT EXISTS views_v2 (
    path TEXT NOT NULL, version TEXT NOT NULL, translate INTEGER NOT NULL,
    dev INTEGER NOT NULL, ino INTEGER NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
    model_size INTEGER NOT NULL, mmproj_size INTEGER, text TEXT, clip TEXT, error TEXT, arch TEXT,
    PRIMARY KEY (path, version, translate))
"""


class Index:
    """Summaries by blob path, kept in memory and (with a `path`) on disk."""

    def __init__(self, path: Path | None, translate: bool, version: str | None = None):
        self.path = path
        self.translate = int(translate)
        self.version = version or translation_version()
        self._lock = threading.Lock()
        self._mem: dict[str, tuple[Stamp, Summary]] = {}
        self._db: sqlite3.Connection | None = None
        if path is not None:
            self._open()

    def _open(self) -> None:
        try:
            self._db = self._connect()
        except sqlite3.DatabaseError as e:
            aside = self.path.with_name(self.path.name + ".corrupt")
            log.warning("index %s is unreadable (%s): moved to %s and rebuilt", self.path, e, aside.name)
            os.replace(self.path, aside)
            try:
                self._db = self._connect()
            except sqlite3.Error as e2:
                log.warning("index %s cannot be used (%s): working without it", self.path, e2)
                self._db = None
        except (sqlite3.Error, OSError) as e:
            log.warning("index %s cannot be used (%s): working without it", self.path, e)
            self._db = None

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=10, check_same_thread=False, isolation_level=None)
        try:
            db.execute(_SCHEMA)
            rows = db.execute(
                "SELECT path, dev, ino, size, mtime_ns, ctime_ns, model_size, mmproj_size, text, clip, error, arch FROM views_v2 "
                "WHERE version = ? AND translate = ?", (self.version, self.translate)).fetchall()
        except sqlite3.Error:
            db.close()
            raise
        for path, dev, ino, size, mtime, ctime, *summary in rows:
            self._mem[path] = ((dev, ino, size, mtime, ctime), Summary(*summary))
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
            if self._db is None:
                return
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO views_v2 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (str(path), self.version, self.translate, *stamp, summary.model_size, summary.mmproj_size,
                     summary.text, summary.clip, summary.error, summary.arch))
            except sqlite3.Error as e:
                log.warning("index %s: cannot write (%s): working without it", self.path, e)
                self._db = None

    def forget(self, path: Path) -> None:
        """Drop the in-memory entry (the disk entry stays for a remount)."""
        with self._lock:
            self._mem.pop(str(path), None)

    def known(self) -> set[str]:
        with self._lock:
            return set(self._mem)
