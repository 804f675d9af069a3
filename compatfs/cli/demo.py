"""The demo store: tiny models written the way Ollama's converters wrote
published blobs, so a mount shows every translation without a real store."""
from __future__ import annotations

import tempfile
from pathlib import Path

from ..testing import write_models
from ..testing.llama import plain_llama_text
from ..testing.store import add_model

# One model under another host and namespace, to show the nested layout.
NESTED = ("hf.co", "demo", "tiny-llama", "Q8_0", plain_llama_text)


def write_demo_store(root: Path) -> Path:
    """Write (or refresh) the demo store at `root`; returns `root`."""
    root = Path(root)
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        write_models(root, tmp)
        host, namespace, name, tag, model = NESTED
        add_model(root, name, model(tmp / "nested.gguf"), host=host, namespace=namespace, tag=tag)
    return root
