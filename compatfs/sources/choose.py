"""Which kind of `Source` a folder is: an Ollama store when it has
`manifests/` and `blobs/`, else a folder of GGUF files when any folder under
it holds one."""
from __future__ import annotations

import os
from pathlib import Path

from .folder import GGUFFolder, has_gguf
from .base import Source, SourceError
from .ollama import OllamaStore, default_source, is_store


def open_source(path: str | os.PathLike | None) -> Source:
    """The source at `path` (default: the Ollama store `store.default_source`
    names); SourceError in one line when it is neither kind."""
    root = Path(path).expanduser() if path else default_source()
    if is_store(root) or not root.is_dir() or (root / "manifests").is_dir() or (root / "blobs").is_dir():
        return OllamaStore(root)   # its error names what an Ollama store lacks
    if has_gguf(root):
        return GGUFFolder(root)
    raise SourceError(f"{root}: not an Ollama model store (no manifests/ or blobs/), nor a folder holding .gguf files")
