"""Header parsing: values carried as bytes, and clear errors for bad files."""

import os
import struct

import gguf
import numpy as np
import pytest

from compatfs.format.header import SourceGGUF, tensor_nbytes
from compatfs.errors import GGUFError
from compatfs.format.values import VT, array, string, u32

from ggufs import write_gguf


@pytest.fixture
def small(tmp_path):
    return write_gguf(
        tmp_path / "s.gguf",
        "llama",
        kvs={
            "llama.block_count": 2,
            "llama.rope.freq_base": 10000.0,
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.tokens": ["a", "bb", "ccc", "dddd"],
            "tokenizer.ggml.scores": [0.5, 1.5, 2.5, 3.5],
        },
        tensors={"token_embd.weight": np.ones((4, 8), np.float32), "w": np.zeros((3, 8), np.float16)},
    )


def test_parse_matches_gguf_py(small):
    src, ref = SourceGGUF(small), gguf.GGUFReader(small)
    assert src.architecture == "llama" and src.version == 3
    assert src.get("llama.block_count") == 2
    assert src.get("tokenizer.ggml.tokens") == ["a", "bb", "ccc", "dddd"]
    np.testing.assert_array_equal(src.get("tokenizer.ggml.scores"), [0.5, 1.5, 2.5, 3.5])
    for t in ref.tensors:
        mine = src.tensors[t.name]
        assert mine.shape == tuple(int(x) for x in t.shape) and mine.dtype == t.tensor_type
        assert mine.offset == t.data_offset and mine.nbytes == t.n_bytes


def test_values_truncate_and_index(small):
    tokens = SourceGGUF(small).kvs["tokenizer.ggml.tokens"]
    assert tokens.string_at(2) == "ccc" and tokens.string_at(9) is None
    assert tokens.truncated(2).decode() == ["a", "bb"]
    assert tokens.truncated(10) is tokens
    scores = SourceGGUF(small).kvs["tokenizer.ggml.scores"]
    np.testing.assert_array_equal(scores.truncated(3).decode(), [0.5, 1.5, 2.5])
    assert u32(7).decode() == 7 and string("x").decode() == "x"
    assert array(VT.INT32, [1, 2]).decode().tolist() == [1, 2]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[: len(b) // 2], "past the end"),
        (lambda b: os.urandom(len(b)), "bad magic"),
        (lambda b: b[:4] + struct.pack(">I", 3) + b[8:], "big-endian"),
        (lambda b: b[:4] + struct.pack("<I", 1) + b[8:], "unsupported GGUF version 1"),
        (lambda b: b[:10], "too short"),
    ],
)
def test_bad_files_name_themselves(small, tmp_path, damage, message):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(damage(small.read_bytes()))
    with pytest.raises(GGUFError) as e:
        SourceGGUF(bad)
    assert str(bad) in str(e.value) and message in str(e.value)


def test_truncated_tensor_data_is_detected(small, tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(small.read_bytes()[:-40])
    with pytest.raises(GGUFError, match="runs past the end"):
        SourceGGUF(bad)


def test_sizes_of_a_plain_int_type_number():
    """A ggml type given as its number is sized, and refused, as its enum
    is (measured on the landed code: an AttributeError instead of the error
    naming a row that is not whole blocks)."""
    q8 = int(gguf.GGMLQuantizationType.Q8_0)
    assert tensor_nbytes((64, 2), q8) == tensor_nbytes((64, 2), gguf.GGMLQuantizationType.Q8_0) == 136
    with pytest.raises(GGUFError, match="Q8_0 row of 33"):
        tensor_nbytes((33,), q8)


@pytest.mark.parametrize("tokens", [1000, 300_000])
def test_a_header_is_read_short_first_then_whole(tmp_path, monkeypatch, tokens):
    """A small header takes one short read (what a cold open of a file with
    no large vocabulary waits for); one past it (a 300k-token vocabulary,
    ~3 MiB) one more of `SECOND_READ`, and parses the same."""
    from compatfs.files import blobfile

    reads = []
    real = blobfile.BlobFile.read
    monkeypatch.setattr(blobfile.BlobFile, "read", lambda self, off, n: reads.append(n) or real(self, off, n))
    words = [f"t{i}" for i in range(tokens)]
    path = write_gguf(
        tmp_path / "v.gguf",
        "llama",
        kvs={"tokenizer.ggml.tokens": words},
        tensors={"w": np.ones((256, 1024), np.float32)},
    )  # 1 MiB of data after it
    src = SourceGGUF(path)
    assert src.get("tokenizer.ggml.tokens") == words
    second = min(path.stat().st_size, SourceGGUF.SECOND_READ)
    assert reads == ([SourceGGUF.FIRST_READ] if tokens == 1000 else [SourceGGUF.FIRST_READ, second])
