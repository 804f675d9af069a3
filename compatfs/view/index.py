"""The persistent index: what `getattr` and `readdir` need of each blob's
views, so that a listing never parses a blob it has seen before, across
remounts.

One SQLite file in the user's cache folder (`$COMPATFS_CACHE_DIR`, else
`$XDG_CACHE_HOME/compatfs`, else `~/.cache/compatfs`), never inside the store.
An entry is keyed by the blob's path and identity (device, inode, size,
modification and change time), by the translation's version (a digest of the code that
decides a view's bytes) and by whether translation is on; an entry whose
identity or version differs is ignored and replaced.  Beside each blob's
summary (its views' sizes, handlers, whether model.gguf is an embedding
model) the index keeps the size of its model.gguf with each set of
params-layer sampling KVs a model folder gave it (`sampled`), keyed alike
and by those KVs' encoding.  An entry is a hint,
never the truth for serving: one whose values are not of their kinds is
ignored, one that records an error is made again once per mount, and one
that a view belies is made again (`BlobViews.view`).

The file is safe to delete.  A path that is a folder is refused
(`IndexPathError`).  A regular file that SQLite finds corrupt (not a
database, or malformed) is moved to `<file>.corrupt` (replacing a regular
file there, never anything else) and rebuilt; anything else that keeps the
file from being used (a cache folder that cannot be written, a folder at
`<file>.corrupt`) leaves the mount without the persistent index, with one
log line.  Nothing else is ever renamed.  Each write is one transaction,
not synced to the disk (a cache need not outlive a crash of the machine; a
file a crash left corrupt is set aside and rebuilt, as above): indexing a
thousand new blobs costs no thousand disk flushes.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import sqlite3
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from ..files.blobfile import Stamp

log = logging.getLogger(__name__)

_CORRUPT = {11, 26}   # SQLITE_CORRUPT, SQLITE_NOTADB: the file is not a sound database
_MAX_SIZE = 1 << 62   # a view size beyond this is no size of a real file


class IndexPathError(ValueError):
    """The index path names something that cannot be the index (a folder)."""


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
    model_error: str | None = None    # why model.gguf is refused (its size then 0)
    mmproj_error: str | None = None   # why mmproj.gguf is refused (its size then 0)
    embedding: bool = False           # model.gguf names a pooling type for its architecture

    def sound(self) -> bool:
        """Whether every value is of its kind (an entry read from disk may be anything)."""
        def size(v) -> bool:
            return type(v) is int and 0 <= v < _MAX_SIZE

        def text(v) -> bool:
            return v is None or type(v) is str

        return size(self.model_size) and (self.mmproj_size is None or size(self.mmproj_size)) and all(
            map(text, (self.text, self.clip, self.error, self.arch, self.model_error, self.mmproj_error))) \
            and type(self.embedding) is bool

    @property
    def failed(self) -> bool:
        return any((self.error, self.model_error, self.mmproj_error))


# The subpackages whose code decides what a summary holds (a view's size,
# its claims, the sampling keys' size: `format/` holds the params layer's
# reader), besides the handlers; the commands, the FUSE layer and the
# sources do not.
_DECISIVE_PACKAGES = ("format", "translate", "view")


def decisive_files() -> list[Path]:
    """The source files `translation_version` digests."""
    from .. import handlers  # type: ignore[attr-defined]  # handlers/, by package-dir: mypy cannot see it
    top = Path(__file__).resolve().parent.parent
    files = [f for d in _DECISIVE_PACKAGES for f in sorted((top / d).glob("*.py"))]
    return files + sorted(Path(handlers.__file__).resolve().parent.glob("*.py"))


@functools.lru_cache(maxsize=None)
def translation_version() -> str:
    """A digest of the source of every module that decides a view's bytes
    (`decisive_files`): an edit to any of them makes every index entry
    stale, an edit elsewhere none."""
    h = hashlib.sha256()
    for f in decisive_files():
        h.update(f"{f.parent.name}/{f.name}".encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def default_path() -> Path:
    base = os.environ.get("COMPATFS_CACHE_DIR")
    if base:
        return Path(base) / "index.sqlite3"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "compatfs" / "index.sqlite3"


_SCHEMA = ("""
CREATE TABLE IF NOT EXISTS views_v4 (
    path TEXT NOT NULL, version TEXT NOT NULL, translate INTEGER NOT NULL,
    dev INTEGER NOT NULL, ino INTEGER NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
    model_size INTEGER NOT NULL, mmproj_size INTEGER, text TEXT, clip TEXT, error TEXT, arch TEXT,
    model_error TEXT, mmproj_error TEXT, embedding INTEGER NOT NULL,
    PRIMARY KEY (path, version, translate))
""", """
CREATE TABLE IF NOT EXISTS sampled_v1 (
    path TEXT NOT NULL, version TEXT NOT NULL, translate INTEGER NOT NULL,
    dev INTEGER NOT NULL, ino INTEGER NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
    kvs TEXT NOT NULL, model_size INTEGER NOT NULL,
    PRIMARY KEY (path, version, translate, kvs))
""")
_OLD_TABLES = ("views", "views_v2", "views_v3")   # earlier layouts, dropped


class Index:
    """Summaries by blob path, kept in memory and (with a `path`) on disk."""

    def __init__(self, path: Path | None, translate: bool, version: str | None = None):
        self.path = path
        self.translate = int(translate)
        self.version = version or translation_version()
        self._lock = threading.Lock()
        self._mem: dict[str, tuple[Stamp, Summary]] = {}
        self._sampled: dict[tuple[str, str], tuple[Stamp, int]] = {}   # (path, kvs) -> (stamp, size)
        self._db: sqlite3.Connection | None = None
        if path is not None:
            self._open(path)

    def _open(self, path: Path) -> None:
        try:
            if path.is_dir():
                raise IndexPathError(f"the index {path} is a folder, not a file")
            try:
                self._db = self._connect(path)
            except sqlite3.DatabaseError as e:
                if getattr(e, "sqlite_errorcode", None) not in _CORRUPT:
                    raise
                self._set_aside(path, e)
                self._db = self._connect(path)
        except (sqlite3.Error, OSError) as e:
            log.warning("index %s cannot be used (%s): working without the persistent index", path,
                        getattr(e, "strerror", None) or e)
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
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        db = sqlite3.connect(path, timeout=10, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA synchronous = OFF")
            for table in _SCHEMA:
                db.execute(table)
            for old in _OLD_TABLES:
                db.execute(f"DROP TABLE IF EXISTS {old}")
            rows = db.execute(
                "SELECT path, dev, ino, size, mtime_ns, ctime_ns, model_size, mmproj_size, text, clip, error, arch, "
                "model_error, mmproj_error, embedding FROM views_v4 WHERE version = ? AND translate = ?",
                (self.version, self.translate)).fetchall()
            sampled = db.execute(
                "SELECT path, dev, ino, size, mtime_ns, ctime_ns, kvs, model_size FROM sampled_v1 "
                "WHERE version = ? AND translate = ?", (self.version, self.translate)).fetchall()
        except sqlite3.Error:
            db.close()
            raise
        ignored = 0
        for path, *stamp_summary in rows:
            stamp, values, embedding = tuple(stamp_summary[:5]), stamp_summary[5:-1], stamp_summary[-1]
            summary = dataclasses.replace(Summary(*values),   # SQLite gives 0 or 1; anything else is unsound
                                          embedding=embedding == 1 if embedding in (0, 1) else embedding)
            if type(path) is str and all(type(v) is int for v in stamp) and summary.sound() and not summary.failed:
                self._mem[path] = (stamp, summary)
            else:
                ignored += 1
        for path, *stamp_kvs_size in sampled:
            stamp, kvs, size = tuple(stamp_kvs_size[:5]), stamp_kvs_size[5], stamp_kvs_size[6]
            if type(path) is str and type(kvs) is str and all(type(v) is int for v in stamp) \
                    and type(size) is int and 0 <= size < _MAX_SIZE:
                self._sampled[(path, kvs)] = (stamp, size)
            else:
                ignored += 1
        if ignored:
            log.info("index %s: %d entries made again (they record an error, or hold values of the wrong kind)",
                     path, ignored)
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
                    "INSERT OR REPLACE INTO views_v4 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (str(path), self.version, self.translate, *stamp, summary.model_size, summary.mmproj_size,
                     summary.text, summary.clip, summary.error, summary.arch, summary.model_error,
                     summary.mmproj_error, int(summary.embedding)))
            except sqlite3.Error as e:
                self._unwritable(e)

    def _unwritable(self, e: sqlite3.Error) -> None:
        log.warning("index %s: cannot write (%s): working without it", self.path, e)
        self._db = None

    def sampled(self, path: Path, stamp: Stamp, kvs: str) -> int | None:
        """The size of the blob's model.gguf with the sampling KVs encoded as
        `kvs`, if recorded for the blob of that identity."""
        with self._lock:
            hit = self._sampled.get((str(path), kvs))
        return hit[1] if hit is not None and hit[0] == stamp else None

    def put_sampled(self, path: Path, stamp: Stamp, kvs: str, size: int) -> None:
        with self._lock:
            self._sampled[(str(path), kvs)] = (stamp, size)
            if self._db is None:
                return
            try:
                self._db.execute("INSERT OR REPLACE INTO sampled_v1 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                 (str(path), self.version, self.translate, *stamp, kvs, size))
            except sqlite3.Error as e:
                self._unwritable(e)

    def retain(self, keep: set[str]) -> None:
        """Drop the in-memory entries of every blob path not in `keep` (the
        disk entries stay for a remount)."""
        with self._lock:
            for path in [p for p in self._mem if p not in keep]:
                del self._mem[path]
            for key in [k for k in self._sampled if k[0] not in keep]:
                del self._sampled[key]
