"""Which kind of `Source` a folder is: an Ollama store (`manifests/` and `blobs/`)."""
from __future__ import annotations

import os
from pathlib import Path

from .source import Source
from .store import OllamaStore, default_source


def open_source(path: str | os.PathLike | None) -> Source:
    """The source at `path` (default: the Ollama store `store.default_source`
    names); SourceError in one line when it is not one."""
    return OllamaStore(Path(path).expanduser() if path else default_source())
