"""Writing an Ollama-layout store: blobs by digest and a manifest per model.

Used for the demo store and by the tests; compatfs itself never writes to a
store it mounts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..sources.ollama import ADAPTER, DEFAULT_HOST, DEFAULT_NAMESPACE, MODEL, PARAMS, PROJECTOR


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


def add_model(
    root: str | Path,
    name: str,
    model: Path,
    projector: Path | None = None,
    host: str = DEFAULT_HOST,
    namespace: str = DEFAULT_NAMESPACE,
    tag: str = "latest",
) -> Path:
    """Add model `name` (GGUF `model`, optional `projector`); the manifest's path."""
    root = Path(root)
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    layers = [{"mediaType": MODEL, **add_blob(root, Path(model))}]
    if projector is not None:
        layers.append({"mediaType": PROJECTOR, **add_blob(root, Path(projector))})
    manifest = root / "manifests" / host / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(
        json.dumps(
            {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json", "layers": layers}
        )
    )
    return manifest


def _data_blob(root: Path, data: bytes) -> dict:
    """Write `data` into `root/blobs` under its digest; its manifest layer entry."""
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def set_layer(
    root: str | Path, manifest: Path, media_type: str, data: bytes | Path | None, *, append: bool = False
) -> None:
    """Give the model of `manifest` a layer of `media_type` holding `data`
    (bytes, or a file copied in; None: no such layer): it replaces the
    layers of that type, or with `append` follows them.  The manifest is
    replaced whole, as Ollama replaces one (a new file)."""
    root = Path(root)
    doc = json.loads(manifest.read_text())
    if not append:
        doc["layers"] = [x for x in doc["layers"] if x["mediaType"] != media_type]
    if data is not None:
        entry = add_blob(root, data) if isinstance(data, Path) else _data_blob(root, data)
        doc["layers"].append({"mediaType": media_type, **entry})
    tmp = manifest.with_name(f".{manifest.name}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, manifest)


def add_params(root: str | Path, manifest: Path, params: dict | None) -> None:
    """Give the model of `manifest` a params layer holding `params` (None: none)."""
    set_layer(root, manifest, PARAMS, None if params is None else json.dumps(params).encode())


def add_adapter(root: str | Path, manifest: Path, adapter: Path) -> None:
    """Give the model of `manifest` one more adapter layer, the GGUF `adapter`."""
    set_layer(root, manifest, ADAPTER, adapter, append=True)
