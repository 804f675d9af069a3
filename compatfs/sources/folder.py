"""A plain folder tree of GGUF files as a `Source` (LM Studio's
`~/.lmstudio/models/<publisher>/<repo>/`, or any directory).

Each folder on disk that holds `.gguf` files is a model folder of the mount;
files whose name starts with `mmproj` are projectors, the others models:

    <dir>/x.gguf                      -> /<dir>/model.gguf
    <dir>/mmproj-x.gguf               -> /<dir>/mmproj.gguf
    <dir>/a.gguf, <dir>/b.gguf        -> /<dir>/a/model.gguf, /<dir>/b/model.gguf
                                         (several models: a folder each, named by the file
                                         without `.gguf`; the projector goes with every one)
    x.gguf at the top                 -> /x/model.gguf

A model GGUF that holds its projector itself (an Ollama-written monolithic
vision blob) shows an mmproj.gguf of its own where its folder has no
projector file.  A folder with several projector files gives its models
none of them (which belongs to which is not known), and says so in `ls`.
Files that are not GGUF, hidden files and folders, and split GGUFs
(`-00001-of-00003.gguf`) are left out; a folder name that another entry of
the folder on disk already takes, and a folder that cannot be listed, are
left out with the reason.  Each mounted
folder mirrors the owner, mode and time of the folder on disk it shows.

The scan never follows a symlink implicitly: a folder's entries are told
apart without following them (`walk`), a symlink's target is resolved only
by `blobfile.status`, which refuses one into compatfs's own mount, and a
symlink to a folder is not walked into.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

from .base import Folder, Listing, Source, SourceError
from ..files.lookup import is_folder, status
from ..files.probe import guard
from ..names import MMPROJ_FILE, MODEL_FILE

log = logging.getLogger(__name__)

SUFFIX = ".gguf"
PROJECTOR_PREFIX = "mmproj"
MAX_FOLDERS = 10_000  # folders below one folder a scan walks at most (one may run every second)
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


def _is_dir(entry: os.DirEntry) -> bool:
    """Whether `entry` is a folder: a symlink is one when what `blobfile.status`
    resolves it to is (never when it leads into compatfs's own mount)."""
    if not entry.is_symlink():
        return entry.is_dir(follow_symlinks=False)
    try:
        return stat.S_ISDIR(status(entry.path).st_mode)
    except OSError:
        return False


Walked = tuple[str, list[str], list[str]]  # a folder's path, its folders, its other entries


def walk(
    root: Path, onerror: Callable[[OSError], None] | None = None, cap: int = MAX_FOLDERS
) -> tuple[list[Walked], dict[str, str]]:
    """The folders under `root`, top down, as `os.walk(root)` gives them but
    without following a symlink implicitly (`_is_dir`): each folder's path,
    its folders and its other entries (a symlink to a folder is listed among
    the folders); walked into are the folders that are neither hidden nor
    symlinks, in name order.  A folder below which more than `cap` folders
    lie (a tree left out below it counting as one) has none of them walked:
    they are left out, and the second value says so (folder -> why).  That
    costs about `cap` folders more listed, and only that tree: the rest is
    walked all the same.  For `root` itself, what was walked before its
    count ran over is kept, and the rest left out."""
    out: list[Walked] = []
    skipped: dict[str, str] = {}
    kept = 0  # folders walked and kept (a tree left out counting as one)
    stack: list[tuple[str, int, int, list[str]]] = []  # (folder, its index in out, `kept` before it, folders left)

    def visit(top: str) -> None:
        nonlocal kept
        try:
            guard(top)  # a mount made there may hang: looked up first, in bounded time
            with os.scandir(top) as it:
                entries = list(it)
        except OSError as e:
            if e.filename is None:
                e.filename = top
            if onerror is not None:
                onerror(e)
            return
        dirs, files, inside = [], [], []
        for entry in entries:
            if _is_dir(entry):
                dirs.append(entry.name)
                if not entry.is_symlink() and not entry.name.startswith("."):
                    inside.append(entry.name)
            else:
                files.append(entry.name)
        out.append((top, dirs, files))
        stack.append((top, len(out) - 1, kept, [os.path.join(top, d) for d in sorted(inside, reverse=True)]))
        kept += 1

    visit(os.fspath(root))
    while stack:
        top, at, before, todo = stack[-1]
        if kept - before - 1 > cap:
            stack.pop()
            if stack:
                del out[at + 1 :]
                kept = before + 1
                skipped[top] = f"more than {cap} folders below it: none of them is scanned"
            else:
                skipped[top] = f"more than {cap} folders below it: the rest is not scanned"
            continue
        if todo:
            visit(todo.pop())
        else:
            stack.pop()
    return out, skipped


def has_gguf(root: Path) -> bool:
    """Whether any folder under `root` (hidden ones aside) holds a `.gguf` file."""
    return any(any(_is_gguf(f) for f in files) for _top, _dirs, files in walk(root)[0])


def _is_gguf(name: str) -> bool:
    return name.lower().endswith(SUFFIX) and not name.startswith(".")


@dataclass
class FolderListing(Listing):
    """A `Listing` with the folder on disk each model folder named after a
    file shows (the others show the folder of their own name)."""

    disk: dict[str, Path] = field(default_factory=dict)


class GGUFFolder(Source):
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser()
        try:
            found = is_folder(self.root)
        except OSError as e:  # a lookup that hung
            raise SourceError(str(e)) from None
        if not found:
            raise SourceError(f"{self.root}: no such directory")
        self._capped: set[str] = set()  # the folders the last scan left the folders below out of (logged once)

    def scan(self) -> FolderListing:
        out = FolderListing()

        def unreadable(e: OSError) -> None:
            out.skipped[str(e.filename)] = f"cannot be listed ({e.strerror})"

        folders, capped = walk(self.root, onerror=unreadable)
        for path, why in capped.items():
            out.skipped[path] = why
            if path not in self._capped:
                log.warning("%s: %s", path, why)
        self._capped = set(capped)
        for dirpath, dirs, files in folders:
            entries = set(dirs) | set(files)
            out.read.add(Path(dirpath))
            rel = Path(dirpath).relative_to(self.root).as_posix()
            rel = "" if rel == "." else rel
            self._add(out, rel, Path(dirpath), sorted(f for f in files if _is_gguf(f)), entries)
        return out

    def _add(self, out: FolderListing, rel: str, disk: Path, ggufs: list[str], entries: set[str]) -> None:
        """The model folders of one folder on disk."""

        def where(name: str) -> str:
            return f"{rel}/{name}" if rel else name

        for name in [g for g in ggufs if _SPLIT.search(g)]:
            out.skipped[where(name)] = "a split GGUF (one of several files): not shown"
        ggufs = [g for g in ggufs if not _SPLIT.search(g)]
        projectors = [g for g in ggufs if g.lower().startswith(PROJECTOR_PREFIX)]
        models = [g for g in ggufs if g not in projectors]
        if not models:
            if projectors:
                out.skipped[where(projectors[0])] = "a projector without a model GGUF beside it: not shown"
            return
        projector = disk / projectors[0] if len(projectors) == 1 else None
        for p in projectors if len(projectors) > 1 else ():
            out.skipped[where(p)] = (
                f"one of {len(projectors)} projector files beside the models: "
                "which belongs to which is not known, none is shown"
            )
        for model in models:
            if rel and len(models) == 1:
                name = rel
            else:
                stem = model[: -len(SUFFIX)]
                if stem in entries:
                    out.skipped[where(model)] = f"its folder name {where(stem)} is taken by {disk / stem}"
                    continue
                name = where(stem)
            if name.rsplit("/", 1)[-1] in (MODEL_FILE, MMPROJ_FILE):
                out.skipped[name] = "its name would be a file of the folder above: not shown"
                continue
            if name in out.folders:
                out.skipped[str(disk / model)] = f"its name {name} is already that of {out.folders[name].model}"
                continue
            out.folders[name] = Folder(disk / model, projector)
            if name != rel:
                out.disk[name] = disk

    def owner(self, folder: str, listing: Listing) -> Path:
        disk = listing.disk if isinstance(listing, FolderListing) else {}
        return disk.get(folder, self.root / folder)

    def mtime(self, folder: str, listing: Listing, owner_mtime: int) -> int:
        return owner_mtime

    def name(self, target: str) -> str:
        return target.strip("/")

    def refuses_mountpoint(self, mountpoint: Path) -> str | None:
        """A mountpoint inside the folder would show the mount's own files as models."""
        if mountpoint.resolve().is_relative_to(self.root.resolve()):
            return f"the mountpoint {mountpoint} is inside {self.root}: the mount would show itself"
        return None
