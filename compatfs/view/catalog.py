"""What the mount knows of each blob (`BlobViews`): a small summary of every
blob for `stat`, `readdir` and `models.ini` (made by `summaries`, kept by
`index`), whole views built when a file is read (`claims`) and kept in an
LRU bounded in bytes."""

from __future__ import annotations

import dataclasses
import functools
import logging
import multiprocessing
import os
import stat
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ProcessPoolExecutor, TimeoutError as FutureTimeout
from pathlib import Path
from typing import overload
from collections.abc import Callable

from cachetools import LRUCache

from ..errors import GGUFError
from ..files.blobfile import Stamp, identity
from ..format.header import SourceGGUF
from ..names import LAYER_FILE, MMPROJ_FILE, MODEL_FILE
from .claims import build_view, classify, is_embedding, sampled_spec
from .index import Index
from .summary import Summary
from .layout import View
from .opcache import OpCache
from .sampling import Layers, kvs_key, of_layer
from .summaries import Trained, die_with, stamp_of, summarize, trained

# Also named here, where the CLI and the fuzzer import them from.
from .claims import HandlerFailure, translation_enabled  # noqa: F401

log = logging.getLogger(__name__)


class BlobViews:
    """What the mount knows of each blob: a small summary for `stat` and
    `readdir` (in memory for every blob, and in the persistent index), and
    whole views only for files being read, in an LRU bounded in bytes.
    Each header parsed here is logged at debug level ("parsed the header of
    ..."; those workers parse, as they return)."""

    PATIENCE = 0.05  # seconds a request waits for a worker's summary before making its own
    MAX_WORKERS = 4  # indexing processes at most, whatever is asked (each imports numpy and gguf)

    def __init__(
        self,
        translate: bool = True,
        op_cache: OpCache | None = None,
        index: Index | None = None,
        view_budget: int = 32 << 20,
        workers: int = 0,
    ):
        self.translate = translate
        self.op_cache = op_cache or OpCache()
        self.index = index if index is not None else Index(None, translate)
        self._views: LRUCache = LRUCache(maxsize=view_budget, getsizeof=lambda v: v.nbytes_held)
        self._lock = threading.Lock()
        self._workers = min(workers, self.MAX_WORKERS)
        self._pool: ProcessPoolExecutor | None = None
        self._pending: dict[str, Future] = {}
        self.on_belied: Callable[[Path], None] | None = None
        self._checked: dict[str, Stamp] = {}  # blob path -> identity whose summary was made by this daemon
        self._seen: dict[str, os.stat_result] = {}  # blob path -> its status as the last scan found it

    # -- statuses --------------------------------------------------------------
    def saw(self, statuses: Mapping[Path, os.stat_result | OSError]) -> None:
        """The statuses of blobs as a scan of the store just found them
        (`blobfile.statuses`): what `stat` and `readdir` answer from until
        the next scan (the scan that finds a blob changed tells the kernel
        and the FUSE layer's memo to forget it), so that answering them
        resolves no path again.  Views are built from the blob as it is
        when they are read, whatever was seen."""
        with self._lock:
            for path, st in statuses.items():
                if isinstance(st, os.stat_result) and stat.S_ISREG(st.st_mode):
                    self._seen[str(path)] = st
                else:
                    self._seen.pop(str(path), None)

    def seen(self, path: Path) -> os.stat_result | None:
        """The status of the regular file `path` as the last scan found it (None: not seen)."""
        with self._lock:
            return self._seen.get(str(path))

    def _stamp(self, path: Path) -> Stamp:
        """The identity of the blob at `path` as the last scan found it, else as it is now."""
        st = self.seen(path)
        return identity(st) if st is not None else stamp_of(path)

    # -- summaries -------------------------------------------------------------
    @overload
    def summary(self, path: Path) -> Summary: ...

    @overload
    def summary(self, path: Path, stamp: Stamp) -> Summary | None: ...

    def summary(self, path: Path, stamp: Stamp | None = None) -> Summary | None:
        """The blob's summary; GGUFError when the blob cannot be read at all.
        With `stamp`: the summary of the blob of that identity, None when the
        file at `path` turns out to be another."""
        expect, stamp = stamp, stamp or self._stamp(path)
        hit = self.index.get(path, stamp)
        if hit is not None:
            return hit
        with self._lock:
            pending = self._pending.get(str(path))
        if pending is not None and pending.cancel():
            pending = None  # not started yet: computed here, now, rather than after the queue
        if pending is not None:
            # Taken by a worker, which usually has it within a few ms; but a
            # pool still starting holds its first tasks for half a second or
            # more: past a short wait it is computed here too.
            try:
                got_stamp, summary = pending.result(timeout=self.PATIENCE)
                if got_stamp == stamp:
                    self._indexed(path, stamp, summary)
                    return summary
            except FutureTimeout:  # (on Python 3.10 not the builtin TimeoutError)
                pass
            except Exception as e:  # a worker that died: computed here instead
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
        except GGUFError as e:  # reported when its model.gguf is opened
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
                if self.index.get(path, self._stamp(path)) is None and str(path) not in self._pending:
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
                self._pool = ProcessPoolExecutor(
                    max_workers=self._workers, mp_context=ctx, initializer=die_with, initargs=(os.getpid(),)
                )
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
            if stamp == self._stamp(path):
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
        stamp, key = self._stamp(path), kvs_key(kvs)
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
        stamp = stamp_of(path)
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
            embedding = is_embedding(dict(view.spec.kvs) if view.spec is not None else info.source.kvs)
            self._verify(path, stamp, kind, view.size, kvs, embedding, trained(info.source))
            with self._lock:
                if view.nbytes_held <= self._views.maxsize:
                    self._views[key] = view
        return view

    def _verify(
        self,
        path: Path,
        stamp: Stamp,
        kind: str,
        size: int | None,
        kvs: tuple = (),
        embedding: bool | None = None,
        made: Trained | None = None,
    ) -> None:
        """Index entries are hints: where the entry of `path` belies the view
        just built (its size, or with sampling KVs `kvs` the size recorded
        with them; None: no view; for model.gguf, whether it is an embedding
        model, and the blob's `Trained` values, `made`), the entry is made
        again from the blob, logged, and
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
        if known is not None and kind == MODEL_FILE and made is not None and _trained_of(known) != made:
            wrong.append(f"{_trained_of(known)}, the blob's header: {made}")
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
        summary = self._for_preset(path)
        return summary is not None and summary.embedding

    def trained(self, path: Path) -> Trained | None:
        """What the blob's header says of the model as trained (its context
        length and blocks: what bounds the params layer's options in
        models.ini), from its summary (the index's word where it has one: of
        its kinds, and checked against the header when model.gguf's view is
        built, and with the embedding flag); None for a blob that cannot be read."""
        try:
            return _trained_of(self.summary(path))
        except GGUFError as e:
            log.debug("%s: %s", path, e)
            return None

    def _for_preset(self, path: Path) -> Summary | None:
        """The blob's summary with what models.ini takes of it (the embedding
        flag, `Trained`) checked against its header once per blob identity
        (a header parsed, unless this daemon made the entry itself), and
        replaced, logged, where it is wrong; None for a blob that cannot be
        read (or that turned into another meanwhile: the next scan asks again)."""
        try:
            stamp = stamp_of(path)
            summary = self.summary(path, stamp)
        except GGUFError as e:
            log.debug("%s: %s", path, e)
            return None
        if summary is None:
            return None
        with self._lock:
            checked = self._checked.get(str(path)) == stamp
        if not checked:
            try:
                got_stamp, made = self._summarize(path, "a check of its embedding flag")
            except GGUFError as e:
                log.debug("%s: %s", path, e)
                return None
            if got_stamp != stamp:
                return None
            fixed = dataclasses.replace(
                summary, embedding=made.embedding, context_length=made.context_length, block_count=made.block_count
            )
            if fixed != summary:
                # Only these: a size it got wrong too is found (and the
                # kernel told) when the view is built (`_verify`).
                log.error(
                    "index entry of %s said embedding model: %s, %s; its header: %s, %s: replaced",
                    path,
                    summary.embedding,
                    _trained_of(summary),
                    made.embedding,
                    _trained_of(made),
                )
                summary = fixed
                self.index.put(path, stamp, summary)
            with self._lock:
                self._checked[str(path)] = stamp
        return summary

    def retain(self, paths: set[Path]) -> None:
        """Forget every view and summary whose blob is not one of `paths` (blobs
        that left the store); views held by open files live on with them."""
        keep = {str(p) for p in paths}
        with self._lock:
            for key in [k for k in self._views if k[0] not in keep]:
                del self._views[key]
            for gone in [p for p in self._checked if p not in keep]:
                del self._checked[gone]
            for gone in [p for p in self._seen if p not in keep]:
                del self._seen[gone]
        self.index.retain(keep)


def _trained_of(summary: Summary) -> Trained:
    return Trained(summary.context_length, summary.block_count)
