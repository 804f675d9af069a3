import threading
import time

from compatfs.view.opcache import OpCache

from conftest import wait_until
import contextlib


def test_byte_budget_keeps_several_and_evicts_least_recent():
    cache, calls = OpCache(max_bytes=25), []
    get = lambda k: cache.get(k, lambda: calls.append(k) or bytes(10))
    for k in "abab":
        get(k)
    assert calls == ["a", "b"]
    get("c")  # 30 bytes would exceed 25: "a" goes
    get("b")
    get("a")
    assert calls == ["a", "b", "c", "a"]
    assert cache.bytes_held <= 25
    assert cache.computations == 4


def test_results_over_the_budget_are_kept_in_their_own_slot():
    """Results larger than the whole budget are computed once while read,
    the last `LARGE_KEPT` of them kept (two read side by side: once each)."""
    from compatfs.view.opcache import LARGE_KEPT

    cache, calls = OpCache(max_bytes=5), []
    big = lambda k: cache.get(k, lambda: calls.append(k) or bytes(10))  # noqa: E731
    for _ in range(3):
        assert big("a") == bytes(10)
        assert big("b") == bytes(10)
    assert calls == ["a", "b"] and cache.bytes_held == 20 and LARGE_KEPT == 2
    big("c")  # "a" goes
    big("b")
    big("a")
    assert calls == ["a", "b", "c", "a"] and cache.bytes_held == 20
    cache.get("small", lambda: bytes(4))  # the LRU beside the slot
    assert cache.bytes_held == 24 and cache.computations == 5


def test_interleaved_readers_do_not_recompute():
    cache = OpCache(max_bytes=1 << 20)
    for _ in range(100):
        cache.get("a", lambda: bytes(1000))
        cache.get("b", lambda: bytes(1000))
    assert cache.computations == 2


def test_concurrent_readers_wait_for_one_computation():
    cache, calls = OpCache(), []
    started = threading.Event()

    def slow():
        calls.append(1)
        started.set()
        time.sleep(0.2)  # on purpose: a computation slow enough for the others to arrive during it
        return b"x" * 100

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("k", slow))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and results == [b"x" * 100] * 4


def test_a_failed_computation_is_not_cached():
    cache = OpCache()

    def boom():
        raise ValueError("bad tensor")

    for _ in range(2):
        with contextlib.suppress(ValueError):
            cache.get("k", boom)
    assert cache.get("k", lambda: b"ok") == b"ok"


def test_at_most_computing_run_at_once_and_others_are_not_held():
    """Six readers of six results: never more than `computing` computations
    at a time; a kept result is answered while they run."""
    cache = OpCache(computing=2)
    cache.get("kept", lambda: b"k")
    running, peak, lock = [0], [0], threading.Lock()

    def slow():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)  # on purpose: computations that overlap
        with lock:
            running[0] -= 1
        return b"x"

    threads = [threading.Thread(target=cache.get, args=(k, slow)) for k in range(6)]
    for t in threads:
        t.start()
    wait_until(lambda: running[0] == 2, what="two computations running")
    t0 = time.monotonic()
    assert cache.get("kept", lambda: b"recomputed") == b"k"
    assert time.monotonic() - t0 < 0.1
    for t in threads:
        t.join(timeout=10)
    assert peak[0] == 2 and cache.computations == 7
