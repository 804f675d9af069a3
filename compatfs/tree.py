"""The mounted directory tree, derived from a scan of a `Source`.

Each folder of the source's listing is a folder of the mount, holding
`model.gguf` (the text view of its model GGUF), `mmproj.gguf` (the
projector view of its projector GGUF, or of the model GGUF where that
holds a projector itself) and the files it passes through, byte for byte;
the folders above them hold only folders.

The source is rescanned at most once per `rescan_seconds` (by the FUSE
layer's rescan thread once it `follow`s the tree), so models added or
removed while mounted appear and disappear without a remount; a rescan is
built off the lock and swapped in, so a lookup never waits for one.
`Tree.marks` tells what a rescan compares (for the FUSE layer to
invalidate what changed); `Tree.folder_attrs` whose owner, mode and time
a folder shows.

Once `publish`ed at its mountpoint, the root of a tree with models also
shows `models.ini`: llama-server's router preset of its model folders
(`preset`), with paths under the mountpoint, made from each scan (never by
looking into the mount) and kept as a file of the daemon's state folder,
which the tree shows as a file passed through, readable as the root is.
"""
from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .blobfile import identity, status
from .preset import PUBLISHED_FILE, Entry, Published, is_embedding, published_path, render
from .source import Folder, Listing, Source
from .views import LAYER_FILE, MMPROJ_FILE, MODEL_FILE, BlobViews

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class FileRef:
    """A virtual file: the `kind` view of the blob at `blob` (a model folder's
    model.gguf: with the sampling defaults of the params layer at `params`;
    a file the mount makes itself, `models.ini`: `readable_as` is the folder
    on disk whose permission to read decides who may open it)."""

    blob: Path
    kind: str
    params: Path | None = None
    readable_as: Path | None = None


class Snapshot:
    """Directories and model folders of one listing; `files`: each folder's files
    that do not depend on a blob's contents (all but a monolithic blob's
    mmproj.gguf), made once; `ggufs`: every GGUF file behind a folder, in the
    order the listing gives (what a listing asks for next is what the
    indexing workers take next)."""

    def __init__(self, listing: Listing):
        self.listing = listing
        self.dirs: dict[str, set[str]] = {"": set()}
        self.files: dict[str, dict[str, FileRef]] = {}
        for name, folder in listing.folders.items():
            self._add_dir(name)
            files = {MODEL_FILE: FileRef(folder.model, MODEL_FILE, folder.params)}
            if folder.projector is not None:
                files[MMPROJ_FILE] = FileRef(folder.projector, MMPROJ_FILE)
            files.update((n, FileRef(path, LAYER_FILE)) for n, path in folder.passed)
            self.files[name] = files
        self.ggufs = tuple(dict.fromkeys(p for folder in listing.folders.values() for p in folder.ggufs()))

    @property
    def models(self) -> dict[str, Folder]:
        """The folders that are models (what `ls` lists), by name."""
        return {name: f for name, f in self.listing.folders.items() if f.is_model}

    def mmproj_of(self, folder: str) -> Path | None:
        """The blob whose contents decide whether `folder` has an mmproj.gguf
        (a folder without a projector GGUF); None otherwise."""
        files = self.files[folder]
        return None if MMPROJ_FILE in files or MODEL_FILE not in files else files[MODEL_FILE].blob

    def _add_dir(self, path: str) -> None:
        parts = path.split("/")
        for i in range(len(parts)):
            parent, child = "/".join(parts[:i]), parts[i]
            self.dirs.setdefault(parent, set()).add(child)
            self.dirs.setdefault("/".join(parts[:i + 1]), set())


class Tree:
    def __init__(self, source: Source, views: BlobViews, rescan_seconds: float = 1.0):
        self.source = source
        self.views = views
        self.rescan_seconds = rescan_seconds
        self._snap: Snapshot | None = None
        self._stamp = 0.0
        self._followed = False
        self._lock = threading.Lock()      # held only to swap a snapshot in
        self._building = threading.Lock()  # one rescan at a time
        self._publishing: tuple[Published, Path] | None = None   # models.ini, and the mountpoint it names

    def publish(self, mountpoint: Path) -> None:
        """Show `models.ini` at the root, its paths under `mountpoint` (absolute),
        from the next scan on; not when the daemon has no state folder, or one
        inside the mountpoint (logged).  Called before the mount is made."""
        try:
            path = published_path(mountpoint)
            if Path(os.path.realpath(path)).is_relative_to(os.path.realpath(mountpoint)):
                raise OSError(f"the state folder {path.parent} is inside the mountpoint")
        except OSError as e:
            log.error("no %s at the mount's root: %s", PUBLISHED_FILE, e)
            return
        self._publishing = Published(path), mountpoint

    def unpublish(self) -> None:
        """Stop showing `models.ini` and remove its file (the mount has ended)."""
        if self._publishing is not None:
            self._publishing[0].withdraw()
            self._publishing = None

    def marks(self, snap: Snapshot) -> dict[str, tuple | None]:
        """What a rescan compares: every folder that holds GGUF files, with the
        identity (path, device, inode, size, modification and change time) and
        owner and mode of each file behind it (what changes when a model is
        added again, removed, its file rewritten or its permissions changed),
        and, as `<path>` (relative to the source's root), the owner, mode and
        time of every folder on disk a mounted folder mirrors (a change there
        changes folders the files do not tell).  Files are opened as
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

        out: dict[str, tuple | None] = {
            name: (stamp(f.model), stamp(f.projector), *((n, stamp(p)) for n, p in f.passed))
            for name, f in snap.listing.folders.items()}
        out[""] = tuple(stamp(ref.blob) for ref in snap.files.get("", {}).values())   # the root's models.ini
        owners = {self.source.owner(d, snap.listing) for d in snap.dirs}
        for owner in sorted(owners):
            try:
                st = status(owner)
                mark: tuple | None = (st.st_uid, st.st_gid, st.st_mode, st.st_mtime_ns)
            except OSError:
                mark = None
            out[f"<{os.path.relpath(owner, self.source.root)}>"] = mark
        return out

    def owner(self, folder: str) -> Path:
        """The folder on disk whose owner and mode `folder` mirrors (and which
        a caller must be able to list to list it)."""
        return self.source.owner(folder, self.snapshot().listing)

    def folder_attrs(self, folder: str) -> dict:
        """A mounted folder's owner, mode (read and search bits of its owner on
        disk) and times; the caller's own, with mode 0500, when that cannot be
        read."""
        listing = self.snapshot().listing
        try:
            st = status(self.source.owner(folder, listing))
            attrs = {"st_uid": st.st_uid, "st_gid": st.st_gid, "st_mode": stat.S_IFDIR | st.st_mode & 0o555}
            owner_mtime = st.st_mtime_ns
        except OSError:
            attrs = {"st_uid": os.getuid(), "st_gid": os.getgid(), "st_mode": stat.S_IFDIR | 0o500}
            owner_mtime = 0
        mtime = self.source.mtime(folder, listing, owner_mtime)
        return {**attrs, "st_mtime": mtime, "st_ctime": mtime, "st_atime": mtime}

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
        if snap is None:
            self._building.acquire()
        elif self._followed or time.monotonic() - self._stamp < self.rescan_seconds \
                or not self._building.acquire(blocking=False):
            return snap
        try:
            current = self._snap
            if current is not None and current is not snap:   # made while this thread waited for the first one
                return current
            return self._rescan()
        finally:
            self._building.release()

    def rescan(self) -> Snapshot:
        """Scan the source now and swap the new snapshot in."""
        with self._building:
            return self._rescan()

    def _rescan(self) -> Snapshot:
        previous = self._snap
        snap = Snapshot(self.source.scan())
        if self._publishing is not None:
            self._publish(snap, *self._publishing)
        with self._lock:
            self._snap, self._stamp = snap, time.monotonic()
        if previous is None or previous.ggufs != snap.ggufs:
            self.views.prefetch(list(snap.ggufs))
        return snap

    def _publish(self, snap: Snapshot, published: Published, mountpoint: Path) -> None:
        """Render the preset of `snap`'s models (none: no file), paths under
        `mountpoint`, into `published` and show it at the root."""
        models = snap.models
        if not models:
            published.remove()
            return
        try:
            entries = [Entry(name, mountpoint / name, MMPROJ_FILE in (self._files(snap, name) or {}), f.params,
                             is_embedding(f.model)) for name, f in sorted(models.items())]
            owner = self.source.owner("", snap.listing)
            try:
                like = status(owner)
            except OSError:
                like = None
            shown = published.update(render(entries), like)
        except Exception:   # a bad store file must never fail a scan
            log.exception("cannot make the mount's %s", PUBLISHED_FILE)
            return
        if shown:
            snap.files[""] = {PUBLISHED_FILE: FileRef(published.path, LAYER_FILE, readable_as=owner)}

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
