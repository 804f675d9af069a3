"""llama-server's router preset (`--models-preset FILE.ini`, llama.cpp
b11434 `common/preset.cpp`) for the models a compatfs mount shows: one
section per model folder, requested by its name (an Ollama store's: its
Ollama name; a folder of GGUF files': its folder's path under the mount).

- A section name's text after its last `:` is canonicalised by llama.cpp
  (upper-cased, only its last `-`/`.` part kept), so a section is named as
  the model with `:` written `@` (`gemma3@4b`; Ollama names never hold `@`)
  and the Ollama name is its `alias`, which the router resolves exactly.
- Every section denotes exactly one model (`refusal`): llama.cpp's preset
  reader takes `[*]` as the options of every model and an empty name as
  `[default]`; a second section of one name replaces the first, and the
  router refuses to start on a name or alias another model has.  A model
  whose section or alias would be any of these is left out, a comment line
  saying why; names are otherwise as llama.cpp takes them (`[default]` with
  options is the model `default`).
- `model`/`mmproj` are absolute paths under the mount (llama.cpp passes a
  preset's paths to the model's server as they are); an embedding model (its
  header names a pooling type) gets `embeddings`, which llama-server needs
  to answer /v1/embeddings; its adapters that llama.cpp loads with it
  (`router.adapters`) are its `lora`.
- The params layer's options that are not sampling defaults (those are in
  model.gguf as `general.sampling.*`) become the section's options, named as
  llama-server's flags without dashes, bounded by the machine and the model
  (`router.params`), and only where every caller who may read the preset may
  read the layer (`format.params.read_params`).  An INI value ends at `;`, `#` or a
  line end and holds one value per option: what cannot be written so is
  left out, and a comment line in the section says why.

A mount shows its own preset at its root (`models.ini`: `RootPreset`, the
FUSE layer hands it to its tree, which asks it for the file at each scan;
`Published`, the file), made from the tree's snapshot; `compatfs serve` makes one by walking a mount (`scan_mount`)
only when the mount shows none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..files.lookup import identity, status
from ..format.params import OPTIONS, read_params
from .adapters import adapter_names, lora_value, refusal as adapter_refusal, shared as adapter_shared
from .params import model_limits, translate_params
from ..files.statedir import mount_file
from ..errors import GGUFError
from ..names import LAYER_FILE, MMPROJ_FILE, MODEL_FILE, PRESET_FILE
from ..sources.base import adapter_files
from ..tree import FileRef, Snapshot, Tree
from ..view.summaries import Trained

log = logging.getLogger(__name__)

# How the mount shows an Ollama store, as `serve` finds it by walking the mount:
# `blobs/` holds each blob's own views (not models); a model folder's params layer.
_BLOBS, _PARAMS_FILE = "blobs", "params.json"
# Flags whose option model.gguf carries as a general.sampling.* key.
_IN_MODEL = {o.flag for o in OPTIONS.values() if o.sampling}
# What an INI value or section name cannot hold (llama.cpp's INI grammar).
_NOT_IN_VALUE = re.compile(r"[;#\r\n]|^\s|\s$")
_NOT_IN_SECTION = re.compile(r"[\]\[;#\r\n@,]|^\s|\s$")


@dataclass(frozen=True)
class Entry:
    """One model folder of a mount."""

    name: str  # as `ollama list` names it (the folder's path under the mount)
    folder: Path  # where llama-server sees it
    mmproj: bool
    params: Path | None  # its params.json
    embedding: bool = False  # an embedding model (llama-server serves it with --embeddings)
    model: Path | None = None  # its model GGUF (whose header tells its limits where `trained` does not)
    readers: Path | None = None  # the folder whose readers read the preset (its params must be theirs to read)
    adapters: tuple[tuple[str, Path], ...] = ()  # (file name in `folder`, the GGUF it shows) of its adapters
    arch: str | None = None  # model.gguf's architecture (None: read from `model` where it has adapters)
    translated: bool = False  # whether model.gguf is a handler's view of `model` (tensors renamed, say)
    trained: Trained | None = None  # the model's trained context and blocks, as its summary says (no header parsed)


# Of the mount's files `scan_mount` last found: path -> (identity, is an embedding model).
_embedding_memo: dict[str, tuple[tuple, bool]] = {}


def is_embedding(model: Path, known: dict[str, tuple[tuple, bool]], memo: dict[str, tuple[tuple, bool]]) -> bool:
    """Whether the GGUF file `model` is an embedding model: its header names a
    pooling type for its architecture (taken from `known` while the file
    keeps its identity; put in `memo`)."""
    from ..format.header import SourceGGUF

    try:
        st = status(model)  # as blobfile resolves it: never into a mount this process serves
    except OSError:
        return False
    hit = known.get(str(model))
    if hit is None or hit[0] != identity(st):
        try:
            src = SourceGGUF(model)
            hit = identity(st), f"{src.architecture}.pooling_type" in src.kvs
        except (GGUFError, OSError):
            hit = identity(st), False
        memo[str(model)] = hit
    return hit[1]


@dataclass
class Section:
    name: str
    options: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def scan_mount(mnt: Path) -> list[Entry]:
    """The model folders of a mount (`blobs/` left out), by name; each
    model.gguf's header is read once while it keeps its identity (what is
    remembered is what this scan found)."""
    global _embedding_memo
    memo: dict[str, tuple[tuple, bool]] = {}
    out = []
    for dirpath, dirs, files in os.walk(mnt):
        rel = Path(dirpath).relative_to(mnt)
        if rel == Path("."):
            dirs[:] = [d for d in dirs if d != _BLOBS]
        if MODEL_FILE in files:
            out.append(
                Entry(
                    rel.as_posix(),
                    Path(dirpath),
                    MMPROJ_FILE in files,
                    Path(dirpath, _PARAMS_FILE) if _PARAMS_FILE in files else None,
                    is_embedding(Path(dirpath, MODEL_FILE), _embedding_memo, memo),
                    Path(dirpath, MODEL_FILE),
                    adapters=tuple((n, Path(dirpath, n)) for n in adapter_names(files)),
                )
            )
        dirs.sort()
    _embedding_memo = memo
    return sorted(out, key=lambda e: e.name)


class Published:
    """The preset a mount shows at its root, kept as one file of the daemon's
    state folder (never the store): replaced whole when its text changes
    (written beside it, then renamed over it), so a file open on it keeps the
    bytes it opened; owned as, and readable (only) as, the folder `like` it
    mirrors (the mount root's).  `update` tells whether it is there now."""

    def __init__(self, path: Path):
        self.path = path
        self._written: tuple | None = None  # (text, owner, mode, the file's identity) as last written
        self._failed: str | None = None  # why the last write failed (logged once)

    def update(self, text: str, like: os.stat_result | None) -> bool:
        uid, gid = (like.st_uid, like.st_gid) if like is not None else (os.getuid(), os.getgid())
        mode = like.st_mode & 0o444 if like is not None else 0o400
        try:
            if (
                self._written is not None
                and self._written[:3] == (text, (uid, gid), mode)
                and self._written[3] == _identity(self.path)
            ):
                return True
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, text.encode())
                with contextlib.suppress(PermissionError):  # not root: the daemon's own file, with the mode it mirrors
                    os.fchown(fd, uid, gid)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            self._written, self._failed = (text, (uid, gid), mode, _identity(self.path)), None
            return True
        except OSError as e:
            if self._failed != str(e):
                log.error("cannot write the mount's %s at %s: %s: not shown", PRESET_FILE, self.path, e)
            self._written, self._failed = None, str(e)
            return False

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self._written = self._failed = None

    def withdraw(self) -> None:
        """Remove the file when it is still the one last written here (a
        later mount at the same mountpoint, made while this one was detached
        lazily, has written its own)."""
        if self._written is not None and self._written[3] == _identity(self.path):
            self.remove()


def _identity(path: Path) -> tuple | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return identity(st) if stat.S_ISREG(st.st_mode) else None


def published_path(mountpoint: Path) -> Path:
    """Where the daemon serving `mountpoint` keeps its `models.ini` (its state
    folder; OSError when there is none)."""
    return mount_file("mount", mountpoint, ".models.ini")


def section_name(name: str) -> str:
    return name.replace(":", "@")


# Section names llama.cpp's preset reader (b11434 `common/preset.cpp`) gives a
# meaning of its own, and which.
_SPECIAL_SECTIONS = {
    "*": "llama-server reads a section named '*' as the options of every model",
    "": "llama-server reads a section with no name as its default section",
}


def refusal(name: str) -> str | None:
    """Why the model `name` can have no section of its own in a preset (its
    name cannot be written in one, or llama-server would read its section
    as something else than one model); None when it can."""
    special = _SPECIAL_SECTIONS.get(section_name(name).strip())
    if special is not None:
        return f"left out of {PRESET_FILE} ({special})"
    if _NOT_IN_SECTION.search(name):
        return (
            f"left out of {PRESET_FILE} (its name cannot be a section name: no '[', ']', ';', '#', '@', ',', "
            "line ends or surrounding spaces)"
        )
    return None


def section(entry: Entry) -> Section:
    """The preset section of one model."""
    s = Section(section_name(entry.name))
    s.options.append(("alias", entry.name))
    s.options.append(("model", str(entry.folder / MODEL_FILE)))
    if entry.mmproj:
        s.options.append(("mmproj", str(entry.folder / MMPROJ_FILE)))
    if entry.embedding:
        s.options.append(("embeddings", "true"))
    if entry.adapters:
        loras = adapters_passed(entry, s.notes)
        if loras:
            s.options.append(("lora", lora_value([entry.folder / n for n in loras])))
    if entry.params is None:
        return s
    try:
        params = read_params(entry.params, entry.readers)
        args = translate_params(params, model_limits(entry.trained or entry.model, params))
    except ValueError as e:
        s.notes.append(str(e))
        return s
    s.notes += args.notes
    seen: dict[str, int] = {}
    for flag, value in zip(args.argv[::2], args.argv[1::2], strict=True):
        if flag in _IN_MODEL:
            continue
        key = flag.lstrip("-")
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            s.notes.append(f"{key} {value!r}: not passed (a preset holds one value per option; the first is)")
        elif _NOT_IN_VALUE.search(value):
            s.notes.append(
                f"{key} {value!r}: not passed (an INI value cannot hold ';', '#', a line end or surrounding spaces)"
            )
        else:
            s.options.append((key, value))
    return s


def adapters_passed(entry: Entry, notes: list[str]) -> list[str]:
    """The adapter files of `entry` llama.cpp loads with its model (a line in
    `notes` for each left out)."""
    arch = entry.arch
    if arch is None and entry.model is not None:
        from ..format.header import SourceGGUF

        try:
            arch = SourceGGUF(entry.model).architecture
        except (GGUFError, OSError):
            arch = None
    out = []
    for name, path in entry.adapters:
        if entry.readers is not None and not adapter_shared(path, entry.readers):
            notes.append(f"adapters: {name} not passed (not readable by everyone who may read {PRESET_FILE})")
            continue
        why = (
            "the model has no model.gguf"
            if entry.model is None
            else adapter_refusal(path, entry.model, arch, entry.translated)
        )
        if why is None:
            out.append(name)
        elif entry.readers is not None:  # (what it holds is not told to all who read the preset)
            notes.append(
                f"adapters: {name} not passed (llama.cpp's LoRA loader would refuse it: `compatfs ls` says why)"
            )
        else:
            notes.append(f"adapters: {name} not passed ({why})")
    return out


# How a preset's models are named where the kind of source is not known (a
# mount walked by `serve`); a source says how its own are (`Source.model_names`).
NAMED_AS = "its folder's path under the mount (for an Ollama store, its Ollama name)"


def render(entries: list[Entry], sections: list[Section] | None = None, named: str = NAMED_AS) -> str:
    """The preset INI of `entries` (with `sections`: theirs, already made);
    `named` says what a model's name is."""
    lines = [
        "; llama-server --models-preset for a compatfs mount, written by compatfs from the mount's",
        f"; model folders: each model is requested by {named} (the section's alias).",
        "",
    ]
    taken: set[str] = set()  # the section names and aliases written so far
    for i, entry in enumerate(entries):
        s = sections[i] if sections is not None else section(entry)
        bad = [v for k, v in s.options if k != "alias" and _NOT_IN_VALUE.search(v)]
        why = (
            refusal(entry.name)
            or ("left out (its path cannot be written in an INI file)" if bad else None)
            or ("left out (its section name or alias is another model's)" if {s.name, entry.name} & taken else None)
        )
        if why is not None:
            lines += [f"; {_comment(entry.name)}: {why}", ""]
            continue
        taken |= {s.name, entry.name}
        lines.append(f"[{s.name}]")
        lines += [f"; {_comment(n)}" for n in s.notes]
        lines += [f"{k} = {v}" for k, v in s.options]
        lines.append("")
    return "\n".join(lines)


def _comment(text: str) -> str:
    return text.encode("unicode_escape").decode("ascii")


class RootPreset:
    """The `models.ini` a mount's root shows (a tree's `RootFiles`): the
    preset of the tree's model folders, paths under `mountpoint`, kept as
    `Published`.  A model folder whose mark is what it was keeps its section,
    and the text is rendered again only when a section changed."""

    def __init__(self, published: Published, mountpoint: Path):
        self.published = published
        self.mountpoint = mountpoint
        # Each model's section, and what it was made from (its mountpoint and
        # its folder's mark): made again only when that changes.
        self._sections: dict[str, tuple[tuple, Entry, Section]] = {}
        self._text: str | None = None  # the preset rendered from them

    @classmethod
    def at(cls, mountpoint: Path) -> RootPreset | None:
        """The preset of a mount at `mountpoint` (absolute); None when the
        daemon has no state folder, or one inside the mountpoint (logged)."""
        try:
            path = published_path(mountpoint)
            if Path(os.path.realpath(path)).is_relative_to(os.path.realpath(mountpoint)):
                raise OSError(f"the state folder {path.parent} is inside the mountpoint")
        except OSError as e:
            log.error("no %s at the mount's root: %s", PRESET_FILE, e)
            return None
        return cls(Published(path), mountpoint)

    def stale(self) -> None:
        self._sections = {}

    def withdraw(self) -> None:
        self.published.withdraw()

    def files(self, tree: Tree, snap: Snapshot, marks: dict[str, tuple | None]) -> dict[str, FileRef]:
        """`models.ini`, readable as the root is (none for a store without models)."""
        models = snap.models
        if not models:
            self.published.remove()
            self._sections = {}
            return {}
        try:
            owner = tree.source.owner("", snap.listing)
            try:
                like: os.stat_result | None = status(owner)
            except OSError:
                like = None
            # Who may read the file decides which params layers it shows.
            readers = None if like is None else (like.st_uid, like.st_gid, like.st_mode, like.st_ctime_ns)
            made: dict[str, tuple[tuple, Entry, Section]] = {}
            for name in sorted(models):
                key = (self.mountpoint, marks.get(name), readers)
                kept = self._sections.get(name)
                if kept is None or kept[0] != key:
                    entry = self._entry(tree, snap, name, owner)
                    kept = key, entry, section(entry)
                made[name] = kept
            if made != self._sections or self._text is None:
                self._text = render(
                    [e for _, e, _ in made.values()], [s for _, _, s in made.values()], tree.source.model_names
                )
            self._sections = made
            shown = self.published.update(self._text, like)
        except Exception:  # a bad store file must never fail a scan
            log.exception("cannot make the mount's %s", PRESET_FILE)
            return {}
        return {PRESET_FILE: FileRef(self.published.path, LAYER_FILE, readable_as=owner)} if shown else {}

    def _entry(self, tree: Tree, snap: Snapshot, name: str, readers: Path) -> Entry:
        """The entry of model folder `name`: whether it shows an mmproj.gguf
        and is an embedding model are its blobs' summaries' (the index's: no
        header is parsed where the index knows the blob); `readers`: the
        folder on disk whose readers may read the preset."""
        f = snap.listing.folders[name]
        try:
            summary = tree.views.summary(f.model)
            embedding, arch, translated = summary.embedding, summary.arch, summary.text is not None
        except GGUFError:
            embedding, arch, translated = False, None, False
        return Entry(
            name,
            self.mountpoint / name,
            MMPROJ_FILE in (tree.files(snap, name) or {}),
            f.params,
            embedding,
            f.model,
            readers,
            adapter_files(f.adapters),
            arch,
            translated,
            tree.views.trained(f.model),
        )
