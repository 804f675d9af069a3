"""How much of a blob `SourceGGUF` reads to parse its header: a longer
prefix only when the header runs past the bytes read so far (`PastTheEnd`),
never because an error's text says so (a key or tensor name a hostile blob
chose can say anything)."""

import struct

import pytest

import compatfs.format.header as header
from compatfs.errors import GGUFError
from compatfs.format.header import SourceGGUF
from compatfs.format.values import PastTheEnd

MIMIC = "runs past the end of the file"


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_blob(path, body: bytes, n_kv: int, n_tensors: int, size: int):
    """A GGUF v3 header of `n_kv` KVs and `n_tensors` tensor infos (`body`),
    the file made `size` bytes long (sparse: zeros)."""
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body)
        f.truncate(size)
    return path


@pytest.fixture
def reads(monkeypatch):
    """The sizes of the reads the header parser makes."""
    sizes = []
    real = header.BlobFile.read

    def counted(self, offset, size):
        sizes.append(size)
        return real(self, offset, size)

    monkeypatch.setattr(header.BlobFile, "read", counted)
    return sizes


# Blobs larger than the most the parser reads: a parser that reads more on
# an error's text reads up to that bound and then blames the header's size.
BIG = SourceGGUF.MAX_HEADER + (1 << 20)

CASES = {
    "a key of an unknown value type": (_str(f"k {MIMIC}") + struct.pack("<I", 99), 1, 0, "unknown value type"),
    "a tensor of too many dimensions": (_str(f"t {MIMIC}") + struct.pack("<I", 9), 0, 1, "9 dimensions"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_error_that_mentions_the_end_is_not_read_further(tmp_path, reads, case):
    body, n_kv, n_tensors, says = CASES[case]
    path = write_blob(tmp_path / "b.gguf", body, n_kv, n_tensors, BIG)
    with pytest.raises(GGUFError, match=says):
        SourceGGUF(path)
    assert reads == [SourceGGUF.FIRST_READ]


def test_a_header_past_the_first_read_is_read_further(tmp_path, reads):
    """A string longer than the first read: one more, longer read, then parsed."""
    long = "x" * (SourceGGUF.FIRST_READ + 10)
    body = (
        _str("general.architecture")
        + struct.pack("<I", 8)
        + _str("llama")
        + _str("long")
        + struct.pack("<I", 8)
        + _str(long)
    )
    path = write_blob(tmp_path / "b.gguf", body, 2, 0, 4 * SourceGGUF.FIRST_READ)
    src = SourceGGUF(path)
    assert src.get("long") == long and len(reads) == 2 and reads[1] > SourceGGUF.FIRST_READ


def test_a_header_cut_short_by_the_end_of_the_blob_is_past_the_end(tmp_path, reads):
    """Cut inside a value by the end of the blob itself: `PastTheEnd` of
    the whole blob, read once (no longer prefix to read)."""
    body = _str("general.architecture") + struct.pack("<I", 8) + struct.pack("<Q", 100) + b"ll"
    path = write_blob(tmp_path / "b.gguf", body, 1, 0, 24 + len(body))
    with pytest.raises(GGUFError, match="past the end"):
        SourceGGUF(path)
    assert len(reads) == 1
    assert issubclass(PastTheEnd, GGUFError)
