"""Op tensors made of every other row of a stack, and a cold blob's spans
read once: gpt-oss's fused gate and up halves (strided runs) and its type-4
MXFP4 stacks and halves (repacked by range) read from a cold blob give the
same bytes as from a blob in the page cache, with the compiled kernels and
without; a range of a type-4 stack, halves included, is one read of the
blob."""

from __future__ import annotations


import pytest

from compatfs.files.blobfile import BlobFile
from compatfs.handlers.gptoss import OllamaMXFP4
from compatfs.names import MODEL_FILE
from compatfs.translate import accel
from compatfs.view.catalog import BlobViews
from compatfs.view.segments import Computed, InRounds
from compatfs.testing import widths

from test_read_once import cached, evicted

MiB = 1 << 20
pytestmark = pytest.mark.usefixtures("nothing_ahead")  # every range computed by the read that needs it


def read_through(view, f: BlobFile) -> bytes:
    return b"".join(view.read(at, MiB, f) for at in range(0, view.size, MiB))


@pytest.mark.usefixtures("kernel")
def test_a_cold_blob_s_halves_are_the_same_bytes_as_a_cached_one_s(gptoss_layer):
    view = BlobViews().view(gptoss_layer, MODEL_FILE)
    halves = [s for s in view.segments if isinstance(s, InRounds) or isinstance(getattr(s, "op", None), OllamaMXFP4)]
    assert halves, "the fused stack's halves in the view"
    gptoss_layer.read_bytes()  # in the page cache: read through it, as before
    with view.open() as f:
        assert not f.drops_behind
        reference = read_through(view, f)
    evicted(gptoss_layer)
    cached(gptoss_layer)  # skips where the kernel cannot tell
    with view.open() as f:
        if not f.drops_behind:
            pytest.skip(f"{gptoss_layer.parent}'s filesystem keeps the file in memory")
        assert read_through(view, f) == reference
        for at, size in ((12_345, 3 * MiB + 7), (halves[-1].at + 1529, 1531), (halves[0].at + 5, 70_001)):
            assert view.read(at, size, f) == reference[at : at + size], (at, size)


def test_a_range_of_a_type4_stack_is_one_read_of_the_blob(tmp_path, blob_reads):
    if accel.native is None:
        pytest.skip("compatfs._accel is not built (or COMPATFS_NO_ACCEL)")
    blob = widths.write_blob(widths.gptoss_blob(ollama_mxfp4=True, n_expert=2), tmp_path / "gptoss-mxfp4.gguf")
    view = BlobViews().view(blob, MODEL_FILE)
    stacks = [s for s in view.segments if isinstance(s, Computed) and isinstance(s.op, OllamaMXFP4)]
    assert {s.op.step for s in stacks} == {1, 2}, "whole stacks and halves in the view"
    with view.open() as f:
        whole = {id(s): view.read(s.at, s.size, f) for s in stacks}
        for s in stacks:
            for lo, size in ((0, MiB), (3 * MiB + 5, MiB), (s.size - MiB + 7, MiB - 7)):
                blob_reads.clear()
                assert view.read(s.at + lo, size, f) == whole[id(s)][lo : lo + size], (s.op.description, lo)
                assert len(blob_reads) == 1, (s.op.description, lo, blob_reads)
                assert blob_reads[0][1] <= s.op.step * (size + 2 * 1530), (s.op.description, lo, blob_reads)
