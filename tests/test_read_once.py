"""Blob bytes read once on their way to the mount's own page cache
(`BlobFile.read_once_into`): with O_DIRECT where the blob is cold, so that a
model read through the mount is cached once, not twice; through the page
cache where the blob is mostly cached already; the same bytes either way."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from compatfs.view import assemble
from compatfs.files.blobfile import ALIGN, DIRECT_MIN, BlobFile
from compatfs.format.header import SourceGGUF
from compatfs.errors import GGUFError
from compatfs.files.libc import cached_pages, pages
from compatfs.translate.ops import Promote
from compatfs.testing.store import add_model
from compatfs.view.segments import Computed, Segments

from conftest import needs_fuse
from ggufs import write_gguf

MiB = 1 << 20


def evicted(path: Path) -> Path:
    """`path` written out and its pages dropped from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return path


def cached(path: Path) -> int:
    """How many of `path`'s pages the page cache holds (skips where the kernel cannot tell)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        n = cached_pages(fd, 0, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    if n is None:
        pytest.skip("the kernel does not tell what the page cache holds (cachestat, Linux 6.5)")
    return n


@pytest.fixture
def data(tmp_path) -> tuple[Path, bytes]:
    raw = np.random.default_rng(7).integers(0, 256, 5 * MiB + 123, dtype=np.uint8).tobytes()
    path = tmp_path / "blob"
    path.write_bytes(raw)
    return path, raw


def direct(path: Path) -> BlobFile:
    f = BlobFile(evicted(path))
    cached(path)  # skips where the kernel cannot tell
    if not f.reads_directly:
        f.close()
        pytest.skip(f"{path.parent}'s filesystem gives no O_DIRECT descriptor")
    return f


RANGES = [
    (0, DIRECT_MIN),
    (1, DIRECT_MIN + 1),
    (ALIGN - 1, MiB + 5),  # crosses a block boundary at both ends
    (3 * ALIGN, 2 * MiB + 17),  # longer than the aligned buffer: read in turns
    (5 * MiB + 123 - 70_000, 70_000),  # up to the file's last byte, which ends mid-block
    (5, 100),  # under DIRECT_MIN: through the page cache
]


def test_read_once_gives_the_same_bytes_as_read_into(data):
    path, raw = data
    with direct(path) as f:
        for offset, size in RANGES:
            out = bytearray(size)
            f.read_once_into(memoryview(out), offset)
            assert out == raw[offset : offset + size], (offset, size)


def test_a_cold_file_read_once_stays_out_of_the_page_cache(data):
    path, raw = data
    with direct(path) as f:
        out = bytearray(len(raw) - 4096)
        f.read_once_into(memoryview(out), 4096)
        assert out == raw[4096:]
    assert cached(path) == 0


def test_a_mostly_cached_file_is_read_through_the_page_cache(data):
    path, raw = data
    assert path.read_bytes() == raw  # now in the page cache
    if cached(path) * 2 < pages(0, len(raw)):
        pytest.skip("the page cache did not keep the file just read")
    with BlobFile(path) as f:
        assert not f.reads_directly
        out = bytearray(2 * MiB)
        f.read_once_into(memoryview(out), 12345)
        assert out == raw[12345 : 12345 + 2 * MiB]


def test_a_read_past_the_end_names_the_file(data):
    path, raw = data
    with direct(path) as f, pytest.raises(GGUFError, match=str(path)):
        f.read_once_into(memoryview(bytearray(MiB)), len(raw) - MiB // 2)


def test_a_duplicate_decides_for_itself_and_reads_the_same_bytes(data):
    path, raw = data
    with direct(path) as f:
        again = f.duplicate()
        f.close()
        out = bytearray(MiB)
        again.read_once_into(memoryview(out), 777)
        assert out == raw[777 : 777 + MiB]
        again.close()


@needs_fuse
def test_a_model_read_through_the_mount_is_not_cached_twice(tmp_path, mount_store):
    # A GGUF no handler claims (served as it is), holding one tensor of 32 MiB.
    weights = np.random.default_rng(3).standard_normal(8 * MiB, dtype=np.float32)
    blob_file = write_gguf(tmp_path / "big.gguf", "llama", {"llama.block_count": 1}, {"token_embd.weight": weights})
    store = tmp_path / "store"
    add_model(store, "big", blob_file)
    blob = next((store / "blobs").iterdir())
    m = mount_store(store)
    served = m / "big:latest" / "model.gguf"
    assert served.stat().st_size == blob.stat().st_size
    evicted(blob)
    before = cached(blob)
    assert served.read_bytes() == blob_file.read_bytes()
    # The daemon parsed the header (through the page cache) before; the
    # tensor's 32 MiB went straight to the mount's own page cache.
    assert cached(blob) - before < pages(0, 4 * MiB), m.log_text()


def test_a_filesystem_that_refuses_direct_reads_is_read_through_the_page_cache(data, monkeypatch):
    path, raw = data
    with direct(path) as f:
        refused = f._direct
        real = os.preadv

        def preadv(fd, buffers, offset, *flags):
            if fd == refused:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real(fd, buffers, offset, *flags)

        monkeypatch.setattr(os, "preadv", preadv)
        for offset, size in RANGES[:3]:
            out = bytearray(size)
            f.read_once_into(memoryview(out), offset)
            assert out == raw[offset : offset + size]
        assert not f.reads_directly


def test_an_op_that_reads_its_inputs_once_leaves_them_out_of_the_page_cache(tmp_path):
    weights = np.random.default_rng(5).standard_normal(1 << 20).astype(np.float16)  # 2 MiB
    path = write_gguf(tmp_path / "f16.gguf", "llama", {}, {"w": weights})
    op = Promote.of(SourceGGUF(path).tensors["w"])
    assert op.reads_inputs_once

    one_op = Segments([Computed(0, op.nbytes, 0, op)], op.nbytes)  # a view of the op's bytes alone
    with direct(path) as f:
        out = bytearray(op.nbytes)
        assemble.fill(one_op, f, 0, memoryview(out))
    assert np.array_equal(np.frombuffer(out, np.float32), weights.astype(np.float32))
    assert cached(path) == 0
