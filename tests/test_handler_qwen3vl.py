"""Qwen3-VL as Ollama's converter wrote it before 9db4bdbad (one `qwen3vl`
blob, text and vision): through the mount, `model.gguf` and `mmproj.gguf`
equal llama.cpp's own conversion of the same weights, and load in llama.cpp."""

import re

import gguf
import pytest
from gguf import GGMLQuantizationType as DT
from gguf import GGUFValueType as VT

from compatfs.format.header import SourceGGUF, TensorInfo
from compatfs.errors import GGUFError
from compatfs.format.values import array, u32
from compatfs.handlers import qwen3vl
from compatfs.handlers.qwen3vl import FrameOfPatchEmbedding, MRopeSections, deepstack_layers
from compatfs.testing.qwen3vl import legacy_qwen3vl_moe
from compatfs.testing.store import add_model

from compare import assert_same_gguf, assert_same_tensors, kvs
from chat import assert_only_the_views_load
from conftest import SHARED, needs_fuse, needs_shared, one_model_store
from xlc_client import run_job

BLOB = SHARED / "ollama/qwen3_vl_legacy.gguf"
UPSTREAM = SHARED / "upstream/qwen3_vl_legacy"
MODEL = "qwen3-vl:2b"
SECTIONS = "qwen3vl.rope.dimension_sections"


store = one_model_store("qwen3-vl", "2b", BLOB)


@needs_fuse
@needs_shared
def test_text_view_equals_llama_cpp_conversion(store, mount_store):
    m = mount_store(store)
    mounted = m / MODEL / "model.gguf"
    got, want, raw = kvs(mounted), kvs(UPSTREAM / "model.gguf"), kvs(BLOB)
    # The M-RoPE sections are not in the blob (the checkpoint's were [4, 2, 2]
    # for head size 16); they are derived from the head size in the published
    # models' proportions, so equality with the reference is not the claim:
    # what llama.cpp needs is 4 sections covering the head's rotary pairs.
    assert SECTIONS not in raw
    assert len(got[SECTIONS]) == 4 and sum(got[SECTIONS]) == got["qwen3vl.attention.key_length"] // 2
    # Every other KV of llama.cpp's conversion, with its value: deepstack
    # layer count, BOS and add-BOS, FIM markers control, filler rows unused.
    assert {k: got.get(k) for k in want if k != SECTIONS} == {k: v for k, v in want.items() if k != SECTIONS}
    # Beyond them only Ollama keys llama.cpp does not read for a BPE vocabulary.
    assert set(got) - set(want) == {
        "tokenizer.ggml.scores",
        "tokenizer.ggml.eos_token_ids",
        "tokenizer.ggml.add_padding_token",
    }
    assert not any(k.startswith("qwen3vl.vision.") for k in got)
    assert_same_tensors(mounted, UPSTREAM / "model.gguf")


@needs_fuse
@needs_shared
def test_projector_view_equals_llama_cpp_conversion(store, mount_store):
    m = mount_store(store)
    mounted, upstream = m / MODEL / "mmproj.gguf", UPSTREAM / "mmproj.gguf"
    # Every KV: deepstack mask, image size and feed-forward length from the
    # tensors, the text model's epsilon.  Every tensor: QKV merged, patch
    # embedding split per frame, deepstack mergers numbered by the block
    # they follow, position table F32.
    assert_same_gguf(mounted, upstream)


@needs_fuse
@needs_shared
def test_loads_in_llama_cpp_through_the_mount(store, mount_store):
    m = mount_store(store)
    # The views complete and see; untranslated, the blob loads neither as a
    # model nor as a projector.
    assert_only_the_views_load(m / MODEL, BLOB, "dimension_sections")


def test_mrope_sections_follow_the_head_size():
    """The published 128-wide heads get Qwen3-VL's [24, 20, 20, 0]; other
    sizes the same proportions, always covering head/2 rotary pairs."""
    edit = MRopeSections("s", "norm")

    class Src:
        def __init__(self, n):
            self.tensors = {"norm": TensorInfo("norm", (n,), DT.F32, 0)}

    got = {}
    for head in (128, 64, 16, 256):
        kv = {}
        edit.apply(kv, Src(head))
        got[head] = list(kv["s"].decode())
        assert sum(got[head]) == head // 2 and got[head][3] == 0
    assert got[128] == [24, 20, 20, 0]
    kv = {}
    edit.apply(kv, Src(15))
    assert kv == {}


def test_patch_embedding_frame_shape_is_checked():
    conv = TensorInfo("v.patch_embed.weight", (16, 16, 2, 192), DT.F16, 0)
    assert FrameOfPatchEmbedding.of(conv, 64, 1).shape == (16, 16, 3, 64)
    with pytest.raises(GGUFError, match="v.patch_embed.weight"):
        FrameOfPatchEmbedding.of(conv, 100, 0)
    with pytest.raises(GGUFError, match="v.patch_embed.weight"):
        FrameOfPatchEmbedding.of(conv, 64, 2)


# -- Qwen3-VL-MoE: no genuine fixture; the writer follows f63eea3's converter ----------


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3vlmoe")
    blob = legacy_qwen3vl_moe(d / "qwen3vlmoe.gguf")
    add_model(d / "store", "qwen3-vl", blob, tag="30b-a3b")
    return d / "store", blob


def shapes(path, arch) -> tuple[dict, dict]:
    """KV names (arch prefix as `A`) and tensor names (block numbers as `N`) -> shape rank."""
    r = gguf.GGUFReader(path)
    keys = {k.replace(f"{arch}.", "A.", 1) for k in r.fields if not k.startswith("GGUF.")}
    names = {re.sub(r"\.\d+\.", ".N.", t.name): len(t.shape) for t in r.tensors}
    return keys, names


@needs_shared
def test_moe_writer_writes_what_the_dense_converter_wrote(moe):
    """The MoE writer's keys and tensors are the genuine dense blob's, plus
    the experts (same converter, `num_experts` > 0)."""
    keys, names = shapes(moe[1], "qwen3vlmoe")
    want_keys, want_names = shapes(BLOB, "qwen3vl")
    assert keys - want_keys == {"A.expert_count", "A.expert_used_count", "A.norm_top_k_prob"}
    assert want_keys <= keys
    moe_only = {n for n in names if "exps" in n or "gate_inp" in n}
    assert {n: r for n, r in names.items() if n not in moe_only} == {
        n: r for n, r in want_names.items() if "ffn_gate." not in n and "ffn_up." not in n and "ffn_down." not in n
    }


@needs_fuse
def test_moe_loads_in_llama_cpp_through_the_mount(moe, mount_store):
    store, blob = moe
    m = mount_store(store)
    model, mmproj = str(m / "qwen3-vl:30b-a3b/model.gguf"), str(m / "qwen3-vl:30b-a3b/mmproj.gguf")
    describe = {"op": "chat", "messages": [{"role": "user", "content": "Describe."}], "n_predict": 4}
    res = run_job(
        {
            "model": model,
            "mmproj": mmproj,
            "actions": [{"op": "complete", "prompt": "hello", "n_predict": 4}, {**describe, "image_png": True}],
        }
    )
    assert res["ok"], res.get("error")
    assert res["results"][0]["tokens_predicted"] > 0
    text_only = run_job({"model": model, "actions": [describe]})
    assert text_only["ok"], text_only.get("error")
    assert res["results"][1]["prompt_tokens"] > text_only["results"][0]["prompt_tokens"]
    # The experts' width, which the blob does not state, from their tensors.
    gate = next(t for t in gguf.GGUFReader(blob).tensors if t.name == "blk.0.ffn_gate_exps.weight")
    assert kvs(model)["qwen3vlmoe.expert_feed_forward_length"] == gate.shape[1]
    projector = {t.name for t in gguf.GGUFReader(mmproj).tensors}
    assert {"v.deepstack.1.fc1.weight", "v.deepstack.2.norm.bias"} <= projector
    assert "dimension_sections" in run_job({"model": str(blob)})["error"]


class Blob:
    """The parts of a parsed blob the edits read: KVs and tensor shapes."""

    def __init__(self, kvs: dict, tensors: dict):
        self.kvs = kvs
        self.tensors = {n: TensorInfo(n, shape, dtype, 0) for n, (shape, dtype) in tensors.items()}

    def get(self, key, default=None):
        return self.kvs[key].decode() if key in self.kvs else default

    def block_ids(self, prefix):
        return frozenset(int(n[len(prefix) :].split(".")[0]) for n in self.tensors if n.startswith(prefix))


def test_deepstack_indexes_must_place_every_merger():
    mergers = {f"v.deepstack_merger.{j}.norm.weight": ((256,), DT.F32) for j in range(2)}
    blocks = {"qwen3vl.vision.block_count": u32(4)}
    for indexes, ok in (([1, 2], True), ([1], False), ([1, 1], False), ([1, 4], False), ([], False)):
        blob = Blob({**blocks, "i": array(VT.INT32, indexes)}, mergers)
        if ok:
            assert deepstack_layers(blob, "i", "qwen3vl.vision.block_count") == indexes
        else:
            with pytest.raises(GGUFError, match="deepstack"):
                deepstack_layers(blob, "i", "qwen3vl.vision.block_count")


@needs_shared
def test_llama_cpp_conversions_are_left_alone():
    for path in sorted(UPSTREAM.glob("*.gguf")):
        src = SourceGGUF(path)
        assert not any(tr.claims(src) for tr in (qwen3vl.TEXT, qwen3vl.TEXT_MOE, qwen3vl.CLIP, qwen3vl.CLIP_MOE))
