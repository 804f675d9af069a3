"""Headers that lie about their lengths: every length is checked against the
bytes the blob has before anything is read for it, and a header takes at
most `SourceGGUF.MAX_HEADER` bytes of memory however it lies."""

import struct
import time
import tracemalloc

import pytest

from compatfs.format.header import SourceGGUF
from compatfs.errors import GGUFError
from compatfs.format.values import VT

BLOB = 512 << 20  # sparse: costs no disk


def _header(*kvs: bytes) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)


def _key(name: bytes) -> bytes:
    return struct.pack("<Q", len(name)) + name


LIARS = {
    "a 2^62-byte string": _header(_key(b"a") + struct.pack("<IQ", VT.STRING, 1 << 62)),
    "a 2^62-element array": _header(_key(b"a") + struct.pack("<IIQ", VT.ARRAY, VT.UINT8, 1 << 62)),
    "a 2^62-string array": _header(_key(b"a") + struct.pack("<IIQ", VT.ARRAY, VT.STRING, 1 << 62)),
    "a key that is not UTF-8": _header(_key(b"\xff\xfe\xfd") + struct.pack("<IB", VT.UINT8, 1)),
    "arrays nested 10,000 deep": _header(
        _key(b"a")
        + struct.pack("<I", VT.ARRAY)
        + struct.pack("<IQ", VT.ARRAY, 1) * 10_000
        + struct.pack("<IQ", VT.UINT8, 0)
    ),
    "a 100 MiB string inside the blob": _header(_key(b"a") + struct.pack("<IQ", VT.STRING, 100 << 20)),
}


@pytest.mark.parametrize("what", LIARS)
def test_a_lying_header_is_refused_in_bounded_memory(tmp_path, what):
    blob = tmp_path / "liar.gguf"
    with open(blob, "wb") as f:
        f.write(LIARS[what])
        f.truncate(BLOB)
    tracemalloc.start()
    t = time.monotonic()
    try:
        with pytest.raises(GGUFError) as e:
            SourceGGUF(blob)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(blob) in str(e.value)
    # Measured on the landed code: the parser re-read the header 4x larger each
    # time, up to the whole blob (peaks of 512-640 MiB here, 5.1 GiB for 3 GiB).
    assert peak <= 2 * SourceGGUF.MAX_HEADER + (8 << 20), f"{what}: peak {peak >> 20} MiB ({e.value})"
    assert time.monotonic() - t < 10


def test_lengths_past_the_blob_are_refused_before_reading(tmp_path, monkeypatch):
    """A length beyond the blob is an error at once: nothing past the first read."""
    from compatfs.files import blobfile

    reads = []
    real = blobfile.BlobFile.read
    monkeypatch.setattr(blobfile.BlobFile, "read", lambda self, off, n: reads.append(n) or real(self, off, n))
    blob = tmp_path / "liar.gguf"
    with open(blob, "wb") as f:
        f.write(LIARS["a 2^62-byte string"])
        f.truncate(BLOB)
    with pytest.raises(GGUFError, match="past the end of the blob"):
        SourceGGUF(blob)
    assert reads == [SourceGGUF.FIRST_READ]
