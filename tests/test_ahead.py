"""compatfs.view.ahead: ranges of ranged ops computed ahead of a sequential reader
on worker threads.  The same bytes with it on and off (gpt-oss's type-4
MXFP4 stacks at gpt-oss-120b's widths, in-process and through the mount);
the chunks of a reader that jumps dropped, those not started never
computed; the bounds per file and over all files held; a chunk that fails
gives its error to the read that needs it and to no other file's; the
workers' descriptor closed with the file."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from compatfs.translate import accel
from compatfs.view import ahead, pool, assemble
from compatfs.errors import GGUFError
from compatfs.handlers.gptoss import OllamaMXFP4
from compatfs.testing import widths
from compatfs.testing.store import add_model
from compatfs.view.catalog import BlobViews
from compatfs.names import MODEL_FILE
from compatfs.view.segments import Computed

from conftest import fds_of, needs_fuse, wait_until

MiB = 1 << 20


@pytest.fixture(autouse=True)
def two_workers(monkeypatch):
    """Two ahead workers, whatever the machine's default (none on two cores)."""
    monkeypatch.setattr(ahead, "_pool", pool.Pool(2))
    monkeypatch.setattr(ahead, "WORKERS", 2)
    monkeypatch.setattr(ahead, "enabled", True)


@pytest.fixture(scope="module")
def blob(tmp_path_factory) -> Path:
    """One gpt-oss-120b layer in the type-4 MXFP4 form, 4 experts (rows as wide as the published model's)."""
    path = tmp_path_factory.mktemp("ahead") / "gptoss-mxfp4.gguf"
    return widths.write_blob(widths.gptoss_blob(ollama_mxfp4=True, n_expert=4), path)


@pytest.fixture(scope="module")
def reference(blob) -> bytes:
    """The whole text view, computed by the reads alone (ahead off)."""
    view = BlobViews().view(blob, MODEL_FILE)
    was, ahead.enabled = ahead.enabled, False
    try:
        return view.read(0, view.size)
    finally:
        ahead.enabled = was


def read_through(view, step: int) -> bytes:
    """The view read from start to end in reads of `step` bytes through one open blob."""
    out = bytearray()
    with view.open() as f:
        for at in range(0, view.size, step):
            out += view.read(at, step, f)
    return bytes(out)


@pytest.fixture
def numpy_kernel(monkeypatch):
    """The repack on numpy's kernel (computed ahead; the compiled one's is not)."""
    monkeypatch.setattr(accel, "native", None)


@pytest.fixture
def worker_bytes(monkeypatch):
    """Bytes of ranged ops computed on the ahead workers, counted."""
    counted = {"workers": 0, "reads": 0}
    compute = assemble._compute

    def counting(blob, op, lo, out):
        counted["workers" if threading.current_thread().name.startswith("compatfs-ahead") else "reads"] += len(out)
        compute(blob, op, lo, out)

    monkeypatch.setattr(assemble, "_compute", counting)
    return counted


@pytest.mark.parametrize("step", [MiB, 128 << 10, 300_001])
def test_a_sequential_reader_gets_the_same_bytes_computed_ahead(blob, reference, numpy_kernel, worker_bytes, step):
    view = BlobViews().view(blob, MODEL_FILE)
    assert any(isinstance(t.op, OllamaMXFP4) for t in view.spec.tensors)
    assert read_through(view, step) == reference
    ops = sum(t.op.nbytes for t in view.spec.tensors if isinstance(t.op, OllamaMXFP4))
    assert worker_bytes["workers"] > ops // 4  # much of the repack was computed ahead
    assert worker_bytes["workers"] + worker_bytes["reads"] >= ops


@pytest.mark.skipif(accel.native is None, reason="compatfs._accel is not built (or COMPATFS_NO_ACCEL)")
def test_the_compiled_repack_is_not_computed_ahead(blob, reference, worker_bytes):
    """It repacks a range about as fast as the copy out of a chunk would take."""
    view = BlobViews().view(blob, MODEL_FILE)
    assert read_through(view, MiB) == reference
    assert worker_bytes["workers"] == 0


def test_reads_one_at_a_time_compute_nothing_ahead(blob, reference, numpy_kernel, worker_bytes):
    """An in-process read opens its own blob: no read continues another."""
    view = BlobViews().view(blob, MODEL_FILE)
    assert b"".join(view.read(at, MiB) for at in range(0, view.size, MiB)) == reference
    assert worker_bytes["workers"] == 0


@needs_fuse
def test_the_mount_serves_the_same_bytes_computed_ahead(blob, reference, tmp_path, mount_store):
    store = tmp_path / "store"
    add_model(store, "gptoss", blob)
    m = mount_store(store, env={"COMPATFS_NO_ACCEL": "1", "COMPATFS_AHEAD_WORKERS": "2"})
    with open(m.path / "gptoss:latest" / "model.gguf", "rb", buffering=0) as f:
        got = bytearray()
        while chunk := f.read(MiB):
            got += chunk
    assert bytes(got) == reference


# -- the bookkeeping, with a stand-in op and blob ---------------------------------------------


class Blob:
    """A stand-in for an open BlobFile: what Ahead asks of one."""

    def __init__(self, closed: list | None = None):
        self.fd = 3
        self.closed = closed if closed is not None else []

    def duplicate(self) -> Blob:
        return Blob(self.closed)

    def close(self) -> None:
        self.closed.append(self)


class Op:
    """A ranged op whose byte i is (i * 7 + seed) % 251; computations
    recorded, held at `gate` while it is clear, failing at `bad`."""

    def __init__(self, nbytes: int, seed: int = 0, bad: int | None = None):
        self.nbytes, self.seed, self.bad = nbytes, seed, bad
        self.gate = threading.Event()
        self.gate.set()
        self.computed: list[tuple[int, int, str]] = []
        self.lock = threading.Lock()

    def bytes(self, lo: int, hi: int) -> bytes:
        return ((np.arange(lo, hi, dtype=np.int64) * 7 + self.seed) % 251).astype(np.uint8).tobytes()


def compute(blob, op: Op, lo: int, out: memoryview) -> None:
    with op.lock:
        op.computed.append((lo, len(out), threading.current_thread().name))
    assert op.gate.wait(10)
    if op.bad is not None and lo <= op.bad < lo + len(out):
        raise GGUFError(f"bad data at {op.bad}")
    out[:] = op.bytes(lo, lo + len(out))


def upcoming(op: Op):
    """The file is the op from view offset 0."""
    return lambda at, size: [Computed(at, max(0, min(size, op.nbytes - at)), at, op)] if at < op.nbytes else []


def read(state: ahead.Ahead, blob: Blob, op: Op, at: int, size: int) -> bytes:
    out = bytearray(size)
    state.fill(Computed(at, size, at, op), memoryview(out), compute, blob)  # type: ignore[arg-type]
    state.advance(blob, at, size, upcoming(op), compute)  # type: ignore[arg-type]
    return bytes(out)


def test_chunks_serve_the_reads_that_reach_them():
    op, blob = Op(64 * MiB), Blob()
    state = ahead.Ahead()
    step = 256 << 10
    for at in range(0, 16 * MiB, step):
        assert read(state, blob, op, at, step) == op.bytes(at, at + step)
    on_workers = sum(n for _, n, who in op.computed if who.startswith("compatfs-ahead"))
    assert on_workers >= 12 * MiB
    state.close()


def test_a_reader_that_jumps_drops_its_chunks_and_those_not_started_are_never_computed():
    op, blob = Op(256 * MiB), Blob()
    state = ahead.Ahead()
    read(state, blob, op, 0, MiB)
    op.gate.clear()  # workers hold on to what they start
    out = bytearray(MiB)  # the next read computes its own range without the gate
    state.fill(Computed(MiB, MiB, MiB, op), memoryview(out), lambda b, o, lo, m: None, blob)  # type: ignore[arg-type]
    state.advance(blob, MiB, MiB, upcoming(op), compute)  # type: ignore[arg-type]
    planned = len(state)
    assert planned == ahead.PER_FILE
    wait_until(lambda: len(op.computed) >= min(ahead.WORKERS, planned), 10, what="the workers to start")
    started = len(op.computed)
    far = 200 * MiB
    state.advance(blob, far, MiB, upcoming(op), compute)  # type: ignore[arg-type]  (a jump)
    assert len(state) == 0
    op.gate.set()
    wait_until(lambda: ahead.held() == 0, 10, what="the dropped chunks to be freed")
    assert len(op.computed) == started  # the chunks not started never were
    assert read(state, blob, op, far, MiB) == op.bytes(far, far + MiB)
    state.close()


def test_the_bounds_per_file_and_over_all_files_hold(monkeypatch):
    monkeypatch.setattr(ahead, "HELD", 10)
    seen = {"held": 0, "file": 0}
    states = [ahead.Ahead() for _ in range(4)]

    def sampling(blob, op, lo, out):
        seen["held"] = max(seen["held"], ahead.held())
        seen["file"] = max(seen["file"], *(len(s) for s in states))
        compute(blob, op, lo, out)

    ops = [Op(64 * MiB, seed=i) for i in range(4)]
    blob = Blob()

    def reader(i: int) -> None:
        for at in range(0, 24 * MiB, 512 << 10):
            out = bytearray(512 << 10)
            states[i].fill(Computed(at, len(out), at, ops[i]), memoryview(out), sampling, blob)  # type: ignore[arg-type]
            states[i].advance(blob, at, len(out), upcoming(ops[i]), sampling)  # type: ignore[arg-type]
            assert bytes(out) == ops[i].bytes(at, at + len(out))
            assert ahead.held() <= 10

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 0 < seen["held"] <= 10 and 0 < seen["file"] <= ahead.PER_FILE
    for s in states:
        s.close()
    wait_until(lambda: ahead.held() == 0, 10, what="every chunk to be freed")


def test_a_chunk_a_read_copies_out_of_is_freed_only_after_it():
    """A chunk dropped (the file's reader jumped elsewhere) while another
    read of the file copies out of it keeps its buffer until that read is done."""
    op = Op(4 * MiB)
    assert ahead._reserve()
    chunk = ahead._Chunk(Computed(0, MiB, 0, op))
    chunk.future.set_result(None)
    chunk.pin()
    chunk.drop()
    assert ahead.held() == 1  # not given back under the read
    chunk.unpin()
    assert ahead.held() == 0


def test_a_failing_chunk_fails_the_read_that_needs_it_and_no_other_file():
    bad, good = Op(64 * MiB, bad=5 * MiB + 17), Op(64 * MiB, seed=3)
    a, b = ahead.Ahead(), ahead.Ahead()
    blob = Blob()
    for at in range(0, 4 * MiB, MiB):
        read(a, blob, bad, at, MiB)
        read(b, blob, good, at, MiB)
    wait_until(
        lambda: any(
            who.startswith("compatfs-ahead") and lo <= bad.bad < lo + n  # type: ignore[operator]
            for lo, n, who in bad.computed
        ),
        10,
        what="the bad chunk to be computed ahead",
    )
    with pytest.raises(GGUFError, match="bad data"):
        read(a, blob, bad, 5 * MiB, MiB)
    for at in range(4 * MiB, 12 * MiB, MiB):
        assert read(b, blob, good, at, MiB) == good.bytes(at, at + MiB)
    assert read(a, blob, bad, 4 * MiB, MiB) == bad.bytes(4 * MiB, 5 * MiB)  # the rest of the file reads on
    a.close()
    b.close()


def test_op_cache_chunks_are_computed_ahead_a_few_at_a_time_and_dropped_on_a_jump():
    """An op computed in chunks into the op cache: its chunks in the window
    given to the workers, at most `LATER` at once; after a jump those not
    started are never computed."""
    gate = threading.Event()
    ran: list[int] = []

    def later(at: int) -> ahead.Later:
        def run(blob) -> None:
            ran.append(at)
            assert gate.wait(10)

        return ahead.Later(("op", at // MiB), at, run)

    upcoming_chunks = lambda at, size: [later(a) for a in range(at - at % MiB, at + size, MiB)]  # noqa: E731
    state, blob = ahead.Ahead(), Blob()
    state.advance(blob, 0, MiB, upcoming_chunks, compute)  # type: ignore[arg-type]
    state.advance(blob, MiB, MiB, upcoming_chunks, compute)  # type: ignore[arg-type]
    wait_until(lambda: len(ran) == min(ahead.LATER, ahead.WORKERS), 10, what="the workers to start")
    assert len(state._later) == ahead.LATER  # given to the workers: the window holds 8 chunks
    started = list(ran)
    state.advance(blob, 100 * MiB, MiB, upcoming_chunks, compute)  # type: ignore[arg-type]  (a jump)
    gate.set()
    state.advance(blob, 101 * MiB, MiB, upcoming_chunks, compute)  # type: ignore[arg-type]
    wait_until(lambda: any(at >= 100 * MiB for at in ran), 10, what="the new window's chunks")
    assert [at for at in ran if at < 100 * MiB] == started
    state.close()


def test_workers_are_the_cores_beyond_two_unless_the_environment_says(monkeypatch):
    monkeypatch.setattr(pool, "cores", lambda: 16)
    for value, want in (("", 14), ("3", 3), ("0", 0), ("many", 14), ("-1", 14)):
        monkeypatch.setenv("COMPATFS_AHEAD_WORKERS", value)
        assert pool.workers() == want, value
    monkeypatch.setattr(pool, "cores", lambda: 2)
    monkeypatch.setenv("COMPATFS_AHEAD_WORKERS", "")
    assert pool.workers() == 0


def test_the_workers_descriptor_is_closed_with_the_file(blob, numpy_kernel):
    """Closing the file closes everything it opened (its workers' duplicate
    included), while the file object itself is still referenced: no garbage
    collection is waited for."""

    def open_on_blob() -> int:
        return fds_of(blob)

    wait_until(lambda: open_on_blob() == 0, 10, what="earlier tests' descriptors to close")
    view = BlobViews().view(blob, MODEL_FILE)
    f = view.open()
    for at in range(0, view.size, MiB):
        view.read(at, MiB, f)
    assert open_on_blob() >= 2  # the file and the workers' duplicate
    f.close()
    wait_until(lambda: open_on_blob() == 0, 10, what="the workers' descriptor to close")
    assert f.fd == -1
    wait_until(lambda: ahead.held() == 0, 10, what="every chunk to be freed")


def test_a_release_closes_everything_the_open_file_opened(blob, numpy_kernel, tmp_path, monkeypatch):
    """The FUSE layer's release closes the blob file and what was computed
    ahead for it (the workers' duplicate), while the
    open file object is still referenced: nothing waits for the garbage
    collector."""
    from types import SimpleNamespace

    from compatfs.files.access import Caller
    from compatfs.fuse import libfuse
    from compatfs.fuse.operations import CompatFS
    from compatfs.sources.ollama import OllamaStore
    from compatfs.tree import Tree

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(libfuse, "caller", lambda: Caller(os.getuid(), os.getgid(), os.getpid()))
    store = tmp_path / "store"
    add_model(store, "gptoss", blob)
    (tmp_path / "mnt").mkdir()
    fs = CompatFS(Tree(OllamaStore(store), BlobViews(), rescan_seconds=3600), str(tmp_path / "mnt"))
    path = "/gptoss:latest/model.gguf"
    fi = SimpleNamespace(flags=os.O_RDONLY, keep_cache=0, fh=0)
    assert fs.open(path, fi) == 0
    opened = fs._files.reading(fi.fh)
    stored = opened.file.path
    for at in range(0, opened.view.size, MiB):  # as read_buf fills its replies
        n = min(MiB, opened.view.size - at)
        assemble.fill(opened.view.segments, opened.file, at, memoryview(bytearray(n)))
    assert fds_of(stored) >= 2  # the file and the workers' duplicate
    fs.release(path, fi)
    wait_until(lambda: fds_of(stored) == 0, 10, what="every descriptor the open file opened to close")
    wait_until(lambda: ahead.held() == 0, 10, what="every chunk to be freed")
    assert opened.file.fd == -1 and fs.open_files == 0
