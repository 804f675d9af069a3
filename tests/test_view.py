"""Views in-process: layout, alignment, GGUF v2 input, stitched reads."""

import itertools
import random
import struct

import gguf
import numpy as np

from compatfs.format.header import SourceGGUF
from compatfs.view.opcache import OpCache
from compatfs.translate import ALWAYS, Rename, Set, ToF32, Translation, plan
from compatfs.format.values import string
from compatfs.view.layout import View
from compatfs.view.segments import Cached, Computed


TR = Translation(
    "t", ALWAYS, kv=(Set("general.architecture", string("renamed")),), tensors=(Rename("b", "bee"), ToF32(("c",)))
)


def make(tmp_path, alignment=None):
    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "x")
    if alignment:
        w.add_custom_alignment(alignment)
    rng = np.random.default_rng(0)
    for name, arr in (
        ("a", rng.standard_normal(5).astype(np.float32)),
        ("b", rng.standard_normal((3, 7)).astype(np.float16)),
        ("c", rng.standard_normal((2, 9)).astype(np.float16)),
    ):
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp_path / "a.gguf"


def test_layout_honours_alignment_and_reads_back(tmp_path):
    for alignment in (None, 64):
        path = make(tmp_path, alignment)
        src = SourceGGUF(path)
        view = View.translated(src, plan(TR, src), OpCache(), key="k")
        out = tmp_path / "out.gguf"
        out.write_bytes(view.read(0, view.size))
        assert out.stat().st_size == view.size
        r, ref = gguf.GGUFReader(str(out)), gguf.GGUFReader(str(path))
        assert r.fields["general.architecture"].contents() == "renamed"
        align = alignment or 32
        got = {t.name: t for t in r.tensors}
        assert list(got) == ["a", "bee", "c"]
        for t in got.values():
            assert t.data_offset % align == 0
        want = {t.name: np.asarray(t.data) for t in ref.tensors}
        np.testing.assert_array_equal(got["a"].data, want["a"])
        np.testing.assert_array_equal(got["bee"].data, want["b"])
        assert got["c"].tensor_type == gguf.GGMLQuantizationType.F32
        np.testing.assert_array_equal(got["c"].data, want["c"].astype(np.float32))


def test_gguf_v2_input_gives_v3_output(tmp_path):
    path = make(tmp_path)
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 2)
    path.write_bytes(bytes(data))
    src = SourceGGUF(path)
    assert src.version == 2
    view = View.translated(src, plan(TR, src), OpCache(), key="k")
    assert struct.unpack("<I", view.read(0, view.size)[4:8])[0] == 3


def test_stitched_reads_equal_the_whole(tmp_path):
    src = SourceGGUF(make(tmp_path))
    view = View.translated(src, plan(TR, src), OpCache(), key="k")
    whole, rnd = view.read(0, view.size), random.Random(3)
    assert len(whole) == view.size
    for _ in range(2000):
        off, size = rnd.randrange(view.size + 8), rnd.randrange(1, 200)
        assert view.read(off, size) == whole[off : off + size]


def test_tensor_infos_follow_data_order(tmp_path):
    """A produced tensor takes its input's place in the data section, and the
    tensor infos list it there too (llama.cpp checks each offset against the
    running size in info order)."""
    from compatfs.translate.ops import Concat
    from compatfs.translate import Produce

    src = SourceGGUF(make(tmp_path))
    tr = Translation(
        "p", ALWAYS, tensors=(Produce("bb", lambda s: Concat.of(s.tensors["b"], s.tensors["b"]), consumes=("b",)),)
    )
    view = View.translated(src, plan(tr, src), OpCache(), key="k")
    out = tmp_path / "p.gguf"
    out.write_bytes(view.read(0, view.size))
    r = gguf.GGUFReader(str(out))
    assert [t.name for t in r.tensors] == ["a", "bb", "c"]
    offsets = [t.data_offset for t in r.tensors]
    assert offsets == sorted(offsets)
    want = np.asarray(gguf.GGUFReader(str(tmp_path / "a.gguf")).tensors[1].data)
    np.testing.assert_array_equal(np.asarray(r.tensors[1].data), np.concatenate([want, want]))


def _interleaved(view: View, chunk: int = 128 << 10) -> bytes:
    """The view read by two readers taking turns, one from the start and one
    from the middle, in `chunk`-sized reads."""
    half = view.size // 2 // chunk * chunk
    parts: dict[int, bytes] = {}
    cursors = [0, half]
    while cursors[0] < half or cursors[1] < view.size:
        for i, end in ((0, half), (1, view.size)):
            if cursors[i] < end:
                n = min(chunk, end - cursors[i])
                parts[cursors[i]] = view.read(cursors[i], n)
                cursors[i] += n
    return b"".join(parts[k] for k in sorted(parts))


def test_interleaved_readers_never_recompute_a_tensor(tmp_path):
    """Elementwise ops are computed per range and never enter the op cache;
    ops computed whole or in chunks are computed once a chunk, however the
    reads interleave."""
    from compatfs.testing.gemma3 import legacy_gemma3_vision
    from compatfs.view.catalog import BlobViews
    from compatfs.names import MMPROJ_FILE
    from conftest import SHARED

    blobs = [legacy_gemma3_vision(tmp_path / "g.gguf")]
    if (SHARED / "ollama/mistral3.gguf").is_file():
        blobs.append(SHARED / "ollama/mistral3.gguf")  # Q/K rope permutations: computed whole
    for blob in blobs:
        views = BlobViews()
        view = views.view(blob, MMPROJ_FILE)
        chunks = sum(-(-s.op.nbytes // s.op.chunk_bytes) for s in view.segments if isinstance(s, Cached))
        assert any(isinstance(s, (Cached, Computed)) for s in view.segments)
        got = _interleaved(view)
        assert views.op_cache.computations == chunks
        assert got == BlobViews().view(blob, MMPROJ_FILE).read(0, view.size)


def test_translated_size_is_the_laid_out_size(tmp_path):
    """What `stat` shows (counted, header not rendered) is the size of the
    view served, for every legacy writer's model and projector."""
    from compatfs.testing import LEGACY
    from compatfs.view.claims import classify, view_spec
    from compatfs.names import MMPROJ_FILE, MODEL_FILE

    seen = 0
    for name, entry in LEGACY.items():
        for make in filter(None, (entry.model, entry.projector)):
            info = classify(SourceGGUF(make(tmp_path / f"{name}-{seen}.gguf")))
            for kind in (MODEL_FILE, MMPROJ_FILE) if info.has_mmproj else (MODEL_FILE,):
                spec = view_spec(info, kind)
                if spec is not None:
                    view = View.translated(info.source, spec, OpCache(0), key=0)
                    assert View.translated_size(spec) == view.size, (name, kind)
                    seen += 1
    assert seen >= len(LEGACY)


def test_a_range_is_covered_by_its_segments_clipped(tmp_path):
    """`Segments.cover`: the segments of any range lie end to end over it
    (clipped to the file), each of the kind of the segment of the layout it
    comes from, its own fields kept and its `lo` moved with its start; the
    bytes they assemble are those of the whole file."""
    path = make(tmp_path, 64)
    src = SourceGGUF(path)
    view = View.translated(src, plan(TR, src), OpCache(), key="k")
    layout = list(view.segments)
    assert {type(s).__name__ for s in layout} >= {"HeldBytes", "BlobBytes", "ZeroBytes", "Computed"}
    whole = view.read(0, view.size)
    rng = random.Random(1)
    for _ in range(300):
        offset = rng.randrange(view.size)
        size = rng.randrange(1, view.size - offset + 40)
        covered = view.segments.cover(offset, size)
        assert covered[0].at == offset and sum(s.size for s in covered) == min(size, view.size - offset)
        for s, following in itertools.pairwise(covered):
            assert s.at + s.size == following.at
        for s in covered:
            origin = next(o for o in layout if o.at <= s.at < o.at + o.size)
            assert type(s) is type(origin) and s.at + s.size <= origin.at + origin.size
            assert s.lo - origin.lo == s.at - origin.at
            assert all(getattr(s, f) is getattr(origin, f) for f in s.__match_args__[3:])
        assert view.read(offset, size) == whole[offset : offset + size]
