"""Which kind of `Source` a folder is: an Ollama store when it has
`manifests/` or `blobs/` (or is no folder: the store's error says what it
lacks), else a folder of GGUF files when any folder under it (hidden ones
aside, `folder.has_gguf`) holds one."""

from __future__ import annotations

import os
from pathlib import Path

from .folder import GGUFFolder, has_gguf
from .base import Source, SourceError
from ..files.lookup import is_folder
from .ollama import OllamaStore, default_source, is_store


def open_source(path: str | os.PathLike | None) -> Source:
    """The source at `path` (default: the Ollama store `ollama.default_source`
    names); SourceError in one line when it is neither kind (or looking it
    up hung)."""
    root = Path(path).expanduser() if path else default_source()
    try:
        ollama = is_store(root) or not is_folder(root) or is_folder(root / "manifests") or is_folder(root / "blobs")
    except OSError as e:  # a lookup that hung
        raise SourceError(str(e)) from None
    if ollama:
        return OllamaStore(root)  # its error names what an Ollama store lacks
    if has_gguf(root):
        return GGUFFolder(root)
    raise SourceError(f"{root}: not an Ollama model store (no manifests/ or blobs/), nor a folder holding .gguf files")
