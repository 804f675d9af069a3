import threading
import time

from compatfs.opcache import OpCache


def test_byte_budget_keeps_several_and_evicts_least_recent():
    cache, calls = OpCache(max_bytes=25), []
    get = lambda k: cache.get(k, lambda: calls.append(k) or bytes(10))
    for k in "abab":
        get(k)
    assert calls == ["a", "b"]
    get("c")            # 30 bytes would exceed 25: "a" goes
    get("b")
    get("a")
    assert calls == ["a", "b", "c", "a"]
    assert cache.bytes_held <= 25
    assert cache.computations == 4


def test_a_tensor_over_the_budget_is_computed_each_time():
    cache, calls = OpCache(max_bytes=5), []
    for _ in range(3):
        assert cache.get("big", lambda: calls.append(1) or bytes(10)) == bytes(10)
    assert len(calls) == 3 and cache.bytes_held == 0


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
        time.sleep(0.2)
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
        try:
            cache.get("k", boom)
        except ValueError:
            pass
    assert cache.get("k", lambda: b"ok") == b"ok"
