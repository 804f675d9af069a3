"""Gemma 4 MoE in the layout of an older Ollama converter (c29932c63: expert
gate and up stacks apart, the per-expert scale under the router's name),
written by `compatfs.testing.gemma4`: untranslated llama.cpp refuses it;
through a real mount the text view has llama.cpp's per-expert fused
`ffn_gate_up_exps` and `ffn_down_exps.scale`, and the model and its
projector load and generate."""

import numpy as np
import pytest

from compatfs.testing.gemma4 import GEMMA4_MOE, legacy_gemma4_moe
from compatfs.testing.store import add_model

from compare import tensors
from conftest import needs_fuse
from xlc_client import run_job

CHAT = {"op": "chat", "messages": [{"role": "user", "content": "Describe."}], "n_predict": 4}


def refusal(path) -> str:
    """llama.cpp's refusal of `path`, with its log errors."""
    raw = run_job({"model": str(path)})
    assert not raw["ok"], path
    return str(raw)


@pytest.fixture(scope="module")
def blob(tmp_path_factory):
    return legacy_gemma4_moe(tmp_path_factory.mktemp("gemma4moe") / "moe.gguf")


@pytest.fixture(scope="module")
def store(blob, tmp_path_factory):
    store = tmp_path_factory.mktemp("gemma4moe-store") / "store"
    add_model(store, "gemma4", blob, tag="26b")
    return store


def test_untranslated_llama_cpp_refuses_it(blob):
    assert "wrong number of tensors" in refusal(blob)


@needs_fuse
def test_experts_fused_per_expert(blob, store, mount_store):
    """Expert e's rows of `ffn_gate_up_exps` are its gate rows, then its up
    rows (bytes as stored); the per-expert scale is `ffn_down_exps.scale`."""
    m = mount_store(store)
    raw, got = tensors(blob), tensors(m / "gemma4:26b/model.gguf")
    n_layer, n_expert, n_ff = GEMMA4_MOE["n_layer"], GEMMA4_MOE["n_expert"], GEMMA4_MOE["n_ff_exp"]
    assert not any(".ffn_gate_exps." in n or ".ffn_up_exps." in n or "per_expert_scale" in n for n in got)
    for i in range(n_layer):
        b = f"blk.{i}."
        fused = got[b + "ffn_gate_up_exps.weight"]
        assert fused.tensor_type == raw[b + "ffn_gate_exps.weight"].tensor_type
        assert [int(d) for d in fused.shape] == [GEMMA4_MOE["n_embd"], 2 * n_ff, n_expert]
        gate, up = (np.asarray(raw[b + f"ffn_{p}_exps.weight"].data) for p in ("gate", "up"))
        want = np.concatenate([gate, up], axis=1)  # numpy [expert, row, col]
        np.testing.assert_array_equal(np.asarray(fused.data).reshape(want.shape), want)
        np.testing.assert_array_equal(
            np.asarray(got[b + "ffn_down_exps.scale"].data), np.asarray(raw[b + "ffn_gate_inp.per_expert_scale"].data)
        )


@needs_fuse
def test_loads_and_generates_through_the_mount(store, mount_store):
    m = mount_store(store)
    model, mmproj = m / "gemma4:26b/model.gguf", m / "gemma4:26b/mmproj.gguf"
    res = run_job(
        {
            "model": str(model),
            "mmproj": str(mmproj),
            "actions": [{"op": "complete", "prompt": "hello", "n_predict": 4}, {**CHAT, "image_png": True}],
        }
    )
    assert res["ok"], res.get("error")
    complete, chat = res["results"]
    assert complete["tokens_predicted"] > 0 and chat["completion_tokens"] > 0
    text_only = run_job({"model": str(model), "actions": [CHAT]})
    assert text_only["ok"], text_only.get("error")
    assert chat["prompt_tokens"] > text_only["results"][0]["prompt_tokens"]
