"""The views of each blob: a small summary of every blob for `stat` and
`readdir` (see `index`), whole views built when a file is read and kept in an
LRU bounded in bytes.

For a blob, `model.gguf` is the text view: the first text translation that
claims it, else the blob unchanged.  `mmproj.gguf` exists for a projector
blob (architecture `clip`: the first clip translation that claims it, else
unchanged) and for a monolithic blob that a clip translation claims.  With
translation off every view is the blob unchanged.

A handler that fails while claiming, planning or rendering a view (whatever
it raises) refuses that one view: GGUFError naming the blob, the handler and
the reason; the blob's other view is made as if it had not been asked.  A
fault of the system met meanwhile (memory running out, a blob read failing:
`blobfile.transient`) refuses nothing: it is raised as a `Transient`, so
that nothing remembers it as the blob's.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor, TimeoutError as FutureTimeout
from typing import Callable, overload

from cachetools import LRUCache

from gguf import Keys

from .. import handlers  # type: ignore[attr-defined]  # handlers/, by package-dir: mypy cannot see it
from ..files.blobfile import Transient, identity, status, transient
from ..format.header import SourceGGUF
from ..errors import GGUFError
from ..format.values import VT
from .index import Index, Stamp, Summary
from ..files.libc import tune_malloc
from .opcache import OpCache
from .sampling import Layers, kvs_key, of_layer, with_sampling
from ..translate import Translation, ViewSpec, first_claim, plan
from .layout import View
from ..names import LAYER_FILE, MMPROJ_FILE, MODEL_FILE

log = logging.getLogger(__name__)


def translation_enabled(no_translate: bool = False) -> bool:
    """Off with --no-translate or OLLAMA_LLAMA_CPP_COMPAT=0 (as in Ollama)."""
    return not no_translate and os.environ.get("OLLAMA_LLAMA_CPP_COMPAT") != "0"


@dataclass(frozen=True)
class BlobInfo:
    """A parsed blob, the translations that claim it, and why a claim
    failed (then that view is refused: a verdict on the blob's bytes, never
    a fault of the system, which `classify` raises)."""

    source: SourceGGUF
    text: Translation | None
    clip: Translation | None
    text_error: GGUFError | None = None
    clip_error: GGUFError | None = None

    @property
    def has_mmproj(self) -> bool:
        return _is_projector(self.source) or self.clip is not None or self.clip_error is not None


def _architecture(kvs) -> str | None:
    """general.architecture of `kvs` where it is a string (else None)."""
    v = kvs.get(Keys.General.ARCHITECTURE)
    if v is None or v.vtype != VT.STRING:
        return None
    try:
        return v.decode()
    except (GGUFError, UnicodeDecodeError):
        return None


def _embedding(kvs) -> bool:
    """Whether a view of KVs `kvs` is an embedding model: it names a pooling
    type for its architecture."""
    arch = _architecture(kvs)
    return arch is not None and f"{arch}.pooling_type" in kvs


def _is_projector(source: SourceGGUF) -> bool:
    return _architecture(source.kvs) == "clip"


class HandlerFailure(GGUFError):
    """A handler raised something other than GGUFError (it is not total) and
    other than a fault of the system: its view is refused as for any
    GGUFError; `__cause__` is what it raised (for the fuzzer, which reports
    these as findings)."""


def _contained(what: str, fn, *args):
    """`fn(*args)`; whatever it raises as GGUFError naming `what` (a handler
    that is not total must take down no more than the view it makes): a
    GGUFError as its own kind, a fault of the system (`blobfile.transient`)
    as Transient, anything else as HandlerFailure."""
    try:
        return fn(*args)
    except HandlerFailure as e:
        raise HandlerFailure(f"{what}: {e}") from e.__cause__
    except GGUFError as e:
        raise type(e)(f"{what}: {e}") from None
    except Exception as e:
        kind = Transient if transient(e) else HandlerFailure
        raise kind(f"{what}: {type(e).__name__}: {e}") from e


def _claim(translations, source: SourceGGUF, kind: str) -> tuple[Translation | None, GGUFError | None]:
    """The first claiming translation, or why claiming failed; a fault of
    the system is raised (it says nothing of the blob)."""
    try:
        return _contained(f"claiming {kind}", first_claim, translations, source), None
    except GGUFError as e:
        if transient(e):
            raise
        return None, e


def classify(source: SourceGGUF, translate: bool = True) -> BlobInfo:
    """Which translations claim `source` (none when translation is off).  A
    clip translation is asked only of a projector or a blob with `v.*`
    tensors (the vision part of a monolithic blob).  Transient when a fault
    of the system stopped a claim."""
    if not translate:
        return BlobInfo(source, None, None)
    text, text_error = _claim(handlers.TEXT, source, MODEL_FILE)
    clip = clip_error = None
    if _is_projector(source) or source.has_tensor_prefix("v."):
        clip, clip_error = _claim(handlers.CLIP, source, MMPROJ_FILE)
    return BlobInfo(source, text, clip, text_error, clip_error)


def view_spec(info: BlobInfo, kind: str) -> ViewSpec | None:
    """What the `kind` (MODEL_FILE or MMPROJ_FILE) view of a classified blob
    holds; None: the blob itself.  GGUFError when that view is refused."""
    if kind == MMPROJ_FILE and not info.has_mmproj:
        raise FileNotFoundError(f"{info.source.path} has no projector view")
    error = info.text_error if kind == MODEL_FILE else info.clip_error
    if error is not None:
        raise type(error)(str(error)) from error.__cause__
    tr = info.text if kind == MODEL_FILE else info.clip
    return _contained(f"{tr.name}: planning {kind}", plan, tr, info.source) if tr is not None else None


def sampled_spec(info: BlobInfo, kind: str, sampling_kvs: tuple = ()) -> ViewSpec | None:
    """`view_spec`, with `sampling_kvs` (see `sampling`) set where there are any."""
    spec = view_spec(info, kind)
    if sampling_kvs:
        try:
            spec = with_sampling(spec, info.source, sampling_kvs)
        except GGUFError as e:   # a blob only served as it is (duplicate keys, say)
            log.warning("%s: model.gguf without its params layer's sampling defaults (%s)", info.source.path, e)
    return spec


def build_view(info: BlobInfo, kind: str, cache: OpCache, sampling_kvs: tuple = ()) -> View:
    """The `kind` (MODEL_FILE or MMPROJ_FILE) view of a classified blob; with
    `sampling_kvs`, the text view with those KVs set."""
    spec = sampled_spec(info, kind, sampling_kvs)
    if spec is None:
        return View.identity(info.source.identity)
    return _contained(f"rendering {kind}", View.translated, info.source, spec, cache, (info.source.identity, kind))


def _stamp(path: Path) -> Stamp:
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


def _die_with(parent: int) -> None:
    """Set up an indexing worker: it ends when the daemon ends, however it
    ends (a worker holds its own task queue open, so it would otherwise wait
    forever for work from a daemon killed with SIGKILL); and, as it lives for
    one batch only, it keeps freed memory for the next header rather than
    mapping fresh pages (and faulting them in) for each one."""
    threading.Thread(target=_watch_parent, args=(parent,), name="compatfs-parent", daemon=True).start()
    tune_malloc(mmap_threshold=256 << 20, trim_threshold=512 << 20)
    if os.getppid() != parent:    # the daemon ended before that took effect
        os._exit(0)


def summarize(path: Path, translate: bool) -> tuple[Stamp, Summary]:
    """The blob's identity and its views' summary, made from scratch (also in
    a worker process: every argument and result is plain data).  A refused
    view has size 0 and its reason; a blob that cannot be parsed, `error`.
    The identity is the parsed file's own (the path may name another by then)."""
    stamp = _stamp(path)
    try:
        info = classify(SourceGGUF(path), translate)
    except GGUFError as e:
        if transient(e):
            raise        # a fault of the system is no verdict on the blob: nothing to index
        return stamp, Summary(0, None, error=str(e))
    stamp = info.source.identity

    def made(kind: str) -> tuple[int, str | None, ViewSpec | None]:
        try:
            spec = view_spec(info, kind)
            return (_contained(f"sizing {kind}", View.translated_size, spec) if spec is not None
                    else info.source.size), None, spec
        except GGUFError as e:
            if transient(e):
                raise
            return 0, f"{path}: {e}", None

    model_size, model_error, model = made(MODEL_FILE)
    mmproj_size, mmproj_error, _ = made(MMPROJ_FILE) if info.has_mmproj else (None, None, None)
    kvs = dict(model.kvs) if model else info.source.kvs
    return stamp, Summary(model_size, mmproj_size, info.text.name if info.text else None,
                          info.clip.name if info.clip else None, arch=_architecture(kvs),
                          model_error=model_error, mmproj_error=mmproj_error, embedding=_embedding(kvs))


class BlobViews:
    """What the mount knows of each blob: a small summary for `stat` and
    `readdir` (in memory for every blob, and in the persistent index), and
    whole views only for files being read, in an LRU bounded in bytes.
    Each header parsed here is logged at debug level ("parsed the header of
    ..."; those workers parse, as they return)."""

    PATIENCE = 0.05   # seconds a request waits for a worker's summary before making its own
    MAX_WORKERS = 4   # indexing processes at most, whatever is asked (each imports numpy and gguf)

    def __init__(self, translate: bool = True, op_cache: OpCache | None = None,
                 index: Index | None = None, view_budget: int = 32 << 20, workers: int = 0):
        self.translate = translate
        self.op_cache = op_cache or OpCache()
        self.index = index if index is not None else Index(None, translate)
        self._views: LRUCache = LRUCache(maxsize=view_budget, getsizeof=lambda v: v.nbytes_held)
        self._lock = threading.Lock()
        self._workers = min(workers, self.MAX_WORKERS)
        self._pool: ProcessPoolExecutor | None = None
        self._pending: dict[str, Future] = {}
        self.on_belied: Callable[[Path], None] | None = None
        self._checked: dict[str, Stamp] = {}   # blob path -> identity whose summary was made by this daemon

    # -- summaries -------------------------------------------------------------
    @overload
    def summary(self, path: Path) -> Summary: ...

    @overload
    def summary(self, path: Path, stamp: Stamp) -> Summary | None: ...

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
            except FutureTimeout:    # (on Python 3.10 not the builtin TimeoutError)
                pass
            except Exception as e:   # a worker that died: computed here instead
                log.debug("background summary of %s failed: %s", path, e)
        got_stamp, summary = self._summarize(path, "its summary")
        if got_stamp == stamp:
            self._indexed(path, stamp, summary)
        elif expect is not None:
            return None
        return summary

    def _parsing(self, path: Path, why: str) -> None:
        log.debug("parsed the header of %s for %s", path, why)

    def _summarize(self, path: Path, why: str) -> tuple[Stamp, Summary]:
        self._parsing(path, why)
        return summarize(path, self.translate)

    def _indexed(self, path: Path, stamp: Stamp, summary: Summary) -> None:
        with self._lock:
            self._checked[str(path)] = stamp
        if self.index.get(path, stamp) != summary:
            log.debug("indexed %s: %s", path, summary)
            self.index.put(path, stamp, summary)

    def has_mmproj(self, path: Path) -> bool:
        """Whether the blob has a projector view; False for a blob that cannot be read."""
        try:
            return self.summary(path).mmproj_size is not None
        except GGUFError as e:   # reported when its model.gguf is opened
            log.debug("%s: %s", path, e)
            return False

    def prefetch(self, paths) -> None:
        """Summarise, in worker processes (`workers` of them, at most
        `MAX_WORKERS`), the blobs of `paths` not yet indexed (with `workers` >
        0 and at least two of them to do)."""
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
            future.add_done_callback(functools.partial(self._done, path))

    def _done(self, path: Path, future: Future) -> None:
        try:
            stamp, summary = future.result()
            self._parsing(path, "its summary, in a worker")
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
        """Stop the indexing workers (what they were doing is done again next
        time) and write what the index learnt."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._pending.clear()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self.index.close()

    # -- views -----------------------------------------------------------------
    def sampling_kvs(self, kind: str, params: Layers | None) -> tuple:
        """The KVs a model folder's `kind` file gains from its params layer
        (`params`): only model.gguf, only with translation on."""
        if params is None or kind != MODEL_FILE or not self.translate:
            return ()
        return of_layer(params).kvs

    def sampled_size(self, path: Path, params: Layers | None, size: int) -> int:
        """The size of a model folder's model.gguf whose blob's own text view
        has `size` bytes: that view's with the params layer's KVs (counted
        from the blob's header once per blob and set of KVs, then kept in the
        index beside the blob's summary)."""
        kvs = self.sampling_kvs(MODEL_FILE, params)
        if not kvs:
            return size
        stamp, key = _stamp(path), kvs_key(kvs)
        hit = self.index.sampled(path, stamp, key)
        if hit is None:
            self._parsing(path, "its size with sampling defaults")
            try:
                source = SourceGGUF(path)
                info = classify(source, self.translate)
                spec = sampled_spec(info, MODEL_FILE, kvs)
            except (GGUFError, ValueError) as e:
                raise GGUFError(f"{path}: {e}") from None
            hit = View.translated_size(spec) if spec is not None else info.source.size
            if source.identity == stamp:
                self.index.put_sampled(path, stamp, key, hit)
        return hit

    def view(self, path: Path, kind: str, params: Layers | None = None) -> View:
        """The view (of a model folder's file: with its params layer's KVs);
        GGUFError (naming the blob) when it cannot be built.  What the index
        says of it is checked against it before it is returned: see `_verify`."""
        stamp = _stamp(path)
        if kind == LAYER_FILE or (not self.translate and kind == MODEL_FILE):
            return View.identity(stamp)
        kvs = self.sampling_kvs(kind, params)
        key = (str(path), stamp, kind, kvs)
        with self._lock:
            hit = self._views.get(key)
        if hit is not None:
            return hit
        self._parsing(path, f"its {kind}")
        try:
            info = classify(SourceGGUF(path), self.translate)
            if kind == MMPROJ_FILE and not info.has_mmproj:
                raise GGUFError("it has no projector view")
            view = build_view(info, kind, self.op_cache, kvs)
        except GGUFError as e:
            if not kvs:
                self._verify(path, stamp, kind, None)
            raise GGUFError(f"{path}: {e}") from None
        if view.stamp == stamp:
            embedding = _embedding(dict(view.spec.kvs) if view.spec is not None else info.source.kvs)
            self._verify(path, stamp, kind, view.size, kvs, embedding)
            with self._lock:
                if view.nbytes_held <= self._views.maxsize:
                    self._views[key] = view
        return view

    def _verify(self, path: Path, stamp: Stamp, kind: str, size: int | None, kvs: tuple = (),
                embedding: bool | None = None) -> None:
        """Index entries are hints: where the entry of `path` belies the view
        just built (its size, or with sampling KVs `kvs` the size recorded
        with them; None: no view; for model.gguf, whether it is an embedding
        model), the entry is made again from the blob, logged, and
        `on_belied(path)` is told (the FUSE layer drops what the kernel keeps
        of the blob's files, and models.ini is made again)."""
        known = self.index.get(path, stamp)
        wrong = []
        if kvs and size is not None:
            recorded = self.index.sampled(path, stamp, kvs_key(kvs))
            if recorded is not None and recorded != size:
                wrong.append(f"{recorded} bytes for {kind} with its sampling keys, the view has {size}")
                self.index.put_sampled(path, stamp, kvs_key(kvs), size)
        if known is not None and not kvs:
            shown = known.model_size if kind == MODEL_FILE else known.mmproj_size
            if (shown or None) != size:
                wrong.append(f"{shown} bytes for {kind}, the view has {size if size is not None else 'none'}")
        if known is not None and kind == MODEL_FILE and embedding is not None and known.embedding != embedding:
            wrong.append(f"embedding model: {known.embedding}, the view's header: {embedding}")
        if not wrong:
            return
        if known is not None:
            got_stamp, summary = self._summarize(path, "a check of its index entry")
            if got_stamp != stamp:
                return
            self.index.put(path, stamp, summary)
        log.error("index entry of %s said %s: entry replaced", path, "; ".join(wrong))
        if self.on_belied is not None:
            self.on_belied(path)

    def embedding(self, path: Path) -> bool:
        """Whether the blob's model.gguf is an embedding model, as its header
        says (what models.ini gives `embeddings`): the index's word is
        checked against the blob once per blob identity (a header parsed,
        unless this daemon made the entry itself), and replaced, logged,
        where it is wrong; False for a blob that cannot be read."""
        try:
            stamp = _stamp(path)
            summary = self.summary(path, stamp)
        except GGUFError as e:
            log.debug("%s: %s", path, e)
            return False
        if summary is None:           # another blob by now: the next scan asks again
            return False
        with self._lock:
            checked = self._checked.get(str(path)) == stamp
        if not checked:
            try:
                got_stamp, made = self._summarize(path, "a check of its embedding flag")
            except GGUFError as e:
                log.debug("%s: %s", path, e)
                return False
            if got_stamp != stamp:
                return False
            if made.embedding != summary.embedding:
                # Only the flag: a size it got wrong too is found (and the
                # kernel told) when the view is built (`_verify`).
                log.error("index entry of %s said embedding model: %s, its header: %s: flag replaced", path,
                          summary.embedding, made.embedding)
                summary = dataclasses.replace(summary, embedding=made.embedding)
                self.index.put(path, stamp, summary)
            with self._lock:
                self._checked[str(path)] = stamp
        return summary.embedding

    def retain(self, paths: set[Path]) -> None:
        """Forget every view and summary whose blob is not one of `paths` (blobs
        that left the store); views held by open files live on with them."""
        keep = {str(p) for p in paths}
        with self._lock:
            for key in [k for k in self._views if k[0] not in keep]:
                del self._views[key]
            for gone in [p for p in self._checked if p not in keep]:
                del self._checked[gone]
        self.index.retain(keep)
