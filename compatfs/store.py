"""The Ollama model store: manifests, their layers, and the blobs they name.

Layout: `manifests/<host>/<namespace>/<model>/<tag>` (JSON) and
`blobs/sha256-<hex>`.  Manifests are read through `blobfile` (never
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
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .blobfile import BlobFile, Stamp, status
from .gguf_values import GGUFError

MODEL = "application/vnd.ollama.image.model"
PROJECTOR = "application/vnd.ollama.image.projector"
ADAPTER = "application/vnd.ollama.image.adapter"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
_DIGEST = re.compile(r"^sha256[:-]([0-9a-fA-F]{64})$")
MANIFEST_LIMIT = 4 << 20   # bytes; Ollama's manifests take a few KB (10,000 layers: about 1.6 MB)


class StoreError(ValueError):
    """SOURCE is not an Ollama model store."""


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
    digest: str           # "sha256-<hex>"
    size: int


@dataclass(frozen=True)
class Model:
    """One tagged model of the store."""

    name: str                         # as `ollama list` shows it
    manifest: Path
    layers: tuple[Layer, ...]
    mtime_ns: int = 0                 # of the manifest: when it was pulled or last changed

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
    """The store at one moment: models with a GGUF model layer, and what was left out."""

    models: dict[str, Model] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)   # name or manifest path -> reason


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
        layers.append(Layer(str(raw.get("mediaType", "")), f"sha256-{m.group(1).lower()}",
                            size if isinstance(size, int) else 0))
    return tuple(layers)


def _files_below(base: Path) -> list[Path]:
    """Every entry below `base` that is not a folder, its folders walked
    without following a symlink and nothing stat'ed through one (a link may
    lead into the mount itself; a linked manifest is opened, and refused
    there, by `blobfile`); a folder that cannot be listed is passed over."""
    try:
        status(base)          # a `manifests/` that leads into the mount is refused here
    except OSError:
        return []
    out, todo = [], [base]
    while todo:
        folder = todo.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    (todo if entry.is_dir(follow_symlinks=False) else out).append(Path(entry.path))
        except OSError:
            continue
    return out


class Store:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser()
        missing = [d for d in ("manifests", "blobs") if not (self.root / d).is_dir()]
        if not self.root.is_dir():
            raise StoreError(f"{self.root}: no such directory (expected an Ollama model store)")
        if missing:
            raise StoreError(f"{self.root}: not an Ollama model store (no {' or '.join(d + '/' for d in missing)})")
        self._cache: dict[Path, tuple[Stamp, tuple[Layer, ...] | str]] = {}
        self._lock = threading.Lock()

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / digest

    def scan(self) -> Scan:
        """Walk `manifests/` now; unchanged manifest files are not re-read.
        Of manifests that take one name (a host or namespace spelled in
        another case: `Registry.Ollama.AI`), the one spelled in lower case
        wins (else the first in path order); the others are left out naming it."""
        out = Scan()
        base = self.root / "manifests"
        seen: set[Path] = set()
        found, owners = [], {}
        found.extend(_files_below(base))

        def order(path: Path) -> tuple:   # host and namespace spelled as Ollama writes them first
            head = path.relative_to(base).parts[:2]
            return head != tuple(p.lower() for p in head), path

        for path in sorted(found, key=order):
            parts = path.relative_to(base).parts
            if len(parts) != 4:
                out.skipped[str(path)] = "not at manifests/<host>/<namespace>/<model>/<tag>"
                continue
            seen.add(path)
            name = display_name(*parts)
            if name in owners:
                out.skipped[str(path)] = f"its name {name} is already that of {owners[name]}"
                continue
            owners[name] = path
            result, mtime_ns = self._layers(path)
            if isinstance(result, str):
                out.skipped[name] = result
            elif not any(layer.media_type == MODEL for layer in result):
                out.skipped[name] = "no GGUF model layer (" + (
                    ", ".join(sorted({layer.media_type for layer in result})) or "no layers") + ")"
            else:
                out.models[name] = Model(name, path, result, mtime_ns)
        with self._lock:
            for gone in set(self._cache) - seen:
                del self._cache[gone]
        return out

    def _layers(self, path: Path) -> tuple[tuple[Layer, ...] | str, int]:
        """The manifest's layers (or why it cannot be used) and its mtime."""
        try:
            with BlobFile(path) as f:
                with self._lock:
                    hit = self._cache.get(path)
                if hit and hit[0] == f.stamp:
                    return hit[1], f.stamp[3]
                if f.stamp[2] > MANIFEST_LIMIT:
                    result: tuple[Layer, ...] | str = (f"manifest has {f.stamp[2]} bytes, more than the "
                                                       f"{MANIFEST_LIMIT} one may have")
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

    def blob_digests(self, scan: Scan) -> dict[str, Path]:
        """Every GGUF blob (model, projector, adapter) the scanned manifests name."""
        out = {}
        for model in scan.models.values():
            for layer in model.layers:
                if layer.media_type in (MODEL, PROJECTOR, ADAPTER):
                    out[layer.digest] = self.blob_path(layer.digest)
        return out
