"""Ranges of op tensors computed ahead of a reader, on worker threads.

A sequential reader of a view (the kernel's read-ahead through the mount,
`compatfs export`) asks for one range after another; each range of a ranged
op (`Op.ranged`: a repack, a dtype promotion) costs CPU that one request at
a time would spend on one core.  Once a read continues where the last one of
the same open file ended, `Ahead` has the computed ranges of the next
`WINDOW` bytes of the view computed by a pool of worker threads (numpy and
the compiled kernels release the GIL), one `CHUNK` of the view at a time,
and the reads that reach them copy them out.

Bounds: at most `PER_FILE` chunks per open file and `HELD` over all files
are held or being computed (each `CHUNK` bytes); a read that is no
continuation (the reader went elsewhere) drops its file's chunks (those not
started are never computed), and chunks behind the reader are dropped as it
passes them.  A chunk is computed by the same `compute_range_into` into its
own buffer as a read would compute into its reply: the bytes are the same.
Computing ahead is best effort and never fails a read: a chunk whose
computation failed is computed again by the read that needs it (so only an
error of the data itself fails that read, as it would without computing
ahead; other files never see it), and what the bookkeeping needs after a
read's bytes are filled (a descriptor for the workers, memory for a chunk, a
worker thread) is done without when the system cannot give it, every place
among the `HELD` it took given back.  Chunks of a file that stays open but
has not read for `IDLE` seconds are reclaimed when another file finds no
place among the `HELD` (they are computed again, or by the reads, should it
read on).  Workers read the blob through a descriptor of their own (a
duplicate of the open file's), closed once the file is gone and no worker
uses it.

An open file's `Ahead` is owned by its `BlobFile` (`of`: made on its first
read), and closed with it: closing the file drops every chunk, never
computes those not started, and closes the workers' descriptor once no
worker uses it.  The workers are `pool.Pool`'s, as many as `pool.workers`
says (none: every range is computed by the read that needs it).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from functools import partial
from typing import NamedTuple
from collections.abc import Callable, Hashable, Iterable

from ..files.blobfile import BlobFile
from ..errors import GGUFError
from ..translate.ops import Op
from ..files.scratch import give, take
from .pool import Pool, workers
from .segments import Computed

CHUNK = 1 << 20  # view bytes computed at a time by a worker
PER_FILE = 8  # chunks held or being computed for one open file
LATER = 2  # op-cache chunks being computed ahead for one open file
WINDOW = PER_FILE * CHUNK
IDLE = 2.0  # seconds without a read after which a file's chunks may be reclaimed for another's

log = logging.getLogger(__name__)


WORKERS = workers()
HELD = max(2 * PER_FILE, 4 * WORKERS)  # chunks held or being computed over all open files

enabled = WORKERS > 0


class Later(NamedTuple):
    """An op-cache chunk to compute ahead (the name says when: later than
    the read that plans it, before the read that needs it): its result is
    kept by the op cache, not by `Ahead`.  It is for the view's bytes from
    `at`; `run(blob)` computes it, reading through `blob`; `key` names it."""

    key: Hashable
    at: int
    run: Callable[[BlobFile], object]


# A chunk's computation: (blob, op, lo, out) -> op bytes [lo, lo + len(out)) into out.
Compute = Callable[[BlobFile, Op, int, memoryview], None]


_pool = Pool(WORKERS)
_held_lock = threading.Lock()
_held = 0


def held() -> int:
    """Chunks held or being computed over all open files."""
    with _held_lock:
        return _held


def _reserve() -> bool:
    """One of the `HELD` chunks taken, if one is left."""
    global _held
    with _held_lock:
        if _held >= HELD:
            return False
        _held += 1
        return True


def _unreserve() -> None:
    """A place `_reserve` took given back, its chunk never made."""
    global _held
    with _held_lock:
        _held -= 1


_clock = time.monotonic
_states: set[Ahead] = set()  # every open file's state (until it is closed), for `_reclaim_idle`
_states_lock = threading.Lock()


def _reclaim_idle(but: Ahead) -> None:
    """The chunks of every file but `but` that has not read for `IDLE` seconds dropped."""
    with _states_lock:
        states = list(_states)
    now = _clock()
    for state in states:
        if state is not but:
            state.reclaim(now)


class _Chunk:
    """Bytes [lo, lo + size) of `op` (view bytes [at, at + size)), computed
    into a buffer of its own; freed (its buffer and its place among the
    `HELD` given back) once dropped, its computation over and no read
    copying out of it."""

    def __init__(self, span: Computed):
        self.op, self.lo, self.size, self.at = span.op, span.lo, span.size, span.at
        self.buf = take(span.size)
        self.future: Future = Future()
        self.taken = 0  # bytes of it copied out by reads
        self._readers = 0  # reads copying out of it now
        self._dropped = False
        self._freed = False

    @property
    def end(self) -> int:
        return self.at + self.size

    def compute(self, compute: Compute, blob: BlobFile) -> None:
        compute(blob, self.op, self.lo, self.buf.data[: self.size])

    def pin(self) -> None:
        """A read will copy out of it: not freed before `unpin`."""
        with _held_lock:
            self._readers += 1

    def unpin(self) -> None:
        with _held_lock:
            self._readers -= 1
        self._free()

    def drop(self) -> None:
        """Never computed if not started; freed once its computation is over
        and no read copies out of it."""
        self.future.cancel()
        with _held_lock:
            self._dropped = True
        self.future.add_done_callback(lambda _: self._free())

    def _free(self) -> None:
        global _held
        with _held_lock:
            if self._freed or not self._dropped or self._readers or not self.future.done():
                return
            self._freed = True
            _held -= 1
        give(self.buf)


class Ahead:
    """One open file's ranges computed ahead (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._own: BlobFile | None = None  # the workers' descriptor
        self._running = 0  # chunks whose computation is not over
        self._closed = False
        self._chunks: list[_Chunk] = []
        self._later: dict[Hashable, tuple[int, Future]] = {}  # op-cache chunks given to the workers: at, future
        self._end: int | None = None  # where the reads so far ended (the furthest)
        self._planned = 0  # the view's chunks before this offset are planned
        self._last = _clock()  # when it last read
        with _states_lock:
            _states.add(self)

    def __len__(self) -> int:
        """Chunks held or being computed for this file."""
        with self._lock:
            return len(self._chunks)

    @property
    def running(self) -> int:
        """This file's computations given to the workers and not over."""
        with self._lock:
            return self._running

    def fill(self, span: Computed, out: memoryview, compute: Compute, blob: BlobFile) -> None:
        """Bytes of `span` into `out` (its size): from the chunks that hold
        them (waited for when being computed), the rest, and those of a chunk
        whose computation failed, computed here with `compute` through `blob`."""
        lo, hi = span.lo, span.lo + span.size
        with self._lock:
            self._last = _clock()
            mine = sorted(
                (c for c in self._chunks if c.op is span.op and c.lo < hi and c.lo + c.size > lo), key=lambda c: c.lo
            )
            for c in mine:
                c.pin()
        try:
            self._fill(span, mine, out, compute, blob)
        finally:
            for c in mine:
                c.unpin()

    def _fill(self, span: Computed, mine: list[_Chunk], out: memoryview, compute: Compute, blob: BlobFile) -> None:
        """`fill` with the chunks that overlap the span, pinned."""
        lo, hi = span.lo, span.lo + span.size
        at = lo
        for c in mine:
            if c.lo > at:
                compute(blob, span.op, at, out[at - lo : c.lo - lo])
            s, e = max(at, c.lo), min(hi, c.lo + c.size)
            if (
                c.future.cancel() or c.future.exception() is not None
            ):  # not started: computed here, without waiting for a worker
                self._forget(c)
                compute(blob, span.op, s, out[s - lo : e - lo])
            else:
                out[s - lo : e - lo] = c.buf.data[s - c.lo : e - c.lo]
                with self._lock:
                    c.taken += e - s
                    done = c.taken >= c.size
                if done:
                    self._forget(c)
            at = e
        if at < hi:
            compute(blob, span.op, at, out[at - lo :])

    def advance(
        self,
        blob: BlobFile,
        offset: int,
        size: int,
        upcoming: Callable[[int, int], Iterable[Computed | Later]],
        compute: Compute,
    ) -> None:
        """A read of view bytes [offset, offset + size) through `blob` is
        done: when it continues the reads before (it starts within `WINDOW`
        of where they ended), what `upcoming(start, size)` lays out in the
        next `WINDOW` bytes is given to the workers, while this file's and the
        global bounds allow (the idle files' chunks reclaimed when the global
        one is reached): the spans of ranged ops chunk by chunk, and up to
        `LATER` chunks of ops the op cache holds; otherwise this file's chunks
        are dropped (and its op-cache chunks not started never computed).
        Never raises for want of a descriptor, memory or a thread: what could
        not be had is not computed ahead (and planned again by the next read)."""
        if held() >= HELD:
            _reclaim_idle(but=self)
        end = offset + size
        drop: list[_Chunk] = []
        cancel: list[Future] = []
        tasks: list[tuple[Callable[[], None], Future]] = []
        with self._lock:
            if self._closed:
                return
            self._last = _clock()
            if self._end is None or not self._end - WINDOW <= offset <= self._end + WINDOW:
                drop, self._chunks = self._chunks, []
                cancel = [f for _, f in self._later.values()]
                self._later.clear()
                self._end, self._planned = end, end
            else:
                self._end = max(self._end, end)
                drop = [c for c in self._chunks if c.end <= offset - WINDOW]
                self._chunks = [c for c in self._chunks if c.end > offset - WINDOW]
                for key, (at, f) in list(self._later.items()):
                    if at <= offset - WINDOW:
                        cancel.append(f)
                        del self._later[key]
                start, stop = max(self._planned, self._end), self._end + WINDOW
                if start < stop and self._descriptor(blob):
                    tasks = self._plan(upcoming(start, stop - start), stop, compute)
        for c in drop:
            c.drop()
        for f in cancel:
            f.cancel()
        self._submit(tasks)

    def _descriptor(self, blob: BlobFile) -> bool:
        """Whether the workers have a descriptor of the file (a duplicate of
        `blob`'s made now if not; none to be had is logged: nothing is planned).
        The lock is held."""
        if self._own is None:
            try:
                self._own = blob.duplicate()
            except (GGUFError, OSError, MemoryError) as e:
                log.debug("not computing ahead of %s: %s", getattr(blob, "path", blob), e)
                return False
        return True

    def _submit(self, tasks: list[tuple[Callable[[], None], Future]]) -> None:
        """The planned calls given to the workers; those the pool could not
        take (no thread to be started) cancelled, their chunks dropped."""
        for i, (fn, future) in enumerate(tasks):
            try:
                _pool.submit(fn, future)
            except (RuntimeError, MemoryError) as e:
                log.debug("not computing ahead: %s", e)
                left = {id(f) for _, f in tasks[i:]}
                with self._lock:
                    dropped = [c for c in self._chunks if id(c.future) in left]
                    self._chunks = [c for c in self._chunks if id(c.future) not in left]
                    for key, (_, f) in list(self._later.items()):
                        if id(f) in left:
                            del self._later[key]
                for _, f in tasks[i:]:
                    f.cancel()
                for c in dropped:
                    c.drop()
                return

    def reclaim(self, now: float) -> None:
        """This file's chunks dropped if it has not read for `IDLE` seconds
        before `now` (its next read starts afresh, as after a jump)."""
        with self._lock:
            if now - self._last < IDLE or not (self._chunks or self._later):
                return
            drop, self._chunks = self._chunks, []
            cancel = [f for _, f in self._later.values()]
            self._later.clear()
            self._end = None
        for c in drop:
            c.drop()
        for f in cancel:
            f.cancel()

    def _plan(
        self, upcoming: Iterable[Computed | Later], stop: int, compute: Compute
    ) -> list[tuple[Callable[[], None], Future]]:
        """The workers' calls and their futures for `upcoming`: chunks (at
        most `CHUNK` view bytes each, cut where the view is cut in `CHUNK`s)
        of its spans and its op-cache chunks, while the bounds allow;
        `_planned` moved past what was planned (the lock is held)."""
        tasks: list[tuple[Callable[[], None], Future]] = []
        self._planned = stop
        for item in upcoming:
            if isinstance(item, Later):
                if item.key in self._later:
                    continue
                if sum(not f.done() for _, f in self._later.values()) >= LATER:
                    self._planned = item.at
                    return tasks
                future: Future = Future()
                self._track(future)
                self._later[item.key] = (item.at, future)
                tasks.append((self._task(item.run), future))
                continue
            at = item.at
            while at < item.at + item.size:
                if len(self._chunks) >= PER_FILE or not _reserve():
                    self._planned = at
                    return tasks
                n = min(item.at + item.size, (at // CHUNK + 1) * CHUNK) - at
                try:
                    chunk = _Chunk(item.clip(at, at + n))
                except (OSError, MemoryError) as e:  # no memory for its buffer
                    _unreserve()
                    log.debug("not computing ahead: %s", e)
                    self._planned = at
                    return tasks
                self._track(chunk.future)
                self._chunks.append(chunk)
                tasks.append((self._task(partial(chunk.compute, compute)), chunk.future))
                at += n
        return tasks

    def _track(self, future: Future) -> None:
        """A computation to be given to the workers: the workers' descriptor
        stays open until it is over (the lock is held)."""
        self._running += 1
        future.add_done_callback(self._over)

    def _task(self, fn: Callable[[BlobFile], object]) -> Callable[[], None]:
        """The worker's call of `fn` with the workers' descriptor."""

        def run() -> None:
            own = self._own
            if own is None:
                raise GGUFError("a chunk computed after its file was closed")
            fn(own)

        return run

    def _over(self, _: Future) -> None:
        """A chunk's computation is over (done, failed or cancelled)."""
        with self._lock:
            self._running -= 1
            last = self._closed and not self._running
        if last:
            self._close_own()

    def _forget(self, chunk: _Chunk) -> None:
        with self._lock:
            if chunk in self._chunks:
                self._chunks.remove(chunk)
        chunk.drop()

    def close(self) -> None:
        """Every chunk dropped; the workers' descriptor closed once none uses it."""
        with _states_lock:
            _states.discard(self)
        with self._lock:
            self._closed = True
            drop, self._chunks = self._chunks, []
            cancel = [f for _, f in self._later.values()]
            self._later.clear()
        for c in drop:
            c.drop()
        for f in cancel:
            f.cancel()
        with self._lock:
            idle = not self._running
        if idle:
            self._close_own()

    def _close_own(self) -> None:
        with self._lock:
            own, self._own = self._own, None
        if own is not None:
            own.close()


def of(blob: BlobFile) -> Ahead | None:
    """The open file's `Ahead` (made on its first read, closed when the file
    is), or None without workers."""
    if not enabled:
        return None
    return blob.owned(Ahead, Ahead)
