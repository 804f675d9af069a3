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
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from compatfs.fuse import libfuse, pagecache, rescan
from compatfs.fuse.operations import CompatFS
from compatfs.handlers.gptoss import OllamaMXFP4
from compatfs.names import MODEL_FILE
from compatfs.translate import accel
from compatfs.view import ahead, assemble
from compatfs.view.catalog import BlobViews
from compatfs.view.segments import Computed, InRounds
from compatfs.testing import llama
from compatfs.testing.store import add_model
from conftest import needs_fuse, wait_until
from test_read_gate import _served

MiB = 1 << 20
pytestmark = pytest.mark.usefixtures("nothing_ahead")  # every range computed by the read that needs it


def halves(view) -> list:
    return [s for s in view.segments if isinstance(s, (InRounds, Computed)) and s.kin]


def test_the_halves_of_a_stack_are_each_other_s_kin(gptoss_layer):
    view = BlobViews().view(gptoss_layer, MODEL_FILE)
    found = halves(view)
    assert found, "halves with kin in the view"
    for seg in found:
        assert [type(k) for k in seg.kin] == [type(seg)] and seg.kin[0].size == seg.size
        assert seg.kin[0].at != seg.at and not seg.kin[0].kin
    whole = [s for s in view.segments if isinstance(s, Computed) and isinstance(s.op, OllamaMXFP4) and s.op.step == 1]
    assert all(not s.kin for s in whole), "a whole stack shares no span"


@pytest.mark.usefixtures("kernel")
def test_a_read_of_one_half_makes_the_other_s_same_range_byte_for_byte(gptoss_layer):
    view = BlobViews().view(gptoss_layer, MODEL_FILE)
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


def test_a_kin_range_not_wanted_is_not_made(gptoss_layer):
    view = BlobViews().view(gptoss_layer, MODEL_FILE)
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
def test_a_half_read_through_a_mount_puts_the_other_half_in_the_page_cache(
    gptoss_layer, tmp_path, mount_store, compiled
):
    if compiled and accel.native is None:
        pytest.skip("compatfs._accel is not built (or COMPATFS_NO_ACCEL)")
    store = tmp_path / "store"
    add_model(store, "oss", gptoss_layer, tag="1b")
    m = mount_store(store, "-o", "debug", env={"COMPATFS_NO_ACCEL": "0" if compiled else "1"})
    if "pages stored ahead of their readers" not in m.log_text():
        pytest.skip(f"libfuse {libfuse.libfuse_version()}'s session: no node ids, nothing stored")
    view = BlobViews().view(gptoss_layer, MODEL_FILE)
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
    m.close()
    if compiled:  # (the read gate's: its reads of the first half, from a plan made at the open, made the pages)
        assert _served(m.log.read_text()) >= first.size // MiB


@pytest.fixture
def in_process(tmp_path, monkeypatch, store_fs):
    """A CompatFS, in process, whose rescan thread runs with a stand-in FUSE
    session and looks at the store once an hour; every open learns node 7;
    every store the kernel would be sent is recorded with the thread that
    sent it."""
    monkeypatch.setattr(libfuse, "invalidate_path", lambda session, path: 0)
    monkeypatch.setattr(pagecache, "opening_node", lambda: 7)
    monkeypatch.setattr(rescan.Rescan, "LOOK_SECONDS", 3600.0)  # a store is sent at once, never at the next look
    sent: list[tuple[str, int, int, bytes]] = []

    def notify(self, session, node, offset, mem, size) -> None:
        sent.append((threading.current_thread().name, node, offset, ctypes.string_at(mem, size)))

    monkeypatch.setattr(pagecache.PageStores, "_notify", notify)
    store = tmp_path / "store"
    add_model(store, "text", llama.plain_llama_text(tmp_path / "t.gguf"), tag="1b")
    fs = store_fs(store)
    fs._rescan.start(1)  # a session never dereferenced: the sends are recorded
    yield fs, sent
    fs._rescan.stop()


def _open(fs: CompatFS, path: str) -> int:
    fi = SimpleNamespace(flags=os.O_RDONLY, keep_cache=0, fh=0)
    assert fs.open(path, fi) == 0
    return fi.fh


def _gathered(fs: CompatFS, fh: int, at: int, size: int) -> pagecache.Gathered:
    """Pages of view bytes [at, at + size) of open file `fh`, filled as a read would fill its kin's."""
    opened = fs._paths.get(fh)
    assert opened is not None
    kin = fs._rescan.pages.gather(fh, opened)
    assert kin is not None
    out = kin.into(at, size)
    assert out is not None
    assemble.fill(opened.view.segments, opened.file, at, out)
    kin.complete(lambda offset, buf: assemble.fill_aside(opened.view.segments, opened.file, offset, buf))
    return kin


def test_stores_are_whole_pages_sent_by_the_rescan_thread_while_the_file_is_open(in_process):
    fs, sent = in_process
    path = "/text:1b/model.gguf"
    fh = _open(fs, path)
    opened = fs._paths.get(fh)
    view, f = opened.view, opened.file
    _gathered(fs, fh, 5000, 3000).queue()
    wait_until(lambda: sent, what="a store sent")
    assert sent == [("compatfs-rescan", 7, 4096, view.read(4096, 4096, f))]  # the whole page it lies in
    last = view.size - 10
    _gathered(fs, fh, last, 10).queue()  # the file's last page: up to its end, never past it
    wait_until(lambda: len(sent) == 2, what="the last page sent")
    assert sent[1] == ("compatfs-rescan", 7, last - last % 4096, view.read(last - last % 4096, 4096, f))
    kin = _gathered(fs, fh, 0, 100)
    fs.release(path, SimpleNamespace(fh=fh))
    kin.queue()  # made for a file released since: dropped
    fs._rescan.invalidate(set(), wait=5)  # (a wake that looks: everything queued before is handled)
    assert len(sent) == 2, sent
    assert fs._rescan.pages.gather(fh, opened) is None


def test_stores_are_bounded_and_never_wait(in_process):
    fs, sent = in_process
    path = "/text:1b/model.gguf"
    fh = _open(fs, path)
    opened = fs._paths.get(fh)
    pages = pagecache.PageStores(lambda: None, limit=3 * 4096)
    pages.opened(fh, opened, 7)
    kin = pages.gather(fh, opened)
    assert kin is not None
    assert kin.into(0, 8192) is not None
    assert kin.into(8192, 8192) is None  # over the limit: not made
    kin.drop()
    assert kin.into(8192, 8192) is not None  # (the memory given back)
    kin.drop()
    fs.release(path, SimpleNamespace(fh=fh))


def test_readers_that_keep_storing_never_hold_the_rescan_thread_from_invalidating(in_process, monkeypatch):
    fs, sent = in_process
    path = "/text:1b/model.gguf"
    fh = _open(fs, path)
    invalidated: list[str] = []
    monkeypatch.setattr(libfuse, "invalidate_path", lambda session, p: invalidated.append(p) or 0)
    notify = pagecache.PageStores._notify

    def refill(self, session, *store) -> None:  # every store sent, another queued: a reader that never stops
        notify(self, session, *store)
        _gathered(fs, fh, 0, 4096).queue()

    monkeypatch.setattr(pagecache.PageStores, "_notify", refill)
    _gathered(fs, fh, 0, 4096).queue()
    wait_until(lambda: len(sent) > 3, what="stores sent")
    fs._rescan.invalidate({path}, wait=5)
    assert path in invalidated
    monkeypatch.setattr(pagecache.PageStores, "_notify", notify)
    fs.release(path, SimpleNamespace(fh=fh))


def test_the_pages_around_a_kin_range_are_no_read_for_the_file_s_ahead(gptoss_layer, monkeypatch):
    monkeypatch.setattr(ahead, "enabled", True)
    advanced: list[int] = []
    monkeypatch.setattr(ahead.Ahead, "advance", lambda self, blob, offset, *rest: advanced.append(offset))
    view = BlobViews().view(gptoss_layer, MODEL_FILE)
    seg = max(halves(view), key=lambda s: s.size)
    with view.open() as f:
        out = bytearray(4096)
        assemble.fill_aside(view.segments, f, seg.at, memoryview(out))
        assert not advanced
        assert bytes(out) == view.read(seg.at, 4096, f)
        assert advanced == [seg.at]  # (a reader's read is)


def test_a_store_made_before_its_blob_changed_is_never_sent(in_process):
    fs, sent = in_process
    path = "/text:1b/model.gguf"
    fh = _open(fs, path)
    opened = fs._paths.get(fh)
    kin = _gathered(fs, fh, 0, 4096)
    with open(opened.file.path, "ab") as blob:  # rewritten under the open file: its view's bytes are no more
        blob.write(b"\0")
    kin.queue()
    fs._rescan.invalidate(set(), wait=5)  # (a wake that looks: everything queued before is handled)
    assert not sent, sent
    fs.release(path, SimpleNamespace(fh=fh))
