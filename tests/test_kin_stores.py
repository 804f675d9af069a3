"""Op tensors made from one input span (gpt-oss's fused gate and up halves,
strided runs; its type-4 MXFP4 halves, repacked by range): a read of one
half's range makes the other half's same range from the same read of the
blob (`assemble.fill`'s `kin_into`), the same bytes as a read of that range,
with the compiled kernels and without; through a mount, those bytes go
straight into the kernel's page cache of the file (`fuse_lowlevel_notify_store`,
sent by the rescan thread), so a reader of the other half finds them there
and sends no READ for them."""

from __future__ import annotations

from pathlib import Path

import pytest

from compatfs.handlers.gptoss import OllamaMXFP4
from compatfs.names import MODEL_FILE
from compatfs.translate import accel
from compatfs.view import ahead, assemble
from compatfs.view.catalog import BlobViews
from compatfs.view.segments import Computed, InRounds
from compatfs.testing import widths

MiB = 1 << 20


@pytest.fixture(autouse=True)
def nothing_ahead(monkeypatch):
    """Every range computed by the read that needs it."""
    monkeypatch.setattr(ahead, "enabled", False)


@pytest.fixture(scope="module", params=["fused", "mxfp4"])
def blob(request, tmp_path_factory) -> Path:
    """One gpt-oss-120b layer (rows as wide as the published model's, 2 experts) in the fused or type-4 form."""
    path = tmp_path_factory.mktemp("kin") / f"gptoss-{request.param}.gguf"
    return widths.write_blob(widths.gptoss_blob(ollama_mxfp4=request.param == "mxfp4", n_expert=2), path)


def halves(view) -> list:
    return [s for s in view.segments if isinstance(s, (InRounds, Computed)) and s.kin]


def test_the_halves_of_a_stack_are_each_other_s_kin(blob):
    view = BlobViews().view(blob, MODEL_FILE)
    found = halves(view)
    assert found, "halves with kin in the view"
    for seg in found:
        assert [type(k) for k in seg.kin] == [type(seg)] and seg.kin[0].size == seg.size
        assert seg.kin[0].at != seg.at and not seg.kin[0].kin
    whole = [s for s in view.segments if isinstance(s, Computed) and isinstance(s.op, OllamaMXFP4) and s.op.step == 1]
    assert all(not s.kin for s in whole), "a whole stack shares no span"


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
def test_a_read_of_one_half_makes_the_other_s_same_range_byte_for_byte(blob, compiled, monkeypatch):
    if compiled and accel.native is None:
        pytest.skip("compatfs._accel is not built (or COMPATFS_NO_ACCEL)")
    if not compiled:
        monkeypatch.setattr(accel, "native", None)
    view = BlobViews().view(blob, MODEL_FILE)
    with view.open() as f:
        reference = b"".join(view.read(at, MiB, f) for at in range(0, view.size, MiB))
        for seg in halves(view):
            kin = seg.kin[0]
            for lo, size in ((0, MiB), (seg.size // 3 + 1529, MiB + 3), (seg.size - 70_001, 70_001), (17, 1)):
                lo = max(0, lo)
                size = min(size, seg.size - lo)
                made: dict[int, bytearray] = {}

                def into(at: int, n: int, made: dict[int, bytearray] = made) -> memoryview:
                    made[at] = bytearray(n)
                    return memoryview(made[at])

                out = bytearray(size)
                assemble.fill(view.segments, f, seg.at + lo, memoryview(out), into)
                assert bytes(out) == reference[seg.at + lo : seg.at + lo + size], (seg.at, lo)
                assert list(made) == [kin.at + lo], (seg.at, lo, list(made))
                assert bytes(made[kin.at + lo]) == reference[kin.at + lo : kin.at + lo + size], (seg.at, lo)


def test_a_kin_range_not_wanted_is_not_made(blob):
    view = BlobViews().view(blob, MODEL_FILE)
    seg = max(halves(view), key=lambda s: s.size)
    asked: list[tuple[int, int]] = []
    with view.open() as f:
        out = bytearray(MiB)
        assemble.fill(view.segments, f, seg.at + 5, memoryview(out), lambda at, n: asked.append((at, n)))
        assert bytes(out) == view.read(seg.at + 5, MiB, f)
    assert asked == [(seg.kin[0].at + 5, MiB)]
