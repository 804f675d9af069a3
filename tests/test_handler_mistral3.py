"""Mistral 3 (Mistral Small 3.1 style, monolithic text + Pixtral vision) as
Ollama's converter writes it: through the mount, model.gguf equals llama.cpp's
conversion of the same weights and mmproj.gguf equals its projector (with the
`[IMG_BREAK]` row its converter forgets), and both load and run."""


from compare import assert_same_tensors, kvs
from conftest import SHARED, needs_fuse, needs_shared, one_model_store
from xlc_client import run_job

pytestmark = [needs_fuse, needs_shared]

RAW = SHARED / "ollama/mistral3.gguf"
UP = SHARED / "upstream/mistral3"


store = one_model_store("mistral3", "24b", RAW)


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
    assert all(k.startswith(("mistral3.vision.", "mistral3.mm.")) or k in {
        "mistral3.image_token_index", "mistral3.spatial_merge_size", "tokenizer.ggml.scores",
    } for k in set(got) - set(want))
    assert_same_tensors(mounted, UP / "model.gguf")
    # The pre-tokenizer is what llama.cpp's conversion says: same ids.
    tok = {"actions": [{"op": "tokenize", "text": "Hello world, 12345 tokens!\n  ok"}]}
    through, reference = run_job({"model": str(mounted), **tok}), run_job({"model": str(UP / "model.gguf"), **tok})
    assert through["ok"] and reference["ok"], (through.get("error"), reference.get("error"))
    assert through["results"][0]["ids"] == reference["results"][0]["ids"]


def test_mistral3_mmproj_matches_llama_cpp_projector(store, mount_store):
    """Tensors equal the patched upstream projector: renamed, vision Q/K
    rope-permuted, and `v.token_embd.img_break` taken from the text embedding;
    the clip KVs are exactly upstream's."""
    m = mount_store(store)
    mounted, patched = m / "mistral3:24b/mmproj.gguf", UP / "mmproj.img_break_patched.gguf"
    assert kvs(mounted) == kvs(patched)
    assert_same_tensors(mounted, patched)


def test_mistral3_loads_in_llama_cpp_through_the_mount(store, mount_store):
    m = mount_store(store)
    model, mmproj = str(m / "mistral3:24b/model.gguf"), str(m / "mistral3:24b/mmproj.gguf")
    job = {"actions": [{"op": "complete", "prompt": "hello", "n_predict": 4},
                       {"op": "chat", "messages": [{"role": "user", "content": "Describe."}],
                        "image_png": True, "n_predict": 4}]}
    res = run_job({"model": model, "mmproj": mmproj, **job})
    assert res["ok"], res.get("error")
    complete, chat = res["results"]
    assert complete["ok"] and complete["tokens_predicted"] > 0
    assert chat["ok"] and chat["completion_tokens"] > 0
    # With an image the prompt is longer than without: the projector ran.
    text_only = run_job({"model": model, "actions": [
        {"op": "chat", "messages": [{"role": "user", "content": "Describe."}], "n_predict": 1}]})
    assert text_only["ok"], text_only.get("error")
    assert chat["prompt_tokens"] > text_only["results"][0]["prompt_tokens"]
    # Untranslated, the blob loads neither as a model (rope scaling assert) nor as a projector.
    bad = run_job({"model": str(RAW)})
    assert not bad["ok"] and "rope_scaling_type_train" in str(bad.get("error")) + str(bad.get("log_errors"))
    assert not run_job({"model": str(UP / "model.gguf"), "mmproj": str(RAW)})["ok"]
