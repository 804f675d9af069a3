"""A model folder's model.gguf: its blob's text view with the sampling
defaults of the model's params layer as llama.cpp's `general.sampling.*`
KVs (llama.cpp reads them when it loads a model, and a request that names a
value still overrides it).  Two tags of one blob with different params show
different model.gguf files; `blobs/` shows each blob's own translation.

The layer is read by identity (device, inode, size, times): a layer that
changes is read again; one that cannot be used adds no KVs, and the reason is
kept for `compatfs ls`.  One reading is kept per layer path, and only for
the layers a scan of the store still names (`retain_layers`): as many as
the store has.
"""
from __future__ import annotations

import threading
from pathlib import Path

from ..files.blobfile import identity, status
from ..format.header import SourceGGUF
from ..format.params import Sampling, layer_sampling
from ..translate import ALWAYS, Translation, ViewSpec, plan

# The blob as it is, laid out afresh: what gains the KVs where no handler
# claims the blob.
UNCHANGED = Translation("unchanged", ALWAYS)

_lock = threading.Lock()
_layers: dict[str, tuple[tuple, Sampling]] = {}    # layer path -> (its identity, its reading)


def of_layer(path: Path) -> Sampling:
    """The sampling KVs of the params layer at `path` (read again once it changes)."""
    try:
        stamp = identity(status(path))    # resolved as every store path is (never into the mount)
    except OSError as e:
        return Sampling((), (f"params layer {path.name} cannot be read ({e.strerror}): "
                             "no sampling defaults in model.gguf",))
    with _lock:
        hit = _layers.get(str(path))
    if hit is None or hit[0] != stamp:
        hit = stamp, layer_sampling(path)
        with _lock:
            _layers[str(path)] = hit
    return hit[1]


def retain_layers(paths: set[Path]) -> None:
    """Forget the readings of every params layer not in `paths`."""
    keep = {str(p) for p in paths}
    with _lock:
        for gone in [p for p in _layers if p not in keep]:
            del _layers[gone]


def kvs_key(kvs: tuple) -> str:
    """A text that tells one set of sampling KVs from another (their keys,
    types and encoded values): what the index keys a sampled size by."""
    return ";".join(f"{key}={int(value.vtype)}:{bytes(value.payload).hex()}" for key, value in kvs)


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
