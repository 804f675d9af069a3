"""The views of each blob, built on first access and kept in a bounded LRU.

For a blob, `model.gguf` is the text view: the first text translation that
claims it, else the blob unchanged.  `mmproj.gguf` exists for a projector
blob (architecture `clip`: the first clip translation that claims it, else
unchanged) and for a monolithic blob that a clip translation claims.  With
translation off every view is the blob unchanged.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from cachetools import LRUCache

from . import handlers
from .gguf_source import SourceGGUF
from .gguf_values import GGUFError
from .opcache import OpCache
from .translation import Translation, first_claim, plan
from .view import View

log = logging.getLogger("compatfs")

MODEL_FILE = "model.gguf"
MMPROJ_FILE = "mmproj.gguf"


def translation_enabled(no_translate: bool = False) -> bool:
    """Off with --no-translate or OLLAMA_LLAMA_CPP_COMPAT=0 (as in Ollama)."""
    return not no_translate and os.environ.get("OLLAMA_LLAMA_CPP_COMPAT") != "0"


@dataclass(frozen=True)
class BlobInfo:
    """A parsed blob and the translations that claim it."""

    source: SourceGGUF
    text: Translation | None
    clip: Translation | None

    @property
    def has_mmproj(self) -> bool:
        return self.source.architecture == "clip" or self.clip is not None


def classify(source: SourceGGUF, translate: bool = True) -> BlobInfo:
    """Which translations claim `source` (none when translation is off)."""
    if not translate:
        return BlobInfo(source, None, None)
    clip = first_claim(handlers.CLIP, source)
    if clip is not None and source.architecture != "clip" and not source.has_tensor_prefix("v."):
        clip = None
    return BlobInfo(source, first_claim(handlers.TEXT, source), clip)


def build_view(info: BlobInfo, kind: str, cache: OpCache) -> View:
    """The `kind` (MODEL_FILE or MMPROJ_FILE) view of a classified blob."""
    tr = info.text if kind == MODEL_FILE else info.clip
    if kind == MMPROJ_FILE and not info.has_mmproj:
        raise FileNotFoundError(f"{info.source.path} has no projector view")
    if tr is None:
        return View.identity(info.source.identity)
    spec = plan(tr, info.source)
    return View.translated(info.source, spec, cache, key=(info.source.identity, kind))


def _stamp(path: Path) -> tuple:
    st = path.stat()
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class BlobViews:
    """Thread-safe, bounded caches of parsed blobs and their views."""

    def __init__(self, translate: bool = True, op_cache: OpCache | None = None, max_views: int = 32):
        self.translate = translate
        self.op_cache = op_cache or OpCache()
        self._infos: LRUCache = LRUCache(maxsize=max_views)
        self._views: LRUCache = LRUCache(maxsize=max_views)
        self._lock = threading.Lock()

    def info(self, path: Path) -> BlobInfo:
        """The classified blob at `path`; GGUFError (naming it) when unreadable."""
        try:
            key = _stamp(path)
        except OSError as e:
            raise GGUFError(f"{path}: {e.strerror}") from None
        with self._lock:
            hit = self._infos.get(key)
        if hit is None:
            hit = classify(SourceGGUF(path), self.translate)
            with self._lock:
                self._infos[key] = hit
        return hit

    def has_mmproj(self, path: Path) -> bool:
        """Whether the blob has a projector view; False for a blob that cannot be read."""
        try:
            return self.info(path).has_mmproj
        except Exception as e:   # reported when its model.gguf is opened
            log.debug("%s: %s", path, e)
            return False

    def retain(self, paths: set[Path]) -> None:
        """Forget every parsed blob and view whose blob is not one of `paths`
        (blobs that left the store); views held by open files live on with them."""
        keep = {str(p) for p in paths}
        with self._lock:
            for key in [k for k in self._infos if k[0] not in keep]:
                del self._infos[key]
            for key in [k for k, v in self._views.items() if str(v.source.path if v.source else "") not in keep]:
                del self._views[key]

    def view(self, path: Path, kind: str) -> View:
        """The view; GGUFError (naming the blob) when it cannot be built."""
        if not self.translate and kind == MODEL_FILE:
            try:
                st = path.stat()
                return View.identity((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError as e:
                raise GGUFError(f"{path}: {e.strerror}") from None
        info = self.info(path)
        key = (info.source.identity, kind)
        with self._lock:
            hit = self._views.get(key)
        if hit is None:
            try:
                hit = build_view(info, kind, self.op_cache)
            except (GGUFError, ValueError) as e:
                raise GGUFError(f"{path}: {e}") from None
            with self._lock:
                self._views[key] = hit
        return hit
