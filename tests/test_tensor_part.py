"""`TensorInfo.part`: the one way to make a tensor the blob's header does not list, checked as the blob's own are."""

import pytest
from gguf import GGMLQuantizationType as DT

from compatfs.errors import GGUFError
from compatfs.format.header import TensorInfo

MATRIX = TensorInfo("m", (64, 4), DT.Q8_0, 1000)  # rows of 68 bytes (two Q8_0 blocks)


def test_a_part_inside_its_tensor_stands_for_its_bytes():
    row = MATRIX.part("m[3]", (64,), DT.Q8_0, 3 * 68)
    assert (row.offset, row.nbytes) == (1000 + 3 * 68, 68)
    raw = TensorInfo("x", (64, 2), 4, 50).part("x", (34,), DT.I8, stored=34)  # a type GGUF readers do not know
    assert (raw.offset, raw.nbytes) == (50, 34)


@pytest.mark.parametrize(
    "name, shape, dtype, start, stored, why",
    [
        ("past", (64,), DT.Q8_0, 4 * 68, None, "outside the 272 bytes of m"),
        ("before", (64,), DT.Q8_0, -68, None, "outside"),
        ("wide", (64, 5), DT.Q8_0, 0, None, "outside"),
        ("cut", (33,), DT.Q8_0, 0, None, "not a whole number of blocks"),
        ("unknown", (4,), 4, 0, None, "do not know"),
        ("negative", (-1,), DT.F32, 0, None, "shape"),
        ("deep", (1,) * 9, DT.F32, 0, None, "shape"),
        ("raw", (35,), DT.I8, 0, 34, "outside the 34 bytes"),
    ],
)
def test_a_bad_part_is_refused_naming_it(name, shape, dtype, start, stored, why):
    with pytest.raises(GGUFError, match=why) as e:
        MATRIX.part(name, shape, dtype, start, stored=stored)
    assert name in str(e.value)
