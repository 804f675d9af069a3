"""Qwen3.5 as Ollama's converter wrote it before 9db4bdbad (one `qwen35`
blob: hybrid text model, MTP head, vision tower): through the mount,
`model.gguf` and `mmproj.gguf` equal llama.cpp's own conversion of the same
weights, and load in llama.cpp."""
import gguf
import pytest
from gguf import GGMLQuantizationType as DT
from gguf import GGUFValueType as VT

from compatfs.gguf_source import TensorInfo
from compatfs.gguf_values import GGUFError, array, u32
from compatfs.handlers.qwen35 import PadSections, PerLayerToMax, stack
from compatfs.testing.store import add_model

from compare import assert_same_tensors, kvs
from conftest import SHARED, needs_fuse, needs_shared
from xlc_client import run_job

BLOB = SHARED / "ollama/qwen3_5_legacy.gguf"
UPSTREAM = SHARED / "upstream/qwen3_5_legacy"
MODEL = "qwen3.5:2b"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen35") / "store"
    add_model(root, "qwen3.5", BLOB, tag="2b")
    return root


@needs_fuse
@needs_shared
def test_text_view_equals_llama_cpp_conversion(store, mount_store):
    m = mount_store(store)
    mounted = m / MODEL / "model.gguf"
    got, want = kvs(mounted), kvs(UPSTREAM / "model.gguf")
    # Every KV of llama.cpp's conversion, with its value: 4 rope sections,
    # one KV head count, the MTP layer counted as a block and as the nextn
    # layer, the recurrent layers, BOS and add-BOS, FIM markers control,
    # filler rows unused.
    assert {k: got.get(k) for k in want} == want
    # Beyond them only Ollama keys llama.cpp does not read for a BPE vocabulary.
    assert set(got) - set(want) == {"tokenizer.ggml.scores", "tokenizer.ggml.eos_token_ids",
                                    "tokenizer.ggml.add_padding_token"}
    # Every tensor: the MTP layer as block 4 with its shared tensors as
    # `nextn.*` (shared norms shifted by one), `ssm_dt` as a bias.
    assert_same_tensors(mounted, UPSTREAM / "model.gguf")


@needs_fuse
@needs_shared
def test_projector_view_equals_llama_cpp_conversion(store, mount_store):
    m = mount_store(store)
    mounted, upstream = m / MODEL / "mmproj.gguf", UPSTREAM / "mmproj.gguf"
    # All of them: no deepstack layers, image size and feed-forward length
    # from the tensors, the text model's epsilon.
    assert kvs(mounted) == kvs(upstream)
    assert_same_tensors(mounted, upstream)
    dtypes = {t.name: t.tensor_type for t in gguf.GGUFReader(mounted).tensors}
    assert dtypes == {t.name: t.tensor_type for t in gguf.GGUFReader(upstream).tensors}


@needs_fuse
@needs_shared
def test_loads_in_llama_cpp_through_the_mount(store, mount_store):
    m = mount_store(store)
    model, mmproj = str(m / MODEL / "model.gguf"), str(m / MODEL / "mmproj.gguf")
    describe = {"op": "chat", "messages": [{"role": "user", "content": "Describe."}], "n_predict": 4}
    res = run_job({"model": model, "mmproj": mmproj, "actions": [
        {"op": "complete", "prompt": "hello", "n_predict": 4},
        {**describe, "image_png": True},
    ]})
    assert res["ok"], res.get("error")
    complete, chat = res["results"]
    assert complete["tokens_predicted"] > 0
    assert chat["completion_tokens"] > 0
    text_only = run_job({"model": model, "actions": [describe]})
    assert text_only["ok"], text_only.get("error")
    assert chat["prompt_tokens"] > text_only["results"][0]["prompt_tokens"]
    # Untranslated, the blob loads neither as a model nor as a projector.
    assert "dimension_sections" in run_job({"model": str(BLOB)})["error"]
    assert not run_job({"model": str(UPSTREAM / "model.gguf"), "mmproj": str(BLOB)})["ok"]


def test_sections_padded_and_kv_heads_collapsed():
    kv = {"s": array(VT.INT32, [2, 1, 1]), "h": array(VT.UINT32, [0, 0, 0, 2])}
    PadSections("s", 4).apply(kv, None)
    PerLayerToMax("h").apply(kv, None)
    assert list(kv["s"].decode()) == [2, 1, 1, 0] and kv["h"] == u32(2)
    # Already four sections, or no attention layer at all: left alone.
    kv = {"s": array(VT.INT32, [11, 11, 10, 0]), "h": array(VT.UINT32, [0, 0])}
    before = dict(kv)
    PadSections("s", 4).apply(kv, None)
    PerLayerToMax("h").apply(kv, None)
    assert kv == before


def test_experts_stack_along_a_new_axis():
    experts = [TensorInfo(f"e{i}", (64, 32), DT.BF16, 100 * i) for i in range(3)]
    op = stack(experts)
    assert op.shape == (64, 32, 3) and op.dtype == DT.BF16
    assert stack([*experts[:2], TensorInfo("q", (64, 32), DT.Q8_0, 0)]).dtype == DT.F32
    with pytest.raises(GGUFError, match="e0"):
        stack([experts[0], TensorInfo("odd", (64, 16), DT.BF16, 0)])
