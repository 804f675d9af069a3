"""Pages of the mount's files put in the kernel's page cache before they
are read: a read of an op tensor's range makes its kin's same range from
the same read of the blob (`assemble.fill`'s `kin_into`: the halves of a
fused stack), and those bytes are handed to the kernel as pages of the file
(`fuse_lowlevel_notify_store`); a reader of the kin then finds them cached
and sends no READ for them.  A store is only ever an optimisation: whatever
fails drops it, never the read that made it.

- The node id of an open file: the session's low-level open is wrapped
  (`learn_nodes`) so that the Python open learns the node it opens
  (`opening_node`, on the same thread); without the session's expected
  layout (another libfuse) nothing is learnt and nothing stored.
- A store is whole pages of the file (the kernel keeps no part of a page;
  the file's last page may end with it), never beyond its size (the kernel
  would grow the file): the pages a kin range cuts are completed with the
  view's own bytes around it (`Gathered.complete`).
- Reads the C read gate answers make their kin's pages themselves
  (`readgate`: a copy of the rows, or an MXFP4 half, of an interleaved
  stack), whole pages within the kin, queued in C under the same limit (of
  its own) and sent here as these are; the gate wakes the sending thread
  through `gate_wakes`'s descriptor.
- Stores are queued (at most `QUEUED_BYTES`, buffers being filled included;
  beyond that a kin range is not made) in memory mapped apart from malloc's
  heaps (and as much again kept for the next ones: the daemon's memory
  stays bounded, and a reused buffer costs no page faults), and sent by
  the rescan thread, the only sender of kernel notifications, before the
  invalidations it sends in the same wake: a store is sent only while the
  file whose read made it is open and its path still serves that file's
  view from an intact blob (`PageStores.send`'s `serves`), checked and sent
  under a lock that the open and the release of a file take too, so that
  no open or release reply slips between.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from ..files.libc import PAGE, map_memory, unmap_memory
from . import libfuse, readgate
from .paths import OpenFile

log = logging.getLogger(__name__)

QUEUED_BYTES = 16 << 20  # bytes of stores queued or being made, at most (and of spare memory for them)
_MAPPED = 256 << 10  # store memory is mapped in multiples of this (a spare one then fits the next)

_opening = threading.local()  # the node the low-level open being answered on this thread opens


def learn_nodes(ptr: int, mountpoint: str) -> str:
    """Have opens of session `ptr` (mounted at `mountpoint`) learn the node
    they open (`opening_node`): its low-level open wrapped, where the
    session is laid out as expected (`libfuse.session_ops`); call while no
    request but INIT is answered.  Returns the line to log."""
    ops = libfuse.session_ops(ptr, mountpoint)
    if ops is None:
        return f"kin op tensors' pages not stored (libfuse {libfuse.libfuse_version()}'s session is not as expected)"

    def open_(original, req, ino, llfi) -> None:
        _opening.node = ino
        try:
            original(req, ino, llfi)
        finally:
            _opening.node = None

    libfuse.wrap_op(ops, libfuse.OP_OPEN, open_)
    return "kin op tensors' pages stored ahead of their readers"


def opening_node() -> int | None:
    """The node id of the file the open being answered on this thread opens (None: not learnt)."""
    return getattr(_opening, "node", None)


class _Store(NamedTuple):
    """`size` bytes at `mem` (mapped), the pages from `offset` of the view open file `fh` (`opened`) reads."""

    fh: int
    opened: OpenFile
    offset: int
    mem: int
    size: int


class PageStores:
    """The stores of the mount's open files, queued for the rescan thread."""

    def __init__(self, wake: Callable[[], None], limit: int = QUEUED_BYTES):
        self._wake = wake  # wakes the thread that sends them
        self._limit = limit
        self._lock = threading.Lock()  # guards the queue and the bytes taken
        self._sending = threading.Lock()  # held while a store is checked and sent, and by opens and releases
        self._open: dict[int, tuple[OpenFile, int]] = {}  # fh -> the open file and its node
        self._queue: deque[_Store] = deque()
        self._taken = 0  # bytes of stores queued or being made
        self._mapped: dict[int, int] = {}  # the memory mapped for stores (in use or spare): its size
        self._spare: list[tuple[int, int]] = []  # memory of stores sent, kept for the next ones
        self._spared = 0  # bytes of `_spare`
        self.sent = 0  # stores the kernel took
        self.refused = 0  # kin ranges not made: the queue was full

    # -- open files ------------------------------------------------------------
    def opened(self, fh: int, opened: OpenFile | None, node: int | None) -> None:
        """Open file `fh` (`opened`) reads node `node` (None: not known, nothing stored for it)."""
        with self._sending:
            if opened is not None and node is not None:
                self._open[fh] = (opened, node)

    def closed(self, fh: int) -> None:
        """Open file `fh` is being released: none of its stores is sent from now on."""
        with self._sending:
            self._open.pop(fh, None)

    def storing(self, fh: int) -> bool:
        """Whether pages are stored for open file `fh` (its node is known)."""
        return fh in self._open

    def gate_wakes(self, fd: int | None) -> None:
        """Have the read gate make kin pages, within the same limit, and write
        to eventfd `fd` as it queues them (None: none made from now on)."""
        readgate.stores_wake(-1 if fd is None else fd, self._limit if fd is not None else 0)

    def gather(self, fh: int, opened: OpenFile) -> Gathered | None:
        """What a read of open file `fh` gathers its kin's pages into (None: nothing is stored for it)."""
        entry = self._open.get(fh)
        if entry is None or entry[0] is not opened:
            return None
        return Gathered(self, fh, opened)

    # -- the queue ---------------------------------------------------------------
    def take(self, size: int) -> int:
        """Page-aligned memory of at least `size` bytes counted against the
        limit (0: over it, or no memory): a spare one, else newly mapped."""
        with self._lock:
            if self._taken + size > self._limit:
                self.refused += 1
                return 0
            self._taken += size
            fits = [i for i, (_, mapped) in enumerate(self._spare) if mapped >= size]
            if fits:
                mem, mapped = self._spare.pop(min(fits, key=lambda i: self._spare[i][1]))
                self._spared -= mapped
                return mem
        mapped = -(-size // _MAPPED) * _MAPPED
        mem = map_memory(mapped)
        with self._lock:
            if mem:
                self._mapped[mem] = mapped
            else:
                self._taken -= size
        return mem

    def give(self, mem: int, size: int) -> None:
        """Memory from `take` given back (`mem` 0: none), its `size` bytes no
        longer counted: kept for the next store while the spares stay within the limit."""
        with self._lock:
            self._taken -= size
            if not mem:
                return
            mapped = self._mapped[mem]
            if self._spared + mapped <= self._limit:
                self._spare.append((mem, mapped))
                self._spared += mapped
                return
            del self._mapped[mem]
        unmap_memory(mem, mapped)

    def enqueue(self, stores: list[_Store]) -> None:
        """Queue `stores` and wake the thread that sends them."""
        with self._lock:
            self._queue.extend(stores)
        self._wake()

    def send(self, session: int | None, serves: Callable[[OpenFile], bool]) -> None:
        """Send the stores queued when called, the read gate's then these
        (by the rescan thread only; those queued meanwhile wait for the next
        call, so that readers that keep queueing never hold the thread from
        its other work): each while its file is open and `serves(file)` (its
        path serves its view from an intact blob); the others dropped."""
        for fh, offset, mem, size in readgate.stores():
            try:
                self._send(session, serves, fh, None, offset, mem, size)
            finally:
                readgate.store_free(mem, size)
        with self._lock:
            count = len(self._queue)
        for _ in range(count):
            with self._lock:
                if not self._queue:  # (cleared meanwhile)
                    return
                store = self._queue.popleft()
            try:
                self._send(session, serves, store.fh, store.opened, store.offset, store.mem, store.size)
            finally:
                self.give(store.mem, store.size)

    def _send(
        self,
        session: int | None,
        serves: Callable[[OpenFile], bool],
        fh: int,
        made_for: OpenFile | None,
        offset: int,
        mem: int,
        size: int,
    ) -> None:
        """Send one store of open file `fh` (made for the open file
        `made_for`; None: for fh's, an fh being never reused) while fh is
        that file, open, and `serves(file)`; a failure logged, never raised."""
        try:
            with self._sending:
                entry = self._open.get(fh)
                if session and entry is not None and (made_for is None or made_for is entry[0]) and serves(entry[0]):
                    self._notify(session, entry[1], offset, mem, size)
        except Exception:  # an optimisation: never the rescan thread's end
            log.exception("a store of open file %d failed", fh)

    def _notify(self, session: int, node: int, offset: int, mem: int, size: int) -> None:
        if libfuse.notify_store(session, node, offset, mem, size):
            self.sent += 1

    def clear(self) -> None:
        """Drop every store queued (nothing is sent any more), the read gate's
        too, and unmap the spare memory."""
        self.gate_wakes(None)
        for _, _, mem, size in readgate.stores():
            readgate.store_free(mem, size)
        with self._lock:
            stores, self._queue = list(self._queue), deque()
        for store in stores:
            self.give(store.mem, store.size)
        with self._lock:
            spare, self._spare, self._spared = self._spare, [], 0
            for mem, _ in spare:
                del self._mapped[mem]
        for mem, mapped in spare:
            unmap_memory(mem, mapped)


class Gathered:
    """The kin pages one read of an open file makes: `into` is its
    `kin_into`; once the read's bytes are in, `complete` fills the pages'
    bytes around each kin range, and `queue` hands them to the rescan
    thread (or `drop` frees them)."""

    def __init__(self, stores: PageStores, fh: int, opened: OpenFile):
        self._stores, self._fh, self._opened = stores, fh, opened
        self._made: list[tuple[int, int, int, int, int]] = []  # first page, its bytes, memory, kin range at, size

    def into(self, at: int, size: int) -> memoryview | None:
        """Where view bytes [at, at + size) go: inside the whole pages they
        lie in (the file's end the last page's end); None when the queue is full."""
        first = at - at % PAGE
        end = min(-(-(at + size) // PAGE) * PAGE, self._opened.view.size)
        if size <= 0 or end < at + size:
            return None
        mem = self._stores.take(end - first)
        if not mem:
            return None
        self._made.append((first, end - first, mem, at, size))
        return memoryview((ctypes.c_char * size).from_address(mem + at - first)).cast("B")

    def complete(self, fill: Callable[[int, memoryview], None]) -> None:
        """Fill each page range's bytes before and after its kin range with
        `fill(offset, out)` (the view's bytes); a range whose fill fails is dropped."""
        kept = []
        for first, size, mem, at, n in self._made:
            whole = memoryview((ctypes.c_char * size).from_address(mem)).cast("B")
            try:
                if at > first:
                    fill(first, whole[: at - first])
                if at + n < first + size:
                    fill(at + n, whole[at + n - first :])
            except Exception as e:  # a store is an optimisation: the read itself is answered
                log.debug("kin pages of %s at %d not stored: %s", self._opened.path, first, e)
                self._stores.give(mem, size)
            else:
                kept.append((first, size, mem, at, n))
        self._made = kept

    def queue(self) -> None:
        """Hand the pages to the rescan thread to send."""
        made, self._made = self._made, []
        if made:
            self._stores.enqueue([_Store(self._fh, self._opened, first, mem, size) for first, size, mem, _, _ in made])

    def drop(self) -> None:
        """Free the pages (the read failed)."""
        made, self._made = self._made, []
        for _, size, mem, _, _ in made:
            self._stores.give(mem, size)
