"""The demo store: tiny models written the way Ollama's converters wrote
published blobs, so a mount shows every translation without a real store."""
from __future__ import annotations

import tempfile
from pathlib import Path

from . import legacy_models as lm
from .storewriter import add_model

# model name -> (tag, writer of the model blob, writer of a projector blob or None)
DEMO = {
    "gemma3": ("1b", lm.legacy_gemma3_text, None),
    "gemma3-vision": ("4b", lm.legacy_gemma3_vision, None),
    "llama3.1": ("8b-instruct", lm.legacy_llama3_instruct, None),
    "llava": ("7b", lm.plain_llama_text, lm.legacy_llava_projector),
}
NESTED = ("hf.co", "demo", "tiny-llama", "Q8_0", lm.plain_llama_text)


def write_demo_store(root: Path) -> Path:
    """Write (or refresh) the demo store at `root`; returns `root`."""
    root = Path(root)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, (tag, model, projector) in DEMO.items():
            proj = projector(tmp / f"{name}-proj.gguf") if projector else None
            add_model(root, name, model(tmp / f"{name}.gguf"), proj, tag=tag)
        host, namespace, name, tag, model = NESTED
        add_model(root, name, model(tmp / "nested.gguf"), host=host, namespace=namespace, tag=tag)
    return root
