"""A model folder's model.gguf: its blob's text view with the sampling
defaults of the model's params layer as llama.cpp's `general.sampling.*`
KVs (llama.cpp reads them when it loads a model, and a request that names a
value still overrides it).  Two tags of one blob with different params show
different model.gguf files; `blobs/` shows each blob's own translation.

The layer is read by identity (device, inode, size, times): a layer that
changes is read again; one that cannot be used adds no KVs, and the reason is
kept for `compatfs ls`.
"""
from __future__ import annotations

import threading
from pathlib import Path

from cachetools import LRUCache

from .blobfile import identity, status
from .gguf_source import SourceGGUF
from .params import Sampling, layer_sampling
from .translation import ALWAYS, Translation, ViewSpec, plan

# The blob as it is, laid out afresh: what gains the KVs where no handler
# claims the blob.
UNCHANGED = Translation("unchanged", ALWAYS)

_lock = threading.Lock()
_layers: LRUCache = LRUCache(maxsize=4096)


def of_layer(path: Path) -> Sampling:
    """The sampling KVs of the params layer at `path` (read again once it changes)."""
    try:
        stamp = identity(status(path))    # resolved as every store path is (never into the mount)
    except OSError as e:
        return Sampling((), (f"params layer {path.name} cannot be read ({e.strerror}): "
                             "no sampling defaults in model.gguf",))
    key = (str(path), stamp)
    with _lock:
        hit = _layers.get(key)
    if hit is None:
        hit = layer_sampling(path)
        with _lock:
            _layers[key] = hit
    return hit


def with_sampling(spec: ViewSpec | None, source: SourceGGUF, kvs: tuple) -> ViewSpec:
    """`spec` (None: the blob unchanged) with `kvs` set: a key the blob already
    has keeps its place and takes the new value, the others follow the
    existing KVs."""
    if spec is None:
        spec = plan(UNCHANGED, source)
    new = dict(kvs)
    merged = [(k, new.pop(k, v)) for k, v in spec.kvs]
    merged += list(new.items())
    return ViewSpec(merged, spec.tensors, spec.alignment, spec.handler, spec.idle_renames)
