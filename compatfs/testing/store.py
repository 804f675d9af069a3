"""Writing an Ollama-layout store: blobs by digest and a manifest per model.

Used for the demo store and by the tests; compatfs itself never writes to a
store it mounts.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from ..sources.ollama import DEFAULT_HOST, DEFAULT_NAMESPACE, MODEL, PROJECTOR


def add_blob(root: Path, path: Path) -> dict:
    """Copy `path` into `root/blobs` under its digest; its manifest layer entry."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    dst = root / "blobs" / f"sha256-{digest}"
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists():
        shutil.copyfile(path, dst)
    return {"digest": f"sha256:{digest}", "size": dst.stat().st_size}


def add_model(root: str | Path, name: str, model: Path, projector: Path | None = None,
              host: str = DEFAULT_HOST, namespace: str = DEFAULT_NAMESPACE, tag: str = "latest") -> Path:
    """Add model `name` (GGUF `model`, optional `projector`); the manifest's path."""
    root = Path(root)
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    layers = [{"mediaType": MODEL, **add_blob(root, Path(model))}]
    if projector is not None:
        layers.append({"mediaType": PROJECTOR, **add_blob(root, Path(projector))})
    manifest = root / "manifests" / host / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "layers": layers,
    }))
    return manifest
