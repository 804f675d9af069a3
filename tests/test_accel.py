"""compatfs._accel, the optional compiled kernels, against the numpy code
they stand in for: the same bytes on random blocks and at the edges (the
nibble values 0 and 15, scales 0 and 255, single blocks, rows cut at any
block, rows apart by any stride), and clear errors for buffers too short."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from compatfs.translate import accel
from compatfs.handlers.gptoss import BLOCK, _to_ggml, scratch_bytes

pytestmark = pytest.mark.skipif(accel.native is None, reason="compatfs._accel is not built (or COMPATFS_NO_ACCEL)")


def numpy_repack(src: np.ndarray, width: int, stride: int, first: int, count: int) -> bytes:
    """Blocks first .. first + count - 1 of `src` (rows of `width` blocks,
    `stride` bytes apart) repacked by the numpy kernel."""
    if not count:
        return b""
    rows = -(-(first + count) // width)
    blocks = np.ndarray((rows, width, BLOCK), np.uint8, src, 0, (stride, BLOCK, 1))
    pairs = np.zeros(scratch_bytes(blocks.size // BLOCK) // 2, np.uint16)
    wide = _to_ggml(blocks, pairs)
    out = np.ndarray((rows * width, BLOCK), np.uint8, wide, 1, (2 * BLOCK, 1))
    return out[first : first + count].tobytes()


def native_repack(src: np.ndarray, width: int, stride: int, first: int, count: int) -> bytes:
    dst = np.full(count * BLOCK, 0xAA, np.uint8)
    accel.native.mxfp4_repack(dst, src, width, stride, first, count)
    return dst.tobytes()


def test_random_blocks_in_rows_equal_numpy():
    rng = np.random.default_rng(4)
    for width, gap, rows in ((90, 0, 7), (90, 90 * BLOCK, 5), (1, 3, 40), (7, 5 * BLOCK + 3, 9), (8192, 0, 1)):
        stride = width * BLOCK + gap
        src = rng.integers(0, 256, (rows - 1) * stride + width * BLOCK, dtype=np.uint8)
        for first, count in (
            (0, rows * width),
            (1, rows * width - 1),
            (width - 1, 2),
            (0, 1),
            (rows * width - 1, 1),
            (width // 2, width),
            (0, 0),
        ):
            if first + count > rows * width:
                continue
            assert native_repack(src, width, stride, first, count) == numpy_repack(src, width, stride, first, count), (
                width,
                gap,
                first,
                count,
            )


@pytest.mark.parametrize("fill", [0x00, 0xFF, 0x0F, 0xF0, 0x5A])
def test_edge_values_equal_numpy(fill):
    src = np.full(64 * BLOCK, fill, np.uint8)
    src[::BLOCK] = [0, 255, 127, 128] * 16  # scales at their edges
    assert native_repack(src, 64, 0, 0, 64) == numpy_repack(src, 64, 0, 0, 64)


def test_each_nibble_lands_where_ggml_wants_it():
    """Element e of the checkpoint's block (byte e // 2, nibble e % 2) is
    element e of ggml's (byte e % 16, the high nibble from e = 16 on)."""
    for e in range(32):
        src = np.zeros(BLOCK, np.uint8)
        src[0] = 0x7F
        src[1 + e // 2] = 0x9 << (4 * (e % 2))
        want = np.zeros(BLOCK, np.uint8)
        want[0] = 0x7F
        want[1 + e % 16] = 0x9 << (4 * (e // 16))
        assert native_repack(src, 1, 0, 0, 1) == want.tobytes(), e


def test_short_buffers_and_bad_numbers_are_refused():
    src = np.zeros(10 * BLOCK, np.uint8)
    with pytest.raises(ValueError, match="output buffer is shorter"):
        accel.native.mxfp4_repack(np.zeros(BLOCK, np.uint8), src, 10, 0, 0, 2)
    with pytest.raises(ValueError, match="input buffer is shorter"):
        accel.native.mxfp4_repack(np.zeros(11 * BLOCK, np.uint8), src, 10, 10 * BLOCK, 0, 11)
    with pytest.raises(ValueError, match="input buffer is shorter"):  # the second row lies past the end
        accel.native.mxfp4_repack(np.zeros(2 * BLOCK, np.uint8), src, 5, 10 * BLOCK, 4, 2)
    with pytest.raises(ValueError, match="negative"):
        accel.native.mxfp4_repack(np.zeros(BLOCK, np.uint8), src, 0, 0, 0, 1)
    with pytest.raises(TypeError):
        accel.native.mxfp4_repack(b"read-only", src, 1, 0, 0, 0)


def test_no_accel_in_the_environment_turns_it_off():
    code = "from compatfs.translate import accel; print(accel.native is None)"
    for value, off in (("1", "True"), ("0", "False"), ("", "False")):
        env = {**os.environ, "COMPATFS_NO_ACCEL": value}
        assert (
            subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            ).stdout.strip()
            == off
        )
