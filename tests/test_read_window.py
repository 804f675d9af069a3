"""Blob bytes read with O_DIRECT into memory where they do not lie as in the
blob (an mmproj view's tensors, behind a header of another size): a read
that continues the one before reads the next read's blocks too, in one
O_DIRECT read, and that next read is answered from them (`files.window`);
the same bytes as the blob holds, whatever the order or overlap of reads."""

from __future__ import annotations

import ctypes
import os
import random
import threading

import numpy as np
import pytest

from compatfs.errors import GGUFError
from compatfs.files import blobfile, window
from compatfs.files.blobfile import ALIGN, BlobFile
from compatfs.files.libc import LIBC, PAGE, malloc_aligned

from test_read_once import data, direct  # noqa: F401  (a fixture and a helper of the same kind of test)

MiB = 1 << 20
SKEW = 1234  # where the reads start: not where a block of the blob starts


def reply_buffer(size: int) -> tuple[int, memoryview]:
    """Page-aligned memory as the mount's replies have it (so the blob's bytes
    at SKEW do not lie in it as in the blob): its address and a view of it."""
    mem = malloc_aligned(size, PAGE)
    assert mem
    return mem, memoryview((ctypes.c_char * size).from_address(mem)).cast("B")


def counting_direct_reads(f: BlobFile, monkeypatch) -> list[int]:
    """The sizes of the reads of `f`'s O_DIRECT descriptor from now on."""
    fd = f._direct_fd()
    seen: list[int] = []
    preadv = os.preadv

    def counted(d, buffers, offset, *rest):
        if d == fd:
            seen.append(sum(len(b) for b in buffers))
        return preadv(d, buffers, offset, *rest)

    monkeypatch.setattr(os, "preadv", counted)
    return seen


def test_sequential_reads_after_the_second_wait_for_no_read_of_their_own(data, monkeypatch):  # noqa: F811
    path, raw = data
    with direct(path) as f:
        reads = counting_direct_reads(f, monkeypatch)
        mem, out = reply_buffer(MiB)
        try:
            pieces = 0
            for offset in range(SKEW, len(raw) - MiB, MiB):
                f.read_once_into(out, offset)
                assert out == raw[offset : offset + MiB], offset
                pieces += 1
            if not f._owned[blobfile._WINDOW]._context():
                pytest.skip("the kernel gives no asynchronous I/O")
        finally:
            LIBC.free(mem)
    assert pieces == 4
    assert len(reads) == 2, reads  # the first two; the rest were read ahead of them


def test_a_reader_gone_elsewhere_is_read_ahead_there(tmp_path, monkeypatch):
    raw = np.random.default_rng(11).integers(0, 256, 12 * MiB, dtype=np.uint8).tobytes()
    path = tmp_path / "blob"
    path.write_bytes(raw)
    with direct(path) as f:
        reads = counting_direct_reads(f, monkeypatch)
        mem, out = reply_buffer(MiB)
        try:
            for offset in (SKEW, SKEW + MiB, 6 * MiB + SKEW, 7 * MiB + SKEW, 8 * MiB + SKEW):
                f.read_once_into(out, offset)
                assert out == raw[offset : offset + MiB], offset
            if not f._owned[blobfile._WINDOW]._context():
                pytest.skip("the kernel gives no asynchronous I/O")
        finally:
            LIBC.free(mem)
    assert len(reads) == 4, reads  # two at each place; the third at 8 MiB was read ahead of it


def test_reads_out_of_order_and_to_the_end_give_the_blobs_bytes(data):  # noqa: F811
    path, raw = data
    rng = random.Random(5)
    with direct(path) as f:
        mem, out = reply_buffer(MiB)
        try:
            offsets = list(range(SKEW, len(raw), MiB // 2))
            for offset in offsets + offsets[::-1] + rng.sample(offsets, len(offsets)):
                size = min(MiB, len(raw) - offset)
                f.read_once_into(out[:size], offset)
                assert out[:size] == raw[offset : offset + size], offset
            for _ in range(50):
                offset = rng.randrange(0, len(raw) - blobfile.DIRECT_MIN)
                size = rng.randrange(blobfile.DIRECT_MIN, min(MiB, len(raw) - offset) + 1)
                f.read_once_into(out[:size], offset)
                assert out[:size] == raw[offset : offset + size], (offset, size)
        finally:
            LIBC.free(mem)


def test_a_read_past_the_end_after_held_blocks_names_the_file(data):  # noqa: F811
    path, raw = data
    with direct(path) as f:
        mem, out = reply_buffer(MiB)
        try:
            start = len(raw) - 2 * MiB - ALIGN + SKEW
            f.read_once_into(out, start)
            f.read_once_into(out, start + MiB)  # the blocks up to the end are read ahead of the next
            with pytest.raises(GGUFError, match=str(path)):
                f.read_once_into(out, start + 2 * MiB)
        finally:
            LIBC.free(mem)


def side_by_side(f: BlobFile, raw: bytes, offsets: list[int], size: int, threads: int) -> list[int]:
    """`size` bytes at each of `offsets` read through `f` by `threads` threads
    taking the next offset in turn, as the kernel sends a file's read-ahead
    (the next pieces asked while one is read): the offsets whose bytes came wrong."""
    wrong: list[int] = []
    left = list(offsets)
    lock = threading.Lock()

    def reader() -> None:
        mem, out = reply_buffer(size)
        try:
            while True:
                with lock:
                    if not left:
                        return
                    offset = left.pop(0)
                f.read_once_into(out, offset)
                if out != raw[offset : offset + size]:
                    wrong.append(offset)
        finally:
            LIBC.free(mem)

    running = [threading.Thread(target=reader) for _ in range(threads)]
    for t in running:
        t.start()
    for t in running:
        t.join()
    return wrong


def test_reads_side_by_side_give_the_blobs_bytes(data):  # noqa: F811
    path, raw = data
    with direct(path) as f:
        for size in (64 << 10, 256 << 10, MiB):
            for threads in (2, 4):
                assert not side_by_side(f, raw, list(range(SKEW, len(raw) - size, size)), size, threads)


def test_a_closed_file_gives_every_buffer_back(data, monkeypatch):  # noqa: F811
    path, raw = data
    outstanding: list[int] = []
    take, give = window.take, window.give

    def taken(n: int):
        outstanding.append(1)
        return take(n)

    def given(buf) -> None:
        outstanding.append(-1)
        give(buf)

    monkeypatch.setattr(window, "take", taken)
    monkeypatch.setattr(window, "give", given)
    f = direct(path)
    mem, out = reply_buffer(MiB)
    try:
        for offset in (SKEW, SKEW + MiB, SKEW + 2 * MiB):
            f.read_once_into(out, offset)
            assert out == raw[offset : offset + MiB]
    finally:
        LIBC.free(mem)
    assert sum(outstanding) > 0  # the blocks held, and those read ahead
    f.close()
    assert sum(outstanding) == 0
