"""The demo store: tiny models written the way Ollama's converters wrote
published blobs, so a mount shows every translation without a real store.
One model is nested under another host and namespace, with a params layer
(its sampling defaults show in its model.gguf, its options in models.ini)."""
from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from ..testing import write_models
from ..testing.llama import plain_llama_text
from ..testing.store import add_model

# One model under another host and namespace, to show the nested layout.
NESTED = ("hf.co", "demo", "tiny-llama", "Q8_0", plain_llama_text)
# Its params layer, as a publisher's Modelfile PARAMETERs are stored (the
# layer's media type written as data, as the tests write it: only the source
# reads a store's layout).
NESTED_PARAMS = {"temperature": 0.6, "top_k": 30, "num_ctx": 2048, "stop": ["</s>"]}
PARAMS_MEDIA_TYPE = "application/vnd.ollama.image.params"


def write_demo_store(root: Path) -> Path:
    """Write (or refresh) the demo store at `root`; returns `root`."""
    root = Path(root)
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        write_models(root, tmp)
        host, namespace, name, tag, model = NESTED
        manifest = add_model(root, name, model(tmp / "nested.gguf"), host=host, namespace=namespace, tag=tag)
        _add_params(root, manifest, NESTED_PARAMS)
    return root


def _add_params(root: Path, manifest: Path, params: dict) -> None:
    """Give the model of `manifest` a params layer holding `params`."""
    data = json.dumps(params).encode()
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    doc = json.loads(manifest.read_text())
    doc["layers"].append({"mediaType": PARAMS_MEDIA_TYPE, "digest": f"sha256:{digest}", "size": len(data)})
    manifest.write_text(json.dumps(doc))
