"""Blob bytes read once on their way to the mount's own page cache
(`BlobFile.read_once_into`): through the page cache, and where the blob was
cold its pages given back behind the reads (`BlobFile.passed`), so that a
model read through the mount is cached once, not twice; a blob mostly
cached already is left as it is; the same bytes either way."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from compatfs.view import assemble
from compatfs.files import blobfile
from compatfs.files.blobfile import DROP_LAG, DROP_UNIT, BlobFile
from compatfs.format.header import SourceGGUF
from compatfs.errors import GGUFError
from compatfs.files.libc import cached_pages, pages
from compatfs.translate.ops import Promote
from compatfs.testing.store import add_model
from compatfs.view.segments import Computed, Segments

from conftest import needs_fuse
from ggufs import write_gguf

MiB = 1 << 20
LAG, UNIT = 8 * MiB, 2 * MiB  # the drop's lag and blocks in these tests (a page cache folio is 2 MiB at most here)


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
def small_drops(monkeypatch):
    """Pages given back `LAG` bytes behind the reads, in `UNIT` blocks."""
    monkeypatch.setattr(blobfile, "DROP_LAG", LAG)
    monkeypatch.setattr(blobfile, "DROP_UNIT", UNIT)


@pytest.fixture
def data(tmp_path) -> tuple[Path, bytes]:
    raw = np.random.default_rng(7).integers(0, 256, 40 * MiB + 123, dtype=np.uint8).tobytes()
    path = tmp_path / "blob"
    path.write_bytes(raw)
    return path, raw


def cold(path: Path) -> BlobFile:
    """`path` out of the page cache, opened: it drops behind."""
    f = BlobFile(evicted(path))
    if cached(path) * 2 >= pages(0, path.stat().st_size):
        f.close()
        pytest.skip(f"{path.parent}'s filesystem keeps the file in memory")
    assert f.drops_behind
    return f


RANGES = [
    (0, 100),
    (1, 64 << 10),
    (4095, MiB + 5),  # crosses a page boundary at both ends
    (3 * 4096, 12 * MiB + 17),  # longer than the lag: gives back pages of its own
    (40 * MiB + 123 - 70_000, 70_000),  # up to the file's last byte, which ends mid-page
    (5, 100),  # behind what was given back: read again from the disk
]


def test_read_once_gives_the_same_bytes_as_read_into(data, small_drops):
    path, raw = data
    with cold(path) as f:
        for offset, size in RANGES:
            out = bytearray(size)
            f.read_once_into(memoryview(out), offset)
            assert out == raw[offset : offset + size], (offset, size)


def test_a_cold_file_read_once_is_given_back_behind_the_reads(data, small_drops):
    path, raw = data
    with cold(path) as f:
        for offset in range(4096, len(raw), MiB):
            out = bytearray(min(MiB, len(raw) - offset))
            f.read_once_into(memoryview(out), offset)
            assert out == raw[offset : offset + len(out)]
        # What is left is the lag behind the last read, and the block it ends in.
        assert cached_pages(f.fd, 0, 30 * MiB) == 0
        assert cached(path) <= pages(0, LAG + UNIT)


def test_a_read_gives_back_the_blocks_that_end_in_it_moved_the_lag_back(data, small_drops):
    path, raw = data
    with cold(path) as f:
        fd, out = f.fd, bytearray(MiB)
        with open(path, "rb") as g:
            g.read(30 * MiB)  # pages another reader brought in
        if cached_pages(fd, 0, 30 * MiB) < pages(0, 30 * MiB):
            pytest.skip("the page cache did not keep the file just read")
        f.read_once_into(memoryview(out), 39 * MiB)  # the block [30, 32) MiB ends in [31, 32) MiB
        assert out == raw[39 * MiB : 40 * MiB]
        assert cached_pages(fd, 0, 30 * MiB) == pages(0, 30 * MiB)
        assert cached_pages(fd, 30 * MiB, UNIT) == 0
        f.read_once_into(memoryview(out), 20 * MiB + 5)  # no block ends in [12, 13) MiB
        assert cached_pages(fd, 0, 30 * MiB) == pages(0, 30 * MiB)
        f.read_once_into(memoryview(out), 21 * MiB + 5)  # [12, 14) MiB ends in [13, 14) MiB
        assert out == raw[21 * MiB + 5 : 22 * MiB + 5]
        assert cached_pages(fd, 12 * MiB, UNIT) == 0
        assert cached_pages(fd, 0, 12 * MiB) == pages(0, 12 * MiB)
        assert cached_pages(fd, 14 * MiB, 16 * MiB) == pages(0, 16 * MiB)


def test_a_mostly_cached_file_is_left_as_it_is(data, small_drops):
    path, raw = data
    assert path.read_bytes() == raw  # now in the page cache
    if cached(path) * 2 < pages(0, len(raw)):
        pytest.skip("the page cache did not keep the file just read")
    before = cached(path)
    with BlobFile(path) as f:
        assert not f.drops_behind
        for offset in range(0, len(raw), MiB):
            out = bytearray(min(MiB, len(raw) - offset))
            f.read_once_into(memoryview(out), offset)
            assert out == raw[offset : offset + len(out)]
    assert cached(path) >= before


def test_a_read_past_the_end_names_the_file(data):
    path, raw = data
    with BlobFile(path) as f, pytest.raises(GGUFError, match=str(path)):
        f.read_once_into(memoryview(bytearray(MiB)), len(raw) - MiB // 2)


def test_a_duplicate_decides_for_itself_and_reads_the_same_bytes(data, small_drops):
    path, raw = data
    with cold(path) as f:
        again = f.duplicate()
        f.close()
        path.read_bytes()  # cached once the duplicate decides
        if cached(path) * 2 < pages(0, len(raw)):
            pytest.skip("the page cache did not keep the file just read")
        out = bytearray(MiB)
        again.read_once_into(memoryview(out), 777)
        assert out == raw[777 : 777 + MiB]
        assert not again.drops_behind
        again.close()


@needs_fuse
def test_a_model_read_through_the_mount_is_not_cached_twice(tmp_path, mount_store):
    # A GGUF no handler claims (served as it is), holding one tensor of 160 MiB.
    weights = np.random.default_rng(3).standard_normal(40 * MiB, dtype=np.float32)
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
    # The daemon parsed the header (through the page cache) before; of the
    # tensor's 160 MiB, the blob's page cache keeps the lag behind the last
    # reads and the block it ends in.
    assert cached(blob) - before <= pages(0, DROP_LAG + 2 * DROP_UNIT), m.log_text()


def test_an_op_that_reads_its_inputs_once_gives_them_back(tmp_path, small_drops):
    weights = np.random.default_rng(5).standard_normal(12 * MiB).astype(np.float16)  # 24 MiB
    path = write_gguf(tmp_path / "f16.gguf", "llama", {}, {"w": weights})
    op = Promote.of(SourceGGUF(path).tensors["w"])
    assert op.reads_inputs_once

    one_op = Segments([Computed(0, op.nbytes, 0, op)], op.nbytes)  # a view of the op's bytes alone
    with cold(path) as f:
        out = bytearray(op.nbytes)
        assemble.fill(one_op, f, 0, memoryview(out))
    assert np.array_equal(np.frombuffer(out, np.float32), weights.astype(np.float32))
    assert cached(path) <= pages(0, LAG + UNIT)
