"""Qwen3-Next in both forms Ollama's converter wrote (`qwen3next`, and
`qwen35moe` without M-RoPE sections): untranslated llama.cpp refuses them;
through the mount both are `qwen3next` files that load, and the two forms of
one checkpoint are the same model (tensor values, tokens, generation)."""

import gguf
import numpy as np
import pytest

from compatfs.format.header import SourceGGUF
from compatfs.testing import qwen3next
from compatfs.testing.store import add_model
from compatfs.testing.tokenizers import CORPUS
from compatfs.view.claims import classify

from compare import as_f32, kvs
from conftest import needs_fuse
from ggufs import write_gguf
from xlc_client import run_job

FORMS = {"qwen3next": qwen3next.legacy_qwen3next, "qwen35moe": qwen3next.qwen35moe_qwen3next}
JOB = [
    {"op": "tokenize", "text": CORPUS, "add_special": True},
    {"op": "complete", "prompt": "The capital of France is", "n_predict": 8, "n_probs": 3},
    {"op": "chat", "messages": [{"role": "user", "content": "Hello there!"}], "n_predict": 4},
]


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3next")
    return {name: write(d / f"{name}.gguf") for name, write in FORMS.items()}


@pytest.mark.parametrize(
    "name, error", [("qwen3next", "ssm_dt.bias"), ("qwen35moe", "qwen35moe.rope.dimension_sections")]
)
def test_untranslated_fails(blobs, name, error):
    r = run_job({"model": str(blobs[name]), "actions": []})
    assert not r["ok"] and error in r["error"], r["error"]


def test_claimed_by_qwen3next_only_without_qwen35_markers(blobs, tmp_path):
    for path in blobs.values():
        assert classify(SourceGGUF(path)).text.name == "qwen3next"
    # Ollama's handlers claim them too (llama/compat: qwen3next by its `*.ssm_dt`
    # tensors; qwen35moe by `feed_forward_length`, then fails on the sections).
    assert any(n.endswith(".ssm_dt") for n in SourceGGUF(blobs["qwen3next"]).tensors)
    assert "qwen35moe.feed_forward_length" in SourceGGUF(blobs["qwen35moe"]).kvs
    # Qwen3.5's markers (M-RoPE sections, vision tower) leave the blob to handlers/qwen35.py.
    tensors = {"blk.0.ssm_ba.weight": np.ones(4, dtype=np.float32)}
    for extra in ({"qwen35moe.rope.dimension_sections": [11, 11, 10, 0]}, {"qwen35moe.vision.block_count": 1}):
        path = write_gguf(tmp_path / "q35.gguf", "qwen35moe", kvs=extra, tensors=tensors)
        info = classify(SourceGGUF(path))
        assert info.text is None or info.text.name != "qwen3next"


@needs_fuse
def test_both_forms_load_as_the_same_qwen3next_model(blobs, tmp_path, mount_store):
    store = tmp_path / "store"
    for name, path in blobs.items():
        add_model(store, "qwen3-next", path, tag=name)
    m = mount_store(store)
    views = {name: m / f"qwen3-next:{name}/model.gguf" for name in blobs}

    a, b = (kvs(v) for v in views.values())
    assert a == b
    assert a["qwen3next.attention.head_count_kv"] == qwen3next.QWEN3NEXT["n_head_kv"]
    assert a["tokenizer.ggml.pre"] == "qwen2"
    assert not any(k.startswith("qwen35moe.") for k in a)

    ra, rb = ({t.name: t for t in gguf.GGUFReader(v).tensors} for v in views.values())
    assert sorted(ra) == sorted(rb) and "blk.0.ssm_dt.bias" in ra
    for name in ra:  # the shared-expert gate is [64] in one form, [64, 1] in the other
        np.testing.assert_array_equal(as_f32(ra[name]), as_f32(rb[name]), err_msg=name)

    results = []
    for view in views.values():
        r = run_job({"model": str(view), "actions": JOB})
        assert r["ok"], r
        results.append(r["results"])
    (tok_a, comp_a, chat_a), (tok_b, comp_b, chat_b) = results
    assert tok_a["ids"] == tok_b["ids"]
    assert comp_a["tokens"] == comp_b["tokens"] and len(comp_a["tokens"]) == 8
    # Same candidates; log-probabilities within BF16 rounding (ggml multiplies a
    # BF16 weight with BF16-rounded activations, an F32 one without).
    for step_a, step_b in zip(comp_a["top"], comp_b["top"], strict=True):
        assert [t["id"] for t in step_a] == [t["id"] for t in step_b]
        assert all(abs(x["logprob"] - y["logprob"]) < 0.02 for x, y in zip(step_a, step_b, strict=True))
    assert chat_a["completion_tokens"] > 0 and chat_a["tokens"] == chat_b["tokens"]
