"""The op cache: tensors computed whole, bounded in bytes, each computed once.

Only ops that need their whole input land here (a permutation, a resampling,
a repacking): ops that move bytes are served from the blob, and elementwise
ops compute just the range a reader asks for (see `view`).  The cache is an
LRU bounded in bytes (`--op-cache-mb`, default 256 MiB), so readers that
interleave a few tensors do not recompute them per read; a tensor larger than
the whole budget is computed for each read that needs it.  Concurrent readers
of a tensor wait for the one computation under way: cachetools' `cached` with
a condition does that bookkeeping.
"""
from __future__ import annotations

import threading
from typing import Callable, Hashable

from cachetools import LRUCache, cached

DEFAULT_MB = 256


class OpCache:
    def __init__(self, max_bytes: int = DEFAULT_MB << 20):
        self.max_bytes = max_bytes
        self._lru: LRUCache = LRUCache(maxsize=max(max_bytes, 1), getsizeof=len)
        self._cond = threading.Condition()
        self._get = cached(self._lru, key=lambda key, compute: key, condition=self._cond, info=True)(
            lambda key, compute: compute())

    def get(self, key: Hashable, compute: Callable[[], bytes]) -> bytes:
        """The bytes for `key`, computing them with `compute()` at most once at a time."""
        return self._get(key, compute)

    @property
    def computations(self) -> int:
        """How many times a tensor was computed (cache misses)."""
        return self._get.cache_info().misses

    @property
    def bytes_held(self) -> int:
        with self._cond:
            return int(self._lru.currsize)
