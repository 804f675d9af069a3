"""Hostile headers: every mutated blob is served or refused with GGUFError,
in bounded time and memory; numbers a handler would loop over are checked
against the tensors the blob holds."""
import time
import tracemalloc

import pytest

from compatfs.gguf_values import GGUFError
from compatfs.testing import fuzz

from conftest import SHARED, needs_shared


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-seeds")
    extra = sorted((SHARED / "ollama").glob("*.gguf")) if SHARED.is_dir() else []
    return fuzz.seed_blobs(d, extra)


def test_mutated_headers_are_served_or_refused(seeds, tmp_path):
    summary = fuzz.run(seeds, cases=300, seed=20261130, workdir=tmp_path, max_seconds=5.0, max_bytes=64 << 20)
    assert summary.findings == []
    # The run really exercised both outcomes.
    assert summary.by_result["served"] > 30 and summary.by_result["refused"] > 30


@needs_shared
@pytest.mark.parametrize("key, value", [
    ("gemma4.block_count", 2**32 - 1),
    ("gemma4.vision.block_count", 2**22),
    ("gemma4.vision.block_count", 2**31 - 1),
])
def test_block_count_bombs_are_refused_quickly(tmp_path, key, value):
    """Measured on the landed code: `ls -l` hung for hours (2^32-1) or took
    23 s and 5.5 GB (2^31-1)."""
    path = tmp_path / "bomb.gguf"
    path.write_bytes(fuzz.with_u32((SHARED / "ollama/gemma4_vision.gguf").read_bytes(), key, value))
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(GGUFError, match=key.replace(".", r"\.")):
        fuzz.exercise(path)
    assert time.perf_counter() - t0 < 2.0
    assert tracemalloc.get_traced_memory()[1] < 64 << 20
    tracemalloc.stop()


@needs_shared
def test_a_count_below_the_blocks_present_is_served(tmp_path):
    """Only counts that exceed what the blob holds are refused."""
    path = tmp_path / "short.gguf"
    path.write_bytes(fuzz.with_u32((SHARED / "ollama/gemma4_vision.gguf").read_bytes(), "gemma4.block_count", 1))
    fuzz.exercise(path)


@needs_shared
@pytest.mark.parametrize("value", [0, 2**31 - 1])
def test_finding_mistral3_vision_head_count(tmp_path, value):
    """A fuzz finding (ValueError from the rope permutation): now a GGUFError
    naming the key."""
    path = tmp_path / "heads.gguf"
    blob = (SHARED / "ollama/mistral3.gguf").read_bytes()
    path.write_bytes(fuzz.with_u32(blob, "mistral3.vision.attention.head_count", value))
    with pytest.raises(GGUFError, match="head_count"):
        fuzz.exercise(path)


def test_finding_a_derived_value_out_of_range(tmp_path):
    """A fuzz finding (struct.error from a KV computed as 4 x the vision head
    count): values a handler computes from a blob's numbers are range-checked
    like the numbers themselves, and the error names the edit."""
    from compatfs.testing import LEGACY
    blob = LEGACY["deepseek-ocr"].model(tmp_path / "ds.gguf").read_bytes()
    path = tmp_path / "heads.gguf"
    path.write_bytes(fuzz.with_u32(blob, "deepseekocr.vision.head_count", 2**32 - 1))
    with pytest.raises(GGUFError, match="feed_forward_length.*does not fit"):
        fuzz.exercise(path)
