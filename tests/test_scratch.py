"""compatfs.files.scratch: buffers for one read, page-aligned, reused, never shared."""

from __future__ import annotations

import mmap

import pytest

from compatfs.files import scratch as pool
from compatfs.files.scratch import KEEP, scratch


@pytest.fixture(autouse=True)
def empty_pool(monkeypatch):
    monkeypatch.setattr(pool, "_spare", [])


def test_a_buffer_is_page_aligned_and_large_enough():
    for n in (1, 4096, 100_000, (1 << 20) + 8192):
        with scratch(n) as buf:
            assert len(buf) >= n
            assert buf.ctypes.data % mmap.PAGESIZE == 0
            buf[n - 1] = 7  # writable to its last byte


def test_a_buffer_given_back_serves_the_next_read():
    with scratch(300_000) as first:
        at = first.ctypes.data
    with scratch(200_000) as again:
        assert again.ctypes.data == at
    with scratch(600_000) as larger:
        assert larger.ctypes.data != at  # too small to serve it


def test_buffers_in_use_at_once_are_distinct():
    with scratch(1 << 16) as a, scratch(1 << 16) as b, scratch(1 << 16) as c:
        starts = {a.ctypes.data, b.ctypes.data, c.ctypes.data}
    assert len(starts) == 3


def test_at_most_keep_buffers_wait():
    held = [scratch(1 << 16) for _ in range(KEEP + 5)]
    for h in held:
        h.__enter__()
    for h in held:
        h.__exit__(None, None, None)
    assert len(pool._spare) <= KEEP
