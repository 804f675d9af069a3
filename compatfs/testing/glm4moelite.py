"""GLM-4.7-Flash blobs as Ollama's converter wrote them (the legacy form of
`handlers/glm4moelite.py`), shaped like
../shared/fixtures/ollama/glm4_moe_lite_legacy.gguf.

* `convert/convert_glm4moelite.go` at f63eea3d2 (2026-05-24; the MLA form
  since 64737330a, until 9db4bdbad wrote `deepseek2`): architecture
  `glm4moelite`, `general.type` "model"; `attention.key_length` the per-head
  qk_nope + rope dims and `value_length` v_head_dim, `key_length_mla`
  kv_lora_rank + rope dims and `value_length_mla` kv_lora_rank; the
  config's KV heads; no expert-group keys; sigmoid gating (2);
  `kv_b_proj` split per head into `attn_k_b` (ggml [qk_nope, kv_lora_rank,
  n_head]) and `attn_v_b` (ggml [kv_lora_rank, v_head_dim, n_head]); the
  experts merged into `ffn_{gate,up,down}_exps`; the MTP layer not written.
* `convert/convert.go` and `tokenizer.go` at f63eea3d2: byte-level BPE,
  pre-tokenizer `glm4`, scores = token ids, GLM's added tokens (the special
  ones control, the tool and thinking markers user-defined), EOS
  `<|endoftext|>` and the generation config's EOS list (`<|endoftext|>`,
  `<|user|>`, `<|observation|>`), padding `<|endoftext|>`; no BOS key.
* Dtypes as Ollama kept the bf16 checkpoint: matrices BF16, norms F32, and
  F32 what `convert/reader.go` always writes so: the router `ffn_gate_inp`
  and biases (`exp_probs_b.bias`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from .core import Dims, T, embeddings, ffn, linear, llm_kvs, norm, normal, write
from .tokenizers import byte_level_kvs, byte_level_vocab

# qk_nope, v_head_dim and kv_lora_rank all differ, so each length key says
# which it is (the genuine fixture has qk_nope == v_head_dim == kv_lora_rank).
GLM4MOELITE: Dims = dict(
    n_layer=2,
    n_dense=1,
    n_embd=64,
    n_ff=128,
    n_head=4,
    n_head_kv=4,
    context_length=202752,
    rms_eps=1e-5,
    q_lora_rank=48,
    kv_lora_rank=32,
    qk_nope=24,
    qk_rope=16,
    v_head=20,
    rope_freq_base=1_000_000.0,
    n_expert=4,
    n_expert_used=2,
    n_expert_shared=1,
    n_ff_exp=32,
    expert_weights_scale=1.8,
)

ADDED = tuple(
    (t, 3)
    for t in (
        "<|endoftext|>",
        "[MASK]",
        "[gMASK]",
        "[sMASK]",
        "<sop>",
        "<eop>",
        "<|system|>",
        "<|user|>",
        "<|assistant|>",
        "<|observation|>",
        "<|begin_of_image|>",
        "<|end_of_image|>",
        "<|begin_of_video|>",
        "<|end_of_video|>",
        "<|begin_of_audio|>",
        "<|end_of_audio|>",
        "<|begin_of_transcription|>",
        "<|end_of_transcription|>",
        "<|code_prefix|>",
        "<|code_middle|>",
        "<|code_suffix|>",
        "/nothink",
    )
) + tuple(
    (t, 4)
    for t in (
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
    )
)

CHAT_TEMPLATE = (
    "[gMASK]<sop>{%- for m in messages %}{%- if m['role'] == 'system' %}<|system|>\n{{ m['content'] }}"
    "{%- elif m['role'] == 'user' %}<|user|>\n{{ m['content'] }}{%- elif m['role'] == 'assistant' %}"
    "<|assistant|>\n<think></think>{{ m['content'] }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>\n<think>{%- endif %}"
)


@functools.cache
def glm4_tokens() -> tuple[list[str], list[int], list[float], list[str]]:
    """(tokens, types, scores, merges): bytes, merged tokens, GLM's added tokens."""
    return byte_level_vocab(tail=ADDED)


def legacy_glm4moelite(path: Path, seed: int = 0) -> Path:
    """GLM-4.7-Flash (Glm4MoeLiteForCausalLM) as `glm4moelite`: 2 layers (the
    first dense, the second 4 routed experts of 2 and a shared one), n_embd
    64, 4 heads, MLA ranks q 48 / kv 32, head dims nope 24 / rope 16 / v 20;
    ~0.4 MB.  Untranslated llama.cpp refuses the architecture."""
    p = GLM4MOELITE
    rng = np.random.default_rng(seed)
    toks = glm4_tokens()[0]
    endoftext = toks.index("<|endoftext|>")
    E, H, F, X, FX = p["n_embd"], p["n_head"], p["n_ff"], p["n_expert"], p["n_ff_exp"]
    nope, rope, vh, kvr, qr = p["qk_nope"], p["qk_rope"], p["v_head"], p["kv_lora_rank"], p["q_lora_rank"]
    a = "glm4moelite"
    kvs: dict[str, Any] = {
        **llm_kvs(a, p),
        "general.type": "model",
        f"{a}.leading_dense_block_count": p["n_dense"],
        f"{a}.attention.key_length": nope + rope,
        f"{a}.attention.value_length": vh,
        f"{a}.attention.key_length_mla": kvr + rope,
        f"{a}.attention.value_length_mla": kvr,
        f"{a}.attention.q_lora_rank": qr,
        f"{a}.attention.kv_lora_rank": kvr,
        f"{a}.rope.dimension_count": rope,
        f"{a}.expert_count": X,
        f"{a}.expert_used_count": p["n_expert_used"],
        f"{a}.expert_shared_count": p["n_expert_shared"],
        f"{a}.expert_feed_forward_length": FX,
        f"{a}.expert_gating_func": 2,
        f"{a}.expert_weights_norm": True,
        f"{a}.expert_weights_scale": p["expert_weights_scale"],
        **byte_level_kvs(glm4_tokens(), "glm4"),
        "tokenizer.ggml.eos_token_id": endoftext,
        "tokenizer.ggml.eos_token_ids": [endoftext, toks.index("<|user|>"), toks.index("<|observation|>")],
        "tokenizer.ggml.padding_token_id": endoftext,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_padding_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    tensors = embeddings(rng, len(toks), E, tied=False)
    for i in range(p["n_layer"]):
        b = f"blk.{i}."
        tensors[b + "attn_norm.weight"] = (norm(rng, E), T.F32)
        tensors[b + "attn_q_a.weight"] = linear(rng, qr, E)
        tensors[b + "attn_q_a_norm.weight"] = (norm(rng, qr), T.F32)
        tensors[b + "attn_q_b.weight"] = linear(rng, H * (nope + rope), qr)
        tensors[b + "attn_kv_a_mqa.weight"] = linear(rng, kvr + rope, E)
        tensors[b + "attn_kv_a_norm.weight"] = (norm(rng, kvr), T.F32)
        tensors[b + "attn_k_b.weight"] = (normal(rng, (H, kvr, nope), 0.05), T.BF16)
        tensors[b + "attn_v_b.weight"] = (normal(rng, (H, vh, kvr), 0.05), T.BF16)
        tensors[b + "attn_output.weight"] = linear(rng, E, H * vh)
        tensors[b + "ffn_norm.weight"] = (norm(rng, E), T.F32)
        if i < p["n_dense"]:
            tensors.update(ffn(rng, b, E, F))
            continue
        tensors[b + "ffn_gate_inp.weight"] = linear(rng, X, E, T.F32)
        tensors[b + "exp_probs_b.bias"] = (normal(rng, (X,), 0.05), T.F32)
        tensors[b + "ffn_gate_exps.weight"] = (normal(rng, (X, FX, E), 0.05), T.BF16)
        tensors[b + "ffn_up_exps.weight"] = (normal(rng, (X, FX, E), 0.05), T.BF16)
        tensors[b + "ffn_down_exps.weight"] = (normal(rng, (X, E, FX), 0.05), T.BF16)
        tensors.update({n.replace(".weight", "_shexp.weight"): w for n, w in ffn(rng, b, E, FX).items()})
    return write(path, a, kvs, tensors, ollama_order=True)
