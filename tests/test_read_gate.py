"""Reads of open files' plain ranges answered in C (`fuse.readgate`,
`_accel.read_gate`): the gate answers a read whose bytes (and `window`
bytes past them) are all blob ranges, zeros and compiled-kernel op tensors
(a type-4 MXFP4 stack repacked) of the open file's plan, with
the bytes `BlobFile.read_once_into` reads (pread, pages given back behind
the reads or not); everything else, a file whose
status moved, a descriptor that holds another file, an inotify event queued
or taken in since the plan, a read that comes short, a forgotten plan, goes
to the Python read.  In-process
through the gate's own function (in a process of its own: the gate is the
process's), and through a mount of a real-width GLM-OCR blob: the same bytes
as in process, a rewrite under an open file EIO, a chmod read through; and
of a type-4 gpt-oss blob, whose down-projection stacks the gate repacks."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import subprocess
import sys

import pytest

from compatfs.fuse import readgate
from compatfs.names import MODEL_FILE
from compatfs.testing import widths
from compatfs.testing.fuzz import views_of
from compatfs.testing.store import add_model
from compatfs.translate import accel
from compatfs.view import assemble
from compatfs.view.ahead import WINDOW
from compatfs.view.catalog import BlobViews
from compatfs.view.segments import Computed, InRounds, Rounds

from conftest import needs_fuse
from test_hostile_mount import blob_of
from test_metadata_not_content import _drop

needs_accel = pytest.mark.skipif(accel.native is None, reason="compatfs._accel is not built")

_GATE = r"""
import ctypes, json, os, sys
import numpy as np
from compatfs.files.libc import LIBC
from compatfs.fuse.libfuse import _FuseBuf, _FuseBufvec, fuse
from compatfs.translate import accel
from compatfs.view import assemble
from compatfs.view.segments import InRounds, Rounds
n = accel.native
READ_BUF = dict(fuse.fuse_operations._fields_)["read_buf"]
path = sys.argv[1]
data = open(path, "rb").read()
fd = os.open(path, os.O_RDONLY)
calls = []
def python(p, bufpp, size, off, fip):
    calls.append(off)
    return -5
fallback = READ_BUF(python)
vec = _FuseBufvec
gated = READ_BUF(n.read_gate(ctypes.cast(fallback, ctypes.c_void_p).value, fuse.fuse_file_info.fh.offset,
    ctypes.sizeof(vec), vec.count.offset, vec.buf.offset + _FuseBuf.size.offset, vec.buf.offset + _FuseBuf.mem.offset))
MiB = 1 << 20
# A view of 3 MiB: blob bytes from 8192 (as they lie in the blob's blocks),
# zeros, blob bytes from 777 (not), then a range of no plain kind.
SEGS = [(0, MiB + 5000, 8192, 0), (MiB + 5000, 3000, 0, 1), (MiB + 8000, MiB, 777, 0)]
VIEW = 3 * MiB
want = data[8192 : 8192 + MiB + 5000] + bytes(3000) + data[777 : 777 + MiB]

def identity():
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

DROPS = 4096  # reads give back pages from this far behind them, a page at a time
def plan(fh, lag=DROPS, window=0, watch=-1, segs=SEGS, gen=None, ident=None, unit=4096, held=b"", stores=False,
         fd=fd):
    # (at, size, lo, kind), then origin, row and stride 0 and kin -1 unless given
    raw = b"".join(int(x).to_bytes(8, "little", signed=True) for s in segs for x in (*s, *(0, 0, 0, -1)[len(s) - 4:]))
    n.read_plan(fh, fd, lag, unit, ident or identity(), watch, n.read_generation() if gen is None else gen,
                raw, held, VIEW, window, stores)

def read(fh, off, size, expect=None):
    calls.clear()
    fi = fuse.fuse_file_info(fh=fh)
    out = ctypes.c_void_p()
    res = gated(b"/m", ctypes.cast(ctypes.byref(out), ctypes.POINTER(ctypes.POINTER(fuse.fuse_bufvec))), size, off,
                ctypes.pointer(fi))
    if calls:
        assert res == -5 and not out.value
        return "python"
    v = vec.from_address(out.value)
    got = ctypes.string_at(v.buf[0].mem, v.buf[0].size)
    assert v.count == 1 and v.buf[0].mem % 4096 == 0
    LIBC.free(v.buf[0].mem)
    LIBC.free(out.value)
    return "same" if got == (want if expect is None else expect)[off : off + size] else "different"

out = {}
for name, lag in (("dropped", DROPS), ("kept", -1)):
    plan(1, lag)
    out[name] = [read(1, 0, MiB), read(1, MiB, MiB), read(1, 4096, 3000), read(1, MiB + 4000, 8000),
                 read(1, 2 * MiB, MiB), read(1, VIEW, 10), n.read_planned(1)]
plan(2, window=MiB)
out["window"] = [read(2, 0, 4096), read(2, 2 * MiB - 4096, 4096)]
plan(3, segs=[(0, MiB, len(data) - 4096, 0)])
out["short"] = [read(3, 0, 8192), n.read_planned(3)]
r, w = os.pipe()
plan(4, watch=r)
out["watched"] = [read(4, 0, 4096)]
os.write(w, b"x")
out["watched"] += [read(4, 0, 4096), n.read_planned(4)]
plan(5, watch=r, gen=n.read_generation())
os.read(r, 1)
n.read_events()
out["events"] = [read(5, 0, 4096), n.read_planned(5)]
plan(6, ident=identity()[:4] + (identity()[4] - 1,))
out["moved"] = [read(6, 0, 4096), n.read_planned(6)]
plan(10, fd=os.open(sys.argv[2], os.O_RDONLY))
out["another file"] = [read(10, 0, 4096), n.read_planned(10)]
plan(7)
n.read_forget(7)
out["forgotten"] = [read(7, 0, 4096), n.read_planned(7), read(8, 0, 4096)]
def ggml(raw):  # the reference: 17-byte MXFP4 blocks from the checkpoint's nibble order into ggml's
    b = np.frombuffer(raw, np.uint8).reshape(-1, 17)
    el = np.empty((len(b), 32), np.uint8)
    el[:, 0::2], el[:, 1::2] = b[:, 1:] & 15, b[:, 1:] >> 4
    out = b.copy()
    out[:, 1:] = el[:, :16] | (el[:, 16:] << 4)
    return out.tobytes()
# An MXFP4 stack of 70,000 blocks at blob byte 12345, its bytes from 170 (block 10) on at view byte 0.
STACK = ggml(data[12345 : 12345 + 70_000 * 17])[170:]
for name, lag in (("mxfp4 dropped", DROPS), ("mxfp4 kept", -1)):
    plan(11, lag, segs=[(0, len(STACK), 170, 2, 12345, 17 * 90, 17 * 90)])
    out[name] = [read(11, off, size, STACK) for off, size in
                 ((0, MiB), (5, 20), (100, 1), (33, MiB - 7), (len(STACK) - 1000, 1000), (len(STACK) - 10, 20))]
    out[name].append(n.read_planned(11))
plan(12, segs=[(0, MiB, 0, 2, len(data) - 4096, 17, 17)])
out["mxfp4 short"] = [read(12, 0, 8192), n.read_planned(12)]
# A header held in the plan (its bytes from 24 on), then blob bytes.
HEADER = bytes(range(256)) * 8
headed = HEADER[24:1024] + data[8192 : 8192 + MiB]
plan(13, segs=[(0, 1000, 24, 3), (1000, MiB, 8192, 0)], held=HEADER)
out["held"] = [read(13, 0, 4096, headed), read(13, 500, 1000, headed), read(13, 0, 1000 + MiB, headed)]
# Two halves of an interleaved stack of N rows of R bytes from blob byte 5000 (row r of the first half
# is the blob's row 2r, of the second 2r + 1), at view bytes 0 and H, copied or repacked from MXFP4; the
# second half is the first's kin and the reverse.  A read of either makes the other's same rows, as
# whole pages of the view (their bytes outside the kin where the plan serves them), queued until taken
# (a read of both: both's).
wake = os.eventfd(0, os.EFD_NONBLOCK)
n.read_stores_wake(wake, 64 * MiB)
for kind, R, N, how in ((4, 100, 10_000, bytes), (2, 17 * 90, 680, ggml)):
    H = R * N
    halves = [b"".join(how(data[5000 + (2 * r + j) * R : 5000 + (2 * r + j + 1) * R]) for r in range(N)) for j in (0, 1)]
    view = halves[0] + halves[1] + bytes(VIEW - 2 * H)
    segs = [(0, H, 0, kind, 5000, R, 2 * R, H), (H, H, 0, kind, 5000 + R, R, 2 * R, 0)]
    res, stored, pages = [], {}, 0
    for stores in (False, True):
        plan(14, segs=segs, stores=stores)
        for off, size in ((0, MiB), (4096, 8192), (12345, 777), (H - 5000, 5000), (H - 4096, 8192), (H + 3, 4096 * 9),
                          (2 * H - 9000, 9000)):
            res.append(read(14, off, size, view))
            for fh, at, mem, size_ in n.read_stores():
                got = ctypes.string_at(mem, size_)
                n.read_store_free(mem, size_)
                pages += size_ // 4096
                stored[(off, at)] = (fh == 14 and at % 4096 == 0 and size_ % 4096 == 0 and got == view[at : at + size_]
                                     and at + size_ <= 2 * H)  # (never past the bytes the plan serves)
    out[f"rows {kind}"] = res
    out[f"rows {kind} stores"] = [all(stored.values()), len(stored), pages]
out["woken"] = os.eventfd_read(wake) > 0
n.read_stores_wake(wake, 4096)
plan(15, segs=segs, stores=True)
refused = n.read_stores_refused()
out["full"] = [read(15, 0, MiB, view), n.read_stores(), n.read_stores_refused() - refused]
n.read_stores_wake(-1, 0)
plan(16, segs=segs, stores=True)
out["not made"] = [read(16, 0, MiB, view), n.read_stores()]
bad = {"overlapping": [(0, 10, 0, 0), (5, 10, 0, 0)], "unknown kind": [(0, 10, 0, 4)],
       "past the view": [(VIEW - 5, 10, 0, 0)], "empty": [(0, 0, 0, 0)], "negative": [(0, 10, -1, 0)],
       "negative origin": [(0, 10, 0, 2, -1, 17, 17)], "origin past any file": [(0, 10, 0, 2, (1 << 63) - 20, 17, 17)],
       "past the held bytes": [(0, 10, 5, 3)], "rows of no whole blocks": [(0, 10, 0, 2, 0, 20, 40)],
       "rows closer than their size": [(0, 10, 0, 4, 0, 8, 4)], "no rows": [(0, 10, 0, 4, 0, 0, 0)],
       "no such kin": [(0, 80, 0, 4, 0, 4, 8, 5000)], "a kin of other rows": [(0, 80, 0, 4, 0, 4, 8, 80),
       (80, 80, 0, 4, 4, 4, 16, 0)], "a kin too far": [(0, 80, 0, 4, 0, 4, 8, 80), (80, 80, 0, 4, 2 * MiB, 4, 8, 0)],
       "a kin of another size": [(0, 80, 0, 4, 0, 4, 8, 80), (80, 40, 0, 4, 4, 4, 8, 0)],
       "its own kin": [(0, 80, 0, 4, 0, 4, 8, 0)], "rows past any output": [(0, 10, (1 << 63) - 40, 4, 0, 1 << 20, 1 << 20 + 1)]}
out["refused"] = []
for what, segs in bad.items():
    try:
        plan(9, segs=segs, held=bytes(10))
    except ValueError:
        out["refused"].append(what)
for what, lag, unit in (("a lag under -1", -2, 4096), ("no blocks", 0, 0)):
    try:
        plan(9, lag, unit=unit)
    except ValueError:
        out["refused"].append(what)
other = READ_BUF(lambda *args: 0)
try:
    n.read_gate(ctypes.cast(other, ctypes.c_void_p).value, fuse.fuse_file_info.fh.offset, ctypes.sizeof(vec),
                vec.count.offset, vec.buf.offset + _FuseBuf.size.offset, vec.buf.offset + _FuseBuf.mem.offset)
except ValueError:
    out["one gate"] = True
out["served"] = n.read_served()
print(json.dumps(out))
"""


@needs_accel
def test_the_gate_answers_plain_ranges_and_passes_the_rest_on(tmp_path):
    blob = tmp_path / "blob"
    blob.write_bytes(random.Random(7).randbytes(3 << 20))
    (tmp_path / "other").write_bytes(bytes(3 << 20))
    res = subprocess.run(
        [sys.executable, "-c", _GATE, str(blob), str(tmp_path / "other")], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    # Pages given back behind the reads or not: the same bytes; a read into
    # the range of no plain kind and one from the view's end go to Python
    # (and keep the plan).
    for how in ("dropped", "kept"):
        assert out[how] == ["same", "same", "same", "same", "python", "python", True], how
    # The bytes past a read are plain too, up to `window` of them.
    assert out["window"] == ["same", "python"]
    # A blob that ends before the plan's bytes: Python reads (and fails) it; the plan is dropped.
    assert out["short"] == ["python", False]
    # An inotify event queued, or taken in since the plan was made, or a
    # status that moved: Python judges the file; the plan is dropped.
    assert out["watched"] == ["same", "python", False]
    assert out["events"] == ["python", False]
    assert out["moved"] == ["python", False]
    # A descriptor whose number another file holds (a file closed under the plan).
    assert out["another file"] == ["python", False]
    assert out["forgotten"] == ["python", False, "python"]
    # An MXFP4 stack repacked from its blob blocks, cut anywhere: the
    # reference's bytes; a range past its end goes to Python; a stack whose
    # blocks run past the blob's end too, and the plan is dropped.
    for how in ("mxfp4 dropped", "mxfp4 kept"):
        assert out[how] == ["same"] * 5 + ["python", True], how
    assert out["mxfp4 short"] == ["python", False]
    assert out["held"] == ["same", "same", "same"]
    # Rows of an interleaved stack's halves, copied or repacked, cut anywhere, through the gate: the
    # reference's bytes; without stores none made, with them each read's kin pages (whole pages, the
    # view's bytes, none past the second half: the plan serves no byte after it), the sending thread woken.
    for kind in (4, 2):
        assert out[f"rows {kind}"] == ["same"] * 14, kind
        ok, ranges, pages = out[f"rows {kind} stores"]
        assert ok and ranges == 9 and pages > 256 + 8, kind
    assert out["woken"]
    # A queue full: the read answered, no store made (and counted); stores off: none made.
    assert out["full"] == ["same", [], 2]  # (its kin ranges in both halves)
    assert out["not made"] == ["same", []]
    assert out["refused"] == [
        "overlapping",
        "unknown kind",
        "past the view",
        "empty",
        "negative",
        "negative origin",
        "origin past any file",
        "past the held bytes",
        "rows of no whole blocks",
        "rows closer than their size",
        "no rows",
        "no such kin",
        "a kin of other rows",
        "a kin too far",
        "a kin of another size",
        "its own kin",
        "rows past any output",
        "a lag under -1",
        "no blocks",
    ]
    assert out["one gate"] and out["served"] == 23 + 28 + 2


@pytest.fixture(scope="module")
def glm_store(tmp_path_factory):
    """A store holding GLM-OCR's older form at published widths (a 160 MB
    blob whose model.gguf and mmproj.gguf are blob ranges and zeros past
    their headers), and each view's bytes as made in process."""
    root = tmp_path_factory.mktemp("glm")
    blob = widths.write_blob(widths.FORMS["glmocr"][1](), root / "glmocr.gguf")
    store = root / "store"
    add_model(store, "glm", blob)
    blob.unlink()
    return store, views_of(blob_of(store, "glm", "latest"))


def _served(log: str) -> int:
    line = next(line for line in log.splitlines() if line.endswith("reads answered in C"))
    return int(line.split()[-5])


@needs_fuse
@needs_accel
def test_reads_through_the_gate_are_the_views_bytes(glm_store, mount_store):
    store, views = glm_store
    m = mount_store(store)
    rng = random.Random(3)
    for name, want in views.items():
        assert isinstance(want, bytes), want
        path = m / f"glm:latest/{name}"
        _drop(path)
        with open(path, "rb", buffering=0) as f:
            assert hashlib.sha256(f.read()).digest() == hashlib.sha256(want).digest(), name
            for _ in range(40):
                at, size = rng.randrange(len(want)), rng.choice([1, 4096, 70_000, 1 << 20])
                _drop(path)
                assert os.pread(f.fileno(), size, at) == want[at : at + size], (name, at, size)
    m.close()
    assert _served(m.log.read_text()) > 100


@needs_fuse
@needs_accel
def test_a_files_first_read_its_header_included_is_answered_in_c(glm_store, mount_store):
    """The plan is made at the open and holds the header: a file's very
    first read (one page, read-ahead off) is the gate's."""
    store, views = glm_store
    m = mount_store(store)
    for name, want in views.items():
        path = m / f"glm:latest/{name}"
        _drop(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            assert os.pread(fd, 4096, 0) == want[:4096]
        finally:
            os.close(fd)
    m.close()
    assert _served(m.log.read_text()) == len(views)


@needs_fuse
@needs_accel
def test_a_rewrite_under_a_read_through_the_gate_is_eio(glm_store, mount_store, tmp_path):
    store, views = glm_store
    blob = blob_of(store, "glm", "latest")
    m = mount_store(store)
    path = m / "glm:latest/mmproj.gguf"
    want = views["mmproj.gguf"]
    with open(path, "rb", buffering=0) as f:
        assert f.read(16 << 20) == want[: 16 << 20]  # (its plan made, its reads answered in C)
        st = blob.stat()
        with open(blob, "r+b") as w:
            w.seek(st.st_size - 4096)
            w.write(os.urandom(4096))
        os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
        _drop(path)
        with pytest.raises(OSError) as e:
            os.pread(f.fileno(), 4096, len(want) - 4096)
        assert e.value.errno == errno.EIO
    assert "changed under an open file" in m.log_text()


@needs_fuse
@needs_accel
def test_a_chmod_is_read_through_and_the_gate_answers_again(glm_store, mount_store):
    store, views = glm_store
    blob = blob_of(store, "glm", "latest")
    m = mount_store(store)
    path = m / "glm:latest/model.gguf"
    want = views["model.gguf"]
    mode = blob.stat().st_mode
    try:
        with open(path, "rb", buffering=0) as f:
            assert f.read(4 << 20) == want[: 4 << 20]
            os.chmod(blob, 0o600)
            _drop(path)
            assert f.read() == want[4 << 20 :]  # (about 58 requests, after the first answered in Python)
    finally:
        os.chmod(blob, mode)
    m.close()
    log = m.log.read_text()
    assert "changed under an open file" not in log
    assert _served(log) >= 40


def test_rounds_read_straight_are_their_runs():
    """A segment of rounds whose runs `assemble` reads one by one (long, or
    sparse) is planned as those runs of the blob: clipped anywhere, the runs
    put in place, in view order, are exactly its bytes; rounds of short dense
    runs, or with kin, are left to Python."""
    unit = assemble.DIRECT
    data = random.Random(5).randbytes(8 * unit)
    rounds = Rounds(period=2 * unit, parts=((0, 0, unit, unit), (unit, 4 * unit, unit, unit)), count=3)
    whole = b"".join(data[k * unit : (k + 1) * unit] + data[(4 + k) * unit : (5 + k) * unit] for k in range(3))
    seg = InRounds(1000, len(whole), 0, rounds)
    assert readgate._straight(seg)
    for a, b in [(0, len(whole)), (1, 2), (unit - 3, unit + 5), (2 * unit + 1, 4 * unit + 9), (77, len(whole) - 77)]:
        runs = readgate._runs(seg.clip(1000 + a, 1000 + b))
        assert [r[0] for r in runs] == sorted(r[0] for r in runs)
        assert runs[0][0] == 1000 + a and sum(size for _, size, _ in runs) == b - a
        assert b"".join(data[lo : lo + size] for _, size, lo in runs) == whole[a:b], (a, b)
    short = Rounds(period=1024, parts=((0, 0, 512, 512), (512, 4096, 512, 512)), count=3)
    assert not readgate._straight(InRounds(0, 3 * 1024, 0, short))
    assert not readgate._straight(InRounds(0, len(whole), 0, rounds, kin=(seg,)))


@pytest.fixture(scope="module")
def mxfp4_store(tmp_path_factory):
    """A store holding gpt-oss-120b's type-4 form (rows as wide as the
    published model's, 4 experts), its model.gguf as numpy's kernel makes it,
    and where in it the whole (down-projection) stacks lie, which the gate
    repacks: (at, size) of each."""
    root = tmp_path_factory.mktemp("mxfp4")
    blob = widths.write_blob(widths.gptoss_blob(ollama_mxfp4=True, n_expert=4), root / "gptoss.gguf")
    store = root / "store"
    add_model(store, "gptoss", blob)
    blob.unlink()
    blob = blob_of(store, "gptoss", "latest")
    with pytest.MonkeyPatch.context() as numpy_only:
        numpy_only.setattr(accel, "native", None)
        want = views_of(blob)["model.gguf"]
    stacks = [
        (seg.at, seg.size)
        for seg in BlobViews().view(blob, "model.gguf").segments
        if isinstance(seg, Computed) and seg.op.compiled_blocks is not None
    ]
    return store, want, stacks


@needs_fuse
@needs_accel
def test_mxfp4_stacks_the_gate_repacks_are_numpys_bytes(mxfp4_store, mount_store):
    store, want, stacks = mxfp4_store
    assert stacks and all(size > WINDOW + (2 << 20) for _, size in stacks)
    m = mount_store(store)
    path = m / "gptoss:latest/model.gguf"
    rng = random.Random(11)
    reads = 0
    with open(path, "rb", buffering=0) as f:
        assert f.read(4096) == want[:4096]  # (the header: held in the plan made at the open)
        for at, size in stacks:
            for _ in range(30):
                n = rng.choice([1, 17, 4096, 70_000, 1 << 20])
                lo = rng.randrange(at, at + size - WINDOW - n)
                _drop(path)
                assert os.pread(f.fileno(), n, lo) == want[lo : lo + n], (lo, n)
                reads += 1
    m.close()
    assert _served(m.log.read_text()) >= reads  # (each read inside a stack answered in C)
    m = mount_store(store)
    with open(m / "gptoss:latest/model.gguf", "rb") as f:
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(want).digest()


def test_stacks_and_their_halves_are_planned_as_rows(gptoss_layer):
    """A gpt-oss layer's plan: each whole type-4 stack one range of rows
    end to end (clipped anywhere: the same kind, origin and rows); each half
    of an interleaved stack (fused: copied, type 4: repacked), weight or
    bias, every other row of the blob's, its kin the other half, whose rows
    lie a row away."""
    view = BlobViews().view(gptoss_layer, MODEL_FILE)
    kinds = set()
    for seg in view.segments:
        if not isinstance(seg, (InRounds, Computed)):
            continue
        (planned,) = readgate._served(seg)
        at, size, lo, kind, origin, row, stride, kin = planned
        assert (at, size, lo) == (seg.at, seg.size, 0)
        kinds.add((kind, bool(seg.kin)))
        if seg.kin:
            theirs = readgate._served(next(s for s in view.segments if s.at == seg.kin[0].at))[0]
            assert kin == seg.kin[0].at and theirs[7] == seg.at
            assert theirs[3] == kind and theirs[5:7] == (row, stride) and stride == 2 * row
            assert abs(theirs[4] - origin) == row
            continue
        assert isinstance(seg, Computed) and (kind, row, stride, kin) == (2, 1530, 1530, -1)
        assert origin == seg.op.inputs[0].offset
        part = seg.clip(seg.at + 100, seg.at + 5000)
        assert readgate._served(part) == [(seg.at + 100, 4900, 100, *planned[3:])]
    mxfp4 = "mxfp4" in gptoss_layer.name
    assert kinds == ({(2, False), (2, True), (4, True)} if mxfp4 else {(4, True)})


def test_a_views_plan_segments_are_packed_once_while_it_lives(mxfp4_store, monkeypatch):
    """Every open of a view plans from one packing of its segments: made at
    the first, reused by the next, gone with the view."""
    import gc

    store = mxfp4_store[0]
    view = BlobViews().view(blob_of(store, "gptoss", "latest"), "model.gguf")
    made = []
    pack = readgate._segments
    monkeypatch.setattr(readgate, "_segments", lambda v: made.append(v) or pack(v))
    first = readgate._packed(view)
    assert readgate._packed(view) is first and made == [view]
    assert first == pack(view)
    entries = len(readgate._packings)
    del view, made[:]
    gc.collect()
    assert len(readgate._packings) == entries - 1
