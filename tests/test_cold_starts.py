"""What a cold start (llama-server's MAP_POPULATE of a mounted model) leans
on: as many read-ahead requests in flight as the daemon has workers
(`libfuse.background`, sent in the INIT reply), and blob blocks read with
O_DIRECT straight into a reply buffer that holds them as the blob does
(`BlobFile.read_once_into`), not through an aligned buffer and a copy."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from compatfs.fuse import libfuse
from compatfs.files.blobfile import ALIGN
from compatfs.files.libc import LIBC, PAGE, malloc_aligned
from compatfs.testing.store import add_model

from conftest import needs_fuse
from ggufs import write_gguf
import test_read_once
from test_read_once import direct

MiB = 1 << 20
data = test_read_once.data  # the fixture: a 5 MiB file of random bytes


@pytest.mark.parametrize(
    "options, expect",
    [
        ({"max_threads": 64, "max_idle_threads": 64}, (64, 48)),  # what the daemon sets
        ({"max_threads": "200"}, (200, 150)),  # as -o gives it
        ({"max_threads": 4}, (12, 9)),  # never below the kernel's own
        ({}, (12, 9)),  # libfuse's 10 workers
        ({"max_threads": "many"}, (12, 9)),
    ],
)
def test_requests_in_flight_follow_the_workers(options, expect):
    assert libfuse.background(options) == expect


def _connection(path: Path) -> Path:
    """The mount's folder in fusectl (skips where it is not to be seen)."""
    conn = Path("/sys/fs/fuse/connections") / str(os.minor(os.stat(path).st_dev))
    if not conn.is_dir():
        pytest.skip(f"{conn} missing: fusectl not mounted there (mount -t fusectl none {conn.parent})")
    return conn


@needs_fuse
def test_the_mount_lets_the_kernel_keep_a_request_in_flight_per_worker(tmp_path, mount_store):
    blob = write_gguf(
        tmp_path / "m.gguf", "llama", {"llama.block_count": 1}, {"token_embd.weight": np.zeros(1024, np.float32)}
    )
    store = tmp_path / "store"
    add_model(store, "m", blob)
    m = mount_store(store, "-o", "max_threads=40")
    conn = _connection(m.path)
    assert (conn / "max_background").read_text().strip() == "40", m.log_text()
    assert (conn / "congestion_threshold").read_text().strip() == "30"


def _placed(size: int, offset: int) -> memoryview:
    """A writable buffer of `size` bytes whose address is `offset` modulo ALIGN."""
    pages = mmap.mmap(-1, size + 2 * ALIGN)
    return memoryview(pages)[offset % ALIGN : offset % ALIGN + size]


def _address(buf) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


@pytest.mark.parametrize(
    "offset, size",
    [
        (0, 2 * MiB),  # whole blocks
        (ALIGN, MiB),  # a reply of a view served as the blob
        (123, 3 * MiB + 5),  # partial blocks at both ends
        (5 * MiB + 123 - 2 * MiB, 2 * MiB),  # up to the file's last byte, mid-block
    ],
)
def test_blocks_placed_as_in_the_blob_are_read_straight_into_the_buffer(data, monkeypatch, offset, size):
    path, raw = data
    out = _placed(size, offset)
    lo, hi = _address(out), _address(out) + size
    elsewhere = []  # bytes read into other buffers than `out` (the aligned one)
    real = os.preadv

    def preadv(fd, buffers, at, *flags):
        for b in buffers:
            if not lo <= _address(b) < hi:
                elsewhere.append(len(b))
        return real(fd, buffers, at, *flags)

    with direct(path) as f:
        monkeypatch.setattr(os, "preadv", preadv)
        f.read_once_into(out, offset)
    assert bytes(out) == raw[offset : offset + size]
    # Only the partial blocks at the ends go through the aligned buffer.
    ends = (offset % ALIGN != 0) + ((offset + size) % ALIGN != 0)
    assert len(elsewhere) == ends and sum(elsewhere) <= ends * 2 * ALIGN, elsewhere


def test_reply_buffers_are_page_aligned():
    mem = malloc_aligned(MiB, PAGE)
    assert mem and mem % PAGE == 0
    LIBC.free(mem)
