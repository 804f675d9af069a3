"""DeepSeek-OCR as Ollama's converter writes it (one `deepseekocr` blob: MoE
text, SAM and CLIP encoders, projector).  Untranslated llama.cpp loads
neither view; through the mount the text loads as `deepseek2-ocr` and
generates, and the projector view (SAM under `v.sam.*`) reads an image."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as DT

from compatfs.testing import deepseekocr as writer
from compatfs.testing.store import add_model

from chat import assert_completes_and_sees, assert_refused
from compare import as_f32, kvs, tensors
from conftest import needs_fuse
from xlc_client import run_job

pytestmark = needs_fuse
MODEL = "deepseek-ocr:3b"
OCR = {"op": "chat", "messages": [{"role": "user", "content": "Free OCR."}], "n_predict": 4}

# Ollama's handler (llama/compat/llama-ollama-compat.cpp, handle_deepseekocr_clip):
# `s.` becomes `v.sam.`, then these substrings are replaced in order.
OLLAMA_CLIP_RENAMES = [
    ("v.sam.position_embd", "v.sam.pos_embd.weight"),
    (".self_attn.out_proj", ".attn_out"),
    (".self_attn.qkv_proj", ".attn_qkv"),
    (".layer_norm1", ".ln1"),
    (".layer_norm2", ".ln2"),
    (".mlp.fc1", ".ffn_up"),
    (".mlp.fc2", ".ffn_down"),
    ("v.pre_layrnorm", "v.pre_ln"),
    (".attn.proj", ".attn.out"),
    (".attn.rel_pos_h", ".attn.pos_h.weight"),
    (".attn.rel_pos_w", ".attn.pos_w.weight"),
    (".norm1", ".pre_ln"),
    (".norm2", ".post_ln"),
    ("mm.layers", "mm.model.fc"),
    ("mm.image_newline", "v.image_newline"),
    ("mm.view_seperator", "v.view_seperator"),
]


def ollama_clip_name(name: str) -> str:
    if name.startswith("s."):
        name = "v.sam." + name[2:]
    if name == "v.sam.position_embd":
        return "v.sam.pos_embd.weight"
    for old, new in OLLAMA_CLIP_RENAMES:
        name = name.replace(old, new)
    return name


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    d = tmp_path_factory.mktemp("deepseekocr")
    raw = writer.legacy_deepseekocr(d / "ocr.gguf")
    add_model(d / "store", "deepseek-ocr", raw, tag="3b")
    return d / "store", raw


def test_text_view(blob, mount_store):
    store, raw = blob
    m = mount_store(store)
    mounted = m / MODEL / "model.gguf"
    got, before, p = kvs(mounted), kvs(raw), writer.DEEPSEEK_OCR
    assert gguf.GGUFReader(mounted).fields["general.architecture"].contents() == "deepseek2-ocr"
    assert not any(k.startswith("deepseekocr.") or ".vision." in k or ".sam." in k for k in got)
    # Every text key moved; the three the converter never wrote, from the tensors.
    moved = {
        k.replace("deepseekocr.", "deepseek2-ocr.", 1): v
        for k, v in before.items()
        if not k.startswith(("deepseekocr.vision.", "deepseekocr.sam."))
    }
    assert {k: got[k] for k in moved} == moved
    assert got["deepseek2-ocr.expert_feed_forward_length"] == p["moe_ff"]
    assert got["deepseek2-ocr.expert_shared_count"] == p["n_shared"]
    assert np.isclose(got["deepseek2-ocr.attention.layer_norm_rms_epsilon"], 1e-6)
    mine, theirs = tensors(mounted), tensors(raw)
    assert sorted(mine) == sorted(n for n in theirs if not n.startswith(("s.", "v.", "mm.")))
    for name, t in mine.items():
        assert bytes(t.data) == bytes(theirs[name].data), name


def test_projector_view(blob, mount_store):
    store, raw = blob
    m = mount_store(store)
    mmproj = m / MODEL / "mmproj.gguf"
    got, p = kvs(mmproj), writer.DEEPSEEK_OCR
    assert got["clip.projector_type"] == "deepseekocr"
    want = {
        "clip.vision.block_count": p["v_n_layer"],
        "clip.vision.embedding_length": p["v_n_embd"],
        "clip.vision.attention.head_count": p["v_n_head"],
        "clip.vision.image_size": p["image_size"],
        "clip.vision.patch_size": p["patch_size"],
        "clip.vision.sam.block_count": p["sam_n_layer"],
        "clip.vision.sam.embedding_length": p["sam_n_embd"],
        "clip.vision.sam.head_count": p["sam_n_head"],
        "clip.vision.projection_dim": p["n_embd"],
        "clip.vision.window_size": 14,
        "clip.vision.feed_forward_length": 4 * p["v_n_head"],
    }
    assert {k: got.get(k) for k in want} == want
    assert not any(k.startswith(("deepseekocr.", "tokenizer.")) for k in got)
    # The names Ollama's handler gives the vision tensors, the text tensors gone.
    mine, theirs = tensors(mmproj), tensors(raw)
    vision = {ollama_clip_name(n): n for n in theirs if n.startswith(("s.", "v.", "mm."))}
    assert sorted(mine) == sorted(vision)
    promoted = {
        "v.patch_embd.weight",
        "v.sam.patch_embd.weight",
        "v.sam.neck.0.weight",
        "v.sam.neck.2.weight",
        "v.sam.net_2.weight",
        "v.sam.net_3.weight",
    }
    for name, t in mine.items():
        src = theirs[vision[name]]
        if name in promoted:
            assert src.tensor_type == DT.BF16 and t.tensor_type == DT.F32, name
            np.testing.assert_array_equal(as_f32(t), as_f32(src), err_msg=name)
        else:
            assert bytes(t.data) == bytes(src.data), name


def test_loads_and_reads_images_through_the_mount(blob, mount_store):
    store, raw = blob
    assert_refused(run_job({"model": str(raw)}), "unknown model architecture: 'deepseekocr'")
    m = mount_store(store)
    model, mmproj = str(m / MODEL / "model.gguf"), str(m / MODEL / "mmproj.gguf")
    assert not run_job({"model": model, "mmproj": str(raw)})["ok"]
    assert_completes_and_sees(model, mmproj, describe=OCR, timeout=600)
