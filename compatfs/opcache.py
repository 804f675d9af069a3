"""The op cache: computed tensors, bounded in bytes, computed once.

By default it is a single slot: the most recently computed tensor stays until
another one is computed.  With a byte budget (`--op-cache-mb`) older results
stay too, least recently used first out.  Concurrent readers of the same
tensor wait for the one computation under way instead of redoing it.
"""
from __future__ import annotations

import threading
from typing import Callable, Hashable

from cachetools import LRUCache


class OpCache:
    def __init__(self, max_bytes: int = 0):
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._lru: LRUCache = LRUCache(maxsize=max(max_bytes, 1), getsizeof=len)
        self._last: tuple[Hashable, bytes] | None = None
        self._pending: dict[Hashable, threading.Event] = {}

    def get(self, key: Hashable, compute: Callable[[], bytes]) -> bytes:
        """The bytes for `key`, computing them with `compute()` at most once at a time."""
        while True:
            with self._lock:
                hit = self._lookup(key)
                if hit is not None:
                    return hit
                waiting = self._pending.get(key)
                if waiting is None:
                    done = self._pending[key] = threading.Event()
                    break
            waiting.wait()
        try:
            value = compute()
            with self._lock:
                self._store(key, value)
            return value
        finally:
            with self._lock:
                del self._pending[key]
            done.set()

    def _lookup(self, key: Hashable) -> bytes | None:
        hit = self._lru.get(key)   # first, so that a hit refreshes its LRU place
        if hit is None and self._last is not None and self._last[0] == key:
            hit = self._last[1]
        return hit

    def _store(self, key: Hashable, value: bytes) -> None:
        self._last = (key, value)
        if self.max_bytes and len(value) <= self.max_bytes:
            self._lru[key] = value

    @property
    def bytes_held(self) -> int:
        """Bytes kept: the LRU plus the last result when the LRU does not hold it."""
        with self._lock:
            held = int(self._lru.currsize) if self.max_bytes else 0
            if self._last is not None and self._last[0] not in self._lru:
                held += len(self._last[1])
            return held
