"""Computing ahead (compatfs.view.ahead) is best effort: it never fails a
read.  What its bookkeeping needs after a read's bytes are filled -- a
descriptor for the workers, memory for a chunk, a worker thread -- is done
without when the system cannot give it, the read keeps its bytes and no
place among the chunks held is lost; a chunk whose computation failed for a
fault of the system is computed again by the read; and the chunks of a file
that stays open but stopped reading are reclaimed for a file that reads."""

from __future__ import annotations

import errno
import threading

import pytest

from compatfs.files.blobfile import BlobFile

from compatfs.files.lookup import Transient
from compatfs.names import MODEL_FILE
from compatfs.translate import accel
from compatfs.view import ahead, pool
from compatfs.view.catalog import BlobViews
from compatfs.view.segments import Computed
from compatfs.testing import widths

from conftest import wait_until
from test_ahead import Blob, Op, compute, read, upcoming

MiB = 1 << 20


@pytest.fixture(autouse=True)
def two_workers(monkeypatch):
    """Two ahead workers, whatever the machine's default (none on two cores)."""
    monkeypatch.setattr(ahead, "_pool", pool.Pool(2))
    monkeypatch.setattr(ahead, "WORKERS", 2)
    monkeypatch.setattr(ahead, "enabled", True)


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    """One gpt-oss-120b layer in the type-4 MXFP4 form, 2 experts."""
    path = tmp_path_factory.mktemp("ahead-best-effort") / "gptoss-mxfp4.gguf"
    return widths.write_blob(widths.gptoss_blob(ollama_mxfp4=True, n_expert=2), path)


@pytest.fixture(scope="module")
def reference(blob) -> bytes:
    """The whole text view, computed by the reads alone (ahead off)."""
    view = BlobViews().view(blob, MODEL_FILE)
    was, ahead.enabled = ahead.enabled, False
    try:
        return view.read(0, view.size)
    finally:
        ahead.enabled = was


@pytest.fixture
def numpy_kernel(monkeypatch):
    """The repack on numpy's kernel (computed ahead; the compiled one's is not)."""
    monkeypatch.setattr(accel, "native", None)


def read_through(blob) -> bytes:
    """The text view of `blob` read from start to end in 1 MiB reads through one open blob."""
    view = BlobViews().view(blob, MODEL_FILE)
    out = bytearray()
    with view.open() as f:
        for at in range(0, view.size, MiB):
            out += view.read(at, MiB, f)
    return bytes(out)


def settled() -> None:
    wait_until(lambda: ahead.held() == 0, 10, what="every chunk to be given back")


def test_no_descriptor_for_the_workers_fails_no_read(blob, reference, numpy_kernel, monkeypatch):
    def emfile(self):
        raise Transient(f"{self.path}: cannot open: {errno.errorcode[errno.EMFILE]}")

    monkeypatch.setattr(BlobFile, "duplicate", emfile)
    assert read_through(blob) == reference
    settled()


def test_no_memory_for_a_chunk_fails_no_read(blob, reference, numpy_kernel, monkeypatch):
    def no_memory(nbytes):
        raise MemoryError(f"no {nbytes} bytes")

    monkeypatch.setattr(ahead, "take", no_memory)
    assert read_through(blob) == reference
    assert ahead.held() == 0


def test_no_worker_thread_fails_no_read(blob, reference, numpy_kernel, monkeypatch):
    def cannot_start(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", cannot_start)
    assert read_through(blob) == reference
    settled()


def test_a_chunk_that_failed_for_the_system_is_computed_again_by_the_read():
    op, blob = Op(32 * MiB), Blob()
    state = ahead.Ahead()

    def failing_on_workers(b, o, lo, out):
        if threading.current_thread().name.startswith("compatfs-ahead"):
            raise Transient("cannot read: Cannot allocate memory")
        compute(b, o, lo, out)

    def read_with(at: int) -> bytes:
        out = bytearray(MiB)
        state.fill(Computed(at, MiB, at, op), memoryview(out), failing_on_workers, blob)  # type: ignore[arg-type]
        state.advance(blob, at, MiB, upcoming(op), failing_on_workers)  # type: ignore[arg-type]
        return bytes(out)

    read_with(0)
    read_with(MiB)
    wait_until(lambda: state.running == 0, 10, what="the chunks computed ahead to fail")
    for at in range(2 * MiB, 12 * MiB, MiB):
        assert read_with(at) == op.bytes(at, at + MiB)
    state.close()
    settled()


def test_the_chunks_of_a_file_that_stopped_reading_are_reclaimed(monkeypatch):
    settled()  # (no other test's chunks held)
    now = [1000.0]
    monkeypatch.setattr(ahead, "_clock", lambda: now[0], raising=False)
    monkeypatch.setattr(ahead, "HELD", ahead.PER_FILE)
    blob = Blob()
    idle_op, busy_op = Op(64 * MiB), Op(64 * MiB, seed=5)
    idle, busy = ahead.Ahead(), ahead.Ahead()
    for at in range(0, 2 * MiB, MiB):
        read(idle, blob, idle_op, at, MiB)  # every place taken by the file that then stops
    assert len(idle) == ahead.PER_FILE
    wait_until(lambda: idle.running == 0, 10, what="the idle file's chunks to be computed")
    now[0] += ahead.IDLE / 2
    for at in range(0, 2 * MiB, MiB):
        read(busy, blob, busy_op, at, MiB)
    assert len(busy) == 0  # not idle long enough: its chunks are kept
    now[0] += ahead.IDLE
    for at in range(2 * MiB, 4 * MiB, MiB):
        read(busy, blob, busy_op, at, MiB)
    assert len(idle) == 0 and len(busy) > 0
    before = [lo for lo, _, who in busy_op.computed if who.startswith("compatfs-ahead")]
    for at in range(4 * MiB, 12 * MiB, MiB):
        assert read(busy, blob, busy_op, at, MiB) == busy_op.bytes(at, at + MiB)
    on_workers = [lo for lo, _, who in busy_op.computed if who.startswith("compatfs-ahead")]
    assert len(on_workers) > len(before)
    assert read(idle, blob, idle_op, 2 * MiB, MiB) == idle_op.bytes(2 * MiB, 3 * MiB)  # it reads on
    idle.close()
    busy.close()
    settled()
