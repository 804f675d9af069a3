"""The views of each blob: a small summary of every blob for `stat` and
`readdir` (see `index`), whole views built when a file is read and kept in an
LRU bounded in bytes.

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

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor

from cachetools import LRUCache

from gguf import Keys

from . import handlers
from .blobfile import status
from .gguf_source import SourceGGUF, blob_identity
from .gguf_values import GGUFError
from .index import Index, Stamp, Summary
from .libc import die_with_parent, tune_malloc
from .opcache import OpCache
from .translation import Translation, ViewSpec, first_claim, plan
from .view import View

log = logging.getLogger("compatfs")

MODEL_FILE = "model.gguf"
MMPROJ_FILE = "mmproj.gguf"
LAYER_FILE = "layer"      # a manifest layer that is not GGUF (params, template, ...), served unchanged


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


def view_spec(info: BlobInfo, kind: str) -> ViewSpec | None:
    """What the `kind` (MODEL_FILE or MMPROJ_FILE) view of a classified blob
    holds; None: the blob itself."""
    tr = info.text if kind == MODEL_FILE else info.clip
    if kind == MMPROJ_FILE and not info.has_mmproj:
        raise FileNotFoundError(f"{info.source.path} has no projector view")
    return plan(tr, info.source) if tr is not None else None


def build_view(info: BlobInfo, kind: str, cache: OpCache) -> View:
    """The `kind` (MODEL_FILE or MMPROJ_FILE) view of a classified blob."""
    spec = view_spec(info, kind)
    if spec is None:
        return View.identity(info.source.identity)
    return View.translated(info.source, spec, cache, key=(info.source.identity, kind))


def _stamp(path: Path) -> Stamp:
    try:
        st = status(path)
    except OSError as e:
        raise GGUFError(f"{path}: {e.strerror}") from None
    return blob_identity(st)


def _die_with(parent: int) -> None:
    """Set up an indexing worker: it ends when the daemon ends, however it
    ends (a worker holds its own task queue open, so it would otherwise wait
    forever for work from a daemon killed with SIGKILL); and, as it lives for
    one batch only, it keeps freed memory for the next header rather than
    mapping fresh pages (and faulting them in) for each one."""
    die_with_parent()
    tune_malloc(mmap_threshold=256 << 20, trim_threshold=512 << 20)
    if os.getppid() != parent:    # the daemon ended before that took effect
        os._exit(0)


def summarize(path: Path, translate: bool) -> tuple[Stamp, Summary]:
    """The blob's identity and its views' summary, made from scratch (also in
    a worker process: every argument and result is plain data).  The
    identity is the parsed file's own (the path may name another by then)."""
    stamp = _stamp(path)

    def size(spec: ViewSpec | None) -> int:
        return View.translated_size(spec) if spec is not None else info.source.size

    try:
        info = classify(SourceGGUF(path), translate)
        model = view_spec(info, MODEL_FILE)
        mmproj = view_spec(info, MMPROJ_FILE) if info.has_mmproj else None
        model_size = size(model)
        mmproj_size = size(mmproj) if info.has_mmproj else None
    except GGUFError as e:
        return stamp, Summary(0, None, error=str(e))
    stamp = info.source.identity
    kvs = dict(model.kvs) if model else info.source.kvs
    arch = kvs[Keys.General.ARCHITECTURE].decode() if Keys.General.ARCHITECTURE in kvs else None
    return stamp, Summary(model_size, mmproj_size, info.text.name if info.text else None,
                          info.clip.name if info.clip else None, arch=arch)


class BlobViews:
    """What the mount knows of each blob: a small summary for `stat` and
    `readdir` (in memory for every blob, and in the persistent index), and
    whole views only for files being read, in an LRU bounded in bytes."""

    PATIENCE = 0.05   # seconds a request waits for a worker's summary before making its own

    def __init__(self, translate: bool = True, op_cache: OpCache | None = None,
                 index: Index | None = None, view_budget: int = 32 << 20, workers: int = 0):
        self.translate = translate
        self.op_cache = op_cache or OpCache()
        self.index = index if index is not None else Index(None, translate)
        self._views: LRUCache = LRUCache(maxsize=view_budget, getsizeof=lambda v: v.nbytes_held)
        self._lock = threading.Lock()
        self._workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._pending: dict[str, Future] = {}

    # -- summaries -------------------------------------------------------------
    def summary(self, path: Path, stamp: Stamp | None = None) -> Summary | None:
        """The blob's summary; GGUFError when the blob cannot be read at all.
        With `stamp`: the summary of the blob of that identity, None when the
        file at `path` turns out to be another."""
        expect, stamp = stamp, stamp or _stamp(path)
        hit = self.index.get(path, stamp)
        if hit is not None:
            return hit
        with self._lock:
            pending = self._pending.get(str(path))
        if pending is not None and pending.cancel():
            pending = None   # not started yet: computed here, now, rather than after the queue
        if pending is not None:
            # Taken by a worker, which usually has it within a few ms; but a
            # pool still starting holds its first tasks for half a second or
            # more: past a short wait it is computed here too.
            try:
                got_stamp, summary = pending.result(timeout=self.PATIENCE)
                if got_stamp == stamp:
                    self._indexed(path, stamp, summary)
                    return summary
            except TimeoutError:
                pass
            except Exception as e:   # a worker that died: computed here instead
                log.debug("background summary of %s failed: %s", path, e)
        got_stamp, summary = summarize(path, self.translate)
        if got_stamp == stamp:
            self._indexed(path, stamp, summary)
        elif expect is not None:
            return None
        return summary

    def _indexed(self, path: Path, stamp: Stamp, summary: Summary) -> None:
        if self.index.get(path, stamp) != summary:
            log.debug("indexed %s: %s", path, summary)
            self.index.put(path, stamp, summary)

    def size(self, path: Path, kind: str) -> int:
        """The size `stat` shows: 0 for a blob that cannot be presented (opening
        it reports why)."""
        if kind == LAYER_FILE or (not self.translate and kind == MODEL_FILE):
            try:
                return _stamp(path)[2]
            except GGUFError:
                return 0
        try:
            summary = self.summary(path)
        except GGUFError:
            return 0
        size = summary.model_size if kind == MODEL_FILE else summary.mmproj_size
        return size or 0

    def has_mmproj(self, path: Path) -> bool:
        """Whether the blob has a projector view; False for a blob that cannot be read."""
        try:
            return self.summary(path).mmproj_size is not None
        except GGUFError as e:   # reported when its model.gguf is opened
            log.debug("%s: %s", path, e)
            return False

    def prefetch(self, paths) -> None:
        """Summarise, in worker processes, the blobs of `paths` not yet indexed
        (with `workers` > 0 and at least two of them to do)."""
        if self._workers <= 0:
            return
        todo = []
        for path in paths:
            try:
                if self.index.get(path, _stamp(path)) is None and str(path) not in self._pending:
                    todo.append(path)
            except GGUFError:
                continue
        if len(todo) < 2:
            return
        # Starting worker processes takes a while: never in the caller's
        # (a FUSE request's) time.
        threading.Thread(target=self._submit, args=(todo,), name="compatfs-index", daemon=True).start()

    def _submit(self, todo: list[Path]) -> None:
        with self._lock:
            if self._pool is None:
                ctx = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(max_workers=self._workers, mp_context=ctx,
                                                 initializer=_die_with, initargs=(os.getpid(),))
            futures = []
            for path in todo:
                if str(path) not in self._pending:
                    future = self._pool.submit(summarize, path, self.translate)
                    self._pending[str(path)] = future
                    futures.append((path, future))
        for path, future in futures:
            future.add_done_callback(lambda f, p=path: self._done(p, f))

    def _done(self, path: Path, future: Future) -> None:
        try:
            stamp, summary = future.result()
            if stamp == _stamp(path):
                self._indexed(path, stamp, summary)
        except Exception as e:
            log.debug("background summary of %s failed: %s", path, e)
        with self._lock:
            self._pending.pop(str(path), None)
            if not self._pending and self._pool is not None:
                # Idle workers hold memory: they go until the next batch.
                self._pool.shutdown(wait=False)
                self._pool = None

    def close(self) -> None:
        """Stop the indexing workers (what they were doing is done again next time)."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._pending.clear()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    # -- views -----------------------------------------------------------------
    def view(self, path: Path, kind: str) -> View:
        """The view; GGUFError (naming the blob) when it cannot be built."""
        stamp = _stamp(path)
        if kind == LAYER_FILE or (not self.translate and kind == MODEL_FILE):
            return View.identity(stamp)
        key = (str(path), stamp, kind)
        with self._lock:
            hit = self._views.get(key)
        if hit is not None:
            return hit
        try:
            info = classify(SourceGGUF(path), self.translate)
            if kind == MMPROJ_FILE and not info.has_mmproj:
                raise GGUFError("it has no projector view")
            view = build_view(info, kind, self.op_cache)
        except (GGUFError, ValueError) as e:
            raise GGUFError(f"{path}: {e}") from None
        if view.stamp == stamp:
            known = self.index.get(path, stamp)
            size = None if known is None else known.model_size if kind == MODEL_FILE else known.mmproj_size
            if size is not None and size != view.size:
                log.error("index entry of %s said %d bytes for %s, the view has %d: entry replaced",
                          path, size, kind, view.size)
                self.index.forget(path)
            with self._lock:
                if view.nbytes_held <= self._views.maxsize:
                    self._views[key] = view
        return view

    def retain(self, paths: set[Path]) -> None:
        """Forget every view and summary whose blob is not one of `paths` (blobs
        that left the store); views held by open files live on with them."""
        keep = {str(p) for p in paths}
        with self._lock:
            for key in [k for k in self._views if k[0] not in keep]:
                del self._views[key]
        for gone in self.index.known() - keep:
            self.index.forget(Path(gone))
