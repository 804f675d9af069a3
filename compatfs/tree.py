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

The root may also show files the tree does not make itself: a `RootFiles`
the FUSE layer hands it (`publish`) is asked for them at each scan, given the
new snapshot and its folders' marks (the mount's `models.ini`, made from the
scan, never by looking into the mount).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .files.access import READ, Chain, Recorder, everyone_who_may
from .files.lookup import identity, status, statuses
from .files.walkscope import scope
from .view.sampling import Layers, layers_of, retain_layers, saw_layers
from .sources.base import Folder, Listing, Source
from .view.catalog import BlobViews
from .names import LAYER_FILE, MMPROJ_FILE, MODEL_FILE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileRef:
    """A virtual file: the `kind` view of the blob at `blob` (a model folder's
    model.gguf: with what its Modelfile layers `params` give it (view.sampling);
    a file the mount makes itself, `models.ini`: `readable_as` is the folder
    on disk whose permission to read decides who may open it)."""

    blob: Path
    kind: str
    params: Layers | None = None
    readable_as: Path | None = None


class RootFiles(Protocol):
    """Files the root shows besides its folders, made from each scan."""

    def files(self, tree: Tree, snap: Snapshot, marks: dict[str, tuple | None]) -> dict[str, FileRef]:
        """The files, by name, for `snap` (`marks`: its folders' `Tree.marks`)."""

    def stale(self) -> None:
        """Make them afresh at the next scan, whatever the marks say."""

    def withdraw(self) -> None:
        """They are shown no more: remove what was made for them."""


class Snapshot:
    """Directories and model folders of one listing; `files`: each folder's files
    that do not depend on a blob's contents (all but a monolithic blob's
    mmproj.gguf), made once; `ggufs`: every GGUF file behind a folder, in the
    order the listing gives (what a listing asks for next is what the
    indexing workers take next); `marks`: `Tree.marks` as the scan found them.
    A folder the `previous` snapshot had, made of the same `Folder` (a
    source keeps an unchanged folder's), keeps its files."""

    def __init__(self, listing: Listing, previous: Snapshot | None = None):
        self.listing = listing
        self.marks: dict[str, tuple | None] = {}
        self.owners: dict[Path, os.stat_result | None] = {}  # each folder's `Source.owner` as the scan found it
        self.dirs: dict[str, set[str]] = {"": set()}
        self.files: dict[str, dict[str, FileRef]] = {}
        before = previous.listing.folders if previous is not None else {}
        for name, folder in listing.folders.items():
            self._add_dir(name)
            if before.get(name) is folder and previous is not None:
                self.files[name] = previous.files[name]
                continue
            files = {
                MODEL_FILE: FileRef(
                    folder.model, MODEL_FILE, layers_of(folder.params, folder.template, folder.system, folder.messages)
                )
            }
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
            self.dirs.setdefault("/".join(parts[: i + 1]), set())


class HiddenNames:
    """Leaves out of a listing each folder whose name or files the store hides
    from some who may list the folder its mounted parent mirrors: a caller
    (other than root) granted reading that folder is not granted reading
    every store file they are read from (`Folder.told_by`: folders listed,
    manifests read; `access.everyone_who_may`).

    Decided for everyone at once, so every caller sees the same listings (as
    the kernel caches them).  A path is walked again (the permissions met on
    the way to it recorded) only when its status changed, and every path
    below it too when what it grants changed; a name is decided again only
    when the permissions met on the way to its paths changed, never for their
    times alone (a pull moves the shared folders' times, not what they grant)."""

    def __init__(self) -> None:
        self._paths: dict[Path, tuple[tuple, tuple | None]] = {}  # path -> (its mark, the steps a walk to it met)
        self._known: dict[tuple, bool] = {}  # the steps met on the way to a name's paths -> whether it is shown
        self._steps: dict[tuple, tuple] = {}  # a step (uid, gid, mode, ACL, bit) -> (status, ACL, bit) met so

    def _walk(self, p: Path) -> tuple | None:
        """The steps the walk to `p` met (None where it cannot be walked)."""
        rec = Recorder()
        try:
            status(p, rec, READ)
        except OSError:
            return None
        steps = []
        for st, acl, bit in rec.chain:
            step = (st.st_uid, st.st_gid, st.st_mode, acl, bit)
            self._steps.setdefault(step, (st, acl, bit))
            steps.append(step)
        return tuple(steps)

    def _chain(self, steps: tuple) -> Chain:
        return [self._steps[step] for step in steps]

    def hide(self, source: Source, listing: Listing) -> None:
        named = {name: f for name, f in listing.folders.items() if f.told_by}
        owners = {name: source.owner(name.rpartition("/")[0], listing) for name in named}
        wanted = {p for f in named.values() for p in f.told_by} | set(owners.values())
        found = {p: s for p, s in listing.seen.items() if p in wanted}  # (the scan's own: not read again)
        st: dict[Path, os.stat_result | OSError] = {**statuses(wanted - found.keys()), **found}
        paths: dict[Path, tuple[tuple, tuple | None]] = {}
        granting: list[Path] = []  # paths whose steps changed: those below them are walked again
        for p in sorted(wanted, key=lambda p: p.parts):  # (a folder first, then what is in it: walked from it)
            s = st[p]
            mark = (s.strerror,) if isinstance(s, OSError) else (*identity(s), s.st_uid, s.st_gid, s.st_mode)
            old = self._paths.get(p)
            if old is not None and old[0] == mark and not any(g in p.parents for g in granting):
                paths[p] = old
                continue
            paths[p] = (mark, self._walk(p))
            if old is not None and old[1] != paths[p][1]:
                granting.append(p)
        known: dict[tuple, bool] = {}
        for name, f in named.items():
            gate, *then = (paths[p][1] for p in (owners[name], *f.told_by))
            k = (gate, *then)
            shown = self._known.get(k)
            if shown is None:
                shown = (
                    gate is not None
                    and all(c is not None for c in then)
                    and everyone_who_may(self._chain(gate), [d for c in then if c is not None for d in self._chain(c)])
                )
            known[k] = shown
            if not shown:
                del listing.folders[name]
                listing.skipped[name] = (
                    f"its name or manifest is not readable in the store by everyone who may list {owners[name]}"
                )
        used = {step for steps in (v[1] for v in paths.values()) if steps for step in steps}
        self._paths, self._known = paths, known
        self._steps = {step: self._steps[step] for step in used}


def _layers(folder: Folder) -> tuple[Path, ...]:
    """The Modelfile layers whose contents model.gguf carries (`view.sampling`)."""
    return tuple(p for p in (folder.params, folder.template, folder.system, folder.messages) if p is not None)


class Tree:
    def __init__(self, source: Source, views: BlobViews, rescan_seconds: float = 1.0):
        self.source = source
        self.views = views
        self.rescan_seconds = rescan_seconds
        self._snap: Snapshot | None = None
        self._stamp = 0.0
        self._followed = False
        self._lock = threading.Lock()  # held only to swap a snapshot in
        self._building = threading.Lock()  # one rescan at a time
        self._root_files: RootFiles | None = None  # what else the root shows (the FUSE layer's)
        self._names = HiddenNames()

    def publish(self, root_files: RootFiles) -> None:
        """Show `root_files`' files at the root, from the next scan on."""
        self._root_files = root_files

    def unpublish(self) -> None:
        """Show no files of a `RootFiles` any more, and let it remove its own
        (the mount has ended)."""
        if self._root_files is not None:
            self._root_files.withdraw()
            self._root_files = None

    def marks(self, snap: Snapshot) -> dict[str, tuple | None]:
        """What a rescan compares: every folder that holds GGUF files, with the
        identity (path, device, inode, size, modification and change time) and
        owner and mode of each file behind it (what changes when a model is
        added again, removed, its file rewritten or its permissions changed),
        and, as `<path>` (relative to the source's root), the owner, mode and
        time of every folder on disk a mounted folder mirrors (a change there
        changes folders the files do not tell).  Each file's status is read as
        `lookup.status` resolves it (`lookup.statuses`: nothing is opened but
        folders); one whose status cannot be read is marked by why."""
        return {**self._folder_marks(snap), **self._root_marks(snap)}

    @staticmethod
    def _file_mark(blob: Path, st: os.stat_result | OSError) -> tuple:
        if isinstance(st, OSError):
            return (str(blob), st.strerror)
        return (str(blob), *identity(st), st.st_uid, st.st_gid, st.st_mode)

    def _folder_marks(self, snap: Snapshot) -> dict[str, tuple | None]:
        """`marks` of the folders that hold GGUF files (the regular files'
        statuses kept in the listing's `seen`, as the scan found them)."""
        return self._marks_of(snap.listing.folders, snap.listing.seen)

    def mark_now(self, snap: Snapshot, name: str) -> tuple | None:
        """The `marks` entry of `snap`'s folder `name` as the store is now
        (None for a folder `snap` does not have)."""
        folder = snap.listing.folders.get(name)
        return None if folder is None else self._marks_of({name: folder})[name]

    def _marks_of(
        self, folders: dict[str, Folder], seen: dict[Path, os.stat_result] | None = None
    ) -> dict[str, tuple | None]:
        files = {
            p for f in folders.values() for p in (f.model, f.projector, *(p for _, p in f.passed)) if p is not None
        }
        layers = {p for f in folders.values() for p in _layers(f)}
        st = statuses(files | layers)
        self.views.saw(st)  # (listing: stat and readdir answer from these until the next scan)
        saw_layers({p: st[p] for p in layers})  # (model.gguf's KVs: what its layers give until the next scan)
        if seen is not None:
            seen.update((p, s) for p, s in st.items() if isinstance(s, os.stat_result) and stat.S_ISREG(s.st_mode))
        mark = self._file_mark

        def of(p: Path | None) -> tuple | None:
            return None if p is None else mark(p, st[p])

        return {name: (of(f.model), of(f.projector), *((n, of(p)) for n, p in f.passed)) for name, f in folders.items()}

    def _root_marks(self, snap: Snapshot) -> dict[str, tuple | None]:
        """`marks` of the root's own files and of the folders on disk mounted folders mirror."""
        out: dict[str, tuple | None] = {}
        root = [ref.blob for ref in snap.files.get("", {}).values()]  # a RootFiles' (models.ini)
        out[""] = tuple(self._file_mark(p, st) for p, st in statuses(set(root)).items())
        owners = {self.source.owner(d, snap.listing) for d in snap.dirs}
        for owner in sorted(owners):
            try:
                st: os.stat_result | None = status(owner)
            except OSError:
                st = None
            snap.owners[owner] = st
            mark = None if st is None else (st.st_uid, st.st_gid, st.st_mode, st.st_mtime_ns)
            out[f"<{os.path.relpath(owner, self.source.root)}>"] = mark
        return out

    def owner(self, folder: str) -> Path:
        """The folder on disk whose owner and mode `folder` mirrors (and which
        a caller must be able to list to list it)."""
        return self.source.owner(folder, self.snapshot().listing)

    def folder_attrs(self, folder: str) -> dict:
        """A mounted folder's owner, mode (read and search bits of its owner on
        disk) and times, as the last scan found its owner (the scan that
        finds it changed has every folder's answers forgotten: `marks`); the
        caller's own, with mode 0500, when that cannot be read."""
        snap = self.snapshot()
        listing = snap.listing
        owner = self.source.owner(folder, listing)
        st = snap.owners.get(owner)
        if owner not in snap.owners:
            try:
                st = status(owner)
            except OSError:
                st = None
        if st is not None:
            attrs = {"st_uid": st.st_uid, "st_gid": st.st_gid, "st_mode": stat.S_IFDIR | st.st_mode & 0o555}
            owner_mtime = st.st_mtime_ns
        else:
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
        elif (
            self._followed
            or time.monotonic() - self._stamp < self.rescan_seconds
            or not self._building.acquire(blocking=False)
        ):
            return snap
        try:
            current = self._snap
            if current is not None and current is not snap:  # made while this thread waited for the first one
                return current
            return self._rescan()
        finally:
            self._building.release()

    def rescan(self) -> Snapshot:
        """Scan the source now and swap the new snapshot in."""
        with self._building:
            return self._rescan()

    def watched(self, snap: Snapshot) -> set[Path]:
        """The folders on disk where a change may change what `snap` shows:
        those its scan listed and those holding the files it names."""
        out = set(snap.listing.read)
        for f in snap.listing.folders.values():
            out.update(p.parent for p in (f.model, f.projector, *(p for _, p in f.passed)) if p is not None)
        return out

    def stale_root_files(self) -> None:
        """Have the root's other files made afresh at the next scan (what a
        blob's summary said of it was wrong)."""
        if self._root_files is not None:
            self._root_files.stale()

    def _rescan(self) -> Snapshot:
        with scope():  # (the scan's walks share the folders they pass: `walkscope.scope`)
            return self._scan()

    def _scan(self) -> Snapshot:
        previous = self._snap
        listing = self.source.scan()
        self._names.hide(self.source, listing)
        snap = Snapshot(listing, previous)
        folders = self._folder_marks(snap)
        new = previous is None or previous.ggufs != snap.ggufs
        if self._root_files is not None:
            if new:
                # The root's files (models.ini) need every new blob's
                # summary: the indexing workers take them from the end while
                # this thread takes them from the start.
                self.views.prefetch(list(reversed(snap.ggufs)))
            extra = self._root_files.files(self, snap, folders)
            if extra:
                snap.files[""] = extra
        snap.marks = {**folders, **self._root_marks(snap)}
        retain_layers({p for f in snap.listing.folders.values() for p in _layers(f)})
        with self._lock:
            self._snap, self._stamp = snap, time.monotonic()
        if new:
            self.views.prefetch(list(snap.ggufs))
        return snap

    def files(self, snap: Snapshot, path: str) -> dict[str, FileRef] | None:
        """The files of directory `path` (None when `path` holds no GGUF files)."""
        files = snap.files.get(path)
        if files is None:
            return None
        blob = snap.mmproj_of(path)
        if blob is not None and self.views.has_mmproj(blob):
            files = {**files, MMPROJ_FILE: FileRef(blob, MMPROJ_FILE)}
        return files

    def entries(self, path: str) -> list[tuple[str, FileRef | None]] | None:
        """The entries of the folder at `path` in name order, each as `lookup`
        finds it: a file with its FileRef, a folder with None; in one look
        at one snapshot.  None when no folder is there."""
        return self._entries(self.snapshot(), path.strip("/"))

    def _entries(self, snap: Snapshot, path: str) -> list[tuple[str, FileRef | None]] | None:
        files, dirs = self.files(snap, path), snap.dirs.get(path)
        if files is None and dirs is None:
            return None
        files, dirs = files or {}, dirs or set()
        return [(name, None if name in dirs else files[name]) for name in sorted(set(files) | dirs)]

    def is_folder(self, path: str) -> bool:
        """Whether `lookup` finds a folder at `path` (nothing of it looked at)."""
        return path.strip("/") in self.snapshot().dirs

    def lookup(self, path: str) -> FileRef | list[str] | None:
        """A FileRef, a directory listing, or None when nothing is there."""
        path = path.strip("/")
        snap = self.snapshot()
        found = self._entries(snap, path)
        if found is not None:
            return [name for name, _ in found]
        parent, _, leaf = path.rpartition("/")
        files = snap.files.get(parent)
        if files is None:
            return None
        if leaf in files:
            return files[leaf]
        blob = snap.mmproj_of(parent) if leaf == MMPROJ_FILE else None
        return FileRef(blob, MMPROJ_FILE) if blob is not None and self.views.has_mmproj(blob) else None
