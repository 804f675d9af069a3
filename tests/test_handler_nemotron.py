"""Nemotron-H as Ollama's converters write it.

* The genuine `nemotron_h_moe` fixture loads as it is: no handler claims it, the
  mount serves it byte for byte, and its tensors equal llama.cpp's conversion
  (attention Q/K up to a row permutation, see `test_fixture_...`).
* The latent-FFN / MTP form (Nemotron 3 Super) and the unified `nemotron_h_omni`
  blob (text + RADIO vision + audio) fail in llama.cpp as written, and load and
  generate through the mount (the omni blob with its projector, on an image).
"""

from __future__ import annotations

import filecmp

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as DT

from compatfs import handlers
from compatfs.format.header import SourceGGUF, TensorInfo
from compatfs.errors import GGUFError
from compatfs.handlers import nemotron
from compatfs.testing import nemotron as writers
from compatfs.testing.store import add_model
from compatfs.translate import first_claim, plan

from chat import assert_completes_and_sees, assert_refused
from compare import as_f32, assert_same_tensors, kvs, tensors
from ggufs import write_gguf
from conftest import SHARED, needs_fuse, needs_shared
from xlc_client import run_job

BLOB = SHARED / "ollama/nemotron_h.gguf"
UPSTREAM = SHARED / "upstream/nemotron_h/model.gguf"
COMPLETE = {"op": "complete", "prompt": "hello world", "n_predict": 4}


def llama_rope_order(rows: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's Q/K row order (`LlamaModel.permute`): per head,
    HF's [first halves | second halves] become interleaved pairs."""
    return rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


# -- the genuine fixture ------------------------------------------------------------------


@needs_fuse
@needs_shared
def test_fixture_is_served_unchanged_and_equals_llama_cpp_conversion(tmp_path, mount_store):
    """The current converter's form loads as it is; the mount leaves it alone.

    Its tensors equal llama.cpp's conversion in value, with one named
    equivalence: llama.cpp's converter (through its Llama base class) puts the
    rows of attention Q and K in its rope order, per head, though Nemotron-H's
    attention has no rope; Ollama's keeps HF's order.  Q and K rows permuted
    alike within each head give the same q·k products, so both files compute
    the same attention."""
    src = SourceGGUF(BLOB)
    assert first_claim(handlers.TEXT, src) is None and first_claim(handlers.CLIP, src) is None
    store = tmp_path / "store"
    add_model(store, "nemotron-3-nano", BLOB, tag="30b")
    m = mount_store(store)
    mounted = m / "nemotron-3-nano:30b/model.gguf"
    assert filecmp.cmp(mounted, BLOB, shallow=False)
    assert not (m / "nemotron-3-nano:30b/mmproj.gguf").exists()

    mine, ref = tensors(mounted), tensors(UPSTREAM)
    assert sorted(mine) == sorted(ref)
    heads = {
        "attn_q": kvs(BLOB)["nemotron_h_moe.attention.head_count"],
        "attn_k": max(kvs(BLOB)["nemotron_h_moe.attention.head_count_kv"]),
    }
    permuted = []
    for name, r in ref.items():
        a, b = as_f32(mine[name]).reshape(tuple(reversed(r.shape))), as_f32(r).reshape(tuple(reversed(r.shape)))
        assert list(mine[name].shape) == list(r.shape), name
        kind = name.split(".")[2] if name.startswith("blk.") else None
        if kind in heads:
            assert not np.allclose(a, b, rtol=2**-8)  # really another order ...
            a = llama_rope_order(a, heads[kind])  # ... and the same rows in it
            permuted.append(name)
        np.testing.assert_allclose(a, b, rtol=2**-8 * 1.01, atol=2**-22, err_msg=name)
    assert sorted(permuted) == ["blk.2.attn_k.weight", "blk.2.attn_q.weight"]

    through, direct = (run_job({"model": str(p), "actions": [COMPLETE]}) for p in (mounted, BLOB))
    assert through["ok"] and direct["ok"], (through.get("error"), direct.get("error"))
    assert through["results"][0]["tokens"] == direct["results"][0]["tokens"]
    assert through["results"][0]["tokens_predicted"] > 0


# -- the latent-FFN and MTP form ---------------------------------------------------------------


@needs_fuse
@pytest.mark.parametrize("latent, mtp", [(True, True), (False, True)])
def test_latent_and_mtp_form_loads_through_the_mount(tmp_path, mount_store, latent, mtp):
    raw = writers.legacy_nemotron_h_moe(tmp_path / "super.gguf", latent=latent, mtp=mtp)
    assert_refused(
        run_job({"model": str(raw), "actions": [COMPLETE]}),
        "ffn_down_exps.weight' has wrong shape" if latent else "wrong number of tensors",
    )

    store = tmp_path / "store"
    add_model(store, "nemotron-3-super", raw, tag="120b")
    m = mount_store(store)
    mounted = m / "nemotron-3-super:120b/model.gguf"
    got, before = kvs(mounted), kvs(raw)
    assert got.get("nemotron_h_moe.moe_latent_size") == (writers.NEMOTRON_H["latent"] if latent else None)
    assert {k: v for k, v in got.items() if k != "nemotron_h_moe.moe_latent_size"} == before

    # The MTP head is gone, the latent projections renamed, every other tensor as stored.
    mine, theirs = tensors(mounted), tensors(raw)
    renamed = {
        n.replace(".ffn_latent_in.", ".ffn_latent_down.").replace(".ffn_latent_out.", ".ffn_latent_up."): n
        for n in theirs
        if not n.startswith("mtp.")
    }
    assert sorted(mine) == sorted(renamed)
    assert any(".ffn_latent_down." in n for n in mine) == latent
    for name, t in mine.items():
        assert bytes(t.data) == bytes(theirs[renamed[name]].data), name

    res = run_job({"model": str(mounted), "actions": [COMPLETE]})
    assert res["ok"], res.get("error")
    assert res["results"][0]["tokens_predicted"] > 0


# -- the unified omni blob -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    d = tmp_path_factory.mktemp("omni")
    raw = writers.legacy_nemotron_h_omni(d / "omni.gguf")
    # The same text weights as a plain nemotron_h_moe file (the omni writer draws them first).
    text = writers.legacy_nemotron_h_moe(d / "text.gguf", latent=False, mtp=False)
    add_model(d / "store", "nemotron3", raw, tag="33b")
    return d / "store", raw, text


@needs_fuse
def test_omni_text_view_is_the_moe_text_model(omni, mount_store):
    store, raw, text = omni
    m = mount_store(store)
    mounted = m / "nemotron3:33b/model.gguf"
    got = kvs(mounted)
    assert gguf.GGUFReader(mounted).fields["general.architecture"].contents() == "nemotron_h_moe"
    assert got == kvs(text)  # text keys moved, vision and audio keys gone
    assert_same_tensors(mounted, text)  # audio, vision and projector tensors hidden
    # The writer's text layout is the one llama.cpp's loader reads: without
    # latent experts or MTP head, Ollama's form loads as it is.
    assert run_job({"model": str(text), "actions": [COMPLETE]})["ok"]


@needs_fuse
def test_omni_projector_view(omni, mount_store):
    store, raw, _ = omni
    m = mount_store(store)
    mmproj = m / "nemotron3:33b/mmproj.gguf"
    got, v = kvs(mmproj), writers.RADIO
    assert got["clip.projector_type"] == "nemotron_v2_vl"
    assert got["clip.vision.projection_dim"] == writers.NEMOTRON_H["n_embd"]
    assert got["clip.vision.block_count"] == v["v_n_layer"]
    assert not any(k.startswith(("nemotron_h_omni.", "tokenizer.", "clip.audio.")) for k in got)
    mine, theirs = tensors(mmproj), tensors(raw)
    assert not any(n.startswith(("a.", "mm.a.", "blk.")) for n in mine)
    assert {n for n in mine if n.startswith("mm.")} == {f"mm.model.mlp.{i}.weight" for i in (0, 1, 3)}
    # Q, K and V fused again, as llama.cpp's converter keeps RADIO's attn_qkv.
    for i in range(v["v_n_layer"]):
        for kind in ("weight", "bias"):
            fused = as_f32(mine[f"v.blk.{i}.attn_qkv.{kind}"])
            parts = np.concatenate([as_f32(theirs[f"v.blk.{i}.attn_{p}.{kind}"]) for p in "qkv"])
            np.testing.assert_array_equal(fused, parts)
    # The patch embedder as a conv kernel, same element order, F32.
    patch = mine["v.patch_embd.weight"]
    P, E = v["patch_size"], v["v_n_embd"]
    assert list(patch.shape) == [P, P, 3, E] and patch.tensor_type == DT.F32
    np.testing.assert_array_equal(as_f32(patch), as_f32(theirs["v.patch_embd.weight"]))
    # The position table at the input grid.
    side = v["image_size"] // P
    pos = mine["v.position_embd.weight"]
    assert list(pos.shape) == [E, side * side] and pos.tensor_type == DT.F32
    src = as_f32(theirs["v.position_embd"]).reshape(v["source_side"], v["source_side"], E)
    out = as_f32(pos).reshape(side, side, E)
    for y, x in ((0, 0), (0, side - 1), (side - 1, 0), (side - 1, side - 1)):  # corners aligned
        np.testing.assert_allclose(out[y, x], src[y and -1, x and -1], rtol=1e-6)


@needs_fuse
def test_omni_loads_and_sees_images_through_the_mount(omni, mount_store):
    store, raw, _ = omni
    # Untranslated, neither as a model nor as a projector.
    assert_refused(run_job({"model": str(raw)}), "unknown model architecture: 'nemotron_h_omni'")
    m = mount_store(store)
    model, mmproj = str(m / "nemotron3:33b/model.gguf"), str(m / "nemotron3:33b/mmproj.gguf")
    assert not run_job({"model": model, "mmproj": str(raw)})["ok"]
    assert_completes_and_sees(model, mmproj)


# -- the ops, in-process ---------------------------------------------------------------------


def _f32_tensor(name: str, values: np.ndarray) -> tuple[TensorInfo, memoryview]:
    arr = np.ascontiguousarray(values, dtype="<f4")
    return TensorInfo(name, tuple(reversed(arr.shape)), DT.F32, 0), memoryview(arr.tobytes())


def test_resample_grid_is_bilinear_with_corners_aligned():
    """A table linear in (row, column) resamples exactly: the value at output
    cell (i, j) is the source's at (i, j)·(s-1)/(t-1); the same grid is unchanged."""
    s, t, width = 8, 5, 3
    y, x = np.meshgrid(np.arange(s), np.arange(s), indexing="ij")
    table = np.stack([2.0 * y + 0.5 * x, -y + 3.0 * x + 1.0, y * 0.0 + 7.0], axis=-1).reshape(s * s, width)
    info, data = _f32_tensor("pos", table)
    op = nemotron.ResampleGrid((info,), (width, t * t), DT.F32, s, t)
    out = np.frombuffer(op.compute(lambda _: data), dtype="<f4").reshape(t, t, width)
    ys, xs = np.meshgrid(np.arange(t) * (s - 1) / (t - 1), np.arange(t) * (s - 1) / (t - 1), indexing="ij")
    want = np.stack([2.0 * ys + 0.5 * xs, -ys + 3.0 * xs + 1.0, ys * 0.0 + 7.0], axis=-1)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    same = nemotron.ResampleGrid((info,), (width, s * s), DT.F32, s, s)
    np.testing.assert_array_equal(np.frombuffer(same.compute(lambda _: data), dtype="<f4"), table.reshape(-1))


def test_ollama_detector_facts_hold_of_the_written_blobs(tmp_path):
    """Ollama's handler claims these forms: `nemotron_h_moe` with
    `blk.{0,1}.ffn_latent_in*` or `mtp.*` tensors; `nemotron_h_omni` with `v.`,
    `a.` or `mm.` tensors, loaded as `nemotron_h_moe` when it has experts.
    The current converter's form has none of them."""
    for latent, mtp in ((True, True), (False, True), (True, False)):
        src = SourceGGUF(writers.legacy_nemotron_h_moe(tmp_path / f"{latent}{mtp}.gguf", latent=latent, mtp=mtp))
        assert src.architecture == "nemotron_h_moe"
        assert any(n.startswith(("blk.0.ffn_latent_in", "blk.1.ffn_latent_in", "mtp.")) for n in src.tensors)
        assert first_claim(handlers.TEXT, src) is nemotron.TEXT_MOE
    omni = SourceGGUF(writers.legacy_nemotron_h_omni(tmp_path / "omni.gguf"))
    assert omni.architecture == "nemotron_h_omni" and omni.has_tensor_prefix("a.")
    assert omni.get("nemotron_h_omni.expert_count") > 0
    assert first_claim(handlers.TEXT, omni) is nemotron.TEXT_OMNI and first_claim(handlers.CLIP, omni) is nemotron.CLIP
    plain = SourceGGUF(writers.legacy_nemotron_h_moe(tmp_path / "plain.gguf", latent=False, mtp=False))
    assert first_claim(handlers.TEXT, plain) is None


def test_projector_refuses_a_position_table_smaller_than_the_input_grid(tmp_path, monkeypatch):
    """An input grid beyond the stored table (image_size / patch_size > the
    table's side) is refused when the view is planned, naming the tensor."""
    monkeypatch.setitem(writers.RADIO, "image_size", writers.RADIO["patch_size"] * (writers.RADIO["source_side"] + 1))
    src = SourceGGUF(writers.legacy_nemotron_h_omni(tmp_path / "omni.gguf"))
    with pytest.raises(GGUFError, match="v.position_embd"):
        plan(nemotron.CLIP, src)


def test_omni_without_experts_is_read_as_nemotron_h(tmp_path):
    """Ollama's text architecture for an omni blob: `nemotron_h_moe` with
    experts, `nemotron_h` without; the text keys follow it, the vision and
    audio keys stay out."""
    path = write_gguf(
        tmp_path / "dense-omni.gguf",
        "nemotron_h_omni",
        kvs={
            "nemotron_h_omni.block_count": 1,
            "nemotron_h_omni.expert_count": 0,
            "nemotron_h_omni.vision.block_count": 1,
            "nemotron_h_omni.audio.block_count": 1,
        },
        tensors={
            "blk.0.attn_norm.weight": np.ones(4, dtype=np.float32),
            "v.blk.0.ln1.weight": np.ones(4, dtype=np.float32),
            "a.blk.0.attn_q.weight": np.ones(4, dtype=np.float32),
        },
    )
    spec = plan(nemotron.TEXT_OMNI, SourceGGUF(path))
    keys = {k: v.decode() for k, v in spec.kvs if not k.startswith("GGUF.")}
    assert keys == {"general.architecture": "nemotron_h", "nemotron_h.block_count": 1, "nemotron_h.expert_count": 0}
    assert [t.name for t in spec.tensors] == ["blk.0.attn_norm.weight"]
