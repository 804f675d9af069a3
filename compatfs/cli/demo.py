"""The demo store: tiny models written the way Ollama's converters wrote
published blobs, so a mount shows every translation without a real store.
One model is nested under another host and namespace, with a params layer
(its sampling defaults show in its model.gguf, its options in models.ini)
and a LoRA adapter layer (its adapter.gguf, passed as llama-server's --lora)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..testing import write_models
from ..testing.llama import plain_llama_text
from ..testing.adapter import llama_adapter
from ..testing.store import add_adapter, add_model, add_params

# One model under another host and namespace, to show the nested layout.
NESTED = ("hf.co", "demo", "tiny-llama", "Q8_0", plain_llama_text)
# Its params layer, as a publisher's Modelfile PARAMETERs are stored.
NESTED_PARAMS = {"temperature": 0.6, "top_k": 30, "num_ctx": 2048, "stop": ["</s>"]}


def write_demo_store(root: Path) -> Path:
    """Write (or refresh) the demo store at `root`; returns `root`."""
    root = Path(root)
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        write_models(root, tmp)
        host, namespace, name, tag, model = NESTED
        manifest = add_model(root, name, model(tmp / "nested.gguf"), host=host, namespace=namespace, tag=tag)
        add_params(root, manifest, NESTED_PARAMS)
        add_adapter(root, manifest, llama_adapter(tmp / "adapter.gguf"))
    return root
