"""gpt-oss's type-4 MXFP4 repack (`OllamaMXFP4`) at gpt-oss-120b's row width
(2880 columns, 5760 fused gate/up rows an expert; a few experts, so the
data stays small): every range computed chunk by chunk equals the repack
as it was first written, a block at a time with numpy fancy indexing; each
test runs with the compiled kernel (where it is built) and with numpy."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from gguf import GGMLQuantizationType as DT

from compatfs.format.header import TensorInfo
from compatfs.errors import GGUFError
from compatfs.handlers.gptoss import BLOCK, QK, OllamaMXFP4

COLS, FF = 2880, 2880  # gpt-oss-120b: n_embd, expert feed-forward width
EXPERTS = 3


def _reference(data: np.ndarray, stored: tuple[int, ...], start: int, step: int) -> bytes:
    """Rows start::step of each slab, every block's nibbles reordered by
    splitting them into 32 values and packing values j and j + 16 together."""
    cols, rows, *slow = stored
    blocks = data.reshape(*reversed(slow), rows, cols // QK, BLOCK)[..., start::step, :, :]
    scale, packed = blocks[..., :1], blocks[..., 1:]
    values = np.stack((packed & 0x0F, packed >> 4), axis=-1).reshape(*packed.shape[:-1], QK)
    return np.concatenate((scale, values[..., : QK // 2] | (values[..., QK // 2 :] << 4)), axis=-1).tobytes()


pytestmark = pytest.mark.usefixtures("kernel")  # every test with numpy's kernel and with the compiled one


@pytest.fixture(scope="module")
def fused():
    stored = (COLS, 2 * FF, EXPERTS)
    nbytes = COLS * 2 * FF * EXPERTS // QK * BLOCK
    data = np.random.default_rng(16).integers(0, 256, nbytes, dtype=np.uint8)
    return stored, data


def _op(stored, start, step):
    raw = TensorInfo("blk.0.ffn_gate_up_exps.weight", (stored[0] * stored[1] * stored[2] // QK * BLOCK,), DT.I8, 0)
    return OllamaMXFP4((raw,), (stored[0], stored[1] // step, *stored[2:]), DT.MXFP4, stored, start, step)


def _ranges(op, rng):
    """Ranges that start and end inside blocks, on and across row, chunk and
    expert boundaries, and random ones."""
    row = COLS // QK * BLOCK
    chunk = op.CHUNK_BLOCKS // (COLS // QK) * row
    expert = op.nbytes // EXPERTS
    yield 0, op.nbytes
    yield 0, 5
    yield op.nbytes - 3, op.nbytes
    for edge in (row, 2 * row, chunk, chunk + row, expert, 2 * expert):
        for a, b in ((-1, 1), (-BLOCK - 3, 40), (-row, row), (-row - 7, 2 * row + 5), (-chunk - 1, chunk + 2)):
            yield max(0, edge + a), min(op.nbytes, edge + b)
    for _ in range(40):
        lo = int(rng.integers(0, op.nbytes))
        yield lo, min(op.nbytes, lo + int(rng.integers(1, 3 << 20)))


@pytest.mark.parametrize("start,step", [(0, 2), (1, 2), (0, 1)])
def test_repack_by_range_equals_the_reference_at_real_width(fused, start, step):
    stored, data = fused
    op = _op(stored, start, step)
    want = _reference(data, stored, start, step)
    reads = []

    def read(t, at, size):
        reads.append((at, size))
        return memoryview(data[at : at + size].copy())

    assert op.compute(lambda t: memoryview(data)) == want
    for lo, hi in _ranges(op, np.random.default_rng(start + 2 * step)):
        reads.clear()
        out = bytearray(hi - lo)
        op.compute_range_into(read, lo, hi, memoryview(out))
        assert out == want[lo:hi], (lo, hi)
        # one read a chunk of whole rows (the rows it takes and, when
        # strided, those between), one for each row cut by the range
        assert sum(size for _, size in reads) <= step * (hi - lo) + 4 * COLS // QK * BLOCK, (lo, hi)
        assert len(reads) <= -(-(hi - lo) // (op.CHUNK_BLOCKS // (COLS // QK) * COLS // QK * BLOCK)) + 3, (lo, hi)


def test_rows_wider_than_a_chunk(fused, monkeypatch):
    """A chunk smaller than a row still takes whole rows, one at a time."""
    stored, data = fused
    monkeypatch.setattr(OllamaMXFP4, "CHUNK_BLOCKS", 50)  # a row is 90 blocks
    for start, step in ((1, 2), (0, 1)):
        op = _op(stored, start, step)
        want = _reference(data, stored, start, step)
        for lo, hi in ((0, 1 << 20), (12345, 12345 + 300_000), (op.nbytes - 100_001, op.nbytes)):
            assert op.compute_range(lambda t, at, size: memoryview(data[at : at + size].copy()), lo, hi) == want[lo:hi]


def test_a_short_read_is_an_error_naming_the_tensor(fused):
    stored, data = fused
    op = _op(stored, 1, 2)
    with pytest.raises(GGUFError, match="ffn_gate_up_exps.*bytes read at"):
        op.compute_range(lambda t, at, size: memoryview(data[at : at + size - 1].copy()), 0, 1 << 20)


def test_reads_at_once_each_get_their_own_scratch(fused):
    """Reads converting at the same time (the mount serves reads in several
    threads, numpy letting go of the GIL) share no scratch: each equals the
    reference."""
    stored, data = fused
    op = _op(stored, 1, 2)
    want = _reference(data, stored, 1, 2)
    ranges = [(i * 200_003 % (op.nbytes - (1 << 18)), 1 << 18) for i in range(64)]
    got: dict[int, bytes] = {}

    def convert(i):
        lo, size = ranges[i]
        got[i] = bytes(op.compute_range(lambda t, at, n: memoryview(data[at : at + n].copy()), lo, lo + size))

    threads = [threading.Thread(target=lambda k=k: [convert(i) for i in range(k, len(ranges), 4)]) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[i] == want[lo : lo + size] for i, (lo, size) in enumerate(ranges))


def test_only_a_whole_stack_reads_its_inputs_once(fused):
    """A half reads spans that hold the other half's rows too (read again for
    that half: they stay in the page cache); a whole stack reads each byte once."""
    stored, _ = fused
    assert not _op(stored, 0, 2).reads_inputs_once and not _op(stored, 1, 2).reads_inputs_once
    assert _op(stored, 0, 1).reads_inputs_once
