"""Blobs written by Ollama's own converter (../shared/fixtures/ollama), against
llama.cpp's own conversion of the same weights (../shared/fixtures/upstream)."""

import pytest

from compatfs.testing.store import add_model

from compare import assert_same_tensors, kvs
from conftest import SHARED, needs_fuse, needs_shared
from xlc_client import run_job

pytestmark = [needs_fuse, needs_shared]


@pytest.fixture(scope="module")
def gemma3_vision(tmp_path_factory):
    store = tmp_path_factory.mktemp("shared") / "store"
    add_model(store, "gemma3v", SHARED / "ollama/gemma3_vision.gguf", tag="4b")
    return store


def test_gemma3_vision_views_equal_llama_cpp_conversion(gemma3_vision, mount_store):
    m = mount_store(gemma3_vision)
    up = SHARED / "upstream/gemma3_vision"
    assert_same_tensors(m / "gemma3v:4b/model.gguf", up / "model.gguf")
    assert_same_tensors(m / "gemma3v:4b/mmproj.gguf", up / "mmproj.gguf")


def test_gemma3_vision_loads_in_llama_cpp_through_the_mount(gemma3_vision, mount_store):
    m = mount_store(gemma3_vision)
    blob = SHARED / "ollama/gemma3_vision.gguf"
    job = {
        "actions": [
            {"op": "complete", "prompt": "hello", "n_predict": 4},
            {"op": "chat", "messages": [{"role": "user", "content": "Describe."}], "image_png": True, "n_predict": 4},
        ]
    }
    res = run_job({"model": str(m / "gemma3v:4b/model.gguf"), "mmproj": str(m / "gemma3v:4b/mmproj.gguf"), **job})
    assert res["ok"], res.get("error")
    complete, chat = res["results"]
    assert complete["ok"] and complete["tokens_predicted"] > 0
    assert chat["ok"] and chat["completion_tokens"] > 0
    # With an image the prompt is longer than without: the projector ran.
    text_only = run_job(
        {
            "model": str(m / "gemma3v:4b/model.gguf"),
            "actions": [{"op": "chat", "messages": [{"role": "user", "content": "Describe."}], "n_predict": 1}],
        }
    )
    assert chat["prompt_tokens"] > text_only["results"][0]["prompt_tokens"]
    # Untranslated, the same blob loads neither as a model nor as a projector.
    assert not run_job({"model": str(blob)})["ok"]
    assert not run_job({"model": str(SHARED / "upstream/gemma3_vision/model.gguf"), "mmproj": str(blob)})["ok"]


def test_gemma3_text_matches_llama_cpp_conversion(tmp_path, mount_store):
    """Ollama's current gemma3 files load as they are, but lack the RMS epsilon
    and `add_space_prefix` and type the image markers as text; through the
    mount every KV llama.cpp's conversion has is there with its value (bar the
    scores and types of other added tokens), tensors equal, and text
    tokenizes the same."""
    store = tmp_path / "store"
    add_model(store, "gemma3", SHARED / "ollama/gemma3.gguf", tag="1b")
    m = mount_store(store)
    mounted, upstream, raw = (
        m / "gemma3:1b/model.gguf",
        SHARED / "upstream/gemma3/model.gguf",
        SHARED / "ollama/gemma3.gguf",
    )
    got, want = kvs(mounted), kvs(upstream)
    loose = {"tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.add_sep_token"}
    assert {k: got.get(k) for k in want if k not in loose} == {k: v for k, v in want.items() if k not in loose}
    tokens, raw_types = want["tokenizer.ggml.tokens"], kvs(raw)["tokenizer.ggml.token_type"]
    for marker in ("<start_of_image>", "<end_of_image>"):
        i = tokens.index(marker)
        assert got["tokenizer.ggml.token_type"][i] == want["tokenizer.ggml.token_type"][i] != raw_types[i]
    assert_same_tensors(mounted, upstream)
    tok = {
        "actions": [{"op": "tokenize", "text": "hello world"}, {"op": "complete", "prompt": "hello", "n_predict": 4}]
    }
    through, reference, untranslated = (run_job({"model": str(p), **tok}) for p in (mounted, upstream, raw))
    assert through["ok"] and reference["ok"] and untranslated["ok"]
    assert through["results"][0]["ids"] == reference["results"][0]["ids"] != untranslated["results"][0]["ids"]
    assert through["results"][1]["tokens_predicted"] == 4
