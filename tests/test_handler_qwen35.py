"""Qwen3.5 as Ollama's converter wrote it before 9db4bdbad (one `qwen35`
blob: hybrid text model, MTP head, vision tower): through the mount,
`model.gguf` and `mmproj.gguf` equal llama.cpp's own conversion of the same
weights, and load in llama.cpp."""

import re

import gguf
import numpy as np
import pytest

from compatfs.format.header import SourceGGUF
from compatfs.handlers import qwen35
from compatfs.testing.qwen35 import legacy_qwen35_moe
from compatfs.testing.store import add_model

from compare import as_f32, assert_same_gguf, assert_same_tensors, kvs
from chat import assert_only_the_views_load
from conftest import SHARED, needs_fuse, needs_shared, one_model_store
from xlc_client import run_job

BLOB = SHARED / "ollama/qwen3_5_legacy.gguf"
UPSTREAM = SHARED / "upstream/qwen3_5_legacy"
MODEL = "qwen3.5:2b"


store = one_model_store("qwen3.5", "2b", BLOB)


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
    assert set(got) - set(want) == {
        "tokenizer.ggml.scores",
        "tokenizer.ggml.eos_token_ids",
        "tokenizer.ggml.add_padding_token",
    }
    # Every tensor: the MTP layer as block 4 with its shared tensors as
    # `nextn.*` (shared norms shifted by one), `ssm_dt` as a bias.
    assert_same_tensors(mounted, UPSTREAM / "model.gguf")


@needs_fuse
@needs_shared
def test_projector_view_equals_llama_cpp_conversion(store, mount_store):
    m = mount_store(store)
    mounted, upstream = m / MODEL / "mmproj.gguf", UPSTREAM / "mmproj.gguf"
    # Every KV and tensor: no deepstack layers, image size and feed-forward length
    # from the tensors, the text model's epsilon.
    assert_same_gguf(mounted, upstream)


@needs_fuse
@needs_shared
def test_loads_in_llama_cpp_through_the_mount(store, mount_store):
    m = mount_store(store)
    # The views complete and see; untranslated, the blob loads neither as a
    # model nor as a projector.
    assert_only_the_views_load(m / MODEL, BLOB, "dimension_sections")


# -- Qwen3.5-MoE with vision: no genuine fixture; the writer follows f63eea3's converter --


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen35moe")
    blob = legacy_qwen35_moe(d / "qwen35moe.gguf")
    add_model(d / "store", "qwen3.5", blob, tag="35b-a3b")
    return d / "store", blob


def layout(path, arch) -> tuple[set, set]:
    """KV names (arch prefix as `A`) and tensor names (numbers as `N`)."""
    r = gguf.GGUFReader(path)
    keys = {k.replace(f"{arch}.", "A.", 1) for k in r.fields if not k.startswith("GGUF.")}
    return keys, {re.sub(r"\.\d+\.", ".N.", t.name) for t in r.tensors}


@needs_shared
def test_moe_writer_writes_what_the_dense_converter_wrote(moe):
    """The MoE writer's keys and tensors are the genuine dense blob's, with
    experts for the dense feed-forward (same converter, `num_experts` > 0)."""
    keys, names = layout(moe[1], "qwen35moe")
    want_keys, want_names = layout(BLOB, "qwen35")
    # The empty deepstack list aside, which the shared writer core cannot type.
    assert want_keys - keys == {"A.vision.deepstack_visual_indexes"}
    assert keys - want_keys == {
        "A.expert_count",
        "A.expert_used_count",
        "A.expert_feed_forward_length",
        "A.expert_shared_feed_forward_length",
    }
    dense_ffn = {n for n in want_names if re.search(r"\.ffn_(gate|up|down)\.weight$", n)}
    moe_ffn = names - want_names
    assert want_names - names == dense_ffn
    assert all(re.search(r"(_exps|_shexp|gate_inp|experts\.N\.(gate|up|down)_proj)\.weight$", n) for n in moe_ffn)


@needs_fuse
def test_moe_loads_in_llama_cpp_through_the_mount(moe, mount_store):
    store, blob = moe
    m = mount_store(store)
    model, mmproj = m / "qwen3.5:35b-a3b/model.gguf", m / "qwen3.5:35b-a3b/mmproj.gguf"
    describe = {"op": "chat", "messages": [{"role": "user", "content": "Describe."}], "n_predict": 4}
    res = run_job(
        {
            "model": str(model),
            "mmproj": str(mmproj),
            "actions": [{"op": "complete", "prompt": "hello", "n_predict": 4}, {**describe, "image_png": True}],
        }
    )
    assert res["ok"], res.get("error")
    assert res["results"][0]["tokens_predicted"] > 0
    text_only = run_job({"model": str(model), "actions": [describe]})
    assert text_only["ok"], text_only.get("error")
    assert res["results"][1]["prompt_tokens"] > text_only["results"][0]["prompt_tokens"]
    assert "dimension_sections" in run_job({"model": str(blob)})["error"]
    # The MTP block's experts stacked in expert order; its shared norms as 1 + w.
    raw = {t.name: as_f32(t) for t in gguf.GGUFReader(blob).tensors}
    got = {t.name: t for t in gguf.GGUFReader(model).tensors}
    experts = sorted(n for n in raw if n.startswith("mtp.layers.0.mlp.experts.") and n.endswith("up_proj.weight"))
    stacked = got["blk.4.ffn_up_exps.weight"]
    assert list(stacked.shape) == [64, 32, len(experts)] and len(experts) == 4
    np.testing.assert_array_equal(
        as_f32(stacked),
        np.concatenate([raw[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"] for e in range(len(experts))]),
    )
    np.testing.assert_array_equal(as_f32(got["blk.4.nextn.enorm.weight"]), raw["mtp.pre_fc_norm_embedding.weight"] + 1)
    np.testing.assert_array_equal(as_f32(got["blk.4.attn_norm.weight"]), raw["mtp.layers.0.attn_norm.weight"])
    assert not any(n.startswith(("mtp.", "v.")) for n in got)


@needs_shared
def test_llama_cpp_conversions_are_left_alone():
    for path in sorted(UPSTREAM.glob("*.gguf")):
        src = SourceGGUF(path)
        assert not any(tr.claims(src) for tr in (qwen35.TEXT, qwen35.TEXT_MOE, qwen35.CLIP, qwen35.CLIP_MOE))
