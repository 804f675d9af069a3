"""The compiled gather_read (compatfs._accel), which reads strided runs of a
blob straight into a reply, against the numpy gather it stands in for
(`assemble._rounds` without the compiled kernels) and against the runs
taken out of the blob's bytes by hand: the same bytes for every layout of
rounds and every range cut out of them; a blob that ends first or cannot be
read is an error naming it; bad numbers are refused.  And a view whose op
tensors are strided halves (gpt-oss's fused gate and up stacks) gives the
same bytes with and without the compiled kernels (COMPATFS_NO_ACCEL=1)."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from compatfs.errors import GGUFError
from compatfs.files.blobfile import BlobFile
from compatfs.files.lookup import transient
from compatfs.translate import accel
from compatfs.view import assemble as viewbytes
from compatfs.view.segments import InRounds, Rounds, Segments
from compatfs.testing import widths

pytestmark = [
    pytest.mark.usefixtures("nothing_ahead"),
    pytest.mark.skipif(accel.native is None, reason="compatfs._accel is not built (or COMPATFS_NO_ACCEL)"),
]

MiB = 1 << 20


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> tuple[str, bytes]:
    data = np.random.default_rng(11).integers(0, 256, 6 * MiB + 321, dtype=np.uint8).tobytes()
    path = tmp_path_factory.mktemp("gather") / "blob"
    path.write_bytes(data)
    return str(path), data


def by_hand(data: bytes, r: Rounds) -> bytes:
    """The rounds' bytes, taken out of the blob's bytes one run at a time."""
    out = bytearray(r.period * r.count)
    for k in range(r.count):
        for at, offset, unit, stride in r.parts:
            out[k * r.period + at : k * r.period + at + unit] = data[offset + k * stride : offset + k * stride + unit]
    return bytes(out)


LAYOUTS = [
    Rounds(1530, ((0, 100, 1530, 3060),), 1200),  # a strided half (gpt-oss fused)
    Rounds(1530, ((0, 1630, 1530, 3060),), 1200),  # the other half
    Rounds(3000, ((0, 7, 1000, 1000), (1000, 3 * MiB, 2000, 2600)), 900),  # rows of two tensors interleaved
    Rounds(512, ((0, 1, 512, 4096),), 700),  # sparse: one in eight
    Rounds(600, ((0, 0, 600, 600),), 5000),  # runs that touch
    Rounds(8, ((0, 3, 4, 8), (4, 5 * MiB, 4, 12)), 40_000),  # too short to scatter: numpy's
]


@pytest.mark.parametrize("r", LAYOUTS, ids=range(len(LAYOUTS)))
def test_every_range_of_every_layout_is_the_same_bytes_as_numpys(raw, r, monkeypatch):
    path, data = raw
    size = r.period * r.count
    want = by_hand(data, r)
    segments = Segments([InRounds(0, size, 0, r)], size)
    rng = np.random.default_rng(r.count)
    ranges = [(0, size), (1, size - 2), (r.period - 1, r.period + 2), (size - 5, 5)] + [
        (int(a), int(rng.integers(1, size - a + 1))) for a in rng.integers(0, size, 12)
    ]
    with BlobFile(path) as f:
        for offset, n in ranges:
            compiled = bytearray(n)
            viewbytes.fill(segments, f, offset, memoryview(compiled))
            with monkeypatch.context() as m:
                m.setattr(accel, "native", None)
                numpys = bytearray(n)
                viewbytes.fill(segments, f, offset, memoryview(numpys))
            assert compiled == numpys == want[offset : offset + n], (offset, n)


def test_the_compiled_gather_reads_each_span_once(raw, monkeypatch):
    """Runs of a strided half are scattered into place by gather_read, one call a range."""
    path, data = raw
    r = LAYOUTS[0]
    calls = []
    real = accel.native.gather_read

    class Spy:
        def __getattr__(self, name):
            return getattr(real.__self__, name)

        @staticmethod
        def gather_read(*args):
            calls.append(args[2:])
            return real(*args)

    monkeypatch.setattr(accel, "native", Spy())
    size = r.period * r.count
    with BlobFile(path) as f:
        out = bytearray(size)
        viewbytes.fill(Segments([InRounds(0, size, 0, r)], size), f, 0, memoryview(out))
    assert out == by_hand(data, r)
    assert calls == [(100, 1530, 3060, r.count, 1530)]


def test_a_blob_that_ends_first_is_an_error_naming_it(tmp_path):
    path = tmp_path / "short-blob"
    path.write_bytes(bytes(range(256)) * 40)  # 10,240 bytes
    r = Rounds(1000, ((0, 0, 1000, 2000),), 10)  # runs up to byte 19,000
    with BlobFile(path) as f, pytest.raises(GGUFError, match="short-blob.*ends at 10240"):
        viewbytes.fill(Segments([InRounds(0, 10_000, 0, r)], 10_000), f, 0, memoryview(bytearray(10_000)))


def test_a_read_that_fails_is_an_error_naming_the_blob_kept_transient(raw, monkeypatch):
    path, _ = raw
    r = LAYOUTS[0]
    size = r.period * r.count

    class Failing:
        @staticmethod
        def gather_read(*args):
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(accel, "native", Failing())
    with BlobFile(path) as f, pytest.raises(GGUFError, match="blob: cannot read") as e:
        viewbytes.fill(Segments([InRounds(0, size, 0, r)], size), f, 0, memoryview(bytearray(size)))
    assert transient(e.value)


def test_bad_numbers_are_refused(raw):
    path, _ = raw
    fd = os.open(path, os.O_RDONLY)
    try:
        out = bytearray(100)
        with pytest.raises(ValueError, match="shorter"):
            accel.native.gather_read(fd, out, 0, 10, 20, 11, 10)
        with pytest.raises(ValueError, match="overlap"):
            accel.native.gather_read(fd, out, 0, 10, 5, 2, 10)
        with pytest.raises(ValueError, match="overlap"):
            accel.native.gather_read(fd, out, 0, 10, 20, 2, 5)
        with pytest.raises(ValueError, match="negative"):
            accel.native.gather_read(fd, out, -1, 10, 20, 2, 10)
        with pytest.raises(ValueError, match="beyond"):
            accel.native.gather_read(fd, out, 0, 10, 1 << 62, 4, 10)
        with pytest.raises(TypeError):
            accel.native.gather_read(fd, b"read-only", 0, 1, 1, 1, 1)
        folder = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(IsADirectoryError):  # preadv's EISDIR
                accel.native.gather_read(folder, out, 0, 10, 20, 2, 10)
        finally:
            os.close(folder)
    finally:
        os.close(fd)


def test_a_fused_view_is_the_same_bytes_without_the_compiled_kernels(tmp_path):
    blob = widths.write_blob(widths.gptoss_blob(ollama_mxfp4=False, n_expert=2), tmp_path / "gptoss-fused.gguf")
    code = (
        "import hashlib, sys; from compatfs.view.catalog import BlobViews; from compatfs.names import MODEL_FILE;"
        "v = BlobViews().view(sys.argv[1], MODEL_FILE); f = v.open();"
        "print(hashlib.sha256(b''.join(v.read(a, 1 << 20, f) for a in range(0, v.size, 1 << 20))).hexdigest())"
    )
    digests = {}
    for value in ("1", ""):
        env = {**os.environ, "COMPATFS_NO_ACCEL": value}
        digests[value] = subprocess.run(
            [sys.executable, "-c", code, str(blob)], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
    assert digests["1"] == digests[""]
    from compatfs.view.catalog import BlobViews
    from compatfs.names import MODEL_FILE

    view = BlobViews().view(blob, MODEL_FILE)
    halves = [s for s in view.segments if isinstance(s, InRounds)]
    assert halves, "strided halves in the view"
    assert hashlib.sha256(view.read(0, view.size)).hexdigest() == digests[""]
