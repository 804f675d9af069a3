"""gpt-oss as Ollama's converters wrote it: the genuine blob (converter at
f63eea3) and the two older layouts re-laid from the same weights (fused
interleaved gate/up stacks; MXFP4 as Ollama's type 4), through a real mount:
each fails in llama.cpp untranslated, and translated equals llama.cpp's own
conversion of the same weights and generates as it does.  Then the tiny
legacy writers' models, and the handler's checks of the type-4 bytes."""

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as DT

from compatfs.format.header import SourceGGUF
from compatfs.errors import GGUFError
from compatfs.handlers import gptoss
from compatfs.testing import gptoss as writers
from compatfs.testing.gguf_edit import Blob
from compatfs.testing.store import add_model
from compatfs.translate import plan

from compare import assert_same_tensors, kvs
from conftest import SHARED, needs_fuse, needs_shared
from xlc_client import run_job

BLOB = SHARED / "ollama/gpt_oss.gguf"
UPSTREAM = SHARED / "upstream/gpt_oss/model.gguf"
FORMS = ("20b", "fused", "type4")  # tags: the genuine blob, then the older layouts
# Keys Ollama's converter writes and llama.cpp's does not; llama.cpp reads
# them with the same effect as their absence (add-BOS/EOS false is the
# default for the gpt-4o pre-tokenizer; BPE reads no scores).
OLLAMA_ONLY = {
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_padding_token",
    "tokenizer.ggml.scores",
}
PROMPT = {"op": "complete", "prompt": "The quick brown fox", "n_predict": 8}


def refusal(path) -> str:
    """llama.cpp's refusal of `path`, with its log errors."""
    raw = run_job({"model": str(path)})
    assert not raw["ok"], path
    return str(raw)


@pytest.fixture(scope="module")
def blobs(tmp_path_factory) -> dict:
    """tag -> blob: the genuine one and its weights in the older layouts."""
    d = tmp_path_factory.mktemp("gptoss")
    return {
        "20b": BLOB,
        "fused": writers.relayout(BLOB, d / "fused.gguf", ollama_mxfp4=False),
        "type4": writers.relayout(BLOB, d / "type4.gguf", ollama_mxfp4=True),
    }


@pytest.fixture(scope="module")
def store(blobs, tmp_path_factory):
    store = tmp_path_factory.mktemp("gptoss-store") / "store"
    for tag, path in blobs.items():
        add_model(store, "gpt-oss", path, tag=tag)
    return store


@needs_shared
def test_older_layouts_hold_the_same_weights(blobs):
    """The re-laid blobs are what the older converters wrote: the fused stack
    interleaves gate and up rows; the type-4 blocks decode, read as the
    checkpoint lays them out (byte k: elements 2k and 2k+1), to the values of
    the genuine blob's ggml MXFP4."""
    genuine = {t.name: t for t in gguf.GGUFReader(BLOB).tensors}
    fused = {t.name: t for t in gguf.GGUFReader(blobs["fused"]).tensors}
    assert not any(n.startswith(("blk.0.ffn_gate_exps", "blk.0.ffn_up_exps")) for n in fused)
    dq = {n: gguf.quants.dequantize(np.asarray(t.data), t.tensor_type) for n, t in genuine.items() if "exps" in n}
    gate_up = gguf.quants.dequantize(np.asarray(fused["blk.0.ffn_gate_up_exps.weight"].data), DT.MXFP4)
    np.testing.assert_array_equal(gate_up[:, 0::2], dq["blk.0.ffn_gate_exps.weight"])
    np.testing.assert_array_equal(gate_up[:, 1::2], dq["blk.0.ffn_up_exps.weight"])
    bias = np.asarray(fused["blk.1.ffn_gate_up_exps.bias"].data)
    np.testing.assert_array_equal(bias[:, 1::2], dq["blk.1.ffn_up_exps.bias"])

    src = SourceGGUF(blobs["type4"])
    t = src.tensors["blk.1.ffn_down_exps.weight"]
    assert t.dtype == gptoss.OLLAMA_MXFP4 and not isinstance(t.dtype, DT)
    n_blocks = int(np.prod(t.shape)) // 32
    blocks = np.frombuffer(src.read(t.offset, n_blocks * 17), dtype=np.uint8).reshape(n_blocks, 17)
    fp4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
    values = np.empty((n_blocks, 32), dtype=np.float32)
    values[:, 0::2], values[:, 1::2] = fp4[blocks[:, 1:] & 0x0F], fp4[blocks[:, 1:] >> 4]
    values *= np.exp2(blocks[:, :1].astype(np.float32) - 127)
    np.testing.assert_array_equal(
        values.reshape(dq["blk.1.ffn_down_exps.weight"].shape), dq["blk.1.ffn_down_exps.weight"]
    )


@needs_shared
def test_untranslated_the_blobs_fail_in_llama_cpp(blobs):
    for tag, path in blobs.items():
        # Type 4 stops llama.cpp's GGUF reader before it reads the architecture.
        want = "of type 4 (DEPRECATED)" if tag == "type4" else "unknown model architecture: 'gptoss'"
        assert want in refusal(path), tag


@needs_fuse
@needs_shared
@pytest.mark.parametrize("tag", FORMS)
def test_text_view_equals_llama_cpp_conversion(store, mount_store, tag):
    """KVs as llama.cpp's conversion, bar Ollama's own keys (above); every
    tensor equal in value (MXFP4 dequantized; BF16 against llama.cpp's F16)."""
    mounted = mount_store(store) / f"gpt-oss:{tag}/model.gguf"
    got, want = kvs(mounted), kvs(UPSTREAM)
    assert set(got) - set(want) == OLLAMA_ONLY and set(want) <= set(got)
    assert {k: got[k] for k in want} == want
    assert_same_tensors(mounted, UPSTREAM)
    arch = gguf.GGUFReader(mounted).fields["general.architecture"].contents()
    assert arch == "gpt-oss"


@needs_fuse
@needs_shared
def test_loads_and_generates_as_llama_cpp_conversion(store, mount_store):
    """Every layout loads through the mount and greedily generates the tokens
    llama.cpp's conversion does."""
    m = mount_store(store)
    reference = run_job({"model": str(UPSTREAM), "actions": [PROMPT]})
    assert reference["ok"], reference.get("error")
    for tag in FORMS:
        res = run_job({"model": str(m / f"gpt-oss:{tag}/model.gguf"), "actions": [PROMPT]})
        assert res["ok"], (tag, res.get("error"))
        assert res["results"][0]["tokens"] == reference["results"][0]["tokens"], tag


@needs_fuse
def test_legacy_writers_models_load_and_generate(tmp_path, mount_store):
    store = tmp_path / "store"
    for tag, write in (("fused", writers.legacy_gptoss_fused), ("type4", writers.legacy_gptoss_mxfp4)):
        blob = write(tmp_path / f"{tag}.gguf")
        refusal(blob)
        add_model(store, "gpt-oss-tiny", blob, tag=tag)
    m = mount_store(store)
    for tag in ("fused", "type4"):
        res = run_job({"model": str(m / f"gpt-oss-tiny:{tag}/model.gguf"), "actions": [PROMPT]})
        assert res["ok"], (tag, res.get("error"))
        assert res["results"][0]["tokens_predicted"] > 0


def test_type4_bytes_are_checked_against_the_blob(tmp_path):
    """A type-4 stack whose bytes, sized from its shape, would run past the
    blob or into another tensor refuses the view, whatever the other's type
    (two at one offset were served, the same bytes twice); converted, it is
    MXFP4 of the declared shape."""
    path = writers.legacy_gptoss_mxfp4(tmp_path / "ok.gguf")
    spec = plan(gptoss.TEXT, SourceGGUF(path))
    out = {t.name: t for t in spec.tensors}
    assert out["blk.0.ffn_gate_exps.weight"].dtype == DT.MXFP4
    assert out["blk.0.ffn_gate_exps.weight"].shape == (64, 96, 4)
    assert "blk.0.ffn_gate_up_exps.weight" not in out

    def edited(change) -> SourceGGUF:
        blob = Blob.parse(path.read_bytes())
        change(blob)
        (tmp_path / "bad.gguf").write_bytes(blob.serialize())
        return SourceGGUF(tmp_path / "bad.gguf")

    fused = lambda b, i: b.tensor(f"blk.{i}.ffn_gate_up_exps.weight")  # noqa: E731
    type4 = [t for t in Blob.parse(path.read_bytes()).tensors if t.ggml_type == gptoss.OLLAMA_MXFP4]
    assert len(type4) >= 2

    def same_offset(b):  # noqa: E306
        fused(b, 1).offset = fused(b, 0).offset

    def past_the_end(b):
        fused(b, 0).offset = -(-len(b.data) // 32) * 32

    def into_a_known_type(b):
        fused(b, 0).offset = b.tensor("blk.0.ffn_gate_up_exps.bias").offset

    for change, match in (
        (same_offset, "overlaps"),
        (past_the_end, "overlaps the end of the file"),
        (into_a_known_type, "overlaps"),
    ):
        with pytest.raises(GGUFError, match=match):
            plan(gptoss.TEXT, edited(change))
    with pytest.raises(GGUFError, match="not an MXFP4 stack"):
        gptoss.OllamaMXFP4.of(type(spec.tensors[0].source)("x", (48, 192, 4), gptoss.OLLAMA_MXFP4, 0))


def test_strided_refuses_what_it_cannot_take_apart():
    from compatfs.format.header import TensorInfo
    from compatfs.translate.byte_ops import Strided

    with pytest.raises(GGUFError, match="cannot take elements 0::2"):
        Strided.of(TensorInfo("odd", (64, 5, 4), DT.F32, 0), 1, 0, 2)
    with pytest.raises(GGUFError, match="cannot be taken apart"):
        Strided.of(TensorInfo("q", (64, 4, 4), DT.Q8_0, 0), 0, 0, 2)
    t = Strided.of(TensorInfo("bias", (8, 3), DT.F32, 0), 0, 1, 2)
    data = np.arange(24, dtype="<f4")
    assert t.shape == (4, 3)
    np.testing.assert_array_equal(
        np.frombuffer(t.compute(lambda _: memoryview(data.tobytes())), "<f4"), data.reshape(3, 8)[:, 1::2].reshape(-1)
    )


def test_strided_rows_are_served_as_blob_ranges():
    """Rows of a quantized stack are taken whole: the op is a run of the
    blob's byte ranges, the same bytes as computing it."""
    from compatfs.format.header import TensorInfo
    from compatfs.translate.byte_ops import Strided

    src = TensorInfo("fused", (64, 6, 3), DT.Q8_0, 0)
    data = np.random.default_rng(0).integers(0, 256, src.nbytes, dtype=np.uint8).tobytes()
    for start in (0, 1):
        op = Strided.of(src, 1, start, 2)
        served = b"".join(
            data[r.start + k * r.stride : r.start + k * r.stride + r.unit]
            for p in op.pieces()
            for k in range(p.count)
            for r in p.parts
        )
        assert served == op.compute(lambda _: memoryview(data)) and len(served) == op.nbytes
    assert len(Strided.of(src, 1, 0, 1).pieces()) == 1


def test_type4_repack_by_range_equals_the_whole(tmp_path):
    """Any byte range of a repacked stack, computed from just the blocks it
    covers, equals that range of the whole."""
    path = writers.legacy_gptoss_mxfp4(tmp_path / "t4.gguf")
    src = SourceGGUF(path)
    fused = src.tensors["blk.1.ffn_gate_up_exps.weight"]
    reads = []

    def read(t, start, size):
        reads.append(size)
        return src.read(t.offset + start, size)

    for half in (0, 1):
        op = gptoss.OllamaMXFP4.of(fused, half, 2)
        whole = op.compute(lambda t: src.read(t.offset, t.nbytes))
        for lo, hi in ((0, op.nbytes), (5, 40), (17 * 7 + 3, 17 * 300), (op.nbytes - 20, op.nbytes)):
            reads.clear()
            assert op.compute_range(read, lo, hi) == whole[lo:hi], (half, lo, hi)
            assert sum(reads) <= 2 * (hi - lo) + 4 * 17
