"""GLM-4.7-Flash as Ollama's converter wrote it (`glm4moelite`, f63eea3):
through the mount it is llama.cpp's `deepseek2` conversion of the same
weights less the MTP block Ollama's converter dropped, and generates as it.
Then the legacy writer's blob, which needs no ../shared, with head sizes
that tell every length key apart."""

import gguf
import numpy as np
import pytest

from compatfs.testing import glm4moelite as writer
from compatfs.testing.core import form
from compatfs.testing.store import add_model

from chat import load_failure
from compare import as_f32, assert_same_tensors, kvs, tolerance
from conftest import SHARED, needs_fuse, needs_shared, one_model_store
from xlc_client import run_job

RAW = SHARED / "ollama/glm4_moe_lite_legacy.gguf"
UPSTREAM = SHARED / "upstream/glm4_moe_lite_legacy/model.gguf"

# Keys that differ, and why:
LOOSE = {
    # Ollama's converter drops the MTP layer: llama.cpp's conversion counts it
    # as one more block and says so; the view has the trunk's blocks only.
    "deepseek2.block_count",
    "deepseek2.nextn_predict_layers",
    # GLM-4.7-Flash routes by sigmoid, which Ollama states; llama.cpp's
    # converter leaves it to the loader, which infers sigmoid for the published
    # 47/48-layer shapes only (this 2-layer model then gets softmax).
    "deepseek2.expert_gating_func",
    # Written by llama.cpp's converter from the HF config the blob does not
    # carry (vocab_size equals the token count llama.cpp falls back to).
    "deepseek2.vocab_size",
    # Ollama-only tokenizer keys llama.cpp does not read.
    "tokenizer.ggml.scores",
    "tokenizer.ggml.eos_token_ids",
    "tokenizer.ggml.add_padding_token",
}


def nextn_block(path) -> str:
    r = gguf.GGUFReader(path)
    n = int(r.fields["deepseek2.block_count"].contents()) - int(r.fields["deepseek2.nextn_predict_layers"].contents())
    return f"blk.{n}."


@needs_fuse
@needs_shared
def test_glm4moelite_matches_llama_cpp_conversion(tmp_path, mount_store):
    store = tmp_path / "store"
    add_model(store, "glm-4.7-flash", RAW, tag="q8_0")
    mounted = mount_store(store) / "glm-4.7-flash:q8_0/model.gguf"
    got, want = kvs(mounted), kvs(UPSTREAM)
    assert {k: v for k, v in got.items() if k not in LOOSE} == {k: v for k, v in want.items() if k not in LOOSE}

    # Every tensor equals llama.cpp's in value; llama.cpp's has the MTP block besides.
    mine = {t.name: t for t in gguf.GGUFReader(mounted).tensors}
    ref = {t.name: t for t in gguf.GGUFReader(UPSTREAM).tensors}
    mtp = nextn_block(UPSTREAM)
    assert sorted(mine) == sorted(n for n in ref if not n.startswith(mtp))
    for name, m in mine.items():
        r = ref[name]
        assert list(m.shape) == list(r.shape), name
        rtol = tolerance(m.tensor_type, r.tensor_type) * 1.01
        np.testing.assert_allclose(as_f32(m), as_f32(r), rtol=rtol, atol=2.0**-24 * 4, err_msg=name)

    props = {"op": "props"}
    chat = {"op": "chat", "messages": [{"role": "user", "content": "Hello, how are you today?"}], "n_predict": 8}
    r = run_job(
        {"model": str(mounted), "actions": [props, chat, {"op": "complete", "prompt": "hello", "n_predict": 4}]}
    )
    assert r["ok"], r
    ref_props = run_job({"model": str(UPSTREAM), "actions": [props]})["results"][0]
    assert sorted(r["results"][0]["eog_ids"]) == sorted(ref_props["eog_ids"])
    assert r["results"][1]["completion_tokens"] > 0


@needs_fuse
@needs_shared
def test_glm4moelite_fails_untranslated():
    r = run_job({"model": str(RAW), "actions": []})
    assert not r["ok"] and "glm4moelite" in r["error"]


# -- the legacy writer (f63eea3's form): no ../shared needed -------------------------------


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return writer.legacy_glm4moelite(tmp_path_factory.mktemp("glm4moelite-writer") / "glm4moelite.gguf")


written = one_model_store("glm-4.7-flash", "q8_0")


@needs_shared
def test_writer_writes_the_converters_form(blob):
    assert form(blob) == form(SHARED / "ollama/glm4_moe_lite_legacy.gguf")


@needs_fuse
def test_legacy_writer_is_deepseek2_through_the_mount_and_generates(blob, written, mount_store):
    mounted = mount_store(written) / "glm-4.7-flash:q8_0/model.gguf"
    got, raw = kvs(mounted), kvs(blob)
    assert gguf.GGUFReader(mounted).fields["general.architecture"].contents() == "deepseek2"
    p = writer.GLM4MOELITE
    # llama.cpp's MLA lengths: latent (absorbed) first, per head in the `_mla` keys.
    assert (got["deepseek2.attention.key_length"], got["deepseek2.attention.value_length"]) == (
        p["kv_lora_rank"] + p["qk_rope"],
        p["kv_lora_rank"],
    )
    assert (got["deepseek2.attention.key_length_mla"], got["deepseek2.attention.value_length_mla"]) == (
        p["qk_nope"] + p["qk_rope"],
        p["v_head"],
    )
    assert got["deepseek2.attention.head_count_kv"] == 1
    assert (got["deepseek2.expert_group_count"], got["deepseek2.expert_group_used_count"]) == (1, 1)
    # Every other glm4moelite key under deepseek2's prefix, unchanged.
    lengths = {
        f"attention.{k}" for k in ("key_length", "value_length", "key_length_mla", "value_length_mla", "head_count_kv")
    }
    assert all(
        got[k.replace("glm4moelite.", "deepseek2.", 1)] == v
        for k, v in raw.items()
        if k.startswith("glm4moelite.") and k.split(".", 1)[1] not in lengths
    )
    assert not [k for k in got if k.startswith("glm4moelite.")]
    # GLM's special tokens, found by their text.
    tokens = raw["tokenizer.ggml.tokens"]
    assert {k: got[f"tokenizer.ggml.{k}_token_id"] for k in ("bos", "eot", "eom", "unknown")} == {
        "bos": tokens.index("[gMASK]"),
        "eot": tokens.index("<|user|>"),
        "eom": tokens.index("<|observation|>"),
        "unknown": tokens.index("<|endoftext|>"),
    }
    assert got["tokenizer.ggml.add_bos_token"] is False
    assert_same_tensors(mounted, blob)

    chat = {"op": "chat", "messages": [{"role": "user", "content": "Hello, how are you today?"}], "n_predict": 4}
    r = run_job({"model": str(mounted), "actions": [{"op": "props"}, chat]})
    assert r["ok"], r
    props, answer = r["results"]
    assert {tokens.index(t) for t in ("<|user|>", "<|observation|>")} <= set(props["eog_ids"])
    assert answer["completion_tokens"] > 0 and answer["prompt"].startswith("[gMASK]<sop>")
    assert "glm4moelite" in load_failure(blob)
