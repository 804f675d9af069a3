"""The Ollama model store as a `Source`: manifests, their layers, and the blobs they name.

Layout: `manifests/<host>/<namespace>/<model>/<tag>` (JSON) and
`blobs/sha256-<hex>`.  Mounted as

    /<model>:<tag>/model.gguf            library models at the top
    /<host>/<namespace>/<model>:<tag>/   everything else nested, as `ollama list` names it
    /blobs/sha256-<hex>/model.gguf       every GGUF blob (model, projector, adapter) a manifest names
    .../mmproj.gguf                      the projector layer's, or the model blob's own
    .../params.json, template, system, messages.json, license
                                         the manifest's layers of those types, byte for byte
    .../adapter.gguf, adapter-2.gguf     its adapter layers (LoRA GGUF), byte for byte

Folders mirror the owner and mode of `blobs/` (the blob folders) or
`manifests/` (all others); a model folder's time is its manifest's (a
folder above models: the newest of theirs; the root and `blobs/`: the
newest of the store's, or `manifests/`' or `blobs/`' own if newer), a blob
folder's its blob's.  A model whose name starts with `blobs/` (a host or
namespace named `blobs`) would hide in the mount's `blobs/` folder: it is
left out, with that reason.  Manifests are read through `blobfile` (never
blocking, only regular files, at most `MANIFEST_LIMIT` bytes).  A manifest
that cannot be read, names a malformed digest, or takes a name another
manifest already has, is reported and skipped, never fatal.  Parsed
manifests are cached by identity, so rescanning a store that has not
changed is cheap.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..files.blobfile import BlobFile

from ..files.lookup import Stamp, identity, is_folder, status
from ..files.probe import guard
from ..errors import GGUFError
from .base import Folder, Listing, Source, SourceError, adapter_files

MODEL = "application/vnd.ollama.image.model"
PROJECTOR = "application/vnd.ollama.image.projector"
ADAPTER = "application/vnd.ollama.image.adapter"
PARAMS = "application/vnd.ollama.image.params"
TEMPLATE = "application/vnd.ollama.image.template"
SYSTEM = "application/vnd.ollama.image.system"
MESSAGES = "application/vnd.ollama.image.messages"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
_DIGEST = re.compile(r"^sha256[:-]([0-9a-fA-F]{64})$")
MANIFEST_LIMIT = 4 << 20  # bytes; Ollama's manifests take a few KB (10,000 layers: about 1.6 MB)
BLOBS = "blobs"
_HEX = re.compile(r"^(?:sha256[:-])?([0-9a-fA-F]{64})$")
MAX_PATHS_KEPT = 100_000  # blob paths remembered (more, and they are made afresh)

# Manifest layers shown beside model.gguf, unchanged: media type -> file name.
LAYER_FILES = {
    PARAMS: "params.json",
    TEMPLATE: "template",
    SYSTEM: "system",
    MESSAGES: "messages.json",
    "application/vnd.ollama.image.license": "license",
}


def is_store(root: Path) -> bool:
    """Whether `root` has an Ollama store's two folders (looked up as every
    store path is: `blobfile.is_folder`)."""
    return is_folder(root / "manifests") and is_folder(root / BLOBS)


def default_source() -> Path:
    """`$OLLAMA_MODELS`, else `~/.ollama/models`."""
    env = os.environ.get("OLLAMA_MODELS")
    return Path(env) if env else Path.home() / ".ollama" / "models"


def display_name(host: str, namespace: str, model: str, tag: str) -> str:
    """The name `ollama list` shows: default host and namespace are left out."""
    if host.lower() != DEFAULT_HOST:
        return f"{host}/{namespace}/{model}:{tag}"
    if namespace.lower() != DEFAULT_NAMESPACE:
        return f"{namespace}/{model}:{tag}"
    return f"{model}:{tag}"


@dataclass(frozen=True)
class Layer:
    media_type: str
    digest: str  # "sha256-<hex>"
    size: int


@dataclass(frozen=True)
class Model:
    """One tagged model of the store."""

    name: str  # as `ollama list` shows it
    manifest: Path
    layers: tuple[Layer, ...]
    mtime_ns: int = 0  # of the manifest: when it was pulled or last changed

    def first(self, media_type: str) -> Layer | None:
        return next((layer for layer in self.layers if layer.media_type == media_type), None)

    @property
    def model_layer(self) -> Layer | None:
        return self.first(MODEL)

    @property
    def projector_layer(self) -> Layer | None:
        return self.first(PROJECTOR)


@dataclass
class Scan:
    """The manifests at one moment: models with a GGUF model layer, and what was left out."""

    models: dict[str, Model] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # name or manifest path -> reason
    listed: set[Path] = field(default_factory=set)  # the folders of manifests/ walked
    seen: dict[Path, os.stat_result] = field(default_factory=dict)  # the manifests that are regular files, as found


@dataclass
class StoreListing(Listing):
    """A `Listing` with each model folder's time (and that of every folder
    above models): the newest manifest under it."""

    times: dict[str, int] = field(default_factory=dict)


def parse_manifest(data: bytes) -> tuple[Layer, ...]:
    """The layers of one manifest's bytes; ValueError names what is wrong."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"manifest is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list):
        raise ValueError("manifest has no layers list")
    layers = []
    for raw in doc["layers"]:
        if not isinstance(raw, dict):
            raise ValueError("manifest layer is not an object")
        m = _DIGEST.match(str(raw.get("digest", "")))
        if not m:
            raise ValueError(f"layer digest {raw.get('digest')!r} is not sha256:<64 hex>")
        size = raw.get("size", 0)
        layers.append(
            Layer(str(raw.get("mediaType", "")), f"sha256-{m.group(1).lower()}", size if isinstance(size, int) else 0)
        )
    return tuple(layers)


def _files_below(base: Path, listed: set[Path]) -> list[tuple[Path, os.stat_result | None]]:
    """Every entry below `base` that is not a folder, with its own status
    (never through a symlink; None when it cannot be had), its folders
    walked without following a symlink and nothing stat'ed through one (a
    link may lead into the mount itself; a linked manifest is opened, and
    refused there, by `blobfile`); a folder that cannot be listed is passed
    over.  The folders listed are added to `listed`."""
    try:
        status(base)  # a `manifests/` that leads into the mount is refused here
    except OSError:
        return []
    out: list[tuple[Path, os.stat_result | None]] = []
    todo = [base]
    while todo:
        folder = todo.pop()
        try:
            guard(str(folder))  # a mount made there may hang: looked up first, in bounded time
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(folder / entry.name)
                        continue
                    try:
                        st: os.stat_result | None = entry.stat(follow_symlinks=False)
                    except OSError:
                        st = None
                    out.append((folder / entry.name, st))
        except OSError:
            continue
        listed.add(folder)
    return out


class OllamaStore(Source):
    model_names = "its Ollama name, as `ollama list` shows it"

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser()
        try:
            missing = [d for d in ("manifests", BLOBS) if not is_folder(self.root / d)]
            found = is_folder(self.root)
        except OSError as e:
            raise SourceError(str(e)) from None
        if not found:
            raise SourceError(f"{self.root}: no such directory (expected an Ollama model store)")
        if missing:
            raise SourceError(f"{self.root}: not an Ollama model store (no {' or '.join(d + '/' for d in missing)})")
        self._cache: dict[Path, tuple[Stamp, tuple[Layer, ...] | str]] = {}
        # The folders the last scan made, by model name (with the layers they
        # were made of) and by blob digest: an unchanged manifest's is kept.
        self._made: dict[str, tuple[tuple[Layer, ...], Folder]] = {}
        self._blob_folders: dict[str, Folder] = {}
        self._owners = {True: self.root / BLOBS, False: self.root / "manifests"}  # a folder under blobs/ or not
        self._lock = threading.Lock()
        self._blob_paths: dict[str, Path] = {}  # digest -> its blob's path (made once: a scan asks for each)

    def blob_path(self, digest: str) -> Path:
        path = self._blob_paths.get(digest)
        if path is None:
            if len(self._blob_paths) > 4 * MAX_PATHS_KEPT:
                self._blob_paths.clear()
            path = self._blob_paths[digest] = self.root / BLOBS / digest
        return path

    # -- Source ----------------------------------------------------------------
    def scan(self) -> StoreListing:
        """The model folders (sorted by name), then one folder per GGUF blob."""
        manifests = self.manifests()
        out = StoreListing(skipped=manifests.skipped, read={self.root, *manifests.listed}, seen=manifests.seen)
        made_now: dict[str, tuple[tuple[Layer, ...], Folder]] = {}
        for name in sorted(manifests.models):
            model = manifests.models[name]
            if name.split("/")[0] == BLOBS:
                out.skipped[name] = f"its first folder would be {BLOBS}/, where the mount shows every blob"
                continue
            layer, proj = model.model_layer, model.projector_layer
            params, template, system, messages = (model.first(t) for t in (PARAMS, TEMPLATE, SYSTEM, MESSAGES))
            if layer is None:  # (`manifests` leaves such models out, naming why)
                continue
            made = self._made.get(name)
            if made is None or made[0] is not model.layers:  # (an unchanged manifest keeps its layers)
                # Every adapter layer, as Ollama loads each: shown as adapter.gguf, adapter-2.gguf, ...
                adapters = tuple(self.blob_path(x.digest) for x in model.layers if x.media_type == ADAPTER)
                made = (
                    model.layers,
                    Folder(
                        self.blob_path(layer.digest),
                        self.blob_path(proj.digest) if proj else None,
                        self._layer_files(model.layers) + adapter_files(adapters),
                        params=self.blob_path(params.digest) if params else None,
                        template=self.blob_path(template.digest) if template else None,
                        system=self.blob_path(system.digest) if system else None,
                        adapters=adapters,
                        messages=self.blob_path(messages.digest) if messages else None,
                        told_by=(*(model.manifest.parents[i] for i in (2, 1, 0)), model.manifest),
                    ),
                )
            made_now[name] = made
            out.folders[name] = made[1]
            parts = name.split("/")
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                out.times[d] = max(out.times.get(d, 0), model.mtime_ns)
        kept = {name: manifests.models[name] for name in out.folders}
        for digest, blob in self.blob_digests(kept).items():
            out.folders[f"{BLOBS}/{digest}"] = self._blob_folders.get(digest) or Folder(blob, is_model=False)
        self._made = made_now
        self._blob_folders = {d[len(BLOBS) + 1 :]: f for d, f in out.folders.items() if not f.is_model}
        return out

    def owner(self, folder: str, listing: Listing) -> Path:
        return self._owners[folder.split("/", 1)[0] == BLOBS]

    def mtime(self, folder: str, listing: Listing, owner_mtime: int) -> int:
        times = listing.times if isinstance(listing, StoreListing) else {}
        if folder in ("", BLOBS):
            return max([owner_mtime, *times.values()])
        if folder.startswith(BLOBS + "/"):
            try:
                blob = listing.folders[folder].model
                seen = listing.seen.get(blob)  # (as the scan found it)
                return (seen or status(blob)).st_mtime_ns
            except (KeyError, OSError):
                return owner_mtime
        return times.get(folder, owner_mtime)

    def time_follows_owner(self, folder: str, listing: Listing) -> bool:
        # (a blob's folder shows its blob's time; a model's folder its newest manifest's)
        if folder in ("", BLOBS):
            return True
        times = listing.times if isinstance(listing, StoreListing) else {}
        return not folder.startswith(BLOBS + "/") and folder not in times

    def refuses_mountpoint(self, mountpoint: Path) -> str | None:
        """A mountpoint at the store or inside it (under `manifests/` or
        `blobs/`: where the scan looks) would have the mount look into itself."""
        if Path(os.path.realpath(mountpoint)).is_relative_to(os.path.realpath(self.root)):
            return f"the mountpoint {mountpoint} is inside the store {self.root}: the mount would look into itself"
        return None

    def name(self, target: str) -> str:
        """A blob digest (`sha256:<hex>`, `sha256-<hex>` or the bare hex) is
        its blob folder; a name without a tag means `:latest`, as in `ollama run`."""
        target = target.strip("/")
        m = _HEX.match(target)
        if m:
            return f"{BLOBS}/sha256-{m.group(1).lower()}"
        return target if ":" in target.rsplit("/", 1)[-1] else target + ":latest"

    def _layer_files(self, layers) -> tuple[tuple[str, Path], ...]:
        """(file name, blob) of the `LAYER_FILES` layers; a second license is
        `license-2`, and so on (Ollama keeps every license layer)."""
        out: list[tuple[str, Path]] = []
        seen: dict[str, int] = {}
        for layer in layers:
            base = LAYER_FILES.get(layer.media_type)
            if base is None or (base != "license" and base in seen):
                continue
            seen[base] = seen.get(base, 0) + 1
            out.append((base if seen[base] == 1 else f"{base}-{seen[base]}", self.blob_path(layer.digest)))
        return tuple(out)

    # -- manifests ---------------------------------------------------------------
    def manifests(self) -> Scan:
        """Walk `manifests/` now; unchanged manifest files are not re-read.
        Of manifests that take one name (a host or namespace spelled in
        another case: `Registry.Ollama.AI`), the one spelled in lower case
        wins (else the first in path order); the others are left out naming it."""
        out = Scan()
        base = self.root / "manifests"
        seen: set[Path] = set()
        prefix = len(str(base)) + 1
        # (the path, its status, its parts below manifests/): the parts split once, as strings
        found = [(path, st, str(path)[prefix:].split("/")) for path, st in _files_below(base, out.listed)]
        owners: dict[str, Path] = {}

        def order(found: tuple[Path, os.stat_result | None, list[str]]) -> tuple:
            # host and namespace spelled as Ollama writes them first, then in path order
            head = found[2][:2]
            return head != [p.lower() for p in head], found[2]

        for path, st, parts in sorted(found, key=order):
            if len(parts) != 4:
                out.skipped[str(path)] = "not at manifests/<host>/<namespace>/<model>/<tag>"
                continue
            seen.add(path)
            if st is not None and stat.S_ISREG(st.st_mode):
                out.seen[path] = st
            name = display_name(*parts)
            if name in owners:
                out.skipped[str(path)] = f"its name {name} is already that of {owners[name]}"
                continue
            owners[name] = path
            result, mtime_ns = self._layers(path, st)
            if isinstance(result, str):
                out.skipped[name] = result
            elif not any(layer.media_type == MODEL for layer in result):
                out.skipped[name] = (
                    "no GGUF model layer ("
                    + (", ".join(sorted({layer.media_type for layer in result})) or "no layers")
                    + ")"
                )
            else:
                out.models[name] = Model(name, path, result, mtime_ns)
        with self._lock:
            for gone in set(self._cache) - seen:
                del self._cache[gone]
        return out

    def _layers(self, path: Path, st: os.stat_result | None) -> tuple[tuple[Layer, ...] | str, int]:
        """The manifest's layers (or why it cannot be used) and its mtime;
        not opened again while its own status `st` (a regular file's) gives
        the identity it was read with."""
        with self._lock:
            hit = self._cache.get(path)
        if hit and st is not None and stat.S_ISREG(st.st_mode) and identity(st) == hit[0]:
            return hit[1], hit[0][3]
        try:
            with BlobFile(path) as f:
                with self._lock:
                    hit = self._cache.get(path)
                if hit and hit[0] == f.stamp:
                    return hit[1], f.stamp[3]
                if f.stamp[2] > MANIFEST_LIMIT:
                    result: tuple[Layer, ...] | str = (
                        f"manifest has {f.stamp[2]} bytes, more than the {MANIFEST_LIMIT} one may have"
                    )
                else:
                    try:
                        result = parse_manifest(bytes(f.read(0, f.stamp[2])))
                    except ValueError as e:
                        result = str(e)
                stamp = f.stamp
        except GGUFError as e:
            return f"manifest cannot be read ({e})", 0
        with self._lock:
            self._cache[path] = (stamp, result)
        return result, stamp[3]

    def blob_digests(self, models: dict[str, Model]) -> dict[str, Path]:
        """Every GGUF blob (model, projector, adapter) the models' manifests name."""
        out = {}
        for model in models.values():
            for layer in model.layers:
                if layer.media_type in (MODEL, PROJECTOR, ADAPTER):
                    out[layer.digest] = self.blob_path(layer.digest)
        return out
