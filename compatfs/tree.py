"""The mounted directory tree, derived from a scan of the store.

    /<model>:<tag>/model.gguf            library models at the top
    /<host>/<namespace>/<model>:<tag>/   everything else nested, as `ollama list` names it
    /blobs/sha256-<hex>/model.gguf       every GGUF blob (model, projector, adapter) a manifest names
    .../mmproj.gguf                      where the model has a projector view
    .../params.json, template, system, license
                                         the manifest's layers of those types, byte for byte

The store is rescanned at most once per `rescan_seconds` (by the FUSE
layer's rescan thread once it `follow`s the tree), so models pulled or
removed while mounted appear and disappear without a remount; a rescan is
built off the lock and swapped in, so a lookup never waits for one.
`Tree.folders` tells which folders a rescan changed (for the FUSE layer to
invalidate).  A model whose name starts with `blobs/` (a host or namespace
named `blobs`) would hide in the mount's `blobs/` folder: it is left out,
with that reason.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .blobfile import identity, status
from .store import Scan, Store
from .views import LAYER_FILE, MMPROJ_FILE, MODEL_FILE, BlobViews

BLOBS = "blobs"
PARAMS_FILE = "params.json"

# Manifest layers shown beside model.gguf, unchanged: media type -> file name.
LAYER_FILES = {
    "application/vnd.ollama.image.params": PARAMS_FILE,
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
    """A virtual file: the `kind` view of the blob at `blob` (a model folder's
    model.gguf: with the sampling defaults of the params layer at `params`)."""

    blob: Path
    kind: str
    params: Path | None = None


@dataclass(frozen=True)
class _ModelDir:
    model_blob: Path
    projector_blob: Path | None
    layers: tuple[tuple[str, Path], ...] = ()


class Snapshot:
    """Directories and model folders of one scan; `files`: each folder's files
    that do not depend on a blob's contents (all but a monolithic blob's
    mmproj.gguf), made once."""

    def __init__(self, store: Store, scan: Scan):
        self.scan = scan
        self.model_dirs: dict[str, _ModelDir] = {}
        self.dirs: dict[str, set[str]] = {"": set()}
        self.dir_mtimes: dict[str, int] = {}   # folder -> newest manifest mtime under it
        self.files: dict[str, dict[str, FileRef]] = {}
        for name, model in list(scan.models.items()):
            if name.split("/")[0] == BLOBS:
                del scan.models[name]
                scan.skipped[name] = f"its first folder would be {BLOBS}/, where the mount shows every blob"
                continue
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
        for name, d in self.model_dirs.items():
            params = next((b for n, b in d.layers if n == PARAMS_FILE), None)
            files = {MODEL_FILE: FileRef(d.model_blob, MODEL_FILE, params)}
            if d.projector_blob is not None:
                files[MMPROJ_FILE] = FileRef(d.projector_blob, MMPROJ_FILE)
            files.update((n, FileRef(blob, LAYER_FILE)) for n, blob in d.layers)
            self.files[name] = files
        for digest, blob in self.blobs.items():
            self.files[f"{BLOBS}/{digest}"] = {MODEL_FILE: FileRef(blob, MODEL_FILE)}

    def mmproj_of(self, folder: str) -> Path | None:
        """The blob whose contents decide whether `folder` has an mmproj.gguf
        (a model without a projector layer, or a blob folder); None otherwise."""
        files = self.files[folder]
        return None if MMPROJ_FILE in files else files[MODEL_FILE].blob

    def _add_dir(self, path: str) -> None:
        parts = path.split("/")
        for i in range(len(parts)):
            parent, child = "/".join(parts[:i]), parts[i]
            self.dirs.setdefault(parent, set()).add(child)
            self.dirs.setdefault("/".join(parts[:i + 1]), set())


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
        self._followed = False
        self._lock = threading.Lock()      # held only to swap a snapshot in
        self._building = threading.Lock()  # one rescan at a time

    def folders(self, snap: Snapshot) -> dict[str, tuple]:
        """Every folder that holds GGUF files, with the identity (path, device,
        inode, size, modification and change time) and owner and mode of each
        blob behind it: what changes when a model is pulled again, removed, its
        blob rewritten or its permissions changed.  Blobs are opened as
        `blobfile` opens them (never blocking); one that cannot be is marked by
        why."""
        stamps: dict[Path, tuple | None] = {}

        def stamp(blob: Path | None) -> tuple | None:
            if blob is None:
                return None
            if blob not in stamps:
                try:
                    st = status(blob)
                    stamps[blob] = (str(blob), *identity(st), st.st_uid, st.st_gid, st.st_mode)
                except OSError as e:
                    stamps[blob] = (str(blob), e.strerror)
            return stamps[blob]

        out = {name: (stamp(d.model_blob), stamp(d.projector_blob), *((n, stamp(b)) for n, b in d.layers))
               for name, d in snap.model_dirs.items()}
        out.update({f"{BLOBS}/{digest}": (stamp(blob),) for digest, blob in snap.blobs.items()})
        return out

    def follow(self) -> None:
        """From now on only `rescan` rescans (the FUSE layer's rescan thread
        calls it): lookups answer from the last snapshot, however old."""
        self._followed = True

    def snapshot(self, fresh: bool = False) -> Snapshot:
        """The last snapshot; rescanned first when it is older than
        `rescan_seconds` (unless followed) and no other thread rescans: a
        thread never waits for another's rescan, except for the first one.
        With `fresh` (a blob it names was found gone), a new scan, now."""
        if fresh:
            return self.rescan()
        snap = self._snap
        if snap is not None and (self._followed or time.monotonic() - self._stamp < self.rescan_seconds):
            return snap
        if not self._building.acquire(blocking=snap is None):
            return snap
        try:
            if self._snap is not snap:      # made while this thread waited for the first one
                return self._snap
            return self._rescan()
        finally:
            self._building.release()

    def rescan(self) -> Snapshot:
        """Scan the store now and swap the new snapshot in."""
        with self._building:
            return self._rescan()

    def _rescan(self) -> Snapshot:
        previous = self._snap
        snap = Snapshot(self.store, self.store.scan())
        with self._lock:
            self._snap, self._stamp = snap, time.monotonic()
        if previous is None or previous.blobs != snap.blobs:
            self.views.prefetch(_listing_order(snap))
        return snap

    def _files(self, snap: Snapshot, path: str) -> dict[str, FileRef] | None:
        """The files of directory `path` (None when `path` holds no GGUF files)."""
        files = snap.files.get(path)
        if files is None:
            return None
        blob = snap.mmproj_of(path)
        if blob is not None and self.views.has_mmproj(blob):
            files = {**files, MMPROJ_FILE: FileRef(blob, MMPROJ_FILE)}
        return files

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
        files = snap.files.get(parent)
        if files is None:
            return None
        if leaf in files:
            return files[leaf]
        blob = snap.mmproj_of(parent) if leaf == MMPROJ_FILE else None
        return FileRef(blob, MMPROJ_FILE) if blob is not None and self.views.has_mmproj(blob) else None
