"""The mounted directory tree, derived from a scan of the store.

    /<model>:<tag>/model.gguf            library models at the top
    /<host>/<namespace>/<model>:<tag>/   everything else nested, as `ollama list` names it
    /blobs/sha256-<hex>/model.gguf       every GGUF blob (model, projector, adapter) a manifest names
    .../mmproj.gguf                      where the model has a projector view
    .../params.json, template, system, license
                                         the manifest's layers of those types, byte for byte

The store is rescanned at most once per `rescan_seconds`, so models pulled or
removed while mounted appear and disappear without a remount; `Tree.folders`
tells which folders a rescan changed (for the FUSE layer to invalidate).
"""
from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .blobfile import status
from .gguf_source import blob_identity
from .store import Scan, Store
from .views import LAYER_FILE, MMPROJ_FILE, MODEL_FILE, BlobViews

BLOBS = "blobs"

# Manifest layers shown beside model.gguf, unchanged: media type -> file name.
LAYER_FILES = {
    "application/vnd.ollama.image.params": "params.json",
    "application/vnd.ollama.image.template": "template",
    "application/vnd.ollama.image.system": "system",
    "application/vnd.ollama.image.license": "license",
}


def layer_files(store: Store, layers) -> tuple[tuple[str, Path], ...]:
    """(file name, blob) of the `LAYER_FILES` layers; a second license is
    `license-2`, and so on (Ollama keeps every license layer)."""
    out, seen = [], {}
    for layer in layers:
        base = LAYER_FILES.get(layer.media_type)
        if base is None or (base != "license" and base in seen):
            continue
        seen[base] = seen.get(base, 0) + 1
        out.append((base if seen[base] == 1 else f"{base}-{seen[base]}", store.blob_path(layer.digest)))
    return tuple(out)


@dataclass(frozen=True)
class FileRef:
    """A virtual file: the `kind` view of the blob at `blob`."""

    blob: Path
    kind: str


@dataclass(frozen=True)
class _ModelDir:
    model_blob: Path
    projector_blob: Path | None
    layers: tuple[tuple[str, Path], ...] = ()


class Snapshot:
    """Directories and model folders of one scan."""

    def __init__(self, store: Store, scan: Scan):
        self.scan = scan
        self.model_dirs: dict[str, _ModelDir] = {}
        self.dirs: dict[str, set[str]] = {"": set()}
        self.dir_mtimes: dict[str, int] = {}   # folder -> newest manifest mtime under it
        for name, model in scan.models.items():
            proj = model.projector_layer
            self._add_dir(name)
            self.model_dirs[name] = _ModelDir(store.blob_path(model.model_layer.digest),
                                              store.blob_path(proj.digest) if proj else None,
                                              layer_files(store, model.layers))
            parts = name.split("/")
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                self.dir_mtimes[d] = max(self.dir_mtimes.get(d, 0), model.mtime_ns)
        self.blobs = store.blob_digests(scan)
        if self.blobs:
            self.dirs[""].add(BLOBS)
            self.dirs[BLOBS] = set(self.blobs)

    def _add_dir(self, path: str) -> None:
        parts = path.split("/")
        for i in range(len(parts)):
            parent, child = "/".join(parts[:i]), parts[i]
            self.dirs.setdefault(parent, set()).add(child)
            self.dirs.setdefault("/".join(parts[:i + 1]), set())


def _regular(blob: Path) -> bool:
    """Whether the blob is a regular file (through a symlink): nothing else is
    ever opened (a FIFO in blobs/ would block the open)."""
    try:
        return stat.S_ISREG(status(blob).st_mode)
    except OSError:
        return False


def _listing_order(snap: Snapshot) -> list[Path]:
    """Every blob, those behind model folders first in the order `ls` lists
    them: what a listing asks for next is what the indexing workers take next."""
    folders = [b for name in sorted(snap.model_dirs)
               for b in (snap.model_dirs[name].model_blob, snap.model_dirs[name].projector_blob) if b is not None]
    return list(dict.fromkeys([*folders, *snap.blobs.values()]))


class Tree:
    def __init__(self, store: Store, views: BlobViews, rescan_seconds: float = 1.0):
        self.store = store
        self.views = views
        self.rescan_seconds = rescan_seconds
        self._snap: Snapshot | None = None
        self._stamp = 0.0
        self._lock = threading.Lock()

    def folders(self, snap: Snapshot) -> dict[str, tuple]:
        """Every folder that holds GGUF files, with the identity (path, device,
        inode, size, mtime) and owner and mode of each blob behind it: what
        changes when a model is pulled again, removed, its blob rewritten or
        its permissions changed."""
        stamps: dict[Path, tuple | None] = {}

        def stamp(blob: Path | None) -> tuple | None:
            if blob is None:
                return None
            if blob not in stamps:
                try:
                    st = status(blob)
                    stamps[blob] = (str(blob), *blob_identity(st), st.st_uid, st.st_gid, st.st_mode)
                except OSError:
                    stamps[blob] = (str(blob),)
            return stamps[blob]

        out = {name: (stamp(d.model_blob), stamp(d.projector_blob), *((n, stamp(b)) for n, b in d.layers))
               for name, d in snap.model_dirs.items()}
        out.update({f"{BLOBS}/{digest}": (stamp(blob),) for digest, blob in snap.blobs.items()})
        return out

    def snapshot(self, fresh: bool = False) -> Snapshot:
        """The current scan; made anew when older than `rescan_seconds` (or
        at once with `fresh`: a blob it names was found gone)."""
        with self._lock:
            now = time.monotonic()
            if self._snap is None or fresh or now - self._stamp >= self.rescan_seconds:
                previous = self._snap
                self._snap = Snapshot(self.store, self.store.scan())
                self._stamp = now
                if previous is None or previous.blobs != self._snap.blobs:
                    self.views.prefetch([b for b in _listing_order(self._snap) if _regular(b)])
            return self._snap

    def _files(self, snap: Snapshot, path: str) -> dict[str, FileRef] | None:
        """The files of directory `path` (None when `path` holds no GGUF files)."""
        if path in snap.model_dirs:
            d = snap.model_dirs[path]
            files = {MODEL_FILE: FileRef(d.model_blob, MODEL_FILE)}
            if d.projector_blob is not None:
                files[MMPROJ_FILE] = FileRef(d.projector_blob, MMPROJ_FILE)
            elif _regular(d.model_blob) and self.views.has_mmproj(d.model_blob):
                files[MMPROJ_FILE] = FileRef(d.model_blob, MMPROJ_FILE)
            files.update((name, FileRef(blob, LAYER_FILE)) for name, blob in d.layers)
            return files
        parent, _, digest = path.rpartition("/")
        if parent == BLOBS and digest in snap.blobs:
            blob = snap.blobs[digest]
            files = {MODEL_FILE: FileRef(blob, MODEL_FILE)}
            if _regular(blob) and self.views.has_mmproj(blob):
                files[MMPROJ_FILE] = FileRef(blob, MMPROJ_FILE)
            return files
        return None

    def lookup(self, path: str) -> FileRef | list[str] | None:
        """A FileRef, a directory listing, or None when nothing is there."""
        path = path.strip("/")
        snap = self.snapshot()
        files = self._files(snap, path)
        if files is not None:
            return sorted(set(files) | snap.dirs.get(path, set()))
        if path in snap.dirs:
            return sorted(snap.dirs[path])
        parent, _, leaf = path.rpartition("/")
        files = self._files(snap, parent)
        return files.get(leaf) if files else None
