"""A blob's summary made from scratch: what `stat`, `readdir` and
`models.ini` need of its views (`summary.Summary`), from its header; also in
the indexing worker processes (`die_with` sets one up)."""

from __future__ import annotations

import dataclasses
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import GGUFError
from ..files.blobfile import Stamp, identity, status, transient
from ..files.libc import tune_malloc
from ..format.header import SourceGGUF
from ..names import MMPROJ_FILE, MODEL_FILE
from ..translate import ViewSpec
from .claims import architecture, classify, contained, is_embedding, view_spec
from .summary import Summary, sound_context_length
from .layout import View


@dataclass(frozen=True)
class Trained:
    """What a model blob's header says of the model as it was trained (what
    bounds the params layer's options in models.ini): its context length
    (`<arch>.context_length`; None when absent or not a positive int32) and
    its blocks (those it holds tensors `blk.<i>.*` of, never a count read
    from a KV)."""

    context_length: int | None
    block_count: int


def trained(source: SourceGGUF) -> Trained:
    """The `Trained` of a parsed blob."""
    arch = source.architecture
    try:
        ctx = source.get(f"{arch}.context_length") if arch else None
    except (GGUFError, UnicodeDecodeError, ValueError):
        ctx = None
    return Trained(ctx if sound_context_length(ctx) else None, len(source.block_ids()))


def stamp_of(path: Path) -> Stamp:
    """The identity of the regular file `path` resolves to (resolved as
    `blobfile` resolves it, nothing opened); GGUFError for anything else."""
    try:
        st = status(path)
    except OSError as e:
        raise GGUFError(f"{path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise GGUFError(f"{path}: not a regular file")
    return identity(st)


def _watch_parent(parent: int) -> None:
    """End this process within a quarter second of the daemon's end, however
    it ends.  (Not the parent-death signal: that follows the thread that
    started the worker, which ends long before the daemon does.)"""
    while os.getppid() == parent:
        time.sleep(0.25)
    os._exit(0)


def die_with(parent: int) -> None:
    """Set up an indexing worker: it ends when the daemon ends, however it
    ends (a worker holds its own task queue open, so it would otherwise wait
    forever for work from a daemon killed with SIGKILL); and, as it lives for
    one batch only, it keeps freed memory for the next header rather than
    mapping fresh pages (and faulting them in) for each one."""
    threading.Thread(target=_watch_parent, args=(parent,), name="compatfs-parent", daemon=True).start()
    tune_malloc(mmap_threshold=256 << 20, trim_threshold=512 << 20)
    if os.getppid() != parent:  # the daemon ended before that took effect
        os._exit(0)


def summarize(path: Path, translate: bool) -> tuple[Stamp, Summary]:
    """The blob's identity and its views' summary, made from scratch (also in
    a worker process: every argument and result is plain data).  A refused
    view has size 0 and its reason; a blob that cannot be parsed, `error`.
    The identity is the parsed file's own (the path may name another by then;
    for a blob that cannot be parsed, the file's at `path` after the attempt;
    GGUFError when there is none, or no regular file)."""
    try:
        info = classify(SourceGGUF(path), translate)
    except GGUFError as e:
        if transient(e):
            raise  # a fault of the system is no verdict on the blob: nothing to index
        return stamp_of(path), Summary(0, None, error=str(e))
    stamp = info.source.identity

    def made(kind: str) -> tuple[int, str | None, ViewSpec | None]:
        try:
            spec = view_spec(info, kind)
            return (
                (contained(f"sizing {kind}", View.translated_size, spec) if spec is not None else info.source.size),
                None,
                spec,
            )
        except GGUFError as e:
            if transient(e):
                raise
            return 0, f"{path}: {e}", None

    model_size, model_error, model = made(MODEL_FILE)
    mmproj_size, mmproj_error, _ = made(MMPROJ_FILE) if info.has_mmproj else (None, None, None)
    kvs = dict(model.kvs) if model else info.source.kvs
    return stamp, Summary(
        model_size,
        mmproj_size,
        info.text.name if info.text else None,
        info.clip.name if info.clip else None,
        arch=architecture(kvs),
        model_error=model_error,
        mmproj_error=mmproj_error,
        embedding=is_embedding(kvs),
        **dataclasses.asdict(trained(info.source)),
    )
