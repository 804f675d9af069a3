"""Op tensors made from one input span (gpt-oss's fused gate and up halves,
strided runs; its type-4 MXFP4 halves, repacked by range): a read of one
half's range makes the other half's same range from the same read of the
blob (`assemble.fill`'s `kin_into`), the same bytes as a read of that range,
with the compiled kernels and without; through a mount, those bytes go
straight into the kernel's page cache of the file (`fuse_lowlevel_notify_store`,
sent by the rescan thread), so a reader of the other half finds them there
and sends no READ for them."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pytest

from compatfs.fuse import libfuse
from compatfs.handlers.gptoss import OllamaMXFP4
from compatfs.names import MODEL_FILE
from compatfs.translate import accel
from compatfs.view import ahead, assemble
from compatfs.view.catalog import BlobViews
from compatfs.view.segments import Computed, InRounds
from compatfs.testing import widths
from compatfs.testing.store import add_model
from conftest import needs_fuse, wait_until

MiB = 1 << 20


@pytest.fixture(autouse=True)
def nothing_ahead(monkeypatch):
    """Every range computed by the read that needs it."""
    monkeypatch.setattr(ahead, "enabled", False)


@pytest.fixture(scope="module", params=["fused", "mxfp4"])
def blob(request, tmp_path_factory) -> Path:
    """One gpt-oss-120b layer (rows as wide as the published model's, 2 experts) in the fused or type-4 form."""
    path = tmp_path_factory.mktemp("kin") / f"gptoss-{request.param}.gguf"
    return widths.write_blob(widths.gptoss_blob(ollama_mxfp4=request.param == "mxfp4", n_expert=2), path)


def halves(view) -> list:
    return [s for s in view.segments if isinstance(s, (InRounds, Computed)) and s.kin]


def test_the_halves_of_a_stack_are_each_other_s_kin(blob):
    view = BlobViews().view(blob, MODEL_FILE)
    found = halves(view)
    assert found, "halves with kin in the view"
    for seg in found:
        assert [type(k) for k in seg.kin] == [type(seg)] and seg.kin[0].size == seg.size
        assert seg.kin[0].at != seg.at and not seg.kin[0].kin
    whole = [s for s in view.segments if isinstance(s, Computed) and isinstance(s.op, OllamaMXFP4) and s.op.step == 1]
    assert all(not s.kin for s in whole), "a whole stack shares no span"


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
def test_a_read_of_one_half_makes_the_other_s_same_range_byte_for_byte(blob, compiled, monkeypatch):
    if compiled and accel.native is None:
        pytest.skip("compatfs._accel is not built (or COMPATFS_NO_ACCEL)")
    if not compiled:
        monkeypatch.setattr(accel, "native", None)
    view = BlobViews().view(blob, MODEL_FILE)
    with view.open() as f:
        reference = b"".join(view.read(at, MiB, f) for at in range(0, view.size, MiB))
        for seg in halves(view):
            kin = seg.kin[0]
            for lo, size in ((0, MiB), (seg.size // 3 + 1529, MiB + 3), (seg.size - 70_001, 70_001), (17, 1)):
                lo = max(0, lo)
                size = min(size, seg.size - lo)
                made: dict[int, bytearray] = {}

                def into(at: int, n: int, made: dict[int, bytearray] = made) -> memoryview:
                    made[at] = bytearray(n)
                    return memoryview(made[at])

                out = bytearray(size)
                assemble.fill(view.segments, f, seg.at + lo, memoryview(out), into)
                assert bytes(out) == reference[seg.at + lo : seg.at + lo + size], (seg.at, lo)
                assert list(made) == [kin.at + lo], (seg.at, lo, list(made))
                assert bytes(made[kin.at + lo]) == reference[kin.at + lo : kin.at + lo + size], (seg.at, lo)


def test_a_kin_range_not_wanted_is_not_made(blob):
    view = BlobViews().view(blob, MODEL_FILE)
    seg = max(halves(view), key=lambda s: s.size)
    asked: list[tuple[int, int]] = []
    with view.open() as f:
        out = bytearray(MiB)
        assemble.fill(view.segments, f, seg.at + 5, memoryview(out), lambda at, n: asked.append((at, n)))
        assert bytes(out) == view.read(seg.at + 5, MiB, f)
    assert asked == [(seg.kin[0].at + 5, MiB)]


def _resident(path: Path, offset: int, size: int) -> bool:
    """Whether every page of `path`'s bytes [offset, offset + size) is in the
    kernel's page cache (mincore of a mapping of it: nothing is read)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 4
    libc.mmap.argtypes.append(ctypes.c_long)
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    first = offset - offset % mmap.PAGESIZE
    length = offset + size - first
    fd = os.open(path, os.O_RDONLY)
    try:
        at = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, first)
        if at in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        try:
            pages = ctypes.create_string_buffer(-(-length // mmap.PAGESIZE))
            if libc.mincore(at, length, pages):
                raise OSError(ctypes.get_errno(), "mincore")
            return all(b & 1 for b in pages.raw)
        finally:
            libc.munmap(at, length)
    finally:
        os.close(fd)


def _reads(log: str) -> list[tuple[int, int]]:
    """The READ requests libfuse's debug lines name: (offset, size)."""
    out = []
    for line in log.splitlines():
        if line.startswith("read[") and " bytes from " in line:
            size, rest = line.split("] ", 1)[1].split(" bytes from ")
            out.append((int(rest.split()[0]), int(size)))
    return out


@needs_fuse
@pytest.mark.parametrize("compiled", [True, False], ids=["accel", "no-accel"])
def test_a_half_read_through_a_mount_puts_the_other_half_in_the_page_cache(blob, tmp_path, mount_store, compiled):
    if compiled and accel.native is None:
        pytest.skip("compatfs._accel is not built (or COMPATFS_NO_ACCEL)")
    store = tmp_path / "store"
    add_model(store, "oss", blob, tag="1b")
    m = mount_store(store, "-o", "debug", env={"COMPATFS_NO_ACCEL": "0" if compiled else "1"})
    if "pages stored ahead of their readers" not in m.log_text():
        pytest.skip(f"libfuse {libfuse.libfuse_version()}'s session: no node ids, nothing stored")
    view = BlobViews().view(blob, MODEL_FILE)
    first = max((s for s in halves(view) if s.at < s.kin[0].at), key=lambda s: s.size)
    kin = first.kin[0]
    with view.open() as f:
        reference = {s.at: view.read(s.at, s.size, f) for s in (first, kin)}
    path = m / "oss:1b" / MODEL_FILE
    assert not _resident(path, kin.at, kin.size)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = b"".join(
            os.pread(fd, min(MiB, first.at + first.size - at), at) for at in range(first.at, first.at + first.size, MiB)
        )
        assert got == reference[first.at]
        wait_until(lambda: _resident(path, kin.at, kin.size), what="the other half's pages in the page cache")
        before = len(m.log_text())
        got = b"".join(
            os.pread(fd, min(MiB, kin.at + kin.size - at), at) for at in range(kin.at, kin.at + kin.size, MiB)
        )
        assert got == reference[kin.at]
        asked = [(at, n) for at, n in _reads(m.log_text()[before:]) if at < kin.at + kin.size and at + n > kin.at]
        assert not asked, asked  # every byte of the other half came from the page cache
    finally:
        os.close(fd)
