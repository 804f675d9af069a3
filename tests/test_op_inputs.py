"""The input bytes of a ranged op, as `compatfs.view.assemble` reads them for
one range of its output: an op that reads its input in pieces (gpt-oss's
type-4 MXFP4 repack reads ~140 KB at a time) gets them from one read of the
blob for the range, not one per piece, and the same bytes as the op computed
whole; an op that reads its input at once is read exactly that once."""

from __future__ import annotations

import numpy as np
import pytest

from compatfs.files.blobfile import BlobFile
from compatfs.format.header import SourceGGUF
from compatfs.names import MODEL_FILE
from compatfs.translate.ops import Promote
from compatfs.view import assemble as viewbytes
from compatfs.view.catalog import BlobViews
from compatfs.view.segments import Computed, Segments
from compatfs.testing import widths

from ggufs import write_gguf

MiB = 1 << 20
pytestmark = pytest.mark.usefixtures("nothing_ahead")  # every range computed by the read that needs it


@pytest.fixture(scope="module")
def mxfp4_blob(tmp_path_factory):
    path = tmp_path_factory.mktemp("op-inputs") / "gptoss-mxfp4.gguf"
    return widths.write_blob(widths.gptoss_blob(ollama_mxfp4=True, n_expert=2), path)


def test_an_op_reading_its_input_in_pieces_reads_the_blob_once_per_range(mxfp4_blob, blob_reads):
    view = BlobViews().view(mxfp4_blob, MODEL_FILE)
    whole = [s for s in view.segments if isinstance(s, Computed) and s.op.reads_inputs_once]
    assert whole, "a whole MXFP4 stack (rows 0::1) in the view"
    seg = whole[0]
    expected = seg.op.compute(lambda t: BlobFile(mxfp4_blob).read(t.offset, t.nbytes))
    with view.open() as f:
        for lo, size in ((0, MiB), (3 * MiB + 5, MiB), (seg.size - MiB + 7, MiB - 7), (17 * 1000 + 3, 333_333)):
            blob_reads.clear()
            got = bytearray(size)
            viewbytes.fill(view.segments, f, seg.at + lo, memoryview(got))
            assert bytes(got) == expected[lo : lo + size], lo
            assert len(blob_reads) <= 2, blob_reads
            assert sum(n for _, n in blob_reads) <= size + 2 * 17, blob_reads  # (MXFP4 blocks cut at both ends)


def test_an_op_reading_its_input_at_once_reads_just_that(tmp_path, blob_reads):
    weights = np.random.default_rng(5).standard_normal(1 << 20).astype(np.float16)  # 2 MiB
    path = write_gguf(tmp_path / "f16.gguf", "llama", {}, {"w": weights})
    op = Promote.of(SourceGGUF(path).tensors["w"])
    one_op = Segments([Computed(0, op.nbytes, 0, op)], op.nbytes)
    with BlobFile(path) as f:
        for lo, size in ((0, MiB), (MiB + 2, 3 * MiB - 5)):
            blob_reads.clear()
            out = bytearray(size)
            viewbytes.fill(one_op, f, lo, memoryview(out))
            assert bytes(out) == weights.astype(np.float32).tobytes()[lo : lo + size]
            assert len(blob_reads) == 1 and blob_reads[0][1] <= size // 2 + 4, blob_reads
