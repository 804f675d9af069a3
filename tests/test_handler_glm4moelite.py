"""GLM-4.7-Flash as Ollama's converter wrote it (`glm4moelite`, f63eea3):
through the mount it is llama.cpp's `deepseek2` conversion of the same
weights less the MTP block Ollama's converter dropped, and generates as it."""
import gguf
import numpy as np

from compatfs.testing.store import add_model

from compare import as_f32, kvs, tolerance
from conftest import SHARED, needs_fuse, needs_shared
from xlc_client import run_job

pytestmark = [needs_fuse, needs_shared]

RAW = SHARED / "ollama/glm4_moe_lite_legacy.gguf"
UPSTREAM = SHARED / "upstream/glm4_moe_lite_legacy/model.gguf"

# Keys that differ, and why:
LOOSE = {
    # Ollama's converter drops the MTP layer: llama.cpp's conversion counts it
    # as one more block and says so; the view has the trunk's blocks only.
    "deepseek2.block_count", "deepseek2.nextn_predict_layers",
    # GLM-4.7-Flash routes by sigmoid, which Ollama states; llama.cpp's
    # converter leaves it to the loader, which infers sigmoid for the published
    # 47/48-layer shapes only (this 2-layer model then gets softmax).
    "deepseek2.expert_gating_func",
    # Written by llama.cpp's converter from the HF config the blob does not
    # carry (vocab_size equals the token count llama.cpp falls back to).
    "deepseek2.vocab_size",
    # Ollama-only tokenizer keys llama.cpp does not read.
    "tokenizer.ggml.scores", "tokenizer.ggml.eos_token_ids", "tokenizer.ggml.add_padding_token",
}


def nextn_block(path) -> str:
    r = gguf.GGUFReader(path)
    n = int(r.fields["deepseek2.block_count"].contents()) - int(r.fields["deepseek2.nextn_predict_layers"].contents())
    return f"blk.{n}."


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
        np.testing.assert_allclose(as_f32(m), as_f32(r), rtol=rtol, atol=2.0 ** -24 * 4, err_msg=name)

    props = {"op": "props"}
    chat = {"op": "chat", "messages": [{"role": "user", "content": "Hello, how are you today?"}], "n_predict": 8}
    r = run_job({"model": str(mounted), "actions": [props, chat, {"op": "complete", "prompt": "hello", "n_predict": 4}]})
    assert r["ok"], r
    ref_props = run_job({"model": str(UPSTREAM), "actions": [props]})["results"][0]
    assert sorted(r["results"][0]["eog_ids"]) == sorted(ref_props["eog_ids"])
    assert r["results"][1]["completion_tokens"] > 0


def test_glm4moelite_fails_untranslated():
    r = run_job({"model": str(RAW), "actions": []})
    assert not r["ok"] and "glm4moelite" in r["error"]
