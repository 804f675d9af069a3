"""Mistral 3 (Mistral Small 3.1 style, monolithic text + Pixtral vision) as
Ollama's converter writes it: through the mount, model.gguf equals llama.cpp's
conversion of the same weights and mmproj.gguf equals its projector (with the
`[IMG_BREAK]` row its converter forgets), and both load and run.  Then the
legacy writer's blobs (f63eea3's rope key names), which need no ../shared."""

import gguf
import numpy as np
import pytest

from compatfs.testing import mistral3 as writer
from compatfs.testing.core import form
from compatfs.testing.store import add_model

from chat import assert_completes_and_sees, load_failure
from compare import as_f32, assert_same_tensors, kvs, tensors
from conftest import SHARED, needs_fuse, needs_shared, one_model_store
from xlc_client import run_job

RAW = SHARED / "ollama/mistral3.gguf"
UP = SHARED / "upstream/mistral3"


store = one_model_store("mistral3", "24b", RAW)


@needs_fuse
@needs_shared
def test_mistral3_text_matches_llama_cpp_conversion(store, mount_store):
    m = mount_store(store)
    mounted = m / "mistral3:24b/model.gguf"
    got, want, raw = kvs(mounted), kvs(UP / "model.gguf"), kvs(RAW)
    # Not written by Ollama; llama.cpp defaults it to false.
    loose = {"tokenizer.ggml.add_sep_token"}
    assert {k: got.get(k) for k in want if k not in loose} == {k: v for k, v in want.items() if k not in loose}
    assert got["tokenizer.ggml.pre"] == "tekken" != raw["tokenizer.ggml.pre"]
    # The empty rope-scaling type (and its zero factor and betas) is gone, as upstream has none.
    assert raw["mistral3.rope.scaling.type"] == ""
    assert not [k for k in got if k.startswith("mistral3.rope.scaling.")]
    # What remains beyond upstream is Ollama's multimodal metadata (and BPE
    # scores), which llama.cpp's text loader does not read.
    assert all(
        k.startswith(("mistral3.vision.", "mistral3.mm."))
        or k in {"mistral3.image_token_index", "mistral3.spatial_merge_size", "tokenizer.ggml.scores"}
        for k in set(got) - set(want)
    )
    assert_same_tensors(mounted, UP / "model.gguf")
    # The pre-tokenizer is what llama.cpp's conversion says: same ids.
    tok = {"actions": [{"op": "tokenize", "text": "Hello world, 12345 tokens!\n  ok"}]}
    through, reference = run_job({"model": str(mounted), **tok}), run_job({"model": str(UP / "model.gguf"), **tok})
    assert through["ok"] and reference["ok"], (through.get("error"), reference.get("error"))
    assert through["results"][0]["ids"] == reference["results"][0]["ids"]


@needs_fuse
@needs_shared
def test_mistral3_mmproj_matches_llama_cpp_projector(store, mount_store):
    """Tensors equal the patched upstream projector: renamed, vision Q/K
    rope-permuted, and `v.token_embd.img_break` taken from the text embedding;
    the clip KVs are exactly upstream's."""
    m = mount_store(store)
    mounted, patched = m / "mistral3:24b/mmproj.gguf", UP / "mmproj.img_break_patched.gguf"
    assert kvs(mounted) == kvs(patched)
    assert_same_tensors(mounted, patched)


@needs_fuse
@needs_shared
def test_mistral3_loads_in_llama_cpp_through_the_mount(store, mount_store):
    m = mount_store(store)
    model, mmproj = str(m / "mistral3:24b/model.gguf"), str(m / "mistral3:24b/mmproj.gguf")
    job = {
        "actions": [
            {"op": "complete", "prompt": "hello", "n_predict": 4},
            {"op": "chat", "messages": [{"role": "user", "content": "Describe."}], "image_png": True, "n_predict": 4},
        ]
    }
    res = run_job({"model": model, "mmproj": mmproj, **job})
    assert res["ok"], res.get("error")
    complete, chat = res["results"]
    assert complete["ok"] and complete["tokens_predicted"] > 0
    assert chat["ok"] and chat["completion_tokens"] > 0
    # With an image the prompt is longer than without: the projector ran.
    text_only = run_job(
        {
            "model": model,
            "actions": [{"op": "chat", "messages": [{"role": "user", "content": "Describe."}], "n_predict": 1}],
        }
    )
    assert text_only["ok"], text_only.get("error")
    assert chat["prompt_tokens"] > text_only["results"][0]["prompt_tokens"]
    # Untranslated, the blob loads neither as a model (rope scaling assert) nor as a projector.
    bad = run_job({"model": str(RAW)})
    assert not bad["ok"] and "rope_scaling_type_train" in str(bad.get("error")) + str(bad.get("log_errors"))
    assert not run_job({"model": str(UP / "model.gguf"), "mmproj": str(RAW)})["ok"]


# -- the legacy writer (f63eea3's form): no ../shared needed -------------------------------


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A store of Mistral Small 3.1 (no rope scaling) and Ministral 3 (YaRN), and their blobs."""
    d = tmp_path_factory.mktemp("mistral3-writer")
    blobs = {
        "small": writer.legacy_mistral3(d / "small.gguf"),
        "ministral": writer.legacy_mistral3(d / "ministral.gguf", rope_scaling=True),
    }
    for tag, path in blobs.items():
        add_model(d / "store", "mistral3", path, tag=tag)
    return d / "store", blobs


@needs_shared
def test_writer_writes_the_converters_form(written):
    """The fixture's form (fb30760), but for the two YaRN keys' older names."""
    keys, names = form(written[1]["small"])
    want_keys, want_names = form(RAW)
    assert names == want_names
    older = {f"mistral3.rope.scaling.{k}": f"mistral3.rope.scaling.yarn_{k}" for k in ("beta_fast", "beta_slow")}
    assert {older.get(k, k): v for k, v in keys.items()} == want_keys


def rope_permuted(t, n_head: int) -> bytes:
    """llama.cpp's converter's rope row order of `t` (HF order), from numpy."""
    rows, cols = (int(x) for x in reversed(t.shape))
    arr = np.asarray(t.data).reshape(rows, cols)
    return np.ascontiguousarray(arr.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2)).tobytes()


@needs_fuse
def test_legacy_writer_translates_loads_and_sees(written, mount_store):
    store, blobs = written
    m = mount_store(store)
    small, raw = m / "mistral3:small", kvs(blobs["small"])
    got = kvs(small / "model.gguf")
    # The empty rope scaling (type "", zeros) is gone; the pre-tokenizer is Tekken's.
    assert raw["mistral3.rope.scaling.type"] == "" and raw["mistral3.rope.scaling.beta_fast"] == 0
    assert got == {
        **{k: v for k, v in raw.items() if not k.startswith("mistral3.rope.scaling.")},
        "tokenizer.ggml.pre": "tekken",
    }
    text, blob = tensors(small / "model.gguf"), tensors(blobs["small"])
    assert sorted(text) == sorted(n for n in blob if not n.startswith(("v.", "mm.")))

    # The projector: Pixtral's clip keys, llama.cpp's names, vision Q/K in
    # rope order, and the [IMG_BREAK] row of the text embedding.
    proj = gguf.GGUFReader(small / "mmproj.gguf")
    assert proj.fields["clip.projector_type"].contents() == "pixtral"
    assert proj.fields["clip.vision.spatial_merge_size"].contents() == writer.MISTRAL3["merge"]
    vision = tensors(small / "mmproj.gguf")
    renamed = {
        "v.patch_conv.weight": "v.patch_embd.weight",
        "v.encoder_norm.weight": "v.pre_ln.weight",
        "mm.linear_1.weight": "mm.1.weight",
        "mm.linear_2.weight": "mm.2.weight",
        "mm.patch_merger.merging_layer.weight": "mm.patch_merger.weight",
        "mm.norm.weight": "mm.input_norm.weight",
        "v.blk.0.attn_output.weight": "v.blk.0.attn_out.weight",
        "v.blk.0.attn_norm.weight": "v.blk.0.ln1.weight",
        "v.blk.0.ffn_norm.weight": "v.blk.0.ln2.weight",
    }
    for old, new in renamed.items():
        assert bytes(vision[new].data) == bytes(blob[old].data), new
    heads = writer.MISTRAL3["v_n_head"]
    for i in range(writer.MISTRAL3["v_n_layer"]):
        for x in ("attn_q", "attn_k"):
            name = f"v.blk.{i}.{x}.weight"
            assert bytes(vision[name].data) == rope_permuted(blob[name], heads) != bytes(blob[name].data), name
    row = writer.mistral3_tokens()[0].index("[IMG_BREAK]")
    embd = as_f32(blob["token_embd.weight"]).reshape(-1, writer.MISTRAL3["n_embd"])
    np.testing.assert_array_equal(as_f32(vision["v.token_embd.img_break"]), embd[row])

    # Ministral 3's YaRN under llama.cpp's names.
    yarn = kvs(m / "mistral3:ministral/model.gguf")
    r = writer.MINISTRAL3_ROPE
    assert yarn["mistral3.rope.scaling.type"] == "yarn"
    assert {
        k: yarn[f"mistral3.{k}"]
        for k in (
            "rope.scaling.yarn_beta_fast",
            "rope.scaling.yarn_beta_slow",
            "rope.scaling.yarn_log_multiplier",
            "attention.temperature_scale",
        )
    } == pytest.approx(
        {
            "rope.scaling.yarn_beta_fast": r["beta_fast"],
            "rope.scaling.yarn_beta_slow": r["beta_slow"],
            "rope.scaling.yarn_log_multiplier": r["mscale_all_dim"],
            "attention.temperature_scale": r["llama_4_scaling_beta"],
        }
    )

    assert_completes_and_sees(str(small / "model.gguf"), str(small / "mmproj.gguf"))
    assert "rope_scaling_type_train" in load_failure(blobs["small"])
