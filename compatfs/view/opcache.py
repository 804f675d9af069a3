"""The op cache: op tensors (or chunks of them) computed once, in bounded memory.

Only ops that need more than the range a reader asks for land here: a
permutation, computed block by block in chunks of a few MiB, and the few ops
computed whole (a resampled position table, a frame of a patch embedding).
Ops that move bytes are served from the blob by arithmetic, and elementwise
ops compute just the range a reader asks for (see `ops`).

Results are kept in an LRU bounded in bytes (`--op-cache-mb`, default 256
MiB).  A result larger than that whole budget is kept apart, in a slot for
the last `LARGE_KEPT` such results, so that reading one through (or two side
by side) costs one computation each, not one per read.  Each result is
computed once at a time (its other readers wait for the computation under
way) and at most `COMPUTING` computations run at once (others wait their
turn), so op tensors take at most: the budget, plus the results in the
slot, plus `COMPUTING` computations in flight, each about three times what
it computes (its input, its output, numpy's temporaries).  Nothing else waits for them: a computation holds no lock that
listings, `stat` or reads of other files need.  (Ops computed per requested
range never come here: each read in flight takes a few times its own size.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

from cachetools import LRUCache

DEFAULT_MB = 256
COMPUTING = 2  # computations at once
LARGE_KEPT = 2  # results larger than the budget kept


class OpCache:
    def __init__(self, max_bytes: int = DEFAULT_MB << 20, computing: int = COMPUTING):
        self.max_bytes = max_bytes
        self._lru: LRUCache = LRUCache(maxsize=max(max_bytes, 1), getsizeof=len)
        self._large: LRUCache = LRUCache(maxsize=LARGE_KEPT)  # the last results too large for the LRU
        self._pending: dict[Hashable, threading.Event] = {}  # computations under way, set when done
        self._lock = threading.Lock()
        self._turns = threading.Semaphore(computing)
        self._computations = 0

    def get(self, key: Hashable, compute: Callable[[], bytes]) -> bytes:
        """The bytes for `key`, computed with `compute()` unless kept; one
        computation of a key at a time, and at most `COMPUTING` at once."""
        while True:
            with self._lock:
                hit = self._lru.get(key)
                if hit is None:
                    hit = self._large.get(key)
                if hit is not None:
                    return hit
                done = self._pending.get(key)
                if done is None:
                    done = self._pending[key] = threading.Event()
                    break
            done.wait()  # then kept, or failed: computed here next
        try:
            with self._turns:
                data = compute()
            with self._lock:
                self._computations += 1
                if len(data) <= self.max_bytes:
                    self._lru[key] = data
                else:
                    self._large[key] = data
        finally:
            with self._lock:
                del self._pending[key]
            done.set()
        return data

    @property
    def computations(self) -> int:
        """How many results were computed (misses)."""
        with self._lock:
            return self._computations

    @property
    def bytes_held(self) -> int:
        """Bytes of results kept: the LRU's and the slot's."""
        with self._lock:
            return int(self._lru.currsize) + sum(map(len, self._large.values()))
